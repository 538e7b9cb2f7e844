//! Where the shared memory a rank reads lives: on that rank's NUMA
//! node(s). One mechanism serves every kind of it: the rank that owns a
//! range of a memory file binds the pages of that range to its own nodes
//! ([`bind_pages`], `mbind` with `MPOL_BIND`) before anyone touches them.
//! For a memory file the policy belongs to the file, not to the mapping:
//! pages another process touches first are allocated on the owner's nodes
//! all the same. Which rank owns what:
//!
//! - **Queues.** A queue's segment is made by its producer, but it is the
//!   consumer that polls it and copies every payload out of it, so the
//!   consumer places each inbound segment (`Segment::place_on_own_nodes`)
//!   before it accepts the queue: it binds the whole segment and only then
//!   has its pages allocated, so under its policy, on its nodes. The
//!   producer maps the segment without populating it and touches only the
//!   first page, to write the layout, before it hands the segment over:
//!   that page, allocated on the producer's node, is replaced (its bytes
//!   saved, the page freed with `fallocate`'s `FALLOC_FL_PUNCH_HOLE`,
//!   which takes it out of the producer's mapping too, and the bytes
//!   written back into a page allocated under the consumer's policy), as
//!   it holds the header and the first cells, which the consumer polls
//!   and writes at every lap; then every page is faulted in
//!   (`MADV_POPULATE_WRITE`). The producer touches the segment again, and
//!   faults the pages in to map those the consumer allocated, only once
//!   the VERDICT accepted the queue. Both ends thus still take every page
//!   fault before the first packet (why queues are populated at all: see
//!   `sys::populate`).
//!   Binding first, and replacing the one page allocated before, is what
//!   works for a process without privileges: pages already allocated
//!   stay where they are under a new policy, and migrating them (`mbind`
//!   with `MPOL_MF_MOVE`) moves only pages no other process maps, never
//!   those the producer mapped too; `MPOL_MF_MOVE_ALL` needs
//!   `CAP_SYS_NICE`. Binding at the producer instead would need the
//!   consumer's nodes there (in its card and set-up message), and names
//!   none where the consumer's memory is placed by first touch.
//! - **Windows** (`MPI_Win_allocate`, `MPI_Win_allocate_shared`). A
//!   rank's part of a window is what its own program computes on, while
//!   origins come and go: the owner binds its part's pages. A part in a
//!   segment of its own is bound by its maker, the owner, before it hands
//!   the segment's name out. In a contiguous shared block (made whole by
//!   one rank, the parts rank after rank with no gap) each rank binds its
//!   own part after mapping the block, before the call's last collective
//!   step, so before any rank returns and stores into it. Parts need not
//!   start on page boundaries, and a policy is a page's: a page is its
//!   first byte's, bound by the rank whose part holds that byte. So every
//!   page is bound once, and a rank's part has at most its first partial
//!   page on the previous owner's nodes (a part shorter than a page that
//!   starts inside one has none of its own). The control areas (the
//!   locks and region mutexes every origin takes) are left to first
//!   touch: their maker's.
//! - **Collectives' region** (`oxmpi`'s collectives over shared memory).
//!   Each process's data slots and staging areas are written by that
//!   process alone, at every operation that uses them, and read by the
//!   others: by all of them, by the root of the moment, or a part each
//!   (the long all-reduce), which changes from call to call. The one
//!   process that touches all of them every time is their writer, so each
//!   process binds its own slots and staging areas (pages as above). The
//!   cells (a cache line each, every process's on one page) and the
//!   progress lines are polled by every process: no node is theirs, and
//!   they are left to first touch.
//!
//! The nodes: `OXMPI_NUMA_NODES` (set by oxrun for a rank it bound, from
//! hwloc; empty is the same as unset); else the nodes whose CPUs the rank
//! may run on, from the kernel (`/sys/devices/system/node`, no hwloc
//! needed), when they are fewer than the machine's nodes with memory.
//! Otherwise, on a machine with one node, for an unbound rank, or without
//! NUMA information, placement is left to first touch. The choice is made
//! once per process and said once under `OXMPI_VERBOSE=1`, and a kernel
//! that refuses a binding (no NUMA support) makes it first touch from
//! then on, said once too, never an error.

use crate::sys;
use memmap2::MmapMut;
use oxmpi_adi::{vlog, Error, ErrorClass, Result};
use std::collections::BTreeSet;
use std::fmt;
use std::io;
use std::ops::Range;
use std::sync::{Mutex, OnceLock, PoisonError};

