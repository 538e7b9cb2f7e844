//! Buffered sends, persistent requests, send-receive-replace and element
//! counts as real jobs through oxrun: the checks of `p2p_modes` with 2 to
//! 4 ranks, over TCP (`OXMPI_TRANSPORTS=tcp`; `shm.rs` runs them over
//! shared memory).

use oxmpi_jobs::{run, Binaries};
use std::process::Command;
use std::time::Duration;

fn bins() -> Binaries {
    Binaries::new(env!("CARGO_BIN_EXE_p2p_modes"))
}

fn oxrun(ranks: usize, check: &str) -> Command {
    let bins = bins();
    let mut c = Command::new(bins.oxrun());
    c.arg("-n")
        .arg(ranks.to_string())
        .arg(bins.bin("p2p_modes"))
        .arg(check)
        .env("OXMPI_TRANSPORTS", "tcp");
    c
}

fn modes(check: &str, ranks: usize) {
    run(oxrun(ranks, check), Duration::from_secs(120)).assert_success();
}

#[test]
fn buffered_sends_return_before_the_receives_are_posted() {
    modes("buffered", 2);
}

#[test]
fn buffered_sends_with_a_small_eager_limit() {
    let mut c = oxrun(3, "buffered");
    c.env("OXMPI_TCP_EAGER_LIMIT", "1000");
    run(c, Duration::from_secs(120)).assert_success();
}

#[test]
fn buffered_sends_to_everyone_before_any_receive() {
    modes("buffered-all", 4);
}

#[test]
fn buffered_overflow_is_an_error_and_the_job_goes_on() {
    modes("buffered-overflow", 2);
}

#[test]
fn buffered_sends_from_four_threads() {
    modes("buffered-threads", 2);
}

#[test]
fn persistent_requests_restarted_a_thousand_times() {
    modes("persistent", 2);
}

#[test]
fn persistent_requests_around_a_ring() {
    modes("persistent-ring", 2);
    modes("persistent-ring", 4);
}

#[test]
fn send_receive_replace_around_a_ring_of_three() {
    modes("replace-ring", 3);
}

#[test]
fn elements_equal_counts_for_basic_types() {
    modes("elements", 2);
}
