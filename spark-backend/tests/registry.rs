//! The "Spark" registry entry: C layout pinned to ggml-backend-impl.h (through the C probe that
//! build.rs compiles), the graph's C interface (spark-backend.h, another probe), in-process
//! registration, name lookup, the FFN tiling proc and the C statistics wrappers.

use llama_cpp_sys_2 as sys;
use spark_backend::attention::path::{ATTN_PATH_DENSE, ATTN_PATH_SPARSE};
use spark_backend::ffn::tiling::{FfnTiling, PATH_DENSE, PATH_FUSED, PATH_TWO_STAGE};
use spark_backend::registry::{
    self, BackendReg, BackendRegIface, GGML_BACKEND_API_VERSION, PROC_NAMES,
};
use spark_backend::stats::LayerStats;
use std::ffi::{c_void, CStr, CString};
use std::mem::{align_of, offset_of, size_of};

extern "C" {
    /// From probe/reg_layout.c: the C compiler's layout of ggml's registry structs.
    static spark_probe_reg_layout: [usize; 12];
    /// From probe/graph_abi.c: `struct spark_ffn_tiling` and `enum spark_ffn_path` of the
    /// patched `src/models/spark-backend.h`.
    static spark_probe_ffn_tiling_layout: [usize; 9];
    /// From probe/graph_abi.c: `enum spark_attn_path` of the header.
    static spark_probe_attn_path_values: [usize; 2];
    /// From probe/graph_abi.c: `struct spark_op_params` and `enum spark_ffn_cutoff` of the
    /// header, and ggml's op_params facts the block's placement in a node rests on.
    static spark_probe_op_params_layout: [usize; 22];
    /// From probe/graph_abi.c: `struct spark_memory_need` of the header.
    static spark_probe_memory_need_layout: [usize; 7];
    /// From probe/graph_abi.c: `struct spark_bytes` of the header.
    static spark_probe_bytes_layout: [usize; 4];
}

#[test]
fn the_weight_range_matches_the_headers() {
    use spark_backend::rows::paging::Bytes;
    // SAFETY: a constant array defined by the probe object linked into this test.
    let c = unsafe { spark_probe_bytes_layout };
    let rust = [
        size_of::<Bytes>(),
        align_of::<Bytes>(),
        offset_of!(Bytes, data),
        offset_of!(Bytes, size),
    ];
    let names = [
        "sizeof spark_bytes",
        "alignof spark_bytes",
        "offsetof data",
        "offsetof size",
    ];
    for ((name, c), rust) in names.iter().zip(c).zip(rust) {
        assert_eq!(c, rust, "{name}: C {c}, Rust {rust}");
    }
}

#[test]
fn the_memory_need_matches_the_headers() {
    use spark_backend::rows::budget::MemoryNeed;
    // SAFETY: a constant array defined by the probe object linked into this test.
    let c = unsafe { spark_probe_memory_need_layout };
    let rust = [
        size_of::<MemoryNeed>(),
        align_of::<MemoryNeed>(),
        offset_of!(MemoryNeed, made_at_load),
        offset_of!(MemoryNeed, mapped_whole),
        offset_of!(MemoryNeed, mapped_rows),
        offset_of!(MemoryNeed, mapped_lookup),
        offset_of!(MemoryNeed, rows_per_token),
    ];
    let names = [
        "sizeof spark_memory_need",
        "alignof spark_memory_need",
        "offsetof made_at_load",
        "offsetof mapped_whole",
        "offsetof mapped_rows",
        "offsetof mapped_lookup",
        "offsetof rows_per_token",
    ];
    for ((name, c), rust) in names.iter().zip(c).zip(rust) {
        assert_eq!(c, rust, "{name}: C {c}, Rust {rust}");
    }
}

