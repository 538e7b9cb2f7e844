//! Immediate (non-blocking) operations and their requests (MPI 4.1 §3.7).
//!
//! An immediate send or receive borrows its buffer for the lifetime `'a`
//! of a [`Scope`]. The scope is what makes this sound: when it ends, every
//! request started in it is complete (one still pending then is finished
//! there: a receive that has not matched is cancelled, anything else is
//! waited for), so no buffer is touched by MPI after its borrow ends — even
//! if a [`Request`] was leaked with `mem::forget`.
//!
//! ```no_run
//! # let universe = oxmpi::initialize().unwrap();
//! # let world = universe.world();
//! let mut incoming = [0u32; 4];
//! let outgoing = [7u32; 4];
//! oxmpi::request::scope(|scope| {
//!     let next = (world.rank() + 1) % world.size();
//!     let recv = world.any_process().immediate_receive_into(scope, &mut incoming).unwrap();
//!     let send = world.process_at_rank(next).immediate_send(scope, &outgoing).unwrap();
//!     oxmpi::request::wait_all(vec![recv, send]).unwrap();
//! });
//! ```
//!
//! # Completion (MPI 4.1 §3.7.3 – §3.7.5)
//!
//! | MPI                      | here                    | gives                                       |
//! |--------------------------|-------------------------|---------------------------------------------|
//! | `MPI_Wait`, `MPI_Test`   | [`Request::wait`], [`Request::test`] | the request's outcome          |
//! | `MPI_Request_get_status` | [`Request::get_status`] | the status if complete; the request stays   |
//! | `MPI_Waitall`            | [`wait_all`]            | every status, or one `MPI_ERR_IN_STATUS`    |
//! |                          | [`wait_all_outcomes`]   | each request's own outcome                  |
//! | `MPI_Testall`            | [`test_all`]            | each request's own outcome, if all are done |
//! | `MPI_Waitany`, `MPI_Testany`   | [`wait_any`], [`test_any`]   | one completed request        |
//! | `MPI_Waitsome`, `MPI_Testsome` | [`wait_some`], [`test_some`] | every completed request      |
//!
//! The blocking ones make progress with the device lock released while
//! they sleep, so other threads' calls go on meanwhile; the `test` ones
//! and [`Request::get_status`] make progress once and never block.
//!
//! **Outcomes.** Each completed request has its own outcome, a
//! `Result<Status>`: its error is the Rust form of `MPI_ERROR` in its
//! status. The outer `Result` of a call over many requests fails only
//! when the call itself failed (MPI not running, progress failed);
//! requests it did not complete then are left as they were (and, at the
//! latest, to their scope). [`Request::get_status`] returns a failed
//! request's error as its `Err` (and keeps the request).
//! [`wait_all`] is the one exception, as in MPI: it returns the
//! statuses alone, so when any request failed it completes all of them
//! and returns one error of class [`ErrorClass::InStatus`]
//! (`MPI_ERR_IN_STATUS`) naming each failed request's index and error;
//! [`wait_all_outcomes`] returns the outcomes instead.
//!
//! **Error handlers.** A request's error goes to the error handler of the
//! communicator it is on (a window's, for one-sided requests; see
//! [`crate::errhandler`]) when a wait or test completes it, once: with
//! the default, [`ErrorHandler::Fatal`](crate::ErrorHandler::Fatal), it
//! ends the job there; with [`ErrorHandler::Return`](crate::ErrorHandler::Return)
//! it is the request's outcome. So does the error of the progress a
//! [`Request::wait`] or [`Request::test`] makes. [`Request::get_status`],
//! which leaves the request to a later completion, and the outer error
//! of a call over many requests (which no one request owns) go to no
//! handler; nor does [`wait_all`]'s `MPI_ERR_IN_STATUS`, whose failed
//! requests each went to theirs.
//!
//! **Indices.** The calls that take `&mut Vec<Request>` ([`wait_any`],
//! [`test_any`], [`wait_some`], [`test_some`], [`test_all`]) remove the
//! requests they complete from the vector, and the rest keep their order.
//! An index they return is the request's position in the vector *as it was
//! when the call started*; [`wait_some`] and [`test_some`] list them in
//! ascending order. Data kept in a parallel vector is removed at the same
//! indices, last first:
//!
//! ```no_run
//! # let universe = oxmpi::initialize().unwrap();
//! # let world = universe.world();
//! let mut bufs = [[0u8; 8]; 4];
//! oxmpi::request::scope(|scope| {
//!     let mut tags = Vec::new();
//!     let mut requests = Vec::new();
//!     for (tag, buf) in bufs.iter_mut().enumerate() {
//!         let from = world.any_process();
//!         requests.push(from.immediate_receive_into_with_tag(scope, buf, tag as i32).unwrap());
//!         tags.push(tag);
//!     }
//!     while let Some(done) = oxmpi::request::wait_some(&mut requests).unwrap() {
//!         for (index, outcome) in done.into_iter().rev() {
//!             let tag = tags.remove(index);
//!             println!("tag {tag}: {:?}", outcome.unwrap());
//!         }
//!     }
//! });
//! ```
//!
//! An empty vector plays the part of MPI's list of null requests:
//! [`wait_any`], [`wait_some`] and [`test_some`] return `None` for it at
//! once (MPI's `MPI_UNDEFINED`), and [`test_any`] returns `None`.

