//! The sparse attention computation of SPEC 4 over work units of (stream, token block, KV head,
//! query heads of the group).
//!
//! Per unit, the queries of its heads of one KV group for a few tokens are scored together
//! against the first `r` dims of each needed key row (one read of K1 serves all of them); then
//! each query alone selects its positions with the statistical top-k, and only the kept
//! positions get the second-part dot product and the value accumulation. A unit covers every
//! head of its group, unless that leaves fewer than [`UNITS_PER_THREAD`] units per thread of
//! the call (a decode step on more than two threads, where each KV head would be one unit), in
//! which case each query head is a unit of its own, and its tokens shrink to one when even
//! that leaves threads without a unit ([`Tiling`]). A decode step of one sequence stops at one
//! unit per query head.
//!
//! Work units are a fixed partition of the (token, head) pairs that depends only on the shapes
//! and the call's thread count; the `spark_attn` op hands them out from a shared counter
//! ([`run_units`]), [`run`] takes units `ith, ith + nth, ...`. Each output row is computed by one
//! thread with arithmetic that does not depend on the unit's other rows (the dot products give
//! the same bits whatever queries they are blocked with), so the output is bit-identical for
//! every tiling, thread count and schedule (and for any batch composition).

use super::dot::{self, BlockRows, Queries, Rows, Scores, Staging};
use super::layout::{AttnLayout, CacheType, ElemType, Strided};
use super::math;
use crate::arch::Kernels;
use crate::topk;
use std::cell::RefCell;
use std::ops::Range;

/// What one (token, head) query kept, reported to an observer of [`run`].
#[derive(Debug)]
pub struct RowSelection<'a> {
    /// Stream index (ne3).
    pub stream: usize,
    /// Token index within the stream.
    pub token: usize,
    /// Query head.
    pub head: usize,
    /// Kept positions S, ascending cache indices.
    pub positions: &'a [u32],
}

/// Positions kept and queries processed by one thread in one call.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    /// Sum over queries of |S|.
    pub kept: u64,
    /// (token, head) pairs processed.
    pub(crate) queries: u64,
}

/// Reusable per-thread buffers (ggml's worker threads live across calls).
#[derive(Default)]
struct Scratch {
    /// Queries of the unit, `n_q x H`, contiguous.
    q: Vec<f32>,
    /// Concatenated valid-position lists.
    lists: Vec<u32>,
    /// Per query: its range in `lists`.
    spans: Vec<(usize, usize)>,
    /// Distinct mask rows seen in the unit: (byte offset, range in `lists`).
    mask_rows: Vec<(usize, (usize, usize))>,
    /// Union of the unit's valid positions (ascending), the rows scored.
    union: Vec<u32>,
    /// `col_of[j]`: column of position `j` in `union`.
    col_of: Vec<u32>,
    /// Marks for building the union.
    needed: Vec<bool>,
    /// First-part scores, `n_q x union.len()`.
    d: Vec<f32>,
    /// One query's capped scores over C.
    s: Vec<f32>,
    /// Indices into `s` kept by the top-k.
    keep: Vec<u32>,
    /// Kept cache positions.
    pos: Vec<u32>,
    /// Kept scores, then softmax numerators.
    e: Vec<f32>,
    /// Second-part dots, then softplus, then weights.
    w: Vec<f32>,
    /// Output row.
    o: Vec<f32>,
    /// Rows of a block-typed cache converted to f32 where the table reads none in place.
    staging: Staging,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Tokens per work unit while the units outnumber the threads: about eight queries share each
/// key row read.
fn tokens_per_unit(group: usize, n_tokens: usize) -> usize {
    (8 / group).clamp(1, n_tokens.max(1))
}

/// Group units per thread below which a call splits its units into one query head each. A
/// unit of a whole group reads each K1 row once for both query heads (7-34 % less time per
/// decode step's call than head units at 4096 positions on 2 threads, docs/PERF.md); head units
/// give more threads work (a decode step of Gemma-2 2B has 4 group units, 8 head units) and
/// let a running thread take over more of a stalled one's share.
pub(crate) const UNITS_PER_THREAD: usize = 2;

/// How one call's (token, head) pairs are cut into work units: a function of the shapes and
/// the thread count only, so every thread of a call derives the same units.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tiling {
    /// Tokens per unit.
    tokens: usize,
    /// Query heads per unit (the group size, or 1).
    heads: usize,
    /// Token blocks per stream.
    token_blocks: usize,
}

