//! Runs llama-cpp-sys-2's own build script, included textually from the patched copy that
//! `spark-llama-prep` staged, with the working directory and `CARGO_MANIFEST_DIR` pointed there
//! (the upstream script finds `wrapper.h` and `llama.cpp/` through both).
//!
//! Cargo reads a relative `cargo:rerun-if-changed=wrapper.h` against *this* package's directory,
//! where the staged files are not, and would rerun the script (and cmake) on every build. So the
//! upstream script's stdout is captured and re-emitted with such paths made absolute.

use std::fs::File;
use std::io::{Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::path::Path;

// The upstream script is third-party code: its lints (e.g. deprecated `cc` calls) are not ours.
#[allow(warnings, clippy::all, clippy::pedantic)]
mod upstream {
    spark_llama_prep::upstream_build_rs!();

    pub fn run() {
        main()
    }
}

extern "C" {
    fn dup(fd: i32) -> i32;
    fn dup2(old: i32, new: i32) -> i32;
}

const STDOUT_FD: i32 = 1;

/// How llama.cpp is built for the whole project (see patches/README.md, "One llama.cpp"):
/// shared libraries (the `dynamic-link` feature) whose run path finds their siblings both in
/// the install tree (`OUT_DIR/lib`, `target/upstream/lib`) and in the build tree (`build/bin`,
/// where the upstream tools are built by tools/upstream.sh), and ggml's RPC backend for
/// `rpc-server` / `--rpc`.
const CMAKE_SETTINGS: [(&str, &str); 3] = [
    ("CMAKE_BUILD_WITH_INSTALL_RPATH", "ON"),
    ("CMAKE_INSTALL_RPATH", "$ORIGIN:$ORIGIN/../lib"),
    ("GGML_RPC", "ON"),
];

/// The upstream script hard-links each `lib*.so` of `OUT_DIR/lib` into the target directory
/// (and `deps/`, `examples/`) unless a file of that name exists. On Linux those are symlinks
/// (`libllama.so -> libllama.so.0`): the link made is a symlink dangling outside `lib/`, which
/// `exists()` does not see, so the next run (or another feature set's build) fails with "File
/// exists". Nothing uses these links (binaries find the libraries through their run path), and
/// cargo itself puts no symlinks there: remove every `lib*.so` symlink before the script runs.
fn remove_linked_symlinks(out_dir: &Path) {
    let Some(target_dir) = out_dir.ancestors().nth(3) else {
        return;
    };
    for dir in [
        target_dir.to_path_buf(),
        target_dir.join("deps"),
        target_dir.join("examples"),
    ] {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            let is_symlink = entry.file_type().is_ok_and(|t| t.is_symlink());
            if is_symlink && name.starts_with("lib") && name.ends_with(".so") {
                let link = entry.path();
                if let Err(e) = std::fs::remove_file(&link) {
                    panic!(
                        "llama-cpp-sys-2 (patched): cannot remove {}: {e}",
                        link.display()
                    );
                }
            }
        }
    }
}

/// cmake configures a build directory once (the upstream script never reconfigures), so a
/// changed series would leave the old tag in ggml_commit(): drop the cache to configure again
/// (an incremental rebuild; only what the new configuration changes is compiled).
fn reconfigure_if_series_changed(out_dir: &Path) {
    let build = out_dir.join("build");
    let version_h = build.join("ggml").join("src").join("ggml-version.h");
    let Ok(text) = std::fs::read_to_string(&version_h) else {
        return;
    };
    if !text.contains(&format!("\"{}\"", spark_llama_prep::SERIES_TAG)) {
        let cache = build.join("CMakeCache.txt");
        if let Err(e) = std::fs::remove_file(&cache) {
            panic!(
                "llama-cpp-sys-2 (patched): cannot remove {}: {e}",
                cache.display()
            );
        }
    }
}

fn main() {
    let dir = spark_llama_prep::PATCHED_SYS_DIR;
    if let Err(e) = std::env::set_current_dir(dir) {
        panic!("llama-cpp-sys-2 (patched): cannot enter {dir}: {e}");
    }
    // Build scripts are single-threaded; the upstream script reads these variables (it
    // forwards every GGML_* and CMAKE_* variable to cmake as a cache entry).
    std::env::set_var("CARGO_MANIFEST_DIR", dir);
    for (key, value) in CMAKE_SETTINGS {
        std::env::set_var(key, value);
    }
    std::env::set_var("GGML_BUILD_COMMIT_OVERRIDE", spark_llama_prep::SERIES_TAG);

    let out_dir = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    reconfigure_if_series_changed(Path::new(&out_dir));
    remove_linked_symlinks(Path::new(&out_dir));
    let capture_path = Path::new(&out_dir).join("upstream-build-stdout.txt");
    let mut capture = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&capture_path)
        .unwrap_or_else(|e| panic!("{}: {e}", capture_path.display()));
    std::io::stdout().flush().expect("flush stdout");
    // SAFETY: dup/dup2 on valid descriptors (fd 1 is open in a build script; `capture` is an
    // open file that outlives the redirection). Nothing else writes to fd 1 concurrently: the
    // build script is single-threaded until upstream spawns cmake, whose children inherit the
    // redirected descriptor, which is the point.
    let saved = unsafe { dup(STDOUT_FD) };
    assert!(saved >= 0, "dup(stdout) failed");
    // SAFETY: as above.
    assert!(
        unsafe { dup2(capture.as_raw_fd(), STDOUT_FD) } >= 0,
        "dup2 failed"
    );

    let result = std::panic::catch_unwind(upstream::run);

    let _ = std::io::stdout().flush();
    // SAFETY: `saved` is the descriptor dup'ed above; restoring it undoes the redirection.
    unsafe { dup2(saved, STDOUT_FD) };
    let mut text = String::new();
    capture
        .rewind()
        .and_then(|()| capture.read_to_string(&mut text))
        .unwrap_or_else(|e| panic!("{}: {e}", capture_path.display()));
    let mut stdout = std::io::stdout().lock();
    for line in text.lines() {
        let rerun = ["cargo:rerun-if-changed=", "cargo::rerun-if-changed="]
            .iter()
            .find_map(|prefix| line.strip_prefix(prefix).map(|path| (prefix, path)));
        let line = match rerun {
            Some((prefix, path)) if Path::new(path).is_relative() => {
                format!("{prefix}{}", Path::new(dir).join(path).display())
            }
            _ => line.to_string(),
        };
        // With shared libraries llama-common is installed beside libllama (and linked from
        // there with the others); the upstream script looks for it only in build/common.
        if line.contains("common feature was enabled, but no common library was found")
            && Path::new(&out_dir)
                .join("lib")
                .join("libllama-common.so")
                .exists()
        {
            continue;
        }
        writeln!(stdout, "{line}").expect("write stdout");
    }
    if result.is_ok() {
        // Packages that link llama.cpp put this directory in their binaries' run path
        // (DEP_LLAMA_LIB_DIR in their build scripts), so they run without LD_LIBRARY_PATH.
        let lib = Path::new(&out_dir).join("lib");
        writeln!(stdout, "cargo:lib_dir={}", lib.display()).expect("write stdout");
        writeln!(stdout, "cargo:series_tag={}", spark_llama_prep::SERIES_TAG)
            .expect("write stdout");
    }
    drop(stdout);
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}
