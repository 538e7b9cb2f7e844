//! Region mutexes: the window divided into regions, each with a mutex in
//! shared memory, so that accumulates under a shared lock that cannot use
//! hardware atomics are still atomic per element, while accumulates to
//! different regions proceed in parallel (the seed's design).
//!
//! Region boundaries lie at offsets that are multiples of the region size,
//! a power of two of at least [`MIN_REGION_BYTES`], so in a window whose
//! base is aligned to the largest basic type ([`LARGEST_BASIC`], 16 bytes:
//! a window segment's data is page-aligned) no aligned element crosses a
//! boundary. An operation locks the span of bytes it touches: each region
//! of the span once, in address order, so two operations never wait for
//! each other in a cycle, and an element that does cross a boundary (an
//! unaligned base) is covered by both regions' mutexes.
//!
//! A mutex is one 32-bit word: 0 free, 1 held, 2 held with sleepers
//! (Drepper, "Futexes Are Tricky"): a waiter polls as the process's wait
//! policy says (`oxmpi_adi::wait`, through `window::poll_until`), then
//! sleeps on the word; an unlock makes a system call only when someone
//! sleeps.

use super::poll_until;
use crate::sys;
use oxmpi_adi::wait::WaitPolicy;
use std::ops::Range;
use std::sync::atomic::{
    AtomicU32,
    Ordering::{Relaxed, SeqCst},
};

/// The largest basic type's size in bytes (`long double`, double
/// complex): region boundaries are aligned to it.
pub const LARGEST_BASIC: usize = 16;
/// The smallest region: a page. Taking and releasing a mutex costs two
/// atomic instructions (about 35 ns on the development machine), as much
/// as reducing some 4 KiB of data: smaller regions would spend more on
/// locking a long accumulate than they win in parallelism between short
/// ones (a 1 MiB accumulate over 1 KiB regions spent a third of its time
/// taking mutexes).
pub const MIN_REGION_BYTES: usize = 4096;
/// At most this many regions per window: more buys little parallelism and
/// costs an accumulate that spans the window one mutex each. At most 64:
/// a set of regions is a bit mask of one word ([`RegionSetGuard`]).
pub const MAX_REGIONS: usize = 64;
const _: () = assert!(MAX_REGIONS <= u64::BITS as usize);

/// The region size for a window of `len` bytes: a power of two, at least
/// [`MIN_REGION_BYTES`], with at most [`MAX_REGIONS`] regions.
pub fn region_bytes(len: usize) -> usize {
    len.div_ceil(MAX_REGIONS)
        .next_power_of_two()
        .max(MIN_REGION_BYTES)
}

/// How many regions a window of `len` bytes has (at least one).
pub fn region_count(len: usize) -> usize {
    len.div_ceil(region_bytes(len)).max(1)
}

/// One region's mutex, in shared memory; zero is free.
#[derive(Debug, Default)]
#[repr(transparent)]
pub struct RegionMutex(AtomicU32);

impl RegionMutex {
    /// Takes the mutex: one compare-and-swap when it is free (inlined),
    /// else [`RegionMutex::lock_contended`], waiting as `wait` says.
    #[inline(always)]
    fn lock(&self, wait: &WaitPolicy) {
        #[cfg(debug_assertions)]
        TAKEN.with(|taken| taken.set(taken.get() + 1));
        if self.0.compare_exchange(0, 1, SeqCst, SeqCst).is_err() {
            self.lock_contended(wait);
        }
    }

    /// [`RegionMutex::lock`] of a mutex that another holds: polls as
    /// `wait` says (a look, and a compare-and-swap only when the mutex
    /// looks free, so that waiters do not take the line from the holder
    /// at every poll), then sleeps.
    #[cold]
    fn lock_contended(&self, wait: &WaitPolicy) {
        let taken = || {
            self.0.load(Relaxed) == 0 && self.0.compare_exchange_weak(0, 1, SeqCst, SeqCst).is_ok()
        };
        if poll_until(wait, taken) {
            return;
        }
        // Mark it contended; whoever holds it wakes us when it lets go.
        while self.0.swap(2, SeqCst) != 0 {
            sys::futex_wait(&self.0, 2);
        }
    }

