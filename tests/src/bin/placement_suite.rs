//! Where the shared memory a rank reads lies, as the kernel records it:
//! `placement_suite`, started by the harness through oxrun with
//! `OXMPI_NUMA_NODES` set for some ranks and not for others. A rank
//! expects the pages it owns to be bound (`MPOL_BIND`) to exactly the
//! nodes of its `OXMPI_NUMA_NODES` (node numbers below 63, separated by
//! commas, such as `0`), or, where that is unset, to have no policy of
//! their own (first touch: on a machine with one NUMA node, or for a rank
//! not bound to a node). Every rank checks, page by page, the policy the
//! kernel recorded (`oxmpi_shm::page_policy`, `get_mempolicy`):
//!
//! - of a contiguous `allocate_shared` window whose parts are not whole
//!   pages (rank r's is r + 2 pages and 1000 bytes), every page of the
//!   block: it is the rank's whose part holds the page's first byte;
//! - of an `allocate_shared` window with `alloc_shared_noncontig`, every
//!   page of every part;
//! - of an `allocate` window, every page of this rank's;
//! - of each queue of the shared-memory transport this rank consumes
//!   (mapped as `/memfd:oxmpi-shm-PID-PRODUCER-to-CONSUMER`), after
//!   traffic with every other rank: one from each, every page, the first
//!   (the header and the first cells, which the producer wrote the layout
//!   into) included, and, where the rank is bound, every page on its
//!   nodes as `/proc/self/numa_maps` counts them (the first page a
//!   producer on another node allocated would show there; on a machine
//!   with one node every page is on node 0 whoever allocated it);
//! - of the region of the collectives over shared memory (mapped as
//!   `/memfd:oxmpi-collectives`), made by an all-reduce: every page has no
//!   policy or the nodes of a rank; the first, every process's cells,
//!   which they all poll, has none; and every rank's policy is found on
//!   some of its pages (each process's slots and staging areas are its
//!   own).

use oxmpi::collective::SystemOperation;
use oxmpi::rma::Window;
use oxmpi::{Communicator, Info, Result, Threading};
use oxmpi_jobs::checks::{ensure, fail};
use oxmpi_jobs::program::{run_check, world_returning_errors};
use oxmpi_shm::{page_policy, PagePolicy};
use std::collections::BTreeMap;
use std::process::ExitCode;

fn main() -> ExitCode {
    run_check("placement_suite", Threading::Single, |universe| {
        let world = world_returning_errors(universe);
        let expected = expectations(&world)?;
        collectives(&world, &expected)?;
        inbound_queues(&world, &expected)?;
        contiguous_shared(&world, &expected)?;
        noncontiguous_shared(&world, &expected)?;
        allocated(&world, &expected)
    })
}

/// The size of a page, what a memory policy is recorded for.
fn page() -> usize {
    // SAFETY: sysconf only reads a system parameter.
    let bytes = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(bytes).unwrap_or(4096)
}

/// The policy every rank's pages must have, by rank: all-gathered from
/// each rank's `OXMPI_NUMA_NODES`.
fn expectations(world: &Communicator) -> Result<Vec<PagePolicy>> {
    const BOUND: u64 = 1 << 63;
    let mine = match std::env::var("OXMPI_NUMA_NODES") {
        Ok(list) if !list.trim().is_empty() => {
            list.split(',')
                .try_fold(BOUND, |mask, node| match node.trim().parse::<u32>() {
                    Ok(n) if n < 63 => Ok(mask | 1 << n),
                    _ => Err(fail(format!(
                        "OXMPI_NUMA_NODES={list:?}: this check takes node numbers below 63 \
                         separated by commas"
                    ))),
                })?
        }
        _ => 0,
    };
    let mut all = vec![0u64; world.size() as usize];
    world.all_gather_into(&mine, &mut all[..])?;
    Ok(all
        .into_iter()
        .map(|mask| match mask {
            0 => PagePolicy::Default,
            mask => PagePolicy::Bind((0..63).filter(|n| mask & 1 << n != 0).collect()),
        })
        .collect())
}

/// The policy of the page at `addr`.
fn policy(addr: usize) -> Result<PagePolicy> {
    page_policy(addr as *const u8)
        .map_err(|e| fail(format!("the policy of the page at {addr:#x}: {e}")))
}

