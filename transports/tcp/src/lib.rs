//! oxmpi's Chameleon-style packet device over TCP sockets.
//!
//! This crate owns TCP connections between the ranks of a job: a listener
//! whose `ip:port` is the rank's business card, connections opened lazily
//! on the first packet to a peer (in either direction), the handshake that
//! proves the job's secret ([`oxmpi_adi::auth`]), and the moving of
//! packets: a small packet copied behind its header and written with one
//! `send`, a larger one with one `writev`, and payloads read straight into
//! the buffer the ADI names. It implements [`Transport`] and must not know
//! communicators, requests or matching.
//!
//! # Connections
//! Two ranks talk over one packet connection ([`Channel::Packets`]), which
//! carries every packet in both directions, in order. A connection is used
//! only once its handshake is done; packets for a peer wait in that peer's
//! queue until then, so nothing is lost or reordered. When two ranks
//! connect to each other at once, the connection opened by the lower rank
//! wins: the acceptor decides after the peer has authenticated (a stranger
//! cannot disturb it), rejecting as duplicate when it already has a
//! connection, or when its own attempt is pending and its rank is lower;
//! otherwise it accepts and abandons its own attempt. A stranger (garbage,
//! another version, a wrong secret) is refused with a reason under
//! `OXMPI_VERBOSE=1`, and the rank goes on.
//!
//! # Data lanes
//! Rendezvous data packets ([`Kind::Data`]) are not sequenced, so they may
//! take another path than the packets around them. The first time a rank
//! sends a peer one of at least 1 MiB it opens its data lanes to that peer
//! ([`Channel::Data`], `OXMPI_TCP_DATA_LANES` of them): connections that
//! carry only its data packets, one way. Once one is open, every data
//! packet of at least 1 MiB goes to the least loaded open lane, and the
//! packet connection keeps the small packets (RTS, CTS, eager messages) of
//! both directions free of bulk data: on loopback, 1 MiB messages in the
//! `bw` pattern move 6-35% more that way than with the data on the packet
//! connection, and `bibw` 8% more (MPICH over UCX's TCP transport also
//! spreads rendezvous data over a second connection). Smaller data stays
//! on the packet connection: a one-way flow gets no acknowledgements
//! riding on packets the other way, and its sender stalls until a TCP
//! loss probe, which costs more than the lane gains below 1 MiB. The
//! pieces of a streamed message (`FLAG_PIECE`, at most 256 KiB each) keep
//! to the packet connection too, because they must arrive in order.
//!
//! A rank reads a peer's lanes on every poll only while it expects data
//! from that peer (it sent a CTS whose data has not begun to arrive, or a
//! payload is half read), so that idle lanes cost small-message latency
//! nothing; otherwise every 32nd poll. A lane that cannot be opened is
//! given up (the data keeps to the packet connection); a lane lost once
//! open fails the peer, as the packet connection does.
//!
//! # Environment
//! - `OXMPI_TCP_EAGER_LIMIT`: largest message in bytes sent eagerly
//!   (default 65536).
//! - `OXMPI_TCP_DATA_LANES`: data lanes a rank opens to each peer it sends
//!   rendezvous data to, 0 to [`MAX_DATA_LANES`] (default 1).
//! - `OXMPI_TCP_ADDR`: the IP address to listen on and publish (default
//!   127.0.0.1).
//! - `OXMPI_TCP_LOOPBACK_CONGESTION`: the TCP congestion control of
//!   connections to a peer on a loopback address (default `reno`;
//!   `system` keeps the system's default). See
//!   [`TcpConfig::loopback_congestion`].

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};
use oxmpi_adi::auth::{Acceptor, Channel, Connector, Verdict, MESSAGE_LEN};
use oxmpi_adi::proto::{Header, Kind, FLAG_PIECE, HEADER_LEN};
use oxmpi_adi::transport::{JobInfo, PacketSink, PayloadSlot, PeerRank, Transport};
use oxmpi_adi::{vlog, Error, ErrorClass, Result};
use socket2::{Domain, Protocol, SockRef, Socket, Type};
use std::collections::VecDeque;
use std::io::{self, IoSlice, Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::time::Duration;

/// Environment variable: eager limit in bytes.
pub const EAGER_LIMIT_ENV: &str = "OXMPI_TCP_EAGER_LIMIT";
/// Environment variable: data lanes per peer.
pub const DATA_LANES_ENV: &str = "OXMPI_TCP_DATA_LANES";
/// Environment variable: address to listen on and publish.
pub const ADDR_ENV: &str = "OXMPI_TCP_ADDR";
/// Environment variable: congestion control of loopback connections.
pub const LOOPBACK_CONGESTION_ENV: &str = "OXMPI_TCP_LOOPBACK_CONGESTION";
/// The congestion control loopback connections use unless
/// [`LOOPBACK_CONGESTION_ENV`] says otherwise.
pub const LOOPBACK_CONGESTION: &str = "reno";
/// The longest congestion control name Linux takes (`TCP_CA_NAME_MAX`,
/// with its terminating zero).
const CONGESTION_NAME_MAX: usize = 16;
/// The most data lanes a rank opens to one peer, and accepts from one.
pub const MAX_DATA_LANES: usize = 8;

const LISTENER: Token = Token(usize::MAX);
/// Size of each connection's read buffer: several small packets come in
/// with one read.
const READ_BUFFER: usize = 64 * 1024;
/// Payloads with at least this many bytes still to come are read straight
/// into their destination rather than through the read buffer: the copy
/// out of the buffer would cost more than the read it saves.
const DIRECT_READ_MIN: usize = 16 * 1024;
/// After a packet whose payload filled at least the read buffer, the
/// next header is read with at most this many bytes: the next packet is
/// likely as large (the data of a stream of large gets, puts or
/// accumulates), and of its payload no more than this goes through the
/// buffer (and is copied out of it) before the rest is read straight
/// into its destination, where a full read took up to 64 KiB through the
/// buffer (callgrind of 512 KiB accumulates at the target: a quarter of
/// its instructions, half the data copied once more). A small packet
/// behind the header still comes with the same read.
const LOOKAHEAD: usize = 4096;
/// With at most this many established packet connections (and no
/// connection in a handshake), `poll` reads them directly instead of
/// asking epoll first, and they are taken out of epoll until the device
/// wants to sleep: one system call less on every arrival, and no epoll
/// callback on the sender's path, which together are most of the latency
/// a progress engine adds over a raw socket.
const DIRECT_POLL_MAX: usize = 4;
/// While reading directly, every this many polls still ask epoll, so the
/// listener (a peer connecting) is served, and read the data lanes that
/// nothing is expected on, so a lost one is noticed.
const EPOLL_EVERY: u32 = 32;
/// Data packets with fewer payload bytes than this keep to the packet
/// connection. On loopback, 128 KiB messages in the `bw` pattern moved
/// half as fast over a lane and 512 KiB ones no faster: a one-way flow
/// gets no acknowledgements riding on packets the other way, and its
/// sender stalls until a TCP loss probe (50-60 probes a run on a lane,
/// 0-3 on the packet connection). 1 MiB ones moved faster.
const LANE_MIN: usize = 1024 * 1024;
/// Packets with at most this many payload bytes are copied behind their
/// header and written with one `send`, which is 3-5% faster for a small
/// message than `writev` of the two parts (measured on loopback).
const COPY_SEND_MAX: usize = 4096;
/// What epoll watches on a connection.
const CONN_INTEREST: Interest = Interest::READABLE.add(Interest::WRITABLE);

/// Settings of the TCP transport.
#[derive(Clone, Debug)]
pub struct TcpConfig {
    /// Largest message sent eagerly, in bytes.
    pub eager_limit: usize,
    /// Data lanes to open to each peer that rendezvous data goes to.
    pub data_lanes: usize,
    /// Address to listen on and publish.
    pub addr: IpAddr,
    /// The congestion control (`TCP_CONGESTION`) set on every connection
    /// whose peer is on a loopback address; `None` keeps the system's.
    /// Linux's default is often `bbr`, which paces segments from a timer:
    /// on loopback, a paced segment and one sent from the process run on
    /// different CPUs, reach the receiver out of order, and are taken for
    /// lost (spurious retransmissions of whole 64 KiB segments, `ss -ti`:
    /// `reord_seen`, `dsack_dups`), halving the bandwidth of one-sided
    /// puts of 64 KiB. Reno sends only from the ACK clock, which keeps
    /// them in order, and there is no congestion on loopback to control.
    /// It is set before a connection exists: on a connecting socket
    /// before it connects, and on the listener when it listens on a
    /// loopback address (the sockets it accepts inherit it), so that
    /// `bbr`'s initialization never turns on the kernel's pacing of the
    /// socket, which a later switch would leave on: segments of a
    /// connection whose round trip estimate grew waited for a timer.
    pub loopback_congestion: Option<String>,
}

impl TcpConfig {
    /// Reads `OXMPI_TCP_EAGER_LIMIT`, `OXMPI_TCP_DATA_LANES` and
    /// `OXMPI_TCP_ADDR`.
    pub fn from_env() -> Result<TcpConfig> {
        let eager_limit = match std::env::var(EAGER_LIMIT_ENV) {
            Ok(v) => v.trim().parse().map_err(|_| {
                Error::new(
                    ErrorClass::Arg,
                    format!("{EAGER_LIMIT_ENV}={v:?} is not a number of bytes"),
                )
            })?,
            Err(_) => 64 * 1024,
        };
        let data_lanes = match std::env::var(DATA_LANES_ENV) {
            Ok(v) => v
                .trim()
                .parse()
                .ok()
                .filter(|&n| n <= MAX_DATA_LANES)
                .ok_or_else(|| {
                    Error::new(
                        ErrorClass::Arg,
                        format!(
                            "{DATA_LANES_ENV}={v:?} is not a number of lanes from 0 to {MAX_DATA_LANES}"
                        ),
                    )
                })?,
            Err(_) => 1,
        };
        let addr = match std::env::var(ADDR_ENV) {
            Ok(v) => v.trim().parse().map_err(|_| {
                Error::new(
                    ErrorClass::Arg,
                    format!("{ADDR_ENV}={v:?} is not an IP address"),
                )
            })?,
            Err(_) => IpAddr::from([127, 0, 0, 1]),
        };
        let loopback_congestion = match std::env::var(LOOPBACK_CONGESTION_ENV) {
            Ok(v) if v.trim() == "system" => None,
            Ok(v) => {
                let name = v.trim();
                let valid = !name.is_empty()
                    && name.len() < CONGESTION_NAME_MAX
                    && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
                if !valid {
                    return Err(Error::new(
                        ErrorClass::Arg,
                        format!(
                            "{LOOPBACK_CONGESTION_ENV}={v:?} is not a congestion control name \
                             (such as reno or bbr, at most {} characters) or `system`",
                            CONGESTION_NAME_MAX - 1
                        ),
                    ));
                }
                Some(name.to_owned())
            }
            Err(_) => Some(LOOPBACK_CONGESTION.to_owned()),
        };
        Ok(TcpConfig {
            eager_limit,
            data_lanes,
            addr,
            loopback_congestion,
        })
    }
}

/// The congestion control that sockets for connections with `ip` take,
/// if any: the configured one where `ip` is a loopback address.
fn congestion_for(ip: IpAddr, config: &TcpConfig) -> Option<&str> {
    config
        .loopback_congestion
        .as_deref()
        .filter(|_| ip.is_loopback())
}

/// Sets the congestion control `name` on `socket`, before its connection
/// exists: a refusal (a name the system does not allow) is only logged,
/// and the connection works with the system's default.
///
/// Before, not after: the system's default is initialized when the
/// connection is established, and `bbr`'s initialization turns on the
/// kernel's internal pacing of the socket, which a later switch leaves on.
/// Reno then paces at twice its window per smoothed round trip time,
/// and on a loopback connection whose round trip estimate grew (an
/// acknowledgement that waited for the next request, a preempted rank:
/// `ss -ti` read 0.6-1.9 ms) each 64 KiB segment waited tens of us for
/// a pacing timer (`tcp_pace_kick`), about 1,000 times in two seconds
/// of 128 KiB gets.
fn set_congestion(socket: &Socket, name: &str, whom: impl std::fmt::Display) {
    if let Err(e) = socket.set_tcp_congestion(name.as_bytes()) {
        vlog!("tcp: congestion control {name} refused for {whom}: {e}");
    }
}

/// Opens the listener on `config`'s address: non-blocking, with the
/// address reusable (as `mio`'s own `bind`), and with the loopback
/// congestion control where the address is a loopback one, so that every
/// connection it accepts has it from the start (an accepted socket
/// inherits its listener's).
fn listen(config: &TcpConfig) -> io::Result<TcpListener> {
    let addr = SocketAddr::new(config.addr, 0);
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_nonblocking(true)?;
    socket.set_reuse_address(true)?;
    if let Some(name) = congestion_for(config.addr, config) {
        set_congestion(&socket, name, format_args!("the listener on {addr}"));
    }
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    Ok(TcpListener::from_std(socket.into()))
}

/// Starts a non-blocking connection to `addr` with `TCP_NODELAY` and, to
/// a loopback address, the configured congestion control, both set
/// before the connection exists ([`set_congestion`]).
fn connect_to(addr: SocketAddr, config: &TcpConfig) -> io::Result<TcpStream> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_nonblocking(true)?;
    socket.set_tcp_nodelay(true)?;
    if let Some(name) = congestion_for(addr.ip(), config) {
        set_congestion(&socket, name, addr);
    }
    match socket.connect(&addr.into()) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
        Err(e) => return Err(e),
    }
    Ok(TcpStream::from_std(socket.into()))
}

