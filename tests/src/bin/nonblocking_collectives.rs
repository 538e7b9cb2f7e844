//! Non-blocking collectives run as real jobs: `nonblocking_collectives
//! CHECK`, started by the harness through oxrun with 1 to 8 ranks. Every
//! result is compared with a sequential reference that each rank computes
//! alone from the inputs every rank makes (a function of its rank). A
//! check exits non-zero, saying why, when something is wrong.
//!
//! Checks: `data` (every non-blocking collective, in place and not, with
//! a commutative and a non-commutative operation, sizes from 0 to 2 MiB;
//! arguments a process can check alone fail when the collective starts),
//! `overlap` (many collectives, of one kind and of several, under way at
//! once on one communicator with point-to-point traffic between them,
//! completed in other orders than they were started, or by the end of
//! their scope), `progress` (a rank that only tests an unrelated request,
//! or only tests the collective's own, moves its collectives on). `data`
//! also checks that counts that disagree between processes fail at
//! completion, with the error each process sees.

use oxmpi::collective::{Partition, PartitionMut, SystemOperation};
use oxmpi::request::{scope, test_some, wait_all, wait_any, Request};
use oxmpi::traits::*;
use oxmpi::Threading;
use oxmpi::{Communicator, Error, ErrorClass, Result};
use oxmpi_jobs::affine::{affines, composed, composition};
use oxmpi_jobs::checks::{ensure, expect_class, fail, same};
use oxmpi_jobs::program::{run_check, world_returning_errors};
use std::process::ExitCode;

fn main() -> ExitCode {
    let check = std::env::args().nth(1).unwrap_or_default();
    run_check(
        &format!("nonblocking_collectives {check}"),
        Threading::Single,
        |universe| {
            let world = world_returning_errors(universe);
            match check.as_str() {
                "data" => data(&world),
                "overlap" => overlap(&world),
                "progress" => progress(&world),
                other => Err(fail(format!("unknown check {other:?}"))),
            }
        },
    )
}

/// Element `i` of rank `rank`'s `u32` data `seed`.
fn word(seed: usize, rank: usize, i: usize) -> u32 {
    (seed as u32).wrapping_mul(1_000_003) ^ ((rank as u32) << 24) ^ (i as u32)
}

fn words(seed: usize, rank: usize, len: usize) -> Vec<u32> {
    (0..len).map(|i| word(seed, rank, i)).collect()
}

/// The element-wise wrapping sum of ranks `ranks`' data `seed`.
fn summed(seed: usize, ranks: std::ops::Range<usize>, len: usize) -> Vec<u32> {
    (0..len)
        .map(|i| {
            ranks
                .clone()
                .fold(0u32, |acc, r| acc.wrapping_add(word(seed, r, i)))
        })
        .collect()
}

/// Waits for one request, for a check.
fn done(request: Request<'_>) -> Result<()> {
    request.wait().map(drop)
}

fn data(world: &Communicator) -> Result<()> {
    barrier(world)?;
    broadcast(world)?;
    gather_and_scatter(world)?;
    all_gather(world)?;
    all_to_all(world)?;
    reductions(world)?;
    reduce_scatter(world)?;
    scans(world)?;
    errors(world)
}

/// Nobody completes a barrier before everybody started it: rank 0
/// starts late, and every rank's barrier completes after that (the ranks
/// share the host's clock).
fn barrier(world: &Communicator) -> Result<()> {
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    };
    for _ in 0..3 {
        done(world.immediate_barrier()?)?;
    }
    let mut entered = 0u64;
    if world.rank() == 0 {
        std::thread::sleep(std::time::Duration::from_millis(100));
        entered = now();
    }
    done(world.immediate_barrier()?)?;
    let left = now();
    world.process_at_rank(0).broadcast_into(&mut entered)?;
    ensure(left >= entered, || {
        format!(
            "the barrier completed {} us before rank 0 started it",
            (entered - left) / 1000
        )
    })
}

fn broadcast(world: &Communicator) -> Result<()> {
    let (rank, size) = (world.rank() as usize, world.size() as usize);
    for (seed, len) in [0, 1, 3000, 12 * 1024 + 5, 100_000, 600_000, 2 << 20]
        .into_iter()
        .enumerate()
    {
        let roots: Vec<usize> = if len > 100_000 {
            vec![size / 2]
        } else {
            (0..size).collect()
        };
        for root in roots {
            let mut buf = if rank == root {
                words(seed, root, len / 4)
            } else {
                vec![0; len / 4]
            };
            scope(|s| {
                done(
                    world
                        .process_at_rank(root as i32)
                        .immediate_broadcast_into(s, &mut buf[..])?,
                )
            })?;
            same(
                &buf,
                &words(seed, root, len / 4),
                &format!("broadcast of {len} bytes from {root}"),
            )?;
        }
    }
    Ok(())
}

