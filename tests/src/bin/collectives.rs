//! Collective operations run as real jobs: `collectives CHECK`, started by
//! the harness through oxrun with 1 to 8 ranks. Every result is compared
//! with a sequential reference that each rank computes alone from the
//! inputs every rank makes (a function of its rank). Sizes sit on both
//! sides of each algorithm switch, plus one large. A check exits non-zero,
//! saying why, when something is wrong.
//!
//! Checks: `data` (every collective, in place and not, with predefined
//! and user-defined operations, commutative and not), `operations` (every
//! predefined operation on every type, `MPI_ERR_OP` on the others,
//! min/max-loc), `mismatch` (processes that pass different counts fail
//! alone and the job goes on), `mismatch_long` (the same of broadcasts
//! long enough to be cut in blocks or streamed through shared memory, at
//! a leaf and at a rank that passes data on), `mismatched_reduction
//! COLLECTIVE COUNT ODD_COUNT ODD_RANK` (a reduction where one rank passes
//! another count, with the fatal error handler: the job must end with the
//! error, not hang), `errors` (the error classes of bad
//! arguments), `large` (gather, scatter, their varying-count forms,
//! all-gather(v) and all-to-all(v, w), blocking and not, with 8 MiB of
//! data each), `datatypes` (derived datatypes and structs in collectives:
//! strided data in and out, padding skipped, gaps left alone),
//! `large_datatypes` (broadcast, all-reduce, all-to-all and gather of
//! strided columns of several MiB, and between strided and contiguous
//! buffers), `pieces_memory` (collectives of 32 MiB of strided data,
//! streamed through shared memory or by messages, add little to the
//! peak memory: the data moves a piece at a time), `bruck_pieces_memory`
//! (3 ranks: many short strided all-gathers,
//! which go by Bruck's algorithm, under way at once add little to the
//! peak memory).

use oxmpi::collective::{
    DynBuffer, DynBufferMut, Partition, PartitionMut, SystemOperation, UserOperation, ValueIndex,
};
use oxmpi::datatype::{MutView, UserDatatype, View};
use oxmpi::request::{scope, wait_all, Request};
use oxmpi::traits::*;
use oxmpi::Threading;
use oxmpi::{Communicator, ErrorClass, ErrorHandler, Result};
use oxmpi_jobs::affine::{affine, composed, composition};
use oxmpi_jobs::checks::{
    ensure, expect_class, fail, first_column_is, same, within_peak_growth, within_pieces_bound,
};
use oxmpi_jobs::program::{run_check, world_returning_errors};
use std::fmt::Debug;
use std::process::ExitCode;

fn main() -> ExitCode {
    let check = std::env::args().nth(1).unwrap_or_default();
    run_check(
        &format!("collectives {check}"),
        Threading::Single,
        |universe| {
            let world = world_returning_errors(universe);
            match check.as_str() {
                "data" => data(&world),
                "operations" => operations(&world),
                "mismatch" => mismatch(&world),
                "mismatch_long" => mismatch_long(&world),
                "mismatched_reduction" => mismatched_reduction(&world),
                "errors" => errors(&world),
                "datatypes" => datatypes(&world),
                "large" => large(&world),
                "large_datatypes" => large_datatypes(&world),
                "pieces_memory" => pieces_memory(&world),
                "bruck_pieces_memory" => bruck_pieces_memory(&world),
                other => Err(fail(format!("unknown check {other:?}"))),
            }
        },
    )
}

/// Byte `i` of rank `rank`'s message `seed`.
fn byte(seed: usize, rank: usize, i: usize) -> u8 {
    let x = (i as u64)
        .wrapping_add((seed as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15))
        .wrapping_add((rank as u64) << 40);
    (x ^ (x >> 7) ^ (x >> 17) ^ (x >> 40)) as u8
}

fn bytes(seed: usize, rank: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| byte(seed, rank, i)).collect()
}

/// Element `i` of rank `rank`'s `u32` data `seed`.
fn word(seed: usize, rank: usize, i: usize) -> u32 {
    (seed as u32).wrapping_mul(1_000_003) ^ ((rank as u32) << 24) ^ (i as u32)
}

fn words(seed: usize, rank: usize, len: usize) -> Vec<u32> {
    (0..len).map(|i| word(seed, rank, i)).collect()
}

/// A small integer for element `i` of rank `rank`: sums and products of
/// up to 8 of them are exact in every type.
fn small(rank: usize, i: usize, signed: bool) -> i64 {
    let v = ((rank * 7 + i * 3) % 5) as i64;
    if signed {
        v - 2
    } else {
        v
    }
}

fn data(world: &Communicator) -> Result<()> {
    barrier(world)?;
    broadcast(world)?;
    gather_and_scatter(world)?;
    gather_and_scatter_varcount(world)?;
    all_gather(world)?;
    all_to_all(world)?;
    reductions(world)?;
    reduce_scatter(world)?;
    scans(world)?;
    Ok(())
}

/// Nobody leaves a barrier before everybody entered it: rank 0 enters
/// late, and every rank leaves after it entered (the ranks share the
/// host's clock).
fn barrier(world: &Communicator) -> Result<()> {
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    };
    for _ in 0..3 {
        world.barrier()?;
    }
    let mut entered = 0u64;
    if world.rank() == 0 {
        std::thread::sleep(std::time::Duration::from_millis(100));
        entered = now();
    }
    world.barrier()?;
    let left = now();
    world.process_at_rank(0).broadcast_into(&mut entered)?;
    ensure(left >= entered, || {
        format!(
            "left the barrier {} us before rank 0 entered it",
            (entered - left) / 1000
        )
    })
}

fn broadcast(world: &Communicator) -> Result<()> {
    let (rank, size) = (world.rank() as usize, world.size() as usize);
    let sizes = [
        0,
        1,
        12 * 1024 - 1,
        12 * 1024,
        12 * 1024 + 5,
        100_000,
        512 * 1024 - 1,
        512 * 1024,
    ];
    for (seed, &len) in sizes.iter().enumerate() {
        for root in 0..size {
            let mut buf = if rank == root {
                bytes(seed, root, len)
            } else {
                vec![0; len]
            };
            world
                .process_at_rank(root as i32)
                .broadcast_into(&mut buf[..])?;
            same(
                &buf,
                &bytes(seed, root, len),
                &format!("broadcast of {len} bytes from {root}"),
            )?;
        }
    }
    // One large broadcast, from a root in the middle.
    let root = size / 2;
    let len = 8 << 20;
    let mut big = if rank == root {
        bytes(99, root, len)
    } else {
        vec![0; len]
    };
    world
        .process_at_rank(root as i32)
        .broadcast_into(&mut big[..])?;
    same(&big, &bytes(99, root, len), "broadcast of 8 MiB")
}

fn gather_and_scatter(world: &Communicator) -> Result<()> {
    let (rank, size) = (world.rank() as usize, world.size() as usize);
    for (seed, &len) in [0usize, 1, 100, 4096, 70_000].iter().enumerate() {
        let everyone: Vec<u8> = (0..size).flat_map(|r| bytes(seed, r, len)).collect();
        for root in 0..size {
            let p = world.process_at_rank(root as i32);
            let mine = bytes(seed, rank, len);
            let what = format!("gather of {len} bytes to {root}");
            if rank == root {
                let mut all = vec![0u8; len * size];
                p.gather_into_root(&mine[..], &mut all[..])?;
                same(&all, &everyone, &what)?;
            } else {
                p.gather_into(&mine[..])?;
            }
            // In place: the root's block is already where it goes.
            if rank == root {
                let mut all = vec![0u8; len * size];
                all[root * len..(root + 1) * len].copy_from_slice(&mine);
                p.gather_into_root_in_place(&mut all[..])?;
                same(&all, &everyone, &format!("in-place {what}"))?;
            } else {
                p.gather_into(&mine[..])?;
            }
            let what = format!("scatter of {len} bytes from {root}");
            let mut got = vec![0u8; len];
            if rank == root {
                p.scatter_into_root(&everyone[..], &mut got[..])?;
            } else {
                p.scatter_into(&mut got[..])?;
            }
            same(&got, &bytes(seed, rank, len), &what)?;
            if rank == root {
                p.scatter_into_root_in_place(&everyone[..])?;
            } else {
                let mut got = vec![0u8; len];
                p.scatter_into(&mut got[..])?;
                same(&got, &bytes(seed, rank, len), &format!("in-place {what}"))?;
            }
        }
    }
    Ok(())
}

/// Bytes of data in all of each collective of [`large`].
const LARGE: usize = 8 << 20;

/// Words rank `from` sends rank `to` in [`large`]'s all-to-allv and
/// all-to-allw: a third, two thirds or all of an even share, so that a
/// process sends about `LARGE` bytes in all.
fn large_pair_count(size: usize, from: usize, to: usize) -> usize {
    LARGE / 4 / size * (1 + (from + 2 * to) % 3) / 2
}

/// `start`'s request, waited for at once.
fn waited(start: Result<Request<'_>>) -> Result<()> {
    start?.wait().map(drop)
}