/// The congestion control in use on `socket` (`TCP_CONGESTION`).
fn congestion_of(socket: &impl AsFd) -> io::Result<String> {
    let name = SockRef::from(socket).tcp_congestion()?;
    let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    Ok(String::from_utf8_lossy(&name[..end]).into_owned())
}

/// A packet waiting to be written: header, then payload, from `offset`.
struct Outgoing {
    header: [u8; HEADER_LEN],
    payload: Payload,
    /// Bytes of header + payload already written.
    offset: usize,
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

impl Outgoing {
    fn payload(&self) -> &[u8] {
        match &self.payload {
            Payload::Owned(v) => v,
            // SAFETY: `send_zcopy`'s caller keeps the memory valid and
            // unmodified until its completion is reported, which happens
            // only after the last byte was written (or the peer failed and
            // the packet was dropped).
            Payload::Borrowed { ptr, len, .. } => unsafe { std::slice::from_raw_parts(*ptr, *len) },
        }
    }

    fn total(&self) -> usize {
        HEADER_LEN + self.payload().len()
    }

    /// The unwritten parts, for writev.
    fn unwritten(&self) -> [&[u8]; 2] {
        let payload = self.payload();
        if self.offset < HEADER_LEN {
            [&self.header[self.offset..], payload]
        } else {
            [&payload[self.offset - HEADER_LEN..], &[]]
        }
    }
}

/// What one read from a socket brought.
#[derive(Clone, Copy)]
enum Fill {
    /// Nothing was waiting.
    Empty,
    /// Bytes arrived; `drained` when fewer came than there was room for,
    /// so the socket held nothing more at that moment.
    Got { drained: bool },
}

impl Fill {
    /// The outcome of a read of `n` bytes into `room` bytes of space.
    fn after(n: usize, room: usize) -> Fill {
        if n == 0 {
            Fill::Empty
        } else {
            Fill::Got { drained: n < room }
        }
    }
}

/// One read from a non-blocking socket: the bytes read, 0 when none were
/// waiting (never end of stream, which is an error).
fn read_some(stream: &mut TcpStream, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        match stream.read(buf) {
            Ok(0) if !buf.is_empty() => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the peer closed the connection",
                ))
            }
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(0),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}

