//! The job-test matrix and oxbench over the verbs transport on a real RDMA
//! device (see the crate docs). A program, not a libtest harness: it
//! prints one line per check and each of oxbench's tables as its run
//! ends, and exits with 0 when everything passed or it skipped, saying
//! why.

use oxmpi_hw_tests::{run_benchmark, Presence, BENCHMARKS, COMMAND, MATRIX};
use oxmpi_jobs::Binaries;
use std::path::Path;
use std::process::ExitCode;

fn main() -> ExitCode {
    let (device, port) = match Presence::detect() {
        Ok(Presence::Found { device, port }) => (device, port),
        Ok(other) => {
            let why = other.skip_reason().unwrap_or_default();
            println!("hw-tests: skipped: {why}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            println!("hw-tests: FAILED: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Discovery finds a device only in a build with rdma-core support,
    // which is the build that has this crate's binaries.
    let Some(any_bin) = option_env!("CARGO_BIN_EXE_hw_oxbench") else {
        println!(
            "hw-tests: FAILED: {device} was found, but this build has none of the hw_ \
             binaries (cargo feature rdma-core)"
        );
        return ExitCode::FAILURE;
    };
    let oxrun = Path::new(any_bin).with_file_name("oxrun");
    if !oxrun.is_file() {
        println!(
            "hw-tests: FAILED: {} is missing: build it with `cargo build -p oxmpi-launcher`",
            oxrun.display()
        );
        return ExitCode::FAILURE;
    }
    let bins = Binaries::new(any_bin);
    println!(
        "hw-tests: verbs over rdma-core on {device} port {} ({:?}, MTU {}, LID {}, GID index {} {})",
        port.port,
        port.link_layer,
        port.active_mtu.bytes(),
        port.lid,
        port.gid.index,
        port.gid.gid
    );
    let mut failed = 0;
    for check in MATRIX {
        match check.run(&bins) {
            Ok(took) => println!("hw-tests: {} ok ({took:.1?})", check.name()),
            Err(why) => {
                failed += 1;
                println!("hw-tests: FAILED: {why}");
            }
        }
    }
    if cfg!(debug_assertions) {
        println!(
            "hw-tests: this build of oxmpi is not optimized: for figures to compare, run `{COMMAND}`"
        );
    }
    for benchmark in BENCHMARKS {
        println!("hw-tests: oxbench {benchmark}, 2 ranks, verbs over rdma-core on {device}");
        match run_benchmark(&bins, benchmark) {
            Ok(table) => print!("{table}"),
            Err(why) => {
                failed += 1;
                println!("hw-tests: FAILED: {why}");
            }
        }
    }
    let total = MATRIX.len() + BENCHMARKS.len();
    println!(
        "hw-tests: {} of {total} checks and benchmarks passed on {device}",
        total - failed
    );
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
