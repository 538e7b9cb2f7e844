//! The state of a window that active messages reach, and their handler.
//!
//! Every window of this process is registered here under its context id
//! (that of the window's own communicator copy, the same on every rank),
//! as a [`Shared`]: the local memory that other ranks' operations read and
//! write, the lock other ranks take on it, and this rank's operations in
//! flight as an origin, which the replies complete. [`Handler`] is the
//! device's `ActiveMessageHandler`: it runs inside the progress engine,
//! with the device locked, so it never waits; it applies operations to
//! the local memory (accumulates with the reduction kernels of
//! [`crate::collective::op`]) and answers them.
//!
//! Messages travel in batches: an origin queues its puts and accumulates
//! to a target in an [`Outbox`] and sends them as one active message
//! when the batch reaches [`BATCH`] bytes, at a flush (and so at unlock,
//! fence and complete), or when this rank waits or tests in any call
//! ([`send_queued`]): fetching operations too, whose requests are waited
//! for or tested, and lock requests, which are queued as operations are
//! and travel with the epoch's first ones. The handler applies a batch's
//! messages in order and answers them all in one message: so a stream of
//! small puts costs a few socket writes, not one each way per put, and a
//! lock, a put and an unlock one message each way. Messages behind a
//! lock request that must wait are kept with it ([`LockQueue`]) and
//! handled once it is granted.
//!
//! Puts from [`PUT_PLACED`] bytes stream their data behind the batch as
//! placed active messages (`oxmpi_adi::proto::FLAG_PLACED`, key: the byte
//! displacement), sent from the origin's buffer without a copy: the
//! target's [`Placer`] checks the range when the header arrives, before
//! a byte is read, and the transport reads the data straight into the
//! window (a refused put's data is dropped unread); the handler answers
//! once it landed. The origin does not wait for its lock's grant before
//! it sends them: where the peer's epoch lacks a grant (its lock request
//! waits, or is queued unhandled) the placer holds the data back, read
//! into a payload that the handler puts in its turn, behind the request
//! as any put, unless it can grant the queued request at once, early.
//!
//! Gets from [`GET_BY_MESSAGE`] bytes (and accumulates from
//! [`ACCUMULATE_BY_MESSAGE`]) carry only their header in an active
//! message ([`FLAG_BY_MESSAGE`]): their data travels as a point-to-point
//! message of the window's communicator, which the device moves between
//! the window and the origin's buffer without a copy of its own (a
//! rendezvous beyond the transport's eager limit). A get's origin posts
//! the receive into its result buffer before the get leaves, and the
//! target sends from its window; an accumulate's origin sends from its
//! buffer, and the target combines each piece into its window as it
//! lands and answers once all is there. The device requests of these
//! transfers are watched ([`progress`], on every turn of a blocking
//! call's loop) until they complete.
//!
//! Lock order: the device, then the transfers, then the registry, then a
//! window's state. Nothing takes the device while it holds any of the
//! others.

use super::path::{await_grant, Target};
use super::wire::{
    count_one_more, is_counted_reply, set_data_len, AccumulateOp, AccumulateType, Kind, Message,
    FLAG_BY_MESSAGE, FLAG_EXCLUSIVE, FLAG_FETCH, FLAG_LAYOUT, HEADER,
};
use crate::{context, progress_until, with_device, Error, ErrorClass, Result};
use oxmpi_adi::device::{
    ActiveMessage, ActiveMessageHandler, ActivePlacer, Destination, Device, Landing, MatchPattern,
    MessageEnvelope, MessageSink, RequestId, Status,
};
use oxmpi_adi::proto::MAX_ACTIVE_LEN;
use oxmpi_adi::transport::PeerRank;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// The bytes of queued messages at which an outbox is sent without
/// waiting for a synchronization: far below the active-message limit
/// (the last message may add a piece of `path::CHUNK` bytes), and large
/// enough that a window of small puts is one write.
pub(crate) const BATCH: usize = 64 * 1024;

/// The data at which a message leaves at once (with what was queued
/// before it) rather than wait for more: the target copies a large piece
/// while the next is on the wire, where it would wait for a whole batch
/// (puts of 16 KiB over TCP lost about a quarter of their bandwidth in
/// batches of four; up to 8 KiB batches gained).
const ALONE: usize = 16 * 1024;

/// The data at which a get travels apart from its active message, as a
/// point-to-point message of the window's communicator
/// ([`FLAG_BY_MESSAGE`]): the device then moves it from the window into
/// the result buffer with no copy of its own (a rendezvous beyond the
/// transport's eager limit; below it, the data still lands straight in
/// the receive the origin posted first), where an active message's reply
/// is copied into it at the target and out of its payload at the origin.
/// The same size as [`ALONE`]: data this large leaves at once either way.
pub(crate) const GET_BY_MESSAGE: usize = ALONE;

/// The data at which a put streams behind the batch as placed active
/// messages ([`put_placed`]) of at most `MAX_ACTIVE_LEN` bytes each,
/// which land straight in the target's window: no copy at either end,
/// and no rendezvous to wait for (as a point-to-point message from
/// 64 KiB, a put waited for each rendezvous's CTS in turn before it
/// returned). A smaller put stays in the batch (copied once at each end,
/// applied on arrival), or from [`ALONE`] has its data written behind
/// its header from the origin's buffer and copied into the window.
pub(crate) const PUT_PLACED: usize = 64 * 1024;

/// The data at which an accumulate (without fetch) travels apart from
/// its active message, as a point-to-point message that the target
/// combines into its window piece by piece as the pieces land (the
/// device's streamed rendezvous: pieces of `proto::PIECE_LEN`, 256 KiB,
/// so one or more whole pieces): no copy at the origin, and none but
/// the socket's read at the target. The origin waits for the target's
/// answer (the operations after it must find it applied: accumulates
/// are ordered), a round trip, and the rendezvous adds another, that
/// smaller ones do not win back now that an active message's data of
/// [`ALONE`] bytes or more leaves from the origin's buffer too (the
/// target combines each 128 KiB piece as the next is on the wire): at
/// 512 KiB over TCP, callgrind counted both ranks' instructions 18%
/// lower in active messages than by message from 256 KiB.
pub(crate) const ACCUMULATE_BY_MESSAGE: usize = 1024 * 1024;

/// The tag of the point-to-point messages that carry accumulates' data
/// (from the origin). They are received in the order their operations'
/// active messages arrive, which is the order they were sent: one tag
/// serves.
const DATA_TAG: i32 = i32::MAX;

/// The tag of the point-to-point message that carries the data of the
/// get `token` (from the target): the origin's receive takes that one
/// and no other, whichever gets the target refused.
fn get_tag(token: u64) -> i32 {
    (token % DATA_TAG as u64) as i32
}

/// How many lost peers the device had reported when one-sided
/// operations were last ended for them ([`lose_peers`]).
static LOST_SEEN: AtomicUsize = AtomicUsize::new(0);

/// How many outboxes of this process hold queued messages (changed with
/// the device locked, or when a window's state is dropped), so that a
/// blocking call's loop looks at no window unless there is something to
/// send.
static QUEUED: AtomicUsize = AtomicUsize::new(0);
use std::sync::{Arc, Mutex, MutexGuard};

/// The windows of this process, by context id.
static WINDOWS: Mutex<Option<HashMap<u32, Arc<Shared>>>> = Mutex::new(None);

/// Registers a window (at creation, before any peer can name it).
pub(crate) fn register(context_id: u32, shared: Arc<Shared>) {
    lock(&WINDOWS)
        .get_or_insert_with(HashMap::new)
        .insert(context_id, shared);
}

