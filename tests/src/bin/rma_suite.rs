//! One-sided communication (RMA) run as real jobs: `rma_suite CHECK [N]`,
//! started by the harness through oxrun. Every result is compared with a
//! reference each rank computes alone from what every rank writes (a
//! function of its rank). A check exits non-zero, saying why, when
//! something is wrong.
//!
//! Checks: `ops` (every operation under every synchronization mode, on
//! windows of every kind: created on user memory, allocated, allocated
//! shared, and dynamic with user memory attached; a derived origin
//! datatype, and a put and a get through a target datatype; the
//! request-based operations refused in fence and start epochs),
//! `operations` (accumulate, get_accumulate and fetch_and_op with every
//! predefined operation, REPLACE and NO_OP on several types, in turn
//! under exclusive locks and at once under a shared lock, against
//! `reduce_local_into`), `atomic` (every
//! rank does N fetch-and-op and N accumulate sums on one element under
//! shared locks: exact totals, and the fetched values all distinct),
//! `regions` (every rank does N sums of doubles through a derived origin
//! datatype and N products of integers, overlapping spans across many
//! regions, under shared locks, with no-op fetches meanwhile: exact
//! results),
//! `spinlock` (a compare-and-swap lock guards N non-atomic increments by
//! get and put), `exclusion` (N increments by get and put under rank 0's
//! exclusive lock, alternating with accumulates of 4-byte integers and
//! fetch-and-op of doubles under its shared lock: exact totals); these
//! four on an allocated window, or on one of `Window::create` given a
//! third argument `create` (`rma_suite atomic N create`), `large`
//! (puts and gets of 300,000 bytes, at an odd displacement, to the next
//! rank; then an epoch of 48 puts and one of 48 gets of 64 KiB and more
//! to consecutive slots, 3 MiB each, which on shared memory stream past
//! the caches), `by_message` (gets from 16 KiB, whose data travels as
//! point-to-point messages over active messages, and puts from 64 KiB,
//! whose data streams behind their header into the target's window in
//! pieces of at most 1 MiB, at sizes on both sides of each threshold, to
//! the next rank and to the rank itself, contiguous and through derived
//! origin and result datatypes; a window of 64 gets from 16 KiB to just
//! beyond 64 KiB, which the target answers in one poll; accumulates
//! below and from 1 MiB,
//! followed by small ones that must find them applied; refused ones in a
//! dynamic window, after which the next land whole, and a put of two
//! pieces whose first fits a region and whose whole does not, refused
//! before a byte lands), `batches` (N rounds of hundreds of small puts and accumulates
//! whose result depends on their order, and puts beyond one batch,
//! between flushes, read back by `rget`s that are only tested; a put the
//! target refuses amid others, reported at
//! the flush while the others land; a put left queued while its origin
//! waits for a message the target sends only once it sees the put),
//! `typed` (operations with a
//! target datatype against sequential references: a halo exchange of
//! strided columns by `put_typed`, a transpose by one get, accumulates
//! into an indexed target by `accumulate_typed`, a fetching replace of a
//! column, all under fence, where the request-based forms are refused
//! (MPI_ERR_RMA_SYNC); the four request-based forms in a lock_all epoch;
//! target layouts outside the
//! window and signatures that differ, refused with nothing written; a
//! strided put and get and an irregular accumulate too large for one
//! message, then a maximum into the irregular layout), `dynamic` (attach, access, detach; typed operations across
//! a region's end, refused whole),
//! `locations` (`MPI_MINLOC` and `MPI_MAXLOC` accumulates on value-index
//! pairs of five types, under shared locks and fence, with ties, by
//! accumulate, raccumulate, get_accumulate, rget_accumulate, fetch_and_op,
//! accumulate_typed (also into layouts that part a pair's value from its
//! index) and over 1 MiB, against a reference; `MPI_MINLOC` on
//! `MPI_INT`, `MPI_SUM` on pairs and mixed types refused),
//! `synchronization` (the calls no other check makes, each where doing
//! nothing would show, but for two that cannot be shown here: `sync`, a
//! memory fence in the unified model, whose absence x86-64's ordered
//! loads never reveal, and `flush_local` on shared memory, where an
//! `rget` is complete when it returns: `flush_all` completes puts to every target, read
//! after a barrier with the epoch still open, and reports the puts past
//! every target's region of a dynamic window; `flush_local` and
//! `flush_local_all` complete `rget`s; `test` polls a post until the
//! origins' puts are complete, saying no first while they have not
//! completed (a blocking test would hang); `sync` while a target polls its memory;
//! a window's user error handler sees an out-of-range put, which still
//! returns its error, and with Return set again only the error comes
//! back; fences with NOSTORE and NOPUT, and after NOSUCCEED a put is out
//! of any epoch), `fatal_handler` (a new window's handler, fatal
//! though world's is Return, ends the job on an out-of-range put), `refused_sync` (a put its target refuses,
//! by rank 0 alone, followed directly by fence, unlock_all and free: rank
//! 0's call reports it, and every rank's still synchronizes), `epochs`
//! (errors of detach, of attach to a window that is not dynamic, of
//! epochs opened twice, of a start group outside the window or an
//! operation outside it, of a free with an epoch open; lock_all waits
//! for another rank's exclusive lock; lock_all(MODE_NOCHECK); every
//! operation on PROC_NULL does nothing), `attributes`
//! (a new window's error handler is fatal, its making and freeing run
//! no attribute callback of world's; attributes, hints, names, sizes
//! that differ between ranks), `errors`
//! (the error classes of bad calls, after which the window still works)
//! and `passive [create]` (rank 0 computes outside MPI while the others
//! lock, put and unlock a window reached by active messages: run with
//! `OXMPI_ASYNC_PROGRESS=1`), `passive_dynamic` (the same on a dynamic
//! window, which every transport reaches by active messages, each
//! origin's done mark put in an allocated window that needs no progress
//! at the target: run with `OXMPI_ASYNC_PROGRESS=1`) and `lock_race` (`MPI_THREAD_MULTIPLE`: four
//! threads of every rank lock the next rank at once, N rounds, exclusive
//! and shared in turn: exactly one gets the lock each round and the
//! others `MPI_ERR_RMA_SYNC` at once; the winner adds one to the target's
//! counter and unlocks; then thread 0 locks, adds one and unlocks 100 N
//! times while the others lock only when it is inside its unlock, each
//! adding one when it wins: the counters end at N, 100 N and the other
//! threads' wins; over TCP a lock request sent while another thread's
//! unlock was under way queued ahead of its release, and both waited
//! forever).
//!
//! The direct path (windows in shared memory, or user memory by
//! cross-memory attach) and the RDMA path (verbs): `path
//! direct|rdma|messages [direct|rdma|messages]` (which path an allocated
//! window takes, and a created one), `sleeping
//! [create]` (rank 0 sleeps outside MPI, with no progress thread, until
//! the others have locked, put, got, fetched and unlocked its window,
//! allocated or created, and put a done mark last:
//! only the direct and RDMA paths complete that, and a bound makes the messages
//! path fail rather than hang) and `shared` (`allocate_shared`,
//! contiguous and with `alloc_shared_noncontig`: every rank stores into
//! its own part and reads its neighbours' through `shared_query`, the
//! parts follow each other (a store past one's end lands in the next)
//! or are page-aligned, and RMA operations reach the same memory;
//! `shared_query(PROC_NULL)`; the query on an allocated window (its
//! shared memory where the window is reached directly, else an empty
//! part), a created one (empty parts) and a dynamic one (refused); a bad
//! or disagreeing
//! `alloc_shared_noncontig`) and
//! `dropped` (a rank drops its window on user memory without freeing it:
//! an operation of another rank on it then fails with MPI_ERR_RMA_SYNC
//! and the memory, the program's again, is not touched), and on the RDMA
//! path `revoked` (3 ranks: rank 1 drops its window on user memory
//! without freeing it, which revokes its keys; rank 0's put to it fails
//! at the flush with MPI_ERR_RMA_RANGE naming the remote access error,
//! rank 1's memory is not touched, and rank 0 still reaches rank 2).
//! Over TCP, `lost_peer` (2 ranks: rank 1 shuts its connections down in
//! the middle of rank 0's put of 64 MiB, which fails, as do an `rget`
//! sent before it and the flush after it, all with MPI_ERR_PROC_FAILED
//! and within seconds, where they waited forever for the answers; a
//! fence and a free after it fail too, each calling the window's
//! handler once) and `lost_holder`
//! (3 ranks: rank 1 takes rank 0's exclusive lock and shuts its
//! connections down holding it; rank 2's exclusive lock of rank 0 is
//! then granted within seconds, where it waited forever for rank 1's
//! unlock), `lost_pscw` (3 ranks: rank 1 is lost in the middle of
//! rank 0's access epoch to ranks 1 and 2 and before its own access
//! epoch to rank 0: rank 0's complete, wait and a next start fail with
//! MPI_ERR_PROC_FAILED within seconds, and rank 2's wait ends, where
//! complete returned before it told rank 2 and wait waited for ever),
//! and `deferred` (3 ranks: rank 1 holds rank 0's exclusive
//! lock while rank 2 asks for it and sends a put behind its request
//! without waiting for the grant; rank 1, 300 ms later, still reads the
//! slot as it was, and rank 2 then finds rank 1's put done and its own
//! applied: the target holds the operations behind a request until it
//! grants the lock; then the same with rank 2's puts of 64 KiB, 1 MiB
//! and 2 MiB + 8 B into a dynamic window, whose data arrives placed:
//! rank 2's put returns while rank 1 holds the lock, rank 1 finds the
//! range untouched, its own put into it is overwritten by rank 2's once
//! granted, and an uncontended lock, put and unlock land whole too).

use oxmpi::collective::{reduce_local_into, SystemOperation, ValueIndex};
use oxmpi::datatype::{MutView, UserDatatype, View};
use oxmpi::rma::{
    AccumulateOp, CreateFlavor, LockType, MemoryModel, SharedPart, TargetLayout, Window,
    MODE_NOCHECK, MODE_NOPRECEDE, MODE_NOPUT, MODE_NOSTORE, MODE_NOSUCCEED,
};
use oxmpi::traits::*;
use oxmpi::Threading;
use oxmpi::{Color, Communicator, ErrorClass, ErrorHandler, Info, Keyval, Result};
use oxmpi_jobs::checks::{ensure, expect_class, fail, same};
use oxmpi_jobs::program::{run_check, world_returning_errors};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

