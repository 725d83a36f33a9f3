//! The sparse attention kernel against a float64 reference of SPEC.md section 4, on random cases
//! in llama.cpp's KV-cache layouts; thread-count and batch invariance; edge cases.

mod attention_helpers;

use attention_helpers::{reference_output, reference_row, Case, MaskKind, Spec, Ty};
use spark_backend::attention::{AttnCall, SparseAttention};
use spark_backend::params::AttnParams;
use spark_backend::rows::quant::quantize_rows;
use spark_backend::rows::{to_f32, Row, RowType};
use spark_backend::tensor::TensorView;
use std::collections::BTreeMap;

type Selections = BTreeMap<(usize, usize, usize), Vec<u32>>;

/// Runs the kernel as `nth` threads (sequentially, with the work units the op cuts for `nth`
/// threads) and returns dst and every row's selection.
fn run_case(case: &mut Case, params: &AttnParams, nth: usize) -> (Vec<f32>, Selections) {
    let mut out = vec![f32::from_bits(0x7fc0_dead); case.out_len()];
    let op = case
        .sparse_attention(&mut out, params)
        .expect("valid case")
        .with_threads(nth);
    let mut sel = Selections::new();
    for ith in 0..nth {
        // SAFETY: the views point into the case's buffers and `out`, alive for this call.
        unsafe {
            op.run_observed(ith, nth, &mut |r| {
                assert!(
                    sel.insert((r.stream, r.token, r.head), r.positions.to_vec())
                        .is_none(),
                    "row computed twice"
                );
            })
        };
    }
    (out, sel)
}

/// Outcome of comparing one case with the reference.
#[derive(Default, Debug)]
struct Agreement {
    rows: usize,
    sparse_rows: usize,
    near_threshold_differences: usize,
}

/// Checks every row: the kernel's selection equals the reference's except for positions whose
/// reference score is within rounding of the threshold; the output equals the f64 formula
/// evaluated on the kernel's own selection to float tolerance.
fn check_against_reference(case: &mut Case) -> Agreement {
    let params = case.spec.params();
    let (out, sel) = run_case(case, &params, 1);
    let spec = case.spec;
    let mut agree = Agreement::default();
    for s in 0..spec.n_stream {
        for t in 0..spec.n_tokens {
            for n in 0..spec.n_head {
                let want = reference_row(case, s, t, n);
                let got = &sel[&(s, t, n)];
                agree.rows += 1;
                if want.kept.len() < want.valid.len() {
                    agree.sparse_rows += 1;
                }
                if got != &want.kept {
                    let theta = want.theta.unwrap_or_else(|| {
                        panic!("{spec:?} row {t}/{n}: |C| <= k yet sets differ")
                    });
                    let tol = 1e-4 * (1.0 + theta.abs());
                    let score =
                        |j: u32| want.s1[want.valid.iter().position(|&x| x == j).expect("valid")];
                    let mx = want.s1.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    for j in got
                        .iter()
                        .filter(|j| !want.kept.contains(j))
                        .chain(want.kept.iter().filter(|j| !got.contains(j)))
                    {
                        let sj = score(*j);
                        // A difference is legitimate only at the threshold (or at the max when
                        // the fallback "keep the max" is in play near it).
                        assert!(
                            (sj - theta).abs() < tol || ((mx - theta).abs() < tol && sj == mx),
                            "{spec:?} row s{s} t{t} n{n}: position {j} score {sj} far from theta {theta}"
                        );
                        agree.near_threshold_differences += 1;
                    }
                }
                let (o_ref, mag) = reference_output(case, s, t, n, got);
                let max_mag = mag.iter().copied().fold(0.0, f64::max);
                let base = ((s * spec.n_tokens + t) * spec.n_head + n) * spec.h;
                for i in 0..spec.h {
                    let o = f64::from(out[base + i]);
                    let tol = 2e-5 * mag[i] + 2e-6 * max_mag + 1e-12;
                    assert!(
                        (o - o_ref[i]).abs() <= tol,
                        "{spec:?} row s{s} t{t} n{n} dim {i}: kernel {o} reference {} (tol {tol})",
                        o_ref[i]
                    );
                }
            }
        }
    }
    agree
}

