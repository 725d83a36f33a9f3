//! Statistical top-k (SPEC.md section 1): a threshold from the mean and the unbiased standard
//! deviation of a vector, so that about `k` of its `d` entries exceed it when the entries are
//! roughly Gaussian.
//!
//! Non-finite inputs have a defined behaviour (never a panic, never a NaN output):
//! - the mean and standard deviation are taken over the finite entries only; the quantile is
//!   still `Q(1 - k/d)` with `d` the full length;
//! - NaN never exceeds the threshold (never kept), `-inf` is never kept, `+inf` is kept whenever
//!   the threshold is finite;
//! - with no finite entry the threshold is `+inf`; with one finite entry the deviation is 0.

/// Inverse CDF of the standard normal distribution, `Q(p)`.
///
/// Acklam's rational approximation refined by one Halley step on an accurate `erfc`, evaluated
/// on the lower tail and mirrored (`1 - p` is exact for `p > 0.5`), so it is accurate to well
/// under 1e-9 absolute on `(1e-12, 1 - 1e-12)` for the `p` actually given. Returns `-inf` for
/// `p <= 0`, `+inf` for `p >= 1` and NaN for NaN.
pub fn norm_ppf(p: f64) -> f64 {
    if p.is_nan() {
        return f64::NAN;
    }
    if p <= 0.0 {
        return f64::NEG_INFINITY;
    }
    if p >= 1.0 {
        return f64::INFINITY;
    }
    if p == 0.5 {
        return 0.0;
    }
    if p > 0.5 {
        // Sterbenz: 1 - p is exact for p in [0.5, 1].
        return -lower_ppf(1.0 - p);
    }
    lower_ppf(p)
}