impl Tiling {
    /// The tiling of `l` for a call on `nth` threads: blocks of [`tokens_per_unit`] tokens times
    /// KV groups; single query heads when that gives fewer than [`UNITS_PER_THREAD`] units per
    /// thread; and when even those are fewer than the threads (a few tokens per stream, such as
    /// a decode step of several sequences, on many threads), fewer tokens per block, down to
    /// one, until every thread has a unit. A decode step of one sequence has one unit per query
    /// head at most (8 at Gemma-2 2B shapes): its positions cannot be split without a merge of
    /// the threshold statistics across threads, which a ggml node has no barrier for.
    pub(crate) fn new(l: &AttnLayout, nth: usize) -> Self {
        let gs = l.group_size();
        let nth = nth.max(1);
        let mut tokens = tokens_per_unit(gs, l.n_tokens);
        let group_units = l.n_stream * l.n_tokens.div_ceil(tokens) * l.n_head_kv;
        let heads = if group_units < UNITS_PER_THREAD * nth {
            1
        } else {
            gs
        };
        let per_block = l.n_stream * l.n_head_kv * (gs / heads);
        if per_block * l.n_tokens.div_ceil(tokens) < nth {
            let blocks = nth.div_ceil(per_block.max(1));
            tokens = l.n_tokens.div_ceil(blocks).clamp(1, tokens);
        }
        Self {
            tokens,
            heads,
            token_blocks: l.n_tokens.div_ceil(tokens),
        }
    }

    /// Tokens per unit (the last block of a stream may have fewer).
    pub fn tokens_per_unit(&self) -> usize {
        self.tokens
    }

    /// Query heads per unit: the group size, or 1 when the heads of a group are split.
    pub fn heads_per_unit(&self) -> usize {
        self.heads
    }
}

/// Number of work units of `l` under tiling `ti` (the most threads that can be busy).
pub(crate) fn n_units(l: &AttnLayout, ti: Tiling) -> usize {
    l.n_stream * ti.token_blocks * l.n_head_kv * (l.group_size() / ti.heads)
}

/// One work unit: tokens `tokens` of stream `stream`, query heads `heads` (all of KV head
/// `kv_head`'s group, or one of them).
#[derive(Clone, Debug)]
struct Unit {
    stream: usize,
    tokens: Range<usize>,
    kv_head: usize,
    heads: Range<usize>,
}

/// Unit `u` of `l` under tiling `ti` (`u < n_units(l, ti)`). Within a stream the last token
/// block comes first: in a causal prefill later tokens see more positions, so the threads take
/// the largest units first and the small ones last fill the gaps (a 64-token ubatch on 64
/// threads, two units each: equal loads in this order, the largest 1.43x the mean in the
/// other; `tests::prefill_units_balance_the_causal_mask`).
fn unit_bounds(l: &AttnLayout, ti: Tiling, u: usize) -> Unit {
    let (tb, heads, n_tb) = (ti.tokens, ti.heads, ti.token_blocks.max(1));
    let gs = l.group_size();
    let parts = gs / heads;
    let (part, rest) = (u % parts, u / parts);
    let g = rest % l.n_head_kv;
    let t0 = (n_tb - 1 - (rest / l.n_head_kv) % n_tb) * tb;
    let h0 = g * gs + part * heads;
    Unit {
        stream: rest / (l.n_head_kv * n_tb),
        tokens: t0..(t0 + tb).min(l.n_tokens),
        kv_head: g,
        heads: h0..h0 + heads,
    }
}

