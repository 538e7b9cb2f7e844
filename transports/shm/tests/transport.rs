//! Transport-level tests of `oxmpi-shm`: two to four [`ShmTransport`]s in
//! one process, driven by calling `poll` on each in turn with a
//! [`Recorder`] sink that keeps every header, payload, completion and
//! failure. No ADI and no launcher are involved: what is checked is the
//! transport's side of the contract in `oxmpi_adi::transport`:
//!
//! - packets arrive intact in both directions, from empty to many times
//!   the size of a queue, and a zero-copy send completes once;
//! - a full queue holds packets back without losing or reordering them,
//!   also when every rank starts talking to every other at once;
//! - a peer whose header the sink refuses, or that disappears in the middle
//!   of a transfer in either direction, or before it was ever reached, is
//!   reported failed once; the sends queued to it are dropped without a
//!   completion, later sends fail with `ProcFailed`, and the others go on;
//! - a sleeping rank's descriptor becomes readable when a peer sends to it,
//!   and a sender blocked on a full queue is woken when room is made;
//! - strangers at the listener (garbage, silence, a wrong secret, a
//!   descriptor before any handshake) and a job member handing over a bad
//!   segment are refused, and the job's traffic goes on;
//! - cards say which peers share the host and network namespace.
//!
//! Every wait has a deadline ([`DEADLINE`]) and fails saying what it waited
//! for and what each rank had seen.

use oxmpi_adi::auth::{Channel, Connector, MESSAGE_LEN};
use oxmpi_adi::proto::{Header, Kind};
use oxmpi_adi::transport::{JobInfo, PacketSink, PayloadSlot, PeerRank, Transport};
use oxmpi_adi::{Error, ErrorClass, Result};
use oxmpi_shm::{ShmConfig, ShmTransport, QUEUE_SIZE_MIN};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixStream};
use std::time::{Duration, Instant};

/// Longest any single wait may take before the test fails.
const DEADLINE: Duration = Duration::from_secs(20);
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
/// a payload is placed once, a send completes once, a peer fails once, and
/// nothing arrives from a peer after it was reported failed.
#[derive(Default)]
struct Recorder {
    /// Accepted headers in arrival order; the index is the payload slot.
    arrivals: Vec<Arrival>,
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
    ranks: Vec<Option<ShmTransport>>,
    sinks: Vec<Recorder>,
}

impl Net {
    /// `size` transports with queues of `queue_size` bytes that know each
    /// other's cards.
    fn with_queues(size: usize, queue_size: usize) -> Net {
        let mut ranks: Vec<ShmTransport> = (0..size)
            .map(|rank| {
                let config = ShmConfig {
                    eager_limit: EAGER,
                    always_eager_limit: EAGER,
                    queue_size,
                    cross_memory_attach: true,
                };
                ShmTransport::new(&job(rank, size), config)
                    .unwrap_or_else(|e| panic!("rank {rank}: no transport: {e}"))
            })
            .collect();
        let cards: Vec<String> = ranks.iter().map(|t| t.card().to_owned()).collect();
        for (rank, t) in ranks.iter_mut().enumerate() {
            assert_eq!(t.eager_limit(), EAGER);
            assert_eq!(t.name(), "shm");
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
        }
    }

    /// `size` transports with queues of the default size.
    fn new(size: usize) -> Net {
        Net::with_queues(size, 256 * 1024)
    }

    fn t(&mut self, rank: PeerRank) -> &mut ShmTransport {
        self.ranks[rank]
            .as_mut()
            .unwrap_or_else(|| panic!("rank {rank} was dropped"))
    }

