//! Intercommunicators, topologies, attributes, info objects and error
//! handlers run as real jobs: `comm_features CHECK`, started by the
//! harness through oxrun. A check exits non-zero, saying why, when
//! something is wrong.
//!
//! Checks: `inter` (2 or more ranks: an intercommunicator of the even
//! and the odd world ranks, messages both ways, barrier, broadcast each
//! way, duplicate, merge in both orders, pairs made from self
//! communicators, errors), `topology` (Cartesian
//! grids of 2 and 3 dimensions with shifts and subgrids, a grid smaller
//! than the job, a ring graph, a distributed graph, the neighbourhood
//! all-gather and all-to-all on each, errors), `state`
//! (attributes with their callbacks on duplicate and free, and on self at
//! finalize, predefined
//! attributes, info objects and hints, error handlers), `fatal` (world
//! and self start with `ErrorHandler::Fatal`, which a duplicate inherits;
//! rank 1 makes an error on world, which ends the job), `fatal-at-wait`
//! (the same, with a truncation that rank 1's wait finds).

use oxmpi::collective::SystemOperation;
use oxmpi::Threading;
use oxmpi::{
    dims_create, Color, Communicator, CommunicatorRelation, Error, ErrorClass, ErrorHandler, Info,
    Keyval, PredefinedAttribute, Result, TopologyKind, MAX_INFO_KEY, PROC_NULL, TAG_UB,
};
use oxmpi_jobs::checks::{ensure, expect_class, fail};
use oxmpi_jobs::program::{run_check, world_returning_errors};
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

fn main() -> ExitCode {
    let check = std::env::args().nth(1).unwrap_or_default();
    run_check(
        &format!("comm_features {check}"),
        Threading::Single,
        |universe| {
            if let Some(at_wait) = match check.as_str() {
                "fatal" => Some(false),
                "fatal-at-wait" => Some(true),
                _ => None,
            } {
                return fatal(&universe.world(), &universe.self_comm(), at_wait);
            }
            // The other checks look at the errors calls hand back.
            let world = world_returning_errors(universe);
            match check.as_str() {
                "inter" => inter(&world, &universe.self_comm()),
                "topology" => topology(&world),
                "state" => state(&world, &universe.self_comm()),
                other => Err(fail(format!("unknown check {other:?}"))),
            }
        },
    )
}

/// The world rank of every member of `comm`, in rank order.
fn world_ranks_of(comm: &Communicator, world: &Communicator) -> Result<Vec<i32>> {
    let mut all = vec![0i32; comm.size() as usize];
    comm.all_gather_into(&world.rank(), &mut all[..])?;
    Ok(all)
}

// ---------------------------------------------------------------- inter

/// The even world ranks (group A) and the odd ones (group B), as an
/// intercommunicator made through world.
fn make_inter(world: &Communicator) -> Result<(Communicator, Communicator, bool)> {
    let in_a = world.rank() % 2 == 0;
    let local = world
        .split_by_color(Color::with_value(world.rank() % 2))?
        .ok_or_else(|| fail("no half for a defined colour"))?;
    // Leaders: world rank 0 for A, 1 for B.
    let remote_leader = if in_a { 1 } else { 0 };
    let inter = local.create_intercommunicator(0, world, remote_leader, 77)?;
    Ok((local, inter, in_a))
}

/// World ranks of group A (`a`) or B.
fn half(size: i32, a: bool) -> Vec<i32> {
    (0..size).filter(|r| (r % 2 == 0) == a).collect()
}

