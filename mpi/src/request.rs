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

use crate::comm::{status_result, Status};
use crate::{progress_until, wait_request, with_device, Error, ErrorClass, Result};
use oxmpi_adi::device::RequestId;
use std::cell::RefCell;
use std::marker::PhantomData;

/// The region within which immediate operations may borrow buffers for
/// `'a`. See the module docs and [`scope`].
pub struct Scope<'a> {
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

impl Scope<'_> {
    pub(crate) fn register<'a>(&self, id: RequestId) -> Request<'a> {
        let mut started = self.started.borrow_mut();
        // Keep the list short when a long-lived scope starts many requests.
        if started.len() >= 1024 && started.len().is_power_of_two() {
            let _ = with_device(|d| {
                started.retain(|&r| !d.is_complete(r));
                Ok(())
            });
        }
        started.push(id);
        Request {
            id,
            _buffer: PhantomData,
        }
    }
}

impl Drop for Scope<'_> {
    fn drop(&mut self) {
        let started = std::mem::take(self.started.get_mut());
        let result = with_device(|d| {
            for &id in &started {
                if !d.is_complete(id) {
                    d.cancel(id);
                }
            }
            Ok(())
        })
        .and_then(|()| {
            progress_until(|d| Ok(started.iter().all(|&id| d.is_complete(id)).then_some(())))
        })
        .and_then(|()| {
            with_device(|d| {
                for &id in &started {
                    d.take_status(id);
                }
                Ok(())
            })
        });
        if let Err(e) = result {
            // Nothing can be returned from a drop; the requests' buffers
            // are no longer used either way (a failed peer's requests are
            // failed, not pending).
            eprintln!("oxmpi: completing the requests left at the end of a scope failed: {e}");
        }
    }
}

/// A pending immediate operation (`MPI_Request`), borrowing its buffer
/// for `'a`.
#[must_use = "a request must be waited for or tested to learn its outcome"]
#[derive(Debug)]
pub struct Request<'a> {
    id: RequestId,
    _buffer: PhantomData<&'a mut [u8]>,
}

impl<'a> Request<'a> {
    /// Waits for the request to complete (`MPI_Wait`).
    pub fn wait(self) -> Result<Status> {
        wait_request(self.id).and_then(status_result)
    }

    /// Completes the request if it is done (`MPI_Test`): `Ok` with the
    /// outcome, or `Err` giving the still-pending request back.
    pub fn test(self) -> std::result::Result<Result<Status>, Request<'a>> {
        match with_device(|d| {
            d.check_device(false)?;
            Ok(d.take_status(self.id))
        }) {
            Ok(Some(status)) => Ok(status_result(status)),
            Ok(None) => Err(self),
            Err(e) => Ok(Err(e)),
        }
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
/// order; if any failed, the first failure is returned once all are done.
pub fn wait_all(requests: Vec<Request<'_>>) -> Result<Vec<Status>> {
    progress_until(|d| {
        if !requests.iter().all(|r| d.is_complete(r.id)) {
            return Ok(None);
        }
        Ok(Some(
            requests
                .iter()
                .map(|r| d.take_status(r.id))
                .collect::<Vec<_>>(),
        ))
    })?
    .into_iter()
    .map(taken)
    .collect()
}

/// The outcome of a request whose status was taken from the device.
fn taken(status: Option<oxmpi_adi::device::Status>) -> Result<Status> {
    status
        .ok_or_else(|| {
            Error::new(
                ErrorClass::Request,
                "the request was already completed and freed",
            )
        })
        .and_then(status_result)
}

/// Waits until one request completes (`MPI_Waitany`), removes it from
/// `requests` and returns its index and outcome; `None` if `requests` is
/// empty.
pub fn wait_any(requests: &mut Vec<Request<'_>>) -> Result<Option<(usize, Result<Status>)>> {
    if requests.is_empty() {
        return Ok(None);
    }
    let (index, status) = progress_until(|d| {
        Ok(requests
            .iter()
            .position(|r| d.is_complete(r.id))
            .map(|index| (index, d.take_status(requests[index].id))))
    })?;
    let _completed = requests.remove(index);
    Ok(Some((index, taken(status))))
}

/// Completes every request if all are done (`MPI_Testall`): `Some` with
/// their outcomes in order (and `requests` emptied), or `None` with
/// `requests` untouched.
pub fn test_all(requests: &mut Vec<Request<'_>>) -> Result<Option<Vec<Result<Status>>>> {
    let statuses = with_device(|d| {
        d.check_device(false)?;
        if !requests.iter().all(|r| d.is_complete(r.id)) {
            return Ok(None);
        }
        Ok(Some(
            requests
                .iter()
                .map(|r| d.take_status(r.id))
                .collect::<Vec<_>>(),
        ))
    })?;
    let Some(statuses) = statuses else {
        return Ok(None);
    };
    requests.clear();
    Ok(Some(statuses.into_iter().map(taken).collect()))
}
