//! The CUDA side shared by every Spark op's launcher (the launchers themselves and their plans
//! live with their op: `crate::ffn::{cuda_plan, cuda_launch}`,
//! `crate::attention::{cuda_plan, cuda_launch}`).
//!
//! ggml-cuda with patch 0008 runs a `GGML_OP_CUSTOM` node on the GPU when the node's
//! `ggml_custom_op_t` has a registered launcher ([`hook`]): it calls
//! `launch(dst, device, stream, userdata)` with `device` current and every tensor's data on
//! that device, instead of running the CPU op. [`register_launchers`] (called with
//! `crate::registry::LAUNCHERS`, derived from the op table `crate::registry::OPS`, by the
//! plugin's `ggml_backend_init` and by `registry::register`, after the Spark entry exists)
//! registers one launcher per Spark op; the graph is unchanged (it still resolves the CPU ops
//! by name).
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
//!   patched `ggml-cuda.h` by the C probe of `build.rs` (`tests/cuda_hook.rs`), and the pair
//!   (CPU function, launcher) registered per op ([`Launcher`]).
//! - `check.rs` (always built): what every plan checks from tensor metadata only (packed
//!   weights of the GPU's types, aligned f32 rows, 32-bit sizes).
//! - `options.rs` (always built): what NVRTC compiles ([`CudaSource`]) with which options,
//!   one function for run time and tests, with ggml's type ids and block layouts as `-D`
//!   macros; `common.cuh`, CUDA C every kernel source may include (dequantization, warp sums,
//!   integer names), embedded as [`HEADERS`].
//! - feature `cuda` only: `driver.rs` (library checks, NVRTC to CUBIN/PTX, per-device module
//!   cache, the borrowed stream `driver::Gpu`, NaN fill) and `launch.rs` (the entry protocol
//!   `launch::enter` and the `cuda_launcher!` macro).
//!
//! To add an op (say `spark_foo`, in the op's folder `src/foo/`):
//! 1. `foo/foo.cu` (may `#include "common.cuh"`) defines `extern "C" __global__` kernels;
//!    `foo/cuda_plan.rs` embeds it as a [`CudaSource`] and holds the plan: metadata-only checks
//!    (with [`check`]) and the launch sequence as data, pure functions the tests run on host
//!    tensors; add the source to `crate::registry::KERNEL_SOURCES` (`tests/cuda_nvrtc.rs`
//!    compiles every `.cu` under `src/` for sm_75/80/90 and checks the table lists them all).
//! 2. `foo/cuda_launch.rs` (feature `cuda`): the plan implements `launch::CudaOp` (`check`, and
//!    `launch`, which gets `device.function(&KERNELS, "kernel")` and enqueues on `gpu.stream`
//!    with `stream.launch_builder`), and `launch::cuda_launcher!(launch_foo => FooPlan);`.
//! 3. One row `OpEntry { name: "spark_foo", cpu: spark_foo, cuda:
//!    cuda_launcher!(crate::foo::cuda_launch::launch_foo) }` in `crate::registry::OPS` (the
//!    procs, the RPC registration and `LAUNCHERS` derive from it).
//!
//! ggml-cuda may capture a graph's launches into a CUDA graph and replay it without calling the
//! launchers while the nodes keep their properties (patch 0008): every launch is a pure
//! function of the node's tensors (addresses, shapes, strides, types) and its stored
//! parameters, and nothing waits for the stream while it is captured (`launch::capturing`).
//! Statistics turn CUDA graphs off ([`disable_cuda_graphs`]).
//!
//! Failures at launch (bad tensors, compile or driver errors, a panic) print one line through
//! `crate::cpu_op::report` (the CPU ops' format and rate limit), NaN-fill dst on the stream and
//! return non-zero. Launchers never read tensor data on the host and never synchronize the
//! stream, except to count kept neurons when [`device_stats`] is on.

pub(crate) mod check;
pub mod hook;
pub mod options;

pub use hook::{CustomLaunch, Launcher};
pub use options::{CudaSource, HEADERS};

#[cfg(feature = "cuda")]
pub mod driver;
#[cfg(feature = "cuda")]
pub(crate) mod launch;

