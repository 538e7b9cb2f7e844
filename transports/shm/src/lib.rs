//! oxmpi's shared-memory transport: ranks on one host exchange packets
//! through lock-free queues in memory both of them map.
//!
//! This crate owns the shared segments of a rank and everything that moves
//! through them: for each peer it sends to, a single-producer
//! single-consumer queue of cache-line cells (module `ring`) in an anonymous
//! memory file (module `segment`); the rank's listener, an abstract-namespace
//! Unix socket whose name and the rank's host identity (module `host`) are its
//! business card; the connections over which queues are handed to peers
//! after the job-secret handshake ([`oxmpi_adi::auth`]); the wake-ups of a
//! sleeping rank; and the detection of a peer that died. It implements
//! [`Transport`] and must not know communicators, requests or matching: on
//! a packet it asks the [`PacketSink`] where the payload goes and copies it
//! there.
//!
//! # Queues and connections
//! Nothing is shared up front: the first packet to a peer creates the
//! queue to it, so memory grows with the pairs that talk, not with the
//! square of the ranks. The sender (producer) creates the segment, a memfd
//! with no name in any file system and its size sealed, connects to the
//! peer's listener, proves the job's secret (HELLO, CHALLENGE, RESPONSE),
//! sends the segment's descriptor with `SCM_RIGHTS` in a set-up message
//! that also names its own listener, and writes packets once the peer's
//! VERDICT accepts. The peer maps the segment as its inbound queue from
//! the sender, after checking its seals, size, version, layout and ranks.
//! Each direction of a pair has its own queue and its own connection, so
//! two ranks that start talking at once need no tie-break. A stranger at
//! the listener is refused (under `OXMPI_VERBOSE=1` with the reason) and
//! the rank goes on. Nothing is ever left in /dev/shm or anywhere else:
//! segments and abstract sockets disappear with the last process holding
//! them, however it ends.
//!
//! # Packets
//! Short messages (header and payload) are written into the queue at once
//! when there is room: a standard eager message of up to 40 bytes whole in
//! one cell, which the receiver hands to the ADI in one step
//! ([`PacketSink::on_packet`]); a long one's payload (`send_zcopy`) streams from the
//! caller's buffer through the queue in frames of up to 4 KiB, which the
//! receiver copies straight into the buffer the ADI names while the sender
//! writes the next (a pipelined copy, for messages of any size): the path
//! of long messages where cross-memory attach is off or refused. Otherwise
//! the ADI's remote-copy rendezvous moves them with a single copy between
//! the two buffers, through [`Transport::remote_read`] and
//! [`Transport::remote_write`] (module `cma`); so do messages past
//! [`ShmConfig::always_eager_limit`] that no other single copy to their
//! peer precedes ([`Transport::remote_copies_under_way`]): alone, a single copy is
//! faster; behind one, the queue's two overlapping copies are. What does
//! not fit waits in the peer's queue of outgoing packets (copied, for
//! `send`) and goes from [`Transport::poll`]: a full queue is back-pressure,
//! never loss.
//!
//! # Placement
//! The shared memory a rank reads is bound to its NUMA node(s) (module
//! `numa`, one mechanism for all of it: the owner of a range of a memory
//! file sets the policy of its pages, `mbind`, before anyone touches
//! them): its inbound queues (the consumer binds each segment when it
//! maps it and then allocates its pages, the first, where the producer
//! wrote the layout, anew, before the producer writes a packet or
//! touches a page again), its part of every
//! window made by `MPI_Win_allocate` or `MPI_Win_allocate_shared`
//! ([`window::WindowSegment::bind_to_own_nodes`]), and its slots and
//! staging areas in the region of the MPI layer's collectives
//! ([`region::SharedRegion::bind_to_own_nodes`]). The nodes are
//! `OXMPI_NUMA_NODES` (oxrun sets it for the ranks it binds), or those of
//! the rank's CPU affinity when that is a strict subset of the machine's;
//! else the kernel's first touch places the memory. `OXMPI_VERBOSE=1`
//! says which, once per process. [`page_policy`] reads back what the
//! kernel recorded for a page.
//! Starting the transport fails where no segment can be made
//! (`memfd_create` refused), so that such a rank offers no shared memory.
//!
//! # Progress and sleep
//! [`Transport::poll`] looks at the control word of the next cell of each
//! inbound queue (the latency path), writes waiting packets, and, every
//! 128 polls or while a connection is being set up, asks epoll about the
//! sockets. [`Transport::arm_wakeup`] raises a flag in each queue (the
//! consumer's "sleeping", or the producer's "waiting" for room) and returns
//! the epoll descriptor; the other side, seeing the flag after publishing
//! or freeing cells, writes a byte to the connection of that queue, which
//! wakes the sleeper. So a rank on an oversubscribed node sleeps in the
//! kernel and still wakes for every message. The look at the flag after
//! every message costs no fence where both processes registered for the
//! kernel's barriers (`membarrier`): the rank about to sleep runs one on
//! both instead (module `ring`, "Sleeping").
//!
//! # Failures
//! A peer whose connection closes (it ended, or was killed) is reported
//! failed once, after what it had already published is read; so is a peer
//! whose queue breaks the protocol (a corrupt cell or head, a malformed
//! header). Sends queued to it are dropped without a completion, and the
//! rest of the job goes on.
//!
//! [`region`] gives the MPI layer memory shared by several processes of a
//! host outside the queues (its collectives over shared memory);
//! [`window`] builds on it the shared-memory side of one-sided
//! communication: window segments, their fair reader-writer locks and
//! region mutexes, hardware atomics on window memory, and bounded
//! cross-memory access to a peer's window.
//!
//! # Environment
//! - `OXMPI_SHM_CMA`: `0` turns the single copy of long messages off
//!   (default `1`).
//! - `OXMPI_SHM_EAGER_LIMIT`: largest message in bytes sent eagerly
//!   (default 16384 with cross-memory attach, 65536 without:
//!   [`ShmConfig::default_eager_limit`]).
//! - `OXMPI_SHM_QUEUE_SIZE`: bytes of cells in each queue, a power of two
//!   from 4 KiB to 1 GiB. By default a rank's queues to all the other ranks
//!   of its node share 8 MiB: 1 MiB each (the most) up to 9 ranks on a
//!   node, less beyond, 64 KiB at least. So the memory of a node's queues
//!   grows with its ranks, not with their square; `MPI_LOCALNRANKS` (set
//!   by the launcher) says how many there are, else the job's size.
//! - `OXMPI_NUMA_NODES`: the NUMA nodes the shared memory this rank reads
//!   (queues, window parts, collectives' slots and staging areas) is
//!   bound to, a list like `0-1,4` (set by oxrun for a rank it binds).

mod cma;
mod conn;
mod handover;
mod host;
mod inbound;
mod numa;
mod proto;
#[cfg(test)]
mod queue_study;
pub mod region;
mod ring;
mod segment;
mod sys;
pub mod window;

pub use cma::CMA_ENV;
pub use numa::{page_policy, PagePolicy, NUMA_NODES_ENV};
pub use proto::SHM_VERSION;

