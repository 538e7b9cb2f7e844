//! The device: virtual connections, protocols, requests and progress.
//!
//! [`Device`] is what the MPI layer drives. It owns
//! - one virtual connection (VC) per peer, created unbound and bound on
//!   first use to the best transport both ends have (late binding, seed
//!   "multi-method device"): self for the own rank, then the transports in
//!   the order given to [`Device::new`], the first whose card the peer
//!   published and that can reach it. Which one is decided for every peer
//!   at initialize ([`crate::select`]), so a peer that no transport reaches
//!   fails [`Device::new`] rather than its first message;
//! - the requests, and the matching queues (posted receives, unexpected
//!   messages);
//! - the choice of protocol for each send, in one place
//!   ([`Device::start_send`]): short messages go eager (header and data in
//!   one packet), long ones by rendezvous (RTS, CTS, then the data sent from
//!   the user's buffer without a copy and placed in the receiver's buffer
//!   without a copy; or, where the transport offers remote memory copy,
//!   copied between the two buffers by both sides at once, see
//!   [`crate::proto`]);
//! - streaming of data that is not contiguous in the user's memory: the
//!   MPI layer hands the device a [`MessageSource`] that packs any range
//!   of the message ([`Device::start_send_packed`]) or a [`MessageSink`]
//!   that unpacks one ([`Device::start_recv_unpacked`]), and a rendezvous
//!   then moves the data in pieces of at most [`PIECE_LEN`] bytes, packed
//!   just before each leaves and unpacked as each arrives, so neither side
//!   holds more than a piece of it packed;
//! - the progress engine, [`Device::check_device`] (the seed's
//!   `MPID_Check_device`): it polls the transports that VCs use (and now
//!   and then the others, which may have connections to accept); a
//!   blocking call polls for a while (latency; yielding the processor
//!   between polls where the node's ranks outnumber its cores) and then
//!   sleeps in the kernel on the transports' file descriptors (so a long
//!   wait does not burn a core): the policy of [`crate::wait`].
//!
//! - active messages ([`Kind::Active`]): opaque payloads for the MPI
//!   layer (one-sided communication), handed whole to the
//!   [`ActiveMessageHandler`] it installed, from within the progress
//!   engine, so they are handled whenever the process is in any call that
//!   makes progress. The device knows nothing of what they say. Placed
//!   active messages ([`FLAG_PLACED`]) carry data that the transport
//!   reads straight into the memory the MPI layer's [`ActivePlacer`]
//!   names from their header; the handler then hears that it landed.
//!   The placer may also hold the data back ([`Destination::Held`]): it
//!   is then read into a payload and handed to the handler in turn.
//!
//! The device is a plain `&mut self` state machine: the MPI layer keeps it
//! behind a lock, so several threads can drive it one at a time.

use crate::error::{Error, ErrorClass, Result};
use crate::matching::{Envelope, Pattern, PostedQueue, UnexpectedQueue};
use crate::pmi::Pmi;
use crate::proto::{
    remote_split, Header, Kind, FLAG_ALONE, FLAG_PIECE, FLAG_PLACED, FLAG_READY, FLAG_REMOTE,
    FLAG_SYNC, MAX_ACTIVE_LEN, PIECE_LEN,
};
use crate::request::Slab;
use crate::select::{card_key, Routes};
use crate::selfvc::SelfTransport;
use crate::transport::{
    deliver_in_steps, JobInfo, PacketSink, PayloadSlot, PeerRank, RdmaOp, RdmaRegion, RdmaTarget,
    RemoteRead, Transport,
};
use crate::vlog;
use crate::wait::{Idle, IdleStep, Sleep, WaitPolicy, SLEEP_AT_MOST};
use std::collections::VecDeque;

pub use crate::matching::{Envelope as MessageEnvelope, Pattern as MatchPattern};

/// A handle on a request the device holds until it is waited for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RequestId(u64);

/// The outcome of a completed request (MPI's status object).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    /// Source rank in the communicator (for receives).
    pub source: i32,
    /// Tag of the message (for receives).
    pub tag: i32,
    /// Number of bytes received (or sent).
    pub count: usize,
    /// Whether the request was cancelled.
    pub cancelled: bool,
    /// The request's error, if it failed.
    pub error: Option<Error>,
}

impl Status {
    fn empty() -> Status {
        Status {
            source: -1,
            tag: -1,
            count: 0,
            cancelled: false,
            error: None,
        }
    }
}

/// What a probe learns about a matching message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProbeInfo {
    /// The message's source rank in the communicator.
    pub source: i32,
    /// The message's tag.
    pub tag: i32,
    /// The message's length in bytes.
    pub len: usize,
}

/// The data of an outgoing message that is not contiguous in memory,
/// packed on demand ([`Device::start_send_packed`]). The device asks for
/// the message's packed bytes in order, a piece at a time, and only until
/// the send's request completes.
pub trait MessageSource: Send {
    /// Length of the packed message in bytes.
    fn len(&self) -> usize;

    /// Whether the message is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Packs the message's bytes `offset..offset + out.len()` into `out`.
    /// An error fails the send.
    fn pack(&mut self, offset: usize, out: &mut [u8]) -> Result<()>;
}

/// Where an incoming message that is not contiguous in memory goes,
/// unpacked piece by piece ([`Device::start_recv_unpacked`]). The device
/// hands it the message's bytes in order, and only until the receive's
/// request completes.
pub trait MessageSink: Send {
    /// The most bytes the receive takes (a longer message is truncated).
    fn capacity(&self) -> usize;

    /// Unpacks `bytes`, the message's bytes from `offset` on. An error
    /// fails the receive.
    fn unpack(&mut self, offset: usize, bytes: &[u8]) -> Result<()>;
}

/// The data of a send: a buffer, or a source that packs it.
enum Outbound {
    Raw(*const u8, usize),
    Packed(Box<dyn MessageSource>),
}

/// Where a request stands.
enum Phase {
    /// A long send announced with RTS, waiting for the receiver's CTS;
    /// `remote`: the RTS offered the buffer for remote memory copy, under
    /// this key ([`Transport::remote_offer`]).
    AwaitingCts {
        ptr: *const u8,
        len: usize,
        remote: Option<u64>,
    },
    /// A synchronous eager send, waiting for the receiver's match.
    AwaitingAck,
    /// A long send whose CTS arrived: `accepted` bytes go to the
    /// receiver's request `receiver_token` once the poll returns.
    Cleared {
        ptr: *const u8,
        accepted: usize,
        receiver_token: u64,
    },
    /// A long send's data handed to the transport without a copy.
    SendingData,
    /// A long send whose data goes in pieces ([`FLAG_PIECE`]): from `ptr`
    /// (contiguous data, the receiver asked for pieces) or packed by the
    /// request's source into its chunk. `sent` bytes went to the
    /// transport; `in_flight`: it has not finished with the last piece,
    /// and the next waits for its completion.
    Streaming {
        ptr: *const u8,
        accepted: usize,
        receiver_token: u64,
        sent: usize,
        in_flight: bool,
    },
    /// A long send whose receiver copies by remote memory copy.
    CopyingOut(Box<CopyOut>),
    /// A receive in the posted queue.
    Posted,
    /// A receive whose payload is arriving straight into its buffer.
    Arriving,
    /// A receive that sent CTS and waits for the data; `received` bytes
    /// of it came in pieces so far.
    AwaitingData { accepted: usize, received: usize },
    /// A receive whose piece of `len` bytes from stream offset `offset` is
    /// arriving (into its buffer, or its chunk for its sink).
    ArrivingPiece {
        accepted: usize,
        offset: usize,
        len: usize,
    },
    /// An operation the layer above carries out itself (a generalized
    /// request): it completes by [`Device::complete_generalized`] alone.
    Generalized,
    /// A receive that matched an RTS offering remote memory copy.
    CopyingIn(Box<CopyIn>),
    /// Finished; the status is final.
    Done,
}

/// The state of [`Phase::CopyingOut`] (out of line: the largest phases,
/// and rare, would make every request larger): this side writes its
/// share into the receiver's buffer at `address` once the poll returns;
/// `copied` counts the bytes written and those the receiver reported
/// read. Done when they reach `accepted`, and the buffer offered under
/// `key` is withdrawn.
struct CopyOut {
    ptr: *const u8,
    accepted: usize,
    receiver_token: u64,
    address: u64,
    key: u64,
    copied: usize,
}

/// The state of [`Phase::CopyingIn`] (out of line, as [`CopyOut`]): the
/// receive reads its share of the sender's buffer at `address` (offered
/// under `key`) once the poll returns (or answers with a plain CTS if it
/// cannot); `copied` counts the bytes that landed (read by this side, at
/// once or reported by the transport later, and those the sender
/// reported written).
struct CopyIn {
    address: u64,
    key: u64,
    /// The RTS said [`FLAG_ALONE`]: see [`remote_split`].
    alone: bool,
    sender_token: u64,
    accepted: usize,
    copied: usize,
}

struct Request {
    /// The peer the request needs; `None` for a receive from any source
    /// that has not matched yet.
    peer: Option<PeerRank>,
    /// Receive buffer (receives only).
    buf: *mut u8,
    cap: usize,
    /// Length of the matched message, to judge truncation.
    message_len: usize,
    phase: Phase,
    status: Outcome,
    /// The packer or unpacker of data that is not contiguous.
    stream: Option<Box<Stream>>,
}

/// A request's [`Status`] as the request keeps it, with a flag beside it.
/// The error is one pointer ([`Error`] is boxed), which keeps requests
/// small.
struct Outcome {
    source: i32,
    tag: i32,
    count: usize,
    cancelled: bool,
    /// A send whose cancellation the receiver was asked for (beside
    /// `cancelled`, where it takes no room).
    cancel_asked: bool,
    error: Option<Error>,
}

impl Outcome {
    fn of(status: Status) -> Outcome {
        Outcome {
            source: status.source,
            tag: status.tag,
            count: status.count,
            cancelled: status.cancelled,
            cancel_asked: false,
            error: status.error,
        }
    }

    /// The status, with the error cloned.
    fn to_status(&self) -> Status {
        Status {
            source: self.source,
            tag: self.tag,
            count: self.count,
            cancelled: self.cancelled,
            error: self.error.clone(),
        }
    }

    /// The status, taking the error.
    fn take(&mut self) -> Status {
        Status {
            source: self.source,
            tag: self.tag,
            count: self.count,
            cancelled: self.cancelled,
            error: self.error.take(),
        }
    }
}

/// What a request for data that is not contiguous in memory needs
/// besides the rest: out of line, since most requests have none of it
/// and every request is moved into the slab.
struct Stream {
    /// A send's packer.
    source: Option<Box<dyn MessageSource>>,
    /// A receive's unpacker (the request's `buf` is then unused).
    sink: Option<Box<dyn MessageSink>>,
    /// The piece the source packs into or the sink unpacks from (at most
    /// [`PIECE_LEN`] bytes, or an eager message's length).
    chunk: Vec<u8>,
}

impl Stream {
    fn packing(source: Box<dyn MessageSource>) -> Box<Stream> {
        Box::new(Stream {
            source: Some(source),
            sink: None,
            chunk: Vec::new(),
        })
    }

    fn unpacking(sink: Box<dyn MessageSink>) -> Box<Stream> {
        Box::new(Stream {
            source: None,
            sink: Some(sink),
            chunk: Vec::new(),
        })
    }
}

impl Request {
    fn new(peer: Option<PeerRank>, phase: Phase, status: Status) -> Request {
        Request {
            peer,
            buf: std::ptr::null_mut(),
            cap: 0,
            message_len: status.count,
            phase,
            status: Outcome::of(status),
            stream: None,
        }
    }

    fn fail(&mut self, error: Error) {
        if !matches!(self.phase, Phase::Done) {
            self.status.error = Some(error);
            self.done();
        }
    }

    /// Completes the request as it stands, releasing its packer or
    /// unpacker and its chunk, which are never used again.
    fn done(&mut self) {
        self.phase = Phase::Done;
        self.stream = None;
    }

    /// Whether a sink unpacks what the receive takes.
    fn has_sink(&self) -> bool {
        self.stream.as_ref().is_some_and(|s| s.sink.is_some())
    }

    /// The chunk of a request with a sink, resized to `len` bytes.
    fn make_chunk(&mut self, len: usize) {
        if let Some(stream) = self.stream.as_mut() {
            stream.chunk = vec![0; len];
        }
    }

    /// Unpacks the first `len` bytes of the chunk with the sink, at stream
    /// offset `offset`; no sink: nothing to do (the data is in `buf`).
    fn unpack_chunk(&mut self, offset: usize, len: usize) -> Result<()> {
        match self.stream.as_deref_mut() {
            Some(Stream {
                sink: Some(sink),
                chunk,
                ..
            }) => {
                let bytes = chunk.get(..len).ok_or_else(|| {
                    Error::new(
                        ErrorClass::Intern,
                        format!("{len} bytes to unpack from a chunk of {}", chunk.len()),
                    )
                })?;
                sink.unpack(offset, bytes)
            }
            _ => Ok(()),
        }
    }
}

/// The sender of a synchronous eager message, to be told of its match.
#[derive(Clone, Copy)]
struct SyncSender {
    peer: PeerRank,
    token: u64,
}

/// A message that arrived before its receive was posted.
enum Unexpected {
    Eager {
        data: Vec<u8>,
        sync: Option<SyncSender>,
    },
    Rts {
        peer: PeerRank,
        sender_token: u64,
        len: usize,
        /// The sender's buffer, its key, and whether the message is alone
        /// ([`FLAG_ALONE`]), when it offers remote memory copy.
        remote: Option<(u64, u64, bool)>,
    },
}

impl Unexpected {
    fn len(&self) -> usize {
        match self {
            Unexpected::Eager { data, .. } => data.len(),
            Unexpected::Rts { len, .. } => *len,
        }
    }

    /// Whether this is the message `token` of `peer`'s that a cancel names.
    fn sent_as(&self, from: PeerRank, token: u64) -> bool {
        match *self {
            Unexpected::Eager { sync: Some(s), .. } => s.peer == from && s.token == token,
            Unexpected::Eager { sync: None, .. } => false,
            Unexpected::Rts {
                peer, sender_token, ..
            } => peer == from && sender_token == token,
        }
    }

    /// The peer that sent it, when known.
    fn peer(&self) -> Option<PeerRank> {
        match *self {
            Unexpected::Eager { sync, .. } => sync.map(|s| s.peer),
            Unexpected::Rts { peer, .. } => Some(peer),
        }
    }
}

/// The blocking receive that waits without a request (see
/// [`Device::start_direct_recv`]). Its place in the posted queue is
/// [`DIRECT_TOKEN`].
enum Direct {
    /// None is under way.
    Idle,
    /// Posted: its buffer, the buffer's length, and the peer it needs
    /// (`None`: any source).
    Posted {
        buf: *mut u8,
        cap: usize,
        peer: Option<PeerRank>,
    },
    /// Complete with this status.
    Done(Status),
    /// Matched a message that needs a request (a rendezvous, or an eager
    /// message whose payload arrives in parts): it goes on as this one.
    Request(u64),
}

/// Where a direct receive stands ([`Device::direct_recv`]).
#[derive(Debug)]
pub enum DirectRecv {
    /// Not complete yet.
    Pending,
    /// Complete with this status (taken: the direct receive is over).
    Done(Status),
    /// It goes on as this request, to wait for as any other.
    Request(RequestId),
}

/// The posted queue's token for the direct receive: no request's token
/// is 0 (see `request::Slab`).
const DIRECT_TOKEN: u64 = 0;

/// The bit that marks the id of a standard eager send, complete when
/// started ([`Device::start_send`]): its low bits are the message's
/// length, and it names no request. A request's token has its high 32
/// bits non-zero (generations start at 1, see `request::Slab`), so no
/// request's id is ever one of these.
const SENT: u64 = 1 << 31;

impl RequestId {
    /// The id of an operation that was complete when it started, having
    /// moved `len` bytes (a standard eager send, a buffered send, a
    /// one-sided operation finished in the call): it names no request, so
    /// making, testing, waiting for and freeing it take no slot and no
    /// lock. `None` where `len` does not fit in the id; such an operation
    /// needs [`Device::completed_request`].
    #[inline]
    pub fn complete(len: usize) -> Option<RequestId> {
        ((len as u64) < SENT).then_some(RequestId(SENT | len as u64))
    }

    /// The status of an id made by [`RequestId::complete`], which is
    /// known from the id alone; `None` for an id that names a request.
    /// So a program's wait for such ids needs neither the device nor its
    /// lock.
    #[inline]
    pub fn complete_status(self) -> Option<Status> {
        (self.0 >> 31 == 1).then(|| Status {
            count: (self.0 & (SENT - 1)) as usize,
            ..Status::empty()
        })
    }
}

/// A message taken out of matching by a matched probe (`MPI_Mprobe`),
/// waiting for its matched receive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MessageId(u64);

#[derive(Clone)]
enum Binding {
    Unbound,
    /// Bound to the transport at this index.
    Bound(usize),
    /// Bound to the transport at this index by a packet that came over it:
    /// the transport has not been given the peer's card yet, which
    /// [`Device::bind`] does before the first send (a transport may need it
    /// for more connections than the one the peer opened).
    Arrived(usize),
    Failed(Error),
}

struct Vc {
    binding: Binding,
    send_sequence: u32,
    recv_sequence: u32,
    /// An eager message from this peer that matched no receive, whose
    /// payload is still arriving. A VC delivers packets in order, so there
    /// is at most one; it joins the unexpected queue when complete, which
    /// keeps arrival order.
    arriving: Option<(Envelope, Vec<u8>, Option<SyncSender>)>,
    /// An active message from this peer whose payload is still arriving.
    arriving_active: Option<ArrivingActive>,
    /// A placed active message from this peer whose data is still
    /// arriving, straight into the memory its placer named.
    arriving_placed: Option<Placing>,
}

/// An active message whose payload is arriving into `payload`.
struct ArrivingActive {
    context_id: u32,
    payload: Vec<u8>,
    /// The key of a placed active message whose data the placer held
    /// back ([`Destination::Held`]): the payload is that data, not a
    /// message for the handler.
    held: Option<u64>,
}

/// The data of a placed active message ([`FLAG_PLACED`]) on its way
/// into `len` bytes at `dest`, which the [`ActivePlacer`] named for
/// (`context_id`, `key`).
struct Placing {
    context_id: u32,
    key: u64,
    dest: *mut u8,
    len: usize,
}

impl Vc {
    /// The error that lost the peer, if it is lost.
    fn failure(&self) -> Option<Error> {
        match &self.binding {
            Binding::Failed(e) => Some(e.clone()),
            _ => None,
        }
    }
}