use llama_cpp_sys_2 as sys;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

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

/// Registers `launchers` with this process's ggml-cuda, once per process (later calls return
/// the first outcome: the process has one table, `crate::registry::LAUNCHERS`); prints the
/// outcome's [`message`](Registration::message) once.
pub fn register_launchers(launchers: &'static [Launcher]) -> Registration {
    static DONE: OnceLock<Registration> = OnceLock::new();
    DONE.get_or_init(|| {
        let outcome = crate::ffi::guard(
            "register_launchers",
            Registration::NotRegistered("internal error".into()),
            || {
                // SAFETY: cuda_reg returns a live registry entry or None.
                unsafe { try_register(hook::cuda_reg(), launchers) }
            },
        );
        if let Some(line) = outcome.message() {
            crate::log::stderr_text(&line);
        }
        if matches!(outcome, Registration::Registered { .. }) && device_stats() {
            disable_cuda_graphs();
        }
        outcome
    })
    .clone()
}

/// Registers `launchers` with the CUDA registry entry `reg` (None: no CUDA backend), without
/// printing and without the once-per-process cache: the work of [`register_launchers`],
/// callable by tests with a stand-in entry.
///
/// # Safety
/// `reg` is None or a live registry entry whose proc `ggml_backend_cuda_register_custom_op`,
/// if present, is a function of the hook's type.
pub unsafe fn try_register(
    reg: Option<sys::ggml_backend_reg_t>,
    launchers: &[Launcher],
) -> Registration {
    let Some(reg) = reg else {
        return Registration::NoCudaBackend;
    };
    // SAFETY: forwarded contract.
    let Some(register) = (unsafe { hook::register_fn(reg) }) else {
        return Registration::NotRegistered(NO_HOOK.into());
    };
    // SAFETY: forwarded contract.
    unsafe { register_with(register, launchers) }
}

#[cfg(not(feature = "cuda"))]
unsafe fn register_with(
    _register: hook::RegisterCustomOp,
    _launchers: &[Launcher],
) -> Registration {
    Registration::NotRegistered(NO_FEATURE.into())
}

#[cfg(feature = "cuda")]
unsafe fn register_with(register: hook::RegisterCustomOp, launchers: &[Launcher]) -> Registration {
    let nvrtc = match driver::libraries() {
        Ok(v) => v,
        Err(why) => return Registration::NotRegistered(why),
    };
    let mut done = Vec::new();
    let mut refused = Vec::new();
    for l in launchers {
        // SAFETY: a function of the hook's type (contract) given two valid function pointers
        // of the declared types, which live for the whole process.
        if unsafe { register(Some(l.fun), Some(l.launch)) } {
            done.push(l.name);
        } else {
            refused.push(l.name);
        }
    }
    if done.is_empty() {
        return Registration::NotRegistered(format!(
            "ggml-cuda refused every launcher ({})",
            refused.join(", ")
        ));
    }
    Registration::Registered { nvrtc, ops: done }
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
    if on {
        disable_cuda_graphs();
    }
}

/// Sets `GGML_CUDA_DISABLE_GRAPHS=1` unless it is set. ggml-cuda replays a captured CUDA graph
/// without calling the launchers, so per-node statistics (kept counts read back after each
/// node) need every evaluation to run the launchers; ggml-cuda reads the variable once, at its
/// first graph evaluation, which comes after the plugin registered (its load) and after
/// `spark` sets its options.
pub(crate) fn disable_cuda_graphs() {
    if std::env::var_os("GGML_CUDA_DISABLE_GRAPHS").is_none() {
        // Called while the plugin loads or while `spark` reads its options, before any
        // ggml-cuda graph evaluation (the only reader of this variable in the process).
        std::env::set_var("GGML_CUDA_DISABLE_GRAPHS", "1");
    }
}

fn stats_flag() -> &'static AtomicBool {
    static FLAG: OnceLock<AtomicBool> = OnceLock::new();
    FLAG.get_or_init(|| {
        let on = std::env::var_os("SPARK_STATS").is_some_and(|v| !v.is_empty() && v != "0");
        AtomicBool::new(on)
    })
}
