//! The software provider (`OXMPI_VERBS_PROVIDER=soft`): reliable-connected
//! queue pairs between the processes of a job on one host, and within one
//! process, with the semantics of hardware.
//!
//! # What it keeps of RC
//! - Memory keys: each registration has an unpredictable lkey and rkey;
//!   every access is checked against the registrations of the queue pair's
//!   protection domain (bounds, rights, and the queue pair's own remote
//!   access flags). A violation on the responder completes the requester's
//!   work request with REM_ACCESS_ERR; both queue pairs go to the error
//!   state, and everything else outstanding or posted completes with
//!   WR_FLUSH_ERR. Deregistration revokes the keys at once (module `mem`).
//! - In-order execution and completion per queue pair: requests are
//!   executed by the responder in the order they were posted, and their
//!   completions come in that order.
//! - Receive-not-ready: a SEND that finds no receive posted (on the queue
//!   pair or its shared receive queue) is retried after the responder's
//!   `min_rnr_timer`, `rnr_retry` times (7: for ever), then completes with
//!   RNR_RETRY_EXC_ERR. Later requests wait behind it, as on hardware.
//! - 8-byte atomics with real atomic instructions on the target word, so
//!   they are atomic against each other from any number of queue pairs.
//! - True one-sided operations: the target's application threads take no
//!   part; its soft NIC does the work.
//!
//! # How
//! Each [`SoftNic`] listens on an abstract-namespace Unix socket named
//! after its GID (random, in the queue pairs' addresses). Each connected
//! pair of queue pairs shares one stream socket, opened at RTR by the side
//! with the smaller (GID, QPN) and handed by the other side's listener to
//! its queue pair once that reaches RTR. On each queue pair two threads are
//! its NIC: a writer that sends the frames posted or produced (it alone
//! may block on the socket, so a responder never waits on a full stream)
//! and a reader that executes the peer's requests against this process's
//! memory and completes this side's requests from the peer's responses
//! (module `wire` has the frames). Posting copies the data of SENDs and
//! RDMA WRITEs at once (hardware reads it later; reading it early is one
//! of the behaviours hardware may have).
//!
//! Unreliable-datagram queue pairs (module `ud`) bind a datagram socket
//! each, named after the NIC's GID and their number. A completion channel
//! is an event counter (`eventfd`) that an armed completion queue adds to
//! at its next completion.
//!
//! # What differs from hardware
//! - When a connection breaks (the peer process ended or destroyed its
//!   queue pair), the oldest outstanding request completes with
//!   RETRY_EXC_ERR at once rather than after `retry_cnt` timeouts.
//! - After any fatal error on a connection both of its queue pairs go to
//!   the error state (on hardware a responder may stay in RTS, but its
//!   requests would then time out).
//! - A queue pair cannot be connected to itself.
//! - Two threads per connected queue pair: it is meant for tests and jobs
//!   of modest size on one host, not for speed.
//! - `max_rd_atomic` / `max_dest_rd_atomic` do not limit how many READs
//!   and atomics are in flight, and completion queues grow as needed
//!   instead of overrunning.
//!
//! # Security
//! A stream is accepted only from a process of the same effective user
//! (`SO_PEERCRED`; such a process could read this one's memory anyway), and
//! only for a queue pair in RTR or later whose remote (GID, QPN, PSN) is
//! what the hello names.

mod mem;
mod sys;
mod ud;
mod wire;

pub use ud::{SoftAh, SoftUd};

use crate::provider::{
    check_attributes, check_transition, rnr_timer_duration, AccessFlags, AhAttr, CompletionChannel,
    CompletionQueue, Gid, GidEntry, GidType, InitAttr, LinkLayer, MemoryRegion, Mtu, Nic,
    PartialPost, PortInfo, PostError, QpAddress, QpCaps, QpInit, QpState, QueuePair, RecvWr,
    RtrAttr, RtsAttr, SendOp, SendWr, Sge, SharedReceiveQueue, WcOpcode, WcStatus, WorkCompletion,
    RNR_RETRY_FOREVER,
};
use mem::{Atomic, MrTable};
use oxmpi_adi::{vlog, Error, ErrorClass, Result};
use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;
use std::time::Duration;
use wire::{Frame, Hello, ReadError, Request, Response};

/// Most streams waiting for one queue pair to reach RTR.
const MAX_PARKED: usize = 4;

/// How long a connecting process may take to send its hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);

/// Locks `m`, going on past a poisoned lock: every critical section here
/// leaves its data consistent at each step, so a panicked holder (a bug)
/// must not take the NIC down with it.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn random_bytes<const N: usize>() -> Result<[u8; N]> {
    let mut b = [0u8; N];
    getrandom::getrandom(&mut b).map_err(|e| {
        Error::new(
            ErrorClass::Other,
            format!("soft verbs provider: no random bytes from the OS: {e}"),
        )
    })?;
    Ok(b)
}

/// The abstract socket name of the soft NIC with `gid`.
fn socket_name(gid: &Gid) -> String {
    let hex: String = gid.0.iter().map(|b| format!("{b:02x}")).collect();
    format!("oxmpi-soft-nic-{hex}")
}

