//! The operating-system calls of the shared-memory transport, behind safe
//! wrappers: anonymous memory files (`memfd_create`) and their seals, the
//! mapping of a segment, the faulting in of its pages
//! (`MADV_POPULATE_WRITE`) and the freeing of some (`fallocate`),
//! abstract-namespace Unix sockets and the passing of a descriptor over
//! one (`SCM_RIGHTS`) and the process at their other end
//! (`SO_PEERCRED`), epoll, an eventfd, the NUMA memory policy of pages of
//! a mapping (`mbind`, and `get_mempolicy` to read it back), the page
//! size, cross-memory attach (`process_vm_readv`/`process_vm_writev`), memory
//! barriers on other processes' threads (`membarrier`), and the size of
//! the CPU's caches (`sysconf`). Nothing outside this module
//! calls `libc` or maps memory.
//!
//! # What the safe layer relies on
//! - Every descriptor handed out is owned ([`OwnedFd`], [`File`],
//!   [`UnixStream`], [`UnixListener`]) and close-on-exec: dropping it closes
//!   it, and a program the rank starts does not inherit it. Descriptors that
//!   arrive over a socket are owned as soon as they arrive, so a peer that
//!   sends more than expected cannot leak them into the process.
//! - Failed calls become [`io::Error`]s from `errno` in one place, [`cvt`].
//! - [`map`] maps only a file whose size is sealed against shrinking
//!   (`F_SEAL_SHRINK`), so the mapping stays backed by memory whatever the
//!   process at the other end does: a peer cannot make an access to it
//!   fault (SIGBUS).
//! - Memory another process maps as well is never turned into Rust
//!   references to plain data: callers reach it through raw pointers (byte
//!   copies) and atomics only, and check every value they read from it
//!   before relying on it.
//! - Cross-memory attach copies between a local slice and an address in
//!   another process: the kernel checks the remote side (a bad address is
//!   `EFAULT`, never a fault in this process), so the wrappers are safe.
//! - Writes to sockets use `MSG_NOSIGNAL`: a peer that went away is an
//!   `EPIPE` error, never a SIGPIPE that would end the rank.

use crate::numa::PagePolicy;
use memmap2::MmapMut;
use std::ffi::CStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicU8, Ordering};

/// `errno` as an error when a call returned a negative value.
fn cvt<T: Copy + PartialOrd + Default>(rc: T) -> io::Result<T> {
    if rc < T::default() {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// Fills `buf` with random bytes from the kernel (`getrandom`).
pub(crate) fn random_bytes(buf: &mut [u8]) -> io::Result<()> {
    let mut filled = 0;
    while filled < buf.len() {
        let rest = &mut buf[filled..];
        // SAFETY: `rest` is valid for writes of `rest.len()` bytes.
        match cvt(unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) }) {
            Ok(n) => filled += n as usize,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// A new anonymous memory file (`memfd_create`), empty, close-on-exec and
/// open to seals. It has no name in any file system: it lives exactly as
/// long as a descriptor or a mapping of it does. `name` only labels it in
/// `/proc/PID/maps`.
pub(crate) fn memfd(name: &CStr) -> io::Result<File> {
    // SAFETY: `name` is a valid NUL-terminated string for the call.
    let fd = cvt(unsafe {
        libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
    })?;
    // SAFETY: `fd` was just returned by the kernel and is owned by no one
    // else.
    Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// The seals that fix a segment's size forever: it cannot shrink (which
/// would make the peer's accesses fault), grow, or lose these seals.
const SIZE_SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;

/// Seals the size of a memory file made by [`memfd`].
pub(crate) fn seal_size(file: &File) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor we own, with an integer argument.
    cvt(unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, SIZE_SEALS) })?;
    Ok(())
}

/// Whether `file` is a memory file whose size can no longer shrink.
pub(crate) fn size_is_sealed(file: &File) -> io::Result<bool> {
    // SAFETY: fcntl on a descriptor we own, without an argument.
    let seals = cvt(unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GET_SEALS) })?;
    Ok(seals & libc::F_SEAL_SHRINK != 0)
}

