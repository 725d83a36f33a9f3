//! The cache rows attention's inner loops read ([`Rows`] of an [`ElemType`], one element at a
//! time with [`load1`]), the queries they score ([`Queries`]) into a score matrix ([`Scores`]),
//! and the lane-reduction tree every version sums in ([`reduce8`]): what the attention kernels
//! of every table take and `attention` hands them. A cache of any other type ggml stores
//! ([`CacheType::Blocks`]: bf16, q8_0, q4_0, ...) reaches those kernels as f32 rows converted
//! from its blocks first.

use super::RowType;
use crate::KernelError;
use llama_cpp_sys_2::{GGML_TYPE_F16, GGML_TYPE_F32};

/// Element type of a cache or mask tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ElemType {
    /// IEEE binary32.
    F32,
    /// IEEE binary16.
    F16,
}

impl ElemType {
    /// The element type of ggml type id `ty`, or an error naming `tensor`.
    pub(crate) fn from_ggml(ty: u32, tensor: &'static str) -> Result<Self, KernelError> {
        match ty {
            GGML_TYPE_F32 => Ok(ElemType::F32),
            GGML_TYPE_F16 => Ok(ElemType::F16),
            _ => Err(KernelError::UnsupportedType { tensor, ty }),
        }
    }

    /// Bytes per element.
    pub(crate) fn size(self) -> usize {
        match self {
            ElemType::F32 => 4,
            ElemType::F16 => 2,
        }
    }
}

/// How the attention kernels read a K or V cache's elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CacheType {
    /// f32 or f16 elements, read where they lie (one element at any byte stride).
    Elems(ElemType),
    /// Rows of whole blocks of another type ggml stores caches in (bf16, q8_0, q4_0, q4_1,
    /// q5_0, q5_1, iq4_nl, ...): the rows a step needs are converted to f32 first (the type's
    /// own conversion kernel, `crate::rows::to_f32`), then read as f32 rows.
    Blocks(RowType),
}

impl CacheType {
    /// The cache type of ggml type id `ty`, or an error naming `tensor`: f32 and f16 are read
    /// in place, every other type ggml can convert to f32 in blocks.
    pub(crate) fn from_ggml(ty: u32, tensor: &'static str) -> Result<Self, KernelError> {
        if let Ok(e) = ElemType::from_ggml(ty, tensor) {
            return Ok(CacheType::Elems(e));
        }
        RowType::from_ggml(ty)
            .map(CacheType::Blocks)
            .ok_or(KernelError::UnsupportedType { tensor, ty })
    }
}

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

/// Rows of a block-typed cache ([`CacheType::Blocks`]): row `j` at `base + j * row_stride`,
/// its blocks adjacent.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BlockRows {
    /// Address of row 0's first block.
    pub(crate) base: *const u8,
    /// The block type.
    pub(crate) ty: RowType,
    /// Byte stride between consecutive rows (positions).
    pub(crate) row_stride: usize,
}

impl BlockRows {
    /// Address of the block holding element `i` (a multiple of the block size) of row `j`.
    #[inline(always)]
    pub(crate) fn at(&self, j: usize, i: usize) -> *const u8 {
        self.base
            .wrapping_add(j * self.row_stride + i / self.ty.block_elems() * self.ty.block_bytes())
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

/// The lane-reduction tree shared by every path: `((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7))`.
#[inline(always)]
pub(crate) fn reduce8(a: &[f32; 8]) -> f32 {
    let s4 = [a[0] + a[4], a[1] + a[5], a[2] + a[6], a[3] + a[7]];
    let s2 = [s4[0] + s4[2], s4[1] + s4[3]];
    s2[0] + s2[1]
}
