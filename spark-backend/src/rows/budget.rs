//! The memory a Spark model asks of the host, weighed at load against the memory left to the
//! process (docs/USAGE.md, "A Spark model larger than the memory left to it").
//!
//! The graph counts its weights before their data is loaded (`spark-memory` in the patched
//! llama.cpp) and asks [`spark_memory_plan`]:
//! - weights made at load (repacked for this CPU, or read without mmap) and the mapped weights
//!   every token reads whole (attention, the FFN predictor K1, the output matrix) must stay in
//!   memory: when they cannot, the load is refused with the sizes, before the kernel's
//!   out-of-memory killer or a page-cache thrash decides;
//! - the K2 and V rows of the layers the Spark FFN ops run are read by rows ([`super::paging`]):
//!   when they do not all fit beside the rest, one line says what stays resident and what a
//!   token reads from storage.
//!
//! The memory left is the least of `MemAvailable`, the headroom of the process's cgroup (v2:
//! `memory.max` less what it holds beyond its page cache) and `SPARK_MEMORY` (a size, for a user
//! who wants Spark to plan with less, and for tests). `SPARK_PAGING=never` skips the plan (the
//! kernel's paging decides, as without the plugin).

use std::ffi::c_char;
use std::os::raw::c_int;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};

/// Whether rows stream: `SPARK_PAGING` (the module docs of `rows::paging`; here because the plan
/// at load skips under `never`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Measured per matrix (`paging::STREAM_BELOW`).
    Auto,
    /// Every matrix streams.
    Always,
    /// None does.
    Never,
}

impl Mode {
    /// The value of `SPARK_PAGING` (unset or empty: [`Mode::Auto`]).
    pub fn parse(value: &str) -> Result<Mode, String> {
        match value {
            "" | "auto" => Ok(Mode::Auto),
            "always" => Ok(Mode::Always),
            "never" => Ok(Mode::Never),
            other => Err(format!("'{other}' is not auto, always or never")),
        }
    }

    /// The process's mode, read once (a bad value is named on one line and `auto` applies).
    pub fn from_env() -> Mode {
        static MODE: OnceLock<Mode> = OnceLock::new();
        *MODE.get_or_init(|| {
            let value = std::env::var("SPARK_PAGING").unwrap_or_default();
            Mode::parse(&value).unwrap_or_else(|why| {
                crate::log::say!("spark: SPARK_PAGING: {why}; auto applies");
                Mode::Auto
            })
        })
    }
}

/// Memory left free, beyond a file's mapped bytes, before rows that are not in memory are
/// requested whole rather than row by row (`rows::paging`); also what the plan at load keeps to
/// spare beyond the weights that must stay.
pub const FILL_MARGIN: u64 = 64 << 20;

/// What must stay free beyond `rows` bytes read by rows for them to count as fitting whole:
/// [`FILL_MARGIN`] or a sixteenth of them, whichever is more. A pool that fits with only a thin
/// margin is evicted again by the context's buffers and the page cache's own churn, and a
/// matrix requested whole that does not stay is worse than one read by rows (9B q8_0 with
/// 11.0 GB left: 0.73 t/s whole against 1.07 by rows with a 64 MiB margin).
pub fn whole_margin(rows: u64) -> u64 {
    FILL_MARGIN.max(rows / 16)
}

/// Mirror of `struct spark_memory_need` (spark-backend.h): a model's weights in host memory by
/// how they are held and read, in bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryNeed {
    /// Host memory filled at load: repacked for the CPU, or read without mmap (`--load-mode none`).
    pub made_at_load: u64,
    /// Mapped from the file and read whole by every token.
    pub mapped_whole: u64,
    /// Mapped K2 and V of the layers the Spark FFN ops run: a token reads some of their rows.
    pub mapped_rows: u64,
    /// The mapped token embedding where the output matrix is a copy (made at load, or on a
    /// device): get_rows reads one row a token.
    pub mapped_lookup: u64,
    /// What one token reads of `mapped_rows` (k_f of n_ff neurons in each layer) and of
    /// `mapped_lookup` (one row).
    pub rows_per_token: u64,
}

