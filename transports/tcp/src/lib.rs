//! oxmpi's Chameleon-style packet device over TCP sockets.
//!
//! This crate owns TCP connections between the ranks of a job: a listener
//! whose `ip:port` is the rank's business card, connections opened lazily
//! on the first packet to a peer (in either direction), the handshake that
//! proves the job's secret ([`oxmpi_adi::auth`]), and the moving of
//! packets: headers and payloads written with one `writev` where possible
//! and read straight into the buffer the ADI names. It implements
//! [`Transport`] and must not know communicators, requests or matching.
//!
//! # Connections
//! A connection is used only once its handshake is done; packets for a
//! peer wait in that peer's queue until then, so nothing is lost or
//! reordered. When two ranks connect to each other at once, the connection
//! opened by the lower rank wins: the acceptor decides after the peer has
//! authenticated (a stranger cannot disturb it), rejecting as duplicate
//! when it already has a connection, or when its own attempt is pending and
//! its rank is lower; otherwise it accepts and abandons its own attempt.
//! A stranger (garbage, another version, a wrong secret) is refused with a
//! reason under `OXMPI_VERBOSE=1`, and the rank goes on.
//!
//! # Environment
//! - `OXMPI_TCP_EAGER_LIMIT`: largest message in bytes sent eagerly
//!   (default 65536).
//! - `OXMPI_TCP_ADDR`: the IP address to listen on and publish (default
//!   127.0.0.1).

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};
use oxmpi_adi::auth::{Acceptor, Connector, Verdict, MESSAGE_LEN};
use oxmpi_adi::proto::{Header, HEADER_LEN};
use oxmpi_adi::transport::{JobInfo, PacketSink, PayloadSlot, PeerRank, Transport};
use oxmpi_adi::{vlog, Error, ErrorClass, Result};
use std::collections::VecDeque;
use std::io::{self, IoSlice, Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

/// Environment variable: eager limit in bytes.
pub const EAGER_LIMIT_ENV: &str = "OXMPI_TCP_EAGER_LIMIT";
/// Environment variable: address to listen on and publish.
pub const ADDR_ENV: &str = "OXMPI_TCP_ADDR";

const LISTENER: Token = Token(usize::MAX);
/// Size of each connection's read buffer: several small packets come in
/// with one read.
const READ_BUFFER: usize = 64 * 1024;
/// Payloads with at least this many bytes still to come are read straight
/// into their destination rather than through the read buffer: the copy
/// out of the buffer would cost more than the read it saves.
const DIRECT_READ_MIN: usize = 16 * 1024;
/// With at most this many established connections (and none in a
/// handshake), `poll` reads them directly instead of asking epoll first,
/// and they are taken out of epoll until the device wants to sleep: one
/// system call less on every arrival, and no epoll callback on the
/// sender's path, which together are most of the latency a progress
/// engine adds over a raw socket.
const DIRECT_POLL_MAX: usize = 4;
/// While reading directly, every this many polls still ask epoll, so the
/// listener (a peer connecting) is served.
const EPOLL_EVERY: u32 = 32;
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
    /// Address to listen on and publish.
    pub addr: IpAddr,
}

impl TcpConfig {
    /// Reads `OXMPI_TCP_EAGER_LIMIT` and `OXMPI_TCP_ADDR`.
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
        let addr = match std::env::var(ADDR_ENV) {
            Ok(v) => v.trim().parse().map_err(|_| {
                Error::new(
                    ErrorClass::Arg,
                    format!("{ADDR_ENV}={v:?} is not an IP address"),
                )
            })?,
            Err(_) => IpAddr::from([127, 0, 0, 1]),
        };
        Ok(TcpConfig { eager_limit, addr })
    }
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
        connector: Connector,
        hello: [u8; MESSAGE_LEN],
    },
    AwaitChallenge {
        peer: PeerRank,
        connector: Connector,
    },
    AwaitVerdict {
        peer: PeerRank,
        connector: Connector,
    },
    AwaitHello {
        acceptor: Acceptor,
    },
    AwaitResponse {
        peer: PeerRank,
        acceptor: Acceptor,
    },
}

