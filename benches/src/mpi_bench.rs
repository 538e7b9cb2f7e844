//! The MPI benchmarks, through oxmpi's public API only.
//!
//! The ranks form pairs: with `n` ranks, rank `i` of the first half is
//! paired with rank `i + n/2` (OSU's block order); the 2-rank benchmarks
//! are the case of one pair, ranks 0 and 1. In each pair the first-half
//! rank is the *initiator*.
//!
//! - `latency` (`osu_latency`), `multi_lat` (`osu_multi_lat`): the
//!   initiator sends a message and waits for the same-size reply; the
//!   figure is half the round trip, averaged over the timed iterations
//!   (and, for `multi_lat`, over the pairs).
//! - `bw` (`osu_bw`), `mbw_mr` (`osu_mbw_mr`): the initiator starts
//!   [`WINDOW`] immediate sends of the message, waits for them all, then
//!   receives a 4-byte acknowledgement; its partner posts [`WINDOW`]
//!   immediate receives, waits, and acknowledges. The figure is the bytes
//!   sent in the timed windows over the time, in MB/s (1e6 bytes per
//!   second); for `mbw_mr`, the sum over the pairs (the pairs' bytes over
//!   their mean time), and the same as messages per second.
//! - `bibw` (`osu_bibw`): both ranks post [`WINDOW`] immediate receives,
//!   start [`WINDOW`] immediate sends, and wait for all of them; the
//!   figure counts the bytes of both directions.
//!
//! Before each size every rank synchronizes with rank 0 (one-byte
//! messages in and out: there is no barrier yet), buffers are filled, and
//! warm-up iterations run untimed; the multi-pair benchmarks synchronize
//! again after the warm-up so that every pair's timed loop starts
//! together. Initiators other than rank 0 send their times to rank 0,
//! which reports. Every receive's byte count is checked, and the received
//! bytes are compared with the sent pattern after the timed loop.
//!
//! One difference from OSU: OSU posts its window of receives into one
//! buffer, all 64 overlapping; Rust's borrows forbid that, so a receiver
//! receives into 64 consecutive buffers of the message size.
//!
//! `benches/c/peer_bench.c` is this module written against the MPI C API,
//! for `oxbench compare`: a change to a pattern here is made there too.

use crate::buffers::{check_messages, fill_pattern, AlignedBuf};
use crate::cli::{Benchmark, Options, WINDOW};
use crate::report::StdoutReport;
use oxmpi::request::{scope, wait_all};
use oxmpi::{Communicator, Process};
use std::process::ExitCode;

/// Tag of the synchronizing messages before each size.
const TAG_SYNC: i32 = 1;
/// Tag of the measured messages.
const TAG_DATA: i32 = 2;
/// Tag of the windows' acknowledgements.
const TAG_ACK: i32 = 3;
/// Tag of the initiators' times, sent to rank 0.
const TAG_TIME: i32 = 4;
/// Size of an acknowledgement.
const ACK_SIZE: usize = 4;

