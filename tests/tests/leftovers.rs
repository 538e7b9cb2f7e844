//! The harness's check that nothing outlives a job
//! ([`oxmpi_jobs::shm_leftovers`]) finds what does: a process a rank
//! started in a session of its own (so outside the job's process group,
//! which the harness checks at the end of every job), which outlives the
//! job. Alone in its test binary, since what it leaves on purpose would
//! fail the checks of every job running beside it.

use oxmpi_jobs::{run, shm_leftovers, Binaries};
use std::process::Command;
use std::time::{Duration, Instant};

/// Kills the process `PID (COMMAND) mapping ...` of a leftover line; it
/// is init's child by then, which reaps it.
fn kill(leftover: &str) {
    let pid: i32 = leftover
        .split_whitespace()
        .next()
        .and_then(|pid| pid.parse().ok())
        .unwrap_or_else(|| panic!("a leftover without a pid: {leftover}"));
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(pid, libc::SIGKILL) };
}

/// Kills every leftover when dropped, so that a failing test leaves none.
struct Cleanup;

impl Drop for Cleanup {
    fn drop(&mut self) {
        shm_leftovers().iter().for_each(|l| kill(l));
    }
}

#[test]
fn a_process_that_escapes_its_job_is_found() {
    let bins = Binaries::new(env!("CARGO_BIN_EXE_p2p_suite"));
    let _cleanup = Cleanup;
    assert!(shm_leftovers().is_empty(), "{:?}", shm_leftovers());
    // Rank 1 of a ring of 2 starts `sleep` in a session of its own, then
    // runs the ring.
    let mut c = Command::new(bins.oxrun());
    c.args(["-n", "1"])
        .arg(bins.example("ring"))
        .arg("5")
        .args([":", "-n", "1", "sh", "-c"])
        .arg(format!(
            "setsid sleep 60 </dev/null >/dev/null 2>&1 & exec {} 5",
            bins.example("ring").display()
        ))
        .env("OXMPI_TRANSPORTS", "shm");
    run(c, Duration::from_secs(60)).assert_success();
    let start = Instant::now();
    let left = loop {
        let left = shm_leftovers();
        if !left.is_empty() || start.elapsed() > Duration::from_secs(10) {
            break left;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        left.len() == 1 && left[0].contains("(sleep)"),
        "the escaped process was not found: {left:?}"
    );
}
