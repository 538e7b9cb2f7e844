//! Persistent requests (MPI 4.1 §3.9).
//!
//! A persistent request describes a send or a receive once — buffer,
//! peer, tag, mode — and is then started ([`PersistentRequest::start`],
//! [`start_all`]: `MPI_Start`, `MPI_Startall`) and completed
//! ([`PersistentRequest::wait`], [`PersistentRequest::test`],
//! [`wait_all`]) as often as the program likes. Completing it leaves it
//! *inactive*, ready to start again; starting a request that is active is
//! an [`ErrorClass::Request`] error.
//!
//! Requests are made by [`Process::send_init`](crate::Process::send_init)
//! (`MPI_Send_init`), its synchronous, ready and buffered variants, and
//! [`Process::receive_init`](crate::Process::receive_init) /
//! [`AnyProcess::receive_init`](crate::AnyProcess::receive_init)
//! (`MPI_Recv_init`). Like an immediate operation, a persistent request
//! borrows its buffer for the lifetime `'a` of a [`Scope`]: every start
//! registers the operation with the scope, so when the scope ends nothing
//! is still using the buffer (an active receive that has not matched is
//! cancelled there, anything else is waited for) — even if the request
//! was leaked.
//!
//! Between starts the program reads and refills the buffer through the
//! request ([`PersistentRequest::buffer`], [`PersistentRequest::buffer_mut`]),
//! which checks that the request is inactive. A send lends its buffer
//! either shared (`&buf`: the same data every time) or exclusively
//! (`&mut buf`: refillable with `buffer_mut`); a receive lends it
//! exclusively.
//!
//! ```no_run
//! # let universe = oxmpi::initialize().unwrap();
//! # let world = universe.world();
//! use oxmpi::persistent::{start_all, wait_all};
//! let peer = world.process_at_rank(1 - world.rank());
//! let mut outgoing = [0u64; 16];
//! let mut incoming = [0u64; 16];
//! oxmpi::request::scope(|scope| {
//!     let send = peer.send_init(scope, &mut outgoing, 0).unwrap();
//!     let receive = peer.receive_init(scope, &mut incoming, 0).unwrap();
//!     let mut requests = [receive, send];
//!     for step in 0..1000 {
//!         requests[1].buffer_mut().unwrap().fill(step);
//!         start_all(&mut requests).unwrap();
//!         wait_all(&mut requests).unwrap();
//!         assert_eq!(requests[0].buffer().unwrap()[0], step);
//!     }
//! });
//! ```
//!
//! The buffer is the request's until the scope ends; touching it directly
//! meanwhile does not compile:
//!
//! ```compile_fail
//! # let universe = oxmpi::initialize().unwrap();
//! # let world = universe.world();
//! let mut incoming = [0u8; 4];
//! oxmpi::request::scope(|scope| {
//!     let mut request = world.process_at_rank(0).receive_init(scope, &mut incoming, 0).unwrap();
//!     request.start().unwrap();
//!     incoming[0] = 1; // lent to the request: use `request.buffer_mut()`
//!     request.wait().unwrap();
//! });
//! ```
//!
//! A persistent request refers to its scope, which is not `Sync`, so it
//! stays on the thread that made it.
//!
//! A buffer described by a datatype that is not contiguous (a
//! [`View`] or [`MutView`])
//! is packed into a copy at each start of a send, and received into a
//! staging buffer that the request's wait or test unpacks into it. A
//! request dropped while such a receive is active is still completed by
//! its scope, but its data is not unpacked: the buffer keeps what it held.

use crate::comm::{completed_request, Communicator, SendMode, Status, PROC_NULL};
use crate::datatype::{MutView, View};
use crate::request::{Request, Scope};
use crate::{buffered, progress_until, wait_request, with_device, Error, ErrorClass, Result};
use std::fmt;

/// A buffer lent to a persistent send for `'a`: `&'a B` (shared: sent as
/// it is, every time) or `&'a mut B` (exclusive: refillable between
/// starts with [`PersistentRequest::buffer_mut`]). Implemented for those
/// two only.
pub trait Lend<'a>: sealed::Sealed {
    /// The buffer's type.
    type Target: ?Sized + 'a;
    /// The lent buffer, as a persistent request keeps it.
    #[doc(hidden)]
    fn lend(self) -> Lent<'a, Self::Target>;
}

