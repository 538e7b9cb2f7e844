//! Error handlers of communicators (MPI 4.1 §9.3).
//!
//! Every communicator has an [`ErrorHandler`] that says what an error of a
//! call on it does: hand it back as the call's `Err` ([`ErrorHandler::Return`],
//! `MPI_ERRORS_RETURN`), end the job with its message
//! ([`ErrorHandler::Fatal`], `MPI_ERRORS_ARE_FATAL`), or call the
//! program's function first and then hand it back ([`ErrorHandler::user`]).
//! A new communicator gets its parent's handler (a duplicate, a split, a
//! communicator of a group, a new topology, an intercommunicator or a
//! merge).
//!
//! ```no_run
//! use oxmpi::ErrorHandler;
//! let universe = oxmpi::initialize().unwrap();
//! let world = universe.world();
//! world.set_error_handler(ErrorHandler::user(|comm, error| {
//!     eprintln!("rank {}: {error}", comm.rank());
//! }));
//! // Rank `size` does not exist: the handler prints, the call returns Err.
//! assert!(world.process_at_rank(world.size()).send(&1u8).is_err());
//! // The standard's default: any error ends the job.
//! world.set_error_handler(ErrorHandler::Fatal);
//! ```
//!
//! # The default, against the standard's wording
//! MPI 4.1 §9.3 makes `MPI_ERRORS_ARE_FATAL` the handler of
//! `MPI_COMM_WORLD` and `MPI_COMM_SELF` at start-up: "the default
//! behavior is for the implementation to abort" on an error. oxmpi's
//! calls return [`Result`], and in Rust the caller decides whether an
//! error is fatal: `?` or `unwrap()` makes it so, a `match` recovers. So
//! the world and self communicators start with [`ErrorHandler::Return`],
//! as a C program that sets `MPI_ERRORS_RETURN` first; a program that
//! wants the standard's default calls
//! `world.set_error_handler(ErrorHandler::Fatal)`, after which no call
//! on world (or on the communicators made from it afterwards) returns an
//! error: the job ends with the message instead.
//!
//! # Which calls
//! A communicator's handler sees the errors of its point-to-point calls
//! (sends, receives, probes, starting immediate ones), of making,
//! duplicating, splitting, merging and freeing communicators, and of its
//! names, attributes, hints and topology calls, and of its collectives
//! (those in [`crate::collective`], the neighbourhood and the
//! intercommunicator ones): a blocking collective's, and the error of
//! starting a non-blocking one. Not those of the completion calls of
//! requests (`wait`, `test`), which are not tied to a communicator in
//! this API, so not the error a non-blocking collective ends with.

use crate::comm::Communicator;
use crate::{Error, Result};
use std::fmt;
use std::sync::Arc;

/// A program's error handler: called with the communicator and the error.
pub type UserErrorHandler = dyn Fn(&Communicator, &Error) + Send + Sync;

/// What an error of a call on a communicator does (`MPI_Errhandler`).
#[derive(Clone)]
pub enum ErrorHandler {
    /// The call returns the error (`MPI_ERRORS_RETURN`); the default in
    /// this API (see the module docs).
    Return,
    /// The job ends (`MPI_Abort` on the communicator, with the error
    /// class's code) after the message is written to standard error
    /// (`MPI_ERRORS_ARE_FATAL`).
    Fatal,
    /// The function is called, then the call returns the error
    /// (`MPI_Comm_create_errhandler`).
    User(Arc<UserErrorHandler>),
}

impl ErrorHandler {
    /// A handler that calls `f` with the communicator and the error; the
    /// call then returns the error.
    pub fn user(f: impl Fn(&Communicator, &Error) + Send + Sync + 'static) -> ErrorHandler {
        ErrorHandler::User(Arc::new(f))
    }
}

impl fmt::Debug for ErrorHandler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ErrorHandler::Return => f.write_str("ErrorHandler::Return"),
            ErrorHandler::Fatal => f.write_str("ErrorHandler::Fatal"),
            ErrorHandler::User(_) => f.write_str("ErrorHandler::User(..)"),
        }
    }
}

impl Communicator {
    /// Sets what errors of calls on this communicator do, at this process
    /// (`MPI_Comm_set_errhandler`).
    #[doc(alias = "MPI_Comm_set_errhandler")]
    pub fn set_error_handler(&self, handler: ErrorHandler) {
        *self.error_handler_slot() = handler;
    }

    /// The communicator's error handler (`MPI_Comm_get_errhandler`).
    #[doc(alias = "MPI_Comm_get_errhandler")]
    pub fn error_handler(&self) -> ErrorHandler {
        self.error_handler_slot().clone()
    }

    /// Treats `error` as an error of a call on this communicator
    /// (`MPI_Comm_call_errhandler`): what the handler does, and the error
    /// back if it returns.
    #[doc(alias = "MPI_Comm_call_errhandler")]
    pub fn call_error_handler(&self, error: Error) -> Error {
        // The handler is cloned out so that a user's function may call
        // this communicator (even set its handler) without deadlock.
        match self.error_handler() {
            ErrorHandler::Return => {}
            ErrorHandler::User(f) => f(self, &error),
            ErrorHandler::Fatal => {
                eprintln!(
                    "oxmpi: fatal error (ErrorHandler::Fatal) on communicator {:?} at rank {}: {error}",
                    self.name_for_messages(),
                    self.rank()
                );
                self.abort(error.class().code());
            }
        }
        error
    }

    /// `result`, after this communicator's handler has seen its error.
    pub(crate) fn handled<T>(&self, result: Result<T>) -> Result<T> {
        result.map_err(|e| self.call_error_handler(e))
    }
}
