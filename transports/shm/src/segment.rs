//! A queue segment: an anonymous memory file (memfd) laid out as
//! [`crate::proto`] describes, created by the producer and opened, after a
//! check of its seals, size, version and layout, by the consumer.
//!
//! A segment has no name in any file system: it is reachable only through
//! a descriptor, which the producer hands to the one peer it authenticated.
//! It disappears when the last descriptor and mapping of it go, however the
//! processes end (SIGKILL included). Its size is sealed before it is
//! handed over, so neither side can shrink it under the other.
//!
//! The rest of the crate reaches a segment's memory only through this
//! module: the shared fields as atomics, and the cells by bounds-checked
//! byte copies.

use crate::proto::{
    SegmentLayout, BARRIERS_AGREED_OFFSET, CELL, CELLS_OFFSET, CONSUMER_SLEEPING_OFFSET,
    HEAD_OFFSET, PRODUCER_BARRIERS_OFFSET, PRODUCER_WAITING_OFFSET, SEGMENT_MAGIC, SHM_VERSION,
};
use crate::sys;
use memmap2::MmapMut;
use oxmpi_adi::vlog;
use std::ffi::CString;
use std::fmt;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicU32, AtomicU64};

/// Why a segment could not be made, or a peer's segment was refused.
#[derive(Debug)]
pub(crate) enum SegmentError {
    /// An OS call failed: what was being done, and the error.
    Os(&'static str, io::Error),
    /// The peer's segment can still shrink (its size is not sealed).
    NotSealed,
    /// The segment is too small for its header, or its size disagrees with
    /// its layout.
    Size(u64),
    /// The segment does not start with [`SEGMENT_MAGIC`].
    Magic,
    /// The peer made the segment with another version.
    Version {
        /// The peer's version.
        theirs: u32,
    },
    /// The layout (cell size, cell count, where the cells start) is not
    /// one this version uses.
    Layout(SegmentLayout),
    /// The segment names another producer or consumer.
    Ranks {
        /// The producer it names.
        producer: u32,
        /// The consumer it names.
        consumer: u32,
    },
}

impl fmt::Display for SegmentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SegmentError::Os(what, e) => write!(f, "{what}: {e}"),
            SegmentError::NotSealed => {
                write!(f, "its shared-memory segment's size is not sealed")
            }
            SegmentError::Size(n) => write!(
                f,
                "its shared-memory segment has {n} bytes, which does not fit its layout"
            ),
            SegmentError::Magic => write!(f, "its descriptor is not an oxmpi queue segment"),
            SegmentError::Version { theirs } => write!(
                f,
                "its shared-memory segment has version {theirs}, this rank speaks \
                 {SHM_VERSION}: run the same oxmpi on every rank"
            ),
            SegmentError::Layout(l) => write!(
                f,
                "its shared-memory segment has an unknown layout ({} cells of {} bytes from \
                 offset {})",
                l.cell_count, l.cell_size, l.cells_offset
            ),
            SegmentError::Ranks { producer, consumer } => write!(
                f,
                "its shared-memory segment is the queue from rank {producer} to rank {consumer}"
            ),
        }
    }
}

/// A mapped queue segment.
pub(crate) struct Segment {
    map: MmapMut,
    /// The memory file, kept to hand its descriptor to the consumer.
    file: File,
    /// Number of cells (a power of two).
    cells: u64,
}

impl Segment {
    /// Creates the segment of a queue from `producer` to `consumer` with
    /// `cells` cells (a power of two), zero-filled, size sealed. It shows
    /// in `/proc/PID/maps` as `/memfd:oxmpi-shm-PID-PRODUCER-to-CONSUMER`.
    pub(crate) fn create(
        producer: u32,
        consumer: u32,
        cells: u64,
    ) -> Result<Segment, SegmentError> {
        debug_assert!(cells.is_power_of_two());
        let pid = std::process::id();
        let label =
            CString::new(format!("oxmpi-shm-{pid}-{producer}-to-{consumer}")).map_err(|_| {
                SegmentError::Os("naming the segment", io::ErrorKind::InvalidInput.into())
            })?;
        let file = sys::memfd(&label).map_err(|e| SegmentError::Os("creating a memory file", e))?;
        file.set_len(CELLS_OFFSET as u64 + cells * CELL as u64)
            .map_err(|e| SegmentError::Os("sizing the shared segment", e))?;
        sys::seal_size(&file).map_err(|e| SegmentError::Os("sealing the shared segment", e))?;
        // Not populated: the consumer's pages are allocated under its
        // policy when it places them (`place_on_own_nodes`); only the
        // first, where the layout goes, is allocated here (and replaced
        // by the consumer's then).
        let mut map =
            sys::map(&file).map_err(|e| SegmentError::Os("mapping the shared segment", e))?;
        let layout = SegmentLayout {
            magic: SEGMENT_MAGIC,
            version: SHM_VERSION,
            cells_offset: CELLS_OFFSET as u32,
            cell_size: CELL as u32,
            cell_count: cells as u32,
            producer,
            consumer,
        };
        // SAFETY: the mapping is page-aligned and larger than the layout;
        // no other process has the segment yet (its descriptor has not been
        // handed over), so nothing races this write.
        unsafe { std::ptr::write(map.as_mut_ptr().cast::<SegmentLayout>(), layout) };
        Ok(Segment { map, file, cells })
    }

