//! `spark_attn`, the ggml custom op for Spark attention (docs/INTERFACES.md).
//!
//! The graph creates it with
//! `ggml_custom_4d(ctx, GGML_TYPE_F32, H, N, T, S, {q, k, v, mask}, 4, spark_attn, GGML_N_TASKS_MAX,
//! &params)` where `params` is a `struct spark_attn_params` (`crate::params::AttnParams`) that
//! outlives the graph. ggml's worker threads each call it with their `ith` of `nth`.
//!
//! Failure contract: if the arguments are invalid (shape, type, parameter) the op prints one
//! line `spark-backend: spark_attn: layer L: <reason>` to stderr (from thread 0 only) and every
//! thread fills its share of dst with NaN, so the failure shows in the model output instead of
//! passing silently. A panic inside the kernel is caught (nothing unwinds into C): the thread
//! reports it and fills the rows it owns with NaN.

use crate::attention::SparseAttention;
use crate::ffi;
use crate::params::AttnParams;
use crate::tensor::TensorView;
use crate::KernelError;
use llama_cpp_sys_2 as sys;
use std::ffi::{c_int, c_void};

/// The `ggml_custom_op_t` for Spark attention. Arguments: `dst->src[0..4]` = q, k, v, mask;
/// `userdata` = `*const AttnParams`.
///
/// # Safety
/// ggml calls this with a live `dst` whose sources and data are valid for their shapes, and
/// with `userdata` pointing at a live `struct spark_attn_params` (or null, reported as an
/// error).
pub unsafe extern "C" fn spark_attn(
    dst: *mut sys::ggml_tensor,
    ith: c_int,
    nth: c_int,
    userdata: *mut c_void,
) {
    let (ith_u, nth_u) = match (usize::try_from(ith), usize::try_from(nth)) {
        (Ok(i), Ok(n)) if i < n => (i, n),
        _ => {
            if ith == 0 {
                ffi::report("spark_attn", &format!("bad thread index {ith} of {nth}"));
            }
            return;
        }
    };
    // Validation (reads only the C structs).
    // SAFETY: ggml passes a live tensor with its sources, and userdata per the graph's contract.
    let prepared = ffi::guard(
        "spark_attn",
        Err(KernelError::Param("panic while validating".into())),
        || unsafe { prepare(dst, userdata) },
    );
    let op = match prepared {
        Ok(op) => op,
        Err(e) => {
            if ith_u == 0 {
                // SAFETY: userdata is null or a live AttnParams (contract).
                let layer =
                    unsafe { userdata.cast::<AttnParams>().as_ref() }.map_or(-1, |p| p.layer);
                eprintln!("spark-backend: spark_attn: layer {layer}: {e}");
            }
            // SAFETY: dst is live; fill_nan checks its type and data before writing its share.
            unsafe { crate::tensor::fill_nan_share(dst, ith_u, nth_u) };
            return;
        }
    };
    // SAFETY: the op was validated against dst's sources; ggml gives each thread its own ith
    // and runs no other node on dst concurrently.
    let ok = ffi::guard("spark_attn", false, || {
        unsafe { op.run(ith_u, nth_u) };
        true
    });
    if !ok {
        // SAFETY: as above; the rows written are those this thread owns.
        unsafe { op.fill_owned_rows(ith_u, nth_u, f32::NAN) };
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
    // SAFETY: per the contract, dst is null or live.
    let dst_ref =
        unsafe { dst.as_ref() }.ok_or_else(|| KernelError::Shape("dst is null".into()))?;
    // SAFETY: userdata is null or a live AttnParams.
    let params = unsafe { userdata.cast::<AttnParams>().as_ref() }
        .ok_or_else(|| KernelError::Param("spark_attn_params (userdata) is null".into()))?;
    let src = |i: usize, name: &str| -> Result<TensorView, KernelError> {
        // SAFETY: sources are null (reported) or live tensors with valid data.
        unsafe { TensorView::from_raw(dst_ref.src[i]) }
            .map_err(|e| KernelError::Shape(format!("{name}: {e}")))
    };
    let q = src(0, "q")?;
    let k = src(1, "k")?;
    let v = src(2, "v")?;
    let mask = src(3, "mask")?;
    // SAFETY: dst is live.
    let out = unsafe { TensorView::from_raw(dst) }
        .map_err(|e| KernelError::Shape(format!("dst: {e}")))?;
    SparseAttention::new(&q, &k, &v, &mask, &out, params)
}
