//! The CUDA launchers' registration (`spark_backend::cuda`), with and without the `cuda`
//! feature, on a machine without a GPU: the hook's Rust signatures are pinned against the
//! patched ggml-cuda.h (C probe of build.rs); a process without a "CUDA" registry entry gets
//! nothing registered and no message; a stand-in CUDA entry gets the one-line reason (no hook,
//! no feature, or no driver) and no registration; where a driver is present, every launcher.

use llama_cpp_sys_2 as sys;
use spark_backend::cuda::hook::{CustomLaunch, REGISTER_PROC};
use spark_backend::cuda::{self, Registration, NO_HOOK};
use spark_backend::registry::LAUNCHERS;
use spark_backend::registry::{BackendReg, BackendRegIface};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::path::Path;
use std::sync::Mutex;

extern "C" {
    /// From probe/cuda_hook.c: 1 when it was compiled against a ggml-cuda.h with the hook.
    static spark_probe_cuda_hook: c_int;
}

#[test]
fn the_hook_signatures_are_checked_against_the_patched_header_once_patch_0008_exists() {
    let patches = Path::new(env!("CARGO_MANIFEST_DIR")).join("../patches/llama.cpp");
    let has_0008 = std::fs::read_dir(&patches)
        .expect("patches/llama.cpp")
        .any(|e| e.unwrap().file_name().to_string_lossy().starts_with("0008"));
    // SAFETY: a constant defined by the probe object linked into this test.
    let probed = unsafe { spark_probe_cuda_hook } == 1;
    assert_eq!(probed, env!("SPARK_CUDA_HOOK_PROBED") == "1");
    if has_0008 {
        assert!(
            probed,
            "patches/llama.cpp/0008* exists but the staged ggml-cuda.h the crate was built \
             against has no ggml_backend_cuda_custom_launch_t (stale staged sources: rebuild \
             patches/spark-llama-prep)"
        );
    }
}

#[test]
fn without_a_cuda_backend_nothing_is_registered_or_said() {
    // This test process links the CPU-only ggml: no "CUDA" entry.
    assert!(cuda::hook::cuda_reg().is_none());
    assert_eq!(
        cuda::register_launchers(LAUNCHERS),
        Registration::NoCudaBackend
    );
    assert_eq!(Registration::NoCudaBackend.message(), None);
    // SAFETY: None is always allowed.
    assert_eq!(
        unsafe { cuda::try_register(None, LAUNCHERS) },
        Registration::NoCudaBackend
    );
}

/// (fun, launch) pairs the stand-in hook was given.
static CALLS: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());

unsafe extern "C" fn fake_register(
    fun: sys::ggml_custom_op_t,
    launch: Option<CustomLaunch>,
) -> bool {
    let f = fun.map_or(0, |f| f as usize);
    let l = launch.map_or(0, |l| l as usize);
    CALLS.lock().unwrap().push((f, l));
    true
}

unsafe extern "C" fn name_cuda(_reg: sys::ggml_backend_reg_t) -> *const c_char {
    c"CUDA".as_ptr()
}

unsafe extern "C" fn no_devices(_reg: sys::ggml_backend_reg_t) -> usize {
    0
}

unsafe extern "C" fn procs_with_hook(
    _reg: sys::ggml_backend_reg_t,
    name: *const c_char,
) -> *mut c_void {
    // SAFETY: callers pass NUL-terminated names.
    if unsafe { CStr::from_ptr(name) } == REGISTER_PROC {
        fake_register as *mut c_void
    } else {
        std::ptr::null_mut()
    }
}

unsafe extern "C" fn procs_without_hook(
    _reg: sys::ggml_backend_reg_t,
    _name: *const c_char,
) -> *mut c_void {
    std::ptr::null_mut()
}

type Procs = unsafe extern "C" fn(sys::ggml_backend_reg_t, *const c_char) -> *mut c_void;