/// An active message that arrived ([`Kind::Active`]), for the MPI layer's
/// [`ActiveMessageHandler`].
#[derive(Debug)]
pub struct ActiveMessage {
    /// The world rank that sent it.
    pub peer: PeerRank,
    /// The context id its sender gave it.
    pub context_id: u32,
    /// Its payload, unchecked: the handler decodes it (for a placed
    /// message, the data held back, [`Landing::Held`], else empty).
    pub payload: Vec<u8>,
    /// For a placed active message ([`FLAG_PLACED`]): what became of its
    /// data ([`Landing`]). `None` for a message for the handler.
    pub placed: Option<Placed>,
}

/// What became of the data of a placed active message, for the handler
/// (in [`ActiveMessage::placed`], in arrival order with the peer's other
/// active messages).
#[derive(Debug)]
pub struct Placed {
    /// The key its sender gave it (the header's receiver token).
    pub key: u64,
    /// Its length in bytes.
    pub len: usize,
    /// What became of its data.
    pub landing: Landing,
}

/// What became of the data of a placed active message, as its placer
/// said ([`Destination`]).
#[derive(Debug)]
pub enum Landing {
    /// Every byte landed where the placer said.
    InPlace,
    /// The placer held it back: it is the message's payload, for the
    /// handler to put where it belongs when its turn comes.
    Held,
    /// The placer refused it for this reason: it was dropped unread.
    Refused(Error),
}

/// Where the placer puts the data of a placed active message.
#[derive(Debug)]
pub enum Destination {
    /// At this address: the transport writes the data there, in order,
    /// possibly over several polls.
    At(*mut u8),
    /// Not yet (a one-sided put behind a lock request that is not
    /// granted): the data is read into a payload, as an ordinary active
    /// message's, and handed to the handler in arrival order
    /// ([`Landing::Held`]), which puts it where it belongs in its turn.
    Held,
    /// Nowhere, for this reason (a one-sided put outside its window):
    /// the data is dropped unread and the handler told.
    Refused(Error),
}

/// What the MPI layer gives the device to place the data of placed
/// active messages ([`FLAG_PLACED`]): asked when such a message's header
/// arrives, before a byte of its data is read, with the device locked,
/// from within a transport's poll (never while the handler runs: it is
/// handed the messages of a poll only once the transports are polled).
///
/// # Safety
/// A [`Destination::At`] must be valid for writes of the `len` bytes
/// asked for, and not read or written by anything else, for as long as
/// [`Device::placing_into`] says that data arrives into `context_id`
/// (the data of that message has landed once the handler hears of it,
/// or is abandoned if its peer fails).
pub unsafe trait ActivePlacer: Send {
    /// Where the `len` bytes of the placed active message from `peer` in
    /// `context_id` with `keys` (its key and bound, as
    /// [`Device::start_placed_send`] sent them) go, or why they are
    /// refused. `queued` are the active messages of `peer` in
    /// `context_id` that arrived before it and the handler has not been
    /// handed yet, in arrival order (a lock request sent with it, say):
    /// the handler gets them before this one. An error means the peer
    /// broke the protocol (it named something it cannot): the device
    /// fails that peer.
    fn place(
        &mut self,
        peer: PeerRank,
        context_id: u32,
        keys: (u64, u64),
        len: usize,
        queued: &mut dyn Iterator<Item = &ActiveMessage>,
    ) -> Result<Destination>;
}

/// What the MPI layer gives the device to handle active messages. The
/// device calls it from its progress engine with each message, in arrival
/// order per peer, with the device itself to send replies (not to poll).
pub trait ActiveMessageHandler: Send {
    /// Handles one message. An error means the peer broke the protocol:
    /// the device fails that peer (its VC keeps the error). The message
    /// is lent: its payload's buffer goes back to the device for the next
    /// one.
    fn handle(&mut self, device: &mut Device, message: &ActiveMessage) -> Result<()>;

    /// Every message that arrived in a poll has been handled: what the
    /// handler kept back to send with the answers to later ones (replies
    /// to several messages of one peer, in one message) leaves now. The
    /// default keeps nothing back.
    fn handled_all(&mut self, device: &mut Device) {
        let _ = device;
    }
}

/// How many bytes of payload buffers of handled active messages the
/// device keeps: a window of 64 one-sided puts of 32 KiB arrives in one
/// poll and is handled at its end, so each needs a buffer of its own;
/// with 4 kept, 60 of them were allocated and zeroed afresh (as much work
/// as the socket's copy).
const SPARE_PAYLOAD_BYTES: usize = 4 << 20;

/// Index of the self transport in `Device::transports`.
const SELF_TRANSPORT: usize = 0;
/// The most transports a device drives (one bit each in
/// `Core::polled_transports`); a build has four.
const MAX_TRANSPORTS: usize = 32;
/// Every this many turns (a power of two), [`Device::check_device`]
/// polls every transport, also those no VC uses (see
/// `Core::polled_transports`).
const FULL_TURN_EVERY: u32 = 64;
/// High bit of a [`PayloadSlot`] naming an arriving unexpected message
/// (the low bits are the peer) rather than a request token.
const ARRIVAL_SLOT: u64 = 1 << 63;
/// Bit of a [`PayloadSlot`] naming an arriving active message (the low
/// bits are the peer).
const ACTIVE_SLOT: u64 = 1 << 62;
/// Bit of a [`PayloadSlot`] naming an arriving placed active message's
/// data (the low bits are the peer).
const PLACED_SLOT: u64 = 1 << 61;

/// Packets to send once the transport that triggered them returns from poll.
enum Deferred {
    /// A header-only packet (CTS, SyncAck, CancelReply); if it cannot be
    /// sent, the request `fails` (a CTS's receive) fails.
    Packet {
        peer: PeerRank,
        header: Header,
        fails: Option<u64>,
    },
    /// A long send's data (or, by remote copy, its share), after its CTS.
    Data { token: u64 },
    /// A receive's remote copy out of the sender's buffer: its share after
    /// matching, or the sender's share too when the sender could not
    /// write it (`rest`).
    Pull { token: u64, rest: bool },
    /// `len` bytes of a receive's remote copy landed (a read the transport
    /// reported done): tell the sender (ReadDone) and count them.
    Landed { token: u64, len: usize },
    /// A remote-copy send is over: withdraw its buffer's offer.
    Withdraw { peer: PeerRank, key: u64 },
}

/// Bytes the receiver of a remote-copy rendezvous reads before it sends
/// its CTS: a read the system refuses (ptrace restrictions) then still
/// allows a plain CTS, and costs the sender only a page's copy of delay.
const FIRST_READ: usize = 4096;

/// Everything but the transports, so a transport can borrow it as its
/// [`PacketSink`] while the device borrows the transport.
struct Core {
    rank: PeerRank,
    vcs: Vec<Vc>,
    requests: Slab<Request>,
    /// Messages taken by matched probes, until their matched receives.
    matched: Slab<(Envelope, Unexpected)>,
    posted: PostedQueue,
    unexpected: UnexpectedQueue<Unexpected>,
    deferred: Vec<Deferred>,
    /// Eager limits of the transports, by index (read once at start: to
    /// choose a send's protocol and to judge eager packets).
    eager_limits: Vec<usize>,
    /// Largest messages the transports always send eagerly, by index
    /// ([`Transport::always_eager_limit`], read once at start).
    always_eager_limits: Vec<usize>,
    /// Whether the receiver of a remote-copy rendezvous reads all of it,
    /// by transport index ([`Transport::remote_reads_all`]).
    reads_all: Vec<bool>,
    /// Active messages that arrived, for the handler.
    active: VecDeque<ActiveMessage>,
    /// The MPI layer's placer of placed active messages' data; without
    /// one, such data is refused.
    placer: Option<Box<dyn ActivePlacer>>,
    /// Payload buffers of handled active messages, kept for the next
    /// ones (at most [`SPARE_PAYLOAD_BYTES`] of capacity in all, counted
    /// in `spare_bytes`): a buffer of 128 KiB or more from the allocator
    /// is a fresh mapping (glibc's threshold), which doubled the time of
    /// a 128 KiB get over TCP.
    spare_payloads: Vec<Vec<u8>>,
    /// The capacity of the buffers in `spare_payloads`.
    spare_bytes: usize,
    /// How many peers this process has lost ([`Device::lost_peers`]).
    lost_peers: usize,
    /// The blocking receive under way without a request, if any.
    direct: Direct,
    /// The transports polled in every turn, one bit per index: those
    /// chosen at initialize for some peer, and those a peer's packet
    /// bound its VC to. The others (TCP where every peer shares memory)
    /// only listen for connections, so a turn skips them but every
    /// [`FULL_TURN_EVERY`]th and the first after a sleep. The self
    /// transport is polled when it holds packets.
    polled_transports: u32,
}

/// The abstract device of one process: see the module documentation.
pub struct Device {
    core: Core,
    /// Index 0 is the self transport; the rest in order of preference.
    transports: Vec<Box<dyn Transport>>,
    /// The transport chosen for each peer whose VC is not bound yet.
    routes: Routes,
    pmi: Pmi,
    job: JobInfo,
    /// How this process's waits wait.
    wait: WaitPolicy,
    /// Threads between `prepare_sleep` and `end_sleep`; the transports'
    /// wake-ups stay armed while there are any.
    sleepers: usize,
    /// The MPI layer's handler of active messages; taken out while it
    /// runs. Without one, active messages wait.
    active_handler: Option<Box<dyn ActiveMessageHandler>>,
    /// Turns of [`Device::check_device`] so far, to know the full ones.
    turns: u32,
    /// The transports (a bit each) that hold back the packets of the
    /// answers being sent to a poll's active messages
    /// ([`Transport::begin_batch`]); zero outside that.
    batching: u32,
}

/// A transport with a one-sided channel, as [`Device::rdma_channel`]
/// found it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RdmaChannel(usize);

// SAFETY: the raw pointers in requests, in the direct receive and in the
// self transport refer to user buffers that the MPI layer keeps valid (and
// unaliased) until the request (or the direct receive) completes, whichever
// thread then drives the device; the device is
// only ever used through `&mut`, one thread at a time.
unsafe impl Send for Device {}

/// Environment variable: the job's secret, 64 hex digits (set by oxrun).
pub const SECRET_ENV: &str = "OXMPI_JOB_SECRET";
const SECRET_KEY: &str = "oxmpi-job-secret";

fn parse_secret(hex: &str) -> Result<[u8; 32]> {
    let bad = || {
        Error::new(
            ErrorClass::Arg,
            format!("{SECRET_ENV} must be 64 hexadecimal digits (it is set by oxrun); got {} characters", hex.len()),
        )
    };
    if hex.len() != 64 || !hex.is_ascii() {
        return Err(bad());
    }
    let mut secret = [0u8; 32];
    for (i, byte) in secret.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
    }
    Ok(secret)
}

fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Learns this process's place in the job and the job's secret.
///
/// The secret comes from `OXMPI_JOB_SECRET` when the launcher (oxrun) gave
/// one. Under another launcher (MPICH's hydra, Slurm) rank 0 draws one and
/// publishes it in the KVS, which only the job's members can read.
pub fn job_info(pmi: &mut Pmi) -> Result<JobInfo> {
    let (rank, size) = (pmi.rank(), pmi.size());
    let secret = match std::env::var(SECRET_ENV) {
        Ok(hex) => parse_secret(&hex)?,
        Err(_) if size == 1 => random_secret()?,
        Err(_) => {
            if rank == 0 {
                pmi.put(SECRET_KEY, &to_hex(&random_secret()?))?;
            }
            pmi.barrier()?;
            let hex = pmi.get(SECRET_KEY)?.ok_or_else(|| {
                Error::new(
                    ErrorClass::Other,
                    "rank 0 did not publish the job secret in the KVS",
                )
            })?;
            parse_secret(&hex)?
        }
    };
    Ok(JobInfo { rank, size, secret })
}

fn random_secret() -> Result<[u8; 32]> {
    let mut secret = [0u8; 32];
    getrandom::getrandom(&mut secret).map_err(|e| {
        Error::new(
            ErrorClass::Other,
            format!("cannot draw a job secret from the OS: {e}"),
        )
    })?;
    Ok(secret)
}

impl Device {
    /// Builds the device of this process: publishes each transport's
    /// business card and what it offers in the KVS, waits until every rank
    /// has (a PMI barrier), then chooses the transport to every peer
    /// (`select::Routes::plan`): a peer that none of `transports` can
    /// reach fails this call, naming it. `transports` are in order of
    /// preference.
    pub fn new(mut pmi: Pmi, job: JobInfo, transports: Vec<Box<dyn Transport>>) -> Result<Device> {
        if transports.len() >= MAX_TRANSPORTS {
            return Err(Error::new(
                ErrorClass::Intern,
                format!(
                    "{} transports given to the device, which drives at most {}",
                    transports.len(),
                    MAX_TRANSPORTS - 1
                ),
            ));
        }
        for t in &transports {
            pmi.put(&card_key(t.name(), job.rank), t.card())?;
        }
        let mut all: Vec<Box<dyn Transport>> = vec![Box::new(SelfTransport::new(job.rank))];
        all.extend(transports);
        if job.size > 1 {
            Routes::publish_offer(&mut pmi, job.rank, &all[SELF_TRANSPORT + 1..])?;
            pmi.barrier()?;
        }
        let routes = Routes::plan(&mut pmi, &job, &all, SELF_TRANSPORT + 1)?;
        let mut polled_transports = 0;
        for (peer, transport, card) in routes.planned() {
            all[transport].prepare_peer(peer, card)?;
            polled_transports |= 1 << transport;
        }
        let vcs = (0..job.size)
            .map(|_| Vc {
                binding: Binding::Unbound,
                send_sequence: 0,
                recv_sequence: 0,
                arriving: None,
                arriving_active: None,
                arriving_placed: None,
            })
            .collect();
        Ok(Device {
            core: Core {
                rank: job.rank,
                vcs,
                requests: Slab::default(),
                matched: Slab::default(),
                posted: PostedQueue::default(),
                unexpected: UnexpectedQueue::default(),
                deferred: Vec::new(),
                eager_limits: all.iter().map(|t| t.eager_limit()).collect(),
                always_eager_limits: all
                    .iter()
                    .map(|t| t.always_eager_limit().min(t.eager_limit()))
                    .collect(),
                reads_all: all.iter().map(|t| t.remote_reads_all()).collect(),
                active: VecDeque::new(),
                placer: None,
                spare_payloads: Vec::new(),
                spare_bytes: 0,
                lost_peers: 0,
                direct: Direct::Idle,
                polled_transports,
            },
            transports: all,
            routes,
            pmi,
            job,
            wait: WaitPolicy::from_env()?,
            sleepers: 0,
            active_handler: None,
            turns: 0,
            batching: 0,
        })
    }

    /// Installs the handler of active messages (the MPI layer's, once).
    pub fn set_active_message_handler(&mut self, handler: Box<dyn ActiveMessageHandler>) {
        self.active_handler = Some(handler);
    }

    /// Installs the placer of placed active messages' data (the MPI
    /// layer's, once).
    pub fn set_active_placer(&mut self, placer: Box<dyn ActivePlacer>) {
        self.core.placer = Some(placer);
    }

    /// Whether the data of a placed active message is arriving into
    /// memory that the placer named for `context_id`: while it is, that
    /// memory must stay (see [`ActivePlacer`]).
    pub fn placing_into(&self, context_id: u32) -> bool {
        self.core.vcs.iter().any(|vc| {
            vc.arriving_placed
                .as_ref()
                .is_some_and(|p| p.context_id == context_id)
        })
    }

    /// Sends the payload `parts` (one after another, at most
    /// [`MAX_ACTIVE_LEN`] bytes in all) to `peer` (world rank) as an
    /// active message in `context_id`. What cannot leave at once is
    /// copied: the message has left the parts once this returns. A
    /// transport that writes vectored sends each part from where it is
    /// (a put's data behind its header, with no copy into one buffer).
    pub fn send_active_message(
        &mut self,
        peer: PeerRank,
        context_id: u32,
        parts: &[&[u8]],
    ) -> Result<()> {
        let len: usize = parts.iter().map(|part| part.len()).sum();
        let mut header = self.active_header(context_id, len)?;
        let t = self.bind(peer)?;
        self.stamp(peer, &mut header);
        self.transports[t].send_parts(peer, &header, parts)
    }

    /// Starts sending the `len` bytes at `data` (at most
    /// [`MAX_ACTIVE_LEN`]) to `peer` as a placed active message
    /// ([`FLAG_PLACED`]) in `context_id`, without copying them: the
    /// peer's [`ActivePlacer`] names where they land from `key` and
    /// `bound` (two words it reads as it likes: a one-sided put's
    /// displacement, and where the whole put ends, so that its first
    /// piece is checked for all), and its handler hears that they did.
    /// It leaves after the active messages sent to `peer` before it. The
    /// request completes once the transport is done with `data` (or
    /// fails with the peer).
    ///
    /// # Safety
    /// `data` must be valid for reads of `len` bytes, and unmodified,
    /// until the request completes.
    pub unsafe fn start_placed_send(
        &mut self,
        peer: PeerRank,
        context_id: u32,
        (key, bound): (u64, u64),
        data: *const u8,
        len: usize,
    ) -> Result<RequestId> {
        let mut header = self.active_header(context_id, len)?;
        header.flags = FLAG_PLACED;
        header.receiver_token = key;
        header.sender_token = bound;
        let t = self.bind(peer)?;
        // SAFETY: the caller's guarantee, passed on.
        unsafe { self.start_zcopy_packet(t, peer, header, data, len) }
    }

    /// Sends the sequenced packet `header` with the `len` bytes at `data`
    /// as its payload to `peer` over transport `t`, without copying
    /// them; the request completes once the transport is done with
    /// `data` (or fails with the peer).
    ///
    /// # Safety
    /// As [`Device::start_placed_send`]'s.
    unsafe fn start_zcopy_packet(
        &mut self,
        t: usize,
        peer: PeerRank,
        mut header: Header,
        data: *const u8,
        len: usize,
    ) -> Result<RequestId> {
        let mut status = Status::empty();
        status.count = len;
        let token = self
            .core
            .requests
            .insert(Request::new(Some(peer), Phase::SendingData, status));
        self.stamp(peer, &mut header);
        // SAFETY: the caller keeps `data` valid and unmodified until the
        // request completes, which happens only on the transport's
        // completion (or failure) report for `token`.
        let sent = unsafe { self.transports[t].send_zcopy(peer, &header, data, len, token) };
        if let Err(e) = sent {
            self.core.requests.remove(token);
            return Err(e);
        }
        Ok(RequestId(token))
    }

