//! How an origin reaches a target's window: the seam between the
//! device-independent window and the ways of moving the data.
//!
//! [`Path`] is chosen per target when the window is made
//! (`Window::choose_paths`) and every operation and synchronization to
//! that target goes through it. Two ways:
//!
//! - [`Path::ActiveMessages`], for every transport: each operation is an
//!   active message (`wire.rs`) that the target's progress engine applies
//!   (`target.rs`), answered with a reply that completes it here. Puts
//!   accumulates and fetching operations are queued and leave in batches
//!   (`target::Outbox`), sent by a flush or any wait or test.
//!   Locks are requests to the target's fair lock queue, queued with the
//!   epoch's operations rather than waited for: the target holds what
//!   an origin sends behind a request until it grants it.
//! - [`Path::Direct`], for the windows of one host (`MPI_Win_allocate`
//!   and `MPI_Win_allocate_shared` in shared memory, `MPI_Win_create` by
//!   cross-memory attach), when every rank mapped every rank's window
//!   segment (the window decides, and all ranks agree): the origin does
//!   the work itself on the target's window (`direct.rs`), so the target
//!   need not be in MPI at all. Locks are the segment's fair
//!   reader-writer lock; flushes are memory fences, every operation being
//!   complete at the target when it returns.
//! - [`Path::Rdma`], for windows of `MPI_Win_create` and
//!   `MPI_Win_allocate` whose every other rank is reached by a transport
//!   with a one-sided channel (verbs), when every rank registered its
//!   window (`rdma.rs`): the origin's NIC does the work, so the target
//!   need not be in MPI either. Locks are a phase-fair lock of NIC atomics
//!   on words in the target's registered memory; flushes wait for the
//!   completions of what was posted.
//!
//! The window, its epochs and its checks (range, epoch, datatypes) are
//! the same for both, done before a path is taken. A path must give the
//! same guarantees: an operation is complete at the target once `flush`
//! returns for it, an accumulate is atomic per element with respect to
//! the other accumulates to that target, and a lock excludes the other
//! lock holders. A window uses one kind of path for all its targets, so
//! two never meet on one window.

use super::direct;
use super::rdma;
use super::target::{self, Pending, Shared};
use super::wire::{
    AccumulateOp, AccumulateType, Kind, Layout, Message, FLAG_EXCLUSIVE, FLAG_FETCH, FLAG_LAYOUT,
    HEADER,
};
use super::LockType;
use crate::datatype::{Primitive, Run};
use crate::{progress_until, with_device, Error, Result};
use oxmpi_adi::device::{Device, RequestId};
use oxmpi_adi::proto::{MAX_ACTIVE_LEN, PIECE_LEN};
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The most data one message carries: a larger operation is split (on
/// element boundaries: this is a multiple of every basic type's size and
/// of every value-index pair's, 6, 8, 12 and 16 bytes).
/// Pieces well below the active-message limit let the target copy one
/// piece while the previous one is on the wire: over TCP a 1 MiB get
/// took 960 us as one piece, 290 us as 8 pieces of 128 KiB (16 of
/// 64 KiB did worse again: 580 us).
const CHUNK: usize = (128 * 1024 - HEADER) / 16 * 16;
const _: () = assert!(CHUNK + HEADER <= MAX_ACTIVE_LEN as usize);
const _: () = assert!(CHUNK.is_multiple_of(16) && CHUNK.is_multiple_of(12));

/// Which window and target an operation is for.
pub(crate) struct Target<'w> {
    /// The window's state.
    pub(crate) shared: &'w Shared,
    /// The window's context id.
    pub(crate) context_id: u32,
    /// The target's rank in the window's communicator.
    pub(crate) rank: usize,
    /// Whether this origin holds the target's exclusive lock (then the
    /// direct path needs no region mutexes).
    pub(crate) exclusive: bool,
    /// Whether this origin holds a lock on the target it took (a lock or
    /// lock_all without `MODE_NOCHECK`).
    pub(crate) locked: bool,
}