fn main() -> ExitCode {
    let check = std::env::args().nth(1).unwrap_or_default();
    let n: usize = std::env::args()
        .nth(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or(100);
    // `atomic`, `regions`, `spinlock` and `exclusion` on a window of
    // Window::create rather than Window::allocate.
    let created = std::env::args().nth(3).as_deref() == Some("create");
    // Only `lock_race` calls MPI from several threads at once.
    let threading = if check == "lock_race" {
        Threading::Multiple
    } else {
        Threading::Single
    };
    run_check(&format!("rma_suite {check}"), threading, |universe| {
        let world = world_returning_errors(universe);
        match check.as_str() {
            "ops" => ops(&world),
            "operations" => operations(&world),
            "atomic" => atomic(&world, n, created),
            "regions" => regions(&world, n, created),
            "spinlock" => spinlock(&world, n, created),
            "exclusion" => exclusion(&world, n, created),
            "large" => large(&world),
            "by_message" => by_message(&world),
            "batches" => batches(&world, n),
            "dynamic" => dynamic(&world),
            "typed" => typed(&world),
            "locations" => locations(&world),
            "synchronization" => synchronization(&world),
            "fatal_handler" => fatal_handler(&world),
            "refused_sync" => refused_sync(&world),
            "epochs" => epochs(&world),
            "attributes" => attributes(&world),
            "errors" => errors(&world),
            "passive" => passive(&world, created),
            "passive_dynamic" => passive_dynamic(&world),
            "lock_race" => lock_race(&world, n),
            "path" => path(&world),
            "sleeping" => sleeping(&world),
            "shared" => shared(&world),
            "dropped" => dropped(&world),
            "revoked" => revoked(&world),
            "lost_peer" => lost_peer(&world),
            "lost_holder" => lost_holder(&world),
            "lost_pscw" => lost_pscw(&world),
            "deferred" => deferred(&world),
            other => Err(fail(format!("unknown check {other:?}"))),
        }
    })
}

/// `window`, made with the program's Return error handler (a new window's
/// is fatal, whatever world's): the checks expect errors back.
fn returning(window: Result<Window<'_>>) -> Result<Window<'_>> {
    let window = window?;
    window.set_error_handler(ErrorHandler::Return);
    Ok(window)
}

/// Elements of each rank's window in `ops`.
const LEN: usize = 72;

/// The value rank `rank`'s window starts with at `i`.
fn initial(rank: usize, i: usize) -> u64 {
    (rank as u64) << 32 | (i as u64 * 7 + 3)
}

/// The value origin `rank` sends for element `i`.
fn sent(rank: usize, i: usize) -> u64 {
    (rank as u64 + 1) * 1000 + i as u64
}

/// How an epoch is opened and closed around the operations.
#[derive(Clone, Copy, Debug)]
enum Mode {
    Fence,
    Pscw,
    LockShared,
    LockExclusive,
    LockNocheck,
    LockAll,
    /// lock_all, with a flush after every operation.
    Flush,
}

const MODES: [Mode; 7] = [
    Mode::Fence,
    Mode::Pscw,
    Mode::LockShared,
    Mode::LockExclusive,
    Mode::LockNocheck,
    Mode::LockAll,
    Mode::Flush,
];

/// Every operation on each of the window's regions, from each rank to
/// the next (a ring), under every mode; then each target checks its
/// window and each origin what it fetched.
fn ops(world: &Communicator) -> Result<()> {
    let (rank, size) = (world.rank() as usize, world.size() as usize);
    let target = (rank + 1) % size;
    let origin = (rank + size - 1) % size;
    let start: Vec<u64> = (0..LEN).map(|i| initial(rank, i)).collect();
    for mode in MODES {
        for kind in WINDOW_KINDS {
            let what = format!("{mode:?} on a window {kind:?}");
            let mut memory = start.clone();
            let (window, fetched) = match kind {
                WindowKind::Created | WindowKind::Dynamic => {
                    // Displacements are addresses in a dynamic window.
                    let (window, attached) = if kind == WindowKind::Dynamic {
                        let window = returning(Window::create_dynamic(world, &Info::new()))?;
                        let address = window.attach(&mut memory[..])?;
                        (window, Some(address))
                    } else {
                        let window =
                            returning(Window::create(world, &mut memory[..], 8, &Info::new()))?;
                        (window, None)
                    };
                    let address = attached.unwrap_or(0);
                    let mut addresses = vec![0u64; size];
                    world.all_gather_into(&(address as u64), &mut addresses[..])?;
                    let base = addresses[target] as usize;
                    let at = |i: usize| if attached.is_some() { base + 8 * i } else { i };
                    world.barrier()?;
                    let fetched = epoch(world, &window, mode, target, origin, &at)?;
                    world.barrier()?;
                    if attached.is_some() {
                        window.detach(address)?;
                    }
                    window.free()?;
                    (None, fetched)
                }
                WindowKind::Allocated | WindowKind::Shared => {
                    let window = if kind == WindowKind::Shared {
                        returning(Window::allocate_shared(world, LEN * 8, 8, &Info::new()))?
                    } else {
                        returning(Window::allocate(world, LEN * 8, 8, &Info::new()))?
                    };
                    window.write_local(0, &start)?;
                    world.barrier()?;
                    let fetched = epoch(world, &window, mode, target, origin, &|i| i)?;
                    world.barrier()?;
                    window.read_local(0, &mut memory)?;
                    (Some(window), fetched)
                }
            };
            same(
                &memory,
                &expected_target(rank, origin),
                &format!("{what}: target window"),
            )?;
            same(
                &fetched,
                &expected_fetched(target),
                &format!("{what}: fetched at the origin"),
            )?;
            if let Some(window) = window {
                window.free()?;
            }
        }
    }
    Ok(())
}

/// The kinds of window the operations run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WindowKind {
    /// `Window::create` on user memory.
    Created,
    /// `Window::allocate`.
    Allocated,
    /// `Window::allocate_shared` (contiguous).
    Shared,
    /// `Window::create_dynamic` with the user memory attached.
    Dynamic,
}

const WINDOW_KINDS: [WindowKind; 4] = [
    WindowKind::Created,
    WindowKind::Allocated,
    WindowKind::Shared,
    WindowKind::Dynamic,
];

/// Runs the operations to `target` in an epoch of `mode`, at the target
/// displacement `at(i)` of element `i`; what they fetched, in order.
fn epoch(
    world: &Communicator,
    window: &Window<'_>,
    mode: Mode,
    target: usize,
    origin: usize,
    at: &dyn Fn(usize) -> usize,
) -> Result<Vec<u64>> {
    let t = target as i32;
    match mode {
        Mode::Fence => window.fence(MODE_NOPRECEDE)?,
        Mode::Pscw => {
            window.post(&world.group().include(&[origin as i32])?, 0)?;
            window.start(&world.group().include(&[t])?, 0)?;
        }
        Mode::LockShared => window.lock(LockType::Shared, t, 0)?,
        Mode::LockExclusive => window.lock(LockType::Exclusive, t, 0)?,
        // No other rank locks this target: the ring gives it one origin.
        Mode::LockNocheck => window.lock(LockType::Exclusive, t, MODE_NOCHECK)?,
        Mode::LockAll | Mode::Flush => window.lock_all(0)?,
    }
    let flush = || -> Result<()> {
        if matches!(mode, Mode::Flush) {
            window.flush(t)?;
        }
        Ok(())
    };
    let rank = world.rank() as usize;
    let mine =
        |range: std::ops::Range<usize>| -> Vec<u64> { range.map(|i| sent(rank, i)).collect() };
    let mut fetched = Vec::new();
    // 0..8: put. 8..16: get.
    window.put(&mine(0..8)[..], t, at(0))?;
    flush()?;
    let mut got = [0u64; 8];
    window.get(&mut got[..], t, at(8))?;
    fetched.extend_from_slice(&got);
    // 16..24: accumulate sum; 24..32: get_accumulate sum.
    window.accumulate(&mine(16..24)[..], t, at(16), SystemOperation::sum())?;
    flush()?;
    window.get_accumulate(
        &mine(24..32)[..],
        &mut got[..],
        t,
        at(24),
        SystemOperation::sum(),
    )?;
    fetched.extend_from_slice(&got);
    // 32: fetch_and_op sum; 33: a swap that happens; 34: one that does not.
    let mut one = 0u64;
    window.fetch_and_op(&sent(rank, 32), &mut one, t, at(32), SystemOperation::sum())?;
    fetched.push(one);
    window.compare_and_swap(&sent(rank, 33), &initial(target, 33), &mut one, t, at(33))?;
    fetched.push(one);
    window.compare_and_swap(&sent(rank, 34), &0, &mut one, t, at(34))?;
    fetched.push(one);
    // 35..40: replace; 40..44: no-op fetch.
    window.accumulate(&mine(35..40)[..], t, at(35), AccumulateOp::Replace)?;
    flush()?;
    let mut four = [0u64; 4];
    window.get_accumulate(&[0u64; 0][..], &mut four[..], t, at(40), AccumulateOp::NoOp)?;
    fetched.extend_from_slice(&four);
    // 44..48: rget; 48..52: rget_accumulate max; 52..56: raccumulate
    // xor; 56..60: rput; 60..64: a strided origin (every other element).
    let strided: Vec<u64> = (0..8).map(|i| sent(rank, 60 + i / 2)).collect();
    let every_other = UserDatatype::vector(4, 1, 2, &u64::equivalent_datatype())?;
    let (mut a, mut b) = ([0u64; 4], [0u64; 4]);
    if matches!(mode, Mode::Fence | Mode::Pscw) {
        // Request-based operations are for passive-target epochs (MPI 4.1
        // §12.3.5): refused before anything moves, and the plain forms
        // do their part.
        let refused = |what: &str, outcome: Result<()>| {
            expect_class(outcome, ErrorClass::RmaSync, &format!("{what} in {mode:?}"))
        };
        oxmpi::request::scope(|scope| -> Result<()> {
            refused("rget", window.rget(scope, &mut a[..], t, at(44)).map(drop))?;
            let max = SystemOperation::max();
            let r2 = window.rget_accumulate(scope, &mine(48..52)[..], &mut b[..], t, at(48), max);
            refused("rget_accumulate", r2.map(drop))?;
            let xor = SystemOperation::bitwise_xor();
            let r3 = window.raccumulate(&mine(52..56)[..], t, at(52), xor);
            refused("raccumulate", r3.map(drop))?;
            refused("rput", window.rput(&mine(56..60)[..], t, at(56)).map(drop))
        })?;
        same(
            &[a, b],
            &[[0; 4]; 2],
            "results of refused rget and rget_accumulate",
        )?;
        window.get(&mut a[..], t, at(44))?;
        let max = SystemOperation::max();
        window.get_accumulate(&mine(48..52)[..], &mut b[..], t, at(48), max)?;
        let xor = SystemOperation::bitwise_xor();
        window.accumulate(&mine(52..56)[..], t, at(52), xor)?;
        window.put(&mine(56..60)[..], t, at(56))?;
    } else {
        oxmpi::request::scope(|scope| -> Result<()> {
            let r1 = window.rget(scope, &mut a[..], t, at(44))?;
            let r2 = window.rget_accumulate(
                scope,
                &mine(48..52)[..],
                &mut b[..],
                t,
                at(48),
                SystemOperation::max(),
            )?;
            let r3 =
                window.raccumulate(&mine(52..56)[..], t, at(52), SystemOperation::bitwise_xor())?;
            let r4 = window.rput(&mine(56..60)[..], t, at(56))?;
            oxmpi::request::wait_all(vec![r1, r2, r3, r4])?;
            Ok(())
        })?;
    }
    window.put(
        &View::with_count_and_datatype(&strided[..], 1, &every_other)?,
        t,
        at(60),
    )?;
    fetched.extend_from_slice(&a);
    fetched.extend_from_slice(&b);
    // 64..72: a put into every other element through a target datatype,
    // then a get of the elements between them.
    let even: Vec<u64> = (64..72).step_by(2).map(|i| sent(rank, i)).collect();
    window.put_typed(&even[..], t, at(64), TargetLayout::new(1, &every_other))?;
    flush()?;
    window.get_typed(&mut a[..], t, at(65), TargetLayout::new(1, &every_other))?;
    fetched.extend_from_slice(&a);
    match mode {
        Mode::Fence => window.fence(MODE_NOSUCCEED)?,
        Mode::Pscw => {
            window.complete()?;
            window.wait()?;
        }
        Mode::LockShared | Mode::LockExclusive | Mode::LockNocheck => window.unlock(t)?,
        Mode::LockAll | Mode::Flush => window.unlock_all()?,
    }
    Ok(fetched)
}

/// What `rank`'s window holds after `origin`'s operations.
fn expected_target(rank: usize, origin: usize) -> Vec<u64> {
    (0..LEN)
        .map(|i| {
            let (old, new) = (initial(rank, i), sent(origin, i));
            match i {
                0..8 | 35..40 | 56..60 => new,
                16..33 => old.wrapping_add(new),
                33 => new,
                48..52 => old.max(new),
                52..56 => old ^ new,
                60..64 => sent(origin, i),
                64..72 if i % 2 == 0 => new,
                _ => old,
            }
        })
        .collect()
}

/// What an origin fetches from `target`, in `epoch`'s order.
fn expected_fetched(target: usize) -> Vec<u64> {
    let old = |i: usize| initial(target, i);
    // compare_and_swap returns the old value whether or not it swapped.
    (8..16)
        .chain(24..35)
        .chain(40..52)
        .chain((65..72).step_by(2))
        .map(old)
        .collect()
}

/// Accumulate, get_accumulate and fetch_and_op with every predefined
/// operation that applies, REPLACE and NO_OP, on i32, u8, f64 and i64,
/// from every rank into rank 0 (`typed_accumulate`), compared with
/// `reduce_local_into` applied in rank order.
fn operations(world: &Communicator) -> Result<()> {
    let ops = [
        ("sum", SystemOperation::sum()),
        ("product", SystemOperation::product()),
        ("max", SystemOperation::max()),
        ("min", SystemOperation::min()),
        ("land", SystemOperation::logical_and()),
        ("lor", SystemOperation::logical_or()),
        ("lxor", SystemOperation::logical_xor()),
        ("band", SystemOperation::bitwise_and()),
        ("bor", SystemOperation::bitwise_or()),
        ("bxor", SystemOperation::bitwise_xor()),
    ];
    let integer_only =
        |name: &str| matches!(name, "land" | "lor" | "lxor" | "band" | "bor" | "bxor");
    for (name, op) in ops {
        typed_accumulate::<i32>(world, name, op.into(), |r, i| {
            (r as i32 + 1) * (i as i32 % 3 - 1)
        })?;
        typed_accumulate::<u8>(world, name, op.into(), |r, i| (r + i) as u8 % 4)?;
        typed_accumulate::<i64>(world, name, op.into(), |r, i| ((r as i64) << 33) - i as i64)?;
        if integer_only(name) {
            let window = returning(Window::allocate(world, 64, 8, &Info::new()))?;
            window.fence(0)?;
            let bad = window.accumulate(&[1.5f64][..], 0, 0, op);
            window.fence(MODE_NOSUCCEED)?;
            expect_class(bad, ErrorClass::Op, &format!("{name} on f64"))?;
            window.free()?;
        } else {
            typed_accumulate::<f64>(world, name, op.into(), |r, i| {
                0.5 * (r as f64 + 1.0) + i as f64
            })?;
        }
    }
    typed_accumulate::<i32>(world, "replace", AccumulateOp::Replace, |r, i| {
        (r * 100 + i) as i32
    })?;
    typed_accumulate::<f64>(world, "no_op", AccumulateOp::NoOp, |r, i| {
        (r * 100 + i) as f64
    })?;
    Ok(())
}

/// Every rank's accumulate into rank 0 with `op`, each in its own
/// exclusive epoch, in rank order (a barrier between ranks): even ranks
/// by `accumulate`, odd ranks by `get_accumulate`, and every rank a
/// `fetch_and_op` of one more element; each origin checks what it
/// fetched, and rank 0 its window. Then, but for REPLACE and NO_OP, all
/// ranks at once under a shared lock (each element's updates are atomic,
/// and the values make every order give the same).
fn typed_accumulate<T>(
    world: &Communicator,
    name: &str,
    op: AccumulateOp,
    value: impl Fn(usize, usize) -> T,
) -> Result<()>
where
    T: Equivalence + Copy + PartialEq + std::fmt::Debug + Default,
{
    // Elements 0..N by (get_)accumulate, element N by fetch_and_op.
    const N: usize = 6;
    let (rank, size) = (world.rank() as usize, world.size() as usize);
    let elem = std::mem::size_of::<T>();
    let what = |call: &str| format!("{call} {name} of {}", std::any::type_name::<T>());
    let window = returning(Window::allocate(world, (N + 1) * elem, elem, &Info::new()))?;
    let start: Vec<T> = (0..=N).map(|i| value(size + 1, i)).collect();
    let mine = |r: usize| -> Vec<T> { (0..=N).map(|i| value(r, i)).collect() };
    // What the window holds after the first `turns` ranks' operations.
    let after = |turns: usize| -> Result<Vec<T>> {
        let mut window = start.clone();
        for r in 0..turns {
            match op {
                AccumulateOp::Reduce(op) => reduce_local_into(&mine(r)[..], &mut window[..], op)?,
                AccumulateOp::Replace => window = mine(r),
                AccumulateOp::NoOp => {}
            }
        }
        Ok(window)
    };
    window.write_local(0, &start)?;
    world.barrier()?;
    for turn in 0..size {
        if turn == rank {
            let before = after(rank)?;
            let mut fetched = [T::default(); N + 1];
            window.lock(LockType::Exclusive, 0, 0)?;
            if rank % 2 == 0 {
                window.accumulate(&mine(rank)[..N], 0, 0, op)?;
            } else {
                window.get_accumulate(&mine(rank)[..N], &mut fetched[..N], 0, 0, op)?;
            }
            window.fetch_and_op(&mine(rank)[N], &mut fetched[N], 0, N, op)?;
            window.unlock(0)?;
            same(&fetched[N..], &before[N..], &what("fetch_and_op"))?;
            if rank % 2 == 1 {
                same(&fetched[..N], &before[..N], &what("get_accumulate"))?;
            }
        }
        world.barrier()?;
    }
    let check = |call: &str| -> Result<()> {
        let mut got = vec![T::default(); N + 1];
        window.read_local(0, &mut got)?;
        same(&got, &after(size)?, &what(call))
    };
    if rank == 0 {
        check("accumulate")?;
        window.write_local(0, &start)?;
    }
    world.barrier()?;
    if let AccumulateOp::Reduce(_) = op {
        let mut old = T::default();
        window.lock(LockType::Shared, 0, 0)?;
        window.accumulate(&mine(rank)[..N], 0, 0, op)?;
        window.fetch_and_op(&mine(rank)[N], &mut old, 0, N, op)?;
        window.unlock(0)?;
        world.barrier()?;
        if rank == 0 {
            check("accumulate under a shared lock")?;
        }
    }
    window.free()
}

/// The window of `atomic`, `regions`, `spinlock`, `exclusion` and
/// `passive`: `bytes`
/// zeroed bytes with displacements in units of `unit`, on `memory` that
/// the program lends when `created` (reached on one host by cross-memory
/// attach, whose read-modify-writes take the region mutexes of the
/// window's control segment), else allocated (mapped shared memory on
/// one host).
fn allocated_or_created<'m>(
    world: &Communicator,
    memory: &'m mut Vec<u64>,
    bytes: usize,
    unit: usize,
    created: bool,
) -> Result<Window<'m>> {
    if created {
        *memory = vec![0u64; bytes.div_ceil(8)];
        returning(Window::create(world, &mut memory[..], unit, &Info::new()))
    } else {
        returning(Window::allocate(world, bytes, unit, &Info::new()))
    }
}

/// Every rank does `n` fetch-and-op sums of 1 on element 0 of rank 0 and
/// `n` accumulate sums of 1 on element 1, under a shared lock: both
/// totals are exact, and the values fetched are all different.
fn atomic(world: &Communicator, n: usize, created: bool) -> Result<()> {
    let (rank, size) = (world.rank(), world.size() as usize);
    let mut memory = Vec::new();
    let window = allocated_or_created(world, &mut memory, 16, 8, created)?;
    world.barrier()?;
    let mut fetched = vec![0u64; n];
    window.lock(LockType::Shared, 0, 0)?;
    for f in fetched.iter_mut() {
        window.fetch_and_op(&1u64, f, 0, 0, SystemOperation::sum())?;
        window.accumulate(&[1u64][..], 0, 1, SystemOperation::sum())?;
    }
    window.unlock(0)?;
    world.barrier()?;
    let mut every = vec![0u64; n * size];
    world.all_gather_into(&fetched[..], &mut every[..])?;
    if rank == 0 {
        let mut totals = [0u64; 2];
        window.read_local(0, &mut totals)?;
        let want = (n * size) as u64;
        same(&totals, &[want, want], "fetch_and_op and accumulate totals")?;
        every.sort_unstable();
        same(
            &every,
            &(0..want).collect::<Vec<_>>(),
            "values fetched (sorted)",
        )?;
    }
    window.free()
}

/// Elements of rank 0's window in the `regions` check: `SPAN`-element
/// accumulates at varying places inside `FIELD` elements of each kind,
/// the sums' field from element `SUM_AT`, the products' from
/// `PRODUCT_AT`, each across a page boundary (a region boundary of the
/// shared-memory window) in a window of `REGIONS_WINDOW` elements: some
/// spans start before the boundary and end after it, others start after
/// it, so a span that left its second region unlocked would race.
const FIELD: usize = 256;
const SPAN: usize = 128;
const SUM_AT: usize = 512 - SPAN / 2;
const PRODUCT_AT: usize = 1024 - SPAN / 2;
const REGIONS_WINDOW: usize = 1536;

/// Where rank `rank`'s `i`th sum (of doubles) and product (of `i64`s)
/// start in their fields.
fn region_spans(rank: usize, i: usize) -> (usize, usize) {
    (
        (rank * 37 + i * 11) % (FIELD - SPAN),
        (rank * 53 + i * 7) % (FIELD - SPAN),
    )
}

/// Every rank `n` times, under one shared lock on rank 0, accumulates
/// that no hardware atomic does (so under region mutexes): a sum of
/// `SPAN` doubles 1.0 from a strided origin (a derived datatype) and a
/// product of `SPAN` `i64`s by 3, over spans that overlap other ranks'
/// and cross many regions, starting at different places; and now and
/// then a no-op fetch of doubles, which must find whole numbers (no
/// element seen half-written). The totals are exact: each double counts
/// the sums that covered it, each product is 3 to the number of products
/// (3 is invertible modulo 2^64, so one lost product changes the result).
fn regions(world: &Communicator, n: usize, created: bool) -> Result<()> {
    let (rank, size) = (world.rank() as usize, world.size() as usize);
    let mut memory = Vec::new();
    let window = allocated_or_created(world, &mut memory, REGIONS_WINDOW * 8, 8, created)?;
    if rank == 0 {
        window.write_local(8 * PRODUCT_AT, &[1i64; FIELD][..])?;
    }
    world.barrier()?;
    let every_other = UserDatatype::vector(SPAN as i32, 1, 2, &f64::equivalent_datatype())?;
    let ones = [1.0f64; 2 * SPAN];
    let threes = [3i64; SPAN];
    window.lock(LockType::Shared, 0, 0)?;
    for i in 0..n {
        let (sum_at, product_at) = region_spans(rank, i);
        window.accumulate(
            &View::with_count_and_datatype(&ones[..], 1, &every_other)?,
            0,
            SUM_AT + sum_at,
            SystemOperation::sum(),
        )?;
        window.accumulate(
            &threes[..],
            0,
            PRODUCT_AT + product_at,
            SystemOperation::product(),
        )?;
        if i % 8 == 0 {
            let mut seen = [0f64; SPAN];
            window.get_accumulate(
                &[0f64; 0][..],
                &mut seen[..],
                0,
                SUM_AT + sum_at,
                AccumulateOp::NoOp,
            )?;
            let most = (size * n) as f64;
            if let Some(bad) = seen.iter().find(|v| v.fract() != 0.0 || **v > most) {
                return Err(fail(format!(
                    "a no-op fetch found {bad} in a field of sums of 1.0"
                )));
            }
        }
        window.flush(0)?;
    }
    window.unlock(0)?;
    world.barrier()?;
    if rank == 0 {
        let (mut sums, mut products) = (vec![0u64; FIELD], vec![0u32; FIELD]);
        for r in 0..size {
            for i in 0..n {
                let (sum_at, product_at) = region_spans(r, i);
                sums[sum_at..sum_at + SPAN].iter_mut().for_each(|c| *c += 1);
                products[product_at..product_at + SPAN]
                    .iter_mut()
                    .for_each(|c| *c += 1);
            }
        }
        let want_sums: Vec<f64> = sums.iter().map(|&c| c as f64).collect();
        let want_products: Vec<i64> = products.iter().map(|&c| 3i64.wrapping_pow(c)).collect();
        let mut got_sums = vec![0f64; FIELD];
        let mut got_products = vec![0i64; FIELD];
        window.read_local(8 * SUM_AT, &mut got_sums[..])?;
        window.read_local(8 * PRODUCT_AT, &mut got_products[..])?;
        same(
            &got_sums,
            &want_sums,
            "sums of doubles under region mutexes",
        )?;
        same(
            &got_products,
            &want_products,
            "products of i64s under region mutexes",
        )?;
    }
    window.free()
}

/// A spin lock built with compare-and-swap on element 0 of rank 0 guards
/// a counter at element 1 that ranks increment by get and put: `n`
/// increments each, none lost.
fn spinlock(world: &Communicator, n: usize, created: bool) -> Result<()> {
    let (rank, size) = (world.rank(), world.size() as usize);
    let mut memory = Vec::new();
    let window = allocated_or_created(world, &mut memory, 16, 8, created)?;
    world.barrier()?;
    window.lock_all(0)?;
    let me = rank as u64 + 1;
    for _ in 0..n {
        let mut old = 1u64;
        while old != 0 {
            window.compare_and_swap(&me, &0, &mut old, 0, 0)?;
        }
        let mut counter = [0u64];
        window.get(&mut counter[..], 0, 1)?;
        window.put(&[counter[0] + 1][..], 0, 1)?;
        window.flush(0)?;
        window.compare_and_swap(&0, &me, &mut old, 0, 0)?;
        ensure(old == me, || {
            format!("the lock was {old} while rank {rank} held it")
        })?;
    }
    window.unlock_all()?;
    world.barrier()?;
    if rank == 0 {
        let mut got = [0u64; 2];
        window.read_local(0, &mut got)?;
        same(&got, &[0, (n * size) as u64], "lock word and counter")?;
    }
    window.free()
}

/// Every rank `n` times: under rank 0's exclusive lock, a non-atomic
/// increment (get, then put) of element 0; under its shared lock, an
/// accumulate of an `i32` 1 into bytes 8..12 and a fetch-and-op sum of a
/// `f64` 1 into element 2 (neither a NIC atomic on the RDMA path: the
/// target's accumulate mutex). No increment is lost.
fn exclusion(world: &Communicator, n: usize, created: bool) -> Result<()> {
    let (rank, size) = (world.rank(), world.size() as usize);
    let mut memory = Vec::new();
    let window = allocated_or_created(world, &mut memory, 24, 4, created)?;
    world.barrier()?;
    for _ in 0..n {
        window.lock(LockType::Exclusive, 0, 0)?;
        let mut counter = [0u64];
        window.get(&mut counter[..], 0, 0)?;
        window.put(&[counter[0] + 1][..], 0, 0)?;
        window.unlock(0)?;
        window.lock(LockType::Shared, 0, 0)?;
        window.accumulate(&[1i32][..], 0, 2, SystemOperation::sum())?;
        let mut old = 0f64;
        window.fetch_and_op(&1f64, &mut old, 0, 4, SystemOperation::sum())?;
        window.unlock(0)?;
    }
    world.barrier()?;
    if rank == 0 {
        let want = (n * size) as u64;
        let mut counter = [0u64];
        window.read_local(0, &mut counter)?;
        let mut ints = [0i32];
        window.read_local(8, &mut ints)?;
        let mut doubles = [0f64];
        window.read_local(16, &mut doubles)?;
        same(&counter, &[want], "increments under the exclusive lock")?;
        same(&ints, &[want as i32], "i32 accumulates")?;
        same(&doubles, &[want as f64], "f64 fetch-and-op sums")?;
    }
    window.free()
}

/// Each rank puts 300,000 bytes (more than one RDMA operation carries) at
/// byte 3 of the next rank's window under an exclusive lock, flushes,
/// gets them back in a shared-lock epoch, and after a barrier finds the
/// previous rank's bytes in its own window.
fn large(world: &Communicator) -> Result<()> {
    const LEN: usize = 300_000;
    let (rank, size) = (world.rank() as usize, world.size() as usize);
    let next = ((rank + 1) % size) as i32;
    let bytes = |r: usize| -> Vec<u8> { (0..LEN).map(|i| (i * 7 + r * 13) as u8).collect() };
    let window = returning(Window::allocate(world, LEN + 8, 1, &Info::new()))?;
    window.lock(LockType::Exclusive, next, 0)?;
    window.put(&bytes(rank)[..], next, 3)?;
    window.flush(next)?;
    window.unlock(next)?;
    let mut back = vec![0u8; LEN];
    window.lock(LockType::Shared, next, 0)?;
    window.get(&mut back[..], next, 3)?;
    window.unlock(next)?;
    ensure(back == bytes(rank), || {
        "the bytes read back differ".to_owned()
    })?;
    world.barrier()?;
    let mut mine = vec![0u8; LEN];
    window.read_local(3, &mut mine)?;
    ensure(mine == bytes((rank + size - 1) % size), || {
        "the previous rank's bytes differ".to_owned()
    })?;
    window.free()?;
    streamed(world)
}

