//! `verbs_probe`: shows which RDMA device, port and GID the verbs transport
//! would use on this machine, as chosen from `OXMPI_VERBS_DEVICE`,
//! `OXMPI_VERBS_PORT` and `OXMPI_VERBS_GID_INDEX`, or that there is none
//! and why (the reason also goes to standard error under `OXMPI_VERBOSE=1`,
//! as it will when a job starts). Exits with 1 and the error's message
//! when a variable's value is invalid.

use oxmpi_verbs::rdma_core::{discover, Discovery, Selection};
use std::process::ExitCode;

fn main() -> ExitCode {
    match Selection::from_env().and_then(|s| discover(&s)) {
        Ok(Discovery::Found { device, port }) => {
            println!(
                "device {device} port {} ({:?}, MTU {}, LID {}) GID index {} {} ({:?})",
                port.port,
                port.link_layer,
                port.active_mtu.bytes(),
                port.lid,
                port.gid.index,
                port.gid.gid,
                port.gid.kind
            );
            ExitCode::SUCCESS
        }
        Ok(Discovery::NoDevice(why)) => {
            println!("{why}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("verbs_probe: {e}");
            ExitCode::FAILURE
        }
    }
}
