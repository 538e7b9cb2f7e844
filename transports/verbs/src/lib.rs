//! oxmpi's verbs device: the RDMA transport and the providers under it.
//!
//! This crate owns the provider interface ([`provider`]), the seam between
//! the verbs transport and the NIC, and its two providers:
//! - [`soft`] (`OXMPI_VERBS_PROVIDER=soft`): a software NIC that keeps the
//!   semantics of reliable-connected queue pairs (memory keys, bounds and
//!   access checks with remote-access-error completions, in-order delivery,
//!   RNR, 8-byte atomics) between the processes of a job on one host. Every
//!   protocol path of the transport is tested with it, on machines with no
//!   RDMA device.
//! - [`rdma_core`] (`OXMPI_VERBS_PROVIDER=rdma-core`, the default): real
//!   devices through libibverbs. Its pure logic (device, port and GID
//!   choice, queue-pair attributes for each transition, the environment
//!   variables) is always built and tested; the calls into libibverbs
//!   (discovery, and the provider itself) are behind the `rdma-core` cargo
//!   feature.
//!
//! It also owns the verbs transport ([`transport`]): the ADI's packets over
//! one RC queue pair per peer, connected on first use through requests
//! between the ranks' UD queue pairs ([`connect`] has the messages), long messages by a zero-copy rendezvous
//! (the receiver RDMA-READs the sender's registered buffer straight into
//! its own) with a registration cache that validates each hit against the
//! process's mappings ([`regcache`], [`maps`]; its module docs say why it
//! checks rather than learns of frees), and the ADI's one-sided channel
//! (memory registration, RDMA WRITE and READ, 8-byte atomics) that the MPI
//! layer's RMA uses, written only against the provider interface. The providers must not know MPI, communicators, requests or
//! the ADI's packets; the transport knows packets only as the ADI's
//! headers and payloads, never communicators or requests.
//!
//! # Cargo features
//! - `rdma-core` (off by default): builds the libibverbs calls, through
//!   the `rdma-sys` crate. Building it needs Debian's `libibverbs-dev`,
//!   `librdmacm-dev` and `libclang-dev`; a binary built with it needs
//!   `libibverbs1` at run time, and on a machine with no RDMA device finds
//!   none and says so (under `OXMPI_VERBOSE=1`).
//!
//!   Why `rdma-sys` rather than the safe `ibverbs` crate: the transport
//!   needs RDMA READ and WRITE, 8-byte atomics, shared receive queues and
//!   inline sends, and to set every queue-pair attribute of the RC state
//!   machine itself (RoCE v2 GID index, RNR timer and retries). `ibverbs`
//!   covers SEND/RECV and RDMA WRITE on its own queue pairs but neither
//!   atomics nor SRQs; `rdma-sys` is generated from rdma-core's own headers
//!   and exposes all of verbs. Its unsafety stays in one module with safe
//!   wrappers.
//!
//! # Environment
//! - `OXMPI_VERBS_PROVIDER`: `soft` or `rdma-core` ([`ProviderKind`]);
//!   the transport runs on the soft provider only when it is `soft`
//!   ([`transport::start`]).
//! - `OXMPI_VERBS_DEVICE`, `OXMPI_VERBS_PORT`, `OXMPI_VERBS_GID_INDEX`:
//!   which device, port and GID the rdma-core provider uses
//!   ([`rdma_core::Selection`]).
//! - `OXMPI_VERBS_CONNECT_TIMEOUT`: seconds a peer may leave connection
//!   requests unanswered before it is taken for lost (unset: no bound;
//!   [`transport::CONNECT_TIMEOUT_ENV`]).
//!
//! # Thread safety and clean-up
//! Every object is `Send + Sync`. Dropping an object releases it: a memory
//! region's keys are revoked when its handle is dropped, a queue pair's
//! connection closes and its NIC threads end when it is dropped.

pub mod connect;
pub mod maps;
pub mod provider;
pub mod rdma_core;
pub mod regcache;
pub mod soft;
pub mod transport;

use oxmpi_adi::{Error, ErrorClass, Result};

/// Which provider `OXMPI_VERBS_PROVIDER` asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProviderKind {
    /// The software provider.
    Soft,
    /// Real devices through rdma-core.
    RdmaCore,
}

impl ProviderKind {
    /// Parses the value of `OXMPI_VERBS_PROVIDER` (unset: rdma-core); an
    /// unknown value is an MPI_ERR_ARG error that lists the known ones.
    pub fn parse(value: Option<&str>) -> Result<ProviderKind> {
        match value.map(str::trim) {
            None | Some("") | Some("rdma-core") => Ok(ProviderKind::RdmaCore),
            Some("soft") => Ok(ProviderKind::Soft),
            Some(other) => Err(Error::new(
                ErrorClass::Arg,
                format!(
                    "OXMPI_VERBS_PROVIDER={other:?} is not a verbs provider: use soft or rdma-core"
                ),
            )),
        }
    }

    /// The provider the environment asks for.
    pub fn from_env() -> Result<ProviderKind> {
        ProviderKind::parse(std::env::var("OXMPI_VERBS_PROVIDER").ok().as_deref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_kind_parses() {
        assert_eq!(ProviderKind::parse(None).unwrap(), ProviderKind::RdmaCore);
        assert_eq!(
            ProviderKind::parse(Some("soft")).unwrap(),
            ProviderKind::Soft
        );
        assert_eq!(
            ProviderKind::parse(Some(" rdma-core ")).unwrap(),
            ProviderKind::RdmaCore
        );
        let e = ProviderKind::parse(Some("rxe")).unwrap_err();
        assert_eq!(e.class(), ErrorClass::Arg);
        assert!(e.message().contains("soft or rdma-core"));
    }
}
