//! `spark_rope`'s CUDA plan (kernel in `rope.cu`, this folder): the checks of
//! [`super::RopeCall`] plus the kernel's 32-bit limits, and the one launch (one block per row)
//! as data, a pure function of the tensors' metadata that the tests run on host tensors and
//! the CPU emulation (tests/cuda_emu) runs through g++.

use super::RopeCall;
use crate::cuda::CudaSource;
use crate::KernelError;
use llama_cpp_sys_2 as sys;
use std::ffi::c_void;

/// rope.cu.
pub(crate) const KERNELS: CudaSource = CudaSource {
    name: "rope.cu",
    text: include_str!("rope.cu"),
};

/// Threads per block (`SPARK_ROPE_THREADS` of rope.cu).
pub const THREADS: u32 = 128;

/// `struct SparkRopeArgs` of rope.cu: the kernel's one parameter, by value.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeArgs {
    /// Device address of x.
    pub x: u64,
    /// Device address of the positions.
    pub pos: u64,
    /// Device address of dst.
    pub dst: u64,
    /// f32 elements between x's heads.
    pub x_head: i64,
    /// f32 elements between x's tokens.
    pub x_token: i64,
    /// H.
    pub head_dim: i32,
    /// Heads per token.
    pub n_head: i32,
    /// The first part's width.
    pub r: i32,
    /// 0.
    pub reserved: i32,
    /// The frequency base.
    pub freq_base: f32,
    /// The frequency scale.
    pub freq_scale: f32,
    /// The output scale.
    pub scale: f32,
    /// 0.
    pub reserved_f: f32,
}

// No padding: 3 addresses, 2 i64, 4 i32, 4 f32 (the emulation and the launcher copy its bytes).
const _: () = assert!(std::mem::size_of::<RopeArgs>() == 3 * 8 + 2 * 8 + 4 * 4 + 4 * 4);

/// One launch of rope.cu's `spark_rope`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopePlan {
    /// The argument block.
    pub args: RopeArgs,
    /// Blocks: one per row.
    pub grid: u32,
    /// Threads per block.
    pub block: u32,
}

/// Largest value the kernel indexes with `int` (rows, strides inside a row).
const MAX_INT: usize = i32::MAX as usize;

impl RopePlan {
    /// The plan of a checked call, whose tensors' addresses are device addresses.
    pub fn new(call: &RopeCall) -> Result<Self, KernelError> {
        let rows = call.n_rows();
        let h = call.head_dim();
        if rows == 0 || h == 0 {
            return Err(KernelError::Shape(format!(
                "{rows} rows of {h} values: nothing to compute"
            )));
        }
        if rows > MAX_INT || h > MAX_INT || call.n_head() > MAX_INT {
            return Err(KernelError::Shape(format!(
                "{rows} rows of {h} values: beyond the kernel's 32-bit indices"
            )));
        }
        let int = |v: usize| v as i32;
        let p = &call.params;
        Ok(RopePlan {
            args: RopeArgs {
                x: call.x.data as u64,
                pos: call.pos.data as u64,
                dst: call.dst.data as u64,
                x_head: (call.x.nb[1] / 4) as i64,
                x_token: (call.x.nb[2] / 4) as i64,
                head_dim: int(h),
                n_head: int(call.n_head()),
                r: p.r,
                reserved: 0,
                freq_base: p.freq_base,
                freq_scale: p.freq_scale,
                scale: p.scale,
                reserved_f: 0.0,
            },
            grid: rows as u32,
            block: THREADS,
        })
    }
}

/// Checks `spark_rope`'s node into its plan.
///
/// # Safety
/// As [`RopeCall::read`].
pub unsafe fn check(
    dst: *const sys::ggml_tensor,
    params_block: *const c_void,
) -> Result<RopePlan, KernelError> {
    // SAFETY: forwarded contract.
    let call = unsafe { RopeCall::read(dst, params_block) }?;
    RopePlan::new(&call)
}