fn socket_addr(gid: &Gid) -> Result<SocketAddr> {
    SocketAddr::from_abstract_name(socket_name(gid).as_bytes())
        .map_err(|e| Error::os("soft verbs provider: making a socket address", e))
}

/// State shared by a soft NIC, its listener and its queue pairs.
struct NicShared {
    gid: Gid,
    uid: u32,
    closing: AtomicBool,
    /// Live queue pairs by number.
    qps: Mutex<HashMap<u32, Weak<QpShared>>>,
    /// Streams that arrived for a queue pair before it reached RTR (at
    /// most [`MAX_PARKED`] each: which one is its peer's is known at RTR).
    parked: Mutex<HashMap<u32, Vec<(UnixStream, Hello)>>>,
    next_qpn: AtomicU32,
}

/// A software RDMA device: see the module docs.
pub struct SoftNic {
    shared: Arc<NicShared>,
    port: PortInfo,
    listener: Option<JoinHandle<()>>,
}

impl NicShared {
    /// A fresh queue-pair number (24 bits, never 0), RC and UD alike.
    fn new_qpn(&self) -> u32 {
        loop {
            let n = self.next_qpn.fetch_add(1, Ordering::Relaxed) & 0xff_ffff;
            if n != 0 {
                return n;
            }
        }
    }
}

impl SoftNic {
    /// Opens a soft NIC: a fresh random GID, its listener and the thread
    /// that admits incoming queue-pair streams.
    pub fn open() -> Result<SoftNic> {
        let gid = Gid(random_bytes()?);
        let listener = UnixListener::bind_addr(&socket_addr(&gid)?)
            .map_err(|e| Error::os("soft verbs provider: binding the NIC's socket", e))?;
        let first_qpn = u32::from_le_bytes(random_bytes()?) & 0xff_ffff;
        let shared = Arc::new(NicShared {
            gid,
            uid: sys::own_uid(),
            closing: AtomicBool::new(false),
            qps: Mutex::new(HashMap::new()),
            parked: Mutex::new(HashMap::new()),
            next_qpn: AtomicU32::new(first_qpn),
        });
        let for_listener = shared.clone();
        let listener = std::thread::Builder::new()
            .name("oxmpi-soft-nic".into())
            .spawn(move || listen(&for_listener, listener))
            .map_err(|e| Error::os("soft verbs provider: starting the NIC thread", e))?;
        Ok(SoftNic {
            port: PortInfo {
                port: 1,
                lid: 0,
                active_mtu: Mtu::Mtu4096,
                link_layer: LinkLayer::Ethernet,
                gid: GidEntry {
                    index: 0,
                    gid,
                    kind: GidType::RoceV2,
                },
            },
            shared,
            listener: Some(listener),
        })
    }
}

impl Drop for SoftNic {
    fn drop(&mut self) {
        self.shared.closing.store(true, Ordering::Release);
        // Wake the listener out of accept(): it sees `closing` and ends.
        if let Ok(addr) = socket_addr(&self.shared.gid) {
            let _ = UnixStream::connect_addr(&addr);
        }
        if let Some(t) = self.listener.take() {
            let _ = t.join();
        }
    }
}

/// The listener thread: admits each incoming stream on a thread of its own
/// (a silent stranger must not hold up the others).
fn listen(nic: &Arc<NicShared>, listener: UnixListener) {
    for conn in listener.incoming() {
        if nic.closing.load(Ordering::Acquire) {
            return;
        }
        let stream = match conn {
            Ok(s) => s,
            Err(e) => {
                vlog!("soft verbs NIC: accept failed: {e}");
                continue;
            }
        };
        let nic = nic.clone();
        let spawned = std::thread::Builder::new()
            .name("oxmpi-soft-admit".into())
            .spawn(move || {
                if let Err(why) = admit(&nic, stream) {
                    vlog!("soft verbs NIC: refused a queue-pair stream: {why}");
                }
            });
        if let Err(e) = spawned {
            vlog!("soft verbs NIC: no thread to admit a stream: {e}");
        }
    }
}

/// Checks who connected and what for, and hands the stream to its queue
/// pair.
fn admit(nic: &NicShared, mut stream: UnixStream) -> std::result::Result<(), String> {
    let uid = sys::peer_uid(&stream).map_err(|e| format!("no peer credentials: {e}"))?;
    if uid != nic.uid {
        return Err(format!("connection from user {uid}, not {}", nic.uid));
    }
    stream
        .set_read_timeout(Some(HELLO_TIMEOUT))
        .map_err(|e| e.to_string())?;
    let hello = Hello::read(&mut stream)?;
    stream.set_read_timeout(None).map_err(|e| e.to_string())?;
    let qp = lock(&nic.qps)
        .get(&hello.to_qpn)
        .and_then(Weak::upgrade)
        .ok_or_else(|| format!("no queue pair {:#x} here", hello.to_qpn))?;
    qp.offer_stream(stream, hello)
}

/// A protection domain of the soft NIC.
pub struct SoftPd {
    mrs: Arc<MrTable>,
}

