//! Stages 2 and 3 of the sparse FFN fused over fixed neuron chunks: the graph's path for
//! ubatches of up to `super::tiling::FUSED_MAX_TOKENS` tokens (every decode step and
//! llama.cpp's default prefill ubatch). It saves the two-stage path's second walk over the active neurons and one graph node
//! (docs/PERF.md: 3-11 % at batch 1, 1.3-1.6x at batches 4-16, 1.3x at a 512-token prefill).
//!
//! The graph cuts F neurons into P contiguous chunks (P from the output's shape; the graph
//! takes it from `super::tiling`). For each chunk, [`chunk_partials`]
//! walks the chunk's active neurons once: the K2 row dot, the gate, and the V row accumulated
//! straight into the chunk's own partial output (`n_tokens x D`). [`sum_partials`] then adds
//! the partials in chunk order. The chunking does not depend on the thread count, and each
//! element of a partial is computed by one thread in neuron order, so results are bit-identical
//! for any split of the work units over threads and for any cut into units
//! ([`super::tiling::FusedUnits`]: chunk x group of up to [`super::tiling::UNIT_TOKENS`] tokens, cut finer
//! when the threads outnumber those; on more threads than chunks a one-token unit may be part
//! of its row's columns, whose K2 dots it repeats). Within a unit of several tokens the K2
//! dots run neuron by neuron (each row read
//! once for all the unit's tokens that use it) and the V rows are added token by token, four
//! per pass over the token's output row (a quarter of the output traffic of one update per
//! (neuron, token), docs/PERF.md); each token's `u` values and the order its V rows are added
//! in are those it gets alone, so its output is exactly what it gets alone.
//!
//! V rows are added in [`rows::axpy_folded`]'s arithmetic (a q8_0 row's block scales folded into
//! its coefficient: ~15 % fewer instructions per weight than [`rows::axpy`], docs/PERF.md), and
//! each token's partial row is written from zero by its first pass (no zero-fill). The
//! summation order and that arithmetic differ from [`super::two_stage::down_range`]'s (one pass
//! over all neurons, [`rows::axpy`]), so the fused and two-stage paths agree to rounding, not
//! bit for bit.

use super::shared::{
    activation, check_batch_width, check_len, prefetch_row, prefetch_row_range, Batch, FfnWeights,
    PendingAxpy, Scratch, UpInputs, PREFETCH_AHEAD,
};
use super::tiling::FusedUnit;
use crate::rows::paging::Paging;
use crate::rows::{self, Activation, RowMatrix};
use crate::topk;
use crate::KernelError;
use std::ops::Range;

/// The neurons of chunk `c` of `p` (contiguous, in order, sizes differing by at most one;
/// empty when `c >= p`).
pub fn chunk_neurons(f: usize, p: usize, c: usize) -> Range<usize> {
    let p = p.max(1);
    let (lo, hi) = (c.min(p) * f / p, (c + 1).min(p) * f / p);
    lo..hi
}

/// The inputs every chunk of one FFN call shares: those of stage 2 and V.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FusedInputs<'a> {
    /// Scores, activations, K2 and the cutoff.
    pub(crate) up: UpInputs<'a>,
    /// V: F rows of D (neuron-major).
    pub(crate) v: &'a RowMatrix<'a>,
}

impl FusedInputs<'_> {
    fn check(&self) -> Result<(usize, usize), KernelError> {
        let (d, f) = (self.v.n_cols(), self.v.n_rows());
        let k2 = self.up.k2;
        if k2.n_rows() != f || k2.n_cols() == 0 || k2.n_cols() > d {
            return Err(KernelError::Shape(format!(
                "K2 [{} x {}] does not fit V [{f} x {d}] (0 < D - r_f <= D)",
                k2.n_rows(),
                k2.n_cols()
            )));
        }
        check_batch_width(&self.up.batch, d)?;
        check_len("scores", self.up.scores.len(), self.up.batch.n_tokens * f)?;
        Ok((d, f))
    }
}

