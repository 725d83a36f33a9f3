//! `spark_attn`, the ggml custom op for Spark attention (docs/INTERFACES.md).
//!
//! The graph creates it with
//! `ggml_custom_4d(ctx, GGML_TYPE_F32, H, N, T, S, {q, k, v, mask}, 4, spark_attn, GGML_N_TASKS_MAX,
//! NULL)` and stores its parameters, a `struct spark_attn_params` (`crate::params::AttnParams`),
//! in the node itself (`spark_op_set_params`, `crate::params`). ggml's worker threads each call
//! it with their `ith` of `nth`.
//!
//! It enters through [`crate::cpu_op::enter`] like every Spark op (one message format, NaN on
//! failure). Its chunks are the kernel's work units for the call's thread count
//! ([`SparseAttention::with_threads`], [`SparseAttention::n_units`]: (stream, token block, KV
//! group or single query head)), which the threads of a call take from a shared counter; a
//! thread owns the output rows of the units it claimed ([`SparseAttention::fill_unit`]).

use super::layout::AttnCall;
use super::SparseAttention;
use crate::cpu_op::{Claims, SparkOp};
use crate::KernelError;
use llama_cpp_sys_2 as sys;
use std::ffi::c_void;

crate::cpu_op::custom_op! {
    /// The `ggml_custom_op_t` for Spark attention. Arguments: `dst->src[0..4]` = q, k, v, mask;
    /// the parameters are the `struct spark_attn_params` stored in `dst` (`crate::params`; none
    /// stored is reported as an error); ggml's `userdata` is not read.
    ///
    /// # Safety
    /// ggml calls this with a live `dst` whose sources and data are valid for their shapes.
    spark_attn => SparseAttention
}

impl SparkOp for SparseAttention {
    const NAME: &'static str = "spark_attn";

    unsafe fn prepare(
        dst: *mut sys::ggml_tensor,
        params_block: *mut c_void,
        nth: usize,
    ) -> Result<Self, KernelError> {
        // SAFETY: forwarded contract.
        Ok(unsafe { prepare(dst, params_block) }?.with_threads(nth))
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
    params_block: *mut c_void,
) -> Result<SparseAttention, KernelError> {
    // SAFETY: forwarded contract.
    let (call, params) = unsafe { AttnCall::read(dst, params_block)? };
    SparseAttention::new(&call, &params)
}
