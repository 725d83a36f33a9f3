//! Rows of a weight matrix in a ggml storage type, and the two operations the sparse kernels
//! need on them: `dot(row, x)` and `axpy(row, alpha, y)` (`y += alpha * row`).
//!
//! Every type ggml can dequantize is a [`RowType`] (every id with a `to_float` in ggml's type
//! traits, plus f32); the rest (the activation-only q8_1 / q8_K, the integer types, f64) are
//! refused by [`RowType::from_ggml`]. Block layouts (elements and bytes per block) are ggml's
//! own (`ggml_blck_size`, `ggml_type_size`), read once per process ([`RowType::block_elems`]).
//!
//! Which kernel runs for a row is the process's table's choice (`crate::arch`, one table per
//! instruction set; its lookups `Kernels::dot`, `axpy`, `f32_conversion`, `axpy4`, `axpy_folded` are
//! exhaustive matches on the row type). Float rows (f32, f16, bf16) get the table's own kernels
//! against an f32 activation. Every block-quantized type (q4_0 ... q6_K, the IQ family,
//! tq1_0 / tq2_0, mxfp4, nvfp4, q1_0 / q2_0) gets ggml's type traits (`arch::generic::ggml`):
//! the activation is quantized once to the type's `vec_dot_type` ([`Activation::prepare`]),
//! then each row costs one ggml `vec_dot` (the code ggml's own `mul_mat` runs for that type);
//! `axpy` dequantizes with ggml's `to_float` in chunks into a per-call stack buffer, then runs
//! the table's f32 axpy ([`to_f32`]: `to_float` straight into its output). q8_0, q4_0 and q6_K
//! have their own axpy and dequantization kernels in every table, bit-identical to that
//! generic path. There is no per-element branching on type: each call dispatches once per row.
//! [`quant`] quantizes f32 rows to a type (for tests and the synthetic models). [`paging`] reads
//! the rows of a model larger than memory from storage as they are chosen; [`budget`] weighs a
//! model's weights against the memory left at load.

pub mod budget;
pub mod paging;
pub mod quant;

use crate::arch::generic::ggml;
use crate::arch::{AxpyKernel, DotKernel, ToF32Kernel};
use crate::KernelError;

pub use crate::kernel_types::{RowType, Start};

/// One row: `n` elements of type `ty` in `bytes` (exactly `ty.row_bytes(n)` bytes).
#[derive(Debug, Clone, Copy)]
pub struct Row<'a> {
    ty: RowType,
    n: usize,
    bytes: &'a [u8],
}

impl<'a> Row<'a> {
    /// A row over `bytes`; errors when `n` is not whole blocks or `bytes` is too short.
    pub fn new(ty: RowType, n: usize, bytes: &'a [u8]) -> Result<Self, KernelError> {
        let need = ty.row_bytes(n).ok_or_else(|| {
            KernelError::Shape(format!(
                "row of {n} elements is not whole {} blocks",
                ty.name()
            ))
        })?;
        let bytes = bytes.get(..need).ok_or_else(|| {
            KernelError::Shape(format!("row needs {need} bytes, has {}", bytes.len()))
        })?;
        Ok(Self { ty, n, bytes })
    }

    /// The raw bytes.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// Elements `start..end`; both must be multiples of the block size (panics otherwise:
    /// callers derive ranges from [`RowType::block_elems`]).
    pub fn slice(&self, start: usize, end: usize) -> Row<'a> {
        let b = self.ty.block_elems();
        assert!(
            start.is_multiple_of(b) && end.is_multiple_of(b) && start <= end && end <= self.n,
            "bad row slice"
        );
        let per = self.ty.block_bytes();
        Row {
            ty: self.ty,
            n: end - start,
            bytes: &self.bytes[start / b * per..end / b * per],
        }
    }
}

/// A matrix of `n_rows` rows of `n_cols` elements, row `j` starting at byte `j * stride`.
#[derive(Debug, Clone, Copy)]
pub struct RowMatrix<'a> {
    ty: RowType,
    n_cols: usize,
    n_rows: usize,
    stride: usize,
    /// Bytes of one row (`ty.row_bytes(n_cols)`).
    row_len: usize,
    data: &'a [u8],
}

