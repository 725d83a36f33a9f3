//! `spark_attn`, the ggml custom op for Spark attention (docs/INTERFACES.md).
//!
//! The graph creates it with
//! `ggml_custom_4d(ctx, GGML_TYPE_F32, H, N, T, S, {q, k, v, mask}, 4, spark_attn, GGML_N_TASKS_MAX,
//! &params)` where `params` is a `struct spark_attn_params` (`crate::params::AttnParams`) that
//! outlives the graph. ggml's worker threads each call it with their `ith` of `nth`.
//!
//! It enters through [`crate::op::enter`] like every Spark op (one message format, NaN on
//! failure). Its chunks are the kernel's work units for the call's thread count
//! ([`SparseAttention::with_threads`], [`SparseAttention::n_units`]: (stream, token block, KV
//! group or single query head)), which the threads of a call take from a shared counter; a
//! thread owns the output rows of the units it claimed ([`SparseAttention::fill_unit`]).

use crate::attention::SparseAttention;
use crate::op::{Claims, SparkOp};
use crate::params::AttnParams;
use crate::tensor::TensorView;
use crate::KernelError;
use llama_cpp_sys_2 as sys;
use std::ffi::c_void;

crate::op::custom_op! {
    /// The `ggml_custom_op_t` for Spark attention. Arguments: `dst->src[0..4]` = q, k, v, mask;
    /// `userdata` = `*const AttnParams`.
    ///
    /// # Safety
    /// ggml calls this with a live `dst` whose sources and data are valid for their shapes, and
    /// with `userdata` pointing at a live `struct spark_attn_params` (or null, reported as an
    /// error).
    spark_attn => SparseAttention
}

impl SparkOp for SparseAttention {
    const NAME: &'static str = "spark_attn";

    unsafe fn prepare(
        dst: *mut sys::ggml_tensor,
        userdata: *mut c_void,
        nth: usize,
    ) -> Result<Self, KernelError> {
        // SAFETY: forwarded contract.
        Ok(unsafe { prepare(dst, userdata) }?.with_threads(nth))
    }

    fn n_chunks(&self) -> usize {
        self.n_units()
    }

    unsafe fn run(&self, _ith: usize, claims: &mut Claims<'_>) -> Result<(), KernelError> {
        // SAFETY: the op was validated against dst's sources; the counter gives each unit to
        // one thread, and ggml runs no other node on dst concurrently.
        unsafe { self.run_units(claims) };
        Ok(())
    }

    unsafe fn fill_chunk(&self, c: usize, value: f32) {
        // SAFETY: as for run; unit c was claimed by this thread.
        unsafe { self.fill_unit(c, value) };
    }
}

/// Reads and validates the op's arguments.
///
/// # Safety
/// `dst` must be null or a live `ggml_tensor` whose `src[0..4]` are null or live; `userdata`
/// null or a live `AttnParams`.
unsafe fn prepare(
    dst: *mut sys::ggml_tensor,
    userdata: *mut c_void,
) -> Result<SparseAttention, KernelError> {
    // SAFETY: forwarded contract.
    let (call, params) = unsafe { read_call(dst, userdata)? };
    SparseAttention::new(&call.q, &call.k, &call.v, &call.mask, &call.dst, &params)
}

/// The tensors of one `spark_attn` call, as views (metadata only).
#[derive(Debug, Clone, Copy)]
pub struct AttnCall {
    /// Queries (`src[0]`).
    pub q: TensorView,
    /// K cache view (`src[1]`).
    pub k: TensorView,
    /// V cache view (`src[2]`).
    pub v: TensorView,
    /// Mask (`src[3]`).
    pub mask: TensorView,
    /// The output.
    pub dst: TensorView,
}

/// Reads the views of `dst` and its four sources and the params struct, reading no tensor
/// data: the one reading of a `spark_attn` call for the CPU op and the CUDA launcher
/// (`crate::cuda::attn`), with the same messages.
///
/// # Safety
/// `dst` must be null or a live `ggml_tensor` whose `src[0..4]` are null or live; `userdata`
/// null or a live `AttnParams` (in host memory).
pub unsafe fn read_call(
    dst: *const sys::ggml_tensor,
    userdata: *const c_void,
) -> Result<(AttnCall, AttnParams), KernelError> {
    // SAFETY: per the contract, dst is null or live.
    let dst_ref =
        unsafe { dst.as_ref() }.ok_or_else(|| KernelError::Shape("dst is null".into()))?;
    if userdata.is_null() {
        return Err(KernelError::Param(
            "spark_attn_params (userdata) is null".into(),
        ));
    }
    // SAFETY: a non-null userdata is a live AttnParams (contract); read unaligned to be safe.
    let params = unsafe { userdata.cast::<AttnParams>().read_unaligned() };
    let src = |i: usize, name: &str| -> Result<TensorView, KernelError> {
        // SAFETY: sources are null (reported) or live; from_raw copies struct fields only.
        unsafe { TensorView::from_raw(dst_ref.src[i]) }
            .map_err(|e| KernelError::Shape(format!("{name}: {e}")))
    };
    let call = AttnCall {
        q: src(0, "q")?,
        k: src(1, "k")?,
        v: src(2, "v")?,
        mask: src(3, "mask")?,
        // SAFETY: dst is live; metadata only.
        dst: unsafe { TensorView::from_raw(dst) }
            .map_err(|e| KernelError::Shape(format!("dst: {e}")))?,
    };
    Ok((call, params))
}