    /// The name of `rank`'s listener in the abstract namespace, from its
    /// card (`VERSION:BOOT_ID:NETNS:NAME`).
    fn listener(&mut self, rank: PeerRank) -> String {
        let card = self.t(rank).card().to_owned();
        card.rsplit(':').next().unwrap().to_owned()
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

    /// Drops rank `rank`'s transport, closing its listener, connections
    /// and mappings, as its process ending would.
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
        loop {
            for &rank in ranks {
                if done(self) {
                    return;
                }
                self.poll_rank(rank);
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
                "  rank {rank}{state}: {} arrivals (last: {arrivals:?}), completions {:?}, \
                 failures {failures:?}\n",
                sink.arrivals.len(),
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

/// Whether `fd` is readable now.
fn readable(fd: std::os::fd::RawFd) -> bool {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: `pfd` is a valid pollfd for the call.
    let rc = unsafe { libc::poll(&mut pfd, 1, 0) };
    assert!(rc >= 0, "poll: {}", std::io::Error::last_os_error());
    rc == 1
}

/// Waits up to [`DEADLINE`] for `fd` to become readable, polling no
/// transport: only a wake-up from another rank can make it so.
fn wait_readable(fd: std::os::fd::RawFd, what: &str) {
    let deadline = Instant::now() + DEADLINE;
    while !readable(fd) {
        assert!(Instant::now() < deadline, "{what}: never woke");
        std::thread::sleep(Duration::from_millis(1));
    }
}

// ---------------------------------------------------------------------------
// Packets.

#[test]
fn eager_and_zero_copy_payloads_arrive_intact_both_ways() {
    let mut net = Net::new(2);
    // Sizes around the cells (56 bytes in a header's cell, 64 per cell),
    // the eager limit, and zero-copy payloads many queues long.
    let eager_sizes = [
        0usize,
        1,
        8,
        55,
        56,
        57,
        64,
        120,
        121,
        1000,
        16 * 1024,
        EAGER,
    ];
    let big = [1usize << 20, (3 << 20) + 17];
    let payloads: Vec<Vec<u8>> = eager_sizes
        .iter()
        .chain(&big)
        .enumerate()
        .map(|(k, &len)| pattern(k as u8, len))
        .collect();
    for (from, to) in [(0, 1), (1, 0)] {
        for (k, &len) in eager_sizes.iter().enumerate() {
            net.send(from, to, &eager(k as i32, len), &payloads[k]);
        }
        for (j, &len) in big.iter().enumerate() {
            let k = eager_sizes.len() + j;
            // SAFETY: `payloads` outlives the run that completes the send.
            unsafe { net.send_zcopy(from, to, &data(k as i32, len), &payloads[k], 100 + k as u64) };
        }
    }
    let n = payloads.len();
    net.run_until("every packet arrived and every send completed", |net| {
        net.sinks.iter().all(|s| {
            s.arrivals.iter().filter(|a| a.placed).count() == n && s.completions.len() == big.len()
        })
    });
    for (rank, peer) in [(1, 0), (0, 1)] {
        let sink = &net.sinks[rank];
        assert_eq!(sink.tags_from(peer), (0..n as i32).collect::<Vec<_>>());
        for (k, payload) in payloads.iter().enumerate() {
            assert!(
                sink.packet(peer, k as i32).payload == *payload,
                "packet {k} ({} bytes) from rank {peer} differs",
                payload.len()
            );
        }
        assert_eq!(net.sinks[peer].completions, vec![112, 113]);
        assert!(sink.failures.is_empty(), "{}", net.summary());
    }
    net.run_for(100);
    for rank in 0..2 {
        assert!(!net.t(rank).has_pending_sends());
    }
}

#[test]
fn a_full_queue_holds_packets_back_in_order() {
    // The smallest queue: most packets wait, some span the ring's end.
    let mut net = Net::with_queues(2, QUEUE_SIZE_MIN);
    let sizes: Vec<usize> = (0..600).map(|k| (k * 97) % 5000).collect();
    for (k, &len) in sizes.iter().enumerate() {
        net.send(0, 1, &eager(k as i32, len), &pattern(k as u8, len));
    }
    let payload = pattern(9, 1 << 20);
    // SAFETY: `payload` outlives the run that completes the send.
    unsafe { net.send_zcopy(0, 1, &data(600, payload.len()), &payload, 7) };
    assert!(net.t(0).has_pending_sends());
    net.run_until("every packet arrived", |net| {
        net.sinks[1].arrivals.iter().filter(|a| a.placed).count() == 601
            && net.sinks[0].completions == [7]
    });
    assert_eq!(net.sinks[1].tags_from(0), (0..601).collect::<Vec<_>>());
    for (k, &len) in sizes.iter().enumerate() {
        assert!(net.sinks[1].packet(0, k as i32).payload == pattern(k as u8, len));
    }
    assert!(net.sinks[1].packet(0, 600).payload == payload);
}

#[test]
fn every_rank_talks_to_every_other_at_once() {
    let size = 4;
    let mut net = Net::with_queues(size, QUEUE_SIZE_MIN);
    // Everyone sends before anyone polls: every queue is set up from both
    // ends at once, and the first packets wait for it.
    for round in 0..50 {
        for from in 0..size {
            for to in (0..size).filter(|&to| to != from) {
                let len = (round * 131 + from * 7) % 3000;
                net.send(
                    from,
                    to,
                    &eager(round as i32, len),
                    &pattern(from as u8, len),
                );
            }
        }
    }
    net.run_until("every packet arrived", |net| {
        net.sinks
            .iter()
            .all(|s| s.arrivals.iter().filter(|a| a.placed).count() == 50 * (size - 1))
    });
    for to in 0..size {
        for from in (0..size).filter(|&from| from != to) {
            assert_eq!(
                net.sinks[to].tags_from(from),
                (0..50).collect::<Vec<_>>(),
                "rank {from} -> {to}"
            );
        }
    }
}

// ---------------------------------------------------------------------------
// Failures.

#[test]
fn single_copies_move_bytes_and_a_bad_address_fails_the_peer() {
    let mut net = Net::new(3);
    assert!(
        !net.t(0).offers_remote_copy(1),
        "before any queue is set up"
    );
    net.send(0, 1, &eager(1, 8), &[1; 8]);
    net.send(1, 0, &eager(2, 8), &[2; 8]);
    net.run_until("both queues are set up", |net| {
        !net.sinks[0].tags_from(1).is_empty() && !net.sinks[1].tags_from(0).is_empty()
    });
    assert!(net.t(0).offers_remote_copy(1) && net.t(1).offers_remote_copy(0));
    // The ranks share this process, so the peer's memory is ours.
    let source = pattern(7, 3 * 4096 + 11);
    let mut read = vec![0u8; source.len()];
    // SAFETY: `read` is writable for its length and used by nothing else.
    let done = unsafe {
        net.t(0)
            .remote_read(1, source.as_ptr() as u64, read.as_mut_ptr(), read.len())
    };
    assert!(done.unwrap() && read == source);
    let mut written = vec![0u8; source.len()];
    // SAFETY: `source` is readable for its length.
    let done = unsafe {
        net.t(1).remote_write(
            0,
            source.as_ptr(),
            written.as_mut_ptr() as u64,
            source.len(),
        )
    };
    assert!(done.unwrap() && written == source);
    // An address no process maps: the peer named memory it does not have.
    // SAFETY: as above.
    let bad = unsafe { net.t(0).remote_read(1, 8, read.as_mut_ptr(), 64) };
    let e = bad.expect_err("a read at address 8 succeeded");
    assert_eq!(e.class(), ErrorClass::ProcFailed, "{e}");
    assert!(
        e.message().contains("memory its process does not have"),
        "{e}"
    );
    assert!(!net.t(0).offers_remote_copy(1));
    assert_proc_failed(
        net.t(0).send(1, &eager(3, 1), &[3]),
        "send after a bad address",
    );
    net.run_until("rank 0 reported rank 1 failed", |net| {
        net.sinks[0].failure(1).is_some()
    });
}

#[test]
fn refused_header_fails_the_peer_once_and_later_sends() {
    let mut net = Net::new(3);
    net.sinks[1].refuse_tag = Some(66);
    net.send(0, 1, &eager(1, 10), &[1; 10]);
    net.send(0, 1, &eager(66, 10), &[2; 10]);
    net.send(0, 1, &eager(3, 10), &[3; 10]);
    net.run_until("rank 1 gave up on rank 0", |net| {
        net.sinks[1].failure(0).is_some()
    });
    let e = net.sinks[1].failure(0).unwrap();
    assert_eq!(e.class(), ErrorClass::ProcFailed);
    assert!(e.message().contains("test sink refuses tag 66"), "{e}");
    assert_eq!(net.sinks[1].tags_from(0), vec![1]);
    net.run_until("rank 0 saw rank 1 give up", |net| {
        net.sinks[0].failure(1).is_some()
    });
    assert_proc_failed(net.t(0).send(1, &eager(4, 1), &[4]), "send after failure");
    assert_proc_failed(net.t(1).send(0, &eager(4, 1), &[4]), "send after failure");
    // Rank 2 is not concerned.
    net.send(0, 2, &eager(5, 100), &[5; 100]);
    net.send(1, 2, &eager(6, 100), &[6; 100]);
    net.run_until("rank 2 got both", |net| {
        net.sinks[2].tags_from(0) == [5] && net.sinks[2].tags_from(1) == [6]
    });
}

#[test]
fn peer_dropped_while_a_large_send_to_it_is_queued() {
    let mut net = Net::with_queues(3, QUEUE_SIZE_MIN);
    let payload = pattern(3, 4 << 20);
    // SAFETY: `payload` outlives the transport that reads it.
    unsafe { net.send_zcopy(0, 1, &data(1, payload.len()), &payload, 9) };
    net.run_until("rank 1 received some of it", |net| {
        net.sinks[1].arrivals.len() == 1
    });
    net.drop_rank(1);
    net.run_until("rank 0 noticed", |net| net.sinks[0].failure(1).is_some());
    assert!(net.sinks[0].completions.is_empty(), "{}", net.summary());
    assert!(!net.t(0).has_pending_sends());
    assert_proc_failed(
        net.t(0).send(1, &eager(2, 1), &[1]),
        "send to the lost peer",
    );
    net.send(0, 2, &eager(3, 5), &[3; 5]);
    net.run_until("rank 2 still hears from rank 0", |net| {
        net.sinks[2].tags_from(0) == [3]
    });
}

#[test]
fn peer_dropped_while_sending_a_large_payload_to_us() {
    let mut net = Net::with_queues(2, QUEUE_SIZE_MIN);
    let payload = pattern(4, 4 << 20);
    // SAFETY: `payload` outlives rank 0's transport, dropped below.
    unsafe { net.send_zcopy(0, 1, &data(1, payload.len()), &payload, 9) };
    net.run_until("rank 1 has part of the payload", |net| {
        net.sinks[1].arrivals.len() == 1
    });
    net.drop_rank(0);
    net.run_until("rank 1 noticed", |net| net.sinks[1].failure(0).is_some());
    assert!(!net.sinks[1].arrivals[0].placed);
    let e = net.sinks[1].failure(0).unwrap();
    assert_eq!(e.class(), ErrorClass::ProcFailed);
    assert!(e.message().contains("rank 0"), "{e}");
}

#[test]
fn what_a_peer_sent_before_it_ended_is_delivered_first() {
    let mut net = Net::new(2);
    net.send(0, 1, &eager(1, 8), &[1; 8]);
    net.run_until("the queue is set up", |net| {
        net.sinks[1].tags_from(0) == [1]
    });
    net.send(0, 1, &eager(2, 5000), &[2; 5000]);
    net.drop_rank(0);
    net.run_until("rank 1 noticed", |net| net.sinks[1].failure(0).is_some());
    assert_eq!(net.sinks[1].tags_from(0), vec![1, 2], "{}", net.summary());
}

#[test]
fn peer_gone_before_the_first_send_is_reported_failed() {
    let mut net = Net::new(3);
    net.drop_rank(2);
    match net.t(0).send(2, &eager(1, 1), &[1]) {
        Err(e) => assert_eq!(e.class(), ErrorClass::ProcFailed, "{e}"),
        Ok(()) => net.run_until("rank 0 noticed", |net| net.sinks[0].failure(2).is_some()),
    }
    net.run_for(10);
    assert!(!net.t(0).has_pending_sends());
    net.send(0, 1, &eager(2, 1), &[2]);
    net.run_until("rank 1 still hears from rank 0", |net| {
        net.sinks[1].tags_from(0) == [2]
    });
}

// ---------------------------------------------------------------------------
// Sleeping and waking.

#[test]
fn a_sleeping_rank_wakes_when_a_peer_sends() {
    let mut net = Net::new(2);
    net.send(0, 1, &eager(1, 8), &[1; 8]);
    net.run_until("the queue is set up", |net| {
        net.sinks[1].tags_from(0) == [1]
    });
    net.run_for(300);
    let fd = net
        .t(1)
        .arm_wakeup()
        .unwrap()
        .expect("a descriptor to sleep on");
    assert!(!readable(fd), "woke with nothing to do");
    net.send(0, 1, &eager(2, 8), &[2; 8]);
    wait_readable(fd, "rank 1 asleep while rank 0 sent");
    net.t(1).disarm_wakeup().unwrap();
    net.run_until("the packet is delivered", |net| {
        net.sinks[1].tags_from(0) == [1, 2]
    });
    net.run_for(300);
    assert!(!readable(fd), "still readable after the wake-up was read");
    // A packet that came before the rank armed is not slept through.
    net.send(0, 1, &eager(3, 8), &[3; 8]);
    let fd = net.t(1).arm_wakeup().unwrap().unwrap();
    assert!(readable(fd), "slept through a packet already there");
    net.t(1).disarm_wakeup().unwrap();
}

#[test]
fn a_sender_blocked_on_a_full_queue_wakes_when_room_is_made() {
    let mut net = Net::with_queues(2, QUEUE_SIZE_MIN);
    net.send(0, 1, &eager(0, 8), &[0; 8]);
    net.run_until("the queue is set up", |net| {
        net.sinks[1].tags_from(0) == [0]
    });
    net.run_for(300);
    let payload = pattern(5, 1 << 20);
    // SAFETY: `payload` outlives the run that completes the send.
    unsafe { net.send_zcopy(0, 1, &data(1, payload.len()), &payload, 3) };
    assert!(net.t(0).has_pending_sends(), "1 MiB fit a 4 KiB queue");
    let fd = net.t(0).arm_wakeup().unwrap().unwrap();
    assert!(!readable(fd), "woke with the queue still full");
    net.poll_rank(1);
    wait_readable(fd, "rank 0 asleep on a full queue while rank 1 read it");
    net.t(0).disarm_wakeup().unwrap();
    net.run_until("the payload arrived", |net| {
        net.sinks[0].completions == [3] && net.sinks[1].tags_from(0) == [0, 1]
    });
    assert!(net.sinks[1].packet(0, 1).payload == payload);
}

// ---------------------------------------------------------------------------
// Strangers and cards.

/// A connection to a rank's listener, as a stranger opens it.
fn raw_connect(name: &str) -> UnixStream {
    let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let s = UnixStream::connect_addr(&addr).unwrap_or_else(|e| panic!("connect @{name}: {e}"));
    s.set_read_timeout(Some(Duration::from_millis(10))).unwrap();
    s
}

/// Writes `bytes` with the descriptor `fd` attached (`SCM_RIGHTS`).
fn send_with_fd(stream: &UnixStream, bytes: &[u8], fd: std::os::fd::RawFd) {
    #[repr(C, align(8))]
    struct Control([u8; 64]);
    let mut control = Control([0; 64]);
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    // SAFETY: an all-zero msghdr is a valid value; the control buffer is
    // aligned and large enough for one descriptor, and every pointer in
    // `msg` outlives the sendmsg call.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.0.as_mut_ptr().cast();
        msg.msg_controllen = libc::CMSG_SPACE(4) as usize;
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(4) as usize;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<i32>(), fd);
        let n = libc::sendmsg(stream.as_raw_fd(), &msg, libc::MSG_NOSIGNAL);
        assert_eq!(n, bytes.len() as isize, "sendmsg");
    }
}

/// Whether the rank closed `stream` (end of stream or reset), after it had
/// time to look at it.
fn closed_by_rank(stream: &mut UnixStream) -> bool {
    let mut buf = [0u8; 256];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return false,
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => return false,
            Err(_) => return true,
        }
    }
}

