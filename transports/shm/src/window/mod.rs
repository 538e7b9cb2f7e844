//! The shared-memory side of one-sided communication (RMA): window memory
//! that every rank of a host reaches without the target's help, and the
//! synchronisation that passive-target RMA needs there.
//!
//! - [`WindowSegment`]: one rank's window in a shared region (module
//!   [`crate::region`]: a sealed memory file, handed over an abstract
//!   Unix socket, nothing in any file system), with its control area: the window's
//!   fair reader-writer lock ([`rwlock`]) and its region mutexes
//!   ([`regions`]). The owner makes it (`MPI_Win_allocate`,
//!   `MPI_Win_allocate_shared`), sends its [`RegionName`] to the other
//!   local ranks in an ordinary message, and they attach it.
//! - [`RemoteWindow`]: a peer's window in its own memory
//!   (`MPI_Win_create`), reached by cross-memory attach
//!   (`process_vm_readv`/`process_vm_writev`), within the range the peer
//!   advertised and never outside it.
//! - [`atomics`]: replace, no-op (fetch) and compare-and-swap as one
//!   hardware atomic per word of window memory, and which words allow
//!   them; every reduction goes under region mutexes, read, combined and
//!   written in place in one pass ([`WindowSegment::update`]).
//!
//! Every access checks its byte range against the window's size first:
//! an access outside is [`AccessError::OutOfRange`], and nothing is read
//! or written. This module knows nothing of MPI communicators, datatypes
//! or ops: the MPI layer maps them onto byte ranges and word sizes, and
//! decides what lock it holds.
//!
//! # Segment layout
//! | bytes | contents |
//! |---|---|
//! | 0..8 | magic, stored last (release) by the maker |
//! | 8..16 | the window's size in bytes |
//! | 64.. | the reader-writer lock, on its own cache line |
//! | 128.. | one 4-byte mutex per region |
//! | page-aligned.. | the window's memory |
//!
//! The data starts on a page boundary, so it is aligned for every basic
//! type and region boundaries are aligned to the largest.
//!
//! # Block layout
//! The ranks of a contiguous shared window (`MPI_Win_allocate_shared`
//! without `alloc_shared_noncontig`) share one region
//! ([`WindowSegment::create_block`]): each rank's control area (the
//! header above, up to its mutexes, 64-aligned) one after the other,
//! the first with a magic of its own ("oxmpiwb1"), then from a page
//! boundary every rank's memory, rank after rank with no gap, so that one
//! rank's last byte is followed by the next rank's first. Each rank's part is a
//! [`WindowSegment`] of its own (own size, lock and mutexes) on the one
//! mapping.
//!
//! # Placement
//! A window's memory is bound to its owner's NUMA node(s)
//! ([`WindowSegment::bind_to_own_nodes`]; module `numa` of this crate):
//! a segment's by its maker, a block part's by its rank, page by page (a
//! page is the part's that holds its first byte). Control areas are left
//! to first touch.

pub mod atomics;
pub mod copy;
pub mod regions;
mod remote;
pub mod rwlock;

pub use regions::{RegionGuard, RegionSetGuard};
pub use remote::RemoteWindow;
pub use rwlock::SharedRwLock;

use crate::region::{RegionName, SharedRegion};
use copy::{Caching, CopyPlan};
use oxmpi_adi::wait::{Idle, IdleStep, WaitPolicy};
use regions::RegionMutex;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Marks a memory file as a window segment of this layout ("oxmpiwin", 2:
/// the lock of 24 bytes, `rwlock`).
const WINDOW_MAGIC: u64 = u64::from_le_bytes(*b"oxmpiwn2");
/// Marks the first control area of a block of parts ("oxmpiwb", 2: as
/// [`WINDOW_MAGIC`]).
const BLOCK_MAGIC: u64 = u64::from_le_bytes(*b"oxmpiwb2");
/// Where the lock lies.
const LOCK_AT: usize = 64;
/// Where the region mutexes start.
const MUTEXES_AT: usize = 128;
/// The pieces of a pass from the back ([`WindowSegment::update`]): a
/// multiple of every element's size, so that pieces keep whole elements
/// and their alignment. 4 and 8 KiB measured the same on the development
/// VM (a repeated sum of 64 KiB of `u64`s 0.81-0.83x of one pass from
/// the front), 16 KiB less well (0.87x), and a piece costs the caller's
/// per-call work again (looking its reduction up).
const PASS_PIECE: usize = 8 * 1024;
/// The data's alignment in the segment.
const PAGE: usize = 4096;

/// Why an access to window memory was refused; nothing was touched.
#[derive(Debug)]
pub enum AccessError {
    /// Bytes `offset..offset + len` are not all in the window of `size`
    /// bytes.
    OutOfRange {
        /// The first byte asked for.
        offset: u64,
        /// How many.
        len: u64,
        /// The window's size.
        size: u64,
    },
    /// The words cannot be reached with atomics (see
    /// [`atomics::word_capable`]), or an operand has the wrong length.
    NotAtomic,
    /// A cross-memory copy failed: the kernel's error.
    Copy(io::Error),
}

impl std::fmt::Display for AccessError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AccessError::OutOfRange { offset, len, size } => write!(
                f,
                "{len} bytes at displacement {offset} reach outside the target window of {size} bytes"
            ),
            AccessError::NotAtomic => {
                write!(f, "the operation cannot be done with hardware atomics")
            }
            AccessError::Copy(e) => write!(f, "cross-memory copy failed: {e}"),
        }
    }
}

