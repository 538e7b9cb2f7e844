//! Where the two processes of the shared-memory latency floor run: each
//! on a core of its own, the first two cores of the CPUs oxbench may use,
//! as `oxrun` binds the two ranks of the MPI benchmarks it is compared
//! with (by default, each rank to one core, in hwloc's core order). A
//! floor left to wander between CPUs would read higher than the pinned
//! ranks' figures it is the floor of (0.15 µs against 0.13 µs pinned on
//! the development VM), flattering their ratio to it.
//!
//! The cores come from sysfs: a CPU's core is its
//! `topology/core_cpus_list` (or, on older kernels,
//! `thread_siblings_list`), restricted to the CPUs in this process's
//! `Cpus_allowed_list`, and cores are taken in the order of their first
//! CPU (hwloc's logical order on the machines oxmpi runs on). The
//! binding itself is one `sched_setaffinity` call, the only unsafe code
//! of this module.

use std::collections::BTreeSet;

/// The CPUs of each of the two floor processes, or why they run
/// unbound.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FloorPlacement {
    /// The parent's core's CPUs and the child's.
    Bound {
        /// The first core's CPUs (the parent's).
        parent: Vec<u32>,
        /// The second core's (the child's).
        child: Vec<u32>,
    },
    /// Not bound, as oxrun binds no rank where the ranks outnumber the
    /// cores: the reason.
    Unbound(String),
}

impl FloorPlacement {
    /// The placement on this machine, for this process's CPUs.
    pub fn here() -> FloorPlacement {
        let allowed = match allowed_cpus() {
            Ok(cpus) => cpus,
            Err(why) => return FloorPlacement::Unbound(why),
        };
        plan(&allowed, |cpu| core_of(cpu).ok())
    }

    /// The note the floor's report carries about it.
    pub fn describe(&self) -> String {
        match self {
            FloorPlacement::Bound { parent, child } => format!(
                "each process bound to a core of its own, as oxrun binds 2 ranks: CPUs {} and {}",
                cpu_list(parent),
                cpu_list(child)
            ),
            FloorPlacement::Unbound(why) => format!("processes not bound: {why}"),
        }
    }
}

/// The placement of two processes over the `allowed` CPUs, `core` giving
/// each CPU's core (its CPUs, this one among them); a CPU whose core is
/// unknown is a core of its own.
pub fn plan(
    allowed: &BTreeSet<u32>,
    core: impl Fn(u32) -> Option<BTreeSet<u32>>,
) -> FloorPlacement {
    let mut cores: Vec<Vec<u32>> = Vec::new();
    let mut placed = BTreeSet::new();
    for &cpu in allowed {
        if placed.contains(&cpu) {
            continue;
        }
        let mut members = core(cpu).unwrap_or_default();
        members.insert(cpu);
        let members: Vec<u32> = members
            .into_iter()
            .filter(|c| allowed.contains(c) && !placed.contains(c))
            .collect();
        placed.extend(members.iter().copied());
        cores.push(members);
        if cores.len() == 2 {
            break;
        }
    }
    match <[Vec<u32>; 2]>::try_from(cores) {
        Ok([parent, child]) => FloorPlacement::Bound { parent, child },
        Err(cores) => FloorPlacement::Unbound(format!(
            "{} core{} allowed (CPUs {}), fewer than the 2 processes, which oxrun would not bind \
             either",
            cores.len(),
            if cores.len() == 1 { "" } else { "s" },
            cpu_list(&allowed.iter().copied().collect::<Vec<_>>())
        )),
    }
}

/// Reads a CPU list such as `0-3,8,10-11` (the kernel's list format).
pub fn parse_cpu_list(text: &str) -> Result<BTreeSet<u32>, String> {
    let mut cpus = BTreeSet::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        let bad = || format!("bad CPU list {text:?}");
        let (first, last): (u32, u32) = match part.split_once('-') {
            Some((a, b)) => (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?),
            None => {
                let cpu = part.parse().map_err(|_| bad())?;
                (cpu, cpu)
            }
        };
        if first > last {
            return Err(bad());
        }
        cpus.extend(first..=last);
    }
    Ok(cpus)
}

