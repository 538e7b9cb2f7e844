//! A token passes around all ranks several times; each rank adds its rank
//! to it, and rank 0 checks the sum after every lap.
//!
//! `oxrun -n 4 target/release/examples/ring [laps]`

use oxmpi::{Error, ErrorClass};
use std::process::ExitCode;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ring: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> oxmpi::Result<()> {
    let laps: u64 = match std::env::args().nth(1) {
        Some(a) => a.parse().map_err(|_| {
            Error::new(ErrorClass::Arg, format!("laps must be a number, not {a:?}"))
        })?,
        None => 10,
    };
    let universe = oxmpi::initialize()?;
    let world = universe.world();
    let (rank, size) = (world.rank(), world.size());
    let next = world.process_at_rank((rank + 1) % size);
    let prev = world.process_at_rank((rank + size - 1) % size);
    let per_lap: u64 = (0..size as u64).sum();
    let mut token: u64 = 0;
    for lap in 1..=laps {
        if rank == 0 {
            next.send(&token)?;
            token = prev.receive::<u64>()?.0;
            if token != per_lap * lap {
                return Err(Error::new(
                    ErrorClass::Other,
                    format!(
                        "after lap {lap} the token is {token}, expected {}",
                        per_lap * lap
                    ),
                ));
            }
        } else {
            token = prev.receive::<u64>()?.0 + rank as u64;
            next.send(&token)?;
        }
    }
    if rank == 0 {
        println!("ring of {size} ranks: {laps} laps, token {token}: ok");
    }
    universe.finalize()
}