use cma::{Cma, Refusal};
use conn::{take_message, write_message, Conn, InStep, OutStep, Role};
use host::Card;
use inbound::{InLink, ReadState};
use oxmpi_adi::auth::{Acceptor, Channel, Connector, Verdict, MESSAGE_LEN};
use oxmpi_adi::host::HostId;
use oxmpi_adi::matching::Envelope;
use oxmpi_adi::proto::{Header, HEADER_LEN};
use oxmpi_adi::transport::{JobInfo, PacketSink, PeerRank, Transport};
use oxmpi_adi::{vlog, Error, ErrorClass, Result};
use proto::{CELL, SETUP_LEN};
use ring::{Barriers, Consumer, Corrupt, Producer};
use segment::Segment;
use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};

/// Environment variable: eager limit in bytes.
pub const EAGER_LIMIT_ENV: &str = "OXMPI_SHM_EAGER_LIMIT";
/// Environment variable: bytes of cells in each queue.
pub const QUEUE_SIZE_ENV: &str = "OXMPI_SHM_QUEUE_SIZE";

/// Smallest queue (bytes of cells) [`ShmConfig`] accepts.
pub const QUEUE_SIZE_MIN: usize = 4 * 1024;
/// Largest queue (bytes of cells) [`ShmConfig`] accepts.
pub const QUEUE_SIZE_MAX: usize = 1 << 30;
/// Bytes the default queues of one rank, to every other rank of its node,
/// add up to at most (see [`ShmConfig::default_queue_size`]).
const QUEUE_BUDGET: usize = 8 << 20;
/// Bounds of the default queue size: a queue much smaller than the eager
/// limit makes every eager message wait and be copied a second time; one
/// larger than a core's cache moves no more.
const DEFAULT_QUEUE_MIN: usize = 64 << 10;
const DEFAULT_QUEUE_MAX: usize = 1 << 20;

/// `poll` asks epoll about the sockets once in this many calls (always
/// while a connection this rank opened is being set up): often enough to
/// notice a new peer or a lost one within microseconds, rarely enough that
/// the system call costs next to nothing on the latency path.
const SOCKETS_EVERY: u32 = 128;
/// Epoll token of the listener.
const LISTENER: u64 = u64::MAX;
/// Epoll token of the eventfd a rank signals itself with.
const WAKE: u64 = u64::MAX - 1;
/// Epoll token of the poller of this process's hand-over of shared
/// regions (module `handover`): its callers are answered from the poll.
const HANDOVER: u64 = u64::MAX - 2;
/// Settings of the shared-memory transport.
#[derive(Clone, Debug)]
pub struct ShmConfig {
    /// Largest message sent eagerly, in bytes.
    pub eager_limit: usize,
    /// Largest message always sent eagerly, in bytes: a longer one, up to
    /// `eager_limit`, goes by single copy (a remote-copy rendezvous)
    /// unless another single-copy send to the same peer is under way
    /// ([`Transport::remote_copies_under_way`]).
    pub always_eager_limit: usize,
    /// Bytes of cells in each queue: a power of two from
    /// [`QUEUE_SIZE_MIN`] to [`QUEUE_SIZE_MAX`].
    pub queue_size: usize,
    /// Whether long messages may be copied with cross-memory attach
    /// ([`CMA_ENV`]); where the kernel refuses, they go through the queue
    /// anyway.
    pub cross_memory_attach: bool,
}

impl ShmConfig {
    /// Reads `OXMPI_SHM_EAGER_LIMIT`, `OXMPI_SHM_QUEUE_SIZE`,
    /// `OXMPI_SHM_CMA`, and
    /// `MPI_LOCALNRANKS` for the default queue size of a rank of `job`.
    pub fn from_env(job: &JobInfo) -> Result<ShmConfig> {
        let bytes = |var: &str, default: usize| match std::env::var(var) {
            Ok(v) => v.trim().parse().map_err(|_| {
                Error::new(
                    ErrorClass::Arg,
                    format!("{var}={v:?} is not a number of bytes"),
                )
            }),
            Err(_) => Ok(default),
        };
        let local_ranks = std::env::var("MPI_LOCALNRANKS")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(job.size);
        let cross_memory_attach = cma::allowed_by_env()?;
        let eager_limit = bytes(
            EAGER_LIMIT_ENV,
            Self::default_eager_limit(cross_memory_attach),
        )?;
        let config = ShmConfig {
            eager_limit,
            always_eager_limit: Self::default_always_eager_limit(cross_memory_attach, eager_limit),
            queue_size: bytes(QUEUE_SIZE_ENV, Self::default_queue_size(local_ranks))?,
            cross_memory_attach,
        };
        config.check()?;
        Ok(config)
    }

    /// The default eager limit. Past 16 KiB, a rendezvous with a single
    /// copy by cross-memory attach (both ends copying a share) beats an
    /// eager message's two copies through the queue: on the 2-core
    /// development VM, quiet, 32 KiB took 3.5 us against 5.3 eager and
    /// 64 KiB 4.4 against 8.3, while at 16 KiB and below eager wins (16
    /// KiB: 7 GB/s by rendezvous against 12.6 eager). Without cross-memory
    /// attach a rendezvous goes through the queue too, and only its
    /// handshake is saved by sending eagerly: 64 KiB.
    pub fn default_eager_limit(cross_memory_attach: bool) -> usize {
        if cross_memory_attach {
            16 * 1024
        } else {
            64 * 1024
        }
    }

    /// The default largest message always sent eagerly, for an eager
    /// limit of `eager_limit`. With cross-memory attach, a message of
    /// more than 6 KiB that its receiver waits for alone is faster by
    /// single copy: `oxbench latency` on the 2-core development VM, 16
    /// KiB 1.93 us by single copy against 2.80 eager, 8 KiB 1.54 against
    /// 1.78, 6 KiB 1.50 either way, 5 KiB 1.50 against 1.38; while one
    /// that follows others closely moves faster through the queue
    /// (`oxbench bw`, 16 KiB: 13.4 GB/s eager against 8-9.6 by single
    /// copy, where the receiver makes every copy). Without it, the eager
    /// limit.
    pub fn default_always_eager_limit(cross_memory_attach: bool, eager_limit: usize) -> usize {
        if cross_memory_attach {
            eager_limit.min(6 * 1024)
        } else {
            eager_limit
        }
    }

    /// The default queue size on a node of `local_ranks` ranks: the
    /// largest power of two within an equal share of 8 MiB
    /// among the other ranks, from 64 KiB to 1 MiB.
    pub fn default_queue_size(local_ranks: usize) -> usize {
        let share = QUEUE_BUDGET / local_ranks.saturating_sub(1).max(1);
        let power = 1 << (usize::BITS - 1 - share.leading_zeros());
        power.clamp(DEFAULT_QUEUE_MIN, DEFAULT_QUEUE_MAX)
    }

