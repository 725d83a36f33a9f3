//! CUDA launchers of the four Spark FFN ops (`kernels/ffn.cu`), matching the CPU ops of
//! `crate::ffn::op` (docs/INTERFACES.md): same outputs and layouts, exact zeros for dropped
//! neurons, chunk partials summed in increasing neuron order, deterministic.
//!
//! Per op, the kernels enqueued on ggml's stream:
//! - `spark_ffn_fused`: threshold (one block per token) -> up (one warp per neuron; gated
//!   values `u` [F, T] in scratch, exact zeros) -> for T <= [`SPARSE_MAX_TOKENS`] compaction per
//!   (token, chunk) and a V accumulation over the compacted neurons (one thread per output
//!   value), else the tiled V accumulation (32 tokens x 64 columns per block; V rows no token
//!   of the tile uses are skipped). Both accumulate the same products in the same order.
//! - `spark_ffn_up`: threshold -> up, straight into dst.
//! - `spark_ffn_down`: the tiled V accumulation over all F neurons (one chunk).
//! - `spark_ffn_sum`: one thread per output value, partials added in chunk order.
//!
//! Scratch buffers are stream-ordered allocations (`cuMemAllocAsync`), freed on the stream when
//! the launcher returns.

use super::check::{self, DownPlan, FusedPlan, StagePlan, SumPlan, UpPlan};
use super::driver::Gpu;
use super::launch::{cuda_launcher, CudaOp};
use crate::{stats, topk, KernelError};
use cudarc::driver::{CudaFunction, CudaSlice, LaunchArgs, LaunchConfig, PushKernelArg};
use llama_cpp_sys_2 as sys;
use std::ffi::c_void;

/// The fused path compacts active neurons per token up to this many tokens, and uses the tiled
/// accumulation above (where nearly every V row is active for some token of a tile).
pub const SPARSE_MAX_TOKENS: usize = 8;

const SOURCE: &str = "ffn.cu";

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

fn int(name: &str, v: usize) -> Result<i32, String> {
    i32::try_from(v).map_err(|_| format!("{name} = {v} beyond the kernels' 32-bit indices"))
}

fn grid(name: &str, v: usize, max: usize) -> Result<u32, String> {
    if v == 0 || v > max {
        return Err(format!("{name}: {v} blocks outside 1..={max}"));
    }
    Ok(v as u32)
}

