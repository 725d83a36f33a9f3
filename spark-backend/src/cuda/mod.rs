//! CUDA launchers for the Spark ops, run by ggml-cuda on its own stream (feature `cuda`).
//!
//! ggml-cuda with patch 0008 runs a `GGML_OP_CUSTOM` node on the GPU when the node's
//! `ggml_custom_op_t` has a registered launcher ([`hook`]): it calls
//! `launch(dst, device, stream, userdata)` with `device` current and every tensor's data on
//! that device, instead of running the CPU op. [`register_launchers`] (called by the plugin's
//! `ggml_backend_init` and by `registry::register`, after the Spark entry exists) registers one
//! launcher per Spark op; the graph is unchanged (it still resolves the CPU ops by name).
//!
//! Outcomes, each said at most once per process on stderr:
//! - no "CUDA" registry entry in the process: nothing registered, nothing printed;
//! - a CUDA entry, but no hook (ggml-cuda without patch 0008), or this library built without
//!   the `cuda` feature, or libcuda/libnvrtc not loadable:
//!   `spark-backend: CUDA kernels not registered: <reason>; Spark layers run on the CPU`;
//! - otherwise `spark-backend: CUDA kernels registered (NVRTC <version>): <ops>`.
//!
//! # Layout (the seam for adding an op)
//! - `hook.rs` (always built): the hook's C types, declared by hand and pinned against the
//!   patched `ggml-cuda.h` by the C probe of `build.rs` (`tests/cuda_hook.rs`).
//! - `check.rs` (always built): validation from tensor metadata only, a pure function per op
//!   returning a plan of device addresses and shapes; unit-tested on host tensors.
//! - `options.rs` (always built): the NVRTC options, one function for run time and tests, with
//!   ggml's type ids and block layouts as `-D` macros.
//! - feature `cuda` only: `driver.rs` (library checks, NVRTC to CUBIN/PTX, per-device module
//!   cache, the borrowed stream [`driver::Gpu`], NaN fill), `launch.rs` (the entry protocol
//!   `launch::enter`, the `cuda_launcher!` macro, the table `launch::LAUNCHERS`), `ffn.rs` (the
//!   FFN launchers), `kernels/*.cu` and `kernels/*.cuh` (CUDA C, embedded with `include_str!`).
//!
//! To add an op (e.g. `spark_attn`, in `attn.rs` + `kernels/attn.cu`):
//! 1. `kernels/attn.cu` includes `"common.cuh"` (dequantization, warp sums, integer names)
//!    and defines `extern "C" __global__` kernels; add it to [`KERNEL_SOURCES`]
//!    (`tests/cuda_nvrtc.rs` compiles every `.cu` in `kernels/` for sm_75/80/90 and checks
//!    the table lists them all).
//! 2. `attn.rs`: a plan type implementing `launch::CudaOp` (`check` = metadata-only
//!    validation; `launch` gets `device.function("attn.cu", "kernel")` and enqueues on
//!    `gpu.stream` with `stream.launch_builder`), and
//!    `launch::cuda_launcher!(launch_attn => AttnPlan);`.
//! 3. `mod attn;` below and one row `Launcher { name: "spark_attn", fun:
//!    crate::attention::op::spark_attn, launch: super::attn::launch_attn }` in `launch::LAUNCHERS`.
//!
//! Failures at launch (bad tensors, compile or driver errors, a panic) print one line through
//! `crate::op::report` (the CPU ops' format and rate limit), NaN-fill dst on the stream and
//! return non-zero. Launchers never read tensor data on the host and never synchronize the
//! stream, except to count kept neurons when [`device_stats`] is on.

pub mod attn;
pub mod check;
pub mod hook;
pub mod options;

#[cfg(feature = "cuda")]
pub mod driver;
#[cfg(feature = "cuda")]
mod ffn;
#[cfg(feature = "cuda")]
pub mod launch;

use llama_cpp_sys_2 as sys;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

/// A CUDA C file compiled by NVRTC.
#[derive(Debug, Clone, Copy)]
pub struct KernelSource {
    /// File name under `src/cuda/kernels/` (also the name NVRTC reports errors under).
    pub name: &'static str,
    /// Its text.
    pub text: &'static str,
}

/// Every kernel source (`.cu`), one module each per device.
pub const KERNEL_SOURCES: &[KernelSource] = &[
    KernelSource {
        name: "ffn.cu",
        text: include_str!("kernels/ffn.cu"),
    },
    KernelSource {
        name: "attn.cu",
        text: include_str!("kernels/attn.cu"),
    },
];

