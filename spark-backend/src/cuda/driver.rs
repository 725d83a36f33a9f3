//! The CUDA side shared by every launcher: whether the driver and NVRTC libraries load, NVRTC
//! compilation of the kernel sources (CUBIN for the device's exact architecture, PTX as the
//! fallback), one compiled module per (device, source) cached for the process, and the borrowed
//! ggml stream a launch enqueues on.

use super::options::{nvrtc_options, CudaSource, Target, HEADERS};
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream};
use cudarc::nvrtc::{sys as nvrtc_sys, Ptx};
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The NVRTC version ("13.0") when both libcuda and libnvrtc load, else why not. Checked once;
/// no cudarc function that would panic on a missing library is called before this succeeds.
pub fn libraries() -> Result<String, String> {
    static LIBS: OnceLock<Result<String, String>> = OnceLock::new();
    LIBS.get_or_init(|| {
        // SAFETY: only tries to dlopen the candidate library names; calls nothing in them.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err("libcuda (the NVIDIA driver library) is not loadable".into());
        }
        nvrtc_version()
    })
    .clone()
}

/// The NVRTC version when libnvrtc loads (libcuda not needed: the compile tests use this).
pub fn nvrtc_version() -> Result<String, String> {
    // SAFETY: only tries to dlopen the candidate library names.
    if !unsafe { nvrtc_sys::is_culib_present() } {
        return Err(
            "libnvrtc (CUDA 13 NVRTC) is not loadable: put its directory on LD_LIBRARY_PATH \
             (bash tools/cuda-tools.sh installs one: source target/cuda-tools/env.sh; \
             LD_LIBRARY_PATH=$SPARK_NVRTC_LIB)"
                .into(),
        );
    }
    let (mut major, mut minor) = (0 as c_int, 0 as c_int);
    // SAFETY: libnvrtc is loadable (checked above); nvrtcVersion writes two ints.
    let rc = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unsafe {
        nvrtc_sys::nvrtcVersion(&mut major, &mut minor)
    }))
    .map_err(|_| "libnvrtc lacks nvrtcVersion".to_string())?;
    if rc != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(format!("nvrtcVersion failed: {rc:?}"));
    }
    Ok(format!("{major}.{minor}"))
}

/// A compiled kernel image.
#[derive(Debug, Clone)]
pub struct Image {
    /// CUBIN bytes, or NUL-terminated PTX text.
    pub bytes: Vec<u8>,
    /// True for CUBIN.
    pub cubin: bool,
}

/// An NVRTC program, destroyed on drop.
struct Program(nvrtc_sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: created by nvrtcCreateProgram and destroyed once, here.
        let _ = unsafe { nvrtc_sys::nvrtcDestroyProgram(&mut self.0) };
    }
}

fn check(rc: nvrtc_sys::nvrtcResult, what: &str) -> Result<(), String> {
    if rc == nvrtc_sys::nvrtcResult::NVRTC_SUCCESS {
        Ok(())
    } else {
        Err(format!("{what}: {rc:?}"))
    }
}

