//! Shared regions: memory that several processes of one host map at once,
//! beside the transport's queues — what the MPI layer's collectives over
//! shared memory work in.
//!
//! One process makes a region ([`SharedRegion::create`]): a sealed memory
//! file, zeroed, mapped. Its [`RegionName`] (the maker's pid, the number
//! of its hand-over, a random token and the size) travels to the other
//! processes in an ordinary message, and each is handed the descriptor
//! over an abstract Unix socket (`SCM_RIGHTS`, as the queues' segments
//! are; module `handover`) and maps it ([`SharedRegion::attach`]). That
//! needs no rights over the maker: it works where ptrace is restricted
//! (Yama's `ptrace_scope`) and between ranks of different users, in one
//! network namespace. The file has no name in any file system, so
//! nothing outlives the processes, however they end. The maker offers the
//! region to its process's one hand-over server, answered by whichever of
//! its threads looks first (its shared-memory transport's poll, or the
//! server's own thread), until every other process has attached and it
//! calls [`SharedRegion::stop_handover`] (or drops the region); a process
//! may still fail to attach (one of another network
//! namespace, or out of descriptors), so callers must be ready to do
//! without a region.
//!
//! The memory is reached through atomics ([`SharedRegion::word`]) and byte
//! copies ([`SharedRegion::write`], [`SharedRegion::read`]) only, never
//! through references to plain data: other processes write it at any
//! time. Publishing data is the caller's protocol: copy, then a release
//! store of a word; an acquire load of the word, then copy.
//!
//! A [`Doorbell`] in a region lets a process that waits there sleep in
//! the kernel and be woken when another publishes, instead of polling.

use crate::handover::{self, Offer, Ticket};
use crate::sys;
use memmap2::MmapMut;
use std::ffi::CStr;
use std::fs::File;
use std::io;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// How long [`SharedRegion::attach`] waits for the maker to hand the
/// region over: a thread of the maker's answers where it does not poll,
/// so only a stalled machine makes this matter.
const HANDOVER_TIMEOUT: Duration = Duration::from_secs(30);

/// What another process of the host needs to attach a region. It is also
/// the right to: whoever has it may map the memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionName {
    /// The process that made it.
    pub pid: u32,
    /// The number of the maker's hand-over of it (which names the
    /// maker's socket).
    pub serial: u32,
    /// What proves to the maker that the caller was given the name.
    pub token: u64,
    /// The size in bytes.
    pub len: u64,
}

impl RegionName {
    /// The name as three words, to send in a message.
    pub fn to_words(self) -> [u64; 3] {
        [
            u64::from(self.pid) << 32 | u64::from(self.serial),
            self.token,
            self.len,
        ]
    }

    /// The name sent as [`RegionName::to_words`]; `None` if it cannot be
    /// one (no process has id 0).
    pub fn from_words(words: [u64; 3]) -> Option<RegionName> {
        let pid = (words[0] >> 32) as u32;
        (pid != 0).then_some(RegionName {
            pid,
            serial: words[0] as u32,
            token: words[1],
            len: words[2],
        })
    }

    fn ticket(&self) -> Ticket {
        Ticket {
            pid: self.pid,
            serial: self.serial,
            token: self.token,
        }
    }
}

/// A mapped shared region: see the module docs.
#[derive(Debug)]
pub struct SharedRegion {
    /// The mapping; `base` points into it.
    map: MmapMut,
    base: *mut u8,
    len: usize,
    /// The maker's offer to the processes that attach, while it lasts.
    handover: Mutex<Option<Offer>>,
}

// SAFETY: the region is a mapping owned by this value; every access goes
// through atomics or byte copies through `base`, which are as valid from
// any thread as from the one that made it.
unsafe impl Send for SharedRegion {}
// SAFETY: as above; `&self` methods only do atomic accesses and copies,
// whose ordering the callers' protocol provides.
unsafe impl Sync for SharedRegion {}

