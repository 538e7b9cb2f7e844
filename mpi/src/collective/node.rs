//! Collectives over shared memory, for communicators whose processes all
//! share a host: barrier, broadcast, reduce, all-reduce and all-to-all of
//! small data, and broadcast, all-reduce and all-to-all of long data,
//! through one shared region per communicator (and single copies between
//! the processes' buffers), without messages.
//!
//! # The region
//! Made at the first blocking collective of these kinds on the
//! communicator, before the call checks its arguments (so a process whose
//! arguments are wrong still takes part in it, as every process makes the
//! same call): every process all-gathers its host identity's key, and
//! rank 0 the name of a region it made ([`SharedRegion`], a memory file
//! it hands the others over an abstract Unix socket, which needs no
//! ptrace rights); when all keys are equal, the others attach it; then an
//! all-reduce tells whether every process has it. If not — processes on
//! several hosts or network namespaces, shared memory not among the transports
//! (`OXMPI_TRANSPORTS`), or `OXMPI_COLL_SHM=0` — the communicator keeps to
//! the message algorithms, and `OXMPI_VERBOSE=1` says why. Its messages
//! carry the number of the collective that made it (with a kind of their
//! own), so they stay apart from every other collective's.
//!
//! Each process binds its own slots and staging areas (below) to its
//! NUMA node(s) before the all-reduce that ends the set-up
//! ([`SharedRegion::bind_to_own_nodes`]): it writes them at every
//! operation that uses them, while who reads them changes with the root
//! and the operation. The cells and progress lines, which every process
//! polls, are left to first touch.
//!
//! Each process has two cells of one cache line each, which it uses in
//! turn, and a data slot beside each cell. A cell holds a *stamp* (the
//! number of the collective, and the length of the process's data) and up
//! to 56 bytes of data; longer data goes to the cell's slot.
//!
//! # The protocol
//! An operation is known by its collective's number on the communicator
//! (`Communicator::next_collective`), which every process takes at the
//! call, before it checks its arguments. So when a call fails at some
//! processes only, the numbers of the later collectives still agree
//! everywhere, whether they go through shared memory or by messages; no
//! count of the operations on this path is ever compared between
//! processes.
//!
//! A process enters an operation by writing its data to its next cell (or
//! the cell's slot) and storing the stamp with release ordering; it then
//! waits for the cells it needs to show the operation's number, and reads
//! their data after an acquire load:
//! - barrier: every process's;
//! - broadcast: the root's (the root waits for no one);
//! - all-reduce: every process's, and each process combines all the data
//!   in rank order (`x0 op (x1 op ( ... ))`), so every process gets the
//!   same result and non-commutative operations see rank order;
//! - reduce: the root waits for every process and combines;
//! - all-to-all: every process's, taking its own block of each.
//!
//! A cell is written again two operations of its process later: before
//! that, the process waits until every process has stamped a cell with
//! its previous operation's number or a later one, which every process
//! does only after it has read what it needed of the operation before
//! (the cell's last data). What a process has seen of the others (all
//! at a barrier, say) spares it that wait. While a process reads another's
//! data of an operation, the other cannot write that cell, so a reader
//! that finds neither cell stamped with the number, but one with a later
//! number, knows that the other left this collective (its call failed
//! there), and fails with `MPI_ERR_OTHER` instead of waiting for ever.
//! Numbers are compared modulo 2^32 (serial-number arithmetic: processes
//! are never 2^31 collectives apart).
//!
//! # Long all-reduces
//! An all-reduce too long for a slot, or whose data from all processes
//! together reaches [`SLOTS_ALL_REDUCE_MAX`], goes through two staging
//! areas per process, in rounds of a window of at most an area (the rounds use the
//! areas in turn, picked by the collective's number and the round so that
//! every process picks alike). In a round, each process copies the parts
//! of its window that the others reduce (one part per process, whole
//! elements) into its area and publishes its progress (a word of its own:
//! the collective's number and a step, with a release store); it
//! combines its own part of every process's window, a cache-sized piece
//! at a time (a commutative operation each process's part as soon as
//! that one's progress shows it, in turn from the next rank; others in
//! rank order once every process has copied in), leaves the result in
//! its area and publishes again; then it copies each other's results as
//! soon as that one's progress shows them. An area
//! is written again once every process's progress shows that it has read
//! the area's last results. The cell's stamp announces the length, which
//! every process checks after the first round's first step.
//!
//! Longer all-reduces, from [`DIRECT_ALL_REDUCE_MIN`] bytes, go by
//! single copies between the processes' buffers (cross-memory attach)
//! where every process's input and output are contiguous: each publishes
//! their addresses in its cell (or [`NO_ADDRESS`], and then all go by the
//! staging areas, as they all see). A process copies its part of every
//! other's input into a buffer a piece at a time and combines it into its
//! part of its own output (commutative operations in turn from the next
//! rank, so that each buffer has one reader at a time; the others in rank
//! order), publishes progress 1, then copies each other's part of the
//! result out of its output once that one's progress shows it; it leaves
//! once every process's progress is 2, when no one reads its buffers any
//! more. A process overwrites its output's part of another only after
//! that one's progress 1, so in place the others have read their part of
//! its input by then.
//!
//! # Long broadcasts and all-to-alls
//! An all-to-all's blocks from [`DIRECT_MIN`] bytes, and between two
//! processes a broadcast or all-to-all's blocks from [`DIRECT_MIN_PAIR`]
//! bytes, go by single copies between the processes' buffers with cross-memory
//! attach, where every process can copy from every other (checked when
//! the region is made, by a copy of each one's [`PROBE`] word; not with
//! `OXMPI_SHM_CMA=0`): a process publishes its buffer's address in its
//! cell; an all-to-all's processes copy their blocks out of the others'
//! send buffers; a broadcast's non-roots copy the root's buffer but its
//! last share, which the root copies into each of theirs, so that the
//! root's core works too. An all-to-all's process `i` copies from
//! `i + 1`, `i + 2`, ... in turn (wrapping), so that each buffer has one
//! reader at a time. A process leaves once its progress word shows
//! it has copied all it will, and every other's shows the same (so no one
//! still copies from its buffer); the non-roots also wait for the root's.
//! Data that is not contiguous has no address, and is never packed whole:
//! a process whose buffer is not contiguous publishes [`NO_ADDRESS`]. A
//! broadcast whose root did, or an all-to-all where any sender did,
//! streams through the staging areas instead (below): every process that
//! passed the same length sees the same cells, and so agrees. A receiver
//! that did copies all its data itself (the root writes nothing into
//! it), a [`DIRECT_PIECE`] at a time into a scratch, which it unpacks.
//! A process on a node whose processes outnumber its cores publishes none
//! either for data that fits its ring: there, streaming is faster.
//!
//! Below that, or without single copies, data too long for a slot streams
//! through the writers' staging areas, seen as a ring of slots (at least
//! four): a writer (a broadcast's root, every process of an all-to-all)
//! copies piece `k` (for an all-to-all, a piece of each block for the
//! others) into slot `k` of its ring and publishes progress `k + 1`, then
//! copies piece `k - 1` out of each process it reads once that one's
//! progress shows it; a slot is written again once every process has read
//! it. A process that took no part (its call failed), or announced
//! another length, reads nothing, and is not waited for; a process
//! publishes step 0 as it starts (it has read all of earlier collectives)
//! and, if it gives up, the last step [`ABORTED`], which fails those
//! waiting for its data. A broadcast longer than the ring waits for
//! every process to read, as a rendezvous message waits for its receiver.
//!
//! A process whose length differs from another's gets the same errors as
//! with messages (`MPI_ERR_TRUNCATE` when it would receive more,
//! `MPI_ERR_COUNT` less) after taking its part.
//!
//! A waiting process waits as every wait on memory does
//! ([`crate::wait_for_memory`], the device's wait policy
//! [`oxmpi_adi::wait`]): it polls the device now and then (messages and
//! pending non-blocking collectives keep moving) and spins, or, on a node
//! whose processes outnumber its cores, polls at every check and yields
//! the processor after each (the process it waits for may be off its
//! core, and a wait that spins keeps it off), until it has polled for the
//! device's poll time; then it naps on the region's doorbell (a line
//! after the staging areas), which every stamp and progress word a
//! process publishes rings while anyone sleeps there, so that a nap ends
//! when something it may wait for is published.

use super::engine::block_on;
use super::op::Reduction;
use super::team::{Scratch, Team};
use super::typed::{copy_across, Input, Output, Pieces, Segments};
use crate::{wait_for_memory_rung, with_device, Error, ErrorClass, Result};
use oxmpi_adi::host::HostId;
use oxmpi_adi::vlog;
use oxmpi_shm::region::{Doorbell, RegionName, SharedRegion};
use oxmpi_shm::window::RemoteWindow;
use std::ops::Range;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// The environment variable that turns the shared-memory collectives off
/// (`0`); they are on by default where they can be.
pub const COLL_SHM_ENV: &str = "OXMPI_COLL_SHM";

