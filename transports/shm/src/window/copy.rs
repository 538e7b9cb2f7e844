//! The copies of puts and gets between a process's own memory and window
//! memory (`CopyPlan::copy`, which `WindowSegment::read_by` and
//! `write_by` use).
//!
//! Copies of at most half of the level-1 data cache are glibc's `memcpy`
//! (`rep movsb` from a few KiB). Longer ones no longer fit that cache
//! together with their source, and a copy that touches each line once,
//! front to back, makes every line of both miss on the next copy between
//! the same buffers (a get into the same buffer again, as OSU's
//! `get_latency` does, or a halo fetched each step): by the time it comes
//! back to the front, the front's lines are the oldest and gone. The copy
//! then runs at the speed of the level-2 cache: 0.80 us for 32 KiB on the
//! development VM's Xeon against 0.09 us for 16 KiB, 1.54 us for 64 KiB.
//! Two things help, both done by `copy_ahead`, an AVX2 loop that asks
//! for each destination line for writing (`prefetchw`) a few lines ahead
//! of its stores:
//!
//! - The destination of a copy longer than half and at most three
//!   quarters of the level-1 cache stays in it: the next copy finds it
//!   there, as if the cache kept lines touched twice ahead of the
//!   source's, touched once (an observation: the replacement policy is
//!   not documented, and keeping only part of a longer destination this
//!   way did not work). 0.37-0.40 us for 32 KiB.
//! - A copy between the same buffers as this thread's previous copy (the
//!   same source, destination and length: `LAST_COPY`) runs the other
//!   way: it starts where the previous one ended, among the lines it
//!   touched last, which the level-1 and level-2 caches still hold, and
//!   reaches the lines that were evicted last. Up to the level-2 cache's
//!   size (0.71x `memcpy` at 64 KiB, 0.85x at 128 KiB, 0.92x at 256
//!   KiB, 0.75x at 1 MiB, where source and destination fill the level-2
//!   cache: BENCHMARKS.md, "the previous copy's last lines").
//!
//! A copy to a destination that is not in a cache (64 gets into 64 slots,
//! as `get_bw`) is as fast or faster by `memcpy`, whose `rep movsb`
//! writes whole lines without reading them first, so other copies above
//! three quarters of the level-1 cache take `memcpy`. The edges are the
//! measured ones, scaled by the caches' sizes: BENCHMARKS.md, "a 32 KiB
//! get" and "the previous copy's last lines".
//!
//! A copy the caller asks to stream ([`Caching::Streaming`]) goes by
//! streaming stores instead (`copy_streaming`), past the caches: the
//! MPI layer asks for it once an epoch has moved more than
//! [`CopyPlan::stream_after`] bytes (half of the level-2 cache) since its
//! last flush, when the data of its first operations is leaving that
//! cache anyway, and destinations are more likely written once than read
//! soon (64 gets of 64 KiB into 64 slots before a flush, as `get_bw`).

use std::cell::Cell;
use std::sync::OnceLock;

/// Whether a copy may leave its destination in the caches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Caching {
    /// Through the caches (the destination is likely read soon).
    Cached,
    /// Past the caches, by streaming stores where the CPU has them.
    Streaming,
}

/// Which copy routine a copy takes (module docs): cached ones of
/// lengths `first..first + span` go by `copy_ahead` (those up to
/// `keep_until` always, longer ones when they repeat this thread's
/// previous copy), every other one by `memcpy`; streaming ones go by
/// `copy_streaming` if `streams`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CopyPlan {
    first: usize,
    span: usize,
    keep_until: usize,
    streams: bool,
    stream_after: usize,
}

impl CopyPlan {
    /// The plan for caches of `l1_bytes` (level-1 data) and `l2_bytes`
    /// (`None`: unknown) on a CPU that can run `copy_ahead` (`ahead`)
    /// and `copy_streaming` (`streams`).
    fn new(
        (l1_bytes, l2_bytes): (Option<usize>, Option<usize>),
        ahead: bool,
        streams: bool,
    ) -> CopyPlan {
        let (first, span, keep_until) = match l1_bytes {
            Some(l1) if ahead => {
                let (first, keep_until) = (l1 / 2 + 1, l1 * 3 / 4);
                // Without the level-2 cache's size, only the lengths that
                // keep their destination.
                let last = l2_bytes.unwrap_or(0).max(keep_until);
                (first, last + 1 - first, keep_until)
            }
            _ => (0, 0, 0),
        };
        let stream_after = match l2_bytes {
            Some(l2) if streams => l2 / 2,
            _ => usize::MAX,
        };
        CopyPlan {
            first,
            span,
            keep_until,
            streams,
            stream_after,
        }
    }

    /// This machine's plan, worked out once per process.
    pub fn this_machine() -> CopyPlan {
        static PLAN: OnceLock<CopyPlan> = OnceLock::new();
        *PLAN.get_or_init(|| CopyPlan::new(crate::sys::cache_bytes(), ahead(), streams()))
    }

    /// How many bytes an epoch moves before its copies should stream
    /// (module docs); `usize::MAX` where the CPU cannot stream or the
    /// level-2 cache's size is unknown.
    pub fn stream_after(self) -> usize {
        self.stream_after
    }

