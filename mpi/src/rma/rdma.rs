//! The RDMA path (`Path::Rdma`): the origin's NIC reads and writes the
//! target's registered window memory through the device's one-sided
//! channel (`Device::rdma_*`, offered by the verbs transport), so the
//! target's process takes no part.
//!
//! At creation ([`choose`]) every rank registers its window memory and a
//! [`ControlBlock`] of lock words, and the ranks all-gather the keys; a
//! rank reaches its own window with loads, stores and CPU atomics on the
//! same words ([`At::Local`]). Put is RDMA WRITE (posted, complete at
//! the next flush); get is RDMA READ. Accumulates of 8-byte integers with
//! `SUM`, `NO_OP` and `REPLACE` at 8-byte-aligned addresses are one NIC
//! atomic per element (fetch-and-add, fetch-and-add of 0, a
//! compare-and-swap loop), and so is an 8-byte compare-and-swap: these are
//! atomic against each other from any origin. Every other accumulate is a
//! read, the reduction here and a write, under the target's accumulate
//! mutex (a word taken by compare-and-swap), or under nothing when this
//! origin holds the target's exclusive lock. Which way an element goes
//! depends only on its type, the operation and its address, so under the
//! default `accumulate_ops` (`same_op_no_op`) concurrent accumulates of one
//! element never mix the two ways.
//!
//! An operation of several pieces (the segments of a target datatype,
//! pieces of the channel's largest length, an accumulate's elements)
//! posts them in order as lists of work requests
//! (`Device::rdma_post_list`, [`Reach::post_all`]: one post, and one
//! lock of the queue pair, per list of as many as the channel has room
//! for), all before the first is waited for; on an error the ones posted
//! are still waited for (a get, a fetching accumulate) or flushed (a put,
//! an accumulate).
//!
//! Passive-target locks are the phase-fair reader-writer ticket lock
//! (Brandenburg and Anderson's PF-T) on four words of the target's
//! control block, with fetch-and-add only: readers that arrive while a
//! writer waits wait for that writer alone, and a writer for the readers
//! that arrived before it, so neither starves. Waiting re-reads a word
//! (a fetch-and-add of 0) between polls of the device.

use super::direct;
use super::path::Segment;
use super::target::combine;
use super::wire::{AccumulateOp, AccumulateType};
use super::LockType;
use crate::collective::op::SystemOp;
use crate::datatype::Primitive;
use crate::{
    progress_until, wait_for_memory, with_device, Communicator, Error, ErrorClass, Result,
};
use oxmpi_adi::device::RdmaChannel;
use oxmpi_adi::transport::{PeerRank, RdmaOp, RdmaTarget};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Lock words of the control block: readers in (count in the bits above
/// [`WBITS`], the present writer's bits below), readers out, writer
/// tickets taken and served; then the accumulate mutex.
const RIN: usize = 0;
const ROUT: usize = 1;
const WIN: usize = 2;
const WOUT: usize = 3;
const MUTEX: usize = 4;
/// One reader, in `RIN` and `ROUT`.
const RINC: u64 = 0x100;
/// A writer is present (`PRES`) and the parity of its ticket (`PHID`).
const WBITS: u64 = 0x3;
const PRES: u64 = 0x2;
const PHID: u64 = 0x1;

/// Words of a control block.
const CONTROL_WORDS: usize = 8;

/// A rank's lock words, in memory registered for the other ranks'
/// atomics (so only ever touched with atomics).
#[derive(Debug, Default)]
#[repr(align(64))]
pub(crate) struct ControlBlock([AtomicU64; CONTROL_WORDS]);

/// This rank's registrations for a window on the RDMA path: revoked when
/// dropped (before the window's memory goes), after which operations
/// still aimed at it fail at their origins with a remote access error.
#[derive(Debug)]
pub(crate) struct Registration {
    channel: RdmaChannel,
    handles: Vec<u64>,
    /// Kept allocated while registered.
    _control: Arc<ControlBlock>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        // After finalize the transport, and its registrations, are gone.
        let _ = with_device(|d| {
            for &handle in &self.handles {
                d.rdma_deregister(self.channel, handle);
            }
            Ok(())
        });
    }
}