/// Computes the output rows of units `ith, ith + nth, ...` of tiling `ti` and returns the
/// tally.
///
/// # Safety
/// Every tensor of `l` must be readable (dst writable) over its shape and strides, and no other
/// code may access dst rows of these units while it runs. `ti` must be a tiling of `l`
/// ([`Tiling::new`] of this layout): its units' heads and tokens are then inside `l`'s shapes.
pub(crate) unsafe fn run(
    l: &AttnLayout,
    ti: Tiling,
    ith: usize,
    nth: usize,
    observer: Option<&mut dyn FnMut(&RowSelection)>,
) -> Tally {
    let mut units = (ith..n_units(l, ti)).step_by(nth.max(1));
    // SAFETY: forwarded contract.
    unsafe { run_units(l, ti, &mut units, observer) }
}

/// Computes the output rows of every unit of tiling `ti` that `units` yields (each
/// `< n_units(l, ti)`), in that order, and returns the tally.
///
/// # Safety
/// As for [`run`], for the units yielded.
pub(crate) unsafe fn run_units(
    l: &AttnLayout,
    ti: Tiling,
    units: &mut dyn Iterator<Item = usize>,
    mut observer: Option<&mut dyn FnMut(&RowSelection)>,
) -> Tally {
    let kernels = crate::arch::kernels();
    let n = n_units(l, ti);
    let mut tally = Tally::default();
    let mut work = |sc: &mut Scratch| {
        for u in (&mut *units).filter(|&u| u < n) {
            // SAFETY: forwarded from this function's contract.
            unsafe {
                unit(
                    l,
                    kernels,
                    unit_bounds(l, ti, u),
                    sc,
                    &mut observer,
                    &mut tally,
                )
            };
        }
    };
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut sc) => work(&mut sc),
        Err(_) => work(&mut Scratch::default()),
    });
    tally
}

/// Writes `value` into every element of unit `u`'s dst rows (nothing when
/// `u >= n_units(l, ti)`).
///
/// # Safety
/// As for [`run`] (only dst is touched), for unit `u`.
pub(crate) unsafe fn fill_unit(l: &AttnLayout, ti: Tiling, u: usize, value: f32) {
    if u >= n_units(l, ti) {
        return;
    }
    let Unit {
        stream: s,
        tokens,
        heads,
        ..
    } = unit_bounds(l, ti, u);
    for t in tokens {
        for n in heads.clone() {
            let row = l.dst.data.wrapping_add(l.dst.offset([0, n, t, s]));
            for i in 0..l.head_dim {
                // SAFETY: element (i, n, t, s) lies inside dst (contract); f32 adjacent.
                unsafe { row.wrapping_add(i * 4).cast::<f32>().write_unaligned(value) };
            }
        }
    }
}

/// Is mask element at `p` a valid position (exactly zero)?
///
/// # Safety
/// `p` must be readable for one element of `ty`.
#[inline(always)]
unsafe fn mask_valid(ty: ElemType, p: *const u8) -> bool {
    // SAFETY: per the contract; unaligned reads.
    unsafe {
        match ty {
            ElemType::F32 => p.cast::<f32>().read_unaligned() == 0.0,
            ElemType::F16 => p.cast::<u16>().read_unaligned() & 0x7fff == 0,
        }
    }
}

/// The rows of one KV head's cache, as the kernel reads them.
#[derive(Clone, Copy, Debug)]
enum CacheRows {
    /// f32 or f16 rows, read in place.
    Elems(Rows),
    /// Rows of whole blocks ([`dot::block_dots`], [`dot::block_accumulate`]).
    Blocks(BlockRows),
}

/// Rows of cache `c` for KV head `g` in stream `s`: row j = position j.
fn cache_rows(c: &Strided<CacheType>, g: usize, s: usize) -> CacheRows {
    let base = c.data.wrapping_add(g * c.nb[1] + s * c.nb[3]).cast_const();
    match c.ty {
        CacheType::Elems(ty) => CacheRows::Elems(Rows {
            base,
            ty,
            elem_stride: c.nb[0],
            row_stride: c.nb[2],
        }),
        CacheType::Blocks(ty) => CacheRows::Blocks(BlockRows {
            base,
            ty,
            row_stride: c.nb[2],
        }),
    }
}

impl Unit {
    /// The unit's queries: its tokens times its heads.
    fn n_queries(&self) -> usize {
        self.tokens.len() * self.heads.len()
    }

    /// Query `m`'s (token, head), token-major.
    fn query(&self, m: usize) -> (usize, usize) {
        let hp = self.heads.len();
        (self.tokens.start + m / hp, self.heads.start + m % hp)
    }
}

