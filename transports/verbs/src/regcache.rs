//! The registration cache of the zero-copy rendezvous: user buffers are
//! registered with the NIC the first time a long message uses them, and
//! the registration is kept for the next message from (or into) the same
//! memory, which then costs no `ibv_reg_mr` (pinning pages and loading
//! the NIC's translation table: tens of microseconds per MiB on real
//! hardware).
//!
//! # Freed memory
//! On real hardware a registration pins the pages it covered when it was
//! made. If the program frees the buffer and the address range is later
//! mapped again (a `free` that unmaps, then a `malloc` that maps the same
//! addresses), a cached registration of that range would still name the
//! old pages: the NIC would read stale data. A cache must therefore learn
//! of unmaps, or check. Learning of them needs hooks into the allocator
//! and the unmapping system calls (glibc's `free` unmaps through internal
//! calls no symbol interposition sees, so UCX and Open MPI patch code at
//! run time) or `userfaultfd` events (unprivileged only in user-mode
//! mode, and a monitor thread on every rank); neither fits a library
//! that links into the program. So this cache **validates on use**: a
//! cached registration records the mapping (VMA) that held its range when
//! it was made — bounds, rights, file, offset — from the kernel
//! ([`crate::maps`], one `PROCMAP_QUERY` ioctl, about 1 µs), and a hit is
//! used only if the same mapping still holds it; otherwise the entry is
//! invalidated (deregistered) and the memory registered again; idle
//! registrations are also checked now and then ([`RegCache::sweep`]),
//! so that those of freed memory are released without waiting for a
//! use of their range. That
//! catches a range that was unmapped, unmapped and mapped again with other
//! bounds (a heap that shrank or grew, a `malloc` chunk of another size),
//! or mapped from another file. What it cannot see is an anonymous
//! mapping replaced by one of exactly the same bounds, or pages dropped
//! inside a live mapping (`MADV_DONTNEED`): the kernel reports nothing
//! that tells them apart. The risk is bounded by what is cached: only
//! ranges inside one mapping, at most [`CACHE_ENTRIES`] idle
//! registrations and [`CACHE_BYTES`] of idle memory (least recently used
//! dropped first). Where the kernel has no `PROCMAP_QUERY` (before Linux
//! 6.11), nothing is cached: each message registers its buffers and
//! releases them when it ends. The soft provider pins nothing (its NIC
//! reads the process's current memory), so for it a stale registration
//! is only a matter of accounting.
//!
//! Registrations in use (a rendezvous under way reads or writes them)
//! are never dropped: a lease ([`RegCache::acquire`]) holds its entry
//! until [`RegCache::release`]. An idle one may outlive its memory, which
//! [`Nic::register`] allows of the rights the cache gives (LOCAL_WRITE,
//! used only by this rank's posted READs while leased, or REMOTE_READ): a
//! peer that reads an old key out of protocol gets what the pinned pages
//! hold, or with the soft provider a remote access error where nothing
//! is mapped, never a fault of this process.

use crate::maps::{Mapping, Maps};
use crate::provider::{AccessFlags, MemoryRegion, Nic};
use oxmpi_adi::{Error, ErrorClass, Result};

/// Idle registrations kept at most.
pub const CACHE_ENTRIES: usize = 64;
/// Bytes of idle registrations kept at most (1 GiB).
pub const CACHE_BYTES: u64 = 1 << 30;
/// Registrations cover whole pages.
const PAGE: u64 = 4096;

/// What the cache did so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Registrations made (`ibv_reg_mr` calls).
    pub registrations: u64,
    /// Uses served by a registration already made.
    pub hits: u64,
    /// Cached registrations dropped because their memory's mapping
    /// changed.
    pub invalidations: u64,
    /// Idle registrations dropped to stay within the bounds.
    pub evictions: u64,
}

/// A use of a registration, until [`RegCache::release`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    /// The cache's name for it.
    pub id: u64,
    /// The registration's local key.
    pub lkey: u32,
    /// The registration's remote key.
    pub rkey: u32,
}

struct Entry<M> {
    id: u64,
    mr: M,
    start: u64,
    end: u64,
    access: AccessFlags,
    /// The mapping that held the range when it was registered; `None`:
    /// not cached (dropped when its last lease ends).
    mapping: Option<Mapping>,
    leases: u32,
    last_use: u64,
}

