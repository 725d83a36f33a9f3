//! Float rows (f32, f16, bf16 against f32 activations) with NEON: 16 elements per step in four
//! accumulators for dots (a fixed order, so reproducible), one fused multiply-add per element
//! for axpy (the generic version's bits). f16 is widened by `FCVTL` (base AArch64 Advanced
//! SIMD; Rust's f16 vector types are not stable, hence `asm!`), bf16 by a 16-bit shift.

use crate::arch::table::target_feature_entries;
use std::arch::aarch64::*;
use std::arch::asm;

/// Four f16 values (as raw bits) widened to f32, exactly.
#[inline(always)]
pub(super) fn f16x4_to_f32(h: uint16x4_t) -> float32x4_t {
    let out: float32x4_t;
    // SAFETY: FCVTL from 4H to 4S is part of the base Advanced SIMD set every AArch64 CPU has;
    // it reads and writes only the named vector registers.
    unsafe {
        asm!(
            "fcvtl {out:v}.4s, {inp:v}.4h",
            out = lateout(vreg) out,
            inp = in(vreg) h,
            options(pure, nomem, nostack, preserves_flags)
        )
    };
    out
}

/// Loads 4 row elements at element index `i` as f32.
trait Load4 {
    /// Bytes per element.
    const SIZE: usize;
    /// # Safety
    /// Elements `i .. i + 4` from `p` must be readable.
    unsafe fn load4(p: *const u8, i: usize) -> float32x4_t;
    /// Scalar element `i`.
    /// # Safety
    /// Element `i` must be readable.
    unsafe fn load1(p: *const u8, i: usize) -> f32;
}

struct F32;
struct F16;
struct Bf16;

impl Load4 for F32 {
    const SIZE: usize = 4;
    #[inline(always)]
    unsafe fn load4(p: *const u8, i: usize) -> float32x4_t {
        // SAFETY: caller guarantees 4 f32 readable at element i; LD1 has no alignment need.
        unsafe { vld1q_f32(p.add(4 * i).cast()) }
    }
    #[inline(always)]
    unsafe fn load1(p: *const u8, i: usize) -> f32 {
        // SAFETY: caller guarantees element i is readable; read_unaligned has no alignment need.
        unsafe { p.add(4 * i).cast::<f32>().read_unaligned() }
    }
}

impl Load4 for F16 {
    const SIZE: usize = 2;
    #[inline(always)]
    unsafe fn load4(p: *const u8, i: usize) -> float32x4_t {
        // SAFETY: caller guarantees 4 f16 (8 bytes) readable at element i.
        f16x4_to_f32(unsafe { vld1_u16(p.add(2 * i).cast()) })
    }
    #[inline(always)]
    unsafe fn load1(p: *const u8, i: usize) -> f32 {
        // SAFETY: caller guarantees element i is readable.
        let b = unsafe { p.add(2 * i).cast::<u16>().read_unaligned() };
        half::f16::from_bits(b).to_f32()
    }
}

impl Load4 for Bf16 {
    const SIZE: usize = 2;
    #[inline(always)]
    unsafe fn load4(p: *const u8, i: usize) -> float32x4_t {
        // SAFETY: caller guarantees 4 bf16 (8 bytes) readable at element i.
        unsafe { vreinterpretq_f32_u32(vshll_n_u16::<16>(vld1_u16(p.add(2 * i).cast()))) }
    }
    #[inline(always)]
    unsafe fn load1(p: *const u8, i: usize) -> f32 {
        // SAFETY: caller guarantees element i is readable.
        let b = unsafe { p.add(2 * i).cast::<u16>().read_unaligned() };
        f32::from_bits(u32::from(b) << 16)
    }
}