#[test]
fn matches_reference_on_odd_shapes_and_layouts() {
    let mut total = Agreement::default();
    let mut seed = 10;
    // (H, r): r and H - r even, as SPEC requires; odd multiples of 8 and tails on purpose.
    let dims = [(10usize, 4usize), (18, 8), (40, 18), (64, 32), (130, 66)];
    let groups = [(1usize, 1usize), (2, 1), (4, 2), (8, 2)];
    for (ci, &n_kv) in [1usize, 7, 31, 33, 255, 1000].iter().enumerate() {
        for (di, &(h, r)) in dims.iter().enumerate() {
            let (n_head, n_head_kv) = groups[(ci + di) % groups.len()];
            let n_tokens = [1usize, 3, 5][(ci + di) % 3].min(n_kv);
            let mut spec = Spec::new(h, r, n_head, n_head_kv, n_tokens, n_kv);
            spec.seed = seed;
            seed += 1;
            spec.k_ty = if (ci + di) % 2 == 0 { Ty::F16 } else { Ty::F32 };
            spec.v_ty = if (ci + di) % 3 == 0 { Ty::F32 } else { Ty::F16 };
            spec.v_transposed = (ci + di) % 4 == 1;
            spec.mask_ty = if di % 2 == 0 { Ty::F32 } else { Ty::F16 };
            spec.mask = match (ci + 2 * di) % 4 {
                0 => MaskKind::Causal,
                1 => MaskKind::Sliding(1 + n_kv / 3),
                2 => MaskKind::Holes(0.6),
                _ => MaskKind::Full,
            };
            spec.softcap = if di == 2 { 0.0 } else { 50.0 };
            spec.q_scale = [1.0, 4.0, 20.0][di % 3];
            // k below |C| (sparse) and at or above it (dense).
            for k_keep in [1 + n_kv as i32 / 8, 3, n_kv as i32, n_kv as i32 + 5] {
                spec.k_keep = k_keep.max(1);
                let mut case = Case::build(spec);
                let a = check_against_reference(&mut case);
                total.rows += a.rows;
                total.sparse_rows += a.sparse_rows;
                total.near_threshold_differences += a.near_threshold_differences;
            }
        }
    }
    assert!(total.rows > 900, "{total:?}");
    assert!(
        total.sparse_rows * 3 > total.rows,
        "too few sparse rows: {total:?}"
    );
    assert!(
        total.near_threshold_differences * 100 < total.rows,
        "too many disagreements: {total:?}"
    );
}

#[test]
fn gemma_shapes_match_reference() {
    for (n_kv, n_tokens, mask) in [
        (300usize, 2usize, MaskKind::Causal),
        (520, 4, MaskKind::Sliding(256)),
    ] {
        let mut spec = Spec::new(256, 128, 8, 4, n_tokens, n_kv);
        spec.k_keep = 64;
        spec.mask = mask;
        spec.q_scale = 6.0;
        spec.seed = n_kv as u64;
        let a = check_against_reference(&mut Case::build(spec));
        assert_eq!(a.sparse_rows, a.rows);
    }
}

#[test]
fn several_streams_use_their_own_cache_and_mask() {
    let mut spec = Spec::new(18, 8, 4, 2, 3, 40);
    spec.n_stream = 2;
    spec.mask = MaskKind::Holes(0.5);
    spec.k_keep = 5;
    spec.q_scale = 4.0;
    let a = check_against_reference(&mut Case::build(spec));
    assert_eq!(a.rows, 2 * 3 * 4);
}

/// Query heads per work unit of `case` cut for `nth` threads.
fn heads_per_unit(case: &mut Case, nth: usize) -> usize {
    let mut out = vec![0f32; case.out_len()];
    let params = case.spec.params();
    let op = case
        .sparse_attention(&mut out, &params)
        .expect("valid case");
    op.with_threads(nth).tiling().heads_per_unit()
}