/// A CPU list in the kernel's format, runs of consecutive CPUs shortened.
fn cpu_list(cpus: &[u32]) -> String {
    let mut runs: Vec<(u32, u32)> = Vec::new();
    for &cpu in cpus {
        match runs.last_mut() {
            Some((_, last)) if *last + 1 == cpu => *last = cpu,
            _ => runs.push((cpu, cpu)),
        }
    }
    runs.iter()
        .map(|&(a, b)| {
            if a == b {
                a.to_string()
            } else {
                format!("{a}-{b}")
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// The CPUs this process may run on (`Cpus_allowed_list`).
fn allowed_cpus() -> Result<BTreeSet<u32>, String> {
    let status = std::fs::read_to_string("/proc/self/status")
        .map_err(|e| format!("reading /proc/self/status: {e}"))?;
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .ok_or("/proc/self/status has no Cpus_allowed_list")?;
    parse_cpu_list(list)
}

/// The CPUs of `cpu`'s core, from sysfs.
fn core_of(cpu: u32) -> Result<BTreeSet<u32>, String> {
    let dir = format!("/sys/devices/system/cpu/cpu{cpu}/topology");
    let text = std::fs::read_to_string(format!("{dir}/core_cpus_list"))
        .or_else(|_| std::fs::read_to_string(format!("{dir}/thread_siblings_list")))
        .map_err(|e| format!("reading {dir}: {e}"))?;
    parse_cpu_list(&text)
}

/// Binds process `pid` (0: this one; its one thread, or the thread
/// `pid` names) to `cpus`.
#[allow(unsafe_code)]
pub fn bind(pid: u32, cpus: &[u32]) -> Result<(), String> {
    const BITS: usize = libc::c_ulong::BITS as usize;
    let words = cpus.iter().max().map_or(1, |&m| m as usize / BITS + 1);
    let mut mask: Vec<libc::c_ulong> = vec![0; words];
    for &cpu in cpus {
        mask[cpu as usize / BITS] |= 1 << (cpu as usize % BITS);
    }
    let pid = libc::pid_t::try_from(pid).map_err(|_| format!("pid {pid} out of range"))?;
    // SAFETY: the kernel reads `size_of_val(mask)` bytes from the pointer,
    // which the vector holds; a mask of any length in whole `unsigned
    // long`s is what the system call takes (`cpu_set_t` is only its
    // default length).
    let rc = unsafe {
        libc::sched_setaffinity(
            pid,
            std::mem::size_of_val(mask.as_slice()),
            mask.as_ptr().cast::<libc::cpu_set_t>(),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(format!(
            "binding process {pid} to CPUs {}: {}",
            cpu_list(cpus),
            std::io::Error::last_os_error()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_are_read_and_written() {
        assert_eq!(
            parse_cpu_list("0-2,8,10-11\n").unwrap(),
            BTreeSet::from([0, 1, 2, 8, 10, 11])
        );
        assert!(parse_cpu_list("3-1").is_err());
        assert!(parse_cpu_list("a").is_err());
        assert_eq!(cpu_list(&[0, 1, 2, 8, 10, 11]), "0-2,8,10-11");
    }

    #[test]
    fn the_two_processes_get_the_first_two_cores() {
        // Two hardware threads per core: CPUs n and n + 4 share a core.
        let smt = |cpu: u32| Some(BTreeSet::from([cpu % 4, cpu % 4 + 4]));
        let all: BTreeSet<u32> = (0..8).collect();
        assert_eq!(
            plan(&all, smt),
            FloorPlacement::Bound {
                parent: vec![0, 4],
                child: vec![1, 5]
            }
        );
        // Only the CPUs allowed: never a sibling thread of the same core.
        let some = BTreeSet::from([2, 6, 7]);
        assert_eq!(
            plan(&some, smt),
            FloorPlacement::Bound {
                parent: vec![2, 6],
                child: vec![7]
            }
        );
        let one_core = BTreeSet::from([1, 5]);
        let FloorPlacement::Unbound(why) = plan(&one_core, smt) else {
            panic!("two processes bound to one core");
        };
        assert!(why.contains("1 core allowed (CPUs 1,5)"), "{why}");
        assert!(matches!(
            plan(&BTreeSet::from([0, 1]), |_| None),
            FloorPlacement::Bound { .. }
        ));
    }
}
