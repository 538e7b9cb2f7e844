//! End-to-end runs of `oxbench`: the MPI benchmarks as 2-rank jobs through
//! `oxrun`, the raw TCP baseline, and bad command lines. They check the
//! output's shape (header, one line per size, positive numbers, the JSON
//! object), exit statuses, and that no process is left behind — never
//! speed.
//!
//! Each run is an `oxmpi_jobs` job: its own process group, bounded in
//! time, whose output must close and whose group must be empty once it
//! exits. `oxrun` is looked up next to `oxbench` (the same target
//! directory): `cargo test --workspace` builds it.

use oxmpi_jobs::{run, Binaries, Job};
use std::os::unix::process::ExitStatusExt;
use std::process::Command;
use std::time::Duration;

fn oxbench() -> &'static str {
    env!("CARGO_BIN_EXE_oxbench")
}

fn mpi_job(args: &[&str]) -> Command {
    let mut c = Command::new(Binaries::new(oxbench()).oxrun());
    c.args(["-n", "2"]).arg(oxbench()).args(args);
    c
}

fn oxbench_with(args: &[&str]) -> Command {
    let mut c = Command::new(oxbench());
    c.args(args);
    c
}

/// The sizes OSU would measure from `min` to `max`.
fn sizes(min: usize, max: usize) -> Vec<usize> {
    let mut v = vec![];
    let mut s = min;
    while s <= max {
        v.push(s);
        s = if s == 0 { 1 } else { s * 2 };
    }
    v
}

/// Checks an OSU-style table: `title` first, `#` header lines, the column
/// header, then one line per size with a positive figure.
fn check_table(stdout: &str, title: &str, column: &str, expected: &[usize]) {
    let mut lines = stdout.lines();
    assert_eq!(lines.next(), Some(title), "first line\n{stdout}");
    let header: Vec<&str> = stdout.lines().take_while(|l| l.starts_with('#')).collect();
    assert_eq!(header.last(), Some(&column), "column header\n{stdout}");
    let rows: Vec<&str> = stdout.lines().skip(header.len()).collect();
    let mut seen = Vec::new();
    for row in &rows {
        let fields: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(fields.len(), 2, "row {row:?}\n{stdout}");
        let size: usize = fields[0]
            .parse()
            .unwrap_or_else(|_| panic!("size in {row:?}"));
        let value: f64 = fields[1]
            .parse()
            .unwrap_or_else(|_| panic!("figure in {row:?}"));
        assert!(
            value.is_finite() && value > 0.0,
            "figure in {row:?}\n{stdout}"
        );
        let decimals = fields[1].rsplit_once('.').map(|(_, d)| d.len());
        assert_eq!(decimals, Some(2), "2 decimals in {row:?}");
        seen.push(size);
    }
    assert_eq!(seen, expected, "sizes\n{stdout}");
}

/// Checks the JSON object's shape (without a JSON library: the format is
/// fixed) and returns its (size, value) pairs.
fn check_json(
    stdout: &str,
    benchmark: &str,
    implementation: &str,
    unit: &str,
) -> Vec<(usize, f64)> {
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "one line of JSON\n{stdout}");
    let text = lines[0];
    let prefix = format!(
        "{{\"benchmark\":\"{benchmark}\",\"implementation\":\"{implementation}\",\"unit\":\"{unit}\",\"notes\":["
    );
    assert!(text.starts_with(&prefix), "{text}");
    let (_, results) = text.split_once("],\"results\":[").expect("a results array");
    let results = results
        .strip_suffix("]}")
        .expect("the object ends after the results");
    results
        .split("},{")
        .map(|item| {
            let item = item.trim_start_matches('{').trim_end_matches('}');
            let (size, value) = item
                .strip_prefix("\"size\":")
                .and_then(|r| r.split_once(",\"value\":"))
                .unwrap_or_else(|| panic!("result {item:?}"));
            let size: usize = size.parse().expect("size");
            let value: f64 = value.parse().expect("value");
            assert!(value.is_finite() && value > 0.0, "{item}");
            (size, value)
        })
        .collect()
}

const MPI_BOUND: Duration = Duration::from_secs(120);
const RAW_BOUND: Duration = Duration::from_secs(60);

#[test]
fn mpi_latency_table() {
    let out = run(
        mpi_job(&[
            "latency",
            "--max-size",
            "1024",
            "--iterations",
            "50",
            "--warmup",
            "5",
        ]),
        MPI_BOUND,
    );
    out.assert_success();
    check_table(
        &out.stdout,
        "# oxmpi latency test",
        "# Size          Latency (us)",
        &sizes(0, 1024),
    );
}

#[test]
fn mpi_bandwidth_table_past_the_eager_limit() {
    let out = run(
        mpi_job(&[
            "bw",
            "--max-size",
            "1M",
            "--iterations",
            "5",
            "--warmup",
            "1",
        ]),
        MPI_BOUND,
    );
    out.assert_success();
    check_table(
        &out.stdout,
        "# oxmpi bandwidth test",
        "# Size      Bandwidth (MB/s)",
        &sizes(1, 1 << 20),
    );
}

