//! Context ids: what keeps the messages of different communicators apart.
//!
//! Every communicator has a context id that all its members agreed on,
//! and a process never has two live communicators with the same one. Its
//! messages carry two packet contexts derived from it
//! ([`point_to_point`], [`collective`]), so a program's point-to-point
//! messages never match a collective's, and no message matches a receive
//! on another communicator.
//!
//! Ids come from a pool of [`CONTEXT_IDS`] per process, kept as a bit
//! mask of the free ones. A new communicator's id is agreed as MPICH
//! does: the members reduce their masks with a bitwise and (an
//! all-reduce over the parent), and take the lowest id free at all of
//! them. An id goes back to the pool when the last handle on its
//! communicator is dropped, so a program can create and free
//! communicators without end, as long as at most `CONTEXT_IDS - 2` are
//! alive at once (world and self hold the first two).
//!
//! Threads: several threads may create communicators at once, on
//! different parents. Only one agreement at a time may lend the process's
//! mask; the others contribute an empty one, which makes their whole
//! agreement come out empty and try again. The mask goes to the waiting
//! agreement of lowest priority (its parent's context id), which is the
//! same order at every process, so some agreement always succeeds.

use crate::collective::algorithms::all_reduce;
use crate::collective::engine::block_on;
use crate::collective::op::{Reduction, SystemOperation};
use crate::collective::team::Team;
use crate::collective::typed::Output;
use crate::datatype::ElementType;
use crate::{Error, ErrorClass, Result};
use std::sync::{Mutex, MutexGuard};

/// Context ids in a process's pool.
pub(crate) const CONTEXT_IDS: usize = 4096;
const WORDS: usize = CONTEXT_IDS / 32;

/// Context id of the world communicator.
pub(crate) const WORLD: u32 = 0;
/// Context id of the self communicator.
pub(crate) const SELF: u32 = 1;

/// The packet context of a communicator's point-to-point messages.
pub(crate) fn point_to_point(id: u32) -> u32 {
    id << 1
}

/// The packet context of a communicator's collective messages.
pub(crate) fn collective(id: u32) -> u32 {
    (id << 1) | 1
}

struct Pool {
    /// Bit `i % 32` of word `i / 32` is set when id `i` is free.
    free: [u32; WORDS],
    /// Whether an agreement has lent the mask.
    lent: bool,
    /// Priorities of the agreements under way in this process.
    waiting: Vec<u64>,
}

static POOL: Mutex<Pool> = Mutex::new(Pool {
    free: initial_mask(),
    lent: false,
    waiting: Vec::new(),
});

/// Every id free but world's and self's.
const fn initial_mask() -> [u32; WORDS] {
    let mut free = [u32::MAX; WORDS];
    free[0] &= !((1 << WORLD) | (1 << SELF));
    free
}

fn pool() -> MutexGuard<'static, Pool> {
    // The pool is consistent between statements; a panic elsewhere while
    // it was held changes nothing.
    POOL.lock().unwrap_or_else(|p| p.into_inner())
}

/// Agrees with the other members of `team` on a context id free at all
/// of them (a collective call over the team) and, if `reserve`, takes it
/// from this process's pool (a process that will not be a member of the
/// new communicator takes part without taking it). `priority` orders
/// agreements of concurrent threads: the parent's context id, made unique
/// within a process by whatever else tells them apart.
pub(crate) fn agree(team: &Team, priority: u64, reserve: bool) -> Result<u32> {
    agree_by(priority, reserve, |words| and_over(team, words))
}

/// The bitwise and of `words` over the members of `team` (an all-reduce),
/// left in `words` at every member.
pub(crate) fn and_over(team: &Team, words: &mut [u32]) -> Result<()> {
    let band = SystemOperation::bitwise_and();
    let reduction = Reduction::new(&band, ElementType::of::<u32>())?;
    let mut output = Output::new(words)?;
    block_on(all_reduce(team, output.bytes_mut(), &reduction))?;
    output.finish()
}

/// [`agree`] among the processes that `and_all` reduces over: it leaves
/// in its argument the bitwise and of every process's (the same result
/// at each). An intercommunicator's two groups agree this way (see
/// `intercomm`).
pub(crate) fn agree_by(
    priority: u64,
    reserve: bool,
    and_all: impl FnMut(&mut [u32]) -> Result<()>,
) -> Result<u32> {
    pool().waiting.push(priority);
    let agreed = agree_waiting(priority, reserve, and_all);
    let mut pool = pool();
    if let Some(at) = pool.waiting.iter().position(|&p| p == priority) {
        pool.waiting.swap_remove(at);
    }
    agreed
}

fn agree_waiting(
    priority: u64,
    reserve: bool,
    mut and_all: impl FnMut(&mut [u32]) -> Result<()>,
) -> Result<u32> {
    loop {
        // The free ids, then a word that is all ones if this process lent
        // its mask: after the and, all ones if every member did.
        let mut words = [0u32; WORDS + 1];
        let lent = {
            let mut pool = pool();
            let lend = !pool.lent && pool.waiting.iter().min() == Some(&priority);
            if lend {
                pool.lent = true;
                words[..WORDS].copy_from_slice(&pool.free);
                words[WORDS] = u32::MAX;
            }
            lend
        };
        let reduced = and_all(&mut words[..]);
        let mut pool = pool();
        if lent {
            pool.lent = false;
        }
        reduced?;
        if let Some(id) = lowest_set_bit(&words[..WORDS]) {
            if reserve {
                pool.free[id / 32] &= !(1 << (id % 32));
            }
            return Ok(id as u32);
        }
        if words[WORDS] == u32::MAX {
            return Err(Error::new(
                ErrorClass::Other,
                format!(
                    "no context id is free at every member: at most {} communicators can exist at once; free some",
                    CONTEXT_IDS - 2
                ),
            ));
        }
        drop(pool);
        std::thread::yield_now();
    }
}

/// Gives `id` back to this process's pool.
pub(crate) fn release(id: u32) {
    let id = id as usize;
    if id < CONTEXT_IDS && id != WORLD as usize && id != SELF as usize {
        pool().free[id / 32] |= 1 << (id % 32);
    }
}

/// The index of the lowest set bit of `words`.
fn lowest_set_bit(words: &[u32]) -> Option<usize> {
    words
        .iter()
        .position(|&w| w != 0)
        .map(|i| i * 32 + words[i].trailing_zeros() as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn world_and_self_are_taken_and_packet_contexts_never_collide() {
        assert_eq!(lowest_set_bit(&initial_mask()), Some(2));
        assert_eq!(lowest_set_bit(&[0, 0, 0b1000]), Some(67));
        assert_eq!(lowest_set_bit(&[0; 4]), None);
        let mut contexts: Vec<u32> = (0..CONTEXT_IDS as u32)
            .flat_map(|id| [point_to_point(id), collective(id)])
            .collect();
        contexts.sort_unstable();
        contexts.dedup();
        assert_eq!(contexts.len(), 2 * CONTEXT_IDS);
    }
}
