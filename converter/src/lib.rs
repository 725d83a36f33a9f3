//! `spark-convert`: Spark (and dense Gemma-2) `.npz` checkpoints and synthetic random models to
//! GGUF, following SPEC.md sections 2, 3, 5 and 6.

pub mod config;
pub mod error;
pub mod layout;
pub mod npy;
pub mod npz;
pub mod prng;
pub mod tokenizer;
