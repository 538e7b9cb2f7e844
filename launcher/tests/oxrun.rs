//! The launcher on its own: programs that never use PMI, tagged output,
//! `-x` environment passing, bad command lines, MPMD parts (rank numbers,
//! the appnum each rank asks for over PMI, each part's own environment),
//! and placement (`--report-bindings` checked against the CPUs each rank
//! finds it may run on). Jobs that use MPI are in the `oxmpi-jobs` crate.
//!
//! Having integration tests also makes `cargo test --workspace` build the
//! `oxrun` binary, which every multi-process test in the workspace runs.

use oxmpi_jobs::{alive, descendants, run, Job};
use std::process::Command;
use std::time::Duration;

fn oxrun() -> Command {
    Command::new(env!("CARGO_BIN_EXE_oxrun"))
}

#[test]
fn programs_without_pmi_simply_run() {
    let mut c = oxrun();
    c.args(["-n", "2", "true"]);
    run(c, Duration::from_secs(30)).assert_success();
    let mut c = oxrun();
    c.args(["-n", "2", "sh", "-c", "exit 3"]);
    assert_eq!(run(c, Duration::from_secs(30)).status.code(), Some(3));
}

#[test]
fn tagged_output_and_environment() {
    let mut c = oxrun();
    c.env("OXRUN_TEST_PASSED", "from-oxrun");
    c.args([
        "-np",
        "3",
        "--tag-output",
        "-x",
        "GREETING=hi there",
        "-x",
        "OXRUN_TEST_PASSED",
    ])
    .args([
        "sh",
        "-c",
        "echo \"$GREETING $OXRUN_TEST_PASSED $PMI_RANK/$PMI_SIZE\"",
    ]);
    let out = run(c, Duration::from_secs(30));
    out.assert_success();
    let mut lines: Vec<&str> = out.stdout.lines().collect();
    lines.sort();
    assert_eq!(
        lines,
        [
            "[0] hi there from-oxrun 0/3",
            "[1] hi there from-oxrun 1/3",
            "[2] hi there from-oxrun 2/3"
        ]
    );
    let mut c = oxrun();
    c.args(["-n", "two", "true"]);
    assert_eq!(run(c, Duration::from_secs(30)).status.code(), Some(2));
}

#[test]
fn help_goes_to_standard_output_and_succeeds() {
    let mut c = oxrun();
    c.arg("--help");
    let out = run(c, Duration::from_secs(30));
    out.assert_success();
    assert!(out.stdout.starts_with("usage: oxrun"), "{}", out.stdout);
}

#[test]
fn a_signal_to_oxrun_ends_the_job() {
    let mut c = oxrun();
    c.args(["-n", "2", "sleep", "600"]);
    let job = Job::start(c, Duration::from_secs(30));
    let sleepers = || -> Vec<u32> {
        descendants(job.pid())
            .into_iter()
            .filter(|&pid| {
                std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c == "sleep\n")
            })
            .collect()
    };
    let mut ranks = sleepers();
    while ranks.len() < 2 {
        assert!(
            job.elapsed() < Duration::from_secs(20),
            "the ranks did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
        ranks = sleepers();
    }
    // SAFETY: kill has no memory-safety preconditions; the pid is oxrun's,
    // not yet reaped.
    unsafe { libc::kill(job.pid() as i32, libc::SIGTERM) };
    let out = job.finish();
    assert_eq!(out.status.code(), Some(128 + libc::SIGTERM), "{out:?}");
    assert!(
        out.stderr
            .contains("oxrun: got signal 15 (SIGTERM); ending the job"),
        "{}",
        out.stderr
    );
    // Each rank leads a process group of its own, which the job's checks
    // do not cover: they must be gone, or zombies waiting for init.
    let left: Vec<u32> = ranks.into_iter().filter(|&pid| alive(pid)).collect();
    assert!(left.is_empty(), "ranks outlived oxrun: {left:?}");
}

