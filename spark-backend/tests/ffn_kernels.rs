//! The sparse FFN stages and the ggml ops against a float64 reference of SPEC 4, for every
//! weight type, odd shapes and batches; thread-count independence; the full ggml graph;
//! errors surfacing as NaN.

mod ffn_helpers;

use ffn_helpers::{
    assert_close, batch, op_case, ref_down, ref_scores, ref_up, up_scale, with_ffn_weights, OpCase,
    Rng, Weights,
};
use spark_backend::ffn::cpu_ops::{spark_ffn_down, spark_ffn_up};
use spark_backend::ffn::{self, two_stage, Scratch, UpInputs};
use spark_backend::params::OpParams;
use spark_backend::rows::{quant, RowType};
use spark_backend::stats;
use spark_backend::topk::Cutoff;

/// (D, r_f, F) shapes per weight type: quantized rows need whole blocks.
fn shapes(ty: RowType) -> Vec<(usize, usize, usize)> {
    match ty.block_elems() {
        1 => vec![
            (2, 1, 1),
            (7, 3, 31),
            (33, 17, 7),
            (40, 9, 255),
            (300, 100, 1000),
        ],
        32 => vec![(64, 32, 7), (96, 32, 33), (160, 64, 255)],
        _ => vec![(512, 256, 33), (768, 256, 31)],
    }
}

/// `gelu_tanh` against the float64 formula of SPEC.md on a grid from -12 to 12 (the activated
/// values are `s - theta > 0`; the dense path also sees negative scores), and its limits.
#[test]
fn gelu_matches_float64_and_its_limits() {
    for i in -2400..=2400 {
        let x = i as f32 * 0.005;
        let (got, want) = (
            f64::from(ffn::gelu_tanh(x)),
            ffn_helpers::ref_gelu(f64::from(x)),
        );
        // A few f32 roundings of the result, plus the f32 rounding of the argument's cube
        // term where the curve is steep around its minimum.
        let tol = 4e-7 * want.abs() + 1e-7 * f64::from(x).abs() + 1e-12;
        assert!(
            (got - want).abs() <= tol,
            "gelu({x}) = {got}, float64 {want}"
        );
    }
    assert_eq!(ffn::gelu_tanh(f32::INFINITY), f32::INFINITY);
    assert_eq!(ffn::gelu_tanh(f32::NEG_INFINITY), 0.0);
    assert_eq!(ffn::gelu_tanh(0.0), 0.0);
    assert_eq!(ffn::gelu_tanh(-80.0), 0.0);
    assert_eq!(ffn::gelu_tanh(80.0), 80.0);
    assert!(ffn::gelu_tanh(f32::NAN).is_nan());
}