    /// Opens a peer's segment, received as `file`, as the queue from
    /// `producer` to `consumer`: checks the seals, the size, the magic, the
    /// version, the layout and the ranks before anything else is read.
    pub(crate) fn open(file: File, producer: u32, consumer: u32) -> Result<Segment, SegmentError> {
        let sealed = sys::size_is_sealed(&file).map_err(|e| match e.raw_os_error() {
            // Not a memory file at all (no seals to read).
            Some(libc::EINVAL) => SegmentError::Magic,
            _ => SegmentError::Os("reading the segment's seals", e),
        })?;
        if !sealed {
            return Err(SegmentError::NotSealed);
        }
        let size = file
            .metadata()
            .map_err(|e| SegmentError::Os("reading the segment's size", e))?
            .len();
        if size < CELLS_OFFSET as u64 {
            return Err(SegmentError::Size(size));
        }
        let map = sys::map(&file).map_err(|e| SegmentError::Os("mapping the peer's segment", e))?;
        // SAFETY: the mapping is page-aligned and at least CELLS_OFFSET
        // bytes long (checked), so the layout lies inside it; it is copied
        // out with a volatile read, as the peer could be writing it, and
        // every field is checked before use.
        let layout = unsafe { std::ptr::read_volatile(map.as_ptr().cast::<SegmentLayout>()) };
        if layout.magic != SEGMENT_MAGIC {
            return Err(SegmentError::Magic);
        }
        if layout.version != SHM_VERSION {
            return Err(SegmentError::Version {
                theirs: layout.version,
            });
        }
        let cells = u64::from(layout.cell_count);
        if layout.cells_offset as usize != CELLS_OFFSET
            || layout.cell_size as usize != CELL
            || !cells.is_power_of_two()
            || cells < 4
        {
            return Err(SegmentError::Layout(layout));
        }
        if size != CELLS_OFFSET as u64 + cells * CELL as u64 {
            return Err(SegmentError::Size(size));
        }
        if (layout.producer, layout.consumer) != (producer, consumer) {
            return Err(SegmentError::Ranks {
                producer: layout.producer,
                consumer: layout.consumer,
            });
        }
        Ok(Segment { map, file, cells })
    }

    /// The consumer's side of placing the segment (see `crate::numa`):
    /// binds its pages to this process's NUMA nodes, where it binds, and
    /// only then has every page allocated, so all of them lie on those
    /// nodes. The first page was allocated already, by the producer when
    /// it wrote the layout, on its own node: its bytes are saved, the page
    /// is freed, every page is faulted in, and the bytes are written back
    /// into the new first page. To call before the VERDICT that accepts
    /// the queue: the producer touches the segment again only once it has
    /// it. `what` names the segment where the kernel refuses to bind (then
    /// first touch: this process's nodes all the same) or to free the
    /// first page (which then stays where it is): said under
    /// `OXMPI_VERBOSE=1`, never an error. An error where
    /// `OXMPI_NUMA_NODES` is not a list of nodes or the pages cannot be
    /// allocated.
    pub(crate) fn place_on_own_nodes(&mut self, what: impl fmt::Display) -> oxmpi_adi::Result<()> {
        self.place_by(
            |map| crate::numa::bind_pages(map, 0..map.len(), &what),
            sys::populate,
            &what,
        )
    }

