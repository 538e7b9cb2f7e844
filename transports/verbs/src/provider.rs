//! The provider interface: the seam between the verbs transport and the NIC.
//!
//! Everything the transport asks of an RDMA device goes through the traits
//! here, in the vocabulary of verbs (`man ibv_post_send`, `ibv_modify_qp`,
//! `ibv_poll_cq`): a [`Nic`] (an opened device and the port chosen on it)
//! gives protection domains, memory registrations with access flags and
//! their lkey/rkey, completion queues, shared receive queues,
//! reliable-connected queue pairs, and unreliable-datagram queue pairs with
//! their address handles ([`UdQueuePair`], for connection requests). A
//! queue pair has an address
//! ([`QpAddress`], what goes in a business card) and is connected by the
//! RESET → INIT → RTR → RTS transitions ([`connect_rc`]); work is posted with
//! [`QueuePair::post_send_list`] (or [`QueuePair::post_send`] of one) /
//! [`QueuePair::post_recv`] /
//! [`SharedReceiveQueue::post_recv`] and finishes as [`WorkCompletion`]s
//! polled from a [`CompletionQueue`], whose [`WcStatus`] mirrors
//! `ibv_wc_status`; a [`CompletionChannel`] lets a thread sleep until an
//! armed completion queue gets a completion.
//!
//! Two providers implement it: [`crate::soft`] (software, for machines with
//! no RDMA device and for CI) and, behind the `rdma-core` feature, the
//! device discovery of [`crate::rdma_core`]. The pure rules both follow (legal
//! state transitions, attribute ranges, MR access-flag combinations, the
//! business-card encoding) live here, once.
//!
//! Memory safety: the one `unsafe` entry point is [`Nic::register`], whose
//! caller promises the memory stays valid while registered. Every later
//! access by the NIC is named by (address, length, key) and checked against
//! the registrations, so posting work is safe.

use oxmpi_adi::{Error, ErrorClass, Result};
use std::fmt;

/// Access rights of a memory region or of a queue pair's responder, with
/// the values of `IBV_ACCESS_*`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AccessFlags(u32);

impl AccessFlags {
    /// No access beyond local reads (the NIC may always read a region to
    /// send from it).
    pub const NONE: AccessFlags = AccessFlags(0);
    /// `IBV_ACCESS_LOCAL_WRITE`: the NIC may write the region for local work
    /// (receives, RDMA-read and atomic results).
    pub const LOCAL_WRITE: AccessFlags = AccessFlags(1);
    /// `IBV_ACCESS_REMOTE_WRITE`: peers may RDMA-write the region.
    pub const REMOTE_WRITE: AccessFlags = AccessFlags(2);
    /// `IBV_ACCESS_REMOTE_READ`: peers may RDMA-read the region.
    pub const REMOTE_READ: AccessFlags = AccessFlags(4);
    /// `IBV_ACCESS_REMOTE_ATOMIC`: peers may run 8-byte atomics on the region.
    pub const REMOTE_ATOMIC: AccessFlags = AccessFlags(8);

    /// The raw `IBV_ACCESS_*` bits.
    pub fn bits(self) -> u32 {
        self.0
    }

    /// Whether every right in `other` is in `self`.
    pub fn contains(self, other: AccessFlags) -> bool {
        self.0 & other.0 == other.0
    }

    /// Checks a combination for a memory registration: verbs refuses remote
    /// write or atomic access without local write (`ibv_reg_mr` fails with
    /// EINVAL), and so does every provider here.
    pub fn check_for_mr(self) -> Result<()> {
        let needs_local = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC;
        if self.0 & needs_local.0 != 0 && !self.contains(AccessFlags::LOCAL_WRITE) {
            return Err(Error::new(
                ErrorClass::Arg,
                format!(
                    "memory registration with access {self}: remote write and remote atomic \
                     access need LOCAL_WRITE as well"
                ),
            ));
        }
        if self.0 & !0xf != 0 {
            return Err(Error::new(
                ErrorClass::Arg,
                format!("memory registration with unknown access bits {:#x}", self.0),
            ));
        }
        Ok(())
    }
}

impl std::ops::BitOr for AccessFlags {
    type Output = AccessFlags;
    fn bitor(self, rhs: AccessFlags) -> AccessFlags {
        AccessFlags(self.0 | rhs.0)
    }
}

impl fmt::Display for AccessFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = [
            (AccessFlags::LOCAL_WRITE, "LOCAL_WRITE"),
            (AccessFlags::REMOTE_WRITE, "REMOTE_WRITE"),
            (AccessFlags::REMOTE_READ, "REMOTE_READ"),
            (AccessFlags::REMOTE_ATOMIC, "REMOTE_ATOMIC"),
        ];
        let set: Vec<&str> = names
            .iter()
            .filter(|(flag, _)| self.contains(*flag))
            .map(|(_, name)| *name)
            .collect();
        if set.is_empty() {
            f.write_str("NONE")
        } else {
            f.write_str(&set.join("|"))
        }
    }
}

/// A scatter/gather element: `length` bytes at `addr` inside the region
/// whose local key is `lkey` (`struct ibv_sge`). Work requests carry one:
/// the transport's messages and RMA operations are contiguous.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sge {
    /// Start address, in this process.
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// Local key of the registration that covers the range.
    pub lkey: u32,
}