/// A registration of the soft NIC; dropping it revokes its keys.
pub struct SoftMr {
    mrs: Arc<MrTable>,
    lkey: u32,
    rkey: u32,
    addr: u64,
    len: usize,
}

impl MemoryRegion for SoftMr {
    fn lkey(&self) -> u32 {
        self.lkey
    }
    fn rkey(&self) -> u32 {
        self.rkey
    }
    fn addr(&self) -> u64 {
        self.addr
    }
    fn len(&self) -> usize {
        self.len
    }
}

impl Drop for SoftMr {
    fn drop(&mut self) {
        self.mrs.remove(self.lkey);
    }
}

struct CqShared {
    entries: Mutex<VecDeque<WorkCompletion>>,
    /// Where its events go, if anywhere.
    channel: Option<Arc<OwnedFd>>,
    /// Armed by `req_notify`: the next completion signals the channel.
    armed: AtomicBool,
}

impl CqShared {
    fn push(&self, wc: WorkCompletion) {
        lock(&self.entries).push_back(wc);
        // After the entry is in: a woken poller finds it.
        if let Some(channel) = &self.channel {
            if self.armed.load(Ordering::Acquire) && self.armed.swap(false, Ordering::AcqRel) {
                sys::signal(channel);
            }
        }
    }
}

/// A completion channel of the soft NIC: an event counter (`eventfd`)
/// that armed completion queues add to.
pub struct SoftChannel(Arc<OwnedFd>);

impl CompletionChannel for SoftChannel {
    fn fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }

    fn drain(&self) -> Result<u32> {
        Ok(u32::try_from(sys::take_count(&self.0)).unwrap_or(u32::MAX))
    }
}

/// A completion queue of the soft NIC. It grows as needed: completions are
/// never dropped.
pub struct SoftCq(Arc<CqShared>);

impl CompletionQueue for SoftCq {
    fn poll(&self, max: usize, out: &mut Vec<WorkCompletion>) -> Result<usize> {
        let mut q = lock(&self.0.entries);
        let n = max.min(q.len());
        out.extend(q.drain(..n));
        Ok(n)
    }

    fn req_notify(&self) -> Result<()> {
        if self.0.channel.is_none() {
            return Err(Error::new(
                ErrorClass::Arg,
                "req_notify on a completion queue made without a completion channel",
            ));
        }
        self.0.armed.store(true, Ordering::Release);
        Ok(())
    }
}

struct SrqShared {
    max_wr: u32,
    posted: Mutex<VecDeque<RecvWr>>,
}

/// A shared receive queue of the soft NIC.
pub struct SoftSrq(Arc<SrqShared>);

impl SharedReceiveQueue for SoftSrq {
    fn post_recv(&self, wr: &RecvWr) -> std::result::Result<(), PostError> {
        let mut q = lock(&self.0.posted);
        if q.len() >= self.0.max_wr as usize {
            return Err(PostError::QueueFull);
        }
        q.push_back(*wr);
        Ok(())
    }
}

/// A send request between post and completion.
struct Pending {
    wr_id: u64,
    signaled: bool,
    opcode: WcOpcode,
    /// Where a READ's data or an atomic's original value lands.
    local: Option<Sge>,
    /// Bytes a READ asked for.
    len: u32,
    /// A local error found at post time: reported, and the queue pair
    /// broken, when the request reaches the head of the queue.
    local_error: Option<WcStatus>,
}

/// What the writer thread sends.
enum Outgoing {
    Frame(Vec<u8>),
    /// Send what came before, then close the stream.
    Close,
}

struct QpData {
    state: QpState,
    access: AccessFlags,
    remote: Option<QpAddress>,
    min_rnr_timer: u8,
    rnr_retry: u8,
    /// Send requests posted and not yet completed, oldest first.
    outstanding: VecDeque<Pending>,
    /// Receives posted on the queue pair itself.
    rq: VecDeque<RecvWr>,
    /// The writer's queue; the receiving end waits here until the stream
    /// is attached.
    to_writer: Sender<Outgoing>,
    writer_queue: Option<Receiver<Outgoing>>,
    /// A handle on the stream, to shut it down.
    stream: Option<UnixStream>,
    /// The stream ended while nothing was outstanding: the next request
    /// fails as the first one unanswered would on hardware.
    peer_gone: bool,
}

struct QpShared {
    qpn: u32,
    psn: u32,
    nic: Arc<NicShared>,
    mrs: Arc<MrTable>,
    send_cq: Arc<CqShared>,
    recv_cq: Arc<CqShared>,
    srq: Option<Arc<SrqShared>>,
    caps: QpCaps,
    closing: AtomicBool,
    data: Mutex<QpData>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

/// A reliable-connected queue pair of the soft NIC.
pub struct SoftQp(Arc<QpShared>);

impl QpShared {
    fn address(&self) -> QpAddress {
        QpAddress {
            gid: self.nic.gid,
            lid: 0,
            qpn: self.qpn,
            psn: self.psn,
            mtu: Mtu::Mtu4096,
        }
    }

    fn completion(
        &self,
        wr_id: u64,
        status: WcStatus,
        opcode: WcOpcode,
        len: u32,
    ) -> WorkCompletion {
        completion(self.qpn, wr_id, status, opcode, len)
    }

