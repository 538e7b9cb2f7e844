//! A timing study of the queue alone (ignored by default: it measures,
//! and a shared machine's figures are noise unless it is quiet):
//! `cargo test --release -p oxmpi-shm --lib queue_study -- --ignored
//! --nocapture`.
//!
//! Two threads on two cores ping-pong one-cell short frames through two
//! queues with the transport's own calls (`push_short` and the look at
//! the consumer's sleeping flag; `look`, `short`, `advance` and the look
//! at the producer's waiting flag), beside the raw floor (a store and a
//! load of one cache line each way, as `oxbench raw-shm latency`). It
//! tells the cost of the queue's cache lines (the cell, the head, the
//! flags) apart from the instructions of the layers above it, and
//! whether reading on past a message (the look at the next cell that
//! the transport's read loop makes after each message) costs a miss:
//! each figure is one way, in ns, for queues of 4 KiB to 4 MiB, "alone /
//! looking past".

use crate::proto::SHORT_FIELDS;
use crate::ring::{queue_with, Barriers, Consumer, Head, Producer};
use crate::sys::{bind_thread_to_cpu, register_for_barriers};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Round trips per figure.
const ROUND_TRIPS: u64 = 2_000_000;

/// A cache line of its own.
#[repr(align(128))]
struct Line(AtomicU64);

/// One-way ns of `round_trips` made by `first` (on CPU 0, timed) and
/// `second` (on CPU 1), each given the round trip's number.
fn one_way_ns(
    mut first: impl FnMut(u64) + Send,
    mut second: impl FnMut(u64) + Send + 'static,
) -> f64 {
    let answering = std::thread::spawn(move || {
        bind_thread_to_cpu(1).expect("binding the answering thread to CPU 1");
        for i in 1..=ROUND_TRIPS {
            second(i);
        }
    });
    bind_thread_to_cpu(0).expect("binding the timed thread to CPU 0");
    let start = Instant::now();
    for i in 1..=ROUND_TRIPS {
        first(i);
    }
    let ns = start.elapsed().as_nanos() as f64 / ROUND_TRIPS as f64 / 2.0;
    answering.join().expect("the answering thread failed");
    ns
}

/// The floor: a sequence number stored into one line each way.
fn floor() -> f64 {
    let lines = Arc::new([Line(AtomicU64::new(0)), Line(AtomicU64::new(0))]);
    let theirs = lines.clone();
    one_way_ns(
        |i| {
            lines[0].0.store(i, Ordering::Release);
            while lines[1].0.load(Ordering::Acquire) != i {}
        },
        move |i| {
            while theirs[0].0.load(Ordering::Acquire) != i {}
            theirs[1].0.store(i, Ordering::Release);
        },
    )
}

/// Sends `value` as an 8-byte short frame, as the transport's send does.
fn send(producer: &mut Producer, value: u64) {
    let fields = [7u8; SHORT_FIELDS];
    assert!(producer.push_short(&fields, &value.to_le_bytes()).unwrap());
    std::hint::black_box(producer.consumer_sleeping());
}

/// Waits for the next short frame and returns its value, as the
/// transport's read does; `look_past`: then looks at the next cell, as
/// its read loop did for every message.
fn receive(consumer: &mut Consumer, look_past: bool) -> u64 {
    loop {
        if let Head::Short(frame) = consumer.look() {
            let (_, payload) = consumer.short(&frame);
            consumer.advance(&frame);
            std::hint::black_box(consumer.producer_waiting());
            if look_past {
                assert_eq!(consumer.look(), Head::Empty);
            }
            return u64::from_le_bytes(payload[..8].try_into().unwrap());
        }
    }
}

/// The queues' ping-pong with `cells` cells per queue.
fn queues(cells: u64, look_past: bool) -> f64 {
    let (mut out, mut their_in) = queue_with(cells, Barriers::Asymmetric);
    let (mut their_out, mut inbound) = queue_with(cells, Barriers::Asymmetric);
    one_way_ns(
        |i| {
            send(&mut out, i);
            assert_eq!(receive(&mut inbound, look_past), i, "answer out of order");
        },
        move |i| {
            assert_eq!(receive(&mut their_in, look_past), i, "message out of order");
            send(&mut their_out, i);
        },
    )
}

#[test]
#[ignore = "a timing study, run by hand on a quiet machine (see the module docs)"]
fn queue_study() {
    register_for_barriers().expect("the study needs membarrier's registration");
    for round in 1..=3 {
        let mut line = format!("round {round}: floor {:.1}", floor());
        for cells in [64u64, 1024, 16384, 65536] {
            let (alone, past) = (queues(cells, false), queues(cells, true));
            line += &format!(" | {} KiB {alone:.1} / {past:.1}", cells * 64 / 1024);
        }
        println!("{line}");
    }
}