/// Where a target's window is.
#[derive(Debug)]
enum At {
    /// Another rank's, through the one-sided channel: its data and its
    /// control block.
    Remote {
        peer: PeerRank,
        data: RdmaTarget,
        control: RdmaTarget,
    },
    /// This rank's own: the data's first byte (an address) and the
    /// control block.
    Local {
        data: usize,
        control: Arc<ControlBlock>,
    },
}

/// A place in a target's window: a control word, or a byte offset of the
/// data.
#[derive(Clone, Copy)]
enum Place {
    Control(usize),
    Data(u64),
}

/// How the RDMA path reaches one target's window.
#[derive(Debug)]
pub(crate) struct Reach {
    at: At,
    /// The transport whose one-sided channel reaches the target.
    channel: RdmaChannel,
    /// The largest read or write of one post.
    max_len: usize,
    /// Operations posted and not known complete yet (flushes wait).
    pending: Mutex<Vec<u64>>,
}

/// Why a window does not take the RDMA path.
pub(crate) type NotRdma = String;

/// A window's RDMA paths, one per rank, and this rank's registrations.
pub(crate) struct Chosen {
    /// The path to each rank of the window.
    pub(crate) reaches: Vec<Arc<Reach>>,
    /// This rank's registrations.
    pub(crate) registration: Registration,
}

/// This rank's part: its registrations, its row of the exchange (data
/// key, control block address and key) and the channel's largest post.
struct Ready {
    registration: Registration,
    row: [u64; 3],
    max_len: usize,
}

/// Registers this rank's window (`bases[me]`, `sizes[me]`) and `control`
/// on the channel that reaches every other member, if there is one.
fn register(
    me: usize,
    members: &[PeerRank],
    (base, size): (u64, u64),
    control: &Arc<ControlBlock>,
) -> Result<std::result::Result<Ready, NotRdma>> {
    let peers: Vec<PeerRank> = members
        .iter()
        .enumerate()
        .filter(|&(r, _)| r != me)
        .map(|(_, &p)| p)
        .collect();
    let Some(channel) = with_device(|d| d.rdma_channel(&peers))? else {
        return Ok(Err(
            "some rank is not reached by a transport with a one-sided channel (verbs)".to_owned(),
        ));
    };
    let mut registration = Registration {
        channel,
        handles: Vec::new(),
        _control: control.clone(),
    };
    let mut row = [0u64; 3];
    let max_len = with_device(|d| {
        if size > 0 {
            // SAFETY: the window's memory stays allocated until the
            // window is dropped, which drops the registration first;
            // this process reaches it only through raw pointers and
            // copies meanwhile.
            let data = unsafe { d.rdma_register(channel, base as *mut u8, size as usize)? };
            registration.handles.push(data.handle);
            row[0] = u64::from(data.rkey);
        }
        let words = control.0.as_ptr().cast_mut().cast::<u8>();
        // SAFETY: the control block lives in an `Arc` the registration
        // holds until it deregisters; it is made of atomics, so peers'
        // writes are no hidden mutation.
        let block =
            unsafe { d.rdma_register(channel, words, std::mem::size_of::<ControlBlock>())? };
        registration.handles.push(block.handle);
        row[1] = words as u64;
        row[2] = u64::from(block.rkey);
        Ok(d.rdma_max_len(channel))
    })?;
    if max_len == 0 {
        return Ok(Err("the one-sided channel moves no data".to_owned()));
    }
    Ok(Ok(Ready {
        registration,
        row,
        max_len,
    }))
}

