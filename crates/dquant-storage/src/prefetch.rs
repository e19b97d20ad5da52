//! Software prefetch: asking the CPU to start loading bytes a reader will want soon.
//!
//! Why: a shuffled plan narrows samples of a few thousand tokens from random places of a kept
//! map. The hardware prefetchers follow a stream only within a 4 KiB page and need a few
//! misses to start, so every sample (and every page of one) begins with a wait on memory:
//! in order the agent's narrowing ran at 7.4 G tokens/s, shuffled at 3.2
//! (`cargo bench -p dquant-storage --bench read_paths -- kept_map`). A cursor that runs a
//! little ahead of the narrowing over the batch's ranges, back to back, and prefetches what
//! it passes over, turns those waits into loads already under way.
//!
//! Written by hand: the intrinsics are per architecture (`_mm_prefetch` on x86_64; aarch64's
//! `_prefetch` is not stable, so `prfm` by `asm!`), and no well-kept crate wraps them. A
//! prefetch is a hint, never a load: it does not fault, even on an address past a shrunk
//! file's end, and it changes no result.

/// The bytes a cache line holds on the targets dquant runs on (x86_64, the BlueField's
/// Arm cores).
const LINE: usize = 64;

/// Hints that the `len` bytes from `start` will be read soon.
pub(crate) fn prefetch(start: *const u8, len: usize) {
    let mut at = start as usize & !(LINE - 1);
    let end = (start as usize).saturating_add(len);
    while at < end {
        line(at as *const u8);
        at += LINE;
    }
}

#[inline(always)]
fn line(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing the program sees and never faults, whatever `p`.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast())
    };
    #[cfg(target_arch = "aarch64")]
    // SAFETY: as above: `prfm` is a hint that never faults.
    unsafe {
        std::arch::asm!("prfm pldl1keep, [{0}]", in(reg) p, options(nostack, readonly, preserves_flags))
    };
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let _ = p;
}