/// A memory file that claims to be a queue segment of another version.
fn segment_of_another_version() -> std::fs::File {
    use std::os::fd::FromRawFd;
    use std::os::unix::fs::FileExt;
    // SAFETY: a NUL-terminated name; the descriptor returned is new and
    // owned by no one else.
    let file = unsafe {
        let fd = libc::memfd_create(c"forged".as_ptr(), libc::MFD_ALLOW_SEALING);
        assert!(fd >= 0, "memfd_create");
        std::fs::File::from_raw_fd(fd)
    };
    file.set_len(512 + 64 * 64).unwrap();
    let mut header = b"OXMPISHM".to_vec();
    for field in [99u32, 512, 64, 64, 0, 1] {
        header.extend_from_slice(&field.to_le_bytes());
    }
    file.write_all_at(&header, 0).unwrap();
    // SAFETY: fcntl on a descriptor we own, with an integer argument.
    let rc = unsafe {
        libc::fcntl(
            file.as_raw_fd(),
            libc::F_ADD_SEALS,
            libc::F_SEAL_SHRINK | libc::F_SEAL_GROW,
        )
    };
    assert_eq!(rc, 0, "sealing");
    file
}

#[test]
fn strangers_are_refused_and_the_job_goes_on() {
    let mut net = Net::new(2);
    let name = net.listener(1);
    let mut strangers = Vec::new();
    // Silence.
    strangers.push(raw_connect(&name));
    // Garbage.
    let mut garbage = raw_connect(&name);
    garbage
        .write_all(&[b"GET / HTTP/1.0\r\n\r\n".as_slice(), &[b'x'; 100]].concat())
        .unwrap();
    strangers.push(garbage);
    // A descriptor before any handshake.
    let fd_first = raw_connect(&name);
    let file = segment_of_another_version();
    send_with_fd(&fd_first, &[0u8; MESSAGE_LEN], file.as_raw_fd());
    strangers.push(fd_first);
    // The wrong secret.
    let stranger_job = JobInfo {
        rank: 0,
        size: 2,
        secret: [0x11; 32],
    };
    let (connector, hello) = Connector::new(&stranger_job, 1, Channel::Packets).unwrap();
    let mut wrong = raw_connect(&name);
    wrong.write_all(&hello).unwrap();
    net.run_for(500);
    let mut challenge = [0u8; MESSAGE_LEN];
    wrong.read_exact(&mut challenge).unwrap();
    assert!(
        connector.on_challenge(&challenge).is_err(),
        "the rank knew a wrong secret"
    );
    let mut forged = challenge;
    forged[6] = 3;
    wrong.write_all(&forged).unwrap();
    strangers.push(wrong);
    net.run_for(500);
    for (k, s) in strangers.iter_mut().enumerate().skip(1) {
        assert!(closed_by_rank(s), "stranger {k} was not refused");
    }
    // The job's own traffic.
    net.send(0, 1, &eager(1, 100), &[1; 100]);
    net.send(1, 0, &eager(2, 100), &[2; 100]);
    net.run_until("the ranks talk", |net| {
        net.sinks[1].tags_from(0) == [1] && net.sinks[0].tags_from(1) == [2]
    });
    assert!(
        net.sinks.iter().all(|s| s.failures.is_empty()),
        "{}",
        net.summary()
    );
}

