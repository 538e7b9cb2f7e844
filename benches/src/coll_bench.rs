//! The collective benchmarks, through oxmpi's public API only, as the OSU
//! micro-benchmarks of the same names time them (`osu_barrier`,
//! `osu_bcast`, `osu_allreduce`, `osu_alltoall`):
//!
//! - every rank of the job takes part; the figure is each rank's mean
//!   time per operation, averaged over the ranks (OSU's "Avg Latency");
//! - `barrier`: the timed loop is barriers back to back, and its one row
//!   is size 0;
//! - `bcast` (from rank 0), `allreduce` (the sum of `size / 4` `f32`s)
//!   and `alltoall` (a block of `size` bytes to and from every rank):
//!   each operation is timed alone, and a barrier follows it, untimed, so
//!   that a fast rank does not run ahead into the next one.
//!
//! Before each size every rank passes a barrier, buffers are filled, and
//! warm-up operations run untimed. After the timed loop each rank checks
//! what it received (the root's bytes, the exact sums, each sender's
//! block).
//!
//! `benches/c/peer_bench.c` has the same patterns against the MPI C API,
//! for `oxbench compare`: a change here is made there too.

use crate::buffers::{check_messages, fill_pattern, AlignedBuf};
use crate::cli::{Benchmark, Options};
use crate::report::StdoutReport;
use oxmpi::collective::SystemOperation;
use oxmpi::Communicator;

/// Runs the collective `benchmark` in this rank; rank 0 reports.
pub fn run(world: &Communicator, benchmark: Benchmark, options: &Options) -> Result<(), String> {
    let mpi = |what: &'static str| move |e: oxmpi::Error| format!("{what}: {e}");
    let (rank, ranks) = (world.rank() as usize, world.size() as usize);
    let mut report = if rank == 0 {
        let notes = vec![
            format!("ranks: {ranks}; {}", crate::mpi_bench::transports_note()),
            options.describe_iterations(),
            "each operation timed alone, then an untimed barrier; the figure is each \
             rank's mean time per operation, averaged over the ranks"
                .to_owned(),
        ];
        Some(StdoutReport::to_stdout(
            benchmark,
            "oxmpi",
            notes,
            options.json,
        )?)
    } else {
        None
    };
    let max = options.max_size;
    let mut data = Data::new(benchmark, max, ranks)?;
    for size in options.sizes() {
        let (iterations, warmup) = (options.iterations_for(size), options.warmup_for(size));
        data.prepare(benchmark, size, rank, ranks);
        world.barrier().map_err(mpi("barrier before the size"))?;
        let seconds = if benchmark == Benchmark::Barrier {
            for _ in 0..warmup {
                world.barrier().map_err(mpi("barrier"))?;
            }
            let start = oxmpi::time();
            for _ in 0..iterations {
                world.barrier().map_err(mpi("barrier"))?;
            }
            oxmpi::time() - start
        } else {
            let mut timed = 0.0;
            for i in 0..warmup + iterations {
                let start = oxmpi::time();
                data.operate(world, benchmark, size)?;
                if i >= warmup {
                    timed += oxmpi::time() - start;
                }
                world.barrier().map_err(mpi("barrier between operations"))?;
            }
            timed
        };
        data.check(benchmark, size, rank, ranks)
            .map_err(|e| format!("{}, {size} bytes: {e}", benchmark.name()))?;
        let mean_us = seconds * 1e6 / iterations as f64;
        let root = world.process_at_rank(0);
        if let Some(report) = &mut report {
            let mut sum = 0.0f64;
            root.reduce_into_root(&mean_us, &mut sum, SystemOperation::sum())
                .map_err(mpi("reducing the times"))?;
            report.record(size, &[sum / ranks as f64])?;
        } else {
            root.reduce_into(&mean_us, SystemOperation::sum())
                .map_err(mpi("reducing the times"))?;
        }
    }
    world.barrier().map_err(mpi("barrier at the end"))?;
    if let Some(report) = report {
        report.end()?;
    }
    Ok(())
}

/// The buffers of one collective benchmark, sized for the largest
/// message.
struct Data {
    /// `bcast`: the message; `alltoall`: the blocks sent.
    send: AlignedBuf,
    /// `alltoall`: the blocks received.
    receive: AlignedBuf,
    /// `allreduce`: the input and the sums.
    floats: Vec<f32>,
    sums: Vec<f32>,
}

