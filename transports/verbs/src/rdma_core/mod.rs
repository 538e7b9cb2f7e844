//! The rdma-core provider: real RDMA devices through libibverbs.
//!
//! Its decisions are pure functions, built and tested everywhere: which
//! device, port and GID to use ([`Selection`], [`choose`],
//! [`default_gid`]), what a failed device listing means
//! ([`no_device_reason`]), and the `ibv_modify_qp` attributes and mask of
//! each state transition ([`init_plan`], [`rtr_plan`], [`rts_plan`]). The
//! calls into libibverbs are behind the `rdma-core` cargo feature: device
//! discovery (module `ffi`) and `RdmaNic`, the provider interface over
//! libibverbs (module `nic`; compiled and checked in CI, but not yet run
//! on a device: `tests/hw.rs` is the opt-in test for one). Without the
//! feature [`discover`] reports that this build has no rdma-core support,
//! so callers fall back to their other methods.
//!
//! Choosing by default: the first device with an active port, its first
//! active port, and on Ethernet (RoCE) the best GID of the port: RoCE v2
//! with an IPv4-mapped address first (routable, and what RoCE networks are
//! configured for), then RoCE v2 with a global IPv6 address, then any RoCE
//! v2 GID, then RoCE v1. On InfiniBand, GID index 0 (peers are reached by
//! LID). `OXMPI_VERBS_DEVICE`, `OXMPI_VERBS_PORT` and
//! `OXMPI_VERBS_GID_INDEX` override each choice; a value that names
//! nothing usable is an MPI_ERR_ARG error saying what exists.

#[cfg(feature = "rdma-core")]
mod ffi;
#[cfg(feature = "rdma-core")]
mod nic;

#[cfg(feature = "rdma-core")]
pub use nic::{RdmaCq, RdmaMr, RdmaNic, RdmaPd, RdmaQp, RdmaSrq};

use crate::provider::{
    check_attributes, AccessFlags, AhAttr, Gid, GidEntry, GidType, InitAttr, LinkLayer, Mtu,
    PortInfo, RtrAttr, RtsAttr, UdAttr,
};
use oxmpi_adi::{Error, ErrorClass, Result};

/// Environment variable naming the device (e.g. `mlx5_0`).
pub const DEVICE_ENV: &str = "OXMPI_VERBS_DEVICE";
/// Environment variable naming the port (from 1).
pub const PORT_ENV: &str = "OXMPI_VERBS_PORT";
/// Environment variable naming the GID index.
pub const GID_INDEX_ENV: &str = "OXMPI_VERBS_GID_INDEX";

/// What the user asked for; `None` leaves the choice to [`choose`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Selection {
    /// The device's name.
    pub device: Option<String>,
    /// The port number.
    pub port: Option<u8>,
    /// The GID index.
    pub gid_index: Option<u8>,
}

/// A value that was given: set and not blank.
fn given(value: Option<&str>) -> Option<&str> {
    value.map(str::trim).filter(|v| !v.is_empty())
}

fn arg_error(message: String) -> Error {
    Error::new(ErrorClass::Arg, message)
}

impl Selection {
    /// Parses the three variables' values (unset or empty: no choice).
    pub fn parse(
        device: Option<&str>,
        port: Option<&str>,
        gid_index: Option<&str>,
    ) -> Result<Selection> {
        let device = match given(device) {
            Some(d) if d.contains('/') || d.len() > 64 => {
                return Err(arg_error(format!(
                    "{DEVICE_ENV}={d:?} is not a device name (names look like mlx5_0)"
                )))
            }
            d => d.map(str::to_owned),
        };
        let port = given(port)
            .map(|p| {
                p.parse::<u8>().ok().filter(|&p| p >= 1).ok_or_else(|| {
                    arg_error(format!("{PORT_ENV}={p:?} is not a port number (1 to 255)"))
                })
            })
            .transpose()?;
        let gid_index = given(gid_index)
            .map(|g| {
                g.parse::<u8>().map_err(|_| {
                    arg_error(format!(
                        "{GID_INDEX_ENV}={g:?} is not a GID index (0 to 255)"
                    ))
                })
            })
            .transpose()?;
        Ok(Selection {
            device,
            port,
            gid_index,
        })
    }

