//! The `spark_rope` launcher ggml-cuda calls (feature `cuda`; `crate::cuda::launch::enter`):
//! one launch of rope.cu's `spark_rope` on ggml's stream, no scratch.

use super::cuda_plan::{RopeArgs, RopePlan, KERNELS};
use crate::cuda::driver::Gpu;
use crate::cuda::launch::{self, by_value_args, cuda_launcher, CudaOp};
use crate::KernelError;
use llama_cpp_sys_2 as sys;
use std::ffi::c_void;

// SAFETY: RopeArgs is #[repr(C)], plain integers and f32 with no padding (size asserted in
// super::cuda_plan), laid out as `struct SparkRopeArgs` of rope.cu, which the kernel takes by
// value.
by_value_args!(RopeArgs);

cuda_launcher! {
    /// `spark_rope` on the GPU (rope.cu).
    launch_rope => RopePlan
}

impl CudaOp for RopePlan {
    const NAME: &'static str = "spark_rope";

    unsafe fn check(
        dst: *const sys::ggml_tensor,
        params_block: *const c_void,
    ) -> Result<Self, KernelError> {
        // SAFETY: forwarded contract.
        unsafe { super::cuda_plan::check(dst, params_block) }
    }

    unsafe fn launch(&self, gpu: &Gpu) -> Result<(), String> {
        // SAFETY: the plan's addresses are live device memory with the checked shapes
        // (contract); the argument block is the kernel's one parameter.
        unsafe {
            launch::enqueue(
                gpu,
                &KERNELS,
                "spark_rope",
                (self.grid, 1, 1),
                self.block,
                &self.args,
            )
        }
    }
}
