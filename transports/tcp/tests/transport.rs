//! Transport-level tests of `oxmpi-tcp`: two or three [`TcpTransport`]s in
//! one process, on loopback only, driven by calling `poll` on each in turn
//! with a [`Recorder`] sink that keeps every header, payload, completion and
//! failure. No ADI and no launcher are involved: what is checked is the
//! transport's side of the contract in `oxmpi_adi::transport`:
//!
//! - packets arrive intact in both directions, eager-sized and multi-MiB
//!   zero-copy ones, and a zero-copy send's completion is reported once;
//! - when two ranks connect to each other at once, every packet still
//!   arrives exactly once and in order with the packets sent after it;
//! - a peer that breaks the protocol (the sink refuses one of its headers,
//!   or it authenticates and then sends a malformed header) is reported
//!   failed once, and later sends to it fail with `ProcFailed`;
//! - a peer that disappears in the middle of a large transfer, in either
//!   direction, or before it was ever reached, is reported failed, the
//!   sends queued to it are dropped without a completion, nothing hangs,
//!   and the other ranks still talk;
//! - a send refused at once (no card for the peer) leaves nothing queued;
//! - data packets spread over the data lanes (none, one or several) arrive
//!   intact both ways, while the other packets keep their order; a lane
//!   that carries anything but data fails the peer; a peer lost while data
//!   waits on a lane to it fails it without completing the data;
//! - a stranger on the listener (garbage, a wrong secret, or silence) is
//!   refused and the job's own traffic goes on;
//! - the packets of a batch (`begin_batch` .. `end_batch`) up to the
//!   eager limit leave at its end, in order, the first too; a larger one
//!   at once;
//! - a zero-copy packet written whole is not pending, though its
//!   completion waits for the next poll.
//!
//! Every wait has a deadline ([`DEADLINE`]) and fails saying what it waited
//! for and what each rank had seen.

use oxmpi_adi::auth::{Channel, Connector, Verdict, MESSAGE_LEN};
use oxmpi_adi::proto::{Header, Kind, HEADER_LEN};
use oxmpi_adi::transport::{JobInfo, PacketSink, PayloadSlot, PeerRank, Transport};
use oxmpi_adi::{Error, ErrorClass, Result};
use oxmpi_tcp::{TcpConfig, TcpTransport, LOOPBACK_CONGESTION};
use std::io::{ErrorKind, Read, Write};
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// Longest any single wait may take before the test fails.
const DEADLINE: Duration = Duration::from_secs(10);
/// The eager limit the transports are built with.
const EAGER: usize = 64 * 1024;
/// The job's secret; a stranger uses another one.
const SECRET: [u8; 32] = [0x5a; 32];

// ---------------------------------------------------------------------------
// The recording sink.

/// One header the sink accepted, and its payload as placed so far.
struct Arrival {
    peer: PeerRank,
    header: Header,
    payload: Vec<u8>,
    /// `on_payload` was reported (at most once, checked).
    placed: bool,
}

/// A [`PacketSink`] that records everything and checks the "once" rules:
/// a payload is placed once, a peer fails once, and nothing arrives from a
/// peer after it was reported failed.
#[derive(Default)]
struct Recorder {
    /// Accepted headers in arrival order; the index is the payload slot.
    arrivals: Vec<Arrival>,
    /// Headers refused because of `refuse_tag`.
    refused: Vec<(PeerRank, Header)>,
    /// Tokens of completed zero-copy sends, in order.
    completions: Vec<u64>,
    /// Peers reported failed, with the error, in order.
    failures: Vec<(PeerRank, Error)>,
    /// Refuse headers with this tag, as the ADI refuses one that breaks the
    /// protocol.
    refuse_tag: Option<i32>,
}

impl Recorder {
    /// The tags of the packets from `peer` whose payload was placed.
    fn tags_from(&self, peer: PeerRank) -> Vec<i32> {
        self.arrivals
            .iter()
            .filter(|a| a.peer == peer && a.placed)
            .map(|a| a.header.tag)
            .collect()
    }

    /// The placed packet from `peer` with `tag` (it must be the only one).
    fn packet(&self, peer: PeerRank, tag: i32) -> &Arrival {
        let mut found = self
            .arrivals
            .iter()
            .filter(|a| a.peer == peer && a.header.tag == tag);
        let a = found
            .next()
            .unwrap_or_else(|| panic!("no packet with tag {tag} from rank {peer}"));
        assert!(
            found.next().is_none(),
            "tag {tag} from rank {peer} arrived twice"
        );
        assert!(a.placed, "tag {tag} from rank {peer} was not placed");
        a
    }

    /// The error `peer` was reported failed with.
    fn failure(&self, peer: PeerRank) -> Option<&Error> {
        self.failures
            .iter()
            .find(|(p, _)| *p == peer)
            .map(|(_, e)| e)
    }
}

impl PacketSink for Recorder {
    fn on_header(&mut self, peer: PeerRank, header: &Header) -> Result<Option<PayloadSlot>> {
        assert!(
            self.failure(peer).is_none(),
            "a header from rank {peer} after it was reported failed: {header:?}"
        );
        if self.refuse_tag == Some(header.tag) {
            self.refused.push((peer, *header));
            // Deliberately not ProcFailed: the transport must not depend on
            // the class the ADI happens to use.
            return Err(Error::new(
                ErrorClass::Other,
                format!("test sink refuses tag {}", header.tag),
            ));
        }
        let len = usize::try_from(header.payload_len()).expect("payload fits in memory");
        self.arrivals.push(Arrival {
            peer,
            header: *header,
            payload: vec![0; len],
            placed: false,
        });
        Ok(Some(PayloadSlot(self.arrivals.len() as u64 - 1)))
    }

    fn payload_buffer(&mut self, slot: PayloadSlot) -> &mut [u8] {
        &mut self.arrivals[slot.0 as usize].payload
    }

    fn on_payload(&mut self, peer: PeerRank, slot: PayloadSlot) {
        let a = &mut self.arrivals[slot.0 as usize];
        assert_eq!(
            a.peer, peer,
            "payload of slot {slot:?} placed for another peer"
        );
        assert!(!a.placed, "payload of slot {slot:?} reported twice");
        a.placed = true;
    }

    fn on_send_complete(&mut self, token: u64) {
        assert!(
            !self.completions.contains(&token),
            "send {token} completed twice"
        );
        self.completions.push(token);
    }

    fn on_peer_failed(&mut self, peer: PeerRank, error: Error) {
        assert!(
            self.failure(peer).is_none(),
            "rank {peer} reported failed twice (again with {error})"
        );
        self.failures.push((peer, error));
    }
}

// ---------------------------------------------------------------------------
// A job of transports in one process.

