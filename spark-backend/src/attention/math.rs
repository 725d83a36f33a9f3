//! Branch-free f32 `exp`, `tanh` and `softplus` that the compiler vectorises over slices.
//!
//! Cephes-style range reduction and polynomials (relative error a few ulp on the ranges used);
//! NaN propagates, `exp` saturates to 0 below -87.3 and to +inf above 88.7.

const LOG2E: f32 = std::f32::consts::LOG2_E;
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
const EXP_MAX: f32 = 88.722_84;
const EXP_MIN: f32 = -87.336_55;

/// `e^x` in f32 (about 2 ulp).
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    let xc = x.clamp(EXP_MIN, EXP_MAX);
    let n = (xc * LOG2E + 0.5).floor();
    let r = xc - n * LN2_HI - n * LN2_LO;
    let z = r * r;
    let p = (((((1.987_569_2e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2)
        * r
        + 0.166_666_65)
        * r
        + 0.5)
        * z
        + r
        + 1.0;
    // 2^n through the exponent bits; n is in [-126, 128] after the clamp. Split the scaling in
    // two so that n = 128 does not overflow the biased exponent.
    let half = (n * 0.5).floor();
    let s1 = f32::from_bits(((half as i32 + 127) as u32) << 23);
    let s2 = f32::from_bits((((n - half) as i32 + 127) as u32) << 23);
    let y = p * s1 * s2;
    let y = if x < EXP_MIN { 0.0 } else { y };
    let y = if x > EXP_MAX { f32::INFINITY } else { y };
    if x.is_nan() {
        x
    } else {
        y
    }
}

/// Natural logarithm for finite `v > 0` (about 2 ulp).
#[inline(always)]
fn ln_positive(v: f32) -> f32 {
    let bits = v.to_bits();
    // v = m * 2^e with m in [0.5, 1).
    let mut e = ((bits >> 23) & 0xff) as i32 - 126;
    let mut m = f32::from_bits((bits & 0x007f_ffff) | 0x3f00_0000);
    let small = m < std::f32::consts::FRAC_1_SQRT_2;
    e -= small as i32;
    m = if small { m + m - 1.0 } else { m - 1.0 };
    let z = m * m;
    let y = ((((((((7.037_683_6e-2 * m - 0.115_146_1) * m + 0.116_769_98) * m - 0.124_201_41)
        * m
        + 0.142_493_23)
        * m
        - 0.166_680_57)
        * m
        + 0.200_007_15)
        * m
        - 0.249_999_94)
        * m
        + 0.333_333_3)
        * m
        * z;
    let ef = e as f32;
    let y = y + LN2_LO * ef - 0.5 * z;
    m + y + LN2_HI * ef
}

/// `ln(1 + u)` for `u` in `[0, 1]`, accurate for tiny `u` as well.
#[inline(always)]
fn ln_1p_unit(u: f32) -> f32 {
    let v = 1.0 + u;
    let d = v - 1.0;
    // ln(v) * u / (v - 1) corrects the rounding of 1 + u; for v == 1, ln(1 + u) == u to f32.
    if d == 0.0 {
        u
    } else {
        ln_positive(v) * (u / d)
    }
}

/// `softplus(x) = ln(1 + e^x)`, computed as `max(x, 0) + ln(1 + e^-|x|)` (never overflows).
#[inline(always)]
pub(crate) fn softplus(x: f32) -> f32 {
    let y = x.max(0.0) + ln_1p_unit(exp(-x.abs()));
    if x.is_nan() {
        x
    } else {
        y
    }
}

/// `tanh(x)` in f32: an odd polynomial below 0.625, `1 - 2 / (e^{2|x|} + 1)` above.
#[inline(always)]
pub(crate) fn tanh(x: f32) -> f32 {
    let a = x.abs();
    let s = x * x;
    let poly = ((((-5.704_988_7e-3 * s + 2.063_909e-2) * s - 5.373_971_6e-2) * s + 0.133_314_42)
        * s
        - 0.333_332_8)
        * s
        * x
        + x;
    let big = 1.0 - 2.0 / (exp(a + a) + 1.0);
    let big = if x < 0.0 { -big } else { big };
    if a < 0.625 || x.is_nan() {
        poly
    } else {
        big
    }
}

/// `xs[i] = c * tanh(xs[i] / c)` (SPEC's capA); `c == 0` leaves `xs` unchanged.
pub(crate) fn softcap_in_place(xs: &mut [f32], c: f32) {
    if c == 0.0 {
        return;
    }
    let inv = 1.0 / c;
    for x in xs.iter_mut() {
        *x = c * tanh(*x * inv);
    }
}

/// `xs[i] = e^(xs[i] - m)`.
pub(crate) fn exp_shifted_in_place(xs: &mut [f32], m: f32) {
    for x in xs.iter_mut() {
        *x = exp(*x - m);
    }
}

/// `xs[i] = softplus(xs[i])`.
pub(crate) fn softplus_in_place(xs: &mut [f32]) {
    for x in xs.iter_mut() {
        *x = softplus(*x);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rel(a: f64, b: f64) -> f64 {
        if a == b {
            0.0
        } else {
            (a - b).abs() / b.abs().max(f64::MIN_POSITIVE)
        }
    }

    fn grid(lo: f32, hi: f32, n: usize) -> impl Iterator<Item = f32> {
        (0..=n).map(move |i| lo + (hi - lo) * i as f32 / n as f32)
    }

    #[test]
    fn exp_is_accurate_over_its_range() {
        for x in grid(-87.0, 88.0, 200_000) {
            let want = f64::from(x).exp();
            assert!(
                rel(f64::from(exp(x)), want) < 4e-7,
                "exp({x}) = {} want {want}",
                exp(x)
            );
        }
    }

    #[test]
    fn exp_edges() {
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(-100.0), 0.0);
        assert_eq!(exp(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp(100.0), f32::INFINITY);
        assert!(exp(f32::NAN).is_nan());
        assert_eq!(exp(0.0), 1.0);
    }

    #[test]
    fn tanh_is_accurate() {
        for x in grid(-12.0, 12.0, 240_001) {
            let want = f64::from(x).tanh();
            let got = f64::from(tanh(x));
            assert!(
                (got - want).abs() <= 3e-7 * want.abs().max(1e-30),
                "tanh({x}) = {got} want {want}"
            );
        }
        for x in [1e-30f32, -1e-20, 1e-8, 0.0] {
            assert_eq!(tanh(x), x);
        }
        assert_eq!(tanh(f32::INFINITY), 1.0);
        assert_eq!(tanh(f32::NEG_INFINITY), -1.0);
        assert_eq!(tanh(100.0), 1.0);
        assert!(tanh(f32::NAN).is_nan());
    }

    #[test]
    fn softplus_is_accurate_including_the_far_negative_tail() {
        for x in grid(-80.0, 80.0, 160_000) {
            let xd = f64::from(x);
            let want = xd.max(0.0) + (-xd.abs()).exp().ln_1p();
            let got = f64::from(softplus(x));
            assert!(rel(got, want) < 5e-7, "softplus({x}) = {got} want {want}");
        }
        assert_eq!(softplus(f32::INFINITY), f32::INFINITY);
        assert_eq!(softplus(f32::NEG_INFINITY), 0.0);
        assert!(softplus(f32::NAN).is_nan());
    }

    #[test]
    fn slice_helpers_apply_elementwise() {
        let mut xs = vec![-200.0f32, -3.0, 0.0, 0.5, 80.0];
        softcap_in_place(&mut xs, 50.0);
        for (got, x) in xs.iter().zip([-200.0f64, -3.0, 0.0, 0.5, 80.0]) {
            let want = 50.0 * (x / 50.0).tanh();
            assert!((f64::from(*got) - want).abs() < 1e-5);
        }
        let mut same = vec![1.0f32, -2.0];
        softcap_in_place(&mut same, 0.0);
        assert_eq!(same, vec![1.0, -2.0]);
        let mut out = vec![1.0f32, 2.0, 3.0];
        exp_shifted_in_place(&mut out, 3.0);
        assert!((out[0] - (-2.0f32).exp()).abs() < 1e-7 && out[2] == 1.0);
        let mut sp = vec![0.0f32, 1.0];
        softplus_in_place(&mut sp);
        assert!((sp[0] - std::f32::consts::LN_2).abs() < 1e-7);
    }
}