#[test]
fn stages_match_float64_for_every_type_and_shape() {
    let mut rng = Rng::new(21);
    for ty in RowType::ALL {
        for (d, r, f) in shapes(ty) {
            for n_tokens in [1usize, 3] {
                let k1 = Weights::random(&mut rng, ty, r, f, 0.3);
                let k2 = Weights::random(&mut rng, ty, d - r, f, 0.3);
                let v = Weights::random(&mut rng, ty, d, f, 0.3);
                let h = rng.normals(n_tokens * d, 1.0);
                let k = (f / 10).max(1);
                let what = format!("{ty:?} D={d} r={r} F={f} T={n_tokens}");

                // Stage 1: scores.
                let mut scores = vec![0f32; n_tokens * f];
                ffn::predictor_scores(&k1.matrix(), &batch(&h, d, n_tokens), &mut scores).unwrap();
                let want = ref_scores(&h, d, n_tokens, &k1);
                let k1abs = Weights {
                    values: k1.values.iter().map(|v| v.abs()).collect(),
                    bytes: Vec::new(),
                    ..k1
                };
                let habs: Vec<f32> = h.iter().map(|v| v.abs()).collect();
                let mag = ref_scores(&habs, d, n_tokens, &k1abs);
                // Quantized rows also quantize the activation (~1% of a block's max per element).
                let rel = if ty.is_quantized() { 2e-2 } else { 1e-5 };
                assert_close(&scores, &want, &mag, rel, &format!("{what} scores"));

                // Stage 2 on our scores (same selection as the reference by construction).
                let mut u = vec![0f32; n_tokens * f];
                let mut sc = Scratch::new();
                two_stage::up_range(
                    &UpInputs {
                        scores: &scores,
                        batch: batch(&h, d, n_tokens),
                        k2: &k2.matrix(),
                        cutoff: Cutoff::TopK(k),
                    },
                    0..f,
                    &mut u,
                    &mut sc,
                )
                .unwrap();
                let want = ref_up(&scores, &h, d, n_tokens, &k2, k);
                let mag = up_scale(&scores, &h, d, n_tokens, &k2, k);
                assert_close(&u, &want, &mag, rel, &format!("{what} u"));
                assert!(
                    u.iter().zip(&want).all(|(&a, &b)| (a == 0.0) == (b == 0.0)),
                    "{what}: masks differ"
                );

                // Stage 3 on our u.
                let mut out = vec![0f32; n_tokens * d];
                {
                    let mut rows: Vec<&mut [f32]> = out.chunks_mut(d).collect();
                    two_stage::down_range(&u, &v.matrix(), 0..d, &mut rows, &mut sc).unwrap();
                }
                let want = ref_down(&u, n_tokens, &v);
                let uabs: Vec<f32> = u.iter().map(|x| x.abs()).collect();
                let vabs = Weights {
                    values: v.values.iter().map(|x| x.abs()).collect(),
                    bytes: Vec::new(),
                    ..v
                };
                let mag = ref_down(&uabs, n_tokens, &vabs);
                assert_close(&out, &want, &mag, 1e-5, &format!("{what} out"));
            }
        }
    }
}

#[test]
fn serial_ffn_matches_float64_end_to_end_for_f32() {
    // f32 weights: the f32 scores are close enough to float64 that the selection agrees.
    let mut rng = Rng::new(22);
    for (d, r, f, n_tokens, k) in [
        (7, 3, 31, 2, 3),
        (64, 16, 255, 3, 20),
        (300, 100, 1000, 2, 80),
    ] {
        let k1 = Weights::random(&mut rng, RowType::F32, r, f, 0.3);
        let k2 = Weights::random(&mut rng, RowType::F32, d - r, f, 0.3);
        let v = Weights::random(&mut rng, RowType::F32, d, f, 0.3);
        let h = rng.normals(n_tokens * d, 1.0);
        let mut out = vec![0f32; n_tokens * d];
        let kept = with_ffn_weights(&k1, &k2, &v, Cutoff::TopK(k), |w| {
            two_stage::sparse_ffn(&batch(&h, d, n_tokens), w, &mut out)
        })
        .unwrap();
        // Reference entirely in f64 from h.
        let s64 = ref_scores(&h, d, n_tokens, &k1);
        let mut want = vec![0f64; n_tokens * d];
        let mut want_kept = 0;
        for t in 0..n_tokens {
            let s = &s64[t * f..(t + 1) * f];
            let mean = s.iter().sum::<f64>() / f as f64;
            let sd = (s.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (f as f64 - 1.0)).sqrt();
            let theta = mean + sd * spark_backend::topk::norm_ppf(1.0 - k as f64 / f as f64);
            for (j, &sj) in s.iter().enumerate() {
                if sj > theta {
                    want_kept += 1;
                    let a = ffn_helpers::ref_gelu(sj - theta);
                    let dot: f64 = k2
                        .row_f64(j)
                        .zip(&h[t * d + r..(t + 1) * d])
                        .map(|(w, &x)| w * f64::from(x))
                        .sum();
                    for (o, w) in want[t * d..(t + 1) * d].iter_mut().zip(v.row_f64(j)) {
                        *o += a * dot * w;
                    }
                }
            }
        }
        assert_eq!(kept, want_kept);
        let scale = want.iter().fold(0f64, |m, x| m.max(x.abs()));
        for (g, w) in out.iter().zip(&want) {
            assert!((f64::from(*g) - w).abs() <= 1e-4 * scale, "{g} vs {w}");
        }
    }
}