/// The tests' settings: [`EAGER`], one data lane, 127.0.0.1, and the
/// default congestion control of loopback connections.
fn config() -> TcpConfig {
    TcpConfig {
        eager_limit: EAGER,
        data_lanes: 1,
        addr: IpAddr::from([127, 0, 0, 1]),
        loopback_congestion: Some(LOOPBACK_CONGESTION.to_owned()),
    }
}

fn job(rank: PeerRank, size: usize) -> JobInfo {
    JobInfo {
        rank,
        size,
        secret: SECRET,
    }
}

/// An eager packet with `len` bytes of payload; the tag names it.
fn eager(tag: i32, len: usize) -> Header {
    Header {
        tag,
        sequence: tag as u32,
        message_len: len as u64,
        ..Header::new(Kind::Eager)
    }
}

/// A rendezvous data packet with `len` bytes of payload (not sequenced).
fn data(tag: i32, len: usize) -> Header {
    Header {
        kind: Kind::Data,
        sequence: 0,
        ..eager(tag, len)
    }
}

/// `len` bytes that differ from packet to packet and along the payload, so
/// that a lost, repeated or shifted chunk shows.
fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8 ^ seed).collect()
}

/// The ranks of one job, each a transport (or dropped) with its sink.
struct Net {
    ranks: Vec<Option<TcpTransport>>,
    sinks: Vec<Recorder>,
    /// Poll the ranks from the highest down instead of from 0 up.
    reverse: bool,
}

impl Net {
    /// `size` transports on 127.0.0.1 that know each other's cards, with
    /// the default single data lane.
    fn new(size: usize) -> Net {
        Net::with_lanes(size, 1)
    }

    /// `size` transports that open `lanes` data lanes to a peer.
    fn with_lanes(size: usize, lanes: usize) -> Net {
        Net::with_config(
            size,
            TcpConfig {
                data_lanes: lanes,
                ..config()
            },
        )
    }

    /// `size` transports on `config`.
    fn with_config(size: usize, config: TcpConfig) -> Net {
        let mut ranks: Vec<TcpTransport> = (0..size)
            .map(|rank| {
                TcpTransport::new(&job(rank, size), config.clone())
                    .unwrap_or_else(|e| panic!("rank {rank}: no transport: {e}"))
            })
            .collect();
        let cards: Vec<String> = ranks.iter().map(|t| t.card().to_owned()).collect();
        for (rank, t) in ranks.iter_mut().enumerate() {
            assert_eq!(t.eager_limit(), EAGER);
            for (peer, card) in cards.iter().enumerate() {
                if peer != rank {
                    assert!(t.reachable(card), "card {card:?} not reachable");
                    t.add_peer(peer, card)
                        .unwrap_or_else(|e| panic!("rank {rank}: add_peer({peer}): {e}"));
                }
            }
        }
        Net {
            ranks: ranks.into_iter().map(Some).collect(),
            sinks: (0..size).map(|_| Recorder::default()).collect(),
            reverse: false,
        }
    }

    fn t(&mut self, rank: PeerRank) -> &mut TcpTransport {
        self.ranks[rank]
            .as_mut()
            .unwrap_or_else(|| panic!("rank {rank} was dropped"))
    }

    fn card(&mut self, rank: PeerRank) -> String {
        self.t(rank).card().to_owned()
    }

    /// Sends a packet that must be accepted.
    fn send(&mut self, from: PeerRank, to: PeerRank, header: &Header, payload: &[u8]) {
        self.t(from)
            .send(to, header, payload)
            .unwrap_or_else(|e| panic!("rank {from} -> {to}, tag {}: {e}", header.tag));
    }

    /// Sends a zero-copy packet that must be accepted.
    ///
    /// # Safety
    /// `payload` must stay alive and unmodified until `from` reports the
    /// completion of `token` or the failure of `to`.
    unsafe fn send_zcopy(
        &mut self,
        from: PeerRank,
        to: PeerRank,
        header: &Header,
        payload: &[u8],
        token: u64,
    ) {
        // SAFETY: passed on to our caller (see above).
        unsafe {
            self.t(from)
                .send_zcopy(to, header, payload.as_ptr(), payload.len(), token)
        }
        .unwrap_or_else(|e| panic!("rank {from} -> {to}, zcopy tag {}: {e}", header.tag));
    }

    /// Drops rank `rank`'s transport, closing its listener and connections.
    fn drop_rank(&mut self, rank: PeerRank) {
        assert!(
            self.ranks[rank].take().is_some(),
            "rank {rank} dropped twice"
        );
    }

    /// Polls `rank` once; whether anything happened.
    fn poll_rank(&mut self, rank: PeerRank) -> bool {
        let Some(t) = self.ranks[rank].as_mut() else {
            return false;
        };
        t.poll(&mut self.sinks[rank])
            .unwrap_or_else(|e| panic!("rank {rank}: poll failed: {e}"))
    }

    /// Polls the `ranks` still alive, one at a time, until `done` holds,
    /// checking it after every single poll. Panics after [`DEADLINE`].
    fn run_ranks_until(
        &mut self,
        ranks: &[PeerRank],
        what: &str,
        mut done: impl FnMut(&Net) -> bool,
    ) {
        let deadline = Instant::now() + DEADLINE;
        let mut order = ranks.to_vec();
        if self.reverse {
            order.reverse();
        }
        loop {
            let mut progressed = false;
            for &rank in &order {
                if done(self) {
                    return;
                }
                progressed |= self.poll_rank(rank);
            }
            if done(self) {
                return;
            }
            if Instant::now() > deadline {
                panic!(
                    "timed out after {DEADLINE:?} waiting until {what}\n{}",
                    self.summary()
                );
            }
            if !progressed {
                // Two shared cores: let the kernel and other tests run.
                std::thread::sleep(Duration::from_micros(100));
            }
        }
    }

    /// Polls every rank still alive until `done` holds.
    fn run_until(&mut self, what: &str, done: impl FnMut(&Net) -> bool) {
        let all: Vec<PeerRank> = (0..self.ranks.len()).collect();
        self.run_ranks_until(&all, what, done);
    }

    /// Polls every rank still alive `n` times (to show nothing more comes).
    fn run_for(&mut self, n: usize) {
        for _ in 0..n {
            for rank in 0..self.ranks.len() {
                self.poll_rank(rank);
            }
        }
    }

