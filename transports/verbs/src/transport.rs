//! The verbs transport: the ADI's packets over reliable-connected queue
//! pairs, written only against the provider interface ([`crate::provider`])
//! so that it runs on the soft and the rdma-core providers alike.
//!
//! It owns the NIC objects of a rank (one protection domain, one completion
//! queue, one shared receive queue with registered receive buffers for each
//! connected peer, a registered pool of send buffers, a UD queue pair for
//! connection requests, one RC queue pair per connected peer), the
//! business card, the connections, the framing of the packet stream into
//! SENDs, and the credits that keep a peer from sending more than the
//! buffers posted for it. It must not know communicators, requests or matching: like every
//! transport it hands headers to the ADI's [`PacketSink`] and writes
//! payloads where the sink says.
//!
//! # Connections
//! The card has one size whatever the job (at most [`CARD_MAX`]
//! characters): `verbs2,<provider>,<gid hex>,<lid>,<mtu>,<UD qpn hex>`.
//! The UD queue pair it names is the rank's connection channel: RC queue
//! pairs are made and connected on a VC's first use (a send, a one-sided
//! operation, a window's creation: whatever makes the ADI add the peer).
//! An RC queue pair drops (hardware) or parks (soft) what arrives before
//! it is in RTR, so the peer must connect its side before anything is
//! sent; the requester asks it by datagram ([`crate::connect`] has the
//! messages, authenticated under the job's secret, and the Q_Key):
//!
//! ```text
//! requester                                        peer
//!   make QP_a            REQUEST {QP_a, PSN, MTU} ──►  make QP_b (or use the
//!                                                       one it made), connect
//!                                                       it to QP_a (RTS)
//!   connect QP_a to QP_b ◄── REPLY {QP_b, PSN, QP_a}
//!   first frame (even empty)                   ──►  ready: sends from now on
//! ```
//!
//! Queued packets wait until their side is ready. Datagrams may be lost:
//! a request unanswered is sent again, after 50 ms and then twice as long
//! each time up to 1 s, for as long as it takes: a peer answers only from
//! inside its MPI calls, and may compute for hours between them (a peer
//! that died ends the job through the launcher). [`CONNECT_TIMEOUT_ENV`]
//! (seconds) bounds the wait: past it the peer is lost. A duplicate
//! request gets the same reply, a
//! duplicate reply is ignored. A rank makes one queue pair per peer, for
//! its own request or for the peer's, whichever comes first, so when two
//! ranks ask each other at once each connects the one it has to the
//! other's and both reply: one pair of queue pairs, no tie-break needed;
//! each goes on asking until the other's reply or first frame comes.
//! A peer answers only from inside its polls; its NIC does the rest.
//!
//! # Frames and credits
//! A peer's packets (the ADI header, then the payload: the same byte stream
//! the TCP transport writes) are cut into frames of at most [`FRAME_LEN`]
//! bytes, each sent by one SEND into a buffer of the shared receive queue;
//! RC delivers a queue pair's SENDs in order, and the receiver parses the
//! stream across frames. Small packets share a frame. A frame begins with
//! 4 bytes: the credits it returns. A frame with stream bytes costs the
//! sender one credit; a rank starts with [`CREDITS`] per peer and gets a
//! credit back for each such frame the peer has taken out of its buffers
//! (piggybacked on the next frame to it, or in a credit-only frame when
//! half the window is owed or the peer went quiet). Credit-only frames cost
//! no credit: for them each rank keeps [`CREDITS`] more buffers per peer
//! posted. So a flood of unexpected messages never finds the receive queue
//! empty (RNR is never relied on) and never deadlocks: what cannot leave
//! waits in the sender's queue, copied, and the receiver drains its
//! buffers on every poll, whatever the ADI does with the messages.
//!
//! # Long messages: zero-copy rendezvous by RDMA READ
//! Messages past [`EAGER_LIMIT`] take the ADI's remote-copy rendezvous
//! (the shape shm's cross-memory attach uses, see `oxmpi_adi::proto`):
//! the sender registers its buffer with remote read
//! ([`Transport::remote_offer`]) and its RTS carries the address and the
//! rkey; the receiver, once a receive matches, registers its buffer with
//! local write, sends its CTS and reads the whole message straight into
//! the receive buffer by RDMA READs of at most [`READ_CHUNK`] bytes
//! ([`READ_DEPTH`] in flight per peer); when the last completes it tells
//! the sender (ReadDone), whose send then completes. So the data crosses
//! once, NIC to NIC, with no copy on either side and no frame or credit.
//! The receiver reads, rather than the sender writing into the receive
//! buffer, because the receiver is the one that knows when the buffer is
//! ready (its receive matched) and when the data has landed (its own
//! completion): a write would need the receiver's address and key in the
//! CTS, then a message from the sender after its write completed — one
//! more trip — and would expose the receive buffer to remote writes. A
//! buffer that cannot be registered (a limit on locked memory) is not
//! offered, and the message goes in frames as `Data` packets; a receive
//! buffer that cannot be registered turns remote copy off for the rank.
//! Non-contiguous data (a derived datatype with gaps) moves in the ADI's
//! streamed pieces through the frames.
//!
//! Registrations of user buffers are kept for reuse by the registration
//! cache ([`crate::regcache`]), which validates each hit against the
//! kernel's record of the mapping, so that freed memory mapped again is
//! registered again, and sweeps its idle registrations every 2^20 polls
//! to release those of freed memory; its registrations and invalidations are said under
//! `OXMPI_VERBOSE=1`, and [`VerbsTransport::cache_stats`] counts them.
//!
//! A READ that fails (a remote access error: the rkey is revoked, or the
//! range lies outside the registration) fails the message's receive with
//! `MPI_ERR_PROC_FAILED` naming the error, once the message's other READs
//! completed (so nothing writes the buffer after the receive failed). As
//! RC has it, both queue pairs are then in the error state: the peer fails
//! on both sides, which fails the send. The sender, which has nothing
//! posted that would complete with an error, checks the state of the
//! queue pairs to peers holding an offer of its memory every 64 polls. A
//! peer that fails while reads from it are in flight is reported to the
//! ADI only once they completed. Other peers go on.
//!
//! # One-sided channel
//! The transport offers the ADI's one-sided channel
//! ([`Transport::rdma_register`], [`Transport::rdma_post`],
//! [`Transport::rdma_take`]) on the same queue pairs: a registration is a
//! memory region of the rank's protection domain with every remote right;
//! an operation is one RDMA WRITE, RDMA READ, fetch-and-add or
//! compare-and-swap work request through a registered staging buffer of
//! [`RMA_LEN`] bytes (a write's data is copied into it when posted, a
//! read's lands there and is copied out at its completion), so no
//! caller memory is borrowed while the NIC works. [`RMA_SLOTS`] staging
//! buffers are shared by the peers, at most [`RMA_DEPTH`] operations per
//! peer are in flight, and a post with none free asks the caller to poll
//! and post again. [`Transport::rdma_post_list`] posts as many of a list
//! of operations as fit as one list of work requests
//! ([`crate::provider::QueuePair::post_send_list`]: one post, one lock of
//! the queue pair); each keeps its own signaled request, staging buffer
//! and id, as if posted alone. The target's process takes no part: its NIC (the soft
//! provider's queue-pair threads) does the work. A remote access error
//! fails the operation with `MPI_ERR_RMA_RANGE`, and, as RC has it, the
//! queue pair is then in the error state: the peer fails as below.
//!
//! # Failures
//! A completion with an error status (a broken connection, a remote access
//! or protocol error) fails that peer: [`PacketSink::on_peer_failed`] with
//! `MPI_ERR_PROC_FAILED` and the status, its queued packets are dropped
//! and later sends to it fail; other peers go on.

use crate::connect::{self, Kind, Message, MESSAGE_LEN};
use crate::provider::{
    connect_rc, AccessFlags, AhAttr, CompletionChannel, CompletionQueue, ConnectParams, Gid,
    MemoryRegion, Nic, PostError, QpAddress, QpCaps, QpInit, QpState, QueuePair, RecvWr,
    RemoteAddr, SendOp, SendWr, Sge, SharedReceiveQueue, UdAttr, UdQueuePair, UdSendWr, WcOpcode,
    WcStatus, WorkCompletion, GRH_LEN, UD_MAX_PAYLOAD,
};
use crate::regcache::{CacheStats, RegCache};
use crate::ProviderKind;
use oxmpi_adi::host::HostId;
use oxmpi_adi::proto::{Header, HEADER_LEN};
use oxmpi_adi::transport::{
    JobInfo, PacketSink, PayloadSlot, PeerRank, RdmaOp, RdmaRegion, RdmaTarget, RemoteRead,
    Transport,
};
use oxmpi_adi::{Error, ErrorClass, Result};
use std::alloc::Layout;
use std::collections::{HashMap, VecDeque};
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

/// Bytes of one frame (one receive buffer), its 4-byte head included.
pub const FRAME_LEN: usize = 8192;
/// Bytes at the start of every frame: the credits it returns (u32, LE).
const FRAME_HEAD: usize = 4;
/// Frames with stream bytes a rank may have in a peer's buffers at once.
pub const CREDITS: u32 = 16;
/// Send buffers of a rank, shared by its peers.
const SEND_SLOTS: usize = 64;
/// Largest message sent with the eager protocol.
pub const EAGER_LIMIT: usize = 32 * 1024;
/// Completions taken from the completion queue at a time.
const POLL_BATCH: usize = 64;
/// Version tag that starts a card.
const CARD_TAG: &str = "verbs2";
/// Most characters of a card: the tag, a provider field of at most 64,
/// a GID of 32 hex digits, a LID, an MTU and a UD queue-pair number.
pub const CARD_MAX: usize = 7 + 65 + 33 + 6 + 5 + 7;
// A card fits a PMI value (1024 bytes) whatever the size of the job.
const _: () = assert!(CARD_MAX <= 1024);
/// `wr_id` bit of receive work requests.
const RECV_BIT: u64 = 1 << 63;
/// `wr_id` bit of one-sided operations (the low bits: the staging slot).
const RMA_BIT: u64 = 1 << 62;
/// Bytes of one staging buffer: the largest read or write of one post.
pub const RMA_LEN: usize = 64 * 1024;
/// Staging buffers of a rank, shared by its peers.
pub const RMA_SLOTS: usize = 32;
/// One-sided operations in flight to one peer at most.
pub const RMA_DEPTH: u32 = 16;
/// `wr_id` bit of rendezvous reads (the low bits: the read's id).
const READ_BIT: u64 = 1 << 61;
/// Bytes of one RDMA READ of a rendezvous: a longer message is read in
/// several, which bounds what one work request holds (the soft provider
/// carries it in one frame) and lets several be in flight.
pub const READ_CHUNK: usize = 1 << 20;
/// Rendezvous RDMA READs in flight to one peer at most.
pub const READ_DEPTH: u32 = 8;
/// `wr_id` bit of the UD queue pair's work requests (the low bits: the
/// buffer; receives below [`UD_RECVS`], sends above).
const UD_BIT: u64 = 1 << 60;
/// Receives posted on the UD queue pair: connection messages that find
/// none are lost, and their senders try again.
const UD_RECVS: usize = 32;
/// Send buffers of the UD queue pair.
const UD_SENDS: usize = 16;
/// Bytes of one UD buffer: the GRH and a message.
const UD_BUF: usize = 512;
/// The first wait for a reply before a request is sent again; each
/// retry doubles it, up to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_millis(50);
/// The longest wait between two requests to a peer.
const RETRY_MAX: Duration = Duration::from_secs(1);
/// The variable that bounds how long a peer may leave connection
/// requests unanswered before it is taken for lost (seconds; unset: no
/// bound).
pub const CONNECT_TIMEOUT_ENV: &str = "OXMPI_VERBS_CONNECT_TIMEOUT";

/// Parses a value of [`CONNECT_TIMEOUT_ENV`]: whole seconds, at least 1;
/// unset or empty: no bound. A bad value is an MPI_ERR_ARG error.
pub fn parse_connect_timeout(value: Option<&str>) -> Result<Option<Duration>> {
    match value.map(str::trim) {
        None | Some("") => Ok(None),
        Some(text) => match text.parse::<u64>() {
            Ok(secs) if secs > 0 => Ok(Some(Duration::from_secs(secs))),
            _ => Err(Error::new(
                ErrorClass::Arg,
                format!(
                    "{CONNECT_TIMEOUT_ENV}={text:?}: expected whole seconds, at least 1 \
                     (unset: wait for an answer for as long as it takes)"
                ),
            )),
        },
    }
}

/// Polls between checks of the queue pairs to peers that hold an offer
/// of this rank's memory (see [`VerbsTransport::check_offers`]).
const OFFER_CHECK_POLLS: u64 = 64;

/// Polls between sweeps of the registration cache for idle registrations
/// of freed memory ([`RegCache::sweep`]: about a microsecond per idle
/// registration, at most 64): a fraction of a second while a rank spins.
const CACHE_SWEEP_POLLS: u64 = 1 << 20;

/// Page-aligned memory the NIC reads and writes: buffers ("frames") of
/// `len` bytes each ([`FRAME_LEN`] for the packet stream, [`RMA_LEN`] for
/// staging).
struct Frames {
    ptr: *mut u8,
    layout: Layout,
    len: usize,
}

// SAFETY: `Frames` owns its allocation; the transport touches it only
// through `&mut self` (one thread at a time), and the NIC only inside the
// frames the transport posted.
unsafe impl Send for Frames {}

impl Frames {
    fn new(count: usize, len: usize) -> Result<Frames> {
        let layout = Layout::from_size_align(count * len, 4096)
            .map_err(|e| Error::new(ErrorClass::NoMem, format!("verbs frame buffers: {e}")))?;
        // SAFETY: the layout has a non-zero size (count > 0 for every caller).
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(Error::new(
                ErrorClass::NoMem,
                format!("verbs: no memory for {} bytes of frames", layout.size()),
            ));
        }
        Ok(Frames { ptr, layout, len })
    }

    fn addr(&self, index: usize) -> u64 {
        self.ptr as u64 + (index * self.len) as u64
    }

    /// Frame `index`.
    ///
    /// # Safety
    /// No work the NIC may still do touches the frame: a receive frame
    /// whose completion was polled and that is not posted again, or a send
    /// frame that is not posted.
    unsafe fn frame(&mut self, index: usize) -> &mut [u8] {
        debug_assert!((index + 1) * self.len <= self.layout.size());
        // SAFETY: in bounds of the allocation (the callers' indices are
        // below the count it was made for); the caller promises the NIC
        // does not touch it, and `&mut self` that nothing else does.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(index * self.len), self.len) }
    }
}

