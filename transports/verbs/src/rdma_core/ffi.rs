//! The calls into libibverbs (through `rdma-sys`) that discovery makes: the
//! device list, each device's ports and GID tables. Every raw pointer is
//! owned by a guard that frees it ([`DeviceList`], [`Context`]); what
//! leaves this module is plain data ([`DeviceFacts`]) for the pure choice
//! in the parent module.
//!
//! The contract relied on (`man ibv_get_device_list`, `ibv_open_device`,
//! `ibv_query_port`, `ibv_query_gid`): the list holds `n` valid device
//! pointers until `ibv_free_device_list`; a context stays valid until
//! `ibv_close_device`; the query calls only write the structure they are
//! given.

use super::{
    choose, no_device_reason, parse_gid_type, DeviceFacts, Discovery, PortFacts, Selection,
    DEVICE_ENV,
};
use crate::provider::{Gid, GidEntry, GidType, LinkLayer, Mtu};
use oxmpi_adi::{vlog, Error, ErrorClass, Result};
use rdma_sys::{
    ___ibv_query_port, ibv_close_device, ibv_context, ibv_device, ibv_device_attr,
    ibv_free_device_list, ibv_get_device_list, ibv_get_device_name, ibv_gid, ibv_open_device,
    ibv_port_attr, ibv_port_state, ibv_query_device, ibv_query_gid,
};
use std::ffi::CStr;
use std::io;

/// `IBV_LINK_LAYER_ETHERNET` (an anonymous enum in verbs.h, which the
/// bindings do not name).
const LINK_LAYER_ETHERNET: u8 = 2;

/// The device list, freed on drop.
struct DeviceList {
    list: *mut *mut ibv_device,
    len: usize,
}

impl DeviceList {
    fn devices(&self) -> impl Iterator<Item = *mut ibv_device> + '_ {
        // SAFETY: the list holds `len` device pointers while it is not freed,
        // which is until `self` is dropped.
        (0..self.len).map(move |i| unsafe { *self.list.add(i) })
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: the list came from ibv_get_device_list and is freed once.
        unsafe { ibv_free_device_list(self.list) };
    }
}

/// An opened device, closed on drop.
struct Context(*mut ibv_context);

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: the context came from ibv_open_device and is closed once.
        unsafe { ibv_close_device(self.0) };
    }
}

/// Looks for the device to use: lists the devices, queries their ports and
/// GID tables, and chooses as `selection` asks. A failed listing (ENOSYS
/// where the kernel has no RDMA support) means no device.
pub(super) fn discover(selection: &Selection) -> Result<Discovery> {
    let mut n: libc::c_int = 0;
    // SAFETY: `n` is valid for writes.
    let list = unsafe { ibv_get_device_list(&mut n) };
    if list.is_null() {
        let reason = no_device_reason(io::Error::last_os_error().raw_os_error());
        return match &selection.device {
            Some(name) => Err(Error::new(
                ErrorClass::Arg,
                format!("{DEVICE_ENV}={name}: {reason}"),
            )),
            None => Ok(Discovery::NoDevice(reason)),
        };
    }
    let list = DeviceList {
        list,
        len: usize::try_from(n).unwrap_or(0),
    };
    let mut facts = Vec::new();
    for device in list.devices() {
        // SAFETY: a device of the live list; its name is a NUL-terminated
        // string owned by the device.
        let name = unsafe { CStr::from_ptr(ibv_get_device_name(device)) }
            .to_string_lossy()
            .into_owned();
        match device_facts(device, &name) {
            Ok(f) => facts.push(f),
            Err(e) => vlog!("verbs: skipping device {name}: {e}"),
        }
    }
    choose(&facts, selection)
}