/// Computes the partial outputs of the chunks (of `n_chunks`) that `chunks` yields, each
/// given with its output slice of `n_tokens * D` values (token `t` at `[t * D ..][..D]`):
/// `partial_t = sum_j u_tj V_j` over the chunk's neurons `j` in increasing order with
/// `u_tj = gelu_tanh(s_tj - theta_t) (K2_j . h_t[r_f:]) != 0`. Returns the number of active
/// (neuron, token) pairs over those chunks.
pub(crate) fn chunk_partials<'p>(
    inputs: &FusedInputs<'_>,
    n_chunks: usize,
    chunks: impl IntoIterator<Item = (usize, &'p mut [f32])>,
    scratch: &mut Scratch,
) -> Result<u64, KernelError> {
    prepare(inputs, n_chunks, scratch)?;
    let n_tokens = inputs.up.batch.n_tokens;
    let mut kept = 0;
    for (c, partial) in chunks {
        kept += unit_partial(inputs, n_chunks, c, 0..n_tokens, partial, scratch)?;
    }
    Ok(kept)
}

/// The per-call part every unit of a thread shares: the checks, and the per-token state in
/// `scratch` reset. Each token's threshold and prepared activations are computed by the first
/// unit of the thread that needs them ([`unit()`]), so a thread that takes a few units of a
/// large ubatch (many threads) prepares only their tokens, not all of them.
pub(crate) fn prepare(
    inputs: &FusedInputs<'_>,
    n_chunks: usize,
    scratch: &mut Scratch,
) -> Result<(), KernelError> {
    let (d, f) = inputs.check()?;
    if n_chunks == 0 || n_chunks > f.max(1) {
        return Err(KernelError::Shape(format!(
            "{n_chunks} chunks of F = {f} neurons (1 <= P <= F)"
        )));
    }
    let batch = &inputs.up.batch;
    if let Some(last) = batch.n_tokens.checked_sub(1) {
        // Rows are at increasing offsets: the last one in bounds means all are.
        batch.row(last, 0..d)?;
    }
    let n = batch.n_tokens;
    scratch.thetas.clear();
    scratch.thetas.resize(n, None);
    scratch.acts.resize_with(n, Activation::new);
    scratch.unit.prepared.clear();
    scratch.unit.prepared.resize(n, false);
    Ok(())
}

/// From this many tokens a call reads most rows (1 - 0.92^8 ~ 49 % at 8 % density): their whole
/// range is requested rather than row by row.
const REQUEST_WHOLE_FROM: usize = 8;

/// When K2's or V's rows stream from storage ([`rows::paging`]), requests now the pages of the
/// rows this call will read among neurons part `part` of `parts` (each thread of the call asks
/// for its share), so that the reads are in flight before the kernels fault on them; the whole
/// share for a call of [`REQUEST_WHOLE_FROM`] tokens or more. Does nothing for rows in memory
/// (the usual case: one table lookup per matrix). `layer` names the layer in the one line
/// printed when rows first stream.
pub(crate) fn request_from_storage(
    inputs: &FusedInputs<'_>,
    layer: i32,
    part: usize,
    parts: usize,
) {
    let (k2, v) = (inputs.up.k2, inputs.v);
    let paging = Paging::global();
    let streaming: Vec<&RowMatrix<'_>> = [k2, v]
        .into_iter()
        .filter(|m| paging.streaming(m, Some(layer)))
        .collect();
    if streaming.is_empty() {
        return;
    }
    let (f, n_tokens) = (v.n_rows(), inputs.up.batch.n_tokens);
    // a neuron's K2 and V rows are one range (a paired file)
    let paired = streaming.len() == 2 && Paging::side_by_side(k2, v);
    if n_tokens >= REQUEST_WHOLE_FROM {
        if paired {
            Paging::request_share_side_by_side(k2, v, part, parts);
            return;
        }
        for m in streaming {
            Paging::request_share(m, part, parts);
        }
        return;
    }
    let scores = inputs.up.scores;
    if scores.len() < n_tokens * f {
        return;
    }
    let thetas: Vec<Option<f32>> = (0..n_tokens)
        .map(|t| topk::threshold_for(&scores[t * f..(t + 1) * f], inputs.up.cutoff))
        .collect();
    let active: Vec<usize> = chunk_neurons(f, parts, part)
        .filter(|&j| {
            thetas
                .iter()
                .enumerate()
                .any(|(t, &theta)| activation(scores[t * f + j], theta).is_some())
        })
        .collect();
    if paired {
        // one read per neuron
        Paging::request_rows_side_by_side(k2, v, active.iter().copied());
        return;
    }
    for m in streaming {
        Paging::request_rows(m, active.iter().copied());
    }
}

