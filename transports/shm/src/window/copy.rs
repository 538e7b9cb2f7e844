//! The copies of puts and gets between a process's own memory and window
//! memory ([`CopyPlan::copy`]).
//!
//! Most sizes are glibc's `memcpy` (`rep movsb` from a few KiB). One band
//! is not: copies longer than half of the level-1 data cache and at most
//! three quarters of it. Source and destination do not fit in that cache
//! together there, and a copy that touches each line once makes every
//! line of both miss on the next copy between the same buffers (a get
//! into the same buffer again, as OSU's `get_latency` does, or a halo
//! fetched each step): the copy runs at the speed of the level-2 cache,
//! 0.80 us for 32 KiB on the development VM's Xeon against 0.09 us for
//! 16 KiB. [`copy_keeping_destination`] asks for each destination line
//! for writing (`prefetchw`) a few lines ahead of its stores; the CPU then
//! keeps the destination's lines, touched twice, ahead of the source's,
//! touched once, and the next copy finds the destination in the level-1
//! cache: 0.37-0.40 us for 32 KiB, 0.29 us for 28 KiB. Where the
//! destination is not in a cache (64 gets into 64 slots, as `get_bw`)
//! both copies take the same time (within 1%), and above three quarters
//! of the cache the destination does not stay, so `memcpy` it is. The
//! band's edges are the measured ones, scaled by the cache's size:
//! BENCHMARKS.md, "a 32 KiB get".

use std::sync::OnceLock;

/// Which copy routine a copy of a given length takes: the band of
/// lengths `first..first + span` goes by [`copy_keeping_destination`],
/// every other length by `memcpy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CopyPlan {
    first: usize,
    span: usize,
}

impl CopyPlan {
    /// The plan for a level-1 data cache of `l1_bytes` (`None`: unknown)
    /// on a CPU that can (`capable`) run [`copy_keeping_destination`].
    fn new(l1_bytes: Option<usize>, capable: bool) -> CopyPlan {
        match l1_bytes {
            Some(l1) if capable => CopyPlan {
                first: l1 / 2 + 1,
                span: l1 * 3 / 4 - l1 / 2,
            },
            _ => CopyPlan { first: 0, span: 0 },
        }
    }

    /// This machine's plan, worked out once per process.
    pub(crate) fn this_machine() -> CopyPlan {
        static PLAN: OnceLock<CopyPlan> = OnceLock::new();
        *PLAN.get_or_init(|| CopyPlan::new(crate::sys::l1_data_cache_bytes(), capable()))
    }

    /// Whether a copy of `len` bytes goes by [`copy_keeping_destination`].
    #[inline]
    fn keeps_destination(self, len: usize) -> bool {
        // One comparison for `first <= len < first + span`.
        len.wrapping_sub(self.first) < self.span
    }

    /// Copies `len` bytes from `src` to `dst`, by the routine this plan
    /// gives for the length. Inlined: a small copy costs one comparison
    /// more than `memcpy`.
    ///
    /// # Safety
    /// As for `std::ptr::copy_nonoverlapping`: `src` readable and `dst`
    /// writable for `len` bytes, not overlapping, and neither reached
    /// through a Rust reference by anybody else meanwhile.
    #[inline]
    pub(crate) unsafe fn copy(self, src: *const u8, dst: *mut u8, len: usize) {
        #[cfg(target_arch = "x86_64")]
        if self.keeps_destination(len) {
            // SAFETY: the plan has a band only where `capable` said the
            // CPU runs the routine; the pointers are the caller's
            // guarantee.
            return unsafe { copy_keeping_destination(src, dst, len) };
        }
        // SAFETY: the caller's guarantee.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, len) }
    }
}

/// Whether this CPU runs [`copy_keeping_destination`]: AVX2 and
/// `prefetchw` (CPUID 0x8000_0001, ECX bit 8, "3DNowPrefetch").
#[cfg(target_arch = "x86_64")]
fn capable() -> bool {
    use std::arch::x86_64::{__cpuid, __get_cpuid_max};
    std::arch::is_x86_feature_detected!("avx2")
        && __get_cpuid_max(0x8000_0000).0 >= 0x8000_0001
        && __cpuid(0x8000_0001).ecx & (1 << 8) != 0
}

/// Whether this CPU runs [`copy_keeping_destination`]: not here.
#[cfg(not(target_arch = "x86_64"))]
fn capable() -> bool {
    false
}

/// The bytes a step of [`copy_keeping_destination`] copies: 4 AVX2
/// registers, 2 cache lines.
#[cfg(target_arch = "x86_64")]
const STEP: usize = 128;

