//! The sparse Spark FFN (SPEC.md section 4) for a batch of tokens, in three stages:
//!
//! 1. predictor: `s = K1 h[:r_f]` over all F neurons ([`predictor_scores`]; in the ggml graph
//!    this is a stock `ggml_mul_mat`);
//! 2. up ([`up_range`]): per token the statistical top-k threshold of its scores, then for each
//!    active neuron `u_j = gelu_tanh(s_j - theta) * (K2_j . h[r_f:])`, stored neuron-major
//!    (`u[j * n_tokens + t]`, exactly 0 for inactive neurons);
//! 3. down ([`down_range`]): `out_t = sum_j u_j V_j` over the neurons active for any token.
//!
//! Stage 2 splits by neuron ranges and stage 3 by output-dimension ranges, so threads never
//! share an output element: every value is computed by one thread in a fixed order, and results
//! are bit-identical for any split. In a batch, each active row of K2 and V is read once for the
//! union of the tokens' masks and applied to every token that has it active.
//!
//! [`fused`] does stages 2 and 3 in one pass over fixed neuron chunks instead (the graph's path
//! for ubatches up to 512 tokens: one node and one walk over the active list fewer).

use crate::rows::{self, Activation, RowMatrix};
use crate::topk;
use crate::KernelError;
use std::ops::Range;

pub mod fused;

/// A batch of `n_tokens` activation rows of D (`width`) values each: row `t` is
/// `h[t * stride ..][..width]`. The input of every FFN stage.
#[derive(Clone, Copy, Debug)]
pub struct Batch<'a> {
    /// The rows, back to back at `stride`.
    pub h: &'a [f32],
    /// Elements between consecutive rows (>= `width`).
    pub stride: usize,
    /// D: values per row.
    pub width: usize,
    /// Rows in the batch.
    pub n_tokens: usize,
}

impl<'a> Batch<'a> {
    /// Columns `cols` of row `t`.
    pub fn row(&self, t: usize, cols: Range<usize>) -> Result<&'a [f32], KernelError> {
        let start = t * self.stride + cols.start;
        let end = t * self.stride + cols.end;
        if cols.end > self.width {
            return Err(KernelError::Shape(format!(
                "h columns {cols:?} beyond D = {}",
                self.width
            )));
        }
        self.h
            .get(start..end)
            .ok_or_else(|| KernelError::Shape(format!("h row {t} columns {cols:?} out of bounds")))
    }
}

/// The inputs of stage 2 ([`up_range`], and the fused path's [`fused::FusedInputs`]).
#[derive(Clone, Copy, Debug)]
pub struct UpInputs<'a> {
    /// Predictor scores, `n_tokens` rows of F (`scores[t * F + j]`).
    pub scores: &'a [f32],
    /// The normed activations; `h[r_f..D]` of each row is read (r_f = D - `k2.n_cols()`).
    pub batch: Batch<'a>,
    /// K2: F rows of D - r_f.
    pub k2: &'a RowMatrix<'a>,
    /// k_f (k >= F is dense).
    pub k: usize,
}

/// The three FFN weight matrices of one layer and its k_f, for the serial whole-FFN functions.
#[derive(Clone, Copy, Debug)]
pub struct FfnWeights<'a> {
    /// K1: F rows of r_f (the predictor).
    pub k1: &'a RowMatrix<'a>,
    /// K2: F rows of D - r_f.
    pub k2: &'a RowMatrix<'a>,
    /// V: F rows of D (neuron-major).
    pub v: &'a RowMatrix<'a>,
    /// k_f (k >= F is dense).
    pub k: usize,
}

/// `gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`, with the limits
/// `gelu_tanh(+inf) = +inf` and `gelu_tanh(-inf) = 0` (NaN stays NaN).
///
/// Computed as `x / (1 + exp(-2 y))` with `y = sqrt(2/pi) (x + 0.044715 x^3)`, the same function
/// (`(1 + tanh y) / 2 = 1 / (1 + exp(-2 y))`): one `expf` instead of libm's `tanhf`, which goes
/// through `expm1f` and cost ~0.9 % more of a decode step (docs/PERF.md), and no cancellation
/// in `1 + tanh y` for negative `y`. The CUDA kernels' `spark_gelu_tanh` uses the same formula.
#[inline]
pub fn gelu_tanh(x: f32) -> f32 {
    if x == f32::NEG_INFINITY {
        return 0.0;
    }
    const TWO_C: f32 = 2.0 * 0.797_884_6; // 2 sqrt(2/pi)
    let y2 = TWO_C * (x + 0.044_715 * x * x * x);
    x / (1.0 + (-y2).exp())
}

