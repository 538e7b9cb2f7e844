//! The rdma-core [`Nic`]: the provider interface over libibverbs (through
//! `rdma-sys`). Each verbs object is owned by a handle that destroys it on
//! drop and holds what it was created from (a queue pair its domain,
//! completion queues and SRQ), so nothing is destroyed while in use.
//!
//! Not yet run on a device (the project's machines have none): the opt-in
//! test `tests/hw.rs` exercises it where one exists.
//!
//! The contract relied on (rdma-core's man pages): libibverbs objects may
//! be used from several threads at once ("libibverbs is thread safe");
//! `ibv_post_send` with `IBV_SEND_INLINE` copies the data before it
//! returns; the other posts only record addresses, which are named by
//! registrations whose memory the registrant keeps valid (the contract of
//! [`Nic::register`]).

use super::{
    address_vector, attr_mask, discover, init_plan, rtr_plan, rts_plan, ud_plans, AddressVector,
    Discovery, QpAttrPlan, Selection,
};
use crate::provider::{
    check_transition, AccessFlags, AhAttr, CompletionChannel, CompletionQueue, InitAttr,
    MemoryRegion, Nic, PartialPost, PortInfo, PostError, QpAddress, QpInit, QpState, QueuePair,
    RecvWr, RtrAttr, RtsAttr, SendOp, SendWr, Sge, SharedReceiveQueue, UdAttr, UdQueuePair,
    UdSendWr, WcOpcode, WcStatus, WorkCompletion,
};
use oxmpi_adi::{Error, ErrorClass, Result};
use rdma_sys::{
    ibv_ack_cq_events, ibv_ah, ibv_ah_attr, ibv_alloc_pd, ibv_close_device, ibv_comp_channel,
    ibv_context, ibv_cq, ibv_create_ah, ibv_create_comp_channel, ibv_create_cq, ibv_create_qp,
    ibv_create_srq, ibv_dealloc_pd, ibv_dereg_mr, ibv_destroy_ah, ibv_destroy_comp_channel,
    ibv_destroy_cq, ibv_destroy_qp, ibv_destroy_srq, ibv_free_device_list, ibv_get_cq_event,
    ibv_get_device_list, ibv_get_device_name, ibv_modify_qp, ibv_mr, ibv_open_device, ibv_pd,
    ibv_poll_cq, ibv_post_recv, ibv_post_send, ibv_post_srq_recv, ibv_qp, ibv_qp_attr,
    ibv_qp_init_attr, ibv_qp_state, ibv_qp_type, ibv_query_qp, ibv_recv_wr, ibv_reg_mr,
    ibv_req_notify_cq, ibv_send_wr, ibv_sge, ibv_srq, ibv_srq_init_attr, ibv_wc, ibv_wc_opcode,
    ibv_wr_opcode,
};
use std::ffi::CStr;
use std::ptr::null_mut;
use std::sync::{Arc, Mutex};

/// `IBV_SEND_SIGNALED`.
const SEND_SIGNALED: u32 = 1 << 1;
/// `IBV_SEND_INLINE`.
const SEND_INLINE: u32 = 1 << 3;

fn os_error(what: &str, errno: i32) -> Error {
    Error::os(what, std::io::Error::from_raw_os_error(errno))
}

fn last_os_error(what: &str) -> Error {
    Error::os(what, std::io::Error::last_os_error())
}

/// An opened device.
struct Context(*mut ibv_context);

// SAFETY: libibverbs objects may be used from any thread (rdma-core:
// "libibverbs is thread safe"); the pointer is only freed on drop.
unsafe impl Send for Context {}
// SAFETY: as above.
unsafe impl Sync for Context {}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: opened by ibv_open_device, closed once, after every object
        // made from it (each holds an Arc of it).
        unsafe { ibv_close_device(self.0) };
    }
}

/// An RDMA device opened through rdma-core, on the port discovery chose.
pub struct RdmaNic {
    context: Arc<Context>,
    name: String,
    port: PortInfo,
}

