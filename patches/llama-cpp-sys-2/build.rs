//! Runs llama-cpp-sys-2's own build script, included textually from the patched copy that
//! `spark-llama-prep` staged, with the working directory and `CARGO_MANIFEST_DIR` pointed there
//! (the upstream script finds `wrapper.h` and `llama.cpp/` through both).
// The upstream script is third-party code: its lints (e.g. deprecated `cc` calls) are not ours.
#[allow(warnings, clippy::all, clippy::pedantic)]
mod upstream {
    spark_llama_prep::upstream_build_rs!();

    pub fn run() {
        main()
    }
}

fn main() {
    let dir = spark_llama_prep::PATCHED_SYS_DIR;
    if let Err(e) = std::env::set_current_dir(dir) {
        panic!("llama-cpp-sys-2 (patched): cannot enter {dir}: {e}");
    }
    // Build scripts are single-threaded; the upstream script reads this variable.
    std::env::set_var("CARGO_MANIFEST_DIR", dir);
    upstream::run();
}
