//! A peer's window in its own memory (`MPI_Win_create` on user memory),
//! reached with cross-memory attach: the origin copies into and out of the
//! target process itself (`process_vm_writev`/`process_vm_readv`, the
//! wrappers of [`crate::sys`] that long messages use too), so the target's
//! CPU does nothing.
//!
//! The peer advertises a range (base address and size); every copy is
//! checked against it first, so nothing outside it is ever touched, even
//! where the peer's process maps more memory. The process id must be the
//! kernel's record of the peer (as the transport learns it, `SO_PEERCRED`),
//! or one the caller trusts as much. Hardware atomics cannot reach memory
//! of another process: accumulates to such a window go under the region
//! mutexes of the target's control area, or an exclusive lock.

use super::{check_range, AccessError};
use crate::sys;

/// A range another process of the host advertised as its window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteWindow {
    pid: libc::pid_t,
    base: u64,
    size: u64,
}

impl RemoteWindow {
    /// The `size` bytes at `base` in process `pid`; `None` if the range
    /// wraps around the address space or the process id is out of range.
    pub fn new(pid: u32, base: u64, size: u64) -> Option<RemoteWindow> {
        base.checked_add(size)?;
        Some(RemoteWindow {
            pid: libc::pid_t::try_from(pid).ok().filter(|&p| p > 0)?,
            base,
            size,
        })
    }

    /// The window's size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Copies the window's bytes at `offset` into `out`.
    pub fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), AccessError> {
        check_range(offset, out.len() as u64, self.size)?;
        sys::read_remote(self.pid, self.base + offset, out).map_err(AccessError::Copy)
    }

    /// Copies `data` into the window at `offset`.
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<(), AccessError> {
        check_range(offset, data.len() as u64, self.size)?;
        sys::write_remote(self.pid, data, self.base + offset).map_err(AccessError::Copy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::region::SharedRegion;
    use crate::sys::forked;
    use std::sync::atomic::Ordering::SeqCst;
    use std::time::Duration;

    /// A child process advertises the middle of a buffer (its own copy,
    /// after the fork): the parent reads and writes it there, nothing
    /// outside the range changes, and the parent's own copy is untouched.
    #[test]
    fn copies_reach_the_peer_within_its_range_only() {
        let buffer: Vec<u8> = (0..64u8).collect();
        let (flags, _) = SharedRegion::create(64, c"oxmpi-test").unwrap();
        let (ready, done) = (flags.word(0).unwrap(), flags.word(8).unwrap());
        let child = forked::spawn(|| {
            ready.store(1, SeqCst);
            while done.load(SeqCst) == 0 {
                std::hint::spin_loop();
            }
            // The parent wrote 100..108 into bytes 16..24 and nothing else.
            let expected = |i: usize| {
                if (16..24).contains(&i) {
                    100 + i as u8 - 16
                } else {
                    i as u8
                }
            };
            // SAFETY: reads of this process's own copy of the buffer,
            // which no one else references now.
            let mine = unsafe { std::slice::from_raw_parts(buffer.as_ptr(), 64) };
            i32::from(!mine.iter().enumerate().all(|(i, &b)| b == expected(i)))
        });
        while ready.load(SeqCst) == 0 {
            std::thread::yield_now();
        }
        let window = RemoteWindow::new(child as u32, buffer.as_ptr() as u64 + 16, 32).unwrap();
        let mut out = [0u8; 8];
        window.read(24, &mut out).unwrap();
        assert_eq!(out, [40, 41, 42, 43, 44, 45, 46, 47]);
        window
            .write(0, &[100, 101, 102, 103, 104, 105, 106, 107])
            .unwrap();
        // Past the end of the range, or wrapping: refused before any copy.
        assert!(matches!(
            window.write(25, &[0; 8]),
            Err(AccessError::OutOfRange {
                offset: 25,
                len: 8,
                size: 32
            })
        ));
        assert!(window.read(u64::MAX, &mut out).is_err());
        assert!(RemoteWindow::new(child as u32, u64::MAX - 4, 8).is_none());
        done.store(1, SeqCst);
        assert_eq!(
            forked::reap(&[child], Duration::from_secs(20)),
            vec![Some(0)]
        );
        assert_eq!(buffer, (0..64u8).collect::<Vec<_>>());
    }
}
