//! oxmpi: an MPI implementation in Rust.
//!
//! This crate is the MPI layer (device independent): initialization and
//! finalization, groups and communicators with their context ids,
//! point-to-point messaging with statuses and requests, datatypes (derived
//! ones, `#[derive(Equivalence)]` for structs, pack and external32), the
//! collective operations, errors with MPI error classes, and the safe Rust
//! API over them. It drives the abstract device ([`oxmpi_adi`]) and never
//! touches a
//! socket or a packet itself.
//!
//! # Modules
//! - [`comm`]: the [`Communicator`] and point-to-point messaging.
//! - [`group`]: groups of processes and their set operations.
//! - `comm_management`: making, comparing, naming and freeing
//!   communicators (methods of [`Communicator`]; [`Color`],
//!   [`CommunicatorRelation`]).
//! - `context`: the context ids that keep communicators apart, agreed
//!   between processes and reused after a free.
//! - `intercomm`: intercommunicators (methods of [`Communicator`]).
//! - [`topology`]: Cartesian, graph and distributed graph topologies;
//!   `neighborhood`: their neighbourhood collectives (methods of
//!   [`Communicator`]).
//! - [`attribute`], [`info`], [`errhandler`]: attributes cached on
//!   communicators, hints, and what errors do.
//! - [`collective`]: the collective operations (methods of
//!   [`Communicator`] and [`Process`]), reduction operations, and their
//!   algorithms.
//! - [`request`], [`persistent`], [`buffered`]: immediate, persistent
//!   and buffered point-to-point operations.
//! - [`datatype`]: which Rust values travel in messages, and how they lie
//!   in memory (derived datatypes, pack, external32).
//! - [`rma`]: one-sided communication (windows, put, get, accumulates,
//!   their synchronization).
//!
//! # Quick start
//! ```no_run
//! let universe = oxmpi::initialize().expect("MPI init");
//! let world = universe.world();
//! if world.rank() == 0 {
//!     world.process_at_rank(1).send(&[1.0f64, 2.0, 3.0]).unwrap();
//! } else if world.rank() == 1 {
//!     let mut buf = [0.0f64; 3];
//!     let status = world.process_at_rank(0).receive_into(&mut buf[..]).unwrap();
//!     assert_eq!(status.count::<f64>(), Some(3));
//! }
//! // MPI is finalized when `universe` is dropped (or by `universe.finalize()`).
//! ```
//! Run it with `oxrun -n 2 ./program` (or MPICH's `mpiexec`). Run alone, a
//! program is a 1-rank job.
//!
//! # Threads
//! [`initialize_with_threading`] provides every level up to
//! [`Threading::Multiple`]. At [`Threading::Single`] and
//! [`Threading::Funneled`] (without `OXMPI_ASYNC_PROGRESS`'s thread) only
//! the thread that initialized MPI may call it, as MPI says: that thread
//! keeps the device and takes no lock, and a call from another thread
//! fails with `MPI_ERR_OTHER`. At the other levels every call takes one
//! lock around the device for as long as it works on it; a blocking call
//! (a wait, a probe) releases it between polls whenever another thread
//! wants it, and while it sleeps, so threads blocked in different calls
//! all make progress. Sends from one
//! thread keep their order. The types say what may cross threads:
//! [`Communicator`]s are `Send` and `Sync`; a [`request::Request`] is
//! `Send` (it may be completed on another thread); a [`request::Scope`] is
//! not `Sync`, so two threads cannot start requests in one scope, and a
//! buffer lent to MPI stays borrowed until its request completes, whatever
//! thread completes it. Sharing a scope between threads does not compile:
//!
//! ```compile_fail
//! oxmpi::request::scope(|scope| {
//!     std::thread::scope(|threads| {
//!         threads.spawn(|| {
//!             let _shared = scope;
//!         });
//!     });
//! });
//! ```
//!
//! # Environment
//! Every `OXMPI_*` variable is listed in README.md; the ones this crate
//! reads are `OXMPI_TRANSPORTS` (see [`TRANSPORTS_ENV`]) and
//! `OXMPI_ASYNC_PROGRESS` (see [`rma::ASYNC_PROGRESS_ENV`]),
//! `OXMPI_COLL_SHM` and `OXMPI_CHECK_COUNTS` (see
//! [`collective::CHECK_COUNTS_ENV`]), plus the
//! device's and the transports' own.