impl<'a> RowMatrix<'a> {
    /// A matrix over `data`; checks that every row lies inside it.
    pub fn new(
        ty: RowType,
        n_cols: usize,
        n_rows: usize,
        stride: usize,
        data: &'a [u8],
    ) -> Result<Self, KernelError> {
        let row = ty.row_bytes(n_cols).ok_or_else(|| {
            KernelError::Shape(format!(
                "{n_cols} columns are not whole {} blocks",
                ty.name()
            ))
        })?;
        if n_rows > 0 {
            if stride < row {
                return Err(KernelError::Shape(format!(
                    "row stride {stride} < row size {row}"
                )));
            }
            let need = (n_rows - 1)
                .checked_mul(stride)
                .and_then(|v| v.checked_add(row))
                .ok_or_else(|| KernelError::Shape("matrix size overflows".into()))?;
            if data.len() < need {
                return Err(KernelError::Shape(format!(
                    "matrix needs {need} bytes, has {}",
                    data.len()
                )));
            }
        }
        Ok(Self {
            ty,
            n_cols,
            n_rows,
            stride,
            row_len: row,
            data,
        })
    }

    /// A densely packed matrix (stride = row size).
    pub fn packed(
        ty: RowType,
        n_cols: usize,
        n_rows: usize,
        data: &'a [u8],
    ) -> Result<Self, KernelError> {
        let stride = ty.row_bytes(n_cols).unwrap_or(0);
        Self::new(ty, n_cols, n_rows, stride, data)
    }

    /// Storage type.
    pub(crate) fn ty(&self) -> RowType {
        self.ty
    }

    /// Elements per row.
    pub(crate) fn n_cols(&self) -> usize {
        self.n_cols
    }

    /// Number of rows.
    pub(crate) fn n_rows(&self) -> usize {
        self.n_rows
    }

    /// Row `j` (panics when `j >= n_rows`).
    #[inline]
    pub fn row(&self, j: usize) -> Row<'a> {
        assert!(j < self.n_rows, "row {j} out of {}", self.n_rows);
        let start = j * self.stride;
        Row {
            ty: self.ty,
            n: self.n_cols,
            bytes: &self.data[start..start + self.row_len],
        }
    }

    /// Address of row `j`'s first byte (for prefetching; `j` need not be in range).
    #[inline]
    pub(crate) fn row_ptr(&self, j: usize) -> *const u8 {
        self.data.as_ptr().wrapping_add(j.wrapping_mul(self.stride))
    }
}

/// An f32 activation prepared for dot products with rows of one type: kept as f32 for float
/// rows, quantized to ggml's `vec_dot_type` for quantized rows. Reusable across tokens.
#[derive(Debug, Clone, Default)]
pub struct Activation {
    ty: Option<RowType>,
    n: usize,
    f32s: Vec<f32>,
    quant: Vec<u8>,
}

impl Activation {
    /// An empty activation (prepare it before use).
    pub fn new() -> Self {
        Self::default()
    }

    /// Prepares `x` for rows of type `ty`. For quantized types `x.len()` must be whole blocks.
    pub fn prepare(&mut self, ty: RowType, x: &[f32]) -> Result<(), KernelError> {
        self.ty = Some(ty);
        self.n = x.len();
        if ty.is_quantized() {
            ggml::quantize_activation(ty, x, &mut self.quant)?;
        } else {
            self.f32s.clear();
            self.f32s.extend_from_slice(x);
        }
        Ok(())
    }
}

/// `row . x`. Panics when `x` was prepared for another type or length (a programming error in
/// the caller; the ops validate shapes before calling).
#[inline]
pub fn dot(row: Row<'_>, x: &Activation) -> f32 {
    assert!(
        x.ty == Some(row.ty) && x.n == row.n,
        "activation prepared for another row"
    );
    // SAFETY: `kernels()` only returns SIMD functions whose CPU features were detected; the
    // row holds `row.n` elements (checked at construction) and `x` has the same length, as f32
    // or quantized for this type (prepared for it: asserted above).
    unsafe {
        match crate::arch::kernels().dot(row.ty) {
            DotKernel::F32Activation(f) => f(row.bytes, &x.f32s),
            DotKernel::GgmlVecDot => ggml::vec_dot(row.ty, row.n, row.bytes, &x.quant),
        }
    }
}

/// `y += alpha * row`; `y.len()` must equal `row.len()`.
#[inline]
pub fn axpy(row: Row<'_>, alpha: f32, y: &mut [f32]) {
    assert_eq!(
        y.len(),
        row.n,
        "axpy: output length differs from row length"
    );
    // SAFETY: as in `dot`; `y` has exactly `row.n` elements.
    unsafe {
        match crate::arch::kernels().axpy(row.ty) {
            AxpyKernel::Own(f) => f(row.bytes, alpha, y),
            AxpyKernel::GgmlToFloatThen(axpy_f32) => {
                ggml::axpy_via_ggml(row.ty, row.bytes, alpha, y, axpy_f32)
            }
        }
    }
}