enum Handshake {
    /// Outbound TCP connect in progress.
    Connecting {
        peer: PeerRank,
        channel: Channel,
        connector: Connector,
        hello: [u8; MESSAGE_LEN],
    },
    AwaitChallenge {
        peer: PeerRank,
        channel: Channel,
        connector: Connector,
    },
    AwaitVerdict {
        peer: PeerRank,
        channel: Channel,
        connector: Connector,
    },
    AwaitHello {
        acceptor: Acceptor,
    },
    AwaitResponse {
        peer: PeerRank,
        channel: Channel,
        acceptor: Acceptor,
    },
}

/// What an established connection carries.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    /// Every packet, both ways: the peer's packet connection.
    Packets,
    /// Our data packets to the peer (a data lane we opened).
    LaneOut,
    /// The peer's data packets to us (a data lane it opened).
    LaneIn,
}

impl Role {
    /// Whether a packet of `kind` may arrive on a connection of this role.
    fn receives(self, kind: Kind) -> bool {
        match self {
            Role::Packets => true,
            Role::LaneIn => kind == Kind::Data,
            Role::LaneOut => false,
        }
    }
}

enum State {
    Handshake(Handshake),
    Established { peer: PeerRank, role: Role },
}

/// What a handshake step leaves in a connection's state for the moment it
/// takes the old state out; it always puts the next one in.
const UNSET: State = State::Established {
    peer: usize::MAX,
    role: Role::Packets,
};

/// What the reader of an established connection is in the middle of.
#[derive(Clone, Copy)]
enum ReadState {
    Header,
    Payload {
        slot: Option<PayloadSlot>,
        /// Payload bytes still to come.
        remaining: u64,
        /// Bytes already placed in the slot's buffer.
        placed: usize,
    },
}

struct Conn {
    stream: TcpStream,
    state: State,
    read: ReadState,
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    /// Handshake bytes not yet written.
    hs_out: Vec<u8>,
    /// Whether the socket is registered with epoll.
    watched: bool,
    /// The last packet read with a payload of at least [`READ_BUFFER`]
    /// bytes was followed only by short ones that came alone: the next
    /// header is read with at most [`LOOKAHEAD`] bytes.
    after_large: bool,
}

/// A data lane this rank opened to a peer.
struct Lane {
    conn: usize,
    /// The handshake is done: data packets may be queued on it.
    open: bool,
    /// Data packets waiting to be written on it.
    queue: VecDeque<Outgoing>,
}

/// What the transport keeps for one peer.
#[derive(Default)]
struct Peer {
    /// Its card.
    addr: Option<SocketAddr>,
    /// The established packet connection.
    packets: Option<usize>,
    /// This rank's attempt at a packet connection, while one is pending.
    connecting: Option<usize>,
    /// Packets for the packet connection, waiting to be written (or for
    /// the connection to be established).
    queue: VecDeque<Outgoing>,
    /// The data lanes this rank opened to the peer (in a handshake or
    /// open); empty until the first data packet, and for good once they
    /// were asked for (`lanes_asked`) and all failed.
    lanes: Vec<Lane>,
    lanes_asked: bool,
    /// The data lanes the peer opened to this rank.
    lanes_in: Vec<usize>,
    /// CTS packets sent to the peer whose data has not begun to arrive:
    /// while there are any, `lanes_in` are read on every poll.
    data_expected: u32,
    /// The lane the next data packet tries first, so that equally loaded
    /// lanes take turns.
    next_lane: usize,
    /// Why the peer is lost, once it is.
    failed: Option<Error>,
}

/// Unwritten bytes in a queue.
fn backlog(queue: &VecDeque<Outgoing>) -> usize {
    queue.iter().map(|p| p.total() - p.offset).sum()
}

/// The queue of packets waiting to be written on connection `index`, if
/// it is established and writes any.
fn queue_of<'a>(
    conns: &[Option<Conn>],
    peers: &'a mut [Peer],
    index: usize,
) -> Option<&'a mut VecDeque<Outgoing>> {
    let State::Established { peer, role } = conns.get(index)?.as_ref()?.state else {
        return None;
    };
    let peer = &mut peers[peer];
    match role {
        Role::Packets => Some(&mut peer.queue),
        Role::LaneOut => peer
            .lanes
            .iter_mut()
            .find(|lane| lane.conn == index)
            .map(|lane| &mut lane.queue),
        Role::LaneIn => None,
    }
}

/// Writes as much of `queue` as `conn`'s socket takes; the tokens of the
/// zero-copy packets written to the end go to `completed`.
fn flush_queue(
    conn: &mut Conn,
    queue: &mut VecDeque<Outgoing>,
    completed: &mut Vec<u64>,
) -> io::Result<()> {
    while !queue.is_empty() {
        let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(16);
        for packet in queue.iter().take(8) {
            for part in packet.unwritten() {
                if !part.is_empty() {
                    slices.push(IoSlice::new(part));
                }
            }
        }
        let written = match conn.stream.write_vectored(&slices) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    "socket accepted no bytes",
                ))
            }
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        drop(slices);
        let mut left = written;
        while left > 0 {
            let Some(packet) = queue.front_mut() else {
                break;
            };
            let rest = packet.total() - packet.offset;
            if left >= rest {
                left -= rest;
                if let Some(Outgoing {
                    payload: Payload::Borrowed { token, .. },
                    ..
                }) = queue.pop_front()
                {
                    completed.push(token);
                }
            } else {
                packet.offset += left;
                left = 0;
            }
        }
    }
    Ok(())
}