/// Removes a window (at free, once no peer names it any more, or when it
/// is dropped), then waits until no transfer reads or writes its memory
/// any more: a put's data landing in it (placed, or an accumulate's
/// combined), a get's leaving it. Their origins, blocked in the put or
/// awaiting the get, carry them through.
pub(crate) fn unregister(context_id: u32) {
    if let Some(map) = lock(&WINDOWS).as_mut() {
        map.remove(&context_id);
    }
    let placing = with_device(|d| Ok(d.placing_into(context_id))).unwrap_or(false);
    if !placing && IN_FLIGHT.load(Ordering::Relaxed) == 0 {
        return;
    }
    let touches_memory =
        |t: &Transfer| t.context_id == context_id && !matches!(t.then, Then::Fetched { .. });
    let ended = progress_until(|d| {
        let busy = d.placing_into(context_id) || lock(&TRANSFERS).iter().any(touches_memory);
        Ok((!busy).then_some(()))
    });
    if let Err(e) = ended {
        oxmpi_adi::vlog!("window {context_id}: its transfers did not end: {e}");
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Where the local window's memory is.
pub(crate) enum Memory {
    /// One block (created on user memory, or allocated); displacements
    /// are byte offsets from its start (the origin applies the target's
    /// displacement unit).
    Block { base: *mut u8, size: usize },
    /// A dynamic window: displacements are addresses, which must lie in
    /// one attached region (start address, length).
    Dynamic(Vec<(usize, usize)>),
}

impl Memory {
    /// The bytes `disp .. + len` in the window, or an `MPI_ERR_RMA_RANGE`
    /// error if any lies outside it.
    fn range(&self, disp: u64, len: u64) -> Result<*mut u8> {
        let outside = || {
            Error::new(
                ErrorClass::RmaRange,
                format!("{len} bytes at byte displacement {disp} lie outside the target window"),
            )
        };
        match *self {
            Memory::Block { base, size } => {
                let end = disp.checked_add(len).ok_or_else(outside)?;
                if end > size as u64 {
                    return Err(outside());
                }
                // The range lies within the block, so the offset does too.
                Ok(base.wrapping_add(disp as usize))
            }
            Memory::Dynamic(ref regions) => {
                let end = disp.checked_add(len).ok_or_else(outside)?;
                regions
                    .iter()
                    .find(|&&(at, n)| disp >= at as u64 && end <= (at + n) as u64)
                    .map(|_| disp as usize as *mut u8)
                    .ok_or_else(outside)
            }
        }
    }
}

/// What a reply completes, at the origin.
pub(crate) enum Pending {
    /// An operation without a result (put, accumulate): counted only
    /// (`State::counted`), with token 0 and no entry of its own, or a part
    /// of a failed fetch whose reply is no longer placed.
    Done,
    /// An operation with a result, `len` bytes to place at `dest`, and
    /// its request, completed by the reply (or by the last of a split
    /// operation's replies: `last`).
    Fetch {
        dest: *mut u8,
        len: usize,
        request: RequestId,
        last: bool,
    },
    /// A get whose data travels as a point-to-point message
    /// ([`FLAG_BY_MESSAGE`]) into the receive `recv`, posted into the
    /// result buffer before the get left; the receive's completion
    /// completes `request` ([`progress`]). A refusal cancels the receive.
    Receiving { recv: RequestId, request: RequestId },
    /// A lock or unlock request: the reply is the grant or the release.
    Sync,
}

/// The messages an origin queued for one target and has not sent yet,
/// and their tokens (forgotten if the send fails). Touched only with the
/// device locked, so that the messages leave in the order queued.
#[derive(Default)]
pub(crate) struct Outbox {
    bytes: Vec<u8>,
    tokens: Vec<u64>,
    /// Queued operations without a token ([`Pending::Done`]).
    counted: usize,
}

/// The passive-target lock of a window at its target: fair, first come
/// first served, so that a stream of shared locks cannot starve an
/// exclusive one (seed: passive RMA). An origin does not wait for the
/// grant before it sends its operations: what it sends behind a request
/// that must wait is kept with the request ([`LockQueue::defer`]) and
/// handled once it is granted, so that nothing of an epoch touches the
/// window before its lock is held. A placed put's data, which lands
/// without the handler, waits as a held payload instead, or has the
/// request that came with it granted early ([`may_land`]).
#[derive(Default)]
struct LockQueue {
    /// The holders: (peer, exclusive); one exclusive, or any number of
    /// shared ones. Kept by peer, so that a lost peer's hold ends
    /// ([`LockQueue::lose`]).
    holders: Vec<(PeerRank, bool)>,
    /// Waiting requests, oldest first.
    waiting: VecDeque<LockRequest>,
    /// The requests (peer, token) granted before the handler reached
    /// them, for a placed put's data that came behind them
    /// ([`LockQueue::grant_early`]): their holders are in `holders`, and
    /// the handler only answers them ([`LockQueue::take_early`]).
    granted_early: Vec<(PeerRank, u64)>,
}

/// Whether a lock (`exclusive` or shared) goes with the `holders`'.
fn compatible(holders: &[(PeerRank, bool)], exclusive: bool) -> bool {
    if exclusive {
        holders.is_empty()
    } else {
        !holders.iter().any(|&(_, exclusive)| exclusive)
    }
}

/// A request for a window's lock, from `peer`, named `token` in its
/// grant.
#[derive(Debug, PartialEq, Eq)]
struct LockRequest {
    peer: PeerRank,
    token: u64,
    exclusive: bool,
    /// The messages the peer sent behind the request while it waited
    /// (whole messages of a batch, in order): the operations of its
    /// epoch, and its unlock.
    behind: Vec<u8>,
}

impl LockRequest {
    fn new(peer: PeerRank, token: u64, exclusive: bool) -> LockRequest {
        LockRequest {
            peer,
            token,
            exclusive,
            behind: Vec::new(),
        }
    }
}

impl LockQueue {
    /// Grants the waiting requests that may go now, in order, and returns
    /// them, to be answered and their messages behind handled.
    fn grant(&mut self) -> Vec<LockRequest> {
        let mut granted = Vec::new();
        while let Some(request) = self.waiting.pop_front() {
            if !compatible(&self.holders, request.exclusive) {
                self.waiting.push_front(request);
                break;
            }
            self.holders.push((request.peer, request.exclusive));
            granted.push(request);
        }
        granted
    }

    /// Grants `peer`'s request `token` (`exclusive` or shared) that the
    /// handler has not reached yet, if it would be granted on arrival
    /// (nobody waits, and it goes with the holders, less the peer's hold
    /// if the unlock of that is queued ahead of it: `releasing`), and
    /// says whether it did. The handler, reaching the request, only
    /// answers it (and the unlock ahead ends the older hold: `release`
    /// ends the first of the peer's, and this one is the last).
    fn grant_early(
        &mut self,
        peer: PeerRank,
        token: u64,
        exclusive: bool,
        releasing: bool,
    ) -> bool {
        let held = self.holders.iter().position(|&(holder, _)| holder == peer);
        if !self.waiting.is_empty() || releasing != held.is_some() {
            return false;
        }
        let mut others = self.holders.clone();
        if let Some(at) = held {
            others.swap_remove(at);
        }
        if !compatible(&others, exclusive) {
            return false;
        }
        self.holders.push((peer, exclusive));
        self.granted_early.push((peer, token));
        true
    }

    /// Whether `peer`'s request `token` was granted early.
    fn is_granted_early(&self, peer: PeerRank, token: u64) -> bool {
        self.granted_early.contains(&(peer, token))
    }

    /// Forgets that `peer`'s request `token` was granted early, and says
    /// whether it was: the handler reached it.
    fn take_early(&mut self, peer: PeerRank, token: u64) -> bool {
        let early = self.granted_early.iter().position(|&g| g == (peer, token));
        early.map(|at| self.granted_early.swap_remove(at)).is_some()
    }

    /// Whether `peer` has a request waiting.
    fn waits(&self, peer: PeerRank) -> bool {
        self.waiting.iter().any(|r| r.peer == peer)
    }

    /// Keeps a message (one whole message: its wire form, the `parts`
    /// one after another) from `peer` behind its lock request if that
    /// waits, and says whether it did: a peer's messages after a request
    /// are handled in order once it is granted.
    fn defer(&mut self, peer: PeerRank, parts: &[&[u8]]) -> bool {
        match self.waiting.iter_mut().find(|r| r.peer == peer) {
            Some(request) => {
                for part in parts {
                    request.behind.extend_from_slice(part);
                }
                true
            }
            None => false,
        }
    }

    /// Ends `peer`'s hold (its unlock).
    fn release(&mut self, peer: PeerRank) -> Result<()> {
        let held = self
            .holders
            .iter()
            .position(|&(holder, _)| holder == peer)
            .ok_or_else(|| {
                Error::new(
                    ErrorClass::ProcFailed,
                    format!("rank {peer} unlocked a window it had not locked"),
                )
            })?;
        self.holders.swap_remove(held);
        Ok(())
    }

    /// Forgets the lost `peer`'s hold and requests (with what it sent
    /// behind them): its unlock will never come, and the others must not
    /// wait for it. The requests granted now, as [`LockQueue::grant`].
    fn lose(&mut self, peer: PeerRank) -> Vec<LockRequest> {
        self.holders.retain(|&(holder, _)| holder != peer);
        self.waiting.retain(|r| r.peer != peer);
        self.granted_early.retain(|&(early, _)| early != peer);
        self.grant()
    }
}

/// A window's state that replies and operations reach.
pub(crate) struct Shared {
    /// This rank's rank in the window's communicator, by world rank.
    ranks: HashMap<PeerRank, usize>,
    /// The world rank of each communicator rank.
    members: Vec<PeerRank>,
    state: Mutex<State>,
    /// Whether `State::errors` may hold something: set (under the state's
    /// lock) when an error is recorded, so that the completion calls of
    /// paths that never record one (direct, RDMA) need not lock.
    pub(crate) errors_recorded: AtomicBool,
}

// SAFETY: the raw pointers in `State` name the window's memory and the
// origin's result buffers, which the window's owner keeps valid while the
// window lives (or until the request that names them completes); they are
// only used with the state locked.
unsafe impl Send for Shared {}
// SAFETY: as above: every access to the state goes through its mutex.
unsafe impl Sync for Shared {}

/// The mutable part of [`Shared`].
pub(crate) struct State {
    pub(crate) memory: Memory,
    lock: LockQueue,
    /// Messages queued for each target (communicator rank), not yet sent.
    outbox: Vec<Outbox>,
    /// The origin's operations awaiting replies, by token.
    pending: HashMap<u64, (usize, Pending)>,
    /// The token of the lock request this origin sent each target
    /// (communicator rank) without waiting for its grant, until an
    /// operation that must wait for it does (`path::await_grant`) or the
    /// epoch ends (0: none).
    pub(crate) lock_requests: Vec<u64>,
    /// Replies awaited, per target (communicator rank).
    pub(crate) outstanding: Vec<usize>,
    /// How many of those are for operations without a token: a reply
    /// with token 0 answers one of them.
    counted: Vec<usize>,
    next_token: u64,
    /// Errors of operations without requests, reported by the next
    /// completion call (flush, unlock, fence, complete).
    pub(crate) errors: Vec<Error>,
    /// Posts received from each target and not yet used by a start.
    pub(crate) posts: Vec<usize>,
    /// Completes received from each origin and not yet used by a wait.
    pub(crate) completes: Vec<usize>,
}

impl Shared {
    /// The shared state of a window of `members` (world ranks by
    /// communicator rank) over `memory`.
    pub(crate) fn new(members: &[PeerRank], memory: Memory) -> Shared {
        let n = members.len();
        Shared {
            ranks: members.iter().enumerate().map(|(i, &w)| (w, i)).collect(),
            members: members.to_vec(),
            state: Mutex::new(State {
                memory,
                lock: LockQueue::default(),
                outbox: (0..n).map(|_| Outbox::default()).collect(),
                pending: HashMap::new(),
                lock_requests: vec![0; n],
                outstanding: vec![0; n],
                counted: vec![0; n],
                next_token: 1,
                errors: Vec::new(),
                posts: vec![0; n],
                completes: vec![0; n],
            }),
            errors_recorded: AtomicBool::new(false),
        }
    }

    /// The state, locked.
    pub(crate) fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// The world rank of communicator rank `rank`.
    pub(crate) fn member(&self, rank: usize) -> PeerRank {
        self.members[rank]
    }
}

impl Drop for State {
    /// The messages of a window dropped without `free` are never sent.
    fn drop(&mut self) {
        let queued = self.outbox.iter().filter(|o| !o.bytes.is_empty()).count();
        QUEUED.fetch_sub(queued, Ordering::Relaxed);
    }
}

impl State {
    /// Notes an operation to `target` awaiting its reply; its token.
    pub(crate) fn expect(&mut self, target: usize, pending: Pending) -> u64 {
        let token = self.next_token;
        self.next_token += 1;
        self.pending.insert(token, (target, pending));
        self.outstanding[target] += 1;
        token
    }

    /// Queues `m` for `target`, awaiting a reply that completes
    /// `pending` (`None`: a message without reply); its token. The
    /// caller holds the device, and sends the outbox ([`State::send`])
    /// when it must leave now; it leaves by itself once [`BATCH`] bytes
    /// are queued, or with a message of [`ALONE`] bytes of data or more.
    pub(crate) fn queue(
        &mut self,
        device: &mut Device,
        window: (&Shared, u32),
        target: usize,
        pending: Option<Pending>,
        mut m: Message<'_>,
    ) -> Result<u64> {
        match pending {
            // Counted only: no token to hash in and out of `pending`.
            Some(Pending::Done) => {
                self.outstanding[target] += 1;
                self.counted[target] += 1;
                self.outbox[target].counted += 1;
                m.token = 0;
            }
            Some(pending) => m.token = self.expect(target, pending),
            None => {}
        }
        let outbox = &mut self.outbox[target];
        if outbox.bytes.is_empty() {
            QUEUED.fetch_add(1, Ordering::Relaxed);
        }
        if m.token != 0 {
            outbox.tokens.push(m.token);
        }
        if m.data.len() >= ALONE {
            // It leaves at once, its data sent from where it is, behind
            // the queue and its own header: no copy into the outbox.
            m.append_header_to(&mut outbox.bytes);
            self.send_with(device, window, target, m.data)?;
        } else {
            m.append_to(&mut outbox.bytes);
            if outbox.bytes.len() >= BATCH {
                self.send(device, window, target)?;
            }
        }
        Ok(m.token)
    }

    /// Sends the messages queued for `target` in one active message of
    /// `window` (its state and context id). If that fails they are
    /// forgotten (no reply will come) and the error is returned.
    pub(crate) fn send(
        &mut self,
        device: &mut Device,
        window: (&Shared, u32),
        target: usize,
    ) -> Result<()> {
        self.send_with(device, window, target, &[])
    }

    /// [`State::send`], with `data` after the queued messages: the data
    /// of the last one, whose header alone is queued.
    fn send_with(
        &mut self,
        device: &mut Device,
        (shared, context_id): (&Shared, u32),
        target: usize,
        data: &[u8],
    ) -> Result<()> {
        let outbox = &mut self.outbox[target];
        if outbox.bytes.is_empty() {
            return Ok(());
        }
        let peer = shared.members[target];
        let sent = if data.is_empty() {
            device.send_active_message(peer, context_id, &[&outbox.bytes])
        } else {
            device.send_active_message(peer, context_id, &[&outbox.bytes, data])
        };
        outbox.bytes.clear();
        QUEUED.fetch_sub(1, Ordering::Relaxed);
        let counted = std::mem::take(&mut outbox.counted);
        let mut tokens = std::mem::take(&mut outbox.tokens);
        if let Err(e) = &sent {
            self.outstanding[target] -= counted;
            self.counted[target] -= counted;
            for &token in &tokens {
                if let Some((target, pending)) = self.pending.remove(&token) {
                    self.outstanding[target] -= 1;
                    self.fail(device, pending, e.clone());
                }
            }
        }
        tokens.clear();
        self.outbox[target].tokens = tokens;
        sent
    }

    /// Fails the fetching operation `pending`, taken out of `pending`,
    /// with `error` (its message could not be sent, or its target refused
    /// it); other kinds have no request to fail.
    fn fail(&mut self, device: &mut Device, pending: Pending, error: Error) {
        match pending {
            Pending::Fetch { request, .. } => {
                self.release(request);
                device.complete_generalized(request, Some(error));
            }
            // No data comes for it: the receive has not matched, and its
            // transfer is reaped as cancelled.
            Pending::Receiving { recv, request } => {
                device.cancel(recv);
                device.complete_generalized(request, Some(error));
            }
            Pending::Done | Pending::Sync => {}
        }
    }

    /// Lets go of the result buffer of `request`, which fails now: the
    /// buffer is the program's again, so the replies to the request's
    /// other parts are only counted, never placed.
    fn release(&mut self, request: RequestId) {
        for (_, other) in self.pending.values_mut() {
            if matches!(other, Pending::Fetch { request: r, .. } if *r == request) {
                *other = Pending::Done;
            }
        }
    }

    /// Puts the data of a placed put from `peer` that its placer held
    /// back ([`Placer`]) at byte displacement `disp`, in its turn: as a
    /// put of a batch, kept behind the peer's lock request while that
    /// waits ([`LockQueue::defer`]), else applied now; answered counted,
    /// as the placed pieces are, in `replies` (once applied).
    fn put_held(&mut self, peer: PeerRank, disp: u64, data: &[u8], replies: &mut Vec<u8>) {
        let mut m = Message::new(Kind::Put, 0);
        m.disp = disp;
        m.len = data.len() as u64;
        m.data = data;
        let mut header = Vec::with_capacity(HEADER);
        m.append_header_to(&mut header);
        if !self.lock.defer(peer, &[&header, data]) {
            apply_answered(&mut self.memory, &m, replies);
        }
    }

    /// Whether the operation `token` still waits for its reply.
    pub(crate) fn awaits(&self, token: u64) -> bool {
        self.pending.contains_key(&token)
    }

    /// Stops waiting for the reply to the lock or unlock `token`, whose
    /// target is lost.
    pub(crate) fn forget(&mut self, token: u64) {
        if let Some((target, _)) = self.pending.remove(&token) {
            self.outstanding[target] -= 1;
        }
    }

    /// Stops waiting for the replies to the lock and unlock requests sent
    /// to `target`, which is lost.
    pub(crate) fn forget_syncs(&mut self, target: usize) {
        let before = self.pending.len();
        self.pending
            .retain(|_, (to, pending)| !(*to == target && matches!(pending, Pending::Sync)));
        self.outstanding[target] -= before - self.pending.len();
    }

    /// Ends this origin's operations to `target`, a rank that is lost
    /// with `error`: no reply to them will come. Queued messages are
    /// dropped, fetching operations fail with the error, puts and
    /// accumulates (counted, without requests) record it for the next
    /// completion call, and a get whose data travels as a message is
    /// failed by its receive (the device fails the receives from a lost
    /// peer). Lock and unlock requests stay awaited: their waits see the
    /// loss ([`crate::rma::path`]'s `wait_reply`).
    fn lose_target(&mut self, device: &mut Device, shared: &Shared, target: usize, error: &Error) {
        let outbox = &mut self.outbox[target];
        if !outbox.bytes.is_empty() {
            outbox.bytes.clear();
            QUEUED.fetch_sub(1, Ordering::Relaxed);
        }
        outbox.tokens.clear();
        outbox.counted = 0;
        let lost_counted = std::mem::take(&mut self.counted[target]);
        let tokens: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, (to, pending))| *to == target && !matches!(pending, Pending::Sync))
            .map(|(&token, _)| token)
            .collect();
        for token in tokens {
            let Some((_, pending)) = self.pending.remove(&token) else {
                continue;
            };
            // A get by message completes when its receive, failed with
            // the peer, is reaped (`end_transfers`).
            if !matches!(pending, Pending::Receiving { .. }) {
                self.fail(device, pending, error.clone());
            }
        }
        self.outstanding[target] = self
            .pending
            .values()
            .filter(|(to, _)| *to == target)
            .count();
        if lost_counted > 0 {
            self.errors.push(Error::new(
                ErrorClass::ProcFailed,
                format!(
                    "{lost_counted} one-sided operations to rank {target} may not have \
                     completed: {}",
                    error.message()
                ),
            ));
            shared.errors_recorded.store(true, Ordering::Release);
        }
    }
}

