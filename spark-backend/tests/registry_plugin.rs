//! The cdylib as a ggml backend plugin: `ggml_backend_load` (what `GGML_BACKEND_PATH` uses)
//! loads `libspark_backend.so` built by cargo next to this test binary and finds "Spark".
//! Kept in its own test binary so that no in-process registration is present.

use llama_cpp_sys_2 as sys;
use std::ffi::{CStr, CString};
use std::path::PathBuf;

/// `target/<profile>/deps/libspark_backend.so` (or the copy one level up).
fn plugin_path() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let deps = exe.parent().expect("deps directory");
    let name = format!(
        "{}spark_backend{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    );
    [
        deps.join(&name),
        deps.parent().expect("profile directory").join(&name),
    ]
    .into_iter()
    .find(|p| p.exists())
    .unwrap_or_else(|| panic!("{name} not found next to {}", exe.display()))
}

#[test]
fn ggml_backend_load_finds_the_spark_entry() {
    let path = CString::new(plugin_path().to_str().unwrap()).unwrap();
    // SAFETY: path is NUL-terminated; ggml loads the library and calls its ggml_backend_init.
    let reg = unsafe { sys::ggml_backend_load(path.as_ptr()) };
    assert!(!reg.is_null(), "ggml_backend_load failed for {path:?}");
    // SAFETY: reg is a registered entry from the plugin.
    let name = unsafe { CStr::from_ptr(sys::ggml_backend_reg_name(reg)) };
    assert_eq!(name.to_str().unwrap(), "Spark");
    // SAFETY: plain registry query.
    assert_eq!(
        unsafe { sys::ggml_backend_reg_by_name(c"Spark".as_ptr()) },
        reg
    );
    for f in ["spark_attn", "spark_stats_reset", "spark_stats_get"] {
        let fname = CString::new(f).unwrap();
        // SAFETY: reg is valid; name NUL-terminated.
        let p = unsafe { sys::ggml_backend_reg_get_proc_address(reg, fname.as_ptr()) };
        assert!(!p.is_null(), "{f} missing from the plugin");
        // The plugin's copy, not this binary's.
        assert_ne!(p, spark_backend::registry::proc_address(f).unwrap(), "{f}");
    }
    // SAFETY: reg is valid.
    assert!(unsafe { sys::ggml_backend_reg_get_proc_address(reg, c"nope".as_ptr()) }.is_null());
    // The plugin's statistics work on their own copy of the counters.
    type Get = unsafe extern "C" fn(i32, *mut spark_backend::stats::LayerStats) -> i32;
    // SAFETY: reg is valid; the plugin exports spark_stats_get with this signature.
    let get: Get = unsafe {
        std::mem::transmute(sys::ggml_backend_reg_get_proc_address(
            reg,
            c"spark_stats_get".as_ptr(),
        ))
    };
    let mut s = spark_backend::stats::LayerStats::default();
    // SAFETY: `s` is writable.
    assert_eq!(unsafe { get(0, &mut s) }, 0);
    // SAFETY: reg came from ggml_backend_load and is no longer used afterwards.
    unsafe { sys::ggml_backend_unload(reg) };
    // SAFETY: plain registry query.
    assert!(unsafe { sys::ggml_backend_reg_by_name(c"Spark".as_ptr()) }.is_null());
}
