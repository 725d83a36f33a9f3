//! How the FFN of one ubatch is cut: which path runs ([`super::fused`], [`super::two_stage`],
//! or none of the Spark ops: the graph's dense FFN, from [`crate::dense_switch`]'s switch
//! point on) and, on the fused path, into how many neuron chunks P. Decided here and nowhere
//! else: the spark-gemma2 graph asks through the C function [`spark_ffn_tiling`]
//! (a proc of the "Spark" registry entry, docs/INTERFACES.md) and builds its nodes from the
//! answer, so no constant of the kernels is spelled in the patch series.
//!
//! Also how the fused path's two ops cut their outputs into work units for the `nth` threads
//! of a call ([`FusedUnits`], [`SumUnits`]): pure functions of the shapes and `nth`. P fixes
//! the arithmetic (the partials' summation order) and depends on the shapes only; the work
//! units never change a bit (each output element is computed by one unit, in an order that does
//! not depend on the unit), so they may follow `nth`: as today's units (P chunks x groups of up
//! to [`UNIT_TOKENS`] tokens, 16 at a decode step) while those are at least as many as the
//! threads, finer beyond, so that 16-64 threads all get work at Gemma-2 2B shapes.

use crate::dense_switch::{self, Part, WeightBackend};
use std::ffi::{c_char, c_int, CStr};
use std::ops::Range;

/// Ubatches of up to this many tokens take the fused path: llama.cpp's default `n_ubatch`, so
/// every decode step and the default prefill ubatch. The fused path is the faster one at every
/// batch size measured (docs/PERF.md); above this its partial outputs (P x D x T floats: 75 MB
/// at Gemma-2 2B shapes and 512 tokens, beside 0.5 GB of logits) would keep growing the compute
/// buffer, and the two-stage path takes over.
pub const FUSED_MAX_TOKENS: usize = 512;

/// The most chunks of the fused path. 16 splits evenly over 1, 2, 4, 8 or 16 threads (a
/// thread's share is then exactly F / nth neurons, so the threads' loads differ only by their
/// chunks' random active counts), and the partials of one token at Gemma-2 2B's D (16 x 9 KB)
/// stay in L2 for the sum.
pub const MAX_CHUNKS: usize = 16;

/// The fused path's chunk count for F = `f` neurons: [`MAX_CHUNKS`], or F when F is smaller.
pub fn default_chunks(f: usize) -> usize {
    f.clamp(1, MAX_CHUNKS)
}

/// The path of a ubatch through the FFN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FfnPath {
    /// `spark_ffn_fused` into this many partial outputs (1 <= P <= F), then `spark_ffn_sum`
    /// (with P = 1 the one partial is the output: the graph builds no sum node).
    Fused {
        /// P, the neuron chunks.
        chunks: usize,
    },
    /// `spark_ffn_up`, then `spark_ffn_down`.
    TwoStage,
    /// No Spark op: the graph's dense FFN of stock ggml ops, with V's product as a matrix
    /// product over a stock-layout copy of V made in the graph (what a GPU's tensor cores
    /// run fastest; [`crate::dense_switch`] says for which ubatches).
    Dense,
}

/// The path of a ubatch of `n_tokens` tokens through an FFN of `f` neurons.
pub fn path(n_tokens: usize, f: usize) -> FfnPath {
    if n_tokens <= FUSED_MAX_TOKENS {
        FfnPath::Fused {
            chunks: default_chunks(f),
        }
    } else {
        FfnPath::TwoStage
    }
}

/// [`path`] for an FFN whose weights are on `backend`: the dense path from the switch point
/// of [`crate::dense_switch`] on; below it, on CUDA, the fused path in one chunk (this
/// plugin's CUDA launchers cut the neurons into [`MAX_CHUNKS`] chunks themselves and add them
/// in their last kernel, so no sum node follows: one kernel less per layer).
pub fn path_on(backend: WeightBackend, n_tokens: usize, f: usize) -> FfnPath {
    if dense_switch::takes_dense(Part::Ffn, backend, n_tokens) {
        return FfnPath::Dense;
    }
    match (path(n_tokens, f), backend) {
        (FfnPath::Fused { .. }, WeightBackend::Cuda) => FfnPath::Fused { chunks: 1 },
        (p, _) => p,
    }
}

