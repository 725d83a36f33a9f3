//! Row matrices whose pages storage backs: the FFN's K2 and V rows of a memory-mapped model
//! that does not fit in memory (docs/PERF.md, "Models larger than memory").
//!
//! A decode step reads ~8 % of K2's and V's rows, scattered over each tensor. When the file is
//! memory-mapped and those pages are not all in the page cache, the kernels fault them in one
//! at a time: each fault waits for its own read (one read in flight per thread), and the
//! kernel's readahead around each faulted page reads rows the step does not use, evicting ones
//! it does. So for each row matrix the sparse FFN reads, [`Paging`] keeps:
//! - how much of it is in memory, measured with `mincore` at most once per [`CHECK_EVERY`]
//!   ([`CHECK_STREAMING_EVERY`] while its rows stream: the check walks the page cache page by
//!   page, 2-3 % of a step's CPU when every matrix is checked each second);
//! - while less than [`STREAM_BELOW`] of its pages are, how to read it ([`Reading`]): when the
//!   whole mapped file fits in the memory left ([`budget::available`] at least the file's mapped
//!   bytes, or those the load-time plans need, and [`FILL_MARGIN`]: a model that fits, evicted
//!   or still loading), the whole range is requested at once (`MADV_WILLNEED` in pieces the
//!   kernel reads whole, [`REQUEST_PIECE`]: a sequential read); when it does not, the range is advised `MADV_RANDOM` (no readahead
//!   around faults) and, before the kernels touch a call's rows, their pages are requested
//!   with `MADV_WILLNEED` ([`Paging::request_rows`]): the kernel starts all those reads at
//!   once, many in flight, and the kernels' faults then wait
//!   for reads already under way; back in memory, `MADV_NORMAL` again. A matrix requested whole
//!   that the memory did not keep (its resident fraction fell by [`WHOLE_FELL_BY`]) is read by
//!   rows from then on.
//!
//! At the end of a load whose plan found that the whole model fits ([`budget::last_plan`] is [`Plan::Fits`]),
//! the row tensors not yet in memory are read at once, sequentially ([`spark_memory_loaded`]):
//! the first tokens then find them there, as stock's repacked weights are read before its
//! first token. At the end of a load whose rows stream ([`budget::last_plan`] is [`Plan::RowsStream`]), the weights
//! every token reads whole are read the same way and pinned there (`mlock`, [`pin`]: the rows
//! streaming past them never evict them; [`spark_memory_resident`]).
//!
//! `SPARK_PAGING` overrides the measurement: `auto` (the default, as above), `always` (every
//! matrix streams: for tests, and for storage a user knows to be slow) or `never` (the kernel's
//! own paging, as without the plugin).
//!
//! Advice never changes what the memory holds or what the kernels compute (results are bit for
//! bit those of a model in memory); memory that storage does not back (`--load-mode none`,
//! repacked or anonymous copies) is always resident, so nothing is ever requested for it. A failed
//! `madvise` or `mincore` (an address no mapping covers) counts as resident.

use super::budget::{self, Plan};
use super::RowMatrix;
pub use budget::{Mode, FILL_MARGIN};
use std::collections::HashMap;
use std::ops::Range;
use std::os::raw::c_int;
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// How often one matrix's residency is measured (a `mincore` over its range: ~10-50 us for a
/// 9B layer's K2 or V, so well under 0.1 % of a decode step's time in memory).
pub const CHECK_EVERY: Duration = Duration::from_millis(1000);

/// How often a matrix whose rows stream is measured: over a mapping the page tables do not
/// cover, `mincore` looks each page up in the page cache (~0.5 ms for a 9B layer's K2 and V,
/// 84 such matrices: 2.5 % of a decode step's CPU at 7.7 GB left, measured with perf, when
/// checked every second). Memory that comes back is noticed a few tokens later.
pub const CHECK_STREAMING_EVERY: Duration = Duration::from_secs(10);

/// The fraction of a matrix's pages below which its rows are requested ahead: with 1 % of a
/// step's rows to fault, one read each, the faults cost about what requesting every row costs.
pub const STREAM_BELOW: f64 = 0.99;