/// The collectives that move blocks between processes, with 8 MiB of
/// data in all, blocking and (`immediate`) non-blocking, against the
/// reference: gather, scatter, their varying-count forms, all-gather(v)
/// and all-to-all(v, w); broadcast and the reductions reach 8 MiB in
/// `data`. The root is the last rank. Run at 2 and 3 ranks: it is the
/// size that it checks, and `data` the rank counts.
fn large(world: &Communicator) -> Result<()> {
    let (rank, size) = (world.rank() as usize, world.size() as usize);
    let root = world.process_at_rank(size as i32 - 1);
    let at_root = rank + 1 == size;
    // Equal blocks of LARGE / size bytes.
    let len = LARGE / size;
    let everyone: Vec<u8> = (0..size).flat_map(|r| bytes(40, r, len)).collect();
    let mine = &everyone[rank * len..(rank + 1) * len];
    // Varying blocks, in reverse rank order with gaps: rank r's holds
    // r + 1 shares of LARGE / 4 words.
    let share = LARGE / 4 / (size * (size + 1) / 2);
    let counts: Vec<i32> = (0..size).map(|r| ((r + 1) * share) as i32).collect();
    let (displs, varying_len) = reversed_layout(&counts);
    let mut varying = vec![0u32; varying_len];
    for r in 0..size {
        let at = displs[r] as usize;
        varying[at..at + counts[r] as usize].copy_from_slice(&words(41, r, counts[r] as usize));
    }
    let my_words = words(41, rank, counts[rank] as usize);
    // All-to-all blocks of LARGE / size bytes: block `to` of rank
    // `from`'s data is seeded with both.
    let block = |from: usize, to: usize| bytes(42 * 64 + to, from, len);
    let to_all: Vec<u8> = (0..size).flat_map(|to| block(rank, to)).collect();
    let from_all: Vec<u8> = (0..size).flat_map(|from| block(from, rank)).collect();
    // All-to-allv and -w blocks of varying counts.
    let (send_counts, recv_counts) =
        all_to_all_counts(rank, size, |from, to| large_pair_count(size, from, to));
    let pair_words =
        |from: usize, to: usize| words(43 * 64 + to, from, large_pair_count(size, from, to));
    let sends: Vec<Vec<u32>> = (0..size).map(|to| pair_words(rank, to)).collect();
    let expected_w: Vec<Vec<u32>> = (0..size).map(|from| pair_words(from, rank)).collect();
    let (send_displs, send_len) = reversed_layout(&send_counts);
    let (recv_displs, recv_len) = reversed_layout(&recv_counts);
    let mut send_v = vec![0u32; send_len];
    let mut expected_v = vec![0u32; recv_len];
    for p in 0..size {
        let at = send_displs[p] as usize;
        send_v[at..at + sends[p].len()].copy_from_slice(&sends[p]);
        let at = recv_displs[p] as usize;
        expected_v[at..at + expected_w[p].len()].copy_from_slice(&expected_w[p]);
    }
    for immediate in [false, true] {
        let form = if immediate { "non-blocking " } else { "" };
        let what = |name: &str| format!("{form}{name} of 8 MiB");

        let mut all = vec![0u8; len * size];
        match (at_root, immediate) {
            (true, false) => root.gather_into_root(mine, &mut all[..])?,
            (true, true) => {
                scope(|s| waited(root.immediate_gather_into_root(s, mine, &mut all[..])))?
            }
            (false, false) => root.gather_into(mine)?,
            (false, true) => scope(|s| waited(root.immediate_gather_into(s, mine)))?,
        }
        if at_root {
            same(&all, &everyone, &what("gather"))?;
        }

        let mut got = vec![0u8; len];
        match (at_root, immediate) {
            (true, false) => root.scatter_into_root(&everyone[..], &mut got[..])?,
            (true, true) => {
                scope(|s| waited(root.immediate_scatter_into_root(s, &everyone[..], &mut got[..])))?
            }
            (false, false) => root.scatter_into(&mut got[..])?,
            (false, true) => scope(|s| waited(root.immediate_scatter_into(s, &mut got[..])))?,
        }
        same(&got, mine, &what("scatter"))?;

        let mut all = vec![0u32; varying_len];
        match (at_root, immediate) {
            (true, false) => root.gather_varcount_into_root(
                &my_words[..],
                &mut PartitionMut::new(&mut all[..], &counts[..], &displs[..]),
            )?,
            (true, true) => scope(|s| {
                let partition = PartitionMut::new(&mut all[..], &counts[..], &displs[..]);
                waited(root.immediate_gather_varcount_into_root(s, &my_words[..], partition))
            })?,
            (false, false) => root.gather_varcount_into(&my_words[..])?,
            (false, true) => {
                scope(|s| waited(root.immediate_gather_varcount_into(s, &my_words[..])))?
            }
        }
        if at_root {
            same(&all, &varying, &what("gatherv"))?;
        }

        let mut got = vec![0u32; counts[rank] as usize];
        match (at_root, immediate) {
            (true, false) => root.scatter_varcount_into_root(
                &Partition::new(&varying[..], &counts[..], &displs[..]),
                &mut got[..],
            )?,
            (true, true) => scope(|s| {
                let partition = Partition::new(&varying[..], &counts[..], &displs[..]);
                waited(root.immediate_scatter_varcount_into_root(s, partition, &mut got[..]))
            })?,
            (false, false) => root.scatter_varcount_into(&mut got[..])?,
            (false, true) => {
                scope(|s| waited(root.immediate_scatter_varcount_into(s, &mut got[..])))?
            }
        }
        same(&got, &my_words, &what("scatterv"))?;

        let mut all = vec![0u8; len * size];
        if immediate {
            scope(|s| waited(world.immediate_all_gather_into(s, mine, &mut all[..])))?;
        } else {
            world.all_gather_into(mine, &mut all[..])?;
        }
        same(&all, &everyone, &what("all-gather"))?;

        let mut all = vec![0u32; varying_len];
        if immediate {
            scope(|s| {
                let partition = PartitionMut::new(&mut all[..], &counts[..], &displs[..]);
                waited(world.immediate_all_gather_varcount_into(s, &my_words[..], partition))
            })?;
        } else {
            world.all_gather_varcount_into(
                &my_words[..],
                &mut PartitionMut::new(&mut all[..], &counts[..], &displs[..]),
            )?;
        }
        same(&all, &varying, &what("all-gatherv"))?;

        let mut recv = vec![0u8; len * size];
        if immediate {
            scope(|s| waited(world.immediate_all_to_all_into(s, &to_all[..], &mut recv[..])))?;
        } else {
            world.all_to_all_into(&to_all[..], &mut recv[..])?;
        }
        same(&recv, &from_all, &what("all-to-all"))?;

        let mut recv = vec![0u32; recv_len];
        if immediate {
            scope(|s| {
                let send = Partition::new(&send_v[..], &send_counts[..], &send_displs[..]);
                let recv = PartitionMut::new(&mut recv[..], &recv_counts[..], &recv_displs[..]);
                waited(world.immediate_all_to_all_varcount_into(s, send, recv))
            })?;
        } else {
            world.all_to_all_varcount_into(
                &Partition::new(&send_v[..], &send_counts[..], &send_displs[..]),
                &mut PartitionMut::new(&mut recv[..], &recv_counts[..], &recv_displs[..]),
            )?;
        }
        same(&recv, &expected_v, &what("all-to-allv"))?;

        let mut recvs: Vec<Vec<u32>> = expected_w.iter().map(|b| vec![0; b.len()]).collect();
        let send_blocks: Vec<&dyn Buffer> = sends.iter().map(|b| b as &dyn Buffer).collect();
        let mut recv_blocks: Vec<&mut dyn BufferMut> =
            recvs.iter_mut().map(|b| b as &mut dyn BufferMut).collect();
        if immediate {
            scope(|s| {
                waited(world.immediate_all_to_all_w_into(s, &send_blocks, &mut recv_blocks))
            })?;
        } else {
            world.all_to_all_w_into(&send_blocks, &mut recv_blocks)?;
        }
        same(&recvs.concat(), &expected_w.concat(), &what("all-to-allw"))?;
    }
    Ok(())
}

/// Counts of varying blocks: rank `r`'s block holds `varying(r) * scale`
/// elements (some empty).
fn varying(rank: usize, scale: usize) -> usize {
    (rank * 37 + 5) % 11 * scale
}

/// Displacements of blocks of `counts` laid out in reverse rank order
/// with a gap of 3 elements after each; and the length they need.
fn reversed_layout(counts: &[i32]) -> (Vec<i32>, usize) {
    let mut displs = vec![0; counts.len()];
    let mut at = 0;
    for r in (0..counts.len()).rev() {
        displs[r] = at;
        at += counts[r] + 3;
    }
    (displs, at as usize)
}

fn gather_and_scatter_varcount(world: &Communicator) -> Result<()> {
    let (rank, size) = (world.rank() as usize, world.size() as usize);
    for scale in [1, 3000] {
        let counts: Vec<i32> = (0..size).map(|r| varying(r, scale) as i32).collect();
        let (displs, len) = reversed_layout(&counts);
        // The root's buffer as it should end: every block in place, the
        // gaps as they were (zero).
        let mut expected = vec![0u32; len];
        for r in 0..size {
            let at = displs[r] as usize;
            expected[at..at + counts[r] as usize].copy_from_slice(&words(
                scale,
                r,
                counts[r] as usize,
            ));
        }
        let mine = words(scale, rank, counts[rank] as usize);
        for root in 0..size {
            let p = world.process_at_rank(root as i32);
            let what = format!("gatherv (scale {scale}) to {root}");
            if rank == root {
                let mut all = vec![0u32; len];
                let mut partition = PartitionMut::new(&mut all[..], &counts[..], &displs[..]);
                p.gather_varcount_into_root(&mine[..], &mut partition)?;
                same(&all, &expected, &what)?;
                let mut all = vec![0u32; len];
                let at = displs[root] as usize;
                all[at..at + mine.len()].copy_from_slice(&mine);
                let mut partition = PartitionMut::new(&mut all[..], counts.clone(), displs.clone());
                p.gather_varcount_into_root_in_place(&mut partition)?;
                same(&all, &expected, &format!("in-place {what}"))?;
            } else {
                p.gather_varcount_into(&mine[..])?;
                p.gather_varcount_into(&mine[..])?;
            }
            let what = format!("scatterv (scale {scale}) from {root}");
            let mut got = vec![0u32; counts[rank] as usize];
            if rank == root {
                let partition = Partition::new(&expected[..], &counts[..], &displs[..]);
                p.scatter_varcount_into_root(&partition, &mut got[..])?;
                p.scatter_varcount_into_root_in_place(&partition)?;
            } else {
                p.scatter_varcount_into(&mut got[..])?;
                let mut again = vec![0u32; counts[rank] as usize];
                p.scatter_varcount_into(&mut again[..])?;
                same(&again, &mine, &format!("in-place {what}"))?;
            }
            same(&got, &mine, &what)?;
        }
    }
    Ok(())
}

fn all_gather(world: &Communicator) -> Result<()> {
    let (rank, size) = (world.rank() as usize, world.size() as usize);
    // Totals below and above 80 KiB and 512 KiB, whatever the size.
    let blocks = [
        0,
        8,
        1000,
        80 * 1024 / size + 64,
        512 * 1024 / size + 64,
        (4 << 20) / size,
    ];
    for (seed, &len) in blocks.iter().enumerate() {
        let everyone: Vec<u8> = (0..size).flat_map(|r| bytes(seed, r, len)).collect();
        let mine = bytes(seed, rank, len);
        let mut all = vec![0u8; len * size];
        world.all_gather_into(&mine[..], &mut all[..])?;
        same(&all, &everyone, &format!("all-gather of {len}-byte blocks"))?;
        let mut all = vec![0u8; len * size];
        all[rank * len..(rank + 1) * len].copy_from_slice(&mine);
        world.all_gather_in_place(&mut all[..])?;
        same(
            &all,
            &everyone,
            &format!("in-place all-gather of {len}-byte blocks"),
        )?;
    }
    for scale in [1, 2000] {
        let counts: Vec<i32> = (0..size).map(|r| varying(r, scale) as i32).collect();
        let (displs, len) = reversed_layout(&counts);
        let mut expected = vec![0u32; len];
        for r in 0..size {
            let at = displs[r] as usize;
            expected[at..at + counts[r] as usize].copy_from_slice(&words(
                scale,
                r,
                counts[r] as usize,
            ));
        }
        let mine = words(scale, rank, counts[rank] as usize);
        let mut all = vec![0u32; len];
        world.all_gather_varcount_into(
            &mine[..],
            &mut PartitionMut::new(&mut all[..], &counts[..], &displs[..]),
        )?;
        same(&all, &expected, &format!("all-gatherv (scale {scale})"))?;
        let mut all = vec![0u32; len];
        let at = displs[rank] as usize;
        all[at..at + mine.len()].copy_from_slice(&mine);
        world.all_gather_varcount_in_place(&mut PartitionMut::new(
            &mut all[..],
            &counts[..],
            &displs[..],
        ))?;
        same(
            &all,
            &expected,
            &format!("in-place all-gatherv (scale {scale})"),
        )?;
    }
    Ok(())
}

/// The counts `rank` sends to and receives from each process in an
/// all-to-all of varying counts, where `count(from, to)` elements go from
/// `from` to `to`.
fn all_to_all_counts(
    rank: usize,
    size: usize,
    count: impl Fn(usize, usize) -> usize,
) -> (Vec<i32>, Vec<i32>) {
    let send = (0..size).map(|to| count(rank, to) as i32).collect();
    let recv = (0..size).map(|from| count(from, rank) as i32).collect();
    (send, recv)
}

/// Elements rank `from` sends rank `to` in the all-to-all of varying
/// counts.
fn pair_count(from: usize, to: usize, scale: usize) -> usize {
    (from * 3 + to * 5) % 7 * scale
}