// `#[derive(Equivalence)]` writes `::oxmpi::...`; this lets the crate's
// own tests use it.
extern crate self as oxmpi;

pub mod attribute;
pub mod buffered;
pub mod collective;
pub mod comm;
mod comm_management;
mod context;
pub mod datatype;
pub mod errhandler;
pub mod group;
pub mod info;
mod intercomm;
mod neighborhood;
pub mod persistent;
pub mod request;
pub mod rma;
pub mod topology;

pub use attribute::{Keyval, PredefinedAttribute};
pub use comm::{AnyProcess, Communicator, Message, Process, Status, ANY_TAG, PROC_NULL, TAG_UB};
pub use comm_management::{Color, CommunicatorRelation, MAX_OBJECT_NAME};
pub use datatype::{Buffer, BufferMut, ElementType, Equivalence};
pub use errhandler::ErrorHandler;
pub use group::{Group, GroupRelation};
pub use info::{Info, MAX_INFO_KEY, MAX_INFO_VAL};
pub use topology::{dims_create, CartesianLayout, DistributedGraphNeighbors, TopologyKind};

/// The traits a program calls methods of, to import at once
/// (`use oxmpi::traits::*`), as rsmpi's `mpi::traits`.
pub mod traits {
    pub use crate::datatype::{Buffer, BufferMut, Datatype, Equivalence, UncommittedDatatype};
}
pub use oxmpi_adi::{Error, ErrorClass, Result};
pub use persistent::PersistentRequest;

use oxmpi_adi::device::Device;
use oxmpi_adi::pmi::Pmi;
use oxmpi_adi::select::{start_transports, TransportFactory};
use oxmpi_adi::wait::{Idle, IdleStep, SLEEP_AT_MOST};
use oxmpi_shm::region::Doorbell;
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock, TryLockError};
use std::time::{Duration, Instant};

pub use oxmpi_adi::select::TRANSPORTS_ENV;

/// The shared-memory transport, as [`TRANSPORTS_ENV`] names it.
const SHM: TransportFactory = TransportFactory {
    name: "shm",
    start: |job| {
        let config = oxmpi_shm::ShmConfig::from_env(job)?;
        Ok(Box::new(oxmpi_shm::ShmTransport::new(job, config)?))
    },
};

/// The verbs transport (RC queue pairs), as [`TRANSPORTS_ENV`] names it:
/// it starts where a provider is present (a device, or the soft provider
/// that `OXMPI_VERBS_PROVIDER=soft` asks for).
const VERBS: TransportFactory = TransportFactory {
    name: "verbs",
    start: oxmpi_verbs::transport::start,
};

/// The TCP transport, as [`TRANSPORTS_ENV`] names it.
const TCP: TransportFactory = TransportFactory {
    name: "tcp",
    start: |job| {
        let config = oxmpi_tcp::TcpConfig::from_env()?;
        Ok(Box::new(oxmpi_tcp::TcpTransport::new(job, config)?))
    },
};

/// The transports between processes this build has, in the default order
/// of preference (shared memory where both ends share a host, then RDMA,
/// then TCP).
const TRANSPORTS: &[TransportFactory] = &[SHM, VERBS, TCP];

/// The transports between processes this build of oxmpi has, by the names
/// [`TRANSPORTS_ENV`] takes, in the default order of preference.
pub const TRANSPORT_NAMES: &[&str] = &[SHM.name, VERBS.name, TCP.name];