/// Checks that every page whose first byte lies in `start..end` has the
/// policy `expected`; `what` names the memory.
fn check_pages(start: usize, end: usize, expected: &PagePolicy, what: &str) -> Result<()> {
    let mut at = start.next_multiple_of(page());
    while at < end {
        let got = policy(at)?;
        ensure(&got == expected, || {
            format!(
                "{what}: the page at byte {} has policy {got:?}, expected {expected:?}",
                at - start
            )
        })?;
        at += page();
    }
    Ok(())
}

/// Each page of a contiguous shared block is its first byte's rank's.
fn contiguous_shared(world: &Communicator, expected: &[PagePolicy]) -> Result<()> {
    let rank = world.rank() as usize;
    let size = |r: usize| (r + 2) * page() + 1000;
    let window = Window::allocate_shared(world, size(rank), 1, &Info::new())?;
    for (r, expected) in expected.iter().enumerate() {
        let part = window.shared_query(r as i32)?;
        let start = part.base() as usize;
        ensure(part.size() == size(r), || {
            format!("rank {r}'s part has {} bytes", part.size())
        })?;
        check_pages(
            start,
            start + part.size(),
            expected,
            &format!("rank {r}'s part of a contiguous shared window"),
        )?;
    }
    world.barrier()?;
    window.free()
}

/// Each part of a non-contiguous shared window is its rank's.
fn noncontiguous_shared(world: &Communicator, expected: &[PagePolicy]) -> Result<()> {
    let mut info = Info::new();
    info.set("alloc_shared_noncontig", "true")?;
    let window = Window::allocate_shared(world, 3 * page(), 1, &info)?;
    for (r, expected) in expected.iter().enumerate() {
        let part = window.shared_query(r as i32)?;
        let start = part.base() as usize;
        check_pages(
            start,
            start + part.size(),
            expected,
            &format!("rank {r}'s part of a non-contiguous shared window"),
        )?;
    }
    world.barrier()?;
    window.free()
}

/// An allocated window's memory is its rank's.
fn allocated(world: &Communicator, expected: &[PagePolicy]) -> Result<()> {
    let rank = world.rank() as usize;
    let window = Window::allocate(world, 5 * page() + 8, 8, &Info::new())?;
    ensure(window.direct_access(), || {
        "an allocated window without direct access: not in shared memory".to_owned()
    })?;
    let start = window.base();
    check_pages(
        start,
        start + window.size(),
        &expected[rank],
        "this rank's allocated window",
    )?;
    world.barrier()?;
    window.free()
}

/// The collectives' region of each communicator this process has one of
/// (world's, made by the all-reduce) holds pages of every rank's policy,
/// and its first page (the cells) has none.
fn collectives(world: &Communicator, expected: &[PagePolicy]) -> Result<()> {
    let mut sum = 0u64;
    world.all_reduce_into(&1u64, &mut sum, SystemOperation::sum())?;
    ensure(sum == world.size() as u64, || format!("the sum is {sum}"))?;
    let regions = mappings("/memfd:oxmpi-collectives")?;
    ensure(!regions.is_empty(), || {
        "no collectives' region is mapped after an all-reduce".to_owned()
    })?;
    for (start, end, _) in regions.into_values() {
        let policies: Vec<PagePolicy> = (start..end)
            .step_by(page())
            .map(policy)
            .collect::<Result<_>>()?;
        ensure(policies[0] == PagePolicy::Default, || {
            format!("the cells' page has policy {:?}", policies[0])
        })?;
        // The cells and the progress lines have no policy whatever the
        // ranks'.
        if let Some(p) = policies
            .iter()
            .find(|&p| *p != PagePolicy::Default && !expected.contains(p))
        {
            return Err(fail(format!(
                "a page of the collectives' region has policy {p:?}, which no rank has: \
                 {expected:?}"
            )));
        }
        for kind in expected {
            ensure(policies.contains(kind), || {
                format!(
                    "no page of the collectives' region ({} pages) has policy {kind:?}",
                    policies.len()
                )
            })?;
        }
    }
    Ok(())
}

