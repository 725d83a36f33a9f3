//! The one entry protocol of every CUDA launcher (the CUDA counterpart of `crate::cpu_op::enter`),
//! and what every launcher does with its plan: scratch from the stream's [`ScratchArena`] (no
//! allocation inside a captured CUDA graph), kernel launches on ggml's stream, kept counts
//! copied back for the statistics.

use super::driver::Gpu;
use super::options::CudaSource;
use crate::cpu_op::{report, report_outcome};
use crate::ffi::panic_message;
use crate::params;
use crate::KernelError;
use cudarc::driver::{LaunchArgs, LaunchConfig};
use llama_cpp_sys_2 as sys;
use std::ffi::{c_int, c_void};
use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Mutex;

/// A Spark op's CUDA launcher, as [`enter`] sees it.
pub(crate) trait CudaOp: Sized {
    /// The op's registry name (`spark_ffn_fused`, ...), used in messages.
    const NAME: &'static str;

    /// Checks `dst`, its sources and `params_block` from metadata only (`super::check`): no read of
    /// tensor data, no CUDA call.
    ///
    /// # Safety
    /// `dst` is null or a live tensor whose sources are null or live; `params_block` is null or the
    /// op's params struct.
    unsafe fn check(
        dst: *const sys::ggml_tensor,
        params_block: *const c_void,
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
/// live stream on that device. ggml-cuda's `userdata` is not read: the op's parameters are the
/// block stored in the node (`params::block`, host memory), as for the CPU ops.
pub(crate) unsafe fn enter<Op: CudaOp>(
    dst: *mut sys::ggml_tensor,
    device: c_int,
    stream: *mut c_void,
) -> c_int {
    // SAFETY: dst is null or live (contract).
    let params_block = unsafe { params::block(dst) };
    // SAFETY: params_block is null or the node's parameter block.
    let layer = unsafe { params::layer_of(params_block) };
    // The CPU entry's first check (`crate::cpu_op::enter`): a tensor whose ne and nb reach past the
    // address space or overlap (an RPC client's) is refused before any plan reads it; such a
    // source gives a NaN dst, such a dst is not written at all.
    // SAFETY: dst is null or live, its sources null or live (contract); metadata only.
    if let Some((arg, why)) = unsafe { crate::cpu_op::unaddressable_args(dst) } {
        if arg.is_some() {
            report(Op::NAME, layer, &why);
            // SAFETY: forwarded contract; dst's own reach was checked.
            unsafe { fill_dst_nan(dst, device, stream) };
        } else {
            report_outcome(Op::NAME, layer, &why, "output not written");
        }
        return 1;
    }
    let outcome = catch_unwind(AssertUnwindSafe(|| -> Result<(), (String, bool)> {
        // SAFETY: forwarded contract.
        let op = unsafe { Op::check(dst, params_block) }.map_err(|e| (e.to_string(), true))?;
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
            _userdata: *mut ::std::ffi::c_void,
        ) -> ::std::ffi::c_int {
            // SAFETY: forwarded contract of this function.
            unsafe { $crate::cuda::launch::enter::<$op>(dst, device, stream) }
        }
    };
}
pub(crate) use cuda_launcher;

/// A kernel's arguments as a plan holds them, pushed onto a launch in the kernel's parameter
/// order.
pub(crate) trait KernelArgs {
    /// Pushes every argument, in order.
    fn push<'a>(&'a self, launch: &mut LaunchArgs<'a>);

    /// The address of every argument's value, in order (`cuLaunchKernelEx`'s `kernelParams`;
    /// valid while `self` is).
    fn pointers(&self) -> Vec<*mut c_void>;
}

/// Makes the `#[repr(C)]` struct `$ty` the one by-value parameter of its kernels: cudarc's
/// `DeviceRepr` and [`KernelArgs`]. The caller vouches, in a `// SAFETY:` comment at the
/// invocation, that `$ty` is plain data without padding laid out as the kernels' C struct.
macro_rules! by_value_args {
    ($ty:ty) => {
        // SAFETY: the invocation's own SAFETY comment (plain #[repr(C)] data without padding,
        // the kernels' C struct), which is what cudarc requires of a DeviceRepr type.
        unsafe impl ::cudarc::driver::DeviceRepr for $ty {}

        impl $crate::cuda::launch::KernelArgs for $ty {
            /// The struct, the kernels' one parameter (by value).
            fn push<'a>(&'a self, launch: &mut ::cudarc::driver::LaunchArgs<'a>) {
                use ::cudarc::driver::PushKernelArg;
                launch.arg(self);
            }

            fn pointers(&self) -> Vec<*mut ::std::ffi::c_void> {
                vec![::std::ptr::from_ref(self).cast_mut().cast()]
            }
        }
    };
}
pub(crate) use by_value_args;

/// Whether launches on devices of compute capability 9.0 and up carry the programmatic stream
/// serialization attribute (programmatic dependent launch: a kernel may start launching while
/// the one before it on the stream finishes; every Spark kernel's first statement,
/// `spark_pdl_enter` / `spark_attn_pdl_enter`, waits for that one's writes). On unless
/// `SPARK_CUDA_PDL=0`; off for the process after a launch with it fails (then retried
/// without it, and said once).
static PDL: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

fn pdl_wanted(gpu: &Gpu) -> bool {
    static ENV_OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let off = *ENV_OFF.get_or_init(|| std::env::var("SPARK_CUDA_PDL").is_ok_and(|v| v == "0"));
    !off && gpu.device.target().0 >= 9 && PDL.load(std::sync::atomic::Ordering::Relaxed)
}

/// Launches `f` with the programmatic stream serialization attribute.
///
/// # Safety
/// As for [`enqueue`].
unsafe fn launch_pdl<A: KernelArgs + ?Sized>(
    gpu: &Gpu,
    f: &cudarc::driver::CudaFunction,
    grid: (u32, u32, u32),
    block: u32,
    args: &A,
) -> Result<(), String> {
    use cudarc::driver::sys as cu;
    let mut params = args.pointers();
    let mut attr = cu::CUlaunchAttribute {
        id: cu::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
        pad: [0; 4],
        // SAFETY: an all-zero union is a valid value of every member (plain integers).
        value: unsafe { std::mem::zeroed() },
    };
    attr.value.programmaticStreamSerializationAllowed = 1;
    let config = cu::CUlaunchConfig {
        gridDimX: grid.0,
        gridDimY: grid.1,
        gridDimZ: grid.2,
        blockDimX: block,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: 0,
        hStream: gpu.stream.cu_stream(),
        attrs: &mut attr,
        numAttrs: 1,
    };
    // SAFETY: the device's context is bound to this thread (Gpu::borrow); `config`, `attr` and
    // the argument values `params` points at live through the call, which copies them; the
    // arguments are the kernel's parameters in order with their C types (contract).
    let rc = unsafe {
        cu::cuLaunchKernelEx(
            &config,
            f.cu_function(),
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    };
    if rc == cu::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(format!("{rc:?}"))
    }
}

/// Enqueues kernel `name` of `source` on `gpu`'s stream: `grid` blocks of `block` threads.
///
/// # Safety
/// `args` are the kernel's parameters in order with their C types, and every device address
/// among them is live device memory of `gpu`'s device with the shapes the kernel reads, until
/// the stream has run the work.
pub(crate) unsafe fn enqueue<A: KernelArgs + ?Sized>(
    gpu: &Gpu,
    source: &'static CudaSource,
    name: &str,
    grid: (u32, u32, u32),
    block: u32,
    args: &A,
) -> Result<(), String> {
    let f = gpu.device.function(source, name)?;
    if pdl_wanted(gpu) {
        // SAFETY: per the contract.
        match unsafe { launch_pdl(gpu, &f, grid, block, args) } {
            Ok(()) => return Ok(()),
            Err(e) => {
                // said once: only the first failure finds PDL still on
                if PDL.swap(false, std::sync::atomic::Ordering::Relaxed) {
                    crate::log::say!(
                        "spark-backend: CUDA: {name}: a launch with programmatic dependent launch \
                         failed ({e}); launching without it from now on"
                    );
                }
            }
        }
    }
    let mut b = gpu.stream.launch_builder(&f);
    args.push(&mut b);
    let cfg = LaunchConfig {
        grid_dim: grid,
        block_dim: (block, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: per the contract.
    unsafe { b.launch(cfg) }
        .map(|_| ())
        .map_err(|e| format!("{name}: launch failed: {e:?}"))
}

/// Whether ggml-cuda is capturing `gpu`'s stream into a CUDA graph (patch 0008 lets it capture
/// graphs with Spark nodes): nothing may wait for the stream then, so the kept counts of the
/// statistics are not read back (with statistics on, [`super::disable_cuda_graphs`] keeps
/// ggml-cuda from capturing at all).
pub(crate) fn capturing(gpu: &Gpu) -> Result<bool, String> {
    gpu.stream
        .capture_status()
        .map(|s| s != cudarc::driver::sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
        .map_err(|e| format!("stream capture status: {e:?}"))
}

/// The scratch buffers of one ggml stream: device memory allocated with the synchronous
/// `cuMemAlloc` (never a node of a CUDA graph that ggml-cuda is capturing, unlike the
/// stream-ordered `cuMemAllocAsync`) and never freed: a graph ggml-cuda captured replays the
/// addresses it was captured with, so an outgrown buffer stays alive. A call takes the newest
/// buffer when it is large enough, else a new one ([`ScratchArena::grown`]). The launchers of
/// one stream run their kernels in stream order, so they share the buffer without overlapping
/// in time; every kernel writes a scratch element before reading it (the plans' contract).
#[derive(Debug, Default)]
pub(crate) struct ScratchArena {
    /// (device address, bytes) of every buffer, oldest first.
    buffers: Vec<(u64, usize)>,
}

/// New buffers are a whole number of these bytes.
const ARENA_GRAIN: usize = 1 << 20;

impl ScratchArena {
    /// The bytes of the buffer that replaces one of `newest` bytes when a call needs `need`
    /// (`None`: the newest one serves): at least twice the newest, so a stream holds less than
    /// about twice the largest scratch any of its calls needed, in a few buffers.
    pub(crate) fn grown(newest: Option<usize>, need: usize) -> Option<usize> {
        match newest {
            Some(have) if have >= need => None,
            have => Some(
                need.max(2 * have.unwrap_or(0))
                    .max(1)
                    .next_multiple_of(ARENA_GRAIN),
            ),
        }
    }

    /// A device address of at least `need` bytes: the newest buffer, or a new one from `alloc`.
    pub(crate) fn take(
        &mut self,
        need: usize,
        alloc: impl FnOnce(usize) -> Result<u64, String>,
    ) -> Result<u64, String> {
        let newest = self.buffers.last().copied();
        match Self::grown(newest.map(|(_, b)| b), need) {
            None => Ok(newest.map_or(0, |(p, _)| p)),
            Some(bytes) => {
                let p = alloc(bytes)?;
                self.buffers.push((p, bytes));
                Ok(p)
            }
        }
    }

    /// Bytes held in all.
    #[cfg(test)]
    fn held(&self) -> usize {
        self.buffers.iter().map(|&(_, b)| b).sum()
    }
}

/// The device address of `bytes` bytes of scratch for the call on `gpu`'s stream (the stream's
/// [`ScratchArena`], per device and stream for the process).
pub(crate) fn scratch(gpu: &Gpu, bytes: usize) -> Result<u64, String> {
    static ARENAS: Mutex<Vec<((c_int, usize), ScratchArena)>> = Mutex::new(Vec::new());
    let key = (gpu.device.ordinal, gpu.stream.cu_stream() as usize);
    let mut arenas = ARENAS.lock().unwrap_or_else(|e| e.into_inner());
    let at = match arenas.iter().position(|(k, _)| *k == key) {
        Some(i) => i,
        None => {
            arenas.push((key, ScratchArena::default()));
            arenas.len() - 1
        }
    };
    arenas[at].1.take(bytes, |n| {
        // SAFETY: the device's context is bound to this thread (Gpu::borrow); uninitialised
        // device memory, which the plans' kernels write before they read it.
        unsafe { cudarc::driver::result::malloc_sync(n) }
            .map_err(|e| format!("scratch of {n} bytes: {e:?}"))
    })
}

/// Copies the bytes `range` of the scratch at device address `base` (u32 counts) to the host,
/// in stream order: into pageable host memory, which CUDA completes before the call returns
/// (so after the kernels enqueued before it, and before a later slab reuses the scratch).
pub(crate) fn copy_counts(gpu: &Gpu, base: u64, range: Range<usize>) -> Result<Vec<u8>, String> {
    let mut out = vec![0u8; range.len()];
    // SAFETY: [base + range) lies in this call's scratch (the plan's layout); `out` is pageable
    // host memory of range.len() bytes, written before the call returns.
    unsafe {
        cudarc::driver::result::memcpy_dtoh_async(
            &mut out,
            base + range.start as u64,
            gpu.stream.cu_stream(),
        )
    }
    .map_err(|e| format!("statistics: {e:?}"))?;
    Ok(out)
}

/// Waits for the stream, then the sum of the little-endian u32 counts in `bytes` (copied by
/// [`copy_counts`]).
pub(crate) fn sum_counts(gpu: &Gpu, bytes: &[u8]) -> Result<u64, String> {
    gpu.stream
        .synchronize()
        .map_err(|e| format!("statistics: {e:?}"))?;
    Ok(bytes
        .chunks_exact(4)
        .map(|c| u64::from(u32::from_le_bytes([c[0], c[1], c[2], c[3]])))
        .sum())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_arena_grows_by_doubling_and_keeps_every_buffer() {
        assert_eq!(ScratchArena::grown(None, 0), Some(ARENA_GRAIN));
        assert_eq!(ScratchArena::grown(None, 5), Some(ARENA_GRAIN));
        assert_eq!(ScratchArena::grown(Some(ARENA_GRAIN), ARENA_GRAIN), None);
        assert_eq!(
            ScratchArena::grown(Some(ARENA_GRAIN), ARENA_GRAIN + 1),
            Some(2 * ARENA_GRAIN)
        );
        assert_eq!(
            ScratchArena::grown(Some(ARENA_GRAIN), 3 * ARENA_GRAIN + 7),
            Some(4 * ARENA_GRAIN)
        );
        let mut a = ScratchArena::default();
        let mut next = 0x1000_0000u64;
        let mut alloc = |n: usize| {
            next += n as u64;
            Ok(next - n as u64)
        };
        let first = a.take(100, &mut alloc).unwrap();
        assert_eq!(
            a.take(ARENA_GRAIN, &mut alloc).unwrap(),
            first,
            "the newest serves"
        );
        let second = a.take(ARENA_GRAIN + 1, &mut alloc).unwrap();
        assert_ne!(second, first);
        assert_eq!(
            a.take(10, &mut alloc).unwrap(),
            second,
            "the newest, not the first"
        );
        // 1, 2, then 64 MiB for a 40 MiB call: under twice the largest need, every buffer kept
        let third = a.take(40 << 20, &mut alloc).unwrap();
        assert_eq!(a.buffers.len(), 3);
        assert_eq!(a.held(), (1 + 2 + 40) << 20);
        assert_eq!(a.take(40 << 20, &mut alloc).unwrap(), third);
        assert!(a.take(1 << 30, |_| Err("no memory".into())).is_err());
        assert_eq!(a.buffers.len(), 3, "a failed allocation adds nothing");
    }
}
