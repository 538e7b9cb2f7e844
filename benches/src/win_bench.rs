//! `win_create`: what a window costs to make and free, through oxmpi's
//! public API only. OSU has no such benchmark; users of one-sided codes
//! make windows per phase, so this is the time they pay each time.
//!
//! - every rank of the job takes part (any number);
//! - per size, a barrier, then the warm-up windows, then the timed ones,
//!   back to back: each made by `Window::allocate` (`MPI_Win_allocate`,
//!   the default flavour) or `Window::create` (`MPI_Win_create`, with
//!   `--flavor create`) on `size` bytes with displacement unit 1, then
//!   freed (`MPI_Win_free`). A created window lends the same buffer of
//!   the largest size each time, allocated and touched before the sizes;
//! - the figure is each rank's time for the timed windows over their
//!   number, in microseconds, averaged over the ranks (as the
//!   collectives' "Avg Latency");
//! - after the timed windows of each size, one more is made and checked
//!   untimed: its flavour and size are the ones asked for, and an
//!   allocated window's memory is zero, as `Window::allocate` promises
//!   (MPI does not: the C benchmark checks flavour and size only).
//!
//! `benches/c/peer_bench.c` has the same pattern against the MPI C API,
//! for `oxbench compare`: a change here is made there too.

use crate::buffers::AlignedBuf;
use crate::cli::{Options, WindowFlavor};
use crate::report::{record_rank_mean, StdoutReport};
use oxmpi::rma::{CreateFlavor, Window};
use oxmpi::{Communicator, Info};

/// Runs `win_create` in this rank; rank 0 reports.
pub fn run(world: &Communicator, options: &Options) -> Result<(), String> {
    let mpi = |what: &'static str| move |e: oxmpi::Error| format!("{what}: {e}");
    let (rank, ranks) = (world.rank() as usize, world.size() as usize);
    let flavor = options.flavor;
    let mut report = if rank == 0 {
        let notes = vec![
            format!("ranks: {ranks}; {}", crate::mpi_bench::transports_note()),
            options.describe_iterations(),
            flavor.describe(),
        ];
        Some(StdoutReport::to_stdout(
            crate::cli::Benchmark::WinCreate,
            "oxmpi",
            notes,
            options.json,
            options.tail,
        )?)
    } else {
        None
    };
    let info = Info::new();
    // The memory a created window lends: the largest size, zeroed (so
    // touched) now, so that no page fault falls in the timed loop.
    let mut lent = AlignedBuf::new(if flavor == WindowFlavor::Create {
        options.max_size
    } else {
        0
    })?;
    for size in options.sizes() {
        let (iterations, warmup) = (options.iterations_for(size), options.warmup_for(size));
        world.barrier().map_err(mpi("barrier before the size"))?;
        let mut start = oxmpi::time();
        for i in 0..warmup + iterations {
            if i == warmup {
                start = oxmpi::time();
            }
            make(world, flavor, size, &mut lent, &info, |_| Ok(()))?;
        }
        let seconds = oxmpi::time() - start;
        make(world, flavor, size, &mut lent, &info, |window| {
            check(window, flavor, size)
        })
        .map_err(|e| format!("win_create, {size} bytes: {e}"))?;
        let mean_us = seconds * 1e6 / iterations as f64;
        record_rank_mean(world, report.as_mut(), size, mean_us)?;
    }
    world.barrier().map_err(mpi("barrier at the end"))?;
    if let Some(report) = report {
        report.end()?;
    }
    Ok(())
}

/// Makes a window of `size` bytes in `flavor` (a created one on the
/// start of `lent`), hands it to `inspect`, and frees it.
fn make(
    world: &Communicator,
    flavor: WindowFlavor,
    size: usize,
    lent: &mut AlignedBuf,
    info: &Info,
    inspect: impl FnOnce(&Window<'_>) -> Result<(), String>,
) -> Result<(), String> {
    let window = match flavor {
        WindowFlavor::Allocate => Window::allocate(world, size, 1, info),
        WindowFlavor::Create => Window::create(world, &mut lent.as_mut_slice()[..size], 1, info),
    }
    .map_err(|e| format!("making a window of {size} bytes: {e}"))?;
    let inspected = inspect(&window);
    // Freed even when the check failed: the other ranks are freeing it.
    window
        .free()
        .map_err(|e| format!("freeing a window of {size} bytes: {e}"))?;
    inspected
}

/// Whether `window` is what `flavor` and `size` asked for.
fn check(window: &Window<'_>, flavor: WindowFlavor, size: usize) -> Result<(), String> {
    let expected = match flavor {
        WindowFlavor::Allocate => CreateFlavor::Allocate,
        WindowFlavor::Create => CreateFlavor::Create,
    };
    if window.create_flavor() != expected || window.size() != size {
        return Err(format!(
            "the window is {:?} of {} bytes, not {expected:?} of {size}",
            window.create_flavor(),
            window.size()
        ));
    }
    if flavor == WindowFlavor::Allocate {
        let mut memory = vec![1u8; size];
        window
            .read_local(0, &mut memory)
            .map_err(|e| format!("reading the window: {e}"))?;
        if let Some(at) = memory.iter().position(|&b| b != 0) {
            return Err(format!(
                "byte {at} of a newly allocated window is {}, not 0",
                memory[at]
            ));
        }
    }
    Ok(())
}