/// How this rank reaches one target's window: see the module docs.
#[derive(Clone, Debug)]
pub(crate) enum Path {
    /// Active messages handled by the target's progress engine.
    ActiveMessages,
    /// The origin reaches the target's window itself.
    Direct(direct::Reach),
    /// The origin's NIC reaches the target's registered window.
    Rdma(Arc<rdma::Reach>),
}

impl Path {
    /// Writes `data` at byte displacement `disp` (`MPI_Put`); the data is
    /// copied, or has left `data`, before this returns. Inlined, as
    /// [`Path::flush`]: on the direct path a put of a few bytes is then
    /// the range checks and the copy in the caller, the other paths a
    /// call.
    #[inline]
    pub(crate) fn put(&self, to: &Target<'_>, disp: u64, data: &[u8]) -> Result<()> {
        match self {
            Path::ActiveMessages => put_active(to, disp, data),
            Path::Direct(reach) => {
                let _open = reach.open(to.locked)?;
                direct::put(reach, disp, data)
            }
            Path::Rdma(reach) => reach.put(disp, data),
        }
    }

    /// Combines `data` (elements of `element`) into the target's with
    /// `op` (`MPI_Accumulate`); the data is copied, or has left `data`,
    /// before this returns. Always inlined, as [`Path::put`] (the other
    /// paths are calls): on the direct path an accumulate of a few
    /// elements is then the checks, the region mutex and the kernel in
    /// the caller (a call of this function, which took a `Target` through
    /// memory and saved registers, cost an 8-byte accumulate 20
    /// instructions).
    #[inline(always)]
    pub(crate) fn accumulate(
        &self,
        to: &Target<'_>,
        disp: u64,
        data: &[u8],
        element: AccumulateType,
        op: AccumulateOp,
    ) -> Result<()> {
        match self {
            Path::ActiveMessages => accumulate_active(to, disp, data, element, op),
            Path::Direct(reach) => {
                let _open = reach.open(to.locked)?;
                direct::accumulate(reach, disp, data, (element, op), to.exclusive, None)
            }
            Path::Rdma(reach) => {
                rdma::accumulate(reach, disp, data, (element, op), to.exclusive, None)
            }
        }
    }

    /// Starts a fetching operation into `result` (`len` bytes at
    /// `result`): a get, a fetching accumulate or a compare-and-swap
    /// ([`Fetch`]). Returns the request that completes when the result is
    /// in place, or `None` when it is in place already (the direct and
    /// RDMA paths).
    ///
    /// Always inlined (its one caller, `Window::start_fetch`, is inlined
    /// in each fetching operation): where the operation is known, as a
    /// get, only its arms are left, and a get on the direct path is then
    /// a range check and a copy in the caller, as a put is; the other
    /// operations and paths are calls. With `#[inline]` alone the
    /// compiler kept the whole of it out of line, and a get paid a call
    /// that returned its result through memory.
    ///
    /// # Safety
    /// `result` must be writable for `len` bytes, and not otherwise
    /// accessed, until the returned request completes.
    #[inline(always)]
    pub(crate) unsafe fn fetch(
        &self,
        to: &Target<'_>,
        disp: u64,
        result: *mut u8,
        len: usize,
        what: Fetch<'_>,
    ) -> Result<Option<RequestId>> {
        match self {
            // SAFETY: the caller's guarantee.
            Path::ActiveMessages => unsafe { fetch_active(to, disp, result, len, what) },
            Path::Direct(segment) => {
                let _open = segment.open(to.locked)?;
                // SAFETY: the caller's guarantee (this returns with the
                // operation done).
                let out = unsafe { result_slice(result, len) };
                match what {
                    Fetch::Get => direct::get(segment, disp, out)?,
                    Fetch::Accumulate { element, op, data } => direct::accumulate(
                        segment,
                        disp,
                        data,
                        (element, op),
                        to.exclusive,
                        Some(out),
                    )?,
                    Fetch::CompareAndSwap { data, .. } => {
                        direct::compare_and_swap(segment, disp, data, to.exclusive, out)?
                    }
                }
                Ok(None)
            }
            Path::Rdma(reach) => {
                // SAFETY: as above.
                let out = unsafe { result_slice(result, len) };
                match what {
                    Fetch::Get => reach.get(disp, out)?,
                    Fetch::Accumulate { element, op, data } => {
                        rdma::accumulate(reach, disp, data, (element, op), to.exclusive, Some(out))?
                    }
                    Fetch::CompareAndSwap { data, .. } => {
                        rdma::compare_and_swap(reach, disp, data, to.exclusive, out)?
                    }
                }
                Ok(None)
            }
        }
    }