/// A rank's script that speaks PMI-1 over `PMI_FD` itself (init,
/// get_appnum, finalize) and prints what it learnt and its environment.
const PMI_SCRIPT: &str = r#"
pmi() { printf '%s\n' "$1" >&"$PMI_FD"; IFS= read -r reply <&"$PMI_FD"; }
pmi 'cmd=init pmi_version=1 pmi_subversion=1'
pmi 'cmd=get_appnum'
appnum=${reply##*appnum=}
pmi 'cmd=finalize'
echo "rank $PMI_RANK/$PMI_SIZE appnum $appnum local $MPI_LOCALRANKID/$MPI_LOCALNRANKS $1 A=${A-unset} B=${B-unset}"
"#;

#[test]
fn mpmd_parts_number_ranks_in_order_with_their_appnum_and_environment() {
    let mut c = oxrun();
    c.args(["--tag-output", "-n", "2", "-x", "A=first"])
        .args(["bash", "-c", PMI_SCRIPT, "script", "one"])
        .args([":", "-np", "1", "-x", "B=second"])
        .args(["bash", "-c", PMI_SCRIPT, "script", "two"])
        .args([":", "-n", "2", "bash", "-c", PMI_SCRIPT, "script", "three"]);
    let out = run(c, Duration::from_secs(30));
    out.assert_success();
    let mut lines: Vec<&str> = out.stdout.lines().collect();
    lines.sort();
    assert_eq!(
        lines,
        [
            "[0] rank 0/5 appnum 0 local 0/5 one A=first B=unset",
            "[1] rank 1/5 appnum 0 local 1/5 one A=first B=unset",
            "[2] rank 2/5 appnum 1 local 2/5 two A=unset B=second",
            "[3] rank 3/5 appnum 2 local 3/5 three A=unset B=unset",
            "[4] rank 4/5 appnum 2 local 4/5 three A=unset B=unset",
        ],
        "{}",
        out.stderr
    );
}

#[test]
fn bad_mpmd_command_lines_exit_2_saying_why() {
    for (args, why) in [
        ("-n 1 true :", "':' ends the command line"),
        (
            "-n 1 true : : -n 1 true",
            "part 2 of the command line is empty",
        ),
        (": -n 1 true", "part 1 of the command line is empty"),
        (
            "-n 1 true : true",
            "part 2 of the command line: -n N is required",
        ),
        (
            "-n 1 true : -n 1",
            "part 2 of the command line: no program given",
        ),
        (
            "-n 1 true : -n 1 --report-bindings true",
            "--report-bindings applies to the whole job",
        ),
    ] {
        let mut c = oxrun();
        c.args(args.split_whitespace());
        let out = run(c, Duration::from_secs(30));
        assert_eq!(out.status.code(), Some(2), "oxrun {args}: {out:?}");
        let first = out.stderr.lines().next().unwrap_or_default();
        assert!(
            first.starts_with("oxrun: ") && first.contains(why),
            "oxrun {args}: {}",
            out.stderr
        );
    }
}

#[test]
fn a_part_that_cannot_start_ends_the_job() {
    let mut c = oxrun();
    c.args([
        "-n",
        "1",
        "sleep",
        "600",
        ":",
        "-n",
        "1",
        "/nonexistent/prog",
    ]);
    let out = run(c, Duration::from_secs(30));
    assert_eq!(out.status.code(), Some(127), "{out:?}");
    assert!(
        out.stderr
            .contains("oxrun: cannot start rank 1 (/nonexistent/prog)"),
        "{}",
        out.stderr
    );
}

/// What each rank of a job of `ranks` ranks says of its placement: the
/// line oxrun reported for it, its `OXMPI_CPUSET` and `OXMPI_NUMA_NODES`
/// (or `unset`), and the CPUs the kernel lets it run on
/// (`Cpus_allowed_list`). Each is checked against the others: a bound
/// rank runs on exactly the cpuset reported and told; an unbound one on
/// the CPUs this test runs on, and is told nothing.
/// `launcher` is the command that starts oxrun (oxrun itself, or through
/// `taskset`). Returns each rank's object (`core 1`, `-` when not bound),
/// report line and CPUs.
fn placement(
    mut launcher: Command,
    options: &[&str],
    ranks: usize,
    env: &[(&str, &str)],
) -> Vec<(String, String, Vec<u32>)> {
    let c = &mut launcher;
    c.args(options)
        .arg("--report-bindings")
        .args(["-n", &ranks.to_string()])
        .args([
            "sh",
            "-c",
            "echo \"$PMI_RANK ${OXMPI_CPUSET-unset} ${OXMPI_NUMA_NODES-unset} \
             $(grep ^Cpus_allowed_list: /proc/self/status | cut -f2)\"",
        ])
        // A stale value from oxrun's environment must not reach a rank.
        .env("OXMPI_CPUSET", "stale")
        .envs(env.iter().copied());
    let out = run(launcher, Duration::from_secs(60));
    out.assert_success();
    let own = allowed_cpus(&std::fs::read_to_string("/proc/self/status").unwrap());
    let mut said: Vec<Vec<String>> = out
        .stdout
        .lines()
        .map(|l| l.split(' ').map(str::to_owned).collect())
        .collect();
    said.sort_by_key(|fields| fields[0].parse::<usize>().unwrap());
    assert_eq!(said.len(), ranks, "{}", out.stdout);
    let reports: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.starts_with("oxrun: rank "))
        .collect();
    assert_eq!(reports.len(), ranks, "{}", out.stderr);
    let mut found = Vec::new();
    for (rank, fields) in said.iter().enumerate() {
        let [_, cpuset, nodes, allowed] = &fields[..] else {
            panic!("rank {rank} said {fields:?}");
        };
        let report = reports
            .iter()
            .find(|l| l.starts_with(&format!("oxrun: rank {rank} ")))
            .unwrap_or_else(|| panic!("no report for rank {rank}:\n{}", out.stderr));
        let allowed = list_cpus(allowed);
        let what = report.split_once(" bound to ").map(|(_, what)| {
            let (object, mask) = what
                .strip_suffix(')')
                .and_then(|w| w.split_once(" (cpuset "))
                .unwrap_or_else(|| panic!("bad report {report:?}"));
            assert_eq!(mask_cpus(mask), allowed, "rank {rank}: {report}");
            assert_eq!(list_cpus(cpuset), allowed, "rank {rank}: {fields:?}");
            assert_ne!(nodes, "unset", "rank {rank}: {fields:?}");
            object.to_owned()
        });
        let object = what.unwrap_or_else(|| {
            assert!(report.contains(" not bound ("), "{report}");
            assert_eq!((cpuset.as_str(), nodes.as_str()), ("unset", "unset"));
            assert_eq!(allowed, own, "rank {rank}: {report}");
            "-".to_owned()
        });
        found.push((object, report.to_string(), allowed));
    }
    found
}