/// The paths of a window whose every other rank is reached by a transport
/// with a one-sided channel and registered its window (all ranks agree,
/// by an all-gather), with this rank's registrations; else why not.
/// `bases` and `sizes` are each rank's window, as all ranks gathered them.
pub(crate) fn choose(
    comm: &Communicator,
    members: &[PeerRank],
    bases: &[u64],
    sizes: &[u64],
) -> Result<std::result::Result<Chosen, NotRdma>> {
    let me = comm.rank() as usize;
    let control = Arc::new(ControlBlock::default());
    // Every rank takes part in the exchange, ready or not.
    let (mine, outcome) = match register(me, members, (bases[me], sizes[me]), &control) {
        Ok(Ok(ready)) => {
            let row = ready.row;
            ([1, row[0], row[1], row[2]], Ok(ready))
        }
        Ok(Err(reason)) => ([0; 4], Err(reason)),
        Err(e) => (
            [0; 4],
            Err(format!("registering the window failed: {}", e.message())),
        ),
    };
    let mut all = vec![0u64; 4 * members.len()];
    comm.all_gather_into_unhandled(&mine[..], &mut all[..])?;
    let Ready {
        registration,
        max_len,
        ..
    } = match outcome {
        Ok(ready) => ready,
        Err(reason) => return Ok(Err(reason)),
    };
    if let Some(r) = all.chunks(4).position(|row| row[0] != 1) {
        return Ok(Err(format!(
            "rank {r} could not register its window for RDMA"
        )));
    }
    let key = |word: u64| {
        u32::try_from(word).map_err(|_| {
            Error::new(
                ErrorClass::Intern,
                format!("a window's remote key {word:#x} has more than 32 bits"),
            )
        })
    };
    let mut paths = Vec::with_capacity(members.len());
    for (r, row) in all.chunks(4).enumerate() {
        let at = if r == me {
            At::Local {
                data: bases[me] as usize,
                control: control.clone(),
            }
        } else {
            At::Remote {
                peer: members[r],
                data: RdmaTarget {
                    addr: bases[r],
                    rkey: key(row[1])?,
                },
                control: RdmaTarget {
                    addr: row[2],
                    rkey: key(row[3])?,
                },
            }
        };
        paths.push(Arc::new(Reach {
            at,
            channel: registration.channel,
            max_len,
            pending: Mutex::new(Vec::new()),
        }));
    }
    Ok(Ok(Chosen {
        reaches: paths,
        registration,
    }))
}

impl Reach {
    fn pending(&self) -> std::sync::MutexGuard<'_, Vec<u64>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The target's rank, if it is another rank.
    fn peer(&self) -> Result<PeerRank> {
        match &self.at {
            At::Remote { peer, .. } => Ok(*peer),
            At::Local { .. } => Err(no_target()),
        }
    }

    /// The remote address of `place`, if the target is another rank.
    fn remote(&self, place: Place) -> Option<(PeerRank, RdmaTarget)> {
        let At::Remote {
            peer,
            data,
            control,
        } = &self.at
        else {
            return None;
        };
        let (base, offset) = match place {
            Place::Control(word) => (control, 8 * word as u64),
            Place::Data(offset) => (data, offset),
        };
        Some((
            *peer,
            RdmaTarget {
                addr: base.addr + offset,
                rkey: base.rkey,
            },
        ))
    }

    /// The address of `place` in this process, if the target is this rank.
    fn local(&self, place: Place) -> Option<*mut u8> {
        let At::Local { data, control } = &self.at else {
            return None;
        };
        Some(match place {
            Place::Control(word) => control.0[word].as_ptr().cast(),
            Place::Data(offset) => data.wrapping_add(offset as usize) as *mut u8,
        })
    }

    /// Posts `op` on `place`, polling while the channel has no room.
    fn post(&self, peer: PeerRank, at: RdmaTarget, op: RdmaOp<'_>) -> Result<u64> {
        progress_until(|d| d.rdma_post(peer, at, op))
    }

