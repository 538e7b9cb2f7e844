//! Large non-contiguous messages as real jobs of 2 ranks through oxrun:
//! the checks of the `stream_suite` program over the default transports
//! (shared memory) and over TCP alone — about 64 MiB through strided,
//! indexed and struct datatypes, byte for byte, with any-source receives,
//! probes and truncation, and a bound on the peak memory a 64 MiB strided
//! message adds (it moves in pieces, not as a whole packed copy).

use oxmpi_jobs::{run, shm_leftovers, Binaries};
use std::time::Duration;

fn bins() -> Binaries {
    Binaries::new(env!("CARGO_BIN_EXE_stream_suite"))
}

/// Runs the check; it must succeed, say `expected` and leave nothing
/// behind. Returns its standard output.
fn job(check: &str, env: &[(&str, &str)], expected: &str) -> String {
    let out = run(
        bins().check("stream_suite", check, 2, env),
        Duration::from_secs(300),
    );
    out.assert_success();
    assert!(out.stdout.contains(expected), "{}", out.stdout);
    assert!(
        shm_leftovers().is_empty(),
        "shared segments left: {:?}",
        shm_leftovers()
    );
    out.stdout.clone()
}

const TCP: [(&str, &str); 1] = [("OXMPI_TRANSPORTS", "tcp")];

#[test]
fn large_noncontiguous_messages_over_shared_memory() {
    job("large", &[], "every message landed");
}

#[test]
fn large_noncontiguous_messages_over_tcp() {
    job("large", &TCP, "every message landed");
}

#[test]
fn a_64_mib_strided_message_adds_little_peak_memory() {
    for env in [&[][..], &TCP[..]] {
        let out = job("memory", env, "VmHWM");
        eprint!("{env:?}: {out}");
    }
}
