//! The one error type of the crate.

use std::path::PathBuf;

/// Everything that can go wrong reading, writing, encoding or checking a GGUF file.
///
/// Messages name the offending key, tensor or byte offset so that a user can find the problem.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// An operating-system error on a named file.
    #[error("{path}: cannot {op}: {source}")]
    Io {
        /// The file concerned.
        path: PathBuf,
        /// What was being done ("open", "map", "write", ...).
        op: &'static str,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The bytes of a file do not form a valid GGUF structure.
    #[error("malformed GGUF at byte offset {offset}: {message}")]
    Format {
        /// Absolute byte offset in the file where the problem was found.
        offset: u64,
        /// What is wrong, naming the key or tensor where one is concerned.
        message: String,
    },
    /// A GGUF version this crate does not read.
    #[error("unsupported GGUF version {version}: {reason}")]
    Version {
        /// The version number found in the header.
        version: u32,
        /// Why it is refused.
        reason: &'static str,
    },
    /// A metadata key is missing, has the wrong type or an invalid value.
    #[error("metadata key '{key}': {message}")]
    Metadata {
        /// The full key name.
        key: String,
        /// What is wrong with it.
        message: String,
    },
    /// A tensor shape or type does not work (block size, overflow, unsupported encoding, ...).
    #[error("tensor '{tensor}': {message}")]
    Tensor {
        /// The tensor name (empty when no tensor is concerned, e.g. a bare size computation).
        tensor: String,
        /// What is wrong with it.
        message: String,
    },
    /// A shape or size computation failed outside of any named tensor.
    #[error("{0}")]
    Shape(String),
    /// Encoding or decoding tensor data failed.
    #[error("{0}")]
    Quant(String),
    /// The writer was used out of order or with a bad plan.
    #[error("GGUF writer: {0}")]
    Writer(String),
    /// A checksum manifest is malformed, or a file does not match it (the message names the
    /// manifest, its line, the file and the tensor concerned).
    #[error("{0}")]
    Manifest(String),
    /// The output file exists and overwriting was not allowed.
    #[error("{0}: output file exists (pass overwrite to replace it)")]
    Exists(PathBuf),
}

impl GgufError {
    /// Shorthand for a [`GgufError::Format`] error.
    pub fn format(offset: u64, message: impl Into<String>) -> Self {
        GgufError::Format {
            offset,
            message: message.into(),
        }
    }

    /// Shorthand for a [`GgufError::Metadata`] error.
    pub fn metadata(key: impl Into<String>, message: impl Into<String>) -> Self {
        GgufError::Metadata {
            key: key.into(),
            message: message.into(),
        }
    }

    /// Shorthand for a [`GgufError::Tensor`] error.
    pub fn tensor(tensor: impl Into<String>, message: impl Into<String>) -> Self {
        GgufError::Tensor {
            tensor: tensor.into(),
            message: message.into(),
        }
    }
}
