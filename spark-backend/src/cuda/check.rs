//! Validation of a CUDA launch from tensor *metadata* only (shapes, strides, types, data
//! pointers as numbers, the userdata params struct in host memory): never a read of tensor
//! data, which lives on the device. Each FFN launcher turns `dst`, its sources and the
//! userdata into a plan here (or a [`KernelError`]) before any CUDA call, so the checks are
//! pure functions the tests run on host-only tensors. They accept what the CPU ops accept
//! (`crate::ffn::op`), restricted to the weight types of [`options::GPU_WEIGHT_TYPES`].

use super::options::{self, block_layout};
use crate::ffn::shapes::{self, StageDims};
use crate::tensor::{views, TensorView, GGML_TYPE_F32};
use crate::KernelError;
use llama_cpp_sys_2 as sys;
use std::ffi::c_void;

/// Largest dimension the kernels index with 32-bit integers.
pub const MAX_DIM: usize = i32::MAX as usize / 4;

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

/// The inputs `spark_ffn_up` and `spark_ffn_fused` share, checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StagePlan {
    /// Layer (statistics, messages).
    pub layer: i32,
    /// k_f (>= 1; >= F is dense).
    pub k: usize,
    /// F.
    pub f: usize,
    /// D.
    pub d: usize,
    /// Tokens.
    pub n_tokens: usize,
    /// Scores [F, n_tokens], contiguous f32.
    pub s: u64,
    /// h [D, n_tokens] f32; row t at `h + t * h_stride` bytes.
    pub h: u64,
    /// Bytes between rows of h.
    pub h_stride: u64,
    /// K2: F rows of D - r_f.
    pub k2: GpuWeight,
}

impl StagePlan {
    /// F, D and the tokens, as the shared shape rules name them.
    pub fn dims(&self) -> StageDims {
        StageDims {
            f: self.f,
            d: self.d,
            n_tokens: self.n_tokens,
        }
    }

    /// r_f = D - (columns of K2).
    pub fn r_f(&self) -> usize {
        self.d - self.k2.cols
    }

    /// True when k >= F (every neuron kept, unshifted).
    pub fn dense(&self) -> bool {
        self.k >= self.f
    }
}

/// `spark_ffn_fused`, checked: writes partials [D, n_tokens, P] (contiguous) at `out`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FusedPlan {
    /// Scores, h, K2, k.
    pub stage: StagePlan,
    /// V: F rows of D.
    pub v: GpuWeight,
    /// P, the number of chunks.
    pub p: usize,
    /// Device address of dst.
    pub out: u64,
}

/// `spark_ffn_up`, checked: writes u [n_tokens, F] (contiguous, neuron-major) at `out`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpPlan {
    /// Scores, h, K2, k.
    pub stage: StagePlan,
    /// Device address of dst.
    pub out: u64,
}

/// `spark_ffn_down`, checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DownPlan {
    /// u [n_tokens, F], contiguous f32.
    pub u: u64,
    /// V: F rows of D.
    pub v: GpuWeight,
    /// Tokens.
    pub n_tokens: usize,
    /// Device address of dst [D, n_tokens].
    pub out: u64,
    /// Floats between dst rows.
    pub out_row: usize,
}

/// `spark_ffn_sum`, checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SumPlan {
    /// Partials [D, n_tokens, P], contiguous f32.
    pub partials: u64,
    /// D.
    pub d: usize,
    /// Tokens.
    pub n_tokens: usize,
    /// P.
    pub p: usize,
    /// Device address of dst [D, n_tokens].
    pub out: u64,
    /// Floats between dst rows.
    pub out_row: usize,
}

