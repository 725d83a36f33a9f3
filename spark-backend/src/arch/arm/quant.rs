//! Quantized rows (q8_0, q4_0, q6_K) with NEON: dequantization fused with axpy or writing f32,
//! and the four-row and folded q8_0 axpys.
//!
//! The same arithmetic as the generic version (ggml's `to_float`: each weight is `d * q`, exact
//! in f32 for q8_0 and q4_0, `(d * scale) * q` for q6_K as ggml rounds it; then one fused
//! multiply-add with alpha), so the generic version's bits.

use crate::kernel_types::Start;
use std::arch::aarch64::*;

/// Bytes per q8_0 block: f16 scale + 32 int8 (ggml's `block_q8_0`; tested against the linked
/// ggml below).
const Q8_0_BYTES: usize = 2 + 32;
/// Bytes per q4_0 block: f16 scale + 16 bytes of nibbles (`block_q4_0`).
const Q4_0_BYTES: usize = 2 + 16;
/// Bytes per q6_K block: ql[128], qh[64], scales[16] (int8), d (f16); 256 weights.
const Q6_K_BYTES: usize = 210;

/// A block's f16 scale (its first two bytes) as f32.
///
/// # Safety
/// The 2 bytes at `p` must be readable.
#[inline(always)]
unsafe fn scale_f32(p: *const u8) -> f32 {
    // SAFETY: caller guarantees the 2 scale bytes are readable.
    let h = unsafe { p.cast::<u16>().read_unaligned() };
    half::f16::from_bits(h).to_f32()
}

/// 16 int8 values as four vectors of 4 f32 (exact).
#[inline(always)]
fn i8x16_to_f32(v: int8x16_t) -> [float32x4_t; 4] {
    // SAFETY: register-only NEON arithmetic; the callers enable NEON.
    unsafe {
        let lo = vmovl_s8(vget_low_s8(v));
        let hi = vmovl_high_s8(v);
        [
            vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo))),
            vcvtq_f32_s32(vmovl_high_s16(lo)),
            vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi))),
            vcvtq_f32_s32(vmovl_high_s16(hi)),
        ]
    }
}

/// The 32 int8 weights of one q8_0 block (after its scale) as eight vectors of 4 f32, unscaled.
///
/// # Safety
/// 32 bytes at `q` must be readable.
#[inline(always)]
unsafe fn q8_0_ints(q: *const u8) -> [float32x4_t; 8] {
    // SAFETY: caller guarantees 32 readable bytes at q.
    let (a, b) = unsafe { (vld1q_s8(q.cast()), vld1q_s8(q.add(16).cast())) };
    let (a, b) = (i8x16_to_f32(a), i8x16_to_f32(b));
    [a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]]
}

/// The 32 weights of one q8_0 block as eight vectors of 4: `d * q`.
///
/// # Safety
/// A whole 34-byte block at `p` must be readable.
#[inline(always)]
unsafe fn q8_0_block(p: *const u8) -> [float32x4_t; 8] {
    // SAFETY: caller guarantees a whole block at p.
    unsafe {
        let d = vdupq_n_f32(scale_f32(p));
        let mut w = q8_0_ints(p.add(2));
        for v in &mut w {
            *v = vmulq_f32(*v, d);
        }
        w
    }
}

/// The 32 weights of one q4_0 block as eight vectors of 4: low nibbles are weights 0..16, high
/// nibbles 16..32, each minus 8, times `d`.
///
/// # Safety
/// A whole 18-byte block at `p` must be readable.
#[inline(always)]
unsafe fn q4_0_block(p: *const u8) -> [float32x4_t; 8] {
    // SAFETY: caller guarantees a whole block at p.
    unsafe {
        let d = vdupq_n_f32(scale_f32(p));
        let b = vld1q_u8(p.add(2));
        let eight = vdupq_n_s8(8);
        let lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(b, vdupq_n_u8(0x0F))), eight);
        let hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8::<4>(b)), eight);
        let (lo, hi) = (i8x16_to_f32(lo), i8x16_to_f32(hi));
        let mut w = [lo[0], lo[1], lo[2], lo[3], hi[0], hi[1], hi[2], hi[3]];
        for v in &mut w {
            *v = vmulq_f32(*v, d);
        }
        w
    }
}