/// Where the figure of the memory left came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// `MemAvailable` of `/proc/meminfo`.
    MemAvailable,
    /// The process's cgroup: `memory.max` less what the group holds beyond its page cache.
    Cgroup,
    /// `SPARK_MEMORY`.
    Env,
}

impl Source {
    fn describe(self) -> &'static str {
        match self {
            Source::MemAvailable => "MemAvailable",
            Source::Cgroup => "the cgroup's memory.max",
            Source::Env => "SPARK_MEMORY",
        }
    }
}

/// The memory left to the process and where the figure came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Available {
    /// Bytes.
    pub bytes: u64,
    /// The least of the figures read.
    pub source: Source,
}

/// What a model's need means under the memory left.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Everything fits (with [`whole_margin`] of the rows to spare).
    Fits,
    /// What must stay fits, the FFN rows do not all: they are read from storage.
    RowsStream,
    /// What must stay does not fit.
    Refused,
}

/// What must stay in memory for every token: the weights made at load and the mapped ones read
/// whole, and [`FILL_MARGIN`] to spare.
fn must_stay(need: &MemoryNeed) -> u64 {
    need.made_at_load
        .saturating_add(need.mapped_whole)
        .saturating_add(FILL_MARGIN)
}

/// The plan for `need` with `available` bytes left.
pub fn plan(need: &MemoryNeed, available: u64) -> Plan {
    let by_rows = need.mapped_rows.saturating_add(need.mapped_lookup);
    let everything = need
        .made_at_load
        .saturating_add(need.mapped_whole)
        .saturating_add(by_rows)
        .saturating_add(whole_margin(by_rows));
    if must_stay(need) > available {
        Plan::Refused
    } else if everything > available {
        Plan::RowsStream
    } else {
        Plan::Fits
    }
}

/// `bytes` for people: GiB with two decimals from 1 GiB, MiB with one below.
pub(crate) fn size(bytes: u64) -> String {
    const GIB: f64 = (1u64 << 30) as f64;
    const MIB: f64 = (1u64 << 20) as f64;
    let b = bytes as f64;
    if b >= GIB {
        format!("{:.2} GiB", b / GIB)
    } else {
        format!("{:.1} MiB", b / MIB)
    }
}

/// What a token reads by rows: the FFN's K2 and V rows, and the embedding's when it is mapped
/// apart from the output.
fn by_rows(need: &MemoryNeed) -> String {
    let ffn = format!("the FFN's K2 and V rows ({})", size(need.mapped_rows));
    if need.mapped_lookup == 0 {
        ffn
    } else {
        format!("{ffn} and the embedding's ({})", size(need.mapped_lookup))
    }
}

/// A refused load or context: the line the plugin prints itself, naming every size, and the
/// short error the load fails with. The plugin prints the line (one write) because llama.cpp's
/// tools log from a thread that a process exiting right after a failed load can cut short
/// (common/log.cpp leaks its logger on purpose): the reason must not depend on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// `spark: ...`, every size and the ways out.
    pub line: String,
    /// `spark-gemma2: refused by Spark's memory plan: ...`, what must stay against what is left.
    pub error: String,
}

impl Refusal {
    fn new(line: String, must_stay: u64, left: Available) -> Refusal {
        let error = format!(
            "spark-gemma2: refused by Spark's memory plan: {} must stay in memory, {} is left \
             (the line from spark before this one names each size)",
            size(must_stay),
            size(left.bytes),
        );
        Refusal { line, error }
    }
}

/// A refused load: the sizes, what could stream and what to do.
pub fn refusal(need: &MemoryNeed, left: Available) -> Refusal {
    let line = format!(
        "spark: spark-gemma2: the memory left ({} by {}) cannot hold what every token reads: {} of \
         weights made at load (repacked for this CPU, or read without mmap) + {} of mapped \
         weights read whole per token (attention, FFN predictor, output) + {} to spare; only \
         {} can be read from storage as tokens choose them. Free memory, load with the default \
         --load-mode mmap, or use a smaller quantization; SPARK_PAGING=never loads it anyway \
         at the speed of storage",
        size(left.bytes),
        left.source.describe(),
        size(need.made_at_load),
        size(need.mapped_whole),
        size(FILL_MARGIN),
        by_rows(need),
    );
    Refusal::new(line, must_stay(need), left)
}

