//! Which mapping of this process holds an address, from the kernel's
//! `PROCMAP_QUERY` ioctl on `/proc/self/maps` (Linux 6.11): about a
//! microsecond, where reading the maps file's text costs tens. The
//! registration cache ([`crate::regcache`]) validates each hit with it.
//! This is the only FFI of the module: one ioctl on a descriptor it owns.

use std::fs::File;
use std::os::fd::AsRawFd;

/// `struct procmap_query` of `<linux/fs.h>`.
#[repr(C)]
#[derive(Default)]
struct ProcmapQuery {
    size: u64,
    query_flags: u64,
    query_addr: u64,
    vma_start: u64,
    vma_end: u64,
    vma_flags: u64,
    vma_page_size: u64,
    vma_offset: u64,
    inode: u64,
    dev_major: u32,
    dev_minor: u32,
    vma_name_size: u32,
    build_id_size: u32,
    vma_name_addr: u64,
    build_id_addr: u64,
}

/// `PROCMAP_QUERY`: `_IOWR('f', 17, struct procmap_query)`.
const PROCMAP_QUERY: u64 =
    (3 << 30) | ((size_of::<ProcmapQuery>() as u64) << 16) | (0x66 << 8) | 17;

/// One mapping (VMA) of the process, as the kernel reports it: what a
/// cached registration compares to know its memory is still the same
/// mapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mapping {
    /// First address.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
    /// Readable, writable, executable, shared (`PROCMAP_QUERY_VMA_*`).
    pub flags: u64,
    /// Offset in the mapped file (0 for anonymous memory).
    pub offset: u64,
    /// The mapped file's inode and device (0 for anonymous memory).
    pub inode: u64,
    /// Device of the mapped file: (major, minor).
    pub dev: (u32, u32),
}

/// An open `/proc/self/maps` to query.
pub struct Maps {
    file: File,
}

impl Maps {
    /// Opens `/proc/self/maps` and checks that the kernel answers
    /// `PROCMAP_QUERY`; `None` where it does not (older kernels).
    pub fn open() -> Option<Maps> {
        let maps = Maps {
            file: File::open("/proc/self/maps").ok()?,
        };
        let probe = 0u8;
        maps.mapping_at(&probe as *const u8 as u64)?;
        Some(maps)
    }

    /// The mapping that holds `addr`, or `None` when none does (or the
    /// query fails).
    pub fn mapping_at(&self, addr: u64) -> Option<Mapping> {
        let mut q = ProcmapQuery {
            size: size_of::<ProcmapQuery>() as u64,
            query_addr: addr,
            ..ProcmapQuery::default()
        };
        // SAFETY: the descriptor is this object's open /proc/self/maps;
        // the argument is a `struct procmap_query` of the size it
        // announces, with no name or build-id buffer (sizes 0), which the
        // kernel only fills in.
        let rc = unsafe {
            libc::ioctl(
                self.file.as_raw_fd(),
                PROCMAP_QUERY as _,
                &mut q as *mut ProcmapQuery,
            )
        };
        (rc == 0).then_some(Mapping {
            start: q.vma_start,
            end: q.vma_end,
            flags: q.vma_flags,
            offset: q.vma_offset,
            inode: q.inode,
            dev: (q.dev_major, q.dev_minor),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fresh_mapping_is_found_and_an_unmapped_address_is_not() {
        let Some(maps) = Maps::open() else {
            eprintln!("PROCMAP_QUERY unavailable: nothing to check");
            return;
        };
        let len = 1 << 20;
        // SAFETY: a fresh anonymous mapping, unmapped below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        let m = maps.mapping_at(p as u64 + 100).expect("mapped");
        assert!(m.start <= p as u64 && m.end >= p as u64 + len as u64);
        assert_eq!(m.inode, 0);
        // SAFETY: the mapping made above, not used after.
        assert_eq!(unsafe { libc::munmap(p, len) }, 0);
        let after = maps.mapping_at(p as u64 + 100);
        assert!(after.is_none_or(|a| a != m), "{after:?}");
    }
}
