//! The one entry protocol of every Spark custom op (`spark_ffn_*`, `spark_attn`).
//!
//! ggml calls a custom op once on each of the `nth` threads of a graph node (ggml-cpu's
//! `ggml_graph_compute_thread` runs every node on every thread, `ggml_compute_forward_custom`
//! passes `ith`, `nth` through), with no barrier inside the node and a barrier between nodes.
//! Each op cuts its output into a fixed list of *chunks* ([`SparkOp::n_chunks`], a function of
//! the shapes and of `nth`, the same for every thread of a call, never of `ith` or the
//! schedule), and the threads of one call take chunks from a shared counter ([`Claims`]): a
//! thread that runs takes what is left, so a node no longer waits for a thread the OS has
//! descheduled before it did its static share. Every chunk is computed by one thread with
//! arithmetic that does not depend on which thread or how many threads there are, so results
//! are bit-identical for any `nth` and any schedule. Every call goes through [`enter`]:
//!
//! 1. The thread index is checked. A bad one (`ith < 0`, `nth < 1`, `ith >= nth`) means ggml's
//!    contract is broken and no share is known: the thread fills the whole output with NaN (and
//!    takes no part in the chunk counter). Then the reach of dst and of every source is
//!    checked ([`unaddressable`]): a tensor whose elements span more than the address space or
//!    overlap (ne and nb an RPC client chose) is refused before anything reads it, like a failed
//!    check below, except that a dst of that kind is not written at all.
//! 2. The thread joins the call's shared state ([`Call`], two counters in `dst`'s own
//!    `op_params`), held by a drop guard until it returns, whatever the path.
//! 3. [`SparkOp::prepare`] reads and checks `dst`, its sources and the parameters stored in the
//!    node (`crate::params`; ggml's `userdata` is not read), and fixes the
//!    chunks for `nth` threads. It is a pure function of the tensors and `nth`, so every thread
//!    of the call gets the same result; on an error each thread fills its contiguous block of
//!    output rows ([`tensor::fill_nan_rows`]), which together cover the output exactly once.
//! 4. [`SparkOp::run`] computes the chunks it claims until none are left. An error or a panic
//!    there makes the thread claim every chunk still unclaimed (so no chunk is left unwritten
//!    when every thread fails) and fill exactly the chunks it claimed ([`SparkOp::fill_chunk`])
//!    and nothing else: other threads may still be writing theirs.
//!
//! The shared state of a call is `{next chunk, threads done}`, two atomic `u32` in the node's
//! `op_params` past ggml's `struct ggml_custom_op_params` (zero at rest; `crate::params` has
//! the layout): each thread counts itself done when it leaves [`enter`] (drop guard: errors and
//! caught panics included), and the thread that brings the count to `nth` resets both to zero.
//! All claims of the call are over by then, and ggml starts the next evaluation of the node
//! only after its barrier, so that one finds a fresh state. Two graphs computed at once (two
//! llama contexts) have distinct nodes, hence distinct states. No thread ever waits to join a
//! call: an earlier version kept the states in a mutex-protected table, whose contended lock
//! put a thread to sleep (futex) mid-graph while the other spun at ggml's barrier, which on
//! this project's VMs cost whole scheduler slices on small models (docs/PERF.md, "Small
//! models"). The scheme relies on ggml's contract that each of `0..nth` calls exactly once per
//! evaluation; a call with a bad index is not counted.
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
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

/// How many failure lines are printed per process before going quiet.
pub(crate) const MAX_ERROR_LINES: usize = 8;

/// A Spark custom op, as the entry protocol sees it.
///
/// # Safety (for implementors)
/// `prepare` must reject every `dst`/source/params_block combination for which `run` could read or
/// write out of bounds. The chunks `0..n_chunks()` must be disjoint parts of the output, fixed
/// by the shapes and the `nth` given to `prepare` alone. `run` must write only the elements of
/// the chunks its [`Claims`] yielded to it, each exactly as `fill_chunk` of that chunk covers
/// it, and compute a chunk's values with arithmetic that does not depend on the thread, on
/// `nth` or on the other chunks the thread claimed (bit-identical results for any schedule).
pub(crate) trait SparkOp: Sized {
    /// The name ggml resolves through the registry (`spark_ffn_up`, ...), used in messages.
    const NAME: &'static str;