/// Environment variable: the NUMA nodes local to the rank's CPUs (set by
/// oxrun for a rank it bound), a list like `0-1,4`: where the shared
/// memory the rank reads is bound.
pub const NUMA_NODES_ENV: &str = "OXMPI_NUMA_NODES";

/// Where the kernel lists the NUMA nodes.
const NODE_DIR: &str = "/sys/devices/system/node";

/// Where the memory this rank reads is placed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Placement {
    /// Bound to these nodes (ascending); `from` says how they were found.
    Bind { nodes: Vec<u32>, from: &'static str },
    /// Left to the kernel's first touch, for the reason given.
    FirstTouch(String),
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Placement::Bind { nodes, from } => write!(
                f,
                "bound to NUMA node{} {} ({from})",
                if nodes.len() == 1 { "" } else { "s" },
                format_list(nodes)
            ),
            Placement::FirstTouch(why) => write!(f, "placed by first touch: {why}"),
        }
    }
}

impl Placement {
    /// The placement of this rank: see the module docs.
    pub(crate) fn from_env() -> Result<Placement> {
        match std::env::var(NUMA_NODES_ENV) {
            // Empty where oxrun's hwloc knew no node for the rank's CPUs.
            Ok(v) if !v.trim().is_empty() => Placement::named(&v),
            _ => Ok(Placement::from_affinity(
                read_list("/proc/thread-self/status", Some("Cpus_allowed_list:")),
                machine_nodes(),
            )),
        }
    }

    /// Binds the pages of `map` whose first byte lies in `bytes` to the
    /// nodes, where this placement binds. Where the kernel refuses (no
    /// NUMA support, a node without memory), placement is first touch from
    /// then on, said under `OXMPI_VERBOSE=1` with the reason (`what` names
    /// the pages).
    pub(crate) fn bind_pages(
        &mut self,
        map: &MmapMut,
        bytes: Range<usize>,
        what: impl fmt::Display,
    ) {
        let Placement::Bind { nodes, .. } = self else {
            return;
        };
        if let Err(error) = sys::bind_memory(map, pages_of(bytes, sys::page_size()), nodes) {
            *self = Placement::FirstTouch(format!(
                "the kernel refused to bind {what} to NUMA node(s) {}: {error}",
                format_list(nodes)
            ));
            vlog!("shm: the shared memory this process reads is now {self}");
        }
    }

    /// The placement `OXMPI_NUMA_NODES=value` asks for.
    fn named(value: &str) -> Result<Placement> {
        let nodes = parse_list(value).filter(|n| !n.is_empty()).ok_or_else(|| {
            Error::new(
                ErrorClass::Arg,
                format!(
                    "{NUMA_NODES_ENV}={value:?} is not a list of NUMA nodes such as 0-1,4 \
                     (oxrun sets it for the ranks it binds)"
                ),
            )
        })?;
        Ok(Placement::Bind {
            nodes: nodes.into_iter().collect(),
            from: NUMA_NODES_ENV,
        })
    }

    /// The placement of a rank that may run on `cpus`, on a machine whose
    /// nodes (each with its CPUs, and whether it has memory) are `nodes`;
    /// either is `None` where the kernel did not say.
    fn from_affinity(cpus: Option<BTreeSet<u32>>, nodes: Option<Vec<Node>>) -> Placement {
        let Some(nodes) = nodes.filter(|n| !n.is_empty()) else {
            return Placement::FirstTouch(format!(
                "the kernel lists no NUMA nodes ({NODE_DIR}), and {NUMA_NODES_ENV} is unset"
            ));
        };
        let Some(cpus) = cpus else {
            return Placement::FirstTouch("the rank's CPU affinity is unknown".to_owned());
        };
        let with_memory: BTreeSet<u32> = nodes.iter().filter(|n| n.memory).map(|n| n.id).collect();
        if with_memory.len() <= 1 {
            return Placement::FirstTouch("this machine has one NUMA node with memory".to_owned());
        }
        let local: Vec<u32> = nodes
            .iter()
            .filter(|n| n.memory && !n.cpus.is_disjoint(&cpus))
            .map(|n| n.id)
            .collect();
        if local.is_empty() || local.len() == with_memory.len() {
            return Placement::FirstTouch(
                "the rank may run on every NUMA node (it is not bound, and \
                 OXMPI_NUMA_NODES is unset)"
                    .to_owned(),
            );
        }
        Placement::Bind {
            nodes: local,
            from: "the nodes of the rank's CPU affinity",
        }
    }
}