use crate::collective::engine;
use crate::comm::{status_result, Status};
use crate::errhandler::raise_at_completion;
use crate::{
    progress_once, progress_until, wait_request, with_device, Communicator, Error, ErrorClass,
    Result,
};
use oxmpi_adi::device::{Device, RequestId};
use std::cell::RefCell;
use std::marker::PhantomData;

/// How many requests a scope has room for when it starts its first: a
/// window of immediate operations as programs (and the OSU benchmarks,
/// 64) issue them, for 512 bytes while the scope lasts.
const FIRST_CAPACITY: usize = 64;

/// The region within which immediate operations may borrow buffers for
/// `'a`. See the module docs and [`scope`].
pub struct Scope<'a> {
    /// Every request started in the scope.
    started: RefCell<Vec<RequestId>>,
    /// Invariant in `'a`, so the borrow checker cannot shrink it.
    _lifetime: PhantomData<std::cell::Cell<&'a mut ()>>,
}

/// Runs `f` with a new [`Scope`]; every request started in it is complete
/// when this returns (or unwinds).
pub fn scope<'a, R>(f: impl FnOnce(&Scope<'a>) -> R) -> R {
    let scope = Scope {
        started: RefCell::new(Vec::new()),
        _lifetime: PhantomData,
    };
    f(&scope)
}

impl<'a> Scope<'a> {
    /// Registers the operation `id` on `comm` with the scope, which
    /// completes it before `'a` ends if the program does not. Data that is
    /// not contiguous needs nothing kept beside the request: the device
    /// packs and unpacks it in the buffer itself, piece by piece.
    #[inline]
    pub(crate) fn register(&self, id: RequestId, comm: &Communicator) -> Request<'a> {
        // An operation complete when it started (an eager send, whose data
        // the transport already took) uses its buffer no more, and its id
        // names nothing to free: the scope has nothing to do for it.
        if id.complete_status().is_none() {
            let mut started = self.started.borrow_mut();
            if started.len() == started.capacity() {
                make_room(&mut started);
            }
            started.push(id);
        }
        Request::unscoped(id, comm)
    }
}

/// Makes room in a scope's full list of started requests. Out of line,
/// and taken only when the list is full, so that registering costs a
/// window of requests no more than a push.
#[cold]
fn make_room(started: &mut Vec<RequestId>) {
    if started.capacity() == 0 {
        // Room for a window of requests at once: growing the list a push
        // at a time (4, 8, 16, ...) cost more than a small window's
        // requests themselves.
        started.reserve_exact(FIRST_CAPACITY);
    } else if started.len() >= 1024 {
        // Keep the list short when a long-lived scope starts many
        // requests: what is complete is dropped before it grows.
        let _ = with_device(|d| {
            started.retain(|r| !d.is_complete(*r));
            Ok(())
        });
    }
}

/// Reports what a scope could not finish: nothing can be returned from a
/// drop.
fn report(outcome: Result<()>) {
    if let Err(e) = outcome {
        eprintln!("oxmpi: completing the requests left at the end of a scope failed: {e}");
    }
}

