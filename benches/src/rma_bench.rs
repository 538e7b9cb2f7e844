//! The one-sided (RMA) benchmarks, through oxmpi's public API only, as
//! the OSU micro-benchmarks of the same names time them with their
//! defaults (`osu_put_latency`, `osu_get_latency`, `osu_acc_latency`,
//! `osu_fop_latency`, `osu_cas_latency`, `osu_put_bw`, `osu_get_bw`):
//!
//! - 2 ranks; each allocates a window of the largest size, [`WINDOW`]
//!   times that for the bandwidths (`Window::allocate`,
//!   `MPI_Win_allocate`); rank 0 is the origin, rank 1 the target, which
//!   waits in a barrier meanwhile;
//! - per size, a barrier before and after; between them the origin runs
//!   the warm-up and then the timed operations, synchronised as
//!   `--sync` says ([`Synchronization`], OSU's `-s`): by default
//!   (`flush`) under one shared lock on the target for the size, each
//!   operation (each window, for the bandwidths) followed by a flush;
//!   with `lock`, each operation or window in a lock of its own, then an
//!   unlock (exclusive for `fop` and `cas`, shared for the others, as
//!   OSU's `run_*_with_lock`);
//! - latencies: the figure is the timed loop's time per operation, in
//!   microseconds (not halved: one operation is a round trip). `acc`
//!   sums `u64`s (sizes from 8 bytes), `fop` and `cas` work on one `u64`
//!   (one row, 8 bytes);
//! - bandwidths: windows of [`WINDOW`] operations, each window completed
//!   (flush or unlock); MB/s
//!   (10^6 bytes per second). As in OSU, operation `j` of a window moves
//!   the `j`th of [`WINDOW`] consecutive `size`-byte slots, at the origin
//!   (the data of a put, the result of a get) and at the target
//!   (displacement `j * size`), so that a window streams through
//!   [`WINDOW`] times the size at both ends rather than copying one
//!   cached slot again and again. The gets are `rget`s, waited for
//!   together before the flush or unlock: the C benchmark's `MPI_Get`s
//!   are complete only then, and Rust's blocking `get` would wait
//!   for each one over a network.
//!
//! With `--tail` the origin also reads the clock around each timed
//! operation of a latency (the mean stays the loop's time per operation)
//! and reports the median, the 99th percentile, the longest and the count
//! over 1 ms beside the mean ([`crate::report::tail_figures`]): whether a
//! high mean is every operation slower or a few stalls.
//!
//! After each size the data is checked: the target's window after puts
//! and accumulates, the origin's buffers after gets, and, at the origin,
//! every value fetch-and-op and compare-and-swap fetched.
//!
//! `benches/c/peer_bench.c` has the same patterns against the MPI C API,
//! for `oxbench compare`: a change here is made there too.

use crate::buffers::{check_messages, fill_pattern, AlignedBuf};
use crate::cli::{Benchmark, Options, Synchronization, WINDOW};
use crate::report::StdoutReport;
use oxmpi::collective::SystemOperation;
use oxmpi::rma::{LockType, Window};
use oxmpi::{Communicator, Info};

/// The target's rank.
const TARGET: i32 = 1;

/// Runs the one-sided `benchmark` in this rank; rank 0 reports.
pub fn run(world: &Communicator, benchmark: Benchmark, options: &Options) -> Result<(), String> {
    let mpi = |what: &'static str| move |e: oxmpi::Error| format!("{what}: {e}");
    let rank = world.rank();
    let max = options.max_size;
    let mut report = if rank == 0 {
        let notes = vec![
            format!("ranks: 2; {}", crate::mpi_bench::transports_note()),
            options.describe_iterations(),
            format!("window: allocated; {}", options.sync.describe(benchmark)),
        ];
        Some(StdoutReport::to_stdout(
            benchmark,
            "oxmpi",
            notes,
            options.json,
            options.tail,
        )?)
    } else {
        None
    };
    // The slots an operation's data may take at each end: one, or the
    // bandwidths' window of them.
    let slots = if benchmark.is_latency() { 1 } else { WINDOW };
    let window = Window::allocate(world, (slots * max).max(8), 1, &Info::new())
        .map_err(mpi("allocating the window"))?;
    let mut origin = AlignedBuf::new(slots * max)?;
    let results_len = match benchmark {
        Benchmark::GetBandwidth | Benchmark::GetLatency => slots * max,
        _ => 0,
    };
    let mut results = AlignedBuf::new(results_len.max(8))?;
    // The accumulates' operand, made once as the C benchmark's.
    let ones = vec![1u64; max / 8];
    // With `--tail`, each timed operation's duration, in seconds.
    let mut durations = Vec::new();
    let lock_type = if options.sync.exclusive(benchmark) {
        LockType::Exclusive
    } else {
        LockType::Shared
    };
    let lock_each = options.sync == Synchronization::Lock;
    for size in options.sizes() {
        let (iterations, warmup) = (options.iterations_for(size), options.warmup_for(size));
        let total = warmup + iterations;
        // Every slot holds the pattern of the size.
        for slot in origin.as_mut_slice()[..slots * size].chunks_mut(size.max(1)) {
            fill_pattern(slot, size);
        }
        if rank == TARGET {
            // Puts and accumulates find zeros; gets find the pattern.
            let start: Vec<u8> = match benchmark {
                Benchmark::GetLatency | Benchmark::GetBandwidth => {
                    origin.as_slice()[..slots * size].to_vec()
                }
                _ => vec![0; slots * size],
            };
            window
                .write_local(0, &start)
                .map_err(mpi("preparing the window"))?;
        }
        world.barrier().map_err(mpi("barrier before the size"))?;
        if rank == 0 {
            if !lock_each {
                window.lock(lock_type, TARGET, 0).map_err(mpi("lock"))?;
            }
            durations.clear();
            durations.reserve(if options.tail { iterations } else { 0 });
            let mut start = oxmpi::time();
            for i in 0..total {
                if i == warmup {
                    start = oxmpi::time();
                }
                // The clock is read around each operation only with
                // `--tail`: the mean is the loop's, as without.
                let began = (options.tail && i >= warmup).then(oxmpi::time);
                let operated = (|| {
                    if lock_each {
                        window.lock(lock_type, TARGET, 0)?;
                    }
                    operate(
                        &window,
                        benchmark,
                        origin.as_slice(),
                        &ones,
                        results.as_mut_slice(),
                        size,
                        i,
                    )?;
                    if lock_each {
                        window.unlock(TARGET)
                    } else {
                        window.flush(TARGET)
                    }
                })();
                operated.map_err(|e| format!("{}, {size} bytes: {e}", benchmark.name()))?;
                if let Some(began) = began {
                    durations.push(oxmpi::time() - began);
                }
            }
            let seconds = oxmpi::time() - start;
            if !lock_each {
                window.unlock(TARGET).map_err(mpi("unlock"))?;
            }
            if matches!(benchmark, Benchmark::GetLatency | Benchmark::GetBandwidth) {
                check_messages(
                    &results.as_slice()[..slots * size],
                    &origin.as_slice()[..size],
                )?;
            }
            let mut figures = crate::mpi_bench::figures(benchmark, size, iterations, &[seconds]);
            if options.tail {
                figures.extend(crate::report::tail_figures(&mut durations));
            }
            if let Some(report) = &mut report {
                report.record(size, &figures)?;
            }
        }
        world.barrier().map_err(mpi("barrier after the size"))?;
        if rank == TARGET {
            check_target(&window, benchmark, origin.as_slice(), size, slots, total)?;
        }
    }
    world.barrier().map_err(mpi("barrier at the end"))?;
    window.free().map_err(mpi("freeing the window"))?;
    if let Some(report) = report {
        report.end()?;
    }
    Ok(())
}

