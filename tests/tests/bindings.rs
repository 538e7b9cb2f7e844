//! What `oxrun --report-bindings` says of each rank's binding against the
//! CPU affinity the rank really has (`Cpus_allowed_list` in its
//! `/proc/self/status`, printed by `p2p_suite affinity`): with `--bind-to
//! core` each rank runs on exactly the CPUs of the cpuset reported for
//! it, and with `--bind-to none` each is reported unbound and keeps the
//! launcher's affinity.

use oxmpi_jobs::{run, Binaries};
use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

/// Ranks of the jobs: one per core on the 2-core machines the tests run
/// on (more would share cores).
const RANKS: usize = 2;

/// The CPUs of a list like `0-2,5` (`Cpus_allowed_list`).
fn cpu_list(list: &str) -> BTreeSet<u32> {
    list.trim()
        .split(',')
        .flat_map(|range| {
            let (first, last) = range.split_once('-').unwrap_or((range, range));
            let parse = |n: &str| {
                n.parse::<u32>()
                    .unwrap_or_else(|_| panic!("a bad CPU list {list:?}"))
            };
            parse(first)..=parse(last)
        })
        .collect()
}

/// The CPUs of a mask like `0x00000000,0x00000005` (oxrun's cpuset: 32-bit
/// words, the highest first).
fn cpu_mask(mask: &str) -> BTreeSet<u32> {
    mask.split(',')
        .rev()
        .enumerate()
        .flat_map(|(word, hex)| {
            let bits = u32::from_str_radix(hex.trim_start_matches("0x"), 16)
                .unwrap_or_else(|_| panic!("a bad cpuset {mask:?}"));
            (0..32)
                .filter(move |bit| bits & (1 << bit) != 0)
                .map(move |bit| word as u32 * 32 + bit)
        })
        .collect()
}

/// This process's CPU affinity, which oxrun and an unbound rank inherit.
fn own_cpus() -> BTreeSet<u32> {
    let status = std::fs::read_to_string("/proc/self/status").expect("reading /proc/self/status");
    let list = status
        .lines()
        .find_map(|line| line.strip_prefix("Cpus_allowed_list:"))
        .expect("Cpus_allowed_list in /proc/self/status");
    cpu_list(list)
}

/// Runs `p2p_suite affinity` with `--bind-to bind_to --report-bindings`;
/// returns, for each rank, what oxrun reported (`Some(cpus)` bound,
/// `None` not bound) and the CPUs the rank has.
fn reported_and_real(bind_to: &str) -> Vec<(Option<BTreeSet<u32>>, BTreeSet<u32>)> {
    let bins = Binaries::new(env!("CARGO_BIN_EXE_p2p_suite"));
    let mut c = Command::new(bins.oxrun());
    c.args(["--bind-to", bind_to, "--report-bindings", "-n"])
        .arg(RANKS.to_string())
        .arg(bins.bin("p2p_suite"))
        .arg("affinity");
    let out = run(c, Duration::from_secs(60));
    out.assert_success();
    (0..RANKS)
        .map(|rank| {
            let report = out
                .stderr
                .lines()
                .find_map(|line| line.strip_prefix(&format!("oxrun: rank {rank} ")))
                .unwrap_or_else(|| panic!("no report for rank {rank}:\n{}", out.stderr));
            let reported = if report.starts_with("not bound") {
                None
            } else {
                let mask = report
                    .split_once("(cpuset ")
                    .and_then(|(_, rest)| rest.strip_suffix(')'))
                    .unwrap_or_else(|| panic!("an unreadable report for rank {rank}: {report}"));
                Some(cpu_mask(mask))
            };
            let real = out
                .stdout
                .lines()
                .find_map(|line| line.strip_prefix(&format!("rank {rank}: Cpus_allowed_list:")))
                .unwrap_or_else(|| panic!("rank {rank} did not print its CPUs:\n{}", out.stdout));
            (reported, cpu_list(real))
        })
        .collect()
}

#[test]
fn bound_to_a_core_each_rank_runs_on_the_cpus_reported() {
    for (rank, (reported, real)) in reported_and_real("core").iter().enumerate() {
        let reported = reported
            .as_ref()
            .unwrap_or_else(|| panic!("rank {rank} was not bound to a core"));
        assert!(!reported.is_empty(), "rank {rank}: an empty cpuset");
        assert_eq!(reported, real, "rank {rank}: reported against real CPUs");
    }
}

#[test]
fn unbound_each_rank_keeps_the_launchers_cpus() {
    let mine = own_cpus();
    for (rank, (reported, real)) in reported_and_real("none").iter().enumerate() {
        assert_eq!(reported, &None, "rank {rank} was reported bound");
        assert_eq!(real, &mine, "rank {rank}: CPUs of an unbound rank");
    }
}

#[test]
fn cpu_lists_and_masks_read_as_sets() {
    assert_eq!(cpu_list("0-2,5\n"), BTreeSet::from([0, 1, 2, 5]));
    assert_eq!(
        cpu_mask("0x00000001,0x00000005"),
        BTreeSet::from([0, 2, 32])
    );
}