/// A matrix requested whole whose resident fraction falls this far below the most a check
/// found was evicted again (the memory did not hold it after all): it is read by rows.
pub const WHOLE_FELL_BY: f64 = 0.05;

/// How a matrix's rows are read, from its last check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reading {
    /// At least [`STREAM_BELOW`] of its pages are in memory: nothing to do.
    InMemory,
    /// Not, but its file fits in the memory available: the whole range was requested.
    Whole,
    /// Not, and its file does not fit: each call's rows are requested (`MADV_RANDOM` range).
    Rows,
}

/// What is known of one matrix's pages.
#[derive(Clone, Copy, Debug)]
struct State {
    checked: Instant,
    reading: Reading,
    /// The largest resident fraction a check found.
    max_fraction: f64,
    /// A whole request that did not stay: rows only from then on.
    whole_failed: bool,
    /// The bytes mapped of the file behind the matrix (`/proc/self/maps`, read once).
    file_bytes: Option<u64>,
}

/// The residency of the row matrices the ops have seen, keyed by their byte range (a model
/// loaded again at the same address is measured again within [`CHECK_EVERY`]).
#[derive(Default)]
pub struct Paging {
    states: Mutex<HashMap<(usize, usize), State>>,
}

/// The page size (`sysconf(_SC_PAGESIZE)`, 4096 where that fails).
pub fn page_size() -> usize {
    static PAGE: OnceLock<usize> = OnceLock::new();
    *PAGE.get_or_init(|| {
        // SAFETY: sysconf reads a constant of the system; no memory is passed.
        let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        usize::try_from(p).ok().filter(|&p| p > 0).unwrap_or(4096)
    })
}

/// The pages (as a page-aligned address range) that cover `bytes`.
fn pages_of(bytes: Range<usize>) -> Range<usize> {
    let page = page_size();
    let start = bytes.start / page * page;
    let end = bytes.end.div_ceil(page) * page;
    start..end
}

/// The fraction of the pages covering `bytes` that are in memory (1.0 when `mincore` fails:
/// the range is not a mapping this process can ask about, so nothing would be requested).
pub fn resident_fraction(bytes: &[u8]) -> f64 {
    if bytes.is_empty() {
        return 1.0;
    }
    let start = bytes.as_ptr() as usize;
    let pages = pages_of(start..start + bytes.len());
    let n = (pages.end - pages.start) / page_size();
    let mut vec = vec![0u8; n];
    // SAFETY: the address is page-aligned and the range lies within pages that `bytes` (a live
    // slice) touches; `vec` has one byte per page of it, as mincore writes.
    let rc = unsafe {
        libc::mincore(
            pages.start as *mut libc::c_void,
            pages.end - pages.start,
            vec.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return 1.0;
    }
    let resident = vec.iter().filter(|&&b| b & 1 != 0).count();
    resident as f64 / n as f64
}

/// Gives `advice` for the pages covering `bytes` (a hint: its failure changes nothing).
fn advise(bytes: Range<usize>, advice: libc::c_int) {
    let pages = pages_of(bytes);
    if pages.is_empty() {
        return;
    }
    // SAFETY: the range covers pages of a live mapping (the caller's matrix); the advice given
    // here (MADV_RANDOM, MADV_NORMAL, MADV_WILLNEED) only steers the page cache's reads and
    // never changes the contents of the memory.
    unsafe {
        libc::madvise(
            pages.start as *mut libc::c_void,
            pages.end - pages.start,
            advice,
        );
    }
}

/// The most one `MADV_WILLNEED` is given. Linux reads ahead at most the file's readahead window
/// of the range one call names (`read_ahead_kb`, 128 KiB by default, or the device's optimal
/// I/O size if larger: `force_page_cache_ra`) and drops the rest, so a longer range is asked for
/// in pieces of this size (measured on this VM, `read_ahead_kb` 8192: one call over 64 MiB of an
/// evicted file read 12 % of it, 128 KiB pieces all of it).
const REQUEST_PIECE: usize = 128 << 10;

/// Requests the pages covering `bytes` with `MADV_WILLNEED`, in pieces of [`REQUEST_PIECE`]:
/// their reads start now, all of them in flight together (a hint: a failure changes nothing).
fn request(bytes: Range<usize>) {
    let pages = pages_of(bytes);
    let mut at = pages.start;
    while at < pages.end {
        let end = pages.end.min(at + REQUEST_PIECE);
        advise(at..end, libc::MADV_WILLNEED);
        at = end;
    }
}

/// The bytes this process maps of the file that backs address `addr` (every mapping of the
/// same device and inode in `/proc/self/maps`); `None` for anonymous memory or an address no
/// mapping holds.
fn mapped_file_bytes(addr: usize) -> Option<u64> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    // "start-end perms offset dev inode path"
    let parse = |line: &str| -> Option<(u64, u64, String, u64)> {
        let mut f = line.split_whitespace();
        let (lo, hi) = f.next()?.split_once('-')?;
        let (lo, hi) = (
            u64::from_str_radix(lo, 16).ok()?,
            u64::from_str_radix(hi, 16).ok()?,
        );
        let dev = f.nth(2)?.to_string();
        let inode: u64 = f.next()?.parse().ok()?;
        Some((lo, hi, dev, inode))
    };
    let entries: Vec<_> = maps.lines().filter_map(parse).collect();
    let addr = addr as u64;
    let (_, _, dev, inode) = entries
        .iter()
        .find(|(lo, hi, _, _)| (*lo..*hi).contains(&addr))?;
    if *inode == 0 {
        return None;
    }
    Some(
        entries
            .iter()
            .filter(|(_, _, d, i)| d == dev && i == inode)
            .map(|(lo, hi, _, _)| hi - lo)
            .sum(),
    )
}

