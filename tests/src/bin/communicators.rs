//! Groups and communicators run as real jobs: `communicators CHECK`,
//! started by the harness through oxrun. A check exits non-zero, saying
//! why, when something is wrong.
//!
//! Checks: `manage` (duplicate, split by colour and key, split by host,
//! from a group over the parent or over the group alone, compare, names,
//! free,
//! groups of communicators, and traffic that stays on its communicator),
//! `many` (10,000 communicators made and freed, a thousand alive at
//! once), `threads` (threads making communicators at once on different
//! parents), `hosts PER_HOST` (a split by host, in a job whose ranks run
//! `PER_HOST` to a host (or network namespace), in rank order).

use oxmpi::collective::SystemOperation;
use oxmpi::{
    Color, Communicator, CommunicatorRelation, ErrorClass, GroupRelation, Result, Threading,
    ANY_TAG,
};
use oxmpi_jobs::checks::{ensure, expect_class, fail};
use oxmpi_jobs::program::{run_check, world_returning_errors};
use std::process::ExitCode;
use std::time::Instant;

fn main() -> ExitCode {
    let check = std::env::args().nth(1).unwrap_or_default();
    let threading = if check == "threads" {
        Threading::Multiple
    } else {
        Threading::Single
    };
    run_check(&format!("communicators {check}"), threading, |universe| {
        let world = world_returning_errors(universe);
        match check.as_str() {
            "manage" => manage(&world, &universe.self_comm()),
            "many" => many(&world),
            "threads" => threads(&world),
            "hosts" => hosts(&world),
            other => Err(fail(format!("unknown check {other:?}"))),
        }
    })
}

/// The sum over `comm` of each member's world rank, and the check that it
/// is what the members in `expected` (world ranks) add up to: proof that
/// the communicator holds those processes and that its collectives work.
fn check_members(
    comm: &Communicator,
    world: &Communicator,
    expected: &[i32],
    what: &str,
) -> Result<()> {
    ensure(comm.size() as usize == expected.len(), || {
        format!(
            "{what}: {} members, expected {}",
            comm.size(),
            expected.len()
        )
    })?;
    let mut all = vec![0i32; expected.len()];
    comm.all_gather_into(&world.rank(), &mut all[..])?;
    ensure(all == expected, || {
        format!("{what}: members {all:?}, expected {expected:?}")
    })?;
    ensure(expected[comm.rank() as usize] == world.rank(), || {
        format!(
            "{what}: this process is rank {} of {expected:?}",
            comm.rank()
        )
    })
}