/// Operation `i` of the origin's loop (a window of them, for the
/// bandwidths); the caller completes it (a flush or an unlock).
fn operate(
    window: &Window<'_>,
    benchmark: Benchmark,
    origin: &[u8],
    ones: &[u64],
    results: &mut [u8],
    size: usize,
    i: usize,
) -> oxmpi::Result<()> {
    let data = &origin[..size];
    match benchmark {
        Benchmark::PutLatency => window.put(data, TARGET, 0)?,
        Benchmark::GetLatency => window.get(&mut results[..size], TARGET, 0)?,
        Benchmark::AccLatency => {
            window.accumulate(&ones[..size / 8], TARGET, 0, SystemOperation::sum())?
        }
        Benchmark::FopLatency => {
            let mut old = 0u64;
            window.fetch_and_op(&1u64, &mut old, TARGET, 0, SystemOperation::sum())?;
            if old != i as u64 {
                return Err(wrong(format!("fetch-and-op {i} fetched {old}")));
            }
        }
        Benchmark::CasLatency => {
            let mut old = 0u64;
            window.compare_and_swap(&(i as u64 + 1), &(i as u64), &mut old, TARGET, 0)?;
            if old != i as u64 {
                return Err(wrong(format!("compare-and-swap {i} found {old}")));
            }
        }
        Benchmark::PutBandwidth => {
            for (j, slot) in origin[..WINDOW * size].chunks(size.max(1)).enumerate() {
                window.put(slot, TARGET, j * size)?;
            }
        }
        Benchmark::GetBandwidth => {
            oxmpi::request::scope(|scope| -> oxmpi::Result<()> {
                let mut requests = Vec::with_capacity(WINDOW);
                for (j, slot) in results[..WINDOW * size].chunks_mut(size.max(1)).enumerate() {
                    requests.push(window.rget(scope, slot, TARGET, j * size)?);
                }
                oxmpi::request::wait_all(requests).map(drop)
            })?;
        }
        _ => {
            return Err(wrong(format!(
                "{} is not a one-sided benchmark",
                benchmark.name()
            )))
        }
    }
    Ok(())
}

/// Checks the target's window after `total` operations of a size, whose
/// data went to `slots` slots of `size` bytes.
fn check_target(
    window: &Window<'_>,
    benchmark: Benchmark,
    pattern: &[u8],
    size: usize,
    slots: usize,
    total: usize,
) -> Result<(), String> {
    let read = |n: usize| -> Result<Vec<u64>, String> {
        let mut words = vec![0u64; n];
        window
            .read_local(0, &mut words)
            .map_err(|e| format!("reading the window: {e}"))?;
        Ok(words)
    };
    let expected: Vec<u64> = match benchmark {
        Benchmark::PutLatency | Benchmark::PutBandwidth => {
            let mut got = vec![0u8; slots * size];
            window
                .read_local(0, &mut got)
                .map_err(|e| format!("reading the window: {e}"))?;
            return check_messages(&got, &pattern[..size]);
        }
        Benchmark::AccLatency => vec![total as u64; size / 8],
        // Fetch-and-op and compare-and-swap: the origin checked every
        // value fetched.
        _ => return Ok(()),
    };
    let got = read(expected.len())?;
    if got != expected {
        return Err(format!(
            "{}, {size} bytes: the target's window holds {:?}..., expected {:?}...",
            benchmark.name(),
            &got[..got.len().min(4)],
            &expected[..expected.len().min(4)]
        ));
    }
    Ok(())
}

fn wrong(message: String) -> oxmpi::Error {
    oxmpi::Error::new(oxmpi::ErrorClass::Other, message)
}
