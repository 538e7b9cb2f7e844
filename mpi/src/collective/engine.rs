//! What carries the collectives out: each collective is a future (an
//! `async fn` over a [`Team`](super::team::Team), whose steps are
//! [`Team::exchange`](super::team::Team::exchange)), and this module
//! drives it.
//!
//! A blocking collective is driven to its end at once ([`block_on`]): it
//! is polled, and while it waits for the messages of a step the device
//! makes progress until they are complete.
//!
//! A non-blocking collective ([`start`]) is polled once when it starts (it
//! checks its arguments and posts its first step), then lives in this
//! thread's list of pending collectives with a generalized device request
//! ([`Device::start_generalized`](oxmpi_adi::device::Device::start_generalized))
//! that stands for it. Every call that makes progress (a wait or test of
//! any request, a probe, a blocking call; see `crate::progress_until` and
//! `crate::progress_once`) then also polls the pending collectives
//! ([`advance`]); one that finishes completes its request with its
//! outcome. So its request is waited for, tested and freed as any other,
//! alone or in a list with point-to-point requests, and a process that
//! only tests some other request still moves it on.
//!
//! The list is per thread: a collective advances in calls made by the
//! thread that started it (which is also the one that must complete it,
//! as collectives on a communicator are started in order by one thread at
//! a time).
//!
//! This is MPICH's schedule approach written as Rust futures: the
//! compiler turns each algorithm into the state machine of its rounds,
//! so the blocking and the non-blocking form share one algorithm.

use crate::request::{Request, Scope};
use crate::{progress_until, with_device, Communicator, Error, ErrorClass, Result};
use oxmpi_adi::device::{Device, RequestId};
use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::{pin, Pin};
use std::task::{Context, Poll, Waker};

/// A collective under way, with its buffers; `'static` only as stored (see
/// [`start`]).
type Operation = Pin<Box<dyn Future<Output = Result<()>> + 'static>>;

/// A non-blocking collective that has not finished, and the request that
/// stands for it.
struct Pending {
    request: RequestId,
    operation: Operation,
}

thread_local! {
    /// This thread's non-blocking collectives that have not finished.
    static PENDING: RefCell<Vec<Pending>> = const { RefCell::new(Vec::new()) };
    /// The requests the step of the collective polled last waits for.
    static WAITING_FOR: RefCell<Vec<RequestId>> = const { RefCell::new(Vec::new()) };
    /// Whether that step goes on once one of them is complete (else it
    /// waits for all).
    static WAITING_FOR_ONE: Cell<bool> = const { Cell::new(false) };
}

/// Notes that the step being polled waits for `ids` (see [`block_on`]).
pub(crate) fn waiting_for(ids: impl Iterator<Item = RequestId>) {
    note_wait(ids, false);
}

/// Notes that the step being polled waits for any one of `ids`.
pub(crate) fn waiting_for_one_of(ids: impl Iterator<Item = RequestId>) {
    note_wait(ids, true);
}

fn note_wait(ids: impl Iterator<Item = RequestId>, one: bool) {
    WAITING_FOR.with_borrow_mut(|w| {
        w.clear();
        w.extend(ids);
    });
    WAITING_FOR_ONE.set(one);
}

/// Polls `operation` once, with a waker that does nothing: progress is
/// made by polling again when the device has moved, not by wake-ups.
fn poll_once<R>(operation: Pin<&mut (impl Future<Output = R> + ?Sized)>) -> Poll<R> {
    operation.poll(&mut Context::from_waker(Waker::noop()))
}

/// Carries out `operation` (a blocking collective) to its end: while a
/// step waits for its messages, the device makes progress (and so do the
/// thread's non-blocking collectives) until they are complete.
pub(crate) fn block_on<R>(operation: impl Future<Output = Result<R>>) -> Result<R> {
    let mut operation = pin!(operation);
    loop {
        if let Poll::Ready(outcome) = poll_once(operation.as_mut()) {
            return outcome;
        }
        let ids = WAITING_FOR.take();
        let done = |d: &mut Device, id: &RequestId| d.is_complete(*id);
        if WAITING_FOR_ONE.get() {
            progress_until(|d| Ok(ids.iter().any(|id| done(d, id)).then_some(())))?;
        } else {
            progress_until(|d| Ok(ids.iter().all(|id| done(d, id)).then_some(())))?;
        }
        // Given back for its capacity: the next step notes its own.
        WAITING_FOR.set(ids);
    }
}

