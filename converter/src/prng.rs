//! A small deterministic PRNG for synthetic weights: splitmix64 seeding, xoshiro256++ stream,
//! Box-Muller normals. A stream is keyed by (seed, tensor index, chunk index), so a tensor's
//! values do not depend on how chunks are scheduled across threads.

/// One step of splitmix64 (also used to derive stream keys).
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// xoshiro256++ generator.
#[derive(Clone, Debug)]
pub struct Xoshiro256 {
    s: [u64; 4],
}

impl Xoshiro256 {
    /// The stream for chunk `chunk` of tensor `tensor` under `seed`.
    pub fn for_chunk(seed: u64, tensor: u64, chunk: u64) -> Self {
        let mut k = seed;
        let a = splitmix64(&mut k);
        let mut k = a ^ tensor.wrapping_mul(0xD1B5_4A32_D192_ED03);
        let b = splitmix64(&mut k);
        let mut st = b ^ chunk.wrapping_mul(0xABC9_8388_FB8F_AC03);
        let s = [
            splitmix64(&mut st),
            splitmix64(&mut st),
            splitmix64(&mut st),
            splitmix64(&mut st),
        ];
        Xoshiro256 { s }
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[0].wrapping_add(s[3]).rotate_left(23).wrapping_add(s[0]);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Fills `out` with independent N(0, std^2) samples (Marsaglia's polar method: one pair of
    /// normals per accepted point of the unit disc, 32-bit uniform coordinates).
    pub fn fill_normal(&mut self, out: &mut [f32], std: f32) {
        let mut chunks = out.chunks_exact_mut(2);
        for pair in &mut chunks {
            let (a, b) = self.normal_pair();
            pair[0] = a * std;
            pair[1] = b * std;
        }
        if let [last] = chunks.into_remainder() {
            *last = self.normal_pair().0 * std;
        }
    }

    fn normal_pair(&mut self) -> (f32, f32) {
        const SCALE: f32 = 1.0 / (1u32 << 23) as f32;
        loop {
            let r = self.next_u64();
            // Two uniforms in [-1, 1) from 24 bits of each 32-bit half.
            let u = (r >> 40) as f32 * SCALE - 1.0;
            let v = ((r >> 8) & 0xFF_FFFF) as f32 * SCALE - 1.0;
            let s = u * u + v * v;
            if s > 0.0 && s < 1.0 {
                let f = (-2.0 * s.ln() / s).sqrt();
                return (u * f, v * f);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix_matches_reference_values() {
        // Reference: splitmix64 seeded with 0 (Vigna's reference implementation).
        let mut s = 0u64;
        assert_eq!(splitmix64(&mut s), 0xE220_A839_7B1D_CDAF);
        assert_eq!(splitmix64(&mut s), 0x6E78_9E6A_A1B9_65F4);
    }

    #[test]
    fn streams_are_deterministic_and_distinct() {
        let mut a = Xoshiro256::for_chunk(7, 3, 5);
        let mut b = Xoshiro256::for_chunk(7, 3, 5);
        let va: Vec<u64> = (0..16).map(|_| a.next_u64()).collect();
        let vb: Vec<u64> = (0..16).map(|_| b.next_u64()).collect();
        assert_eq!(va, vb);
        for (s, t, c) in [(8, 3, 5), (7, 4, 5), (7, 3, 6)] {
            let mut o = Xoshiro256::for_chunk(s, t, c);
            assert_ne!(o.next_u64(), va[0]);
        }
    }

    #[test]
    fn normals_have_the_requested_moments() {
        let mut g = Xoshiro256::for_chunk(1, 0, 0);
        let mut v = vec![0f32; 200_001];
        g.fill_normal(&mut v, 0.5);
        let n = v.len() as f64;
        let mean = v.iter().map(|&x| f64::from(x)).sum::<f64>() / n;
        let var = v
            .iter()
            .map(|&x| (f64::from(x) - mean).powi(2))
            .sum::<f64>()
            / n;
        assert!(mean.abs() < 0.005, "mean {mean}");
        assert!((var - 0.25).abs() < 0.005, "var {var}");
        let frac = v.iter().filter(|&&x| x.abs() < 0.5).count() as f64 / n;
        assert!((frac - 0.6827).abs() < 0.005, "within 1 std: {frac}");
    }
}
