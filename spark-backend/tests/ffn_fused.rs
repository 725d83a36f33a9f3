//! The fused sparse FFN path (`spark_ffn_fused` + `spark_ffn_sum`, docs/INTERFACES.md)
//! against a float64 reference of SPEC 4 for every weight type and odd shapes, chunk counts and
//! batches; bit-identical results for any thread count and batch composition; the ggml graph
//! with real threads; errors surfacing as NaN.

mod ffn_helpers;

use ffn_helpers::{
    assert_close, batch, op_case, ref_up, up_scale, with_ffn_weights, OpCase, Rng, Weights,
};
use spark_backend::ffn::cpu_ops::{spark_ffn_fused, spark_ffn_sum};
use spark_backend::ffn::{self, fused, tiling, two_stage};
use spark_backend::params::OpParams;
use spark_backend::rows::RowType;
use spark_backend::stats;
use spark_backend::topk::Cutoff;

/// (D, r_f, F) per weight type: quantized rows need whole blocks.
fn shapes(ty: RowType) -> Vec<(usize, usize, usize)> {
    match ty.block_elems() {
        1 => vec![(2, 1, 1), (7, 3, 31), (33, 17, 7), (40, 9, 255)],
        32 => vec![(64, 32, 7), (96, 32, 33), (160, 64, 255)],
        _ => vec![(512, 256, 33), (768, 256, 31)],
    }
}

/// The float64 FFN output given the scores: `out_t = sum_j u_tj V_j` with `u` from
/// [`ref_up`]; its error scale `sum_j up_scale_tj |V_j|` (the bound on each `u_tj`'s rounding
/// carried through V); and the number of nonzero `u_tj`.
fn ref_out(
    scores: &[f32],
    h: &[f32],
    d: usize,
    n_tokens: usize,
    k2: &Weights,
    v: &Weights,
    k: usize,
) -> (Vec<f64>, Vec<f64>, usize) {
    let u = ref_up(scores, h, d, n_tokens, k2, k);
    let u_scale = up_scale(scores, h, d, n_tokens, k2, k);
    let mut out = vec![0f64; n_tokens * d];
    let mut mag = vec![0f64; n_tokens * d];
    for j in 0..v.n_rows {
        for t in 0..n_tokens {
            let (uj, sj) = (u[j * n_tokens + t], u_scale[j * n_tokens + t]);
            for (i, w) in v.row_f64(j).enumerate() {
                out[t * d + i] += uj * w;
                mag[t * d + i] += sj * w.abs();
            }
        }
    }
    (out, mag, u.iter().filter(|&&x| x != 0.0).count())
}

/// Chunk counts to try for F neurons: one chunk, an odd count, the graph's default, one per
/// neuron (all at most F).
fn chunk_counts(f: usize) -> Vec<usize> {
    let mut p = vec![1, 3.min(f), tiling::default_chunks(f), f];
    p.dedup();
    p
}

#[test]
fn fused_path_matches_float64_for_every_type_shape_and_chunk_count() {
    let mut rng = Rng::new(31);
    for ty in RowType::ALL {
        for (d, r, f) in shapes(ty) {
            for n_tokens in [1usize, 3] {
                let k1 = Weights::random(&mut rng, ty, r, f, 0.3);
                let k2 = Weights::random(&mut rng, ty, d - r, f, 0.3);
                let v = Weights::random(&mut rng, ty, d, f, 0.3);
                let h = rng.normals(n_tokens * d, 1.0);
                let k = (f / 10).max(1);
                let mut scores = vec![0f32; n_tokens * f];
                ffn::predictor_scores(&k1.matrix(), &batch(&h, d, n_tokens), &mut scores).unwrap();
                let (want, mag, want_kept) = ref_out(&scores, &h, d, n_tokens, &k2, &v, k);
                // Quantized K2 rows also quantize h[r:] (~1% of a block's max per element).
                let rel = if ty.is_quantized() { 2e-2 } else { 1e-5 };
                for p in chunk_counts(f) {
                    let what = format!("{ty:?} D={d} r={r} F={f} T={n_tokens} P={p}");
                    let mut out = vec![0f32; n_tokens * d];
                    let kept = with_ffn_weights(&k1, &k2, &v, Cutoff::TopK(k), |w| {
                        fused::sparse_ffn_fused(&batch(&h, d, n_tokens), w, p, &mut out)
                    })
                    .unwrap();
                    assert_eq!(kept as usize, want_kept, "{what}: kept");
                    assert_close(&out, &want, &mag, rel, &what);
                }
            }
        }
    }
}

