//! The `spark_attn` launcher ggml-cuda calls (feature `cuda`; `crate::cuda::launch::enter`):
//! it checks its node into a `super::cuda_plan::AttnPlan`, takes the plan's size of scratch from
//! the stream's arena (`crate::cuda::launch::scratch`), enqueues the plan's launches slab after
//! slab on ggml's stream; only when `crate::cuda::device_stats` is on, it
//! copies the kept counts to the host (one stream synchronization) for the statistics table.

use super::cuda_plan::{AttnArgs, AttnPlan, KERNELS};
use crate::cuda::driver::Gpu;
use crate::cuda::launch::{self, by_value_args, cuda_launcher, CudaOp};
use crate::{stats, KernelError};
use llama_cpp_sys_2 as sys;
use std::ffi::c_void;

// SAFETY: AttnArgs is #[repr(C)], plain integers and one f32 with no padding (size
// asserted in super::cuda_plan), laid out as `struct SparkAttnArgs` of attn.cu, which every kernel takes
// by value.
by_value_args!(AttnArgs);

cuda_launcher! {
    /// `spark_attn` on the GPU (attn.cu).
    launch_attn => AttnPlan
}

impl CudaOp for AttnPlan {
    const NAME: &'static str = "spark_attn";

    unsafe fn check(
        dst: *const sys::ggml_tensor,
        params_block: *const c_void,
    ) -> Result<Self, KernelError> {
        // SAFETY: forwarded contract.
        unsafe { super::cuda_plan::check(dst, params_block) }
    }

    unsafe fn launch(&self, gpu: &Gpu) -> Result<(), String> {
        if self.n_queries() == 0 {
            return Ok(());
        }
        let base = launch::scratch(gpu, self.scratch_bytes())?;
        let stats = crate::cuda::device_stats() && !launch::capturing(gpu)?;
        let mut counts: Vec<u8> = Vec::new();
        for slab in &self.slabs {
            let launches = self.slab_launches(slab, base).map_err(|e| e.to_string())?;
            for l in &launches {
                // SAFETY: the plan's addresses are live device memory with the checked
                // shapes (contract), the scratch holds scratch_bytes() bytes at base, and
                // the argument block is the one parameter of every attn.cu kernel.
                unsafe {
                    launch::enqueue(gpu, &KERNELS, l.kernel.name(), l.grid, l.block, &l.args)?
                };
            }
            if stats {
                let qs = slab.ns * slab.nt * self.layout.n_head;
                let off = self.scratch.count;
                counts.extend(launch::copy_counts(gpu, base, off..off + 4 * qs)?);
            }
        }
        if stats {
            let kept = launch::sum_counts(gpu, &counts)?;
            stats::record_attn(self.layout.layer, kept, self.n_queries() as u64);
        }
        Ok(())
    }
}
