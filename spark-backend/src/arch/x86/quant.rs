//! Quantized rows (q8_0, q4_0, q6_K) with AVX2, FMA and F16C: dequantization fused with axpy
//! or writing f32, and the four-row and folded q8_0 axpys.
//!
//! ggml's CPU `vec_dot` is SIMD but its `to_float` is portable scalar code; these kernels do the
//! same arithmetic (each weight is `d * q`, exact in f32, then one fused multiply-add with
//! alpha), so results equal the generic version (ggml's `to_float`, then an f32 axpy) bit for
//! bit.

use crate::arch::table::target_feature_entries;
use crate::kernel_types::Start;
use std::arch::x86_64::*;

/// Bytes per q8_0 block as these kernels decode it: f16 scale + 32 int8 (ggml's `block_q8_0`;
/// equal to the linked ggml's `ggml_type_size`, tested below).
pub(super) const Q8_0_BYTES: usize = 2 + 32;
/// Bytes per q4_0 block as decoded here: f16 scale + 16 bytes of nibbles (`block_q4_0`).
pub(super) const Q4_0_BYTES: usize = 2 + 16;

/// A block's f16 scale (its first two bytes) as f32.
#[inline(always)]
unsafe fn scale_f32(p: *const u8) -> f32 {
    // SAFETY: caller guarantees the 2 scale bytes are readable.
    let h = unsafe { p.cast::<u16>().read_unaligned() };
    half::f16::from_bits(h).to_f32()
}

#[inline(always)]
unsafe fn scale(p: *const u8) -> __m256 {
    // SAFETY: forwarded contract.
    _mm256_set1_ps(unsafe { scale_f32(p) })
}

/// The 32 int8 weights of one q8_0 block (after its scale) as four vectors of 8 f32, unscaled.
#[inline(always)]
unsafe fn q8_0_ints(q: *const u8) -> [__m256; 4] {
    // SAFETY: caller guarantees 32 readable bytes at q and AVX2.
    unsafe {
        let mut out = [_mm256_setzero_ps(); 4];
        for (k, o) in out.iter_mut().enumerate() {
            let b = _mm_loadl_epi64(q.add(8 * k).cast());
            *o = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
        }
        out
    }
}

/// The 32 weights of one q8_0 block as four vectors of 8.
#[inline(always)]
pub(super) unsafe fn q8_0_block(p: *const u8) -> [__m256; 4] {
    // SAFETY: caller guarantees a whole 34-byte block at p and AVX2.
    unsafe {
        let d = scale(p);
        let mut out = q8_0_ints(p.add(2));
        // A loop, not `array::map`: a closure is not inlined into the AVX2 callers.
        for o in &mut out {
            *o = _mm256_mul_ps(*o, d);
        }
        out
    }
}

/// The 32 weights of one q4_0 block as four vectors of 8 (low nibbles are weights 0..16,
/// high nibbles 16..32, each minus 8).
#[inline(always)]
pub(super) unsafe fn q4_0_block(p: *const u8) -> [__m256; 4] {
    // SAFETY: caller guarantees a whole 18-byte block at p and AVX2.
    unsafe {
        let d = scale(p);
        let bytes = _mm_loadu_si128(p.add(2).cast());
        let mask = _mm_set1_epi8(0x0F);
        let eight = _mm_set1_epi8(8);
        let lo = _mm_sub_epi8(_mm_and_si128(bytes, mask), eight);
        let hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16::<4>(bytes), mask), eight);
        let cvt = |v: __m128i| _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)), d);
        [
            cvt(lo),
            cvt(_mm_srli_si128::<8>(lo)),
            cvt(hi),
            cvt(_mm_srli_si128::<8>(hi)),
        ]
    }
}

#[inline(always)]
unsafe fn axpy_blocks(
    row: &[u8],
    alpha: f32,
    y: &mut [f32],
    block_bytes: usize,
    load: unsafe fn(*const u8) -> [__m256; 4],
) {
    let n_blocks = y.len() / 32;
    assert!(
        y.len().is_multiple_of(32) && row.len() >= n_blocks * block_bytes,
        "short quantized row"
    );
    let a = _mm256_set1_ps(alpha);
    let yp = y.as_mut_ptr();
    for b in 0..n_blocks {
        // SAFETY: block b lies inside `row` and elements 32b..32b+32 inside `y` (checked above);
        // the callers enable AVX2 and FMA.
        unsafe {
            let w = load(row.as_ptr().add(b * block_bytes));
            for (k, wk) in w.iter().enumerate() {
                let p = yp.add(32 * b + 8 * k);
                _mm256_storeu_ps(p, _mm256_fmadd_ps(*wk, a, _mm256_loadu_ps(p)));
            }
        }
    }
}