    fn check(&self) -> Result<()> {
        let q = self.queue_size;
        if !q.is_power_of_two() || !(QUEUE_SIZE_MIN..=QUEUE_SIZE_MAX).contains(&q) {
            return Err(Error::new(
                ErrorClass::Arg,
                format!(
                    "a shared-memory queue of {q} bytes ({QUEUE_SIZE_ENV}): it must be a power \
                     of two from {QUEUE_SIZE_MIN} to {QUEUE_SIZE_MAX}"
                ),
            ));
        }
        Ok(())
    }
}

/// A packet waiting to be written into a peer's queue.
struct Outgoing {
    header: [u8; HEADER_LEN],
    payload: Payload,
    /// `None` until the header went; then how many payload bytes did.
    sent: Option<usize>,
}

enum Payload {
    Owned(Vec<u8>),
    /// Zero-copy: the caller's memory, valid until `token` is completed.
    Borrowed {
        ptr: *const u8,
        len: usize,
        token: u64,
    },
}

impl Payload {
    fn bytes(&self) -> &[u8] {
        match self {
            Payload::Owned(v) => v,
            // An empty payload's pointer may be anything, even null.
            Payload::Borrowed { len: 0, .. } => &[],
            // SAFETY: `send_zcopy`'s caller keeps the memory valid and
            // unmodified until its completion is reported, which happens
            // only after the last byte was copied into the queue (or the
            // peer failed and the packet was dropped).
            Payload::Borrowed { ptr, len, .. } => unsafe { std::slice::from_raw_parts(*ptr, *len) },
        }
    }
}

/// This rank's queue to a peer.
struct OutLink {
    producer: Producer,
    /// The connection that hands the queue over; `None` while waiting to
    /// connect again (the peer's listener had a full backlog).
    conn: Option<usize>,
    /// The peer accepted the queue: packets may be written.
    ready: bool,
}

/// What this rank knows of one peer.
#[derive(Default)]
struct Peer {
    /// The peer's listener, from its card or its set-up message.
    name: Option<Vec<u8>>,
    out: Option<OutLink>,
    /// Packets waiting for room in (or the set-up of) the queue.
    queue: VecDeque<Outgoing>,
    /// The connection the peer opened to hand us its queue.
    in_conn: Option<usize>,
    /// The peer's process, as the kernel knows the other end of a set-up
    /// connection: what cross-memory attach copies from and to.
    pid: Option<libc::pid_t>,
    /// This rank's buffers offered to the peer for a single copy and not
    /// yet withdrawn: its sends to the peer by single copy under way.
    offered: usize,
    failed: Option<Error>,
}

/// The shared-memory transport of one rank.
pub struct ShmTransport {
    job: JobInfo,
    config: ShmConfig,
    host: HostId,
    card: String,
    /// The listener's name (bytes of the abstract address).
    name: Vec<u8>,
    listener: UnixListener,
    epoll: sys::Epoll,
    wake: sys::EventFd,
    conns: Vec<Option<Conn>>,
    peers: Vec<Peer>,
    inbound: Vec<InLink>,
    /// Peers with packets waiting, each once.
    backlog: Vec<PeerRank>,
    /// Peers to connect to again (their listener's backlog was full).
    retry: Vec<PeerRank>,
    /// Connections this rank opened whose handshake is not done: while
    /// there are any, every poll looks at the sockets (the peer answers at
    /// once). Connections strangers open are looked at only every
    /// [`SOCKETS_EVERY`] polls, so that they cannot slow the rank down.
    connecting: usize,
    /// Zero-copy sends finished outside `poll`, reported next poll.
    completed: Vec<u64>,
    /// Peers that failed outside `poll`, reported next poll.
    failures: Vec<(PeerRank, Error)>,
    /// Whether the next poll has more to do than read the inbound queues:
    /// something to report, a backlog, connections to retry or being set
    /// up, sockets to read (set wherever such work is queued, worked out
    /// again at the end of the full poll). Without it a poll reads the
    /// queues alone, one flag instead of a look at each kind of work.
    work_queued: bool,
    /// Polls until the sockets' turn (every [`SOCKETS_EVERY`]).
    polls_to_sockets: u32,
    /// Look at the sockets at the next poll (after a sleep: the wake-up
    /// bytes are read at once).
    sockets_due: bool,
    /// Between `arm_wakeup` and `disarm_wakeup`.
    armed: bool,
    /// Tokens epoll reported ready (kept to avoid an allocation per look).
    ready: Vec<u64>,
    cma: Cma,
    /// This process is registered for the kernel's barriers on other
    /// processes (`membarrier`): its queues with peers that are too use
    /// [`ring::Barriers::Asymmetric`].
    asymmetric_barriers: bool,
}

// SAFETY: the raw pointers in queued zero-copy packets refer to memory the
// ADI keeps valid until their completion; the mappings and descriptors
// belong to the process, not to a thread; the transport is used by one
// thread at a time (through `&mut`).
unsafe impl Send for ShmTransport {}

pub(crate) fn lost(peer: PeerRank, what: impl std::fmt::Display) -> Error {
    Error::new(
        ErrorClass::ProcFailed,
        format!("shared-memory connection to rank {peer} lost: {what}"),
    )
}

pub(crate) fn corrupt(peer: PeerRank, c: Corrupt) -> Error {
    Error::new(
        ErrorClass::ProcFailed,
        format!("rank {peer}'s shared-memory queue is corrupt: {}", c.0),
    )
}

/// The error `peer` fails with when the sink refused one of its headers:
/// the sink's own when it is already `ProcFailed` (the ADI's are), else its
/// message under that class, since every later send to the peer returns
/// this error and [`Transport::send`] promises `ProcFailed`.
pub(crate) fn broke_protocol(peer: PeerRank, refusal: Error) -> Error {
    if refusal.class() == ErrorClass::ProcFailed {
        return refusal;
    }
    Error::new(
        ErrorClass::ProcFailed,
        format!("rank {peer} broke the protocol: {}", refusal.message()),
    )
}