/// This process's mappings of memory files whose name starts with
/// `label`, by inode: where each starts and ends, and its name.
fn mappings(label: &str) -> Result<BTreeMap<u64, (usize, usize, String)>> {
    let maps = std::fs::read_to_string("/proc/self/maps")
        .map_err(|e| fail(format!("reading /proc/self/maps: {e}")))?;
    // A mapping whose pages have different policies shows as several
    // consecutive lines (the kernel splits it where the policy changes):
    // one mapping per memory file (its inode), from its first line's start
    // to its last one's end.
    let mut found: BTreeMap<u64, (usize, usize, String)> = BTreeMap::new();
    for line in maps.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let Some(name) = fields.get(5).filter(|name| name.starts_with(label)) else {
            continue;
        };
        let parsed = (|| {
            let (start, end) = fields.first()?.split_once('-')?;
            Some((
                fields.get(4)?.parse::<u64>().ok()?,
                usize::from_str_radix(start, 16).ok()?,
                usize::from_str_radix(end, 16).ok()?,
            ))
        })();
        let (inode, start, end) =
            parsed.ok_or_else(|| fail(format!("a line of /proc/self/maps: {line}")))?;
        let mapping = found
            .entry(inode)
            .or_insert((start, end, (*name).to_owned()));
        mapping.0 = mapping.0.min(start);
        mapping.1 = mapping.1.max(end);
    }
    Ok(found)
}

/// After a message from every other rank, this rank maps one queue from
/// each, every page of which has this rank's policy and, where it is
/// bound, lies on its nodes.
fn inbound_queues(world: &Communicator, expected: &[PagePolicy]) -> Result<()> {
    let rank = world.rank() as usize;
    let size = world.size() as usize;
    for shift in 1..size {
        let to = world.process_at_rank(((rank + shift) % size) as i32);
        let from = world.process_at_rank(((rank + size - shift) % size) as i32);
        let mut got = [0u64];
        world.send_receive_into(&[rank as u64][..], &to, &mut got[..], &from)?;
        ensure(got[0] == ((rank + size - shift) % size) as u64, || {
            format!("a message {shift} ranks back said {}", got[0])
        })?;
    }
    let label = "/memfd:oxmpi-shm-";
    let mut producers = Vec::new();
    let numa_maps = std::fs::read_to_string("/proc/self/numa_maps")
        .map_err(|e| fail(format!("reading /proc/self/numa_maps: {e}")))?;
    for (start, end, name) in mappings(label)?.into_values() {
        // `/memfd:oxmpi-shm-PID-PRODUCER-to-CONSUMER`.
        let ranks = name[label.len()..]
            .split_once('-')
            .and_then(|(_, ranks)| ranks.split_once("-to-"))
            .and_then(|(p, c)| Some((p.parse::<usize>().ok()?, c.parse::<usize>().ok()?)));
        let (producer, consumer) =
            ranks.ok_or_else(|| fail(format!("a queue's memory file is named {name}")))?;
        if consumer != rank {
            continue;
        }
        producers.push(producer);
        let what = format!("the queue from rank {producer}");
        check_pages(start, end, &expected[rank], &what)?;
        if let PagePolicy::Bind(nodes) = &expected[rank] {
            on_nodes(&numa_maps, start, end, nodes, &what)?;
        }
    }
    producers.sort_unstable();
    let others: Vec<usize> = (0..size).filter(|&r| r != rank).collect();
    ensure(producers == others, || {
        format!("this rank consumes queues from ranks {producers:?}, expected {others:?}")
    })?;
    world.barrier()
}

/// Checks that `/proc/self/numa_maps` (`numa_maps`) counts every page of
/// the mapping `start..end` on `nodes`: the pages it holds (`N<node>=`)
/// are all on them, and are all of its pages (all are allocated).
fn on_nodes(numa_maps: &str, start: usize, end: usize, nodes: &[u32], what: &str) -> Result<()> {
    let mut counted = 0;
    for line in numa_maps.lines().filter(|line| {
        line.split_whitespace()
            .next()
            .and_then(|at| usize::from_str_radix(at, 16).ok())
            .is_some_and(|at| (start..end).contains(&at))
    }) {
        for (node, pages) in line.split_whitespace().filter_map(|word| {
            let (node, pages) = word.strip_prefix('N')?.split_once('=')?;
            Some((node.parse::<u32>().ok()?, pages.parse::<usize>().ok()?))
        }) {
            ensure(nodes.contains(&node), || {
                format!(
                    "{what}: {pages} of its pages are on NUMA node {node}, not {nodes:?}: {line}"
                )
            })?;
            counted += pages;
        }
    }
    let pages = (end - start) / page();
    ensure(counted == pages, || {
        format!("{what}: /proc/self/numa_maps counts {counted} of its {pages} pages on a node")
    })
}
