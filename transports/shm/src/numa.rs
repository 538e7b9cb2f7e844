//! Where the memory of the queues a rank reads lives: on that rank's NUMA
//! node(s).
//!
//! A queue's segment is made by its producer, but it is the consumer that
//! polls it and copies every payload out of it, so its pages belong near
//! the consumer. The consumer binds its mapping of each inbound segment
//! (`mbind`, `MPOL_BIND`) as soon as it maps it, before it accepts the
//! queue and so before the producer writes a packet. For a memory file the
//! policy belongs to the file, not to the mapping: pages the producer
//! touches first are allocated on the consumer's nodes all the same. The
//! first page, into which the producer wrote the segment's layout before
//! handing it over, stays where it was allocated.
//!
//! The nodes: `OXMPI_NUMA_NODES` (set by oxrun for a rank it bound, from
//! hwloc; empty is the same as unset); else the nodes whose CPUs the rank may run on, from the kernel
//! (`/sys/devices/system/node`, no hwloc needed), when they are fewer than
//! the machine's nodes with memory. Otherwise, on a machine with one node,
//! for an unbound rank, or without NUMA information, placement is left to
//! first touch. The choice is said once under `OXMPI_VERBOSE=1`, and a
//! kernel that refuses the binding (no NUMA support) makes it first touch,
//! said once too, never an error.

use oxmpi_adi::{Error, ErrorClass, Result};
use std::collections::BTreeSet;
use std::fmt;

/// Environment variable: the NUMA nodes local to the rank's CPUs (set by
/// oxrun for a rank it bound), a list like `0-1,4`.
pub const NUMA_NODES_ENV: &str = "OXMPI_NUMA_NODES";

/// Where the kernel lists the NUMA nodes.
const NODE_DIR: &str = "/sys/devices/system/node";

/// Where this rank's inbound queues are placed.
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

    /// The kernel refused to bind `what` (no NUMA support, a node without
    /// memory): placement is first touch from now on, and says why.
    pub(crate) fn refused(&mut self, what: &str, error: &std::io::Error) {
        if let Placement::Bind { nodes, .. } = self {
            *self = Placement::FirstTouch(format!(
                "the kernel refused to bind {what} to NUMA node(s) {}: {error}",
                format_list(nodes)
            ));
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
