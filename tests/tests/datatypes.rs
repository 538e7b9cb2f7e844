//! Derived datatypes in real jobs of 2 ranks through oxrun: every
//! constructor and types nested three deep sent, received, packed and
//! unpacked against a reference type map, derived structs with padding,
//! external32, and bad arguments (`datatype_suite`), over the default
//! transports (shared memory) and over TCP.

use oxmpi_jobs::{run, shm_leftovers, Binaries};
use std::process::Command;
use std::time::Duration;

fn datatype_suite(transports: &str) {
    let bins = Binaries::new(env!("CARGO_BIN_EXE_datatype_suite"));
    let mut c = Command::new(bins.oxrun());
    c.args(["-n", "2"])
        .arg(bins.bin("datatype_suite"))
        .env("OXMPI_TRANSPORTS", transports);
    run(c, Duration::from_secs(120)).assert_success();
    assert!(
        shm_leftovers().is_empty(),
        "shared segments left: {:?}",
        shm_leftovers()
    );
}

#[test]
fn datatypes_over_shared_memory() {
    datatype_suite("shm,tcp");
}

#[test]
fn datatypes_over_tcp() {
    datatype_suite("tcp");
}
