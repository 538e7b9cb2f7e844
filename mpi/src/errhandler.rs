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
//! World and self start with [`ErrorHandler::Fatal`], as MPI 4.1 §9.3
//! makes `MPI_ERRORS_ARE_FATAL` the handler of `MPI_COMM_WORLD` and
//! `MPI_COMM_SELF`: an erroneous call ends the job with the error's class,
//! message and rank, and never returns. A program that handles errors
//! itself sets [`ErrorHandler::Return`] first, as a C program sets
//! `MPI_ERRORS_RETURN`; communicators made afterwards inherit it.
//!
//! ```no_run
//! use oxmpi::ErrorHandler;
//! let universe = oxmpi::initialize().unwrap();
//! let world = universe.world();
//! // Without this, the send below would end the job.
//! world.set_error_handler(ErrorHandler::Return);
//! assert!(world.process_at_rank(world.size()).send(&1u8).is_err());
//! world.set_error_handler(ErrorHandler::user(|comm, error| {
//!     eprintln!("rank {}: {error}", comm.rank());
//! }));
//! // Rank `size` does not exist: the handler prints, the call returns Err.
//! assert!(world.process_at_rank(world.size()).send(&1u8).is_err());
//! ```
//!
//! # Which calls
//! A communicator's handler sees the errors of its point-to-point calls
//! (sends, receives, probes, starting immediate ones), of making,
//! duplicating, splitting, merging and freeing communicators, and of its
//! names, attributes, hints and topology calls, and of its collectives
//! (those in [`crate::collective`], the neighbourhood and the
//! intercommunicator ones): a blocking collective's, and the error of
//! starting a non-blocking one. An error found when a request completes
//! (a truncated receive, a non-blocking collective's count mismatch) goes
//! to the handler of the communicator the request is on, from the wait or
//! test that completes it (see [`crate::request`]). Calls on no
//! communicator (datatypes, groups, info objects) return their errors.

use crate::comm::{Communicator, WeakCommunicator};
use crate::{context, Error, Result};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

/// A program's error handler: called with the communicator and the error.
pub type UserErrorHandler = dyn Fn(&Communicator, &Error) + Send + Sync;

/// What an error of a call on a communicator does (`MPI_Errhandler`).
#[derive(Clone)]
pub enum ErrorHandler {
    /// The call returns the error (`MPI_ERRORS_RETURN`).
    Return,
    /// The job ends (`MPI_Abort` on the communicator, with the error
    /// class's code) after the message is written to standard error
    /// (`MPI_ERRORS_ARE_FATAL`); world's and self's at start-up.
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
                    "oxmpi: fatal error (ErrorHandler::Fatal) on communicator {:?} at rank {}: \
                     {error}; the job ends with the error class's code {} (set \
                     ErrorHandler::Return on the communicator to handle errors in the program)",
                    self.name_for_messages(),
                    self.rank(),
                    error.class().code()
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

/// The communicators of this process by context id, which names one live
/// communicator at a time: how an error found when a request completes
/// reaches the handler of the communicator the request belongs to. A
/// request keeps only that id (a handle would cost every request a
/// reference count), and it is looked up here on errors alone.
static LIVE: Mutex<BTreeMap<u32, WeakCommunicator>> = Mutex::new(BTreeMap::new());

fn live() -> MutexGuard<'static, BTreeMap<u32, WeakCommunicator>> {
    // The map is whole between statements.
    LIVE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Notes a new communicator as the one its context id names.
pub(crate) fn note_live(comm: &Communicator) {
    live().insert(comm.context_id(), comm.downgrade());
}

/// Forgets the communicator with `context_id` that is going, if the
/// id still names it (`is_going`).
pub(crate) fn forget(context_id: u32, is_going: impl Fn(&WeakCommunicator) -> bool) {
    let mut live = live();
    if live.get(&context_id).is_some_and(is_going) {
        live.remove(&context_id);
    }
}

/// `error`, found when a request of the communicator with `context_id`
/// completed, after that communicator's handler saw it (MPI 4.1 §9.3:
/// the handler of the communicator the request belongs to). A request
/// that outlived its communicator raises it on self, as the standard
/// raises errors tied to no communicator; after finalize, when neither
/// is left, the error is returned.
#[cold]
pub(crate) fn raise_at_completion(context_id: u32, error: Error) -> Error {
    // The handle is taken out of the map first, so that a handler may
    // make and free communicators.
    let comm = {
        let live = live();
        let find = |id| live.get(&id).and_then(WeakCommunicator::upgrade);
        find(context_id).or_else(|| find(context::SELF))
    };
    match comm {
        Some(comm) => comm.call_error_handler(error),
        None => error,
    }
}