    fn complete_send(&self, p: &Pending, status: WcStatus) {
        if p.signaled || status != WcStatus::Success {
            let len = match p.opcode {
                WcOpcode::RdmaRead => p.len,
                WcOpcode::FetchAdd | WcOpcode::CompareSwap => 8,
                _ => 0,
            };
            self.send_cq
                .push(self.completion(p.wr_id, status, p.opcode, len));
        }
    }

    /// Moves to the error state: the oldest outstanding request completes
    /// with `head_status` (if given), everything else outstanding or posted
    /// on the queue pair's own receive queue with WR_FLUSH_ERR, and the
    /// stream closes once the frames already queued (a NAK) are out.
    fn enter_error(&self, d: &mut QpData, head_status: Option<WcStatus>) {
        d.state = QpState::Error;
        let mut first = head_status;
        while let Some(p) = d.outstanding.pop_front() {
            let status = first.take().unwrap_or(WcStatus::WrFlushErr);
            self.complete_send(&p, status);
        }
        for r in d.rq.drain(..) {
            self.recv_cq
                .push(self.completion(r.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, 0));
        }
        let _ = d.to_writer.send(Outgoing::Close);
    }

    /// Reports local errors found at post time that have reached the head.
    fn report_local_errors(&self, d: &mut QpData) {
        if let Some(status) = d.outstanding.front().and_then(|p| p.local_error) {
            self.enter_error(d, Some(status));
        }
    }

    /// Takes a stream from the listener (see [`admit`]).
    fn offer_stream(
        self: &Arc<Self>,
        stream: UnixStream,
        hello: Hello,
    ) -> std::result::Result<(), String> {
        let mut d = lock(&self.data);
        match d.state {
            QpState::Reset | QpState::Init => {
                let mut parked = lock(&self.nic.parked);
                let waiting = parked.entry(self.qpn).or_default();
                if waiting.len() >= MAX_PARKED {
                    return Err(format!(
                        "{MAX_PARKED} streams already wait for queue pair {:#x}",
                        self.qpn
                    ));
                }
                waiting.push((stream, hello));
                Ok(())
            }
            QpState::Rtr | QpState::Rts => self.attach_offered(&mut d, stream, hello),
            QpState::Error => Err(format!("queue pair {:#x} is in the error state", self.qpn)),
        }
    }

    /// Attaches a stream the peer opened, if it comes from the remote this
    /// queue pair was connected to and none is attached yet.
    fn attach_offered(
        self: &Arc<Self>,
        d: &mut QpData,
        stream: UnixStream,
        hello: Hello,
    ) -> std::result::Result<(), String> {
        let remote = d.remote.ok_or("queue pair not connected")?;
        if (hello.from_gid, hello.from_qpn, hello.psn) != (remote.gid, remote.qpn, remote.psn) {
            return Err(format!(
                "hello from queue pair {:#x} (PSN {:#x}) for queue pair {:#x}, which is \
                 connected to {:#x} (PSN {:#x})",
                hello.from_qpn, hello.psn, self.qpn, remote.qpn, remote.psn
            ));
        }
        self.attach(d, stream).map_err(|e| e.to_string())
    }

    /// Starts the queue pair's NIC threads on `stream`.
    fn attach(self: &Arc<Self>, d: &mut QpData, stream: UnixStream) -> Result<()> {
        let Some(queue) = d.writer_queue.take() else {
            return Err(Error::new(
                ErrorClass::Intern,
                format!("queue pair {:#x} already has a stream", self.qpn),
            ));
        };
        let clone = |s: &UnixStream| {
            s.try_clone()
                .map_err(|e| Error::os("soft verbs provider: duplicating a socket", e))
        };
        let for_reader = clone(&stream)?;
        d.stream = Some(clone(&stream)?);
        let writer = std::thread::Builder::new()
            .name("oxmpi-soft-qp-tx".into())
            .spawn(move || pump(queue, stream));
        let me = self.clone();
        let reader = std::thread::Builder::new()
            .name("oxmpi-soft-qp-rx".into())
            .spawn(move || me.serve(for_reader));
        let mut threads = lock(&self.threads);
        for t in [writer, reader] {
            threads.push(t.map_err(|e| Error::os("soft verbs provider: starting a QP thread", e))?);
        }
        Ok(())
    }

    /// The reader thread: executes the peer's requests and completes this
    /// side's from the peer's responses, in stream order.
    fn serve(self: Arc<Self>, mut stream: UnixStream) {
        loop {
            let frame = wire::read_frame(&mut stream);
            if self.closing.load(Ordering::Acquire) {
                return;
            }
            match frame {
                Ok(Frame::Request(r)) => self.respond(r),
                Ok(Frame::Response(r)) => self.on_response(r),
                Err(ReadError::Closed(e)) => {
                    // The peer is gone: its process ended, or its queue pair
                    // went to the error state or was destroyed.
                    if e.kind() != std::io::ErrorKind::UnexpectedEof {
                        vlog!("soft verbs QP {:#x}: connection failed: {e}", self.qpn);
                    }
                    let mut d = lock(&self.data);
                    d.peer_gone = true;
                    if d.state != QpState::Error && !d.outstanding.is_empty() {
                        self.enter_error(&mut d, Some(WcStatus::RetryExcErr));
                    }
                    return;
                }
                Err(ReadError::Malformed(why)) => {
                    vlog!(
                        "soft verbs QP {:#x}: peer sent a malformed frame: {why}",
                        self.qpn
                    );
                    let mut d = lock(&self.data);
                    if d.state != QpState::Error {
                        self.enter_error(&mut d, Some(WcStatus::BadRespErr));
                    }
                    return;
                }
            }
        }
    }

