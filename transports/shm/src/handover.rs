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
//! The maker's [`Server`] listens on a socket named after its process
//! and a serial number, and runs a thread that answers each connection
//! that sends the region's [`Ticket`] token (8 random bytes) with one byte
//! and the descriptor, until the server stops. The token travels only in
//! the job's own messages, inside the region's name, while the socket's
//! name is public (`/proc/net/unix`): a process that did not get the name
//! cannot take the memory. A connection that sends anything else is
//! closed without an answer. Abstract sockets belong to a network
//! namespace, so a region is handed only within one, as queues are.

use crate::sys::{self, Epoll, EventFd};
use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread::JoinHandle;
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

/// The abstract socket name of the hand-over `serial` of process `pid`.
fn socket_name(pid: u32, serial: u32) -> Vec<u8> {
    format!("oxmpi-region-{pid}-{serial}").into_bytes()
}

/// Serial numbers of this process's hand-overs.
static SERIALS: AtomicU32 = AtomicU32::new(0);

/// Epoll tokens of the server's thread; a connection's is its number.
const LISTENER: u64 = u64::MAX;
const STOP: u64 = u64::MAX - 1;

/// A thread that hands a memory file to every process that shows its
/// ticket, until dropped.
pub(crate) struct Server {
    stop: EventFd,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    /// Starts handing over `file` (the server keeps its own descriptor of
    /// it), and returns the server and the ticket to publish.
    pub(crate) fn start(file: &File) -> io::Result<(Server, Ticket)> {
        let mut token = [0u8; 8];
        sys::random_bytes(&mut token)?;
        let pid = std::process::id();
        // A name taken already (by a stranger: this process numbers its
        // own) is skipped.
        let (listener, serial) = loop {
            let serial = SERIALS.fetch_add(1, Ordering::Relaxed);
            match sys::listen_abstract(&socket_name(pid, serial)) {
                Ok(listener) => break (listener, serial),
                Err(e) if e.kind() == io::ErrorKind::AddrInUse => {}
                Err(e) => return Err(e),
            }
        };
        let ticket = Ticket {
            pid,
            serial,
            token: u64::from_ne_bytes(token),
        };
        let stop = EventFd::new()?;
        let epoll = Epoll::new()?;
        epoll.add(listener.as_fd(), LISTENER)?;
        epoll.add(stop.as_fd(), STOP)?;
        let served = Served {
            file: file.try_clone()?,
            token: ticket.token,
            listener,
            epoll,
            callers: HashMap::new(),
            next_caller: 0,
        };
        let thread = std::thread::Builder::new()
            .name("oxmpi-region".to_owned())
            .spawn(move || served.run())?;
        let server = Server {
            stop,
            thread: Some(thread),
        };
        Ok((server, ticket))
    }
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("thread", &self.thread)
            .finish_non_exhaustive()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // If the signal fails, the thread is left to end with the process
        // rather than joined forever.
        if self.stop.signal().is_ok() {
            if let Some(thread) = self.thread.take() {
                let _ = thread.join();
            }
        }
    }
}

/// The state of a server's thread.
struct Served {
    file: File,
    token: u64,
    listener: UnixListener,
    epoll: Epoll,
    /// Connections whose token has not fully arrived, and the bytes of it
    /// that have.
    callers: HashMap<u64, (UnixStream, Vec<u8>)>,
    next_caller: u64,
}

impl Served {
    fn run(mut self) {
        let mut ready = Vec::new();
        loop {
            if let Err(e) = self.epoll.wait(&mut ready, None) {
                oxmpi_adi::vlog!("shm: a shared region's hand-over stopped: {e}");
                return;
            }
            for &token in &ready {
                match token {
                    STOP => return,
                    LISTENER => self.accept_all(),
                    caller => self.serve(caller),
                }
            }
        }
    }

    fn accept_all(&mut self) {
        while let Ok((stream, _)) = self.listener.accept() {
            let caller = self.next_caller;
            self.next_caller += 1;
            if stream.set_nonblocking(true).is_ok()
                && self.epoll.add(stream.as_fd(), caller).is_ok()
            {
                self.callers.insert(caller, (stream, Vec::new()));
            }
        }
    }

    /// Reads what `caller` sent; hands it the file once its whole token
    /// arrived and is right, and closes its connection once it is done,
    /// wrong, or gone.
    fn serve(&mut self, caller: u64) {
        let Some((stream, got)) = self.callers.get_mut(&caller) else {
            return;
        };
        let mut buf = [0u8; 8];
        let want = buf.len() - got.len();
        let done = match sys::recv(stream, &mut buf[..want], &mut Vec::new()) {
            Ok(0) => true,
            Ok(n) => {
                got.extend_from_slice(&buf[..n]);
                if got.len() == buf.len() {
                    if got[..] == self.token.to_ne_bytes() {
                        let _ = sys::send(stream, &[1], Some(self.file.as_fd()));
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
                let _ = self.epoll.remove(stream.as_fd());
            }
        }
    }
}

/// The memory file the process of `ticket` hands over, taken within
/// `within`: an error if it no longer hands it over (`ConnectionRefused`,
/// or the connection closed without it, as for a wrong token), or does
/// not answer in time (`TimedOut`).
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
        // A full backlog clears as the maker's thread accepts.
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
            None if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(1)),
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
    epoll.add(stream.as_fd(), 0)?;
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wrong_token_gets_nothing_and_the_right_one_the_file() {
        let file = sys::memfd(c"oxmpi-test").unwrap();
        file.set_len(4096).unwrap();
        let (server, ticket) = Server::start(&file).unwrap();
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
        drop(server);
        let gone = fetch(&ticket, Duration::from_secs(20)).unwrap_err();
        assert_eq!(gone.kind(), io::ErrorKind::ConnectionRefused, "{gone}");
    }
}