fn inter(world: &Communicator, self_comm: &Communicator) -> Result<()> {
    let size = world.size();
    ensure(size >= 2, || "inter needs 2 or more ranks".into())?;
    let (local, inter, in_a) = make_inter(world)?;
    let mine = half(size, in_a);
    let theirs = half(size, !in_a);
    ensure(inter.is_inter_communicator(), || {
        "not an intercommunicator".into()
    })?;
    ensure(!world.is_inter_communicator(), || "world is inter".into())?;
    ensure(
        inter.size() == local.size() && inter.rank() == local.rank(),
        || "an intercommunicator's rank and size are the local group's".into(),
    )?;
    ensure(inter.remote_size()? as usize == theirs.len(), || {
        format!(
            "remote size {:?}, expected {}",
            inter.remote_size(),
            theirs.len()
        )
    })?;
    let remote: Vec<Option<i32>> = inter.remote_group()?.translate_ranks(
        &(0..theirs.len() as i32).collect::<Vec<_>>(),
        &world.group(),
    )?;
    ensure(
        remote == theirs.iter().map(|&r| Some(r)).collect::<Vec<_>>(),
        || format!("remote group {remote:?}, expected {theirs:?}"),
    )?;
    expect_class(
        local.remote_size(),
        ErrorClass::Comm,
        "remote size of an intracommunicator",
    )?;

    round_trips(&inter, world, &theirs, "intercommunicator")?;
    inter.barrier()?;

    // Broadcasts: from A's rank 0 to B, then from B's last rank to A.
    let from_a = [4242u64, mine.len() as u64];
    if in_a {
        if inter.rank() == 0 {
            inter.broadcast_to_remote_group(&from_a[..])?;
        } else {
            // The root's group mates (MPI_PROC_NULL).
            inter.pass_remote_group_collective()?;
        }
    } else {
        let mut got = [0u64; 2];
        inter.broadcast_from_remote_group(0, &mut got[..])?;
        ensure(got == [4242, theirs.len() as u64], || {
            format!("broadcast from A: {got:?}")
        })?;
    }
    let b_root = half(size, false).len() as i32 - 1;
    let mut big = vec![0u32; 100_000];
    if !in_a {
        if inter.rank() == b_root {
            big.iter_mut()
                .enumerate()
                .for_each(|(i, v)| *v = i as u32 * 3);
            inter.broadcast_to_remote_group(&big[..])?;
        } else {
            inter.pass_remote_group_collective()?;
        }
    } else {
        inter.broadcast_from_remote_group(b_root, &mut big[..])?;
        ensure(
            big.iter().enumerate().all(|(i, &v)| v == i as u32 * 3),
            || "broadcast of 400 kB from B".into(),
        )?;
    }
    expect_class(
        inter.broadcast_from_remote_group(theirs.len() as i32, &mut [0u8; 1][..]),
        ErrorClass::Root,
        "broadcast from a root outside the remote group",
    )?;

    // A duplicate: the same groups, a context of its own.
    let dup = inter.duplicate()?;
    ensure(dup.is_inter_communicator(), || {
        "the duplicate is not inter".into()
    })?;
    ensure(
        inter.compare(&dup) == CommunicatorRelation::Congruent,
        || format!("inter vs duplicate: {:?}", inter.compare(&dup)),
    )?;
    ensure(
        inter.compare(&local) == CommunicatorRelation::Unequal,
        || "inter vs intra".into(),
    )?;
    round_trips(&dup, world, &theirs, "duplicate")?;

    // Merges: A high puts B first; both low puts the group of world rank
    // 0 (A) first. Ranks within a group keep their order.
    let merged = inter.merge(in_a)?;
    let b_first: Vec<i32> = half(size, false)
        .into_iter()
        .chain(half(size, true))
        .collect();
    ensure(world_ranks_of(&merged, world)? == b_first, || {
        format!("merge with A high: {:?}", world_ranks_of(&merged, world))
    })?;
    let merged_low = dup.merge(false)?;
    let a_first: Vec<i32> = half(size, true)
        .into_iter()
        .chain(half(size, false))
        .collect();
    ensure(world_ranks_of(&merged_low, world)? == a_first, || {
        format!(
            "merge with both low: {:?}",
            world_ranks_of(&merged_low, world)
        )
    })?;
    let mut sum = 0i32;
    merged_low.all_reduce_into(&world.rank(), &mut sum, SystemOperation::sum())?;
    ensure(sum == size * (size - 1) / 2, || {
        format!("sum over the merge: {sum}")
    })?;

    // Errors.
    expect_class(
        inter.process_at_rank(theirs.len() as i32).send(&1u8),
        ErrorClass::Rank,
        "send past the remote group",
    )?;
    let mut x = 0i32;
    expect_class(
        inter.scan_into(&1i32, &mut x, SystemOperation::sum()),
        ErrorClass::Comm,
        "a scan on an intercommunicator",
    )?;
    expect_class(
        inter.split_by_color(Color::with_value(0)),
        ErrorClass::Comm,
        "split of an intercommunicator",
    )?;
    expect_class(
        inter.create_cartesian_communicator(&[1], &[false], false),
        ErrorClass::Comm,
        "a grid over an intercommunicator",
    )?;
    expect_class(
        merged.merge(true),
        ErrorClass::Comm,
        "merge of an intracommunicator",
    )?;
    expect_class(
        local.create_intercommunicator(local.size(), world, 0, 1),
        ErrorClass::Rank,
        "local leader outside the communicator",
    )?;
    // A leader that names itself as the remote leader fails, and its
    // group learns that it did instead of waiting.
    let own = world.create_intercommunicator(0, world, 0, 5);
    let expected = if world.rank() == 0 {
        ErrorClass::Rank
    } else {
        ErrorClass::Other
    };
    expect_class(own, expected, "remote leader is the local leader")?;

    // Pairs of processes, each from its self communicator: groups of one,
    // several intercommunicators made at once through world.
    let partner = world.rank() ^ 1;
    if partner < size {
        let pair = self_comm.create_intercommunicator(0, world, partner, 3)?;
        ensure(pair.size() == 1 && pair.remote_size()? == 1, || {
            "pair sizes".into()
        })?;
        round_trips(&pair, world, &[partner], "pair")?;
        let merged = pair.merge(false)?;
        let expected = vec![world.rank().min(partner), world.rank().max(partner)];
        ensure(world_ranks_of(&merged, world)? == expected, || {
            "pair merge".into()
        })?;
    }

    dup.free()?;
    inter.free()?;
    world.barrier()?;
    if world.rank() == 0 {
        println!(
            "inter: {} and {} ranks, merged both ways",
            mine.len(),
            theirs.len()
        );
    }
    Ok(())
}

