//! The host identity: which processes can share memory.
//!
//! Two processes can use shared memory when one can hand the other a
//! memory file over an abstract Unix socket and each can name the other
//! to the kernel by its process id (single copies by `process_vm_readv`,
//! descriptors taken by `pidfd_getfd`). Abstract sockets belong to a
//! network namespace of one running kernel, and process ids to a PID
//! namespace, so the identity is the kernel's boot id
//! (`/proc/sys/kernel/random/boot_id`, new at every boot of every
//! machine), the inode of the network namespace (`/proc/self/ns/net`) and
//! the inode of the PID namespace (`/proc/self/ns/pid`). Two processes on
//! one machine in two network namespaces have different identities, as
//! two machines do; so have two containers that share a network namespace
//! but not a PID namespace (the containers of one Kubernetes pod), which
//! could pass memory files but not see each other's processes.
//!
//! This is the one definition of "one host": the shared-memory transport
//! puts it in its business card and binds a VC to shared memory only
//! between equal identities, and the MPI layer's
//! `split_shared` (`MPI_COMM_TYPE_SHARED`) groups ranks by it, so the two
//! always agree.
//!
//! An identity travels in cards and errors as `BOOT_ID:NETNS:PIDNS`
//! ([`fmt::Display`] and [`str::parse`]).

use sha2::{Digest, Sha256};
use std::{fmt, io, str::FromStr};

/// The host identity of a process: see the module docs.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct HostId {
    /// The kernel's boot id, a UUID.
    boot: String,
    /// Inode of the network namespace.
    netns: u64,
    /// Inode of the PID namespace.
    pidns: u64,
}

/// The inode of this process's namespace of `kind` (`net`, `pid`), from
/// the link `/proc/self/ns/KIND` (`net:[4026531840]`).
fn namespace_inode(kind: &str) -> io::Result<u64> {
    let path = format!("/proc/self/ns/{kind}");
    let link = std::fs::read_link(&path)?;
    link.to_str()
        .and_then(|s| s.strip_prefix(kind))
        .and_then(|s| s.strip_prefix(":["))
        .and_then(|s| s.strip_suffix(']'))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("unexpected {path} link {link:?}"),
            )
        })
}

impl HostId {
    /// The identity of this process, from /proc.
    pub fn current() -> io::Result<HostId> {
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")?;
        let netns = namespace_inode("net")?;
        let pidns = namespace_inode("pid")?;
        HostId::from_parts(boot.trim(), netns, pidns).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("unexpected boot id {boot:?}"),
            )
        })
    }

    /// The identity with boot id `boot`, network namespace `netns` and PID
    /// namespace `pidns`, as another process published them; `None` if
    /// `boot` is empty or holds a `:` (the separator of the forms it
    /// travels in).
    pub fn from_parts(boot: &str, netns: u64, pidns: u64) -> Option<HostId> {
        (!boot.is_empty() && !boot.contains(':')).then(|| HostId {
            boot: boot.to_owned(),
            netns,
            pidns,
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

    /// The inode of the PID namespace.
    pub fn pidns(&self) -> u64 {
        self.pidns
    }

    /// A fixed-size digest of the identity (SHA-256 of its text form), for
    /// comparing identities by exchanging equal-sized values: equal
    /// identities have equal keys, and different ones (in practice) not.
    pub fn key(&self) -> [u8; 32] {
        Sha256::digest(self.to_string()).into()
    }
}

impl fmt::Display for HostId {
    /// `BOOT_ID:NETNS:PIDNS`, the form cards carry.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.boot, self.netns, self.pidns)
    }
}

/// A text that is not `BOOT_ID:NETNS:PIDNS`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadHostId;

impl fmt::Display for BadHostId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("not a host identity BOOT_ID:NETNS:PIDNS")
    }
}

impl std::error::Error for BadHostId {}

impl FromStr for HostId {
    type Err = BadHostId;

    /// Parses the [`fmt::Display`] form.
    fn from_str(text: &str) -> Result<HostId, BadHostId> {
        let (rest, pidns) = text.rsplit_once(':').ok_or(BadHostId)?;
        let (boot, netns) = rest.rsplit_once(':').ok_or(BadHostId)?;
        HostId::from_parts(
            boot,
            netns.parse().map_err(|_| BadHostId)?,
            pidns.parse().map_err(|_| BadHostId)?,
        )
        .ok_or(BadHostId)
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
        let other_net = HostId::from_parts(host.boot(), host.netns() + 1, host.pidns()).unwrap();
        let other_pid = HostId::from_parts(host.boot(), host.netns(), host.pidns() + 1).unwrap();
        assert_ne!(host.key(), other_net.key());
        assert_ne!(host.key(), other_pid.key());
        assert_ne!(other_net.key(), other_pid.key());
    }

    #[test]
    fn the_text_form_parses_back() {
        let host = HostId::current().unwrap();
        assert_eq!(host.to_string().parse::<HostId>(), Ok(host.clone()));
        assert_eq!(
            host.to_string(),
            format!("{}:{}:{}", host.boot(), host.netns(), host.pidns())
        );
    }

    #[test]
    fn malformed_identities_are_refused() {
        assert_eq!(HostId::from_parts("", 1, 1), None);
        assert_eq!(HostId::from_parts("a:b", 1, 1), None);
        assert!(HostId::from_parts("boot", 1, 2).is_some());
        for bad in [
            "",
            "boot",
            "boot:1",
            ":1:2",
            "boot:x:2",
            "boot:1:-2",
            "a:b:1:2",
        ] {
            assert_eq!(bad.parse::<HostId>(), Err(BadHostId), "{bad:?}");
        }
    }
}
