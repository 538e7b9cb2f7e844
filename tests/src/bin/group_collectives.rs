//! Collectives between the groups of an intercommunicator, and the
//! neighbourhood collectives, run as real jobs: `group_collectives
//! CHECK`, started by the harness through oxrun. Every result is compared
//! with a sequential reference that each rank computes alone. A check
//! exits non-zero, saying why, when something is wrong.
//!
//! Checks: `inter` (2 or more ranks: an intercommunicator of the first
//! third of world and the rest, groups of unequal sizes; every collective
//! between them, blocking and not, rooted ones from each group, small and
//! large, with a non-commutative operation, the non-blocking rooted ones
//! all under way at once, and the root's group mates passing each one
//! (MPI_PROC_NULL); the error classes of bad
//! arguments and of counts that differ between the groups),
//! `inter_pieces_memory` (32 MiB strided all-reduce, reduce, broadcast,
//! gather(v), scatter(v) and reduce-scatter-block between the groups add
//! little to the peak memory), `neighbor`
//! (the v and w neighbourhood collectives and the non-blocking form of
//! each, on a periodic ring, a 2-d grid, a graph and a distributed graph
//! with repeated edges, and the fixed-size ones where some processes pass
//! strided columns and others contiguous data), `neighbor_varcount_mixed`
//! (the same topologies: the v and w forms, blocking and not, where some
//! processes pass strided columns and others contiguous data, blocks of
//! 0 to 20,000 elements in reverse order), `neighbor_pieces_memory`
//! (32 MiB strided neighbourhood collectives of every form on a periodic
//! ring add little to the peak memory), `handler` (collectives hand their errors to the
//! communicator's error handler), `alone` (2 or more ranks: a collective
//! whose arguments are wrong at the last rank only fails there with its
//! class, and the collectives after it work everywhere), `node_alone` (2
//! or more ranks: the same with blocking collectives of small data, which
//! go through shared memory, on several communicators at once).

use oxmpi::collective::{Partition, PartitionMut, SystemOperation};
use oxmpi::datatype::{Buffer, BufferMut, MutView, UserDatatype, View};
use oxmpi::request::{scope, wait_all};
use oxmpi::Equivalence;
use oxmpi::Threading;
use oxmpi::{Color, Communicator, ErrorClass, ErrorHandler, Result, PROC_NULL};
use oxmpi_jobs::affine::{affines, composed, composition};
use oxmpi_jobs::checks::{ensure, expect_class, fail, first_column_is, same, within_pieces_bound};
use oxmpi_jobs::program::{run_check, world_returning_errors};
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

fn main() -> ExitCode {
    let check = std::env::args().nth(1).unwrap_or_default();
    run_check(
        &format!("group_collectives {check}"),
        Threading::Single,
        |universe| {
            let world = world_returning_errors(universe);
            match check.as_str() {
                "inter" => inter(&world),
                "inter_pieces_memory" => inter_pieces_memory(&world),
                "neighbor" => neighbor(&world),
                "neighbor_pieces_memory" => neighbor_pieces_memory(&world),
                "neighbor_varcount_mixed" => neighbor_varcount_mixed(&world),
                "handler" => handler(&world),
                "alone" => alone(&world),
                "node_alone" => node_alone(&world),
                other => Err(fail(format!("unknown check {other:?}"))),
            }
        },
    )
}

/// Element `i` of process `id`'s data.
fn value(id: usize, i: usize) -> i64 {
    (id * 100_000 + i) as i64
}

fn values(id: usize, len: usize) -> Vec<i64> {
    (0..len).map(|i| value(id, i)).collect()
}

/// Element `i` of what process `from` sends to process `to`.
fn pair_value(from: usize, to: usize, i: usize) -> i32 {
    (from * 10_000 + to * 100 + i) as i32
}

/// How many elements process `from` sends to `to` in the varying
/// exchanges.
fn pair_count(from: usize, to: usize) -> usize {
    (from + 2 * to) % 4
}

/// Displacements of blocks of `counts` in reverse order with a gap of 2
/// after each, and the length they need.
fn reversed_layout(counts: &[i32]) -> (Vec<i32>, usize) {
    let mut displs = vec![0; counts.len()];
    let mut at = 0;
    for r in (0..counts.len()).rev() {
        displs[r] = at;
        at += counts[r] + 2;
    }
    (displs, at as usize)
}

/// Displacements of consecutive blocks of `counts`.
fn consecutive(counts: &[i32]) -> Vec<i32> {
    counts
        .iter()
        .scan(0, |at, &c| {
            let d = *at;
            *at += c;
            Some(d)
        })
        .collect()
}

// ---------------------------------------------------------------- inter

/// The two groups of an intercommunicator, seen from one process.
struct Sides {
    inter: Communicator,
    /// World rank: the process's id in the data.
    me: usize,
    /// Whether this process is in the first group (world ranks below
    /// `cut`).
    in_a: bool,
    cut: usize,
    rank: usize,
    /// Sizes of the local and the remote group.
    local: usize,
    remote: usize,
}

impl Sides {
    /// World rank of rank `q` of the remote group.
    fn remote_id(&self, q: usize) -> usize {
        if self.in_a {
            self.cut + q
        } else {
            q
        }
    }

    fn remote_ids(&self) -> impl Iterator<Item = usize> + Clone + '_ {
        (0..self.remote).map(|q| self.remote_id(q))
    }

    /// World rank of rank `q` of the group `a` (true: the first).
    fn id_in(&self, a: bool, q: usize) -> usize {
        if a {
            q
        } else {
            self.cut + q
        }
    }
}

/// The intercommunicator of the first third of world and the rest, as
/// this process sees it (2 or more ranks): groups of unequal sizes, 1+1,
/// 1+2, 2+2, 2+3, 2+4, 3+4, 3+5 for 2 to 8 ranks.
fn sides(world: &Communicator) -> Result<Sides> {
    let size = world.size() as usize;
    ensure(size >= 2, || {
        "an intercommunicator needs 2 or more ranks".into()
    })?;
    let cut = size.div_ceil(3).max(1);
    let me = world.rank() as usize;
    let in_a = me < cut;
    let local = world
        .split_by_color(Color::with_value(i32::from(in_a)))?
        .ok_or_else(|| fail("no group for a defined colour"))?;
    let inter = local.create_intercommunicator(0, world, if in_a { cut as i32 } else { 0 }, 55)?;
    Ok(Sides {
        me,
        in_a,
        cut,
        rank: inter.rank() as usize,
        local: inter.size() as usize,
        remote: inter.remote_size()? as usize,
        inter,
    })
}

fn inter(world: &Communicator) -> Result<()> {
    let size = world.size() as usize;
    let s = sides(world)?;
    let (me, cut) = (s.me, s.cut);
    // 300 000 `i64`s are three segments of an all-reduce.
    for len in [0, 5, 40_000, 300_000] {
        all_reduce(&s, len)?;
        reduce_scatter(&s, len)?;
    }
    for len in [1, 3, 20_000] {
        all_gather(&s, len)?;
        all_to_all(&s, len)?;
    }
    varying(&s)?;
    immediate(&s)?;
    for (root_in_a, root) in [(true, s.cut - 1), (false, 0), (false, size - cut - 1)] {
        for len in [2, 9_000] {
            rooted(&s, root_in_a, root, len)?;
            rooted_immediate(&s, root_in_a, root, len)?;
        }
    }
    inter_errors(&s)?;
    expect_class(
        world.pass_remote_group_collective(),
        ErrorClass::Comm,
        "passing a rooted collective on an intracommunicator",
    )?;
    s.inter.barrier()?;
    if me == 0 {
        println!("inter: {} and {} ranks, every collective", cut, size - cut);
    }
    Ok(())
}

/// A 32 MiB strided all-reduce between the groups of an
/// intercommunicator (each process's column of a two-column matrix of
/// `f64`, into another's), a reduce from the second group to the
/// first's rank 0 and a broadcast from it, and the collectives of
/// `inter_pieces_memory_blocks`, grow no process's peak memory by a
/// packed copy: they go a segment or a block at a time.
fn inter_pieces_memory(world: &Communicator) -> Result<()> {
    let s = sides(world)?;
    let rows = 4 << 20;
    let column = UserDatatype::vector(rows as i32, 1, 2, &f64::equivalent_datatype())?;
    let cell = |id: usize, r: usize| (id * 1000 + r % 1000) as f64;
    let data: Vec<f64> = (0..rows * 2).map(|i| cell(s.me, i / 2)).collect();
    let mut received = vec![-1.0f64; rows * 2];
    within_pieces_bound(
        &s.inter,
        "a 32 MiB strided all-reduce between groups",
        || {
            let send = View::with_count_and_datatype(&data[..], 1, &column)?;
            let mut recv = MutView::with_count_and_datatype(&mut received[..], 1, &column)?;
            s.inter
                .all_reduce_into(&send, &mut recv, SystemOperation::sum())
        },
    )?;
    let expected = |r: usize| s.remote_ids().map(|id| cell(id, r)).sum::<f64>();
    first_column_is(
        &received,
        0..rows,
        expected,
        "the strided all-reduce between groups",
    )?;
    // A reduce to the first group's rank 0 from the second group.
    received.fill(-1.0);
    let root = s.in_a && s.rank == 0;
    within_pieces_bound(&s.inter, "a 32 MiB strided reduce between groups", || {
        if root {
            let mut recv = MutView::with_count_and_datatype(&mut received[..], 1, &column)?;
            s.inter
                .reduce_from_remote_group(&mut recv, SystemOperation::sum())
        } else if s.in_a {
            s.inter.pass_remote_group_collective()
        } else {
            let send = View::with_count_and_datatype(&data[..], 1, &column)?;
            s.inter
                .reduce_to_remote_group(0, &send, SystemOperation::sum())
        }
    })?;
    if root {
        first_column_is(
            &received,
            0..rows,
            expected,
            "the strided reduce between groups",
        )?;
    }
    // A broadcast from the first group's rank 0 to the second group: sent
    // and received as the columns lie, the rows between them untouched.
    received.fill(-1.0);
    within_pieces_bound(
        &s.inter,
        "a 32 MiB strided broadcast between groups",
        || {
            if root {
                let send = View::with_count_and_datatype(&data[..], 1, &column)?;
                s.inter.broadcast_to_remote_group(&send)
            } else if s.in_a {
                s.inter.pass_remote_group_collective()
            } else {
                let mut recv = MutView::with_count_and_datatype(&mut received[..], 1, &column)?;
                s.inter.broadcast_from_remote_group(0, &mut recv)
            }
        },
    )?;
    if !s.in_a {
        let root_id = s
            .remote_ids()
            .next()
            .ok_or_else(|| fail("no remote group"))?;
        let wrong = (0..rows * 2).find(|&i| {
            let expected = if i % 2 == 0 {
                cell(root_id, i / 2)
            } else {
                -1.0
            };
            received[i] != expected
        });
        if let Some(i) = wrong {
            return Err(fail(format!(
                "the strided broadcast between groups: element {i} holds {}",
                received[i]
            )));
        }
    }
    inter_pieces_memory_blocks(&s, &data, &mut received, cell)
}

