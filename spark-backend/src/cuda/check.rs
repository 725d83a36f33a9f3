//! What every CUDA launcher checks from tensor *metadata* only (shapes, strides, types, data
//! pointers as numbers): never a read of tensor data, which lives on the device. The launchers
//! turn `dst`, its sources and the parameter block into a plan (`crate::ffn::cuda_plan`,
//! `crate::attention::cuda_plan`) with these checks and their own before any CUDA call, so the
//! checks are pure functions the tests run on host-only tensors: the CPU ops' checks plus the
//! kernels' limits (32-bit indices, aligned data, the weight types of
//! [`options::GPU_WEIGHT_TYPES`]).

use super::options::{self, block_layout};
use crate::tensor::{TensorView, GGML_TYPE_F32};
use crate::KernelError;

/// Largest dimension the kernels index with 32-bit integers.
pub(crate) const MAX_DIM: usize = i32::MAX as usize / 4;

/// A weight matrix on the device: `rows` rows of `cols` values of ggml type `ty`, row `j` at
/// `ptr + j * row_stride`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuWeight {
    /// ggml type id (one of [`options::GPU_WEIGHT_TYPES`]).
    pub ty: u32,
    /// Device address of row 0.
    pub ptr: u64,
    /// Bytes between rows.
    pub row_stride: u64,
    /// Values per row.
    pub cols: usize,
    /// Rows.
    pub rows: usize,
}

/// Every dimension of `v` within the kernels' 32-bit limit.
fn dims_in_range(name: &str, v: &TensorView) -> Result<(), KernelError> {
    if v.ne.iter().any(|&n| n > MAX_DIM) {
        return Err(KernelError::Shape(format!(
            "{name}: ne {:?} beyond the CUDA kernels' limit {MAX_DIM}",
            v.ne
        )));
    }
    Ok(())
}

/// f32 rows: contiguous values, row stride a multiple of 4 covering the row, 4-byte aligned.
pub(crate) fn expect_f32_rows(v: &TensorView, name: &'static str) -> Result<(), KernelError> {
    crate::tensor::expect_f32_rows(v, name)?;
    dims_in_range(name, v)?;
    if !(v.data as usize).is_multiple_of(4) {
        return Err(KernelError::Shape(format!(
            "{name}: data not 4-byte aligned"
        )));
    }
    Ok(())
}

/// A packed 2-D weight matrix of a type the kernels read.
pub(crate) fn weight(v: &TensorView, name: &'static str) -> Result<GpuWeight, KernelError> {
    if !options::is_gpu_weight_type(v.ty) {
        return Err(KernelError::UnsupportedType {
            tensor: name,
            ty: v.ty,
        });
    }
    dims_in_range(name, v)?;
    let (blck, size) = block_layout(v.ty);
    if blck == 0 || v.nb[0] != size || v.ne[2] != 1 || v.ne[3] != 1 {
        return Err(KernelError::Shape(format!(
            "{name}: not a packed 2-D matrix (ne {:?}, nb {:?})",
            v.ne, v.nb
        )));
    }
    if !v.ne[0].is_multiple_of(blck) {
        return Err(KernelError::Shape(format!(
            "{name}: {} columns are not whole blocks of {blck}",
            v.ne[0]
        )));
    }
    let row_bytes = v.ne[0] / blck * size;
    // f32 rows are read as floats, everything else starts with or holds 16-bit values.
    let align = if v.ty == GGML_TYPE_F32 { 4 } else { 2 };
    if v.nb[1] < row_bytes
        || !v.nb[1].is_multiple_of(align)
        || !(v.data as usize).is_multiple_of(align)
    {
        return Err(KernelError::Shape(format!(
            "{name}: rows of {row_bytes} bytes at stride {} (data {:p}) not {align}-byte aligned \
             or overlapping",
            v.nb[1], v.data
        )));
    }
    Ok(GpuWeight {
        ty: v.ty,
        ptr: v.data as u64,
        row_stride: v.nb[1] as u64,
        cols: v.ne[0],
        rows: v.ne[1],
    })
}