/// Computes the output rows of work unit `u`.
///
/// # Safety
/// As for [`run`].
unsafe fn unit(
    l: &AttnLayout,
    kernels: &Kernels,
    u: Unit,
    sc: &mut Scratch,
    observer: &mut Option<&mut dyn FnMut(&RowSelection)>,
    tally: &mut Tally,
) {
    let (s, g) = (u.stream, u.kv_head);
    let h = l.head_dim;
    // SAFETY: forwarded from this function's contract.
    unsafe { gather_queries(l, &u, sc) };
    // SAFETY: forwarded from this function's contract.
    unsafe { find_valid_positions(l, &u, sc) };
    union_of_valid_positions(l, sc);
    let k_rows = cache_rows(&l.k, g, s);
    let v_rows = cache_rows(&l.v, g, s);
    // SAFETY: the union's positions are < n_kv (mask columns), so their rows lie inside K.
    unsafe { first_part_scores(l, kernels, k_rows, u.n_queries(), sc) };

    sc.o.resize(h, 0.0);
    for m in 0..u.n_queries() {
        let (t, n) = u.query(m);
        let (a, b) = sc.spans[m];
        sc.pos.clear();
        sc.o.fill(0.0);
        if b > a {
            // SAFETY: query m's valid positions are < n_kv, so their rows lie inside K and V.
            let kept = unsafe { attend(l, kernels, k_rows, v_rows, m, sc) };
            tally.kept += kept as u64;
        }
        tally.queries += 1;
        let dst = l.dst.data.wrapping_add(l.dst.offset([0, n, t, s]));
        // SAFETY: dst row (., n, t, s) holds H adjacent f32 (nb0 == 4 is validated) and belongs
        // to this unit only.
        unsafe { std::ptr::copy_nonoverlapping(sc.o.as_ptr().cast::<u8>(), dst, h * 4) };
        if let Some(f) = observer.as_deref_mut() {
            f(&RowSelection {
                stream: s,
                token: t,
                head: n,
                positions: &sc.pos,
            });
        }
    }
}

/// The queries of unit `u`, copied contiguous into `sc.q` (`n_q x H`).
///
/// # Safety
/// As for [`run`], for unit `u` (only q is read).
unsafe fn gather_queries(l: &AttnLayout, u: &Unit, sc: &mut Scratch) {
    let h = l.head_dim;
    sc.q.resize(u.n_queries() * h, 0.0);
    for m in 0..u.n_queries() {
        let (t, n) = u.query(m);
        let base = l.q.data.wrapping_add(l.q.offset([0, n, t, u.stream]));
        for (i, x) in sc.q[m * h..(m + 1) * h].iter_mut().enumerate() {
            // SAFETY: q is readable over its shape (contract); element (i, n, t, s) is in it.
            *x = unsafe {
                base.wrapping_add(i * l.q.nb[0])
                    .cast::<f32>()
                    .read_unaligned()
            };
        }
    }
}

/// The valid positions of each query of unit `u` (C of SPEC 4), one scan per distinct mask row:
/// `sc.lists` holds the lists, `sc.spans[m]` query `m`'s range in them and `sc.mask_rows` the
/// distinct mask rows.
///
/// # Safety
/// As for [`run`], for unit `u` (only the mask is read).
unsafe fn find_valid_positions(l: &AttnLayout, u: &Unit, sc: &mut Scratch) {
    let s = u.stream;
    sc.lists.clear();
    sc.spans.clear();
    sc.mask_rows.clear();
    for m in 0..u.n_queries() {
        let (t, n) = u.query(m);
        let off = l.mask.offset([0, t, n % l.mask.ne[2], s % l.mask.ne[3]]);
        let span = match sc.mask_rows.iter().find(|(o, _)| *o == off) {
            Some(&(_, span)) => span,
            None => {
                let start = sc.lists.len();
                let row = l.mask.data.wrapping_add(off);
                for j in 0..l.n_kv {
                    // SAFETY: mask element (j, t, ., .) lies inside the mask (ne0 == n_kv, t < ne1).
                    if unsafe { mask_valid(l.mask.ty, row.wrapping_add(j * l.mask.nb[0])) } {
                        sc.lists.push(j as u32);
                    }
                }
                let span = (start, sc.lists.len());
                sc.mask_rows.push((off, span));
                span
            }
        };
        sc.spans.push(span);
    }
}