fn gather_and_scatter(world: &Communicator) -> Result<()> {
    let (rank, size) = (world.rank() as usize, world.size() as usize);
    for (seed, count) in [0, 1, 500, 70_000].into_iter().enumerate() {
        let root = seed % size;
        let at_root = rank == root;
        let process = world.process_at_rank(root as i32);
        let all: Vec<u32> = (0..size).flat_map(|r| words(seed, r, count)).collect();
        let mine = words(seed, rank, count);

        // Gather, and in place.
        let mut gathered = vec![0u32; if at_root { size * count } else { 0 }];
        scope(|s| {
            done(if at_root {
                process.immediate_gather_into_root(s, &mine[..], &mut gathered[..])?
            } else {
                process.immediate_gather_into(s, &mine[..])?
            })
        })?;
        if at_root {
            same(&gathered, &all, &format!("gather of {count} from each"))?;
            let mut in_place = vec![0u32; size * count];
            in_place[root * count..(root + 1) * count].copy_from_slice(&mine);
            scope(|s| done(process.immediate_gather_into_root_in_place(s, &mut in_place[..])?))?;
            same(&in_place, &all, &format!("gather in place of {count}"))?;
        } else {
            scope(|s| done(process.immediate_gather_into(s, &mine[..])?))?;
        }

        // Scatter, and in place.
        let mut block = vec![0u32; count];
        scope(|s| {
            done(if at_root {
                process.immediate_scatter_into_root(s, &all[..], &mut block[..])?
            } else {
                process.immediate_scatter_into(s, &mut block[..])?
            })
        })?;
        same(&block, &mine, &format!("scatter of {count} to each"))?;
        let mut block = vec![0u32; count];
        scope(|s| {
            done(if at_root {
                process.immediate_scatter_into_root_in_place(s, &all[..])?
            } else {
                process.immediate_scatter_into(s, &mut block[..])?
            })
        })?;
        if !at_root {
            same(&block, &mine, &format!("scatter in place of {count}"))?;
        }

        // Varying counts: rank r has r * count + 1 elements, placed in
        // reverse rank order at the root.
        let counts: Vec<i32> = (0..size).map(|r| (r * count + 1) as i32).collect();
        let mut displs = vec![0i32; size];
        let mut at = 0;
        for r in (0..size).rev() {
            displs[r] = at;
            at += counts[r];
        }
        let total = at as usize;
        let mine_v = words(seed + 10, rank, counts[rank] as usize);
        let mut laid_out = vec![0u32; total];
        for r in 0..size {
            let d = displs[r] as usize;
            laid_out[d..d + counts[r] as usize].copy_from_slice(&words(
                seed + 10,
                r,
                counts[r] as usize,
            ));
        }
        let mut gathered = vec![0u32; if at_root { total } else { 0 }];
        scope(|s| {
            done(if at_root {
                process.immediate_gather_varcount_into_root(
                    s,
                    &mine_v[..],
                    PartitionMut::new(&mut gathered[..], &counts[..], &displs[..]),
                )?
            } else {
                process.immediate_gather_varcount_into(s, &mine_v[..])?
            })
        })?;
        if at_root {
            same(&gathered, &laid_out, "gatherv")?;
            let mut in_place = vec![0u32; total];
            let d = displs[root] as usize;
            in_place[d..d + mine_v.len()].copy_from_slice(&mine_v);
            scope(|s| {
                done(process.immediate_gather_varcount_into_root_in_place(
                    s,
                    PartitionMut::new(&mut in_place[..], &counts[..], &displs[..]),
                )?)
            })?;
            same(&in_place, &laid_out, "gatherv in place")?;
        } else {
            scope(|s| done(process.immediate_gather_varcount_into(s, &mine_v[..])?))?;
        }
        let mut block = vec![0u32; counts[rank] as usize];
        scope(|s| {
            done(if at_root {
                process.immediate_scatter_varcount_into_root(
                    s,
                    Partition::new(&laid_out[..], &counts[..], &displs[..]),
                    &mut block[..],
                )?
            } else {
                process.immediate_scatter_varcount_into(s, &mut block[..])?
            })
        })?;
        same(&block, &mine_v, "scatterv")?;
        let mut block = vec![0u32; counts[rank] as usize];
        scope(|s| {
            done(if at_root {
                process.immediate_scatter_varcount_into_root_in_place(
                    s,
                    Partition::new(&laid_out[..], &counts[..], &displs[..]),
                )?
            } else {
                process.immediate_scatter_varcount_into(s, &mut block[..])?
            })
        })?;
        if !at_root {
            same(&block, &mine_v, "scatterv in place")?;
        }
    }
    Ok(())
}