impl ShmTransport {
    /// Opens this rank's listener for `job`, after making sure it can make
    /// segments at all: where it cannot (`memfd_create` forbidden, say by
    /// a seccomp policy) this fails with `MPI_ERR_OTHER`, since a rank
    /// that published a card there would fail its peers' first messages
    /// instead.
    pub fn new(job: &JobInfo, config: ShmConfig) -> Result<ShmTransport> {
        config.check()?;
        let rank = job.rank as u32;
        Segment::create(rank, rank, 4).map_err(|e| {
            Error::new(
                ErrorClass::Other,
                format!("this rank cannot make shared-memory segments: {e}"),
            )
        })?;
        let host =
            HostId::current().map_err(|e| Error::os("learning the host identity from /proc", e))?;
        // Found and said now: a bad OXMPI_NUMA_NODES fails initialize.
        numa::process_placement()?;
        let asymmetric_barriers = match sys::register_for_barriers() {
            Ok(()) => true,
            Err(e) => {
                vlog!(
                    "shm: rank {}: no asymmetric barriers ({e}): both sides of its queues \
                     fence at every message",
                    job.rank
                );
                false
            }
        };
        let (listener, name) = Self::listen()?;
        let epoll = sys::Epoll::new().map_err(|e| Error::os("creating the shm poller", e))?;
        let wake = sys::EventFd::new().map_err(|e| Error::os("creating the shm eventfd", e))?;
        epoll
            .add(listener.as_fd(), LISTENER)
            .and_then(|()| epoll.add(wake.as_fd(), WAKE))
            .and_then(|()| epoll.add(handover::poller()?, HANDOVER))
            .map_err(|e| Error::os("registering the shm listener and region hand-over", e))?;
        Ok(ShmTransport {
            cma: Cma::new(job.rank, config.cross_memory_attach),
            job: job.clone(),
            config,
            card: Card::format(&host, &name),
            host,
            name: name.into_bytes(),
            listener,
            epoll,
            wake,
            conns: Vec::new(),
            peers: (0..job.size).map(|_| Peer::default()).collect(),
            inbound: Vec::new(),
            backlog: Vec::new(),
            retry: Vec::new(),
            connecting: 0,
            completed: Vec::new(),
            failures: Vec::new(),
            work_queued: false,
            polls_to_sockets: SOCKETS_EVERY,
            sockets_due: false,
            armed: false,
            ready: Vec::new(),
            asymmetric_barriers,
        })
    }

    /// A listener under a fresh random name (another one if someone holds
    /// the first).
    fn listen() -> Result<(UnixListener, String)> {
        let mut tries = 0;
        loop {
            let name = host::listener_name(std::process::id())
                .map_err(|e| Error::os("drawing a listener name", e))?;
            match sys::listen_abstract(name.as_bytes()) {
                Ok(listener) => return Ok((listener, name)),
                Err(e) if e.kind() == io::ErrorKind::AddrInUse && tries < 3 => tries += 1,
                Err(e) => return Err(Error::os(format!("listening on @{name}"), e)),
            }
        }
    }

    fn cells(&self) -> u64 {
        (self.config.queue_size / CELL) as u64
    }

    /// Runs the cross-memory copy `copy` of `len` bytes at `remote` in
    /// `peer`'s process: `Ok(false)` if copies are off or the kernel
    /// refuses them; an error (and the peer failed) if the peer named
    /// memory it does not have or is gone.
    fn remote_copy(
        &mut self,
        peer: PeerRank,
        remote: u64,
        len: usize,
        copy: impl FnOnce(libc::pid_t) -> io::Result<()>,
    ) -> Result<bool> {
        self.check_peer(peer)?;
        let Some(pid) = self.peers[peer].pid.filter(|_| self.cma.enabled()) else {
            return Ok(false);
        };
        match copy(pid) {
            Ok(()) => {
                self.cma.worked(peer, len);
                Ok(true)
            }
            Err(e) => match self.cma.judge(peer, remote, len, e) {
                Refusal::Refused => Ok(false),
                Refusal::Peer(error) => {
                    self.fail_peer(peer, error.clone());
                    Err(error)
                }
            },
        }
    }

    /// Checks that `peer` is another rank of the job that has not failed.
    fn check_peer(&self, peer: PeerRank) -> Result<()> {
        match self.peers.get(peer) {
            _ if peer == self.job.rank => Err(Error::new(
                ErrorClass::Intern,
                "the shared-memory transport was asked to send to its own rank",
            )),
            None => Err(Error::new(
                ErrorClass::Rank,
                format!("rank {peer} is not in the job"),
            )),
            Some(Peer {
                failed: Some(e), ..
            }) => Err(e.clone()),
            Some(_) => Ok(()),
        }
    }

    fn insert(&mut self, stream: UnixStream, role: Role) -> io::Result<usize> {
        let index = self
            .conns
            .iter()
            .position(Option::is_none)
            .unwrap_or(self.conns.len());
        self.epoll.add(stream.as_fd(), index as u64)?;
        let conn = Conn {
            stream,
            inbox: Vec::new(),
            fds: Vec::new(),
            role,
        };
        if matches!(conn.role, Role::Out { .. }) {
            self.connecting += 1;
            self.work_queued = true;
        }
        if index == self.conns.len() {
            self.conns.push(Some(conn));
        } else {
            self.conns[index] = Some(conn);
        }
        Ok(index)
    }

    fn close(&mut self, index: usize) {
        if let Some(conn) = self.conns.get_mut(index).and_then(Option::take) {
            let _ = self.epoll.remove(conn.stream.as_fd());
            if conn.handshaking() && matches!(conn.role, Role::Out { .. }) {
                self.connecting -= 1;
            }
        }
    }

    /// The outbound link to `peer` when a packet may go straight into its
    /// queue: set up, accepted, and with nothing of the peer's waiting
    /// to go before it. A queue that is set up belongs to another rank of
    /// the job that has not failed (failing a peer takes its queue): the
    /// checks of `check_peer` are for the slow path.
    #[inline(always)]
    fn ready_link(&mut self, peer: PeerRank) -> Option<&mut OutLink> {
        match self.peers.get_mut(peer) {
            Some(Peer {
                out: Some(link),
                queue,
                ..
            }) if link.ready && queue.is_empty() => Some(link),
            _ => None,
        }
    }

    /// What follows writing a packet straight into `peer`'s queue
    /// (`pushed`: whether it went whole, or the queue's corruption;
    /// `wrote`: whether any of it went): a consumer that sleeps is poked,
    /// a corrupt queue fails the peer. True when the packet is whole in
    /// the queue, false when the rest waits.
    #[inline(always)]
    fn pushed(
        &mut self,
        peer: PeerRank,
        pushed: Result<bool, Corrupt>,
        wrote: bool,
    ) -> Result<bool> {
        match pushed {
            Ok(done) => {
                let link = self.peers[peer].out.as_ref();
                if wrote && link.is_some_and(|l| l.producer.consumer_sleeping()) {
                    if let Some(conn) = link
                        .and_then(|l| l.conn)
                        .and_then(|i| self.conns[i].as_ref())
                    {
                        conn.poke();
                    }
                }
                Ok(done)
            }
            Err(c) => {
                let error = corrupt(peer, c);
                self.fail_peer(peer, error.clone());
                Err(error)
            }
        }
    }

    /// `peer` is lost: its connections close, its queues are unmapped, the
    /// packets waiting for it are dropped (zero-copy ones without a
    /// completion), and the failure is reported at the next poll.
    fn fail_peer(&mut self, peer: PeerRank, error: Error) {
        if self.peers[peer].failed.is_some() {
            return;
        }
        let p = &mut self.peers[peer];
        let conns = [p.out.take().and_then(|l| l.conn), p.in_conn.take()];
        p.queue.clear();
        p.failed = Some(error.clone());
        for index in conns.into_iter().flatten() {
            self.close(index);
        }
        self.inbound.retain(|l| l.peer != peer);
        self.backlog.retain(|&p| p != peer);
        self.retry.retain(|&p| p != peer);
        vlog!("shm: rank {}: {error}", self.job.rank);
        self.failures.push((peer, error));
        self.work_queued = true;
    }

