//! The soft NIC's registered memory: the key tables of a protection domain,
//! and every access the soft provider makes to registered memory. This is
//! the only module of the soft provider that touches raw memory.
//!
//! Every access names a range by (address, length, key) and is checked,
//! under the table's read lock, to lie inside the registration the key
//! names and to be allowed by its rights; it is done while that lock is
//! held. Deregistration ([`MrTable::remove`]) takes the write lock, so once
//! it returns no access to the region is in progress or can start: the
//! keys are revoked, and the owner may free the memory.

use crate::provider::{AccessFlags, RemoteAddr, Sge, WcStatus};
use oxmpi_adi::{Error, ErrorClass, Result};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{RwLock, RwLockReadGuard};

/// One registration.
#[derive(Clone, Copy, Debug)]
struct Region {
    addr: u64,
    len: u64,
    access: AccessFlags,
}

impl Region {
    /// Whether `[addr, addr + len)` lies inside the region.
    fn covers(&self, addr: u64, len: u64) -> bool {
        match (addr.checked_add(len), self.addr.checked_add(self.len)) {
            (Some(end), Some(region_end)) => addr >= self.addr && end <= region_end,
            _ => false,
        }
    }
}

#[derive(Default)]
struct Keys {
    /// Registrations by local key.
    by_lkey: HashMap<u32, Region>,
    /// Local key of each remote key.
    lkey_of_rkey: HashMap<u32, u32>,
}

/// An 8-byte atomic a peer asks for.
#[derive(Clone, Copy, Debug)]
pub(super) enum Atomic {
    /// Wrapping fetch-and-add.
    FetchAdd(u64),
    /// Compare-and-swap: (compare, swap).
    CompareSwap(u64, u64),
}

/// The registrations of one protection domain.
#[derive(Default)]
pub(super) struct MrTable {
    keys: RwLock<Keys>,
}

