//! The statistical top-k's shifted sums, portable: the reference every SIMD version equals
//! bit for bit, and the eight lanes every version finishes with.

/// Sums of `x - shift` and `(x - shift)^2` in f64 with eight fixed lanes: lane `i` takes the
/// entries `i, i + 8, ...`, then [`Lanes::finish`]'s fixed tree; with the count.
///
/// # Safety
/// None (`unsafe fn` to share the table's function-pointer type).
pub(crate) unsafe fn shifted_sums(x: &[f32], shift: f64) -> (f64, f64, usize) {
    let mut lanes = Lanes::default();
    for c in x.chunks(8) {
        lanes.add(c, shift);
    }
    lanes.finish(x.len())
}

/// The eight lanes of [`shifted_sums`]: sums of `x - shift` and of its square.
#[derive(Default)]
pub(crate) struct Lanes {
    pub(crate) a1: [f64; 8],
    pub(crate) a2: [f64; 8],
}

impl Lanes {
    /// Entry `i` of `xs` (at most eight) into lane `i`.
    #[inline(always)]
    pub(crate) fn add(&mut self, xs: &[f32], shift: f64) {
        for (i, &v) in xs.iter().enumerate() {
            let d = f64::from(v) - shift;
            self.a1[i] += d;
            self.a2[i] += d * d;
        }
    }

    /// The two sums by the fixed reduction tree, with the entry count.
    pub(crate) fn finish(&self, n: usize) -> (f64, f64, usize) {
        let tree = |a: &[f64; 8]| ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
        (tree(&self.a1), tree(&self.a2), n)
    }
}