    #[inline(always)]
    fn unlock(&self) {
        if self.0.swap(0, SeqCst) == 2 {
            sys::futex_wake(&self.0, 1);
        }
    }
}

/// How many region mutexes this thread has taken, for tests of how
/// often an operation takes them (the difference across it). Counted in
/// debug builds only: a thread-local add on every mutex taken.
#[cfg(debug_assertions)]
pub fn regions_taken() -> usize {
    TAKEN.with(std::cell::Cell::get)
}

#[cfg(debug_assertions)]
thread_local! {
    static TAKEN: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The regions (indices) that bytes `offset..offset + len` of a window with
/// regions of `region_bytes` bytes (a power of two) touch.
#[inline]
pub fn regions_of(offset: usize, len: usize, region_bytes: usize) -> Range<usize> {
    if len == 0 {
        return 0..0;
    }
    // A power of two: shifts, not divisions (on every accumulate).
    let shift = region_bytes.trailing_zeros();
    offset >> shift..((offset + len - 1) >> shift) + 1
}

/// The region mutexes of a span, held; dropping it releases them.
#[must_use = "the regions are released when the guard drops"]
#[derive(Debug)]
pub struct RegionGuard<'a> {
    held: &'a [RegionMutex],
}

impl<'a> RegionGuard<'a> {
    /// Locks the mutexes of the regions that bytes `offset..offset + len`
    /// touch, each once, in address order, waiting for a held one as
    /// `wait` says; `None` (nothing locked) if the
    /// span reaches past the last region. Always inlined, as its release
    /// and the mutexes' fast paths: an accumulate of a few elements takes
    /// one region, and the MPI layer's fetch-and-op inlines the whole of
    /// its way (`WindowSegment::lock_span`).
    #[inline(always)]
    pub fn lock(
        mutexes: &'a [RegionMutex],
        region_bytes: usize,
        offset: usize,
        len: usize,
        wait: &WaitPolicy,
    ) -> Option<RegionGuard<'a>> {
        // A span past the last region reaches past the mutexes: one
        // bounds check (a comparison of byte ends needed a multiplication).
        offset.checked_add(len)?;
        let held = mutexes.get(regions_of(offset, len, region_bytes))?;
        for m in held {
            m.lock(wait);
        }
        Some(RegionGuard { held })
    }

    /// How many region mutexes the guard holds.
    pub fn regions(&self) -> usize {
        self.held.len()
    }
}

impl Drop for RegionGuard<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        for m in self.held.iter().rev() {
            m.unlock();
        }
    }
}

/// The region mutexes of several spans, held; dropping it releases them.
/// For an operation on several spans (an accumulate with a target
/// datatype): each region that any span touches is taken once, in
/// address order, as [`RegionGuard`] takes those of one span, so two
/// operations never wait for each other in a cycle.
#[must_use = "the regions are released when the guard drops"]
#[derive(Debug)]
pub struct RegionSetGuard<'a> {
    mutexes: &'a [RegionMutex],
    /// The regions held: bit `i` for region `i`.
    held: u64,
}

