//! oxmpi's abstract device interface (ADI).
//!
//! This crate owns everything between the MPI layer and the communication
//! methods: the packet format ([`proto`]), the [`transport::Transport`]
//! trait every method implements, virtual connections with late binding,
//! the matching engine, requests, and the progress engine
//! ([`device::Device::check_device`], the seed's `MPID_Check_device`);
//! and the choice of method ([`select`]): which transports a rank starts
//! (`OXMPI_TRANSPORTS`) and which one reaches each peer. It also holds the PMI-1 client ([`pmi`]) through which ranks find each
//! other, the connection handshake ([`auth`]) that proves the job's
//! secret, and the host identity ([`host`]) that says which processes can
//! share memory.
//!
//! It must not know communicators, groups, datatypes or any MPI call: those
//! are the `oxmpi` crate's. It must not know any particular transport
//! either: transports depend on this crate, never the reverse.

pub mod auth;
pub mod device;
pub mod error;
pub mod host;
pub mod matching;
pub mod pmi;
pub mod proto;
pub mod request;
pub mod select;
mod selfvc;
pub mod transport;
pub mod verbose;
pub mod wait;

pub use error::{Error, ErrorClass, Result};