/// The union of the valid-position lists into `sc.union`: the key rows to score. With more than
/// one distinct mask row, `sc.col_of` maps a position to its column in the union; with one,
/// every list is the union itself and columns are list indices.
fn union_of_valid_positions(l: &AttnLayout, sc: &mut Scratch) {
    sc.union.clear();
    if sc.mask_rows.len() == 1 {
        let (a, b) = sc.mask_rows[0].1;
        sc.union.extend_from_slice(&sc.lists[a..b]);
        return;
    }
    sc.needed.clear();
    sc.needed.resize(l.n_kv, false);
    for &j in &sc.lists {
        sc.needed[j as usize] = true;
    }
    sc.union
        .extend((0..l.n_kv as u32).filter(|&j| sc.needed[j as usize]));
    if sc.col_of.len() < l.n_kv {
        sc.col_of.resize(l.n_kv, 0);
    }
    for (c, &j) in sc.union.iter().enumerate() {
        sc.col_of[j as usize] = c as u32;
    }
}

/// First-part scores of every query (`sc.q`, `n_q` of them) against every row of `sc.union`,
/// into `sc.d` (`n_q x union.len()`).
///
/// # Safety
/// `k_rows` must be readable over rows `sc.union` and dims `0..l.r`.
unsafe fn first_part_scores(
    l: &AttnLayout,
    kernels: &Kernels,
    k_rows: CacheRows,
    n_q: usize,
    sc: &mut Scratch,
) {
    let width = sc.union.len();
    sc.d.resize(n_q * width, 0.0);
    let Scratch {
        q,
        union,
        d,
        staging,
        ..
    } = sc;
    let queries = Queries {
        q,
        stride: l.head_dim,
        n: n_q,
    };
    match k_rows {
        // SAFETY: union positions are < n_kv, dims 0..r < H lie inside the K view; q and d
        // sized above.
        CacheRows::Elems(rows) => unsafe {
            dot::dots(
                kernels,
                rows,
                0..l.r,
                union,
                queries,
                Scores { out: d, ld: width },
            )
        },
        // SAFETY: as above.
        CacheRows::Blocks(rows) => unsafe {
            dot::block_dots(
                kernels,
                rows,
                0..l.r,
                union,
                queries,
                Scores { out: d, ld: width },
                staging,
            )
        },
    }
}

