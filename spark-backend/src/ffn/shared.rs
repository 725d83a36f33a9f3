//! What both FFN paths share: their inputs ([`Batch`], [`UpInputs`], [`FfnWeights`]), the
//! activation and thresholds ([`gelu_tanh`], [`token_thresholds`], [`activation`]), the
//! predictor ([`predictor_scores`]), the per-thread buffers ([`Scratch`]), the batched V
//! accumulation ([`PendingAxpy`]), shape checks and prefetching. `fused.rs` and `two_stage.rs`
//! import it; it imports neither.

use crate::rows::{self, Activation, RowMatrix};
use crate::topk::{self, Cutoff};
use crate::KernelError;
use std::ops::Range;

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
    pub(crate) fn row(&self, t: usize, cols: Range<usize>) -> Result<&'a [f32], KernelError> {
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

/// The inputs of stage 2 ([`super::two_stage::up_range`], and the fused path's
/// [`super::fused::FusedInputs`]).
#[derive(Clone, Copy, Debug)]
pub struct UpInputs<'a> {
    /// Predictor scores, `n_tokens` rows of F (`scores[t * F + j]`).
    pub scores: &'a [f32],
    /// The normed activations; `h[r_f..D]` of each row is read (r_f = D - `k2.n_cols()`,
    /// `0 <= r_f < D`).
    pub batch: Batch<'a>,
    /// K2: F rows of D - r_f.
    pub k2: &'a RowMatrix<'a>,
    /// How each token's threshold is set (`TopK(k)` with k >= F is dense).
    pub cutoff: Cutoff,
}