/// The line of a model whose rows stream from load on.
pub fn streaming_line(need: &MemoryNeed, left: Available) -> String {
    format!(
        "spark: this model's weights ({}) do not all fit in the memory left ({} by {}): {} made \
         at load and {} read whole per token stay in memory; {} are read from storage as \
         tokens choose them, up to {} per token (docs/USAGE.md, \"A Spark model larger than the \
         memory left to it\")",
        size(
            need.made_at_load
                .saturating_add(need.mapped_whole)
                .saturating_add(need.mapped_rows)
                .saturating_add(need.mapped_lookup)
        ),
        size(left.bytes),
        left.source.describe(),
        size(need.made_at_load),
        size(need.mapped_whole),
        by_rows(need),
        size(need.rows_per_token),
    )
}

/// A size as `SPARK_MEMORY` takes it: bytes, or a number with K, M, G or T (powers of 1024,
/// an optional `iB` or `B` after it), e.g. `6G`, `6.5GiB`, `512M`.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let bad = || format!("'{text}' is not a size (bytes, or a number with K, M, G or T)");
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let number: f64 = number.parse().map_err(|_| bad())?;
    let unit = unit.trim().to_ascii_uppercase();
    let unit = unit
        .strip_suffix("IB")
        .or_else(|| unit.strip_suffix('B'))
        .unwrap_or(&unit);
    let scale: u64 = match unit {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        "T" => 1 << 40,
        _ => return Err(bad()),
    };
    let bytes = number * scale as f64;
    if !bytes.is_finite() || bytes < 1.0 || bytes >= u64::MAX as f64 {
        return Err(bad());
    }
    Ok(bytes as u64)
}

/// `SPARK_MEMORY`, read once (a bad value is named on one line and ignored).
fn from_env() -> Option<u64> {
    static LIMIT: OnceLock<Option<u64>> = OnceLock::new();
    *LIMIT.get_or_init(|| {
        let value = std::env::var("SPARK_MEMORY").ok()?;
        if value.trim().is_empty() {
            return None;
        }
        parse_size(&value)
            .map_err(|why| crate::log::say!("spark: SPARK_MEMORY: {why}; ignored"))
            .ok()
    })
}

/// `MemAvailable` of `/proc/meminfo`, in bytes.
pub fn mem_available() -> Option<u64> {
    proc_kib("/proc/meminfo", "MemAvailable:")
}

/// The `<key> <n> kB` field of a `/proc` file such as `/proc/meminfo`, in bytes.
fn proc_kib(path: &str, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    let line = text.lines().find(|l| l.starts_with(key))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// The headroom of the process's cgroup (v2): `memory.max` less `memory.current`, plus the
/// group's page cache (`file` of `memory.stat`, which the group reclaims before it runs out);
/// `None` without a limit or a cgroup v2 hierarchy.
fn cgroup_headroom() -> Option<u64> {
    let groups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = groups.lines().find_map(|l| l.strip_prefix("0::"))?;
    let dir = std::path::Path::new("/sys/fs/cgroup").join(path.trim_start_matches('/'));
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).ok();
    let max: u64 = read("memory.max")?.trim().parse().ok()?; // "max": no limit
    let current: u64 = read("memory.current")?.trim().parse().ok()?;
    let file: u64 = read("memory.stat")
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("file "))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0);
    Some(
        max.saturating_sub(current)
            .saturating_add(file.min(current)),
    )
}

/// The memory left to the process: the least of what the system, the cgroup and
/// `SPARK_MEMORY` say (`None` when none can be read).
pub fn available() -> Option<Available> {
    least(from_env())
}

/// The least of `MemAvailable`, the cgroup's headroom and `env` (`SPARK_MEMORY`'s figure).
fn least(env: Option<u64>) -> Option<Available> {
    [
        (mem_available(), Source::MemAvailable),
        (cgroup_headroom(), Source::Cgroup),
        (env, Source::Env),
    ]
    .into_iter()
    .filter_map(|(bytes, source)| bytes.map(|bytes| Available { bytes, source }))
    .min_by_key(|a| a.bytes)
}

