//! The one entry protocol of every CUDA launcher (the CUDA counterpart of `crate::op::enter`)
//! and the table of launchers registered with ggml-cuda.

use super::driver::Gpu;
use super::hook::{CustomLaunch, RegisterCustomOp};
use crate::ffi::panic_message;
use crate::op::report;
use crate::params;
use crate::KernelError;
use llama_cpp_sys_2 as sys;
use std::ffi::{c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// A Spark op's CUDA launcher, as [`enter`] sees it.
pub(crate) trait CudaOp: Sized {
    /// The op's registry name (`spark_ffn_fused`, ...), used in messages.
    const NAME: &'static str;

    /// Checks `dst`, its sources and `userdata` from metadata only (`super::check`): no read of
    /// tensor data, no CUDA call.
    ///
    /// # Safety
    /// `dst` is null or a live tensor whose sources are null or live; `userdata` is null or the
    /// op's params struct.
    unsafe fn check(
        dst: *const sys::ggml_tensor,
        userdata: *const c_void,
    ) -> Result<Self, KernelError>;

    /// Enqueues the op's kernels on `gpu`'s stream.
    ///
    /// # Safety
    /// The device addresses in `self` are live device memory of `gpu`'s device with the checked
    /// shapes until the stream has run the work.
    unsafe fn launch(&self, gpu: &Gpu) -> Result<(), String>;
}

/// Runs one launcher call for ggml-cuda: check, launch, and on any failure one report line,
/// dst set to NaN on the stream where possible, and a non-zero return. Never unwinds.
///
/// # Safety
/// As ggml-cuda calls a `ggml_backend_cuda_custom_launch_t`: `dst` is null or a live custom-op
/// tensor whose data and sources' data are device memory of `device`, `stream` is ggml-cuda's
/// live stream on that device, `userdata` is null or the op's params struct in host memory.
pub(crate) unsafe fn enter<Op: CudaOp>(
    dst: *mut sys::ggml_tensor,
    device: c_int,
    stream: *mut c_void,
    userdata: *mut c_void,
) -> c_int {
    // SAFETY: userdata is null or a Spark params struct (contract).
    let layer = unsafe { params::layer_of(userdata) };
    let outcome = catch_unwind(AssertUnwindSafe(|| -> Result<(), (String, bool)> {
        // SAFETY: forwarded contract.
        let op = unsafe { Op::check(dst, userdata) }.map_err(|e| (e.to_string(), true))?;
        // SAFETY: forwarded contract (ggml's stream on `device`, alive during this call).
        let gpu = unsafe { Gpu::borrow(device, stream) }.map_err(|e| (e, false))?;
        // SAFETY: the checked device addresses are live for the stream's work (contract).
        unsafe { op.launch(&gpu) }.map_err(|e| (e, true))
    }));
    let (message, fill) = match outcome {
        Ok(Ok(())) => return 0,
        Ok(Err(e)) => e,
        Err(p) => (format!("panic: {}", panic_message(p.as_ref())), true),
    };
    report(Op::NAME, layer, &message);
    if fill {
        // SAFETY: forwarded contract.
        unsafe { fill_dst_nan(dst, device, stream) };
    }
    1
}

/// Best effort: sets dst's bytes (`ggml_nbytes`) to 0xFF on the stream. Does nothing when dst
/// is unusable or the CUDA libraries are not loadable.
///
/// # Safety
/// As for [`enter`].
unsafe fn fill_dst_nan(dst: *mut sys::ggml_tensor, device: c_int, stream: *mut c_void) {
    if dst.is_null() || super::driver::libraries().is_err() {
        return;
    }
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: dst is a live tensor (contract); metadata only.
        let (data, bytes) = unsafe { ((*dst).data, sys::ggml_nbytes(dst)) };
        if data.is_null() || bytes == 0 {
            return;
        }
        // SAFETY: forwarded contract.
        if let Ok(gpu) = unsafe { Gpu::borrow(device, stream) } {
            // SAFETY: dst's data is device memory of this device covering ggml_nbytes(dst),
            // written by this node only.
            let _ = unsafe { gpu.fill_nan(data as u64, bytes) };
        }
    }));
}

/// Defines the `extern "C"` launcher `$name` of the [`CudaOp`] `$op`.
macro_rules! cuda_launcher {
    ($(#[$doc:meta])* $name:ident => $op:ty) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// As ggml-cuda calls a `ggml_backend_cuda_custom_launch_t` (`cuda::launch::enter`).
        pub(crate) unsafe extern "C" fn $name(
            dst: *mut ::llama_cpp_sys_2::ggml_tensor,
            device: ::std::ffi::c_int,
            stream: *mut ::std::ffi::c_void,
            userdata: *mut ::std::ffi::c_void,
        ) -> ::std::ffi::c_int {
            // SAFETY: forwarded contract of this function.
            unsafe { $crate::cuda::launch::enter::<$op>(dst, device, stream, userdata) }
        }
    };
}
pub(crate) use cuda_launcher;

/// A CPU custom op function and its CUDA launcher.
#[derive(Clone, Copy)]
pub struct Launcher {
    /// The op's registry name.
    pub name: &'static str,
    /// The `ggml_custom_op_t` the graph passes to `ggml_custom_4d` (the registry's proc).
    pub fun: unsafe extern "C" fn(*mut sys::ggml_tensor, c_int, c_int, *mut c_void),
    /// What ggml-cuda calls instead for that node.
    pub launch: CustomLaunch,
}

/// Every launcher registered with ggml-cuda. Adding an op is one row here.
pub const LAUNCHERS: &[Launcher] = &[
    Launcher {
        name: "spark_ffn_fused",
        fun: crate::ffn::op::spark_ffn_fused,
        launch: super::ffn::launch_fused,
    },
    Launcher {
        name: "spark_ffn_sum",
        fun: crate::ffn::op::spark_ffn_sum,
        launch: super::ffn::launch_sum,
    },
    Launcher {
        name: "spark_ffn_up",
        fun: crate::ffn::op::spark_ffn_up,
        launch: super::ffn::launch_up,
    },
    Launcher {
        name: "spark_ffn_down",
        fun: crate::ffn::op::spark_ffn_down,
        launch: super::ffn::launch_down,
    },
    Launcher {
        name: "spark_attn",
        fun: crate::attention::op::spark_attn,
        launch: super::attn::launch_attn,
    },
];

/// Registers every launcher through ggml-cuda's hook; the names registered, or why none was.
///
/// # Safety
/// `register` is the hook's registration function of this process's ggml-cuda.
pub(crate) unsafe fn register_all(register: RegisterCustomOp) -> Result<Vec<&'static str>, String> {
    let mut done = Vec::new();
    let mut refused = Vec::new();
    for l in LAUNCHERS {
        // SAFETY: a function of the hook's type (contract) given two valid function pointers
        // of the declared types, which live for the whole process.
        if unsafe { register(Some(l.fun), Some(l.launch)) } {
            done.push(l.name);
        } else {
            refused.push(l.name);
        }
    }
    if done.is_empty() {
        return Err(format!(
            "ggml-cuda refused every launcher ({})",
            refused.join(", ")
        ));
    }
    Ok(done)
}