impl MrTable {
    fn read(&self) -> RwLockReadGuard<'_, Keys> {
        // A poisoned lock means a thread panicked while holding it; the
        // tables themselves are always consistent (each update is a single
        // insert or remove), so go on.
        self.keys.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers `len` bytes at `addr`; returns (lkey, rkey), distinct,
    /// nonzero and unpredictable.
    ///
    /// # Safety
    /// As [`crate::provider::Nic::register`]: the memory stays valid until
    /// [`MrTable::remove`] is called with the returned lkey.
    pub(super) unsafe fn insert(
        &self,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<(u32, u32)> {
        access.check_for_mr()?;
        let region = Region {
            addr: addr as u64,
            len: len as u64,
            access,
        };
        if region.addr.checked_add(region.len).is_none() {
            return Err(Error::new(
                ErrorClass::Arg,
                "memory registration wraps around the address space",
            ));
        }
        let mut keys = self.keys.write().unwrap_or_else(|e| e.into_inner());
        let taken = |keys: &Keys, k: u32| {
            k == 0 || keys.by_lkey.contains_key(&k) || keys.lkey_of_rkey.contains_key(&k)
        };
        let (lkey, rkey) = loop {
            let mut raw = [0u8; 8];
            getrandom::getrandom(&mut raw).map_err(|e| {
                Error::new(
                    ErrorClass::Other,
                    format!("no random memory keys from the OS: {e}"),
                )
            })?;
            let l = u32::from_le_bytes([raw[0], raw[1], raw[2], raw[3]]);
            let r = u32::from_le_bytes([raw[4], raw[5], raw[6], raw[7]]);
            if l != r && !taken(&keys, l) && !taken(&keys, r) {
                break (l, r);
            }
        };
        keys.by_lkey.insert(lkey, region);
        keys.lkey_of_rkey.insert(rkey, lkey);
        Ok((lkey, rkey))
    }

    /// Deregisters the region of `lkey`: waits for accesses in progress and
    /// revokes both its keys.
    pub(super) fn remove(&self, lkey: u32) {
        let mut keys = self.keys.write().unwrap_or_else(|e| e.into_inner());
        keys.by_lkey.remove(&lkey);
        keys.lkey_of_rkey.retain(|_, l| *l != lkey);
    }

    /// Copies out the bytes of a local SGE (the data of a SEND or RDMA
    /// WRITE). LOC_PROT_ERR when the SGE is not inside its registration.
    pub(super) fn local_read(&self, sge: &Sge) -> std::result::Result<Vec<u8>, WcStatus> {
        let keys = self.read();
        if sge.length == 0 {
            return Ok(Vec::new());
        }
        match keys.by_lkey.get(&sge.lkey) {
            Some(r) if r.covers(sge.addr, sge.length.into()) => {
                // SAFETY: the range lies inside a live registration (checked
                // just above, under the read lock that deregistration must
                // wait for), whose memory its registrant keeps valid.
                Ok(unsafe { copy_out(sge.addr, sge.length as usize) })
            }
            _ => Err(WcStatus::LocProtErr),
        }
    }

    /// Checks that `data_len` bytes may be written to a local SGE: the SGE is
    /// inside a registration with LOCAL_WRITE (else LOC_PROT_ERR) and at
    /// least `data_len` long (else LOC_LEN_ERR).
    pub(super) fn check_local_write(
        &self,
        sge: &Sge,
        data_len: usize,
    ) -> std::result::Result<(), WcStatus> {
        let keys = self.read();
        check_local(&keys, sge, data_len)
    }

    /// Writes `data` at the start of a local SGE (a received message, an
    /// RDMA READ's data, an atomic's original value), after the checks of
    /// [`MrTable::check_local_write`].
    pub(super) fn local_write(&self, sge: &Sge, data: &[u8]) -> std::result::Result<(), WcStatus> {
        let keys = self.read();
        check_local(&keys, sge, data.len())?;
        // SAFETY: `check_local` verified, under the read lock held until
        // the copy is done, that `data.len()` bytes at `sge.addr` lie in a
        // live registration with LOCAL_WRITE, which the registrant keeps
        // valid and writable.
        unsafe { copy_in(sge.addr, data) };
        Ok(())
    }

    /// Looks up a remote range for an operation that needs `right`:
    /// REM_ACCESS_ERR for an unknown rkey, a range outside the region, or
    /// a missing right.
    fn remote_region(
        keys: &Keys,
        remote: &RemoteAddr,
        len: u64,
        right: AccessFlags,
    ) -> std::result::Result<(), WcStatus> {
        let region = keys
            .lkey_of_rkey
            .get(&remote.rkey)
            .and_then(|l| keys.by_lkey.get(l));
        match region {
            Some(r) if r.access.contains(right) && r.covers(remote.addr, len) => Ok(()),
            _ => Err(WcStatus::RemAccessErr),
        }
    }

    /// Executes a peer's RDMA WRITE.
    pub(super) fn remote_write(
        &self,
        remote: &RemoteAddr,
        data: &[u8],
    ) -> std::result::Result<(), WcStatus> {
        if data.is_empty() {
            return Ok(());
        }
        let keys = self.read();
        Self::remote_region(&keys, remote, data.len() as u64, AccessFlags::REMOTE_WRITE)?;
        // SAFETY: the range lies in a live registration with REMOTE_WRITE
        // (which implies LOCAL_WRITE, so the memory is writable), checked
        // under the read lock held until the copy is done.
        unsafe { copy_in(remote.addr, data) };
        Ok(())
    }

    /// Executes a peer's RDMA READ of `len` bytes.
    pub(super) fn remote_read(
        &self,
        remote: &RemoteAddr,
        len: u32,
    ) -> std::result::Result<Vec<u8>, WcStatus> {
        if len == 0 {
            return Ok(Vec::new());
        }
        let keys = self.read();
        Self::remote_region(&keys, remote, len.into(), AccessFlags::REMOTE_READ)?;
        // A registration with remote reads may outlive its memory (the
        // transport's registration cache keeps idle ones, as hardware
        // keeps their pages pinned): the copy is checked by the kernel, so
        // a range no longer mapped is a remote access error, not a fault.
        read_checked(remote.addr, len as usize)
    }

    /// Executes a peer's 8-byte atomic with a real atomic instruction on the
    /// target word; returns its original value. REM_INV_REQ_ERR for a word
    /// that is not 8-byte aligned.
    pub(super) fn remote_atomic(
        &self,
        remote: &RemoteAddr,
        op: Atomic,
    ) -> std::result::Result<u64, WcStatus> {
        let keys = self.read();
        Self::remote_region(&keys, remote, 8, AccessFlags::REMOTE_ATOMIC)?;
        if remote.addr & 7 != 0 {
            return Err(WcStatus::RemInvReqErr);
        }
        // SAFETY: the 8 bytes lie in a live registration with REMOTE_ATOMIC
        // (which implies LOCAL_WRITE), checked under the read lock held
        // until the operation is done, and the address is 8-byte aligned as
        // `AtomicU64` requires. Every access the soft NIC makes to the word
        // for atomics is atomic; the registrant agreed that remote work may
        // touch it.
        let word = unsafe { AtomicU64::from_ptr(remote.addr as *mut u64) };
        Ok(match op {
            Atomic::FetchAdd(add) => word.fetch_add(add, Ordering::SeqCst),
            Atomic::CompareSwap(compare, swap) => {
                match word.compare_exchange(compare, swap, Ordering::SeqCst, Ordering::SeqCst) {
                    Ok(v) | Err(v) => v,
                }
            }
        })
    }
}

fn check_local(keys: &Keys, sge: &Sge, data_len: usize) -> std::result::Result<(), WcStatus> {
    if data_len > sge.length as usize {
        return Err(WcStatus::LocLenErr);
    }
    if data_len == 0 {
        return Ok(());
    }
    match keys.by_lkey.get(&sge.lkey) {
        Some(r)
            if r.access.contains(AccessFlags::LOCAL_WRITE)
                && r.covers(sge.addr, sge.length.into()) =>
        {
            Ok(())
        }
        _ => Err(WcStatus::LocProtErr),
    }
}

/// Copies `len` bytes from `addr`.
///
/// # Safety
/// `addr..addr + len` must be valid for reads for the duration of the call.
unsafe fn copy_out(addr: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    // SAFETY: the caller guarantees the source is valid for `len` bytes;
    // `out` is a fresh allocation of `len` bytes, so they cannot overlap.
    unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, out.as_mut_ptr(), len) };
    out
}