/// CPUs of a `Cpus_allowed_list` line in /proc/PID/status.
fn allowed_cpus(status: &str) -> Vec<u32> {
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .expect("a Cpus_allowed_list line");
    list_cpus(line.trim())
}

/// CPUs of a list such as `0-3,8`.
fn list_cpus(list: &str) -> Vec<u32> {
    list.split(',')
        .flat_map(|range| {
            let (a, b) = range.split_once('-').unwrap_or((range, range));
            a.parse().unwrap()..=b.parse().unwrap()
        })
        .collect()
}

/// CPUs of an hwloc cpuset such as `0x00000001,0x00000003`.
fn mask_cpus(mask: &str) -> Vec<u32> {
    let words: Vec<u32> = mask
        .split(',')
        .map(|w| u32::from_str_radix(w.trim_start_matches("0x"), 16).unwrap())
        .collect();
    let mut cpus = Vec::new();
    for (i, word) in words.iter().rev().enumerate() {
        cpus.extend(
            (0..32)
                .filter(|b| word & (1 << b) != 0)
                .map(|b| i as u32 * 32 + b),
        );
    }
    cpus
}

/// The machine's cores, as hwloc counts them.
fn cores() -> usize {
    hwloc2::Topology::new()
        .expect("hwloc loads this machine's topology")
        .objects_with_type(&hwloc2::ObjectType::Core)
        .expect("hwloc finds cores")
        .len()
}

#[test]
fn ranks_bind_to_consecutive_cores_by_default() {
    let found = placement(oxrun(), &[], 2, &[]);
    assert_eq!(found[0].0, "core 0", "{found:?}");
    assert_eq!(found[1].0, "core 1", "{found:?}");
    // Also when spread over NUMA nodes: round-robin over one node here,
    // or one rank on each of the first two.
    let found = placement(oxrun(), &["--map-by", "numa"], 2, &[]);
    assert!(
        found.iter().all(|(o, ..)| o.starts_with("core ")),
        "{found:?}"
    );
}

#[test]
fn ranks_bind_to_numa_nodes() {
    let found = placement(oxrun(), &["--bind-to", "numa"], 2, &[]);
    assert!(
        found.iter().all(|(o, ..)| o.starts_with("NUMA node")),
        "{found:?}"
    );
}

#[test]
fn ranks_stay_within_the_cpus_oxrun_may_use() {
    let own = allowed_cpus(&std::fs::read_to_string("/proc/self/status").unwrap());
    let cpu = own.last().expect("this test runs on some CPU").to_string();
    let mut taskset = Command::new("taskset");
    taskset.args(["-c", &cpu, env!("CARGO_BIN_EXE_oxrun")]);
    let found = placement(taskset, &[], 1, &[]);
    assert!(found[0].0.starts_with("core "), "{found:?}");
    assert_eq!(found[0].2, [cpu.parse().unwrap()], "{found:?}");
}

#[test]
fn bind_to_none_leaves_ranks_where_oxrun_runs() {
    let found = placement(oxrun(), &["--bind-to", "none"], 2, &[]);
    for (rank, (object, report, _)) in found.iter().enumerate() {
        assert_eq!(object, "-");
        assert_eq!(
            report,
            &format!("oxrun: rank {rank} not bound (--bind-to none)")
        );
    }
}

#[test]
fn oversubscribed_ranks_are_not_bound_by_default() {
    let ranks = cores() + 1;
    let found = placement(oxrun(), &[], ranks, &[]);
    for (object, report, _) in found {
        assert_eq!(object, "-");
        assert!(
            report.contains(&format!("{ranks} ranks on {} core", ranks - 1)),
            "{report}"
        );
    }
}

#[test]
fn without_a_topology_the_job_runs_unbound_and_says_why_once() {
    // hwloc's "stop" component ends discovery before any: no topology.
    let found = placement(oxrun(), &[], 2, &[("HWLOC_COMPONENTS", "stop")]);
    for (object, report, _) in &found {
        assert_eq!(object, "-");
        assert!(
            report.contains("hwloc could not load this machine's topology"),
            "{report}"
        );
    }
    let mut c = oxrun();
    c.args(["-n", "2", "true"]).env("HWLOC_COMPONENTS", "stop");
    let out = run(c, Duration::from_secs(30));
    out.assert_success();
    let warnings: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.starts_with("oxrun: "))
        .collect();
    assert_eq!(warnings.len(), 1, "{}", out.stderr);
    assert!(
        warnings[0].starts_with("oxrun: binding no rank: hwloc could not load"),
        "{}",
        out.stderr
    );
}