    /// Reads and checks `dst`, its sources and `params_block`, and cuts the output into chunks for a
    /// call on `nth` threads (an op may ignore `nth`; its results must not depend on it).
    ///
    /// # Safety
    /// `dst` is null or a live ggml tensor whose sources are null or live; `userdata` is null or
    /// the op's parameter struct.
    unsafe fn prepare(
        dst: *mut sys::ggml_tensor,
        params_block: *mut c_void,
        nth: usize,
    ) -> Result<Self, KernelError>;

    /// How many chunks the output is cut into (a function of the checked shapes and `nth`).
    fn n_chunks(&self) -> usize;

    /// Computes every chunk `claims` yields, until it yields `None` (thread `ith` of the call,
    /// for per-thread bookkeeping such as statistics only). Per-thread set-up belongs after the
    /// first claim, so that a thread arriving when nothing is left returns at once.
    ///
    /// # Safety
    /// The tensors checked by `prepare` are still live and nothing else writes the claimed
    /// chunks.
    unsafe fn run(&self, ith: usize, claims: &mut Claims<'_>) -> Result<(), KernelError>;

    /// Writes `value` into every output element of chunk `c` (`c < n_chunks()`).
    ///
    /// # Safety
    /// As for [`run`](Self::run): the caller claimed chunk `c`.
    unsafe fn fill_chunk(&self, c: usize, value: f32);
}

/// Runs one call of `Op` for ggml: checks, computes, and turns every failure into one message
/// and NaN in the chunks the thread claimed (module docs).
///
/// # Safety
/// As ggml calls a `ggml_custom_op_t`: `dst` is null or a live custom-op tensor whose sources
/// are null or live. ggml's `userdata` is not read: the op's parameters are the block the graph
/// stored in `dst` (`params::block`), so a node needs no pointer of the process that built it.
pub(crate) unsafe fn enter<Op: SparkOp>(dst: *mut sys::ggml_tensor, ith: c_int, nth: c_int) {
    // SAFETY: dst is null or live (contract).
    let params_block = unsafe { params::block(dst) }.cast_mut();
    // SAFETY: params_block is null or the node's parameter block.
    let layer = unsafe { params::layer_of(params_block) };
    let Some((ith, nth)) = thread_index(ith, nth) else {
        report(Op::NAME, layer, &format!("bad thread index {ith} of {nth}"));
        // SAFETY: dst is null or live (contract); with no share known, the whole output.
        unsafe { crate::tensor::fill_nan_rows(dst, 0, 1) };
        return;
    };
    // SAFETY: dst is null or live, its sources null or live (contract); metadata only.
    if let Some((arg, why)) = unsafe { unaddressable_args(dst) } {
        // Every thread reads the same metadata: thread 0 reports, each fills its rows.
        if arg.is_some() {
            if ith == 0 {
                report(Op::NAME, layer, &why);
            }
            // SAFETY: dst is live and its own reach was checked; row blocks cover it once.
            unsafe { crate::tensor::fill_nan_rows(dst, ith, nth) };
        } else if ith == 0 {
            report_outcome(Op::NAME, layer, &why, "output not written");
        }
        return;
    }
    // Counted done when this function returns, on every path below (drop guard).
    // SAFETY: dst is null or a live custom-op node being computed by this call's threads.
    let call = unsafe { Call::join(dst, nth) };
    // SAFETY: forwarded contract.
    let prepared = catch_unwind(AssertUnwindSafe(|| unsafe {
        Op::prepare(dst, params_block, nth)
    }));
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
    let mut claims = call.claims(dst as usize, ith, op.n_chunks());
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: prepare checked the tensors; the counter gives each chunk to one thread.
        let result = unsafe { op.run(ith, &mut claims) };
        fault::inject(dst, ith);
        result
    }));
    let message = match outcome {
        Ok(Ok(())) => return,
        Ok(Err(e)) => format!("thread {ith} of {nth}: {e}"),
        Err(p) => panicked(ith, nth, p.as_ref()),
    };
    report(Op::NAME, layer, &message);
    // What no thread has claimed yet becomes this thread's: if every thread fails, every chunk
    // is still filled by the thread that claimed it.
    claims.drain();
    for &c in claims.claimed() {
        // SAFETY: as for run; exactly the chunks this thread claimed.
        unsafe { op.fill_chunk(c, f32::NAN) };
    }
}