impl<'a> RegionSetGuard<'a> {
    /// Locks the mutexes of the regions that the `spans` (offset, length)
    /// touch, each once, in address order, waiting for a held one as
    /// `wait` says. A span that ends past byte `limit` (the window's
    /// size) or past the last region (or there are more regions than a
    /// mask holds) is returned as the error, with nothing locked.
    pub fn lock(
        mutexes: &'a [RegionMutex],
        region_bytes: usize,
        limit: usize,
        spans: impl IntoIterator<Item = (usize, usize)>,
        wait: &WaitPolicy,
    ) -> Result<RegionSetGuard<'a>, (usize, usize)> {
        let last = mutexes.len().min(u64::BITS as usize);
        let mut held = 0u64;
        for (offset, len) in spans {
            if offset.checked_add(len).is_none_or(|end| end > limit) {
                return Err((offset, len));
            }
            let regions = regions_of(offset, len, region_bytes);
            if regions.end > last {
                return Err((offset, len));
            }
            if !regions.is_empty() {
                // Bits `start..end`: `end - start` ones shifted up (at
                // least one, at most 64).
                held |= (u64::MAX >> (64 - regions.len())) << regions.start;
            }
        }
        let mut left = held;
        while left != 0 {
            mutexes[left.trailing_zeros() as usize].lock(wait);
            left &= left - 1;
        }
        Ok(RegionSetGuard { mutexes, held })
    }

    /// How many region mutexes the guard holds.
    pub fn regions(&self) -> usize {
        self.held.count_ones() as usize
    }
}