impl SharedRegion {
    /// A new zeroed region of `len` bytes (at least one), and its name,
    /// handed over to the processes that attach it until
    /// [`SharedRegion::stop_handover`]. It shows in `/proc/PID/maps` as
    /// `/memfd:LABEL`.
    pub fn create(len: usize, label: &CStr) -> io::Result<(SharedRegion, RegionName)> {
        let file = sys::memfd(label)?;
        file.set_len(len.max(1) as u64)?;
        sys::seal_size(&file)?;
        let (offer, ticket) = Offer::start(&file)?;
        let name = RegionName {
            pid: ticket.pid,
            serial: ticket.serial,
            token: ticket.token,
            len: len.max(1) as u64,
        };
        Ok((SharedRegion::map(file, Some(offer))?, name))
    }

    /// Attaches the region another process of this host made and named
    /// `name`: is handed its memory file (within 30 seconds) and checks
    /// that it is a sealed memory file of the named size.
    pub fn attach(name: &RegionName) -> io::Result<SharedRegion> {
        let file = handover::fetch(&name.ticket(), HANDOVER_TIMEOUT)?;
        let len = file.metadata()?.len();
        if len != name.len {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "the region of process {} is {len} bytes, not the {} it was named with",
                    name.pid, name.len
                ),
            ));
        }
        SharedRegion::map(file, None)
    }

    /// Maps `file` (closed once mapped: the mapping keeps the memory);
    /// `handover` is the maker's.
    fn map(file: File, handover: Option<Offer>) -> io::Result<SharedRegion> {
        let mut map = sys::map(&file)?;
        Ok(SharedRegion {
            base: map.as_mut_ptr(),
            len: map.len(),
            map,
            handover: Mutex::new(handover),
        })
    }

    /// Stops handing the region over (at its maker; nothing elsewhere):
    /// once every process that attaches it has, so that the memory file
    /// is not offered for the region's life.
    pub fn stop_handover(&self) {
        // A poisoned lock only means a panic elsewhere: the offer is
        // withdrawn all the same.
        let offer = match self.handover.lock() {
            Ok(mut offer) => offer.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        };
        drop(offer);
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region has no bytes (never: regions have at least one).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Binds the region's pages whose first byte lies in `bytes` to this
    /// process's NUMA nodes, where its placement binds (module `numa` of
    /// this crate: every page of a region cut into ranges is bound by the
    /// one owner of the range that holds its first byte; a kernel that
    /// refuses makes it first touch, said under `OXMPI_VERBOSE=1`, with
    /// `what` naming the range). To call before any process touches
    /// those pages. An `MPI_ERR_ARG` error where `OXMPI_NUMA_NODES` is
    /// not a list of nodes, `MPI_ERR_INTERN` where `bytes` are not in the
    /// region.
    pub fn bind_to_own_nodes(
        &self,
        bytes: std::ops::Range<usize>,
        what: impl std::fmt::Display,
    ) -> oxmpi_adi::Result<()> {
        if bytes.start > bytes.end || bytes.end > self.len {
            return Err(oxmpi_adi::Error::new(
                oxmpi_adi::ErrorClass::Intern,
                format!(
                    "bytes {bytes:?} of {what} to place are not in its region of {} bytes",
                    self.len
                ),
            ));
        }
        crate::numa::bind_pages(&self.map, bytes, what)
    }

    /// The 8-byte word at `offset`, if it is aligned and in the region.
    pub fn word(&self, offset: usize) -> Option<&AtomicU64> {
        if !offset.is_multiple_of(8) || offset.checked_add(8)? > self.len {
            return None;
        }
        // SAFETY: `offset..offset + 8` lies in the mapping (checked), which
        // is page-aligned, so the word is 8-aligned; the mapping lives as
        // long as `self`, and the memory is only ever accessed atomically
        // where it is used as a word (the callers' layout).
        Some(unsafe { AtomicU64::from_ptr(self.base.add(offset).cast()) })
    }

    /// The doorbell made of the 8 bytes at `offset`, if they are aligned
    /// and in the region: every process that rings it or sleeps on it
    /// must name the same bytes, and use them for nothing else.
    pub fn doorbell(&self, offset: usize) -> Option<Doorbell<'_>> {
        let word = self.word(offset)?;
        let base: *mut u32 = word.as_ptr().cast();
        // SAFETY: the word is an 8-aligned 8 bytes of the mapping (checked
        // by `word`), so both halves are aligned 4-byte atomics that live
        // as long as `self`; the callers' layout uses them only as these
        // two atomics.
        let (rings, sleepers) =
            unsafe { (AtomicU32::from_ptr(base), AtomicU32::from_ptr(base.add(1))) };
        Some(Doorbell { rings, sleepers })
    }

    /// A pointer to the `len` bytes at `offset`, if they are in the region:
    /// for layouts that place their own atomics or byte ranges in it (the
    /// RMA windows of module `window`), which keep to the rule of the
    /// module docs: no references to plain data.
    pub(crate) fn ptr(&self, offset: usize, len: usize) -> Option<*mut u8> {
        if offset.checked_add(len)? > self.len {
            return None;
        }
        // SAFETY: `offset` is within the mapping (checked), so the result
        // points into it or one past its end.
        Some(unsafe { self.base.add(offset) })
    }

    /// Copies `bytes` into the region at `offset`; `false` (nothing
    /// copied) if they do not fit.
    pub fn write(&self, offset: usize, bytes: &[u8]) -> bool {
        if offset
            .checked_add(bytes.len())
            .is_none_or(|end| end > self.len)
        {
            return false;
        }
        // SAFETY: the destination lies in the mapping (checked) and cannot
        // overlap `bytes`, which is this process's own memory; no reference
        // to the destination exists (module docs).
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.base.add(offset), bytes.len())
        };
        true
    }

    /// Copies bytes of the region at `offset` into `out`; `false` (nothing
    /// copied) if they are not all in the region.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> bool {
        if offset
            .checked_add(out.len())
            .is_none_or(|end| end > self.len)
        {
            return false;
        }
        // SAFETY: the source lies in the mapping (checked) and cannot
        // overlap `out`, which is this process's own memory.
        unsafe {
            std::ptr::copy_nonoverlapping(self.base.add(offset), out.as_mut_ptr(), out.len())
        };
        true
    }
}

