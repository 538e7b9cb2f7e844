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
    let maps = std::fs::read_to_string("/proc/self/maps")
        .map_err(|e| fail(format!("reading /proc/self/maps: {e}")))?;
    // A mapping whose pages have different policies shows as several
    // consecutive lines (the kernel splits it where the policy changes):
    // one region per memory file (its inode), from its first line's start
    // to its last one's end.
    let mut regions: BTreeMap<u64, (usize, usize)> = BTreeMap::new();
    for line in maps
        .lines()
        .filter(|line| line.contains("/memfd:oxmpi-collectives"))
    {
        let fields: Vec<&str> = line.split_whitespace().collect();
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
        let region = regions.entry(inode).or_insert((start, end));
        *region = (region.0.min(start), region.1.max(end));
    }
    ensure(!regions.is_empty(), || {
        "no collectives' region is mapped after an all-reduce".to_owned()
    })?;
    for (start, end) in regions.into_values() {
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
