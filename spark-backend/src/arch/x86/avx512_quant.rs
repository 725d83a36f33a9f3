//! q8_0 rows with AVX-512 (F, BW, VL, on top of AVX2, FMA and F16C): a block's 32 weights in
//! two 16-lane vectors instead of four 8-lane ones. Per element the arithmetic and its order
//! are the AVX2 and generic versions' (`d * q` exact, then one fused multiply-add; folded: `c =
//! alpha * d` rounded once, then `fma(q, c, y)`, rows in order), so the results are the generic
//! version's bits. q4_0 and q6_K borrow the AVX2 entries.

use crate::rows::Start;
use std::arch::x86_64::*;

/// Bytes per q8_0 block: f16 scale + 32 int8 (ggml's `block_q8_0`; the AVX2 file tests it
/// against the linked ggml).
const Q8_0_BYTES: usize = 2 + 32;

/// A block's f16 scale (its first two bytes) as f32, by F16C (exact, as `half`'s).
#[inline(always)]
unsafe fn scale_f32(p: *const u8) -> f32 {
    // SAFETY: the caller guarantees the 2 scale bytes are readable and F16C.
    unsafe {
        let h = p.cast::<u16>().read_unaligned();
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(h))))
    }
}

/// The 32 int8 weights at `q` as two vectors of 16 f32, unscaled.
#[inline(always)]
unsafe fn ints(q: *const u8) -> [__m512; 2] {
    // SAFETY: the caller guarantees 32 readable bytes at `q` and AVX-512 F.
    unsafe {
        [
            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q.cast()))),
            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q.add(16).cast()))),
        ]
    }
}

/// The 32 weights `d * q` of the q8_0 block at `p` (exact in f32).
#[inline(always)]
unsafe fn block(p: *const u8) -> [__m512; 2] {
    // SAFETY: the caller guarantees a whole 34-byte block at `p` and the features.
    unsafe {
        let d = _mm512_set1_ps(scale_f32(p));
        let [w0, w1] = ints(p.add(2));
        [_mm512_mul_ps(w0, d), _mm512_mul_ps(w1, d)]
    }
}

/// The number of whole blocks of an output of `n` elements, checking `rows` hold them.
#[inline(always)]
fn blocks(n: usize, rows: &[&[u8]]) -> usize {
    let n_blocks = n / 32;
    assert!(
        n.is_multiple_of(32) && rows.iter().all(|r| r.len() >= n_blocks * Q8_0_BYTES),
        "short quantized row"
    );
    n_blocks
}

/// `y += alpha * row` for a q8_0 row of `y.len()` elements (a multiple of 32).
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL, AVX2, FMA and F16C; lengths are checked.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(crate) unsafe fn axpy_q8_0(row: &[u8], alpha: f32, y: &mut [f32]) {
    let n_blocks = blocks(y.len(), &[row]);
    let a = _mm512_set1_ps(alpha);
    let yp = y.as_mut_ptr();
    for b in 0..n_blocks {
        // SAFETY: block b lies inside `row` and elements 32b..32b+32 inside `y` (checked);
        // the features are enabled on this function.
        unsafe {
            let w = block(row.as_ptr().add(b * Q8_0_BYTES));
            for (k, wk) in w.into_iter().enumerate() {
                let p = yp.add(32 * b + 16 * k);
                _mm512_storeu_ps(p, _mm512_fmadd_ps(wk, a, _mm512_loadu_ps(p)));
            }
        }
    }
}

/// A q8_0 row of `out.len()` elements (a multiple of 32) to f32.
///
/// # Safety
/// As for [`axpy_q8_0`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(crate) unsafe fn to_f32_q8_0(row: &[u8], out: &mut [f32]) {
    let n_blocks = blocks(out.len(), &[row]);
    let op = out.as_mut_ptr();
    for b in 0..n_blocks {
        // SAFETY: as in `axpy_q8_0`.
        unsafe {
            let w = block(row.as_ptr().add(b * Q8_0_BYTES));
            _mm512_storeu_ps(op.add(32 * b), w[0]);
            _mm512_storeu_ps(op.add(32 * b + 16), w[1]);
        }
    }
}