/// Maps the whole of `file`, shared and writable. Refuses a file whose size
/// is not sealed against shrinking (see the module docs).
pub(crate) fn map(file: &File) -> io::Result<MmapMut> {
    map_with(file, &memmap2::MmapOptions::new())
}

/// Faults every page of `map` in now, as for a write
/// (`MADV_POPULATE_WRITE`, Linux 5.14; where the kernel does not know it,
/// [`touch_every_page`]): for a queue, whose every page is written and
/// read on its first lap anyway, so that the first messages do not each
/// pay a page fault. A memory file's pages not allocated yet are
/// allocated here, under the file's policy (module `numa`); the contents
/// are left as they are.
pub(crate) fn populate(map: &MmapMut) -> io::Result<()> {
    match map.advise(memmap2::Advice::PopulateWrite) {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            touch_every_page(map);
            Ok(())
        }
        other => other,
    }
}

/// [`populate`] for kernels before 5.14, which refuse
/// `MADV_POPULATE_WRITE` (`EINVAL`): one load from each page of `map`,
/// which maps it, and allocates a memory file's page not allocated yet
/// (under the file's policy, like the advice). The contents are left as
/// they are.
pub(crate) fn touch_every_page(map: &MmapMut) {
    for offset in (0..map.len()).step_by(page_size()) {
        // SAFETY: `offset` is inside the mapping, which lives for the
        // borrow; the byte is loaded atomically, as the peer may be
        // writing it, and the value is not used.
        unsafe { AtomicU8::from_ptr(map.as_ptr().add(offset).cast_mut()) }.load(Ordering::Relaxed);
    }
}

/// Frees bytes `pages` (whole pages) of memory file `file`
/// (`fallocate` with `FALLOC_FL_PUNCH_HOLE`, the size kept): the kernel
/// takes the pages out of every process's mapping of the file, and the
/// next access to one, by any process, allocates a new zeroed page
/// there, under the file's policy for it. The contents are lost: the
/// caller saves what it needs first, and no other process may use those
/// bytes meanwhile.
pub(crate) fn release_pages(file: &File, pages: std::ops::Range<usize>) -> io::Result<()> {
    let bad = || io::Error::new(io::ErrorKind::InvalidInput, "pages out of range");
    let start = libc::off_t::try_from(pages.start).map_err(|_| bad())?;
    let len = libc::off_t::try_from(pages.len()).map_err(|_| bad())?;
    // SAFETY: fallocate on a descriptor we own, with integer arguments; it
    // changes the file's contents, which the mappings only ever reach
    // through raw pointers and atomics (see the module docs).
    cvt(unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            start,
            len,
        )
    })?;
    Ok(())
}

/// Which pages of `map` the memory file behind it holds (`mincore`; for a
/// memory file, whether the page is allocated, whoever touched it): to
/// see in tests who allocated a segment's pages, and when.
#[cfg(test)]
pub(crate) fn resident_pages(map: &MmapMut) -> io::Result<Vec<bool>> {
    let mut pages = vec![0u8; map.len().div_ceil(page_size())];
    // SAFETY: the mapping is page-aligned and `map.len()` bytes long, and
    // `pages` holds one byte for each of its pages, as mincore writes.
    cvt(unsafe {
        libc::mincore(
            map.as_ptr().cast_mut().cast(),
            map.len(),
            pages.as_mut_ptr(),
        )
    })?;
    Ok(pages.iter().map(|p| p & 1 != 0).collect())
}

