//! Unreliable-datagram queue pairs of the soft NIC, and their address
//! handles.
//!
//! Each UD queue pair binds an abstract-namespace Unix datagram socket named
//! after its NIC's GID and its number, so a datagram addressed by (GID,
//! QPN) — what an address handle and a work request name — reaches exactly
//! that queue pair. One thread per queue pair is its receiving NIC: it
//! drops what hardware drops (a datagram for a queue pair not yet in RTR,
//! with another Q_Key, or finding no receive posted), and writes a global
//! route header (source and destination GID) and the payload into the next
//! posted receive. Sending copies the payload out of registered memory and
//! never waits: a receiver whose socket queue is full loses the datagram,
//! as a congested fabric would, and the sender completes with success.
//!
//! It owns nothing of RC queue pairs; the memory checks are module `mem`'s.

use super::mem::MrTable;
use super::{lock, CqShared, NicShared};
use crate::provider::{
    Gid, PostError, QpCaps, QpState, RecvWr, UdAttr, UdQueuePair, UdSendWr, WcOpcode, WcStatus,
    WorkCompletion, GRH_LEN,
};
use oxmpi_adi::{vlog, Error, ErrorClass, Result};
use std::collections::VecDeque;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// Bytes before the payload of a soft datagram: Q_Key, source QPN (both
/// u32 LE) and source GID.
const HEAD: usize = 24;
/// Largest payload a soft UD queue pair carries: its port's MTU.
const MTU: usize = 4096;

/// The abstract socket address of UD queue pair `qpn` on the NIC `gid`.
fn ud_addr(gid: &Gid, qpn: u32) -> Result<SocketAddr> {
    let hex: String = gid.0.iter().map(|b| format!("{b:02x}")).collect();
    SocketAddr::from_abstract_name(format!("oxmpi-soft-ud-{hex}-{qpn:06x}").as_bytes())
        .map_err(|e| Error::os("soft verbs provider: making a datagram socket address", e))
}

/// An address handle of the soft NIC: the remote NIC's GID.
pub struct SoftAh {
    pub(super) gid: Gid,
}

struct UdData {
    state: QpState,
    qkey: u32,
    rq: VecDeque<RecvWr>,
}

pub(super) struct UdShared {
    qpn: u32,
    gid: Gid,
    mrs: Arc<MrTable>,
    send_cq: Arc<CqShared>,
    recv_cq: Arc<CqShared>,
    caps: QpCaps,
    closing: AtomicBool,
    data: Mutex<UdData>,
    /// Unbound and non-blocking: sending never waits on a full receiver.
    sender: UnixDatagram,
}

/// An unreliable-datagram queue pair of the soft NIC.
pub struct SoftUd {
    shared: Arc<UdShared>,
    receiver: Option<JoinHandle<()>>,
}

impl SoftUd {
    /// Creates UD queue pair `qpn` on `nic` in RESET, its socket bound and
    /// its receiving thread started.
    pub(super) fn create(
        nic: &NicShared,
        qpn: u32,
        mrs: Arc<MrTable>,
        send_cq: Arc<CqShared>,
        recv_cq: Arc<CqShared>,
        caps: QpCaps,
    ) -> Result<SoftUd> {
        let socket = UnixDatagram::bind_addr(&ud_addr(&nic.gid, qpn)?)
            .map_err(|e| Error::os("soft verbs provider: binding a UD queue pair's socket", e))?;
        let sender = UnixDatagram::unbound()
            .and_then(|s| s.set_nonblocking(true).map(|()| s))
            .map_err(|e| Error::os("soft verbs provider: a datagram socket to send from", e))?;
        let shared = Arc::new(UdShared {
            qpn,
            gid: nic.gid,
            mrs,
            send_cq,
            recv_cq,
            caps,
            closing: AtomicBool::new(false),
            data: Mutex::new(UdData {
                state: QpState::Reset,
                qkey: 0,
                rq: VecDeque::new(),
            }),
            sender,
        });
        let me = shared.clone();
        let receiver = std::thread::Builder::new()
            .name("oxmpi-soft-ud-rx".into())
            .spawn(move || me.serve(&socket))
            .map_err(|e| Error::os("soft verbs provider: starting a UD queue pair's thread", e))?;
        Ok(SoftUd {
            shared,
            receiver: Some(receiver),
        })
    }
}

impl Drop for SoftUd {
    fn drop(&mut self) {
        self.shared.closing.store(true, Ordering::Release);
        // Wake the receiver out of recv(): it sees `closing` and ends. If
        // its queue is full it is not blocked, and sees it anyway.
        if let Ok(addr) = ud_addr(&self.shared.gid, self.shared.qpn) {
            let _ = self.shared.sender.send_to_addr(&[], &addr);
        }
        if let Some(t) = self.receiver.take() {
            let _ = t.join();
        }
    }
}

impl UdShared {
    fn completion(
        &self,
        wr_id: u64,
        status: WcStatus,
        opcode: WcOpcode,
        len: u32,
    ) -> WorkCompletion {
        super::completion(self.qpn, wr_id, status, opcode, len)
    }