mod sealed {
    pub trait Sealed {}
    impl<B: ?Sized> Sealed for &B {}
    impl<B: ?Sized> Sealed for &mut B {}
}

impl<'a, B: ?Sized + 'a> Lend<'a> for &'a B {
    type Target = B;
    fn lend(self) -> Lent<'a, B> {
        Lent(Borrow::Shared(self))
    }
}

impl<'a, B: ?Sized + 'a> Lend<'a> for &'a mut B {
    type Target = B;
    fn lend(self) -> Lent<'a, B> {
        Lent(Borrow::Exclusive(self))
    }
}

/// A buffer a persistent request holds; see [`Lend`].
#[doc(hidden)]
pub struct Lent<'a, B: ?Sized>(Borrow<'a, B>);

enum Borrow<'a, B: ?Sized> {
    Shared(&'a B),
    Exclusive(&'a mut B),
}

impl<B: ?Sized> Lent<'_, B> {
    fn get(&self) -> &B {
        match &self.0 {
            Borrow::Shared(b) => b,
            Borrow::Exclusive(b) => b,
        }
    }

    fn get_mut(&mut self) -> Option<&mut B> {
        match &mut self.0 {
            Borrow::Shared(_) => None,
            Borrow::Exclusive(b) => Some(b),
        }
    }
}

/// What a persistent request does each time it is started.
pub(crate) enum Operation<B: ?Sized> {
    /// A send in `mode` of the data `view` gives.
    Send {
        mode: SendMode,
        view: for<'b> fn(&'b B) -> View<'b>,
    },
    /// A buffered send (`MPI_Bsend_init`): each start copies the message
    /// into the attached buffer and completes at once.
    BufferedSend { view: for<'b> fn(&'b B) -> View<'b> },
    /// A receive into the data `view` gives.
    Receive {
        view: for<'b> fn(&'b mut B) -> MutView<'b>,
    },
}

impl<B: ?Sized> Operation<B> {
    fn name(&self) -> &'static str {
        match self {
            Operation::Send {
                mode: SendMode::Standard,
                ..
            } => "send",
            Operation::Send {
                mode: SendMode::Synchronous,
                ..
            } => "synchronous send",
            Operation::Send {
                mode: SendMode::Ready,
                ..
            } => "ready send",
            Operation::BufferedSend { .. } => "buffered send",
            Operation::Receive { .. } => "receive",
        }
    }
}

/// A persistent send or receive (`MPI_Request` made by `MPI_Send_init`,
/// `MPI_Recv_init`, ...): see the module docs. It borrows its buffer `B`
/// for `'a`, and its scope for `'s`.
#[must_use = "a persistent request does nothing until it is started"]
pub struct PersistentRequest<'s, 'a, B: ?Sized> {
    scope: &'s Scope<'a>,
    comm: Communicator,
    /// The peer's rank; `None` for a receive from any source.
    rank: Option<i32>,
    tag: i32,
    operation: Operation<B>,
    buf: Lent<'a, B>,
    /// The operation of the current start, until it is completed.
    active: Option<Request<'a>>,
}

impl<'s, 'a, B: ?Sized> PersistentRequest<'s, 'a, B> {
    /// A new, inactive request. The caller has checked the arguments.
    pub(crate) fn new(
        scope: &'s Scope<'a>,
        comm: Communicator,
        rank: Option<i32>,
        tag: i32,
        operation: Operation<B>,
        buf: Lent<'a, B>,
    ) -> PersistentRequest<'s, 'a, B> {
        PersistentRequest {
            scope,
            comm,
            rank,
            tag,
            operation,
            buf,
            active: None,
        }
    }

    /// Whether the request was started and not yet completed.
    pub fn is_active(&self) -> bool {
        self.active.is_some()
    }

