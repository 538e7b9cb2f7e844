//! Checks for the test programs (`src/bin`): each turns a wrong result
//! into an `oxmpi` error (class `MPI_ERR_OTHER` unless it is about a
//! class) that says what was wrong, so a program can report it and abort
//! its job.

use oxmpi::{Communicator, Error, ErrorClass, Result};
use std::fmt::Debug;

/// An error saying `message`.
pub fn fail(message: impl Into<String>) -> Error {
    Error::new(ErrorClass::Other, message)
}

/// `Ok` if `ok`, else an error saying `message()`.
pub fn ensure(ok: bool, message: impl FnOnce() -> String) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(fail(message()))
    }
}

/// Checks that `got` equals `expected`, naming the first difference.
pub fn same<T: PartialEq + Debug>(got: &[T], expected: &[T], what: &str) -> Result<()> {
    ensure(got.len() == expected.len(), || {
        format!(
            "{what}: {} elements, expected {}",
            got.len(),
            expected.len()
        )
    })?;
    match got.iter().zip(expected).position(|(g, e)| g != e) {
        None => Ok(()),
        Some(i) => Err(fail(format!(
            "{what}: element {i} of {} is {:?}, expected {:?}",
            got.len(),
            got[i],
            expected[i]
        ))),
    }
}

/// The processor time this process has used so far (all its threads).
pub fn cpu_time() -> Result<std::time::Duration> {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid timespec the call writes and outlives it.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut now) };
    if rc != 0 {
        return Err(fail(format!(
            "reading the process's processor time: {}",
            std::io::Error::last_os_error()
        )));
    }
    Ok(std::time::Duration::new(
        u64::try_from(now.tv_sec).unwrap_or(0),
        u32::try_from(now.tv_nsec).unwrap_or(0),
    ))
}

/// The process's peak resident memory (`VmHWM`) in KiB.
pub fn peak_kib() -> Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")
        .map_err(|e| fail(format!("reading /proc/self/status: {e}")))?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| fail("no VmHWM in /proc/self/status"))
}

/// The bound of the `pieces_memory` checks on the growth of a process's
/// peak memory over a collective of 32 MiB of strided data (packed
/// whole, it would grow by 32 MiB).
pub const PIECES_BOUND_KIB: u64 = 4 << 10;

/// Resets this process's peak resident memory to what it holds now
/// (`/proc/self/clear_refs`), so that the next peak measured is that of
/// what follows alone, not of something larger before it; returns it.
pub fn reset_peak() -> Result<u64> {
    std::fs::write("/proc/self/clear_refs", "5")
        .map_err(|e| fail(format!("resetting the peak memory: {e}")))?;
    peak_kib()
}

/// Runs `collective` (`what`) after a barrier on `comm` and checks that
/// it grows this process's peak memory by less than [`PIECES_BOUND_KIB`]
/// (and says by how much: `pieces_memory: rank R: WHAT: +N KiB ...`).
pub fn within_pieces_bound(
    comm: &Communicator,
    what: &str,
    collective: impl FnOnce() -> Result<()>,
) -> Result<()> {
    within_peak_growth(comm, what, PIECES_BOUND_KIB, collective)
}

/// [`within_pieces_bound`] with a bound of `bound_kib` KiB.
pub fn within_peak_growth(
    comm: &Communicator,
    what: &str,
    bound_kib: u64,
    collective: impl FnOnce() -> Result<()>,
) -> Result<()> {
    let rank = comm.rank();
    comm.barrier()?;
    let before = reset_peak()?;
    collective()?;
    let grown = peak_kib()?.saturating_sub(before);
    println!("pieces_memory: rank {rank}: {what}: +{grown} KiB of peak memory");
    ensure(grown < bound_kib, || {
        format!(
            "rank {rank}'s peak memory grew by {grown} KiB over {what} (bound \
             {bound_kib} KiB): the data was packed whole"
        )
    })
}

/// Checks that rows `rows` of the first column of the two-column matrix
/// `m` hold `expected(row)`, without a copy of the column.
pub fn first_column_is(
    m: &[f64],
    rows: std::ops::Range<usize>,
    expected: impl Fn(usize) -> f64,
    what: &str,
) -> Result<()> {
    match rows.clone().find(|&r| m[2 * r] != expected(r)) {
        Some(r) => Err(fail(format!(
            "{what}: row {r} holds {} where {} belongs",
            m[2 * r],
            expected(r)
        ))),
        None => Ok(()),
    }
}

/// Checks that `result` failed with `class`.
pub fn expect_class<T: Debug>(result: Result<T>, class: ErrorClass, what: &str) -> Result<()> {
    match result {
        Err(e) if e.class() == class => Ok(()),
        other => Err(fail(format!("{what}: expected {class}, got {other:?}"))),
    }
}

/// Byte `i` of the test message `seed`: a pattern that differs between
/// messages and along one, so a byte in the wrong place or from the
/// wrong message shows.
pub fn pattern(seed: u64, i: usize) -> u8 {
    let x = (i as u64).wrapping_add(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    (x ^ (x >> 7) ^ (x >> 17)) as u8
}

/// The test message `seed` of `len` bytes.
pub fn filled(seed: u64, len: usize) -> Vec<u8> {
    (0..len).map(|i| pattern(seed, i)).collect()
}

/// Fills `out` with the test message `seed`.
pub fn fill(seed: u64, out: &mut [u8]) {
    for (i, b) in out.iter_mut().enumerate() {
        *b = pattern(seed, i);
    }
}

/// That `got` is the test message `seed`: else an error naming the first
/// wrong byte.
pub fn check_bytes(seed: u64, got: &[u8], what: &str) -> Result<()> {
    match got
        .iter()
        .enumerate()
        .find(|&(i, &b)| b != pattern(seed, i))
    {
        None => Ok(()),
        Some((i, b)) => Err(fail(format!(
            "{what}: byte {i} of {} is {b:#04x}, expected {:#04x}",
            got.len(),
            pattern(seed, i)
        ))),
    }
}