/// `y += alpha * w` over 32 elements at `yp`, one fused multiply-add each.
///
/// # Safety
/// 32 f32 at `yp` must be readable and writable.
#[inline(always)]
unsafe fn fma32(yp: *mut f32, w: &[float32x4_t; 8], a: float32x4_t) {
    // SAFETY: caller guarantees 32 f32 at yp.
    unsafe {
        for (k, wk) in w.iter().enumerate() {
            let p = yp.add(4 * k);
            vst1q_f32(p, vfmaq_f32(vld1q_f32(p), *wk, a));
        }
    }
}

/// Checks that `row` holds the blocks of `n` elements in blocks of 32 of `block_bytes`.
fn check_blocks(row: &[u8], n: usize, block_bytes: usize) -> usize {
    let n_blocks = n / 32;
    assert!(
        n.is_multiple_of(32) && row.len() >= n_blocks * block_bytes,
        "short quantized row"
    );
    n_blocks
}

/// `y += alpha * row` for a q8_0 row of `y.len()` elements (a multiple of 32).
///
/// # Safety
/// The CPU must have NEON; lengths are checked.
#[target_feature(enable = "neon")]
pub(crate) unsafe fn axpy_q8_0(row: &[u8], alpha: f32, y: &mut [f32]) {
    let n_blocks = check_blocks(row, y.len(), Q8_0_BYTES);
    let a = vdupq_n_f32(alpha);
    for b in 0..n_blocks {
        // SAFETY: block b lies inside `row`, elements 32b..32b+32 inside `y` (checked above).
        unsafe {
            let w = q8_0_block(row.as_ptr().add(b * Q8_0_BYTES));
            fma32(y.as_mut_ptr().add(32 * b), &w, a);
        }
    }
}

/// `y += alpha * row` for a q4_0 row of `y.len()` elements (a multiple of 32).
///
/// # Safety
/// As for [`axpy_q8_0`].
#[target_feature(enable = "neon")]
pub(crate) unsafe fn axpy_q4_0(row: &[u8], alpha: f32, y: &mut [f32]) {
    let n_blocks = check_blocks(row, y.len(), Q4_0_BYTES);
    let a = vdupq_n_f32(alpha);
    for b in 0..n_blocks {
        // SAFETY: as in `axpy_q8_0`.
        unsafe {
            let w = q4_0_block(row.as_ptr().add(b * Q4_0_BYTES));
            fma32(y.as_mut_ptr().add(32 * b), &w, a);
        }
    }
}

/// A q8_0 row of `out.len()` elements to f32.
///
/// # Safety
/// As for [`axpy_q8_0`].
#[target_feature(enable = "neon")]
pub(crate) unsafe fn to_f32_q8_0(row: &[u8], out: &mut [f32]) {
    let n_blocks = check_blocks(row, out.len(), Q8_0_BYTES);
    for b in 0..n_blocks {
        // SAFETY: as in `axpy_q8_0`.
        unsafe {
            let w = q8_0_block(row.as_ptr().add(b * Q8_0_BYTES));
            for (k, wk) in w.iter().enumerate() {
                vst1q_f32(out.as_mut_ptr().add(32 * b + 4 * k), *wk);
            }
        }
    }
}

/// A q4_0 row of `out.len()` elements to f32.
///
/// # Safety
/// As for [`axpy_q8_0`].
#[target_feature(enable = "neon")]
pub(crate) unsafe fn to_f32_q4_0(row: &[u8], out: &mut [f32]) {
    let n_blocks = check_blocks(row, out.len(), Q4_0_BYTES);
    for b in 0..n_blocks {
        // SAFETY: as in `axpy_q8_0`.
        unsafe {
            let w = q4_0_block(row.as_ptr().add(b * Q4_0_BYTES));
            for (k, wk) in w.iter().enumerate() {
                vst1q_f32(out.as_mut_ptr().add(32 * b + 4 * k), *wk);
            }
        }
    }
}

/// `y += alphas[0] * rows[0] + ... + alphas[3] * rows[3]` for four q8_0 rows, one pass over
/// `y`: each element gets the four fused multiply-adds in row order, so four [`axpy_q8_0`]
/// calls' bits.
///
/// # Safety
/// As for [`axpy_q8_0`].
#[target_feature(enable = "neon")]
pub(crate) unsafe fn axpy4_q8_0(rows: [&[u8]; 4], alphas: [f32; 4], y: &mut [f32]) {
    let n_blocks = y.len() / 32;
    for row in rows {
        check_blocks(row, y.len(), Q8_0_BYTES);
    }
    let a = alphas.map(|v| vdupq_n_f32(v));
    let yp = y.as_mut_ptr();
    for b in 0..n_blocks {
        // SAFETY: block b lies inside every row and elements 32b..32b+32 inside `y` (checked).
        unsafe {
            let p = yp.add(32 * b);
            let mut acc = [vdupq_n_f32(0.0); 8];
            for (k, v) in acc.iter_mut().enumerate() {
                *v = vld1q_f32(p.add(4 * k));
            }
            for (row, ar) in rows.iter().zip(a) {
                let w = q8_0_block(row.as_ptr().add(b * Q8_0_BYTES));
                for (v, wk) in acc.iter_mut().zip(w) {
                    *v = vfmaq_f32(*v, wk, ar);
                }
            }
            for (k, v) in acc.into_iter().enumerate() {
                vst1q_f32(p.add(4 * k), v);
            }
        }
    }
}