fn map_with(file: &File, options: &memmap2::MmapOptions) -> io::Result<MmapMut> {
    if !size_is_sealed(file)? {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "the segment's size is not sealed (F_SEAL_SHRINK)",
        ));
    }
    // SAFETY: memmap2 asks that the file not be truncated or changed
    // behind the mapping in ways that break Rust's assumptions. The size is
    // sealed (checked above), so every page stays backed; the contents may
    // change under us (the peer writes them), which is why the mapping is
    // only ever read and written through raw pointers and atomics, never
    // through references to plain data (see the module docs).
    unsafe { options.map_mut(file) }
}

/// The size of a page of memory (`sysconf(_SC_PAGESIZE)`): what a
/// memory policy is set for; 4096 where the C library does not say.
pub(crate) fn page_size() -> usize {
    // SAFETY: sysconf only reads a system parameter.
    let bytes = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(bytes)
        .ok()
        .filter(|&b| b > 0)
        .unwrap_or(4096)
}

/// Binds bytes `pages` of `map` (whole pages: the start a multiple of
/// [`page_size`], the end too or the mapping's last page's end) to the
/// NUMA `nodes` (`mbind` with `MPOL_BIND`): pages not yet allocated will
/// be, on those nodes. For a memory file the policy is the file's, for
/// that range of it, so it holds for every process that maps it. Pages
/// allocated already stay where they are.
pub(crate) fn bind_memory(
    map: &MmapMut,
    pages: std::ops::Range<usize>,
    nodes: &[u32],
) -> io::Result<()> {
    let page = page_size();
    if !pages.start.is_multiple_of(page) || pages.end > map.len().next_multiple_of(page) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "the pages to bind are not whole pages of the mapping",
        ));
    }
    if pages.is_empty() {
        return Ok(());
    }
    let mask = NodeMask::of(nodes);
    // SAFETY: the range is whole pages of a live mapping (checked above;
    // a mapping covers whole pages, its last one past its length too),
    // and the mask is valid for reads of `maxnode - 1` bits for the call;
    // mbind changes no memory contents.
    cvt(unsafe {
        libc::syscall(
            libc::SYS_mbind,
            map.as_ptr().add(pages.start),
            pages.len(),
            libc::MPOL_BIND,
            mask.words.as_ptr(),
            mask.maxnode(),
            0,
        )
    })?;
    Ok(())
}

/// `get_mempolicy`'s flag: the policy of the page at an address.
const MPOL_F_ADDR: libc::c_ulong = 1 << 1;

/// The memory policy the kernel records for the page at `addr` of this
/// process (`get_mempolicy` with `MPOL_F_ADDR`). `EFAULT` where no
/// mapping holds `addr`.
pub(crate) fn memory_policy_at(addr: *const u8) -> io::Result<PagePolicy> {
    let mut mask = NodeMask::of(&[MAX_NODES - 1]);
    let mut mode: libc::c_int = 0;
    // SAFETY: `mode` is a writable int and the mask is valid for writes
    // of `maxnode - 1` bits for the call; the kernel only looks `addr`
    // up among this process's mappings (EFAULT where none holds it),
    // reading and writing no memory there.
    cvt(unsafe {
        libc::syscall(
            libc::SYS_get_mempolicy,
            &raw mut mode,
            mask.words.as_mut_ptr(),
            mask.maxnode(),
            addr,
            MPOL_F_ADDR,
        )
    })?;
    Ok(match mode {
        libc::MPOL_DEFAULT => PagePolicy::Default,
        libc::MPOL_BIND => PagePolicy::Bind(mask.nodes()),
        mode => PagePolicy::Other {
            mode,
            nodes: mask.nodes(),
        },
    })
}

/// NUMA nodes numbered below this can be named in a mask: a bound far
/// beyond any machine's (Linux's `MAX_NUMNODES` is at most 1024).
const MAX_NODES: u32 = 1 << 12;

/// A set of NUMA nodes in the kernel's format: a bit per node, in words.
struct NodeMask {
    words: Vec<libc::c_ulong>,
}