#[inline(always)]
unsafe fn to_f32_blocks(
    row: &[u8],
    out: &mut [f32],
    block_bytes: usize,
    load: unsafe fn(*const u8) -> [__m256; 4],
) {
    let n_blocks = out.len() / 32;
    assert!(
        out.len().is_multiple_of(32) && row.len() >= n_blocks * block_bytes,
        "short quantized row"
    );
    let op = out.as_mut_ptr();
    for b in 0..n_blocks {
        // SAFETY: as in `axpy_blocks`.
        unsafe {
            let w = load(row.as_ptr().add(b * block_bytes));
            for (k, wk) in w.iter().enumerate() {
                _mm256_storeu_ps(op.add(32 * b + 8 * k), *wk);
            }
        }
    }
}

target_feature_entries! { "avx2,fma,f16c";
    /// One q8_0 block's 32 weights as four vectors (`p`: the block's first byte).
    q8_0_load(p: *const u8) -> [__m256; 4] => q8_0_block(p);
    /// One q4_0 block's 32 weights as four vectors.
    q4_0_load(p: *const u8) -> [__m256; 4] => q4_0_block(p);
    /// `y += alpha * row` for a q8_0 row of `y.len()` elements (a multiple of 32).
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C; lengths are checked.
    pub(crate) axpy_q8_0(row: &[u8], alpha: f32, y: &mut [f32]) =>
        axpy_blocks(row, alpha, y, Q8_0_BYTES, q8_0_load);
    /// `y += alpha * row` for a q4_0 row of `y.len()` elements (a multiple of 32).
    ///
    /// # Safety
    /// As for [`axpy_q8_0`].
    pub(crate) axpy_q4_0(row: &[u8], alpha: f32, y: &mut [f32]) =>
        axpy_blocks(row, alpha, y, Q4_0_BYTES, q4_0_load);
    /// A q8_0 row of `out.len()` elements to f32.
    ///
    /// # Safety
    /// As for [`axpy_q8_0`].
    pub(crate) to_f32_q8_0(row: &[u8], out: &mut [f32]) =>
        to_f32_blocks(row, out, Q8_0_BYTES, q8_0_load);
    /// A q4_0 row of `out.len()` elements to f32.
    ///
    /// # Safety
    /// As for [`axpy_q8_0`].
    pub(crate) to_f32_q4_0(row: &[u8], out: &mut [f32]) =>
        to_f32_blocks(row, out, Q4_0_BYTES, q4_0_load);
}

/// `y += alphas[0] * rows[0] + ... + alphas[3] * rows[3]` for four q8_0 rows of `y.len()`
/// elements (a multiple of 32), one pass over `y`: each element gets the four fused
/// multiply-adds in row order, so the result equals four [`axpy_q8_0`] calls bit for bit.
///
/// # Safety
/// As for [`axpy_q8_0`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn axpy4_q8_0(rows: [&[u8]; 4], alphas: [f32; 4], y: &mut [f32]) {
    let n_blocks = y.len() / 32;
    assert!(
        y.len().is_multiple_of(32) && rows.iter().all(|r| r.len() >= n_blocks * Q8_0_BYTES),
        "short quantized row"
    );
    let a = [
        _mm256_set1_ps(alphas[0]),
        _mm256_set1_ps(alphas[1]),
        _mm256_set1_ps(alphas[2]),
        _mm256_set1_ps(alphas[3]),
    ];
    let yp = y.as_mut_ptr();
    for b in 0..n_blocks {
        // SAFETY: block b lies inside every row and elements 32b..32b+32 inside `y` (checked
        // above); AVX2, FMA and F16C are enabled on this function.
        unsafe {
            let p = yp.add(32 * b);
            // Written out: a closure here (`[0, 1, 2, 3].map(..)`) was not inlined into this
            // AVX2 function and cost ~5 % of a whole prefill.
            let mut acc = [
                _mm256_loadu_ps(p),
                _mm256_loadu_ps(p.add(8)),
                _mm256_loadu_ps(p.add(16)),
                _mm256_loadu_ps(p.add(24)),
            ];
            for (row, ar) in rows.iter().zip(a) {
                let w = q8_0_block(row.as_ptr().add(b * Q8_0_BYTES));
                for (acc_k, w_k) in acc.iter_mut().zip(w) {
                    *acc_k = _mm256_fmadd_ps(w_k, ar, *acc_k);
                }
            }
            for (k, acc_k) in acc.into_iter().enumerate() {
                _mm256_storeu_ps(p.add(8 * k), acc_k);
            }
        }
    }
}