impl Drop for Scope<'_> {
    fn drop(&mut self) {
        let started = std::mem::take(self.started.get_mut());
        if started.is_empty() {
            // Nothing to complete (a window of eager sends registers
            // nothing): the device is not taken.
            return;
        }
        // Most requests were waited for (their status taken, so the device
        // no longer knows them) or are complete: those are freed in one
        // pass, and only what is left pending is cancelled and waited for.
        let mut pending = Vec::new();
        let result = with_device(|d| {
            for &id in &started {
                if !d.free_if_complete(id) {
                    d.cancel(id);
                    pending.push(id);
                }
            }
            Ok(())
        })
        .and_then(|()| {
            if pending.is_empty() {
                return Ok(());
            }
            progress_until(|d| {
                if !pending.iter().all(|&id| d.is_complete(id)) {
                    return Ok(None);
                }
                for &id in &pending {
                    d.take_status(id);
                }
                Ok(Some(()))
            })
        });
        // Non-blocking collectives the wait could not finish are dropped
        // now, while their buffers are still borrowed.
        if engine::has_pending() {
            engine::abandon(&started);
        }
        // The requests' buffers are no longer used either way (a failed
        // peer's requests are failed, not pending).
        report(result);
    }
}

/// A pending immediate operation (`MPI_Request`), borrowing its buffer
/// for `'a`.
#[must_use = "a request must be waited for or tested to learn its outcome"]
#[derive(Debug)]
pub struct Request<'a> {
    pub(crate) id: RequestId,
    /// The context id of the communicator the operation is on, whose
    /// error handler sees an error found when it completes.
    context_id: u32,
    _buffer: PhantomData<&'a mut [u8]>,
}

impl<'a> Request<'a> {
    /// The request of an operation `id` on `comm` that borrows nothing,
    /// so needs no scope, and may be held as borrowing for any `'a` (a
    /// request is invariant in `'a`), to wait for it in a list with
    /// others.
    #[inline]
    pub(crate) fn unscoped(id: RequestId, comm: &Communicator) -> Request<'a> {
        Request {
            id,
            context_id: comm.context_id(),
            _buffer: PhantomData,
        }
    }

    /// `error`, found completing this request, after its communicator's
    /// error handler saw it.
    #[cold]
    fn raise(&self, error: Error) -> Error {
        raise_at_completion(self.context_id, error)
    }
}

impl<'a> Request<'a> {
    /// Waits for the request to complete (`MPI_Wait`).
    pub fn wait(self) -> Result<Status> {
        let status = wait_request(self.id).map_err(|e| self.raise(e))?;
        self.complete(Some(status))
    }

    /// The outcome of the request, whose status was taken from the device
    /// (`None`: it was not there); its communicator's error handler has
    /// seen its error.
    pub(crate) fn complete(&self, status: Option<oxmpi_adi::device::Status>) -> Result<Status> {
        status
            .ok_or_else(freed)
            .and_then(status_result)
            .map_err(|e| self.raise(e))
    }

    /// Completes the request if it is done (`MPI_Test`): `Ok` with the
    /// outcome, or `Err` giving the still-pending request back.
    pub fn test(self) -> std::result::Result<Result<Status>, Request<'a>> {
        match progress_once().and_then(|()| with_device(|d| Ok(d.take_status(self.id)))) {
            Ok(Some(status)) => Ok(self.complete(Some(status))),
            Ok(None) => Err(self),
            Err(e) => Ok(Err(self.raise(e))),
        }
    }

    /// Whether the request is complete, without completing it
    /// (`MPI_Request_get_status`): makes progress once, then gives
    /// `Ok(Some(status))` if it is complete and `Ok(None)` if it is still
    /// pending. The request is not freed and its buffer stays borrowed: a
    /// later wait or test (or another `get_status`) returns the same
    /// outcome.
    ///
    /// `Err` is the request's own error when it completed with one (it is
    /// still held, and its wait returns that error again), or the error of
    /// the progress made here.
    pub fn get_status(&self) -> Result<Option<Status>> {
        progress_once()?;
        let status = with_device(|d| {
            if !d.is_complete(self.id) {
                return Ok(None);
            }
            d.peek_status(self.id).map(Some).ok_or_else(freed)
        })?;
        status.map(status_result).transpose()
    }

    /// Asks to cancel the request (`MPI_Cancel`): a receive that has not
    /// matched completes as cancelled ([`Status::is_cancelled`]); otherwise
    /// the request completes normally.
    pub fn cancel(&self) {
        let _ = with_device(|d| {
            d.cancel(self.id);
            Ok(())
        });
    }
}

