//! Dot products of f32 queries with cache rows (f16 or f32), and accumulation of weighted cache
//! rows: the inner loops of the sparse attention kernel.
//!
//! Every (row, query) pair is accumulated the same way whatever the blocking: one 8-lane
//! accumulator over the dims in order, a fixed lane-reduction tree, then the leftover dims in
//! order. Results are therefore bit-identical however rows and queries are grouped, which keeps
//! the kernel's output independent of thread count and batch composition.

use super::layout::ElemType;
use crate::isa::Isa;
use std::ops::Range;

/// A set of cache rows: row `j` starts at `base + offset(j)`, element `i` of a row at
/// `+ i * elem_stride` bytes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Rows {
    /// Address of element 0 of row 0 (before `offset`).
    pub(crate) base: *const u8,
    /// Element type.
    pub(crate) ty: ElemType,
    /// Byte stride between consecutive elements of a row.
    pub(crate) elem_stride: usize,
    /// Byte stride between consecutive rows (positions).
    pub(crate) row_stride: usize,
}

impl Rows {
    /// Address of element `i` of row `j`.
    #[inline(always)]
    fn at(&self, j: usize, i: usize) -> *const u8 {
        self.base
            .wrapping_add(j * self.row_stride + i * self.elem_stride)
    }

    /// True when the elements of a row are adjacent (the SIMD fast paths apply).
    fn is_dense(&self) -> bool {
        self.elem_stride == self.ty.size()
    }
}

/// Reads one element as f32.
///
/// # Safety
/// `p` must be valid for a read of one element of type `ty`.
#[inline(always)]
unsafe fn load1(ty: ElemType, p: *const u8) -> f32 {
    // SAFETY: the caller guarantees `p` is readable for one element; unaligned reads are used.
    unsafe {
        match ty {
            ElemType::F32 => p.cast::<f32>().read_unaligned(),
            ElemType::F16 => half::f16::from_bits(p.cast::<u16>().read_unaligned()).to_f32(),
        }
    }
}

/// `n` queries side by side: query `m` is `q[m * stride ..]` (as many values as dims scored).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Queries<'a> {
    /// The query values.
    pub(crate) q: &'a [f32],
    /// Elements between consecutive queries.
    pub(crate) stride: usize,
    /// Number of queries.
    pub(crate) n: usize,
}

/// A row-major score matrix: query `m`'s score against listed row `c` is `out[m * ld + c]`.
#[derive(Debug)]
pub(crate) struct Scores<'a> {
    /// The scores.
    pub(crate) out: &'a mut [f32],
    /// Elements between consecutive queries' scores (>= the number of listed rows).
    pub(crate) ld: usize,
}

/// For every query `m` and every listed row `rows_idx[c]`:
/// `out[m * ld + c] = sum_{i in dims} q_m[i - dims.start] * row(rows_idx[c])[i]`.
///
/// # Safety
/// Every listed row must be readable over `dims` through `rows`; `q` must hold its queries of
/// `dims.len()` values at its stride; `out` must hold `q.n` rows of `ld >= rows_idx.len()` values.
pub(crate) unsafe fn dots(
    isa: Isa,
    rows: Rows,
    dims: Range<usize>,
    rows_idx: &[u32],
    q: Queries<'_>,
    out: Scores<'_>,
) {
    let (dim0, len, n_q) = (dims.start, dims.len(), q.n);
    debug_assert!(n_q == 0 || q.q.len() >= (n_q - 1) * q.stride + len);
    debug_assert!(n_q == 0 || out.out.len() >= (n_q - 1) * out.ld + rows_idx.len());
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2 && rows.is_dense() {
        // SAFETY: Isa::Avx2 is only detected on a CPU with AVX2, FMA and F16C; the caller's
        // contract covers every address the function reads or writes.
        unsafe { avx2::dots(rows, dims, rows_idx, q, out) };
        return;
    }
    let _ = isa;
    for (c, &j) in rows_idx.iter().enumerate() {
        for m in 0..n_q {
            let qm = &q.q[m * q.stride..m * q.stride + len];
            let mut acc = [0f32; 8];
            let full = len / 8 * 8;
            for i0 in (0..full).step_by(8) {
                for l in 0..8 {
                    // SAFETY: dims below dim0 + len of listed rows are readable (contract).
                    let k = unsafe { load1(rows.ty, rows.at(j as usize, dim0 + i0 + l)) };
                    acc[l] = qm[i0 + l].mul_add(k, acc[l]);
                }
            }
            let mut s = reduce8(&acc);
            for (i, &qv) in qm.iter().enumerate().skip(full) {
                // SAFETY: as above.
                let k = unsafe { load1(rows.ty, rows.at(j as usize, dim0 + i)) };
                s = qv.mul_add(k, s);
            }
            out.out[m * out.ld + c] = s;
        }
    }
}