    /// `peer`'s connection ended or broke: what it published before is
    /// delivered (or found corrupt), then it fails.
    fn lose_peer(&mut self, peer: PeerRank, error: Error, sink: &mut dyn PacketSink) {
        let error = match self.inbound.iter_mut().find(|l| l.peer == peer) {
            Some(link) => link.receive(sink).err().unwrap_or(error),
            None => error,
        };
        self.fail_peer(peer, error);
    }

    /// Queues what did not go of a packet to `peer` (`sent`: as
    /// [`Producer::push_packet`] says), copied, to be written from `poll`.
    #[inline(never)]
    fn send_later(
        &mut self,
        peer: PeerRank,
        header: &Header,
        payload: &[u8],
        sent: Option<usize>,
    ) -> Result<()> {
        self.check_peer(peer)?;
        let rest = &payload[sent.unwrap_or(0)..];
        self.enqueue(
            peer,
            Outgoing {
                header: header.encode(),
                payload: Payload::Owned(rest.to_vec()),
                sent: sent.map(|_| 0),
            },
        )
    }

    /// Creates the queue to `peer` and starts handing it over.
    fn connect(&mut self, peer: PeerRank) -> Result<()> {
        if self.peers[peer].name.is_none() {
            return Err(Error::new(
                ErrorClass::Intern,
                format!("the shared-memory transport has no card for rank {peer}"),
            ));
        }
        let segment =
            Segment::create(self.job.rank as u32, peer as u32, self.cells()).map_err(|e| {
                Error::new(
                    ErrorClass::Other,
                    format!("cannot create the shared-memory queue to rank {peer}: {e}"),
                )
            })?;
        self.peers[peer].out = Some(OutLink {
            producer: Producer::new(segment, self.asymmetric_barriers),
            conn: None,
            ready: false,
        });
        self.open_connection(peer)
    }

    /// Connects to `peer`'s listener and sends HELLO; if its backlog is
    /// full, tries again at the next look at the sockets.
    fn open_connection(&mut self, peer: PeerRank) -> Result<()> {
        let name = self.peers[peer].name.clone().unwrap_or_default();
        let stream = match sys::connect_abstract(&name) {
            Ok(Some(stream)) => stream,
            Ok(None) => {
                self.retry.push(peer);
                self.work_queued = true;
                return Ok(());
            }
            Err(e) => return Err(lost(peer, format!("cannot connect to its socket: {e}"))),
        };
        let (connector, hello) = Connector::new(&self.job, peer, Channel::Packets)
            .map_err(|e| Error::new(ErrorClass::Other, e.to_string()))?;
        let index = self
            .insert(
                stream,
                Role::Out {
                    peer,
                    step: OutStep::AwaitChallenge,
                    connector,
                },
            )
            .map_err(|e| Error::os("registering a shm connection", e))?;
        if let Some(link) = self.peers[peer].out.as_mut() {
            link.conn = Some(index);
        }
        if let Some(conn) = self.conns[index].as_ref() {
            write_message(&conn.stream, &hello, None)
                .map_err(|e| lost(peer, format!("sending the handshake: {e}")))?;
        }
        Ok(())
    }

    /// Queues `packet` for `peer`, creating the queue to it first if there
    /// is none.
    fn enqueue(&mut self, peer: PeerRank, packet: Outgoing) -> Result<()> {
        if self.peers[peer].out.is_none() {
            if let Err(e) = self.connect(peer) {
                if e.class() == ErrorClass::ProcFailed {
                    self.fail_peer(peer, e.clone());
                } else {
                    self.peers[peer].out = None;
                }
                return Err(e);
            }
        }
        self.peers[peer].queue.push_back(packet);
        if !self.backlog.contains(&peer) {
            self.backlog.push(peer);
        }
        self.work_queued = true;
        Ok(())
    }

    /// Writes what fits of `peer`'s waiting packets. Returns whether
    /// anything was written.
    fn flush(&mut self, peer: PeerRank) -> Result<bool> {
        let Peer { out, queue, .. } = &mut self.peers[peer];
        let Some(link) = out.as_mut().filter(|l| l.ready) else {
            return Ok(false);
        };
        let mut wrote = false;
        while let Some(packet) = queue.front_mut() {
            let before = packet.sent;
            let done = link
                .producer
                .push_packet(&packet.header, packet.payload.bytes(), &mut packet.sent)
                .map_err(|c| corrupt(peer, c))?;
            wrote |= packet.sent != before;
            if !done {
                break;
            }
            if let Some(Outgoing {
                payload: Payload::Borrowed { token, .. },
                ..
            }) = queue.pop_front()
            {
                self.completed.push(token);
                self.work_queued = true;
            }
        }
        if wrote && link.producer.consumer_sleeping() {
            if let Some(conn) = link.conn.and_then(|i| self.conns[i].as_ref()) {
                conn.poke();
            }
        }
        Ok(wrote)
    }

    /// Flushes every peer with waiting packets.
    fn flush_backlog(&mut self) -> bool {
        let mut progressed = false;
        let mut k = 0;
        while let Some(&peer) = self.backlog.get(k) {
            match self.flush(peer) {
                Ok(wrote) => progressed |= wrote,
                Err(e) => {
                    // Takes the peer out of the backlog.
                    self.fail_peer(peer, e);
                    progressed = true;
                    continue;
                }
            }
            if self.peers[peer].queue.is_empty() {
                self.backlog.swap_remove(k);
            } else {
                k += 1;
            }
        }
        progressed
    }

    /// Reads every inbound queue from the one at `seen`, whose head this
    /// poll has just seen published (the ones before it empty): a read of
    /// a message found by the quick look of [`Transport::poll`] does not
    /// look at its head again. `None`: all of them, each after a look.
    /// Inline in both its callers: a frame less between a message's
    /// detection and its delivery.
    #[inline(always)]
    fn receive_all(&mut self, sink: &mut dyn PacketSink, seen: Option<usize>) -> bool {
        let mut progressed = false;
        let mut k = seen.unwrap_or(0);
        while let Some(link) = self.inbound.get_mut(k) {
            // One load of the head's control word first: most polls of a
            // waiting rank find every queue empty, and the detection delay
            // of a message is the time such a poll takes.
            if Some(k) != seen && !link.consumer.has_frame() {
                k += 1;
                continue;
            }
            match link.receive(sink) {
                Ok(false) => k += 1,
                Ok(true) => {
                    progressed = true;
                    if link.consumer.producer_waiting() {
                        if let Some(conn) = self.conns[link.conn].as_ref() {
                            conn.poke();
                        }
                    }
                    k += 1;
                }
                Err(e) => {
                    // Takes the link out of `inbound`.
                    let peer = link.peer;
                    self.fail_peer(peer, e);
                    progressed = true;
                }
            }
        }
        progressed
    }

