//! Attention's dot products and value accumulation with AVX-512 F, BW and VL (on top of AVX2,
//! FMA and F16C), for rows with adjacent elements.
//!
//! Dots: every (row, query) pair keeps the generic version's 8-lane accumulator, so a 16-lane
//! register holds two pairs side by side: two queries against one row (the row's 8 elements
//! converted once, in both halves), or, for a lone query, two rows against it. Blocks of 4 rows
//! by up to 8 queries (16 accumulators of the 32 registers), where AVX2 converts each row once
//! per two queries. Per pair the same fused multiply-adds in the same order, the same reduction
//! tree and leftover dims: the generic version's bits. Accumulation: 16 output elements per
//! step (the tail masked), four rows per pass over the output, one fused multiply-add per row
//! and element in list order: the generic version's bits. Rows of a later block are prefetched
//! ahead of use, as in the AVX2 version.

use crate::arch::prefetch;
use crate::attention::dot::{load1, reduce8, Queries, Rows, Scores};
use crate::attention::layout::ElemType;
use std::arch::x86_64::*;
use std::ops::Range;

/// The 8 elements at `p` as f32, in both 256-bit halves.
#[inline(always)]
unsafe fn load8_twice(ty: ElemType, p: *const u8) -> __m512 {
    // SAFETY: the caller guarantees 8 elements readable at `p` and the features; unaligned.
    unsafe {
        match ty {
            ElemType::F32 => _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_loadu_pd(p.cast()))),
            ElemType::F16 => {
                _mm512_cvtph_ps(_mm256_broadcastsi128_si256(_mm_loadu_si128(p.cast())))
            }
        }
    }
}

/// The 8 elements at `a` (low half) and the 8 at `b` (high half) as f32.
#[inline(always)]
unsafe fn load8_pair(ty: ElemType, a: *const u8, b: *const u8) -> __m512 {
    // SAFETY: the caller guarantees 8 elements readable at `a` and at `b`; unaligned.
    unsafe {
        match ty {
            ElemType::F32 => _mm512_castpd_ps(_mm512_insertf64x4::<1>(
                _mm512_castpd256_pd512(_mm256_loadu_pd(a.cast())),
                _mm256_loadu_pd(b.cast()),
            )),
            ElemType::F16 => _mm512_cvtph_ps(_mm256_inserti128_si256::<1>(
                _mm256_castsi128_si256(_mm_loadu_si128(a.cast())),
                _mm_loadu_si128(b.cast()),
            )),
        }
    }
}

/// 8 f32 at `a` (low half) and 8 at `b` (high half).
#[inline(always)]
unsafe fn f32_pair(a: *const f32, b: *const f32) -> __m512 {
    // SAFETY: as `load8_pair`.
    unsafe { load8_pair(ElemType::F32, a.cast(), b.cast()) }
}

/// The two 8-lane halves of `v`.
#[inline(always)]
unsafe fn halves(v: __m512) -> [[f32; 8]; 2] {
    let mut a = [[0f32; 8]; 2];
    // SAFETY: `a` is 16 contiguous f32; unaligned store.
    unsafe { _mm512_storeu_ps(a.as_mut_ptr().cast(), v) };
    a
}

/// The score of one pair from its 8 lanes: the reduction tree, then the leftover dims
/// `full..len` of query `q` against the row at `row`.
#[inline(always)]
unsafe fn finish(
    lanes: &[f32; 8],
    ty: ElemType,
    esz: usize,
    row: *const u8,
    q: *const f32,
    full: usize,
    len: usize,
) -> f32 {
    let mut s = reduce8(lanes);
    for t in full..len {
        // SAFETY: the caller guarantees `len` elements readable at `row` and at `q`.
        let (qv, k) = unsafe { (*q.add(t), load1(ty, row.add(t * esz))) };
        s = qv.mul_add(k, s);
    }
    s
}

