//! The hand-over of a shared region's memory file from the process that
//! made it to the others of its host, by the mechanism the queues use: the
//! descriptor travels with `SCM_RIGHTS` over an abstract-namespace Unix
//! socket ([`crate::sys`]).
//!
//! Neither side needs rights over the other process: no ptrace access (as
//! `pidfd_getfd` or `/proc/PID/fd` would, which Yama's `ptrace_scope=1`
//! refuses between sibling processes, and which ranks of different users
//! never have), no shared user (an abstract socket has no file
//! permissions), no file in any file system.
//!
//! A process has one hand-over server for every region it offers
//! ([`Offer`]): a socket named after the process and a serial number, and
//! the memory files offered, each under its token (8 random bytes). A
//! [`Ticket`] is the process, the serial and the token. A connection that
//! sends the token of a file still offered is answered with one byte and
//! the descriptor, then closed; one that sends anything else is closed
//! without an answer. The token travels only in the job's own messages,
//! inside the region's name, while the socket's name is public
//! (`/proc/net/unix`): a process that did not get the name cannot take
//! the memory. Abstract sockets belong to a network namespace, so a region
//! is handed only within one, as queues are.
//!
//! Whichever thread of the process looks first answers ([`serve`]): the
//! shared-memory transport's poll (the server's poller is in the
//! transport's epoll set, so a rank asleep in the kernel wakes for a
//! caller too), a process waiting in [`fetch`] for another's region (so
//! two processes that fetch each other's regions answer each other), and
//! a thread of the server's own. A region's maker waits in a collective
//! call, polling its transports, while the others fetch the region: it
//! answers at once on its own core, where a thread woken for the caller
//! would wait for that core, held by its rank spinning (0.6 ms at the
//! median and 2 ms at the mean per region on a loaded 2-core machine,
//! each window and communicator paying it). The thread answers where no
//! one polls (a process without the shared-memory transport, or a maker
//! outside MPI calls). It starts with the process's first offer and is
//! kept, with the socket, for the process's life: blocked in the kernel
//! it costs a stack, where starting and joining one per region cost every
//! window a thread's start and end; and a caller for a region no longer
//! offered is then told at once (the connection closed without it).

use crate::sys::{self, Epoll};
use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// What a process must send to the maker's socket to be handed the
/// region: the socket is the maker's `pid` and `serial`, the proof is
/// `token`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ticket {
    pub pid: u32,
    pub serial: u32,
    pub token: u64,
}

/// The abstract socket name of the hand-over server `serial` of process
/// `pid`.
fn socket_name(pid: u32, serial: u32) -> Vec<u8> {
    format!("oxmpi-region-{pid}-{serial}").into_bytes()
}

/// Epoll token of the server's listener; a caller's is its number.
const LISTENER: u64 = u64::MAX;

/// This process's server, from its first offer on.
static SERVER: Mutex<Option<Server>> = Mutex::new(None);
/// The server's poller: ready while a caller, or a caller's bytes, wait.
/// Made once, as the shared-memory transports watch it from their start.
static POLLER: OnceLock<Epoll> = OnceLock::new();

/// The poller that is ready while a caller of this process's hand-over
/// server waits to be answered by [`serve`]: to watch beside one's own
/// descriptors.
pub(crate) fn poller() -> io::Result<BorrowedFd<'static>> {
    if POLLER.get().is_none() {
        let made = Epoll::new()?;
        // Another thread may have made one meanwhile: theirs is kept.
        let _ = POLLER.set(made);
    }
    Ok(POLLER.get().expect("set above").as_fd())
}

fn server() -> MutexGuard<'static, Option<Server>> {
    // A poisoned lock only means a panic elsewhere; the registry stays
    // whole (every change to it is one insert or remove).
    SERVER
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A memory file offered to every process that shows its ticket, until
/// dropped.
#[derive(Debug)]
pub(crate) struct Offer {
    token: u64,
}

impl Offer {
    /// Offers `file` (the server keeps its own descriptor of it), starting
    /// the process's server with its first offer; returns the offer and
    /// the ticket to publish.
    pub(crate) fn start(file: &File) -> io::Result<(Offer, Ticket)> {
        let file = file.try_clone()?;
        let mut guard = server();
        if guard.is_none() {
            *guard = Some(Server::start()?);
        }
        let server = guard.as_mut().expect("started above");
        let token = loop {
            let mut bytes = [0u8; 8];
            sys::random_bytes(&mut bytes)?;
            let token = u64::from_ne_bytes(bytes);
            if !server.offers.contains_key(&token) {
                break token;
            }
        };
        server.offers.insert(token, file);
        let ticket = Ticket {
            pid: std::process::id(),
            serial: server.serial,
            token,
        };
        Ok((Offer { token }, ticket))
    }
}