    /// A poll that has something to do: reports, reads the inbound
    /// queues, writes what waits and, when due, looks at the sockets.
    #[inline(never)]
    fn poll_now(&mut self, sink: &mut dyn PacketSink) -> Result<bool> {
        let mut progressed = self.report(sink);
        progressed |= self.receive_all(sink, None);
        if !self.backlog.is_empty() {
            progressed |= self.flush_backlog();
        }
        if self.sockets_due
            || self.connecting > 0
            || !self.retry.is_empty()
            || self.polls_to_sockets == 0
        {
            progressed |= self.service_sockets(sink)?;
        }
        progressed |= self.report(sink);
        self.work_queued = !self.backlog.is_empty()
            || self.sockets_due
            || self.connecting > 0
            || !self.retry.is_empty()
            || !self.completed.is_empty()
            || !self.failures.is_empty();
        Ok(progressed)
    }

    /// A poll that has frames to read, from the inbound queue at `seen`
    /// on, and nothing else to do. Out of line, as `poll_now`: the
    /// fruitless poll then saves no registers.
    #[inline(never)]
    fn receive_now(&mut self, sink: &mut dyn PacketSink, seen: usize) -> Result<bool> {
        let progressed = self.receive_all(sink, Some(seen));
        // A peer whose queue was corrupt failed while reading.
        Ok(self.report(sink) | progressed)
    }

    /// Reports the sends finished and the peers failed outside `poll`.
    #[inline]
    fn report(&mut self, sink: &mut dyn PacketSink) -> bool {
        if self.completed.is_empty() && self.failures.is_empty() {
            return false;
        }
        self.report_now(sink)
    }

    fn report_now(&mut self, sink: &mut dyn PacketSink) -> bool {
        for token in self.completed.drain(..) {
            sink.on_send_complete(token);
        }
        for (peer, error) in self.failures.drain(..) {
            sink.on_peer_failed(peer, error);
        }
        true
    }

    /// Accepts, sets up, reads wake-ups from and notices the end of
    /// connections. Returns whether a connection changed.
    fn service_sockets(&mut self, sink: &mut dyn PacketSink) -> Result<bool> {
        self.polls_to_sockets = SOCKETS_EVERY;
        self.sockets_due = false;
        let mut progressed = false;
        for peer in std::mem::take(&mut self.retry) {
            if let Err(e) = self.open_connection(peer) {
                self.fail_peer(peer, e);
            }
            progressed = true;
        }
        let mut ready = std::mem::take(&mut self.ready);
        self.epoll
            .ready_now(&mut ready)
            .map_err(|e| Error::os("polling shm sockets", e))?;
        for &token in &ready {
            match token {
                LISTENER => progressed |= self.accept_all(),
                WAKE => self
                    .wake
                    .clear()
                    .map_err(|e| Error::os("clearing the shm eventfd", e))?,
                HANDOVER => handover::serve(),
                index => progressed |= self.service(index as usize, sink),
            }
        }
        self.ready = ready;
        Ok(progressed)
    }

