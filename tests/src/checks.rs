//! Checks for the test programs (`src/bin`): each turns a wrong result
//! into an `oxmpi` error (class `MPI_ERR_OTHER` unless it is about a
//! class) that says what was wrong, so a program can report it and abort
//! its job.

use oxmpi::{Error, ErrorClass, Result};
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