/// Waits for every request (`MPI_Waitall`) and returns their statuses in
/// order.
///
/// If any request failed, every request is still completed (and freed),
/// and the error returned has class [`ErrorClass::InStatus`]
/// (`MPI_ERR_IN_STATUS`); its message names each failed request by its
/// index in `requests` with its error. Use [`wait_all_outcomes`] to have
/// each request's outcome instead. An error of another class means the
/// call itself failed (see the module docs).
pub fn wait_all(requests: Vec<Request<'_>>) -> Result<Vec<Status>> {
    let (statuses, failed) = if all_complete_at_start(&requests) {
        sort_outcomes(RequestId::complete_status, &requests)
    } else {
        wait_for_all(&requests, |d, requests| {
            sort_outcomes(|id| d.take_status(id), requests)
        })?
    };
    if failed.is_empty() {
        return Ok(statuses);
    }
    Err(Error::new(
        ErrorClass::InStatus,
        format!(
            "{} of {} requests failed (all are complete): {}",
            failed.len(),
            requests.len(),
            failed.join("; ")
        ),
    ))
}

/// Waits for every request (`MPI_Waitall`) and returns each one's outcome
/// in order: its status, or its error (what MPI leaves in the `MPI_ERROR`
/// field of each status when `MPI_Waitall` returns `MPI_ERR_IN_STATUS`).
/// `Err` only when the call itself failed.
pub fn wait_all_outcomes(requests: Vec<Request<'_>>) -> Result<Vec<Result<Status>>> {
    if all_complete_at_start(&requests) {
        return Ok(take_outcomes(RequestId::complete_status, &requests));
    }
    wait_for_all(&requests, |d, requests| {
        take_outcomes(|id| d.take_status(id), requests)
    })
}