/// Sends every window's queued messages (a call waits or tests: what
/// this rank queued must not wait with it). A send that fails
/// is recorded as the window's error, reported by its next completion
/// call, as a refusal would be.
fn send_queued(device: &mut Device) {
    for (&context_id, shared) in lock(&WINDOWS).iter().flatten() {
        let mut state = shared.state();
        for target in 0..state.outbox.len() {
            if let Err(e) = state.send(device, (shared, context_id), target) {
                state.errors.push(e);
                shared.errors_recorded.store(true, Ordering::Release);
            }
        }
    }
}

/// The device's handler of active messages: see the module docs. It
/// keeps its buffer of replies for the next message.
#[derive(Default)]
pub(crate) struct Handler {
    /// The replies' wire form; an operation's old data is read straight
    /// into its reply (one copy of a get's data here, not two).
    replies: Vec<u8>,
    /// Whom `replies` answer: the peer and window context id of the
    /// messages they are for. Replies to the messages of one peer that
    /// arrive in one poll leave together (a window of 64 puts of 32 KiB,
    /// each a message of its own, was answered by 64 writes).
    replies_to: Option<(PeerRank, u32)>,
    /// Lock requests granted by the message being handled, with their
    /// windows' context ids: answered, and the messages behind them
    /// handled, before the next message ([`Handler::serve_granted`]).
    granted: VecDeque<(u32, LockRequest)>,
    /// Where in `replies` the last counted reply begins: the operations
    /// without a token that follow it add to its count while it ends the
    /// replies ([`Handler::answer_counted`]).
    counted_at: Option<usize>,
}

impl ActiveMessageHandler for Handler {
    /// Applies a batch's messages in order and queues their replies,
    /// which leave with those of the peer's next messages in this poll
    /// (before the replies to another peer), or in several messages of
    /// about [`BATCH`] bytes when they carry much data (a batch of gets).
    /// A lock granted at once is answered in turn with them: a lock, the
    /// operations of its epoch and the unlock, sent as one batch, are
    /// answered by one message.
    fn handle(&mut self, device: &mut Device, message: &ActiveMessage) -> Result<()> {
        let to = (message.peer, message.context_id);
        self.answer(device, to);
        if let Some(placed) = &message.placed {
            // A put's data streamed into the window ([`Placer`]), or
            // refused: answered as a put in a batch is, counted. Held
            // back, it is such a put now.
            match &placed.landing {
                Landing::InPlace => self.answer_counted(),
                Landing::Refused(e) => refuse(&mut self.replies, 0, e),
                Landing::Held => return self.put_held(to, placed.key, &message.payload),
            }
            return Ok(());
        }
        let (shared, from) = match window_of(message.peer, message.context_id) {
            Ok(found) => found,
            // Replies may outlive the window they answer: an unlock's,
            // which its origin does not wait for, to a window it dropped
            // since (answers are batched alone, never with operations).
            Err(_) if answers(&message.payload) => return Ok(()),
            Err(e) => return Err(e),
        };
        let mut rest = &message.payload[..];
        while !rest.is_empty() {
            let (m, after) = Message::split(rest)?;
            let whole = &rest[..rest.len() - after.len()];
            rest = after;
            self.handle_one(device, to, (&shared, from), m, whole)?;
            if !self.granted.is_empty() {
                self.serve_granted(device)?;
                self.answer(device, to);
            }
            if self.replies.len() >= BATCH {
                self.send_replies(device)?;
            }
        }
        Ok(())
    }

    /// Sends the replies kept back. A failure is the transport's loss of
    /// that peer, which it reports to the device: nothing more to do.
    fn handled_all(&mut self, device: &mut Device) {
        if let Err(e) = self.send_replies(device) {
            oxmpi_adi::vlog!("answering one-sided operations: {e}");
        }
    }
}

impl Handler {
    /// Answers one more operation without a token (a put, an accumulate
    /// without result): by the counted reply that ends the replies, if
    /// one does, else by a new one. A window of 64 puts of 8 bytes was
    /// answered by 64 replies, each handled at its origin in turn.
    fn answer_counted(&mut self) {
        if let Some(at) = self.counted_at {
            if at + HEADER == self.replies.len() && is_counted_reply(&self.replies[at..]) {
                count_one_more(&mut self.replies[at..]);
                return;
            }
        }
        self.counted_at = Some(self.replies.len());
        Message::reply(0).append_to(&mut self.replies);
    }

    /// Makes `replies` answer `to` (a peer and window context id),
    /// sending first what they hold for another.
    fn answer(&mut self, device: &mut Device, to: (PeerRank, u32)) {
        if self.replies_to != Some(to) {
            self.handled_all(device);
            self.replies_to = Some(to);
        }
    }

    /// Answers the lock requests granted ([`Handler::granted`]) and
    /// handles the messages their peers sent behind them, in order: the
    /// operations of each epoch apply only once its lock is held. An
    /// unlock among them may grant more, served in turn.
    fn serve_granted(&mut self, device: &mut Device) -> Result<()> {
        while let Some((context_id, request)) = self.granted.pop_front() {
            let to = (request.peer, context_id);
            self.answer(device, to);
            Message::reply(request.token).append_to(&mut self.replies);
            if request.behind.is_empty() {
                continue;
            }
            let (shared, from) = window_of(request.peer, context_id)?;
            let mut rest = &request.behind[..];
            while !rest.is_empty() {
                let (m, after) = Message::split(rest)?;
                let whole = &rest[..rest.len() - after.len()];
                rest = after;
                self.handle_one(device, to, (&shared, from), m, whole)?;
                if self.replies.len() >= BATCH {
                    self.send_replies(device)?;
                }
            }
        }
        Ok(())
    }

    /// Sends the replies queued, to the peer they answer.
    fn send_replies(&mut self, device: &mut Device) -> Result<()> {
        let Some((peer, context_id)) = self.replies_to else {
            return Ok(());
        };
        if self.replies.is_empty() {
            return Ok(());
        }
        let sent = device.send_active_message(peer, context_id, &[&self.replies]);
        self.replies.clear();
        self.counted_at = None;
        sent
    }

    /// Puts the data of a placed put from `peer` that its placer held
    /// back ([`Placer`]) at byte displacement `disp` of the window
    /// `context_id` ([`State::put_held`]).
    fn put_held(
        &mut self,
        (peer, context_id): (PeerRank, u32),
        disp: u64,
        data: &[u8],
    ) -> Result<()> {
        let (shared, _) = window_of(peer, context_id)?;
        shared.state().put_held(peer, disp, data, &mut self.replies);
        Ok(())
    }