/// Opens `device` and reads its ports and GID tables.
fn device_facts(device: *mut ibv_device, name: &str) -> io::Result<DeviceFacts> {
    // SAFETY: a device of the live list.
    let raw = unsafe { ibv_open_device(device) };
    if raw.is_null() {
        return Err(io::Error::last_os_error());
    }
    let context = Context(raw);
    // SAFETY: a plain C structure, for which all zeros is a valid value.
    let mut attr: ibv_device_attr = unsafe { std::mem::zeroed() };
    // SAFETY: a live context, and a structure of the type the call writes.
    if unsafe { ibv_query_device(context.0, &mut attr) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut ports = Vec::new();
    for port in 1..=attr.phys_port_cnt {
        // SAFETY: as above.
        let mut pa: ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: a live context, and a structure of the type the call
        // writes.
        if unsafe { ___ibv_query_port(context.0, port, &mut pa) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let link_layer = if pa.link_layer == LINK_LAYER_ETHERNET {
            LinkLayer::Ethernet
        } else {
            LinkLayer::InfiniBand
        };
        let mut gids = Vec::new();
        for index in 0..pa.gid_tbl_len.clamp(0, 256) {
            // SAFETY: as above.
            let mut gid: ibv_gid = unsafe { std::mem::zeroed() };
            // SAFETY: a live context, an index below the table's length, and
            // a union of the type the call writes.
            if unsafe { ibv_query_gid(context.0, port, index, &mut gid) } != 0 {
                continue;
            }
            // SAFETY: every bit pattern is a valid `raw` byte array.
            let gid = Gid(unsafe { gid.raw });
            if gid.is_zero() {
                continue;
            }
            let index = index as u8;
            let kind = std::fs::read_to_string(format!(
                "/sys/class/infiniband/{name}/ports/{port}/gid_attrs/types/{index}"
            ))
            .ok()
            .and_then(|t| parse_gid_type(&t))
            .unwrap_or(GidType::IbOrRoceV1);
            gids.push(GidEntry { index, gid, kind });
        }
        ports.push(PortFacts {
            port,
            active: pa.state == ibv_port_state::IBV_PORT_ACTIVE,
            lid: pa.lid,
            active_mtu: Mtu::from_ibv(pa.active_mtu).unwrap_or(Mtu::Mtu1024),
            link_layer,
            gids,
        });
    }
    Ok(DeviceFacts {
        name: name.to_owned(),
        ports,
    })
}

#[cfg(test)]
mod tests {
    //! The values this crate writes by hand (so that its pure logic builds
    //! without rdma-core) agree with rdma-core's own headers.

    use super::super::{attr_mask, qp_state};
    use crate::provider::{AccessFlags, Mtu, WcStatus};
    use rdma_sys::{ibv_access_flags, ibv_mtu, ibv_qp_attr_mask, ibv_qp_state, ibv_wc_status};

    #[test]
    fn attribute_masks_and_states_match_verbs_h() {
        for (ours, theirs) in [
            (attr_mask::STATE, ibv_qp_attr_mask::IBV_QP_STATE),
            (
                attr_mask::ACCESS_FLAGS,
                ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS,
            ),
            (attr_mask::PKEY_INDEX, ibv_qp_attr_mask::IBV_QP_PKEY_INDEX),
            (attr_mask::PORT, ibv_qp_attr_mask::IBV_QP_PORT),
            (attr_mask::QKEY, ibv_qp_attr_mask::IBV_QP_QKEY),
            (attr_mask::AV, ibv_qp_attr_mask::IBV_QP_AV),
            (attr_mask::PATH_MTU, ibv_qp_attr_mask::IBV_QP_PATH_MTU),
            (attr_mask::TIMEOUT, ibv_qp_attr_mask::IBV_QP_TIMEOUT),
            (attr_mask::RETRY_CNT, ibv_qp_attr_mask::IBV_QP_RETRY_CNT),
            (attr_mask::RNR_RETRY, ibv_qp_attr_mask::IBV_QP_RNR_RETRY),
            (attr_mask::RQ_PSN, ibv_qp_attr_mask::IBV_QP_RQ_PSN),
            (
                attr_mask::MAX_QP_RD_ATOMIC,
                ibv_qp_attr_mask::IBV_QP_MAX_QP_RD_ATOMIC,
            ),
            (
                attr_mask::MIN_RNR_TIMER,
                ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER,
            ),
            (attr_mask::SQ_PSN, ibv_qp_attr_mask::IBV_QP_SQ_PSN),
            (
                attr_mask::MAX_DEST_RD_ATOMIC,
                ibv_qp_attr_mask::IBV_QP_MAX_DEST_RD_ATOMIC,
            ),
            (attr_mask::DEST_QPN, ibv_qp_attr_mask::IBV_QP_DEST_QPN),
        ] {
            assert_eq!(ours, theirs.0);
        }
        assert_eq!(qp_state::INIT, ibv_qp_state::IBV_QPS_INIT);
        assert_eq!(qp_state::RTR, ibv_qp_state::IBV_QPS_RTR);
        assert_eq!(qp_state::RTS, ibv_qp_state::IBV_QPS_RTS);
    }

    #[test]
    fn access_flags_statuses_and_mtus_match_verbs_h() {
        for (ours, theirs) in [
            (
                AccessFlags::LOCAL_WRITE,
                ibv_access_flags::IBV_ACCESS_LOCAL_WRITE,
            ),
            (
                AccessFlags::REMOTE_WRITE,
                ibv_access_flags::IBV_ACCESS_REMOTE_WRITE,
            ),
            (
                AccessFlags::REMOTE_READ,
                ibv_access_flags::IBV_ACCESS_REMOTE_READ,
            ),
            (
                AccessFlags::REMOTE_ATOMIC,
                ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC,
            ),
        ] {
            assert_eq!(ours.bits(), theirs.0);
        }
        for (ours, theirs) in [
            (WcStatus::Success, ibv_wc_status::IBV_WC_SUCCESS),
            (WcStatus::LocLenErr, ibv_wc_status::IBV_WC_LOC_LEN_ERR),
            (WcStatus::LocQpOpErr, ibv_wc_status::IBV_WC_LOC_QP_OP_ERR),
            (WcStatus::LocProtErr, ibv_wc_status::IBV_WC_LOC_PROT_ERR),
            (WcStatus::WrFlushErr, ibv_wc_status::IBV_WC_WR_FLUSH_ERR),
            (WcStatus::BadRespErr, ibv_wc_status::IBV_WC_BAD_RESP_ERR),
            (WcStatus::LocAccessErr, ibv_wc_status::IBV_WC_LOC_ACCESS_ERR),
            (
                WcStatus::RemInvReqErr,
                ibv_wc_status::IBV_WC_REM_INV_REQ_ERR,
            ),
            (WcStatus::RemAccessErr, ibv_wc_status::IBV_WC_REM_ACCESS_ERR),
            (WcStatus::RemOpErr, ibv_wc_status::IBV_WC_REM_OP_ERR),
            (WcStatus::RetryExcErr, ibv_wc_status::IBV_WC_RETRY_EXC_ERR),
            (
                WcStatus::RnrRetryExcErr,
                ibv_wc_status::IBV_WC_RNR_RETRY_EXC_ERR,
            ),
            (WcStatus::GeneralErr, ibv_wc_status::IBV_WC_GENERAL_ERR),
        ] {
            assert_eq!(ours as u32, theirs);
            assert_eq!(WcStatus::from_ibv(theirs), ours);
        }
        for (ours, theirs) in [
            (Mtu::Mtu256, ibv_mtu::IBV_MTU_256),
            (Mtu::Mtu1024, ibv_mtu::IBV_MTU_1024),
            (Mtu::Mtu4096, ibv_mtu::IBV_MTU_4096),
        ] {
            assert_eq!(ours.to_ibv(), theirs);
        }
    }
}