/// `y = y + alphas[0] * rows[0] + ... + alphas[R-1] * rows[R-1]` for `R` (1 to 4) q8_0 rows of
/// `y.len()` elements (a multiple of 32), one pass over `y`, with each block's scale folded into
/// the row's coefficient: for block `b` of row `i`, `c = alphas[i] * d_b` rounded once to f32,
/// then `y = fma(q, c, y)` per weight `q`, rows in order. That saves the four scale multiplies
/// per 32 weights of [`axpy4_q8_0`] (whose `d * q` is exact, so its one rounding is the FMA's);
/// the results differ from it by the rounding of `c`. With `from_zero` the pass starts from
/// zero instead of `y`'s values (which are not read): as if `y` had been zero-filled first.
/// Equals the generic `axpy_q8_0_folded` bit for bit.
///
/// # Safety
/// As for [`axpy_q8_0`].
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn axpy_q8_0_folded_r<const R: usize>(
    rows: [&[u8]; R],
    alphas: [f32; R],
    y: &mut [f32],
    from_zero: bool,
) {
    let n_blocks = y.len() / 32;
    assert!(
        y.len().is_multiple_of(32) && rows.iter().all(|r| r.len() >= n_blocks * Q8_0_BYTES),
        "short quantized row"
    );
    let yp = y.as_mut_ptr();
    for b in 0..n_blocks {
        // SAFETY: block b lies inside every row and elements 32b..32b+32 inside `y` (checked
        // above); AVX2, FMA and F16C are enabled on this function.
        unsafe {
            let p = yp.add(32 * b);
            let mut acc = if from_zero {
                [_mm256_setzero_ps(); 4]
            } else {
                [
                    _mm256_loadu_ps(p),
                    _mm256_loadu_ps(p.add(8)),
                    _mm256_loadu_ps(p.add(16)),
                    _mm256_loadu_ps(p.add(24)),
                ]
            };
            for (row, &alpha) in rows.iter().zip(&alphas) {
                let block = row.as_ptr().add(b * Q8_0_BYTES);
                let c = _mm256_set1_ps(alpha * scale_f32(block));
                for (acc_k, w_k) in acc.iter_mut().zip(q8_0_ints(block.add(2))) {
                    *acc_k = _mm256_fmadd_ps(w_k, c, *acc_k);
                }
            }
            for (k, acc_k) in acc.into_iter().enumerate() {
                _mm256_storeu_ps(p.add(8 * k), acc_k);
            }
        }
    }
}

/// The table's entry for [`axpy_q8_0_folded_r`]: one to four rows, `alphas` as long as `rows`.
///
/// # Safety
/// As for [`axpy_q8_0`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn axpy_q8_0_folded(rows: &[&[u8]], alphas: &[f32], y: &mut [f32], start: Start) {
    assert!(rows.len() == alphas.len() && (1..=4).contains(&rows.len()));
    let zero = start == Start::Zero;
    // SAFETY: the features are enabled on this function; lengths are checked inside.
    unsafe {
        match rows.len() {
            1 => axpy_q8_0_folded_r::<1>([rows[0]], [alphas[0]], y, zero),
            2 => axpy_q8_0_folded_r::<2>([rows[0], rows[1]], [alphas[0], alphas[1]], y, zero),
            3 => axpy_q8_0_folded_r::<3>(
                [rows[0], rows[1], rows[2]],
                [alphas[0], alphas[1], alphas[2]],
                y,
                zero,
            ),
            _ => axpy_q8_0_folded_r::<4>(
                [rows[0], rows[1], rows[2], rows[3]],
                [alphas[0], alphas[1], alphas[2], alphas[3]],
                y,
                zero,
            ),
        }
    }
}

/// Bytes per q6_K block: `ql[128]`, `qh[64]`, `scales[16]` (int8), d (f16); 256 weights.
const Q6_K_BYTES: usize = 210;