/// The threshold per token of a batch of scores (`scores[t * f .. (t + 1) * f]`): `None` means
/// dense (k >= F). See [`topk::threshold`].
pub fn token_thresholds(scores: &[f32], f: usize, k: usize, out: &mut Vec<Option<f32>>) {
    out.clear();
    if f == 0 {
        return;
    }
    out.extend(scores.chunks_exact(f).map(|s| topk::threshold(s, k)));
}

/// The activation value of a neuron with score `s` under threshold `theta` (None = dense), or
/// `None` when the neuron is inactive (below the threshold, NaN, or an exact-zero activation).
#[inline]
pub fn activation(s: f32, theta: Option<f32>) -> Option<f32> {
    let a = match theta {
        Some(t) => {
            if s > t {
                gelu_tanh(s - t)
            } else {
                return None;
            }
        }
        None => gelu_tanh(s),
    };
    (a != 0.0).then_some(a)
}

/// Stage 1: `scores[t * F + j] = K1_j . h_t[:r]` for every token of `batch` and every neuron.
/// For tests and the serial [`sparse_ffn`]; the ggml graph uses `ggml_mul_mat` instead.
pub fn predictor_scores(
    k1: &RowMatrix<'_>,
    batch: &Batch<'_>,
    scores: &mut [f32],
) -> Result<(), KernelError> {
    let (r, f) = (k1.n_cols(), k1.n_rows());
    check_len("scores", scores.len(), batch.n_tokens * f)?;
    let mut act = Activation::new();
    for t in 0..batch.n_tokens {
        let row = batch.row(t, 0..r)?;
        act.prepare(k1.ty(), row)?;
        for (j, s) in scores[t * f..(t + 1) * f].iter_mut().enumerate() {
            *s = rows::dot(k1.row(j), &act);
        }
    }
    Ok(())
}

/// Reusable per-thread buffers for [`up_range`] and [`down_range`].
#[derive(Debug, Default)]
pub struct Scratch {
    thetas: Vec<Option<f32>>,
    acts: Vec<Activation>,
    active: Vec<u32>,
    tokens: Vec<(u32, f32)>,
    spans: Vec<u32>,
    row: Vec<f32>,
    /// The lists of a fused unit of several tokens.
    unit: fused::UnitLists,
    /// The token count `active`/`tokens`/`spans` were listed for by [`down_prepare`].
    down_tokens: Option<usize>,
}

impl Scratch {
    /// Empty buffers.
    pub fn new() -> Self {
        Self::default()
    }

    /// For token `t` of a batch (scores `scores[t * f ..]`, threshold `thetas[t]`): its active
    /// neurons among `neurons` into `active`, in increasing order, each with `(t, activation)`
    /// at the same index of `tokens`.
    fn list_active_token(&mut self, scores: &[f32], f: usize, t: usize, neurons: Range<usize>) {
        self.down_tokens = None;
        let theta = self.thetas[t];
        let row = &scores[t * f..(t + 1) * f];
        self.active.clear();
        self.tokens.clear();
        for j in neurons {
            if let Some(a) = activation(row[j], theta) {
                self.active.push(j as u32);
                self.tokens.push((t as u32, a));
            }
        }
    }
}

/// Stage 2 for neurons `neurons` of every token: writes `u[(j - neurons.start) * n_tokens + t]`
/// and returns how many (neuron, token) pairs are active in the range
/// ([`up_prepare`], then [`up_block`]).
pub fn up_range(
    inputs: &UpInputs<'_>,
    neurons: Range<usize>,
    u: &mut [f32],
    scratch: &mut Scratch,
) -> Result<u64, KernelError> {
    up_prepare(inputs, scratch)?;
    up_block(inputs, neurons, u, scratch)
}

