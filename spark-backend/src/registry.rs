//! The "Spark" ggml backend registry entry: how llama.cpp finds the Spark kernels.
//!
//! The entry has no devices; it exists so that the spark-gemma2 graph can call
//! `ggml_backend_reg_by_name("Spark")` and `ggml_backend_reg_get_proc_address(reg, NAME)` for
//! each kernel, for the FFN tiling of a ubatch (`spark_ffn_tiling`), its attention's path
//! (`spark_attn_path`), the memory plan at load and at context creation (`spark_memory_plan`,
//! `spark_memory_context`, `spark_memory_loaded`, `spark_memory_resident`) and for the statistics
//! (docs/INTERFACES.md; [`proc_address`]). Its ops are one table, [`OPS`] (name, CPU entry
//! point, CUDA launcher), from which the procs, the RPC registration ([`register_rpc_ops`]) and
//! the CUDA registration ([`LAUNCHERS`]) derive; [`KERNEL_SOURCES`] lists the CUDA C sources.
//! Two ways to put the entry into ggml's registry:
//! - in-process: [`register`] (the `spark` CLI does this before loading a model);
//! - as a plugin: the cdylib `libspark_backend.so` (installed by tools/upstream.sh as
//!   `libggml-spark.so`) exports `ggml_backend_init` ([`crate::plugin`]), so `ggml_backend_load`
//!   (`GGML_BACKEND_PATH`, `spark --backend-path`) loads it into a process that runs the shared
//!   ggml it was built against.
//!
//! The structs mirror `struct ggml_backend_reg` and `struct ggml_backend_reg_i` of ggml's internal
//! `ggml-backend-impl.h` (API version [`GGML_BACKEND_API_VERSION`]); `tests/registry.rs` pins
//! their layout against the header through a C probe compiled by `build.rs`.

use crate::cuda::{CudaSource, CustomLaunch, Launcher};
use crate::ffi;
use crate::stats::{self, LayerStats};
use llama_cpp_sys_2 as sys;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Once;

/// `GGML_BACKEND_API_VERSION` of the ggml this crate is built against; `ggml_backend_load`
/// rejects an entry whose `api_version` differs.
pub const GGML_BACKEND_API_VERSION: c_int = 3;

/// The registry entry's name.
pub(crate) const NAME: &CStr = c"Spark";

/// A ggml custom op's C function (`ggml_custom_op_t`).
pub type CustomOpFn = unsafe extern "C" fn(*mut sys::ggml_tensor, c_int, c_int, *mut c_void);

/// One Spark custom op: the name the graph resolves (`ggml_backend_reg_get_proc_address`) and
/// ggml-rpc sends it under, the CPU entry point the graph passes to `ggml_custom_4d`, and the
/// CUDA launcher ggml-cuda runs for its node instead (`None` without the `cuda` feature).
#[derive(Clone, Copy)]
pub struct OpEntry {
    /// The name.
    pub name: &'static str,
    /// The CPU entry point.
    pub cpu: CustomOpFn,
    /// The CUDA launcher.
    pub cuda: Option<CustomLaunch>,
}

/// `Some(launcher)` with the `cuda` feature, `None` without (the launcher's module is not built).
macro_rules! cuda_launcher {
    ($($path:tt)*) => {{
        #[cfg(feature = "cuda")]
        let launch = Some($($path)* as CustomLaunch);
        #[cfg(not(feature = "cuda"))]
        let launch = None;
        launch
    }};
}