/// Where a one-sided operation lands on the target: an address in the
/// target process and the remote key of a region there that covers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteAddr {
    /// Address in the target process.
    pub addr: u64,
    /// Remote key of the target's registration.
    pub rkey: u32,
}

/// What a send-queue work request does (`enum ibv_wr_opcode` and the
/// `IBV_SEND_INLINE` flag).
#[derive(Clone, Copy, Debug)]
pub enum SendOp<'a> {
    /// SEND from registered memory into the peer's next posted receive.
    Send(Sge),
    /// SEND of bytes copied at post time (`IBV_SEND_INLINE`): no
    /// registration needed, at most the QP's `max_inline_data`.
    SendInline(&'a [u8]),
    /// RDMA WRITE of local registered memory to the target.
    RdmaWrite {
        /// The data to write.
        local: Sge,
        /// Where it goes.
        remote: RemoteAddr,
    },
    /// RDMA WRITE of bytes copied at post time (`IBV_SEND_INLINE`).
    RdmaWriteInline {
        /// The data to write (at most `max_inline_data`).
        data: &'a [u8],
        /// Where it goes.
        remote: RemoteAddr,
    },
    /// RDMA READ of `local.length` bytes from the target into local memory
    /// (registered with LOCAL_WRITE).
    RdmaRead {
        /// Where the data lands.
        local: Sge,
        /// Where it is read from.
        remote: RemoteAddr,
    },
    /// 8-byte atomic fetch-and-add on an 8-byte-aligned target word; the
    /// original value lands in `local` (8 bytes, LOCAL_WRITE).
    FetchAdd {
        /// Where the original value lands.
        local: Sge,
        /// The target word.
        remote: RemoteAddr,
        /// The addend (wrapping).
        add: u64,
    },
    /// 8-byte atomic compare-and-swap: the target word becomes `swap` if it
    /// equals `compare`; the original value lands in `local`.
    CompareSwap {
        /// Where the original value lands.
        local: Sge,
        /// The target word.
        remote: RemoteAddr,
        /// The value expected.
        compare: u64,
        /// The value stored when it matched.
        swap: u64,
    },
}

impl SendOp<'_> {
    /// The opcode its completion reports.
    pub fn completion_opcode(&self) -> WcOpcode {
        match self {
            SendOp::Send(_) | SendOp::SendInline(_) => WcOpcode::Send,
            SendOp::RdmaWrite { .. } | SendOp::RdmaWriteInline { .. } => WcOpcode::RdmaWrite,
            SendOp::RdmaRead { .. } => WcOpcode::RdmaRead,
            SendOp::FetchAdd { .. } => WcOpcode::FetchAdd,
            SendOp::CompareSwap { .. } => WcOpcode::CompareSwap,
        }
    }
}

/// A send-queue work request (`struct ibv_send_wr` with one SGE).
#[derive(Clone, Copy, Debug)]
pub struct SendWr<'a> {
    /// The caller's identifier, returned in the completion.
    pub wr_id: u64,
    /// Whether a successful completion is reported (`IBV_SEND_SIGNALED`);
    /// errors are always reported.
    pub signaled: bool,
    /// What to do.
    pub op: SendOp<'a>,
}

/// A receive work request (`struct ibv_recv_wr` with one SGE): a buffer
/// for one incoming SEND.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecvWr {
    /// The caller's identifier, returned in the completion.
    pub wr_id: u64,
    /// The buffer (registered with LOCAL_WRITE).
    pub sge: Sge,
}

/// Why a post was refused. Work that was accepted and then failed is
/// reported by a completion, never here.
#[derive(Debug)]
pub enum PostError {
    /// The queue holds as many outstanding requests as it was created for:
    /// poll completions and post again (back-pressure, not a failure).
    QueueFull,
    /// The request is invalid in itself or in the queue pair's state.
    Invalid(Error),
}

/// Why a list of send requests ([`QueuePair::post_send_list`]) was not
/// posted whole, as `ibv_post_send`'s `bad_wr` says it: the first
/// `posted` requests were posted (they complete as any posted request
/// does), the next one was refused for `error`, and none after it was
/// posted.
#[derive(Debug)]
pub struct PartialPost {
    /// How many requests, from the first, were posted.
    pub posted: usize,
    /// Why the next one was refused.
    pub error: PostError,
}

impl From<PostError> for Error {
    fn from(e: PostError) -> Error {
        match e {
            PostError::QueueFull => Error::new(
                ErrorClass::Other,
                "work queue full: completions must be polled before more work is posted",
            ),
            PostError::Invalid(e) => e,
        }
    }
}