/// The part of `inter_pieces_memory` that moves blocks of a 32 MiB
/// strided column (two-column matrices of `f64`, `cell(id, row)` in
/// process `id`'s first column): a gather, gather-v, scatter and
/// scatter-v between the first group's rank 0 and the second group, a
/// block of the column from or to each process there (in reverse rank
/// order for the varcount forms), and a reduce-scatter-block between the
/// groups. None grows a process's peak memory by a packed copy.
fn inter_pieces_memory_blocks(
    s: &Sides,
    data: &[f64],
    received: &mut [f64],
    cell: impl Fn(usize, usize) -> f64,
) -> Result<()> {
    let rows = data.len() / 2;
    let f64t = f64::equivalent_datatype();
    let column = UserDatatype::vector(rows as i32, 1, 2, &f64t)?;
    // The second group's size, and each of its processes' rows.
    let others = if s.in_a { s.remote } else { s.local };
    let part = rows / others;
    let part_column = UserDatatype::vector(part as i32, 1, 2, &f64t)?;
    // The column as `others` blocks of `part` rows.
    let parts = UserDatatype::resized(&part_column, 0, (part * 2 * 8) as isize)?;
    // One `f64` of the first column: counts of it address rows.
    let strided = UserDatatype::resized(&f64t, 0, 16)?;
    let counts = vec![part as i32; others];
    let in_order: Vec<i32> = (0..others).map(|q| (q * part) as i32).collect();
    let reversed: Vec<i32> = (0..others)
        .map(|q| ((others - 1 - q) * part) as i32)
        .collect();
    let root = s.in_a && s.rank == 0;
    // Gathers: rank `q` of the second group sends rows `q * part..` of
    // its column, which land at block `q` (reversed: `others - 1 - q`).
    for varcount in [false, true] {
        let what = if varcount { "gather-v" } else { "gather" };
        received.fill(-1.0);
        within_pieces_bound(
            &s.inter,
            &format!("a 32 MiB strided {what} between groups"),
            || {
                if root && varcount {
                    let mut recv =
                        MutView::with_count_and_datatype(&mut received[..], rows as i32, &strided)?;
                    s.inter
                        .gather_varcount_from_remote_group(&mut PartitionMut::new(
                            &mut recv,
                            &counts[..],
                            &reversed[..],
                        ))
                } else if root {
                    let mut recv =
                        MutView::with_count_and_datatype(&mut received[..], others as i32, &parts)?;
                    s.inter.gather_from_remote_group(&mut recv)
                } else if s.in_a {
                    s.inter.pass_remote_group_collective()
                } else {
                    let mine = &data[2 * s.rank * part..];
                    let send = View::with_count_and_datatype(mine, 1, &part_column)?;
                    if varcount {
                        s.inter.gather_varcount_to_remote_group(0, &send)
                    } else {
                        s.inter.gather_to_remote_group(0, &send)
                    }
                }
            },
        )?;
        if root {
            let owner = |r: usize| {
                let block = r / part;
                let q = if varcount { others - 1 - block } else { block };
                cell(s.remote_id(q), q * part + r % part)
            };
            first_column_is(
                received,
                0..rows,
                owner,
                &format!("the strided {what} between groups"),
            )?;
        }
    }
    // Scatters: rank `q` of the second group receives block `q` of the
    // root's column.
    for varcount in [false, true] {
        let what = if varcount { "scatter-v" } else { "scatter" };
        received.fill(-1.0);
        within_pieces_bound(
            &s.inter,
            &format!("a 32 MiB strided {what} between groups"),
            || {
                if root {
                    if varcount {
                        let send = View::with_count_and_datatype(data, rows as i32, &strided)?;
                        s.inter.scatter_varcount_to_remote_group(&Partition::new(
                            &send,
                            &counts[..],
                            &in_order[..],
                        ))
                    } else {
                        let send = View::with_count_and_datatype(data, others as i32, &parts)?;
                        s.inter.scatter_to_remote_group(&send)
                    }
                } else if s.in_a {
                    s.inter.pass_remote_group_collective()
                } else {
                    let mut recv =
                        MutView::with_count_and_datatype(&mut received[..], 1, &part_column)?;
                    if varcount {
                        s.inter.scatter_varcount_from_remote_group(0, &mut recv)
                    } else {
                        s.inter.scatter_from_remote_group(0, &mut recv)
                    }
                }
            },
        )?;
        if !s.in_a {
            let of_root = |r: usize| cell(s.remote_id(0), s.rank * part + r);
            first_column_is(
                received,
                0..part,
                of_root,
                &format!("the strided {what} between groups"),
            )?;
        }
    }
    // A reduce-scatter-block of the columns: the first group's processes
    // each get a block of the second's sum, and the other way round.
    received.fill(-1.0);
    let block = rows / s.local;
    let block_column = UserDatatype::vector(block as i32, 1, 2, &f64t)?;
    within_pieces_bound(
        &s.inter,
        "a 32 MiB strided reduce-scatter-block between groups",
        || {
            let send = View::with_count_and_datatype(data, 1, &column)?;
            let mut recv = MutView::with_count_and_datatype(&mut received[..], 1, &block_column)?;
            s.inter
                .reduce_scatter_block_into(&send, &mut recv, SystemOperation::sum())
        },
    )?;
    let sum = |r: usize| {
        let row = s.rank * block + r;
        s.remote_ids().map(|id| cell(id, row)).sum::<f64>()
    };
    first_column_is(
        received,
        0..block,
        sum,
        "the strided reduce-scatter-block between groups",
    )
}

fn all_reduce(s: &Sides, len: usize) -> Result<()> {
    let mut sum = vec![0i64; len];
    s.inter
        .all_reduce_into(&values(s.me, len)[..], &mut sum[..], SystemOperation::sum())?;
    let expected: Vec<i64> = (0..len)
        .map(|i| s.remote_ids().map(|id| value(id, i)).sum())
        .collect();
    same(&sum, &expected, "all-reduce, sum")?;
    let mut maps = vec![0u32; len];
    s.inter
        .all_reduce_into(&affines(s.me, len)[..], &mut maps[..], composition())?;
    same(
        &maps,
        &composed(s.remote_ids(), len),
        "all-reduce, non-commutative",
    )
}

fn reduce_scatter(s: &Sides, len: usize) -> Result<()> {
    // Both groups reduce as many elements: a multiple of both sizes for
    // the blocks.
    let total = len.max(1) * s.local * s.remote;
    let block = total / s.local;
    let mut got = vec![0u32; block];
    let op = composition();
    s.inter
        .reduce_scatter_block_into(&affines(s.me, total)[..], &mut got[..], &op)?;
    let expected = composed(s.remote_ids(), total);
    same(
        &got,
        &expected[s.rank * block..(s.rank + 1) * block],
        "reduce-scatter-block",
    )?;
    // Counts that differ by rank, the same total in both groups.
    let total = len + 7;
    let counts: Vec<i32> = (0..s.local)
        .map(|q| (total / s.local + usize::from(q < total % s.local)) as i32)
        .collect();
    let start: usize = counts[..s.rank].iter().map(|&c| c as usize).sum();
    let mut got = vec![0u32; counts[s.rank] as usize];
    s.inter
        .reduce_scatter_into(&affines(s.me, total)[..], &mut got[..], &counts, &op)?;
    let expected = composed(s.remote_ids(), total);
    same(&got, &expected[start..start + got.len()], "reduce-scatter")
}

/// The length of a process's block in the all-gather of `len`: the
/// groups' differ.
fn gather_len(in_a: bool, len: usize) -> usize {
    if in_a {
        len
    } else {
        len + 1
    }
}

fn all_gather(s: &Sides, len: usize) -> Result<()> {
    let theirs = gather_len(!s.in_a, len);
    let mut got = vec![0i64; s.remote * theirs];
    s.inter
        .all_gather_into(&values(s.me, gather_len(s.in_a, len))[..], &mut got[..])?;
    let expected: Vec<i64> = s.remote_ids().flat_map(|id| values(id, theirs)).collect();
    same(&got, &expected, "all-gather")
}

fn all_to_all(s: &Sides, len: usize) -> Result<()> {
    let send: Vec<i32> = s
        .remote_ids()
        .flat_map(|to| (0..len).map(move |i| pair_value(s.me, to, i)))
        .collect();
    let mut got = vec![0i32; s.remote * len];
    s.inter.all_to_all_into(&send[..], &mut got[..])?;
    let expected: Vec<i32> = s
        .remote_ids()
        .flat_map(|from| (0..len).map(move |i| pair_value(from, s.me, i)))
        .collect();
    same(&got, &expected, "all-to-all")
}