    /// Reads the choice from the environment.
    pub fn from_env() -> Result<Selection> {
        let var = |name| std::env::var(name).ok();
        Selection::parse(
            var(DEVICE_ENV).as_deref(),
            var(PORT_ENV).as_deref(),
            var(GID_INDEX_ENV).as_deref(),
        )
    }
}

/// What discovery found of one port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortFacts {
    /// Its number.
    pub port: u8,
    /// Whether its state is ACTIVE.
    pub active: bool,
    /// Its LID.
    pub lid: u16,
    /// Its active MTU.
    pub active_mtu: Mtu,
    /// Its link layer.
    pub link_layer: LinkLayer,
    /// The non-zero entries of its GID table.
    pub gids: Vec<GidEntry>,
}

/// What discovery found of one device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceFacts {
    /// Its name.
    pub name: String,
    /// Its ports.
    pub ports: Vec<PortFacts>,
}

/// The outcome of looking for a device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Discovery {
    /// No device can be used; why, for a person.
    NoDevice(String),
    /// The device and port to use.
    Found {
        /// The device's name.
        device: String,
        /// The port, with the GID chosen.
        port: PortInfo,
    },
}

/// The GID to use on an Ethernet port by default (see the module docs), or
/// `None` when its table has no usable entry.
pub fn default_gid(gids: &[GidEntry]) -> Option<GidEntry> {
    let rank = |g: &GidEntry| match (g.kind, g.gid) {
        (GidType::RoceV2, gid) if gid.is_ipv4_mapped() => 0,
        (GidType::RoceV2, gid) if !gid.is_link_local() => 1,
        (GidType::RoceV2, _) => 2,
        (GidType::IbOrRoceV1, gid) if gid.is_ipv4_mapped() => 3,
        (GidType::IbOrRoceV1, _) => 4,
    };
    gids.iter()
        .filter(|g| !g.gid.is_zero())
        .min_by_key(|g| (rank(g), g.index))
        .copied()
}