/// `path` of [`FfnTiling`]: the fused path.
pub const PATH_FUSED: i32 = 1;
/// `path` of [`FfnTiling`]: the two-stage path.
pub const PATH_TWO_STAGE: i32 = 2;
/// `path` of [`FfnTiling`]: the graph's dense FFN.
pub const PATH_DENSE: i32 = 3;

/// The answer of [`spark_ffn_tiling`]: `struct spark_ffn_tiling { int32_t path; int32_t
/// n_chunk; }` of the graph's C header
/// (`patches/llama.cpp/files/src/models/spark-backend.h`; layout pinned by
/// `probe/graph_abi.c`, `tests/registry.rs`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FfnTiling {
    /// [`PATH_FUSED`], [`PATH_TWO_STAGE`] or [`PATH_DENSE`].
    pub path: i32,
    /// P (1 <= P <= F) on the fused path, 1 on the others.
    pub n_chunk: i32,
}

impl FfnTiling {
    /// The C form of `p`, or `None` when P does not fit an `int32_t`.
    pub fn of(p: FfnPath) -> Option<Self> {
        Some(match p {
            FfnPath::Fused { chunks } => Self {
                path: PATH_FUSED,
                n_chunk: i32::try_from(chunks).ok()?,
            },
            FfnPath::TwoStage => Self {
                path: PATH_TWO_STAGE,
                n_chunk: 1,
            },
            FfnPath::Dense => Self {
                path: PATH_DENSE,
                n_chunk: 1,
            },
        })
    }
}

/// C ABI `int spark_ffn_tiling(const char * backend, int64_t n_tokens, int64_t n_ff,
/// int64_t n_embd, struct spark_ffn_tiling * out)`: the path and chunk count of a ubatch of
/// `n_tokens` tokens through an FFN of `n_ff` neurons and width `n_embd` whose weights are on
/// the device of ggml backend registry `backend` (NULL: not known) ([`path_on`]). Writes `*out`
/// and returns 0; returns -1 and leaves `*out` alone when `out` is null or a size is below 1.
/// The width is part of the question (the fused path's partials are P x D x T floats) though
/// today's answer does not depend on it.
///
/// # Safety
/// `backend` must be null or a NUL-terminated string; `out` null or valid for writing one
/// `FfnTiling`.
pub unsafe extern "C" fn spark_ffn_tiling(
    backend: *const c_char,
    n_tokens: i64,
    n_ff: i64,
    n_embd: i64,
    out: *mut FfnTiling,
) -> c_int {
    crate::ffi::guard("spark_ffn_tiling", -1, || {
        let size = |v: i64| usize::try_from(v).ok().filter(|&v| v >= 1);
        let (Some(t), Some(f), Some(_)) = (size(n_tokens), size(n_ff), size(n_embd)) else {
            return -1;
        };
        if out.is_null() {
            return -1;
        }
        // SAFETY: null or NUL-terminated (contract).
        let name = (!backend.is_null()).then(|| unsafe { CStr::from_ptr(backend) });
        let on = WeightBackend::from_registry_name(name);
        let Some(tiling) = FfnTiling::of(path_on(on, t, f)) else {
            return -1;
        };
        // SAFETY: non-null and writable per the contract; unaligned write for safety.
        unsafe { out.write_unaligned(tiling) };
        0
    })
}

/// Output ranges of the fused path's work units start at multiples of this many elements (and
/// of V's block size where a unit holds part of a row): 64 bytes, one cache line, so units of
/// different threads never write the same line, and SIMD loops see the same element positions
/// in a part as in the whole row.
pub const DIM_ALIGN: usize = 16;

/// Tokens per work unit of `spark_ffn_fused` while the units are at least as many as the
/// threads: a unit reads the K2 row of each of its chunk's active neurons once for all of its
/// tokens that use it (~5 of 64 at 8 % activity, docs/PERF.md), so units are cut smaller only
/// when threads would otherwise have none.
pub const UNIT_TOKENS: usize = 64;

