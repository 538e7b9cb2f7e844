//! The soft NIC's OS calls that std does not wrap: the credentials of the
//! process at the other end of a Unix socket, and writes that never raise
//! SIGPIPE (`MSG_NOSIGNAL`: a peer that went away is an `EPIPE` error, never
//! a signal that would end a process whose program did not ignore it).

use std::os::fd::AsRawFd;
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