fn all_gather(world: &Communicator) -> Result<()> {
    let (rank, size) = (world.rank() as usize, world.size() as usize);
    for (seed, count) in [0, 1, 3000, 40_000].into_iter().enumerate() {
        let all: Vec<u32> = (0..size).flat_map(|r| words(seed, r, count)).collect();
        let mine = words(seed, rank, count);
        let mut gathered = vec![0u32; size * count];
        scope(|s| done(world.immediate_all_gather_into(s, &mine[..], &mut gathered[..])?))?;
        same(&gathered, &all, &format!("all-gather of {count}"))?;
        let mut in_place = vec![0u32; size * count];
        in_place[rank * count..(rank + 1) * count].copy_from_slice(&mine);
        scope(|s| done(world.immediate_all_gather_in_place(s, &mut in_place[..])?))?;
        same(&in_place, &all, &format!("all-gather in place of {count}"))?;

        let counts: Vec<i32> = (0..size).map(|r| ((r + 1) * count / 2) as i32).collect();
        let displs: Vec<i32> = counts
            .iter()
            .scan(0, |at, &c| {
                let d = *at;
                *at += c;
                Some(d)
            })
            .collect();
        let all_v: Vec<u32> = (0..size)
            .flat_map(|r| words(seed + 20, r, counts[r] as usize))
            .collect();
        let mine_v = words(seed + 20, rank, counts[rank] as usize);
        let mut gathered = vec![0u32; all_v.len()];
        scope(|s| {
            done(world.immediate_all_gather_varcount_into(
                s,
                &mine_v[..],
                PartitionMut::new(&mut gathered[..], &counts[..], &displs[..]),
            )?)
        })?;
        same(&gathered, &all_v, "all-gatherv")?;
        let mut in_place = vec![0u32; all_v.len()];
        let d = displs[rank] as usize;
        in_place[d..d + mine_v.len()].copy_from_slice(&mine_v);
        scope(|s| {
            done(world.immediate_all_gather_varcount_in_place(
                s,
                PartitionMut::new(&mut in_place[..], &counts[..], &displs[..]),
            )?)
        })?;
        same(&in_place, &all_v, "all-gatherv in place")?;
    }
    Ok(())
}

/// Element `i` of what rank `from` sends to rank `to` in all-to-all `seed`.
fn block(seed: usize, from: usize, to: usize, len: usize) -> Vec<u32> {
    words(seed, from * 64 + to, len)
}

