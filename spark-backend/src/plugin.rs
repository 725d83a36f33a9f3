//! The library as a ggml backend plugin loaded into another program's process (an upstream
//! llama.cpp tool started with `GGML_BACKEND_PATH=.../libggml-spark.so`, or `spark
//! --backend-path`): the entry point ggml looks up, the check that the process runs the ggml
//! this library was built against, and the `SPARK_STATS=1` report at exit (also when a server
//! such as `rpc-server`, which has no handler of its own, is ended by SIGINT or SIGTERM).
//!
//! The library links the shared `libggml-base`/`libggml-cpu` of the one llama.cpp build of the
//! project (patches/README.md, "One llama.cpp"), as ggml's own loadable backends do: inside the
//! host it uses the host's ggml. Its kernels read `ggml_tensor`s and the graph's parameter
//! structs with the layout of the sources it was built from, so it registers only when the
//! host's `ggml_commit()` is the series tag of those sources (set by patch 0005's
//! `GGML_BUILD_COMMIT_OVERRIDE`; any other llama.cpp build reports a git commit or "unknown").

use crate::{registry, stats};
use llama_cpp_sys_2 as sys;
use std::ffi::{c_char, CStr};
use std::sync::atomic::{AtomicBool, Ordering};

/// The `ggml_commit()` of the ggml this library was built against (the patch series tag).
pub(crate) const BUILT_AGAINST: &str = env!("SPARK_SERIES_TAG");

/// Why the plugin does not register in a process whose ggml reports `host_version` and
/// `host_commit`, or `None` when they are the ggml it was built against.
pub(crate) fn host_mismatch(host_version: &str, host_commit: &str) -> Option<String> {
    (host_commit != BUILT_AGAINST).then(|| {
        format!(
            "spark-backend: not registering the Spark kernels: built against ggml {BUILT_AGAINST}, \
             but this process runs ggml {host_version} ({host_commit}); build the tools and the \
             plugin together (bash tools/upstream.sh)"
        )
    })
}

/// The host's `ggml_version()` and `ggml_commit()`.
fn host_ggml() -> (String, String) {
    let text = |p: *const c_char| {
        if p.is_null() {
            "?".to_string()
        } else {
            // SAFETY: ggml returns pointers to static NUL-terminated strings.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        }
    };
    // SAFETY: both take no arguments and return static strings (or null, handled above).
    unsafe { (text(sys::ggml_version()), text(sys::ggml_commit())) }
}

/// True when `SPARK_STATS` asks for the report (set, not empty, not "0").
fn stats_requested() -> bool {
    std::env::var_os("SPARK_STATS").is_some_and(|v| !v.is_empty() && v != "0")
}

/// Set once the plugin registered with `SPARK_STATS` on: the at-exit report prints.
static REPORT_AT_EXIT: AtomicBool = AtomicBool::new(false);

/// Plugin entry point looked up by ggml's `ggml_backend_load` (and so by `GGML_BACKEND_PATH`):
/// the "Spark" registry entry, or null, with one line on stderr saying why, when the host's
/// ggml is not the one this library was built against. `ggml_backend_score` is optional for
/// ggml and not exported.
#[no_mangle]
pub extern "C" fn ggml_backend_init() -> sys::ggml_backend_reg_t {
    crate::ffi::guard("ggml_backend_init", std::ptr::null_mut(), || {
        let (version, commit) = host_ggml();
        if let Some(why) = host_mismatch(&version, &commit) {
            crate::log::stderr_text(&why);
            return std::ptr::null_mut();
        }
        if stats_requested() {
            REPORT_AT_EXIT.store(true, Ordering::Release);
            report_on_termination_signals();
        }
        let reg = registry::reg();
        // GPU launchers for the Spark ops when the host has ggml-cuda with the hook.
        crate::cuda::register_launchers(registry::LAUNCHERS);
        // Spark nodes may run in rpc-servers that have this plugin too (patch 0009).
        registry::register_rpc_ops();
        reg
    })
}

/// Prints the per-layer table when `SPARK_STATS` asked for it. Runs from `.fini_array`, when
/// this library is finalised: at process exit, or when ggml unloads its backends (its registry
/// is destroyed at exit), whichever comes first; the flag makes it print once.
extern "C" fn report_at_exit() {
    crate::ffi::guard("SPARK_STATS report", (), || {
        if REPORT_AT_EXIT.swap(false, Ordering::AcqRel) {
            // a tool may have left a progress line open (llama-perplexity's "ETA ..."): start
            // the table on a line of its own
            let mut text = String::from("\n");
            for line in stats::process_table() {
                text.push_str(&line);
                text.push('\n');
            }
            crate::log::stderr_text(&text);
        }
    });
}

/// For SIGINT and SIGTERM while they have their default action (a server without handlers of
/// its own, such as `rpc-server`; `llama-server` and `llama-cli` handle SIGINT themselves and
/// exit through the at-exit report): print the report, then die of the signal as before.
fn report_on_termination_signals() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: sigaction with a null new action only reads the current one into `old`.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        if unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) } != 0
            || old.sa_sigaction != libc::SIG_DFL
        {
            continue;
        }
        // SAFETY: a zeroed sigaction is a valid "no flags, empty mask" value to fill in.
        let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
        action.sa_sigaction = report_and_die as extern "C" fn(libc::c_int) as libc::sighandler_t;
        // SA_RESETHAND: the handler runs once and the signal's action is the default again,
        // so re-raising it ends the process as the signal would have.
        action.sa_flags = libc::SA_RESETHAND;
        // SAFETY: a valid action whose handler is async-signal-safe (report_and_die).
        unsafe {
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(sig, &action, std::ptr::null_mut());
        }
    }
}