/// The mapped bytes the plans of this process's models need (whole and FFN rows; not the
/// embedding, read a row a token; 0 before any):
/// what [`super::paging`] weighs against the memory left rather than the whole mapped file,
/// whose pages of weights repacked at load are never read again.
static PLANNED_MAPPED: AtomicU64 = AtomicU64::new(0);

/// [`PLANNED_MAPPED`], or `None` when no model was planned (a model loaded another way).
pub fn planned_mapped() -> Option<u64> {
    Some(PLANNED_MAPPED.load(Ordering::Relaxed)).filter(|&b| b > 0)
}

/// What the load of a model with `need` does under `mode` and `left`: `Ok` with the line to
/// print, if any, or `Err` with the refusal. Records the mapped bytes of a model that loads.
pub fn decide(
    need: &MemoryNeed,
    mode: Mode,
    left: Option<Available>,
) -> Result<Option<String>, Refusal> {
    if mode == Mode::Never {
        return Ok(None);
    }
    let planned = left.map(|l| (plan(need, l.bytes), l));
    *LAST_PLAN.lock().unwrap_or_else(PoisonError::into_inner) = planned.map(|(p, _)| p);
    let outcome = match planned {
        None | Some((Plan::Fits, _)) => Ok(None),
        Some((Plan::RowsStream, l)) => Ok(Some(streaming_line(need, l))),
        Some((Plan::Refused, l)) => Err(refusal(need, l)),
    };
    if outcome.is_ok() {
        PLANNED_MAPPED.fetch_add(
            need.mapped_whole.saturating_add(need.mapped_rows),
            Ordering::Relaxed,
        );
        PLANNED_WHOLE.fetch_add(need.mapped_whole, Ordering::Relaxed);
        if PLANNED_MODELS.fetch_add(1, Ordering::Relaxed) == 0 {
            RSS_AT_PLAN.store(rss_anon().unwrap_or(0), Ordering::Relaxed);
        }
    }
    outcome
}

/// The plan of the last model planned ([`decide`]; `None` before any, or when no memory figure
/// was read): what the end of its load reads ([`super::paging::spark_memory_loaded`] the rows of
/// a model that fits, [`super::paging::spark_memory_resident`] the weights read whole of one
/// whose rows stream).
static LAST_PLAN: Mutex<Option<Plan>> = Mutex::new(None);