/// Whether a model whose file this process maps `file` bytes of fits in the memory left
/// ([`budget::available`]), [`budget::whole_margin`] of it to spare (`MemAvailable` counts the
/// file's pages already in memory as available too, and the weights pinned are added back:
/// [`budget::left_for_mapped`]). The mapped bytes the load-time plans need stand in for
/// `file` when there are plans: the file pages of weights repacked at load are not read again.
fn fits_in_memory(file: u64) -> bool {
    let need = budget::planned_mapped().unwrap_or(file);
    budget::available().is_some_and(|left| {
        budget::left_for_mapped(left) >= need.saturating_add(budget::whole_margin(need))
    })
}

/// The bytes of row `j` of `m`.
fn row_bytes(m: &RowMatrix<'_>, j: usize) -> Range<usize> {
    let start = m.row_ptr(j) as usize;
    start..start + m.row_len
}

/// The byte range a matrix's rows span.
fn span(m: &RowMatrix<'_>) -> Range<usize> {
    let start = m.row_ptr(0) as usize;
    start..start + m.data.len()
}

impl Paging {
    /// The process's table (the ops of every model in the process share it).
    pub fn global() -> &'static Paging {
        static GLOBAL: OnceLock<Paging> = OnceLock::new();
        GLOBAL.get_or_init(Paging::default)
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<(usize, usize), State>> {
        self.states.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `m`'s rows are read from storage now (fewer than [`STREAM_BELOW`] of its pages
    /// in memory at the last check), measuring again when the last check is [`CHECK_EVERY`]
    /// old. `layer` names the matrix in the one line printed the first time any matrix
    /// streams.
    pub fn streaming(&self, m: &RowMatrix<'_>, layer: Option<i32>) -> bool {
        self.streaming_in(Mode::from_env(), m, layer)
    }

    /// [`Paging::streaming`] under `mode` rather than the environment's.
    pub fn streaming_in(&self, mode: Mode, m: &RowMatrix<'_>, layer: Option<i32>) -> bool {
        if mode == Mode::Never {
            return false;
        }
        self.reading_in(mode, m, layer) == Reading::Rows
    }

    /// How `m`'s rows are read now under `mode` (checked again when the last check is
    /// [`CHECK_EVERY`] old; a check that finds [`Reading::Whole`] requests the whole range).
    pub fn reading_in(&self, mode: Mode, m: &RowMatrix<'_>, layer: Option<i32>) -> Reading {
        if mode == Mode::Never {
            return Reading::InMemory;
        }
        let range = span(m);
        let key = (range.start, range.end);
        let now = Instant::now();
        let prior = self.lock().get(&key).copied();
        if let Some(p) = prior {
            let every = match p.reading {
                Reading::Rows => CHECK_STREAMING_EVERY,
                _ => CHECK_EVERY,
            };
            if now.duration_since(p.checked) < every {
                return p.reading;
            }
        }
        // Measured outside the lock: two threads may both measure; they agree.
        let fraction = resident_fraction(m.data);
        let max_fraction = prior.map_or(fraction, |p| p.max_fraction.max(fraction));
        let whole_failed = prior.is_some_and(|p| {
            p.whole_failed
                || (p.reading == Reading::Whole && fraction + WHOLE_FELL_BY < max_fraction)
        });
        let file_bytes = match prior {
            Some(p) => p.file_bytes,
            None => mapped_file_bytes(range.start),
        };
        let reading = if mode == Mode::Always {
            Reading::Rows
        } else if fraction >= STREAM_BELOW {
            Reading::InMemory
        } else if !whole_failed && file_bytes.is_some_and(fits_in_memory) {
            Reading::Whole
        } else {
            Reading::Rows
        };
        self.lock().insert(
            key,
            State {
                checked: now,
                reading,
                max_fraction,
                whole_failed,
                file_bytes,
            },
        );
        let before = prior.map(|p| p.reading);
        match reading {
            Reading::Rows if before != Some(Reading::Rows) => {
                advise(range, libc::MADV_RANDOM);
                announce(mode, layer, fraction, m.data.len());
            }
            Reading::Rows => {}
            _ => {
                if before == Some(Reading::Rows) {
                    advise(range.clone(), libc::MADV_NORMAL);
                }
                if reading == Reading::Whole {
                    request(range);
                }
            }
        }
        reading
    }

    /// Requests the pages of rows `rows` of `m` (increasing row order; consecutive pages are
    /// asked for in one call) so that their reads start now.
    pub fn request_rows(m: &RowMatrix<'_>, rows: impl IntoIterator<Item = usize>) {
        Self::request_ranges(
            rows.into_iter()
                .filter(|&j| j < m.n_rows())
                .map(|j| row_bytes(m, j)),
        );
    }

    /// Whether row `j` of `second` starts where row `j` of `first` ends, for every `j` (the
    /// same stride): K2 and V of a file that holds them side by side (`ffn_k2v`,
    /// `spark-convert --pair-k2v`), whose rows of one neuron are one read.
    pub fn side_by_side(first: &RowMatrix<'_>, second: &RowMatrix<'_>) -> bool {
        first.n_rows() == second.n_rows()
            && first.stride == second.stride
            && first.row_ptr(0) as usize + first.row_len == second.row_ptr(0) as usize
    }

    /// [`Paging::request_rows`] for two matrices [`Paging::side_by_side`]: row `j` of both is
    /// one range (one read per row instead of two).
    pub fn request_rows_side_by_side(
        first: &RowMatrix<'_>,
        second: &RowMatrix<'_>,
        rows: impl IntoIterator<Item = usize>,
    ) {
        debug_assert!(Self::side_by_side(first, second));
        Self::request_ranges(
            rows.into_iter()
                .filter(|&j| j < first.n_rows())
                .map(|j| row_bytes(first, j).start..row_bytes(second, j).end),
        );
    }

    /// Requests the pages of `ranges` (increasing addresses; pages at most one page apart are
    /// asked for in one call).
    fn request_ranges(ranges: impl IntoIterator<Item = Range<usize>>) {
        let page = page_size();
        let mut run: Option<Range<usize>> = None;
        for bytes in ranges {
            let pages = pages_of(bytes);
            run = match run {
                Some(r) if pages.start <= r.end + page => Some(r.start..pages.end.max(r.end)),
                Some(r) => {
                    request(r);
                    Some(pages)
                }
                None => Some(pages),
            };
        }
        if let Some(r) = run {
            request(r);
        }
    }

    /// Requests all of `m` when its rows stream (a ubatch of the two-stage path reads nearly
    /// every row; the sequential read of the whole range is what the kernel would have read
    /// ahead without `MADV_RANDOM`).
    pub fn request_all_if_streaming(&self, m: &RowMatrix<'_>, layer: Option<i32>) {
        if self.streaming(m, layer) {
            Self::request_share(m, 0, 1);
        }
    }

    /// Requests part `part` of `parts` of `m`'s whole range (a ubatch that reads most rows).
    pub fn request_share(m: &RowMatrix<'_>, part: usize, parts: usize) {
        Self::request_share_of(span(m), part, parts);
    }

    /// [`Paging::request_share`] for two matrices [`Paging::side_by_side`]: their rows
    /// interleave, so one range spans both (requesting each would walk the same pages twice).
    pub fn request_share_side_by_side(
        first: &RowMatrix<'_>,
        second: &RowMatrix<'_>,
        part: usize,
        parts: usize,
    ) {
        debug_assert!(Self::side_by_side(first, second));
        Self::request_share_of(span(first).start..span(second).end, part, parts);
    }

    fn request_share_of(range: Range<usize>, part: usize, parts: usize) {
        let parts = parts.max(1);
        let len = range.end - range.start;
        let (lo, hi) = (part * len / parts, (part + 1).min(parts) * len / parts);
        request(range.start + lo..range.start + hi);
    }
}

/// Reads the pages of `ranges` (memory-mapped weights) into memory now, one sequential read per
/// range: `MADV_POPULATE_READ` (Linux 5.14), or where that fails or leaves pages out,
/// `MADV_WILLNEED` and one load per page. Returns the bytes that were not in memory before (a range whose pages all
/// are costs one `mincore`).
///
/// # Safety
/// Each range lies in a live, readable mapping (the weights of a loaded model).
pub unsafe fn read_now(ranges: &[&[u8]]) -> u64 {
    let mut missing = 0u64;
    for bytes in ranges {
        let out = missing_bytes(bytes);
        if out > 0 {
            missing += out;
            // SAFETY: a live readable mapping (contract).
            unsafe { populate(bytes) };
        }
    }
    missing
}

/// The bytes of `bytes` whose pages are not in memory (one `mincore`).
fn missing_bytes(bytes: &[u8]) -> u64 {
    ((1.0 - resident_fraction(bytes)) * bytes.len() as f64) as u64
}

/// Reads the pages of `bytes` into memory ([`read_now`]'s read, without its measurement).
///
/// # Safety
/// `bytes` lies in a live, readable mapping.
unsafe fn populate(bytes: &[u8]) {
    let start = bytes.as_ptr() as usize;
    let pages = pages_of(start..start + bytes.len());
    // SAFETY: the pages cover a live readable mapping (contract); MADV_POPULATE_READ faults
    // them in as reads would and changes no byte of them.
    let rc = unsafe {
        libc::madvise(
            pages.start as *mut libc::c_void,
            pages.end - pages.start,
            libc::MADV_POPULATE_READ,
        )
    };
    // a kernel without it fails the call; an emulator (qemu-user) may take the advice and
    // ignore it: either way the pages still out are read one load each
    if rc != 0 || resident_fraction(bytes) < 1.0 {
        request(pages.clone());
        for page in (0..bytes.len()).step_by(page_size()) {
            // SAFETY: `page` < bytes.len(): a byte of the live slice, read through a
            // volatile load so that the read (which faults the page in) is kept.
            unsafe { std::ptr::read_volatile(bytes.as_ptr().add(page)) };
        }
    }
}

/// Mirror of `struct spark_bytes` (spark-backend.h): one range of a model's weights.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Bytes {
    /// The first byte.
    pub data: *const libc::c_void,
    /// How many.
    pub size: u64,
}