/// Compiles `source` (with every header of [`HEADERS`] available to `#include "..."`)
/// for `target` with [`nvrtc_options`]. Requires libnvrtc ([`nvrtc_version`] is Ok).
pub fn compile(source: &CudaSource, target: Target) -> Result<Image, String> {
    let cstr = |s: &str| CString::new(s).map_err(|_| format!("{s:?} contains NUL"));
    let src = cstr(source.text)?;
    let name = cstr(source.name)?;
    let headers = HEADERS
        .iter()
        .map(|h| Ok((cstr(h.text)?, cstr(h.name)?)))
        .collect::<Result<Vec<_>, String>>()?;
    let header_texts: Vec<*const c_char> = headers.iter().map(|h| h.0.as_ptr()).collect();
    let header_names: Vec<*const c_char> = headers.iter().map(|h| h.1.as_ptr()).collect();
    let options = nvrtc_options(target)
        .into_iter()
        .map(|o| cstr(&o))
        .collect::<Result<Vec<_>, String>>()?;
    let option_ptrs: Vec<*const c_char> = options.iter().map(|o| o.as_ptr()).collect();
    let n_headers = c_int::try_from(headers.len()).map_err(|e| e.to_string())?;
    let n_options = c_int::try_from(options.len()).map_err(|e| e.to_string())?;
    let mut prog: nvrtc_sys::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: every pointer is a live NUL-terminated string (owned above, alive until the
    // program is destroyed at the end of this function); the arrays hold n_headers entries.
    check(
        unsafe {
            nvrtc_sys::nvrtcCreateProgram(
                &mut prog,
                src.as_ptr(),
                name.as_ptr(),
                n_headers,
                header_texts.as_ptr(),
                header_names.as_ptr(),
            )
        },
        "nvrtcCreateProgram",
    )?;
    let prog = Program(prog);
    // SAFETY: a live program; option_ptrs holds n_options live strings.
    let rc = unsafe { nvrtc_sys::nvrtcCompileProgram(prog.0, n_options, option_ptrs.as_ptr()) };
    if rc != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(format!(
            "NVRTC could not compile {} for {}: {rc:?}\n{}",
            source.name,
            target.arch(),
            program_log(&prog)
        ));
    }
    let mut size = 0usize;
    // SAFETY: a compiled program; each call writes one usize.
    let rc = unsafe {
        if target.cubin {
            nvrtc_sys::nvrtcGetCUBINSize(prog.0, &mut size)
        } else {
            nvrtc_sys::nvrtcGetPTXSize(prog.0, &mut size)
        }
    };
    check(rc, "image size")?;
    let mut bytes = vec![0u8; size];
    // SAFETY: `bytes` holds exactly the size NVRTC reported for this image kind.
    let rc = unsafe {
        if target.cubin {
            nvrtc_sys::nvrtcGetCUBIN(prog.0, bytes.as_mut_ptr().cast())
        } else {
            nvrtc_sys::nvrtcGetPTX(prog.0, bytes.as_mut_ptr().cast())
        }
    };
    check(rc, "image")?;
    Ok(Image {
        bytes,
        cubin: target.cubin,
    })
}

