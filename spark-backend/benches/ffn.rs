//! Sparse Spark FFN vs the dense gated FFN of Gemma-2 2B, both as ggml graphs on the same
//! persistent ggml thread pool (2 threads), at Gemma-2 2B shapes: D 2304, F 13824, r_f 1024,
//! k_f 1106 (sparse); gate/up/down 2304 x 9216 (dense). The sparse FFN runs both ways of
//! `docs/INTERFACES.md`: two-stage (`spark_ffn_up` + `spark_ffn_down`) and fused
//! (`spark_ffn_fused` + `spark_ffn_sum`), the latter also with K2 and V packed row by row into
//! one tensor. Weight types f16 and q8_0, batches 1 and 64. Also measures this machine's read
//! bandwidth (2 threads summing a 2 GiB buffer) and prints a summary table with the ratios and
//! the sparse kernel's achieved bytes/s.
//!
//! Run: `cargo bench -p spark-backend --bench ffn` (add `-- --quick`-style criterion flags as
//! usual). `SPARK_BENCH_TYPES=f16` / `SPARK_BENCH_BATCHES=1` restrict the grid;
//! `SPARK_BENCH_THREADS=1` runs both graphs on one ggml thread.

#[path = "../tests/ffn_helpers/mod.rs"]
mod ffn_helpers;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use ffn_helpers::{Ggml, Rng, Runner};
use llama_cpp_sys_2 as sys;
use spark_backend::params::OpParams;
use spark_backend::rows::{quant, RowType};
use std::time::{Duration, Instant};

