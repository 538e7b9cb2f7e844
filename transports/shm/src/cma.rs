//! Cross-memory attach (CMA): the single copy of a long message straight
//! between the sender's and the receiver's buffers, with
//! `process_vm_readv`/`process_vm_writev` ([`crate::sys`]), for the ADI's
//! remote-copy rendezvous.
//!
//! This module owns the policy: whether copies are allowed
//! (`OXMPI_SHM_CMA`, and what the kernel answered so far), which process a
//! peer is (the kernel's record of the process at the other end of its
//! connection, `SO_PEERCRED`, never a claim of the peer's), and what an
//! error of a copy means. The kernel refusing (`EPERM`/`EACCES` under
//! ptrace restrictions such as Yama's `ptrace_scope`, `ENOSYS` without
//! the system calls) turns copies off for the rest of the run, said once
//! under `OXMPI_VERBOSE=1`: long messages then stream through the queue.
//! An address the peer named that its process does not have (`EFAULT`),
//! or a peer that is gone (`ESRCH`), fails the peer.

use oxmpi_adi::transport::PeerRank;
use oxmpi_adi::{vlog, Error, ErrorClass};
use std::io;

/// Environment variable: `0` turns cross-memory attach off (long messages
/// then go by the pipelined copy through the queue), `1` (the default)
/// uses it where the kernel allows.
pub const CMA_ENV: &str = "OXMPI_SHM_CMA";

/// Whether `OXMPI_SHM_CMA` allows cross-memory attach.
pub(crate) fn allowed_by_env() -> Result<bool, Error> {
    match std::env::var(CMA_ENV) {
        Err(_) => Ok(true),
        Ok(v) => match v.trim() {
            "1" => Ok(true),
            "0" => Ok(false),
            _ => Err(Error::new(
                ErrorClass::Arg,
                format!("{CMA_ENV}={v:?}: use 1 (copy long messages with process_vm_readv) or 0 (through the queue)"),
            )),
        },
    }
}

/// What a failed copy means.
pub(crate) enum Refusal {
    /// The kernel does not allow copies to this process's peers: turn
    /// them off, and move the data another way.
    Refused,
    /// The peer is faulty or gone: fail it with this error.
    Peer(Error),
}

/// The state of cross-memory attach in one rank.
pub(crate) struct Cma {
    enabled: bool,
    /// A copy succeeded already (the first is told under verbose).
    worked: bool,
    rank: PeerRank,
}

impl Cma {
    /// Copies as `OXMPI_SHM_CMA` says for rank `rank` (told under
    /// `OXMPI_VERBOSE=1` when it is off).
    pub(crate) fn new(rank: PeerRank, enabled: bool) -> Cma {
        if !enabled {
            vlog!("shm: rank {rank}: cross-memory attach off ({CMA_ENV}=0): long messages are copied through the queue");
        }
        Cma {
            enabled,
            worked: false,
            rank,
        }
    }

    /// Whether copies may be tried.
    pub(crate) fn enabled(&self) -> bool {
        self.enabled
    }

    /// A copy of `len` bytes with `peer` succeeded: the first is told
    /// under verbose.
    pub(crate) fn worked(&mut self, peer: PeerRank, len: usize) {
        if !self.worked {
            self.worked = true;
            vlog!(
                "shm: rank {}: long messages by single copy (cross-memory attach), first with rank {peer} ({len} bytes)",
                self.rank
            );
        }
    }

    /// Judges the error of a copy of `len` bytes at `address` in `peer`'s
    /// process; a refusal turns copies off (said once).
    pub(crate) fn judge(
        &mut self,
        peer: PeerRank,
        address: u64,
        len: usize,
        e: io::Error,
    ) -> Refusal {
        match e.raw_os_error() {
            Some(libc::EPERM | libc::EACCES | libc::ENOSYS) => {
                if self.enabled {
                    self.enabled = false;
                    let why = if e.raw_os_error() == Some(libc::ENOSYS) {
                        "the kernel lacks process_vm_readv/writev"
                    } else {
                        "ptrace restrictions (see /proc/sys/kernel/yama/ptrace_scope, or a seccomp or container policy)"
                    };
                    vlog!(
                        "shm: rank {}: cross-memory attach to rank {peer} refused ({e}: {why}): long messages are copied through the queue from now on",
                        self.rank
                    );
                }
                Refusal::Refused
            }
            Some(libc::EFAULT) => Refusal::Peer(Error::new(
                ErrorClass::ProcFailed,
                format!(
                    "rank {peer} broke the protocol: it named {len} bytes at {address:#x} for a single copy, memory its process does not have"
                ),
            )),
            Some(libc::ESRCH) => Refusal::Peer(crate::lost(peer, "its process is gone")),
            _ => Refusal::Peer(crate::lost(
                peer,
                format!("a single copy of {len} bytes at {address:#x} failed: {e}"),
            )),
        }
    }
}