#[test]
fn output_is_bit_identical_for_any_thread_count() {
    for (i, (h, r, n_head, n_head_kv, n_tokens, n_kv)) in [
        (64usize, 32usize, 8usize, 4usize, 9usize, 333usize),
        (18, 8, 4, 1, 13, 100),
        (40, 18, 2, 2, 1, 77),
        (64, 32, 8, 4, 1, 300),
    ]
    .into_iter()
    .enumerate()
    {
        let mut spec = Spec::new(h, r, n_head, n_head_kv, n_tokens, n_kv);
        spec.k_keep = 9;
        spec.mask = if i == 1 {
            MaskKind::Holes(0.7)
        } else {
            MaskKind::Causal
        };
        spec.seed = 100 + i as u64;
        let mut case = Case::build(spec);
        let params = spec.params();
        let (serial, sel1) = run_case(&mut case, &params, 1);
        assert!(serial.iter().all(|x| x.is_finite()));
        if n_head > n_head_kv {
            // Both tilings are compared: whole KV groups per unit on one thread, single query
            // heads when 7 threads would find fewer than two group units each.
            let (one, seven) = (heads_per_unit(&mut case, 1), heads_per_unit(&mut case, 7));
            assert_eq!((one, seven), (n_head / n_head_kv, 1), "{spec:?}");
        }
        for nth in [2usize, 3, 7] {
            let (par, sel) = run_case(&mut case, &params, nth);
            assert_eq!(sel, sel1);
            let same = serial
                .iter()
                .zip(&par)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{spec:?}: nth = {nth} differs from serial");
        }
    }
}

#[test]
fn each_token_gets_the_same_bits_alone_as_in_a_batch() {
    let mut spec = Spec::new(40, 18, 4, 2, 6, 90);
    spec.k_keep = 7;
    spec.mask = MaskKind::Holes(0.8);
    let mut case = Case::build(spec);
    let params = spec.params();
    let (batch, _) = run_case(&mut case, &params, 1);
    let row_len = spec.h * spec.n_head;
    for t in 0..spec.n_tokens {
        let mut q = case.q_view();
        q.ne[2] = 1;
        q.data = q.data.wrapping_add(t * q.nb[2]);
        let mut mask = case.mask_view();
        mask.ne[1] = 1;
        mask.data = mask.data.wrapping_add(t * mask.nb[1]);
        let (k, v) = (case.k_view(), case.v_view());
        let mut out = vec![0f32; row_len];
        let mut dst = case.dst_view(&mut vec![0f32; case.out_len()]);
        dst.ne[2] = 1;
        dst.data = out.as_mut_ptr().cast();
        let call = AttnCall { q, k, v, mask, dst };
        let op = SparseAttention::new(&call, &params).unwrap();
        // SAFETY: views into the case's buffers (offset to token t) and `out`.
        unsafe { op.run_observed(0, 1, &mut |_| {}) };
        let want = &batch[t * row_len..(t + 1) * row_len];
        assert!(
            want.iter()
                .zip(&out)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "token {t}"
        );
    }
}

#[test]
fn transposed_value_cache_gives_identical_output() {
    for v_ty in [Ty::F16, Ty::F32] {
        let mut spec = Spec::new(40, 18, 4, 2, 3, 150);
        spec.v_ty = v_ty;
        spec.k_keep = 20;
        let params = spec.params();
        let (plain, _) = run_case(&mut Case::build(spec), &params, 1);
        spec.v_transposed = true;
        let (trans, _) = run_case(&mut Case::build(spec), &params, 1);
        assert!(
            plain
                .iter()
                .zip(&trans)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{v_ty:?}"
        );
    }
}

#[test]
fn a_single_valid_position_gets_all_the_weight() {
    let mut spec = Spec::new(18, 8, 2, 1, 1, 50);
    spec.mask = MaskKind::Sliding(1);
    spec.k_keep = 1;
    let mut case = Case::build(spec);
    let (out, sel) = run_case(&mut case, &spec.params(), 1);
    for n in 0..2 {
        assert_eq!(sel[&(0, 0, n)], vec![49]);
        let (want, _) = reference_output(&case, 0, 0, n, &[49]);
        for i in 0..spec.h {
            assert!(
                (f64::from(out[n * spec.h + i]) - want[i]).abs() < 1e-6 * (1.0 + want[i].abs())
            );
        }
    }
}