    /// What each rank has seen, for failure messages.
    fn summary(&self) -> String {
        let mut s = String::new();
        for (rank, sink) in self.sinks.iter().enumerate() {
            let state = if self.ranks[rank].is_none() {
                " (dropped)"
            } else {
                ""
            };
            let arrivals: Vec<String> = sink
                .arrivals
                .iter()
                .rev()
                .take(12)
                .rev()
                .map(|a| {
                    format!(
                        "{}:tag{}:{}B{}",
                        a.peer,
                        a.header.tag,
                        a.payload.len(),
                        if a.placed { "" } else { "(partial)" }
                    )
                })
                .collect();
            let failures: Vec<String> = sink
                .failures
                .iter()
                .map(|(p, e)| format!("{p}: {e}"))
                .collect();
            s += &format!(
                "  rank {rank}{state}: {} arrivals (last: {arrivals:?}), refused {}, \
                 completions {:?}, failures {failures:?}\n",
                sink.arrivals.len(),
                sink.refused.len(),
                sink.completions,
            );
        }
        s
    }
}

/// Asserts that `result` is the error of a send to a failed peer.
fn assert_proc_failed(result: Result<()>, what: &str) {
    match result {
        Ok(()) => panic!("{what}: succeeded, but the peer is lost"),
        Err(e) => assert_eq!(
            e.class(),
            ErrorClass::ProcFailed,
            "{what}: wrong error class: {e}"
        ),
    }
}

// ---------------------------------------------------------------------------
// A raw socket speaking to a transport: a stranger, or an impostor that
// knows the secret.

/// A non-blocking std socket connected to a transport's card.
struct RawPeer {
    stream: std::net::TcpStream,
    inbox: Vec<u8>,
    /// The transport closed the connection (end of stream or reset).
    closed: bool,
}

impl RawPeer {
    fn connect(card: &str) -> RawPeer {
        let stream = std::net::TcpStream::connect(card)
            .unwrap_or_else(|e| panic!("raw connect to {card}: {e}"));
        stream.set_nonblocking(true).expect("non-blocking");
        RawPeer {
            stream,
            inbox: Vec::new(),
            closed: false,
        }
    }

    /// Writes all of `bytes` (small: the socket buffer takes them).
    fn write(&mut self, bytes: &[u8]) {
        self.stream
            .write_all(bytes)
            .unwrap_or_else(|e| panic!("raw write of {} bytes: {e}", bytes.len()));
    }

    /// Reads whatever has arrived; notes whether the other side closed.
    fn pump(&mut self) {
        let mut buf = [0u8; 4096];
        while !self.closed {
            match self.stream.read(&mut buf) {
                Ok(0) => self.closed = true,
                Ok(n) => self.inbox.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => self.closed = true,
            }
        }
    }

    /// Takes one handshake message, if a whole one has arrived.
    fn message(&mut self) -> Option<[u8; MESSAGE_LEN]> {
        self.pump();
        if self.inbox.len() < MESSAGE_LEN {
            return None;
        }
        let mut m = [0u8; MESSAGE_LEN];
        m.copy_from_slice(&self.inbox[..MESSAGE_LEN]);
        self.inbox.drain(..MESSAGE_LEN);
        Some(m)
    }
}

/// Connects to `net`'s rank `to` as rank `claim` of the job (it knows the
/// secret) asking for a connection of `channel`, and completes the
/// handshake, polling `to` meanwhile.
fn impostor(net: &mut Net, to: PeerRank, claim: PeerRank, channel: Channel) -> RawPeer {
    let size = net.ranks.len();
    let mut raw = RawPeer::connect(&net.card(to));
    let (connector, hello) = Connector::new(&job(claim, size), to, channel).expect("hello");
    raw.write(&hello);
    let mut challenge = None;
    net.run_ranks_until(&[to], "the impostor gets a challenge", |_| {
        challenge = raw.message();
        challenge.is_some() || raw.closed
    });
    let challenge = challenge.expect("the transport closed the impostor's connection");
    raw.write(&connector.on_challenge(&challenge).expect("valid challenge"));
    let mut verdict = None;
    net.run_ranks_until(&[to], "the impostor gets a verdict", |_| {
        verdict = raw.message();
        verdict.is_some() || raw.closed
    });
    let verdict = verdict.expect("the transport closed the impostor's connection");
    assert_eq!(connector.on_verdict(&verdict), Ok(Verdict::Accept));
    raw
}

// ---------------------------------------------------------------------------
// a) Packets arrive intact.

#[test]
fn eager_and_zero_copy_payloads_arrive_intact_both_ways() {
    const BIG_A: usize = 8 << 20;
    const BIG_B: usize = (5 << 20) + 12_345;
    // Declared before the transports, so they outlive any pointer to them.
    let big_a = pattern(0xa5, BIG_A);
    let big_b = pattern(0x3c, BIG_B);
    let small = pattern(1, 1000);
    let at_limit = pattern(2, EAGER);
    let mut net = Net::new(2);

    net.send(0, 1, &eager(1, small.len()), &small);
    net.send(0, 1, &eager(2, 0), &[]);
    net.send(0, 1, &eager(3, at_limit.len()), &at_limit);
    net.send(1, 0, &eager(11, small.len()), &small);
    net.send(1, 0, &eager(12, at_limit.len()), &at_limit);
    // SAFETY: `big_a` and `big_b` live until the end of the test.
    unsafe {
        net.send_zcopy(0, 1, &data(4, BIG_A), &big_a, 0xa);
        net.send_zcopy(1, 0, &data(13, BIG_B), &big_b, 0xb);
    }
    net.send(0, 1, &eager(5, small.len()), &small);

    net.run_until("every packet arrived and both zcopy sends completed", |n| {
        n.sinks[1].tags_from(0).len() == 5
            && n.sinks[0].tags_from(1).len() == 3
            && n.sinks[0].completions == [0xa]
            && n.sinks[1].completions == [0xb]
    });

    let (a, b) = (&net.sinks[0], &net.sinks[1]);
    assert_eq!(b.tags_from(0), [1, 2, 3, 4, 5], "order A -> B");
    assert_eq!(a.tags_from(1), [11, 12, 13], "order B -> A");
    for (sink, from, tag, sent, header) in [
        (b, 0, 1, &small, eager(1, small.len())),
        (b, 0, 2, &Vec::new(), eager(2, 0)),
        (b, 0, 3, &at_limit, eager(3, EAGER)),
        (b, 0, 4, &big_a, data(4, BIG_A)),
        (b, 0, 5, &small, eager(5, small.len())),
        (a, 1, 11, &small, eager(11, small.len())),
        (a, 1, 12, &at_limit, eager(12, EAGER)),
        (a, 1, 13, &big_b, data(13, BIG_B)),
    ] {
        let got = sink.packet(from, tag);
        assert_eq!(got.header, header, "header of tag {tag}");
        assert!(
            got.payload == *sent,
            "payload of tag {tag} ({} bytes) differs from what was sent",
            sent.len()
        );
    }
    assert!(a.failures.is_empty() && b.failures.is_empty());
    net.run_for(10);
    assert_eq!(net.sinks[0].completions, [0xa], "completion reported once");
    assert!(!net.t(0).has_pending_sends() && !net.t(1).has_pending_sends());
}