/// Less than this not in memory is read at the end of the load without a line.
const QUIET_BELOW: u64 = 256 << 20;

/// `spark_memory_loaded_t` (spark-backend.h): called at the end of a model's load with its
/// mapped FFN row tensors (K2, V). When the load's plan found that everything fits
/// ([`budget::last_plan`] is [`Plan::Fits`]) under `SPARK_PAGING=auto`, the rows not yet in memory are read now,
/// sequentially ([`read_now`]), rather than by the first tokens a fault or a request at a time
/// (one line when that is 256 MiB or more). 0 when done or nothing was to do, -1 when `ranges`
/// is null with `n` > 0.
///
/// # Safety
/// `ranges` is null (with `n` 0) or points to `n` entries, each a live readable mapping of
/// `size` bytes at `data` (or `size` 0).
#[no_mangle]
pub unsafe extern "C" fn spark_memory_loaded(ranges: *const Bytes, n: usize) -> c_int {
    crate::ffi::guard("spark_memory_loaded", -1, || {
        // SAFETY: the caller's ranges (contract).
        let Some(slices) = (unsafe { entry_slices(ranges, n) }) else {
            return -1;
        };
        if Mode::from_env() == Mode::Auto && budget::last_plan() == Some(Plan::Fits) {
            read_missing_now(&slices, "FFN rows", "they fit in the memory left");
        }
        0
    })
}