/// Every process sends its world rank to every remote process (tag: its
/// rank here) and receives theirs, by rank and from any source; the
/// statuses name the senders by their remote ranks.
fn round_trips(
    inter: &Communicator,
    world: &Communicator,
    theirs: &[i32],
    what: &str,
) -> Result<()> {
    let me = world.rank();
    oxmpi::request::scope(|scope| -> Result<()> {
        let mut sends = Vec::new();
        for r in 0..theirs.len() as i32 {
            sends.push(inter.process_at_rank(r).immediate_send_with_tag(
                scope,
                &me,
                inter.rank(),
            )?);
        }
        for r in 0..theirs.len() as i32 {
            let (value, status) = inter.process_at_rank(r).receive::<i32>()?;
            ensure(
                value == theirs[r as usize] && status.source_rank() == r && status.tag() == r,
                || {
                    format!(
                        "{what}: from remote {r}: {value} {status:?}, expected {}",
                        theirs[r as usize]
                    )
                },
            )?;
        }
        oxmpi::request::wait_all(sends)?;
        Ok(())
    })?;
    // Replies from any source: each remote process's rank comes back once.
    let mut seen = vec![false; theirs.len()];
    for r in 0..theirs.len() as i32 {
        inter.process_at_rank(r).send_with_tag(&(me * 10), 900)?;
    }
    for _ in 0..theirs.len() {
        let mut value = 0i32;
        let status = inter.any_process().receive_into_with_tag(&mut value, 900)?;
        let source = status.source_rank() as usize;
        ensure(
            source < theirs.len() && !seen[source] && value == theirs[source] * 10,
            || format!("{what}: any source: {value} from {source}"),
        )?;
        seen[source] = true;
    }
    Ok(())
}

// ------------------------------------------------------------- topology