/// The three FFN weight matrices of one layer and its cutoff, for the serial whole-FFN
/// functions.
#[derive(Clone, Copy, Debug)]
pub struct FfnWeights<'a> {
    /// K1: F rows of r_f (the predictor).
    pub k1: &'a RowMatrix<'a>,
    /// K2: F rows of D - r_f.
    pub k2: &'a RowMatrix<'a>,
    /// V: F rows of D (neuron-major).
    pub v: &'a RowMatrix<'a>,
    /// How each token's threshold is set (`TopK(k)` with k >= F is dense).
    pub cutoff: Cutoff,
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
/// dense (`TopK(k)`, k >= F). See [`topk::threshold_for`].
pub fn token_thresholds(scores: &[f32], f: usize, cutoff: Cutoff, out: &mut Vec<Option<f32>>) {
    out.clear();
    if f == 0 {
        return;
    }
    out.extend(
        scores
            .chunks_exact(f)
            .map(|s| topk::threshold_for(s, cutoff)),
    );
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
/// For tests and the serial whole-FFN functions; the ggml graph uses `ggml_mul_mat` instead.
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

/// Reusable per-thread buffers of the FFN kernels (both paths).
#[derive(Debug, Default)]
pub struct Scratch {
    pub(super) thetas: Vec<Option<f32>>,
    pub(super) acts: Vec<Activation>,
    pub(super) active: Vec<u32>,
    pub(super) tokens: Vec<(u32, f32)>,
    pub(super) spans: Vec<u32>,
    pub(super) row: Vec<f32>,
    /// The lists of a fused unit of several tokens.
    pub(super) unit: UnitLists,
    /// The token count `active`/`tokens`/`spans` were listed for by [`super::two_stage::down_prepare`].
    pub(super) down_tokens: Option<usize>,
}

impl Scratch {
    /// Empty buffers.
    pub fn new() -> Self {
        Self::default()
    }

    /// For token `t` of a batch (scores `scores[t * f ..]`, threshold `thetas[t]`): its active
    /// neurons among `neurons` into `active`, in increasing order, each with `(t, activation)`
    /// at the same index of `tokens`.
    pub(super) fn list_active_token(
        &mut self,
        scores: &[f32],
        f: usize,
        t: usize,
        neurons: Range<usize>,
    ) {
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

/// The buffers of `fused::tokens_chunk`, kept in [`Scratch`] from call to call.
#[derive(Debug, Default)]
pub(super) struct UnitLists {
    /// Per token of the unit, its active `(neuron, activation)` in increasing neuron order; the
    /// K2 pass replaces each activation by its `u`. Only grows: the first `n_tokens` are used.
    pub(super) by_token: Vec<Vec<(u32, f32)>>,
    /// Per neuron of the chunk, its number of entries; then where its next entry goes.
    pub(super) offsets: Vec<u32>,
    /// The neurons with entries, in order, each with the end of its entries in `pairs`.
    pub(super) neurons: Vec<(u32, u32)>,
    /// `(token, index in the token's list)`, grouped by neuron.
    pub(super) pairs: Vec<(u32, u32)>,
    /// Per token of the call: are its threshold and activations prepared (`fused::prepare`)?
    pub(super) prepared: Vec<bool>,
}

/// Per token of a batch: its threshold (`scratch.thetas`) and `h[r_f..D]` prepared for K2's
/// row type (`scratch.acts`), shared by every neuron range a thread computes.
pub(super) fn prepare_tokens(
    inputs: &UpInputs<'_>,
    scratch: &mut Scratch,
) -> Result<(), KernelError> {
    let UpInputs { batch, k2, .. } = *inputs;
    let d = batch.width;
    let r = d.checked_sub(k2.n_cols()).ok_or_else(|| {
        KernelError::Shape(format!("K2 has {} columns, more than D = {d}", k2.n_cols()))
    })?;
    token_thresholds(
        inputs.scores,
        k2.n_rows(),
        inputs.cutoff,
        &mut scratch.thetas,
    );
    scratch.acts.resize_with(batch.n_tokens, Activation::new);
    for t in 0..batch.n_tokens {
        scratch.acts[t].prepare(k2.ty(), batch.row(t, r..d)?)?;
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
pub(super) struct PendingAxpy<'a> {
    pub(super) rows: [Option<(rows::Row<'a>, f32)>; 4],
    pub(super) len: usize,
    /// `None` for the exact arithmetic; for the folded one, where its next pass starts.
    pub(super) folded: Option<rows::Start>,
}

impl<'a> PendingAxpy<'a> {
    /// `y += sum alpha * row` in [`rows::axpy`]'s arithmetic.
    pub(super) fn exact() -> Self {
        Self {
            rows: [None; 4],
            len: 0,
            folded: None,
        }
    }

    /// `y = sum alpha * row` (y's old values unread) in [`rows::axpy_folded`]'s arithmetic.
    pub(super) fn folded() -> Self {
        Self {
            folded: Some(rows::Start::Zero),
            ..Self::exact()
        }
    }

    /// Queues `alpha * row` for `y`, running the queue when it holds four rows.
    #[inline]
    pub(super) fn push(&mut self, row: rows::Row<'a>, alpha: f32, y: &mut [f32]) {
        self.rows[self.len] = Some((row, alpha));
        self.len += 1;
        if self.len == 4 {
            self.flush(y);
        }
    }

    /// Runs what is in the queue, in order (for a folded queue that never ran: writes the
    /// zeros, or the rows' sum, over `y`).
    pub(super) fn flush(&mut self, y: &mut [f32]) {
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

/// Checks that K1 [F x r], K2 [F x (D - r)] and V [F x D] agree, with 0 < r < D (the serial
/// whole-FFN functions compute the predictor from K1; the ops take any `0 <= r_f < D`).
pub(crate) fn check_shapes(
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

pub(super) fn check_len(what: &str, have: usize, want: usize) -> Result<(), KernelError> {
    if have < want {
        return Err(KernelError::Shape(format!(
            "{what}: {have} values, need {want}"
        )));
    }
    Ok(())
}

/// Checks that `batch`'s rows are D wide (the serial whole-FFN functions take D from V).
pub(super) fn check_batch_width(batch: &Batch<'_>, d: usize) -> Result<(), KernelError> {
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
pub(super) const PREFETCH_AHEAD: usize = 8;
/// Bytes prefetched from the start of each upcoming row: whole rows up to this size (q8_0 and
/// f16 rows at Gemma-2 2B shapes are 1.4-4.6 KB). Prefetching only the first 256 bytes and 2
/// rows ahead ran the row gathers at about half the speed.
pub(super) const PREFETCH_BYTES: usize = 4096;

/// Prefetches the start of row `j` of `m`.
#[inline]
pub(super) fn prefetch_row(m: &RowMatrix<'_>, j: usize) {
    let bytes = m.n_cols() / m.ty().block_elems() * m.ty().block_bytes();
    prefetch(m.row_ptr(j), bytes);
}

/// Prefetches the start of elements `dims` of row `j` of `m` (`dims` block-aligned).
#[inline]
pub(super) fn prefetch_row_range(m: &RowMatrix<'_>, j: usize, dims: Range<usize>) {
    let (be, bb) = (m.ty().block_elems(), m.ty().block_bytes());
    let offset = dims.start / be * bb;
    prefetch(m.row_ptr(j).wrapping_add(offset), dims.len() / be * bb);
}

/// Prefetch hints for every cache line of the first `bytes` (at most [`PREFETCH_BYTES`]) from
/// `p`.
#[inline]
pub(super) fn prefetch(p: *const u8, bytes: usize) {
    crate::arch::prefetch(p, bytes.min(PREFETCH_BYTES));
}