    fn send_frame(&self, d: &QpData, frame: &Frame) {
        // The writer only ends after a Close or when the queue pair is
        // destroyed, after which nothing more is sent: a failed send has
        // nothing left to reach.
        let _ = d.to_writer.send(Outgoing::Frame(frame.encode()));
    }

    /// Fails the request being executed: NAK with `status`, and the error
    /// state.
    fn fail_as_responder(&self, status: WcStatus) {
        let mut d = lock(&self.data);
        if d.state == QpState::Error {
            return;
        }
        self.send_frame(&d, &Frame::Response(Response::Nak(status)));
        self.enter_error(&mut d, None);
    }

    /// Executes one of the peer's requests.
    fn respond(&self, request: Request) {
        let access = {
            let d = lock(&self.data);
            if !matches!(d.state, QpState::Rtr | QpState::Rts) {
                return;
            }
            d.access
        };
        let allowed = |right| {
            if access.contains(right) {
                Ok(())
            } else {
                Err(WcStatus::RemAccessErr)
            }
        };
        let reply = match request {
            Request::Send { rnr_retry, data } => return self.deliver(rnr_retry, &data),
            Request::Write { remote, data } => allowed(AccessFlags::REMOTE_WRITE)
                .and_then(|_| self.mrs.remote_write(&remote, &data))
                .map(|_| Response::Ack),
            Request::Read { remote, len } => allowed(AccessFlags::REMOTE_READ)
                .and_then(|_| self.mrs.remote_read(&remote, len))
                .map(Response::ReadData),
            Request::FetchAdd { remote, add } => allowed(AccessFlags::REMOTE_ATOMIC)
                .and_then(|_| self.mrs.remote_atomic(&remote, Atomic::FetchAdd(add)))
                .map(Response::AtomicOriginal),
            Request::CompareSwap {
                remote,
                compare,
                swap,
            } => allowed(AccessFlags::REMOTE_ATOMIC)
                .and_then(|_| {
                    self.mrs
                        .remote_atomic(&remote, Atomic::CompareSwap(compare, swap))
                })
                .map(Response::AtomicOriginal),
        };
        match reply {
            Ok(r) => self.send_frame(&lock(&self.data), &Frame::Response(r)),
            Err(status) => self.fail_as_responder(status),
        }
    }

    /// Takes the next posted receive, from the SRQ or the queue pair's own
    /// receive queue; `None` when none is posted or the queue pair stopped.
    fn take_receive(&self) -> Option<RecvWr> {
        match &self.srq {
            Some(srq) => lock(&srq.posted).pop_front(),
            None => lock(&self.data).rq.pop_front(),
        }
    }

    /// Delivers a SEND into the next posted receive, retrying while none is
    /// posted as the requester's `rnr_retry` allows.
    fn deliver(&self, rnr_retry: u8, data: &[u8]) {
        let mut retries_left = rnr_retry;
        let timer = rnr_timer_duration(lock(&self.data).min_rnr_timer);
        let recv = loop {
            if self.closing.load(Ordering::Acquire) || lock(&self.data).state == QpState::Error {
                return;
            }
            if let Some(r) = self.take_receive() {
                break r;
            }
            if retries_left == 0 {
                return self.fail_as_responder(WcStatus::RnrRetryExcErr);
            }
            if retries_left != RNR_RETRY_FOREVER {
                retries_left -= 1;
            }
            std::thread::sleep(timer);
        };
        let len = data.len() as u32;
        match self.mrs.local_write(&recv.sge, data) {
            Ok(()) => {
                self.recv_cq.push(self.completion(
                    recv.wr_id,
                    WcStatus::Success,
                    WcOpcode::Recv,
                    len,
                ));
                self.send_frame(&lock(&self.data), &Frame::Response(Response::Ack));
            }
            Err(status) => {
                self.recv_cq
                    .push(self.completion(recv.wr_id, status, WcOpcode::Recv, len));
                self.fail_as_responder(if status == WcStatus::LocLenErr {
                    WcStatus::RemInvReqErr
                } else {
                    WcStatus::RemOpErr
                });
            }
        }
    }

