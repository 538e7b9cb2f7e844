//! Collectives between the groups of an intercommunicator, neighbourhood
//! collectives and the error handler of collectives as real jobs through
//! oxrun: the checks of the `group_collectives` program over the default
//! transports and over TCP alone.

use oxmpi::ErrorClass;
use oxmpi_jobs::{run, shm_leftovers, Binaries};
use std::time::Duration;

fn bins() -> Binaries {
    Binaries::new(env!("CARGO_BIN_EXE_group_collectives"))
}

/// Runs the check within 60 s; it must succeed, say `expected` and leave
/// nothing behind.
fn job(check: &str, ranks: usize, env: &[(&str, &str)], expected: &str) {
    job_within(check, ranks, env, expected, Duration::from_secs(60));
}

/// [`job`] within `bound`.
fn job_within(check: &str, ranks: usize, env: &[(&str, &str)], expected: &str, bound: Duration) {
    let out = run(bins().check("group_collectives", check, ranks, env), bound);
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
fn intercommunicator_collectives_between_unequal_groups_with_2_to_8_ranks() {
    let groups = |ranks: usize| {
        let a = ranks.div_ceil(3);
        format!("inter: {a} and {} ranks, every collective", ranks - a)
    };
    for ranks in 2..=8 {
        job("inter", ranks, &[], &groups(ranks));
    }
    for ranks in [3, 5] {
        job("inter", ranks, &TCP, &groups(ranks));
    }
}

#[test]
fn long_strided_collectives_between_groups_move_in_pieces() {
    // A segment or a block at a time: no packed copy of the 32 MiB column.
    // Ten collectives of 32 MiB each in a debug build: over TCP on a
    // loaded 2-core machine they took more than 60 s.
    for env in [&[][..], &TCP[..]] {
        job_within(
            "inter_pieces_memory",
            3,
            env,
            "group_collectives inter_pieces_memory: ok on 3 ranks",
            Duration::from_secs(180),
        );
    }
}

#[test]
fn long_strided_neighbourhood_collectives_move_in_pieces() {
    // Each block a message the point-to-point layer packs or unpacks
    // piece by piece: no packed copy of the 32 MiB column.
    for env in [&[][..], &TCP[..]] {
        let out = run(
            bins().check("group_collectives", "neighbor_pieces_memory", 3, env),
            Duration::from_secs(120),
        );
        out.assert_success();
        for expected in [
            "neighbourhood all-to-all-w: +",
            "group_collectives neighbor_pieces_memory: ok on 3 ranks",
        ] {
            assert!(out.stdout.contains(expected), "{env:?}: {}", out.stdout);
        }
        eprint!("{env:?}: {}", out.stdout);
        assert!(
            shm_leftovers().is_empty(),
            "shared segments left: {:?}",
            shm_leftovers()
        );
    }
}

#[test]
fn neighbourhood_collectives_v_w_and_non_blocking_with_1_to_8_ranks() {
    for ranks in 1..=8 {
        job("neighbor", ranks, &[], &format!("neighbor: {ranks} ranks"));
    }
    job("neighbor", 4, &TCP, "neighbor: 4 ranks");
}

#[test]
fn varying_neighbourhood_collectives_between_strided_and_contiguous_data_with_1_to_8_ranks() {
    // From 6 ranks over TCP (epoll polling) the distributed graph has a
    // process answer several requests to send in one poll: its
    // clear-to-sends must leave on their own (`p2p_suite reply-burst`).
    for env in [&[][..], &TCP[..]] {
        for ranks in 1..=8 {
            job(
                "neighbor_varcount_mixed",
                ranks,
                env,
                &format!("neighbor_varcount_mixed: {ranks} ranks"),
            );
        }
    }
}

#[test]
fn a_collective_failing_at_one_rank_alone_keeps_the_counts_in_step() {
    for ranks in [2, 3, 5] {
        job("alone", ranks, &[], &format!("alone: {ranks} ranks"));
    }
    job("alone", 4, &TCP, "alone: 4 ranks");
}

#[test]
fn blocking_collectives_over_shared_memory_stay_in_step_when_a_rank_leaves_one() {
    for ranks in [2, 3, 4, 5, 8] {
        job(
            "node_alone",
            ranks,
            &[],
            &format!("node_alone: {ranks} ranks"),
        );
    }
    job("node_alone", 3, &TCP, "node_alone: 3 ranks");
}

#[test]
fn collectives_hand_their_errors_to_the_error_handler() {
    let out = run(
        bins().check("group_collectives", "handler", 3, &[]),
        Duration::from_secs(30),
    );
    // The last rank's fatal error ends the job with MPI_ERR_ROOT's code,
    // after the user handler saw the other errors.
    assert_eq!(
        out.status.code(),
        Some(ErrorClass::Root.code()),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains("fatal error (ErrorHandler::Fatal)")
            && out
                .stderr
                .contains("MPI_ERR_ROOT: root -1 is not in this communicator"),
        "{}",
        out.stderr
    );
    assert!(
        shm_leftovers().is_empty(),
        "shared segments left: {:?}",
        shm_leftovers()
    );
}
