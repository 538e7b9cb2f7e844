//! The matching engine: posted receives and unexpected messages.
//!
//! A message carries an [`Envelope`] (context id, source, tag); a receive
//! carries a [`Pattern`] that may leave the source or the tag open
//! (`MPI_ANY_SOURCE`, `MPI_ANY_TAG`). Both queues are searched from the
//! oldest entry, so the first match is the earliest posted receive or the
//! earliest arrived message. Since each VC delivers a sender's packets in
//! order, this keeps MPI's non-overtaking rule (MPI 4.1 §3.5): two messages
//! from one sender on one communicator that both match a receive are
//! received in the order they were sent.

use std::collections::VecDeque;

/// What identifies a message for matching.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Envelope {
    /// The communicator's context id.
    pub context_id: u32,
    /// The sender's rank in the communicator.
    pub source: i32,
    /// The message's tag.
    pub tag: i32,
}

/// What a receive or probe accepts. `None` is a wildcard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pattern {
    /// The communicator's context id (never a wildcard).
    pub context_id: u32,
    /// The source rank, or any.
    pub source: Option<i32>,
    /// The tag, or any.
    pub tag: Option<i32>,
}

impl Pattern {
    /// Whether a message with `envelope` satisfies this pattern.
    pub fn matches(&self, envelope: &Envelope) -> bool {
        self.context_id == envelope.context_id
            && self.source.is_none_or(|s| s == envelope.source)
            && self.tag.is_none_or(|t| t == envelope.tag)
    }
}

/// Receives that have been posted and not yet matched, oldest first.
#[derive(Default)]
pub struct PostedQueue {
    entries: VecDeque<(Pattern, u64)>,
}

impl PostedQueue {
    /// Posts the receive `token`, which accepts what `pattern` matches.
    pub fn push(&mut self, pattern: Pattern, token: u64) {
        self.entries.push_back((pattern, token));
    }

    /// Removes and returns the oldest receive that accepts `envelope`.
    #[inline]
    pub fn take_match(&mut self, envelope: &Envelope) -> Option<u64> {
        take_oldest(&mut self.entries, |(p, _)| p.matches(envelope)).map(|(_, token)| token)
    }

    /// Removes the receive with `token`; false if it is not queued.
    pub fn remove(&mut self, token: u64) -> bool {
        match self.entries.iter().position(|&(_, t)| t == token) {
            Some(at) => {
                self.entries.remove(at);
                true
            }
            None => false,
        }
    }

    /// Removes every receive for which `doomed` says so, oldest first.
    pub fn drain_where(&mut self, mut doomed: impl FnMut(u64) -> bool) -> Vec<u64> {
        let mut removed = Vec::new();
        self.entries.retain(|&(_, token)| {
            let drop = doomed(token);
            if drop {
                removed.push(token);
            }
            !drop
        });
        removed
    }
}

/// Messages that arrived before a matching receive, oldest first.
pub struct UnexpectedQueue<T> {
    entries: VecDeque<(Envelope, T)>,
}

impl<T> Default for UnexpectedQueue<T> {
    fn default() -> Self {
        UnexpectedQueue {
            entries: VecDeque::new(),
        }
    }
}

impl<T> UnexpectedQueue<T> {
    /// Queues a message that matched no posted receive.
    pub fn push(&mut self, envelope: Envelope, message: T) {
        self.entries.push_back((envelope, message));
    }

    /// Removes and returns the oldest message that `pattern` accepts.
    #[inline]
    pub fn take_match(&mut self, pattern: &Pattern) -> Option<(Envelope, T)> {
        take_oldest(&mut self.entries, |(e, _)| pattern.matches(e))
    }

    /// Removes and returns the oldest message for which `wanted` holds.
    pub fn take_first(
        &mut self,
        mut wanted: impl FnMut(&Envelope, &T) -> bool,
    ) -> Option<(Envelope, T)> {
        take_oldest(&mut self.entries, |(e, m)| wanted(e, m))
    }

    /// The oldest message that `pattern` accepts, left in place (probe).
    pub fn find(&self, pattern: &Pattern) -> Option<&(Envelope, T)> {
        self.entries.iter().find(|(e, _)| pattern.matches(e))
    }
}