#[test]
fn a_member_handing_over_a_bad_segment_is_refused_clearly() {
    let mut net = Net::new(2);
    let name = net.listener(1);
    // Rank 0's secret, but a segment of another version.
    let (connector, hello) = Connector::new(&job(0, 2), 1, Channel::Packets).unwrap();
    let mut member = raw_connect(&name);
    member.write_all(&hello).unwrap();
    net.run_for(500);
    let mut challenge = [0u8; MESSAGE_LEN];
    member.read_exact(&mut challenge).unwrap();
    let response = connector.on_challenge(&challenge).unwrap();
    member.write_all(&response).unwrap();
    let mut setup = [0u8; 128];
    setup[0..4].copy_from_slice(b"OXSQ");
    setup[4..8].copy_from_slice(&oxmpi_shm::SHM_VERSION.to_le_bytes());
    let me = b"oxmpi-shm-1-0000000000000000";
    setup[8..10].copy_from_slice(&(me.len() as u16).to_le_bytes());
    setup[16..16 + me.len()].copy_from_slice(me);
    let file = segment_of_another_version();
    send_with_fd(&member, &setup, file.as_raw_fd());
    net.run_until("rank 1 refused rank 0", |net| {
        net.sinks[1].failure(0).is_some()
    });
    let e = net.sinks[1].failure(0).unwrap();
    assert_eq!(e.class(), ErrorClass::ProcFailed);
    assert!(
        e.message().contains("version 99") && e.message().contains("run the same oxmpi"),
        "{e}"
    );
    assert!(closed_by_rank(&mut member));
}

