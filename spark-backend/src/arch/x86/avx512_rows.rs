//! Float rows (f32, f16, bf16) with AVX-512 F, BW and VL (on top of AVX2, FMA and F16C): axpy
//! and conversion, 16 elements per step and the tail masked. Per element one fused
//! multiply-add (axpy) or one exact conversion, as the generic version: its bits. The dot
//! products borrow the AVX2 entries (their summation order is the AVX2 table's).

use std::arch::x86_64::*;

/// 16 row elements at element index `i` as f32, or the first `n < 16` (the other lanes zero and
/// not read).
trait Load16 {
    /// Bytes per element.
    const SIZE: usize;
    /// # Safety
    /// Elements `i .. i + n.min(16)` at `p` must be readable; AVX-512 F/BW/VL.
    unsafe fn load(p: *const u8, i: usize, n: usize) -> __m512;
}

struct F32;
struct F16;
struct Bf16;

/// The mask of the first `n` lanes (all 16 for `n >= 16`).
#[inline(always)]
fn mask(n: usize) -> __mmask16 {
    if n >= 16 {
        !0
    } else {
        ((1u32 << n) - 1) as __mmask16
    }
}

impl Load16 for F32 {
    const SIZE: usize = 4;
    #[inline(always)]
    unsafe fn load(p: *const u8, i: usize, n: usize) -> __m512 {
        // SAFETY: per the contract; masked-off lanes are not read; unaligned.
        unsafe { _mm512_maskz_loadu_ps(mask(n), p.add(4 * i).cast()) }
    }
}
impl Load16 for F16 {
    const SIZE: usize = 2;
    #[inline(always)]
    unsafe fn load(p: *const u8, i: usize, n: usize) -> __m512 {
        // SAFETY: per the contract; masked-off lanes are not read; F16C conversion is exact.
        unsafe { _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask(n), p.add(2 * i).cast())) }
    }
}
impl Load16 for Bf16 {
    const SIZE: usize = 2;
    #[inline(always)]
    unsafe fn load(p: *const u8, i: usize, n: usize) -> __m512 {
        // SAFETY: per the contract; masked-off lanes are not read. bf16 is the top half of f32.
        unsafe {
            let h = _mm256_maskz_loadu_epi16(mask(n), p.add(2 * i).cast());
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
        }
    }
}

#[inline(always)]
unsafe fn axpy_impl<T: Load16>(row: &[u8], alpha: f32, y: &mut [f32]) {
    let n = y.len();
    assert!(row.len() >= n * T::SIZE, "row shorter than output");
    let p = row.as_ptr();
    let yp = y.as_mut_ptr();
    // SAFETY: every access stays below n elements of `row` (checked) and `y`, the last step
    // masked; the caller's target features include AVX-512 F/BW/VL and FMA.
    unsafe {
        let a = _mm512_set1_ps(alpha);
        let mut i = 0;
        while i + 32 <= n {
            let y0 = _mm512_fmadd_ps(T::load(p, i, 16), a, _mm512_loadu_ps(yp.add(i)));
            let y1 = _mm512_fmadd_ps(T::load(p, i + 16, 16), a, _mm512_loadu_ps(yp.add(i + 16)));
            _mm512_storeu_ps(yp.add(i), y0);
            _mm512_storeu_ps(yp.add(i + 16), y1);
            i += 32;
        }
        while i < n {
            let m = mask(n - i);
            let y0 = _mm512_fmadd_ps(T::load(p, i, n - i), a, _mm512_maskz_loadu_ps(m, yp.add(i)));
            _mm512_mask_storeu_ps(yp.add(i), m, y0);
            i += 16;
        }
    }
}

#[inline(always)]
unsafe fn to_f32_impl<T: Load16>(row: &[u8], out: &mut [f32]) {
    let n = out.len();
    assert!(row.len() >= n * T::SIZE, "row shorter than output");
    let p = row.as_ptr();
    let op = out.as_mut_ptr();
    // SAFETY: every access stays below n elements of `row` (checked) and `out`, the last step
    // masked.
    unsafe {
        let mut i = 0;
        while i < n {
            _mm512_mask_storeu_ps(op.add(i), mask(n - i), T::load(p, i, n - i));
            i += 16;
        }
    }
}

// The entry points: `unsafe` because they require AVX-512 F/BW/VL, AVX2, FMA and F16C, which
// `arch::table` checks before handing out the table.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(crate) unsafe fn axpy_f32(row: &[u8], alpha: f32, y: &mut [f32]) {
    // SAFETY: features enabled on this function; lengths checked inside.
    unsafe { axpy_impl::<F32>(row, alpha, y) }
}
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(crate) unsafe fn axpy_f16(row: &[u8], alpha: f32, y: &mut [f32]) {
    // SAFETY: as above.
    unsafe { axpy_impl::<F16>(row, alpha, y) }
}
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(crate) unsafe fn axpy_bf16(row: &[u8], alpha: f32, y: &mut [f32]) {
    // SAFETY: as above.
    unsafe { axpy_impl::<Bf16>(row, alpha, y) }
}
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(crate) unsafe fn f16_to_f32(row: &[u8], out: &mut [f32]) {
    // SAFETY: as above.
    unsafe { to_f32_impl::<F16>(row, out) }
}
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(crate) unsafe fn bf16_to_f32(row: &[u8], out: &mut [f32]) {
    // SAFETY: as above.
    unsafe { to_f32_impl::<Bf16>(row, out) }
}