/// `k_f` and the layer from the userdata (a host-memory params struct; `params::read_ffn`).
///
/// # Safety
/// `userdata` is null or points to a `spark_ffn_params`.
pub unsafe fn ffn_params(userdata: *const c_void) -> Result<(i32, usize), KernelError> {
    // SAFETY: forwarded contract.
    let (params, k) = unsafe { crate::params::read_ffn(userdata)? };
    Ok((params.layer, k))
}

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
fn expect_f32_rows(v: &TensorView, name: &'static str) -> Result<(), KernelError> {
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
pub fn weight(v: &TensorView, name: &'static str) -> Result<GpuWeight, KernelError> {
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

fn stage(
    s: &TensorView,
    h: &TensorView,
    k2: &TensorView,
    params: (i32, usize),
) -> Result<StagePlan, KernelError> {
    let (layer, k) = params;
    let StageDims { f, d, n_tokens } = shapes::stage(s, h, k2)?;
    // The kernels' own limits: 32-bit sizes and 4-byte aligned f32 data.
    expect_f32_rows(s, "scores")?;
    expect_f32_rows(h, "h")?;
    let k2w = weight(k2, "ffn_up")?;
    if f == 0 || n_tokens == 0 {
        return Err(KernelError::Shape(format!(
            "F = {f}, n_tokens = {n_tokens}: nothing to compute"
        )));
    }
    Ok(StagePlan {
        layer,
        k,
        f,
        d,
        n_tokens,
        s: s.data as u64,
        h: h.data as u64,
        h_stride: h.nb[1] as u64,
        k2: k2w,
    })
}

/// Checks `spark_ffn_fused`'s tensors (docs/INTERFACES.md).
///
/// # Safety
/// As ggml calls a custom op: `dst` null or live with live sources, `userdata` null or a
/// `spark_ffn_params`.
pub unsafe fn fused(
    dst: *const sys::ggml_tensor,
    userdata: *const c_void,
) -> Result<FusedPlan, KernelError> {
    // SAFETY: forwarded contract.
    let (out, [s, h, k2, v]) = unsafe { views::<4>(dst)? };
    // SAFETY: forwarded contract.
    let params = unsafe { ffn_params(userdata)? };
    let stage = stage(&s, &h, &k2, params)?;
    let p = shapes::fused_dst(stage.dims(), &v, &out)?;
    let vw = weight(&v, "ffn_down_t")?;
    expect_f32_rows(&out, "dst")?;
    Ok(FusedPlan {
        stage,
        v: vw,
        p,
        out: out.data as u64,
    })
}

/// Checks `spark_ffn_up`'s tensors.
///
/// # Safety
/// As for [`fused`].
pub unsafe fn up(
    dst: *const sys::ggml_tensor,
    userdata: *const c_void,
) -> Result<UpPlan, KernelError> {
    // SAFETY: forwarded contract.
    let (out, [s, h, k2]) = unsafe { views::<3>(dst)? };
    // SAFETY: forwarded contract.
    let params = unsafe { ffn_params(userdata)? };
    let stage = stage(&s, &h, &k2, params)?;
    shapes::up_dst(stage.dims(), &out)?;
    expect_f32_rows(&out, "dst")?;
    Ok(UpPlan {
        stage,
        out: out.data as u64,
    })
}

/// Checks `spark_ffn_down`'s tensors (userdata is not read).
///
/// # Safety
/// `dst` null or live with live sources.
pub unsafe fn down(dst: *const sys::ggml_tensor) -> Result<DownPlan, KernelError> {
    // SAFETY: forwarded contract.
    let (out, [u, v]) = unsafe { views::<2>(dst)? };
    let (n_tokens, _, _) = shapes::down(&u, &v, &out)?;
    expect_f32_rows(&u, "u")?;
    let vw = weight(&v, "ffn_down_t")?;
    expect_f32_rows(&out, "dst")?;
    Ok(DownPlan {
        u: u.data as u64,
        v: vw,
        n_tokens,
        out: out.data as u64,
        out_row: out.nb[1] / 4,
    })
}

/// Checks `spark_ffn_sum`'s tensors (userdata is not read).
///
/// # Safety
/// `dst` null or live with live sources.
pub unsafe fn sum(dst: *const sys::ggml_tensor) -> Result<SumPlan, KernelError> {
    // SAFETY: forwarded contract.
    let (out, [partials]) = unsafe { views::<1>(dst)? };
    let (d, n_tokens, p) = shapes::sum(&partials, &out)?;
    expect_f32_rows(&partials, "partials")?;
    expect_f32_rows(&out, "dst")?;
    Ok(SumPlan {
        partials: partials.data as u64,
        d,
        n_tokens,
        p,
        out: out.data as u64,
        out_row: out.nb[1] / 4,
    })
}