/// The TCP transport of one rank.
pub struct TcpTransport {
    job: JobInfo,
    config: TcpConfig,
    poll: Poll,
    events: Events,
    listener: TcpListener,
    card: String,
    conns: Vec<Option<Conn>>,
    peers: Vec<Peer>,
    /// Zero-copy sends finished inside `send_zcopy`, reported next poll.
    completed: Vec<u64>,
    /// Peers that failed outside `poll`, reported next poll.
    failures: Vec<(PeerRank, Error)>,
    /// Established connections (by index); rebuilt when
    /// `connections_changed`.
    direct: Vec<usize>,
    /// Whether `poll` reads the `direct` connections itself, with epoll
    /// watching only the listener: few are established, none handshaking.
    direct_mode: bool,
    /// Whether `arm_wakeup` put the direct connections back under epoll
    /// for a sleep (until `disarm_wakeup`).
    armed: bool,
    /// A connection opened, closed or finished its handshake since
    /// `direct` and `direct_mode` were computed.
    connections_changed: bool,
    /// Whether this transport has no connection at all, only its
    /// listener: epoll is then asked every [`EPOLL_EVERY`] polls only, so
    /// that a rank whose peers all use another transport does not pay a
    /// system call on every poll (a connecting peer waits a few polls).
    listening_only: bool,
    /// Polls since epoll was last asked.
    polls_since_epoll: u32,
    /// Tokens epoll reported ready (kept to avoid an allocation per poll).
    ready: Vec<usize>,
    /// Where a small packet is put together before its one `send` (kept,
    /// so that no send allocates or clears a buffer).
    packet: Vec<u8>,
    /// Between `begin_batch` and `end_batch`: packets of at most the
    /// eager limit stay queued, to leave together at the batch's end.
    batching: bool,
    /// The peers with packets held back in this batch.
    held: Vec<PeerRank>,
}

// SAFETY: the raw pointers in queued zero-copy packets refer to memory the
// ADI keeps valid until their completion; the transport is used by one
// thread at a time (through `&mut`).
unsafe impl Send for TcpTransport {}

fn lost(peer: PeerRank, what: impl std::fmt::Display) -> Error {
    Error::new(
        ErrorClass::ProcFailed,
        format!("connection to rank {peer} lost: {what}"),
    )
}

/// The error `peer` fails with when the sink refused one of its headers:
/// the sink's own when it is already `ProcFailed` (the ADI's are), else
/// its message under that class, since every later send to the peer
/// returns this error and [`Transport::send`] promises `ProcFailed`.
fn broke_protocol(peer: PeerRank, refusal: Error) -> Error {
    if refusal.class() == ErrorClass::ProcFailed {
        return refusal;
    }
    Error::new(
        ErrorClass::ProcFailed,
        format!("rank {peer} broke the protocol: {}", refusal.message()),
    )
}