/// MPI's thread support levels (MPI 4.1 §11.2.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Threading {
    /// Only one thread exists.
    Single,
    /// Only the thread that initialized MPI makes MPI calls.
    Funneled,
    /// Any thread may make MPI calls, one at a time.
    Serialized,
    /// Any thread may make MPI calls at any time.
    Multiple,
}

/// The most this build provides; see the crate docs.
const THREADING_PROVIDED: Threading = Threading::Multiple;

#[derive(Default)]
enum State {
    #[default]
    Uninitialized,
    Running(Box<Device>),
    /// Running, the device kept by the thread that initialized MPI (see
    /// [`KeptDevice`]).
    Kept,
    Finalized,
}

static STATE: Mutex<State> = Mutex::new(State::Uninitialized);

/// Set while the thread that initialized MPI keeps the device in its
/// [`KEPT_DEVICE`]: a hint, read before the lock, that the calling thread
/// may be that one (the mutex's [`State::Kept`] is the truth for the
/// others).
static KEPT: AtomicBool = AtomicBool::new(false);

/// The device, where MPI was initialized at [`Threading::Single`] or
/// [`Threading::Funneled`] with no progress thread: only the thread that
/// initialized MPI may call it then, so that thread keeps the device
/// here, and its calls take it with no atomic operation (a lock and an
/// unlock of the mutex are two locked instructions, which cost about 30
/// ns together on the development VM: more than a tenth of a short
/// message's one-way latency). The mutex says [`State::Kept`] meanwhile,
/// and another thread's call fails with that. A device the program never
/// finalized is not dropped when the thread ends, as the mutex's would
/// not be.
struct KeptDevice(RefCell<Option<Box<Device>>>);

impl Drop for KeptDevice {
    fn drop(&mut self) {
        if let Some(device) = self.0.get_mut().take() {
            std::mem::forget(device);
        }
    }
}

thread_local! {
    static KEPT_DEVICE: KeptDevice = const { KeptDevice(RefCell::new(None)) };
}

/// Threads waiting for the device lock. A blocking call that holds the
/// lock while polling lets go between polls when this is not zero.
static CONTENDERS: AtomicUsize = AtomicUsize::new(0);

fn lock_state() -> MutexGuard<'static, State> {
    // A panic while the device was locked leaves it as it was; later calls
    // may still work, so the poison is not propagated.
    match STATE.try_lock() {
        Ok(guard) => guard,
        Err(TryLockError::Poisoned(p)) => p.into_inner(),
        Err(TryLockError::WouldBlock) => {
            CONTENDERS.fetch_add(1, Ordering::Relaxed);
            let guard = STATE.lock().unwrap_or_else(|p| p.into_inner());
            CONTENDERS.fetch_sub(1, Ordering::Relaxed);
            guard
        }
    }
}

/// An on/off setting from the environment variable `name`: `1` on, `0` or
/// unset off, anything else an `MPI_ERR_ARG` error that says what `1`
/// does (`meaning_of_1`).
pub(crate) fn switch_from_env(name: &str, meaning_of_1: &str) -> Result<bool> {
    match std::env::var(name).as_deref() {
        Err(_) | Ok("0") => Ok(false),
        Ok("1") => Ok(true),
        Ok(other) => Err(Error::new(
            ErrorClass::Arg,
            format!("{name}={other:?}: set it to 1 ({meaning_of_1}) or 0"),
        )),
    }
}

/// The device, or an error saying why MPI is not running.
fn running(state: &mut State) -> Result<&mut Device> {
    match state {
        State::Running(device) => Ok(device),
        State::Uninitialized => Err(Error::new(
            ErrorClass::Other,
            "MPI is not initialized: call oxmpi::initialize() first",
        )),
        State::Kept => Err(Error::new(
            ErrorClass::Other,
            "MPI was initialized at Threading::Single or Threading::Funneled: only the \
             thread that initialized it may call it (initialize_with_threading with \
             Threading::Serialized or Threading::Multiple lets other threads call it)",
        )),
        State::Finalized => Err(Error::new(ErrorClass::Other, "MPI has been finalized")),
    }
}

