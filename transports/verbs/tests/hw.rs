//! The RC and UD semantics of `common::rc_semantics` and `common::ud_semantics` on a real RDMA device (or
//! soft-RoCE): opt-in, as no machine of the project has one. Run with
//! `OXMPI_VERBS_DEVICE=<device> cargo test -p oxmpi-verbs --features
//! rdma-core --test hw -- --ignored`; it fails loudly when the device it
//! was asked to use is missing or unset, never passes having done nothing.
#![cfg(feature = "rdma-core")]

mod common;

use oxmpi_verbs::rdma_core::{RdmaNic, Selection};

#[test]
#[ignore = "requires an RDMA device: set OXMPI_VERBS_DEVICE and run with --ignored"]
fn rc_semantics_on_a_device() {
    let device = std::env::var("OXMPI_VERBS_DEVICE")
        .expect("OXMPI_VERBS_DEVICE must name the RDMA device to test (e.g. rxe0)");
    let selection = Selection::from_env().expect("valid OXMPI_VERBS_* values");
    let nic = RdmaNic::open(&selection)
        .expect("opening the device")
        .unwrap_or_else(|| {
            panic!("RDMA device {device} not found: run with OXMPI_VERBOSE=1 to see why")
        });
    common::rc_semantics(&nic, &nic);
    common::ud_semantics(&nic, &nic);
}