    /// Applies one message `m` of a batch from `peer` for the window
    /// `context_id` (rank `from` of the window `shared`), queueing its
    /// reply; `whole` is its wire form, kept if it must wait behind the
    /// peer's lock request ([`LockQueue::defer`]).
    fn handle_one(
        &mut self,
        device: &mut Device,
        (peer, context_id): (PeerRank, u32),
        (shared, from): (&Shared, usize),
        m: Message<'_>,
        whole: &[u8],
    ) -> Result<()> {
        let mut state = shared.state();
        let in_epoch = matches!(
            m.kind,
            Kind::Put | Kind::Get | Kind::Accumulate | Kind::CompareAndSwap | Kind::Unlock
        );
        if in_epoch && state.lock.defer(peer, &[whole]) {
            return Ok(());
        }
        match m.kind {
            Kind::Put | Kind::Get | Kind::Accumulate if m.flags & FLAG_BY_MESSAGE != 0 => {
                let at = state.memory.range(m.disp, m.len);
                drop(state);
                self.by_message(device, (peer, context_id), (shared, from), &m, at)
            }
            // A counted operation (a put, an accumulate without result)
            // adds to the counted reply the batch's answers end with.
            Kind::Put | Kind::Accumulate if m.token == 0 => {
                match apply(&mut state.memory, &m, &mut self.replies) {
                    Ok(()) => self.answer_counted(),
                    Err(e) => refuse(&mut self.replies, 0, &e),
                }
                Ok(())
            }
            Kind::Put | Kind::Get | Kind::Accumulate | Kind::CompareAndSwap => {
                apply_answered(&mut state.memory, &m, &mut self.replies);
                Ok(())
            }
            Kind::Reply | Kind::Refused if m.token == 0 => {
                // A counted reply answers `disp` operations, a refusal one.
                let answered = match m.kind {
                    Kind::Reply => m.disp,
                    _ => 1,
                };
                let sent = state.counted[from];
                if answered == 0 || answered > sent as u64 {
                    return Err(Error::new(
                        ErrorClass::ProcFailed,
                        format!(
                            "rank {peer} answered {answered} operations where {sent} were sent \
                             to it"
                        ),
                    ));
                }
                let answered = answered as usize;
                state.counted[from] -= answered;
                state.outstanding[from] -= answered;
                if m.kind == Kind::Refused {
                    state.errors.push(refusal(from, &m));
                    shared.errors_recorded.store(true, Ordering::Release);
                }
                Ok(())
            }
            Kind::Reply | Kind::Refused => {
                let (target, pending) = state.pending.remove(&m.token).ok_or_else(|| {
                    Error::new(
                        ErrorClass::ProcFailed,
                        format!(
                            "rank {peer} answered operation {} that was not asked",
                            m.token
                        ),
                    )
                })?;
                if target != from {
                    return Err(Error::new(
                        ErrorClass::ProcFailed,
                        format!("rank {peer} answered an operation sent to another rank"),
                    ));
                }
                state.outstanding[target] -= 1;
                let refused = (m.kind == Kind::Refused).then(|| refusal(from, &m));
                match pending {
                    Pending::Done | Pending::Sync => {
                        if let Some(e) = refused {
                            state.errors.push(e);
                            shared.errors_recorded.store(true, Ordering::Release);
                        }
                    }
                    // Its data comes as a message, and only a refusal as
                    // an answer.
                    Pending::Receiving { .. } => {
                        let answered = Error::new(
                            ErrorClass::ProcFailed,
                            format!("rank {from} answered a get whose data it was to send apart"),
                        );
                        let failed = refused.is_none();
                        state.fail(device, pending, refused.unwrap_or_else(|| answered.clone()));
                        if failed {
                            return Err(answered);
                        }
                    }
                    Pending::Fetch {
                        dest,
                        len,
                        request,
                        last,
                    } => {
                        if let Some(e) = refused {
                            state.release(request);
                            drop(state);
                            device.complete_generalized(request, Some(e));
                            return Ok(());
                        }
                        drop(state);
                        if m.data.len() != len {
                            return Err(Error::new(
                                ErrorClass::ProcFailed,
                                format!(
                                    "rank {from} answered {len} bytes asked with {}",
                                    m.data.len()
                                ),
                            ));
                        }
                        // SAFETY: `dest` is the result buffer of the
                        // operation, writable for `len` bytes until its
                        // request completes, which happens only below.
                        unsafe { std::ptr::copy_nonoverlapping(m.data.as_ptr(), dest, len) };
                        if last {
                            device.complete_generalized(request, None);
                        }
                    }
                }
                Ok(())
            }
            Kind::Lock => {
                let exclusive = m.flags & FLAG_EXCLUSIVE != 0;
                let request = LockRequest::new(peer, m.token, exclusive);
                // Granted already, for a placed put's data behind it
                // ([`may_land`]): only answered.
                if state.lock.take_early(peer, m.token) {
                    self.granted.push_back((context_id, request));
                    return Ok(());
                }
                state.lock.waiting.push_back(request);
                let granted = state.lock.grant();
                self.granted
                    .extend(granted.into_iter().map(|r| (context_id, r)));
                Ok(())
            }
            Kind::Unlock => {
                state.lock.release(peer)?;
                Message::reply(m.token).append_to(&mut self.replies);
                let granted = state.lock.grant();
                self.granted
                    .extend(granted.into_iter().map(|r| (context_id, r)));
                Ok(())
            }
            Kind::Post => {
                state.posts[from] += 1;
                Ok(())
            }
            Kind::Complete => {
                state.completes[from] += 1;
                Ok(())
            }
        }
    }
}

impl Handler {
    /// Starts the point-to-point transfer of an accumulate's or get's
    /// data ([`FLAG_BY_MESSAGE`]) between rank `from` of `shared` and the
    /// window at `at` (the range checked, or the error that refuses the
    /// operation): an accumulate's data is combined into the window as it
    /// lands and answered once all is there (here if it came already,
    /// else by [`progress`]); a get's is sent straight from the window. A
    /// refused accumulate's data is received all the same, and dropped.
    fn by_message(
        &mut self,
        device: &mut Device,
        (peer, window_context): (PeerRank, u32),
        (shared, from): (&Shared, usize),
        m: &Message<'_>,
        at: Result<*mut u8>,
    ) -> Result<()> {
        let context_id = context::point_to_point(window_context);
        // Within the window's memory, or refused below: no longer than it.
        let len = m.len as usize;
        let data = MatchPattern {
            context_id,
            source: Some(from as i32),
            tag: Some(DATA_TAG),
        };
        let landed = Then::Landed { peer, len };
        let (request, then) = match (m.kind, at) {
            (Kind::Accumulate, Ok(at)) => {
                let (Some(element), Some(op)) = (m.element, m.op) else {
                    return Err(Error::new(
                        ErrorClass::Intern,
                        "an accumulate without its type",
                    ));
                };
                let sink = Box::new(Combine {
                    window: at,
                    len,
                    element,
                    op,
                });
                (device.start_recv_unpacked(data, Some(peer), sink)?, landed)
            }
            (Kind::Accumulate, Err(e)) => {
                refuse(&mut self.replies, m.token, &e);
                let sink = Box::new(Discard(len));
                let recv = device.start_recv_unpacked(data, Some(peer), sink)?;
                (recv, Then::Reaped)
            }
            (_, Ok(at)) => {
                let envelope = MessageEnvelope {
                    context_id,
                    source: shared.ranks[&device.rank()] as i32,
                    tag: get_tag(m.token),
                };
                // A ready send: the origin posted its receive before the
                // get left, so the data needs no RTS and CTS.
                // SAFETY: `range` checked that `at .. at + len` lies in the
                // window's memory, which stays valid while a transfer of
                // the window is under way (`unregister` waits for them).
                let send = unsafe { device.start_ready_send(peer, envelope, at, len)? };
                (send, Then::Reaped)
            }
            (_, Err(e)) => {
                refuse(&mut self.replies, m.token, &e);
                return Ok(());
            }
        };
        match device.take_status(request) {
            Some(status) => then.finish(device, window_context, status, &mut self.replies),
            None => watch(request, window_context, then),
        }
        Ok(())
    }
}

/// A point-to-point transfer of an operation's data under way
/// ([`FLAG_BY_MESSAGE`]): the device's request, the window's context
/// id, and what its completion does.
struct Transfer {
    request: RequestId,
    context_id: u32,
    then: Then,
}

/// What the end of a [`Transfer`] does.
enum Then {
    /// At the origin, the get `token` got its `len` bytes (or failed):
    /// its `request` completes.
    Fetched {
        token: u64,
        request: RequestId,
        len: usize,
    },
    /// At the target, `len` bytes of an accumulate from `peer` landed in
    /// the window (or failed): the accumulate is answered.
    Landed { peer: PeerRank, len: usize },
    /// Nothing but freeing the request: a get's data sent out of the
    /// window, a refused accumulate's data dropped.
    Reaped,
}

impl Then {
    /// Does what the end of a transfer of the window `context_id` with
    /// `status` does; an answer for its origin is added to `replies`
    /// (which the caller sends).
    fn finish(self, device: &mut Device, context_id: u32, status: Status, replies: &mut Vec<u8>) {
        let short = |len: usize| {
            (status.count != len).then(|| {
                Error::new(
                    ErrorClass::ProcFailed,
                    format!(
                        "a one-sided operation's {len} bytes came as a message of {}",
                        status.count
                    ),
                )
            })
        };
        match self {
            Then::Fetched {
                token,
                request,
                len,
            } => {
                if let Some(shared) = window(context_id) {
                    let mut state = shared.state();
                    if let Some((target, _)) = state.pending.remove(&token) {
                        state.outstanding[target] -= 1;
                    }
                }
                // A request that a refusal failed already is left as it is.
                let error = status.error.clone().or_else(|| short(len));
                device.complete_generalized(request, error);
            }
            Then::Landed { len, .. } => match status.error.clone().or_else(|| short(len)) {
                None => Message::reply(0).append_to(replies),
                Some(e) => refuse(replies, 0, &e),
            },
            Then::Reaped => {}
        }
    }
}

/// The transfers under way, in no order. Touched only with the device
/// locked (after it in the lock order, before the registry).
static TRANSFERS: Mutex<Vec<Transfer>> = Mutex::new(Vec::new());

/// How many transfers are under way: so that a blocking call's loop
/// looks at none unless there are some.
static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);

/// Watches the device's `request` until it completes, then does `then`
/// ([`progress`]).
fn watch(request: RequestId, context_id: u32, then: Then) {
    lock(&TRANSFERS).push(Transfer {
        request,
        context_id,
        then,
    });
    IN_FLIGHT.fetch_add(1, Ordering::Relaxed);
}

/// What a blocking call's loop does for one-sided operations on every
/// turn, and a test before and after its poll: it ends the operations to
/// peers the device lost since it last looked ([`lose_peers`]), sends
/// what this rank queued ([`send_queued`]), and ends the transfers of
/// operations' data that completed ([`end_transfers`]). Inlined: three
/// loads when there is nothing to do, on the path of every blocking
/// call.
#[inline]
pub(crate) fn progress(device: &mut Device) {
    if device.lost_peers() != LOST_SEEN.load(Ordering::Relaxed) {
        lose_peers(device);
    }
    if QUEUED.load(Ordering::Relaxed) != 0 {
        send_queued(device);
    }
    if IN_FLIGHT.load(Ordering::Relaxed) != 0 {
        end_transfers(device);
    }
}

/// Ends every window's operations to the peers the device lost
/// ([`State::lose_target`]): a flush waiting for their replies would
/// otherwise wait forever. As a target, the window forgets their lock
/// holds and requests ([`LockQueue::lose`]), so that the other origins'
/// locks are granted (answered, and what they sent behind their requests
/// handled, once the registry is let go: handling looks windows up).
#[cold]
fn lose_peers(device: &mut Device) {
    LOST_SEEN.store(device.lost_peers(), Ordering::Relaxed);
    let mut handler = Handler::default();
    for (&context_id, shared) in lock(&WINDOWS).iter().flatten() {
        let mut state = shared.state();
        for (target, &peer) in shared.members.iter().enumerate() {
            if let Some(error) = device.peer_failure(peer) {
                state.lose_target(device, shared, target, &error);
                let granted = state.lock.lose(peer);
                handler
                    .granted
                    .extend(granted.into_iter().map(|r| (context_id, r)));
            }
        }
    }
    if let Err(e) = handler.serve_granted(device) {
        oxmpi_adi::vlog!("granting the locks a lost peer held: {e}");
    }
    handler.handled_all(device);
}

