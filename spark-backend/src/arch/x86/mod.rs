//! The x86-64 kernels: AVX2 with FMA and F16C, a version of every family. There is no AVX-512
//! table: AVX-512 versions of the float axpy, q8_0 and attention kernels were written, tested
//! and measured end to end without a gain (docs/PERF.md, "Instruction sets"), and removed.

mod attention;
mod quant;
mod rows;
mod topk;

use super::table::{Isa, Kernels};

/// The AVX2 + FMA + F16C table. Handed out by `arch::table` only where the CPU has the three.
pub(super) const AVX2: Kernels = Kernels {
    isa: Isa::Avx2,
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
    attn_block_dots_q8_0: Some(attention::dots_q8_0),
    attn_block_dots_q4_0: Some(attention::dots_q4_0),
    attn_block_accumulate_q8_0: Some(attention::accumulate_q8_0),
    attn_block_accumulate_q4_0: Some(attention::accumulate_q4_0),
};