/// An epoch of 48 puts of a little over 64 KiB to consecutive slots of
/// the next rank's window, then 48 gets back into consecutive slots,
/// each direction 3 MiB before its flush: more than half of any level-2
/// cache, so that on the direct path the later copies stream past the
/// caches (`oxmpi_shm::window::copy`). Slots of 65560 bytes from
/// displacement 3 make unaligned starts at both ends; every byte is
/// checked at the origin and, after a barrier, at the target.
fn streamed(world: &Communicator) -> Result<()> {
    const SLOT: usize = (64 << 10) + 24;
    const SLOTS: usize = 48;
    const DISP: usize = 3;
    let (rank, size) = (world.rank() as usize, world.size() as usize);
    let next = ((rank + 1) % size) as i32;
    let slot_bytes = |r: usize, j: usize| -> Vec<u8> {
        (0..SLOT)
            .map(|i| (i * 13 + j * 7 + r * 5 + i / 509) as u8)
            .collect()
    };
    let window = returning(Window::allocate(
        world,
        DISP + SLOTS * SLOT,
        1,
        &Info::new(),
    ))?;
    window.lock(LockType::Shared, next, 0)?;
    for j in 0..SLOTS {
        window.put(&slot_bytes(rank, j)[..], next, DISP + j * SLOT)?;
    }
    window.flush(next)?;
    let mut back = vec![0u8; SLOTS * SLOT];
    for (j, slot) in back.chunks_mut(SLOT).enumerate() {
        window.get(slot, next, DISP + j * SLOT)?;
    }
    window.unlock(next)?;
    let differing = |got: &[u8], from: usize| {
        got.chunks(SLOT)
            .enumerate()
            .position(|(j, slot)| slot != slot_bytes(from, j))
    };
    if let Some(j) = differing(&back, rank) {
        return Err(fail(format!("slot {j} of the streamed gets differs")));
    }
    world.barrier()?;
    let mut mine = vec![0u8; SLOTS * SLOT];
    window.read_local(DISP, &mut mine)?;
    if let Some(j) = differing(&mine, (rank + size - 1) % size) {
        return Err(fail(format!(
            "slot {j} of the previous rank's streamed puts differs"
        )));
    }
    window.free()
}

/// The sizes of `by_message`: around 16 KiB (where gets' data starts to
/// travel as point-to-point messages), 64 KiB (the TCP eager limit,
/// where puts' data starts to stream behind their header), 1 MiB (where
/// TCP data lanes start, and a put's data takes a second piece), and
/// beyond 2 MiB (three pieces).
const BY_MESSAGE_SIZES: [usize; 9] = [
    16_383,
    16_384,
    65_535,
    65_536,
    65_537,
    300_001,
    1 << 20,
    (1 << 20) + 24,
    (2 << 20) + 24,
];

/// The bytes `by_message` puts from `rank` in step `step`.
fn by_message_bytes(rank: usize, step: usize, n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| (i * 31 + rank * 7 + step * 3 + i / 251) as u8)
        .collect()
}

/// See the module docs: every size of [`BY_MESSAGE_SIZES`] put and read
/// back, first with the next rank, then with this rank itself, then
/// through derived datatypes; then refusals in a dynamic window.
fn by_message(world: &Communicator) -> Result<()> {
    const DISP: usize = 5;
    /// The bytes of the dynamic window's region, and where operations
    /// that run past its end start.
    const REGION: usize = 1_200_000;
    const NEAR_END: usize = REGION - 10_000;
    let (rank, size) = (world.rank() as usize, world.size() as usize);
    let next = (rank + 1) % size;
    let previous = (rank + size - 1) % size;
    let largest = BY_MESSAGE_SIZES[BY_MESSAGE_SIZES.len() - 1];
    let window = returning(Window::allocate(world, 2 * largest + 64, 1, &Info::new()))?;
    for (step, &n) in BY_MESSAGE_SIZES.iter().enumerate() {
        for (phase, t) in [next, rank].into_iter().enumerate() {
            let sent = by_message_bytes(rank, 2 * step + phase, n);
            window.lock(LockType::Exclusive, t as i32, 0)?;
            window.put(&sent[..], t as i32, DISP)?;
            window.flush(t as i32)?;
            let mut back = vec![0u8; n];
            window.get(&mut back[..], t as i32, DISP)?;
            window.unlock(t as i32)?;
            ensure(back == sent, || {
                format!("{n} bytes put to rank {t} and read back differ")
            })?;
            world.barrier()?;
            let from = if phase == 0 { previous } else { rank };
            let mut mine = vec![0u8; n];
            window.read_local(DISP, &mut mine)?;
            ensure(mine == by_message_bytes(from, 2 * step + phase, n), || {
                format!("the {n} bytes rank {from} put here differ")
            })?;
            world.barrier()?;
        }
    }
    // A window of 64 gets to consecutive slots, at sizes up to TCP's
    // eager limit and one beyond it: the target answers them in one
    // poll, the data of those up to the limit held back and written
    // together (TCP's batch), the one beyond written at once behind
    // what was held.
    const WINDOW_GETS: [usize; 5] = [16_384, 40_000, 65_536, 65_537, 16_383];
    let lens: Vec<usize> = (0..64).map(|k| WINDOW_GETS[k % 5]).collect();
    let total: usize = lens.iter().sum();
    window.write_local(DISP, &by_message_bytes(rank, 1000, total))?;
    world.barrier()?;
    let t = next as i32;
    let mut back = vec![0u8; total];
    window.lock(LockType::Shared, t, 0)?;
    oxmpi::request::scope(|scope| -> Result<()> {
        let mut requests = Vec::with_capacity(lens.len());
        let mut rest = &mut back[..];
        let mut disp = DISP;
        for &n in &lens {
            let (part, after) = std::mem::take(&mut rest).split_at_mut(n);
            requests.push(window.rget(scope, part, t, disp)?);
            rest = after;
            disp += n;
        }
        oxmpi::request::wait_all(requests).map(drop)
    })?;
    window.unlock(t)?;
    same(
        &back,
        &by_message_bytes(next, 1000, total),
        "a window of 64 gets read back",
    )?;
    world.barrier()?;
    // Through derived datatypes: every other word of the origin, into
    // every other word of the result, by request-based gets too.
    for &n in &BY_MESSAGE_SIZES {
        let words = n / 8;
        let every_other = UserDatatype::vector(words as i32, 1, 2, &u64::equivalent_datatype())?;
        let strided: Vec<u64> = (0..2 * words as u64)
            .map(|i| {
                if i % 2 == 0 {
                    (rank as u64) << 40 | i
                } else {
                    u64::MAX
                }
            })
            .collect();
        let expected: Vec<u64> = strided.iter().copied().step_by(2).collect();
        let t = next as i32;
        window.lock(LockType::Shared, t, 0)?;
        window.put(
            &View::with_count_and_datatype(&strided[..], 1, &every_other)?,
            t,
            8,
        )?;
        window.flush(t)?;
        let mut spread = vec![7u64; 2 * words];
        window.get(
            &mut MutView::with_count_and_datatype(&mut spread[..], 1, &every_other)?,
            t,
            8,
        )?;
        let mut halves = vec![0u64; words];
        oxmpi::request::scope(|scope| -> Result<()> {
            let (a, b) = halves.split_at_mut(words / 2);
            let first = window.rget(scope, a, t, 8)?;
            let second = window.rget(scope, b, t, 8 + 8 * (words / 2))?;
            oxmpi::request::wait_all(vec![first, second]).map(drop)
        })?;
        window.unlock(t)?;
        let gaps_kept = spread.iter().skip(1).step_by(2).all(|&w| w == 7);
        let got: Vec<u64> = spread.iter().copied().step_by(2).collect();
        same(&got, &expected, "words read back through a derived type")?;
        same(&halves, &expected, "words read back by two rgets")?;
        ensure(gaps_kept, || {
            "a get through a derived type wrote between its elements".to_owned()
        })?;
        world.barrier()?;
    }
    // Accumulates from 1 MiB travel as messages too, combined as they
    // land (smaller ones in active messages, their data sent from the
    // origin's buffer); the small ones after them must find them applied.
    for words in [32_768usize, 40_000, 131_071, 131_072, 131_075] {
        let t = next as i32;
        let base: Vec<u64> = (0..words as u64).map(|i| i * 3 + rank as u64).collect();
        let strided: Vec<u64> = (0..2 * words as u64).map(|i| i ^ 0x55).collect();
        let every_other = UserDatatype::vector(words as i32, 1, 2, &u64::equivalent_datatype())?;
        window.lock(LockType::Exclusive, t, 0)?;
        window.accumulate(&base[..], t, 8, AccumulateOp::Replace)?;
        window.accumulate(
            &View::with_count_and_datatype(&strided[..], 1, &every_other)?,
            t,
            8,
            SystemOperation::sum(),
        )?;
        window.accumulate(&[1000u64][..], t, 8, SystemOperation::sum())?;
        window.accumulate(&[7u64][..], t, 16, AccumulateOp::Replace)?;
        let mut back = vec![0u64; words];
        window.get(&mut back[..], t, 8)?;
        window.unlock(t)?;
        let mut expected: Vec<u64> = (0..words)
            .map(|i| base[i].wrapping_add(strided[2 * i]))
            .collect();
        expected[0] += 1000;
        expected[1] = 7;
        same(&back, &expected, "accumulates by message, then small ones")?;
        world.barrier()?;
    }
    window.free()?;
    // Refused by the target (a dynamic window: only it knows its
    // regions); the data of a refused put or accumulate is taken and
    // dropped, so the operations after it land whole.
    let mut region = vec![0u8; REGION];
    let dynamic = returning(Window::create_dynamic(world, &Info::new()))?;
    let at = dynamic.attach(&mut region[..])?;
    let mut addresses = vec![0u64; size];
    world.all_gather_into(&[at as u64][..], &mut addresses[..])?;
    let ta = addresses[next] as usize;
    let t = next as i32;
    dynamic.lock(LockType::Shared, t, 0)?;
    // Two pieces (beyond 1 MiB): the first would fit the region, the
    // whole does not. Refused whole, before any byte lands (only this
    // rank writes into the next one's region, and nothing yet).
    let across = vec![9u8; (1 << 20) + 100_000];
    let start = REGION - (1 << 20) - 10;
    dynamic.put(&across[..], t, ta + start)?;
    expect_class(
        dynamic.flush(t),
        ErrorClass::RmaRange,
        "a put of two pieces across a region's end, at the flush",
    )?;
    let mut untouched = vec![1u8; REGION - start];
    dynamic.get(&mut untouched[..], t, ta + start)?;
    ensure(untouched.iter().all(|&b| b == 0), || {
        "a refused put of two pieces wrote into the region".to_owned()
    })?;
    for (step, n) in [20_000, 100_000].into_iter().enumerate() {
        let sent = by_message_bytes(rank, step, n);
        dynamic.put(&sent[..], t, ta + NEAR_END)?;
        expect_class(
            dynamic.flush(t),
            ErrorClass::RmaRange,
            "a put across a region's end, at the flush",
        )?;
        let mut over = vec![0u8; n];
        expect_class(
            dynamic.get(&mut over[..], t, ta + NEAR_END),
            ErrorClass::RmaRange,
            "a get across a region's end",
        )?;
        dynamic.put(&sent[..], t, ta + 1)?;
        dynamic.flush(t)?;
        let mut back = vec![0u8; n];
        dynamic.get(&mut back[..], t, ta + 1)?;
        ensure(back == sent, || {
            format!("{n} bytes put after a refused put and read back differ")
        })?;
    }
    // Refused in an active message (40,000 words) and by message (1 MiB,
    // whose data is taken and dropped, or the origin would wait for its
    // rendezvous forever).
    for words in [131_072usize, 40_000] {
        let refused = vec![1u64; words];
        dynamic.accumulate(&refused[..], t, ta + NEAR_END, SystemOperation::sum())?;
        expect_class(
            dynamic.flush(t),
            ErrorClass::RmaRange,
            &format!("an accumulate of {words} words across a region's end, at the flush"),
        )?;
    }
    let ones = vec![1u64; 40_000];
    dynamic.accumulate(&ones[..], t, ta + 200_000, SystemOperation::sum())?;
    let mut sums = vec![0u64; ones.len()];
    dynamic.get(&mut sums[..], t, ta + 200_000)?;
    same(&sums, &ones, "an accumulate after a refused one")?;
    dynamic.unlock(t)?;
    world.barrier()?;
    dynamic.detach(at)?;
    dynamic.free()
}

/// What `batches` puts at word `i` of the next rank's window in round
/// `round`.
fn batch_value(rank: usize, round: usize, i: usize) -> u64 {
    ((rank as u64) << 40) | ((round as u64) << 20) | i as u64
}

/// The operations an origin issues between synchronizations, which
/// active messages send in batches: see the module docs. Two ranks or
/// more.
fn batches(world: &Communicator, rounds: usize) -> Result<()> {
    /// Words that small operations reach; a large put covers the rest.
    const SMALL: usize = 1024;
    /// Words of the window: the large put (beyond one batch's 64 KiB)
    /// follows the small ones.
    const WORDS: usize = SMALL + 20_000;
    let (rank, size) = (world.rank() as usize, world.size() as usize);
    ensure(size >= 2, || "batches needs two ranks or more".to_owned())?;
    let next = (rank + 1) % size;
    let previous = (rank + size - 1) % size;
    let t = next as i32;
    let window = returning(Window::allocate(world, 8 * WORDS, 8, &Info::new()))?;
    for round in 0..rounds {
        window.lock(LockType::Shared, t, 0)?;
        // Each word is put, then 1 is added to it: applied in another
        // order, the sum would be lost.
        for i in 0..SMALL {
            window.put(&[batch_value(rank, round, i)][..], t, i)?;
            window.accumulate(&[1u64][..], t, i, SystemOperation::sum())?;
        }
        let large: Vec<u64> = (SMALL..WORDS)
            .map(|i| batch_value(rank, round, i))
            .collect();
        window.put(&large[..], t, SMALL)?;
        window.flush(t)?;
        // Read back by 64 gets whose requests are only tested, never
        // waited for (a test sends what is queued); their replies, 160 KiB,
        // come in several messages.
        let mut back = vec![0u64; WORDS];
        let step = WORDS.div_ceil(64);
        oxmpi::request::scope(|scope| -> Result<()> {
            let mut requests = Vec::new();
            for (k, part) in back.chunks_mut(step).enumerate() {
                requests.push(window.rget(scope, part, t, k * step)?);
            }
            let since = Instant::now();
            while let Some(request) = requests.pop() {
                match request.test() {
                    Ok(status) => drop(status?),
                    Err(request) => {
                        requests.push(request);
                        ensure(since.elapsed() < Duration::from_secs(20), || {
                            "after 20 s of tests the gets had not completed".to_owned()
                        })?;
                    }
                }
            }
            Ok(())
        })?;
        window.unlock(t)?;
        let want: Vec<u64> = (0..WORDS)
            .map(|i| batch_value(rank, round, i) + u64::from(i < SMALL))
            .collect();
        same(&back, &want, &format!("round {round}, read back"))?;
    }
    // A put left queued while its origin waits: rank 0 puts a flag into
    // rank 1's window and waits for rank 1's message, which rank 1 sends
    // once its window holds the flag.
    const FLAG: u64 = 0xF1A6;
    world.barrier()?;
    if rank == 0 {
        window.lock(LockType::Shared, 1, 0)?;
        window.put(&[FLAG][..], 1, 0)?;
        let (seen, _) = world.process_at_rank(1).receive::<u64>()?;
        window.unlock(1)?;
        same(&[seen], &[FLAG], "the flag rank 1 saw")?;
    } else if rank == 1 {
        let since = Instant::now();
        let mut word = [0u64];
        while word[0] != FLAG {
            // Polls, so that the put is applied once it arrives.
            world.any_process().immediate_probe()?;
            window.read_local(0, &mut word)?;
            ensure(since.elapsed() < Duration::from_secs(20), || {
                "after 20 s rank 0's put had not arrived".to_owned()
            })?;
        }
        world.process_at_rank(0).send(&word[0])?;
    }
    world.barrier()?;
    window.free()?;
    // A put the target refuses amid others (past the one region of a
    // dynamic window, which only the target checks): reported at the
    // flush, the others applied.
    let mut region = vec![0u64; 4];
    let window = returning(Window::create_dynamic(world, &Info::new()))?;
    let at = window.attach(&mut region[..])?;
    let mut addresses = vec![0u64; size];
    world.all_gather_into(&(at as u64), &mut addresses[..])?;
    let there = addresses[next] as usize;
    window.lock(LockType::Shared, t, 0)?;
    window.put(&[7u64][..], t, there)?;
    window.put(&[8u64][..], t, there + 32)?;
    window.put(&[9u64][..], t, there + 24)?;
    expect_class(
        window.flush(t),
        ErrorClass::RmaRange,
        "a refused put amid others, at the flush",
    )?;
    window.unlock(t)?;
    world.barrier()?;
    window.detach(at)?;
    window.free()?;
    same(
        &region,
        &[7, 0, 0, 9],
        &format!("rank {previous}'s puts around the refused one"),
    )
}

/// Elements of the blocks of `dynamic`'s typed operations of two
/// messages (300,000 bytes each: 600,000 in all, more than one message's
/// 512 KiB) and of the region they are for, which the second block
/// overruns by one element.
const HALF: usize = 75_000;
const THIRD: usize = 3 * HALF - 1;

/// A dynamic window: each rank attaches three buffers, publishes their
/// addresses, every rank writes into the next rank's and reads them
/// back; typed operations across a region's end are refused whole;
/// after a detach, access to it is refused (RMA_RANGE).
fn dynamic(world: &Communicator) -> Result<()> {
    let (rank, size) = (world.rank() as usize, world.size() as usize);
    let target = (rank + 1) % size;
    let mut first = vec![0u32; 16];
    let mut second = vec![0u32; 8];
    let mut third = vec![0u32; THIRD];
    let window = returning(Window::create_dynamic(world, &Info::new()))?;
    ensure(window.create_flavor() == CreateFlavor::Dynamic, || {
        "flavor".into()
    })?;
    let a = window.attach(&mut first[..])?;
    let b = window.attach(&mut second[..])?;
    let c = window.attach(&mut third[..])?;
    let mut addresses = vec![0u64; 3 * size];
    world.all_gather_into(&[a as u64, b as u64, c as u64][..], &mut addresses[..])?;
    let (ta, tb, tc) = (
        addresses[3 * target] as usize,
        addresses[3 * target + 1] as usize,
        addresses[3 * target + 2] as usize,
    );
    let t = target as i32;
    window.lock(LockType::Exclusive, t, 0)?;
    let values: Vec<u32> = (0..16).map(|i| (rank * 100 + i) as u32).collect();
    window.put(&values[..], t, ta)?;
    window.accumulate(&values[..8], t, tb, SystemOperation::sum())?;
    let mut back = vec![0u32; 16];
    window.get(&mut back[..], t, ta)?;
    same(&back, &values, "read back from the attached memory")?;
    // Past the end of the first region: refused by the target.
    let mut over = [0u32; 2];
    expect_class(
        window.get(&mut over[..], t, ta + 60),
        ErrorClass::RmaRange,
        "get across a region's end",
    )?;
    // Elements 0, 8 and 16 of the first region, whose last lies past its
    // end: the target refuses each operation whole, and nothing of the
    // put or the accumulate lands.
    let u32_type = u32::equivalent_datatype();
    let spread = UserDatatype::vector(3, 1, 8, &u32_type)?;
    let across = TargetLayout::new(1, &spread);
    window.put_typed(&[7u32; 3][..], t, ta, across)?;
    expect_class(
        window.flush(t),
        ErrorClass::RmaRange,
        "a typed put across a region's end, at flush",
    )?;
    window.accumulate_typed(&[7u32; 3][..], t, ta, across, SystemOperation::sum())?;
    expect_class(
        window.flush(t),
        ErrorClass::RmaRange,
        "a typed accumulate across a region's end, at flush",
    )?;
    let mut three = [0u32; 3];
    expect_class(
        window.get_typed(&mut three[..], t, ta, across),
        ErrorClass::RmaRange,
        "a typed get across a region's end",
    )?;
    expect_class(
        window.get_accumulate_typed(
            &[7u32; 3][..],
            &mut three[..],
            t,
            ta,
            across,
            AccumulateOp::Replace,
        ),
        ErrorClass::RmaRange,
        "a typed get_accumulate across a region's end",
    )?;
    window.get(&mut back[..], t, ta)?;
    same(
        &back,
        &values,
        "the first region after the refused typed operations",
    )?;
    // Two of them fit.
    let mut two = [0u32; 2];
    let within = UserDatatype::vector(2, 1, 8, &u32_type)?;
    window.get_typed(&mut two[..], t, ta, TargetLayout::new(1, &within))?;
    same(
        &two,
        &[values[0], values[8]],
        "elements 0 and 8 by a typed get",
    )?;
    // Two blocks of 300,000 bytes, the second past the end of the third
    // region: an operation of two messages over active messages, whose
    // first alone would fit. Refused whole, with nothing written (by the
    // call, which asks the target first, or else at the flush).
    let halves = UserDatatype::vector(2, HALF as i32, 2 * HALF as i32, &u32_type)?;
    let big = vec![5u32; 2 * HALF];
    let two_messages = TargetLayout::new(1, &halves);
    expect_class(
        window
            .put_typed(&big[..], t, tc, two_messages)
            .and_then(|()| window.flush(t)),
        ErrorClass::RmaRange,
        "a typed put of two messages across a region's end, at flush",
    )?;
    let sum = SystemOperation::sum();
    expect_class(
        window
            .accumulate_typed(&big[..], t, tc, two_messages, sum)
            .and_then(|()| window.flush(t)),
        ErrorClass::RmaRange,
        "a typed accumulate of two messages across a region's end, at flush",
    )?;
    window.unlock(t)?;
    world.barrier()?;
    window.detach(c)?;
    window.detach(a)?;
    world.barrier()?;
    window.lock(LockType::Shared, t, 0)?;
    expect_class(
        window.get(&mut back[..2], t, ta),
        ErrorClass::RmaRange,
        "get from detached memory",
    )?;
    window.put(&[1u32][..], t, ta)?;
    expect_class(
        window.unlock(t),
        ErrorClass::RmaRange,
        "put to detached memory, at unlock",
    )?;
    world.barrier()?;
    window.detach(b)?;
    window.free()?;
    let source = (rank + size - 1) % size;
    let expected: Vec<u32> = (0..16).map(|i| (source * 100 + i) as u32).collect();
    same(&first, &expected, "first region")?;
    same(&second, &expected[..8], "second region")?;
    same(
        &third,
        &vec![0u32; THIRD],
        "the third region after the refused typed operations",
    )
}

