//! The CLI's error type: one human-readable line, printed by `main` before a non-zero exit.

use std::fmt;

/// A failure of a `spark` command, already phrased for the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CliError(pub String);

impl CliError {
    /// An error with the given message.
    pub fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CliError {}

impl From<spark_gguf::GgufError> for CliError {
    /// spark-gguf's errors already name the file, key or tensor concerned.
    fn from(e: spark_gguf::GgufError) -> Self {
        Self(e.to_string())
    }
}

/// Result alias for the CLI.
pub type Result<T> = std::result::Result<T, CliError>;
