//! The one entry protocol of every Spark custom op (`spark_ffn_*`, `spark_attn`).
//!
//! ggml calls a custom op on all `nth` threads of a graph node at once, with no barrier inside
//! the node. Each op therefore has a fixed partition of its output over the threads (its
//! *share*, defined once by the op and used both to compute and to fill), and every call goes
//! through [`enter`]:
//!
//! 1. The thread index is checked. A bad one (`ith < 0`, `nth < 1`, `ith >= nth`) means ggml's
//!    contract is broken and no share is known: the thread fills the whole output with NaN.
//! 2. [`SparkOp::prepare`] reads and checks `dst`, its sources and the userdata. It is a pure
//!    function of the tensors, so every thread of the call gets the same result; on an error
//!    each thread fills its contiguous block of output rows ([`tensor::fill_nan_rows`]), which
//!    together cover the output exactly once.
//! 3. [`SparkOp::run`] computes the thread's share. An error or a panic there makes the thread
//!    fill exactly the share it owns ([`SparkOp::fill_owned`]) and nothing else: other threads
//!    may still be writing theirs.
//!
//! Failures print one line `spark-backend: <op>: layer <L>: <reason>; output set to NaN`
//! (at most [`MAX_ERROR_LINES`] per process, then one line saying the rest are not printed).
//! Nothing unwinds into C. A failure shows as NaN in the op's output and from there in the
//! logits, never as a silently wrong value.
//!
//! [`tensor::fill_nan_rows`]: crate::tensor::fill_nan_rows

use crate::ffi::panic_message;
use crate::params;
use crate::KernelError;
use llama_cpp_sys_2 as sys;
use std::ffi::{c_int, c_void};
use std::io::Write;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};

/// How many failure lines are printed per process before going quiet.
pub const MAX_ERROR_LINES: usize = 8;

/// A Spark custom op, as the entry protocol sees it.
///
/// # Safety (for implementors)
/// `prepare` must reject every `dst`/source/userdata combination for which `run` could read or
/// write out of bounds; `run(ith, nth)` must write only the elements `fill_owned(ith, nth, _)`
/// writes, and the shares of `0..nth` must be disjoint.
pub(crate) trait SparkOp: Sized {
    /// The name ggml resolves through the registry (`spark_ffn_up`, ...), used in messages.
    const NAME: &'static str;

    /// Reads and checks `dst`, its sources and `userdata`.
    ///
    /// # Safety
    /// `dst` is null or a live ggml tensor whose sources are null or live; `userdata` is null or
    /// the op's parameter struct.
    unsafe fn prepare(
        dst: *mut sys::ggml_tensor,
        userdata: *mut c_void,
    ) -> Result<Self, KernelError>;

    /// Computes thread `ith`'s share of the output (`ith < nth`).
    ///
    /// # Safety
    /// The tensors checked by `prepare` are still live and nothing else writes this share.
    unsafe fn run(&self, ith: usize, nth: usize) -> Result<(), KernelError>;

    /// Writes `value` into every output element thread `ith` of `nth` owns.
    ///
    /// # Safety
    /// As for [`run`](Self::run).
    unsafe fn fill_owned(&self, ith: usize, nth: usize, value: f32);
}

/// Runs one call of `Op` for ggml: checks, computes, and turns every failure into one message
/// and a NaN-filled share (module docs).
///
/// # Safety
/// As ggml calls a `ggml_custom_op_t`: `dst` is null or a live custom-op tensor whose sources
/// are null or live, and `userdata` is null or the op's parameter struct.
pub(crate) unsafe fn enter<Op: SparkOp>(
    dst: *mut sys::ggml_tensor,
    ith: c_int,
    nth: c_int,
    userdata: *mut c_void,
) {
    // SAFETY: userdata is null or a Spark parameter struct (contract).
    let layer = unsafe { params::layer_of(userdata) };
    let Some((ith, nth)) = thread_index(ith, nth) else {
        report(Op::NAME, layer, &format!("bad thread index {ith} of {nth}"));
        // SAFETY: dst is null or live (contract); with no share known, the whole output.
        unsafe { crate::tensor::fill_nan_rows(dst, 0, 1) };
        return;
    };
    // SAFETY: forwarded contract.
    let prepared = catch_unwind(AssertUnwindSafe(|| unsafe { Op::prepare(dst, userdata) }));
    let op = match prepared {
        Ok(Ok(op)) => op,
        failed => {
            // Every thread checks the same tensors: one line (thread 0) is enough for an error,
            // a panic is reported by whichever thread had it.
            match failed {
                Ok(Err(e)) if ith == 0 => report(Op::NAME, layer, &e.to_string()),
                Err(p) => report(Op::NAME, layer, &panicked(ith, nth, p.as_ref())),
                _ => {}
            }
            // SAFETY: dst is null or live; row blocks of 0..nth are disjoint and cover dst.
            unsafe { crate::tensor::fill_nan_rows(dst, ith, nth) };
            return;
        }
    };
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: prepare checked the tensors; this thread writes its own share only.
        let result = unsafe { op.run(ith, nth) };
        fault::inject(dst, ith);
        result
    }));
    let message = match outcome {
        Ok(Ok(())) => return,
        Ok(Err(e)) => format!("thread {ith} of {nth}: {e}"),
        Err(p) => panicked(ith, nth, p.as_ref()),
    };
    report(Op::NAME, layer, &message);
    // SAFETY: as for run; exactly this thread's share.
    unsafe { op.fill_owned(ith, nth, f32::NAN) };
}

