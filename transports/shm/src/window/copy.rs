//! The copies of puts and gets between a process's own memory and window
//! memory (`CopyPlan::copy`, which `WindowSegment::read_by` and
//! `write_by` use).
//!
//! Most sizes are glibc's `memcpy` (`rep movsb` from a few KiB). One band
//! is not: copies longer than half of the level-1 data cache and at most
//! three quarters of it. Source and destination do not fit in that cache
//! together there, and a copy that touches each line once makes every
//! line of both miss on the next copy between the same buffers (a get
//! into the same buffer again, as OSU's `get_latency` does, or a halo
//! fetched each step): the copy runs at the speed of the level-2 cache,
//! 0.80 us for 32 KiB on the development VM's Xeon against 0.09 us for
//! 16 KiB. `copy_keeping_destination` asks for each destination line
//! for writing (`prefetchw`) a few lines ahead of its stores; the next
//! copy then finds the destination in the level-1 cache, as if the
//! cache kept lines touched twice ahead of the source's, touched once
//! (an observation: the replacement policy is not documented, and
//! keeping only part of a longer destination this way did not work):
//! 0.37-0.40 us for 32 KiB, 0.29 us for 28 KiB. Where the
//! destination is not in a cache (64 gets into 64 slots, as `get_bw`)
//! both copies take the same time (within 1%), and above three quarters
//! of the cache the destination does not stay, so `memcpy` it is. The
//! band's edges are the measured ones, scaled by the cache's size:
//! BENCHMARKS.md, "a 32 KiB get".
//!
//! A copy the caller asks to stream ([`Caching::Streaming`]) goes by
//! streaming stores instead (`copy_streaming`), past the caches: the
//! MPI layer asks for it once an epoch has moved more than
//! [`CopyPlan::stream_after`] bytes (half of the level-2 cache) since its
//! last flush, when the data of its first operations is leaving that
//! cache anyway, and destinations are more likely written once than read
//! soon (64 gets of 64 KiB into 64 slots before a flush, as `get_bw`).

use std::sync::OnceLock;

/// Whether a copy may leave its destination in the caches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Caching {
    /// Through the caches (the destination is likely read soon).
    Cached,
    /// Past the caches, by streaming stores where the CPU has them.
    Streaming,
}

/// Which copy routine a copy takes: of the cached ones, the band of
/// lengths `first..first + span` goes by `copy_keeping_destination`,
/// every other length by `memcpy`; streaming ones go by
/// `copy_streaming` if `streams` (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CopyPlan {
    first: usize,
    span: usize,
    streams: bool,
    stream_after: usize,
}

impl CopyPlan {
    /// The plan for caches of `l1_bytes` (level-1 data) and `l2_bytes`
    /// (`None`: unknown) on a CPU that can run
    /// [`copy_keeping_destination`] (`keeps`) and [`copy_streaming`]
    /// (`streams`).
    fn new(
        (l1_bytes, l2_bytes): (Option<usize>, Option<usize>),
        keeps: bool,
        streams: bool,
    ) -> CopyPlan {
        let (first, span) = match l1_bytes {
            Some(l1) if keeps => (l1 / 2 + 1, l1 * 3 / 4 - l1 / 2),
            _ => (0, 0),
        };
        let stream_after = match l2_bytes {
            Some(l2) if streams => l2 / 2,
            _ => usize::MAX,
        };
        CopyPlan {
            first,
            span,
            streams,
            stream_after,
        }
    }

    /// This machine's plan, worked out once per process.
    pub fn this_machine() -> CopyPlan {
        static PLAN: OnceLock<CopyPlan> = OnceLock::new();
        *PLAN.get_or_init(|| CopyPlan::new(crate::sys::cache_bytes(), keeps(), streams()))
    }

    /// How many bytes an epoch moves before its copies should stream
    /// (module docs); `usize::MAX` where the CPU cannot stream or the
    /// level-2 cache's size is unknown.
    pub fn stream_after(self) -> usize {
        self.stream_after
    }