fn all_to_all(world: &Communicator) -> Result<()> {
    let (rank, size) = (world.rank() as usize, world.size() as usize);
    for (seed, count) in [0, 1, 1000, 10_000].into_iter().enumerate() {
        let send: Vec<u32> = (0..size)
            .flat_map(|to| block(seed, rank, to, count))
            .collect();
        let expected: Vec<u32> = (0..size)
            .flat_map(|from| block(seed, from, rank, count))
            .collect();
        let mut recv = vec![0u32; size * count];
        scope(|s| done(world.immediate_all_to_all_into(s, &send[..], &mut recv[..])?))?;
        same(&recv, &expected, &format!("all-to-all of {count}"))?;
        let mut in_place = send.clone();
        scope(|s| done(world.immediate_all_to_all_in_place(s, &mut in_place[..])?))?;
        same(
            &in_place,
            &expected,
            &format!("all-to-all in place of {count}"),
        )?;

        // Varying counts: rank r sends (r + to) * count / 4 + 1 to `to`.
        let len = |from: usize, to: usize| (from + to) * count / 4 + 1;
        let offsets = |lens: &[i32]| -> Vec<i32> {
            lens.iter()
                .scan(0, |at, &c| {
                    let d = *at;
                    *at += c;
                    Some(d)
                })
                .collect()
        };
        let send_counts: Vec<i32> = (0..size).map(|to| len(rank, to) as i32).collect();
        let recv_counts: Vec<i32> = (0..size).map(|from| len(from, rank) as i32).collect();
        let (send_displs, recv_displs) = (offsets(&send_counts), offsets(&recv_counts));
        let send_v: Vec<u32> = (0..size)
            .flat_map(|to| block(seed + 30, rank, to, len(rank, to)))
            .collect();
        let expected_v: Vec<u32> = (0..size)
            .flat_map(|from| block(seed + 30, from, rank, len(from, rank)))
            .collect();
        let mut recv_v = vec![0u32; expected_v.len()];
        scope(|s| {
            done(world.immediate_all_to_all_varcount_into(
                s,
                Partition::new(&send_v[..], &send_counts[..], &send_displs[..]),
                PartitionMut::new(&mut recv_v[..], &recv_counts[..], &recv_displs[..]),
            )?)
        })?;
        same(&recv_v, &expected_v, "all-to-allv")?;

        // Symmetric counts for the in-place form: `count + from + to`.
        let sym = |a: usize, b: usize| count + a + b;
        let sym_counts: Vec<i32> = (0..size).map(|p| sym(rank, p) as i32).collect();
        let sym_displs = offsets(&sym_counts);
        let mut sym_buf: Vec<u32> = (0..size)
            .flat_map(|to| block(seed + 40, rank, to, sym(rank, to)))
            .collect();
        let sym_expected: Vec<u32> = (0..size)
            .flat_map(|from| block(seed + 40, from, rank, sym(from, rank)))
            .collect();
        scope(|s| {
            done(world.immediate_all_to_all_varcount_in_place(
                s,
                PartitionMut::new(&mut sym_buf[..], &sym_counts[..], &sym_displs[..]),
            )?)
        })?;
        same(&sym_buf, &sym_expected, "all-to-allv in place")?;

        // One buffer per process, of its own length and type (u8 to
        // even ranks, u32 to odd ones).
        let as_bytes = |v: Vec<u32>| -> Vec<u8> { v.into_iter().map(|x| x as u8).collect() };
        let sends_w: Vec<Vec<u8>> = (0..size)
            .map(|to| as_bytes(block(seed + 50, rank, to, len(rank, to))))
            .collect();
        let sends_w32: Vec<Vec<u32>> = (0..size)
            .map(|to| block(seed + 50, rank, to, len(rank, to)))
            .collect();
        let mut recvs_w: Vec<Vec<u8>> = (0..size).map(|from| vec![0; len(from, rank)]).collect();
        let mut recvs_w32: Vec<Vec<u32>> = (0..size).map(|from| vec![0; len(from, rank)]).collect();
        {
            let send_refs: Vec<&dyn Buffer> = (0..size)
                .map(|to| {
                    if to % 2 == 0 {
                        &sends_w[to] as &dyn Buffer
                    } else {
                        &sends_w32[to] as &dyn Buffer
                    }
                })
                .collect();
            let mut recv_refs: Vec<&mut dyn BufferMut> = Vec::new();
            for (r8, r32) in recvs_w.iter_mut().zip(recvs_w32.iter_mut()) {
                recv_refs.push(if rank % 2 == 0 { r8 } else { r32 });
            }
            scope(|s| done(world.immediate_all_to_all_w_into(s, &send_refs, &mut recv_refs)?))?;
        }
        for from in 0..size {
            let expected = block(seed + 50, from, rank, len(from, rank));
            if rank % 2 == 0 {
                same(&recvs_w[from], &as_bytes(expected), "all-to-allw bytes")?;
            } else {
                same(&recvs_w32[from], &expected, "all-to-allw words")?;
            }
        }
        let mut in_place_w: Vec<Vec<u32>> = (0..size)
            .map(|p| block(seed + 60, rank, p, sym(rank, p)))
            .collect();
        {
            let mut refs: Vec<&mut dyn BufferMut> = in_place_w
                .iter_mut()
                .map(|b| b as &mut dyn BufferMut)
                .collect();
            scope(|s| done(world.immediate_all_to_all_w_in_place(s, &mut refs)?))?;
        }
        for (from, got) in in_place_w.iter().enumerate() {
            same(
                got,
                &block(seed + 60, from, rank, sym(from, rank)),
                "all-to-allw in place",
            )?;
        }
    }
    Ok(())
}

fn reductions(world: &Communicator) -> Result<()> {
    let (rank, size) = (world.rank() as usize, world.size() as usize);
    let sum = SystemOperation::sum();
    let compose_op = composition();
    // Counts of 4-byte elements on both sides of 2048 bytes, and 2 MiB.
    for (seed, count) in [0, 1, 511, 513, 5000, 1 << 19].into_iter().enumerate() {
        let root = (seed * 3) % size;
        let process = world.process_at_rank(root as i32);
        let mine = words(seed, rank, count);
        let total = summed(seed, 0..size, count);
        let (maps, maps_composed) = (affines(rank, count), composed(0..size, count));

        let mut result = vec![0u32; count];
        let mut in_place = mine.clone();
        let mut composed_all = vec![0u32; count];
        scope(|s| {
            let requests = vec![
                world.immediate_all_reduce_into(s, &mine[..], &mut result[..], sum)?,
                world.immediate_all_reduce_in_place(s, &mut in_place[..], sum)?,
                world.immediate_all_reduce_into(
                    s,
                    &maps[..],
                    &mut composed_all[..],
                    &compose_op,
                )?,
            ];
            wait_all(requests).map(drop)
        })?;
        same(&result, &total, &format!("all-reduce sum of {count}"))?;
        same(
            &in_place,
            &total,
            &format!("all-reduce in place of {count}"),
        )?;
        same(&composed_all, &maps_composed, "all-reduce, non-commutative")?;

        let mut at_root = vec![0u32; count];
        let mut at_root_in_place = mine.clone();
        let mut composed_at_root = vec![0u32; count];
        scope(|s| {
            let requests = if rank == root {
                vec![
                    process.immediate_reduce_into_root(s, &mine[..], &mut at_root[..], sum)?,
                    process.immediate_reduce_into_root_in_place(
                        s,
                        &mut at_root_in_place[..],
                        sum,
                    )?,
                    process.immediate_reduce_into_root(
                        s,
                        &maps[..],
                        &mut composed_at_root[..],
                        &compose_op,
                    )?,
                ]
            } else {
                vec![
                    process.immediate_reduce_into(s, &mine[..], sum)?,
                    process.immediate_reduce_into(s, &mine[..], sum)?,
                    process.immediate_reduce_into(s, &maps[..], &compose_op)?,
                ]
            };
            wait_all(requests).map(drop)
        })?;
        if rank == root {
            same(&at_root, &total, &format!("reduce sum of {count}"))?;
            same(&at_root_in_place, &total, "reduce in place")?;
            same(&composed_at_root, &maps_composed, "reduce, non-commutative")?;
        }
    }
    Ok(())
}