/// Loopback connections take the configured congestion control at both
/// ends (the connector's and the acceptor's socket), or keep the
/// system's default when none is configured.
#[test]
fn loopback_connections_use_the_configured_congestion_control() {
    let system = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control")
        .expect("the system's congestion control")
        .trim()
        .to_owned();
    for (configured, expected) in [
        (Some(LOOPBACK_CONGESTION.to_owned()), LOOPBACK_CONGESTION),
        (None, system.as_str()),
    ] {
        let mut net = Net::with_config(
            2,
            TcpConfig {
                loopback_congestion: configured.clone(),
                ..config()
            },
        );
        net.send(0, 1, &eager(1, 0), &[]);
        net.run_until("the packet arrived", |n| n.sinks[1].tags_from(0).len() == 1);
        for (rank, peer) in [(0, 1), (1, 0)] {
            assert_eq!(
                net.t(rank).packet_congestion(peer).as_deref(),
                Some(expected),
                "rank {rank}'s connection to {peer}, configured {configured:?}"
            );
        }
    }
}

#[test]
fn a_payload_sent_in_parts_arrives_as_their_concatenation() {
    const MIB: usize = 1 << 20;
    // Small parts (copied behind the header), large ones (written
    // vectored), and eight packets of 3 MiB sent before the receiver
    // reads: the socket fills, so the rest of a packet is queued mid-way
    // through its parts.
    let head = pattern(7, 32);
    let tiny = pattern(8, 100);
    let big: Vec<Vec<u8>> = (0..8).map(|i| pattern(0x40 + i as u8, 3 * MIB)).collect();
    let mut net = Net::new(2);
    net.t(0)
        .send_parts(1, &eager(1, head.len() + tiny.len()), &[&head, &tiny])
        .expect("small parts accepted");
    for (i, part) in big.iter().enumerate() {
        let tag = 2 + i as i32;
        net.t(0)
            .send_parts(1, &eager(tag, head.len() + part.len()), &[&head, part, &[]])
            .unwrap_or_else(|e| panic!("parts of tag {tag}: {e}"));
    }
    net.run_until("every packet sent in parts arrived", |n| {
        n.sinks[1].tags_from(0).len() == 9
    });
    let b = &net.sinks[1];
    assert_eq!(b.tags_from(0), (1..=9).collect::<Vec<i32>>(), "order");
    assert!(b.packet(0, 1).payload == [&head[..], &tiny[..]].concat());
    for (i, part) in big.iter().enumerate() {
        let tag = 2 + i as i32;
        assert!(
            b.packet(0, tag).payload == [&head[..], &part[..]].concat(),
            "payload of tag {tag} differs from its parts"
        );
    }
    assert!(b.failures.is_empty());
}

/// Runs of large packets (after which a header is read with a short
/// look-ahead) with short packets amid and behind them, arriving one at
/// a time and in bursts, all arrive intact and in order.
#[test]
fn large_packets_with_short_ones_amid_and_behind_them_arrive_intact() {
    const KIB: usize = 1024;
    let lens = [
        128 * KIB,
        40,
        128 * KIB,
        64 * KIB,
        0,
        3000,
        200 * KIB,
        5000,
        70 * KIB,
    ];
    let payloads: Vec<Vec<u8>> = lens
        .iter()
        .enumerate()
        .map(|(i, &len)| pattern(i as u8, len))
        .collect();
    let mut net = Net::new(2);
    let mut tag = 0;
    let mut sent = Vec::new();
    // One at a time: each arrives alone, before the next is sent.
    for payload in &payloads {
        tag += 1;
        net.send(0, 1, &eager(tag, payload.len()), payload);
        sent.push((tag, payload));
        net.run_until("the packet sent alone arrived", |n| {
            n.sinks[1].tags_from(0).len() == sent.len()
        });
    }
    // In bursts: a run of short packets behind a large one, then the
    // whole list again.
    for payload in std::iter::once(&payloads[0])
        .chain(std::iter::repeat_n(&payloads[1], 20))
        .chain(&payloads)
    {
        tag += 1;
        net.send(0, 1, &eager(tag, payload.len()), payload);
        sent.push((tag, payload));
    }
    net.run_until("every packet of the bursts arrived", |n| {
        n.sinks[1].tags_from(0).len() == sent.len()
    });
    let b = &net.sinks[1];
    assert_eq!(
        b.tags_from(0),
        sent.iter().map(|&(tag, _)| tag).collect::<Vec<i32>>(),
        "order"
    );
    for (tag, payload) in sent {
        assert!(
            b.packet(0, tag).payload == *payload,
            "payload of tag {tag} ({} bytes) differs",
            payload.len()
        );
    }
    assert!(b.failures.is_empty());
}

/// Checks that rank 0's batch holds its packets to rank 1: while only
/// rank 1 polls for 20 ms (in a batch, the device does not poll), none
/// arrives after the first (tag 1, which opened the connection), and
/// they are pending.
fn assert_held_in_batch(net: &mut Net) {
    for _ in 0..200 {
        net.poll_rank(1);
        std::thread::sleep(Duration::from_micros(100));
    }
    assert_eq!(
        net.sinks[1].tags_from(0),
        [1],
        "packets of the batch arrived before it ended"
    );
    assert!(net.t(0).has_pending_sends(), "the held packets are pending");
}