/// Words each process contributes when the region is made: its host
/// key (4), rank 0's region name (3) and whether it made one, its process
/// id, the address of its [`PROBE`].
const WORDS: usize = 10;
/// Bytes of a cell: one cache line, so that a small contribution and its
/// stamp travel between cores together.
const LINE: usize = 64;
/// Cells per process, used in turn.
const CELLS: usize = 2;
/// Bytes of data a cell holds after its stamp.
const INLINE: usize = LINE - 8;
/// The region's share of data slots: one per cell, at most this much in
/// all, each from [`SLOT_MIN`] to [`SLOT_MAX`] bytes.
const SLOTS_BUDGET: usize = 256 << 10;
const SLOT_MIN: usize = 1 << 10;
const SLOT_MAX: usize = 8 << 10;
/// The staging areas of long all-reduces and streamed broadcasts and
/// all-to-alls: two per process
/// (used in turn by rounds), at most this much in all, each from
/// [`AREA_MIN`] to [`AREA_MAX`] bytes.
const AREAS: usize = 2;
const STAGING_BUDGET: usize = 8 << 20;
const AREA_MIN: usize = 16 << 10;
const AREA_MAX: usize = 256 << 10;
/// Bytes a staged all-reduce combines at a time: the running result and
/// the input stay in the first-level cache (16 processes on 16 cores,
/// 256 KiB - 1 MiB: 10-15 % faster than 16 KiB at a time).
const CHUNK: usize = 4 << 10;
/// An all-to-all's blocks of at least this many bytes go by single
/// copies between the processes' buffers where they can (16 processes on
/// 16 cores: 8 KiB blocks in 44 us so, 61 streamed) ...
const DIRECT_MIN: usize = 8 << 10;
/// ... or of this many between two processes, where a broadcast goes by
/// single copies too: each copies half of it and waits for one other
/// (16 KiB took 1.6 us so, 2.6 streamed; with three processes on two
/// cores, 16 KiB streamed took a fifth of the time single copies took).
/// From three processes on, a broadcast always streams: its readers
/// would all copy from the root's one buffer, each pinning its pages,
/// while they read a ring slot in shared memory side by side (16
/// processes on 16 cores: 1 MiB in 156 us streamed, 1453 us by single
/// copies).
const DIRECT_MIN_PAIR: usize = 16 << 10;
/// An all-reduce of at least this many bytes, whose parts (one for each
/// process) are at least [`DIRECT_ALL_REDUCE_PART`] bytes, goes by single
/// copies between the processes' buffers where they can, from three
/// processes on: each reads its part of every other's data with one copy
/// a piece, where through the staging areas each byte is copied in,
/// combined from there and copied out, in rounds of an area (4 MiB took
/// 2052-2112 us so at 16 processes on 16 cores, 2146-2507 staged; 1040
/// against 1377 at 4; 8 MiB at 16: 3941-4411 against 5082-5691). Below,
/// the copies' fixed costs weigh more than the copy they spare (16
/// processes, 16 KiB: 67 us against 16; 1 MiB about even; 4 processes,
/// 1 MiB: 416 against 374; 8 processes, 2 MiB, parts of 256 KiB: even).
const DIRECT_ALL_REDUCE_MIN: usize = 2 << 20;
const DIRECT_ALL_REDUCE_PART: usize = 256 << 10;
/// An all-reduce whose data from all processes together is at least this
/// long goes through the staging areas even where it fits a slot: by
/// slots every process reads and combines all of it, staged each
/// combines its own part (16 processes on 16 cores, 8 KiB: 23 us by
/// slots, 8.3 staged).
const SLOTS_ALL_REDUCE_MAX: usize = 32 << 10;
/// What a process publishes in its cell for a collective by single
/// copies where it has no buffer to copy from or into (its data is not
/// contiguous): no buffer has this address.
const NO_ADDRESS: u64 = 0;
/// A process whose buffer is not contiguous takes its data by single
/// copies into a scratch of at most this many bytes, a piece at a time,
/// and unpacks each piece from there; an all-reduce by single copies
/// combines pieces of this many bytes at most (16 processes, 4 MiB:
/// 1981-2060 us so, 2172-2285 in pieces of 16 KiB).
const DIRECT_PIECE: usize = 256 << 10;
/// A streamed collective (broadcast, all-to-all) cuts its data into
/// about this many pieces, so that copying out overlaps copying in ...
const PIPELINE: usize = 4;
/// ... pieces of at least this many bytes (per part), since each piece
/// costs a handover between processes ...
const PIECE_MIN: usize = 8 << 10;
/// ... and its ring has at least this many slots (at least three, so that
/// no writer waits for a process that waits for it).
const MIN_SLOTS: usize = 4;
/// The step a process publishes when it gave up a streamed collective:
/// after every other step, so it has read all it will, but its own
/// pieces may be missing.
const ABORTED: u32 = (STAMPED - 1) as u32;

/// Data up to this many bytes is combined in buffers on the stack: of a
/// cell's data, or of this size, so that the buffers zeroed fit the data.
const SMALL: usize = 2 << 10;

/// A stack buffer of `N` bytes, aligned for every element type (as
/// [`Scratch`] is).
#[repr(C, align(16))]
struct Aligned<const N: usize>([u8; N]);

impl<const N: usize> Aligned<N> {
    fn zeroed() -> Aligned<N> {
        Aligned([0; N])
    }
}

/// A cell's first word: the number of the collective (high 32 bits), a
/// flag that it was ever stamped (bit 31), and the data's length.
#[derive(Clone, Copy)]
struct Stamp(u64);

/// Bit 31 of a stamp: set in every stamp stored, clear in a cell never
/// stamped.
const STAMPED: u64 = 1 << 31;

impl Stamp {
    fn new(number: u32, len: usize) -> Stamp {
        Stamp(u64::from(number) << 32 | STAMPED | len as u64)
    }

    /// The collective's number, if the cell was ever stamped.
    fn number(self) -> Option<u32> {
        (self.0 & STAMPED != 0).then_some((self.0 >> 32) as u32)
    }

    fn len(self) -> usize {
        (self.0 & (STAMPED - 1)) as usize
    }
}

/// Whether collective `a` is `b` or a later one (modulo 2^32).
fn not_before(a: u32, b: u32) -> bool {
    a.wrapping_sub(b) as i32 >= 0
}

/// One process's contribution to an operation, found in its cell.
#[derive(Clone, Copy)]
struct Published {
    from: usize,
    cell: usize,
    len: usize,
}

/// What a look at a process's cells found of its contribution to a
/// collective.
enum Found {
    Here(Published),
    /// Not there, but a later collective's.
    Later,
    NotYet,
}

/// What a wait for another process's progress waits for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Wanted {
    /// Data it writes: if it left the collective, that is an error.
    Data,
    /// That it has read what it needed: one that left reads nothing.
    Reads,
}

/// How a streamed collective cuts its data (see
/// [`NodeRegion::broadcast_ring`]): `pieces` pieces of `part` bytes of
/// each part (the last may be shorter), each in a slot of the writer's
/// ring of `slots` slots.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ring {
    part: usize,
    slots: usize,
    pieces: usize,
}

impl Ring {
    /// Piece `k`'s bytes of a part of `len` bytes.
    fn range(&self, k: usize, len: usize) -> std::ops::Range<usize> {
        k * self.part..((k + 1) * self.part).min(len)
    }
}

/// A slot of a process's ring in its staging areas.
struct Slot<'r> {
    region: &'r SharedRegion,
    start: usize,
    len: usize,
}

impl Slot<'_> {
    /// Copies `data` into the slot at `at`.
    fn write(&self, at: usize, data: &[u8]) -> Result<()> {
        if at + data.len() <= self.len && self.region.write(self.start + at, data) {
            Ok(())
        } else {
            Err(outside(at + data.len(), self.len))
        }
    }

    /// Copies the slot's bytes at `at` into `buf`.
    fn read(&self, at: usize, buf: &mut [u8]) -> Result<()> {
        if at + buf.len() <= self.len && self.region.read(self.start + at, buf) {
            Ok(())
        } else {
            Err(outside(at + buf.len(), self.len))
        }
    }
}

/// A communicator's shared region and this process's place in it.
#[derive(Debug)]
pub(crate) struct NodeRegion {
    region: SharedRegion,
    rank: usize,
    size: usize,
    /// Bytes of each data slot: the most one process can publish.
    slot: usize,
    /// Operations this process has entered (the next uses cell
    /// `entered % CELLS`), and the number of the last one. A
    /// communicator's collectives are called by one thread at a time, so
    /// relaxed accesses suffice.
    entered: AtomicU64,
    last: AtomicU32,
    /// A collective number every process is known to have stamped (or a
    /// later one), with [`STAMPED`] set once one is known.
    reached: AtomicU64,
    /// Bytes of each staging area.
    area: usize,
    /// The processes' ids, by rank, where every process can copy from
    /// and into every other's memory (cross-memory attach).
    pids: Option<Vec<u32>>,
    /// For each staging area, the progress at which every process has
    /// read its last results (0: never used).
    free_after: [AtomicU64; AREAS],
    /// Whether the node's processes outnumber its cores
    /// ([`Device::crowded`](oxmpi_adi::device::Device::crowded)): a
    /// process waited for is then often off its core.
    crowded: bool,
}

impl NodeRegion {
    /// Makes or attaches the region of the team's processes, if they all
    /// can: see the module docs. Collective over `t`.
    pub(crate) fn establish(t: &Team) -> Result<Option<NodeRegion>> {
        let (n, rank) = (t.size(), t.rank());
        let wanted = wanted(n);
        let host = HostId::current().ok().map(|h| h.key());
        let (slot, area) = (slot_bytes(n), area_bytes(n));
        let crowded = with_device(|d| Ok(d.crowded()))?;
        let made = match (rank, &host, &wanted) {
            (0, Some(_), Ok(())) => {
                match SharedRegion::create(region_len(n, slot, area), c"oxmpi-collectives") {
                    Ok(made) => Some(made),
                    Err(e) => {
                        vlog!("collectives over shared memory: cannot make a region: {e}");
                        None
                    }
                }
            }
            _ => None,
        };
        // Each process: its host key (zeros if unknown), rank 0 the
        // region's name (zeros if none), its process id and the address
        // of its probe word.
        let mut mine = [0u64; WORDS];
        if let Some(key) = &host {
            for (word, bytes) in mine[..4].iter_mut().zip(key.chunks_exact(8)) {
                *word = u64::from_ne_bytes(bytes.try_into().expect("8-byte chunks"));
            }
        }
        if let Some((_, name)) = &made {
            mine[4..7].copy_from_slice(&name.to_words());
            mine[7] = 1;
        }
        mine[8] = u64::from(std::process::id());
        mine[9] = std::ptr::addr_of!(PROBE) as u64;
        let mut all = vec![0u64; WORDS * n];
        {
            let mine = Input::new(&mine)?;
            let mut gathered = Output::new(&mut all[..])?;
            block_on(super::algorithms::all_gather(
                t,
                mine.bytes(),
                gathered.bytes_mut(),
            ))?;
            gathered.finish()?;
        }
        let one_host = host.is_some() && all.chunks_exact(WORDS).all(|p| p[..4] == mine[..4]);
        let region = match (made, wanted) {
            (_, Err(why)) => {
                vlog!("collectives over shared memory: off ({why})");
                None
            }
            _ if !one_host || all[7] == 0 => None,
            (Some((made, _)), Ok(())) => Some(made),
            (None, Ok(())) => {
                let words = [all[4], all[5], all[6]];
                let attached = RegionName::from_words(words)
                    .ok_or_else(|| "a malformed region name".to_owned())
                    .and_then(|name| SharedRegion::attach(&name).map_err(|e| e.to_string()));
                attached
                    .inspect_err(|e| {
                        vlog!("collectives over shared memory: cannot attach rank 0's region: {e}")
                    })
                    .ok()
            }
        };
        // Placed before any process uses it: the `agree` below follows.
        let region = region.filter(|region| {
            place_own_part(region, n, slot, area, rank)
                .inspect_err(|e| {
                    vlog!("collectives over shared memory: cannot place this process's part: {e}")
                })
                .is_ok()
        });
        let peers: Vec<Peer> = all
            .chunks_exact(WORDS)
            .map(|p| Peer {
                pid: u32::try_from(p[8]).unwrap_or(0),
                probe: p[9],
            })
            .collect();
        let cma = region.is_some() && cma_works(rank, &peers);
        let agreed = agree(t, u64::from(region.is_some()) | u64::from(cma) << 1)?;
        // Every process has tried to attach.
        if let Some(region) = &region {
            region.stop_handover();
        }
        let (everyone, cma) = (agreed & 1 != 0, agreed & 2 != 0);
        Ok(region.filter(|_| everyone).map(|region| NodeRegion {
            region,
            rank,
            size: n,
            pids: cma.then(|| peers.iter().map(|p| p.pid).collect()),
            slot,
            entered: AtomicU64::new(0),
            last: AtomicU32::new(0),
            reached: AtomicU64::new(0),
            area,
            free_after: [AtomicU64::new(0), AtomicU64::new(0)],
            crowded,
        }))
    }