impl NodeMask {
    /// The mask of `nodes`, as long as the highest needs (at least one
    /// word).
    fn of(nodes: &[u32]) -> NodeMask {
        let bits = libc::c_ulong::BITS;
        let highest = nodes.iter().copied().max().unwrap_or(0);
        let mut words: Vec<libc::c_ulong> = vec![0; (highest / bits + 1) as usize];
        for &node in nodes {
            words[(node / bits) as usize] |= 1 << (node % bits);
        }
        NodeMask { words }
    }

    /// The `maxnode` argument for this mask: the kernel reads or writes
    /// `maxnode - 1` bits.
    fn maxnode(&self) -> libc::c_ulong {
        self.words.len() as libc::c_ulong * libc::c_ulong::from(libc::c_ulong::BITS) + 1
    }

    /// The nodes whose bits are set.
    fn nodes(&self) -> Vec<u32> {
        let bits = libc::c_ulong::BITS;
        (0..self.words.len() as u32 * bits)
            .filter(|&n| self.words[(n / bits) as usize] & (1 << (n % bits)) != 0)
            .collect()
    }
}

/// Listens on the abstract Unix socket `name` (no file: it disappears with
/// its last descriptor), non-blocking.
pub(crate) fn listen_abstract(name: &[u8]) -> io::Result<UnixListener> {
    let listener = UnixListener::bind_addr(&SocketAddr::from_abstract_name(name)?)?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// Connects a non-blocking stream socket to the abstract Unix socket
/// `name`. `Ok(None)` when the listener's backlog is full (`EAGAIN`): try
/// again later.
pub(crate) fn connect_abstract(name: &[u8]) -> io::Result<Option<UnixStream>> {
    // SAFETY: an all-zero sockaddr_un is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    // The first byte of `sun_path` stays 0: the abstract namespace.
    if name.len() + 1 > addr.sun_path.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "abstract socket name too long",
        ));
    }
    for (dst, &src) in addr.sun_path[1..].iter_mut().zip(name) {
        *dst = src as libc::c_char;
    }
    let len = std::mem::offset_of!(libc::sockaddr_un, sun_path) + 1 + name.len();
    // SAFETY: plain socket creation.
    let fd = cvt(unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    })?;
    // SAFETY: `fd` was just returned by the kernel and is owned by no one
    // else.
    let stream = UnixStream::from(unsafe { OwnedFd::from_raw_fd(fd) });
    // SAFETY: `addr` is a valid sockaddr_un and `len` does not exceed its
    // size.
    let rc = unsafe {
        libc::connect(
            stream.as_raw_fd(),
            (&raw const addr).cast(),
            len as libc::socklen_t,
        )
    };
    match cvt(rc) {
        Ok(_) => Ok(Some(stream)),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
        Err(e) => Err(e),
    }
}

/// Room for the control message of one received batch: a few
/// descriptors, more than any honest peer sends at once.
#[repr(C, align(8))]
struct ControlBuffer([u8; 64]);

