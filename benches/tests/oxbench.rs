//! End-to-end runs of `oxbench`: the MPI benchmarks as 2-rank jobs through
//! `oxrun`, the raw TCP baseline, and bad command lines. They check the
//! output's shape (header, one line per size, positive numbers, the JSON
//! object), exit statuses, and that no process is left behind — never
//! speed.
//!
//! Each run is its own process group, bounded in time: past its bound the
//! whole group is killed and the test fails with the output so far.
//! `oxrun` is looked up next to `oxbench` (the same target directory):
//! build it first (`cargo build -p oxmpi-launcher`, or test with
//! `cargo test --workspace`).

use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

fn oxbench() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_oxbench"))
}

fn oxrun() -> PathBuf {
    let path = oxbench().with_file_name("oxrun");
    assert!(
        path.exists(),
        "{} is missing: build the launcher into the same target directory first \
         (`cargo build -p oxmpi-launcher` with the same profile, or `cargo test --workspace`)",
        path.display()
    );
    path
}

fn mpi_job(args: &[&str]) -> Command {
    let mut c = Command::new(oxrun());
    c.args(["-n", "2"]).arg(oxbench()).args(args);
    c
}

fn oxbench_with(args: &[&str]) -> Command {
    let mut c = Command::new(oxbench());
    c.args(args);
    c
}

/// Which stream a line came from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stream {
    Out,
    Err,
}

/// A process started in its own group, whose output arrives line by line.
struct Run {
    child: Child,
    what: String,
    lines: Receiver<(Stream, Option<String>)>,
    open_streams: usize,
    stdout: String,
    stderr: String,
    reaped: bool,
}

/// What a finished run left.
struct Output {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

impl Output {
    fn assert_success(&self) -> &Output {
        assert!(
            self.status.success(),
            "failed with {}\n--- stdout\n{}--- stderr\n{}",
            self.status,
            self.stdout,
            self.stderr
        );
        self
    }
}

impl Run {
    fn start(mut command: Command) -> Run {
        let what = format!("{command:?}");
        command
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
        let (tx, lines) = mpsc::channel();
        let pipes: [(Stream, Box<dyn Read + Send>); 2] = [
            (
                Stream::Out,
                Box::new(child.stdout.take().expect("piped stdout")),
            ),
            (
                Stream::Err,
                Box::new(child.stderr.take().expect("piped stderr")),
            ),
        ];
        for (stream, pipe) in pipes {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines() {
                    let Ok(line) = line else { break };
                    if tx.send((stream, Some(line))).is_err() {
                        return;
                    }
                }
                let _ = tx.send((stream, None));
            });
        }
        Run {
            child,
            what,
            lines,
            open_streams: 2,
            stdout: String::new(),
            stderr: String::new(),
            reaped: false,
        }
    }

    /// Takes in one line of output, waiting until `deadline`; false if
    /// none came (the streams are closed or the deadline passed).
    fn take_line(&mut self, deadline: Instant) -> bool {
        if self.open_streams == 0 {
            return false;
        }
        let wait = deadline.saturating_duration_since(Instant::now());
        match self.lines.recv_timeout(wait) {
            Ok((stream, Some(line))) => {
                let text = if stream == Stream::Out {
                    &mut self.stdout
                } else {
                    &mut self.stderr
                };
                text.push_str(&line);
                text.push('\n');
                true
            }
            Ok((_, None)) => {
                self.open_streams -= 1;
                true
            }
            Err(RecvTimeoutError::Timeout) => false,
            Err(RecvTimeoutError::Disconnected) => {
                self.open_streams = 0;
                false
            }
        }
    }

    /// Waits for the first line of standard output.
    fn wait_for_stdout(&mut self, bound: Duration) {
        let deadline = Instant::now() + bound;
        while self.stdout.is_empty() {
            if !self.take_line(deadline) && Instant::now() >= deadline {
                self.fail(&format!("printed nothing within {bound:?}"));
            }
            if self.open_streams == 0 && self.stdout.is_empty() {
                self.fail("closed its output without printing");
            }
        }
    }

    /// Waits for the process to exit and its output to close, within
    /// `bound`; kills the group and fails the test past it.
    fn finish(mut self, bound: Duration) -> Output {
        let deadline = Instant::now() + bound;
        let status = loop {
            while self.take_line(Instant::now()) {}
            match self.child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() >= deadline => {
                    self.fail(&format!("did not exit within {bound:?}"))
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(10)),
                Err(e) => self.fail(&format!("cannot be waited for: {e}")),
            }
        };
        self.reaped = true;
        // Output closes when every process that holds it is gone: a
        // process left behind would keep it open.
        let close_by = Instant::now() + Duration::from_secs(10);
        while self.open_streams > 0 {
            if !self.take_line(close_by) && Instant::now() >= close_by {
                self.fail("exited, but something it started still holds its output open");
            }
        }
        let leftovers = live_processes_in_group(self.child.id());
        if !leftovers.is_empty() {
            self.fail(&format!("left processes behind: {leftovers:?}"));
        }
        Output {
            status,
            stdout: std::mem::take(&mut self.stdout),
            stderr: std::mem::take(&mut self.stderr),
        }
    }

    fn kill_group(&mut self) {
        let group = self.child.id() as libc::pid_t;
        // SAFETY: kill has no memory-safety preconditions; the group is the
        // one this run created (its leader is our child, not yet reaped, or
        // reaped just now with no other member left to reuse its id).
        unsafe { libc::kill(-group, libc::SIGKILL) };
        if !self.reaped {
            let _ = self.child.wait();
            self.reaped = true;
        }
    }

    fn fail(&mut self, why: &str) -> ! {
        self.kill_group();
        while self.take_line(Instant::now() + Duration::from_millis(100)) {}
        panic!(
            "{} {why}\n--- stdout\n{}--- stderr\n{}",
            self.what, self.stdout, self.stderr
        );
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        if !self.reaped {
            self.kill_group();
        }
    }
}

/// Processes of process group `group` that are alive (not zombies, which
/// are only waiting for their parent, or for init, to reap them).
fn live_processes_in_group(group: u32) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(Path::new("/proc").join(pid).join("stat")) else {
            continue;
        };
        // pid (comm) state ppid pgrp ...; comm may hold spaces and parens.
        let Some(close) = stat.rfind(')') else {
            continue;
        };
        let fields: Vec<&str> = stat[close + 1..].split_whitespace().collect();
        if fields.len() > 2 && fields[2] == group.to_string() && fields[0] != "Z" {
            found.push(stat[..=close].to_owned());
        }
    }
    found
}

fn run(command: Command, bound: Duration) -> Output {
    Run::start(command).finish(bound)
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
    // connected. Kill only the parent: the child must notice and exit.
    let mut run = Run::start(oxbench_with(&[
        "raw-tcp",
        "latency",
        "--size",
        "8",
        "--iterations",
        "1000000000",
    ]));
    run.wait_for_stdout(RAW_BOUND);
    let group = run.child.id();
    let _ = run.child.kill();
    let _ = run.child.wait();
    run.reaped = true;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left = live_processes_in_group(group);
        if left.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            run.fail(&format!("the child outlived its parent: {left:?}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