/// `R` rows by `2 QP` queries: query pair `p` is `q[p]`, its scores go to `out[p][h]` at
/// `c0 + r`. `rows_p[r]` points at the first scored dim of the block's row `r`.
#[inline(always)]
unsafe fn block_queries<const R: usize, const QP: usize>(
    ty: ElemType,
    esz: usize,
    rows_p: [*const u8; R],
    q: [[*const f32; 2]; QP],
    len: usize,
    out: [[*mut f32; 2]; QP],
    c0: usize,
) {
    // SAFETY (whole body): the caller guarantees `len` elements readable from every row and
    // query pointer, and every `out` pointer writable at `c0 .. c0 + R`.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); QP]; R];
        let full = len / 8 * 8;
        let mut i = 0;
        while i < full {
            let mut qv = [_mm512_setzero_ps(); QP];
            for p in 0..QP {
                qv[p] = f32_pair(q[p][0].add(i), q[p][1].add(i));
            }
            for r in 0..R {
                let kv = load8_twice(ty, rows_p[r].add(i * esz));
                for p in 0..QP {
                    acc[r][p] = _mm512_fmadd_ps(qv[p], kv, acc[r][p]);
                }
            }
            i += 8;
        }
        for r in 0..R {
            for p in 0..QP {
                let lanes = halves(acc[r][p]);
                for h in 0..2 {
                    let s = finish(&lanes[h], ty, esz, rows_p[r], q[p][h], full, len);
                    *out[p][h].add(c0 + r) = s;
                }
            }
        }
    }
}

/// `2 RP` rows by one query `q`: row pair `p` is `rows_p[p]`; scores to `out` at `c0 ..`.
#[inline(always)]
unsafe fn block_rows<const RP: usize>(
    ty: ElemType,
    esz: usize,
    rows_p: [[*const u8; 2]; RP],
    q: *const f32,
    len: usize,
    out: *mut f32,
    c0: usize,
) {
    // SAFETY (whole body): as in `block_queries`, for `out` at `c0 .. c0 + 2 RP`.
    unsafe {
        let mut acc = [_mm512_setzero_ps(); RP];
        let full = len / 8 * 8;
        let mut i = 0;
        while i < full {
            let qv = load8_twice(ElemType::F32, q.add(i).cast());
            for p in 0..RP {
                let kv = load8_pair(ty, rows_p[p][0].add(i * esz), rows_p[p][1].add(i * esz));
                acc[p] = _mm512_fmadd_ps(qv, kv, acc[p]);
            }
            i += 8;
        }
        for p in 0..RP {
            let lanes = halves(acc[p]);
            for h in 0..2 {
                let s = finish(&lanes[h], ty, esz, rows_p[p][h], q, full, len);
                *out.add(c0 + 2 * p + h) = s;
            }
        }
    }
}

/// One row by one query, 8 lanes.
#[inline(always)]
unsafe fn one(ty: ElemType, esz: usize, row: *const u8, q: *const f32, len: usize) -> f32 {
    // SAFETY: the caller guarantees `len` elements readable at `row` and `q`.
    unsafe {
        let mut acc = _mm256_setzero_ps();
        let full = len / 8 * 8;
        let mut i = 0;
        while i < full {
            let kv = match ty {
                ElemType::F32 => _mm256_loadu_ps(row.add(i * esz).cast()),
                ElemType::F16 => _mm256_cvtph_ps(_mm_loadu_si128(row.add(i * esz).cast())),
            };
            acc = _mm256_fmadd_ps(_mm256_loadu_ps(q.add(i)), kv, acc);
            i += 8;
        }
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), acc);
        finish(&lanes, ty, esz, row, q, full, len)
    }
}