    /// The receiving thread: one datagram at a time, until the queue pair
    /// is dropped.
    fn serve(&self, socket: &UnixDatagram) {
        let mut buf = vec![0u8; HEAD + MTU + 1];
        loop {
            let got = socket.recv(&mut buf);
            if self.closing.load(Ordering::Acquire) {
                return;
            }
            match got {
                Ok(n) => self.deliver(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    vlog!(
                        "soft verbs UD queue pair {:#x}: receive failed: {e}",
                        self.qpn
                    );
                    return;
                }
            }
        }
    }

    /// Delivers one datagram into the next posted receive, or drops it
    /// where hardware would.
    fn deliver(&self, datagram: &[u8]) {
        if datagram.len() < HEAD || datagram.len() > HEAD + MTU {
            return;
        }
        let qkey = u32::from_le_bytes(datagram[..4].try_into().expect("4 bytes"));
        let mut src_gid = [0u8; 16];
        src_gid.copy_from_slice(&datagram[8..HEAD]);
        let payload = &datagram[HEAD..];
        let mut d = lock(&self.data);
        if !matches!(d.state, QpState::Rtr | QpState::Rts) || qkey != d.qkey {
            return;
        }
        let Some(wr) = d.rq.pop_front() else {
            return;
        };
        drop(d);
        // The global route header as the NIC writes it: IPv6 version,
        // payload length, next header (IB BTH), hop limit, source and
        // destination GID.
        let mut message = Vec::with_capacity(GRH_LEN + payload.len());
        message.extend_from_slice(&[0x60, 0, 0, 0]);
        message.extend_from_slice(&(payload.len() as u16).to_be_bytes());
        message.extend_from_slice(&[0x1b, 64]);
        message.extend_from_slice(&src_gid);
        message.extend_from_slice(&self.gid.0);
        message.extend_from_slice(payload);
        let (status, len) = match self.mrs.local_write(&wr.sge, &message) {
            Ok(()) => (WcStatus::Success, message.len() as u32),
            Err(status) => (status, 0),
        };
        self.recv_cq
            .push(self.completion(wr.wr_id, status, WcOpcode::Recv, len));
    }
}

impl UdQueuePair for SoftUd {
    type Ah = SoftAh;

    fn qp_num(&self) -> u32 {
        self.shared.qpn
    }

    fn state(&self) -> QpState {
        lock(&self.shared.data).state
    }

    fn ready(&self, attr: &UdAttr) -> Result<()> {
        attr.check()?;
        let mut d = lock(&self.shared.data);
        if d.state != QpState::Reset {
            return Err(Error::new(
                ErrorClass::Arg,
                format!(
                    "UD queue pair {:#x} is in {:?}: only one in RESET can be readied",
                    self.shared.qpn, d.state
                ),
            ));
        }
        d.qkey = attr.qkey;
        d.state = QpState::Rts;
        Ok(())
    }

    fn post_send(&self, wr: &UdSendWr<'_, SoftAh>) -> std::result::Result<(), PostError> {
        let shared = &self.shared;
        if lock(&shared.data).state != QpState::Rts {
            return Err(PostError::Invalid(Error::new(
                ErrorClass::Arg,
                format!("UD queue pair {:#x} is not ready to send", shared.qpn),
            )));
        }
        if wr.sge.length as usize > MTU {
            return Err(PostError::Invalid(Error::new(
                ErrorClass::Arg,
                format!(
                    "a datagram of {} bytes, above the path MTU of {MTU}",
                    wr.sge.length
                ),
            )));
        }
        let status = match shared.mrs.local_read(&wr.sge) {
            Ok(payload) => {
                let mut datagram = Vec::with_capacity(HEAD + payload.len());
                datagram.extend_from_slice(&wr.remote_qkey.to_le_bytes());
                datagram.extend_from_slice(&shared.qpn.to_le_bytes());
                datagram.extend_from_slice(&shared.gid.0);
                datagram.extend_from_slice(&payload);
                // No such queue pair, or a full receiver: the datagram is
                // lost, and the send still succeeded (nothing is acked).
                if let Ok(addr) = ud_addr(&wr.ah.gid, wr.remote_qpn) {
                    let _ = shared.sender.send_to_addr(&datagram, &addr);
                }
                WcStatus::Success
            }
            Err(status) => status,
        };
        if wr.signaled || status != WcStatus::Success {
            shared
                .send_cq
                .push(shared.completion(wr.wr_id, status, WcOpcode::Send, 0));
        }
        Ok(())
    }

    fn post_recv(&self, wr: &RecvWr) -> std::result::Result<(), PostError> {
        let shared = &self.shared;
        let mut d = lock(&shared.data);
        if d.state == QpState::Reset {
            return Err(PostError::Invalid(Error::new(
                ErrorClass::Arg,
                format!(
                    "UD queue pair {:#x} is in RESET: receives need INIT or later",
                    shared.qpn
                ),
            )));
        }
        if d.rq.len() >= shared.caps.max_recv_wr as usize {
            return Err(PostError::QueueFull);
        }
        shared
            .mrs
            .check_local_write(&wr.sge, GRH_LEN)
            .map_err(|status| {
                PostError::Invalid(Error::new(
                    ErrorClass::Arg,
                    format!("a UD receive buffer must hold {GRH_LEN} bytes of GRH in a registration with LOCAL_WRITE ({status:?})"),
                ))
            })?;
        d.rq.push_back(*wr);
        Ok(())
    }
}