/// All-gatherv, all-to-allv and all-to-allw.
fn varying(s: &Sides) -> Result<()> {
    // Rank q of a group sends q + 1 elements.
    let counts: Vec<i32> = (0..s.remote as i32).map(|q| q + 1).collect();
    let (displs, len) = reversed_layout(&counts);
    let mut got = vec![-1i64; len];
    s.inter.all_gather_varcount_into(
        &values(s.me, s.rank + 1)[..],
        &mut PartitionMut::new(&mut got[..], &counts[..], &displs[..]),
    )?;
    let mut expected = vec![-1i64; len];
    for q in 0..s.remote {
        let at = displs[q] as usize;
        expected[at..=at + q].copy_from_slice(&values(s.remote_id(q), q + 1));
    }
    same(&got, &expected, "all-gatherv")?;

    let send_counts: Vec<i32> = s
        .remote_ids()
        .map(|to| pair_count(s.me, to) as i32)
        .collect();
    let recv_counts: Vec<i32> = s
        .remote_ids()
        .map(|from| pair_count(from, s.me) as i32)
        .collect();
    let send: Vec<i32> = s
        .remote_ids()
        .flat_map(|to| (0..pair_count(s.me, to)).map(move |i| pair_value(s.me, to, i)))
        .collect();
    let (recv_displs, len) = reversed_layout(&recv_counts);
    let mut got = vec![-1i32; len];
    s.inter.all_to_all_varcount_into(
        &Partition::new(&send[..], &send_counts[..], consecutive(&send_counts)),
        &mut PartitionMut::new(&mut got[..], &recv_counts[..], &recv_displs[..]),
    )?;
    let mut expected = vec![-1i32; len];
    for (q, from) in s.remote_ids().enumerate() {
        let at = recv_displs[q] as usize;
        for i in 0..pair_count(from, s.me) {
            expected[at + i] = pair_value(from, s.me, i);
        }
    }
    same(&got, &expected, "all-to-allv")?;

    // A pair's type: u16 or f64, by the sum of their ids.
    let sends_u16: Vec<Vec<u16>> = s
        .remote_ids()
        .map(|to| {
            (0..pair_count(s.me, to))
                .map(|i| pair_value(s.me, to, i) as u16)
                .collect()
        })
        .collect();
    let sends_f64: Vec<Vec<f64>> = s
        .remote_ids()
        .map(|to| {
            (0..pair_count(s.me, to))
                .map(|i| pair_value(s.me, to, i) as f64)
                .collect()
        })
        .collect();
    let sends: Vec<&dyn Buffer> = s
        .remote_ids()
        .enumerate()
        .map(|(q, to)| -> &dyn Buffer {
            if (s.me + to).is_multiple_of(2) {
                &sends_u16[q]
            } else {
                &sends_f64[q]
            }
        })
        .collect();
    let mut recv_u16: Vec<Vec<u16>> = s
        .remote_ids()
        .map(|from| vec![0; pair_count(from, s.me)])
        .collect();
    let mut recv_f64: Vec<Vec<f64>> = s
        .remote_ids()
        .map(|from| vec![0.0; pair_count(from, s.me)])
        .collect();
    {
        let mut recvs: Vec<&mut dyn BufferMut> = recv_u16
            .iter_mut()
            .zip(recv_f64.iter_mut())
            .zip(s.remote_ids())
            .map(|((u, f), from)| -> &mut dyn BufferMut {
                if (s.me + from).is_multiple_of(2) {
                    u
                } else {
                    f
                }
            })
            .collect();
        s.inter.all_to_all_w_into(&sends, &mut recvs)?;
    }
    for (q, from) in s.remote_ids().enumerate() {
        let expected: Vec<i32> = (0..pair_count(from, s.me))
            .map(|i| pair_value(from, s.me, i))
            .collect();
        let got: Vec<i32> = if (s.me + from).is_multiple_of(2) {
            recv_u16[q].iter().map(|&v| i32::from(v)).collect()
        } else {
            recv_f64[q].iter().map(|&v| v as i32).collect()
        };
        let expected: Vec<i32> = if (s.me + from).is_multiple_of(2) {
            expected.iter().map(|&v| i32::from(v as u16)).collect()
        } else {
            expected
        };
        same(
            &got,
            &expected,
            &format!("all-to-allw from remote rank {q}"),
        )?;
    }
    Ok(())
}

/// The non-blocking forms, several under way at once.
fn immediate(s: &Sides) -> Result<()> {
    let len = 300;
    let maps = affines(s.me, len);
    let mine = values(s.me, len);
    let total = len * s.local * s.remote;
    let block = total / s.local;
    let input = affines(s.me, total);
    let send: Vec<i32> = s
        .remote_ids()
        .flat_map(|to| (0..len).map(move |i| pair_value(s.me, to, i)))
        .collect();
    let op = composition();
    let mut reduced = vec![0u32; len];
    let mut gathered = vec![0i64; s.remote * len];
    let mut exchanged = vec![0i32; s.remote * len];
    let mut scattered = vec![0u32; block];
    scope(|sc| {
        let requests = vec![
            s.inter
                .immediate_all_reduce_into(sc, &maps[..], &mut reduced[..], &op)?,
            s.inter
                .immediate_all_gather_into(sc, &mine[..], &mut gathered[..])?,
            s.inter
                .immediate_all_to_all_into(sc, &send[..], &mut exchanged[..])?,
            s.inter
                .immediate_reduce_scatter_block_into(sc, &input[..], &mut scattered[..], &op)?,
            s.inter.immediate_barrier()?,
        ];
        wait_all(requests).map(|_| ())
    })?;
    same(
        &reduced,
        &composed(s.remote_ids(), len),
        "immediate all-reduce",
    )?;
    let expected: Vec<i64> = s.remote_ids().flat_map(|id| values(id, len)).collect();
    same(&gathered, &expected, "immediate all-gather")?;
    let expected: Vec<i32> = s
        .remote_ids()
        .flat_map(|from| (0..len).map(move |i| pair_value(from, s.me, i)))
        .collect();
    same(&exchanged, &expected, "immediate all-to-all")?;
    same(
        &scattered,
        &composed(s.remote_ids(), total)[s.rank * block..(s.rank + 1) * block],
        "immediate reduce-scatter-block",
    )
}

/// How many collectives [`rooted`] and [`rooted_immediate`] make.
const ROOTED_CALLS: usize = 7;

/// What the rooted collectives from a root of id `root_id` to the
/// processes `other_ids`, with blocks of `len` elements and the varying
/// `counts`, leave at the root: the reduction by composition, the sum,
/// the gather and the gatherv into the layout `displs` of `total`
/// elements (-1 outside the blocks).
struct AtRoot {
    maps: Vec<u32>,
    sum: Vec<i64>,
    gathered: Vec<i64>,
    gathered_v: Vec<i64>,
}

impl AtRoot {
    fn expected(other_ids: &[usize], len: usize, counts: &[i32]) -> AtRoot {
        let (displs, total) = reversed_layout(counts);
        let mut gathered_v = vec![-1i64; total];
        for (q, &id) in other_ids.iter().enumerate() {
            let at = displs[q] as usize;
            gathered_v[at..at + counts[q] as usize]
                .copy_from_slice(&values(id, counts[q] as usize));
        }
        AtRoot {
            maps: composed(other_ids.iter().copied(), len),
            sum: (0..len)
                .map(|i| other_ids.iter().map(|&id| value(id, i)).sum())
                .collect(),
            gathered: other_ids.iter().flat_map(|&id| values(id, len)).collect(),
            gathered_v,
        }
    }

    fn check(&self, expected: &AtRoot, how: &str) -> Result<()> {
        same(&self.maps, &expected.maps, &format!("{how} reduce"))?;
        same(&self.sum, &expected.sum, &format!("{how} reduce, sum"))?;
        same(&self.gathered, &expected.gathered, &format!("{how} gather"))?;
        same(
            &self.gathered_v,
            &expected.gathered_v,
            &format!("{how} gatherv"),
        )
    }
}

/// [`rooted`] by the non-blocking forms, all under way at once, the root's
/// group mates (MPI_PROC_NULL) passing each one.
fn rooted_immediate(s: &Sides, root_in_a: bool, root: usize, len: usize) -> Result<()> {
    let inter = &s.inter;
    let others = s.local_or_remote(!root_in_a);
    let other_ids: Vec<usize> = (0..others).map(|q| s.id_in(!root_in_a, q)).collect();
    let counts: Vec<i32> = (0..others as i32).map(|q| q % 3 + len as i32).collect();
    if s.in_a == root_in_a {
        if s.rank != root {
            let passes = (0..ROOTED_CALLS)
                .map(|_| inter.immediate_pass_remote_group_collective())
                .collect::<Result<Vec<_>>>()?;
            return wait_all(passes).map(drop);
        }
        let expected = AtRoot::expected(&other_ids, len, &counts);
        let mut got = AtRoot {
            maps: vec![0; len],
            sum: vec![0; len],
            gathered: vec![0; others * len],
            gathered_v: vec![-1; expected.gathered_v.len()],
        };
        let (displs, _) = reversed_layout(&counts);
        let data = values(s.me, len);
        let blocks: Vec<i64> = (0..others).flat_map(|q| values(s.me + q, len)).collect();
        let blocks_v: Vec<i64> = (0..others)
            .flat_map(|q| values(s.me + q, counts[q] as usize))
            .collect();
        let (op, consecutive_displs) = (composition(), consecutive(&counts));
        scope(|sc| {
            let requests = vec![
                inter.immediate_broadcast_to_remote_group(sc, &data[..])?,
                inter.immediate_reduce_from_remote_group(sc, &mut got.maps[..], &op)?,
                inter.immediate_reduce_from_remote_group(
                    sc,
                    &mut got.sum[..],
                    SystemOperation::sum(),
                )?,
                inter.immediate_gather_from_remote_group(sc, &mut got.gathered[..])?,
                inter.immediate_gather_varcount_from_remote_group(
                    sc,
                    PartitionMut::new(&mut got.gathered_v[..], &counts[..], &displs[..]),
                )?,
                inter.immediate_scatter_to_remote_group(sc, &blocks[..])?,
                inter.immediate_scatter_varcount_to_remote_group(
                    sc,
                    Partition::new(&blocks_v[..], &counts[..], &consecutive_displs[..]),
                )?,
            ];
            wait_all(requests).map(drop)
        })?;
        got.check(&expected, "immediate")
    } else {
        let root_id = s.id_in(root_in_a, root);
        let root = root as i32;
        let (maps, mine) = (affines(s.me, len), values(s.me, len));
        let mine_v = values(s.me, counts[s.rank] as usize);
        let mut got = AtOthers {
            broadcast: vec![0; len],
            scattered: vec![0; len],
            scattered_v: vec![0; counts[s.rank] as usize],
        };
        let op = composition();
        scope(|sc| {
            let requests = vec![
                inter.immediate_broadcast_from_remote_group(sc, root, &mut got.broadcast[..])?,
                inter.immediate_reduce_to_remote_group(sc, root, &maps[..], &op)?,
                inter.immediate_reduce_to_remote_group(
                    sc,
                    root,
                    &mine[..],
                    SystemOperation::sum(),
                )?,
                inter.immediate_gather_to_remote_group(sc, root, &mine[..])?,
                inter.immediate_gather_varcount_to_remote_group(sc, root, &mine_v[..])?,
                inter.immediate_scatter_from_remote_group(sc, root, &mut got.scattered[..])?,
                inter.immediate_scatter_varcount_from_remote_group(
                    sc,
                    root,
                    &mut got.scattered_v[..],
                )?,
            ];
            wait_all(requests).map(drop)
        })?;
        got.check(root_id + s.rank, root_id, "immediate")
    }
}

