//! The collective benchmarks, through oxmpi's public API only, as the OSU
//! micro-benchmarks of the same names time them (`osu_barrier`,
//! `osu_bcast`, `osu_allreduce`, `osu_alltoall`), and the neighbourhood
//! and intercommunicator collectives in the same way:
//!
//! - every rank of the job takes part; the figure is each rank's mean
//!   time per operation, averaged over the ranks (OSU's "Avg Latency");
//! - `barrier`: the timed loop is barriers back to back, and its one row
//!   is size 0;
//! - `bcast` (from rank 0), `allreduce` (the sum of `size / 4` `f32`s)
//!   and `alltoall` (a block of `size` bytes to and from every rank):
//!   each operation is timed alone, and a barrier follows it, untimed, so
//!   that a fast rank does not run ahead into the next one;
//! - `neighbor_allgather` and `neighbor_alltoall`: the same, on a
//!   periodic ring of every rank (a 1-d Cartesian communicator, so the
//!   neighbours are rank - 1 and rank + 1, both the other rank at 2
//!   ranks): `size` bytes to both neighbours, or a block of `size` bytes
//!   to and from each;
//! - `inter_allreduce`: the same as `allreduce` over an intercommunicator
//!   between the first half of the ranks and the rest, where each group
//!   gets the sums of the other group's data.
//!
//! Before each size every rank passes a barrier, buffers are filled, and
//! warm-up operations run untimed. After the timed loop each rank checks
//! what it received (the root's bytes, the exact sums, each sender's
//! block, each neighbour's block).
//!
//! `benches/c/peer_bench.c` has the same patterns against the MPI C API,
//! for `oxbench compare`: a change here is made there too.

use crate::buffers::{check_messages, fill_pattern, AlignedBuf};
use crate::cli::{Benchmark, Options};
use crate::report::{record_rank_mean, StdoutReport};
use oxmpi::collective::SystemOperation;
use oxmpi::{Color, Communicator};

/// The tag of the leaders' messages when `inter_allreduce` makes its
/// intercommunicator.
const INTER_TAG: i32 = 77;

/// Runs the collective `benchmark` in this rank; rank 0 reports.
pub fn run(world: &Communicator, benchmark: Benchmark, options: &Options) -> Result<(), String> {
    let mpi = |what: &'static str| move |e: oxmpi::Error| format!("{what}: {e}");
    let (rank, ranks) = (world.rank() as usize, world.size() as usize);
    let (comm, shape) = communicator(world, benchmark)?;
    let mut report = if rank == 0 {
        let mut notes = vec![
            format!("ranks: {ranks}; {}", crate::mpi_bench::transports_note()),
            options.describe_iterations(),
            "each operation timed alone, then an untimed barrier; the figure is each \
             rank's mean time per operation, averaged over the ranks"
                .to_owned(),
        ];
        notes.extend(shape.map(str::to_owned));
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
                data.operate(&comm, benchmark, size)?;
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
        record_rank_mean(world, report.as_mut(), size, mean_us)?;
    }
    world.barrier().map_err(mpi("barrier at the end"))?;
    if let Some(report) = report {
        report.end()?;
    }
    Ok(())
}

/// The communicator `benchmark` operates on, and a header line that
/// says its shape (none for world itself): a periodic ring of every
/// rank for the neighbourhood collectives, an intercommunicator between
/// the first half of the ranks and the rest for `inter_allreduce`.
fn communicator(
    world: &Communicator,
    benchmark: Benchmark,
) -> Result<(Communicator, Option<&'static str>), String> {
    let (rank, ranks) = (world.rank(), world.size());
    match benchmark {
        Benchmark::NeighborAllGather | Benchmark::NeighborAllToAll => {
            let ring = world
                .create_cartesian_communicator(&[ranks], &[true], false)
                .map_err(|e| format!("making the ring: {e}"))?
                .ok_or("the ring of every rank left this rank out")?;
            Ok((
                ring,
                Some("topology: a periodic ring of every rank (1-d Cartesian); blocks to and from rank - 1 and rank + 1"),
            ))
        }
        Benchmark::InterAllReduce => {
            if ranks < 2 {
                return Err(format!(
                    "inter_allreduce needs 2 or more ranks (two groups), this job has {ranks}"
                ));
            }
            let half = ranks / 2;
            let in_first = rank < half;
            let local = world
                .split_by_color(Color::with_value(i32::from(in_first)))
                .map_err(|e| format!("splitting world in two: {e}"))?
                .ok_or("splitting world in two left this rank out")?;
            let remote_leader = if in_first { half } else { 0 };
            let inter = local
                .create_intercommunicator(0, world, remote_leader, INTER_TAG)
                .map_err(|e| format!("making the intercommunicator: {e}"))?;
            Ok((
                inter,
                Some("groups: ranks below N/2 and the rest, over an intercommunicator; each gets the sums of the other's data"),
            ))
        }
        _ => Ok((world.clone(), None)),
    }
}

/// The ranks whose data this rank's `inter_allreduce` sums: the other
/// group's.
fn other_group(rank: usize, ranks: usize) -> std::ops::Range<usize> {
    let half = ranks / 2;
    if rank < half {
        half..ranks
    } else {
        0..half
    }
}

/// The neighbours of `rank` on the periodic ring of `ranks`, in the
/// order of its blocks: rank - 1, then rank + 1.
fn ring_neighbors(rank: usize, ranks: usize) -> [usize; 2] {
    [(rank + ranks - 1) % ranks, (rank + 1) % ranks]
}