fn topology(world: &Communicator) -> Result<()> {
    let (rank, size) = (world.rank(), world.size());
    ensure(world.topology().is_none(), || "world has a topology".into())?;
    expect_class(
        world.cartesian_shift(0, 1),
        ErrorClass::Topology,
        "shift on world",
    )?;
    expect_class(
        world.graph_neighbors(0),
        ErrorClass::Topology,
        "graph neighbours on world",
    )?;

    // A periodic × non-periodic grid of every rank.
    let mut dims = [0, 0];
    dims_create(size, &mut dims)?;
    ensure(dims[0] * dims[1] == size && dims[0] >= dims[1], || {
        format!("dims {dims:?}")
    })?;
    let grid = world
        .create_cartesian_communicator(&dims, &[true, false], true)?
        .ok_or_else(|| fail("left out of a grid of every rank"))?;
    ensure(grid.topology() == Some(TopologyKind::Cartesian), || {
        "kind".into()
    })?;
    ensure(grid.rank() == rank, || "ranks were reordered".into())?;
    let layout = grid.cartesian_layout()?;
    let coords = vec![rank / dims[1], rank % dims[1]];
    ensure(layout.coords == coords && layout.dims == dims, || {
        format!("layout {layout:?}")
    })?;
    ensure(grid.cartesian_coordinates(rank)? == coords, || {
        "coordinates".into()
    })?;
    ensure(grid.cartesian_rank(&coords)? == rank, || {
        "rank of coordinates".into()
    })?;
    ensure(grid.cartesian_dimensions()? == 2, || "dimensions".into())?;
    // Periodic wrap; the other dimension's edge is an error.
    ensure(
        grid.cartesian_rank(&[coords[0] + dims[0], coords[1]])? == rank
            && grid.cartesian_rank(&[coords[0] - 2 * dims[0], coords[1]])? == rank,
        || "periodic coordinates wrap".into(),
    )?;
    expect_class(
        grid.cartesian_rank(&[0, dims[1]]),
        ErrorClass::Arg,
        "past a non-periodic edge",
    )?;
    expect_class(
        grid.cartesian_rank(&[0, -1]),
        ErrorClass::Arg,
        "before a non-periodic edge",
    )?;
    expect_class(
        grid.cartesian_rank(&[0]),
        ErrorClass::Dims,
        "too few coordinates",
    )?;
    expect_class(
        grid.cartesian_coordinates(size),
        ErrorClass::Rank,
        "coordinates of rank size",
    )?;
    expect_class(
        grid.cartesian_shift(2, 1),
        ErrorClass::Arg,
        "shift along dimension 2",
    )?;

    // Shifts, checked by the messages they route.
    let at = |c0: i32, c1: i32| c0 * dims[1] + c1;
    let (source, dest) = grid.cartesian_shift(0, 1)?;
    let wrap = |c: i32| c.rem_euclid(dims[0]);
    ensure(
        (source, dest)
            == (
                at(wrap(coords[0] - 1), coords[1]),
                at(wrap(coords[0] + 1), coords[1]),
            ),
        || format!("periodic shift: {source} {dest}"),
    )?;
    shift_exchange(&grid, source, dest, "periodic shift")?;
    let (source, dest) = grid.cartesian_shift(1, -1)?;
    let expected_source = if coords[1] + 1 < dims[1] {
        at(coords[0], coords[1] + 1)
    } else {
        PROC_NULL
    };
    let expected_dest = if coords[1] > 0 {
        at(coords[0], coords[1] - 1)
    } else {
        PROC_NULL
    };
    ensure((source, dest) == (expected_source, expected_dest), || {
        format!("non-periodic shift by -1 at {coords:?}: {source} {dest}")
    })?;
    shift_exchange(&grid, source, dest, "non-periodic shift")?;

    grid_neighborhood(&grid)?;

    // Subgrids: rows, columns and a point.
    let row = grid.cartesian_subgroup(&[false, true])?;
    let row_ranks: Vec<i32> = (0..dims[1]).map(|c| at(coords[0], c)).collect();
    ensure(world_ranks_of(&row, world)? == row_ranks, || {
        format!("row {:?}", world_ranks_of(&row, world))
    })?;
    let row_layout = row.cartesian_layout()?;
    ensure(
        row_layout.dims == [dims[1]]
            && row_layout.periods == [false]
            && row_layout.coords == [coords[1]],
        || format!("row layout {row_layout:?}"),
    )?;
    let column = grid.cartesian_subgroup(&[true, false])?;
    let column_ranks: Vec<i32> = (0..dims[0]).map(|c| at(c, coords[1])).collect();
    ensure(world_ranks_of(&column, world)? == column_ranks, || {
        "column".into()
    })?;
    ensure(column.cartesian_layout()?.periods == [true], || {
        "column period".into()
    })?;
    let point = grid.cartesian_subgroup(&[false, false])?;
    ensure(
        point.size() == 1 && point.cartesian_dimensions()? == 0,
        || "point".into(),
    )?;
    expect_class(
        grid.cartesian_subgroup(&[true]),
        ErrorClass::Arg,
        "one flag for two dimensions",
    )?;

    // Three dimensions, and a duplicate that keeps the grid.
    let mut dims3 = [0, 0, 0];
    dims_create(size, &mut dims3)?;
    let cube = world
        .create_cartesian_communicator(&dims3, &[false, true, false], false)?
        .ok_or_else(|| fail("left out of a cube"))?;
    let slab = cube.cartesian_subgroup(&[true, false, true])?;
    let c3 = cube.cartesian_coordinates(rank)?;
    let slab_ranks: Vec<i32> = (0..dims3[0])
        .flat_map(|a| (0..dims3[2]).map(move |b| (a, b)))
        .map(|(a, b)| (a * dims3[1] + c3[1]) * dims3[2] + b)
        .collect();
    ensure(world_ranks_of(&slab, world)? == slab_ranks, || {
        "slab of a cube".into()
    })?;
    let cube_dup = cube.duplicate()?;
    ensure(
        cube_dup.cartesian_layout()? == cube.cartesian_layout()?,
        || "dup keeps the grid".into(),
    )?;

    // A line of all but the last rank: the last is left out.
    if size > 1 {
        let line = world.create_cartesian_communicator(&[size - 1], &[false], false)?;
        ensure(line.is_some() == (rank < size - 1), || {
            "who is in a line of size - 1".into()
        })?;
        if let Some(line) = line {
            let (left, right) = line.cartesian_shift(0, 1)?;
            ensure(
                left == if rank == 0 { PROC_NULL } else { rank - 1 }
                    && right
                        == if rank == size - 2 {
                            PROC_NULL
                        } else {
                            rank + 1
                        },
                || format!("line neighbours {left} {right}"),
            )?;
        }
    }
    expect_class(
        world.create_cartesian_communicator(&[size + 1], &[false], false),
        ErrorClass::Arg,
        "a grid larger than the communicator",
    )?;
    expect_class(
        world.create_cartesian_communicator(&[0], &[false], false),
        ErrorClass::Dims,
        "a dimension of size 0",
    )?;
    expect_class(
        world.create_cartesian_communicator(&[1, 1], &[false], false),
        ErrorClass::Arg,
        "periods that do not match the dimensions",
    )?;

    // A ring graph.
    let mut index = Vec::new();
    let mut edges = Vec::new();
    for node in 0..size {
        edges.extend([(node + size - 1) % size, (node + 1) % size]);
        index.push(edges.len() as i32);
    }
    let ring = world
        .create_graph_communicator(&index, &edges, false)?
        .ok_or_else(|| fail("left out of a ring"))?;
    ensure(ring.topology() == Some(TopologyKind::Graph), || {
        "graph kind".into()
    })?;
    ensure(ring.graph_dimensions()? == (size, 2 * size), || {
        "graph dimensions".into()
    })?;
    ensure(
        ring.graph_layout()? == (index.clone(), edges.clone()),
        || "graph layout".into(),
    )?;
    let neighbors = ring.graph_neighbors(rank)?;
    ensure(
        neighbors == [(rank + size - 1) % size, (rank + 1) % size]
            && ring.graph_neighbors_count(rank)? == 2,
        || format!("graph neighbours {neighbors:?}"),
    )?;
    // Each sends its rank to its right neighbour and receives from its left.
    shift_exchange(&ring, neighbors[0], neighbors[1], "ring graph")?;
    let mut gathered = [-1i32; 2];
    ring.neighbor_all_gather_into(&rank, &mut gathered[..])?;
    ensure(gathered[..] == neighbors[..], || {
        format!("ring all-gather {gathered:?}")
    })?;
    let mut blocks = [-1i32; 2];
    ring.neighbor_all_to_all_into(&[rank * 10, rank * 10 + 1][..], &mut blocks[..])?;
    // Repeated edges between two processes (1 or 2 ranks) pair off in
    // order; else the left neighbour sends its block 1 (to its right).
    let expected = if size <= 2 {
        [neighbors[0] * 10, neighbors[1] * 10 + 1]
    } else {
        [neighbors[0] * 10 + 1, neighbors[1] * 10]
    };
    ensure(blocks == expected, || {
        format!("ring all-to-all {blocks:?}, expected {expected:?}")
    })?;
    expect_class(
        ring.neighbor_all_gather_into(&rank, &mut gathered[..1]),
        ErrorClass::Count,
        "a receive buffer for one of two neighbours",
    )?;
    expect_class(
        world.neighbor_all_gather_into(&rank, &mut gathered[..]),
        ErrorClass::Topology,
        "a neighbourhood collective without a topology",
    )?;
    expect_class(
        ring.graph_neighbors(size),
        ErrorClass::Rank,
        "neighbours of no node",
    )?;
    expect_class(
        ring.cartesian_layout(),
        ErrorClass::Topology,
        "grid of a graph",
    )?;
    expect_class(
        world.create_graph_communicator(&[2, 1], &[0, 1], false),
        ErrorClass::Arg,
        "a decreasing index",
    )?;
    expect_class(
        world.create_graph_communicator(&[1], &[size], false),
        ErrorClass::Arg,
        "an edge outside the graph",
    )?;

    // A distributed graph: from the left, to the right, weighted.
    let (left, right) = ((rank + size - 1) % size, (rank + 1) % size);
    let dist = world.create_distributed_graph_adjacent(
        &[left],
        Some(&[rank]),
        &[right],
        Some(&[right]),
        false,
    )?;
    ensure(
        dist.topology() == Some(TopologyKind::DistributedGraph),
        || "dist graph kind".into(),
    )?;
    ensure(
        dist.distributed_graph_neighbors_count()? == (1, 1, true),
        || "dist counts".into(),
    )?;
    let n = dist.distributed_graph_neighbors()?;
    ensure(
        n.sources == [left]
            && n.destinations == [right]
            && n.destination_weights == Some(vec![right]),
        || format!("dist neighbours {n:?}"),
    )?;
    shift_exchange(&dist, left, right, "distributed graph")?;
    let mut from_left = [-1i32];
    dist.neighbor_all_gather_into(&rank, &mut from_left[..])?;
    ensure(from_left == [left], || {
        format!("distributed all-gather {from_left:?}")
    })?;
    dist.neighbor_all_to_all_into(&[rank * 10][..], &mut from_left[..])?;
    ensure(from_left == [left * 10], || {
        format!("distributed all-to-all {from_left:?}")
    })?;
    let unweighted = world.create_distributed_graph_adjacent(&[], None, &[], None, false)?;
    ensure(
        unweighted.distributed_graph_neighbors_count()? == (0, 0, false),
        || "no edges".into(),
    )?;
    expect_class(
        world.create_distributed_graph_adjacent(&[size], None, &[], None, false),
        ErrorClass::Rank,
        "a source outside the communicator",
    )?;
    expect_class(
        world.create_distributed_graph_adjacent(&[left], Some(&[]), &[], None, false),
        ErrorClass::Arg,
        "weights that do not match the edges",
    )?;
    world.barrier()?;
    if rank == 0 {
        println!("topology: {size} ranks as {dims:?} and {dims3:?}");
    }
    Ok(())
}