#[test]
fn dense_when_k_at_least_f_and_inactive_rows_are_skipped() {
    let mut rng = Rng::new(23);
    let (d, r, f) = (16, 4, 9);
    let k1 = Weights::random(&mut rng, RowType::F32, r, f, 1.0);
    let k2 = Weights::random(&mut rng, RowType::F32, d - r, f, 1.0);
    let v = Weights::random(&mut rng, RowType::F32, d, f, 1.0);
    let h = rng.normals(d, 1.0);
    let mut scores = vec![0f32; f];
    ffn::predictor_scores(&k1.matrix(), &batch(&h, d, 1), &mut scores).unwrap();
    let mut u = vec![0f32; f];
    let kept = two_stage::up_range(
        &UpInputs {
            scores: &scores,
            batch: batch(&h, d, 1),
            k2: &k2.matrix(),
            cutoff: Cutoff::TopK(f),
        },
        0..f,
        &mut u,
        &mut Scratch::new(),
    )
    .unwrap();
    assert_eq!(kept, f as u64, "k >= F keeps every neuron");
    for j in 0..f {
        let dot: f64 = k2
            .row_f64(j)
            .zip(&h[r..])
            .map(|(w, &x)| w * f64::from(x))
            .sum();
        let want = ffn_helpers::ref_gelu(f64::from(scores[j])) * dot;
        assert!((f64::from(u[j]) - want).abs() < 1e-5 * (1.0 + want.abs()));
    }
    // A V row full of NaN is never read when its neuron is inactive.
    let mut vbad = v.values.clone();
    let mut u2 = u.clone();
    u2[4] = 0.0;
    vbad[4 * d..5 * d].fill(f32::NAN);
    let vb = quant::quantize_rows(RowType::F32, &vbad, d).unwrap();
    let vm = spark_backend::rows::RowMatrix::packed(RowType::F32, d, f, &vb).unwrap();
    let mut out = vec![0f32; d];
    two_stage::down_range(&u2, &vm, 0..d, &mut [&mut out[..]], &mut Scratch::new()).unwrap();
    assert!(out.iter().all(|x| x.is_finite()));
}

/// Runs the ops directly for every ith of a simulated nth, in sequence.
fn run_ops_simulated(c: &OpCase, s: &[f32], nth: i32) -> (Vec<f32>, Vec<f32>) {
    // SAFETY: c.h is a live tensor of c.ggml.
    let (d, n_tokens) = unsafe { ((*c.h).ne[0] as usize, (*c.h).ne[1] as usize) };
    let f = s.len() / n_tokens;
    let st = c.ggml.f32_tensor(f, n_tokens, s);
    let params = &*c.params as *const OpParams;
    let u = c
        .ggml
        .custom(&[n_tokens, f], &mut [st, c.h, c.k2], spark_ffn_up, params);
    let out = c
        .ggml
        .custom(&[d, n_tokens], &mut [u, c.v], spark_ffn_down, params);
    for ith in 0..nth {
        // SAFETY: u is a custom-op tensor of this context with the INTERFACES.md sources.
        unsafe { spark_ffn_up(u, ith, nth, params as *mut _) };
    }
    for ith in (0..nth).rev() {
        // SAFETY: as above.
        unsafe { spark_ffn_down(out, ith, nth, std::ptr::null_mut()) };
    }
    (c.ggml.read(u), c.ggml.read(out))
}

#[test]
fn ops_are_bit_identical_for_any_thread_count() {
    let mut rng = Rng::new(24);
    for ty in RowType::ALL {
        let (d, r, f) = *shapes(ty).last().unwrap();
        for n_tokens in [1usize, 5] {
            let (c, [k1, ..], h) = op_case(&mut rng, ty, d, r, f, n_tokens, (f / 8) as i32, 200);
            let mut s = vec![0f32; n_tokens * f];
            ffn::predictor_scores(&k1.matrix(), &batch(&h, d, n_tokens), &mut s).unwrap();
            let (u1, o1) = run_ops_simulated(&c, &s, 1);
            assert!(o1.iter().all(|x| x.is_finite()) && o1.iter().any(|&x| x != 0.0));
            for nth in [2, 3, 7] {
                let (u, o) = run_ops_simulated(&c, &s, nth);
                assert!(
                    u.iter().zip(&u1).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{ty:?} T={n_tokens} nth={nth}: u differs"
                );
                assert!(
                    o.iter().zip(&o1).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{ty:?} T={n_tokens} nth={nth}: out differs"
                );
            }
            // And equal to the library's serial stages.
            let mut u = vec![0f32; n_tokens * f];
            two_stage::up_range(
                &UpInputs {
                    scores: &s,
                    batch: batch(&h, d, n_tokens),
                    k2: &k1_k2(&c, ty, d, r, f),
                    cutoff: Cutoff::TopK((f / 8).max(1)),
                },
                0..f,
                &mut u,
                &mut Scratch::new(),
            )
            .unwrap();
            assert_eq!(u, u1);
        }
    }
}