#[test]
fn the_op_params_block_matches_the_headers_and_fits_after_ggmls_part() {
    use spark_backend::params::{self, OpParams, RopeParams};
    // SAFETY: a constant array defined by the probe object linked into this test.
    let c = unsafe { spark_probe_op_params_layout };
    let rust = [
        size_of::<OpParams>(),
        align_of::<OpParams>(),
        offset_of!(OpParams, layer),
        offset_of!(OpParams, k),
        offset_of!(OpParams, r),
        offset_of!(OpParams, softcap),
        offset_of!(OpParams, ffn_cutoff),
        offset_of!(OpParams, ffn_z),
        params::FFN_CUTOFF_TOP_K as usize,
        params::FFN_CUTOFF_STD_MUL as usize,
        params::GGML_CUSTOM_OP_PARAMS_SIZE,
        64,
        size_of::<RopeParams>(),
        align_of::<RopeParams>(),
        offset_of!(RopeParams, layer),
        offset_of!(RopeParams, r),
        offset_of!(RopeParams, freq_base),
        offset_of!(RopeParams, freq_scale),
        offset_of!(RopeParams, scale),
        offset_of!(RopeParams, reserved),
        size_of::<[i32; 16]>(),
        align_of::<i32>(),
    ];
    let names = [
        "sizeof spark_op_params",
        "alignof spark_op_params",
        "offsetof layer",
        "offsetof k",
        "offsetof r",
        "offsetof softcap",
        "offsetof ffn_cutoff",
        "offsetof ffn_z",
        "SPARK_FFN_CUTOFF_TOP_K (params::FFN_CUTOFF_TOP_K)",
        "SPARK_FFN_CUTOFF_STD_MUL (params::FFN_CUTOFF_STD_MUL)",
        "sizeof ggml_custom_op_params (params::GGML_CUSTOM_OP_PARAMS_SIZE)",
        "GGML_MAX_OP_PARAMS",
        "sizeof spark_rope_params",
        "alignof spark_rope_params",
        "offsetof rope layer",
        "offsetof rope r",
        "offsetof rope freq_base",
        "offsetof rope freq_scale",
        "offsetof rope scale",
        "offsetof rope reserved",
        "sizeof ggml_tensor.op_params",
        "alignof int32_t",
    ];
    let of =
        |values: [usize; 22]| -> Vec<(&str, usize)> { names.into_iter().zip(values).collect() };
    assert_eq!(
        of(rust),
        of(c),
        "Rust (src/params.rs) vs C (probe/graph_abi.c)"
    );
    // The block and the call state sit past ggml's struct and inside op_params.
    assert!(params::CALL_STATE_OFFSET >= c[10]);
    assert!(params::BLOCK_OFFSET + 4 + c[0] <= c[20]);
    // spark_rope's view is the same size as the block it is copied into.
    assert_eq!(c[12], c[0]);
}

#[test]
fn the_graph_stores_a_nodes_params_through_the_registry() {
    use spark_backend::params::{self, OpParams};
    type SetParams = unsafe extern "C" fn(*mut sys::ggml_tensor, *const OpParams) -> i32;
    registry::register();
    // SAFETY: name is NUL-terminated; ggml returns null or a registered entry.
    let reg = unsafe { sys::ggml_backend_reg_by_name(c"Spark".as_ptr()) };
    assert!(!reg.is_null());
    // SAFETY: a registered entry and a NUL-terminated name.
    let f = unsafe { sys::ggml_backend_reg_get_proc_address(reg, c"spark_op_set_params".as_ptr()) };
    assert!(!f.is_null(), "spark_op_set_params is not exported");
    // SAFETY: the entry exports spark_op_set_params with this signature (probe above).
    let set: SetParams = unsafe { std::mem::transmute(f) };
    // SAFETY: a small no_alloc context; tensors are metadata only.
    unsafe {
        let ctx = sys::ggml_init(sys::ggml_init_params {
            mem_size: 1 << 16,
            mem_buffer: std::ptr::null_mut(),
            no_alloc: true,
        });
        let a = sys::ggml_new_tensor_1d(ctx, 0, 8);
        let mut args = [a];
        let node = sys::ggml_custom_4d(
            ctx,
            0,
            8,
            1,
            1,
            1,
            args.as_mut_ptr(),
            1,
            Some(spark_backend::ffn::cpu_ops::spark_ffn_sum),
            -1,
            std::ptr::null_mut(),
        );
        let before = (*node).op_params;
        let p = OpParams {
            layer: 3,
            k: 41,
            r: 0,
            softcap: 0.0,
            ffn_cutoff: params::FFN_CUTOFF_STD_MUL,
            ffn_z: 1.644_853_4,
        };
        assert_eq!(set(node, &p), 0);
        // ggml's part of op_params (fun, n_tasks, userdata) is untouched, the whole block stored
        let after = (*node).op_params;
        assert_eq!(after[..6], before[..6]);
        let stored = std::ptr::addr_of!((*node).op_params)
            .cast::<u8>()
            .add(params::BLOCK_OFFSET + 4)
            .cast::<OpParams>()
            .read_unaligned();
        assert_eq!(stored, p);
        // a node that is not a custom op, a null node or null params: refused, nothing written
        let plain = sys::ggml_add(ctx, a, a);
        let plain_before = (*plain).op_params;
        assert_eq!(set(plain, &p), -1);
        assert_eq!((*plain).op_params, plain_before);
        assert_eq!(set(std::ptr::null_mut(), &p), -1);
        assert_eq!(set(node, std::ptr::null()), -1);
        sys::ggml_free(ctx);
    }
}