/// The status of a work completion, with the values of `enum ibv_wc_status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum WcStatus {
    /// IBV_WC_SUCCESS.
    Success = 0,
    /// IBV_WC_LOC_LEN_ERR: a received message longer than the receive buffer.
    LocLenErr = 1,
    /// IBV_WC_LOC_QP_OP_ERR: an internal queue-pair consistency error.
    LocQpOpErr = 2,
    /// IBV_WC_LOC_PROT_ERR: a local SGE not inside a registration with the
    /// needed rights.
    LocProtErr = 4,
    /// IBV_WC_WR_FLUSH_ERR: the queue pair went to the error state before
    /// this request was done.
    WrFlushErr = 5,
    /// IBV_WC_BAD_RESP_ERR: an unexpected response from the responder.
    BadRespErr = 7,
    /// IBV_WC_LOC_ACCESS_ERR: a local protection error on incoming data.
    LocAccessErr = 8,
    /// IBV_WC_REM_INV_REQ_ERR: the responder found the request invalid
    /// (e.g. a SEND longer than its receive buffer).
    RemInvReqErr = 9,
    /// IBV_WC_REM_ACCESS_ERR: a bad rkey, a range outside the region, or a
    /// missing access right on the responder.
    RemAccessErr = 10,
    /// IBV_WC_REM_OP_ERR: the responder could not complete the operation.
    RemOpErr = 11,
    /// IBV_WC_RETRY_EXC_ERR: the responder stopped answering (transport
    /// retries exhausted; in the soft provider, the connection broke).
    RetryExcErr = 12,
    /// IBV_WC_RNR_RETRY_EXC_ERR: the responder had no receive posted, and
    /// the RNR retries ran out.
    RnrRetryExcErr = 13,
    /// IBV_WC_GENERAL_ERR, and any status this crate does not name.
    GeneralErr = 21,
}

impl WcStatus {
    /// The status for an `ibv_wc_status` value.
    pub fn from_ibv(value: u32) -> WcStatus {
        match value {
            0 => WcStatus::Success,
            1 => WcStatus::LocLenErr,
            2 => WcStatus::LocQpOpErr,
            4 => WcStatus::LocProtErr,
            5 => WcStatus::WrFlushErr,
            7 => WcStatus::BadRespErr,
            8 => WcStatus::LocAccessErr,
            9 => WcStatus::RemInvReqErr,
            10 => WcStatus::RemAccessErr,
            11 => WcStatus::RemOpErr,
            12 => WcStatus::RetryExcErr,
            13 => WcStatus::RnrRetryExcErr,
            _ => WcStatus::GeneralErr,
        }
    }
}

/// What a completed work request was (`enum ibv_wc_opcode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WcOpcode {
    /// A SEND (inline or not).
    Send,
    /// An RDMA WRITE.
    RdmaWrite,
    /// An RDMA READ.
    RdmaRead,
    /// An atomic compare-and-swap.
    CompareSwap,
    /// An atomic fetch-and-add.
    FetchAdd,
    /// A receive that took an incoming SEND.
    Recv,
}

/// One finished work request (`struct ibv_wc`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkCompletion {
    /// The `wr_id` it was posted with.
    pub wr_id: u64,
    /// How it ended.
    pub status: WcStatus,
    /// What it was. As in verbs, only meaningful when `status` is
    /// [`WcStatus::Success`].
    pub opcode: WcOpcode,
    /// For a receive, the length of the message; for an RDMA READ, the
    /// bytes read; for an atomic, 8.
    pub byte_len: u32,
    /// The queue pair it belongs to (for receives from a shared receive
    /// queue, the one the message came in on).
    pub qp_num: u32,
}

/// States of a queue pair (`enum ibv_qp_state`; SQD and SQE are not used).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QpState {
    /// Created, or reset: nothing can be posted.
    Reset,
    /// Receives can be posted; nothing is processed.
    Init,
    /// Ready to receive: incoming requests are executed.
    Rtr,
    /// Ready to send.
    Rts,
    /// Broken: everything outstanding and posted completes with
    /// [`WcStatus::WrFlushErr`].
    Error,
}

/// Checks that `ibv_modify_qp` may move an RC queue pair from `from` to
/// `to`: RESET→INIT, INIT→INIT, INIT→RTR, RTR→RTS, RTS→RTS, and from any
/// state to RESET or ERROR.
pub fn check_transition(from: QpState, to: QpState) -> Result<()> {
    use QpState::{Init, Reset, Rtr, Rts};
    let legal = matches!(
        (from, to),
        (Reset, Init)
            | (Init, Init)
            | (Init, Rtr)
            | (Rtr, Rts)
            | (Rts, Rts)
            | (_, Reset)
            | (_, QpState::Error)
    );
    if legal {
        Ok(())
    } else {
        Err(Error::new(
            ErrorClass::Arg,
            format!("queue pair state change {from:?} -> {to:?} is not allowed (RESET -> INIT -> RTR -> RTS)"),
        ))
    }
}

/// A path MTU (`enum ibv_mtu`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mtu {
    /// 256 bytes.
    Mtu256,
    /// 512 bytes.
    Mtu512,
    /// 1024 bytes.
    Mtu1024,
    /// 2048 bytes.
    Mtu2048,
    /// 4096 bytes.
    Mtu4096,
}

impl Mtu {
    /// The `enum ibv_mtu` value (1 for 256 ... 5 for 4096).
    pub fn to_ibv(self) -> u32 {
        self as u32 + 1
    }

    /// The MTU for an `enum ibv_mtu` value.
    pub fn from_ibv(value: u32) -> Option<Mtu> {
        Some(match value {
            1 => Mtu::Mtu256,
            2 => Mtu::Mtu512,
            3 => Mtu::Mtu1024,
            4 => Mtu::Mtu2048,
            5 => Mtu::Mtu4096,
            _ => return None,
        })
    }

    /// Size in bytes.
    pub fn bytes(self) -> u32 {
        256 << (self as u32)
    }
}