/// The signal handler: the report (formatted on the stack, written with write(2): no
/// allocation, no lock), then the signal again with its default action.
extern "C" fn report_and_die(sig: libc::c_int) {
    if REPORT_AT_EXIT.swap(false, Ordering::AcqRel) {
        let mut out = StackWriter::default();
        let _ = std::fmt::Write::write_str(&mut out, "\n");
        let _ = stats::write_process_table(&mut out);
        out.flush();
    }
    // SAFETY: raise is async-signal-safe; the action is the default again (SA_RESETHAND).
    unsafe { libc::raise(sig) };
}

/// A `fmt::Write` into a fixed buffer on the stack, written to stderr (fd 2) with write(2)
/// whenever it fills up and on [`flush`](Self::flush).
struct StackWriter {
    buf: [u8; 1024],
    len: usize,
}

impl Default for StackWriter {
    fn default() -> Self {
        Self {
            buf: [0; 1024],
            len: 0,
        }
    }
}

impl StackWriter {
    fn flush(&mut self) {
        let mut done = 0;
        while done < self.len {
            // SAFETY: the pointer and length describe initialised bytes of `buf`.
            let n = unsafe {
                libc::write(2, self.buf[done..self.len].as_ptr().cast(), self.len - done)
            };
            if n <= 0 {
                break;
            }
            done += n as usize;
        }
        self.len = 0;
    }
}

impl std::fmt::Write for StackWriter {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        for chunk in s.as_bytes().chunks(self.buf.len()) {
            if self.len + chunk.len() > self.buf.len() {
                self.flush();
            }
            self.buf[self.len..self.len + chunk.len()].copy_from_slice(chunk);
            self.len += chunk.len();
        }
        Ok(())
    }
}

// SAFETY: an entry of `.fini_array` is a pointer to a function taking no arguments, called by
// the dynamic loader (or libc at exit) when the object is finalised. `report_at_exit` is such a
// function, does not unwind (guard), and touches only this library's statics and stderr.
#[used]
#[link_section = ".fini_array"]
static REPORT_AT_EXIT_FINI: extern "C" fn() = report_at_exit;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ggml_built_against_is_accepted() {
        assert_eq!(host_mismatch("0.26.0", BUILT_AGAINST), None);
        assert!(BUILT_AGAINST.starts_with("spark-"), "{BUILT_AGAINST}");
    }

    #[test]
    fn another_ggml_is_refused_with_one_line_naming_both() {
        for commit in ["unknown", "b1234abc", "spark-000000000000"] {
            let why = host_mismatch("0.9.7", commit).expect("refused");
            assert!(!why.contains('\n'), "{why}");
            assert!(why.contains(BUILT_AGAINST) && why.contains(commit), "{why}");
            assert!(
                why.contains("0.9.7") && why.contains("tools/upstream.sh"),
                "{why}"
            );
        }
    }

    #[test]
    fn this_process_runs_the_ggml_it_was_built_against() {
        let (version, commit) = host_ggml();
        assert_eq!(host_mismatch(&version, &commit), None, "{version} {commit}");
    }
}
