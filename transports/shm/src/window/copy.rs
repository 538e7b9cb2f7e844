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
//!   cache: BENCHMARKS.md, "the previous copy's last lines"). An
//!   accumulate's pass over window memory that repeats the previous one
//!   turns round the same way, in pieces from the back
//!   ([`CopyPlan::from_the_back`], `WindowSegment::update`), with the
//!   same record.
//!
//! A copy to a destination that is not in a cache (64 gets into 64 slots,
//! as `get_bw`) is as fast or faster by `memcpy`, whose `rep movsb`
//! writes whole lines without reading them first, so other copies above
//! three quarters of the level-1 cache take `memcpy`. The edges are the
//! measured ones, scaled by the caches' sizes: BENCHMARKS.md, "a 32 KiB
//! get" and "the previous copy's last lines".
//!
//! A put's or get's copy ([`Caching::Counted`]) counts its bytes in this
//! thread's epoch, which the MPI layer starts afresh at each flush
//! ([`complete_epoch`]); once the epoch has moved more than half of the
//! level-2 cache, its later copies go by streaming stores
//! (`copy_streaming`), past the caches: the data of its first operations
//! is leaving that cache anyway, and destinations are more likely written
//! once than read soon (64 gets of 64 KiB into 64 slots before a flush,
//! as `get_bw`). A copy that repeats the previous one neither counts nor
//! streams: its lines are those already in the caches. Copies of at most
//! half of the level-1 cache neither count nor stream (their streaming
//! stores would gain little over the fence after them).

use std::cell::Cell;
use std::sync::OnceLock;

/// Whether a copy may take streaming stores (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Caching {
    /// Through the caches, whatever this thread moved before.
    Cached,
    /// A put's or get's copy: counted in this thread's epoch, and past
    /// the caches once the epoch has moved more than half of the level-2
    /// cache.
    Counted,
}

