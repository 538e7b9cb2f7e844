//! The launcher on its own: programs that never use PMI, tagged output,
//! `-x` environment passing, and bad command lines. Jobs that use MPI are
//! in the `oxmpi-jobs` crate.
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