/// Every query over listed rows `c0 .. c0 + R` (`R` 1 or 4): queries by eight, four and two
/// while they last, a lone last query against row pairs.
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
    let (ty, esz) = (rows.ty, rows.ty.size());
    let rows_p: [*const u8; R] = std::array::from_fn(|r| rows.at(idx[c0 + r] as usize, dims.start));
    let qp = q.q.as_ptr();
    let op = out.out.as_mut_ptr();
    // SAFETY: the caller's contract (see `attention::dot::dots`) covers these rows, queries and
    // outputs.
    unsafe {
        let qs = |m: usize| [qp.add(m * q_stride), qp.add((m + 1) * q_stride)];
        let os = |m: usize| [op.add(m * ld), op.add((m + 1) * ld)];
        let mut m = 0;
        while m + 8 <= n_q {
            let (q4, o4) = (
                [0, 2, 4, 6].map(|k| qs(m + k)),
                [0, 2, 4, 6].map(|k| os(m + k)),
            );
            block_queries::<R, 4>(ty, esz, rows_p, q4, len, o4, c0);
            m += 8;
        }
        if m + 4 <= n_q {
            let (q2, o2) = ([qs(m), qs(m + 2)], [os(m), os(m + 2)]);
            block_queries::<R, 2>(ty, esz, rows_p, q2, len, o2, c0);
            m += 4;
        }
        if m + 2 <= n_q {
            block_queries::<R, 1>(ty, esz, rows_p, [qs(m)], len, [os(m)], c0);
            m += 2;
        }
        if m < n_q {
            let (qm, om) = (qp.add(m * q_stride), op.add(m * ld));
            if R == 4 {
                let pairs = [[rows_p[0], rows_p[1]], [rows_p[2], rows_p[3]]];
                block_rows::<2>(ty, esz, pairs, qm, len, om, c0);
            } else {
                for (r, &row) in rows_p.iter().enumerate() {
                    *om.add(c0 + r) = one(ty, esz, row, qm, len);
                }
            }
        }
    }
}

/// How many rows ahead `dots` and `accumulate` prefetch (as the AVX2 version).
const PREFETCH_ROWS: usize = 16;

/// See `attention::dot::dots`.
///
/// # Safety
/// As for `attention::dot::dots`, on a CPU with AVX-512 F/BW/VL, AVX2, FMA and F16C.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
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

/// 16 elements at `p` as f32, or the first `n < 16` of them (the rest zero, not read).
#[inline(always)]
unsafe fn load16(ty: ElemType, p: *const u8, n: usize) -> __m512 {
    // SAFETY: the caller guarantees `n.min(16)` elements readable at `p`; masked-off lanes are
    // not read; unaligned.
    unsafe {
        if n >= 16 {
            match ty {
                ElemType::F32 => _mm512_loadu_ps(p.cast()),
                ElemType::F16 => _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())),
            }
        } else {
            let k = tail_mask(n);
            match ty {
                ElemType::F32 => _mm512_maskz_loadu_ps(k, p.cast()),
                ElemType::F16 => _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, p.cast())),
            }
        }
    }
}

/// The mask of the first `n < 16` lanes.
#[inline(always)]
fn tail_mask(n: usize) -> __mmask16 {
    ((1u32 << n) - 1) as __mmask16
}

/// `out[i .. i + n.min(16)] = fma(w, row, out)` for `k` rows, in order.
#[inline(always)]
unsafe fn acc_step<const K: usize>(
    ty: ElemType,
    esz: usize,
    p: [*const u8; K],
    wv: [__m512; K],
    o: *mut f32,
    i: usize,
    n: usize,
) {
    // SAFETY: the caller guarantees `n.min(16)` elements readable at every row from `i` and
    // writable at `o + i`; masked lanes are neither read nor written.
    unsafe {
        if n >= 16 {
            let mut acc = _mm512_loadu_ps(o.add(i));
            for r in 0..K {
                acc = _mm512_fmadd_ps(wv[r], load16(ty, p[r].add(i * esz), 16), acc);
            }
            _mm512_storeu_ps(o.add(i), acc);
        } else {
            let k = tail_mask(n);
            let mut acc = _mm512_maskz_loadu_ps(k, o.add(i));
            for r in 0..K {
                acc = _mm512_fmadd_ps(wv[r], load16(ty, p[r].add(i * esz), n), acc);
            }
            _mm512_mask_storeu_ps(o.add(i), k, acc);
        }
    }
}