#[test]
fn cards_tell_who_shares_the_host_and_namespace() {
    let mut net = Net::new(2);
    let card = net.t(0).card().to_owned();
    let parts: Vec<&str> = card.split(':').collect();
    assert_eq!(parts.len(), 5, "{card}");
    assert_eq!(parts[0], oxmpi_shm::SHM_VERSION.to_string());
    let t = net.t(1);
    assert!(t.reachable(&card));
    let with = |version: &str, boot: &str, netns: &str, pidns: &str| {
        format!("{version}:{boot}:{netns}:{pidns}:{}", parts[4])
    };
    let other_netns = with(parts[0], parts[1], &format!("{}1", parts[2]), parts[3]);
    let other_pidns = with(parts[0], parts[1], parts[2], &format!("{}1", parts[3]));
    let other_boot = with(parts[0], &format!("{}0", parts[1]), parts[2], parts[3]);
    for card in [
        other_netns.as_str(),
        &other_pidns,
        &other_boot,
        "127.0.0.1:4000",
        "",
        "garbage",
    ] {
        assert!(!t.reachable(card), "{card:?} reachable");
    }
    assert!(t.add_peer(0, &other_netns).is_err());
    assert!(t.add_peer(0, &other_pidns).is_err());
    let newer = with("99", parts[1], parts[2], parts[3]);
    let e = t.add_peer(0, &newer).unwrap_err();
    assert!(e.message().contains("version 99"), "{e}");
}
