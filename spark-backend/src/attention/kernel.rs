//! The sparse attention computation of SPEC 4 over work units of (stream, token block, KV head,
//! query heads of the group).
//!
//! Per unit, the queries of its heads of one KV group for a few tokens are scored together
//! against the first `r` dims of each needed key row (one read of K1 serves all of them); then
//! each query alone selects its positions with the statistical top-k, and only the kept
//! positions get the second-part dot product and the value accumulation. A unit covers every
//! head of its group, unless that leaves fewer than [`UNITS_PER_THREAD`] units per thread of
//! the call (a decode step on more than two threads, where each KV head would be one unit), in
//! which case each query head is a unit of its own ([`Tiling`]).
//!
//! Work units are a fixed partition of the (token, head) pairs that depends only on the shapes
//! and the call's thread count; the `spark_attn` op hands them out from a shared counter
//! ([`run_units`]), [`run`] takes units `ith, ith + nth, ...`. Each output row is computed by one
//! thread with arithmetic that does not depend on the unit's other rows (the dot products give
//! the same bits whatever queries they are blocked with), so the output is bit-identical for
//! every tiling, thread count and schedule (and for any batch composition).

use super::dot::{self, Queries, Rows, Scores};
use super::layout::{AttnLayout, ElemType, Strided};
use super::math;
use crate::isa::Isa;
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
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Tokens per work unit: about eight queries share each key row read.
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
    /// The tiling of `l` for a call on `nth` threads.
    pub(crate) fn new(l: &AttnLayout, nth: usize) -> Self {
        let gs = l.group_size();
        let tokens = tokens_per_unit(gs, l.n_tokens);
        let token_blocks = l.n_tokens.div_ceil(tokens);
        let group_units = l.n_stream * token_blocks * l.n_head_kv;
        let heads = if group_units < UNITS_PER_THREAD * nth.max(1) {
            1
        } else {
            gs
        };
        Self {
            tokens,
            heads,
            token_blocks,
        }
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

/// Unit `u` of `l` under tiling `ti` (`u < n_units(l, ti)`).
fn unit_bounds(l: &AttnLayout, ti: Tiling, u: usize) -> Unit {
    let (tb, heads, n_tb) = (ti.tokens, ti.heads, ti.token_blocks);
    let gs = l.group_size();
    let parts = gs / heads;
    let (part, rest) = (u % parts, u / parts);
    let g = rest % l.n_head_kv;
    let t0 = (rest / l.n_head_kv) % n_tb.max(1) * tb;
    let h0 = g * gs + part * heads;
    Unit {
        stream: rest / (l.n_head_kv * n_tb.max(1)),
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
    let isa = crate::isa::current();
    let n = n_units(l, ti);
    let mut tally = Tally::default();
    let mut work = |sc: &mut Scratch| {
        for u in (&mut *units).filter(|&u| u < n) {
            // SAFETY: forwarded from this function's contract.
            unsafe { unit(l, isa, unit_bounds(l, ti, u), sc, &mut observer, &mut tally) };
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

/// Rows of cache `c` for KV head `g` in stream `s`: row j = position j.
fn cache_rows(c: &Strided, g: usize, s: usize) -> Rows {
    Rows {
        base: c.data.wrapping_add(g * c.nb[1] + s * c.nb[3]),
        ty: c.ty,
        elem_stride: c.nb[0],
        row_stride: c.nb[2],
    }
}

/// Computes the output rows of work unit `u`.
///
/// # Safety
/// As for [`run`].
unsafe fn unit(
    l: &AttnLayout,
    isa: Isa,
    u: Unit,
    sc: &mut Scratch,
    observer: &mut Option<&mut dyn FnMut(&RowSelection)>,
    tally: &mut Tally,
) {
    let (s, g, t0, t1) = (u.stream, u.kv_head, u.tokens.start, u.tokens.end);
    let h = l.head_dim;
    let (h0, hp) = (u.heads.start, u.heads.len());
    let n_q = (t1 - t0) * hp;
    let query = |m: usize| (t0 + m / hp, h0 + m % hp);

    // Queries, copied contiguous.
    sc.q.resize(n_q * h, 0.0);
    for m in 0..n_q {
        let (t, n) = query(m);
        let base = l.q.data.wrapping_add(l.q.offset([0, n, t, s]));
        for (i, x) in sc.q[m * h..(m + 1) * h].iter_mut().enumerate() {
            // SAFETY: q is readable over its shape (contract); element (i, n, t, s) is in it.
            *x = unsafe {
                base.wrapping_add(i * l.q.nb[0])
                    .cast::<f32>()
                    .read_unaligned()
            };
        }
    }

    // Valid positions per query (C of SPEC 4), one scan per distinct mask row.
    sc.lists.clear();
    sc.spans.clear();
    sc.mask_rows.clear();
    for m in 0..n_q {
        let (t, n) = query(m);
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

    // Union of the lists: the key rows to score.
    sc.union.clear();
    if sc.mask_rows.len() == 1 {
        let (a, b) = sc.mask_rows[0].1;
        sc.union.extend_from_slice(&sc.lists[a..b]);
    } else {
        sc.needed.clear();
        sc.needed.resize(l.n_kv, false);
        for &j in &sc.lists {
            sc.needed[j as usize] = true;
        }
        sc.union
            .extend((0..l.n_kv as u32).filter(|&j| sc.needed[j as usize]));
    }
    let width = sc.union.len();
    // With one distinct mask row every list is the union itself: columns are list indices.
    let shared_list = sc.mask_rows.len() == 1;
    if !shared_list {
        if sc.col_of.len() < l.n_kv {
            sc.col_of.resize(l.n_kv, 0);
        }
        for (c, &j) in sc.union.iter().enumerate() {
            sc.col_of[j as usize] = c as u32;
        }
    }

    // First-part scores of every query against every needed row.
    let k_rows = cache_rows(&l.k, g, s);
    let v_rows = cache_rows(&l.v, g, s);
    sc.d.resize(n_q * width, 0.0);
    // SAFETY: union positions are < n_kv, dims 0..r < H lie inside the K view; q and d sized above.
    unsafe {
        dot::dots(
            isa,
            k_rows,
            0..l.r,
            &sc.union,
            Queries {
                q: &sc.q,
                stride: h,
                n: n_q,
            },
            Scores {
                out: &mut sc.d,
                ld: width,
            },
        )
    };

    sc.o.resize(h, 0.0);
    for m in 0..n_q {
        let (t, n) = query(m);
        let (a, b) = sc.spans[m];
        let n_valid = b - a;
        sc.pos.clear();
        sc.o.fill(0.0);
        if n_valid > 0 {
            // Capped scores over C.
            sc.s.clear();
            let drow = &sc.d[m * width..(m + 1) * width];
            if shared_list {
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
            // SAFETY: kept positions are < n_kv; dims r..H lie inside the K view.
            unsafe {
                dot::dots(
                    isa,
                    k_rows,
                    l.r..h,
                    &sc.pos,
                    Queries {
                        q: &sc.q[m * h + l.r..(m + 1) * h],
                        stride: h,
                        n: 1,
                    },
                    Scores {
                        out: &mut sc.w,
                        ld: kept,
                    },
                )
            };
            math::softplus_in_place(&mut sc.w);
            for (w, &e) in sc.w.iter_mut().zip(&sc.e) {
                *w *= e * inv_z;
            }
            // o = sum_j w_j v_j over the kept rows only.
            // SAFETY: kept positions are < n_kv; dims 0..H lie inside the V view.
            unsafe { dot::accumulate(isa, v_rows, &sc.pos, &sc.w, &mut sc.o) };
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