impl Drop for Frames {
    fn drop(&mut self) {
        // SAFETY: allocated in `Frames::new` with this layout; the regions
        // that cover it are dropped first (field order of the transport).
        unsafe { std::alloc::dealloc(self.ptr, self.layout) }
    }
}

/// Where a queued packet's payload is.
enum Payload {
    /// Copied when the packet could not leave at once.
    Owned(Vec<u8>),
    /// The caller's memory (`send_zcopy`, or `send` while it runs).
    Borrowed { ptr: *const u8, len: usize },
}

/// A packet on its way out.
struct Outgoing {
    head: [u8; HEADER_LEN],
    payload: Payload,
    /// Stream bytes already framed.
    offset: usize,
    /// The `send_zcopy` token to report once every byte is framed.
    token: Option<u64>,
}

// SAFETY: a borrowed payload is valid until its completion is reported (the
// contract of `send_zcopy`), whichever thread holds the transport.
unsafe impl Send for Outgoing {}

impl Outgoing {
    fn payload(&self) -> &[u8] {
        match &self.payload {
            Payload::Owned(v) => v,
            // SAFETY: the caller of `send`/`send_zcopy` keeps it valid and
            // unmodified until the packet is framed or the peer fails.
            Payload::Borrowed { ptr, len } => unsafe { std::slice::from_raw_parts(*ptr, *len) },
        }
    }

    fn total(&self) -> usize {
        HEADER_LEN + self.payload().len()
    }

    /// Copies the next stream bytes into `out`; returns how many.
    fn fill(&mut self, out: &mut [u8]) -> usize {
        let mut n = 0;
        if self.offset < HEADER_LEN {
            let k = (HEADER_LEN - self.offset).min(out.len());
            out[..k].copy_from_slice(&self.head[self.offset..self.offset + k]);
            self.offset += k;
            n = k;
        }
        if self.offset >= HEADER_LEN {
            let start = self.offset - HEADER_LEN;
            let payload = self.payload();
            let k = (payload.len() - start).min(out.len() - n);
            out[n..n + k].copy_from_slice(&payload[start..start + k]);
            self.offset += k;
            n += k;
        }
        n
    }
}

/// The packet being received from a peer.
struct Incoming {
    head: [u8; HEADER_LEN],
    have: usize,
    /// The payload under way: its slot, length and bytes placed.
    body: Option<(Option<PayloadSlot>, u64, u64)>,
}

impl Incoming {
    fn new() -> Incoming {
        Incoming {
            head: [0; HEADER_LEN],
            have: 0,
            body: None,
        }
    }

    /// Parses `bytes`, the next bytes of `peer`'s stream, handing headers
    /// and payloads to `sink`. An error is a protocol violation.
    fn feed(&mut self, peer: PeerRank, mut bytes: &[u8], sink: &mut dyn PacketSink) -> Result<()> {
        while !bytes.is_empty() {
            let Some((slot, total, done)) = self.body.as_mut() else {
                let k = (HEADER_LEN - self.have).min(bytes.len());
                self.head[self.have..self.have + k].copy_from_slice(&bytes[..k]);
                self.have += k;
                bytes = &bytes[k..];
                if self.have == HEADER_LEN {
                    self.have = 0;
                    let header = Header::decode(&self.head)?;
                    let slot = sink.on_header(peer, &header)?;
                    if header.payload_len() == 0 {
                        if let Some(slot) = slot {
                            sink.on_payload(peer, slot);
                        }
                    } else {
                        self.body = Some((slot, header.payload_len(), 0));
                    }
                }
                continue;
            };
            let k = ((*total - *done) as usize).min(bytes.len());
            if let Some(slot) = *slot {
                let dest = sink.payload_buffer(slot);
                let at = (*done as usize).min(dest.len());
                let fits = (dest.len() - at).min(k);
                dest[at..at + fits].copy_from_slice(&bytes[..fits]);
            }
            *done += k as u64;
            bytes = &bytes[k..];
            if *done == *total {
                let slot = *slot;
                self.body = None;
                if let Some(slot) = slot {
                    sink.on_payload(peer, slot);
                }
            }
        }
        Ok(())
    }
}

// A connection message and its GRH fit a UD buffer and the smallest MTU.
const _: () = assert!(GRH_LEN + MESSAGE_LEN <= UD_BUF && MESSAGE_LEN <= UD_MAX_PAYLOAD);

/// Where a peer's connection messages go: its UD queue pair.
struct Channel<A> {
    gid: Gid,
    lid: u16,
    ud_qpn: u32,
    /// The address handle to its port, made on first use.
    ah: Option<A>,
}

/// How far the connection to a peer is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Link {
    /// No queue pair to it yet.
    Idle,
    /// This rank made its queue pair and asks the peer to connect to it.
    Requested,
    /// Connected at the peer's request (RTS), but nothing is sent until
    /// the peer's reply or first frame shows that its side is connected
    /// too.
    Accepted,
    /// Both sides are connected.
    Ready,
}

/// When this rank asks a peer to connect: since `since`, last at `sent`,
/// again after `wait`.
#[derive(Clone, Copy, Debug)]
struct Asking {
    since: Instant,
    sent: Instant,
    wait: Duration,
}

/// What the transport knows of one peer.
struct Peer<Q, A> {
    /// The queue pair to it, made on first use (this rank's or the peer's).
    qp: Option<Q>,
    /// Where its connection messages go, from its card or its first message.
    channel: Option<Channel<A>>,
    link: Link,
    /// Requests to it sent and not yet answered.
    asking: Option<Asking>,
    /// A requester's first frame on a new connection, sent even when empty:
    /// it tells the peer that both sides are connected.
    announce: bool,
    /// The peer's queue pair, once connected to it.
    remote: Option<QpAddress>,
    /// Why the peer is lost, once it is.
    failed: Option<Error>,
    /// Frames with stream bytes this rank may still send it.
    credits: u32,
    /// Credits this rank owes it (its frames taken out of the buffers).
    owed: u32,
    /// Packets waiting to be framed.
    queue: VecDeque<Outgoing>,
    /// Sends posted and not completed.
    in_flight: u32,
    incoming: Incoming,
    /// Whether a frame came from it during the current poll.
    heard: bool,
    /// One-sided operations posted to it and not completed.
    rma_in_flight: u32,
    /// Rendezvous reads from it posted and not completed.
    reads_in_flight: u32,
    /// This rank's buffers offered to it for a rendezvous: (rkey, lease).
    offers: Vec<(u32, u64)>,
}

impl<Q, A> Peer<Q, A> {
    fn new() -> Peer<Q, A> {
        Peer {
            qp: None,
            channel: None,
            link: Link::Idle,
            asking: None,
            announce: false,
            remote: None,
            failed: None,
            credits: CREDITS,
            owed: 0,
            queue: VecDeque::new(),
            in_flight: 0,
            incoming: Incoming::new(),
            heard: false,
            rma_in_flight: 0,
            reads_in_flight: 0,
            offers: Vec::new(),
        }
    }
}

/// The receive buffers posted for one connected peer: [`CREDITS`] for
/// frames with stream bytes and as many for credit-only frames, shared
/// with every peer through the shared receive queue.
struct RecvChunk<M> {
    /// Declared before the frames: deregistered before they are freed.
    mr: M,
    frames: Frames,
}

/// Receive buffers per chunk.
const CHUNK_FRAMES: usize = 2 * CREDITS as usize;
/// Peers a rank connects to at most: their receive buffers must fit the
/// shared receive queue, and NICs hold about 32 Ki receives in one
/// (mlx5: 32767), so a queue sized for every rank of a large job could
/// not be made.
pub const MAX_CONNECTED: usize = 1023;

/// A rendezvous read under way: `len` bytes from the peer's offered
/// buffer into this rank's, in RDMA READs of at most [`READ_CHUNK`].
struct Read {
    peer: PeerRank,
    /// The ADI's receive.
    token: u64,
    remote: u64,
    rkey: u32,
    local: u64,
    /// The registration of the local buffer.
    lkey: u32,
    lease: u64,
    len: usize,
    /// Bytes covered by posted READs.
    posted: usize,
    /// READs posted and not completed.
    in_flight: u32,
    /// Why it failed, once a READ did.
    error: Option<Error>,
}

/// A one-sided operation under way, by staging slot.
struct RmaPosted {
    peer: PeerRank,
    /// The id `rdma_post` returned.
    id: u64,
    /// Bytes of the staging buffer its completion hands back.
    result_len: usize,
}

/// Bytes an operation of the one-sided channel moves: what it writes or
/// reads, or an atomic's word.
fn rma_len(op: RdmaOp<'_>) -> usize {
    match op {
        RdmaOp::Write(data) => data.len(),
        RdmaOp::Read(len) => len,
        RdmaOp::FetchAdd(_) | RdmaOp::CompareSwap { .. } => 8,
    }
}

/// The verbs transport over a provider's NIC `N`: see the module docs.
pub struct VerbsTransport<N: Nic> {
    rank: PeerRank,
    /// The provider field of the card ([`provider_tag`]).
    tag: String,
    card: String,
    /// Index by rank; `None` at the own rank.
    peers: Vec<Option<Peer<N::Qp, N::Ah>>>,
    by_qpn: HashMap<u32, PeerRank>,
    srq: N::Srq,
    cq: N::Cq,
    /// The completion queue's channel, on which a blocked wait sleeps
    /// (declared after it: destroyed after it).
    channel: N::Channel,
    /// Completions taken while arming the channel, for the next poll.
    stash: Vec<WorkCompletion>,
    /// The job's secret, which authenticates connection messages.
    secret: [u8; 32],
    size: usize,
    qkey: u32,
    /// The connection channel: its queue pair, and buffers for
    /// [`UD_RECVS`] receives and [`UD_SENDS`] sends.
    ud: N::Ud,
    ud_mr: N::Mr,
    ud_frames: Frames,
    ud_free: Vec<usize>,
    /// Peers asked to connect, until both sides are connected.
    requesting: Vec<PeerRank>,
    /// How long a peer may leave requests unanswered ([`CONNECT_TIMEOUT_ENV`]).
    connect_timeout: Option<Duration>,
    /// Receive buffers, a chunk per connected peer.
    recv_chunks: Vec<RecvChunk<N::Mr>>,
    send_mr: N::Mr,
    send_frames: Frames,
    free_send: Vec<usize>,
    /// Which peer each posted send frame went to.
    send_owner: Vec<Option<PeerRank>>,
    completed: Vec<u64>,
    failures: Vec<(PeerRank, Error)>,
    wcs: Vec<WorkCompletion>,
    max_send_wr: u32,
    /// Memory registered for peers' one-sided operations, by handle.
    regions: HashMap<u64, N::Mr>,
    next_region: u64,
    rma_mr: N::Mr,
    rma_frames: Frames,
    rma_free: Vec<usize>,
    rma_posted: Vec<Option<RmaPosted>>,
    /// Outcomes of completed one-sided operations, until taken.
    rma_done: HashMap<u64, Result<Vec<u8>>>,
    next_rma: u64,
    /// Registrations of user buffers for the zero-copy rendezvous.
    cache: RegCache<N::Mr>,
    /// Rendezvous reads under way, by id.
    reads: HashMap<u64, Read>,
    /// Reads with bytes left to post, oldest first.
    read_queue: VecDeque<u64>,
    /// Ended reads, for the next poll to report: (peer, token, outcome).
    read_outcomes: Vec<(PeerRank, u64, Result<usize>)>,
    next_read: u64,
    /// A registration failed: long messages go in frames from now on.
    remote_copy_off: bool,
    polls: u64,
    pd: N::Pd,
    nic: N,
}

/// Starts the verbs transport with the provider `OXMPI_VERBS_PROVIDER`
/// names: the soft one only when asked for; the default, rdma-core, fails
/// with [`ErrorClass::Other`] (the transport is left out) when no device is
/// found or the build has no rdma-core support, saying why under
/// `OXMPI_VERBOSE=1`. A bad setting is an [`ErrorClass::Arg`] error.
pub fn start(job: &JobInfo) -> Result<Box<dyn Transport>> {
    match ProviderKind::from_env()? {
        ProviderKind::Soft => Ok(Box::new(VerbsTransport::new(
            crate::soft::SoftNic::open()?,
            ProviderKind::Soft,
            job,
        )?)),
        ProviderKind::RdmaCore => {
            let selection = crate::rdma_core::Selection::from_env()?;
            #[cfg(feature = "rdma-core")]
            let why = match crate::rdma_core::RdmaNic::open(&selection)? {
                Some(nic) => {
                    return Ok(Box::new(VerbsTransport::new(
                        nic,
                        ProviderKind::RdmaCore,
                        job,
                    )?))
                }
                None => "rdma-core found no usable device".to_owned(),
            };
            #[cfg(not(feature = "rdma-core"))]
            let why = match crate::rdma_core::discover(&selection)? {
                crate::rdma_core::Discovery::NoDevice(why) => why,
                crate::rdma_core::Discovery::Found { device, .. } => {
                    format!("device {device} found, but this build cannot open it")
                }
            };
            Err(Error::new(
                ErrorClass::Other,
                format!(
                    "no RDMA device for the verbs transport: {why} \
                     (OXMPI_VERBS_PROVIDER=soft selects the software provider)"
                ),
            ))
        }
    }
}

/// The provider field of this process's card: `rdma`, or for the soft
/// provider, whose NICs reach only those of the same host and network
/// namespace (abstract Unix sockets), `soft@<boot id>:<netns>:<pidns>` (the
/// [host identity](HostId)). Two cards
/// reach each other when these fields are equal.
fn provider_tag(kind: ProviderKind) -> Result<String> {
    match kind {
        ProviderKind::RdmaCore => Ok("rdma".to_owned()),
        ProviderKind::Soft => {
            let host = HostId::current()
                .map_err(|e| Error::os("soft verbs provider: reading the host identity", e))?;
            let tag = format!("soft@{host}");
            if tag.contains(',') || tag.len() > 64 {
                return Err(Error::new(
                    ErrorClass::Other,
                    format!("soft verbs provider: host identity {tag:?} does not fit a card"),
                ));
            }
            Ok(tag)
        }
    }
}