impl Drop for Offer {
    fn drop(&mut self) {
        if let Some(server) = server().as_mut() {
            server.offers.remove(&self.token);
        }
    }
}

/// The process's hand-over server: see the module docs.
struct Server {
    listener: UnixListener,
    serial: u32,
    /// The memory files offered, by token.
    offers: HashMap<u64, File>,
    /// Connections whose token has not fully arrived, and the bytes of it
    /// that have.
    callers: HashMap<u64, (UnixStream, Vec<u8>)>,
    next_caller: u64,
}

impl Server {
    /// Listens, and starts the thread that answers where no one polls.
    fn start() -> io::Result<Server> {
        poller()?;
        let poller = POLLER.get().expect("made by poller()");
        let pid = std::process::id();
        // A name taken already (by a stranger: this process has one
        // server) is skipped.
        let mut serial = 0u32;
        let listener = loop {
            match sys::listen_abstract(&socket_name(pid, serial)) {
                Ok(listener) => break listener,
                Err(e) if e.kind() == io::ErrorKind::AddrInUse && serial < u32::MAX => serial += 1,
                Err(e) => return Err(e),
            }
        };
        poller.add(listener.as_fd(), LISTENER)?;
        std::thread::Builder::new()
            .name("oxmpi-handover".to_owned())
            .spawn(move || answer_for_ever(poller))?;
        Ok(Server {
            listener,
            serial,
            offers: HashMap::new(),
            callers: HashMap::new(),
            next_caller: 0,
        })
    }

    fn accept_all(&mut self, poller: &Epoll) {
        while let Ok((stream, _)) = self.listener.accept() {
            let caller = self.next_caller;
            self.next_caller += 1;
            if stream.set_nonblocking(true).is_ok() && poller.add(stream.as_fd(), caller).is_ok() {
                self.callers.insert(caller, (stream, Vec::new()));
            }
        }
    }

    /// Reads what `caller` sent; hands it the file whose token it sent,
    /// once the whole token arrived, if that file is offered; closes its
    /// connection once it is done, wrong, or gone.
    fn answer(&mut self, poller: &Epoll, caller: u64) {
        let Some((stream, got)) = self.callers.get_mut(&caller) else {
            return;
        };
        let mut buf = [0u8; 8];
        let want = buf.len() - got.len();
        let done = match sys::recv(stream, &mut buf[..want], &mut Vec::new()) {
            Ok(0) => true,
            Ok(n) => {
                got.extend_from_slice(&buf[..n]);
                if let Ok(token) = <[u8; 8]>::try_from(&got[..]) {
                    if let Some(file) = self.offers.get(&u64::from_ne_bytes(token)) {
                        let _ = sys::send(stream, &[1], Some(file.as_fd()));
                    }
                    true
                } else {
                    false
                }
            }
            Err(e) => e.kind() != io::ErrorKind::WouldBlock,
        };
        if done {
            if let Some((stream, _)) = self.callers.remove(&caller) {
                let _ = poller.remove(stream.as_fd());
            }
        }
    }
}

/// The server's thread: answers whenever a caller waits, for the
/// process's life.
fn answer_for_ever(poller: &Epoll) {
    let mut ready = Vec::new();
    loop {
        if let Err(e) = poller.wait(&mut ready, None) {
            oxmpi_adi::vlog!("shm: the hand-over of shared regions stopped: {e}");
            return;
        }
        serve();
    }
}

/// Answers every caller of this process's hand-over server that waits:
/// accepts the new ones and reads what the others sent, handing each its
/// file once its token is whole. Does nothing where the process offered
/// nothing yet; never blocks but for another thread answering.
pub(crate) fn serve() {
    let Some(poller) = POLLER.get() else {
        return;
    };
    let mut guard = server();
    let Some(server) = guard.as_mut() else {
        return;
    };
    let mut ready = Vec::new();
    if let Err(e) = poller.ready_now(&mut ready) {
        oxmpi_adi::vlog!("shm: cannot look for hand-over callers: {e}");
        return;
    }
    for token in ready {
        match token {
            LISTENER => server.accept_all(poller),
            caller => server.answer(poller, caller),
        }
    }
}

/// Epoll tokens of [`fetch`]'s wait: the connection to the maker, and
/// this process's own server's poller.
const MAKER: u64 = 0;
const OWN_CALLERS: u64 = 1;