/// The most parts the columns of a one-token unit of `spark_ffn_fused` are cut into. Every
/// part does the K2 dots of all the chunk's active neurons for its token (1280 multiply-adds
/// each at Gemma-2 2B shapes) and its share of the V row (2304 / parts): with 4 parts a unit
/// takes 0.52 of a whole chunk's time and the op does 2.07x the whole chunks' work, so more
/// parts would buy little and cost much.
pub const MAX_COL_PARTS: usize = 4;

/// One work unit of `spark_ffn_fused`: rows `tokens` of neuron chunk `chunk`'s partial plane,
/// columns `cols` of each (all D columns, or part of one token's row).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FusedUnit {
    /// The neuron chunk (partial plane), `< P`.
    pub chunk: usize,
    /// Consecutive tokens of the ubatch.
    pub tokens: Range<usize>,
    /// Output columns: `0..D`, or (a one-token unit) a range of whole V blocks.
    pub cols: Range<usize>,
}

/// How one `spark_ffn_fused` call of P chunks, T tokens and width D is cut into work units for
/// `nth` threads ([`FusedUnits::new`]). Units are numbered chunk-major, then token group, then
/// column part, so consecutive units (the ones the threads take together from the counter)
/// share a chunk's K2 and V rows in the shared cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FusedUnits {
    p: usize,
    n_tokens: usize,
    d: usize,
    /// Token groups per chunk (balanced: sizes differ by at most one token).
    groups: usize,
    /// Column parts per one-token unit (1: whole rows).
    parts: usize,
    /// Column alignment of the parts: lcm([`DIM_ALIGN`], V's block size).
    align: usize,
}

impl FusedUnits {
    /// The units of a call with `p` chunks, `n_tokens` tokens, `d` output columns (V rows of
    /// whole blocks of `block_elems`) on `nth` threads:
    /// 1. P chunks x ceil(T / [`UNIT_TOKENS`]) token groups (today's units);
    /// 2. more threads than chunks (only then: up to P threads keep step 1's units): more
    ///    token groups, up to one per token, until every thread has a unit and the units are a
    ///    multiple of `nth` (a 64-token ubatch on 32 or 64 threads: groups of 32 or 16);
    /// 3. still fewer (every group one token: a decode step, or a few tokens, on more than P
    ///    threads): each one-token unit cut into up to [`MAX_COL_PARTS`] column parts of whole
    ///    aligned blocks.
    pub fn new(p: usize, n_tokens: usize, d: usize, block_elems: usize, nth: usize) -> Self {
        let p = p.max(1);
        let nth = nth.max(1);
        let mut groups = n_tokens.div_ceil(UNIT_TOKENS);
        if nth > p {
            // At least a unit per thread, and a whole number of units per thread where tokens
            // allow (a multiple of nth / gcd(nth, P) groups), so that they balance.
            let step = nth / gcd(nth, p);
            let want = groups.max(nth.div_ceil(p)).next_multiple_of(step);
            groups = n_tokens.min(want);
        }
        let align = lcm(DIM_ALIGN, block_elems.max(1));
        let mut parts = 1;
        if n_tokens > 0 && p * groups < nth {
            // Here groups == n_tokens: step 2 stopped at one token per group.
            parts = nth
                .div_ceil(p * groups)
                .min(MAX_COL_PARTS)
                .min(d / align)
                .max(1);
        }
        Self {
            p,
            n_tokens,
            d,
            groups,
            parts,
            align,
        }
    }

    /// The number of work units (0 for an empty batch).
    pub fn count(&self) -> usize {
        self.p * self.groups * self.parts
    }