impl Drop for RegionSetGuard<'_> {
    fn drop(&mut self) {
        let mut left = self.held;
        while left != 0 {
            self.mutexes[left.trailing_zeros() as usize].unlock();
            left &= left - 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::region::SharedRegion;
    use crate::sys::forked;
    use std::time::Duration;

    #[test]
    fn regions_are_aligned_powers_of_two_and_bounded_in_number() {
        for len in [0, 1, 64, 65, 4096, 100_000, 1 << 20, (1 << 30) + 7] {
            let r = region_bytes(len);
            assert!(r.is_power_of_two() && r >= MIN_REGION_BYTES);
            assert_eq!(r % LARGEST_BASIC, 0);
            assert!(region_count(len) <= MAX_REGIONS, "{len}");
            assert!(region_count(len) * r >= len);
        }
        assert_eq!(regions_of(0, 0, 64), 0..0);
        assert_eq!(regions_of(0, 64, 64), 0..1);
        assert_eq!(regions_of(60, 8, 64), 0..2);
        assert_eq!(regions_of(64, 200, 64), 1..5);
    }

    #[test]
    fn a_span_takes_each_region_once_and_releases_them() {
        let mutexes: Vec<RegionMutex> = (0..8).map(|_| RegionMutex::default()).collect();
        let wait = WaitPolicy::from_env().unwrap();
        {
            let g = RegionGuard::lock(&mutexes, 64, 100, 150, &wait).unwrap();
            assert_eq!(g.regions(), 3); // bytes 100..250: regions 1, 2, 3
            let states: Vec<u32> = mutexes.iter().map(|m| m.0.load(SeqCst)).collect();
            assert_eq!(states, [0, 1, 1, 1, 0, 0, 0, 0]);
        }
        assert!(mutexes.iter().all(|m| m.0.load(SeqCst) == 0));
        assert!(RegionGuard::lock(&mutexes, 64, 500, 13, &wait).is_none());
        assert!(RegionGuard::lock(&mutexes, 64, usize::MAX, 2, &wait).is_none());
        assert_eq!(
            RegionGuard::lock(&mutexes, 64, 511, 1, &wait)
                .unwrap()
                .regions(),
            1
        );
    }

    #[test]
    fn a_set_of_spans_takes_each_region_once_in_order_and_releases_them() {
        let mutexes: Vec<RegionMutex> = (0..8).map(|_| RegionMutex::default()).collect();
        let wait = WaitPolicy::from_env().unwrap();
        {
            // Bytes 10..20 and 30..40 (region 0), 120..140 (1 and 2),
            // 300..310 (4) and 0 bytes at 500 (none).
            let spans = [(10, 10), (30, 10), (120, 20), (300, 10), (500, 0)];
            let g = RegionSetGuard::lock(&mutexes, 64, 512, spans, &wait).unwrap();
            assert_eq!(g.regions(), 4);
            let states: Vec<u32> = mutexes.iter().map(|m| m.0.load(SeqCst)).collect();
            assert_eq!(states, [1, 1, 1, 0, 1, 0, 0, 0]);
        }
        assert!(mutexes.iter().all(|m| m.0.load(SeqCst) == 0));
        let all = RegionSetGuard::lock(&mutexes, 64, 512, [(0, 512)], &wait).unwrap();
        assert_eq!(all.regions(), 8);
        drop(all);
        // A span past the limit or the last region, or wrapping: nothing
        // taken, the span named.
        let past = RegionSetGuard::lock(&mutexes, 64, 500, [(0, 8), (490, 13)], &wait);
        assert_eq!(past.unwrap_err(), (490, 13));
        let past = RegionSetGuard::lock(&mutexes, 64, 600, [(0, 8), (500, 13)], &wait);
        assert_eq!(past.unwrap_err(), (500, 13));
        let wraps = RegionSetGuard::lock(&mutexes, 64, 512, [(usize::MAX, 2)], &wait);
        assert_eq!(wraps.unwrap_err(), (usize::MAX, 2));
        assert!(mutexes.iter().all(|m| m.0.load(SeqCst) == 0));
    }

    /// Processes add to 16-byte elements (two 8-byte halves, not atomic
    /// together) with plain read-modify-writes under the region mutexes of
    /// overlapping spans taken in different orders of arrival: no update
    /// is lost and nobody deadlocks.
    #[test]
    fn processes_update_under_region_mutexes_without_loss_or_deadlock() {
        const PROCS: usize = 4;
        const ROUNDS: u64 = 3000;
        const REGION: usize = 64;
        const REGIONS: usize = 4;
        let (region, _) = SharedRegion::create(4096, c"oxmpi-test").unwrap();
        let base = region.ptr(0, REGIONS * 4).unwrap();
        // SAFETY: `REGIONS` zeroed words at the start of the mapping, which
        // outlives the slice (the children are reaped first); only ever
        // accessed atomically.
        let mutexes: &[RegionMutex] = unsafe { std::slice::from_raw_parts(base.cast(), REGIONS) };
        let data_at = 1024;
        let wait = WaitPolicy::from_env().unwrap();
        let pids: Vec<_> = (0..PROCS)
            .map(|p| {
                let (region, mutexes, wait) = (&region, mutexes, &wait);
                forked::spawn(move || {
                    for i in 0..ROUNDS {
                        // Spans of 1 to 4 regions starting at different places.
                        let first = (p + i as usize) % REGIONS;
                        let span = REGION * (REGIONS - first);
                        let _g =
                            RegionGuard::lock(mutexes, REGION, first * REGION, span, wait).unwrap();
                        for e in 0..REGIONS * REGION / 16 {
                            if (e * 16) / REGION < first {
                                continue;
                            }
                            let mut pair = [0u8; 16];
                            region.read(data_at + e * 16, &mut pair);
                            let lo = u64::from_ne_bytes(pair[..8].try_into().unwrap_or([0; 8]));
                            let hi = u64::from_ne_bytes(pair[8..].try_into().unwrap_or([0; 8]));
                            pair[..8].copy_from_slice(&(lo + 1).to_ne_bytes());
                            pair[8..].copy_from_slice(&(hi + 2).to_ne_bytes());
                            region.write(data_at + e * 16, &pair);
                        }
                    }
                    0
                })
            })
            .collect();
        let codes = forked::reap(&pids, Duration::from_secs(60));
        assert_eq!(codes, vec![Some(0); PROCS], "a process hung or failed");
        for e in 0..REGIONS * REGION / 16 {
            let first_regions = (e * 16) / REGION; // spans starting at or before it
            let expected: u64 = (0..PROCS as u64)
                .map(|p| {
                    (0..ROUNDS)
                        .filter(|i| (p as usize + *i as usize) % REGIONS <= first_regions)
                        .count() as u64
                })
                .sum();
            let mut pair = [0u8; 16];
            assert!(region.read(data_at + e * 16, &mut pair));
            let lo = u64::from_ne_bytes(pair[..8].try_into().unwrap());
            let hi = u64::from_ne_bytes(pair[8..].try_into().unwrap());
            assert_eq!((lo, hi), (expected, 2 * expected), "element {e}");
        }
    }
}