/// Which copy routine a copy takes (module docs): copies of `first`
/// bytes or more go by `copy_ahead` up to `keep_until` bytes, or up to
/// `turns_until` where they repeat this thread's previous copy, by
/// `copy_streaming` once a counted epoch passes `stream_after` bytes,
/// else by `memcpy`, as every shorter copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CopyPlan {
    first: usize,
    keep_until: usize,
    turns_until: usize,
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
        let Some(l1) = l1_bytes.filter(|_| ahead || streams) else {
            return CopyPlan {
                first: usize::MAX,
                keep_until: 0,
                turns_until: 0,
                stream_after: usize::MAX,
            };
        };
        let keep_until = if ahead { l1 * 3 / 4 } else { 0 };
        CopyPlan {
            first: l1 / 2 + 1,
            keep_until,
            // Without the level-2 cache's size, only the lengths that
            // keep their destination anyway.
            turns_until: l2_bytes.filter(|_| ahead).unwrap_or(0).max(keep_until),
            stream_after: l2_bytes.filter(|_| streams).map_or(usize::MAX, |l2| l2 / 2),
        }
    }

    /// This machine's plan, worked out once per process.
    pub fn this_machine() -> CopyPlan {
        static PLAN: OnceLock<CopyPlan> = OnceLock::new();
        *PLAN.get_or_init(|| CopyPlan::new(crate::sys::cache_bytes(), ahead(), streams()))
    }

    /// Copies `len` bytes from `src` to `dst`, by the routine this plan
    /// gives for the length, `caching` and this thread's previous copies.
    /// Inlined: a copy of at most half of the level-1 cache costs one
    /// comparison more than `memcpy`.
    ///
    /// # Safety
    /// As for `std::ptr::copy_nonoverlapping`: `src` readable and `dst`
    /// writable for `len` bytes, not overlapping, and neither reached
    /// through a Rust reference by anybody else meanwhile.
    #[inline]
    pub(crate) unsafe fn copy(&self, caching: Caching, src: *const u8, dst: *mut u8, len: usize) {
        #[cfg(target_arch = "x86_64")]
        if len >= self.first {
            // SAFETY: `first` is finite only where the CPU has AVX2 (for
            // `copy_ahead` and `copy_streaming`, each chosen only where
            // the CPU runs it); the pointers are the caller's guarantee.
            return unsafe { self.copy_beyond_half_l1(caching, src, dst, len) };
        }
        // SAFETY: the caller's guarantee.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, len) }
    }

    /// A copy of `first` bytes or more, by the routine [`CopyPlan::choose`]
    /// gives.
    ///
    /// # Safety
    /// The CPU has AVX2, and `prefetchw` if `keep_until` is not 0 (as the
    /// plan is made); the pointers as for [`CopyPlan::copy`].
    #[cfg(target_arch = "x86_64")]
    unsafe fn copy_beyond_half_l1(
        &self,
        caching: Caching,
        src: *const u8,
        dst: *mut u8,
        len: usize,
    ) {
        match self.choose(caching, src as usize, dst as usize, len) {
            // SAFETY: `keep_until` and `turns_until`, without which no
            // copy goes ahead, are not 0 only where the CPU has
            // `prefetchw` (and AVX2); the caller's guarantees.
            Routine::Ahead { backwards } => unsafe { copy_ahead(src, dst, len, backwards) },
            // SAFETY: `stream_after` is finite only where the CPU has
            // AVX2; the caller's guarantees.
            Routine::Streaming => unsafe { copy_streaming(src, dst, len) },
            // SAFETY: the caller's guarantee.
            Routine::Memcpy => unsafe { std::ptr::copy_nonoverlapping(src, dst, len) },
        }
    }

    /// The routine for a copy of `len >= first` bytes from address `src`
    /// to `dst` (module docs), noted as this thread's last copy: if it
    /// repeats this thread's previous copy, the other way from that one by
    /// `copy_ahead` (up to `turns_until` bytes); else, counted in the
    /// epoch if `caching` says so, by streaming stores once the epoch has
    /// passed `stream_after`, by `copy_ahead` forwards up to `keep_until`
    /// bytes, and by `memcpy` beyond.
    fn choose(self, caching: Caching, src: usize, dst: usize, len: usize) -> Routine {
        let this = LastCopy::of(src, dst, len);
        let previous = this.repeats();
        let routine = match previous {
            Some(backwards) if len <= self.turns_until => Routine::Ahead {
                backwards: !backwards,
            },
            None if caching == Caching::Counted && self.epoch_passes(len) => Routine::Streaming,
            _ if len <= self.keep_until => Routine::Ahead { backwards: false },
            _ => Routine::Memcpy,
        };
        this.note(routine == Routine::Ahead { backwards: true });
        routine
    }

    /// Whether a pass of `len` bytes turns round when it repeats the
    /// previous one ([`CopyPlan::from_the_back`]).
    #[inline]
    pub(crate) fn turns_at(self, len: usize) -> bool {
        len >= self.first && len <= self.turns_until
    }

    /// The shortest pass that may turn round ([`CopyPlan::turns_at`]);
    /// `usize::MAX` if none may.
    pub(crate) fn turns_from(self) -> usize {
        if self.first <= self.turns_until {
            self.first
        } else {
            usize::MAX
        }
    }

    /// Whether a pass of `len` bytes that reads `src` and writes `dst`
    /// (an accumulate combining an origin's data into window memory in
    /// place) should run from the back, a piece at a time: where it
    /// repeats this thread's previous pass or copy between these buffers,
    /// which ran from the front, and is as long as those that turn round
    /// (module docs: it then starts among the lines the previous one
    /// touched last). Noted as this thread's last pass, run as answered,
    /// if it could turn.
    #[inline]
    pub fn from_the_back(self, src: *const u8, dst: *const u8, len: usize) -> bool {
        // Shorter and longer passes are not noted: one comparison for
        // the small accumulates.
        if !self.turns_at(len) {
            return false;
        }
        let this = LastCopy::of(src as usize, dst as usize, len);
        let back = this.repeats() == Some(false);
        this.note(back);
        back
    }

    /// Counts `len` bytes in this thread's epoch, and says whether it has
    /// now moved more than `stream_after`.
    fn epoch_passes(self, len: usize) -> bool {
        EPOCH.with(|epoch| {
            let moved = epoch.bytes.get().saturating_add(len);
            epoch.bytes.set(moved);
            moved > self.stream_after
        })
    }
}

/// Notes that this thread stored into window memory with plain stores
/// not followed by a full barrier (a put's copy, an atomic replace's
/// release stores, an accumulate under an exclusive lock; a region
/// mutex's release is a swap, such a barrier), which may still sit in
/// this CPU's store buffer: the next
/// [`complete_epoch`] fences. Inlined: a store to a thread-local byte.
#[inline]
pub fn plain_stores() {
    EPOCH.with(|epoch| epoch.unfenced.set(true));
}

