//! Model facts and names as llama-bench writes them in text: the size and params columns, and a
//! model's file name in messages.

use std::path::Path;

/// llama-bench's size column: MiB below 1 GiB.
pub fn size_text(bytes: u64) -> String {
    if bytes < 1 << 30 {
        format!("{:.2} MiB", bytes as f64 / (1u64 << 20) as f64)
    } else {
        format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
    }
}

/// llama-bench's params column: M below 1e9.
pub fn params_text(n: u64) -> String {
    if n < 1_000_000_000 {
        format!("{:.2} M", n as f64 / 1e6)
    } else {
        format!("{:.2} B", n as f64 / 1e9)
    }
}

/// `p`'s file name, for messages.
pub fn file_name(p: &Path) -> String {
    p.file_name()
        .map_or_else(|| p.display().to_string(), |n| n.to_string_lossy().into())
}