/// Writes `bytes` to `stream` without blocking, with `fd` attached
/// (`SCM_RIGHTS`) if given. Returns how many bytes were taken (the
/// descriptor travels with the first of them).
pub(crate) fn send(
    stream: &UnixStream,
    bytes: &[u8],
    fd: Option<BorrowedFd<'_>>,
) -> io::Result<usize> {
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    let mut control = ControlBuffer([0; 64]);
    // SAFETY: an all-zero msghdr is a valid value (no name, no data).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if let Some(fd) = fd {
        let raw: RawFd = fd.as_raw_fd();
        // SAFETY: CMSG_SPACE is a pure size computation.
        let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
        msg.msg_control = control.0.as_mut_ptr().cast();
        msg.msg_controllen = space;
        // SAFETY: `msg` names `control`, which is aligned and large enough
        // for one header and one descriptor (`space` bytes), so the first
        // header and its data lie inside it.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as usize;
            std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>(), raw);
        }
    }
    loop {
        // SAFETY: `msg` points at `iov` (valid for reads of `bytes`) and at
        // `control`, all alive for the call.
        let rc = unsafe {
            libc::sendmsg(
                stream.as_raw_fd(),
                &msg,
                libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
            )
        };
        match cvt(rc) {
            Ok(n) => return Ok(n as usize),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Reads what `stream` holds into `buf` without blocking; descriptors that
/// came with the bytes are appended to `fds`. `Ok(0)` is the end of the
/// stream; nothing waiting is an error of kind `WouldBlock`. A batch with
/// more descriptors than fit the control buffer is an error (the kernel
/// has closed the excess).
pub(crate) fn recv(
    stream: &UnixStream,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
) -> io::Result<usize> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut control = ControlBuffer([0; 64]);
    // SAFETY: an all-zero msghdr is a valid value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.0.as_mut_ptr().cast();
    msg.msg_controllen = control.0.len();
    let n = loop {
        // SAFETY: `msg` points at `iov` (valid for writes of `buf`) and at
        // `control`, both alive for the call.
        let rc = unsafe {
            libc::recvmsg(
                stream.as_raw_fd(),
                &mut msg,
                libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC,
            )
        };
        match cvt(rc) {
            Ok(n) => break n as usize,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    };
    // SAFETY: the kernel filled `msg_controllen` bytes of `control` with
    // well-formed control headers; CMSG_FIRSTHDR/NXTHDR stay inside them,
    // and each SCM_RIGHTS header's data holds the descriptors the kernel
    // just installed in this process, owned by no one else.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg);
                let header = data.offset_from(cmsg.cast::<u8>()) as usize;
                let count = ((*cmsg).cmsg_len as usize - header) / std::mem::size_of::<RawFd>();
                for i in 0..count {
                    let fd = std::ptr::read_unaligned(data.cast::<RawFd>().add(i));
                    fds.push(OwnedFd::from_raw_fd(fd));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "the peer sent more descriptors than expected",
        ));
    }
    Ok(n)
}

/// A kernel event poller (epoll), level-triggered, watching for input.
pub(crate) struct Epoll {
    fd: OwnedFd,
}

impl Epoll {
    /// A new, empty poller.
    pub(crate) fn new() -> io::Result<Epoll> {
        // SAFETY: plain descriptor creation.
        let fd = cvt(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
        // SAFETY: `fd` was just returned by the kernel and is owned by no
        // one else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Epoll { fd })
    }

    /// Watches `fd` for input (data, end of stream, or an error), reported
    /// as `token`.
    pub(crate) fn add(&self, fd: BorrowedFd<'_>, token: u64) -> io::Result<()> {
        let mut event = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: token,
        };
        // SAFETY: both descriptors are open; `event` is valid for the call.
        cvt(unsafe {
            libc::epoll_ctl(
                self.fd.as_raw_fd(),
                libc::EPOLL_CTL_ADD,
                fd.as_raw_fd(),
                &mut event,
            )
        })?;
        Ok(())
    }

    /// Stops watching `fd`.
    pub(crate) fn remove(&self, fd: BorrowedFd<'_>) -> io::Result<()> {
        // SAFETY: both descriptors are open; a null event is allowed for
        // EPOLL_CTL_DEL.
        cvt(unsafe {
            libc::epoll_ctl(
                self.fd.as_raw_fd(),
                libc::EPOLL_CTL_DEL,
                fd.as_raw_fd(),
                std::ptr::null_mut(),
            )
        })?;
        Ok(())
    }

    /// The tokens of the descriptors ready now, without waiting, into
    /// `ready` (cleared first).
    pub(crate) fn ready_now(&self, ready: &mut Vec<u64>) -> io::Result<()> {
        self.wait(ready, Some(std::time::Duration::ZERO))
    }