    /// Posts `ops` to `peer` in order, as lists of work requests as long
    /// as the channel has room for, polling between lists. The id of each
    /// operation posted is pushed to `ids`, also when an error stops the
    /// posting (those are posted, the rest not), so that the caller
    /// waits for exactly those.
    fn post_all(
        &self,
        peer: PeerRank,
        ops: &[(RdmaTarget, RdmaOp<'_>)],
        ids: &mut Vec<u64>,
    ) -> Result<()> {
        let first = ids.len();
        if ops.is_empty() {
            return Ok(());
        }
        progress_until(|d| {
            d.rdma_post_list(peer, &ops[ids.len() - first..], ids)?;
            Ok((ids.len() - first == ops.len()).then_some(()))
        })
    }

    /// Waits for operation `id`'s outcome.
    fn wait(&self, id: u64) -> Result<Vec<u8>> {
        progress_until(|d| Ok(d.rdma_take(self.channel, id)))?
    }

    /// Waits for every one of `ids` and hands each outcome to `each`
    /// with its index: the first error, after all are waited for.
    fn wait_each(
        &self,
        ids: &[u64],
        mut each: impl FnMut(usize, Vec<u8>) -> Result<()>,
    ) -> Result<()> {
        let mut outcome = Ok(());
        for (i, &id) in ids.iter().enumerate() {
            let done = self.wait(id).and_then(|bytes| each(i, bytes));
            outcome = outcome.and(done);
        }
        outcome
    }

    /// The remote pieces of `segments`: each segment in pieces of at most
    /// the channel's largest operation, with their target addresses and
    /// ranges of the operation's data, in order.
    fn pieces(&self, segments: &[Segment]) -> Result<Vec<(RdmaTarget, Range<usize>)>> {
        let mut pieces = Vec::with_capacity(segments.len());
        for s in segments {
            let mut from = s.data.start;
            while from < s.data.end {
                let len = (s.data.end - from).min(self.max_len);
                let place = Place::Data(s.disp + (from - s.data.start) as u64);
                let (_, at) = self.remote(place).ok_or_else(no_target)?;
                pieces.push((at, from..from + len));
                from += len;
            }
        }
        Ok(pieces)
    }

    /// An 8-byte atomic on `place` (8-byte aligned): its old value.
    fn atomic(&self, place: Place, op: RdmaOp<'_>) -> Result<u64> {
        let Some(ptr) = self.local(place) else {
            let (peer, at) = self.remote(place).ok_or_else(no_target)?;
            let old = self.wait(self.post(peer, at, op)?)?;
            let bytes: [u8; 8] = old
                .as_slice()
                .try_into()
                .map_err(|_| Error::new(ErrorClass::Intern, "an atomic's result is not 8 bytes"))?;
            return Ok(u64::from_ne_bytes(bytes));
        };
        // SAFETY: a control word, or an element of this rank's window that
        // the origin checked inside it and 8-byte aligned (`hardware`);
        // both outlive the paths. Peers reach these bytes only with NIC
        // atomics, which are atomic against the CPU's (the soft
        // provider's are CPU atomics).
        let word = unsafe { AtomicU64::from_ptr(ptr.cast::<u64>()) };
        Ok(match op {
            RdmaOp::FetchAdd(add) => word.fetch_add(add, Ordering::SeqCst),
            RdmaOp::CompareSwap { compare, swap } => {
                match word.compare_exchange(compare, swap, Ordering::SeqCst, Ordering::SeqCst) {
                    Ok(old) | Err(old) => old,
                }
            }
            RdmaOp::Write(_) | RdmaOp::Read(_) => {
                return Err(Error::new(
                    ErrorClass::Intern,
                    "a read or write is no atomic",
                ))
            }
        })
    }

    /// Re-reads `word` of the control block until `done` holds of it.
    fn spin(&self, word: usize, done: impl Fn(u64) -> bool) -> Result<()> {
        self.wait_until(|| {
            Ok(done(
                self.atomic(Place::Control(word), RdmaOp::FetchAdd(0))?,
            ))
        })
    }

    /// Tries `ready` until it holds: in this process's memory, as every
    /// wait on memory waits ([`wait_for_memory`]); a remote target's
    /// atomics wait for the network themselves.
    fn wait_until(&self, mut ready: impl FnMut() -> Result<bool>) -> Result<()> {
        if ready()? {
            return Ok(());
        }
        if !matches!(self.at, At::Local { .. }) {
            while !ready()? {}
            return Ok(());
        }
        let crowded = with_device(|d| Ok(d.crowded()))?;
        wait_for_memory(crowded, ready)
    }

    /// `MPI_Put`: writes `data` at byte offset `disp`; complete at the
    /// target after [`Reach::flush`].
    pub(crate) fn put(&self, disp: u64, data: &[u8]) -> Result<()> {
        let whole = Segment {
            disp,
            data: 0..data.len(),
        };
        self.put_segments(&[whole], data)
    }

    /// Writes each of `segments`' range of `data` at its displacement (a
    /// put with a target datatype, an accumulate's scatter), complete at
    /// the target after [`Reach::flush`]: their WRITEs posted as lists
    /// ([`Reach::post_all`]), each flushed later, those posted before an
    /// error included.
    pub(crate) fn put_segments(&self, segments: &[Segment], data: &[u8]) -> Result<()> {
        if let At::Local { .. } = self.at {
            for s in segments {
                let window = self.local(Place::Data(s.disp)).ok_or_else(no_target)?;
                let from = &data[s.data.clone()];
                // SAFETY: the window checked the range inside this rank's
                // window, whose memory outlives its paths; `from` is the
                // origin's buffer.
                unsafe { std::ptr::copy(from.as_ptr(), window, from.len()) };
            }
            return Ok(());
        }
        let pieces = self.pieces(segments)?;
        let ops: Vec<_> = pieces
            .iter()
            .map(|(at, range)| (*at, RdmaOp::Write(&data[range.clone()])))
            .collect();
        let mut ids = Vec::with_capacity(ops.len());
        let posted = self.post_all(self.peer()?, &ops, &mut ids);
        self.pending().extend(ids);
        posted
    }

    /// `MPI_Get`: reads the bytes at offset `disp` into `out`.
    pub(crate) fn get(&self, disp: u64, out: &mut [u8]) -> Result<()> {
        let whole = Segment {
            disp,
            data: 0..out.len(),
        };
        self.get_segments(&[whole], out)
    }

    /// Reads the bytes of each of `segments` into its range of `out` (a
    /// get with a target datatype, or an accumulate's gather): their
    /// READs posted as lists ([`Reach::post_all`]) before the first is
    /// waited for, so the segments' round trips overlap and the
    /// operation waits once.
    pub(crate) fn get_segments(&self, segments: &[Segment], out: &mut [u8]) -> Result<()> {
        if let At::Local { .. } = self.at {
            for s in segments {
                let dest = &mut out[s.data.clone()];
                let window = self.local(Place::Data(s.disp)).ok_or_else(no_target)?;
                // SAFETY: the window checked the range inside this rank's
                // window, whose memory outlives its paths; `dest` is the
                // origin's buffer.
                unsafe { std::ptr::copy(window, dest.as_mut_ptr(), dest.len()) };
            }
            return Ok(());
        }
        let pieces = self.pieces(segments)?;
        let ops: Vec<_> = pieces
            .iter()
            .map(|(at, range)| (*at, RdmaOp::Read(range.len())))
            .collect();
        let mut ids = Vec::with_capacity(ops.len());
        // The reads posted are waited for even after an error: their
        // outcomes are not left behind.
        let posted = self.post_all(self.peer()?, &ops, &mut ids);
        let read = self.wait_each(&ids, |i, bytes| {
            let range = pieces[i].1.clone();
            if bytes.len() != range.len() {
                return Err(Error::new(
                    ErrorClass::Intern,
                    "an RDMA READ returned a short result",
                ));
            }
            out[range].copy_from_slice(&bytes);
            Ok(())
        });
        posted.and(read)
    }

    /// Waits until every operation posted to the target is complete there
    /// (`MPI_Win_flush`); the first error among them, if any.
    pub(crate) fn flush(&self) -> Result<()> {
        let ids = std::mem::take(&mut *self.pending());
        if let At::Local { .. } = self.at {
            std::sync::atomic::fence(Ordering::SeqCst);
            return Ok(());
        }
        self.wait_each(&ids, |_, _| Ok(()))
    }

    /// Takes the target's lock.
    pub(crate) fn lock(&self, lock_type: LockType) -> Result<()> {
        match lock_type {
            LockType::Shared => {
                let writer = self.atomic(Place::Control(RIN), RdmaOp::FetchAdd(RINC))? & WBITS;
                if writer != 0 {
                    self.spin(RIN, |v| v & WBITS != writer)?;
                }
            }
            LockType::Exclusive => {
                let ticket = self.atomic(Place::Control(WIN), RdmaOp::FetchAdd(1))?;
                self.spin(WOUT, |v| v == ticket)?;
                let bits = PRES | (ticket & PHID);
                let readers = self.atomic(Place::Control(RIN), RdmaOp::FetchAdd(bits))?;
                self.spin(ROUT, |v| v == readers)?;
            }
        }
        Ok(())
    }

    /// Releases the target's lock (its operations flushed first).
    pub(crate) fn unlock(&self, lock_type: LockType) -> Result<()> {
        match lock_type {
            LockType::Shared => {
                self.atomic(Place::Control(ROUT), RdmaOp::FetchAdd(RINC))?;
            }
            LockType::Exclusive => {
                // Only this writer's bits are below the readers' count.
                let rin = self.atomic(Place::Control(RIN), RdmaOp::FetchAdd(0))?;
                self.atomic(
                    Place::Control(RIN),
                    RdmaOp::FetchAdd((rin & WBITS).wrapping_neg()),
                )?;
                self.atomic(Place::Control(WOUT), RdmaOp::FetchAdd(1))?;
            }
        }
        Ok(())
    }

    /// Takes the target's accumulate mutex (unless `exclusive`: this
    /// origin holds the target's exclusive lock, so nobody else may
    /// accumulate); released with the guard.
    fn mutex(&self, exclusive: bool) -> Result<Option<MutexHold<'_>>> {
        if exclusive {
            return Ok(None);
        }
        let take = RdmaOp::CompareSwap {
            compare: 0,
            swap: 1,
        };
        self.wait_until(|| Ok(self.atomic(Place::Control(MUTEX), take)? == 0))?;
        Ok(Some(MutexHold(self)))
    }
}

/// The error of a path that is neither local nor remote (never).
fn no_target() -> Error {
    Error::new(ErrorClass::Intern, "an RDMA path with no target")
}

/// A hold of a target's accumulate mutex.
struct MutexHold<'r>(&'r Reach);

