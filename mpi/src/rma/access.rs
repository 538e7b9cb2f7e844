//! What this rank may do to each target of a window, one atomic byte per
//! target ([`Access`]): an operation and a flush read one byte instead of
//! locking the window's epochs and looking the target up, and a lock and
//! an unlock change one byte and nothing else.
//!
//! The byte has two parts that change apart. The epoch bits
//! ([`Access::EPOCHS`]: fence, start, `lock_all`) are the window's epochs
//! summarized, rewritten only under the epochs' mutex
//! ([`Access::set_epochs`]). The lock record ([`Access::RECORD`]) is the
//! passive-target lock this rank holds on the target, the only record of
//! it: set by [`Access::claim`] and cleared by [`Access::release`], each
//! one read-modify-write of the byte and no mutex (a mutex taken once in
//! a lock and once in an unlock was a third of a lock-op-unlock on
//! shared memory). Both parts change by read-modify-writes of the whole
//! byte, so neither is ever lost to the other's change, and two threads
//! (`MPI_THREAD_MULTIPLE`) that claim one target, or a claim and a
//! `lock_all`, meet in the byte's single order of changes: never both
//! win. Two claims: exactly one wins. A claim and a `lock_all`: if the
//! claim comes first, `lock_all` sees it and backs out; a claim refused
//! by a `lock_all` that then backs out (it met another thread's lock on
//! another target) fails too, neither holding the target.

use std::sync::atomic::{AtomicU8, Ordering};

/// Every target's byte: see the module docs.
pub(super) struct Access {
    bytes: Box<[AtomicU8]>,
}

impl Access {
    /// Epoch bit: fence, start or `lock_all` opened an access epoch to
    /// the target.
    pub(super) const OPEN: u8 = 1;
    /// Epoch bit: `lock_all` is open (flushes are allowed).
    pub(super) const ALL: u8 = 2;
    /// Epoch bit: `lock_all` took the target's lock (not under
    /// `MODE_NOCHECK`).
    pub(super) const ALL_TAKEN: u8 = 4;
    /// Epoch bit, on every target: a start epoch is open (to some
    /// targets), so no lock may be taken (MPI 4.1 §12.5: a window's
    /// access epochs at a process are disjoint).
    pub(super) const STARTED: u8 = 128;
    /// The epoch bits.
    pub(super) const EPOCHS: u8 = Access::OPEN | Access::ALL | Access::ALL_TAKEN | Access::STARTED;

    /// Record bit: this rank holds a lock on the target (`MPI_Win_lock`).
    pub(super) const HELD: u8 = 8;
    /// Record bit: the lock held is exclusive.
    pub(super) const EXCLUSIVE: u8 = 16;
    /// Record bit: the lock held was taken (not under `MODE_NOCHECK`).
    pub(super) const TAKEN: u8 = 32;
    /// Record bit: the lock held is being given back by an unlock that
    /// keeps the record until the release has left
    /// ([`Access::begin_release`]).
    pub(super) const ENDING: u8 = 64;
    /// The lock record's bits.
    pub(super) const RECORD: u8 = Access::HELD | Access::EXCLUSIVE | Access::TAKEN | Access::ENDING;

    /// Any of these: an access epoch to the target is open.
    pub(super) const ANY_OPEN: u8 = Access::OPEN | Access::HELD;
    /// Any of these: a passive-target epoch to it is open (a lock or
    /// `lock_all`): flushes are allowed, and no other lock.
    pub(super) const ANY_PASSIVE: u8 = Access::ALL | Access::HELD;
    /// Any of these: no lock of the target may be taken (a passive-target
    /// epoch to it, or a start epoch, is open).
    pub(super) const NO_LOCK: u8 = Access::ANY_PASSIVE | Access::STARTED;
    /// Any of these: this rank holds a lock on the target that it took.
    pub(super) const ANY_TAKEN: u8 = Access::ALL_TAKEN | Access::TAKEN;

    /// `targets` bytes, all clear: no epoch, no lock.
    pub(super) fn new(targets: usize) -> Access {
        Access {
            bytes: (0..targets).map(|_| AtomicU8::new(0)).collect(),
        }
    }

