//! What a table of kernels is: the instruction sets ([`Isa`]), the one struct every table
//! fills ([`Kernels`], one entry per kernel, so adding a kernel makes the compiler ask every
//! table for it) and the choices made from a table: which kernel runs for a row type
//! ([`Kernels::dot`], [`Kernels::axpy`], [`Kernels::f32_conversion`], [`Kernels::axpy4`],
//! [`Kernels::axpy_folded`]: exhaustive matches on [`RowType`], so a new type makes the
//! compiler ask each choice for it) and for a set of cache rows ([`Kernels::attn_dots`],
//! [`Kernels::attn_accumulate`]). The tables themselves are `generic::KERNELS`, `x86::AVX2`
//! and `arm::NEON`; this file imports none of them.

use crate::kernel_types::{BlockRows, Queries, RowType, Rows, Scores, Start};
use std::ops::Range;

/// An instruction set the kernels have a table for. Variants exist only on their
/// architecture, so matches on `Isa` are exhaustive per target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// Portable Rust (the references).
    Generic,
    /// x86-64 with AVX2, FMA and F16C (every kernel of the table may use all three).
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// AArch64 with Advanced SIMD (NEON), which every AArch64 CPU has.
    #[cfg(target_arch = "aarch64")]
    Neon,
}

impl Isa {
    /// Every instruction set this build has a table for, from the generic one up.
    pub const ALL: &'static [Isa] = &[
        Isa::Generic,
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2,
        #[cfg(target_arch = "aarch64")]
        Isa::Neon,
    ];

    /// The name `SPARK_ISA` takes and the reports print.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Generic => "generic",
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => "avx2",
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => "neon",
        }
    }

    /// Whether the running CPU has every feature this instruction set's table uses.
    pub fn is_supported(self) -> bool {
        match self {
            Isa::Generic => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
                    && std::arch::is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => std::arch::is_aarch64_feature_detected!("neon"),
        }
    }

    /// Every instruction set the running CPU supports, from the generic one up.
    pub fn available() -> Vec<Isa> {
        Isa::ALL
            .iter()
            .copied()
            .filter(|i| i.is_supported())
            .collect()
    }

    /// The best instruction set the running CPU supports.
    pub fn detect() -> Self {
        Isa::ALL
            .iter()
            .rev()
            .copied()
            .find(|i| i.is_supported())
            .unwrap_or(Isa::Generic)
    }

    /// The instruction set named `name` (as [`Isa::name`] prints it), if this build has it.
    pub fn from_name(name: &str) -> Option<Self> {
        Isa::ALL.iter().copied().find(|i| i.name() == name)
    }
}

/// `sum_i row[i] * x[i]` over `x.len()` elements of a row of bytes.
pub type DotFn = unsafe fn(row: &[u8], x: &[f32]) -> f32;
/// `y[i] += alpha * row[i]` over `y.len()` elements of a row of bytes.
pub type AxpyFn = unsafe fn(row: &[u8], alpha: f32, y: &mut [f32]);
/// `out[i] = row[i]` over `out.len()` elements of a row of bytes.
pub type ToF32Fn = unsafe fn(row: &[u8], out: &mut [f32]);
/// `y += alphas[0] * rows[0] + ... + alphas[3] * rows[3]`, bit for bit four axpys in order.
pub type Axpy4Fn = unsafe fn(rows: [&[u8]; 4], alphas: [f32; 4], y: &mut [f32]);
/// The folded q8_0 axpy of up to four rows (`rows::axpy_folded`).
pub type FoldedFn = unsafe fn(rows: &[&[u8]], alphas: &[f32], y: &mut [f32], start: Start);
/// Sums of `x - shift` and `(x - shift)^2` in eight f64 lanes, with the count (`topk`).
pub type ShiftedSumsFn = unsafe fn(x: &[f32], shift: f64) -> (f64, f64, usize);
/// Attention scores of listed cache rows against queries (`attention::dot::dots`).
pub(crate) type AttnDotsFn = unsafe fn(Rows, Range<usize>, &[u32], Queries<'_>, Scores<'_>);
/// Weighted sum of listed cache rows into `out` (`attention::dot::accumulate`).
pub(crate) type AttnAccumulateFn = unsafe fn(Rows, &[u32], &[f32], &mut [f32]);
/// Attention's dot products over rows of blocks read in place (dims whole blocks).
pub(crate) type AttnBlockDotsFn =
    unsafe fn(BlockRows, Range<usize>, &[u32], Queries<'_>, Scores<'_>);
