//! The MPI benchmarks, between ranks 0 and 1 of a 2-rank job, through
//! oxmpi's public API only.
//!
//! - Latency (OSU's `osu_latency`): rank 0 sends a message and waits for
//!   the same-size reply; the figure is half the round trip, averaged over
//!   the timed iterations.
//! - Bandwidth (OSU's `osu_bw`): rank 0 starts [`WINDOW`] immediate sends
//!   of the message, waits for them all, then receives a 4-byte
//!   acknowledgement; rank 1 posts [`WINDOW`] immediate receives, waits,
//!   and acknowledges. The figure is the bytes sent in the timed windows
//!   over the time, in MB/s (1e6 bytes per second).
//!
//! Before each size the ranks synchronize with a one-byte exchange (there
//! is no barrier yet), buffers are filled, and warm-up iterations run
//! untimed. Every receive's byte count is checked, and the received bytes
//! are compared with the sent pattern after the timed loop.
//!
//! One difference from OSU: OSU posts its window of receives into one
//! buffer, all 64 overlapping; Rust's borrows forbid that, so rank 1
//! receives into 64 consecutive buffers of the message size.

use crate::buffers::{check_messages, fill_pattern, AlignedBuf};
use crate::cli::{Benchmark, Options, WINDOW};
use crate::report::Report;
use oxmpi::{Communicator, Process};
use std::process::ExitCode;

/// Tag of the synchronizing exchange before each size.
const TAG_SYNC: i32 = 1;
/// Tag of the measured messages.
const TAG_DATA: i32 = 2;
/// Tag of the bandwidth benchmark's acknowledgements.
const TAG_ACK: i32 = 3;
/// Size of an acknowledgement.
const ACK_SIZE: usize = 4;