/// Attributes, hints and names, on windows whose sizes and units differ
/// between ranks: ranges are checked against each target's own.
fn attributes(world: &Communicator) -> Result<()> {
    let (rank, size) = (world.rank() as usize, world.size() as usize);
    // A new window's error handler is fatal though world's is Return (MPI
    // 4.1 §12.6.1), and its communicator copy runs none of the program's
    // attribute callbacks (MPI runs them on MPI_Comm_dup only).
    let calls = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let counted = {
        let (copies, deletes) = (calls.clone(), calls.clone());
        Keyval::<u32>::new(
            move |v| {
                copies
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push("copy");
                Ok(Some(*v))
            },
            move |_| {
                deletes
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push("delete");
                Ok(())
            },
        )
    };
    world.set_attribute(&counted, 7)?;
    let window = Window::allocate(world, 8, 8, &Info::new())?;
    ensure(
        matches!(window.error_handler(), ErrorHandler::Fatal),
        || {
            format!(
                "a new window's error handler is {:?}",
                window.error_handler()
            )
        },
    )?;
    window.free()?;
    let seen = calls.lock().unwrap_or_else(|p| p.into_inner()).clone();
    ensure(seen.is_empty(), || {
        format!("a window's making and freeing ran the attribute callbacks {seen:?}")
    })?;
    world.delete_attribute(&counted)?;
    let mut memory = vec![0u8; 8 * (rank + 1)];
    let mut info = Info::new();
    info.set("accumulate_ordering", "none")?;
    let unit = if rank % 2 == 0 { 1 } else { 4 };
    let window = returning(Window::create(world, &mut memory[..], unit, &info))?;
    ensure(window.size() == 8 * (rank + 1), || {
        format!("size {}", window.size())
    })?;
    ensure(window.disp_unit() == unit, || {
        format!("disp unit {}", window.disp_unit())
    })?;
    ensure(window.base() != 0, || "base 0".into())?;
    ensure(window.create_flavor() == CreateFlavor::Create, || {
        "flavor".into()
    })?;
    ensure(window.model() == MemoryModel::Unified, || "model".into())?;
    ensure(window.group().size() == size as i32, || "group".into())?;
    let hints = window.info();
    ensure(hints.get("accumulate_ordering")? == Some("none"), || {
        "accumulate_ordering".into()
    })?;
    ensure(hints.get("no_locks")? == Some("false"), || {
        "no_locks".into()
    })?;
    ensure(window.name()?.is_empty(), || "a name at first".into())?;
    window.set_name("rma attributes")?;
    ensure(window.name()? == "rma attributes", || "name".into())?;
    // The last byte of every target's window, in its own unit.
    window.lock_all(0)?;
    for t in 0..size {
        let t_unit = if t % 2 == 0 { 1 } else { 4 };
        let t_size = 8 * (t + 1);
        let last = (t_size - 4) / t_unit;
        window.put(&[t as u8; 4][..], t as i32, last)?;
        expect_class(
            window.put(&[0u8; 4][..], t as i32, last + 1),
            ErrorClass::RmaRange,
            &format!("4 bytes past the end of rank {t}'s window"),
        )?;
    }
    window.unlock_all()?;
    world.barrier()?;
    let mut tail = [0u8; 4];
    window.read_local(window.size() - 4, &mut tail)?;
    same(&tail, &[rank as u8; 4], "the last bytes of the window")?;
    window.free()?;
    let mut no_locks = Info::new();
    no_locks.set("no_locks", "true")?;
    let window = returning(Window::allocate(world, 8, 8, &no_locks))?;
    expect_class(
        window.lock(LockType::Shared, 0, 0),
        ErrorClass::RmaSync,
        "lock with no_locks",
    )?;
    window.free()?;
    let mut bad = Info::new();
    bad.set("same_size", "perhaps")?;
    expect_class(
        Window::allocate(world, 8, 8, &bad).map(drop),
        ErrorClass::InfoValue,
        "a bad hint",
    )?;
    let mut bad = Info::new();
    bad.set("accumulate_ordering", "raw,wow")?;
    expect_class(
        Window::allocate(world, 8, 8, &bad).map(drop),
        ErrorClass::InfoValue,
        "an accumulate_ordering that is not some of rar, raw, war and waw",
    )?;
    let mut some = Info::new();
    some.set("accumulate_ordering", "rar, waw")?;
    Window::allocate(world, 8, 8, &some)?.free()
}