    /// Whether data of `len` bytes from each process fits a slot.
    pub(crate) fn fits(&self, len: usize) -> bool {
        len <= self.slot
    }

    /// Whether an all-reduce of `len` bytes of `element`-byte elements
    /// goes through the slots (else through the staging areas, or by
    /// messages).
    pub(crate) fn all_reduces_by_slots(&self, len: usize, element: usize) -> bool {
        self.fits(len)
            && (len.saturating_mul(self.size) < SLOTS_ALL_REDUCE_MAX
                || !self.fits_staged(len, element)
                // Every process gets a part.
                || len / element < self.size)
    }

    /// Whether `blocks` blocks of `block` bytes (an all-to-all's data)
    /// fit a slot.
    pub(crate) fn fits_blocks(&self, blocks: usize, block: usize) -> bool {
        blocks.checked_mul(block).is_some_and(|len| self.fits(len))
    }

    /// `MPI_Barrier`, collective number `number`.
    pub(crate) fn barrier(&self, number: u32) -> Result<()> {
        let cell = self.enter(number, &[])?;
        for from in self.others() {
            self.wait_for(from, number, cell)?;
        }
        self.everyone_reached(number);
        Ok(())
    }

    /// `MPI_Bcast` of `buf` (which fits) from `root`.
    pub(crate) fn broadcast(&self, number: u32, root: usize, buf: &mut [u8]) -> Result<()> {
        if self.rank == root {
            self.enter(number, buf)?;
            return Ok(());
        }
        let cell = self.enter(number, &[])?;
        let mut mismatch = None;
        self.take(number, root, cell, 0, buf, &mut mismatch)?;
        mismatch.map_or(Ok(()), Err)
    }

    /// `MPI_Allreduce` in place on `acc` (which fits).
    pub(crate) fn all_reduce(&self, number: u32, acc: &mut [u8], red: &Reduction) -> Result<()> {
        let cell = self.enter(number, acc)?;
        self.combine(number, cell, acc, red, 0..self.size)
    }

    /// `MPI_Reduce` to `root` in place on `acc` (which fits): only the
    /// root's is the result.
    pub(crate) fn reduce(
        &self,
        number: u32,
        root: usize,
        acc: &mut [u8],
        red: &Reduction,
    ) -> Result<()> {
        let cell = self.enter(number, acc)?;
        if self.rank != root {
            return Ok(());
        }
        self.combine(number, cell, acc, red, 0..self.size)
    }

    /// Announces this process's length (`len` bytes) for a reduce to
    /// `root` that goes by messages, its data being too long for a slot:
    /// the root waits until every process has stamped collective `number`
    /// (announced its length, or entered data that fits a slot, which
    /// [`NodeRegion::reduce`] takes and leaves at once) and fails where a
    /// length differs, before any message is sent. Else a root whose data
    /// fits a slot would wait for ever for the cell of a process that
    /// went by messages, or one that went by messages for a message of a
    /// process whose data fit a slot.
    pub(crate) fn announce(&self, number: u32, root: usize, len: usize) -> Result<()> {
        // A stamp holds lengths below 2^31.
        let stamped = len.min(STAMPED as usize - 1);
        let cell = self.begin(number, stamped, |_| Ok(()))?;
        if self.rank != root {
            return Ok(());
        }
        self.check_stamped_lengths(number, cell, stamped)
    }

    /// Announces this process's length (`len` bytes) for an
    /// intercommunicator's all-reduce that goes by messages, its data
    /// being too long for [`NodeRegion::all_reduce_other_group`], and
    /// checks every process's (as [`NodeRegion::announce`]'s root does),
    /// so that every process fails alike before any message is sent
    /// where the lengths differ: else one whose data fits a slot would
    /// wait for ever for the cell of one that went by messages, or the
    /// processes that went by messages for each other.
    pub(crate) fn announce_to_all(&self, number: u32, len: usize) -> Result<()> {
        // A stamp holds lengths below 2^31.
        let stamped = len.min(STAMPED as usize - 1);
        let cell = self.begin(number, stamped, |_| Ok(()))?;
        self.check_stamped_lengths(number, cell, stamped)
    }

    /// Waits until every other process has stamped collective `number`
    /// (this process in `cell`) and checks that each announced `len`
    /// bytes: else the error of a message of the other length.
    fn check_stamped_lengths(&self, number: u32, cell: usize, len: usize) -> Result<()> {
        let mut mismatch = None;
        for from in self.others() {
            let published = self.wait_for(from, number, cell)?;
            if let Err(e) = check_len(published.len, len, from) {
                mismatch.get_or_insert(e);
            }
        }
        self.everyone_reached(number);
        mismatch.map_or(Ok(()), Err)
    }

    /// Whether an intercommunicator's all-reduce of `len` bytes, where
    /// the other group has `others` processes, goes through the slots
    /// ([`NodeRegion::all_reduce_other_group`]; else by messages): the
    /// data fits a slot, and the other group's data together stays below
    /// [`SLOTS_ALL_REDUCE_MAX`], as every process reads and combines all
    /// of it.
    pub(crate) fn all_reduces_other_group_by_slots(&self, len: usize, others: usize) -> bool {
        self.fits(len) && len.saturating_mul(others) < SLOTS_ALL_REDUCE_MAX
    }

    /// `MPI_Allreduce` of an intercommunicator whose two groups share
    /// this region (its ranks are their indices in the team of both
    /// groups): `acc` (which [fits a
    /// slot](NodeRegion::all_reduces_other_group_by_slots)) is this
    /// process's data, published for the other group, and is replaced by
    /// the data of `others` (the other group's processes, not empty)
    /// combined in their rank order.
    pub(crate) fn all_reduce_other_group(
        &self,
        number: u32,
        acc: &mut [u8],
        red: &Reduction,
        others: Range<usize>,
    ) -> Result<()> {
        let cell = self.enter(number, acc)?;
        self.combine(number, cell, acc, red, others)
    }

    /// `MPI_Alltoall` of `send` into `recv`, both `size` blocks of
    /// `block` bytes (which fit): block `i` of `send` goes to rank `i`.
    pub(crate) fn all_to_all(
        &self,
        number: u32,
        send: &[u8],
        recv: &mut [u8],
        block: usize,
    ) -> Result<()> {
        let cell = self.enter(number, send)?;
        let mine = self.rank * block..(self.rank + 1) * block;
        recv[mine.clone()].copy_from_slice(&send[mine.clone()]);
        let mut mismatch = None;
        for from in self.others() {
            let published = self.wait_for(from, number, cell)?;
            // The other's data must be as long as this process's (its
            // block times the processes): else it passed another count.
            if let Err(e) = check_len(published.len, send.len(), from) {
                mismatch.get_or_insert(e);
                continue;
            }
            let into = &mut recv[from * block..(from + 1) * block];
            self.read(&published, mine.start, into)?;
        }
        self.everyone_reached(number);
        mismatch.map_or(Ok(()), Err)
    }

    /// Whether an all-reduce of `len` bytes of `element`-byte elements
    /// goes by [`NodeRegion::all_reduce_long`] (neither the slots nor
    /// messages).
    pub(crate) fn all_reduces_long(&self, len: usize, element: usize) -> bool {
        !self.all_reduces_by_slots(len, element) && self.fits_staged(len, element)
    }

    /// Whether an all-reduce of `len` bytes of `element`-byte elements
    /// can go through the staging areas.
    fn fits_staged(&self, len: usize, element: usize) -> bool {
        len < STAMPED as usize && element > 0 && self.area >= element
    }

    /// `MPI_Allreduce` in place on `acc` (which [fits the staging
    /// areas](NodeRegion::fits_staged)), as a reduce-scatter and an
    /// all-gather (module docs): from [`DIRECT_ALL_REDUCE_MIN`] bytes by
    /// single copies between the processes' buffers where every process
    /// has contiguous ones, else through the staging areas.
    pub(crate) fn all_reduce_long(
        &self,
        number: u32,
        acc: &mut Segments,
        red: &Reduction,
    ) -> Result<()> {
        let total = acc.len();
        if !self.reduces_directly(total) {
            // The stamp announces the length, checked once every process
            // has stamped (before its first progress).
            let cell = self.begin(number, total, |_| Ok(()))?;
            return self.all_reduce_in_rounds(number, cell, acc, red);
        }
        let buffers = acc.contiguous();
        let addresses = buffers.as_ref().map(|(input, output)| {
            let output = output.as_ptr();
            [input.map_or(output, <[u8]>::as_ptr), output]
        });
        let cell = self.begin_direct(number, total, addresses)?;
        let mut sources = Vec::with_capacity(self.size);
        let mut everyone_has_buffers = addresses.is_some();
        let mut outcome = Ok(());
        for from in self.others() {
            let found = self.wait_for(from, number, cell).and_then(|published| {
                check_len(published.len, total, from)?;
                Ok((self.remote(&published, 0)?, self.remote(&published, 1)?))
            });
            match found {
                Ok((Some(input), Some(output))) => sources.push((from, input, output)),
                Ok(_) => everyone_has_buffers = false,
                Err(e) => outcome = outcome.and(Err(e)),
            }
        }
        match buffers {
            // Every process saw every stamp, so all that passed this
            // length fail alike here, and none reads another's memory.
            _ if outcome.is_err() => self.finish_direct(number, cell, total, 2, outcome),
            Some((input, output)) if everyone_has_buffers => {
                // Every process stamped its cell.
                self.everyone_reached(number);
                let outcome = self.all_reduce_direct(number, cell, &sources, input, output, red);
                self.finish_direct(number, cell, total, 2, outcome)
            }
            _ => self.all_reduce_in_rounds(number, cell, acc, red),
        }
    }

    /// Whether an all-reduce of `len` bytes goes by single copies between
    /// the processes' buffers where they all have contiguous ones (see
    /// [`DIRECT_ALL_REDUCE_MIN`]).
    fn reduces_directly(&self, len: usize) -> bool {
        self.pids.is_some()
            && self.size > 2
            && len >= DIRECT_ALL_REDUCE_MIN
            && len / self.size >= DIRECT_ALL_REDUCE_PART
            && len < STAMPED as usize
    }

