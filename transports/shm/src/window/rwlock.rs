//! A fair reader-writer lock in shared memory: the passive-target lock of
//! one rank's window, taken by the local ranks that access it.
//!
//! The design is the phase-fair ticket lock of Brandenburg and Anderson
//! (PF-T, "Spin-Based Reader-Writer Synchronization for Multiprocessor
//! Real-Time Systems", 2010): writers take tickets and enter in ticket
//! order; a writer announces itself in the readers' entry word, so readers
//! that arrive after it wait for it, while it waits only for the readers
//! already inside. Phases alternate: a writer waits for at most one read
//! phase and the writers ahead of it, however many readers keep arriving,
//! and a reader waits for at most one write phase.
//!
//! A waiter polls as the process's wait policy says (`oxmpi_adi::wait`,
//! through `window::poll_until`: at once, or yielding the processor
//! where the ranks outnumber the cores, for the poll time), then sleeps
//! on the word it waits for (`futex`, shared between processes). The releaser wakes sleepers only when the
//! lock's count of them is not zero: no system call on an uncontended
//! unlock. The lock is all-zero when free, so a fresh (zeroed) shared
//! region holds free locks.
//!
//! Acquire and release are separate calls rather than a guard, because an
//! MPI lock and unlock are separate calls; a release without the matching
//! acquire breaks the lock for every process (it can never touch memory
//! outside the lock), so callers keep track of what they hold.

use super::poll_until;
use crate::sys;
use oxmpi_adi::wait::WaitPolicy;
use std::sync::atomic::{AtomicU32, Ordering::SeqCst};

/// Readers count in the entry and exit words in units of this.
const READER: u32 = 0x100;
/// The writer bits of the readers' entry word.
const WRITER_BITS: u32 = 0x3;
/// Set in the entry word while a writer is present.
const WRITER_PRESENT: u32 = 0x2;
/// The phase bit: the low bit of the present writer's ticket, so that
/// readers waiting for one writer tell it apart from the next.
const WRITER_PHASE: u32 = 0x1;

/// The lock: five words in shared memory, zero when free. See the module
/// docs.
#[derive(Debug, Default)]
#[repr(C)]
pub struct SharedRwLock {
    /// Readers that entered (in [`READER`] units) and the writer bits.
    readers_in: AtomicU32,
    /// Readers that left (in [`READER`] units).
    readers_out: AtomicU32,
    /// Writer tickets handed out.
    writers_in: AtomicU32,
    /// Writer tickets served.
    writers_out: AtomicU32,
    /// Processes or threads asleep (or about to sleep) on one of the words.
    sleepers: AtomicU32,
}

/// The bytes a [`SharedRwLock`] takes in shared memory.
pub const RWLOCK_BYTES: usize = std::mem::size_of::<SharedRwLock>();

impl SharedRwLock {
    /// Takes the lock shared: waits (as `wait` says) while a writer that
    /// came first holds or waits for it.
    pub fn lock_shared(&self, wait: &WaitPolicy) {
        let writer = self.readers_in.fetch_add(READER, SeqCst) & WRITER_BITS;
        if writer != 0 {
            // Wait for that writer's phase to end (the bits change).
            self.wait_while(&self.readers_in, |v| v & WRITER_BITS == writer, wait);
        }
    }

    /// Releases a shared hold.
    pub fn unlock_shared(&self) {
        self.readers_out.fetch_add(READER, SeqCst);
        self.wake(&[&self.readers_out]);
    }

    /// Takes the lock exclusive: waits (as `wait` says) for the writers
    /// ahead of it, then for the readers inside when it arrived (not for
    /// those after it).
    pub fn lock_exclusive(&self, wait: &WaitPolicy) {
        let ticket = self.writers_in.fetch_add(1, SeqCst);
        self.wait_while(&self.writers_out, |v| v != ticket, wait);
        let bits = WRITER_PRESENT | (ticket & WRITER_PHASE);
        let readers_entered = self.readers_in.fetch_add(bits, SeqCst) & !WRITER_BITS;
        self.wait_while(&self.readers_out, |v| v != readers_entered, wait);
    }

    /// Releases an exclusive hold: the waiting readers enter, then the
    /// next writer.
    pub fn unlock_exclusive(&self) {
        self.readers_in.fetch_and(!WRITER_BITS, SeqCst);
        self.writers_out.fetch_add(1, SeqCst);
        // One look at the count after both changes serves both words.
        self.wake(&[&self.readers_in, &self.writers_out]);
    }

    /// Waits while `busy` holds for the value of `word`: polls as `wait`
    /// says, then sleeps on the word.
    fn wait_while(&self, word: &AtomicU32, busy: impl Fn(u32) -> bool, wait: &WaitPolicy) {
        if poll_until(wait, || !busy(word.load(SeqCst))) {
            return;
        }
        // Counted before the last look at the word: a releaser changes the
        // word and then reads the count (both sequentially consistent), so
        // either this look sees the change or the releaser sees the count
        // and wakes; the futex sleeps only if the word is still `v`.
        self.sleepers.fetch_add(1, SeqCst);
        loop {
            let v = word.load(SeqCst);
            if !busy(v) {
                break;
            }
            sys::futex_wait(word, v);
        }
        self.sleepers.fetch_sub(1, SeqCst);
    }