    /// Whether a copy of `len` bytes goes by [`copy_keeping_destination`].
    #[inline]
    fn keeps_destination(self, len: usize) -> bool {
        // One comparison for `first <= len < first + span`.
        len.wrapping_sub(self.first) < self.span
    }

    /// Copies `len` bytes from `src` to `dst`, by the routine this plan
    /// gives for `caching` and the length. Inlined: a small cached copy
    /// costs two comparisons more than `memcpy`.
    ///
    /// # Safety
    /// As for `std::ptr::copy_nonoverlapping`: `src` readable and `dst`
    /// writable for `len` bytes, not overlapping, and neither reached
    /// through a Rust reference by anybody else meanwhile.
    #[inline]
    pub(crate) unsafe fn copy(self, caching: Caching, src: *const u8, dst: *mut u8, len: usize) {
        #[cfg(target_arch = "x86_64")]
        if caching == Caching::Streaming && self.streams {
            // SAFETY: `streams` only where the CPU has AVX2; the pointers
            // are the caller's guarantee.
            return unsafe { copy_streaming(src, dst, len) };
        }
        #[cfg(target_arch = "x86_64")]
        if self.keeps_destination(len) {
            // SAFETY: the plan has a band only where `keeps` said the
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
fn keeps() -> bool {
    use std::arch::x86_64::{__cpuid, __get_cpuid_max};
    streams()
        && __get_cpuid_max(0x8000_0000).0 >= 0x8000_0001
        && __cpuid(0x8000_0001).ecx & (1 << 8) != 0
}

/// Whether this CPU runs [`copy_streaming`]: AVX2.
#[cfg(target_arch = "x86_64")]
fn streams() -> bool {
    std::arch::is_x86_feature_detected!("avx2")
}

/// Whether this CPU runs [`copy_keeping_destination`]: not here.
#[cfg(not(target_arch = "x86_64"))]
fn keeps() -> bool {
    false
}

/// Whether this CPU runs [`copy_streaming`]: not here.
#[cfg(not(target_arch = "x86_64"))]
fn streams() -> bool {
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
/// The CPU has AVX2 and `prefetchw` ([`keeps`]); `src` and `dst` as for
/// [`CopyPlan::copy`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn copy_keeping_destination(src: *const u8, dst: *mut u8, len: usize) {
    use std::arch::x86_64::{__m256i, _mm256_storeu_si256};
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
            let to = dst.add(at).cast::<__m256i>();
            for (i, lane) in load_step(src.add(at)).into_iter().enumerate() {
                _mm256_storeu_si256(to.add(i), lane);
            }
        }
    }
    let done = steps * STEP;
    // SAFETY: the rest of both buffers, as the caller guarantees them.
    unsafe { std::ptr::copy_nonoverlapping(src.add(done), dst.add(done), len - done) };
}

/// The [`STEP`] bytes at `from`, in four AVX2 registers (unaligned
/// loads).
///
/// # Safety
/// The CPU has AVX2; `from` is readable for [`STEP`] bytes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn load_step(from: *const u8) -> [std::arch::x86_64::__m256i; 4] {
    use std::arch::x86_64::{__m256i, _mm256_loadu_si256};
    let from = from.cast::<__m256i>();
    // SAFETY: the caller's guarantee; unaligned loads.
    unsafe {
        [
            _mm256_loadu_si256(from),
            _mm256_loadu_si256(from.add(1)),
            _mm256_loadu_si256(from.add(2)),
            _mm256_loadu_si256(from.add(3)),
        ]
    }
}