    /// The reduce-scatter and all-gather of an all-reduce by single
    /// copies: this process combines its part of every process's
    /// `input` (this one's own is `input`, or `output` in place), read
    /// from the others' buffers (`sources`: each one's rank, input and
    /// output), into its `output`, publishes progress 1, and copies each
    /// other's part of the result out of its output once that one's
    /// progress shows it.
    fn all_reduce_direct(
        &self,
        number: u32,
        cell: usize,
        sources: &[(usize, RemoteWindow, RemoteWindow)],
        input: Option<&[u8]>,
        output: &mut [u8],
        red: &Reduction,
    ) -> Result<()> {
        let (total, element) = (output.len(), red.unit_size());
        let parts = |q: usize| part(total / element, self.size, q, element);
        let mine = parts(self.rank);
        if let Some(input) = input {
            output[mine.clone()].copy_from_slice(&input[mine.clone()]);
        }
        // Process `i` reads from `i + 1`, `i + 2`, ... in turn, so that
        // each buffer has one reader at a time.
        let first_after = sources.partition_point(|(from, ..)| *from < self.rank);
        let turn = || sources[first_after..].iter().chain(&sources[..first_after]);
        // A piece of each process's part at a time: one copy each, into
        // a buffer that stays in the cache while it is combined.
        let longest = ((DIRECT_PIECE / element).max(1) * element).min(mine.len());
        let mut input = Scratch::zeroed(longest);
        let mut fold = Scratch::zeroed(if red.is_commutative() { 0 } else { longest });
        let mut at = mine.start;
        while at < mine.end {
            let piece = at..(at + longest).min(mine.end);
            let acc = &mut output[piece.clone()];
            let len = acc.len();
            let fetch = |from: usize, w: &RemoteWindow, buf: &mut [u8]| {
                copied(w.read(piece.start as u64, buf), from)
            };
            if red.is_commutative() {
                // Any order gives the same result: each process's in turn.
                for (from, w, _) in turn() {
                    fetch(*from, w, &mut input.bytes_mut()[..len])?;
                    red.apply(&input.bytes()[..len], acc)?;
                }
            } else {
                self.fold_in_rank_order(
                    acc,
                    &mut fold.bytes_mut()[..len],
                    &mut input.bytes_mut()[..len],
                    red,
                    0..self.size,
                    |from, buf| {
                        let (_, w, _) = sources
                            .iter()
                            .find(|(q, ..)| *q == from)
                            .ok_or_else(|| gave_up(from))?;
                        fetch(from, w, buf).map(|()| true)
                    },
                )?;
            }
            at = piece.end;
        }
        self.publish_progress(number, 1)?;
        for (from, _, w) in turn() {
            self.wait_for_progress_of(
                *from,
                progress(number, 1),
                number,
                cell,
                total,
                Wanted::Data,
            )?;
            let theirs = parts(*from);
            if theirs.is_empty() {
                continue;
            }
            copied(w.read(theirs.start as u64, &mut output[theirs]), *from)?;
        }
        Ok(())
    }

    /// [`NodeRegion::all_reduce_long`] through the staging areas, begun
    /// in `cell`: in rounds of a window of at most an area, each process
    /// copies the parts of its window that others reduce into its area,
    /// reduces its own part of every process's (module docs) and leaves
    /// the result in its area, and copies the others' results. Each byte
    /// is copied into shared memory once and out of it once or twice.
    fn all_reduce_in_rounds(
        &self,
        number: u32,
        cell: usize,
        acc: &mut Segments,
        red: &Reduction,
    ) -> Result<()> {
        let element = red.unit_size();
        let total = acc.len();
        let window = self.area / element * element;
        // No part is longer than this, nor a piece.
        let longest_part = (window.min(total) / element).div_ceil(self.size) * element;
        let piece = ((CHUNK / element).max(1) * element).min(longest_part);
        let (mut fold, mut input) = (Scratch::zeroed(piece), Scratch::zeroed(piece));
        let mut step = 0;
        // A round's window is taken from the data and left there again
        // (a segment: packed and unpacked where it is not contiguous).
        for (round, range) in acc.ranges(window, element).enumerate() {
            let w = acc.load(range.clone())?;
            // Every process picks the same area for a round (a count of
            // rounds made could differ between processes whose calls
            // failed), and rounds alternate.
            let area = (number as usize + round) % AREAS;
            // Every process has read the area's last results.
            let free = self.free_after[area].load(Ordering::Relaxed);
            if free != 0 {
                self.wait_for_progress(free, number, cell, total, Wanted::Reads)?;
            }
            let elements = w.len() / element;
            let parts = |q: usize| part(elements, self.size, q, element);
            for q in self.others() {
                self.write_staged(area, parts(q).start, &w[parts(q)])?;
            }
            step += 1;
            self.publish_progress(number, step)?;
            let copied_in = progress(number, step);
            if round == 0 {
                self.wait_for_progress(copied_in, number, cell, total, Wanted::Data)?;
                // Every process stamped its cell before its progress.
                self.everyone_reached(number);
                if let Err(e) = self.same_lengths(number, cell, total) {
                    // Every process sees a length that differs, and stops
                    // here: none reads the area again.
                    self.free_after[area].store(copied_in, Ordering::Relaxed);
                    return Err(e);
                }
            }
            // This process's part of every process's window, combined a
            // piece at a time (which stays in the cache), left in its area.
            let mine = parts(self.rank);
            let pieces = |mine: std::ops::Range<usize>| {
                (mine.start..mine.end)
                    .step_by(piece.max(1))
                    .map(move |at| at..(at + piece).min(mine.end))
            };
            if red.is_commutative() {
                // Each process's part as soon as it is in, in turn from
                // the next: no process waits for the last to copy in
                // before it starts (16 processes on 16 cores, 64 KiB:
                // 32-36 us so, 41-45 waiting for all).
                for from in self.in_turn() {
                    self.wait_for_progress_of(from, copied_in, number, cell, total, Wanted::Data)?;
                    for at in pieces(mine.clone()) {
                        let input = &mut input.bytes_mut()[..at.len()];
                        self.read_staged(from, area, at.start, input)?;
                        red.apply(input, &mut w[at])?;
                    }
                }
            } else {
                self.wait_for_progress(copied_in, number, cell, total, Wanted::Data)?;
                for at in pieces(mine.clone()) {
                    let len = at.len();
                    self.fold_in_rank_order(
                        &mut w[at.clone()],
                        &mut fold.bytes_mut()[..len],
                        &mut input.bytes_mut()[..len],
                        red,
                        0..self.size,
                        |from, buf| self.read_staged(from, area, at.start, buf).map(|()| true),
                    )?;
                }
            }
            self.write_staged(area, mine.start, &w[mine])?;
            step += 1;
            self.publish_progress(number, step)?;
            // Each other's results as soon as they are out.
            for q in self.in_turn() {
                self.wait_for_progress_of(
                    q,
                    progress(number, step),
                    number,
                    cell,
                    total,
                    Wanted::Data,
                )?;
                let part = parts(q);
                self.read_staged(q, area, part.start, &mut w[part])?;
            }
            // The next progress says this process has read them.
            self.free_after[area].store(progress(number, step + 1), Ordering::Relaxed);
            acc.store(range)?;
        }
        self.publish_progress(number, step + 1)
    }

    /// Whether a broadcast of `len` bytes (`parts` 1), or an all-to-all of
    /// `parts` blocks of `len` bytes, goes by single copies between the
    /// processes' buffers (cross-memory attach), rather than through the
    /// staging areas.
    fn copies_directly(&self, len: usize, parts: usize) -> bool {
        // The stamp announces all the data.
        let announced = len.checked_mul(parts);
        let least = match (self.size, parts) {
            (2, _) => DIRECT_MIN_PAIR,
            // A broadcast of three processes or more.
            (_, 1) => return false,
            _ => DIRECT_MIN,
        };
        self.pids.is_some() && len >= least && announced.is_some_and(|all| all < STAMPED as usize)
    }

    /// How a broadcast of `len` bytes, too long for a slot, streams
    /// through the root's staging areas; `None` if it cannot.
    pub(crate) fn broadcast_ring(&self, len: usize) -> Option<Ring> {
        self.ring(len, 1)
    }

    /// How an all-to-all of blocks of `block` bytes, too long for a slot,
    /// streams through the staging areas; `None` if it cannot.
    pub(crate) fn all_to_all_ring(&self, block: usize) -> Option<Ring> {
        // The stamp announces all the blocks.
        let len = block.checked_mul(self.size)?;
        self.ring(block, self.size - 1)
            .filter(|_| len < STAMPED as usize)
    }

    /// Cuts data of `parts` parts of `len` bytes each into pieces that
    /// stream through a process's staging areas, seen as one ring of
    /// slots: a piece is `ring.part` bytes of every part, in one slot.
    fn ring(&self, len: usize, parts: usize) -> Option<Ring> {
        let ring = AREAS * self.area;
        // Room for the pieces of at least `MIN_SLOTS` rounds.
        let most = ring / (MIN_SLOTS * parts.max(1));
        if most == 0 || len == 0 || len >= STAMPED as usize {
            return None;
        }
        let wanted = len.div_ceil(PIPELINE).max(PIECE_MIN).min(most);
        let part = if wanted >= LINE {
            wanted / LINE * LINE
        } else {
            wanted
        };
        Some(Ring {
            part,
            slots: ring / (part * parts.max(1)),
            pieces: len.div_ceil(part),
        })
    }

    /// `MPI_Bcast` of `data` from `root`, too long for a slot: between
    /// two processes by single copies between their buffers from
    /// [`DIRECT_MIN_PAIR`] bytes where they work, else streamed through
    /// the root's staging areas
    /// (cut as [`NodeRegion::broadcast_ring`] said, `ring`). A root whose
    /// data is not contiguous has no buffer to copy from, and streams it
    /// (its cell publishes no address, which tells the others).
    pub(crate) fn broadcast_long(
        &self,
        number: u32,
        root: usize,
        data: &mut Pieces<'_>,
        ring: Ring,
    ) -> Result<()> {
        let len = data.len();
        if !self.copies_directly(len, 1) {
            let cell = self.begin(number, len, |_| Ok(()))?;
            return self.broadcast_staged(number, cell, root, data, ring);
        }
        let own = self.copied_from(data, &ring);
        let cell = self.begin_direct(number, len, own.map(|own| [own]))?;
        if self.rank == root {
            // What its cell says.
            return match (own, data.bytes()) {
                (Some(_), Some(bytes)) => self.broadcast_direct_root(number, cell, bytes),
                _ => self.broadcast_staged(number, cell, root, data, ring),
            };
        }
        let published = self.wait_for(root, number, cell)?;
        let outcome =
            match check_len(published.len, len, root).and_then(|()| self.remote(&published, 0)) {
                Ok(None) => return self.broadcast_staged(number, cell, root, data, ring),
                // The root copies the last share into a buffer whose address
                // this process published; it copies the rest, or all.
                Ok(Some(w)) => {
                    let share = if own.is_some() {
                        len - len / self.size
                    } else {
                        len
                    };
                    copy_out(&w, 0, data, 0..share, &mut Vec::new(), root)
                }
                Err(e) => Err(e),
            };
        let outcome = self.finish_direct(number, cell, len, 1, outcome);
        if own.is_none() {
            return outcome;
        }
        // The root's share has arrived once its progress says so.
        outcome.and_then(|()| {
            self.wait_for_progress_of(root, progress(number, 1), number, cell, len, Wanted::Data)
        })
    }

