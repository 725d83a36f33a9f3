//! The mean and standard deviation of a sample of measurements (benchmark speeds, per-token
//! divergences).

/// Mean and sample standard deviation (n - 1 denominator); `(0, 0)` for no values and a zero
/// deviation for one.
pub fn mean_sd(v: &[f64]) -> (f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0);
    }
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    if v.len() < 2 {
        return (mean, 0.0);
    }
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, var.sqrt())
}

#[cfg(test)]
mod tests {
    use super::mean_sd;

    #[test]
    fn mean_and_standard_deviation() {
        let (m, s) = mean_sd(&[1.0, 2.0, 3.0]);
        assert!((m - 2.0).abs() < 1e-12 && (s - 1.0).abs() < 1e-12);
        assert_eq!(mean_sd(&[4.0]), (4.0, 0.0));
    }
}