impl MutexHold<'_> {
    /// Releases it (what was written under it complete first).
    fn release(self) -> Result<()> {
        let reach = self.0;
        std::mem::forget(self);
        reach.flush()?;
        reach
            .atomic(
                Place::Control(MUTEX),
                RdmaOp::CompareSwap {
                    compare: 1,
                    swap: 0,
                },
            )
            .map(drop)
    }
}

impl Drop for MutexHold<'_> {
    /// On an error path: released without waiting for anything.
    fn drop(&mut self) {
        let _ = self.0.atomic(
            Place::Control(MUTEX),
            RdmaOp::CompareSwap {
                compare: 1,
                swap: 0,
            },
        );
    }
}

/// Whether elements of `element` with `op` at byte offset `at` of a
/// window based at `base` are done with one NIC atomic each: 8-byte
/// integers, `SUM`, `NO_OP` or `REPLACE`, 8-byte aligned.
fn hardware(base: u64, at: u64, element: AccumulateType, op: AccumulateOp) -> bool {
    let integer = match element {
        AccumulateType::Basic(basic) => {
            matches!(basic, Primitive::I64 | Primitive::U64)
                || (matches!(basic, Primitive::Isize | Primitive::Usize) && usize::BITS == 64)
        }
        AccumulateType::Pair(_) => false,
    };
    let op = match op {
        AccumulateOp::Replace | AccumulateOp::NoOp => true,
        AccumulateOp::Reduce(op) => op.system_op() == SystemOp::Sum,
    };
    integer && op && (base + at).is_multiple_of(8)
}

