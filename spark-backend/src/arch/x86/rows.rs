//! Float rows (f32, f16, bf16 against f32 activations) with AVX2, FMA and F16C: 32 elements
//! per step in four accumulators for dots (a fixed order, so reproducible), one FMA per element
//! for axpy (the generic version's bits).

use crate::arch::table::target_feature_entries;
use std::arch::x86_64::*;

/// Horizontal sum of 8 lanes in a fixed order.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hsum(v: __m256) -> f32 {
    let lo = _mm256_castps256_ps128(v);
    let hi = _mm256_extractf128_ps::<1>(v);
    let s = _mm_add_ps(lo, hi);
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps::<0b01>(s, s));
    _mm_cvtss_f32(s)
}

/// Loads 8 row elements at element index `i` as f32.
trait Load8 {
    /// # Safety
    /// `p + i .. p + i + 8` elements must be readable.
    unsafe fn load8(p: *const u8, i: usize) -> __m256;
    /// Scalar element `i`.
    /// # Safety
    /// Element `i` must be readable.
    unsafe fn load1(p: *const u8, i: usize) -> f32;
    const SIZE: usize;
}

struct F32;
struct F16;
struct Bf16;

impl Load8 for F32 {
    const SIZE: usize = 4;
    #[inline(always)]
    unsafe fn load8(p: *const u8, i: usize) -> __m256 {
        // SAFETY: caller guarantees 8 f32 readable at element i; loadu has no alignment need.
        unsafe { _mm256_loadu_ps(p.add(4 * i).cast()) }
    }
    #[inline(always)]
    unsafe fn load1(p: *const u8, i: usize) -> f32 {
        // SAFETY: caller guarantees element i is readable; read_unaligned has no alignment need.
        unsafe { p.add(4 * i).cast::<f32>().read_unaligned() }
    }
}
impl Load8 for F16 {
    const SIZE: usize = 2;
    #[inline(always)]
    unsafe fn load8(p: *const u8, i: usize) -> __m256 {
        // SAFETY: caller guarantees 8 f16 (16 bytes) readable at element i; F16C is enabled
        // in every caller's target features.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.add(2 * i).cast())) }
    }
    #[inline(always)]
    unsafe fn load1(p: *const u8, i: usize) -> f32 {
        // SAFETY: caller guarantees element i is readable.
        let b = unsafe { p.add(2 * i).cast::<u16>().read_unaligned() };
        half::f16::from_bits(b).to_f32()
    }
}
impl Load8 for Bf16 {
    const SIZE: usize = 2;
    #[inline(always)]
    unsafe fn load8(p: *const u8, i: usize) -> __m256 {
        // SAFETY: caller guarantees 8 bf16 (16 bytes) readable at element i.
        unsafe {
            let h = _mm_loadu_si128(p.add(2 * i).cast());
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
        }
    }
    #[inline(always)]
    unsafe fn load1(p: *const u8, i: usize) -> f32 {
        // SAFETY: caller guarantees element i is readable.
        let b = unsafe { p.add(2 * i).cast::<u16>().read_unaligned() };
        f32::from_bits(u32::from(b) << 16)
    }
}

#[inline(always)]
unsafe fn dot_impl<T: Load8>(row: &[u8], x: &[f32]) -> f32 {
    let n = x.len();
    assert!(row.len() >= n * T::SIZE, "row shorter than activation");
    let p = row.as_ptr();
    let xp = x.as_ptr();
    // SAFETY: every load below stays below n elements of both `row` (checked above) and
    // `x`; the caller's target features include AVX2, FMA and F16C.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i + 32 <= n {
            for (k, a) in acc.iter_mut().enumerate() {
                let j = i + 8 * k;
                *a = _mm256_fmadd_ps(T::load8(p, j), _mm256_loadu_ps(xp.add(j)), *a);
            }
            i += 32;
        }
        while i + 8 <= n {
            acc[0] = _mm256_fmadd_ps(T::load8(p, i), _mm256_loadu_ps(xp.add(i)), acc[0]);
            i += 8;
        }
        let s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
        let mut total = hsum(s);
        while i < n {
            total += T::load1(p, i) * *xp.add(i);
            i += 1;
        }
        total
    }
}

#[inline(always)]
unsafe fn axpy_impl<T: Load8>(row: &[u8], alpha: f32, y: &mut [f32]) {
    let n = y.len();
    assert!(row.len() >= n * T::SIZE, "row shorter than output");
    let p = row.as_ptr();
    let yp = y.as_mut_ptr();
    // SAFETY: every access stays below n elements of `row` (checked) and `y`; the caller's
    // target features include AVX2, FMA and F16C.
    unsafe {
        let a = _mm256_set1_ps(alpha);
        let mut i = 0;
        while i + 16 <= n {
            let y0 = _mm256_fmadd_ps(T::load8(p, i), a, _mm256_loadu_ps(yp.add(i)));
            let y1 = _mm256_fmadd_ps(T::load8(p, i + 8), a, _mm256_loadu_ps(yp.add(i + 8)));
            _mm256_storeu_ps(yp.add(i), y0);
            _mm256_storeu_ps(yp.add(i + 8), y1);
            i += 16;
        }
        while i + 8 <= n {
            let y0 = _mm256_fmadd_ps(T::load8(p, i), a, _mm256_loadu_ps(yp.add(i)));
            _mm256_storeu_ps(yp.add(i), y0);
            i += 8;
        }
        while i < n {
            *yp.add(i) = T::load1(p, i).mul_add(alpha, *yp.add(i));
            i += 1;
        }
    }
}

#[inline(always)]
unsafe fn to_f32_impl<T: Load8>(row: &[u8], out: &mut [f32]) {
    let n = out.len();
    assert!(row.len() >= n * T::SIZE, "row shorter than output");
    let p = row.as_ptr();
    let op = out.as_mut_ptr();
    // SAFETY: every access stays below n elements of `row` (checked) and `out`.
    unsafe {
        let mut i = 0;
        while i + 8 <= n {
            _mm256_storeu_ps(op.add(i), T::load8(p, i));
            i += 8;
        }
        while i < n {
            *op.add(i) = T::load1(p, i);
            i += 1;
        }
    }
}

// The entry points: `unsafe` because they require AVX2+FMA+F16C, which `arch::table` checks
// before handing out the table.
target_feature_entries! { "avx2,fma,f16c";
    pub(crate) dot_f32(row: &[u8], x: &[f32]) -> f32 => dot_impl::<F32>(row, x);
    pub(crate) dot_f16(row: &[u8], x: &[f32]) -> f32 => dot_impl::<F16>(row, x);
    pub(crate) dot_bf16(row: &[u8], x: &[f32]) -> f32 => dot_impl::<Bf16>(row, x);
    pub(crate) axpy_f32(row: &[u8], alpha: f32, y: &mut [f32]) => axpy_impl::<F32>(row, alpha, y);
    pub(crate) axpy_f16(row: &[u8], alpha: f32, y: &mut [f32]) => axpy_impl::<F16>(row, alpha, y);
    pub(crate) axpy_bf16(row: &[u8], alpha: f32, y: &mut [f32]) => axpy_impl::<Bf16>(row, alpha, y);
    pub(crate) f16_to_f32(row: &[u8], out: &mut [f32]) => to_f32_impl::<F16>(row, out);
    pub(crate) bf16_to_f32(row: &[u8], out: &mut [f32]) => to_f32_impl::<Bf16>(row, out);
}