impl TcpTransport {
    /// Opens the listener for `job` on the configured address.
    pub fn new(job: &JobInfo, config: TcpConfig) -> Result<TcpTransport> {
        let poll = Poll::new().map_err(|e| Error::os("creating the TCP poller", e))?;
        let mut listener =
            listen(&config).map_err(|e| Error::os(format!("listening on {}", config.addr), e))?;
        let local = listener
            .local_addr()
            .map_err(|e| Error::os("reading the listener's address", e))?;
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)
            .map_err(|e| Error::os("registering the listener", e))?;
        Ok(TcpTransport {
            job: job.clone(),
            config,
            poll,
            events: Events::with_capacity(256),
            listener,
            card: local.to_string(),
            conns: Vec::new(),
            peers: (0..job.size).map(|_| Peer::default()).collect(),
            completed: Vec::new(),
            failures: Vec::new(),
            direct: Vec::new(),
            direct_mode: false,
            armed: false,
            connections_changed: false,
            listening_only: true,
            polls_since_epoll: 0,
            ready: Vec::new(),
            packet: Vec::with_capacity(HEADER_LEN + COPY_SEND_MAX),
            batching: false,
            held: Vec::new(),
        })
    }

    /// The congestion control of the packet connection to `peer`, once
    /// it is established (for diagnostics and tests).
    pub fn packet_congestion(&self, peer: PeerRank) -> Option<String> {
        let index = self.peers.get(peer)?.packets?;
        let conn = self.conns.get(index)?.as_ref()?;
        congestion_of(&conn.stream).ok()
    }

    /// How many of this rank's data lanes to `peer` are open (for
    /// diagnostics and tests).
    pub fn open_data_lanes(&self, peer: PeerRank) -> usize {
        self.peers
            .get(peer)
            .map_or(0, |p| p.lanes.iter().filter(|lane| lane.open).count())
    }

    fn insert(&mut self, mut stream: TcpStream, state: State) -> io::Result<usize> {
        let index = self
            .conns
            .iter()
            .position(Option::is_none)
            .unwrap_or(self.conns.len());
        self.poll
            .registry()
            .register(&mut stream, Token(index), CONN_INTEREST)?;
        let conn = Conn {
            stream,
            state,
            read: ReadState::Header,
            buf: vec![0u8; READ_BUFFER].into_boxed_slice(),
            start: 0,
            end: 0,
            hs_out: Vec::new(),
            watched: true,
            after_large: false,
        };
        if index == self.conns.len() {
            self.conns.push(Some(conn));
        } else {
            self.conns[index] = Some(conn);
        }
        self.connections_changed = true;
        Ok(index)
    }

    /// Closes connection `index` and forgets it. A data lane of ours is
    /// closed with packets queued on it only when its peer fails, which
    /// drops them anyway.
    fn close(&mut self, index: usize) {
        if let Some(mut conn) = self.conns.get_mut(index).and_then(Option::take) {
            if conn.watched {
                let _ = self.poll.registry().deregister(&mut conn.stream);
            }
        }
        for peer in &mut self.peers {
            if peer.packets == Some(index) {
                peer.packets = None;
            }
            if peer.connecting == Some(index) {
                peer.connecting = None;
            }
            peer.lanes.retain(|lane| lane.conn != index);
            peer.lanes_in.retain(|&conn| conn != index);
        }
        self.connections_changed = true;
    }

    /// Whether packets wait to be written on connection `index`.
    fn has_queued(&mut self, index: usize) -> bool {
        queue_of(&self.conns, &mut self.peers, index).is_some_and(|queue| !queue.is_empty())
    }

    /// Writes as much of connection `index`'s queue as its socket takes.
    fn flush_conn(&mut self, index: usize) -> io::Result<()> {
        let Some(queue) = queue_of(&self.conns, &mut self.peers, index) else {
            return Ok(());
        };
        let Some(conn) = self.conns[index].as_mut() else {
            return Ok(());
        };
        flush_queue(conn, queue, &mut self.completed)
    }

    /// Puts the established connections under epoll (`on`) or takes them
    /// out.
    fn watch_established(&mut self, on: bool) -> Result<()> {
        for k in 0..self.direct.len() {
            let index = self.direct[k];
            // Armed for a sleep, a connection with nothing to write is
            // watched for reading only: registering a writable socket for
            // writability would wake the sleep at once, every time.
            let idle = !self.has_queued(index);
            let Some(conn) = self.conns[index].as_mut() else {
                continue;
            };
            if conn.watched == on {
                continue;
            }
            let registry = self.poll.registry();
            if on {
                let interest = if self.direct_mode && idle {
                    Interest::READABLE
                } else {
                    CONN_INTEREST
                };
                registry.register(&mut conn.stream, Token(index), interest)
            } else {
                registry.deregister(&mut conn.stream)
            }
            .map_err(|e| Error::os("changing what epoll watches", e))?;
            conn.watched = on;
        }
        Ok(())
    }

    fn fail_peer(&mut self, peer: PeerRank, error: Error) {
        let p = &mut self.peers[peer];
        if p.failed.is_some() {
            return;
        }
        p.queue.clear();
        let doomed: Vec<usize> = p
            .packets
            .into_iter()
            .chain(p.connecting)
            .chain(p.lanes.drain(..).map(|lane| lane.conn))
            .chain(p.lanes_in.drain(..))
            .collect();
        p.data_expected = 0;
        p.failed = Some(error.clone());
        for index in doomed {
            self.close(index);
        }
        self.failures.push((peer, error));
    }

    /// Starts a connection of `channel` to `peer`. A packet connection is
    /// not started while one exists or is coming.
    fn connect(&mut self, peer: PeerRank, channel: Channel) -> Result<()> {
        let p = &self.peers[peer];
        if channel == Channel::Packets && (p.packets.is_some() || p.connecting.is_some()) {
            return Ok(());
        }
        let addr = p.addr.ok_or_else(|| {
            Error::new(
                ErrorClass::Intern,
                format!("TCP has no card for rank {peer}"),
            )
        })?;
        let stream = connect_to(addr, &self.config)
            .map_err(|e| lost(peer, format!("connecting to {addr}: {e}")))?;
        let (connector, hello) = Connector::new(&self.job, peer, channel)
            .map_err(|e| Error::new(ErrorClass::Other, e.to_string()))?;
        let index = self
            .insert(
                stream,
                State::Handshake(Handshake::Connecting {
                    peer,
                    channel,
                    connector,
                    hello,
                }),
            )
            .map_err(|e| Error::os("registering a connection", e))?;
        let p = &mut self.peers[peer];
        match channel {
            Channel::Packets => p.connecting = Some(index),
            Channel::Data => p.lanes.push(Lane {
                conn: index,
                open: false,
                queue: VecDeque::new(),
            }),
        }
        Ok(())
    }

    /// Opens this rank's data lanes to `peer`, the first time it sends the
    /// peer data; a lane that cannot be started is only logged (the data
    /// takes the packet connection).
    fn open_lanes(&mut self, peer: PeerRank) {
        let p = &mut self.peers[peer];
        if p.lanes_asked || p.packets.is_none() {
            return;
        }
        p.lanes_asked = true;
        for _ in 0..self.config.data_lanes {
            if let Err(e) = self.connect(peer, Channel::Data) {
                vlog!(
                    "tcp: rank {}: no data lane to rank {peer}: {e}",
                    self.job.rank
                );
            }
        }
    }

    /// The open data lane to `peer` that its next data packet goes to
    /// (an index in its `lanes`): the one with the least unwritten bytes,
    /// equally loaded lanes taking turns; `None` while no lane is open.
    fn data_lane(&mut self, peer: PeerRank) -> Option<usize> {
        let p = &mut self.peers[peer];
        let lanes = p.lanes.len();
        let mut best: Option<(usize, usize)> = None;
        for k in 0..lanes {
            let lane = (p.next_lane + k) % lanes;
            if !p.lanes[lane].open {
                continue;
            }
            let load = backlog(&p.lanes[lane].queue);
            if best.is_none_or(|(least, _)| load < least) {
                best = Some((load, lane));
            }
        }
        let (_, lane) = best?;
        p.next_lane = (lane + 1) % lanes;
        Some(lane)
    }

    /// Whether a packet of `len` payload bytes is held back for the end
    /// of the batch under way, if any ([`Transport::begin_batch`]).
    fn holds(&self, len: usize) -> bool {
        self.batching && len <= self.config.eager_limit
    }

    /// Queues a packet for `peer`'s packet connection (connecting first if
    /// there is none) and writes what the socket takes; in a batch, a
    /// packet of at most the eager limit is held back for its end.
    fn enqueue(&mut self, peer: PeerRank, packet: Outgoing) -> Result<()> {
        if let Some(e) = &self.peers[peer].failed {
            return Err(e.clone());
        }
        if self.peers[peer].packets.is_none() {
            // Before queueing: a packet whose send fails must not stay
            // behind (a zero-copy one would point at memory the caller
            // takes back).
            self.connect(peer, Channel::Packets)?;
        }
        let hold = self.holds(packet.payload().len());
        self.peers[peer].queue.push_back(packet);
        if hold {
            if !self.held.contains(&peer) {
                self.held.push(peer);
            }
            return Ok(());
        }
        if let Some(index) = self.peers[peer].packets {
            if let Err(e) = self.flush_conn(index) {
                self.fail_peer(peer, lost(peer, e));
            }
        }
        Ok(())
    }

    fn accept_all(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((stream, from)) => {
                    // The congestion control came from the listener
                    // (`listen`).
                    let _ = stream.set_nodelay(true);
                    match Acceptor::new(&self.job) {
                        Ok(acceptor) => {
                            if let Err(e) = self.insert(
                                stream,
                                State::Handshake(Handshake::AwaitHello { acceptor }),
                            ) {
                                vlog!("tcp: cannot register the connection from {from}: {e}");
                            }
                        }
                        Err(e) => vlog!("tcp: refusing {from}: {e}"),
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    vlog!("tcp: accept failed: {e}");
                    return;
                }
            }
        }
    }

    /// Reads into the connection's buffer, at most `limit` bytes.
    fn fill(conn: &mut Conn, limit: usize) -> io::Result<Fill> {
        if conn.start > 0 {
            conn.buf.copy_within(conn.start..conn.end, 0);
            conn.end -= conn.start;
            conn.start = 0;
        }
        let room = (conn.buf.len() - conn.end).min(limit);
        let n = read_some(&mut conn.stream, &mut conn.buf[conn.end..conn.end + room])?;
        conn.end += n;
        Ok(Fill::after(n, room))
    }

    /// Drives the handshake of connection `index`.
    fn handshake(&mut self, index: usize) -> std::result::Result<(), String> {
        loop {
            let conn = self.conns[index].as_mut().ok_or("gone")?;
            // Pending handshake output first.
            while !conn.hs_out.is_empty() {
                match conn.stream.write(&conn.hs_out) {
                    Ok(n) => {
                        conn.hs_out.drain(..n);
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                    Err(e) => return Err(e.to_string()),
                }
            }
            let State::Handshake(hs) = &mut conn.state else {
                return Ok(());
            };
            if let Handshake::Connecting { hello, .. } = hs {
                // Connected once it has a peer address; its options were
                // set before it connected (`connect_to`).
                match conn.stream.peer_addr() {
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotConnected => {
                        if let Ok(Some(e)) | Err(e) = conn.stream.take_error() {
                            return Err(format!("connect failed: {e}"));
                        }
                        return Ok(());
                    }
                    Err(e) => return Err(format!("connect failed: {e}")),
                }
                conn.hs_out.extend_from_slice(hello);
                let State::Handshake(Handshake::Connecting {
                    peer,
                    channel,
                    connector,
                    ..
                }) = std::mem::replace(&mut conn.state, UNSET)
                else {
                    unreachable!()
                };
                conn.state = State::Handshake(Handshake::AwaitChallenge {
                    peer,
                    channel,
                    connector,
                });
                continue;
            }
            if conn.end - conn.start < MESSAGE_LEN {
                match Self::fill(conn, usize::MAX) {
                    Ok(Fill::Got { .. }) => continue,
                    Ok(Fill::Empty) => return Ok(()),
                    Err(e) => return Err(e.to_string()),
                }
            }
            let mut msg = [0u8; MESSAGE_LEN];
            msg.copy_from_slice(&conn.buf[conn.start..conn.start + MESSAGE_LEN]);
            conn.start += MESSAGE_LEN;
            let State::Handshake(hs) = std::mem::replace(&mut conn.state, UNSET) else {
                unreachable!()
            };
            match hs {
                Handshake::Connecting { .. } => unreachable!(),
                Handshake::AwaitChallenge {
                    peer,
                    channel,
                    connector,
                } => {
                    let response = connector
                        .on_challenge(&msg)
                        .map_err(|e| format!("rank {peer}: {e}"))?;
                    conn.hs_out.extend_from_slice(&response);
                    conn.state = State::Handshake(Handshake::AwaitVerdict {
                        peer,
                        channel,
                        connector,
                    });
                }
                Handshake::AwaitVerdict {
                    peer,
                    channel,
                    connector,
                } => {
                    match connector.on_verdict(&msg).map_err(|e| e.to_string())? {
                        Verdict::Accept => {
                            let p = &mut self.peers[peer];
                            let role = match channel {
                                Channel::Packets => {
                                    p.connecting = None;
                                    p.packets = Some(index);
                                    Role::Packets
                                }
                                Channel::Data => {
                                    if let Some(lane) =
                                        p.lanes.iter_mut().find(|lane| lane.conn == index)
                                    {
                                        lane.open = true;
                                    }
                                    Role::LaneOut
                                }
                            };
                            conn.state = State::Established { peer, role };
                            self.connections_changed = true;
                            vlog!(
                                "tcp: rank {}: connected to rank {peer} ({channel:?})",
                                self.job.rank
                            );
                            return Ok(());
                        }
                        Verdict::Duplicate => {
                            // A packet connection: the peer keeps the one it
                            // opened to us. A data lane: the peer takes no
                            // more from us, and the data keeps to the other
                            // paths.
                            self.close(index);
                            return Ok(());
                        }
                    }
                }
                Handshake::AwaitHello { mut acceptor } => {
                    let (peer, channel, challenge) = acceptor
                        .on_hello(&self.job, &msg)
                        .map_err(|e| e.to_string())?;
                    conn.hs_out.extend_from_slice(&challenge);
                    conn.state = State::Handshake(Handshake::AwaitResponse {
                        peer,
                        channel,
                        acceptor,
                    });
                }
                Handshake::AwaitResponse {
                    peer,
                    channel,
                    acceptor,
                } => {
                    acceptor
                        .on_response(&msg)
                        .map_err(|e| format!("claimed rank {peer}: {e}"))?;
                    let p = &self.peers[peer];
                    let refuse = p.failed.is_some()
                        || match channel {
                            Channel::Packets => {
                                let mine_wins = p.connecting.is_some() && self.job.rank < peer;
                                p.packets.is_some() || mine_wins
                            }
                            Channel::Data => p.lanes_in.len() >= MAX_DATA_LANES,
                        };
                    if refuse {
                        conn.hs_out
                            .extend_from_slice(&acceptor.verdict(Verdict::Duplicate));
                        let _ = conn.stream.write(&conn.hs_out);
                        self.close(index);
                        return Ok(());
                    }
                    conn.hs_out
                        .extend_from_slice(&acceptor.verdict(Verdict::Accept));
                    let role = match channel {
                        Channel::Packets => Role::Packets,
                        Channel::Data => Role::LaneIn,
                    };
                    conn.state = State::Established { peer, role };
                    match channel {
                        Channel::Packets => {
                            if let Some(mine) = self.peers[peer].connecting.take() {
                                self.close(mine);
                            }
                            self.peers[peer].packets = Some(index);
                        }
                        Channel::Data => self.peers[peer].lanes_in.push(index),
                    }
                    self.connections_changed = true;
                    vlog!(
                        "tcp: rank {}: accepted rank {peer} ({channel:?})",
                        self.job.rank
                    );
                    // Flush the verdict before any packet; if it does not
                    // fit a fresh socket at once, something is wrong, and
                    // the caller closes the connection.
                    let conn = self.conns[index].as_mut().ok_or("gone")?;
                    while !conn.hs_out.is_empty() {
                        match conn.stream.write(&conn.hs_out) {
                            Ok(n) => {
                                conn.hs_out.drain(..n);
                            }
                            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                                return Err("verdict could not be written".into());
                            }
                            Err(e) => return Err(e.to_string()),
                        }
                    }
                    return Ok(());
                }
            }
        }
    }

    /// Reads and delivers packets from the established connection `index`
    /// to `peer`, which carries what `role` says.
    fn receive(
        &mut self,
        index: usize,
        peer: PeerRank,
        role: Role,
        sink: &mut dyn PacketSink,
    ) -> std::result::Result<bool, Error> {
        // Every byte read is progress, not only a whole packet: a wait
        // that counted packets alone would take the middle of a long
        // payload for idleness and go to sleep in it, and then every few
        // polls until the payload is in.
        let mut progressed = false;
        // Set once a read came back short: the socket was empty then, and
        // anything arriving later raises a new readiness event (epoll's
        // edge triggering on Linux fires on every arrival) or is read by
        // the next direct poll. So the read that would only say EAGAIN is
        // skipped.
        let mut drained = false;
        let Some(conn) = self.conns[index].as_mut() else {
            return Ok(false);
        };
        loop {
            match conn.read {
                ReadState::Header => {
                    let buffered = conn.end - conn.start;
                    if buffered < HEADER_LEN {
                        if drained {
                            return Ok(progressed);
                        }
                        // A data lane carries only data packets, whose
                        // payload is read straight into its destination:
                        // read no further than the header, or up to 64
                        // KiB of payload would take the detour through
                        // the buffer. Elsewhere small packets are common,
                        // and one read takes several, unless the last
                        // packet was large ([`LOOKAHEAD`]).
                        let limit = match role {
                            Role::LaneIn => HEADER_LEN - buffered,
                            Role::Packets | Role::LaneOut if conn.after_large => {
                                LOOKAHEAD - buffered
                            }
                            Role::Packets | Role::LaneOut => usize::MAX,
                        };
                        match Self::fill(conn, limit) {
                            Ok(Fill::Got { drained: d }) => {
                                drained = d;
                                progressed = true;
                                continue;
                            }
                            Ok(Fill::Empty) => return Ok(progressed),
                            Err(e) => return Err(lost(peer, e)),
                        }
                    }
                    let header = Header::decode(&conn.buf[conn.start..conn.start + HEADER_LEN])?;
                    conn.start += HEADER_LEN;
                    progressed = true;
                    // Large packets come in runs, and a short one amid
                    // them (a flush's, between the pieces of one
                    // accumulate and the next) does not end the run
                    // unless more was waiting behind it: then short
                    // packets are streaming, and one read takes several.
                    conn.after_large =
                        header.payload_len() >= READ_BUFFER as u64 || (conn.after_large && drained);
                    if !role.receives(header.kind) {
                        return Err(Error::new(
                            ErrorClass::ProcFailed,
                            format!(
                                "rank {peer} broke the protocol: a {:?} packet on a data lane",
                                header.kind
                            ),
                        ));
                    }
                    if header.kind == Kind::Data {
                        let p = &mut self.peers[peer];
                        p.data_expected = p.data_expected.saturating_sub(1);
                    }
                    let slot = sink
                        .on_header(peer, &header)
                        .map_err(|e| broke_protocol(peer, e))?;
                    if header.payload_len() == 0 {
                        if let Some(slot) = slot {
                            sink.on_payload(peer, slot);
                        }
                        continue;
                    }
                    conn.read = ReadState::Payload {
                        slot,
                        remaining: header.payload_len(),
                        placed: 0,
                    };
                }
                ReadState::Payload {
                    slot,
                    mut remaining,
                    mut placed,
                } => {
                    let dest: &mut [u8] = match slot {
                        Some(s) => sink.payload_buffer(s),
                        None => &mut [],
                    };
                    let wanted = dest.len().saturating_sub(placed);
                    let direct = (wanted as u64).min(remaining) as usize;
                    let buffered = conn.end - conn.start;
                    let mut stalled = false;
                    if buffered > 0 {
                        let n = (buffered as u64).min(remaining) as usize;
                        let keep = n.min(wanted);
                        dest[placed..placed + keep]
                            .copy_from_slice(&conn.buf[conn.start..conn.start + keep]);
                        placed += keep;
                        conn.start += n;
                        remaining -= n as u64;
                    } else if drained {
                        stalled = true;
                    } else if direct >= DIRECT_READ_MIN {
                        match read_some(&mut conn.stream, &mut dest[placed..placed + direct]) {
                            Ok(n) => {
                                drained = n > 0 && n < direct;
                                stalled = n == 0;
                                progressed |= n > 0;
                                placed += n;
                                remaining -= n as u64;
                            }
                            Err(e) => return Err(lost(peer, e)),
                        }
                    } else {
                        match Self::fill(conn, usize::MAX) {
                            Ok(Fill::Got { drained: d }) => {
                                drained = d;
                                progressed = true;
                            }
                            Ok(Fill::Empty) => stalled = true,
                            Err(e) => return Err(lost(peer, e)),
                        }
                    }
                    if remaining == 0 {
                        progressed = true;
                        conn.read = ReadState::Header;
                        if let Some(s) = slot {
                            sink.on_payload(peer, s);
                        }
                    } else {
                        conn.read = ReadState::Payload {
                            slot,
                            remaining,
                            placed,
                        };
                    }
                    if stalled {
                        return Ok(progressed);
                    }
                }
            }
        }
    }

    fn service(&mut self, index: usize, sink: &mut dyn PacketSink) -> bool {
        let Some(conn) = self.conns[index].as_ref() else {
            return false;
        };
        // A handshake step is progress: it may have made the connection
        // usable and let queued packets leave.
        let handshaking = matches!(conn.state, State::Handshake(_));
        if let State::Handshake(hs) = &conn.state {
            let ours = match hs {
                Handshake::Connecting { peer, channel, .. }
                | Handshake::AwaitChallenge { peer, channel, .. }
                | Handshake::AwaitVerdict { peer, channel, .. } => Some((*peer, *channel)),
                _ => None,
            };
            if let Err(why) = self.handshake(index) {
                self.close(index);
                match ours {
                    // Our own attempt to a job member failed: that peer is
                    // unreachable (unless another connection takes over).
                    Some((peer, Channel::Packets)) if self.peers[peer].packets.is_none() => {
                        self.fail_peer(peer, lost(peer, format!("handshake failed: {why}")));
                    }
                    Some((peer, Channel::Data)) => vlog!(
                        "tcp: rank {}: data lane to rank {peer} not opened: {why}",
                        self.job.rank
                    ),
                    _ => vlog!("tcp: rank {}: refused a connection: {why}", self.job.rank),
                }
                return true;
            }
        }
        let Some(&State::Established { peer, role }) = self.conns[index].as_ref().map(|c| &c.state)
        else {
            return handshaking;
        };
        let mut progressed = handshaking;
        if self.has_queued(index) {
            if let Err(e) = self.flush_conn(index) {
                self.fail_peer(peer, lost(peer, e));
                return true;
            }
            progressed = true;
        }
        match self.receive(index, peer, role, sink) {
            Ok(p) => progressed | p,
            Err(e) => {
                self.fail_peer(peer, e);
                true
            }
        }
    }

    /// Whether a direct poll reads and writes connection `index` this time:
    /// a packet connection always; a data lane when something is due on it
    /// (data expected or half read, packets to write), or on a `sweep`.
    fn due(&self, index: usize, sweep: bool) -> bool {
        let Some(conn) = self.conns[index].as_ref() else {
            return false;
        };
        match conn.state {
            State::Established {
                role: Role::Packets,
                ..
            }
            | State::Handshake(_) => true,
            State::Established {
                peer,
                role: Role::LaneIn,
            } => {
                sweep
                    || self.peers[peer].data_expected > 0
                    || matches!(conn.read, ReadState::Payload { .. })
            }
            State::Established {
                peer,
                role: Role::LaneOut,
            } => {
                sweep
                    || self.peers[peer]
                        .lanes
                        .iter()
                        .any(|lane| lane.conn == index && !lane.queue.is_empty())
            }
        }
    }
}