/// The buffers of one collective benchmark, sized for the largest
/// message.
struct Data {
    /// `bcast`: the message; `alltoall` and the neighbourhood ones: the
    /// blocks sent.
    send: AlignedBuf,
    /// `alltoall` and the neighbourhood ones: the blocks received.
    receive: AlignedBuf,
    /// `allreduce` and `inter_allreduce`: the input and the sums.
    floats: Vec<f32>,
    sums: Vec<f32>,
}

impl Data {
    fn new(benchmark: Benchmark, max: usize, ranks: usize) -> Result<Data, String> {
        let floats = max / std::mem::size_of::<f32>();
        let (send, receive, floats) = match benchmark {
            Benchmark::Broadcast => (max, 0, 0),
            Benchmark::AllToAll => {
                let bytes = max.checked_mul(ranks).ok_or("alltoall buffers overflow")?;
                (bytes, bytes, 0)
            }
            Benchmark::NeighborAllGather => (max, 2 * max, 0),
            Benchmark::NeighborAllToAll => (2 * max, 2 * max, 0),
            Benchmark::AllReduce | Benchmark::InterAllReduce => (0, 0, floats),
            _ => (0, 0, 0),
        };
        Ok(Data {
            send: AlignedBuf::new(send)?,
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
            Benchmark::NeighborAllGather => {
                fill_pattern(
                    &mut self.send.as_mut_slice()[..size],
                    block_pattern(size, rank, 0),
                );
                self.receive.as_mut_slice()[..2 * size].fill(0);
            }
            Benchmark::NeighborAllToAll => {
                let blocks = self.send.as_mut_slice()[..2 * size].chunks_mut(size.max(1));
                for (slot, block) in blocks.enumerate() {
                    fill_pattern(block, block_pattern(size, rank, slot));
                }
                self.receive.as_mut_slice()[..2 * size].fill(0);
            }
            Benchmark::AllReduce | Benchmark::InterAllReduce => {
                let count = size / std::mem::size_of::<f32>();
                for (i, x) in self.floats[..count].iter_mut().enumerate() {
                    *x = addend(i, rank);
                }
                self.sums[..count].fill(0.0);
            }
            _ => {}
        }
    }

    /// One operation of `benchmark` on messages of `size` bytes over
    /// `comm` (see [`communicator`]).
    fn operate(
        &mut self,
        comm: &Communicator,
        benchmark: Benchmark,
        size: usize,
    ) -> Result<(), String> {
        let ranks = comm.size() as usize;
        match benchmark {
            Benchmark::Broadcast => comm
                .process_at_rank(0)
                .broadcast_into(&mut self.send.as_mut_slice()[..size])
                .map_err(|e| format!("broadcast: {e}")),
            Benchmark::AllReduce | Benchmark::InterAllReduce => {
                let count = size / std::mem::size_of::<f32>();
                comm.all_reduce_into(
                    &self.floats[..count],
                    &mut self.sums[..count],
                    SystemOperation::sum(),
                )
                .map_err(|e| format!("all_reduce: {e}"))
            }
            Benchmark::AllToAll => comm
                .all_to_all_into(
                    &self.send.as_slice()[..size * ranks],
                    &mut self.receive.as_mut_slice()[..size * ranks],
                )
                .map_err(|e| format!("all_to_all: {e}")),
            Benchmark::NeighborAllGather => comm
                .neighbor_all_gather_into(
                    &self.send.as_slice()[..size],
                    &mut self.receive.as_mut_slice()[..2 * size],
                )
                .map_err(|e| format!("neighbor_all_gather: {e}")),
            Benchmark::NeighborAllToAll => comm
                .neighbor_all_to_all_into(
                    &self.send.as_slice()[..2 * size],
                    &mut self.receive.as_mut_slice()[..2 * size],
                )
                .map_err(|e| format!("neighbor_all_to_all: {e}")),
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
            Benchmark::AllReduce | Benchmark::InterAllReduce => {
                let count = size / std::mem::size_of::<f32>();
                let summed = if benchmark == Benchmark::AllReduce {
                    0..ranks
                } else {
                    other_group(rank, ranks)
                };
                match (0..count).find(|&i| {
                    let exact: f32 = summed.clone().map(|k| addend(i, k)).sum();
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
            Benchmark::NeighborAllGather | Benchmark::NeighborAllToAll => {
                // From rank - 1 comes what it sent to its rank + 1 (its
                // block 1 of an all-to-all), from rank + 1 its block 0.
                let mut expected = vec![0u8; size];
                for (slot, from) in ring_neighbors(rank, ranks).into_iter().enumerate() {
                    let sent = match benchmark {
                        Benchmark::NeighborAllToAll => 1 - slot,
                        _ => 0,
                    };
                    fill_pattern(&mut expected, block_pattern(size, from, sent));
                    let got = &self.receive.as_slice()[slot * size..(slot + 1) * size];
                    check_messages(got, &expected).map_err(|e| {
                        format!("the block from neighbour {slot} (rank {from}): {e}")
                    })?;
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

/// The pattern's start for the `alltoall` block from `from` to `to`, and
/// for the neighbourhood ones' block `to` (0 for the all-gather's) of
/// `from`.
fn block_pattern(size: usize, from: usize, to: usize) -> usize {
    size + 7 * from + 13 * to
}

/// Element `i` of `rank`'s `allreduce` input: small integers, so that
/// sums of them are exact in `f32` in any order.
fn addend(i: usize, rank: usize) -> f32 {
    ((i + rank) % 16) as f32
}