/// This process's placement: found at the first use
/// ([`process_placement`]), first touch from the kernel's first refusal
/// on.
static PROCESS: OnceLock<Result<Mutex<Placement>>> = OnceLock::new();

/// This process's placement (see the module docs), found and said under
/// `OXMPI_VERBOSE=1` at the first call; an `MPI_ERR_ARG` error where
/// `OXMPI_NUMA_NODES` is not a list of nodes.
pub(crate) fn process_placement() -> Result<&'static Mutex<Placement>> {
    PROCESS
        .get_or_init(|| {
            let placement = Placement::from_env()?;
            vlog!(
                "shm: the shared memory this process reads (its inbound queues, its parts of \
                 windows, its slots and staging areas of collectives) is {placement}"
            );
            Ok(Mutex::new(placement))
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// Binds the pages of `map` whose first byte lies in `bytes` (see the
/// module docs) to this process's nodes, where its placement binds
/// ([`Placement::bind_pages`]). An error only where `OXMPI_NUMA_NODES` is
/// not a list of nodes.
pub(crate) fn bind_pages(
    map: &MmapMut,
    bytes: Range<usize>,
    what: impl fmt::Display,
) -> Result<()> {
    process_placement()?
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .bind_pages(map, bytes, what);
    Ok(())
}

/// The whole pages (as a byte range; pages of `page` bytes) whose first
/// byte lies in `bytes`: where a memory is cut into consecutive ranges,
/// each page belongs to exactly one of them.
fn pages_of(bytes: Range<usize>, page: usize) -> Range<usize> {
    if bytes.is_empty() {
        return 0..0;
    }
    bytes.start.next_multiple_of(page)..bytes.end.next_multiple_of(page)
}

/// The memory policy the kernel records for a page
/// ([`page_policy`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PagePolicy {
    /// None of its own: the process's, first touch by default
    /// (`MPOL_DEFAULT`).
    Default,
    /// Allocated on these nodes only (`MPOL_BIND`).
    Bind(Vec<u32>),
    /// Another policy: its mode (`MPOL_*` and mode flags) and nodes.
    Other {
        /// The mode as the kernel reports it.
        mode: i32,
        /// The nodes of its mask.
        nodes: Vec<u32>,
    },
}

/// The memory policy the kernel records for the page of this process at
/// `addr` (`get_mempolicy` with `MPOL_F_ADDR`; for a memory file, the
/// file's policy for that page, whoever set it): to see where shared
/// memory goes, in diagnostics and tests. `EFAULT` where no mapping holds
/// `addr`; nothing at `addr` is read or written.
pub fn page_policy(addr: *const u8) -> io::Result<PagePolicy> {
    sys::memory_policy_at(addr)
}

/// A NUMA node as the kernel describes it.
#[derive(Clone, Debug)]
struct Node {
    id: u32,
    cpus: BTreeSet<u32>,
    memory: bool,
}

/// The machine's NUMA nodes, from sysfs; `None` where it has none to show
/// (a kernel without NUMA support, or no /sys).
fn machine_nodes() -> Option<Vec<Node>> {
    let with_memory = read_list(&format!("{NODE_DIR}/has_memory"), None)?;
    let online = read_list(&format!("{NODE_DIR}/online"), None)?;
    online
        .into_iter()
        .map(|id| {
            Some(Node {
                id,
                cpus: read_list(&format!("{NODE_DIR}/node{id}/cpulist"), None)?,
                memory: with_memory.contains(&id),
            })
        })
        .collect()
}

/// The list in file `path` (after `prefix` on the line that starts with
/// it, when given).
fn read_list(path: &str, prefix: Option<&str>) -> Option<BTreeSet<u32>> {
    let text = std::fs::read_to_string(path).ok()?;
    let line = match prefix {
        Some(p) => text.lines().find_map(|l| l.strip_prefix(p))?,
        None => &text,
    };
    parse_list(line.trim())
}

/// Parses a list in the kernel's format (`0-3,8,10-11`; empty is empty).
fn parse_list(list: &str) -> Option<BTreeSet<u32>> {
    let mut set = BTreeSet::new();
    for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (first, last): (u32, u32) = match part.split_once('-') {
            Some((a, b)) => (a.trim().parse().ok()?, b.trim().parse().ok()?),
            None => {
                let n = part.parse().ok()?;
                (n, n)
            }
        };
        if first > last || last >= MAX_NODE {
            return None;
        }
        set.extend(first..=last);
    }
    Some(set)
}