    /// The header of an active message of `len` bytes in `context_id`
    /// from this rank; an error if it is longer than [`MAX_ACTIVE_LEN`].
    fn active_header(&self, context_id: u32, len: usize) -> Result<Header> {
        if len as u64 > MAX_ACTIVE_LEN {
            return Err(Error::new(
                ErrorClass::Intern,
                format!("an active message of {len} bytes exceeds the limit of {MAX_ACTIVE_LEN}"),
            ));
        }
        let mut header = Header::new(Kind::Active);
        header.context_id = context_id;
        header.source = self.job.rank as i32;
        header.message_len = len as u64;
        Ok(header)
    }

    /// Hands the active messages that arrived to the handler. The
    /// answers it sends are a batch ([`Transport::begin_batch`]): a
    /// window of gets answered in one poll leaves in a few writes, not
    /// one per get.
    fn deliver_active(&mut self) {
        let Some(mut handler) = self.active_handler.take() else {
            return;
        };
        self.begin_batches();
        while let Some(message) = self.core.active.pop_front() {
            let peer = message.peer;
            if let Err(e) = handler.handle(self, &message) {
                self.core.peer_failed(peer, e);
            }
            let capacity = message.payload.capacity();
            if self.core.spare_bytes + capacity <= SPARE_PAYLOAD_BYTES {
                self.core.spare_bytes += capacity;
                self.core.spare_payloads.push(message.payload);
            }
        }
        handler.handled_all(self);
        self.active_handler = Some(handler);
        self.end_batches();
    }

    /// Begins a batch ([`Transport::begin_batch`]) on every transport,
    /// noting in `batching` those that hold packets back.
    fn begin_batches(&mut self) {
        for (t, transport) in self.transports.iter_mut().enumerate() {
            if transport.begin_batch() {
                self.batching |= 1 << t;
            }
        }
    }

    /// Ends what [`Device::begin_batches`] began: the held packets leave.
    fn end_batches(&mut self) {
        while self.batching != 0 {
            let t = self.batching.trailing_zeros() as usize;
            self.batching &= self.batching - 1;
            self.transports[t].end_batch();
        }
    }

    /// How many peers this process has lost so far (it only grows): a
    /// layer that keeps state per peer, such as one-sided operations
    /// awaiting replies, compares it with the count it last saw and asks
    /// [`Device::peer_failure`] only when it grew.
    #[inline]
    pub fn lost_peers(&self) -> usize {
        self.core.lost_peers
    }

    /// Why `peer` (world rank) is lost, if it is.
    pub fn peer_failure(&self, peer: PeerRank) -> Option<Error> {
        self.core.vcs.get(peer).and_then(Vc::failure)
    }

    /// This process's rank in the job.
    pub fn rank(&self) -> PeerRank {
        self.job.rank
    }

    /// Number of processes in the job.
    pub fn size(&self) -> usize {
        self.job.size
    }

    /// Whether a transport named `name` runs in this process (e.g. `"shm"`
    /// where the shared-memory transport started).
    pub fn offers(&self, name: &str) -> bool {
        self.transports.iter().any(|t| t.name() == name)
    }

    /// The PMI client, for the MPI layer's own use of the KVS.
    pub fn pmi(&mut self) -> &mut Pmi {
        &mut self.pmi
    }

    /// The transport the VC to `peer` is bound to, binding it now if it is
    /// not yet (late binding).
    #[inline]
    fn bind(&mut self, peer: PeerRank) -> Result<usize> {
        // Every message but a peer's first finds its VC bound.
        if let Some(Vc {
            binding: Binding::Bound(t),
            ..
        }) = self.core.vcs.get(peer)
        {
            return Ok(*t);
        }
        self.bind_now(peer)
    }

    fn bind_now(&mut self, peer: PeerRank) -> Result<usize> {
        let vc = self.core.vcs.get(peer).ok_or_else(|| {
            Error::new(
                ErrorClass::Rank,
                format!(
                    "rank {peer} is not in this job of {} processes",
                    self.job.size
                ),
            )
        })?;
        match vc.binding {
            Binding::Bound(t) => return Ok(t),
            Binding::Arrived(t) => {
                let name = self.transports[t].name();
                let card = match self.routes.card_for(peer, t) {
                    Some(card) => Some(card.to_owned()),
                    // The peer prefers another transport than this rank.
                    None => self.pmi.get(&card_key(name, peer))?,
                };
                match card {
                    Some(card) => self.transports[t].add_peer(peer, &card)?,
                    // The peer reached us, so the VC works without it.
                    None => vlog!(
                        "rank {}: rank {peer} published no {name} card",
                        self.job.rank
                    ),
                }
                self.routes.take(peer);
                self.core.vcs[peer].binding = Binding::Bound(t);
                return Ok(t);
            }
            Binding::Failed(ref e) => return Err(e.clone()),
            Binding::Unbound => {}
        }
        if peer == self.job.rank {
            self.core.vcs[peer].binding = Binding::Bound(SELF_TRANSPORT);
            return Ok(SELF_TRANSPORT);
        }
        // Every other peer has a route: `Device::new` checked.
        let Some(route) = self.routes.take(peer) else {
            return Err(Error::new(
                ErrorClass::Intern,
                format!("no transport was chosen for rank {peer} at initialize"),
            ));
        };
        let index = route.transport;
        self.transports[index].add_peer(peer, &route.card)?;
        vlog!(
            "rank {}: VC to rank {peer} bound to {} ({})",
            self.job.rank,
            self.transports[index].name(),
            route.card
        );
        self.core.vcs[peer].binding = Binding::Bound(index);
        Ok(index)
    }

    fn stamp(&mut self, peer: PeerRank, header: &mut Header) {
        header.sequence = self.next_sequence(peer);
    }

    /// The sequence number of the next sequenced packet to `peer`.
    #[inline(always)]
    fn next_sequence(&mut self, peer: PeerRank) -> u32 {
        let vc = &mut self.core.vcs[peer];
        let sequence = vc.send_sequence;
        vc.send_sequence = sequence.wrapping_add(1);
        sequence
    }

    fn send_packet(&mut self, peer: PeerRank, mut header: Header, payload: &[u8]) -> Result<()> {
        let t = self.bind(peer)?;
        self.stamp(peer, &mut header);
        self.transports[t].send(peer, &header, payload)
    }

    /// Starts a send of `len` bytes at `buf` to `peer` (world rank) with
    /// `envelope`, choosing the protocol: eager up to the bound transport's
    /// limit, rendezvous beyond. A standard eager send is complete on
    /// return, and its id names no request (it needs none: taking its
    /// status, any number of times, gives its length); a `synchronous`
    /// one (`MPI_Ssend`) once the receiver reports the match; a
    /// rendezvous send once its data has left.
    ///
    /// # Safety
    /// `buf` must be valid for reads of `len` bytes and stay valid and
    /// unmodified until the request completes (is waited for or tested
    /// complete).
    #[inline]
    pub unsafe fn start_send(
        &mut self,
        peer: PeerRank,
        envelope: Envelope,
        buf: *const u8,
        len: usize,
        synchronous: bool,
    ) -> Result<RequestId> {
        if let Some(sent) = RequestId::complete(len).filter(|_| !synchronous) {
            // A standard eager send is complete once started: its id says
            // so without a request to make, look up and free.
            // SAFETY: the caller's guarantee, passed on.
            let started = unsafe { self.start_standard_send(peer, envelope, buf, len) }?;
            return Ok(started.unwrap_or(sent));
        }
        self.start_outbound(peer, envelope, Outbound::Raw(buf, len), synchronous)
    }

    /// Starts a ready send (MPI's ready mode) of `len` bytes at `buf` to
    /// `peer` with `envelope`: its receiver promises a matching receive
    /// posted before the message can arrive (a one-sided get's data,
    /// whose receive the origin posted before it asked). Beyond the
    /// transport's eager limit it is one eager packet with
    /// [`FLAG_READY`], whatever its length, sent from `buf` without a
    /// copy and read straight into the posted buffer: no RTS and CTS, a
    /// round trip fewer. Up to the limit, where the transport moves a
    /// rendezvous's data by remote copy (one copy in all), or while the
    /// transport still has data waiting to leave (a stream of them: the
    /// rendezvous's CTS going the other way keeps TCP from stalling on a
    /// one-way flow, and its data lanes from 1 MiB carry more), it is a
    /// standard send; but while the transport holds back the answers to
    /// a poll's active messages ([`Transport::begin_batch`]), one up to
    /// the limit is a zero-copy ready packet too, which it holds without
    /// a copy and writes with the others. The request completes once
    /// `buf` is free again. A receiver that finds no posted receive for
    /// a ready packet fails the sender, as a protocol error.
    ///
    /// # Safety
    /// As [`Device::start_send`]'s.
    pub unsafe fn start_ready_send(
        &mut self,
        peer: PeerRank,
        envelope: Envelope,
        buf: *const u8,
        len: usize,
    ) -> Result<RequestId> {
        let t = self.bind(peer)?;
        let transport = &self.transports[t];
        let standard = transport.offers_remote_copy(peer)
            || self.core.reads_all[t]
            || if len <= self.core.eager_limits[t] {
                self.batching & (1 << t) == 0
            } else {
                transport.has_pending_sends()
            };
        if standard {
            // SAFETY: the caller's guarantee, passed on.
            return unsafe { self.start_send(peer, envelope, buf, len, false) };
        }
        let mut header = Header::standard_eager(0, envelope, len);
        header.flags = FLAG_READY;
        // SAFETY: the caller's guarantee, passed on.
        unsafe { self.start_zcopy_packet(t, peer, header, buf, len) }
    }

    /// Starts a send as [`Device::start_send`] does, of data that is not
    /// contiguous in memory: `source` packs it. An eager message is packed
    /// whole into its packet; a rendezvous sends it in pieces of at most
    /// [`PIECE_LEN`] bytes, each packed into the request's one chunk just
    /// before it leaves. The device calls `source` only until the request
    /// completes, and drops it then.
    pub fn start_send_packed(
        &mut self,
        peer: PeerRank,
        envelope: Envelope,
        source: Box<dyn MessageSource>,
        synchronous: bool,
    ) -> Result<RequestId> {
        self.start_outbound(peer, envelope, Outbound::Packed(source), synchronous)
    }

    /// The protocol choice of every send: see [`Device::start_send`].
    /// A raw buffer must meet [`Device::start_send`]'s safety rule.
    fn start_outbound(
        &mut self,
        peer: PeerRank,
        envelope: Envelope,
        data: Outbound,
        synchronous: bool,
    ) -> Result<RequestId> {
        let t = self.bind(peer)?;
        let (buf, len, mut source) = match data {
            Outbound::Raw(buf, len) => (buf, len, None),
            Outbound::Packed(source) => {
                let len = source.len();
                (
                    std::ptr::NonNull::<u8>::dangling().as_ptr().cast_const(),
                    len,
                    Some(source),
                )
            }
        };
        let mut header = Header::standard_eager(0, envelope, len);
        if synchronous {
            header.flags = FLAG_SYNC;
        }
        let mut status = Status::empty();
        status.count = len;
        let eager = self.sends_eagerly(t, peer, len, source.is_none());
        let mut alone = false;
        let remote = if !eager && len > 0 && source.is_none() {
            // Asked before this send's own offer: is another under way?
            alone = !self.core.reads_all[t] && !self.transports[t].remote_copies_under_way(peer);
            // SAFETY: the caller of `start_send` keeps `buf` readable for
            // `len` bytes and unmodified until the request completes, and
            // the offer is withdrawn when it does (or the peer failed).
            unsafe { self.transports[t].remote_offer(peer, buf, len)? }
        } else {
            None
        };
        let phase = match (eager, synchronous) {
            (true, false) => Phase::Done,
            (true, true) => Phase::AwaitingAck,
            (false, _) => Phase::AwaitingCts {
                ptr: buf,
                len,
                remote,
            },
        };
        if let Some(key) = remote {
            header.flags |= FLAG_REMOTE;
            if alone {
                header.flags |= FLAG_ALONE;
            }
            header.address = buf as u64;
            // An RTS names no receive: the field carries the key.
            header.receiver_token = key;
        }
        let mut request = Request::new(Some(peer), phase, status);
        if !eager {
            request.stream = source.take().map(Stream::packing);
        }
        let token = self.core.requests.insert(request);
        if !eager || synchronous {
            // A standard eager packet carries no sender token: the
            // receiver never names the send (no acknowledgement, nothing
            // to cancel), and a packet without one fits a short cell.
            header.sender_token = token;
        }
        let sent = match (eager, source) {
            (true, Some(mut source)) => {
                // An eager message is short: packed whole into its packet.
                let mut packed = vec![0; len];
                source
                    .pack(0, &mut packed)
                    .and_then(|()| self.send_packet(peer, header, &packed))
            }
            // SAFETY: the caller of `start_send` guarantees `buf` is
            // readable for `len`.
            (true, None) => self.send_packet(peer, header, unsafe { payload(buf, len) }),
            (false, _) => {
                header.kind = Kind::Rts;
                self.send_packet(peer, header, &[])
            }
        };
        if let Err(e) = sent {
            self.core.requests.remove(token);
            if let Some(key) = remote {
                self.transports[t].remote_withdraw(peer, key);
            }
            return Err(e);
        }
        Ok(RequestId(token))
    }

    /// Starts a standard send (the start of `MPI_Send`) as
    /// [`Device::start_send`] does, but makes no request where none is
    /// needed: `None` when the send is complete on return (an eager
    /// message, which the transport has taken), else the request of the
    /// rendezvous to wait for. The blocking send's fast path: no request
    /// to make, look up and free for each short message.
    ///
    /// # Safety
    /// As for [`Device::start_send`].
    pub unsafe fn start_standard_send(
        &mut self,
        peer: PeerRank,
        envelope: Envelope,
        buf: *const u8,
        len: usize,
    ) -> Result<Option<RequestId>> {
        let t = self.bind(peer)?;
        if !self.sends_eagerly(t, peer, len, true) {
            return self
                .start_outbound(peer, envelope, Outbound::Raw(buf, len), false)
                .map(Some);
        }
        // No sender token: the receiver of a standard eager message never
        // names the send again (no acknowledgement, nothing to cancel).
        let sequence = self.next_sequence(peer);
        // SAFETY: the caller guarantees `buf` is readable for `len`.
        let data = unsafe { payload(buf, len) };
        self.transports[t].send_standard_eager(peer, sequence, envelope, data)?;
        Ok(None)
    }

    /// Whether a message of `len` bytes to `peer`, reached by transport
    /// `t`, is sent eagerly (else by rendezvous): see
    /// [`Transport::always_eager_limit`]. Data that is not `contiguous`
    /// never moves by remote copy.
    #[inline]
    fn sends_eagerly(&self, t: usize, peer: PeerRank, len: usize, contiguous: bool) -> bool {
        len <= self.core.always_eager_limits[t]
            || (len <= self.core.eager_limits[t]
                && (!contiguous
                    || !self.transports[t].offers_remote_copy(peer)
                    || self.transports[t].remote_copies_under_way(peer)))
    }

    /// A request that is complete from the start with `status` (an
    /// operation on `MPI_PROC_NULL`).
    pub fn completed_request(&mut self, status: Status) -> RequestId {
        RequestId(
            self.core
                .requests
                .insert(Request::new(None, Phase::Done, status)),
        )
    }

    /// A pending request that the layer above completes itself with
    /// [`Device::complete_generalized`] (as MPI's generalized requests): an
    /// operation made of others, such as a non-blocking collective, that
    /// the program waits for, tests and frees as any other request. The
    /// device never completes it, and cancelling it does nothing.
    pub fn start_generalized(&mut self) -> RequestId {
        RequestId(self.core.requests.insert(Request::new(
            None,
            Phase::Generalized,
            Status::empty(),
        )))
    }

    /// Completes the generalized request `request` with `error` (none: it
    /// succeeded). A request of another kind, or one already complete, is
    /// left as it is.
    pub fn complete_generalized(&mut self, request: RequestId, error: Option<Error>) {
        if let Some(r) = self.core.requests.get_mut(request.0) {
            if matches!(r.phase, Phase::Generalized) {
                r.status.error = error;
                r.phase = Phase::Done;
            }
        }
    }

    /// Posts a receive into `cap` bytes at `buf` for a message matching
    /// `pattern`. `peer` is the world rank of the pattern's source, `None`
    /// for any source. A receive that cannot be satisfied because its peer
    /// is lost completes with that error.
    ///
    /// # Safety
    /// `buf` must be valid for writes of `cap` bytes, not be read or written
    /// by anything else, and stay valid until the request completes.
    pub unsafe fn start_recv(
        &mut self,
        pattern: Pattern,
        peer: Option<PeerRank>,
        buf: *mut u8,
        cap: usize,
    ) -> Result<RequestId> {
        let request = Request {
            buf,
            cap,
            ..Request::new(peer, Phase::Posted, Status::empty())
        };
        Ok(self.post(pattern, peer, request))
    }

    /// Posts a receive as [`Device::start_recv`] does, of data that is not
    /// contiguous in memory: `sink` unpacks it, at most `sink.capacity()`
    /// bytes. An eager message is unpacked whole; a rendezvous asks the
    /// sender for pieces of at most [`PIECE_LEN`] bytes, each unpacked as
    /// it arrives from the request's one chunk. The device calls `sink`
    /// only until the request completes, and drops it then.
    pub fn start_recv_unpacked(
        &mut self,
        pattern: Pattern,
        peer: Option<PeerRank>,
        sink: Box<dyn MessageSink>,
    ) -> Result<RequestId> {
        let request = Self::unpacked_request(peer, sink);
        Ok(self.post(pattern, peer, request))
    }

    fn unpacked_request(peer: Option<PeerRank>, sink: Box<dyn MessageSink>) -> Request {
        Request {
            buf: std::ptr::NonNull::dangling().as_ptr(),
            cap: sink.capacity(),
            stream: Some(Stream::unpacking(sink)),
            ..Request::new(peer, Phase::Posted, Status::empty())
        }
    }

    /// Matches a new receive against the unexpected messages, or posts it.
    fn post(&mut self, pattern: Pattern, peer: Option<PeerRank>, request: Request) -> RequestId {
        let token = self.core.requests.insert(request);
        if let Some((envelope, message)) = self.core.unexpected.take_match(&pattern) {
            self.core.receive_unexpected(token, envelope, message);
            self.flush_deferred();
        } else if let Some(e) = peer.and_then(|p| self.core.vcs[p].failure()) {
            self.core.fail_token(token, e);
        } else {
            self.core.posted.push(pattern, token);
        }
        RequestId(token)
    }