/// `y += alphas[0] * rows[0] + ... + alphas[3] * rows[3]` for four q8_0 rows of `y.len()`
/// elements (a multiple of 32), one pass over `y`, each element's four fused multiply-adds in
/// row order: four [`axpy_q8_0`] calls bit for bit.
///
/// # Safety
/// As for [`axpy_q8_0`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(crate) unsafe fn axpy4_q8_0(rows: [&[u8]; 4], alphas: [f32; 4], y: &mut [f32]) {
    let n_blocks = blocks(y.len(), &rows);
    let a = [
        _mm512_set1_ps(alphas[0]),
        _mm512_set1_ps(alphas[1]),
        _mm512_set1_ps(alphas[2]),
        _mm512_set1_ps(alphas[3]),
    ];
    let yp = y.as_mut_ptr();
    for b in 0..n_blocks {
        // SAFETY: block b lies inside every row and elements 32b..32b+32 inside `y` (checked);
        // the features are enabled on this function.
        unsafe {
            let p = yp.add(32 * b);
            let mut acc = [_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16))];
            for (row, ar) in rows.iter().zip(a) {
                let w = block(row.as_ptr().add(b * Q8_0_BYTES));
                acc[0] = _mm512_fmadd_ps(w[0], ar, acc[0]);
                acc[1] = _mm512_fmadd_ps(w[1], ar, acc[1]);
            }
            _mm512_storeu_ps(p, acc[0]);
            _mm512_storeu_ps(p.add(16), acc[1]);
        }
    }
}

/// `y = y + alphas[0] * rows[0] + ... + alphas[R-1] * rows[R-1]` (from zero with `from_zero`:
/// `y` is not read) for `R` (1 to 4) q8_0 rows of `y.len()` elements (a multiple of 32), one
/// pass over `y`: per block `b` of row `i`, `c = alphas[i] * d_b` rounded once to f32, then `y
/// = fma(q, c, y)` per weight, rows in order. The generic `axpy_q8_0_folded`'s bits.
///
/// # Safety
/// As for [`axpy_q8_0`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn folded_r<const R: usize>(
    rows: [&[u8]; R],
    alphas: [f32; R],
    y: &mut [f32],
    from_zero: bool,
) {
    let n_blocks = blocks(y.len(), &rows);
    let yp = y.as_mut_ptr();
    for b in 0..n_blocks {
        // SAFETY: block b lies inside every row and elements 32b..32b+32 inside `y` (checked);
        // the features are enabled on this function.
        unsafe {
            let p = yp.add(32 * b);
            let mut acc = if from_zero {
                [_mm512_setzero_ps(); 2]
            } else {
                [_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16))]
            };
            for (row, &alpha) in rows.iter().zip(&alphas) {
                let blk = row.as_ptr().add(b * Q8_0_BYTES);
                let c = _mm512_set1_ps(alpha * scale_f32(blk));
                let [w0, w1] = ints(blk.add(2));
                acc[0] = _mm512_fmadd_ps(w0, c, acc[0]);
                acc[1] = _mm512_fmadd_ps(w1, c, acc[1]);
            }
            _mm512_storeu_ps(p, acc[0]);
            _mm512_storeu_ps(p.add(16), acc[1]);
        }
    }
}

/// The table's entry for [`folded_r`]: one to four rows, `alphas` as long as `rows`.
///
/// # Safety
/// As for [`axpy_q8_0`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(crate) unsafe fn axpy_q8_0_folded(rows: &[&[u8]], alphas: &[f32], y: &mut [f32], start: Start) {
    assert!(rows.len() == alphas.len() && (1..=4).contains(&rows.len()));
    let zero = start == Start::Zero;
    // SAFETY: the features are enabled on this function; lengths are checked inside.
    unsafe {
        match rows.len() {
            1 => folded_r::<1>([rows[0]], [alphas[0]], y, zero),
            2 => folded_r::<2>([rows[0], rows[1]], [alphas[0], alphas[1]], y, zero),
            3 => folded_r::<3>(
                [rows[0], rows[1], rows[2]],
                [alphas[0], alphas[1], alphas[2]],
                y,
                zero,
            ),
            _ => folded_r::<4>(
                [rows[0], rows[1], rows[2], rows[3]],
                [alphas[0], alphas[1], alphas[2], alphas[3]],
                y,
                zero,
            ),
        }
    }
}
