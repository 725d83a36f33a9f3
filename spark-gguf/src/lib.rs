//! GGUF v3 for Spark: a validating memory-mapped reader, a streaming writer, tensor encodings
//! bit-identical to gguf-py, the Spark schema table (SPEC sections 2 and 3), a validator that
//! applies llama.cpp's rules plus the schema, per-tensor checksums in `llama-gguf-hash`'s
//! manifest format, and the workspace's NPY writer.
//!
//! ```no_run
//! use spark_gguf::{reader::GgufFile, validate::validate};
//! let f = GgufFile::open(std::path::Path::new("model.gguf"))?;
//! for v in validate(&f) {
//!     eprintln!("{v}");
//! }
//! # Ok::<(), spark_gguf::GgufError>(())
//! ```

#![warn(missing_docs)]

pub mod atomic;
mod error;
mod ggml_type;
pub mod keys;
pub mod manifest;
pub mod npy;
pub mod quant;
pub mod reader;
pub mod schema;
pub mod validate;
mod value;
pub mod writer;

pub use error::GgufError;
pub use ggml_type::GgmlType;
pub use reader::{GgufFile, TensorInfo};
pub use value::{Array, Value, ValueType};
pub use writer::{GgufWriter, TensorPlan};
