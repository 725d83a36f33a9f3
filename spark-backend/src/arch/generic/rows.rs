//! Float rows (f32, f16, bf16 against f32 activations), portable: the references every SIMD
//! version is tested against. Safe to call with any inputs that satisfy the length contract
//! (`row` holds at least `len * element size` bytes; checked, a short row panics); `unsafe fn`
//! only to share the table's function-pointer types.
//! Rows are little-endian bytes (`&[u8]`); `n` elements are read from the start of the row.

fn f16_at(row: &[u8], i: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([row[2 * i], row[2 * i + 1]])).to_f32()
}

fn bf16_at(row: &[u8], i: usize) -> f32 {
    f32::from_bits(u32::from(u16::from_le_bytes([row[2 * i], row[2 * i + 1]])) << 16)
}

fn f32_at(row: &[u8], i: usize) -> f32 {
    f32::from_le_bytes([row[4 * i], row[4 * i + 1], row[4 * i + 2], row[4 * i + 3]])
}

/// Dot product of an f32 row with `x`.
///
/// # Safety
/// None beyond the length contract (checked: panics if `row` is short).
pub(crate) unsafe fn dot_f32(row: &[u8], x: &[f32]) -> f32 {
    x.iter().enumerate().map(|(i, &v)| f32_at(row, i) * v).sum()
}
/// Dot product of an f16 row with `x`.
///
/// # Safety
/// None beyond the length contract (checked).
pub(crate) unsafe fn dot_f16(row: &[u8], x: &[f32]) -> f32 {
    x.iter().enumerate().map(|(i, &v)| f16_at(row, i) * v).sum()
}
/// Dot product of a bf16 row with `x`.
///
/// # Safety
/// None beyond the length contract (checked).
pub(crate) unsafe fn dot_bf16(row: &[u8], x: &[f32]) -> f32 {
    x.iter()
        .enumerate()
        .map(|(i, &v)| bf16_at(row, i) * v)
        .sum()
}
/// `y += alpha * row` for an f32 row.
///
/// # Safety
/// None beyond the length contract (checked).
pub(crate) unsafe fn axpy_f32(row: &[u8], alpha: f32, y: &mut [f32]) {
    for (i, o) in y.iter_mut().enumerate() {
        *o = f32_at(row, i).mul_add(alpha, *o);
    }
}
/// `y += alpha * row` for an f16 row.
///
/// # Safety
/// None beyond the length contract (checked).
pub(crate) unsafe fn axpy_f16(row: &[u8], alpha: f32, y: &mut [f32]) {
    for (i, o) in y.iter_mut().enumerate() {
        *o = f16_at(row, i).mul_add(alpha, *o);
    }
}
/// `y += alpha * row` for a bf16 row.
///
/// # Safety
/// None beyond the length contract (checked).
pub(crate) unsafe fn axpy_bf16(row: &[u8], alpha: f32, y: &mut [f32]) {
    for (i, o) in y.iter_mut().enumerate() {
        *o = bf16_at(row, i).mul_add(alpha, *o);
    }
}
/// f16 row to f32.
///
/// # Safety
/// None beyond the length contract (checked).
pub(crate) unsafe fn f16_to_f32(row: &[u8], out: &mut [f32]) {
    for (i, o) in out.iter_mut().enumerate() {
        *o = f16_at(row, i);
    }
}
/// bf16 row to f32.
///
/// # Safety
/// None beyond the length contract (checked).
pub(crate) unsafe fn bf16_to_f32(row: &[u8], out: &mut [f32]) {
    for (i, o) in out.iter_mut().enumerate() {
        *o = bf16_at(row, i);
    }
}