/// Numbers beyond any machine's CPUs or nodes: a bound on what a list may
/// name, so that a bad value cannot make a huge set.
const MAX_NODE: u32 = 1 << 16;

/// `0-1,4` for `[0, 1, 4]`.
fn format_list(nodes: &[u32]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < nodes.len() {
        let mut j = i;
        while j + 1 < nodes.len() && nodes[j + 1] == nodes[j] + 1 {
            j += 1;
        }
        parts.push(if i == j {
            nodes[i].to_string()
        } else {
            format!("{}-{}", nodes[i], nodes[j])
        });
        i = j + 1;
    }
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: u32, cpus: &str, memory: bool) -> Node {
        Node {
            id,
            cpus: parse_list(cpus).unwrap(),
            memory,
        }
    }

    #[test]
    fn lists_parse_and_print_in_the_kernels_format() {
        let set = parse_list("0-1,4, 6-7").unwrap();
        assert_eq!(set.iter().copied().collect::<Vec<_>>(), [0, 1, 4, 6, 7]);
        assert_eq!(format_list(&[0, 1, 4, 6, 7]), "0-1,4,6-7");
        assert_eq!(parse_list("").unwrap().len(), 0);
        for bad in ["x", "3-1", "1-", "-1", "0-99999999"] {
            assert_eq!(parse_list(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn consecutive_ranges_share_out_every_page_once() {
        assert_eq!(pages_of(0..10, 4096), 0..4096);
        assert_eq!(pages_of(10..4096, 4096), 4096..4096);
        assert_eq!(pages_of(10..4097, 4096), 4096..8192);
        assert_eq!(pages_of(4096..12288, 4096), 4096..12288);
        assert_eq!(pages_of(5..5, 4096), 0..0);
        // Ranges one after the other: their pages follow each other too.
        let cuts = [0, 100, 5000, 5001, 9000, 20000, 20480];
        let mut next = 0;
        for pair in cuts.windows(2) {
            let pages = pages_of(pair[0]..pair[1], 4096);
            if !pages.is_empty() {
                assert_eq!(pages.start, next, "{pair:?}");
                next = pages.end;
            }
        }
        assert_eq!(next, 20480);
    }

    #[test]
    fn the_nodes_oxrun_names_are_bound() {
        assert_eq!(
            Placement::named("0").unwrap().to_string(),
            "bound to NUMA node 0 (OXMPI_NUMA_NODES)"
        );
        assert_eq!(
            Placement::named("0-1").unwrap(),
            Placement::Bind {
                nodes: vec![0, 1],
                from: NUMA_NODES_ENV
            }
        );
        for bad in [",", "node0", "1-0"] {
            let e = Placement::named(bad).unwrap_err();
            assert_eq!(e.class(), ErrorClass::Arg, "{e}");
            assert!(e.message().contains("OXMPI_NUMA_NODES"), "{e}");
        }
    }

    #[test]
    fn without_oxrun_the_affinity_decides_or_first_touch_does() {
        let two = || Some(vec![node(0, "0-3", true), node(1, "4-7", true)]);
        let cpus = |l: &str| parse_list(l);
        assert_eq!(
            Placement::from_affinity(cpus("4-5"), two()),
            Placement::Bind {
                nodes: vec![1],
                from: "the nodes of the rank's CPU affinity"
            }
        );
        // CPUs on two of three nodes: the memory goes to both.
        let three = Some(vec![
            node(0, "0-3", true),
            node(1, "4-7", true),
            node(2, "8-11", true),
        ]);
        assert_eq!(
            Placement::from_affinity(cpus("3-4"), three),
            Placement::Bind {
                nodes: vec![0, 1],
                from: "the nodes of the rank's CPU affinity"
            }
        );
        let unbound = Placement::from_affinity(cpus("0-7"), two()).to_string();
        assert!(unbound.contains("may run on every NUMA node"), "{unbound}");
        let one = Placement::from_affinity(cpus("0-1"), Some(vec![node(0, "0-1", true)]));
        assert!(one.to_string().contains("one NUMA node"), "{one}");
        let none = Placement::from_affinity(cpus("0-1"), None).to_string();
        assert!(none.contains("lists no NUMA nodes"), "{none}");
        // A node without memory is never bound to.
        let cpu_only = Some(vec![
            node(0, "0-3", true),
            node(1, "4-7", false),
            node(2, "", true),
        ]);
        let p = Placement::from_affinity(cpus("4"), cpu_only);
        assert!(matches!(p, Placement::FirstTouch(_)), "{p}");
    }
}
