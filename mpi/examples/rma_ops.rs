//! One rank, N one-sided operations on its own window under a shared
//! lock, each with its flush: for counting the instructions of an
//! operation on the direct path (the difference of two runs under
//! `valgrind --tool=callgrind`, of N and 2N, over N; a one-rank job,
//! since under valgrind a peer's window is not mapped and two ranks
//! take active messages). `none` measures the flush alone. Puts, gets
//! (`rget`: request-based, each waited for) and accumulates (sums of `u64`s) move BYTES bytes (8 if not given);
//! fetch-and-op and compare-and-swap one `u64`. `puts` is `put_bw`'s
//! pattern: each of the N rounds is 64 puts from and into 64 consecutive
//! slots, then the flush (divide by 64N for a put). `rgets` is `get_bw`'s
//! pattern: each of the N rounds is 64 `rget`s into 64 consecutive slots,
//! one `wait_all`, then the flush (divide by 64N for a get). The
//! operation is told apart once, before the loop, so that the loop costs
//! every operation the same. With `lock` after BYTES each operation is
//! in a lock of its own instead (exclusive for fop and cas, shared for
//! the others, as `oxbench --sync lock`), then an unlock: `none` then
//! measures the lock and unlock alone.
//!
//! `target/release/examples/rma_ops fop|cas|put|puts|get|rget|rgets|acc|none N [BYTES] [lock]`

use oxmpi::collective::SystemOperation;
use oxmpi::rma::{LockType, Window};
use oxmpi::Info;

/// Operations per flush in `puts` and `rgets`, as in OSU's `put_bw` and
/// `get_bw`.
const WINDOW: usize = 64;

/// The operation each round does before its flush.
#[derive(Clone, Copy)]
enum Operation {
    FetchAndOp,
    CompareAndSwap,
    Put,
    Get,
    Accumulate,
    Rget,
    Rgets,
    Puts,
    /// The flush alone.
    Nothing,
}

impl Operation {
    /// The operation the command line names; anything else is the flush
    /// alone, as `none`.
    fn named(name: &str) -> Operation {
        match name {
            "fop" => Operation::FetchAndOp,
            "cas" => Operation::CompareAndSwap,
            "put" => Operation::Put,
            "get" => Operation::Get,
            "acc" => Operation::Accumulate,
            "rget" => Operation::Rget,
            "rgets" => Operation::Rgets,
            "puts" => Operation::Puts,
            _ => Operation::Nothing,
        }
    }
}

fn main() -> oxmpi::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let what = Operation::named(args.get(1).map_or("", String::as_str));
    let n: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(1);
    let bytes: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(8);
    let lock_each = args.get(4).is_some_and(|s| s == "lock");
    let lock_type = match what {
        Operation::FetchAndOp | Operation::CompareAndSwap => LockType::Exclusive,
        _ => LockType::Shared,
    };
    let universe = oxmpi::initialize()?;
    let world = universe.world();
    let window = Window::allocate(&world, 16 + WINDOW * bytes.max(8), 1, &Info::new())?;
    if !lock_each {
        window.lock(LockType::Shared, 0, 0)?;
    }
    let mut old = 0u64;
    let data = vec![7u8; bytes];
    let mut buf = vec![0u8; bytes];
    let mut slots = vec![0u8; WINDOW * bytes];
    let ones = vec![1u64; bytes / 8];
    for i in 0..n {
        if lock_each {
            window.lock(lock_type, 0, 0)?;
        }
        match what {
            Operation::FetchAndOp => {
                window.fetch_and_op(&1u64, &mut old, 0, 0, SystemOperation::sum())?
            }
            Operation::CompareAndSwap => window.compare_and_swap(&(i + 1), &i, &mut old, 0, 8)?,
            Operation::Put => window.put(&data[..], 0, 16)?,
            Operation::Get => window.get(&mut buf[..], 0, 16)?,
            Operation::Accumulate => window.accumulate(&ones[..], 0, 16, SystemOperation::sum())?,
            // A request-based get waited for at once, as `get_bw` does
            // for a window of them.
            Operation::Rget => oxmpi::request::scope(|scope| {
                oxmpi::request::wait_all(vec![window.rget(scope, &mut buf[..], 0, 16)?]).map(drop)
            })?,
            Operation::Puts => {
                for (j, slot) in slots.chunks(bytes.max(1)).enumerate() {
                    window.put(slot, 0, j * bytes)?;
                }
            }
            Operation::Rgets => oxmpi::request::scope(|scope| {
                let mut requests = Vec::with_capacity(WINDOW);
                for (j, slot) in slots.chunks_mut(bytes.max(1)).enumerate() {
                    requests.push(window.rget(scope, slot, 0, 16 + j * bytes)?);
                }
                oxmpi::request::wait_all(requests).map(drop)
            })?,
            Operation::Nothing => {}
        }
        if lock_each {
            window.unlock(0)?;
        } else {
            window.flush(0)?;
        }
    }
    if !lock_each {
        window.unlock(0)?;
    }
    if !window.direct_access() {
        return Err(oxmpi::Error::new(
            oxmpi::ErrorClass::Other,
            "the window took active messages, not the direct path: the counts would not be its",
        ));
    }
    window.free()?;
    Ok(())
}