fn k1_k2(
    c: &OpCase,
    ty: RowType,
    d: usize,
    r: usize,
    f: usize,
) -> spark_backend::rows::RowMatrix<'_> {
    // SAFETY: k2 is a live tensor of c.ggml holding f rows of d - r elements.
    let bytes = unsafe {
        std::slice::from_raw_parts(
            (*c.k2).data.cast::<u8>(),
            llama_cpp_sys_2::ggml_nbytes(c.k2),
        )
    };
    spark_backend::rows::RowMatrix::packed(ty, d - r, f, bytes).unwrap()
}

#[test]
fn ggml_graph_with_real_threads_matches_reference_and_records_stats() {
    let mut rng = Rng::new(25);
    for ty in [RowType::F32, RowType::F16, RowType::Q8_0, RowType::Q4K] {
        let (d, r, f) = *shapes(ty).last().unwrap();
        let n_tokens = 4;
        let k = (f / 8) as i32;
        let (c, [_, k2, v], h) = op_case(&mut rng, ty, d, r, f, n_tokens, k, 201);
        let [s, u, out] = c.ggml.spark_ffn(c.h, c.k1, c.k2, c.v, &*c.params);
        let g = c.ggml.graph(out);
        let mut results = Vec::new();
        for n_threads in [1, 2, 3] {
            stats::reset();
            c.ggml.compute(g, n_threads);
            let st = stats::snapshot(201).unwrap();
            assert_eq!(st.ffn_tokens, n_tokens as u64);
            assert_eq!(st.ffn_width, f as u64);
            let uv = c.ggml.read(u);
            assert_eq!(st.ffn_kept, uv.iter().filter(|&&x| x != 0.0).count() as u64);
            results.push((c.ggml.read(s), uv, c.ggml.read(out)));
        }
        let (s0, u0, o0) = &results[0];
        for (s1, u1, o1) in &results[1..] {
            if s1 == s0 {
                assert_eq!(u1, u0, "{ty:?}: u depends on the thread count");
                assert_eq!(o1, o0, "{ty:?}: out depends on the thread count");
            }
        }
        // Against float64 given ggml's scores.
        let want_u = ref_up(s0, &h, d, n_tokens, &k2, k as usize);
        let mag = up_scale(s0, &h, d, n_tokens, &k2, k as usize);
        let rel = if ty.is_quantized() { 2e-2 } else { 1e-5 };
        let ut: Vec<f32> = (0..f * n_tokens).map(|i| u0[i]).collect();
        assert_close(&ut, &want_u, &mag, rel, &format!("{ty:?} graph u"));
        let want = ref_down(u0, n_tokens, &v);
        let uabs: Vec<f32> = u0.iter().map(|x| x.abs()).collect();
        let vabs = Weights {
            values: v.values.iter().map(|x| x.abs()).collect(),
            bytes: Vec::new(),
            ..v
        };
        assert_close(
            o0,
            &want,
            &ref_down(&uabs, n_tokens, &vabs),
            1e-5,
            &format!("{ty:?} graph out"),
        );
    }
}