    /// Takes the target's lock (`MPI_Win_lock` without `MODE_NOCHECK`).
    /// The direct and RDMA paths wait until it is granted. By active
    /// messages the request is queued, to leave with the epoch's first
    /// operations (or its unlock) and be answered with their replies,
    /// unless `wait` (a lock on this rank's own window, whose memory the
    /// program may then load and store): the target handles the
    /// operations behind the request only once it grants it, so they
    /// hold the lock all the same, and a lock, a put and an unlock cost
    /// one round trip, not three.
    pub(crate) fn lock(&self, to: &Target<'_>, lock_type: LockType, wait: bool) -> Result<()> {
        match self {
            Path::ActiveMessages => {
                let mut m = Message::new(Kind::Lock, 0);
                if lock_type == LockType::Exclusive {
                    m.flags = FLAG_EXCLUSIVE;
                }
                let token = with_device(|d| send(d, to, Some(Pending::Sync), m, wait))?;
                if wait {
                    return wait_reply(to, token);
                }
                to.shared.state().lock_requests[to.rank] = token;
                Ok(())
            }
            // Waits in the kernel if need be: nothing here needs this
            // rank's progress meanwhile.
            Path::Direct(segment) => {
                match lock_type {
                    LockType::Shared => segment.lock().lock_shared(segment.wait_policy()),
                    LockType::Exclusive => segment.lock().lock_exclusive(segment.wait_policy()),
                }
                Ok(())
            }
            Path::Rdma(reach) => reach.lock(lock_type),
        }
    }

    /// Completes every operation to the target there, then releases its
    /// lock of `lock_type`; by active messages, sends the release behind
    /// the operations queued instead, and [`Path::flush`] completes both:
    /// the target handles an origin's messages in order, so the unlock's
    /// reply follows every operation's, and an unlock costs one round
    /// trip, not a flush's and its own (`MPI_Win_unlock_all` sends every
    /// target's before it waits for any). On the direct path the
    /// release's first instruction is a locked read-modify-write, a full
    /// barrier on x86-64 as the flush's fence is, so the flush's fence
    /// is left out there (it was a fifth of a
    /// lock-compare-and-swap-unlock) and only the thread's epoch of
    /// copies starts anew.
    pub(crate) fn release(&self, to: &Target<'_>, lock_type: LockType) -> Result<()> {
        match self {
            Path::ActiveMessages => {
                to.shared.state().lock_requests[to.rank] = 0;
                let m = Message::new(Kind::Unlock, 0);
                with_device(|d| send(d, to, Some(Pending::Sync), m, true)).map(drop)
            }
            Path::Direct(segment) => {
                direct::complete_before_barrier();
                match lock_type {
                    LockType::Shared => segment.lock().unlock_shared(),
                    LockType::Exclusive => segment.lock().unlock_exclusive(),
                }
                Ok(())
            }
            Path::Rdma(reach) => {
                reach.flush()?;
                reach.unlock(lock_type)
            }
        }
    }