/// Token `t`'s threshold and `h[r_f..D]` prepared for K2's row type, unless this thread has
/// them for this call already (the values `super::prepare_tokens` computes for every token).
fn prepare_token(
    inputs: &FusedInputs<'_>,
    t: usize,
    scratch: &mut Scratch,
) -> Result<(), KernelError> {
    if scratch.unit.prepared[t] {
        return Ok(());
    }
    let (k2, batch) = (inputs.up.k2, &inputs.up.batch);
    let (d, f) = (batch.width, k2.n_rows());
    scratch.thetas[t] =
        topk::threshold_for(&inputs.up.scores[t * f..(t + 1) * f], inputs.up.cutoff);
    scratch.acts[t].prepare(k2.ty(), batch.row(t, d - k2.n_cols()..d)?)?;
    scratch.unit.prepared[t] = true;
    Ok(())
}

/// Chunk `c`'s partial for tokens `tokens`, after [`prepare`] with the same inputs and
/// `scratch`: `out` holds `tokens.len()` rows of D (as [`chunk_partials`] writes them for these
/// tokens; each token's row depends on that token only). Returns the active pairs.
pub(crate) fn unit_partial(
    inputs: &FusedInputs<'_>,
    n_chunks: usize,
    c: usize,
    tokens: Range<usize>,
    out: &mut [f32],
    scratch: &mut Scratch,
) -> Result<u64, KernelError> {
    let cols = 0..inputs.v.n_cols();
    let u = FusedUnit {
        chunk: c,
        tokens,
        cols,
    };
    unit(inputs, n_chunks, &u, out, scratch)
}

/// Work unit `u` ([`super::tiling::FusedUnits`]), after [`prepare`] with the same inputs and
/// `scratch`: `out` holds its values, `u.tokens.len()` rows of `u.cols.len()` columns (whole
/// rows, or part of one token's row), bit for bit what [`chunk_partials`] writes there. A part
/// of a row does the K2 dots of all the chunk's active neurons for its token and adds the
/// matching columns of their V rows (each element's arithmetic is the whole row's). Returns
/// the active pairs (counted by the unit that holds column 0, so each pair once).
pub(crate) fn unit(
    inputs: &FusedInputs<'_>,
    n_chunks: usize,
    u: &FusedUnit,
    out: &mut [f32],
    scratch: &mut Scratch,
) -> Result<u64, KernelError> {
    let (d, f) = (inputs.v.n_cols(), inputs.v.n_rows());
    let n_tokens = inputs.up.batch.n_tokens;
    let FusedUnit {
        chunk: c,
        tokens,
        cols,
    } = u.clone();
    let be = inputs.v.ty().block_elems();
    let whole = cols == (0..d);
    if c >= n_chunks
        || tokens.end > n_tokens
        || tokens.start > tokens.end
        || cols.start > cols.end
        || cols.end > d
        || (!whole
            && (tokens.len() > 1 || !cols.start.is_multiple_of(be) || !cols.end.is_multiple_of(be)))
    {
        return Err(KernelError::Shape(format!(
            "unit of chunk {c} of {n_chunks}, tokens {tokens:?} of {n_tokens}, columns \
             {cols:?} of {d} ({}: whole rows, or blocks of one row)",
            inputs.v.ty().name()
        )));
    }
    if scratch.thetas.len() != n_tokens
        || scratch.acts.len() < n_tokens
        || scratch.unit.prepared.len() != n_tokens
    {
        return Err(KernelError::Shape(
            "fused unit before its per-call preparation".into(),
        ));
    }
    let width = cols.len();
    check_len("partial", out.len(), tokens.len() * width)?;
    for t in tokens.clone() {
        prepare_token(inputs, t, scratch)?;
    }
    // Every token's row is written from zero by its walk (`PendingAxpy::folded`).
    let out = &mut out[..tokens.len() * width];
    let neurons = chunk_neurons(f, n_chunks, c);
    match tokens.len() {
        0 => Ok(0),
        1 if whole => Ok(token_chunk::<false>(
            inputs,
            tokens.start,
            neurons,
            &cols,
            out,
            scratch,
        )),
        1 => {
            let kept = token_chunk::<true>(inputs, tokens.start, neurons, &cols, out, scratch);
            Ok(if cols.start == 0 { kept } else { 0 })
        }
        _ => Ok(tokens_chunk(inputs, tokens, neurons, out, scratch)),
    }
}