/// Every Spark op: the one table of them. Adding an op is one row here (with the `cuda`
/// feature every op must have a launcher: [`LAUNCHERS`] fails to build otherwise).
pub const OPS: [OpEntry; 6] = {
    use crate::attention::cpu_op::spark_attn;
    use crate::ffn::cpu_ops::{spark_ffn_down, spark_ffn_fused, spark_ffn_sum, spark_ffn_up};
    use crate::rope::cpu_op::spark_rope;
    [
        OpEntry {
            name: "spark_ffn_up",
            cpu: spark_ffn_up,
            cuda: cuda_launcher!(crate::ffn::cuda_launch::launch_up),
        },
        OpEntry {
            name: "spark_ffn_down",
            cpu: spark_ffn_down,
            cuda: cuda_launcher!(crate::ffn::cuda_launch::launch_down),
        },
        OpEntry {
            name: "spark_ffn_fused",
            cpu: spark_ffn_fused,
            cuda: cuda_launcher!(crate::ffn::cuda_launch::launch_fused),
        },
        OpEntry {
            name: "spark_ffn_sum",
            cpu: spark_ffn_sum,
            cuda: cuda_launcher!(crate::ffn::cuda_launch::launch_sum),
        },
        OpEntry {
            name: "spark_attn",
            cpu: spark_attn,
            cuda: cuda_launcher!(crate::attention::cuda_launch::launch_attn),
        },
        OpEntry {
            name: "spark_rope",
            cpu: spark_rope,
            cuda: cuda_launcher!(crate::rope::cuda_launch::launch_rope),
        },
    ]
};

/// The entry's other C functions, by name: the FFN tiling, the attention's path, parameter
/// storage, the memory plan (load, context) and statistics.
const OTHER_PROCS: [(&str, *mut c_void); 9] = {
    use crate::attention::path::spark_attn_path;
    use crate::ffn::tiling::spark_ffn_tiling;
    use crate::params::spark_op_set_params;
    use crate::rows::budget::{spark_memory_context, spark_memory_plan};
    use crate::rows::paging::{spark_memory_loaded, spark_memory_resident};
    [
        ("spark_ffn_tiling", spark_ffn_tiling as *mut c_void),
        ("spark_attn_path", spark_attn_path as *mut c_void),
        ("spark_op_set_params", spark_op_set_params as *mut c_void),
        ("spark_memory_plan", spark_memory_plan as *mut c_void),
        ("spark_memory_context", spark_memory_context as *mut c_void),
        ("spark_memory_loaded", spark_memory_loaded as *mut c_void),
        (
            "spark_memory_resident",
            spark_memory_resident as *mut c_void,
        ),
        ("spark_stats_reset", spark_stats_reset as *mut c_void),
        ("spark_stats_get", spark_stats_get as *mut c_void),
    ]
};

/// Names [`get_proc_address`](BackendRegIface::get_proc_address) resolves: every op of [`OPS`],
/// then [`OTHER_PROCS`].
pub const PROC_NAMES: [&str; OPS.len() + OTHER_PROCS.len()] = {
    let mut names = [""; OPS.len() + OTHER_PROCS.len()];
    let mut i = 0;
    while i < OPS.len() {
        names[i] = OPS[i].name;
        i += 1;
    }
    while i < names.len() {
        names[i] = OTHER_PROCS[i - OPS.len()].0;
        i += 1;
    }
    names
};

/// Mirror of `struct ggml_backend_reg_i`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct BackendRegIface {
    /// `const char * (*get_name)(ggml_backend_reg_t reg)`.
    pub get_name: Option<unsafe extern "C" fn(reg: sys::ggml_backend_reg_t) -> *const c_char>,
    /// `size_t (*get_device_count)(ggml_backend_reg_t reg)`.
    pub get_device_count: Option<unsafe extern "C" fn(reg: sys::ggml_backend_reg_t) -> usize>,
    /// `ggml_backend_dev_t (*get_device)(ggml_backend_reg_t reg, size_t index)`.
    pub get_device: Option<
        unsafe extern "C" fn(reg: sys::ggml_backend_reg_t, index: usize) -> sys::ggml_backend_dev_t,
    >,
    /// `void * (*get_proc_address)(ggml_backend_reg_t reg, const char * name)`.
    pub get_proc_address: Option<
        unsafe extern "C" fn(reg: sys::ggml_backend_reg_t, name: *const c_char) -> *mut c_void,
    >,
}

/// Mirror of `struct ggml_backend_reg`.
#[repr(C)]
#[derive(Debug)]
pub struct BackendReg {
    /// Must equal the loader's `GGML_BACKEND_API_VERSION`.
    pub api_version: c_int,
    /// Function table.
    pub iface: BackendRegIface,
    /// Backend-private context (unused: null).
    pub context: *mut c_void,
}