fn manage(world: &Communicator, self_comm: &Communicator) -> Result<()> {
    let (rank, size) = (world.rank(), world.size());
    let everyone: Vec<i32> = (0..size).collect();

    // Duplicates: the same members, a new context.
    let dup = world.duplicate()?;
    check_members(&dup, world, &everyone, "duplicate")?;
    ensure(
        world.compare(&world.clone()) == CommunicatorRelation::Identical,
        || "world vs world".into(),
    )?;
    ensure(
        world.compare(&dup) == CommunicatorRelation::Congruent,
        || "world vs duplicate".into(),
    )?;
    let dup_of_dup = dup.duplicate()?;
    check_members(&dup_of_dup, world, &everyone, "duplicate of a duplicate")?;
    if size > 1 {
        ensure(
            world.compare(self_comm) == CommunicatorRelation::Unequal,
            || "world vs self".into(),
        )?;
    }
    stays_on_its_communicator(world, &dup)?;

    // Split by colour (rank % 3) with keys that reverse the order.
    let color = rank % 3;
    let split = world
        .split_by_color_with_key(Color::with_value(color), size - rank)?
        .ok_or_else(|| fail("no communicator for a defined colour"))?;
    let expected: Vec<i32> = (0..size).rev().filter(|r| r % 3 == color).collect();
    check_members(&split, world, &expected, "split by rank % 3, reversed")?;
    let translated = split
        .group()
        .translate_ranks(&(0..split.size()).collect::<Vec<_>>(), &world.group())?;
    ensure(
        translated == expected.iter().map(|&r| Some(r)).collect::<Vec<_>>(),
        || format!("split's ranks translate to {translated:?} in the world"),
    )?;
    // Equal keys keep the parent's order; the undefined colour gets none.
    let halves = world.split_by_color(if rank == 0 {
        Color::undefined()
    } else {
        Color::with_value(rank % 2)
    })?;
    match halves {
        None => ensure(rank == 0, || "a defined colour got no communicator".into())?,
        Some(half) => {
            let expected: Vec<i32> = (1..size).filter(|r| r % 2 == rank % 2).collect();
            check_members(&half, world, &expected, "split by parity without rank 0")?;
            // A split of a split.
            let quarter = half
                .split_by_color(Color::with_value(half.rank() % 2))?
                .ok_or_else(|| fail("no communicator in a split of a split"))?;
            let expected: Vec<i32> = expected
                .iter()
                .enumerate()
                .filter(|(i, _)| i % 2 == half.rank() as usize % 2)
                .map(|(_, &r)| r)
                .collect();
            check_members(&quarter, world, &expected, "split of a split")?;
        }
    }
    if size > 1 {
        let reversed = world
            .split_by_color_with_key(Color::with_value(0), -rank)?
            .ok_or_else(|| fail("no reversed communicator"))?;
        ensure(
            world.compare(&reversed) == CommunicatorRelation::Similar,
            || "world vs reversed".into(),
        )?;
    }

    // Every rank of this job runs on one host.
    let shared = world.split_shared(0)?;
    check_members(&shared, world, &everyone, "split by host")?;

    // From a group, collectively over the parent: the even ranks.
    let evens = world.group().range_include(&[(0, size - 1, 2)])?;
    let even_comm = world.split_by_subgroup_collective(&evens)?;
    ensure(even_comm.is_some() == (rank % 2 == 0), || {
        "even communicator at the wrong ranks".into()
    })?;
    if let Some(even) = &even_comm {
        let expected: Vec<i32> = (0..size).step_by(2).collect();
        check_members(even, world, &expected, "communicator of the even ranks")?;
        if size > 2 {
            // The world's group is not a subgroup of the evens'.
            expect_class(
                even.split_by_subgroup_collective(&world.group()),
                ErrorClass::Group,
                "a group beyond the communicator",
            )?;
        }
    }
    // From a group, over the group alone: only the odd ranks call, and
    // the even ones go on with something else meanwhile.
    let odds = world
        .group()
        .exclude(&(0..size).step_by(2).collect::<Vec<_>>())?;
    if rank % 2 == 1 {
        let odd = dup
            .split_by_subgroup_with_tag(&odds, 42)?
            .ok_or_else(|| fail("no communicator for a member of the group"))?;
        let expected: Vec<i32> = (1..size).step_by(2).collect();
        check_members(&odd, world, &expected, "communicator of the odd ranks")?;
        ensure(
            odds.compare(&odd.group()) == GroupRelation::Identical,
            || "group of the odd communicator".into(),
        )?;
    } else if let Some(even) = &even_comm {
        even.barrier()?;
    }
    world.barrier()?;

    // Names, local to each process.
    ensure(world.get_name()? == "MPI_COMM_WORLD", || {
        "world's name".into()
    })?;
    ensure(self_comm.get_name()? == "MPI_COMM_SELF", || {
        "self's name".into()
    })?;
    ensure(dup.get_name()?.is_empty(), || {
        "a new communicator's name".into()
    })?;
    dup.set_name(&format!("copy at {rank}   "))?;
    ensure(dup.get_name()? == format!("copy at {rank}"), || {
        "a set name".into()
    })?;
    ensure(dup.duplicate()?.get_name()?.is_empty(), || {
        "a duplicate's name".into()
    })?;
    dup.set_name(&"é".repeat(100))?;
    ensure(dup.get_name()? == "é".repeat(63), || {
        "a name cut at 127 bytes".into()
    })?;

    // Freeing.
    expect_class(world.clone().free(), ErrorClass::Comm, "freeing the world")?;
    expect_class(self_comm.clone().free(), ErrorClass::Comm, "freeing self")?;
    let handle = dup_of_dup.clone();
    dup_of_dup.free()?;
    expect_class(
        handle.barrier(),
        ErrorClass::Comm,
        "a barrier on a freed communicator",
    )?;
    expect_class(
        handle.process_at_rank(0).send(&1u8),
        ErrorClass::Comm,
        "a send on a freed communicator",
    )?;
    expect_class(
        handle.duplicate(),
        ErrorClass::Comm,
        "duplicating a freed communicator",
    )?;
    expect_class(
        handle.get_name(),
        ErrorClass::Comm,
        "the name of a freed communicator",
    )?;
    expect_class(handle.free(), ErrorClass::Comm, "freeing twice")?;
    expect_class(
        world.split_by_color(Color::with_value(-3)),
        ErrorClass::Arg,
        "a negative colour",
    )?;
    Ok(())
}

/// Messages on two communicators with one tag, and a collective between
/// a send and its receive, each match only their own.
fn stays_on_its_communicator(world: &Communicator, dup: &Communicator) -> Result<()> {
    let (rank, size) = (world.rank(), world.size());
    let (next, previous) = ((rank + 1) % size, (rank + size - 1) % size);
    dup.process_at_rank(next).send_with_tag(&(1000 + rank), 5)?;
    world
        .process_at_rank(next)
        .send_with_tag(&(2000 + rank), 5)?;
    // Collectives on both in between: their messages must not be taken
    // by the receives below, nor take the program's messages.
    let mut total = 0;
    world.all_reduce_into(&rank, &mut total, SystemOperation::sum())?;
    dup.barrier()?;
    let (on_world, status) = receive_any(world)?;
    ensure(on_world == 2000 + previous && status == previous, || {
        format!("world's message was {on_world} from {status}")
    })?;
    let (on_dup, status) = receive_any(dup)?;
    ensure(on_dup == 1000 + previous && status == previous, || {
        format!("the duplicate's message was {on_dup} from {status}")
    })?;
    ensure(total == size * (size - 1) / 2, || {
        format!("all-reduce gave {total}")
    })
}

