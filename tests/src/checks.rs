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

/// Checks that `result` failed with `class`.
pub fn expect_class<T: Debug>(result: Result<T>, class: ErrorClass, what: &str) -> Result<()> {
    match result {
        Err(e) if e.class() == class => Ok(()),
        other => Err(fail(format!("{what}: expected {class}, got {other:?}"))),
    }
}
