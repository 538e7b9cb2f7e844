//! How a waiting rank waits: the one policy of every wait that polls.
//!
//! A wait polls; each fruitless poll asks its [`WaitPolicy`] (through
//! [`crate::device::Device::idle`]) what to do next ([`IdleStep`]). For
//! the poll time (`OXMPI_SPIN_US`, 1 ms by default) the wait polls again:
//! at once where each of the node's ranks has a core of its own, after
//! giving the processor up (`sched_yield`) where the ranks outnumber the
//! cores ("crowded"), because the rank this one waits for may then be the
//! one waiting for this core, and a wait that spins keeps it off for the
//! rest of its time slice. Past the poll time the wait sleeps, so that an
//! idle job burns no processor and a rank that computes gets its core
//! back: in `poll(2)` on the transports' descriptors for the device's
//! waits ([`Sleep`]), in short naps for waits on memory that nothing
//! wakes (the collectives' shared region).

use crate::error::{Error, ErrorClass, Result};
use std::time::{Duration, Instant};

/// Environment variable: how long a blocking wait polls before it sleeps.
pub const SPIN_ENV: &str = "OXMPI_SPIN_US";
/// How long a wait polls before it sleeps unless `OXMPI_SPIN_US` says.
const POLL_FOR: Duration = Duration::from_millis(1);
/// Environment variable set by oxrun for a rank it bound to CPUs of its
/// own (it binds only when the node's ranks fit its cores).
const CPUSET_ENV: &str = "OXMPI_CPUSET";
/// While polling, the clock is read once every this many polls.
const CLOCK_EVERY: u32 = 16;
/// The longest one sleep lasts before the wait looks again.
pub const SLEEP_AT_MOST: Duration = Duration::from_millis(100);

/// What a wait does after a fruitless poll; see [`WaitPolicy::step`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdleStep {
    /// Poll again at once.
    Spin,
    /// Give the processor up (`std::thread::yield_now`), then poll again.
    Yield,
    /// Sleep until a transport wakes the wait, or nap where nothing can.
    Sleep,
}

/// How the waits of this process wait: for how long they poll, and
/// whether they yield the processor between polls.
#[derive(Clone, Copy, Debug)]
pub struct WaitPolicy {
    poll_for: Duration,
    crowded: bool,
}

impl WaitPolicy {
    /// The policy from the environment: the poll time from
    /// `OXMPI_SPIN_US`, and crowded where `MPI_LOCALNRANKS` (set by the
    /// launcher) exceeds the cores the node's ranks share. An
    /// `MPI_ERR_ARG` error if `OXMPI_SPIN_US` is not a number.
    pub fn from_env() -> Result<WaitPolicy> {
        let poll_for = match std::env::var(SPIN_ENV) {
            Ok(v) => v
                .trim()
                .parse::<u64>()
                .map(Duration::from_micros)
                .map_err(|_| {
                    Error::new(
                        ErrorClass::Arg,
                        format!(
                            "{SPIN_ENV}={v:?} is not a number of microseconds (how long a \
                             wait polls before it sleeps; 1000 by default)"
                        ),
                    )
                })?,
            Err(_) => POLL_FOR,
        };
        let local = std::env::var("MPI_LOCALNRANKS")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(1);
        Ok(WaitPolicy {
            poll_for,
            crowded: local > cores_for_local_ranks(),
        })
    }

    /// Whether the node's ranks outnumber its cores, so that a rank
    /// waited for is often off its core.
    pub fn crowded(&self) -> bool {
        self.crowded
    }

    /// Counts one fruitless poll of `idle`'s wait and says what to do
    /// next: spin or yield (where crowded) until the wait has polled for
    /// the poll time, then sleep.
    #[inline]
    pub fn step(&self, idle: &mut Idle) -> IdleStep {
        idle.polls = idle.polls.wrapping_add(1);
        // Reading the clock costs about as much as a poll's own work: look
        // at it only every few polls.
        if idle.polls.is_multiple_of(CLOCK_EVERY) {
            idle.polled_enough =
                idle.since.get_or_insert_with(Instant::now).elapsed() >= self.poll_for;
        }
        if idle.polled_enough {
            IdleStep::Sleep
        } else if self.crowded {
            IdleStep::Yield
        } else {
            IdleStep::Spin
        }
    }
}