const D: usize = 2304;
const F: usize = 13824;
const R: usize = 1024;
const K: i32 = 1106;
const FF: usize = 9216;
/// ggml threads (`SPARK_BENCH_THREADS`, default 2).
fn threads() -> i32 {
    std::env::var("SPARK_BENCH_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2)
}

fn types() -> Vec<RowType> {
    let want = std::env::var("SPARK_BENCH_TYPES").unwrap_or_else(|_| "f16,q8_0".into());
    want.split(',')
        .filter_map(|n| RowType::ALL.into_iter().find(|t| t.name() == n))
        .collect()
}

fn batches() -> Vec<usize> {
    let want = std::env::var("SPARK_BENCH_BATCHES").unwrap_or_else(|_| "1,64".into());
    want.split(',')
        .filter_map(|n| n.trim().parse().ok())
        .collect()
}

/// Random weights stored in `ty` (ggml's quantizer for quantized types).
fn weights(rng: &mut Rng, ty: RowType, n_cols: usize, n_rows: usize, scale: f64) -> Vec<u8> {
    let raw = rng.normals(n_cols * n_rows, scale);
    quant::quantize_rows(ty, &raw, n_cols).expect("quantize")
}

struct Setup {
    ggml: Ggml,
    _params: Box<OpParams>,
    sparse: *mut sys::ggml_cgraph,
    /// The fused path: mul_mat + spark_ffn_fused + spark_ffn_sum.
    fused: *mut sys::ggml_cgraph,
    /// The fused path with K2 and V rows interleaved in one buffer.
    fused_packed: *mut sys::ggml_cgraph,
    /// Prefixes of the sparse graph: the predictor alone, and predictor + `spark_ffn_up`.
    predictor_only: *mut sys::ggml_cgraph,
    through_up: *mut sys::ggml_cgraph,
    dense: *mut sys::ggml_cgraph,
    u: *mut sys::ggml_tensor,
    /// Bytes of weights the dense FFN reads per call.
    dense_bytes: usize,
    k1_bytes: usize,
    k2_row: usize,
    v_row: usize,
}

impl Setup {
    fn new(ty: RowType, n_tokens: usize) -> Self {
        let mut rng = Rng::new(7);
        let row = |n: usize| ty.row_bytes(n).unwrap();
        let total = row(R) * F + 2 * (row(D - R) * F + row(D) * F) + 3 * row(D) * FF;
        let partials = 4 * D * n_tokens * spark_backend::ffn::tiling::default_chunks(F);
        let ggml =
            Ggml::new(total + partials + (n_tokens * (8 * F + 8 * FF + 12 * D) + (64 << 20)));
        let h = ggml.f32_tensor(D, n_tokens, &rng.normals(n_tokens * D, 1.0));
        // Scale so that the predictor scores and the dense activations are O(1).
        let k1 = ggml.tensor(
            ty,
            R,
            F,
            &weights(&mut rng, ty, R, F, 1.0 / (R as f64).sqrt()),
        );
        let k2_bytes = weights(&mut rng, ty, D - R, F, 0.03);
        let v_bytes = weights(&mut rng, ty, D, F, 0.03);
        let k2 = ggml.tensor(ty, D - R, F, &k2_bytes);
        let v = ggml.tensor(ty, D, F, &v_bytes);
        // The same K2 and V stored interleaved, row j of K2 right before row j of V (one
        // contiguous read per active neuron), as strided views of one tensor: what a loader
        // that packs the two tensors together would buy.
        let (k2_row, v_row) = (row(D - R), row(D));
        let (_, [k2_packed, v_packed]) =
            ggml.side_by_side(ty, (&k2_bytes, D - R), (&v_bytes, D), F);
        let params = Box::new(OpParams {
            layer: 0,
            k: K,
            ..Default::default()
        });
        let [scores, u, out] = ggml.spark_ffn(h, k1, k2, v, &*params);
        let sparse = ggml.graph(out);
        let p = spark_backend::ffn::tiling::default_chunks(F);
        let [_, _, fused_out] = ggml.spark_ffn_fused(h, k1, k2, v, p, &*params);
        let fused = ggml.graph(fused_out);
        let [_, _, packed_out] = ggml.spark_ffn_fused(h, k1, k2_packed, v_packed, p, &*params);
        let fused_packed = ggml.graph(packed_out);
        let predictor_only = ggml.graph(scores);
        let through_up = ggml.graph(u);
        let gate = ggml.tensor(ty, D, FF, &weights(&mut rng, ty, D, FF, 0.03));
        let up = ggml.tensor(ty, D, FF, &weights(&mut rng, ty, D, FF, 0.03));
        let down = ggml.tensor(ty, FF, D, &weights(&mut rng, ty, FF, D, 0.03));
        let dense = ggml.graph(ggml.dense_ffn(h, gate, up, down));
        Setup {
            ggml,
            _params: params,
            sparse,
            fused,
            fused_packed,
            predictor_only,
            through_up,
            dense,
            u,
            dense_bytes: 3 * row(D) * FF,
            k1_bytes: row(R) * F,
            k2_row,
            v_row,
        }
    }

    /// Weight bytes the sparse FFN read in its last run: all of K1, and one K2 and one V row
    /// per neuron active for any token of the batch.
    fn sparse_bytes(&self) -> (usize, f64) {
        let u = self.ggml.read(self.u);
        let n_tokens = u.len() / F;
        let union = u
            .chunks_exact(n_tokens)
            .filter(|c| c.iter().any(|&x| x != 0.0))
            .count();
        let kept = u.iter().filter(|&&x| x != 0.0).count() as f64 / n_tokens as f64;
        (self.k1_bytes + union * (self.k2_row + self.v_row), kept)
    }
}

/// Runs the closures in turn, `runs` rounds; returns each one's (min, median) wall time.
/// The minimum filters out preemption by other processes on a shared machine; alternating
/// exposes all of them to the same conditions.
fn interleaved<const N: usize>(
    runs: usize,
    mut fs: [&mut dyn FnMut(); N],
) -> [(Duration, Duration); N] {
    let mut times = vec![Vec::with_capacity(runs); N];
    for _ in 0..runs {
        for (f, t) in fs.iter_mut().zip(times.iter_mut()) {
            let s = Instant::now();
            f();
            t.push(s.elapsed());
        }
    }
    std::array::from_fn(|i| {
        times[i].sort();
        (times[i][0], times[i][runs / 2])
    })
}

/// 2 threads each summing half of a buffer of `bytes` bytes; returns bytes/s (best of 3).
fn read_bandwidth(bytes: usize) -> f64 {
    let buf: Vec<f32> = (0..bytes / 4).map(|i| (i % 7) as f32).collect();
    let half = buf.len() / 2;
    let sum = |x: &[f32]| {
        let mut acc = [0f32; 64];
        for c in x.chunks_exact(64) {
            for i in 0..64 {
                acc[i] += c[i];
            }
        }
        acc.iter().sum::<f32>()
    };
    let mut best = f64::MAX;
    for _ in 0..3 {
        let t = Instant::now();
        let total: f32 = std::thread::scope(|s| {
            let a = s.spawn(|| sum(&buf[..half]));
            let b = sum(&buf[half..]);
            a.join().unwrap() + b
        });
        std::hint::black_box(total);
        best = best.min(t.elapsed().as_secs_f64());
    }
    bytes as f64 / best
}

fn bench(c: &mut Criterion) {
    let bw = read_bandwidth(2 << 30);
    let n_threads = threads();
    let runner = std::cell::RefCell::new(Runner::new(n_threads));
    let run = |g: *mut sys::ggml_cgraph| runner.borrow_mut().compute(g);
    let mut summary = Vec::new();
    let mut stages = Vec::new();
    let mut packed_rows = Vec::new();
    for ty in types() {
        for n_tokens in batches() {
            let setup = Setup::new(ty, n_tokens);
            let mut g = c.benchmark_group(format!("ffn_{}_b{n_tokens}", ty.name()));
            g.sample_size(10)
                .warm_up_time(Duration::from_secs(1))
                .measurement_time(Duration::from_secs(3));
            g.throughput(Throughput::Elements(n_tokens as u64));
            g.bench_function("dense_ggml", |b| b.iter(|| run(setup.dense)));
            g.bench_function("sparse_two_stage", |b| b.iter(|| run(setup.sparse)));
            g.bench_function("sparse_fused", |b| b.iter(|| run(setup.fused)));
            g.finish();
            // Same-run summary: each sparse graph right after the dense one (67 MB of other
            // weights), so that its weights come from memory as in a decode step, and never
            // right after the other sparse graph (which reads the same weights).
            let runs = if n_tokens == 1 { 61 } else { 9 };
            let [dense, sparse, _, fused, _, packed] = interleaved(
                runs,
                [
                    &mut || run(setup.dense),
                    &mut || run(setup.sparse),
                    &mut || run(setup.dense),
                    &mut || run(setup.fused),
                    &mut || run(setup.dense),
                    &mut || run(setup.fused_packed),
                ],
            );
            packed_rows.push((ty, n_tokens, dense, fused, packed));
            let (bytes, kept) = setup.sparse_bytes();
            summary.push((
                ty,
                n_tokens,
                dense,
                sparse,
                fused,
                setup.dense_bytes,
                bytes,
                kept,
            ));
            // Stage costs: min times of the graph prefixes, each run after the dense graph
            // (67 MB of other weights) so that its weights come from memory, as in the full run.
            let [_, predictor, _, through_up] = interleaved(
                runs,
                [
                    &mut || run(setup.dense),
                    &mut || run(setup.predictor_only),
                    &mut || run(setup.dense),
                    &mut || run(setup.through_up),
                ],
            );
            stages.push((ty, n_tokens, predictor.0, through_up.0, sparse.0, fused.0));
        }
    }
    println!(
        "\nread bandwidth (2 threads, 2 GiB sum): {:.1} GB/s; ggml threads: {n_threads}",
        bw / 1e9
    );
    println!("| type | batch | dense ms (min / median) | two-stage ms (min / median) | fused ms (min / median) | two-stage speed-up (min / median) | fused speed-up (min / median) | kept/token | sparse weight MB | fused GB/s (min) | dense GB/s (min) | byte-limit speed-up |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    for (ty, n, dense, sparse, fused, db, sb, kept) in summary {
        println!(
            "| {} | {n} | {:.2} / {:.2} | {:.2} / {:.2} | {:.2} / {:.2} | {:.2}x / {:.2}x | {:.2}x / {:.2}x | {kept:.0} | {:.1} | {:.1} | {:.1} | {:.2}x |",
            ty.name(),
            ms(dense.0),
            ms(dense.1),
            ms(sparse.0),
            ms(sparse.1),
            ms(fused.0),
            ms(fused.1),
            ms(dense.0) / ms(sparse.0),
            ms(dense.1) / ms(sparse.1),
            ms(dense.0) / ms(fused.0),
            ms(dense.1) / ms(fused.1),
            sb as f64 / 1e6,
            sb as f64 / fused.0.as_secs_f64() / 1e9,
            db as f64 / dense.0.as_secs_f64() / 1e9,
            db as f64 / sb as f64,
        );
    }
    println!("\nfused path with K2 and V rows interleaved in one buffer (same run):");
    println!("| type | batch | fused ms (min / median) | interleaved ms (min / median) | interleaved speed-up over dense (min / median) |");
    println!("|---|---|---|---|---|");
    for (ty, n, dense, fused, packed) in packed_rows {
        println!(
            "| {} | {n} | {:.2} / {:.2} | {:.2} / {:.2} | {:.2}x / {:.2}x |",
            ty.name(),
            ms(fused.0),
            ms(fused.1),
            ms(packed.0),
            ms(packed.1),
            ms(dense.0) / ms(packed.0),
            ms(dense.1) / ms(packed.1),
        );
    }
    println!("\nsparse stages (min ms of graph prefixes, each run after the dense graph):");
    println!("| type | batch | predictor mul_mat(K1) | spark_ffn_up | spark_ffn_down | spark_ffn_fused + spark_ffn_sum |");
    println!("|---|---|---|---|---|---|");
    for (ty, n, predictor, through_up, all, fused) in stages {
        println!(
            "| {} | {n} | {:.3} | {:.3} | {:.3} | {:.3} |",
            ty.name(),
            ms(predictor),
            ms(through_up) - ms(predictor),
            ms(all) - ms(through_up),
            ms(fused) - ms(predictor),
        );
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
