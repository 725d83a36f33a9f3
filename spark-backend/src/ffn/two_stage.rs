//! The two-stage path of the sparse FFN (the graph's path for ubatches above the fused path's
//! limit): stage 2 (`spark_ffn_up`) writes the gated values of every neuron,
//! stage 3 (`spark_ffn_down`) adds the V rows of the active ones.
//!
//! 2. up ([`up_range`]): per token the threshold of its scores (`super::topk::Cutoff`), then for each
//!    active neuron `u_j = gelu_tanh(s_j - theta) * (K2_j . h[r_f:])`, stored neuron-major
//!    (`u[j * n_tokens + t]`, exactly 0 for inactive neurons);
//! 3. down ([`down_range`]): `out_t = sum_j u_j V_j` over the neurons active for any token.
//!
//! Stage 2 splits by neuron ranges and stage 3 by output-dimension ranges, so threads never
//! share an output element: every value is computed by one thread in a fixed order, and results
//! are bit-identical for any split. In a batch, each active row of K2 and V is read once for the
//! union of the tokens' masks and applied to every token that has it active.

use super::shared::{
    activation, check_batch_width, check_len, check_shapes, predictor_scores, prefetch_row,
    prefetch_row_range, prepare_tokens, Batch, FfnWeights, PendingAxpy, Scratch, UpInputs,
    PREFETCH_AHEAD,
};
use crate::rows::{self, RowMatrix};
use crate::KernelError;
use std::ops::Range;

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
pub(crate) fn up_prepare(inputs: &UpInputs<'_>, scratch: &mut Scratch) -> Result<(), KernelError> {
    let (f, n_tokens) = (inputs.k2.n_rows(), inputs.batch.n_tokens);
    check_len("scores", inputs.scores.len(), n_tokens * f)?;
    prepare_tokens(inputs, scratch)
}

/// Stage 2 for neurons `neurons`, after [`up_prepare`] with the same `inputs` and `scratch`:
/// as [`up_range`]. Each value depends on its neuron and token only, so any cut of `0..F` into
/// blocks gives the same `u` bit for bit.
pub(crate) fn up_block(
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
pub(crate) fn down_prepare(
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
pub(crate) fn down_cols(
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
        cutoff: w.cutoff,
    };
    let kept = up_range(&inputs, 0..f, &mut u, &mut scratch)?;
    check_len("out", out.len(), n_tokens * d)?;
    let mut rows_out: Vec<&mut [f32]> = out.chunks_mut(d).take(n_tokens).collect();
    down_range(&u, w.v, 0..d, &mut rows_out, &mut scratch)?;
    Ok(kept)
}