fn all_to_all(world: &Communicator) -> Result<()> {
    let (rank, size) = (world.rank() as usize, world.size() as usize);
    // Block `to` of rank `from`'s data is seeded with both.
    let block = |seed: usize, from: usize, to: usize, len: usize| bytes(seed * 64 + to, from, len);
    // Blocks in a shared-memory cell, beyond it (streamed through the
    // staging areas, in one piece and in many), and beyond a ring.
    let long = if size <= 4 { 1 << 20 } else { 300_001 };
    for (seed, &len) in [0usize, 4, 1000, 32 * 1024 - 4, 32 * 1024, 100_000, long]
        .iter()
        .enumerate()
    {
        let send: Vec<u8> = (0..size)
            .flat_map(|to| block(seed, rank, to, len))
            .collect();
        let expected: Vec<u8> = (0..size)
            .flat_map(|from| block(seed, from, rank, len))
            .collect();
        let mut recv = vec![0u8; len * size];
        world.all_to_all_into(&send[..], &mut recv[..])?;
        same(
            &recv,
            &expected,
            &format!("all-to-all of {len}-byte blocks"),
        )?;
        let mut buf = send.clone();
        world.all_to_all_in_place(&mut buf[..])?;
        same(
            &buf,
            &expected,
            &format!("in-place all-to-all of {len}-byte blocks"),
        )?;
    }
    for scale in [1, 5000] {
        let (send_counts, recv_counts) =
            all_to_all_counts(rank, size, |from, to| pair_count(from, to, scale));
        let (send_displs, send_len) = reversed_layout(&send_counts);
        let (recv_displs, recv_len) = reversed_layout(&recv_counts);
        let mut send = vec![0u32; send_len];
        for to in 0..size {
            let at = send_displs[to] as usize;
            let n = send_counts[to] as usize;
            send[at..at + n].copy_from_slice(&words(scale * 64 + to, rank, n));
        }
        let mut expected = vec![0u32; recv_len];
        for from in 0..size {
            let at = recv_displs[from] as usize;
            let n = recv_counts[from] as usize;
            expected[at..at + n].copy_from_slice(&words(scale * 64 + rank, from, n));
        }
        let mut recv = vec![0u32; recv_len];
        world.all_to_all_varcount_into(
            &Partition::new(&send[..], &send_counts[..], &send_displs[..]),
            &mut PartitionMut::new(&mut recv[..], &recv_counts[..], &recv_displs[..]),
        )?;
        same(&recv, &expected, &format!("all-to-allv (scale {scale})"))?;
    }
    // In place, the counts to and from each process are the same: a
    // symmetric count.
    let counts: Vec<i32> = (0..size).map(|p| ((p + rank) % 4 * 100) as i32).collect();
    let (displs, len) = reversed_layout(&counts);
    let mut buf = vec![0u32; len];
    let mut expected = vec![0u32; len];
    for p in 0..size {
        let (at, n) = (displs[p] as usize, counts[p] as usize);
        buf[at..at + n].copy_from_slice(&words(7 * 64 + p, rank, n));
        expected[at..at + n].copy_from_slice(&words(7 * 64 + rank, p, n));
    }
    world.all_to_all_varcount_in_place(&mut PartitionMut::new(
        &mut buf[..],
        &counts[..],
        &displs[..],
    ))?;
    same(&buf, &expected, "in-place all-to-allv")?;
    // All-to-allw: to even ranks u16 values, to odd ones f64 values.
    let sends_u16: Vec<Vec<u16>> = (0..size)
        .map(|to| {
            (0..pair_count(rank, to, 10))
                .map(|i| (rank * 1000 + to * 10 + i) as u16)
                .collect()
        })
        .collect();
    let sends_f64: Vec<Vec<f64>> = (0..size)
        .map(|to| {
            (0..pair_count(rank, to, 10))
                .map(|i| (rank * 1000 + to * 10 + i) as f64 + 0.5)
                .collect()
        })
        .collect();
    let sends: Vec<&dyn Buffer> = (0..size)
        .map(|to| -> &dyn Buffer {
            if to % 2 == 0 {
                &sends_u16[to]
            } else {
                &sends_f64[to]
            }
        })
        .collect();
    let n_from = |from: usize| pair_count(from, rank, 10);
    let mut recv_u16: Vec<Vec<u16>> = (0..size).map(|from| vec![0; n_from(from)]).collect();
    let mut recv_f64: Vec<Vec<f64>> = (0..size).map(|from| vec![0.0; n_from(from)]).collect();
    {
        let mut recvs: Vec<&mut dyn BufferMut> = if rank % 2 == 0 {
            recv_u16
                .iter_mut()
                .map(|v| v as &mut dyn BufferMut)
                .collect()
        } else {
            recv_f64
                .iter_mut()
                .map(|v| v as &mut dyn BufferMut)
                .collect()
        };
        world.all_to_all_w_into(&sends, &mut recvs)?;
    }
    for from in 0..size {
        let values = (0..n_from(from)).map(|i| from * 1000 + rank * 10 + i);
        if rank % 2 == 0 {
            same(
                &recv_u16[from],
                &values.map(|v| v as u16).collect::<Vec<_>>(),
                "all-to-allw u16",
            )?;
        } else {
            same(
                &recv_f64[from],
                &values.map(|v| v as f64 + 0.5).collect::<Vec<_>>(),
                "all-to-allw f64",
            )?;
        }
    }
    Ok(())
}

fn sum_i64(ranks: std::ops::Range<usize>, count: usize) -> Vec<i64> {
    (0..count)
        .map(|i| ranks.clone().map(|r| (r * 1000 + i) as i64).sum())
        .collect()
}

fn reductions(world: &Communicator) -> Result<()> {
    let (rank, size) = (world.rank() as usize, world.size() as usize);
    let sum = SystemOperation::sum();
    // A sum written by the program: commutative, so the long algorithms
    // apply to it too.
    let user_sum = UserOperation::commutative(|input, inout| {
        let input: &[i64] = input.downcast().expect("i64 elements");
        let inout: &mut [i64] = inout.downcast().expect("i64 elements");
        for (a, b) in input.iter().zip(inout) {
            *b += a;
        }
    });
    let compose_op = composition();
    // Counts of 8-byte elements on both sides of 2048 bytes, and one of
    // 1 MiB.
    for count in [0, 1, 256, 257, 1000, 1 << 17] {
        let mine: Vec<i64> = (0..count).map(|i| (rank * 1000 + i) as i64).collect();
        let expected = sum_i64(0..size, count);
        let roots: Vec<usize> = if count > 1000 {
            vec![size - 1]
        } else {
            (0..size).collect()
        };
        for &root in &roots {
            let p = world.process_at_rank(root as i32);
            let what = format!("reduce of {count} i64 to {root}");
            if rank == root {
                let mut got = vec![0i64; count];
                p.reduce_into_root(&mine[..], &mut got[..], sum)?;
                same(&got, &expected, &what)?;
                let mut got = vec![0i64; count];
                p.reduce_into_root(&mine[..], &mut got[..], &user_sum)?;
                same(&got, &expected, &format!("{what} (user sum)"))?;
                let mut buf = mine.clone();
                p.reduce_into_root_in_place(&mut buf[..], sum)?;
                same(&buf, &expected, &format!("in-place {what}"))?;
            } else {
                p.reduce_into(&mine[..], sum)?;
                p.reduce_into(&mine[..], &user_sum)?;
                p.reduce_into(&mine[..], sum)?;
            }
        }
        let mut got = vec![0i64; count];
        world.all_reduce_into(&mine[..], &mut got[..], sum)?;
        same(&got, &expected, &format!("all-reduce of {count} i64"))?;
        let mut got = vec![0i64; count];
        world.all_reduce_into(&mine[..], &mut got[..], &user_sum)?;
        same(
            &got,
            &expected,
            &format!("all-reduce of {count} i64 (user sum)"),
        )?;
        let mut buf = mine.clone();
        world.all_reduce_in_place(&mut buf[..], sum)?;
        same(
            &buf,
            &expected,
            &format!("in-place all-reduce of {count} i64"),
        )?;
    }
    // A large all-reduce of floating-point numbers (exact: small integers).
    let count = 1 << 20;
    let mine: Vec<f64> = (0..count).map(|i| ((rank + i) % 17) as f64).collect();
    let expected: Vec<f64> = (0..count)
        .map(|i| (0..size).map(|r| ((r + i) % 17) as f64).sum())
        .collect();
    let mut got = vec![0f64; count];
    world.all_reduce_into(&mine[..], &mut got[..], sum)?;
    same(&got, &expected, "all-reduce of 8 MiB of f64")?;
    let mut buf = mine.clone();
    world.all_reduce_in_place(&mut buf[..], sum)?;
    same(&buf, &expected, "in-place all-reduce of 8 MiB of f64")?;
    let p = world.process_at_rank(0);
    if rank == 0 {
        let mut got = vec![0f64; count];
        p.reduce_into_root(&mine[..], &mut got[..], sum)?;
        same(&got, &expected, "reduce of 8 MiB of f64")?;
    } else {
        p.reduce_into(&mine[..], sum)?;
    }
    // Not commutative: combined in rank order, whatever the root (the
    // all-reduce of 3 MiB long enough to go between the processes'
    // buffers by single copies).
    let count = 3 << 18;
    let mine: Vec<u32> = (0..count).map(|i| affine(rank, i)).collect();
    let mut got = vec![0u32; count];
    world.all_reduce_into(&mine[..], &mut got[..], &compose_op)?;
    same(
        &got,
        &composed(0..size, count),
        "non-commutative all-reduce of 3 MiB",
    )?;
    for count in [1, 100, 600, 20_000] {
        let mine: Vec<u32> = (0..count).map(|i| affine(rank, i)).collect();
        let expected = composed(0..size, count);
        for root in [0, size - 1, size / 2] {
            let p = world.process_at_rank(root as i32);
            if rank == root {
                let mut got = vec![0u32; count];
                p.reduce_into_root(&mine[..], &mut got[..], &compose_op)?;
                same(
                    &got,
                    &expected,
                    &format!("non-commutative reduce of {count} to {root}"),
                )?;
            } else {
                p.reduce_into(&mine[..], &compose_op)?;
            }
        }
        let mut got = vec![0u32; count];
        world.all_reduce_into(&mine[..], &mut got[..], &compose_op)?;
        same(
            &got,
            &expected,
            &format!("non-commutative all-reduce of {count}"),
        )?;
    }
    Ok(())
}

fn reduce_scatter(world: &Communicator) -> Result<()> {
    let (rank, size) = (world.rank() as usize, world.size() as usize);
    let compose_op = composition();
    // 150 000 `i64`s a block take two rounds of the pairwise exchange,
    // and the non-commutative ones (`u32`s) several segments from two
    // ranks on.
    for block in [0, 1, 100, 50_000, 150_000] {
        let total = block * size;
        let mine: Vec<i64> = (0..total).map(|i| (rank * 1000 + i) as i64).collect();
        let expected = sum_i64(0..size, total)[rank * block..(rank + 1) * block].to_vec();
        let mut got = vec![0i64; block];
        world.reduce_scatter_block_into(&mine[..], &mut got[..], SystemOperation::sum())?;
        same(&got, &expected, &format!("reduce-scatter-block of {block}"))?;
        let mut buf = mine.clone();
        world.reduce_scatter_block_in_place(&mut buf[..], SystemOperation::sum())?;
        same(
            &buf[..block],
            &expected,
            &format!("in-place reduce-scatter-block of {block}"),
        )?;
        let mine: Vec<u32> = (0..total).map(|i| affine(rank, i)).collect();
        let expected = composed(0..size, total)[rank * block..(rank + 1) * block].to_vec();
        let mut got = vec![0u32; block];
        world.reduce_scatter_block_into(&mine[..], &mut got[..], &compose_op)?;
        same(
            &got,
            &expected,
            &format!("non-commutative reduce-scatter-block of {block}"),
        )?;
    }
    for scale in [1, 4000, 40_000] {
        let counts: Vec<i32> = (0..size).map(|r| varying(r, scale) as i32).collect();
        let total: usize = counts.iter().map(|&c| c as usize).sum();
        let start: usize = counts[..rank].iter().map(|&c| c as usize).sum();
        let mine_len = counts[rank] as usize;
        let input: Vec<i64> = (0..total).map(|i| (rank * 1000 + i) as i64).collect();
        let expected = sum_i64(0..size, total)[start..start + mine_len].to_vec();
        let mut got = vec![0i64; mine_len];
        world.reduce_scatter_into(&input[..], &mut got[..], &counts, SystemOperation::sum())?;
        same(&got, &expected, &format!("reduce-scatter (scale {scale})"))?;
        let mut buf = input.clone();
        world.reduce_scatter_in_place(&mut buf[..], &counts, SystemOperation::sum())?;
        same(
            &buf[..mine_len],
            &expected,
            &format!("in-place reduce-scatter (scale {scale})"),
        )?;
        let input: Vec<u32> = (0..total).map(|i| affine(rank, i)).collect();
        let expected = composed(0..size, total)[start..start + mine_len].to_vec();
        let mut got = vec![0u32; mine_len];
        world.reduce_scatter_into(&input[..], &mut got[..], &counts, &compose_op)?;
        same(
            &got,
            &expected,
            &format!("non-commutative reduce-scatter (scale {scale})"),
        )?;
    }
    Ok(())
}