/// Ends the transfers whose requests completed: a get's request
/// completes, an accumulate's landing is answered.
fn end_transfers(device: &mut Device) {
    let mut transfers = lock(&TRANSFERS);
    let mut i = 0;
    let mut answer = Vec::new();
    while i < transfers.len() {
        let Some(status) = device.take_status(transfers[i].request) else {
            i += 1;
            continue;
        };
        let Transfer {
            context_id, then, ..
        } = transfers.swap_remove(i);
        IN_FLIGHT.fetch_sub(1, Ordering::Relaxed);
        let to = match then {
            Then::Landed { peer, .. } => Some(peer),
            _ => None,
        };
        then.finish(device, context_id, status, &mut answer);
        if let Some(peer) = to {
            if let Err(e) = device.send_active_message(peer, context_id, &[&answer]) {
                // That peer is lost; its operations fail with it.
                oxmpi_adi::vlog!("answering an accumulate of rank {peer}: {e}");
            }
            answer.clear();
        }
    }
}

/// Puts `data` at byte displacement `disp` of the target as placed
/// active messages of at most `MAX_ACTIVE_LEN` bytes ([`PUT_PLACED`]),
/// after what was queued for the target, sent from `data` without a copy
/// and read by the target straight into its window ([`Placer`]), or
/// held back there until the epoch's lock is granted: it does not wait
/// for the grant. Returns once the transport is done with `data`; each
/// piece is counted as a put and complete at the target when its answer
/// comes.
pub(crate) fn put_placed(to: &Target<'_>, disp: u64, data: &[u8]) -> Result<()> {
    let mut sends = Vec::new();
    let started = with_device(|device| {
        let window = (to.shared, to.context_id);
        let peer = to.shared.members[to.rank];
        let mut state = to.shared.state();
        // What was queued before leaves first: operations reach the
        // target in the order they were issued.
        state.send(device, window, to.rank)?;
        for (offset, len) in pieces(data.len(), MAX_ACTIVE_LEN as usize) {
            let piece = &data[offset..offset + len];
            // The key is the piece's displacement, the bound where the
            // whole put ends: the target checks the rest of the put's
            // range with each piece, so one that does not fit is refused
            // before its first byte lands.
            let keys = (disp + offset as u64, disp + data.len() as u64);
            // SAFETY: `data` stays borrowed, unmodified, until every send
            // started here completes: they are all waited for below, also
            // when a later one fails to start.
            let send = unsafe {
                device.start_placed_send(peer, to.context_id, keys, piece.as_ptr(), len)?
            };
            state.outstanding[to.rank] += 1;
            state.counted[to.rank] += 1;
            sends.push(send);
        }
        Ok(())
    });
    let mut error = started.err();
    for send in sends {
        let outcome = crate::wait_request(send).and_then(|s| s.error.map_or(Ok(()), Err));
        if let Err(e) = outcome {
            error.get_or_insert(e);
        }
    }
    error.map_or(Ok(()), Err)
}

/// The pieces (offset, length) of `len` bytes, each at most `size`.
pub(crate) fn pieces(len: usize, size: usize) -> impl ExactSizeIterator<Item = (usize, usize)> {
    (0..len)
        .step_by(size)
        .map(move |offset| (offset, size.min(len - offset)))
}

/// Combines `data` (elements of `element`) into the target's window at
/// byte displacement `disp` with `op`, the data travelling as a
/// point-to-point message ([`ACCUMULATE_BY_MESSAGE`]) that the target
/// combines as it lands; returns once the target answered (the
/// operation is applied there, or its refusal recorded for the next
/// completion call).
pub(crate) fn accumulate_by_message(
    to: &Target<'_>,
    disp: u64,
    data: &[u8],
    element: AccumulateType,
    op: AccumulateOp,
) -> Result<()> {
    await_grant(to)?;
    let mut m = Message::new(Kind::Accumulate, 0);
    m.element = Some(element);
    m.op = Some(op);
    send_by_message(to, m, disp, data)?;
    progress_until(|_| Ok((to.shared.state().outstanding[to.rank] == 0).then_some(())))
}

/// Queues `m` (an accumulate, answered by a counted reply) for `data` at
/// `disp`, sends `data` as its point-to-point message, and waits until
/// the data has left `data` (at once where the device sends it eagerly,
/// else once the target took it).
fn send_by_message(to: &Target<'_>, mut m: Message<'_>, disp: u64, data: &[u8]) -> Result<()> {
    let send = with_device(|device| {
        let window = (to.shared, to.context_id);
        let peer = to.shared.members[to.rank];
        let mut state = to.shared.state();
        m.flags = FLAG_BY_MESSAGE;
        m.disp = disp;
        m.len = data.len() as u64;
        state.queue(device, window, to.rank, Some(Pending::Done), m)?;
        // The message first: the target posts the receive for the data
        // when it arrives, so that eager data lands in the window rather
        // than unexpected (and a rendezvous's request finds it posted).
        state.send(device, window, to.rank)?;
        let envelope = MessageEnvelope {
            context_id: context::point_to_point(to.context_id),
            source: to.shared.ranks[&device.rank()] as i32,
            tag: DATA_TAG,
        };
        // SAFETY: `data` stays borrowed, unmodified, while this waits for
        // the send below.
        let send = unsafe { device.start_send(peer, envelope, data.as_ptr(), data.len(), false)? };
        Ok(send)
    })?;
    let status = crate::wait_request(send)?;
    status.error.map_or(Ok(()), Err)
}

/// Starts a get of `len` bytes at byte displacement `disp` of the target
/// into `result`, whose data travels as a point-to-point message
/// ([`FLAG_BY_MESSAGE`]) straight from the target's window into
/// `result`: the receive is posted before the get is queued. Returns its
/// request, complete once the data is there.
///
/// # Safety
/// `result` must be writable for `len` bytes, and not otherwise
/// accessed, until the returned request completes.
pub(crate) unsafe fn get_by_message(
    device: &mut Device,
    to: &Target<'_>,
    disp: u64,
    result: *mut u8,
    len: usize,
) -> Result<RequestId> {
    let window = (to.shared, to.context_id);
    let request = device.start_generalized();
    let mut state = to.shared.state();
    // The token `queue` gives the get below names its data's message.
    let token = state.next_token;
    let pattern = MatchPattern {
        context_id: context::point_to_point(to.context_id),
        source: Some(to.rank as i32),
        tag: Some(get_tag(token)),
    };
    let peer = to.shared.members[to.rank];
    // SAFETY: the caller's guarantee, passed on.
    let recv = unsafe { device.start_recv(pattern, Some(peer), result, len) };
    let recv = match recv {
        Ok(recv) => recv,
        Err(e) => {
            device.take_status(request);
            return Err(e);
        }
    };
    let mut m = Message::new(Kind::Get, 0);
    m.flags = FLAG_BY_MESSAGE;
    m.disp = disp;
    m.len = len as u64;
    let pending = Pending::Receiving { recv, request };
    if let Err(e) = state.queue(device, window, to.rank, Some(pending), m) {
        // `State::send` failed the get and cancelled its receive.
        device.take_status(recv);
        device.take_status(request);
        return Err(e);
    }
    drop(state);
    watch(
        recv,
        to.context_id,
        Then::Fetched {
            token,
            request,
            len,
        },
    );
    Ok(request)
}

/// Where the data of an accumulate by message goes: combined into the
/// window's `len` bytes at `window` with `op`, each piece as it lands
/// (pieces are whole elements: they end at multiples of 256 KiB or at
/// the message's end, and the message is whole elements).
struct Combine {
    window: *mut u8,
    len: usize,
    element: AccumulateType,
    op: AccumulateOp,
}

// SAFETY: `window` names the window's memory, valid while the transfer
// is under way (`unregister` waits for it), and touched only by the
// device's progress engine, with the device locked.
unsafe impl Send for Combine {}

impl MessageSink for Combine {
    fn capacity(&self) -> usize {
        self.len
    }

    fn unpack(&mut self, offset: usize, bytes: &[u8]) -> Result<()> {
        let end = offset
            .checked_add(bytes.len())
            .filter(|&end| end <= self.len);
        let element = self.element;
        if end.is_none() || !element.holds_whole(offset) || !element.holds_whole(bytes.len()) {
            return Err(Error::new(
                ErrorClass::ProcFailed,
                format!(
                    "a piece of {} bytes at {offset} of an accumulate of {} bytes of {}-byte elements",
                    bytes.len(),
                    self.len,
                    element.size()
                ),
            ));
        }
        // SAFETY: `offset .. offset + bytes.len()` lies within the `len`
        // bytes at `window`, which the target's range check put inside
        // the window's memory (see the `unsafe impl Send` above).
        let window =
            unsafe { std::slice::from_raw_parts_mut(self.window.add(offset), bytes.len()) };
        combine(window, bytes, element, self.op)
    }
}

/// Where the data of a refused put goes: nowhere. It comes all the same
/// and must be taken off the connection, and the next put's receive must
/// not take it.
struct Discard(usize);

impl MessageSink for Discard {
    fn capacity(&self) -> usize {
        self.0
    }

    fn unpack(&mut self, _offset: usize, _bytes: &[u8]) -> Result<()> {
        Ok(())
    }
}

/// Appends the refusal of the operation `token` with `error` to
/// `replies`.
fn refuse(replies: &mut Vec<u8>, token: u64, error: &Error) {
    let text = error.message();
    let mut answer = Message::new(Kind::Refused, token);
    answer.class = error.class().code() as u8;
    answer.len = text.len() as u64;
    answer.data = text.as_bytes();
    answer.append_to(replies);
}

/// Whether `payload` is a batch of answers (replies and refusals).
fn answers(payload: &[u8]) -> bool {
    matches!(Message::split(payload), Ok((m, _)) if matches!(m.kind, Kind::Reply | Kind::Refused))
}

/// The registered window of `context_id`, if it still is.
fn window(context_id: u32) -> Option<Arc<Shared>> {
    lock(&WINDOWS)
        .as_ref()
        .and_then(|m| m.get(&context_id).cloned())
}

/// The window `context_id` that `peer` named in an active message, and
/// the peer's rank in it.
fn window_of(peer: PeerRank, context_id: u32) -> Result<(Arc<Shared>, usize)> {
    let shared = window(context_id).ok_or_else(|| {
        Error::new(
            ErrorClass::ProcFailed,
            format!("rank {peer} named window context {context_id}, which this rank does not have"),
        )
    })?;
    let from = *shared.ranks.get(&peer).ok_or_else(|| {
        Error::new(
            ErrorClass::ProcFailed,
            format!("rank {peer} sent a one-sided message for a window it is not in"),
        )
    })?;
    Ok((shared, from))
}

/// The device's placer of put data streamed as placed active messages
/// ([`put_placed`]): the key is the piece's byte displacement in the
/// window the context id names and the bound the displacement where the
/// whole put ends; the range from the key to the bound is checked
/// before a byte is read, so a put that does not fit is refused whole
/// (a dynamic window's regions are known only here). A put that fits
/// lands in the window if it may now ([`may_land`]), else is held back
/// for the handler, which puts it in its turn (behind the peer's lock
/// request until that is granted).
pub(crate) struct Placer;

