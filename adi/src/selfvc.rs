//! The self method: packets a process sends to itself.
//!
//! Packets are queued in memory and delivered by the next poll, through the
//! same [`PacketSink`] path as any transport, so matching and both
//! protocols behave exactly as between two processes. A long message's data
//! is never staged: `send_zcopy` keeps the sender's pointer and the single
//! copy goes straight from the send buffer into the receive buffer.

use crate::error::Result;
use crate::proto::Header;
use crate::transport::{PacketSink, PeerRank, Transport};
use std::collections::VecDeque;
use std::os::fd::RawFd;

/// Messages up to this size are copied at send time (short protocol).
const SELF_EAGER_LIMIT: usize = 64 * 1024;

enum Payload {
    Copied(Vec<u8>),
    /// A zero-copy send: the sender's buffer, valid until `token` completes.
    Borrowed {
        ptr: *const u8,
        len: usize,
        token: u64,
    },
}

/// The transport of the VC from a rank to itself.
pub(crate) struct SelfTransport {
    rank: PeerRank,
    queue: VecDeque<(Header, Payload)>,
}

// SAFETY: the raw pointers in `queue` point into send buffers whose owners
// guaranteed (by `send_zcopy`'s contract) that they stay valid until the
// completion is reported; nothing here depends on the thread that reads them.
unsafe impl Send for SelfTransport {}

impl SelfTransport {
    pub(crate) fn new(rank: PeerRank) -> SelfTransport {
        SelfTransport {
            rank,
            queue: VecDeque::new(),
        }
    }
}

impl Transport for SelfTransport {
    fn name(&self) -> &'static str {
        "self"
    }

    fn card(&self) -> &str {
        ""
    }

    fn reachable(&self, _card: &str) -> bool {
        false
    }

    fn add_peer(&mut self, _peer: PeerRank, _card: &str) -> Result<()> {
        Ok(())
    }

    fn eager_limit(&self) -> usize {
        SELF_EAGER_LIMIT
    }

    fn send(&mut self, _peer: PeerRank, header: &Header, payload: &[u8]) -> Result<()> {
        self.queue
            .push_back((*header, Payload::Copied(payload.to_vec())));
        Ok(())
    }

    unsafe fn send_zcopy(
        &mut self,
        _peer: PeerRank,
        header: &Header,
        payload: *const u8,
        len: usize,
        token: u64,
    ) -> Result<()> {
        self.queue.push_back((
            *header,
            Payload::Borrowed {
                ptr: payload,
                len,
                token,
            },
        ));
        Ok(())
    }

    fn poll(&mut self, sink: &mut dyn PacketSink) -> Result<bool> {
        // Only what is queued now: packets sent while delivering (a CTS
        // answering an RTS) wait for the next poll, as on a wire.
        let pending = self.queue.len();
        for _ in 0..pending {
            let Some((header, payload)) = self.queue.pop_front() else {
                break;
            };
            let bytes: &[u8] = match &payload {
                Payload::Copied(v) => v,
                // SAFETY: `send_zcopy`'s caller keeps the buffer valid and
                // unmodified until `on_send_complete(token)`, reported below.
                Payload::Borrowed { ptr, len, .. } => unsafe {
                    std::slice::from_raw_parts(*ptr, *len)
                },
            };
            // Our own packets cannot be malformed; an error here is the
            // ADI's verdict on the header, reported like any peer failure.
            if let Err(e) = sink.on_packet(self.rank, &header, bytes) {
                sink.on_peer_failed(self.rank, e);
            }
            if let Payload::Borrowed { token, .. } = payload {
                sink.on_send_complete(token);
            }
        }
        Ok(pending > 0)
    }

    fn arm_wakeup(&mut self) -> Result<Option<RawFd>> {
        Ok(None)
    }

    fn disarm_wakeup(&mut self) -> Result<()> {
        Ok(())
    }

    fn has_pending_sends(&self) -> bool {
        !self.queue.is_empty()
    }
}