#[test]
fn the_ffn_tiling_mirror_matches_the_graphs_c_header() {
    // SAFETY: a constant array defined by the probe object linked into this test.
    let c = unsafe { spark_probe_ffn_tiling_layout };
    let t = FfnTiling::default();
    let rust = [
        size_of::<FfnTiling>(),
        align_of::<FfnTiling>(),
        offset_of!(FfnTiling, path),
        offset_of!(FfnTiling, n_chunk),
        std::mem::size_of_val(&t.path),
        std::mem::size_of_val(&t.n_chunk),
        PATH_FUSED as usize,
        PATH_TWO_STAGE as usize,
        PATH_DENSE as usize,
    ];
    let names = [
        "sizeof spark_ffn_tiling",
        "alignof spark_ffn_tiling",
        "offsetof path",
        "offsetof n_chunk",
        "sizeof path",
        "sizeof n_chunk",
        "SPARK_FFN_PATH_FUSED",
        "SPARK_FFN_PATH_TWO_STAGE",
        "SPARK_FFN_PATH_DENSE",
    ];
    let of = |values: [usize; 9]| -> Vec<(&str, usize)> { names.into_iter().zip(values).collect() };
    assert_eq!(
        of(rust),
        of(c),
        "Rust (src/ffn/tiling.rs) vs C (probe/graph_abi.c)"
    );
}

#[test]
fn the_attention_path_mirror_matches_the_graphs_c_header_and_resolves() {
    // SAFETY: a constant array defined by the probe object linked into this test.
    let c = unsafe { spark_probe_attn_path_values };
    assert_eq!(
        [ATTN_PATH_SPARSE as usize, ATTN_PATH_DENSE as usize],
        c,
        "SPARK_ATTN_PATH_SPARSE, SPARK_ATTN_PATH_DENSE: Rust (src/attention/path.rs) vs C"
    );
    type Path = unsafe extern "C" fn(*const std::ffi::c_char, i64, *mut i32) -> i32;
    // the Rust function has this very type (a compile error otherwise), as the header's typedef
    // has (probe/graph_abi.c)
    let _: Path = spark_backend::attention::path::spark_attn_path;
    let p = registered_proc("spark_attn_path");
    // SAFETY: the registry returns this function under this name with this signature.
    let path: Path = unsafe { std::mem::transmute::<*mut c_void, Path>(p) };
    let mut out = 0;
    // SAFETY: a C string; `out` is writable.
    assert_eq!(unsafe { path(c"CPU".as_ptr(), 512, &mut out) }, 0);
    assert_eq!(out, ATTN_PATH_SPARSE);
    // SAFETY: as above.
    assert_eq!(unsafe { path(c"CPU".as_ptr(), 0, &mut out) }, -1);
}

