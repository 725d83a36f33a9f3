//! Dot products of f32 queries with cache rows (f16 or f32), and accumulation of weighted cache
//! rows: the inner loops of the sparse attention kernel.
//!
//! Every (row, query) pair is accumulated the same way whatever the blocking: one 8-lane
//! accumulator over the dims in order, a fixed lane-reduction tree, then the leftover dims in
//! order. Results are therefore bit-identical however rows and queries are grouped, which keeps
//! the kernel's output independent of thread count and batch composition.

use super::layout::ElemType;
use crate::arch::{generic::attention as generic, Kernels};
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
    pub(crate) fn at(&self, j: usize, i: usize) -> *const u8 {
        self.base
            .wrapping_add(j * self.row_stride + i * self.elem_stride)
    }

    /// True when the elements of a row are adjacent (the SIMD fast paths apply).
    pub(crate) fn is_dense(&self) -> bool {
        self.elem_stride == self.ty.size()
    }
}

/// Reads one element as f32.
///
/// # Safety
/// `p` must be valid for a read of one element of type `ty`.
#[inline(always)]
pub(crate) unsafe fn load1(ty: ElemType, p: *const u8) -> f32 {
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
    k: &Kernels,
    rows: Rows,
    dims: Range<usize>,
    rows_idx: &[u32],
    q: Queries<'_>,
    out: Scores<'_>,
) {
    let (len, n_q) = (dims.len(), q.n);
    debug_assert!(n_q == 0 || q.q.len() >= (n_q - 1) * q.stride + len);
    debug_assert!(n_q == 0 || out.out.len() >= (n_q - 1) * out.ld + rows_idx.len());
    // SAFETY: the table's CPU features were detected; the caller's contract covers every
    // address the kernels read or write.
    unsafe {
        if rows.is_dense() {
            (k.attn_dots)(rows, dims, rows_idx, q, out)
        } else {
            generic::dots(rows, dims, rows_idx, q, out)
        }
    }
}

/// The lane-reduction tree shared by every path: `((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7))`.
#[inline(always)]
pub(crate) fn reduce8(a: &[f32; 8]) -> f32 {
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
    k: &Kernels,
    rows: Rows,
    rows_idx: &[u32],
    w: &[f32],
    out: &mut [f32],
) {
    debug_assert_eq!(w.len(), rows_idx.len());
    // SAFETY: the table's CPU features were detected; addresses per the contract.
    unsafe {
        if rows.is_dense() {
            (k.attn_accumulate)(rows, rows_idx, w, out)
        } else {
            generic::accumulate(rows, rows_idx, w, out)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::{table, Isa};

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

    /// Dots and accumulation of every table the CPU has agree with the generic ones bit for bit
    /// (the generic path uses `mul_add` where the SIMD ones use FMA, in the same order) and with
    /// an f64 evaluation.
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
                for isa in Isa::available() {
                    let k = table(isa).unwrap();
                    let mut out = vec![0f32; n_q * 10];
                    // SAFETY: rows cover dims dim0..dim0+len of 11 rows; q and out sized above.
                    unsafe {
                        dots(
                            k,
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
                for out in &outs[1..] {
                    assert_eq!(
                        &outs[0], out,
                        "generic and SIMD dots differ ({ty:?}, len {len})"
                    );
                }

                let w: Vec<f32> = values(idx.len(), 7);
                let mut accs = Vec::new();
                for isa in Isa::available() {
                    let k = table(isa).unwrap();
                    let mut acc = vec![0.5f32; row_len];
                    // SAFETY: every listed row has row_len readable elements.
                    unsafe { accumulate(k, rows, &idx, &w, &mut acc) };
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
                for acc in &accs[1..] {
                    assert_eq!(&accs[0], acc, "generic and SIMD accumulate differ ({ty:?})");
                }
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
        for isa in Isa::available() {
            let k = table(isa).unwrap();
            let mut all = vec![0f32; 5 * n_rows];
            // SAFETY: 9 rows of 21 f16; 5 queries of 21; out 5 x 9.
            unsafe {
                dots(
                    k,
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
                            k,
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
                    assert_eq!(one[0].to_bits(), all[m * n_rows + j].to_bits(), "{isa:?}");
                }
            }
        }
    }
}