    /// Starts a blocking receive (`MPI_Recv` into contiguous memory) that
    /// waits without a request: it takes its place among the posted
    /// receives (so matching order is kept) and a short message that
    /// matches it is copied into `buf` and completes it in place; see
    /// [`Device::direct_recv`]. False, with nothing started, when it
    /// cannot: another direct receive is under way (one at a time), a
    /// message that `pattern` accepts is already here, or the peer is
    /// lost; the caller then starts the receive with
    /// [`Device::start_recv`].
    ///
    /// # Safety
    /// As for [`Device::start_recv`], until the direct receive is over
    /// ([`DirectRecv::Done`], or [`Device::abandon_direct_recv`]) or has
    /// become a request, then until that request completes.
    pub unsafe fn start_direct_recv(
        &mut self,
        pattern: Pattern,
        peer: Option<PeerRank>,
        buf: *mut u8,
        cap: usize,
    ) -> bool {
        self.core.post_direct(pattern, peer, buf, cap)
    }

    /// Where the direct receive stands. `Done` and `Request` end it (the
    /// next [`Device::start_direct_recv`] may start another).
    #[inline]
    pub fn direct_recv(&mut self) -> DirectRecv {
        // Every turn of the wait asks: a pending one is left untouched.
        if matches!(self.core.direct, Direct::Posted { .. }) {
            return DirectRecv::Pending;
        }
        match std::mem::replace(&mut self.core.direct, Direct::Idle) {
            Direct::Done(status) => DirectRecv::Done(status),
            Direct::Request(token) => DirectRecv::Request(RequestId(token)),
            pending => {
                self.core.direct = pending;
                DirectRecv::Pending
            }
        }
    }

    /// Withdraws the direct receive whose wait ended without it (an
    /// error): its buffer is never written after this returns, unless it
    /// became a request that had already matched.
    pub fn abandon_direct_recv(&mut self) {
        match std::mem::replace(&mut self.core.direct, Direct::Idle) {
            Direct::Posted { .. } => {
                self.core.posted.remove(DIRECT_TOKEN);
            }
            Direct::Request(token) => self.cancel(RequestId(token)),
            Direct::Idle | Direct::Done(_) => {}
        }
    }

    /// A probe: the oldest unexpected message `pattern` accepts, if any.
    /// Does not make progress; see [`Device::check_device`].
    pub fn find_message(&self, pattern: &Pattern) -> Option<ProbeInfo> {
        self.core.unexpected.find(pattern).map(|(e, m)| ProbeInfo {
            source: e.source,
            tag: e.tag,
            len: m.len(),
        })
    }

    /// Cancels a receive that has not matched yet; a request that matched
    /// (or a send) is left to complete normally.
    pub fn cancel(&mut self, request: RequestId) {
        if self.core.posted.remove(request.0) {
            if let Some(r) = self.core.requests.get_mut(request.0) {
                r.status.cancelled = true;
                r.phase = Phase::Done;
            }
            return;
        }
        // A send the receiver has not matched yet (a rendezvous or a
        // synchronous one; a standard eager send is already complete):
        // ask the receiver to withdraw it. Its answer completes the send
        // as cancelled, or the send completes as usual.
        let Some(r) = self.core.requests.get_mut(request.0) else {
            return;
        };
        let (Phase::AwaitingCts { .. } | Phase::AwaitingAck, Some(peer), false) =
            (&r.phase, r.peer, r.status.cancel_asked)
        else {
            return;
        };
        r.status.cancel_asked = true;
        let mut header = Header::new(Kind::CancelSend);
        header.sender_token = request.0;
        if let Err(e) = self.send_packet(peer, header, &[]) {
            self.core.fail_token(request.0, e);
        }
    }

    /// A matched probe (`MPI_Mprobe` without waiting): takes the oldest
    /// unexpected message `pattern` accepts out of matching, so no other
    /// receive can have it, until [`Device::start_matched_recv`]. Does not
    /// make progress.
    pub fn take_message(&mut self, pattern: &Pattern) -> Option<(MessageId, ProbeInfo)> {
        let (envelope, message) = self.core.unexpected.take_match(pattern)?;
        let info = ProbeInfo {
            source: envelope.source,
            tag: envelope.tag,
            len: message.len(),
        };
        Some((
            MessageId(self.core.matched.insert((envelope, message))),
            info,
        ))
    }

    /// Receives the message a matched probe took (`MPI_Mrecv`) into `cap`
    /// bytes at `buf`.
    ///
    /// # Safety
    /// As for [`Device::start_recv`].
    pub unsafe fn start_matched_recv(
        &mut self,
        message: MessageId,
        buf: *mut u8,
        cap: usize,
    ) -> Result<RequestId> {
        let request = Request {
            buf,
            cap,
            ..Request::new(None, Phase::Posted, Status::empty())
        };
        self.receive_matched(message, request)
    }

    /// Receives the message a matched probe took as
    /// [`Device::start_matched_recv`] does, into `sink` as
    /// [`Device::start_recv_unpacked`] does.
    pub fn start_matched_recv_unpacked(
        &mut self,
        message: MessageId,
        sink: Box<dyn MessageSink>,
    ) -> Result<RequestId> {
        let request = Self::unpacked_request(None, sink);
        self.receive_matched(message, request)
    }

    fn receive_matched(&mut self, message: MessageId, mut request: Request) -> Result<RequestId> {
        let (envelope, message) = self.core.matched.remove(message.0).ok_or_else(|| {
            Error::new(
                ErrorClass::Request,
                "this matched message was already received",
            )
        })?;
        request.peer = message.peer();
        let token = self.core.requests.insert(request);
        self.core.receive_unexpected(token, envelope, message);
        self.flush_deferred();
        Ok(RequestId(token))
    }

    /// Whether `request` has completed. An unknown request counts as
    /// complete (its status was already taken).
    #[inline]
    pub fn is_complete(&self, request: RequestId) -> bool {
        self.core
            .requests
            .get(request.0)
            .is_none_or(|r| matches!(r.phase, Phase::Done))
    }

    /// Takes the status of a completed request and frees it. `None` if the
    /// request is not complete (it is left as it is).
    pub fn take_status(&mut self, request: RequestId) -> Option<Status> {
        if let Some(status) = request.complete_status() {
            return Some(status);
        }
        // Taken out alone, in one look-up: the request itself is dropped
        // where it lies.
        self.core.requests.take_with(request.0, |r| {
            matches!(r.phase, Phase::Done).then(|| r.status.take())
        })
    }

    /// Frees `request` if it is complete, dropping its status, and says
    /// whether it was: true also for a request whose status was already
    /// taken (as [`Device::is_complete`]), false for a pending one, which
    /// is left as it is. One look-up when the request is no longer held.
    #[inline]
    pub fn free_if_complete(&mut self, request: RequestId) -> bool {
        match self.core.requests.get(request.0) {
            None => true,
            Some(r) if matches!(r.phase, Phase::Done) => self.core.requests.discard(request.0),
            Some(_) => false,
        }
    }

    /// A copy of the status of a completed request, which stays held
    /// (`MPI_Request_get_status`): a later [`Device::take_status`] still
    /// returns it. `None` if the request is not complete or is unknown
    /// (already taken). Does not make progress.
    pub fn peek_status(&self, request: RequestId) -> Option<Status> {
        if let Some(status) = request.complete_status() {
            return Some(status);
        }
        let r = self.core.requests.get(request.0)?;
        matches!(r.phase, Phase::Done).then(|| r.status.to_status())
    }

    /// Number of requests the device holds (live or completed, not taken).
    pub fn outstanding(&self) -> usize {
        self.core.requests.len()
    }

    /// Makes progress until `done` holds.
    pub fn wait_until(&mut self, mut done: impl FnMut(&Device) -> bool) -> Result<()> {
        while !done(self) {
            self.check_device(true)?;
        }
        Ok(())
    }

    /// `MPID_Check_device`: polls the transports once (every turn those
    /// that VCs use, see `Core::polled_transports`); if `blocking` and
    /// nothing happened, keeps polling for the poll time
    /// (`OXMPI_SPIN_US`; yielding the processor between polls where the
    /// node is crowded), then sleeps in the kernel until a transport has
    /// work, and returns once something happened. Returns whether
    /// anything happened.
    ///
    /// A blocking call keeps the device to itself; a caller that shares the
    /// device between threads builds the same loop from
    /// `check_device(false)`, [`Device::idle`], [`Device::prepare_sleep`]
    /// and [`Device::end_sleep`], releasing the device while it sleeps.
    #[inline(always)]
    pub fn check_device(&mut self, blocking: bool) -> Result<bool> {
        // The non-blocking turn is every wait's spin: inline in the wait's
        // loop, with the poll of the transports, so that no frame is
        // built and torn down per turn; the blocking loop is apart.
        if self.poll_all()? {
            return Ok(true);
        }
        if !blocking {
            return Ok(false);
        }
        self.wait_for_progress()
    }

    /// The blocking part of [`Device::check_device`]: polls until
    /// something happens, as [`Device::idle`] says between polls.
    fn wait_for_progress(&mut self) -> Result<bool> {
        let mut idle = Idle::new();
        loop {
            if self.poll_all()? {
                return Ok(true);
            }
            match self.idle(&mut idle) {
                IdleStep::Spin => {}
                IdleStep::Yield => std::thread::yield_now(),
                IdleStep::Sleep => {
                    let mut sleep = self.prepare_sleep()?;
                    let slept = sleep.wait(SLEEP_AT_MOST);
                    self.end_sleep()?;
                    slept?;
                }
            }
        }
    }

    /// Counts one fruitless poll of a wait and says what the wait does
    /// next (see [`crate::wait`]): every wait of this process follows
    /// this one policy.
    #[inline]
    pub fn idle(&self, idle: &mut Idle) -> IdleStep {
        self.wait.step(idle)
    }

    /// Whether this node's ranks outnumber its cores (see
    /// [`WaitPolicy::crowded`]).
    pub fn crowded(&self) -> bool {
        self.wait.crowded()
    }