impl std::error::Error for AccessError {}

/// Polls `ready` as `wait` says (the one wait policy of the process,
/// `oxmpi_adi::wait`: at once, or after yielding the processor where the
/// node's ranks outnumber its cores, for the poll time `OXMPI_SPIN_US`)
/// until it holds (`true`), or until the policy says to sleep (`false`):
/// then the caller sleeps on the word it waits for (`futex`), which only
/// it knows how its releaser wakes. The window's lock and region mutexes
/// wait so; cold, as both call it only once their first try failed.
#[cold]
fn poll_until(wait: &WaitPolicy, mut ready: impl FnMut() -> bool) -> bool {
    let mut idle = Idle::new();
    loop {
        if ready() {
            return true;
        }
        match wait.step(&mut idle) {
            IdleStep::Spin => std::hint::spin_loop(),
            IdleStep::Yield => std::thread::yield_now(),
            IdleStep::Sleep => return false,
        }
    }
}

/// This process's wait policy (`oxmpi_adi::wait::WaitPolicy::from_env`,
/// as the device's), for the waits of a segment's lock and mutexes; its
/// error (a bad `OXMPI_SPIN_US`, which initialize reports first) as an
/// I/O error of making or attaching the segment.
fn wait_policy() -> io::Result<WaitPolicy> {
    WaitPolicy::from_env().map_err(setting_error)
}

/// An error of the process's settings (a bad `OXMPI_SPIN_US` or
/// `OXMPI_NUMA_NODES`, which initialize reports first where it reads
/// them) as an I/O error of making or attaching a segment.
fn setting_error(e: oxmpi_adi::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, e.to_string())
}

/// `Ok` if bytes `offset..offset + len` lie in a window of `size` bytes.
/// Inlined: on every put and get, where it is two instructions.
#[inline]
fn check_range(offset: u64, len: u64, size: u64) -> Result<(), AccessError> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(AccessError::OutOfRange { offset, len, size }),
    }
}

/// Where the parts of a segment for a window of `size` bytes lie.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Layout {
    /// Where the part's control area (header, lock, mutexes) starts.
    control_at: usize,
    regions: usize,
    region_bytes: usize,
    data_at: usize,
    total: usize,
}

impl Layout {
    fn of(size: usize) -> Option<Layout> {
        let regions = regions::region_count(size);
        let data_at = (MUTEXES_AT + 4 * regions).next_multiple_of(PAGE);
        Some(Layout {
            control_at: 0,
            regions,
            region_bytes: regions::region_bytes(size),
            data_at,
            total: data_at.checked_add(size)?,
        })
    }

    /// The layouts of the parts of a block ([module docs](self)) of
    /// `sizes` bytes, in rank order; `None` if the block's size overflows.
    fn of_block(sizes: &[usize]) -> Option<Vec<Layout>> {
        let mut control_at = 0usize;
        let mut controls = Vec::with_capacity(sizes.len());
        for &size in sizes {
            let regions = regions::region_count(size);
            controls.push((control_at, regions, regions::region_bytes(size)));
            control_at = control_at
                .checked_add(MUTEXES_AT + 4 * regions)?
                .checked_next_multiple_of(64)?;
        }
        let mut data_at = control_at.checked_next_multiple_of(PAGE)?;
        let total = sizes
            .iter()
            .try_fold(data_at, |end, &size| end.checked_add(size))?;
        Some(
            controls
                .into_iter()
                .zip(sizes)
                .map(|((control_at, regions, region_bytes), &size)| {
                    let layout = Layout {
                        control_at,
                        regions,
                        region_bytes,
                        data_at,
                        total,
                    };
                    data_at += size;
                    layout
                })
                .collect(),
        )
    }
}

/// One rank's window in shared memory, mapped by this process: see the
/// module docs.
#[derive(Debug)]
pub struct WindowSegment {
    /// The mapping, shared by the parts of a block.
    region: Arc<SharedRegion>,
    /// The window's first byte in this mapping (`layout.data_at` into
    /// `region`), kept so that a put or a get is a range check and a
    /// copy, with no look-up of the mapping.
    data: *mut u8,
    /// The first region mutex in this mapping (`MUTEXES_AT`), kept for
    /// the same reason for accumulates.
    mutexes: *const RegionMutex,
    size: usize,
    layout: Layout,
    /// How puts and gets copy, by their length (module [`copy`]).
    copies: CopyPlan,
    /// How this process waits for the lock and the region mutexes.
    wait: WaitPolicy,
}