impl Reach {
    /// The address of this target's window, for alignment.
    fn base(&self) -> u64 {
        match &self.at {
            At::Remote { data, .. } => data.addr,
            At::Local { data, .. } => *data as u64,
        }
    }
}

/// `MPI_Accumulate` (`old: None`) and `MPI_Get_accumulate`: as
/// `direct::accumulate`, on the RDMA path.
pub(crate) fn accumulate(
    reach: &Reach,
    disp: u64,
    data: &[u8],
    (element, op): (AccumulateType, AccumulateOp),
    exclusive: bool,
    old: Option<&mut [u8]>,
) -> Result<()> {
    let len = direct::accumulate_len(data, element, op, old.as_deref())?;
    if len == 0 {
        return Ok(());
    }
    if hardware(reach.base(), disp, element, op) {
        let whole = Segment { disp, data: 0..len };
        return atomic_elements(reach, &[&whole], data, op, old);
    }
    let hold = reach.mutex(exclusive)?;
    let mut current = vec![0u8; len];
    reach.get(disp, &mut current)?;
    if let Some(old) = old {
        old.copy_from_slice(&current);
    }
    if op != AccumulateOp::NoOp {
        combine(&mut current, data, element, op)?;
        reach.put(disp, &current)?;
    }
    match hold {
        Some(hold) => hold.release(),
        None => Ok(()),
    }
}