/// The per-call part of stage 2, shared by every neuron block a thread computes: each token's
/// threshold and `h[r_f..D]` prepared for K2's row type, into `scratch`.
pub fn up_prepare(inputs: &UpInputs<'_>, scratch: &mut Scratch) -> Result<(), KernelError> {
    let (f, n_tokens) = (inputs.k2.n_rows(), inputs.batch.n_tokens);
    check_len("scores", inputs.scores.len(), n_tokens * f)?;
    prepare_tokens(inputs, scratch)
}

/// Stage 2 for neurons `neurons`, after [`up_prepare`] with the same `inputs` and `scratch`:
/// as [`up_range`]. Each value depends on its neuron and token only, so any cut of `0..F` into
/// blocks gives the same `u` bit for bit.
pub fn up_block(
    inputs: &UpInputs<'_>,
    neurons: Range<usize>,
    u: &mut [f32],
    scratch: &mut Scratch,
) -> Result<u64, KernelError> {
    let UpInputs { scores, k2, .. } = *inputs;
    let (f, n_tokens) = (k2.n_rows(), inputs.batch.n_tokens);
    check_len("scores", scores.len(), n_tokens * f)?;
    check_len("u", u.len(), neurons.len() * n_tokens)?;
    if neurons.end > f {
        return Err(KernelError::Shape(format!(
            "neuron range {neurons:?} beyond F = {f}"
        )));
    }
    if scratch.thetas.len() != n_tokens || scratch.acts.len() < n_tokens {
        return Err(KernelError::Shape(
            "stage 2 block before its per-call preparation".into(),
        ));
    }
    let u = &mut u[..neurons.len() * n_tokens];
    u.fill(0.0);
    let mut kept = 0u64;
    if n_tokens == 1 {
        // One token: list the active neurons first so the next rows can be prefetched.
        scratch.list_active_token(scores, f, 0, neurons.clone());
        for (i, (&j, &(_, a))) in scratch.active.iter().zip(&scratch.tokens).enumerate() {
            if let Some(&next) = scratch.active.get(i + PREFETCH_AHEAD) {
                prefetch_row(k2, next as usize);
            }
            let j = j as usize;
            u[j - neurons.start] = a * rows::dot(k2.row(j), &scratch.acts[0]);
        }
        return Ok(scratch.active.len() as u64);
    }
    for j in neurons.clone() {
        let base = (j - neurons.start) * n_tokens;
        let mut row = None;
        for t in 0..n_tokens {
            if let Some(a) = activation(scores[t * f + j], scratch.thetas[t]) {
                let row = *row.get_or_insert_with(|| k2.row(j));
                u[base + t] = a * rows::dot(row, &scratch.acts[t]);
                kept += 1;
            }
        }
    }
    Ok(kept)
}

/// Per token of a batch: its threshold (`scratch.thetas`) and `h[r_f..D]` prepared for K2's
/// row type (`scratch.acts`), shared by every neuron range a thread computes.
fn prepare_tokens(inputs: &UpInputs<'_>, scratch: &mut Scratch) -> Result<(), KernelError> {
    let UpInputs { batch, k2, .. } = *inputs;
    let d = batch.width;
    let r = d.checked_sub(k2.n_cols()).ok_or_else(|| {
        KernelError::Shape(format!("K2 has {} columns, more than D = {d}", k2.n_cols()))
    })?;
    token_thresholds(inputs.scores, k2.n_rows(), inputs.k, &mut scratch.thetas);
    scratch.acts.resize_with(batch.n_tokens, Activation::new);
    for t in 0..batch.n_tokens {
        scratch.acts[t].prepare(k2.ty(), batch.row(t, r..d)?)?;
    }
    Ok(())
}

/// Stage 3 for output dimensions `dims` (block-aligned for V's type): for every token `t`,
/// `out[t] = sum_j u[j * n_tokens + t] * V_j[dims]` over neurons in increasing order, skipping
/// exact zeros. `out` holds one slice of `dims.len()` values per token ([`down_prepare`], then
/// [`down_cols`]).
pub fn down_range(
    u: &[f32],
    v: &RowMatrix<'_>,
    dims: Range<usize>,
    out: &mut [&mut [f32]],
    scratch: &mut Scratch,
) -> Result<(), KernelError> {
    down_prepare(u, v.n_rows(), out.len(), scratch)?;
    down_cols(v, dims, out, scratch)
}

