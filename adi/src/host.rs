//! The host identity: which processes can share memory.
//!
//! Two processes can use shared memory when one can hand the other a
//! memory file over an abstract Unix socket. Abstract sockets belong to a
//! network namespace of one running kernel, so the identity is the
//! kernel's boot id (`/proc/sys/kernel/random/boot_id`, new at every boot
//! of every machine) and the inode of the network namespace
//! (`/proc/self/ns/net`). Two processes on one machine in two network
//! namespaces have different identities, as two machines do.
//!
//! This is the one definition of "one host": the shared-memory transport
//! puts it in its business card and binds a VC to shared memory only
//! between equal identities, and the MPI layer's
//! `split_shared` (`MPI_COMM_TYPE_SHARED`) groups ranks by it, so the two
//! always agree.

use sha2::{Digest, Sha256};
use std::io;

/// The host identity of a process: see the module docs.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct HostId {
    /// The kernel's boot id, a UUID.
    boot: String,
    /// Inode of the network namespace.
    netns: u64,
}

impl HostId {
    /// The identity of this process, from /proc.
    pub fn current() -> io::Result<HostId> {
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")?;
        let link = std::fs::read_link("/proc/self/ns/net")?;
        let netns = link
            .to_str()
            .and_then(|s| s.strip_prefix("net:["))
            .and_then(|s| s.strip_suffix(']'))
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("unexpected /proc/self/ns/net link {link:?}"),
                )
            })?;
        HostId::from_parts(boot.trim(), netns).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("unexpected boot id {boot:?}"),
            )
        })
    }

    /// The identity with boot id `boot` and network namespace `netns`, as
    /// another process published them; `None` if `boot` is empty or holds
    /// a `:` (the separator of the forms it travels in).
    pub fn from_parts(boot: &str, netns: u64) -> Option<HostId> {
        (!boot.is_empty() && !boot.contains(':')).then(|| HostId {
            boot: boot.to_owned(),
            netns,
        })
    }

    /// The kernel's boot id.
    pub fn boot(&self) -> &str {
        &self.boot
    }

    /// The inode of the network namespace.
    pub fn netns(&self) -> u64 {
        self.netns
    }

    /// A fixed-size digest of the identity (SHA-256 of `boot:netns`), for
    /// comparing identities by exchanging equal-sized values: equal
    /// identities have equal keys, and different ones (in practice) not.
    pub fn key(&self) -> [u8; 32] {
        Sha256::digest(format!("{}:{}", self.boot, self.netns)).into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_host_has_an_identity_with_a_stable_key() {
        let host = HostId::current().expect("host identity");
        assert_eq!(host, HostId::current().unwrap());
        assert_eq!(host.key(), HostId::current().unwrap().key());
        let other = HostId::from_parts(host.boot(), host.netns() + 1).unwrap();
        assert_ne!(host.key(), other.key());
    }

    #[test]
    fn malformed_parts_are_refused() {
        assert_eq!(HostId::from_parts("", 1), None);
        assert_eq!(HostId::from_parts("a:b", 1), None);
        assert!(HostId::from_parts("boot", 1).is_some());
    }
}
