//! Quantized rows (q8_0, q4_0, q6_K), portable: ggml's own `to_float` followed by the generic
//! f32 axpy, and the folded q8_0 axpy's scalar arithmetic. The references the SIMD versions
//! equal bit for bit.

use super::ggml::{axpy_via_ggml, dequantize_ggml};
use super::rows::axpy_f32;
use crate::kernel_types::{RowType, Start};

/// `y += alpha * row`, q8_0.
///
/// # Safety
/// None beyond the length contract (checked).
pub(crate) unsafe fn axpy_q8_0(row: &[u8], alpha: f32, y: &mut [f32]) {
    // SAFETY: the generic axpy needs no CPU feature; lengths checked inside.
    unsafe { axpy_via_ggml(RowType::Q8_0, row, alpha, y, axpy_f32) }
}

/// `y += alpha * row`, q4_0.
///
/// # Safety
/// None beyond the length contract (checked).
pub(crate) unsafe fn axpy_q4_0(row: &[u8], alpha: f32, y: &mut [f32]) {
    // SAFETY: as above.
    unsafe { axpy_via_ggml(RowType::Q4_0, row, alpha, y, axpy_f32) }
}

/// `y += alpha * row`, q6_K.
///
/// # Safety
/// None beyond the length contract (checked).
pub(crate) unsafe fn axpy_q6_k(row: &[u8], alpha: f32, y: &mut [f32]) {
    // SAFETY: as above.
    unsafe { axpy_via_ggml(RowType::Q6K, row, alpha, y, axpy_f32) }
}

/// q8_0 row to f32 (ggml's `to_float`).
///
/// # Safety
/// None beyond the length contract (checked).
pub(crate) unsafe fn to_f32_q8_0(row: &[u8], out: &mut [f32]) {
    // SAFETY: lengths checked inside.
    unsafe { dequantize_ggml(RowType::Q8_0, row, out) }
}

/// q4_0 row to f32 (ggml's `to_float`).
///
/// # Safety
/// None beyond the length contract (checked).
pub(crate) unsafe fn to_f32_q4_0(row: &[u8], out: &mut [f32]) {
    // SAFETY: lengths checked inside.
    unsafe { dequantize_ggml(RowType::Q4_0, row, out) }
}

/// q6_K row to f32 (ggml's `to_float`).
///
/// # Safety
/// None beyond the length contract (checked).
pub(crate) unsafe fn to_f32_q6_k(row: &[u8], out: &mut [f32]) {
    // SAFETY: lengths checked inside.
    unsafe { dequantize_ggml(RowType::Q6K, row, out) }
}

/// Four q8_0 axpys in order.
///
/// # Safety
/// None beyond the length contract (checked).
pub(crate) unsafe fn axpy4_q8_0(rows: [&[u8]; 4], alphas: [f32; 4], y: &mut [f32]) {
    for (row, alpha) in rows.into_iter().zip(alphas) {
        // SAFETY: as above.
        unsafe { axpy_q8_0(row, alpha, y) };
    }
}

/// `y = y + alphas[0] * rows[0] + ...` (from zero with [`Start::Zero`]) for up to four q8_0
/// rows of `y.len()` elements (a multiple of 32), row by row in the folded arithmetic of
/// `rows::axpy_folded`: per block `c = alpha * d` rounded to f32, then `y = fma(q, c, y)` per
/// weight.
///
/// # Safety
/// None beyond the length contract (checked).
pub(crate) unsafe fn axpy_q8_0_folded(rows: &[&[u8]], alphas: &[f32], y: &mut [f32], start: Start) {
    if start == Start::Zero {
        y.fill(0.0);
    }
    for (row, &alpha) in rows.iter().zip(alphas) {
        axpy_q8_0_folded_row(row, alpha, y);
    }
}

/// One row of [`axpy_q8_0_folded`].
fn axpy_q8_0_folded_row(row: &[u8], alpha: f32, y: &mut [f32]) {
    let per = RowType::Q8_0.block_bytes();
    let be = RowType::Q8_0.block_elems();
    assert!(
        y.len().is_multiple_of(be) && row.len() >= y.len() / be * per,
        "short quantized row"
    );
    for (block, yb) in row.chunks_exact(per).zip(y.chunks_exact_mut(be)) {
        let d = half::f16::from_le_bytes([block[0], block[1]]).to_f32();
        let c = alpha * d;
        for (yi, &q) in yb.iter_mut().zip(&block[2..]) {
            *yi = f32::from(q as i8).mul_add(c, *yi);
        }
    }
}
