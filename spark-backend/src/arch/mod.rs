//! Every SIMD kernel of the crate, one table per instruction set, and the one choice of table
//! per process.
//!
//! Four kernel families have versions per instruction set: float rows (f32, f16 and bf16 dot,
//! axpy, conversion), quantized rows (q8_0, q4_0 and q6_K axpy and dequantization, the four-row
//! q8_0 axpy and the FFN's folded q8_0 axpy), the statistical top-k's shifted sums, and
//! attention's dot products and value accumulation. Each family is one file per instruction
//! set, with the same name in each folder, so its versions stand side by side:
//!
//! ```text
//! arch/generic/{rows,quant,topk,attention}.rs   portable Rust: the references
//! arch/x86/{rows,quant,topk,attention}.rs       AVX2 + FMA + F16C          (x86-64)
//! arch/arm/{rows,quant,topk,attention}.rs       NEON                       (aarch64)
//! ```
//!
//! Each instruction set has one [`Kernels`] table (`generic::KERNELS`, `x86::AVX2`,
//! `arm::NEON`): a struct literal, so adding an operation makes the compiler ask every table for it, and
//! [`table`] picks the table by an exhaustive `match` on [`Isa`], whose variants exist only on
//! their architecture, so adding an instruction set makes the compiler name every place it must
//! fill. A table may borrow another one's entry (the generic version where a SIMD one would not
//! gain); `docs/PERF.md` ("Instruction sets") says which version each family runs per CPU.
//!
//! The promises of each family hold for every table: float and quantized axpy, dequantization,
//! the folded q8_0 axpy and the top-k sums give the generic version's bits; dot products keep a
//! fixed summation order per table (reproducible run to run, independent of threads) and
//! differ from the generic version only by rounding. The tests compare every table the running
//! CPU has ([`Isa::available`]) with the generic one.
//!
//! The callers ask [`kernels`] at the entry of a row or a block, never inside an inner loop.
//! `SPARK_ISA=generic|avx2|neon` makes the process use a lower instruction set than the best
//! its CPU has (for tests and comparisons); a name the CPU lacks is refused with one line on
//! stderr and the best is used.

use crate::attention::dot::{Queries, Rows, Scores};
use crate::rows::Start;
use std::ops::Range;
use std::sync::OnceLock;

#[cfg(target_arch = "aarch64")]
mod arm;
pub(crate) mod generic;
#[cfg(target_arch = "x86_64")]
mod x86;

/// An instruction set the kernels have a table for. Variants exist only on their
/// architecture, so matches on `Isa` are exhaustive per target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// Portable Rust (the references).
    Generic,
    /// x86-64 with AVX2, FMA and F16C (every kernel of the table may use all three).
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// AArch64 with Advanced SIMD (NEON), which every AArch64 CPU has.
    #[cfg(target_arch = "aarch64")]
    Neon,
}

impl Isa {
    /// Every instruction set this build has a table for, from the generic one up.
    pub const ALL: &'static [Isa] = &[
        Isa::Generic,
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2,
        #[cfg(target_arch = "aarch64")]
        Isa::Neon,
    ];

    /// The name `SPARK_ISA` takes and the reports print.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Generic => "generic",
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => "avx2",
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => "neon",
        }
    }

    /// Whether the running CPU has every feature this instruction set's table uses.
    pub fn is_supported(self) -> bool {
        match self {
            Isa::Generic => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => x86::avx2_supported(),
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => arm::neon_supported(),
        }
    }

    /// Every instruction set the running CPU supports, from the generic one up.
    pub fn available() -> Vec<Isa> {
        Isa::ALL
            .iter()
            .copied()
            .filter(|i| i.is_supported())
            .collect()
    }

    /// The best instruction set the running CPU supports.
    pub fn detect() -> Self {
        Isa::ALL
            .iter()
            .rev()
            .copied()
            .find(|i| i.is_supported())
            .unwrap_or(Isa::Generic)
    }

    /// The instruction set named `name` (as [`Isa::name`] prints it), if this build has it.
    pub fn from_name(name: &str) -> Option<Self> {
        Isa::ALL.iter().copied().find(|i| i.name() == name)
    }
}

/// The process's choice, made by [`current`] on first use.
static CHOSEN_ISA: OnceLock<Isa> = OnceLock::new();

/// The instruction set every kernel of this process uses, chosen on first use: [`Isa::detect`],
/// or the one `SPARK_ISA` names when the CPU supports it.
pub fn current() -> Isa {
    *CHOSEN_ISA.get_or_init(|| choose(std::env::var("SPARK_ISA").ok().as_deref()))
}

/// The instruction set the CPU kernels of this process run, if one ran yet (no choice is made
/// here: safe to call from a signal handler, as the `SPARK_STATS` report is).
pub fn in_use() -> Option<Isa> {
    CHOSEN_ISA.get().copied()
}

/// The choice [`current`] makes for a `SPARK_ISA` value (`None`: unset).
fn choose(requested: Option<&str>) -> Isa {
    let best = Isa::detect();
    let Some(name) = requested.map(str::trim).filter(|n| !n.is_empty()) else {
        return best;
    };
    match Isa::from_name(name) {
        Some(isa) if isa.is_supported() => isa,
        Some(_) => {
            eprintln!(
                "spark: SPARK_ISA={name}: this CPU lacks it; using {}",
                best.name()
            );
            best
        }
        None => {
            let names: Vec<&str> = Isa::ALL.iter().map(|i| i.name()).collect();
            eprintln!(
                "spark: SPARK_ISA={name}: unknown (this build has {}); using {}",
                names.join(", "),
                best.name()
            );
            best
        }
    }
}