    /// Completes every operation to the target there, then releases its
    /// lock of `lock_type` (`MPI_Win_unlock` of a lock that was taken):
    /// [`Path::release`], and by active messages the wait for the
    /// replies, unless every reply awaited came before (the grant and
    /// the operations': a get's, a fetch-and-op's, whose calls waited for
    /// them): the operations are complete at the target then, and the
    /// release, sent now, needs no wait (it reaches the target before
    /// anything this rank sends it later, a next lock request too); the
    /// next completion call to the target (a flush, an unlock, `free`)
    /// counts its reply. A lock, a get and an unlock are then one round
    /// trip, not two.
    #[inline]
    pub(crate) fn flush_and_unlock(&self, to: &Target<'_>, lock_type: LockType) -> Result<()> {
        match self {
            Path::ActiveMessages => {
                let complete = to.shared.state().outstanding[to.rank] == 0;
                self.release(to, lock_type)?;
                if complete {
                    return Ok(());
                }
                flush_active(self, to)
            }
            Path::Direct(_) | Path::Rdma(_) => self.release(to, lock_type),
        }
    }

    /// Waits until every operation to the target is complete there
    /// (`MPI_Win_flush`). Inlined: on the direct path a flush is at most
    /// a fence.
    #[inline]
    pub(crate) fn flush(&self, to: &Target<'_>) -> Result<()> {
        match self {
            Path::ActiveMessages => flush_active(self, to),
            // Every operation is done when it returns: a fence, if plain
            // stores may still wait in this CPU, orders them before
            // whatever this rank does next (an unlock, a message).
            Path::Direct(_) => {
                direct::complete();
                Ok(())
            }
            Path::Rdma(reach) => reach.flush(),
        }
    }

    /// Sends the operations queued for the target, without waiting for
    /// their replies: a flush of several targets sends all before it
    /// waits for any.
    pub(crate) fn send_queued(&self, to: &Target<'_>) -> Result<()> {
        match self {
            Path::ActiveMessages => with_device(|d| {
                to.shared
                    .state()
                    .send(d, (to.shared, to.context_id), to.rank)
            }),
            Path::Direct(_) | Path::Rdma(_) => Ok(()),
        }
    }

    /// Tells the target this rank opened an exposure epoch to it
    /// (`Kind::Post`) or ended its access epoch (`Kind::Complete`).
    /// A message on every path (after what was queued for the target):
    /// the data moved before it.
    pub(crate) fn notify(&self, to: &Target<'_>, kind: Kind) -> Result<()> {
        with_device(|d| send(d, to, None, Message::new(kind, 0), true)).map(drop)
    }
}

/// One segment of an operation with a target datatype on the direct and
/// RDMA paths (`typed.rs`): its byte displacement in the target's window
/// and its range of the operation's packed data (or result). An
/// operation's segments are in type-map order, their ranges one after
/// another.
#[derive(Clone, Debug)]
pub(crate) struct Segment {
    pub(crate) disp: u64,
    pub(crate) data: Range<usize>,
}

/// One message's share of an operation by active messages: where it
/// goes at the target (`disp`, and the runs from it of a target layout,
/// [`FLAG_LAYOUT`]; none for contiguous bytes) and its range of the
/// operation's data (or result).
pub(crate) struct Part<'r> {
    pub(crate) disp: u64,
    pub(crate) layout: &'r [Run],
    pub(crate) data: Range<usize>,
}

impl Part<'_> {
    /// A message of `kind` for this part, carrying its range of `data`
    /// if given (a get and a no-op carry none).
    fn message<'m>(&'m self, kind: Kind, data: Option<&'m [u8]>) -> Message<'m> {
        let mut m = Message::new(kind, 0);
        m.disp = self.disp;
        m.len = self.data.len() as u64;
        if !self.layout.is_empty() {
            m.flags = FLAG_LAYOUT;
            m.layout = Layout::Runs(self.layout);
        }
        if let Some(data) = data {
            m.data = &data[self.data.clone()];
        }
        m
    }
}

