//! The statistical top-k's shifted sums with NEON: the generic version's bits.

use crate::arch::generic::topk::Lanes;
use std::arch::aarch64::*;

/// The generic `shifted_sums` with the eight f64 lanes in four 2-lane registers per sum: per
/// lane the same subtraction, multiplication and addition (no fused multiply-add) in the same
/// order as the generic version, so the same bits.
///
/// # Safety
/// The CPU must have NEON.
#[target_feature(enable = "neon")]
pub(crate) unsafe fn shifted_sums(x: &[f32], shift: f64) -> (f64, f64, usize) {
    let chunks = x.chunks_exact(8);
    let tail = chunks.remainder();
    let sh = vdupq_n_f64(shift);
    let mut a1 = [vdupq_n_f64(0.0); 4];
    let mut a2 = [vdupq_n_f64(0.0); 4];
    for c in chunks {
        // SAFETY: `c` is 8 f32 = 32 readable bytes; LD1 has no alignment need.
        let (lo, hi) = unsafe { (vld1q_f32(c.as_ptr()), vld1q_f32(c.as_ptr().add(4))) };
        let d = [
            vsubq_f64(vcvt_f64_f32(vget_low_f32(lo)), sh),
            vsubq_f64(vcvt_high_f64_f32(lo), sh),
            vsubq_f64(vcvt_f64_f32(vget_low_f32(hi)), sh),
            vsubq_f64(vcvt_high_f64_f32(hi), sh),
        ];
        for k in 0..4 {
            a1[k] = vaddq_f64(a1[k], d[k]);
            a2[k] = vaddq_f64(a2[k], vmulq_f64(d[k], d[k]));
        }
    }
    let mut lanes = Lanes::default();
    for k in 0..4 {
        // SAFETY: each array holds 8 f64; lanes 2k and 2k + 1 are in bounds for k < 4.
        unsafe {
            vst1q_f64(lanes.a1.as_mut_ptr().add(2 * k), a1[k]);
            vst1q_f64(lanes.a2.as_mut_ptr().add(2 * k), a2[k]);
        }
    }
    lanes.add(tail, shift);
    lanes.finish(x.len())
}