/// The state one evaluation of one node shares between its threads: two `u32` in the node's
/// own `op_params`, past ggml's `struct ggml_custom_op_params` (layout: `crate::params`), zero
/// at rest. No lock and no table: a thread never sleeps to join a call.
#[repr(C)]
#[derive(Debug, Default)]
struct CallState {
    /// The next chunk to hand out (may run past the chunk count: one failed claim per thread).
    next: AtomicU32,
    /// Threads that have left [`enter`].
    done: AtomicU32,
}

const _: () = assert!(std::mem::size_of::<CallState>() == 8);
const _: () = assert!(std::mem::align_of::<CallState>() == 4);

/// The state of a call without a node (`dst` null: `prepare` fails, nothing is claimed).
static DETACHED: CallState = CallState {
    next: AtomicU32::new(0),
    done: AtomicU32::new(0),
};

/// One thread's membership in a call (module docs): joining takes the node's state; dropping
/// counts the thread done, and the last of `nth` resets the state to zero for the node's next
/// evaluation (which ggml starts only after its barrier).
pub(crate) struct Call<'a> {
    nth: usize,
    state: &'a CallState,
}

impl Call<'_> {
    /// # Safety
    /// `dst` is null or a live `GGML_OP_CUSTOM` node that only the `nth` threads of this call
    /// compute right now, for as long as the returned value lives.
    unsafe fn join<'a>(dst: *mut sys::ggml_tensor, nth: usize) -> Call<'a> {
        let state = if dst.is_null() {
            &DETACHED
        } else {
            // SAFETY: dst is live (contract). Bytes CALL_STATE_OFFSET.. +8 of its inline
            // op_params (4-aligned: an i32 array, offset a multiple of 4) are past the
            // ggml_custom_op_params ggml reads, and every access to them is atomic: they are
            // only ever used through this CallState (params::store zeroes them before the graph
            // is computed).
            unsafe {
                &*std::ptr::addr_of_mut!((*dst).op_params)
                    .cast::<u8>()
                    .add(params::CALL_STATE_OFFSET)
                    .cast::<CallState>()
            }
        };
        Call { nth, state }
    }

    fn claims(&self, dst: usize, ith: usize, n_chunks: usize) -> Claims<'_> {
        Claims {
            state: self.state,
            n_chunks,
            ith,
            dst,
            claimed: Vec::new(),
            exhausted: false,
        }
    }
}

impl Drop for Call<'_> {
    fn drop(&mut self) {
        // AcqRel: the thread that resets the state has seen every other thread's last claim.
        let done = self.state.done.fetch_add(1, Ordering::AcqRel) as usize + 1;
        if done == self.nth {
            self.state.next.store(0, Ordering::Relaxed);
            self.state.done.store(0, Ordering::Release);
        }
    }
}

/// The chunks one thread takes from its call's counter, in increasing order, until none are
/// left; it remembers them (what the thread owns, for the failure path).
pub(crate) struct Claims<'a> {
    state: &'a CallState,
    n_chunks: usize,
    ith: usize,
    dst: usize,
    claimed: Vec<usize>,
    exhausted: bool,
}

impl Claims<'_> {
    /// Every chunk this thread has claimed so far, in order.
    pub(crate) fn claimed(&self) -> &[usize] {
        &self.claimed
    }

    /// Claims every chunk still unclaimed.
    fn drain(&mut self) {
        while self.next().is_some() {}
    }
}