impl Transport for TcpTransport {
    fn name(&self) -> &'static str {
        "tcp"
    }

    fn card(&self) -> &str {
        &self.card
    }

    fn reachable(&self, card: &str) -> bool {
        card.parse::<SocketAddr>().is_ok()
    }

    fn add_peer(&mut self, peer: PeerRank, card: &str) -> Result<()> {
        let addr = card.parse::<SocketAddr>().map_err(|_| {
            Error::new(
                ErrorClass::Other,
                format!("rank {peer} published a bad TCP card {card:?}"),
            )
        })?;
        let p = self.peers.get_mut(peer).ok_or_else(|| {
            Error::new(ErrorClass::Rank, format!("rank {peer} is not in the job"))
        })?;
        p.addr = Some(addr);
        Ok(())
    }

    fn eager_limit(&self) -> usize {
        self.config.eager_limit
    }

    fn send(&mut self, peer: PeerRank, header: &Header, payload: &[u8]) -> Result<()> {
        self.send_parts(peer, header, &[payload])
    }

    fn send_parts(&mut self, peer: PeerRank, header: &Header, parts: &[&[u8]]) -> Result<()> {
        if header.kind == Kind::Cts {
            // The peer answers a CTS with data, perhaps on a lane.
            let p = &mut self.peers[peer];
            p.data_expected = p.data_expected.saturating_add(1);
        }
        let header = header.encode();
        let len: usize = parts.iter().map(|part| part.len()).sum();
        // Fast path: nothing queued and connected, write at once; but a
        // batch holds back a packet up to the eager limit (`enqueue`),
        // even the first: the RTSs of a window of large gets (one per
        // get) leave together, not a `send` each.
        let p = &self.peers[peer];
        let hold = self.holds(len);
        if let (true, false, Some(index)) = (p.queue.is_empty(), hold, p.packets) {
            if let Some(conn) = self.conns[index].as_mut() {
                let total = HEADER_LEN + len;
                let attempt = if len <= COPY_SEND_MAX {
                    // One contiguous `send` rather than a `writev`: the
                    // copy costs less than writev's trip through the VFS.
                    let packet = &mut self.packet;
                    packet.clear();
                    packet.extend_from_slice(&header);
                    for part in parts {
                        packet.extend_from_slice(part);
                    }
                    conn.stream.write(packet)
                } else {
                    let slices: Vec<IoSlice<'_>> = std::iter::once(&header[..])
                        .chain(parts.iter().copied())
                        .map(IoSlice::new)
                        .collect();
                    conn.stream.write_vectored(&slices)
                };
                let written = match attempt {
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
                    Err(e) => {
                        let error = lost(peer, e);
                        self.fail_peer(peer, error.clone());
                        return Err(error);
                    }
                };
                if written == total {
                    return Ok(());
                }
                return self.enqueue(
                    peer,
                    Outgoing {
                        header,
                        payload: Payload::Owned(parts.concat()),
                        offset: written,
                    },
                );
            }
        }
        self.enqueue(
            peer,
            Outgoing {
                header,
                payload: Payload::Owned(parts.concat()),
                offset: 0,
            },
        )
    }

    unsafe fn send_zcopy(
        &mut self,
        peer: PeerRank,
        header: &Header,
        payload: *const u8,
        len: usize,
        token: u64,
    ) -> Result<()> {
        let packet = Outgoing {
            header: header.encode(),
            payload: Payload::Borrowed {
                ptr: payload,
                len,
                token,
            },
            offset: 0,
        };
        // The pieces of a streamed message must arrive in order: they keep
        // to the packet connection (they are below `LANE_MIN` anyway).
        let piece = header.flags & FLAG_PIECE != 0;
        if header.kind == Kind::Data
            && !piece
            && len >= LANE_MIN
            && self.peers[peer].failed.is_none()
        {
            self.open_lanes(peer);
            if let Some(lane) = self.data_lane(peer) {
                let lane = &mut self.peers[peer].lanes[lane];
                lane.queue.push_back(packet);
                let index = lane.conn;
                if let Err(e) = self.flush_conn(index) {
                    self.fail_peer(peer, lost(peer, e));
                }
                return Ok(());
            }
        }
        self.enqueue(peer, packet)
    }

    fn poll(&mut self, sink: &mut dyn PacketSink) -> Result<bool> {
        let mut progressed = false;
        for token in self.completed.drain(..) {
            sink.on_send_complete(token);
            progressed = true;
        }
        for (peer, error) in self.failures.drain(..) {
            sink.on_peer_failed(peer, error);
            progressed = true;
        }
        if self.connections_changed {
            self.connections_changed = false;
            self.direct.clear();
            let mut handshaking = false;
            for (index, conn) in self.conns.iter().enumerate() {
                match conn.as_ref().map(|c| &c.state) {
                    Some(State::Established { .. }) => self.direct.push(index),
                    Some(State::Handshake(_)) => handshaking = true,
                    None => {}
                }
            }
            self.listening_only = self.conns.iter().all(Option::is_none);
            let packet_conns = self.peers.iter().filter(|p| p.packets.is_some()).count();
            self.direct_mode = packet_conns > 0 && packet_conns <= DIRECT_POLL_MAX && !handshaking;
            self.watch_established(!self.direct_mode || self.armed)?;
        }
        if self.direct_mode {
            let sweep = self.polls_since_epoll + 1 >= EPOLL_EVERY;
            // By position: servicing may close a connection and change the
            // list (the next poll rebuilds it).
            let mut k = 0;
            while let Some(&index) = self.direct.get(k) {
                if self.due(index, sweep) {
                    progressed |= self.service(index, sink);
                }
                k += 1;
            }
            self.polls_since_epoll += 1;
        }
        if self.listening_only {
            self.polls_since_epoll += 1;
        }
        let epoll_due = self.polls_since_epoll >= EPOLL_EVERY;
        if (!self.direct_mode && !self.listening_only) || epoll_due {
            self.polls_since_epoll = 0;
            match self.poll.poll(&mut self.events, Some(Duration::ZERO)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(progressed),
                Err(e) => return Err(Error::os("polling TCP sockets", e)),
            }
            let mut ready = std::mem::take(&mut self.ready);
            ready.clear();
            ready.extend(self.events.iter().map(|e| e.token().0));
            for &token in &ready {
                if token == LISTENER.0 {
                    self.accept_all();
                    progressed = true;
                } else {
                    progressed |= self.service(token, sink);
                }
            }
            self.ready = ready;
        }
        for token in self.completed.drain(..) {
            sink.on_send_complete(token);
            progressed = true;
        }
        for (peer, error) in self.failures.drain(..) {
            sink.on_peer_failed(peer, error);
            progressed = true;
        }
        Ok(progressed)
    }

    fn arm_wakeup(&mut self) -> Result<Option<RawFd>> {
        if !self.armed {
            // Registering a socket that already holds data makes the epoll
            // descriptor readable at once: nothing that came before the
            // arming is slept through.
            self.watch_established(true)?;
            self.armed = true;
        }
        Ok(Some(self.poll.as_raw_fd()))
    }

    fn disarm_wakeup(&mut self) -> Result<()> {
        self.armed = false;
        if self.direct_mode {
            self.watch_established(false)?;
        }
        Ok(())
    }

    /// A zero-copy packet written whole has left, though its completion
    /// waits in `completed` for the next poll: it is not pending. (The
    /// device sends a large one-sided get's data as a ready packet only
    /// while nothing is pending; counting such packets sent every get
    /// of a window after the first by rendezvous, nothing waiting.)
    fn has_pending_sends(&self) -> bool {
        self.peers
            .iter()
            .any(|p| !p.queue.is_empty() || p.lanes.iter().any(|lane| !lane.queue.is_empty()))
    }

    /// Holds back packets up to the eager limit: a window of 64 one-sided
    /// gets of 16 KiB, answered in one poll, was 64 `writev`s, one per
    /// get's data; held, they leave 8 packets to a `writev`
    /// (`flush_queue`).
    fn begin_batch(&mut self) -> bool {
        self.batching = true;
        true
    }

    fn end_batch(&mut self) {
        self.batching = false;
        // Taken out while the peers are flushed, and put back (emptied)
        // to keep its room.
        let mut held = std::mem::take(&mut self.held);
        for &peer in &held {
            let Some(index) = self.peers[peer].packets else {
                // Not connected yet: the packets leave once it is.
                continue;
            };
            if let Err(e) = self.flush_conn(index) {
                self.fail_peer(peer, lost(peer, e));
            }
        }
        held.clear();
        self.held = held;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// A congestion control this system has that is not its default
    /// (reno where it can be): a socket that has it took it from us.
    fn not_the_default() -> String {
        let read = |name: &str| {
            std::fs::read_to_string(format!("/proc/sys/net/ipv4/{name}"))
                .unwrap_or_else(|e| panic!("reading {name}: {e}"))
        };
        let default = read("tcp_congestion_control").trim().to_owned();
        read("tcp_allowed_congestion_control")
            .split_whitespace()
            .find(|&name| name != default)
            .unwrap_or_else(|| panic!("no congestion control allowed besides {default}"))
            .to_owned()
    }

    /// The listener and a connecting socket have the loopback congestion
    /// control before any connection is established, and so does the
    /// socket the listener accepts: the system's default (`bbr` turns on
    /// the kernel's pacing, which a later switch leaves on) is never
    /// initialized on them.
    #[test]
    fn loopback_sockets_take_their_congestion_control_before_they_connect() {
        let name = not_the_default();
        let config = TcpConfig {
            eager_limit: 64 * 1024,
            data_lanes: 0,
            addr: IpAddr::from([127, 0, 0, 1]),
            loopback_congestion: Some(name.clone()),
        };
        let listener = listen(&config).expect("listening");
        assert_eq!(congestion_of(&listener).expect("listener's"), name);
        let addr = listener.local_addr().expect("listener's address");
        let stream = connect_to(addr, &config).expect("connecting");
        assert_eq!(
            congestion_of(&stream).expect("connecting socket's"),
            name,
            "the connecting socket, right after connect"
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        let accepted = loop {
            match listener.accept() {
                Ok((accepted, _)) => break accepted,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    assert!(
                        Instant::now() < deadline,
                        "the listener accepted no connection within 10 s"
                    );
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(e) => panic!("accepting: {e}"),
            }
        };
        assert_eq!(congestion_of(&accepted).expect("accepted socket's"), name);
    }
}
