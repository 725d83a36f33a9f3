//! Compiles `probe/reg_layout.c` against the patched ggml headers (staged by `spark-llama-prep`)
//! and links the object into the integration tests only, where `tests/registry.rs` compares the
//! C layout of `struct ggml_backend_reg` with the Rust mirror in `src/registry.rs`.

use std::path::Path;

fn main() {
    println!("cargo:rerun-if-changed=probe/reg_layout.c");
    println!("cargo:rerun-if-changed=build.rs");
    let ggml = Path::new(spark_llama_prep::PATCHED_SYS_DIR)
        .join("llama.cpp")
        .join("ggml");
    let objects = cc::Build::new()
        .file("probe/reg_layout.c")
        .include(ggml.join("include"))
        .include(ggml.join("src"))
        .cargo_metadata(false)
        .warnings(false)
        .compile_intermediates();
    for obj in objects {
        println!("cargo:rustc-link-arg-tests={}", obj.display());
    }
}