#[test]
fn constant_scores_keep_every_position_without_nan() {
    let mut spec = Spec::new(18, 8, 2, 1, 2, 64);
    spec.k_keep = 5;
    let mut case = Case::build(spec);
    // q1 = 0: every first-part score is 0, the deviation is 0, nothing exceeds theta, and the
    // attention form keeps every maximal entry, i.e. all of C.
    for row in case.q.chunks_mut(spec.h) {
        row[..spec.r].fill(0.0);
    }
    let (out, sel) = run_case(&mut case, &spec.params(), 1);
    assert!(out.iter().all(|x| x.is_finite()));
    for t in 0..2 {
        for n in 0..2 {
            assert_eq!(sel[&(0, t, n)], case.valid_list(0, t));
            let (want, _) = reference_output(&case, 0, t, n, &sel[&(0, t, n)]);
            let base = (t * 2 + n) * spec.h;
            for i in 0..spec.h {
                assert!((f64::from(out[base + i]) - want[i]).abs() < 1e-5 * (1.0 + want[i].abs()));
            }
        }
    }
}

#[test]
fn k_at_least_valid_count_keeps_all_valid_positions() {
    let mut spec = Spec::new(10, 4, 2, 2, 4, 30);
    spec.mask = MaskKind::Holes(0.5);
    for k_keep in [30, 31, 1000] {
        spec.k_keep = k_keep;
        let mut case = Case::build(spec);
        let (_, sel) = run_case(&mut case, &spec.params(), 1);
        for ((_, t, _), kept) in &sel {
            assert_eq!(kept, &case.valid_list(0, *t));
        }
        check_against_reference(&mut case);
    }
}

#[test]
fn a_fully_masked_row_gives_zeros() {
    let mut spec = Spec::new(18, 8, 2, 1, 2, 20);
    spec.mask_ty = Ty::F16;
    let mut case = Case::build(spec);
    // Mask every position of token 1 (f16 -inf = 0xfc00).
    for j in 0..spec.n_kv {
        let off = j * case.mask_nb[0] + case.mask_nb[1];
        case.mask[off..off + 2].copy_from_slice(&0xfc00u16.to_le_bytes());
    }
    let (out, sel) = run_case(&mut case, &spec.params(), 1);
    assert!(sel[&(0, 1, 0)].is_empty() && sel[&(0, 1, 1)].is_empty());
    assert!(out[2 * spec.h..].iter().all(|&x| x == 0.0));
    assert!(out[..2 * spec.h].iter().any(|&x| x != 0.0));
}

#[test]
fn non_finite_queries_do_not_disturb_other_rows() {
    let mut spec = Spec::new(40, 18, 4, 2, 3, 120);
    spec.k_keep = 10;
    let mut case = Case::build(spec);
    let params = spec.params();
    let (clean, _) = run_case(&mut case, &params, 1);
    let poison = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY];
    for (row, &bad) in [(1usize, 0usize), (4, 5), (9, 20)].iter().zip(&poison) {
        case.q[row.0 * spec.h + row.1] = bad;
    }
    // A whole row of NaN as well.
    case.q[2 * spec.h..3 * spec.h].fill(f32::NAN);
    let (dirty, _) = run_case(&mut case, &params, 3);
    for r in 0..spec.n_head * spec.n_tokens {
        if [1usize, 2, 4, 9].contains(&r) {
            continue;
        }
        let (a, b) = (
            &clean[r * spec.h..(r + 1) * spec.h],
            &dirty[r * spec.h..(r + 1) * spec.h],
        );
        assert!(
            a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()),
            "row {r} changed"
        );
    }
}

#[test]
fn run_records_statistics() {
    let mut spec = Spec::new(18, 8, 4, 2, 3, 64);
    spec.k_keep = 6;
    let mut case = Case::build(spec);
    let params = AttnParams {
        layer: 201,
        ..spec.params()
    };
    let mut out = vec![0f32; case.out_len()];
    let op = case.sparse_attention(&mut out, &params).unwrap();
    let before = spark_backend::stats::snapshot(201).unwrap();
    let mut kept = 0u64;
    for ith in 0..2 {
        // SAFETY: views into live buffers.
        let tally = unsafe { op.run(ith, 2) };
        kept += tally.kept;
    }
    let after = spark_backend::stats::snapshot(201).unwrap();
    assert_eq!(after.attn_queries - before.attn_queries, 12);
    assert_eq!(after.attn_kept - before.attn_kept, kept);
    assert!(kept > 0 && kept < 12 * 64);
}

