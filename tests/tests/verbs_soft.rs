//! The soft verbs provider across processes: `verbs_soft` (see its module
//! docs) run as a two-rank job through oxrun, SEND/RECV, RDMA WRITE and
//! READ, and atomics between the ranks' soft NICs, each rank checking
//! its own results.

use oxmpi_jobs::{run, shm_leftovers, Binaries};
use std::process::Command;
use std::time::Duration;

#[test]
fn soft_verbs_between_two_processes() {
    let bins = Binaries::new(env!("CARGO_BIN_EXE_verbs_soft"));
    let mut c = Command::new(bins.oxrun());
    c.args(["--tag-output", "-n", "2"])
        .arg(bins.bin("verbs_soft"));
    run(c, Duration::from_secs(60)).assert_success();
    assert!(
        shm_leftovers().is_empty(),
        "shared segments left: {:?}",
        shm_leftovers()
    );
}
