//! A job whose rank 1 runs as another user (`nobody`, uid and gid 65534,
//! no supplementary groups), through oxrun's MPMD form:
//!
//! ```text
//! oxrun -n 1 PROGRAM CHECK : -n 1 setpriv --reuid=65534 --regid=65534 --clear-groups PROGRAM CHECK
//! ```
//!
//! Rank 1 has no ptrace rights over rank 0 (root's), as sibling ranks
//! have none over each other under Yama's `ptrace_scope=1` (Ubuntu's
//! default). What shares memory must not need them: shared windows
//! (`allocate_shared`, contiguous and not, `shared_query`, loads and
//! stores, put and get on the direct path) and the collectives' region,
//! whose memory files are handed over a Unix socket; point-to-point
//! messages, whose queues are too. Only cross-memory attach needs them,
//! and where it is refused the job must go on without it and say why
//! under `OXMPI_VERBOSE=1`: long messages through the queue, created
//! windows by active messages, the collectives without single copies.
//!
//! Starting a rank as another user needs root: see
//! `oxmpi_jobs::privilege`.

use oxmpi_jobs::privilege::as_root;
use oxmpi_jobs::{run, shm_leftovers, Binaries, Outcome};
use std::process::Command;
use std::time::Duration;

/// How rank 1 becomes another user.
const AS_NOBODY: [&str; 4] = [
    "setpriv",
    "--reuid=65534",
    "--regid=65534",
    "--clear-groups",
];

/// Runs `program args` as a two-rank job, rank 1 as `nobody`, with the
/// default transports (shared memory between the two) and
/// `OXMPI_VERBOSE=1`, within two minutes; it must succeed and leave
/// nothing behind.
fn job(program: &str, args: &[&str]) -> Outcome {
    let bins = Binaries::new(env!("CARGO_BIN_EXE_rma_suite"));
    let program = bins.bin(program);
    let mut c = Command::new(bins.oxrun());
    c.args(["-n", "1"])
        .arg(&program)
        .args(args)
        .args([":", "-n", "1"])
        .args(AS_NOBODY)
        .arg(&program)
        .args(args)
        .env("OXMPI_VERBOSE", "1");
    let out = run(c, Duration::from_secs(120));
    out.assert_success();
    assert!(
        shm_leftovers().is_empty(),
        "shared segments left: {:?}",
        shm_leftovers()
    );
    out
}

/// Panics, showing `stderr`, unless it has a line containing `want`.
fn assert_said(stderr: &str, want: &str) {
    assert!(
        stderr.lines().any(|line| line.contains(want)),
        "no line says {want:?}:\n{stderr}"
    );
}

#[test]
fn a_rank_of_another_user_shares_windows_and_collectives() {
    if !as_root(
        "a_rank_of_another_user_shares_windows_and_collectives",
        "start a rank as another user",
    ) {
        return;
    }
    let shared = job("rma_suite", &["shared"]);
    assert_said(
        &shared.stderr,
        "direct access to the shared memory of its 2 ranks",
    );
    // Every operation under every synchronisation, on allocated windows
    // (direct) and created ones (active messages).
    job("rma_suite", &["ops"]);
    let path = job("rma_suite", &["path", "direct", "messages"]);
    // Rank 1 may not read root's memory: it says so once per window.
    let refusals = path
        .stderr
        .lines()
        .filter(|line| line.contains("cross-memory attach to rank 0's window failed"))
        .count();
    assert_eq!(refusals, 1, "{}", path.stderr);
    let collectives = job("collectives", &["data"]);
    // Said once rank 1 has attached rank 0's region, which it has then.
    assert_said(
        &collectives.stderr,
        "collectives over shared memory: no single copies (from rank 0",
    );
    assert!(
        !collectives.stderr.contains("cannot attach"),
        "{}",
        collectives.stderr
    );
    let long = job("p2p_suite", &["long"]);
    assert_said(&long.stderr, "cross-memory attach to rank 0 refused");
}