#[test]
fn the_graph_gets_its_ffn_tiling_through_the_registry() {
    type Tiling =
        unsafe extern "C" fn(*const std::ffi::c_char, i64, i64, i64, *mut FfnTiling) -> i32;
    // the Rust function has this very type (a compile error otherwise), as the C header's
    // typedef has (probe/graph_abi.c)
    let _: Tiling = spark_backend::ffn::tiling::spark_ffn_tiling;
    let p = registered_proc("spark_ffn_tiling");
    // SAFETY: the registry returns this function under this name with this signature (the
    // signature is pinned against the header by probe/graph_abi.c).
    let tiling: Tiling = unsafe { std::mem::transmute::<*mut c_void, Tiling>(p) };
    let mut out = FfnTiling::default();
    let cpu = c"CPU".as_ptr();
    // A decode step and a 4096-token ubatch at Gemma-2 2B shapes, as the graph asks for weights
    // in host memory.
    // SAFETY: a C string; `out` is writable.
    assert_eq!(unsafe { tiling(cpu, 1, 9216, 2304, &mut out) }, 0);
    assert_eq!((out.path, out.n_chunk), (PATH_FUSED, 16));
    // SAFETY: as above.
    assert_eq!(unsafe { tiling(cpu, 4096, 9216, 2304, &mut out) }, 0);
    assert_eq!(out.path, PATH_TWO_STAGE);
    // SAFETY: as above.
    assert_eq!(unsafe { tiling(cpu, 0, 9216, 2304, &mut out) }, -1);
    // weights on a CUDA device: one chunk with this plugin's CUDA launchers (feature cuda)
    // SAFETY: as above.
    assert_eq!(
        unsafe { tiling(c"CUDA".as_ptr(), 1, 9216, 2304, &mut out) },
        0
    );
    let cuda_chunks = if cfg!(feature = "cuda") { 1 } else { 16 };
    assert_eq!((out.path, out.n_chunk), (PATH_FUSED, cuda_chunks));
}

#[test]
fn rust_mirror_matches_the_c_layout() {
    // SAFETY: a constant array defined by the probe object linked into this test.
    let c = unsafe { spark_probe_reg_layout };
    let rust = [
        GGML_BACKEND_API_VERSION as usize,
        size_of::<BackendReg>(),
        align_of::<BackendReg>(),
        offset_of!(BackendReg, api_version),
        offset_of!(BackendReg, iface),
        offset_of!(BackendReg, context),
        size_of::<BackendRegIface>(),
        align_of::<BackendRegIface>(),
        offset_of!(BackendRegIface, get_name),
        offset_of!(BackendRegIface, get_device_count),
        offset_of!(BackendRegIface, get_device),
        offset_of!(BackendRegIface, get_proc_address),
    ];
    let names = [
        "GGML_BACKEND_API_VERSION",
        "sizeof reg",
        "alignof reg",
        "offsetof api_version",
        "offsetof iface",
        "offsetof context",
        "sizeof reg_i",
        "alignof reg_i",
        "offsetof get_name",
        "offsetof get_device_count",
        "offsetof get_device",
        "offsetof get_proc_address",
    ];
    for ((name, r), c) in names.iter().zip(rust).zip(c) {
        assert_eq!(r, c, "{name}: Rust {r}, C {c}");
    }
}

fn lookup(reg: sys::ggml_backend_reg_t, name: &str) -> *mut c_void {
    let name = CString::new(name).unwrap();
    // SAFETY: reg is a registered entry; name is NUL-terminated.
    unsafe { sys::ggml_backend_reg_get_proc_address(reg, name.as_ptr()) }
}

/// The proc `name` of the "Spark" entry as ggml hands it to the graph, after registering the
/// entry; fails the test when it does not resolve.
fn registered_proc(name: &str) -> *mut c_void {
    registry::register();
    // SAFETY: name is NUL-terminated; ggml returns null or a registered entry.
    let reg = unsafe { sys::ggml_backend_reg_by_name(c"Spark".as_ptr()) };
    assert!(!reg.is_null(), "no \"Spark\" entry after register()");
    let p = lookup(reg, name);
    assert!(!p.is_null(), "{name} does not resolve");
    p
}

