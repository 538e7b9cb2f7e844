//! The soft NIC's OS calls that std does not wrap: the credentials of the
//! process at the other end of a Unix socket, and writes that never raise
//! SIGPIPE (`MSG_NOSIGNAL`: a peer that went away is an `EPIPE` error, never
//! a signal that would end a process whose program did not ignore it), and
//! the event counter behind a completion channel (`eventfd`).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;

/// The effective user id of the process that connected `stream`
/// (`SO_PEERCRED`), or the OS error.
pub(super) fn peer_uid(stream: &UnixStream) -> std::io::Result<u32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid for writes, `len` holds the size of
    // `cred`, and the descriptor is open for the duration of the call.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc == 0 {
        Ok(cred.uid)
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// This process's effective user id.
pub(super) fn own_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Writes all of `bytes` to `stream` (blocking), with `MSG_NOSIGNAL`.
pub(super) fn send_all(stream: &UnixStream, mut bytes: &[u8]) -> std::io::Result<()> {
    while !bytes.is_empty() {
        // SAFETY: `bytes` is valid for reads of its length, and the
        // descriptor is open for the duration of the call.
        let n = unsafe {
            libc::send(
                stream.as_raw_fd(),
                bytes.as_ptr().cast(),
                bytes.len(),
                libc::MSG_NOSIGNAL,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        bytes = &bytes[n as usize..];
    }
    Ok(())
}

/// A non-blocking event counter (`eventfd`): readable while non-zero.
pub(super) fn event_counter() -> std::io::Result<OwnedFd> {
    // SAFETY: eventfd takes no pointers; a non-negative result is a new
    // descriptor that nothing else owns.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor owned by no one else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Adds one to the counter `fd` (it becomes readable). A counter at its
/// maximum stays readable, which is all a signal needs.
pub(super) fn signal(fd: &OwnedFd) {
    let one = 1u64.to_ne_bytes();
    // SAFETY: `one` is valid for reads of 8 bytes, and the descriptor is
    // open for the duration of the call.
    unsafe { libc::write(fd.as_raw_fd(), one.as_ptr().cast(), one.len()) };
}

/// Takes the counter `fd` back to zero; returns what it held.
pub(super) fn take_count(fd: &OwnedFd) -> u64 {
    let mut count = [0u8; 8];
    // SAFETY: `count` is valid for writes of 8 bytes, and the descriptor is
    // open for the duration of the call. A non-blocking read of a zero
    // counter fails with EAGAIN and writes nothing.
    let n = unsafe { libc::read(fd.as_raw_fd(), count.as_mut_ptr().cast(), count.len()) };
    if n == 8 {
        u64::from_ne_bytes(count)
    } else {
        0
    }
}