/// Chooses device, port and GID among `devices` as `selection` asks (see
/// the module docs).
pub fn choose(devices: &[DeviceFacts], selection: &Selection) -> Result<Discovery> {
    let names = || {
        let n: Vec<&str> = devices.iter().map(|d| d.name.as_str()).collect();
        if n.is_empty() {
            "none".to_owned()
        } else {
            n.join(", ")
        }
    };
    let device = match &selection.device {
        Some(name) => devices.iter().find(|d| &d.name == name).ok_or_else(|| {
            arg_error(format!(
                "{DEVICE_ENV}={name}: no such RDMA device (devices here: {})",
                names()
            ))
        })?,
        None => match devices.iter().find(|d| d.ports.iter().any(|p| p.active)) {
            Some(d) => d,
            None if devices.is_empty() => {
                return Ok(Discovery::NoDevice("no RDMA device found".into()))
            }
            None => {
                return Ok(Discovery::NoDevice(format!(
                    "no RDMA device has an active port (devices: {})",
                    names()
                )))
            }
        },
    };
    let port = match selection.port {
        Some(n) => {
            let p = device.ports.iter().find(|p| p.port == n).ok_or_else(|| {
                arg_error(format!(
                    "{PORT_ENV}={n}: {} has ports {}",
                    device.name,
                    device
                        .ports
                        .iter()
                        .map(|p| p.port.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })?;
            if !p.active {
                return Err(arg_error(format!(
                    "{PORT_ENV}={n}: port {n} of {} is not active",
                    device.name
                )));
            }
            p
        }
        None => match device.ports.iter().find(|p| p.active) {
            Some(p) => p,
            None => {
                return Err(arg_error(format!(
                    "{DEVICE_ENV}={}: the device has no active port",
                    device.name
                )))
            }
        },
    };
    let gid = match selection.gid_index {
        Some(i) => *port.gids.iter().find(|g| g.index == i).ok_or_else(|| {
            arg_error(format!(
                "{GID_INDEX_ENV}={i}: port {} of {} has no GID at index {i} (used indices: {})",
                port.port,
                device.name,
                port.gids
                    .iter()
                    .map(|g| g.index.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })?,
        None => match port.link_layer {
            LinkLayer::InfiniBand => {
                port.gids
                    .iter()
                    .find(|g| g.index == 0)
                    .copied()
                    .unwrap_or(GidEntry {
                        index: 0,
                        gid: Gid::default(),
                        kind: GidType::IbOrRoceV1,
                    })
            }
            LinkLayer::Ethernet => default_gid(&port.gids).ok_or_else(|| {
                Error::new(
                    ErrorClass::Other,
                    format!(
                        "port {} of {} has no GID: give its network interface an IP address",
                        port.port, device.name
                    ),
                )
            })?,
        },
    };
    Ok(Discovery::Found {
        device: device.name.clone(),
        port: PortInfo {
            port: port.port,
            lid: port.lid,
            active_mtu: port.active_mtu,
            link_layer: port.link_layer,
            gid,
        },
    })
}

/// Why `ibv_get_device_list` found nothing usable, for its `errno`
/// (`None` when it returned an empty list).
pub fn no_device_reason(errno: Option<i32>) -> String {
    match errno {
        None | Some(0) => "no RDMA device found".into(),
        Some(libc::ENOSYS) => {
            "no RDMA device: the kernel has no RDMA support (ibv_get_device_list: function \
             not implemented)"
                .into()
        }
        Some(e) => format!(
            "no RDMA device: ibv_get_device_list failed: {}",
            std::io::Error::from_raw_os_error(e)
        ),
    }
}

/// The kind of a GID from its sysfs type file
/// (`/sys/class/infiniband/DEV/ports/N/gid_attrs/types/I`).
pub fn parse_gid_type(text: &str) -> Option<GidType> {
    match text.trim() {
        "RoCE v2" => Some(GidType::RoceV2),
        "IB/RoCE v1" | "RoCE v1" | "IB" => Some(GidType::IbOrRoceV1),
        _ => None,
    }
}

/// Looks for the device and port to use: on a build with the `rdma-core`
/// feature, through libibverbs; otherwise it reports that this build has
/// none. Under `OXMPI_VERBOSE=1` the reason for finding no device is
/// shown.
pub fn discover(selection: &Selection) -> Result<Discovery> {
    #[cfg(feature = "rdma-core")]
    let found = ffi::discover(selection);
    #[cfg(not(feature = "rdma-core"))]
    let found = {
        // Nothing to choose from; the selection was checked when parsed.
        let _ = selection;
        Ok(Discovery::NoDevice(
            "this build has no rdma-core support (cargo feature rdma-core)".into(),
        ))
    };
    if let Ok(Discovery::NoDevice(why)) = &found {
        oxmpi_adi::vlog!("verbs: {why}; using the other methods");
    }
    found
}

/// `IBV_QP_*` bits of the `attr_mask` of `ibv_modify_qp`.
pub mod attr_mask {
    /// IBV_QP_STATE.
    pub const STATE: u32 = 1 << 0;
    /// IBV_QP_ACCESS_FLAGS.
    pub const ACCESS_FLAGS: u32 = 1 << 3;
    /// IBV_QP_PKEY_INDEX.
    pub const PKEY_INDEX: u32 = 1 << 4;
    /// IBV_QP_PORT.
    pub const PORT: u32 = 1 << 5;
    /// IBV_QP_QKEY.
    pub const QKEY: u32 = 1 << 6;
    /// IBV_QP_AV.
    pub const AV: u32 = 1 << 7;
    /// IBV_QP_PATH_MTU.
    pub const PATH_MTU: u32 = 1 << 8;
    /// IBV_QP_TIMEOUT.
    pub const TIMEOUT: u32 = 1 << 9;
    /// IBV_QP_RETRY_CNT.
    pub const RETRY_CNT: u32 = 1 << 10;
    /// IBV_QP_RNR_RETRY.
    pub const RNR_RETRY: u32 = 1 << 11;
    /// IBV_QP_RQ_PSN.
    pub const RQ_PSN: u32 = 1 << 12;
    /// IBV_QP_MAX_QP_RD_ATOMIC.
    pub const MAX_QP_RD_ATOMIC: u32 = 1 << 13;
    /// IBV_QP_MIN_RNR_TIMER.
    pub const MIN_RNR_TIMER: u32 = 1 << 15;
    /// IBV_QP_SQ_PSN.
    pub const SQ_PSN: u32 = 1 << 16;
    /// IBV_QP_MAX_DEST_RD_ATOMIC.
    pub const MAX_DEST_RD_ATOMIC: u32 = 1 << 17;
    /// IBV_QP_DEST_QPN.
    pub const DEST_QPN: u32 = 1 << 20;
}

/// `enum ibv_qp_state` values.
pub mod qp_state {
    /// IBV_QPS_INIT.
    pub const INIT: u32 = 1;
    /// IBV_QPS_RTR.
    pub const RTR: u32 = 2;
    /// IBV_QPS_RTS.
    pub const RTS: u32 = 3;
}

/// The global route header of an address vector (RoCE, or IB across
/// subnets).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GlobalRoute {
    /// The remote GID.
    pub dgid: Gid,
    /// The local GID index.
    pub sgid_index: u8,
    /// Hop limit.
    pub hop_limit: u8,
}

/// The address vector of the RTR transition (`struct ibv_ah_attr`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AddressVector {
    /// Remote LID (0 on Ethernet).
    pub dlid: u16,
    /// Local port.
    pub port_num: u8,
    /// The global route, when the peer is addressed by GID.
    pub global: Option<GlobalRoute>,
}

/// The fields of `struct ibv_qp_attr` a transition sets, and its mask: what
/// the rdma-core provider passes to `ibv_modify_qp`. Fields outside `mask`
/// are zero.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpAttrPlan {
    /// The `IBV_QP_*` bits ([`attr_mask`]).
    pub mask: u32,
    /// The new state ([`qp_state`]).
    pub qp_state: u32,
    /// INIT: P_Key index.
    pub pkey_index: u16,
    /// INIT: port.
    pub port_num: u8,
    /// INIT: `IBV_ACCESS_*` bits for remote operations (RC).
    pub qp_access_flags: u32,
    /// INIT: the Q_Key (UD).
    pub qkey: u32,
    /// RTR: `enum ibv_mtu`.
    pub path_mtu: u32,
    /// RTR: remote QP number.
    pub dest_qp_num: u32,
    /// RTR: first PSN expected.
    pub rq_psn: u32,
    /// RTR: responder resources.
    pub max_dest_rd_atomic: u8,
    /// RTR: RNR timer code.
    pub min_rnr_timer: u8,
    /// RTR: the address vector.
    pub ah: Option<AddressVector>,
    /// RTS: first PSN sent.
    pub sq_psn: u32,
    /// RTS: ACK timeout.
    pub timeout: u8,
    /// RTS: transport retries.
    pub retry_cnt: u8,
    /// RTS: RNR retries.
    pub rnr_retry: u8,
    /// RTS: initiator depth.
    pub max_rd_atomic: u8,
}

/// The RESET → INIT attributes.
pub fn init_plan(attr: &InitAttr) -> Result<QpAttrPlan> {
    let remote_rights =
        AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
    if attr.access.bits() & !remote_rights.bits() != 0 {
        return Err(arg_error(format!(
            "queue pair access {} : only REMOTE_WRITE, REMOTE_READ and REMOTE_ATOMIC apply",
            attr.access
        )));
    }
    if attr.port == 0 {
        return Err(arg_error("port numbers start at 1".into()));
    }
    Ok(QpAttrPlan {
        mask: attr_mask::STATE | attr_mask::PKEY_INDEX | attr_mask::PORT | attr_mask::ACCESS_FLAGS,
        qp_state: qp_state::INIT,
        pkey_index: attr.pkey_index,
        port_num: attr.port,
        qp_access_flags: attr.access.bits(),
        ..QpAttrPlan::default()
    })
}

/// The INIT → RTR attributes, for a queue pair on `port`: on Ethernet the
/// peer is addressed by GID (a global route from the chosen GID index); on
/// InfiniBand by LID, with a global route only when the peer has no LID.
pub fn rtr_plan(attr: &RtrAttr, port: &PortInfo) -> Result<QpAttrPlan> {
    check_attributes(Some(attr), None)?;
    let remote = &attr.remote;
    let av = address_vector(
        &AhAttr {
            gid: remote.gid,
            lid: remote.lid,
        },
        port,
        attr.sgid_index,
        attr.hop_limit,
    )
    .map_err(|why| {
        Error::new(
            ErrorClass::Other,
            format!("the remote queue pair {:#x} {why}", remote.qpn),
        )
    })?;
    Ok(QpAttrPlan {
        mask: attr_mask::STATE
            | attr_mask::AV
            | attr_mask::PATH_MTU
            | attr_mask::DEST_QPN
            | attr_mask::RQ_PSN
            | attr_mask::MAX_DEST_RD_ATOMIC
            | attr_mask::MIN_RNR_TIMER,
        qp_state: qp_state::RTR,
        path_mtu: attr.path_mtu.min(port.active_mtu).to_ibv(),
        dest_qp_num: remote.qpn,
        rq_psn: remote.psn,
        max_dest_rd_atomic: attr.max_dest_rd_atomic.max(1),
        min_rnr_timer: attr.min_rnr_timer,
        ah: Some(av),
        ..QpAttrPlan::default()
    })
}

/// The address vector to the port `remote` names, from `port`: on
/// Ethernet the peer is addressed by GID (a global route from GID index
/// `sgid_index`); on InfiniBand by LID, with a global route only when the
/// peer has no LID. What an RC queue pair's RTR and an address handle
/// (`ibv_create_ah`) are given. The error says why it has no route.
pub fn address_vector(
    remote: &AhAttr,
    port: &PortInfo,
    sgid_index: u8,
    hop_limit: u8,
) -> std::result::Result<AddressVector, &'static str> {
    let by_gid = port.link_layer == LinkLayer::Ethernet || remote.lid == 0;
    if by_gid && remote.gid.is_zero() {
        return Err("has neither a LID nor a GID to be reached by");
    }
    let global = by_gid.then_some(GlobalRoute {
        dgid: remote.gid,
        sgid_index,
        hop_limit: hop_limit.max(1),
    });
    Ok(AddressVector {
        dlid: if port.link_layer == LinkLayer::Ethernet {
            0
        } else {
            remote.lid
        },
        port_num: port.port,
        global,
    })
}

/// The three transitions that ready a UD queue pair: RESET → INIT (port,
/// P_Key index, Q_Key), INIT → RTR (nothing more), RTR → RTS (first PSN).
pub fn ud_plans(attr: &UdAttr) -> Result<[QpAttrPlan; 3]> {
    attr.check()?;
    Ok([
        QpAttrPlan {
            mask: attr_mask::STATE | attr_mask::PKEY_INDEX | attr_mask::PORT | attr_mask::QKEY,
            qp_state: qp_state::INIT,
            pkey_index: attr.pkey_index,
            port_num: attr.port,
            qkey: attr.qkey,
            ..QpAttrPlan::default()
        },
        QpAttrPlan {
            mask: attr_mask::STATE,
            qp_state: qp_state::RTR,
            ..QpAttrPlan::default()
        },
        QpAttrPlan {
            mask: attr_mask::STATE | attr_mask::SQ_PSN,
            qp_state: qp_state::RTS,
            sq_psn: attr.sq_psn,
            ..QpAttrPlan::default()
        },
    ])
}

/// The RTR → RTS attributes.
pub fn rts_plan(attr: &RtsAttr) -> Result<QpAttrPlan> {
    check_attributes(None, Some(attr))?;
    Ok(QpAttrPlan {
        mask: attr_mask::STATE
            | attr_mask::SQ_PSN
            | attr_mask::TIMEOUT
            | attr_mask::RETRY_CNT
            | attr_mask::RNR_RETRY
            | attr_mask::MAX_QP_RD_ATOMIC,
        qp_state: qp_state::RTS,
        sq_psn: attr.sq_psn,
        timeout: attr.timeout,
        retry_cnt: attr.retry_cnt,
        rnr_retry: attr.rnr_retry,
        max_rd_atomic: attr.max_rd_atomic.max(1),
        ..QpAttrPlan::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::QpAddress;

    fn gid(bytes: &[u8]) -> Gid {
        let mut g = [0u8; 16];
        g.copy_from_slice(bytes);
        Gid(g)
    }

    fn link_local() -> Gid {
        gid(&[0xfe, 0x80, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0xff, 0xfe, 0, 0, 1])
    }

    fn v4(last: u8) -> Gid {
        gid(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, last])
    }

    fn global6() -> Gid {
        gid(&[0x20, 0x01, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1])
    }

    fn entry(index: u8, gid: Gid, kind: GidType) -> GidEntry {
        GidEntry { index, gid, kind }
    }

    /// A RoCE port's table as mlx5 lays it out: each address as v1, then v2.
    fn roce_table() -> Vec<GidEntry> {
        vec![
            entry(0, link_local(), GidType::IbOrRoceV1),
            entry(1, link_local(), GidType::RoceV2),
            entry(2, v4(7), GidType::IbOrRoceV1),
            entry(3, v4(7), GidType::RoceV2),
            entry(4, global6(), GidType::IbOrRoceV1),
            entry(5, global6(), GidType::RoceV2),
        ]
    }

    #[test]
    fn roce_v2_ipv4_gid_is_preferred() {
        assert_eq!(default_gid(&roce_table()).unwrap().index, 3);
        let no_v4: Vec<GidEntry> = roce_table()
            .into_iter()
            .filter(|g| !g.gid.is_ipv4_mapped())
            .collect();
        assert_eq!(default_gid(&no_v4).unwrap().index, 5);
        let only_link_local = &roce_table()[..2];
        assert_eq!(default_gid(only_link_local).unwrap().index, 1);
        let v1_only = vec![
            entry(0, link_local(), GidType::IbOrRoceV1),
            entry(2, v4(1), GidType::IbOrRoceV1),
        ];
        assert_eq!(default_gid(&v1_only).unwrap().index, 2);
        assert_eq!(
            default_gid(&[entry(0, Gid::default(), GidType::RoceV2)]),
            None
        );
        assert_eq!(default_gid(&[]), None);
    }

    fn port(n: u8, active: bool, link_layer: LinkLayer) -> PortFacts {
        PortFacts {
            port: n,
            active,
            lid: if link_layer == LinkLayer::InfiniBand {
                0x10 + u16::from(n)
            } else {
                0
            },
            active_mtu: Mtu::Mtu1024,
            link_layer,
            gids: roce_table(),
        }
    }

    fn devices() -> Vec<DeviceFacts> {
        vec![
            DeviceFacts {
                name: "mlx5_0".into(),
                ports: vec![port(1, false, LinkLayer::Ethernet)],
            },
            DeviceFacts {
                name: "mlx5_1".into(),
                ports: vec![
                    port(1, false, LinkLayer::Ethernet),
                    port(2, true, LinkLayer::Ethernet),
                ],
            },
            DeviceFacts {
                name: "mlx4_0".into(),
                ports: vec![port(1, true, LinkLayer::InfiniBand)],
            },
        ]
    }

    fn found(d: Discovery) -> (String, PortInfo) {
        match d {
            Discovery::Found { device, port } => (device, port),
            other => panic!("nothing found: {other:?}"),
        }
    }

    #[test]
    fn default_choice_is_the_first_active_port_and_its_best_gid() {
        let (dev, p) = found(choose(&devices(), &Selection::default()).unwrap());
        assert_eq!((dev.as_str(), p.port, p.gid.index), ("mlx5_1", 2, 3));
        assert_eq!(p.gid.kind, GidType::RoceV2);
    }

    #[test]
    fn explicit_choices_are_followed_and_checked() {
        let sel = Selection::parse(Some("mlx4_0"), None, None).unwrap();
        let (dev, p) = found(choose(&devices(), &sel).unwrap());
        assert_eq!(
            (dev.as_str(), p.port, p.gid.index, p.lid),
            ("mlx4_0", 1, 0, 0x11)
        );
        let sel = Selection::parse(Some("mlx5_1"), Some("2"), Some("5")).unwrap();
        assert_eq!(
            found(choose(&devices(), &sel).unwrap()).1.gid.gid,
            global6()
        );
        for (d, p, g, says) in [
            (
                Some("mlx5_9"),
                None,
                None,
                "devices here: mlx5_0, mlx5_1, mlx4_0",
            ),
            (Some("mlx5_1"), Some("3"), None, "has ports 1, 2"),
            (Some("mlx5_1"), Some("1"), None, "not active"),
            (Some("mlx5_0"), None, None, "no active port"),
            (Some("mlx5_1"), None, Some("9"), "no GID at index 9"),
        ] {
            let e = choose(&devices(), &Selection::parse(d, p, g).unwrap()).unwrap_err();
            assert_eq!(e.class(), ErrorClass::Arg, "{d:?} {p:?} {g:?}");
            assert!(
                e.message().contains(says),
                "{:?} lacks {says:?}",
                e.message()
            );
        }
    }

    #[test]
    fn no_device_is_not_an_error() {
        assert_eq!(
            choose(&[], &Selection::default()).unwrap(),
            Discovery::NoDevice("no RDMA device found".into())
        );
        let down = &devices()[..1];
        assert!(
            matches!(choose(down, &Selection::default()).unwrap(), Discovery::NoDevice(m) if m.contains("active port"))
        );
        assert!(no_device_reason(Some(libc::ENOSYS)).contains("kernel has no RDMA support"));
        assert_eq!(no_device_reason(None), "no RDMA device found");
        assert!(no_device_reason(Some(libc::EACCES)).contains("ibv_get_device_list failed"));
    }

    #[test]
    fn environment_values_are_checked() {
        assert_eq!(
            Selection::parse(None, Some(""), None).unwrap(),
            Selection::default()
        );
        let s = Selection::parse(Some(" mlx5_0 "), Some("2"), Some("3")).unwrap();
        assert_eq!(
            s,
            Selection {
                device: Some("mlx5_0".into()),
                port: Some(2),
                gid_index: Some(3)
            }
        );
        for (d, p, g, names) in [
            (Some("../mlx5_0"), None, None, DEVICE_ENV),
            (None, Some("0"), None, PORT_ENV),
            (None, Some("x"), None, PORT_ENV),
            (None, Some("256"), None, PORT_ENV),
            (None, None, Some("-1"), GID_INDEX_ENV),
            (None, None, Some("300"), GID_INDEX_ENV),
        ] {
            let e = Selection::parse(d, p, g).unwrap_err();
            assert_eq!(e.class(), ErrorClass::Arg);
            assert!(e.message().contains(names), "{}", e.message());
        }
        assert_eq!(parse_gid_type("RoCE v2\n"), Some(GidType::RoceV2));
        assert_eq!(parse_gid_type("IB/RoCE v1"), Some(GidType::IbOrRoceV1));
        assert_eq!(parse_gid_type("?"), None);
    }

    fn roce_port() -> PortInfo {
        PortInfo {
            port: 1,
            lid: 0,
            active_mtu: Mtu::Mtu1024,
            link_layer: LinkLayer::Ethernet,
            gid: entry(3, v4(7), GidType::RoceV2),
        }
    }

    fn rtr(remote_gid: Gid, lid: u16) -> RtrAttr {
        RtrAttr {
            remote: QpAddress {
                gid: remote_gid,
                lid,
                qpn: 0x1234,
                psn: 0x55,
                mtu: Mtu::Mtu4096,
            },
            path_mtu: Mtu::Mtu4096,
            max_dest_rd_atomic: 16,
            min_rnr_timer: 12,
            sgid_index: 3,
            hop_limit: 64,
        }
    }

    #[test]
    fn transition_attributes_carry_what_ibv_modify_qp_requires() {
        use attr_mask::*;
        let init = init_plan(&InitAttr {
            port: 1,
            pkey_index: 0,
            access: AccessFlags::REMOTE_READ,
        })
        .unwrap();
        assert_eq!(init.mask, STATE | PKEY_INDEX | PORT | ACCESS_FLAGS);
        assert_eq!(
            (init.qp_state, init.port_num, init.qp_access_flags),
            (qp_state::INIT, 1, 4)
        );
        assert!(init_plan(&InitAttr {
            port: 1,
            pkey_index: 0,
            access: AccessFlags::LOCAL_WRITE
        })
        .is_err());

        let plan = rtr_plan(&rtr(v4(9), 0), &roce_port()).unwrap();
        assert_eq!(
            plan.mask,
            STATE | AV | PATH_MTU | DEST_QPN | RQ_PSN | MAX_DEST_RD_ATOMIC | MIN_RNR_TIMER
        );
        assert_eq!(
            (plan.qp_state, plan.dest_qp_num, plan.rq_psn),
            (qp_state::RTR, 0x1234, 0x55)
        );
        // The path MTU is the smaller of the two ports'.
        assert_eq!(plan.path_mtu, Mtu::Mtu1024.to_ibv());
        let av = plan.ah.unwrap();
        assert_eq!(av.dlid, 0);
        assert_eq!(
            av.global,
            Some(GlobalRoute {
                dgid: v4(9),
                sgid_index: 3,
                hop_limit: 64
            })
        );
        // RoCE needs the remote's GID.
        assert!(rtr_plan(&rtr(Gid::default(), 0), &roce_port()).is_err());
        // InfiniBand: by LID, no global route.
        let ib = PortInfo {
            link_layer: LinkLayer::InfiniBand,
            lid: 3,
            ..roce_port()
        };
        let av = rtr_plan(&rtr(Gid::default(), 7), &ib).unwrap().ah.unwrap();
        assert_eq!((av.dlid, av.global), (7, None));

        let rts = rts_plan(&RtsAttr {
            sq_psn: 0x66,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 16,
        })
        .unwrap();
        assert_eq!(
            rts.mask,
            STATE | SQ_PSN | TIMEOUT | RETRY_CNT | RNR_RETRY | MAX_QP_RD_ATOMIC
        );
        assert_eq!(
            (rts.qp_state, rts.sq_psn, rts.rnr_retry),
            (qp_state::RTS, 0x66, 7)
        );
        assert!(rts_plan(&RtsAttr {
            sq_psn: 1 << 24,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 1
        })
        .is_err());
    }

    #[test]
    fn ud_queue_pairs_and_address_handles_get_what_verbs_requires() {
        use attr_mask::*;
        let attr = UdAttr {
            port: 1,
            pkey_index: 0,
            qkey: 0x1234_5678,
            sq_psn: 0x77,
        };
        let [init, rtr, rts] = ud_plans(&attr).unwrap();
        assert_eq!(init.mask, STATE | PKEY_INDEX | PORT | QKEY);
        assert_eq!(
            (init.qp_state, init.port_num, init.qkey),
            (qp_state::INIT, 1, 0x1234_5678)
        );
        assert_eq!((rtr.mask, rtr.qp_state), (STATE, qp_state::RTR));
        assert_eq!(
            (rts.mask, rts.qp_state, rts.sq_psn),
            (STATE | SQ_PSN, qp_state::RTS, 0x77)
        );
        for bad in [
            UdAttr { port: 0, ..attr },
            UdAttr {
                sq_psn: 1 << 24,
                ..attr
            },
        ] {
            assert_eq!(ud_plans(&bad).unwrap_err().class(), ErrorClass::Arg);
        }
        // An address handle's vector: by GID on RoCE, by LID on InfiniBand.
        let to = |gid, lid| AhAttr { gid, lid };
        let av = address_vector(&to(v4(9), 0), &roce_port(), 3, 0).unwrap();
        assert_eq!(
            (av.dlid, av.port_num, av.global),
            (
                0,
                1,
                Some(GlobalRoute {
                    dgid: v4(9),
                    sgid_index: 3,
                    hop_limit: 1
                })
            )
        );
        assert!(address_vector(&to(Gid::default(), 0), &roce_port(), 3, 64).is_err());
        let ib = PortInfo {
            link_layer: LinkLayer::InfiniBand,
            lid: 3,
            ..roce_port()
        };
        let av = address_vector(&to(Gid::default(), 7), &ib, 0, 64).unwrap();
        assert_eq!((av.dlid, av.global), (7, None));
    }
}
