//! Attention's dot products and value accumulation with AVX2, FMA and F16C, for rows with
//! adjacent elements: blocks of 4 rows by up to 4 queries, the generic version's order per
//! (row, query) pair, so the same bits; rows of a later block prefetched ahead of use. Rows of
//! q8_0 and q4_0 blocks (quantized caches) are read in place the same way, each value its
//! block's scale times its integer (`quant`'s decoders, the arithmetic of the types'
//! conversion to f32): the bits of the f32 kernels on the converted rows.

use super::quant::{q4_0_block, q8_0_block, Q4_0_BYTES, Q8_0_BYTES};
use crate::arch::prefetch;
use crate::arch::table::target_feature_entries;
use crate::kernel_types::{load1, reduce8, BlockRows, ElemType, Queries, Rows, Scores};
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

/// A block decoder of `quant`: a block's 32 values (scale times integer) as four vectors.
type BlockLoad = unsafe fn(*const u8) -> [__m256; 4];

/// One group of `R` block rows by `Q` queries over `n_blocks` blocks: the f32 `block`'s
/// accumulation order per (row, query) pair (8 lanes over the dims in order, `reduce8`), with
/// each row's block decoded once for all queries.
#[inline(always)]
unsafe fn blocks_group<const R: usize, const Q: usize>(
    load: BlockLoad,
    bytes: usize,
    rows_p: [*const u8; R],
    q: [*const f32; Q],
    n_blocks: usize,
    out: [*mut f32; Q],
    c0: usize,
) {
    // SAFETY (whole body): the caller guarantees `n_blocks` whole blocks readable from every
    // row pointer, `32 * n_blocks` values from every query pointer, `out[m]` writable at
    // `c0 .. c0 + R`, and AVX2.
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); Q]; R];
        for b in 0..n_blocks {
            for r in 0..R {
                let v = load(rows_p[r].add(b * bytes));
                for (s, vs) in v.iter().enumerate() {
                    for m in 0..Q {
                        let qv = _mm256_loadu_ps(q[m].add(32 * b + 8 * s));
                        acc[r][m] = _mm256_fmadd_ps(qv, *vs, acc[r][m]);
                    }
                }
            }
        }
        for (r, acc_r) in acc.iter().enumerate() {
            for m in 0..Q {
                *out[m].add(c0 + r) = reduce8(&to_array(acc_r[m]));
            }
        }
    }
}

/// Every query (in pairs, then a single one) against the `R` block rows at `rows_p`, whose
/// scores are columns `c .. c + R`.
#[inline(always)]
unsafe fn block_rows_group<const R: usize>(
    load: BlockLoad,
    bytes: usize,
    rows_p: [*const u8; R],
    n_blocks: usize,
    q: &Queries<'_>,
    out: &mut Scores<'_>,
    c: usize,
) {
    let (n_q, q_stride, ld) = (q.n, q.stride, out.ld);
    let qp = q.q.as_ptr();
    let op = out.out.as_mut_ptr();
    let mut m = 0;
    // SAFETY: the caller's contract (`attention::dot::block_dots`) covers these rows, queries
    // and outputs.
    unsafe {
        while m + 2 <= n_q {
            let qs = [qp.add(m * q_stride), qp.add((m + 1) * q_stride)];
            let os = [op.add(m * ld), op.add((m + 1) * ld)];
            blocks_group::<R, 2>(load, bytes, rows_p, qs, n_blocks, os, c);
            m += 2;
        }
        if m < n_q {
            let (qs, os) = ([qp.add(m * q_stride)], [op.add(m * ld)]);
            blocks_group::<R, 1>(load, bytes, rows_p, qs, n_blocks, os, c);
        }
    }
}

/// `attention::dot::block_dots` for rows of blocks decoded by `load` (`bytes` per block).
#[inline(always)]
unsafe fn dots_blocks(
    load: BlockLoad,
    bytes: usize,
    rows: BlockRows,
    dims: Range<usize>,
    idx: &[u32],
    q: Queries<'_>,
    mut out: Scores<'_>,
) {
    let n_blocks = dims.len() / 32;
    let at = |j: u32| rows.at(j as usize, dims.start);
    // SAFETY: forwarded contract of `attention::dot::block_dots` (dims whole blocks, every
    // listed row readable over them, queries and scores sized); prefetches only hint.
    unsafe {
        let mut c = 0;
        while c + 4 <= idx.len() {
            for &j in idx.iter().skip(c + PREFETCH_ROWS).take(4) {
                prefetch(at(j), n_blocks * bytes);
            }
            let rows_p: [*const u8; 4] = std::array::from_fn(|r| at(idx[c + r]));
            block_rows_group::<4>(load, bytes, rows_p, n_blocks, &q, &mut out, c);
            c += 4;
        }
        while c < idx.len() {
            block_rows_group::<1>(load, bytes, [at(idx[c])], n_blocks, &q, &mut out, c);
            c += 1;
        }
    }
}

