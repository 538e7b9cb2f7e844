//! Where the ranks run: the machine's cores and NUMA nodes (from hwloc),
//! the object each rank is mapped to and bound to, and the binding itself.
//!
//! It owns placement on this host: reading the topology, choosing each
//! rank's cpuset, binding a rank's process before it execs, and the
//! variables that tell a rank what it got. It must not know PMI, MPI, or
//! how ranks are started: the launcher asks it for a [`Plan`] and, in each
//! rank's child process, calls [`Binding::apply`].
//!
//! hwloc is used through the `hwloc2` crate's safe API. That crate (2.2)
//! cannot list hwloc 2's NUMA nodes (it maps their virtual depth to the
//! bridges'), so NUMA nodes are found through the nodeset of each core:
//! cores with the same nodeset form one NUMA domain, whose cpuset is the
//! union of theirs (the cpuset hwloc gives the NUMA node itself).
//!
//! Numbers: a core is named by hwloc's logical index (`lstopo`'s `L#`); a
//! cpuset holds the operating system's CPU numbers and NUMA nodes their OS
//! numbers (what `taskset`, `numactl` and `/proc/self/status` show).

use hwloc2::{CpuBindFlags, ObjectType, Topology};
use std::collections::BTreeSet;

/// Variable that tells a bound rank its CPUs: a list such as `0-1,4`, in
/// the format of `Cpus_allowed_list` in `/proc/self/status`.
pub const CPUSET_ENV: &str = "OXMPI_CPUSET";

/// Variable that tells a bound rank the NUMA nodes local to its CPUs, in
/// the same list format, so that the library can place the memory the
/// rank reads there.
pub const NUMA_ENV: &str = "OXMPI_NUMA_NODES";

/// What each rank is bound to (`--bind-to`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BindTo {
    /// One core (all its hardware threads).
    Core,
    /// The cores of one NUMA node.
    Numa,
    /// Nothing: the rank runs wherever the kernel puts it.
    None,
}

impl BindTo {
    /// Reads `core`, `numa` or `none`.
    pub fn parse(v: &str) -> Result<BindTo, String> {
        match v {
            "core" => Ok(BindTo::Core),
            "numa" => Ok(BindTo::Numa),
            "none" => Ok(BindTo::None),
            _ => Err(format!("--bind-to {v:?}: expected core, numa or none")),
        }
    }
}

/// How ranks are spread over the machine (`--map-by`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MapBy {
    /// Consecutive ranks on consecutive cores.
    #[default]
    Core,
    /// Round-robin over NUMA nodes, each node's cores in order.
    Numa,
}

impl MapBy {
    /// Reads `core` or `numa`.
    pub fn parse(v: &str) -> Result<MapBy, String> {
        match v {
            "core" => Ok(MapBy::Core),
            "numa" => Ok(MapBy::Numa),
            _ => Err(format!("--map-by {v:?}: expected core or numa")),
        }
    }
}

/// What the command line asks of placement.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Request {
    /// `None`: the default, [`BindTo::Core`] unless the job has more ranks
    /// than the machine has cores, then [`BindTo::None`].
    pub bind_to: Option<BindTo>,
    /// How ranks are spread.
    pub map_by: MapBy,
    /// Print each rank's binding (`--report-bindings`).
    pub report: bool,
}

/// A core of the machine, as placement needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Core {
    /// hwloc's logical index.
    pub index: u32,
    /// OS numbers of its CPUs (hardware threads).
    pub cpus: Vec<u32>,
    /// OS numbers of the NUMA nodes local to it.
    pub nodes: Vec<u32>,
}

/// Where one rank is bound.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Binding {
    /// The object, as reports name it: `core 1`, `NUMA node 0`.
    pub object: String,
    /// OS numbers of the CPUs, ascending.
    pub cpus: Vec<u32>,
    /// OS numbers of the NUMA nodes local to them, ascending.
    pub nodes: Vec<u32>,
    /// The CPUs as the kernel's affinity mask, built before the rank's
    /// process is forked so that [`Binding::apply`] need not allocate.
    mask: Vec<libc::c_ulong>,
}

impl Binding {
    fn new(object: String, cpus: BTreeSet<u32>, nodes: BTreeSet<u32>) -> Binding {
        let bits = libc::c_ulong::BITS;
        let mut mask = vec![0; cpus.last().map_or(1, |&c| (c / bits + 1) as usize)];
        for &cpu in &cpus {
            mask[(cpu / bits) as usize] |= 1 << (cpu % bits);
        }
        Binding {
            object,
            cpus: cpus.into_iter().collect(),
            nodes: nodes.into_iter().collect(),
            mask,
        }
    }

