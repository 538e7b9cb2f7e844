//! The asynchronous progress thread (`OXMPI_ASYNC_PROGRESS=1`): a thread
//! that drives the progress engine whenever no other thread of the
//! process does, so that passive-target operations (active messages)
//! complete while the target computes outside MPI.
//!
//! It runs the same loop as every blocking call (`progress_until`): it
//! polls, lets other threads have the device whenever they ask, and
//! sleeps in the kernel once the spin time has passed with nothing to
//! do, waking when a transport has work. It stops at finalize.

use crate::{progress_until, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::thread::JoinHandle;

/// The variable that starts the thread: `1` starts it, `0` or unset not.
pub const ASYNC_PROGRESS_ENV: &str = "OXMPI_ASYNC_PROGRESS";

static STOP: AtomicBool = AtomicBool::new(false);
static THREAD: Mutex<Option<JoinHandle<()>>> = Mutex::new(None);

/// Whether the environment asks for the thread; an error for a value
/// other than `0` or `1`.
pub(crate) fn wanted() -> Result<bool> {
    crate::switch_from_env(ASYNC_PROGRESS_ENV, "a progress thread")
}

/// Starts the thread (MPI is running).
pub(crate) fn start() {
    STOP.store(false, Ordering::Relaxed);
    let handle = std::thread::Builder::new()
        .name("oxmpi-progress".into())
        .spawn(|| {
            let stopped = progress_until(|_| Ok(STOP.load(Ordering::Relaxed).then_some(())));
            if let Err(e) = stopped {
                oxmpi_adi::vlog!("the progress thread stopped: {e}");
            }
        });
    match handle {
        Ok(handle) => *THREAD.lock().unwrap_or_else(|p| p.into_inner()) = Some(handle),
        Err(e) => oxmpi_adi::vlog!("no progress thread: {e}"),
    }
}

/// Stops the thread, if it runs, and waits for it (before finalize).
pub(crate) fn stop() {
    let handle = THREAD.lock().unwrap_or_else(|p| p.into_inner()).take();
    if let Some(handle) = handle {
        STOP.store(true, Ordering::Relaxed);
        let _ = handle.join();
    }
}