impl RdmaNic {
    /// Opens the device and port `selection` leads to; `Ok(None)` when
    /// there is none (the reason is shown under `OXMPI_VERBOSE=1`).
    pub fn open(selection: &Selection) -> Result<Option<RdmaNic>> {
        let (name, port) = match discover(selection)? {
            Discovery::NoDevice(_) => return Ok(None),
            Discovery::Found { device, port } => (device, port),
        };
        let mut n = 0;
        // SAFETY: `n` is valid for writes.
        let list = unsafe { ibv_get_device_list(&mut n) };
        if list.is_null() {
            return Err(last_os_error("listing RDMA devices"));
        }
        let mut context = null_mut();
        let mut found = false;
        for i in 0..usize::try_from(n).unwrap_or(0) {
            // SAFETY: the list holds `n` devices until it is freed below;
            // a device's name is a NUL-terminated string it owns.
            let device = unsafe { *list.add(i) };
            // SAFETY: as above.
            let device_name = unsafe { CStr::from_ptr(ibv_get_device_name(device)) };
            if device_name.to_bytes() == name.as_bytes() {
                found = true;
                // SAFETY: a device of the live list.
                context = unsafe { ibv_open_device(device) };
                break;
            }
        }
        let opened = if found && context.is_null() {
            Err(last_os_error(&format!("opening RDMA device {name}")))
        } else if context.is_null() {
            Err(Error::new(
                ErrorClass::Other,
                format!("RDMA device {name} disappeared while it was being opened"),
            ))
        } else {
            Ok(Context(context))
        };
        // SAFETY: the list came from ibv_get_device_list; an opened device
        // stays valid after the list is freed.
        unsafe { ibv_free_device_list(list) };
        Ok(Some(RdmaNic {
            context: Arc::new(opened?),
            name,
            port,
        }))
    }
}

/// A protection domain.
pub struct RdmaPd(Arc<PdHandle>);

struct PdHandle {
    pd: *mut ibv_pd,
    _context: Arc<Context>,
}

// SAFETY: see `Context`.
unsafe impl Send for PdHandle {}
// SAFETY: see `Context`.
unsafe impl Sync for PdHandle {}

impl Drop for PdHandle {
    fn drop(&mut self) {
        // SAFETY: allocated by ibv_alloc_pd, freed once, after every object
        // made in it (each holds an Arc of it).
        unsafe { ibv_dealloc_pd(self.pd) };
    }
}

/// A memory registration; dropping it deregisters.
pub struct RdmaMr {
    mr: *mut ibv_mr,
    _pd: Arc<PdHandle>,
}

// SAFETY: see `Context`.
unsafe impl Send for RdmaMr {}
// SAFETY: see `Context`.
unsafe impl Sync for RdmaMr {}

impl RdmaMr {
    fn get(&self) -> &ibv_mr {
        // SAFETY: the registration lives until `self` is dropped.
        unsafe { &*self.mr }
    }
}

impl MemoryRegion for RdmaMr {
    fn lkey(&self) -> u32 {
        self.get().lkey
    }
    fn rkey(&self) -> u32 {
        self.get().rkey
    }
    fn addr(&self) -> u64 {
        self.get().addr as u64
    }
    fn len(&self) -> usize {
        self.get().length
    }
}

impl Drop for RdmaMr {
    fn drop(&mut self) {
        // SAFETY: registered by ibv_reg_mr, deregistered once.
        unsafe { ibv_dereg_mr(self.mr) };
    }
}

/// A completion queue.
pub struct RdmaCq(Arc<CqHandle>);

struct CqHandle {
    cq: *mut ibv_cq,
    /// Its channel, destroyed after it.
    channel: Option<Arc<ChannelHandle>>,
    _context: Arc<Context>,
}

/// A completion channel: its descriptor is non-blocking, so taking its
/// events never waits.
pub struct RdmaChannel(Arc<ChannelHandle>);

struct ChannelHandle {
    channel: *mut ibv_comp_channel,
    _context: Arc<Context>,
}

// SAFETY: see `Context`.
unsafe impl Send for ChannelHandle {}
// SAFETY: see `Context`.
unsafe impl Sync for ChannelHandle {}

impl Drop for ChannelHandle {
    fn drop(&mut self) {
        // SAFETY: created by ibv_create_comp_channel, destroyed once, after
        // the completion queues made on it (each holds an Arc of it), whose
        // events were all acknowledged (`drain` acknowledges each).
        unsafe { ibv_destroy_comp_channel(self.channel) };
    }
}

impl CompletionChannel for RdmaChannel {
    fn fd(&self) -> std::os::fd::RawFd {
        // SAFETY: the channel lives until `self` is dropped.
        unsafe { (*self.0.channel).fd }
    }

    fn drain(&self) -> Result<u32> {
        let mut events = 0u32;
        loop {
            let mut cq = null_mut();
            let mut context = null_mut();
            // SAFETY: a live channel whose descriptor is non-blocking: the
            // call returns at once, writing the two pointers on success.
            if unsafe { ibv_get_cq_event(self.0.channel, &mut cq, &mut context) } != 0 {
                let e = std::io::Error::last_os_error();
                return match e.kind() {
                    std::io::ErrorKind::WouldBlock => Ok(events),
                    _ => Err(Error::os("taking completion events (ibv_get_cq_event)", e)),
                };
            }
            // SAFETY: `cq` is the live completion queue the event came
            // from (made on this channel, kept alive by its handle, which
            // holds the channel); each event is acknowledged once.
            unsafe { ibv_ack_cq_events(cq, 1) };
            events = events.saturating_add(1);
        }
    }
}