fn scans(world: &Communicator) -> Result<()> {
    let (rank, size) = (world.rank() as usize, world.size() as usize);
    let compose_op = composition();
    let _ = size;
    // 131 072 `i64`s are one whole segment of 1 MiB (and an empty one),
    // 300 000 three segments.
    for count in [0, 1, 1000, 100_000, 131_072, 300_000] {
        let mine: Vec<i64> = (0..count).map(|i| (rank * 1000 + i) as i64).collect();
        let inclusive = sum_i64(0..rank + 1, count);
        let mut got = vec![0i64; count];
        world.scan_into(&mine[..], &mut got[..], SystemOperation::sum())?;
        same(&got, &inclusive, &format!("scan of {count}"))?;
        let mut buf = mine.clone();
        world.scan_in_place(&mut buf[..], SystemOperation::sum())?;
        same(&buf, &inclusive, &format!("in-place scan of {count}"))?;
        // Rank 0's result of an exclusive scan is left as it was.
        let exclusive = if rank == 0 {
            vec![-7i64; count]
        } else {
            sum_i64(0..rank, count)
        };
        let mut got = vec![-7i64; count];
        world.exclusive_scan_into(&mine[..], &mut got[..], SystemOperation::sum())?;
        same(&got, &exclusive, &format!("exclusive scan of {count}"))?;
        let mut buf = mine.clone();
        world.exclusive_scan_in_place(&mut buf[..], SystemOperation::sum())?;
        if rank > 0 {
            same(
                &buf,
                &exclusive,
                &format!("in-place exclusive scan of {count}"),
            )?;
        }
        let mine: Vec<u32> = (0..count).map(|i| affine(rank, i)).collect();
        let mut got = vec![0u32; count];
        world.scan_into(&mine[..], &mut got[..], &compose_op)?;
        same(
            &got,
            &composed(0..rank + 1, count),
            &format!("non-commutative scan of {count}"),
        )?;
        let mut got = vec![0u32; count];
        world.exclusive_scan_into(&mine[..], &mut got[..], &compose_op)?;
        if rank > 0 {
            same(
                &got,
                &composed(0..rank, count),
                &format!("non-commutative exclusive scan of {count}"),
            )?;
        }
    }
    Ok(())
}

/// The predefined operations by name, with what they compute on the small
/// integers of `small` (in `i128`, which every type's values fit; the
/// result is then taken into the type as it wraps).
/// A predefined operation: its name, its constructor, and what it
/// computes on two values.
type Case = (
    &'static str,
    fn() -> SystemOperation,
    fn(i128, i128) -> i128,
);

const OPERATIONS: [Case; 10] = [
    ("max", SystemOperation::max, |a, b| a.max(b)),
    ("min", SystemOperation::min, |a, b| a.min(b)),
    ("sum", SystemOperation::sum, |a, b| a.wrapping_add(b)),
    ("product", SystemOperation::product, |a, b| {
        a.wrapping_mul(b)
    }),
    ("logical and", SystemOperation::logical_and, |a, b| {
        i128::from(a != 0 && b != 0)
    }),
    ("logical or", SystemOperation::logical_or, |a, b| {
        i128::from(a != 0 || b != 0)
    }),
    ("logical xor", SystemOperation::logical_xor, |a, b| {
        i128::from((a != 0) != (b != 0))
    }),
    ("bitwise and", SystemOperation::bitwise_and, |a, b| a & b),
    ("bitwise or", SystemOperation::bitwise_or, |a, b| a | b),
    ("bitwise xor", SystemOperation::bitwise_xor, |a, b| a ^ b),
];

/// A type the operations are checked on.
trait Value: Equivalence + PartialEq + Debug {
    const SIGNED: bool;
    /// Whether it is an integer (else floating point: only the first four
    /// operations apply).
    const INTEGER: bool;
    fn from_i128(v: i128) -> Self;
}

macro_rules! values {
    ($($t:ty: $signed:expr, $integer:expr;)*) => {$(
        impl Value for $t {
            const SIGNED: bool = $signed;
            const INTEGER: bool = $integer;
            fn from_i128(v: i128) -> $t {
                v as $t
            }
        }
    )*};
}

values! {
    i8: true, true; i16: true, true; i32: true, true; i64: true, true; i128: true, true;
    isize: true, true; u8: false, true; u16: false, true; u32: false, true; u64: false, true;
    u128: false, true; usize: false, true; f32: true, false; f64: true, false;
}

/// Every predefined operation on `T`, all-reduced and reduced to the last
/// rank, against the reference; `MPI_ERR_OP` where the standard does not
/// define it.
fn every_operation<T: Value>(world: &Communicator) -> Result<()> {
    let (rank, size) = (world.rank() as usize, world.size() as usize);
    const COUNT: usize = 13;
    let mine: Vec<T> = (0..COUNT)
        .map(|i| T::from_i128(small(rank, i, T::SIGNED).into()))
        .collect();
    for (k, (name, op, apply)) in OPERATIONS.iter().enumerate() {
        let what = format!("{name} on {}", std::any::type_name::<T>());
        let mut got: Vec<T> = (0..COUNT).map(|_| T::from_i128(0)).collect();
        let result = world.all_reduce_into(&mine[..], &mut got[..], op());
        if !T::INTEGER && k >= 4 {
            expect_class(result, ErrorClass::Op, &what)?;
            continue;
        }
        result?;
        let expected: Vec<T> = (0..COUNT)
            .map(|i| {
                let values = (0..size).map(|r| i128::from(small(r, i, T::SIGNED)));
                T::from_i128(values.reduce(apply).unwrap_or(0))
            })
            .collect();
        same(&got, &expected, &what)?;
        let root = world.process_at_rank(size as i32 - 1);
        if rank == size - 1 {
            let mut got: Vec<T> = (0..COUNT).map(|_| T::from_i128(0)).collect();
            root.reduce_into_root(&mine[..], &mut got[..], op())?;
            same(&got, &expected, &format!("reduce of {what}"))?;
        } else {
            root.reduce_into(&mine[..], op())?;
        }
    }
    for op in [SystemOperation::min_loc(), SystemOperation::max_loc()] {
        let mut got: Vec<T> = (0..COUNT).map(|_| T::from_i128(0)).collect();
        let result = world.all_reduce_into(&mine[..], &mut got[..], op);
        expect_class(
            result,
            ErrorClass::Op,
            &format!("{op:?} on {}", std::any::type_name::<T>()),
        )?;
    }
    Ok(())
}

fn operations(world: &Communicator) -> Result<()> {
    every_operation::<i8>(world)?;
    every_operation::<i16>(world)?;
    every_operation::<i32>(world)?;
    every_operation::<i64>(world)?;
    every_operation::<i128>(world)?;
    every_operation::<isize>(world)?;
    every_operation::<u8>(world)?;
    every_operation::<u16>(world)?;
    every_operation::<u32>(world)?;
    every_operation::<u64>(world)?;
    every_operation::<u128>(world)?;
    every_operation::<usize>(world)?;
    every_operation::<f32>(world)?;
    every_operation::<f64>(world)?;
    locations(world)
}

/// `min_loc` and `max_loc`: the extreme value and the lowest rank that
/// holds it.
fn locations(world: &Communicator) -> Result<()> {
    let (rank, size) = (world.rank() as usize, world.size() as usize);
    let value = |r: usize, i: usize| ((r * 7 + i) % 5) as f64 - 1.5;
    let mine: Vec<ValueIndex<f64, i64>> = (0..20)
        .map(|i| ValueIndex {
            value: value(rank, i),
            index: rank as i64,
        })
        .collect();
    for (name, op, pick) in [
        (
            "min_loc",
            SystemOperation::min_loc(),
            f64::min as fn(f64, f64) -> f64,
        ),
        ("max_loc", SystemOperation::max_loc(), f64::max),
    ] {
        let mut got = vec![ValueIndex::default(); 20];
        world.all_reduce_into(&mine[..], &mut got[..], op)?;
        let expected: Vec<ValueIndex<f64, i64>> = (0..20)
            .map(|i| {
                let best = (0..size).map(|r| value(r, i)).fold(value(0, i), pick);
                let index = (0..size).find(|&r| value(r, i) == best).unwrap_or(0);
                ValueIndex {
                    value: best,
                    index: index as i64,
                }
            })
            .collect();
        same(&got, &expected, name)?;
    }
    let mut ints = vec![
        ValueIndex {
            value: 0i32,
            index: 0i32
        };
        3
    ];
    let mine = [ValueIndex {
        value: -(rank as i32),
        index: rank as i32,
    }; 3];
    world.all_reduce_into(&mine[..], &mut ints[..], SystemOperation::min_loc())?;
    same(
        &ints,
        &[ValueIndex {
            value: 1 - size as i32,
            index: size as i32 - 1,
        }; 3],
        "min_loc of MPI_2INT",
    )?;
    // Sums are not defined on value-index pairs of two types (a pair of
    // two i32s has the type signature of two i32s, which do add up).
    let floats = [ValueIndex {
        value: 1.5f32,
        index: rank as i32,
    }];
    let mut float_sums = floats;
    let e = world.all_reduce_into(&floats, &mut float_sums, SystemOperation::sum());
    expect_class(e, ErrorClass::Op, "sum of MPI_FLOAT_INT")?;
    // The pairs whose C structs have padding, and a struct of the
    // program's own with MPI_DOUBLE_INT's layout.
    padded_locations(
        world,
        "MPI_DOUBLE_INT",
        |v| v as f64 / 2.0,
        pair_of,
        parts_of,
    )?;
    padded_locations(
        world,
        "MPI_LONG_INT",
        |v| v as i64 - (1 << 40),
        pair_of,
        parts_of,
    )?;
    padded_locations(world, "MPI_SHORT_INT", |v| v as i16, pair_of, parts_of)?;
    padded_locations(
        world,
        "a derived struct of f64 and i32",
        |v| v as f64 / 2.0,
        |value, index| DoubleInt { value, index },
        |p| (p.value, p.index),
    )
}

fn pair_of<V>(value: V, index: i32) -> ValueIndex<V, i32> {
    ValueIndex { value, index }
}

fn parts_of<V>(p: ValueIndex<V, i32>) -> (V, i32) {
    (p.value, p.index)
}

/// A struct with `MPI_DOUBLE_INT`'s C layout: 12 bytes of data in 16.
#[derive(Equivalence, Clone, Copy, Debug, PartialEq)]
#[repr(C)]
struct DoubleInt {
    value: f64,
    index: i32,
}