/// Registrations of user memory for the rendezvous, kept for reuse: see
/// the module docs.
pub struct RegCache<M> {
    entries: Vec<Entry<M>>,
    maps: Option<Maps>,
    clock: u64,
    next_id: u64,
    stats: CacheStats,
}

impl<M: MemoryRegion> RegCache<M> {
    /// An empty cache; it caches only where the kernel lets it validate
    /// hits (see the module docs).
    pub fn new() -> RegCache<M> {
        RegCache {
            entries: Vec::new(),
            maps: Maps::open(),
            clock: 0,
            next_id: 1,
            stats: CacheStats::default(),
        }
    }

    /// Whether registrations outlive their use (the kernel can validate
    /// them).
    pub fn caches(&self) -> bool {
        self.maps.is_some()
    }

    /// What the cache did so far.
    pub fn stats(&self) -> CacheStats {
        self.stats
    }

    /// A registration with at least `access` covering `len` bytes at
    /// `addr` (`len > 0`): a cached one whose mapping is unchanged, or a
    /// new one of the whole pages. Held until [`RegCache::release`].
    ///
    /// `access` is LOCAL_WRITE, REMOTE_READ or both (an `Intern` error
    /// otherwise: see the module docs).
    ///
    /// # Safety
    /// The memory must be valid (and writable where `access` asks it)
    /// for the whole lease.
    pub unsafe fn acquire<N: Nic<Mr = M>>(
        &mut self,
        nic: &N,
        pd: &N::Pd,
        addr: u64,
        len: usize,
        access: AccessFlags,
    ) -> Result<Lease> {
        if !(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ).contains(access) {
            // Remote writes or atomics on memory the cache keeps after
            // its buffer is freed would be writes into freed memory.
            return Err(Error::new(
                ErrorClass::Intern,
                format!("the registration cache keeps no {access:?} registration"),
            ));
        }
        self.clock += 1;
        let start = addr & !(PAGE - 1);
        let end = (addr + len as u64).next_multiple_of(PAGE);
        if let Some(i) = self.entries.iter().position(|e| {
            e.mapping.is_some() && e.start <= start && end <= e.end && e.access.contains(access)
        }) {
            let now = self
                .maps
                .as_ref()
                .and_then(|m| m.mapping_at(self.entries[i].start));
            if now.is_some() && now == self.entries[i].mapping {
                let e = &mut self.entries[i];
                e.leases += 1;
                e.last_use = self.clock;
                self.stats.hits += 1;
                return Ok(Lease {
                    id: e.id,
                    lkey: e.mr.lkey(),
                    rkey: e.mr.rkey(),
                });
            }
            self.stats.invalidations += 1;
            let e = &mut self.entries[i];
            oxmpi_adi::vlog!(
                "verbs registration cache: invalidated {} bytes at {:#x} (its mapping changed: \
                 freed and mapped again)",
                e.end - e.start,
                e.start
            );
            // Not found again; dropped now if idle (a lease in use cannot
            // see its memory unmapped: its buffer is live), else when its
            // last lease ends.
            e.mapping = None;
            if e.leases == 0 {
                self.entries.swap_remove(i);
            }
        }
        // SAFETY: the caller keeps `addr..addr + len` valid for the lease;
        // the rest of its first and last pages is mapped with them, and
        // the registration gives no right beyond `access` (LOCAL_WRITE or
        // REMOTE_READ, the transport's only uses). An idle cached
        // registration outlives the lease, as `register` allows of these
        // rights: see the module docs.
        let mr = match unsafe { nic.register(pd, start as *mut u8, (end - start) as usize, access) }
        {
            Ok(mr) => mr,
            Err(e) if self.entries.iter().any(|e| e.leases == 0) => {
                // Perhaps a limit on registered memory: drop the idle
                // ones and try once more.
                self.evict(0, 0);
                // SAFETY: as above.
                unsafe { nic.register(pd, start as *mut u8, (end - start) as usize, access) }
                    .map_err(|_| e)?
            }
            Err(e) => return Err(e),
        };
        self.stats.registrations += 1;
        let mapping = self
            .maps
            .as_ref()
            .and_then(|m| m.mapping_at(start))
            .filter(|m| m.start <= start && end <= m.end);
        oxmpi_adi::vlog!(
            "verbs registration cache: registered {} bytes at {start:#x} ({}; registration {})",
            end - start,
            if mapping.is_some() {
                "cached"
            } else {
                "not cached: no single mapping holds it, or the kernel cannot tell"
            },
            self.stats.registrations
        );
        let id = self.next_id;
        self.next_id += 1;
        let lease = Lease {
            id,
            lkey: mr.lkey(),
            rkey: mr.rkey(),
        };
        self.entries.push(Entry {
            id,
            mr,
            start,
            end,
            access,
            mapping,
            leases: 1,
            last_use: self.clock,
        });
        Ok(lease)
    }