/// Takes each request's status with `take_status`, in order, and sorts
/// the outcomes as they come: the statuses, and a line for each request
/// that failed (one vector when every request succeeded). All must be
/// complete.
fn sort_outcomes(
    mut take_status: impl FnMut(RequestId) -> Option<oxmpi_adi::device::Status>,
    requests: &[Request<'_>],
) -> (Vec<Status>, Vec<String>) {
    let mut statuses = Vec::with_capacity(requests.len());
    let mut failed = Vec::new();
    for (index, r) in requests.iter().enumerate() {
        match r.complete(take_status(r.id)) {
            Ok(status) => statuses.push(status),
            Err(e) => failed.push(format!("request {index}: {e}")),
        }
    }
    (statuses, failed)
}

/// Whether every request was complete when it started (a window of eager
/// sends, or of gets on the direct one-sided path): their ids hold their
/// statuses, which are taken without the device, each read inline from
/// its id (a `dyn` call per request cost a window of 64 gets a third of
/// its wait).
fn all_complete_at_start(requests: &[Request<'_>]) -> bool {
    requests.iter().all(|r| r.id.complete_status().is_some())
}

/// Makes progress until every request is complete, then gives what
/// `take` makes of them, with the device still held.
fn wait_for_all<R>(
    requests: &[Request<'_>],
    take: impl Fn(&mut Device, &[Request<'_>]) -> R,
) -> Result<R> {
    let mut complete = 0;
    progress_until(|d| Ok(all_complete(d, requests, &mut complete).then(|| take(d, requests))))
}

/// Whether every request is complete, given that the first `*complete`
/// were found so before (and are counted there now). A complete request
/// stays complete until its status is taken, which nothing else does
/// while the caller holds it; and requests mostly complete in the order
/// they were started, so each turn of a wait looks at the requests from
/// the first it has not yet seen complete, not at all of them again.
fn all_complete(d: &Device, requests: &[Request<'_>], complete: &mut usize) -> bool {
    while let Some(r) = requests.get(*complete) {
        if !d.is_complete(r.id) {
            return false;
        }
        *complete += 1;
    }
    true
}

/// Takes every request's status with `take_status`, in order, and gives
/// each its outcome. All must be complete.
fn take_outcomes(
    mut take_status: impl FnMut(RequestId) -> Option<oxmpi_adi::device::Status>,
    requests: &[Request<'_>],
) -> Vec<Result<Status>> {
    requests
        .iter()
        .map(|r| r.complete(take_status(r.id)))
        .collect()
}

/// The error for a request whose status the device no longer holds.
fn freed() -> Error {
    Error::new(
        ErrorClass::Request,
        "the request was already completed and freed",
    )
}

/// Waits until one request completes (`MPI_Waitany`), removes it from
/// `requests` and returns its index (in `requests` as it was on entry) and
/// outcome; `None` if `requests` is empty.
pub fn wait_any(requests: &mut Vec<Request<'_>>) -> Result<Option<(usize, Result<Status>)>> {
    if requests.is_empty() {
        return Ok(None);
    }
    let (index, status) = progress_until(|d| Ok(take_any(d, requests)))?;
    let completed = requests.remove(index);
    Ok(Some((index, completed.complete(status))))
}

/// Completes one request if any is done (`MPI_Testany`): makes progress
/// once, then removes a completed request from `requests` and returns its
/// index (in `requests` as it was on entry) and outcome. `None` if none is
/// complete, or `requests` is empty (MPI's `MPI_UNDEFINED` index).
pub fn test_any(requests: &mut Vec<Request<'_>>) -> Result<Option<(usize, Result<Status>)>> {
    if requests.is_empty() {
        return Ok(None);
    }
    progress_once()?;
    let found = with_device(|d| Ok(take_any(d, requests)))?;
    Ok(found.map(|(index, status)| {
        let completed = requests.remove(index);
        (index, completed.complete(status))
    }))
}

/// Takes the status of the first complete request, with its index.
fn take_any(
    d: &mut Device,
    requests: &[Request<'_>],
) -> Option<(usize, Option<oxmpi_adi::device::Status>)> {
    let index = requests.iter().position(|r| d.is_complete(r.id))?;
    Some((index, d.take_status(requests[index].id)))
}

/// What [`wait_some`] and [`test_some`] complete: each request's index
/// (in the vector as it was when the call started, ascending) with its
/// outcome.
pub type Completed = Vec<(usize, Result<Status>)>;

/// Waits until at least one request completes (`MPI_Waitsome`), then
/// removes every completed request from `requests` and returns their
/// indices (in `requests` as it was on entry, ascending) with their
/// outcomes. `None` if `requests` is empty. The returned list is never
/// empty.
pub fn wait_some(requests: &mut Vec<Request<'_>>) -> Result<Option<Completed>> {
    if requests.is_empty() {
        return Ok(None);
    }
    let statuses = progress_until(|d| {
        let statuses = take_completed(d, requests);
        Ok((!statuses.is_empty()).then_some(statuses))
    })?;
    Ok(Some(remove_completed(requests, statuses)))
}

/// Completes every request that is done (`MPI_Testsome`): makes progress
/// once, then removes the completed requests from `requests` and returns
/// their indices (in `requests` as it was on entry, ascending) with their
/// outcomes — an empty list if none is complete. `None` if `requests` is
/// empty.
pub fn test_some(requests: &mut Vec<Request<'_>>) -> Result<Option<Completed>> {
    if requests.is_empty() {
        return Ok(None);
    }
    progress_once()?;
    let statuses = with_device(|d| Ok(take_completed(d, requests)))?;
    Ok(Some(remove_completed(requests, statuses)))
}

/// Takes the status of every complete request, with its index.
fn take_completed(
    d: &mut Device,
    requests: &[Request<'_>],
) -> Vec<(usize, Option<oxmpi_adi::device::Status>)> {
    let mut statuses = Vec::new();
    for (index, r) in requests.iter().enumerate() {
        if d.is_complete(r.id) {
            statuses.push((index, d.take_status(r.id)));
        }
    }
    statuses
}

/// Removes the requests at the (ascending) indices of `statuses` from
/// `requests`, and gives each index its outcome.
fn remove_completed(
    requests: &mut Vec<Request<'_>>,
    statuses: Vec<(usize, Option<oxmpi_adi::device::Status>)>,
) -> Completed {
    let outcomes: Completed = statuses
        .into_iter()
        .map(|(index, status)| (index, requests[index].complete(status)))
        .collect();
    let mut completed = outcomes.iter().map(|&(index, _)| index).peekable();
    let mut index = 0;
    requests.retain(|_| {
        let done = completed.next_if_eq(&index).is_some();
        index += 1;
        !done
    });
    outcomes
}

/// Completes every request if all are done (`MPI_Testall`): `Some` with
/// each one's outcome in order (and `requests` emptied), or `None` with
/// `requests` untouched. A failed request's error is its own outcome, so
/// nothing is lost as it would be in one `MPI_ERR_IN_STATUS`.
pub fn test_all(requests: &mut Vec<Request<'_>>) -> Result<Option<Vec<Result<Status>>>> {
    progress_once()?;
    let outcomes = with_device(|d| {
        Ok(all_complete(d, requests, &mut 0)
            .then(|| take_outcomes(|id| d.take_status(id), requests)))
    })?;
    let Some(outcomes) = outcomes else {
        return Ok(None);
    };
    requests.clear();
    Ok(Some(outcomes))
}
