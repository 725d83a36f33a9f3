//! The AArch64 kernels: NEON (Advanced SIMD), a version of every family.
//!
//! Spark's own kernels are f32 and f64 arithmetic (fused multiply-adds, conversions), which the
//! dot-product (`dotprod`) and matrix (`i8mm`) extensions do not speed up: those serve integer
//! dot products, which Spark leaves to ggml's `vec_dot` (quantized rows against a quantized
//! activation: ggml's own NEON, dotprod and i8mm code, as the ggml build enables them). So
//! there is one AArch64 table.

mod attention;
mod quant;
mod rows;
mod topk;

use super::table::{Isa, Kernels};

/// The NEON table. Handed out by `arch::table` only where the CPU has NEON.
pub(super) const NEON: Kernels = Kernels {
    isa: Isa::Neon,
    dot_f32: rows::dot_f32,
    dot_f16: rows::dot_f16,
    dot_bf16: rows::dot_bf16,
    axpy_f32: rows::axpy_f32,
    axpy_f16: rows::axpy_f16,
    axpy_bf16: rows::axpy_bf16,
    f16_to_f32: rows::f16_to_f32,
    bf16_to_f32: rows::bf16_to_f32,
    axpy_q8_0: quant::axpy_q8_0,
    axpy_q4_0: quant::axpy_q4_0,
    axpy_q6_k: quant::axpy_q6_k,
    to_f32_q8_0: quant::to_f32_q8_0,
    to_f32_q4_0: quant::to_f32_q4_0,
    to_f32_q6_k: quant::to_f32_q6_k,
    axpy4_q8_0: quant::axpy4_q8_0,
    axpy_q8_0_folded: quant::axpy_q8_0_folded,
    shifted_sums: topk::shifted_sums,
    attn_dots: attention::dots,
    attn_accumulate: attention::accumulate,
    // (rows whose elements are not adjacent: the generic loops)
    attn_dots_strided: super::generic::attention::dots,
    attn_accumulate_strided: super::generic::attention::accumulate,
    // (rows of blocks are converted to f32 and take the f32 kernels)
    attn_block_dots_q8_0: None,
    attn_block_dots_q4_0: None,
    attn_block_accumulate_q8_0: None,
    attn_block_accumulate_q4_0: None,
};
