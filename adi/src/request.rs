//! Request storage: a slab of request records addressed by tokens.
//!
//! A token is `generation << 32 | index`. Peers name our requests by token
//! (in rendezvous replies), so a token from the wire is looked up, never
//! trusted: a stale or forged token finds nothing, because the slot's
//! generation moves on each time it is reused. Generations start at 1, so
//! no valid token is 0.

/// A slab of `T` addressed by generation-checked tokens.
pub struct Slab<T> {
    slots: Vec<Slot<T>>,
    free: Vec<u32>,
}

struct Slot<T> {
    generation: u32,
    value: Option<T>,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Slab {
            slots: Vec::new(),
            free: Vec::new(),
        }
    }
}

impl<T> Slab<T> {
    /// Stores `value` and returns its token.
    pub fn insert(&mut self, value: T) -> u64 {
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push(Slot {
                    generation: 0,
                    value: None,
                });
                (self.slots.len() - 1) as u32
            }
        };
        let slot = &mut self.slots[index as usize];
        slot.generation = slot.generation.wrapping_add(1).max(1);
        slot.value = Some(value);
        (u64::from(slot.generation) << 32) | u64::from(index)
    }

    #[inline]
    fn slot(&self, token: u64) -> Option<&Slot<T>> {
        let slot = self.slots.get((token & 0xffff_ffff) as usize)?;
        (u64::from(slot.generation) == token >> 32).then_some(slot)
    }

    /// The value of `token`, if it is live (a stale token finds nothing).
    #[inline]
    pub fn get(&self, token: u64) -> Option<&T> {
        self.slot(token)?.value.as_ref()
    }

    /// The value of `token` to change, if it is live.
    pub fn get_mut(&mut self, token: u64) -> Option<&mut T> {
        self.slot(token)?;
        self.slots[(token & 0xffff_ffff) as usize].value.as_mut()
    }

    /// Removes and returns the value of `token`.
    pub fn remove(&mut self, token: u64) -> Option<T> {
        self.slot(token)?;
        let index = (token & 0xffff_ffff) as u32;
        let value = self.slots[index as usize].value.take()?;
        self.free.push(index);
        Some(value)
    }

    /// Drops the value of `token` where it lies (no move out of the
    /// slab, which costs for a large `T`); false if it is not live.
    pub fn discard(&mut self, token: u64) -> bool {
        self.take_with(token, |_| Some(())).is_some()
    }

    /// What `take` gives from the value of `token`, which is then dropped
    /// where it lies (as [`Slab::discard`]); when `take` gives nothing, or
    /// `token` is not live, the value stays. One look-up for what would
    /// otherwise be a [`Slab::get_mut`] and a [`Slab::discard`].
    #[inline]
    pub fn take_with<R>(
        &mut self,
        token: u64,
        take: impl FnOnce(&mut T) -> Option<R>,
    ) -> Option<R> {
        let index = (token & 0xffff_ffff) as u32;
        let slot = self.slots.get_mut(index as usize)?;
        if u64::from(slot.generation) != token >> 32 {
            return None;
        }
        let taken = take(slot.value.as_mut()?)?;
        slot.value = None;
        self.free.push(index);
        Some(taken)
    }

    /// Tokens and values of every live entry.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (u64, &mut T)> {
        self.slots.iter_mut().enumerate().filter_map(|(i, s)| {
            let token = (u64::from(s.generation) << 32) | i as u64;
            s.value.as_mut().map(|v| (token, v))
        })
    }

    /// Number of live entries.
    pub fn len(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// Whether no entry is live.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_nonzero_and_checked() {
        let mut s = Slab::default();
        let a = s.insert("a");
        assert_ne!(a, 0);
        assert_eq!(s.get(a), Some(&"a"));
        assert_eq!(s.remove(a), Some("a"));
        // The slot is reused under a new generation: the old token is dead.
        let b = s.insert("b");
        assert_eq!(a & 0xffff_ffff, b & 0xffff_ffff);
        assert_ne!(a, b);
        assert_eq!(s.get(a), None);
        assert_eq!(s.remove(a), None);
        assert_eq!(s.get(b), Some(&"b"));
        // Discarded in place, once.
        assert!(s.discard(b) && !s.discard(b));
        // Taken only when `take` gives something.
        let d = s.insert("d");
        assert_eq!(s.take_with(d, |_| None::<()>), None);
        assert_eq!(s.get(d), Some(&"d"));
        assert_eq!(s.take_with(d, |v| Some(v.len())), Some(1));
        assert_eq!(s.get(d), None);
        assert_eq!(s.take_with(d, |v| Some(v.len())), None);
        assert_eq!(s.get(b), None);
        assert_ne!(s.insert("c"), b);
        // Forged tokens find nothing.
        assert_eq!(s.get(0), None);
        assert_eq!(s.get(u64::MAX), None);
        assert_eq!(s.len(), 1);
    }
}