// SAFETY: see `Context`.
unsafe impl Send for CqHandle {}
// SAFETY: see `Context`.
unsafe impl Sync for CqHandle {}

impl Drop for CqHandle {
    fn drop(&mut self) {
        // SAFETY: created by ibv_create_cq, destroyed once, after the queue
        // pairs that use it (each holds an Arc of it).
        unsafe { ibv_destroy_cq(self.cq) };
    }
}

fn wc_opcode(opcode: u32) -> WcOpcode {
    match opcode {
        ibv_wc_opcode::IBV_WC_RDMA_WRITE => WcOpcode::RdmaWrite,
        ibv_wc_opcode::IBV_WC_RDMA_READ => WcOpcode::RdmaRead,
        ibv_wc_opcode::IBV_WC_COMP_SWAP => WcOpcode::CompareSwap,
        ibv_wc_opcode::IBV_WC_FETCH_ADD => WcOpcode::FetchAdd,
        ibv_wc_opcode::IBV_WC_RECV => WcOpcode::Recv,
        _ => WcOpcode::Send,
    }
}

impl CompletionQueue for RdmaCq {
    fn poll(&self, max: usize, out: &mut Vec<WorkCompletion>) -> Result<usize> {
        let max = max.min(64);
        // SAFETY: a plain C structure (integers and a union of integers),
        // for which all zeros is a valid value.
        let mut wcs: Vec<ibv_wc> = (0..max).map(|_| unsafe { std::mem::zeroed() }).collect();
        // SAFETY: a live CQ, and room for `max` completions.
        let n = unsafe { ibv_poll_cq(self.0.cq, max as i32, wcs.as_mut_ptr()) };
        if n < 0 {
            return Err(Error::new(
                ErrorClass::Other,
                format!("ibv_poll_cq failed ({n})"),
            ));
        }
        let n = n as usize;
        out.extend(wcs[..n].iter().map(|wc| WorkCompletion {
            wr_id: wc.wr_id,
            status: WcStatus::from_ibv(wc.status),
            opcode: wc_opcode(wc.opcode),
            byte_len: wc.byte_len,
            qp_num: wc.qp_num,
        }));
        Ok(n)
    }

    fn req_notify(&self) -> Result<()> {
        if self.0.channel.is_none() {
            return Err(Error::new(
                ErrorClass::Arg,
                "req_notify on a completion queue made without a completion channel",
            ));
        }
        // SAFETY: a live completion queue, made on a channel.
        let rc = unsafe { ibv_req_notify_cq(self.0.cq, 0) };
        if rc != 0 {
            return Err(os_error("ibv_req_notify_cq", rc));
        }
        Ok(())
    }
}

/// A shared receive queue.
pub struct RdmaSrq(Arc<SrqHandle>);

struct SrqHandle {
    srq: *mut ibv_srq,
    _pd: Arc<PdHandle>,
}

// SAFETY: see `Context`.
unsafe impl Send for SrqHandle {}
// SAFETY: see `Context`.
unsafe impl Sync for SrqHandle {}

impl Drop for SrqHandle {
    fn drop(&mut self) {
        // SAFETY: created by ibv_create_srq, destroyed once, after the queue
        // pairs attached to it (each holds an Arc of it).
        unsafe { ibv_destroy_srq(self.srq) };
    }
}

fn ibv_sge_of(sge: &Sge) -> ibv_sge {
    ibv_sge {
        addr: sge.addr,
        length: sge.length,
        lkey: sge.lkey,
    }
}

