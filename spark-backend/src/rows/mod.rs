//! Rows of a weight matrix in a ggml storage type, and the two operations the sparse kernels
//! need on them: `dot(row, x)` and `axpy(row, alpha, y)` (`y += alpha * row`).
//!
//! Every type ggml can dequantize is a [`RowType`] (every id with a `to_float` in ggml's type
//! traits, plus f32); the rest (the activation-only q8_1 / q8_K, the integer types, f64) are
//! refused by [`RowType::from_ggml`]. Block layouts (elements and bytes per block) are ggml's
//! own (`ggml_blck_size`, `ggml_type_size`), read once per process ([`RowType::block_elems`]).
//!
//! Float rows (f32, f16, bf16) use this crate's own SIMD kernels (the process's table of
//! `crate::arch`, one per instruction set) against an f32 activation. Every block-quantized type (q4_0 ... q6_K, the IQ family, tq1_0 / tq2_0, mxfp4,
//! nvfp4, q1_0 / q2_0) goes through ggml's type traits ([`quant`], one table entry per type,
//! loaded once): the activation is quantized once to the type's `vec_dot_type`
//! ([`Activation::prepare`]), then each row costs one ggml `vec_dot` (the code ggml's own
//! `mul_mat` runs for that type); `axpy` dequantizes with ggml's `to_float` in chunks into a
//! per-call stack buffer, then runs the SIMD f32 axpy ([`to_f32`]: `to_float` straight into its
//! output). q8_0, q4_0 and q6_K have fused axpy and dequantization kernels per
//! instruction set (`crate::arch`), bit-identical to that generic path. There is no per-element branching on
//! type: each call dispatches once per row.

pub mod quant;

use crate::KernelError;
use llama_cpp_sys_2 as sys;
use std::sync::OnceLock;

/// A weight storage type the kernels support: every type ggml can dequantize. The variants are
/// declared in [`RowType::ALL`]'s order (their discriminant is their index there).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RowType {
    /// `GGML_TYPE_F32`.
    F32,
    /// `GGML_TYPE_F16`.
    F16,
    /// `GGML_TYPE_BF16`.
    Bf16,
    /// `GGML_TYPE_Q8_0`: blocks of 32.
    Q8_0,
    /// `GGML_TYPE_Q4_0`: blocks of 32.
    Q4_0,
    /// `GGML_TYPE_Q4_1`: blocks of 32.
    Q4_1,
    /// `GGML_TYPE_Q5_0`: blocks of 32 (llama.cpp's fallback for q4_K on rows that are not
    /// whole 256-blocks).
    Q5_0,
    /// `GGML_TYPE_Q5_1`: blocks of 32 (the fallback for q5_K).
    Q5_1,
    /// `GGML_TYPE_Q2_K`: blocks of 256.
    Q2K,
    /// `GGML_TYPE_Q3_K`: blocks of 256.
    Q3K,
    /// `GGML_TYPE_Q4_K`: blocks of 256.
    Q4K,
    /// `GGML_TYPE_Q5_K`: blocks of 256.
    Q5K,
    /// `GGML_TYPE_Q6_K`: blocks of 256.
    Q6K,
    /// `GGML_TYPE_IQ2_XXS`: blocks of 256 (quantizing needs an importance matrix).
    Iq2Xxs,
    /// `GGML_TYPE_IQ2_XS`: blocks of 256 (quantizing needs an importance matrix).
    Iq2Xs,
    /// `GGML_TYPE_IQ2_S`: blocks of 256.
    Iq2S,
    /// `GGML_TYPE_IQ3_XXS`: blocks of 256.
    Iq3Xxs,
    /// `GGML_TYPE_IQ3_S`: blocks of 256.
    Iq3S,
    /// `GGML_TYPE_IQ1_S`: blocks of 256 (quantizing needs an importance matrix).
    Iq1S,
    /// `GGML_TYPE_IQ1_M`: blocks of 256.
    Iq1M,
    /// `GGML_TYPE_IQ4_NL`: blocks of 32 (llama.cpp's fallback for iq4_xs, and for the 2- and
    /// 3-bit IQ types, on rows that are not whole 256-blocks).
    Iq4Nl,
    /// `GGML_TYPE_IQ4_XS`: blocks of 256.
    Iq4Xs,
    /// `GGML_TYPE_TQ1_0`: ternary, blocks of 256.
    Tq1_0,
    /// `GGML_TYPE_TQ2_0`: ternary, blocks of 256.
    Tq2_0,
    /// `GGML_TYPE_MXFP4`: blocks of 32.
    Mxfp4,
    /// `GGML_TYPE_NVFP4`: blocks of 64.
    Nvfp4,
    /// `GGML_TYPE_Q1_0`: blocks of 128.
    Q1_0,
    /// `GGML_TYPE_Q2_0`: blocks of 64.
    Q2_0,
}

