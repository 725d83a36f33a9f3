//! Puts the directory of the shared llama.cpp libraries (built by the patched llama-cpp-sys-2)
//! in the run path of `spark` and the tests, so they run without LD_LIBRARY_PATH.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let lib_dir = std::env::var("DEP_LLAMA_LIB_DIR").expect("llama-cpp-sys-2 (patched) sets it");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{lib_dir}");
}