/// Token `t`: list the chunk's active neurons first so that their K2 and V rows can be
/// prefetched ahead of use, then add their V rows to the token's output four at a time
/// (one pass over the output per four rows, [`PendingAxpy`]). A batch runs this for each of
/// its tokens: the output rows are read and written a quarter as often as one update per
/// (neuron, token) would, and each token gets exactly what it gets alone. A neuron active for
/// several tokens has its K2 and V rows read once per token (from cache after the first).
/// With `PART`, only columns `cols` of the V rows are added (`out` holds just them);
/// without, `cols` is all of them and unused (the walk of whole rows, as it was before parts).
fn token_chunk<const PART: bool>(
    inputs: &FusedInputs<'_>,
    t: usize,
    neurons: Range<usize>,
    cols: &Range<usize>,
    out: &mut [f32],
    scratch: &mut Scratch,
) -> u64 {
    let (k2, v) = (inputs.up.k2, inputs.v);
    scratch.list_active_token(inputs.up.scores, v.n_rows(), t, neurons);
    let mut pending = PendingAxpy::folded();
    for (i, (&j, &(_, a))) in scratch.active.iter().zip(&scratch.tokens).enumerate() {
        if let Some(&next) = scratch.active.get(i + PREFETCH_AHEAD) {
            prefetch_row(k2, next as usize);
            if PART {
                prefetch_row_range(v, next as usize, cols.clone());
            } else {
                prefetch_row(v, next as usize);
            }
        }
        let j = j as usize;
        let u = a * rows::dot(k2.row(j), &scratch.acts[t]);
        if u != 0.0 {
            let row = if PART {
                v.row(j).slice(cols.start, cols.end)
            } else {
                v.row(j)
            };
            pending.push(row, u, out);
        }
    }
    pending.flush(out);
    scratch.active.len() as u64
}