    /// The tokens of the descriptors ready, into `ready` (cleared first),
    /// once one is or `timeout` has passed (never, for `None`); a signal
    /// ends the wait early with none.
    pub(crate) fn wait(
        &self,
        ready: &mut Vec<u64>,
        timeout: Option<std::time::Duration>,
    ) -> io::Result<()> {
        const BATCH: usize = 64;
        let timeout_ms = timeout.map_or(-1, |t| {
            libc::c_int::try_from(t.as_millis()).unwrap_or(libc::c_int::MAX)
        });
        // SAFETY: epoll_event is plain data; all zeroes is a valid value.
        let mut events: [libc::epoll_event; BATCH] = unsafe { std::mem::zeroed() };
        ready.clear();
        // SAFETY: `events` is valid for writes of BATCH entries.
        let rc = unsafe {
            libc::epoll_wait(
                self.fd.as_raw_fd(),
                events.as_mut_ptr(),
                BATCH as libc::c_int,
                timeout_ms,
            )
        };
        match cvt(rc) {
            Ok(n) => {
                ready.extend(events[..n as usize].iter().map(|e| e.u64));
                Ok(())
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(()),
            Err(e) => Err(e),
        }
    }
}

impl AsFd for Epoll {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl AsRawFd for Epoll {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// An eventfd: a descriptor a process makes readable for itself.
pub(crate) struct EventFd {
    fd: OwnedFd,
}

impl EventFd {
    /// A new eventfd, not readable, non-blocking.
    pub(crate) fn new() -> io::Result<EventFd> {
        // SAFETY: plain descriptor creation.
        let fd = cvt(unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) })?;
        // SAFETY: `fd` was just returned by the kernel and is owned by no
        // one else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(EventFd { fd })
    }

    /// Makes the descriptor readable.
    pub(crate) fn signal(&self) -> io::Result<()> {
        let one: u64 = 1;
        // SAFETY: writes the 8 bytes of `one`, valid for the call.
        let rc = unsafe { libc::write(self.fd.as_raw_fd(), (&raw const one).cast(), 8) };
        match cvt(rc) {
            // A full counter is readable already.
            Err(e) if e.kind() != io::ErrorKind::WouldBlock => Err(e),
            _ => Ok(()),
        }
    }

