//! Completion of many requests (MPI 4.1 §3.7.5) in real jobs through
//! oxrun: wait_some, test_some, test_any and wait_any over receives that
//! complete out of order, `Request::get_status`, and MPI_ERR_IN_STATUS
//! from wait_all. The checks themselves are in `src/bin/completion.rs`.
//! The jobs run over TCP (`OXMPI_TRANSPORTS=tcp`); `shm.rs` runs them over
//! shared memory.

use oxmpi_jobs::{run, Binaries};
use std::process::Command;
use std::time::Duration;

fn bins() -> Binaries {
    Binaries::new(env!("CARGO_BIN_EXE_completion"))
}

/// `oxrun -n RANKS completion CHECK`, with `env` set.
fn check(check: &str, ranks: usize, env: &[(&str, &str)]) {
    let mut c = Command::new(bins().oxrun());
    c.arg("-n")
        .arg(ranks.to_string())
        .arg(bins().bin("completion"))
        .arg(check)
        .env("OXMPI_TRANSPORTS", "tcp")
        .envs(env.iter().copied());
    let out = run(c, Duration::from_secs(60));
    out.assert_success();
    let ok = format!("completion {check}: ok on {ranks} ranks");
    assert!(out.stdout.contains(&ok), "{}", out.stdout);
}

#[test]
fn wait_some_test_some_test_any_step_by_step() {
    check("order", 2, &[]);
}

#[test]
fn many_receives_completed_out_of_order() {
    for ranks in [2, 4] {
        check("bulk", ranks, &[]);
    }
}

#[test]
fn many_receives_mostly_rendezvous() {
    check("bulk", 3, &[("OXMPI_TCP_EAGER_LIMIT", "100")]);
}

#[test]
fn get_status_sees_completion_without_freeing() {
    check("get-status", 2, &[]);
}

#[test]
fn wait_all_reports_in_status_and_the_job_goes_on() {
    check("in-status", 2, &[]);
    check("in-status", 3, &[("OXMPI_TCP_EAGER_LIMIT", "1000")]);
}
