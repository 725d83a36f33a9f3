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
//! arch/table.rs                                  what a table is: Isa, Kernels, the choices
//! arch/generic/{rows,quant,topk,attention}.rs    portable Rust: the references
//! arch/generic/ggml.rs                           ggml's type traits (quantized rows' fallback)
//! arch/x86/{rows,quant,topk,attention}.rs        AVX2 + FMA + F16C          (x86-64)
//! arch/arm/{rows,quant,topk,attention}.rs        NEON                       (aarch64)
//! arch/prefetch.rs                               prefetch hints
//! ```
//!
//! The kernels take the types of `crate::kernel_types` and import nothing else of the crate;
//! the features (`rows`, `topk`, `attention`, `ffn`) import them only through a table.
//!
//! Each instruction set has one [`Kernels`] table (`generic::KERNELS`, `x86::AVX2`,
//! `arm::NEON`): a struct literal, so adding a kernel makes the compiler ask every table for
//! it, and [`table()`] picks the table by an exhaustive `match` on [`Isa`], whose variants exist
//! only on their architecture, so adding an instruction set makes the compiler name every place
//! it must fill. Which kernel runs for a row type or a set of cache rows is a lookup of the
//! table (`Kernels::dot`, `axpy`, `f32_conversion`, `axpy4`, `axpy_folded`, `attn_dots`,
//! `attn_accumulate`), each an exhaustive `match`: a new row type makes the compiler ask every
//! lookup which kernel it gets. A table may borrow another one's entry (the generic version
//! where a SIMD one would not gain); `docs/PERF.md` ("Instruction sets") says which version
//! each family runs per CPU.
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

use std::sync::OnceLock;

#[cfg(target_arch = "aarch64")]
mod arm;
pub(crate) mod generic;
mod prefetch;
mod table;
#[cfg(target_arch = "x86_64")]
mod x86;

pub(crate) use prefetch::prefetch;
pub use table::{Axpy4Fn, AxpyFn, DotFn, FoldedFn, Isa, Kernels, ShiftedSumsFn, ToF32Fn};
pub(crate) use table::{AxpyKernel, DotKernel, ToF32Kernel};

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
            crate::log::say!(
                "spark: SPARK_ISA={name}: this CPU lacks it; using {}",
                best.name()
            );
            best
        }
        None => {
            let names: Vec<&str> = Isa::ALL.iter().map(|i| i.name()).collect();
            crate::log::say!(
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

    /// tools/arm-check.sh runs the kernel-family comparisons (its ONCE_TESTS) under one QEMU
    /// CPU model only, because with a single AArch64 table every model runs the same kernels.
    /// A second table (dotprod, SVE, ...) would be chosen on some models alone: give those
    /// models the comparisons too, then update this list.
    #[cfg(target_arch = "aarch64")]
    #[test]
    fn one_aarch64_table() {
        assert_eq!(
            Isa::ALL,
            &[Isa::Generic, Isa::Neon],
            "a new AArch64 table: run tools/arm-check.sh's ONCE_TESTS under the QEMU CPU \
             models that choose it"
        );
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