/// Gemma 3n's sparse FFN layers on `spark_ffn_up`: the std-multiplier cutoff (z =
/// 1.6448533535003662 = Q(0.95): ~5 % of the neurons kept) with r_f = 0 (K2 of D columns, over
/// all of h), f32 and q8_0 weights, T = 1 and 7, computed by ggml on 1, 2 and 3 threads. Against
/// an f64 reference from the formula (theta = mean + unbiased std * z of each token's scores,
/// u = gelu_tanh(s - theta) * K2_j . h): the same kept set, ~5 % per token, values to rounding
/// (q8_0: ggml's q8_0 quantization of h, as the other quantized cases); bit-identical for every
/// thread count and to the library's serial stage.
#[test]
fn std_mul_cutoff_over_all_of_h_matches_float64() {
    let mut rng = Rng::new(27);
    let z = f64::from(ffn_helpers::GEMMA3N_STD_MUL);
    assert_eq!(z, 1.644_853_353_500_366_2);
    let (d, f) = (256, 2048);
    for ty in [RowType::F32, RowType::Q8_0] {
        for n_tokens in [1usize, 7] {
            let c = ffn_helpers::std_mul_case(&mut rng, ty, d, f, n_tokens, 203);
            assert_eq!(c.k2w.n_cols, d, "r_f = 0");
            let u = c.ggml.custom(
                &[n_tokens, f],
                &mut [c.s, c.h, c.k2],
                spark_ffn_up,
                &*c.params,
            );
            let g = c.ggml.graph(u);
            let mut runs = Vec::new();
            for n_threads in [1, 2, 3] {
                c.ggml.compute(g, n_threads);
                runs.push(c.ggml.read(u));
            }
            let what = format!("{ty:?} T={n_tokens}");
            for other in &runs[1..] {
                assert!(
                    other
                        .iter()
                        .zip(&runs[0])
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{what}: u depends on the thread count"
                );
            }
            let got = &runs[0];
            // The kept set: s_tj > theta_t of the f64 reference, about 5 % of F per token.
            for t in 0..n_tokens {
                let sc = &c.sv[t * f..(t + 1) * f];
                let (mean, std) = ffn_helpers::ref_mean_std(sc);
                let theta = mean + std * z;
                let want: Vec<usize> = (0..f).filter(|&j| f64::from(sc[j]) > theta).collect();
                let have: Vec<usize> = (0..f).filter(|&j| got[j * n_tokens + t] != 0.0).collect();
                assert_eq!(have, want, "{what} token {t}: kept neurons");
                let frac = want.len() as f64 / f as f64;
                assert!(
                    (0.03..=0.07).contains(&frac),
                    "{what} token {t}: kept {frac}"
                );
            }
            let want = ffn_helpers::ref_up_for(&c.sv, &c.hv, d, n_tokens, &c.k2w, c.cutoff);
            let mag = ffn_helpers::up_scale_for(&c.sv, &c.hv, d, n_tokens, &c.k2w, c.cutoff);
            let rel = if ty.is_quantized() { 2e-2 } else { 1e-5 };
            assert_close(got, &want, &mag, rel, &format!("{what} u"));
            // The library's serial stage gives the op's values bit for bit.
            let mut serial = vec![0f32; n_tokens * f];
            let k2m = c.k2w.matrix();
            let kept = two_stage::up_range(
                &UpInputs {
                    scores: &c.sv,
                    batch: batch(&c.hv, d, n_tokens),
                    k2: &k2m,
                    cutoff: c.cutoff,
                },
                0..f,
                &mut serial,
                &mut Scratch::new(),
            )
            .unwrap();
            assert!(
                serial
                    .iter()
                    .zip(got)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{what}: op differs from the serial stage"
            );
            let nonzero = got.iter().filter(|&&x| x != 0.0).count() as u64;
            assert!(
                kept >= nonzero && kept <= nonzero + 2,
                "{what}: kept {kept}"
            );
            eprintln!(
                "std-mul r_f=0 {what}: kept {nonzero}/{} ({:.2} %)",
                f * n_tokens,
                100.0 * nonzero as f64 / (f * n_tokens) as f64
            );
        }
    }
}