/// A 128-bit global identifier (`union ibv_gid`), in network byte order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// Whether it is an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`), the
    /// form RoCE v2 GIDs take for an IPv4 address.
    pub fn is_ipv4_mapped(&self) -> bool {
        self.0[..10].iter().all(|&b| b == 0) && self.0[10] == 0xff && self.0[11] == 0xff
    }

    /// Whether it is all zeros (an unused GID table entry).
    pub fn is_zero(&self) -> bool {
        self.0.iter().all(|&b| b == 0)
    }

    /// Whether it is an IPv6 link-local address (fe80::/10).
    pub fn is_link_local(&self) -> bool {
        self.0[0] == 0xfe && self.0[1] & 0xc0 == 0x80
    }
}

impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, pair) in self.0.chunks(2).enumerate() {
            if i > 0 {
                f.write_str(":")?;
            }
            write!(f, "{:02x}{:02x}", pair[0], pair[1])?;
        }
        Ok(())
    }
}

/// The link layer of a port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkLayer {
    /// InfiniBand: peers are addressed by LID (GID only across subnets).
    InfiniBand,
    /// Ethernet (RoCE): peers are addressed by GID.
    Ethernet,
}

/// The kind of a GID table entry (`enum ibv_gid_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GidType {
    /// An InfiniBand GID, or RoCE v1.
    IbOrRoceV1,
    /// RoCE v2 (routable, over UDP/IP).
    RoceV2,
}

/// One entry of a port's GID table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GidEntry {
    /// Its index in the table (the `sgid_index` that selects it).
    pub index: u8,
    /// The GID.
    pub gid: Gid,
    /// Its kind.
    pub kind: GidType,
}

/// What the transport needs to know of the port a [`Nic`] was opened on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortInfo {
    /// The port number (from 1).
    pub port: u8,
    /// The port's LID (0 on Ethernet).
    pub lid: u16,
    /// The active MTU.
    pub active_mtu: Mtu,
    /// The link layer.
    pub link_layer: LinkLayer,
    /// The GID this NIC uses for its queue pairs' addresses, with its index.
    pub gid: GidEntry,
}

/// A queue pair's address: what a peer needs to connect its own queue pair
/// to this one, published in the business card.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpAddress {
    /// The GID of the port (for the soft provider, its soft NIC's identity).
    pub gid: Gid,
    /// The LID of the port (0 when addressing is by GID).
    pub lid: u16,
    /// The queue pair number (24 bits).
    pub qpn: u32,
    /// The first packet sequence number it sends with (24 bits).
    pub psn: u32,
    /// The port's active MTU.
    pub mtu: Mtu,
}

/// Version of the business-card encoding of [`QpAddress`].
const CARD_VERSION: &str = "v1";

impl QpAddress {
    /// Encodes it for the key-value space: `v1:<gid hex>:<lid>:<qpn>:<psn>:<mtu bytes>`
    /// (73 characters at most, well within PMI's value limit).
    pub fn to_card(&self) -> String {
        let gid: String = self.gid.0.iter().map(|b| format!("{b:02x}")).collect();
        format!(
            "{CARD_VERSION}:{gid}:{}:{}:{}:{}",
            self.lid,
            self.qpn,
            self.psn,
            self.mtu.bytes()
        )
    }

    /// Decodes a card written by [`QpAddress::to_card`]; anything else is an
    /// MPI_ERR_OTHER error naming what is wrong.
    pub fn from_card(card: &str) -> Result<QpAddress> {
        let bad = |why: &str| {
            Error::new(
                ErrorClass::Other,
                format!("verbs business card {card:?} is not valid: {why}"),
            )
        };
        let fields: Vec<&str> = card.split(':').collect();
        let [version, gid_hex, lid, qpn, psn, mtu] = fields[..] else {
            return Err(bad("expected 6 fields separated by ':'"));
        };
        if version != CARD_VERSION {
            return Err(bad(&format!(
                "version {version:?}, this build reads {CARD_VERSION}"
            )));
        }
        if gid_hex.len() != 32 || !gid_hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad("the GID must be 32 hexadecimal digits"));
        }
        let mut gid = [0u8; 16];
        for (i, byte) in gid.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&gid_hex[2 * i..2 * i + 2], 16)
                .map_err(|_| bad("the GID must be 32 hexadecimal digits"))?;
        }
        let lid: u16 = lid.parse().map_err(|_| bad("bad LID"))?;
        let qpn: u32 = qpn.parse().map_err(|_| bad("bad QP number"))?;
        let psn: u32 = psn.parse().map_err(|_| bad("bad PSN"))?;
        if qpn >= 1 << 24 || psn >= 1 << 24 {
            return Err(bad("QP numbers and PSNs have 24 bits"));
        }
        let mtu = match mtu {
            "256" => Mtu::Mtu256,
            "512" => Mtu::Mtu512,
            "1024" => Mtu::Mtu1024,
            "2048" => Mtu::Mtu2048,
            "4096" => Mtu::Mtu4096,
            _ => return Err(bad("the MTU must be 256, 512, 1024, 2048 or 4096")),
        };
        Ok(QpAddress {
            gid: Gid(gid),
            lid,
            qpn,
            psn,
            mtu,
        })
    }
}

/// Sizes of a queue pair's queues (`struct ibv_qp_cap`, one SGE per request).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpCaps {
    /// Most send requests outstanding at once.
    pub max_send_wr: u32,
    /// Most receives posted at once on its own receive queue (unused with an SRQ).
    pub max_recv_wr: u32,
    /// Most bytes of an inline SEND or RDMA WRITE.
    pub max_inline_data: u32,
}

