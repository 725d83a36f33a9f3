//! The one choice of instruction set for every SIMD kernel of the crate, made once per process.
//!
//! Each kernel family with a SIMD version keeps its portable scalar version beside it (the
//! reference its tests compare with, bit for bit where the family promises it) and picks one
//! with [`current`] at its entry, never inside its inner loops:
//! - float rows (f32, f16, bf16: dot, axpy, conversion): `rows::simd`, one function table per
//!   ISA ([`crate::rows::simd::kernels`]);
//! - quantized rows (q8_0, q4_0, q6_K axpy and dequantization, the fused FFN's folded q8_0
//!   axpy): `rows::quant_x86`, against ggml's `to_float` and `rows::quant`'s scalar version;
//! - the statistical top-k's shifted sums: `topk`;
//! - attention's dot products and value accumulation: `attention::dot`.
//!
//! A port to another instruction set (NEON) adds a variant here with its detection, and one
//! version per family.

use std::sync::OnceLock;

/// An instruction set the kernels have a version for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// Portable Rust (the references).
    Scalar,
    /// x86-64 with AVX2, FMA and F16C (every SIMD kernel of the crate may use all three).
    Avx2,
}

impl Isa {
    /// The best instruction set this CPU supports.
    pub(crate) fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c")
        {
            return Isa::Avx2;
        }
        Isa::Scalar
    }
}

/// The instruction set every kernel of this process uses: [`Isa::detect`] on first use.
#[inline]
pub(crate) fn current() -> Isa {
    static CHOSEN: OnceLock<Isa> = OnceLock::new();
    *CHOSEN.get_or_init(Isa::detect)
}