/// Min-loc and max-loc on pairs `P` of a `V` (made by `value` from a
/// small integer) and an `i32` index, in reduce (to the last rank),
/// all-reduce and scan, against a sequential reference. Values repeat
/// across ranks, and indices fall as ranks rise, so a tie must pick the
/// lower index, not the lower rank's pair.
fn padded_locations<V, P>(
    world: &Communicator,
    name: &str,
    value: fn(i32) -> V,
    pair: fn(V, i32) -> P,
    parts: fn(P) -> (V, i32),
) -> Result<()>
where
    V: Copy + PartialOrd,
    P: Equivalence + Copy + PartialEq + Debug,
{
    const LEN: usize = 21;
    let (rank, size) = (world.rank() as usize, world.size() as usize);
    let made = |r: usize, i: usize| {
        let v = ((r * 7 + i) % 4) as i32 - 2;
        pair(value(v), ((size - r) * 100 + i % 3) as i32)
    };
    // The best pair of ranks `0..=last` at element `i`.
    let best = |last: usize, i: usize, smaller: bool| {
        (1..=last).map(|r| made(r, i)).fold(made(0, i), |a, b| {
            let ((va, ia), (vb, ib)) = (parts(a), parts(b));
            let b_wins = if smaller { vb < va } else { vb > va };
            if b_wins || (vb == va && ib < ia) {
                b
            } else {
                a
            }
        })
    };
    let mine: Vec<P> = (0..LEN).map(|i| made(rank, i)).collect();
    let root = size as i32 - 1;
    for (op_name, op, smaller) in [
        ("min_loc", SystemOperation::min_loc(), true),
        ("max_loc", SystemOperation::max_loc(), false),
    ] {
        let all: Vec<P> = (0..LEN).map(|i| best(size - 1, i, smaller)).collect();
        let mut got = mine.clone();
        world.all_reduce_into(&mine[..], &mut got[..], op)?;
        same(&got, &all, &format!("all-reduce {op_name} of {name}"))?;
        let mut got = mine.clone();
        if world.rank() == root {
            world
                .process_at_rank(root)
                .reduce_into_root(&mine[..], &mut got[..], op)?;
            same(&got, &all, &format!("reduce {op_name} of {name}"))?;
        } else {
            world.process_at_rank(root).reduce_into(&mine[..], op)?;
        }
        let upto: Vec<P> = (0..LEN).map(|i| best(rank, i, smaller)).collect();
        world.scan_into(&mine[..], &mut got[..], op)?;
        same(&got, &upto, &format!("scan {op_name} of {name}"))?;
    }
    Ok(())
}

/// Processes that pass different counts: the one that receives too much
/// fails with `MPI_ERR_TRUNCATE`, too little with `MPI_ERR_COUNT`, the
/// others succeed, and the next collectives work.
fn mismatch(world: &Communicator) -> Result<()> {
    let cases = [
        (100, 99, ErrorClass::Truncate),
        (100, 101, ErrorClass::Count),
    ];
    let size = world.size() as usize;
    mismatched_broadcasts(world, &cases, size - 1)
}

/// `mismatch` of broadcasts long enough to be cut in blocks that the
/// processes pass on to each other (by messages: scatter and all-gather)
/// or to be streamed through the shared staging areas, and across the
/// switch between the algorithms, at the last rank and at rank 2 (which
/// passes on data in the broadcast's tree, from four ranks on): only the
/// process whose length differs fails, the others get the root's data.
fn mismatch_long(world: &Communicator) -> Result<()> {
    let cases = [
        (100_000, 99_999, ErrorClass::Truncate),
        (100_000, 100_001, ErrorClass::Count),
        (100_000, 100, ErrorClass::Truncate),
        (1_000, 100_000, ErrorClass::Count),
    ];
    let size = world.size() as usize;
    mismatched_broadcasts(world, &cases, size - 1)?;
    if size >= 4 {
        mismatched_broadcasts(world, &cases, 2)?;
    }
    Ok(())
}

/// Broadcasts from rank 0 of `full` bytes where rank `odd` passes
/// `len_at_odd` and must fail with `class` (what its buffer then holds is
/// not defined), then a barrier and an all-reduce that must work.
fn mismatched_broadcasts(
    world: &Communicator,
    cases: &[(usize, usize, ErrorClass)],
    odd: usize,
) -> Result<()> {
    let (rank, size) = (world.rank() as usize, world.size() as usize);
    let root = world.process_at_rank(0);
    for &(full, len_at_odd, class) in cases {
        let mismatched = rank == odd && size > 1;
        let len = if mismatched { len_at_odd } else { full };
        let mut buf = if rank == 0 {
            bytes(5, 0, full)
        } else {
            vec![0; len]
        };
        let result = root.broadcast_into(&mut buf[..]);
        if mismatched {
            let what = format!("broadcast of {full} bytes into {len_at_odd} at rank {odd}");
            expect_class(result, class, &what)?;
        } else {
            result?;
            same(&buf, &bytes(5, 0, full), "broadcast beside a mismatch")?;
        }
        world.barrier()?;
        let mut total = 0u64;
        world.all_reduce_into(&1u64, &mut total, SystemOperation::sum())?;
        ensure(total == size as u64, || {
            format!("all-reduce after a mismatch gave {total}")
        })?;
    }
    Ok(())
}

/// `mismatched_reduction COLLECTIVE COUNT ODD_COUNT ODD_RANK`:
/// `all_reduce`, `reduce` (to rank 0), `reduce_scatter` (block) or `scan`
/// of `u64`s, `COUNT` of them at every rank but `ODD_RANK` (`last` for
/// the last), `ODD_COUNT` there (per block for the reduce-scatter), with the fatal error handler. Some rank
/// must see the mismatch and end the job with its error (the harness
/// checks its code and message); a rank whose call returns waits for
/// that, and fails the job if it never comes.
fn mismatched_reduction(world: &Communicator) -> Result<()> {
    let args: Vec<String> = std::env::args().skip(2).collect();
    let [collective, count, odd_count, odd_rank] = &args[..] else {
        return Err(fail(format!(
            "usage: mismatched_reduction COLLECTIVE COUNT ODD_COUNT ODD_RANK, not {args:?}"
        )));
    };
    let parse = |text: &str| {
        text.parse::<usize>()
            .map_err(|e| fail(format!("count {text:?}: {e}")))
    };
    let (rank, size) = (world.rank() as usize, world.size() as usize);
    let odd_rank = match odd_rank.as_str() {
        "last" => size - 1,
        other => parse(other)?,
    };
    let count = if rank == odd_rank {
        parse(odd_count)?
    } else {
        parse(count)?
    };
    world.set_error_handler(ErrorHandler::Fatal);
    let sum = SystemOperation::sum();
    let send: Vec<u64> = (0..count * size).map(|i| i as u64).collect();
    let mut recv = vec![0u64; count];
    let root = world.process_at_rank(0);
    match collective.as_str() {
        "all_reduce" => world.all_reduce_into(&send[..count], &mut recv[..], sum)?,
        "reduce" if rank == 0 => root.reduce_into_root(&send[..count], &mut recv[..], sum)?,
        "reduce" => root.reduce_into(&send[..count], sum)?,
        "reduce_scatter" => world.reduce_scatter_block_into(&send[..], &mut recv[..], sum)?,
        "scan" => world.scan_into(&send[..count], &mut recv[..], sum)?,
        other => return Err(fail(format!("unknown reduction {other:?}"))),
    }
    // This rank did not see the mismatch: another must end the job.
    let mut never = 0u8;
    let _ = world
        .process_at_rank(((rank + 1) % size) as i32)
        .receive_into(&mut never);
    Err(fail(format!(
        "{collective} of {count} elements returned at rank {rank} and the job went on"
    )))
}

/// Bad arguments, the same at every rank so that all fail alike.
fn errors(world: &Communicator) -> Result<()> {
    let (rank, size) = (world.rank(), world.size());
    let mut buf = [0u8; 4];
    expect_class(
        world.process_at_rank(size).broadcast_into(&mut buf),
        ErrorClass::Root,
        "root = size",
    )?;
    expect_class(
        world.process_at_rank(-1).broadcast_into(&mut buf),
        ErrorClass::Root,
        "root = -1",
    )?;
    // Each rank calls the root's method with another rank as root (or the
    // other way round when alone).
    let other = world.process_at_rank((rank + 1) % size);
    if size > 1 {
        expect_class(
            other.gather_into_root(&buf, &mut [0u8; 64]),
            ErrorClass::Root,
            "root method at a non-root",
        )?;
        expect_class(
            other.reduce_into_root(&buf, &mut [0u8; 4], SystemOperation::sum()),
            ErrorClass::Root,
            "reduce_into_root at a non-root",
        )?;
    } else {
        expect_class(
            other.gather_into(&buf),
            ErrorClass::Root,
            "non-root method at the root",
        )?;
    }
    let me = world.process_at_rank(rank);
    expect_class(
        me.gather_into_root(&buf, &mut vec![0u8; 4 * size as usize + 1]),
        ErrorClass::Count,
        "gather into a buffer of the wrong length",
    )?;
    expect_class(
        world.all_reduce_into(
            &[1i32, 2, 3][..],
            &mut [0i32; 2][..],
            SystemOperation::sum(),
        ),
        ErrorClass::Count,
        "all-reduce into a shorter buffer",
    )?;
    expect_class(
        world.all_reduce_into(&1i32, &mut 0u32, SystemOperation::sum()),
        ErrorClass::Type,
        "all-reduce of i32 into u32",
    )?;
    expect_class(
        world.all_reduce_into(&1.0f64, &mut 0.0f64, SystemOperation::bitwise_and()),
        ErrorClass::Op,
        "bitwise and of f64",
    )?;
    let uneven = world.all_to_all_into(&[0u8; 3][..], &mut [0u8; 3][..]);
    if 3 % size == 0 {
        uneven?;
    } else {
        expect_class(
            uneven,
            ErrorClass::Count,
            "all-to-all of blocks that do not split",
        )?;
    }
    let one_count = world.reduce_scatter_into(
        &[0i32; 4][..],
        &mut [0i32; 4][..],
        &[4],
        SystemOperation::sum(),
    );
    if size == 1 {
        one_count?;
    } else {
        expect_class(one_count, ErrorClass::Arg, "reduce-scatter with one count")?;
    }
    let counts = vec![2; size as usize];
    let displs = vec![0; size as usize];
    if size > 1 {
        let mut recv = [0u32; 2];
        let e = world.all_gather_varcount_into(
            &[0u32; 2][..],
            &mut PartitionMut::new(&mut recv[..], &counts[..], &displs[..]),
        );
        expect_class(e, ErrorClass::Arg, "overlapping receive blocks")?;
    }
    let negative = vec![-1; size as usize];
    let mut recv = vec![0u32; 2 * size as usize];
    let e = world.all_gather_varcount_into(
        &[0u32; 2][..],
        &mut PartitionMut::new(&mut recv[..], &negative[..], &displs[..]),
    );
    expect_class(e, ErrorClass::Count, "negative counts")?;
    // The job goes on.
    let mut total = 0i32;
    world.all_reduce_into(&1i32, &mut total, SystemOperation::sum())?;
    ensure(total == size, || {
        format!("all-reduce after the errors gave {total}")
    })
}

/// A struct with padding (7 bytes after `charge`) that travels by its
/// derived datatype.
#[derive(Equivalence, Clone, Copy, Debug, PartialEq)]
#[repr(C)]
struct Particle {
    position: [f64; 2],
    charge: i8,
    id: u64,
}

fn particle(rank: usize, i: usize) -> Particle {
    Particle {
        position: [rank as f64, i as f64 * 0.5],
        charge: (rank as i8) - (i as i8),
        id: ((rank as u64) << 32) | i as u64,
    }
}