    /// The number of targets.
    pub(super) fn targets(&self) -> usize {
        self.bytes.len()
    }

    /// `target`'s byte, if it is a target of the window. Inlined always:
    /// every operation's check starts here.
    #[inline(always)]
    pub(super) fn get(&self, target: usize) -> Option<u8> {
        Some(self.bytes.get(target)?.load(Ordering::Acquire))
    }

    /// Whether any target's byte has one of the bits of `mask`.
    pub(super) fn any(&self, mask: u8) -> bool {
        self.bytes
            .iter()
            .any(|byte| byte.load(Ordering::Acquire) & mask != 0)
    }

    /// Records `record` (bits of [`Access::RECORD`], with
    /// [`Access::HELD`]) as the lock held on `target`, unless a
    /// passive-target epoch to it is open already (a lock, or
    /// `lock_all`) or a start epoch ([`Access::NO_LOCK`]): then `Err` with
    /// the byte that refused it. One
    /// compare-and-exchange when nothing else changes the byte meanwhile.
    pub(super) fn claim(&self, target: usize, record: u8) -> Result<(), u8> {
        debug_assert!(record & !Access::RECORD == 0 && record & Access::HELD != 0);
        let byte = &self.bytes[target];
        let mut now = byte.load(Ordering::Relaxed);
        loop {
            if now & Access::NO_LOCK != 0 {
                return Err(now);
            }
            // The epoch bits may change meanwhile (another thread's fence
            // or start): then the exchange fails and the look is again.
            match byte.compare_exchange_weak(now, now | record, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return Ok(()),
                Err(changed) => now = changed,
            }
        }
    }

    /// Marks the lock held on `target` as being given back
    /// ([`Access::ENDING`]), keeping the record, and returns it (with
    /// [`Access::HELD`]); `None` if no lock is held, or another thread's
    /// unlock of it is under way (nothing changes then). Meanwhile a
    /// claim is refused, the lock being held still; [`Access::release`]
    /// clears the record once the release has left. One
    /// compare-and-exchange when nothing else changes the byte meanwhile.
    pub(super) fn begin_release(&self, target: usize) -> Option<u8> {
        let byte = self.bytes.get(target)?;
        let mut now = byte.load(Ordering::Relaxed);
        loop {
            if now & Access::HELD == 0 || now & Access::ENDING != 0 {
                return None;
            }
            match byte.compare_exchange_weak(
                now,
                now | Access::ENDING,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Some(now & Access::RECORD),
                Err(changed) => now = changed,
            }
        }
    }

    /// Clears the lock record of `target`: the record it was (with
    /// [`Access::HELD`]), or `None` if no lock was held (nothing changes
    /// then: the record bits were clear). One read-modify-write.
    pub(super) fn release(&self, target: usize) -> Option<u8> {
        let was = self
            .bytes
            .get(target)?
            .fetch_and(!Access::RECORD, Ordering::AcqRel);
        (was & Access::HELD != 0).then_some(was & Access::RECORD)
    }

    /// Sets every target's epoch bits to `epochs` (target by target),
    /// keeping the lock records; only under the epochs' mutex, whose
    /// holder alone changes epoch bits, so the bits read are the bits
    /// there: a byte whose bits change gets one read-modify-write (an
    /// exclusive or of the difference) that leaves its record as it is
    /// at that instant, whatever a lock or an unlock did before. Returns
    /// whether a lock record was held on a target as its epoch bits
    /// changed, or as they were seen unchanged (`lock_all` claims every
    /// target by its change, and backs out if one was held).
    pub(super) fn set_epochs(&self, epochs: impl IntoIterator<Item = u8>) -> bool {
        let mut held = false;
        for (byte, epochs) in self.bytes.iter().zip(epochs) {
            let now = byte.load(Ordering::Acquire);
            let change = (now & Access::EPOCHS) ^ epochs;
            let was = if change == 0 {
                now
            } else {
                byte.fetch_xor(change, Ordering::AcqRel)
            };
            held |= was & Access::HELD != 0;
        }
        held
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Barrier};