    /// Starts the operation (`MPI_Start`). Starting an active request is
    /// an [`ErrorClass::Request`] error; a buffered send that finds no
    /// room in the attached buffer is an [`ErrorClass::Buffer`] error (and
    /// the request stays inactive).
    pub fn start(&mut self) -> Result<()> {
        if self.active.is_some() {
            return Err(Error::new(
                ErrorClass::Request,
                format!(
                    "this persistent {} is already active: complete it (wait or test) before \
                     starting it again",
                    self.operation.name()
                ),
            ));
        }
        let rank = self.rank;
        // Each operation is registered with the scope, which completes it
        // at its end if the program does not, and keeps the staging of
        // non-contiguous data alive until then.
        let request = match &self.operation {
            Operation::Send { mode, view } => {
                let id = self.comm.start_send_later(
                    rank.unwrap_or(PROC_NULL),
                    self.tag,
                    view(self.buf.get()),
                    *mode,
                )?;
                self.scope.register(id, &self.comm)
            }
            Operation::BufferedSend { view } => {
                let data = view(self.buf.get());
                let len = buffered::send(&self.comm, rank.unwrap_or(PROC_NULL), self.tag, &data)?;
                self.scope.register(completed_request(len)?, &self.comm)
            }
            Operation::Receive { view } => {
                let buf = self.buf.get_mut().ok_or_else(missing_buffer)?;
                // The scope keeps `buf` borrowed until this receive
                // completes; `buffer` and `buffer_mut` refuse to lend it
                // while the request is active. Data that is not
                // contiguous is unpacked by the device as it arrives.
                let id = self.comm.start_recv_view(rank, self.tag, view(buf))?;
                self.scope.register(id, &self.comm)
            }
        };
        self.active = Some(request);
        Ok(())
    }

    /// Ends the current operation, whose status was taken from the device
    /// (`None`: it was not there), leaving the request inactive. An
    /// inactive request gives an empty status.
    fn complete(&mut self, status: Option<oxmpi_adi::device::Status>) -> Result<Status> {
        let Some(request) = self.active.take() else {
            return Ok(Status::inactive());
        };
        request.complete(status)
    }

    /// Waits for the current operation to complete (`MPI_Wait`) and
    /// leaves the request inactive, ready to start again. On an inactive
    /// request it returns at once with an empty status (tag
    /// [`ANY_TAG`](crate::ANY_TAG), count 0).
    pub fn wait(&mut self) -> Result<Status> {
        let Some(request) = &self.active else {
            return Ok(Status::inactive());
        };
        // Only a status taken from the device ends the operation: if MPI
        // itself fails here, the request stays active (and its buffer
        // lent).
        let status = self.comm.handled(wait_request(request.id))?;
        self.complete(Some(status))
    }

    /// Completes the current operation if it is done (`MPI_Test`):
    /// `Some` with its outcome (the request is then inactive), `None` if
    /// it is still going. An inactive request gives an empty status.
    pub fn test(&mut self) -> Result<Option<Status>> {
        let Some(request) = &self.active else {
            return Ok(Some(Status::inactive()));
        };
        let status = self.comm.handled(
            crate::progress_once().and_then(|()| with_device(|d| Ok(d.take_status(request.id)))),
        )?;
        match status {
            Some(status) => self.complete(Some(status)).map(Some),
            None => Ok(None),
        }
    }

    /// Asks to cancel the current operation (`MPI_Cancel`); it still has
    /// to be completed. See [`Request::cancel`](crate::request::Request::cancel).
    pub fn cancel(&self) {
        if let Some(request) = &self.active {
            let _ = with_device(|d| {
                d.cancel(request.id);
                Ok(())
            });
        }
    }

    /// The buffer, to read. A send's buffer can always be read; a
    /// receive's only while the request is inactive (else an
    /// [`ErrorClass::Request`] error).
    pub fn buffer(&self) -> Result<&B> {
        if matches!(self.operation, Operation::Receive { .. }) {
            self.check_inactive("read its buffer")?;
        }
        Ok(self.buf.get())
    }