/// `spark_memory_resident_t` (spark-backend.h): called at the end of a model's load with its
/// weights in host memory that every token reads whole (attention, FFN predictor, norms, the
/// output). When the load's plan found that its FFN rows stream ([`budget::last_plan`] is [`Plan::RowsStream`];
/// not under `SPARK_PAGING=never`), those not yet in memory are read now, sequentially: a loader
/// that reads the rows on demand only asks for the rest ahead, and a first token or a context's
/// memory check would otherwise find them still on their way (one line when that is 256 MiB or
/// more). Then they are pinned in memory ([`pin`]; one line says so, or why not), so that the
/// rows streaming past them never evict them. 0 when done or nothing was to do, -1 when
/// `ranges` is null with `n` > 0.
///
/// # Safety
/// As [`spark_memory_loaded`].
#[no_mangle]
pub unsafe extern "C" fn spark_memory_resident(ranges: *const Bytes, n: usize) -> c_int {
    crate::ffi::guard("spark_memory_resident", -1, || {
        // SAFETY: the caller's ranges (contract).
        let Some(slices) = (unsafe { entry_slices(ranges, n) }) else {
            return -1;
        };
        if Mode::from_env() != Mode::Never && budget::last_plan() == Some(Plan::RowsStream) {
            read_missing_now(
                &slices,
                "weights every token reads whole",
                "they stay in memory while its FFN rows stream",
            );
            pin_and_say(&slices);
        }
        0
    })
}

