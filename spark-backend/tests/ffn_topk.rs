//! Statistical top-k: counts within Theorem 3.1's bound on Gaussian rows, edge cases, and
//! non-finite inputs.

mod ffn_helpers;

use ffn_helpers::{ref_threshold, Rng};
use spark_backend::topk::{attention_keep, mean_std, soft, threshold, threshold_f64};

fn theorem_bound(d: usize, k: usize, delta: f64) -> f64 {
    let (d, k) = (d as f64, k as f64);
    let p = (k / d).min(1.0 - k / d);
    4.0 * ((6.0 / delta).ln() / d).sqrt() * (1.0 + (-2.0 * p.ln()).sqrt()) * d
}

#[test]
fn kept_count_is_within_theorem_bound_on_gaussian_rows() {
    let mut rng = Rng::new(11);
    for (d, k) in [(13824usize, 1106usize), (4096, 256)] {
        let bound = theorem_bound(d, k, 0.01);
        let mut worst = 0usize;
        for trial in 0..20 {
            let scale = 0.5 + trial as f64;
            let shift = trial as f64 * 3.0 - 10.0;
            let x: Vec<f32> = (0..d)
                .map(|_| (rng.normal() * scale + shift) as f32)
                .collect();
            let theta = threshold(&x, k).unwrap();
            let kept = x.iter().filter(|&&v| v > theta).count();
            assert!(
                (kept.abs_diff(k) as f64) <= bound,
                "d={d} k={k}: kept {kept} (bound {bound})"
            );
            worst = worst.max(kept.abs_diff(k));
            let want = ref_threshold(&x, k).unwrap();
            let got = threshold_f64(&x, k).unwrap();
            assert!(
                (got - want).abs() <= 1e-9 * (1.0 + want.abs()),
                "theta {got} vs {want}"
            );
        }
        // Far tighter in practice (a binomial spread of sqrt(k) ~ 33): a sanity check on the
        // statistics themselves, which the loose theorem bound would not catch.
        assert!(
            worst < 8 * (k as f64).sqrt() as usize,
            "d={d} k={k}: worst miss {worst}"
        );
    }
}

#[test]
fn k_at_least_d_is_identity() {
    let x = [3.0f32, -1.0, 2.0];
    assert_eq!(threshold(&x, 3), None);
    assert_eq!(threshold(&x, 10), None);
    let mut out = [0f32; 3];
    soft(&x, 3, &mut out);
    assert_eq!(out, x);
    let mut keep = Vec::new();
    attention_keep(&x, 5, &mut keep);
    assert_eq!(keep, vec![0, 1, 2]);
}

#[test]
fn constant_rows_keep_maxima_in_attention_and_zero_in_ffn() {
    let x = [1.5f32; 40];
    let mut out = [9f32; 40];
    soft(&x, 4, &mut out);
    assert!(out.iter().all(|&v| v == 0.0));
    let mut keep = Vec::new();
    attention_keep(&x, 4, &mut keep);
    assert_eq!(keep.len(), 40);
}

#[test]
fn two_entries() {
    // d = 2, k = 1: mean 0.5, std sqrt(0.5), Q(0.5) = 0: theta = mean.
    let x = [0.0f32, 1.0];
    assert_eq!(threshold(&x, 1), Some(0.5));
    let mut keep = Vec::new();
    attention_keep(&x, 1, &mut keep);
    assert_eq!(keep, vec![1]);
    let mut out = [0f32; 2];
    soft(&x, 1, &mut out);
    assert_eq!(out, [0.0, 0.5]);
}

#[test]
fn soft_matches_float64_reference() {
    let mut rng = Rng::new(12);
    for d in [3usize, 31, 255, 1000] {
        let x = rng.normals(d, 2.0);
        let k = d / 5 + 1;
        let theta = ref_threshold(&x, k).unwrap();
        let mut out = vec![0f32; d];
        soft(&x, k, &mut out);
        for (o, &v) in out.iter().zip(&x) {
            let want = (f64::from(v) - theta).max(0.0);
            assert!((f64::from(*o) - want).abs() <= 1e-6 * (1.0 + f64::from(v).abs()));
        }
    }
}

#[test]
fn non_finite_inputs_never_give_nan() {
    let mut x: Vec<f32> = (0..100).map(|i| i as f32 * 0.1).collect();
    x[3] = f32::NAN;
    x[10] = f32::INFINITY;
    x[20] = f32::NEG_INFINITY;
    // Statistics over the 97 finite entries.
    let finite: Vec<f32> = x.iter().copied().filter(|v| v.is_finite()).collect();
    let (m, s) = mean_std(&x).unwrap();
    let (m2, s2) = mean_std(&finite).unwrap();
    assert!((m - m2).abs() < 1e-12 && (s - s2).abs() < 1e-12);
    let theta = threshold(&x, 10).unwrap();
    assert!(theta.is_finite());
    let mut out = vec![0f32; 100];
    soft(&x, 10, &mut out);
    assert!(out.iter().all(|v| !v.is_nan()));
    assert_eq!(out[3], 0.0);
    assert_eq!(out[10], f32::INFINITY);
    assert_eq!(out[20], 0.0);
    let mut keep = Vec::new();
    attention_keep(&x, 10, &mut keep);
    assert!(keep.contains(&10) && !keep.contains(&3) && !keep.contains(&20));

    // Nothing finite: theta = +inf, FFN all zero, attention keeps the maxima (+inf entries).
    let y = [f32::NAN, f32::INFINITY, f32::NAN, f32::INFINITY];
    assert_eq!(threshold(&y, 1), Some(f32::INFINITY));
    let mut out = [1f32; 4];
    soft(&y, 1, &mut out);
    assert_eq!(out, [0.0; 4]);
    attention_keep(&y, 1, &mut keep);
    assert_eq!(keep, vec![1, 3]);
    attention_keep(&[f32::NAN; 5], 2, &mut keep);
    assert!(keep.is_empty());
}

#[test]
fn large_offsets_do_not_cancel() {
    let mut rng = Rng::new(13);
    let x: Vec<f32> = (0..4096)
        .map(|_| (1.0e4 + rng.normal() * 1e-2) as f32)
        .collect();
    let want = ref_threshold(&x, 256).unwrap();
    let got = threshold_f64(&x, 256).unwrap();
    assert!((got - want).abs() < 1e-7, "{got} vs {want}");
}
