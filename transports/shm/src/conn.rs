//! The connections between a rank and its peers: each hands one queue
//! over (from the rank that opened it to the one that accepted it) with
//! the job-secret handshake and a set-up message, then carries only
//! one-byte wake-ups, and its end tells that the peer is gone.

use crate::sys;
use oxmpi_adi::auth::{Acceptor, Connector};
use oxmpi_adi::transport::PeerRank;
use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;

/// Most handshake bytes a connection may hold unread: a stranger cannot
/// make a rank buffer more.
const INBOX_MAX: usize = 4096;

/// Where a connection's handshake stands, on the side that opened it (to
/// hand the peer our queue to it).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum OutStep {
    AwaitChallenge,
    AwaitVerdict,
    Ready,
}

/// Where a connection's handshake stands, on the side that accepted it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum InStep {
    AwaitHello,
    /// The connector claims to be `peer`; not proven yet.
    AwaitResponse {
        peer: PeerRank,
    },
    /// `peer` proved the secret; its set-up message is due.
    AwaitSetup {
        peer: PeerRank,
    },
    Ready {
        peer: PeerRank,
    },
}

/// Which end of a connection this rank is, and where its handshake
/// stands.
pub(crate) enum Role {
    /// This rank opened it, to hand `peer` its queue to it.
    Out {
        peer: PeerRank,
        step: OutStep,
        connector: Connector,
    },
    /// Someone opened it (a peer, once it proves the secret) to hand this
    /// rank a queue.
    In { step: InStep, acceptor: Acceptor },
}

/// A connection between this rank and a peer: it carries the handshake,
/// the set-up, then only one-byte wake-ups; its end tells that the peer is
/// gone.
pub(crate) struct Conn {
    pub stream: UnixStream,
    /// Handshake bytes received and not yet used.
    pub inbox: Vec<u8>,
    /// Descriptors received and not yet used.
    pub fds: Vec<OwnedFd>,
    pub role: Role,
}

impl Conn {
    pub(crate) fn handshaking(&self) -> bool {
        !matches!(
            self.role,
            Role::Out {
                step: OutStep::Ready,
                ..
            } | Role::In {
                step: InStep::Ready { .. },
                ..
            }
        )
    }

    /// Reads everything waiting: handshake bytes into the inbox, wake-up
    /// bytes of a set-up connection nowhere. Returns whether the stream
    /// ended.
    pub(crate) fn read_available(&mut self) -> io::Result<bool> {
        let mut buf = [0u8; 512];
        loop {
            match sys::recv(&self.stream, &mut buf, &mut self.fds) {
                Ok(0) => return Ok(true),
                Ok(n) if self.handshaking() => {
                    self.inbox.extend_from_slice(&buf[..n]);
                    if self.inbox.len() > INBOX_MAX {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            "too many bytes before the handshake ended",
                        ));
                    }
                }
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) => return Err(e),
            }
        }
    }

    /// Wakes the peer: one byte on the connection. A full socket already
    /// holds a wake-up, and a closed one is the peer's failure, which epoll
    /// reports: neither is an error here.
    pub(crate) fn poke(&self) {
        let _ = sys::send(&self.stream, &[1], None);
    }
}

/// The next `N` handshake bytes of `inbox`, if they all arrived.
pub(crate) fn take_message<const N: usize>(inbox: &mut Vec<u8>) -> Option<[u8; N]> {
    let msg: [u8; N] = inbox.get(..N)?.try_into().ok()?;
    inbox.drain(..N);
    Some(msg)
}

/// Writes a whole handshake message (a fresh connection's buffer always
/// takes it), with `fd` attached if given.
pub(crate) fn write_message(
    stream: &UnixStream,
    msg: &[u8],
    fd: Option<BorrowedFd<'_>>,
) -> io::Result<()> {
    if sys::send(stream, msg, fd)? != msg.len() {
        return Err(io::Error::new(
            io::ErrorKind::WriteZero,
            "the socket did not take a whole handshake message",
        ));
    }
    Ok(())
}