/// Attention's value accumulation over rows of blocks read in place (whole blocks).
pub(crate) type AttnBlockAccumulateFn = unsafe fn(BlockRows, &[u32], &[f32], &mut [f32]);

/// One version of every kernel. The entries are `unsafe fn`: they may use CPU features that
/// `arch::table` checked before handing the table out; each also states its length contract
/// (checked inside, panicking on a short row, unless said otherwise).
#[derive(Clone, Copy)]
pub struct Kernels {
    /// The instruction set of this table.
    pub isa: Isa,
    /// Dot product, f32 rows.
    pub dot_f32: DotFn,
    /// Dot product, f16 rows.
    pub dot_f16: DotFn,
    /// Dot product, bf16 rows.
    pub dot_bf16: DotFn,
    /// axpy, f32 rows.
    pub axpy_f32: AxpyFn,
    /// axpy, f16 rows.
    pub axpy_f16: AxpyFn,
    /// axpy, bf16 rows.
    pub axpy_bf16: AxpyFn,
    /// Conversion of an f16 row to f32.
    pub f16_to_f32: ToF32Fn,
    /// Conversion of a bf16 row to f32.
    pub bf16_to_f32: ToF32Fn,
    /// axpy, q8_0 rows (length a multiple of 32): ggml's `to_float`, then an f32 axpy.
    pub axpy_q8_0: AxpyFn,
    /// axpy, q4_0 rows (length a multiple of 32).
    pub axpy_q4_0: AxpyFn,
    /// axpy, q6_K rows (length a multiple of 256).
    pub axpy_q6_k: AxpyFn,
    /// Dequantization of a q8_0 row, as ggml's `to_float`.
    pub to_f32_q8_0: ToF32Fn,
    /// Dequantization of a q4_0 row.
    pub to_f32_q4_0: ToF32Fn,
    /// Dequantization of a q6_K row.
    pub to_f32_q6_k: ToF32Fn,
    /// Four q8_0 axpys in one pass over `y`.
    pub axpy4_q8_0: Axpy4Fn,
    /// One to four q8_0 rows with each block's scale folded into the coefficient.
    pub axpy_q8_0_folded: FoldedFn,
    /// The top-k's shifted sums.
    pub shifted_sums: ShiftedSumsFn,
    /// Attention's dot products (rows with adjacent elements).
    pub(crate) attn_dots: AttnDotsFn,
    /// Attention's value accumulation (rows with adjacent elements).
    pub(crate) attn_accumulate: AttnAccumulateFn,
    /// Attention's dot products, rows whose elements are not adjacent (a transposed cache view).
    pub(crate) attn_dots_strided: AttnDotsFn,
    /// Attention's value accumulation, rows whose elements are not adjacent.
    pub(crate) attn_accumulate_strided: AttnAccumulateFn,
    /// Attention's dot products straight from q8_0 cache rows (each value its block's scale
    /// times its integer, as the type's conversion computes it), where the table has them;
    /// else the caller converts the rows to f32 first.
    pub(crate) attn_block_dots_q8_0: Option<AttnBlockDotsFn>,
    /// The same for q4_0 cache rows.
    pub(crate) attn_block_dots_q4_0: Option<AttnBlockDotsFn>,
    /// Attention's value accumulation straight from q8_0 cache rows, where the table has it.
    pub(crate) attn_block_accumulate_q8_0: Option<AttnBlockAccumulateFn>,
    /// The same for q4_0 cache rows.
    pub(crate) attn_block_accumulate_q4_0: Option<AttnBlockAccumulateFn>,
}

/// The dot product a table runs for rows of one type against an f32 activation.
#[derive(Clone, Copy)]
pub(crate) enum DotKernel {
    /// The table's own kernel, against the activation as f32.
    F32Activation(DotFn),
    /// ggml's `vec_dot` for the type, against the activation quantized once to the type's
    /// `vec_dot_type` (`generic::ggml`: the code ggml's own `mul_mat` runs).
    GgmlVecDot,
}

