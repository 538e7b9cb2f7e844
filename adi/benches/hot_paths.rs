//! Micro-benchmarks of the ADI's hot paths.
//!
//! Every message crosses three pieces of code in the device, whatever the
//! transport, and each runs once or more per packet:
//!
//! - **`proto`**: the sender encodes a [`Header`], the receiver decodes and
//!   checks one for every packet, and a bad header (here: a wrong magic) must
//!   be refused cheaply.
//! - **`matching`**: an arriving message searches the posted receives
//!   (`PostedQueue::take_match`) and, when nothing matches, joins the
//!   unexpected queue; a new receive first searches the unexpected messages
//!   (`UnexpectedQueue::take_match`). Both are FIFO scans from the oldest
//!   entry, so their cost grows with the queue: the benchmarks fill a queue
//!   with 1, 100 and 10,000 entries and match the *last* one (the worst
//!   case), for exact patterns and for `ANY_SOURCE` / `ANY_TAG`, plus the
//!   miss that scans everything and finds nothing.
//! - **`request`**: every send and receive takes a slot in the request
//!   `Slab` and gives it back when it completes, and every rendezvous packet
//!   looks its request up by token.
//!
//! The request and unexpected-message records are private to `device`, so
//! stand-ins of about their size are stored.
//!
//! Run with `cargo bench -p oxmpi-adi --bench hot_paths`.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use oxmpi_adi::proto::{Header, Kind, FLAG_SYNC};
use std::hint::black_box;

use oxmpi_adi::{matching, request};

use matching::{Envelope, Pattern, PostedQueue, UnexpectedQueue};
use request::Slab;

/// Queue depths: one entry, a busy rank, a pathological backlog.
const DEPTHS: [usize; 3] = [1, 100, 10_000];

/// The communicator every entry is on: context ids never differ in these
/// benchmarks, so every comparison goes on to the source and the tag.
const CONTEXT: u32 = 4;

fn envelope(source: i32, tag: i32) -> Envelope {
    Envelope {
        context_id: CONTEXT,
        source,
        tag,
    }
}

fn pattern(source: Option<i32>, tag: Option<i32>) -> Pattern {
    Pattern {
        context_id: CONTEXT,
        source,
        tag,
    }
}

fn eager_header() -> Header {
    Header {
        kind: Kind::Eager,
        sequence: 12_345,
        context_id: CONTEXT,
        source: 1,
        tag: 99,
        flags: FLAG_SYNC,
        message_len: 8,
        sender_token: (7 << 32) | 3,
        receiver_token: 0,
        address: 0,
    }
}

fn header(c: &mut Criterion) {
    let mut g = c.benchmark_group("proto/header");
    let h = eager_header();
    let good = h.encode();
    let mut bad_magic = good;
    bad_magic[0] ^= 0xff;
    g.bench_function("encode", |b| b.iter(|| black_box(&h).encode()));
    g.bench_function("decode", |b| {
        b.iter(|| Header::decode(black_box(&good[..])))
    });
    g.bench_function("decode_bad_magic", |b| {
        b.iter(|| Header::decode(black_box(&bad_magic[..])))
    });
    g.finish();
}

/// A way of posting receives: `depth - 1` receives that the arriving
/// envelope does not match, then one that it does.
struct PostedCase {
    name: &'static str,
    filler: Pattern,
    last: Pattern,
    arriving: Envelope,
}

fn posted_cases() -> [PostedCase; 4] {
    [
        PostedCase {
            name: "exact",
            filler: pattern(Some(1), Some(0)),
            last: pattern(Some(1), Some(1)),
            arriving: envelope(1, 1),
        },
        PostedCase {
            name: "any_source",
            filler: pattern(None, Some(0)),
            last: pattern(None, Some(1)),
            arriving: envelope(2, 1),
        },
        PostedCase {
            name: "any_tag",
            filler: pattern(Some(1), None),
            last: pattern(Some(2), None),
            arriving: envelope(2, 1),
        },
        PostedCase {
            name: "any_source_any_tag",
            filler: pattern(Some(1), Some(0)),
            last: pattern(None, None),
            arriving: envelope(2, 1),
        },
    ]
}

fn posted_queue(depth: usize, filler: Pattern, last: Option<Pattern>) -> PostedQueue {
    let mut q = PostedQueue::default();
    let fillers = if last.is_some() { depth - 1 } else { depth };
    for token in 0..fillers as u64 {
        q.push(filler, token + 1);
    }
    if let Some(last) = last {
        q.push(last, u64::MAX);
    }
    q
}

