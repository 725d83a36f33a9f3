//! Prefetch hints, which every table's kernels and the features' loops issue.

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
