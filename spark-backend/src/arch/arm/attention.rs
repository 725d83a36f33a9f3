//! Attention's dot products and value accumulation with NEON, for rows with adjacent elements:
//! per (row, query) pair the generic version's order (eight lanes in two registers, the fixed
//! reduction tree, then the leftover dims), so the same bits; queries in pairs per row, and
//! rows four at a time per pass over the output; rows ahead prefetched.

use super::rows::f16x4_to_f32;
use crate::arch::prefetch;
use crate::kernel_types::{load1, reduce8, ElemType, Queries, Rows, Scores};
use std::arch::aarch64::*;
use std::ops::Range;

/// How many rows ahead `dots` and `accumulate` prefetch.
const PREFETCH_ROWS: usize = 16;

/// Loads 4 consecutive elements as f32.
///
/// # Safety
/// 4 elements must be readable at `p`.
#[inline(always)]
unsafe fn load4(ty: ElemType, p: *const u8) -> float32x4_t {
    // SAFETY: the caller guarantees 4 elements at `p`; LD1 has no alignment need.
    unsafe {
        match ty {
            ElemType::F32 => vld1q_f32(p.cast()),
            ElemType::F16 => f16x4_to_f32(vld1_u16(p.cast())),
        }
    }
}

/// The score of one row against `Q` queries: `row` points at the first scored dim.
///
/// # Safety
/// `len` elements readable from `row` and from every query pointer.
#[inline(always)]
unsafe fn row_scores<const Q: usize>(
    ty: ElemType,
    esz: usize,
    row: *const u8,
    q: [*const f32; Q],
    len: usize,
) -> [f32; Q] {
    // SAFETY (whole body): per the caller's contract.
    unsafe {
        let mut lo = [vdupq_n_f32(0.0); Q];
        let mut hi = [vdupq_n_f32(0.0); Q];
        let full = len / 8 * 8;
        let mut i = 0;
        while i < full {
            let k_lo = load4(ty, row.add(i * esz));
            let k_hi = load4(ty, row.add((i + 4) * esz));
            for m in 0..Q {
                lo[m] = vfmaq_f32(lo[m], vld1q_f32(q[m].add(i)), k_lo);
                hi[m] = vfmaq_f32(hi[m], vld1q_f32(q[m].add(i + 4)), k_hi);
            }
            i += 8;
        }
        let mut out = [0f32; Q];
        for m in 0..Q {
            let mut a = [0f32; 8];
            vst1q_f32(a.as_mut_ptr(), lo[m]);
            vst1q_f32(a.as_mut_ptr().add(4), hi[m]);
            let mut s = reduce8(&a);
            for t in full..len {
                s = (*q[m].add(t)).mul_add(load1(ty, row.add(t * esz)), s);
            }
            out[m] = s;
        }
        out
    }
}

/// See `attention::dot::dots`.
///
/// # Safety
/// As for `attention::dot::dots`; the CPU must have NEON.
#[target_feature(enable = "neon")]
pub(crate) unsafe fn dots(
    rows: Rows,
    dims: Range<usize>,
    idx: &[u32],
    q: Queries<'_>,
    out: Scores<'_>,
) {
    let (len, esz) = (dims.len(), rows.ty.size());
    let qp = q.q.as_ptr();
    let op = out.out.as_mut_ptr();
    // SAFETY: forwarded contract of `attention::dot::dots`; prefetches only hint listed rows.
    unsafe {
        for (c, &j) in idx.iter().enumerate() {
            if let Some(&ahead) = idx.get(c + PREFETCH_ROWS) {
                prefetch(rows.at(ahead as usize, dims.start), len * esz);
            }
            let row = rows.at(j as usize, dims.start);
            let mut m = 0;
            while m + 2 <= q.n {
                let qs = [qp.add(m * q.stride), qp.add((m + 1) * q.stride)];
                let s = row_scores::<2>(rows.ty, esz, row, qs, len);
                *op.add(m * out.ld + c) = s[0];
                *op.add((m + 1) * out.ld + c) = s[1];
                m += 2;
            }
            if m < q.n {
                let s = row_scores::<1>(rows.ty, esz, row, [qp.add(m * q.stride)], len);
                *op.add(m * out.ld + c) = s[0];
            }
        }
    }
}

/// See `attention::dot::accumulate`.
///
/// # Safety
/// As for `attention::dot::accumulate`; the CPU must have NEON.
#[target_feature(enable = "neon")]
pub(crate) unsafe fn accumulate(rows: Rows, idx: &[u32], w: &[f32], out: &mut [f32]) {
    let h = out.len();
    let full = h / 4 * 4;
    let esz = rows.ty.size();
    let o = out.as_mut_ptr();
    // SAFETY: the caller guarantees every listed row is readable over `h` elements and `out`
    // is `h` long; writes stay inside `out`.
    unsafe {
        let mut c = 0;
        // Four rows per pass over `out`: the same fused multiply-adds in the same order as one
        // row at a time, with a quarter of the loads and stores of `out`.
        while c + 4 <= idx.len() {
            let p: [*const u8; 4] = std::array::from_fn(|r| rows.at(idx[c + r] as usize, 0));
            for &j in idx.iter().skip(c + PREFETCH_ROWS).take(4) {
                prefetch(rows.at(j as usize, 0), h * esz);
            }
            let wv: [float32x4_t; 4] = std::array::from_fn(|r| vdupq_n_f32(w[c + r]));
            let mut i = 0;
            while i < full {
                let mut acc = vld1q_f32(o.add(i));
                for r in 0..4 {
                    acc = vfmaq_f32(acc, wv[r], load4(rows.ty, p[r].add(i * esz)));
                }
                vst1q_f32(o.add(i), acc);
                i += 4;
            }
            for t in full..h {
                let mut acc = *o.add(t);
                for r in 0..4 {
                    acc = w[c + r].mul_add(load1(rows.ty, p[r].add(t * esz)), acc);
                }
                *o.add(t) = acc;
            }
            c += 4;
        }
        while c < idx.len() {
            let p = rows.at(idx[c] as usize, 0);
            let wv = vdupq_n_f32(w[c]);
            let mut i = 0;
            while i < full {
                let acc = vfmaq_f32(vld1q_f32(o.add(i)), wv, load4(rows.ty, p.add(i * esz)));
                vst1q_f32(o.add(i), acc);
                i += 4;
            }
            for t in full..h {
                *o.add(t) = w[c].mul_add(load1(rows.ty, p.add(t * esz)), *o.add(t));
            }
            c += 1;
        }
    }
}
