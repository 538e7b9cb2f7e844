//! Ranks 0 and 1 bounce a message of each size back and forth, check every
//! byte, and rank 0 prints the one-way time.
//!
//! `oxrun -n 2 target/release/examples/pingpong`

use oxmpi::{Error, ErrorClass};
use std::process::ExitCode;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pingpong: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> oxmpi::Result<()> {
    let universe = oxmpi::initialize()?;
    let world = universe.world();
    if world.size() < 2 {
        return Err(Error::new(
            ErrorClass::Comm,
            "pingpong needs at least 2 ranks",
        ));
    }
    let rank = world.rank();
    if rank > 1 {
        return universe.finalize();
    }
    let peer = world.process_at_rank(1 - rank);
    const ROUNDS: usize = 100;
    for size in [0usize, 1, 8, 1024, 64 * 1024, 1 << 20, 4 << 20] {
        let mut buf = vec![0u8; size];
        let start = oxmpi::time();
        for round in 0..ROUNDS {
            let pattern = |i: usize| (i.wrapping_mul(31) ^ round) as u8;
            if rank == 0 {
                buf.iter_mut()
                    .enumerate()
                    .for_each(|(i, b)| *b = pattern(i));
                peer.send(&buf[..])?;
                let status = peer.receive_into(&mut buf[..])?;
                let back = |i: usize| pattern(i).wrapping_add(1);
                if status.byte_count() != size || buf.iter().enumerate().any(|(i, &b)| b != back(i))
                {
                    return Err(Error::new(
                        ErrorClass::Other,
                        format!("{size}-byte message came back wrong in round {round}"),
                    ));
                }
            } else {
                let status = peer.receive_into(&mut buf[..])?;
                if status.byte_count() != size
                    || buf.iter().enumerate().any(|(i, &b)| b != pattern(i))
                {
                    return Err(Error::new(
                        ErrorClass::Other,
                        format!("{size}-byte message arrived wrong in round {round}"),
                    ));
                }
                buf.iter_mut().for_each(|b| *b = b.wrapping_add(1));
                peer.send(&buf[..])?;
            }
        }
        if rank == 0 {
            let one_way_us = (oxmpi::time() - start) / (2 * ROUNDS) as f64 * 1e6;
            println!("{size:>9} bytes {one_way_us:>10.2} us");
        }
    }
    universe.finalize()
}