/// The table of the process's instruction set ([`current`]).
#[inline]
pub(crate) fn kernels() -> &'static Kernels {
    static CHOSEN: OnceLock<&'static Kernels> = OnceLock::new();
    CHOSEN.get_or_init(|| table(current()).expect("the current ISA is supported"))
}

/// The table of `isa`, when the running CPU supports it (its entries may then be called).
pub fn table(isa: Isa) -> Option<&'static Kernels> {
    if !isa.is_supported() {
        return None;
    }
    Some(match isa {
        Isa::Generic => &generic::KERNELS,
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => &x86::AVX2,
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => &arm::NEON,
    })
}

/// `sum_i row[i] * x[i]` over `x.len()` elements of a row of bytes.
pub type DotFn = unsafe fn(row: &[u8], x: &[f32]) -> f32;
/// `y[i] += alpha * row[i]` over `y.len()` elements of a row of bytes.
pub type AxpyFn = unsafe fn(row: &[u8], alpha: f32, y: &mut [f32]);
/// `out[i] = row[i]` over `out.len()` elements of a row of bytes.
pub type ToF32Fn = unsafe fn(row: &[u8], out: &mut [f32]);
/// `y += alphas[0] * rows[0] + ... + alphas[3] * rows[3]`, bit for bit four axpys in order.
pub type Axpy4Fn = unsafe fn(rows: [&[u8]; 4], alphas: [f32; 4], y: &mut [f32]);
/// The folded q8_0 axpy of up to four rows (`rows::axpy_folded`).
pub type FoldedFn = unsafe fn(rows: &[&[u8]], alphas: &[f32], y: &mut [f32], start: Start);
/// Sums of `x - shift` and `(x - shift)^2` in eight f64 lanes, with the count (`topk`).
pub type ShiftedSumsFn = unsafe fn(x: &[f32], shift: f64) -> (f64, f64, usize);
/// Attention scores of listed cache rows against queries (`attention::dot::dots`).
pub(crate) type AttnDotsFn = unsafe fn(Rows, Range<usize>, &[u32], Queries<'_>, Scores<'_>);
/// Weighted sum of listed cache rows into `out` (`attention::dot::accumulate`).
pub(crate) type AttnAccumulateFn = unsafe fn(Rows, &[u32], &[f32], &mut [f32]);

/// One version of every kernel. The entries are `unsafe fn`: they may use CPU features that
/// [`table`] checked before handing the table out; each also states its length contract
/// (checked inside, panicking on a short row, unless said otherwise).
#[derive(Clone, Copy)]
pub struct Kernels {
    /// The instruction set of this table.
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
    /// axpy, q8_0 rows (length a multiple of 32): ggml's `to_float`, then an f32 axpy.
    pub axpy_q8_0: AxpyFn,
    /// axpy, q4_0 rows (length a multiple of 32).
    pub axpy_q4_0: AxpyFn,
    /// axpy, q6_K rows (length a multiple of 256).
    pub axpy_q6_k: AxpyFn,
    /// Dequantization of a q8_0 row, as ggml's `to_float`.
    pub to_f32_q8_0: ToF32Fn,
    /// Dequantization of a q4_0 row.
    pub to_f32_q4_0: ToF32Fn,
    /// Dequantization of a q6_K row.
    pub to_f32_q6_k: ToF32Fn,
    /// Four q8_0 axpys in one pass over `y`.
    pub axpy4_q8_0: Axpy4Fn,
    /// One to four q8_0 rows with each block's scale folded into the coefficient.
    pub axpy_q8_0_folded: FoldedFn,
    /// The top-k's shifted sums.
    pub shifted_sums: ShiftedSumsFn,
    /// Attention's dot products (rows with adjacent elements).
    pub(crate) attn_dots: AttnDotsFn,
    /// Attention's value accumulation (rows with adjacent elements).
    pub(crate) attn_accumulate: AttnAccumulateFn,
}

/// Hints the CPU to fetch the cache lines of `[p, p + bytes)`: never faults, whatever the
/// address; nothing on an architecture without a hint here.
#[inline(always)]
pub(crate) fn prefetch(p: *const u8, bytes: usize) {
    let mut off = 0;
    while off < bytes {
        prefetch_line(p.wrapping_add(off));
        off += 64;
    }
}

/// One cache line's prefetch hint.
#[inline(always)]
fn prefetch_line(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: prefetch is a hint; it never faults, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast())
    };
    #[cfg(target_arch = "aarch64")]
    // SAFETY: PRFM is a hint; it never faults, whatever the address, and touches no register
    // or memory the compiler knows of.
    unsafe {
        std::arch::asm!("prfm pldl1keep, [{0}]", in(reg) p, options(nostack, preserves_flags, readonly))
    };
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let _ = p;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_available_isa_has_its_table() {
        for &isa in Isa::available().iter() {
            let t = table(isa).expect("supported ISA has a table");
            assert_eq!(t.isa, isa);
            assert_eq!(Isa::from_name(isa.name()), Some(isa));
        }
        assert_eq!(Isa::available()[0], Isa::Generic);
        // every AArch64 CPU has NEON: its table must be among those tested
        #[cfg(target_arch = "aarch64")]
        assert!(Isa::available().contains(&Isa::Neon));
        assert_eq!(Isa::detect(), *Isa::available().last().unwrap());
    }

    #[test]
    fn spark_isa_picks_a_supported_lower_set_and_refuses_others() {
        assert_eq!(choose(None), Isa::detect());
        assert_eq!(choose(Some("")), Isa::detect());
        assert_eq!(choose(Some("generic")), Isa::Generic);
        assert_eq!(choose(Some("no-such-isa")), Isa::detect());
        for &isa in Isa::ALL {
            let want = if isa.is_supported() {
                isa
            } else {
                Isa::detect()
            };
            assert_eq!(choose(Some(isa.name())), want);
        }
    }
}
