//! Dot products and axpy for rows stored as f32, f16 or bf16 against f32 activations.
//!
//! Each operation has a portable scalar version and an AVX2+FMA+F16C version; [`kernels`] gives
//! the set of the process's instruction set ([`crate::isa::current`], chosen once). All
//! versions accumulate in f32 with a fixed order that does not depend on threads, so results
//! are reproducible run to run.
//! Rows are little-endian bytes (`&[u8]`); `n` elements are read from the start of the row.

use crate::isa::{self, Isa};

/// `sum_i row[i] * x[i]` over `x.len()` elements of a row of bytes.
pub(crate) type DotFn = unsafe fn(row: &[u8], x: &[f32]) -> f32;
/// `y[i] += alpha * row[i]` over `y.len()` elements of a row of bytes.
pub(crate) type AxpyFn = unsafe fn(row: &[u8], alpha: f32, y: &mut [f32]);
/// `out[i] = row[i]` over `out.len()` elements of a row of bytes.
pub(crate) type ToF32Fn = unsafe fn(row: &[u8], out: &mut [f32]);

/// One implementation of every float-row operation.
#[derive(Clone, Copy)]
pub struct Kernels {
    /// The instruction set of these implementations.
    pub isa: Isa,
    /// Dot product, f32 rows.
    pub dot_f32: DotFn,
    /// Dot product, f16 rows.
    pub dot_f16: DotFn,
    /// Dot product, bf16 rows.
    pub dot_bf16: DotFn,
    /// axpy, f32 rows.
    pub axpy_f32: AxpyFn,
    /// axpy, f16 rows.
    pub axpy_f16: AxpyFn,
    /// axpy, bf16 rows.
    pub axpy_bf16: AxpyFn,
    /// Conversion of an f16 row to f32.
    pub f16_to_f32: ToF32Fn,
    /// Conversion of a bf16 row to f32.
    pub bf16_to_f32: ToF32Fn,
}

/// The portable implementations (the reference the SIMD versions are tested against).
pub const SCALAR: Kernels = Kernels {
    isa: Isa::Scalar,
    dot_f32: scalar::dot_f32,
    dot_f16: scalar::dot_f16,
    dot_bf16: scalar::dot_bf16,
    axpy_f32: scalar::axpy_f32,
    axpy_f16: scalar::axpy_f16,
    axpy_bf16: scalar::axpy_bf16,
    f16_to_f32: scalar::f16_to_f32,
    bf16_to_f32: scalar::bf16_to_f32,
};

/// The AVX2+FMA+F16C implementations, when this CPU has those features.
pub fn avx2() -> Option<Kernels> {
    #[cfg(target_arch = "x86_64")]
    if Isa::detect() == Isa::Avx2 {
        return Some(x86::KERNELS);
    }
    None
}

/// The implementations of the process's instruction set ([`isa::current`]).
#[inline]
pub(crate) fn kernels() -> &'static Kernels {
    match isa::current() {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => &x86::KERNELS,
        _ => &SCALAR,
    }
}

/// Portable reference versions. Safe to call with any inputs that satisfy the length contract
/// (`row` holds at least `len * element size` bytes); declared `unsafe fn` only to share the
/// function-pointer type with the SIMD versions.
pub(crate) mod scalar {
    fn f16_at(row: &[u8], i: usize) -> f32 {
        half::f16::from_bits(u16::from_le_bytes([row[2 * i], row[2 * i + 1]])).to_f32()
    }

    fn bf16_at(row: &[u8], i: usize) -> f32 {
        f32::from_bits(u32::from(u16::from_le_bytes([row[2 * i], row[2 * i + 1]])) << 16)
    }

    fn f32_at(row: &[u8], i: usize) -> f32 {
        f32::from_le_bytes([row[4 * i], row[4 * i + 1], row[4 * i + 2], row[4 * i + 3]])
    }