    /// Makes the descriptor unreadable again.
    pub(crate) fn clear(&self) -> io::Result<()> {
        let mut count: u64 = 0;
        // SAFETY: reads at most 8 bytes into `count`, valid for the call.
        let rc = unsafe { libc::read(self.fd.as_raw_fd(), (&raw mut count).cast(), 8) };
        match cvt(rc) {
            // Not signalled: nothing to clear.
            Err(e) if e.kind() != io::ErrorKind::WouldBlock => Err(e),
            _ => Ok(()),
        }
    }
}

impl AsFd for EventFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Registers this process for [`barrier_everywhere`] (`membarrier`'s
/// `MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED`): from now on, a barrier
/// another registered process asks for also runs on this process's
/// threads. An error where the kernel has no such barrier or refuses it
/// (`ENOSYS`, `EINVAL`, or `EPERM` under a seccomp policy).
pub(crate) fn register_for_barriers() -> io::Result<()> {
    // SAFETY: `membarrier` takes no pointers; these commands only change
    // which barriers the kernel runs on this process.
    let supported = cvt(unsafe {
        libc::syscall(
            libc::SYS_membarrier,
            libc::MEMBARRIER_CMD_QUERY,
            0 as libc::c_uint,
        )
    })?;
    let wanted = (libc::MEMBARRIER_CMD_GLOBAL_EXPEDITED
        | libc::MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED) as libc::c_long;
    if supported & wanted != wanted {
        return Err(io::ErrorKind::Unsupported.into());
    }
    // SAFETY: as above.
    cvt(unsafe {
        libc::syscall(
            libc::SYS_membarrier,
            libc::MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED,
            0 as libc::c_uint,
        )
    })?;
    Ok(())
}

/// A full memory barrier on every thread, now running, of every process
/// registered with [`register_for_barriers`], this one included
/// (`MEMBARRIER_CMD_GLOBAL_EXPEDITED`); a thread not running passes one
/// when it is scheduled again. So a registered process's plain store
/// followed by a load (with only a compiler fence between them) orders
/// against this caller's store before the call and load after it, as if
/// both sides had fenced.
pub(crate) fn barrier_everywhere() -> io::Result<()> {
    // SAFETY: `membarrier` takes no pointers; the command only runs
    // barriers.
    cvt(unsafe {
        libc::syscall(
            libc::SYS_membarrier,
            libc::MEMBARRIER_CMD_GLOBAL_EXPEDITED,
            0 as libc::c_uint,
        )
    })?;
    Ok(())
}

/// The process id of the process at the other end of `stream`, as the
/// kernel recorded it at `connect` or `listen` (`SO_PEERCRED`): not a
/// claim of the peer's.
pub(crate) fn peer_pid(stream: &UnixStream) -> io::Result<libc::pid_t> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` is a writable ucred and `len` its size, both alive
    // for the call.
    cvt(unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    })?;
    Ok(cred.pid)
}

/// Copies `local.len()` bytes from address `remote` of process `pid` into
/// `local` (`process_vm_readv`), in as many calls as the kernel needs. A
/// call that copies nothing is `EFAULT`.
pub(crate) fn read_remote(pid: libc::pid_t, remote: u64, local: &mut [u8]) -> io::Result<()> {
    let mut done = 0;
    while done < local.len() {
        let rest = &mut local[done..];
        let mine = libc::iovec {
            iov_base: rest.as_mut_ptr().cast(),
            iov_len: rest.len(),
        };
        let theirs = libc::iovec {
            iov_base: remote.wrapping_add(done as u64) as *mut libc::c_void,
            iov_len: rest.len(),
        };
        // SAFETY: `mine` describes `rest`, valid for writes for the call;
        // the kernel checks `theirs` against the other process's memory.
        let n = cvt(unsafe { libc::process_vm_readv(pid, &mine, 1, &theirs, 1, 0) })?;
        if n == 0 {
            return Err(io::Error::from_raw_os_error(libc::EFAULT));
        }
        done += n as usize;
    }
    Ok(())
}

/// Copies `local` to address `remote` of process `pid`
/// (`process_vm_writev`), in as many calls as the kernel needs. A call
/// that copies nothing is `EFAULT`.
pub(crate) fn write_remote(pid: libc::pid_t, local: &[u8], remote: u64) -> io::Result<()> {
    let mut done = 0;
    while done < local.len() {
        let rest = &local[done..];
        let mine = libc::iovec {
            iov_base: rest.as_ptr() as *mut libc::c_void,
            iov_len: rest.len(),
        };
        let theirs = libc::iovec {
            iov_base: remote.wrapping_add(done as u64) as *mut libc::c_void,
            iov_len: rest.len(),
        };
        // SAFETY: `mine` describes `rest`, valid for reads for the call
        // (the kernel only reads it); the kernel checks `theirs` against
        // the other process's memory.
        let n = cvt(unsafe { libc::process_vm_writev(pid, &mine, 1, &theirs, 1, 0) })?;
        if n == 0 {
            return Err(io::Error::from_raw_os_error(libc::EFAULT));
        }
        done += n as usize;
    }
    Ok(())
}

/// Sleeps while `word` holds `expected` (`FUTEX_WAIT`, not private, so it
/// pairs with [`futex_wake`] from any process that maps the same memory
/// file). Returns at once if the word holds another value, on a wake-up,
/// or spuriously: callers look at the word again.
pub(crate) fn futex_wait(word: &std::sync::atomic::AtomicU32, expected: u32) {
    futex_wait_at_most(word, expected, None);
}

/// [`futex_wait`], but for at most `timeout` where one is given.
pub(crate) fn futex_wait_at_most(
    word: &std::sync::atomic::AtomicU32,
    expected: u32,
    timeout: Option<std::time::Duration>,
) {
    let timeout = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs().min(libc::time_t::MAX as u64) as libc::time_t,
        tv_nsec: libc::c_long::from(t.subsec_nanos() as i32),
    });
    let timeout_ptr = timeout
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `word` is a live, aligned 4-byte atomic for the call; the
    // kernel only reads it; `timeout_ptr` is null or points to a timespec
    // (a relative time) that outlives the call.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            timeout_ptr,
        )
    };
}

/// Wakes up to `count` processes or threads asleep in [`futex_wait`] on
/// `word`.
pub(crate) fn futex_wake(word: &std::sync::atomic::AtomicU32, count: i32) {
    // SAFETY: `word` is a live, aligned 4-byte atomic; FUTEX_WAKE does not
    // touch its memory.
    unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, count) };
}

/// The sizes of a level-1 data cache and of a level-2 cache of this
/// machine's CPUs in bytes, as the C library reports them
/// (`sysconf(_SC_LEVEL1_DCACHE_SIZE)`, `_SC_LEVEL2_CACHE_SIZE`; glibc
/// asks the CPU); `None` for one it does not know.
pub(crate) fn cache_bytes() -> (Option<usize>, Option<usize>) {
    let ask = |name| {
        // SAFETY: sysconf only reads a system parameter.
        let bytes = unsafe { libc::sysconf(name) };
        usize::try_from(bytes).ok().filter(|&b| b > 0)
    };
    (
        ask(libc::_SC_LEVEL1_DCACHE_SIZE),
        ask(libc::_SC_LEVEL2_CACHE_SIZE),
    )
}

/// Binds the calling thread to CPU `cpu` (test support: the queue's
/// timing study puts its two sides on two cores).
#[cfg(test)]
pub(crate) fn bind_thread_to_cpu(cpu: usize) -> io::Result<()> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(io::ErrorKind::InvalidInput.into());
    }
    // SAFETY: an all-zero `cpu_set_t` is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` is within the set (checked above).
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: `set` is a valid set of the size given; 0 names this thread.
    cvt(unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) })?;
    Ok(())
}