// SAFETY: `data` and `mutexes` point into `region`'s mapping, owned by
// the segment and as shareable between threads as the region itself
// (which is `Send` and `Sync`): window memory is only reached through
// copies and atomics.
unsafe impl Send for WindowSegment {}
// SAFETY: as above.
unsafe impl Sync for WindowSegment {}

impl WindowSegment {
    /// A new segment for a window of `size` bytes, zeroed, with its lock
    /// and mutexes free, and the name to send to the ranks that will
    /// attach it. The maker must keep it until they have.
    pub fn create(size: usize) -> io::Result<(WindowSegment, RegionName)> {
        let layout = Layout::of(size).ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, "window size out of range")
        })?;
        let wait = wait_policy()?;
        let (region, name) = SharedRegion::create(layout.total, c"oxmpi-window")?;
        let word = |at| region.word(at).expect("the header lies in the region");
        word(8).store(size as u64, Ordering::Relaxed);
        word(0).store(WINDOW_MAGIC, Ordering::Release);
        let segment = WindowSegment::new(Arc::new(region), size, layout, wait);
        // The maker is the owner: its part is placed before the name is
        // out.
        segment.bind_to_own_nodes()?;
        Ok((segment, name))
    }

    /// The parts of a new block ([module docs](self)) of `sizes[r]` bytes
    /// for rank r, zeroed, with their locks and mutexes free, in one
    /// mapping, and the block's name to send to the ranks that will
    /// attach it ([`WindowSegment::attach_block`]). The maker must keep
    /// it until they have.
    pub fn create_block(sizes: &[usize]) -> io::Result<(Vec<WindowSegment>, RegionName)> {
        let layouts = Layout::of_block(sizes).ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, "window sizes out of range")
        })?;
        let wait = wait_policy()?;
        let total = layouts.first().map_or(1, |layout| layout.total);
        let (region, name) = SharedRegion::create(total, c"oxmpi-window-block")?;
        let word = |at| region.word(at).expect("the header lies in the region");
        for (layout, &size) in layouts.iter().zip(sizes) {
            word(layout.control_at + 8).store(size as u64, Ordering::Relaxed);
        }
        word(0).store(BLOCK_MAGIC, Ordering::Release);
        Ok((
            WindowSegment::parts(Arc::new(region), sizes, layouts, wait),
            name,
        ))
    }

    /// Attaches the block another local rank made and named `name`
    /// ([`WindowSegment::create_block`]), after checking that it is a
    /// block whose parts have the sizes `sizes`, in rank order.
    pub fn attach_block(name: &RegionName, sizes: &[usize]) -> io::Result<Vec<WindowSegment>> {
        let wait = wait_policy()?;
        let region = SharedRegion::attach(name)?;
        let word = |at| region.word(at).map(|w| w.load(Ordering::Acquire));
        let layouts = Layout::of_block(sizes).filter(|layouts| {
            word(0) == Some(BLOCK_MAGIC)
                && layouts.first().map_or(1, |layout| layout.total) == region.len()
                && layouts
                    .iter()
                    .zip(sizes)
                    .all(|(layout, &size)| word(layout.control_at + 8) == Some(size as u64))
        });
        match layouts {
            Some(layouts) => Ok(WindowSegment::parts(Arc::new(region), sizes, layouts, wait)),
            None => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "the region of process {} is not a block of window parts of {sizes:?} bytes",
                    name.pid
                ),
            )),
        }
    }

    /// The parts of the block `region`, laid out as `layouts`, whose waits
    /// follow `wait`.
    fn parts(
        region: Arc<SharedRegion>,
        sizes: &[usize],
        layouts: Vec<Layout>,
        wait: WaitPolicy,
    ) -> Vec<WindowSegment> {
        layouts
            .into_iter()
            .zip(sizes)
            .map(|(layout, &size)| WindowSegment::new(region.clone(), size, layout, wait))
            .collect()
    }

    /// The segment of `region`, laid out as `layout` for `size` bytes,
    /// whose waits follow `wait`.
    fn new(
        region: Arc<SharedRegion>,
        size: usize,
        layout: Layout,
        wait: WaitPolicy,
    ) -> WindowSegment {
        let data = region
            .ptr(layout.data_at, size)
            .expect("the layout's data lies in the region");
        let mutexes = region
            .ptr(layout.control_at + MUTEXES_AT, 4 * layout.regions)
            .expect("the layout's mutexes lie in the region")
            .cast::<RegionMutex>();
        WindowSegment {
            region,
            data,
            mutexes,
            size,
            layout,
            copies: CopyPlan::this_machine(),
            wait,
        }
    }

    /// Attaches the segment another local rank made and named `name`,
    /// after checking that it is a window segment whose size agrees with
    /// its layout.
    pub fn attach(name: &RegionName) -> io::Result<WindowSegment> {
        let wait = wait_policy()?;
        let region = SharedRegion::attach(name)?;
        let invalid = |what: String| io::Error::new(io::ErrorKind::InvalidData, what);
        let word = |at| region.word(at).map(|w| w.load(Ordering::Acquire));
        if word(0) != Some(WINDOW_MAGIC) {
            return Err(invalid(format!(
                "the region of process {} is not a window segment",
                name.pid
            )));
        }
        let size = word(8).unwrap_or(u64::MAX);
        let layout = usize::try_from(size).ok().and_then(Layout::of);
        match layout {
            Some(layout) if layout.total == region.len() => {
                Ok(WindowSegment::new(Arc::new(region), size as usize, layout, wait))
            }
            _ => Err(invalid(format!(
                "the window segment of process {} says {size} bytes, which its {} bytes do not hold",
                name.pid,
                region.len()
            ))),
        }
    }

    /// Stops handing the segment (or the block of this part) over to
    /// other processes ([`SharedRegion::stop_handover`]): for its maker,
    /// once every rank that maps it has.
    pub fn stop_handover(&self) {
        self.region.stop_handover();
    }

    /// Binds this window's (or part's) memory to this process's NUMA
    /// nodes, where its placement binds: the pages whose first byte lies
    /// in it (module `numa` of this crate). For its owner to call, before
    /// anyone stores into it: [`WindowSegment::create`] does for its
    /// maker; in a block ([`WindowSegment::create_block`]) each rank does
    /// for its own part once it has the block. A kernel that refuses
    /// leaves it to first touch (said under `OXMPI_VERBOSE=1`); an error
    /// only where `OXMPI_NUMA_NODES` is not a list of nodes.
    pub fn bind_to_own_nodes(&self) -> io::Result<()> {
        let data = self.layout.data_at;
        self.region
            .bind_to_own_nodes(
                data..data + self.size,
                format_args!("a window part of {} bytes", self.size),
            )
            .map_err(setting_error)
    }

    /// The window's size in bytes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The window's memory in this process (page-aligned, but for the
    /// parts of a block after the first, which start right after the
    /// previous part's last byte): the base the
    /// owner hands to its user, and that `MPI_Win_shared_query` returns
    /// for this window to the other local ranks. Other processes write it
    /// at any time: it may be reached through raw pointers and atomics,
    /// never through references to plain data.
    pub fn base(&self) -> *mut u8 {
        self.data
    }

    /// How this process waits for the window's lock (to pass to
    /// [`SharedRwLock::lock_shared`] and [`SharedRwLock::lock_exclusive`])
    /// and region mutexes: the one wait policy (`oxmpi_adi::wait`).
    pub fn wait_policy(&self) -> &WaitPolicy {
        &self.wait
    }

    /// The window's passive-target lock.
    pub fn lock(&self) -> &SharedRwLock {
        let at = self
            .region
            .ptr(self.layout.control_at + LOCK_AT, rwlock::RWLOCK_BYTES)
            .expect("the lock lies in the region");
        // SAFETY: the lock's bytes lie in the mapping (above), 64-aligned,
        // zeroed at creation (a free lock), and only ever accessed through
        // the lock's atomics; the reference lives no longer than `self`.
        unsafe { &*at.cast::<SharedRwLock>() }
    }

    #[inline]
    fn mutexes(&self) -> &[RegionMutex] {
        // SAFETY: the mutex words lie in the mapping (checked when the
        // segment was made), 4-aligned, zeroed at creation (free), and
        // only ever accessed atomically; the slice lives no longer than
        // `self`.
        unsafe { std::slice::from_raw_parts(self.mutexes, self.layout.regions) }
    }

    /// Locks the region mutexes of bytes `offset..offset + len` of the
    /// window, each once, in address order (module [`regions`]); they are
    /// released when the guard drops. Inlined, as the mutexes' fast
    /// paths.
    #[inline]
    pub fn lock_regions(&self, offset: usize, len: usize) -> Result<RegionGuard<'_>, AccessError> {
        check_range(offset as u64, len as u64, self.size as u64)?;
        self.hold_regions(offset, len)
    }

    /// Locks the region mutexes of the bytes of every span (offset,
    /// length) of the window, each region once, in address order
    /// ([`RegionSetGuard`]): an operation on several spans takes them
    /// once for all; they are released when the guard drops. A span
    /// outside the window is refused, with nothing locked.
    pub fn lock_region_set(
        &self,
        spans: impl IntoIterator<Item = (usize, usize)>,
    ) -> Result<RegionSetGuard<'_>, AccessError> {
        // Spans in the window never reach past the last region
        // (`Layout::of`): one pass checks both.
        RegionSetGuard::lock(
            self.mutexes(),
            self.layout.region_bytes,
            self.size,
            spans,
            &self.wait,
        )
        .map_err(|(offset, len)| AccessError::OutOfRange {
            offset: offset as u64,
            len: len as u64,
            size: self.size as u64,
        })
    }

    /// Takes the region mutexes of bytes `offset..offset + len`, waiting
    /// as the segment's policy says; a span past the last region (which a
    /// range checked against the window's size never is: `Layout::of`) is
    /// refused as out of range. Always inlined, as the mutexes' fast
    /// paths.
    #[inline(always)]
    fn hold_regions(&self, offset: usize, len: usize) -> Result<RegionGuard<'_>, AccessError> {
        RegionGuard::lock(
            self.mutexes(),
            self.layout.region_bytes,
            offset,
            len,
            &self.wait,
        )
        .ok_or(AccessError::OutOfRange {
            offset: offset as u64,
            len: len as u64,
            size: self.size as u64,
        })
    }

    /// [`WindowSegment::lock_regions`] and [`WindowSegment::span`] in one,
    /// with one range check: the bytes `offset..offset + len` with their
    /// region mutexes held, to update in place while the guard lives (an
    /// accumulate of a span that is never turned round). Always inlined,
    /// as the mutexes' fast paths: the MPI layer's fetch-and-op inlines
    /// the whole of its way (`oxmpi::rma::direct`).
    #[inline(always)]
    pub fn lock_span(
        &self,
        offset: usize,
        len: usize,
    ) -> Result<(RegionGuard<'_>, *mut [u8]), AccessError> {
        let bytes = self.span(offset, len)?;
        Ok((self.hold_regions(offset, len)?, bytes))
    }

    /// Copies `data` into the window at `offset`. Inlined, as
    /// [`WindowSegment::read`]: a put of a few bytes is then this range
    /// check and the copy in the caller.
    #[inline]
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<(), AccessError> {
        self.write_by(offset, data, Caching::Cached)
    }

    /// [`WindowSegment::write`], counted in this thread's epoch of puts
    /// and gets or not, as `caching` says (module [`copy`]).
    #[inline]
    pub fn write_by(
        &self,
        offset: usize,
        data: &[u8],
        caching: Caching,
    ) -> Result<(), AccessError> {
        check_range(offset as u64, data.len() as u64, self.size as u64)?;
        // SAFETY: the destination lies in the window (checked), in the
        // mapping, which lives as long as `self`. It cannot overlap
        // `data`: window memory is never handed out as a Rust slice, only
        // as raw pointers and copies (module docs), so a slice that
        // reached it would have been made by unsafe code that broke that
        // rule, not by this crate's callers.
        unsafe {
            self.copies
                .copy(caching, data.as_ptr(), self.data.add(offset), data.len())
        };
        Ok(())
    }

    /// Copies the window's bytes at `offset` into `out`.
    #[inline]
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), AccessError> {
        self.read_by(offset, out, Caching::Cached)
    }

    /// [`WindowSegment::read`], counted in this thread's epoch of puts
    /// and gets or not, as `caching` says (module [`copy`]).
    #[inline]
    pub fn read_by(
        &self,
        offset: usize,
        out: &mut [u8],
        caching: Caching,
    ) -> Result<(), AccessError> {
        check_range(offset as u64, out.len() as u64, self.size as u64)?;
        // SAFETY: the source lies in the window (checked), in the mapping,
        // which lives as long as `self`. It cannot overlap `out`, an
        // exclusive slice, for the reason given in `write_by`: window
        // memory is reached only through raw pointers and copies.
        unsafe {
            self.copies
                .copy(caching, self.data.add(offset), out.as_mut_ptr(), out.len())
        };
        Ok(())
    }

    /// Whether words of `size` bytes at `offset` can be reached with
    /// atomics ([`atomics::word_capable`]).
    pub fn word_capable(&self, offset: usize, size: usize) -> bool {
        atomics::word_capable(size, self.layout.data_at + offset)
    }

    /// Replaces the `size`-byte words at `offset` with those of `new` and
    /// fetches the words from before into `old`, each of the two if
    /// given, one atomic instruction per word (`atomics::exchange`):
    /// no region mutex is needed.
    pub fn exchange(
        &self,
        offset: usize,
        size: usize,
        new: Option<&[u8]>,
        old: Option<&mut [u8]>,
    ) -> Result<(), AccessError> {
        let len = match (new, old.as_deref()) {
            (Some(new), Some(old)) if new.len() != old.len() => return Err(AccessError::NotAtomic),
            (Some(bytes), _) | (None, Some(bytes)) => bytes.len(),
            (None, None) => 0,
        };
        check_range(offset as u64, len as u64, self.size as u64)?;
        if !self.word_capable(offset, size) || len & (size - 1) != 0 {
            return Err(AccessError::NotAtomic);
        }
        let at = self.base().wrapping_add(offset);
        // SAFETY: the words lie in the window (checked), aligned to their
        // size, a word size (checked); window memory is reached only
        // through atomics, byte copies and whole-element stores under the
        // region mutexes.
        unsafe { atomics::exchange(at, size, new, old) };
        Ok(())
    }

    /// Bytes `offset..offset + len` of the window, to read and write in
    /// place once their region mutexes are held: an accumulate's
    /// read-modify-write of a span that is never turned round
    /// ([`WindowSegment::pass_may_turn`]; [`WindowSegment::update`] for
    /// any span). Inlined: a range
    /// check and a pointer, which may be made a slice under the rules of
    /// [`WindowSegment::update`].
    #[inline]
    pub fn span(&self, offset: usize, len: usize) -> Result<*mut [u8], AccessError> {
        check_range(offset as u64, len as u64, self.size as u64)?;
        Ok(std::ptr::slice_from_raw_parts_mut(
            self.base().wrapping_add(offset),
            len,
        ))
    }

    /// Whether an accumulate's pass of `len` bytes may run from the back
    /// ([`WindowSegment::update`]); any other is one pass from the front,
    /// which the caller may run on [`WindowSegment::span`] itself.
    #[inline]
    pub fn pass_may_turn(&self, len: usize) -> bool {
        self.copies.turns_at(len)
    }

    /// The length from which an accumulate's pass may run from the back
    /// ([`WindowSegment::pass_may_turn`]): every shorter pass is one pass
    /// from the front, which the caller may run on the window's bytes
    /// itself.
    pub fn turns_from(&self) -> usize {
        self.copies.turns_from()
    }

    /// Runs `update` on bytes `offset..offset + len` of the window in
    /// place, given with their offset in the span: an accumulate's
    /// read-modify-write, combining `source` (the origin's data, only
    /// its address is used) into the window. In one pass from the front,
    /// the whole span at once; or, where the pass repeats this thread's
    /// previous one over the same bytes and source, which ran from the
    /// front, in pieces of `PASS_PIECE` (8 KiB) from the back
    /// ([`CopyPlan::from_the_back`]: it then starts among the lines that
    /// pass touched last, still cached). The first error of `update`
    /// ends the pass and is returned.
    ///
    /// # Safety
    /// While `update` runs no other process may write these bytes, nor
    /// read them otherwise than with atomic loads: the caller holds their
    /// region mutexes ([`WindowSegment::lock_regions`]), or the window's
    /// exclusive lock, and every origin follows the module's rules.
    pub unsafe fn update<E>(
        &self,
        offset: usize,
        len: usize,
        source: *const u8,
        mut update: impl FnMut(usize, &mut [u8]) -> Result<(), E>,
    ) -> Result<Result<(), E>, AccessError> {
        // SAFETY: the bytes lie in the window (`span` checked), in the
        // mapping, which outlives the call; nobody else writes or plainly
        // reads them meanwhile (the caller's guarantee), so the slice is
        // this call's alone.
        let span = unsafe { &mut *self.span(offset, len)? };
        // The first piece's start: the whole span's (0), or the last
        // piece's (a power of two: a mask). One call of `update` in the
        // code, so that it is inlined here (with a call for the whole span
        // and another for the pieces it stayed a function of its own).
        let mut from = if self.copies.from_the_back(source, span.as_ptr(), len) {
            (len - 1) & !(PASS_PIECE - 1)
        } else {
            0
        };
        let mut end = len;
        loop {
            if let Err(e) = update(from, &mut span[from..end]) {
                return Ok(Err(e));
            }
            if from == 0 {
                return Ok(Ok(()));
            }
            end = from;
            from -= PASS_PIECE;
        }
    }

    /// Compares the `compare.len()`-byte word at `offset` (1, 2, 4 or 8
    /// bytes, aligned) with `compare` and stores `new` if they are equal,
    /// atomically; the old value goes to `old`.
    pub fn compare_and_swap(
        &self,
        offset: usize,
        compare: &[u8],
        new: &[u8],
        old: &mut [u8],
    ) -> Result<(), AccessError> {
        let size = compare.len();
        check_range(offset as u64, size as u64, self.size as u64)?;
        if !self.word_capable(offset, size) || new.len() != size || old.len() != size {
            return Err(AccessError::NotAtomic);
        }
        let at = self.base().wrapping_add(offset);
        // SAFETY: the word lies in the window (checked) and is aligned to
        // its size, 1, 2, 4 or 8 (checked); window memory is reached only
        // through atomics, byte copies and whole-element stores under the
        // region mutexes; the operands have its size.
        unsafe { atomics::compare_and_swap(at, size, compare, new, old) };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::forked;
    use std::time::Duration;

    #[test]
    fn an_attached_segment_is_the_same_window_and_checks_every_range() {
        let (made, name) = WindowSegment::create(1000).unwrap();
        let peer = WindowSegment::attach(&name).unwrap();
        assert_eq!((made.size(), peer.size()), (1000, 1000));
        assert_eq!(made.base() as usize % PAGE, 0);
        made.write(992, &7u64.to_ne_bytes()).unwrap();
        let mut out = [0u8; 8];
        peer.read(992, &mut out).unwrap();
        assert_eq!(u64::from_ne_bytes(out), 7);
        let mut old = [0u8; 8];
        peer.exchange(992, 8, Some(&12u64.to_ne_bytes()), Some(&mut old))
            .unwrap();
        assert_eq!(u64::from_ne_bytes(old), 7);
        peer.compare_and_swap(992, &12u64.to_ne_bytes(), &1u64.to_ne_bytes(), &mut old)
            .unwrap();
        made.read(992, &mut out).unwrap();
        assert_eq!((u64::from_ne_bytes(old), u64::from_ne_bytes(out)), (12, 1));
        // Outside the window: refused, nothing touched.
        assert!(matches!(
            peer.write(993, &[1; 8]),
            Err(AccessError::OutOfRange {
                offset: 993,
                len: 8,
                size: 1000
            })
        ));
        assert!(peer.read(usize::MAX, &mut out).is_err());
        assert!(peer.exchange(1000, 1, Some(&[1]), None).is_err());
        assert!(peer.lock_regions(999, 2).is_err());
        // SAFETY: a span outside the window is refused before anything.
        let refused = unsafe { peer.update(999, 2, std::ptr::null(), |_, _| Ok::<_, ()>(())) };
        assert!(refused.is_err());
        assert!(matches!(
            peer.exchange(993, 4, Some(&[1; 4]), None),
            Err(AccessError::NotAtomic)
        ));
        assert!(matches!(
            peer.exchange(992, 4, Some(&[1; 8]), Some(&mut [0; 4])),
            Err(AccessError::NotAtomic)
        ));
        assert!(peer
            .compare_and_swap(0, &[0; 3], &[0; 3], &mut [0; 3])
            .is_err());
        made.read(992, &mut out).unwrap();
        assert_eq!(u64::from_ne_bytes(out), 1);
        // The lock and mutexes are shared too.
        made.lock().lock_exclusive(made.wait_policy());
        peer.lock().unlock_exclusive();
        // One region: a page covers the window.
        assert_eq!(peer.lock_regions(0, 1000).unwrap().regions(), 1);
    }

    #[test]
    fn the_parts_of_a_block_follow_each_other_with_their_own_locks() {
        let sizes = [12, 0, 5000, 3];
        let (made, name) = WindowSegment::create_block(&sizes).unwrap();
        let attached = WindowSegment::attach_block(&name, &sizes).unwrap();
        for parts in [&made, &attached] {
            assert_eq!(parts[0].base() as usize % PAGE, 0);
            for r in 1..sizes.len() {
                assert_eq!(
                    parts[r].base() as usize,
                    parts[r - 1].base() as usize + sizes[r - 1]
                );
                assert_eq!(parts[r].size(), sizes[r]);
            }
        }
        // Bytes of part 2 are bytes of the same memory in the other
        // mapping, and a part's range ends at its own size.
        made[2].write(4992, &9u64.to_ne_bytes()).unwrap();
        let mut out = [0u8; 8];
        attached[2].read(4992, &mut out).unwrap();
        assert_eq!(u64::from_ne_bytes(out), 9);
        assert!(attached[3].write(0, &[1; 4]).is_err());
        // Each part has its own lock: holding part 0's exclusively leaves
        // part 2's free.
        made[0].lock().lock_exclusive(made[0].wait_policy());
        attached[2].lock().lock_exclusive(attached[2].wait_policy());
        attached[0].lock().unlock_exclusive();
        made[2].lock().unlock_exclusive();
        // Other sizes, or a plain segment's name, are refused.
        assert!(WindowSegment::attach_block(&name, &[12, 0, 5000, 4]).is_err());
        assert!(WindowSegment::attach_block(&name, &[12, 0, 5000]).is_err());
        assert!(WindowSegment::attach(&name).is_err());
        let (_plain, plain) = WindowSegment::create(10).unwrap();
        assert!(WindowSegment::attach_block(&plain, &[10]).is_err());
    }

    #[test]
    fn a_region_that_is_no_window_segment_is_refused() {
        let (_region, name) = SharedRegion::create(8192, c"oxmpi-test").unwrap();
        assert!(WindowSegment::attach(&name).is_err());
        let (made, name) = WindowSegment::create(10).unwrap();
        made.region
            .word(8)
            .unwrap()
            .store(1 << 40, Ordering::Relaxed);
        assert!(WindowSegment::attach(&name).is_err());
        let (_empty, name) = WindowSegment::create(0).unwrap();
        assert_eq!(WindowSegment::attach(&name).unwrap().size(), 0);
    }

    /// Processes add to one element under its region mutex (a
    /// read-modify-write in place), to another with compare-and-swap
    /// loops, and fetch the first with atomic loads meanwhile: the totals
    /// are exact and no fetch sees a value going backwards.
    #[test]
    fn processes_updating_elements_atomically_lose_nothing() {
        const PROCS: usize = 4;
        const ROUNDS: u64 = 20_000;
        let (window, _) = WindowSegment::create(64).unwrap();
        let pids: Vec<_> = (0..PROCS)
            .map(|_| {
                let window = &window;
                forked::spawn(move || {
                    let mut last = 0u64;
                    for _ in 0..ROUNDS {
                        let Ok(_regions) = window.lock_regions(0, 8) else {
                            return 1;
                        };
                        // SAFETY: this process holds the region mutex of
                        // the bytes; the others only load them atomically.
                        let added = unsafe {
                            window.update(0, 8, std::ptr::null(), |_, bytes| {
                                let v = u64::from_ne_bytes(bytes.try_into().unwrap_or([0; 8]));
                                bytes.copy_from_slice(&(v + 1).to_ne_bytes());
                                Ok::<_, ()>(())
                            })
                        };
                        drop(_regions);
                        let mut seen = [0u8; 8];
                        if !matches!(added, Ok(Ok(())))
                            || window.exchange(0, 8, None, Some(&mut seen)).is_err()
                        {
                            return 1;
                        }
                        let now = u64::from_ne_bytes(seen);
                        if now < last {
                            return 2;
                        }
                        last = now;
                        // A compare-and-swap increment of a 4-byte counter.
                        let mut seen = [0u8; 4];
                        let mut ok_cas = window.read(16, &mut seen).is_ok();
                        loop {
                            let next = (u32::from_ne_bytes(seen) + 1).to_ne_bytes();
                            let mut old = [0u8; 4];
                            ok_cas &= window.compare_and_swap(16, &seen, &next, &mut old).is_ok();
                            if old == seen || !ok_cas {
                                break;
                            }
                            seen = old;
                        }
                        if !ok_cas {
                            return 1;
                        }
                    }
                    0
                })
            })
            .collect();
        let codes = forked::reap(&pids, Duration::from_secs(60));
        assert_eq!(codes, vec![Some(0); PROCS]);
        let mut out = [0u8; 8];
        window.read(0, &mut out).unwrap();
        assert_eq!(u64::from_ne_bytes(out), PROCS as u64 * ROUNDS);
        let mut counter = [0u8; 4];
        window.read(16, &mut counter).unwrap();
        assert_eq!(u32::from_ne_bytes(counter) as u64, PROCS as u64 * ROUNDS);
    }

    /// An accumulate's pass over the same bytes with the same source again
    /// runs from the back in pieces where the plan turns at its length;
    /// every pass sees each byte once, and the sums come out right.
    #[test]
    fn a_repeated_pass_runs_from_the_back_in_pieces() {
        const LEN: usize = 64 * 1024;
        let (window, _) = WindowSegment::create(LEN + 8).unwrap();
        let ones = vec![1u64; LEN / 8];
        let mut passes = Vec::new();
        for _ in 0..3 {
            let mut pieces = Vec::new();
            // SAFETY: nobody else reaches this process's own window.
            let updated = unsafe {
                window.update(8, LEN, ones.as_ptr().cast(), |from, bytes: &mut [u8]| {
                    pieces.push((from, bytes.len()));
                    for (word, one) in bytes.chunks_exact_mut(8).zip(&ones[from / 8..]) {
                        let v = u64::from_ne_bytes(word.try_into().unwrap());
                        word.copy_from_slice(&(v + one).to_ne_bytes());
                    }
                    Ok::<_, ()>(())
                })
            };
            assert!(matches!(updated, Ok(Ok(()))));
            passes.push(pieces);
        }
        let whole = vec![(0, LEN)];
        let from_the_back: Vec<_> = (0..LEN / PASS_PIECE)
            .rev()
            .map(|piece| (piece * PASS_PIECE, PASS_PIECE))
            .collect();
        let turned = if window.copies.turns_at(LEN) {
            &from_the_back
        } else {
            &whole
        };
        assert_eq!(passes, [whole.clone(), turned.clone(), whole]);
        let mut sums = vec![0u8; LEN];
        window.read(8, &mut sums).unwrap();
        assert!(sums
            .chunks_exact(8)
            .all(|word| u64::from_ne_bytes(word.try_into().unwrap()) == 3));
    }
}