/// The K and V bytes of `case` (f32 caches) quantized to `ty` row by row, and `case` itself
/// rewritten to hold the quantized values converted back to f32 (buffers and the reference's
/// exact values): what a block-typed cache stores, and an f32 cache of the same values.
fn quantize_case_caches(case: &mut Case, ty: RowType) -> (Vec<u8>, Vec<u8>) {
    let Spec {
        h,
        n_head_kv: kv,
        n_kv,
        n_stream: ns,
        spare_cells,
        ..
    } = case.spec;
    let cells = n_kv + spare_cells;
    let quantize = |buf: &mut Vec<u8>, exact: &mut Vec<f64>| -> Vec<u8> {
        let x: Vec<f32> = buf
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let q = quantize_rows(ty, &x, h).expect("whole blocks");
        let row = ty.row_bytes(h).expect("whole blocks");
        let mut back = vec![0f32; x.len()];
        for (bytes, out) in q.chunks_exact(row).zip(back.chunks_exact_mut(h)) {
            to_f32(Row::new(ty, h, bytes).expect("one row"), out);
        }
        *buf = back.iter().flat_map(|v| v.to_le_bytes()).collect();
        for s in 0..ns {
            for j in 0..n_kv {
                for g in 0..kv {
                    let from = ((s * cells + j) * kv + g) * h;
                    let to = ((s * kv + g) * n_kv + j) * h;
                    for i in 0..h {
                        exact[to + i] = f64::from(back[from + i]);
                    }
                }
            }
        }
        q
    };
    let kq = quantize(&mut case.k, &mut case.k_exact);
    let vq = quantize(&mut case.v, &mut case.v_exact);
    (kq, vq)
}

/// Issue 56: a cache of any block type ggml offers for K and V (bf16, q8_0, q4_0, q4_1, q5_0,
/// q5_1, iq4_nl) gives the bits of an f32 cache holding its values converted back (which
/// matches the float64 reference), for any thread count, in decode and prefill shapes.
#[test]
fn block_typed_caches_read_as_the_f32_cache_of_their_values() {
    use RowType::*;
    for (n_tokens, n_kv) in [(1usize, 300usize), (6, 140)] {
        for ty in [Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Iq4Nl, Bf16] {
            let mut spec = Spec::new(64, 32, 4, 2, n_tokens, n_kv);
            spec.k_ty = Ty::F32;
            spec.v_ty = Ty::F32;
            spec.k_keep = 24;
            spec.seed = 56;
            let mut case = Case::build(spec);
            let (mut kq, mut vq) = quantize_case_caches(&mut case, ty);
            let agree = check_against_reference(&mut case);
            assert!(agree.sparse_rows > 0, "{ty:?}: {agree:?}");
            let params = spec.params();
            let (want, _) = run_case(&mut case, &params, 1);
            let row = ty.row_bytes(spec.h).expect("whole blocks");
            let cells = n_kv + spec.spare_cells;
            let nb = [ty.block_bytes(), row, row * 2, row * 2 * cells];
            let ne = [spec.h, spec.n_head_kv, n_kv, 1];
            for nth in [1, 3] {
                let mut out = vec![f32::NAN; case.out_len()];
                let call = AttnCall {
                    q: case.q_view(),
                    k: TensorView {
                        ty: ty.ggml(),
                        ne,
                        nb,
                        data: kq.as_mut_ptr(),
                    },
                    v: TensorView {
                        ty: ty.ggml(),
                        ne,
                        nb,
                        data: vq.as_mut_ptr(),
                    },
                    mask: case.mask_view(),
                    dst: case.dst_view(&mut out),
                };
                let op = SparseAttention::new(&call, &params)
                    .expect("a block cache of whole blocks")
                    .with_threads(nth);
                for ith in 0..nth {
                    // SAFETY: the views point into the case's buffers, kq, vq and out, alive here.
                    unsafe { op.run(ith, nth) };
                }
                assert!(
                    out.iter()
                        .zip(&want)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{ty:?} T {n_tokens} nth {nth}: differs from the f32 cache of its values"
                );
            }
        }
    }
}