/// See `attention::dot::accumulate`.
///
/// # Safety
/// As for `attention::dot::accumulate`, on a CPU with AVX-512 F/BW/VL, AVX2, FMA and F16C.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(crate) unsafe fn accumulate(rows: Rows, idx: &[u32], w: &[f32], out: &mut [f32]) {
    let h = out.len();
    let esz = rows.ty.size();
    let o = out.as_mut_ptr();
    // SAFETY: the caller guarantees every listed row is readable over `h` elements and `out`
    // is `h` long; every access stays below `h` (the last step masked).
    unsafe {
        let mut c = 0;
        // Four rows per pass over `out`: per element the same fused multiply-adds in the same
        // order as one row at a time.
        while c + 4 <= idx.len() {
            let p: [*const u8; 4] = std::array::from_fn(|r| rows.at(idx[c + r] as usize, 0));
            for &j in idx.iter().skip(c + PREFETCH_ROWS).take(4) {
                prefetch(rows.at(j as usize, 0), h * esz);
            }
            let wv: [__m512; 4] = std::array::from_fn(|r| _mm512_set1_ps(w[c + r]));
            let mut i = 0;
            while i < h {
                acc_step::<4>(rows.ty, esz, p, wv, o, i, h - i);
                i += 16;
            }
            c += 4;
        }
        while c < idx.len() {
            let p = [rows.at(idx[c] as usize, 0)];
            let wv = [_mm512_set1_ps(w[c])];
            let mut i = 0;
            while i < h {
                acc_step::<1>(rows.ty, esz, p, wv, o, i, h - i);
                i += 16;
            }
            c += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::arch::{generic, table, Isa};
    use crate::attention::dot::{Queries, Rows, Scores};
    use crate::attention::layout::ElemType;

    /// Every blocking of this file (queries by 8, 4, 2 and alone; rows by 4 and alone; dims
    /// with and without leftovers; output lengths with a masked tail) gives the generic
    /// version's bits, for f16 and f32 rows.
    #[test]
    fn every_blocking_equals_the_generic_version_bit_for_bit() {
        let Some(k) = table(Isa::Avx512) else {
            return;
        };
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 40) as f32 / (1u64 << 24) as f32 * 4.0 - 2.0
        };
        for (ty, esz) in [(ElemType::F16, 2usize), (ElemType::F32, 4)] {
            for len in [1usize, 7, 8, 16, 23, 128, 131] {
                let (dim0, n_rows) = (2, 13);
                let row_len = dim0 + len + 1;
                let data: Vec<f32> = (0..row_len * n_rows).map(|_| next()).collect();
                let bytes: Vec<u8> = match ty {
                    ElemType::F16 => data
                        .iter()
                        .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
                        .collect(),
                    ElemType::F32 => data.iter().flat_map(|x| x.to_le_bytes()).collect(),
                };
                let rows = Rows {
                    base: bytes.as_ptr(),
                    ty,
                    elem_stride: esz,
                    row_stride: row_len * esz,
                };
                for n_idx in [1usize, 3, 4, 5, 9, 12] {
                    let idx: Vec<u32> = (0..n_idx as u32).map(|c| (c * 5 + 1) % 13).collect();
                    for n_q in [1usize, 2, 3, 4, 5, 6, 7, 8, 9, 11, 16, 19] {
                        let stride = len + 3;
                        let q: Vec<f32> = (0..n_q * stride).map(|_| next()).collect();
                        let ld = n_idx + 2;
                        let score = |f: crate::arch::AttnDotsFn| {
                            let mut out = vec![f32::NAN; n_q * ld];
                            let queries = Queries {
                                q: &q,
                                stride,
                                n: n_q,
                            };
                            let scores = Scores { out: &mut out, ld };
                            // SAFETY: every listed row holds dims dim0..dim0+len; q holds n_q
                            // queries at `stride`, out n_q rows of `ld`; AVX-512 detected.
                            unsafe { f(rows, dim0..dim0 + len, &idx, queries, scores) };
                            out
                        };
                        let (want, got) = (score(generic::KERNELS.attn_dots), score(k.attn_dots));
                        let same = want
                            .iter()
                            .zip(&got)
                            .all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(same, "{ty:?} len {len} rows {n_idx} queries {n_q}");
                    }
                    for h in [len, row_len] {
                        let w: Vec<f32> = (0..n_idx).map(|_| next()).collect();
                        let init: Vec<f32> = (0..h).map(|_| next()).collect();
                        let acc = |f: crate::arch::AttnAccumulateFn| {
                            let mut out = init.clone();
                            // SAFETY: every listed row holds `row_len >= h` elements.
                            unsafe { f(rows, &idx, &w, &mut out) };
                            out
                        };
                        let want = acc(generic::KERNELS.attn_accumulate);
                        let got = acc(k.attn_accumulate);
                        let same = want
                            .iter()
                            .zip(&got)
                            .all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(same, "{ty:?} accumulate h {h} rows {n_idx}");
                    }
                }
            }
        }
    }
}