/// `y += alphas[0] * rows[0] + ... + alphas[3] * rows[3]`, bit-identical to four [`axpy`]
/// calls in order but in one pass over `y` where the table has a kernel for the rows' type.
#[inline]
pub fn axpy4(rows: [Row<'_>; 4], alphas: [f32; 4], y: &mut [f32]) {
    let ty = rows[0].ty;
    if rows.iter().all(|r| r.ty == ty && r.n == y.len()) {
        if let Some(f) = crate::arch::kernels().axpy4(ty) {
            // SAFETY: the table's CPU features were detected; every row holds y.len() elements
            // of the kernel's type (checked at construction and above), checked again inside.
            return unsafe { f(rows.map(|r| r.bytes), alphas, y) };
        }
    }
    for (row, alpha) in rows.into_iter().zip(alphas) {
        axpy(row, alpha, y);
    }
}

/// `y = y + alphas[0] * rows[0] + ...` (up to four rows, in order; from zero with
/// [`Start::Zero`]) in the sparse FFN's fused arithmetic: q8_0 rows fold each block's scale
/// into the row's coefficient (per block `c = alpha * d` rounded to f32, then `y = fma(q, c, y)`
/// per weight), in one pass over `y` where the table has a kernel for it, bit for bit the
/// generic version. Rows of other types get exactly [`axpy`]. The q8_0 result differs from
/// [`axpy`]'s (where `d * q` is exact and the FMA rounds once) by `c`'s rounding, a relative
/// 2^-24 per term.
#[inline]
pub fn axpy_folded(rows: &[Row<'_>], alphas: &[f32], y: &mut [f32], start: Start) {
    assert!(
        rows.len() == alphas.len() && rows.len() <= 4,
        "axpy_folded: up to four rows, one coefficient each"
    );
    assert!(
        rows.iter().all(|r| r.n == y.len()),
        "axpy_folded: output length differs from row length"
    );
    let folded = rows
        .first()
        .filter(|first| rows.iter().all(|r| r.ty == first.ty))
        .and_then(|first| crate::arch::kernels().axpy_folded(first.ty));
    if let Some(f) = folded {
        let bytes: [&[u8]; 4] = std::array::from_fn(|i| rows.get(i).map_or(&[][..], |r| r.bytes));
        // SAFETY: the table's CPU features were detected; every row holds y.len() elements of
        // the kernel's type (checked at construction and above), checked again inside.
        return unsafe { f(&bytes[..rows.len()], alphas, y, start) };
    }
    if start == Start::Zero {
        y.fill(0.0);
    }
    for (row, &alpha) in rows.iter().zip(alphas) {
        axpy(*row, alpha, y);
    }
}

/// `out = row` as f32; `out.len()` must equal `row.len()`.
#[inline]
pub fn to_f32(row: Row<'_>, out: &mut [f32]) {
    assert_eq!(
        out.len(),
        row.n,
        "to_f32: output length differs from row length"
    );
    // SAFETY: as in `dot`; `out` has exactly `row.n` elements.
    unsafe {
        match crate::arch::kernels().f32_conversion(row.ty) {
            ToF32Kernel::Copy => {
                for (o, c) in out.iter_mut().zip(row.bytes.chunks_exact(4)) {
                    *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                }
            }
            ToF32Kernel::Own(f) => f(row.bytes, out),
            ToF32Kernel::GgmlToFloat => ggml::dequantize_ggml(row.ty, row.bytes, out),
        }
    }
}

/// `y += alpha * x` on f32 slices of equal length (SIMD).
#[inline]
pub fn axpy_f32(x: &[f32], alpha: f32, y: &mut [f32]) {
    assert_eq!(x.len(), y.len(), "axpy_f32: lengths differ");
    let bytes: &[u8] = f32_bytes(x);
    // SAFETY: `bytes` views exactly `x.len()` f32 values; features checked by `kernels()`.
    unsafe { (crate::arch::kernels().axpy_f32)(bytes, alpha, y) }
}

/// The bytes of an f32 slice.
pub fn f32_bytes(x: &[f32]) -> &[u8] {
    // SAFETY: f32 has no padding and any byte pattern is a valid u8; the length in bytes is
    // 4 * len and the lifetime is tied to `x`.
    unsafe { std::slice::from_raw_parts(x.as_ptr().cast::<u8>(), std::mem::size_of_val(x)) }
}