/// The per-call part of stage 3, shared by every column block a thread computes: the union of
/// the batch's active neurons (`u`: F rows of `n_tokens`) with their tokens, into `scratch`.
pub fn down_prepare(
    u: &[f32],
    f: usize,
    n_tokens: usize,
    scratch: &mut Scratch,
) -> Result<(), KernelError> {
    check_len("u", u.len(), f * n_tokens)?;
    // The union of the batch's active neurons in increasing order, each with its tokens:
    // neuron active[i] applies to tokens[spans[i]..spans[i + 1]].
    scratch.active.clear();
    scratch.tokens.clear();
    scratch.spans.clear();
    scratch.spans.push(0);
    scratch.down_tokens = Some(n_tokens);
    if n_tokens == 0 {
        return Ok(());
    }
    for (j, uj) in u.chunks_exact(n_tokens).enumerate().take(f) {
        let before = scratch.tokens.len();
        scratch.tokens.extend(
            uj.iter()
                .enumerate()
                .filter(|(_, &x)| x != 0.0)
                .map(|(t, &x)| (t as u32, x)),
        );
        if scratch.tokens.len() > before {
            scratch.active.push(j as u32);
            scratch.spans.push(scratch.tokens.len() as u32);
        }
    }
    Ok(())
}

/// Stage 3 for output dimensions `dims`, after [`down_prepare`] with the same `u` and
/// `scratch`: as [`down_range`]. Every element is summed over the neurons in increasing order
/// whatever the column block, so any cut of `0..D` gives the same output bit for bit.
pub fn down_cols(
    v: &RowMatrix<'_>,
    dims: Range<usize>,
    out: &mut [&mut [f32]],
    scratch: &mut Scratch,
) -> Result<(), KernelError> {
    let n_tokens = out.len();
    let w = dims.len();
    let be = v.ty().block_elems();
    if !dims.start.is_multiple_of(be) || !dims.end.is_multiple_of(be) || dims.end > v.n_cols() {
        return Err(KernelError::Shape(format!(
            "output range {dims:?} not {}-aligned within D = {}",
            v.ty().name(),
            v.n_cols()
        )));
    }
    if scratch.down_tokens != Some(n_tokens)
        || scratch
            .active
            .last()
            .is_some_and(|&j| j as usize >= v.n_rows())
    {
        return Err(KernelError::Shape(
            "stage 3 columns before their per-call preparation".into(),
        ));
    }
    for o in out.iter_mut() {
        check_len("output row", o.len(), w)?;
        o[..w].fill(0.0);
    }
    if w == 0 {
        return Ok(());
    }
    // Sub-tiles of the output columns keep a batch's output rows cache-resident; every element
    // is still summed by this thread alone in neuron order, so tiling never changes a result.
    let tile = if n_tokens <= 1 {
        w
    } else {
        let cols = (OUT_TILE_BYTES / (4 * n_tokens)).max(1);
        let unit = be.max(16);
        (cols / unit).max(1) * unit
    };
    let mut start = 0;
    while start < w {
        let end = (start + tile).min(w);
        down_tile(v, dims.start + start..dims.start + end, start, out, scratch);
        start = end;
    }
    Ok(())
}