/// The neighbourhood collectives of a 2-d grid: for each dimension, the
/// neighbour at -1 and then the one at +1; nothing from off the grid.
fn grid_neighborhood(grid: &Communicator) -> Result<()> {
    let rank = grid.rank();
    let mut neighbors = Vec::new();
    for d in 0..2 {
        let (down, up) = grid.cartesian_shift(d, 1)?;
        neighbors.extend([down, up]);
    }
    let or_untouched = |n: i32, value: i32| if n == PROC_NULL { -1 } else { value };
    let mut gathered = [-1i32; 4];
    grid.neighbor_all_gather_into(&rank, &mut gathered[..])?;
    let expected: Vec<i32> = neighbors.iter().map(|&n| or_untouched(n, n)).collect();
    ensure(gathered[..] == expected[..], || {
        format!("grid all-gather {gathered:?}, expected {expected:?}")
    })?;
    // Block j goes to neighbour j. From the neighbour at -1 comes the
    // block it sent to its +1, and the reverse, also when one process is
    // both (a periodic dimension of 1 or 2).
    let send: Vec<i32> = (0..4).map(|j| rank * 10 + j).collect();
    let mut received = [-1i32; 4];
    grid.neighbor_all_to_all_into(&send[..], &mut received[..])?;
    let expected: Vec<i32> = (0..4)
        .map(|i| or_untouched(neighbors[i], neighbors[i] * 10 + (i ^ 1) as i32))
        .collect();
    ensure(received[..] == expected[..], || {
        format!("grid all-to-all {received:?}, expected {expected:?}")
    })
}