/// Runs `f` with the device, or fails if MPI is not running. Inline: a
/// call's own frame cost as much as the lock itself on the short path.
#[inline]
pub(crate) fn with_device<R>(f: impl FnOnce(&mut Device) -> Result<R>) -> Result<R> {
    if KEPT.load(Ordering::Relaxed) {
        return with_kept_device(f);
    }
    f(running(&mut lock_state())?)
}

/// [`with_device`] while a thread keeps the device: this thread's own
/// [`KEPT_DEVICE`] if it is the one, else the mutex's state (which says
/// why not).
#[inline]
fn with_kept_device<R>(f: impl FnOnce(&mut Device) -> Result<R>) -> Result<R> {
    KEPT_DEVICE
        .try_with(|kept| match kept.0.try_borrow_mut() {
            Ok(mut device) => match device.as_deref_mut() {
                Some(device) => f(device),
                // Another thread.
                None => f(running(&mut lock_state())?),
            },
            // An MPI call from inside one (a callback): the mutex would
            // have deadlocked.
            Err(_) => Err(Error::new(
                ErrorClass::Other,
                "MPI was called from inside an MPI call (a callback) on the thread that \
                 keeps the device",
            )),
        })
        .unwrap_or_else(|_| {
            Err(Error::new(
                ErrorClass::Other,
                "MPI was called while this thread's thread-local storage was being destroyed",
            ))
        })
}

/// Takes the device from this thread's [`KEPT_DEVICE`], if it keeps it.
fn take_kept_device() -> Option<Box<Device>> {
    if !KEPT.load(Ordering::Relaxed) {
        return None;
    }
    KEPT_DEVICE
        .try_with(|kept| kept.0.try_borrow_mut().ok()?.take())
        .ok()
        .flatten()
}

/// Makes progress until `done` gives a value: the loop of every blocking
/// call. Between fruitless polls it spins, yields the processor or
/// sleeps in the kernel as the device's wait policy says
/// ([`Device::idle`]), and it lets other threads have the device between
/// polls when they ask for it and while it yields or sleeps. While this
/// thread has non-blocking collectives under way, it lets go of the
/// device after each poll to advance them (see `collective::engine`).
pub(crate) fn progress_until<R>(
    mut done: impl FnMut(&mut Device) -> Result<Option<R>>,
) -> Result<R> {
    /// What the loop does with the device let go, before it advances the
    /// collectives (if any are pending) and takes the device again.
    enum Pause {
        Sleep(oxmpi_adi::wait::Sleep),
        Yield,
    }
    /// What a hold of the device ended with.
    enum Held<R> {
        Done(R),
        LetGo {
            pause: Option<Pause>,
            advance_collectives: bool,
        },
    }
    let mut idle = Idle::new();
    loop {
        let held = with_device(|device| {
            // Only this thread starts or advances its collectives, and
            // neither happens while it holds the device: asked once.
            let collectives_pending = collective::engine::has_pending();
            loop {
                // What this rank queued for one-sided targets leaves before
                // it waits (the wait may be for those operations, a get's
                // request, or for something they cause), and one-sided data
                // that moved as messages is accounted for.
                rma::progress(device);
                if let Some(r) = done(device)? {
                    return Ok(Held::Done(r));
                }
                let pause = if device.check_device(false)? {
                    idle = Idle::new();
                    None
                } else {
                    match device.idle(&mut idle) {
                        IdleStep::Spin => None,
                        IdleStep::Yield => Some(Pause::Yield),
                        IdleStep::Sleep => Some(Pause::Sleep(device.prepare_sleep()?)),
                    }
                };
                if pause.is_some() || collectives_pending {
                    return Ok(Held::LetGo {
                        pause,
                        advance_collectives: collectives_pending,
                    });
                }
                if CONTENDERS.load(Ordering::Relaxed) > 0 {
                    return Ok(Held::LetGo {
                        pause: Some(Pause::Yield),
                        advance_collectives: false,
                    });
                }
            }
        })?;
        let (pause, advance_collectives) = match held {
            Held::Done(r) => return Ok(r),
            Held::LetGo {
                pause,
                advance_collectives,
            } => (pause, advance_collectives),
        };
        match pause {
            Some(Pause::Sleep(mut sleep)) => {
                let slept = sleep.wait(SLEEP_AT_MOST);
                with_device(|d| d.end_sleep())?;
                slept?;
            }
            Some(Pause::Yield) => std::thread::yield_now(),
            None => {}
        }
        if advance_collectives {
            collective::engine::advance()?;
        }
    }
}