#[test]
fn fused_and_two_stage_paths_agree_and_dense_when_k_at_least_f() {
    let mut rng = Rng::new(32);
    let (d, r, f, n_tokens) = (96, 32, 255, 3);
    for ty in [RowType::F32, RowType::Q8_0] {
        let k1 = Weights::random(&mut rng, ty, r, f, 0.3);
        let k2 = Weights::random(&mut rng, ty, d - r, f, 0.3);
        let v = Weights::random(&mut rng, ty, d, f, 0.3);
        let h = rng.normals(n_tokens * d, 1.0);
        for k in [20, f, f + 5] {
            let mut two = vec![0f32; n_tokens * d];
            let kept_two = with_ffn_weights(&k1, &k2, &v, Cutoff::TopK(k), |w| {
                two_stage::sparse_ffn(&batch(&h, d, n_tokens), w, &mut two)
            })
            .unwrap();
            let mut one = vec![0f32; n_tokens * d];
            let kept_one = with_ffn_weights(&k1, &k2, &v, Cutoff::TopK(k), |w| {
                fused::sparse_ffn_fused(&batch(&h, d, n_tokens), w, 16, &mut one)
            })
            .unwrap();
            assert_eq!(kept_one, kept_two, "{ty:?} k={k}");
            if k >= f {
                assert!(
                    kept_one as usize >= n_tokens * f * 9 / 10,
                    "{ty:?}: k >= F is dense"
                );
            }
            let scale = two.iter().fold(0f32, |m, x| m.max(x.abs()));
            for (a, b) in one.iter().zip(&two) {
                assert!((a - b).abs() <= 1e-5 * scale, "{ty:?} k={k}: {a} vs {b}");
            }
        }
    }
}

#[test]
fn batch_tokens_get_exactly_what_they_get_alone() {
    let mut rng = Rng::new(33);
    for ty in [RowType::F16, RowType::Q8_0, RowType::Q4K] {
        let (d, r, f) = if ty == RowType::Q4K {
            (512, 256, 33)
        } else {
            (96, 32, 255)
        };
        let n_tokens = 6;
        let k1 = Weights::random(&mut rng, ty, r, f, 0.3);
        let k2 = Weights::random(&mut rng, ty, d - r, f, 0.3);
        let v = Weights::random(&mut rng, ty, d, f, 0.3);
        let h = rng.normals(n_tokens * d, 1.0);
        let p = tiling::default_chunks(f);
        let run = |h: &[f32], n: usize| {
            let mut out = vec![0f32; n * d];
            with_ffn_weights(&k1, &k2, &v, Cutoff::TopK((f / 8).max(1)), |w| {
                fused::sparse_ffn_fused(&batch(h, d, n), w, p, &mut out)
            })
            .unwrap();
            out
        };
        let batch = run(&h, n_tokens);
        for t in 0..n_tokens {
            let one = run(&h[t * d..(t + 1) * d], 1);
            assert!(
                batch[t * d..(t + 1) * d]
                    .iter()
                    .zip(&one)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{ty:?} token {t}"
            );
        }
    }
}