fn reduce_scatter(world: &Communicator) -> Result<()> {
    let (rank, size) = (world.rank() as usize, world.size() as usize);
    let sum = SystemOperation::sum();
    for (seed, count) in [0, 1, 700, 20_000].into_iter().enumerate() {
        let mine = words(seed, rank, size * count);
        let total = summed(seed, 0..size, size * count);
        let expected = &total[rank * count..(rank + 1) * count];
        let mut block_out = vec![0u32; count];
        let mut in_place = mine.clone();
        scope(|s| {
            let requests = vec![
                world.immediate_reduce_scatter_block_into(s, &mine[..], &mut block_out[..], sum)?,
                world.immediate_reduce_scatter_block_in_place(s, &mut in_place[..], sum)?,
            ];
            wait_all(requests).map(drop)
        })?;
        same(&block_out, expected, "reduce-scatter-block")?;
        same(
            &in_place[..count],
            expected,
            "reduce-scatter-block in place",
        )?;

        // Varying counts, with the non-commutative operation.
        let counts: Vec<i32> = (0..size).map(|r| (r * count / 3 + r % 2) as i32).collect();
        let all: usize = counts.iter().map(|&c| c as usize).sum();
        let start: usize = counts[..rank].iter().map(|&c| c as usize).sum();
        let mine_len = counts[rank] as usize;
        let maps = affines(rank, all);
        let expected = composed(0..size, all)[start..start + mine_len].to_vec();
        let compose_op = composition();
        let mut out = vec![0u32; mine_len];
        let mut in_place = maps.clone();
        scope(|s| {
            let requests = vec![
                world.immediate_reduce_scatter_into(
                    s,
                    &maps[..],
                    &mut out[..],
                    &counts,
                    &compose_op,
                )?,
                world.immediate_reduce_scatter_in_place(
                    s,
                    &mut in_place[..],
                    &counts,
                    &compose_op,
                )?,
            ];
            wait_all(requests).map(drop)
        })?;
        same(&out, &expected, "reduce-scatter, non-commutative")?;
        same(&in_place[..mine_len], &expected, "reduce-scatter in place")?;
    }
    Ok(())
}

fn scans(world: &Communicator) -> Result<()> {
    let rank = world.rank() as usize;
    let compose_op = composition();
    let sum = SystemOperation::sum();
    for (seed, count) in [0, 1, 1000, 100_000].into_iter().enumerate() {
        let maps = affines(rank, count);
        let mine = words(seed, rank, count);
        let mut scanned = vec![0u32; count];
        let mut scanned_in_place = maps.clone();
        let mut sums = vec![0u32; count];
        let mut exclusive = vec![7u32; count];
        let mut exclusive_in_place = maps.clone();
        scope(|s| {
            let requests = vec![
                world.immediate_scan_into(s, &maps[..], &mut scanned[..], &compose_op)?,
                world.immediate_scan_in_place(s, &mut scanned_in_place[..], &compose_op)?,
                world.immediate_scan_into(s, &mine[..], &mut sums[..], sum)?,
                world.immediate_exclusive_scan_into(
                    s,
                    &maps[..],
                    &mut exclusive[..],
                    &compose_op,
                )?,
                world.immediate_exclusive_scan_in_place(
                    s,
                    &mut exclusive_in_place[..],
                    &compose_op,
                )?,
            ];
            wait_all(requests).map(drop)
        })?;
        same(&scanned, &composed(0..rank + 1, count), "scan")?;
        same(
            &scanned_in_place,
            &composed(0..rank + 1, count),
            "scan in place",
        )?;
        same(&sums, &summed(seed, 0..rank + 1, count), "scan sum")?;
        if rank > 0 {
            same(&exclusive, &composed(0..rank, count), "exclusive scan")?;
            same(
                &exclusive_in_place,
                &composed(0..rank, count),
                "exclusive scan in place",
            )?;
        } else {
            same(&exclusive, &vec![7u32; count], "rank 0's exclusive scan")?;
        }
    }
    Ok(())
}