/// Makes progress once without blocking (the progress of every `test`
/// call and immediate probe): polls the device, then advances this
/// thread's non-blocking collectives.
pub(crate) fn progress_once() -> Result<()> {
    with_device(|d| {
        // As in `progress_until`: a test may be of a one-sided
        // operation still queued, or of one whose data just came.
        rma::progress(d);
        d.check_device(false)?;
        rma::progress(d);
        Ok(())
    })?;
    collective::engine::advance()
}

/// How long a wait on memory sleeps at a time once it has polled for the
/// device's poll time. Where each process has a core, every nap is this
/// short: a nap's wake-up takes nobody's processor, and the wait notices
/// the data at most this late. On a crowded node each later nap of the
/// wait is twice as long, up to [`NAP_AT_MOST`] ...
const NAP: Duration = Duration::from_micros(20);
/// ... so a long crowded wait wakes at most every this long: there a
/// nap's wake-up takes the processor from a process that computes (at 2
/// processes on one CPU, a debug build's barrier waiting 0.5 s for one
/// that computed took 12% of the core napping 20 us at a time, 2% so).
const NAP_AT_MOST: Duration = Duration::from_micros(500);
/// Fruitless checks of a wait on memory between two polls of the device
/// where each process has a core (on a crowded node every check polls,
/// as a wait's yield costs more than a poll).
const POLL_EVERY: u32 = 64;

/// Waits until `ready` holds of memory that no transport wakes a wait
/// for (a one-sided lock word in this process), as the device's wait
/// policy says: [`wait_for_memory_rung`] without a doorbell, so it naps
/// once the poll time is over.
pub(crate) fn wait_for_memory(crowded: bool, ready: impl FnMut() -> Result<bool>) -> Result<()> {
    wait_for_memory_rung(crowded, None, ready)
}

/// Waits until `ready` holds of memory that no transport wakes a wait
/// for (the collectives' shared region, a one-sided lock word in this
/// process), as the device's wait policy says ([`Device::idle`]): polls
/// the device and advances non-blocking collectives every [`POLL_EVERY`]
/// checks, or at every check and then yields where `crowded` (the
/// device's [`Device::crowded`]), until the poll time is over; then
/// sleeps a nap at a time: on `doorbell` where the memory has one (those
/// who publish there ring it, which ends the nap at once), else blind.
pub(crate) fn wait_for_memory_rung(
    crowded: bool,
    doorbell: Option<&Doorbell<'_>>,
    mut ready: impl FnMut() -> Result<bool>,
) -> Result<()> {
    let mut idle = Idle::new();
    let mut checks = 0u32;
    let poll_every = if crowded { 1 } else { POLL_EVERY };
    let mut nap = NAP;
    loop {
        if ready()? {
            return Ok(());
        }
        checks = checks.wrapping_add(1);
        if checks.is_multiple_of(poll_every) {
            let step = with_device(|d| {
                // As in `progress_until`: one-sided operations queued
                // here leave, and those that moved are accounted for.
                rma::progress(d);
                let moved = d.check_device(false)?;
                rma::progress(d);
                if moved {
                    idle = Idle::new();
                    return Ok(IdleStep::Spin);
                }
                Ok(d.idle(&mut idle))
            })?;
            // Pending non-blocking collectives move on too: another
            // process may wait for this one's part of them.
            if collective::engine::has_pending() {
                collective::engine::advance()?;
            }
            match step {
                IdleStep::Spin => nap = NAP,
                IdleStep::Yield => {
                    nap = NAP;
                    std::thread::yield_now();
                }
                IdleStep::Sleep => {
                    match doorbell {
                        Some(bell) => {
                            let sleeper = bell.sleeper();
                            if ready()? {
                                return Ok(());
                            }
                            sleeper.sleep(nap);
                        }
                        None => std::thread::sleep(nap),
                    }
                    if crowded {
                        nap = (nap * 2).min(NAP_AT_MOST);
                    }
                }
            }
        }
        std::hint::spin_loop();
    }
}