/// Runs `benchmark` in this rank of a 2-rank job; rank 0 prints the
/// report. Any failure ends the whole job (`MPI_Abort`) with a message.
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
    if world.size() != 2 {
        if rank == 0 {
            eprintln!(
                "oxbench: the {} benchmark needs exactly 2 ranks, this job has {} (run it with `oxrun -n 2`)",
                benchmark.name(),
                world.size()
            );
        }
        // The job fails either way; finalizing first lets it end cleanly.
        let _ = universe.finalize();
        return ExitCode::FAILURE;
    }
    if let Err(e) = run(&world, benchmark, options) {
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

/// Describes the transports in use as far as the MPI layer's public API
/// tells: the `OXMPI_TRANSPORTS` setting.
fn transports_note() -> String {
    let var = oxmpi::TRANSPORTS_ENV;
    match std::env::var(var) {
        Ok(v) => format!("{var}={v}"),
        Err(_) => format!("{var} not set (the library's default transports)"),
    }
}

fn run(world: &Communicator, benchmark: Benchmark, options: &Options) -> Result<(), String> {
    let rank = world.rank();
    let peer = world.process_at_rank(1 - rank);
    let mut report = if rank == 0 {
        let mut notes = vec![
            format!("ranks: {}; {}", world.size(), transports_note()),
            options.describe_iterations(),
        ];
        if benchmark == Benchmark::Bandwidth {
            notes.push(format!(
                "window: {WINDOW} immediate sends, then a {ACK_SIZE}-byte acknowledgement"
            ));
        }
        let report = Report::start(
            std::io::stdout().lock(),
            benchmark,
            "oxmpi",
            notes,
            options.json,
        )
        .map_err(|e| format!("writing the report: {e}"))?;
        Some(report)
    } else {
        None
    };
    let sizes = options.sizes();
    let max = options.max_size;
    let mut send = AlignedBuf::new(max)?;
    // The bandwidth receiver needs a whole window of buffers.
    let receive_len = match (benchmark, rank) {
        (Benchmark::Bandwidth, 1) => max * WINDOW,
        (Benchmark::Bandwidth, _) => 0,
        (Benchmark::Latency, _) => max,
    };
    let mut receive = AlignedBuf::new(receive_len)?;
    for &size in &sizes {
        let iterations = options.iterations_for(size);
        let warmup = options.warmup_for(size);
        // Touch the buffers before timing: the message's pattern, and
        // zeros where it is received.
        fill_pattern(&mut send.as_mut_slice()[..size], size);
        let received_len = match (benchmark, rank) {
            (Benchmark::Bandwidth, 1) => size * WINDOW,
            (Benchmark::Bandwidth, _) => 0,
            (Benchmark::Latency, _) => size,
        };
        let received = &mut receive.as_mut_slice()[..received_len];
        received.fill(0);
        sync(&peer, rank)?;
        let figure = match benchmark {
            Benchmark::Latency => {
                let receive = received;
                let seconds = latency(
                    &peer,
                    rank,
                    &send.as_slice()[..size],
                    receive,
                    iterations,
                    warmup,
                )?;
                check_messages(receive, &send.as_slice()[..size])
                    .map_err(|e| format!("latency, {size} bytes: {e}"))?;
                seconds * 1e6 / (2.0 * iterations as f64)
            }
            Benchmark::Bandwidth => {
                let window = received;
                let seconds = bandwidth(
                    &peer,
                    rank,
                    &send.as_slice()[..size],
                    window,
                    iterations,
                    warmup,
                )?;
                if rank == 1 {
                    check_messages(window, &send.as_slice()[..size])
                        .map_err(|e| format!("bandwidth, {size} bytes: {e}"))?;
                }
                (size * iterations * WINDOW) as f64 / seconds / 1e6
            }
        };
        if let Some(report) = &mut report {
            report
                .row(size, figure)
                .map_err(|e| format!("writing the report: {e}"))?;
        }
    }
    // The last exchange makes sure both ranks are done before finalizing.
    sync(&peer, rank)?;
    if let Some(report) = report {
        report
            .finish()
            .map(drop)
            .map_err(|e| format!("writing the report: {e}"))?;
    }
    Ok(())
}

/// A one-byte exchange each way: neither rank leaves before both came.
fn sync(peer: &Process<'_>, rank: i32) -> Result<(), String> {
    let token = [0u8; 1];
    let mut incoming = [0u8; 1];
    let fail = |e: oxmpi::Error| format!("synchronizing with rank {}: {e}", peer.rank());
    if rank == 0 {
        peer.send_with_tag(&token[..], TAG_SYNC).map_err(fail)?;
        receive_exact(peer, &mut incoming[..], TAG_SYNC)
    } else {
        receive_exact(peer, &mut incoming[..], TAG_SYNC)?;
        peer.send_with_tag(&token[..], TAG_SYNC).map_err(fail)
    }
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

/// The ping-pong loop; returns rank 0's time for the timed iterations, in
/// seconds (rank 1's is meaningless).
fn latency(
    peer: &Process<'_>,
    rank: i32,
    send: &[u8],
    receive: &mut [u8],
    iterations: usize,
    warmup: usize,
) -> Result<f64, String> {
    let size = send.len();
    let send_fail = |e: oxmpi::Error| format!("sending {size} bytes to rank {}: {e}", peer.rank());
    let mut start = oxmpi::time();
    for i in 0..warmup + iterations {
        if i == warmup {
            start = oxmpi::time();
        }
        if rank == 0 {
            peer.send_with_tag(send, TAG_DATA).map_err(send_fail)?;
            receive_exact(peer, receive, TAG_DATA)?;
        } else {
            receive_exact(peer, receive, TAG_DATA)?;
            peer.send_with_tag(send, TAG_DATA).map_err(send_fail)?;
        }
    }
    Ok(oxmpi::time() - start)
}

/// The windowed streaming loop; returns rank 0's time for the timed
/// iterations, in seconds. Rank 0 sends `send` [`WINDOW`] times per
/// iteration; rank 1 receives into `window`, [`WINDOW`] consecutive
/// buffers of the message size.
fn bandwidth(
    peer: &Process<'_>,
    rank: i32,
    send: &[u8],
    window: &mut [u8],
    iterations: usize,
    warmup: usize,
) -> Result<f64, String> {
    let size = send.len();
    let ack = [0u8; ACK_SIZE];
    let mut ack_in = [0u8; ACK_SIZE];
    let fail = |e: oxmpi::Error| {
        format!(
            "window of {size}-byte messages with rank {}: {e}",
            peer.rank()
        )
    };
    let mut start = oxmpi::time();
    for i in 0..warmup + iterations {
        if i == warmup {
            start = oxmpi::time();
        }
        if rank == 0 {
            oxmpi::request::scope(|scope| -> Result<(), String> {
                let mut requests = Vec::with_capacity(WINDOW);
                for _ in 0..WINDOW {
                    requests.push(
                        peer.immediate_send_with_tag(scope, send, TAG_DATA)
                            .map_err(fail)?,
                    );
                }
                oxmpi::request::wait_all(requests).map_err(fail)?;
                Ok(())
            })?;
            receive_exact(peer, &mut ack_in[..], TAG_ACK)?;
        } else {
            oxmpi::request::scope(|scope| -> Result<(), String> {
                let mut requests = Vec::with_capacity(WINDOW);
                for buf in window.chunks_mut(size) {
                    requests.push(
                        peer.immediate_receive_into_with_tag(scope, buf, TAG_DATA)
                            .map_err(fail)?,
                    );
                }
                for status in oxmpi::request::wait_all(requests).map_err(fail)? {
                    check_count(status.byte_count(), size)?;
                }
                Ok(())
            })?;
            peer.send_with_tag(&ack[..], TAG_ACK).map_err(fail)?;
        }
    }
    Ok(oxmpi::time() - start)
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
}
