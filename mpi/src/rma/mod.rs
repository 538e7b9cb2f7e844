//! One-sided communication (MPI 4.1 §12): windows, remote memory access
//! operations and their synchronization.
//!
//! A [`Window`] is the seed's `MPIR_Win`: its own copy of the
//! communicator it was made on (so its traffic is apart from everything
//! else), and every rank's base address, size and displacement unit,
//! with "same on all ranks" flags so the local value serves without a
//! table look-up. It is made on memory the program lends
//! ([`Window::create`]), on memory MPI allocates ([`Window::allocate`],
//! or shared memory every rank may load and store:
//! [`Window::allocate_shared`] and [`Window::shared_query`]), or with none, memory being attached later ([`Window::create_dynamic`]).
//!
//! Operations — [`Window::put`], [`Window::get`], [`Window::accumulate`],
//! [`Window::get_accumulate`], [`Window::fetch_and_op`],
//! [`Window::compare_and_swap`] and the request-based `r` forms — reach
//! the target's memory through a per-target path (`path.rs`). Windows
//! that MPI allocates ([`Window::allocate`], [`Window::allocate_shared`])
//! for ranks of one host live in shared memory, and the origin reaches
//! them directly (`direct.rs`): loads, stores and atomics of its own, with
//! no help from the target ([`Window::direct_access`]); windows on the
//! program's memory ([`Window::create`]) are reached directly too on one
//! host, by cross-memory attach. Windows of [`Window::create`] and
//! [`Window::allocate`] whose ranks are reached over the verbs transport
//! are registered memory that the origin's NIC reads, writes and runs
//! atomics on (`rdma.rs`, [`Window::rdma_access`]), again with no help
//! from the target. Other windows are reached by active messages handled by the target's progress
//! engine, so a passive-target operation completes whenever the target
//! is in any MPI call, or at any time when the target runs a progress
//! thread (`OXMPI_ASYNC_PROGRESS=1`).
//!
//! Synchronization: [`Window::fence`]; [`Window::post`],
//! [`Window::start`], [`Window::complete`], [`Window::wait`],
//! [`Window::test`]; [`Window::lock`], [`Window::unlock`],
//! [`Window::lock_all`], [`Window::unlock_all`], the flushes and
//! [`Window::sync`]. The target's lock is fair (first come, first
//! served), so writers are not starved by readers.
//!
//! # Checks
//! Before anything moves: a target outside the window's group is
//! `MPI_ERR_RANK`; an operation with no access epoch to its target is
//! `MPI_ERR_RMA_SYNC`, as is a request-based one (`rput` and the other
//! `r` forms) in a fence or start epoch (MPI 4.1 §12.3.5); a range outside the target's window is
//! `MPI_ERR_RMA_RANGE` (the target checks again, and refuses what the
//! origin could not check, in a dynamic window); buffers of different
//! basic types where they must match are `MPI_ERR_TYPE`; an operation not
//! defined for the type is `MPI_ERR_OP`. Nothing is ever written outside
//! a window or a result buffer.
//!
//! # Data layout at the target
//! The origin's buffer may have any datatype; it is packed. For
//! [`Window::put`], [`Window::get`], [`Window::accumulate`] and the
//! others the target's data is taken to be the packed elements,
//! contiguous from the displacement (the target datatype is the origin's
//! element type, repeated). [`Window::put_typed`], [`Window::get_typed`],
//! [`Window::accumulate_typed`] and [`Window::get_accumulate_typed`] take
//! a target datatype and count besides (`typed.rs`): the data is
//! scattered to (gathered from) the blocks of its type map. Accumulates
//! need elements of one basic type (a predefined type, or a derived one
//! built of a single basic type), or value-index pairs
//! ([`ValueIndex`](crate::collective::ValueIndex): `MPI_DOUBLE_INT` and
//! the other pair types, or a derived type of one) for `MPI_MINLOC` and
//! `MPI_MAXLOC` (and `MPI_REPLACE`, `MPI_NO_OP`).
//!
//! # Memory model and ordering
//! The window's memory is one copy (`MPI_WIN_UNIFIED`), reached by this
//! process through [`Window::read_local`] and [`Window::write_local`],
//! which exclude the handling of remote operations by active messages (on
//! the direct path they are copies, as the origins'). Operations from one
//! origin to one target are applied in the order they were issued, so
//! every `accumulate_ordering` holds.
//!
//! ```no_run
//! use oxmpi::rma::{LockType, Window};
//! let universe = oxmpi::initialize().unwrap();
//! let world = universe.world();
//! let window = Window::allocate(&world, 8 * 16, 8, &oxmpi::Info::new()).unwrap();
//! let next = (world.rank() + 1) % world.size();
//! window.lock(LockType::Exclusive, next, 0).unwrap();
//! window.put(&[world.rank() as u64], next, 0).unwrap();
//! window.unlock(next).unwrap();
//! world.barrier().unwrap();
//! let mut got = [0u64];
//! window.read_local(0, &mut got).unwrap();
//! window.free().unwrap();
//! ```

mod access;
mod direct;
pub(crate) mod path;
pub(crate) mod progress;
mod rdma;
pub(crate) mod target;
mod typed;
mod wire;

use crate::collective::op::PairType;
use crate::collective::typed::Input;
use crate::datatype::{Buffer, BufferMut, ElementType, Equivalence, Incoming, Outgoing, Primitive};
use crate::group::Group;
use crate::request::{Request, Scope};
use crate::{with_device, Communicator, Error, ErrorClass, ErrorHandler, Info, Result, PROC_NULL};
use access::Access;
use direct::Reach;
use oxmpi_adi::device::{Device, RequestId};
use oxmpi_adi::host::HostId;
use oxmpi_adi::transport::PeerRank;
use oxmpi_shm::region::RegionName;
use oxmpi_shm::window::{RemoteWindow, WindowSegment};
use path::{take_errors, Fetch, Path, Target};
use std::marker::PhantomData;
use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard};
use target::{Memory, Shared};

pub use progress::ASYNC_PROGRESS_ENV;
pub(crate) use target::progress;
pub use typed::TargetLayout;
pub use wire::AccumulateOp;
use wire::AccumulateType;

/// Assertion of [`Window::lock`] and friends: no other process holds or
/// asks for a conflicting lock (`MPI_MODE_NOCHECK`).
pub const MODE_NOCHECK: u32 = 1;
/// Assertion: the local window is not written by local stores in the
/// epoch (`MPI_MODE_NOSTORE`).
pub const MODE_NOSTORE: u32 = 2;
/// Assertion: the local window is not the target of puts or accumulates
/// in the epoch (`MPI_MODE_NOPUT`).
pub const MODE_NOPUT: u32 = 4;
/// Assertion of [`Window::fence`]: no operation precedes it
/// (`MPI_MODE_NOPRECEDE`).
pub const MODE_NOPRECEDE: u32 = 8;
/// Assertion of [`Window::fence`]: no operation follows it; it ends the
/// fence epochs (`MPI_MODE_NOSUCCEED`).
pub const MODE_NOSUCCEED: u32 = 16;

/// All the assertion bits.
const MODES: u32 = MODE_NOCHECK | MODE_NOSTORE | MODE_NOPUT | MODE_NOPRECEDE | MODE_NOSUCCEED;

/// The kind of a passive-target lock (`MPI_LOCK_SHARED`,
/// `MPI_LOCK_EXCLUSIVE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockType {
    /// Several origins may hold it at once.
    Shared,
    /// One origin holds it alone.
    Exclusive,
}

/// How a window's memory came to be (`MPI_WIN_CREATE_FLAVOR`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CreateFlavor {
    /// On memory the program lent ([`Window::create`], `MPI_WIN_FLAVOR_CREATE`).
    Create,
    /// On memory MPI allocated ([`Window::allocate`], `MPI_WIN_FLAVOR_ALLOCATE`).
    Allocate,
    /// With memory attached later ([`Window::create_dynamic`], `MPI_WIN_FLAVOR_DYNAMIC`).
    Dynamic,
    /// On shared memory MPI allocated, which every rank may load and store
    /// ([`Window::allocate_shared`], `MPI_WIN_FLAVOR_SHARED`).
    Shared,
}

/// Memory MPI allocated for a window.
enum Allocation {
    /// In this process only, 16-byte aligned.
    Heap(Vec<u128>),
    /// A window segment the other ranks of the host can map, and its
    /// name for them: the window's memory, or for a window on user memory
    /// only its lock and region mutexes.
    Segment(Arc<WindowSegment>, RegionName),
    /// Every rank's part of a contiguous shared window, in one mapping
    /// (`WindowSegment::create_block`), this rank's at `rank`, and the
    /// block's name.
    Block {
        parts: Vec<Arc<WindowSegment>>,
        rank: usize,
        name: RegionName,
    },
}

impl Allocation {
    /// `size` bytes on the heap, zeroed.
    fn heap(size: usize) -> Allocation {
        Allocation::Heap(vec![0u128; size.div_ceil(16)])
    }

    /// `size` bytes, zeroed: in a window segment when `segment` (if the
    /// kernel lets this process make one), else on the heap. The reason
    /// there is no segment, if any.
    fn new(size: usize, segment: bool) -> (Allocation, Option<String>) {
        if !segment {
            return (Allocation::heap(size), None);
        }
        match WindowSegment::create(size) {
            Ok((segment, name)) => (Allocation::Segment(Arc::new(segment), name), None),
            Err(e) => (
                Allocation::heap(size),
                Some(format!("making a window segment failed: {e}")),
            ),
        }
    }

    /// The memory of a shared window (`allocate_shared`) of `size` bytes
    /// at this rank; collective over `comm`, whose ranks all-gather their
    /// sizes and whether they asked for `contiguous` memory (which must
    /// be the same at all, else `MPI_ERR_INFO_VALUE` at all). Contiguous:
    /// every rank's part of one block, made by rank 0 and attached by the
    /// others (the block's name is all-gathered too); else a segment of
    /// its own. On the heap, with the reason, where the shared memory
    /// could not be made or mapped here (the window then fails at every
    /// rank as it chooses its paths).
    fn shared(
        comm: &Communicator,
        size: usize,
        contiguous: bool,
    ) -> Result<(Allocation, Option<String>)> {
        // Each rank's size, whether it asked for contiguous memory, and
        // its host's key.
        const WORDS: usize = 6;
        let mut mine = [0u64; WORDS];
        mine[..2].copy_from_slice(&[size as u64, u64::from(contiguous)]);
        mine[2..].copy_from_slice(&host_words());
        let mut rows = vec![0u64; WORDS * comm.size() as usize];
        comm.all_gather_into_unhandled(&mine[..], &mut rows[..])?;
        if let Some(r) = rows
            .chunks(WORDS)
            .position(|row| row[1] != u64::from(contiguous))
        {
            return Err(Error::new(
                ErrorClass::InfoValue,
                format!(
                    "alloc_shared_noncontig must be the same at every rank of a shared window: \
                     rank {} asked for {} memory, rank {r} not",
                    comm.rank(),
                    if contiguous {
                        "contiguous"
                    } else {
                        "non-contiguous"
                    }
                ),
            ));
        }
        if !contiguous {
            return Ok(Allocation::new(size, true));
        }
        if rows
            .chunks(WORDS)
            .any(|row| row[2..] == [0; 4] || row[2..] != mine[2..])
        {
            // Not mapped at all: a process of the same number on another
            // host is not rank 0.
            let reason = "the ranks are not all on one host".to_owned();
            return Ok((Allocation::heap(size), Some(reason)));
        }
        let sizes: Vec<usize> = rows.chunks(WORDS).map(|row| row[0] as usize).collect();
        let rank = comm.rank() as usize;
        let made = (rank == 0).then(|| WindowSegment::create_block(&sizes));
        let mut names = vec![0u64; 3 * sizes.len()];
        let mine = match &made {
            Some(Ok((_, name))) => name.to_words(),
            _ => [0; 3],
        };
        comm.all_gather_into_unhandled(&mine[..], &mut names[..])?;
        let parts = match made {
            Some(made) => made.map_err(|e| format!("making the window's shared block failed: {e}")),
            None => RegionName::from_words([names[0], names[1], names[2]])
                .ok_or_else(|| "rank 0 could not make the window's shared block".to_owned())
                .and_then(|name| {
                    WindowSegment::attach_block(&name, &sizes)
                        .map(|parts| (parts, name))
                        .map_err(|e| format!("mapping the window's shared block failed: {e}"))
                }),
        };
        // Each rank places its own part, before its part in the
        // collectives that end the window's creation: no rank stores into
        // the block before every part is placed.
        let parts = parts.and_then(|(parts, name)| {
            parts[rank]
                .bind_to_own_nodes()
                .map(|()| (parts, name))
                .map_err(|e| format!("placing this rank's part of the window failed: {e}"))
        });
        Ok(match parts {
            Ok((parts, name)) => (
                Allocation::Block {
                    parts: parts.into_iter().map(Arc::new).collect(),
                    rank,
                    name,
                },
                None,
            ),
            Err(reason) => (Allocation::heap(size), Some(reason)),
        })
    }

