//! The `oxbench` program; see the `oxmpi_benches` crate docs and
//! `oxbench --help`.

#![deny(unsafe_code)]

use oxmpi_benches::cli::{self, Command, USAGE};
use oxmpi_benches::{compare, memory, mpi_bench, raw_shm, raw_tcp, suite};
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Result<Vec<String>, _> = std::env::args_os()
        .skip(1)
        .map(|a| a.into_string())
        .collect();
    let parsed = match args {
        Ok(args) => cli::parse(&args),
        Err(bad) => Err(cli::UsageError(format!(
            "argument {bad:?} is not valid UTF-8"
        ))),
    };
    match parsed {
        Err(e) => {
            eprintln!("oxbench: {e}\n\n{USAGE}");
            ExitCode::from(2)
        }
        Ok(Command::Help) => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        Ok(Command::Mpi(benchmark, options)) => mpi_bench::main(benchmark, &options),
        Ok(Command::RawTcp(benchmark, options)) => raw_tcp::main(benchmark, &options),
        Ok(Command::RawTcpPeer {
            benchmark,
            options,
            port,
            token,
        }) => raw_tcp::peer_main(benchmark, &options, port, token),
        Ok(Command::RawShm(benchmark, options)) => raw_shm::main(benchmark, &options),
        Ok(Command::RawShmPeer { options, parent }) => raw_shm::peer_main(&options, parent),
        Ok(Command::Compare(options)) => compare::main(&options),
        Ok(Command::Suite(options)) => suite::main(&options),
        Ok(Command::Memory(options)) => memory::main(&options),
    }
}