/// `Q(p)` for `0 < p < 0.5`.
#[allow(clippy::excessive_precision)] // Acklam's published coefficients, verbatim
fn lower_ppf(p: f64) -> f64 {
    const A: [f64; 6] = [
        -3.969683028665376e+01,
        2.209460984245205e+02,
        -2.759285104469687e+02,
        1.383577518672690e+02,
        -3.066479806614716e+01,
        2.506628277459239e+00,
    ];
    const B: [f64; 5] = [
        -5.447609879822406e+01,
        1.615858368580409e+02,
        -1.556989798598866e+02,
        6.680131188771972e+01,
        -1.328068155288572e+01,
    ];
    const C: [f64; 6] = [
        -7.784894002430293e-03,
        -3.223964580411365e-01,
        -2.400758277161838e+00,
        -2.549732539343734e+00,
        4.374664141464968e+00,
        2.938163982698783e+00,
    ];
    const D: [f64; 4] = [
        7.784695709041462e-03,
        3.224671290700398e-01,
        2.445134137142996e+00,
        3.754408661907416e+00,
    ];
    const P_LOW: f64 = 0.02425;
    let x = if p < P_LOW {
        let q = (-2.0 * p.ln()).sqrt();
        (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
            / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    } else {
        let q = p - 0.5;
        let r = q * q;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    };
    // One Halley step on Phi(x) - p = 0, with Phi(x) = erfc(-x / sqrt 2) / 2.
    let e = 0.5 * erfc(-x * std::f64::consts::FRAC_1_SQRT_2) - p;
    let u = e * (2.0 * std::f64::consts::PI).sqrt() * (0.5 * x * x).exp();
    let refined = x - u / (1.0 + 0.5 * x * u);
    if refined.is_finite() {
        refined
    } else {
        x
    }
}

/// Complementary error function, relative error around 1e-14 or better on the reals.
///
/// A positive-term series for `erf` below 2 and a continued fraction above.
pub(crate) fn erfc(x: f64) -> f64 {
    if x.is_nan() {
        return f64::NAN;
    }
    if x < 0.0 {
        return 2.0 - erfc(-x);
    }
    if x < 2.0 {
        return 1.0 - erf_series(x);
    }
    if x > 27.3 {
        return 0.0; // below the smallest subnormal
    }
    // erfc(x) = exp(-x^2)/sqrt(pi) * 1/(x + (1/2)/(x + 1/(x + (3/2)/(x + ...)))),
    // evaluated backwards from a depth that converges to double precision for x >= 2.
    let mut f = x;
    for n in (1..=80).rev() {
        f = x + (n as f64 * 0.5) / f;
    }
    (-x * x).exp() / (std::f64::consts::PI.sqrt() * f)
}

/// `erf(x)` for `0 <= x < 2`: `2/sqrt(pi) exp(-x^2) sum_n x (2x^2)^n / (1*3*...*(2n+1))`.
fn erf_series(x: f64) -> f64 {
    let two_x2 = 2.0 * x * x;
    let mut term = x;
    let mut sum = x;
    let mut n = 0u32;
    while n < 200 {
        n += 1;
        term *= two_x2 / f64::from(2 * n + 1);
        sum += term;
        if term < sum * 1e-17 {
            break;
        }
    }
    2.0 / std::f64::consts::PI.sqrt() * (-x * x).exp() * sum
}

/// Mean and unbiased standard deviation over the finite entries of `x`, accumulated in f64 in
/// one pass (sums shifted by the first finite entry against cancellation). Returns `None` when
/// no entry is finite; the deviation is 0 with a single finite entry.
pub fn mean_std(x: &[f32]) -> Option<(f64, f64)> {
    let shift = f64::from(*x.iter().find(|v| v.is_finite())?);
    let (mut s1, mut s2, n) = shifted_sums(x, shift);
    if !(s1.is_finite() && s2.is_finite()) {
        // Some entry is +-inf or NaN: sum the finite entries only.
        (s1, s2) = (0.0, 0.0);
        let mut count = 0usize;
        for &v in x.iter().filter(|v| v.is_finite()) {
            let d = f64::from(v) - shift;
            s1 += d;
            s2 += d * d;
            count += 1;
        }
        return Some(finish_stats(s1, s2, count, shift));
    }
    Some(finish_stats(s1, s2, n, shift))
}

/// Sums of `x - shift` and `(x - shift)^2` in f64 with eight fixed lanes (deterministic order:
/// lane `i` takes the entries `i, i + 8, ...`, then a fixed tree), with the count. Non-finite
/// entries make the sums non-finite. Every kernel table gives the generic version's bits.
fn shifted_sums(x: &[f32], shift: f64) -> (f64, f64, usize) {
    // SAFETY: the table's CPU features were detected; the function reads `x` only.
    unsafe { (crate::arch::kernels().shifted_sums)(x, shift) }
}

fn finish_stats(s1: f64, s2: f64, n: usize, shift: f64) -> (f64, f64) {
    let nf = n as f64;
    let mean_shifted = s1 / nf;
    let var = if n < 2 {
        0.0
    } else {
        ((s2 - s1 * mean_shifted) / (nf - 1.0)).max(0.0)
    };
    (shift + mean_shifted, var.sqrt())
}

/// The threshold `theta = mean + std * Q(1 - k/d)` of SPEC 1 for `x` (d = `x.len()`), in f64.
/// `None` when `k >= d` (no sparsification). `k = 0` gives `+inf` (nothing kept).
pub fn threshold_f64(x: &[f32], k: usize) -> Option<f64> {
    let d = x.len();
    if k >= d {
        return None;
    }
    if k == 0 {
        return Some(f64::INFINITY);
    }
    Some(mean_plus_std_times(x, norm_ppf(1.0 - k as f64 / d as f64)))
}

/// `mean(x) + std(x) * z` (unbiased std, [`mean_std`]): `mean` when the deviation is 0, `+inf`
/// when no entry is finite (nothing kept).
fn mean_plus_std_times(x: &[f32], z: f64) -> f64 {
    match mean_std(x) {
        None => f64::INFINITY,
        Some((mean, 0.0)) => mean,
        Some((mean, std)) => mean + std * z,
    }
}

/// [`threshold_f64`] rounded down to f32, so that for every f32 `v`,
/// `v > threshold(x, k)` exactly when `v > threshold_f64(x, k)`.
pub fn threshold(x: &[f32], k: usize) -> Option<f32> {
    threshold_f64(x, k).map(round_down_f32)
}

/// How a threshold `theta = mean + std * z` over a vector of `d` entries is set: the
/// multiplier `z` from a kept count or given directly (the FFN ops' `ffn_cutoff`,
/// `crate::params`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Cutoff {
    /// About `k` of the `d` entries kept: `z = Q(1 - k/d)` (SPEC 1; spark-gemma2). `k >= d` is
    /// dense (no threshold: every entry kept, unshifted), `k = 0` keeps nothing.
    TopK(usize),
    /// `z` as given (Gemma 3n's `f_sparsity_std_mul`, 1.6448533535003662 = Q(0.95)): always a
    /// threshold, never dense. The ops accept finite values only (`crate::params::read_ffn`);
    /// a NaN `z` here gives a NaN threshold, which no entry exceeds.
    StdMul(f64),
}