    /// The variables that tell the rank its binding ([`CPUSET_ENV`],
    /// [`NUMA_ENV`]).
    pub fn env(&self) -> [(&'static str, String); 2] {
        [
            (CPUSET_ENV, list(&self.cpus)),
            (NUMA_ENV, list(&self.nodes)),
        ]
    }

    /// The binding as `--report-bindings` prints it:
    /// `core 1 (cpuset 0x00000002)`.
    pub fn describe(&self) -> String {
        format!("{} (cpuset {})", self.object, hex_mask(&self.cpus))
    }

    /// Binds the calling process (all of its threads to come) to the
    /// binding's CPUs. Async-signal-safe — one system call, no allocation —
    /// so it may run between fork and exec.
    pub fn apply(&self) -> std::io::Result<()> {
        // SAFETY: the kernel reads `size_of_val(mask)` bytes from the
        // pointer, which the vector holds; a CPU mask of any length in
        // whole `unsigned long`s is what the system call takes (the
        // `cpu_set_t` type is only its default length).
        let rc = unsafe {
            libc::sched_setaffinity(
                0,
                std::mem::size_of_val(self.mask.as_slice()),
                self.mask.as_ptr().cast::<libc::cpu_set_t>(),
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }
}

/// The placement of one job.
#[derive(Debug)]
pub struct Plan {
    /// Each rank's binding; `None` for a rank that is not bound.
    pub bindings: Vec<Option<Binding>>,
    /// Why ranks are not bound, for the report.
    pub unbound: String,
    /// What the launcher must say once, whether or not bindings are
    /// reported: why no rank is bound when binding was wanted.
    pub warning: Option<String>,
}

impl Plan {
    /// The line `--report-bindings` prints for `rank`.
    pub fn report(&self, rank: usize) -> String {
        match &self.bindings[rank] {
            Some(b) => format!("oxrun: rank {rank} bound to {}", b.describe()),
            None => format!("oxrun: rank {rank} not bound ({})", self.unbound),
        }
    }
}

/// Plans where `ranks` ranks run on this machine. hwloc is not consulted
/// for `--bind-to none`; when it cannot describe the machine, no rank is
/// bound and the plan says why.
pub fn plan(request: &Request, ranks: usize) -> Plan {
    if request.bind_to == Some(BindTo::None) {
        return unbound(ranks, "--bind-to none".to_owned(), None);
    }
    match machine_cores() {
        Ok(cores) => place(&cores, request, ranks),
        Err(why) => unbound(
            ranks,
            why.clone(),
            Some(format!("oxrun: binding no rank: {why}")),
        ),
    }
}

fn unbound(ranks: usize, why: String, warning: Option<String>) -> Plan {
    Plan {
        bindings: vec![None; ranks],
        unbound: why,
        warning,
    }
}

/// The machine's cores that oxrun may use, in hwloc's logical order, or
/// why they cannot be known. A core holds only the CPUs in oxrun's own
/// affinity (`taskset -c 2-5 oxrun ...` places the ranks on CPUs 2-5).
fn machine_cores() -> Result<Vec<Core>, String> {
    let topology = Topology::new().ok_or_else(|| {
        format!(
            "hwloc could not load this machine's topology ({})",
            std::io::Error::last_os_error()
        )
    })?;
    let own: Option<BTreeSet<u32>> = topology
        .get_cpubind(CpuBindFlags::CPUBIND_PROCESS)
        .map(|set| set.into_iter().collect());
    let objects = topology
        .objects_with_type(&ObjectType::Core)
        .map_err(|e| format!("hwloc found no cores on this machine ({e:?})"))?;
    let cores: Vec<Core> = objects
        .iter()
        .filter_map(|o| {
            let cpus: Vec<u32> = o
                .cpuset()?
                .into_iter()
                .filter(|cpu| own.as_ref().is_none_or(|own| own.contains(cpu)))
                .collect();
            (!cpus.is_empty()).then(|| Core {
                index: o.logical_index(),
                cpus,
                nodes: o
                    .nodeset()
                    .map(|n| n.into_iter().collect())
                    .unwrap_or_default(),
            })
        })
        .collect();
    if cores.is_empty() {
        return Err("hwloc found no cores with CPUs oxrun may run on".to_owned());
    }
    Ok(cores)
}

/// Places `ranks` ranks on `cores` as `request` says.
pub fn place(cores: &[Core], request: &Request, ranks: usize) -> Plan {
    let oversubscribed = ranks > cores.len();
    let bind_to = request.bind_to.unwrap_or(if oversubscribed {
        BindTo::None
    } else {
        BindTo::Core
    });
    if bind_to == BindTo::None {
        let why = if request.bind_to.is_some() {
            "--bind-to none".to_owned()
        } else {
            format!(
                "{ranks} ranks on {}: oversubscribed ranks are not bound by default",
                count(cores.len(), "core")
            )
        };
        return unbound(ranks, why, None);
    }
    // NUMA domains: cores with the same local NUMA nodes, in core order.
    let mut domains: Vec<(&[u32], Vec<&Core>)> = Vec::new();
    for core in cores {
        match domains.iter_mut().find(|(nodes, _)| *nodes == core.nodes) {
            Some((_, members)) => members.push(core),
            None => domains.push((&core.nodes, vec![core])),
        }
    }
    let bindings = (0..ranks)
        .map(|rank| {
            let (domain, core) = match request.map_by {
                MapBy::Core => {
                    let core = &cores[rank % cores.len()];
                    let domain = domains
                        .iter()
                        .position(|(nodes, _)| *nodes == core.nodes)
                        .expect("every core is in its domain");
                    (domain, core)
                }
                MapBy::Numa => {
                    let domain = rank % domains.len();
                    let members = &domains[domain].1;
                    (domain, members[rank / domains.len() % members.len()])
                }
            };
            let nodes: BTreeSet<u32> = core.nodes.iter().copied().collect();
            Some(match bind_to {
                BindTo::Core => Binding::new(
                    format!("core {}", core.index),
                    core.cpus.iter().copied().collect(),
                    nodes,
                ),
                _ => Binding::new(
                    format!(
                        "NUMA node{} {}",
                        if nodes.len() == 1 { "" } else { "s" },
                        list(&core.nodes)
                    ),
                    domains[domain]
                        .1
                        .iter()
                        .flat_map(|c| c.cpus.iter().copied())
                        .collect(),
                    nodes,
                ),
            })
        })
        .collect();
    let warning = (oversubscribed && request.bind_to.is_some()).then(|| {
        format!(
            "oxrun: {ranks} ranks bound to {}: ranks share cores",
            count(cores.len(), "core")
        )
    });
    Plan {
        bindings,
        unbound: String::new(),
        warning,
    }
}

/// `1 core`, `2 cores`.
fn count(n: usize, what: &str) -> String {
    format!("{n} {what}{}", if n == 1 { "" } else { "s" })
}

/// Numbers as a list of ranges, ascending: `0-3,8,10-11` (the kernel's
/// format for CPU lists).
pub fn list(numbers: &[u32]) -> String {
    let mut sorted = numbers.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut parts = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let mut j = i;
        while j + 1 < sorted.len() && sorted[j + 1] == sorted[j] + 1 {
            j += 1;
        }
        parts.push(if i == j {
            sorted[i].to_string()
        } else {
            format!("{}-{}", sorted[i], sorted[j])
        });
        i = j + 1;
    }
    parts.join(",")
}

/// CPUs as hwloc prints a cpuset: 32-bit words in hex, the highest first,
/// separated by commas (`0x00000002`, `0x00000001,0x00000003`).
pub fn hex_mask(cpus: &[u32]) -> String {
    let words = cpus.iter().max().map_or(1, |&c| c / 32 + 1) as usize;
    let mut mask = vec![0u32; words];
    for &cpu in cpus {
        mask[(cpu / 32) as usize] |= 1 << (cpu % 32);
    }
    mask.iter()
        .rev()
        .map(|w| format!("0x{w:08x}"))
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `per_node` cores of one CPU each on each of `nodes` NUMA nodes.
    fn machine(nodes: u32, per_node: u32) -> Vec<Core> {
        (0..nodes * per_node)
            .map(|i| Core {
                index: i,
                cpus: vec![i],
                nodes: vec![i / per_node],
            })
            .collect()
    }

    fn request(bind_to: Option<BindTo>, map_by: MapBy) -> Request {
        Request {
            bind_to,
            map_by,
            report: false,
        }
    }

    fn objects(plan: &Plan) -> Vec<String> {
        plan.bindings
            .iter()
            .map(|b| b.as_ref().map_or("-".to_owned(), |b| b.object.clone()))
            .collect()
    }

    #[test]
    fn by_default_ranks_bind_to_consecutive_cores() {
        let plan = place(&machine(1, 2), &Request::default(), 2);
        assert_eq!(objects(&plan), ["core 0", "core 1"]);
        assert_eq!(
            plan.report(1),
            "oxrun: rank 1 bound to core 1 (cpuset 0x00000002)"
        );
        assert_eq!(
            plan.bindings[1].as_ref().unwrap().env(),
            [(CPUSET_ENV, "1".to_owned()), (NUMA_ENV, "0".to_owned())]
        );
        assert!(plan.warning.is_none());
    }

    #[test]
    fn oversubscribed_ranks_are_not_bound_unless_asked() {
        let plan = place(&machine(1, 2), &Request::default(), 3);
        assert_eq!(objects(&plan), ["-", "-", "-"]);
        assert!(
            plan.report(2).contains("3 ranks on 2 cores"),
            "{}",
            plan.report(2)
        );
        assert!(plan.warning.is_none());
        let plan = place(&machine(1, 2), &request(Some(BindTo::Core), MapBy::Core), 3);
        assert_eq!(objects(&plan), ["core 0", "core 1", "core 0"]);
        assert!(plan.warning.unwrap().contains("share cores"));
    }

    #[test]
    fn map_by_numa_goes_round_robin_over_nodes() {
        let cores = machine(2, 2);
        let plan = place(&cores, &request(None, MapBy::Numa), 4);
        assert_eq!(objects(&plan), ["core 0", "core 2", "core 1", "core 3"]);
        let plan = place(&cores, &request(None, MapBy::Core), 4);
        assert_eq!(objects(&plan), ["core 0", "core 1", "core 2", "core 3"]);
        let plan = place(&cores, &request(Some(BindTo::Numa), MapBy::Numa), 3);
        assert_eq!(
            objects(&plan),
            ["NUMA node 0", "NUMA node 1", "NUMA node 0"]
        );
        let b = plan.bindings[1].as_ref().unwrap();
        assert_eq!(
            (b.cpus.as_slice(), b.nodes.as_slice()),
            (&[2, 3][..], &[1][..])
        );
        assert_eq!(b.describe(), "NUMA node 1 (cpuset 0x0000000c)");
    }

    #[test]
    fn each_bound_rank_is_told_the_nodes_of_its_cpus() {
        // What its library binds the shared memory it reads to: queues,
        // window parts, collectives' slots (`oxmpi_shm`'s placement).
        let told = |plan: &Plan| -> Vec<String> {
            plan.bindings
                .iter()
                .map(|b| {
                    let env = b.as_ref().expect("every rank is bound").env();
                    env.iter()
                        .find(|(name, _)| *name == NUMA_ENV)
                        .map_or("-".to_owned(), |(_, nodes)| nodes.clone())
                })
                .collect()
        };
        let cores = machine(2, 2);
        let by_numa = place(&cores, &request(Some(BindTo::Core), MapBy::Numa), 4);
        assert_eq!(told(&by_numa), ["0", "1", "0", "1"]);
        let by_core = place(&cores, &request(Some(BindTo::Core), MapBy::Core), 4);
        assert_eq!(told(&by_core), ["0", "0", "1", "1"]);
        // A core with memory on two nodes names both.
        let mut two = machine(1, 2);
        two[1].nodes = vec![0, 1];
        let plan = place(&two, &request(Some(BindTo::Core), MapBy::Core), 2);
        assert_eq!(told(&plan), ["0", "0-1"]);
    }

    #[test]
    fn bind_to_numa_on_one_node_takes_every_core() {
        let plan = place(&machine(1, 2), &request(Some(BindTo::Numa), MapBy::Core), 2);
        assert_eq!(
            plan.report(0),
            "oxrun: rank 0 bound to NUMA node 0 (cpuset 0x00000003)"
        );
        assert_eq!(plan.bindings[0], plan.bindings[1]);
    }

    #[test]
    fn bind_to_none_binds_nothing() {
        let plan = plan(&request(Some(BindTo::None), MapBy::Core), 2);
        assert_eq!(objects(&plan), ["-", "-"]);
        assert_eq!(plan.report(0), "oxrun: rank 0 not bound (--bind-to none)");
    }

    #[test]
    fn hardware_threads_of_a_core_stay_together() {
        let cores = vec![
            Core {
                index: 0,
                cpus: vec![0, 64],
                nodes: vec![0],
            },
            Core {
                index: 1,
                cpus: vec![1, 65],
                nodes: vec![0],
            },
        ];
        let plan = place(&cores, &Request::default(), 2);
        let b = plan.bindings[1].as_ref().unwrap();
        assert_eq!(b.env()[0].1, "1,65");
        assert_eq!(b.mask, [2, 2]);
        assert_eq!(
            b.describe(),
            "core 1 (cpuset 0x00000002,0x00000000,0x00000002)"
        );
    }

    #[test]
    fn lists_and_masks() {
        assert_eq!(list(&[3, 0, 1, 2, 8, 10, 11]), "0-3,8,10-11");
        assert_eq!(list(&[]), "");
        assert_eq!(hex_mask(&[1]), "0x00000002");
        assert_eq!(hex_mask(&[0, 33]), "0x00000002,0x00000001");
        assert_eq!(hex_mask(&[]), "0x00000000");
    }
}