/// Number of [`RowType`]s.
const N_TYPES: usize = 28;

impl RowType {
    /// Every supported type, in declaration order.
    pub const ALL: [RowType; N_TYPES] = [
        RowType::F32,
        RowType::F16,
        RowType::Bf16,
        RowType::Q8_0,
        RowType::Q4_0,
        RowType::Q4_1,
        RowType::Q5_0,
        RowType::Q5_1,
        RowType::Q2K,
        RowType::Q3K,
        RowType::Q4K,
        RowType::Q5K,
        RowType::Q6K,
        RowType::Iq2Xxs,
        RowType::Iq2Xs,
        RowType::Iq2S,
        RowType::Iq3Xxs,
        RowType::Iq3S,
        RowType::Iq1S,
        RowType::Iq1M,
        RowType::Iq4Nl,
        RowType::Iq4Xs,
        RowType::Tq1_0,
        RowType::Tq2_0,
        RowType::Mxfp4,
        RowType::Nvfp4,
        RowType::Q1_0,
        RowType::Q2_0,
    ];

    /// Position in [`RowType::ALL`] (for per-type tables).
    #[inline]
    pub(crate) const fn index(self) -> usize {
        self as usize
    }

    /// Every block-quantized type (those that go through ggml's type traits).
    pub fn quantized() -> impl Iterator<Item = RowType> {
        Self::ALL.into_iter().filter(|t| t.is_quantized())
    }