/// One `i32` from any process of `comm`, with any tag: the value and
/// its source.
fn receive_any(comm: &Communicator) -> Result<(i32, i32)> {
    let mut value = 0i32;
    let status = comm
        .any_process()
        .receive_into_with_tag(&mut value, ANY_TAG)?;
    Ok((value, status.source_rank()))
}

/// 10,000 communicators made and freed one after the other (their context
/// ids are reused), a thousand alive at once, each with its own traffic,
/// and as many as the pool of context ids holds.
fn many(world: &Communicator) -> Result<()> {
    let (rank, size) = (world.rank(), world.size());
    let start = Instant::now();
    for i in 0..10_000 {
        let comm = if i % 10 == 0 {
            world
                .split_by_color(Color::with_value(rank % 2))?
                .ok_or_else(|| fail("no communicator from a split"))?
        } else {
            world.duplicate()?
        };
        if i % 1000 == 0 {
            comm.barrier()?;
        }
        if i % 2 == 0 {
            comm.free()?;
        }
    }
    let made = start.elapsed();
    let mut alive = Vec::with_capacity(1000);
    for _ in 0..1000 {
        alive.push(world.duplicate()?);
    }
    // Each communicator carries its index around the ring, all sent
    // before any is received, and received in the other order.
    let (next, previous) = ((rank + 1) % size, (rank + size - 1) % size);
    for (i, comm) in alive.iter().enumerate() {
        comm.process_at_rank(next).send(&(i as u32))?;
    }
    for (i, comm) in alive.iter().enumerate().rev() {
        let (value, _) = comm.process_at_rank(previous).receive::<u32>()?;
        ensure(value == i as u32, || {
            format!("communicator {i} received {value}")
        })?;
    }
    let mut total = 0;
    alive[999].all_reduce_into(&1, &mut total, SystemOperation::sum())?;
    ensure(total == size, || {
        format!("all-reduce on the last communicator gave {total}")
    })?;
    // The pool runs out at 4094 communicators besides world and self:
    // then the agreement fails alike at every rank, and freeing one lets
    // the next be made.
    let exhausted = loop {
        match world.duplicate() {
            Ok(comm) => alive.push(comm),
            Err(e) => break e,
        }
    };
    ensure(
        exhausted.class() == ErrorClass::Other && alive.len() == 4094,
        || {
            format!(
                "{} communicators alive when making more failed with {exhausted}",
                alive.len()
            )
        },
    )?;
    alive.pop();
    let last = world.duplicate()?;
    last.barrier()?;
    drop(alive);
    world.barrier()?;
    if rank == 0 {
        println!(
            "10000 communicators made and freed in {:.2} s, 1000 alive at once in {:.2} s",
            made.as_secs_f64(),
            (start.elapsed() - made).as_secs_f64()
        );
    }
    Ok(())
}

/// Two threads per process make and free communicators at once, each
/// from its own parent, and use them.
fn threads(world: &Communicator) -> Result<()> {
    let size = world.size();
    let parents = [world.duplicate()?, world.duplicate()?];
    std::thread::scope(|s| {
        let workers: Vec<_> = parents
            .iter()
            .enumerate()
            .map(|(k, parent)| {
                s.spawn(move || -> Result<()> {
                    for i in 0..200 {
                        let comm = if i % 2 == 0 {
                            parent.duplicate()?
                        } else {
                            parent
                                .split_by_color(Color::with_value(0))?
                                .ok_or_else(|| fail("no communicator"))?
                        };
                        let mut total = 0;
                        comm.all_reduce_into(&(k as i32 + 1), &mut total, SystemOperation::sum())?;
                        ensure(total == (k as i32 + 1) * size, || {
                            format!("thread {k}: all-reduce {i} gave {total}")
                        })?;
                        comm.free()?;
                    }
                    Ok(())
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().unwrap_or_else(|_| Err(fail("a thread panicked"))))
            .collect::<Result<Vec<()>>>()
    })?;
    world.barrier()
}

/// A split by host in a job of `PER_HOST` consecutive ranks per host:
/// each rank's communicator holds exactly the ranks of its host.
fn hosts(world: &Communicator) -> Result<()> {
    let per_host: i32 = std::env::args()
        .nth(2)
        .and_then(|a| a.parse().ok())
        .ok_or_else(|| fail("usage: communicators hosts PER_HOST"))?;
    let rank = world.rank();
    let first = rank - rank % per_host;
    let expected: Vec<i32> = (first..(first + per_host).min(world.size())).collect();
    let host = world.split_shared(rank)?;
    check_members(&host, world, &expected, "split by host")
}