/// Every header (`.cuh`) the sources may `#include "name"`.
pub const HEADERS: &[KernelSource] = &[KernelSource {
    name: "common.cuh",
    text: include_str!("kernels/common.cuh"),
}];

/// What [`register_launchers`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Registration {
    /// The process has no "CUDA" registry entry: nothing to do, nothing said.
    NoCudaBackend,
    /// A CUDA entry exists but the launchers were not registered, for this reason.
    NotRegistered(String),
    /// Registered (op names), with the NVRTC version.
    Registered {
        /// NVRTC version, e.g. "13.0".
        nvrtc: String,
        /// The ops whose launchers ggml-cuda accepted.
        ops: Vec<&'static str>,
    },
}

impl Registration {
    /// The line printed for this outcome (none for [`Registration::NoCudaBackend`]).
    pub fn message(&self) -> Option<String> {
        match self {
            Registration::NoCudaBackend => None,
            Registration::NotRegistered(why) => Some(format!(
                "spark-backend: CUDA kernels not registered: {why}; Spark layers run on the CPU"
            )),
            Registration::Registered { nvrtc, ops } => Some(format!(
                "spark-backend: CUDA kernels registered (NVRTC {nvrtc}): {}",
                ops.join(", ")
            )),
        }
    }
}

/// The reason given when this library was built without the feature.
pub const NO_FEATURE: &str =
    "spark-backend was built without the `cuda` feature (cargo build --features cuda)";

/// The reason given when ggml-cuda lacks the hook.
pub const NO_HOOK: &str =
    "this ggml-cuda has no custom-op hook (ggml_backend_cuda_register_custom_op: patch 0008)";

/// Registers the CUDA launchers with this process's ggml-cuda, once per process (later calls
/// return the first outcome); prints the outcome's [`message`](Registration::message) once.
pub fn register_launchers() -> Registration {
    static DONE: OnceLock<Registration> = OnceLock::new();
    DONE.get_or_init(|| {
        let outcome = crate::ffi::guard(
            "register_launchers",
            Registration::NotRegistered("internal error".into()),
            || {
                // SAFETY: cuda_reg returns a live registry entry or None.
                unsafe { try_register(hook::cuda_reg()) }
            },
        );
        if let Some(line) = outcome.message() {
            let _ = writeln!(std::io::stderr().lock(), "{line}");
        }
        outcome
    })
    .clone()
}

/// Registers the launchers with the CUDA registry entry `reg` (None: no CUDA backend), without
/// printing and without the once-per-process cache: the work of [`register_launchers`],
/// callable by tests with a stand-in entry.
///
/// # Safety
/// `reg` is None or a live registry entry whose proc `ggml_backend_cuda_register_custom_op`,
/// if present, is a function of the hook's type.
pub unsafe fn try_register(reg: Option<sys::ggml_backend_reg_t>) -> Registration {
    let Some(reg) = reg else {
        return Registration::NoCudaBackend;
    };
    // SAFETY: forwarded contract.
    let Some(register) = (unsafe { hook::register_fn(reg) }) else {
        return Registration::NotRegistered(NO_HOOK.into());
    };
    // SAFETY: forwarded contract.
    unsafe { register_with(register) }
}

#[cfg(not(feature = "cuda"))]
unsafe fn register_with(_register: hook::RegisterCustomOp) -> Registration {
    Registration::NotRegistered(NO_FEATURE.into())
}

#[cfg(feature = "cuda")]
unsafe fn register_with(register: hook::RegisterCustomOp) -> Registration {
    let nvrtc = match driver::libraries() {
        Ok(v) => v,
        Err(why) => return Registration::NotRegistered(why),
    };
    // SAFETY: forwarded contract.
    match unsafe { launch::register_all(register) } {
        Ok(ops) => Registration::Registered { nvrtc, ops },
        Err(why) => Registration::NotRegistered(why),
    }
}

/// Whether the launchers count kept neurons on the device for the statistics table (a stream
/// synchronization per FFN node). Starts on when `SPARK_STATS` is set (not empty, not `0`), as
/// for the plugin's report at exit; [`set_device_stats`] changes it.
pub fn device_stats() -> bool {
    stats_flag().load(Ordering::Relaxed)
}

/// Turns device-side statistics on or off (`spark --spark-stats` on a GPU needs it on).
pub fn set_device_stats(on: bool) {
    stats_flag().store(on, Ordering::Relaxed);
}

fn stats_flag() -> &'static AtomicBool {
    static FLAG: OnceLock<AtomicBool> = OnceLock::new();
    FLAG.get_or_init(|| {
        let on = std::env::var_os("SPARK_STATS").is_some_and(|v| !v.is_empty() && v != "0");
        AtomicBool::new(on)
    })
}