/// Arguments a process can check alone fail when the collective starts,
/// with their classes, before anything is sent (the other processes do
/// not take part either).
fn errors(world: &Communicator) -> Result<()> {
    let (rank, size) = (world.rank(), world.size());
    let send = [1u32; 3];
    let mut too_long = vec![0u32; 3 * size as usize + 1];
    let mut gathered = vec![0u32; 3 * size as usize];
    let mut words_out = [0u32; 3];
    let bytes_in = [0u8; 3];
    let mut floats = [0f32; 2];
    let mut buf = [0u8; 4];
    scope(|s| {
        expect_class(
            world.immediate_all_gather_into(s, &send[..], &mut too_long[..]),
            ErrorClass::Count,
            "an all-gather into a receive buffer of the wrong length",
        )?;
        expect_class(
            world.immediate_all_reduce_into(
                s,
                &bytes_in[..],
                &mut words_out[..],
                SystemOperation::sum(),
            ),
            ErrorClass::Type,
            "an all-reduce from bytes into words",
        )?;
        expect_class(
            world.immediate_all_reduce_in_place(s, &mut floats[..], SystemOperation::bitwise_and()),
            ErrorClass::Op,
            "a bitwise and of floats",
        )?;
        expect_class(
            world
                .process_at_rank(size)
                .immediate_broadcast_into(s, &mut buf[..]),
            ErrorClass::Root,
            "a broadcast from a root outside the communicator",
        )?;
        let other = (rank + 1) % size;
        if other != rank {
            expect_class(
                world.process_at_rank(other).immediate_gather_into_root(
                    s,
                    &send[..],
                    &mut gathered[..],
                ),
                ErrorClass::Root,
                "a root's gather called at another rank",
            )?;
        }
        Ok::<_, Error>(())
    })?;

    // Counts that disagree between processes fail at completion, at the
    // processes that see it: rank 0 sends two elements to every process,
    // which all expect one from it. Every other process receives too
    // much from rank 0 (MPI_ERR_TRUNCATE); rank 0 sends itself two where
    // it expects one (MPI_ERR_COUNT).
    let n = size as usize;
    let sends_from_me = if rank == 0 { 2 } else { 1 };
    let send_counts = vec![sends_from_me; n];
    let send_displs: Vec<i32> = (0..n as i32).map(|i| i * sends_from_me).collect();
    let outgoing = vec![5u32; 2 * n];
    let recv_counts = vec![1i32; n];
    let recv_displs: Vec<i32> = (0..n as i32).collect();
    let mut incoming = vec![0u32; n];
    let outcome = scope(|s| {
        world
            .immediate_all_to_all_varcount_into(
                s,
                Partition::new(&outgoing[..], &send_counts[..], &send_displs[..]),
                PartitionMut::new(&mut incoming[..], &recv_counts[..], &recv_displs[..]),
            )?
            .wait()
    });
    let class = if rank == 0 {
        ErrorClass::Count
    } else {
        ErrorClass::Truncate
    };
    expect_class(outcome, class, "an all-to-allv whose counts disagree")?;
    // The communicator still works, and its collectives still match.
    done(world.immediate_barrier()?)
}

