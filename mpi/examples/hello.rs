//! Every rank says hello; rank 0 collects one greeting from each other rank
//! and checks that all arrived.
//!
//! `oxrun -n 4 target/release/examples/hello`

use std::process::ExitCode;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("hello: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> oxmpi::Result<()> {
    let universe = oxmpi::initialize()?;
    let world = universe.world();
    let (rank, size) = (world.rank(), world.size());
    let host = oxmpi::processor_name()?;
    if rank == 0 {
        let mut seen = vec![false; size as usize];
        seen[0] = true;
        println!("hello from rank 0 of {size} on {host}");
        for _ in 1..size {
            let (from, status) = world.any_process().receive::<i32>()?;
            if from != status.source_rank() || seen[from as usize] {
                return Err(oxmpi::Error::new(
                    oxmpi::ErrorClass::Other,
                    format!(
                        "unexpected greeting {from} from rank {}",
                        status.source_rank()
                    ),
                ));
            }
            seen[from as usize] = true;
            println!("rank {from} says hello");
        }
        println!("all {size} ranks said hello");
    } else {
        world.process_at_rank(0).send(&rank)?;
    }
    universe.finalize()
}