/// The static entry; ggml only reads it.
struct StaticReg(BackendReg);

// SAFETY: the entry is immutable after construction (ggml never writes to it) and its only
// pointer field is null, so sharing it between threads is sound.
unsafe impl Sync for StaticReg {}

static SPARK_REG: StaticReg = StaticReg(BackendReg {
    api_version: GGML_BACKEND_API_VERSION,
    iface: BackendRegIface {
        get_name: Some(reg_get_name),
        get_device_count: Some(reg_get_device_count),
        get_device: Some(reg_get_device),
        get_proc_address: Some(reg_get_proc_address),
    },
    context: std::ptr::null_mut(),
});

/// The entry as ggml's handle type. ggml treats the pointee as read-only.
pub fn reg() -> sys::ggml_backend_reg_t {
    std::ptr::addr_of!(SPARK_REG.0).cast_mut().cast()
}

unsafe extern "C" fn reg_get_name(_reg: sys::ggml_backend_reg_t) -> *const c_char {
    NAME.as_ptr()
}

unsafe extern "C" fn reg_get_device_count(_reg: sys::ggml_backend_reg_t) -> usize {
    0
}

unsafe extern "C" fn reg_get_device(
    _reg: sys::ggml_backend_reg_t,
    _index: usize,
) -> sys::ggml_backend_dev_t {
    std::ptr::null_mut()
}

/// `get_proc_address`: the function named `name` (see [`proc_address`]), or null.
///
/// # Safety
/// `name` must be null or a NUL-terminated string.
unsafe extern "C" fn reg_get_proc_address(
    _reg: sys::ggml_backend_reg_t,
    name: *const c_char,
) -> *mut c_void {
    ffi::guard("get_proc_address", std::ptr::null_mut(), || {
        if name.is_null() {
            return std::ptr::null_mut();
        }
        // SAFETY: non-null and NUL-terminated per the contract.
        let name = unsafe { CStr::from_ptr(name) };
        name.to_str()
            .ok()
            .and_then(proc_address)
            .unwrap_or(std::ptr::null_mut())
    })
}

/// The C function the entry exports under `name` ([`OPS`], [`OTHER_PROCS`]), or `None` for an
/// unknown name.
pub fn proc_address(name: &str) -> Option<*mut c_void> {
    let op = OPS.iter().find(|op| op.name == name);
    op.map(|op| op.cpu as *mut c_void).or_else(|| {
        OTHER_PROCS
            .iter()
            .find(|(n, _)| *n == name)
            .map(|&(_, f)| f)
    })
}

/// C ABI `void spark_stats_reset(void)`: clears every layer's counters (`stats::reset`).
pub extern "C" fn spark_stats_reset() {
    ffi::guard("spark_stats_reset", (), stats::reset);
}

/// C ABI `int spark_stats_get(int layer, struct spark_layer_stats * out)`: copies `layer`'s
/// counters into `*out` and returns 0; returns -1 (and leaves `*out` alone) when `out` is null
/// or `layer` is outside `0..stats::MAX_LAYERS`.
///
/// # Safety
/// `out` must be null or valid for writing one `LayerStats`.
pub unsafe extern "C" fn spark_stats_get(layer: c_int, out: *mut LayerStats) -> c_int {
    ffi::guard("spark_stats_get", -1, || {
        if out.is_null() {
            return -1;
        }
        match stats::snapshot(layer) {
            Some(s) => {
                // SAFETY: non-null and writable per the contract; unaligned write for safety.
                unsafe { out.write_unaligned(s) };
                0
            }
            None => -1,
        }
    })
}

/// The CUDA launcher of every Spark op ([`OPS`]), registered with ggml-cuda (`crate::cuda`) by
/// [`register`] and by the plugin; empty without the `cuda` feature.
pub const LAUNCHERS: &[Launcher] = &launchers();