/// A plain struct (no padding) that user operations can read.
#[derive(Equivalence, Clone, Copy, Debug, PartialEq)]
#[repr(C)]
struct Sample {
    weight: f64,
    count: i64,
}

/// Element `(r, c)` of rank `rank`'s matrix of two columns: exact in `f64`.
fn cell(rank: usize, r: usize, c: usize) -> f64 {
    (rank * 4_000_000 + 2 * r + c) as f64
}

/// `large_datatypes`: collectives of strided columns of `f64` (every
/// other element of a matrix of two columns), each block 1 MiB packed
/// and each buffer several MiB, checked against references; the other
/// column must keep its values.
fn large_datatypes(world: &Communicator) -> Result<()> {
    let (rank, n) = (world.rank() as usize, world.size() as usize);
    // Rows of one block: 1 MiB of a column.
    let block = 1 << 17;
    let rows = n * block;
    let matrix =
        |of: usize| -> Vec<f64> { (0..rows * 2).map(|i| cell(of, i / 2, i % 2)).collect() };
    // The whole first column, and blocks of it of `block` rows each.
    let column = UserDatatype::vector(rows as i32, 1, 2, &f64::equivalent_datatype())?;
    let one_block = UserDatatype::vector(block as i32, 1, 2, &f64::equivalent_datatype())?;
    let blocks = UserDatatype::resized(&one_block, 0, (block * 2 * 8) as isize)?;
    // The second column of `m` must hold `of`'s values.
    let untouched = |m: &[f64], of: usize, what: &str| {
        let second: Vec<f64> = m.iter().skip(1).step_by(2).copied().collect();
        let expected: Vec<f64> = (0..rows).map(|r| cell(of, r, 1)).collect();
        same(&second, &expected, &format!("{what}: the other column"))
    };
    let first = |m: &[f64]| -> Vec<f64> { m.iter().step_by(2).copied().collect() };

    // Broadcast of a column, from a root in the middle.
    let root = n / 2;
    let mut data = matrix(rank);
    {
        let mut view = MutView::with_count_and_datatype(&mut data[..], 1, &column)?;
        world
            .process_at_rank(root as i32)
            .broadcast_into(&mut view)?;
    }
    let expected: Vec<f64> = (0..rows).map(|r| cell(root, r, 0)).collect();
    same(&first(&data), &expected, "broadcast of a strided column")?;
    untouched(&data, rank, "broadcast of a strided column")?;
    // The same from a contiguous buffer at the root into strided columns
    // elsewhere, and from a strided column into contiguous buffers.
    for strided_root in [false, true] {
        let mut data = matrix(rank);
        let mut plain: Vec<f64> = if rank == root {
            expected.clone()
        } else {
            vec![-1.0; rows]
        };
        if (rank == root) == strided_root {
            let mut view = MutView::with_count_and_datatype(&mut data[..], 1, &column)?;
            world
                .process_at_rank(root as i32)
                .broadcast_into(&mut view)?;
            same(&first(&data), &expected, "mixed broadcast into a column")?;
        } else {
            world
                .process_at_rank(root as i32)
                .broadcast_into(&mut plain[..])?;
            same(
                &plain,
                &expected,
                "mixed broadcast into a contiguous buffer",
            )?;
        }
    }

    // All-reduce of a column into another matrix's column, and in place.
    let mine = matrix(rank);
    let mut sums = matrix(rank);
    {
        let input = View::with_count_and_datatype(&mine[..], 1, &column)?;
        let mut output = MutView::with_count_and_datatype(&mut sums[..], 1, &column)?;
        world.all_reduce_into(&input, &mut output, SystemOperation::sum())?;
    }
    let expected: Vec<f64> = (0..rows)
        .map(|r| (0..n).map(|k| cell(k, r, 0)).sum())
        .collect();
    same(&first(&sums), &expected, "all-reduce of strided columns")?;
    untouched(&sums, rank, "all-reduce of strided columns")?;
    let mut data = matrix(rank);
    {
        let mut view = MutView::with_count_and_datatype(&mut data[..], 1, &column)?;
        world.all_reduce_in_place(&mut view, SystemOperation::sum())?;
    }
    same(
        &first(&data),
        &expected,
        "in-place all-reduce of a strided column",
    )?;
    untouched(&data, rank, "in-place all-reduce of a strided column")?;
    // The same where the even ranks pass strided columns and the others
    // contiguous buffers (long enough for single copies between buffers,
    // which only the contiguous ones have).
    if rank % 2 == 0 {
        let mut data = matrix(rank);
        {
            let mut view = MutView::with_count_and_datatype(&mut data[..], 1, &column)?;
            world.all_reduce_in_place(&mut view, SystemOperation::sum())?;
        }
        same(&first(&data), &expected, "mixed all-reduce, a column")?;
        untouched(&data, rank, "mixed all-reduce, a column")?;
    } else {
        let mut plain = first(&mine);
        world.all_reduce_in_place(&mut plain[..], SystemOperation::sum())?;
        same(&plain, &expected, "mixed all-reduce, a contiguous buffer")?;
    }

    // All-to-all of blocks of a column: block `to` of rank `from` lands
    // as block `from` at rank `to`.
    let mut received = matrix(rank);
    {
        let send = View::with_count_and_datatype(&mine[..], n as i32, &blocks)?;
        let mut recv = MutView::with_count_and_datatype(&mut received[..], n as i32, &blocks)?;
        world.all_to_all_into(&send, &mut recv)?;
    }
    let expected: Vec<f64> = (0..n)
        .flat_map(|from| (0..block).map(move |i| cell(from, rank * block + i, 0)))
        .collect();
    same(&first(&received), &expected, "all-to-all of strided blocks")?;
    untouched(&received, rank, "all-to-all of strided blocks")?;
    // Contiguous blocks sent, strided ones received at even ranks; the
    // reverse at odd ones.
    let plain_send: Vec<f64> = (0..rows).map(|r| cell(rank, r, 0)).collect();
    let mut plain_recv = vec![-1.0f64; rows];
    let mut received = matrix(rank);
    if rank % 2 == 0 {
        {
            let mut recv = MutView::with_count_and_datatype(&mut received[..], n as i32, &blocks)?;
            world.all_to_all_into(&plain_send[..], &mut recv)?;
        }
        same(
            &first(&received),
            &expected,
            "all-to-all from contiguous blocks",
        )?;
    } else {
        let send = View::with_count_and_datatype(&mine[..], n as i32, &blocks)?;
        world.all_to_all_into(&send, &mut plain_recv[..])?;
        same(&plain_recv, &expected, "all-to-all into contiguous blocks")?;
    }

    // Gather of each rank's block `rank` into the root's column.
    let gather_root = world.process_at_rank((n - 1) as i32);
    let send = View::with_count_and_datatype(&mine[rank * block * 2..], 1, &one_block)?;
    if rank == n - 1 {
        let mut gathered = matrix(rank);
        {
            let mut recv = MutView::with_count_and_datatype(&mut gathered[..], n as i32, &blocks)?;
            gather_root.gather_into_root(&send, &mut recv)?;
        }
        let expected: Vec<f64> = (0..rows).map(|r| cell(r / block, r, 0)).collect();
        same(&first(&gathered), &expected, "gather of strided blocks")?;
        untouched(&gathered, rank, "gather of strided blocks")?;
    } else {
        gather_root.gather_into(&send)?;
    }
    if rank == 0 {
        println!("large_datatypes: {n} ranks, blocks of {block} strided f64");
    }
    Ok(())
}

/// All-gathers of [`BRUCK_BLOCK_ROWS`] strided rows from each process
/// that `bruck_pieces_memory` keeps under way at once.
const BRUCK_GATHERS: usize = 256;

/// Rows of each process's block in `bruck_pieces_memory`: 15 KiB of
/// `f64`, so that the blocks of 3 to 5 processes make less than the
/// 80 KiB in all below which an all-gather goes by Bruck's algorithm.
const BRUCK_BLOCK_ROWS: usize = 1920;

/// `bruck_pieces_memory` (3 ranks): [`BRUCK_GATHERS`] non-blocking
/// all-gathers of a strided block of a column from each process into
/// strided columns, under way at once at every rank but the last, which
/// starts its own only once every other rank has started all of its own
/// (so that none of theirs can end before), and one at a time, grow no
/// process's peak memory by two blocks each. One alone is too short for
/// a copy of its whole to show in the peak; hundreds at once show it.
/// Each pending message holds a packed piece (the point-to-point layer's
/// chunk: the whole of a block this short), 1.2 to 1.3 blocks in all
/// per all-gather; Bruck's algorithm through a copy of the whole, as it
/// was before it moved its runs in place, held 3.2 (12.4 MiB here). The
/// job is run with eager limits below a block, so that messages sent
/// before their receives are posted wait at their senders, not in the
/// receivers' memory.
fn bruck_pieces_memory(world: &Communicator) -> Result<()> {
    let (rank, n) = (world.rank() as usize, world.size() as usize);
    ensure(n == 3, || {
        format!("bruck_pieces_memory needs 3 ranks, not {n}")
    })?;
    let f64t = f64::equivalent_datatype();
    let block = UserDatatype::vector(BRUCK_BLOCK_ROWS as i32, 1, 2, &f64t)?;
    let blocks = UserDatatype::resized(&block, 0, (BRUCK_BLOCK_ROWS * 2 * 8) as isize)?;
    // Gather `g` sends rows `g * BRUCK_BLOCK_ROWS..` of this rank's
    // column, and receives into rows `g * n * BRUCK_BLOCK_ROWS..`.
    let value = |g: usize, owner: usize, r: usize| (owner * 1_000_000 + g * 1000 + r % 1000) as f64;
    let mut data = vec![0.0f64; BRUCK_GATHERS * BRUCK_BLOCK_ROWS * 2];
    for (i, x) in data.iter_mut().enumerate() {
        let row = i / 2;
        *x = value(row / BRUCK_BLOCK_ROWS, rank, row % BRUCK_BLOCK_ROWS);
    }
    let whole = n * BRUCK_BLOCK_ROWS * 2;
    let mut received = vec![-1.0f64; BRUCK_GATHERS * whole];
    let last = n - 1;
    // Less than two blocks of each.
    let bound_kib = (BRUCK_GATHERS * 2 * BRUCK_BLOCK_ROWS * 8 / 1024) as u64;
    within_peak_growth(
        world,
        &format!("{BRUCK_GATHERS} strided all-gathers by Bruck's algorithm at once"),
        bound_kib,
        || {
            if rank == last {
                for other in 0..last {
                    let mut started = 0u8;
                    world
                        .process_at_rank(other as i32)
                        .receive_into(&mut started)?;
                }
            }
            let sends = data
                .chunks(BRUCK_BLOCK_ROWS * 2)
                .map(|send| View::with_count_and_datatype(send, 1, &block))
                .collect::<Result<Vec<_>>>()?;
            let mut recvs = received
                .chunks_mut(whole)
                .map(|recv| MutView::with_count_and_datatype(recv, n as i32, &blocks))
                .collect::<Result<Vec<_>>>()?;
            scope(|sc| {
                let mut requests = Vec::with_capacity(BRUCK_GATHERS);
                for (send, recv) in sends.iter().zip(recvs.iter_mut()) {
                    let request = world.immediate_all_gather_into(sc, send, recv)?;
                    // The last rank ends each before it starts the next,
                    // so that it has no more under way than one.
                    if rank == last {
                        request.wait()?;
                    } else {
                        requests.push(request);
                    }
                }
                if rank != last {
                    world.process_at_rank(last as i32).send(&1u8)?;
                }
                wait_all(requests).map(drop)
            })
        },
    )?;
    for (g, gathered) in received.chunks(whole).enumerate() {
        let owner = |r: usize| value(g, r / BRUCK_BLOCK_ROWS, r % BRUCK_BLOCK_ROWS);
        first_column_is(
            gathered,
            0..n * BRUCK_BLOCK_ROWS,
            owner,
            &format!("strided all-gather {g} by Bruck's algorithm"),
        )?;
    }
    Ok(())
}

