//! Sparse CPU kernels for the Spark Transformer's FFN and attention (SPEC.md section 4),
//! presented to llama.cpp as a ggml backend registry entry named "Spark".
//!
//! Data flow: the llama.cpp graph (`patches/llama.cpp/files/src/models/spark-gemma2.cpp`) finds
//! the "Spark" registry entry, asks it how the FFN of each ubatch runs (`spark_ffn_tiling`: today
//! `spark_ffn_fused` + `spark_ffn_sum` for ubatches of up to 512 tokens, `spark_ffn_up` +
//! `spark_ffn_down` above, the graph's dense FFN on CUDA from 32 tokens) and whether its
//! attention runs `spark_attn` (`spark_attn_path`), resolves those ops and `spark_attn` by name and runs them as ggml
//! custom ops (`ggml_custom_4d`) from ggml's own worker threads. See `docs/INTERFACES.md`.
//!
//! With the `cuda` feature and a ggml-cuda carrying the custom-op hook (patch 0008), the same
//! ops also run on the GPU through CUDA launchers ([`cuda`]).
//!
//! # Modules, by feature
//! Imports go one way: `kernel_types` <- `arch` <- the features (`rows`, `topk`, `attention`,
//! `ffn`) <- the ops and the registry (`tools/module-graph.py` prints the file-level graph and
//! fails on a cycle).
//! - [`kernel_types`]: the types every CPU kernel takes (row types, KV-cache rows, query and
//!   score blocks), below everything else.
//! - [`arch`]: every SIMD kernel, one table per instruction set (`arch/table.rs`: the `Kernels`
//!   table, exhaustive per-type lookups and the one choice of table per process;
//!   `arch/generic`, `arch/x86`, `arch/arm`, one file per kernel family in each).
//! - [`ffn`]: the sparse FFN, all of it: what both paths share (`shared.rs`), the CPU kernels
//!   of its two paths (`fused.rs`, `two_stage.rs`), which path and how many chunks a ubatch
//!   gets (`tiling.rs`), the shape rules of its ops (`shapes.rs`), the ggml custom ops
//!   (`cpu_ops.rs`), the CUDA plans (`cuda_plan.rs`), kernels (`ffn.cu`) and launchers
//!   (`cuda_launch.rs`).
//! - [`attention`]: the sparse attention, all of it: the call and its checks (`layout.rs`), the
//!   CPU kernel (`kernel.rs`, inner loops in `dot.rs` and `math.rs`), the ggml custom op
//!   (`cpu_op.rs`), the CUDA plan (`cuda_plan.rs`), kernels (`attn.cu`) and launcher
//!   (`cuda_launch.rs`).
//! - [`rope`]: `spark_rope`, a head's two rotary embeddings (the predictor's r channels and the
//!   rest) and the attention scale in one op: the math and checks (`mod.rs`), the ggml custom
//!   op (`cpu_op.rs`), the CUDA plan (`cuda_plan.rs`), kernel (`rope.cu`) and launcher
//!   (`cuda_launch.rs`).
//! - [`dense_switch`]: from which ubatch size a layer leaves the Spark ops for the graph's dense
//!   path (on CUDA, where tensor cores win at big ubatches), what the FFN tiling and the
//!   attention's path (`attention/path.rs`) both ask.
//! - [`rows`]: weight rows in ggml's storage types and their dot/axpy (quantized rows through
//!   ggml's type traits in `quant.rs`); [`topk`]: the statistical top-k both ops use.
//! - [`cpu_op`]: the entry protocol of every CPU op (checks, shared chunk counter, NaN on
//!   failure); [`tensor`]: views of ggml tensors; [`params`]: the graph's parameter structs;
//!   `error`: [`KernelError`]; `ffi`: no unwinding across the C boundary; `log`: the plugin's
//!   stderr lines, each in one write.
//! - [`cuda`]: what the CUDA launchers share (the hook, NVRTC and its options, the driver, the
//!   launch protocol, metadata checks).
//! - [`registry`]: what the backend exports: one table of ops (`registry::OPS`: name, CPU
//!   function, CUDA launcher) from which the procs the graph resolves, the RPC registration and
//!   the launcher table derive; `plugin`: the cdylib's `ggml_backend_init` and its version
//!   check; [`stats`]: per-layer statistics.
//!
//! # Public surface
//! Everything else is crate-private. For the `spark` CLI: [`registry::register`] and
//! [`stats`]'s `LayerStats`, `reset`, `snapshot`, `TABLE_HEADER`, `table_row`. For llama.cpp and
//! the plugin loader: the exported C symbols (`ggml_backend_init`, the `spark_*` ops) and the
//! procs of [`registry::proc_address`] (with `ffn::tiling`'s `FfnTiling` mirror). For the tests
//! and benches: the kernels and references they check ([`ffn`], [`attention`], [`rows`],
//! [`topk`]), the ops' C entry points (`ffn::cpu_ops`, `attention::cpu_op`), the CUDA plans
//! (`ffn::cuda_plan`, `attention::cuda_plan`), the registration and NVRTC seams of [`cuda`],
//! `cpu_op::fault` (feature `fault-injection`), [`tensor::TensorView`] and [`params`].

// The docs are written for the crate's maintainers and link the crate-private items they
// describe: read them with `cargo doc --document-private-items`.
#![allow(rustdoc::private_intra_doc_links)]

pub mod arch;
pub mod attention;
pub mod cpu_op;
pub mod cuda;
pub mod dense_switch;
mod error;
mod ffi;
pub mod ffn;
pub mod kernel_types;
mod log;
pub mod params;
mod plugin;
pub mod registry;
pub mod rope;
pub mod rows;
pub mod stats;
pub mod tensor;
pub mod topk;

pub use error::KernelError;