/// Query `m` (with at least one valid position) attends: its capped scores over C, the kept
/// positions S (into `sc.pos`), the softmax numerators over S, the second-part dots over the
/// kept rows only, and the output row `o = sum_j w_j v_j` (into `sc.o`, zeroed by the caller).
/// Returns |S|.
///
/// # Safety
/// `k_rows` must be readable over query `m`'s valid positions and dims `l.r..H`, `v_rows` over
/// those positions and dims `0..H`.
unsafe fn attend(
    l: &AttnLayout,
    kernels: &Kernels,
    k_rows: CacheRows,
    v_rows: CacheRows,
    m: usize,
    sc: &mut Scratch,
) -> usize {
    let h = l.head_dim;
    let width = sc.union.len();
    let (a, b) = sc.spans[m];
    // Capped scores over C.
    sc.s.clear();
    let drow = &sc.d[m * width..(m + 1) * width];
    if sc.mask_rows.len() == 1 {
        sc.s.extend_from_slice(drow);
    } else {
        sc.s.extend(
            sc.lists[a..b]
                .iter()
                .map(|&j| drow[sc.col_of[j as usize] as usize]),
        );
    }
    math::softcap_in_place(&mut sc.s, l.softcap);
    // S: statistical top-k, attention form (keeps all of C when |C| <= k).
    topk::attention_keep(&sc.s, l.k_keep, &mut sc.keep);
    let list = &sc.lists[a..b];
    sc.pos.extend(sc.keep.iter().map(|&c| list[c as usize]));
    sc.e.clear();
    sc.e.extend(sc.keep.iter().map(|&c| sc.s[c as usize]));
    let mx = sc.e.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let kept = sc.pos.len();
    sc.w.resize(kept, 0.0);
    // Softmax numerators over S (max-subtracted) and their sum in f64.
    math::exp_shifted_in_place(&mut sc.e, mx);
    let z: f64 = sc.e.iter().map(|&x| f64::from(x)).sum();
    let inv_z = (1.0 / z) as f32;
    // Second-part dots over the kept rows only, then softplus.
    let q2 = Queries {
        q: &sc.q[m * h + l.r..(m + 1) * h],
        stride: h,
        n: 1,
    };
    match k_rows {
        // SAFETY: kept positions are < n_kv; dims r..H lie inside the K view.
        CacheRows::Elems(rows) => unsafe {
            dot::dots(
                kernels,
                rows,
                l.r..h,
                &sc.pos,
                q2,
                Scores {
                    out: &mut sc.w,
                    ld: kept,
                },
            )
        },
        // SAFETY: as above.
        CacheRows::Blocks(rows) => unsafe {
            let out = Scores {
                out: &mut sc.w,
                ld: kept,
            };
            dot::block_dots(kernels, rows, l.r..h, &sc.pos, q2, out, &mut sc.staging)
        },
    }
    math::softplus_in_place(&mut sc.w);
    for (w, &e) in sc.w.iter_mut().zip(&sc.e) {
        *w *= e * inv_z;
    }
    // o = sum_j w_j v_j over the kept rows only, in list order.
    match v_rows {
        // SAFETY: kept positions are < n_kv; dims 0..H lie inside the V view.
        CacheRows::Elems(rows) => unsafe {
            dot::accumulate(kernels, rows, &sc.pos, &sc.w, &mut sc.o)
        },
        // SAFETY: as above.
        CacheRows::Blocks(rows) => unsafe {
            dot::block_accumulate(kernels, rows, &sc.pos, &sc.w, &mut sc.o, &mut sc.staging)
        },
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::layout::Strided;

    /// Gemma-2 2B's attention (H 256, 8 query heads on 4 KV heads, r_a 128, k_a 256) for
    /// `n_tokens` tokens in each of `n_stream` streams over `n_kv` cache positions, tensors
    /// unread (the tiling reads shapes only).
    fn layout(n_tokens: usize, n_kv: usize, n_stream: usize) -> AttnLayout {
        let none = Strided {
            data: std::ptr::null_mut(),
            ty: ElemType::F32,
            nb: [4; 4],
            ne: [1; 4],
        };
        AttnLayout {
            head_dim: 256,
            n_head: 8,
            n_head_kv: 4,
            n_tokens,
            n_kv,
            n_stream,
            q: none,
            k: none.with_ty(CacheType::Elems(ElemType::F16)),
            v: none.with_ty(CacheType::Elems(ElemType::F16)),
            mask: none,
            dst: none,
            layer: 0,
            k_keep: 256,
            r: 128,
            softcap: 50.0,
        }
    }

    /// Every unit in counter order; checks that they cover every (stream, token, head) once.
    fn units(l: &AttnLayout, ti: Tiling) -> Vec<Unit> {
        let all: Vec<Unit> = (0..n_units(l, ti)).map(|u| unit_bounds(l, ti, u)).collect();
        let mut seen = vec![0u32; l.n_stream * l.n_tokens * l.n_head];
        for u in &all {
            assert!(u.stream < l.n_stream && u.tokens.end <= l.n_tokens, "{u:?}");
            assert!(!u.tokens.is_empty() && !u.heads.is_empty(), "{u:?}");
            assert_eq!(u.heads.start / l.group_size(), u.kv_head, "{u:?}");
            for t in u.tokens.clone() {
                for n in u.heads.clone() {
                    seen[(u.stream * l.n_tokens + t) * l.n_head + n] += 1;
                }
            }
        }
        assert!(
            seen.iter().all(|&c| c == 1),
            "a query row computed {seen:?} times"
        );
        all
    }

    /// A unit's cost: the valid positions of each of its queries in a causal ubatch that
    /// follows `depth` cached positions (Gemma-2's window of 4096 or more never cuts these).
    fn cost(u: &Unit, depth: usize) -> f64 {
        let positions: usize = u.tokens.clone().map(|t| depth + t + 1).sum();
        (positions * u.heads.len()) as f64
    }

    use crate::cpu_op::list_schedule_imbalance as imbalance;

    #[test]
    fn up_to_two_threads_keep_whole_groups_of_four_tokens() {
        for n_tokens in [1, 4, 64, 512] {
            for nth in [1, 2] {
                let l = layout(n_tokens, 512 + n_tokens, 1);
                let ti = Tiling::new(&l, nth);
                assert_eq!(
                    (ti.heads_per_unit(), ti.tokens_per_unit()),
                    (2, n_tokens.min(4))
                );
                assert_eq!(n_units(&l, ti), 4 * n_tokens.div_ceil(4));
                units(&l, ti);
            }
        }
    }

    /// Issue 26 item 5: 64- and 512-token ubatches give every one of 16, 32 or 64 threads
    /// units, with at most 1.05x the mean load on the busiest thread at depths 0, 512 and 4096
    /// (the largest units first, `unit_bounds`).
    #[test]
    fn prefill_units_give_16_to_64_threads_work() {
        for n_tokens in [64, 512] {
            for depth in [0, 512, 4096] {
                let l = layout(n_tokens, depth + n_tokens, 1);
                for nth in [16, 32, 64] {
                    let ti = Tiling::new(&l, nth);
                    let all = units(&l, ti);
                    assert!(all.len() >= nth, "T {n_tokens} nth {nth}");
                    let costs: Vec<f64> = all.iter().map(|u| cost(u, depth)).collect();
                    let ratio = imbalance(&costs, nth);
                    assert!(
                        ratio <= 1.05,
                        "T {n_tokens} depth {depth} nth {nth}: {ratio}"
                    );
                }
            }
        }
    }

    /// A 64-token ubatch at depth 0 on 64 threads: 128 single-head units of 4 tokens, 2 per
    /// thread. Largest first pairs each large unit with a small one (equal loads); smallest
    /// first (the order before) gave the last threads two large ones.
    #[test]
    fn prefill_units_balance_the_causal_mask() {
        let l = layout(64, 64, 1);
        let ti = Tiling::new(&l, 64);
        let all = units(&l, ti);
        assert_eq!((all.len(), ti.heads_per_unit()), (128, 1));
        assert_eq!(all[0].tokens, 60..64);
        let costs: Vec<f64> = all.iter().map(|u| cost(u, 0)).collect();
        assert!(imbalance(&costs, 64) < 1.0 + 1e-12);
        let rising: Vec<f64> = costs.iter().rev().copied().collect();
        assert!(imbalance(&rising, 64) > 1.4);
    }

    /// A decode step of one sequence: 4 KV-group units on 1-2 threads, 8 query-head units
    /// beyond, at most: a query's positions are not split (module docs), so on 16-64 threads
    /// 8 work and the rest wait at the node's barrier.
    #[test]
    fn a_decode_step_has_at_most_one_unit_per_query_head() {
        for depth in [512, 4096] {
            let l = layout(1, depth + 1, 1);
            for (nth, want) in [(1, 4), (2, 4), (3, 8), (16, 8), (32, 8), (64, 8)] {
                let ti = Tiling::new(&l, nth);
                assert_eq!(units(&l, ti).len(), want, "nth {nth}");
            }
        }
    }

    /// A decode step of several sequences (tokens of one stream, or one token in each of
    /// several streams): blocks shrink to single tokens before threads go without a unit.
    #[test]
    fn several_sequences_give_many_threads_work() {
        for (n_tokens, n_stream, nth, want) in [
            (4, 1, 32, 32),
            (4, 1, 64, 32),
            (8, 1, 64, 64),
            (3, 1, 16, 16),
            (1, 8, 64, 64),
            (16, 1, 16, 32),
            (4, 1, 4, 8),
        ] {
            let l = layout(n_tokens, 700, n_stream);
            let ti = Tiling::new(&l, nth);
            let all = units(&l, ti);
            assert_eq!(all.len(), want, "T {n_tokens} S {n_stream} nth {nth}");
        }
    }
}