/// The rooted collectives from rank `root` of group A (`root_in_a`) or
/// B to the other group, with blocks of `len` elements.
fn rooted(s: &Sides, root_in_a: bool, root: usize, len: usize) -> Result<()> {
    let inter = &s.inter;
    let others = if root_in_a {
        s.local_or_remote(false)
    } else {
        s.local_or_remote(true)
    };
    let other_ids: Vec<usize> = (0..others).map(|q| s.id_in(!root_in_a, q)).collect();
    let counts: Vec<i32> = (0..others as i32).map(|q| q % 3 + len as i32).collect();
    if s.in_a == root_in_a {
        if s.rank != root {
            // The root's group mates (MPI_PROC_NULL) count each collective.
            for _ in 0..ROOTED_CALLS {
                inter.pass_remote_group_collective()?;
            }
            return Ok(());
        }
        inter.broadcast_to_remote_group(&values(s.me, len)[..])?;
        let expected = AtRoot::expected(&other_ids, len, &counts);
        let mut got = AtRoot {
            maps: vec![0; len],
            sum: vec![0; len],
            gathered: vec![0; others * len],
            gathered_v: vec![-1; expected.gathered_v.len()],
        };
        inter.reduce_from_remote_group(&mut got.maps[..], composition())?;
        inter.reduce_from_remote_group(&mut got.sum[..], SystemOperation::sum())?;
        inter.gather_from_remote_group(&mut got.gathered[..])?;
        let (displs, _) = reversed_layout(&counts);
        inter.gather_varcount_from_remote_group(&mut PartitionMut::new(
            &mut got.gathered_v[..],
            &counts[..],
            &displs[..],
        ))?;
        got.check(&expected, "blocking")?;
        // Block q of the scatters is value(s.me + q, ..): rank q checks it.
        let blocks: Vec<i64> = (0..others).flat_map(|q| values(s.me + q, len)).collect();
        inter.scatter_to_remote_group(&blocks[..])?;
        let blocks: Vec<i64> = (0..others)
            .flat_map(|q| values(s.me + q, counts[q] as usize))
            .collect();
        inter.scatter_varcount_to_remote_group(&Partition::new(
            &blocks[..],
            &counts[..],
            consecutive(&counts),
        ))
    } else {
        let root_id = s.id_in(root_in_a, root);
        let root = root as i32;
        let mut got = AtOthers {
            broadcast: vec![0; len],
            scattered: vec![0; len],
            scattered_v: vec![0; counts[s.rank] as usize],
        };
        inter.broadcast_from_remote_group(root, &mut got.broadcast[..])?;
        inter.reduce_to_remote_group(root, &affines(s.me, len)[..], composition())?;
        inter.reduce_to_remote_group(root, &values(s.me, len)[..], SystemOperation::sum())?;
        inter.gather_to_remote_group(root, &values(s.me, len)[..])?;
        inter.gather_varcount_to_remote_group(root, &values(s.me, counts[s.rank] as usize)[..])?;
        inter.scatter_from_remote_group(root, &mut got.scattered[..])?;
        inter.scatter_varcount_from_remote_group(root, &mut got.scattered_v[..])?;
        got.check(root_id + s.rank, root_id, "blocking")
    }
}

/// What the rooted collectives of [`rooted`] leave at a process of the
/// other group than the root's.
struct AtOthers {
    broadcast: Vec<i64>,
    scattered: Vec<i64>,
    scattered_v: Vec<i64>,
}

impl AtOthers {
    /// Checks the blocks: the root's data (`root_id`) broadcast, and the
    /// scattered blocks, `value(block_id, ..)`.
    fn check(&self, block_id: usize, root_id: usize, how: &str) -> Result<()> {
        let broadcast = values(root_id, self.broadcast.len());
        same(&self.broadcast, &broadcast, &format!("{how} broadcast"))?;
        let scattered = values(block_id, self.scattered.len());
        same(&self.scattered, &scattered, &format!("{how} scatter"))?;
        let scattered_v = values(block_id, self.scattered_v.len());
        same(&self.scattered_v, &scattered_v, &format!("{how} scatterv"))
    }
}

impl Sides {
    /// The size of group A (`a`) or B.
    fn local_or_remote(&self, a: bool) -> usize {
        if a == self.in_a {
            self.local
        } else {
            self.remote
        }
    }
}

fn inter_errors(s: &Sides) -> Result<()> {
    let inter = &s.inter;
    let bad_root = s.remote as i32;
    expect_class(
        inter.reduce_to_remote_group(bad_root, &1i32, SystemOperation::sum()),
        ErrorClass::Root,
        "reduce to a root outside the remote group",
    )?;
    expect_class(
        inter.gather_to_remote_group(-1, &1i32),
        ErrorClass::Root,
        "gather to root -1",
    )?;
    expect_class(
        inter.scatter_from_remote_group(bad_root, &mut [0i32][..]),
        ErrorClass::Root,
        "scatter from a root outside the remote group",
    )?;
    let one = [1i32];
    let sends: Vec<&dyn Buffer> = vec![&one; s.remote + 1];
    let mut nothing: Vec<&mut dyn BufferMut> = Vec::new();
    expect_class(
        inter.all_to_all_w_into(&sends, &mut nothing),
        ErrorClass::Count,
        "all-to-allw with a buffer too many",
    )?;
    expect_class(
        inter.all_to_all_varcount_into(
            &Partition::new(&one[..], vec![1; s.remote + 1], vec![0; s.remote + 1]),
            &mut PartitionMut::new(&mut [0i32][..], vec![0; s.remote], vec![0; s.remote]),
        ),
        ErrorClass::Arg,
        "all-to-allv with counts for the local group's size",
    )?;
    expect_class(
        inter.all_reduce_in_place(&mut [1i32][..], SystemOperation::sum()),
        ErrorClass::Comm,
        "an in-place all-reduce on an intercommunicator",
    )?;
    expect_class(
        inter.scan_into(&1i32, &mut 0i32, SystemOperation::sum()),
        ErrorClass::Comm,
        "a scan on an intercommunicator",
    )?;
    expect_class(
        inter.process_at_rank(0).broadcast_into(&mut 0i32),
        ErrorClass::Comm,
        "an intracommunicator's broadcast on an intercommunicator",
    )?;
    // Counts that differ between the groups: A's leader receives more
    // than it expects, B's less, and the job goes on. The others see
    // the other group's data only where both groups share a shared
    // region (every process reads every other's there, and fails as its
    // leader does); by messages they are not concerned. Over a shared
    // region, 2,000 `i64`s do not fit a slot: B announces its length and
    // goes by messages, A goes by slots, and both fail instead of
    // waiting for each other.
    for b_len in [5, 2_000] {
        let len = if s.in_a { 4 } else { b_len };
        let mut sum = vec![0i64; len];
        let result =
            inter.all_reduce_into(&values(s.me, len)[..], &mut sum[..], SystemOperation::sum());
        let (class, group) = match s.in_a {
            true => (ErrorClass::Truncate, "A"),
            false => (ErrorClass::Count, "B"),
        };
        let what = |who: &str| format!("all-reduce of 4 and {b_len} elements, {group}'s {who}");
        match (s.rank, &result) {
            (0, _) => expect_class(result, class, &what("leader"))?,
            (_, Ok(())) => {}
            (_, Err(_)) => expect_class(result, class, &what("others"))?,
        }
    }
    // A gather whose root expects less than the other group sends.
    if s.in_a {
        if s.rank == 0 {
            let mut small = vec![0i32; s.remote];
            expect_class(
                inter.gather_from_remote_group(&mut small[..]),
                ErrorClass::Truncate,
                "gather into a root's buffer too small",
            )?;
        } else {
            inter.pass_remote_group_collective()?;
        }
    } else {
        inter.gather_to_remote_group(0, &[1i32, 2][..])?;
    }
    // The job goes on.
    let mut sum = 0i64;
    inter.all_reduce_into(&1i64, &mut sum, SystemOperation::sum())?;
    ensure(sum == s.remote as i64, || {
        format!("all-reduce after the errors: {sum}")
    })
}

// ---------------------------------------------------------------- neighbor

/// A process's neighbourhood as the reference sees it: for each source
/// slot, the source's rank (or `PROC_NULL`) and the slot of its
/// destinations that comes here; and the number of destinations.
struct Hood {
    sources: Vec<(i32, usize)>,
    destinations: usize,
}

/// The topologies of the neighbourhood checks over every process of
/// world, each with its neighbourhood as the reference sees it: a
/// periodic ring (with 1 or 2 ranks, one process is both neighbours), a
/// 2-d grid periodic in its first dimension only, a graph (edges to
/// +-1 and +-2, so repeated edges where there are few ranks), and a
/// distributed graph with a repeated edge (to +1 twice and to +3).
fn topologies(world: &Communicator) -> Result<Vec<(Communicator, Hood, &'static str)>> {
    let (rank, size) = (world.rank(), world.size());
    let cartesian = |dims: &[i32], periods: &[bool]| {
        world
            .create_cartesian_communicator(dims, periods, false)?
            .ok_or_else(|| fail("a grid of every process left one out"))
    };
    let mut dims = [0, 0];
    oxmpi::dims_create(size, &mut dims)?;
    let mut all = Vec::new();
    for (comm, what) in [
        (cartesian(&[size], &[true])?, "ring"),
        (cartesian(&dims, &[true, false])?, "grid"),
    ] {
        let dimensions = comm.cartesian_dimensions()?;
        let mut sources = Vec::new();
        for d in 0..dimensions {
            let (down, up) = comm.cartesian_shift(d, 1)?;
            // From -1 comes what it sent to its +1, and the reverse.
            sources.extend([(down, 2 * d + 1), (up, 2 * d)]);
        }
        let hood = Hood {
            sources,
            destinations: 2 * dimensions,
        };
        all.push((comm, hood, what));
    }
    let at = |d: i32| (rank + d).rem_euclid(size);
    let offsets = [1, -1, 2, -2];
    let index: Vec<i32> = (1..=size).map(|n| n * offsets.len() as i32).collect();
    let edges: Vec<i32> = (0..size)
        .flat_map(|n| offsets.map(|d| (n + d).rem_euclid(size)))
        .collect();
    let graph = world
        .create_graph_communicator(&index, &edges, false)?
        .ok_or_else(|| fail("a graph of every process left one out"))?;
    let neighbors = graph.graph_neighbors(rank)?;
    // The k-th message from a process to this one pairs off with the
    // k-th time this one is among its neighbours.
    let mut sources = Vec::new();
    for (i, &source) in neighbors.iter().enumerate() {
        let nth = neighbors[..i].iter().filter(|&&n| n == source).count();
        let j = graph
            .graph_neighbors(source)?
            .iter()
            .enumerate()
            .filter(|&(_, &n)| n == rank)
            .nth(nth)
            .map(|(j, _)| j)
            .ok_or_else(|| fail(format!("graph: {source} has too few edges to {rank}")))?;
        sources.push((source, j));
    }
    let hood = Hood {
        sources,
        destinations: neighbors.len(),
    };
    all.push((graph, hood, "graph"));
    let distributed = world.create_distributed_graph_adjacent(
        &[at(-1), at(-1), at(-3)],
        None,
        &[at(1), at(1), at(3)],
        None,
        false,
    )?;
    let hood = Hood {
        sources: vec![(at(-1), 0), (at(-1), 1), (at(-3), 2)],
        destinations: 3,
    };
    all.push((distributed, hood, "distributed graph"));
    Ok(all)
}