/// The parts of a contiguous operation on `len` bytes at `disp`: pieces
/// of at most [`CHUNK`] bytes.
fn contiguous(disp: u64, len: usize) -> impl ExactSizeIterator<Item = Part<'static>> {
    chunks(len).map(move |(offset, chunk)| Part {
        disp: disp + offset as u64,
        layout: &[],
        data: offset..offset + chunk,
    })
}

/// [`Path::put`] by active messages.
fn put_active(to: &Target<'_>, disp: u64, data: &[u8]) -> Result<()> {
    if data.len() >= target::PUT_PLACED {
        return target::put_placed(to, disp, data);
    }
    put_parts(to, contiguous(disp, data.len()), data)
}

/// Puts `data` as the messages of `parts`, queued for the target (a put
/// with a target layout comes here directly: `typed.rs`).
pub(crate) fn put_parts<'r>(
    to: &Target<'_>,
    parts: impl IntoIterator<Item = Part<'r>>,
    data: &[u8],
) -> Result<()> {
    with_device(|d| {
        for part in parts {
            let m = part.message(Kind::Put, Some(data));
            send(d, to, Some(Pending::Done), m, false)?;
        }
        Ok(())
    })
}

/// [`Path::accumulate`] by active messages. Never inlined, as
/// [`flush_active`]: the direct path's accumulate is inlined in its caller.
#[inline(never)]
fn accumulate_active(
    to: &Target<'_>,
    disp: u64,
    data: &[u8],
    element: AccumulateType,
    op: AccumulateOp,
) -> Result<()> {
    // By message only where the transport's pieces of it hold whole
    // elements (every basic type's, not 6- or 12-byte pairs'), as the
    // target combines each piece as it lands.
    if data.len() >= target::ACCUMULATE_BY_MESSAGE
        && op != AccumulateOp::NoOp
        && PIECE_LEN.is_multiple_of(element.size())
    {
        return target::accumulate_by_message(to, disp, data, element, op);
    }
    accumulate_parts(to, contiguous(disp, data.len()), data, (element, op))
}

/// Combines `data` (elements of `element`) with `op` as the messages of
/// `parts`, queued for the target (an accumulate with a target layout
/// comes here directly: `typed.rs`).
pub(crate) fn accumulate_parts<'r>(
    to: &Target<'_>,
    parts: impl IntoIterator<Item = Part<'r>>,
    data: &[u8],
    (element, op): (AccumulateType, AccumulateOp),
) -> Result<()> {
    with_device(|d| {
        for part in parts {
            // A no-op carries no data.
            let mut m = part.message(Kind::Accumulate, (op != AccumulateOp::NoOp).then_some(data));
            m.element = Some(element);
            m.op = Some(op);
            send(d, to, Some(Pending::Done), m, false)?;
        }
        Ok(())
    })
}

/// [`Path::flush`] by active messages: sends what is queued and waits
/// for every reply, a lock request's grant and an unlock's release
/// among them; the target's loss if it is lost before they came (the
/// operations' own replies are ended with it, `State::lose_target`, but
/// not a lock's or an unlock's). Never inlined: inlined, it made
/// `Path::flush` too large to inline, and a flush on the direct path
/// paid a call.
#[inline(never)]
fn flush_active(path: &Path, to: &Target<'_>) -> Result<()> {
    path.send_queued(to)?;
    let peer = to.shared.member(to.rank);
    progress_until(|d| {
        let mut state = to.shared.state();
        if state.outstanding[to.rank] == 0 {
            return Ok(Some(()));
        }
        match d.peer_failure(peer) {
            Some(e) => {
                state.forget_syncs(to.rank);
                Err(e)
            }
            None => Ok(None),
        }
    })
}

