//! Dot products of f32 queries with cache rows (f16 or f32), and accumulation of weighted cache
//! rows: the inner loops of the sparse attention kernel.
//!
//! Every (row, query) pair is accumulated the same way whatever the blocking: one 8-lane
//! accumulator over the dims in order, a fixed lane-reduction tree, then the leftover dims in
//! order. Results are therefore bit-identical however rows and queries are grouped, which keeps
//! the kernel's output independent of thread count and batch composition.
//!
//! The types (`Rows`, `BlockRows`, `Queries`, `Scores`, `ElemType`) are `crate::kernel_types`'s;
//! which kernel runs (dense or strided rows) is the table's choice (`Kernels::attn_dots`).
//! Rows of blocks (a quantized or bf16 cache) take the table's in-place kernels where it has
//! them for the type (`Kernels::attn_block_dots`: q8_0, q4_0 on x86), else are converted to f32
//! [`STAGED_ROWS`] at a time and take the f32 kernels: the same bits either way, those of an
//! f32 cache holding the converted values.

use crate::arch::Kernels;
use crate::kernel_types::ElemType;
pub(crate) use crate::kernel_types::{BlockRows, Queries, Rows, Scores};
use crate::rows::Row;
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

/// Rows of blocks converted to f32 per step where the table reads none in place: 64 rows of
/// Gemma-2's 128 predictor dims are 32 KiB, which stay in the L1 or L2 cache between conversion
/// and use.
pub(crate) const STAGED_ROWS: usize = 64;

/// A thread's buffers for converted rows of blocks.
#[derive(Default)]
pub(crate) struct Staging {
    /// Up to [`STAGED_ROWS`] converted rows.
    buf: Vec<f32>,
    /// `0, 1, ..., STAGED_ROWS - 1`: the converted rows' indices among them.
    iota: Vec<u32>,
}

impl Staging {
    /// Converts dims `dims` of the listed rows to f32, [`STAGED_ROWS`] rows at a time, and
    /// calls `f(rows, idx, c0)` per chunk: `rows` the converted rows (dims from 0), `idx` their
    /// indices among them, `c0` the chunk's first index in `rows_idx`.
    ///
    /// # Safety
    /// Every listed row must be readable over `dims`, which start and end on block boundaries.
    unsafe fn chunks(
        &mut self,
        rows: BlockRows,
        dims: Range<usize>,
        rows_idx: &[u32],
        mut f: impl FnMut(Rows, &[u32], usize),
    ) {
        let width = dims.len();
        let bytes = rows
            .ty
            .row_bytes(width)
            .expect("dims of whole blocks (AttnLayout)");
        self.buf.resize(STAGED_ROWS * width, 0.0);
        if self.iota.len() != STAGED_ROWS {
            self.iota = (0..STAGED_ROWS as u32).collect();
        }
        for (n, chunk) in rows_idx.chunks(STAGED_ROWS).enumerate() {
            for (&j, out) in chunk.iter().zip(self.buf.chunks_exact_mut(width)) {
                // SAFETY: row j's dims `dims` are `bytes` readable bytes (contract).
                let src =
                    unsafe { std::slice::from_raw_parts(rows.at(j as usize, dims.start), bytes) };
                let row = Row::new(rows.ty, width, src).expect("whole blocks (AttnLayout)");
                crate::rows::to_f32(row, out);
            }
            let f32_rows = Rows {
                base: self.buf.as_ptr().cast(),
                ty: ElemType::F32,
                elem_stride: 4,
                row_stride: width * 4,
            };
            f(f32_rows, &self.iota[..chunk.len()], n * STAGED_ROWS);
        }
    }
}

/// [`dots`] over rows of blocks: `out[m * ld + c] = sum_{i in dims} q_m[i - dims.start] *
/// row(rows_idx[c])[i]`, each value its block's conversion to f32.
///
/// # Safety
/// As for [`dots`], with `dims` starting and ending on block boundaries.
pub(crate) unsafe fn block_dots(
    k: &Kernels,
    rows: BlockRows,
    dims: Range<usize>,
    rows_idx: &[u32],
    q: Queries<'_>,
    out: Scores<'_>,
    staging: &mut Staging,
) {
    let len = dims.len();
    debug_assert!(q.n == 0 || q.q.len() >= (q.n - 1) * q.stride + len);
    debug_assert!(q.n == 0 || out.out.len() >= (q.n - 1) * out.ld + rows_idx.len());
    if let Some(f) = k.attn_block_dots(rows.ty) {
        // SAFETY: the table's CPU features were detected; the caller's contract covers every
        // address the kernel reads or writes.
        return unsafe { f(rows, dims, rows_idx, q, out) };
    }
    let ld = out.ld;
    // SAFETY: forwarded contract; each chunk's scores are columns c0.. of `out` (ld kept).
    unsafe {
        staging.chunks(rows, dims, rows_idx, |f32_rows, idx, c0| {
            let chunk_out = Scores {
                out: &mut out.out[c0..],
                ld,
            };
            dots(k, f32_rows, 0..len, idx, q, chunk_out)
        })
    }
}