/// A peer's card, decoded.
struct Card {
    /// The provider field ([`provider_tag`]).
    tag: String,
    gid: Gid,
    lid: u16,
    /// Its UD queue pair, where connection requests go.
    ud_qpn: u32,
}

fn parse_card(card: &str) -> Result<Card> {
    let bad = |why: &str| {
        Error::new(
            ErrorClass::Other,
            format!("verbs business card {card:?} is not valid: {why}"),
        )
    };
    let fields: Vec<&str> = card.split(',').collect();
    if fields.len() != 6 || fields[0] != CARD_TAG {
        return Err(bad(
            "expected verbs2,<provider>,<gid>,<lid>,<mtu>,<UD queue pair>",
        ));
    }
    let tag = fields[1];
    let soft_host = tag
        .strip_prefix("soft@")
        .and_then(|host| host.parse::<HostId>().ok());
    if tag != "rdma" && soft_host.is_none() {
        return Err(bad(
            "the provider must be rdma or soft@<boot id>:<netns>:<pidns>",
        ));
    }
    // The GID, LID and MTU in the form QpAddress's own card has.
    let address =
        QpAddress::from_card(&format!("v1:{}:{}:1:0:{}", fields[2], fields[3], fields[4]))
            .map_err(|e| bad(e.message()))?;
    let ud_qpn = u32::from_str_radix(fields[5], 16).map_err(|_| bad("bad UD queue pair number"))?;
    if ud_qpn == 0 || ud_qpn >= 1 << 24 {
        return Err(bad("queue pair numbers have 24 bits and are not 0"));
    }
    Ok(Card {
        tag: tag.to_owned(),
        gid: address.gid,
        lid: address.lid,
        ud_qpn,
    })
}

/// The error of a one-sided operation that completed with `status`.
fn rma_error(peer: PeerRank, status: WcStatus) -> Error {
    match status {
        WcStatus::RemAccessErr => Error::new(
            ErrorClass::RmaRange,
            format!(
                "rank {peer}'s NIC refused a one-sided operation (REM_ACCESS_ERR): the memory \
                 key is revoked (the window was freed) or the range or right is outside its \
                 registration"
            ),
        ),
        WcStatus::RemInvReqErr => Error::new(
            ErrorClass::RmaRange,
            format!(
                "rank {peer}'s NIC refused a one-sided operation as invalid (REM_INV_REQ_ERR: \
                 a misaligned atomic)"
            ),
        ),
        status => proc_failed(
            peer,
            format!("a one-sided operation completed with {status:?}"),
        ),
    }
}

/// The `wr_id` of receive buffer `index` of chunk `chunk`.
fn recv_wr_id(chunk: usize, index: usize) -> u64 {
    RECV_BIT | (chunk * CHUNK_FRAMES + index) as u64
}

fn proc_failed(peer: PeerRank, why: impl std::fmt::Display) -> Error {
    Error::new(
        ErrorClass::ProcFailed,
        format!("verbs transport: rank {peer} is lost: {why}"),
    )
}

impl<N: Nic> VerbsTransport<N> {
    /// Builds the transport of rank `job.rank` on `nic`: its queues,
    /// buffers and connection channel (a UD queue pair), and its card.
    /// Queue pairs to peers are made on first use.
    pub fn new(nic: N, kind: ProviderKind, job: &JobInfo) -> Result<VerbsTransport<N>> {
        let connect_timeout =
            parse_connect_timeout(std::env::var(CONNECT_TIMEOUT_ENV).ok().as_deref())?;
        let peers_n = job.size.saturating_sub(1).max(1);
        let recv_count = peers_n.min(MAX_CONNECTED) * CHUNK_FRAMES;
        let pd = nic.alloc_pd()?;
        // Room for every completion that can be outstanding: receives,
        // sends, one-sided operations, rendezvous reads and datagrams.
        let channel = nic.create_comp_channel()?;
        let cq = nic.create_cq(
            (recv_count
                + SEND_SLOTS
                + RMA_SLOTS
                + peers_n.min(MAX_CONNECTED) * READ_DEPTH as usize
                + UD_RECVS
                + UD_SENDS) as u32,
            Some(&channel),
        )?;
        // Room for the buffers of every peer, posted as peers connect.
        let srq = nic.create_srq(&pd, recv_count as u32)?;
        let send_frames = Frames::new(SEND_SLOTS, FRAME_LEN)?;
        let rma_frames = Frames::new(RMA_SLOTS, RMA_LEN)?;
        let ud_frames = Frames::new(UD_RECVS + UD_SENDS, UD_BUF)?;
        // SAFETY: the frames stay allocated until the transport is dropped,
        // after the regions (field order); the transport makes slices of a
        // frame only while no work on it is posted.
        let send_mr = unsafe {
            nic.register(
                &pd,
                send_frames.ptr,
                SEND_SLOTS * FRAME_LEN,
                AccessFlags::NONE,
            )?
        };
        // SAFETY: as above; staging buffers are touched only while no
        // operation on them is posted.
        let rma_mr = unsafe {
            nic.register(
                &pd,
                rma_frames.ptr,
                RMA_SLOTS * RMA_LEN,
                AccessFlags::LOCAL_WRITE,
            )?
        };
        // SAFETY: as above.
        let ud_mr = unsafe {
            nic.register(
                &pd,
                ud_frames.ptr,
                (UD_RECVS + UD_SENDS) * UD_BUF,
                AccessFlags::LOCAL_WRITE,
            )?
        };
        let ud = nic.create_ud(
            &pd,
            &QpInit {
                send_cq: &cq,
                recv_cq: &cq,
                srq: None,
                caps: QpCaps {
                    max_send_wr: UD_SENDS as u32,
                    max_recv_wr: UD_RECVS as u32,
                    max_inline_data: 0,
                },
            },
        )?;
        let port = nic.port().clone();
        let qkey = connect::qkey(&job.secret);
        ud.ready(&UdAttr {
            port: port.port,
            pkey_index: 0,
            qkey,
            sq_psn: 0,
        })?;
        for index in 0..UD_RECVS {
            ud.post_recv(&RecvWr {
                wr_id: UD_BIT | index as u64,
                sge: Sge {
                    addr: ud_frames.addr(index),
                    length: UD_BUF as u32,
                    lkey: ud_mr.lkey(),
                },
            })
            .map_err(Error::from)?;
        }
        let max_send_wr = 2 * CREDITS + 2;
        let tag = provider_tag(kind)?;
        let card = format!(
            "{CARD_TAG},{},{},{},{},{:x}",
            tag,
            port.gid
                .gid
                .0
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>(),
            port.lid,
            port.active_mtu.bytes(),
            ud.qp_num()
        );
        let peers = (0..job.size)
            .map(|rank| (rank != job.rank).then(Peer::new))
            .collect();
        Ok(VerbsTransport {
            rank: job.rank,
            tag,
            card,
            peers,
            by_qpn: HashMap::new(),
            srq,
            cq,
            channel,
            stash: Vec::new(),
            secret: job.secret,
            size: job.size,
            qkey,
            ud,
            ud_mr,
            ud_frames,
            ud_free: (UD_RECVS..UD_RECVS + UD_SENDS).rev().collect(),
            requesting: Vec::new(),
            connect_timeout,
            recv_chunks: Vec::new(),
            send_mr,
            send_frames,
            free_send: (0..SEND_SLOTS).rev().collect(),
            send_owner: vec![None; SEND_SLOTS],
            completed: Vec::new(),
            failures: Vec::new(),
            wcs: Vec::with_capacity(POLL_BATCH),
            max_send_wr,
            regions: HashMap::new(),
            next_region: 0,
            rma_mr,
            rma_frames,
            rma_free: (0..RMA_SLOTS).rev().collect(),
            rma_posted: (0..RMA_SLOTS).map(|_| None).collect(),
            rma_done: HashMap::new(),
            next_rma: 0,
            cache: RegCache::new(),
            reads: HashMap::new(),
            read_queue: VecDeque::new(),
            read_outcomes: Vec::new(),
            next_read: 0,
            remote_copy_off: false,
            polls: 0,
            pd,
            nic,
        })
    }

    fn peer_mut(&mut self, peer: PeerRank) -> Result<&mut Peer<N::Qp, N::Ah>> {
        match self.peers.get_mut(peer) {
            Some(Some(p)) => Ok(p),
            _ => Err(Error::new(
                ErrorClass::Rank,
                format!("verbs transport: no queue pair to rank {peer}"),
            )),
        }
    }

    /// Takes `peer`'s card: where its connection requests go. Connects
    /// nothing (that happens on first use).
    fn learn(&mut self, peer: PeerRank, card: &str) -> Result<()> {
        let parsed = parse_card(card)?;
        if parsed.tag != self.tag {
            return Err(Error::new(
                ErrorClass::Other,
                format!(
                    "rank {peer}'s verbs card is for provider {}, this rank runs {} \
                     (the soft provider reaches only its own host, network namespace and PID namespace)",
                    parsed.tag, self.tag
                ),
            ));
        }
        let p = self.peer_mut(peer)?;
        if p.channel.is_none() {
            p.channel = Some(Channel {
                gid: parsed.gid,
                lid: parsed.lid,
                ud_qpn: parsed.ud_qpn,
                ah: None,
            });
        }
        Ok(())
    }

    /// Makes the queue pair to `peer` and posts the receive buffers it
    /// brings; any failure fails the peer.
    fn make_qp(&mut self, peer: PeerRank) -> Result<()> {
        let made = (|| {
            if self.recv_chunks.len() >= MAX_CONNECTED {
                return Err(Error::new(
                    ErrorClass::Other,
                    format!(
                        "this rank is connected to {MAX_CONNECTED} peers over verbs, the most \
                         its shared receive queue serves"
                    ),
                ));
            }
            let qp = self.nic.create_qp(
                &self.pd,
                &QpInit {
                    send_cq: &self.cq,
                    recv_cq: &self.cq,
                    srq: Some(&self.srq),
                    caps: QpCaps {
                        max_send_wr: self.max_send_wr + RMA_DEPTH + READ_DEPTH,
                        max_recv_wr: 1,
                        max_inline_data: 0,
                    },
                },
            )?;
            let frames = Frames::new(CHUNK_FRAMES, FRAME_LEN)?;
            // SAFETY: the frames are freed after the region (field order
            // of `RecvChunk`), which the transport keeps until it is
            // dropped; slices of a frame are made only while it is not
            // posted.
            let mr = unsafe {
                self.nic.register(
                    &self.pd,
                    frames.ptr,
                    CHUNK_FRAMES * FRAME_LEN,
                    AccessFlags::LOCAL_WRITE,
                )?
            };
            let chunk = self.recv_chunks.len();
            for index in 0..CHUNK_FRAMES {
                self.srq
                    .post_recv(&RecvWr {
                        wr_id: recv_wr_id(chunk, index),
                        sge: Sge {
                            addr: frames.addr(index),
                            length: FRAME_LEN as u32,
                            lkey: mr.lkey(),
                        },
                    })
                    .map_err(Error::from)?;
            }
            self.recv_chunks.push(RecvChunk { mr, frames });
            Ok::<_, Error>(qp)
        })();
        match made {
            Ok(qp) => {
                self.by_qpn.insert(qp.qp_num(), peer);
                self.peer_mut(peer)?.qp = Some(qp);
                Ok(())
            }
            Err(e) => {
                let error = proc_failed(
                    peer,
                    format!("no queue pair could be made for it: {}", e.message()),
                );
                self.fail(peer, error.clone());
                Err(error)
            }
        }
    }

    /// Starts connecting to `peer` if nothing has: makes the queue pair
    /// and sends the first request. An error if the peer failed.
    fn connect_start(&mut self, peer: PeerRank) -> Result<()> {
        let p = self.peer_mut(peer)?;
        if let Some(e) = &p.failed {
            return Err(e.clone());
        }
        if p.link != Link::Idle {
            return Ok(());
        }
        if p.channel.is_none() {
            return Err(Error::new(
                ErrorClass::Intern,
                format!("verbs transport: rank {peer} was not added before a send to it"),
            ));
        }
        self.make_qp(peer)?;
        let now = Instant::now();
        let p = self.peer_mut(peer)?;
        p.link = Link::Requested;
        p.asking = Some(Asking {
            since: now,
            sent: now,
            wait: RETRY_FIRST,
        });
        self.requesting.push(peer);
        self.send_message(peer, Kind::Request, 0);
        Ok(())
    }

    /// Sends `peer` a connection message about this rank's queue pair to
    /// it. A message that cannot be sent now (no free buffer) is dropped
    /// like a lost datagram: requests are sent again until answered, and
    /// each brings its reply again.
    fn send_message(&mut self, peer: PeerRank, kind: Kind, echo: u32) {
        let port = self.nic.port();
        let (gid, lid, mtu, rank) = (port.gid.gid, port.lid, port.active_mtu, self.rank);
        let ud_qpn = self.ud.qp_num();
        let Some(Some(p)) = self.peers.get_mut(peer) else {
            return;
        };
        let (Some(qp), Some(channel)) = (&p.qp, &mut p.channel) else {
            return;
        };
        if channel.ah.is_none() {
            match self.nic.create_ah(
                &self.pd,
                &AhAttr {
                    gid: channel.gid,
                    lid: channel.lid,
                },
            ) {
                Ok(ah) => channel.ah = Some(ah),
                Err(e) => {
                    let error = proc_failed(
                        peer,
                        format!("no address handle to its port: {}", e.message()),
                    );
                    self.fail(peer, error);
                    return;
                }
            }
        }
        let Some(slot) = self.ud_free.pop() else {
            return;
        };
        let address = qp.address();
        let message = Message {
            kind,
            from: rank as u32,
            to: peer as u32,
            gid,
            lid,
            mtu,
            ud_qpn,
            qpn: address.qpn,
            psn: address.psn,
            echo,
        };
        // SAFETY: a free UD send buffer is not posted.
        let buf = unsafe { self.ud_frames.frame(slot) };
        buf[..MESSAGE_LEN].copy_from_slice(&message.encode(&self.secret));
        let wr = UdSendWr {
            wr_id: UD_BIT | slot as u64,
            signaled: true,
            sge: Sge {
                addr: self.ud_frames.addr(slot),
                length: MESSAGE_LEN as u32,
                lkey: self.ud_mr.lkey(),
            },
            ah: channel.ah.as_ref().expect("made above"),
            remote_qpn: channel.ud_qpn,
            remote_qkey: self.qkey,
        };
        if let Err(e) = self.ud.post_send(&wr) {
            self.ud_free.push(slot);
            oxmpi_adi::vlog!(
                "rank {rank}: verbs: a connection message to rank {peer} could not be posted: {}",
                Error::from(e).message()
            );
        }
    }