/// `pieces_memory`: collectives of 32 MiB of strided data (packed) in
/// all at each process, or sent or received by it, checked, each growing
/// the process's peak resident memory by less than `checks::PIECES_BOUND_KIB`:
/// a broadcast of a strided column, through shared memory or by
/// messages; an all-to-all of strided blocks; a gather to and a scatter
/// from rank 0 of a block of a column from or into each process; an
/// all-gather of such blocks, and of varying counts (in reverse rank
/// order) of strided elements; and an all-to-all of varying counts of
/// them; and a broadcast and an all-to-all from contiguous buffers into
/// strided ones; the in-place all-to-alls of strided blocks
/// (`pieces_memory_in_place`); all-reduces and reduces of a strided
/// column (`pieces_memory_reductions`); and its scans and reduce-scatters
/// (`pieces_memory_scans`). Every buffer is allocated and touched
/// first, and smaller collectives warm the shared region.
fn pieces_memory(world: &Communicator) -> Result<()> {
    let (rank, n) = (world.rank() as usize, world.size() as usize);
    let f64t = f64::equivalent_datatype();
    let rows = 4 << 20;
    let column = UserDatatype::vector(rows as i32, 1, 2, &f64t)?;
    let block = rows / n;
    let one_block = UserDatatype::vector(block as i32, 1, 2, &f64t)?;
    let blocks = UserDatatype::resized(&one_block, 0, (block * 2 * 8) as isize)?;
    // One `f64` of the first column: counts of it address rows.
    let strided = UserDatatype::resized(&f64t, 0, 16)?;
    let small = UserDatatype::vector(100_000, 1, 2, &f64t)?;
    let mut data: Vec<f64> = (0..rows * 2).map(|i| cell(rank, i / 2, i % 2)).collect();
    let mut received = vec![-1.0f64; rows * 2];
    let root = world.process_at_rank(0);
    {
        let mut warm = MutView::with_count_and_datatype(&mut received[..], 1, &small)?;
        root.broadcast_into(&mut warm)?;
        let mut recv = vec![0.0f64; 200_000];
        let count = (100_000 / n) as i32;
        let send_blocks = UserDatatype::vector(count, 1, 2, &f64t)?;
        let send_blocks = UserDatatype::resized(&send_blocks, 0, (count as isize) * 16)?;
        let send = View::with_count_and_datatype(&data[..], n as i32, &send_blocks)?;
        let mut recv = MutView::with_count_and_datatype(&mut recv[..], n as i32, &send_blocks)?;
        world.all_to_all_into(&send, &mut recv)?;
    }
    received.fill(-1.0);
    within_pieces_bound(world, "a 32 MiB strided broadcast", || {
        let mut view = MutView::with_count_and_datatype(&mut data[..], 1, &column)?;
        root.broadcast_into(&mut view)
    })?;
    let of_root = |r: usize| cell(0, r, 0);
    first_column_is(&data, 0..rows, of_root, "the 32 MiB strided broadcast")?;
    within_pieces_bound(world, "a 32 MiB strided all-to-all", || {
        let send = View::with_count_and_datatype(&data[..], n as i32, &blocks)?;
        let mut recv = MutView::with_count_and_datatype(&mut received[..], n as i32, &blocks)?;
        world.all_to_all_into(&send, &mut recv)
    })?;
    // Every rank sent rank 0's column (as broadcast): block `rank` of it
    // from each.
    first_column_is(
        &received,
        0..n * block,
        |r| of_root(rank * block + r % block),
        "the 32 MiB strided all-to-all",
    )?;
    // The same from contiguous buffers into strided ones: with single
    // copies, the receivers copy a piece at a time and unpack it.
    let mut plain: Vec<f64> = (0..rows).map(of_root).collect();
    received.fill(-1.0);
    within_pieces_bound(world, "a 32 MiB broadcast into strided columns", || {
        if rank == 0 {
            root.broadcast_into(&mut plain[..])
        } else {
            let mut view = MutView::with_count_and_datatype(&mut received[..], 1, &column)?;
            root.broadcast_into(&mut view)
        }
    })?;
    if rank != 0 {
        first_column_is(
            &received,
            0..rows,
            of_root,
            "the broadcast into strided columns",
        )?;
    }
    received.fill(-1.0);
    within_pieces_bound(world, "a 32 MiB all-to-all into strided blocks", || {
        let mut recv = MutView::with_count_and_datatype(&mut received[..], n as i32, &blocks)?;
        world.all_to_all_into(&plain[..n * block], &mut recv)
    })?;
    first_column_is(
        &received,
        0..n * block,
        |r| of_root(rank * block + r % block),
        "the all-to-all into strided blocks",
    )?;
    // From here each rank sends its own column.
    for (i, x) in data.iter_mut().enumerate() {
        *x = cell(rank, i / 2, i % 2);
    }
    let own_block = &data[rank * block * 2..];
    received.fill(-1.0);
    within_pieces_bound(world, "a 32 MiB strided gather", || {
        let send = View::with_count_and_datatype(own_block, 1, &one_block)?;
        if rank == 0 {
            let mut recv = MutView::with_count_and_datatype(&mut received[..], n as i32, &blocks)?;
            root.gather_into_root(&send, &mut recv)
        } else {
            root.gather_into(&send)
        }
    })?;
    let of_owner = |r: usize| cell(r / block, r, 0);
    if rank == 0 {
        first_column_is(&received, 0..n * block, of_owner, "the strided gather")?;
    }
    within_pieces_bound(world, "a 32 MiB strided scatter", || {
        let mut recv = MutView::with_count_and_datatype(&mut received[..], 1, &one_block)?;
        if rank == 0 {
            let send = View::with_count_and_datatype(&data[..], n as i32, &blocks)?;
            root.scatter_into_root(&send, &mut recv)
        } else {
            root.scatter_into(&mut recv)
        }
    })?;
    first_column_is(
        &received,
        0..block,
        |r| cell(0, rank * block + r, 0),
        "the strided scatter",
    )?;
    received.fill(-1.0);
    within_pieces_bound(world, "a 32 MiB strided all-gather", || {
        let send = View::with_count_and_datatype(own_block, 1, &one_block)?;
        let mut recv = MutView::with_count_and_datatype(&mut received[..], n as i32, &blocks)?;
        world.all_gather_into(&send, &mut recv)
    })?;
    first_column_is(&received, 0..n * block, of_owner, "the strided all-gather")?;
    // Rank `r`'s block lands at rows `(n - 1 - r) * block..`.
    let counts = vec![block as i32; n];
    let reversed: Vec<i32> = (0..n).map(|r| ((n - 1 - r) * block) as i32).collect();
    let reversed_owner = |r: usize| {
        let owner = n - 1 - r / block;
        cell(owner, owner * block + r % block, 0)
    };
    received.fill(-1.0);
    within_pieces_bound(world, "a 32 MiB strided all-gather-v", || {
        let send = View::with_count_and_datatype(own_block, block as i32, &strided)?;
        let mut recv =
            MutView::with_count_and_datatype(&mut received[..], (n * block) as i32, &strided)?;
        let mut recv = PartitionMut::new(&mut recv, &counts[..], &reversed[..]);
        world.all_gather_varcount_into(&send, &mut recv)
    })?;
    first_column_is(
        &received,
        0..n * block,
        reversed_owner,
        "the strided all-gather-v",
    )?;
    received.fill(-1.0);
    within_pieces_bound(world, "a 32 MiB strided all-to-all-v", || {
        let send = View::with_count_and_datatype(&data[..], (n * block) as i32, &strided)?;
        let in_order: Vec<i32> = (0..n).map(|r| (r * block) as i32).collect();
        let send = Partition::new(&send, &counts[..], in_order);
        let mut recv =
            MutView::with_count_and_datatype(&mut received[..], (n * block) as i32, &strided)?;
        let mut recv = PartitionMut::new(&mut recv, &counts[..], &reversed[..]);
        world.all_to_all_varcount_into(&send, &mut recv)
    })?;
    // Block `rank` of each rank's column, from rank `n - 1` first.
    first_column_is(
        &received,
        0..n * block,
        |r| cell(n - 1 - r / block, rank * block + r % block, 0),
        "the strided all-to-all-v",
    )?;
    pieces_memory_in_place(world, &mut data, block, &blocks, &one_block, &strided)?;
    pieces_memory_reductions(world, &mut data, &mut received, &column)?;
    let strided_blocks = (&blocks, &one_block, &strided);
    pieces_memory_scans(world, &mut data, &mut received, &column, strided_blocks)
}

/// `pieces_memory` of the reductions of a strided `column` of `data`
/// (each rank's own matrix of two columns, refilled before each) into
/// one of `received`, and in place: all-reduce, reduce to rank 0, in
/// place at the root too. The sums of the ranks' columns are exact.
fn pieces_memory_reductions(
    world: &Communicator,
    data: &mut [f64],
    received: &mut [f64],
    column: &UserDatatype,
) -> Result<()> {
    let (rank, n) = (world.rank() as usize, world.size() as usize);
    let rows = data.len() / 2;
    let refill = |data: &mut [f64]| {
        for (i, x) in data.iter_mut().enumerate() {
            *x = cell(rank, i / 2, i % 2);
        }
    };
    let sum = |r: usize| (0..n).map(|k| cell(k, r, 0)).sum::<f64>();
    let sum_op = SystemOperation::sum();
    let root = world.process_at_rank(0);
    refill(data);
    received.fill(-1.0);
    within_pieces_bound(world, "a 32 MiB strided all-reduce", || {
        let send = View::with_count_and_datatype(&*data, 1, column)?;
        let mut recv = MutView::with_count_and_datatype(&mut *received, 1, column)?;
        world.all_reduce_into(&send, &mut recv, sum_op)
    })?;
    first_column_is(received, 0..rows, sum, "the strided all-reduce")?;
    within_pieces_bound(world, "a 32 MiB strided in-place all-reduce", || {
        let mut buf = MutView::with_count_and_datatype(&mut *data, 1, column)?;
        world.all_reduce_in_place(&mut buf, sum_op)
    })?;
    first_column_is(data, 0..rows, sum, "the strided in-place all-reduce")?;
    refill(data);
    received.fill(-1.0);
    within_pieces_bound(world, "a 32 MiB strided reduce", || {
        let send = View::with_count_and_datatype(&*data, 1, column)?;
        if rank == 0 {
            let mut recv = MutView::with_count_and_datatype(&mut *received, 1, column)?;
            root.reduce_into_root(&send, &mut recv, sum_op)
        } else {
            root.reduce_into(&send, sum_op)
        }
    })?;
    if rank == 0 {
        first_column_is(received, 0..rows, sum, "the strided reduce")?;
    }
    within_pieces_bound(world, "a 32 MiB strided in-place reduce", || {
        if rank == 0 {
            let mut buf = MutView::with_count_and_datatype(&mut *data, 1, column)?;
            root.reduce_into_root_in_place(&mut buf, sum_op)
        } else {
            let send = View::with_count_and_datatype(&*data, 1, column)?;
            root.reduce_into(&send, sum_op)
        }
    })?;
    if rank == 0 {
        first_column_is(data, 0..rows, sum, "the strided in-place reduce")?;
    }
    Ok(())
}