impl Iterator for Claims<'_> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        if self.exhausted {
            return None;
        }
        fault::before_claim(self.dst, self.ith);
        // Relaxed: uniqueness comes from the read-modify-write order alone; the data a chunk
        // reads was written before ggml's barrier, its output is read after the next one.
        let c = self.state.next.fetch_add(1, Ordering::Relaxed) as usize;
        let got = if c < self.n_chunks {
            self.claimed.push(c);
            Some(c)
        } else {
            self.exhausted = true;
            None
        };
        fault::after_claim(self.dst, self.ith, got);
        got
    }
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
            _userdata: *mut ::std::ffi::c_void,
        ) {
            const _: () = assert!(crate::cpu_op::same_name(stringify!($name), $op::NAME));
            // SAFETY: forwarded contract of this function (its `# Safety` section).
            unsafe { crate::cpu_op::enter::<$op>(dst, ith, nth) }
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

/// Why tensor `t` cannot be addressed, or `None`:
/// - the byte offset of its last element, `sum((ne[i] - 1) * nb[i])`, overflows or lies beyond
///   `isize::MAX - 2^32` (room for that element or block). ggml computes a tensor's size with
///   wrapping `size_t` arithmetic (`ggml_nbytes`), so ne and nb sent by an RPC client can reach
///   far past a buffer while the size ggml-rpc checks against the buffer wraps around 2^64 to a
///   few bytes; no tensor of a real graph comes near this bound, and a tensor that stays below
///   it has a size that did not wrap, which ggml-rpc has checked;
/// - its elements overlap: with its dimensions of more than one element taken by stride, a
///   stride falls short of the bytes the smaller ones address (an element or block, then each
///   dimension's `(ne - 1) * nb` on top), e.g. a stride of 0 under a dimension of 2^31, or rows
///   closer than a row. Every tensor of a real graph nests its strides (permuted views
///   included). Without this an RPC client could make an op (or the NaN fill of its dst) run
///   over 2^37 elements of a 256-byte tensor, or two threads write the same bytes of a dst
///   whose rows overlap: the work an op does is bounded by the bytes of its tensors, which
///   ggml-rpc has checked against their buffers, and the bytes of each element are its own.
///
/// A tensor with no element (an `ne` of 0) addresses nothing; a negative `ne` and a type that
/// ggml has no size for are left to the op's own checks.
///
/// # Safety
/// `t` is null or a live ggml tensor.
unsafe fn unaddressable(t: *const sys::ggml_tensor) -> Option<String> {
    // SAFETY: t is null or live (contract); struct fields only.
    let t = unsafe { t.as_ref() }?;
    if t.ne.iter().any(|&n| n <= 0) {
        return None;
    }
    // u128: (2^63 - 1) * (2^64 - 1), four times, does not overflow
    let (ne, nb) = (t.ne.map(|n| n as u128), t.nb.map(|b| b as u128));
    let reach: u128 = (0..4).map(|i| (ne[i] - 1) * nb[i]).sum();
    if reach > (isize::MAX as u128) - (1 << 32) {
        return Some(format!(
            "ne {:?} nb {:?} span more than the address space",
            t.ne, t.nb
        ));
    }
    if t.type_ >= sys::GGML_TYPE_COUNT {
        return None;
    }
    // SAFETY: a type id below GGML_TYPE_COUNT indexes ggml's static type-traits table.
    let (block, size) = unsafe { (sys::ggml_blck_size(t.type_), sys::ggml_type_size(t.type_)) };
    let (Ok(block @ 1..), size) = (u128::try_from(block), size as u128) else {
        return None;
    };
    // the dimensions by stride (dim 0 counted in blocks); each stride must reach past what the
    // smaller ones address
    let mut dims: Vec<(u128, u128)> = (0..4)
        .map(|i| (nb[i], if i == 0 { ne[0] / block } else { ne[i] }))
        .filter(|&(_, n)| n > 1)
        .collect();
    dims.sort_unstable();
    let mut addressed = size;
    for (stride, n) in dims {
        if stride < addressed {
            return Some(format!(
                "ne {:?} nb {:?}: elements overlap (a stride of {stride} under {addressed} \
                 bytes)",
                t.ne, t.nb
            ));
        }
        addressed += (n - 1) * stride;
    }
    None
}

/// The first of `dst` and its sources that cannot be addressed ([`unaddressable`]), as
/// `(Some(source index) or None for dst, message)`.
///
/// # Safety
/// `dst` is null or a live ggml tensor whose sources are null or live.
pub(crate) unsafe fn unaddressable_args(
    dst: *const sys::ggml_tensor,
) -> Option<(Option<usize>, String)> {
    // SAFETY: forwarded contract.
    let d = unsafe { dst.as_ref() }?;
    // SAFETY: as above.
    if let Some(why) = unsafe { unaddressable(dst) } {
        return Some((None, format!("dst: {why}")));
    }
    d.src.iter().enumerate().find_map(|(i, &s)| {
        // SAFETY: sources are null or live (contract).
        unsafe { unaddressable(s) }.map(|why| (Some(i), format!("args[{i}]: {why}")))
    })
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
    report_outcome(op, layer, reason, "output set to NaN");
}

/// [`report`] with another ending than "output set to NaN" (a dst that could not be filled).
pub(crate) fn report_outcome(op: &str, layer: Option<i32>, reason: &str, outcome: &str) {
    static PRINTED: AtomicUsize = AtomicUsize::new(0);
    let layer = layer.map_or_else(|| "?".to_owned(), |l| l.to_string());
    let line = format!("spark-backend: {op}: layer {layer}: {reason}; {outcome}");
    fault::record(&line);
    let n = PRINTED.fetch_add(1, Ordering::Relaxed);
    if n < MAX_ERROR_LINES {
        crate::log::stderr_text(&line);
    } else if n == MAX_ERROR_LINES {
        crate::log::stderr_text(
            "spark-backend: more op failures; not printing them (outputs still set to NaN)",
        );
    }
}

/// A test-only fault switch: with the `fault-injection` feature, [`arm`](fault::arm) makes the
/// op computing one tensor panic in one thread (after it computed the chunks it claimed), so
/// tests can check that the failure path NaN-fills exactly those chunks;
/// [`reports`](fault::reports) returns every failure line (printed or not);
/// [`set_claim_hook`](fault::set_claim_hook) runs a test's function around every chunk claim
/// on one tensor, so tests can force a schedule (a thread that stalls holding a chunk, one that
/// must claim first). Without the feature nothing is compiled in.
#[cfg(feature = "fault-injection")]
pub mod fault {
    use llama_cpp_sys_2 as sys;
    use std::sync::{Arc, Mutex, MutexGuard};

    /// Armed faults: (dst address, thread index).
    static ARMED: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());
    static REPORTS: Mutex<Vec<String>> = Mutex::new(Vec::new());
    static HOOKS: Mutex<Vec<(usize, ClaimHook)>> = Mutex::new(Vec::new());

    /// What a claim hook is told: thread `ith` is about to claim a chunk, or has claimed
    /// `chunk` (`None`: nothing was left).
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum ClaimEvent {
        /// Before the claim.
        Before { ith: usize },
        /// After the claim.
        After { ith: usize, chunk: Option<usize> },
    }

    /// A test's function run by the claiming thread around each claim on one tensor; it may
    /// block (to stall the thread) but must not call the op.
    pub type ClaimHook = Arc<dyn Fn(ClaimEvent) + Send + Sync>;

    /// Runs `hook` around every chunk claim of every call computing `dst`, until
    /// [`clear_claim_hook`].
    pub fn set_claim_hook(dst: *const sys::ggml_tensor, hook: ClaimHook) {
        let mut hooks = lock(&HOOKS);
        hooks.retain(|(d, _)| *d != dst as usize);
        hooks.push((dst as usize, hook));
    }

    /// Removes the claim hook of `dst`.
    pub fn clear_claim_hook(dst: *const sys::ggml_tensor) {
        lock(&HOOKS).retain(|(d, _)| *d != dst as usize);
    }

    fn hook(dst: usize) -> Option<ClaimHook> {
        let hooks = lock(&HOOKS);
        hooks
            .iter()
            .find(|(d, _)| *d == dst)
            .map(|(_, h)| Arc::clone(h))
    }

    pub(crate) fn before_claim(dst: usize, ith: usize) {
        if let Some(h) = hook(dst) {
            h(ClaimEvent::Before { ith });
        }
    }

    pub(crate) fn after_claim(dst: usize, ith: usize, chunk: Option<usize>) {
        if let Some(h) = hook(dst) {
            h(ClaimEvent::After { ith, chunk });
        }
    }

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

    #[inline(always)]
    pub(crate) fn before_claim(_dst: usize, _ith: usize) {}

    #[inline(always)]
    pub(crate) fn after_claim(_dst: usize, _ith: usize, _chunk: Option<usize>) {}
}