/// [`LAST_PLAN`].
pub fn last_plan() -> Option<Plan> {
    *LAST_PLAN.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The mapped bytes read whole by every token of the models planned in this process: what a
/// context's memory must leave in place ([`context_refusal`]).
static PLANNED_WHOLE: AtomicU64 = AtomicU64::new(0);

/// How many models this process planned (a context of a model loaded without a plan is not
/// weighed).
static PLANNED_MODELS: AtomicU64 = AtomicU64::new(0);

/// The process's anonymous memory when its first model was planned (before any weight made at
/// load was written): what `SPARK_MEMORY`, which plans the weights and the contexts, leaves out.
static RSS_AT_PLAN: AtomicU64 = AtomicU64::new(0);

/// The bytes of mapped weights read whole that [`super::paging::spark_memory_resident`] pinned
/// in memory (`mlock`) in this process: the growth of the process's locked memory each pin
/// brought (pages llama.cpp's `--mlock` had locked already add nothing).
static PINNED: AtomicU64 = AtomicU64::new(0);

/// Counts `bytes` more pinned ([`PINNED`]).
pub fn record_pinned(bytes: u64) {
    PINNED.fetch_add(bytes, Ordering::Relaxed);
}

/// The process's locked memory (`VmLck` of `/proc/self/status`), in bytes.
pub fn locked_now() -> Option<u64> {
    proc_kib("/proc/self/status", "VmLck:")
}

/// The weights Spark pinned that are still locked: [`PINNED`], or the process's locked memory
/// now when that is less (a model freed since was unmapped, and its pages unlocked with it).
/// They are part of the memory a model's mapped weights take, but `MemAvailable` no longer
/// counts them (locked pages cannot be reclaimed): what weighs those weights against
/// `MemAvailable` or the cgroup's figure counts them as in place.
pub fn pinned() -> u64 {
    PINNED
        .load(Ordering::Relaxed)
        .min(locked_now().unwrap_or(0))
}

/// The memory the mapped weights of the load-time plans have of `left`: `left` itself by
/// `SPARK_MEMORY`, and by `MemAvailable` or the cgroup also the weights pinned ([`pinned`]),
/// which those figures no longer count but which are already in memory.
pub fn left_for_mapped(left: Available) -> u64 {
    match left.source {
        Source::Env => left.bytes,
        Source::MemAvailable | Source::Cgroup => left.bytes.saturating_add(pinned()),
    }
}

/// The process's anonymous resident memory (`RssAnon` of `/proc/self/status`), in bytes: the
/// weights made at load, the KV caches and whatever else it wrote.
fn rss_anon() -> Option<u64> {
    proc_kib("/proc/self/status", "RssAnon:")
}

/// The memory left now for a context's buffers, beyond what the process holds: the least of
/// `MemAvailable`, the cgroup's headroom (both already less the process's own memory) and
/// `SPARK_MEMORY` less the anonymous memory the process took since its first plan (weights
/// made at load, KV caches; freed ones no longer count) (`None` when none can be read).
pub fn available_now() -> Option<Available> {
    let taken = rss_anon()
        .unwrap_or(0)
        .saturating_sub(RSS_AT_PLAN.load(Ordering::Relaxed));
    least(from_env().map(|limit| limit.saturating_sub(taken)))
}

/// What a context's host buffers about to be made mean with `left` now: `None` when `bytes`, the
/// planned models' weights read whole (`whole` bytes, `locked` of them locked in memory) and
/// [`FILL_MARGIN`] fit, else the refusal. Those weights take out of `left`: all of them by
/// `SPARK_MEMORY`, which counts the process's anonymous memory only; by `MemAvailable` or the
/// cgroup, only those not locked (locked pages, by `--load-mode mlock` or pinned by Spark
/// ([`pinned`]), are resident and no longer reclaimable, so already out of those figures;
/// mapped pages in the page cache or not yet read count as available there).
pub fn context_refusal(
    bytes: u64,
    what: &str,
    whole: u64,
    locked: u64,
    left: Available,
) -> Option<Refusal> {
    let whole = if left.source == Source::Env {
        whole
    } else {
        whole.saturating_sub(locked)
    };
    let must_stay = bytes.saturating_add(whole).saturating_add(FILL_MARGIN);
    if must_stay <= left.bytes {
        return None;
    }
    let line = format!(
        "spark: spark-gemma2: {what} ({}) would not fit in the memory left ({} by {}) beside \
         the mapped weights every token reads whole ({}) and {} to spare. Use a smaller context \
         (-c), a quantized KV cache (-ctk q8_0 -ctv q8_0), fewer parallel sequences, or free \
         memory; SPARK_PAGING=never creates it anyway",
        size(bytes),
        size(left.bytes),
        left.source.describe(),
        size(whole),
        size(FILL_MARGIN),
    );
    Some(Refusal::new(line, must_stay, left))
}

/// Copies `text` into the C buffer `out` of `len` bytes, cut at a character boundary to fit,
/// NUL-terminated (nothing when `out` is null or `len` is 0).
///
/// # Safety
/// `out` is null or writable for `len` bytes.
unsafe fn write_c_text(text: &str, out: *mut c_char, len: usize) {
    if out.is_null() || len == 0 {
        return;
    }
    let mut n = text.len().min(len - 1);
    while !text.is_char_boundary(n) {
        n -= 1;
    }
    // SAFETY: `out` is writable for `len` > n bytes (contract); the source is `n` bytes of
    // `text`, which does not overlap a buffer the caller owns.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr(), out.cast::<u8>(), n);
        out.add(n).write(0);
    }
}

