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
//! One change to PF-T: the count of writers served lives in the readers'
//! entry word (a 64-bit word: the writer bits, then the writers served,
//! then the readers entered, `SharedRwLock::entry`), so that a writer's
//! release, which lets the waiting readers in and the next writer after
//! them, is one read-modify-write of that word instead of one of each of
//! two words: an exclusive lock and release are three locked instructions,
//! not four. The proof that it is still PF-T, and still right when the
//! counters wrap, is at [`SharedRwLock::unlock_exclusive`].
//!
//! A waiter polls as the process's wait policy says (`oxmpi_adi::wait`,
//! through `window::poll_until`: at once, or yielding the processor
//! where the ranks outnumber the cores, for the poll time), then sleeps
//! on the lock's bell word (`futex`, shared between processes), which a
//! releaser rings only when the lock's count of sleepers is not zero: no
//! system call and no further write on an uncontended unlock. The lock is
//! all-zero when free, so a fresh (zeroed) shared region holds free locks.
//!
//! Acquire and release are separate calls rather than a guard, because an
//! MPI lock and unlock are separate calls; a release without the matching
//! acquire breaks the lock for every process (it can never touch memory
//! outside the lock), so callers keep track of what they hold.

use super::poll_until;
use crate::sys;
use oxmpi_adi::wait::WaitPolicy;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::SeqCst};

/// The writer bits of the entry word.
const WRITER_BITS: u64 = 0x3;
/// Set in the entry word while a writer is present.
const WRITER_PRESENT: u64 = 0x2;
/// The phase bit: the low bit of the present writer's ticket, so that
/// readers waiting for one writer tell it apart from the next.
const WRITER_PHASE: u64 = 0x1;
/// Where the count of writers served starts in the entry word.
const SERVED_SHIFT: u32 = 2;
/// The writers served are counted modulo this (30 bits, up to the
/// readers' count), and tickets compared with them so.
const SERVED_MODULUS: u32 = 1 << 30;
/// Where the count of readers entered starts in the entry word: the top
/// 32 bits, so that it wraps with no carry into anything.
const READERS_SHIFT: u32 = 32;
/// A reader's entry: one in the readers' count.
const READER: u64 = 1 << READERS_SHIFT;

/// The lock: 24 bytes in shared memory, zero when free. See the module
/// docs.
#[derive(Debug, Default)]
#[repr(C)]
pub struct SharedRwLock {
    /// The entry word: the writer bits (bits 0-1), the writers served
    /// modulo 2^30 (bits 2-31) and the readers entered modulo 2^32 (bits
    /// 32-63).
    entry: AtomicU64,
    /// Readers that left, modulo 2^32.
    readers_out: AtomicU32,
    /// Writer tickets handed out, modulo 2^32.
    writers_in: AtomicU32,
    /// Processes or threads asleep (or about to sleep) on `bell`.
    sleepers: AtomicU32,
    /// Rung (incremented) by a release that finds sleepers: what they
    /// sleep on, whatever word they wait for.
    bell: AtomicU32,
}

/// The bytes a [`SharedRwLock`] takes in shared memory.
pub const RWLOCK_BYTES: usize = std::mem::size_of::<SharedRwLock>();

/// The writers served in `entry`, a value of the entry word.
fn served(entry: u64) -> u32 {
    (entry >> SERVED_SHIFT) as u32 & (SERVED_MODULUS - 1)
}

/// The readers entered in `entry`, a value of the entry word.
fn readers_entered(entry: u64) -> u32 {
    (entry >> READERS_SHIFT) as u32
}

impl SharedRwLock {
    /// Takes the lock shared: waits (as `wait` says) while a writer that
    /// came first holds or waits for it.
    pub fn lock_shared(&self, wait: &WaitPolicy) {
        let writer = self.entry.fetch_add(READER, SeqCst) & WRITER_BITS;
        if writer != 0 {
            // Wait for that writer's phase to end (the bits change).
            self.wait_while(|| self.entry.load(SeqCst) & WRITER_BITS == writer, wait);
        }
    }

    /// Releases a shared hold.
    pub fn unlock_shared(&self) {
        self.readers_out.fetch_add(1, SeqCst);
        self.wake();
    }

    /// Takes the lock exclusive: waits (as `wait` says) for the writers
    /// ahead of it, then for the readers inside when it arrived (not for
    /// those after it).
    pub fn lock_exclusive(&self, wait: &WaitPolicy) {
        // Modulo 2^30, as the writers served: 2^32 is a multiple, so the
        // tickets wrap with them.
        let ticket = self.writers_in.fetch_add(1, SeqCst) & (SERVED_MODULUS - 1);
        self.wait_while(|| served(self.entry.load(SeqCst)) != ticket, wait);
        let bits = WRITER_PRESENT | (u64::from(ticket) & WRITER_PHASE);
        let entered = readers_entered(self.entry.fetch_add(bits, SeqCst));
        self.wait_while(|| self.readers_out.load(SeqCst) != entered, wait);
    }