    /// The root's part of a broadcast of `buf` by single copies: every
    /// other process copies all but the last share of it (one share per
    /// process) into its own buffer, while the root copies that share
    /// into each of theirs (a process whose data is not contiguous
    /// published no buffer, and copies all); the root leaves once every
    /// process has its data (it must not change the buffer before).
    fn broadcast_direct_root(&self, number: u32, cell: usize, buf: &[u8]) -> Result<()> {
        let len = buf.len();
        let tail = len - len / self.size..len;
        let mut outcome = Ok(());
        for from in self.others() {
            let published = match self.wait_for(from, number, cell) {
                Ok(published) => published,
                Err(e) => {
                    // The others may be copying from this buffer.
                    outcome = outcome.and(Err(e));
                    continue;
                }
            };
            // A process that passed another length fails its call and
            // takes nothing.
            if published.len == len {
                let copied = self.remote(&published, 0).and_then(|w| {
                    w.map_or(Ok(()), |w| {
                        copied(w.write(tail.start as u64, &buf[tail.clone()]), from)
                    })
                });
                outcome = outcome.and(copied);
            }
        }
        self.finish_direct(number, cell, len, 1, outcome)
    }

    /// `MPI_Alltoall` of `send` into `recv`, `size` blocks of `block`
    /// bytes each, too long for a slot: by single copies between the
    /// processes' buffers from [`DIRECT_MIN`] bytes a block
    /// ([`DIRECT_MIN_PAIR`] between two processes) where they work, each process copying its block of every other's `send` into
    /// its `recv` (a piece at a time, unpacked, where `recv` is not
    /// contiguous) and leaving once every process has copied its blocks
    /// out of its `send`; else streamed through the staging areas (cut as
    /// [`NodeRegion::all_to_all_ring`] said, `ring`). If any process's
    /// `send` is not contiguous, it has no buffer to copy from, and all
    /// stream (its cell publishes no address, which tells the others).
    pub(crate) fn all_to_all_long(
        &self,
        number: u32,
        send: &mut Pieces<'_>,
        recv: &mut Pieces<'_>,
        block: usize,
        ring: Ring,
    ) -> Result<()> {
        let len = send.len();
        if !self.copies_directly(block, self.size) {
            let cell = self.begin(number, len, |_| Ok(()))?;
            return self.all_to_all_staged(number, cell, send, recv, block, ring);
        }
        let own = self.copied_from(send, &ring);
        let cell = self.begin_direct(number, len, own.map(|own| [own]))?;
        // The buffers of the others that passed this length; one that
        // passed another fails its call and takes nothing, and those that
        // passed this one agree on whether all stream.
        let (mut sources, mut streams) = (Vec::with_capacity(self.size), own.is_none());
        let (mut outcome, mut mismatch) = (Ok(()), Ok(()));
        for from in self.others() {
            let published = match self.wait_for(from, number, cell) {
                Ok(published) => published,
                Err(e) => {
                    outcome = Err(e);
                    break;
                }
            };
            if let Err(e) = check_len(published.len, len, from) {
                mismatch = mismatch.and(Err(e));
                continue;
            }
            match self.remote(&published, 0) {
                Ok(Some(w)) => sources.push((from, w)),
                Ok(None) => streams = true,
                Err(e) => outcome = outcome.and(Err(e)),
            }
        }
        if streams && outcome.is_ok() {
            return self.all_to_all_staged(number, cell, send, recv, block, ring);
        }
        let mine = self.rank * block..(self.rank + 1) * block;
        if outcome.is_ok() {
            outcome = copy_block(send, recv, mine.clone());
        }
        // Process `i` copies from `i + 1`, `i + 2`, ... in turn, so that
        // each buffer has one reader at a time, as in a pairwise exchange
        // (16 processes on 16 cores, 64 KiB blocks: 222 us so, 406 with
        // every process starting at rank 0).
        let first_after = sources.partition_point(|(from, _)| *from < self.rank);
        sources.rotate_left(first_after);
        let mut scratch = Vec::new();
        for (from, w) in &sources {
            if outcome.is_err() {
                break;
            }
            let into = from * block..(from + 1) * block;
            outcome = copy_out(w, mine.start, recv, into, &mut scratch, *from);
        }
        let outcome = self
            .finish_direct(number, cell, len, 1, outcome)
            .and(mismatch);
        if outcome.is_ok() {
            // Every process stamped its cell.
            self.everyone_reached(number);
        }
        outcome
    }

    /// The address this process publishes for `data` in a collective by
    /// single copies: its own bytes, or none where it is not contiguous,
    /// or where the region is [crowded](NodeRegion::crowded) and the data
    /// fits `ring` (streamed so, no writer waits for its readers) —
    /// there, streaming beats single copies, whose every process waits
    /// for every other twice (3 ranks on 2 cores broadcast 32-256 KiB in
    /// 9-30 us so, 47-99 us by single copies). A root or sender that
    /// publishes none makes the collective stream.
    fn copied_from(&self, data: &Pieces<'_>, ring: &Ring) -> Option<*const u8> {
        let streams = self.crowded && ring.pieces <= ring.slots;
        data.bytes().filter(|_| !streams).map(<[u8]>::as_ptr)
    }

    /// Starts this process's part of collective `number` by single
    /// copies: its stamp announces `len` bytes, and its cell holds the
    /// address of its buffer, or [`NO_ADDRESS`] if it has none to copy
    /// from or into (its data is not contiguous).
    fn begin_direct<const N: usize>(
        &self,
        number: u32,
        len: usize,
        bufs: Option<[*const u8; N]>,
    ) -> Result<usize> {
        if len >= STAMPED as usize {
            return Err(outside(len, STAMPED as usize));
        }
        let mut addresses = [0u8; INLINE];
        for (k, word) in addresses.chunks_exact_mut(8).take(N).enumerate() {
            let address = bufs.map_or(NO_ADDRESS, |bufs| bufs[k] as u64);
            word.copy_from_slice(&address.to_ne_bytes());
        }
        self.begin(number, len, |cell| {
            if N * 8 <= INLINE
                && self
                    .region
                    .write(self.cell_offset(self.rank, cell) + 8, &addresses[..N * 8])
            {
                Ok(())
            } else {
                Err(outside(N * 8, INLINE))
            }
        })
    }

    /// Ends this process's part of collective `number` by single copies
    /// with `outcome`: publishes that it has copied all it will (step 1,
    /// or [`ABORTED`] when its own copies failed), and waits until every
    /// process has copied what it needed from this one's buffer.
    fn finish_direct(
        &self,
        number: u32,
        cell: usize,
        len: usize,
        last: u32,
        outcome: Result<()>,
    ) -> Result<()> {
        let done = progress(number, if outcome.is_ok() { last } else { ABORTED });
        self.publish(self.progress_word(self.rank)?, done);
        self.wait_for_progress(progress(number, last), number, cell, len, Wanted::Reads)?;
        outcome
    }

    /// The buffer `published` names in its process's memory, or `None`
    /// if it named none (its data is not contiguous).
    fn remote(&self, published: &Published, k: usize) -> Result<Option<RemoteWindow>> {
        let unreachable = || {
            Error::new(
                ErrorClass::Other,
                format!(
                    "rank {} published a buffer this process cannot reach",
                    published.from
                ),
            )
        };
        let mut address = [0u8; 8];
        let start = self.cell_offset(published.from, published.cell) + 8 + 8 * k;
        if k >= INLINE / 8 || !self.region.read(start, &mut address) {
            return Err(unreachable());
        }
        let address = u64::from_ne_bytes(address);
        if address == NO_ADDRESS {
            return Ok(None);
        }
        let pid = self.pids.as_ref().and_then(|pids| pids.get(published.from));
        pid.and_then(|&pid| RemoteWindow::new(pid, address, published.len as u64))
            .map(Some)
            .ok_or_else(unreachable)
    }

    /// `MPI_Bcast` of `data` from `root` (cut as `ring` says), streamed
    /// through the root's staging areas: the root copies a piece in while
    /// the others copy the pieces before out. This process has begun it
    /// in `cell`.
    fn broadcast_staged(
        &self,
        number: u32,
        cell: usize,
        root: usize,
        data: &mut Pieces<'_>,
        ring: Ring,
    ) -> Result<()> {
        let len = data.len();
        let at_root = self.rank == root;
        let sources: &[usize] = if at_root { &[] } else { &[root] };
        let data = std::cell::RefCell::new(data);
        // Non-contiguous data is packed and unpacked through a piece's
        // worth of memory.
        let (mut packing, mut unpacking) = (Vec::new(), Vec::new());
        self.stream(
            number,
            cell,
            &ring,
            len,
            at_root,
            sources,
            |k, slot| {
                let range = ring.range(k, len);
                put_piece(&slot, 0, &mut data.borrow_mut(), range, &mut packing)
            },
            |k, _, slot| {
                let range = ring.range(k, len);
                take_piece(&slot, 0, &mut data.borrow_mut(), range, &mut unpacking)
            },
        )
    }

    /// `MPI_Alltoall` of `send` into `recv`, `size` blocks of `block`
    /// bytes each (cut as `ring` says), streamed through every process's
    /// staging areas: each process copies a piece of its blocks for the
    /// others in (slot part `i` for the `i`-th other process) while it
    /// copies its own pieces of the others' blocks out. This process has
    /// begun it in `cell`.
    fn all_to_all_staged(
        &self,
        number: u32,
        cell: usize,
        send: &mut Pieces<'_>,
        recv: &mut Pieces<'_>,
        block: usize,
        ring: Ring,
    ) -> Result<()> {
        let len = send.len();
        // This process's own block (a piece at a time where the data is
        // not contiguous).
        copy_block(send, recv, self.rank * block..(self.rank + 1) * block)?;
        // Non-contiguous data is packed and unpacked through a piece's
        // worth of memory.
        let (mut packing, mut unpacking) = (Vec::new(), Vec::new());
        let others: Vec<usize> = self.others().collect();
        // Where the blocks of `to` are in a slot of `from`'s.
        let part_of = |from: usize, to: usize| (to - usize::from(to > from)) * ring.part;
        // Bytes `piece` of block `of`.
        let of_block = |of: usize, piece: std::ops::Range<usize>| {
            of * block + piece.start..of * block + piece.end
        };
        self.stream(
            number,
            cell,
            &ring,
            len,
            true,
            &others,
            |k, slot| {
                for &to in &others {
                    let range = of_block(to, ring.range(k, block));
                    put_piece(&slot, part_of(self.rank, to), send, range, &mut packing)?;
                }
                Ok(())
            },
            |k, from, slot| {
                let range = of_block(from, ring.range(k, block));
                take_piece(&slot, part_of(from, self.rank), recv, range, &mut unpacking)
            },
        )?;
        // Every process stamped its cell before its first piece.
        self.everyone_reached(number);
        Ok(())
    }