/// `pieces_memory` of the scans and reduce-scatters of a strided `column`
/// of `data` (each rank's own matrix of two columns, refilled before
/// each): scan into one of `received`, and in place; exclusive scan in
/// place; reduce-scatter of `n` strided `blocks` into `one_block` of
/// `received`; and of varying counts, in place, of `strided` rows.
fn pieces_memory_scans(
    world: &Communicator,
    data: &mut [f64],
    received: &mut [f64],
    column: &UserDatatype,
    (blocks, one_block, strided): (&UserDatatype, &UserDatatype, &UserDatatype),
) -> Result<()> {
    let (rank, n) = (world.rank() as usize, world.size() as usize);
    let rows = data.len() / 2;
    let refill = |data: &mut [f64]| {
        for (i, x) in data.iter_mut().enumerate() {
            *x = cell(rank, i / 2, i % 2);
        }
    };
    let sum_of =
        |ranks: std::ops::Range<usize>, r: usize| ranks.map(|k| cell(k, r, 0)).sum::<f64>();
    let sum_op = SystemOperation::sum();
    refill(data);
    received.fill(-1.0);
    within_pieces_bound(world, "a 32 MiB strided scan", || {
        let send = View::with_count_and_datatype(&*data, 1, column)?;
        let mut recv = MutView::with_count_and_datatype(&mut *received, 1, column)?;
        world.scan_into(&send, &mut recv, sum_op)
    })?;
    first_column_is(
        received,
        0..rows,
        |r| sum_of(0..rank + 1, r),
        "the strided scan",
    )?;
    within_pieces_bound(world, "a 32 MiB strided in-place scan", || {
        let mut buf = MutView::with_count_and_datatype(&mut *data, 1, column)?;
        world.scan_in_place(&mut buf, sum_op)
    })?;
    first_column_is(
        data,
        0..rows,
        |r| sum_of(0..rank + 1, r),
        "the strided in-place scan",
    )?;
    refill(data);
    within_pieces_bound(world, "a 32 MiB strided in-place exclusive scan", || {
        let mut buf = MutView::with_count_and_datatype(&mut *data, 1, column)?;
        world.exclusive_scan_in_place(&mut buf, sum_op)
    })?;
    if rank > 0 {
        let exclusive = |r| sum_of(0..rank, r);
        first_column_is(
            data,
            0..rows,
            exclusive,
            "the strided in-place exclusive scan",
        )?;
    }
    refill(data);
    received.fill(-1.0);
    let block = rows / n;
    within_pieces_bound(world, "a 32 MiB strided reduce-scatter-block", || {
        let send = View::with_count_and_datatype(&*data, n as i32, blocks)?;
        let mut recv = MutView::with_count_and_datatype(&mut *received, 1, one_block)?;
        world.reduce_scatter_block_into(&send, &mut recv, sum_op)
    })?;
    let mine = |r: usize| sum_of(0..n, rank * block + r);
    first_column_is(received, 0..block, mine, "the strided reduce-scatter-block")?;
    // The last rank takes the rows left over.
    let counts: Vec<i32> = (0..n)
        .map(|k| if k + 1 == n { rows - k * block } else { block } as i32)
        .collect();
    within_pieces_bound(world, "a 32 MiB strided in-place reduce-scatter", || {
        let mut buf = MutView::with_count_and_datatype(&mut *data, rows as i32, strided)?;
        world.reduce_scatter_in_place(&mut buf, &counts, sum_op)
    })?;
    let count = counts[rank] as usize;
    first_column_is(data, 0..count, mine, "the strided in-place reduce-scatter")
}

/// `pieces_memory` of the in-place all-to-alls over `data` (each rank's
/// own two-column matrix, of `n` blocks of `block` rows and perhaps a
/// row more): of `n` strided `blocks`, of varying counts of `strided`
/// rows in reverse rank order, and of one buffer of `one_block` per
/// process.
fn pieces_memory_in_place(
    world: &Communicator,
    data: &mut [f64],
    block: usize,
    blocks: &UserDatatype,
    one_block: &UserDatatype,
    strided: &UserDatatype,
) -> Result<()> {
    let (rank, n) = (world.rank() as usize, world.size() as usize);
    let refill = |data: &mut [f64]| {
        for (i, x) in data.iter_mut().enumerate() {
            *x = cell(rank, i / 2, i % 2);
        }
    };
    // Block `r` of rank `from`'s column, where block `from` was.
    let exchanged = |r: usize| cell(r / block, rank * block + r % block, 0);
    refill(data);
    within_pieces_bound(world, "a 32 MiB strided in-place all-to-all", || {
        let mut buf = MutView::with_count_and_datatype(&mut *data, n as i32, blocks)?;
        world.all_to_all_in_place(&mut buf)
    })?;
    first_column_is(data, 0..n * block, exchanged, "the in-place all-to-all")?;
    refill(data);
    let counts = vec![block as i32; n];
    let reversed: Vec<i32> = (0..n).map(|r| ((n - 1 - r) * block) as i32).collect();
    within_pieces_bound(world, "a 32 MiB strided in-place all-to-all-v", || {
        let mut buf = MutView::with_count_and_datatype(&mut *data, (n * block) as i32, strided)?;
        let mut buf = PartitionMut::new(&mut buf, &counts[..], &reversed[..]);
        world.all_to_all_varcount_in_place(&mut buf)
    })?;
    // Rank `from`'s block `n - 1 - rank` lands where block `from` was
    // sent from, at rows `(n - 1 - from) * block..`.
    first_column_is(
        data,
        0..n * block,
        |r| {
            let from = n - 1 - r / block;
            cell(from, (n - 1 - rank) * block + r % block, 0)
        },
        "the in-place all-to-all-v",
    )?;
    refill(data);
    within_pieces_bound(world, "a 32 MiB strided in-place all-to-all-w", || {
        let mut views = data
            .chunks_mut(block * 2)
            .take(n)
            .map(|rows| MutView::with_count_and_datatype(rows, 1, one_block))
            .collect::<Result<Vec<_>>>()?;
        let mut bufs: Vec<&mut dyn BufferMut> =
            views.iter_mut().map(|v| v as &mut dyn BufferMut).collect();
        world.all_to_all_w_in_place(&mut bufs)
    })?;
    first_column_is(data, 0..n * block, exchanged, "the in-place all-to-all-w")
}

fn datatypes(world: &Communicator) -> Result<()> {
    let (rank, n) = (world.rank() as usize, world.size() as usize);
    let root = world.process_at_rank(0);
    // A column of a rows x 3 matrix of f64: a strided vector.
    let rows = 1000;
    let column = UserDatatype::vector(rows as i32, 1, 3, &f64::equivalent_datatype())?;
    let matrix: Vec<f64> = (0..rows * 3).map(|i| (rank * 10_000 + i) as f64).collect();
    let column_1 = View::with_count_and_datatype(&matrix[1..], 1, &column)?;
    let mut sums = vec![0.0f64; rows];
    world.all_reduce_into(&column_1, &mut sums[..], SystemOperation::sum())?;
    let expected: Vec<f64> = (0..rows)
        .map(|r| (0..n).map(|k| (k * 10_000 + 3 * r + 1) as f64).sum())
        .collect();
    same(&sums, &expected, "all_reduce of a strided column")?;

    // The same sums into a strided column of another matrix, in place:
    // the other columns keep what they held.
    let mut target: Vec<f64> = matrix.clone();
    {
        let mut column_2 = MutView::with_count_and_datatype(&mut target[2..], 1, &column)?;
        world.all_reduce_in_place(&mut column_2, SystemOperation::max())?;
    }
    let expected_max: Vec<f64> = (0..rows * 3)
        .map(|i| match i % 3 {
            2 => ((n - 1) * 10_000 + i) as f64,
            _ => matrix[i],
        })
        .collect();
    same(&target, &expected_max, "in-place max into a strided column")?;

    // Structs with padding: broadcast and all_to_all.
    let mut particles: Vec<Particle> = (0..7).map(|i| particle(rank, i)).collect();
    root.broadcast_into(&mut particles[..])?;
    let mut from_root: Vec<Particle> = (0..7).map(|i| particle(0, i)).collect();
    same(&particles, &from_root, "broadcast of structs with padding")?;
    let outgoing: Vec<Particle> = (0..n * 2).map(|i| particle(rank, i)).collect();
    let mut incoming = vec![particle(99, 99); n * 2];
    world.all_to_all_into(&outgoing[..], &mut incoming[..])?;
    let expected: Vec<Particle> = (0..n)
        .flat_map(|from| (0..2).map(move |j| particle(from, rank * 2 + j)))
        .collect();
    same(&incoming, &expected, "all_to_all of structs with padding")?;

    // Gather of one strided column from each rank into the columns of
    // the root's matrix (3 columns: up to 3 ranks), whose gaps keep their
    // values.
    let mine = View::with_count_and_datatype(&matrix[0..], 1, &column)?;
    let column_0 = UserDatatype::resized(&column, 0, 8)?;
    if n > 3 {
        // More columns than the matrix has: the blocks would overlap.
    } else if rank == 0 {
        let mut gathered = vec![-1.0f64; rows * 3 + n];
        {
            let mut columns =
                MutView::with_count_and_datatype(&mut gathered[..], n as i32, &column_0)?;
            root.gather_into_root(&mine, &mut columns)?;
        }
        // Rank k's column lands at offset k with stride 3 (the resized
        // type's extent is one f64).
        let mut expected = vec![-1.0f64; rows * 3 + n];
        for k in 0..n {
            for r in 0..rows {
                expected[k + 3 * r] = (k * 10_000 + 3 * r) as f64;
            }
        }
        same(&gathered, &expected, "gather into resized strided columns")?;
    } else {
        root.gather_into(&mine)?;
    }

    // A user operation on a plain struct, and min_loc on pairs.
    let weighted = UserOperation::commutative(|input: DynBuffer, inout: DynBufferMut| {
        let input: &[Sample] = input.downcast().expect("Sample elements");
        let inout: &mut [Sample] = inout.downcast().expect("Sample elements");
        for (a, b) in input.iter().zip(inout) {
            b.weight += a.weight;
            b.count += a.count;
        }
    });
    let samples: Vec<Sample> = (0..50)
        .map(|i| Sample {
            weight: (rank + i) as f64,
            count: 1,
        })
        .collect();
    let mut total = vec![
        Sample {
            weight: 0.0,
            count: 0
        };
        50
    ];
    world.all_reduce_into(&samples[..], &mut total[..], &weighted)?;
    let expected: Vec<Sample> = (0..50)
        .map(|i| Sample {
            weight: (0..n).map(|k| (k + i) as f64).sum(),
            count: n as i64,
        })
        .collect();
    same(&total, &expected, "user operation on structs")?;
    let pair = ValueIndex {
        value: ((rank * 37) % 11) as f64,
        index: rank as i64,
    };
    let mut lowest = ValueIndex::default();
    world.all_reduce_into(&pair, &mut lowest, SystemOperation::min_loc())?;
    let best = (0..n)
        .map(|k| ValueIndex {
            value: ((k * 37) % 11) as f64,
            index: k as i64,
        })
        .min_by(|a, b| a.value.total_cmp(&b.value).then(a.index.cmp(&b.index)))
        .expect("one rank at least");
    same(&[lowest], &[best], "min_loc")?;

    // Types that do not match, and an operation a struct has not got.
    let mut ints = vec![0i64; rows];
    expect_class(
        world.all_reduce_into(&column_1, &mut ints[..], SystemOperation::sum()),
        ErrorClass::Type,
        "f64 column into i64",
    )?;
    expect_class(
        world.all_reduce_into(&particles[..], &mut from_root[..], SystemOperation::sum()),
        ErrorClass::Op,
        "sum of structs",
    )?;
    Ok(())
}