/// Several tokens `tokens` (their output rows back to back in `out`): the same values as
/// [`token_chunk`] for each token alone, bit for bit, with the K2 dots done neuron by neuron.
/// At a 64-token prefill unit each active neuron serves ~5 tokens; walking token by token reads
/// its K2 row once per token, here it is read once and stays in L1 for its tokens' dots (their
/// prepared activations, ~1.4 KB each, stay in L2). Four passes:
/// 1. per token, its active neurons of the chunk with their activations (as [`token_chunk`]
///    lists them), counting each neuron's tokens;
/// 2. those lists regrouped by neuron (a counting sort into `pairs`);
/// 3. the K2 dots neuron by neuron, each activation in a token's list replaced by its `u`;
/// 4. per token, its V rows added as [`token_chunk`] adds them (output rows token by token,
///    the order docs/PERF.md found fastest for V).
fn tokens_chunk(
    inputs: &FusedInputs<'_>,
    tokens: Range<usize>,
    neurons: Range<usize>,
    out: &mut [f32],
    scratch: &mut Scratch,
) -> u64 {
    let (k2, v, scores) = (inputs.up.k2, inputs.v, inputs.up.scores);
    let (d, f) = (v.n_cols(), v.n_rows());
    let Scratch {
        thetas, acts, unit, ..
    } = scratch;
    if unit.by_token.len() < tokens.len() {
        unit.by_token.resize_with(tokens.len(), Vec::new);
    }
    let by_token = &mut unit.by_token[..tokens.len()];
    let offsets = &mut unit.offsets;
    offsets.clear();
    offsets.resize(neurons.len() + 1, 0);
    for (t, list) in tokens.clone().zip(by_token.iter_mut()) {
        list.clear();
        let (theta, row) = (thetas[t], &scores[t * f..(t + 1) * f]);
        for j in neurons.clone() {
            if let Some(a) = super::shared::activation(row[j], theta) {
                list.push((j as u32, a));
                offsets[j - neurons.start + 1] += 1;
            }
        }
    }
    unit.neurons.clear();
    for (i, j) in neurons.clone().enumerate() {
        offsets[i + 1] += offsets[i];
        if offsets[i + 1] > offsets[i] {
            unit.neurons.push((j as u32, offsets[i + 1]));
        }
    }
    let n_pairs = offsets[neurons.len()] as usize;
    unit.pairs.clear();
    unit.pairs.resize(n_pairs, (0, 0));
    for (t, list) in by_token.iter().enumerate() {
        for (i, &(j, _)) in list.iter().enumerate() {
            let slot = &mut offsets[j as usize - neurons.start];
            unit.pairs[*slot as usize] = (t as u32, i as u32);
            *slot += 1;
        }
    }
    let mut start = 0;
    for (n, &(j, end)) in unit.neurons.iter().enumerate() {
        if let Some(&(next, _)) = unit.neurons.get(n + PREFETCH_AHEAD) {
            prefetch_row(k2, next as usize);
        }
        let row = k2.row(j as usize);
        for &(t, i) in &unit.pairs[start..end as usize] {
            let entry = &mut by_token[t as usize][i as usize];
            entry.1 *= rows::dot(row, &acts[tokens.start + t as usize]);
        }
        start = end as usize;
    }
    for (list, y) in by_token.iter().zip(out.chunks_exact_mut(d.max(1))) {
        let mut pending = PendingAxpy::folded();
        for (i, &(j, u)) in list.iter().enumerate() {
            if let Some(&(next, _)) = list.get(i + PREFETCH_AHEAD) {
                prefetch_row(v, next as usize);
            }
            if u != 0.0 {
                pending.push(v.row(j as usize), u, y);
            }
        }
        pending.flush(y);
    }
    n_pairs as u64
}

/// `out[e] = partials[0][range][e] + partials[1][range][e] + ...` in chunk order, where the
/// partials lie back to back, `len` values each, and `out` has `range.len()` values.
pub fn sum_partials(
    partials: &[f32],
    len: usize,
    range: Range<usize>,
    out: &mut [f32],
) -> Result<(), KernelError> {
    if len == 0 || !partials.len().is_multiple_of(len) || range.end > len {
        return Err(KernelError::Shape(format!(
            "{} partial values are not whole chunks of {len} covering {range:?}",
            partials.len()
        )));
    }
    check_len("output", out.len(), range.len())?;
    let out = &mut out[..range.len()];
    let mut chunks = partials.chunks_exact(len);
    match chunks.next() {
        Some(first) => out.copy_from_slice(&first[range.clone()]),
        None => out.fill(0.0),
    }
    for p in chunks {
        for (o, &x) in out.iter_mut().zip(&p[range.clone()]) {
            *o += x;
        }
    }
    Ok(())
}