fn neighbor(world: &Communicator) -> Result<()> {
    for (comm, hood, what) in topologies(world)? {
        neighborhood_collectives(&comm, &hood, what)?;
        neighbor_mixed(&comm, &hood, what)?;
    }
    world.barrier()?;
    if world.rank() == 0 {
        let mut dims = [0, 0];
        oxmpi::dims_create(world.size(), &mut dims)?;
        println!("neighbor: {} ranks as {dims:?}", world.size());
    }
    Ok(())
}

/// How many elements process `from` sends in its destination slot `j`.
fn slot_count(from: i32, j: usize) -> usize {
    (from as usize + j) % 3 + 1
}

/// Element `k` of what process `from` sends in slot `j`.
fn slot_value(from: i32, j: usize, k: usize) -> i32 {
    from * 1000 + j as i32 * 100 + k as i32
}

fn neighborhood_collectives(comm: &Communicator, hood: &Hood, what: &str) -> Result<()> {
    let me = comm.rank();
    let slots = hood.sources.len();
    // A block from no one keeps its -1s.
    let from_source = |i: usize, len: usize, f: &dyn Fn(i32, usize) -> i32| -> Vec<i32> {
        let (source, j) = hood.sources[i];
        (0..len)
            .map(|k| {
                if source == PROC_NULL {
                    -1
                } else {
                    f(source, j) + k as i32
                }
            })
            .collect()
    };
    // All-gatherv: a process sends me % 3 + 1 elements to every
    // destination.
    let gather_count = |p: i32| {
        if p == PROC_NULL {
            2
        } else {
            (p % 3 + 1) as usize
        }
    };
    let gather_counts: Vec<i32> = hood
        .sources
        .iter()
        .map(|&(s, _)| gather_count(s) as i32)
        .collect();
    let (gather_displs, gather_len) = reversed_layout(&gather_counts);
    let mine: Vec<i32> = (0..gather_count(me))
        .map(|k| me * 1000 + k as i32)
        .collect();
    let mut gathered_expected = vec![-1i32; gather_len];
    for i in 0..slots {
        let at = gather_displs[i] as usize;
        let block = from_source(i, gather_counts[i] as usize, &|s, _| s * 1000);
        gathered_expected[at..at + block.len()].copy_from_slice(&block);
    }
    // All-to-allv and w: slot j carries slot_count(me, j) elements.
    let send_counts: Vec<i32> = (0..hood.destinations)
        .map(|j| slot_count(me, j) as i32)
        .collect();
    let send: Vec<i32> = (0..hood.destinations)
        .flat_map(|j| (0..slot_count(me, j)).map(move |k| slot_value(me, j, k)))
        .collect();
    let recv_counts: Vec<i32> = hood
        .sources
        .iter()
        .map(|&(s, j)| {
            if s == PROC_NULL {
                1
            } else {
                slot_count(s, j) as i32
            }
        })
        .collect();
    let (recv_displs, recv_len) = reversed_layout(&recv_counts);
    let mut exchanged_expected = vec![-1i32; recv_len];
    for i in 0..slots {
        let at = recv_displs[i] as usize;
        let block = from_source(i, recv_counts[i] as usize, &|s, j| slot_value(s, j, 0));
        exchanged_expected[at..at + block.len()].copy_from_slice(&block);
    }
    // All-to-allw: even slots as f64, odd ones as i32.
    let sends_f64: Vec<Vec<f64>> = (0..hood.destinations)
        .map(|j| {
            (0..slot_count(me, j))
                .map(|k| f64::from(slot_value(me, j, k)))
                .collect()
        })
        .collect();
    let sends_i32: Vec<Vec<i32>> = (0..hood.destinations)
        .map(|j| {
            (0..slot_count(me, j))
                .map(|k| slot_value(me, j, k))
                .collect()
        })
        .collect();
    let w_sends: Vec<&dyn Buffer> = (0..hood.destinations)
        .map(|j| -> &dyn Buffer {
            if j.is_multiple_of(2) {
                &sends_f64[j]
            } else {
                &sends_i32[j]
            }
        })
        .collect();
    let w_expected: Vec<Vec<i32>> = (0..slots)
        .map(|i| from_source(i, recv_counts[i] as usize, &|s, j| slot_value(s, j, 0)))
        .collect();
    // Where a source's slot is even, its block comes as f64.
    let is_f64 = |i: usize| hood.sources[i].1.is_multiple_of(2);
    let check_w = |f: &[Vec<f64>], n: &[Vec<i32>], form: &str| -> Result<()> {
        for i in 0..slots {
            let got: Vec<i32> = if is_f64(i) {
                f[i].iter().map(|&v| v as i32).collect()
            } else {
                n[i].clone()
            };
            same(
                &got,
                &w_expected[i],
                &format!("{what}: {form} all-to-allw, slot {i}"),
            )?;
        }
        Ok(())
    };
    let fresh_w = || -> (Vec<Vec<f64>>, Vec<Vec<i32>>) {
        (
            (0..slots)
                .map(|i| vec![-1.0; recv_counts[i] as usize])
                .collect(),
            (0..slots)
                .map(|i| vec![-1; recv_counts[i] as usize])
                .collect(),
        )
    };

    // Blocking.
    let mut gathered = vec![-1i32; gather_len];
    comm.neighbor_all_gather_varcount_into(
        &mine[..],
        &mut PartitionMut::new(&mut gathered[..], &gather_counts[..], &gather_displs[..]),
    )?;
    same(
        &gathered,
        &gathered_expected,
        &format!("{what}: all-gatherv"),
    )?;
    let mut exchanged = vec![-1i32; recv_len];
    comm.neighbor_all_to_all_varcount_into(
        &Partition::new(&send[..], &send_counts[..], consecutive(&send_counts)),
        &mut PartitionMut::new(&mut exchanged[..], &recv_counts[..], &recv_displs[..]),
    )?;
    same(
        &exchanged,
        &exchanged_expected,
        &format!("{what}: all-to-allv"),
    )?;
    let (mut w_f64, mut w_i32) = fresh_w();
    {
        let mut recvs = split_w(&mut w_f64, &mut w_i32, &is_f64);
        comm.neighbor_all_to_all_w_into(&w_sends, &mut recvs)?;
    }
    check_w(&w_f64, &w_i32, "blocking")?;

    // Non-blocking, all at once, with the fixed-size forms.
    let mut gathered = vec![-1i32; gather_len];
    let mut exchanged = vec![-1i32; recv_len];
    let (mut iw_f64, mut iw_i32) = fresh_w();
    let mut all_gathered = vec![-1i32; slots];
    let to_all: Vec<i32> = (0..hood.destinations as i32).map(|j| me * 10 + j).collect();
    let mut all_exchanged = vec![-1i32; slots];
    {
        let mut iw_recvs = split_w(&mut iw_f64, &mut iw_i32, &is_f64);
        scope(|sc| {
            let requests = vec![
                comm.immediate_neighbor_all_gather_varcount_into(
                    sc,
                    &mine[..],
                    PartitionMut::new(&mut gathered[..], &gather_counts[..], &gather_displs[..]),
                )?,
                comm.immediate_neighbor_all_to_all_varcount_into(
                    sc,
                    Partition::new(&send[..], &send_counts[..], consecutive(&send_counts)),
                    PartitionMut::new(&mut exchanged[..], &recv_counts[..], &recv_displs[..]),
                )?,
                comm.immediate_neighbor_all_to_all_w_into(sc, &w_sends, &mut iw_recvs)?,
                comm.immediate_neighbor_all_gather_into(sc, &me, &mut all_gathered[..])?,
                comm.immediate_neighbor_all_to_all_into(sc, &to_all[..], &mut all_exchanged[..])?,
            ];
            wait_all(requests).map(|_| ())
        })?;
    }
    same(
        &gathered,
        &gathered_expected,
        &format!("{what}: immediate all-gatherv"),
    )?;
    same(
        &exchanged,
        &exchanged_expected,
        &format!("{what}: immediate all-to-allv"),
    )?;
    check_w(&iw_f64, &iw_i32, "immediate")?;
    let expected: Vec<i32> = (0..slots)
        .map(|i| from_source(i, 1, &|s, _| s)[0])
        .collect();
    same(
        &all_gathered,
        &expected,
        &format!("{what}: immediate all-gather"),
    )?;
    let expected: Vec<i32> = (0..slots)
        .map(|i| from_source(i, 1, &|s, j| s * 10 + j as i32)[0])
        .collect();
    same(
        &all_exchanged,
        &expected,
        &format!("{what}: immediate all-to-all"),
    )?;

    // Bad arguments fail at once.
    expect_class(
        comm.neighbor_all_to_all_w_into(&w_sends[..w_sends.len() - 1], &mut []),
        ErrorClass::Count,
        &format!("{what}: all-to-allw with too few buffers"),
    )?;
    expect_class(
        comm.neighbor_all_gather_varcount_into(
            &mine[..],
            &mut PartitionMut::new(&mut gathered[..], &gather_counts[1..], &gather_displs[1..]),
        ),
        ErrorClass::Arg,
        &format!("{what}: all-gatherv with a count too few"),
    )?;
    // Overlapping blocks are named by the neighbours' positions, not as
    // ranks.
    let one = vec![1; slots];
    let overlap = comm.neighbor_all_to_all_varcount_into(
        &Partition::new(&send[..], &send_counts[..], consecutive(&send_counts)),
        &mut PartitionMut::new(&mut exchanged[..], &one[..], &vec![0; slots][..]),
    );
    let named = "receive blocks of source neighbours 0 and 1 (positions in this process's list of sources) overlap";
    match overlap {
        Err(e) if e.class() == ErrorClass::Arg && e.to_string().contains(named) => Ok(()),
        other => Err(fail(format!(
            "{what}: all-to-allv into overlapping blocks: expected {named:?}, got {other:?}"
        ))),
    }
}

/// Elements of each block in `neighbor_mixed`: more bytes than the
/// eager limits, so that the blocks go by rendezvous too.
const MIXED_LEN: usize = 20_000;