/// The elements of `segments` (all [`hardware`]) by NIC atomics, each
/// segment's operands taken from its range of `data` and its old values
/// put in its range of `old`: REPLACE a compare-and-swap loop per
/// element; SUM and NO_OP a fetch-and-add per element (of 0 for NO_OP),
/// to another rank posted as lists ([`Reach::post_all`]) and complete at
/// the flush, or waited for when the old values are wanted.
fn atomic_elements(
    reach: &Reach,
    segments: &[&Segment],
    data: &[u8],
    op: AccumulateOp,
    mut old: Option<&mut [u8]>,
) -> Result<()> {
    let operand = |at: usize| match op {
        AccumulateOp::NoOp => 0,
        _ => u64::from_ne_bytes(data[at..at + 8].try_into().expect("8 bytes")),
    };
    // Each element's place and its offset in the data (and the result).
    let elements = segments.iter().flat_map(|s| {
        (0..s.data.len() / 8).map(|i| (Place::Data(s.disp + 8 * i as u64), s.data.start + 8 * i))
    });
    if op == AccumulateOp::Replace || matches!(reach.at, At::Local { .. }) {
        for (place, at) in elements {
            let previous = match op {
                AccumulateOp::Replace => {
                    let mut current = reach.atomic(place, RdmaOp::FetchAdd(0))?;
                    loop {
                        let seen = reach.atomic(
                            place,
                            RdmaOp::CompareSwap {
                                compare: current,
                                swap: operand(at),
                            },
                        )?;
                        if seen == current {
                            break current;
                        }
                        current = seen;
                    }
                }
                _ => reach.atomic(place, RdmaOp::FetchAdd(operand(at)))?,
            };
            if let Some(old) = old.as_deref_mut() {
                old[at..at + 8].copy_from_slice(&previous.to_ne_bytes());
            }
        }
        return Ok(());
    }
    let mut ops = Vec::new();
    let mut offsets = Vec::new();
    for (place, at) in elements {
        let (_, target) = reach.remote(place).ok_or_else(no_target)?;
        ops.push((target, RdmaOp::FetchAdd(operand(at))));
        offsets.push(at);
    }
    let mut ids = Vec::with_capacity(ops.len());
    let posted = reach.post_all(reach.peer()?, &ops, &mut ids);
    let Some(old) = old else {
        // Nothing to hand back: complete at the flush.
        reach.pending().extend(ids);
        return posted;
    };
    let fetched = reach.wait_each(&ids, |i, bytes| {
        let at = offsets[i];
        if bytes.len() != 8 {
            return Err(Error::new(
                ErrorClass::Intern,
                "an atomic's result is not 8 bytes",
            ));
        }
        old[at..at + 8].copy_from_slice(&bytes);
        Ok(())
    });
    posted.and(fetched)
}