/// A stand-in "CUDA" registry entry (never added to ggml's registry).
fn fake_cuda(procs: Procs) -> Box<BackendReg> {
    Box::new(BackendReg {
        api_version: spark_backend::registry::GGML_BACKEND_API_VERSION,
        iface: BackendRegIface {
            get_name: Some(name_cuda),
            get_device_count: Some(no_devices),
            get_device: None,
            get_proc_address: Some(procs),
        },
        context: std::ptr::null_mut(),
    })
}

fn as_reg(r: &BackendReg) -> sys::ggml_backend_reg_t {
    (r as *const BackendReg).cast_mut().cast()
}

#[test]
fn a_cuda_backend_without_the_hook_gets_one_line_and_nothing_registered() {
    let reg = fake_cuda(procs_without_hook);
    // SAFETY: a live entry whose get_proc_address resolves nothing.
    let got = unsafe { cuda::try_register(Some(as_reg(&reg)), LAUNCHERS) };
    assert_eq!(got, Registration::NotRegistered(NO_HOOK.into()));
    let line = got.message().unwrap();
    assert_eq!(
        line,
        format!(
            "spark-backend: CUDA kernels not registered: {NO_HOOK}; Spark layers run on the CPU"
        )
    );
    assert!(!line.contains('\n'));
}

#[test]
fn a_cuda_backend_with_the_hook_gets_the_launchers_only_where_they_can_run() {
    let reg = fake_cuda(procs_with_hook);
    CALLS.lock().unwrap().clear();
    // SAFETY: a live entry resolving the hook to fake_register (the hook's type).
    let got = unsafe { cuda::try_register(Some(as_reg(&reg)), LAUNCHERS) };
    let calls = CALLS.lock().unwrap().clone();
    #[cfg(not(feature = "cuda"))]
    {
        assert_eq!(got, Registration::NotRegistered(cuda::NO_FEATURE.into()));
        assert!(got
            .message()
            .unwrap()
            .contains("built without the `cuda` feature"));
        assert!(calls.is_empty());
    }
    #[cfg(feature = "cuda")]
    match cuda::driver::libraries() {
        Err(why) => {
            // No driver here (the CI machine): a reason, and nothing registered.
            assert_eq!(got, Registration::NotRegistered(why.clone()));
            assert!(why.contains("libcuda") || why.contains("libnvrtc"), "{why}");
            assert!(calls.is_empty(), "{calls:?}");
        }
        Ok(version) => {
            let names: Vec<&str> = LAUNCHERS.iter().map(|l| l.name).collect();
            assert_eq!(
                got,
                Registration::Registered {
                    nvrtc: version,
                    ops: names.clone()
                }
            );
            assert_eq!(calls.len(), names.len());
            for (l, (f, launch)) in LAUNCHERS.iter().zip(&calls) {
                assert_eq!(*f, l.fun as usize, "{}", l.name);
                assert_eq!(*launch, l.launch as usize, "{}", l.name);
                let proc = spark_backend::registry::proc_address(l.name).unwrap();
                assert_eq!(proc as usize, *f, "{}: the registry's proc", l.name);
            }
        }
    }
}

#[test]
fn device_statistics_follow_spark_stats_and_the_setter() {
    let initial = std::env::var_os("SPARK_STATS").is_some_and(|v| !v.is_empty() && v != "0");
    assert_eq!(cuda::device_stats(), initial);
    cuda::set_device_stats(true);
    assert!(cuda::device_stats());
    cuda::set_device_stats(initial);
}

#[test]
fn the_build_without_the_feature_has_no_cuda_dependency() {
    let out = std::process::Command::new(env!("CARGO"))
        .args([
            "tree",
            "--offline",
            "-p",
            "spark-backend",
            "-e",
            "normal,build",
            "--prefix",
            "none",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo tree");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tree = String::from_utf8_lossy(&out.stdout);
    assert!(tree.contains("spark-backend"), "{tree}");
    assert!(
        !tree.contains("cudarc"),
        "cudarc without --features cuda:\n{tree}"
    );
}