/// The fixed-size neighbourhood all-gather and all-to-all, blocking and
/// not, where some processes pass strided data (the first column of a
/// two-column matrix, a block per column) and others contiguous data:
/// odd ranks send strided data, ranks not a multiple of 3 receive into
/// strided columns. The second column of each matrix stays as it was.
fn neighbor_mixed(comm: &Communicator, hood: &Hood, what: &str) -> Result<()> {
    let me = comm.rank();
    let (slots, len) = (hood.sources.len(), MIXED_LEN);
    let column = UserDatatype::vector(len as i32, 1, 2, &i32::equivalent_datatype())?;
    let columns = UserDatatype::resized(&column, 0, (len * 2 * 4) as isize)?;
    let (strided_send, strided_recv) = (me % 2 == 1, me % 3 != 0);
    // An all-gather sends slot 0 to every destination.
    let sent = mixed_value;
    for immediate in [false, true] {
        for gather in [true, false] {
            let form = format!(
                "{what}: {} {} from {} data into {} data",
                if immediate { "immediate" } else { "blocking" },
                if gather { "all-gather" } else { "all-to-all" },
                layout(strided_send),
                layout(strided_recv),
            );
            let blocks = if gather { 1 } else { hood.destinations };
            let packed: Vec<i32> = (0..blocks)
                .flat_map(|j| (0..len).map(move |k| sent(me, j, k)))
                .collect();
            let matrix: Vec<i32> = packed.iter().flat_map(|&v| [v, -7]).collect();
            let width = if strided_recv { 2 } else { 1 };
            let mut received = vec![-1i32; slots * len * width];
            {
                let send_view;
                let send: &dyn Buffer = if strided_send {
                    send_view =
                        View::with_count_and_datatype(&matrix[..], blocks as i32, &columns)?;
                    &send_view
                } else {
                    &packed
                };
                let mut recv_view;
                let recv: &mut dyn BufferMut = if strided_recv {
                    recv_view = MutView::with_count_and_datatype(
                        &mut received[..],
                        slots as i32,
                        &columns,
                    )?;
                    &mut recv_view
                } else {
                    &mut received
                };
                match (immediate, gather) {
                    (false, true) => comm.neighbor_all_gather_into(send, recv)?,
                    (false, false) => comm.neighbor_all_to_all_into(send, recv)?,
                    (true, true) => scope(|sc| {
                        comm.immediate_neighbor_all_gather_into(sc, send, recv)?
                            .wait()
                            .map(drop)
                    })?,
                    (true, false) => scope(|sc| {
                        comm.immediate_neighbor_all_to_all_into(sc, send, recv)?
                            .wait()
                            .map(drop)
                    })?,
                }
            }
            // A block from no one keeps its -1s.
            let expected: Vec<i32> = hood
                .sources
                .iter()
                .flat_map(|&(source, j)| {
                    let j = if gather { 0 } else { j };
                    (0..len).map(move |k| {
                        if source == PROC_NULL {
                            -1
                        } else {
                            sent(source, j, k)
                        }
                    })
                })
                .collect();
            let first: Vec<i32> = received.iter().step_by(width).copied().collect();
            same(&first, &expected, &form)?;
            if strided_recv {
                if let Some(i) = received.iter().skip(1).step_by(2).position(|&v| v != -1) {
                    return Err(fail(format!(
                        "{form}: row {i} of the second column was written"
                    )));
                }
            }
        }
    }
    Ok(())
}

/// `neighbor_varcount_mixed`: the neighbourhood all-gather-v,
/// all-to-all-v and all-to-all-w, blocking and not, on every topology of
/// [`topologies`], where some processes pass strided data (the first
/// column of a two-column matrix, a row per element) and others
/// contiguous data: odd ranks send strided data, ranks not a multiple
/// of 3 receive into strided columns, and an all-to-all-w's buffers
/// alternate between the two by slot. Blocks have lengths from 0 to
/// [`MIXED_LEN`] (so some go by rendezvous), lie in the reverse order of
/// their neighbours with a gap after each, and every element names its
/// sender, slot and position: a block received from the wrong
/// neighbour or sent from the wrong place, or a displacement off by one,
/// shows as a wrong element, and a gap, an untouched block (from
/// `PROC_NULL`) or the second column written shows too.
fn neighbor_varcount_mixed(world: &Communicator) -> Result<()> {
    for (comm, hood, what) in topologies(world)? {
        for immediate in [false, true] {
            for form in [
                VarcountForm::AllGather,
                VarcountForm::AllToAll,
                VarcountForm::AllToAllW,
            ] {
                varcount_mixed(&comm, &hood, what, immediate, form)?;
            }
        }
    }
    world.barrier()?;
    if world.rank() == 0 {
        println!("neighbor_varcount_mixed: {} ranks", world.size());
    }
    Ok(())
}

/// The varying-count neighbourhood collectives of
/// [`neighbor_varcount_mixed`].
#[derive(Clone, Copy, Debug)]
enum VarcountForm {
    AllGather,
    AllToAll,
    AllToAllW,
}

/// Lengths of the blocks in [`neighbor_varcount_mixed`], picked by
/// sender and slot.
const VARCOUNT_LENS: [usize; 5] = [MIXED_LEN, 0, 7, MIXED_LEN / 2 + 3, 1];

/// How many elements process `from` sends in destination slot `j` (an
/// all-gather-v sends its slot 0 to every destination).
fn varcount_len(from: i32, j: usize) -> usize {
    VARCOUNT_LENS[(from as usize * 3 + j) % VARCOUNT_LENS.len()]
}

/// Element `k` of what process `from` sends in destination slot `j` in
/// the checks of strided and contiguous data.
fn mixed_value(from: i32, j: usize, k: usize) -> i32 {
    (from * 10 + j as i32) * 100_000 + k as i32
}

/// How data is laid out, for messages.
fn layout(strided: bool) -> &'static str {
    if strided {
        "strided"
    } else {
        "contiguous"
    }
}

/// Data of `i32`s held contiguous, or as the first column of a
/// two-column matrix whose second column holds `filler`.
struct Held {
    cells: Vec<i32>,
    strided: bool,
}

impl Held {
    fn new(data: &[i32], strided: bool, filler: i32) -> Held {
        let cells = if strided {
            data.iter().flat_map(|&v| [v, filler]).collect()
        } else {
            data.to_vec()
        };
        Held { cells, strided }
    }

    /// The data: the first column where strided.
    fn data(&self) -> Vec<i32> {
        self.cells.iter().step_by(self.width()).copied().collect()
    }

    fn width(&self) -> usize {
        if self.strided {
            2
        } else {
            1
        }
    }

    /// Checks that the second column (if any) still holds `filler`.
    fn check_second_column(&self, filler: i32, what: &str) -> Result<()> {
        match self
            .cells
            .iter()
            .skip(1)
            .step_by(2)
            .position(|&v| v != filler)
        {
            Some(row) if self.strided => Err(fail(format!(
                "{what}: row {row} of the second column was written"
            ))),
            _ => Ok(()),
        }
    }

    /// The data as a buffer of its rows (`row`: one `i32` of the first
    /// column) or of `i32`s.
    fn rows<'a>(&'a self, row: &'a UserDatatype) -> Result<Rows<'a>> {
        Ok(if self.strided {
            let rows = (self.cells.len() / 2) as i32;
            Rows::Strided(View::with_count_and_datatype(&self.cells[..], rows, row)?)
        } else {
            Rows::Contiguous(&self.cells)
        })
    }

    fn rows_mut<'a>(&'a mut self, row: &'a UserDatatype) -> Result<RowsMut<'a>> {
        Ok(if self.strided {
            let rows = (self.cells.len() / 2) as i32;
            RowsMut::Strided(MutView::with_count_and_datatype(
                &mut self.cells[..],
                rows,
                row,
            )?)
        } else {
            RowsMut::Contiguous(&mut self.cells)
        })
    }
}

/// A [`Held`]'s data as a buffer to send from.
enum Rows<'a> {
    Strided(View<'a>),
    Contiguous(&'a Vec<i32>),
}

impl Rows<'_> {
    fn buffer(&self) -> &dyn Buffer {
        match self {
            Rows::Strided(view) => view,
            Rows::Contiguous(cells) => *cells,
        }
    }
}

/// A [`Held`]'s data as a buffer to receive into.
enum RowsMut<'a> {
    Strided(MutView<'a>),
    Contiguous(&'a mut Vec<i32>),
}

impl RowsMut<'_> {
    fn buffer(&mut self) -> &mut dyn BufferMut {
        match self {
            RowsMut::Strided(view) => view,
            RowsMut::Contiguous(cells) => &mut **cells,
        }
    }
}

/// One varying-count neighbourhood collective of
/// [`neighbor_varcount_mixed`], checked against the sequential reference.
fn varcount_mixed(
    comm: &Communicator,
    hood: &Hood,
    what: &str,
    immediate: bool,
    form: VarcountForm,
) -> Result<()> {
    let me = comm.rank();
    let (strided_send, strided_recv) = (me % 2 == 1, me % 3 != 0);
    let row = UserDatatype::resized(&i32::equivalent_datatype(), 0, 8)?;
    let how = if immediate { "immediate" } else { "blocking" };
    let form_name = format!("{what}: {how} {form:?}");
    let gather = matches!(form, VarcountForm::AllGather);
    // The slot of its destinations that source slot `i`'s block was sent
    // in (all-gather: slot 0, the same block to all).
    let source_slot = |i: usize| if gather { 0 } else { hood.sources[i].1 };
    let block = |from: i32, j: usize| -> Vec<i32> {
        (0..varcount_len(from, j))
            .map(|k| mixed_value(from, j, k))
            .collect()
    };
    // A block from no one gets 3 elements' room, left as -1s.
    let recv_counts: Vec<i32> = (0..hood.sources.len())
        .map(|i| match hood.sources[i].0 {
            PROC_NULL => 3,
            s => varcount_len(s, source_slot(i)) as i32,
        })
        .collect();
    let expected_blocks: Vec<Vec<i32>> = (0..hood.sources.len())
        .map(|i| match hood.sources[i].0 {
            PROC_NULL => vec![-1; 3],
            s => block(s, source_slot(i)),
        })
        .collect();
    if let VarcountForm::AllToAllW = form {
        // A buffer per slot, strided or not by slot.
        let sends: Vec<Held> = (0..hood.destinations)
            .map(|j| Held::new(&block(me, j), (me as usize + j) % 2 == 1, -7))
            .collect();
        let mut recvs: Vec<Held> = recv_counts
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                Held::new(
                    &vec![-1; n as usize],
                    (me as usize + i).is_multiple_of(2),
                    -1,
                )
            })
            .collect();
        {
            let send_rows = sends
                .iter()
                .map(|h| h.rows(&row))
                .collect::<Result<Vec<_>>>()?;
            let mut recv_rows = recvs
                .iter_mut()
                .map(|h| h.rows_mut(&row))
                .collect::<Result<Vec<_>>>()?;
            let send: Vec<&dyn Buffer> = send_rows.iter().map(Rows::buffer).collect();
            let mut recv: Vec<&mut dyn BufferMut> =
                recv_rows.iter_mut().map(RowsMut::buffer).collect();
            if immediate {
                scope(|sc| {
                    comm.immediate_neighbor_all_to_all_w_into(sc, &send, &mut recv)?
                        .wait()
                        .map(drop)
                })?;
            } else {
                comm.neighbor_all_to_all_w_into(&send, &mut recv)?;
            }
        }
        for (i, (got, expected)) in recvs.iter().zip(&expected_blocks).enumerate() {
            let slot = format!("{form_name}, source slot {i}");
            same(&got.data(), expected, &slot)?;
            got.check_second_column(-1, &slot)?;
        }
        return Ok(());
    }
    // One buffer: blocks in reverse order with gaps, the send buffer's
    // gaps holding -9 (never sent).
    let (recv_displs, recv_len) = reversed_layout(&recv_counts);
    let mut expected = vec![-1; recv_len];
    for (i, b) in expected_blocks.iter().enumerate() {
        let at = recv_displs[i] as usize;
        expected[at..at + b.len()].copy_from_slice(b);
    }
    let mut received = Held::new(&vec![-1; recv_len], strided_recv, -1);
    // All-gather-v: the one block; all-to-all-v: a block per
    // destination.
    let send_slots = if gather { 1 } else { hood.destinations };
    let send_counts: Vec<i32> = (0..send_slots)
        .map(|j| varcount_len(me, j) as i32)
        .collect();
    let (send_displs, send_len) = reversed_layout(&send_counts);
    let mut send_data = vec![-9; send_len];
    for (j, &at) in send_displs.iter().enumerate() {
        let b = block(me, j);
        send_data[at as usize..at as usize + b.len()].copy_from_slice(&b);
    }
    let sent = if gather {
        Held::new(&block(me, 0), strided_send, -7)
    } else {
        Held::new(&send_data, strided_send, -7)
    };
    {
        let send_rows = sent.rows(&row)?;
        let send = send_rows.buffer();
        let mut recv_rows = received.rows_mut(&row)?;
        let mut recv = PartitionMut::new(recv_rows.buffer(), &recv_counts[..], &recv_displs[..]);
        let send_partition = || Partition::new(send, &send_counts[..], &send_displs[..]);
        match (gather, immediate) {
            (true, false) => comm.neighbor_all_gather_varcount_into(send, &mut recv)?,
            (true, true) => scope(|sc| {
                comm.immediate_neighbor_all_gather_varcount_into(sc, send, recv)?
                    .wait()
                    .map(drop)
            })?,
            (false, false) => {
                comm.neighbor_all_to_all_varcount_into(&send_partition(), &mut recv)?
            }
            (false, true) => scope(|sc| {
                comm.immediate_neighbor_all_to_all_varcount_into(sc, send_partition(), recv)?
                    .wait()
                    .map(drop)
            })?,
        }
    }
    let form_name = format!(
        "{form_name} from {} data into {} data",
        layout(strided_send),
        layout(strided_recv),
    );
    same(&received.data(), &expected, &form_name)?;
    received.check_second_column(-1, &form_name)
}