/// Pins `ranges` ([`pin`]) and says so in one line: the bytes pinned, or why none could be.
fn pin_and_say(ranges: &[&[u8]]) {
    let total: u64 = ranges.iter().map(|b| b.len() as u64).sum();
    if total == 0 {
        return;
    }
    let pinned = pin(ranges);
    budget::record_pinned(pinned.bytes);
    match pinned.failed {
        None => crate::log::say!(
            "spark: the {} of weights every token reads whole are pinned in memory (mlock) \
             while its FFN rows stream, so the rows read past them never evict them",
            budget::size(total)
        ),
        Some(why) => crate::log::say!(
            "spark: the {} of weights every token reads whole could not be pinned in memory \
             ({why}): the page cache may evict some while the FFN rows stream, and tokens then \
             read them again (docs/USAGE.md, \"Memory budgets\": `ulimit -l` or CAP_IPC_LOCK)",
            budget::size(total)
        ),
    }
}

/// What [`pin`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pinned {
    /// The bytes locked anew: the growth of the process's `VmLck` (pages locked already, by
    /// llama.cpp's `--mlock`, add nothing; ranges locked before a failure stay locked, and count).
    pub bytes: u64,
    /// Why a range could not be locked (the error and `RLIMIT_MEMLOCK`), if one could not.
    pub failed: Option<String>,
}