/// Runs `benchmark` in this rank of the job; rank 0 prints the report.
/// Any failure ends the whole job (`MPI_Abort`) with a message.
pub fn main(benchmark: Benchmark, options: &Options) -> ExitCode {
    let universe = match oxmpi::initialize() {
        Ok(u) => u,
        Err(e) => {
            eprintln!("oxbench: cannot initialize MPI: {e}");
            return ExitCode::FAILURE;
        }
    };
    let world = universe.world();
    let rank = world.rank();
    if let Err(e) = check_ranks(benchmark, world.size()) {
        if rank == 0 {
            eprintln!("oxbench: {e}");
        }
        // The job fails either way; finalizing first lets it end cleanly.
        let _ = universe.finalize();
        return ExitCode::FAILURE;
    }
    let outcome = if benchmark == Benchmark::WinCreate {
        crate::win_bench::run(&world, options)
    } else if benchmark.is_collective() {
        crate::coll_bench::run(&world, benchmark, options)
    } else if benchmark.is_rma() {
        crate::rma_bench::run(&world, benchmark, options)
    } else {
        run(&world, benchmark, options)
    };
    if let Err(e) = outcome {
        eprintln!("oxbench: rank {rank}: {e}");
        world.abort(1);
    }
    match universe.finalize() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("oxbench: rank {rank}: finalize failed: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Whether `benchmark` can run with `ranks` ranks: exactly 2, for the
/// multi-pair benchmarks any even number, for the collectives and
/// `win_create` any.
pub fn check_ranks(benchmark: Benchmark, ranks: i32) -> Result<(), String> {
    let name = benchmark.name();
    if benchmark.is_any_ranks() {
        return Ok(());
    }
    if benchmark.is_multi_pair() {
        if ranks < 2 || ranks % 2 != 0 {
            return Err(format!(
                "the {name} benchmark needs an even number of ranks (pairs), this job has \
                 {ranks} (run it with `oxrun -n 2`, `-n 4`, ...)"
            ));
        }
    } else if ranks != 2 {
        return Err(format!(
            "the {name} benchmark needs exactly 2 ranks, this job has {ranks} (run it with \
             `oxrun -n 2`)"
        ));
    }
    Ok(())
}

/// Describes the transports in use as far as the MPI layer's public API
/// tells: the `OXMPI_TRANSPORTS` setting.
pub(crate) fn transports_note() -> String {
    let var = oxmpi::TRANSPORTS_ENV;
    match std::env::var(var) {
        Ok(v) => format!("{var}={v}"),
        Err(_) => format!("{var} not set (the library's default transports)"),
    }
}

/// This rank's place in the pairs.
struct Pairing<'c> {
    /// The partner.
    peer: Process<'c>,
    /// Whether this rank initiates (first half).
    initiator: bool,
    /// Number of pairs.
    pairs: usize,
}

impl<'c> Pairing<'c> {
    fn of(world: &'c Communicator) -> Pairing<'c> {
        let (rank, pairs) = (world.rank(), world.size() / 2);
        let initiator = rank < pairs;
        let peer = if initiator {
            rank + pairs
        } else {
            rank - pairs
        };
        Pairing {
            peer: world.process_at_rank(peer),
            initiator,
            pairs: pairs as usize,
        }
    }

    /// Whether this rank receives a window of messages at once.
    fn receives_windows(&self, benchmark: Benchmark) -> bool {
        match benchmark {
            Benchmark::BiBandwidth => true,
            Benchmark::Bandwidth | Benchmark::MultiBandwidth => !self.initiator,
            _ => false,
        }
    }

    /// Length of the receive buffer for messages of `size` bytes.
    fn receive_len(&self, benchmark: Benchmark, size: usize) -> usize {
        if self.receives_windows(benchmark) {
            size * WINDOW
        } else if benchmark.is_latency() {
            size
        } else {
            0
        }
    }
}

fn run(world: &Communicator, benchmark: Benchmark, options: &Options) -> Result<(), String> {
    let pairing = Pairing::of(world);
    let mut report = if world.rank() == 0 {
        let mut notes = vec![
            format!("ranks: {}; {}", world.size(), transports_note()),
            options.describe_iterations(),
        ];
        if benchmark.is_multi_pair() {
            notes.push(format!(
                "pairs: {0} (rank i with rank i + {0}), running at once",
                pairing.pairs
            ));
        }
        if benchmark == Benchmark::BiBandwidth {
            notes.push(format!("window: {WINDOW} immediate sends each way at once"));
        } else if benchmark.is_windowed() {
            notes.push(format!(
                "window: {WINDOW} immediate sends, then a {ACK_SIZE}-byte acknowledgement"
            ));
        }
        let report =
            StdoutReport::to_stdout(benchmark, "oxmpi", notes, options.json, options.tail)?;
        Some(report)
    } else {
        None
    };
    let max = options.max_size;
    let mut send = AlignedBuf::new(max)?;
    let mut receive = AlignedBuf::new(pairing.receive_len(benchmark, max))?;
    for size in options.sizes() {
        let iterations = options.iterations_for(size);
        let warmup = options.warmup_for(size);
        // Touch the buffers before timing: the message's pattern, and
        // zeros where it is received.
        fill_pattern(&mut send.as_mut_slice()[..size], size);
        let received = &mut receive.as_mut_slice()[..pairing.receive_len(benchmark, size)];
        received.fill(0);
        let message = &send.as_slice()[..size];
        sync_all(world)?;
        let sync_after_warmup = benchmark.is_multi_pair().then_some(world);
        let seconds = timed(warmup, iterations, sync_after_warmup, || {
            step(benchmark, &pairing, message, received)
        })?;
        if !received.is_empty() {
            check_messages(received, message)
                .map_err(|e| format!("{}, {size} bytes: {e}", benchmark.name()))?;
        }
        let times = gather_initiator_times(world, &pairing, seconds)?;
        if let Some(report) = &mut report {
            let figures = figures(benchmark, size, iterations, &times);
            report.record(size, &figures)?;
        }
    }
    // The last synchronization makes sure every rank is done before
    // finalizing.
    sync_all(world)?;
    if let Some(report) = report {
        report.end()?;
    }
    Ok(())
}

/// The figures of one size from the initiators' times (rank 0's first):
/// see the module doc. The raw TCP baseline's too.
pub fn figures(benchmark: Benchmark, size: usize, iterations: usize, times: &[f64]) -> Vec<f64> {
    let pairs = times.len() as f64;
    let mean = times.iter().sum::<f64>() / pairs;
    let iterations = iterations as f64;
    let window_bytes = (size * WINDOW) as f64 * iterations;
    match benchmark {
        Benchmark::Latency | Benchmark::MultiLatency => vec![mean * 1e6 / (2.0 * iterations)],
        Benchmark::Bandwidth => vec![window_bytes / mean / 1e6],
        Benchmark::BiBandwidth => vec![2.0 * window_bytes / mean / 1e6],
        Benchmark::MultiBandwidth => {
            let messages = pairs * WINDOW as f64 * iterations / mean;
            vec![pairs * window_bytes / mean / 1e6, messages]
        }
        Benchmark::PutBandwidth | Benchmark::GetBandwidth => vec![window_bytes / mean / 1e6],
        // The collectives, and the one-sided latencies: a one-sided
        // operation's time is its round trip, not halved.
        _ => vec![mean * 1e6 / iterations],
    }
}

/// Runs `warmup` untimed iterations of `step`, synchronizes with every
/// rank of `sync_after_warmup` if given, then times `iterations` more;
/// returns the seconds they took.
fn timed(
    warmup: usize,
    iterations: usize,
    sync_after_warmup: Option<&Communicator>,
    mut step: impl FnMut() -> Result<(), String>,
) -> Result<f64, String> {
    for _ in 0..warmup {
        step()?;
    }
    if let Some(world) = sync_after_warmup {
        sync_all(world)?;
    }
    let start = oxmpi::time();
    for _ in 0..iterations {
        step()?;
    }
    Ok(oxmpi::time() - start)
}

/// One iteration of `benchmark` in this rank.
fn step(
    benchmark: Benchmark,
    pairing: &Pairing<'_>,
    message: &[u8],
    received: &mut [u8],
) -> Result<(), String> {
    let peer = &pairing.peer;
    match benchmark {
        Benchmark::Latency | Benchmark::MultiLatency => {
            if pairing.initiator {
                send(peer, message, TAG_DATA)?;
                receive_exact(peer, received, TAG_DATA)
            } else {
                receive_exact(peer, received, TAG_DATA)?;
                send(peer, message, TAG_DATA)
            }
        }
        Benchmark::Bandwidth | Benchmark::MultiBandwidth => {
            if pairing.initiator {
                exchange_window(peer, Some(message), None)?;
                receive_exact(peer, &mut [0u8; ACK_SIZE], TAG_ACK)
            } else {
                exchange_window(peer, None, Some((received, message.len())))?;
                send(peer, &[0u8; ACK_SIZE], TAG_ACK)
            }
        }
        Benchmark::BiBandwidth => {
            exchange_window(peer, Some(message), Some((received, message.len())))
        }
        other => Err(format!(
            "{} is not a point-to-point benchmark",
            other.name()
        )),
    }
}

/// One window: posts [`WINDOW`] immediate receives of `size` bytes into
/// consecutive buffers of `window` (if given), starts [`WINDOW`]
/// immediate sends of `message` (if given), and waits for all of them,
/// checking each receive's byte count.
fn exchange_window(
    peer: &Process<'_>,
    message: Option<&[u8]>,
    window: Option<(&mut [u8], usize)>,
) -> Result<(), String> {
    let fail = |e: oxmpi::Error| format!("window of messages with rank {}: {e}", peer.rank());
    scope(|scope| -> Result<(), String> {
        let mut receives = Vec::with_capacity(WINDOW);
        let mut sends = Vec::with_capacity(WINDOW);
        let mut size = 0;
        if let Some((window, len)) = window {
            size = len;
            // `chunks_mut` needs a non-zero length; windows of 0-byte
            // messages do not exist (bandwidth sizes start at 1).
            for buf in window.chunks_mut(len.max(1)) {
                receives.push(
                    peer.immediate_receive_into_with_tag(scope, buf, TAG_DATA)
                        .map_err(fail)?,
                );
            }
        }
        if let Some(message) = message {
            for _ in 0..WINDOW {
                sends.push(
                    peer.immediate_send_with_tag(scope, message, TAG_DATA)
                        .map_err(fail)?,
                );
            }
        }
        wait_all(sends).map_err(fail)?;
        for status in wait_all(receives).map_err(fail)? {
            check_count(status.byte_count(), size)?;
        }
        Ok(())
    })
}

/// Sends `buf` to `peer` with `tag`.
fn send(peer: &Process<'_>, buf: &[u8], tag: i32) -> Result<(), String> {
    peer.send_with_tag(buf, tag)
        .map_err(|e| format!("sending {} bytes to rank {}: {e}", buf.len(), peer.rank()))
}

/// Receives a message that must fill `buf` exactly.
fn receive_exact(peer: &Process<'_>, buf: &mut [u8], tag: i32) -> Result<(), String> {
    let status = peer.receive_into_with_tag(buf, tag).map_err(|e| {
        format!(
            "receiving {} bytes from rank {}: {e}",
            buf.len(),
            peer.rank()
        )
    })?;
    check_count(status.byte_count(), buf.len())
}

fn check_count(received: usize, expected: usize) -> Result<(), String> {
    if received == expected {
        Ok(())
    } else {
        Err(format!(
            "a message of {expected} bytes arrived with {received} bytes"
        ))
    }
}

/// Every rank reports to rank 0 with one byte, then rank 0 answers each:
/// no rank leaves before all came.
fn sync_all(world: &Communicator) -> Result<(), String> {
    let token = [0u8; 1];
    if world.rank() == 0 {
        for rank in 1..world.size() {
            receive_exact(&world.process_at_rank(rank), &mut [0u8; 1], TAG_SYNC)?;
        }
        for rank in 1..world.size() {
            send(&world.process_at_rank(rank), &token, TAG_SYNC)?;
        }
        Ok(())
    } else {
        let root = world.process_at_rank(0);
        send(&root, &token, TAG_SYNC)?;
        receive_exact(&root, &mut [0u8; 1], TAG_SYNC)
    }
}

/// The initiators' times, in rank order, at rank 0 (rank 0 is the first
/// initiator); empty elsewhere.
fn gather_initiator_times(
    world: &Communicator,
    pairing: &Pairing<'_>,
    seconds: f64,
) -> Result<Vec<f64>, String> {
    if world.rank() == 0 {
        let mut times = vec![seconds];
        for rank in 1..pairing.pairs as i32 {
            let mut bytes = [0u8; 8];
            receive_exact(&world.process_at_rank(rank), &mut bytes, TAG_TIME)?;
            times.push(f64::from_le_bytes(bytes));
        }
        Ok(times)
    } else {
        if pairing.initiator {
            send(&world.process_at_rank(0), &seconds.to_le_bytes(), TAG_TIME)?;
        }
        Ok(Vec::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_checked() {
        check_count(8, 8).unwrap();
        let e = check_count(7, 8).unwrap_err();
        assert_eq!(e, "a message of 8 bytes arrived with 7 bytes");
    }

    #[test]
    fn rank_counts() {
        check_ranks(Benchmark::Latency, 2).unwrap();
        check_ranks(Benchmark::BiBandwidth, 2).unwrap();
        assert!(check_ranks(Benchmark::Bandwidth, 4)
            .unwrap_err()
            .contains("exactly 2 ranks"));
        check_ranks(Benchmark::MultiBandwidth, 2).unwrap();
        check_ranks(Benchmark::MultiLatency, 8).unwrap();
        check_ranks(Benchmark::WinCreate, 1).unwrap();
        check_ranks(Benchmark::WinCreate, 3).unwrap();
        for bad in [1, 3] {
            assert!(check_ranks(Benchmark::MultiBandwidth, bad)
                .unwrap_err()
                .contains("even number"));
        }
    }

    #[test]
    fn figures_follow_osu() {
        // One pair, 2 s for 10 iterations of 1000-byte messages.
        let latency = figures(Benchmark::Latency, 1000, 10, &[2.0]);
        assert_eq!(latency, vec![1e5]);
        let bw = figures(Benchmark::Bandwidth, 1000, 10, &[2.0]);
        assert_eq!(bw, vec![(1000 * WINDOW * 10) as f64 / 2.0 / 1e6]);
        let bibw = figures(Benchmark::BiBandwidth, 1000, 10, &[2.0]);
        assert_eq!(bibw, vec![2.0 * bw[0]]);
        // Two pairs, mean time 2 s: twice one pair's bytes.
        let mbw = figures(Benchmark::MultiBandwidth, 1000, 10, &[1.0, 3.0]);
        assert_eq!(mbw[0], 2.0 * bw[0]);
        assert_eq!(mbw[1], (2 * WINDOW * 10) as f64 / 2.0);
        let multi_lat = figures(Benchmark::MultiLatency, 1000, 10, &[1.0, 3.0]);
        assert_eq!(multi_lat, latency);
    }
}
