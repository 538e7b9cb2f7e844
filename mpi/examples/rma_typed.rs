//! Rank 0 puts into a vector target layout in rank 1's window — BLOCKS
//! blocks of 8 bytes, 16 bytes apart (1024 if not given) — N times, each
//! put with its flush, under `lock_all`, and prints the median and the
//! fastest round (microseconds). For measuring a typed transfer over
//! active messages (run with `OXMPI_TRANSPORTS=tcp`): wall time in
//! alternating runs of two builds, or instructions under
//! `valgrind --tool=callgrind` (the difference of runs of N and 2N, over
//! N). Rank 1 waits in a barrier meanwhile, which applies the puts.
//!
//! `oxrun -n 2 target/release/examples/rma_typed N [BLOCKS]`

use oxmpi::datatype::UserDatatype;
use oxmpi::rma::{TargetLayout, Window};
use oxmpi::traits::*;
use oxmpi::{Error, ErrorClass, Info};
use std::time::Instant;

fn main() -> oxmpi::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let n: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(1);
    let blocks: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(1024);
    let universe = oxmpi::initialize()?;
    let world = universe.world();
    if world.size() != 2 {
        return Err(Error::new(ErrorClass::Other, "rma_typed runs on 2 ranks"));
    }
    let count = i32::try_from(blocks)
        .map_err(|_| Error::new(ErrorClass::Count, format!("{blocks} blocks")))?;
    let window = Window::allocate(&world, 16 * blocks, 1, &Info::new())?;
    let vector = UserDatatype::vector(count, 1, 2, &u64::equivalent_datatype())?;
    let data = vec![7u64; blocks];
    if world.rank() == 0 {
        let mut rounds = Vec::with_capacity(n);
        window.lock_all(0)?;
        for _ in 0..n {
            let start = Instant::now();
            window.put_typed(&data[..], 1, 0, TargetLayout::new(1, &vector))?;
            window.flush(1)?;
            rounds.push(start.elapsed().as_secs_f64() * 1e6);
        }
        window.unlock_all()?;
        rounds.sort_by(f64::total_cmp);
        if let (Some(fastest), Some(median)) = (rounds.first(), rounds.get(n / 2)) {
            println!(
                "{blocks} blocks of 8 B, 16 B apart, {n} puts: median {median:.2} us, fastest {fastest:.2} us"
            );
        }
    }
    world.barrier()?;
    window.free()?;
    Ok(())
}