/// Runs both ops directly for every ith of a simulated nth, in sequence (chunks in reverse
/// thread order for the sum, to show no thread depends on another's timing).
fn run_simulated(c: &OpCase, s: &[f32], p: usize, nth: i32) -> Vec<f32> {
    // SAFETY: c.h is a live tensor of c.ggml.
    let (d, n) = unsafe { ((*c.h).ne[0] as usize, (*c.h).ne[1] as usize) };
    let f = s.len() / n;
    let st = c.ggml.f32_tensor(f, n, s);
    let params = &*c.params as *const OpParams;
    let partials = c.ggml.custom(
        &[d, n, p],
        &mut [st, c.h, c.k2, c.v],
        spark_ffn_fused,
        params,
    );
    let out = c
        .ggml
        .custom(&[d, n], &mut [partials], spark_ffn_sum, params);
    for ith in 0..nth {
        // SAFETY: partials is a custom-op tensor of this context with the INTERFACES.md sources.
        unsafe { spark_ffn_fused(partials, ith, nth, params as *mut _) };
    }
    for ith in (0..nth).rev() {
        // SAFETY: as above.
        unsafe { spark_ffn_sum(out, ith, nth, std::ptr::null_mut()) };
    }
    c.ggml.read(out)
}

#[test]
fn ops_are_bit_identical_for_any_thread_count_and_equal_the_serial_path() {
    let mut rng = Rng::new(34);
    for ty in RowType::ALL {
        let (d, r, f) = *shapes(ty).last().unwrap();
        for n in [1usize, 5] {
            let k = (f / 8).max(1);
            let (c, [k1, k2, v], h) = op_case(&mut rng, ty, d, r, f, n, k as i32, 210);
            let mut s = vec![0f32; n * f];
            ffn::predictor_scores(&k1.matrix(), &batch(&h, d, n), &mut s).unwrap();
            for p in chunk_counts(f) {
                let o1 = run_simulated(&c, &s, p, 1);
                assert!(o1.iter().all(|x| x.is_finite()) && o1.iter().any(|&x| x != 0.0));
                for nth in [2, 3, 7, 16] {
                    let o = run_simulated(&c, &s, p, nth);
                    assert!(
                        o.iter().zip(&o1).all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{ty:?} T={n} P={p} nth={nth}: out differs"
                    );
                }
                let mut serial = vec![0f32; n * d];
                with_ffn_weights(&k1, &k2, &v, Cutoff::TopK(k), |w| {
                    fused::sparse_ffn_fused(&batch(&h, d, n), w, p, &mut serial)
                })
                .unwrap();
                assert_eq!(
                    serial, o1,
                    "{ty:?} T={n} P={p}: op differs from the serial path"
                );
            }
        }
    }
}

#[test]
fn ggml_graph_with_real_threads_matches_the_two_stage_graph_and_records_stats() {
    let mut rng = Rng::new(35);
    for ty in [RowType::F32, RowType::F16, RowType::Q8_0, RowType::Q4K] {
        let (d, r, f) = *shapes(ty).last().unwrap();
        let n = 4;
        let (c, _, _) = op_case(&mut rng, ty, d, r, f, n, (f / 8) as i32, 211);
        let [_, u, two_stage] = c.ggml.spark_ffn(c.h, c.k1, c.k2, c.v, &*c.params);
        let p = tiling::default_chunks(f);
        let [_, _, out] = c.ggml.spark_ffn_fused(c.h, c.k1, c.k2, c.v, p, &*c.params);
        let two_graph = c.ggml.graph(two_stage);
        c.ggml.compute(two_graph, 1);
        let (want, u_kept) = (
            c.ggml.read(two_stage),
            c.ggml.read(u).iter().filter(|&&x| x != 0.0).count() as u64,
        );
        let g = c.ggml.graph(out);
        let mut first: Option<Vec<f32>> = None;
        for n_threads in [1, 2, 3] {
            stats::reset();
            c.ggml.compute(g, n_threads);
            let st = stats::snapshot(211).unwrap();
            assert_eq!(st.ffn_tokens, n as u64);
            assert_eq!(st.ffn_width, f as u64);
            // The activation count includes exact-zero products the two-stage u cannot show.
            assert!(
                st.ffn_kept >= u_kept && st.ffn_kept <= u_kept + 2,
                "{ty:?} kept"
            );
            let o = c.ggml.read(out);
            let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
            for (a, b) in o.iter().zip(&want) {
                assert!(
                    (a - b).abs() <= 1e-5 * scale,
                    "{ty:?} {n_threads} threads: {a} vs {b}"
                );
            }
            // ggml's own mul_mat gives the same scores for any thread count here, so the
            // output must not change either.
            match &first {
                None => first = Some(o),
                Some(o0) => assert_eq!(&o, o0, "{ty:?}: depends on the thread count"),
            }
        }
    }
}