/// Attributes of the RESET → INIT transition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InitAttr {
    /// The port (from 1).
    pub port: u8,
    /// P_Key index (0: the default partition).
    pub pkey_index: u16,
    /// What peers may do through this queue pair as responder (REMOTE_*);
    /// checked in addition to each region's own rights.
    pub access: AccessFlags,
}

/// Attributes of the INIT → RTR transition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RtrAttr {
    /// The remote queue pair (its address from the business card).
    pub remote: QpAddress,
    /// The path MTU (the smaller of the two ports' active MTUs).
    pub path_mtu: Mtu,
    /// Incoming RDMA READs and atomics in flight at once (responder resources).
    pub max_dest_rd_atomic: u8,
    /// The RNR timer this responder asks requesters to wait (the 5-bit
    /// IB encoding; see [`rnr_timer_duration`]).
    pub min_rnr_timer: u8,
    /// Index of the local GID used as source (ignored by the soft provider).
    pub sgid_index: u8,
    /// Hop limit of the global route header (RoCE).
    pub hop_limit: u8,
}

/// Attributes of the RTR → RTS transition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RtsAttr {
    /// The first PSN this queue pair sends with (its own card's PSN).
    pub sq_psn: u32,
    /// Local ACK timeout (5-bit exponent: 4.096 µs × 2^timeout).
    pub timeout: u8,
    /// Transport retries before RETRY_EXC_ERR (0..=7).
    pub retry_cnt: u8,
    /// RNR retries before RNR_RETRY_EXC_ERR (0..=6; 7 retries for ever).
    pub rnr_retry: u8,
    /// Outgoing RDMA READs and atomics in flight at once (initiator depth).
    pub max_rd_atomic: u8,
}

/// `rnr_retry` value meaning "retry for ever".
pub const RNR_RETRY_FOREVER: u8 = 7;

/// Checks the ranges verbs allows for the transition attributes: PSNs of
/// 24 bits, 3-bit retry counts, 5-bit timers.
pub fn check_attributes(rtr: Option<&RtrAttr>, rts: Option<&RtsAttr>) -> Result<()> {
    let bad = |what: String| Err(Error::new(ErrorClass::Arg, what));
    if let Some(rtr) = rtr {
        if rtr.min_rnr_timer > 31 {
            return bad(format!("min_rnr_timer {} is above 31", rtr.min_rnr_timer));
        }
        if rtr.remote.qpn >= 1 << 24 || rtr.remote.psn >= 1 << 24 {
            return bad("the remote QP number and PSN must fit 24 bits".into());
        }
    }
    if let Some(rts) = rts {
        if rts.sq_psn >= 1 << 24 {
            return bad(format!("sq_psn {} does not fit 24 bits", rts.sq_psn));
        }
        if rts.retry_cnt > 7 || rts.rnr_retry > 7 {
            return bad(format!(
                "retry_cnt {} and rnr_retry {} must be at most 7",
                rts.retry_cnt, rts.rnr_retry
            ));
        }
        if rts.timeout > 31 {
            return bad(format!("timeout {} is above 31", rts.timeout));
        }
    }
    Ok(())
}

/// How long an RNR NAK asks the requester to wait, for the 5-bit encoding
/// of `min_rnr_timer` (IB spec table 45: 0 is 655.36 ms, 1 is 0.01 ms, ...,
/// 31 is 491.52 ms).
pub fn rnr_timer_duration(code: u8) -> std::time::Duration {
    const MICROS: [u32; 32] = [
        655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560,
        3_840, 5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880,
        163_840, 245_760, 327_680, 491_520,
    ];
    std::time::Duration::from_micros(MICROS[usize::from(code & 31)].into())
}

/// What a queue pair is created with (`struct ibv_qp_init_attr`, RC only).
pub struct QpInit<'a, N: Nic + ?Sized> {
    /// Completion queue of its send requests.
    pub send_cq: &'a N::Cq,
    /// Completion queue of its receives.
    pub recv_cq: &'a N::Cq,
    /// The shared receive queue its incoming SENDs take buffers from, if any.
    pub srq: Option<&'a N::Srq>,
    /// Queue sizes.
    pub caps: QpCaps,
}

/// Bytes of the global route header that starts every receive buffer of
/// a UD queue pair: the NIC writes it (valid or not) before the payload,
/// and a receive's `byte_len` counts it.
pub const GRH_LEN: usize = 40;

/// Largest payload of one datagram the transport sends: the smallest path
/// MTU, so that it fits on every fabric.
pub const UD_MAX_PAYLOAD: usize = 256;

/// Where datagrams go: what an address handle is created from (`struct
/// ibv_ah_attr`, from a peer's GID and LID).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AhAttr {
    /// The remote port's GID (how RoCE addresses it).
    pub gid: Gid,
    /// The remote port's LID (how InfiniBand addresses it; 0 on RoCE).
    pub lid: u16,
}

/// Attributes of readying a UD queue pair: RESET → INIT (port, P_Key
/// index, Q_Key) → RTR → RTS (first PSN).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UdAttr {
    /// The port (from 1).
    pub port: u8,
    /// P_Key index (0: the default partition).
    pub pkey_index: u16,
    /// The Q_Key: datagrams that carry another are dropped by the receiver.
    pub qkey: u32,
    /// First PSN sent (24 bits).
    pub sq_psn: u32,
}