    /// Arms the transports' wake-ups (for the first sleeper) and returns
    /// what a sleep waits on. Every `prepare_sleep` must be followed by
    /// one [`Device::end_sleep`].
    pub fn prepare_sleep(&mut self) -> Result<Sleep> {
        let mut fds = Vec::with_capacity(self.transports.len());
        let mut must_poll = false;
        // The self transport is skipped: only this process feeds it, and a
        // thread that does so also polls it.
        for t in &mut self.transports[SELF_TRANSPORT + 1..] {
            match t.arm_wakeup()? {
                Some(fd) => fds.push(libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                }),
                None => must_poll = true,
            }
        }
        self.sleepers += 1;
        if must_poll {
            fds.clear();
        }
        Ok(Sleep::on(fds))
    }

    /// Ends a sleep begun with [`Device::prepare_sleep`]; the last sleeper
    /// disarms the transports' wake-ups.
    pub fn end_sleep(&mut self) -> Result<()> {
        // The descriptor that woke the sleep may be a transport that turns
        // skip (a connection to accept): the next turn polls them all.
        self.turns |= FULL_TURN_EVERY - 1;
        self.sleepers = self.sleepers.saturating_sub(1);
        if self.sleepers == 0 {
            for t in &mut self.transports[SELF_TRANSPORT + 1..] {
                t.disarm_wakeup()?;
            }
        }
        Ok(())
    }

    /// One turn: polls the transports of `Core::polled_transports` (all
    /// of them every [`FULL_TURN_EVERY`]th turn), the self transport when
    /// it holds packets, and hands active messages to their handler.
    #[inline(always)]
    fn poll_all(&mut self) -> Result<bool> {
        self.turns = self.turns.wrapping_add(1);
        let mut polled = if self.turns.is_multiple_of(FULL_TURN_EVERY) {
            u32::MAX >> (MAX_TRANSPORTS - self.transports.len())
        } else {
            self.core.polled_transports
        };
        // Only this process feeds the self transport: it has work only
        // when it holds packets, and most turns find it empty.
        if self.transports[SELF_TRANSPORT].has_pending_sends() {
            polled |= 1 << SELF_TRANSPORT;
        } else {
            polled &= !(1 << SELF_TRANSPORT);
        }
        let mut progressed = false;
        while polled != 0 {
            let index = polled.trailing_zeros() as usize;
            polled &= polled - 1;
            let mut sink = Sink {
                core: &mut self.core,
                transport: index,
            };
            progressed |= self.transports[index].poll(&mut sink)?;
            if !self.core.deferred.is_empty() {
                self.flush_deferred();
            }
        }
        if !self.core.active.is_empty() && self.active_handler.is_some() {
            self.deliver_active();
            progressed = true;
        }
        Ok(progressed)
    }

    /// Sends the replies that packet handling asked for. Several are a
    /// batch ([`Transport::begin_batch`]), ended here: the CTSs that
    /// answer a poll's RTSs (a window of large one-sided gets, whose data
    /// comes by rendezvous) leave in a few writes, not one each; a lone
    /// reply is sent at once. Inside a batch already under way (active
    /// messages being handled) the replies join it and leave at its end.
    fn flush_deferred(&mut self) {
        let batch = self.batching == 0 && self.core.deferred.len() > 1;
        if batch {
            self.begin_batches();
        }
        for action in std::mem::take(&mut self.core.deferred) {
            match action {
                Deferred::Packet {
                    peer,
                    header,
                    fails,
                } => {
                    if let Err(e) = self.send_packet(peer, header, &[]) {
                        match fails {
                            Some(token) => self.core.fail_token(token, e),
                            // The peer is lost; its failure reaches the
                            // requests that need it.
                            None => vlog!("rank {}: {e}", self.job.rank),
                        }
                    }
                }
                Deferred::Data { token } => {
                    if let Err(e) = self.send_data(token) {
                        self.core.fail_token(token, e);
                    }
                }
                Deferred::Pull { token, rest } => {
                    if let Err(e) = self.pull(token, rest) {
                        self.core.fail_token(token, e);
                    }
                }
                Deferred::Landed { token, len } => {
                    if let Err(e) = self.landed(token, len) {
                        self.core.fail_token(token, e);
                    }
                }
                Deferred::Withdraw { peer, key } => {
                    if let Ok(t) = self.bind(peer) {
                        self.transports[t].remote_withdraw(peer, key);
                    }
                }
            }
        }
        if batch {
            self.end_batches();
        }
    }

    /// The data of a long send, from the user's buffer, after its CTS.
    fn send_data(&mut self, token: u64) -> Result<()> {
        let Some(r) = self.core.requests.get_mut(token) else {
            return Ok(());
        };
        if let (Phase::CopyingOut(copy), Some(peer)) = (&r.phase, r.peer) {
            let CopyOut {
                ptr,
                accepted,
                receiver_token,
                address,
                ..
            } = **copy;
            return self.write_share(token, peer, ptr, accepted, receiver_token, address);
        }
        if matches!(r.phase, Phase::Streaming { .. }) {
            return self.send_piece(token);
        }
        let (
            Phase::Cleared {
                ptr,
                accepted,
                receiver_token,
            },
            Some(peer),
        ) = (&r.phase, r.peer)
        else {
            return Ok(());
        };
        let (ptr, accepted, receiver_token) = (*ptr, *accepted, *receiver_token);
        r.phase = Phase::SendingData;
        let t = self.bind(peer)?;
        let mut header = Header::new(Kind::Data);
        header.message_len = accepted as u64;
        header.receiver_token = receiver_token;
        // Not stamped: data packets are not sequenced, so the transport may
        // carry them on any of its connections to the peer.
        // SAFETY: `start_send`'s caller keeps the buffer valid and unmodified
        // until this request completes, which happens only on the
        // transport's completion (or failure) report for `token`.
        unsafe { self.transports[t].send_zcopy(peer, &header, ptr, accepted, token) }
    }

    /// The sender's share of a remote-copy rendezvous: the bytes beyond
    /// the receiver's share ([`read_share`]; none where the receiver
    /// reads all), written into the receiver's buffer at `address`,
    /// then reported with WriteDone (0 if the system refused the copy: the
    /// receiver then reads them).
    fn write_share(
        &mut self,
        token: u64,
        peer: PeerRank,
        ptr: *const u8,
        accepted: usize,
        receiver_token: u64,
        address: u64,
    ) -> Result<()> {
        let t = self.bind(peer)?;
        // A CTS with FLAG_REMOTE comes only for a split message, split
        // the same whether alone or not (`remote_split`).
        let split = read_share(self.core.reads_all[t], false, accepted);
        let share = accepted - split;
        if share == 0 {
            return Ok(());
        }
        // SAFETY: `start_send`'s caller keeps the buffer valid for `len`
        // bytes until the request completes, which needs this share;
        // `split + share == accepted <= len`. The remote address was
        // checked by `Header::decode` not to wrap.
        let written = unsafe {
            self.transports[t].remote_write(peer, ptr.add(split), address + split as u64, share)?
        };
        let mut header = Header::new(Kind::WriteDone);
        header.receiver_token = receiver_token;
        header.message_len = if written { share as u64 } else { 0 };
        self.send_packet(peer, header, &[])?;
        if written {
            self.core.count_copied_out(token, share);
        }
        Ok(())
    }

    /// The receiver's reads of a remote-copy rendezvous. First (`rest`
    /// false): a first page, which tells whether the system allows the
    /// copy at all (if not, a plain CTS asks for data packets), then the
    /// CTS, then the rest of this side's share. Later, if the sender could
    /// not write its share (`rest`), that share. Each read is reported to
    /// the sender with ReadDone, which frees its buffer once all is read.
    /// The next piece of a streamed send ([`Phase::Streaming`]), once the
    /// transport has finished with the last: packed into the request's
    /// chunk by its source, or straight from the contiguous buffer.
    fn send_piece(&mut self, token: u64) -> Result<()> {
        let Some(r) = self.core.requests.get_mut(token) else {
            return Ok(());
        };
        let (
            &mut Phase::Streaming {
                ptr,
                accepted,
                receiver_token,
                ref mut sent,
                ref mut in_flight,
            },
            Some(peer),
        ) = (&mut r.phase, r.peer)
        else {
            return Ok(());
        };
        if *in_flight || *sent >= accepted {
            return Ok(());
        }
        let offset = *sent;
        let n = (accepted - offset).min(PIECE_LEN);
        *sent += n;
        *in_flight = true;
        let from = match r.stream.as_deref_mut() {
            Some(Stream {
                source: Some(source),
                chunk,
                ..
            }) => {
                if chunk.len() < n {
                    // Once per send: the chunk never moves while the
                    // transport reads a piece from it.
                    *chunk = vec![0; accepted.min(PIECE_LEN)];
                }
                source.pack(offset, &mut chunk[..n])?;
                chunk.as_ptr()
            }
            // SAFETY: `offset + n <= accepted`, which does not exceed the
            // length of the buffer `start_send`'s caller gave.
            _ => unsafe { ptr.add(offset) },
        };
        let t = self.bind(peer)?;
        let mut header = Header::new(Kind::Data);
        header.flags = FLAG_PIECE;
        header.address = offset as u64;
        header.message_len = n as u64;
        header.receiver_token = receiver_token;
        // Not stamped, as every data packet. SAFETY: `from` is the user's
        // buffer, kept valid and unmodified by `start_send`'s caller until
        // the request completes, or the request's chunk, which is neither
        // written nor freed until the transport reports this piece complete
        // (or the peer failed, which fails the request).
        unsafe { self.transports[t].send_zcopy(peer, &header, from, n, token) }
    }

    fn pull(&mut self, token: u64, rest: bool) -> Result<()> {
        let Some(r) = self.core.requests.get_mut(token) else {
            return Ok(());
        };
        let (Phase::CopyingIn(copy), Some(peer)) = (&r.phase, r.peer) else {
            return Ok(());
        };
        let CopyIn {
            address,
            key,
            alone,
            sender_token,
            accepted,
            ..
        } = **copy;
        let buf = r.buf;
        let t = self.bind(peer)?;
        let split = read_share(self.core.reads_all[t], alone, accepted);
        let (from, to) = if rest { (split, accepted) } else { (0, split) };
        let mut at = from;
        // Bytes copied by this call; reads the transport carries on with
        // are reported (and counted) when they end.
        let mut landed = 0;
        if !rest {
            // A transport whose NIC reads knows at once whether it can
            // (registration), and needs no probe: one read takes it all.
            // Where the receiver reads the whole message anyway, the
            // sender has no share to start sooner: one read too, whose
            // refusal still allows a plain CTS (a first page and then the
            // rest had cost a system call and 0.3-0.5 us more at 8 KiB).
            let first = if self.core.reads_all[t] || split == accepted {
                split
            } else {
                split.min(FIRST_READ)
            };
            let read = if self.transports[t].offers_remote_copy(peer) {
                // SAFETY: `start_recv`'s caller gave a buffer writable for
                // `cap` bytes, unaliased until the request completes, which
                // needs this read to end; `first <= accepted <= cap`.
                unsafe {
                    self.transports[t].remote_read_start(peer, address, key, buf, first, token)?
                }
            } else {
                RemoteRead::Refused
            };
            if first == accepted && accepted > 0 {
                // All here (or coming, where the transport reads on, to be
                // reported when it lands): the sender needs no CTS, only
                // the ReadDone that frees its buffer and says how much was
                // taken (a packet less each way on the path of a message
                // read whole). A message alone never gets a CTS with
                // FLAG_REMOTE: its sender, which splits without the flag,
                // must not write a share.
                match read {
                    RemoteRead::Done => return self.landed(token, first),
                    RemoteRead::Started if alone => return Ok(()),
                    _ => {}
                }
            }
            let mut cts = Header::new(Kind::Cts);
            cts.message_len = accepted as u64;
            cts.sender_token = sender_token;
            cts.receiver_token = token;
            if read == RemoteRead::Refused {
                if let Some(r) = self.core.requests.get_mut(token) {
                    r.phase = Phase::AwaitingData {
                        accepted,
                        received: 0,
                    };
                }
                return self.send_packet(peer, cts, &[]);
            }
            cts.flags = FLAG_REMOTE;
            cts.address = buf as u64;
            self.send_packet(peer, cts, &[])?;
            if read == RemoteRead::Done {
                landed += first;
            }
            at = first;
        }
        if to > at {
            // SAFETY: as above, `at..to` lies within `accepted <= cap`; the
            // sender writes only beyond `split`, so no byte of this read
            // is written by the peer meanwhile.
            let read = unsafe {
                self.transports[t].remote_read_start(
                    peer,
                    address + at as u64,
                    key,
                    buf.add(at),
                    to - at,
                    token,
                )?
            };
            match read {
                RemoteRead::Done => landed += to - at,
                RemoteRead::Started => {}
                RemoteRead::Refused => {
                    return Err(Error::new(
                        ErrorClass::Other,
                        format!(
                            "the system refused a remote copy from rank {peer} in the middle of a message"
                        ),
                    ))
                }
            }
        }
        if landed > 0 {
            self.landed(token, landed)?;
        }
        Ok(())
    }

    /// `len` more bytes of the remote-copy receive `token` landed: the
    /// sender learns it with ReadDone (its buffer is free once all is
    /// read), and the receive completes once every byte is here.
    fn landed(&mut self, token: u64, len: usize) -> Result<()> {
        let Some(r) = self.core.requests.get_mut(token) else {
            return Ok(());
        };
        let (Phase::CopyingIn(copy), Some(peer)) = (&r.phase, r.peer) else {
            return Ok(());
        };
        let mut header = Header::new(Kind::ReadDone);
        header.sender_token = copy.sender_token;
        header.message_len = len as u64;
        self.send_packet(peer, header, &[])?;
        if let Some(r) = self.core.requests.get_mut(token) {
            count_copied_in(r, len);
        }
        Ok(())
    }

    /// The transport with a one-sided channel (see [`crate::transport`],
    /// "One-sided channel") that reaches every one of `peers` (world
    /// ranks other than this one), binding their VCs now; `None` when some
    /// peer is reached by a transport without one, or `peers` is empty.
    pub fn rdma_channel(&mut self, peers: &[PeerRank]) -> Result<Option<RdmaChannel>> {
        let mut channel = None;
        for &peer in peers {
            let t = self.bind(peer)?;
            if !self.transports[t].offers_rdma(peer) || channel.is_some_and(|c| c != t) {
                return Ok(None);
            }
            channel = Some(t);
        }
        Ok(channel.map(RdmaChannel))
    }

    /// The largest read or write one [`Device::rdma_post`] on `channel` takes.
    pub fn rdma_max_len(&self, channel: RdmaChannel) -> usize {
        self.transports[channel.0].rdma_max_len()
    }

    /// Registers memory on `channel` for its peers' one-sided operations
    /// ([`Transport::rdma_register`]).
    ///
    /// # Safety
    /// As [`Transport::rdma_register`]: the memory stays allocated until
    /// [`Device::rdma_deregister`] or finalize.
    pub unsafe fn rdma_register(
        &mut self,
        channel: RdmaChannel,
        addr: *mut u8,
        len: usize,
    ) -> Result<RdmaRegion> {
        // SAFETY: the caller's promise is the transport's contract.
        unsafe { self.transports[channel.0].rdma_register(addr, len) }
    }

    /// Revokes a registration of [`Device::rdma_register`].
    pub fn rdma_deregister(&mut self, channel: RdmaChannel, handle: u64) {
        self.transports[channel.0].rdma_deregister(handle);
    }

    /// Starts a one-sided operation on `peer`'s registered memory
    /// ([`Transport::rdma_post`]): `Ok(None)` asks to poll and post again.
    pub fn rdma_post(
        &mut self,
        peer: PeerRank,
        at: RdmaTarget,
        op: RdmaOp<'_>,
    ) -> Result<Option<u64>> {
        let t = self.rdma_transport(peer)?;
        self.transports[t].rdma_post(peer, at, op)
    }

    /// Starts one-sided operations on `peer`'s registered memory in order,
    /// as many as there is room for now, pushing their ids to `ids`
    /// ([`Transport::rdma_post_list`]: fewer than all asks to poll and
    /// post the rest again; on an error, those pushed are posted).
    pub fn rdma_post_list(
        &mut self,
        peer: PeerRank,
        ops: &[(RdmaTarget, RdmaOp<'_>)],
        ids: &mut Vec<u64>,
    ) -> Result<()> {
        let t = self.rdma_transport(peer)?;
        self.transports[t].rdma_post_list(peer, ops, ids)
    }

    /// The transport that reaches `peer` with a one-sided channel.
    fn rdma_transport(&mut self, peer: PeerRank) -> Result<usize> {
        let t = self.bind(peer)?;
        if !self.transports[t].offers_rdma(peer) {
            return Err(Error::new(
                ErrorClass::Intern,
                format!("rank {peer} is not reached by a transport with a one-sided channel"),
            ));
        }
        Ok(t)
    }

    /// The outcome of operation `id` on `channel` once it completed
    /// ([`Transport::rdma_take`]), even if its peer has failed since.
    pub fn rdma_take(&mut self, channel: RdmaChannel, id: u64) -> Option<Result<Vec<u8>>> {
        self.transports[channel.0].rdma_take(id)
    }

    /// Finalizes the device: lets every queued send leave, waits for all
    /// ranks (PMI barrier) and finalizes PMI. Connections close when the
    /// device is dropped.
    pub fn finalize(&mut self) -> Result<()> {
        self.wait_until(|d| d.transports.iter().all(|t| !t.has_pending_sends()))?;
        if self.job.size > 1 {
            self.pmi.barrier()?;
        }
        self.pmi.finalize()
    }

    /// Asks the process manager to end the whole job with `code`.
    pub fn abort(&mut self, code: i32, message: &str) -> Result<()> {
        self.pmi.abort(code, message)
    }
}

impl Core {
    /// `n` more bytes of the remote-copy send `token` are copied; it
    /// completes when all are, and its buffer's offer is withdrawn.
    fn count_copied_out(&mut self, token: u64, n: usize) {
        let Some(r) = self.requests.get_mut(token) else {
            return;
        };
        if let Phase::CopyingOut(copy) = &mut r.phase {
            copy.copied += n;
            if copy.copied == copy.accepted {
                let key = copy.key;
                r.phase = Phase::Done;
                if let Some(peer) = r.peer {
                    self.deferred.push(Deferred::Withdraw { peer, key });
                }
            }
        }
    }

    /// Fails the request `token` (if it is live) with `error`.
    fn fail_token(&mut self, token: u64, error: Error) {
        if let Some(r) = self.requests.get_mut(token) {
            r.fail(error);
        }
    }

    /// [`Device::start_direct_recv`]'s work (with its safety rule).
    fn post_direct(
        &mut self,
        pattern: Pattern,
        peer: Option<PeerRank>,
        buf: *mut u8,
        cap: usize,
    ) -> bool {
        let free = matches!(self.direct, Direct::Idle);
        let lost = peer.is_some_and(|p| {
            self.vcs
                .get(p)
                .is_none_or(|vc| matches!(vc.binding, Binding::Failed(_)))
        });
        if !free || lost || self.unexpected.find(&pattern).is_some() {
            return false;
        }
        self.direct = Direct::Posted { buf, cap, peer };
        self.posted.push(pattern, DIRECT_TOKEN);
        true
    }

    /// The request of the oldest posted receive that accepts `envelope`,
    /// taken out of the posted queue (the direct receive becomes a
    /// request if it is the one).
    fn take_posted(&mut self, envelope: &Envelope) -> Option<u64> {
        let token = self.posted.take_match(envelope)?;
        Some(self.claim(token))
    }

    /// The request a matched posted token names: the direct receive
    /// ([`DIRECT_TOKEN`]) becomes one now, for a message that needs it.
    fn claim(&mut self, token: u64) -> u64 {
        if token != DIRECT_TOKEN {
            return token;
        }
        let Direct::Posted { buf, cap, peer } = self.direct else {
            return token;
        };
        let token = self.requests.insert(Request {
            buf,
            cap,
            ..Request::new(peer, Phase::Posted, Status::empty())
        });
        self.direct = Direct::Request(token);
        token
    }

    /// Completes the direct receive with the whole eager message `data`
    /// with `envelope` (copied into its buffer, truncated to fit).
    fn complete_direct(&mut self, envelope: &Envelope, data: &[u8]) {
        let Direct::Posted { buf, cap, .. } = self.direct else {
            return;
        };
        let n = data.len().min(cap);
        // SAFETY: `start_direct_recv`'s caller gave a buffer writable for
        // `cap` bytes, unaliased until the receive completes; `n <= cap`,
        // and `data` is not in it.
        unsafe { copy_into(buf, data, n) };
        self.direct = Direct::Done(Status {
            source: envelope.source,
            tag: envelope.tag,
            count: n,
            cancelled: false,
            error: truncation(data.len(), cap, envelope),
        });
    }

    /// Completes the receive `token` with an unexpected message that matched.
    fn receive_unexpected(&mut self, token: u64, envelope: Envelope, message: Unexpected) {
        let Some(r) = self.requests.get_mut(token) else {
            return;
        };
        r.status.source = envelope.source;
        r.status.tag = envelope.tag;
        match message {
            Unexpected::Eager { data, sync } => {
                place_eager(r, &data);
                if let Some(sender) = sync {
                    self.acknowledge(sender);
                }
            }
            Unexpected::Rts {
                peer,
                sender_token,
                len,
                remote,
            } => {
                r.peer = Some(peer);
                self.accept_rts(token, peer, sender_token, len, remote);
            }
        }
    }

    /// A receive matched an RTS: answer with CTS saying how much fits, or,
    /// if the sender offers its buffer at `remote`, copy by remote memory
    /// copy once the poll returns ([`Device::pull`] sends the CTS).
    fn accept_rts(
        &mut self,
        token: u64,
        peer: PeerRank,
        sender_token: u64,
        len: usize,
        remote: Option<(u64, u64, bool)>,
    ) {
        let Some(r) = self.requests.get_mut(token) else {
            return;
        };
        let accepted = len.min(r.cap);
        r.message_len = len;
        // A receive with a sink takes the data in pieces, never by remote
        // copy into a buffer.
        let pieces = r.has_sink() && accepted > 0;
        if let Some((address, key, alone)) = remote.filter(|_| accepted > 0 && !pieces) {
            r.phase = Phase::CopyingIn(Box::new(CopyIn {
                address,
                key,
                alone,
                sender_token,
                accepted,
                copied: 0,
            }));
            self.deferred.push(Deferred::Pull { token, rest: false });
            return;
        }
        r.phase = Phase::AwaitingData {
            accepted,
            received: 0,
        };
        let mut header = Header::new(Kind::Cts);
        if pieces {
            header.flags = FLAG_PIECE;
            r.make_chunk(accepted.min(PIECE_LEN));
        }
        header.message_len = accepted as u64;
        header.sender_token = sender_token;
        header.receiver_token = token;
        self.deferred.push(Deferred::Packet {
            peer,
            header,
            fails: Some(token),
        });
    }

    /// Tells the sender of a synchronous eager message that it matched.
    fn acknowledge(&mut self, sender: SyncSender) {
        let mut header = Header::new(Kind::SyncAck);
        header.sender_token = sender.token;
        self.deferred.push(Deferred::Packet {
            peer: sender.peer,
            header,
            fails: None,
        });
    }

    /// The send `token` of `peer` that a SyncAck or CancelReply names, if
    /// it waits for one.
    fn awaiting_answer(&mut self, peer: PeerRank, token: u64) -> Option<&mut Request> {
        self.requests.get_mut(token).filter(|r| {
            r.peer == Some(peer)
                && matches!(r.phase, Phase::AwaitingAck | Phase::AwaitingCts { .. })
        })
    }

    /// Checks that a packet from `peer` may arrive over `transport` (the
    /// VC's binding, bound now if it was not) and, for a sequenced kind
    /// (`sequence`, its number), that it is the one due. Inline in every
    /// caller: every packet passes here, and a call's frame cost a third
    /// of it.
    #[inline(always)]
    fn admit(&mut self, transport: usize, peer: PeerRank, sequence: Option<u32>) -> Result<()> {
        let vc = self.vcs.get_mut(peer).ok_or_else(|| {
            Error::new(
                ErrorClass::Intern,
                format!("a transport delivered a packet from rank {peer}, which is not in the job"),
            )
        })?;
        match vc.binding {
            Binding::Unbound => {
                vc.binding = Binding::Arrived(transport);
                self.polled_transports |= 1 << transport;
            }
            Binding::Bound(t) | Binding::Arrived(t) if t == transport => {}
            Binding::Bound(_) | Binding::Arrived(_) => {
                return Err(protocol_error(
                    peer,
                    "packet arrived over a second transport",
                ))
            }
            Binding::Failed(ref e) => return Err(e.clone()),
        }
        if let Some(sequence) = sequence {
            if sequence != vc.recv_sequence {
                let expected = vc.recv_sequence;
                return Err(protocol_error(
                    peer,
                    format!("packet sequence {sequence} where {expected} was due"),
                ));
            }
            vc.recv_sequence = vc.recv_sequence.wrapping_add(1);
        }
        Ok(())
    }

    /// An eager message's header arrived (admitted), with its whole
    /// payload (`Some`) or with the payload still to come (`None`): the
    /// oldest posted receive it matches takes it (at once when the
    /// payload is here, else through the slot returned), or it joins the
    /// unexpected messages (at once, or once its payload has arrived).
    fn receive_eager(
        &mut self,
        transport: usize,
        peer: PeerRank,
        h: &Header,
        payload: Option<&[u8]>,
    ) -> Result<Option<PayloadSlot>> {
        let len = h.message_len as usize;
        let ready = h.flags & FLAG_READY != 0;
        if !ready {
            self.check_eager_len(transport, peer, len)?;
        }
        // An empty payload is whole from the start.
        let payload = payload.or((len == 0).then_some(&[][..]));
        let envelope = envelope_of(h);
        let sync = (h.flags & FLAG_SYNC != 0).then_some(SyncSender {
            peer,
            token: h.sender_token,
        });
        if let Some(data) = payload {
            if !ready {
                self.receive_whole_eager(peer, envelope, data, sync);
            } else if !self.place_whole_eager(peer, &envelope, data, sync) {
                return Err(unposted_ready(peer, len));
            }
            return Ok(None);
        }
        if let Some(token) = self.take_posted(&envelope) {
            if let Some(r) = self.requests.get_mut(token) {
                r.peer = Some(peer);
                r.status.source = h.source;
                r.status.tag = h.tag;
                r.message_len = len;
                r.phase = Phase::Arriving;
                // At most the eager limit, or a ready message its
                // receiver expected: unpacked whole.
                r.make_chunk(len.min(r.cap));
                if let Some(sender) = sync {
                    self.acknowledge(sender);
                }
                return Ok(Some(PayloadSlot(token)));
            }
        }
        if ready {
            return Err(unposted_ready(peer, len));
        }
        self.vcs[peer].arriving = Some((envelope, vec![0; len], sync));
        Ok(Some(PayloadSlot(ARRIVAL_SLOT | peer as u64)))
    }

    /// Fails an eager message of `len` bytes beyond the eager limit of
    /// `transport` (only a ready message may be longer).
    #[inline(always)]
    fn check_eager_len(&self, transport: usize, peer: PeerRank, len: usize) -> Result<()> {
        let limit = self.eager_limits[transport];
        if len > limit {
            return Err(over_eager_limit(peer, len, limit));
        }
        Ok(())
    }

    /// A whole eager message that is not a ready one, admitted: the
    /// oldest posted receive it matches takes it, else it joins the
    /// unexpected messages. Inline: the short path of every message
    /// (`PacketSink::on_standard_eager`) is this and the admission.
    #[inline(always)]
    fn receive_whole_eager(
        &mut self,
        peer: PeerRank,
        envelope: Envelope,
        data: &[u8],
        sync: Option<SyncSender>,
    ) {
        if !self.place_whole_eager(peer, &envelope, data, sync) {
            let data = data.to_vec();
            self.unexpected
                .push(envelope, Unexpected::Eager { data, sync });
        }
    }

    /// Places a whole eager message into the oldest posted receive it
    /// matches (the direct receive in place: it needs no request for
    /// it), completing that receive and acknowledging a synchronous
    /// sender; false, with nothing done, when no receive takes it.
    #[inline(always)]
    fn place_whole_eager(
        &mut self,
        peer: PeerRank,
        envelope: &Envelope,
        data: &[u8],
        sync: Option<SyncSender>,
    ) -> bool {
        match self.posted.take_match(envelope) {
            Some(DIRECT_TOKEN) => self.complete_direct(envelope, data),
            Some(token) => {
                let Some(r) = self.requests.get_mut(token) else {
                    return false;
                };
                r.peer = Some(peer);
                r.status.source = envelope.source;
                r.status.tag = envelope.tag;
                place_eager(r, data);
            }
            None => return false,
        }
        if let Some(sender) = sync {
            self.acknowledge(sender);
        }
        true
    }

    /// The header of a placed active message from `peer` arrived: asks
    /// the placer where its data goes, before a byte of it is read.
    fn place(&mut self, peer: PeerRank, h: &Header) -> Result<Option<PayloadSlot>> {
        // Decoding bounded the length by `MAX_ACTIVE_LEN`.
        let len = h.message_len as usize;
        let destination = match self.placer.as_mut() {
            Some(placer) => {
                let keys = (h.receiver_token, h.sender_token);
                let mut queued = self
                    .active
                    .iter()
                    .filter(|m| m.peer == peer && m.context_id == h.context_id);
                placer.place(peer, h.context_id, keys, len, &mut queued)?
            }
            None => Destination::Refused(Error::new(
                ErrorClass::Intern,
                "this rank has no placer for the data of active messages",
            )),
        };
        match destination {
            Destination::At(dest) if len > 0 => {
                self.vcs[peer].arriving_placed = Some(Placing {
                    context_id: h.context_id,
                    key: h.receiver_token,
                    dest,
                    len,
                });
                Ok(Some(PayloadSlot(PLACED_SLOT | peer as u64)))
            }
            Destination::At(_) => {
                let placed = Placed {
                    key: h.receiver_token,
                    len: 0,
                    landing: Landing::InPlace,
                };
                self.placed(peer, h.context_id, placed, Vec::new());
                Ok(None)
            }
            Destination::Held => {
                Ok(self.arrive_active(peer, h.context_id, len, Some(h.receiver_token)))
            }
            Destination::Refused(e) => {
                let placed = Placed {
                    key: h.receiver_token,
                    len,
                    landing: Landing::Refused(e),
                };
                self.placed(peer, h.context_id, placed, Vec::new());
                Ok(None)
            }
        }
    }

    /// An active message of `len` bytes from `peer` in `context_id`
    /// arrives (or the data of a placed one the placer `held`, with its
    /// key): the slot its payload is read into, or none if it is empty
    /// (then it is the handler's already).
    fn arrive_active(
        &mut self,
        peer: PeerRank,
        context_id: u32,
        len: usize,
        held: Option<u64>,
    ) -> Option<PayloadSlot> {
        if len == 0 {
            self.deliver_arrived(peer, context_id, Vec::new(), held);
            return None;
        }
        let payload = self.take_spare_payload(len);
        self.vcs[peer].arriving_active = Some(ArrivingActive {
            context_id,
            payload,
            held,
        });
        Some(PayloadSlot(ACTIVE_SLOT | peer as u64))
    }

    /// Queues a whole active message from `peer` for the handler: a
    /// message with `payload`, or the data of a placed one held back
    /// (`held`: its key).
    fn deliver_arrived(
        &mut self,
        peer: PeerRank,
        context_id: u32,
        payload: Vec<u8>,
        held: Option<u64>,
    ) {
        match held {
            Some(key) => {
                let placed = Placed {
                    key,
                    len: payload.len(),
                    landing: Landing::Held,
                };
                self.placed(peer, context_id, placed, payload);
            }
            None => self.active.push_back(ActiveMessage {
                peer,
                context_id,
                payload,
                placed: None,
            }),
        }
    }

    /// A payload buffer of `len` bytes for an arriving active message. A
    /// spare keeps its last message's length, so that no byte it had is
    /// zeroed again (the transport overwrites them all): only a longer
    /// message zeroes the rest. Zeroing each payload afresh had cost as
    /// much as the socket's copy. So the spare taken is the one whose
    /// length is nearest `len`: each byte of difference is a byte zeroed,
    /// now (a shorter spare) or by the next long message (a longer one,
    /// shortened). Taking any spare, a flush's short message after the
    /// pieces of a 512 KiB accumulate shortened one that the next piece
    /// zeroed again (callgrind at the target: 128 KiB per accumulate).
    fn take_spare_payload(&mut self, len: usize) -> Vec<u8> {
        let nearest = (0..self.spare_payloads.len())
            .min_by_key(|&k| self.spare_payloads[k].len().abs_diff(len));
        let mut payload = nearest.map_or_else(Vec::new, |k| self.spare_payloads.swap_remove(k));
        self.spare_bytes -= payload.capacity();
        payload.resize(len, 0);
        payload
    }

    /// Tells the handler what became of a placed active message's data
    /// (`payload`: the data held back, else empty).
    fn placed(&mut self, peer: PeerRank, context_id: u32, placed: Placed, payload: Vec<u8>) {
        self.active.push_back(ActiveMessage {
            peer,
            context_id,
            payload,
            placed: Some(placed),
        });
    }

    fn handle_header(
        &mut self,
        transport: usize,
        peer: PeerRank,
        h: &Header,
    ) -> Result<Option<PayloadSlot>> {
        self.admit(transport, peer, sequence_of(h))?;
        let envelope = envelope_of(h);
        match h.kind {
            Kind::Eager => self.receive_eager(transport, peer, h, None),
            Kind::Active if h.flags & FLAG_PLACED != 0 => self.place(peer, h),
            Kind::Active => {
                // Decoding bounded the length by `MAX_ACTIVE_LEN`.
                let len = h.message_len as usize;
                Ok(self.arrive_active(peer, h.context_id, len, None))
            }
            Kind::Rts => {
                let len = usize::try_from(h.message_len).map_err(|_| {
                    protocol_error(peer, "message longer than this machine's address space")
                })?;
                // An RTS's receiver-token field carries the key of the
                // offered buffer.
                let remote = (h.flags & FLAG_REMOTE != 0).then_some((
                    h.address,
                    h.receiver_token,
                    h.flags & FLAG_ALONE != 0,
                ));
                match self.take_posted(&envelope) {
                    Some(token) => {
                        if let Some(r) = self.requests.get_mut(token) {
                            r.peer = Some(peer);
                            r.status.source = h.source;
                            r.status.tag = h.tag;
                        }
                        self.accept_rts(token, peer, h.sender_token, len, remote);
                    }
                    None => self.unexpected.push(
                        envelope,
                        Unexpected::Rts {
                            peer,
                            sender_token: h.sender_token,
                            len,
                            remote,
                        },
                    ),
                }
                Ok(None)
            }
            Kind::Cts => {
                let token = h.sender_token;
                let copy = h.flags & FLAG_REMOTE != 0;
                let ok = self.requests.get(token).is_some_and(|r| {
                    r.peer == Some(peer)
                        && matches!(r.phase, Phase::AwaitingCts { len, remote, .. }
                            if h.message_len <= len as u64 && (remote.is_some() || !copy))
                });
                if !ok {
                    return Err(protocol_error(
                        peer,
                        format!(
                            "CTS for unknown send {token:#x} (or a remote copy it did not offer)"
                        ),
                    ));
                }
                if let Some(r) = self.requests.get_mut(token) {
                    if let Phase::AwaitingCts { ptr, remote, .. } = r.phase {
                        let accepted = h.message_len as usize;
                        // The send reports the count the receiver took.
                        r.status.count = accepted;
                        let pieces = h.flags & FLAG_PIECE != 0
                            || r.stream.as_ref().is_some_and(|s| s.source.is_some());
                        r.phase = if pieces && accepted > 0 {
                            Phase::Streaming {
                                ptr,
                                accepted,
                                receiver_token: h.receiver_token,
                                sent: 0,
                                in_flight: false,
                            }
                        } else if let Some(key) = remote.filter(|_| copy) {
                            Phase::CopyingOut(Box::new(CopyOut {
                                ptr,
                                accepted,
                                receiver_token: h.receiver_token,
                                address: h.address,
                                key,
                                copied: 0,
                            }))
                        } else {
                            Phase::Cleared {
                                ptr,
                                accepted,
                                receiver_token: h.receiver_token,
                            }
                        };
                        // The receiver takes the data in packets: the
                        // offered buffer is read by no one.
                        if let (Some(key), false) =
                            (remote, matches!(r.phase, Phase::CopyingOut(_)))
                        {
                            self.deferred.push(Deferred::Withdraw { peer, key });
                        }
                    }
                }
                self.deferred.push(Deferred::Data { token });
                Ok(None)
            }
            Kind::Data => {
                let token = h.receiver_token;
                let Some(r) = self
                    .requests
                    .get_mut(token)
                    .filter(|r| r.peer == Some(peer))
                else {
                    return Err(protocol_error(
                        peer,
                        format!("data for unknown receive {token:#x}"),
                    ));
                };
                let Phase::AwaitingData { accepted, received } = r.phase else {
                    return Err(protocol_error(
                        peer,
                        format!("data for receive {token:#x}, which awaits none"),
                    ));
                };
                if h.flags & FLAG_PIECE != 0 {
                    // Decoding bounded the piece (1 to PIECE_LEN bytes,
                    // ending within a message's length).
                    let (offset, len) = (h.address, h.message_len);
                    if offset != received as u64 || offset + len > accepted as u64 {
                        return Err(protocol_error(
                            peer,
                            format!(
                                "piece of {len} bytes at offset {offset} for receive \
                                 {token:#x}, which has {received} of {accepted} bytes"
                            ),
                        ));
                    }
                    r.phase = Phase::ArrivingPiece {
                        accepted,
                        offset: received,
                        len: len as usize,
                    };
                    return Ok(Some(PayloadSlot(token)));
                }
                if received != 0
                    || accepted as u64 != h.message_len
                    || (r.has_sink() && accepted > 0)
                {
                    return Err(protocol_error(
                        peer,
                        format!(
                            "{} bytes of data in one packet for receive {token:#x}, which \
                             accepted {accepted} (in pieces: {})",
                            h.message_len,
                            r.has_sink()
                        ),
                    ));
                }
                if h.message_len == 0 {
                    finish_receive(r, 0);
                    return Ok(None);
                }
                r.phase = Phase::Arriving;
                Ok(Some(PayloadSlot(token)))
            }
            Kind::WriteDone => {
                let token = h.receiver_token;
                let written = h.message_len;
                let reads_all = self.reads_all[transport];
                let Some(r) = self
                    .requests
                    .get_mut(token)
                    .filter(|r| r.peer == Some(peer))
                else {
                    return Err(protocol_error(
                        peer,
                        format!("copy report for unknown receive {token:#x}"),
                    ));
                };
                let Phase::CopyingIn(copy) = &r.phase else {
                    return Err(protocol_error(
                        peer,
                        format!("copy report for receive {token:#x}, which copies nothing"),
                    ));
                };
                let accepted = copy.accepted;
                let share = (accepted - read_share(reads_all, copy.alone, accepted)) as u64;
                if share == 0 || (written != share && written != 0) {
                    return Err(protocol_error(
                        peer,
                        format!("it reports {written} bytes written of a share of {share}"),
                    ));
                }
                if written == 0 {
                    self.deferred.push(Deferred::Pull { token, rest: true });
                } else {
                    count_copied_in(r, share as usize);
                }
                Ok(None)
            }
            Kind::ReadDone => {
                let token = h.sender_token;
                let read = h.message_len;
                let Some(r) = self
                    .requests
                    .get_mut(token)
                    .filter(|r| r.peer == Some(peer))
                else {
                    return Err(protocol_error(
                        peer,
                        format!("copy report for unknown send {token:#x}"),
                    ));
                };
                // A receiver that read the whole message before answering
                // sent no CTS: this report says how many bytes it took.
                if let Phase::AwaitingCts {
                    len,
                    remote: Some(key),
                    ..
                } = r.phase
                {
                    if read == 0 || read > len as u64 {
                        return Err(protocol_error(
                            peer,
                            format!("it reports {read} bytes read of a send of {len}"),
                        ));
                    }
                    r.status.count = read as usize;
                    r.phase = Phase::Done;
                    self.deferred.push(Deferred::Withdraw { peer, key });
                    return Ok(None);
                }
                let Phase::CopyingOut(copy) = &r.phase else {
                    return Err(protocol_error(
                        peer,
                        format!("copy report for send {token:#x}, which it is not copying"),
                    ));
                };
                let left = copy.accepted - copy.copied;
                if read == 0 || read > left as u64 {
                    return Err(protocol_error(
                        peer,
                        format!("it reports {read} bytes read of a send with {left} left"),
                    ));
                }
                self.count_copied_out(token, read as usize);
                Ok(None)
            }
            Kind::SyncAck => {
                let token = h.sender_token;
                match self.awaiting_answer(peer, token) {
                    Some(r) if matches!(r.phase, Phase::AwaitingAck) => r.phase = Phase::Done,
                    _ => {
                        return Err(protocol_error(
                            peer,
                            format!("match report for unknown synchronous send {token:#x}"),
                        ))
                    }
                }
                Ok(None)
            }
            Kind::CancelSend => {
                let token = h.sender_token;
                let withdrawn = self
                    .unexpected
                    .take_first(|_, m| m.sent_as(peer, token))
                    .is_some();
                let mut reply = Header::new(Kind::CancelReply);
                reply.sender_token = token;
                reply.message_len = u64::from(withdrawn);
                self.deferred.push(Deferred::Packet {
                    peer,
                    header: reply,
                    fails: None,
                });
                Ok(None)
            }
            Kind::CancelReply => {
                let token = h.sender_token;
                if h.message_len == 0 {
                    // A receive matched first: the send completes as usual.
                    return Ok(None);
                }
                match self.awaiting_answer(peer, token) {
                    Some(r) if r.status.cancel_asked => {
                        r.status.cancelled = true;
                        r.status.count = 0;
                        let offered = match r.phase {
                            Phase::AwaitingCts { remote, .. } => remote,
                            _ => None,
                        };
                        r.phase = Phase::Done;
                        if let Some(key) = offered {
                            self.deferred.push(Deferred::Withdraw { peer, key });
                        }
                    }
                    _ => {
                        return Err(protocol_error(
                            peer,
                            format!("cancelled a send {token:#x} that asked for no cancel"),
                        ))
                    }
                }
                Ok(None)
            }
        }
    }

    fn peer_failed(&mut self, peer: PeerRank, error: Error) {
        let Some(vc) = self.vcs.get_mut(peer) else {
            return;
        };
        if matches!(vc.binding, Binding::Failed(_)) {
            return;
        }
        vlog!("rank {}: {error}", self.rank);
        vc.binding = Binding::Failed(error.clone());
        self.lost_peers += 1;
        vc.arriving = None;
        vc.arriving_active = None;
        vc.arriving_placed = None;
        self.active.retain(|m| m.peer != peer);
        let requests = &self.requests;
        let doomed = self
            .posted
            .drain_where(|t| requests.get(t).is_some_and(|r| r.peer == Some(peer)));
        for t in doomed {
            self.fail_token(t, error.clone());
        }
        if let Direct::Posted { peer: Some(p), .. } = self.direct {
            if p == peer {
                self.posted.remove(DIRECT_TOKEN);
                self.direct = Direct::Done(Status {
                    error: Some(error.clone()),
                    ..Status::empty()
                });
            }
        }
        for (_, r) in self.requests.iter_mut() {
            let active = !matches!(r.phase, Phase::Done | Phase::Posted);
            if active && r.peer == Some(peer) {
                r.fail(error.clone());
            }
        }
    }
}

/// The error of an eager message of `len` bytes beyond the eager limit.
#[cold]
fn over_eager_limit(peer: PeerRank, len: usize, limit: usize) -> Error {
    protocol_error(
        peer,
        format!("eager message of {len} bytes exceeds the limit of {limit}"),
    )
}

/// The error of a ready message of `len` bytes that found no receive.
#[cold]
fn unposted_ready(peer: PeerRank, len: usize) -> Error {
    protocol_error(
        peer,
        format!("a ready message of {len} bytes found no receive posted for it"),
    )
}

/// The sequence number of a packet of a sequenced kind, for
/// [`Core::admit`].
#[inline(always)]
fn sequence_of(h: &Header) -> Option<u32> {
    h.kind.is_sequenced().then_some(h.sequence)
}

/// What a packet's header says of its message for matching.
fn envelope_of(h: &Header) -> Envelope {
    Envelope {
        context_id: h.context_id,
        source: h.source,
        tag: h.tag,
    }
}

/// The `len` bytes at `buf` as a slice (empty for 0, whatever `buf` is).
///
/// # Safety
/// `buf` must be readable for `len` bytes while the slice lives.
unsafe fn payload<'a>(buf: *const u8, len: usize) -> &'a [u8] {
    if len == 0 {
        return &[];
    }
    // SAFETY: the caller's guarantee.
    unsafe { std::slice::from_raw_parts(buf, len) }
}

/// Bytes of a remote-copy rendezvous of `accepted` bytes that the
/// receiver reads, from the start of the sender's buffer: all over a
/// transport whose NIC moves them (`reads_all`, see
/// [`Transport::remote_reads_all`]), else [`remote_split`]'s share (the
/// sender writes the rest).
fn read_share(reads_all: bool, alone: bool, accepted: usize) -> usize {
    if reads_all {
        accepted
    } else {
        remote_split(accepted, alone)
    }
}

/// The error of a peer that sent what the protocol does not allow.
fn protocol_error(peer: PeerRank, what: impl std::fmt::Display) -> Error {
    Error::new(
        ErrorClass::ProcFailed,
        format!("rank {peer} broke the protocol: {what}"),
    )
}

/// Completes the receive `r` with the whole eager message `data`: what
/// fits goes into its buffer (or through its unpacker), and a longer
/// message is a truncation error.
fn place_eager(r: &mut Request, data: &[u8]) {
    r.message_len = data.len();
    let n = data.len().min(r.cap);
    let placed = match r.stream.as_mut().and_then(|s| s.sink.as_mut()) {
        Some(sink) if n > 0 => sink.unpack(0, &data[..n]),
        _ => {
            // SAFETY: `start_recv`'s caller gave a buffer writable for
            // `cap` bytes, unaliased until the request completes;
            // `n <= cap`, and `data` is not in it.
            unsafe { copy_into(r.buf, data, n) };
            Ok(())
        }
    };
    match placed {
        Ok(()) => finish_receive(r, n),
        Err(e) => r.fail(e),
    }
}

/// `n` more bytes of a remote-copy receive landed; it completes once
/// every accepted byte has.
fn count_copied_in(r: &mut Request, n: usize) {
    if let Phase::CopyingIn(copy) = &mut r.phase {
        copy.copied += n;
        if copy.copied == copy.accepted {
            let accepted = copy.accepted;
            finish_receive(r, accepted);
        }
    }
}

/// Marks a receive complete with `placed` bytes in its buffer, judging
/// truncation against the matched message's length.
fn finish_receive(r: &mut Request, placed: usize) {
    r.status.count = placed;
    if r.message_len > r.cap {
        let envelope = Envelope {
            context_id: 0,
            source: r.status.source,
            tag: r.status.tag,
        };
        r.status.error = truncation(r.message_len, r.cap, &envelope);
    }
    r.done();
}

/// The error of a receive of `cap` bytes that matched a message of `len`
/// bytes with `envelope`, if it does not fit.
#[inline]
fn truncation(len: usize, cap: usize, envelope: &Envelope) -> Option<Error> {
    (len > cap).then(|| truncated(len, cap, envelope))
}

/// The error of a truncated receive (see [`truncation`]), built out of
/// line: every receive asks, few are truncated.
#[cold]
fn truncated(len: usize, cap: usize, envelope: &Envelope) -> Error {
    Error::new(
        ErrorClass::Truncate,
        format!(
            "message of {len} bytes from rank {} (tag {}) does not fit the receive buffer of {cap} bytes",
            envelope.source, envelope.tag
        ),
    )
}

/// Copies the first `n` bytes of `data` to `buf` (nothing when `n` is 0,
/// whatever `buf` is).
///
/// # Safety
/// `buf` must be valid for writes of `n` bytes, not overlap `data`, and
/// `n <= data.len()`.
unsafe fn copy_into(buf: *mut u8, data: &[u8], n: usize) {
    debug_assert!(n <= data.len());
    if n > 0 {
        // SAFETY: the caller's guarantee.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), buf, n) };
    }
}

/// The [`PacketSink`] a transport reports to: the core, plus which
/// transport is reporting.
struct Sink<'a> {
    core: &'a mut Core,
    transport: usize,
}

