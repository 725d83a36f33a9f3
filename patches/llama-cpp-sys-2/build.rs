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

fn main() {
    let dir = spark_llama_prep::PATCHED_SYS_DIR;
    if let Err(e) = std::env::set_current_dir(dir) {
        panic!("llama-cpp-sys-2 (patched): cannot enter {dir}: {e}");
    }
    // Build scripts are single-threaded; the upstream script reads this variable.
    std::env::set_var("CARGO_MANIFEST_DIR", dir);

    let out_dir = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR");
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
    assert!(unsafe { dup2(capture.as_raw_fd(), STDOUT_FD) } >= 0, "dup2 failed");

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
        writeln!(stdout, "{line}").expect("write stdout");
    }
    drop(stdout);
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}
