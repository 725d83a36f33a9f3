//! `tokenizer.chat_template` through the `spark-convert` binary: `--chat-template` with the
//! text or `@FILE`, the checkpoint's `chat_template` entry, a template copied by `--vocab-from`,
//! their precedence (flag > checkpoint > --vocab-from), and the errors (a missing, non-UTF-8 or
//! empty template names its source, exits non-zero and leaves no output file).

mod convert_helpers;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use convert_helpers::{checkpoint_members, npy_u8, npy_unicode, write_npz};
use spark_convert::npy;
use spark_gguf::schema::keys;
use spark_gguf::validate::validate;
use spark_gguf::{GgufFile, Value};

/// A Gemma-style template with newlines, quotes, non-ASCII text and trailing whitespace, so
/// that any trimming or re-encoding shows.
const TEMPLATE: &str = "{{ bos_token }}{% for message in messages %}<start_of_turn>{{ 'model' if message['role'] == 'assistant' else message['role'] }}\n{{ message['content'] | trim }}<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}\u{2581}é \n";

fn spark_convert(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_spark-convert"))
        .args(args.iter().map(|a| a.as_ref()))
        .arg("--quiet")
        .output()
        .expect("run spark-convert")
}

struct Dir {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    /// Where outputs go; checked to be empty after a failure.
    out: PathBuf,
}

fn dir() -> Dir {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().to_path_buf();
    let out = root.join("out");
    std::fs::create_dir(&out).unwrap();
    Dir {
        _tmp: tmp,
        root,
        out,
    }
}

/// A valid tiny checkpoint at `dir/name`, with a `chat_template` entry when given.
fn checkpoint(dir: &Path, name: &str, chat_template: Option<Vec<u8>>) -> PathBuf {
    let mut m = checkpoint_members();
    if let Some(t) = chat_template {
        m.push(("chat_template".to_string(), t));
    }
    let path = dir.join(name);
    write_npz(&path, &m);
    path
}