/// Sends this rank to `dest` while receiving from `source` (either may be
/// `PROC_NULL`): what arrives is the source's rank.
fn shift_exchange(comm: &Communicator, source: i32, dest: i32, what: &str) -> Result<()> {
    let mut got = -7i32;
    let status = comm.send_receive_into(
        &comm.rank(),
        &comm.process_at_rank(dest),
        &mut got,
        &comm.process_at_rank(source),
    )?;
    let expected = if source == PROC_NULL { -7 } else { source };
    ensure(got == expected && status.source_rank() == source, || {
        format!(
            "{what}: received {got} from {}, expected {expected} from {source}",
            status.source_rank()
        )
    })
}

// ---------------------------------------------------------------- state

fn state(world: &Communicator, self_comm: &Communicator) -> Result<()> {
    // Deleted first at finalize, while MPI still works.
    let at_finalize = Keyval::<i32>::new(
        |_| Ok(None),
        |rank| {
            println!("rank {rank}: self attribute deleted at finalize");
            Ok(())
        },
    );
    self_comm.set_attribute(&at_finalize, world.rank())?;
    attributes(world)?;
    info(world)?;
    handlers(world)?;
    world.barrier()?;
    if world.rank() == 0 {
        println!("state: attributes, info and error handlers");
    }
    Ok(())
}