/// The whole FFN serially on the fused path (predictor, `n_chunks` chunks, sum):
/// `out[t * D ..]` for every row of `batch`. Returns the number of active (neuron, token)
/// pairs.
pub fn sparse_ffn_fused(
    batch: &Batch<'_>,
    w: &FfnWeights<'_>,
    n_chunks: usize,
    out: &mut [f32],
) -> Result<u64, KernelError> {
    let (d, f, n_tokens) = (w.v.n_cols(), w.v.n_rows(), batch.n_tokens);
    super::shared::check_shapes(d, f, w.k1, w.k2)?;
    check_batch_width(batch, d)?;
    check_len("out", out.len(), n_tokens * d)?;
    let mut scores = vec![0f32; n_tokens * f];
    super::shared::predictor_scores(w.k1, batch, &mut scores)?;
    let len = n_tokens * d;
    let mut partials = vec![0f32; n_chunks * len];
    let inputs = FusedInputs {
        up: UpInputs {
            scores: &scores,
            batch: *batch,
            k2: w.k2,
            cutoff: w.cutoff,
        },
        v: w.v,
    };
    let kept = chunk_partials(
        &inputs,
        n_chunks,
        partials.chunks_mut(len.max(1)).enumerate(),
        &mut Scratch::new(),
    )?;
    if len > 0 {
        sum_partials(&partials, len, 0..len, out)?;
    }
    Ok(kept)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffn::tiling::{self, FusedUnits};
    use crate::rows::{quant, RowType};

    /// Deterministic normals (xorshift + Box-Muller).
    struct Rng(u64);

    impl Rng {
        fn uniform(&mut self) -> f64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 >> 11) as f64 / (1u64 << 53) as f64
        }

        fn normals(&mut self, n: usize, scale: f64) -> Vec<f32> {
            (0..n)
                .map(|_| {
                    let (a, b) = (self.uniform().max(1e-300), self.uniform());
                    ((-2.0 * a.ln()).sqrt() * (std::f64::consts::TAU * b).cos() * scale) as f32
                })
                .collect()
        }
    }

    /// The fused path's inputs over the packed rows of `h` (width D: `v`'s columns).
    fn packed_inputs<'a>(
        scores: &'a [f32],
        h: &'a [f32],
        k2: &'a RowMatrix<'a>,
        v: &'a RowMatrix<'a>,
        k: usize,
    ) -> FusedInputs<'a> {
        let d = v.n_cols();
        FusedInputs {
            up: UpInputs {
                scores,
                batch: Batch {
                    h,
                    stride: d,
                    width: d,
                    n_tokens: h.len() / d,
                },
                k2,
                cutoff: topk::Cutoff::TopK(k),
            },
            v,
        }
    }

    /// Every unit of every cut (thread counts 1 to 200, tokens 1 to 70: whole rows, more token
    /// groups, column parts) computed on its own, in reverse order over two scratch buffers,
    /// writes exactly what `chunk_partials` writes, and the active pairs add up to its count.
    #[test]
    fn every_cut_into_units_gives_the_partials_bit_for_bit() {
        quant::ensure_cpu_init();
        let mut rng = Rng(0x5EED_1234_ABCD_0001);
        for ty in [RowType::Q8_0, RowType::F16, RowType::Q4K] {
            let (d, r, f) = if ty == RowType::Q4K {
                (1024, 256, 160)
            } else {
                (256, 64, 320)
            };
            let k2b = quant::quantize_rows(ty, &rng.normals(f * (d - r), 0.3), d - r).unwrap();
            let vb = quant::quantize_rows(ty, &rng.normals(f * d, 0.3), d).unwrap();
            let k2 = RowMatrix::packed(ty, d - r, f, &k2b).unwrap();
            let v = RowMatrix::packed(ty, d, f, &vb).unwrap();
            let p = tiling::default_chunks(f);
            for n_tokens in [1, 2, 3, 5, 70] {
                let h = rng.normals(n_tokens * d, 1.0);
                let scores = rng.normals(n_tokens * f, 1.0);
                let inputs = packed_inputs(&scores, &h, &k2, &v, f / 3);
                let len = n_tokens * d;
                let mut want = vec![0f32; p * len];
                let kept = chunk_partials(
                    &inputs,
                    p,
                    want.chunks_mut(len).enumerate(),
                    &mut Scratch::new(),
                )
                .unwrap();
                assert!(kept > 0);
                for nth in [1, 2, 7, 16, 32, 64, 200] {
                    let units = FusedUnits::new(p, n_tokens, d, ty.block_elems(), nth);
                    let mut got = vec![f32::NAN; p * len];
                    let mut sc = [Scratch::new(), Scratch::new()];
                    for s in &mut sc {
                        prepare(&inputs, p, s).unwrap();
                    }
                    let mut pairs = 0;
                    for u in (0..units.count()).rev() {
                        let one = units.get(u);
                        let span = units.span(&one);
                        assert_eq!(span.len(), one.tokens.len() * one.cols.len());
                        pairs += unit(&inputs, p, &one, &mut got[span], &mut sc[u % 2]).unwrap();
                    }
                    let what = format!("{ty:?} T {n_tokens} nth {nth}");
                    assert!(
                        got.iter()
                            .zip(&want)
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{what}"
                    );
                    assert_eq!(pairs, kept, "{what}");
                }
            }
        }
    }

    /// A unit that is not whole rows nor whole blocks of one row, or that runs before its
    /// call's preparation, is an error naming it, not a panic.
    #[test]
    fn malformed_units_are_errors() {
        quant::ensure_cpu_init();
        let mut rng = Rng(77);
        let (d, r, f, n_tokens) = (128, 32, 40, 3);
        let k2b = quant::quantize_rows(RowType::Q8_0, &rng.normals(f * (d - r), 0.3), d - r);
        let vb = quant::quantize_rows(RowType::Q8_0, &rng.normals(f * d, 0.3), d).unwrap();
        let k2b = k2b.unwrap();
        let k2 = RowMatrix::packed(RowType::Q8_0, d - r, f, &k2b).unwrap();
        let v = RowMatrix::packed(RowType::Q8_0, d, f, &vb).unwrap();
        let (h, scores) = (
            rng.normals(n_tokens * d, 1.0),
            rng.normals(n_tokens * f, 1.0),
        );
        let inputs = packed_inputs(&scores, &h, &k2, &v, 5);
        let mut out = vec![0f32; n_tokens * d];
        let mut sc = Scratch::new();
        let whole = FusedUnit {
            chunk: 0,
            tokens: 0..1,
            cols: 0..d,
        };
        let early = unit(&inputs, 4, &whole, &mut out, &mut sc).unwrap_err();
        assert!(early.to_string().contains("preparation"), "{early}");
        prepare(&inputs, 4, &mut sc).unwrap();
        let bad = [
            FusedUnit {
                chunk: 0,
                tokens: 0..2,
                cols: 0..64,
            },
            FusedUnit {
                chunk: 0,
                tokens: 0..1,
                cols: 16..64,
            },
            FusedUnit {
                chunk: 0,
                tokens: 0..1,
                cols: 64..d + 32,
            },
            FusedUnit {
                chunk: 4,
                tokens: 0..1,
                cols: 0..d,
            },
            FusedUnit {
                chunk: 0,
                tokens: 2..4,
                cols: 0..d,
            },
        ];
        for b in bad {
            let e = unit(&inputs, 4, &b, &mut out, &mut sc).unwrap_err();
            assert!(e.to_string().contains("unit of chunk"), "{b:?}: {e}");
        }
        assert!(unit(&inputs, 4, &whole, &mut out, &mut sc).is_ok());
    }
}
