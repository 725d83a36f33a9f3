//! `spark-convert`: Spark (and dense Gemma-2) `.npz` checkpoints and synthetic random models to
//! GGUF, following SPEC.md sections 2, 3, 5 and 6.

pub mod chat_template;
pub mod checkpoint;
pub mod config;
pub mod convert;
pub mod emit;
pub mod error;
pub mod layout;
pub mod model;
pub mod npy;
pub mod npz;
pub mod prng;
pub mod progress;
pub mod synthetic;
pub mod tokenizer;