#[test]
fn mpi_json_output() {
    let out = run(
        mpi_job(&[
            "latency",
            "--max-size",
            "64",
            "--iterations",
            "20",
            "--warmup",
            "2",
            "--json",
        ]),
        MPI_BOUND,
    );
    out.assert_success();
    let results = check_json(&out.stdout, "latency", "oxmpi", "us");
    assert_eq!(
        results.iter().map(|r| r.0).collect::<Vec<_>>(),
        sizes(0, 64)
    );
    let out = run(
        mpi_job(&[
            "bw",
            "--size",
            "8K",
            "--iterations",
            "3",
            "--warmup",
            "1",
            "--json",
        ]),
        MPI_BOUND,
    );
    out.assert_success();
    let results = check_json(&out.stdout, "bw", "oxmpi", "MB/s");
    assert_eq!(results.len(), 1);
    assert_eq!(results[0].0, 8192);
}

#[test]
fn mpi_benchmarks_need_two_ranks() {
    // Run alone, oxbench is a 1-rank job: refused with a message.
    let out = run(oxbench_with(&["latency", "--size", "8"]), MPI_BOUND);
    assert!(
        !out.status.success(),
        "a 1-rank job succeeded\n{}",
        out.stdout
    );
    assert!(out.stderr.contains("exactly 2 ranks"), "{}", out.stderr);
    assert!(out.stdout.is_empty(), "{}", out.stdout);
}

#[test]
fn bad_command_lines_exit_with_2() {
    let bad: &[&[&str]] = &[
        &[],
        &["pingpong"],
        &["latency", "--max-size"],
        &["latency", "--iterations", "0"],
        &["bw", "--min-size", "0"],
        &["bw", "--max-size", "1T"],
        &["raw-tcp"],
        &["raw-tcp", "latency", "--size", "0"],
        &["raw-tcp", "bw", "--frobnicate"],
    ];
    for args in bad {
        let out = run(oxbench_with(args), Duration::from_secs(20));
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", out.stderr);
        assert!(out.stderr.contains("usage:"), "{args:?}: {}", out.stderr);
        assert!(out.stdout.is_empty(), "{args:?}: {}", out.stdout);
    }
    let out = run(oxbench_with(&["--help"]), Duration::from_secs(20));
    out.assert_success();
    assert!(out.stdout.starts_with("usage:"), "{}", out.stdout);
}

#[test]
fn raw_tcp_latency_table() {
    let out = run(
        oxbench_with(&[
            "raw-tcp",
            "latency",
            "--max-size",
            "4K",
            "--iterations",
            "50",
            "--warmup",
            "5",
        ]),
        RAW_BOUND,
    );
    out.assert_success();
    check_table(
        &out.stdout,
        "# raw TCP latency test",
        "# Size          Latency (us)",
        &sizes(1, 4096),
    );
}

#[test]
fn raw_tcp_bandwidth_table_and_json() {
    let out = run(
        oxbench_with(&[
            "raw-tcp",
            "bw",
            "--min-size",
            "8",
            "--max-size",
            "1M",
            "--iterations",
            "5",
            "--warmup",
            "1",
        ]),
        RAW_BOUND,
    );
    out.assert_success();
    check_table(
        &out.stdout,
        "# raw TCP bandwidth test",
        "# Size      Bandwidth (MB/s)",
        &sizes(8, 1 << 20),
    );
    let out = run(
        oxbench_with(&[
            "raw-tcp",
            "bw",
            "--size",
            "4M",
            "--iterations",
            "2",
            "--warmup",
            "1",
            "--json",
        ]),
        RAW_BOUND,
    );
    out.assert_success();
    let results = check_json(&out.stdout, "bw", "raw-tcp", "MB/s");
    assert_eq!(
        results.iter().map(|r| r.0).collect::<Vec<_>>(),
        vec![4 << 20]
    );
}

#[test]
fn raw_tcp_child_exits_when_the_parent_is_killed() {
    // A run far too long to finish; once it prints its header the child is
    // connected. Kill only the parent: the child must notice and exit, for
    // the job's output to close and its process group to empty.
    let mut job = Job::start(
        oxbench_with(&[
            "raw-tcp",
            "latency",
            "--size",
            "8",
            "--iterations",
            "1000000000",
        ]),
        RAW_BOUND,
    );
    job.wait_for_stdout(RAW_BOUND);
    // SAFETY: kill has no memory-safety preconditions; the pid is the
    // parent's, which the job has not reaped yet.
    unsafe { libc::kill(job.pid() as libc::pid_t, libc::SIGKILL) };
    let out = job.finish();
    assert_eq!(out.status.signal(), Some(libc::SIGKILL), "{out:?}");
}