/// Many collectives under way at once on one communicator, with
/// point-to-point messages between them, completed in other orders than
/// they were started.
fn overlap(world: &Communicator) -> Result<()> {
    let (rank, size) = (world.rank() as usize, world.size() as usize);
    let (right, left) = ((rank + 1) % size, (rank + size - 1) % size);
    let sum = SystemOperation::sum();
    let compose_op = composition();
    for round in 0..8 {
        // Eight all-reduces of different sizes, one kind, all at once.
        let counts = [1, 700, 3000, 0, 40_000, 5, 300_000, 64];
        let inputs: Vec<Vec<u32>> = counts
            .iter()
            .enumerate()
            .map(|(k, &c)| words(round * 100 + k, rank, c))
            .collect();
        let mut outputs: Vec<Vec<u32>> = counts.iter().map(|&c| vec![0u32; c]).collect();
        scope(|s| {
            let mut requests = Vec::new();
            for (input, output) in inputs.iter().zip(outputs.iter_mut()) {
                requests.push(world.immediate_all_reduce_into(
                    s,
                    &input[..],
                    &mut output[..],
                    sum,
                )?);
            }
            // Completed last first.
            while let Some(request) = requests.pop() {
                done(request)?;
            }
            Ok::<_, Error>(())
        })?;
        for (k, (&c, output)) in counts.iter().zip(&outputs).enumerate() {
            same(
                output,
                &summed(round * 100 + k, 0..size, c),
                "overlapping all-reduces",
            )?;
        }

        // Collectives of several kinds and point-to-point messages on the
        // same communicator, under way together.
        let root = round % size;
        let bcast_len = if round % 2 == 0 { 300_000 } else { 100 };
        let mut bcast = if rank == root {
            words(round, root, bcast_len)
        } else {
            vec![0; bcast_len]
        };
        let mut from_left = vec![0u32; 50_000];
        let to_right = words(round + 500, rank, 50_000);
        let gather_mine = words(round + 600, rank, 2000);
        let mut gathered = vec![0u32; size * 2000];
        let a2a_send: Vec<u32> = (0..size)
            .flat_map(|to| block(round, rank, to, 500))
            .collect();
        let mut a2a_recv = vec![0u32; size * 500];
        let maps = affines(rank, 900);
        let mut scanned = vec![0u32; 900];
        let mut second_bcast = vec![0u32; 20_000];
        if rank == (root + 1) % size {
            second_bcast = words(round + 700, rank, 20_000);
        }
        let mut small_from_left = [0u32; 1];
        let small_to_right = [rank as u32];
        scope(|s| {
            let mut requests: Vec<Request<'_>> = vec![
                world
                    .process_at_rank(root as i32)
                    .immediate_broadcast_into(s, &mut bcast[..])?,
                world
                    .process_at_rank(left as i32)
                    .immediate_receive_into_with_tag(s, &mut from_left[..], 7)?,
                world.immediate_all_gather_into(s, &gather_mine[..], &mut gathered[..])?,
                world
                    .process_at_rank(right as i32)
                    .immediate_send_with_tag(s, &to_right[..], 7)?,
                world.immediate_all_to_all_into(s, &a2a_send[..], &mut a2a_recv[..])?,
                world.immediate_barrier()?,
                world.immediate_scan_into(s, &maps[..], &mut scanned[..], &compose_op)?,
                world
                    .process_at_rank(((root + 1) % size) as i32)
                    .immediate_broadcast_into(s, &mut second_bcast[..])?,
                world
                    .process_at_rank(left as i32)
                    .immediate_receive_into_with_tag(s, &mut small_from_left[..], 8)?,
                world
                    .process_at_rank(right as i32)
                    .immediate_send_with_tag(s, &small_to_right[..], 8)?,
            ];
            match round % 4 {
                0 => {
                    requests.reverse();
                    for request in requests {
                        done(request)?;
                    }
                }
                1 => {
                    while let Some((_, outcome)) = wait_any(&mut requests)? {
                        outcome?;
                    }
                }
                2 => {
                    // Tests alone, of the whole list.
                    while let Some(completed) = test_some(&mut requests)? {
                        for (_, outcome) in completed {
                            outcome?;
                        }
                        if requests.is_empty() {
                            break;
                        }
                    }
                }
                _ => {
                    // Every other one first, the rest after.
                    let mut rest = Vec::new();
                    for (k, request) in requests.into_iter().enumerate() {
                        if k % 2 == 1 {
                            done(request)?;
                        } else {
                            rest.push(request);
                        }
                    }
                    wait_all(rest)?;
                }
            }
            Ok::<_, Error>(())
        })?;
        same(
            &bcast,
            &words(round, root, bcast_len),
            "overlapping broadcast",
        )?;
        same(
            &from_left,
            &words(round + 500, left, 50_000),
            "message from the left",
        )?;
        let all: Vec<u32> = (0..size)
            .flat_map(|r| words(round + 600, r, 2000))
            .collect();
        same(&gathered, &all, "overlapping all-gather")?;
        let expected: Vec<u32> = (0..size)
            .flat_map(|from| block(round, from, rank, 500))
            .collect();
        same(&a2a_recv, &expected, "overlapping all-to-all")?;
        same(&scanned, &composed(0..rank + 1, 900), "overlapping scan")?;
        same(
            &second_bcast,
            &words(round + 700, (root + 1) % size, 20_000),
            "second overlapping broadcast",
        )?;
        same(
            &small_from_left,
            &[left as u32],
            "small message from the left",
        )?;

        // A blocking collective while non-blocking ones are under way.
        let mut pending_sum = vec![0u32; 10_000];
        let pending_in = words(round + 800, rank, 10_000);
        let mut blocking_sum = vec![0u32; 1000];
        let blocking_in = words(round + 900, rank, 1000);
        scope(|s| {
            let request =
                world.immediate_all_reduce_into(s, &pending_in[..], &mut pending_sum[..], sum)?;
            world.all_reduce_into(&blocking_in[..], &mut blocking_sum[..], sum)?;
            done(request)
        })?;
        same(
            &pending_sum,
            &summed(round + 800, 0..size, 10_000),
            "all-reduce around a blocking one",
        )?;
        same(
            &blocking_sum,
            &summed(round + 900, 0..size, 1000),
            "blocking all-reduce amid a pending one",
        )?;
    }
    // Requests dropped without a wait: the end of their scope completes
    // them, and their results are in place after it.
    let inputs: Vec<Vec<u32>> = (0..3).map(|k| words(900 + k, rank, 30_000)).collect();
    let mut outputs = vec![vec![0u32; 30_000]; 3];
    scope(|s| {
        for (input, output) in inputs.iter().zip(outputs.iter_mut()) {
            drop(world.immediate_all_reduce_into(s, &input[..], &mut output[..], sum)?);
        }
        Ok::<_, Error>(())
    })?;
    for (k, output) in outputs.iter().enumerate() {
        same(
            output,
            &summed(900 + k, 0..size, 30_000),
            "all-reduce completed by its scope",
        )?;
    }

    // A duplicate communicator's collectives stay apart from world's.
    let dup = world.duplicate()?;
    let mut on_world = vec![0u32; 5000];
    let mut on_dup = vec![0u32; 5000];
    let (in_world, in_dup) = (words(1, rank, 5000), words(2, rank, 5000));
    scope(|s| {
        let a = world.immediate_all_reduce_into(s, &in_world[..], &mut on_world[..], sum)?;
        let b = dup.immediate_all_reduce_into(s, &in_dup[..], &mut on_dup[..], sum)?;
        done(b)?;
        done(a)
    })?;
    same(&on_world, &summed(1, 0..size, 5000), "all-reduce on world")?;
    same(
        &on_dup,
        &summed(2, 0..size, 5000),
        "all-reduce on a duplicate",
    )
}