/// The `ibv_send_wr` of a request and its one SGE, to be linked by the
/// caller (`sg_list` and `next` are null). Inline data is named by its
/// address, which must stay valid through the post that copies it.
fn ibv_send_wr_of(wr: &SendWr<'_>) -> (ibv_sge, ibv_send_wr) {
    // SAFETY: a plain C structure (integers, pointers and unions of
    // them), for which all zeros is a valid value.
    let mut send: ibv_send_wr = unsafe { std::mem::zeroed() };
    send.wr_id = wr.wr_id;
    send.num_sge = 1;
    send.send_flags = if wr.signaled { SEND_SIGNALED } else { 0 };
    let inline = |data: &[u8]| ibv_sge {
        addr: data.as_ptr() as u64,
        length: data.len() as u32,
        lkey: 0,
    };
    let sge = match wr.op {
        SendOp::Send(sge) => {
            send.opcode = ibv_wr_opcode::IBV_WR_SEND;
            ibv_sge_of(&sge)
        }
        SendOp::SendInline(data) => {
            send.opcode = ibv_wr_opcode::IBV_WR_SEND;
            send.send_flags |= SEND_INLINE;
            inline(data)
        }
        SendOp::RdmaWrite { local, remote } => {
            send.opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE;
            send.wr.rdma.remote_addr = remote.addr;
            send.wr.rdma.rkey = remote.rkey;
            ibv_sge_of(&local)
        }
        SendOp::RdmaWriteInline { data, remote } => {
            send.opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE;
            send.send_flags |= SEND_INLINE;
            send.wr.rdma.remote_addr = remote.addr;
            send.wr.rdma.rkey = remote.rkey;
            inline(data)
        }
        SendOp::RdmaRead { local, remote } => {
            send.opcode = ibv_wr_opcode::IBV_WR_RDMA_READ;
            send.wr.rdma.remote_addr = remote.addr;
            send.wr.rdma.rkey = remote.rkey;
            ibv_sge_of(&local)
        }
        SendOp::FetchAdd { local, remote, add } => {
            send.opcode = ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD;
            send.wr.atomic.remote_addr = remote.addr;
            send.wr.atomic.rkey = remote.rkey;
            send.wr.atomic.compare_add = add;
            ibv_sge_of(&local)
        }
        SendOp::CompareSwap {
            local,
            remote,
            compare,
            swap,
        } => {
            send.opcode = ibv_wr_opcode::IBV_WR_ATOMIC_CMP_AND_SWP;
            send.wr.atomic.remote_addr = remote.addr;
            send.wr.atomic.rkey = remote.rkey;
            send.wr.atomic.compare_add = compare;
            send.wr.atomic.swap = swap;
            ibv_sge_of(&local)
        }
    };
    (sge, send)
}

/// Turns a post's return value into the provider interface's outcome.
fn posted(rc: i32, what: &str) -> std::result::Result<(), PostError> {
    match rc {
        0 => Ok(()),
        libc::ENOMEM => Err(PostError::QueueFull),
        e => Err(PostError::Invalid(os_error(what, e))),
    }
}