/// Locks the pages of `ranges` in memory (`mlock`: resident until unlocked or unmapped, never
/// reclaimed), stopping at the first range that cannot be.
pub fn pin(ranges: &[&[u8]]) -> Pinned {
    let before = budget::locked_now().unwrap_or(0);
    let mut failed = None;
    for bytes in ranges.iter().filter(|b| !b.is_empty()) {
        let start = bytes.as_ptr() as usize;
        let pages = pages_of(start..start + bytes.len());
        // SAFETY: the pages cover part of a live mapping (the caller's slice); mlock changes
        // no byte of them, only keeps them resident.
        let rc =
            unsafe { libc::mlock(pages.start as *const libc::c_void, pages.end - pages.start) };
        if rc != 0 {
            failed = Some(std::io::Error::last_os_error());
            break;
        }
    }
    Pinned {
        bytes: budget::locked_now().unwrap_or(0).saturating_sub(before),
        failed: failed.map(|err| format!("mlock: {err}; RLIMIT_MEMLOCK {}", memlock_limit())),
    }
}

/// The process's `RLIMIT_MEMLOCK` soft limit, in words.
fn memlock_limit() -> String {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the struct passed.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit) } != 0 {
        return "unknown".into();
    }
    if limit.rlim_cur == libc::RLIM_INFINITY {
        return "unlimited".into();
    }
    format!("{:.1} MiB", limit.rlim_cur as f64 / (1u64 << 20) as f64)
}

/// The non-empty entries of the C array `ranges` as slices; `None` when `ranges` is null with
/// `n` > 0 (the caller's error), no slices when it is null with `n` 0.
///
/// # Safety
/// As [`spark_memory_loaded`]: `ranges` is null or points to `n` entries, each a live readable
/// mapping of `size` bytes at `data` (or null `data` or `size` 0, which are left out).
unsafe fn entry_slices<'a>(ranges: *const Bytes, n: usize) -> Option<Vec<&'a [u8]>> {
    if ranges.is_null() {
        return (n == 0).then(Vec::new);
    }
    // SAFETY: `n` entries (contract).
    let entries = unsafe { std::slice::from_raw_parts(ranges, n) };
    let slices = entries
        .iter()
        .filter(|b| !b.data.is_null() && b.size > 0)
        // SAFETY: a live readable mapping of `size` bytes at `data` (contract).
        .map(|b| unsafe { std::slice::from_raw_parts(b.data.cast::<u8>(), b.size as usize) })
        .collect();
    Some(slices)
}

/// The two entries above: the pages of `slices` not in memory are read now ([`populate`]), with
/// one line naming `what` and `why` when that is [`QUIET_BELOW`] or more.
fn read_missing_now(slices: &[&[u8]], what: &str, why: &str) {
    let total: u64 = slices.iter().map(|b| b.len() as u64).sum();
    let out: Vec<(&[u8], u64)> = slices
        .iter()
        .map(|b| (*b, missing_bytes(b)))
        .filter(|&(_, m)| m > 0)
        .collect();
    let missing: u64 = out.iter().map(|&(_, m)| m).sum();
    if missing == 0 {
        return;
    }
    if missing >= QUIET_BELOW {
        crate::log::say!(
            "spark: reading this model's {what} into memory now ({:.2} GiB of {:.2} GiB not yet \
             there; {why}), rather than a few at a time by its first tokens",
            missing as f64 / (1u64 << 30) as f64,
            total as f64 / (1u64 << 30) as f64
        );
    }
    for (bytes, _) in out {
        // SAFETY: a slice lies in a live readable mapping, and so do the whole pages around it.
        unsafe { populate(bytes) };
    }
}

/// The one line a process prints the first time a matrix's rows stream from storage.
fn announce(mode: Mode, layer: Option<i32>, fraction: f64, bytes: usize) {
    static ONCE: OnceLock<()> = OnceLock::new();
    if ONCE.set(()).is_ok() {
        let layer = layer.map_or_else(|| "a layer".to_string(), |l| format!("layer {l}"));
        let why = match mode {
            Mode::Always => "SPARK_PAGING=always".to_string(),
            _ => format!(
                "{:.0} % of {:.1} MiB resident",
                fraction * 100.0,
                bytes as f64 / (1 << 20) as f64
            ),
        };
        crate::log::say!(
            "spark: FFN rows of {layer} are not all in memory ({why}): each step's K2 and V rows \
             are requested from storage ahead of use, without readahead (docs/USAGE.md, \
             \"Memory budgets\")"
        );
    }
}