/// Packets of at most the eager limit sent in a batch (zero-copy ones,
/// and a copied one behind them) stay in the sender until the batch
/// ends, then arrive intact and in order; a larger one leaves at once.
#[test]
fn a_batch_holds_its_packets_until_it_ends() {
    const PIECE: usize = 16 * 1024;
    let pieces: Vec<Vec<u8>> = (0..3).map(|i| pattern(0x10 + i as u8, PIECE)).collect();
    let small = pattern(9, 100);
    // Declared before the transports, so they outlive any pointer to them.
    let beyond = pattern(0x77, EAGER + 1);
    let mut net = Net::new(2);
    net.send(0, 1, &eager(1, 0), &[]);
    net.run_until("the connection is up", |n| n.sinks[1].tags_from(0) == [1]);

    assert!(net.t(0).begin_batch(), "TCP holds back a batch's packets");
    for (i, piece) in pieces.iter().enumerate() {
        // SAFETY: `pieces`, declared before the transports, outlives them.
        unsafe { net.send_zcopy(0, 1, &eager(2 + i as i32, PIECE), piece, 2 + i as u64) };
    }
    net.send(0, 1, &eager(5, small.len()), &small);
    assert_held_in_batch(&mut net);
    net.t(0).end_batch();
    net.run_until("the batch's packets arrived and completed", |n| {
        n.sinks[1].tags_from(0).len() == 5 && n.sinks[0].completions.len() == 3
    });
    assert_eq!(net.sinks[1].tags_from(0), [1, 2, 3, 4, 5], "order");
    for (i, piece) in pieces.iter().enumerate() {
        assert!(
            net.sinks[1].packet(0, 2 + i as i32).payload == *piece,
            "payload of tag {} differs",
            2 + i
        );
    }
    assert!(net.sinks[1].packet(0, 5).payload == small);
    assert_eq!(net.sinks[0].completions, [2, 3, 4]);

    // A packet beyond the eager limit is not held: it leaves at once,
    // with what was held before it (the socket takes it whole: its send
    // buffer starts at several 64 KiB segments on loopback).
    assert!(net.t(0).begin_batch());
    // SAFETY: `pieces` and `beyond`, declared before the transports,
    // outlive them.
    unsafe {
        net.send_zcopy(0, 1, &eager(6, PIECE), &pieces[0], 6);
        net.send_zcopy(0, 1, &data(7, beyond.len()), &beyond, 7);
    }
    net.run_ranks_until(
        &[1],
        "the packet beyond the limit arrived in the batch",
        |n| n.sinks[1].tags_from(0).len() == 7,
    );
    net.t(0).end_batch();
    assert_eq!(net.sinks[1].tags_from(0), [1, 2, 3, 4, 5, 6, 7], "order");
    assert!(net.sinks[1].packet(0, 7).payload == beyond);
    assert!(net.sinks[0].failures.is_empty() && net.sinks[1].failures.is_empty());
}

/// The first packet of a batch is held too, though nothing is queued
/// before it (the RTSs and CTSs of a window of large gets): it leaves
/// with the batch's end, with the packets after it.
#[test]
fn a_batch_holds_its_first_packet_with_nothing_queued() {
    let mut net = Net::new(2);
    net.send(0, 1, &eager(1, 0), &[]);
    net.run_until("the connection is up", |n| n.sinks[1].tags_from(0) == [1]);
    assert!(!net.t(0).has_pending_sends(), "nothing is queued");

    assert!(net.t(0).begin_batch());
    net.send(0, 1, &cts(2), &[]);
    net.send(0, 1, &eager(3, 100), &pattern(3, 100));
    assert_held_in_batch(&mut net);
    net.t(0).end_batch();
    net.run_until("the batch's packets arrived", |n| {
        n.sinks[1].tags_from(0).len() == 3
    });
    assert_eq!(net.sinks[1].tags_from(0), [1, 2, 3], "order");
    assert!(net.sinks[1].packet(0, 3).payload == pattern(3, 100));
}

/// A zero-copy packet the socket took whole is not pending, though its
/// completion is reported only by the next poll: the device sends a
/// one-sided get's data beyond the eager limit as a ready packet only
/// while nothing is pending, and such a packet is no reason to fall back
/// to a rendezvous.
#[test]
fn a_zero_copy_packet_written_whole_is_not_pending() {
    let payload = pattern(0x42, EAGER + 1);
    let mut net = Net::new(2);
    net.send(0, 1, &eager(1, 0), &[]);
    net.run_until("the connection is up", |n| n.sinks[1].tags_from(0) == [1]);

    // SAFETY: `payload`, declared before the transports, outlives them.
    unsafe { net.send_zcopy(0, 1, &data(2, payload.len()), &payload, 7) };
    assert!(
        net.sinks[0].completions.is_empty(),
        "completions wait for a poll"
    );
    assert!(
        !net.t(0).has_pending_sends(),
        "a packet of {} bytes, written whole to an idle loopback socket, counts as pending",
        payload.len()
    );
    net.poll_rank(0);
    assert_eq!(net.sinks[0].completions, [7], "completed at the next poll");
    net.run_until("the packet arrived", |n| n.sinks[1].tags_from(0).len() == 2);
    assert!(net.sinks[1].packet(0, 2).payload == payload);
}

/// A CTS header, which tells the transport that data from the peer it
/// goes to is coming.
fn cts(tag: i32) -> Header {
    Header {
        tag,
        sequence: tag as u32,
        ..Header::new(Kind::Cts)
    }
}

#[test]
fn data_packets_take_the_lanes_and_arrive_intact_both_ways() {
    const MIB: usize = 1 << 20;
    const BATCH: i32 = 24;
    for lanes in [0, 1, 3] {
        // Declared before the transports, so they outlive any pointer to
        // them. Tags 100.. go from 0 to 1, tags 200.. from 1 to 0.
        let first = pattern(0x5a, MIB);
        let payloads: Vec<Vec<u8>> = (0..BATCH)
            .map(|i| pattern(i as u8, MIB + i as usize))
            .collect();
        let mut net = Net::with_lanes(2, lanes);
        net.send(1, 0, &cts(1), &[]);
        net.run_until("the connection is up", |n| n.sinks[0].tags_from(1) == [1]);
        // The first data packet to a peer opens the lanes (as the ADI sends
        // it: after a CTS came over the packet connection).
        // SAFETY: `first` lives until the end of the test.
        unsafe { net.send_zcopy(0, 1, &data(2, MIB), &first, 2) };
        net.run_until("the lanes are open", |n| {
            n.sinks[1].tags_from(0) == [2]
                && n.ranks[0].as_ref().unwrap().open_data_lanes(1) == lanes
        });
        // A batch each way, with sequenced packets between data packets,
        // and the CTS packets that announce data as the ADI sends them.
        for (i, payload) in payloads.iter().enumerate() {
            let i = i as i32;
            net.send(1, 0, &cts(10 + i), &[]);
            net.send(0, 1, &cts(10 + i), &[]);
            // SAFETY: `payloads` lives until the end of the test.
            unsafe {
                net.send_zcopy(0, 1, &data(100 + i, payload.len()), payload, 100 + i as u64);
                net.send_zcopy(1, 0, &data(200 + i, payload.len()), payload, 200 + i as u64);
            }
            net.send(0, 1, &eager(300 + i, 7), &pattern(1, 7));
        }
        net.run_until("every packet arrived and every data send completed", |n| {
            n.sinks[1].tags_from(0).len() == 1 + 3 * BATCH as usize
                && n.sinks[0].tags_from(1).len() == 1 + 2 * BATCH as usize
                && n.sinks[0].completions.len() == 1 + BATCH as usize
                && n.sinks[1].completions.len() == BATCH as usize
        });
        for (i, payload) in payloads.iter().enumerate() {
            let i = i as i32;
            assert!(
                net.sinks[1].packet(0, 100 + i).payload == *payload,
                "lanes {lanes}: tag {}",
                100 + i
            );
            assert!(
                net.sinks[0].packet(1, 200 + i).payload == *payload,
                "lanes {lanes}: tag {}",
                200 + i
            );
        }
        // Sequenced packets keep their order whatever path data took.
        let sequenced: Vec<i32> = net.sinks[1]
            .arrivals
            .iter()
            .filter(|a| a.header.kind != Kind::Data)
            .map(|a| a.header.tag)
            .collect();
        let expected: Vec<i32> = (0..BATCH).flat_map(|i| [10 + i, 300 + i]).collect();
        assert_eq!(sequenced, expected, "lanes {lanes}");
        assert!(
            net.sinks.iter().all(|s| s.failures.is_empty()),
            "{}",
            net.summary()
        );
        net.run_for(10);
        assert_eq!(
            net.sinks[0].completions.len(),
            1 + BATCH as usize,
            "completed once"
        );
        assert!(!net.t(0).has_pending_sends() && !net.t(1).has_pending_sends());
    }
}

