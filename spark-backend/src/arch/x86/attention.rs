//! Attention's dot products and value accumulation with AVX2, FMA and F16C, for rows with
//! adjacent elements: blocks of 4 rows by up to 4 queries, the generic version's order per
//! (row, query) pair, so the same bits; rows of a later block prefetched ahead of use.

use crate::arch::prefetch;
use crate::kernel_types::{load1, reduce8, ElemType, Queries, Rows, Scores};
use std::arch::x86_64::*;
use std::ops::Range;

/// Loads 8 consecutive elements as f32.
#[inline(always)]
unsafe fn load8(ty: ElemType, p: *const u8) -> __m256 {
    // SAFETY: the caller guarantees 8 elements are readable at `p`; loads are unaligned.
    unsafe {
        match ty {
            ElemType::F32 => _mm256_loadu_ps(p.cast()),
            ElemType::F16 => _mm256_cvtph_ps(_mm_loadu_si128(p.cast())),
        }
    }
}

#[inline(always)]
unsafe fn to_array(v: __m256) -> [f32; 8] {
    let mut a = [0f32; 8];
    // SAFETY: `a` has room for 8 f32; unaligned store.
    unsafe { _mm256_storeu_ps(a.as_mut_ptr(), v) };
    a
}

/// One block of `R` rows by `Q` queries. `rows_p[r]` points at dim 0 of the block's row r
/// (already offset by `dim0`).
#[inline(always)]
unsafe fn block<const R: usize, const Q: usize>(
    ty: ElemType,
    esz: usize,
    rows_p: [*const u8; R],
    q: [*const f32; Q],
    len: usize,
    out: [*mut f32; Q],
    c0: usize,
) {
    // SAFETY (whole body): the caller guarantees `len` elements readable from every row
    // pointer and every query pointer, and `out[m]` writable at `c0 .. c0 + R`.
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); Q]; R];
        let full = len / 8 * 8;
        let mut i = 0;
        while i < full {
            let mut qv = [_mm256_setzero_ps(); Q];
            for m in 0..Q {
                qv[m] = _mm256_loadu_ps(q[m].add(i));
            }
            for r in 0..R {
                let kv = load8(ty, rows_p[r].add(i * esz));
                for m in 0..Q {
                    acc[r][m] = _mm256_fmadd_ps(qv[m], kv, acc[r][m]);
                }
            }
            i += 8;
        }
        for r in 0..R {
            for m in 0..Q {
                let mut s = reduce8(&to_array(acc[r][m]));
                for t in full..len {
                    let k = load1(ty, rows_p[r].add(t * esz));
                    s = (*q[m].add(t)).mul_add(k, s);
                }
                *out[m].add(c0 + r) = s;
            }
        }
    }
}

/// Queries in pairs (then a single one) over listed rows `c0 .. c0 + R`.
#[inline(always)]
unsafe fn rows_block<const R: usize>(
    rows: Rows,
    dims: Range<usize>,
    idx: &[u32],
    c0: usize,
    q: Queries<'_>,
    out: &mut Scores<'_>,
) {
    let (len, n_q, q_stride, ld) = (dims.len(), q.n, q.stride, out.ld);
    let esz = rows.ty.size();
    let rows_p: [*const u8; R] = std::array::from_fn(|r| rows.at(idx[c0 + r] as usize, dims.start));
    let qp = q.q.as_ptr();
    let op = out.out.as_mut_ptr();
    let mut m = 0;
    // SAFETY: the caller's contract (see `attention::dot::dots`) covers these rows, queries and outputs.
    unsafe {
        while m + 2 <= n_q {
            let qs = [qp.add(m * q_stride), qp.add((m + 1) * q_stride)];
            let os = [op.add(m * ld), op.add((m + 1) * ld)];
            block::<R, 2>(rows.ty, esz, rows_p, qs, len, os, c0);
            m += 2;
        }
        if m < n_q {
            block::<R, 1>(
                rows.ty,
                esz,
                rows_p,
                [qp.add(m * q_stride)],
                len,
                [op.add(m * ld)],
                c0,
            );
        }
    }
}

/// How many rows ahead `dots` and `accumulate` prefetch.
const PREFETCH_ROWS: usize = 16;

/// See `attention::dot::dots`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dots(
    rows: Rows,
    dims: Range<usize>,
    idx: &[u32],
    q: Queries<'_>,
    mut out: Scores<'_>,
) {
    let mut c = 0;
    let dim0 = dims.start;
    let bytes = dims.len() * rows.ty.size();
    // SAFETY: forwarded contract of `attention::dot::dots`; prefetches only hint listed rows.
    unsafe {
        while c + 4 <= idx.len() {
            // Cache rows are far apart (a whole KV row per position): fetch the rows of a
            // later block ahead of use, every line of their scored dims.
            for &j in idx.iter().skip(c + PREFETCH_ROWS).take(4) {
                prefetch(rows.at(j as usize, dim0), bytes);
            }
            rows_block::<4>(rows, dims.clone(), idx, c, q, &mut out);
            c += 4;
        }
        while c < idx.len() {
            rows_block::<1>(rows, dims.clone(), idx, c, q, &mut out);
            c += 1;
        }
    }
}

/// See `attention::dot::accumulate`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn accumulate(rows: Rows, idx: &[u32], w: &[f32], out: &mut [f32]) {
    let h = out.len();
    let full = h / 8 * 8;
    let esz = rows.ty.size();
    let o = out.as_mut_ptr();
    // SAFETY: the caller guarantees every listed row is readable over `h` elements and
    // `out` is `h` long; writes stay inside `out`.
    unsafe {
        let mut c = 0;
        // Four rows per pass over `out`: the same fused multiply-adds in the same order as
        // one row at a time, with a quarter of the loads and stores of `out`.
        while c + 4 <= idx.len() {
            let p: [*const u8; 4] = std::array::from_fn(|r| rows.at(idx[c + r] as usize, 0));
            for &j in idx.iter().skip(c + PREFETCH_ROWS).take(4) {
                prefetch(rows.at(j as usize, 0), h * esz);
            }
            let wv: [__m256; 4] = std::array::from_fn(|r| _mm256_set1_ps(w[c + r]));
            let mut i = 0;
            while i < full {
                let mut acc = _mm256_loadu_ps(o.add(i));
                for r in 0..4 {
                    acc = _mm256_fmadd_ps(wv[r], load8(rows.ty, p[r].add(i * esz)), acc);
                }
                _mm256_storeu_ps(o.add(i), acc);
                i += 8;
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
            let wv = _mm256_set1_ps(w[c]);
            let mut i = 0;
            while i < full {
                let acc = _mm256_fmadd_ps(
                    wv,
                    load8(rows.ty, p.add(i * esz)),
                    _mm256_loadu_ps(o.add(i)),
                );
                _mm256_storeu_ps(o.add(i), acc);
                i += 8;
            }
            for t in full..h {
                *o.add(t) = w[c].mul_add(load1(rows.ty, p.add(t * esz)), *o.add(t));
            }
            c += 1;
        }
    }
}
