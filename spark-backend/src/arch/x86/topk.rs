//! The statistical top-k's shifted sums with AVX2: the generic version's bits.

use crate::arch::generic::topk::Lanes;
use std::arch::x86_64::*;

/// The generic `shifted_sums` with the eight lanes in two AVX registers per sum: per lane the same
/// subtraction, multiplication and addition (no FMA) in the same order as the scalar version,
/// so the same bits; ~4 instructions per 8 entries against ~6 per entry for what the compiler
/// makes of the scalar loop (it pairs each entry's two sums in one register).
///
/// # Safety
/// The CPU must have AVX2.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn shifted_sums(x: &[f32], shift: f64) -> (f64, f64, usize) {
    let chunks = x.chunks_exact(8);
    let tail = chunks.remainder();
    let sh = _mm256_set1_pd(shift);
    let (mut a1_lo, mut a1_hi) = (_mm256_setzero_pd(), _mm256_setzero_pd());
    let (mut a2_lo, mut a2_hi) = (_mm256_setzero_pd(), _mm256_setzero_pd());
    for c in chunks {
        // SAFETY: `c` is 8 f32 = 32 readable bytes; the load is unaligned.
        let v = unsafe { _mm256_loadu_ps(c.as_ptr()) };
        let d_lo = _mm256_sub_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(v)), sh);
        let d_hi = _mm256_sub_pd(_mm256_cvtps_pd(_mm256_extractf128_ps::<1>(v)), sh);
        a1_lo = _mm256_add_pd(a1_lo, d_lo);
        a1_hi = _mm256_add_pd(a1_hi, d_hi);
        a2_lo = _mm256_add_pd(a2_lo, _mm256_mul_pd(d_lo, d_lo));
        a2_hi = _mm256_add_pd(a2_hi, _mm256_mul_pd(d_hi, d_hi));
    }
    let mut lanes = Lanes::default();
    // SAFETY: each array holds 8 f64, two unaligned 4-lane stores each.
    unsafe {
        _mm256_storeu_pd(lanes.a1.as_mut_ptr(), a1_lo);
        _mm256_storeu_pd(lanes.a1.as_mut_ptr().add(4), a1_hi);
        _mm256_storeu_pd(lanes.a2.as_mut_ptr(), a2_lo);
        _mm256_storeu_pd(lanes.a2.as_mut_ptr().add(4), a2_hi);
    }
    lanes.add(tail, shift);
    lanes.finish(x.len())
}