    fn base(&mut self) -> *mut u8 {
        match self {
            Allocation::Heap(words) => words.as_mut_ptr().cast(),
            Allocation::Segment(segment, _) => segment.base(),
            Allocation::Block { parts, rank, .. } => parts[*rank].base(),
        }
    }

    /// Stops handing this rank's shared memory over to the other ranks
    /// (`SharedRegion::stop_handover`; nothing if it made none): once
    /// every rank has attached what it needs.
    fn stop_handover(&self) {
        match self {
            Allocation::Heap(_) => {}
            Allocation::Segment(segment, _) => segment.stop_handover(),
            Allocation::Block { parts, rank, .. } => parts[*rank].stop_handover(),
        }
    }

    /// The name other ranks map the memory by, if it is shared.
    fn name(&self) -> Option<&RegionName> {
        match self {
            Allocation::Heap(_) => None,
            Allocation::Segment(_, name) | Allocation::Block { name, .. } => Some(name),
        }
    }
}

/// The memory model of a window (`MPI_WIN_MODEL`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemoryModel {
    /// Public and private copies are one (`MPI_WIN_UNIFIED`): oxmpi's.
    Unified,
    /// Separate public and private copies (`MPI_WIN_SEPARATE`).
    Separate,
}

/// What this rank may access, and what it exposes (its epochs); the
/// passive-target locks it holds are recorded in the [`Access`] bytes
/// alone.
#[derive(Default)]
struct Epochs {
    /// A fence opened an access epoch to every rank.
    fence: bool,
    /// `lock_all`, and whether its locks were taken.
    lock_all: Option<bool>,
    /// The targets of a start (general active target).
    access: Option<Vec<usize>>,
    /// The origins of a post.
    exposure: Option<Vec<usize>>,
}

impl Epochs {
    /// The [`Access`] epoch bits of every target: in one pass over the
    /// targets and the start group (not a look-up in the group per
    /// target: a start group may hold every rank).
    fn epoch_bits(&self, targets: usize) -> Vec<u8> {
        let mut everyone = 0;
        if self.fence {
            everyone |= Access::OPEN;
        }
        if let Some(taken) = self.lock_all {
            everyone |= Access::OPEN | Access::ALL;
            if taken {
                everyone |= Access::ALL_TAKEN;
            }
        }
        if self.access.is_some() {
            everyone |= Access::STARTED;
        }
        let mut bytes = vec![everyone; targets];
        for &target in self.access.iter().flatten() {
            if let Some(byte) = bytes.get_mut(target) {
                *byte |= Access::OPEN;
            }
        }
        bytes
    }
}

/// The epochs, locked; dropping it republishes their [`Access`] bits.
struct EpochsGuard<'w> {
    epochs: MutexGuard<'w, Epochs>,
    bytes: &'w Access,
}

impl EpochsGuard<'_> {
    /// Writes the epochs' bits into every target's [`Access`] byte now;
    /// whether a lock was held on some target as they were written
    /// ([`Access::set_epochs`]).
    fn publish(&self) -> bool {
        self.bytes
            .set_epochs(self.epochs.epoch_bits(self.bytes.targets()))
    }
}

impl std::ops::Deref for EpochsGuard<'_> {
    type Target = Epochs;
    fn deref(&self) -> &Epochs {
        &self.epochs
    }
}

impl std::ops::DerefMut for EpochsGuard<'_> {
    fn deref_mut(&mut self) -> &mut Epochs {
        &mut self.epochs
    }
}

impl Drop for EpochsGuard<'_> {
    fn drop(&mut self) {
        self.publish();
    }
}

/// A window of memory for one-sided communication (`MPI_Win`): see the
/// module docs. Freed by [`Window::free`] (collective); it borrows the
/// memory it was made on for `'a`.
pub struct Window<'a> {
    /// The window's own copy of the communicator
    /// (`Communicator::private_copy`: no attributes, no copy callbacks),
    /// which keeps its name and error handler.
    comm: Communicator,
    context_id: u32,
    shared: Arc<Shared>,
    rank: usize,
    members: Arc<[PeerRank]>,
    /// Every rank's base address, size and displacement unit, and the
    /// size and the unit when each is the same on all ranks (read by
    /// every operation's range check in place of the target's entry:
    /// one load and no bounds check).
    bases: Vec<usize>,
    sizes: Vec<usize>,
    disp_units: Vec<usize>,
    same_size: Option<usize>,
    same_disp_unit: Option<usize>,
    flavor: CreateFlavor,
    /// The path to each target: all direct, or all active messages.
    paths: Vec<Path>,
    hints: Info,
    no_locks: bool,
    epochs: Mutex<Epochs>,
    /// Every target's [`Access`] byte: the epochs' bits, as of their
    /// last change, and the lock this rank holds on it.
    access: Access,
    /// This rank's registrations of the RDMA path: dropped (revoked)
    /// before the memory goes.
    _rdma: Option<rdma::Registration>,
    /// Memory MPI allocated for the window.
    _allocated: Option<Allocation>,
    freed: bool,
    /// The memory borrowed for `'a`, invariantly: were `Window<'a>`
    /// covariant in `'a` (as `&'a mut [u8]` is), a `&Window<'long>` would
    /// pass for a `&Window<'short>`, and [`Window::attach`] would take
    /// memory that is dropped while the window still exposes it.
    _memory: PhantomData<&'a mut &'a mut [u8]>,
}

/// Words per rank in the creation all-gather: base, size, displacement
/// unit, window segment name (3), host key (4).
const ROW: usize = 10;

/// One rank's part of a window as [`Window::shared_query`] finds it:
/// memory that every rank of the window may load and store at any time,
/// so it is reached through raw pointers or copies, never as a Rust
/// slice of plain data; or, where that rank's memory is not shared with
/// this process, an empty part (MPI's size 0 and null base).
#[derive(Debug)]
pub struct SharedPart<'w> {
    segment: Option<&'w WindowSegment>,
    disp_unit: usize,
}

impl SharedPart<'_> {
    /// The part's first byte in this process (page-aligned); null for an
    /// empty part.
    pub fn base(&self) -> *mut u8 {
        self.segment
            .map_or(std::ptr::null_mut(), WindowSegment::base)
    }

    /// Its size in bytes: 0 where the memory is not shared.
    pub fn size(&self) -> usize {
        self.segment.map_or(0, WindowSegment::size)
    }

    /// Its owner's displacement unit.
    pub fn disp_unit(&self) -> usize {
        self.disp_unit
    }

    /// Copies the part's bytes at `offset` into `out`; a range outside
    /// the part is `MPI_ERR_RMA_RANGE` and copies nothing.
    pub fn read<T: Equivalence>(&self, offset: usize, out: &mut [T]) -> Result<()> {
        let len = std::mem::size_of_val(out);
        let segment = self.shared(offset, len)?;
        // SAFETY: `out` is `len` writable bytes, and any bytes are a
        // valid `T` (`Equivalence` types are plain data).
        let bytes = unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr().cast::<u8>(), len) };
        segment
            .read(offset, bytes)
            .map_err(|e| Error::new(ErrorClass::RmaRange, e.to_string()))
    }

    /// Copies `data` into the part at `offset`; a range outside the part
    /// is `MPI_ERR_RMA_RANGE` and writes nothing.
    pub fn write<T: Equivalence>(&self, offset: usize, data: &[T]) -> Result<()> {
        let len = std::mem::size_of_val(data);
        let segment = self.shared(offset, len)?;
        // SAFETY: `data` is `len` readable bytes of plain data.
        let bytes = unsafe { std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), len) };
        segment
            .write(offset, bytes)
            .map_err(|e| Error::new(ErrorClass::RmaRange, e.to_string()))
    }

    /// The shared memory, or the range error of `len` bytes at `offset`
    /// in an empty part.
    fn shared(&self, offset: usize, len: usize) -> Result<&WindowSegment> {
        self.segment.ok_or_else(|| {
            Error::new(
                ErrorClass::RmaRange,
                format!(
                    "{len} bytes at offset {offset} lie outside an empty part: this rank's \
                     memory is not shared with this process (size 0)"
                ),
            )
        })
    }
}

/// The hints a window knows, with their defaults.
const HINTS: [(&str, &str); 4] = [
    ("no_locks", "false"),
    ("accumulate_ordering", "rar,raw,war,waw"),
    ("same_size", "false"),
    ("same_disp_unit", "false"),
];