/// [`accumulate`] over rows of blocks, each value its block's conversion to f32.
///
/// # Safety
/// As for [`accumulate`], with `out.len()` whole blocks.
pub(crate) unsafe fn block_accumulate(
    k: &Kernels,
    rows: BlockRows,
    rows_idx: &[u32],
    w: &[f32],
    out: &mut [f32],
    staging: &mut Staging,
) {
    debug_assert_eq!(w.len(), rows_idx.len());
    if let Some(f) = k.attn_block_accumulate(rows.ty) {
        // SAFETY: the table's CPU features were detected; addresses per the contract.
        return unsafe { f(rows, rows_idx, w, out) };
    }
    let h = out.len();
    // SAFETY: forwarded contract; chunks in list order add the rows in the order of one pass.
    unsafe {
        staging.chunks(rows, 0..h, rows_idx, |f32_rows, idx, c0| {
            accumulate(k, f32_rows, idx, &w[c0..c0 + idx.len()], out)
        })
    }
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

    /// Rows of blocks (in place where a table reads the type so, converted otherwise) give
    /// every table the bits of the f32 kernels on the converted rows, in more than one chunk of
    /// converted rows.
    #[test]
    fn block_rows_give_the_bits_of_their_f32_conversion() {
        use crate::kernel_types::RowType;
        use crate::rows::quant::quantize_rows;
        let (h, n_rows) = (128usize, 150usize);
        let idx: Vec<u32> = (0..n_rows as u32).filter(|j| j % 7 != 3).collect();
        for ty in [RowType::Q8_0, RowType::Q4_0, RowType::Q5_1, RowType::Bf16] {
            let data = values(h * n_rows, 3);
            let q = quantize_rows(ty, &data, h).unwrap();
            let row_bytes = ty.row_bytes(h).unwrap();
            let mut conv = vec![0f32; h * n_rows];
            for (r, out) in q.chunks_exact(row_bytes).zip(conv.chunks_exact_mut(h)) {
                crate::rows::to_f32(Row::new(ty, h, r).unwrap(), out);
            }
            let conv_bytes: Vec<u8> = conv.iter().flat_map(|x| x.to_le_bytes()).collect();
            let f32_rows = Rows {
                base: conv_bytes.as_ptr(),
                ty: ElemType::F32,
                elem_stride: 4,
                row_stride: h * 4,
            };
            let block_rows = BlockRows {
                base: q.as_ptr(),
                ty,
                row_stride: row_bytes,
            };
            let n_q = 3;
            let qv = values(n_q * h, 8);
            let w = values(idx.len(), 9);
            for isa in Isa::available() {
                let k = table(isa).unwrap();
                for dims in [0..h, 32..h, 0..64] {
                    let (mut want, mut got) =
                        (vec![0f32; n_q * idx.len()], vec![0f32; n_q * idx.len()]);
                    let queries = Queries {
                        q: &qv,
                        stride: h,
                        n: n_q,
                    };
                    // SAFETY: 150 rows of h values in both layouts; queries and scores sized.
                    unsafe {
                        dots(
                            k,
                            f32_rows,
                            dims.clone(),
                            &idx,
                            queries,
                            Scores {
                                out: &mut want,
                                ld: idx.len(),
                            },
                        );
                        block_dots(
                            k,
                            block_rows,
                            dims.clone(),
                            &idx,
                            queries,
                            Scores {
                                out: &mut got,
                                ld: idx.len(),
                            },
                            &mut Staging::default(),
                        );
                    }
                    assert!(
                        want.iter()
                            .zip(&got)
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{isa:?} {ty:?} dims {dims:?}: block dots differ from the f32 ones"
                    );
                }
                let (mut want, mut got) = (vec![0.25f32; h], vec![0.25f32; h]);
                // SAFETY: every listed row has h values; w one per listed row.
                unsafe {
                    accumulate(k, f32_rows, &idx, &w, &mut want);
                    block_accumulate(k, block_rows, &idx, &w, &mut got, &mut Staging::default());
                }
                assert!(
                    want.iter()
                        .zip(&got)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{isa:?} {ty:?}: block accumulation differs from the f32 one"
                );
            }
        }
    }
}