#[test]
fn a_packet_other_than_data_on_a_data_lane_fails_the_peer() {
    // An impostor for rank 1 opens a data lane to rank 0 and sends an
    // eager packet on it.
    let mut net = Net::new(3);
    net.drop_rank(1);
    let mut raw = impostor(&mut net, 0, 1, Channel::Data);
    raw.write(&eager(1, 3).encode());
    raw.write(b"bad");
    net.run_until("rank 0 fails rank 1", |n| n.sinks[0].failure(1).is_some());
    let error = net.sinks[0].failure(1).unwrap();
    assert_eq!(error.class(), ErrorClass::ProcFailed, "{error}");
    assert!(error.message().contains("data lane"), "{error}");
    assert!(net.sinks[0].tags_from(1).is_empty());
    net.run_until("rank 0 closes the lane", |_| {
        raw.pump();
        raw.closed
    });
    // Rank 2 is not affected.
    net.send(0, 2, &eager(5, 0), &[]);
    net.run_until("rank 2 hears from rank 0", |n| {
        n.sinks[2].tags_from(0) == [5]
    });
}

// ---------------------------------------------------------------------------
// b) Simultaneous connect.

#[test]
fn simultaneous_connect_delivers_every_packet_once_in_order() {
    // Several rounds that give one rank or the other a head start of a few
    // polls, so that the handshakes interleave differently: the lower
    // rank's connection must win every time, the other be dropped, and
    // the packets queued meanwhile leave once, in order, on the winner.
    for round in 0..12 {
        let payload = pattern(round as u8, 300);
        let mut net = Net::new(2);
        let first = round % 2;
        net.reverse = first == 1;
        // Both connect before either has polled.
        for tag in 1..=3 {
            net.send(0, 1, &eager(tag, payload.len()), &payload);
            net.send(1, 0, &eager(100 + tag, payload.len()), &payload);
        }
        for _ in 0..round / 2 {
            net.poll_rank(first);
        }
        net.run_until("the first packets arrived both ways", |n| {
            !n.sinks[0].tags_from(1).is_empty() && !n.sinks[1].tags_from(0).is_empty()
        });
        for tag in 4..=40 {
            net.send(0, 1, &eager(tag, payload.len()), &payload);
            net.send(1, 0, &eager(100 + tag, payload.len()), &payload);
        }
        net.run_until("40 packets arrived both ways", |n| {
            n.sinks[0].tags_from(1).len() >= 40 && n.sinks[1].tags_from(0).len() >= 40
        });
        net.run_for(20);
        let expected: Vec<i32> = (1..=40).collect();
        let expected_back: Vec<i32> = (101..=140).collect();
        assert_eq!(net.sinks[1].tags_from(0), expected, "round {round}, 0 -> 1");
        assert_eq!(
            net.sinks[0].tags_from(1),
            expected_back,
            "round {round}, 1 -> 0"
        );
        for sink in &net.sinks {
            assert_eq!(sink.arrivals.len(), 40, "round {round}: a partial packet");
            assert!(sink.arrivals.iter().all(|a| a.payload == payload));
            assert!(sink.failures.is_empty(), "round {round}: {}", net.summary());
        }
    }
}

// ---------------------------------------------------------------------------
// c) A peer that breaks the protocol.

#[test]
fn refused_header_fails_the_peer_once_and_later_sends() {
    let payload = pattern(7, 100);
    let mut net = Net::new(2);
    net.sinks[0].refuse_tag = Some(2);
    for tag in 1..=3 {
        net.send(1, 0, &eager(tag, payload.len()), &payload);
    }
    net.run_until("rank 0 reports rank 1 failed", |n| {
        n.sinks[0].failure(1).is_some()
    });
    let a = &net.sinks[0];
    assert_eq!(
        a.tags_from(1),
        [1],
        "only the packet before the refused one"
    );
    assert_eq!(a.refused.len(), 1);
    let error = a.failure(1).unwrap();
    assert_eq!(error.class(), ErrorClass::ProcFailed, "{error}");
    assert!(
        error.message().contains("test sink refuses tag 2"),
        "the sink's reason is kept: {error}"
    );

    // Rank 0 closed the connection: rank 1 sees it lost too, and neither
    // side reports anything twice (the sink checks) or panics.
    net.run_until("rank 1 reports rank 0 failed", |n| {
        n.sinks[1].failure(0).is_some()
    });
    net.run_for(20);
    assert_eq!(net.sinks[0].tags_from(1), [1], "nothing after the failure");

    let big = vec![1u8; 1 << 20];
    assert_proc_failed(
        net.t(0).send(1, &eager(4, payload.len()), &payload),
        "send from 0 to failed 1",
    );
    assert_proc_failed(
        // SAFETY: refused at once (the peer has failed), so the memory is
        // never used.
        unsafe {
            net.t(0)
                .send_zcopy(1, &data(5, big.len()), big.as_ptr(), big.len(), 5)
        },
        "zcopy from 0 to failed 1",
    );
    assert_proc_failed(
        net.t(1).send(0, &eager(6, 0), &[]),
        "send from 1 to failed 0",
    );
    assert!(!net.t(0).has_pending_sends() && !net.t(1).has_pending_sends());
}

