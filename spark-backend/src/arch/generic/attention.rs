//! Attention's dot products and value accumulation, portable: one 8-lane accumulator over the
//! dims in order, the fixed reduction tree of `attention::dot`, then the leftover dims, for any
//! element stride (the path for transposed caches on every table).

use crate::kernel_types::{load1, reduce8, Queries, Rows, Scores};
use std::ops::Range;

/// See `attention::dot::dots`.
///
/// # Safety
/// As for `attention::dot::dots`.
pub(crate) unsafe fn dots(
    rows: Rows,
    dims: Range<usize>,
    rows_idx: &[u32],
    q: Queries<'_>,
    out: Scores<'_>,
) {
    let (dim0, len, n_q) = (dims.start, dims.len(), q.n);
    debug_assert!(n_q == 0 || q.q.len() >= (n_q - 1) * q.stride + len);
    debug_assert!(n_q == 0 || out.out.len() >= (n_q - 1) * out.ld + rows_idx.len());
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

/// See `attention::dot::accumulate`.
///
/// # Safety
/// As for `attention::dot::accumulate`.
pub(crate) unsafe fn accumulate(rows: Rows, rows_idx: &[u32], w: &[f32], out: &mut [f32]) {
    debug_assert_eq!(w.len(), rows_idx.len());
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