impl<'a> Window<'a> {
    /// Makes a window on `memory` (`MPI_Win_create`), with displacements
    /// in units of `disp_unit` bytes; collective over `comm`. The memory
    /// is the window's until it is freed. On one host with shared memory
    /// and cross-memory attach, the other ranks reach it directly
    /// (`process_vm_readv`/`writev`); dropped without [`Window::free`], it
    /// is closed to them first.
    #[doc(alias = "MPI_Win_create")]
    pub fn create<T: Equivalence>(
        comm: &Communicator,
        memory: &'a mut [T],
        disp_unit: usize,
        info: &Info,
    ) -> Result<Window<'a>> {
        let size = std::mem::size_of_val(memory);
        let base = memory.as_mut_ptr().cast::<u8>();
        let result = Window::direct_wanted(comm).and_then(|wanted| {
            // The lock and region mutexes of the direct path, if it can be
            // taken; the data stays in `memory`.
            let control = match wanted.then(|| Allocation::new(direct::control_size(size), true)) {
                Some((control, None)) => Some(control),
                Some((_, Some(reason))) => {
                    oxmpi_adi::vlog!("window of {size} bytes: {reason}");
                    None
                }
                None => None,
            };
            Window::make(
                comm,
                Memory::Block { base, size },
                (base as usize, size, disp_unit),
                CreateFlavor::Create,
                control,
                info,
            )
        });
        comm.handled(result)
    }

    /// Whether a window of `Window::create` or `Window::allocate` may
    /// take the direct path from this rank: it runs the shared-memory
    /// transport, or is alone (a job of one rank starts no transport to
    /// other ranks). With `OXMPI_TRANSPORTS=tcp` a window of several ranks
    /// is reached by messages; a created window also needs cross-memory
    /// attach (not turned off by `OXMPI_SHM_CMA=0`).
    fn direct_wanted(comm: &Communicator) -> Result<bool> {
        Ok(comm.size() == 1
            || (with_device(|d| Ok(d.offers("shm")))?
                && std::env::var(oxmpi_shm::CMA_ENV).as_deref() != Ok("0")))
    }

    /// Makes a window on `size` bytes that MPI allocates, zeroed and
    /// aligned for any basic type (`MPI_Win_allocate`); collective.
    #[doc(alias = "MPI_Win_allocate")]
    pub fn allocate(
        comm: &Communicator,
        size: usize,
        disp_unit: usize,
        info: &Info,
    ) -> Result<Window<'a>> {
        comm.handled(Window::make_allocated(
            comm,
            size,
            disp_unit,
            CreateFlavor::Allocate,
            info,
        ))
    }

    /// Makes a window on `size` bytes of shared memory that MPI allocates,
    /// zeroed (`MPI_Win_allocate_shared`); collective over a communicator
    /// whose ranks share one host (else `MPI_ERR_RMA_SHARED`, as when the
    /// kernel refuses the mapping). Every rank reaches every rank's part
    /// with loads and stores through [`Window::shared_query`]. The parts
    /// are one contiguous block in each process, rank after rank (rank
    /// r's first byte follows rank r - 1's last; rank 0's is
    /// page-aligned), unless the info key `alloc_shared_noncontig` is
    /// `"true"`: then each part is a page-aligned mapping of its own
    /// (another value than `"true"` or `"false"` is
    /// `MPI_ERR_INFO_VALUE`). RMA operations on it take the direct path.
    #[doc(alias = "MPI_Win_allocate_shared")]
    pub fn allocate_shared(
        comm: &Communicator,
        size: usize,
        disp_unit: usize,
        info: &Info,
    ) -> Result<Window<'a>> {
        comm.handled(Window::make_allocated(
            comm,
            size,
            disp_unit,
            CreateFlavor::Shared,
            info,
        ))
    }

    /// `allocate` and `allocate_shared`: the memory is a window segment
    /// (for `allocate_shared`, by default this rank's part of one block
    /// of all ranks' parts) where this rank may share memory (for
    /// `allocate`, where it runs the
    /// shared-memory transport, or is alone: with `OXMPI_TRANSPORTS=tcp` a
    /// window of several ranks is reached by messages; cross-memory attach
    /// is not needed).
    fn make_allocated(
        comm: &Communicator,
        size: usize,
        disp_unit: usize,
        flavor: CreateFlavor,
        info: &Info,
    ) -> Result<Window<'a>> {
        let (mut allocated, refused) = if flavor == CreateFlavor::Shared {
            let contiguous = match info.get("alloc_shared_noncontig")?.unwrap_or("false") {
                "true" => false,
                "false" => true,
                other => {
                    return Err(Error::new(
                        ErrorClass::InfoValue,
                        format!("alloc_shared_noncontig is \"true\" or \"false\", not {other:?}"),
                    ))
                }
            };
            Allocation::shared(comm, size, contiguous)?
        } else {
            let segment = comm.size() == 1 || with_device(|d| Ok(d.offers("shm")))?;
            Allocation::new(size, segment)
        };
        if let Some(reason) = &refused {
            oxmpi_adi::vlog!("window of {size} bytes: {reason}");
        }
        let base = allocated.base();
        Window::make(
            comm,
            Memory::Block { base, size },
            (base as usize, size, disp_unit),
            flavor,
            Some(allocated),
            info,
        )
    }

    /// Makes a window with no memory (`MPI_Win_create_dynamic`);
    /// collective. Memory is attached with [`Window::attach`], and
    /// displacements are addresses (as [`Window::attach`] returns).
    #[doc(alias = "MPI_Win_create_dynamic")]
    pub fn create_dynamic(comm: &Communicator, info: &Info) -> Result<Window<'a>> {
        comm.handled(Window::make(
            comm,
            Memory::Dynamic(Vec::new()),
            (0, 0, 1),
            CreateFlavor::Dynamic,
            None,
            info,
        ))
    }

    fn make(
        parent: &Communicator,
        memory: Memory,
        (base, size, disp_unit): (usize, usize, usize),
        flavor: CreateFlavor,
        allocated: Option<Allocation>,
        info: &Info,
    ) -> Result<Window<'a>> {
        if parent.remote_members().is_some() {
            return Err(Error::new(
                ErrorClass::Comm,
                "a window is made on an intracommunicator, not an intercommunicator",
            ));
        }
        if disp_unit == 0 {
            return Err(Error::new(
                ErrorClass::Arg,
                "a window's displacement unit must be at least 1 byte",
            ));
        }
        let mut hints = Info::new();
        for (key, default) in HINTS {
            let value = info.get(key)?.unwrap_or(default);
            if key == "accumulate_ordering" {
                // MPI 4.1 §12.2.1: "none", or orderings among rar, raw,
                // war and waw, separated by commas.
                let ordering = |o: &str| ["rar", "raw", "war", "waw"].contains(&o.trim());
                if value.trim() != "none" && !value.split(',').all(ordering) {
                    return Err(Error::new(
                        ErrorClass::InfoValue,
                        format!(
                            "the window hint accumulate_ordering is \"none\" or some of rar, \
                             raw, war and waw separated by commas, not {value:?}"
                        ),
                    ));
                }
            } else if value != "true" && value != "false" {
                return Err(Error::new(
                    ErrorClass::InfoValue,
                    format!("the window hint {key} is \"true\" or \"false\", not {value:?}"),
                ));
            }
            hints.set(key, value)?;
        }
        let no_locks = hints.get("no_locks")? == Some("true");
        // MPI 4.1 §12.6.1: a window's error handler is
        // MPI_ERRORS_ARE_FATAL when it is made, whatever the
        // communicator's.
        let comm = parent.private_copy("a window", ErrorHandler::Fatal)?;
        let context_id = comm.context_id();
        let members = comm.members().clone();
        let shared = Arc::new(Shared::new(&members, memory));
        // Registered before the exchange below: once any rank has the
        // table, every rank can handle messages for the window.
        target::register(context_id, shared.clone());
        // Each rank's base, size and unit, then its segment's name (zeros
        // if none) and its host's key (zeros if unknown).
        let mut mine = [0u64; ROW];
        mine[..3].copy_from_slice(&[base as u64, size as u64, disp_unit as u64]);
        if let Some(name) = allocated.as_ref().and_then(Allocation::name) {
            mine[3..6].copy_from_slice(&name.to_words());
            mine[6..].copy_from_slice(&host_words());
        }
        let mut all = vec![0u64; ROW * members.len()];
        let paths = comm
            .all_gather_into(&mine[..], &mut all[..])
            .and_then(|()| Window::choose_paths(&comm, &all, flavor, &allocated));
        let (paths, registration) = match paths {
            Ok(chosen) => chosen,
            Err(e) => {
                target::unregister(context_id);
                return Err(e);
            }
        };
        let column = |i: usize| -> Vec<usize> {
            all.iter()
                .skip(i)
                .step_by(ROW)
                .map(|&v| v as usize)
                .collect()
        };
        let (bases, sizes, disp_units) = (column(0), column(1), column(2));
        let same = |v: &[usize]| {
            v.first()
                .copied()
                .filter(|&first| v.iter().all(|&x| x == first))
        };
        let access = Access::new(sizes.len());
        Ok(Window {
            rank: comm.rank() as usize,
            context_id,
            same_size: same(&sizes),
            same_disp_unit: same(&disp_units),
            paths,
            members,
            comm,
            shared,
            bases,
            sizes,
            disp_units,
            flavor,
            hints,
            no_locks,
            epochs: Mutex::new(Epochs::default()),
            access,
            _rdma: registration,
            _allocated: allocated,
            freed: false,
            _memory: PhantomData,
        })
    }

    /// The path to every target, from the rows every rank gathered: direct
    /// where every rank made a window segment on one host and every rank
    /// mapped every rank's segment (all ranks agree, by a second
    /// all-gather); else, for `create` and `allocate`, RDMA where every
    /// other rank is reached by a transport with a one-sided channel and
    /// every rank registered its window (`rdma::choose`, agreed the same
    /// way), with this rank's registrations; else active messages, or for
    /// `allocate_shared` `MPI_ERR_RMA_SHARED`. Says which and why under
    /// `OXMPI_VERBOSE=1`.
    fn choose_paths(
        comm: &Communicator,
        all: &[u64],
        flavor: CreateFlavor,
        allocated: &Option<Allocation>,
    ) -> Result<(Vec<Path>, Option<rdma::Registration>)> {
        let rows: Vec<&[u64]> = all.chunks(ROW).collect();
        let me = comm.rank() as usize;
        let mapped: std::result::Result<Vec<Path>, String> = (|| {
            if let Some(Allocation::Block { parts, .. }) = allocated {
                // Every rank mapped the block; one rank that did not
                // would have sent no name, or another.
                return match rows.iter().position(|row| row[3..6] != rows[me][3..6]) {
                    Some(r) => Err(format!("rank {r} did not map the window's shared block")),
                    None => Ok(parts
                        .iter()
                        .map(|part| Path::Direct(Reach::Mapped(part.clone())))
                        .collect()),
                };
            }
            let Some(Allocation::Segment(own, _)) = allocated else {
                return Err("this rank's window is not in shared memory".to_owned());
            };
            if let Some(r) = rows.iter().position(|row| row[3..6] == [0; 3]) {
                return Err(format!("rank {r}'s window is not in shared memory"));
            }
            if rows
                .iter()
                .any(|row| row[6..] == [0; 4] || row[6..] != rows[0][6..])
            {
                return Err("the ranks are not all on one host".to_owned());
            }
            rows.iter()
                .enumerate()
                .map(|(r, row)| {
                    let name = RegionName::from_words([row[3], row[4], row[5]])
                        .ok_or_else(|| format!("rank {r} sent a bad segment name"))?;
                    let segment = if r == me {
                        own.clone()
                    } else {
                        WindowSegment::attach(&name)
                            .map(Arc::new)
                            .map_err(|e| format!("mapping rank {r}'s window segment failed: {e}"))?
                    };
                    if flavor != CreateFlavor::Create {
                        return Ok(Path::Direct(Reach::Mapped(segment)));
                    }
                    // The data is in rank r's own memory: base and size
                    // as it advertised, in the process that made the
                    // segment; a first copy tells whether the kernel lets
                    // this process reach it.
                    let memory = RemoteWindow::new(name.pid, row[0], row[1])
                        .ok_or_else(|| format!("rank {r} advertised a bad window range"))?;
                    if row[1] > 0 {
                        memory.read(0, &mut [0u8]).map_err(|e| {
                            format!("cross-memory attach to rank {r}'s window failed: {e}")
                        })?;
                    }
                    Ok(Path::Direct(Reach::Remote {
                        control: segment,
                        memory,
                    }))
                })
                .collect()
        })();
        let flag = [u64::from(mapped.is_ok())];
        let mut flags = vec![0u64; rows.len()];
        comm.all_gather_into_unhandled(&flag[..], &mut flags[..])?;
        // Every rank has tried to map every segment it needs.
        if let Some(allocated) = allocated {
            allocated.stop_handover();
        }
        let context_id = comm.context_id();
        match mapped {
            Ok(paths) if flags.iter().all(|&f| f == 1) => {
                oxmpi_adi::vlog!(
                    "window {context_id}: direct access to the shared memory of its {} ranks",
                    rows.len()
                );
                Ok((paths, None))
            }
            outcome => {
                let reason = match outcome {
                    Err(reason) => reason,
                    Ok(_) => format!(
                        "rank {} could not map every window segment",
                        flags.iter().position(|&f| f != 1).unwrap_or(0)
                    ),
                };
                if flavor == CreateFlavor::Shared {
                    return Err(Error::new(
                        ErrorClass::RmaShared,
                        format!("a shared-memory window cannot be made here: {reason}"),
                    ));
                }
                let mut reason = reason;
                if matches!(flavor, CreateFlavor::Create | CreateFlavor::Allocate) {
                    let column = |i: usize| -> Vec<u64> { rows.iter().map(|row| row[i]).collect() };
                    match rdma::choose(comm, comm.members(), &column(0), &column(1))? {
                        Ok(rdma::Chosen {
                            reaches,
                            registration,
                        }) => {
                            oxmpi_adi::vlog!(
                                "window {context_id}: RDMA to the registered memory of its {} \
                                 ranks (not direct, since {reason})",
                                rows.len()
                            );
                            return Ok((
                                reaches.into_iter().map(Path::Rdma).collect(),
                                Some(registration),
                            ));
                        }
                        Err(why) => reason = format!("{reason}, and not RDMA, since {why}"),
                    }
                }
                oxmpi_adi::vlog!("window {context_id}: active messages, since {reason}");
                Ok((vec![Path::ActiveMessages; rows.len()], None))
            }
        }
    }

    /// Whether this rank reaches the window's memory directly (the
    /// windows of [`Window::allocate`] and [`Window::allocate_shared`] on
    /// one host with shared memory), rather than by messages that the
    /// targets' progress engines handle. The same on every rank.
    pub fn direct_access(&self) -> bool {
        matches!(self.paths[self.rank], Path::Direct(_))
    }

    /// Whether this rank reaches the window's memory by RDMA (the windows
    /// of [`Window::create`] and [`Window::allocate`] whose ranks are
    /// reached over the verbs transport): the NIC does the operations,
    /// with no help from the target. The same on every rank.
    pub fn rdma_access(&self) -> bool {
        matches!(self.paths[self.rank], Path::Rdma(_))
    }

    /// Rank `rank`'s part of the window (`MPI_Win_shared_query`), which
    /// this process reads and writes with plain loads and stores; for
    /// [`PROC_NULL`], the part of the lowest rank whose size is not zero
    /// (rank 0's if all are). MPI 4.1 §12.2.3 allows the query on windows
    /// of [`Window::allocate_shared`], [`Window::allocate`] and
    /// [`Window::create`]: every part of the first is shared; of the
    /// others, an allocated window's parts are where the window is
    /// reached directly ([`Window::direct_access`]), and any part that is
    /// not (a created window's, reached by cross-memory attach; a part on
    /// another host) is empty: size 0, a null base. A dynamic window is
    /// `MPI_ERR_RMA_FLAVOR`; a rank outside the window `MPI_ERR_RANK`.
    #[doc(alias = "MPI_Win_shared_query")]
    pub fn shared_query(&self, rank: i32) -> Result<SharedPart<'_>> {
        let result = (|| {
            let rank = match rank {
                PROC_NULL => self.sizes.iter().position(|&size| size > 0).unwrap_or(0),
                rank => self.rank_arg(rank)?,
            };
            if self.flavor == CreateFlavor::Dynamic {
                return Err(Error::new(
                    ErrorClass::RmaFlavor,
                    "shared_query is for windows made by allocate_shared, allocate or create \
                     (MPI 4.1 §12.2.3), not dynamic ones",
                ));
            }
            let segment = match &self.paths[rank] {
                Path::Direct(Reach::Mapped(segment)) => Some(&**segment),
                _ => None,
            };
            Ok(SharedPart {
                segment,
                disp_unit: self.disp_units[rank],
            })
        })();
        self.comm.handled(result)
    }

    /// Frees the window (`MPI_Win_free`); collective. Every epoch must
    /// be closed; every operation of every rank on it completes first.
    #[doc(alias = "MPI_Win_free")]
    pub fn free(mut self) -> Result<()> {
        let result = self.free_unhandled();
        self.comm.handled(result)
    }

    fn free_unhandled(&mut self) -> Result<()> {
        let open = self.epoch_open_besides_fence();
        // The barrier is entered even so, and whatever a target refused:
        // the other ranks are in theirs, and this window is consumed. It
        // goes by messages: a barrier over shared memory would make the
        // communicator's region of collectives (a memory file handed to
        // every process) where no fence made it already, for this one
        // barrier.
        let freed = self.flush_every_target_then(|| self.comm.barrier_by_messages_unhandled());
        if open {
            return Err(Error::new(
                ErrorClass::RmaSync,
                "the window is freed with an epoch open (a lock, start or post not ended)",
            ));
        }
        freed?;
        self.freed = true;
        target::unregister(self.context_id);
        self.comm.clone().free()
    }

    /// The epochs, to change: their [`Access`] bits are rewritten after.
    fn epochs(&self) -> EpochsGuard<'_> {
        EpochsGuard {
            epochs: self.epochs.lock().unwrap_or_else(|p| p.into_inner()),
            bytes: &self.access,
        }
    }

    /// The epochs, to read: the [`Access`] bytes stay as they are.
    fn epochs_now(&self) -> impl std::ops::Deref<Target = Epochs> + '_ {
        self.epochs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether an epoch is open that a fence or a free may not end: a
    /// lock, `lock_all`, a start or a post.
    fn epoch_open_besides_fence(&self) -> bool {
        if self.access.any(Access::HELD) {
            return true;
        }
        let epochs = self.epochs_now();
        epochs.lock_all.is_some() || epochs.access.is_some() || epochs.exposure.is_some()
    }

    /// Whether this window's paths check an accumulate's reduction
    /// themselves before they write anything, and report it before the
    /// operation returns: the direct path, whose every reduction looks its
    /// kernel up first (`PredefinedReduction`, see [`accumulate_element`]). A
    /// window takes one
    /// kind of path to all its targets. Active messages check only at the
    /// target, which would report the error at the next flush.
    #[inline]
    fn reductions_checked_by_path(&self) -> bool {
        matches!(self.paths.first(), Some(Path::Direct(_)))
    }

    // ----- attributes, hints, names, error handlers -----

    /// The local window's base address (`MPI_WIN_BASE`); 0 in a dynamic
    /// window.
    pub fn base(&self) -> usize {
        self.bases[self.rank]
    }

    /// The local window's size in bytes (`MPI_WIN_SIZE`).
    pub fn size(&self) -> usize {
        self.sizes[self.rank]
    }

    /// The local displacement unit in bytes (`MPI_WIN_DISP_UNIT`).
    pub fn disp_unit(&self) -> usize {
        self.disp_units[self.rank]
    }

    /// How the window was made (`MPI_WIN_CREATE_FLAVOR`).
    pub fn create_flavor(&self) -> CreateFlavor {
        self.flavor
    }

    /// The memory model (`MPI_WIN_MODEL`): always unified.
    pub fn model(&self) -> MemoryModel {
        MemoryModel::Unified
    }

    /// The group of the window's processes (`MPI_Win_get_group`).
    #[doc(alias = "MPI_Win_get_group")]
    pub fn group(&self) -> Group {
        self.comm.group()
    }

    /// The hints in use (`MPI_Win_get_info`): `no_locks`,
    /// `accumulate_ordering`, `same_size`, `same_disp_unit`.
    #[doc(alias = "MPI_Win_get_info")]
    pub fn info(&self) -> Info {
        self.hints.clone()
    }

    /// Names the window (`MPI_Win_set_name`).
    #[doc(alias = "MPI_Win_set_name")]
    pub fn set_name(&self, name: &str) -> Result<()> {
        self.comm.set_name(name)
    }

    /// The window's name (`MPI_Win_get_name`); empty if it has none.
    #[doc(alias = "MPI_Win_get_name")]
    pub fn name(&self) -> Result<String> {
        self.comm.get_name()
    }

    /// Sets what an error of a call on the window does
    /// (`MPI_Win_set_errhandler`); a user handler is called with the
    /// window's own communicator. A new window's handler is
    /// [`ErrorHandler::Fatal`] (`MPI_ERRORS_ARE_FATAL`, MPI 4.1 §12.6.1),
    /// whatever its communicator's.
    #[doc(alias = "MPI_Win_set_errhandler")]
    pub fn set_error_handler(&self, handler: ErrorHandler) {
        self.comm.set_error_handler(handler)
    }

    /// The window's error handler (`MPI_Win_get_errhandler`).
    #[doc(alias = "MPI_Win_get_errhandler")]
    pub fn error_handler(&self) -> ErrorHandler {
        self.comm.error_handler()
    }

    // ----- local memory -----

    /// Copies the local window's data at byte `offset` into `out`.
    /// Excludes remote operations by active messages while it copies.
    pub fn read_local<T: Equivalence>(&self, offset: usize, out: &mut [T]) -> Result<()> {
        let len = std::mem::size_of_val(out);
        let dest = out.as_mut_ptr().cast::<u8>();
        if let Path::Direct(segment @ Reach::Mapped(_)) = &self.paths[self.rank] {
            // SAFETY: `dest` is `out`, writable for `len` bytes, and any
            // bytes are a valid `T` (`Equivalence` types are plain data).
            let bytes = unsafe { std::slice::from_raw_parts_mut(dest, len) };
            let result = direct::get(segment, offset as u64, bytes);
            return self.comm.handled(result);
        }
        self.local(offset, len, |window| {
            // SAFETY: `dest` is `out`, writable for `len` bytes, and any
            // bytes are a valid `T` (`Equivalence` types are plain data).
            unsafe { std::ptr::copy_nonoverlapping(window, dest, len) }
        })
    }

    /// Copies `data` into the local window at byte `offset`. Excludes
    /// remote operations by active messages while it copies.
    pub fn write_local<T: Equivalence>(&self, offset: usize, data: &[T]) -> Result<()> {
        let len = std::mem::size_of_val(data);
        let src = data.as_ptr().cast::<u8>();
        if let Path::Direct(segment @ Reach::Mapped(_)) = &self.paths[self.rank] {
            // SAFETY: `src` is `data`, readable for `len` bytes.
            let bytes = unsafe { std::slice::from_raw_parts(src, len) };
            let result = direct::put(segment, offset as u64, bytes);
            return self.comm.handled(result);
        }
        self.local(offset, len, |window| {
            // SAFETY: `src` is `data`, readable for `len` bytes.
            unsafe { std::ptr::copy_nonoverlapping(src, window, len) }
        })
    }

    fn local(&self, offset: usize, len: usize, copy: impl FnOnce(*mut u8)) -> Result<()> {
        let result = with_device(|_| {
            let state = self.shared.state();
            let at = match state.memory {
                Memory::Block { base, size } => {
                    if offset.checked_add(len).is_none_or(|end| end > size) {
                        return Err(Error::new(
                            ErrorClass::RmaRange,
                            format!("{len} bytes at offset {offset} lie outside the local window of {size} bytes"),
                        ));
                    }
                    base.wrapping_add(offset)
                }
                Memory::Dynamic(_) => {
                    return Err(Error::new(
                        ErrorClass::RmaFlavor,
                        "a dynamic window's memory is the program's own: access it directly",
                    ))
                }
            };
            copy(at);
            Ok(())
        });
        self.comm.handled(result)
    }

    // ----- dynamic windows -----

    /// Attaches `memory` to a dynamic window (`MPI_Win_attach`) and
    /// returns its address, the displacement of its first byte for the
    /// other ranks. Local. The memory stays borrowed for the window's
    /// whole life, so it cannot go while other ranks may reach it:
    ///
    /// ```compile_fail,E0597
    /// # let universe = oxmpi::initialize().unwrap();
    /// # let world = universe.world();
    /// let window = oxmpi::rma::Window::create_dynamic(&world, &oxmpi::Info::new()).unwrap();
    /// {
    ///     let mut memory = vec![0u8; 64];
    ///     window.attach(&mut memory[..]).unwrap();
    /// } // dropped while attached: does not compile
    /// window.free().unwrap();
    /// ```
    #[doc(alias = "MPI_Win_attach")]
    pub fn attach<T: Equivalence>(&self, memory: &'a mut [T]) -> Result<usize> {
        let address = memory.as_mut_ptr() as usize;
        let len = std::mem::size_of_val(memory);
        let result = with_device(|_| {
            let mut state = self.shared.state();
            let Memory::Dynamic(ref mut regions) = state.memory else {
                return Err(Error::new(
                    ErrorClass::RmaFlavor,
                    "memory is attached only to a dynamic window",
                ));
            };
            if regions
                .iter()
                .any(|&(at, n)| address < at + n && at < address + len)
            {
                return Err(Error::new(
                    ErrorClass::RmaAttach,
                    format!("{len} bytes at {address:#x} overlap memory already attached"),
                ));
            }
            regions.push((address, len));
            Ok(address)
        });
        self.comm.handled(result)
    }

    /// Detaches the memory attached at `address` (`MPI_Win_detach`).
    #[doc(alias = "MPI_Win_detach")]
    pub fn detach(&self, address: usize) -> Result<()> {
        let result = with_device(|_| {
            let mut state = self.shared.state();
            let Memory::Dynamic(ref mut regions) = state.memory else {
                return Err(Error::new(
                    ErrorClass::RmaFlavor,
                    "memory is detached only from a dynamic window",
                ));
            };
            let before = regions.len();
            regions.retain(|&(at, _)| at != address);
            if regions.len() == before {
                return Err(Error::new(
                    ErrorClass::RmaAttach,
                    format!("no memory is attached at {address:#x}"),
                ));
            }
            Ok(())
        });
        self.comm.handled(result)
    }

    // ----- checks -----

    /// The target's communicator rank and its path, after the checks of
    /// every operation: a rank of the window, an access epoch to it, and
    /// (where the origin knows the target's window) `len` bytes at
    /// `disp` units inside it. Returns also the byte displacement.
    /// Inlined in each operation: a call returned the three through
    /// memory. Always: with `#[inline]` alone the accumulates kept the
    /// call.
    #[inline(always)]
    fn check_target(
        &self,
        target: i32,
        disp: usize,
        len: usize,
    ) -> Result<(Target<'_>, &Path, u64)> {
        let (rank, access) = self.target_access(target)?;
        if access & Access::ANY_OPEN == 0 {
            return Err(Error::new(
                ErrorClass::RmaSync,
                format!(
                    "no access epoch to rank {rank} is open: call fence, start, lock or lock_all first"
                ),
            ));
        }
        let exclusive = access & Access::EXCLUSIVE != 0;
        let locked = access & Access::ANY_TAKEN != 0;
        let byte_disp = if self.flavor == CreateFlavor::Dynamic {
            disp as u64
        } else {
            let unit = self.same_disp_unit.unwrap_or_else(|| self.disp_units[rank]);
            let size = self.same_size.unwrap_or_else(|| self.sizes[rank]);
            let start = disp.checked_mul(unit);
            if start
                .and_then(|s| s.checked_add(len))
                .is_none_or(|end| end > size)
            {
                return Err(Error::new(
                    ErrorClass::RmaRange,
                    format!(
                        "{len} bytes at displacement {disp} (units of {unit} bytes) lie outside rank {rank}'s window of {size} bytes"
                    ),
                ));
            }
            start.unwrap_or(0) as u64
        };
        let to = Target {
            shared: &self.shared,
            context_id: self.context_id,
            rank,
            exclusive,
            locked,
        };
        Ok((to, &self.paths[rank], byte_disp))
    }

    /// The rank `target` as an index, and its [`Access`] byte (its
    /// epochs and the lock held on it), or the error of a rank not in the
    /// window's group. There is a byte for each rank of the window: finding the
    /// target's byte checks the rank (one bounds check, not two). Inlined
    /// always, as [`Window::check_target`] (and in every flush).
    #[inline(always)]
    fn target_access(&self, target: i32) -> Result<(usize, u8)> {
        usize::try_from(target)
            .ok()
            .and_then(|r| Some((r, self.access.get(r)?)))
            .ok_or_else(|| {
                Error::new(
                    ErrorClass::Rank,
                    format!(
                        "target rank {target} is not in the window's group of {}",
                        self.members.len()
                    ),
                )
            })
    }

    // ----- operations -----

    /// Writes `origin` into the target's window at `disp`
    /// (`MPI_Put`). The data has been copied, or has left `origin`,
    /// when this returns; it is in place at the target once the epoch
    /// ends or a flush returns.
    #[doc(alias = "MPI_Put")]
    pub fn put<S: Buffer + ?Sized>(&self, origin: &S, target: i32, disp: usize) -> Result<()> {
        let result = self.put_unhandled(origin, target, disp);
        self.comm.handled(result)
    }

    fn put_unhandled<S: Buffer + ?Sized>(
        &self,
        origin: &S,
        target: i32,
        disp: usize,
    ) -> Result<()> {
        if target == PROC_NULL {
            return Ok(());
        }
        // The origin's own bytes when they are contiguous (a slice of
        // numbers: a few instructions here), else a packed copy.
        let data = Outgoing::new(&origin.view())?;
        let (to, path, disp) = self.check_target(target, disp, data.bytes().len())?;
        path.put(&to, disp, data.bytes())
    }

    /// Reads the target's window at `disp` into `result` (`MPI_Get`),
    /// returning once the data is there.
    #[doc(alias = "MPI_Get")]
    pub fn get<R: BufferMut + ?Sized>(
        &self,
        result: &mut R,
        target: i32,
        disp: usize,
    ) -> Result<()> {
        let outcome = self.fetch_blocking(result, target, disp, |_| Ok(Fetch::Get));
        self.comm.handled(outcome)
    }

    /// Combines `origin` into the target's window at `disp` with `op`
    /// (`MPI_Accumulate`): a predefined reduction,
    /// [`AccumulateOp::Replace`] or [`AccumulateOp::NoOp`]. Atomic per
    /// element with respect to other accumulates. The data has been
    /// copied, or has left `origin`, when this returns.
    #[doc(alias = "MPI_Accumulate")]
    pub fn accumulate<S: Buffer + ?Sized>(
        &self,
        origin: &S,
        target: i32,
        disp: usize,
        op: impl Into<AccumulateOp>,
    ) -> Result<()> {
        let result = self.accumulate_unhandled(origin, target, disp, op.into());
        self.comm.handled(result)
    }

    fn accumulate_unhandled<S: Buffer + ?Sized>(
        &self,
        origin: &S,
        target: i32,
        disp: usize,
        op: AccumulateOp,
    ) -> Result<()> {
        if target == PROC_NULL {
            return Ok(());
        }
        // As in `put`.
        let view = origin.view();
        let data = Outgoing::new(&view)?;
        let element = accumulate_element(
            ElementType::of_datatype(view.datatype()),
            op,
            self.reductions_checked_by_path(),
        )?;
        let (to, path, disp) = self.check_target(target, disp, data.bytes().len())?;
        path.accumulate(&to, disp, data.bytes(), element, op)
    }

    /// Combines `origin` into the target's window with `op` and returns
    /// the target's data from before in `result` (`MPI_Get_accumulate`);
    /// the two hold elements of one type, a basic type or value-index
    /// pairs (else `MPI_ERR_TYPE`), and
    /// equally many bytes (else `MPI_ERR_COUNT`), except that the origin
    /// of [`AccumulateOp::NoOp`] is ignored.
    #[doc(alias = "MPI_Get_accumulate")]
    pub fn get_accumulate<S, R>(
        &self,
        origin: &S,
        result: &mut R,
        target: i32,
        disp: usize,
        op: impl Into<AccumulateOp>,
    ) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
    {
        let op = op.into();
        let outcome = Input::new(origin).and_then(|input| {
            self.fetch_blocking(result, target, disp, |into| {
                let checked = self.reductions_checked_by_path();
                fetch_accumulate(input.element_type(), input.bytes(), into, op, checked)
            })
        });
        self.comm.handled(outcome)
    }

    /// [`Window::get_accumulate`] of one element (`MPI_Fetch_and_op`): a
    /// number, or a value-index pair (MPI 4.1 asks a predefined datatype,
    /// which the pair types are) for `MPI_MINLOC` and `MPI_MAXLOC`.
    #[doc(alias = "MPI_Fetch_and_op")]
    pub fn fetch_and_op<T: Equivalence>(
        &self,
        origin: &T,
        result: &mut T,
        target: i32,
        disp: usize,
        op: impl Into<AccumulateOp>,
    ) -> Result<()> {
        let op = op.into();
        let Some(basic) = ElementType::basic_of::<T>() else {
            return self.get_accumulate(
                std::slice::from_ref(origin),
                std::slice::from_mut(result),
                target,
                disp,
                op,
            );
        };
        // A number: its own bytes are the packed data, without the
        // general path's views and staging (most of a fetch_and_op's
        // instructions on the direct path went there). The origin and the
        // result are both one `T`: of one type and length, so
        // `fetch_accumulate`'s comparisons are not needed.
        let outcome = (|| {
            if target == PROC_NULL {
                return Ok(());
            }
            let checked = self.reductions_checked_by_path();
            let element = reduction_checked(AccumulateType::Basic(basic), op, checked)?;
            let data = value_bytes(origin);
            let old = value_bytes_mut(result);
            let (to, path, disp) = self.check_target(target, disp, old.len())?;
            if let Path::Direct(reach) = path {
                // Done in the call: `Path::fetch`'s way for the direct
                // path, taken straight, with no `Fetch` to build and take
                // apart and no request to look for (29 instructions of a
                // fetch-and-op).
                let _open = reach.open(to.locked)?;
                return direct::accumulate(
                    reach,
                    disp,
                    data,
                    (element, op),
                    to.exclusive,
                    Some(old),
                );
            }
            let what = Fetch::Accumulate { element, op, data };
            // SAFETY: `old` stays borrowed, untouched, until the request is
            // waited for.
            let request = unsafe { path.fetch(&to, disp, old.as_mut_ptr(), old.len(), what)? };
            wait_fetched(request)
        })();
        self.comm.handled(outcome)
    }

    /// Replaces the target's element at `disp` with `origin` if it equals
    /// `compare`, and returns its old value in `result`
    /// (`MPI_Compare_and_swap`). `T` must be of a basic type.
    #[doc(alias = "MPI_Compare_and_swap")]
    pub fn compare_and_swap<T: Equivalence>(
        &self,
        origin: &T,
        compare: &T,
        result: &mut T,
        target: i32,
        disp: usize,
    ) -> Result<()> {
        let size = std::mem::size_of::<T>();
        // The compare value, then the new one: two elements of a basic
        // type, 16 bytes at most each.
        let mut data = [0u8; 32];
        let outcome = (|| {
            // A number's own bytes are its packed data (the fast path, as
            // in `fetch_and_op`); any other type is packed.
            let number = ElementType::basic_of::<T>();
            let mut filled = 0;
            for value in [compare, origin] {
                let input;
                let bytes = match number {
                    Some(_) => value_bytes(value),
                    None => {
                        input = Input::new(std::slice::from_ref(value))?;
                        input.bytes()
                    }
                };
                if let Some(place) = data.get_mut(filled..filled + bytes.len()) {
                    place.copy_from_slice(bytes);
                }
                filled += bytes.len();
            }
            let what = |(element, _): (ElementType, usize)| {
                // MPI 4.1 §12.3.4: integers, logicals and bytes, which
                // compare bit for bit (a float's -0.0 and 0.0 would not).
                let basic = element
                    .basic()
                    .filter(|b| b.size() == size && 2 * size == filled && b.is_integer())
                    .ok_or_else(|| {
                        Error::new(
                            ErrorClass::Type,
                            format!(
                                "compare_and_swap takes one element of an integer type, not {}",
                                element.name()
                            ),
                        )
                    })?;
                Ok(Fetch::CompareAndSwap {
                    element: basic,
                    data: &data[..filled],
                })
            };
            match number {
                Some(basic) => self.fetch_value(result, basic, target, disp, what),
                None => self.fetch_blocking(std::slice::from_mut(result), target, disp, what),
            }
        })();
        self.comm.handled(outcome)
    }

    /// Runs a fetching operation into `result` and waits for it.
    fn fetch_blocking<'d, R: BufferMut + ?Sized>(
        &self,
        result: &mut R,
        target: i32,
        disp: usize,
        what: impl FnOnce((ElementType, usize)) -> Result<Fetch<'d>>,
    ) -> Result<()> {
        if target == PROC_NULL {
            return Ok(());
        }
        // The result's own bytes when they are contiguous (a slice of
        // numbers: a few instructions here), else staged, starting as its
        // data (a fetching accumulate of part of it).
        let view = result.view_mut();
        let element = ElementType::of_datatype(view.datatype());
        let mut data = Incoming::with_contents(view)?;
        let bytes = data.device_buffer();
        let len = bytes.len();
        self.fetch_into(element, bytes, target, disp, what)?;
        data.finish(len)
    }

    /// [`Window::fetch_blocking`] into one value of the basic type
    /// `basic` (`ElementType::basic_of`): into its own bytes, with no
    /// view or staging.
    fn fetch_value<'d, T: Equivalence>(
        &self,
        result: &mut T,
        basic: Primitive,
        target: i32,
        disp: usize,
        what: impl FnOnce((ElementType, usize)) -> Result<Fetch<'d>>,
    ) -> Result<()> {
        if target == PROC_NULL {
            return Ok(());
        }
        let bytes = value_bytes_mut(result);
        self.fetch_into(ElementType::of_basic(basic), bytes, target, disp, what)
    }

    /// Runs a fetching operation into `bytes`, packed `element`s, and
    /// waits for it. Always inlined, as [`Window::start_fetch`] in it:
    /// with `#[inline]` alone, once the direct path's accumulate was
    /// inlined whole, `oxbench`'s compare-and-swap kept this a call (and
    /// ran 9-16% slower on the development VM).
    #[inline(always)]
    fn fetch_into<'d>(
        &self,
        element: ElementType,
        bytes: &mut [u8],
        target: i32,
        disp: usize,
        what: impl FnOnce((ElementType, usize)) -> Result<Fetch<'d>>,
    ) -> Result<()> {
        let len = bytes.len();
        let what = what((element, len))?;
        // SAFETY: `bytes` stays borrowed, untouched, until the request is
        // waited for below.
        let request = unsafe { self.start_fetch(target, disp, bytes.as_mut_ptr(), len, what)? };
        wait_fetched(request)
    }

    /// Checks and starts a fetching operation into `len` bytes at `dest`.
    /// Inlined in its two callers: a call had a large frame to set up and
    /// returned its `Result<Option<RequestId>>` through memory.
    ///
    /// # Safety
    /// As [`Path::fetch`]'s.
    #[inline(always)]
    unsafe fn start_fetch(
        &self,
        target: i32,
        disp: usize,
        dest: *mut u8,
        len: usize,
        what: Fetch<'_>,
    ) -> Result<Option<RequestId>> {
        let (to, path, disp) = self.check_target(target, disp, len)?;
        // SAFETY: the caller's guarantee.
        unsafe { path.fetch(&to, disp, dest, len, what) }
    }

    /// The request-based put (`MPI_Rput`), in a passive-target epoch only
    /// (else `MPI_ERR_RMA_SYNC`, as the other request-based operations:
    /// MPI 4.1 §12.3.5): the data is copied (or sent)
    /// at once, so the request (which borrows nothing, and may be given any
    /// lifetime) is complete on return (local completion); the
    /// operation is complete at the target after a flush or the epoch's
    /// end.
    #[doc(alias = "MPI_Rput")]
    pub fn rput<'s, S: Buffer + ?Sized>(
        &self,
        origin: &S,
        target: i32,
        disp: usize,
    ) -> Result<Request<'s>> {
        self.comm.handled(self.check_request_epoch(target))?;
        self.put(origin, target, disp)?;
        completed(&self.comm)
    }

    /// The request-based accumulate (`MPI_Raccumulate`): complete on
    /// return, as [`Window::rput`].
    #[doc(alias = "MPI_Raccumulate")]
    pub fn raccumulate<'s, S: Buffer + ?Sized>(
        &self,
        origin: &S,
        target: i32,
        disp: usize,
        op: impl Into<AccumulateOp>,
    ) -> Result<Request<'s>> {
        self.comm.handled(self.check_request_epoch(target))?;
        self.accumulate(origin, target, disp, op)?;
        completed(&self.comm)
    }

    /// The request-based get (`MPI_Rget`), in a passive-target epoch
    /// only: `result` is borrowed until the
    /// request (or its scope) completes, which is when the data is there.
    /// The data lands in `result`'s own bytes, so its type must have no
    /// padding (else `MPI_ERR_BUFFER`: use [`Window::get`], which
    /// unpacks).
    #[doc(alias = "MPI_Rget")]
    pub fn rget<'s, T: Equivalence>(
        &self,
        scope: &Scope<'s>,
        result: &'s mut [T],
        target: i32,
        disp: usize,
    ) -> Result<Request<'s>> {
        let outcome = self
            .check_request_epoch(target)
            .and_then(|()| self.start_scoped(scope, result, target, disp, |_| Ok(Fetch::Get)));
        self.comm.handled(outcome)
    }

    /// The request-based get_accumulate (`MPI_Rget_accumulate`): the
    /// origin's data is copied at once; `result` is borrowed until the
    /// request completes, and its type must have no padding, as
    /// [`Window::rget`]'s.
    #[doc(alias = "MPI_Rget_accumulate")]
    pub fn rget_accumulate<'s, S: Buffer + ?Sized, T: Equivalence>(
        &self,
        scope: &Scope<'s>,
        origin: &S,
        result: &'s mut [T],
        target: i32,
        disp: usize,
        op: impl Into<AccumulateOp>,
    ) -> Result<Request<'s>> {
        let op = op.into();
        let outcome = self.check_request_epoch(target).and_then(|()| {
            let input = Input::new(origin)?;
            self.start_scoped(scope, result, target, disp, |into| {
                let checked = self.reductions_checked_by_path();
                fetch_accumulate(input.element_type(), input.bytes(), into, op, checked)
            })
        });
        self.comm.handled(outcome)
    }

    /// The check of every request-based operation: MPI 4.1 §12.3.5 says
    /// "Request-based RMA operations are only valid within a passive
    /// target epoch", so in a fence or start epoch to `target` one is
    /// `MPI_ERR_RMA_SYNC` (as in MPICH), before anything moves.
    /// `PROC_NULL` passes (an operation on it does nothing in any
    /// epoch); a target with no epoch at all is left to the operation's
    /// own check.
    fn check_request_epoch(&self, target: i32) -> Result<()> {
        if target == PROC_NULL {
            return Ok(());
        }
        let (rank, access) = self.target_access(target)?;
        if access & Access::ANY_OPEN != 0 && access & Access::ANY_PASSIVE == 0 {
            return Err(Error::new(
                ErrorClass::RmaSync,
                format!(
                    "request-based operations are for passive-target epochs (lock, lock_all: \
                     MPI 4.1 §12.3.5), and the epoch to rank {rank} is a fence or start epoch: \
                     use put, get, accumulate or get_accumulate there"
                ),
            ));
        }
        Ok(())
    }

    /// Checks and starts a fetching operation into `result`, borrowed
    /// for the scope, and gives its request. Inlined in `rget` and
    /// `rget_accumulate`: a call returned the request through memory.
    #[inline(always)]
    fn start_scoped<'s, 'd, T: Equivalence>(
        &self,
        scope: &Scope<'s>,
        result: &'s mut [T],
        target: i32,
        disp: usize,
        what: impl FnOnce((ElementType, usize)) -> Result<Fetch<'d>>,
    ) -> Result<Request<'s>> {
        if target == PROC_NULL {
            return completed(&self.comm);
        }
        let element = ElementType::of::<T>();
        if element.size() != size_of::<T>() {
            return Err(padded_result(element));
        }
        let len = std::mem::size_of_val(result);
        let what = what((element, len))?;
        // SAFETY: `result` is borrowed for `'s`, and the scope completes
        // the request before `'s` ends.
        let id = unsafe { self.start_fetch(target, disp, result.as_mut_ptr().cast(), len, what)? };
        match id {
            Some(id) => Ok(scope.register(id, &self.comm)),
            None => completed(&self.comm),
        }
    }

    // ----- synchronization -----

    fn check_assert(assert: u32, allowed: u32) -> Result<()> {
        if assert & !allowed != 0 {
            return Err(Error::new(
                ErrorClass::Assert,
                format!("assertion bits {:#x} are not valid here", assert & !allowed),
            ));
        }
        Ok(())
    }

    fn target_of(&self, rank: usize) -> (Target<'_>, &Path) {
        (
            Target {
                shared: &self.shared,
                context_id: self.context_id,
                rank,
                exclusive: false,
                locked: false,
            },
            &self.paths[rank],
        )
    }

    fn flush_every_target(&self) -> Result<()> {
        self.flush_targets(0..self.members.len())?;
        take_errors(&self.shared)
    }

    /// Flushes every target, then runs `synchronize` (the barrier of a
    /// fence or a free) whatever the flush
    /// found, and only then reports the first error: the flush's, the
    /// synchronization's, or one a target recorded (a refused operation).
    /// Returning before it would leave the other ranks waiting in their
    /// barrier for ever.
    fn flush_every_target_then(&self, synchronize: impl FnOnce() -> Result<()>) -> Result<()> {
        let flushed = self.flush_targets(0..self.members.len());
        let synchronized = synchronize();
        let recorded = take_errors(&self.shared);
        flushed.and(synchronized).and(recorded)
    }

    /// Runs `f` on every target of `ranks`, all of them even if one
    /// fails (a lost target, a refused operation: the others still wait
    /// for what is theirs); the first error.
    fn each_target(
        &self,
        ranks: impl Iterator<Item = usize>,
        mut f: impl FnMut(&Target<'_>, &Path) -> Result<()>,
    ) -> Result<()> {
        let mut first = Ok(());
        for rank in ranks {
            let (to, path) = self.target_of(rank);
            let done = f(&to, path);
            if first.is_ok() {
                first = done;
            }
        }
        first
    }

    /// Releases the shared lock `lock_all` took on each target of
    /// `ranks`, all of them even if one fails; the first error.
    fn unlock_targets(&self, ranks: Range<usize>) -> Result<()> {
        self.each_target(ranks, |to, path| path.release(to, LockType::Shared))
    }

    /// Flushes `ranks`, every target's queued operations leaving before
    /// the first wait, and every target even if one fails; the first
    /// error.
    fn flush_targets(&self, ranks: impl Iterator<Item = usize> + Clone) -> Result<()> {
        let sent = self.each_target(ranks.clone(), |to, path| path.send_queued(to));
        sent.and(self.each_target(ranks, |to, path| path.flush(to)))
    }

    /// Ends the preceding fence epoch and opens the next
    /// (`MPI_Win_fence`); collective. Assertions: [`MODE_NOSTORE`],
    /// [`MODE_NOPUT`], [`MODE_NOPRECEDE`], [`MODE_NOSUCCEED`].
    #[doc(alias = "MPI_Win_fence")]
    pub fn fence(&self, assert: u32) -> Result<()> {
        let result = self.fence_unhandled(assert);
        self.comm.handled(result)
    }

    fn fence_unhandled(&self, assert: u32) -> Result<()> {
        Window::check_assert(assert, MODES & !MODE_NOCHECK)?;
        if self.epoch_open_besides_fence() {
            return Err(Error::new(
                ErrorClass::RmaSync,
                "fence while a lock, start or post epoch is open",
            ));
        }
        let synchronized = if assert & MODE_NOPRECEDE == 0 {
            self.flush_every_target_then(|| self.comm.barrier_unhandled())
        } else {
            self.comm.barrier_unhandled()
        };
        self.epochs().fence = assert & MODE_NOSUCCEED == 0;
        synchronized
    }

    /// Opens an exposure epoch to the ranks of `group` (`MPI_Win_post`).
    #[doc(alias = "MPI_Win_post")]
    pub fn post(&self, group: &Group, assert: u32) -> Result<()> {
        let result = (|| {
            Window::check_assert(assert, MODE_NOCHECK | MODE_NOSTORE | MODE_NOPUT)?;
            let ranks = self.ranks_of(group)?;
            let mut epochs = self.epochs();
            if epochs.exposure.is_some() {
                return Err(Error::new(
                    ErrorClass::RmaSync,
                    "post while an exposure epoch is open",
                ));
            }
            epochs.exposure = Some(ranks.clone());
            drop(epochs);
            for rank in ranks {
                let (to, path) = self.target_of(rank);
                path.notify(&to, wire::Kind::Post)?;
            }
            Ok(())
        })();
        self.comm.handled(result)
    }

    /// Opens an access epoch to the ranks of `group` (`MPI_Win_start`),
    /// once each has posted.
    #[doc(alias = "MPI_Win_start")]
    pub fn start(&self, group: &Group, assert: u32) -> Result<()> {
        let result = (|| {
            Window::check_assert(assert, MODE_NOCHECK)?;
            let ranks = self.ranks_of(group)?;
            // MPI 4.1 §12.5: a window's access epochs at a process are
            // disjoint.
            let epochs = self.epochs_now();
            if epochs.access.is_some() {
                return Err(Error::new(
                    ErrorClass::RmaSync,
                    "start while a start epoch is open",
                ));
            }
            if epochs.lock_all.is_some() || self.access.any(Access::HELD) {
                return Err(Error::new(
                    ErrorClass::RmaSync,
                    "start while a lock or lock_all is open: unlock first",
                ));
            }
            drop(epochs);
            crate::progress_until(|d| {
                let mut state = self.shared.state();
                if ranks.iter().all(|&r| state.posts[r] > 0) {
                    for &r in &ranks {
                        state.posts[r] -= 1;
                    }
                    return Ok(Some(()));
                }
                // A target lost before its post never posts.
                let lost = ranks
                    .iter()
                    .filter(|&&r| state.posts[r] == 0)
                    .find_map(|&r| d.peer_failure(self.shared.member(r)));
                lost.map_or(Ok(None), Err)
            })?;
            self.epochs().access = Some(ranks);
            Ok(())
        })();
        self.comm.handled(result)
    }

    /// Ends the access epoch of [`Window::start`] (`MPI_Win_complete`):
    /// every operation of it completes at its target.
    #[doc(alias = "MPI_Win_complete")]
    pub fn complete(&self) -> Result<()> {
        let result = (|| {
            let ranks = self
                .epochs()
                .access
                .take()
                .ok_or_else(|| Error::new(ErrorClass::RmaSync, "complete without a start"))?;
            // Every target hears its complete, even if another's flush
            // failed (a lost target): its wait ends only so.
            let flushed = self.flush_targets(ranks.iter().copied());
            let notified = self.each_target(ranks.iter().copied(), |to, path| {
                path.notify(to, wire::Kind::Complete)
            });
            flushed.and(notified).and(take_errors(&self.shared))
        })();
        self.comm.handled(result)
    }

    /// Ends the exposure epoch of [`Window::post`] (`MPI_Win_wait`), once
    /// every origin of it has completed.
    #[doc(alias = "MPI_Win_wait")]
    pub fn wait(&self) -> Result<()> {
        let result = (|| {
            let ranks = self.exposure_group()?;
            let ended = crate::progress_until(|d| match self.take_completes(&ranks, d) {
                Ok(true) => Ok(Some(Ok(()))),
                Ok(false) => Ok(None),
                Err(lost) => Ok(Some(Err(lost))),
            });
            self.epochs().exposure = None;
            ended?
        })();
        self.comm.handled(result)
    }

    /// [`Window::wait`] without blocking (`MPI_Win_test`): whether the
    /// exposure epoch ended.
    #[doc(alias = "MPI_Win_test")]
    pub fn test(&self) -> Result<bool> {
        let result = (|| {
            let ranks = self.exposure_group()?;
            crate::progress_once()?;
            let done = crate::with_device(|d| Ok(self.take_completes(&ranks, d)))?;
            if !matches!(done, Ok(false)) {
                self.epochs().exposure = None;
            }
            done
        })();
        self.comm.handled(result)
    }

    fn exposure_group(&self) -> Result<Vec<usize>> {
        self.epochs()
            .exposure
            .clone()
            .ok_or_else(|| Error::new(ErrorClass::RmaSync, "wait or test without a post"))
    }

    /// Whether every origin of `ranks` completed; if so, their completes
    /// are used up. An origin lost before its complete never completes:
    /// once every other has, theirs are used up and the epoch ends with
    /// the loss's error.
    fn take_completes(&self, ranks: &[usize], device: &Device) -> Result<bool> {
        let mut state = self.shared.state();
        let mut lost = None;
        for &r in ranks {
            if state.completes[r] == 0 {
                match device.peer_failure(self.shared.member(r)) {
                    Some(e) => lost = lost.or(Some(e)),
                    None => return Ok(false),
                }
            }
        }
        for &r in ranks {
            state.completes[r] = state.completes[r].saturating_sub(1);
        }
        lost.map_or(Ok(true), Err)
    }

    /// The window's communicator ranks of `group`'s processes.
    fn ranks_of(&self, group: &Group) -> Result<Vec<usize>> {
        group
            .world_ranks()
            .iter()
            .map(|w| {
                self.members.iter().position(|m| m == w).ok_or_else(|| {
                    Error::new(
                        ErrorClass::Group,
                        format!("process {w} of the group is not in the window"),
                    )
                })
            })
            .collect()
    }

    /// Opens a passive-target access epoch to `target` (`MPI_Win_lock`):
    /// takes its lock, unless `assert` has [`MODE_NOCHECK`].
    #[doc(alias = "MPI_Win_lock")]
    pub fn lock(&self, lock_type: LockType, target: i32, assert: u32) -> Result<()> {
        let result = self.lock_unhandled(lock_type, target, assert);
        self.comm.handled(result)
    }

    fn lock_unhandled(&self, lock_type: LockType, target: i32, assert: u32) -> Result<()> {
        Window::check_assert(assert, MODE_NOCHECK)?;
        if self.no_locks {
            return Err(Error::new(
                ErrorClass::RmaSync,
                "the window was made with the hint no_locks=true",
            ));
        }
        if target == PROC_NULL {
            return Ok(());
        }
        let rank = self.rank_arg(target)?;
        let take = assert & MODE_NOCHECK == 0;
        let mut record = Access::HELD;
        if lock_type == LockType::Exclusive {
            record |= Access::EXCLUSIVE;
        }
        if take {
            record |= Access::TAKEN;
        }
        // Recorded first, in the target's byte alone (no mutex): of two
        // threads that lock one target at once exactly one gets here, and
        // the other fails without waiting for a lock its process holds.
        self.access.claim(rank, record).map_err(|byte| {
            let open = if byte & Access::HELD != 0 {
                "it is already locked by this process: unlock it first"
            } else if byte & Access::ALL != 0 {
                "lock_all is open: end it by unlock_all first"
            } else {
                "a start epoch is open: end it by complete first"
            };
            Error::new(
                ErrorClass::RmaSync,
                format!("lock of rank {rank} while {open}"),
            )
        })?;
        if take {
            let (to, path) = self.target_of(rank);
            if let Err(e) = path.lock(&to, lock_type, rank == self.rank) {
                self.access.release(rank);
                return Err(e);
            }
        }
        Ok(())
    }

    /// Ends the passive-target epoch to `target` (`MPI_Win_unlock`): its
    /// operations complete at the target, then the lock is released.
    #[doc(alias = "MPI_Win_unlock")]
    pub fn unlock(&self, target: i32) -> Result<()> {
        let result = (|| {
            if target == PROC_NULL {
                return Ok(());
            }
            let rank = self.rank_arg(target)?;
            let (to, path) = self.target_of(rank);
            // By active messages the record stays until the release has
            // left: a lock of another thread of this process, let in
            // before, would send its request ahead of the release, and
            // the target, which tells origins apart by process, would
            // keep the release behind that request, itself waiting for
            // the hold the release ends. Elsewhere the target's lock word
            // orders them, and the record goes first, in one atomic.
            let by_messages = matches!(path, Path::ActiveMessages);
            let record = match by_messages {
                true => self.access.begin_release(rank),
                false => self.access.release(rank),
            }
            .ok_or_else(|| {
                Error::new(
                    ErrorClass::RmaSync,
                    format!("rank {rank} is not locked by this process"),
                )
            })?;
            let ended = if record & Access::TAKEN != 0 {
                path.flush_and_unlock(&to, held_type(record))
            } else {
                path.flush(&to)
            };
            if by_messages {
                self.access.release(rank);
            }
            ended?;
            take_errors(&self.shared)
        })();
        self.comm.handled(result)
    }

    /// Opens a shared passive-target epoch to every rank
    /// (`MPI_Win_lock_all`).
    #[doc(alias = "MPI_Win_lock_all")]
    pub fn lock_all(&self, assert: u32) -> Result<()> {
        let result = (|| {
            Window::check_assert(assert, MODE_NOCHECK)?;
            if self.no_locks {
                return Err(Error::new(
                    ErrorClass::RmaSync,
                    "the window was made with the hint no_locks=true",
                ));
            }
            let take = assert & MODE_NOCHECK == 0;
            {
                // Every target claimed first, as a lock claims one: a lock
                // held on any (or taken by another thread meanwhile)
                // shows in the byte's change, and lock_all backs out.
                let mut epochs = self.epochs();
                if epochs.lock_all.is_some() {
                    return Err(Error::new(
                        ErrorClass::RmaSync,
                        "lock_all while lock_all is open",
                    ));
                }
                if epochs.access.is_some() {
                    return Err(Error::new(
                        ErrorClass::RmaSync,
                        "lock_all while a start epoch is open: end it by complete first",
                    ));
                }
                epochs.lock_all = Some(take);
                if epochs.publish() {
                    epochs.lock_all = None;
                    return Err(Error::new(
                        ErrorClass::RmaSync,
                        "lock_all while locks are held",
                    ));
                }
            }
            if take {
                for rank in 0..self.members.len() {
                    let (to, path) = self.target_of(rank);
                    if let Err(e) = path.lock(&to, LockType::Shared, rank == self.rank) {
                        // The locks taken so far are given back; the
                        // failure to take this one is what to report.
                        let _ = self.unlock_targets(0..rank);
                        self.epochs().lock_all = None;
                        return Err(e);
                    }
                }
            }
            Ok(())
        })();
        self.comm.handled(result)
    }

    /// Ends the epoch of [`Window::lock_all`] (`MPI_Win_unlock_all`).
    #[doc(alias = "MPI_Win_unlock_all")]
    pub fn unlock_all(&self) -> Result<()> {
        let result = (|| {
            let mut epochs = self.epochs();
            let taken = epochs
                .lock_all
                .take()
                .ok_or_else(|| Error::new(ErrorClass::RmaSync, "unlock_all without lock_all"))?;
            // Every release leaves (behind its target's operations, by
            // active messages) before the first wait, and every one even
            // if one fails; the flush then waits for all their replies.
            // The epoch ends in the targets' bytes (the guard's drop) only
            // after the releases left, so that no lock of another thread
            // sends its request ahead of one (see `unlock`).
            let released = match taken {
                true => self.unlock_targets(0..self.members.len()),
                false => Ok(()),
            };
            drop(epochs);
            released.and(self.flush_every_target())
        })();
        self.comm.handled(result)
    }

    /// Completes every operation to `target` at the target
    /// (`MPI_Win_flush`); in a passive-target epoch.
    #[doc(alias = "MPI_Win_flush")]
    pub fn flush(&self, target: i32) -> Result<()> {
        let result = (|| {
            if target == PROC_NULL {
                return Ok(());
            }
            let (rank, access) = self.target_access(target)?;
            if access & Access::ANY_PASSIVE == 0 {
                return Err(Error::new(
                    ErrorClass::RmaSync,
                    format!("flush of rank {rank} outside a passive-target epoch to it"),
                ));
            }
            let (to, path) = self.target_of(rank);
            path.flush(&to)?;
            take_errors(&self.shared)
        })();
        self.comm.handled(result)
    }

    /// [`Window::flush`] to every target (`MPI_Win_flush_all`).
    #[doc(alias = "MPI_Win_flush_all")]
    pub fn flush_all(&self) -> Result<()> {
        let result = (|| {
            if !self.access.any(Access::ANY_PASSIVE) {
                return Err(Error::new(
                    ErrorClass::RmaSync,
                    "flush_all outside a passive-target epoch",
                ));
            }
            self.flush_every_target()
        })();
        self.comm.handled(result)
    }

    /// Completes the operations to `target` locally
    /// (`MPI_Win_flush_local`): their origin buffers may be reused. Puts
    /// and accumulates are complete locally on return already; this waits
    /// for the results of fetching ones, as [`Window::flush`].
    #[doc(alias = "MPI_Win_flush_local")]
    pub fn flush_local(&self, target: i32) -> Result<()> {
        self.flush(target)
    }

    /// [`Window::flush_local`] to every target
    /// (`MPI_Win_flush_local_all`).
    #[doc(alias = "MPI_Win_flush_local_all")]
    pub fn flush_local_all(&self) -> Result<()> {
        self.flush_all()
    }

    /// Synchronizes the public and private copies of the local window
    /// (`MPI_Win_sync`): a memory fence (the copies are one).
    #[doc(alias = "MPI_Win_sync")]
    pub fn sync(&self) -> Result<()> {
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }

    fn rank_arg(&self, target: i32) -> Result<usize> {
        usize::try_from(target)
            .ok()
            .filter(|&r| r < self.members.len())
            .ok_or_else(|| {
                Error::new(
                    ErrorClass::Rank,
                    format!(
                        "rank {target} is not in the window's group of {}",
                        self.members.len()
                    ),
                )
            })
    }
}