/// Waits for the grant of the lock asked of the target without waiting
/// ([`Path::lock`]), unless it came: before an operation whose data
/// travels with a rendezvous the target answers only once it handles
/// the operation (a large accumulate's,
/// `target::accumulate_by_message`), which must not wait behind the
/// request at the target. (A large put's placed data does not wait for
/// the grant: the target holds it back, or grants the request it came
/// with early, `target::Placer`.)
pub(crate) fn await_grant(to: &Target<'_>) -> Result<()> {
    let token = std::mem::take(&mut to.shared.state().lock_requests[to.rank]);
    if token == 0 {
        return Ok(());
    }
    with_device(|d| {
        to.shared
            .state()
            .send(d, (to.shared, to.context_id), to.rank)
    })?;
    wait_reply(to, token)
}

/// [`Path::fetch`] by active messages: the request that the last reply
/// completes.
///
/// # Safety
/// As [`Path::fetch`]'s.
unsafe fn fetch_active(
    to: &Target<'_>,
    disp: u64,
    result: *mut u8,
    len: usize,
    what: Fetch<'_>,
) -> Result<Option<RequestId>> {
    if matches!(what, Fetch::Get) && len >= target::GET_BY_MESSAGE {
        // SAFETY: the caller's guarantee, passed on.
        return with_device(|d| unsafe { target::get_by_message(d, to, disp, result, len) })
            .map(Some);
    }
    // A compare-and-swap's element, far shorter than a chunk, is one.
    let parts = contiguous(disp, len);
    // SAFETY: the caller's guarantee; the parts cover `0..len`.
    unsafe { fetch_parts(to, parts, result, Some(what)) }.map(Some)
}

/// Asks the target whether every segment of the layouts of `parts` lies
/// in its window, and waits for the answer: per part a no-op accumulate
/// of bytes that fetches nothing (no data either way), which the target
/// checks as any message and refuses if a segment lies outside. Sent
/// before the data of an operation of several messages to a window whose
/// memory only the target knows (a dynamic window: `typed.rs`), so that
/// none of it lands if one of its messages would be refused.
pub(crate) fn check_parts(to: &Target<'_>, parts: Vec<Part<'_>>) -> Result<()> {
    let nowhere = std::ptr::NonNull::<u8>::dangling().as_ptr();
    // SAFETY: no part's reply places a byte (`None`: a result of 0 bytes
    // each), and a dangling pointer is valid for 0 bytes.
    let request = unsafe { fetch_parts(to, parts.into_iter(), nowhere, None) }?;
    let status = crate::wait_request(request)?;
    status.error.map_or(Ok(()), Err)
}

/// Starts a fetching operation `what` as the messages of `parts` into
/// `result` (each part's range of it), queued for the target: the
/// request that the last reply completes (a fetching operation with a
/// target layout comes here directly: `typed.rs`). `None` asks only
/// whether the parts' segments lie in the target's window, and fetches
/// nothing ([`check_parts`]).
///
/// # Safety
/// `result` must be writable for the bytes of every part's range (none
/// under `None`), and not otherwise accessed, until the returned request
/// completes.
pub(crate) unsafe fn fetch_parts<'r>(
    to: &Target<'_>,
    parts: impl ExactSizeIterator<Item = Part<'r>>,
    result: *mut u8,
    what: Option<Fetch<'_>>,
) -> Result<RequestId> {
    with_device(|d| {
        let request = d.start_generalized();
        let last_index = parts.len().saturating_sub(1);
        if parts.len() == 0 {
            d.complete_generalized(request, None);
        }
        for (i, part) in parts.enumerate() {
            let m = match what {
                None => {
                    let mut m = part.message(Kind::Accumulate, None);
                    m.element = Some(AccumulateType::Basic(Primitive::U8));
                    m.op = Some(AccumulateOp::NoOp);
                    m
                }
                Some(Fetch::Get) => part.message(Kind::Get, None),
                Some(Fetch::Accumulate { element, op, data }) => {
                    // A no-op carries no data.
                    let data = (op != AccumulateOp::NoOp).then_some(data);
                    let mut m = part.message(Kind::Accumulate, data);
                    m.flags |= FLAG_FETCH;
                    m.element = Some(element);
                    m.op = Some(op);
                    m
                }
                Some(Fetch::CompareAndSwap { element, data }) => {
                    let mut m = part.message(Kind::CompareAndSwap, None);
                    m.element = Some(AccumulateType::Basic(element));
                    m.data = data;
                    m
                }
            };
            let pending = Pending::Fetch {
                // In bounds: the caller's guarantee.
                dest: result.wrapping_add(part.data.start),
                len: if what.is_some() { part.data.len() } else { 0 },
                request,
                last: i == last_index,
            };
            // Queued as the others: the wait or test of its
            // request sends it (`progress_until`, `progress_once`).
            if let Err(e) = send(d, to, Some(pending), m, false) {
                d.complete_generalized(request, Some(e.clone()));
                d.take_status(request);
                return Err(e);
            }
        }
        Ok(request)
    })
}