/// Defines the exported `ggml_custom_op_t` entry point `$name` of the [`SparkOp`] `$op`: the
/// symbol name is the name the registry resolves it by (`registry::proc_address`), so the
/// exported C symbol, the registry name and `SparkOp::NAME` are one name.
macro_rules! custom_op {
    ($(#[$doc:meta])* $name:ident => $op:ident) => {
        $(#[$doc])*
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            dst: *mut ::llama_cpp_sys_2::ggml_tensor,
            ith: ::std::ffi::c_int,
            nth: ::std::ffi::c_int,
            userdata: *mut ::std::ffi::c_void,
        ) {
            const _: () = assert!(crate::op::same_name(stringify!($name), $op::NAME));
            // SAFETY: forwarded contract of this function (its `# Safety` section).
            unsafe { crate::op::enter::<$op>(dst, ith, nth, userdata) }
        }
    };
}
pub(crate) use custom_op;

/// `a == b`, usable in constants (the entry point's name against its op's `NAME`).
pub(crate) const fn same_name(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// `(ith, nth)` as indices when `0 <= ith < nth`.
fn thread_index(ith: c_int, nth: c_int) -> Option<(usize, usize)> {
    let (i, n) = (usize::try_from(ith).ok()?, usize::try_from(nth).ok()?);
    (i < n).then_some((i, n))
}

fn panicked(ith: usize, nth: usize, payload: &(dyn std::any::Any + Send)) -> String {
    format!("panic in thread {ith} of {nth}: {}", panic_message(payload))
}

/// Prints one failure line (rate-limited for the whole process); a failed write is ignored.
/// The CPU entry protocol and the CUDA launchers (`crate::cuda`) report through this one function.
pub(crate) fn report(op: &str, layer: Option<i32>, reason: &str) {
    static PRINTED: AtomicUsize = AtomicUsize::new(0);
    let layer = layer.map_or_else(|| "?".to_owned(), |l| l.to_string());
    let line = format!("spark-backend: {op}: layer {layer}: {reason}; output set to NaN");
    fault::record(&line);
    let n = PRINTED.fetch_add(1, Ordering::Relaxed);
    let mut err = std::io::stderr().lock();
    if n < MAX_ERROR_LINES {
        let _ = writeln!(err, "{line}");
    } else if n == MAX_ERROR_LINES {
        let _ = writeln!(
            err,
            "spark-backend: more op failures; not printing them (outputs still set to NaN)"
        );
    }
}

/// A test-only fault switch: with the `fault-injection` feature, [`arm`](fault::arm) makes the
/// op computing one tensor panic in one thread (after it computed its share), so tests can
/// check that the failure path NaN-fills exactly that share; [`reports`](fault::reports) returns
/// every failure line (printed or not). Without the feature nothing is compiled in.
#[cfg(feature = "fault-injection")]
pub mod fault {
    use llama_cpp_sys_2 as sys;
    use std::sync::{Mutex, MutexGuard};

    /// Armed faults: (dst address, thread index).
    static ARMED: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());
    static REPORTS: Mutex<Vec<String>> = Mutex::new(Vec::new());

    fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
        m.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes every later call computing `dst` in thread `ith` panic, until [`disarm`].
    pub fn arm(dst: *const sys::ggml_tensor, ith: usize) {
        lock(&ARMED).push((dst as usize, ith));
    }

    /// Removes every fault armed for `dst`.
    pub fn disarm(dst: *const sys::ggml_tensor) {
        lock(&ARMED).retain(|&(d, _)| d != dst as usize);
    }

    /// Every failure line reported so far in this process, in order.
    pub fn reports() -> Vec<String> {
        lock(&REPORTS).clone()
    }

    pub(crate) fn inject(dst: *const sys::ggml_tensor, ith: usize) {
        if lock(&ARMED).contains(&(dst as usize, ith)) {
            panic!("injected fault");
        }
    }

    pub(crate) fn record(line: &str) {
        lock(&REPORTS).push(line.to_owned());
    }
}

#[cfg(not(feature = "fault-injection"))]
mod fault {
    use llama_cpp_sys_2 as sys;

    #[inline(always)]
    pub(crate) fn inject(_dst: *const sys::ggml_tensor, _ith: usize) {}

    #[inline(always)]
    pub(crate) fn record(_line: &str) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_index_accepts_only_ith_below_nth() {
        assert_eq!(thread_index(0, 1), Some((0, 1)));
        assert_eq!(thread_index(3, 4), Some((3, 4)));
        assert_eq!(thread_index(4, 4), None);
        assert_eq!(thread_index(-1, 4), None);
        assert_eq!(thread_index(0, 0), None);
        assert_eq!(thread_index(0, -2), None);
    }
}