fn attributes(world: &Communicator) -> Result<()> {
    let size = world.size();
    ensure(
        world.predefined_attribute(PredefinedAttribute::TagUpperBound) == Some(TAG_UB),
        || "TAG_UB".into(),
    )?;
    ensure(
        world.predefined_attribute(PredefinedAttribute::WtimeIsGlobal) == Some(0),
        || "WTIME_IS_GLOBAL".into(),
    )?;
    ensure(
        world.predefined_attribute(PredefinedAttribute::AppNum) == Some(0),
        || "APPNUM".into(),
    )?;
    ensure(
        world.predefined_attribute(PredefinedAttribute::UniverseSize) == Some(size),
        || "UNIVERSE_SIZE".into(),
    )?;

    let copies = Arc::new(AtomicUsize::new(0));
    let deleted = Arc::new(Mutex::new(Vec::<Vec<i32>>::new()));
    let counted = {
        let (copies, deleted) = (copies.clone(), deleted.clone());
        Keyval::<Vec<i32>>::new(
            move |v| {
                copies.fetch_add(1, Ordering::Relaxed);
                Ok(Some(v.iter().map(|x| x + 100).collect()))
            },
            move |v| {
                deleted.lock().unwrap().push(v);
                Ok(())
            },
        )
    };
    let plain = Keyval::<u64>::without_callbacks();
    let cloned = Keyval::<String>::duplicating();
    let comm = world.duplicate()?;
    ensure(comm.attribute(&counted)?.is_none(), || {
        "unset attribute".into()
    })?;
    comm.set_attribute(&counted, vec![1])?;
    comm.set_attribute(&counted, vec![2])?;
    ensure(*deleted.lock().unwrap() == [vec![1]], || {
        "a new value deletes the old".into()
    })?;
    comm.set_attribute(&plain, 7)?;
    comm.set_attribute(&cloned, "hello".to_owned())?;
    ensure(
        comm.attribute(&counted)? == Some(vec![2]) && comm.attribute(&plain)? == Some(7),
        || "get".into(),
    )?;

    let dup = comm.duplicate()?;
    ensure(copies.load(Ordering::Relaxed) == 1, || {
        "one copy on duplicate".into()
    })?;
    ensure(dup.attribute(&counted)? == Some(vec![102]), || {
        "the copy callback's value".into()
    })?;
    ensure(dup.attribute(&plain)?.is_none(), || {
        "a value without copy callback was copied".into()
    })?;
    ensure(dup.attribute(&cloned)?.as_deref() == Some("hello"), || {
        "duplicating keyval".into()
    })?;
    ensure(world.attribute(&counted)?.is_none(), || {
        "attributes are per communicator".into()
    })?;
    // A split copies nothing.
    let split = comm
        .split_by_color(Color::with_value(0))?
        .ok_or_else(|| fail("split"))?;
    ensure(
        split.attribute(&counted)?.is_none() && copies.load(Ordering::Relaxed) == 1,
        || "split copied".into(),
    )?;

    comm.delete_attribute(&counted)?;
    ensure(*deleted.lock().unwrap() == [vec![1], vec![2]], || {
        "delete_attribute".into()
    })?;
    comm.delete_attribute(&counted)?;
    ensure(comm.attribute(&counted)?.is_none(), || {
        "deleted attribute".into()
    })?;
    // Freeing a keyval keeps values and callbacks; freeing the
    // communicator deletes them.
    counted.free();
    dup.free()?;
    ensure(
        *deleted.lock().unwrap() == [vec![1], vec![2], vec![102]],
        || format!("free deletes: {:?}", deleted.lock().unwrap()),
    )?;

    // Failing callbacks fail the call at every process.
    let refuses_copy = Keyval::<u8>::new(
        |_| Err(Error::new(ErrorClass::Other, "copy refused")),
        |_| Ok(()),
    );
    comm.set_attribute(&refuses_copy, 1)?;
    expect_class(
        comm.duplicate(),
        ErrorClass::Other,
        "duplicate with a failing copy",
    )?;
    comm.delete_attribute(&refuses_copy)?;
    let refuses_delete = Keyval::<u8>::new(
        |_| Ok(None),
        |_| Err(Error::new(ErrorClass::Arg, "delete refused")),
    );
    let doomed = comm.duplicate()?;
    doomed.set_attribute(&refuses_delete, 1)?;
    let handle = doomed.clone();
    expect_class(doomed.free(), ErrorClass::Arg, "free with a failing delete")?;
    expect_class(handle.barrier(), ErrorClass::Comm, "a freed communicator")?;

    // Dropping the last handle deletes what is left.
    let dropped = Arc::new(AtomicUsize::new(0));
    let on_drop = {
        let dropped = dropped.clone();
        Keyval::<()>::new(
            |_| Ok(None),
            move |_| {
                dropped.fetch_add(1, Ordering::Relaxed);
                Ok(())
            },
        )
    };
    let short_lived = comm.duplicate()?;
    short_lived.set_attribute(&on_drop, ())?;
    drop(short_lived);
    ensure(dropped.load(Ordering::Relaxed) == 1, || {
        "drop deletes attributes".into()
    })?;
    comm.free()
}

fn info(world: &Communicator) -> Result<()> {
    let mut info = Info::new();
    info.set("no_locks", "true")?;
    info.set("access_style", "read_once")?;
    info.set("no_locks", "false")?;
    ensure(
        info.num_keys() == 2 && info.nth_key(1)? == "access_style",
        || "keys".into(),
    )?;
    ensure(info.get("no_locks")? == Some("false"), || "value".into())?;
    ensure(info.get("missing")?.is_none(), || "missing key".into())?;
    expect_class(
        info.set(&"k".repeat(MAX_INFO_KEY + 1), "v"),
        ErrorClass::InfoKey,
        "long key",
    )?;
    expect_class(
        info.delete("missing"),
        ErrorClass::InfoNoKey,
        "delete of a missing key",
    )?;
    expect_class(info.nth_key(2), ErrorClass::Arg, "third of two keys")?;
    let copy = info.clone();
    info.delete("no_locks")?;
    ensure(copy.num_keys() == 2 && info.num_keys() == 1, || {
        "dup is independent".into()
    })?;

    let comm = world.duplicate()?;
    ensure(comm.info()?.num_keys() == 0, || {
        "a new communicator has no hints".into()
    })?;
    comm.set_info(&copy)?;
    ensure(comm.info()? == copy, || "hints".into())?;
    let dup = comm.duplicate()?;
    ensure(dup.info()? == copy, || "a duplicate keeps the hints".into())?;
    let other = dup.duplicate_with_info(&info)?;
    ensure(other.info()? == info, || "duplicate_with_info".into())?;
    let split = comm
        .split_by_color(Color::with_value(1))?
        .ok_or_else(|| fail("split"))?;
    ensure(split.info()?.num_keys() == 0, || {
        "a split has no hints".into()
    })?;
    Ok(())
}