    /// [`Segment::place_on_own_nodes`] with the binding done by `bind`
    /// and the pages faulted in by `populate`: the order of the steps is
    /// what places the pages.
    fn place_by(
        &mut self,
        bind: impl FnOnce(&MmapMut) -> oxmpi_adi::Result<()>,
        populate: impl FnOnce(&MmapMut) -> io::Result<()>,
        what: &dyn fmt::Display,
    ) -> oxmpi_adi::Result<()> {
        bind(&self.map)?;
        let page = sys::page_size();
        let mut first = vec![0u8; page.min(self.map.len())];
        // SAFETY: the mapping is at least `first.len()` bytes long, and
        // the copy goes through raw pointers (see `sys`); the producer
        // writes nothing until the VERDICT.
        unsafe {
            std::ptr::copy_nonoverlapping(self.map.as_ptr(), first.as_mut_ptr(), first.len())
        };
        // Not migrated (`mbind`'s `MPOL_MF_MOVE` leaves a page another
        // process maps where it is): replaced.
        if let Err(e) = sys::release_pages(&self.file, 0..page) {
            // Not worth refusing the queue for: placement is never an
            // error.
            vlog!(
                "shm: the first page of {what} stays on the producer's NUMA node: the kernel \
                 refused to free it ({e})"
            );
        }
        populate(&self.map).map_err(|e| {
            oxmpi_adi::Error::os("faulting in the pages of a shared-memory queue", e)
        })?;
        // SAFETY: as above, the other way.
        unsafe {
            std::ptr::copy_nonoverlapping(first.as_ptr(), self.map.as_mut_ptr(), first.len())
        };
        Ok(())
    }

    /// Faults every page of the segment in ([`sys::populate`]): the
    /// consumer's pages, once placed, or (at the producer, once the
    /// consumer accepted) the producer's page tables for them, so that
    /// the first lap of the queue pays no page fault at either end.
    pub(crate) fn populate(&self) -> io::Result<()> {
        sys::populate(&self.map)
    }

    /// The segment's descriptor, to hand to the consumer.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    /// Number of cells.
    // Inline: on the path of every message.
    #[inline(always)]
    pub(crate) fn cells(&self) -> u64 {
        self.cells
    }

    // Inline: on the path of every message.
    #[inline(always)]
    fn atomic_at<T>(&self, offset: usize) -> &T {
        debug_assert!(offset + std::mem::size_of::<T>() <= CELLS_OFFSET);
        // SAFETY: `offset` is one of the header's field offsets, inside the
        // mapping and aligned for `T` (the mapping is page-aligned and the
        // offsets are multiples of 8); `T` is an atomic type, for which
        // shared access from several processes is sound, and the mapping
        // lives as long as `self`.
        unsafe { &*self.map.as_ptr().add(offset).cast::<T>() }
    }

    /// The consumer's head: the position of the next cell it reads.
    // Inline: on the path of every message.
    #[inline(always)]
    pub(crate) fn head(&self) -> &AtomicU64 {
        self.atomic_at(HEAD_OFFSET)
    }

    /// Non-zero while the consumer may sleep.
    // Inline: on the path of every message.
    #[inline(always)]
    pub(crate) fn consumer_sleeping(&self) -> &AtomicU32 {
        self.atomic_at(CONSUMER_SLEEPING_OFFSET)
    }

    /// Non-zero while the producer may sleep waiting for free cells.
    // Inline: on the path of every message.
    #[inline(always)]
    pub(crate) fn producer_waiting(&self) -> &AtomicU32 {
        self.atomic_at(PRODUCER_WAITING_OFFSET)
    }

    /// Non-zero where the producer's process can take part in asymmetric
    /// barriers (see [`crate::ring::Barriers`]).
    pub(crate) fn producer_barriers(&self) -> &AtomicU32 {
        self.atomic_at(PRODUCER_BARRIERS_OFFSET)
    }

    /// Non-zero where the consumer agreed to asymmetric barriers (both
    /// processes can take part).
    pub(crate) fn barriers_agreed(&self) -> &AtomicU32 {
        self.atomic_at(BARRIERS_AGREED_OFFSET)
    }