impl Drop for Window<'_> {
    fn drop(&mut self) {
        // A window dropped without `free` stops being reachable: messages
        // that still name it fail their senders instead of touching
        // memory that is going away.
        if !self.freed {
            target::unregister(self.context_id);
            // Origins reaching this rank's memory by cross-memory attach
            // are stopped before the memory goes back to the program:
            // this rank's own hold of its lock first goes.
            if let Path::Direct(Reach::Remote { control, .. }) = &self.paths[self.rank] {
                let epochs = std::mem::take(&mut *self.epochs());
                match (self.access.release(self.rank), epochs.lock_all) {
                    (Some(record), _) if record & Access::TAKEN != 0 => match held_type(record) {
                        LockType::Shared => control.lock().unlock_shared(),
                        LockType::Exclusive => control.lock().unlock_exclusive(),
                    },
                    (_, Some(true)) => control.lock().unlock_shared(),
                    _ => {}
                }
                direct::close(control);
            }
        }
    }
}

/// The type of the lock of an [`Access`] lock record.
fn held_type(record: u8) -> LockType {
    if record & Access::EXCLUSIVE != 0 {
        LockType::Exclusive
    } else {
        LockType::Shared
    }
}

/// The type an accumulate of `element`s with `op` works on, or the
/// error (`MPI_ERR_TYPE` for data of several types that are no
/// value-index pair, `MPI_ERR_OP` for an operation not defined for it:
/// `MPI_MINLOC` on `MPI_INT`, `MPI_SUM` on `MPI_DOUBLE_INT`).
/// `reduction_checked_later`: the path checks that the reduction is
/// defined for the type before it writes anything, and reports it before
/// the call returns (the direct path's `PredefinedReduction`), so it is
/// not looked up here as well. Always inlined, the pairs out of line: a
/// few tests on every accumulate and fetch-and-op of numbers, where a
/// call cost one some 27 instructions.
#[inline(always)]
fn accumulate_element(
    element: ElementType,
    op: AccumulateOp,
    reduction_checked_later: bool,
) -> Result<AccumulateType> {
    let accumulated = match element.basic() {
        Some(basic) if !op.takes_pairs() => AccumulateType::Basic(basic),
        _ => accumulated_pairs(element)?,
    };
    reduction_checked(accumulated, op, reduction_checked_later)
}

