//! The converter's error type: every message names the file, entry or key at fault.

use std::path::Path;

/// Why a conversion failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file involved.
        path: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A checkpoint entry is missing, extra, malformed or inconsistent.
    #[error("checkpoint entry '{entry}': {message}")]
    Entry {
        /// The entry's name inside the `.npz` (without `.npy`).
        entry: String,
        /// What is wrong with it.
        message: String,
    },
    /// The checkpoint file itself is unreadable (not a zip, truncated).
    #[error("{path}: {message}")]
    Archive {
        /// The `.npz` path.
        path: String,
        /// What is wrong with it.
        message: String,
    },
    /// The config JSON is malformed, lacks a key, or holds an invalid value.
    #[error("config: {0}")]
    Config(String),
    /// The tokenizer is missing or malformed.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The chat template is empty or unreadable (`--chat-template`).
    #[error("chat template: {0}")]
    ChatTemplate(String),
    /// The command line is inconsistent.
    #[error("{0}")]
    Usage(String),
    /// Writing or reading GGUF failed (the GGUF crate's error, kept as the source).
    #[error("{0}")]
    Gguf(#[from] spark_gguf::GgufError),
    /// The converter disagrees with the schema, or its writer thread stopped: a bug, or the
    /// consequence of an error reported elsewhere.
    #[error("{0}")]
    Internal(String),
}

/// Result with the converter's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// An error about checkpoint entry `entry`.
    pub fn entry(entry: &str, message: impl Into<String>) -> Error {
        Error::Entry {
            entry: entry.to_string(),
            message: message.into(),
        }
    }

    /// An I/O error on `path`.
    pub fn io(path: &Path, source: std::io::Error) -> Error {
        Error::Io {
            path: path.display().to_string(),
            source,
        }
    }

    /// An error about the archive at `path`.
    pub fn archive(path: &Path, message: impl Into<String>) -> Error {
        Error::Archive {
            path: path.display().to_string(),
            message: message.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn gguf_errors_keep_their_source_and_message() {
        let g =
            spark_gguf::GgufError::metadata("spark-gemma2.spark.ffn_k", "must be at least 1, is 0");
        let text = g.to_string();
        let e = Error::from(g);
        assert_eq!(e.to_string(), text);
        let source = e.source().expect("a GGUF error has a source");
        assert!(matches!(
            source.downcast_ref::<spark_gguf::GgufError>(),
            Some(spark_gguf::GgufError::Metadata { key, .. }) if key == "spark-gemma2.spark.ffn_k"
        ));
        assert!(Error::Internal("x".into()).source().is_none());
    }
}