#[test]
fn invalid_arguments_fill_dst_with_nan() {
    let mut rng = Rng::new(26);
    let (c, _, _) = op_case(&mut rng, RowType::F32, 16, 4, 9, 2, 3, 202);
    let params = &*c.params as *const OpParams;
    // Scores of the wrong length (F + 1).
    let st = c.ggml.f32_tensor(10, 2, &[0.5; 20]);
    let u = c
        .ggml
        .custom(&[2, 9], &mut [st, c.h, c.k2], spark_ffn_up, params);
    for ith in 0..2 {
        // SAFETY: u is a live custom-op tensor; the op validates its sources.
        unsafe { spark_ffn_up(u, ith, 2, params as *mut _) };
    }
    assert!(c.ggml.read(u).iter().all(|x| x.is_nan()));
    // k = 0 is invalid.
    let bad = Box::new(OpParams {
        layer: 0,
        k: 0,
        ..Default::default()
    });
    let st = c.ggml.f32_tensor(9, 2, &[0.5; 18]);
    let u = c
        .ggml
        .custom(&[2, 9], &mut [st, c.h, c.k2], spark_ffn_up, &*bad);
    // SAFETY: as above.
    unsafe { spark_ffn_up(u, 0, 1, &*bad as *const OpParams as *mut _) };
    assert!(c.ggml.read(u).iter().all(|x| x.is_nan()));
    // V of the wrong width for dst.
    let out = c
        .ggml
        .custom(&[16, 2], &mut [u, c.k2], spark_ffn_down, params);
    // SAFETY: as above.
    unsafe { spark_ffn_down(out, 0, 1, std::ptr::null_mut()) };
    assert!(c.ggml.read(out).iter().all(|x| x.is_nan()));
    // No parameters stored in the node (ggml's userdata is never read: a pointer given there
    // does not stand in for them).
    let u = c.ggml.custom(
        &[2, 9],
        &mut [st, c.h, c.k2],
        spark_ffn_up,
        std::ptr::null(),
    );
    // SAFETY: as above; userdata is not dereferenced.
    unsafe { spark_ffn_up(u, 0, 1, params as *mut _) };
    assert!(c.ggml.read(u).iter().all(|x| x.is_nan()));
}

#[test]
fn batch_union_loads_each_row_once_and_matches_single_token_calls() {
    // Each token of a batch gets exactly what it gets alone.
    let mut rng = Rng::new(27);
    for ty in [RowType::F16, RowType::Q8_0] {
        let (d, r, f) = (96, 32, 255);
        let n_tokens = 6;
        let k1 = Weights::random(&mut rng, ty, r, f, 0.3);
        let k2 = Weights::random(&mut rng, ty, d - r, f, 0.3);
        let v = Weights::random(&mut rng, ty, d, f, 0.3);
        let h = rng.normals(n_tokens * d, 1.0);
        let mut batched = vec![0f32; n_tokens * d];
        with_ffn_weights(&k1, &k2, &v, Cutoff::TopK(20), |w| {
            two_stage::sparse_ffn(&batch(&h, d, n_tokens), w, &mut batched)
        })
        .unwrap();
        for t in 0..n_tokens {
            let mut one = vec![0f32; d];
            with_ffn_weights(&k1, &k2, &v, Cutoff::TopK(20), |w| {
                two_stage::sparse_ffn(&batch(&h[t * d..(t + 1) * d], d, 1), w, &mut one)
            })
            .unwrap();
            assert_eq!(&batched[t * d..(t + 1) * d], &one[..], "{ty:?} token {t}");
        }
    }
}

#[test]
fn large_batches_tile_the_output_without_changing_any_value() {
    // 300 tokens make down_range split its columns into cache tiles; every token's output must
    // equal its own single-token computation bit for bit.
    let mut rng = Rng::new(28);
    for ty in [RowType::F32, RowType::Q8_0] {
        let (d, f, n_tokens) = (160, 33, 300);
        let v = Weights::random(&mut rng, ty, d, f, 0.3);
        let mut u = vec![0f32; f * n_tokens];
        for x in u.iter_mut() {
            if rng.uniform() < 0.2 {
                *x = rng.normal() as f32;
            }
        }
        let mut batch = vec![0f32; n_tokens * d];
        {
            let mut rows: Vec<&mut [f32]> = batch.chunks_mut(d).collect();
            two_stage::down_range(&u, &v.matrix(), 0..d, &mut rows, &mut Scratch::new()).unwrap();
        }
        for t in 0..n_tokens {
            let ut: Vec<f32> = (0..f).map(|j| u[j * n_tokens + t]).collect();
            let mut one = vec![0f32; d];
            two_stage::down_range(
                &ut,
                &v.matrix(),
                0..d,
                &mut [&mut one[..]],
                &mut Scratch::new(),
            )
            .unwrap();
            assert_eq!(&batch[t * d..(t + 1) * d], &one[..], "{ty:?} token {t}");
        }
    }
}