/// Progress without waiting on the collectives: rank 0 starts collectives
/// of several rounds, then only tests (or looks at the status of) a
/// receive that the last rank answers once its collectives are complete,
/// so they must advance in those calls; the other ranks only test their
/// collectives' own requests.
fn progress(world: &Communicator) -> Result<()> {
    let (rank, size) = (world.rank() as usize, world.size() as usize);
    let sum = SystemOperation::sum();
    let last = size - 1;
    for round in 0..3 {
        let len = [300_000, 5000, 1 << 19][round];
        let mine = words(round, rank, len);
        let mut total = vec![0u32; len];
        let mut bcast = if rank == 0 {
            words(round + 10, 0, len)
        } else {
            vec![0u32; len]
        };
        let mut token = [0u32; 1];
        let reply = [round as u32 + 1];
        scope(|s| {
            let reduce = world.immediate_all_reduce_into(s, &mine[..], &mut total[..], sum)?;
            let broadcast = world
                .process_at_rank(0)
                .immediate_broadcast_into(s, &mut bcast[..])?;
            if rank == 0 && size > 1 {
                let mut answer = world
                    .process_at_rank(last as i32)
                    .immediate_receive_into_with_tag(s, &mut token[..], 9)?;
                if round == 1 {
                    // Looks without completing, then completes.
                    while answer.get_status()?.is_none() {}
                    done(answer)?;
                } else {
                    loop {
                        match answer.test() {
                            Ok(outcome) => {
                                outcome?;
                                break;
                            }
                            Err(pending) => answer = pending,
                        }
                    }
                }
            } else {
                let mut requests = vec![reduce, broadcast];
                // Only tests, never a wait.
                while !requests.is_empty() {
                    let mut still = Vec::new();
                    for request in requests {
                        match request.test() {
                            Ok(outcome) => {
                                outcome?;
                            }
                            Err(pending) => still.push(pending),
                        }
                    }
                    requests = still;
                }
                if rank == last && size > 1 {
                    done(
                        world
                            .process_at_rank(0)
                            .immediate_send_with_tag(s, &reply[..], 9)?,
                    )?;
                }
                return Ok(());
            }
            // Rank 0: the collectives finished while it tested the
            // receive, or finish now.
            done(reduce)?;
            done(broadcast)
        })?;
        same(
            &total,
            &summed(round, 0..size, len),
            "all-reduce moved by tests",
        )?;
        same(
            &bcast,
            &words(round + 10, 0, len),
            "broadcast moved by tests",
        )?;
        if rank == 0 && size > 1 {
            same(&token, &[round as u32 + 1], "the answer")?;
        }
    }
    Ok(())
}