/// The memory file the process of `ticket` hands over, taken within
/// `within`: an error if it no longer hands it over (`ConnectionRefused`,
/// or the connection closed without it, as for a wrong token), or does
/// not answer in time (`TimedOut`). While it waits it answers this
/// process's own callers ([`serve`]).
pub(crate) fn fetch(ticket: &Ticket, within: Duration) -> io::Result<File> {
    let deadline = Instant::now() + within;
    let timed_out = || {
        io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "process {} did not hand its region over within {within:?}",
                ticket.pid
            ),
        )
    };
    let name = socket_name(ticket.pid, ticket.serial);
    let stream: UnixStream = loop {
        // A full backlog clears as the maker accepts.
        let connected = sys::connect_abstract(&name).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "cannot reach the hand-over socket of process {} ({e}): it no longer \
                     hands the region over, or is in another network namespace",
                    ticket.pid
                ),
            )
        })?;
        match connected {
            Some(stream) => break stream,
            None if Instant::now() < deadline => {
                serve();
                std::thread::sleep(Duration::from_millis(1));
            }
            None => return Err(timed_out()),
        }
    };
    let token = ticket.token.to_ne_bytes();
    // A fresh connection's buffer always takes 8 bytes.
    if sys::send(&stream, &token, None)? != token.len() {
        return Err(io::Error::new(
            io::ErrorKind::WriteZero,
            "the hand-over socket did not take the token",
        ));
    }
    let epoll = Epoll::new()?;
    epoll.add(stream.as_fd(), MAKER)?;
    if let Some(own) = POLLER.get() {
        epoll.add(own.as_fd(), OWN_CALLERS)?;
    }
    let (mut ready, mut fds) = (Vec::new(), Vec::new());
    loop {
        match sys::recv(&stream, &mut [0u8; 1], &mut fds) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::ConnectionAborted,
                    format!(
                        "process {} closed the hand-over of its region without it",
                        ticket.pid
                    ),
                ))
            }
            Ok(_) => {
                return match (fds.pop(), fds.is_empty()) {
                    (Some(fd), true) => Ok(File::from(fd)),
                    _ => Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "the hand-over did not carry exactly one descriptor",
                    )),
                };
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(timed_out());
        }
        epoll.wait(&mut ready, Some(left))?;
        if ready.contains(&OWN_CALLERS) {
            serve();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wrong_token_gets_nothing_and_the_right_one_the_file() {
        let file = sys::memfd(c"oxmpi-test").unwrap();
        file.set_len(4096).unwrap();
        let (offer, ticket) = Offer::start(&file).unwrap();
        let wrong = Ticket {
            token: !ticket.token,
            ..ticket
        };
        let refused = fetch(&wrong, Duration::from_secs(20)).unwrap_err();
        assert_eq!(
            refused.kind(),
            io::ErrorKind::ConnectionAborted,
            "{refused}"
        );
        let taken = fetch(&ticket, Duration::from_secs(20)).unwrap();
        assert_eq!(taken.metadata().unwrap().len(), 4096);
        // Another caller is served as well.
        fetch(&ticket, Duration::from_secs(20)).unwrap();
        drop(offer);
        let gone = fetch(&ticket, Duration::from_secs(20)).unwrap_err();
        assert_eq!(gone.kind(), io::ErrorKind::ConnectionAborted, "{gone}");
    }

    #[test]
    fn one_server_and_one_thread_serve_every_offer() {
        let threads = || {
            std::fs::read_to_string("/proc/self/status")
                .unwrap()
                .lines()
                .find_map(|l| l.strip_prefix("Threads:"))
                .unwrap()
                .trim()
                .parse::<usize>()
                .unwrap()
        };
        let file = sys::memfd(c"oxmpi-test").unwrap();
        // The server's thread, if this is the first offer of the test
        // process.
        let first = Offer::start(&file).unwrap();
        let before = threads();
        let offers: Vec<(Offer, Ticket)> = (0..200).map(|_| Offer::start(&file).unwrap()).collect();
        // Other tests of this process run threads of their own meanwhile:
        // 200 offers with a thread each would show far above that.
        assert!(threads() < before + 50, "{} threads", threads());
        for (_, ticket) in &offers {
            assert_eq!(ticket.serial, offers[0].1.serial);
            assert_eq!(ticket.pid, std::process::id());
        }
        let (_, last) = offers.last().unwrap();
        fetch(last, Duration::from_secs(20)).unwrap();
        drop(offers);
        drop(first);
        assert!(threads() < before + 50, "{} threads", threads());
    }
}