/// How far ahead of its stores [`copy_keeping_destination`] asks for the
/// destination's lines: 2 steps (256 and 512 bytes measured the same,
/// 1 KiB 10-20% slower).
#[cfg(target_arch = "x86_64")]
const AHEAD: usize = 2 * STEP;

/// Copies `len` bytes from `src` to `dst` in [`STEP`]s of AVX2 loads and
/// stores, each step first asking for the destination's lines [`AHEAD`]
/// for writing (`prefetchw`): the module docs say why. The last bytes
/// short of a step go by `memcpy`.
///
/// # Safety
/// The CPU has AVX2 and `prefetchw` ([`capable`]); `src` and `dst` as for
/// [`CopyPlan::copy`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn copy_keeping_destination(src: *const u8, dst: *mut u8, len: usize) {
    use std::arch::x86_64::{__m256i, _mm256_loadu_si256, _mm256_storeu_si256};
    let steps = len / STEP;
    for step in 0..steps {
        let at = step * STEP;
        if at + AHEAD + STEP <= len {
            let ahead = dst.wrapping_add(at + AHEAD);
            // SAFETY: a prefetch reads and writes no memory and never
            // faults; both lines lie in the destination (checked), and
            // the CPU has `prefetchw` (the caller's guarantee).
            unsafe {
                std::arch::asm!(
                    "prefetchw [{ahead}]",
                    "prefetchw [{ahead} + 64]",
                    ahead = in(reg) ahead,
                    options(nostack, preserves_flags, readonly)
                )
            };
        }
        // SAFETY: bytes `at..at + STEP` lie in both buffers (`at + STEP
        // <= len`); unaligned loads and stores; the CPU has AVX2.
        unsafe {
            let from = src.add(at).cast::<__m256i>();
            let to = dst.add(at).cast::<__m256i>();
            let lanes = [
                _mm256_loadu_si256(from),
                _mm256_loadu_si256(from.add(1)),
                _mm256_loadu_si256(from.add(2)),
                _mm256_loadu_si256(from.add(3)),
            ];
            for (i, lane) in lanes.into_iter().enumerate() {
                _mm256_storeu_si256(to.add(i), lane);
            }
        }
    }
    let done = steps * STEP;
    // SAFETY: the rest of both buffers, as the caller guarantees them.
    unsafe { std::ptr::copy_nonoverlapping(src.add(done), dst.add(done), len - done) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_band_is_above_half_the_cache_up_to_three_quarters() {
        let plan = CopyPlan::new(Some(48 * 1024), true);
        let keeps: Vec<usize> = [0, 8, 24 * 1024, 24 * 1024 + 1, 32 * 1024, 36 * 1024]
            .into_iter()
            .chain([36 * 1024 + 1, 64 * 1024, usize::MAX])
            .filter(|&len| plan.keeps_destination(len))
            .collect();
        assert_eq!(keeps, [24 * 1024 + 1, 32 * 1024, 36 * 1024]);
        for unable in [
            CopyPlan::new(None, true),
            CopyPlan::new(Some(48 * 1024), false),
        ] {
            assert!(!(0..100_000).any(|len| unable.keeps_destination(len)));
        }
    }

    /// Every length around the band's edges and the steps' remainders, at
    /// source and destination offsets that are and are not aligned: the
    /// destination holds the source's bytes, and nothing around it moved.
    #[test]
    fn every_copy_moves_exactly_its_bytes() {
        let plan = CopyPlan::new(Some(48 * 1024), capable());
        let source: Vec<u8> = (0..40_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        let lens = (0..=300)
            .chain(24 * 1024 - 3..24 * 1024 + 300)
            .chain(32 * 1024 - 200..32 * 1024 + 5)
            .chain(36 * 1024 - 3..36 * 1024 + 3);
        for len in lens {
            for (from, to) in [(0, 0), (1, 0), (0, 3), (64, 100), (77, 13)] {
                let mut destination = vec![0xA5u8; len + 200];
                // SAFETY: `source` holds `from + len` bytes and
                // `destination` `to + len`, separate vectors.
                unsafe {
                    plan.copy(
                        source.as_ptr().add(from),
                        destination.as_mut_ptr().add(to),
                        len,
                    )
                };
                assert_eq!(
                    destination[to..to + len],
                    source[from..from + len],
                    "{len} bytes from {from} to {to}"
                );
                assert!(
                    destination[..to]
                        .iter()
                        .chain(&destination[to + len..])
                        .all(|&b| b == 0xA5),
                    "{len} bytes from {from} to {to} wrote outside"
                );
            }
        }
    }
}