    /// Completes the oldest outstanding request from the peer's response.
    fn on_response(&self, response: Response) {
        let mut d = lock(&self.data);
        if d.state == QpState::Error {
            return;
        }
        let Some(head) = d.outstanding.front() else {
            vlog!(
                "soft verbs QP {:#x}: a response with nothing outstanding",
                self.qpn
            );
            return self.enter_error(&mut d, None);
        };
        let status = match (response, head.opcode) {
            (Response::Ack, WcOpcode::Send | WcOpcode::RdmaWrite) => WcStatus::Success,
            (Response::ReadData(data), WcOpcode::RdmaRead) if data.len() == head.len as usize => {
                match head.local {
                    Some(sge) => self
                        .mrs
                        .local_write(&sge, &data)
                        .err()
                        .unwrap_or(WcStatus::Success),
                    None => WcStatus::LocQpOpErr,
                }
            }
            (Response::AtomicOriginal(v), WcOpcode::FetchAdd | WcOpcode::CompareSwap) => {
                match head.local {
                    Some(sge) => self
                        .mrs
                        .local_write(&sge, &v.to_ne_bytes())
                        .err()
                        .unwrap_or(WcStatus::Success),
                    None => WcStatus::LocQpOpErr,
                }
            }
            (Response::Nak(status), _) => status,
            _ => WcStatus::BadRespErr,
        };
        if status == WcStatus::Success {
            if let Some(p) = d.outstanding.pop_front() {
                self.complete_send(&p, status);
            }
            self.report_local_errors(&mut d);
        } else {
            self.enter_error(&mut d, Some(status));
        }
    }

    /// Builds the frame of a send request, or the local error it completes
    /// with.
    fn request_frame(
        &self,
        op: &SendOp<'_>,
        rnr_retry: u8,
    ) -> std::result::Result<(Request, Option<Sge>, u32), WcStatus> {
        Ok(match *op {
            SendOp::Send(sge) => (
                Request::Send {
                    rnr_retry,
                    data: self.mrs.local_read(&sge)?,
                },
                None,
                0,
            ),
            SendOp::SendInline(data) => (
                Request::Send {
                    rnr_retry,
                    data: data.to_vec(),
                },
                None,
                0,
            ),
            SendOp::RdmaWrite { local, remote } => (
                Request::Write {
                    remote,
                    data: self.mrs.local_read(&local)?,
                },
                None,
                0,
            ),
            SendOp::RdmaWriteInline { data, remote } => (
                Request::Write {
                    remote,
                    data: data.to_vec(),
                },
                None,
                0,
            ),
            SendOp::RdmaRead { local, remote } => {
                self.mrs.check_local_write(&local, local.length as usize)?;
                (
                    Request::Read {
                        remote,
                        len: local.length,
                    },
                    Some(local),
                    local.length,
                )
            }
            SendOp::FetchAdd { local, remote, add } => {
                self.check_atomic_result(&local)?;
                (Request::FetchAdd { remote, add }, Some(local), 8)
            }
            SendOp::CompareSwap {
                local,
                remote,
                compare,
                swap,
            } => {
                self.check_atomic_result(&local)?;
                (
                    Request::CompareSwap {
                        remote,
                        compare,
                        swap,
                    },
                    Some(local),
                    8,
                )
            }
        })
    }

    fn check_atomic_result(&self, local: &Sge) -> std::result::Result<(), WcStatus> {
        if local.length != 8 {
            return Err(WcStatus::LocLenErr);
        }
        self.mrs.check_local_write(local, 8)
    }
}

/// The writer thread: sends what is queued, in order, until a Close or the
/// queue pair's end.
fn pump(queue: Receiver<Outgoing>, stream: UnixStream) {
    for out in queue {
        match out {
            Outgoing::Frame(bytes) => {
                if sys::send_all(&stream, &bytes).is_err() {
                    break;
                }
            }
            Outgoing::Close => break,
        }
    }
    let _ = stream.shutdown(std::net::Shutdown::Both);
}

fn invalid(message: String) -> PostError {
    PostError::Invalid(Error::new(ErrorClass::Arg, message))
}

impl SoftQp {
    /// Posts one send request, the queue pair's data locked (`d`).
    fn post_locked(&self, d: &mut QpData, wr: &SendWr<'_>) -> std::result::Result<(), PostError> {
        let me = &self.0;
        let opcode = wr.op.completion_opcode();
        match d.state {
            QpState::Rts => {}
            QpState::Error => {
                me.send_cq
                    .push(me.completion(wr.wr_id, WcStatus::WrFlushErr, opcode, 0));
                return Ok(());
            }
            other => {
                return Err(invalid(format!(
                    "post_send on queue pair {:#x} in state {other:?} (RTS needed)",
                    me.qpn
                )))
            }
        }
        if d.outstanding.len() >= me.caps.max_send_wr as usize {
            return Err(PostError::QueueFull);
        }
        if let SendOp::SendInline(data) | SendOp::RdmaWriteInline { data, .. } = wr.op {
            if data.len() > me.caps.max_inline_data as usize {
                return Err(invalid(format!(
                    "inline data of {} bytes, above the queue pair's max_inline_data {}",
                    data.len(),
                    me.caps.max_inline_data
                )));
            }
        }
        let mut pending = Pending {
            wr_id: wr.wr_id,
            signaled: wr.signaled,
            opcode,
            local: None,
            len: 0,
            local_error: None,
        };
        // Behind a request that failed locally nothing is executed: the
        // queue pair goes to the error state when that request's turn
        // comes, and these are flushed.
        let doomed = d.outstanding.iter().any(|p| p.local_error.is_some());
        match me.request_frame(&wr.op, d.rnr_retry) {
            Ok(_) if doomed => d.outstanding.push_back(pending),
            Ok((request, local, len)) => {
                pending.local = local;
                pending.len = len;
                me.send_frame(d, &Frame::Request(request));
                d.outstanding.push_back(pending);
                if d.peer_gone {
                    me.enter_error(d, Some(WcStatus::RetryExcErr));
                }
            }
            Err(status) => {
                pending.local_error = Some(status);
                d.outstanding.push_back(pending);
                me.report_local_errors(d);
            }
        }
        Ok(())
    }
}

impl QueuePair for SoftQp {
    fn qp_num(&self) -> u32 {
        self.0.qpn
    }