    /// Streams pieces through the staging areas, seen as rings of
    /// `ring.slots` slots: for piece `k`, a writer (`writes`) waits until
    /// every process has read the slot's last piece, `produce`s it into
    /// its slot `k % slots` and publishes progress `k + 1`; then it
    /// `consume`s piece `k - 1` of every one of `sources` once they have
    /// published it. A process has read piece `j` once its progress is
    /// `j + 3` or its last (`pieces + 1`): with at least three slots no
    /// writer waits for a process that waits for it. Every process
    /// announced `len` bytes in its cell (checked for each source before
    /// its first piece is read). Whatever the outcome, the process's
    /// progress says at the end that it reads nothing more: its last
    /// step, or [`ABORTED`] when it gave up (its own pieces may then be
    /// missing, and a process waiting for them fails).
    #[allow(clippy::too_many_arguments)]
    fn stream(
        &self,
        number: u32,
        cell: usize,
        ring: &Ring,
        len: usize,
        writes: bool,
        sources: &[usize],
        mut produce: impl FnMut(usize, Slot<'_>) -> Result<()>,
        mut consume: impl FnMut(usize, usize, Slot<'_>) -> Result<()>,
    ) -> Result<()> {
        let pieces = ring.pieces;
        // This process has read all it needed of earlier collectives: a
        // process that waits for that (to write its areas again) need not
        // wait for this one's part in one it missed (its call failed).
        self.publish_progress(number, 0)?;
        let mut run = || -> Result<()> {
            if writes {
                // Every process has read what earlier collectives left
                // in the areas.
                for free in &self.free_after {
                    let free = free.load(Ordering::Relaxed);
                    if free != 0 {
                        self.wait_for_progress(free, number, cell, len, Wanted::Reads)?;
                    }
                }
            }
            for k in 0..=pieces {
                if k < pieces {
                    if writes {
                        if k >= ring.slots {
                            let read = progress(number, step(k - ring.slots + 3)?);
                            self.wait_for_progress(read, number, cell, len, Wanted::Reads)?;
                        }
                        produce(k, self.slot(self.rank, ring, k))?;
                    }
                    self.publish_progress(number, step(k + 1)?)?;
                }
                if k == 0 {
                    continue;
                }
                for &from in sources {
                    let there = progress(number, step(k)?);
                    self.wait_for_progress_of(from, there, number, cell, len, Wanted::Data)?;
                    if k == 1 {
                        self.same_length(from, number, cell, len)?;
                    }
                    consume(k - 1, from, self.slot(from, ring, k - 1))?;
                }
            }
            Ok(())
        };
        let outcome = run();
        let done = progress(number, step(pieces + 1)?);
        if writes {
            // Every process has read this collective's pieces once its
            // progress is the last, or once it gave up.
            for free in &self.free_after {
                free.store(done, Ordering::Relaxed);
            }
        }
        // A process that gave up reads nothing more; its pieces are
        // incomplete, which ABORTED tells the others.
        let last = if outcome.is_ok() {
            done
        } else {
            progress(number, ABORTED)
        };
        self.publish(self.progress_word(self.rank)?, last);
        outcome
    }

    /// Slot `k % slots` of `rank`'s ring.
    fn slot(&self, rank: usize, ring: &Ring, k: usize) -> Slot<'_> {
        let len = self.area * AREAS / ring.slots;
        Slot {
            region: &self.region,
            start: self.staging_offset(rank, 0) + k % ring.slots * len,
            len,
        }
    }

    /// Starts this process's part of collective `number`, publishing
    /// `data` in its next cell: returns the cell.
    fn enter(&self, number: u32, data: &[u8]) -> Result<usize> {
        self.begin(number, data.len(), |cell| {
            let written = if data.len() <= INLINE {
                self.region
                    .write(self.cell_offset(self.rank, cell) + 8, data)
            } else {
                data.len() <= self.slot
                    && self.region.write(self.slot_offset(self.rank, cell), data)
            };
            if written {
                Ok(())
            } else {
                Err(outside(data.len(), self.slot))
            }
        })
    }

    /// Starts this process's part of collective `number` in its next
    /// cell: once the cell is free, `write(cell)` puts the data in place,
    /// and the stamp announces `len` bytes. Returns the cell.
    fn begin(
        &self,
        number: u32,
        len: usize,
        write: impl FnOnce(usize) -> Result<()>,
    ) -> Result<usize> {
        let entered = self.entered.load(Ordering::Relaxed);
        let cell = (entered % CELLS as u64) as usize;
        if entered >= CELLS as u64 {
            // The cell last held this process's operation before its
            // previous one; every process is done reading it once every
            // process has stamped the previous one or later.
            self.wait_until_everyone_reached(self.last.load(Ordering::Relaxed))?;
        }
        write(cell)?;
        self.publish(self.stamp_word(self.rank, cell)?, Stamp::new(number, len).0);
        self.entered.store(entered + 1, Ordering::Relaxed);
        self.last.store(number, Ordering::Relaxed);
        Ok(cell)
    }

    /// Replaces `acc` (this process's contribution to collective
    /// `number`, published in `cell`) by the data of the processes
    /// `ranks` (every process's, or an intercommunicator's other group's)
    /// combined in rank order.
    fn combine(
        &self,
        number: u32,
        cell: usize,
        acc: &mut [u8],
        red: &Reduction,
        ranks: Range<usize>,
    ) -> Result<()> {
        // Small data (the common case here) needs no allocation; every
        // buffer is 16-byte aligned, as every element type needs.
        let len = acc.len();
        let (mut line_fold, mut line_input): (Aligned<INLINE>, Aligned<INLINE>);
        let (mut stack_fold, mut stack_input): (Aligned<SMALL>, Aligned<SMALL>);
        let (mut heap_fold, mut heap_input);
        let (fold, input) = if len <= INLINE {
            (line_fold, line_input) = (Aligned::zeroed(), Aligned::zeroed());
            (&mut line_fold.0[..len], &mut line_input.0[..len])
        } else if len <= SMALL {
            (stack_fold, stack_input) = (Aligned::zeroed(), Aligned::zeroed());
            (&mut stack_fold.0[..len], &mut stack_input.0[..len])
        } else {
            heap_fold = Scratch::zeroed(len);
            heap_input = Scratch::zeroed(len);
            (heap_fold.bytes_mut(), heap_input.bytes_mut())
        };
        let mut mismatch = None;
        // Every other process's cell read, or only those of `ranks`.
        let read_all = ranks.len() + usize::from(!ranks.contains(&self.rank)) == self.size;
        self.fold_in_rank_order(acc, fold, input, red, ranks, |from, buf| {
            self.take(number, from, cell, 0, buf, &mut mismatch)
        })?;
        if read_all {
            self.everyone_reached(number);
        }
        mismatch.map_or(Ok(()), Err)
    }

    /// Replaces `acc` by `xa op (xa+1 op ( ... ))`, the data of the
    /// processes `ranks` (`a..b`, not empty) in rank order, where
    /// `fetch(k, buf)` puts process `k`'s data in `buf` (false if it has
    /// none, which is then left out): this process's own is `acc`, if it
    /// is among them. `fold` and `input` are buffers as long as `acc`,
    /// aligned for its elements.
    fn fold_in_rank_order(
        &self,
        acc: &mut [u8],
        fold: &mut [u8],
        input: &mut [u8],
        red: &Reduction,
        ranks: Range<usize>,
        mut fetch: impl FnMut(usize, &mut [u8]) -> Result<bool>,
    ) -> Result<()> {
        let (first, last) = (ranks.start, ranks.end - 1);
        // x(last), then x(k) op that for k down to the first; this
        // process's own data is `acc` until the fold replaces it.
        if self.rank == last {
            for from in (first..last).rev() {
                if fetch(from, input)? {
                    red.apply(input, acc)?;
                }
            }
        } else {
            fetch(last, fold)?;
            for from in (first..last).rev() {
                if from == self.rank {
                    red.apply(acc, fold)?;
                } else if fetch(from, input)? {
                    red.apply(input, fold)?;
                }
            }
            acc.copy_from_slice(fold);
        }
        Ok(())
    }

    /// Waits for `from`'s contribution to collective `number` and copies
    /// its bytes from `offset` into `buf`: true if it has them, false if
    /// the contribution has another length than `offset + buf.len()`
    /// (noted in `mismatch`, as a message of that length would be).
    fn take(
        &self,
        number: u32,
        from: usize,
        cell: usize,
        offset: usize,
        buf: &mut [u8],
        mismatch: &mut Option<Error>,
    ) -> Result<bool> {
        let published = self.wait_for(from, number, cell)?;
        if let Err(e) = check_len(published.len, offset + buf.len(), from) {
            mismatch.get_or_insert(e);
            return Ok(false);
        }
        self.read(&published, offset, buf)?;
        Ok(true)
    }

    /// Copies the bytes of `published` from `offset` into `buf`.
    fn read(&self, published: &Published, offset: usize, buf: &mut [u8]) -> Result<()> {
        let start = if published.len <= INLINE {
            self.cell_offset(published.from, published.cell) + 8
        } else {
            self.slot_offset(published.from, published.cell)
        };
        if offset + buf.len() <= published.len && self.region.read(start + offset, buf) {
            Ok(())
        } else {
            Err(outside(offset + buf.len(), self.slot))
        }
    }

    /// The ranks of the other processes.
    fn others(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.size).filter(move |&r| r != self.rank)
    }

    /// The ranks of the other processes in turn from the next one
    /// (wrapping): where each process reads every other's data in this
    /// order, each one's data has one reader at a time.
    fn in_turn(&self) -> impl Iterator<Item = usize> + use<> {
        (self.rank + 1..self.size).chain(0..self.rank)
    }

    /// Notes that every process has stamped collective `number`.
    fn everyone_reached(&self, number: u32) {
        self.reached
            .store(u64::from(number) << 32 | STAMPED, Ordering::Relaxed);
    }

    /// Waits until every process has stamped collective `number` or a
    /// later one.
    fn wait_until_everyone_reached(&self, number: u32) -> Result<()> {
        let known = Stamp(self.reached.load(Ordering::Relaxed)).number();
        if known.is_some_and(|known| not_before(known, number)) {
            return Ok(());
        }
        for from in self.others() {
            self.wait(|| {
                for cell in 0..CELLS {
                    let stamp = self.stamp(from, cell, Ordering::Acquire)?;
                    if stamp.number().is_some_and(|n| not_before(n, number)) {
                        return Ok(true);
                    }
                }
                Ok(false)
            })?;
        }
        self.everyone_reached(number);
        Ok(())
    }

    /// Checks that every process announced `len` bytes for collective
    /// `number` (all have stamped it): else the error of a message of the
    /// other length.
    fn same_lengths(&self, number: u32, cell: usize, len: usize) -> Result<()> {
        self.others()
            .try_for_each(|from| self.same_length(from, number, cell, len))
    }

    /// Checks that `from`, which has stamped collective `number`,
    /// announced `len` bytes: else the error of a message of the other
    /// length.
    fn same_length(&self, from: usize, number: u32, cell: usize, len: usize) -> Result<()> {
        match self.find(from, number, cell)? {
            Found::Here(published) => check_len(published.len, len, from),
            Found::Later => Err(left_early(from)),
            Found::NotYet => Err(Error::new(
                ErrorClass::Intern,
                format!("rank {from} published progress without stamping its cell"),
            )),
        }
    }