/// `y = y + alphas[0] * rows[0] + ...` for one to four q8_0 rows of `y.len()` elements (a
/// multiple of 32), one pass over `y`, each block's scale folded into the row's coefficient:
/// `c = alpha * d` rounded once to f32, then `y = fma(q, c, y)` per weight, rows in order; from
/// zero (old values unread) with [`Start::Zero`]. The generic version's bits.
///
/// # Safety
/// As for [`axpy_q8_0`].
#[target_feature(enable = "neon")]
pub(crate) unsafe fn axpy_q8_0_folded(rows: &[&[u8]], alphas: &[f32], y: &mut [f32], start: Start) {
    assert!(rows.len() == alphas.len() && (1..=4).contains(&rows.len()));
    let n_blocks = y.len() / 32;
    for row in rows {
        check_blocks(row, y.len(), Q8_0_BYTES);
    }
    let yp = y.as_mut_ptr();
    for b in 0..n_blocks {
        // SAFETY: block b lies inside every row and elements 32b..32b+32 inside `y` (checked).
        unsafe {
            let p = yp.add(32 * b);
            let mut acc = [vdupq_n_f32(0.0); 8];
            if start == Start::Accumulate {
                for (k, v) in acc.iter_mut().enumerate() {
                    *v = vld1q_f32(p.add(4 * k));
                }
            }
            for (row, &alpha) in rows.iter().zip(alphas) {
                let block = row.as_ptr().add(b * Q8_0_BYTES);
                let c = vdupq_n_f32(alpha * scale_f32(block));
                for (v, q) in acc.iter_mut().zip(q8_0_ints(block.add(2))) {
                    *v = vfmaq_f32(*v, q, c);
                }
            }
            for (k, v) in acc.into_iter().enumerate() {
                vst1q_f32(p.add(4 * k), v);
            }
        }
    }
}

/// Unpacks one q6_K block into 256 signed 6-bit values (-32..31) in ggml's element order, and
/// the 16 per-group scales `d * scales[g]` (groups of 16 elements), computed as ggml does.
///
/// # Safety
/// A whole 210-byte block at `p` must be readable.
#[inline(always)]
unsafe fn q6_k_unpack(p: *const u8, q: &mut [i8; 256], scales: &mut [f32; 16]) {
    // SAFETY: caller guarantees a whole block at p; stores stay inside `q` (2 halves of 128).
    unsafe {
        let d = half::f16::from_bits(p.add(208).cast::<u16>().read_unaligned()).to_f32();
        for (g, s) in scales.iter_mut().enumerate() {
            *s = d * f32::from(*p.add(192 + g).cast::<i8>());
        }
        let m4 = vdupq_n_u8(0x0F);
        let m2 = vdupq_n_u8(0x03);
        let bias = vdupq_n_s8(32);
        let qp = q.as_mut_ptr();
        for half_ in 0..2 {
            let ql = p.add(64 * half_);
            let qh_p = p.add(128 + 32 * half_);
            // Two 16-byte lanes of each 32-byte group, as ggml's loop over l in 0..32.
            for part in 0..2 {
                let o = 16 * part;
                let qh = vld1q_u8(qh_p.add(o));
                let ql0 = vld1q_u8(ql.add(o));
                let ql1 = vld1q_u8(ql.add(32 + o));
                let hi0 = vshlq_n_u8::<4>(vandq_u8(qh, m2));
                let hi2 = vshlq_n_u8::<4>(vandq_u8(vshrq_n_u8::<2>(qh), m2));
                let hi4 = vshlq_n_u8::<4>(vandq_u8(vshrq_n_u8::<4>(qh), m2));
                let hi6 = vshlq_n_u8::<4>(vshrq_n_u8::<6>(qh));
                let v1 = vorrq_u8(vandq_u8(ql0, m4), hi0);
                let v2 = vorrq_u8(vandq_u8(ql1, m4), hi2);
                let v3 = vorrq_u8(vshrq_n_u8::<4>(ql0), hi4);
                let v4 = vorrq_u8(vshrq_n_u8::<4>(ql1), hi6);
                let out = qp.add(128 * half_ + o);
                vst1q_s8(out, vsubq_s8(vreinterpretq_s8_u8(v1), bias));
                vst1q_s8(out.add(32), vsubq_s8(vreinterpretq_s8_u8(v2), bias));
                vst1q_s8(out.add(64), vsubq_s8(vreinterpretq_s8_u8(v3), bias));
                vst1q_s8(out.add(96), vsubq_s8(vreinterpretq_s8_u8(v4), bias));
            }
        }
    }
}