/// Ends this thread's epoch of window accesses (the MPI layer calls it
/// at each flush, after which the program uses what the epoch's gets
/// fetched and its puts stored). Its plain stores ([`plain_stores`]), if
/// any, are made visible to every process before any later load of this
/// thread: a sequentially consistent fence, which the compiler makes a
/// locked `or` of zero on the stack on x86-64, ordering ordinary memory
/// as `mfence` does at less cost (streaming copies end with their own
/// `sfence`); after compare-and-swaps, fetches and accumulates under
/// region mutexes alone their locked instructions were the barriers. And the next copies count from zero,
/// so that what moved before no longer decides whether they stream.
/// Inlined: on every flush of the direct path.
#[inline]
pub fn complete_epoch() {
    if complete_epoch_before_barrier() {
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    }
}

/// Ends this thread's epoch of window accesses as [`complete_epoch`]
/// does, for a caller whose next instruction is a full barrier itself (a
/// locked read-modify-write, as a window lock's release): no fence here.
/// Says whether plain stores were made since the last full barrier (what
/// [`complete_epoch`] fences for).
#[inline]
pub fn complete_epoch_before_barrier() -> bool {
    EPOCH.with(|epoch| {
        epoch.bytes.set(0);
        epoch.unfenced.replace(false)
    })
}

/// How a copy of `first` bytes or more runs ([`CopyPlan::choose`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Routine {
    /// `copy_ahead`, from the front or from the back.
    Ahead { backwards: bool },
    /// `copy_streaming`.
    Streaming,
    /// glibc's `memcpy`.
    Memcpy,
}

/// A copy by [`CopyPlan::choose`] or a pass by
/// [`CopyPlan::from_the_back`]: its buffers' addresses, its length and
/// which way it ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct LastCopy {
    src: usize,
    dst: usize,
    len: usize,
    backwards: bool,
}

impl LastCopy {
    /// A copy of `len` bytes from `src` to `dst`, not yet run.
    fn of(src: usize, dst: usize, len: usize) -> LastCopy {
        LastCopy {
            src,
            dst,
            len,
            backwards: false,
        }
    }

    /// Which way this thread's last copy ran (`true`: backwards), if
    /// this one repeats it.
    fn repeats(self) -> Option<bool> {
        let previous = LAST_COPY.with(|last| last.get());
        (LastCopy {
            backwards: false,
            ..previous
        } == self)
            .then_some(previous.backwards)
    }

    /// Notes this copy, run `backwards` or not, as this thread's last.
    fn note(self, backwards: bool) {
        LAST_COPY.with(|last| last.set(LastCopy { backwards, ..self }));
    }
}

thread_local! {
    /// This thread's last copy or pass (`LastCopy`): the
    /// lines it touched last are in the caches of the core this thread
    /// runs on. An address may name other memory by now (unmapped and
    /// mapped again): then a copy runs backwards for nothing, as fast as
    /// forwards.
    static LAST_COPY: Cell<LastCopy> = const {
        Cell::new(LastCopy { src: 0, dst: 0, len: 0, backwards: false })
    };

    /// What this thread did to window memory since its last
    /// [`complete_epoch`]: one thread-local for both of a flush's
    /// questions (two look-ups, each a call, cost a flush some 7
    /// instructions more).
    static EPOCH: Epoch = const {
        Epoch { bytes: Cell::new(0), unfenced: Cell::new(false) }
    };
}