/// What a fetching operation does at the target.
#[derive(Clone, Copy)]
pub(crate) enum Fetch<'d> {
    /// Reads the target's data.
    Get,
    /// Combines `data` into it, answering with the old data.
    Accumulate {
        element: AccumulateType,
        op: AccumulateOp,
        data: &'d [u8],
    },
    /// Compares and swaps one element: `data` is the compare value
    /// followed by the new one.
    CompareAndSwap { element: Primitive, data: &'d [u8] },
}

/// The result buffer of a fetching operation the path does before it
/// returns.
///
/// # Safety
/// `result` must be writable for `len` bytes, and not otherwise accessed,
/// while the slice lives.
unsafe fn result_slice<'r>(result: *mut u8, len: usize) -> &'r mut [u8] {
    if len == 0 {
        return &mut [];
    }
    // SAFETY: the caller's guarantee.
    unsafe { std::slice::from_raw_parts_mut(result, len) }
}

/// The chunks (offset, length) of `len` bytes.
fn chunks(len: usize) -> impl ExactSizeIterator<Item = (usize, usize)> {
    target::pieces(len, CHUNK)
}

/// Queues `m` for the target, noting what its reply completes (`None`:
/// no reply), and sends the queue at once if `now`; its token.
fn send(
    d: &mut Device,
    to: &Target<'_>,
    pending: Option<Pending>,
    m: Message<'_>,
    now: bool,
) -> Result<u64> {
    let window = (to.shared, to.context_id);
    let mut state = to.shared.state();
    let token = state.queue(d, window, to.rank, pending, m)?;
    if now {
        state.send(d, window, to.rank)?;
    }
    Ok(token)
}

/// Waits for the reply to `token` (a lock or unlock); the target's loss
/// if it is lost before the reply came.
fn wait_reply(to: &Target<'_>, token: u64) -> Result<()> {
    let peer = to.shared.member(to.rank);
    progress_until(|d| {
        let mut state = to.shared.state();
        if !state.awaits(token) {
            return Ok(Some(()));
        }
        match d.peer_failure(peer) {
            Some(e) => {
                state.forget(token);
                Err(e)
            }
            None => Ok(None),
        }
    })
}

/// The first error recorded for operations without requests, if any
/// (all are taken). Inlined: on every flush, and usually one load.
#[inline]
pub(crate) fn take_errors(shared: &Shared) -> Result<()> {
    if !shared.errors_recorded.load(Ordering::Acquire) {
        return Ok(());
    }
    take_recorded(shared)
}

/// [`take_errors`] once the flag says that an error was recorded.
#[cold]
fn take_recorded(shared: &Shared) -> Result<()> {
    let mut state = shared.state();
    shared.errors_recorded.store(false, Ordering::Release);
    let mut errors = std::mem::take(&mut state.errors);
    match errors.len() {
        0 => Ok(()),
        1 => Err(errors.remove(0)),
        n => {
            let first = errors.remove(0);
            Err(Error::new(
                first.class(),
                format!("{} (and {} more failed operations)", first.message(), n - 1),
            ))
        }
    }
}