#[cfg(feature = "cuda")]
const fn launchers() -> [Launcher; OPS.len()] {
    let mut out = [Launcher {
        name: "",
        fun: OPS[0].cpu,
        launch: match OPS[0].cuda {
            Some(l) => l,
            None => panic!("every op needs a CUDA launcher"),
        },
    }; OPS.len()];
    let mut i = 0;
    while i < OPS.len() {
        out[i] = Launcher {
            name: OPS[i].name,
            fun: OPS[i].cpu,
            launch: match OPS[i].cuda {
                Some(l) => l,
                None => panic!("every op in OPS needs a CUDA launcher with the `cuda` feature"),
            },
        };
        i += 1;
    }
    out
}

#[cfg(not(feature = "cuda"))]
const fn launchers() -> [Launcher; 0] {
    []
}

/// Every CUDA C source of the launchers (`.cu`, one module each per device), next to its op.
pub const KERNEL_SOURCES: &[CudaSource] = &[
    crate::ffn::cuda_plan::KERNELS,
    crate::attention::cuda_plan::KERNELS,
    crate::rope::cuda_plan::KERNELS,
];

static REGISTER: Once = Once::new();
static REGISTERED: AtomicBool = AtomicBool::new(false);

/// Adds the "Spark" entry to this process's ggml backend registry (once; later calls and
/// concurrent calls do nothing more). Call before loading a model so its graph finds the
/// kernels.
pub fn register() {
    REGISTER.call_once(|| {
        // SAFETY: `reg()` points at a static, valid, read-only entry that lives for the whole
        // program; ggml_backend_register only stores the pointer and queries the entry.
        unsafe { sys::ggml_backend_register(reg()) };
        REGISTERED.store(true, Ordering::Release);
        // GPU launchers for the Spark ops when this process has ggml-cuda with the hook.
        crate::cuda::register_launchers(LAUNCHERS);
        register_rpc_ops();
    });
}

/// `ggml_backend_rpc_register_custom_op_t` of the patched ggml-rpc.h (patch 0009):
/// `bool (*)(const char * name, ggml_custom_op_t fun)`.
type RpcRegisterCustomOp = unsafe extern "C" fn(name: *const c_char, fun: CustomOpFn) -> bool;

/// Registers every op of [`OPS`] with ggml's RPC backend by name (patch 0009), when this process
/// has one: their nodes carry their parameters ([`crate::params`]), so an RPC client sends Spark
/// nodes to the servers that have registered the same
/// names (an `rpc-server` with this plugin) and keeps them local for the others; an
/// `rpc-server` with this plugin runs them. Returns how many were registered (0 without an
/// RPC backend or without the hook, as with an unpatched ggml).
pub fn register_rpc_ops() -> usize {
    ffi::guard("register_rpc_ops", 0, || {
        // SAFETY: the name is NUL-terminated; ggml returns null or a registered entry.
        let rpc = unsafe { sys::ggml_backend_reg_by_name(c"RPC".as_ptr()) };
        if rpc.is_null() {
            return 0;
        }
        // SAFETY: rpc is a live entry; the name is NUL-terminated.
        let f = unsafe {
            sys::ggml_backend_reg_get_proc_address(
                rpc,
                c"ggml_backend_rpc_register_custom_op".as_ptr(),
            )
        };
        if f.is_null() {
            return 0;
        }
        // SAFETY: ggml-rpc exports this name with the signature of
        // ggml_backend_rpc_register_custom_op_t (patched ggml-rpc.h; RpcRegisterCustomOp above).
        let register = unsafe { std::mem::transmute::<*mut c_void, RpcRegisterCustomOp>(f) };
        let mut n = 0;
        for op in OPS {
            let c_name = std::ffi::CString::new(op.name).expect("op names have no NUL");
            // SAFETY: a NUL-terminated name that ggml-rpc copies, and a function of this
            // library, which stays loaded for the life of the process.
            if unsafe { register(c_name.as_ptr(), op.cpu) } {
                n += 1;
            }
        }
        n
    })
}

/// True once [`register`] has run in this process (a copy loaded as a plugin through
/// `ggml_backend_load` is a separate entry and does not count).
pub fn is_registered() -> bool {
    REGISTERED.load(Ordering::Acquire)
}
