//! The AArch64 kernels: NEON (Advanced SIMD), a version of every family.

use super::{Isa, Kernels};

/// Whether the CPU has NEON: every AArch64 CPU (checked anyway, as for the other sets).
pub(super) fn neon_supported() -> bool {
    std::arch::is_aarch64_feature_detected!("neon")
}

/// The NEON table. Handed out by `arch::table` only where the CPU has NEON.
pub(super) const NEON: Kernels = Kernels {
    isa: Isa::Neon,
    ..super::generic::KERNELS
};