/// `spark_memory_plan_t` (spark-backend.h): 0 when the model loads (one line printed when its
/// FFN rows will stream), 1 when it is refused (`why` gets the message, NUL-terminated, cut to
/// `why_len` bytes), -1 when `need` is null.
///
/// # Safety
/// `need` is null or points to a `struct spark_memory_need`; `why` is null or writable for
/// `why_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn spark_memory_plan(
    need: *const MemoryNeed,
    why: *mut c_char,
    why_len: usize,
) -> c_int {
    crate::ffi::guard("spark_memory_plan", -1, || {
        if need.is_null() {
            return -1;
        }
        // SAFETY: non-null and pointing to the struct (contract); unaligned read for safety.
        let need = unsafe { need.read_unaligned() };
        match decide(&need, Mode::from_env(), available()) {
            Ok(line) => {
                if let Some(line) = line {
                    crate::log::stderr_text(&line);
                }
                0
            }
            Err(refused) => {
                // SAFETY: null or writable for why_len bytes (contract).
                unsafe { refuse(&refused, why, why_len) };
                1
            }
        }
    })
}

/// Prints the refusal's line and copies its error into `why`.
///
/// # Safety
/// `why` is null or writable for `why_len` bytes.
unsafe fn refuse(refused: &Refusal, why: *mut c_char, why_len: usize) {
    crate::log::stderr_text(&refused.line);
    // SAFETY: null or writable for why_len bytes (contract).
    unsafe { write_c_text(&refused.error, why, why_len) };
}