    /// Whether a cached copy of `len` bytes may go by `copy_ahead`.
    #[inline]
    fn goes_ahead(self, len: usize) -> bool {
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
        if self.goes_ahead(len) {
            // SAFETY: the plan has a band only where `ahead` said the CPU
            // runs `copy_ahead`; the pointers are the caller's guarantee.
            return unsafe { self.copy_beyond_half_l1(src, dst, len) };
        }
        // SAFETY: the caller's guarantee.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, len) }
    }

    /// A cached copy of a length in the plan's band (module docs): the
    /// other way from this thread's previous copy if it repeats it, else
    /// forwards, by `copy_ahead` up to `keep_until` bytes and `memcpy`
    /// beyond.
    ///
    /// # Safety
    /// The CPU runs `copy_ahead` ([`ahead`]); the pointers as for
    /// [`CopyPlan::copy`].
    #[cfg(target_arch = "x86_64")]
    unsafe fn copy_beyond_half_l1(self, src: *const u8, dst: *mut u8, len: usize) {
        let this = LastCopy {
            src: src as usize,
            dst: dst as usize,
            len,
            backwards: false,
        };
        let previous = LAST_COPY.with(|last| last.get());
        let backwards = previous == this && !previous.backwards;
        // A copy is the same as the previous one whichever way that ran.
        let repeats = backwards
            || previous
                == LastCopy {
                    backwards: true,
                    ..this
                };
        LAST_COPY.with(|last| last.set(LastCopy { backwards, ..this }));
        if repeats || len <= self.keep_until {
            // SAFETY: the caller's guarantees.
            unsafe { copy_ahead(src, dst, len, backwards) }
        } else {
            // SAFETY: the caller's guarantee.
            unsafe { std::ptr::copy_nonoverlapping(src, dst, len) }
        }
    }
}

/// A copy by [`CopyPlan::copy_beyond_half_l1`]: its buffers' addresses,
/// its length and which way it ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct LastCopy {
    src: usize,
    dst: usize,
    len: usize,
    backwards: bool,
}

thread_local! {
    /// This thread's last copy by [`CopyPlan::copy_beyond_half_l1`]: the
    /// lines it touched last are in the caches of the core this thread
    /// runs on (per thread, as a thread runs on one core at a time). An
    /// address may name other memory by now (unmapped and mapped again):
    /// then a copy runs backwards for nothing, as fast as forwards.
    static LAST_COPY: Cell<LastCopy> = const {
        Cell::new(LastCopy { src: 0, dst: 0, len: 0, backwards: false })
    };
}