fn cfg(g: (u32, u32, u32), threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: g,
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Enqueues a built launch.
///
/// # Safety
/// The arguments match the kernel's parameters and point at live device memory.
unsafe fn run(mut args: LaunchArgs<'_>, c: LaunchConfig, kernel: &str) -> Result<(), String> {
    // SAFETY: per the contract.
    unsafe { args.launch(c) }
        .map(|_| ())
        .map_err(|e| format!("{kernel}: launch failed: {e:?}"))
}

fn alloc<T: cudarc::driver::DeviceRepr>(gpu: &Gpu, n: usize) -> Result<CudaSlice<T>, String> {
    // SAFETY: uninitialised device memory; every kernel below writes before it reads.
    unsafe { gpu.stream.alloc::<T>(n.max(1)) }.map_err(|e| format!("scratch of {n}: {e:?}"))
}

fn function(gpu: &Gpu, kernel: &str) -> Result<CudaFunction, String> {
    gpu.device.function(SOURCE, kernel)
}

/// Thresholds and kept counts per token, then u [F, T] (neuron-major) at `u`.
///
/// # Safety
/// `st`'s addresses are live device memory with its shapes; `u` holds F * T floats.
unsafe fn up_stage(gpu: &Gpu, st: &StagePlan, u: u64) -> Result<CudaSlice<u32>, String> {
    let (f, t) = (int("F", st.f)?, int("n_tokens", st.n_tokens)?);
    let dense = i32::from(st.dense());
    let q = if st.dense() {
        0.0
    } else {
        topk::norm_ppf(1.0 - st.k as f64 / st.f as f64)
    };
    let theta = alloc::<f32>(gpu, st.n_tokens)?;
    let kept = alloc::<u32>(gpu, st.n_tokens)?;
    let k = function(gpu, "spark_ffn_threshold")?;
    let mut a = gpu.stream.launch_builder(&k);
    a.arg(&st.s)
        .arg(&f)
        .arg(&dense)
        .arg(&q)
        .arg(&theta)
        .arg(&kept);
    // SAFETY: spark_ffn_threshold(const float*, int, int, double, float*, u32*); s holds T rows
    // of F floats; theta and kept hold T values.
    unsafe {
        run(
            a,
            cfg((grid("tokens", st.n_tokens, i32::MAX as usize)?, 1, 1), 256),
            "spark_ffn_threshold",
        )?
    };

    let (r_f, d2) = (int("r_f", st.r_f())?, int("K2 columns", st.k2.cols)?);
    let (h_stride, k2_stride) = (st.h_stride as i64, st.k2.row_stride as i64);
    let k2_type = st.k2.ty as i32;
    let k = function(gpu, "spark_ffn_up")?;
    let mut a = gpu.stream.launch_builder(&k);
    a.arg(&st.s)
        .arg(&f)
        .arg(&t)
        .arg(&theta)
        .arg(&dense)
        .arg(&st.h)
        .arg(&h_stride)
        .arg(&r_f)
        .arg(&st.k2.ptr)
        .arg(&k2_stride)
        .arg(&k2_type)
        .arg(&d2)
        .arg(&u);
    let blocks = grid("neuron groups", st.f.div_ceil(8), i32::MAX as usize)?;
    // SAFETY: the parameters of spark_ffn_up in order; h rows of D floats at h_stride, K2 F rows
    // of d2 values at k2_stride (checked), u F * T floats.
    unsafe { run(a, cfg((blocks, 1, 1), 256), "spark_ffn_up")? };
    Ok(kept)
}

/// Adds the kept counts to the statistics table when [`super::device_stats`] is on (waits for
/// the stream: only in that mode).
fn record(gpu: &Gpu, st: &StagePlan, kept: &CudaSlice<u32>) -> Result<(), String> {
    if !super::device_stats() {
        return Ok(());
    }
    let counts = gpu
        .stream
        .clone_dtoh(kept)
        .map_err(|e| format!("statistics: {e:?}"))?;
    gpu.stream
        .synchronize()
        .map_err(|e| format!("statistics: {e:?}"))?;
    let total: u64 = counts.iter().take(st.n_tokens).map(|&c| u64::from(c)).sum();
    stats::record_ffn(st.layer, total, st.n_tokens as u64, st.f as u64);
    Ok(())
}

/// The tiled V accumulation: chunk c of `p` ([c*F/p, (c+1)*F/p)) into plane c of `out`.
///
/// # Safety
/// `u` holds F * T floats, `v` F rows of D values, `out` p planes of T rows of `out_row` floats.
#[allow(clippy::too_many_arguments)]
unsafe fn v_tiled(
    gpu: &Gpu,
    u: u64,
    f: usize,
    t: usize,
    p: usize,
    v: &check::GpuWeight,
    out: u64,
    out_row: usize,
    plane: usize,
) -> Result<(), String> {
    let (fi, ti, pi, di) = (
        int("F", f)?,
        int("n_tokens", t)?,
        int("P", p)?,
        int("D", v.cols)?,
    );
    let (v_stride, v_type) = (v.row_stride as i64, v.ty as i32);
    let (out_row, plane) = (out_row as i64, plane as i64);
    let k = function(gpu, "spark_ffn_v_tiled")?;
    let mut a = gpu.stream.launch_builder(&k);
    a.arg(&u)
        .arg(&fi)
        .arg(&ti)
        .arg(&pi)
        .arg(&v.ptr)
        .arg(&v_stride)
        .arg(&v_type)
        .arg(&di)
        .arg(&out)
        .arg(&out_row)
        .arg(&plane);
    let g = (
        grid("column tiles", v.cols.div_ceil(64), i32::MAX as usize)?,
        grid("token tiles", t.div_ceil(32), 65535)?,
        grid("chunks", p, 65535)?,
    );
    // SAFETY: the parameters of spark_ffn_v_tiled in order, per this function's contract.
    unsafe { run(a, cfg(g, 256), "spark_ffn_v_tiled") }
}

impl CudaOp for FusedPlan {
    const NAME: &'static str = "spark_ffn_fused";

    unsafe fn check(
        dst: *const sys::ggml_tensor,
        userdata: *const c_void,
    ) -> Result<Self, KernelError> {
        // SAFETY: forwarded contract.
        unsafe { check::fused(dst, userdata) }
    }

    unsafe fn launch(&self, gpu: &Gpu) -> Result<(), String> {
        let st = &self.stage;
        let (f, t, p, d) = (st.f, st.n_tokens, self.p, st.d);
        let u = alloc::<f32>(gpu, f * t)?;
        let u_ptr = device_ptr(gpu, &u);
        // SAFETY: checked plan; u holds F * T floats.
        let kept = unsafe { up_stage(gpu, st, u_ptr)? };
        if t <= SPARSE_MAX_TOKENS {
            let (fi, ti, pi, di) = (
                int("F", f)?,
                int("n_tokens", t)?,
                int("P", p)?,
                int("D", d)?,
            );
            let idx = alloc::<u32>(gpu, f * t)?;
            let count = alloc::<u32>(gpu, p * t)?;
            let k = function(gpu, "spark_ffn_compact")?;
            let mut a = gpu.stream.launch_builder(&k);
            a.arg(&u).arg(&fi).arg(&ti).arg(&pi).arg(&idx).arg(&count);
            let g = (
                grid("chunks", p, i32::MAX as usize)?,
                grid("tokens", t, 65535)?,
                1,
            );
            // SAFETY: spark_ffn_compact(u, F, T, P, idx[T*F], count[T*P]).
            unsafe { run(a, cfg(g, 256), "spark_ffn_compact")? };
            let (v_stride, v_type) = (self.v.row_stride as i64, self.v.ty as i32);
            let k = function(gpu, "spark_ffn_v_sparse")?;
            let mut a = gpu.stream.launch_builder(&k);
            a.arg(&u)
                .arg(&fi)
                .arg(&ti)
                .arg(&pi)
                .arg(&idx)
                .arg(&count)
                .arg(&self.v.ptr)
                .arg(&v_stride)
                .arg(&v_type)
                .arg(&di)
                .arg(&self.out);
            let g = (
                grid("column blocks", d.div_ceil(256), i32::MAX as usize)?,
                grid("tokens", t, 65535)?,
                grid("chunks", p, 65535)?,
            );
            // SAFETY: spark_ffn_v_sparse's parameters in order; out is [D, T, P] contiguous.
            unsafe { run(a, cfg(g, 256), "spark_ffn_v_sparse")? };
        } else {
            // SAFETY: u F * T floats, V F rows of D, out P planes of T rows of D (contiguous).
            unsafe { v_tiled(gpu, u_ptr, f, t, p, &self.v, self.out, d, d * t)? };
        }
        record(gpu, st, &kept)
    }
}

impl CudaOp for UpPlan {
    const NAME: &'static str = "spark_ffn_up";

    unsafe fn check(
        dst: *const sys::ggml_tensor,
        userdata: *const c_void,
    ) -> Result<Self, KernelError> {
        // SAFETY: forwarded contract.
        unsafe { check::up(dst, userdata) }
    }

    unsafe fn launch(&self, gpu: &Gpu) -> Result<(), String> {
        // SAFETY: checked plan; dst is u [n_tokens, F] contiguous (F * T floats).
        let kept = unsafe { up_stage(gpu, &self.stage, self.out)? };
        record(gpu, &self.stage, &kept)
    }
}

impl CudaOp for DownPlan {
    const NAME: &'static str = "spark_ffn_down";

    unsafe fn check(
        dst: *const sys::ggml_tensor,
        _userdata: *const c_void,
    ) -> Result<Self, KernelError> {
        // SAFETY: forwarded contract.
        unsafe { check::down(dst) }
    }

    unsafe fn launch(&self, gpu: &Gpu) -> Result<(), String> {
        let f = self.v.rows;
        // SAFETY: checked plan: u F * T floats, V F rows of D, dst T rows of out_row floats.
        unsafe {
            v_tiled(
                gpu,
                self.u,
                f,
                self.n_tokens,
                1,
                &self.v,
                self.out,
                self.out_row,
                0,
            )
        }
    }
}

impl CudaOp for SumPlan {
    const NAME: &'static str = "spark_ffn_sum";

    unsafe fn check(
        dst: *const sys::ggml_tensor,
        _userdata: *const c_void,
    ) -> Result<Self, KernelError> {
        // SAFETY: forwarded contract.
        unsafe { check::sum(dst) }
    }

    unsafe fn launch(&self, gpu: &Gpu) -> Result<(), String> {
        let (di, ti, pi) = (
            int("D", self.d)?,
            int("n_tokens", self.n_tokens)?,
            int("P", self.p)?,
        );
        let out_row = self.out_row as i64;
        let k = function(gpu, "spark_ffn_sum")?;
        let mut a = gpu.stream.launch_builder(&k);
        a.arg(&self.partials)
            .arg(&di)
            .arg(&ti)
            .arg(&pi)
            .arg(&self.out)
            .arg(&out_row);
        let blocks = grid(
            "element blocks",
            (self.d * self.n_tokens).div_ceil(256),
            i32::MAX as usize,
        )?;
        // SAFETY: spark_ffn_sum(partials [D, T, P] contiguous, D, T, P, out, out_row).
        unsafe { run(a, cfg((blocks, 1, 1), 256), "spark_ffn_sum") }
    }
}

/// The device address of a scratch buffer.
fn device_ptr<T>(gpu: &Gpu, s: &CudaSlice<T>) -> u64 {
    use cudarc::driver::DevicePtr;
    let (p, _sync) = s.device_ptr(&gpu.stream);
    p
}