/// Gemma 3n's cutoff (std multiplier Q(0.95)) with r_f = 0 (K2 over all of h) on the fused
/// path, the graph's path for its decode steps and prefill ubatches: `spark_ffn_fused` (P =
/// 16) + `spark_ffn_sum` on 1, 2 and 3 threads, bit-identical, against the two-stage ops
/// (`spark_ffn_up` + `spark_ffn_down`) to rounding and against f64 (SPEC 4's V sum of the f64
/// reference u), f32 and q8_0, T = 1 and 7.
#[test]
fn std_mul_cutoff_over_all_of_h_on_the_fused_path() {
    use spark_backend::ffn::cpu_ops::{spark_ffn_down, spark_ffn_up};
    let mut rng = Rng::new(37);
    let (d, f, p) = (256, 2048, 16);
    for ty in [RowType::F32, RowType::Q8_0] {
        for n in [1usize, 7] {
            let c = ffn_helpers::std_mul_case(&mut rng, ty, d, f, n, 213);
            let what = format!("{ty:?} T={n}");
            let partials = c.ggml.custom(
                &[d, n, p],
                &mut [c.s, c.h, c.k2, c.v],
                spark_ffn_fused,
                &*c.params,
            );
            let out = c
                .ggml
                .custom(&[d, n], &mut [partials], spark_ffn_sum, &*c.params);
            let u = c
                .ggml
                .custom(&[n, f], &mut [c.s, c.h, c.k2], spark_ffn_up, &*c.params);
            let two = c
                .ggml
                .custom(&[d, n], &mut [u, c.v], spark_ffn_down, &*c.params);
            let g2 = c.ggml.graph(two);
            c.ggml.compute(g2, 2);
            let (want, uv) = (c.ggml.read(two), c.ggml.read(u));
            let g = c.ggml.graph(out);
            let mut first: Option<Vec<f32>> = None;
            for n_threads in [1, 2, 3] {
                c.ggml.compute(g, n_threads);
                let o = c.ggml.read(out);
                match &first {
                    None => first = Some(o),
                    Some(o0) => assert!(
                        o.iter().zip(o0).all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{what}: depends on the thread count"
                    ),
                }
            }
            let o = first.unwrap();
            let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
            assert!(scale > 0.0, "{what}: nothing kept");
            for (i, (a, b)) in o.iter().zip(&want).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-5 * scale,
                    "{what} [{i}]: fused {a} vs two-stage {b}"
                );
            }
            // Against f64: the V sum of the reference u, within the up stage's tolerance
            // (rel * its scale) carried through |V| plus the f32 sum's rounding (rel * |u V|).
            let ur = ffn_helpers::ref_up_for(&c.sv, &c.hv, d, n, &c.k2w, c.cutoff);
            let umag = ffn_helpers::up_scale_for(&c.sv, &c.hv, d, n, &c.k2w, c.cutoff);
            let rel = if ty.is_quantized() { 2e-2 } else { 1e-5 };
            assert_close(&uv, &ur, &umag, rel, &format!("{what} u"));
            let mut oref = vec![0f64; n * d];
            let mut omag = vec![0f64; n * d];
            for j in 0..f {
                for t in 0..n {
                    let (a, m) = (ur[j * n + t], umag[j * n + t]);
                    if a == 0.0 && m == 0.0 {
                        continue;
                    }
                    for (i, w) in c.vw.row_f64(j).enumerate() {
                        oref[t * d + i] += a * w;
                        omag[t * d + i] += (a.abs() + m) * w.abs();
                    }
                }
            }
            assert_close(&o, &oref, &omag, rel, &format!("{what} out"));
        }
    }
}

