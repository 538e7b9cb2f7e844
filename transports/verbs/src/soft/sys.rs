//! The soft NIC's one OS call that std does not wrap: the credentials of the
//! process at the other end of a Unix socket.

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