    /// Wakes whoever sleeps on `words`, after changes of them: a sleeper
    /// counts itself before its last look at its word, so either that look
    /// sees the change or this look at the count sees the sleeper.
    fn wake(&self, words: &[&AtomicU32]) {
        if self.sleepers.load(SeqCst) != 0 {
            for word in words {
                sys::futex_wake(word, i32::MAX);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::region::SharedRegion;
    use crate::sys::forked;
    use std::sync::atomic::AtomicU64;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    #[test]
    fn readers_share_and_a_writer_excludes() {
        let wait = WaitPolicy::from_env().unwrap();
        let lock = Arc::new(SharedRwLock::default());
        lock.lock_shared(&wait);
        lock.lock_shared(&wait);
        let writer = {
            let lock = Arc::clone(&lock);
            std::thread::spawn(move || {
                lock.lock_exclusive(&wait);
                lock.unlock_exclusive();
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        assert!(!writer.is_finished(), "a writer entered beside readers");
        lock.unlock_shared();
        std::thread::sleep(Duration::from_millis(20));
        assert!(!writer.is_finished(), "a writer entered beside a reader");
        lock.unlock_shared();
        writer.join().unwrap();
        // Free again: both kinds enter at once.
        lock.lock_exclusive(&wait);
        lock.unlock_exclusive();
        lock.lock_shared(&wait);
        lock.unlock_shared();
    }

    #[test]
    fn writers_exclude_each_other_across_threads() {
        let wait = WaitPolicy::from_env().unwrap();
        let lock = Arc::new(SharedRwLock::default());
        let counter = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (lock, counter) = (Arc::clone(&lock), Arc::clone(&counter));
                std::thread::spawn(move || {
                    for _ in 0..2000 {
                        lock.lock_exclusive(&wait);
                        // A non-atomic increment: lost updates if two
                        // writers were inside at once.
                        let v = counter.load(SeqCst);
                        std::hint::spin_loop();
                        counter.store(v + 1, SeqCst);
                        lock.unlock_exclusive();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(counter.load(SeqCst), 8000);
    }

    /// Four reader processes take the lock shared again and again, each
    /// holding it for a while, so that their holds overlap and a lock that
    /// prefers readers would rarely or never let a writer in; this one
    /// must, within a bound, and while the writer holds it no reader is
    /// inside.
    #[test]
    fn a_writer_is_not_starved_by_overlapping_reader_processes() {
        const READERS: usize = 4;
        let wait = WaitPolicy::from_env().unwrap();
        let (region, _) = SharedRegion::create(4096, c"oxmpi-test").unwrap();
        // SAFETY: offset 0 of the page-aligned mapping, which outlives the
        // reference (the children are reaped before `region` drops); the
        // words are only accessed atomically.
        let lock: &SharedRwLock = unsafe { &*region.ptr(0, RWLOCK_BYTES).unwrap().cast() };
        let inside = region.word(64).unwrap(); // readers inside now
        let stop = region.word(128).unwrap();
        let pids: Vec<_> = (0..READERS)
            .map(|_| {
                forked::spawn(|| {
                    let mut rounds = 0u64;
                    while stop.load(SeqCst) == 0 {
                        lock.lock_shared(&wait);
                        inside.fetch_add(1, SeqCst);
                        let t = Instant::now();
                        while t.elapsed() < Duration::from_micros(200) {
                            std::hint::spin_loop();
                        }
                        inside.fetch_sub(1, SeqCst);
                        lock.unlock_shared();
                        rounds += 1;
                    }
                    i32::from(rounds == 0)
                })
            })
            .collect();
        // The writer is a process too, reaped within a bound: a starved
        // writer is killed and reported instead of hanging the test. It
        // leaves its worst wait (ns) and its count of readers found inside
        // in the region.
        let worst_ns = region.word(192).unwrap();
        let violations = region.word(256).unwrap();
        let writer = forked::spawn(|| {
            std::thread::sleep(Duration::from_millis(100)); // readers start
            for _ in 0..20 {
                let t = Instant::now();
                lock.lock_exclusive(&wait);
                worst_ns.fetch_max(t.elapsed().as_nanos() as u64, SeqCst);
                if inside.load(SeqCst) != 0 {
                    violations.fetch_add(1, SeqCst);
                }
                std::thread::sleep(Duration::from_millis(1));
                lock.unlock_exclusive();
                std::thread::sleep(Duration::from_millis(5));
            }
            0
        });
        let starved = forked::reap(&[writer], Duration::from_secs(20))[0].is_none();
        stop.store(1, SeqCst);
        let worst = Duration::from_nanos(worst_ns.load(SeqCst));
        let violations = violations.load(SeqCst);
        let codes = forked::reap(&pids, Duration::from_secs(20));
        assert!(
            !starved,
            "the writer was starved for 20 s by overlapping readers"
        );
        assert_eq!(codes, vec![Some(0); READERS], "a reader hung or never ran");
        assert_eq!(violations, 0, "a reader was inside with the writer");
        assert!(
            worst < Duration::from_secs(2),
            "the writer waited {worst:?} for the lock"
        );
    }
}
