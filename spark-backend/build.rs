//! Compiles the C probes against the patched sources (staged by `spark-llama-prep`) and links
//! the objects into the integration tests only: `probe/reg_layout.c` (ggml's registry structs,
//! mirrored in `src/registry.rs`), `probe/graph_abi.c` (the graph's `spark-backend.h`,
//! mirrored in `src/ffn/tiling.rs`), both compared by `tests/registry.rs`, and
//! `probe/cuda_hook.c` (`tests/cuda_hook.rs`). Also records the series tag of the ggml it links
//! and puts that ggml's directory in the run path.

use std::path::Path;

fn main() {
    println!("cargo:rerun-if-changed=probe/reg_layout.c");
    println!("cargo:rerun-if-changed=probe/cuda_hook.c");
    println!("cargo:rerun-if-changed=probe/graph_abi.c");
    println!("cargo:rerun-if-changed=build.rs");
    println!(
        "cargo:rerun-if-changed={}",
        Path::new(spark_llama_prep::PATCHED_SYS_DIR)
            .join("llama.cpp/src/models/spark-backend.h")
            .display()
    );
    // The tag of the patched sources this crate is built against (`ggml_commit()` of that
    // ggml): the plugin refuses to register in a process whose ggml reports another.
    let tag = std::env::var("DEP_LLAMA_SERIES_TAG").expect("llama-cpp-sys-2 (patched) sets it");
    println!("cargo:rustc-env=SPARK_SERIES_TAG={tag}");
    let lib_dir = std::env::var("DEP_LLAMA_LIB_DIR").expect("llama-cpp-sys-2 (patched) sets it");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{lib_dir}");
    let llama = Path::new(spark_llama_prep::PATCHED_SYS_DIR).join("llama.cpp");
    let ggml = llama.join("ggml");
    // The hook's typedefs exist once patch 0008 is in the series; before, the probe is empty.
    let cuda_h =
        std::fs::read_to_string(ggml.join("include").join("ggml-cuda.h")).unwrap_or_default();
    let hook = cuda_h.contains("ggml_backend_cuda_custom_launch_t");
    println!("cargo:rustc-env=SPARK_CUDA_HOOK_PROBED={}", u8::from(hook));
    let mut build = cc::Build::new();
    build
        .file("probe/reg_layout.c")
        .file("probe/cuda_hook.c")
        .file("probe/graph_abi.c")
        .include(ggml.join("include"))
        .include(ggml.join("src"))
        .include(llama.join("src").join("models"))
        .cargo_metadata(false)
        .warnings(false);
    if hook {
        build.define("SPARK_HAVE_CUDA_HOOK", None);
    }
    let objects = build.compile_intermediates();
    for obj in objects {
        println!("cargo:rustc-link-arg-tests={}", obj.display());
    }
}
