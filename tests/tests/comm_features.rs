//! Intercommunicators, topologies, attributes, info objects and error
//! handlers as real jobs through oxrun: the checks of the `comm_features`
//! program over the default transports and over TCP alone.

use oxmpi_jobs::{run, shm_leftovers, Binaries};
use std::time::Duration;

fn bins() -> Binaries {
    Binaries::new(env!("CARGO_BIN_EXE_comm_features"))
}

/// Runs the check; it must succeed, say `expected` and leave nothing in
/// /dev/shm.
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

#[test]
fn a_fatal_error_handler_ends_the_job_with_the_message() {
    let out = run(
        bins().check("comm_features", "fatal", 3, &[]),
        Duration::from_secs(30),
    );
    // The job ends with the error class's code (MPI_ERR_RANK is 6).
    assert_eq!(out.status.code(), Some(6), "{}", out.stderr);
    assert!(
        out.stderr.contains("fatal error (ErrorHandler::Fatal)")
            && out
                .stderr
                .contains("MPI_ERR_RANK: rank 3 is not in this communicator"),
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