fn ok(o: &Output) {
    assert!(
        o.status.success(),
        "spark-convert failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The file's chat template (None when absent), after checking that it validates.
fn template_of(path: &Path) -> Option<String> {
    let f = GgufFile::open(path).unwrap();
    let problems: Vec<String> = validate(&f).iter().map(|v| v.to_string()).collect();
    assert!(problems.is_empty(), "{}: {problems:?}", path.display());
    match f.get(keys::TOKENIZER_CHAT_TEMPLATE) {
        None => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(v) => panic!("tokenizer.chat_template has type {}", v.type_name()),
    }
}

/// Runs a conversion that must fail: non-zero exit, every needle in stderr, nothing in `out`.
fn fails(d: &Dir, args: &[&dyn AsRef<std::ffi::OsStr>], needles: &[&str]) -> String {
    let o = spark_convert(args);
    let err = stderr(&o);
    assert!(!o.status.success(), "succeeded where it should fail: {err}");
    assert!(!err.contains("panicked"), "{err}");
    for n in needles {
        assert!(err.contains(n), "{n:?} not in {err:?}");
    }
    let left: Vec<_> = std::fs::read_dir(&d.out).unwrap().collect();
    assert!(
        left.is_empty(),
        "after {err:?} the output directory holds {left:?}"
    );
    err
}

#[test]
fn chat_template_flag_with_text_is_written_exactly() {
    let d = dir();
    let ck = checkpoint(&d.root, "c.npz", None);
    let out = d.out.join("m.gguf");
    ok(&spark_convert(&[&ck, &out, &"--chat-template", &TEMPLATE]));
    assert_eq!(template_of(&out).as_deref(), Some(TEMPLATE));
    // `--chat-template=TEXT` also takes text that starts with '-'.
    let out2 = d.out.join("m2.gguf");
    ok(&spark_convert(&[&ck, &out2, &"--chat-template=-{{ x }}"]));
    assert_eq!(template_of(&out2).as_deref(), Some("-{{ x }}"));
}

#[test]
fn chat_template_flag_with_file_is_read() {
    let d = dir();
    let ck = checkpoint(&d.root, "c.npz", None);
    let file = d.root.join("gemma.jinja");
    std::fs::write(&file, TEMPLATE).unwrap();
    let out = d.out.join("m.gguf");
    let arg = format!("@{}", file.display());
    ok(&spark_convert(&[&ck, &out, &"--chat-template", &arg]));
    assert_eq!(template_of(&out).as_deref(), Some(TEMPLATE));
}

#[test]
fn chat_template_absent_without_a_source() {
    let d = dir();
    let ck = checkpoint(&d.root, "c.npz", None);
    let out = d.out.join("m.gguf");
    ok(&spark_convert(&[&ck, &out]));
    assert_eq!(template_of(&out), None);
}

#[test]
fn chat_template_bad_flag_values_fail_naming_the_source() {
    let d = dir();
    let ck = checkpoint(&d.root, "c.npz", None);
    let out = d.out.join("m.gguf");
    let missing = d.root.join("no such dir").join("missing.jinja");
    let err = fails(
        &d,
        &[
            &ck,
            &out,
            &"--chat-template",
            &format!("@{}", missing.display()),
        ],
        &[&missing.display().to_string(), "cannot read"],
    );
    assert!(
        err.starts_with("spark-convert: error: chat template: --chat-template @"),
        "{err}"
    );
    let latin1 = d.root.join("latin1.jinja");
    std::fs::write(&latin1, b"{{ 'caf\xe9' }}").unwrap();
    fails(
        &d,
        &[
            &ck,
            &out,
            &"--chat-template",
            &format!("@{}", latin1.display()),
        ],
        &[&latin1.display().to_string(), "not valid UTF-8", "offset 7"],
    );
    let empty = d.root.join("empty.jinja");
    std::fs::write(&empty, "\n").unwrap();
    fails(
        &d,
        &[
            &ck,
            &out,
            &"--chat-template",
            &format!("@{}", empty.display()),
        ],
        &[&empty.display().to_string(), "empty"],
    );
    fails(
        &d,
        &[&ck, &out, &"--chat-template", &""],
        &["--chat-template is empty"],
    );
    fails(
        &d,
        &[&ck, &out, &"--chat-template", &"@"],
        &["no file name"],
    );
    // The same errors with --synthetic.
    fails(
        &d,
        &[
            &"--synthetic",
            &"tiny",
            &out,
            &"--chat-template",
            &format!("@{}", missing.display()),
        ],
        &[&missing.display().to_string()],
    );
    fails(
        &d,
        &[&"--synthetic", &"tiny", &out, &"--chat-template", &""],
        &["empty"],
    );
}

#[test]
fn chat_template_from_the_checkpoint_entry() {
    let d = dir();
    for (name, entry) in [
        ("u8.npz", npy_u8(TEMPLATE.as_bytes())),
        ("unicode.npz", npy_unicode(TEMPLATE)),
    ] {
        let ck = checkpoint(&d.root, name, Some(entry));
        let out = d.out.join(format!("{name}.gguf"));
        ok(&spark_convert(&[&ck, &out]));
        assert_eq!(template_of(&out).as_deref(), Some(TEMPLATE), "{name}");
    }
}

#[test]
fn chat_template_bad_checkpoint_entries_fail_naming_the_entry() {
    let d = dir();
    let out = d.out.join("m.gguf");
    let mut f32_entry = npy::header("<f4", &[2]);
    f32_entry.extend_from_slice(&[0; 8]);
    for (name, entry, needle) in [
        ("empty-u8.npz", npy_u8(b""), "is empty"),
        ("empty-unicode.npz", npy_unicode(""), "is empty"),
        ("blank.npz", npy_u8(b" \n "), "is empty"),
        ("latin1.npz", npy_u8(b"caf\xe9"), "not valid UTF-8"),
        (
            "f32.npz",
            f32_entry,
            "must be a 0-d unicode or 1-d uint8 array",
        ),
    ] {
        let ck = checkpoint(&d.root, name, Some(entry));
        fails(
            &d,
            &[&ck, &out],
            &["checkpoint entry 'chat_template'", needle],
        );
    }
    // The flag wins, so the entry is not read at all (like --tokenizer and 'tokenizer').
    let ck = checkpoint(&d.root, "empty-u8.npz", Some(npy_u8(b"")));
    let o = spark_convert(&[&ck, &out, &"--chat-template", &"{{ x }}"]);
    ok(&o);
    assert_eq!(template_of(&out).as_deref(), Some("{{ x }}"));
}

#[test]
fn chat_template_precedence_flag_then_checkpoint_then_vocab_from() {
    let d = dir();
    let plain = checkpoint(&d.root, "plain.npz", None);
    let with_entry = checkpoint(&d.root, "entry.npz", Some(npy_u8(b"from the checkpoint")));
    let file = d.root.join("flag.jinja");
    std::fs::write(&file, "from the flag").unwrap();
    let flag = format!("@{}", file.display());

    // A GGUF carrying a template, for --vocab-from.
    let vocab = d.root.join("vocab.gguf");
    ok(&spark_convert(&[
        &plain,
        &vocab,
        &"--chat-template",
        &"from vocab-from",
    ]));
    // A GGUF without one.
    let bare = d.root.join("bare.gguf");
    ok(&spark_convert(&[&plain, &bare]));

    let run = |out: &str, args: &[&dyn AsRef<std::ffi::OsStr>]| -> (Option<String>, String) {
        let out = d.out.join(out);
        let mut all: Vec<&dyn AsRef<std::ffi::OsStr>> = args.to_vec();
        all.insert(1, &out);
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_spark-convert"));
        cmd.args(all.iter().map(|a| a.as_ref()));
        let o = cmd.output().unwrap();
        ok(&o);
        (template_of(&out), stderr(&o))
    };

    // --vocab-from alone: its template is copied with the other tokenizer.* keys.
    let (t, _) = run("a.gguf", &[&plain, &"--vocab-from", &vocab]);
    assert_eq!(t.as_deref(), Some("from vocab-from"));
    // The checkpoint's entry wins over --vocab-from, and says so.
    let (t, err) = run("b.gguf", &[&with_entry, &"--vocab-from", &vocab]);
    assert_eq!(t.as_deref(), Some("from the checkpoint"));
    assert!(
        err.contains("tokenizer.chat_template of --vocab-from is replaced by the checkpoint's 'chat_template' entry"),
        "{err}"
    );
    // The checkpoint's entry is used with a --vocab-from GGUF that has no template.
    let (t, err) = run("c.gguf", &[&with_entry, &"--vocab-from", &bare]);
    assert_eq!(t.as_deref(), Some("from the checkpoint"));
    assert!(!err.contains("replaced"), "{err}");
    // The flag wins over both.
    let (t, err) = run(
        "d.gguf",
        &[
            &with_entry,
            &"--vocab-from",
            &vocab,
            &"--chat-template",
            &flag,
        ],
    );
    assert_eq!(t.as_deref(), Some("from the flag"));
    assert!(
        err.contains("the checkpoint's 'chat_template' entry is ignored; the chat template comes from --chat-template")
            && err.contains("tokenizer.chat_template of --vocab-from is replaced by --chat-template"),
        "{err}"
    );
    // The flag wins over the checkpoint (with the checkpoint's own tokenizer).
    let (t, _) = run("e.gguf", &[&with_entry, &"--chat-template", &flag]);
    assert_eq!(t.as_deref(), Some("from the flag"));
    // And over --vocab-from alone.
    let (t, _) = run(
        "f.gguf",
        &[&plain, &"--vocab-from", &vocab, &"--chat-template", &"x"],
    );
    assert_eq!(t.as_deref(), Some("x"));
    // The other tokenizer.* keys are the same whichever template wins.
    let tok_keys = |p: &Path| -> Vec<(String, Value)> {
        GgufFile::open(p)
            .unwrap()
            .metadata()
            .iter()
            .filter(|(k, _)| k.starts_with("tokenizer.") && k != keys::TOKENIZER_CHAT_TEMPLATE)
            .cloned()
            .collect()
    };
    let a = tok_keys(&d.out.join("a.gguf"));
    for n in ["b.gguf", "c.gguf", "d.gguf", "e.gguf", "f.gguf"] {
        assert_eq!(tok_keys(&d.out.join(n)), a, "{n}");
    }
}

#[test]
fn chat_template_with_synthetic_models() {
    let d = dir();
    let out = d.out.join("s.gguf");
    ok(&spark_convert(&[
        &"--synthetic",
        &"tiny",
        &out,
        &"--chat-template",
        &TEMPLATE,
    ]));
    assert_eq!(template_of(&out).as_deref(), Some(TEMPLATE));
    let plain = d.out.join("p.gguf");
    ok(&spark_convert(&[&"--synthetic", &"tiny", &plain]));
    assert_eq!(template_of(&plain), None);
}