/// Starts the non-blocking collective `operation` on `comm`, which
/// borrows its buffers for `'a`, in `scope`, and returns its request (see
/// [`launch`]).
pub(crate) fn start<'a>(
    scope: &Scope<'a>,
    comm: &Communicator,
    operation: impl Future<Output = Result<()>> + 'a,
) -> Result<Request<'a>> {
    // SAFETY: the request is registered with `scope` at once, and a scope
    // ends (its drop, before `'a` ends) only once each of its requests is
    // complete, or after dropping through `abandon` the operations of
    // those it could not complete.
    let request = unsafe { launch(operation) }?;
    Ok(scope.register(request, comm))
}

/// Starts the non-blocking collective `operation` on `comm`, which
/// borrows nothing, and returns its request, which needs no scope (see
/// [`launch`]).
pub(crate) fn start_static<'a>(
    comm: &Communicator,
    operation: impl Future<Output = Result<()>> + 'static,
) -> Result<Request<'a>> {
    // SAFETY: `operation` borrows nothing.
    let request = unsafe { launch(operation) }?;
    Ok(Request::unscoped(request, comm))
}

/// Polls `operation` once (so that arguments a process can check alone
/// fail here, and its first step is posted) and returns its request: a
/// generalized request that [`advance`] completes when the operation
/// finishes, or a complete one if it finished at once. An operation that
/// failed at once gives its error here.
///
/// # Safety
/// What `operation` borrows must stay valid until its request is complete
/// or the operation was dropped by [`abandon`].
unsafe fn launch<'a>(operation: impl Future<Output = Result<()>> + 'a) -> Result<RequestId> {
    let mut operation: Pin<Box<dyn Future<Output = Result<()>> + 'a>> = Box::pin(operation);
    let outcome = poll_once(operation.as_mut());
    WAITING_FOR.take();
    if let Poll::Ready(outcome) = outcome {
        outcome?;
        return with_device(|d| {
            let request = d.start_generalized();
            d.complete_generalized(request, None);
            Ok(request)
        });
    }
    let request = with_device(|d| Ok(d.start_generalized()))?;
    // SAFETY: only the lifetime is changed. What `operation` borrows is
    // used only while it is polled or dropped, which the caller
    // guarantees happens while it is valid: the operation is dropped when
    // it finishes, before its request completes, or by `abandon`.
    let operation: Operation = unsafe {
        std::mem::transmute::<Pin<Box<dyn Future<Output = Result<()>> + 'a>>, Operation>(operation)
    };
    PENDING.with_borrow_mut(|pending| pending.push(Pending { request, operation }));
    Ok(request)
}

/// Whether this thread has non-blocking collectives to advance.
pub(crate) fn has_pending() -> bool {
    PENDING.with_borrow(|pending| !pending.is_empty())
}

/// Polls each of this thread's non-blocking collectives once, and
/// completes the request of each that finished with its outcome.
pub(crate) fn advance() -> Result<()> {
    let mut polled = PENDING.take();
    if polled.is_empty() {
        return Ok(());
    }
    // A step polled here notes what it waits for, which is not what a
    // blocking collective around this call waits for.
    let waiting = (WAITING_FOR.take(), WAITING_FOR_ONE.get());
    let mut finished = Vec::new();
    polled.retain_mut(|p| match poll_once(p.operation.as_mut()) {
        Poll::Ready(outcome) => {
            finished.push((p.request, outcome.err()));
            false
        }
        Poll::Pending => true,
    });
    WAITING_FOR.set(waiting.0);
    WAITING_FOR_ONE.set(waiting.1);
    // Collectives started while these were polled (none is, today) stay
    // after them.
    PENDING.with_borrow_mut(|pending| {
        polled.append(pending);
        *pending = polled;
    });
    if finished.is_empty() {
        return Ok(());
    }
    with_device(|d| {
        for (request, error) in finished {
            d.complete_generalized(request, error);
        }
        Ok(())
    })
}

/// Drops the collectives of `requests` that are still pending: those of a
/// scope that ends when its wait for them failed. Dropping one takes back
/// or waits for the messages of its step (see `team::Messages`).
pub(crate) fn abandon(requests: &[RequestId]) {
    let abandoned: Vec<Pending> = PENDING.with_borrow_mut(|pending| {
        let (abandoned, kept) = std::mem::take(pending)
            .into_iter()
            .partition(|p| requests.contains(&p.request));
        *pending = kept;
        abandoned
    });
    if abandoned.is_empty() {
        return;
    }
    let error = Error::new(
        ErrorClass::Other,
        "the collective was abandoned when its scope ended",
    );
    let _ = with_device(|d| {
        for p in &abandoned {
            d.complete_generalized(p.request, Some(error.clone()));
        }
        Ok(())
    });
    drop(abandoned);
}