    /// A completion of the connection channel: a datagram arrived (its
    /// buffer is posted again), or one was sent.
    fn ud_complete(&mut self, wc: WorkCompletion) {
        let index = (wc.wr_id & !UD_BIT) as usize;
        if index >= UD_RECVS {
            self.ud_free.push(index);
            return;
        }
        if wc.status == WcStatus::Success && wc.byte_len as usize == GRH_LEN + MESSAGE_LEN {
            // SAFETY: the receive's completion was polled, and the buffer
            // is posted again only after this copy.
            let buf = unsafe { self.ud_frames.frame(index) };
            let mut bytes = [0u8; MESSAGE_LEN];
            bytes.copy_from_slice(&buf[GRH_LEN..GRH_LEN + MESSAGE_LEN]);
            match Message::decode(&bytes, &self.secret, self.rank as u32, self.size as u32) {
                Ok(message) => self.on_message(&message),
                Err(why) => oxmpi_adi::vlog!(
                    "rank {}: verbs: dropped a connection datagram: {why}",
                    self.rank
                ),
            }
        } else if wc.status != WcStatus::WrFlushErr {
            oxmpi_adi::vlog!(
                "rank {}: verbs: dropped a datagram of {} bytes ({:?})",
                self.rank,
                wc.byte_len,
                wc.status
            );
        }
        let wr = RecvWr {
            wr_id: wc.wr_id,
            sge: Sge {
                addr: self.ud_frames.addr(index),
                length: UD_BUF as u32,
                lkey: self.ud_mr.lkey(),
            },
        };
        if let Err(e) = self.ud.post_recv(&wr) {
            oxmpi_adi::vlog!(
                "rank {}: verbs: re-posting a datagram buffer failed: {}",
                self.rank,
                Error::from(e).message()
            );
        }
    }

    /// A connection message from a peer. A rank makes one queue pair per
    /// peer, for its own request or for the peer's, whichever comes
    /// first; so when both ranks start at once and their requests cross,
    /// each connects the queue pair it made for its own request to the
    /// one the other's request names, both reply, and the two ranks hold
    /// one pair of queue pairs, connected to each other, with no
    /// tie-break needed. Duplicates (a lost reply, a request sent again)
    /// get the same reply or are ignored.
    fn on_message(&mut self, m: &Message) {
        let peer = m.from as PeerRank;
        let Some(Some(p)) = self.peers.get_mut(peer) else {
            return;
        };
        if p.failed.is_some() {
            return;
        }
        // A rank may hear from a peer before it reads the peer's card.
        let stale = p
            .channel
            .as_ref()
            .is_none_or(|c| (c.gid, c.lid, c.ud_qpn) != (m.gid, m.lid, m.ud_qpn));
        if stale {
            p.channel = Some(Channel {
                gid: m.gid,
                lid: m.lid,
                ud_qpn: m.ud_qpn,
                ah: None,
            });
        }
        let remote = QpAddress {
            gid: m.gid,
            lid: m.lid,
            qpn: m.qpn,
            psn: m.psn,
            mtu: m.mtu,
        };
        match (m.kind, p.link) {
            (Kind::Request, Link::Idle) => {
                if self.make_qp(peer).is_ok() {
                    self.accept(peer, remote);
                }
            }
            // Crossed requests: the peer's reply to this rank's request,
            // still asked for, ends the wait (a reply may be lost).
            (Kind::Request, Link::Requested) => self.accept(peer, remote),
            (Kind::Request, Link::Accepted | Link::Ready)
                if p.remote.is_some_and(|r| r.qpn == m.qpn) =>
            {
                self.send_message(peer, Kind::Reply, m.qpn);
            }
            (Kind::Reply, Link::Requested)
                if p.qp.as_ref().is_some_and(|q| q.qp_num() == m.echo) =>
            {
                if self.connect_qp(peer, remote) {
                    self.ready(peer);
                }
            }
            // Crossed requests: the peer connected to this rank's queue
            // pair, which is connected to the peer's.
            (Kind::Reply, Link::Accepted)
                if p.qp.as_ref().is_some_and(|q| q.qp_num() == m.echo)
                    && p.remote.is_some_and(|r| r.qpn == m.qpn) =>
            {
                self.ready(peer);
            }
            // Duplicates.
            (kind, link) => oxmpi_adi::vlog!(
                "rank {}: verbs: ignored a connection {kind:?} from rank {peer} for queue pair \
                 {:#x} (connection {link:?})",
                self.rank,
                m.qpn
            ),
        }
    }

    /// Both sides of the connection to `peer` are connected: this rank's
    /// first frame (sent even when empty) tells the peer so.
    fn ready(&mut self, peer: PeerRank) {
        let p = self.peers[peer].as_mut().expect("a peer");
        p.link = Link::Ready;
        p.asking = None;
        p.announce = true;
        self.requesting.retain(|&r| r != peer);
        self.pump(peer, false);
    }

    /// Connects the queue pair to `peer` to `remote` at the peer's
    /// request, and replies.
    fn accept(&mut self, peer: PeerRank, remote: QpAddress) {
        if self.connect_qp(peer, remote) {
            self.peers[peer].as_mut().expect("a peer").link = Link::Accepted;
            self.send_message(peer, Kind::Reply, remote.qpn);
        }
    }

    /// Moves the queue pair to `peer` to RTS, connected to `remote`;
    /// whether it worked (if not, the peer failed).
    fn connect_qp(&mut self, peer: PeerRank, remote: QpAddress) -> bool {
        let rank = self.rank;
        let Some(Some(p)) = self.peers.get_mut(peer) else {
            return false;
        };
        let Some(qp) = &p.qp else {
            return false;
        };
        match connect_rc(&self.nic, qp, &remote, &ConnectParams::default()) {
            Ok(()) => {
                p.remote = Some(remote);
                oxmpi_adi::vlog!(
                    "rank {rank}: verbs queue pair {:#x} connected to rank {peer}'s {:#x}",
                    qp.qp_num(),
                    remote.qpn
                );
                true
            }
            Err(e) => {
                let error = proc_failed(
                    peer,
                    format!("connecting the queue pair to it failed: {}", e.message()),
                );
                self.fail(peer, error);
                false
            }
        }
    }

    /// Sends again the requests whose reply is late, and fails the peers
    /// that left them unanswered for longer than the bound, if any
    /// ([`CONNECT_TIMEOUT_ENV`]).
    fn retry_requests(&mut self) {
        if self.requesting.is_empty() {
            return;
        }
        let now = Instant::now();
        for peer in self.requesting.clone() {
            let Some(Some(p)) = self.peers.get_mut(peer) else {
                continue;
            };
            let Some(Asking { since, sent, wait }) = p.asking else {
                self.requesting.retain(|&r| r != peer);
                continue;
            };
            if let Some(bound) = self.connect_timeout.filter(|&b| now - since > b) {
                self.requesting.retain(|&r| r != peer);
                let error = proc_failed(
                    peer,
                    format!(
                        "it left connection requests unanswered for {} s, the bound \
                         {CONNECT_TIMEOUT_ENV} sets (it is gone, or has made no MPI call since)",
                        bound.as_secs()
                    ),
                );
                self.fail(peer, error);
            } else if now - sent >= wait {
                p.asking = Some(Asking {
                    since,
                    sent: now,
                    wait: (wait * 2).min(RETRY_MAX),
                });
                self.send_message(peer, Kind::Request, 0);
            }
        }
    }

    /// Marks `peer` lost: its queued packets are dropped (their zero-copy
    /// tokens are never reported complete) and the ADI is told at the next
    /// poll.
    fn fail(&mut self, peer: PeerRank, error: Error) {
        let Some(Some(p)) = self.peers.get_mut(peer) else {
            return;
        };
        if p.failed.is_some() {
            return;
        }
        oxmpi_adi::vlog!("rank {}: {}", self.rank, error.message());
        p.failed = Some(error.clone());
        p.queue.clear();
        self.requesting.retain(|&r| r != peer);
        // The peer reads no more of what was offered to it.
        for (_, lease) in p.offers.drain(..) {
            self.cache.release(lease);
        }
        self.failures.push((peer, error));
    }

    /// Frames and posts what `peer` has queued, as far as credits, send
    /// buffers and the send queue allow. `credit_only`: also send a frame
    /// that only returns credits.
    fn pump(&mut self, peer: PeerRank, credit_only: bool) -> bool {
        let mut progressed = false;
        loop {
            let Some(Some(p)) = self.peers.get_mut(peer) else {
                return progressed;
            };
            let (Link::Ready, Some(qp)) = (p.link, &p.qp) else {
                return progressed;
            };
            if p.failed.is_some() || p.in_flight >= self.max_send_wr {
                return progressed;
            }
            let data = !p.queue.is_empty() && p.credits > 0;
            let credit_frame = (credit_only && p.owed > 0) || p.announce;
            if !data && !credit_frame {
                return progressed;
            }
            let Some(slot) = self.free_send.pop() else {
                return progressed;
            };
            // SAFETY: a free send frame is not posted.
            let frame = unsafe { self.send_frames.frame(slot) };
            frame[..FRAME_HEAD].copy_from_slice(&p.owed.to_le_bytes());
            let mut len = FRAME_HEAD;
            if data {
                while let Some(out) = p.queue.front_mut() {
                    len += out.fill(&mut frame[len..]);
                    if out.offset < out.total() {
                        break;
                    }
                    if let Some(token) = out.token {
                        self.completed.push(token);
                    }
                    p.queue.pop_front();
                    if len == FRAME_LEN {
                        break;
                    }
                }
            }
            let wr = SendWr {
                wr_id: slot as u64,
                signaled: true,
                op: SendOp::Send(Sge {
                    addr: self.send_frames.addr(slot),
                    length: len as u32,
                    lkey: self.send_mr.lkey(),
                }),
            };
            match qp.post_send(&wr) {
                Ok(()) => {
                    p.owed = 0;
                    p.announce = false;
                    if data {
                        p.credits -= 1;
                    }
                    p.in_flight += 1;
                    self.send_owner[slot] = Some(peer);
                    progressed = true;
                    if !data {
                        return progressed;
                    }
                }
                Err(e) => {
                    self.free_send.push(slot);
                    let why = match e {
                        PostError::QueueFull => {
                            "its send queue is full with the queued bytes framed".to_owned()
                        }
                        PostError::Invalid(e) => e.message().to_owned(),
                    };
                    self.fail(
                        peer,
                        proc_failed(peer, format!("posting a send failed: {why}")),
                    );
                    return progressed;
                }
            }
        }
    }

    /// Handles one completion.
    fn complete(&mut self, wc: WorkCompletion, sink: &mut dyn PacketSink) {
        let peer = self.by_qpn.get(&wc.qp_num).copied();
        if wc.wr_id & UD_BIT != 0 {
            self.ud_complete(wc);
            return;
        }
        if wc.wr_id & RECV_BIT != 0 {
            let at = (wc.wr_id & !RECV_BIT) as usize;
            let (chunk, index) = (at / CHUNK_FRAMES, at % CHUNK_FRAMES);
            if chunk >= self.recv_chunks.len() {
                return;
            }
            if let Some(peer) = peer {
                if wc.status == WcStatus::Success && wc.opcode == WcOpcode::Recv {
                    self.received(peer, chunk, index, wc.byte_len as usize, sink);
                } else if wc.status != WcStatus::WrFlushErr {
                    self.fail(
                        peer,
                        proc_failed(peer, format!("a receive completed with {:?}", wc.status)),
                    );
                }
            }
            let RecvChunk { mr, frames } = &self.recv_chunks[chunk];
            let wr = RecvWr {
                wr_id: wc.wr_id,
                sge: Sge {
                    addr: frames.addr(index),
                    length: FRAME_LEN as u32,
                    lkey: mr.lkey(),
                },
            };
            if let Err(e) = self.srq.post_recv(&wr) {
                oxmpi_adi::vlog!(
                    "rank {}: verbs: re-posting a receive buffer failed: {}",
                    self.rank,
                    Error::from(e).message()
                );
            }
            return;
        }
        if wc.wr_id & RMA_BIT != 0 {
            self.rma_complete(wc);
            return;
        }
        if wc.wr_id & READ_BIT != 0 {
            self.read_complete(wc);
            return;
        }
        let slot = wc.wr_id as usize;
        if let Some(owner) = self.send_owner.get_mut(slot).and_then(Option::take) {
            self.free_send.push(slot);
            if let Some(Some(p)) = self.peers.get_mut(owner) {
                p.in_flight -= 1;
            }
            if wc.status != WcStatus::Success && wc.status != WcStatus::WrFlushErr {
                self.fail(
                    owner,
                    proc_failed(
                        owner,
                        format!("a send completed with {:?} (the connection broke, or the peer refused it)", wc.status),
                    ),
                );
            } else if wc.status == WcStatus::WrFlushErr {
                let reason = self.error_state_reason(owner);
                self.fail(owner, proc_failed(owner, reason));
            }
        }
    }

    /// A frame from `peer` landed in receive buffer `index` of `chunk`.
    fn received(
        &mut self,
        peer: PeerRank,
        chunk: usize,
        index: usize,
        len: usize,
        sink: &mut dyn PacketSink,
    ) {
        // SAFETY: the receive's completion was polled and the buffer is not
        // posted again until this frame is handled.
        let frame = unsafe { self.recv_chunks[chunk].frames.frame(index) };
        let Some(Some(p)) = self.peers.get_mut(peer) else {
            return;
        };
        if p.failed.is_some() {
            return;
        }
        p.heard = true;
        // The requester's first frame: its side is connected too.
        if p.link == Link::Accepted {
            p.link = Link::Ready;
            // Asked for only after crossed requests; answered now.
            p.asking = None;
        }
        if !(FRAME_HEAD..=FRAME_LEN).contains(&len) {
            let error = proc_failed(peer, format!("it sent a frame of {len} bytes"));
            self.fail(peer, error);
            return;
        }
        let returned = u32::from_le_bytes(frame[..FRAME_HEAD].try_into().expect("4 bytes"));
        if returned > CREDITS || p.credits + returned > CREDITS {
            let error = proc_failed(
                peer,
                format!("it returned {returned} credits it was never given"),
            );
            self.fail(peer, error);
            return;
        }
        p.credits += returned;
        if len > FRAME_HEAD {
            p.owed += 1;
            if let Err(e) = p.incoming.feed(peer, &frame[FRAME_HEAD..len], sink) {
                self.fail(
                    peer,
                    proc_failed(peer, format!("protocol error: {}", e.message())),
                );
            }
        }
    }

