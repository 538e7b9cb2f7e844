//! Non-blocking collectives as real jobs through oxrun: the checks of the
//! `nonblocking_collectives` program with 1 to 8 ranks (oversubscribed on
//! small machines) over the default transports, with most messages by
//! rendezvous, and over TCP alone.

use oxmpi_jobs::{run, shm_leftovers, Binaries};
use std::process::Command;
use std::time::Duration;

fn bins() -> Binaries {
    Binaries::new(env!("CARGO_BIN_EXE_nonblocking_collectives"))
}

/// Runs `nonblocking_collectives check` on `ranks` ranks with `env` set,
/// within `bound` seconds; it must succeed and leave nothing behind.
fn job(check: &str, ranks: usize, env: &[(&str, &str)], bound: u64) {
    let mut c = Command::new(bins().oxrun());
    c.arg("-n")
        .arg(ranks.to_string())
        .arg(bins().bin("nonblocking_collectives"))
        .arg(check)
        .envs(env.iter().copied());
    let out = run(c, Duration::from_secs(bound));
    out.assert_success();
    assert!(
        shm_leftovers().is_empty(),
        "shared segments left: {:?}",
        shm_leftovers()
    );
}

const TCP: [(&str, &str); 1] = [("OXMPI_TRANSPORTS", "tcp")];

/// Eager limits of 1000 bytes: nearly every step waits for its receiver.
const SMALL_EAGER: [(&str, &str); 2] = [
    ("OXMPI_SHM_EAGER_LIMIT", "1000"),
    ("OXMPI_TCP_EAGER_LIMIT", "1000"),
];

#[test]
fn every_nonblocking_collective_with_1_to_8_ranks() {
    for ranks in 1..=8 {
        job("data", ranks, &[], 180);
    }
}

#[test]
fn collectives_under_way_together_with_point_to_point() {
    for ranks in [1, 2, 3, 4, 7] {
        job("overlap", ranks, &[], 180);
    }
    job("overlap", 5, &SMALL_EAGER, 180);
}

#[test]
fn tests_of_any_request_move_collectives_on() {
    for ranks in [1, 2, 3, 5, 8] {
        job("progress", ranks, &[], 120);
    }
    job("progress", 4, &SMALL_EAGER, 120);
}

#[test]
fn nonblocking_collectives_over_tcp() {
    job("data", 3, &TCP, 180);
    job("overlap", 4, &TCP, 180);
    job("progress", 3, &TCP, 120);
}