#[test]
fn registration_is_idempotent_and_ggml_finds_the_entry() {
    let threads: Vec<_> = (0..4)
        .map(|_| std::thread::spawn(registry::register))
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    registry::register();
    assert!(registry::is_registered());
    // SAFETY: name is NUL-terminated; ggml returns null or a registered entry.
    let reg = unsafe { sys::ggml_backend_reg_by_name(c"Spark".as_ptr()) };
    assert_eq!(reg, registry::reg());
    // Registered exactly once.
    // SAFETY: plain registry queries.
    let count = (0..unsafe { sys::ggml_backend_reg_count() })
        .filter(|&i| unsafe { sys::ggml_backend_reg_get(i) } == registry::reg())
        .count();
    assert_eq!(count, 1);
    // SAFETY: reg is valid.
    let name = unsafe { CStr::from_ptr(sys::ggml_backend_reg_name(reg)) };
    assert_eq!(name.to_str().unwrap(), "Spark");
    // SAFETY: reg is valid.
    assert_eq!(unsafe { sys::ggml_backend_reg_dev_count(reg) }, 0);
    for name in PROC_NAMES {
        let p = lookup(reg, name);
        assert!(!p.is_null(), "{name} does not resolve");
        assert_eq!(Some(p), registry::proc_address(name));
    }
    assert_eq!(
        lookup(reg, "spark_attn"),
        spark_backend::attention::cpu_op::spark_attn as *mut c_void
    );
    assert!(lookup(reg, "spark_nonexistent").is_null());
    assert!(lookup(reg, "").is_null());
    assert!(lookup(reg, "SPARK_ATTN").is_null());
}

#[test]
fn get_proc_address_tolerates_a_null_name() {
    // SAFETY: `reg()` points at the crate's static entry (a live BackendReg).
    let iface = unsafe { (*registry::reg().cast::<BackendReg>()).iface };
    let get_proc_address = iface.get_proc_address.expect("get_proc_address is set");
    // SAFETY: a null name is part of the function's contract.
    assert!(unsafe { get_proc_address(registry::reg(), std::ptr::null()) }.is_null());
    // SAFETY: the entry's own callbacks, called as ggml would.
    unsafe {
        assert_eq!(
            CStr::from_ptr(iface.get_name.unwrap()(registry::reg()))
                .to_str()
                .unwrap(),
            "Spark"
        );
        assert_eq!(iface.get_device_count.unwrap()(registry::reg()), 0);
        assert!(iface.get_device.unwrap()(registry::reg(), 0).is_null());
    }
}

#[test]
fn stats_c_wrappers_reset_and_read() {
    type Get = unsafe extern "C" fn(i32, *mut LayerStats) -> i32;
    type Reset = extern "C" fn();
    // Resolve through the registry, as llama.cpp does.
    // SAFETY: the registry returns these functions under these names with these signatures.
    let get: Get = unsafe {
        std::mem::transmute::<*mut c_void, Get>(registry::proc_address("spark_stats_get").unwrap())
    };
    // SAFETY: as above.
    let reset: Reset = unsafe {
        std::mem::transmute::<*mut c_void, Reset>(
            registry::proc_address("spark_stats_reset").unwrap(),
        )
    };
    spark_backend::stats::record_attn(7, 30, 3);
    spark_backend::stats::record_ffn(7, 50, 2, 100);
    let mut s = LayerStats::default();
    // SAFETY: `s` is writable.
    assert_eq!(unsafe { get(7, &mut s) }, 0);
    assert!(s.attn_kept >= 30 && s.attn_queries >= 3 && s.ffn_width == 100);
    reset();
    // SAFETY: as above.
    assert_eq!(unsafe { get(7, &mut s) }, 0);
    assert_eq!(s, LayerStats::default());
    let mut untouched = LayerStats {
        ffn_kept: 9,
        ..LayerStats::default()
    };
    // SAFETY: as above; out-of-range layers leave `untouched` alone.
    assert_eq!(unsafe { get(-3, &mut untouched) }, -1);
    assert_eq!(untouched.ffn_kept, 9);
    // SAFETY: null is part of the contract.
    assert_eq!(unsafe { get(0, std::ptr::null_mut()) }, -1);
}