    /// Releases an exclusive hold: the waiting readers enter, then the
    /// next writer, in one read-modify-write of the entry word.
    ///
    /// Why this is PF-T's release (its two steps, readers' entry word
    /// then writers served, at once) and right forever:
    /// - While a writer holds the lock, the low 32 bits of the entry word
    ///   are its own: the writer bits are the ones it added, and the
    ///   writers served equal its ticket (it waited for that), and only
    ///   the holder changes either (readers add only to the top 32 bits;
    ///   the next writer adds its bits only once the served count is its
    ///   ticket, that is after this release). So the holder knows them
    ///   exactly, and one addition of (next served - served) << 2 - bits
    ///   takes the low 32 bits from (served << 2 | bits) to (next served
    ///   << 2): no bit above them changes, with no borrow (the low bits
    ///   are exactly what is taken away) and no carry (next served <<
    ///   2 < 2^32, also when the count wraps from 2^30 - 1 to 0, the
    ///   addition then being a subtraction). The readers' count, in the
    ///   top 32 bits, is not touched, and wraps itself at 2^64 with no
    ///   carry into anything.
    /// - Readers that waited see the writer bits change (cleared; a later
    ///   writer sets the other phase), as in PF-T; the next writer sees
    ///   the served count reach its ticket, in the same instant instead
    ///   of just after. Nothing else reads the word, so nothing can tell
    ///   the single step from PF-T's two taken with no one between them.
    /// - Tickets are compared with the served count modulo 2^30: right
    ///   while fewer than 2^30 writers wait at once (each is a process or
    ///   thread of the node), whatever the count of writers over time.
    pub fn unlock_exclusive(&self) {
        let held = self.entry.load(SeqCst) & ((1 << READERS_SHIFT) - 1);
        let next = (served(held) + 1) % SERVED_MODULUS;
        let release = (u64::from(next) << SERVED_SHIFT).wrapping_sub(held);
        self.entry.fetch_add(release, SeqCst);
        self.wake();
    }

    /// Waits while `busy` holds. Inlined always, for the one look of an
    /// uncontended lock (a call to the polling, to find the lock free at
    /// once, was a fifth of an exclusive lock-compare-and-swap-unlock's
    /// instructions).
    #[inline(always)]
    fn wait_while(&self, busy: impl Fn() -> bool, wait: &WaitPolicy) {
        if busy() {
            self.wait_long(busy, wait);
        }
    }

    /// [`SharedRwLock::wait_while`] once the first look found the lock
    /// busy: polls as `wait` says, then sleeps on the bell.
    #[cold]
    #[inline(never)]
    fn wait_long(&self, busy: impl Fn() -> bool, wait: &WaitPolicy) {
        if poll_until(wait, || !busy()) {
            return;
        }
        // Counted before the last look at the lock, and the bell read
        // before it: a releaser changes the lock and then reads the count
        // (all sequentially consistent), so either this look sees the
        // change or the releaser sees the count and rings the bell after
        // this read of it; the futex sleeps only if the bell is still
        // `rung`, and a wake after the ring finds this sleeper queued.
        self.sleepers.fetch_add(1, SeqCst);
        loop {
            let rung = self.bell.load(SeqCst);
            if !busy() {
                break;
            }
            sys::futex_wait(&self.bell, rung);
        }
        self.sleepers.fetch_sub(1, SeqCst);
    }

    /// Wakes whoever sleeps on the lock, after a release: a sleeper counts
    /// itself before its last look at the lock, so either that look sees
    /// the release or this look at the count sees the sleeper.
    fn wake(&self) {
        if self.sleepers.load(SeqCst) != 0 {
            self.bell.fetch_add(1, SeqCst);
            sys::futex_wake(&self.bell, i32::MAX);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::region::SharedRegion;
    use crate::sys::forked;
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

    /// The lock starts a hair before every counter wraps (writers served
    /// at 2^30 - 1, tickets at 2^32 - 1, readers entered and left at
    /// 2^32 - 2), then writers and readers in threads go round it many
    /// times past the wraps: writers still exclude each other and the
    /// readers, and the lock ends free, its counts agreeing.
    #[test]
    fn counters_wrap_without_carry_into_each_other() {
        let wait = WaitPolicy::from_env().unwrap();
        let near = u32::MAX - 1;
        let lock = Arc::new(SharedRwLock {
            entry: AtomicU64::new(
                (u64::from(near) << READERS_SHIFT)
                    | (u64::from(SERVED_MODULUS - 1) << SERVED_SHIFT),
            ),
            readers_out: AtomicU32::new(near),
            writers_in: AtomicU32::new(u32::MAX),
            ..SharedRwLock::default()
        });
        let counter = Arc::new(AtomicU64::new(0));
        let readers_inside = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let (lock, counter, inside) = (
                    Arc::clone(&lock),
                    Arc::clone(&counter),
                    Arc::clone(&readers_inside),
                );
                std::thread::spawn(move || {
                    for _ in 0..2000 {
                        if t % 2 == 0 {
                            lock.lock_exclusive(&wait);
                            assert_eq!(inside.load(SeqCst), 0, "a reader beside the writer");
                            let v = counter.load(SeqCst);
                            std::hint::spin_loop();
                            counter.store(v + 1, SeqCst);
                            lock.unlock_exclusive();
                        } else {
                            lock.lock_shared(&wait);
                            inside.fetch_add(1, SeqCst);
                            std::hint::spin_loop();
                            inside.fetch_sub(1, SeqCst);
                            lock.unlock_shared();
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(counter.load(SeqCst), 4000, "writers were inside at once");
        let entry = lock.entry.load(SeqCst);
        assert_eq!(entry & WRITER_BITS, 0, "a writer is left present");
        assert_eq!(served(entry), (SERVED_MODULUS - 1 + 4000) % SERVED_MODULUS);
        assert_eq!(lock.writers_in.load(SeqCst), u32::MAX.wrapping_add(4000));
        assert_eq!(readers_entered(entry), near.wrapping_add(4000));
        assert_eq!(lock.readers_out.load(SeqCst), near.wrapping_add(4000));
        // Free: both kinds enter at once.
        lock.lock_exclusive(&wait);
        lock.unlock_exclusive();
        lock.lock_shared(&wait);
        lock.unlock_shared();
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
