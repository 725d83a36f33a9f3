//! The sparse Spark FFN (SPEC.md section 4): everything about it lives in this folder.
//!
//! For each token, with h its `ffn_norm` output (D values), F neurons and a threshold cutoff
//! ([`crate::topk::Cutoff`]: k_f kept per token, or Gemma 3n's std multiplier):
//! 1. predictor: `s = K1 h[:r_f]` over all F neurons ([`predictor_scores`]; in the ggml graph
//!    this is a stock `ggml_mul_mat`, or for Gemma 3n the dense gate product over all of h);
//! 2. per token the threshold `theta = mean(s) + std(s) * z` of its scores, then for each
//!    active neuron `u_j = gelu_tanh(s_j - theta) * (K2_j . h[r_f:])` (exactly 0 for the
//!    others); `0 <= r_f < D` (r_f = 0: K2 spans all of h, Gemma 3n's `ffn_up`);
//! 3. `out = sum_j u_j V_j` over the active neurons (V neuron-major).
//!
//! The graph runs stages 2 and 3 on one of two paths per ubatch, the one [`tiling`] answers:
//! - [`fused`]: both stages in one pass over P fixed neuron chunks, then the chunks' partial
//!   outputs summed in chunk order (`spark_ffn_fused` + `spark_ffn_sum`);
//! - [`two_stage`]: stage 2 for every neuron, then stage 3 (`spark_ffn_up` + `spark_ffn_down`).
//!
//! The files: `shared.rs` holds what both paths share (inputs, activation, thresholds,
//! per-thread buffers, prefetching); `fused.rs` and `two_stage.rs` the CPU kernels of each path;
//! `shapes.rs` the shape rules of the four ops' tensors (one set for the CPU ops and the CUDA
//! launchers); `cpu_ops.rs` the ggml custom ops (the C entry points); `tiling.rs` the path and chunk
//! count of a ubatch (what the graph asks, `spark_ffn_tiling`); `cuda_plan.rs` the CUDA plans
//! (checks and launch sequences, pure functions, built without CUDA) and `ffn.cu` their
//! kernels; `cuda_launch.rs` the launchers ggml-cuda calls (feature `cuda`).

pub mod cpu_ops;
#[cfg(feature = "cuda")]
pub(crate) mod cuda_launch;
pub mod cuda_plan;
pub mod fused;
pub(crate) mod shapes;
mod shared;
pub mod tiling;
pub mod two_stage;

pub use shared::{
    activation, gelu_tanh, predictor_scores, token_thresholds, Batch, FfnWeights, Scratch, UpInputs,
};