/// `MPI_Accumulate` and `MPI_Get_accumulate` with a target datatype, as
/// `direct::accumulate_segments`, on the RDMA path: the segments whose
/// elements go by NIC atomics ([`hardware`]) element by element (their
/// fetch-and-adds posted as lists, [`atomic_elements`]), and all the
/// others under one hold of the target's accumulate mutex (none under
/// the exclusive lock): their READs posted as lists and waited for once,
/// the reduction here on the packed data (so a layout whose segments cut
/// value-index pairs is combined whole), and their WRITEs posted as
/// lists and completed before the mutex is released.
pub(crate) fn accumulate_segments(
    reach: &Reach,
    segments: &[Segment],
    data: &[u8],
    (element, op): (AccumulateType, AccumulateOp),
    exclusive: bool,
    mut old: Option<&mut [u8]>,
) -> Result<()> {
    let len = direct::accumulate_len(data, element, op, old.as_deref())?;
    direct::check_covered(segments, len, element)?;
    // Numbers' segments hold whole elements, so each may go its own way.
    let (atomics, locked): (Vec<&Segment>, Vec<&Segment>) = segments
        .iter()
        .partition(|s| hardware(reach.base(), s.disp, element, op));
    atomic_elements(reach, &atomics, data, op, old.as_deref_mut())?;
    if locked.is_empty() {
        return Ok(());
    }
    // The locked segments' data packed, and where each lies in it.
    let mut gathered = Vec::with_capacity(locked.len());
    let mut at = 0;
    for s in &locked {
        gathered.push(Segment {
            disp: s.disp,
            data: at..at + s.data.len(),
        });
        at += s.data.len();
    }
    // The op checked for the type before the mutex is taken.
    if let AccumulateOp::Reduce(reduce) = op {
        element.reduction(reduce.system_op())?;
    }
    let hold = reach.mutex(exclusive)?;
    let mut current = vec![0u8; at];
    reach.get_segments(&gathered, &mut current)?;
    for (s, g) in locked.iter().zip(&gathered) {
        if let Some(old) = old.as_deref_mut() {
            old[s.data.clone()].copy_from_slice(&current[g.data.clone()]);
        }
    }
    if op != AccumulateOp::NoOp {
        let origin: Vec<u8>;
        let origin = if gathered.len() == segments.len() {
            data
        } else {
            origin = locked
                .iter()
                .flat_map(|s| data[s.data.clone()].iter().copied())
                .collect();
            &origin
        };
        combine(&mut current, origin, element, op)?;
        reach.put_segments(&gathered, &current)?;
    }
    match hold {
        Some(hold) => hold.release(),
        None => Ok(()),
    }
}

/// `MPI_Compare_and_swap` of one element: `data` is the compare value
/// followed by the new one; the old value goes to `old`. One NIC
/// compare-and-swap for an aligned 8-byte element, else under the
/// accumulate mutex.
pub(crate) fn compare_and_swap(
    reach: &Reach,
    disp: u64,
    data: &[u8],
    exclusive: bool,
    old: &mut [u8],
) -> Result<()> {
    if data.len() != 2 * old.len() {
        return Err(Error::new(
            ErrorClass::Count,
            format!(
                "a compare-and-swap of {} bytes for {} bytes",
                data.len(),
                old.len()
            ),
        ));
    }
    let (compare, new) = data.split_at(old.len());
    if old.len() == 8 && (reach.base() + disp).is_multiple_of(8) {
        let word = |b: &[u8]| u64::from_ne_bytes(b.try_into().expect("8 bytes"));
        let seen = reach.atomic(
            Place::Data(disp),
            RdmaOp::CompareSwap {
                compare: word(compare),
                swap: word(new),
            },
        )?;
        old.copy_from_slice(&seen.to_ne_bytes());
        return Ok(());
    }
    let hold = reach.mutex(exclusive)?;
    reach.get(disp, old)?;
    if old == compare {
        reach.put(disp, new)?;
    }
    match hold {
        Some(hold) => hold.release(),
        None => Ok(()),
    }
}