/// Whether the kernel lets this process read its own memory through
/// `process_vm_readv` (a seccomp filter may forbid the call).
static CHECKED_READS: AtomicBool = AtomicBool::new(true);

/// Copies `len` bytes from `addr` of this process's memory, through the
/// kernel: REM_ACCESS_ERR where some of it is not mapped. Where the kernel
/// refuses the call, a plain copy of the range, which the registrant keeps
/// mapped while its registration is live.
fn read_checked(addr: u64, len: usize) -> std::result::Result<Vec<u8>, WcStatus> {
    if CHECKED_READS.load(Ordering::Relaxed) {
        let mut out = vec![0u8; len];
        let local = libc::iovec {
            iov_base: out.as_mut_ptr().cast(),
            iov_len: len,
        };
        let remote = libc::iovec {
            iov_base: addr as *mut libc::c_void,
            iov_len: len,
        };
        // SAFETY: `local` is `out`, writable for `len` bytes; the kernel
        // checks `remote` against this process's mappings and fails with
        // EFAULT rather than fault.
        let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
        if n == len as isize {
            return Ok(out);
        }
        let errno = std::io::Error::last_os_error().raw_os_error();
        if n >= 0 || errno == Some(libc::EFAULT) {
            return Err(WcStatus::RemAccessErr);
        }
        CHECKED_READS.store(false, Ordering::Relaxed);
    }
    // SAFETY: the range lies in a live registration with REMOTE_READ,
    // checked by the caller under the read lock held until the copy is
    // done; the registrant keeps it mapped.
    Ok(unsafe { copy_out(addr, len) })
}

/// Copies `data` to `addr`.
///
/// # Safety
/// `addr..addr + data.len()` must be valid for writes for the duration of
/// the call and must not overlap `data`.
unsafe fn copy_in(addr: u64, data: &[u8]) {
    // SAFETY: guaranteed by the caller; `data` is a buffer of the soft NIC
    // (a frame's payload), never registered memory, so they do not overlap.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), addr as *mut u8, data.len()) };
}
