//! The portable versions of every kernel family: the references the SIMD tables are tested
//! against, and the table of CPUs without a SIMD set the crate has kernels for.

pub(crate) mod attention;
pub(crate) mod ggml;
pub(crate) mod quant;
pub(crate) mod rows;
pub(crate) mod topk;

use super::table::{Isa, Kernels};

/// Every kernel in its portable version.
pub(crate) const KERNELS: Kernels = Kernels {
    isa: Isa::Generic,
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
    attn_dots_strided: attention::dots,
    attn_accumulate_strided: attention::accumulate,
    // (rows of blocks are converted to f32 and take the f32 kernels)
    attn_block_dots_q8_0: None,
    attn_block_dots_q4_0: None,
    attn_block_accumulate_q8_0: None,
    attn_block_accumulate_q4_0: None,
};