    /// Ends a lease: the registration stays cached, or is dropped if it
    /// is not to be (or no longer valid). An unknown id is ignored.
    pub fn release(&mut self, id: u64) {
        let Some(i) = self.entries.iter().position(|e| e.id == id) else {
            return;
        };
        let e = &mut self.entries[i];
        e.leases = e.leases.saturating_sub(1);
        if e.leases == 0 && e.mapping.is_none() {
            self.entries.swap_remove(i);
        }
        self.evict(CACHE_ENTRIES, CACHE_BYTES);
    }

    /// Drops the idle registrations whose memory's mapping changed since
    /// they were made (freed, or freed and mapped again), so that a freed
    /// buffer's pages are not kept pinned until its range is used again
    /// or evicted. One mapping look-up per idle registration; the
    /// transport calls it now and then while it makes progress.
    pub fn sweep(&mut self) {
        let Some(maps) = &self.maps else {
            return;
        };
        let before = self.entries.len();
        self.entries.retain(|e| {
            e.leases > 0 || (e.mapping.is_some() && maps.mapping_at(e.start) == e.mapping)
        });
        let dropped = (before - self.entries.len()) as u64;
        if dropped > 0 {
            self.stats.invalidations += dropped;
            oxmpi_adi::vlog!(
                "verbs registration cache: released {dropped} idle registrations of memory \
                 freed since"
            );
        }
    }

    /// Drops the least recently used idle registrations until at most
    /// `entries` of them, of at most `bytes` in all, are left.
    fn evict(&mut self, entries: usize, bytes: u64) {
        loop {
            let idle = self.entries.iter().filter(|e| e.leases == 0);
            let (count, total) = idle.fold((0, 0), |(n, b), e| (n + 1, b + (e.end - e.start)));
            if count <= entries && total <= bytes {
                return;
            }
            let Some(i) = self
                .entries
                .iter()
                .enumerate()
                .filter(|(_, e)| e.leases == 0)
                .min_by_key(|(_, e)| e.last_use)
                .map(|(i, _)| i)
            else {
                return;
            };
            self.entries.swap_remove(i);
            self.stats.evictions += 1;
        }
    }
}