/// `spark_memory_context_t` (spark-backend.h): 0 when `bytes` of host memory that a context of
/// a planned model is about to use (`what`: "the KV cache", "the compute buffers") fit beside
/// the weights, 1 when they do not (one line printed, `why` gets the error as
/// [`spark_memory_plan`]'s), -1 when `what` is null. Accepts when no model was planned,
/// under `SPARK_PAGING=never` and when no memory figure can be read.
///
/// # Safety
/// `what` is null or a NUL-terminated string; `why` is null or writable for `why_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn spark_memory_context(
    bytes: u64,
    weights_locked: c_int,
    what: *const c_char,
    why: *mut c_char,
    why_len: usize,
) -> c_int {
    crate::ffi::guard("spark_memory_context", -1, || {
        if what.is_null() {
            return -1;
        }
        // SAFETY: non-null and NUL-terminated (contract).
        let what = unsafe { std::ffi::CStr::from_ptr(what) }.to_string_lossy();
        if PLANNED_MODELS.load(Ordering::Relaxed) == 0 || Mode::from_env() == Mode::Never {
            return 0;
        }
        let whole = PLANNED_WHOLE.load(Ordering::Relaxed);
        let locked = if weights_locked != 0 {
            whole
        } else {
            pinned().min(whole)
        };
        match available_now().and_then(|left| context_refusal(bytes, &what, whole, locked, left)) {
            None => 0,
            Some(refused) => {
                // SAFETY: null or writable for why_len bytes (contract).
                unsafe { refuse(&refused, why, why_len) };
                1
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn need(made: u64, whole: u64, rows: u64) -> MemoryNeed {
        MemoryNeed {
            made_at_load: made,
            mapped_whole: whole,
            mapped_rows: rows,
            mapped_lookup: 0,
            rows_per_token: rows / 12,
        }
    }

    #[test]
    fn a_mapped_embedding_is_read_by_rows_and_named_apart() {
        let n = MemoryNeed {
            mapped_lookup: GIB,
            ..need(GIB, 0, 4 * GIB)
        };
        assert_eq!(plan(&n, 6 * GIB + 5 * GIB / 16), Plan::Fits);
        assert_eq!(
            plan(&n, 6 * GIB + 5 * GIB / 16 - 1),
            Plan::RowsStream,
            "a sixteenth of the rows to spare"
        );
        assert_eq!(
            plan(&n, 6 * GIB),
            Plan::RowsStream,
            "the embedding counts in the fit"
        );
        assert_eq!(
            plan(&n, GIB + FILL_MARGIN),
            Plan::RowsStream,
            "but need not stay"
        );
        let left = Available {
            bytes: 2 * GIB,
            source: Source::Cgroup,
        };
        let line = streaming_line(&n, left);
        assert!(
            line.contains("(6.00 GiB)")
                && line.contains("by the cgroup's memory.max")
                && line.contains("K2 and V rows (4.00 GiB) and the embedding's (1.00 GiB)"),
            "{line}"
        );
    }

    #[test]
    fn what_must_stay_decides_refusal_and_the_rows_decide_streaming() {
        let n = need(GIB, 3 * GIB, 4 * GIB);
        assert_eq!(plan(&n, 9 * GIB), Plan::Fits);
        assert_eq!(plan(&n, 8 * GIB), Plan::RowsStream, "no margin left");
        assert_eq!(
            plan(&n, 8 * GIB + GIB / 4),
            Plan::Fits,
            "a sixteenth of the rows"
        );
        assert_eq!(plan(&n, 8 * GIB + GIB / 4 - 1), Plan::RowsStream);
        assert_eq!(plan(&n, 5 * GIB), Plan::RowsStream);
        assert_eq!(plan(&n, 4 * GIB + FILL_MARGIN), Plan::RowsStream);
        assert_eq!(plan(&n, 4 * GIB + FILL_MARGIN - 1), Plan::Refused);
        assert_eq!(plan(&n, 0), Plan::Refused);
        assert_eq!(plan(&MemoryNeed::default(), FILL_MARGIN), Plan::Fits);
    }

    #[test]
    fn the_refusal_names_every_size_and_the_way_out() {
        let n = need(GIB, 3 * GIB, 4 * GIB);
        let left = Available {
            bytes: 2 * GIB,
            source: Source::Env,
        };
        let refused = decide(&n, Mode::Auto, Some(left)).unwrap_err();
        let e = &refused.line;
        assert!(e.starts_with("spark: spark-gemma2: the memory left"), "{e}");
        assert_eq!(
            refused.error,
            "spark-gemma2: refused by Spark's memory plan: 4.06 GiB must stay in memory, 2.00 GiB \
             is left (the line from spark before this one names each size)"
        );
        for part in [
            "2.00 GiB by SPARK_MEMORY",
            "1.00 GiB of weights made at load",
            "3.00 GiB of mapped weights read whole",
            "64.0 MiB to spare",
            "K2 and V rows (4.00 GiB)",
            "--load-mode mmap",
            "SPARK_PAGING=never",
        ] {
            assert!(e.contains(part), "{part:?} not in {e:?}");
        }
        assert_eq!(decide(&n, Mode::Never, Some(left)), Ok(None));
        assert_eq!(
            decide(&n, Mode::Auto, None),
            Ok(None),
            "nothing known: no plan"
        );
    }

    #[test]
    fn the_streaming_line_says_what_stays_and_what_a_token_reads() {
        let n = need(0, 3 * GIB, 12 * (100 << 20));
        let left = Available {
            bytes: 4 * GIB,
            source: Source::MemAvailable,
        };
        let line = decide(&n, Mode::Always, Some(left)).unwrap().unwrap();
        for part in [
            "(4.17 GiB)",
            "4.00 GiB by MemAvailable",
            "0.0 MiB made at load and 3.00 GiB read whole",
            "K2 and V rows (1.17 GiB) are read",
            "up to 100.0 MiB per token",
        ] {
            assert!(line.contains(part), "{part:?} not in {line:?}");
        }
    }

    #[test]
    fn sizes_parse_in_binary_units_and_bad_ones_are_named() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("6G"), Ok(6 * GIB));
        assert_eq!(parse_size("6gib"), Ok(6 * GIB));
        assert_eq!(parse_size(" 1.5 GB "), Ok(3 * GIB / 2));
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("2T"), Ok(2 << 40));
        assert_eq!(parse_size("64k"), Ok(64 << 10));
        for bad in ["", "G", "six", "6X", "-1G", "0", "1e400", "1.2.3G"] {
            let e = parse_size(bad).unwrap_err();
            assert!(e.contains(&format!("'{bad}'")), "{e}");
        }
    }

    #[test]
    fn the_c_text_is_cut_at_a_character_and_terminated() {
        let mut buf = [0x55u8; 6];
        // SAFETY: buf is writable for its length.
        unsafe { write_c_text("ab\u{e9}cd", buf.as_mut_ptr().cast(), 4) };
        assert_eq!(
            &buf[..4],
            b"ab\0\x55",
            "'e-acute' does not fit whole in 3 bytes"
        );
        // SAFETY: as above.
        unsafe { write_c_text("abc", buf.as_mut_ptr().cast(), buf.len()) };
        assert_eq!(&buf[..4], b"abc\0");
        // SAFETY: a null buffer is allowed and left alone.
        unsafe { write_c_text("abc", std::ptr::null_mut(), 9) };
    }

    #[test]
    fn the_c_entry_refuses_null_and_fills_the_message() {
        // SAFETY: null need is allowed (returns -1).
        assert_eq!(
            unsafe { spark_memory_plan(std::ptr::null(), std::ptr::null_mut(), 0) },
            -1
        );
        let fits = MemoryNeed::default();
        let mut why = [0 as c_char; 64];
        // SAFETY: a live struct and a writable buffer of its length.
        let rc = unsafe { spark_memory_plan(&fits, why.as_mut_ptr(), why.len()) };
        assert_eq!(rc, 0, "an empty model fits any memory");
        let huge = need(u64::MAX / 2, u64::MAX / 2, 0);
        // SAFETY: as above.
        let rc = unsafe { spark_memory_plan(&huge, why.as_mut_ptr(), why.len()) };
        assert_eq!(rc, 1);
        // SAFETY: the entry NUL-terminated it within the buffer.
        let text = unsafe { std::ffi::CStr::from_ptr(why.as_ptr()) };
        assert!(text
            .to_str()
            .unwrap()
            .starts_with("spark-gemma2: refused by Spark's memory plan: "));
    }

    #[test]
    fn a_context_must_leave_the_weights_read_whole_and_the_margin() {
        let left = |bytes, source| Available { bytes, source };
        let what = "the KV cache";
        let fits = 5 * GIB - 3 * GIB - FILL_MARGIN;
        for source in [Source::MemAvailable, Source::Cgroup, Source::Env] {
            assert_eq!(
                context_refusal(fits, what, 3 * GIB, 0, left(5 * GIB, source)),
                None
            );
            let refused = context_refusal(fits + 1, what, 3 * GIB, 0, left(5 * GIB, source))
                .expect("one byte more is refused");
            for part in [
                "spark: spark-gemma2: the KV cache (",
                "would not fit in the memory left (5.00 GiB by ",
                "reads whole (3.00 GiB) and 64.0 MiB to spare",
                "-ctk q8_0",
            ] {
                assert!(
                    refused.line.contains(part),
                    "{part:?} not in {:?}",
                    refused.line
                );
            }
            assert!(refused
                .error
                .contains("5.00 GiB must stay in memory, 5.00 GiB is left"));
        }
        // locked weights (all, or 1 GiB of them) are already out of MemAvailable and the
        // cgroup's figure, not of SPARK_MEMORY's (which counts anonymous memory only)
        for locked in [3 * GIB, GIB] {
            let kv = fits + locked;
            for source in [Source::MemAvailable, Source::Cgroup] {
                assert_eq!(
                    context_refusal(kv, what, 3 * GIB, locked, left(5 * GIB, source)),
                    None
                );
                assert!(
                    context_refusal(kv + 1, what, 3 * GIB, locked, left(5 * GIB, source)).is_some()
                );
            }
            assert!(
                context_refusal(kv, what, 3 * GIB, locked, left(5 * GIB, Source::Env)).is_some()
            );
        }
    }

    #[test]
    fn the_context_entry_refuses_null_and_accepts_without_a_plan() {
        let mut why = [0 as c_char; 64];
        // SAFETY: a null `what` is allowed (returns -1); the buffer is writable for its length.
        let rc =
            unsafe { spark_memory_context(1, 0, std::ptr::null(), why.as_mut_ptr(), why.len()) };
        assert_eq!(rc, -1);
        if PLANNED_MODELS.load(Ordering::Relaxed) == 0 {
            // SAFETY: a NUL-terminated `what` and a writable buffer.
            let rc = unsafe {
                spark_memory_context(
                    u64::MAX,
                    0,
                    c"the KV cache".as_ptr(),
                    why.as_mut_ptr(),
                    why.len(),
                )
            };
            assert_eq!(
                rc, 0,
                "no model planned in this process: nothing to weigh against"
            );
        }
    }
}