    /// Unit `u` (`u < count()`): its chunk, tokens and columns.
    pub fn get(&self, u: usize) -> FusedUnit {
        let groups = self.groups.max(1);
        let (part, rest) = (u % self.parts, u / self.parts);
        let (g, chunk) = (rest % groups, rest / groups);
        let t = self.n_tokens;
        let tokens = g * t / groups..(g + 1) * t / groups;
        let cols = if self.parts == 1 {
            0..self.d
        } else {
            let blocks = self.d / self.align;
            let at = |i: usize| i * blocks / self.parts * self.align;
            let end = if part + 1 == self.parts {
                self.d
            } else {
                at(part + 1)
            };
            at(part)..end
        };
        FusedUnit {
            chunk,
            tokens,
            cols,
        }
    }

    /// The elements of the `[D, T, P]` partial tensor (contiguous) that `unit` writes: one
    /// range, since a unit is whole rows or part of one row.
    pub fn span(&self, unit: &FusedUnit) -> Range<usize> {
        let row = |t: usize| (unit.chunk * self.n_tokens + t) * self.d;
        if unit.tokens.is_empty() {
            return row(unit.tokens.start)..row(unit.tokens.start);
        }
        row(unit.tokens.start) + unit.cols.start..row(unit.tokens.end - 1) + unit.cols.end
    }

    /// Column parts per one-token unit (1 unless the threads outnumber the token groups).
    pub fn col_parts(&self) -> usize {
        self.parts
    }
}

/// How one `spark_ffn_sum` call of `len` = D x T output elements is cut into work units for
/// `nth` threads: ranges of whole 16-element lines (one cache line each), balanced (sizes differ
/// by at most one line). As many units as blocks of `max(256, ceil(len / 64) rounded up to
/// 16)` elements would give (9 at a decode step of D = 2304, 64 for a ubatch of 64 or 512
/// tokens), and at least one per thread while lines last: a decode step on 16, 32 or 64
/// threads gets 16, 32 or 64 units of 9, 4-5 or 2-3 lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SumUnits {
    len: usize,
    units: usize,
}

impl SumUnits {
    /// The units of a sum of `len` elements on `nth` threads.
    pub fn new(len: usize, nth: usize) -> Self {
        let lines = len.div_ceil(DIM_ALIGN);
        let block = len.div_ceil(64).next_multiple_of(DIM_ALIGN).max(256);
        let units = len.div_ceil(block).max(nth.max(1).min(lines));
        Self {
            len,
            units: units.min(lines),
        }
    }

    /// The number of work units (0 when `len` is 0).
    pub fn count(&self) -> usize {
        self.units
    }