/// Weights `16 * g .. 16 * g + 16` (group `g`) of an unpacked q6_K block: `(d * scale) * q`,
/// as ggml rounds.
#[inline(always)]
fn q6_k_weights(q: &[i8; 256], scales: &[f32; 16], g: usize) -> [float32x4_t; 4] {
    // SAFETY: g < 16, so the 16 bytes lie inside q; NEON per caller.
    unsafe {
        let s = vdupq_n_f32(scales[g]);
        let mut w = i8x16_to_f32(vld1q_s8(q.as_ptr().add(16 * g)));
        for v in &mut w {
            *v = vmulq_f32(s, *v);
        }
        w
    }
}

/// Checks that `row` holds `n` q6_K elements (a multiple of 256) and returns the block count.
fn check_q6_k(row: &[u8], n: usize) -> usize {
    let n_blocks = n / 256;
    assert!(
        n.is_multiple_of(256) && row.len() >= n_blocks * Q6_K_BYTES,
        "short quantized row"
    );
    n_blocks
}

/// `y += alpha * row` for a q6_K row of `y.len()` elements (a multiple of 256).
///
/// # Safety
/// As for [`axpy_q8_0`].
#[target_feature(enable = "neon")]
pub(crate) unsafe fn axpy_q6_k(row: &[u8], alpha: f32, y: &mut [f32]) {
    let n_blocks = check_q6_k(row, y.len());
    let a = vdupq_n_f32(alpha);
    let (mut q, mut sc) = ([0i8; 256], [0f32; 16]);
    for b in 0..n_blocks {
        // SAFETY: block b lies inside `row`, elements 256b..256b+256 inside `y` (checked).
        unsafe {
            q6_k_unpack(row.as_ptr().add(b * Q6_K_BYTES), &mut q, &mut sc);
            let yp = y.as_mut_ptr().add(256 * b);
            for g in 0..16 {
                for (k, w) in q6_k_weights(&q, &sc, g).into_iter().enumerate() {
                    let p = yp.add(16 * g + 4 * k);
                    vst1q_f32(p, vfmaq_f32(vld1q_f32(p), w, a));
                }
            }
        }
    }
}

/// A q6_K row of `out.len()` elements (a multiple of 256) to f32.
///
/// # Safety
/// As for [`axpy_q8_0`].
#[target_feature(enable = "neon")]
pub(crate) unsafe fn to_f32_q6_k(row: &[u8], out: &mut [f32]) {
    let n_blocks = check_q6_k(row, out.len());
    let (mut q, mut sc) = ([0i8; 256], [0f32; 16]);
    for b in 0..n_blocks {
        // SAFETY: as in `axpy_q6_k`.
        unsafe {
            q6_k_unpack(row.as_ptr().add(b * Q6_K_BYTES), &mut q, &mut sc);
            let op = out.as_mut_ptr().add(256 * b);
            for g in 0..16 {
                for (k, w) in q6_k_weights(&q, &sc, g).into_iter().enumerate() {
                    vst1q_f32(op.add(16 * g + 4 * k), w);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::kernel_types::RowType;

    /// The block layouts these kernels decode are the linked ggml's.
    #[test]
    fn decoded_layouts_are_ggmls() {
        assert_eq!(
            (RowType::Q8_0.block_elems(), RowType::Q8_0.block_bytes()),
            (32, super::Q8_0_BYTES)
        );
        assert_eq!(
            (RowType::Q4_0.block_elems(), RowType::Q4_0.block_bytes()),
            (32, super::Q4_0_BYTES)
        );
        assert_eq!(
            (RowType::Q6K.block_elems(), RowType::Q6K.block_bytes()),
            (256, super::Q6_K_BYTES)
        );
    }
}