/// Waits for `request` and takes its status (it is freed).
pub(crate) fn wait_request(
    request: oxmpi_adi::device::RequestId,
) -> Result<oxmpi_adi::device::Status> {
    if let Some(status) = request.complete_status() {
        // Complete when it started: no device, no lock.
        return Ok(status);
    }
    progress_until(|d| take_completed(d, request))
}

/// The status of `request` if it is complete (it is freed), `None` if
/// not yet: the test of every wait for one request.
pub(crate) fn take_completed(
    d: &mut Device,
    request: oxmpi_adi::device::RequestId,
) -> Result<Option<oxmpi_adi::device::Status>> {
    if !d.is_complete(request) {
        return Ok(None);
    }
    d.take_status(request).map(Some).ok_or_else(|| {
        Error::new(
            ErrorClass::Request,
            "the request was already completed and freed",
        )
    })
}

/// The MPI environment of this process; MPI is finalized when it is
/// dropped (or by [`Universe::finalize`]).
pub struct Universe {
    world: Communicator,
    self_comm: Communicator,
    finalized: bool,
}

/// Initializes MPI (`MPI_Init`) with [`Threading::Single`].
pub fn initialize() -> Result<Universe> {
    initialize_with_threading(Threading::Single).map(|(u, _)| u)
}

/// Initializes MPI (`MPI_Init_thread`), returning the level provided:
/// the one asked for, or the most this build supports if that is less.
pub fn initialize_with_threading(threading: Threading) -> Result<(Universe, Threading)> {
    let mut state = lock_state();
    match *state {
        State::Uninitialized => {}
        State::Running(_) | State::Kept => {
            return Err(Error::new(ErrorClass::Other, "MPI is already initialized"));
        }
        State::Finalized => {
            return Err(Error::new(
                ErrorClass::Other,
                "MPI cannot be initialized again after it was finalized",
            ));
        }
    }
    start_clock();
    let mut pmi = Pmi::from_env()?;
    let job = oxmpi_adi::device::job_info(&mut pmi)?;
    attribute::set_job_attributes(attribute::JobAttributes {
        appnum: pmi.appnum(),
        universe_size: job.size as i32,
    });
    let setting = std::env::var(TRANSPORTS_ENV).ok();
    let async_progress = rma::progress::wanted()?;
    collective::read_count_checking()?;
    let transports = start_transports(setting.as_deref(), TRANSPORTS, &job)?;
    let mut device = Device::new(pmi, job.clone(), transports)?;
    rma::install(&mut device);
    let mut device = Some(Box::new(device));
    if threading <= Threading::Funneled && !async_progress {
        // Only this thread may call MPI: it keeps the device.
        let _ = KEPT_DEVICE.try_with(|kept| {
            if let Ok(mut slot) = kept.0.try_borrow_mut() {
                *slot = device.take();
            }
        });
    }
    match device {
        Some(device) => *state = State::Running(device),
        None => {
            *state = State::Kept;
            KEPT.store(true, Ordering::Relaxed);
        }
    }
    if async_progress {
        // It waits for the device until this call lets go of it.
        rma::progress::start();
    }
    let universe = Universe {
        world: Communicator::world(job.rank, job.size),
        self_comm: Communicator::self_comm(job.rank),
        finalized: false,
    };
    Ok((universe, threading.min(THREADING_PROVIDED)))
}