impl Data {
    fn new(benchmark: Benchmark, max: usize, ranks: usize) -> Result<Data, String> {
        let (bytes, floats) = match benchmark {
            Benchmark::Broadcast => (max, 0),
            Benchmark::AllToAll => (
                max.checked_mul(ranks).ok_or("alltoall buffers overflow")?,
                0,
            ),
            Benchmark::AllReduce => (0, max / std::mem::size_of::<f32>()),
            _ => (0, 0),
        };
        let receive = if benchmark == Benchmark::AllToAll {
            bytes
        } else {
            0
        };
        Ok(Data {
            send: AlignedBuf::new(bytes)?,
            receive: AlignedBuf::new(receive)?,
            floats: vec![0.0; floats],
            sums: vec![0.0; floats],
        })
    }

    /// Fills the buffers for messages of `size` bytes: the root's message
    /// and zeros elsewhere; blocks that name their sender and receiver;
    /// small integers whose sums are exact.
    fn prepare(&mut self, benchmark: Benchmark, size: usize, rank: usize, ranks: usize) {
        match benchmark {
            Benchmark::Broadcast => {
                let message = &mut self.send.as_mut_slice()[..size];
                if rank == 0 {
                    fill_pattern(message, size);
                } else {
                    message.fill(0);
                }
            }
            Benchmark::AllToAll => {
                let blocks = self.send.as_mut_slice()[..size * ranks].chunks_mut(size.max(1));
                for (to, block) in blocks.enumerate() {
                    fill_pattern(block, block_pattern(size, rank, to));
                }
                self.receive.as_mut_slice()[..size * ranks].fill(0);
            }
            Benchmark::AllReduce => {
                let count = size / std::mem::size_of::<f32>();
                for (i, x) in self.floats[..count].iter_mut().enumerate() {
                    *x = addend(i, rank);
                }
                self.sums[..count].fill(0.0);
            }
            _ => {}
        }
    }

    /// One operation of `benchmark` on messages of `size` bytes.
    fn operate(
        &mut self,
        world: &Communicator,
        benchmark: Benchmark,
        size: usize,
    ) -> Result<(), String> {
        let ranks = world.size() as usize;
        match benchmark {
            Benchmark::Broadcast => world
                .process_at_rank(0)
                .broadcast_into(&mut self.send.as_mut_slice()[..size])
                .map_err(|e| format!("broadcast: {e}")),
            Benchmark::AllReduce => {
                let count = size / std::mem::size_of::<f32>();
                world
                    .all_reduce_into(
                        &self.floats[..count],
                        &mut self.sums[..count],
                        SystemOperation::sum(),
                    )
                    .map_err(|e| format!("all_reduce: {e}"))
            }
            Benchmark::AllToAll => world
                .all_to_all_into(
                    &self.send.as_slice()[..size * ranks],
                    &mut self.receive.as_mut_slice()[..size * ranks],
                )
                .map_err(|e| format!("all_to_all: {e}")),
            other => Err(format!("{} is not a collective with data", other.name())),
        }
    }

    /// Checks what the last operation left.
    fn check(
        &mut self,
        benchmark: Benchmark,
        size: usize,
        rank: usize,
        ranks: usize,
    ) -> Result<(), String> {
        match benchmark {
            Benchmark::Broadcast => {
                let mut expected = vec![0u8; size];
                fill_pattern(&mut expected, size);
                check_messages(&self.send.as_slice()[..size], &expected)
            }
            Benchmark::AllReduce => {
                let count = size / std::mem::size_of::<f32>();
                match (0..count).find(|&i| {
                    let exact: f32 = (0..ranks).map(|k| addend(i, k)).sum();
                    self.sums[i] != exact
                }) {
                    None => Ok(()),
                    Some(i) => Err(format!("sum {i} is {}, not the exact sum", self.sums[i])),
                }
            }
            Benchmark::AllToAll => {
                let mut expected = vec![0u8; size];
                for from in 0..ranks {
                    fill_pattern(&mut expected, block_pattern(size, from, rank));
                    let got = &self.receive.as_slice()[from * size..(from + 1) * size];
                    check_messages(got, &expected)
                        .map_err(|e| format!("the block from rank {from}: {e}"))?;
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

/// The pattern's start for the `alltoall` block from `from` to `to`.
fn block_pattern(size: usize, from: usize, to: usize) -> usize {
    size + 7 * from + 13 * to
}

/// Element `i` of `rank`'s `allreduce` input: small integers, so that
/// sums of them are exact in `f32` in any order.
fn addend(i: usize, rank: usize) -> f32 {
    ((i + rank) % 16) as f32
}
