//! The x86-64 kernels: AVX2 with FMA and F16C, a version of every family; AVX-512 where it
//! gains over AVX2 (the AVX-512 table borrows the AVX2 entries elsewhere).

mod attention;
mod avx512_attention;
mod avx512_quant;
mod avx512_rows;
mod quant;
mod rows;
mod topk;

use super::{Isa, Kernels};

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
};

/// Whether the CPU has AVX2, FMA and F16C (the [`AVX2`] table's features).
pub(super) fn avx2_supported() -> bool {
    std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
        && std::arch::is_x86_feature_detected!("f16c")
}

/// Whether the CPU has the AVX-512 features the [`AVX512`] table's own kernels use (on top of
/// [`avx2_supported`]).
pub(super) fn avx512_supported() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512vl")
}

/// The AVX-512 table. Handed out by `arch::table` only where the CPU has AVX2, FMA, F16C and
/// [`avx512_supported`]'s features. Entries marked AVX2 are the AVX2 table's (no gain measured,
/// or not on a path measured: the float rows and q4_0 / q6_K).
pub(super) const AVX512: Kernels = Kernels {
    isa: Isa::Avx512,
    dot_f32: rows::dot_f32,   // AVX2
    dot_f16: rows::dot_f16,   // AVX2
    dot_bf16: rows::dot_bf16, // AVX2
    axpy_f32: avx512_rows::axpy_f32,
    axpy_f16: avx512_rows::axpy_f16,
    axpy_bf16: avx512_rows::axpy_bf16,
    f16_to_f32: avx512_rows::f16_to_f32,
    bf16_to_f32: avx512_rows::bf16_to_f32,
    axpy_q8_0: avx512_quant::axpy_q8_0,
    axpy_q4_0: quant::axpy_q4_0, // AVX2
    axpy_q6_k: quant::axpy_q6_k, // AVX2
    to_f32_q8_0: avx512_quant::to_f32_q8_0,
    to_f32_q4_0: quant::to_f32_q4_0, // AVX2
    to_f32_q6_k: quant::to_f32_q6_k, // AVX2
    axpy4_q8_0: avx512_quant::axpy4_q8_0,
    axpy_q8_0_folded: avx512_quant::axpy_q8_0_folded,
    shifted_sums: topk::shifted_sums, // AVX2
    attn_dots: avx512_attention::dots,
    attn_accumulate: avx512_attention::accumulate,
};