impl Cutoff {
    /// The multiplier `z` for a vector of `d` entries, as the CUDA threshold kernel takes it
    /// from the host: `None` when dense ([`Cutoff::TopK`] with `k >= d`). `TopK(0)` gives
    /// `+inf`.
    pub fn z(self, d: usize) -> Option<f64> {
        match self {
            Cutoff::TopK(k) if k >= d => None,
            Cutoff::TopK(k) => Some(norm_ppf(1.0 - k as f64 / d as f64)),
            Cutoff::StdMul(z) => Some(z),
        }
    }

    /// True when this cutoff keeps every one of `d` entries unshifted (`TopK(k)`, `k >= d`).
    pub fn dense(self, d: usize) -> bool {
        self.z(d).is_none()
    }
}

/// The threshold of `x` under `cutoff`, in f64: [`threshold_f64`] for [`Cutoff::TopK`]; for
/// [`Cutoff::StdMul`]`(z)`, `mean + std * z` with the same mean and unbiased standard deviation
/// ([`mean_std`]), `mean` when the deviation is 0 and `+inf` when no entry is finite. `None`
/// only when dense.
pub fn threshold_f64_for(x: &[f32], cutoff: Cutoff) -> Option<f64> {
    match cutoff {
        Cutoff::TopK(k) => threshold_f64(x, k),
        Cutoff::StdMul(z) => Some(mean_plus_std_times(x, z)),
    }
}

/// [`threshold_f64_for`] rounded down to f32, so that for every f32 `v`,
/// `v > threshold_for(x, c)` exactly when `v > threshold_f64_for(x, c)`.
pub fn threshold_for(x: &[f32], cutoff: Cutoff) -> Option<f32> {
    threshold_f64_for(x, cutoff).map(round_down_f32)
}

/// The largest f32 not above `t` (`+-inf` stay infinite, NaN stays NaN).
pub(crate) fn round_down_f32(t: f64) -> f32 {
    let r = t as f32;
    if f64::from(r) > t {
        next_down_f32(r)
    } else {
        r
    }
}

fn next_down_f32(v: f32) -> f32 {
    if v.is_nan() || v == f32::NEG_INFINITY {
        return v;
    }
    if v == 0.0 {
        return -f32::from_bits(1);
    }
    let bits = v.to_bits();
    if v > 0.0 {
        f32::from_bits(bits - 1)
    } else {
        f32::from_bits(bits + 1)
    }
}

/// FFN form: `out_i = max(x_i - theta, 0)`, or a copy of `x` when `k >= d` (identity).
/// NaN entries give 0; `out.len()` must equal `x.len()`.
pub fn soft(x: &[f32], k: usize, out: &mut [f32]) {
    assert_eq!(
        x.len(),
        out.len(),
        "soft: output length differs from input length"
    );
    match threshold(x, k) {
        None => out.copy_from_slice(x),
        Some(theta) => {
            for (o, &v) in out.iter_mut().zip(x) {
                *o = if v > theta { v - theta } else { 0.0 };
            }
        }
    }
}