/// Test support: processes that share this process's mappings.
#[cfg(test)]
pub(crate) mod forked {
    use std::time::{Duration, Instant};

    /// Runs `child` in a forked copy of this process, which exits with the
    /// code `child` returns. The child inherits the mappings (shared ones
    /// stay shared), and must neither allocate nor panic: other threads
    /// of the test harness may hold the allocator's lock at the fork.
    pub(crate) fn spawn(child: impl FnOnce() -> i32) -> libc::pid_t {
        // SAFETY: fork has no memory arguments; the child runs only
        // `child` (which the caller keeps free of allocation) and _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed: {}", std::io::Error::last_os_error());
        if pid == 0 {
            let code = child();
            // SAFETY: ends the child without running the parent's exit
            // handlers or destructors.
            unsafe { libc::_exit(code) };
        }
        pid
    }

    /// Waits for the children `pids` until `deadline` has passed, and
    /// returns their exit codes in order; a child still running then is
    /// killed, reaped and reported as `None`, so nothing is left behind.
    pub(crate) fn reap(pids: &[libc::pid_t], within: Duration) -> Vec<Option<i32>> {
        let deadline = Instant::now() + within;
        pids.iter()
            .map(|&pid| loop {
                let mut status = 0;
                // SAFETY: waits for our own child; `status` is writable.
                let rc = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
                if rc == pid {
                    break libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
                }
                if Instant::now() > deadline {
                    // SAFETY: kills and reaps our own child.
                    unsafe {
                        libc::kill(pid, libc::SIGKILL);
                        libc::waitpid(pid, &mut status, 0);
                    }
                    break None;
                }
                std::thread::sleep(Duration::from_millis(5));
            })
            .collect()
    }
}