fn posted(c: &mut Criterion) {
    // An arriving message takes the newest posted receive, which is then
    // posted again: the queue keeps its depth and each iteration is one
    // full scan plus one push.
    let mut g = c.benchmark_group("matching/posted_take_last");
    for case in posted_cases() {
        for depth in DEPTHS {
            let mut q = posted_queue(depth, case.filler, Some(case.last));
            g.bench_with_input(BenchmarkId::new(case.name, depth), &depth, |b, _| {
                b.iter(|| {
                    let token = q.take_match(black_box(&case.arriving));
                    q.push(case.last, black_box(token).unwrap_or(0));
                })
            });
        }
    }
    g.finish();

    // An arriving message that no receive wants (it becomes unexpected):
    // the whole queue is scanned for nothing.
    let mut g = c.benchmark_group("matching/posted_miss");
    for depth in DEPTHS {
        let mut q = posted_queue(depth, pattern(Some(1), Some(0)), None);
        let arriving = envelope(1, 1);
        g.bench_with_input(BenchmarkId::from_parameter(depth), &depth, |b, _| {
            b.iter(|| q.take_match(black_box(&arriving)))
        });
    }
    g.finish();
}

/// About the size of the device's unexpected-message record (a buffer and
/// the sender's identity).
struct UnexpectedStandIn {
    _data: Vec<u8>,
    _peer: u32,
    _token: u64,
}

fn stand_in(token: u64) -> UnexpectedStandIn {
    UnexpectedStandIn {
        _data: Vec::new(),
        _peer: 1,
        _token: token,
    }
}

/// A way of receiving: `depth - 1` unexpected messages that the new
/// receive does not match, then one that it does.
struct UnexpectedCase {
    name: &'static str,
    filler: Envelope,
    last: Envelope,
    receive: Pattern,
}

fn unexpected_cases() -> [UnexpectedCase; 3] {
    [
        UnexpectedCase {
            name: "exact",
            filler: envelope(1, 0),
            last: envelope(1, 1),
            receive: pattern(Some(1), Some(1)),
        },
        UnexpectedCase {
            name: "any_source",
            filler: envelope(1, 0),
            last: envelope(2, 1),
            receive: pattern(None, Some(1)),
        },
        UnexpectedCase {
            name: "any_tag",
            filler: envelope(1, 0),
            last: envelope(2, 1),
            receive: pattern(Some(2), None),
        },
    ]
}

fn unexpected_queue(
    depth: usize,
    filler: Envelope,
    last: Option<Envelope>,
) -> UnexpectedQueue<UnexpectedStandIn> {
    let mut q = UnexpectedQueue::default();
    let fillers = if last.is_some() { depth - 1 } else { depth };
    for token in 0..fillers as u64 {
        q.push(filler, stand_in(token));
    }
    if let Some(last) = last {
        q.push(last, stand_in(u64::MAX));
    }
    q
}

fn unexpected(c: &mut Criterion) {
    // A new receive takes the newest unexpected message, which then arrives
    // again: one full scan plus one push per iteration.
    let mut g = c.benchmark_group("matching/unexpected_take_last");
    for case in unexpected_cases() {
        for depth in DEPTHS {
            let mut q = unexpected_queue(depth, case.filler, Some(case.last));
            g.bench_with_input(BenchmarkId::new(case.name, depth), &depth, |b, _| {
                b.iter(|| {
                    let (envelope, message) = q.take_match(black_box(&case.receive)).unwrap();
                    q.push(envelope, black_box(message));
                })
            });
        }
    }
    g.finish();

    // A receive posted before its message arrives: the whole unexpected
    // queue is scanned for nothing.
    let mut g = c.benchmark_group("matching/unexpected_miss");
    for depth in DEPTHS {
        let mut q = unexpected_queue(depth, envelope(1, 0), None);
        let receive = pattern(Some(1), Some(1));
        g.bench_with_input(BenchmarkId::from_parameter(depth), &depth, |b, _| {
            b.iter(|| q.take_match(black_box(&receive)).is_some())
        });
    }
    g.finish();
}

/// About the size of the device's request record (buffer, lengths, phase,
/// status).
type RequestStandIn = [u64; 16];

fn slab(c: &mut Criterion) {
    let mut g = c.benchmark_group("request/slab");
    for live in DEPTHS {
        // `live - 1` requests stay in flight while one is started and
        // completed: the free list makes this O(1) at any depth.
        let mut s: Slab<RequestStandIn> = Slab::default();
        for _ in 1..live {
            s.insert([0; 16]);
        }
        g.bench_with_input(BenchmarkId::new("insert_remove", live), &live, |b, _| {
            b.iter(|| {
                let token = s.insert(black_box([1; 16]));
                s.remove(black_box(token))
            })
        });
    }
    let mut s: Slab<RequestStandIn> = Slab::default();
    let tokens: Vec<u64> = (0..1000).map(|_| s.insert([0; 16])).collect();
    let live = tokens[500];
    // A token whose slot was reused: the generation check refuses it.
    let stale = {
        let t = s.insert([0; 16]);
        s.remove(t);
        s.insert([0; 16]);
        t
    };
    g.bench_function("get", |b| b.iter(|| s.get(black_box(live)).is_some()));
    g.bench_function("get_stale", |b| {
        b.iter(|| s.get(black_box(stale)).is_some())
    });
    g.bench_function("get_mut", |b| {
        b.iter(|| {
            if let Some(r) = s.get_mut(black_box(live)) {
                r[0] = r[0].wrapping_add(1);
            }
        })
    });
    g.finish();
}

criterion_group!(benches, header, posted, unexpected, slab);
criterion_main!(benches);