/// Copies `len` bytes from `src` to `dst` with streaming stores: the
/// bytes up to the destination's next 64-byte boundary and the last
/// ones short of a [`STEP`] by `memcpy`, the rest in steps of unaligned
/// AVX2 loads and aligned streaming stores; then a store fence, so that
/// the bytes are ordered before whatever this thread does next, as
/// plainly stored ones would be.
///
/// # Safety
/// The CPU has AVX2 ([`streams`]); `src` and `dst` as for
/// [`CopyPlan::copy`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn copy_streaming(src: *const u8, dst: *mut u8, len: usize) {
    use std::arch::x86_64::{__m256i, _mm256_stream_si256, _mm_sfence};
    let head = dst.align_offset(64).min(len);
    let steps = (len - head) / STEP;
    // SAFETY: the first `head <= len` bytes of both buffers.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, head) };
    for step in 0..steps {
        let at = head + step * STEP;
        // SAFETY: bytes `at..at + STEP` lie in both buffers (`at + STEP
        // <= len`); the stores are 32-aligned (`dst + head` is
        // 64-aligned, steps are 128 bytes); the CPU has AVX2.
        unsafe {
            let to = dst.add(at).cast::<__m256i>();
            for (i, lane) in load_step(src.add(at)).into_iter().enumerate() {
                _mm256_stream_si256(to.add(i), lane);
            }
        }
    }
    let done = head + steps * STEP;
    // SAFETY: the rest of both buffers, as the caller guarantees them.
    unsafe { std::ptr::copy_nonoverlapping(src.add(done), dst.add(done), len - done) };
    _mm_sfence();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_band_is_above_half_the_l1_up_to_three_quarters_and_streams_after_half_the_l2() {
        let plan = CopyPlan::new((Some(48 * 1024), Some(1 << 21)), true, true);
        let keeps: Vec<usize> = [0, 8, 24 * 1024, 24 * 1024 + 1, 32 * 1024, 36 * 1024]
            .into_iter()
            .chain([36 * 1024 + 1, 64 * 1024, usize::MAX])
            .filter(|&len| plan.keeps_destination(len))
            .collect();
        assert_eq!(keeps, [24 * 1024 + 1, 32 * 1024, 36 * 1024]);
        assert_eq!(plan.stream_after(), 1 << 20);
        for unable in [
            CopyPlan::new((None, None), true, true),
            CopyPlan::new((Some(48 * 1024), Some(1 << 21)), false, false),
        ] {
            assert!(!(0..100_000).any(|len| unable.keeps_destination(len)));
            assert_eq!(unable.stream_after(), usize::MAX);
        }
    }

    /// Every length around the band's edges and the steps' remainders, at
    /// source and destination offsets that are and are not aligned, cached
    /// and streaming: the destination holds the source's bytes, and
    /// nothing around it moved.
    #[test]
    fn every_copy_moves_exactly_its_bytes() {
        let plan = CopyPlan::new((Some(48 * 1024), Some(1 << 21)), keeps(), streams());
        let source: Vec<u8> = (0..40_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        let lens = (0..=300)
            .chain(24 * 1024 - 3..24 * 1024 + 300)
            .chain(32 * 1024 - 200..32 * 1024 + 5)
            .chain(36 * 1024 - 3..36 * 1024 + 3);
        for len in lens {
            let ways = [(0, 0), (1, 0), (0, 3), (64, 100), (77, 13)];
            for ((from, to), caching) in ways
                .into_iter()
                .flat_map(|way| [(way, Caching::Cached), (way, Caching::Streaming)])
            {
                let mut destination = vec![0xA5u8; len + 200];
                // SAFETY: `source` holds `from + len` bytes and
                // `destination` `to + len`, separate vectors.
                unsafe {
                    plan.copy(
                        caching,
                        source.as_ptr().add(from),
                        destination.as_mut_ptr().add(to),
                        len,
                    )
                };
                assert_eq!(
                    destination[to..to + len],
                    source[from..from + len],
                    "{len} bytes from {from} to {to}, {caching:?}"
                );
                assert!(
                    destination[..to]
                        .iter()
                        .chain(&destination[to + len..])
                        .all(|&b| b == 0xA5),
                    "{len} bytes from {from} to {to}, {caching:?}, wrote outside"
                );
            }
        }
    }
}
