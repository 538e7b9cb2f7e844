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