/// The axpy (`y += alpha * row`) a table runs for rows of one type.
#[derive(Clone, Copy)]
pub(crate) enum AxpyKernel {
    /// The table's own kernel.
    Own(AxpyFn),
    /// ggml's `to_float` into a stack buffer, then this f32 axpy (`generic::ggml`).
    GgmlToFloatThen(AxpyFn),
}

/// The conversion of a row of one type to f32 a table runs.
#[derive(Clone, Copy)]
pub(crate) enum ToF32Kernel {
    /// f32 rows: a copy.
    Copy,
    /// The table's own kernel.
    Own(ToF32Fn),
    /// ggml's `to_float` (`generic::ggml`).
    GgmlToFloat,
}

impl Kernels {
    /// The dot product for rows of `ty`.
    pub(crate) fn dot(&self, ty: RowType) -> DotKernel {
        use RowType::*;
        match ty {
            F32 => DotKernel::F32Activation(self.dot_f32),
            F16 => DotKernel::F32Activation(self.dot_f16),
            Bf16 => DotKernel::F32Activation(self.dot_bf16),
            Q8_0 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q2K | Q3K | Q4K | Q5K | Q6K | Iq2Xxs | Iq2Xs
            | Iq2S | Iq3Xxs | Iq3S | Iq1S | Iq1M | Iq4Nl | Iq4Xs | Tq1_0 | Tq2_0 | Mxfp4
            | Nvfp4 | Q1_0 | Q2_0 => DotKernel::GgmlVecDot,
        }
    }

    /// The axpy for rows of `ty`.
    pub(crate) fn axpy(&self, ty: RowType) -> AxpyKernel {
        use RowType::*;
        match ty {
            F32 => AxpyKernel::Own(self.axpy_f32),
            F16 => AxpyKernel::Own(self.axpy_f16),
            Bf16 => AxpyKernel::Own(self.axpy_bf16),
            Q8_0 => AxpyKernel::Own(self.axpy_q8_0),
            Q4_0 => AxpyKernel::Own(self.axpy_q4_0),
            Q6K => AxpyKernel::Own(self.axpy_q6_k),
            Q4_1 | Q5_0 | Q5_1 | Q2K | Q3K | Q4K | Q5K | Iq2Xxs | Iq2Xs | Iq2S | Iq3Xxs | Iq3S
            | Iq1S | Iq1M | Iq4Nl | Iq4Xs | Tq1_0 | Tq2_0 | Mxfp4 | Nvfp4 | Q1_0 | Q2_0 => {
                AxpyKernel::GgmlToFloatThen(self.axpy_f32)
            }
        }
    }

    /// The conversion to f32 of rows of `ty`.
    pub(crate) fn f32_conversion(&self, ty: RowType) -> ToF32Kernel {
        use RowType::*;
        match ty {
            F32 => ToF32Kernel::Copy,
            F16 => ToF32Kernel::Own(self.f16_to_f32),
            Bf16 => ToF32Kernel::Own(self.bf16_to_f32),
            Q8_0 => ToF32Kernel::Own(self.to_f32_q8_0),
            Q4_0 => ToF32Kernel::Own(self.to_f32_q4_0),
            Q6K => ToF32Kernel::Own(self.to_f32_q6_k),
            Q4_1 | Q5_0 | Q5_1 | Q2K | Q3K | Q4K | Q5K | Iq2Xxs | Iq2Xs | Iq2S | Iq3Xxs | Iq3S
            | Iq1S | Iq1M | Iq4Nl | Iq4Xs | Tq1_0 | Tq2_0 | Mxfp4 | Nvfp4 | Q1_0 | Q2_0 => {
                ToF32Kernel::GgmlToFloat
            }
        }
    }

    /// The four-row axpy for rows of `ty`, where the table has one (else four [`Self::axpy`]).
    pub(crate) fn axpy4(&self, ty: RowType) -> Option<Axpy4Fn> {
        use RowType::*;
        match ty {
            Q8_0 => Some(self.axpy4_q8_0),
            F32 | F16 | Bf16 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q2K | Q3K | Q4K | Q5K | Q6K | Iq2Xxs
            | Iq2Xs | Iq2S | Iq3Xxs | Iq3S | Iq1S | Iq1M | Iq4Nl | Iq4Xs | Tq1_0 | Tq2_0
            | Mxfp4 | Nvfp4 | Q1_0 | Q2_0 => None,
        }
    }