impl UdAttr {
    /// Checks the ranges verbs allows: a port from 1, a PSN of 24 bits.
    pub fn check(&self) -> Result<()> {
        if self.port == 0 {
            return Err(Error::new(ErrorClass::Arg, "port numbers start at 1"));
        }
        if self.sq_psn >= 1 << 24 {
            return Err(Error::new(
                ErrorClass::Arg,
                format!("sq_psn {} does not fit 24 bits", self.sq_psn),
            ));
        }
        Ok(())
    }
}

/// A datagram to send (`struct ibv_send_wr` of a UD queue pair, opcode
/// SEND, one SGE).
#[derive(Clone, Copy, Debug)]
pub struct UdSendWr<'a, A> {
    /// The caller's identifier, returned in the completion.
    pub wr_id: u64,
    /// Whether a successful completion is reported.
    pub signaled: bool,
    /// The payload, in registered memory (at most the path MTU).
    pub sge: Sge,
    /// The destination port.
    pub ah: &'a A,
    /// The destination queue pair.
    pub remote_qpn: u32,
    /// The Q_Key the destination expects.
    pub remote_qkey: u32,
}

/// An unreliable-datagram queue pair (`IBV_QPT_UD`): each SEND goes to the
/// queue pair its request names; nothing is acknowledged, so a datagram
/// may be lost (no receive posted, a full queue on the way, a wrong
/// Q_Key) and its sender still completes with success. Receives take the
/// [`GRH_LEN`]-byte header before the payload.
pub trait UdQueuePair: Send + Sync {
    /// The address handle type of its NIC.
    type Ah;
    /// Its number.
    fn qp_num(&self) -> u32;
    /// Its current state.
    fn state(&self) -> QpState;
    /// RESET → INIT → RTR → RTS: ready to receive and send.
    fn ready(&self, attr: &UdAttr) -> Result<()>;
    /// Posts a datagram (`ibv_post_send`); allowed in RTS.
    fn post_send(&self, wr: &UdSendWr<'_, Self::Ah>) -> std::result::Result<(), PostError>;
    /// Posts a receive buffer of at least [`GRH_LEN`] bytes plus the
    /// largest payload expected (`ibv_post_recv`); allowed from INIT on.
    fn post_recv(&self, wr: &RecvWr) -> std::result::Result<(), PostError>;
}

/// An opened RDMA device and the port chosen on it (`struct ibv_context`).
pub trait Nic: Send + Sync {
    /// A protection domain: regions and queue pairs of one domain may be
    /// used together, and only they.
    type Pd: Send + Sync;
    /// A memory registration; dropping it deregisters (revokes its keys).
    type Mr: MemoryRegion;
    /// A completion queue.
    type Cq: CompletionQueue;
    /// A shared receive queue.
    type Srq: SharedReceiveQueue;
    /// A reliable-connected queue pair.
    type Qp: QueuePair;
    /// An address handle (`struct ibv_ah`): a route to a remote port.
    type Ah: Send + Sync;
    /// An unreliable-datagram queue pair.
    type Ud: UdQueuePair<Ah = Self::Ah>;
    /// A completion channel.
    type Channel: CompletionChannel;