#[test]
fn invalid_arguments_fill_dst_with_nan() {
    let mut rng = Rng::new(36);
    let (d, r, f, n) = (16, 4, 9, 2);
    let (c, _, _) = op_case(&mut rng, RowType::F32, d, r, f, n, 3, 212);
    let params = &*c.params as *const OpParams;
    let s = c.ggml.f32_tensor(f, n, &[0.5; 18]);
    let fused_op =
        |p: usize, args: &mut [*mut llama_cpp_sys_2::ggml_tensor], userdata: *const OpParams| {
            let t = c.ggml.custom(&[d, n, p], args, spark_ffn_fused, userdata);
            for ith in 0..2 {
                // SAFETY: t is a live custom-op tensor; the op validates its sources and the
                // parameters stored in it (ggml's userdata, given here, is not read).
                unsafe { spark_ffn_fused(t, ith, 2, params as *mut _) };
            }
            c.ggml.read(t)
        };
    // More chunks than neurons.
    assert!(fused_op(f + 1, &mut [s, c.h, c.k2, c.v], params)
        .iter()
        .all(|x| x.is_nan()));
    // No parameters stored in the node.
    assert!(fused_op(3, &mut [s, c.h, c.k2, c.v], std::ptr::null())
        .iter()
        .all(|x| x.is_nan()));
    // V in K2's place (wrong width).
    assert!(fused_op(3, &mut [s, c.h, c.k2, c.k2], params)
        .iter()
        .all(|x| x.is_nan()));
    // Scores of the wrong length (F + 1).
    let s_bad = c.ggml.f32_tensor(f + 1, n, &[0.5; 20]);
    assert!(fused_op(3, &mut [s_bad, c.h, c.k2, c.v], params)
        .iter()
        .all(|x| x.is_nan()));
    // The sum with a dst that does not match its partials.
    let partials = c.ggml.f32_tensor(d, n * 3, &[1.0; 96]);
    let out = c
        .ggml
        .custom(&[d + 1, n], &mut [partials], spark_ffn_sum, params);
    // SAFETY: out is a live custom-op tensor; the op validates its source.
    unsafe { spark_ffn_sum(out, 0, 1, std::ptr::null_mut()) };
    assert!(c.ggml.read(out).iter().all(|x| x.is_nan()));
}

#[test]
fn chunks_cover_every_neuron_once_in_order() {
    for f in [1usize, 2, 15, 16, 17, 255, 13824] {
        for p in [1, 3, tiling::default_chunks(f), f] {
            let mut next = 0;
            for c in 0..p {
                let r = fused::chunk_neurons(f, p, c);
                assert_eq!(r.start, next, "F={f} P={p} chunk {c}");
                assert!(r.len() >= f / p && r.len() <= f.div_ceil(p));
                next = r.end;
            }
            assert_eq!(next, f);
            assert!(fused::chunk_neurons(f, p, p).is_empty());
        }
    }
}

#[test]
fn sum_partials_adds_in_chunk_order() {
    // 1e8 + 1 - 1e8 in f32 is 0 in this order, 1 in another: the order is fixed.
    let partials = [1e8f32, 1.0, -1e8];
    let mut out = [f32::NAN];
    fused::sum_partials(&partials, 1, 0..1, &mut out).unwrap();
    assert_eq!(out[0], 0.0);
    assert!(fused::sum_partials(&partials, 2, 0..1, &mut out).is_err());
    assert!(fused::sum_partials(&partials, 1, 0..2, &mut out).is_err());
}