/// How even a partition is under the shared chunk counter: the makespan over the mean load of
/// list scheduling in counter order (each unit to the thread that is free first, as the counter
/// hands units to threads of equal speed). The tiling tests of both ops measure with it.
#[cfg(test)]
pub(crate) fn list_schedule_imbalance(costs: &[f64], nth: usize) -> f64 {
    let mut loads = vec![0f64; nth];
    for &c in costs {
        let i = (0..nth)
            .min_by(|&a, &b| loads[a].total_cmp(&loads[b]))
            .unwrap();
        loads[i] += c;
    }
    let max = loads.iter().copied().fold(0f64, f64::max);
    max / (loads.iter().sum::<f64>() / nth as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(ne: [i64; 4], nb: [usize; 4]) -> sys::ggml_tensor {
        // SAFETY: ggml_tensor is a plain C struct for which all-zero bytes are a valid value.
        let mut t: sys::ggml_tensor = unsafe { std::mem::zeroed() };
        t.ne = ne;
        t.nb = nb;
        t
    }

    #[test]
    fn a_tensor_whose_reach_wraps_around_the_address_space_is_unaddressable() {
        // what an RPC client can send: ggml_nbytes() wraps to 34 bytes (test_rpc_fuzz.py)
        let n = (1i64 << 32) - 1;
        let wrapped = tensor([8, n, (1 << 27) + 1, 1], [4, (1 << 32) - 1, 96, 0]);
        // SAFETY: live tensors on the stack.
        unsafe {
            assert!(unaddressable(&wrapped).unwrap().contains("address space"));
            let big = tensor([1, 1 << 31, 1 << 31, 1], [4, 1 << 31, 1 << 31, 0]);
            assert!(unaddressable(&big).is_some());
            assert_eq!(
                unaddressable(&tensor([64, 3, 1, 1], [4, 256, 768, 768])),
                None
            );
            assert_eq!(unaddressable(&tensor([0, n, n, n], [4, 0, 0, 0])), None);
            assert_eq!(unaddressable(std::ptr::null()), None);
            // what the fuzz test found: 64 x (2^31 + 1) f32 rows at a stride of 0, 256 bytes
            let stride0 = tensor([64, (1 << 31) + 1, 1, 1], [4, 0, 256, 256]);
            assert!(unaddressable(&stride0).unwrap().contains("overlap"));
            // padded rows and a transposed view do not overlap
            let padded = tensor([64, 3, 1, 1], [4, 272, 816, 816]);
            assert_eq!(unaddressable(&padded), None);
            let transposed = tensor([3, 64, 1, 1], [256, 4, 768, 768]);
            assert_eq!(unaddressable(&transposed), None);
            // q8_0 rows (32 elements, 34 bytes per block), contiguous
            let mut q8 = tensor([64, 32, 1, 1], [34, 68, 68 * 32, 68 * 32]);
            q8.type_ = sys::GGML_TYPE_Q8_0;
            assert_eq!(unaddressable(&q8), None);
            q8.nb[1] = 34;
            assert!(unaddressable(&q8).unwrap().contains("overlap"));
            // what the guard-byte fuzz test found: 3 rows of 256 f32 at a stride of 5 bytes,
            // 1024 bytes apart, so rows 1 and 2 share 256 bytes (and the NaN fill's two threads
            // wrote them both); as many bytes as the span holds, so the count did not show it
            let rows = tensor([256, 3, 1, 1], [5, 1024, 3072, 3072]);
            assert!(unaddressable(&rows).unwrap().contains("overlap"));
            // a permuted view (heads outermost in memory, tokens inner) nests its strides
            let permuted = tensor([8, 2, 3, 1], [4, 96, 32, 192]);
            assert_eq!(unaddressable(&permuted), None);
            let interleaved = tensor([2, 2, 1, 1], [8, 4, 16, 16]);
            assert_eq!(unaddressable(&interleaved), None);
        }
    }

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