/// Posts one receive through `post` (`ibv_post_recv` or `ibv_post_srq_recv`).
fn post_receive(
    wr: &RecvWr,
    post: impl FnOnce(*mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> i32,
) -> std::result::Result<(), PostError> {
    let mut sge = ibv_sge_of(&wr.sge);
    let mut recv = ibv_recv_wr {
        wr_id: wr.wr_id,
        next: null_mut(),
        sg_list: &mut sge,
        num_sge: 1,
    };
    let mut bad = null_mut();
    posted(post(&mut recv, &mut bad), "posting a receive")
}

impl SharedReceiveQueue for RdmaSrq {
    fn post_recv(&self, wr: &RecvWr) -> std::result::Result<(), PostError> {
        // SAFETY: a live SRQ; the request and its SGE live through the call,
        // which copies them.
        post_receive(wr, |w, bad| unsafe {
            ibv_post_srq_recv(self.0.srq, w, bad)
        })
    }
}

/// A reliable-connected queue pair.
pub struct RdmaQp {
    qp: *mut ibv_qp,
    psn: u32,
    port: PortInfo,
    /// The last state set by `modify` (the device may have moved on).
    state: Mutex<QpState>,
    max_inline_data: u32,
    has_srq: bool,
    _pd: Arc<PdHandle>,
    _cqs: [Arc<CqHandle>; 2],
    _srq: Option<Arc<SrqHandle>>,
}

// SAFETY: see `Context`.
unsafe impl Send for RdmaQp {}
// SAFETY: see `Context`.
unsafe impl Sync for RdmaQp {}

impl Drop for RdmaQp {
    fn drop(&mut self) {
        // SAFETY: created by ibv_create_qp, destroyed once, before its
        // domain, CQs and SRQ (held by this handle).
        unsafe { ibv_destroy_qp(self.qp) };
    }
}

/// The `struct ibv_ah_attr` of an address vector.
fn ah_attr(av: &AddressVector) -> ibv_ah_attr {
    // SAFETY: a plain C structure, for which all zeros is a valid value.
    let mut a: ibv_ah_attr = unsafe { std::mem::zeroed() };
    a.dlid = av.dlid;
    a.port_num = av.port_num;
    if let Some(g) = av.global {
        a.is_global = 1;
        a.grh.dgid.raw = g.dgid.0;
        a.grh.sgid_index = g.sgid_index;
        a.grh.hop_limit = g.hop_limit;
    }
    a
}

/// The `struct ibv_qp_attr` and mask of a plan.
fn qp_attr(plan: &QpAttrPlan) -> (ibv_qp_attr, i32) {
    // SAFETY: a plain C structure, for which all zeros is a valid value.
    let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
    a.qp_state = plan.qp_state;
    a.pkey_index = plan.pkey_index;
    a.port_num = plan.port_num;
    a.qp_access_flags = plan.qp_access_flags;
    a.qkey = plan.qkey;
    a.path_mtu = plan.path_mtu;
    a.dest_qp_num = plan.dest_qp_num;
    a.rq_psn = plan.rq_psn;
    a.max_dest_rd_atomic = plan.max_dest_rd_atomic;
    a.min_rnr_timer = plan.min_rnr_timer;
    if let Some(av) = plan.ah {
        a.ah_attr = ah_attr(&av);
    }
    a.sq_psn = plan.sq_psn;
    a.timeout = plan.timeout;
    a.retry_cnt = plan.retry_cnt;
    a.rnr_retry = plan.rnr_retry;
    a.max_rd_atomic = plan.max_rd_atomic;
    (a, plan.mask as i32)
}

/// The state of `qp` as the device reports it (`ibv_query_qp`), or `None`
/// when the query fails.
fn query_state(qp: *mut ibv_qp) -> Option<QpState> {
    // SAFETY: plain C structures, for which all zeros is a valid value.
    let (mut attr, mut init): (ibv_qp_attr, ibv_qp_init_attr) =
        unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
    // SAFETY: the caller's queue pair is live, and the structures are of
    // the types the call writes.
    let rc = unsafe { ibv_query_qp(qp, &mut attr, attr_mask::STATE as i32, &mut init) };
    if rc != 0 {
        return None;
    }
    Some(match attr.qp_state {
        ibv_qp_state::IBV_QPS_RESET => QpState::Reset,
        ibv_qp_state::IBV_QPS_INIT => QpState::Init,
        ibv_qp_state::IBV_QPS_RTR => QpState::Rtr,
        ibv_qp_state::IBV_QPS_RTS => QpState::Rts,
        // ERR, and SQE (a send-queue error); SQD is never asked for.
        _ => QpState::Error,
    })
}

/// Creates a queue pair of `qp_type` in `pd` (`ibv_create_qp`); returns it
/// and the `max_inline_data` the device granted.
fn create_raw_qp(
    pd: &RdmaPd,
    init: &QpInit<'_, RdmaNic>,
    qp_type: u32,
) -> Result<(*mut ibv_qp, u32)> {
    // SAFETY: a plain C structure, for which all zeros is a valid value.
    let mut attr: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
    attr.send_cq = init.send_cq.0.cq;
    attr.recv_cq = init.recv_cq.0.cq;
    attr.srq = init.srq.map_or(null_mut(), |s| s.0.srq);
    attr.qp_type = qp_type;
    attr.cap.max_send_wr = init.caps.max_send_wr;
    attr.cap.max_recv_wr = init.caps.max_recv_wr;
    attr.cap.max_send_sge = 1;
    attr.cap.max_recv_sge = 1;
    attr.cap.max_inline_data = init.caps.max_inline_data;
    // SAFETY: a live domain, CQs and SRQ, and an attribute structure
    // that outlives the call.
    let qp = unsafe { ibv_create_qp(pd.0.pd, &mut attr) };
    if qp.is_null() {
        return Err(last_os_error("ibv_create_qp"));
    }
    Ok((qp, attr.cap.max_inline_data))
}

/// Applies one transition plan to `qp` (`ibv_modify_qp`).
fn modify_raw(qp: *mut ibv_qp, to: QpState, plan: &QpAttrPlan) -> Result<()> {
    let (mut attr, mask) = qp_attr(plan);
    // SAFETY: the caller's queue pair is live; the call only reads the
    // attribute structure.
    let rc = unsafe { ibv_modify_qp(qp, &mut attr, mask) };
    if rc != 0 {
        return Err(os_error(&format!("ibv_modify_qp to {to:?}"), rc));
    }
    Ok(())
}

impl RdmaQp {
    /// Refuses a request with more inline data than the queue pair takes.
    fn check_inline(&self, wr: &SendWr<'_>) -> std::result::Result<(), PostError> {
        if let SendOp::SendInline(data) | SendOp::RdmaWriteInline { data, .. } = wr.op {
            if data.len() > self.max_inline_data as usize {
                return Err(PostError::Invalid(Error::new(
                    ErrorClass::Arg,
                    format!(
                        "inline data of {} bytes, above the queue pair's max_inline_data {}",
                        data.len(),
                        self.max_inline_data
                    ),
                )));
            }
        }
        Ok(())
    }

    fn modify(&self, to: QpState, plan: Result<QpAttrPlan>) -> Result<()> {
        let current = self.state();
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        check_transition(current, to)?;
        modify_raw(self.qp, to, &plan?)?;
        *state = to;
        Ok(())
    }
}

impl QueuePair for RdmaQp {
    fn qp_num(&self) -> u32 {
        // SAFETY: the queue pair lives until `self` is dropped.
        unsafe { (*self.qp).qp_num }
    }

    /// The state the device reports (`ibv_query_qp`): a queue pair goes
    /// to ERROR by itself when a request fails. The last state set, if the
    /// query fails.
    fn state(&self) -> QpState {
        let last = *self.state.lock().unwrap_or_else(|e| e.into_inner());
        query_state(self.qp).unwrap_or(last)
    }

    fn address(&self) -> QpAddress {
        QpAddress {
            gid: self.port.gid.gid,
            lid: self.port.lid,
            qpn: self.qp_num(),
            psn: self.psn,
            mtu: self.port.active_mtu,
        }
    }

    fn modify_to_init(&self, attr: &InitAttr) -> Result<()> {
        self.modify(QpState::Init, init_plan(attr))
    }

    fn modify_to_rtr(&self, attr: &RtrAttr) -> Result<()> {
        self.modify(QpState::Rtr, rtr_plan(attr, &self.port))
    }

    fn modify_to_rts(&self, attr: &RtsAttr) -> Result<()> {
        self.modify(QpState::Rts, rts_plan(attr))
    }

    /// The requests as one linked list of `ibv_send_wr` in one
    /// `ibv_post_send`. A request with more inline data than the queue
    /// pair takes is refused here, with those before it posted: some
    /// devices refuse it with ENOMEM, which would read as a full queue.
    fn post_send_list(&self, wrs: &[SendWr<'_>]) -> std::result::Result<(), PartialPost> {
        let refusal = wrs
            .iter()
            .enumerate()
            .find_map(|(at, wr)| self.check_inline(wr).err().map(|e| (at, e)));
        let valid = refusal.as_ref().map_or(wrs.len(), |&(at, _)| at);
        if valid > 0 {
            let (mut sges, mut sends): (Vec<ibv_sge>, Vec<ibv_send_wr>) =
                wrs[..valid].iter().map(ibv_send_wr_of).unzip();
            let first = sends.as_mut_ptr();
            let sge_list = sges.as_mut_ptr();
            for i in 0..valid {
                // SAFETY: `i` and `i + 1` (only when below `valid`) are in
                // both vectors, which are not touched otherwise until the
                // post, so the pointers derived from `first` and
                // `sge_list` stay valid through it.
                unsafe {
                    let send = first.add(i);
                    (*send).sg_list = sge_list.add(i);
                    (*send).next = if i + 1 < valid {
                        first.add(i + 1)
                    } else {
                        null_mut()
                    };
                }
            }
            let mut bad = null_mut();
            // SAFETY: a live queue pair; the list (linked above) and its
            // SGEs live through the call, which copies them (and inline
            // data); other SGEs name registered memory, which the
            // registrant keeps valid.
            let rc = unsafe { ibv_post_send(self.qp, first, &mut bad) };
            if let Err(error) = posted(rc, "posting a list of send requests") {
                // `bad_wr` names the first request not posted (rdma-core
                // always sets it; were it not set, nothing counts as
                // posted).
                let posted = (bad as usize)
                    .checked_sub(first as usize)
                    .map_or(0, |bytes| bytes / std::mem::size_of::<ibv_send_wr>());
                return Err(PartialPost {
                    posted: posted.min(valid),
                    error,
                });
            }
        }
        match refusal {
            Some((posted, error)) => Err(PartialPost { posted, error }),
            None => Ok(()),
        }
    }

    fn post_recv(&self, wr: &RecvWr) -> std::result::Result<(), PostError> {
        if self.has_srq {
            return Err(PostError::Invalid(Error::new(
                ErrorClass::Arg,
                "post_recv on a queue pair that takes its receives from a shared receive queue",
            )));
        }
        // SAFETY: a live queue pair; the request and its SGE live through
        // the call, which copies them.
        post_receive(wr, |w, bad| unsafe { ibv_post_recv(self.qp, w, bad) })
    }
}

impl Nic for RdmaNic {
    type Pd = RdmaPd;
    type Mr = RdmaMr;
    type Cq = RdmaCq;
    type Srq = RdmaSrq;
    type Qp = RdmaQp;
    type Ah = RdmaAh;
    type Ud = RdmaUd;
    type Channel = RdmaChannel;

    fn name(&self) -> &str {
        &self.name
    }

    fn port(&self) -> &PortInfo {
        &self.port
    }

    fn alloc_pd(&self) -> Result<RdmaPd> {
        // SAFETY: a live context.
        let pd = unsafe { ibv_alloc_pd(self.context.0) };
        if pd.is_null() {
            return Err(last_os_error("ibv_alloc_pd"));
        }
        Ok(RdmaPd(Arc::new(PdHandle {
            pd,
            _context: self.context.clone(),
        })))
    }

    unsafe fn register(
        &self,
        pd: &RdmaPd,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<RdmaMr> {
        access.check_for_mr()?;
        // SAFETY: a live domain; the caller keeps the memory valid until the
        // registration is dropped (this function's contract).
        let mr = unsafe { ibv_reg_mr(pd.0.pd, addr.cast(), len, access.bits() as i32) };
        if mr.is_null() {
            return Err(last_os_error(&format!(
                "registering {len} bytes with ibv_reg_mr"
            )));
        }
        Ok(RdmaMr {
            mr,
            _pd: pd.0.clone(),
        })
    }

    fn create_comp_channel(&self) -> Result<RdmaChannel> {
        // SAFETY: a live context.
        let channel = unsafe { ibv_create_comp_channel(self.context.0) };
        if channel.is_null() {
            return Err(last_os_error("ibv_create_comp_channel"));
        }
        let handle = ChannelHandle {
            channel,
            _context: self.context.clone(),
        };
        // SAFETY: the channel is live; fcntl on its descriptor takes no
        // pointers.
        let nonblocking = unsafe {
            let fd = (*channel).fd;
            let flags = libc::fcntl(fd, libc::F_GETFL);
            flags >= 0 && libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) == 0
        };
        if !nonblocking {
            return Err(last_os_error(
                "making a completion channel's descriptor non-blocking",
            ));
        }
        Ok(RdmaChannel(Arc::new(handle)))
    }

    fn create_cq(&self, capacity: u32, channel: Option<&RdmaChannel>) -> Result<RdmaCq> {
        let cqe = i32::try_from(capacity.max(1)).unwrap_or(i32::MAX);
        let raw_channel = channel.map_or(null_mut(), |c| c.0.channel);
        // SAFETY: a live context, and a live channel or none.
        let cq = unsafe { ibv_create_cq(self.context.0, cqe, null_mut(), raw_channel, 0) };
        if cq.is_null() {
            return Err(last_os_error("ibv_create_cq"));
        }
        Ok(RdmaCq(Arc::new(CqHandle {
            cq,
            channel: channel.map(|c| c.0.clone()),
            _context: self.context.clone(),
        })))
    }

    fn create_srq(&self, pd: &RdmaPd, max_wr: u32) -> Result<RdmaSrq> {
        // SAFETY: a plain C structure, for which all zeros is a valid value.
        let mut init: ibv_srq_init_attr = unsafe { std::mem::zeroed() };
        init.attr.max_wr = max_wr;
        init.attr.max_sge = 1;
        // SAFETY: a live domain and an attribute structure that outlives the
        // call.
        let srq = unsafe { ibv_create_srq(pd.0.pd, &mut init) };
        if srq.is_null() {
            return Err(last_os_error("ibv_create_srq"));
        }
        Ok(RdmaSrq(Arc::new(SrqHandle {
            srq,
            _pd: pd.0.clone(),
        })))
    }

    fn create_qp(&self, pd: &RdmaPd, init: &QpInit<'_, Self>) -> Result<RdmaQp> {
        let mut random = [0u8; 4];
        getrandom::getrandom(&mut random)
            .map_err(|e| Error::new(ErrorClass::Other, format!("no random PSN: {e}")))?;
        let (qp, max_inline_data) = create_raw_qp(pd, init, ibv_qp_type::IBV_QPT_RC)?;
        Ok(RdmaQp {
            qp,
            psn: u32::from_le_bytes(random) & 0xff_ffff,
            port: self.port.clone(),
            state: Mutex::new(QpState::Reset),
            // What the device granted, which may exceed what was asked.
            max_inline_data,
            has_srq: init.srq.is_some(),
            _pd: pd.0.clone(),
            _cqs: [init.send_cq.0.clone(), init.recv_cq.0.clone()],
            _srq: init.srq.map(|s| s.0.clone()),
        })
    }

    fn create_ud(&self, pd: &RdmaPd, init: &QpInit<'_, Self>) -> Result<RdmaUd> {
        if init.srq.is_some() {
            return Err(Error::new(
                ErrorClass::Arg,
                "a UD queue pair takes its receives from its own queue, not a shared one",
            ));
        }
        let (qp, _) = create_raw_qp(pd, init, ibv_qp_type::IBV_QPT_UD)?;
        Ok(RdmaUd {
            qp,
            port: self.port.clone(),
            state: Mutex::new(QpState::Reset),
            _pd: pd.0.clone(),
            _cqs: [init.send_cq.0.clone(), init.recv_cq.0.clone()],
        })
    }

    fn create_ah(&self, pd: &RdmaPd, attr: &AhAttr) -> Result<RdmaAh> {
        let av = address_vector(attr, &self.port, self.port.gid.index, 64).map_err(|why| {
            Error::new(
                ErrorClass::Other,
                format!("an address handle to the port {} {why}", attr.gid),
            )
        })?;
        let mut raw = ah_attr(&av);
        // SAFETY: a live domain, and an attribute structure the call only
        // reads.
        let ah = unsafe { ibv_create_ah(pd.0.pd, &mut raw) };
        if ah.is_null() {
            return Err(last_os_error("ibv_create_ah"));
        }
        Ok(RdmaAh {
            ah,
            _pd: pd.0.clone(),
        })
    }
}

/// An address handle; destroyed on drop.
pub struct RdmaAh {
    ah: *mut ibv_ah,
    _pd: Arc<PdHandle>,
}

// SAFETY: see `Context`.
unsafe impl Send for RdmaAh {}
// SAFETY: see `Context`.
unsafe impl Sync for RdmaAh {}

impl Drop for RdmaAh {
    fn drop(&mut self) {
        // SAFETY: created by ibv_create_ah, destroyed once, before its
        // domain (held by this handle).
        unsafe { ibv_destroy_ah(self.ah) };
    }
}

/// An unreliable-datagram queue pair.
pub struct RdmaUd {
    qp: *mut ibv_qp,
    port: PortInfo,
    /// The last state set (the device may have moved on).
    state: Mutex<QpState>,
    _pd: Arc<PdHandle>,
    _cqs: [Arc<CqHandle>; 2],
}

// SAFETY: see `Context`.
unsafe impl Send for RdmaUd {}
// SAFETY: see `Context`.
unsafe impl Sync for RdmaUd {}

impl Drop for RdmaUd {
    fn drop(&mut self) {
        // SAFETY: created by ibv_create_qp, destroyed once, before its
        // domain and CQs (held by this handle).
        unsafe { ibv_destroy_qp(self.qp) };
    }
}

impl UdQueuePair for RdmaUd {
    type Ah = RdmaAh;

    fn qp_num(&self) -> u32 {
        // SAFETY: the queue pair lives until `self` is dropped.
        unsafe { (*self.qp).qp_num }
    }

    fn state(&self) -> QpState {
        let last = *self.state.lock().unwrap_or_else(|e| e.into_inner());
        query_state(self.qp).unwrap_or(last)
    }

    fn ready(&self, attr: &UdAttr) -> Result<()> {
        if attr.port != self.port.port {
            return Err(Error::new(
                ErrorClass::Arg,
                format!(
                    "UD queue pair on port {} of a NIC opened on port {}",
                    attr.port, self.port.port
                ),
            ));
        }
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        for (to, plan) in [QpState::Init, QpState::Rtr, QpState::Rts]
            .into_iter()
            .zip(ud_plans(attr)?)
        {
            check_transition(*state, to)?;
            modify_raw(self.qp, to, &plan)?;
            *state = to;
        }
        Ok(())
    }

    fn post_send(&self, wr: &UdSendWr<'_, RdmaAh>) -> std::result::Result<(), PostError> {
        // SAFETY: a plain C structure (integers, pointers and unions of
        // them), for which all zeros is a valid value.
        let mut send: ibv_send_wr = unsafe { std::mem::zeroed() };
        send.wr_id = wr.wr_id;
        send.num_sge = 1;
        send.send_flags = if wr.signaled { SEND_SIGNALED } else { 0 };
        send.opcode = ibv_wr_opcode::IBV_WR_SEND;
        send.wr.ud.ah = wr.ah.ah;
        send.wr.ud.remote_qpn = wr.remote_qpn;
        send.wr.ud.remote_qkey = wr.remote_qkey;
        let mut sge = ibv_sge_of(&wr.sge);
        send.sg_list = &mut sge;
        let mut bad = null_mut();
        // SAFETY: a live queue pair and address handle (borrowed for the
        // call); the request and its SGE live through the call, which
        // copies them; the SGE names registered memory, which the
        // registrant keeps valid.
        let rc = unsafe { ibv_post_send(self.qp, &mut send, &mut bad) };
        posted(rc, "posting a datagram")
    }

    fn post_recv(&self, wr: &RecvWr) -> std::result::Result<(), PostError> {
        // SAFETY: a live queue pair; the request and its SGE live through
        // the call, which copies them.
        post_receive(wr, |w, bad| unsafe { ibv_post_recv(self.qp, w, bad) })
    }
}