#[inline(always)]
unsafe fn dot_impl<T: Load4>(row: &[u8], x: &[f32]) -> f32 {
    let n = x.len();
    assert!(row.len() >= n * T::SIZE, "row shorter than activation");
    let p = row.as_ptr();
    let xp = x.as_ptr();
    // SAFETY: every load below stays below n elements of both `row` (checked above) and `x`.
    unsafe {
        let mut acc = [vdupq_n_f32(0.0); 4];
        let mut i = 0;
        while i + 16 <= n {
            for (k, a) in acc.iter_mut().enumerate() {
                let j = i + 4 * k;
                *a = vfmaq_f32(*a, T::load4(p, j), vld1q_f32(xp.add(j)));
            }
            i += 16;
        }
        while i + 4 <= n {
            acc[0] = vfmaq_f32(acc[0], T::load4(p, i), vld1q_f32(xp.add(i)));
            i += 4;
        }
        let s = vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3]));
        let mut total = vaddvq_f32(s);
        while i < n {
            total += T::load1(p, i) * *xp.add(i);
            i += 1;
        }
        total
    }
}

#[inline(always)]
unsafe fn axpy_impl<T: Load4>(row: &[u8], alpha: f32, y: &mut [f32]) {
    let n = y.len();
    assert!(row.len() >= n * T::SIZE, "row shorter than output");
    let p = row.as_ptr();
    let yp = y.as_mut_ptr();
    // SAFETY: every access stays below n elements of `row` (checked) and `y`.
    unsafe {
        let a = vdupq_n_f32(alpha);
        let mut i = 0;
        while i + 8 <= n {
            let y0 = vfmaq_f32(vld1q_f32(yp.add(i)), T::load4(p, i), a);
            let y1 = vfmaq_f32(vld1q_f32(yp.add(i + 4)), T::load4(p, i + 4), a);
            vst1q_f32(yp.add(i), y0);
            vst1q_f32(yp.add(i + 4), y1);
            i += 8;
        }
        while i + 4 <= n {
            vst1q_f32(
                yp.add(i),
                vfmaq_f32(vld1q_f32(yp.add(i)), T::load4(p, i), a),
            );
            i += 4;
        }
        while i < n {
            *yp.add(i) = T::load1(p, i).mul_add(alpha, *yp.add(i));
            i += 1;
        }
    }
}

#[inline(always)]
unsafe fn to_f32_impl<T: Load4>(row: &[u8], out: &mut [f32]) {
    let n = out.len();
    assert!(row.len() >= n * T::SIZE, "row shorter than output");
    let p = row.as_ptr();
    let op = out.as_mut_ptr();
    // SAFETY: every access stays below n elements of `row` (checked) and `out`.
    unsafe {
        let mut i = 0;
        while i + 4 <= n {
            vst1q_f32(op.add(i), T::load4(p, i));
            i += 4;
        }
        while i < n {
            *op.add(i) = T::load1(p, i);
            i += 1;
        }
    }
}

// The entry points: `unsafe` because they require NEON, which `arch::table` checks before
// handing out the table (every AArch64 CPU has it).
target_feature_entries! { "neon";
    pub(crate) dot_f32(row: &[u8], x: &[f32]) -> f32 => dot_impl::<F32>(row, x);
    pub(crate) dot_f16(row: &[u8], x: &[f32]) -> f32 => dot_impl::<F16>(row, x);
    pub(crate) dot_bf16(row: &[u8], x: &[f32]) -> f32 => dot_impl::<Bf16>(row, x);
    pub(crate) axpy_f32(row: &[u8], alpha: f32, y: &mut [f32]) => axpy_impl::<F32>(row, alpha, y);
    pub(crate) axpy_f16(row: &[u8], alpha: f32, y: &mut [f32]) => axpy_impl::<F16>(row, alpha, y);
    pub(crate) axpy_bf16(row: &[u8], alpha: f32, y: &mut [f32]) => axpy_impl::<Bf16>(row, alpha, y);
    pub(crate) f16_to_f32(row: &[u8], out: &mut [f32]) => to_f32_impl::<F16>(row, out);
    pub(crate) bf16_to_f32(row: &[u8], out: &mut [f32]) => to_f32_impl::<Bf16>(row, out);
}