    /// A one-sided operation completed: its outcome waits for
    /// `rdma_take`. An error status leaves the queue pair in the error
    /// state, so the peer fails too.
    fn rma_complete(&mut self, wc: WorkCompletion) {
        let slot = (wc.wr_id & !RMA_BIT) as usize;
        let Some(posted) = self.rma_posted.get_mut(slot).and_then(Option::take) else {
            return;
        };
        self.rma_free.push(slot);
        let peer = posted.peer;
        if let Some(Some(p)) = self.peers.get_mut(peer) {
            p.rma_in_flight -= 1;
        }
        let outcome = if wc.status == WcStatus::Success {
            // SAFETY: the operation's completion was polled: the NIC is
            // done with the staging buffer, which is not posted again
            // before this copy.
            let buf = unsafe { self.rma_frames.frame(slot) };
            Ok(buf[..posted.result_len].to_vec())
        } else {
            let error = rma_error(peer, wc.status);
            if wc.status != WcStatus::WrFlushErr {
                self.fail(peer, proc_failed(peer, error.message()));
            }
            Err(error)
        };
        self.rma_done.insert(posted.id, outcome);
    }

    /// What the registration cache of the zero-copy rendezvous did so far.
    pub fn cache_stats(&self) -> CacheStats {
        self.cache.stats()
    }

    /// A rendezvous READ completed. An error status fails the read (once
    /// its other READs completed too, so nothing writes the buffer after
    /// the ADI hears of it) and, as RC leaves the queue pair in the error
    /// state, the peer.
    fn read_complete(&mut self, wc: WorkCompletion) {
        let id = wc.wr_id & !READ_BIT;
        let Some(read) = self.reads.get_mut(&id) else {
            return;
        };
        let peer = read.peer;
        read.in_flight -= 1;
        if let Some(Some(p)) = self.peers.get_mut(peer) {
            p.reads_in_flight -= 1;
        }
        if wc.status != WcStatus::Success {
            let why = match wc.status {
                WcStatus::RemAccessErr => format!(
                    "its NIC refused a rendezvous read of its send buffer (REM_ACCESS_ERR: the \
                     memory key {:#x} is revoked, or the range lies outside its registration); \
                     the connection to it is broken",
                    read.rkey
                ),
                status => format!("a rendezvous read completed with {status:?}"),
            };
            read.error.get_or_insert_with(|| proc_failed(peer, &why));
            if wc.status != WcStatus::WrFlushErr {
                self.fail(peer, proc_failed(peer, why));
            }
        }
        self.end_read_if_over(id);
    }

    /// Ends read `id` if nothing of it is in flight and it failed or all
    /// of it is read: its registration is released and its outcome waits
    /// for the next poll's report.
    fn end_read_if_over(&mut self, id: u64) {
        let over = self
            .reads
            .get(&id)
            .is_some_and(|r| r.in_flight == 0 && (r.error.is_some() || r.posted == r.len));
        if !over {
            return;
        }
        let Some(read) = self.reads.remove(&id) else {
            return;
        };
        self.read_queue.retain(|&q| q != id);
        self.cache.release(read.lease);
        let outcome = match read.error {
            Some(e) => Err(e),
            None => Ok(read.len),
        };
        self.read_outcomes.push((read.peer, read.token, outcome));
    }

    /// Posts the queued reads' next READs, as far as each peer's
    /// [`READ_DEPTH`] and send queue allow. A read whose peer failed ends
    /// with the peer's error once its posted READs completed.
    fn pump_reads(&mut self) -> bool {
        let mut progressed = false;
        for id in self.read_queue.clone() {
            let Some(read) = self.reads.get_mut(&id) else {
                continue;
            };
            let Some(Some(p)) = self.peers.get_mut(read.peer) else {
                continue;
            };
            if let Some(e) = &p.failed {
                read.error.get_or_insert_with(|| e.clone());
            }
            // The offer came over this connection, so it is ready but for
            // a failure, which the check above reports.
            let (Link::Ready, Some(qp)) = (p.link, &p.qp) else {
                continue;
            };
            while read.error.is_none() && read.posted < read.len && p.reads_in_flight < READ_DEPTH {
                let n = (read.len - read.posted).min(READ_CHUNK);
                let at = read.posted as u64;
                let wr = SendWr {
                    wr_id: READ_BIT | id,
                    signaled: true,
                    op: SendOp::RdmaRead {
                        local: Sge {
                            addr: read.local + at,
                            length: n as u32,
                            lkey: read.lkey,
                        },
                        remote: RemoteAddr {
                            addr: read.remote + at,
                            rkey: read.rkey,
                        },
                    },
                };
                match qp.post_send(&wr) {
                    Ok(()) => {
                        read.posted += n;
                        read.in_flight += 1;
                        p.reads_in_flight += 1;
                        progressed = true;
                    }
                    Err(PostError::QueueFull) => break,
                    Err(PostError::Invalid(e)) => {
                        read.error = Some(proc_failed(
                            read.peer,
                            format!("posting a rendezvous read failed: {}", e.message()),
                        ));
                    }
                }
            }
            if read.error.is_some() || read.posted == read.len {
                self.read_queue.retain(|&q| q != id);
                self.end_read_if_over(id);
            }
        }
        progressed
    }

    /// Fails the peers whose queue pair went to the error state while
    /// they held an offer of this rank's memory. A peer whose READ of an
    /// offered buffer is refused (a remote access error) leaves this
    /// side's queue pair in the error state too, as RC has it, but this
    /// side has nothing posted that would complete with an error, and its
    /// send would wait for ever for the peer's report of the read.
    fn check_offers(&mut self) {
        self.polls += 1;
        if self.polls.is_multiple_of(CACHE_SWEEP_POLLS) {
            self.cache.sweep();
        }
        if self.polls.is_multiple_of(OFFER_CHECK_POLLS) {
            self.fail_broken_offers();
        }
    }

    /// The check of [`VerbsTransport::check_offers`], now.
    fn fail_broken_offers(&mut self) {
        let broken: Vec<PeerRank> = (0..self.peers.len())
            .filter(|&peer| {
                matches!(&self.peers[peer], Some(p) if p.failed.is_none()
                    && !p.offers.is_empty()
                    && p.qp.as_ref().is_some_and(|q| q.state() == QpState::Error))
            })
            .collect();
        for peer in broken {
            let reason = self.error_state_reason(peer);
            self.fail(peer, proc_failed(peer, reason));
        }
    }

    /// Why the pair to `peer` broke, once its queue pair is seen in the
    /// error state (by [`VerbsTransport::fail_broken_offers`], or by a
    /// send flushed from it: which comes first is a race). While the peer
    /// holds an offer of this rank's memory, the likely cause is a
    /// rendezvous read the NIC refused, and the send waiting for that
    /// read must say so.
    fn error_state_reason(&self, peer: PeerRank) -> &'static str {
        if matches!(&self.peers[peer], Some(p) if !p.offers.is_empty()) {
            "its queue pair went to the error state while it was reading this rank's buffer \
             (its NIC refused a rendezvous read, or the connection broke)"
        } else {
            "its queue pair went to the error state"
        }
    }

    /// Queues a packet for `peer` (connecting to it on the first) and
    /// frames what can leave.
    fn queue(&mut self, peer: PeerRank, out: Outgoing) -> Result<()> {
        self.connect_start(peer)?;
        self.peer_mut(peer)?.queue.push_back(out);
        self.pump(peer, false);
        Ok(())
    }
}