/// `lock_race`: see the module docs.
fn lock_race(world: &Communicator, n: usize) -> Result<()> {
    const THREADS: usize = 4;
    let window = returning(Window::allocate(world, 8, 8, &Info::new()))?;
    let target = (world.rank() + 1) % world.size();
    let [start, tried, end] = [(); 3].map(|()| Barrier::new(THREADS));
    // Each thread's rounds won, in order.
    let won: Vec<Vec<bool>> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..THREADS)
            .map(|_| {
                scope.spawn(|| -> Result<Vec<bool>> {
                    let mut won = Vec::with_capacity(n);
                    // Every round is run to the end, whatever went wrong,
                    // so that no thread is left at a barrier.
                    let mut first_error = None;
                    for round in 0..n {
                        let lock_type = if round % 2 == 0 {
                            LockType::Exclusive
                        } else {
                            LockType::Shared
                        };
                        start.wait();
                        let locked = window.lock(lock_type, target, 0);
                        won.push(locked.is_ok());
                        // Every thread tried before the winner unlocks.
                        tried.wait();
                        let result = match locked {
                            Ok(()) => window
                                .accumulate(&[1u64][..], target, 0, SystemOperation::sum())
                                .and_then(|()| window.unlock(target)),
                            Err(e) => expect_class(
                                Err::<(), _>(e),
                                ErrorClass::RmaSync,
                                "a lock of a target another thread of the process locks",
                            ),
                        };
                        // The winner has unlocked before the next round.
                        end.wait();
                        if let Err(e) = result {
                            first_error.get_or_insert(e);
                        }
                    }
                    first_error.map_or(Ok(won), Err)
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().map_err(|_| fail("a locking thread panicked"))?)
            .collect::<Result<_>>()
    })?;
    for round in 0..n {
        let winners = won.iter().filter(|w| w[round]).count();
        ensure(winners == 1, || {
            format!("round {round}: {winners} of {THREADS} threads got the lock")
        })?;
    }
    // Locks racing unlocks: thread 0 locks, adds one and unlocks the
    // target, again and again; the others try to lock it only while
    // thread 0 is inside its unlock, so that their locks land in it.
    let rounds = 100 * n;
    let unlocking = AtomicBool::new(false);
    let done = AtomicBool::new(false);
    let wins = AtomicUsize::new(0);
    std::thread::scope(|scope| -> Result<()> {
        let others: Vec<_> = (1..THREADS)
            .map(|_| {
                scope.spawn(|| -> Result<()> {
                    while !done.load(Ordering::Acquire) {
                        if !unlocking.load(Ordering::Acquire) {
                            std::thread::yield_now();
                            continue;
                        }
                        match window.lock(LockType::Exclusive, target, 0) {
                            Ok(()) => {
                                window.accumulate(
                                    &[1u64][..],
                                    target,
                                    0,
                                    SystemOperation::sum(),
                                )?;
                                window.unlock(target)?;
                                wins.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(e) if e.class() == ErrorClass::RmaSync => std::thread::yield_now(),
                            Err(e) => return Err(e),
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        let first = (|| -> Result<()> {
            for _ in 0..rounds {
                while let Err(e) = window.lock(LockType::Exclusive, target, 0) {
                    if e.class() != ErrorClass::RmaSync {
                        return Err(e);
                    }
                    std::thread::yield_now();
                }
                window.accumulate(&[1u64][..], target, 0, SystemOperation::sum())?;
                unlocking.store(true, Ordering::Release);
                let unlocked = window.unlock(target);
                unlocking.store(false, Ordering::Release);
                unlocked?;
            }
            Ok(())
        })();
        done.store(true, Ordering::Release);
        others
            .into_iter()
            .try_for_each(|t| t.join().map_err(|_| fail("a racing thread panicked"))?)?;
        first
    })?;
    // The target's counter: this rank's winners' sums came to the next
    // rank, the previous rank's here.
    let size = world.size() as usize;
    let mut all_wins = vec![0u64; size];
    world.all_gather_into(
        &[wins.load(Ordering::Relaxed) as u64][..],
        &mut all_wins[..],
    )?;
    let previous = (world.rank() as usize + size - 1) % size;
    world.barrier()?;
    let mut counter = [0u64];
    window.read_local(0, &mut counter)?;
    same(
        &counter[..],
        &[(n + rounds) as u64 + all_wins[previous]][..],
        "the counter of the winners' sums",
    )?;
    window.free()
}

/// The error classes of bad calls; the window works afterwards.
fn errors(world: &Communicator) -> Result<()> {
    let size = world.size();
    let window = returning(Window::allocate(world, 64, 8, &Info::new()))?;
    expect_class(
        window.put(&[1u64][..], 0, 0),
        ErrorClass::RmaSync,
        "put outside an epoch",
    )?;
    expect_class(window.unlock(0), ErrorClass::RmaSync, "unlock without lock")?;
    expect_class(window.flush(0), ErrorClass::RmaSync, "flush without lock")?;
    expect_class(
        window.complete(),
        ErrorClass::RmaSync,
        "complete without start",
    )?;
    expect_class(window.wait(), ErrorClass::RmaSync, "wait without post")?;
    expect_class(
        window.fence(MODE_NOCHECK),
        ErrorClass::Assert,
        "fence with MODE_NOCHECK",
    )?;
    expect_class(
        window.lock(LockType::Shared, size, 0),
        ErrorClass::Rank,
        "lock of a rank past the group",
    )?;
    window.lock(LockType::Shared, 0, 0)?;
    expect_class(
        window.lock(LockType::Shared, 0, 0),
        ErrorClass::RmaSync,
        "a second lock of a target",
    )?;
    expect_class(
        window.put(&[1u64][..], 0, 8),
        ErrorClass::RmaRange,
        "put at the end",
    )?;
    expect_class(
        window.put(&[1u64; 2][..], 0, 7),
        ErrorClass::RmaRange,
        "put across the end",
    )?;
    expect_class(
        window.put(&[1u64][..], 0, usize::MAX / 4),
        ErrorClass::RmaRange,
        "a displacement that overflows",
    )?;
    let mut f = [0.0f32; 2];
    expect_class(
        window.get_accumulate(&[1i32; 2][..], &mut f[..], 0, 0, SystemOperation::sum()),
        ErrorClass::Type,
        "get_accumulate of i32 into f32",
    )?;
    expect_class(
        window.accumulate(&[1.0f64][..], 0, 0, SystemOperation::bitwise_or()),
        ErrorClass::Op,
        "bitwise or of f64",
    )?;
    // Integers only (MPI 4.1 §12.3.4): a float compares by value, not bit
    // for bit as the swap does.
    let mut old_f = 0.0f64;
    expect_class(
        window.compare_and_swap(&1.0f64, &-0.0f64, &mut old_f, 0, 0),
        ErrorClass::Type,
        "compare_and_swap of f64",
    )?;
    expect_class(
        window.accumulate(&[1u64][..], 0, 0, SystemOperation::max_loc()),
        ErrorClass::Op,
        "maxloc in an accumulate",
    )?;
    expect_class(
        window.put(&[1u64][..], size, 0),
        ErrorClass::Rank,
        "put to a rank past the group",
    )?;
    // Nothing above reached the window; this does.
    let me = world.rank() as u64;
    window.accumulate(&[me][..], 0, 0, SystemOperation::sum())?;
    window.unlock(0)?;
    window.lock(LockType::Shared, 0, 0)?;
    expect_class(
        window.fence(0),
        ErrorClass::RmaSync,
        "fence with a lock held",
    )?;
    window.unlock(0)?;
    world.barrier()?;
    if world.rank() == 0 {
        let mut total = [0u64];
        window.read_local(0, &mut total)?;
        let n = size as u64;
        same(&total, &[n * (n - 1) / 2], "sum of ranks after the errors")?;
    }
    window.free()
}

/// Rank 0 computes without calling anything that makes progress, until
/// its window holds what every other rank put there with lock, put and
/// unlock: only a progress thread can apply them. A window the origins
/// reach directly needs none, so the check refuses one: an allocated
/// window over TCP, or a created one (`created`) with cross-memory attach
/// turned off (`OXMPI_SHM_CMA=0`) is reached by active messages.
fn passive(world: &Communicator, created: bool) -> Result<()> {
    let (rank, size) = (world.rank() as usize, world.size() as usize);
    let mut memory = Vec::new();
    let window = allocated_or_created(world, &mut memory, 8 * size, 8, created)?;
    ensure(
        size == 1 || !(window.direct_access() || window.rdma_access()),
        || {
            "passive needs a window reached by active messages: allocated over TCP, or \
         created with OXMPI_SHM_CMA=0"
                .to_owned()
        },
    )?;
    world.barrier()?;
    if rank == 0 {
        let expected: Vec<u64> = (0..size)
            .map(|r| if r == 0 { 0 } else { r as u64 * 11 })
            .collect();
        let since = Instant::now();
        let mut got = vec![0u64; size];
        let mut spin = 0u64;
        loop {
            // A plain computation between looks (read_local polls nothing).
            for i in 0..100_000u64 {
                spin = spin.wrapping_mul(31).wrapping_add(i);
            }
            window.read_local(0, &mut got)?;
            if got == expected {
                break;
            }
            ensure(since.elapsed() < Duration::from_secs(30), || {
                format!("after 30 s of computing the window holds {got:?} (spin {spin})")
            })?;
        }
    } else {
        let mut back = [0u64];
        window.lock(LockType::Exclusive, 0, 0)?;
        window.put(&[rank as u64 * 11][..], 0, rank)?;
        window.unlock(0)?;
        window.lock(LockType::Shared, 0, 0)?;
        window.get(&mut back[..], 0, rank)?;
        window.unlock(0)?;
        same(&back, &[rank as u64 * 11], "read back")?;
    }
    world.barrier()?;
    window.free()
}

/// Rank 0 computes outside MPI while every other rank locks, puts, gets
/// and unlocks rank 0's memory in a dynamic window, which every transport
/// reaches by active messages (over verbs too: its memory is attached
/// after the window's creation), so only rank 0's progress thread
/// (`OXMPI_ASYNC_PROGRESS=1`, asked for) completes them. Each origin then
/// puts a done mark into an allocated window, which the direct or RDMA
/// path reaches with no progress at the target, and rank 0 reads the
/// marks between computations (read_local polls nothing). Bounded: rank
/// 0 gives up after 30 s. Rank 0 checks its attached memory once the
/// window is freed.
fn passive_dynamic(world: &Communicator) -> Result<()> {
    const DONE: u64 = u64::MAX;
    let (rank, size) = (world.rank() as usize, world.size() as usize);
    ensure(
        std::env::var(oxmpi::rma::ASYNC_PROGRESS_ENV).as_deref() == Ok("1"),
        || "passive_dynamic needs the progress thread (OXMPI_ASYNC_PROGRESS=1)".to_owned(),
    )?;
    let mut attached = vec![0u64; size];
    let marks = returning(Window::allocate(world, 8 * size, 8, &Info::new()))?;
    ensure(
        size == 1 || marks.direct_access() || marks.rdma_access(),
        || {
            "passive_dynamic needs a transport that reaches an allocated window directly or by RDMA"
                .to_owned()
        },
    )?;
    let window = returning(Window::create_dynamic(world, &Info::new()))?;
    let base = window.attach(&mut attached[..])?;
    let mut bases = vec![0u64; size];
    world.all_gather_into(&[base as u64][..], &mut bases[..])?;
    world.barrier()?;
    if rank == 0 {
        let since = Instant::now();
        let mut got = vec![0u64; size];
        let mut spin = 0u64;
        loop {
            for i in 0..100_000u64 {
                spin = spin.wrapping_mul(31).wrapping_add(i);
            }
            marks.read_local(0, &mut got)?;
            if got[1..].iter().all(|&m| m == DONE) {
                break;
            }
            ensure(since.elapsed() < Duration::from_secs(30), || {
                format!("after 30 s of computing the done marks are {got:?} (spin {spin})")
            })?;
        }
    } else {
        let at = bases[0] as usize + 8 * rank;
        let value = rank as u64 * 11;
        let mut back = [0u64];
        window.lock(LockType::Exclusive, 0, 0)?;
        window.put(&[value][..], 0, at)?;
        window.unlock(0)?;
        window.lock(LockType::Shared, 0, 0)?;
        window.get(&mut back[..], 0, at)?;
        window.unlock(0)?;
        same(&back, &[value], "read back from rank 0's attached memory")?;
        marks.lock(LockType::Shared, 0, 0)?;
        marks.put(&[DONE][..], 0, rank)?;
        marks.unlock(0)?;
    }
    world.barrier()?;
    window.detach(base)?;
    window.free()?;
    marks.free()?;
    let expected: Vec<u64> = (0..size)
        .map(|r| if r == 0 { 0 } else { r as u64 * 11 })
        .collect();
    if rank == 0 {
        same(&attached, &expected, "rank 0's attached memory")?;
    }
    Ok(())
}

/// Which path an allocated window takes (as the second argument says:
/// `direct`, `rdma` or `messages`; the third, if any, says it of a window
/// on user memory), and every rank sees the same.
fn path(world: &Communicator) -> Result<()> {
    let arg = |i: usize| match std::env::args().nth(i).as_deref() {
        Some(want @ ("direct" | "rdma" | "messages")) => Ok(want.to_owned()),
        other => Err(fail(format!(
            "path: expected direct, rdma or messages, not {other:?}"
        ))),
    };
    let kind = |window: &Window<'_>| match (window.direct_access(), window.rdma_access()) {
        (true, _) => "direct",
        (false, true) => "rdma",
        (false, false) => "messages",
    };
    let want = arg(2)?;
    let want_created = arg(3).unwrap_or_else(|_| want.clone());
    let window = returning(Window::allocate(world, 64, 8, &Info::new()))?;
    ensure(kind(&window) == want, || {
        format!(
            "an allocated window's path is {}, not {want}",
            kind(&window)
        )
    })?;
    let code = |k: &str| {
        ["direct", "rdma", "messages"]
            .iter()
            .position(|&c| c == k)
            .unwrap_or(3) as u8
    };
    let mut all = vec![0u8; world.size() as usize];
    world.all_gather_into(&[code(kind(&window))][..], &mut all[..])?;
    same(&all, &vec![code(&want); all.len()], "every rank's path")?;
    window.free()?;
    let mut memory = [0u64; 4];
    let created = returning(Window::create(world, &mut memory[..], 8, &Info::new()))?;
    ensure(kind(&created) == want_created, || {
        format!(
            "a created window's path is {}, not {want_created}",
            kind(&created)
        )
    })?;
    created.free()
}

/// Rank 0 sleeps in a plain loop outside MPI (no progress thread) while
/// every other rank takes its lock, puts, gets, fetches and unlocks: the
/// direct path needs nothing of rank 0. Each origin's last act is a put
/// of a done mark under a lock of its own, and rank 0 sleeps until every
/// mark shows, so all of every origin's epochs began and ended while rank
/// 0 never called MPI. Bounded: the origins must be done within 20 s, and
/// rank 0 gives up after that (active messages never finish).
fn sleeping(world: &Communicator) -> Result<()> {
    const DONE: u64 = u64::MAX;
    let (rank, size) = (world.rank() as usize, world.size() as usize);
    ensure(
        std::env::var_os(oxmpi::rma::ASYNC_PROGRESS_ENV).is_none(),
        || "sleeping runs without a progress thread".to_owned(),
    )?;
    // Slot `r`: origin r's value; slot `size + r`: its done mark.
    let mut memory = vec![0u64; 2 * size];
    let window = if std::env::args().nth(2).as_deref() == Some("create") {
        returning(Window::create(world, &mut memory[..], 8, &Info::new()))?
    } else {
        returning(Window::allocate(world, 16 * size, 8, &Info::new()))?
    };
    world.barrier()?;
    let bound = Duration::from_secs(20);
    if rank == 0 {
        let mut expected: Vec<u64> = (0..size).map(|r| r as u64 * 11).collect();
        expected.extend((0..size).map(|r| if r == 0 { 0 } else { DONE }));
        let since = Instant::now();
        let mut got = vec![0u64; 2 * size];
        loop {
            std::thread::sleep(Duration::from_millis(10));
            // read_local polls nothing.
            window.read_local(0, &mut got)?;
            if got[size..] == expected[size..] {
                break;
            }
            ensure(since.elapsed() < bound, || {
                format!("after sleeping {bound:?} the window holds {got:?}")
            })?;
        }
        same(&got, &expected, "the window once every origin is done")?;
    } else {
        let since = Instant::now();
        let value = rank as u64 * 11;
        let mut back = [0u64; 2];
        for lock_type in [LockType::Exclusive, LockType::Shared] {
            window.lock(lock_type, 0, 0)?;
            window.put(&[value][..], 0, rank)?;
            window.flush(0)?;
            window.get(&mut back[..1], 0, rank)?;
            window.unlock(0)?;
            same(&back[..1], &[value], "read back")?;
        }
        window.lock(LockType::Shared, 0, 0)?;
        let mut old = 0u64;
        window.fetch_and_op(&0u64, &mut old, 0, rank, AccumulateOp::NoOp)?;
        window.unlock(0)?;
        same(&[old], &[value], "fetched with NO_OP")?;
        window.lock(LockType::Exclusive, 0, 0)?;
        window.put(&[DONE][..], 0, size + rank)?;
        window.unlock(0)?;
        ensure(since.elapsed() < bound, || {
            format!(
                "the origin took {:?} while the target slept",
                since.elapsed()
            )
        })?;
    }
    world.barrier()?;
    window.free()
}

/// See the module docs; on a window of one `u64` slot per rank.
fn synchronization(world: &Communicator) -> Result<()> {
    let (rank, size) = (world.rank() as usize, world.size() as usize);
    let bound = Duration::from_secs(20);
    let value = |origin: usize, round: usize| (round * 1000 + origin + 1) as u64;
    let window = returning(Window::allocate(world, 8 * size, 8, &Info::new()))?;
    // flush_all: every rank's put into every rank's slot `rank` is at
    // its target once flush_all returns; the targets read after a
    // barrier, with the epoch still open.
    window.lock_all(0)?;
    for t in 0..size {
        window.put(&[value(rank, 1)][..], t as i32, rank)?;
    }
    window.flush_all()?;
    world.barrier()?;
    let mut slots = vec![0u64; size];
    window.read_local(0, &mut slots[..])?;
    let want: Vec<u64> = (0..size).map(|o| value(o, 1)).collect();
    same(&slots, &want, "the slots after every rank's flush_all")?;
    world.barrier()?;
    flush_all_reports_refusals(world)?;
    // flush_local and flush_local_all: an rget's data is there when they
    // return (the request is complete without a wait).
    let right = ((rank + 1) % size) as i32;
    let mut one = [0u64];
    let mut every = vec![[0u64]; size];
    oxmpi::request::scope(|scope| -> Result<()> {
        let got = window.rget(scope, &mut one[..], right, 0)?;
        window.flush_local(right)?;
        ensure(got.get_status()?.is_some(), || {
            "an rget is not complete after flush_local".to_owned()
        })?;
        got.wait()?;
        let mut requests = Vec::new();
        for (t, into) in every.iter_mut().enumerate() {
            requests.push(window.rget(scope, &mut into[..], t as i32, t)?);
        }
        window.flush_local_all()?;
        for request in &requests {
            ensure(request.get_status()?.is_some(), || {
                "an rget is not complete after flush_local_all".to_owned()
            })?;
        }
        oxmpi::request::wait_all(requests).map(|_| ())
    })?;
    same(&one, &[value(0, 1)], "rget after flush_local")?;
    let want: Vec<[u64; 1]> = (0..size).map(|t| [value(t, 1)]).collect();
    same(&every, &want, "rgets after flush_local_all")?;
    window.unlock_all()?;
    world.barrier()?;
    // test: rank 0 exposes its window to the others and polls with test
    // until their puts (of round 2) are complete. The origins complete
    // only once rank 0 has tested once and then told them to: that first
    // test must say no, and a test that waited for the epoch's end would
    // wait for ever (the job's bound).
    let others: Vec<i32> = (1..size as i32).collect();
    if rank == 0 {
        window.post(&world.group().include(&others)?, 0)?;
        if !others.is_empty() {
            ensure(!window.test()?, || {
                "test said the exposure epoch ended before any origin completed".to_owned()
            })?;
        }
        for &origin in &others {
            world.process_at_rank(origin).send(&1u8)?;
        }
        let since = Instant::now();
        while !window.test()? {
            ensure(since.elapsed() < bound, || {
                "test did not see the exposure epoch end".to_owned()
            })?;
        }
        window.read_local(0, &mut slots[..])?;
        let mut want: Vec<u64> = (0..size).map(|o| value(o, 2)).collect();
        want[0] = value(0, 1);
        same(
            &slots,
            &want,
            "rank 0's slots once test says the epoch ended",
        )?;
    } else {
        window.start(&world.group().include(&[0])?, 0)?;
        window.put(&[value(rank, 2)][..], 0, rank)?;
        world.process_at_rank(0).receive::<u8>()?;
        window.complete()?;
    }
    world.barrier()?;
    // sync: the last rank polls its own slot 0 (its public copy) until
    // rank 0's put of round 3 shows, calling sync between reads.
    let last = size - 1;
    window.lock_all(0)?;
    if rank == 0 {
        window.put(&[value(0, 3)][..], last as i32, 0)?;
        window.flush(last as i32)?;
    }
    if rank == last {
        let since = Instant::now();
        let mut slot = [0u64];
        while slot[0] != value(0, 3) {
            // Polls, so that the put is applied once it arrives over
            // active messages.
            world.any_process().immediate_probe()?;
            window.sync()?;
            window.read_local(0, &mut slot[..])?;
            ensure(since.elapsed() < bound, || {
                format!("rank 0's put never showed at rank {last}")
            })?;
        }
    }
    window.unlock_all()?;
    world.barrier()?;
    // A user error handler sees an out-of-range put once, and the put
    // still returns the error; the window is untouched.
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    window.set_error_handler(ErrorHandler::user({
        let seen = seen.clone();
        move |_, e| {
            seen.lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(e.class())
        }
    }));
    window.lock(LockType::Exclusive, rank as i32, 0)?;
    expect_class(
        window.put(&[7u64, 7][..], rank as i32, size - 1),
        ErrorClass::RmaRange,
        "a put past the window with a user handler",
    )?;
    // Back to Return: the error is returned, and the user's handler is
    // not called again.
    window.set_error_handler(ErrorHandler::Return);
    expect_class(
        window.put(&[7u64, 7][..], rank as i32, size - 1),
        ErrorClass::RmaRange,
        "a put past the window with the Return handler",
    )?;
    window.unlock(rank as i32)?;
    let classes = seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
    ensure(classes == [ErrorClass::RmaRange], || {
        format!("the user handler saw {classes:?}")
    })?;
    world.barrier()?;
    window.read_local(0, &mut slots[..])?;
    ensure(!slots.contains(&7), || {
        format!("the refused put wrote: {slots:?}")
    })?;
    world.barrier()?;
    // Fence assertions: NOSTORE and NOPUT are taken, and NOSUCCEED ends
    // the fence epochs, so a put after it is outside any epoch.
    window.fence(MODE_NOPRECEDE | MODE_NOSTORE)?;
    window.put(&[value(rank, 4)][..], right, rank)?;
    // No puts land in the next epoch, only gets.
    window.fence(MODE_NOSTORE | MODE_NOPUT)?;
    let left = (rank + size - 1) % size;
    window.get(&mut one[..], right, rank)?;
    window.fence(MODE_NOSUCCEED)?;
    same(
        &one,
        &[value(rank, 4)],
        "a get of the put of the fence before",
    )?;
    window.read_local(0, &mut slots[..])?;
    same(
        &slots[left..=left],
        &[value(left, 4)],
        "the left neighbour's put",
    )?;
    expect_class(
        window.put(&[7u64][..], right, rank),
        ErrorClass::RmaSync,
        "a put after a fence with MODE_NOSUCCEED",
    )?;
    window.free()
}

/// `flush_all` reports what the targets refused: in a dynamic window only
/// the target knows its regions, so every rank's put past the region
/// every target attached fails at the flush (a flush_all that did
/// nothing would return `Ok`), and nothing is written.
fn flush_all_reports_refusals(world: &Communicator) -> Result<()> {
    let size = world.size() as usize;
    let mut region = [0u64];
    let window = returning(Window::create_dynamic(world, &Info::new()))?;
    let address = window.attach(&mut region[..])?;
    let mut addresses = vec![0u64; size];
    world.all_gather_into(&[address as u64][..], &mut addresses[..])?;
    window.lock_all(0)?;
    for (t, &at) in addresses.iter().enumerate() {
        window.put(&[1u64, 2][..], t as i32, at as usize)?;
    }
    expect_class(
        window.flush_all(),
        ErrorClass::RmaRange,
        "flush_all after puts past every target's region",
    )?;
    window.unlock_all()?;
    world.barrier()?;
    window.detach(address)?;
    window.free()?;
    same(&region, &[0], "the region after the refused puts")
}

/// Errors of detach, attach, epochs opened twice or left open, and the
/// modes no other check exercises, each where a wrong answer shows: a
/// detach of an address that is not the start of attached memory, and
/// a second one (MPI_ERR_RMA_ATTACH; an attach overlapping attached
/// memory cannot be written in safe Rust, which lends memory to a window
/// once), an attach to a window that is not dynamic
/// (MPI_ERR_RMA_FLAVOR); `lock_all` waits for another rank's exclusive
/// lock (it finds that rank's last put, not its first);
/// `lock_all(MODE_NOCHECK)` epochs whose puts land; a second post or
/// start and an operation to a rank outside the start group
/// (MPI_ERR_RMA_SYNC), a group with a process outside the window
/// (MPI_ERR_GROUP); every operation on `PROC_NULL` does nothing, and
/// neither do lock, flush and unlock of it; a free with an epoch open at
/// rank 0 alone is MPI_ERR_RMA_SYNC there, and every rank leaves it.
fn epochs(world: &Communicator) -> Result<()> {
    let (rank, size) = (world.rank() as usize, world.size() as usize);
    ensure(size >= 2, || "epochs runs on 2 ranks or more".to_owned())?;
    // Attach and detach.
    let mut region = [0u64; 4];
    let window = returning(Window::create_dynamic(world, &Info::new()))?;
    let at = window.attach(&mut region[..])?;
    expect_class(
        window.detach(at + 8),
        ErrorClass::RmaAttach,
        "a detach of an address inside attached memory, not its start",
    )?;
    window.detach(at)?;
    expect_class(window.detach(at), ErrorClass::RmaAttach, "a second detach")?;
    window.free()?;
    let mut lent = [0u64; 2];
    let created = returning(Window::create(world, &mut region[..], 8, &Info::new()))?;
    expect_class(
        created.attach(&mut lent[..]),
        ErrorClass::RmaFlavor,
        "an attach to a created window",
    )?;
    created.free()?;
    // lock_all against an exclusive lock: rank 0 holds rank 1's, puts 1,
    // lets the last rank call lock_all, waits, puts 2 and unlocks; the
    // last rank's lock_all returns after the unlock, so its get finds 2.
    let (holder, target, locker) = (0, 1i32, size - 1);
    let (left, right) = ((rank + size - 1) % size, (rank + 1) % size);
    let window = returning(Window::allocate(world, 8, 8, &Info::new()))?;
    world.barrier()?;
    if rank == holder {
        window.lock(LockType::Exclusive, target, 0)?;
        window.put(&[1u64][..], target, 0)?;
        window.flush(target)?;
        world.process_at_rank(locker as i32).send(&1u8)?;
        std::thread::sleep(Duration::from_millis(200));
        window.put(&[2u64][..], target, 0)?;
        window.unlock(target)?;
    }
    if rank == locker {
        world.process_at_rank(holder as i32).receive::<u8>()?;
        window.lock_all(0)?;
        let mut got = [0u64];
        window.get(&mut got[..], target, 0)?;
        window.unlock_all()?;
        same(&got, &[2], "rank 1's slot read under lock_all")?;
    }
    world.barrier()?;
    // lock_all(MODE_NOCHECK): no other lock is asked for meanwhile, and
    // each rank's put into its right neighbour's window lands.
    window.lock_all(MODE_NOCHECK)?;
    window.put(&[10 + rank as u64][..], right as i32, 0)?;
    window.unlock_all()?;
    world.barrier()?;
    let mut mine = [0u64];
    window.read_local(0, &mut mine)?;
    same(
        &mine,
        &[10 + left as u64],
        "the put under lock_all(MODE_NOCHECK)",
    )?;
    world.barrier()?;
    window.free()?;
    // Post and start twice, an operation outside the start group: each
    // rank exposes its window to its left neighbour and accesses its
    // right one's; itself is outside its start group.
    let window = returning(Window::allocate(world, 8, 8, &Info::new()))?;
    let to_left = world.group().include(&[left as i32])?;
    let to_right = world.group().include(&[right as i32])?;
    window.post(&to_left, 0)?;
    expect_class(
        window.post(&to_left, 0),
        ErrorClass::RmaSync,
        "a second post",
    )?;
    window.start(&to_right, 0)?;
    expect_class(
        window.start(&to_right, 0),
        ErrorClass::RmaSync,
        "a second start",
    )?;
    expect_class(
        window.put(&[5u64][..], rank as i32, 0),
        ErrorClass::RmaSync,
        "a put to a rank outside the start group",
    )?;
    // A window's access epochs at a process are disjoint (MPI 4.1
    // §12.5): no lock or lock_all while a start epoch is open, of its
    // group's ranks or another's.
    for target in [right, rank] {
        expect_class(
            window.lock(LockType::Shared, target as i32, 0),
            ErrorClass::RmaSync,
            "a lock while a start epoch is open",
        )?;
    }
    expect_class(
        window.lock_all(0),
        ErrorClass::RmaSync,
        "lock_all while a start epoch is open",
    )?;
    window.put(&[7u64][..], right as i32, 0)?;
    window.complete()?;
    window.wait()?;
    // Nor a start while a lock or lock_all is open.
    window.lock(LockType::Shared, rank as i32, 0)?;
    expect_class(
        window.start(&to_right, 0),
        ErrorClass::RmaSync,
        "a start while a lock is open",
    )?;
    window.unlock(rank as i32)?;
    window.lock_all(MODE_NOCHECK)?;
    expect_class(
        window.start(&to_right, 0),
        ErrorClass::RmaSync,
        "a start while lock_all is open",
    )?;
    window.unlock_all()?;
    window.read_local(0, &mut mine)?;
    same(&mine, &[7], "the left neighbour's put")?;
    // Every operation on PROC_NULL, in a fence epoch: nothing changes,
    // and the result buffers keep what they held.
    window.fence(0)?;
    let null = oxmpi::PROC_NULL;
    let mut kept = [9u64];
    let mut one = 9u64;
    window.put(&[1u64][..], null, 0)?;
    window.get(&mut kept[..], null, 0)?;
    window.accumulate(&[1u64][..], null, 0, SystemOperation::sum())?;
    window.get_accumulate(&[1u64][..], &mut kept[..], null, 0, SystemOperation::sum())?;
    window.fetch_and_op(&1u64, &mut one, null, 0, SystemOperation::sum())?;
    window.compare_and_swap(&1u64, &7u64, &mut one, null, 0)?;
    let column = UserDatatype::vector(1, 1, 1, &u64::equivalent_datatype())?;
    let layout = TargetLayout::new(1, &column);
    window.put_typed(&[1u64][..], null, 0, layout)?;
    window.get_typed(&mut kept[..], null, 0, layout)?;
    window.accumulate_typed(&[1u64][..], null, 0, layout, SystemOperation::sum())?;
    window.get_accumulate_typed(
        &[1u64][..],
        &mut kept[..],
        null,
        0,
        layout,
        AccumulateOp::Replace,
    )?;
    oxmpi::request::scope(|scope| -> Result<()> {
        let requests = vec![
            window.rput(&[1u64][..], null, 0)?,
            window.raccumulate(&[1u64][..], null, 0, SystemOperation::sum())?,
            window.rget(scope, &mut kept[..], null, 0)?,
        ];
        oxmpi::request::wait_all(requests).map(drop)
    })?;
    window.fence(MODE_NOSUCCEED)?;
    window.lock(LockType::Exclusive, null, 0)?;
    window.flush(null)?;
    window.unlock(null)?;
    same(
        &[kept[0], one],
        &[9, 9],
        "result buffers of operations on PROC_NULL",
    )?;
    window.read_local(0, &mut mine)?;
    same(&mine, &[7], "the window after operations on PROC_NULL")?;
    // A group with a process outside the window: a window of this rank
    // alone.
    let alone = world
        .split_by_color(Color::with_value(rank as i32))?
        .ok_or_else(|| fail("a split with a colour gave no communicator"))?;
    let lonely = returning(Window::allocate(&alone, 8, 8, &Info::new()))?;
    expect_class(
        lonely.start(&world.group(), 0),
        ErrorClass::Group,
        "start with a group beyond the window",
    )?;
    expect_class(
        lonely.post(&world.group(), 0),
        ErrorClass::Group,
        "post with a group beyond the window",
    )?;
    lonely.free()?;
    // Free with an epoch open at rank 0 alone.
    if rank == 0 {
        window.lock(LockType::Shared, right as i32, 0)?;
    }
    let open = |r: usize| (r == 0).then_some(ErrorClass::RmaSync);
    outcomes(world, window.free(), open, "free with rank 0's lock open")
}

/// Every rank's outcome of a call, gathered at every rank as error class
/// codes (0 for success), against `expected` (the class each rank must
/// report, if any): a rank that reports the wrong outcome fails the
/// check, and one that never gets here (left waiting in a barrier of the
/// call) holds the job until its bound.
fn outcomes(
    world: &Communicator,
    outcome: Result<()>,
    expected: impl Fn(usize) -> Option<ErrorClass>,
    what: &str,
) -> Result<()> {
    let mine = outcome.as_ref().err().map_or(0, |e| e.class().code());
    let mut every = vec![0i32; world.size() as usize];
    world.all_gather_into(&[mine][..], &mut every[..])?;
    let want: Vec<i32> = (0..every.len())
        .map(|r| expected(r).map_or(0, ErrorClass::code))
        .collect();
    same(
        &every,
        &want,
        &format!("{what}: error classes by rank (this rank's: {outcome:?})"),
    )
}

/// A put that its target refuses, by rank 0 alone (past the slots that
/// rank 1 attached to a dynamic window: only the target can check it),
/// followed directly by the call that ends its epoch: `fence`,
/// `unlock_all` and `free`. Rank 0's call reports MPI_ERR_RMA_RANGE, the
/// others' succeed, and each still synchronizes: the next fence epoch
/// works, every rank's exclusive lock on every target is granted after
/// the unlock_all (rank 0's shared locks were released), and every rank
/// leaves the free. Nothing of the refused puts is written.
fn refused_sync(world: &Communicator) -> Result<()> {
    let (rank, size) = (world.rank() as usize, world.size() as usize);
    ensure(size >= 2, || {
        "refused_sync runs on 2 ranks or more".to_owned()
    })?;
    let right = (rank + 1) % size;
    let refused = |r: usize| (r == 0).then_some(ErrorClass::RmaRange);
    // A slot per origin.
    let mut slots = vec![0u64; size];
    let window = returning(Window::create_dynamic(world, &Info::new()))?;
    let address = window.attach(&mut slots[..])?;
    let mut addresses = vec![0u64; size];
    world.all_gather_into(&[address as u64][..], &mut addresses[..])?;
    let at = |t: usize| addresses[t] as usize + 8 * rank;
    let past_every_slot = vec![9u64; size + 1];
    let bad_put = || {
        window.put(
            &past_every_slot[..],
            right as i32,
            addresses[right] as usize,
        )
    };
    window.fence(0)?;
    if rank == 0 {
        bad_put()?;
    } else {
        window.put(&[100 + rank as u64][..], right as i32, at(right))?;
    }
    outcomes(world, window.fence(0), refused, "fence after a refused put")?;
    window.put(&[200 + rank as u64][..], right as i32, at(right))?;
    outcomes(
        world,
        window.fence(MODE_NOSUCCEED),
        |_| None,
        "the next fence",
    )?;
    window.lock_all(0)?;
    if rank == 0 {
        bad_put()?;
    }
    outcomes(
        world,
        window.unlock_all(),
        refused,
        "unlock_all after a refused put",
    )?;
    for t in 0..size {
        window.lock(LockType::Exclusive, t as i32, 0)?;
        window.put(&[300 + rank as u64][..], t as i32, at(t))?;
        window.unlock(t as i32)?;
    }
    world.barrier()?;
    window.fence(0)?;
    if rank == 0 {
        bad_put()?;
    }
    outcomes(world, window.free(), refused, "free after a refused put")?;
    let want: Vec<u64> = (0..size).map(|o| 300 + o as u64).collect();
    same(&slots, &want, "the slots after the refused puts")
}

/// Rank 1 puts past the end of rank 0's window, whose error handler is
/// the one every new window has, fatal (MPI 4.1 §12.6.1), though world's
/// is Return: the job ends with the error's message.
fn fatal_handler(world: &Communicator) -> Result<()> {
    let window = Window::allocate(world, 8, 8, &Info::new())?;
    world.barrier()?;
    if world.rank() == 1 {
        window.lock(LockType::Shared, 0, 0)?;
        let _ = window.put(&[1u64, 2][..], 0, 0);
        return Err(fail("a fatal error returned"));
    }
    // The others wait for the job to end.
    let mut never = 0u8;
    let _ = world.process_at_rank(1).receive_into(&mut never);
    Err(fail("the job went on after a fatal error"))
}

/// Rows and columns of each rank's 2-D block in `typed`: columns 0 and
/// `COLS - 1` are halo.
const ROWS: usize = 6;
const COLS: usize = 8;
/// The order of each rank's square matrix in `typed`, after its block.
const ORDER: usize = 5;
/// Where the matrix starts, and the indexed target after it (12
/// elements), in `typed`'s windows of `u64`s.
const MATRIX: usize = ROWS * COLS;
const INDEXED: usize = MATRIX + ORDER * ORDER;

/// Operations with a target datatype on a window of `u64`s (a block,
/// a matrix, an indexed area; see the constants above) under fences,
/// each against a reference every rank computes alone: a halo exchange
/// (every rank puts its last interior column, a strided origin, into its
/// right neighbour's left halo column, and its first into its left
/// neighbour's right halo column, both a vector target type); a
/// transpose of the right neighbour's matrix by one get whose target
/// type is a column resized to one element (so `ORDER` of them are the
/// columns in turn); every rank's accumulate SUM into rank 0's indexed
/// area; a `get_accumulate_typed` REPLACE of the right neighbour's first
/// matrix column. Then the refused, with nothing written: target layouts
/// past the window's end or before its start (`MPI_ERR_RMA_RANGE`),
/// signatures that differ in type or length, and an accumulate of mixed
/// types (`MPI_ERR_TYPE`).
fn typed(world: &Communicator) -> Result<()> {
    let (rank, size) = (world.rank() as usize, world.size() as usize);
    let (left, right) = ((rank + size - 1) % size, (rank + 1) % size);
    let cell = |r: usize, i: usize, j: usize| (r * 10000 + i * 100 + j) as u64;
    let entry = |r: usize, i: usize, j: usize| (r * 1000 + i * ORDER + j + 1) as u64;
    let window = returning(Window::allocate(world, 8 * (INDEXED + 12), 8, &Info::new()))?;
    let mut start = vec![0u64; INDEXED + 12];
    for i in 0..ROWS {
        for j in 0..COLS {
            start[i * COLS + j] = cell(rank, i, j);
        }
    }
    for i in 0..ORDER {
        for j in 0..ORDER {
            start[MATRIX + i * ORDER + j] = entry(rank, i, j);
        }
    }
    window.write_local(0, &start[..])?;
    let u64_type = u64::equivalent_datatype();
    let column = UserDatatype::vector(ROWS as i32, 1, COLS as i32, &u64_type)?;
    window.fence(0)?;
    // The halo exchange: the origins are columns of this rank's block.
    let block = start[..MATRIX].to_vec();
    let from = |j: usize| View::with_count_and_datatype(&block[j..], 1, &column);
    window.put_typed(
        &from(COLS - 2)?,
        right as i32,
        0,
        TargetLayout::new(1, &column),
    )?;
    // The request-based forms are for passive-target epochs (MPI 4.1
    // §12.3.5): refused here before anything moves, each time, and the
    // plain form does the part; they work in the lock_all epoch at the
    // end.
    let refused = |what: &str, outcome: Result<()>| {
        expect_class(outcome, ErrorClass::RmaSync, &format!("{what} under fence"))
    };
    let to_left = TargetLayout::new(1, &column);
    refused(
        "rput_typed",
        window
            .rput_typed(&from(1)?, left as i32, COLS - 1, to_left)
            .map(drop),
    )?;
    window.put_typed(&from(1)?, left as i32, COLS - 1, to_left)?;
    // The transpose: column j of the matrix is element j of `columns`.
    let down = UserDatatype::vector(ORDER as i32, 1, ORDER as i32, &u64_type)?;
    let columns = UserDatatype::resized(&down, 0, 8)?;
    let mut transposed = vec![0u64; ORDER * ORDER];
    let transpose = TargetLayout::new(ORDER, &columns);
    refused(
        "rget_typed",
        window
            .rget_typed(&mut transposed[..], right as i32, MATRIX, transpose)
            .map(drop),
    )?;
    window.get_typed(&mut transposed[..], right as i32, MATRIX, transpose)?;
    // Accumulates into rank 0's indexed area: elements 0, 4-6 and 9-10.
    let indexed = UserDatatype::indexed(&[1, 3, 2], &[0, 4, 9], &u64_type)?;
    let added = |r: usize| -> Vec<u64> { (0..6).map(|n| (r as u64 + 1) * (n + 1)).collect() };
    let layout = TargetLayout::new(1, &indexed);
    let sum = SystemOperation::sum();
    refused(
        "raccumulate_typed",
        window
            .raccumulate_typed(&added(rank)[..], 0, INDEXED, layout, sum)
            .map(drop),
    )?;
    window.accumulate_typed(&added(rank)[..], 0, INDEXED, layout, sum)?;
    window.fence(0)?;
    let want: Vec<u64> = (0..ORDER * ORDER)
        .map(|n| entry(right, n % ORDER, n / ORDER))
        .collect();
    same(
        &transposed,
        &want,
        "the right neighbour's matrix transposed by get",
    )?;
    let mut got = vec![0u64; INDEXED + 12];
    window.read_local(0, &mut got[..])?;
    let mut want = start.clone();
    for i in 0..ROWS {
        want[i * COLS] = cell(left, i, COLS - 2);
        want[i * COLS + COLS - 1] = cell(right, i, 1);
    }
    if rank == 0 {
        for (n, at) in [0, 4, 5, 6, 9, 10].into_iter().enumerate() {
            want[INDEXED + at] = (0..size).map(|r| added(r)[n]).sum();
        }
    }
    same(
        &got,
        &want,
        "the window after the halo exchange and the accumulates",
    )?;
    // Every rank has read its window before the next epoch writes it.
    world.barrier()?;
    // A fetching replace of the right neighbour's first matrix column.
    let first = UserDatatype::vector(ORDER as i32, 1, ORDER as i32, &u64_type)?;
    let new: Vec<u64> = (0..ORDER).map(|i| cell(rank, 99, i)).collect();
    let mut old = vec![0u64; ORDER];
    let layout = TargetLayout::new(1, &first);
    let (to, replace) = (right as i32, AccumulateOp::Replace);
    refused(
        "rget_accumulate_typed",
        window
            .rget_accumulate_typed(&new[..], &mut old[..], to, MATRIX, layout, replace)
            .map(drop),
    )?;
    window.get_accumulate_typed(&new[..], &mut old[..], to, MATRIX, layout, replace)?;
    window.fence(0)?;
    let fetched: Vec<u64> = (0..ORDER).map(|i| entry(right, i, 0)).collect();
    same(&old, &fetched, "the column get_accumulate_typed fetched")?;
    window.read_local(0, &mut got[..])?;
    for i in 0..ORDER {
        want[MATRIX + i * ORDER] = cell(left, 99, i);
    }
    same(&got, &want, "the window after get_accumulate_typed")?;
    // Refused, at the origin, before anything moves.
    let me = rank as i32;
    let end = INDEXED + 12;
    let ones = [1u64; ROWS];
    expect_class(
        window.put_typed(&ones[..], me, end - 1, TargetLayout::new(1, &column)),
        ErrorClass::RmaRange,
        "a column from the window's last element",
    )?;
    let before_start = UserDatatype::heterogeneous_indexed(&[1], &[-8], &u64_type)?;
    expect_class(
        window.accumulate_typed(
            &ones[..1],
            me,
            0,
            TargetLayout::new(1, &before_start),
            SystemOperation::sum(),
        ),
        ErrorClass::RmaRange,
        "an element before the window's start",
    )?;
    expect_class(
        window.get_typed(
            &mut vec![0u64; ROWS][..],
            me,
            end,
            TargetLayout::new(1, &column),
        ),
        ErrorClass::RmaRange,
        "a column from the window's end",
    )?;
    expect_class(
        window.put_typed(
            &vec![1.0f64; ROWS][..],
            me,
            0,
            TargetLayout::new(1, &column),
        ),
        ErrorClass::Type,
        "doubles into a column of u64",
    )?;
    expect_class(
        window.put_typed(&ones[..ROWS - 1], me, 0, TargetLayout::new(1, &column)),
        ErrorClass::Type,
        "one element fewer than the column",
    )?;
    let mixed =
        UserDatatype::structured(&[1, 1], &[0, 8], &[&u64_type, &u32::equivalent_datatype()])?;
    let pair = [1u64, 2u64];
    let pair_view = View::with_count_and_datatype(&pair[..], 1, &mixed)?;
    expect_class(
        window.accumulate_typed(
            &pair_view,
            me,
            0,
            TargetLayout::new(1, &mixed),
            SystemOperation::sum(),
        ),
        ErrorClass::Type,
        "an accumulate of mixed types",
    )?;
    window.fence(MODE_NOSUCCEED)?;
    window.read_local(0, &mut got[..])?;
    same(&got, &want, "the window after the refused operations")?;
    // The request-based forms in a lock_all epoch, complete on return:
    // this rank's column 1 into its right neighbour's column 0 by
    // rput_typed, read back by rget_typed; its added values into the
    // neighbour's indexed area by raccumulate_typed, then fetched and
    // replaced by zeros with rget_accumulate_typed.
    world.barrier()?;
    let to = right as i32;
    let mut back = vec![0u64; ROWS];
    let mut fetched = vec![0u64; 6];
    window.lock_all(0)?;
    let put = window.rput_typed(&from(1)?, to, 0, TargetLayout::new(1, &column))?;
    window.flush(to)?;
    let got_back = window.rget_typed(&mut back[..], to, 0, TargetLayout::new(1, &column))?;
    let zero = TargetLayout::new(1, &indexed);
    let raccumulated = window.raccumulate_typed(&added(rank)[..], to, INDEXED, zero, sum)?;
    let swapped = window.rget_accumulate_typed(
        &[0u64; 6][..],
        &mut fetched[..],
        to,
        INDEXED,
        zero,
        replace,
    )?;
    oxmpi::request::wait_all(vec![put, got_back, raccumulated, swapped])?;
    window.unlock_all()?;
    let column_1: Vec<u64> = (0..ROWS).map(|i| cell(rank, i, 1)).collect();
    same(
        &back,
        &column_1,
        "rget_typed of the column rput_typed wrote",
    )?;
    // Rank 0's indexed area holds every rank's first accumulates; the
    // others' held zeros.
    let before: Vec<u64> = (0..6)
        .map(|n| {
            let earlier: u64 = (0..size).map(|r| added(r)[n]).sum();
            u64::from(right == 0) * earlier + added(rank)[n]
        })
        .collect();
    same(
        &fetched,
        &before,
        "what rget_accumulate_typed fetched after raccumulate_typed",
    )?;
    window.free()?;
    typed_large(world)
}

/// Blocks in `typed_large`'s strided and irregular layouts: more data
/// than one message of a typed operation carries over active messages
/// (512 KiB), and more runs (2048).
const STRIDED: usize = 80_000;
const IRREGULAR: usize = 6_000;

/// Large target layouts, which travel over active messages as several
/// messages each: a put into every other element of the right
/// neighbour's window (a vector), read back by a get, and an accumulate
/// into an indexed layout whose gaps of 1 to 3 elements fold into no
/// long run, read back by a fetching no-op, then a maximum into that
/// layout, read back by a get. Checked against references.
fn typed_large(world: &Communicator) -> Result<()> {
    let (rank, size) = (world.rank() as usize, world.size() as usize);
    let right = ((rank + 1) % size) as i32;
    let len = 2 * STRIDED;
    let window = returning(Window::allocate(world, 8 * len, 8, &Info::new()))?;
    window.write_local(0, &vec![0u64; len][..])?;
    // No rank writes into a window before its owner cleared it.
    world.barrier()?;
    let u64_type = u64::equivalent_datatype();
    let every_other = UserDatatype::vector(STRIDED as i32, 1, 2, &u64_type)?;
    let mut at = 0;
    let displacements: Vec<i32> = (0..IRREGULAR)
        .map(|i| {
            let here = at;
            at += 1 + (i % 3) as i32;
            here
        })
        .collect();
    let scattered = UserDatatype::indexed_block(1, &displacements, &u64_type)?;
    let values: Vec<u64> = (0..STRIDED).map(|i| (rank * STRIDED + i) as u64).collect();
    window.lock(LockType::Exclusive, right, 0)?;
    window.put_typed(&values[..], right, 1, TargetLayout::new(1, &every_other))?;
    let mut back = vec![0u64; STRIDED];
    window.get_typed(&mut back[..], right, 1, TargetLayout::new(1, &every_other))?;
    same(&back, &values, "a strided put of 625 KiB read back")?;
    let ones = vec![1u64; IRREGULAR];
    let layout = TargetLayout::new(1, &scattered);
    window.accumulate_typed(&ones[..], right, 1, layout, SystemOperation::sum())?;
    let mut old = vec![0u64; IRREGULAR];
    window.get_accumulate_typed(
        &ones[..],
        &mut old[..],
        right,
        1,
        layout,
        AccumulateOp::NoOp,
    )?;
    window.unlock(right)?;
    let want: Vec<u64> = displacements
        .iter()
        .map(|&d| {
            let d = d as usize;
            // Odd displacements from element 1 are even elements of the
            // window, which the put left at 0.
            if d.is_multiple_of(2) {
                values[d / 2] + 1
            } else {
                1
            }
        })
        .collect();
    same(
        &old,
        &want,
        "an irregular accumulate of 6,000 blocks read back",
    )?;
    // A maximum, which no NIC atomic does: over RDMA the segments' READs
    // and WRITEs, posted as lists, under one hold of the accumulate
    // mutex. Every other element is raised.
    let candidates: Vec<u64> = want
        .iter()
        .enumerate()
        .map(|(i, &w)| if i % 2 == 0 { w + 5 } else { w - 1 })
        .collect();
    window.lock(LockType::Shared, right, 0)?;
    window.accumulate_typed(&candidates[..], right, 1, layout, SystemOperation::max())?;
    window.unlock(right)?;
    let mut maxima = vec![0u64; IRREGULAR];
    window.lock(LockType::Shared, right, 0)?;
    window.get_typed(&mut maxima[..], right, 1, layout)?;
    window.unlock(right)?;
    let want: Vec<u64> = want
        .iter()
        .zip(&candidates)
        .map(|(&w, &c)| w.max(c))
        .collect();
    same(
        &maxima,
        &want,
        "an irregular maximum of 6,000 blocks read back",
    )?;
    window.free()
}

/// `allocate_shared`, contiguous (the default) and with
/// `alloc_shared_noncontig`: [`shared_window`] on each; then
/// `shared_query(PROC_NULL)` where rank 0's part is empty, and the
/// classes of a bad or disagreeing `alloc_shared_noncontig`.
fn shared(world: &Communicator) -> Result<()> {
    let (rank, size) = (world.rank() as usize, world.size() as usize);
    shared_window(world, &Info::new())?;
    let mut noncontig = Info::new();
    noncontig.set("alloc_shared_noncontig", "true")?;
    shared_window(world, &noncontig)?;
    // Rank 0's part is empty: PROC_NULL gives rank 1's (with one rank,
    // rank 0's, of no bytes).
    let window = returning(Window::allocate_shared(
        world,
        if rank == 0 { 0 } else { 8 },
        8,
        &Info::new(),
    ))?;
    let lowest = window.shared_query(oxmpi::PROC_NULL)?;
    let want = window.shared_query(size.min(2) as i32 - 1)?;
    ensure(
        lowest.base() == want.base() && lowest.size() == 8 * usize::from(size > 1),
        || {
            format!(
                "shared_query(PROC_NULL) gave {} bytes at {:?}, not rank {}'s {} at {:?}",
                lowest.size(),
                lowest.base(),
                size.min(2) - 1,
                want.size(),
                want.base()
            )
        },
    )?;
    window.free()?;
    let mut bad = Info::new();
    bad.set("alloc_shared_noncontig", "maybe")?;
    expect_class(
        Window::allocate_shared(world, 8, 8, &bad).map(|_| ()),
        ErrorClass::InfoValue,
        "alloc_shared_noncontig = maybe",
    )?;
    if size > 1 {
        let info = if rank == 1 { noncontig } else { Info::new() };
        expect_class(
            Window::allocate_shared(world, 8, 8, &info).map(|_| ()),
            ErrorClass::InfoValue,
            "alloc_shared_noncontig at rank 1 alone",
        )?;
    }
    Ok(())
}

/// One `allocate_shared` window made with `info`: parts of different
/// sizes (rank r has r + 2 elements); each rank stores into its own,
/// then reads every rank's through `shared_query`. Contiguous, every
/// part starts right after the previous one, and a rank's store past
/// the end of its part (through the pointer, as C programs do) lands in
/// the next rank's part; non-contiguous, every part is page-aligned. A
/// put by RMA lands in the same memory.
fn shared_window(world: &Communicator, info: &Info) -> Result<()> {
    let (rank, size) = (world.rank() as usize, world.size() as usize);
    let contiguous = info.get("alloc_shared_noncontig")? != Some("true");
    let len = |r: usize| r + 2;
    let value = |r: usize, i: usize| (r * 1000 + i) as u64;
    let window = returning(Window::allocate_shared(world, 8 * len(rank), 8, info))?;
    ensure(window.create_flavor() == CreateFlavor::Shared, || {
        format!("flavor {:?}", window.create_flavor())
    })?;
    ensure(window.direct_access(), || {
        "a shared window without direct access".to_owned()
    })?;
    let own: SharedPart<'_> = window.shared_query(rank as i32)?;
    ensure(own.base() as usize == window.base(), || {
        "shared_query of this rank is not its base".to_owned()
    })?;
    let mine: Vec<u64> = (0..len(rank)).map(|i| value(rank, i)).collect();
    own.write(0, &mine[..])?;
    world.barrier()?;
    for r in [(rank + size - 1) % size, (rank + 1) % size] {
        let part = window.shared_query(r as i32)?;
        ensure(part.size() == 8 * len(r) && part.disp_unit() == 8, || {
            format!(
                "rank {r}'s part: {} bytes, unit {}",
                part.size(),
                part.disp_unit()
            )
        })?;
        let mut got = vec![0u64; len(r)];
        part.read(0, &mut got[..])?;
        let want: Vec<u64> = (0..len(r)).map(|i| value(r, i)).collect();
        same(&got, &want, &format!("rank {r}'s part"))?;
        // One element past its end: refused, nothing read.
        expect_class(
            part.read(8 * len(r), &mut got[..1]),
            ErrorClass::RmaRange,
            "a read past a part",
        )?;
    }
    for r in 0..size {
        let part = window.shared_query(r as i32)?.base() as usize;
        let ok = if contiguous && r > 0 {
            let before = window.shared_query(r as i32 - 1)?;
            part == before.base() as usize + before.size()
        } else {
            part.is_multiple_of(4096)
        };
        ensure(ok, || {
            format!("rank {r}'s part at {part:#x} (contiguous: {contiguous})")
        })?;
    }
    if contiguous {
        world.barrier()?;
        if rank + 1 < size {
            // SAFETY: the window is contiguous (checked above), so the 8
            // bytes after this rank's part are the first element of the
            // next rank's part in this mapping, 8-aligned (parts of whole
            // elements after a page-aligned first); the next rank reads
            // them only after the barrier below.
            unsafe {
                own.base()
                    .add(own.size())
                    .cast::<u64>()
                    .write_volatile(value(size, rank))
            };
        }
        world.barrier()?;
        if rank > 0 {
            let mut first = [0u64];
            own.read(0, &mut first[..])?;
            same(
                &first,
                &[value(size, rank - 1)],
                "the first element after the left rank's store past its part",
            )?;
        }
    }
    expect_class(
        window.shared_query(size as i32),
        ErrorClass::Rank,
        "query of no rank",
    )?;
    // RMA on the same memory: each rank adds 1 to its right neighbour's
    // last element, and puts its rank into the first.
    let right = (rank + 1) % size;
    world.barrier()?;
    window.lock_all(0)?;
    window.accumulate(
        &[1u64][..],
        right as i32,
        len(right) - 1,
        SystemOperation::sum(),
    )?;
    window.put(&[rank as u64][..], right as i32, 0)?;
    window.unlock_all()?;
    world.barrier()?;
    let mut got = vec![0u64; len(rank)];
    own.read(0, &mut got[..])?;
    let mut want = mine;
    want[0] = ((rank + size - 1) % size) as u64;
    *want.last_mut().unwrap_or(&mut 0) += 1;
    same(
        &got,
        &want,
        "own part after the neighbour's put and accumulate",
    )?;
    world.barrier()?;
    window.free()?;
    if contiguous {
        return Ok(());
    }
    // MPI 4.1 §12.2.3 allows the query on allocated and created windows:
    // an allocated window reached directly is shared memory, and rank
    // 0's part then holds what a put wrote there; a created one (reached
    // by cross-memory attach) or one reached by messages gives empty
    // parts; a dynamic window is refused.
    let allocated = returning(Window::allocate(world, 16, 8, &Info::new()))?;
    let part = allocated.shared_query(0)?;
    if allocated.direct_access() {
        same(&[part.size()], &[16], "the part of an allocated window")?;
        allocated.lock(LockType::Exclusive, 0, 0)?;
        allocated.put(&[rank as u64 + 1][..], 0, rank % 2)?;
        allocated.unlock(0)?;
        world.barrier()?;
        // Rank 0's own put lands in slot 0 whoever's lands last.
        let mut got = [0u64; 2];
        part.read(0, &mut got[..])?;
        ensure(got[0] != 0, || {
            format!("rank 0's allocated part read {got:?} after the puts")
        })?;
    } else {
        ensure(part.size() == 0 && part.base().is_null(), || {
            "the part of an allocated window reached by messages is not empty".to_owned()
        })?;
    }
    world.barrier()?;
    allocated.free()?;
    let mut memory = [0u64; 2];
    let created = returning(Window::create(world, &mut memory[..], 8, &Info::new()))?;
    let part = created.shared_query(0)?;
    ensure(part.size() == 0 && part.base().is_null(), || {
        format!(
            "a created window's part: {} bytes at {:?}",
            part.size(),
            part.base()
        )
    })?;
    expect_class(
        part.read(0, &mut [0u64][..]),
        ErrorClass::RmaRange,
        "a read of an empty part",
    )?;
    created.free()?;
    let dynamic = returning(Window::create_dynamic(world, &Info::new()))?;
    expect_class(
        dynamic.shared_query(0).map(|_| ()),
        ErrorClass::RmaFlavor,
        "query of a dynamic window",
    )?;
    dynamic.free()
}

/// Rank 1 drops its window on user memory without `free` (erroneous, but
/// safe code): rank 0's later put to it by cross-memory attach fails with
/// `MPI_ERR_RMA_SYNC` and leaves rank 1's memory alone. Two ranks.
fn dropped(world: &Communicator) -> Result<()> {
    let rank = world.rank();
    let mut memory = vec![0u64; 4];
    let window = returning(Window::create(world, &mut memory[..], 8, &Info::new()))?;
    ensure(window.direct_access(), || {
        "dropped needs the direct path".to_owned()
    })?;
    if rank == 1 {
        drop(window);
        memory.fill(7);
        world.barrier()?;
        world.barrier()?;
        return same(&memory, &[7; 4], "memory after the window was dropped");
    }
    world.barrier()?;
    window.lock(LockType::Shared, 1, 0)?;
    expect_class(
        window.put(&[1u64][..], 1, 0),
        ErrorClass::RmaSync,
        "a put to a dropped window",
    )?;
    window.unlock(1)?;
    world.barrier()?;
    drop(window);
    Ok(())
}

/// See the module docs: after its remote access error the connection
/// between ranks 0 and 1 is broken (RC), so rank 2 tells rank 1 when
/// rank 0 is done.
fn revoked(world: &Communicator) -> Result<()> {
    let rank = world.rank();
    let mut memory = vec![0u64; 4];
    let window = returning(Window::create(world, &mut memory[..], 8, &Info::new()))?;
    ensure(window.rdma_access(), || {
        "revoked needs the RDMA path".to_owned()
    })?;
    match rank {
        1 => {
            drop(window);
            memory.fill(7);
            world.barrier()?;
            let (_, _) = world.process_at_rank(2).receive::<u64>()?;
            return same(&memory, &[7; 4], "memory after the window was dropped");
        }
        0 => {
            world.barrier()?;
            window.lock(LockType::Exclusive, 1, MODE_NOCHECK)?;
            window.put(&[1u64; 4][..], 1, 0)?;
            let flushed = window.flush(1);
            if let Err(e) = &flushed {
                ensure(e.message().contains("REM_ACCESS_ERR"), || {
                    format!("the error does not name the remote access error: {e}")
                })?;
            }
            expect_class(
                flushed,
                ErrorClass::RmaRange,
                "a flush of a put to a revoked window",
            )?;
            window.unlock(1)?;
            // Rank 2 is still reached, through its window and by messages.
            window.lock(LockType::Shared, 2, 0)?;
            window.put(&[5u64][..], 2, 0)?;
            window.unlock(2)?;
            world.process_at_rank(2).send(&1u64)?;
        }
        _ => {
            world.barrier()?;
            let (_, _) = world.process_at_rank(0).receive::<u64>()?;
            let mut got = [0u64];
            window.read_local(0, &mut got)?;
            same(&got, &[5], "rank 0's put")?;
            world.process_at_rank(1).send(&1u64)?;
        }
    }
    // Not freed: free is collective, and rank 1 is out.
    drop(window);
    Ok(())
}

/// See the module docs. Rank 1 stops reading (outside MPI) once rank 0
/// says it starts its put, so the put's data fills the sockets and the
/// put is still under way when the connections go.
fn lost_peer(world: &Communicator) -> Result<()> {
    const LEN: usize = 64 << 20;
    const BOUND: Duration = Duration::from_secs(10);
    ensure(world.size() == 2, || "lost_peer runs on 2 ranks".to_owned())?;
    let window = returning(Window::allocate(world, LEN + 8, 1, &Info::new()))?;
    world.barrier()?;
    if world.rank() == 1 {
        world.process_at_rank(0).receive::<u8>()?;
        std::thread::sleep(Duration::from_millis(300));
        let shut = shut_down_tcp_connections()?;
        ensure(shut > 0, || {
            "rank 1 had no TCP connection to shut down".to_owned()
        })?;
        drop(window);
        return Ok(());
    }
    window.lock(LockType::Shared, 1, MODE_NOCHECK)?;
    world.process_at_rank(1).send(&1u8)?;
    let data = vec![5u8; LEN];
    let mut early = [0u8; 8];
    let started = Instant::now();
    oxmpi::request::scope(|scope| -> Result<()> {
        // A get and a small put queued first: they leave ahead of the
        // large put's data, and no answer comes.
        let get = window.rget(scope, &mut early[..], 1, LEN)?;
        window.put(&[1u8; 8][..], 1, LEN)?;
        expect_class(
            window.put(&data[..], 1, 0),
            ErrorClass::ProcFailed,
            "a put whose target is lost in the middle",
        )?;
        expect_class(
            get.wait(),
            ErrorClass::ProcFailed,
            "a get whose target is lost before it answered",
        )
    })?;
    expect_class(
        window.flush(1),
        ErrorClass::ProcFailed,
        "the flush after the lost put",
    )?;
    ensure(started.elapsed() < BOUND, || {
        format!("the put and flush took {:?}", started.elapsed())
    })?;
    // Later operations fail at once, and the epoch ends.
    expect_class(
        window
            .put(&[2u8; 8][..], 1, 0)
            .and_then(|()| window.flush(1)),
        ErrorClass::ProcFailed,
        "a put and flush after the loss",
    )?;
    let mut back = [0u8; 8];
    expect_class(
        window.get(&mut back[..], 1, 0),
        ErrorClass::ProcFailed,
        "a get after the loss",
    )?;
    // The get's batch, sent by its wait, failed: recorded for the window
    // too, so the unlock may report it.
    match window.unlock(1) {
        Err(e) if e.class() != ErrorClass::ProcFailed => return Err(e),
        _ => {}
    }
    ensure(started.elapsed() < BOUND, || {
        format!("the operations after the loss took {:?}", started.elapsed())
    })?;
    // A fence and a free whose flush and barrier both fail call the
    // window's handler once each, as any failed call does (the barrier
    // inside used to call it a second time).
    let calls = Arc::new(AtomicUsize::new(0));
    window.set_error_handler(ErrorHandler::user({
        let calls = Arc::clone(&calls);
        move |_, _| {
            calls.fetch_add(1, Ordering::Relaxed);
        }
    }));
    expect_class(
        window.fence(0),
        ErrorClass::ProcFailed,
        "a fence with the peer lost",
    )?;
    let after_fence = calls.load(Ordering::Relaxed);
    expect_class(
        window.free(),
        ErrorClass::ProcFailed,
        "a free with the peer lost",
    )?;
    let after_free = calls.load(Ordering::Relaxed);
    ensure((after_fence, after_free) == (1, 2), || {
        format!(
            "the window's handler was called {after_fence} times for the failed fence and \
             {} for the failed free, not once each",
            after_free - after_fence
        )
    })?;
    ensure(started.elapsed() < BOUND, || {
        format!(
            "the fence and free after the loss took {:?}",
            started.elapsed()
        )
    })?;
    Ok(())
}

/// See the module docs. Windows are dropped, not freed: `free` is
/// collective, and rank 1 is gone.
fn lost_holder(world: &Communicator) -> Result<()> {
    const BOUND: Duration = Duration::from_secs(10);
    ensure(world.size() == 3, || {
        "lost_holder runs on 3 ranks".to_owned()
    })?;
    let window = returning(Window::allocate(world, 8, 1, &Info::new()))?;
    world.barrier()?;
    match world.rank() {
        0 => {
            // Polls (grants rank 1's lock, sees it lost) until rank 2 is
            // done.
            world.process_at_rank(2).receive::<u8>()?;
        }
        1 => {
            window.lock(LockType::Exclusive, 0, 0)?;
            // The flush waits for the grant: rank 1 holds the lock (the
            // request alone leaves with the epoch's first operation).
            window.flush(0)?;
            world.process_at_rank(2).send(&1u8)?;
            let shut = shut_down_tcp_connections()?;
            ensure(shut > 0, || {
                "rank 1 had no TCP connection to shut down".to_owned()
            })?;
        }
        _ => {
            world.process_at_rank(1).receive::<u8>()?;
            let started = Instant::now();
            window.lock(LockType::Exclusive, 0, 0)?;
            window.put(&[2u8; 8][..], 0, 0)?;
            window.unlock(0)?;
            ensure(started.elapsed() < BOUND, || {
                format!(
                    "the lock a lost rank held took {:?} to pass on",
                    started.elapsed()
                )
            })?;
            world.process_at_rank(0).send(&2u8)?;
        }
    }
    drop(window);
    Ok(())
}

/// See the module docs. The window is dropped, not freed: `free` is
/// collective, and rank 1 is gone.
fn lost_pscw(world: &Communicator) -> Result<()> {
    const BOUND: Duration = Duration::from_secs(10);
    ensure(world.size() == 3, || "lost_pscw runs on 3 ranks".to_owned())?;
    let window = returning(Window::allocate(world, 8, 8, &Info::new()))?;
    let others = world.group().include(&[1, 2])?;
    let zero = world.group().include(&[0])?;
    world.barrier()?;
    match world.rank() {
        0 => {
            window.post(&others, 0)?;
            window.start(&others, 0)?;
            window.put(&[7u64][..], 1, 0)?;
            window.put(&[7u64][..], 2, 0)?;
            world.process_at_rank(1).send(&1u8)?;
            // Rank 1 shuts its connections meanwhile.
            std::thread::sleep(Duration::from_millis(300));
            let started = Instant::now();
            expect_class(
                window.complete(),
                ErrorClass::ProcFailed,
                "a complete whose target (rank 1) is lost",
            )?;
            // Rank 2 completed its epoch to this rank; rank 1 never will.
            expect_class(
                window.wait(),
                ErrorClass::ProcFailed,
                "a wait whose origin (rank 1) is lost",
            )?;
            let mut got = [0u64];
            window.read_local(0, &mut got)?;
            same(&got, &[9], "rank 2's put, completed")?;
            expect_class(
                window.start(&world.group().include(&[1])?, 0),
                ErrorClass::ProcFailed,
                "a start whose target (rank 1) is lost before its post",
            )?;
            ensure(started.elapsed() < BOUND, || {
                format!(
                    "complete, wait and start with a lost rank took {:?}",
                    started.elapsed()
                )
            })?;
        }
        1 => {
            window.post(&zero, 0)?;
            world.process_at_rank(0).receive::<u8>()?;
            let shut = shut_down_tcp_connections()?;
            ensure(shut > 0, || {
                "rank 1 had no TCP connection to shut down".to_owned()
            })?;
        }
        _ => {
            window.post(&zero, 0)?;
            window.start(&zero, 0)?;
            window.put(&[9u64][..], 0, 0)?;
            window.complete()?;
            // Rank 0's complete comes though its other target is lost.
            let started = Instant::now();
            window.wait()?;
            ensure(started.elapsed() < BOUND, || {
                format!("rank 2's wait took {:?}", started.elapsed())
            })?;
            let mut got = [0u64];
            window.read_local(0, &mut got)?;
            same(&got, &[7], "rank 0's put, completed")?;
        }
    }
    drop(window);
    Ok(())
}

/// See the module docs: 3 ranks, on a window of two `u64` slots at rank 0.
fn deferred(world: &Communicator) -> Result<()> {
    const MINE: u64 = 11;
    const THEIRS: u64 = 22;
    ensure(world.size() == 3, || "deferred runs on 3 ranks".to_owned())?;
    let window = Window::allocate(world, 16, 8, &Info::new())?;
    world.barrier()?;
    match world.rank() {
        0 => {
            // Polls (handles both epochs) until rank 2 is done.
            world.process_at_rank(2).receive::<u8>()?;
            let mut got = [0u64; 2];
            window.read_local(0, &mut got)?;
            same(&got, &[THEIRS, MINE], "the window after both epochs")?;
        }
        1 => {
            window.lock(LockType::Exclusive, 0, 0)?;
            // The flush waits for the grant: rank 1 holds the lock.
            window.flush(0)?;
            world.process_at_rank(2).send(&1u8)?;
            world.process_at_rank(2).receive::<u8>()?;
            // Rank 2's lock request and put reach rank 0 meanwhile.
            std::thread::sleep(Duration::from_millis(300));
            let mut slot = [7u64];
            window.get(&mut slot[..], 0, 0)?;
            same(&slot, &[0], "slot 0 while rank 1 holds the lock")?;
            window.put(&[MINE][..], 0, 1)?;
            window.unlock(0)?;
        }
        _ => {
            world.process_at_rank(1).receive::<u8>()?;
            world.process_at_rank(1).send(&2u8)?;
            // Over active messages the flush sends the lock request and
            // the put, and waits for both: the grant comes once rank 1
            // unlocked (on the direct path the lock waits for that).
            window.lock(LockType::Exclusive, 0, 0)?;
            window.put(&[THEIRS][..], 0, 0)?;
            window.flush(0)?;
            let mut both = [0u64; 2];
            window.get(&mut both[..], 0, 0)?;
            window.unlock(0)?;
            same(&both, &[THEIRS, MINE], "both slots under rank 2's lock")?;
            world.process_at_rank(0).send(&2u8)?;
        }
    }
    world.barrier()?;
    window.free()?;
    deferred_placed(world)
}

/// The puts of [`deferred`] large enough to travel as placed active
/// messages, into a dynamic window at rank 0 (active messages on every
/// transport): see the module docs.
fn deferred_placed(world: &Communicator) -> Result<()> {
    const MINE: u64 = 11;
    const BOUND: Duration = Duration::from_secs(20);
    // One piece at the least placed size, one of the most, and three
    // (the second held behind the first).
    let sizes = [64 << 10, 1 << 20, (2 << 20) + 8];
    let most = sizes[2];
    let mut region = vec![0u8; if world.rank() == 0 { most } else { 0 }];
    let window = Window::create_dynamic(world, &Info::new())?;
    let at = if world.rank() == 0 {
        window.attach(&mut region[..])?
    } else {
        0
    };
    let mut addresses = [0u64; 3];
    world.all_gather_into(&(at as u64), &mut addresses[..])?;
    let base = addresses[0] as usize;
    let pattern = |len: usize, seed: usize| -> Vec<u8> {
        (0..len)
            .map(|i| (i.wrapping_mul(31) ^ seed) as u8 | 1)
            .collect()
    };
    // The attached memory is the window's while it lives: rank 0 reads
    // and clears it by one-sided calls to itself.
    let read_own = |len: usize| -> Result<Vec<u8>> {
        let mut got = vec![0u8; len];
        window.lock(LockType::Shared, 0, 0)?;
        window.get(&mut got[..], 0, base)?;
        window.unlock(0)?;
        Ok(got)
    };
    for (round, &len) in sizes.iter().enumerate() {
        world.barrier()?;
        let theirs = pattern(len, round);
        match world.rank() {
            0 => {
                // Polls (handles both epochs, takes the data) until rank
                // 2 is done.
                world.process_at_rank(2).receive::<u8>()?;
                same(
                    &read_own(len)?,
                    &theirs[..],
                    &format!("the window after rank 2's put of {len} bytes"),
                )?;
            }
            1 => {
                window.lock(LockType::Exclusive, 0, 0)?;
                window.flush(0)?;
                world.process_at_rank(2).send(&1u8)?;
                // Rank 2 says its put returned: it did not wait for the
                // grant, which comes only once this rank unlocks.
                let since = Instant::now();
                while world.process_at_rank(2).immediate_probe()?.is_none() {
                    ensure(since.elapsed() < BOUND, || {
                        format!(
                            "after {BOUND:?} rank 2's put of {len} bytes had not returned: \
                             it waits for its lock's grant"
                        )
                    })?;
                }
                world.process_at_rank(2).receive::<u8>()?;
                // Its data reaches rank 0 meanwhile.
                std::thread::sleep(Duration::from_millis(300));
                let mut seen = vec![1u8; len];
                window.get(&mut seen[..], 0, base)?;
                window.flush(0)?;
                ensure(seen.iter().all(|&b| b == 0), || {
                    format!("rank 2's put of {len} bytes landed while rank 1 held the lock")
                })?;
                // Overwritten by rank 2's put, applied once granted.
                window.put(&[MINE][..], 0, base)?;
                window.unlock(0)?;
            }
            _ => {
                world.process_at_rank(1).receive::<u8>()?;
                window.lock(LockType::Exclusive, 0, 0)?;
                window.put(&theirs[..], 0, base)?;
                world.process_at_rank(1).send(&2u8)?;
                window.unlock(0)?;
                world.process_at_rank(0).send(&2u8)?;
            }
        }
        // Uncontended: the request is granted as the data arrives.
        world.barrier()?;
        let again = pattern(len, round + 7);
        match world.rank() {
            0 => {
                world.process_at_rank(2).receive::<u8>()?;
                same(
                    &read_own(len)?,
                    &again[..],
                    &format!("the window after an uncontended put of {len} bytes"),
                )?;
                // Untouched again for the next round's check.
                window.lock(LockType::Exclusive, 0, 0)?;
                window.put(&vec![0u8; len][..], 0, base)?;
                window.unlock(0)?;
            }
            2 => {
                window.lock(LockType::Exclusive, 0, 0)?;
                window.put(&again[..], 0, base)?;
                window.unlock(0)?;
                world.process_at_rank(0).send(&2u8)?;
            }
            _ => {}
        }
    }
    world.barrier()?;
    if world.rank() == 0 {
        window.detach(at)?;
    }
    window.free()
}

/// Shuts down (both ways) every connected TCP socket of this process
/// but the process manager's (`PMI_FD`): its connections to the other
/// ranks, which then see this rank as lost. How many it shut.
fn shut_down_tcp_connections() -> Result<usize> {
    let pmi: Option<i32> = std::env::var("PMI_FD").ok().and_then(|v| v.parse().ok());
    let fds = std::fs::read_dir("/proc/self/fd")
        .map_err(|e| fail(format!("listing /proc/self/fd: {e}")))?;
    let mut shut = 0;
    for entry in fds.flatten() {
        let Some(fd) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        if Some(fd) == pmi {
            continue;
        }
        // SAFETY: an all-zero sockaddr_storage is a valid value.
        let mut peer: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        // SAFETY: `peer` is writable for `len` bytes; a descriptor that is
        // no connected socket (or closed meanwhile) only fails the call.
        let connected =
            unsafe { libc::getpeername(fd, (&raw mut peer).cast::<libc::sockaddr>(), &mut len) }
                == 0;
        let inet = [libc::AF_INET, libc::AF_INET6].contains(&i32::from(peer.ss_family));
        // SAFETY: shutdown has no memory-safety preconditions.
        if connected && inet && unsafe { libc::shutdown(fd, libc::SHUT_RDWR) } == 0 {
            shut += 1;
        }
    }
    Ok(shut)
}

/// A value-index pair's number types, made from small integers.
trait PairNumber: Equivalence + Copy + PartialOrd + std::fmt::Debug + Default {
    fn from_small(v: i32) -> Self;
}

macro_rules! pair_numbers {
    ($($t:ty),*) => {$(
        impl PairNumber for $t {
            fn from_small(v: i32) -> $t {
                v as $t
            }
        }
    )*};
}

pair_numbers!(i16, i32, i64, u64, f32, f64);

/// `MPI_MINLOC` (`smaller_first`) or `MPI_MAXLOC` over a set of pairs, as
/// the standard defines it: the best value, with the smallest index of
/// the pairs that hold it. A reference written apart from the library's
/// kernel, which combines two pairs at a time.
fn reference_loc<V: PairNumber, I: PairNumber>(
    candidates: impl Iterator<Item = ValueIndex<V, I>> + Clone,
    smaller_first: bool,
) -> ValueIndex<V, I> {
    let better = |a: V, b: V| if smaller_first { a < b } else { a > b };
    let values = candidates.clone().map(|p| p.value);
    let value = values.reduce(|best, v| if better(v, best) { v } else { best });
    let holders = candidates.filter(|p| Some(p.value) == value);
    let index = holders
        .map(|p| p.index)
        .reduce(|a, b| if b < a { b } else { a });
    ValueIndex {
        value: value.unwrap_or_default(),
        index: index.unwrap_or_default(),
    }
}

/// `MPI_MINLOC` and `MPI_MAXLOC` accumulates on every kind of pair type:
/// `MPI_DOUBLE_INT` (12 bytes packed, 16 in memory), `MPI_2INT` (whose
/// signature is two `MPI_INT`s), `MPI_SHORT_INT` (6 bytes), `MPI_FLOAT_INT`
/// and a pair of `u64` value and `i64` index, on allocated and created
/// windows: [`locations_of`] each.
fn locations(world: &Communicator) -> Result<()> {
    locations_of::<f64, i32>(world)?;
    locations_of::<i32, i32>(world)?;
    locations_of::<i16, i32>(world)?;
    locations_of::<f32, i32>(world)?;
    locations_of::<u64, i64>(world)
}

/// Pairs per region of [`locations_of`]'s windows.
const PAIRS: usize = 8;

/// On windows of `ValueIndex<V, I>` pairs (packed, as the contiguous
/// operations leave them), allocated and then created: every rank
/// accumulates its pairs (values 0 to 2, the same for ranks 2k and
/// 2k + 1, so the best values tie, with indices that fall as ranks rise,
/// so a tie is won by the higher rank, not the first to arrive) into
/// every rank under shared locks, twice over (`MPI_MINLOC` into region
/// 0, `MPI_MAXLOC` through a derived origin datatype, a contiguous run
/// of pairs, into region 1), and `MPI_MAXLOC` by `accumulate` under
/// fence (region 2; `raccumulate` refused there); then in turn `get_accumulate` or `rget_accumulate`
/// (which refuses a result of pairs with padding) `MPI_MINLOC` into rank
/// 0's region 3 and `fetch_and_op` `MPI_MAXLOC` of one pair into its
/// region 4, each checking the old pairs it got, a `MPI_MINLOC` of more
/// than 1 MiB into rank 0 (over TCP by message, or in 128 KiB messages
/// where the pieces would split pairs), and `accumulate_typed`
/// `MPI_MINLOC` into pairs laid out as C lays them (with padding, 16
/// bytes for `MPI_DOUBLE_INT`; between value and index for
/// `MPI_SHORT_INT`, which parts them); and every rank's
/// `accumulate_typed` `MPI_MINLOC` of one pair, under shared locks, into
/// the last rank's pair laid out index first (a layout that parts value
/// from index for every type). Each target then compares its
/// window with a reference computed here ([`reference_loc`]). Refused,
/// with nothing written: `MPI_MINLOC` on `MPI_INT` and in a fetch-and-op
/// of an `i32` (`MPI_ERR_OP`), `MPI_SUM` on pairs (`MPI_ERR_OP`) and a
/// `get_accumulate` of pairs into a result of bytes (`MPI_ERR_TYPE`).
fn locations_of<V: PairNumber, I: PairNumber>(world: &Communicator) -> Result<()>
where
    ValueIndex<V, I>: Equivalence,
{
    let (rank, size) = (world.rank() as usize, world.size() as usize);
    let name = std::any::type_name::<ValueIndex<V, I>>();
    let pair_type = ValueIndex::<V, I>::equivalent_datatype();
    let packed = pair_type.size();
    let pair = |v: i32, index: i32| ValueIndex {
        value: V::from_small(v),
        index: I::from_small(index),
    };
    let mine_of = |r: usize| -> Vec<_> {
        (0..PAIRS)
            .map(|i| pair(((r / 2 + i) % 3) as i32, ((size - r) * 100 + i) as i32))
            .collect()
    };
    let start: Vec<_> = (0..PAIRS).map(|i| pair(1, 1000 + i as i32)).collect();
    let fold = |ranks: std::ops::Range<usize>, smaller_first: bool| -> Vec<_> {
        let theirs: Vec<_> = ranks.map(mine_of).collect();
        (0..PAIRS)
            .map(|i| {
                let candidates = theirs.iter().map(|pairs| pairs[i]);
                reference_loc(candidates.chain([start[i]]), smaller_first)
            })
            .collect()
    };
    let mine = mine_of(rank);
    let region = |k: usize| k * PAIRS * packed;
    // More than 1 MiB of pairs: by message over TCP where its pieces hold
    // whole pairs.
    let large = (1 << 20) / packed + 1;
    let large_of = |r: usize| -> Vec<_> {
        (0..large)
            .map(|i| pair(((r / 2 + i) % 4) as i32, ((size - r) * 3 + i % 5) as i32))
            .collect()
    };
    // Pairs as C lays them out (`MPI_DOUBLE_INT`'s 16 bytes), reached
    // through a target datatype.
    let typed_at = region(5) + large * packed;
    let layout = TargetLayout::new(PAIRS, &pair_type);
    // A pair laid out index first: its value and its index are segments
    // of their own, neither a whole pair.
    let split_at = typed_at + PAIRS * std::mem::size_of::<ValueIndex<V, I>>();
    let split = UserDatatype::structured(
        &[1, 1],
        &[std::mem::size_of::<I>() as _, 0],
        &[&V::equivalent_datatype(), &I::equivalent_datatype()],
    )?;
    let split_layout = TargetLayout::new(1, &split);
    let window_len = split_at + std::mem::size_of::<I>() + std::mem::size_of::<V>();
    let mut memory = vec![0u8; window_len];
    for created in [false, true] {
        let window = if created {
            returning(Window::create(world, &mut memory[..], 1, &Info::new()))?
        } else {
            returning(Window::allocate(world, window_len, 1, &Info::new()))?
        };
        let what = |part: &str| {
            format!(
                "{name} on {} window: {part}",
                if created { "a created" } else { "an allocated" }
            )
        };
        window.lock(LockType::Exclusive, rank as i32, 0)?;
        for k in 0..5 {
            window.put(&start[..], rank as i32, region(k))?;
        }
        window.put(&vec![pair(9, 9); large][..], rank as i32, region(5))?;
        window.put_typed(&start[..], rank as i32, typed_at, layout)?;
        window.put_typed(&start[..1], rank as i32, split_at, split_layout)?;
        window.unlock(rank as i32)?;
        world.barrier()?;
        // Under shared locks, every rank into every rank.
        // The pairs packed (plain bytes), seen through a run of a pair
        // type of their packed layout: a derived datatype of pairs.
        let packed_pair = UserDatatype::structured(
            &[1, 1],
            &[0, std::mem::size_of::<V>() as _],
            &[&V::equivalent_datatype(), &I::equivalent_datatype()],
        )?;
        let packed_pair = UserDatatype::resized(&packed_pair, 0, packed as _)?;
        let run = UserDatatype::contiguous(PAIRS as i32, &packed_pair)?;
        let mine_packed = world.pack(&mine[..])?;
        for t in 0..size as i32 {
            window.lock(LockType::Shared, t, 0)?;
            for _ in 0..2 {
                window.accumulate(&mine[..], t, region(0), SystemOperation::min_loc())?;
                window.accumulate(
                    &View::with_count_and_datatype(&mine_packed[..], 1, &run)?,
                    t,
                    region(1),
                    SystemOperation::max_loc(),
                )?;
            }
            window.unlock(t)?;
        }
        // Under fence, where the request-based form is refused (MPI 4.1
        // §12.3.5) before anything moves.
        window.fence(0)?;
        for t in 0..size as i32 {
            expect_class(
                window
                    .raccumulate(&mine[..], t, region(2), SystemOperation::max_loc())
                    .map(drop),
                ErrorClass::RmaSync,
                &what("raccumulate under fence"),
            )?;
            window.accumulate(&mine[..], t, region(2), SystemOperation::max_loc())?;
        }
        window.fence(0)?;
        // In turn, into rank 0, with the old pairs back.
        for turn in 0..size {
            if turn == rank {
                let mut old = vec![ValueIndex::<V, I>::default(); PAIRS];
                let mut old_one = ValueIndex::<V, I>::default();
                window.lock(LockType::Shared, 0, 0)?;
                // `rget_accumulate` writes the result's own bytes: pairs
                // with padding are refused (and go by `get_accumulate`).
                let plain = packed == std::mem::size_of::<ValueIndex<V, I>>();
                if !plain {
                    oxmpi::request::scope(|scope| {
                        expect_class(
                            window.rget_accumulate(
                                scope,
                                &mine[..],
                                &mut old[..],
                                0,
                                region(3),
                                SystemOperation::min_loc(),
                            ),
                            ErrorClass::Buffer,
                            &what("rget_accumulate into padded pairs"),
                        )
                    })?;
                }
                if rank % 2 == 0 || !plain {
                    window.get_accumulate(
                        &mine[..],
                        &mut old[..],
                        0,
                        region(3),
                        SystemOperation::min_loc(),
                    )?;
                } else {
                    oxmpi::request::scope(|scope| -> Result<()> {
                        window
                            .rget_accumulate(
                                scope,
                                &mine[..],
                                &mut old[..],
                                0,
                                region(3),
                                SystemOperation::min_loc(),
                            )?
                            .wait()?;
                        Ok(())
                    })?;
                }
                window.fetch_and_op(
                    &mine[0],
                    &mut old_one,
                    0,
                    region(4),
                    SystemOperation::max_loc(),
                )?;
                window.accumulate(
                    &large_of(rank)[..],
                    0,
                    region(5),
                    SystemOperation::min_loc(),
                )?;
                window.accumulate_typed(
                    &mine[..],
                    0,
                    typed_at,
                    layout,
                    SystemOperation::min_loc(),
                )?;
                window.unlock(0)?;
                same(
                    &old,
                    &fold(0..rank, true),
                    &what("get_accumulate's old pairs"),
                )?;
                let want = fold(0..rank, false)[0];
                ensure(old_one == want, || {
                    what(&format!("fetch_and_op got {old_one:?}, expected {want:?}"))
                })?;
            }
            world.barrier()?;
        }
        // Refused, with nothing written.
        let t = (size - 1) as i32;
        let free_pair = region(4) + packed;
        window.lock(LockType::Shared, t, 0)?;
        expect_class(
            window.accumulate(&[1i32, 2][..], t, free_pair, SystemOperation::min_loc()),
            ErrorClass::Op,
            &what("MPI_MINLOC on MPI_INT"),
        )?;
        expect_class(
            window.fetch_and_op(&1i32, &mut 0i32, t, free_pair, SystemOperation::min_loc()),
            ErrorClass::Op,
            &what("fetch_and_op MPI_MINLOC of an i32"),
        )?;
        // (A pair of two values of one type, `MPI_2INT`, is also two
        // numbers by its signature, which `MPI_SUM` takes.)
        if std::any::type_name::<V>() != std::any::type_name::<I>() {
            expect_class(
                window.accumulate(&mine[..1], t, free_pair, SystemOperation::sum()),
                ErrorClass::Op,
                &what("MPI_SUM on pairs"),
            )?;
        }
        let mut bytes = vec![0u8; packed];
        expect_class(
            window.get_accumulate(
                &mine[..1],
                &mut bytes[..],
                t,
                free_pair,
                SystemOperation::min_loc(),
            ),
            ErrorClass::Type,
            &what("get_accumulate of pairs into bytes"),
        )?;
        // Into a target layout with the index below the value, from every
        // rank at once.
        window.accumulate_typed(
            &mine[..1],
            t,
            split_at,
            split_layout,
            SystemOperation::min_loc(),
        )?;
        window.unlock(t)?;
        world.barrier()?;
        // Each target checks its own window.
        let me = rank as i32;
        let mut got = vec![ValueIndex::<V, I>::default(); PAIRS];
        window.lock(LockType::Shared, me, 0)?;
        let everyone = 0..size;
        let untouched = start.clone();
        let rank0 =
            |folded: Vec<ValueIndex<V, I>>| if rank == 0 { folded } else { untouched.clone() };
        let mut last_pairs = untouched.clone();
        if rank == 0 {
            last_pairs[0] = fold(everyone.clone(), false)[0];
        }
        for (k, want, part) in [
            (
                0,
                fold(everyone.clone(), true),
                "MPI_MINLOC under shared locks",
            ),
            (
                1,
                fold(everyone.clone(), false),
                "MPI_MAXLOC of a derived origin",
            ),
            (2, fold(everyone.clone(), false), "MPI_MAXLOC under fence"),
            (
                3,
                rank0(fold(everyone.clone(), true)),
                "get_accumulate MPI_MINLOC",
            ),
            (
                4,
                last_pairs,
                "fetch_and_op MPI_MAXLOC and the refused ones",
            ),
        ] {
            window.get(&mut got[..], me, region(k))?;
            same(&got, &want, &what(part))?;
        }
        window.get_typed(&mut got[..], me, typed_at, layout)?;
        same(
            &got,
            &rank0(fold(everyone.clone(), true)),
            &what("accumulate_typed MPI_MINLOC into C-laid pairs"),
        )?;
        window.get_typed(&mut got[..1], me, split_at, split_layout)?;
        let want = if me == t {
            fold(everyone.clone(), true)[0]
        } else {
            start[0]
        };
        same(
            &got[..1],
            &[want],
            &what("accumulate_typed MPI_MINLOC into a pair laid out index first"),
        )?;
        let mut large_got = vec![ValueIndex::<V, I>::default(); large];
        window.get(&mut large_got[..], me, region(5))?;
        window.unlock(me)?;
        let mut large_want = vec![pair(9, 9); large];
        if rank == 0 {
            let theirs: Vec<_> = everyone.map(large_of).collect();
            for (i, want) in large_want.iter_mut().enumerate() {
                let candidates = theirs.iter().map(|pairs| pairs[i]);
                *want = reference_loc(candidates.chain([pair(9, 9)]), true);
            }
        }
        same(
            &large_got,
            &large_want,
            &what("MPI_MINLOC of more than 1 MiB"),
        )?;
        window.free()?;
    }
    Ok(())
}
