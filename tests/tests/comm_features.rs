//! Intercommunicators, topologies, attributes, info objects and error
//! handlers as real jobs through oxrun: the checks of the `comm_features`
//! program over the default transports and over TCP alone.

use oxmpi_jobs::{run, shm_leftovers, Binaries};
use std::time::Duration;

fn bins() -> Binaries {
    Binaries::new(env!("CARGO_BIN_EXE_comm_features"))
}

/// Runs the check; it must succeed, say `expected` and leave nothing
/// behind.
fn job(check: &str, ranks: usize, env: &[(&str, &str)], expected: &str) {
    let out = run(
        bins().check("comm_features", check, ranks, env),
        Duration::from_secs(60),
    );
    out.assert_success();
    assert!(out.stdout.contains(expected), "{}", out.stdout);
    assert!(
        shm_leftovers().is_empty(),
        "shared segments left: {:?}",
        shm_leftovers()
    );
}

const TCP: [(&str, &str); 1] = [("OXMPI_TRANSPORTS", "tcp")];

#[test]
fn intercommunicator_round_trips_broadcasts_and_merges_with_2_to_6_ranks() {
    for ranks in 2..=6 {
        job("inter", ranks, &[], "merged both ways");
    }
}

#[test]
fn intercommunicators_over_tcp() {
    for ranks in [2, 5] {
        job("inter", ranks, &TCP, "merged both ways");
    }
}

#[test]
fn cartesian_and_graph_topologies_and_neighbourhood_collectives_with_1_to_8_ranks() {
    for ranks in 1..=8 {
        job("topology", ranks, &[], &format!("topology: {ranks} ranks"));
    }
    job("topology", 6, &TCP, "topology: 6 ranks");
}

#[test]
fn attributes_info_and_error_handlers() {
    for ranks in [1, 3] {
        job("state", ranks, &[], "state: attributes");
    }
    job(
        "state",
        2,
        &[],
        "rank 1: self attribute deleted at finalize",
    );
    job("state", 2, &TCP, "state: attributes");
}

/// Runs `check`, in which rank 1 makes an error on world with the default
/// handler, at 3 ranks: the job must end in time with the error class's
/// `code`, the rank's message naming world, rank 1 and `error` (class and
/// message), and oxrun naming rank 1; nothing left behind.
fn ends_the_job(check: &str, code: i32, error: &str) {
    let out = run(
        bins().check("comm_features", check, 3, &[]),
        Duration::from_secs(30),
    );
    assert_eq!(out.status.code(), Some(code), "{}", out.stderr);
    assert!(
        out.stderr.contains(&format!(
            "fatal error (ErrorHandler::Fatal) on communicator \"MPI_COMM_WORLD\" at rank 1: \
             {error}"
        )) && out.stderr.contains(&format!("error class's code {code}"))
            && out.stderr.contains("oxrun: rank 1 (pid")
            && out
                .stderr
                .contains(&format!("called abort with code {code}")),
        "{}",
        out.stderr
    );
    assert!(
        out.elapsed < Duration::from_secs(10),
        "the job took {:?} to end",
        out.elapsed
    );
    assert!(
        shm_leftovers().is_empty(),
        "shared segments left: {:?}",
        shm_leftovers()
    );
}

#[test]
fn an_error_on_world_ends_the_job_by_default_with_its_class_and_rank() {
    // MPI_ERR_RANK is 6.
    ends_the_job(
        "fatal",
        6,
        "MPI_ERR_RANK: rank 3 is not in this communicator",
    );
}

#[test]
fn an_error_found_at_wait_ends_the_job_by_default() {
    // MPI_ERR_TRUNCATE is 14.
    ends_the_job(
        "fatal-at-wait",
        14,
        "MPI_ERR_TRUNCATE: message of 8 bytes from rank 1 (tag 0) does not fit the receive \
         buffer of 4 bytes",
    );
}
