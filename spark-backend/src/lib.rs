//! Sparse CPU kernels for the Spark Transformer's FFN and attention (SPEC.md section 4),
//! presented to llama.cpp as a ggml backend registry entry named "Spark".
//!
//! Data flow: the patched llama.cpp graph (`src/models/spark-gemma2.cpp`) finds the "Spark"
//! registry entry, resolves the FFN ops (`spark_ffn_fused` + `spark_ffn_sum` for ubatches of up
//! to 512 tokens, `spark_ffn_up` + `spark_ffn_down` above) and `spark_attn` by name and runs them
//! as ggml custom ops (`ggml_custom_4d`) from ggml's own worker threads. See
//! `docs/INTERFACES.md`.
//!
//! With the `cuda` feature and a ggml-cuda carrying the custom-op hook (patch 0008), the same
//! ops also run on the GPU through CUDA launchers ([`cuda`]).

pub mod attention;
pub mod cuda;
pub mod error;
pub mod ffi;
pub mod ffn;
pub mod isa;
pub mod op;
pub mod params;
pub mod plugin;
pub mod registry;
pub mod rows;
pub mod stats;
pub mod tensor;
pub mod topk;

pub use error::KernelError;
pub use registry::{is_registered, register};