#[test]
fn malformed_header_from_an_authenticated_peer_fails_only_that_peer() {
    /// Breaks one field of an encoded header.
    type Corrupt = fn(&mut [u8; HEADER_LEN]);
    // What is broken, how, and a word the error must say.
    let corruptions: [(&str, Corrupt, &str); 5] = [
        ("bad magic", |h| h[0] ^= 0xff, "magic"),
        ("other version", |h| h[2] += 1, "version"),
        ("unknown kind", |h| h[3] = 11, "kind"),
        ("unknown flag set", |h| h[22] = 1, "flags"),
        (
            "address without the remote flag",
            |h| h[32] += 1,
            "names the buffer",
        ),
    ];
    for (what, corrupt, says) in corruptions {
        // Rank 1 never runs: an impostor that knows the secret takes its
        // place. Ranks 0 and 2 are real.
        let mut net = Net::new(3);
        net.drop_rank(1);
        let mut raw = impostor(&mut net, 0, 1, Channel::Packets);
        let good = eager(1, 10);
        raw.write(&good.encode());
        raw.write(&pattern(9, 10));
        let mut bad = eager(2, 10).encode();
        corrupt(&mut bad);
        raw.write(&bad);
        raw.write(&pattern(9, 10));

        net.run_until(
            &format!("rank 0 fails rank 1 after a header with {what}"),
            |n| n.sinks[0].failure(1).is_some(),
        );
        // The connection is still open on the impostor's side: the failure
        // is the header's, not an end of stream.
        let error = net.sinks[0].failure(1).unwrap().clone();
        assert_eq!(error.class(), ErrorClass::ProcFailed, "{what}: {error}");
        assert!(error.message().contains(says), "{what}: {error}");
        assert_eq!(net.sinks[0].tags_from(1), [1], "{what}");
        net.run_until("rank 0 closes the impostor's connection", |_| {
            raw.pump();
            raw.closed
        });
        assert_proc_failed(net.t(0).send(1, &eager(3, 0), &[]), what);

        // Ranks 0 and 2 are not affected.
        let payload = pattern(3, 5000);
        net.send(0, 2, &eager(20, payload.len()), &payload);
        net.send(2, 0, &eager(21, payload.len()), &payload);
        net.run_until("ranks 0 and 2 exchange a packet", |n| {
            n.sinks[2].tags_from(0) == [20] && n.sinks[0].tags_from(2) == [21]
        });
        assert_eq!(net.sinks[0].failures.len(), 1, "{what}: {}", net.summary());
        assert!(
            net.sinks[2].failures.is_empty(),
            "{what}: {}",
            net.summary()
        );
    }
}

// ---------------------------------------------------------------------------
// d) A peer lost in the middle of a transfer.

#[test]
fn peer_dropped_while_a_large_send_to_it_is_queued() {
    // Far more than the loopback socket buffers hold while rank 1 does not
    // read.
    const BIG: usize = 64 << 20;
    let big = vec![0x77u8; BIG];
    let mut net = Net::new(2);
    net.send(0, 1, &eager(1, 0), &[]);
    net.run_until("the connection is up", |n| n.sinks[1].tags_from(0) == [1]);

    // SAFETY: `big` lives until the end of the test.
    unsafe { net.send_zcopy(0, 1, &data(2, BIG), &big, 42) };
    net.send(0, 1, &eager(3, 0), &[]);
    // Only rank 0 runs: it writes what the socket takes, then waits.
    for _ in 0..50 {
        net.poll_rank(0);
    }
    assert!(
        net.t(0).has_pending_sends(),
        "the whole {BIG} bytes left without the receiver reading"
    );
    net.drop_rank(1);
    net.run_until("rank 0 reports rank 1 failed", |n| {
        n.sinks[0].failure(1).is_some()
    });
    let error = net.sinks[0].failure(1).unwrap();
    assert_eq!(error.class(), ErrorClass::ProcFailed, "{error}");
    net.run_for(10);
    assert!(
        net.sinks[0].completions.is_empty(),
        "a zcopy send to a lost peer must fail, not complete"
    );
    assert!(
        !net.t(0).has_pending_sends(),
        "the queue to rank 1 was dropped"
    );
    assert_proc_failed(net.t(0).send(1, &eager(4, 0), &[]), "send after loss");
}

#[test]
fn peer_dropped_while_data_is_queued_on_a_lane_to_it() {
    const BIG: usize = 64 << 20;
    let first = vec![0x21u8; 1 << 20];
    let big = vec![0x77u8; BIG];
    let mut net = Net::new(2);
    net.send(0, 1, &eager(1, 0), &[]);
    net.run_until("the connection is up", |n| n.sinks[1].tags_from(0) == [1]);
    // SAFETY: `first` and `big` live until the end of the test.
    unsafe { net.send_zcopy(0, 1, &data(2, first.len()), &first, 1) };
    net.run_until("the lane is open", |n| {
        n.sinks[1].tags_from(0) == [1, 2] && n.ranks[0].as_ref().unwrap().open_data_lanes(1) == 1
    });
    for tag in 3..7 {
        // SAFETY: as above.
        unsafe { net.send_zcopy(0, 1, &data(tag, BIG), &big, tag as u64) };
    }
    for _ in 0..50 {
        net.poll_rank(0);
    }
    assert!(net.t(0).has_pending_sends());
    net.drop_rank(1);
    net.run_until("rank 0 reports rank 1 failed", |n| {
        n.sinks[0].failure(1).is_some()
    });
    net.run_for(10);
    assert_eq!(
        net.sinks[0].completions,
        [1],
        "a data send to a lost peer must fail, not complete"
    );
    assert!(
        !net.t(0).has_pending_sends(),
        "the lane's queue was dropped"
    );
    assert_proc_failed(net.t(0).send(1, &eager(9, 0), &[]), "send after loss");
}

#[test]
fn peer_dropped_while_sending_a_large_payload_to_us() {
    const BIG: usize = 64 << 20;
    let big = vec![0x33u8; BIG];
    let mut net = Net::new(2);
    net.send(1, 0, &eager(1, 0), &[]);
    net.run_until("the connection is up", |n| n.sinks[0].tags_from(1) == [1]);

    // SAFETY: `big` lives until the end of the test.
    unsafe { net.send_zcopy(1, 0, &data(2, BIG), &big, 7) };
    net.run_until("rank 0 is reading the large payload", |n| {
        n.sinks[0].arrivals.len() == 2
    });
    assert!(
        !net.sinks[0].arrivals[1].placed,
        "the whole {BIG} bytes arrived at once"
    );
    net.drop_rank(1);
    net.run_until("rank 0 reports rank 1 failed", |n| {
        n.sinks[0].failure(1).is_some()
    });
    let a = &net.sinks[0];
    let error = a.failure(1).unwrap();
    assert_eq!(error.class(), ErrorClass::ProcFailed, "{error}");
    assert!(
        !a.arrivals[1].placed,
        "a truncated payload was reported placed"
    );
    net.run_for(10);
    assert!(!net.sinks[0].arrivals[1].placed);
    assert_proc_failed(net.t(0).send(1, &eager(3, 0), &[]), "send after loss");
}