/// A thread's epoch of window accesses, between two flushes
/// ([`complete_epoch`]).
struct Epoch {
    /// The bytes its counted copies moved, repeats left out. Per thread,
    /// because what it estimates, how much of the level-2 cache the
    /// epoch's data fills, is per core, and a thread runs on one core at
    /// a time (a count per process would let two threads on two cores
    /// stream each other's copies early); not per window or target,
    /// because the copies to every window and target pass through the
    /// same caches (one count each would let a window's epoch stay cached
    /// while others have filled the cache).
    bytes: Cell<usize>,
    /// Whether it stored into window memory with plain stores
    /// ([`plain_stores`]) since its last full barrier. Per thread, as the
    /// stores in a CPU's store buffer are.
    unfenced: Cell<bool>,
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
    fn plans_go_ahead_above_half_the_l1_turn_up_to_the_l2_and_stream_after_half_the_l2() {
        let plan = CopyPlan::new((Some(48 * 1024), Some(1 << 21)), true, true);
        assert_eq!(
            plan,
            CopyPlan {
                first: 24 * 1024 + 1,
                keep_until: 36 * 1024,
                turns_until: 1 << 21,
                stream_after: 1 << 20,
            }
        );
        let no_l2 = CopyPlan::new((Some(48 * 1024), None), true, true);
        assert_eq!(
            (no_l2.turns_until, no_l2.stream_after),
            (36 * 1024, usize::MAX)
        );
        let streams_only = CopyPlan::new((Some(48 * 1024), Some(1 << 21)), false, true);
        assert_eq!(
            (
                streams_only.first,
                streams_only.keep_until,
                streams_only.turns_until
            ),
            (24 * 1024 + 1, 0, 0)
        );
        for unable in [
            CopyPlan::new((None, Some(1 << 21)), true, true),
            CopyPlan::new((Some(48 * 1024), Some(1 << 21)), false, false),
        ] {
            assert_eq!(unable.first, usize::MAX);
            assert_eq!(unable.stream_after, usize::MAX);
        }
    }

    /// The routines a thread's copies take: repeats turn round and are not
    /// counted, counted copies stream once the epoch passes half the L2,
    /// a new epoch starts the count again.
    #[test]
    fn repeats_turn_round_and_counted_copies_stream_after_half_the_l2() {
        let plan = CopyPlan::new((Some(4096), Some(16384)), true, true);
        let ahead = |backwards| Routine::Ahead { backwards };
        complete_epoch();
        let choose = |caching, src, len| plan.choose(caching, src, 1 << 40, len);
        let routines = [
            // Forwards, then the same copy back and forth.
            choose(Caching::Cached, 0, 3000),
            choose(Caching::Cached, 0, 3000),
            choose(Caching::Counted, 0, 3000),
            choose(Caching::Cached, 0, 3000),
            // Another source, then another length: not repeats.
            choose(Caching::Cached, 1, 3000),
            choose(Caching::Cached, 1, 3001),
            // Beyond the kept lengths: memcpy, then turns up to the L2.
            choose(Caching::Cached, 0, 16384),
            choose(Caching::Cached, 0, 16384),
            choose(Caching::Cached, 0, 16385),
            choose(Caching::Cached, 0, 16385),
            // Counted: 6000, 12000 (repeat, not counted), 12000 bytes.
            choose(Caching::Counted, 0, 6000),
            choose(Caching::Counted, 0, 6000),
            choose(Caching::Counted, 1, 6000),
            choose(Caching::Counted, 2, 3000),
        ];
        assert_eq!(
            routines,
            [
                ahead(false),
                ahead(true),
                ahead(false),
                ahead(true),
                ahead(false),
                ahead(false),
                Routine::Memcpy,
                ahead(true),
                Routine::Memcpy,
                Routine::Memcpy,
                Routine::Memcpy,
                ahead(true),
                Routine::Streaming,
                Routine::Streaming,
            ]
        );
        complete_epoch();
        assert_eq!(
            plan.choose(Caching::Counted, 3, 1 << 40, 3000),
            ahead(false)
        );
    }

    /// Every length around the plan's edges and the steps' remainders, at
    /// source and destination offsets that are and are not aligned, by
    /// every routine (counted once the epoch is past streaming, then
    /// cached three times between the same buffers: forwards, backwards,
    /// forwards again, or by `memcpy`): the destination holds the
    /// source's bytes, and nothing around it moved.
    #[test]
    fn every_copy_moves_exactly_its_bytes() {
        // Small caches, so that the edges are short.
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
                EPOCH.with(|epoch| epoch.bytes.set(usize::MAX / 2));
                let turns = [Caching::Counted, Caching::Cached, Caching::Cached];
                for (turn, caching) in turns.into_iter().chain([Caching::Cached]).enumerate() {
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
                    let copied = destination[to..to + len] == source[from..from + len];
                    assert!(copied, "{len} bytes from {from} to {to}, copy {turn}");
                    assert!(
                        destination[..to]
                            .iter()
                            .chain(&destination[to + len..])
                            .all(|&b| b == 0xA5),
                        "{len} bytes from {from} to {to}, copy {turn}, wrote outside"
                    );
                }
            }
        }
    }
}