/// `attention::dot::block_accumulate` for rows of blocks decoded by `load`: the f32
/// `accumulate`'s order (four rows per pass over `out`, then one at a time).
#[inline(always)]
unsafe fn accumulate_blocks(
    load: BlockLoad,
    bytes: usize,
    rows: BlockRows,
    idx: &[u32],
    w: &[f32],
    out: &mut [f32],
) {
    let n_blocks = out.len() / 32;
    let o = out.as_mut_ptr();
    // SAFETY: the caller guarantees every listed row holds `out.len()` (whole blocks) values
    // and `w` one weight per listed row; writes stay inside `out`.
    unsafe {
        let mut c = 0;
        while c + 4 <= idx.len() {
            let p: [*const u8; 4] = std::array::from_fn(|r| rows.at(idx[c + r] as usize, 0));
            for &j in idx.iter().skip(c + PREFETCH_ROWS).take(4) {
                prefetch(rows.at(j as usize, 0), n_blocks * bytes);
            }
            let wv: [__m256; 4] = std::array::from_fn(|r| _mm256_set1_ps(w[c + r]));
            for b in 0..n_blocks {
                let v: [[__m256; 4]; 4] = [
                    load(p[0].add(b * bytes)),
                    load(p[1].add(b * bytes)),
                    load(p[2].add(b * bytes)),
                    load(p[3].add(b * bytes)),
                ];
                for s in 0..4 {
                    let i = 32 * b + 8 * s;
                    let mut acc = _mm256_loadu_ps(o.add(i));
                    for (w_r, v_r) in wv.iter().zip(&v) {
                        acc = _mm256_fmadd_ps(*w_r, v_r[s], acc);
                    }
                    _mm256_storeu_ps(o.add(i), acc);
                }
            }
            c += 4;
        }
        while c < idx.len() {
            let p = rows.at(idx[c] as usize, 0);
            let wv = _mm256_set1_ps(w[c]);
            for b in 0..n_blocks {
                let v = load(p.add(b * bytes));
                for (s, vs) in v.iter().enumerate() {
                    let i = 32 * b + 8 * s;
                    _mm256_storeu_ps(
                        o.add(i),
                        _mm256_fmadd_ps(wv, *vs, _mm256_loadu_ps(o.add(i))),
                    );
                }
            }
            c += 1;
        }
    }
}

target_feature_entries! { "avx2,fma,f16c";
    /// One q8_0 block's 32 values as four vectors (`p`: the block's first byte).
    q8_0_values(p: *const u8) -> [__m256; 4] => q8_0_block(p);
    /// One q4_0 block's 32 values as four vectors.
    q4_0_values(p: *const u8) -> [__m256; 4] => q4_0_block(p);
    /// See `attention::dot::block_dots`, rows of q8_0 blocks.
    pub(crate) dots_q8_0(rows: BlockRows, dims: Range<usize>, idx: &[u32], q: Queries<'_>, out: Scores<'_>) =>
        dots_blocks(q8_0_values, Q8_0_BYTES, rows, dims, idx, q, out);
    /// See `attention::dot::block_dots`, rows of q4_0 blocks.
    pub(crate) dots_q4_0(rows: BlockRows, dims: Range<usize>, idx: &[u32], q: Queries<'_>, out: Scores<'_>) =>
        dots_blocks(q4_0_values, Q4_0_BYTES, rows, dims, idx, q, out);
    /// See `attention::dot::block_accumulate`, rows of q8_0 blocks.
    pub(crate) accumulate_q8_0(rows: BlockRows, idx: &[u32], w: &[f32], out: &mut [f32]) =>
        accumulate_blocks(q8_0_values, Q8_0_BYTES, rows, idx, w, out);
    /// See `attention::dot::block_accumulate`, rows of q4_0 blocks.
    pub(crate) accumulate_q4_0(rows: BlockRows, idx: &[u32], w: &[f32], out: &mut [f32]) =>
        accumulate_blocks(q4_0_values, Q4_0_BYTES, rows, idx, w, out);
}