/// Removes and returns the oldest entry for which `wanted` holds. The
/// oldest entry is looked at first, inline: in order it is the one that
/// matches (a ping-pong's every message finds it so), and a queue gives
/// it up for less than an entry from its middle.
#[inline]
fn take_oldest<T>(entries: &mut VecDeque<T>, mut wanted: impl FnMut(&T) -> bool) -> Option<T> {
    if wanted(entries.front()?) {
        return entries.pop_front();
    }
    take_later(entries, wanted)
}

/// [`take_oldest`] past the oldest entry.
#[inline(never)]
fn take_later<T>(entries: &mut VecDeque<T>, wanted: impl FnMut(&T) -> bool) -> Option<T> {
    let at = entries.iter().skip(1).position(wanted)? + 1;
    entries.remove(at)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(source: i32, tag: i32) -> Envelope {
        Envelope {
            context_id: 0,
            source,
            tag,
        }
    }

    fn pat(source: Option<i32>, tag: Option<i32>) -> Pattern {
        Pattern {
            context_id: 0,
            source,
            tag,
        }
    }

    #[test]
    fn wildcards_match_what_they_should() {
        let e = env(2, 5);
        assert!(pat(Some(2), Some(5)).matches(&e));
        assert!(pat(None, Some(5)).matches(&e));
        assert!(pat(Some(2), None).matches(&e));
        assert!(pat(None, None).matches(&e));
        assert!(!pat(Some(1), None).matches(&e));
        assert!(!pat(None, Some(4)).matches(&e));
        let other_context = Pattern {
            context_id: 1,
            source: None,
            tag: None,
        };
        assert!(!other_context.matches(&e));
    }

    #[test]
    fn unexpected_messages_match_oldest_first() {
        let mut q = UnexpectedQueue::default();
        q.push(env(1, 7), "a");
        q.push(env(2, 7), "b");
        q.push(env(1, 8), "c");
        q.push(env(1, 7), "d");
        // A specific source and tag skips others but takes the oldest of its own.
        assert_eq!(q.take_match(&pat(Some(1), Some(7))).unwrap().1, "a");
        // ANY_TAG from source 1: the oldest remaining from 1 is "c".
        assert_eq!(q.find(&pat(Some(1), None)).unwrap().1, "c");
        assert_eq!(q.take_match(&pat(Some(1), None)).unwrap().1, "c");
        // ANY_SOURCE, ANY_TAG: oldest overall.
        assert_eq!(q.take_match(&pat(None, None)).unwrap().1, "b");
        assert_eq!(q.take_match(&pat(None, Some(7))).unwrap().1, "d");
        assert!(q.take_match(&pat(None, None)).is_none());
    }

    #[test]
    fn posted_receives_match_oldest_first() {
        let mut q = PostedQueue::default();
        q.push(pat(None, Some(3)), 10);
        q.push(pat(Some(1), None), 11);
        q.push(pat(None, None), 12);
        // Source 1 tag 3: both 10 and 11 accept it; the older wins.
        assert_eq!(q.take_match(&env(1, 3)), Some(10));
        assert_eq!(q.take_match(&env(1, 3)), Some(11));
        assert_eq!(q.take_match(&env(0, 9)), Some(12));
        assert_eq!(q.take_match(&env(0, 9)), None);
        // The oldest does not accept it: a later one does, and the oldest
        // stays first.
        q.push(pat(Some(2), None), 20);
        q.push(pat(Some(1), None), 21);
        q.push(pat(None, None), 22);
        assert_eq!(q.take_match(&env(1, 0)), Some(21));
        assert_eq!(q.take_match(&env(2, 0)), Some(20));
        assert_eq!(q.take_match(&env(1, 0)), Some(22));
    }

    #[test]
    fn remove_and_drain() {
        let mut q = PostedQueue::default();
        for t in 0..6 {
            q.push(pat(None, None), t);
        }
        assert!(q.remove(3));
        assert!(!q.remove(3));
        assert_eq!(q.drain_where(|t| t % 2 == 0), vec![0, 2, 4]);
        assert_eq!(q.take_match(&env(0, 0)), Some(1));
        assert_eq!(q.take_match(&env(0, 0)), Some(5));
    }
}
