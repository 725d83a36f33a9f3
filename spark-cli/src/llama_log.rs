//! Captures llama.cpp / ggml log output: keeps the last error lines so a failure can be reported
//! as one clear line, and forwards everything to stderr only when asked (`--verbose`).

use llama_cpp_sys_2 as sys;
use std::collections::VecDeque;
use std::ffi::{c_char, c_void, CStr};
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// Most error lines remembered.
const KEEP_LINES: usize = 16;

struct LogState {
    /// The line being assembled (llama.cpp logs in pieces).
    partial: String,
    /// Level of the line being assembled.
    partial_level: sys::ggml_log_level,
    /// The last complete error lines, oldest first.
    errors: VecDeque<String>,
}

static STATE: Mutex<LogState> = Mutex::new(LogState {
    partial: String::new(),
    partial_level: sys::GGML_LOG_LEVEL_NONE,
    errors: VecDeque::new(),
});
static ECHO: AtomicBool = AtomicBool::new(false);

/// Installs the log callback for llama.cpp and ggml. With `echo`, log text also goes to stderr.
pub fn install(echo: bool) {
    ECHO.store(echo, Ordering::Relaxed);
    // SAFETY: `log_callback` is a plain `extern "C"` function that lives for the whole program and
    // ignores its user data pointer, so passing null is fine.
    unsafe {
        sys::llama_log_set(Some(log_callback), std::ptr::null_mut());
    }
}

extern "C" fn log_callback(level: sys::ggml_log_level, text: *const c_char, _user: *mut c_void) {
    if text.is_null() {
        return;
    }
    // SAFETY: llama.cpp passes a NUL-terminated string valid for the duration of the call.
    let text = unsafe { CStr::from_ptr(text) }.to_string_lossy();
    if ECHO.load(Ordering::Relaxed) {
        let _ = std::io::stderr().write_all(text.as_bytes());
    }
    let Ok(mut state) = STATE.lock() else {
        return;
    };
    if level != sys::GGML_LOG_LEVEL_CONT {
        state.partial_level = level;
    }
    for ch in text.chars() {
        if ch == '\n' {
            let line = std::mem::take(&mut state.partial);
            if state.partial_level == sys::GGML_LOG_LEVEL_ERROR && !line.trim().is_empty() {
                if state.errors.len() == KEEP_LINES {
                    state.errors.pop_front();
                }
                state.errors.push_back(line);
            }
        } else {
            state.partial.push(ch);
        }
    }
}

/// Forgets the error lines seen so far.
pub fn clear_errors() {
    if let Ok(mut state) = STATE.lock() {
        state.errors.clear();
    }
}

/// The most informative error line logged since the last [`clear_errors`], stripped of
/// llama.cpp's function-name prefixes, if any.
pub fn last_error() -> Option<String> {
    let state = STATE.lock().ok()?;
    // llama.cpp reports a failed load as "llama_model_load: error loading model: <cause>" followed
    // by a generic "failed to load model" line: prefer the line that carries the cause.
    let pick = state
        .errors
        .iter()
        .rev()
        .find(|l| l.contains("error loading model:") || l.contains("failed to quantize:"))
        .or_else(|| state.errors.back())?;
    Some(strip_prefixes(pick))
}

/// Removes the leading `function_name: ` parts and the generic "error loading model" phrases.
fn strip_prefixes(line: &str) -> String {
    let mut rest = line.trim();
    for marker in [
        "error loading model: ",
        "error loading model hyperparameters: ",
        "error loading model architecture: ",
        "failed to quantize: ",
    ] {
        if let Some(pos) = rest.find(marker) {
            rest = &rest[pos + marker.len()..];
        }
    }
    // "func_name: message": drop a leading identifier followed by ": "
    if let Some((head, tail)) = rest.split_once(": ") {
        if !head.is_empty() && head.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            rest = tail;
        }
    }
    rest.trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::strip_prefixes;

    #[test]
    fn strips_load_prefixes() {
        assert_eq!(
            strip_prefixes("llama_model_load: error loading model: error loading model architecture: unknown model architecture: 'foo'"),
            "unknown model architecture: 'foo'"
        );
        assert_eq!(
            strip_prefixes("llama_init: something broke"),
            "something broke"
        );
        assert_eq!(
            strip_prefixes("plain message: detail"),
            "plain message: detail"
        );
    }
}