/// V rows waiting to be added to one output row, four per pass over the output.
///
/// Two arithmetics: [`PendingAxpy::exact`] (the two-stage path, [`rows::axpy4`]: the same
/// result bit for bit as one [`rows::axpy`] per row, which that path's rows shared by several
/// tokens rely on) and [`PendingAxpy::folded`] (the fused path, [`rows::axpy_folded`]: q8_0
/// block scales folded into the coefficients, and the first pass writes the output from zero,
/// so the caller need not zero-fill it).
struct PendingAxpy<'a> {
    rows: [Option<(rows::Row<'a>, f32)>; 4],
    len: usize,
    /// `None` for the exact arithmetic; for the folded one, where its next pass starts.
    folded: Option<rows::Start>,
}

impl<'a> PendingAxpy<'a> {
    /// `y += sum alpha * row` in [`rows::axpy`]'s arithmetic.
    fn exact() -> Self {
        Self {
            rows: [None; 4],
            len: 0,
            folded: None,
        }
    }

    /// `y = sum alpha * row` (y's old values unread) in [`rows::axpy_folded`]'s arithmetic.
    fn folded() -> Self {
        Self {
            folded: Some(rows::Start::Zero),
            ..Self::exact()
        }
    }

    /// Queues `alpha * row` for `y`, running the queue when it holds four rows.
    #[inline]
    fn push(&mut self, row: rows::Row<'a>, alpha: f32, y: &mut [f32]) {
        self.rows[self.len] = Some((row, alpha));
        self.len += 1;
        if self.len == 4 {
            self.flush(y);
        }
    }

    /// Runs what is in the queue, in order (for a folded queue that never ran: writes the
    /// zeros, or the rows' sum, over `y`).
    fn flush(&mut self, y: &mut [f32]) {
        let n = std::mem::take(&mut self.len);
        let Some((first, _)) = self.rows[0].filter(|_| n > 0) else {
            if self.folded == Some(rows::Start::Zero) {
                y.fill(0.0);
                self.folded = Some(rows::Start::Accumulate);
            }
            return;
        };
        let rows = self.rows.map(|e| e.map_or(first, |(row, _)| row));
        let alphas = self.rows.map(|e| e.map_or(0.0, |(_, alpha)| alpha));
        match self.folded {
            Some(start) => {
                rows::axpy_folded(&rows[..n], &alphas[..n], y, start);
                self.folded = Some(rows::Start::Accumulate);
            }
            None if n == 4 => rows::axpy4(rows, alphas, y),
            None => {
                for (row, alpha) in rows.into_iter().zip(alphas).take(n) {
                    rows::axpy(row, alpha, y);
                }
            }
        }
    }
}

/// Columns `cols` of V's row for the `i`-th active neuron, prefetching the row
/// [`PREFETCH_AHEAD`] places later in `active`.
#[inline]
fn active_cols<'a>(
    v: &RowMatrix<'a>,
    active: &[u32],
    i: usize,
    cols: &Range<usize>,
) -> rows::Row<'a> {
    if let Some(&next) = active.get(i + PREFETCH_AHEAD) {
        prefetch_row_range(v, next as usize, cols.clone());
    }
    v.row(active[i] as usize).slice(cols.start, cols.end)
}

/// Output bytes (tokens x columns) a sub-tile of [`down_range`] aims at.
const OUT_TILE_BYTES: usize = 128 << 10;

/// One sub-tile of [`down_range`]: columns `cols` of V into `out[t][offset..]`.
fn down_tile(
    v: &RowMatrix<'_>,
    cols: Range<usize>,
    offset: usize,
    out: &mut [&mut [f32]],
    scratch: &mut Scratch,
) {
    let w = cols.len();
    scratch.row.resize(w, 0.0);
    if out.len() == 1 {
        // One token: every neuron applies to it; four V rows per pass over the output.
        let y = &mut out[0][offset..offset + w];
        let mut pending = PendingAxpy::exact();
        for i in 0..scratch.active.len() {
            pending.push(
                active_cols(v, &scratch.active, i, &cols),
                scratch.tokens[i].1,
                y,
            );
        }
        pending.flush(y);
        return;
    }
    for i in 0..scratch.active.len() {
        let row = active_cols(v, &scratch.active, i, &cols);
        let tokens = &scratch.tokens[scratch.spans[i] as usize..scratch.spans[i + 1] as usize];
        if let [(t, alpha)] = *tokens {
            rows::axpy(row, alpha, &mut out[t as usize][offset..offset + w]);
        } else {
            // Several tokens share this neuron: convert the row once, then one axpy per token.
            rows::to_f32(row, &mut scratch.row);
            for &(t, alpha) in tokens {
                rows::axpy_f32(
                    &scratch.row,
                    alpha,
                    &mut out[t as usize][offset..offset + w],
                );
            }
        }
    }
}

/// The whole FFN serially: `out[t * D ..]` for every row of `batch` (D = `w.v.n_cols()`).
/// Returns the number of active (neuron, token) pairs.
pub fn sparse_ffn(
    batch: &Batch<'_>,
    w: &FfnWeights<'_>,
    out: &mut [f32],
) -> Result<u64, KernelError> {
    let (d, f, n_tokens) = (w.v.n_cols(), w.v.n_rows(), batch.n_tokens);
    check_shapes(d, f, w.k1, w.k2)?;
    check_batch_width(batch, d)?;
    let mut scores = vec![0f32; n_tokens * f];
    predictor_scores(w.k1, batch, &mut scores)?;
    let mut u = vec![0f32; n_tokens * f];
    let mut scratch = Scratch::new();
    let inputs = UpInputs {
        scores: &scores,
        batch: *batch,
        k2: w.k2,
        k: w.k,
    };
    let kept = up_range(&inputs, 0..f, &mut u, &mut scratch)?;
    check_len("out", out.len(), n_tokens * d)?;
    let mut rows_out: Vec<&mut [f32]> = out.chunks_mut(d).take(n_tokens).collect();
    down_range(&u, w.v, 0..d, &mut rows_out, &mut scratch)?;
    Ok(kept)
}