// SAFETY: a destination lies in the window's memory (`Memory::range`
// checked the whole range), which stays valid while data arrives into
// it: `unregister` waits until `Device::placing_into` says none does
// before the window's memory goes. Nothing else in this library touches
// those bytes meanwhile; the program must not either (MPI forbids
// accessing window memory that a put targets during its epoch).
unsafe impl ActivePlacer for Placer {
    fn place(
        &mut self,
        peer: PeerRank,
        context_id: u32,
        (disp, end): (u64, u64),
        len: usize,
        queued: &mut dyn Iterator<Item = &ActiveMessage>,
    ) -> Result<Destination> {
        let (shared, _) = window_of(peer, context_id)?;
        let rest = end
            .checked_sub(disp)
            .filter(|&rest| rest >= len as u64)
            .ok_or_else(|| {
                Error::new(
                    ErrorClass::ProcFailed,
                    format!("rank {peer} put {len} bytes at {disp} of a put that ends at {end}"),
                )
            })?;
        let mut state = shared.state();
        let at = match state.memory.range(disp, rest) {
            Ok(at) => at,
            Err(e) => return Ok(Destination::Refused(e)),
        };
        Ok(if may_land(&mut state.lock, peer, queued)? {
            Destination::At(at)
        } else {
            Destination::Held
        })
    }
}

/// Whether a placed put's data from `peer` may land in the window now,
/// the handler not having been handed `queued` yet (the peer's earlier
/// active messages for the window, in order): data that lands is not
/// held behind a lock request as the handler holds a put, so it may land
/// only where the peer's epoch needs no grant it has not got. That is
/// where no request of the peer waits and none of its lock or unlock
/// messages is queued (it holds the lock, or its epoch is a fence,
/// post-start-complete or `MODE_NOCHECK` one), or where what is queued
/// is a lock request, alone or behind the lone unlock of the peer's
/// hold (an unlock that did not wait for its release: nothing of that
/// epoch is left to apply), that was granted early or is granted early
/// now ([`LockQueue::grant_early`]: nobody waits, and it goes with the
/// holders, less the hold the unlock ends), the way a lock, a large put
/// and an unlock arrive. Anything else is held back: always right, at
/// the cost of a copy.
fn may_land(
    lock: &mut LockQueue,
    peer: PeerRank,
    queued: &mut dyn Iterator<Item = &ActiveMessage>,
) -> Result<bool> {
    if lock.waits(peer) {
        return Ok(false);
    }
    let mut seen = Queued::Nothing;
    for message in queued {
        if message.placed.is_some() {
            // A piece of a put.
            seen = seen.then_operation();
            continue;
        }
        let mut rest = &message.payload[..];
        while !rest.is_empty() {
            let (m, after) = Message::split(rest)?;
            rest = after;
            seen = match m.kind {
                Kind::Lock => seen.then_lock(m.token, m.flags & FLAG_EXCLUSIVE != 0),
                Kind::Unlock => seen.then_unlock(),
                Kind::Put | Kind::Get | Kind::Accumulate | Kind::CompareAndSwap => {
                    seen.then_operation()
                }
                // Answers, and exposure epochs' notices: not this window's
                // memory, nor its lock.
                Kind::Reply | Kind::Refused | Kind::Post | Kind::Complete => seen,
            };
        }
    }
    Ok(match seen {
        Queued::Nothing | Queued::Operations => true,
        Queued::Lock {
            token,
            exclusive,
            releasing,
        } => {
            lock.is_granted_early(peer, token)
                || lock.grant_early(peer, token, exclusive, releasing)
        }
        Queued::Unlock | Queued::Other => false,
    })
}

/// What [`may_land`] found of a peer's queued messages, so far.
#[derive(Clone, Copy)]
enum Queued {
    /// Nothing of the peer's.
    Nothing,
    /// Operations of the epoch under way, no lock or unlock.
    Operations,
    /// The unlock of the peer's hold, alone, and nothing after it.
    Unlock,
    /// A lock request (and maybe operations of its epoch after it),
    /// behind nothing, or behind the unlock of the peer's hold
    /// (`releasing`).
    Lock {
        token: u64,
        exclusive: bool,
        releasing: bool,
    },
    /// Anything else: the data is held back.
    Other,
}

impl Queued {
    fn then_lock(self, token: u64, exclusive: bool) -> Queued {
        match self {
            Queued::Nothing | Queued::Unlock => Queued::Lock {
                token,
                exclusive,
                releasing: matches!(self, Queued::Unlock),
            },
            Queued::Operations | Queued::Lock { .. } | Queued::Other => Queued::Other,
        }
    }

    fn then_unlock(self) -> Queued {
        match self {
            Queued::Nothing => Queued::Unlock,
            // Operations of the epoch it ends, queued ahead: the next
            // epoch's data must not land before they are applied.
            Queued::Operations | Queued::Unlock | Queued::Lock { .. } | Queued::Other => {
                Queued::Other
            }
        }
    }

    fn then_operation(self) -> Queued {
        match self {
            Queued::Nothing | Queued::Operations => Queued::Operations,
            // Of the requested lock's epoch.
            Queued::Lock { .. } => self,
            // Between an unlock and a lock: no epoch's.
            Queued::Unlock | Queued::Other => Queued::Other,
        }
    }
}

/// The error of an operation that rank `from` refused with `m`.
fn refusal(from: usize, m: &Message<'_>) -> Error {
    Error::new(
        class_of(m.class),
        format!(
            "rank {from} (target) refused the operation: {}",
            String::from_utf8_lossy(m.data)
        ),
    )
}

/// The error class whose code a refusal carries (a code this build does
/// not know reads as `MPI_ERR_OTHER`).
fn class_of(code: u8) -> ErrorClass {
    [ErrorClass::RmaRange, ErrorClass::Op, ErrorClass::Type]
        .into_iter()
        .find(|c| c.code() == i32::from(code))
        .unwrap_or(ErrorClass::Other)
}

/// Applies the operation `m` to `memory` and appends its answer to
/// `replies`: its reply, with its result, or its refusal.
fn apply_answered(memory: &mut Memory, m: &Message<'_>, replies: &mut Vec<u8>) {
    let at = replies.len();
    Message::reply(m.token).append_to(replies);
    match apply(memory, m, replies) {
        Ok(()) => set_data_len(&mut replies[at..]),
        Err(e) => {
            replies.truncate(at);
            refuse(replies, m.token, &e);
        }
    }
}

/// Applies an operation to the window's memory; its result appended to
/// `old` (the target's old data for a get or a fetching operation, else
/// nothing). Nothing is touched unless the whole range lies in the
/// window: under [`FLAG_LAYOUT`], every segment of the layout is checked
/// before the first is touched, then each is applied in order with its
/// piece of the data.
fn apply(memory: &mut Memory, m: &Message<'_>, old: &mut Vec<u8>) -> Result<()> {
    if m.flags & FLAG_LAYOUT != 0 && cuts_elements(m) {
        return accumulate_gathered(memory, m, old);
    }
    if m.flags & FLAG_LAYOUT != 0 {
        // Only puts and accumulates that are not no-ops carry data.
        let carries_data = !m.data.is_empty();
        let mut at = 0;
        let mut piece = |len: usize| -> Result<&[u8]> {
            let data = if carries_data {
                m.data.get(at..at + len).ok_or_else(|| {
                    Error::new(ErrorClass::Intern, "a layout longer than its data")
                })?
            } else {
                &[]
            };
            at += len;
            Ok(data)
        };
        if let Memory::Block { size, .. } = *memory {
            // One check per run: its span holds every segment of it. Then
            // every segment is a slice of the whole block.
            for run in m.layout.runs() {
                let (low, high) = run.span();
                let (low, high) = (i128::from(m.disp) + low, i128::from(m.disp) + high);
                if low < 0 || high > size as i128 {
                    return Err(Error::new(
                        ErrorClass::RmaRange,
                        format!(
                            "a layout run reaching bytes {low}..{high} lies outside the target \
                             window of {size} bytes"
                        ),
                    ));
                }
            }
            // Not empty: the layout has a run (decoding checked), which
            // fits in it.
            let window = window_bytes(memory, 0, size)?;
            return each_segment(m, |disp, len| {
                // Within the block: its run's span was checked above.
                let segment = &mut window[disp as usize..disp as usize + len];
                apply_to(segment, m, piece(len)?, old)
            });
        }
        each_segment(m, |disp, len| memory.range(disp, len as u64).map(drop))?;
        return each_segment(m, |disp, len| {
            apply_to(window_bytes(memory, disp, len)?, m, piece(len)?, old)
        });
    }
    let len = usize::try_from(m.len).map_err(|_| {
        Error::new(
            ErrorClass::RmaRange,
            "a length beyond this machine's memory",
        )
    })?;
    apply_to(window_bytes(memory, m.disp, len)?, m, m.data, old)
}

/// Whether `m` is an accumulate on a layout (under [`FLAG_LAYOUT`]) with
/// a segment that holds no whole number of its elements: a value-index
/// pair with padding between value and index (`MPI_SHORT_INT` as C lays
/// it out), whose pairs only the whole message holds.
fn cuts_elements(m: &Message<'_>) -> bool {
    let Some(element) = m.element.filter(|_| m.kind == Kind::Accumulate) else {
        return false;
    };
    m.layout.runs().any(|run| !element.holds_whole(run.len))
}

/// [`apply`] of an accumulate whose layout cuts elements
/// ([`cuts_elements`]): every segment checked, then the target's data
/// gathered packed (the old data, if fetched), combined with the
/// message's whole and scattered back, all under the window's state as
/// any message.
fn accumulate_gathered(memory: &mut Memory, m: &Message<'_>, old: &mut Vec<u8>) -> Result<()> {
    let (Some(element), Some(op)) = (m.element, m.op) else {
        return Err(Error::new(
            ErrorClass::Intern,
            "an accumulate without its type",
        ));
    };
    each_segment(m, |disp, len| memory.range(disp, len as u64).map(drop))?;
    let mut current = Vec::with_capacity(m.data.len());
    each_segment(m, |disp, len| {
        current.extend_from_slice(window_bytes(memory, disp, len)?);
        Ok(())
    })?;
    if m.flags & FLAG_FETCH != 0 {
        old.extend_from_slice(&current);
    }
    if op == AccumulateOp::NoOp {
        return Ok(());
    }
    combine(&mut current, m.data, element, op)?;
    let mut at = 0;
    each_segment(m, |disp, len| {
        window_bytes(memory, disp, len)?.copy_from_slice(&current[at..at + len]);
        at += len;
        Ok(())
    })
}

/// Calls `f(disp, len)` for each segment of the layout of `m` (under
/// [`FLAG_LAYOUT`]), at its byte displacement in the window, in order,
/// until `f` fails. A segment before the window's start (or beyond the
/// last address) is out of its range.
fn each_segment(m: &Message<'_>, mut f: impl FnMut(u64, usize) -> Result<()>) -> Result<()> {
    // Walked without wrapping: decoding checked that every segment of a
    // run lies in the address range.
    for run in m.layout.runs() {
        for (offset, len) in run.segments() {
            let at = m.disp.checked_add_signed(offset as i64).ok_or_else(|| {
                Error::new(
                    ErrorClass::RmaRange,
                    format!(
                        "{len} bytes at byte displacement {} lie outside the target window",
                        i128::from(m.disp) + offset as i128
                    ),
                )
            })?;
            f(at, len)?;
        }
    }
    Ok(())
}

/// The `len` bytes at byte displacement `disp` of the window's memory, or
/// an `MPI_ERR_RMA_RANGE` error if any lies outside it.
fn window_bytes(memory: &mut Memory, disp: u64, len: usize) -> Result<&mut [u8]> {
    let at = memory.range(disp, len as u64)?;
    // SAFETY: `range` checked that `at .. at + len` lies in the window's
    // memory, which its owner keeps valid and lets only this module (with
    // the state locked, as `memory` is borrowed from it) and the owner's
    // own accessors (with the device locked, as this handler runs) touch.
    Ok(unsafe { std::slice::from_raw_parts_mut(at, len) })
}