    /// Publishes this process's progress `step` in collective `number`
    /// (see [`progress`]), after what it wrote to its area.
    fn publish_progress(&self, number: u32, step: u32) -> Result<()> {
        self.publish(self.progress_word(self.rank)?, progress(number, step));
        Ok(())
    }

    /// Waits until every other process's progress is `target` or later
    /// in collective `number` (stamped in `cell` here, `len` bytes): see
    /// [`NodeRegion::wait_for_progress_of`].
    fn wait_for_progress(
        &self,
        target: u64,
        number: u32,
        cell: usize,
        len: usize,
        wanted: Wanted,
    ) -> Result<()> {
        self.others()
            .try_for_each(|from| self.wait_for_progress_of(from, target, number, cell, len, wanted))
    }

    /// Waits until `from`'s progress is `target` or later in collective
    /// `number`, which this process stamped in `cell` with `len` bytes.
    /// A process that will not get there — it went on to a later
    /// collective without taking part in this one (its call failed
    /// there), announced another length (its call fails), or gave up
    /// ([`ABORTED`]) — is an error where its data is [wanted](Wanted::Data),
    /// and is done where only its reading is (it reads nothing more).
    fn wait_for_progress_of(
        &self,
        from: usize,
        target: u64,
        number: u32,
        cell: usize,
        len: usize,
        wanted: Wanted,
    ) -> Result<()> {
        let word = self.progress_word(from)?;
        let aborted = progress(number, ABORTED);
        let there = || -> Result<bool> {
            let now = word.load(Ordering::Acquire);
            if now == aborted && wanted == Wanted::Data {
                // It gave up on finding another length (most likely this
                // process's): that error, of this process's call too,
                // says more, whichever process saw it first.
                if let Found::Here(published) = self.find(from, number, cell)? {
                    check_len(published.len, len, from)?;
                }
                return Err(gave_up(from));
            }
            Ok(progress_not_before(now, target))
        };
        if there()? {
            return Ok(());
        }
        self.wait(|| {
            if there()? {
                return Ok(true);
            }
            // A process cannot stamp a later collective before its
            // progress in this one is complete; so one that did, and
            // whose progress read after that is still short, left.
            let away = match self.find(from, number, cell)? {
                Found::Later if !there()? => Err(left_early(from)),
                Found::Here(published) if published.len != len => {
                    check_len(published.len, len, from)
                }
                _ => return Ok(false),
            };
            match wanted {
                Wanted::Data => away.map(|()| false),
                Wanted::Reads => Ok(true),
            }
        })
    }

    /// Copies `data` into this process's staging `area` at `offset`.
    fn write_staged(&self, area: usize, offset: usize, data: &[u8]) -> Result<()> {
        if offset + data.len() <= self.area
            && self
                .region
                .write(self.staging_offset(self.rank, area) + offset, data)
        {
            Ok(())
        } else {
            Err(outside(offset + data.len(), self.area))
        }
    }

    /// Copies the bytes at `offset` of `from`'s staging `area` into `buf`.
    fn read_staged(&self, from: usize, area: usize, offset: usize, buf: &mut [u8]) -> Result<()> {
        if offset + buf.len() <= self.area
            && self
                .region
                .read(self.staging_offset(from, area) + offset, buf)
        {
            Ok(())
        } else {
            Err(outside(offset + buf.len(), self.area))
        }
    }

    /// Waits until `from` has published its contribution to collective
    /// `number`: most likely in `cell` (this process's own, as both have
    /// made as many operations unless calls failed). An `MPI_ERR_OTHER`
    /// error if `from` went on to a later collective without it.
    fn wait_for(&self, from: usize, number: u32, cell: usize) -> Result<Published> {
        let mut found = None;
        let mut look = || -> Result<bool> {
            let later = match self.find(from, number, cell)? {
                Found::Here(published) => {
                    found = Some(published);
                    return Ok(true);
                }
                Found::Later => true,
                Found::NotYet => false,
            };
            if later {
                // `from` may have stamped this collective in one cell and
                // then a later one in the other after the first look read
                // the first cell; it cannot stamp a third before this
                // process has stamped a later one, so a second look that
                // follows the later stamp is conclusive.
                if let Found::Here(published) = self.find(from, number, cell)? {
                    found = Some(published);
                    return Ok(true);
                }
                return Err(left_early(from));
            }
            Ok(false)
        };
        if !look()? {
            self.wait(look)?;
        }
        found
            .ok_or_else(|| Error::new(ErrorClass::Intern, "a contribution was found and then lost"))
    }

    /// Looks at `from`'s cells (`cell` first) for its contribution to
    /// collective `number`.
    fn find(&self, from: usize, number: u32, cell: usize) -> Result<Found> {
        let mut later = false;
        for c in [cell, (cell + 1) % CELLS] {
            let stamp = self.stamp(from, c, Ordering::Acquire)?;
            match stamp.number() {
                Some(n) if n == number => {
                    return Ok(Found::Here(Published {
                        from,
                        cell: c,
                        len: stamp.len(),
                    }))
                }
                Some(n) => later |= not_before(n, number),
                None => {}
            }
        }
        Ok(if later { Found::Later } else { Found::NotYet })
    }

    /// Waits until `ready` says so: see the module docs.
    fn wait(&self, ready: impl FnMut() -> Result<bool>) -> Result<()> {
        wait_for_memory_rung(self.crowded, self.doorbell().as_ref(), ready)
    }

    /// Stores `value` in this process's `word` of the region with release
    /// ordering, after the data it announces, and wakes the processes
    /// asleep waiting for a publication.
    fn publish(&self, word: &AtomicU64, value: u64) {
        word.store(value, Ordering::Release);
        if let Some(bell) = self.doorbell() {
            bell.ring();
        }
    }

    /// The region's doorbell, on a line of its own after the staging
    /// areas.
    fn doorbell(&self) -> Option<Doorbell<'_>> {
        self.region
            .doorbell(doorbell_offset(self.size, self.slot, self.area))
    }

    /// The stamp of `rank`'s `cell`.
    fn stamp(&self, rank: usize, cell: usize, order: Ordering) -> Result<Stamp> {
        Ok(Stamp(self.stamp_word(rank, cell)?.load(order)))
    }

    fn stamp_word(&self, rank: usize, cell: usize) -> Result<&AtomicU64> {
        self.region
            .word(self.cell_offset(rank, cell))
            .ok_or_else(|| {
                Error::new(
                    ErrorClass::Intern,
                    format!("the cell of rank {rank} lies outside the shared region"),
                )
            })
    }

    /// Where `rank`'s `cell` starts.
    fn cell_offset(&self, rank: usize, cell: usize) -> usize {
        (rank * CELLS + cell) * LINE
    }

    /// Where the slot of `rank`'s `cell` starts.
    fn slot_offset(&self, rank: usize, cell: usize) -> usize {
        slots_offset(self.size, self.slot, rank) + cell * self.slot
    }

    /// `rank`'s progress word, on a line of its own after the slots.
    fn progress_word(&self, rank: usize) -> Result<&AtomicU64> {
        let offset = self.size * CELLS * (LINE + self.slot) + rank * LINE;
        self.region.word(offset).ok_or_else(|| {
            Error::new(
                ErrorClass::Intern,
                format!("the progress of rank {rank} lies outside the shared region"),
            )
        })
    }

    /// Where `rank`'s staging `area` starts, after the progress lines.
    fn staging_offset(&self, rank: usize, area: usize) -> usize {
        staging_areas_offset(self.size, self.slot, self.area, rank) + area * self.area
    }
}

/// A progress word's value: `step` of collective `number`, in the same
/// layout as a [`Stamp`] (so [`STAMPED`] tells a word ever written).
fn progress(number: u32, step: u32) -> u64 {
    Stamp::new(number, step as usize).0
}

/// Whether progress `word` is `target` or later (number first, then
/// step; numbers modulo 2^32).
fn progress_not_before(word: u64, target: u64) -> bool {
    word & STAMPED != 0 && word.wrapping_sub(target) as i64 >= 0
}

/// Elements `[q * m / n, (q + 1) * m / n)` of `m`, in bytes of
/// `element`-byte elements: process `q`'s part of a window, the parts as
/// even as can be.
fn part(m: usize, n: usize, q: usize, element: usize) -> std::ops::Range<usize> {
    q * m / n * element..(q + 1) * m / n * element
}

/// Copies bytes `range` of `data` into `slot` at `at`: straight from
/// contiguous data, else packed into `scratch` first (grown to a piece).
fn put_piece(
    slot: &Slot<'_>,
    at: usize,
    data: &mut Pieces<'_>,
    range: std::ops::Range<usize>,
    scratch: &mut Vec<u8>,
) -> Result<()> {
    if let Some(bytes) = data.bytes() {
        return slot.write(at, &bytes[range]);
    }
    let len = range.len();
    scratch.resize(scratch.len().max(len), 0);
    data.read(range.start, &mut scratch[..len])?;
    slot.write(at, &scratch[..len])
}

/// Copies the bytes of `slot` at `at` into bytes `range` of `data`:
/// straight into contiguous data, else through `scratch` and unpacked.
fn take_piece(
    slot: &Slot<'_>,
    at: usize,
    data: &mut Pieces<'_>,
    range: std::ops::Range<usize>,
    scratch: &mut Vec<u8>,
) -> Result<()> {
    let whole = range.len();
    fill_in_pieces(data, range, whole, scratch, |offset, buf| {
        slot.read(at + offset, buf)
    })
}

/// Copies the bytes of rank `from`'s buffer `w` from `at` into bytes
/// `range` of `data`: straight into contiguous data, else a
/// [`DIRECT_PIECE`] at a time through `scratch`, unpacked.
fn copy_out(
    w: &RemoteWindow,
    at: usize,
    data: &mut Pieces<'_>,
    range: std::ops::Range<usize>,
    scratch: &mut Vec<u8>,
    from: usize,
) -> Result<()> {
    fill_in_pieces(data, range, DIRECT_PIECE, scratch, |offset, buf| {
        copied(w.read((at + offset) as u64, buf), from)
    })
}

/// Fills bytes `range` of `data` with what `fill(offset, buf)` puts in
/// `buf` (the bytes from `offset` of the range): straight into
/// contiguous data, else at most `piece` bytes at a time through
/// `scratch` (grown to a piece), unpacked.
fn fill_in_pieces(
    data: &mut Pieces<'_>,
    range: std::ops::Range<usize>,
    piece: usize,
    scratch: &mut Vec<u8>,
    mut fill: impl FnMut(usize, &mut [u8]) -> Result<()>,
) -> Result<()> {
    if let Some(bytes) = data.bytes_mut() {
        let len = bytes.len();
        let into = bytes
            .get_mut(range.clone())
            .ok_or_else(|| outside(range.end, len))?;
        return fill(0, into);
    }
    let mut offset = 0;
    while offset < range.len() {
        let len = piece.min(range.len() - offset);
        scratch.resize(scratch.len().max(len), 0);
        fill(offset, &mut scratch[..len])?;
        data.write(range.start + offset, &scratch[..len])?;
        offset += len;
    }
    Ok(())
}

