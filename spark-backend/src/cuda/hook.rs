//! The ggml-cuda hook of patch 0008 as Rust sees it: the launcher type ggml-cuda calls for a
//! `GGML_OP_CUSTOM` node, the registration function it exports through its registry entry, and
//! what is registered per op ([`Launcher`]).
//! Declared by hand here; `build.rs` compiles a C probe that checks a C function with exactly
//! these signatures against the typedefs of the patched `ggml-cuda.h` once they exist
//! (`tests/cuda_hook.rs`).

use llama_cpp_sys_2 as sys;
use std::ffi::{c_int, c_void, CStr};

/// `typedef int (*ggml_backend_cuda_custom_launch_t)(struct ggml_tensor * dst, int device,
/// void * stream, void * userdata);` ggml-cuda calls it with `device` current and `stream` its
/// `cudaStream_t`; 0 = enqueued, non-zero = failed (dst NaN-filled where possible, reported).
pub type CustomLaunch = unsafe extern "C" fn(
    dst: *mut sys::ggml_tensor,
    device: c_int,
    stream: *mut c_void,
    userdata: *mut c_void,
) -> c_int;

/// `typedef bool (*ggml_backend_cuda_register_custom_op_t)(ggml_custom_op_t fun,
/// ggml_backend_cuda_custom_launch_t launch);`
pub(crate) type RegisterCustomOp =
    unsafe extern "C" fn(fun: sys::ggml_custom_op_t, launch: Option<CustomLaunch>) -> bool;

/// A Spark op's CPU function and its CUDA launcher.
#[derive(Clone, Copy)]
pub struct Launcher {
    /// The op's registry name.
    pub name: &'static str,
    /// The `ggml_custom_op_t` the graph passes to `ggml_custom_4d` (the registry's proc).
    pub fun: unsafe extern "C" fn(*mut sys::ggml_tensor, c_int, c_int, *mut c_void),
    /// What ggml-cuda calls instead for that node.
    pub launch: CustomLaunch,
}

/// The name of ggml-cuda's registry entry (`GGML_CUDA_NAME`).
pub(crate) const CUDA_REG_NAME: &CStr = c"CUDA";

/// The proc ggml-cuda's registry entry resolves to a [`RegisterCustomOp`].
pub const REGISTER_PROC: &CStr = c"ggml_backend_cuda_register_custom_op";

/// ggml-cuda's registry entry in this process, or `None` when ggml has no CUDA backend.
pub fn cuda_reg() -> Option<sys::ggml_backend_reg_t> {
    // SAFETY: a NUL-terminated name; ggml returns a registered entry or null.
    let reg = unsafe { sys::ggml_backend_reg_by_name(CUDA_REG_NAME.as_ptr()) };
    (!reg.is_null()).then_some(reg)
}

/// The hook's registration function from ggml-cuda's entry, or `None` when this ggml-cuda
/// lacks the hook (built without patch 0008).
///
/// # Safety
/// `reg` is a live registry entry.
pub(crate) unsafe fn register_fn(reg: sys::ggml_backend_reg_t) -> Option<RegisterCustomOp> {
    // SAFETY: live entry (contract), NUL-terminated name.
    let p = unsafe { sys::ggml_backend_reg_get_proc_address(reg, REGISTER_PROC.as_ptr()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: patch 0008 resolves this name to a function of exactly this type (pinned by the
    // C probe in build.rs against the patched header).
    Some(unsafe { std::mem::transmute::<*mut c_void, RegisterCustomOp>(p) })
}
