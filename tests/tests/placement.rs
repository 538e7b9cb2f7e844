//! Where the shared memory a rank reads is placed: on the rank's NUMA
//! node(s). A job bound by oxrun (`--bind-to numa`, so every rank gets
//! `OXMPI_NUMA_NODES` on any machine with a topology) must have each of
//! its inbound segments bound (`MPOL_BIND`) to exactly those nodes, as the
//! kernel shows in `/proc/PID/numa_maps`; a job whose ranks 1 and 2 are
//! given node 0 and whose rank 0 is given nothing (on a machine with one
//! node, or unbound: first touch) must have the queues ranks 1 and 2
//! consume, their window parts and their collectives' slots and staging
//! areas bound to node 0 (and the queues on it) and rank 0's left alone,
//! page by page (`placement_suite`), and each process say so once; and a
//! job
//! without topology information (hwloc disabled, nothing bound) runs and
//! says where its memory went.

use oxmpi_jobs::{descendants, rank_of, run, Binaries, Job};
use std::process::Command;
use std::time::{Duration, Instant};

fn bins() -> Binaries {
    Binaries::new(env!("CARGO_BIN_EXE_p2p_suite"))
}

/// What a process says of its placement under `OXMPI_VERBOSE=1`.
const SAID: &str = ": shm: the shared memory this process reads (";

/// `oxrun OPTIONS -n 2 ring LAPS` over shared memory, placement logged.
fn ring(options: &[&str], laps: &str) -> Command {
    let mut c = Command::new(bins().oxrun());
    c.args(options)
        .args(["-n", "2"])
        .arg(bins().example("ring"))
        .arg(laps)
        .env("OXMPI_TRANSPORTS", "shm")
        .env("OXMPI_VERBOSE", "1");
    c
}

/// The value of `name` in the environment of process `pid`.
fn environment_of(pid: u32, name: &str) -> Option<String> {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    environ.split(|&b| b == 0).find_map(|entry| {
        let entry = std::str::from_utf8(entry).ok()?;
        Some(entry.strip_prefix(name)?.strip_prefix('=')?.to_owned())
    })
}

/// The `numa_maps` lines of `pid`'s mappings of segments whose consumer
/// is `rank` (labelled `/memfd:oxmpi-shm-PID-PRODUCER-to-CONSUMER`).
fn inbound_segments(pid: u32, rank: usize) -> Vec<String> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/numa_maps")).unwrap_or_default();
    maps.lines()
        .filter(|line| {
            line.split_whitespace().any(|word| {
                word.strip_prefix("file=/memfd:oxmpi-shm-")
                    .and_then(|label| label.rsplit_once("-to-"))
                    // The label ends in `\040(deleted)`: the file has no name.
                    .and_then(|(_, consumer)| consumer.split('\\').next())
                    .is_some_and(|consumer| consumer == rank.to_string())
            })
        })
        .map(str::to_owned)
        .collect()
}

#[test]
fn inbound_queues_are_bound_to_the_readers_numa_nodes() {
    let job = Job::start(
        ring(&["--bind-to", "numa"], "100000000"),
        Duration::from_secs(60),
    );
    let start = Instant::now();
    let found = loop {
        let ranks: Vec<(usize, u32)> = descendants(job.pid())
            .into_iter()
            .filter_map(|pid| Some((rank_of(pid)?, pid)))
            .collect();
        let found: Vec<(usize, String, Vec<String>)> = ranks
            .iter()
            .filter_map(|&(rank, pid)| {
                let nodes = environment_of(pid, "OXMPI_NUMA_NODES")?;
                let lines = inbound_segments(pid, rank);
                (!lines.is_empty()).then_some((rank, nodes, lines))
            })
            .collect();
        if found.len() == 2 {
            break found;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the ranks did not map their inbound queues within 30 s: {ranks:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    drop(job);
    for (rank, nodes, lines) in found {
        for line in lines {
            assert!(
                line.contains(&format!(" bind:{nodes} ")),
                "rank {rank} (OXMPI_NUMA_NODES={nodes}) maps an inbound queue not bound there: {line}"
            );
        }
    }
}

#[test]
fn without_a_topology_the_job_runs_and_says_where_its_queues_are() {
    let mut c = ring(&[], "20");
    c.env("HWLOC_COMPONENTS", "stop");
    let out = run(c, Duration::from_secs(60));
    out.assert_success();
    let said: Vec<&str> = out.stderr.lines().filter(|l| l.contains(SAID)).collect();
    assert_eq!(said.len(), 2, "{}", out.stderr);
    assert!(
        !out.stderr.contains("OXMPI_NUMA_NODES)"),
        "an unbound rank used OXMPI_NUMA_NODES:\n{}",
        out.stderr
    );
}

#[test]
fn queues_window_parts_and_collective_slots_are_bound_to_their_owners_nodes() {
    // Unbound ranks keep the OXMPI_NUMA_NODES their part's `-x` gives.
    let mut c = Command::new(bins().oxrun());
    c.args(["--bind-to", "none", "-n", "1"])
        .arg(bins().bin("placement_suite"))
        .args([":", "-n", "2", "-x", "OXMPI_NUMA_NODES=0"])
        .arg(bins().bin("placement_suite"))
        .env("OXMPI_TRANSPORTS", "shm")
        .env("OXMPI_VERBOSE", "1")
        .env_remove("OXMPI_NUMA_NODES");
    let out = run(c, Duration::from_secs(60));
    out.assert_success();
    let said: Vec<&str> = out.stderr.lines().filter(|l| l.contains(SAID)).collect();
    // Once per process: `oxmpi[PID]: ...`.
    let mut sayers: Vec<&str> = said
        .iter()
        .filter_map(|l| l.split_once(']').map(|(pid, _)| pid))
        .collect();
    sayers.sort_unstable();
    sayers.dedup();
    assert!(
        said.len() == 3 && sayers.len() == 3,
        "the 3 processes did not each say once where their memory goes:\n{}",
        out.stderr
    );
    assert_eq!(
        said.iter()
            .filter(|l| l.ends_with(" is bound to NUMA node 0 (OXMPI_NUMA_NODES)"))
            .count(),
        2,
        "ranks 1 and 2 did not say they bind to node 0:\n{}",
        out.stderr
    );
    assert!(
        said.iter()
            .any(|l| l.contains(" is placed by first touch: ")),
        "rank 0 did not say its memory is placed by first touch:\n{}",
        out.stderr
    );
}