    /// The control word (the first 8 bytes) of the cell at queue position
    /// `position`, counted from the start without wrapping: cell
    /// `position & (cells - 1)`, never outside the queue, so it needs no
    /// bound check (a fruitless poll is this load and little else).
    // Inline: on the path of every message.
    #[inline(always)]
    pub(crate) fn control(&self, position: u64) -> &AtomicU64 {
        let index = position & (self.cells - 1);
        // SAFETY: `index` is below `cells` (a mask of one less), so the
        // word lies inside the mapping, 64-byte aligned; shared access to
        // an atomic from several processes is sound, and the mapping
        // lives as long as `self`.
        unsafe {
            &*self
                .map
                .as_ptr()
                .add(CELLS_OFFSET + index as usize * CELL)
                .cast::<AtomicU64>()
        }
    }

    /// Bounds of `len` bytes at byte `offset` of the cell area, as offsets
    /// in the mapping. Panics outside the cells: callers compute both from
    /// checked frame positions and lengths.
    // Inline: on the path of every message.
    #[inline(always)]
    fn cell_range(&self, offset: usize, len: usize) -> usize {
        let end = offset.checked_add(len);
        assert!(
            end.is_some_and(|e| e as u64 <= self.cells * CELL as u64),
            "{len} bytes at {offset} outside the queue's cells"
        );
        CELLS_OFFSET + offset
    }