/// `accumulated` once `op` is known to be defined for it, unless the
/// path checks that later ([`accumulate_element`]). Always inlined: a
/// fetch-and-op of a number, which is never a pair, starts here.
#[inline(always)]
fn reduction_checked(
    accumulated: AccumulateType,
    op: AccumulateOp,
    reduction_checked_later: bool,
) -> Result<AccumulateType> {
    if let AccumulateOp::Reduce(reduce) = op {
        if !reduction_checked_later {
            accumulated.reduction(reduce.system_op())?;
        }
    }
    Ok(accumulated)
}

/// [`accumulate_element`]'s type of elements that are no numbers, or
/// that `MPI_MINLOC` or `MPI_MAXLOC` takes: value-index pairs where their
/// data is (a pair of two values of one type, `MPI_2INT`, is also two
/// numbers), else numbers, else the `MPI_ERR_TYPE` error. Cold, out of
/// line: off the numbers' way (without `#[cold]` the element type was
/// stored for its call on every accumulate of numbers).
#[cold]
#[inline(never)]
fn accumulated_pairs(element: ElementType) -> Result<AccumulateType> {
    PairType::of(element)
        .map(AccumulateType::Pair)
        .or(element.basic().map(AccumulateType::Basic))
        .ok_or_else(|| {
            Error::new(
                ErrorClass::Type,
                format!(
                    "accumulates take elements of one basic type or value-index pairs, not {}",
                    element.name()
                ),
            )
        })
}