/// Applies the operation of `m` to `window` (the range it names, or one
/// segment of its layout) with `data` (its data, or that segment's piece
/// of it); its result appended to `old`.
fn apply_to(window: &mut [u8], m: &Message<'_>, data: &[u8], old: &mut Vec<u8>) -> Result<()> {
    let len = window.len();
    match m.kind {
        Kind::Put => {
            window.copy_from_slice(data);
            Ok(())
        }
        Kind::Get => {
            old.extend_from_slice(window);
            Ok(())
        }
        Kind::Accumulate => {
            if m.flags & FLAG_FETCH != 0 {
                old.extend_from_slice(window);
            }
            let (Some(element), Some(op)) = (m.element, m.op) else {
                return Err(Error::new(
                    ErrorClass::Intern,
                    "an accumulate without its type",
                ));
            };
            combine(window, data, element, op)
        }
        Kind::CompareAndSwap => {
            old.extend_from_slice(window);
            let (compare, origin) = data.split_at(len);
            if window == compare {
                window.copy_from_slice(origin);
            }
            Ok(())
        }
        _ => Err(Error::new(ErrorClass::Intern, "not an operation")),
    }
}

/// Combines `data` into `window` (equally long, elements of `element`)
/// with `op`: the accumulate of every path. Nothing is written unless the
/// lengths agree and the reduction is defined for the type.
pub(crate) fn combine(
    window: &mut [u8],
    data: &[u8],
    element: AccumulateType,
    op: AccumulateOp,
) -> Result<()> {
    if op != AccumulateOp::NoOp && data.len() != window.len() {
        return Err(Error::new(
            ErrorClass::Count,
            format!(
                "an accumulate of {} bytes into {} bytes of the window",
                data.len(),
                window.len()
            ),
        ));
    }
    match op {
        AccumulateOp::Replace => window.copy_from_slice(data),
        AccumulateOp::NoOp => {}
        AccumulateOp::Reduce(op) => {
            let reduction = element.reduction(op.system_op())?;
            // The kernels of numbers need aligned data: the packet or the
            // window at an odd offset is combined in aligned copies (the
            // usual case, an origin's typed buffer and a window at an
            // aligned displacement, in place in one pass).
            let aligned = |bytes: &[u8]| bytes.as_ptr().align_offset(element.align()) == 0;
            let input;
            let data = if aligned(data) {
                data
            } else {
                input = Aligned::from(data);
                input.bytes()
            };
            let applied = if aligned(window) {
                reduction.apply(data, window)
            } else {
                let mut inout = Aligned::from(&*window);
                let applied = reduction.apply(data, inout.bytes_mut());
                window.copy_from_slice(inout.bytes_mut());
                applied
            };
            if !applied {
                return Err(Error::new(
                    ErrorClass::Count,
                    format!(
                        "an accumulate of {} bytes is no whole number of {}-byte elements",
                        data.len(),
                        element.size()
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// A copy of bytes aligned for any basic type (16 bytes).
struct Aligned {
    words: Vec<u128>,
    len: usize,
}

impl Aligned {
    fn from(bytes: &[u8]) -> Aligned {
        let mut a = Aligned {
            words: vec![0; bytes.len().div_ceil(16)],
            len: bytes.len(),
        };
        a.bytes_mut().copy_from_slice(bytes);
        a
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: the words own `16 * words.len() >= len` initialized
        // bytes.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr().cast(), self.len) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: the words own `16 * words.len() >= len` initialized
        // bytes, and any byte pattern is a valid u8.
        unsafe { std::slice::from_raw_parts_mut(self.words.as_mut_ptr().cast(), self.len) }
    }
}

#[cfg(test)]
mod tests {
    use super::{apply, may_land, LockQueue, LockRequest, Memory, Shared};
    use crate::collective::SystemOperation;
    use crate::datatype::{Primitive, Run};
    use crate::rma::wire::FLAG_EXCLUSIVE;
    use crate::rma::wire::{AccumulateType, Kind, Layout, Message, FLAG_FETCH, FLAG_LAYOUT};
    use crate::ErrorClass;
    use oxmpi_adi::device::{ActiveMessage, Landing, Placed};
    use oxmpi_adi::transport::PeerRank;

    /// A message of `kind` on `layout` from `disp`, with `data`, through
    /// its wire form (as the handler gets it).
    fn typed(kind: Kind, disp: u64, layout: &[Run], data: &[u8], len: u64) -> Vec<u8> {
        let mut m = Message::new(kind, 1);
        m.flags = FLAG_LAYOUT;
        m.disp = disp;
        m.len = len;
        m.layout = Layout::Runs(layout);
        m.data = data;
        if kind == Kind::Accumulate {
            m.flags |= FLAG_FETCH;
            m.element = Some(AccumulateType::Basic(Primitive::U32));
            m.op = Some(SystemOperation::sum().into());
        }
        m.encode()
    }

    /// Counted operations add to the counted reply that ends the
    /// replies; any other answer after it starts a new one.
    #[test]
    fn counted_operations_share_the_counted_reply_that_ends_the_answers() {
        let mut handler = super::Handler::default();
        let answers = |handler: &super::Handler| {
            let mut rest = &handler.replies[..];
            let mut seen = Vec::new();
            while !rest.is_empty() {
                let (m, after) = Message::split(rest).unwrap();
                seen.push((m.kind, m.token, m.disp));
                rest = after;
            }
            seen
        };
        for _ in 0..3 {
            handler.answer_counted();
        }
        assert_eq!(answers(&handler), [(Kind::Reply, 0, 3)]);
        Message::reply(7).append_to(&mut handler.replies);
        handler.answer_counted();
        assert_eq!(
            answers(&handler),
            [
                (Kind::Reply, 0, 3),
                (Kind::Reply, 7, 0),
                (Kind::Reply, 0, 1)
            ]
        );
        // Sent: the next batch's answers start afresh, whatever lies
        // where the last counted reply was.
        handler.replies.clear();
        handler.counted_at = None;
        Message::reply(9).append_to(&mut handler.replies);
        handler.answer_counted();
        assert_eq!(
            answers(&handler),
            [(Kind::Reply, 9, 0), (Kind::Reply, 0, 1)]
        );
    }

    #[test]
    fn a_layout_is_scattered_and_gathered_in_order() {
        let mut window = [0u32; 8];
        let base = window.as_mut_ptr().cast();
        let mut memory = Memory::Block { base, size: 32 };
        // Elements 1, 3, 5, then 0: a vector run and a segment before it.
        let layout = [Run::new(4, 4, 3, 8), Run::new(-4, 4, 1, 0)];
        let data: Vec<u8> = [10u32, 30, 50, 0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let put = typed(Kind::Put, 4, &layout, &data, 16);
        let mut old = Vec::new();
        apply(&mut memory, &Message::decode(&put).unwrap(), &mut old).unwrap();
        let sum = typed(Kind::Accumulate, 4, &layout, &data, 16);
        apply(&mut memory, &Message::decode(&sum).unwrap(), &mut old).unwrap();
        // The fetch saw the put's values, in the layout's order.
        assert_eq!(old, data);
        assert_eq!(window, [0, 0, 20, 0, 60, 0, 100, 0]);
        let get = typed(Kind::Get, 4, &layout, &[], 16);
        old.clear();
        apply(&mut memory, &Message::decode(&get).unwrap(), &mut old).unwrap();
        let doubled: Vec<u8> = [20u32, 60, 100, 0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(old, doubled);
    }

    /// `MPI_MINLOC` with the old pairs fetched, into `MPI_SHORT_INT`
    /// pairs as C lays them out (value, 2 bytes of padding, index): the
    /// layout's segments cut the pairs (2 bytes of value, then the index
    /// with the next value), and the whole message is combined pair by
    /// pair, the padding untouched.
    #[test]
    fn an_accumulate_into_a_layout_that_cuts_pairs_combines_whole_pairs() {
        use crate::collective::op::PairType;
        use crate::collective::ValueIndex;
        use crate::datatype::ElementType;
        let pairs = PairType::of(ElementType::of::<ValueIndex<i16, i32>>()).unwrap();
        assert_eq!(pairs.size(), 6);
        // Three pairs of 8 bytes; padding 0xee.
        let mut window = [0xeeu8; 24];
        for (k, (value, index)) in [(5i16, 1i32), (2, 2), (7, 3)].into_iter().enumerate() {
            window[8 * k..8 * k + 2].copy_from_slice(&value.to_le_bytes());
            window[8 * k + 4..8 * k + 8].copy_from_slice(&index.to_le_bytes());
        }
        let before = window;
        let base = window.as_mut_ptr().cast();
        let mut memory = Memory::Block { base, size: 24 };
        // As `runs_of` flattens it: the first value, the index of each
        // pair with the next value, the last index.
        let layout = [
            Run::new(0, 2, 1, 0),
            Run::new(4, 6, 2, 8),
            Run::new(20, 4, 1, 0),
        ];
        let origin: Vec<u8> = [(3i16, 9i32), (2, 1), (9, 0)]
            .iter()
            .flat_map(|(v, i)| [v.to_le_bytes().to_vec(), i.to_le_bytes().to_vec()].concat())
            .collect();
        let mut m = Message::new(Kind::Accumulate, 1);
        m.flags = FLAG_LAYOUT | FLAG_FETCH;
        m.len = 18;
        m.layout = Layout::Runs(&layout);
        m.data = &origin;
        m.element = Some(AccumulateType::Pair(pairs));
        m.op = Some(SystemOperation::min_loc().into());
        let encoded = m.encode();
        let mut old = Vec::new();
        apply(&mut memory, &Message::decode(&encoded).unwrap(), &mut old).unwrap();
        let packed_before: Vec<u8> = (0..3)
            .flat_map(|k| [&before[8 * k..8 * k + 2], &before[8 * k + 4..8 * k + 8]].concat())
            .collect();
        assert_eq!(old, packed_before);
        let mut want = before;
        // Pair 0: 3 < 5 (index 9); pair 1: a tie, the smaller index (1);
        // pair 2: 7 < 9, unchanged.
        want[..2].copy_from_slice(&3i16.to_le_bytes());
        want[4..8].copy_from_slice(&9i32.to_le_bytes());
        want[12..16].copy_from_slice(&1i32.to_le_bytes());
        assert_eq!(window, want);
    }

    #[test]
    fn nothing_lands_when_any_segment_is_out_of_range() {
        let mut window = [0u8; 64];
        let start = window.as_mut_ptr() as usize;
        let data = [7u8; 24];
        // The third segment ends one byte past the window (a block), or
        // between the two attached regions (dynamic); the fourth lies
        // before the window's start.
        let past = [Run::new(0, 8, 3, 24)];
        let before = [Run::new(0, 8, 2, 8), Run::new(-16, 8, 1, 0)];
        let cases = [
            (
                Memory::Block {
                    base: start as *mut u8,
                    size: 55,
                },
                0,
                &past[..],
            ),
            (
                Memory::Dynamic(vec![(start, 40), (start + 49, 15)]),
                start as u64,
                &past[..],
            ),
            (
                Memory::Block {
                    base: start as *mut u8,
                    size: 64,
                },
                8,
                &before[..],
            ),
        ];
        for (mut memory, disp, layout) in cases {
            for kind in [Kind::Put, Kind::Accumulate, Kind::Get] {
                let data = if kind == Kind::Get {
                    &[][..]
                } else {
                    &data[..]
                };
                let bytes = typed(kind, disp, layout, data, 24);
                let mut old = Vec::new();
                let e =
                    apply(&mut memory, &Message::decode(&bytes).unwrap(), &mut old).unwrap_err();
                assert_eq!(e.class(), ErrorClass::RmaRange, "{kind:?}: {}", e.message());
                assert!(old.is_empty(), "{kind:?} answered data");
            }
        }
        assert_eq!(window, [0; 64], "a refused operation wrote");
    }

    /// Requests of (peer, token, exclusive), in order.
    fn requests(list: &[(PeerRank, u64, bool)]) -> impl Iterator<Item = LockRequest> + '_ {
        list.iter()
            .map(|&(peer, token, exclusive)| LockRequest::new(peer, token, exclusive))
    }

    /// The (peer, token) of granted requests.
    fn ids(granted: Vec<LockRequest>) -> Vec<(PeerRank, u64)> {
        granted.into_iter().map(|r| (r.peer, r.token)).collect()
    }

    #[test]
    fn the_lock_is_first_come_first_served() {
        let mut lock = LockQueue::default();
        // Two readers hold it; a writer comes, then more readers.
        lock.waiting
            .extend(requests(&[(1, 1, false), (2, 2, false)]));
        assert_eq!(ids(lock.grant()), vec![(1, 1), (2, 2)]);
        lock.waiting
            .extend(requests(&[(3, 3, true), (4, 4, false), (5, 5, false)]));
        // The later readers wait behind the writer: it is not starved.
        assert_eq!(ids(lock.grant()), vec![]);
        lock.release(2).unwrap();
        assert_eq!(ids(lock.grant()), vec![]);
        assert!(lock.release(2).is_err(), "an unlock of a lock not held");
        lock.release(1).unwrap();
        assert_eq!(ids(lock.grant()), vec![(3, 3)]);
        lock.release(3).unwrap();
        assert_eq!(ids(lock.grant()), vec![(4, 4), (5, 5)]);
        lock.release(5).unwrap();
        lock.release(4).unwrap();
        assert!(lock.release(4).is_err(), "an unlock nobody locked");
    }

    #[test]
    fn messages_behind_a_waiting_request_wait_with_it() {
        let mut lock = LockQueue::default();
        // Rank 1 holds it exclusively; 2 asks, and sends two messages
        // behind its request; 3 asks too.
        lock.waiting.extend(requests(&[(1, 1, true)]));
        assert_eq!(ids(lock.grant()), vec![(1, 1)]);
        lock.waiting
            .extend(requests(&[(2, 2, true), (3, 3, false)]));
        assert_eq!(ids(lock.grant()), vec![]);
        // The holder's messages, and those of a peer that asked nothing,
        // are handled at once.
        assert!(!lock.defer(1, &[b"holder"]));
        assert!(!lock.defer(4, &[b"none"]));
        assert!(lock.defer(2, &[b"put,"]));
        assert!(lock.defer(2, &[b"unlock"]));
        lock.release(1).unwrap();
        let granted = lock.grant();
        assert_eq!(granted.len(), 1);
        assert_eq!(
            (granted[0].peer, &granted[0].behind[..]),
            (2, &b"put,unlock"[..])
        );
        // Now 2 holds it: its messages are handled at once, and 3's
        // wait behind its request.
        assert!(!lock.defer(2, &[b"get"]));
        assert!(lock.defer(3, &[b"get"]));
        // A lost waiter's messages go with its request.
        assert_eq!(ids(lock.lose(3)), vec![]);
        assert!(!lock.defer(3, &[b"get"]));
        lock.release(2).unwrap();
        assert!(lock.holders.is_empty() && lock.waiting.is_empty());
    }

    #[test]
    fn a_lost_peers_hold_and_requests_end() {
        let mut lock = LockQueue::default();
        // Rank 1 holds it exclusively; 2 waits, 1 asks again, 3 waits.
        lock.waiting.extend(requests(&[(1, 1, true)]));
        assert_eq!(ids(lock.grant()), vec![(1, 1)]);
        lock.waiting
            .extend(requests(&[(2, 2, false), (1, 3, true), (3, 4, false)]));
        assert_eq!(ids(lock.grant()), vec![]);
        // Rank 1 is lost: 2 and 3 get it, and 1's request is gone.
        assert_eq!(ids(lock.lose(1)), vec![(2, 2), (3, 4)]);
        assert!(lock.waiting.is_empty());
        // A lost peer that held nothing changes nothing.
        assert_eq!(ids(lock.lose(4)), vec![]);
        lock.release(2).unwrap();
        lock.release(3).unwrap();
        assert!(lock.holders.is_empty());
    }

    /// An active message from `peer` of the messages `(kind, token,
    /// exclusive)`, batched, as the placer is shown it queued.
    fn batch(peer: PeerRank, messages: &[(Kind, u64, bool)]) -> ActiveMessage {
        let mut payload = Vec::new();
        for &(kind, token, exclusive) in messages {
            let mut m = Message::new(kind, token);
            if exclusive {
                m.flags = FLAG_EXCLUSIVE;
            }
            m.append_to(&mut payload);
        }
        ActiveMessage {
            peer,
            context_id: 1,
            payload,
            placed: None,
        }
    }

    /// A placed piece from `peer` that landed, as the placer is shown it
    /// queued.
    fn landed(peer: PeerRank) -> ActiveMessage {
        ActiveMessage {
            peer,
            context_id: 1,
            payload: Vec::new(),
            placed: Some(Placed {
                key: 0,
                len: 8,
                landing: Landing::InPlace,
            }),
        }
    }

    /// [`may_land`] of `peer`'s data behind `queued`.
    fn lands(lock: &mut LockQueue, peer: PeerRank, queued: &[ActiveMessage]) -> bool {
        may_land(lock, peer, &mut queued.iter()).unwrap()
    }

    #[test]
    fn placed_data_lands_only_where_its_peer_needs_no_grant_it_lacks() {
        let mut lock = LockQueue::default();
        // Nothing queued, nothing waiting: a fence epoch, or a lock held.
        assert!(lands(&mut lock, 2, &[]));
        let asked = [batch(2, &[(Kind::Lock, 5, true), (Kind::Put, 0, false)])];
        // A request nobody stands in the way of: granted early, once,
        // also for the later pieces behind it.
        assert!(lands(&mut lock, 2, &asked));
        assert_eq!(lock.holders, vec![(2, true)]);
        let later = [batch(2, &[(Kind::Lock, 5, true)]), landed(2)];
        assert!(lands(&mut lock, 2, &later));
        assert_eq!(lock.holders, vec![(2, true)], "granted twice");
        // A request behind that exclusive hold: held back, not granted.
        let shared = [batch(3, &[(Kind::Lock, 9, false)])];
        assert!(!lands(&mut lock, 3, &shared));
        assert_eq!(lock.holders, vec![(2, true)]);
        // The handler reaches the request granted early: it answers it
        // only, once.
        assert!(lock.take_early(2, 5));
        assert!(!lock.take_early(2, 5));
        // A waiting request holds the data back, whatever is queued.
        lock.waiting.extend(requests(&[(3, 9, false)]));
        assert!(!lands(&mut lock, 3, &[]));
        lock.waiting.clear();
        // Operations ahead of the holder's unlock and next lock: held
        // back (they must apply first).
        let unlock = |ahead: &[(Kind, u64, bool)]| {
            let mut all = ahead.to_vec();
            all.push((Kind::Unlock, 6, false));
            [batch(2, &all), batch(2, &[(Kind::Lock, 7, true)])]
        };
        assert!(!lands(&mut lock, 2, &unlock(&[(Kind::Put, 0, false)])));
        assert!(!lands(
            &mut lock,
            2,
            &[batch(2, &[(Kind::Put, 0, false), (Kind::Lock, 7, true)])]
        ));
        // A lock, an unlock and a lock: held back.
        let twice = [
            batch(2, &[(Kind::Lock, 7, true)]),
            batch(2, &[(Kind::Unlock, 6, false)]),
            batch(2, &[(Kind::Lock, 8, true)]),
        ];
        assert!(!lands(&mut lock, 2, &twice));
        assert_eq!(lock.holders, vec![(2, true)]);
        assert!(lock.granted_early.is_empty());
        // The holder's lone unlock and its next lock in one poll (an
        // unlock that did not wait for its release): granted early, as
        // if the unlock were handled.
        assert!(lands(&mut lock, 2, &unlock(&[])));
        assert_eq!(lock.holders, vec![(2, true), (2, true)]);
        // The unlock, handled, ends the older hold; the lock is answered.
        lock.release(2).unwrap();
        assert_eq!(lock.holders, vec![(2, true)]);
        assert!(lock.take_early(2, 7));
        // Another's shared hold stands in the way of an exclusive lock
        // behind the unlock of a shared one.
        lock.release(2).unwrap();
        lock.waiting
            .extend(requests(&[(2, 10, false), (4, 11, false)]));
        assert_eq!(ids(lock.grant()), vec![(2, 10), (4, 11)]);
        assert!(!lands(&mut lock, 2, &unlock(&[])));
        // An unlock of a hold the peer does not have: held back.
        assert!(!lands(
            &mut lock,
            3,
            &[batch(
                3,
                &[(Kind::Unlock, 6, false), (Kind::Lock, 7, false)]
            )]
        ));
        assert_eq!(lock.holders, vec![(2, false), (4, false)]);
    }

    #[test]
    fn a_lost_peer_forgets_its_early_grant() {
        let mut lock = LockQueue::default();
        assert!(lands(&mut lock, 2, &[batch(2, &[(Kind::Lock, 5, false)])]));
        // Rank 3 asks exclusively behind the early shared grant.
        lock.waiting.extend(requests(&[(3, 8, true)]));
        assert_eq!(ids(lock.grant()), vec![]);
        // Rank 2 is lost before its request was handled: its hold ends
        // and 3 gets the lock; its early grant is forgotten.
        assert_eq!(ids(lock.lose(2)), vec![(3, 8)]);
        assert!(lock.granted_early.is_empty());
        assert!(!lock.take_early(2, 5));
    }

    /// A held piece applied at once, or kept behind its peer's waiting
    /// request and applied, as the handler applies what was kept, once
    /// that is granted: answered counted (token 0) either way.
    #[test]
    fn held_data_is_put_in_its_turn() {
        let mut window = [0u8; 32];
        let base = window.as_mut_ptr();
        let shared = Shared::new(&[0, 1, 2], Memory::Block { base, size: 32 });
        let mut replies = Vec::new();
        let counted = |replies: &[u8]| {
            let (m, rest) = Message::split(replies).unwrap();
            assert!(rest.is_empty());
            (m.kind, m.token)
        };
        {
            let mut state = shared.state();
            state.put_held(1, 4, b"now", &mut replies);
            assert_eq!(counted(&replies), (Kind::Reply, 0));
            replies.clear();
            // Rank 1 holds the lock; rank 2's request waits.
            state
                .lock
                .waiting
                .extend(requests(&[(1, 1, true), (2, 2, true)]));
            assert_eq!(ids(state.lock.grant()), vec![(1, 1)]);
            state.put_held(2, 16, b"later", &mut replies);
            assert!(replies.is_empty(), "answered before its lock was granted");
        }
        assert_eq!(
            &window[16..21],
            [0; 5],
            "landed before its lock was granted"
        );
        let mut state = shared.state();
        state.lock.release(1).unwrap();
        let granted = state.lock.grant();
        assert_eq!(granted.len(), 1);
        let (m, rest) = Message::split(&granted[0].behind).unwrap();
        assert!(rest.is_empty());
        super::apply_answered(&mut state.memory, &m, &mut replies);
        assert_eq!(counted(&replies), (Kind::Reply, 0));
        drop(state);
        assert_eq!(&window[4..7], b"now");
        assert_eq!(&window[16..21], b"later");
    }
}