    /// The buffer, to change (a receive's, or a send's lent with
    /// `&mut`), while the request is inactive. An active request is an
    /// [`ErrorClass::Request`] error; a send buffer lent shared is an
    /// [`ErrorClass::Buffer`] error.
    pub fn buffer_mut(&mut self) -> Result<&mut B> {
        self.check_inactive("change its buffer")?;
        let name = self.operation.name();
        self.buf.get_mut().ok_or_else(|| {
            Error::new(
                ErrorClass::Buffer,
                format!(
                    "this persistent {name}'s buffer was lent shared (`&buf`): lend it with \
                     `&mut buf` to change it between starts"
                ),
            )
        })
    }

    fn check_inactive(&self, what: &str) -> Result<()> {
        match self.active {
            None => Ok(()),
            Some(_) => Err(Error::new(
                ErrorClass::Request,
                format!(
                    "this persistent {} is active: complete it (wait or test) before you {what}",
                    self.operation.name()
                ),
            )),
        }
    }
}

fn missing_buffer() -> Error {
    Error::new(
        ErrorClass::Intern,
        "a persistent receive without its buffer",
    )
}

impl<B: ?Sized> fmt::Debug for PersistentRequest<'_, '_, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PersistentRequest")
            .field("operation", &self.operation.name())
            .field("rank", &self.rank)
            .field("tag", &self.tag)
            .field("active", &self.active.is_some())
            .finish_non_exhaustive()
    }
}

/// Starts every request (`MPI_Startall`). If one is active, none is
/// started and the call is an [`ErrorClass::Request`] error; if a start
/// fails on the way, the requests before it stay active (complete them)
/// and its error is returned.
pub fn start_all<B: ?Sized>(requests: &mut [PersistentRequest<'_, '_, B>]) -> Result<()> {
    if let Some(index) = requests.iter().position(|r| r.is_active()) {
        return Err(Error::new(
            ErrorClass::Request,
            format!(
                "request {index} of {} (a persistent {}) is already active: none was started",
                requests.len(),
                requests[index].operation.name()
            ),
        ));
    }
    requests.iter_mut().try_for_each(|r| r.start())
}

/// Waits for every active request (`MPI_Waitall`), leaving all inactive,
/// and returns their statuses in order (an empty one for a request that
/// was inactive).
///
/// As [`request::wait_all`](crate::request::wait_all): if any request
/// failed, all are still completed, and the error has class
/// [`ErrorClass::InStatus`] (`MPI_ERR_IN_STATUS`), naming each failed
/// request by its index with its error; [`wait_all_outcomes`] gives each
/// request's outcome instead.
pub fn wait_all<B: ?Sized>(requests: &mut [PersistentRequest<'_, '_, B>]) -> Result<Vec<Status>> {
    let outcomes = wait_all_outcomes(requests)?;
    let failed: Vec<String> = outcomes
        .iter()
        .enumerate()
        .filter_map(|(index, outcome)| {
            outcome
                .as_ref()
                .err()
                .map(|e| format!("request {index}: {e}"))
        })
        .collect();
    if failed.is_empty() {
        return outcomes.into_iter().collect();
    }
    Err(Error::new(
        ErrorClass::InStatus,
        format!(
            "{} of {} persistent requests failed (all are complete): {}",
            failed.len(),
            outcomes.len(),
            failed.join("; ")
        ),
    ))
}

/// Waits for every active request (`MPI_Waitall`), leaving all inactive,
/// and returns each one's outcome in order: its status (an empty one for
/// a request that was inactive) or its error. `Err` only when the call
/// itself failed (the requests then stay as they were).
pub fn wait_all_outcomes<B: ?Sized>(
    requests: &mut [PersistentRequest<'_, '_, B>],
) -> Result<Vec<Result<Status>>> {
    let ids: Vec<_> = requests
        .iter()
        .map(|r| r.active.as_ref().map(|a| a.id))
        .collect();
    let statuses = progress_until(|d| {
        if !ids.iter().flatten().all(|&id| d.is_complete(id)) {
            return Ok(None);
        }
        Ok(Some(
            ids.iter()
                .map(|id| id.map(|id| d.take_status(id)))
                .collect::<Vec<_>>(),
        ))
    })?;
    Ok(requests
        .iter_mut()
        .zip(statuses)
        .map(|(request, status)| request.complete(status.flatten()))
        .collect())
}