/// How long a wait has gone without progress; see [`WaitPolicy::step`].
/// A wait that makes progress starts a new one.
pub struct Idle {
    /// When the wait was first seen idle: read at the first clock check,
    /// [`CLOCK_EVERY`] polls in, so that a wait which progresses sooner
    /// (every message of a ping-pong) never reads the clock.
    since: Option<Instant>,
    polls: u32,
    /// Whether the last clock check found the poll time over.
    polled_enough: bool,
}

impl Idle {
    /// A wait that starts now.
    pub fn new() -> Idle {
        Idle {
            since: None,
            polls: 0,
            polled_enough: false,
        }
    }
}

impl Default for Idle {
    fn default() -> Idle {
        Idle::new()
    }
}

/// How many cores this node's ranks share. A rank oxrun bound sees only
/// its own CPU in its affinity mask, so the node's online CPUs count; an
/// unbound rank shares its mask with the others (all of it, or what
/// `taskset` left the launcher).
fn cores_for_local_ranks() -> usize {
    if std::env::var_os(CPUSET_ENV).is_some() {
        // SAFETY: sysconf only reads a system parameter.
        let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
        if let Ok(online) = usize::try_from(online) {
            return online.max(1);
        }
    }
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// A prepared sleep: the descriptors that wake it. It holds no borrow of
/// the device, so a thread can sleep while others use the device; see
/// [`crate::device::Device::prepare_sleep`].
pub struct Sleep {
    fds: Vec<libc::pollfd>,
}

// SAFETY: a pollfd is plain data (a descriptor number and flags).
unsafe impl Send for Sleep {}

impl Sleep {
    /// A sleep woken by any of `fds` becoming readable; with none (a
    /// transport must be polled), it only yields the processor.
    pub(crate) fn on(fds: Vec<libc::pollfd>) -> Sleep {
        Sleep { fds }
    }

    /// Sleeps until a transport's descriptor is readable or `timeout`
    /// passes; only yields the processor if some transport must be polled.
    pub fn wait(&mut self, timeout: Duration) -> Result<()> {
        if self.fds.is_empty() {
            std::thread::yield_now();
            return Ok(());
        }
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: `fds` is a valid, initialized array of `fds.len()` pollfd
        // structures that outlives the call.
        let rc = unsafe { libc::poll(self.fds.as_mut_ptr(), self.fds.len() as libc::nfds_t, ms) };
        if rc < 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() != std::io::ErrorKind::Interrupted {
                return Err(Error::os("waiting for network activity (poll)", err));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(poll_for: Duration, crowded: bool) -> WaitPolicy {
        WaitPolicy { poll_for, crowded }
    }

    /// The steps of `polls` fruitless polls of one wait.
    fn steps(policy: &WaitPolicy, polls: usize) -> Vec<IdleStep> {
        let mut idle = Idle::new();
        (0..polls).map(|_| policy.step(&mut idle)).collect()
    }

    #[test]
    fn a_wait_with_a_core_spins_and_a_crowded_one_yields_until_the_poll_time() {
        let long = Duration::from_secs(3600);
        assert!(steps(&policy(long, false), 100)
            .iter()
            .all(|&s| s == IdleStep::Spin));
        assert!(steps(&policy(long, true), 100)
            .iter()
            .all(|&s| s == IdleStep::Yield));
    }

    #[test]
    fn past_the_poll_time_every_fruitless_poll_sleeps() {
        for crowded in [false, true] {
            let mut idle = Idle::new();
            let policy = policy(Duration::from_micros(200), crowded);
            // The clock starts at the first check, CLOCK_EVERY polls in.
            for _ in 0..CLOCK_EVERY {
                assert_ne!(policy.step(&mut idle), IdleStep::Sleep);
            }
            std::thread::sleep(Duration::from_millis(1));
            let after: Vec<IdleStep> = (0..CLOCK_EVERY).map(|_| policy.step(&mut idle)).collect();
            assert_eq!(after.last(), Some(&IdleStep::Sleep), "crowded {crowded}");
            assert_eq!(policy.step(&mut idle), IdleStep::Sleep, "crowded {crowded}");
        }
    }

    #[test]
    fn no_poll_time_sleeps_at_the_first_clock_check() {
        let steps = steps(&policy(Duration::ZERO, true), CLOCK_EVERY as usize);
        assert_eq!(steps[CLOCK_EVERY as usize - 2], IdleStep::Yield);
        assert_eq!(steps[CLOCK_EVERY as usize - 1], IdleStep::Sleep);
    }
}