/// Two words of a region through which processes that wait there for a
/// publication sleep and are woken ([`SharedRegion::doorbell`]): a count
/// of rings, on which sleepers wait (a futex shared between processes),
/// and a count of sleepers, which tells a publisher whether to ring.
///
/// A publisher makes its data visible (a release store), then rings; a
/// waiter takes a [`Sleeper`], looks once more at what it waits for, and
/// sleeps. The ring is only a hint: the publisher reads the count of
/// sleepers without a fence (that would cost every publication, where
/// nobody sleeps most of the time), so it can miss a waiter that counted
/// itself in that instant; a sleep therefore always has a timeout, and a
/// missed ring costs at most that.
pub struct Doorbell<'a> {
    rings: &'a AtomicU32,
    sleepers: &'a AtomicU32,
}

impl Doorbell<'_> {
    /// Wakes the processes asleep on the doorbell, if any: after the
    /// release store of a publication they may wait for.
    #[inline]
    pub fn ring(&self) {
        if self.sleepers.load(Ordering::Relaxed) != 0 {
            self.wake();
        }
    }

    #[cold]
    fn wake(&self) {
        self.rings.fetch_add(1, Ordering::Release);
        sys::futex_wake(self.rings, i32::MAX);
    }

    /// Counts this process as a sleeper until the [`Sleeper`] is dropped:
    /// what it waits for must be looked at once more after this, before
    /// [`Sleeper::sleep`], so that a publication between the last look
    /// and the count is not slept through.
    pub fn sleeper(&self) -> Sleeper<'_> {
        let seen = self.rings.load(Ordering::Acquire);
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        Sleeper { bell: self, seen }
    }
}

/// A process counted as asleep on a [`Doorbell`]; see
/// [`Doorbell::sleeper`].
pub struct Sleeper<'a> {
    bell: &'a Doorbell<'a>,
    /// The count of rings when the process counted itself in: a ring
    /// since then ends the sleep at once.
    seen: u32,
}

impl Sleeper<'_> {
    /// Sleeps until the doorbell rings or `timeout` passes (or
    /// spuriously).
    pub fn sleep(self, timeout: Duration) {
        sys::futex_wait_at_most(self.bell.rings, self.seen, Some(timeout));
    }
}