    /// The folded axpy (each block's scale folded into the coefficient) for rows of `ty`, where
    /// the table has one (else the plain [`Self::axpy`], whose arithmetic it then is).
    pub(crate) fn axpy_folded(&self, ty: RowType) -> Option<FoldedFn> {
        use RowType::*;
        match ty {
            Q8_0 => Some(self.axpy_q8_0_folded),
            F32 | F16 | Bf16 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q2K | Q3K | Q4K | Q5K | Q6K | Iq2Xxs
            | Iq2Xs | Iq2S | Iq3Xxs | Iq3S | Iq1S | Iq1M | Iq4Nl | Iq4Xs | Tq1_0 | Tq2_0
            | Mxfp4 | Nvfp4 | Q1_0 | Q2_0 => None,
        }
    }

    /// Attention's dot products for these cache rows: the dense kernel when a row's elements
    /// are adjacent, else the strided one.
    pub(crate) fn attn_dots(&self, rows: &Rows) -> AttnDotsFn {
        if rows.is_dense() {
            self.attn_dots
        } else {
            self.attn_dots_strided
        }
    }

    /// Attention's dot products over rows of blocks of `ty` read in place, where the table has
    /// them (else the rows are converted to f32 and take [`Self::attn_dots`]).
    pub(crate) fn attn_block_dots(&self, ty: RowType) -> Option<AttnBlockDotsFn> {
        use RowType::*;
        match ty {
            Q8_0 => self.attn_block_dots_q8_0,
            Q4_0 => self.attn_block_dots_q4_0,
            F32 | F16 | Bf16 | Q4_1 | Q5_0 | Q5_1 | Q2K | Q3K | Q4K | Q5K | Q6K | Iq2Xxs
            | Iq2Xs | Iq2S | Iq3Xxs | Iq3S | Iq1S | Iq1M | Iq4Nl | Iq4Xs | Tq1_0 | Tq2_0
            | Mxfp4 | Nvfp4 | Q1_0 | Q2_0 => None,
        }
    }

    /// Attention's value accumulation over rows of blocks of `ty` read in place, where the
    /// table has it (as [`Self::attn_block_dots`]).
    pub(crate) fn attn_block_accumulate(&self, ty: RowType) -> Option<AttnBlockAccumulateFn> {
        use RowType::*;
        match ty {
            Q8_0 => self.attn_block_accumulate_q8_0,
            Q4_0 => self.attn_block_accumulate_q4_0,
            F32 | F16 | Bf16 | Q4_1 | Q5_0 | Q5_1 | Q2K | Q3K | Q4K | Q5K | Q6K | Iq2Xxs
            | Iq2Xs | Iq2S | Iq3Xxs | Iq3S | Iq1S | Iq1M | Iq4Nl | Iq4Xs | Tq1_0 | Tq2_0
            | Mxfp4 | Nvfp4 | Q1_0 | Q2_0 => None,
        }
    }

    /// Attention's value accumulation for these cache rows (as [`Self::attn_dots`] chooses).
    pub(crate) fn attn_accumulate(&self, rows: &Rows) -> AttnAccumulateFn {
        if rows.is_dense() {
            self.attn_accumulate
        } else {
            self.attn_accumulate_strided
        }
    }
}

/// Entry points of a table that enable an instruction set's features and call a generic body:
/// each becomes an `unsafe fn` with `#[target_feature(enable = $features)]`, whose contract is
/// that the running CPU has the features (`arch::table` hands out a table only then) and whose
/// body checks the lengths it relies on.
///
/// ```ignore
/// target_feature_entries! { "avx2,fma,f16c";
///     pub(crate) dot_f32(row: &[u8], x: &[f32]) -> f32 => dot_impl::<F32>(row, x);
/// }
/// ```
macro_rules! target_feature_entries {
    ($features:literal; $($(#[$attr:meta])* $vis:vis $name:ident($($arg:ident: $ty:ty),*) $(-> $ret:ty)? => $body:expr;)*) => {$(
        $(#[$attr])*
        #[target_feature(enable = $features)]
        $vis unsafe fn $name($($arg: $ty),*) $(-> $ret)? {
            // SAFETY: the features are enabled on this function (its table's promise); the body
            // checks the lengths it relies on.
            unsafe { $body }
        }
    )*};
}
pub(crate) use target_feature_entries;