fn handlers(world: &Communicator) -> Result<()> {
    let size = world.size();
    let seen = Arc::new(Mutex::new(Vec::<ErrorClass>::new()));
    let comm = world.duplicate()?;
    comm.set_error_handler({
        let seen = seen.clone();
        ErrorHandler::user(move |_, e| seen.lock().unwrap().push(e.class()))
    });
    expect_class(
        comm.process_at_rank(size).send(&1u8),
        ErrorClass::Rank,
        "send to rank size",
    )?;
    expect_class(
        comm.process_at_rank(0).send_with_tag(&1u8, -5),
        ErrorClass::Tag,
        "negative tag",
    )?;
    ensure(
        *seen.lock().unwrap() == [ErrorClass::Rank, ErrorClass::Tag],
        || format!("the handler saw {:?}", seen.lock().unwrap()),
    )?;
    // Calls that succeed call no handler.
    ensure(
        comm.compare(world) == CommunicatorRelation::Congruent && seen.lock().unwrap().len() == 2,
        || "compare called the handler".into(),
    )?;
    // Inherited by a duplicate; one error, one call of the handler.
    let dup = comm.duplicate()?;
    let mut buf = [0u8; 1];
    expect_class(
        dup.process_at_rank(-3).receive_into(&mut buf[..]),
        ErrorClass::Rank,
        "receive from -3",
    )?;
    ensure(seen.lock().unwrap().len() == 3, || {
        "the duplicate's handler".into()
    })?;
    let e = dup.call_error_handler(Error::new(ErrorClass::Count, "by hand"));
    ensure(
        e.class() == ErrorClass::Count && seen.lock().unwrap().len() == 4,
        || "call_error_handler".into(),
    )?;
    // Back to returning errors: the handler is not called.
    dup.set_error_handler(ErrorHandler::Return);
    expect_class(
        dup.process_at_rank(size).send(&1u8),
        ErrorClass::Rank,
        "send to rank size",
    )?;
    ensure(seen.lock().unwrap().len() == 4, || {
        "Return calls no handler".into()
    })?;
    // Errors of other calls on the communicator reach the handler too.
    expect_class(
        comm.cartesian_layout(),
        ErrorClass::Topology,
        "grid of a plain communicator",
    )?;
    ensure(seen.lock().unwrap().len() == 5, || {
        "topology errors are handled".into()
    })?;
    // An error found at completion reaches the handler of the request's
    // communicator once; with Return, none.
    expect_class(
        truncated_at_wait(&comm),
        ErrorClass::Truncate,
        "a truncated receive's wait",
    )?;
    expect_class(
        truncated_at_wait(&dup),
        ErrorClass::Truncate,
        "a truncated receive's wait with Return",
    )?;
    ensure(seen.lock().unwrap()[5..] == [ErrorClass::Truncate], || {
        format!("the handler saw {:?}", seen.lock().unwrap())
    })?;
    comm.free()?;
    dup.free()?;
    Ok(())
}

/// The outcome of the wait for a receive of 4 bytes that a message of 8
/// from this process to itself on `comm` truncates: the error is found
/// when the request completes, not when it starts.
fn truncated_at_wait(comm: &Communicator) -> Result<oxmpi::Status> {
    let (long, mut short) = ([7u8; 8], [0u8; 4]);
    let me = comm.process_at_rank(comm.rank());
    oxmpi::request::scope(|scope| {
        let receive = me.immediate_receive_into(scope, &mut short)?;
        me.immediate_send(scope, &long)?.wait()?;
        receive.wait()
    })
}

/// With no handler set (the default is fatal), rank 1 makes an error on
/// world: it sends to a rank that does not exist or, `at_wait`, waits for
/// a receive that a message truncates. The job ends with the error's
/// message.
fn fatal(world: &Communicator, self_comm: &Communicator, at_wait: bool) -> Result<()> {
    for comm in [world, self_comm] {
        ensure(matches!(comm.error_handler(), ErrorHandler::Fatal), || {
            format!(
                "{} does not start fatal",
                comm.get_name().unwrap_or_default()
            )
        })?;
    }
    let dup = world.duplicate()?;
    ensure(matches!(dup.error_handler(), ErrorHandler::Fatal), || {
        "inherited".into()
    })?;
    world.barrier()?;
    if world.rank() == 1 {
        let _ = if at_wait {
            truncated_at_wait(world).map(drop)
        } else {
            world.process_at_rank(world.size()).send(&1u8)
        };
        return Err(fail("a fatal error returned"));
    }
    // The others wait for the job to end.
    let mut never = 0u8;
    let _ = world.process_at_rank(1).receive_into(&mut never);
    Err(fail("the job went on after a fatal error"))
}