    fn state(&self) -> QpState {
        lock(&self.0.data).state
    }

    fn address(&self) -> QpAddress {
        self.0.address()
    }

    fn modify_to_init(&self, attr: &InitAttr) -> Result<()> {
        let mut d = lock(&self.0.data);
        check_transition(d.state, QpState::Init)?;
        if attr.port != 1 {
            return Err(Error::new(
                ErrorClass::Arg,
                format!("the soft NIC has port 1 only, not {}", attr.port),
            ));
        }
        d.access = attr.access;
        d.state = QpState::Init;
        Ok(())
    }

    fn modify_to_rtr(&self, attr: &RtrAttr) -> Result<()> {
        let me = &self.0;
        let mut d = lock(&me.data);
        check_transition(d.state, QpState::Rtr)?;
        check_attributes(Some(attr), None)?;
        let remote = attr.remote;
        let local = (me.nic.gid, me.qpn);
        if (remote.gid, remote.qpn) == local {
            return Err(Error::new(
                ErrorClass::UnsupportedOperation,
                "the soft verbs provider cannot connect a queue pair to itself",
            ));
        }
        d.remote = Some(remote);
        d.min_rnr_timer = attr.min_rnr_timer;
        if local < (remote.gid, remote.qpn) {
            // This side opens the stream.
            let opened = UnixStream::connect_addr(&socket_addr(&remote.gid)?).and_then(|s| {
                let hello = Hello {
                    from_gid: me.nic.gid,
                    from_qpn: me.qpn,
                    to_qpn: remote.qpn,
                    psn: me.psn,
                };
                sys::send_all(&s, &hello.encode())?;
                Ok(s)
            });
            let stream = opened.map_err(|e| {
                d.remote = None;
                Error::new(
                    ErrorClass::ProcFailed,
                    format!(
                        "soft verbs provider: the NIC of queue pair {:#x} (GID {}) cannot be \
                         reached: {e}; is its process alive?",
                        remote.qpn, remote.gid
                    ),
                )
            })?;
            me.attach(&mut d, stream)?;
        } else {
            // Of the streams that came early, the peer's (if it came) is
            // attached; the others are refused.
            let parked = lock(&me.nic.parked).remove(&me.qpn).unwrap_or_default();
            for (stream, hello) in parked {
                if let Err(why) = me.attach_offered(&mut d, stream, hello) {
                    vlog!("soft verbs NIC: refused a queue-pair stream: {why}");
                }
            }
        }
        d.state = QpState::Rtr;
        Ok(())
    }

    fn modify_to_rts(&self, attr: &RtsAttr) -> Result<()> {
        let mut d = lock(&self.0.data);
        check_transition(d.state, QpState::Rts)?;
        check_attributes(None, Some(attr))?;
        if attr.sq_psn != self.0.psn {
            return Err(Error::new(
                ErrorClass::Arg,
                format!(
                    "the soft verbs provider sends from the PSN of the queue pair's address \
                     ({:#x}), not {:#x}",
                    self.0.psn, attr.sq_psn
                ),
            ));
        }
        d.rnr_retry = attr.rnr_retry;
        d.state = QpState::Rts;
        Ok(())
    }

    /// The list under one lock of the queue pair, each request as if
    /// posted alone: a request that puts the queue pair in the error
    /// state has those after it flushed.
    fn post_send_list(&self, wrs: &[SendWr<'_>]) -> std::result::Result<(), PartialPost> {
        let mut d = lock(&self.0.data);
        for (posted, wr) in wrs.iter().enumerate() {
            self.post_locked(&mut d, wr)
                .map_err(|error| PartialPost { posted, error })?;
        }
        Ok(())
    }
    fn post_recv(&self, wr: &RecvWr) -> std::result::Result<(), PostError> {
        let me = &self.0;
        if me.srq.is_some() {
            return Err(invalid(format!(
                "post_recv on queue pair {:#x}, which takes its receives from a shared receive queue",
                me.qpn
            )));
        }
        let mut d = lock(&me.data);
        match d.state {
            QpState::Reset => Err(invalid(format!(
                "post_recv on queue pair {:#x} in state RESET (INIT needed)",
                me.qpn
            ))),
            QpState::Error => {
                me.recv_cq
                    .push(me.completion(wr.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, 0));
                Ok(())
            }
            _ if d.rq.len() >= me.caps.max_recv_wr as usize => Err(PostError::QueueFull),
            _ => {
                d.rq.push_back(*wr);
                Ok(())
            }
        }
    }
}

impl Drop for SoftQp {
    fn drop(&mut self) {
        let me = &self.0;
        me.closing.store(true, Ordering::Release);
        {
            let mut d = lock(&me.data);
            d.state = QpState::Error;
            let _ = d.to_writer.send(Outgoing::Close);
            if let Some(s) = &d.stream {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
        }
        lock(&me.nic.qps).remove(&me.qpn);
        lock(&me.nic.parked).remove(&me.qpn);
        let threads = std::mem::take(&mut *lock(&me.threads));
        for t in threads {
            let _ = t.join();
        }
    }
}

impl Nic for SoftNic {
    type Pd = SoftPd;
    type Mr = SoftMr;
    type Cq = SoftCq;
    type Srq = SoftSrq;
    type Qp = SoftQp;
    type Ah = SoftAh;
    type Ud = SoftUd;
    type Channel = SoftChannel;