/// Copies bytes `range` of `send` into the same bytes of `recv` (an
/// all-to-all's own block): a piece at a time where either is not
/// contiguous.
fn copy_block(
    send: &Pieces<'_>,
    recv: &mut Pieces<'_>,
    range: std::ops::Range<usize>,
) -> Result<()> {
    let len = range.len();
    copy_across(
        &mut send.outbound(range.clone())?,
        &mut recv.inbound(range)?,
        len,
    )
}

/// Step `k` of a streamed collective, as a progress word holds it.
fn step(k: usize) -> Result<u32> {
    u32::try_from(k)
        .ok()
        .filter(|&k| k < ABORTED)
        .ok_or_else(|| Error::new(ErrorClass::Intern, format!("{k} pieces are too many")))
}

/// The error of a process that gave up a streamed collective, whose data
/// this one waits for.
fn gave_up(from: usize) -> Error {
    Error::new(
        ErrorClass::Other,
        format!("rank {from} gave up this collective before it published all its data"),
    )
}

/// `outcome` of a single copy from or to `from`'s memory, as an MPI
/// error.
fn copied(
    outcome: std::result::Result<(), oxmpi_shm::window::AccessError>,
    from: usize,
) -> Result<()> {
    outcome.map_err(|e| {
        Error::new(
            ErrorClass::Other,
            format!("a copy between this process's memory and rank {from}'s failed: {e}"),
        )
    })
}

/// The error of a process that left a collective the others are in.
fn left_early(from: usize) -> Error {
    Error::new(
        ErrorClass::Other,
        format!(
            "rank {from} went on to a later collective without taking part in this one (its \
             call failed there): the processes' calls no longer agree"
        ),
    )
}

/// Whether this process may use shared memory for collectives, or why not.
fn wanted(n: usize) -> std::result::Result<(), String> {
    if n < 2 {
        return Err("one process".to_owned());
    }
    if std::env::var(COLL_SHM_ENV).is_ok_and(|v| v == "0") {
        return Err(format!("{COLL_SHM_ENV}=0"));
    }
    if !with_device(|d| Ok(d.offers("shm"))).unwrap_or(false) {
        return Err("shared memory is not among this process's transports".to_owned());
    }
    Ok(())
}

/// Bytes of each data slot for `n` processes.
fn slot_bytes(n: usize) -> usize {
    (SLOTS_BUDGET / (CELLS * n)).clamp(SLOT_MIN, SLOT_MAX) / LINE * LINE
}

/// Bytes of each staging area for `n` processes.
fn area_bytes(n: usize) -> usize {
    (STAGING_BUDGET / (AREAS * n)).clamp(AREA_MIN, AREA_MAX) / LINE * LINE
}

/// Where the slots of `rank`'s cells start (in a region of `n` processes
/// with slots of `slot` bytes): after every process's cells.
fn slots_offset(n: usize, slot: usize, rank: usize) -> usize {
    n * CELLS * LINE + rank * CELLS * slot
}

/// Where `rank`'s staging areas start (in a region of `n` processes with
/// slots of `slot` bytes and areas of `area`): after every process's
/// progress line.
fn staging_areas_offset(n: usize, slot: usize, area: usize, rank: usize) -> usize {
    n * (CELLS * (LINE + slot) + LINE) + rank * AREAS * area
}

/// Binds `rank`'s slots and staging areas in `region` (of `n` processes,
/// slots of `slot` bytes, areas of `area`) to this process's NUMA nodes
/// (`oxmpi_shm`'s placement): the process writes them at every operation
/// that uses them, while which processes read them changes from call to
/// call. The cells and progress lines, which every process polls, are
/// left to first touch.
fn place_own_part(
    region: &SharedRegion,
    n: usize,
    slot: usize,
    area: usize,
    rank: usize,
) -> Result<()> {
    let slots = slots_offset(n, slot, rank);
    region.bind_to_own_nodes(
        slots..slots + CELLS * slot,
        format_args!("the slots of rank {rank} of a collectives' region"),
    )?;
    let areas = staging_areas_offset(n, slot, area, rank);
    region.bind_to_own_nodes(
        areas..areas + AREAS * area,
        format_args!("the staging areas of rank {rank} of a collectives' region"),
    )
}

/// Bytes of the region for `n` processes: cells, a slot for each, a
/// progress line each, the staging areas, and the doorbell's line.
fn region_len(n: usize, slot: usize, area: usize) -> usize {
    doorbell_offset(n, slot, area) + LINE
}

/// Where the region's doorbell lies: after every process's cells, slots,
/// progress line and staging areas.
fn doorbell_offset(n: usize, slot: usize, area: usize) -> usize {
    n * (CELLS * (LINE + slot) + LINE + AREAS * area)
}

/// The bits that every process of `t` sets in `yes` (a bitwise-and
/// all-reduce).
fn agree(t: &Team, yes: u64) -> Result<u64> {
    let band = super::op::SystemOperation::bitwise_and();
    let reduction = Reduction::new(&band, crate::datatype::ElementType::of::<u64>())?;
    let mut word = [yes];
    let mut output = Output::new(&mut word[..])?;
    block_on(super::algorithms::all_reduce(
        t,
        output.bytes_mut(),
        &reduction,
    ))?;
    output.finish()?;
    Ok(word[0])
}

/// What a process tells the others of itself when the region is made, to
/// copy from its memory: its id and where its [`PROBE`] is.
struct Peer {
    pid: u32,
    probe: u64,
}

/// A word every process has, at an address it tells the others: a copy
/// of it from every other process shows that cross-memory attach works.
static PROBE: u64 = 0x6f78_6d70_6963_6d61;

/// Whether this process (`rank`) may and can copy from every other's
/// memory: `OXMPI_SHM_CMA` does not forbid it, and a copy of each one's
/// [`PROBE`] works (the kernel may refuse, e.g. under ptrace
/// restrictions).
fn cma_works(rank: usize, peers: &[Peer]) -> bool {
    if std::env::var(oxmpi_shm::CMA_ENV).is_ok_and(|v| v.trim() == "0") {
        vlog!(
            "collectives over shared memory: no single copies ({}=0)",
            oxmpi_shm::CMA_ENV
        );
        return false;
    }
    peers.iter().enumerate().filter(|&(r, _)| r != rank).all(|(r, peer)| {
        let mut word = [0u8; 8];
        let copied = RemoteWindow::new(peer.pid, peer.probe, 8)
            .ok_or_else(|| "a bad process id or address".to_owned())
            .and_then(|w| w.read(0, &mut word).map_err(|e| e.to_string()));
        match copied {
            Ok(()) if u64::from_ne_bytes(word) == PROBE => true,
            Ok(()) => {
                vlog!("collectives over shared memory: no single copies (rank {r}'s probe differs)");
                false
            }
            Err(e) => {
                vlog!("collectives over shared memory: no single copies (from rank {r}: {e})");
                false
            }
        }
    })
}

/// The error of a message of `len` bytes where `expected` were: as the
/// message algorithms report it.
fn check_len(len: usize, expected: usize, from: usize) -> Result<()> {
    match len.cmp(&expected) {
        std::cmp::Ordering::Equal => Ok(()),
        std::cmp::Ordering::Greater => Err(Error::new(
            ErrorClass::Truncate,
            format!("rank {from} contributed {len} bytes where this process expected {expected}"),
        )),
        std::cmp::Ordering::Less => Err(Error::new(
            ErrorClass::Count,
            format!("rank {from} contributed {len} bytes where this process expected {expected}"),
        )),
    }
}

fn outside(len: usize, slot: usize) -> Error {
    Error::new(
        ErrorClass::Intern,
        format!("{len} bytes do not fit a shared slot of {slot}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stamp_holds_the_number_and_the_length() {
        let stamp = Stamp::new(u32::MAX, INLINE);
        assert_eq!(stamp.number(), Some(u32::MAX));
        assert_eq!(stamp.len(), INLINE);
        let empty = Stamp::new(0, 0);
        assert_eq!((empty.number(), empty.len()), (Some(0), 0));
        assert_eq!(Stamp(0).number(), None, "a cell never stamped");
        assert_eq!(Stamp::new(7, SLOT_MAX).len(), SLOT_MAX);
    }

    #[test]
    fn numbers_compare_across_the_wrap() {
        assert!(not_before(5, 5));
        assert!(not_before(6, 5));
        assert!(!not_before(5, 6));
        assert!(not_before(0, u32::MAX), "0 follows 2^32 - 1");
        assert!(!not_before(u32::MAX, 0));
        assert!(not_before(3, u32::MAX - 3));
    }

    #[test]
    fn the_parts_of_a_window_cover_it_in_whole_elements() {
        for (m, n) in [(0, 2), (1, 2), (7, 3), (1000, 8), (5, 8)] {
            let parts: Vec<_> = (0..n).map(|q| part(m, n, q, 8)).collect();
            assert_eq!(parts[0].start, 0);
            assert_eq!(parts[n - 1].end, m * 8);
            for pair in parts.windows(2) {
                assert_eq!(pair[0].end, pair[1].start);
                assert!(pair[1].len() <= pair[0].len() + 8, "{m} {n}: {parts:?}");
            }
        }
    }

    #[test]
    fn progress_orders_numbers_then_steps() {
        assert!(progress_not_before(progress(4, 3), progress(4, 3)));
        assert!(progress_not_before(progress(4, 3), progress(4, 2)));
        assert!(progress_not_before(progress(5, 1), progress(4, 9)));
        assert!(!progress_not_before(progress(4, 2), progress(4, 3)));
        assert!(progress_not_before(progress(0, 1), progress(u32::MAX, 7)));
        assert!(
            !progress_not_before(0, progress(u32::MAX, 7)),
            "never written"
        );
    }

    #[test]
    fn the_region_holds_every_cell_and_slot() {
        for n in [2, 3, 8, 64, 1000] {
            let slot = slot_bytes(n);
            assert!((SLOT_MIN..=SLOT_MAX).contains(&slot), "{n}: {slot}");
            assert_eq!(slot % LINE, 0);
            // The last slot of the last process ends the region.
            let area = area_bytes(n);
            assert!((AREA_MIN..=AREA_MAX).contains(&area), "{n}: {area}");
            let last_area = n * (CELLS * (LINE + slot) + LINE) + (n * AREAS - 1) * area;
            assert_eq!(last_area + area, doorbell_offset(n, slot, area));
            assert_eq!(doorbell_offset(n, slot, area) % LINE, 0);
            assert_eq!(
                doorbell_offset(n, slot, area) + LINE,
                region_len(n, slot, area)
            );
        }
    }
}