impl Universe {
    /// The communicator of every process in the job (`MPI_COMM_WORLD`).
    pub fn world(&self) -> Communicator {
        self.world.clone()
    }

    /// The communicator of this process alone (`MPI_COMM_SELF`).
    pub fn self_comm(&self) -> Communicator {
        self.self_comm.clone()
    }

    /// Finalizes MPI (`MPI_Finalize`): waits until every rank finalizes.
    /// Requests must be complete.
    pub fn finalize(mut self) -> Result<()> {
        self.finalize_once()
    }

    fn finalize_once(&mut self) -> Result<()> {
        if self.finalized {
            return Ok(());
        }
        self.finalized = true;
        // The attributes of the self communicator are deleted first, so
        // that their delete callbacks can still use MPI (MPI 4.1 §11.2.2);
        // a callback's error is finalize's, once MPI is finalized.
        let deleted = self
            .self_comm
            .attributes()
            .map(|mut attributes| std::mem::take(&mut *attributes))
            .and_then(|mut taken| taken.delete_all());
        // Messages still in the attached buffer are sent first (MPI 4.1
        // §11.2.2): their receivers may be waiting for them.
        buffered::flush_at_finalize();
        rma::progress::stop();
        let kept = take_kept_device();
        let mut state = lock_state();
        let result = match (&mut *state, kept) {
            (_, Some(mut device)) => device.finalize(),
            (State::Running(device), None) => device.finalize(),
            // Another thread keeps the device: it finalizes.
            (State::Kept, None) => return running(&mut state).map(|_| ()).and(deleted),
            _ => Ok(()),
        };
        KEPT.store(false, Ordering::Relaxed);
        *state = State::Finalized;
        result.and(deleted)
    }
}

impl Drop for Universe {
    fn drop(&mut self) {
        // A rank that panicked is not done: finalizing would make it look
        // like a clean exit to the launcher (and may wait forever for ranks
        // that wait for it). Leaving unfinalized makes the job fail.
        if std::thread::panicking() {
            return;
        }
        if let Err(e) = self.finalize_once() {
            eprintln!("oxmpi: finalize failed: {e}");
        }
    }
}

fn start_clock() -> Instant {
    static START: OnceLock<Instant> = OnceLock::new();
    *START.get_or_init(Instant::now)
}

/// Seconds since an arbitrary time in this process's past (`MPI_Wtime`).
/// Not synchronized between processes.
pub fn time() -> f64 {
    start_clock().elapsed().as_secs_f64()
}

/// Resolution of [`time`] in seconds (`MPI_Wtick`).
pub fn time_resolution() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for the call to fill in.
    let rc = unsafe { libc::clock_getres(libc::CLOCK_MONOTONIC, &mut ts) };
    if rc == 0 {
        ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
    } else {
        1e-9
    }
}

/// The name of this processor (`MPI_Get_processor_name`): the host name.
pub fn processor_name() -> Result<String> {
    let mut buf = [0u8; 256];
    // SAFETY: `buf` is writable for its length; gethostname writes at most
    // that many bytes.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return Err(Error::os(
            "reading the host name",
            std::io::Error::last_os_error(),
        ));
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    Ok(String::from_utf8_lossy(&buf[..end]).into_owned())
}

#[cfg(test)]
mod thread_safety {
    use super::*;

    fn send_and_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}

    #[test]
    fn the_types_say_what_crosses_threads() {
        send_and_sync::<Communicator>();
        send_and_sync::<Status>();
        send::<request::Request<'static>>();
        send::<Universe>();
    }
}
