//! The FFN launchers ggml-cuda calls (feature `cuda`; `crate::cuda::launch::enter`): each
//! checks its node into a plan of `super::cuda_plan`, takes the plan's layout of scratch from
//! the stream's arena (`crate::cuda::launch::scratch`: no allocation inside a captured CUDA
//! graph) and enqueues the plan's launches on ggml's stream; only when `crate::cuda::device_stats` is on (and the stream
//! is not being captured into a CUDA graph), it copies the kept counts to the host (one stream
//! synchronization) for the statistics table.

use super::cuda_plan::{
    Arg, DownPlan, FusedPlan, Launch, ScratchLayout, StagePlan, SumPlan, UpPlan, KERNELS,
};
use crate::cuda::driver::Gpu;
use crate::cuda::launch::{self, cuda_launcher, CudaOp, KernelArgs};
use crate::{stats, KernelError};
use cudarc::driver::{LaunchArgs, PushKernelArg};
use llama_cpp_sys_2 as sys;
use std::ffi::c_void;

cuda_launcher! {
    /// `spark_ffn_fused` on the GPU.
    launch_fused => FusedPlan
}
cuda_launcher! {
    /// `spark_ffn_sum` on the GPU.
    launch_sum => SumPlan
}
cuda_launcher! {
    /// `spark_ffn_up` on the GPU.
    launch_up => UpPlan
}
cuda_launcher! {
    /// `spark_ffn_down` on the GPU.
    launch_down => DownPlan
}

impl KernelArgs for [Arg] {
    fn push<'a>(&'a self, launch: &mut LaunchArgs<'a>) {
        for a in self {
            match a {
                Arg::Ptr(p) => launch.arg(p),
                Arg::I32(i) => launch.arg(i),
                Arg::I64(i) => launch.arg(i),
                Arg::F64(x) => launch.arg(x),
            };
        }
    }

    fn pointers(&self) -> Vec<*mut c_void> {
        self.iter()
            .map(|a| match a {
                Arg::Ptr(p) => std::ptr::from_ref(p).cast_mut().cast(),
                Arg::I32(i) => std::ptr::from_ref(i).cast_mut().cast(),
                Arg::I64(i) => std::ptr::from_ref(i).cast_mut().cast(),
                Arg::F64(x) => std::ptr::from_ref(x).cast_mut().cast(),
            })
            .collect()
    }
}

/// Enqueues `launches` on the stream, in order.
///
/// # Safety
/// Every address in the launches' arguments is live device memory of `gpu`'s device with the
/// shapes the plan checked, until the stream has run the work.
unsafe fn enqueue(gpu: &Gpu, launches: &[Launch]) -> Result<(), String> {
    for l in launches {
        // SAFETY: the arguments are the kernel's parameters in order with their C types (the
        // plan builds them so; tests/cuda_emu checks kinds and counts against ffn.cu), and
        // every address is live device memory (contract).
        unsafe { launch::enqueue(gpu, &KERNELS, l.kernel.name(), l.grid, l.block, &l.args[..])? };
    }
    Ok(())
}

/// Runs a plan that thresholds tokens (`spark_ffn_fused`, `spark_ffn_up`): scratch of
/// `layout`, the plan's launches over it, and when `crate::cuda::device_stats` is on the kept
/// counts (`layout.kept_len` u32 at `layout.kept`) added to the statistics table (waits for the
/// stream: only in that mode).
///
/// # Safety
/// `launches` gives the launches of a checked plan whose tensors are live device memory of
/// `gpu`'s device, with its scratch at the address it is given.
unsafe fn run_stage(
    gpu: &Gpu,
    st: &StagePlan,
    layout: ScratchLayout,
    launches: impl FnOnce(u64) -> Result<Vec<Launch>, String>,
) -> Result<(), String> {
    let base = launch::scratch(gpu, layout.total)?;
    // SAFETY: per the contract; the scratch holds layout.total bytes at base.
    unsafe { enqueue(gpu, &launches(base)?)? };
    if crate::cuda::device_stats() && !launch::capturing(gpu)? {
        let counts =
            launch::copy_counts(gpu, base, layout.kept..layout.kept + 4 * layout.kept_len)?;
        let total = launch::sum_counts(gpu, &counts)?;
        stats::record_ffn(st.layer, total, st.n_tokens as u64, st.f as u64);
    }
    Ok(())
}

impl CudaOp for FusedPlan {
    const NAME: &'static str = "spark_ffn_fused";

    unsafe fn check(
        dst: *const sys::ggml_tensor,
        params_block: *const c_void,
    ) -> Result<Self, KernelError> {
        // SAFETY: forwarded contract.
        unsafe { super::cuda_plan::fused(dst, params_block) }
    }

    unsafe fn launch(&self, gpu: &Gpu) -> Result<(), String> {
        // SAFETY: the checked plan's tensors (contract).
        unsafe { run_stage(gpu, &self.stage, self.scratch(), |base| self.launches(base)) }
    }
}

impl CudaOp for UpPlan {
    const NAME: &'static str = "spark_ffn_up";

    unsafe fn check(
        dst: *const sys::ggml_tensor,
        params_block: *const c_void,
    ) -> Result<Self, KernelError> {
        // SAFETY: forwarded contract.
        unsafe { super::cuda_plan::up(dst, params_block) }
    }

    unsafe fn launch(&self, gpu: &Gpu) -> Result<(), String> {
        // SAFETY: the checked plan's tensors (contract); dst is u [n_tokens, F] contiguous.
        unsafe { run_stage(gpu, &self.stage, self.scratch(), |base| self.launches(base)) }
    }
}
impl CudaOp for DownPlan {
    const NAME: &'static str = "spark_ffn_down";

    unsafe fn check(
        dst: *const sys::ggml_tensor,
        _userdata: *const c_void,
    ) -> Result<Self, KernelError> {
        // SAFETY: forwarded contract.
        unsafe { super::cuda_plan::down(dst) }
    }

    unsafe fn launch(&self, gpu: &Gpu) -> Result<(), String> {
        // SAFETY: checked plan: u F * T floats, V F rows of D, dst T rows of out_row floats.
        unsafe { enqueue(gpu, &self.launches()?) }
    }
}

impl CudaOp for SumPlan {
    const NAME: &'static str = "spark_ffn_sum";

    unsafe fn check(
        dst: *const sys::ggml_tensor,
        _userdata: *const c_void,
    ) -> Result<Self, KernelError> {
        // SAFETY: forwarded contract.
        unsafe { super::cuda_plan::sum(dst) }
    }

    unsafe fn launch(&self, gpu: &Gpu) -> Result<(), String> {
        // SAFETY: checked plan: partials [D, T, P] contiguous, dst T rows of out_row floats.
        unsafe { enqueue(gpu, &self.launches()?) }
    }
}
