//! Dot products of f32 queries with cache rows (f16 or f32), and accumulation of weighted cache
//! rows: the inner loops of the sparse attention kernel.
//!
//! Every (row, query) pair is accumulated the same way whatever the blocking: one 8-lane
//! accumulator over the dims in order, a fixed lane-reduction tree, then the leftover dims in
//! order. Results are therefore bit-identical however rows and queries are grouped, which keeps
//! the kernel's output independent of thread count and batch composition.
//!
//! The types (`Rows`, `Queries`, `Scores`, `ElemType`) are `crate::kernel_types`'s; which
//! kernel runs (dense or strided rows) is the table's choice (`Kernels::attn_dots`).

use crate::arch::Kernels;
pub(crate) use crate::kernel_types::{Queries, Rows, Scores};
use std::ops::Range;

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
    unsafe { (k.attn_dots(&rows))(rows, dims, rows_idx, q, out) }
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
    unsafe { (k.attn_accumulate(&rows))(rows, rows_idx, w, out) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::{table, Isa};
    use crate::kernel_types::ElemType;

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