impl Sink<'_> {
    /// The VC of the peer that a payload slot marked with `bit` names
    /// (its low bits are the peer).
    fn slot_vc(&mut self, slot: PayloadSlot, bit: u64) -> Option<&mut Vc> {
        self.core.vcs.get_mut((slot.0 & !bit) as usize)
    }
}

impl PacketSink for Sink<'_> {
    fn on_header(&mut self, peer: PeerRank, header: &Header) -> Result<Option<PayloadSlot>> {
        self.core.handle_header(self.transport, peer, header)
    }

    fn on_packet(&mut self, peer: PeerRank, header: &Header, payload: &[u8]) -> Result<()> {
        if header.kind != Kind::Eager {
            return deliver_in_steps(self, peer, header, payload);
        }
        if payload.len() as u64 != header.message_len {
            return Err(protocol_error(
                peer,
                format!(
                    "an eager packet of {} bytes carries {}",
                    header.message_len,
                    payload.len()
                ),
            ));
        }
        self.core.admit(self.transport, peer, sequence_of(header))?;
        self.core
            .receive_eager(self.transport, peer, header, Some(payload))
            .map(drop)
    }

    fn on_standard_eager(
        &mut self,
        peer: PeerRank,
        sequence: u32,
        envelope: Envelope,
        payload: &[u8],
    ) -> Result<()> {
        // `on_packet` of the header these parts make, less what that
        // header cannot say: no other kind, no flags, no tokens.
        self.core.admit(self.transport, peer, Some(sequence))?;
        self.core
            .check_eager_len(self.transport, peer, payload.len())?;
        self.core.receive_whole_eager(peer, envelope, payload, None);
        Ok(())
    }

    fn payload_buffer(&mut self, slot: PayloadSlot) -> &mut [u8] {
        if slot.0 & PLACED_SLOT != 0 {
            return match self
                .slot_vc(slot, PLACED_SLOT)
                .and_then(|vc| vc.arriving_placed.as_ref())
            {
                // SAFETY: the placer named `len` bytes at `dest`, valid for
                // writes and touched by nothing else while the data arrives
                // (`ActivePlacer`'s contract); this is the only slice of
                // them, lent to the transport for this call.
                Some(p) => unsafe { std::slice::from_raw_parts_mut(p.dest, p.len) },
                None => &mut [],
            };
        }
        if slot.0 & ACTIVE_SLOT != 0 {
            return match self
                .slot_vc(slot, ACTIVE_SLOT)
                .and_then(|vc| vc.arriving_active.as_mut())
            {
                Some(arriving) => &mut arriving.payload,
                None => &mut [],
            };
        }
        if slot.0 & ARRIVAL_SLOT != 0 {
            return match self
                .slot_vc(slot, ARRIVAL_SLOT)
                .and_then(|vc| vc.arriving.as_mut())
            {
                Some((_, data, _)) => data,
                None => &mut [],
            };
        }
        match self.core.requests.get_mut(slot.0) {
            Some(r) if r.has_sink() => {
                let wanted = match r.phase {
                    Phase::Arriving => r.cap.min(r.message_len),
                    Phase::ArrivingPiece { len, .. } => len,
                    _ => 0,
                };
                match r.stream.as_deref_mut() {
                    Some(Stream { chunk, .. }) => {
                        let n = wanted.min(chunk.len());
                        &mut chunk[..n]
                    }
                    None => &mut [],
                }
            }
            Some(r) if matches!(r.phase, Phase::ArrivingPiece { .. }) => {
                let Phase::ArrivingPiece {
                    accepted,
                    offset,
                    len,
                } = r.phase
                else {
                    return &mut [];
                };
                if offset + len > accepted.min(r.cap) {
                    return &mut [];
                }
                // SAFETY: `start_recv`'s caller gave a buffer writable for
                // `cap` bytes, unaliased until the request completes; the
                // piece ends within `accepted <= cap` (checked above, and
                // when its header arrived).
                unsafe { std::slice::from_raw_parts_mut(r.buf.add(offset), len) }
            }
            Some(r) if matches!(r.phase, Phase::Arriving) => {
                let n = r.cap.min(r.message_len);
                if n == 0 {
                    return &mut [];
                }
                // SAFETY: `start_recv`'s caller gave a buffer writable for
                // `cap` bytes, unaliased until the request completes; `n`
                // does not exceed `cap`.
                unsafe { std::slice::from_raw_parts_mut(r.buf, n) }
            }
            _ => &mut [],
        }
    }

    fn on_payload(&mut self, peer: PeerRank, slot: PayloadSlot) {
        if slot.0 & PLACED_SLOT != 0 {
            if let Some(p) = self
                .core
                .vcs
                .get_mut(peer)
                .and_then(|vc| vc.arriving_placed.take())
            {
                let landed = Placed {
                    key: p.key,
                    len: p.len,
                    landing: Landing::InPlace,
                };
                self.core.placed(peer, p.context_id, landed, Vec::new());
            }
            return;
        }
        if slot.0 & ACTIVE_SLOT != 0 {
            if let Some(arriving) = self
                .core
                .vcs
                .get_mut(peer)
                .and_then(|vc| vc.arriving_active.take())
            {
                let ArrivingActive {
                    context_id,
                    payload,
                    held,
                } = arriving;
                self.core.deliver_arrived(peer, context_id, payload, held);
            }
            return;
        }
        if slot.0 & ARRIVAL_SLOT != 0 {
            let Some((envelope, data, sync)) = self
                .core
                .vcs
                .get_mut(peer)
                .and_then(|vc| vc.arriving.take())
            else {
                return;
            };
            let message = Unexpected::Eager { data, sync };
            // A receive may have been posted while the payload arrived.
            match self.core.take_posted(&envelope) {
                Some(token) => {
                    if let Some(r) = self.core.requests.get_mut(token) {
                        r.peer = Some(peer);
                    }
                    self.core.receive_unexpected(token, envelope, message);
                }
                None => self.core.unexpected.push(envelope, message),
            }
            return;
        }
        let Some(r) = self.core.requests.get_mut(slot.0) else {
            return;
        };
        match r.phase {
            Phase::Arriving => {
                let placed = r.cap.min(r.message_len);
                match r.unpack_chunk(0, placed) {
                    Ok(()) => finish_receive(r, placed),
                    Err(e) => r.fail(e),
                }
            }
            Phase::ArrivingPiece {
                accepted,
                offset,
                len,
            } => {
                if let Err(e) = r.unpack_chunk(offset, len) {
                    r.fail(e);
                    return;
                }
                let received = offset + len;
                if received == accepted {
                    finish_receive(r, accepted);
                } else {
                    r.phase = Phase::AwaitingData { accepted, received };
                }
            }
            _ => {}
        }
    }

    fn on_send_complete(&mut self, token: u64) {
        let Some(r) = self.core.requests.get_mut(token) else {
            return;
        };
        match r.phase {
            Phase::SendingData => r.done(),
            Phase::Streaming {
                accepted,
                sent,
                ref mut in_flight,
                ..
            } => {
                *in_flight = false;
                if sent == accepted {
                    r.done();
                } else {
                    // The next piece, once the poll returns.
                    self.core.deferred.push(Deferred::Data { token });
                }
            }
            _ => {}
        }
    }

    fn on_remote_read(&mut self, peer: PeerRank, token: u64, outcome: Result<usize>) {
        let reading = self
            .core
            .requests
            .get(token)
            .is_some_and(|r| r.peer == Some(peer) && matches!(r.phase, Phase::CopyingIn(_)));
        if !reading {
            // The receive failed (its peer did) or completed already.
            return;
        }
        match outcome {
            Ok(len) => self.core.deferred.push(Deferred::Landed { token, len }),
            Err(e) => self.core.fail_token(token, e),
        }
    }

    fn on_peer_failed(&mut self, peer: PeerRank, error: Error) {
        self.core.peer_failed(peer, error);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// A sink that keeps what it is given, checking the offsets follow on.
    struct Collect {
        capacity: usize,
        bytes: Arc<Mutex<Vec<u8>>>,
    }

    impl MessageSink for Collect {
        fn capacity(&self) -> usize {
            self.capacity
        }

        fn unpack(&mut self, offset: usize, bytes: &[u8]) -> Result<()> {
            let mut kept = self.bytes.lock().unwrap();
            assert_eq!(offset, kept.len(), "a piece out of order reached the sink");
            kept.extend_from_slice(bytes);
            Ok(())
        }
    }

    const PEER: PeerRank = 1;

    fn core() -> Core {
        Core {
            rank: 0,
            vcs: (0..2)
                .map(|_| Vc {
                    binding: Binding::Unbound,
                    send_sequence: 0,
                    recv_sequence: 0,
                    arriving: None,
                    arriving_active: None,
                    arriving_placed: None,
                })
                .collect(),
            requests: Slab::default(),
            matched: Slab::default(),
            posted: PostedQueue::default(),
            unexpected: UnexpectedQueue::default(),
            deferred: Vec::new(),
            eager_limits: vec![64],
            always_eager_limits: vec![64],
            reads_all: vec![false],
            active: VecDeque::new(),
            placer: None,
            spare_payloads: Vec::new(),
            spare_bytes: 0,
            lost_peers: 0,
            direct: Direct::Idle,
            polled_transports: 0,
        }
    }

    /// A receive into a sink of `capacity` bytes that matched an RTS of
    /// `len` bytes from `PEER`: its token and what its sink keeps.
    fn streamed_receive(
        core: &mut Core,
        len: usize,
        capacity: usize,
    ) -> (u64, Arc<Mutex<Vec<u8>>>) {
        let bytes = Arc::new(Mutex::new(Vec::new()));
        let sink = Box::new(Collect {
            capacity,
            bytes: Arc::clone(&bytes),
        });
        let token = core
            .requests
            .insert(Device::unpacked_request(Some(PEER), sink));
        core.accept_rts(token, PEER, 77, len, Some((0x7f00_0000_0000, 0, true)));
        (token, bytes)
    }

    fn piece(token: u64, offset: usize, len: usize) -> Header {
        let mut h = Header::new(Kind::Data);
        h.flags = FLAG_PIECE;
        h.receiver_token = token;
        h.address = offset as u64;
        h.message_len = len as u64;
        h
    }

    /// Delivers a packet carrying `payload` as a transport does.
    fn deliver(core: &mut Core, header: &Header, payload: &[u8]) -> Result<()> {
        let mut sink = Sink { core, transport: 0 };
        if let Some(slot) = sink.on_header(PEER, header)? {
            let buffer = sink.payload_buffer(slot);
            assert_eq!(buffer.len(), payload.len());
            buffer.copy_from_slice(payload);
            sink.on_payload(PEER, slot);
        }
        Ok(())
    }

    fn message(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 13 + i / 977) as u8).collect()
    }

    /// Posts a receive into `buf` for `pattern`, as `Device::post` does
    /// when nothing unexpected matches.
    fn post(core: &mut Core, pattern: Pattern, buf: &mut [u8]) -> u64 {
        let request = Request {
            buf: buf.as_mut_ptr(),
            cap: buf.len(),
            ..Request::new(None, Phase::Posted, Status::empty())
        };
        let token = core.requests.insert(request);
        core.posted.push(pattern, token);
        token
    }

    #[test]
    fn a_standard_eager_sends_id_carries_its_status_and_names_no_request() {
        let status = RequestId(SENT | 40).complete_status().expect("a sent id");
        assert_eq!((status.count, status.cancelled), (40, false));
        assert!(status.error.is_none());
        assert_eq!(RequestId(SENT).complete_status().map(|s| s.count), Some(0));
        let mut core = core();
        for _ in 0..1000 {
            let token = core
                .requests
                .insert(Request::new(None, Phase::Done, Status::empty()));
            assert!(RequestId(token).complete_status().is_none(), "{token:#x}");
            core.requests.discard(token);
        }
        assert!(RequestId(DIRECT_TOKEN).complete_status().is_none());
        assert!(RequestId(u64::MAX).complete_status().is_none());
    }

    #[test]
    fn a_whole_eager_packet_is_received_in_one_step() {
        // Through `on_packet` with a header, and through
        // `on_standard_eager` with its parts: the same outcome.
        for by_parts in [false, true] {
            receive_whole_eager_packets(by_parts);
        }
    }

    fn receive_whole_eager_packets(by_parts: bool) {
        let mut core = core();
        let pattern = |tag| Pattern {
            context_id: 5,
            source: Some(3),
            tag,
        };
        let eager = |sequence, tag, len| Header {
            sequence,
            context_id: 5,
            source: 3,
            tag,
            message_len: len,
            ..Header::new(Kind::Eager)
        };
        let deliver = |sink: &mut Sink<'_>, h: &Header, payload: &[u8]| {
            if by_parts {
                sink.on_standard_eager(PEER, h.sequence, envelope_of(h), payload)
            } else {
                sink.on_packet(PEER, h, payload)
            }
        };
        let (mut any_tag, mut small) = ([0u8; 8], [0u8; 4]);
        let first = post(&mut core, pattern(None), &mut any_tag);
        let second = post(&mut core, pattern(Some(9)), &mut small);
        let mut sink = Sink {
            core: &mut core,
            transport: 0,
        };
        // Both receives accept tag 9: the older takes the first message.
        deliver(&mut sink, &eager(0, 9, 6), b"abcdef").unwrap();
        deliver(&mut sink, &eager(1, 9, 6), b"ghijkl").unwrap();
        // No receive left: the third waits as an unexpected message.
        deliver(&mut sink, &eager(2, 9, 3), b"mno").unwrap();
        // Out of sequence, beyond the eager limit, or (with a header) a
        // payload that is not the message: the peer broke the protocol.
        let late = deliver(&mut sink, &eager(9, 9, 1), b"p").unwrap_err();
        assert_eq!(late.class(), ErrorClass::ProcFailed);
        assert!(late.message().contains("sequence 9"), "{late}");
        let long = deliver(&mut sink, &eager(3, 9, 65), &[1; 65]).unwrap_err();
        assert_eq!(long.class(), ErrorClass::ProcFailed);
        assert!(long.message().contains("limit of 64"), "{long}");
        if !by_parts {
            let odd = sink.on_packet(PEER, &eager(3, 9, 5), b"p").unwrap_err();
            assert_eq!(odd.class(), ErrorClass::ProcFailed);
        }
        let status = |core: &mut Core, token| {
            let r = core.requests.remove(token).unwrap();
            assert!(matches!(r.phase, Phase::Done));
            r.status
        };
        let s = status(&mut core, first);
        assert_eq!((s.source, s.tag, s.count, s.error), (3, 9, 6, None));
        let s = status(&mut core, second);
        assert_eq!((s.tag, s.count), (9, 4));
        assert_eq!(s.error.map(|e| e.class()), Some(ErrorClass::Truncate));
        assert_eq!(&any_tag[..6], b"abcdef");
        assert_eq!(&small, b"ghij");
        let (envelope, message) = core.unexpected.take_match(&pattern(None)).unwrap();
        assert_eq!(envelope.tag, 9);
        assert!(matches!(message, Unexpected::Eager { data, sync: None } if data == b"mno"));
    }

    /// A ready packet may exceed the eager limit and lands in the receive
    /// posted for it; one that finds none, or a plain eager packet beyond
    /// the limit, is the sender's protocol error (nothing is buffered).
    #[test]
    fn a_ready_packet_beyond_the_eager_limit_needs_its_posted_receive() {
        let mut core = core();
        let pattern = Pattern {
            context_id: 5,
            source: Some(3),
            tag: Some(2),
        };
        let packet = |sequence, flags| Header {
            sequence,
            context_id: 5,
            source: 3,
            tag: 2,
            flags,
            message_len: 100,
            ..Header::new(Kind::Eager)
        };
        let data: Vec<u8> = (0..100).collect();
        let mut buf = [0u8; 100];
        let token = post(&mut core, pattern, &mut buf);
        let mut sink = Sink {
            core: &mut core,
            transport: 0,
        };
        sink.on_packet(PEER, &packet(0, FLAG_READY), &data).unwrap();
        let unposted = sink.on_packet(PEER, &packet(1, FLAG_READY), &data);
        let unposted = unposted.unwrap_err();
        assert_eq!(unposted.class(), ErrorClass::ProcFailed);
        assert!(
            unposted.message().contains("no receive posted"),
            "{unposted}"
        );
        let plain = sink.on_packet(PEER, &packet(2, 0), &data).unwrap_err();
        assert!(plain.message().contains("exceeds the limit"), "{plain}");
        let r = core.requests.remove(token).unwrap();
        assert!(matches!(r.phase, Phase::Done));
        assert_eq!((r.status.count, r.status.error.is_none()), (100, true));
        assert_eq!(buf[..], data[..]);
        assert!(core.unexpected.take_match(&pattern).is_none());
    }

    /// Every `irecv` and every request-making send moves a request into
    /// the slab: what only long or non-contiguous messages need is out of
    /// line, so the move stays below two cache lines.
    #[test]
    fn a_request_is_smaller_than_two_cache_lines() {
        let size = std::mem::size_of::<Request>();
        assert!(size < 128, "a request takes {size} bytes");
    }

    /// A transport that no route chose is polled every turn from the
    /// first packet a peer sends over it (it bound the peer's VC), and a
    /// second transport for the same peer is refused.
    #[test]
    fn a_packet_over_an_unplanned_transport_makes_it_polled_every_turn() {
        let mut core = core();
        core.eager_limits = vec![64; 3];
        core.always_eager_limits = vec![64; 3];
        let mut sink = Sink {
            core: &mut core,
            transport: 2,
        };
        let eager = Header {
            context_id: 5,
            source: 3,
            ..Header::new(Kind::Eager)
        };
        sink.on_packet(PEER, &eager, b"").unwrap();
        assert_eq!(core.polled_transports, 1 << 2);
        let mut sink = Sink {
            core: &mut core,
            transport: 1,
        };
        let second = Header {
            sequence: 1,
            ..eager
        };
        let error = sink.on_packet(PEER, &second, b"").unwrap_err();
        assert!(error.message().contains("second transport"), "{error}");
        assert_eq!(core.polled_transports, 1 << 2);
    }

    /// Over a transport whose NIC reads the whole message, the sender
    /// writes nothing: a WriteDone is a protocol error, ReadDones add up
    /// to the accepted length, and then the send completes and its
    /// buffer's offer is withdrawn (as it is when the receiver asks for
    /// data packets instead).
    #[test]
    fn a_send_the_receiver_reads_whole_completes_on_read_done_and_withdraws_its_offer() {
        const LEN: usize = 100_000;
        let buf = vec![0u8; LEN];
        let mut core = core();
        core.reads_all = vec![true];
        let send = |core: &mut Core| {
            let mut status = Status::empty();
            status.count = LEN;
            let phase = Phase::AwaitingCts {
                ptr: buf.as_ptr(),
                len: LEN,
                remote: Some(0x1234),
            };
            core.requests
                .insert(Request::new(Some(PEER), phase, status))
        };
        let mut sequence = 0;
        let mut packet = |kind: Kind, token: u64, len: usize| {
            let mut h = Header::new(kind);
            h.sequence = sequence;
            sequence += 1;
            h.sender_token = token;
            h.receiver_token = 9;
            h.message_len = len as u64;
            h
        };
        let token = send(&mut core);
        let mut cts = packet(Kind::Cts, token, LEN);
        cts.flags = FLAG_REMOTE;
        cts.address = 0x7f00_0000_0000;
        deliver(&mut core, &cts, &[]).unwrap();
        assert!(matches!(core.deferred.pop(), Some(Deferred::Data { token: t }) if t == token));
        deliver(&mut core, &packet(Kind::ReadDone, token, LEN - 1), &[]).unwrap();
        assert!(core.deferred.is_empty());
        assert!(!matches!(
            core.requests.get(token).unwrap().phase,
            Phase::Done
        ));
        deliver(&mut core, &packet(Kind::ReadDone, token, 1), &[]).unwrap();
        assert!(matches!(
            core.requests.get(token).unwrap().phase,
            Phase::Done
        ));
        assert!(matches!(
            core.deferred.pop(),
            Some(Deferred::Withdraw {
                peer: PEER,
                key: 0x1234
            })
        ));
        // The receiver asks for packets: the offer is withdrawn at once.
        let token = send(&mut core);
        deliver(&mut core, &packet(Kind::Cts, token, LEN), &[]).unwrap();
        assert!(matches!(
            core.deferred.as_slice(),
            [
                Deferred::Withdraw {
                    peer: PEER,
                    key: 0x1234
                },
                Deferred::Data { .. }
            ]
        ));
        // A receive never gets a WriteDone from such a sender.
        let receive =
            core.requests
                .insert(Request::new(Some(PEER), Phase::Posted, Status::empty()));
        if let Some(r) = core.requests.get_mut(receive) {
            r.phase = Phase::CopyingIn(Box::new(CopyIn {
                address: 0x7f00_0000_0000,
                key: 0x1234,
                alone: false,
                sender_token: 5,
                accepted: LEN,
                copied: 0,
            }));
        }
        let mut done = packet(Kind::WriteDone, 0, LEN - remote_split(LEN, false));
        done.receiver_token = receive;
        assert!(deliver(&mut core, &done, &[]).is_err());
    }

    /// A receiver that read the whole message before answering sends no
    /// CTS: the sender, still awaiting one, completes on the ReadDone,
    /// whose count is the bytes accepted, and withdraws its offer; a count
    /// of 0 or beyond the send is a protocol error.
    #[test]
    fn a_send_read_whole_before_any_cts_completes_on_its_read_done() {
        const LEN: usize = 16_384;
        let buf = vec![0u8; LEN];
        let awaiting_cts = |core: &mut Core| {
            let phase = Phase::AwaitingCts {
                ptr: buf.as_ptr(),
                len: LEN,
                remote: Some(0x1234),
            };
            core.requests
                .insert(Request::new(Some(PEER), phase, Status::empty()))
        };
        let read_done = |token: u64, read: usize| {
            let mut h = Header::new(Kind::ReadDone);
            h.sender_token = token;
            h.message_len = read as u64;
            h
        };
        for bad in [0, LEN + 1] {
            let mut core = core();
            let token = awaiting_cts(&mut core);
            let error = deliver(&mut core, &read_done(token, bad), &[]).unwrap_err();
            assert_eq!(error.class(), ErrorClass::ProcFailed, "{bad}: {error}");
        }
        let mut core = core();
        let token = awaiting_cts(&mut core);
        deliver(&mut core, &read_done(token, LEN - 10), &[]).unwrap();
        let r = core.requests.get(token).unwrap();
        assert!(matches!(r.phase, Phase::Done));
        assert_eq!(r.status.count, LEN - 10, "the count the receiver took");
        assert!(matches!(
            core.deferred.as_slice(),
            [Deferred::Withdraw {
                peer: PEER,
                key: 0x1234
            }]
        ));
    }

    #[test]
    fn a_direct_receive_keeps_its_place_and_becomes_a_request_when_it_must() {
        let mut core = core();
        let any = Pattern {
            context_id: 5,
            source: None,
            tag: None,
        };
        let eager = |sequence, len| Header {
            sequence,
            context_id: 5,
            source: 3,
            tag: 9,
            message_len: len,
            ..Header::new(Kind::Eager)
        };
        let (mut earlier, mut direct) = ([0u8; 4], [0u8; 4]);
        let token = post(&mut core, any, &mut earlier);
        assert!(core.post_direct(any, None, direct.as_mut_ptr(), direct.len()));
        // One at a time.
        assert!(!core.post_direct(any, None, direct.as_mut_ptr(), 4));
        let mut sink = Sink {
            core: &mut core,
            transport: 0,
        };
        sink.on_packet(PEER, &eager(0, 3), b"abc").unwrap();
        sink.on_packet(PEER, &eager(1, 6), b"defghi").unwrap();
        assert!(matches!(
            core.requests.get(token).unwrap().phase,
            Phase::Done
        ));
        assert_eq!(&earlier[..3], b"abc");
        let Direct::Done(status) = std::mem::replace(&mut core.direct, Direct::Idle) else {
            panic!("the direct receive did not complete");
        };
        assert_eq!((status.source, status.tag, status.count), (3, 9, 4));
        assert_eq!(status.error.map(|e| e.class()), Some(ErrorClass::Truncate));
        assert_eq!(&direct, b"defg");
        // A rendezvous needs a request: the direct receive becomes one,
        // which answers the RTS.
        assert!(core.post_direct(any, None, direct.as_mut_ptr(), 4));
        let rts = Header {
            kind: Kind::Rts,
            sender_token: 77,
            ..eager(2, 1000)
        };
        deliver(&mut core, &rts, &[]).unwrap();
        let Direct::Request(token) = core.direct else {
            panic!("the direct receive did not become a request");
        };
        let r = core.requests.get(token).unwrap();
        assert!(matches!(r.phase, Phase::AwaitingData { accepted: 4, .. }));
        assert_eq!((r.peer, r.cap), (Some(PEER), 4));
        assert!(core.deferred.iter().any(|d| matches!(d,
            Deferred::Packet { header, .. } if header.kind == Kind::Cts && header.receiver_token == token)));
        // A direct receive from a peer that fails completes with the error.
        core.direct = Direct::Idle;
        let from_peer = Pattern {
            source: Some(3),
            ..any
        };
        assert!(core.post_direct(from_peer, Some(PEER), direct.as_mut_ptr(), 4));
        assert_eq!(core.lost_peers, 0);
        core.peer_failed(PEER, Error::new(ErrorClass::ProcFailed, "gone"));
        // Counted once, however often it is reported.
        core.peer_failed(PEER, Error::new(ErrorClass::ProcFailed, "again"));
        assert_eq!(core.lost_peers, 1);
        let Direct::Done(status) = std::mem::replace(&mut core.direct, Direct::Idle) else {
            panic!("the direct receive from a lost peer did not complete");
        };
        assert_eq!(
            status.error.map(|e| e.class()),
            Some(ErrorClass::ProcFailed)
        );
        assert!(core.posted.take_match(&envelope_of(&eager(0, 0))).is_none());
        // Nor does a new one start for it.
        assert!(!core.post_direct(from_peer, Some(PEER), direct.as_mut_ptr(), 4));
    }

    #[test]
    fn a_sink_asks_for_pieces_and_unpacks_each_in_order() {
        let mut core = core();
        let len = 2 * PIECE_LEN + 100;
        let (token, kept) = streamed_receive(&mut core, len, len);
        // A plain CTS with FLAG_PIECE, though the sender offered a remote
        // copy: a sink takes pieces.
        let cts = core.deferred.iter().find_map(|d| match d {
            Deferred::Packet { header, .. } => Some(*header),
            _ => None,
        });
        let cts = cts.expect("the receive answered with a CTS");
        assert_eq!(
            (cts.kind, cts.flags, cts.message_len),
            (Kind::Cts, FLAG_PIECE, len as u64)
        );
        let data = message(len);
        for offset in (0..len).step_by(PIECE_LEN) {
            assert!(!matches!(
                core.requests.get(token).unwrap().phase,
                Phase::Done
            ));
            let end = (offset + PIECE_LEN).min(len);
            deliver(
                &mut core,
                &piece(token, offset, end - offset),
                &data[offset..end],
            )
            .unwrap();
        }
        let r = core.requests.get(token).unwrap();
        assert!(matches!(r.phase, Phase::Done));
        assert_eq!((r.status.count, r.status.error.clone()), (len, None));
        assert!(r.stream.is_none(), "a done receive keeps its chunk");
        assert_eq!(*kept.lock().unwrap(), data);
    }

    #[test]
    fn a_truncated_streamed_receive_takes_what_fits_and_says_so() {
        let mut core = core();
        let (len, capacity) = (PIECE_LEN * 3, PIECE_LEN + 5);
        let (token, kept) = streamed_receive(&mut core, len, capacity);
        let data = message(capacity);
        deliver(&mut core, &piece(token, 0, PIECE_LEN), &data[..PIECE_LEN]).unwrap();
        deliver(&mut core, &piece(token, PIECE_LEN, 5), &data[PIECE_LEN..]).unwrap();
        let r = core.requests.get(token).unwrap();
        assert!(matches!(r.phase, Phase::Done));
        assert_eq!(r.status.count, capacity);
        let class = r.status.error.as_ref().map(|e| e.class());
        assert_eq!(class, Some(ErrorClass::Truncate));
        assert_eq!(*kept.lock().unwrap(), data);
    }

    #[test]
    fn a_bad_piece_is_a_protocol_error_not_a_panic() {
        const LEN: usize = 2 * PIECE_LEN;
        let data = message(PIECE_LEN);
        /// What is wrong, and the header of a piece for receive `t`.
        type Bad = (&'static str, fn(u64) -> Header);
        let bad: [Bad; 5] = [
            ("out of order", |t| piece(t, PIECE_LEN, PIECE_LEN)),
            ("past the accepted length", |t| piece(t, 0, LEN + 1)),
            ("for another receive", |t| piece(t + 1, 0, 10)),
            ("whole data for a sink", |t| {
                let mut h = piece(t, 0, LEN);
                h.flags = 0;
                h.address = 0;
                h
            }),
            ("a repeated piece", |t| piece(t, 0, 10)),
        ];
        for (what, header) in bad {
            let mut core = core();
            let (token, _) = streamed_receive(&mut core, LEN, LEN);
            if what == "a repeated piece" {
                deliver(&mut core, &piece(token, 0, 10), &data[..10]).unwrap();
            }
            let err = deliver(&mut core, &header(token), &data[..10]).unwrap_err();
            assert_eq!(err.class(), ErrorClass::ProcFailed, "{what}: {err}");
        }
    }

    /// An active message takes the spare payload buffer nearest its
    /// length: a short one does not shorten the long spare, which the
    /// next long message then takes with its bytes as they were (not
    /// zeroed again).
    #[test]
    fn active_messages_take_the_spare_nearest_their_length() {
        const LONG: usize = 128 * 1024;
        let mut core = core();
        for len in [32, LONG] {
            let spare = vec![7u8; len];
            core.spare_bytes += spare.capacity();
            core.spare_payloads.push(spare);
        }
        let short = core.take_spare_payload(40);
        assert_eq!(short.len(), 40);
        assert_eq!(&short[..32], &[7; 32], "the short spare, lengthened");
        let long = core.take_spare_payload(LONG);
        assert!(
            long.iter().all(|&b| b == 7),
            "the long spare, not zeroed again"
        );
        assert_eq!(core.spare_bytes, 0);
        assert_eq!(core.take_spare_payload(8), [0; 8], "a new one");
    }

    /// What a placer was shown queued, per call: each message's payload
    /// and whether it was a placed one.
    type Shown = Arc<Mutex<Vec<Vec<(Vec<u8>, bool)>>>>;

    /// A placer that decides by key (1: held, 2: at `dest`, else
    /// refused) and notes what it was shown.
    struct ByKey {
        dest: *mut u8,
        shown: Shown,
    }

    // SAFETY: `dest` is a test's buffer, alive and untouched while the
    // test delivers into it.
    unsafe impl Send for ByKey {}

    // SAFETY: as above; the test reads the buffer only once every packet
    // was delivered.
    unsafe impl ActivePlacer for ByKey {
        fn place(
            &mut self,
            _peer: PeerRank,
            _context_id: u32,
            (key, _): (u64, u64),
            _len: usize,
            queued: &mut dyn Iterator<Item = &ActiveMessage>,
        ) -> Result<Destination> {
            let shown = queued
                .map(|m| (m.payload.clone(), m.placed.is_some()))
                .collect();
            self.shown.lock().unwrap().push(shown);
            Ok(match key {
                1 => Destination::Held,
                2 => Destination::At(self.dest),
                _ => Destination::Refused(Error::new(ErrorClass::RmaRange, "outside")),
            })
        }
    }

    /// A placer sees the messages of its peer and context that arrived
    /// before and are not handled yet; data it holds back arrives as a
    /// payload and reaches the handler in its turn, between the others.
    #[test]
    fn held_placed_data_arrives_in_turn_and_the_placer_sees_what_came_before() {
        let mut core = core();
        let mut window = [0u8; 4];
        let shown = Arc::new(Mutex::new(Vec::new()));
        core.placer = Some(Box::new(ByKey {
            dest: window.as_mut_ptr(),
            shown: Arc::clone(&shown),
        }));
        let mut sequence = 0;
        let mut active = |context_id, key: Option<u64>, len: usize| {
            let mut h = Header::new(Kind::Active);
            h.sequence = sequence;
            sequence += 1;
            h.context_id = context_id;
            h.message_len = len as u64;
            if let Some(key) = key {
                h.flags = FLAG_PLACED;
                h.receiver_token = key;
                h.sender_token = key + len as u64;
            }
            h
        };
        let lock = active(9, None, 4);
        let other_context = active(8, None, 2);
        let held = active(9, Some(1), 3);
        let placed = active(9, Some(2), 4);
        let refused = active(9, Some(3), 5);
        deliver(&mut core, &lock, b"lock").unwrap();
        deliver(&mut core, &other_context, b"no").unwrap();
        deliver(&mut core, &held, b"put").unwrap();
        deliver(&mut core, &placed, b"data").unwrap();
        deliver(&mut core, &refused, b"").unwrap();
        assert_eq!(&window, b"data", "placed data lands in place");
        let lock_shown = (b"lock".to_vec(), false);
        let held_shown = (b"put".to_vec(), true);
        assert_eq!(
            *shown.lock().unwrap(),
            vec![
                vec![lock_shown.clone()],
                vec![lock_shown.clone(), held_shown.clone()],
                vec![lock_shown, held_shown, (Vec::new(), true)],
            ],
            "each placed header sees its context's earlier messages, in order"
        );
        let handed: Vec<_> = core
            .active
            .iter()
            .map(|m| {
                let landing = m.placed.as_ref().map(|p| match &p.landing {
                    Landing::InPlace => ("in place", p.key, p.len),
                    Landing::Held => ("held", p.key, p.len),
                    Landing::Refused(_) => ("refused", p.key, p.len),
                });
                (m.context_id, m.payload.clone(), landing)
            })
            .collect();
        assert_eq!(
            handed,
            vec![
                (9, b"lock".to_vec(), None),
                (8, b"no".to_vec(), None),
                (9, b"put".to_vec(), Some(("held", 1, 3))),
                (9, Vec::new(), Some(("in place", 2, 4))),
                (9, Vec::new(), Some(("refused", 3, 5))),
            ]
        );
    }

    #[test]
    fn a_contiguous_receive_takes_pieces_into_its_buffer() {
        let mut core = core();
        let len = PIECE_LEN + 3;
        let mut buffer = vec![0u8; len];
        let token = core.requests.insert(Request {
            buf: buffer.as_mut_ptr(),
            cap: len,
            ..Request::new(Some(PEER), Phase::Posted, Status::empty())
        });
        core.accept_rts(token, PEER, 77, len, None);
        let data = message(len);
        deliver(&mut core, &piece(token, 0, PIECE_LEN), &data[..PIECE_LEN]).unwrap();
        deliver(&mut core, &piece(token, PIECE_LEN, 3), &data[PIECE_LEN..]).unwrap();
        let r = core.requests.get(token).unwrap();
        assert!(matches!(r.phase, Phase::Done));
        assert_eq!(r.status.count, len);
        assert_eq!(buffer, data);
    }
}