/// The lane-reduction tree shared by every path: `((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7))`.
#[inline(always)]
fn reduce8(a: &[f32; 8]) -> f32 {
    let s4 = [a[0] + a[4], a[1] + a[5], a[2] + a[6], a[3] + a[7]];
    let s2 = [s4[0] + s4[2], s4[1] + s4[3]];
    s2[0] + s2[1]
}

/// `out[i] += sum_c w[c] * row(rows_idx[c])[i]` for `i < out.len()`, rows in list order (each
/// row's contribution is one fused multiply-add per element).
///
/// # Safety
/// Every listed row must be readable over dims `0 .. out.len()` through `rows`; `w.len() ==
/// rows_idx.len()`.
pub(crate) unsafe fn accumulate(
    isa: Isa,
    rows: Rows,
    rows_idx: &[u32],
    w: &[f32],
    out: &mut [f32],
) {
    debug_assert_eq!(w.len(), rows_idx.len());
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2 && rows.is_dense() {
        // SAFETY: Isa::Avx2 is only detected on a CPU with AVX2, FMA and F16C; addresses per
        // the contract.
        unsafe { avx2::accumulate(rows, rows_idx, w, out) };
        return;
    }
    let _ = isa;
    // Dim-outer order: for a transposed cache (large elem_stride, small row_stride) this walks
    // each dim's positions in address order. Per element the sum order is the list order.
    for (i, o) in out.iter_mut().enumerate() {
        let mut acc = *o;
        for (&j, &wc) in rows_idx.iter().zip(w) {
            // SAFETY: dims below out.len() of listed rows are readable (contract).
            let v = unsafe { load1(rows.ty, rows.at(j as usize, i)) };
            acc = wc.mul_add(v, acc);
        }
        *o = acc;
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    //! AVX2 + FMA + F16C implementations. Callers check the CPU features first.

    use super::{reduce8, ElemType, Queries, Rows, Scores};
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
                        let k = super::load1(ty, rows_p[r].add(t * esz));
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
        let rows_p: [*const u8; R] =
            std::array::from_fn(|r| rows.at(idx[c0 + r] as usize, dims.start));
        let qp = q.q.as_ptr();
        let op = out.out.as_mut_ptr();
        let mut m = 0;
        // SAFETY: the caller's contract (see `super::dots`) covers these rows, queries and outputs.
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

    /// Prefetches the cache lines of `[p, p + bytes)`.
    #[inline(always)]
    fn prefetch_span(p: *const u8, bytes: usize) {
        let mut off = 0;
        while off < bytes {
            // SAFETY: prefetch is a hint; it never faults, whatever the address.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(off).cast()) };
            off += 64;
        }
    }

    /// See `super::dots`.
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
        // SAFETY: forwarded contract of `super::dots`; prefetches only hint listed rows.
        unsafe {
            while c + 4 <= idx.len() {
                // Cache rows are far apart (a whole KV row per position): fetch the rows of a
                // later block ahead of use, every line of their scored dims.
                for &j in idx.iter().skip(c + PREFETCH_ROWS).take(4) {
                    prefetch_span(rows.at(j as usize, dim0), bytes);
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

    /// See `super::accumulate`.
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
                    prefetch_span(rows.at(j as usize, 0), h * esz);
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
                        acc = w[c + r].mul_add(super::load1(rows.ty, p[r].add(t * esz)), acc);
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
                    *o.add(t) = w[c].mul_add(super::load1(rows.ty, p.add(t * esz)), *o.add(t));
                }
                c += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f16_bytes(v: &[f32]) -> Vec<u8> {
        v.iter()
            .flat_map(|&x| half::f16::from_f32(x).to_bits().to_le_bytes())
            .collect()
    }

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let h = (i as u32)
                    .wrapping_mul(2_654_435_761)
                    .wrapping_add(seed.wrapping_mul(40_503));
                ((h >> 8) % 2001) as f32 / 1000.0 - 1.0
            })
            .collect()
    }

    /// Dots and accumulation agree between the scalar and the SIMD paths (to rounding: the scalar
    /// path uses `mul_add`, as the SIMD one uses FMA, so results are identical where the CPU has
    /// FMA) and with an f64 evaluation.
    #[test]
    fn scalar_and_simd_paths_agree_with_f64() {
        for (ty, width) in [(ElemType::F16, 2usize), (ElemType::F32, 4)] {
            for len in [1usize, 6, 8, 13, 128] {
                let dim0 = 3;
                let row_len = dim0 + len + 2;
                let n_rows = 11;
                let data = values(row_len * n_rows, len as u32);
                let bytes = match ty {
                    ElemType::F16 => f16_bytes(&data),
                    ElemType::F32 => data.iter().flat_map(|x| x.to_le_bytes()).collect(),
                };
                let rows = Rows {
                    base: bytes.as_ptr(),
                    ty,
                    elem_stride: width,
                    row_stride: row_len * width,
                };
                let exact = |j: usize, i: usize| -> f64 {
                    let v = data[j * row_len + i];
                    match ty {
                        ElemType::F16 => f64::from(half::f16::from_f32(v).to_f32()),
                        ElemType::F32 => f64::from(v),
                    }
                };
                let idx: Vec<u32> = vec![0, 2, 3, 4, 5, 7, 8, 9, 10];
                let n_q = 3;
                let q = values(n_q * (len + 1), 99);
                let mut outs = Vec::new();
                for isa in [Isa::Scalar, Isa::detect()] {
                    let mut out = vec![0f32; n_q * 10];
                    // SAFETY: rows cover dims dim0..dim0+len of 11 rows; q and out sized above.
                    unsafe {
                        dots(
                            isa,
                            rows,
                            dim0..dim0 + len,
                            &idx,
                            Queries {
                                q: &q,
                                stride: len + 1,
                                n: n_q,
                            },
                            Scores {
                                out: &mut out,
                                ld: 10,
                            },
                        )
                    };
                    for m in 0..n_q {
                        for (c, &j) in idx.iter().enumerate() {
                            let want: f64 = (0..len)
                                .map(|i| {
                                    f64::from(q[m * (len + 1) + i]) * exact(j as usize, dim0 + i)
                                })
                                .sum();
                            let got = f64::from(out[m * 10 + c]);
                            assert!(
                                (got - want).abs() < 1e-5 * (1.0 + want.abs()),
                                "{ty:?} len {len}"
                            );
                        }
                    }
                    outs.push(out);
                }
                assert_eq!(
                    outs[0], outs[1],
                    "scalar and SIMD dots differ ({ty:?}, len {len})"
                );

                let w: Vec<f32> = values(idx.len(), 7);
                let mut accs = Vec::new();
                for isa in [Isa::Scalar, Isa::detect()] {
                    let mut acc = vec![0.5f32; row_len];
                    // SAFETY: every listed row has row_len readable elements.
                    unsafe { accumulate(isa, rows, &idx, &w, &mut acc) };
                    for (i, &a) in acc.iter().enumerate() {
                        let want: f64 = 0.5
                            + idx
                                .iter()
                                .zip(&w)
                                .map(|(&j, &wc)| f64::from(wc) * exact(j as usize, i))
                                .sum::<f64>();
                        assert!(
                            (f64::from(a) - want).abs() < 1e-5,
                            "{ty:?} accumulate dim {i}"
                        );
                    }
                    accs.push(acc);
                }
                assert_eq!(
                    accs[0], accs[1],
                    "scalar and SIMD accumulate differ ({ty:?})"
                );
            }
        }
    }

    /// A block of 4 rows by 2 queries gives the same bits as one row and one query at a time.
    #[test]
    fn blocking_does_not_change_results() {
        let len = 21;
        let n_rows = 9;
        let data = values(len * n_rows, 5);
        let bytes = f16_bytes(&data);
        let rows = Rows {
            base: bytes.as_ptr(),
            ty: ElemType::F16,
            elem_stride: 2,
            row_stride: len * 2,
        };
        let idx: Vec<u32> = (0..n_rows as u32).collect();
        let q = values(5 * len, 11);
        let isa = Isa::detect();
        let mut all = vec![0f32; 5 * n_rows];
        // SAFETY: 9 rows of 21 f16; 5 queries of 21; out 5 x 9.
        unsafe {
            dots(
                isa,
                rows,
                0..len,
                &idx,
                Queries {
                    q: &q,
                    stride: len,
                    n: 5,
                },
                Scores {
                    out: &mut all,
                    ld: n_rows,
                },
            )
        };
        for m in 0..5 {
            for j in 0..n_rows {
                let mut one = [0f32; 1];
                // SAFETY: one listed row, one query.
                unsafe {
                    dots(
                        isa,
                        rows,
                        0..len,
                        &[j as u32],
                        Queries {
                            q: &q[m * len..],
                            stride: len,
                            n: 1,
                        },
                        Scores {
                            out: &mut one,
                            ld: 1,
                        },
                    )
                };
                assert_eq!(one[0].to_bits(), all[m * n_rows + j].to_bits());
            }
        }
    }
}
