//! The frame every job program shares: start MPI, run one check, end.
//!
//! A job program (`p2p_suite CHECK`, `rma_suite CHECK N`, ...) is a
//! check run by every rank of a job. What surrounds the check is the same
//! in each, and lives here: initialize at the threading level the check
//! needs, fail when the library provides another, and when the check
//! fails at one rank, say why and abort the job, since the other ranks
//! may be waiting for this one and would otherwise hang until the
//! harness's time bound.

use oxmpi::{Communicator, ErrorHandler, Threading, Universe};
use std::process::ExitCode;

use crate::checks::ensure;

/// Runs `check` as a job program labelled `label` (the program's name
/// and its arguments, which prefix every line it prints about the
/// outcome).
///
/// Initializes oxmpi with `threading`, runs `check` with the universe,
/// and finalizes. A failed check makes this rank say why, with its rank,
/// and abort the job with code 1; a passed one makes rank 0 print
/// `<label>: ok on <N> ranks`. A failure to initialize or finalize is
/// said and gives a failing exit code.
pub fn run_check(
    label: &str,
    threading: Threading,
    check: impl FnOnce(&Universe) -> oxmpi::Result<()>,
) -> ExitCode {
    let result = oxmpi::initialize_with_threading(threading).and_then(|(universe, provided)| {
        ensure(provided == threading, || {
            format!("asked for {threading:?}, got {provided:?}")
        })?;
        let world = universe.world();
        match check(&universe) {
            Ok(()) if world.rank() == 0 => {
                println!("{label}: ok on {} ranks", world.size());
            }
            Ok(()) => {}
            Err(e) => {
                eprintln!("{label}: rank {}: {e}", world.rank());
                world.abort(1);
            }
        }
        universe.finalize()
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{label}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// World, with errors handed back on it and on self
/// ([`ErrorHandler::Return`], as a C test program sets
/// `MPI_ERRORS_RETURN`): for the job programs whose checks expect calls
/// to fail with a given error class, which the default
/// ([`ErrorHandler::Fatal`]) would turn into the end of the job. The
/// communicators made from them afterwards inherit it.
pub fn world_returning_errors(universe: &Universe) -> Communicator {
    universe.self_comm().set_error_handler(ErrorHandler::Return);
    let world = universe.world();
    world.set_error_handler(ErrorHandler::Return);
    world
}