/// Attention form: fills `out` with the indices kept by `neg()` of SPEC 1, ascending.
///
/// Keeps every index when `k >= d`; otherwise those with `s_j > theta`, and when none exceeds
/// it, those equal to the maximum over the non-NaN entries (none when every entry is NaN).
pub fn attention_keep(s: &[f32], k: usize, out: &mut Vec<u32>) {
    out.clear();
    let Some(theta) = threshold(s, k) else {
        out.extend(0..s.len() as u32);
        return;
    };
    out.extend(
        s.iter()
            .enumerate()
            .filter(|(_, &v)| v > theta)
            .map(|(j, _)| j as u32),
    );
    if out.is_empty() {
        let max = s
            .iter()
            .copied()
            .filter(|v| !v.is_nan())
            .fold(f32::NEG_INFINITY, f32::max);
        out.extend(
            s.iter()
                .enumerate()
                .filter(|(_, &v)| v == max)
                .map(|(j, _)| j as u32),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reference values from Python's `statistics.NormalDist().inv_cdf` (Wichura AS241).
    const PPF: [(f64, f64); 18] = [
        (1e-12, -7.034483825301132),
        (1e-10, -6.361340902404056),
        (1e-06, -4.753424308822899),
        (0.001, -3.090232306167813),
        (0.02425, -1.9729610513118845),
        (0.05, -1.6448536269514726),
        (0.1, -1.2815515655446008),
        (0.3, -0.5244005127080407),
        (0.5, 0.0),
        (0.7, 0.5244005127080407),
        (0.92, 1.4050715603096327),
        (0.919994212962963, 1.4050326350006996),
        (0.9375, 1.5341205443525459),
        (0.97575, 1.9729610513118847),
        (0.975, 1.9599639845400536),
        (0.999, 3.090232306167813),
        (0.999999, 4.753424308817089),
        (0.999999999999, 7.0344869100478356),
    ];

    #[test]
    fn ppf_matches_reference_values() {
        for (p, want) in PPF {
            let got = norm_ppf(p);
            assert!((got - want).abs() < 1e-12, "Q({p}) = {got}, want {want}");
        }
    }

    /// Reference values from Python's `math.erfc`.
    #[test]
    fn erfc_matches_reference_values() {
        let table = [
            (0.1, 0.8875370839817152),
            (0.5, 0.4795001221869535),
            (1.0, 0.15729920705028513),
            (2.0, 0.004677734981047265),
            (3.0, 2.2090496998585438e-05),
            (4.0, 1.541725790028002e-08),
            (5.0, 1.5374597944280351e-12),
            (7.0, 4.183825607779414e-23),
            (10.0, 2.088487583762545e-45),
        ];
        for (x, want) in table {
            let got = erfc(x);
            assert!(
                ((got - want) / want).abs() < 1e-13,
                "erfc({x}) = {got}, want {want}"
            );
            let got_neg = erfc(-x);
            assert!(
                (got_neg - (2.0 - want)).abs() < 1e-15,
                "erfc(-{x}) = {got_neg}"
            );
        }
    }

    #[test]
    fn ppf_round_trips_through_cdf_on_a_log_grid() {
        // Phi(Q(p)) == p to 1e-12 relative on the lower tail, and Q(p) == -Q(1-p).
        let mut p = 1.0e-12f64;
        while p < 0.5 {
            let x = norm_ppf(p);
            let back = 0.5 * erfc(-x * std::f64::consts::FRAC_1_SQRT_2);
            assert!(((back - p) / p).abs() < 1e-12, "Phi(Q({p})) = {back}");
            let q = 1.0 - p;
            assert!((norm_ppf(q) + norm_ppf(1.0 - q)).abs() < 1e-12);
            p *= 1.37;
        }
    }

    #[test]
    fn ppf_edges() {
        assert_eq!(norm_ppf(0.0), f64::NEG_INFINITY);
        assert_eq!(norm_ppf(1.0), f64::INFINITY);
        assert!(norm_ppf(f64::NAN).is_nan());
        assert!(norm_ppf(1e-300).is_finite());
    }

    #[test]
    fn every_tables_shifted_sums_equal_the_generic_ones_bit_for_bit() {
        use crate::arch::{table, Isa};
        let generic = table(Isa::Generic).unwrap();
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 40) as f32 / (1u64 << 24) as f32
        };
        for isa in Isa::available() {
            let k = table(isa).unwrap();
            for n in [0usize, 1, 7, 8, 9, 15, 16, 17, 255, 1000, 13_824] {
                let x: Vec<f32> = (0..n).map(|_| (next() - 0.4) * 37.0).collect();
                for shift in [0.0, 1.25, f64::from(x.first().copied().unwrap_or(0.0))] {
                    // SAFETY: both tables' CPU features were detected by `table`.
                    let (want, got) = unsafe {
                        (
                            (generic.shifted_sums)(&x, shift),
                            (k.shifted_sums)(&x, shift),
                        )
                    };
                    assert_eq!(
                        got.0.to_bits(),
                        want.0.to_bits(),
                        "{isa:?} n {n} shift {shift}"
                    );
                    assert_eq!(
                        got.1.to_bits(),
                        want.1.to_bits(),
                        "{isa:?} n {n} shift {shift}"
                    );
                    assert_eq!(got.2, n);
                }
            }
            // a non-finite entry makes both sums non-finite in every version
            let mut x = vec![1.0f32; 20];
            x[11] = f32::INFINITY;
            // SAFETY: as above.
            let got = unsafe { (k.shifted_sums)(&x, 1.0) };
            assert!(!got.0.is_finite() && !got.1.is_finite(), "{isa:?}");
            assert_eq!(shifted_sums(&x, 1.0).0.to_bits(), got.0.to_bits());
        }
    }

    #[test]
    fn mean_std_matches_two_pass_f64() {
        let x: Vec<f32> = (0..1001)
            .map(|i| 1000.0 + ((i * 7919) % 113) as f32 * 0.01)
            .collect();
        let n = x.len() as f64;
        let mean = x.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
        let var = x
            .iter()
            .map(|&v| (f64::from(v) - mean).powi(2))
            .sum::<f64>()
            / (n - 1.0);
        let (m, s) = mean_std(&x).unwrap();
        assert!((m - mean).abs() < 1e-9);
        assert!((s - var.sqrt()).abs() < 1e-9 * var.sqrt());
    }

    #[test]
    fn a_std_multiplier_cutoff_is_mean_plus_std_times_z() {
        let x: Vec<f32> = (0..2048)
            .map(|i| ((i * 7919) % 1013) as f32 * 0.013 - 6.0)
            .collect();
        let (mean, std) = mean_std(&x).unwrap();
        for z in [1.644_853_353_500_366_2, 0.0, -0.5, 3.25] {
            let c = Cutoff::StdMul(z);
            assert_eq!(c.z(x.len()), Some(z));
            assert!(!c.dense(x.len()));
            let t = threshold_f64_for(&x, c).unwrap();
            assert_eq!(t.to_bits(), (mean + std * z).to_bits(), "z {z}");
            let t32 = threshold_for(&x, c).unwrap();
            assert_eq!(t32, round_down_f32(t));
            for &v in &x {
                assert_eq!(v > t32, f64::from(v) > t, "z {z} v {v}");
            }
        }
        // never dense, whatever the length; std 0 gives the mean, no finite entry +inf
        let c = Cutoff::StdMul(1.5);
        assert_eq!(threshold_for(&[2.5; 4], c), Some(2.5));
        assert_eq!(threshold_for(&[7.0], c), Some(7.0));
        assert_eq!(
            threshold_for(&[f32::NAN, f32::INFINITY], c),
            Some(f32::INFINITY)
        );
        // non-finite entries are left out of the statistics, as for top-k
        let (m, s) = mean_std(&[1.0, 3.0]).unwrap();
        let t = threshold_f64_for(&[1.0, f32::NEG_INFINITY, 3.0, f32::NAN], c).unwrap();
        assert_eq!(t, m + s * 1.5);
        // a NaN multiplier: a NaN threshold, which no entry exceeds
        assert!(threshold_for(&x, Cutoff::StdMul(f64::NAN))
            .unwrap()
            .is_nan());
    }

    #[test]
    fn a_top_k_cutoff_is_threshold_of_k() {
        let x: Vec<f32> = (0..300).map(|i| ((i * 31) % 97) as f32 * 0.1).collect();
        for k in [0usize, 1, 15, 150, 299, 300, 1000] {
            let c = Cutoff::TopK(k);
            assert_eq!(threshold_f64_for(&x, c), threshold_f64(&x, k), "k {k}");
            assert_eq!(threshold_for(&x, c), threshold(&x, k), "k {k}");
            assert_eq!(c.dense(x.len()), k >= x.len());
        }
        assert_eq!(Cutoff::TopK(15).z(300), Some(norm_ppf(1.0 - 15.0 / 300.0)));
        assert_eq!(Cutoff::TopK(0).z(300), Some(f64::INFINITY));
        assert_eq!(Cutoff::TopK(300).z(300), None);
    }

    #[test]
    fn round_down_is_exact_for_comparisons() {
        for t in [
            0.1f64,
            -0.1,
            1.0,
            1e-40,
            -1e-40,
            0.0,
            3.5,
            f64::INFINITY,
            f64::NEG_INFINITY,
        ] {
            let r = round_down_f32(t);
            assert!(f64::from(r) <= t);
            if t.is_finite() && t != 0.0 {
                let up = f32::from_bits(if r >= 0.0 {
                    r.to_bits() + 1
                } else {
                    r.to_bits() - 1
                });
                assert!(f64::from(up) > t || f64::from(r) == t);
            }
        }
    }
}