    /// The type for a ggml type id, or `None` for an id ggml cannot dequantize (q8_1, q8_K,
    /// the integer types, f64, removed or unknown ids) or whose block layout the linked ggml
    /// does not report.
    pub fn from_ggml(ty: u32) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|t| t.ggml() == ty)
            .filter(|t| t.block_elems() > 0 && t.block_bytes() > 0)
    }

    /// The ggml type id (`GGML_TYPE_*`, from ggml's own header through the sys bindings).
    pub const fn ggml(self) -> u32 {
        match self {
            RowType::F32 => sys::GGML_TYPE_F32,
            RowType::F16 => sys::GGML_TYPE_F16,
            RowType::Q4_0 => sys::GGML_TYPE_Q4_0,
            RowType::Q4_1 => sys::GGML_TYPE_Q4_1,
            RowType::Q5_0 => sys::GGML_TYPE_Q5_0,
            RowType::Q5_1 => sys::GGML_TYPE_Q5_1,
            RowType::Q8_0 => sys::GGML_TYPE_Q8_0,
            RowType::Q2K => sys::GGML_TYPE_Q2_K,
            RowType::Q3K => sys::GGML_TYPE_Q3_K,
            RowType::Q4K => sys::GGML_TYPE_Q4_K,
            RowType::Q5K => sys::GGML_TYPE_Q5_K,
            RowType::Q6K => sys::GGML_TYPE_Q6_K,
            RowType::Bf16 => sys::GGML_TYPE_BF16,
            RowType::Iq2Xxs => sys::GGML_TYPE_IQ2_XXS,
            RowType::Iq2Xs => sys::GGML_TYPE_IQ2_XS,
            RowType::Iq2S => sys::GGML_TYPE_IQ2_S,
            RowType::Iq3Xxs => sys::GGML_TYPE_IQ3_XXS,
            RowType::Iq3S => sys::GGML_TYPE_IQ3_S,
            RowType::Iq1S => sys::GGML_TYPE_IQ1_S,
            RowType::Iq1M => sys::GGML_TYPE_IQ1_M,
            RowType::Iq4Nl => sys::GGML_TYPE_IQ4_NL,
            RowType::Iq4Xs => sys::GGML_TYPE_IQ4_XS,
            RowType::Tq1_0 => sys::GGML_TYPE_TQ1_0,
            RowType::Tq2_0 => sys::GGML_TYPE_TQ2_0,
            RowType::Mxfp4 => sys::GGML_TYPE_MXFP4,
            RowType::Nvfp4 => sys::GGML_TYPE_NVFP4,
            RowType::Q1_0 => sys::GGML_TYPE_Q1_0,
            RowType::Q2_0 => sys::GGML_TYPE_Q2_0,
        }
    }

    /// (elements, bytes) per block as the linked ggml reports them (`ggml_blck_size`,
    /// `ggml_type_size`), read once per process; (0, 0) for a type ggml gives no block size.
    #[inline]
    fn layout(self) -> (usize, usize) {
        static LAYOUT: OnceLock<[(usize, usize); N_TYPES]> = OnceLock::new();
        LAYOUT.get_or_init(|| {
            RowType::ALL.map(|t| {
                // SAFETY: both functions only index ggml's static type-traits table, and every
                // RowType maps to a valid id below GGML_TYPE_COUNT.
                let (blck, size) =
                    unsafe { (sys::ggml_blck_size(t.ggml()), sys::ggml_type_size(t.ggml())) };
                match usize::try_from(blck) {
                    Ok(b) if b > 0 && size > 0 => (b, size),
                    _ => (0, 0),
                }
            })
        })[self.index()]
    }

    /// Elements per block (1 for float types): the linked ggml's `ggml_blck_size`.
    #[inline]
    pub fn block_elems(self) -> usize {
        self.layout().0
    }

    /// Bytes per block: the linked ggml's `ggml_type_size`. Row slice lengths of the ops are
    /// computed from it.
    #[inline]
    pub fn block_bytes(self) -> usize {
        self.layout().1
    }

    /// True for the block-quantized types.
    pub fn is_quantized(self) -> bool {
        self.block_elems() > 1
    }

    /// Bytes of a row of `n` elements (ggml's `ggml_row_size`), or `None` when `n` is not a
    /// whole number of blocks.
    pub fn row_bytes(self, n: usize) -> Option<usize> {
        let (be, bb) = self.layout();
        (be > 0 && n.is_multiple_of(be)).then(|| n / be * bb)
    }

    /// Short lowercase name as ggml spells it (`ggml_type_name`; tested equal).
    pub fn name(self) -> &'static str {
        match self {
            RowType::F32 => "f32",
            RowType::F16 => "f16",
            RowType::Bf16 => "bf16",
            RowType::Q8_0 => "q8_0",
            RowType::Q4_0 => "q4_0",
            RowType::Q4_1 => "q4_1",
            RowType::Q5_0 => "q5_0",
            RowType::Q5_1 => "q5_1",
            RowType::Q2K => "q2_K",
            RowType::Q3K => "q3_K",
            RowType::Q4K => "q4_K",
            RowType::Q5K => "q5_K",
            RowType::Q6K => "q6_K",
            RowType::Iq2Xxs => "iq2_xxs",
            RowType::Iq2Xs => "iq2_xs",
            RowType::Iq2S => "iq2_s",
            RowType::Iq3Xxs => "iq3_xxs",
            RowType::Iq3S => "iq3_s",
            RowType::Iq1S => "iq1_s",
            RowType::Iq1M => "iq1_m",
            RowType::Iq4Nl => "iq4_nl",
            RowType::Iq4Xs => "iq4_xs",
            RowType::Tq1_0 => "tq1_0",
            RowType::Tq2_0 => "tq2_0",
            RowType::Mxfp4 => "mxfp4",
            RowType::Nvfp4 => "nvfp4",
            RowType::Q1_0 => "q1_0",
            RowType::Q2_0 => "q2_0",
        }
    }
}

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
            quant::quantize_activation(ty, x, &mut self.quant)?;
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
    let k = crate::arch::kernels();
    // SAFETY: `kernels()` only returns SIMD functions whose CPU features were detected; the
    // row holds `row.n` elements (checked at construction) and `x` has the same length.
    unsafe {
        match row.ty {
            RowType::F32 => (k.dot_f32)(row.bytes, &x.f32s),
            RowType::F16 => (k.dot_f16)(row.bytes, &x.f32s),
            RowType::Bf16 => (k.dot_bf16)(row.bytes, &x.f32s),
            _ => quant::vec_dot(row.ty, row.n, row.bytes, &x.quant),
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
    let k = crate::arch::kernels();
    // SAFETY: as in `dot`; `y` has exactly `row.n` elements.
    unsafe {
        match row.ty {
            RowType::F32 => (k.axpy_f32)(row.bytes, alpha, y),
            RowType::F16 => (k.axpy_f16)(row.bytes, alpha, y),
            RowType::Bf16 => (k.axpy_bf16)(row.bytes, alpha, y),
            _ => quant::axpy(row.ty, row.bytes, alpha, y),
        }
    }
}

/// `y += alphas[0] * rows[0] + ... + alphas[3] * rows[3]`, bit-identical to four [`axpy`]
/// calls in order but in one pass over `y` where a kernel exists (q8_0).
#[inline]
pub fn axpy4(rows: [Row<'_>; 4], alphas: [f32; 4], y: &mut [f32]) {
    if rows.iter().all(|r| r.ty == RowType::Q8_0 && r.n == y.len()) {
        // SAFETY: the table's CPU features were detected; every row holds y.len() q8_0
        // elements (checked at construction and above), which the kernel checks again.
        return unsafe { (crate::arch::kernels().axpy4_q8_0)(rows.map(|r| r.bytes), alphas, y) };
    }
    for (row, alpha) in rows.into_iter().zip(alphas) {
        axpy(row, alpha, y);
    }
}

/// Where an [`axpy_folded`] pass starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Start {
    /// From the output's current values.
    Accumulate,
    /// From zero: the output's old values are not read (as if it had been zero-filled first).
    Zero,
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
    if !rows.is_empty() && rows.iter().all(|r| r.ty == RowType::Q8_0) {
        let bytes: [&[u8]; 4] = std::array::from_fn(|i| rows.get(i).map_or(&[][..], |r| r.bytes));
        // SAFETY: the table's CPU features were detected; every row holds y.len() q8_0
        // elements (checked at construction and above), which the kernel checks again.
        return unsafe {
            (crate::arch::kernels().axpy_q8_0_folded)(&bytes[..rows.len()], alphas, y, start)
        };
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
    let k = crate::arch::kernels();
    // SAFETY: as in `dot`; `out` has exactly `row.n` elements.
    unsafe {
        match row.ty {
            RowType::F32 => {
                for (o, c) in out.iter_mut().zip(row.bytes.chunks_exact(4)) {
                    *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                }
            }
            RowType::F16 => (k.f16_to_f32)(row.bytes, out),
            RowType::Bf16 => (k.bf16_to_f32)(row.bytes, out),
            _ => quant::dequantize(row.ty, row.bytes, out),
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