    fn accept_all(&mut self) -> bool {
        let mut accepted = false;
        loop {
            match self.listener.accept() {
                Ok((stream, _)) => {
                    let registered = stream
                        .set_nonblocking(true)
                        .map_err(|e| e.to_string())
                        .and_then(|()| Acceptor::new(&self.job).map_err(|e| e.to_string()))
                        .and_then(|acceptor| {
                            let role = Role::In {
                                step: InStep::AwaitHello,
                                acceptor,
                            };
                            self.insert(stream, role).map_err(|e| e.to_string())
                        });
                    match registered {
                        Ok(_) => accepted = true,
                        Err(e) => vlog!("shm: rank {}: refusing a connection: {e}", self.job.rank),
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return accepted,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    vlog!("shm: rank {}: accept failed: {e}", self.job.rank);
                    return accepted;
                }
            }
        }
    }

    /// Handles what connection `index` received. Returns whether its
    /// state changed.
    fn service(&mut self, index: usize, sink: &mut dyn PacketSink) -> bool {
        let Some(conn) = self.conns.get_mut(index).and_then(Option::as_mut) else {
            return false;
        };
        let read = conn.read_available();
        match conn.role {
            Role::Out { peer, .. } => {
                if let Err(e) = read.and_then(|ended| self.advance_out(index, peer, ended)) {
                    self.lose_peer(peer, lost(peer, e), sink);
                    return true;
                }
            }
            Role::In {
                step: InStep::Ready { peer },
                ..
            } => match read {
                Ok(false) if self.conns[index].as_ref().is_some_and(|c| c.fds.is_empty()) => {}
                outcome => {
                    let why = match outcome {
                        Ok(true) => "it closed its connection (it ended)".to_owned(),
                        Ok(false) => "it sent a descriptor after set-up".to_owned(),
                        Err(e) => e.to_string(),
                    };
                    self.lose_peer(peer, lost(peer, why), sink);
                    return true;
                }
            },
            Role::In { .. } => {
                if let Err(why) = read
                    .map_err(|e| e.to_string())
                    .and_then(|ended| self.advance_in(index, ended))
                {
                    let peer = match self.conns[index].as_ref().map(|c| &c.role) {
                        Some(Role::In {
                            step: InStep::AwaitSetup { peer },
                            ..
                        }) => Some(*peer),
                        _ => None,
                    };
                    self.close(index);
                    match peer {
                        // A job member proved the secret and then failed.
                        Some(peer) => self.fail_peer(
                            peer,
                            Error::new(
                                ErrorClass::ProcFailed,
                                format!(
                                    "rank {peer} cannot share memory with rank {}: {why}",
                                    self.job.rank
                                ),
                            ),
                        ),
                        None => vlog!("shm: rank {}: refused a connection: {why}", self.job.rank),
                    }
                }
                return true;
            }
        }
        false
    }

    /// Advances the handshake of our connection `index` to `peer`.
    fn advance_out(&mut self, index: usize, peer: PeerRank, ended: bool) -> io::Result<()> {
        let conn = self.conns[index].as_mut().ok_or(io::ErrorKind::NotFound)?;
        let Role::Out {
            step, connector, ..
        } = &mut conn.role
        else {
            return Ok(());
        };
        let refused = |e: oxmpi_adi::auth::AuthError| {
            io::Error::new(io::ErrorKind::InvalidData, e.to_string())
        };
        if !conn.fds.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "it sent a descriptor to the rank that opened the connection",
            ));
        }
        if *step == OutStep::AwaitChallenge {
            if let Some(msg) = take_message::<MESSAGE_LEN>(&mut conn.inbox) {
                let response = connector.on_challenge(&msg).map_err(refused)?;
                *step = OutStep::AwaitVerdict;
                let setup = proto::encode_setup(&self.name);
                let link = self.peers[peer]
                    .out
                    .as_ref()
                    .ok_or(io::ErrorKind::NotFound)?;
                write_message(&conn.stream, &response, None)?;
                write_message(&conn.stream, &setup, Some(link.producer.segment().fd()))?;
            }
        }
        if *step == OutStep::AwaitVerdict {
            if let Some(msg) = take_message::<MESSAGE_LEN>(&mut conn.inbox) {
                match connector.on_verdict(&msg).map_err(refused)? {
                    Verdict::Accept => {
                        // Only now: the consumer allocated the pages on
                        // its nodes; this maps them before the first packet.
                        if let Some(link) = self.peers[peer].out.as_ref() {
                            link.producer.segment().populate().map_err(|e| {
                                io::Error::new(
                                    e.kind(),
                                    format!("faulting in the pages of its queue: {e}"),
                                )
                            })?;
                        }
                        *step = OutStep::Ready;
                        self.connecting -= 1;
                        self.peers[peer].pid = sys::peer_pid(&conn.stream).ok();
                        if let Some(link) = self.peers[peer].out.as_mut() {
                            link.producer.take_agreed_barriers();
                            link.ready = true;
                        }
                        vlog!("shm: rank {}: queue to rank {peer} set up", self.job.rank);
                    }
                    Verdict::Duplicate => {
                        return Err(io::Error::new(
                            io::ErrorKind::AlreadyExists,
                            "it already has a queue from this rank",
                        ))
                    }
                }
            }
        }
        if ended {
            let set_up = self.conns[index].as_ref().is_some_and(|c| !c.handshaking());
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                if set_up {
                    "it closed its connection (it ended)"
                } else {
                    "it closed the connection during set-up (it refused the queue, or ended)"
                },
            ));
        }
        Ok(())
    }

    /// Advances the handshake of connection `index`, which a peer opened.
    fn advance_in(&mut self, index: usize, ended: bool) -> std::result::Result<(), String> {
        loop {
            let conn = self.conns[index].as_mut().ok_or("gone")?;
            let Role::In { step, acceptor } = &mut conn.role else {
                return Ok(());
            };
            match *step {
                InStep::AwaitHello => {
                    if !conn.fds.is_empty() {
                        return Err("it sent a descriptor before authenticating".into());
                    }
                    let Some(msg) = take_message::<MESSAGE_LEN>(&mut conn.inbox) else {
                        break;
                    };
                    let (peer, channel, challenge) = acceptor
                        .on_hello(&self.job, &msg)
                        .map_err(|e| e.to_string())?;
                    if channel != Channel::Packets {
                        return Err(format!("rank {peer} asks for a {channel:?} channel"));
                    }
                    *step = InStep::AwaitResponse { peer };
                    write_message(&conn.stream, &challenge, None).map_err(|e| e.to_string())?;
                }
                InStep::AwaitResponse { peer } => {
                    let Some(msg) = take_message::<MESSAGE_LEN>(&mut conn.inbox) else {
                        break;
                    };
                    acceptor
                        .on_response(&msg)
                        .map_err(|e| format!("claimed rank {peer}: {e}"))?;
                    *step = InStep::AwaitSetup { peer };
                }
                InStep::AwaitSetup { peer } => {
                    let Some(msg) = take_message::<SETUP_LEN>(&mut conn.inbox) else {
                        break;
                    };
                    return self.accept_queue(index, peer, &msg);
                }
                InStep::Ready { .. } => return Ok(()),
            }
        }
        if ended {
            return Err("the connection closed during the handshake".into());
        }
        Ok(())
    }

    /// `peer`, authenticated on connection `index`, hands over its queue
    /// to this rank with `setup`: checks and maps it, and accepts.
    fn accept_queue(
        &mut self,
        index: usize,
        peer: PeerRank,
        setup: &[u8; SETUP_LEN],
    ) -> std::result::Result<(), String> {
        let name = proto::decode_setup(setup).map_err(|e| e.to_string())?;
        let conn = self.conns[index].as_mut().ok_or("gone")?;
        let Role::In { step, acceptor } = &mut conn.role else {
            return Err("not an inbound connection".into());
        };
        if conn.fds.len() != 1 {
            return Err(format!(
                "it sent {} descriptors with its set-up message instead of 1",
                conn.fds.len()
            ));
        }
        let p = &mut self.peers[peer];
        if p.in_conn.is_some() || p.failed.is_some() {
            // Not a failure of the peer: keep what exists.
            let _ = write_message(&conn.stream, &acceptor.verdict(Verdict::Duplicate), None);
            vlog!(
                "shm: rank {}: refused a second queue from rank {peer}",
                self.job.rank
            );
            self.close(index);
            return Ok(());
        }
        let file = File::from(conn.fds.remove(0));
        let mut segment =
            Segment::open(file, peer as u32, self.job.rank as u32).map_err(|e| e.to_string())?;
        // Before the VERDICT: the producer writes no packet, and touches
        // no page, until it has it.
        segment
            .place_on_own_nodes(format_args!("the queue from rank {peer}"))
            .map_err(|e| e.to_string())?;
        // Before the VERDICT too: it tells the producer which barriers the
        // queue uses.
        let consumer = Consumer::new(segment, self.asymmetric_barriers);
        write_message(&conn.stream, &acceptor.verdict(Verdict::Accept), None)
            .map_err(|e| e.to_string())?;
        *step = InStep::Ready { peer };
        conn.inbox.clear();
        p.in_conn = Some(index);
        p.pid = sys::peer_pid(&conn.stream).ok();
        p.name.get_or_insert(name);
        // The producer publishes nothing before it reads the VERDICT,
        // sent after this store: it sees the flag without a barrier.
        if self.armed {
            consumer.set_sleeping(true);
        }
        self.inbound.push(InLink {
            peer,
            consumer,
            conn: index,
            read: ReadState::Header,
            whole: Box::new([0; inbound::WHOLE_MAX]),
        });
        vlog!("shm: rank {}: queue from rank {peer} set up", self.job.rank);
        Ok(())
    }
}

