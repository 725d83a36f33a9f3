//! The plugin's lines on stderr.
//!
//! Each line goes out in one `write` call. Rust's stderr is unbuffered, so `eprintln!` writes
//! every piece of its format separately, and a host that logs from another thread (llama.cpp's
//! `common_log` writes a timestamp, then the level and the text) can land between the pieces:
//! a reader, or a test, then finds neither line whole. One write of at most `PIPE_BUF` bytes is
//! also atomic on a pipe.

use std::io::Write;

/// Writes `text` and a newline to stderr in one call; a failed write is ignored (printing must
/// not fail the op or the host that asked).
pub(crate) fn stderr_text(text: &str) {
    let mut buf = String::with_capacity(text.len() + 1);
    buf.push_str(text);
    if !buf.ends_with('\n') {
        buf.push('\n');
    }
    let _ = std::io::stderr().lock().write_all(buf.as_bytes());
}

/// `eprintln!`, with the line written in one call ([`stderr_text`]).
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::log::stderr_text(&format!($($arg)*))
    };
}
pub(crate) use say;