/// Checks that K1 [F x r], K2 [F x (D - r)] and V [F x D] agree, with 0 < r < D.
pub fn check_shapes(
    d: usize,
    f: usize,
    k1: &RowMatrix<'_>,
    k2: &RowMatrix<'_>,
) -> Result<(), KernelError> {
    if k1.n_rows() != f || k2.n_rows() != f {
        return Err(KernelError::Shape(format!(
            "F differs: K1 has {} rows, K2 {}, V {f}",
            k1.n_rows(),
            k2.n_rows()
        )));
    }
    let r = k1.n_cols();
    if r == 0 || r >= d || k2.n_cols() != d - r {
        return Err(KernelError::Shape(format!(
            "K1 width {r} + K2 width {} != D = {d} (0 < r_f < D)",
            k2.n_cols()
        )));
    }
    Ok(())
}

/// A contiguous share of `0..n` for part `i` of `parts`, with boundaries on multiples of
/// `align` (the last part takes the rest). Parts may be empty.
pub fn split_range(n: usize, parts: usize, i: usize, align: usize) -> Range<usize> {
    let align = align.max(1);
    let units = n.div_ceil(align);
    let parts = parts.max(1);
    let lo = (units * i / parts * align).min(n);
    let hi = if i + 1 >= parts {
        n
    } else {
        (units * (i + 1) / parts * align).min(n)
    };
    lo..hi.max(lo)
}

fn check_len(what: &str, have: usize, want: usize) -> Result<(), KernelError> {
    if have < want {
        return Err(KernelError::Shape(format!(
            "{what}: {have} values, need {want}"
        )));
    }
    Ok(())
}

/// Checks that `batch`'s rows are D wide (the serial whole-FFN functions take D from V).
fn check_batch_width(batch: &Batch<'_>, d: usize) -> Result<(), KernelError> {
    if batch.width != d {
        return Err(KernelError::Shape(format!(
            "h rows have {} values, V has D = {d}",
            batch.width
        )));
    }
    Ok(())
}

/// Rows ahead to prefetch in the sparse loops (8 rows of up to 4 KiB measured best on an idle
/// machine: docs/PERF.md).
const PREFETCH_AHEAD: usize = 8;
/// Bytes prefetched from the start of each upcoming row: whole rows up to this size (q8_0 and
/// f16 rows at Gemma-2 2B shapes are 1.4-4.6 KB). Prefetching only the first 256 bytes and 2
/// rows ahead ran the row gathers at about half the speed.
const PREFETCH_BYTES: usize = 4096;

/// Prefetches the start of row `j` of `m`.
#[inline]
fn prefetch_row(m: &RowMatrix<'_>, j: usize) {
    let bytes = m.n_cols() / m.ty().block_elems() * m.ty().block_bytes();
    prefetch(m.row_ptr(j), bytes);
}

/// Prefetches the start of elements `dims` of row `j` of `m` (`dims` block-aligned).
#[inline]
fn prefetch_row_range(m: &RowMatrix<'_>, j: usize, dims: Range<usize>) {
    let (be, bb) = (m.ty().block_elems(), m.ty().block_bytes());
    let offset = dims.start / be * bb;
    prefetch(m.row_ptr(j).wrapping_add(offset), dims.len() / be * bb);
}

/// Prefetch hints for every cache line of `bytes` bytes from `p`.
#[inline]
fn prefetch(p: *const u8, bytes: usize) {
    let bytes = bytes.min(PREFETCH_BYTES);
    #[cfg(target_arch = "x86_64")]
    for off in (0..bytes).step_by(64) {
        // SAFETY: prefetch is a hint that never faults, whatever the address.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                p.wrapping_add(off).cast(),
            )
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, bytes);
}