impl Transport for ShmTransport {
    fn name(&self) -> &'static str {
        "shm"
    }

    fn card(&self) -> &str {
        &self.card
    }

    fn reachable(&self, card: &str) -> bool {
        Card::parse(card).is_some_and(|c| c.host == self.host)
    }

    fn add_peer(&mut self, peer: PeerRank, card: &str) -> Result<()> {
        let parsed = Card::parse(card).ok_or_else(|| {
            Error::new(
                ErrorClass::Other,
                format!("rank {peer} published a bad shared-memory card {card:?}"),
            )
        })?;
        if parsed.version != SHM_VERSION {
            return Err(Error::new(
                ErrorClass::Other,
                format!(
                    "rank {peer} speaks shared-memory version {}, this rank speaks {SHM_VERSION}: \
                     run the same oxmpi on every rank",
                    parsed.version
                ),
            ));
        }
        if parsed.host != self.host {
            return Err(Error::new(
                ErrorClass::Other,
                format!("rank {peer} runs on another host or network namespace ({card})"),
            ));
        }
        let slot = self.peers.get_mut(peer).ok_or_else(|| {
            Error::new(ErrorClass::Rank, format!("rank {peer} is not in the job"))
        })?;
        slot.name = Some(parsed.name);
        Ok(())
    }

    fn eager_limit(&self) -> usize {
        self.config.eager_limit
    }

    fn always_eager_limit(&self) -> usize {
        self.config.always_eager_limit
    }

    fn remote_copies_under_way(&self, peer: PeerRank) -> bool {
        self.peers.get(peer).is_some_and(|p| p.offered > 0)
    }

    fn send(&mut self, peer: PeerRank, header: &Header, payload: &[u8]) -> Result<()> {
        let mut sent = None;
        if let Some(link) = self.ready_link(peer) {
            // Fast path: straight into the queue, a short message whole in
            // one cell.
            let pushed = match proto::encode_short(header, payload) {
                Some(fields) => link
                    .producer
                    .push_short(&fields, payload)
                    .inspect(|&done| sent = done.then_some(payload.len())),
                None => link
                    .producer
                    .push_packet(&header.encode(), payload, &mut sent),
            };
            if self.pushed(peer, pushed, sent.is_some())? {
                return Ok(());
            }
        }
        self.send_later(peer, header, payload, sent)
    }

    fn send_standard_eager(
        &mut self,
        peer: PeerRank,
        sequence: u32,
        envelope: Envelope,
        payload: &[u8],
    ) -> Result<()> {
        if payload.len() <= proto::SHORT_FRAME_PAYLOAD_MAX {
            if let Some(link) = self.ready_link(peer) {
                // The short frame's fields straight from the parts, with
                // no header to build and judge.
                let fields = proto::short_fields(sequence, envelope);
                let pushed = if payload.len() <= proto::SHORT_PAYLOAD_MAX {
                    link.producer.push_short(&fields, payload)
                } else {
                    link.producer.push_short_frame(&fields, payload)
                };
                let whole = pushed == Ok(true);
                if self.pushed(peer, pushed, whole)? {
                    return Ok(());
                }
            }
        }
        let header = Header::standard_eager(sequence, envelope, payload.len());
        self.send(peer, &header, payload)
    }

    unsafe fn send_zcopy(
        &mut self,
        peer: PeerRank,
        header: &Header,
        payload: *const u8,
        len: usize,
        token: u64,
    ) -> Result<()> {
        self.check_peer(peer)?;
        self.enqueue(
            peer,
            Outgoing {
                header: header.encode(),
                payload: Payload::Borrowed {
                    ptr: payload,
                    len,
                    token,
                },
                sent: None,
            },
        )?;
        if let Err(e) = self.flush(peer) {
            self.fail_peer(peer, e);
        }
        Ok(())
    }

    fn poll(&mut self, sink: &mut dyn PacketSink) -> Result<bool> {
        self.polls_to_sockets = self.polls_to_sockets.saturating_sub(1);
        if self.work_queued || self.polls_to_sockets == 0 {
            return self.poll_now(sink);
        }
        // Most polls of a waiting rank find nothing to do; they return
        // after a load of each inbound queue's head control word. One that
        // finds frames and nothing else to do reads them without the rest
        // of the full poll: the time from a message's publication to its
        // delivery.
        for seen in 0..self.inbound.len() {
            if self.inbound[seen].consumer.has_frame() {
                return self.receive_now(sink, seen);
            }
        }
        Ok(false)
    }

    fn arm_wakeup(&mut self) -> Result<Option<RawFd>> {
        self.armed = true;
        let waiting = || {
            self.backlog
                .iter()
                .filter_map(|&peer| self.peers[peer].out.as_ref().filter(|l| l.ready))
        };
        let mut asymmetric = false;
        for link in &self.inbound {
            link.consumer.set_sleeping(true);
            asymmetric |= link.consumer.barriers() == Barriers::Asymmetric;
        }
        for link in waiting() {
            link.producer.set_waiting(true);
            asymmetric |= link.producer.barriers() == Barriers::Asymmetric;
        }
        // Anything to do already must not be slept through; nor may a
        // sleep without its barrier, which could miss a peer's look at the
        // flags.
        let mut work = !self.completed.is_empty() || !self.failures.is_empty();
        if let Err(e) = ring::before_sleeping_look(asymmetric) {
            vlog!(
                "shm: rank {}: no barrier before sleeping ({e}): polling instead",
                self.job.rank
            );
            work = true;
        }
        work |= self.inbound.iter().any(|link| link.consumer.has_frame());
        work |= waiting().any(|link| link.producer.head_moved());
        if work {
            self.wake
                .signal()
                .map_err(|e| Error::os("signalling the shm eventfd", e))?;
        }
        Ok(Some(self.epoll.as_raw_fd()))
    }

    fn disarm_wakeup(&mut self) -> Result<()> {
        self.armed = false;
        for link in &self.inbound {
            link.consumer.set_sleeping(false);
        }
        for link in self.peers.iter().filter_map(|p| p.out.as_ref()) {
            link.producer.set_waiting(false);
        }
        // The bytes that woke the sleep are read at once.
        self.sockets_due = true;
        self.work_queued = true;
        Ok(())
    }

    fn has_pending_sends(&self) -> bool {
        !self.backlog.is_empty() || !self.completed.is_empty()
    }

    fn offers_remote_copy(&self, peer: PeerRank) -> bool {
        self.cma.enabled()
            && self
                .peers
                .get(peer)
                .is_some_and(|p| p.pid.is_some() && p.failed.is_none())
    }

    unsafe fn remote_offer(
        &mut self,
        peer: PeerRank,
        _buf: *const u8,
        _len: usize,
    ) -> Result<Option<u64>> {
        if !self.offers_remote_copy(peer) {
            return Ok(None);
        }
        self.peers[peer].offered += 1;
        // The receiver reads the sender's process by address: no key.
        Ok(Some(0))
    }

    fn remote_withdraw(&mut self, peer: PeerRank, _key: u64) {
        if let Some(p) = self.peers.get_mut(peer) {
            p.offered = p.offered.saturating_sub(1);
        }
    }

    unsafe fn remote_read(
        &mut self,
        peer: PeerRank,
        remote: u64,
        local: *mut u8,
        len: usize,
    ) -> Result<bool> {
        if len == 0 {
            return Ok(true);
        }
        // SAFETY: the caller gives `local` valid for writes of `len`
        // bytes, touched by nothing else during the call.
        let local = unsafe { std::slice::from_raw_parts_mut(local, len) };
        self.remote_copy(peer, remote, len, |pid| {
            sys::read_remote(pid, remote, local)
        })
    }

    unsafe fn remote_write(
        &mut self,
        peer: PeerRank,
        local: *const u8,
        remote: u64,
        len: usize,
    ) -> Result<bool> {
        if len == 0 {
            return Ok(true);
        }
        // SAFETY: the caller gives `local` valid for reads of `len` bytes
        // during the call.
        let local = unsafe { std::slice::from_raw_parts(local, len) };
        self.remote_copy(peer, remote, len, |pid| {
            sys::write_remote(pid, local, remote)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_queues_share_a_budget_among_the_nodes_ranks() {
        let kib = |n: usize| n << 10;
        for (ranks, size) in [
            (1, kib(1024)),
            (2, kib(1024)),
            (9, kib(1024)),
            (10, kib(512)),
            (16, kib(512)),
            (64, kib(128)),
            (129, kib(64)),
            (100_000, kib(64)),
        ] {
            assert_eq!(ShmConfig::default_queue_size(ranks), size, "{ranks} ranks");
        }
    }
}