/// The error of an `rget` or `rget_accumulate` into elements with
/// padding: the data lands in the result's own bytes as it travels,
/// packed, which is how such elements lie in memory only without
/// padding. Cold: off the way of every `rget`.
#[cold]
fn padded_result(element: ElementType) -> Error {
    Error::new(
        ErrorClass::Buffer,
        format!(
            "rget and rget_accumulate take a result of elements without padding, not {} \
             ({} bytes of data in a larger element): use get or get_accumulate, which unpack",
            element.name(),
            element.size()
        ),
    )
}

/// This host's key (`HostId::key`) as four words, zeros if unknown.
fn host_words() -> [u64; 4] {
    let mut words = [0u64; 4];
    if let Ok(host) = HostId::current() {
        for (word, bytes) in words.iter_mut().zip(host.key().chunks(8)) {
            *word = u64::from_le_bytes(bytes.try_into().unwrap_or_default());
        }
    }
    words
}

/// The bytes of `value`, of a basic type (`ElementType::basic_of`: a
/// type with no padding).
fn value_bytes<T: Equivalence>(value: &T) -> &[u8] {
    // SAFETY: `value` is readable for its `size_of::<T>()` bytes, every one
    // of them initialized (`Equivalence` types are plain data, and the
    // caller's type is a number); the slice lives as long as the borrow.
    unsafe { std::slice::from_raw_parts((value as *const T).cast::<u8>(), size_of::<T>()) }
}