    /// Dot product of an f32 row with `x`.
    ///
    /// # Safety
    /// None beyond the length contract (checked: panics if `row` is short).
    pub(crate) unsafe fn dot_f32(row: &[u8], x: &[f32]) -> f32 {
        x.iter().enumerate().map(|(i, &v)| f32_at(row, i) * v).sum()
    }
    /// Dot product of an f16 row with `x`.
    ///
    /// # Safety
    /// None beyond the length contract (checked).
    pub(crate) unsafe fn dot_f16(row: &[u8], x: &[f32]) -> f32 {
        x.iter().enumerate().map(|(i, &v)| f16_at(row, i) * v).sum()
    }
    /// Dot product of a bf16 row with `x`.
    ///
    /// # Safety
    /// None beyond the length contract (checked).
    pub(crate) unsafe fn dot_bf16(row: &[u8], x: &[f32]) -> f32 {
        x.iter()
            .enumerate()
            .map(|(i, &v)| bf16_at(row, i) * v)
            .sum()
    }
    /// `y += alpha * row` for an f32 row.
    ///
    /// # Safety
    /// None beyond the length contract (checked).
    pub(crate) unsafe fn axpy_f32(row: &[u8], alpha: f32, y: &mut [f32]) {
        for (i, o) in y.iter_mut().enumerate() {
            *o = f32_at(row, i).mul_add(alpha, *o);
        }
    }
    /// `y += alpha * row` for an f16 row.
    ///
    /// # Safety
    /// None beyond the length contract (checked).
    pub(crate) unsafe fn axpy_f16(row: &[u8], alpha: f32, y: &mut [f32]) {
        for (i, o) in y.iter_mut().enumerate() {
            *o = f16_at(row, i).mul_add(alpha, *o);
        }
    }
    /// `y += alpha * row` for a bf16 row.
    ///
    /// # Safety
    /// None beyond the length contract (checked).
    pub(crate) unsafe fn axpy_bf16(row: &[u8], alpha: f32, y: &mut [f32]) {
        for (i, o) in y.iter_mut().enumerate() {
            *o = bf16_at(row, i).mul_add(alpha, *o);
        }
    }
    /// f16 row to f32.
    ///
    /// # Safety
    /// None beyond the length contract (checked).
    pub(crate) unsafe fn f16_to_f32(row: &[u8], out: &mut [f32]) {
        for (i, o) in out.iter_mut().enumerate() {
            *o = f16_at(row, i);
        }
    }
    /// bf16 row to f32.
    ///
    /// # Safety
    /// None beyond the length contract (checked).
    pub(crate) unsafe fn bf16_to_f32(row: &[u8], out: &mut [f32]) {
        for (i, o) in out.iter_mut().enumerate() {
            *o = bf16_at(row, i);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::Kernels;
    use crate::isa::Isa;
    use std::arch::x86_64::*;

    /// The table of this module's functions. Only handed out where the CPU has AVX2, FMA and
    /// F16C (`super::avx2`, `super::kernels`).
    pub(super) const KERNELS: Kernels = Kernels {
        isa: Isa::Avx2,
        dot_f32,
        dot_f16,
        dot_bf16,
        axpy_f32,
        axpy_f16,
        axpy_bf16,
        f16_to_f32,
        bf16_to_f32,
    };

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

    // The entry points: `unsafe` because they require AVX2+FMA+F16C, which `super::avx2` and
    // `super::kernels` check before handing them out.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn dot_f32(row: &[u8], x: &[f32]) -> f32 {
        // SAFETY: features enabled on this function; lengths checked inside.
        unsafe { dot_impl::<F32>(row, x) }
    }
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn dot_f16(row: &[u8], x: &[f32]) -> f32 {
        // SAFETY: as above.
        unsafe { dot_impl::<F16>(row, x) }
    }
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn dot_bf16(row: &[u8], x: &[f32]) -> f32 {
        // SAFETY: as above.
        unsafe { dot_impl::<Bf16>(row, x) }
    }
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn axpy_f32(row: &[u8], alpha: f32, y: &mut [f32]) {
        // SAFETY: as above.
        unsafe { axpy_impl::<F32>(row, alpha, y) }
    }
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn axpy_f16(row: &[u8], alpha: f32, y: &mut [f32]) {
        // SAFETY: as above.
        unsafe { axpy_impl::<F16>(row, alpha, y) }
    }
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn axpy_bf16(row: &[u8], alpha: f32, y: &mut [f32]) {
        // SAFETY: as above.
        unsafe { axpy_impl::<Bf16>(row, alpha, y) }
    }
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn f16_to_f32(row: &[u8], out: &mut [f32]) {
        // SAFETY: as above.
        unsafe { to_f32_impl::<F16>(row, out) }
    }
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn bf16_to_f32(row: &[u8], out: &mut [f32]) {
        // SAFETY: as above.
        unsafe { to_f32_impl::<Bf16>(row, out) }
    }
}