    /// Copies `bytes` into the cells, from byte `offset` of the cell area.
    // Inline: on the path of every message.
    #[inline(always)]
    pub(crate) fn write_cells(&mut self, offset: usize, bytes: &[u8]) {
        let start = self.cell_range(offset, bytes.len());
        // SAFETY: the range lies inside the mapping (checked); the peer
        // does not read these bytes until they are published, and the
        // copy goes through raw pointers (see `sys`).
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                self.map.as_mut_ptr().add(start),
                bytes.len(),
            )
        };
    }

    /// Copies bytes out of the cells, from byte `offset` of the cell area,
    /// into `dest`.
    // Inline: on the path of every message.
    #[inline(always)]
    pub(crate) fn read_cells(&self, offset: usize, dest: &mut [u8]) {
        let start = self.cell_range(offset, dest.len());
        // SAFETY: the range lies inside the mapping (checked) and `dest` is
        // ours; the bytes are copied through raw pointers, so a faulty
        // peer writing them at the same time can only make them wrong.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.map.as_ptr().add(start),
                dest.as_mut_ptr(),
                dest.len(),
            )
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::numa::Placement;
    use std::os::fd::OwnedFd;
    use std::os::unix::net::UnixStream;

    /// Hands `segment`'s descriptor over a socket pair, as the transport
    /// does, and returns the descriptor that arrived.
    fn pass(segment: &Segment) -> File {
        let (a, b) = UnixStream::pair().unwrap();
        assert_eq!(sys::send(&a, b"x", Some(segment.fd())).unwrap(), 1);
        let mut fds: Vec<OwnedFd> = Vec::new();
        let mut buf = [0u8; 8];
        assert_eq!(sys::recv(&b, &mut buf, &mut fds).unwrap(), 1);
        assert_eq!(fds.len(), 1);
        File::from(fds.pop().unwrap())
    }

    #[test]
    fn a_passed_segment_opens_and_shares_memory() {
        let mut producer = Segment::create(3, 5, 64).unwrap();
        let consumer = Segment::open(pass(&producer), 3, 5).unwrap();
        assert_eq!(consumer.cells(), 64);
        producer.write_cells(100, b"hello");
        let mut got = [0u8; 5];
        consumer.read_cells(100, &mut got);
        assert_eq!(&got, b"hello");
        consumer
            .head()
            .store(7, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(
            producer.head().load(std::sync::atomic::Ordering::Relaxed),
            7
        );
        // Nothing about it is in the file system.
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let label = format!("/memfd:oxmpi-shm-{}-3-to-5", std::process::id());
        assert!(maps.contains(&label), "{maps}");
    }

    /// The `/proc/self/numa_maps` lines of the mappings of the queue from
    /// `producer` to `consumer` made by this process.
    fn numa_maps(producer: u32, consumer: u32) -> Vec<String> {
        let label = format!(
            "/memfd:oxmpi-shm-{}-{producer}-to-{consumer}",
            std::process::id()
        );
        std::fs::read_to_string("/proc/self/numa_maps")
            .unwrap()
            .lines()
            .filter(|l| l.contains(&label))
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn the_consumers_binding_holds_for_the_producers_pages() {
        let mut producer = Segment::create(7, 8, 64).unwrap();
        let consumer = Segment::open(pass(&producer), 7, 8).unwrap();
        // Node 0 exists on every machine with NUMA support.
        let mut placement = Placement::Bind {
            nodes: vec![0],
            from: "the test",
        };
        placement.bind_pages(&consumer.map, 0..consumer.map.len(), "the queue");
        assert!(matches!(placement, Placement::Bind { .. }), "{placement}");
        // The producer touches the cells first; the policy is the file's.
        producer.write_cells(0, &[1; 64 * CELL]);
        let lines = numa_maps(7, 8);
        assert_eq!(lines.len(), 2, "{lines:?}");
        for line in &lines {
            assert!(line.contains(" bind:0 "), "{line}");
            assert!(line.contains(" N0="), "{line}");
        }
        // A node that does not exist is refused, and placement is first
        // touch from then on, saying why.
        let mut placement = Placement::Bind {
            nodes: vec![4000],
            from: "the test",
        };
        placement.bind_pages(&consumer.map, 0..consumer.map.len(), "the queue");
        let said = placement.to_string();
        assert!(
            said.contains("first touch: the kernel refused to bind the queue to NUMA node(s) 4000"),
            "{said}"
        );
    }

    /// Places a fresh segment at its consumer, with its pages faulted in
    /// by `populate`, and checks that every page, the first (which the
    /// producer allocated writing the layout) included, is allocated only
    /// after the consumer bound it, with nothing the producer wrote lost.
    fn check_every_page_is_allocated_under_the_consumers_binding(
        producer: u32,
        consumer: u32,
        populate: fn(&MmapMut) -> io::Result<()>,
    ) {
        use crate::numa::{page_policy, PagePolicy};
        use std::sync::atomic::Ordering;
        let mut made = Segment::create(producer, consumer, 1024).unwrap();
        made.producer_barriers().store(1, Ordering::Relaxed);
        let mut placed = Segment::open(pass(&made), producer, consumer).unwrap();
        let pages = sys::resident_pages(&placed.map).unwrap();
        assert!(pages.len() > 4, "{} pages", pages.len());
        // Only the layout's page: the producer allocated no other (with
        // `MAP_POPULATE` it allocated them all, on its own node).
        assert!(pages[0], "the layout's page is not allocated");
        let allocated: Vec<usize> = (1..pages.len()).filter(|&p| pages[p]).collect();
        assert!(
            allocated.is_empty(),
            "pages {allocated:?} were allocated before the consumer bound them"
        );
        // Node 0 exists on every machine with NUMA support.
        let mut placement = Placement::Bind {
            nodes: vec![0],
            from: "the test",
        };
        let page = sys::page_size();
        placed
            .place_by(
                |map| {
                    placement.bind_pages(map, 0..map.len(), "the queue");
                    Ok(())
                },
                |map| {
                    let resident = sys::resident_pages(map).unwrap();
                    let early: Vec<usize> = (0..resident.len()).filter(|&p| resident[p]).collect();
                    assert!(
                        early.is_empty(),
                        "pages {early:?} are still those allocated before the binding"
                    );
                    for p in 0..resident.len() {
                        assert_eq!(
                            page_policy(map.as_ptr().wrapping_add(p * page)).unwrap(),
                            PagePolicy::Bind(vec![0]),
                            "page {p} is allocated before it is bound"
                        );
                    }
                    populate(map)
                },
                &"the queue",
            )
            .unwrap();
        assert!(matches!(placement, Placement::Bind { .. }), "{placement}");
        // All allocated now, under the consumer's policy, with nothing the
        // producer wrote changed; the producer's populate changes nothing.
        let missing: Vec<usize> = sys::resident_pages(&placed.map)
            .unwrap()
            .iter()
            .enumerate()
            .filter_map(|(p, &r)| (!r).then_some(p))
            .collect();
        assert!(missing.is_empty(), "pages {missing:?} are not allocated");
        made.populate().unwrap();
        for p in 0..pages.len() {
            assert_eq!(
                page_policy(placed.map.as_ptr().wrapping_add(p * page)).unwrap(),
                PagePolicy::Bind(vec![0]),
                "page {p}"
            );
        }
        assert_eq!(
            Segment::open(pass(&made), producer, consumer)
                .unwrap()
                .cells(),
            1024
        );
        assert_eq!(placed.producer_barriers().load(Ordering::Relaxed), 1);
        // Both ends map the new first page.
        placed.head().store(5, Ordering::Relaxed);
        assert_eq!(made.head().load(Ordering::Relaxed), 5);
        made.write_cells(8, b"cell");
        let mut got = [0u8; 4];
        placed.read_cells(8, &mut got);
        assert_eq!(&got, b"cell");
    }

    #[test]
    fn the_consumer_allocates_every_page_under_its_binding() {
        check_every_page_is_allocated_under_the_consumers_binding(9, 10, sys::populate);
    }

    #[test]
    fn so_does_the_fallback_for_kernels_without_populate_write() {
        check_every_page_is_allocated_under_the_consumers_binding(11, 12, |map| {
            sys::touch_every_page(map);
            Ok(())
        });
    }

    #[test]
    fn the_size_cannot_change_after_creation() {
        let segment = Segment::create(0, 1, 64).unwrap();
        let file = pass(&segment);
        assert!(file.set_len(0).is_err(), "a peer shrank the segment");
        assert!(file.set_len(1 << 20).is_err(), "a peer grew the segment");
    }

    /// A memory file like a segment, made by hand so a test can break it.
    fn forged(layout: SegmentLayout, size: u64, seal: bool) -> File {
        use std::os::unix::fs::FileExt;
        let file = sys::memfd(c"forged").unwrap();
        file.set_len(size).unwrap();
        let mut bytes = layout.magic.to_vec();
        for field in [
            layout.version,
            layout.cells_offset,
            layout.cell_size,
            layout.cell_count,
            layout.producer,
            layout.consumer,
        ] {
            bytes.extend_from_slice(&field.to_le_bytes());
        }
        file.write_all_at(&bytes, 0).unwrap();
        if seal {
            sys::seal_size(&file).unwrap();
        }
        file
    }

    fn good_layout() -> SegmentLayout {
        SegmentLayout {
            magic: SEGMENT_MAGIC,
            version: SHM_VERSION,
            cells_offset: CELLS_OFFSET as u32,
            cell_size: CELL as u32,
            cell_count: 64,
            producer: 1,
            consumer: 2,
        }
    }

    #[test]
    fn bad_segments_are_refused_with_the_reason() {
        let size = (CELLS_OFFSET + 64 * CELL) as u64;
        assert!(Segment::open(forged(good_layout(), size, true), 1, 2).is_ok());
        let refused = |layout: SegmentLayout, size: u64, seal: bool| match Segment::open(
            forged(layout, size, seal),
            1,
            2,
        ) {
            Ok(_) => panic!("{layout:?} ({size} bytes, sealed: {seal}) accepted"),
            Err(e) => e,
        };
        assert!(matches!(
            refused(good_layout(), size, false),
            SegmentError::NotSealed
        ));
        let version = refused(
            SegmentLayout {
                version: SHM_VERSION + 1,
                ..good_layout()
            },
            size,
            true,
        );
        assert!(matches!(version, SegmentError::Version { theirs } if theirs == SHM_VERSION + 1));
        assert!(
            version.to_string().contains("run the same oxmpi"),
            "{version}"
        );
        let magic = SegmentLayout {
            magic: *b"SOMETHIN",
            ..good_layout()
        };
        assert!(matches!(refused(magic, size, true), SegmentError::Magic));
        for layout in [
            SegmentLayout {
                cell_size: 32,
                ..good_layout()
            },
            SegmentLayout {
                cell_count: 63,
                ..good_layout()
            },
            SegmentLayout {
                cells_offset: 0,
                ..good_layout()
            },
        ] {
            assert!(matches!(
                refused(layout, size, true),
                SegmentError::Layout(_)
            ));
        }
        assert!(matches!(
            refused(good_layout(), size - CELL as u64, true),
            SegmentError::Size(_)
        ));
        assert!(matches!(
            refused(good_layout(), 100, true),
            SegmentError::Size(100)
        ));
        let swapped = SegmentLayout {
            producer: 2,
            consumer: 1,
            ..good_layout()
        };
        assert!(matches!(
            refused(swapped, size, true),
            SegmentError::Ranks { .. }
        ));
        // A descriptor that is no memory file at all.
        let (a, _b) = UnixStream::pair().unwrap();
        let not_memfd = File::from(OwnedFd::from(a));
        assert!(matches!(
            Segment::open(not_memfd, 1, 2),
            Err(SegmentError::Magic)
        ));
    }
}