/// `neighbor_pieces_memory`: the neighbourhood collectives on a periodic
/// ring of 32 MiB of strided data (each process's column of a two-column
/// matrix of `f64`, half of it to or from each neighbour) grow no
/// process's peak memory by a packed copy: all-gather, all-gather-v (in
/// reverse order), all-to-all, all-to-all-v (reversed), all-to-all-w,
/// and the non-blocking all-gather from a contiguous buffer into strided
/// columns. Every buffer is allocated and touched first, and a smaller
/// exchange warms the connections.
fn neighbor_pieces_memory(world: &Communicator) -> Result<()> {
    let (rank, size) = (world.rank(), world.size());
    let ring = world
        .create_cartesian_communicator(&[size], &[true], false)?
        .ok_or_else(|| fail("a ring of every process left one out"))?;
    let (down, up) = ring.cartesian_shift(0, 1)?;
    // Receive slot 0 comes from -1, which sends it its slot 1 (to +1);
    // slot 1 from +1, its slot 0.
    let from = [(down, 1), (up, 0)];
    let (rows, f64t) = (4 << 20, f64::equivalent_datatype());
    let half = rows / 2;
    let half_column = UserDatatype::vector(half as i32, 1, 2, &f64t)?;
    let halves = UserDatatype::resized(&half_column, 0, (half * 2 * 8) as isize)?;
    // One `f64` of the first column: counts of it address rows.
    let strided = UserDatatype::resized(&f64t, 0, 16)?;
    let cell = |id: i32, r: usize| f64::from(id) * 1e8 + r as f64;
    let data: Vec<f64> = (0..rows * 2).map(|i| cell(rank, i / 2)).collect();
    let plain: Vec<f64> = (0..half).map(|r| cell(rank, r)).collect();
    let mut received = vec![-1.0f64; rows * 2];
    {
        let small = UserDatatype::vector(1000, 1, 2, &f64t)?;
        let small = UserDatatype::resized(&small, 0, 16_000)?;
        let send = View::with_count_and_datatype(&data[..], 2, &small)?;
        let mut recv = MutView::with_count_and_datatype(&mut received[..], 2, &small)?;
        ring.neighbor_all_to_all_into(&send, &mut recv)?;
    }
    let counts = [half as i32; 2];
    let (in_order, reversed) = ([0, half as i32], [half as i32, 0]);
    // Row `r` of the received column: slot `r / half` (the other one
    // where the blocks are reversed) of `from`, whose source sent its own
    // rows from 0 (all-gathers) or from its slot's half (all-to-alls).
    let mut case = |what: &str,
                    reverse: bool,
                    exchange: bool,
                    collective: &dyn Fn(&mut [f64]) -> Result<()>|
     -> Result<()> {
        received.fill(-1.0);
        within_pieces_bound(
            &ring,
            &format!("a 32 MiB strided neighbourhood {what}"),
            || collective(&mut received),
        )?;
        let expected = |r: usize| {
            let slot = if reverse { 1 - r / half } else { r / half };
            let (source, j) = from[slot];
            cell(source, if exchange { j * half } else { 0 } + r % half)
        };
        first_column_is(
            &received,
            0..rows,
            expected,
            &format!("the strided neighbourhood {what}"),
        )
    };
    case("all-gather", false, false, &|recv| {
        let send = View::with_count_and_datatype(&data[..], 1, &half_column)?;
        let mut recv = MutView::with_count_and_datatype(recv, 2, &halves)?;
        ring.neighbor_all_gather_into(&send, &mut recv)
    })?;
    case("all-gather-v", true, false, &|recv| {
        let send = View::with_count_and_datatype(&data[..], half as i32, &strided)?;
        let mut recv = MutView::with_count_and_datatype(recv, rows as i32, &strided)?;
        let mut recv = PartitionMut::new(&mut recv, &counts[..], &reversed[..]);
        ring.neighbor_all_gather_varcount_into(&send, &mut recv)
    })?;
    case("all-to-all", false, true, &|recv| {
        let send = View::with_count_and_datatype(&data[..], 2, &halves)?;
        let mut recv = MutView::with_count_and_datatype(recv, 2, &halves)?;
        ring.neighbor_all_to_all_into(&send, &mut recv)
    })?;
    case("all-to-all-v", true, true, &|recv| {
        let send = View::with_count_and_datatype(&data[..], rows as i32, &strided)?;
        let send = Partition::new(&send, &counts[..], &in_order[..]);
        let mut recv = MutView::with_count_and_datatype(recv, rows as i32, &strided)?;
        let mut recv = PartitionMut::new(&mut recv, &counts[..], &reversed[..]);
        ring.neighbor_all_to_all_varcount_into(&send, &mut recv)
    })?;
    case("all-to-all-w", false, true, &|recv| {
        let (low, high) = recv.split_at_mut(half * 2);
        let sends = [
            View::with_count_and_datatype(&data[..], 1, &half_column)?,
            View::with_count_and_datatype(&data[half * 2..], 1, &half_column)?,
        ];
        let mut recvs = [
            MutView::with_count_and_datatype(low, 1, &half_column)?,
            MutView::with_count_and_datatype(high, 1, &half_column)?,
        ];
        let sends: Vec<&dyn Buffer> = sends.iter().map(|b| -> &dyn Buffer { b }).collect();
        let mut recvs: Vec<&mut dyn BufferMut> = recvs
            .iter_mut()
            .map(|b| -> &mut dyn BufferMut { b })
            .collect();
        ring.neighbor_all_to_all_w_into(&sends, &mut recvs)
    })?;
    case(
        "immediate all-gather into strided columns",
        false,
        false,
        &|recv| {
            let mut recv = MutView::with_count_and_datatype(recv, 2, &halves)?;
            scope(|sc| {
                ring.immediate_neighbor_all_gather_into(sc, &plain[..], &mut recv)?
                    .wait()
                    .map(drop)
            })
        },
    )
}

/// The receive buffers of an all-to-allw: slot `i` as f64 where
/// `is_f64(i)`, else as i32.
fn split_w<'b>(
    f: &'b mut [Vec<f64>],
    n: &'b mut [Vec<i32>],
    is_f64: &dyn Fn(usize) -> bool,
) -> Vec<&'b mut dyn BufferMut> {
    f.iter_mut()
        .zip(n.iter_mut())
        .enumerate()
        .map(|(i, (f, n))| -> &'b mut dyn BufferMut {
            if is_f64(i) {
                f
            } else {
                n
            }
        })
        .collect()
}

// ---------------------------------------------------------------- handler

fn handler(world: &Communicator) -> Result<()> {
    let size = world.size();
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = |expected: usize, what: &str| {
        let got = calls.load(Ordering::Relaxed);
        ensure(got == expected, || {
            format!("{what}: the handler ran {got} times, expected {expected}")
        })
    };
    let seen = calls.clone();
    world.set_error_handler(ErrorHandler::user(move |_, _| {
        seen.fetch_add(1, Ordering::Relaxed);
    }));
    expect_class(
        world.process_at_rank(size).broadcast_into(&mut 0i32),
        ErrorClass::Root,
        "broadcast from a root outside world",
    )?;
    counted(1, "a blocking collective")?;
    let mut short: [i32; 0] = [];
    expect_class(
        scope(|sc| {
            world
                .immediate_all_gather_into(sc, &1i32, &mut short[..])
                .map(|_| ())
        }),
        ErrorClass::Count,
        "an immediate all-gather into a buffer too short",
    )?;
    counted(2, "the start of a non-blocking collective")?;
    expect_class(
        world.neighbor_all_gather_into(&1i32, &mut short[..]),
        ErrorClass::Topology,
        "a neighbourhood collective without a topology",
    )?;
    counted(3, "a neighbourhood collective")?;
    // A collective that succeeds does not call it.
    let mut sum = 0i32;
    world.all_reduce_into(&1i32, &mut sum, SystemOperation::sum())?;
    counted(3, "a collective that succeeded")?;
    world.set_error_handler(ErrorHandler::Fatal);
    world.barrier()?;
    if world.rank() == size - 1 {
        let _ = world.process_at_rank(-1).broadcast_into(&mut 0i32);
        return Err(fail("a fatal error in a collective returned"));
    }
    // The others wait for the job to end.
    let _ = world.process_at_rank(size - 1).receive_into(&mut sum);
    Err(fail("the job went on after a fatal error in a collective"))
}