/// The bytes of `value`, of a basic type, to write a result into.
#[inline]
fn value_bytes_mut<T: Equivalence>(value: &mut T) -> &mut [u8] {
    // SAFETY: `value` is writable for its `size_of::<T>()` bytes, and any
    // bytes are a valid `T` (`Equivalence` types are plain data); the
    // slice lives as long as the borrow of `value`.
    unsafe { std::slice::from_raw_parts_mut((value as *mut T).cast::<u8>(), size_of::<T>()) }
}

/// Waits for the request of a fetching operation, if the path made one
/// (`None`: the result is in place already). Inlined, so that where the
/// path is known to make none (the direct path's get) nothing is left of
/// it (a call cost a get and a compare-and-swap some 15 instructions).
#[inline]
fn wait_fetched(request: Option<RequestId>) -> Result<()> {
    if let Some(request) = request {
        let status = crate::wait_request(request)?;
        if let Some(e) = status.error {
            return Err(e);
        }
    }
    Ok(())
}

/// The fetching accumulate of `origin` (packed elements of
/// `origin_element`) into a result of `len` bytes of `element`s;
/// `reduction_checked_later` as for [`accumulate_element`].
fn fetch_accumulate<'d>(
    origin_element: ElementType,
    origin: &'d [u8],
    (element, len): (ElementType, usize),
    op: AccumulateOp,
    reduction_checked_later: bool,
) -> Result<Fetch<'d>> {
    // The types first, so that an origin and a result of different types
    // are `MPI_ERR_TYPE` whatever the operation.
    if op != AccumulateOp::NoOp {
        crate::collective::op::same_element_type(origin_element, element)?;
    }
    let accumulated = accumulate_element(element, op, reduction_checked_later)?;
    if op == AccumulateOp::NoOp {
        return Ok(Fetch::Accumulate {
            element: accumulated,
            op,
            data: &[],
        });
    }
    if origin.len() != len {
        return Err(Error::new(
            ErrorClass::Count,
            format!(
                "the origin holds {} bytes and the result buffer {len}",
                origin.len()
            ),
        ));
    }
    Ok(Fetch::Accumulate {
        element: accumulated,
        op,
        data: origin,
    })
}

/// A request that is complete already (local completion, or an
/// operation on `PROC_NULL`). Inlined, with `completed_request`: every
/// `rget` on the direct path returns one, which is then an id made in
/// the caller.
#[inline]
fn completed<'s>(comm: &Communicator) -> Result<Request<'s>> {
    crate::comm::completed_request(0).map(|id| Request::unscoped(id, comm))
}

/// Installs the handler of one-sided messages, and the placer of puts'
/// streamed data, in the device (at initialize).
pub(crate) fn install(device: &mut oxmpi_adi::device::Device) {
    device.set_active_message_handler(Box::new(target::Handler::default()));
    device.set_active_placer(Box::new(target::Placer));
}