    fn name(&self) -> &str {
        "soft"
    }

    fn port(&self) -> &PortInfo {
        &self.port
    }

    fn alloc_pd(&self) -> Result<SoftPd> {
        Ok(SoftPd {
            mrs: Arc::new(MrTable::default()),
        })
    }

    unsafe fn register(
        &self,
        pd: &SoftPd,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<SoftMr> {
        // SAFETY: the caller's promise (this function's contract) is the
        // one `MrTable::insert` needs.
        let (lkey, rkey) = unsafe { pd.mrs.insert(addr, len, access)? };
        Ok(SoftMr {
            mrs: pd.mrs.clone(),
            lkey,
            rkey,
            addr: addr as u64,
            len,
        })
    }

    fn create_comp_channel(&self) -> Result<SoftChannel> {
        let fd = sys::event_counter()
            .map_err(|e| Error::os("soft verbs provider: creating a completion channel", e))?;
        Ok(SoftChannel(Arc::new(fd)))
    }

    fn create_cq(&self, _capacity: u32, channel: Option<&SoftChannel>) -> Result<SoftCq> {
        Ok(SoftCq(Arc::new(CqShared {
            entries: Mutex::new(VecDeque::new()),
            channel: channel.map(|c| c.0.clone()),
            armed: AtomicBool::new(false),
        })))
    }

    fn create_srq(&self, _pd: &SoftPd, max_wr: u32) -> Result<SoftSrq> {
        Ok(SoftSrq(Arc::new(SrqShared {
            max_wr,
            posted: Mutex::new(VecDeque::new()),
        })))
    }

    fn create_qp(&self, pd: &SoftPd, init: &QpInit<'_, Self>) -> Result<SoftQp> {
        let qpn = self.shared.new_qpn();
        let psn = u32::from_le_bytes(random_bytes()?) & 0xff_ffff;
        let (to_writer, writer_queue) = channel();
        let shared = Arc::new(QpShared {
            qpn,
            psn,
            nic: self.shared.clone(),
            mrs: pd.mrs.clone(),
            send_cq: init.send_cq.0.clone(),
            recv_cq: init.recv_cq.0.clone(),
            srq: init.srq.map(|s| s.0.clone()),
            caps: init.caps,
            closing: AtomicBool::new(false),
            data: Mutex::new(QpData {
                state: QpState::Reset,
                access: AccessFlags::NONE,
                remote: None,
                min_rnr_timer: 0,
                rnr_retry: 0,
                outstanding: VecDeque::new(),
                rq: VecDeque::new(),
                to_writer,
                writer_queue: Some(writer_queue),
                stream: None,
                peer_gone: false,
            }),
            threads: Mutex::new(Vec::new()),
        });
        lock(&self.shared.qps).insert(qpn, Arc::downgrade(&shared));
        Ok(SoftQp(shared))
    }

    fn create_ud(&self, pd: &SoftPd, init: &QpInit<'_, Self>) -> Result<SoftUd> {
        if init.srq.is_some() {
            return Err(Error::new(
                ErrorClass::Arg,
                "a UD queue pair takes its receives from its own queue, not a shared one",
            ));
        }
        SoftUd::create(
            &self.shared,
            self.shared.new_qpn(),
            pd.mrs.clone(),
            init.send_cq.0.clone(),
            init.recv_cq.0.clone(),
            init.caps,
        )
    }

    fn create_ah(&self, _pd: &SoftPd, attr: &AhAttr) -> Result<SoftAh> {
        if attr.gid.is_zero() {
            return Err(Error::new(
                ErrorClass::Arg,
                "an address handle needs the remote GID (soft NICs are addressed by GID)",
            ));
        }
        Ok(SoftAh { gid: attr.gid })
    }
}

/// A work completion of queue pair `qp_num` (reliable-connected or
/// unreliable-datagram alike).
fn completion(
    qp_num: u32,
    wr_id: u64,
    status: WcStatus,
    opcode: WcOpcode,
    byte_len: u32,
) -> WorkCompletion {
    WorkCompletion {
        wr_id,
        status,
        opcode,
        byte_len,
        qp_num,
    }
}