// ------------------------------------------------------------------- alone

/// Collectives that fail at the last rank alone: it gets the error class,
/// the others (which do not need it: it is a leaf of the binomial
/// broadcast and scatter from rank 0, and the neighbourhood's only
/// process without destinations) complete theirs, and every later
/// collective works, as the last rank's calls kept its count of
/// collectives in step. Non-blocking forms, which never take the
/// shared-memory path (a process that leaves one of those early leaves
/// the region's generations behind).
fn alone(world: &Communicator) -> Result<()> {
    let (rank, size) = (world.rank(), world.size());
    ensure(size >= 2, || "alone needs 2 or more ranks".into())?;
    let last = rank == size - 1;
    let root = world.process_at_rank(0);
    // A broadcast whose root is outside the communicator at the last rank.
    let mut data = if rank == 0 { [7i64, 8, 9] } else { [0; 3] };
    if last {
        expect_class(
            scope(|sc| {
                world
                    .process_at_rank(size)
                    .immediate_broadcast_into(sc, &mut data)
            }),
            ErrorClass::Root,
            "broadcast from a root outside the communicator, at the last rank",
        )?;
    } else {
        scope(|sc| {
            root.immediate_broadcast_into(sc, &mut data)?
                .wait()
                .map(drop)
        })?;
        same(&data, &[7, 8, 9], "the broadcast the last rank left")?;
    }
    // A scatter where the last rank calls the root's method.
    let blocks: Vec<i64> = (0..size as i64).collect();
    let mut mine = -1i64;
    if last {
        expect_class(
            scope(|sc| root.immediate_scatter_into_root(sc, &blocks[..], &mut mine)),
            ErrorClass::Root,
            "a root's scatter at the last rank",
        )?;
    } else {
        scope(|sc| {
            let request = if rank == 0 {
                root.immediate_scatter_into_root(sc, &blocks[..], &mut mine)?
            } else {
                root.immediate_scatter_into(sc, &mut mine)?
            };
            request.wait().map(drop)
        })?;
        ensure(mine == rank as i64, || format!("scatter gave {mine}"))?;
    }
    // A neighbourhood all-gather with a receive buffer too short at the
    // last rank, which receives from rank 0 and sends to nobody.
    let (sources, destinations): (Vec<i32>, Vec<i32>) = if last {
        (vec![0], vec![])
    } else if rank == 0 {
        (vec![], vec![size - 1])
    } else {
        (vec![], vec![])
    };
    let graph =
        world.create_distributed_graph_adjacent(&sources, None, &destinations, None, false)?;
    let mut got = vec![0i64; sources.len() * 2];
    let send = [rank as i64 + 100, 5];
    if last {
        expect_class(
            scope(|sc| graph.immediate_neighbor_all_gather_into(sc, &send[..], &mut got[..1])),
            ErrorClass::Count,
            "neighbourhood all-gather into a buffer too short, at the last rank",
        )?;
    } else {
        scope(|sc| {
            graph
                .immediate_neighbor_all_gather_into(sc, &send[..], &mut got[..])?
                .wait()
                .map(drop)
        })?;
    }
    // Every later collective, blocking or not, works everywhere.
    graph.neighbor_all_gather_into(&send[..], &mut got[..])?;
    if last {
        same(&got, &[100, 5], "neighbourhood all-gather after the error")?;
    }
    for round in 0..3i64 {
        let mut sum = 0i64;
        world.all_reduce_into(&(rank as i64 + round), &mut sum, SystemOperation::sum())?;
        let n = size as i64;
        ensure(sum == n * (n - 1) / 2 + n * round, || {
            format!("all-reduce {round} after the errors: {sum}")
        })?;
        let mut data = if rank == 0 { [round; 3] } else { [-1; 3] };
        root.broadcast_into(&mut data)?;
        same(&data, &[round; 3], "broadcast after the errors")?;
        let (mut gathered, contribution) = (vec![0i64; size as usize], rank as i64 * round);
        scope(|sc| {
            world
                .immediate_all_gather_into(sc, &contribution, &mut gathered[..])?
                .wait()
                .map(drop)
        })?;
        let expected: Vec<i64> = (0..n).map(|r| r * round).collect();
        same(&gathered, &expected, "all-gather after the errors")?;
        world.barrier()?;
    }
    if rank == 0 {
        println!("alone: {size} ranks, the later collectives agree");
    }
    Ok(())
}

// ------------------------------------------------------------- node_alone

/// The sum of `rank + round` over `size` ranks.
fn rank_sum(size: i64, round: i64) -> i64 {
    size * (size - 1) / 2 + size * round
}

/// Blocking collectives of small data, and a long all-reduce (the
/// shared-memory path where the ranks share a host, through cells and
/// through staging areas) on `comm`, checked against their sequential
/// results; `round` varies the data and the roots.
fn node_blocking(comm: &Communicator, round: i64) -> Result<()> {
    let (rank, size) = (comm.rank(), comm.size());
    let n = size as i64;
    let what = |w: &str| format!("{w}, round {round}, {size} ranks");
    let mut sum = 0i64;
    comm.all_reduce_into(&(rank as i64 + round), &mut sum, SystemOperation::sum())?;
    ensure(sum == rank_sum(n, round), || {
        format!("{}: {sum}", what("all-reduce"))
    })?;
    let root = (round as i32).rem_euclid(size);
    let mut data = if rank == root {
        [round, root as i64, 9]
    } else {
        [-1; 3]
    };
    comm.process_at_rank(root).broadcast_into(&mut data)?;
    same(&data, &[round, root as i64, 9], &what("broadcast"))?;
    let target = comm.process_at_rank((root + 1) % size);
    let contribution = [rank as i64, round];
    if rank == (root + 1) % size {
        let mut reduced = [0i64; 2];
        target.reduce_into_root(&contribution, &mut reduced, SystemOperation::max())?;
        same(&reduced, &[n - 1, round], &what("reduce"))?;
    } else {
        target.reduce_into(&contribution, SystemOperation::max())?;
    }
    comm.barrier()?;
    let send: Vec<i64> = (0..n).map(|to| rank as i64 * 100 + to + round).collect();
    let mut recv = vec![0i64; size as usize];
    comm.all_to_all_into(&send[..], &mut recv[..])?;
    let expected: Vec<i64> = (0..n)
        .map(|from| from * 100 + rank as i64 + round)
        .collect();
    same(&recv, &expected, &what("all-to-all"))?;
    // Blocks of 48,000 bytes, and a broadcast of 400,000: streamed through
    // the staging areas.
    let block = 6_000;
    let send: Vec<i64> = (0..n * block)
        .map(|i| rank as i64 * 1_000_000 + i + round)
        .collect();
    let mut recv = vec![0i64; send.len()];
    comm.all_to_all_into(&send[..], &mut recv[..])?;
    let expected: Vec<i64> = (0..n)
        .flat_map(|from| {
            (0..block).map(move |i| from * 1_000_000 + rank as i64 * block + i + round)
        })
        .collect();
    same(&recv, &expected, &what("long all-to-all"))?;
    let long_data: Vec<i64> = (0..50_000).map(|i| i * root as i64 + round).collect();
    let mut long = if rank == root {
        long_data.clone()
    } else {
        vec![-1; long_data.len()]
    };
    comm.process_at_rank(root).broadcast_into(&mut long[..])?;
    same(&long, &long_data, &what("long broadcast"))?;
    // 320,000 bytes: more than a round of the staging areas.
    let long: Vec<i64> = (0..40_000).map(|i| rank as i64 * i + round).collect();
    let mut sums = vec![0i64; long.len()];
    comm.all_reduce_into(&long[..], &mut sums[..], SystemOperation::sum())?;
    let expected: Vec<i64> = (0..40_000)
        .map(|i| i * (n * (n - 1) / 2) + n * round)
        .collect();
    same(&sums, &expected, &what("long all-reduce"))
}

/// `node_alone`: blocking collectives, which ranks sharing a host carry
/// out through shared memory, stay in step when ranks' calls
/// differ: a blocking broadcast that fails at the last rank alone (a root
/// outside the communicator) — as the first collective of a fresh
/// communicator, whose shared region is made then, and again later —
/// while the others' goes on without it; several live communicators with
/// different members (a split in reversed key order, a group without rank
/// 0) interleave their collectives; non-blocking collectives stay in
/// flight across blocking ones.
fn node_alone(world: &Communicator) -> Result<()> {
    let (rank, size) = (world.rank(), world.size());
    ensure(size >= 2, || "node_alone needs 2 or more ranks".into())?;
    let last = rank == size - 1;
    let comm = world.duplicate()?;
    // Of 2 elements (a cell), or in rounds 1 and 5 of 10,000 bytes:
    // streamed through shared memory, and by messages short enough for
    // a tree (the last rank a leaf).
    let leave_broadcast = |round: i64| -> Result<()> {
        let len: usize = if round % 4 == 1 { 1_250 } else { 2 };
        let sent: Vec<i64> = (0..len as i64).map(|i| round + 7 * i).collect();
        let mut data = if rank == 0 {
            sent.clone()
        } else {
            vec![-1; len]
        };
        if last {
            expect_class(
                comm.process_at_rank(size).broadcast_into(&mut data[..]),
                ErrorClass::Root,
                "a blocking broadcast from a root outside the communicator, at the last rank",
            )
        } else {
            comm.process_at_rank(0).broadcast_into(&mut data[..])?;
            same(&data, &sent, "the blocking broadcast the last rank left")
        }
    };
    leave_broadcast(-1)?;
    let halves = world
        .split_by_color_with_key(Color::with_value(rank % 2), -rank)?
        .ok_or_else(|| fail("no communicator for a defined colour"))?;
    let without_first = world.group().exclude(&[0])?;
    let others = world.split_by_subgroup(&without_first)?;
    for round in 0..6i64 {
        node_blocking(&comm, round)?;
        if round % 2 == 1 {
            leave_broadcast(round)?;
        }
        // A non-blocking all-reduce on `comm` in flight across blocking
        // collectives on all three communicators.
        let (doubled, mut pending) = (rank as i64 * 2, 0i64);
        scope(|sc| {
            let request =
                comm.immediate_all_reduce_into(sc, &doubled, &mut pending, SystemOperation::sum())?;
            node_blocking(&halves, round + 10)?;
            if let Some(others) = &others {
                node_blocking(others, round + 20)?;
            }
            node_blocking(&comm, round + 30)?;
            request.wait().map(drop)
        })?;
        let n = size as i64;
        ensure(pending == n * (n - 1), || {
            format!("the non-blocking all-reduce in flight, round {round}: {pending}")
        })?;
    }
    if rank == 0 {
        println!("node_alone: {size} ranks, the blocking collectives agree");
    }
    Ok(())
}
