//! The chat template (`tokenizer.chat_template`, a GGUF string): from `--chat-template`, from the
//! checkpoint's optional `chat_template` entry, or as copied by `--vocab-from`, in that order of
//! precedence.
//!
//! `--chat-template TEMPLATE` takes the Jinja text itself, or `@FILE` to read the text from a
//! file. The text is stored exactly as given (no trimming, no newline added). A template that is
//! empty or only whitespace is an error wherever it comes from (except `--vocab-from`, whose
//! `tokenizer.*` keys are copied as they are).

use std::path::Path;

use spark_gguf::schema::keys;
use spark_gguf::Value;

use crate::error::{Error, Result};

/// Checks that a template has some text; `what` says where it came from.
fn non_empty(text: String, what: &str) -> Result<String> {
    if text.trim().is_empty() {
        return Err(Error::ChatTemplate(format!(
            "{what} is empty{}; give the Jinja text of the template",
            if text.is_empty() {
                ""
            } else {
                " (only whitespace)"
            }
        )));
    }
    Ok(text)
}

/// Resolves the value of `--chat-template`: `@FILE` reads FILE (which must be UTF-8), anything
/// else is the template text itself. Errors name the file, and an empty template is an error.
pub fn from_arg(arg: &str) -> Result<String> {
    let Some(file) = arg.strip_prefix('@') else {
        return non_empty(arg.to_string(), "--chat-template");
    };
    if file.is_empty() {
        return Err(Error::ChatTemplate(
            "--chat-template @FILE: no file name after '@'".into(),
        ));
    }
    let path = Path::new(file);
    let what = format!("--chat-template @{}", path.display());
    let bytes = std::fs::read(path)
        .map_err(|e| Error::ChatTemplate(format!("{what}: cannot read the file: {e}")))?;
    let text = String::from_utf8(bytes).map_err(|e| {
        Error::ChatTemplate(format!(
            "{what}: the file is not valid UTF-8 (bad byte at offset {})",
            e.utf8_error().valid_up_to()
        ))
    })?;
    non_empty(text, &format!("{what}: the file"))
}

/// Checks a template's text from another source (the checkpoint entry, a library caller).
pub fn check(text: String, what: &str) -> Result<String> {
    non_empty(text, what)
}

/// Puts `template` into the `tokenizer.*` metadata `md` as `tokenizer.chat_template`, replacing
/// one already there (copied by `--vocab-from`). Returns whether one was replaced.
pub fn set(md: &mut Vec<(String, Value)>, template: String) -> bool {
    let value = Value::String(template);
    match md
        .iter_mut()
        .find(|(k, _)| k == keys::TOKENIZER_CHAT_TEMPLATE)
    {
        Some((_, v)) => {
            *v = value;
            true
        }
        None => {
            md.push((keys::TOKENIZER_CHAT_TEMPLATE.to_string(), value));
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_kept_exactly() {
        let t = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}  ";
        assert_eq!(from_arg(t).unwrap(), t);
    }

    #[test]
    fn empty_templates_are_errors() {
        for t in ["", " \n\t"] {
            let e = from_arg(t).unwrap_err().to_string();
            assert!(
                e.starts_with("chat template: --chat-template is empty"),
                "{e}"
            );
        }
        let e = from_arg("@").unwrap_err().to_string();
        assert!(e.contains("no file name"), "{e}");
        assert!(check(String::new(), "x").is_err());
    }

    #[test]
    fn files_are_read_and_errors_name_them() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("t.jinja");
        std::fs::write(&good, "{{ bos_token }}é\n").unwrap();
        assert_eq!(
            from_arg(&format!("@{}", good.display())).unwrap(),
            "{{ bos_token }}é\n"
        );
        let missing = dir.path().join("missing.jinja");
        let e = from_arg(&format!("@{}", missing.display()))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&missing.display().to_string()) && e.contains("cannot read"),
            "{e}"
        );
        let bad = dir.path().join("bad.jinja");
        std::fs::write(&bad, b"ab\xffcd").unwrap();
        let e = from_arg(&format!("@{}", bad.display()))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&bad.display().to_string()) && e.contains("UTF-8") && e.contains("offset 2"),
            "{e}"
        );
        let empty = dir.path().join("empty.jinja");
        std::fs::write(&empty, "").unwrap();
        let e = from_arg(&format!("@{}", empty.display()))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&empty.display().to_string()) && e.contains("empty"),
            "{e}"
        );
    }

    #[test]
    fn set_replaces_or_appends() {
        let mut md = vec![(
            keys::TOKENIZER_CHAT_TEMPLATE.to_string(),
            Value::String("old".into()),
        )];
        assert!(set(&mut md, "new".into()));
        assert_eq!(
            md,
            vec![(
                keys::TOKENIZER_CHAT_TEMPLATE.to_string(),
                Value::String("new".into())
            )]
        );
        let mut md = Vec::new();
        assert!(!set(&mut md, "t".into()));
        assert_eq!(md.len(), 1);
    }
}