fn program_log(prog: &Program) -> String {
    let mut size = 0usize;
    // SAFETY: a live program; writes one usize.
    if unsafe { nvrtc_sys::nvrtcGetProgramLogSize(prog.0, &mut size) }
        != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS
    {
        return String::new();
    }
    let mut log = vec![0u8; size.max(1)];
    // SAFETY: the buffer holds the reported size (NUL included).
    if unsafe { nvrtc_sys::nvrtcGetProgramLog(prog.0, log.as_mut_ptr().cast()) }
        != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS
    {
        return String::new();
    }
    CStr::from_bytes_until_nul(&log)
        .map(|c| c.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// One CUDA device as the launchers use it: the primary context (the one ggml-cuda uses) and
/// the modules compiled for it so far.
pub(crate) struct Device {
    /// ggml-cuda's device index, the CUDA ordinal.
    pub(crate) ordinal: c_int,
    ctx: Arc<CudaContext>,
    target: (i32, i32),
    modules: Mutex<HashMap<&'static str, Result<Arc<CudaModule>, String>>>,
}

impl Device {
    /// The compute capability (major, minor).
    pub(crate) fn target(&self) -> (i32, i32) {
        self.target
    }

    /// `kernel` of `source`, compiling and loading the source at its first use on this device
    /// (modules are cached by source name).
    pub(crate) fn function(
        &self,
        source: &'static CudaSource,
        kernel: &str,
    ) -> Result<CudaFunction, String> {
        let module = {
            let mut modules = lock(&self.modules);
            modules
                .entry(source.name)
                .or_insert_with(|| self.load(source))
                .clone()?
        };
        module
            .load_function(kernel)
            .map_err(|e| format!("{}: kernel {kernel}: {e:?}", source.name))
    }

    fn load(&self, src: &'static CudaSource) -> Result<Arc<CudaModule>, String> {
        let (major, minor) = self.target;
        let cubin = Target {
            major,
            minor,
            cubin: true,
        };
        // CUBIN for the exact architecture; PTX if NVRTC cannot emit one for it (a newer GPU
        // than this NVRTC knows is caught by the driver JIT from the newest PTX instead).
        let image = compile(src, cubin).or_else(|e| {
            compile(
                src,
                Target {
                    cubin: false,
                    ..cubin
                },
            )
            .map_err(|e2| format!("{e}\n{e2}"))
        })?;
        self.ctx
            .load_module(Ptx::from_binary(image.bytes))
            .map_err(|e| format!("loading {} ({}): {e:?}", src.name, cubin.arch()))
    }
}

/// The device `ordinal` (ggml-cuda's device index is the CUDA ordinal), created once.
pub(crate) fn device(ordinal: c_int) -> Result<Arc<Device>, String> {
    type Opened = Result<Arc<Device>, String>;
    static DEVICES: Mutex<Vec<(c_int, Opened)>> = Mutex::new(Vec::new());
    libraries()?;
    let mut devices = lock(&DEVICES);
    if let Some((_, d)) = devices.iter().find(|(o, _)| *o == ordinal) {
        return d.clone();
    }
    let made = open(ordinal);
    devices.push((ordinal, made.clone()));
    made
}

fn open(ordinal: c_int) -> Result<Arc<Device>, String> {
    let index = usize::try_from(ordinal).map_err(|_| format!("bad device index {ordinal}"))?;
    let ctx = CudaContext::new(index).map_err(|e| format!("device {ordinal}: {e:?}"))?;
    // SAFETY: every buffer the launchers allocate (launch::scratch) is used only on the one
    // stream whose arena holds it (ggml's stream of the call) and never freed, so cudarc's
    // cross-stream event tracking is not needed (and would add event records to ggml's stream).
    unsafe { ctx.disable_event_tracking() };
    let target = ctx
        .compute_capability()
        .map_err(|e| format!("device {ordinal}: compute capability: {e:?}"))?;
    Ok(Arc::new(Device {
        ordinal,
        ctx,
        target,
        modules: Mutex::new(HashMap::new()),
    }))
}

/// One launch: the device and ggml's stream, borrowed for the duration of the launcher call.
pub(crate) struct Gpu {
    /// The device.
    pub(crate) device: Arc<Device>,
    /// ggml-cuda's stream (not owned: never destroyed by cudarc).
    pub(crate) stream: Arc<CudaStream>,
}

impl Gpu {
    /// Wraps ggml's `stream` on device `ordinal`.
    ///
    /// # Safety
    /// `stream` is a live `cudaStream_t` of device `ordinal`'s primary context, alive until the
    /// returned value and everything cloned from it is dropped.
    pub(crate) unsafe fn borrow(ordinal: c_int, stream: *mut c_void) -> Result<Self, String> {
        let device = device(ordinal)?;
        device
            .ctx
            .bind_to_thread()
            .map_err(|e| format!("device {ordinal}: {e:?}"))?;
        // SAFETY: per this function's contract the stream belongs to this (primary) context and
        // outlives the wrapper; ggml-cuda calls the launcher with its stream and keeps it alive
        // for the whole graph, and the wrapper is dropped before the launcher returns. Work is
        // ordered by being enqueued on that same stream.
        let stream = unsafe { device.ctx.wrap_borrowed_stream(stream.cast()) };
        Ok(Self { device, stream })
    }

    /// Sets `bytes` bytes at device address `ptr` to 0xFF (an f32 NaN), on the stream.
    ///
    /// # Safety
    /// `[ptr, ptr + bytes)` is device memory of this context that nothing else writes meanwhile.
    pub(crate) unsafe fn fill_nan(&self, ptr: u64, bytes: usize) -> Result<(), String> {
        // SAFETY: per the contract; an asynchronous memset on ggml's stream.
        unsafe {
            cudarc::driver::result::memset_d8_async(ptr, 0xFF, bytes, self.stream.cu_stream())
        }
        .map_err(|e| format!("{e:?}"))
    }
}