    /// The device's name (e.g. `mlx5_0`, or `soft`).
    fn name(&self) -> &str;
    /// The port in use and its addressing.
    fn port(&self) -> &PortInfo;
    /// Allocates a protection domain (`ibv_alloc_pd`).
    fn alloc_pd(&self) -> Result<Self::Pd>;
    /// Registers `len` bytes at `addr` with `access` rights (`ibv_reg_mr`).
    ///
    /// # Safety
    /// The memory must stay valid (allocated, and writable when `access`
    /// has LOCAL_WRITE, REMOTE_WRITE or REMOTE_ATOMIC) until the returned
    /// region is dropped — except a region whose only rights are
    /// LOCAL_WRITE and REMOTE_READ, which may outlive its memory while no
    /// posted work names it: peers' READs of it then get what the pages
    /// hold (hardware keeps them pinned) or, where they are no longer
    /// mapped, REM_ACCESS_ERR (the soft provider reads through the kernel).
    /// While it is registered the NIC may read and write
    /// it at any time on behalf of posted work and of peers holding its
    /// rkey: the caller must not hold Rust references to bytes that such
    /// work may touch while it may touch them.
    unsafe fn register(
        &self,
        pd: &Self::Pd,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<Self::Mr>;
    /// Creates a completion channel (`ibv_create_comp_channel`).
    fn create_comp_channel(&self) -> Result<Self::Channel>;
    /// Creates a completion queue for about `capacity` completions, whose
    /// events (when armed) go to `channel`.
    fn create_cq(&self, capacity: u32, channel: Option<&Self::Channel>) -> Result<Self::Cq>;
    /// Creates a shared receive queue of `max_wr` receives.
    fn create_srq(&self, pd: &Self::Pd, max_wr: u32) -> Result<Self::Srq>;
    /// Creates an RC queue pair in the RESET state.
    fn create_qp(&self, pd: &Self::Pd, init: &QpInit<'_, Self>) -> Result<Self::Qp>;
    /// Creates a UD queue pair in the RESET state, with its own receive
    /// queue (`init.srq` must be `None`).
    fn create_ud(&self, pd: &Self::Pd, init: &QpInit<'_, Self>) -> Result<Self::Ud>;
    /// Creates an address handle to the port `attr` names (`ibv_create_ah`).
    fn create_ah(&self, pd: &Self::Pd, attr: &AhAttr) -> Result<Self::Ah>;
}

/// A registered memory region (`struct ibv_mr`).
pub trait MemoryRegion: Send + Sync {
    /// The key local work requests name it by.
    fn lkey(&self) -> u32;
    /// The key peers name it by in one-sided operations.
    fn rkey(&self) -> u32;
    /// Its start address.
    fn addr(&self) -> u64;
    /// Its length in bytes.
    fn len(&self) -> usize;
    /// Whether it is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A completion queue (`struct ibv_cq`).
pub trait CompletionQueue: Send + Sync {
    /// Moves up to `max` completions, oldest first, to the end of `out`;
    /// returns how many (`ibv_poll_cq`). Never blocks.
    fn poll(&self, max: usize, out: &mut Vec<WorkCompletion>) -> Result<usize>;
    /// Arms the queue (`ibv_req_notify_cq`, all completions): the next
    /// completion added to it raises one event on its channel. Those
    /// already in it raise none, so a caller about to sleep arms, then
    /// polls once more. An error for a queue made without a channel.
    fn req_notify(&self) -> Result<()>;
}

/// A completion channel (`struct ibv_comp_channel`): a file descriptor
/// that becomes readable when an armed completion queue made on it gets a
/// completion, so that a thread with nothing to do can sleep in the
/// kernel (`poll(2)`) instead of spinning.
pub trait CompletionChannel: Send + Sync {
    /// The descriptor to wait on for readability.
    fn fd(&self) -> std::os::fd::RawFd;
    /// Takes and acknowledges the events that made it readable
    /// (`ibv_get_cq_event`, `ibv_ack_cq_events`), without blocking;
    /// returns how many there were.
    fn drain(&self) -> Result<u32>;
}

/// A shared receive queue (`struct ibv_srq`).
pub trait SharedReceiveQueue: Send + Sync {
    /// Posts a receive buffer any queue pair attached to it may fill
    /// (`ibv_post_srq_recv`).
    fn post_recv(&self, wr: &RecvWr) -> std::result::Result<(), PostError>;
}

/// A reliable-connected queue pair (`struct ibv_qp`, `IBV_QPT_RC`).
pub trait QueuePair: Send + Sync {
    /// Its number.
    fn qp_num(&self) -> u32;
    /// Its current state.
    fn state(&self) -> QpState;
    /// Its address for the business card.
    fn address(&self) -> QpAddress;
    /// RESET → INIT.
    fn modify_to_init(&self, attr: &InitAttr) -> Result<()>;
    /// INIT → RTR: connects it to the remote queue pair.
    fn modify_to_rtr(&self, attr: &RtrAttr) -> Result<()>;
    /// RTR → RTS.
    fn modify_to_rts(&self, attr: &RtsAttr) -> Result<()>;
    /// Posts send-queue requests in order as one list (`ibv_post_send`
    /// with the requests linked by `next`: one call, one doorbell);
    /// allowed in RTS, and in ERROR where each completes at once with
    /// [`WcStatus::WrFlushErr`]. The requests posted are all of them, or
    /// on a refusal the ones before the refused one ([`PartialPost`]).
    fn post_send_list(&self, wrs: &[SendWr<'_>]) -> std::result::Result<(), PartialPost>;
    /// Posts one send-queue request: [`QueuePair::post_send_list`] of it.
    fn post_send(&self, wr: &SendWr<'_>) -> std::result::Result<(), PostError> {
        self.post_send_list(std::slice::from_ref(wr))
            .map_err(|refused| refused.error)
    }
    /// Posts a receive on its own receive queue (`ibv_post_recv`); allowed
    /// from INIT on, and refused for a queue pair attached to an SRQ.
    fn post_recv(&self, wr: &RecvWr) -> std::result::Result<(), PostError>;
}

/// The connection parameters the transport uses on every queue pair;
/// [`ConnectParams::default`] is what the verbs transport chooses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectParams {
    /// What peers may do through the queue pair.
    pub access: AccessFlags,
    /// RNR timer asked of requesters (5-bit code).
    pub min_rnr_timer: u8,
    /// RNR retries (7: for ever).
    pub rnr_retry: u8,
    /// Transport retries.
    pub retry_cnt: u8,
    /// ACK timeout (5-bit exponent).
    pub timeout: u8,
    /// READs/atomics in flight, each way.
    pub rd_atomic: u8,
}

impl Default for ConnectParams {
    fn default() -> ConnectParams {
        ConnectParams {
            access: AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
            // 12: 0.64 ms, what most MPI libraries choose.
            min_rnr_timer: 12,
            rnr_retry: RNR_RETRY_FOREVER,
            retry_cnt: 7,
            // 14: 4.096 µs × 2^14 ≈ 67 ms.
            timeout: 14,
            rd_atomic: 16,
        }
    }
}

/// Moves `qp` from RESET to RTS connected to `remote`: INIT on the NIC's
/// port, RTR at the smaller of the two MTUs, RTS with the queue pair's own
/// PSN.
pub fn connect_rc<N: Nic>(
    nic: &N,
    qp: &N::Qp,
    remote: &QpAddress,
    params: &ConnectParams,
) -> Result<()> {
    let port = nic.port();
    qp.modify_to_init(&InitAttr {
        port: port.port,
        pkey_index: 0,
        access: params.access,
    })?;
    qp.modify_to_rtr(&RtrAttr {
        remote: *remote,
        path_mtu: port.active_mtu.min(remote.mtu),
        max_dest_rd_atomic: params.rd_atomic,
        min_rnr_timer: params.min_rnr_timer,
        sgid_index: port.gid.index,
        hop_limit: 64,
    })?;
    qp.modify_to_rts(&RtsAttr {
        sq_psn: qp.address().psn,
        timeout: params.timeout,
        retry_cnt: params.retry_cnt,
        rnr_retry: params.rnr_retry,
        max_rd_atomic: params.rd_atomic,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transitions_follow_the_rc_state_machine() {
        use QpState::*;
        for (from, to) in [
            (Reset, Init),
            (Init, Rtr),
            (Rtr, Rts),
            (Rts, Rts),
            (Rts, Error),
            (Error, Reset),
        ] {
            assert!(check_transition(from, to).is_ok(), "{from:?} -> {to:?}");
        }
        for (from, to) in [
            (Reset, Rtr),
            (Reset, Rts),
            (Init, Rts),
            (Rtr, Init),
            (Error, Rts),
            (Rts, Rtr),
        ] {
            let e = check_transition(from, to).unwrap_err();
            assert_eq!(e.class(), ErrorClass::Arg, "{from:?} -> {to:?}");
        }
    }

    #[test]
    fn mr_access_needs_local_write_for_remote_write_and_atomics() {
        assert!(AccessFlags::REMOTE_READ.check_for_mr().is_ok());
        assert!(AccessFlags::NONE.check_for_mr().is_ok());
        assert!((AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC)
            .check_for_mr()
            .is_ok());
        for bad in [
            AccessFlags::REMOTE_WRITE,
            AccessFlags::REMOTE_ATOMIC,
            AccessFlags(0x40),
        ] {
            assert_eq!(bad.check_for_mr().unwrap_err().class(), ErrorClass::Arg);
        }
        assert_eq!(
            (AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ).to_string(),
            "LOCAL_WRITE|REMOTE_READ"
        );
    }

    #[test]
    fn cards_round_trip_and_bad_cards_are_refused() {
        let mut gid = [0u8; 16];
        gid[10] = 0xff;
        gid[11] = 0xff;
        gid[12..].copy_from_slice(&[10, 0, 0, 7]);
        let a = QpAddress {
            gid: Gid(gid),
            lid: 0,
            qpn: 0x12_3456,
            psn: 0xab_cdef,
            mtu: Mtu::Mtu1024,
        };
        assert_eq!(QpAddress::from_card(&a.to_card()).unwrap(), a);
        assert!(a.to_card().len() <= 73);
        let good = a.to_card();
        for bad in [
            "",
            "v2:00000000000000000000ffff0a000007:0:1:2:1024",
            "v1:0000:0:1:2:1024",
            "v1:0000000000000000000000000000000g:0:1:2:1024",
            "v1:00000000000000000000ffff0a000007:0:16777216:2:1024",
            "v1:00000000000000000000ffff0a000007:0:1:2:1000",
            "v1:00000000000000000000ffff0a000007:0:1:2",
            "v1:00000000000000000000ffff0a000007:x:1:2:1024",
        ] {
            assert!(QpAddress::from_card(bad).is_err(), "{bad:?} accepted");
        }
        assert!(QpAddress::from_card(&good).is_ok());
    }

    #[test]
    fn gid_kinds_and_text() {
        let mut g = [0u8; 16];
        assert!(Gid(g).is_zero());
        g[0] = 0xfe;
        g[1] = 0x80;
        assert!(Gid(g).is_link_local());
        assert!(!Gid(g).is_ipv4_mapped());
        assert_eq!(
            Gid(g).to_string(),
            "fe80:0000:0000:0000:0000:0000:0000:0000"
        );
    }

    #[test]
    fn attribute_ranges_and_codes() {
        let rts = RtsAttr {
            sq_psn: 1 << 24,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 1,
        };
        assert!(check_attributes(None, Some(&rts)).is_err());
        assert!(check_attributes(None, Some(&RtsAttr { sq_psn: 5, ..rts })).is_ok());
        assert!(check_attributes(
            None,
            Some(&RtsAttr {
                sq_psn: 5,
                rnr_retry: 8,
                ..rts
            })
        )
        .is_err());
        assert_eq!(rnr_timer_duration(0).as_micros(), 655_360);
        assert_eq!(rnr_timer_duration(1).as_micros(), 10);
        assert_eq!(rnr_timer_duration(12).as_micros(), 640);
        assert_eq!(rnr_timer_duration(31).as_micros(), 491_520);
        assert_eq!(Mtu::Mtu4096.bytes(), 4096);
        assert_eq!(Mtu::from_ibv(Mtu::Mtu1024.to_ibv()), Some(Mtu::Mtu1024));
        assert_eq!(Mtu::from_ibv(6), None);
        assert_eq!(WcStatus::from_ibv(10), WcStatus::RemAccessErr);
        assert_eq!(WcStatus::from_ibv(13), WcStatus::RnrRetryExcErr);
        assert_eq!(WcStatus::from_ibv(99), WcStatus::GeneralErr);
    }
}