impl<N: Nic> Transport for VerbsTransport<N> {
    fn name(&self) -> &'static str {
        "verbs"
    }

    fn card(&self) -> &str {
        &self.card
    }

    fn reachable(&self, card: &str) -> bool {
        parse_card(card).is_ok_and(|c| c.tag == self.tag)
    }

    /// Takes the card and starts connecting: the ADI adds a peer on the
    /// VC's first use (a send, a window's creation, or the peer's first
    /// packet, by when the connection is made).
    fn add_peer(&mut self, peer: PeerRank, card: &str) -> Result<()> {
        self.learn(peer, card)?;
        self.connect_start(peer)
    }

    fn eager_limit(&self) -> usize {
        EAGER_LIMIT
    }

    fn send(&mut self, peer: PeerRank, header: &Header, payload: &[u8]) -> Result<()> {
        self.queue(
            peer,
            Outgoing {
                head: header.encode(),
                payload: Payload::Borrowed {
                    ptr: payload.as_ptr(),
                    len: payload.len(),
                },
                offset: 0,
                token: None,
            },
        )?;
        // What did not leave is copied: the caller's buffer is free on return.
        // (Every earlier `send`'s packet was made owned by its own call,
        // and zero-copy packets carry a token.)
        if let Some(Some(p)) = self.peers.get_mut(peer) {
            for out in p.queue.iter_mut() {
                if out.token.is_none() && matches!(out.payload, Payload::Borrowed { .. }) {
                    out.payload = Payload::Owned(out.payload().to_vec());
                }
            }
        }
        Ok(())
    }

    unsafe fn send_zcopy(
        &mut self,
        peer: PeerRank,
        header: &Header,
        payload: *const u8,
        len: usize,
        token: u64,
    ) -> Result<()> {
        self.queue(
            peer,
            Outgoing {
                head: header.encode(),
                payload: Payload::Borrowed { ptr: payload, len },
                offset: 0,
                token: Some(token),
            },
        )
    }

    fn poll(&mut self, sink: &mut dyn PacketSink) -> Result<bool> {
        let mut progressed = false;
        for p in self.peers.iter_mut().flatten() {
            p.heard = false;
        }
        if !self.stash.is_empty() {
            for wc in std::mem::take(&mut self.stash) {
                self.complete(wc, sink);
            }
            progressed = true;
        }
        loop {
            let mut wcs = std::mem::take(&mut self.wcs);
            wcs.clear();
            let n = self.cq.poll(POLL_BATCH, &mut wcs)?;
            for wc in wcs.drain(..) {
                self.complete(wc, sink);
            }
            self.wcs = wcs;
            progressed |= n > 0;
            if n < POLL_BATCH {
                break;
            }
        }
        for peer in 0..self.peers.len() {
            let Some(Some(p)) = self.peers.get(peer) else {
                continue;
            };
            let credit_only = p.owed >= CREDITS / 2 || (p.owed > 0 && !p.heard);
            progressed |= self.pump(peer, credit_only);
        }
        if !self.read_queue.is_empty() {
            progressed |= self.pump_reads();
        }
        self.retry_requests();
        self.check_offers();
        for token in self.completed.drain(..) {
            sink.on_send_complete(token);
            progressed = true;
        }
        for (peer, token, outcome) in self.read_outcomes.drain(..) {
            sink.on_remote_read(peer, token, outcome);
            progressed = true;
        }
        // A peer with reads in flight is reported once they completed
        // (flushed, or done): the ADI then fails their receives, whose
        // buffers nothing may write any more.
        let mut failures = std::mem::take(&mut self.failures);
        failures.retain(|(peer, error)| {
            if matches!(&self.peers[*peer], Some(p) if p.reads_in_flight > 0) {
                return true;
            }
            sink.on_peer_failed(*peer, error.clone());
            progressed = true;
            false
        });
        self.failures = failures;
        Ok(progressed)
    }

    /// Arms the completion queue: its channel's descriptor becomes
    /// readable at the next completion (a frame or datagram arrived, a
    /// send, read or one-sided operation ended). Completions that came
    /// before the arming raise no event: they are taken now, for the next
    /// poll, and this sleep only yields.
    fn arm_wakeup(&mut self) -> Result<Option<RawFd>> {
        // Events of earlier sleeps: the descriptor is readable only for
        // completions after this arming.
        self.channel.drain()?;
        self.cq.req_notify()?;
        self.cq.poll(POLL_BATCH, &mut self.stash)?;
        // A refused read of an offered buffer completes nothing on this
        // side: look for it at each sleep, as every few polls.
        self.fail_broken_offers();
        let must_poll = !self.stash.is_empty()
            || !self.failures.is_empty()
            || !self.completed.is_empty()
            || !self.read_outcomes.is_empty();
        Ok((!must_poll).then(|| self.channel.fd()))
    }

    /// Nothing to undo: a completion queue stays armed until its next
    /// completion, whose event the next arming takes.
    fn disarm_wakeup(&mut self) -> Result<()> {
        Ok(())
    }

    fn has_pending_sends(&self) -> bool {
        self.peers.iter().flatten().any(|p| {
            p.failed.is_none() && (!p.queue.is_empty() || p.in_flight > 0 || p.rma_in_flight > 0)
        }) || !self.reads.is_empty()
    }

    fn offers_remote_copy(&self, peer: PeerRank) -> bool {
        !self.remote_copy_off && matches!(self.peers.get(peer), Some(Some(p)) if p.failed.is_none())
    }

    fn remote_reads_all(&self) -> bool {
        true
    }

    unsafe fn remote_offer(
        &mut self,
        peer: PeerRank,
        buf: *const u8,
        len: usize,
    ) -> Result<Option<u64>> {
        if !self.offers_remote_copy(peer) || len == 0 {
            return Ok(None);
        }
        // SAFETY: the caller keeps the buffer readable until the offer is
        // withdrawn or the peer fails, when the lease ends; the
        // registration gives peers reads only.
        let lease = match unsafe {
            self.cache.acquire(
                &self.nic,
                &self.pd,
                buf as u64,
                len,
                AccessFlags::REMOTE_READ,
            )
        } {
            Ok(lease) => lease,
            Err(e) => {
                oxmpi_adi::vlog!(
                    "rank {}: verbs: registering a send buffer of {len} bytes failed ({}); \
                     this message goes in frames",
                    self.rank,
                    e.message()
                );
                return Ok(None);
            }
        };
        if let Some(Some(p)) = self.peers.get_mut(peer) {
            p.offers.push((lease.rkey, lease.id));
        }
        Ok(Some(u64::from(lease.rkey)))
    }

    fn remote_withdraw(&mut self, peer: PeerRank, key: u64) {
        let Some(Some(p)) = self.peers.get_mut(peer) else {
            return;
        };
        if let Some(i) = p
            .offers
            .iter()
            .position(|&(rkey, _)| u64::from(rkey) == key)
        {
            let (_, lease) = p.offers.swap_remove(i);
            self.cache.release(lease);
        }
    }

    unsafe fn remote_read_start(
        &mut self,
        peer: PeerRank,
        remote: u64,
        key: u64,
        local: *mut u8,
        len: usize,
        token: u64,
    ) -> Result<RemoteRead> {
        // The offer came over the connection, which is ready unless the
        // peer failed (an error here).
        self.connect_start(peer)?;
        let Ok(rkey) = u32::try_from(key) else {
            let error = proc_failed(
                peer,
                format!("it offered a buffer under key {key:#x}, which is no memory key"),
            );
            self.fail(peer, error.clone());
            return Err(error);
        };
        if len == 0 {
            return Ok(RemoteRead::Done);
        }
        if self.remote_copy_off {
            return Ok(RemoteRead::Refused);
        }
        // SAFETY: the caller keeps `local` writable and unaliased until
        // the read's end is reported (or the peer failed, which is
        // reported only once no READ of it is in flight); the lease ends
        // with the read.
        let lease = match unsafe {
            self.cache.acquire(
                &self.nic,
                &self.pd,
                local as u64,
                len,
                AccessFlags::LOCAL_WRITE,
            )
        } {
            Ok(lease) => lease,
            Err(e) => {
                oxmpi_adi::vlog!(
                    "rank {}: verbs: registering a receive buffer of {len} bytes failed ({}); \
                     long messages go in frames from now on",
                    self.rank,
                    e.message()
                );
                self.remote_copy_off = true;
                return Ok(RemoteRead::Refused);
            }
        };
        let id = self.next_read;
        self.next_read += 1;
        self.reads.insert(
            id,
            Read {
                peer,
                token,
                remote,
                rkey,
                local: local as u64,
                lkey: lease.lkey,
                lease: lease.id,
                len,
                posted: 0,
                in_flight: 0,
                error: None,
            },
        );
        self.read_queue.push_back(id);
        self.pump_reads();
        Ok(RemoteRead::Started)
    }

    fn offers_rdma(&self, peer: PeerRank) -> bool {
        matches!(self.peers.get(peer), Some(Some(p)) if p.channel.is_some())
    }

    fn rdma_max_len(&self) -> usize {
        RMA_LEN
    }

    unsafe fn rdma_register(&mut self, addr: *mut u8, len: usize) -> Result<RdmaRegion> {
        let access = AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC;
        // SAFETY: the caller keeps the memory allocated until it is
        // deregistered (the region is dropped), this function's contract.
        let mr = unsafe { self.nic.register(&self.pd, addr, len, access)? };
        let handle = self.next_region;
        self.next_region += 1;
        let rkey = mr.rkey();
        self.regions.insert(handle, mr);
        Ok(RdmaRegion { handle, rkey })
    }

    fn rdma_deregister(&mut self, handle: u64) {
        self.regions.remove(&handle);
    }

    fn rdma_post(&mut self, peer: PeerRank, at: RdmaTarget, op: RdmaOp<'_>) -> Result<Option<u64>> {
        let mut ids = Vec::with_capacity(1);
        self.rdma_post_list(peer, &[(at, op)], &mut ids)?;
        Ok(ids.pop())
    }

    /// The operations that fit (the peer's [`RMA_DEPTH`], free staging
    /// buffers) as one list of work requests: one post, one lock of the
    /// queue pair. Every request is signaled, and each operation keeps
    /// its own slot and id, as one posted alone. A full send queue
    /// (never, as the queue is sized) posts the ones before it.
    fn rdma_post_list(
        &mut self,
        peer: PeerRank,
        ops: &[(RdmaTarget, RdmaOp<'_>)],
        ids: &mut Vec<u64>,
    ) -> Result<()> {
        if let Some(len) = ops
            .iter()
            .map(|&(_, op)| rma_len(op))
            .find(|&len| len == 0 || len > RMA_LEN)
        {
            return Err(Error::new(
                ErrorClass::Intern,
                format!(
                    "verbs transport: a one-sided operation of {len} bytes to rank {peer} \
                     (from 1 to {RMA_LEN} bytes)"
                ),
            ));
        }
        if ops.is_empty() {
            return Ok(());
        }
        // The first operation to a peer connects to it; until both sides
        // are connected, the caller polls and posts again.
        self.connect_start(peer)?;
        let Some(Some(p)) = self.peers.get_mut(peer) else {
            return Ok(());
        };
        let (Link::Ready, Some(qp)) = (p.link, &p.qp) else {
            return Ok(());
        };
        let room = (RMA_DEPTH.saturating_sub(p.rma_in_flight) as usize)
            .min(self.rma_free.len())
            .min(ops.len());
        let mut wrs = Vec::with_capacity(room);
        let free = self.rma_free.len();
        for (&(at, op), slot) in ops.iter().zip(self.rma_free.drain(free - room..)) {
            let len = rma_len(op);
            if let RdmaOp::Write(data) = op {
                // SAFETY: a free staging buffer is not posted.
                let buf = unsafe { self.rma_frames.frame(slot) };
                buf[..len].copy_from_slice(data);
            }
            let local = Sge {
                addr: self.rma_frames.addr(slot),
                length: len as u32,
                lkey: self.rma_mr.lkey(),
            };
            let remote = RemoteAddr {
                addr: at.addr,
                rkey: at.rkey,
            };
            let send_op = match op {
                RdmaOp::Write(_) => SendOp::RdmaWrite { local, remote },
                RdmaOp::Read(_) => SendOp::RdmaRead { local, remote },
                RdmaOp::FetchAdd(add) => SendOp::FetchAdd { local, remote, add },
                RdmaOp::CompareSwap { compare, swap } => SendOp::CompareSwap {
                    local,
                    remote,
                    compare,
                    swap,
                },
            };
            wrs.push(SendWr {
                wr_id: RMA_BIT | slot as u64,
                signaled: true,
                op: send_op,
            });
        }
        let (posted, refusal) = match qp.post_send_list(&wrs) {
            Ok(()) => (wrs.len(), None),
            Err(refused) => (refused.posted, Some(refused.error)),
        };
        for (wr, &(_, op)) in wrs[..posted].iter().zip(ops) {
            let slot = (wr.wr_id & !RMA_BIT) as usize;
            let id = self.next_rma;
            self.next_rma += 1;
            p.rma_in_flight += 1;
            self.rma_posted[slot] = Some(RmaPosted {
                peer,
                id,
                result_len: match op {
                    RdmaOp::Write(_) => 0,
                    _ => rma_len(op),
                },
            });
            ids.push(id);
        }
        for wr in &wrs[posted..] {
            self.rma_free.push((wr.wr_id & !RMA_BIT) as usize);
        }
        match refusal {
            None | Some(PostError::QueueFull) => Ok(()),
            Some(PostError::Invalid(e)) => Err(e),
        }
    }

    fn rdma_take(&mut self, id: u64) -> Option<Result<Vec<u8>>> {
        self.rma_done.remove(&id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::soft::SoftNic;
    use oxmpi_adi::proto::Kind;
    use std::time::{Duration, Instant};

    /// A sink that keeps every payload and failure.
    #[derive(Default)]
    struct Sink {
        /// Per slot: (peer, tag, buffer, complete).
        slots: Vec<(PeerRank, i32, Vec<u8>, bool)>,
        sent: Vec<u64>,
        failed: Vec<(PeerRank, Error)>,
        /// Ended rendezvous reads: (peer, token, outcome).
        reads: Vec<(PeerRank, u64, Result<usize>)>,
    }

    impl PacketSink for Sink {
        fn on_header(&mut self, peer: PeerRank, header: &Header) -> Result<Option<PayloadSlot>> {
            let len = header.payload_len() as usize;
            self.slots.push((peer, header.tag, vec![0; len], false));
            Ok(Some(PayloadSlot(self.slots.len() as u64 - 1)))
        }
        fn payload_buffer(&mut self, slot: PayloadSlot) -> &mut [u8] {
            &mut self.slots[slot.0 as usize].2
        }
        fn on_payload(&mut self, _peer: PeerRank, slot: PayloadSlot) {
            self.slots[slot.0 as usize].3 = true;
        }
        fn on_send_complete(&mut self, token: u64) {
            self.sent.push(token);
        }
        fn on_peer_failed(&mut self, peer: PeerRank, error: Error) {
            self.failed.push((peer, error));
        }
        fn on_remote_read(&mut self, peer: PeerRank, token: u64, outcome: Result<usize>) {
            self.reads.push((peer, token, outcome));
        }
    }

    fn job(rank: PeerRank, size: usize) -> JobInfo {
        JobInfo {
            rank,
            size,
            secret: [7; 32],
        }
    }

    fn eager(tag: i32, len: usize) -> Header {
        let mut h = Header::new(Kind::Eager);
        h.tag = tag;
        h.message_len = len as u64;
        h
    }

    fn bytes(seed: usize, len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 31 + seed) as u8).collect()
    }

    /// Polls every transport until `done` holds of the sinks (10 s at most).
    fn poll_until(
        ts: &mut [Option<VerbsTransport<SoftNic>>],
        sinks: &mut [Sink],
        done: impl Fn(&[Sink]) -> bool,
    ) {
        let start = Instant::now();
        while !done(sinks) {
            for (t, sink) in ts.iter_mut().zip(sinks.iter_mut()) {
                if let Some(t) = t {
                    t.poll(sink).unwrap();
                }
            }
            assert!(start.elapsed() < Duration::from_secs(10), "no progress");
        }
    }

    /// Polls every transport until every pair of them is connected.
    fn connect_all(ts: &mut [Option<VerbsTransport<SoftNic>>], sinks: &mut [Sink]) {
        let start = Instant::now();
        let ready = |ts: &[Option<VerbsTransport<SoftNic>>]| {
            ts.iter()
                .flatten()
                .all(|t| t.peers.iter().flatten().all(|p| p.link == Link::Ready))
        };
        while !ready(ts) {
            for (t, sink) in ts.iter_mut().zip(sinks.iter_mut()) {
                if let Some(t) = t {
                    t.poll(sink).unwrap();
                }
            }
            assert!(start.elapsed() < Duration::from_secs(10), "not connected");
        }
    }

    /// Three transports of one job, each told the others' cards with
    /// `add_peer` (connecting at once).
    fn three() -> Vec<Option<VerbsTransport<SoftNic>>> {
        three_with(|t, peer, card| {
            assert!(t.reachable(card));
            t.add_peer(peer, card)
        })
    }

    /// Three transports of one job, each told the others' cards with
    /// `meet`.
    fn three_with(
        meet: impl Fn(&mut VerbsTransport<SoftNic>, PeerRank, &str) -> Result<()>,
    ) -> Vec<Option<VerbsTransport<SoftNic>>> {
        let mut ts: Vec<_> = (0..3)
            .map(|r| {
                Some(
                    VerbsTransport::new(SoftNic::open().unwrap(), ProviderKind::Soft, &job(r, 3))
                        .unwrap(),
                )
            })
            .collect();
        let cards: Vec<String> = ts
            .iter()
            .map(|t| t.as_ref().unwrap().card().to_owned())
            .collect();
        for (r, t) in ts.iter_mut().enumerate() {
            let t = t.as_mut().unwrap();
            for (peer, card) in cards.iter().enumerate() {
                if peer != r {
                    meet(t, peer, card).unwrap();
                }
            }
        }
        ts
    }

    #[test]
    fn cards_are_checked() {
        let t =
            VerbsTransport::new(SoftNic::open().unwrap(), ProviderKind::Soft, &job(1, 3)).unwrap();
        let card = parse_card(t.card()).unwrap();
        assert!(card.tag.starts_with("soft@"), "{}", card.tag);
        assert_eq!(card.ud_qpn, t.ud.qp_num());
        assert!(t.reachable(t.card()));
        for bad in [
            "",
            "verbs2,soft@b:1",
            "verbs1,soft@b:1:2,00000000000000000000000000000000,0,4096,1",
            "verbs2,soft,00000000000000000000000000000000,0,4096,1",
            "verbs2,soft@b:1,00000000000000000000000000000000,0,4096,1",
            "verbs2,soft@b:x:2,00000000000000000000000000000000,0,4096,1",
            "verbs2,ib,00000000000000000000000000000000,0,4096,1",
            "verbs2,soft@b:1:2,000000000000000000000000000000zz,0,4096,1",
            "verbs2,soft@b:1:2,00000000000000000000000000000000,0,4000,1",
            "verbs2,soft@b:1:2,00000000000000000000000000000000,0,4096,x",
            "verbs2,soft@b:1:2,00000000000000000000000000000000,0,4096,1000000",
            "verbs2,soft@b:1:2,00000000000000000000000000000000,0,4096,0",
            "verbs2,soft@b:1:2,00000000000000000000000000000000,0,4096,1,2",
        ] {
            let e = parse_card(bad)
                .err()
                .unwrap_or_else(|| panic!("{bad:?} accepted"));
            assert_eq!(e.class(), ErrorClass::Other);
            assert!(!t.reachable(bad));
        }
        // A soft NIC of another host (or network or PID namespace) is out of
        // reach.
        let elsewhere = "verbs2,soft@b:1:2,00000000000000000000000000000000,0,4096,1";
        assert!(parse_card(elsewhere).is_ok());
        assert!(!t.reachable(elsewhere));
        let mut u =
            VerbsTransport::new(SoftNic::open().unwrap(), ProviderKind::Soft, &job(0, 3)).unwrap();
        let e = u.add_peer(1, elsewhere).unwrap_err();
        assert!(e.message().contains("network namespace"), "{}", e.message());
    }

    #[test]
    fn the_card_has_one_size_whatever_the_job() {
        // The longest provider field a card takes, and the longest LID
        // and UD queue-pair number.
        let longest = format!(
            "{CARD_TAG},{},{},65535,4096,ffffff",
            "x".repeat(64),
            "f".repeat(32)
        );
        assert!(longest.len() <= CARD_MAX, "{} > {CARD_MAX}", longest.len());
        let sizes: Vec<usize> = [2, 1000, 100_000]
            .into_iter()
            .map(|size| {
                VerbsTransport::new(SoftNic::open().unwrap(), ProviderKind::Soft, &job(1, size))
                    .unwrap()
                    .card()
                    .len()
            })
            .collect();
        assert!(
            sizes
                .iter()
                .all(|&n| n <= CARD_MAX && n + 2 >= sizes[0] && n <= sizes[0] + 2),
            "{sizes:?}"
        );
    }

    #[test]
    fn packets_of_every_size_arrive_in_order_past_the_credits() {
        let mut ts = three();
        let mut sinks: Vec<Sink> = (0..3).map(|_| Sink::default()).collect();
        // More small packets than credits and frames, then a zero-copy
        // payload of many frames, to both peers.
        let big = bytes(9, 300_000);
        for peer in [1, 2] {
            let t = ts[0].as_mut().unwrap();
            for i in 0..500 {
                t.send(
                    peer,
                    &eager(i, i as usize % 50),
                    &bytes(i as usize, i as usize % 50),
                )
                .unwrap();
            }
            // SAFETY: `big` outlives the polling below.
            unsafe {
                t.send_zcopy(
                    peer,
                    &eager(-1, big.len()),
                    big.as_ptr(),
                    big.len(),
                    peer as u64,
                )
                .unwrap();
            }
        }
        poll_until(&mut ts, &mut sinks, |s| {
            s[1].slots.len() == 501
                && s[1].slots[500].3
                && s[2].slots.len() == 501
                && s[2].slots[500].3
        });
        for sink in &sinks[1..] {
            for (i, (peer, tag, data, done)) in sink.slots.iter().take(500).enumerate() {
                assert_eq!((*peer, *tag, *done), (0, i as i32, true));
                assert_eq!(data, &bytes(i, i % 50));
            }
            assert_eq!(sink.slots[500].2, big);
        }
        poll_until(&mut ts, &mut sinks, |s| s[0].sent.len() == 2);
        let t0 = ts[0].as_mut().unwrap();
        poll_until_quiet(t0, &mut sinks[0]);
        assert!(sinks.iter().all(|s| s.failed.is_empty()));
    }

    fn poll_until_quiet(t: &mut VerbsTransport<SoftNic>, sink: &mut Sink) {
        let start = Instant::now();
        while t.has_pending_sends() {
            t.poll(sink).unwrap();
            assert!(start.elapsed() < Duration::from_secs(10));
        }
    }

    #[test]
    fn a_lost_peer_fails_alone() {
        let mut ts = three();
        let mut sinks: Vec<Sink> = (0..3).map(|_| Sink::default()).collect();
        ts[0]
            .as_mut()
            .unwrap()
            .send(1, &eager(1, 10), &[1; 10])
            .unwrap();
        poll_until(&mut ts, &mut sinks, |s| {
            s[1].slots.len() == 1 && s[1].slots[0].3
        });
        // Rank 1 goes away; rank 0 keeps sending to it until it notices.
        ts[1] = None;
        let start = Instant::now();
        while sinks[0].failed.is_empty() {
            let t = ts[0].as_mut().unwrap();
            match t.send(1, &eager(2, 100), &[2; 100]) {
                Ok(()) => {}
                Err(e) => assert_eq!(e.class(), ErrorClass::ProcFailed),
            }
            t.poll(&mut sinks[0]).unwrap();
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "the loss is not noticed"
            );
        }
        let (peer, error) = &sinks[0].failed[0];
        assert_eq!(*peer, 1);
        assert_eq!(error.class(), ErrorClass::ProcFailed);
        assert!(
            error.message().contains("rank 1 is lost"),
            "{}",
            error.message()
        );
        let e = ts[0]
            .as_mut()
            .unwrap()
            .send(1, &eager(3, 1), &[3])
            .unwrap_err();
        assert_eq!(e.class(), ErrorClass::ProcFailed);
        // Rank 2 is not affected.
        ts[0]
            .as_mut()
            .unwrap()
            .send(2, &eager(4, 5000), &[4; 5000])
            .unwrap();
        poll_until(&mut ts, &mut sinks, |s| {
            s[2].slots.len() == 1 && s[2].slots[0].3
        });
        assert_eq!(sinks[2].slots[0].2, vec![4; 5000]);
        assert_eq!(sinks[0].failed.len(), 1);
    }

    #[test]
    fn the_stream_is_parsed_across_frames_and_a_bad_header_is_an_error() {
        let mut sink = Sink::default();
        let mut incoming = Incoming::new();
        let mut stream = eager(5, 20).encode().to_vec();
        stream.extend_from_slice(&bytes(3, 20));
        stream.extend_from_slice(&eager(6, 0).encode());
        // One byte at a time: every split of header and payload.
        for b in &stream {
            incoming
                .feed(2, std::slice::from_ref(b), &mut sink)
                .unwrap();
        }
        assert_eq!(sink.slots.len(), 2);
        assert_eq!(sink.slots[0], (2, 5, bytes(3, 20), true));
        assert_eq!(sink.slots[1], (2, 6, Vec::new(), true));
        let e = incoming
            .feed(2, &[0xff; HEADER_LEN], &mut sink)
            .unwrap_err();
        assert_eq!(e.class(), ErrorClass::ProcFailed);
    }

    /// Posts `op` from rank 0 to rank 1 and polls everyone until its outcome.
    fn rdma(
        ts: &mut [Option<VerbsTransport<SoftNic>>],
        sinks: &mut [Sink],
        at: RdmaTarget,
        op: RdmaOp<'_>,
    ) -> Result<Vec<u8>> {
        let start = Instant::now();
        let id = loop {
            if let Some(id) = ts[0].as_mut().unwrap().rdma_post(1, at, op)? {
                break id;
            }
            ts[0].as_mut().unwrap().poll(&mut sinks[0]).unwrap();
            assert!(start.elapsed() < Duration::from_secs(10), "no post");
        };
        loop {
            let t = ts[0].as_mut().unwrap();
            t.poll(&mut sinks[0]).unwrap();
            if let Some(outcome) = t.rdma_take(id) {
                return outcome;
            }
            assert!(start.elapsed() < Duration::from_secs(10), "no completion");
        }
    }

    #[test]
    fn one_sided_operations_need_no_target_polling_and_are_checked() {
        let mut ts = three();
        let mut sinks: Vec<Sink> = (0..3).map(|_| Sink::default()).collect();
        let mut memory = vec![0u64; 4];
        let base = memory.as_mut_ptr() as u64;
        // SAFETY: `memory` outlives the transports' use of it: it is
        // deregistered below before it is read or dropped.
        let region = unsafe {
            ts[1]
                .as_mut()
                .unwrap()
                .rdma_register(memory.as_mut_ptr().cast(), 32)
                .unwrap()
        };
        let at = |word: u64| RdmaTarget {
            addr: base + 8 * word,
            rkey: region.rkey,
        };
        // The connection needs both ranks once (as a window's creation,
        // where every rank is in the call, does it).
        connect_all(&mut ts, &mut sinks);
        // Rank 1 is never polled from here on: its NIC does the work.
        let data = 7u64.to_ne_bytes();
        assert!(rdma(&mut ts, &mut sinks, at(0), RdmaOp::Write(&data))
            .unwrap()
            .is_empty());
        assert_eq!(
            rdma(&mut ts, &mut sinks, at(0), RdmaOp::Read(8)).unwrap(),
            data
        );
        let old = rdma(&mut ts, &mut sinks, at(1), RdmaOp::FetchAdd(5)).unwrap();
        assert_eq!(old, 0u64.to_ne_bytes());
        let cas = RdmaOp::CompareSwap {
            compare: 5,
            swap: 9,
        };
        assert_eq!(
            rdma(&mut ts, &mut sinks, at(1), cas).unwrap(),
            5u64.to_ne_bytes()
        );
        // Past the registration: the NIC refuses it, the operation fails
        // with RMA_RANGE, and the queue pair (so the peer) is broken.
        let e = rdma(&mut ts, &mut sinks, at(4), RdmaOp::Write(&data)).unwrap_err();
        assert_eq!(e.class(), ErrorClass::RmaRange, "{}", e.message());
        assert!(e.message().contains("REM_ACCESS_ERR"), "{}", e.message());
        assert_eq!(sinks[0].failed.len(), 1);
        let e = ts[0]
            .as_mut()
            .unwrap()
            .rdma_post(1, at(0), RdmaOp::Read(8))
            .unwrap_err();
        assert_eq!(e.class(), ErrorClass::ProcFailed);
        ts[1].as_mut().unwrap().rdma_deregister(region.handle);
        assert_eq!(memory, [7, 9, 0, 0]);
    }

    /// Posts `ops` from rank 0 to rank 1 as lists, polling between, and
    /// returns each one's outcome, in order; asserts that the first list
    /// posted as many as one peer may have in flight.
    fn rdma_list(
        ts: &mut [Option<VerbsTransport<SoftNic>>],
        sinks: &mut [Sink],
        ops: &[(RdmaTarget, RdmaOp<'_>)],
    ) -> Vec<Result<Vec<u8>>> {
        let start = Instant::now();
        let t = ts[0].as_mut().unwrap();
        let mut ids = Vec::new();
        t.rdma_post_list(1, ops, &mut ids).unwrap();
        assert_eq!(ids.len(), ops.len().min(RMA_DEPTH as usize));
        // Nothing was polled: no room for more.
        t.rdma_post_list(1, &ops[ids.len()..], &mut ids).unwrap();
        assert_eq!(ids.len(), ops.len().min(RMA_DEPTH as usize));
        while ids.len() < ops.len() {
            t.poll(&mut sinks[0]).unwrap();
            t.rdma_post_list(1, &ops[ids.len()..], &mut ids).unwrap();
            assert!(start.elapsed() < Duration::from_secs(10), "no room");
        }
        ids.iter()
            .map(|&id| loop {
                t.poll(&mut sinks[0]).unwrap();
                if let Some(outcome) = t.rdma_take(id) {
                    break outcome;
                }
                assert!(start.elapsed() < Duration::from_secs(10), "no completion");
            })
            .collect()
    }

    #[test]
    fn lists_of_one_sided_operations_go_as_far_as_the_peers_depth() {
        const WORDS: usize = 2 * RMA_DEPTH as usize + 3;
        let mut ts = three();
        let mut sinks: Vec<Sink> = (0..3).map(|_| Sink::default()).collect();
        let mut memory = vec![0u64; WORDS];
        let base = memory.as_mut_ptr() as u64;
        // SAFETY: `memory` outlives the transports' use of it: it is
        // deregistered below before it is read or dropped.
        let region = unsafe {
            ts[1]
                .as_mut()
                .unwrap()
                .rdma_register(memory.as_mut_ptr().cast(), 8 * WORDS)
                .unwrap()
        };
        let at = |word: usize| RdmaTarget {
            addr: base + 8 * word as u64,
            rkey: region.rkey,
        };
        connect_all(&mut ts, &mut sinks);
        let values: Vec<[u8; 8]> = (0..WORDS)
            .map(|i| (i as u64 * 3 + 1).to_ne_bytes())
            .collect();
        let writes: Vec<_> = (0..WORDS)
            .map(|i| (at(i), RdmaOp::Write(&values[i])))
            .collect();
        for outcome in rdma_list(&mut ts, &mut sinks, &writes) {
            assert!(outcome.unwrap().is_empty());
        }
        let reads: Vec<_> = (0..WORDS).map(|i| (at(i), RdmaOp::Read(8))).collect();
        let read: Vec<Vec<u8>> = rdma_list(&mut ts, &mut sinks, &reads)
            .into_iter()
            .map(Result::unwrap)
            .collect();
        assert_eq!(read, values);
        // A list with an operation of no bytes is refused whole.
        let mut ids = Vec::new();
        let bad = [reads[0], (at(1), RdmaOp::Read(0))];
        let e = ts[0]
            .as_mut()
            .unwrap()
            .rdma_post_list(1, &bad, &mut ids)
            .unwrap_err();
        assert_eq!((e.class(), ids.len()), (ErrorClass::Intern, 0));
        ts[1].as_mut().unwrap().rdma_deregister(region.handle);
        let want: Vec<u64> = (0..WORDS as u64).map(|i| i * 3 + 1).collect();
        assert_eq!(memory, want);
    }

    /// Rank 1 reads `len` bytes of rank 0's `data` (offered for it) into
    /// `into`, as the receiver of a rendezvous; returns the outcome.
    fn rendezvous_read(
        ts: &mut [Option<VerbsTransport<SoftNic>>],
        sinks: &mut [Sink],
        data: &[u8],
        into: &mut [u8],
        token: u64,
    ) -> Result<usize> {
        let sender = ts[0].as_mut().unwrap();
        // SAFETY: `data` outlives the offer, withdrawn below.
        let key = unsafe { sender.remote_offer(1, data.as_ptr(), data.len()) }
            .unwrap()
            .expect("offered");
        let receiver = ts[1].as_mut().unwrap();
        // SAFETY: `into` is neither read nor written until the read ended.
        let started = unsafe {
            receiver.remote_read_start(
                0,
                data.as_ptr() as u64,
                key,
                into.as_mut_ptr(),
                data.len(),
                token,
            )
        }
        .unwrap();
        assert_eq!(started, RemoteRead::Started);
        poll_until(ts, sinks, |s| s[1].reads.iter().any(|r| r.1 == token));
        ts[0].as_mut().unwrap().remote_withdraw(1, key);
        let i = sinks[1].reads.iter().position(|r| r.1 == token).unwrap();
        sinks[1].reads.remove(i).2
    }

    #[test]
    fn rendezvous_reads_land_in_place_and_reuse_registrations() {
        let mut ts = three();
        let mut sinks: Vec<Sink> = (0..3).map(|_| Sink::default()).collect();
        // Around a chunk, and several chunks with a ragged end.
        for (i, len) in [1, 4097, READ_CHUNK, 3 * READ_CHUNK + 123]
            .into_iter()
            .enumerate()
        {
            let data = bytes(i, len);
            let mut into = vec![0u8; len];
            let n = rendezvous_read(&mut ts, &mut sinks, &data, &mut into, i as u64).unwrap();
            assert_eq!(n, len);
            assert!(into == data, "{len} bytes read wrong");
        }
        // The same buffers again: no new registration on either side.
        let data = bytes(9, 2 * READ_CHUNK);
        let mut into = vec![0u8; data.len()];
        rendezvous_read(&mut ts, &mut sinks, &data, &mut into, 10).unwrap();
        let (sent, received) = (
            ts[0].as_ref().unwrap().cache_stats(),
            ts[1].as_ref().unwrap().cache_stats(),
        );
        for _ in 0..3 {
            into.fill(0);
            rendezvous_read(&mut ts, &mut sinks, &data, &mut into, 11).unwrap();
            assert!(into == data);
        }
        let (sent2, received2) = (
            ts[0].as_ref().unwrap().cache_stats(),
            ts[1].as_ref().unwrap().cache_stats(),
        );
        if ts[0].as_ref().unwrap().cache.caches() {
            assert_eq!(sent2.registrations, sent.registrations);
            assert_eq!(received2.registrations, received.registrations);
            assert_eq!(sent2.hits, sent.hits + 3);
            assert_eq!(received2.hits, received.hits + 3);
        }
        assert!(sinks.iter().all(|s| s.failed.is_empty()));
    }

    #[test]
    fn a_refused_rendezvous_read_fails_the_read_and_both_sides_of_the_pair() {
        let mut ts = three();
        let mut sinks: Vec<Sink> = (0..3).map(|_| Sink::default()).collect();
        // The offer would come over the connection.
        connect_all(&mut ts, &mut sinks);
        let data = bytes(1, 3 * READ_CHUNK);
        let mut into = vec![0u8; data.len()];
        let sender = ts[0].as_mut().unwrap();
        // SAFETY: `data` outlives the offer.
        let key = unsafe { sender.remote_offer(1, data.as_ptr(), data.len()) }
            .unwrap()
            .unwrap();
        // Past the end of the offered buffer's pages: outside the
        // registration.
        let beyond = data.as_ptr() as u64 + (4 * READ_CHUNK) as u64;
        let receiver = ts[1].as_mut().unwrap();
        // SAFETY: `into` is untouched until the read ended.
        unsafe { receiver.remote_read_start(0, beyond, key, into.as_mut_ptr(), into.len(), 5) }
            .unwrap();
        poll_until(&mut ts, &mut sinks, |s| {
            s[1].reads.len() == 1 && !s[1].failed.is_empty() && !s[0].failed.is_empty()
        });
        let (peer, token, outcome) = sinks[1].reads.pop().unwrap();
        let e = outcome.unwrap_err();
        assert_eq!((peer, token), (0, 5));
        assert_eq!(e.class(), ErrorClass::ProcFailed);
        assert!(e.message().contains("REM_ACCESS_ERR"), "{}", e.message());
        assert_eq!(sinks[0].failed[0].0, 1);
        assert!(sinks[0].failed[0].1.message().contains("rendezvous read"));
        // The other peers go on.
        ts[0]
            .as_mut()
            .unwrap()
            .send(2, &eager(3, 10), &bytes(3, 10))
            .unwrap();
        poll_until(&mut ts, &mut sinks, |s| s[2].slots.iter().any(|x| x.3));
        assert_eq!(sinks[2].slots[0].2, bytes(3, 10));
    }

    #[test]
    fn connections_are_made_on_first_use_between_the_ranks_that_talk() {
        let mut ts = three_with(|t, peer, card| t.learn(peer, card));
        let mut sinks: Vec<Sink> = (0..3).map(|_| Sink::default()).collect();
        let link = |ts: &[Option<VerbsTransport<SoftNic>>], a: usize, b: usize| {
            ts[a].as_ref().unwrap().peers[b].as_ref().unwrap().link
        };
        // Only 0 and 1 talk: only they connect, with one queue pair each.
        ts[0]
            .as_mut()
            .unwrap()
            .send(1, &eager(1, 5), &bytes(1, 5))
            .unwrap();
        poll_until(&mut ts, &mut sinks, |s| s[1].slots.iter().any(|x| x.3));
        let start = Instant::now();
        while link(&ts, 1, 0) != Link::Ready {
            for (t, sink) in ts.iter_mut().zip(sinks.iter_mut()) {
                t.as_mut().unwrap().poll(sink).unwrap();
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "1 never saw 0 ready"
            );
        }
        assert_eq!(link(&ts, 0, 1), Link::Ready);
        for (a, b) in [(0, 2), (2, 0), (1, 2), (2, 1)] {
            assert_eq!(link(&ts, a, b), Link::Idle, "{a} -> {b}");
        }
        assert_eq!(ts[2].as_ref().unwrap().by_qpn.len(), 0);
        assert_eq!(ts[0].as_ref().unwrap().by_qpn.len(), 1);

        // 1 and 2 start at once: the requests cross, and each side still
        // has one queue pair, connected to the other's.
        ts[1]
            .as_mut()
            .unwrap()
            .send(2, &eager(2, 7), &bytes(2, 7))
            .unwrap();
        ts[2]
            .as_mut()
            .unwrap()
            .send(1, &eager(3, 9), &bytes(3, 9))
            .unwrap();
        poll_until(&mut ts, &mut sinks, |s| {
            s[2].slots.iter().any(|x| x.1 == 2 && x.3) && s[1].slots.iter().any(|x| x.1 == 3 && x.3)
        });
        let (q1, q2) = (
            ts[1].as_ref().unwrap().peers[2].as_ref().unwrap(),
            ts[2].as_ref().unwrap().peers[1].as_ref().unwrap(),
        );
        assert_eq!(q1.remote.unwrap().qpn, q2.qp.as_ref().unwrap().qp_num());
        assert_eq!(q2.remote.unwrap().qpn, q1.qp.as_ref().unwrap().qp_num());
        assert_eq!(ts[1].as_ref().unwrap().by_qpn.len(), 2);

        // Duplicate requests (as after a lost reply) change nothing.
        for _ in 0..2 {
            ts[0]
                .as_mut()
                .unwrap()
                .send_message(1, crate::connect::Kind::Request, 0);
        }
        ts[0]
            .as_mut()
            .unwrap()
            .send(1, &eager(4, 3), &bytes(4, 3))
            .unwrap();
        poll_until(&mut ts, &mut sinks, |s| {
            s[1].slots.iter().any(|x| x.1 == 4 && x.3)
        });
        assert_eq!(
            (link(&ts, 0, 1), link(&ts, 1, 0)),
            (Link::Ready, Link::Ready)
        );
        assert_eq!(ts[1].as_ref().unwrap().by_qpn.len(), 2);

        // A stranger (another job's secret, so another Q_Key and MAC)
        // asking rank 1 is never answered, and goes on asking less often.
        let mut stranger = VerbsTransport::new(
            SoftNic::open().unwrap(),
            ProviderKind::Soft,
            &JobInfo {
                rank: 0,
                size: 3,
                secret: [8; 32],
            },
        )
        .unwrap();
        let card1 = ts[1].as_ref().unwrap().card().to_owned();
        stranger.add_peer(1, &card1).unwrap();
        let mut lonely = Sink::default();
        let start = Instant::now();
        while start.elapsed() < Duration::from_millis(300) {
            stranger.poll(&mut lonely).unwrap();
            for (t, sink) in ts.iter_mut().zip(sinks.iter_mut()) {
                t.as_mut().unwrap().poll(sink).unwrap();
            }
        }
        let stranger_link = stranger.peers[1].as_ref().unwrap();
        assert_eq!(
            stranger_link.link,
            Link::Requested,
            "the stranger was answered"
        );
        let wait = stranger_link.asking.unwrap().wait;
        assert!(wait > RETRY_FIRST, "{wait:?}");
        assert_eq!(ts[1].as_ref().unwrap().by_qpn.len(), 2);
        // With a bound, the stranger takes rank 1 for lost once it passed.
        stranger.connect_timeout = Some(Duration::from_millis(400));
        let start = Instant::now();
        while lonely.failed.is_empty() {
            stranger.poll(&mut lonely).unwrap();
            assert!(start.elapsed() < Duration::from_secs(10), "never gave up");
        }
        let (peer, e) = &lonely.failed[0];
        assert_eq!((*peer, e.class()), (1, ErrorClass::ProcFailed));
        assert!(e.message().contains(CONNECT_TIMEOUT_ENV), "{}", e.message());
        assert!(parse_connect_timeout(None).unwrap().is_none());
        assert_eq!(
            parse_connect_timeout(Some(" 30 ")).unwrap(),
            Some(Duration::from_secs(30))
        );
        for bad in ["0", "-1", "1.5", "soon"] {
            let e = parse_connect_timeout(Some(bad)).unwrap_err();
            assert_eq!(e.class(), ErrorClass::Arg, "{bad}");
        }
        assert!(sinks.iter().all(|s| s.failed.is_empty()));
    }

    /// Whether `fd` becomes readable within `ms` milliseconds.
    fn readable(fd: RawFd, ms: i32) -> bool {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, for the duration of the call.
        let n = unsafe { libc::poll(&mut p, 1, ms) };
        n == 1 && p.revents & libc::POLLIN != 0
    }

    #[test]
    fn a_blocked_wait_sleeps_on_the_completion_channel_until_a_frame_comes() {
        let mut ts = three();
        let mut sinks: Vec<Sink> = (0..3).map(|_| Sink::default()).collect();
        connect_all(&mut ts, &mut sinks);
        // Quiet: what the connections left is taken first.
        let fd = loop {
            for (t, sink) in ts.iter_mut().zip(sinks.iter_mut()) {
                poll_until_quiet(t.as_mut().unwrap(), sink);
            }
            let t1 = ts[1].as_mut().unwrap();
            if let Some(fd) = t1.arm_wakeup().unwrap() {
                break fd;
            }
            // Something completed before the arming: poll, then sleep.
            t1.poll(&mut sinks[1]).unwrap();
        };
        assert!(!readable(fd, 50), "woken with nothing to do");
        ts[0]
            .as_mut()
            .unwrap()
            .send(1, &eager(8, 100), &bytes(8, 100))
            .unwrap();
        assert!(readable(fd, 10_000), "a frame did not wake the sleeper");
        ts[1].as_mut().unwrap().disarm_wakeup().unwrap();
        poll_until(&mut ts, &mut sinks, |s| {
            s[1].slots.iter().any(|x| x.1 == 8 && x.3)
        });
        // Arming again takes the old event: not readable until the next.
        let t1 = ts[1].as_mut().unwrap();
        poll_until_quiet(t1, &mut sinks[1]);
        if let Some(fd) = t1.arm_wakeup().unwrap() {
            assert!(!readable(fd, 0));
        }
    }

    /// Takes the completions `t`'s queue holds, within 10 s once `n` came.
    fn take_completions(t: &mut VerbsTransport<SoftNic>, n: usize) -> Vec<WorkCompletion> {
        let start = Instant::now();
        let mut out = Vec::new();
        while out.len() < n {
            t.cq.poll(POLL_BATCH, &mut out).unwrap();
            assert!(start.elapsed() < Duration::from_secs(10), "{out:?}");
        }
        out
    }

    #[test]
    fn crossed_requests_whose_replies_are_lost_still_connect() {
        let mut ts = three();
        let mut sinks: Vec<Sink> = (0..3).map(|_| Sink::default()).collect();
        // `three` made every rank ask every other: 1 and 2 asked each
        // other at once. Rank 1 takes rank 2's request (and its own
        // send's completion), and replies.
        let [_, t1, t2] = &mut ts[..] else {
            unreachable!()
        };
        let (t1, t2) = (t1.as_mut().unwrap(), t2.as_mut().unwrap());
        let is_request_from = |t: &mut VerbsTransport<SoftNic>, wc: &WorkCompletion, from: u32| {
            let index = (wc.wr_id & !UD_BIT) as usize;
            wc.wr_id & UD_BIT != 0 && index < UD_RECVS && {
                // SAFETY: a completed receive, not posted again yet.
                let buf = unsafe { t.ud_frames.frame(index) };
                Message::decode(
                    &buf[GRH_LEN..GRH_LEN + MESSAGE_LEN],
                    &t.secret,
                    t.rank as u32,
                    3,
                )
                .is_ok_and(|m| m.from == from && m.kind == crate::connect::Kind::Request)
            }
        };
        // Each takes the other's request, and loses all else (replies to
        // come are lost below): both are then connected at the other's
        // request, and both replies are lost.
        for (t, from) in [(&mut *t1, 2u32), (&mut *t2, 1u32)] {
            let start = Instant::now();
            loop {
                let wcs = take_completions(t, 1);
                let mut found = false;
                for wc in wcs {
                    if is_request_from(t, &wc, from) {
                        t.complete(wc, &mut Sink::default());
                        found = true;
                    }
                }
                if found {
                    break;
                }
                assert!(start.elapsed() < Duration::from_secs(10));
            }
            assert_eq!(
                t.peers[from as usize].as_ref().unwrap().link,
                Link::Accepted
            );
        }
        std::thread::sleep(Duration::from_millis(20));
        for t in [&mut *t1, &mut *t2] {
            let mut lost = Vec::new();
            t.cq.poll(POLL_BATCH, &mut lost).unwrap();
        }
        // The requests are asked again, answered by duplicate replies, and
        // the pair connects, one queue pair on each side.
        t1.send(2, &eager(6, 4), &bytes(6, 4)).unwrap();
        poll_until(&mut ts, &mut sinks, |s| {
            s[2].slots.iter().any(|x| x.1 == 6 && x.3)
        });
        let (p1, p2) = (
            ts[1].as_ref().unwrap().peers[2].as_ref().unwrap(),
            ts[2].as_ref().unwrap().peers[1].as_ref().unwrap(),
        );
        assert_eq!(p1.remote.unwrap().qpn, p2.qp.as_ref().unwrap().qp_num());
        assert_eq!(p2.remote.unwrap().qpn, p1.qp.as_ref().unwrap().qp_num());
        assert!(sinks.iter().all(|s| s.failed.is_empty()));
    }

    #[test]
    fn a_rank_connects_to_at_most_max_connected_peers() {
        let size = MAX_CONNECTED + 3;
        let mut t =
            VerbsTransport::new(SoftNic::open().unwrap(), ProviderKind::Soft, &job(0, size))
                .unwrap();
        for peer in 1..=MAX_CONNECTED {
            t.make_qp(peer).unwrap();
        }
        let e = t.make_qp(MAX_CONNECTED + 1).unwrap_err();
        assert_eq!(e.class(), ErrorClass::ProcFailed);
        assert!(e.message().contains("the most"), "{}", e.message());
        // That peer alone fails; the others keep their queue pairs.
        assert_eq!(t.failures.len(), 1);
        assert_eq!(t.by_qpn.len(), MAX_CONNECTED);
    }
}