#[test]
fn peer_gone_before_the_first_connect_is_reported_failed() {
    let big = vec![0x11u8; 1 << 20];
    let mut net = Net::new(2);
    net.drop_rank(1);
    // Accepted: the connection is opened lazily and fails later.
    net.send(0, 1, &eager(1, 0), &[]);
    // SAFETY: `big` lives until the end of the test.
    unsafe { net.send_zcopy(0, 1, &data(2, big.len()), &big, 3) };
    net.run_until("rank 0 reports rank 1 failed", |n| {
        n.sinks[0].failure(1).is_some()
    });
    let error = net.sinks[0].failure(1).unwrap();
    assert_eq!(error.class(), ErrorClass::ProcFailed, "{error}");
    assert!(net.sinks[0].completions.is_empty());
    assert!(!net.t(0).has_pending_sends());
    assert_proc_failed(net.t(0).send(1, &eager(3, 0), &[]), "send after loss");
}

#[test]
fn a_send_refused_at_once_leaves_nothing_queued() {
    // A rank whose transport was never given rank 1's card: the send fails
    // at once, and must not leave the packet (or, for zero-copy, a pointer
    // to memory the caller takes back) in the queue.
    let mut t = TcpTransport::new(&job(0, 2), config()).expect("transport");
    assert!(t.send(1, &eager(1, 4), b"lost").is_err());
    let big = vec![0u8; 1 << 20];
    // SAFETY: `big` outlives `t`.
    let zcopy = unsafe { t.send_zcopy(1, &data(2, big.len()), big.as_ptr(), big.len(), 9) };
    assert!(zcopy.is_err());
    assert!(
        !t.has_pending_sends(),
        "a refused send stayed queued: finalize would wait for it forever"
    );
    let mut sink = Recorder::default();
    for _ in 0..10 {
        t.poll(&mut sink).expect("poll");
    }
    assert!(sink.completions.is_empty() && sink.failures.is_empty());
}

#[test]
fn a_lost_peer_fails_only_what_needs_it() {
    let payload = pattern(5, 2000);
    let big = pattern(6, 3 << 20);
    let mut net = Net::new(3);
    // Everyone talks to everyone first.
    for from in 0..3 {
        for to in (0..3).filter(|&to| to != from) {
            net.send(from, to, &eager(from as i32, payload.len()), &payload);
        }
    }
    net.run_until("every pair exchanged a packet", |n| {
        (0..3).all(|r| n.sinks[r].arrivals.iter().filter(|a| a.placed).count() == 2)
    });

    net.drop_rank(1);
    net.run_until("ranks 0 and 2 report rank 1 failed", |n| {
        n.sinks[0].failure(1).is_some() && n.sinks[2].failure(1).is_some()
    });
    for r in [0, 2] {
        let error = net.sinks[r].failure(1).unwrap();
        assert_eq!(error.class(), ErrorClass::ProcFailed, "rank {r}: {error}");
        assert_proc_failed(
            net.t(r).send(1, &eager(9, 0), &[]),
            &format!("send from {r} to lost 1"),
        );
    }

    // 0 and 2 go on, eager and zero-copy, both ways.
    for tag in 10..20 {
        net.send(0, 2, &eager(tag, payload.len()), &payload);
        net.send(2, 0, &eager(tag, payload.len()), &payload);
    }
    // SAFETY: `big` lives until the end of the test.
    unsafe {
        net.send_zcopy(0, 2, &data(20, big.len()), &big, 1);
        net.send_zcopy(2, 0, &data(20, big.len()), &big, 2);
    }
    net.run_until("ranks 0 and 2 exchanged everything", |n| {
        n.sinks[0].completions == [1]
            && n.sinks[2].completions == [2]
            && n.sinks[0].tags_from(2).len() == 12
            && n.sinks[2].tags_from(0).len() == 12
    });
    let expected: Vec<i32> = std::iter::once(2).chain(10..=20).collect();
    assert_eq!(net.sinks[0].tags_from(2), expected);
    let expected: Vec<i32> = std::iter::once(0).chain(10..=20).collect();
    assert_eq!(net.sinks[2].tags_from(0), expected);
    assert!(net.sinks[0].packet(2, 20).payload == big);
    assert!(net.sinks[2].packet(0, 20).payload == big);
    for r in [0, 2] {
        assert_eq!(net.sinks[r].failures.len(), 1, "{}", net.summary());
    }
}

// ---------------------------------------------------------------------------
// e) Strangers.

#[test]
fn strangers_are_refused_and_the_job_goes_on() {
    let payload = pattern(4, 700);
    let mut net = Net::new(2);
    let mut sent = 0;
    let mut exchange = |net: &mut Net, what: &str| {
        for _ in 0..5 {
            sent += 1;
            net.send(0, 1, &eager(sent, payload.len()), &payload);
            net.send(1, 0, &eager(sent, payload.len()), &payload);
        }
        let n = sent as usize;
        net.run_until(what, |net| {
            net.sinks[0].tags_from(1).len() == n && net.sinks[1].tags_from(0).len() == n
        });
    };
    exchange(&mut net, "the first packets arrived");

    // Garbage instead of a HELLO.
    let mut garbage = RawPeer::connect(&net.card(0));
    garbage.write(&[0xEE; 2 * MESSAGE_LEN]);
    // A HELLO claiming rank 1 (a real member), then a RESPONSE it cannot
    // compute without the secret.
    let mut forger = RawPeer::connect(&net.card(0));
    let wrong = JobInfo {
        secret: [0x11; 32],
        ..job(1, 2)
    };
    let (_, hello) = Connector::new(&wrong, 0, Channel::Packets).expect("hello");
    forger.write(&hello);
    forger.write(&[0u8; MESSAGE_LEN]);
    // One that connects and says nothing.
    let mut silent = RawPeer::connect(&net.card(0));

    exchange(&mut net, "packets arrived beside the strangers");
    net.run_until("rank 0 closes the garbage and forged connections", |_| {
        garbage.pump();
        forger.pump();
        garbage.closed && forger.closed
    });
    assert!(
        forger.inbox.len() <= MESSAGE_LEN,
        "the forger got more than a challenge: {} bytes",
        forger.inbox.len()
    );
    exchange(&mut net, "packets arrived after the strangers were refused");
    silent.pump();
    assert!(silent.inbox.is_empty(), "rank 0 said something unasked");

    let expected: Vec<i32> = (1..=15).collect();
    assert_eq!(net.sinks[0].tags_from(1), expected);
    assert_eq!(net.sinks[1].tags_from(0), expected);
    assert!(net
        .sinks
        .iter()
        .all(|s| s.arrivals.iter().all(|a| a.payload == payload)));
    assert!(
        net.sinks.iter().all(|s| s.failures.is_empty()),
        "{}",
        net.summary()
    );
}