enum State {
    Handshake(Handshake),
    Established { peer: PeerRank },
}

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
    /// Per peer: its address, established connection, pending outbound
    /// attempt, queued packets, and whether it failed.
    addrs: Vec<Option<SocketAddr>>,
    established: Vec<Option<usize>>,
    outbound: Vec<Option<usize>>,
    queues: Vec<VecDeque<Outgoing>>,
    failed: Vec<Option<Error>>,
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
    /// `direct` and `handshaking` were computed.
    connections_changed: bool,
    /// Polls since epoll was last asked.
    polls_since_epoll: u32,
    /// Tokens epoll reported ready (kept to avoid an allocation per poll).
    ready: Vec<usize>,
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
        let mut listener = TcpListener::bind(SocketAddr::new(config.addr, 0))
            .map_err(|e| Error::os(format!("listening on {}", config.addr), e))?;
        let local = listener
            .local_addr()
            .map_err(|e| Error::os("reading the listener's address", e))?;
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)
            .map_err(|e| Error::os("registering the listener", e))?;
        let n = job.size;
        Ok(TcpTransport {
            job: job.clone(),
            config,
            poll,
            events: Events::with_capacity(256),
            listener,
            card: local.to_string(),
            conns: Vec::new(),
            addrs: vec![None; n],
            established: vec![None; n],
            outbound: vec![None; n],
            queues: (0..n).map(|_| VecDeque::new()).collect(),
            failed: vec![None; n],
            completed: Vec::new(),
            failures: Vec::new(),
            direct: Vec::new(),
            direct_mode: false,
            armed: false,
            connections_changed: false,
            polls_since_epoll: 0,
            ready: Vec::new(),
        })
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
        };
        if index == self.conns.len() {
            self.conns.push(Some(conn));
        } else {
            self.conns[index] = Some(conn);
        }
        self.connections_changed = true;
        Ok(index)
    }

    fn close(&mut self, index: usize) {
        if let Some(mut conn) = self.conns.get_mut(index).and_then(Option::take) {
            if conn.watched {
                let _ = self.poll.registry().deregister(&mut conn.stream);
            }
        }
        for slot in self.established.iter_mut().chain(self.outbound.iter_mut()) {
            if *slot == Some(index) {
                *slot = None;
            }
        }
        self.connections_changed = true;
    }

    /// Puts the established connections under epoll (`on`) or takes them
    /// out.
    fn watch_established(&mut self, on: bool) -> Result<()> {
        for &index in &self.direct {
            let Some(conn) = self.conns[index].as_mut() else {
                continue;
            };
            if conn.watched == on {
                continue;
            }
            let registry = self.poll.registry();
            if on {
                // Armed for a sleep, a connection with nothing to write is
                // watched for reading only: registering a writable socket
                // for writability would wake the sleep at once, every time.
                let idle = matches!(conn.state, State::Established { peer } if self.queues[peer].is_empty());
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
        if self.failed[peer].is_some() {
            return;
        }
        for index in [self.established[peer], self.outbound[peer]]
            .into_iter()
            .flatten()
        {
            self.close(index);
        }
        self.queues[peer].clear();
        self.failed[peer] = Some(error.clone());
        self.failures.push((peer, error));
    }

    /// Starts connecting to `peer` unless a connection exists or is coming.
    fn connect(&mut self, peer: PeerRank) -> Result<()> {
        if self.established[peer].is_some() || self.outbound[peer].is_some() {
            return Ok(());
        }
        let addr = self.addrs[peer].ok_or_else(|| {
            Error::new(
                ErrorClass::Intern,
                format!("TCP has no card for rank {peer}"),
            )
        })?;
        let stream = TcpStream::connect(addr)
            .map_err(|e| lost(peer, format!("connecting to {addr}: {e}")))?;
        let (connector, hello) = Connector::new(&self.job, peer)
            .map_err(|e| Error::new(ErrorClass::Other, e.to_string()))?;
        let index = self
            .insert(
                stream,
                State::Handshake(Handshake::Connecting {
                    peer,
                    connector,
                    hello,
                }),
            )
            .map_err(|e| Error::os("registering a connection", e))?;
        self.outbound[peer] = Some(index);
        Ok(())
    }

    /// Writes as much of `peer`'s queue as the socket takes.
    fn flush(&mut self, peer: PeerRank) -> io::Result<()> {
        let Some(index) = self.established[peer] else {
            return Ok(());
        };
        let Some(conn) = self.conns[index].as_mut() else {
            return Ok(());
        };
        let queue = &mut self.queues[peer];
        while let Some(front) = queue.front() {
            let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(16);
            for packet in queue.iter().take(8) {
                for part in packet.unwritten() {
                    if !part.is_empty() {
                        slices.push(IoSlice::new(part));
                    }
                }
            }
            let _ = front;
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
                        self.completed.push(token);
                    }
                } else {
                    packet.offset += left;
                    left = 0;
                }
            }
        }
        Ok(())
    }

    fn enqueue(&mut self, peer: PeerRank, packet: Outgoing) -> Result<()> {
        if let Some(e) = &self.failed[peer] {
            return Err(e.clone());
        }
        if self.established[peer].is_none() {
            // Before queueing: a packet whose send fails must not stay
            // behind (a zero-copy one would point at memory the caller
            // takes back).
            self.connect(peer)?;
        }
        self.queues[peer].push_back(packet);
        if self.established[peer].is_some() {
            if let Err(e) = self.flush(peer) {
                self.fail_peer(peer, lost(peer, e));
            }
        }
        Ok(())
    }

    fn accept_all(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((stream, from)) => {
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

    /// Reads into the connection's buffer.
    fn fill(conn: &mut Conn) -> io::Result<Fill> {
        if conn.start > 0 {
            conn.buf.copy_within(conn.start..conn.end, 0);
            conn.end -= conn.start;
            conn.start = 0;
        }
        let room = conn.buf.len() - conn.end;
        let n = read_some(&mut conn.stream, &mut conn.buf[conn.end..])?;
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
                let _ = conn.stream.set_nodelay(true);
                conn.hs_out.extend_from_slice(hello);
                let State::Handshake(Handshake::Connecting {
                    peer, connector, ..
                }) = std::mem::replace(&mut conn.state, State::Established { peer: usize::MAX })
                else {
                    unreachable!()
                };
                conn.state = State::Handshake(Handshake::AwaitChallenge { peer, connector });
                continue;
            }
            if conn.end - conn.start < MESSAGE_LEN {
                match Self::fill(conn) {
                    Ok(Fill::Got { .. }) => continue,
                    Ok(Fill::Empty) => return Ok(()),
                    Err(e) => return Err(e.to_string()),
                }
            }
            let mut msg = [0u8; MESSAGE_LEN];
            msg.copy_from_slice(&conn.buf[conn.start..conn.start + MESSAGE_LEN]);
            conn.start += MESSAGE_LEN;
            let state = std::mem::replace(&mut conn.state, State::Established { peer: usize::MAX });
            let State::Handshake(hs) = state else {
                unreachable!()
            };
            match hs {
                Handshake::Connecting { .. } => unreachable!(),
                Handshake::AwaitChallenge { peer, connector } => {
                    let response = connector
                        .on_challenge(&msg)
                        .map_err(|e| format!("rank {peer}: {e}"))?;
                    conn.hs_out.extend_from_slice(&response);
                    conn.state = State::Handshake(Handshake::AwaitVerdict { peer, connector });
                }
                Handshake::AwaitVerdict { peer, connector } => {
                    match connector.on_verdict(&msg).map_err(|e| e.to_string())? {
                        Verdict::Accept => {
                            conn.state = State::Established { peer };
                            self.outbound[peer] = None;
                            self.established[peer] = Some(index);
                            self.connections_changed = true;
                            vlog!("tcp: rank {}: connected to rank {peer}", self.job.rank);
                            return Ok(());
                        }
                        Verdict::Duplicate => {
                            // The peer keeps the connection it opened to us.
                            self.close(index);
                            return Ok(());
                        }
                    }
                }
                Handshake::AwaitHello { mut acceptor } => {
                    let (peer, challenge) = acceptor
                        .on_hello(&self.job, &msg)
                        .map_err(|e| e.to_string())?;
                    conn.hs_out.extend_from_slice(&challenge);
                    conn.state = State::Handshake(Handshake::AwaitResponse { peer, acceptor });
                }
                Handshake::AwaitResponse { peer, acceptor } => {
                    acceptor
                        .on_response(&msg)
                        .map_err(|e| format!("claimed rank {peer}: {e}"))?;
                    let mine_wins = self.outbound[peer].is_some() && self.job.rank < peer;
                    if self.established[peer].is_some() || mine_wins || self.failed[peer].is_some()
                    {
                        conn.hs_out
                            .extend_from_slice(&acceptor.verdict(Verdict::Duplicate));
                        let _ = conn.stream.write(&conn.hs_out);
                        self.close(index);
                        return Ok(());
                    }
                    conn.hs_out
                        .extend_from_slice(&acceptor.verdict(Verdict::Accept));
                    conn.state = State::Established { peer };
                    if let Some(mine) = self.outbound[peer].take() {
                        self.close(mine);
                    }
                    self.established[peer] = Some(index);
                    self.connections_changed = true;
                    vlog!("tcp: rank {}: accepted rank {peer}", self.job.rank);
                    // Flush the verdict before any packet.
                    let conn = self.conns[index].as_mut().ok_or("gone")?;
                    while !conn.hs_out.is_empty() {
                        match conn.stream.write(&conn.hs_out) {
                            Ok(n) => {
                                conn.hs_out.drain(..n);
                            }
                            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                                // Packets wait until the verdict is out.
                                self.established[peer] = None;
                                conn.state = State::Handshake(Handshake::AwaitHello {
                                    acceptor: Acceptor::new(&self.job)
                                        .map_err(|e| e.to_string())?,
                                });
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

    /// Reads and delivers packets from the established connection `index`.
    fn receive(
        &mut self,
        index: usize,
        peer: PeerRank,
        sink: &mut dyn PacketSink,
    ) -> std::result::Result<bool, Error> {
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
                    if conn.end - conn.start < HEADER_LEN {
                        if drained {
                            return Ok(progressed);
                        }
                        match Self::fill(conn) {
                            Ok(Fill::Got { drained: d }) => {
                                drained = d;
                                continue;
                            }
                            Ok(Fill::Empty) => return Ok(progressed),
                            Err(e) => return Err(lost(peer, e)),
                        }
                    }
                    let header = Header::decode(&conn.buf[conn.start..conn.start + HEADER_LEN])?;
                    conn.start += HEADER_LEN;
                    progressed = true;
                    let slot = sink
                        .on_header(peer, &header)
                        .map_err(|e| broke_protocol(peer, e))?;
                    if header.payload_len == 0 {
                        if let Some(slot) = slot {
                            sink.on_payload(peer, slot);
                        }
                        continue;
                    }
                    conn.read = ReadState::Payload {
                        slot,
                        remaining: header.payload_len,
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
                                placed += n;
                                remaining -= n as u64;
                            }
                            Err(e) => return Err(lost(peer, e)),
                        }
                    } else {
                        match Self::fill(conn) {
                            Ok(Fill::Got { drained: d }) => drained = d,
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
            let outbound_peer = match hs {
                Handshake::Connecting { peer, .. }
                | Handshake::AwaitChallenge { peer, .. }
                | Handshake::AwaitVerdict { peer, .. } => Some(*peer),
                _ => None,
            };
            if let Err(why) = self.handshake(index) {
                self.close(index);
                match outbound_peer {
                    // Our own attempt to a job member failed: that peer is
                    // unreachable (unless another connection takes over).
                    Some(peer) if self.established[peer].is_none() => {
                        self.fail_peer(peer, lost(peer, format!("handshake failed: {why}")));
                    }
                    _ => vlog!("tcp: rank {}: refused a connection: {why}", self.job.rank),
                }
                return true;
            }
            let Some(State::Established { peer }) = self.conns[index].as_ref().map(|c| &c.state)
            else {
                return true;
            };
            let peer = *peer;
            if let Err(e) = self.flush(peer) {
                self.fail_peer(peer, lost(peer, e));
                return true;
            }
        }
        let Some(State::Established { peer }) = self.conns[index].as_ref().map(|c| &c.state) else {
            return false;
        };
        let peer = *peer;
        let mut progressed = handshaking;
        if !self.queues[peer].is_empty() {
            if let Err(e) = self.flush(peer) {
                self.fail_peer(peer, lost(peer, e));
                return true;
            }
            progressed = true;
        }
        match self.receive(index, peer, sink) {
            Ok(p) => progressed | p,
            Err(e) => {
                self.fail_peer(peer, e);
                true
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
        let slot = self.addrs.get_mut(peer).ok_or_else(|| {
            Error::new(ErrorClass::Rank, format!("rank {peer} is not in the job"))
        })?;
        *slot = Some(addr);
        Ok(())
    }

    fn eager_limit(&self) -> usize {
        self.config.eager_limit
    }

    fn send(&mut self, peer: PeerRank, header: &Header, payload: &[u8]) -> Result<()> {
        let header = header.encode();
        // Fast path: nothing queued and connected, write at once.
        if self.queues[peer].is_empty() {
            if let Some(conn) = self.established[peer].and_then(|i| self.conns[i].as_mut()) {
                let total = HEADER_LEN + payload.len();
                let attempt = if payload.len() <= COPY_SEND_MAX {
                    // One contiguous `send` rather than a `writev`: the
                    // copy costs less than writev's trip through the VFS.
                    let mut packet = [0u8; HEADER_LEN + COPY_SEND_MAX];
                    packet[..HEADER_LEN].copy_from_slice(&header);
                    packet[HEADER_LEN..total].copy_from_slice(payload);
                    conn.stream.write(&packet[..total])
                } else {
                    conn.stream
                        .write_vectored(&[IoSlice::new(&header), IoSlice::new(payload)])
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
                        payload: Payload::Owned(payload.to_vec()),
                        offset: written,
                    },
                );
            }
        }
        self.enqueue(
            peer,
            Outgoing {
                header,
                payload: Payload::Owned(payload.to_vec()),
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
        self.enqueue(
            peer,
            Outgoing {
                header: header.encode(),
                payload: Payload::Borrowed {
                    ptr: payload,
                    len,
                    token,
                },
                offset: 0,
            },
        )
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
            self.direct = self.established.iter().flatten().copied().collect();
            let handshaking = self
                .conns
                .iter()
                .flatten()
                .any(|c| matches!(c.state, State::Handshake(_)));
            self.direct_mode =
                !self.direct.is_empty() && self.direct.len() <= DIRECT_POLL_MAX && !handshaking;
            self.watch_established(!self.direct_mode || self.armed)?;
        }
        if self.direct_mode {
            // By position: servicing may close a connection and change the
            // list (the next poll rebuilds it).
            let mut k = 0;
            while let Some(&index) = self.direct.get(k) {
                progressed |= self.service(index, sink);
                k += 1;
            }
            self.polls_since_epoll += 1;
        }
        if !self.direct_mode || self.polls_since_epoll >= EPOLL_EVERY {
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

    fn has_pending_sends(&self) -> bool {
        self.queues.iter().any(|q| !q.is_empty()) || !self.completed.is_empty()
    }
}