    /// The elements of unit `u` (empty for `u >= count()`).
    pub fn get(&self, u: usize) -> Range<usize> {
        let lines = self.len.div_ceil(DIM_ALIGN);
        let n = self.units.max(1);
        let at = |i: usize| (i.min(n) * lines / n * DIM_ALIGN).min(self.len);
        at(u)..at(u + 1)
    }
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

fn lcm(a: usize, b: usize) -> usize {
    a / gcd(a, b) * b
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(n_tokens: i64, n_ff: i64, n_embd: i64) -> Option<FfnTiling> {
        let mut t = FfnTiling {
            path: -7,
            n_chunk: -7,
        };
        // SAFETY: `t` is writable.
        let rc = unsafe { spark_ffn_tiling(c"CPU".as_ptr(), n_tokens, n_ff, n_embd, &mut t) };
        match rc {
            0 => Some(t),
            -1 => {
                assert_eq!((t.path, t.n_chunk), (-7, -7), "written on failure");
                None
            }
            rc => panic!("return code {rc}"),
        }
    }

    /// Gemma-2 2B's Spark FFN: D, r_f, F, and P as the graph gets it.
    const D: usize = 2304;
    const R_F: usize = 1024;
    const F: usize = 13824;
    const Q8_0_BLOCK: usize = 32;

    use crate::cpu_op::list_schedule_imbalance as imbalance;

    /// A fused unit's multiply-adds if every neuron of its chunk were active: a K2 dot per
    /// (neuron, token) and its columns of the V rows (the activity is random, ~8 % per neuron).
    fn fused_cost(u: &FusedUnit, p: usize) -> f64 {
        let neurons = super::super::fused::chunk_neurons(F, p, u.chunk).len();
        (neurons * u.tokens.len() * (D - R_F + u.cols.len())) as f64
    }

    /// The units of `units` cover the `[D, T, P]` partials exactly once, each whole rows or whole
    /// aligned blocks of one row; returns them in counter order.
    fn check_cover(units: &FusedUnits, p: usize, n_tokens: usize, align: usize) -> Vec<FusedUnit> {
        let all: Vec<FusedUnit> = (0..units.count()).map(|u| units.get(u)).collect();
        let mut spans: Vec<Range<usize>> = all.iter().map(|u| units.span(u)).collect();
        for (u, s) in all.iter().zip(&spans) {
            assert!(
                u.chunk < p && u.tokens.end <= n_tokens && !u.tokens.is_empty(),
                "{u:?}"
            );
            assert_eq!(s.len(), u.tokens.len() * u.cols.len(), "{u:?}");
            if u.cols != (0..D) {
                assert_eq!(u.tokens.len(), 1, "{u:?}");
                assert!(
                    u.cols.start.is_multiple_of(align) && u.cols.end.is_multiple_of(align),
                    "{u:?}"
                );
            }
        }
        spans.sort_by_key(|s| s.start);
        let mut at = 0;
        for s in spans {
            assert_eq!(s.start, at, "a gap or an overlap");
            at = s.end;
        }
        assert_eq!(at, p * n_tokens * D);
        all
    }

    #[test]
    fn up_to_p_threads_get_todays_fused_units() {
        for n_tokens in [1usize, 2, 63, 64, 65, 128, 500, 512] {
            let p = default_chunks(F);
            let groups = n_tokens.div_ceil(UNIT_TOKENS);
            for nth in 1..=p {
                let units = FusedUnits::new(p, n_tokens, D, Q8_0_BLOCK, nth);
                assert_eq!(units.count(), p * groups, "T {n_tokens} nth {nth}");
                assert_eq!(units.col_parts(), 1);
                for u in 0..units.count() {
                    let one = units.get(u);
                    assert_eq!((one.chunk, one.cols.clone()), (u / groups, 0..D));
                    let g = u % groups;
                    assert_eq!(
                        one.tokens,
                        g * n_tokens / groups..(g + 1) * n_tokens / groups
                    );
                    if n_tokens.is_multiple_of(UNIT_TOKENS) {
                        assert_eq!(one.tokens, g * UNIT_TOKENS..(g + 1) * UNIT_TOKENS);
                    }
                }
            }
        }
    }

    /// Issue 26 item 5: at Gemma-2 2B shapes every one of 16, 32 or 64 threads gets a fused
    /// unit at a decode step and in 64- and 512-token ubatches, with equal loads there (P = 16
    /// chunks of 864 neurons, token groups and column parts of equal size, and a unit count that
    /// is a multiple of the thread count). For every ubatch size of the fused path the units
    /// are at least as many as the threads (or as the (chunk, token, part) triples allow), the
    /// busiest thread has at most 1.05x the mean load from 64 tokens on (groups of 16 tokens or
    /// more, sizes differing by at most one token) and at most twice below: units of one token are indivisible but for
    /// their columns, so a few tokens over many threads cannot balance better (5 tokens x 16
    /// chunks on 64 threads: 4 groups of 1, 1, 1 and 2 tokens, a thread with a 2-token unit
    /// has 1.6x the mean).
    #[test]
    fn gemma2_2b_fused_units_give_16_to_64_threads_work() {
        let p = default_chunks(F);
        for nth in [16, 32, 64] {
            for n_tokens in 1..=FUSED_MAX_TOKENS {
                let units = FusedUnits::new(p, n_tokens, D, Q8_0_BLOCK, nth);
                let all = check_cover(&units, p, n_tokens, Q8_0_BLOCK);
                let most = p * n_tokens * MAX_COL_PARTS;
                assert!(
                    all.len() >= nth.min(most),
                    "T {n_tokens} nth {nth}: {}",
                    all.len()
                );
                let costs: Vec<f64> = all.iter().map(|u| fused_cost(u, p)).collect();
                let ratio = imbalance(&costs, nth);
                assert!(ratio <= 2.0, "T {n_tokens} nth {nth}: {ratio}");
                if n_tokens >= UNIT_TOKENS {
                    // Groups of 16 tokens or more, sizes differing by at most one token.
                    assert!(ratio <= 1.05, "T {n_tokens} nth {nth}: {ratio}");
                }
                if [1, 64, 512].contains(&n_tokens) {
                    assert_eq!(all.len() % nth, 0, "T {n_tokens} nth {nth}");
                    assert!(ratio < 1.0 + 1e-12, "T {n_tokens} nth {nth}: {ratio}");
                }
                // Column parts (which repeat the K2 dots) only where tokens are too few.
                if units.col_parts() > 1 {
                    assert!(p * n_tokens < nth, "T {n_tokens} nth {nth}");
                }
            }
        }
        // The decode step: 16 whole chunks on 16 threads, halves on 32, quarters on 64.
        for (nth, parts) in [(16, 1), (32, 2), (64, 4)] {
            let units = FusedUnits::new(p, 1, D, Q8_0_BLOCK, nth);
            assert_eq!((units.count(), units.col_parts()), (nth, parts));
        }
        // A 64-token ubatch: groups of 64, 32, 16 tokens.
        for (nth, tokens) in [(16, 64), (32, 32), (64, 16)] {
            let units = FusedUnits::new(p, 64, D, Q8_0_BLOCK, nth);
            assert_eq!((units.count(), units.get(0).tokens.len()), (nth, tokens));
        }
    }

    #[test]
    fn column_parts_respect_the_weight_blocks() {
        // Q4_K rows are blocks of 256: D = 2304 has 9, cut into 4 parts of 2 or 3.
        let units = FusedUnits::new(16, 1, D, 256, 64);
        let all = check_cover(&units, 16, 1, 256);
        assert_eq!((all.len(), units.col_parts()), (64, 4));
        let widths: Vec<usize> = all[..4].iter().map(|u| u.cols.len()).collect();
        assert_eq!(widths, [512, 512, 512, 768]);
        // Too narrow to cut: one part.
        let narrow = FusedUnits::new(16, 1, 32, 32, 64);
        assert_eq!((narrow.count(), narrow.col_parts()), (16, 1));
        // f32 rows of D = 40: aligned parts of 16 and the rest.
        let odd = FusedUnits::new(2, 1, 40, 1, 8);
        let all: Vec<_> = (0..odd.count()).map(|u| odd.get(u).cols).collect();
        assert_eq!(all, [0..16, 16..40, 0..16, 16..40]);
        // An empty batch has no units.
        assert_eq!(FusedUnits::new(16, 0, D, 32, 64).count(), 0);
    }

    /// `spark_ffn_sum`: today's blocks while they are at least as many as the threads (9 at a
    /// decode step of D = 2304, 64 in 64- and 512-token ubatches), a balanced cut into one
    /// range of whole cache lines per thread beyond; ranges cover the output once, in order.
    #[test]
    fn sum_units_give_every_thread_work() {
        for n_tokens in [1usize, 2, 3, 64, 100, 512] {
            let len = D * n_tokens;
            let block = len.div_ceil(64).next_multiple_of(DIM_ALIGN).max(256);
            for nth in [1, 2, 4, 8, 16, 32, 64] {
                let units = SumUnits::new(len, nth);
                let n = units.count();
                assert!(n >= nth.min(len / DIM_ALIGN), "T {n_tokens} nth {nth}");
                let mut at = 0;
                let (mut lo, mut hi) = (usize::MAX, 0);
                for u in 0..n {
                    let r = units.get(u);
                    assert_eq!(r.start, at);
                    assert!(r.start.is_multiple_of(DIM_ALIGN) && !r.is_empty());
                    at = r.end;
                    let lines = r.len().div_ceil(DIM_ALIGN);
                    (lo, hi) = (lo.min(lines), hi.max(lines));
                }
                assert_eq!(at, len);
                assert!(units.get(n).is_empty());
                assert!(hi - lo <= 1, "T {n_tokens} nth {nth}: {lo}..{hi} lines");
                if nth <= len.div_ceil(block) && len.is_multiple_of(block) {
                    // Today's blocks exactly.
                    assert_eq!(n, len / block);
                    assert!((0..n).all(|u| units.get(u) == (u * block..(u + 1) * block)));
                }
            }
        }
        assert_eq!(SumUnits::new(D, 2).count(), 9);
        assert_eq!(SumUnits::new(D, 64).count(), 64);
        assert_eq!(SumUnits::new(64 * D, 64).count(), 64);
        assert_eq!(SumUnits::new(0, 8).count(), 0);
        assert_eq!(SumUnits::new(20, 8).count(), 2);
    }

    #[test]
    fn ubatches_up_to_512_tokens_take_the_fused_path_in_16_chunks() {
        let fused16 = Some(FfnTiling {
            path: PATH_FUSED,
            n_chunk: 16,
        });
        assert_eq!(ask(1, 9216, 2304), fused16);
        assert_eq!(ask(64, 9216, 2304), fused16);
        assert_eq!(ask(512, 9216, 2304), fused16);
        let two = Some(FfnTiling {
            path: PATH_TWO_STAGE,
            n_chunk: 1,
        });
        assert_eq!(ask(513, 9216, 2304), two);
        assert_eq!(ask(4096, 9216, 2304), two);
        // fewer neurons than chunks: one chunk per neuron
        assert_eq!(
            ask(3, 5, 16),
            Some(FfnTiling {
                path: PATH_FUSED,
                n_chunk: 5
            })
        );
    }

    #[test]
    fn bad_questions_get_minus_one_and_no_answer() {
        let bad = [
            (0, 9216, 2304),
            (1, 0, 2304),
            (1, 9216, 0),
            (-1, 9216, 2304),
        ];
        for (t, f, d) in bad {
            assert_eq!(ask(t, f, d), None, "{t} {f} {d}");
        }
        // SAFETY: a null `out` is part of the contract.
        assert_eq!(
            unsafe { spark_ffn_tiling(std::ptr::null(), 1, 9216, 2304, std::ptr::null_mut()) },
            -1
        );
    }

    #[test]
    fn on_cuda_the_fused_path_takes_one_chunk_and_big_ubatches_the_dense_graph() {
        let ask_on = |name: Option<&CStr>, n_tokens: i64| {
            let mut t = FfnTiling::default();
            let p = name.map_or(std::ptr::null(), CStr::as_ptr);
            // SAFETY: a C string or null; `t` is writable.
            assert_eq!(
                unsafe { spark_ffn_tiling(p, n_tokens, 9216, 2304, &mut t) },
                0
            );
            (t.path, t.n_chunk)
        };
        let cuda = cfg!(feature = "cuda");
        for t in [1, 8, 9, 31, 32, 512, 513, 4096] {
            let on_cuda = match (cuda, t) {
                (true, t) if t >= 32 => (PATH_DENSE, 1),
                (true, _) => (PATH_FUSED, 1),
                (false, t) if t > 512 => (PATH_TWO_STAGE, 1),
                (false, _) => (PATH_FUSED, 16),
            };
            assert_eq!(ask_on(Some(c"CUDA"), t), on_cuda, "CUDA, {t} tokens");
            // every other backend keeps the Spark ops at every size
            let elsewhere = if t > 512 {
                (PATH_TWO_STAGE, 1)
            } else {
                (PATH_FUSED, 16)
            };
            for other in [
                Some(c"CPU"),
                Some(c"RPC"),
                Some(c"Vulkan"),
                Some(c"cuda"),
                None,
            ] {
                assert_eq!(ask_on(other, t), elsewhere, "{other:?}, {t} tokens");
            }
        }
        assert_eq!(
            FfnTiling::of(FfnPath::Dense),
            Some(FfnTiling {
                path: PATH_DENSE,
                n_chunk: 1
            })
        );
    }
}