    #[test]
    fn a_claim_is_refused_while_a_lock_or_lock_all_is_open_and_records_survive_epochs() {
        let access = Access::new(3);
        let exclusive = Access::HELD | Access::EXCLUSIVE | Access::TAKEN;
        assert_eq!(access.claim(1, exclusive), Ok(()));
        assert_eq!(access.claim(1, Access::HELD), Err(exclusive));
        // A fence opens every target; the record stays, and a fence that
        // ends leaves it too.
        assert!(access.set_epochs([Access::OPEN; 3]));
        assert_eq!(access.get(1), Some(Access::OPEN | exclusive));
        assert!(access.set_epochs([0; 3]));
        assert_eq!(access.get(1), Some(exclusive));
        assert_eq!(access.release(1), Some(exclusive));
        assert_eq!(access.release(1), None, "released twice");
        assert_eq!(access.get(1), Some(0));
        // lock_all: every byte passive; a claim is refused until it ends.
        let all = Access::OPEN | Access::ALL | Access::ALL_TAKEN;
        assert!(!access.set_epochs([all; 3]));
        assert_eq!(access.claim(2, Access::HELD), Err(all));
        assert!(!access.set_epochs([0; 3]));
        assert_eq!(access.claim(2, Access::HELD), Ok(()));
        assert!(access.any(Access::HELD));
        assert_eq!(access.get(3), None, "no fourth target");
        assert_eq!(access.release(3), None);
        // An unlock that keeps the record until its release has left:
        // claims and a second unlock are refused meanwhile.
        let shared = Access::HELD | Access::TAKEN;
        assert_eq!(access.release(2), Some(Access::HELD));
        assert_eq!(access.claim(2, shared), Ok(()));
        assert_eq!(access.begin_release(2), Some(shared));
        assert_eq!(access.begin_release(2), None, "a second unlock at once");
        assert_eq!(access.claim(2, Access::HELD), Err(shared | Access::ENDING));
        assert_eq!(access.release(2), Some(shared | Access::ENDING));
        assert_eq!(access.begin_release(2), None, "an unlock of no lock");
        assert_eq!(access.claim(2, Access::HELD), Ok(()));
    }

    /// Threads claim one target at once, round after round: exactly one
    /// wins each round, and the losers see the winner's record. Meanwhile
    /// another thread flips the epoch bits: no record is lost to it.
    #[test]
    fn racing_claims_of_one_target_have_exactly_one_winner() {
        const THREADS: usize = 4;
        const ROUNDS: usize = 2000;
        let access = Arc::new(Access::new(2));
        let start = Arc::new(Barrier::new(THREADS + 1));
        let end = Arc::new(Barrier::new(THREADS + 1));
        let claimers: Vec<_> = (0..THREADS)
            .map(|t| {
                let (access, start, end) = (access.clone(), start.clone(), end.clone());
                std::thread::spawn(move || {
                    let mut wins = 0;
                    let record = Access::HELD | if t % 2 == 0 { Access::EXCLUSIVE } else { 0 };
                    for _ in 0..ROUNDS {
                        start.wait();
                        match access.claim(1, record) {
                            Ok(()) => wins += 1,
                            Err(byte) => assert_ne!(byte & Access::HELD, 0, "refused unheld"),
                        }
                        end.wait();
                    }
                    wins
                })
            })
            .collect();
        for _ in 0..ROUNDS {
            start.wait();
            // The epoch bits change while the claims race.
            for open in [Access::OPEN, 0, Access::OPEN, 0] {
                access.set_epochs([open, open]);
            }
            end.wait();
            // Every round's winner left its record: clear it for the next.
            assert!(
                access.release(1).is_some(),
                "a round with no winner's record"
            );
            assert_eq!(access.get(1), Some(0));
        }
        let wins: usize = claimers.into_iter().map(|t| t.join().unwrap()).sum();
        assert_eq!(wins, ROUNDS, "rounds with no winner or two");
    }
}