impl Drop for Sleeper<'_> {
    fn drop(&mut self) {
        self.bell.sleepers.fetch_sub(1, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ring_wakes_a_sleeper_and_an_unrung_sleep_times_out() {
        let (region, _) = SharedRegion::create(4096, c"oxmpi-test").unwrap();
        let bell = region.doorbell(64).unwrap();
        let start = std::time::Instant::now();
        bell.sleeper().sleep(Duration::from_millis(20));
        assert!(start.elapsed() >= Duration::from_millis(20));
        let published = region.word(0).unwrap();
        std::thread::scope(|s| {
            s.spawn(|| {
                let sleeper = bell.sleeper();
                if published.load(Ordering::Acquire) == 0 {
                    sleeper.sleep(Duration::from_secs(20));
                }
                assert_eq!(published.load(Ordering::Acquire), 1);
            });
            // The sleeper counted itself (or the ring finds nobody and the
            // sleeper sees the word at its look).
            std::thread::sleep(Duration::from_millis(50));
            published.store(1, Ordering::Release);
            bell.ring();
        });
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the ring woke nobody"
        );
        assert!(region.doorbell(4).is_none() && region.doorbell(4096).is_none());
    }

    #[test]
    fn a_region_attached_twice_is_one_memory() {
        let (made, name) = SharedRegion::create(4096, c"oxmpi-test").unwrap();
        assert_eq!(name, RegionName::from_words(name.to_words()).unwrap());
        // This process attaches its own region as another would.
        let attached = SharedRegion::attach(&name).unwrap();
        made.stop_handover();
        assert!(SharedRegion::attach(&name).is_err());
        assert_eq!((made.len(), attached.len()), (4096, 4096));
        assert!(made.write(100, b"hello"));
        made.word(8).unwrap().store(7, Ordering::Release);
        assert_eq!(attached.word(8).unwrap().load(Ordering::Acquire), 7);
        let mut out = [0u8; 5];
        assert!(attached.read(100, &mut out));
        assert_eq!(&out, b"hello");
        assert!(!attached.write(4094, b"abc"));
        assert!(!attached.read(usize::MAX, &mut out));
        assert!(made.word(4).is_none() && made.word(4096).is_none());
    }

    #[test]
    fn a_range_binds_the_pages_whose_first_byte_it_holds() {
        use crate::numa::{page_policy, PagePolicy, Placement};
        let page = sys::page_size();
        let (made, name) = SharedRegion::create(5 * page + 100, c"oxmpi-test").unwrap();
        // Node 0 exists on every machine with NUMA support.
        let mut placement = Placement::Bind {
            nodes: vec![0],
            from: "the test",
        };
        placement.bind_pages(&made.map, page + 10..3 * page + 5, "a part");
        placement.bind_pages(&made.map, 5 * page..5 * page + 100, "the last part");
        assert!(matches!(placement, Placement::Bind { .. }), "{placement}");
        // The policy is the file's: another mapping of it sees it too.
        let attached = SharedRegion::attach(&name).unwrap();
        for region in [&made, &attached] {
            let policies: Vec<PagePolicy> = (0..6)
                .map(|p| page_policy(region.ptr(p * page, 1).unwrap()).unwrap())
                .collect();
            let bound = PagePolicy::Bind(vec![0]);
            assert_eq!(
                policies,
                [
                    PagePolicy::Default,
                    // Its first byte is before the part's.
                    PagePolicy::Default,
                    bound.clone(),
                    // Its first byte is the part's last but four.
                    bound.clone(),
                    PagePolicy::Default,
                    // The region's last page, partly past its end.
                    bound,
                ]
            );
        }
        assert_eq!(
            made.bind_to_own_nodes(0..5 * page + 101, "too much")
                .unwrap_err()
                .class(),
            oxmpi_adi::ErrorClass::Intern
        );
        assert!(page_policy(std::ptr::null()).is_err());
    }

    #[test]
    fn a_wrong_name_is_an_error() {
        let (_made, name) = SharedRegion::create(64, c"oxmpi-test").unwrap();
        let wrong_size = RegionName { len: 128, ..name };
        assert!(SharedRegion::attach(&wrong_size).is_err());
        let wrong_token = RegionName {
            token: !name.token,
            ..name
        };
        assert!(SharedRegion::attach(&wrong_token).is_err());
        assert!(RegionName::from_words([u64::from(u32::MAX), 0, 0]).is_none());
    }
}