impl<M: MemoryRegion> Default for RegCache<M> {
    fn default() -> Self {
        RegCache::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::soft::SoftNic;

    /// A fresh anonymous mapping of `len` bytes; at `at` if given, which
    /// must be a range of this test's own mappings: it replaces them at
    /// once (`MAP_FIXED`), so no other thread can take the place between
    /// an unmap and a map.
    fn map(at: Option<u64>, len: usize) -> *mut u8 {
        let (addr, fixed) = match at {
            Some(a) => (a as *mut libc::c_void, libc::MAP_FIXED),
            None => (std::ptr::null_mut(), 0),
        };
        // SAFETY: an anonymous mapping at a place the kernel picks, or
        // over the caller's own mappings, which nothing else uses.
        let p = unsafe {
            libc::mmap(
                addr,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | fixed,
                -1,
                0,
            )
        };
        assert_ne!(
            p,
            libc::MAP_FAILED,
            "mmap: {}",
            std::io::Error::last_os_error()
        );
        p.cast()
    }

    fn unmap(p: *mut u8, len: usize) {
        // SAFETY: a mapping `map` made, not used after.
        assert_eq!(unsafe { libc::munmap(p.cast(), len) }, 0);
    }

    #[test]
    fn a_repeated_buffer_is_registered_once_and_a_remapped_one_again() {
        const MIB: usize = 1 << 20;
        let nic = SoftNic::open().unwrap();
        let pd = nic.alloc_pd().unwrap();
        let mut cache = RegCache::new();
        if !cache.caches() {
            eprintln!("no PROCMAP_QUERY: nothing is cached, nothing to check");
            return;
        }
        // 1 MiB mapped alone: the first half of a 2 MiB range whose
        // second half is made inaccessible (a mapping of its own, kept
        // so that the range stays this test's).
        let p = map(None, 2 * MIB);
        // SAFETY: the second half of the mapping just made, used by
        // nothing.
        let protected = unsafe { libc::mprotect(p.add(MIB).cast(), MIB, libc::PROT_NONE) };
        assert_eq!(
            protected,
            0,
            "mprotect: {}",
            std::io::Error::last_os_error()
        );
        let acquire = |cache: &mut RegCache<_>, access| {
            // SAFETY: the mapping stays until each lease is released below.
            unsafe { cache.acquire(&nic, &pd, p as u64 + 100, MIB - 200, access) }.unwrap()
        };
        let a = acquire(&mut cache, AccessFlags::LOCAL_WRITE);
        let b = acquire(&mut cache, AccessFlags::LOCAL_WRITE);
        assert_eq!(a.id, b.id);
        cache.release(a.id);
        cache.release(b.id);
        let c = acquire(&mut cache, AccessFlags::LOCAL_WRITE);
        cache.release(c.id);
        let stats = cache.stats();
        assert_eq!((stats.registrations, stats.hits), (1, 2));
        // Rights it lacks: a registration of its own.
        let d = acquire(&mut cache, AccessFlags::REMOTE_READ);
        cache.release(d.id);
        assert_eq!(cache.stats().registrations, 2);
        // Freed, and the addresses mapped again (with other bounds): the
        // new mapping replaces both halves at once.
        let q = map(Some(p as u64), 2 * MIB);
        assert_eq!(q, p);
        let e = acquire(&mut cache, AccessFlags::LOCAL_WRITE);
        cache.release(e.id);
        let stats = cache.stats();
        assert_eq!((stats.registrations, stats.invalidations), (3, 1));
        unmap(q, 2 * MIB);
    }

    #[test]
    fn a_sweep_releases_idle_registrations_of_freed_memory() {
        let nic = SoftNic::open().unwrap();
        let pd = nic.alloc_pd().unwrap();
        let mut cache = RegCache::new();
        if !cache.caches() {
            return;
        }
        const LEN: usize = 1 << 16;
        let freed = map(None, LEN);
        // `kept` between two inaccessible pages' worth of guards: its own
        // mapping, which the kernel cannot merge with `freed` (whose unmap
        // would then change `kept`'s bounds too).
        let guarded = map(None, 3 * LEN);
        for guard in [0, 2 * LEN] {
            // SAFETY: part of the mapping just made, used by nothing.
            let r = unsafe { libc::mprotect(guarded.add(guard).cast(), LEN, libc::PROT_NONE) };
            assert_eq!(r, 0, "mprotect: {}", std::io::Error::last_os_error());
        }
        // SAFETY: inside the mapping just made.
        let kept = unsafe { guarded.add(LEN) };
        let mut leases = Vec::new();
        for p in [freed, kept] {
            // SAFETY: the mapping stays until the lease is released
            // (below, before `freed` is unmapped).
            let l =
                unsafe { cache.acquire(&nic, &pd, p as u64, 1 << 16, AccessFlags::REMOTE_READ) }
                    .unwrap();
            leases.push(l);
        }
        cache.release(leases[0].id);
        unmap(freed, LEN);
        // In use: kept whatever its memory, though `kept` is live anyway.
        cache.sweep();
        assert_eq!(cache.entries.len(), 1);
        assert_eq!(cache.stats().invalidations, 1);
        cache.release(leases[1].id);
        cache.sweep();
        assert_eq!(cache.entries.len(), 1, "a live buffer's registration stays");
        unmap(guarded, 3 * LEN);
        cache.sweep();
        assert!(cache.entries.is_empty());
        assert_eq!(cache.stats().invalidations, 2);
    }

    #[test]
    fn idle_registrations_are_bounded() {
        let nic = SoftNic::open().unwrap();
        let pd = nic.alloc_pd().unwrap();
        let mut cache = RegCache::new();
        if !cache.caches() {
            return;
        }
        let buffers: Vec<Vec<u8>> = (0..CACHE_ENTRIES + 8).map(|_| vec![0; 8192]).collect();
        for b in &buffers {
            // SAFETY: the buffer outlives its lease.
            let l = unsafe {
                cache.acquire(
                    &nic,
                    &pd,
                    b.as_ptr() as u64,
                    b.len(),
                    AccessFlags::REMOTE_READ,
                )
            }
            .unwrap();
            cache.release(l.id);
        }
        assert!(cache.entries.len() <= CACHE_ENTRIES);
        assert!(cache.stats().evictions >= 8);
    }
}