/// Unpacks one q6_K block into 256 signed 6-bit values (-32..31) in ggml's element order, and
/// the 16 per-group scales `d * scales[g]` (groups of 16 elements), computed as ggml does.
#[inline(always)]
unsafe fn q6_k_unpack(p: *const u8, q: &mut [i8; 256], scales: &mut [f32; 16]) {
    // SAFETY: caller guarantees a whole 210-byte block at p and AVX2.
    unsafe {
        let d = half::f16::from_bits(p.add(208).cast::<u16>().read_unaligned()).to_f32();
        for (g, s) in scales.iter_mut().enumerate() {
            *s = d * f32::from(*p.add(192 + g).cast::<i8>());
        }
        let m4 = _mm256_set1_epi8(0x0F);
        let m2 = _mm256_set1_epi8(0x03);
        let bias = _mm256_set1_epi8(32);
        let qp = q.as_mut_ptr();
        for half_ in 0..2 {
            let ql = p.add(64 * half_);
            let qh = _mm256_loadu_si256(p.add(128 + 32 * half_).cast());
            let ql0 = _mm256_loadu_si256(ql.cast());
            let ql1 = _mm256_loadu_si256(ql.add(32).cast());
            let hi = |shift: i32| -> __m256i {
                let v = match shift {
                    0 => qh,
                    2 => _mm256_srli_epi16::<2>(qh),
                    4 => _mm256_srli_epi16::<4>(qh),
                    _ => _mm256_srli_epi16::<6>(qh),
                };
                _mm256_slli_epi16::<4>(_mm256_and_si256(v, m2))
            };
            let lo1 = _mm256_and_si256(ql0, m4);
            let lo2 = _mm256_and_si256(ql1, m4);
            let lo3 = _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), m4);
            let lo4 = _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m4);
            let out = qp.add(128 * half_);
            _mm256_storeu_si256(
                out.cast(),
                _mm256_sub_epi8(_mm256_or_si256(lo1, hi(0)), bias),
            );
            _mm256_storeu_si256(
                out.add(32).cast(),
                _mm256_sub_epi8(_mm256_or_si256(lo2, hi(2)), bias),
            );
            _mm256_storeu_si256(
                out.add(64).cast(),
                _mm256_sub_epi8(_mm256_or_si256(lo3, hi(4)), bias),
            );
            _mm256_storeu_si256(
                out.add(96).cast(),
                _mm256_sub_epi8(_mm256_or_si256(lo4, hi(6)), bias),
            );
        }
    }
}

/// Weights `8 * k .. 8 * k + 8` of an unpacked q6_K block: `(d * scale) * q`, as ggml rounds.
#[inline(always)]
unsafe fn q6_k_weights(q: &[i8; 256], scales: &[f32; 16], k: usize) -> __m256 {
    // SAFETY: k < 32, so the 8 bytes lie inside q; AVX2 per caller.
    unsafe {
        let b = _mm_loadl_epi64(q.as_ptr().add(8 * k).cast());
        let s = _mm256_set1_ps(scales[k / 2]);
        _mm256_mul_ps(s, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)))
    }
}

/// `y += alpha * row` for a q6_K row of `y.len()` elements (a multiple of 256).
///
/// # Safety
/// As for [`axpy_q8_0`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn axpy_q6_k(row: &[u8], alpha: f32, y: &mut [f32]) {
    let n_blocks = y.len() / 256;
    assert!(
        y.len().is_multiple_of(256) && row.len() >= n_blocks * Q6_K_BYTES,
        "short quantized row"
    );
    let a = _mm256_set1_ps(alpha);
    let (mut q, mut sc) = ([0i8; 256], [0f32; 16]);
    for b in 0..n_blocks {
        // SAFETY: block b lies inside `row`, elements 256b..256b+256 inside `y` (checked).
        unsafe {
            q6_k_unpack(row.as_ptr().add(b * Q6_K_BYTES), &mut q, &mut sc);
            let yp = y.as_mut_ptr().add(256 * b);
            for k in 0..32 {
                let w = q6_k_weights(&q, &sc, k);
                let p = yp.add(8 * k);
                _mm256_storeu_ps(p, _mm256_fmadd_ps(w, a, _mm256_loadu_ps(p)));
            }
        }
    }
}

/// A q6_K row of `out.len()` elements (a multiple of 256) to f32.
///
/// # Safety
/// As for [`axpy_q8_0`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn to_f32_q6_k(row: &[u8], out: &mut [f32]) {
    let n_blocks = out.len() / 256;
    assert!(
        out.len().is_multiple_of(256) && row.len() >= n_blocks * Q6_K_BYTES,
        "short quantized row"
    );
    let (mut q, mut sc) = ([0i8; 256], [0f32; 16]);
    for b in 0..n_blocks {
        // SAFETY: as in `axpy_q6_k`.
        unsafe {
            q6_k_unpack(row.as_ptr().add(b * Q6_K_BYTES), &mut q, &mut sc);
            let op = out.as_mut_ptr().add(256 * b);
            for k in 0..32 {
                _mm256_storeu_ps(op.add(8 * k), q6_k_weights(&q, &sc, k));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::kernel_types::RowType;

    /// The block layouts these kernels decode are the linked ggml's.
    #[test]
    fn decoded_layouts_are_ggmls() {
        assert_eq!(
            (RowType::Q8_0.block_elems(), RowType::Q8_0.block_bytes()),
            (32, super::Q8_0_BYTES)
        );
        assert_eq!(
            (RowType::Q4_0.block_elems(), RowType::Q4_0.block_bytes()),
            (32, super::Q4_0_BYTES)
        );
        assert_eq!(
            (RowType::Q6K.block_elems(), RowType::Q6K.block_bytes()),
            (256, super::Q6_K_BYTES)
        );
    }
}