/// Whether this CPU runs [`copy_ahead`]: AVX2 and `prefetchw` (CPUID
/// 0x8000_0001, ECX bit 8, "3DNowPrefetch").
#[cfg(target_arch = "x86_64")]
fn ahead() -> bool {
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

/// Whether this CPU runs `copy_ahead`: not here.
#[cfg(not(target_arch = "x86_64"))]
fn ahead() -> bool {
    false
}

/// Whether this CPU runs [`copy_streaming`]: not here.
#[cfg(not(target_arch = "x86_64"))]
fn streams() -> bool {
    false
}

/// The bytes a step of [`copy_ahead`] copies: 4 AVX2 registers, 2 cache
/// lines.
#[cfg(target_arch = "x86_64")]
const STEP: usize = 128;

/// How far ahead of its stores [`copy_ahead`] asks for the destination's
/// lines: 2 steps (256 and 512 bytes measured the same, 1 KiB 10-20%
/// slower).
#[cfg(target_arch = "x86_64")]
const AHEAD: usize = 2 * STEP;

/// Copies `len` bytes from `src` to `dst` in [`STEP`]s of AVX2 loads and
/// stores, from the first step to the last or (`backwards`) from the
/// last to the first, each step first asking for the destination's lines
/// [`AHEAD`] in its direction for writing (`prefetchw`): the module docs
/// say why. The bytes short of a whole step, at the end it reaches last
/// (the back going forwards, the front going backwards), go by `memcpy`.
///
/// # Safety
/// The CPU has AVX2 and `prefetchw` ([`ahead`]); `src` and `dst` as for
/// [`CopyPlan::copy`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn copy_ahead(src: *const u8, dst: *mut u8, len: usize, backwards: bool) {
    use std::arch::x86_64::{__m256i, _mm256_storeu_si256};
    let steps = len / STEP;
    let rest = len - steps * STEP;
    // Where the steps start, and the byte offsets of a step and of the
    // lines asked for ahead, as two's complement when backwards.
    let (steps_at, rest_at, step, ahead) = if backwards {
        (rest, 0, STEP.wrapping_neg(), AHEAD.wrapping_neg())
    } else {
        (0, steps * STEP, STEP, AHEAD)
    };
    let mut at = if backwards {
        (steps_at + steps * STEP).wrapping_sub(STEP)
    } else {
        steps_at
    };
    for _ in 0..steps {
        let wanted = at.wrapping_add(ahead);
        // Inside the steps both ways (below `steps_at`, going backwards,
        // wraps to beyond every length).
        if wanted.wrapping_sub(steps_at) <= steps * STEP - STEP {
            let line = dst.wrapping_add(wanted);
            // SAFETY: a prefetch reads and writes no memory and never
            // faults; both lines lie in the destination (checked), and
            // the CPU has `prefetchw` (the caller's guarantee).
            unsafe {
                std::arch::asm!(
                    "prefetchw [{line}]",
                    "prefetchw [{line} + 64]",
                    line = in(reg) line,
                    options(nostack, preserves_flags, readonly)
                )
            };
        }
        // SAFETY: bytes `at..at + STEP` lie in both buffers (a step of
        // the `steps` from `steps_at`, and `steps_at + steps * STEP <=
        // len`); unaligned loads and stores; the CPU has AVX2.
        unsafe {
            let to = dst.add(at).cast::<__m256i>();
            for (i, lane) in load_step(src.add(at)).into_iter().enumerate() {
                _mm256_storeu_si256(to.add(i), lane);
            }
        }
        at = at.wrapping_add(step);
    }
    // SAFETY: the `rest` bytes from `rest_at`, the part of both buffers
    // the steps left, as the caller guarantees them.
    unsafe { std::ptr::copy_nonoverlapping(src.add(rest_at), dst.add(rest_at), rest) };
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
    fn the_band_is_above_half_the_l1_up_to_the_l2_and_streams_after_half_the_l2() {
        let plan = CopyPlan::new((Some(48 * 1024), Some(1 << 21)), true, true);
        let ahead: Vec<usize> = [0, 8, 24 * 1024, 24 * 1024 + 1, 36 * 1024, 64 * 1024]
            .into_iter()
            .chain([1 << 21, (1 << 21) + 1, usize::MAX])
            .filter(|&len| plan.goes_ahead(len))
            .collect();
        assert_eq!(ahead, [24 * 1024 + 1, 36 * 1024, 64 * 1024, 1 << 21]);
        assert_eq!(plan.keep_until, 36 * 1024);
        assert_eq!(plan.stream_after(), 1 << 20);
        let no_l2 = CopyPlan::new((Some(48 * 1024), None), true, true);
        assert!(no_l2.goes_ahead(36 * 1024) && !no_l2.goes_ahead(36 * 1024 + 1));
        for unable in [
            CopyPlan::new((None, None), true, true),
            CopyPlan::new((Some(48 * 1024), Some(1 << 21)), false, false),
        ] {
            assert!(!(0..100_000).any(|len| unable.goes_ahead(len)));
            assert_eq!(unable.stream_after(), usize::MAX);
        }
    }

    /// Every length around the band's edges and the steps' remainders, at
    /// source and destination offsets that are and are not aligned, cached
    /// (three times between the same buffers: forwards, backwards,
    /// forwards again, or by `memcpy` where the copy does not repeat) and
    /// streaming: the destination holds the source's bytes, and nothing
    /// around it moved.
    #[test]
    fn every_copy_moves_exactly_its_bytes() {
        // Small caches, so that the band and its edges are short.
        let plan = CopyPlan::new((Some(4096), Some(16384)), ahead(), streams());
        let source: Vec<u8> = (0..17_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        let lens = (0..=300)
            .chain(2048 - 3..2048 + 300)
            .chain(3072 - 200..3072 + 5)
            .chain(4096 - 3..4096 + 3)
            .chain(16384 - 260..16384 + 3);
        for len in lens {
            let ways = [(0, 0), (1, 0), (0, 3), (64, 100), (77, 13)];
            for (from, to) in ways {
                let mut destination = vec![0xA5u8; len + 200];
                for (turn, caching) in [Caching::Cached, Caching::Cached, Caching::Cached]
                    .into_iter()
                    .chain([Caching::Streaming])
                    .enumerate()
                {
                    destination.fill(0xA5);
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
                        "{len} bytes from {from} to {to}, copy {turn}, {caching:?}"
                    );
                    assert!(
                        destination[..to]
                            .iter()
                            .chain(&destination[to + len..])
                            .all(|&b| b == 0xA5),
                        "{len} bytes from {from} to {to}, copy {turn}, {caching:?}, wrote outside"
                    );
                }
            }
        }
    }

    /// A copy between the same buffers as the previous one runs the other
    /// way; any other copy runs forwards.
    #[test]
    fn a_repeated_copy_turns_round() {
        let plan = CopyPlan::new((Some(4096), Some(16384)), true, true);
        let source = vec![1u8; 8192];
        let mut destination = vec![0u8; 8192];
        let ways: Vec<bool> = [8192, 8192, 8192, 4096, 8192, 8192]
            .into_iter()
            .map(|len| {
                if ahead() {
                    // SAFETY: both vectors hold 8192 bytes, separate.
                    unsafe {
                        plan.copy_beyond_half_l1(source.as_ptr(), destination.as_mut_ptr(), len)
                    };
                }
                LAST_COPY.with(|last| last.get().backwards)
            })
            .collect();
        if ahead() {
            assert_eq!(ways, [false, true, false, false, false, true]);
        }
    }
}
