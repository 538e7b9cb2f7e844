//! What two soft NICs say to each other over a queue pair's stream.
//!
//! The connecting side opens with a [`Hello`] naming both queue pairs;
//! then each side sends request frames (its queue pair as requester) and
//! response frames (as responder), interleaved, in order. Every frame is a
//! fixed 40-byte header followed by `data_len` bytes of data (little-endian):
//!
//! ```text
//! kind u8 | aux u8 | reserved u16 | rkey u32 | addr u64 | x u64 | y u64 | data_len u32 | reserved u32
//! ```
//!
//! `aux` is the requester's `rnr_retry` in a SEND and the status in a NAK;
//! `x`/`y` are the RDMA READ length, the addend, or compare and swap values,
//! and an atomic's original value. Decoding checks everything (kind, which
//! kinds carry data, lengths, statuses): a malformed frame is an error,
//! never a panic, and never an allocation beyond [`MAX_MESSAGE`].

use crate::provider::{Gid, RemoteAddr, WcStatus};
use std::io::{self, Read};

/// Largest message (SEND, RDMA WRITE or READ) the soft provider carries,
/// as `max_msg_sz` of a device: 1 GiB.
pub(super) const MAX_MESSAGE: u32 = 1 << 30;

const HEADER_LEN: usize = 40;
const HELLO_LEN: usize = 40;
const MAGIC: &[u8; 4] = b"OXSN";
/// Version of the soft NIC's wire protocol.
const VERSION: u16 = 1;

/// A request: work one queue pair asks its peer's NIC to execute.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Request {
    /// A SEND, with the requester's RNR retry count.
    Send {
        /// The requester's `rnr_retry` (7: for ever).
        rnr_retry: u8,
        /// The message.
        data: Vec<u8>,
    },
    /// An RDMA WRITE.
    Write {
        /// Where.
        remote: RemoteAddr,
        /// What.
        data: Vec<u8>,
    },
    /// An RDMA READ of `len` bytes.
    Read {
        /// From where.
        remote: RemoteAddr,
        /// How many bytes.
        len: u32,
    },
    /// An atomic fetch-and-add.
    FetchAdd {
        /// The word.
        remote: RemoteAddr,
        /// The addend.
        add: u64,
    },
    /// An atomic compare-and-swap.
    CompareSwap {
        /// The word.
        remote: RemoteAddr,
        /// Expected value.
        compare: u64,
        /// New value.
        swap: u64,
    },
}

/// A response: the outcome of the oldest request the peer has outstanding.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Response {
    /// A SEND or RDMA WRITE was done.
    Ack,
    /// The data of an RDMA READ.
    ReadData(Vec<u8>),
    /// The original value of an atomic's word.
    AtomicOriginal(u64),
    /// The request failed on the responder.
    Nak(WcStatus),
}

/// A frame between two connected queue pairs.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Frame {
    /// A request to execute.
    Request(Request),
    /// A response to a request of ours.
    Response(Response),
}

impl Frame {
    /// Encodes it.
    pub(super) fn encode(&self) -> Vec<u8> {
        let (kind, aux, remote, x, y, data): (u8, u8, Option<&RemoteAddr>, u64, u64, &[u8]) =
            match self {
                Frame::Request(Request::Send { rnr_retry, data }) => {
                    (1, *rnr_retry, None, 0, 0, data)
                }
                Frame::Request(Request::Write { remote, data }) => (2, 0, Some(remote), 0, 0, data),
                Frame::Request(Request::Read { remote, len }) => {
                    (3, 0, Some(remote), (*len).into(), 0, &[])
                }
                Frame::Request(Request::FetchAdd { remote, add }) => {
                    (4, 0, Some(remote), *add, 0, &[])
                }
                Frame::Request(Request::CompareSwap {
                    remote,
                    compare,
                    swap,
                }) => (5, 0, Some(remote), *compare, *swap, &[]),
                Frame::Response(Response::Ack) => (6, 0, None, 0, 0, &[]),
                Frame::Response(Response::ReadData(data)) => (7, 0, None, 0, 0, data),
                Frame::Response(Response::AtomicOriginal(v)) => (8, 0, None, *v, 0, &[]),
                Frame::Response(Response::Nak(status)) => {
                    (9, *status as u32 as u8, None, 0, 0, &[])
                }
            };
        let mut b = Vec::with_capacity(HEADER_LEN + data.len());
        b.push(kind);
        b.push(aux);
        b.extend_from_slice(&[0, 0]);
        b.extend_from_slice(&remote.map_or(0, |r| r.rkey).to_le_bytes());
        b.extend_from_slice(&remote.map_or(0, |r| r.addr).to_le_bytes());
        b.extend_from_slice(&x.to_le_bytes());
        b.extend_from_slice(&y.to_le_bytes());
        b.extend_from_slice(&(data.len() as u32).to_le_bytes());
        b.extend_from_slice(&[0; 4]);
        b.extend_from_slice(data);
        b
    }
}

/// Why no frame could be read.
#[derive(Debug)]
pub(super) enum ReadError {
    /// The stream ended or failed.
    Closed(io::Error),
    /// The peer sent something that is not a valid frame.
    Malformed(String),
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

/// Decodes a frame header; returns the frame with an empty data buffer of
/// the right size to fill in, or why the header is invalid.
fn decode_header(h: &[u8; HEADER_LEN]) -> Result<(Frame, usize), String> {
    let kind = h[0];
    let aux = h[1];
    let remote = RemoteAddr {
        rkey: u32_at(h, 4),
        addr: u64_at(h, 8),
    };
    let x = u64_at(h, 16);
    let y = u64_at(h, 24);
    let data_len = u32_at(h, 32);
    if data_len > MAX_MESSAGE {
        return Err(format!(
            "frame of {data_len} bytes, above the {MAX_MESSAGE}-byte limit"
        ));
    }
    let carries_data = matches!(kind, 1 | 2 | 7);
    if !carries_data && data_len != 0 {
        return Err(format!("frame kind {kind} cannot carry data"));
    }
    let frame = match kind {
        1 if aux <= 7 => Frame::Request(Request::Send {
            rnr_retry: aux,
            data: Vec::new(),
        }),
        1 => return Err(format!("rnr_retry {aux} above 7")),
        2 => Frame::Request(Request::Write {
            remote,
            data: Vec::new(),
        }),
        3 => {
            let len = u32::try_from(x)
                .ok()
                .filter(|&l| l <= MAX_MESSAGE)
                .ok_or_else(|| format!("RDMA READ of {x} bytes"))?;
            Frame::Request(Request::Read { remote, len })
        }
        4 => Frame::Request(Request::FetchAdd { remote, add: x }),
        5 => Frame::Request(Request::CompareSwap {
            remote,
            compare: x,
            swap: y,
        }),
        6 => Frame::Response(Response::Ack),
        7 => Frame::Response(Response::ReadData(Vec::new())),
        8 => Frame::Response(Response::AtomicOriginal(x)),
        9 => {
            let status = WcStatus::from_ibv(aux.into());
            if !matches!(
                status,
                WcStatus::RemAccessErr
                    | WcStatus::RemInvReqErr
                    | WcStatus::RemOpErr
                    | WcStatus::RnrRetryExcErr
            ) {
                return Err(format!("NAK with status {aux}, which no responder sends"));
            }
            Frame::Response(Response::Nak(status))
        }
        other => return Err(format!("unknown frame kind {other}")),
    };
    Ok((frame, data_len as usize))
}

/// Reads one frame from `stream`.
pub(super) fn read_frame(stream: &mut impl Read) -> Result<Frame, ReadError> {
    let mut h = [0u8; HEADER_LEN];
    stream.read_exact(&mut h).map_err(ReadError::Closed)?;
    let (mut frame, data_len) = decode_header(&h).map_err(ReadError::Malformed)?;
    if let Frame::Request(Request::Send { data, .. } | Request::Write { data, .. })
    | Frame::Response(Response::ReadData(data)) = &mut frame
    {
        data.resize(data_len, 0);
        stream.read_exact(data).map_err(ReadError::Closed)?;
    }
    Ok(frame)
}

/// The first message on a queue pair's stream, from the connecting side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Hello {
    /// The connecting soft NIC's identity.
    pub from_gid: Gid,
    /// The connecting queue pair.
    pub from_qpn: u32,
    /// The queue pair it wants, on the accepting NIC.
    pub to_qpn: u32,
    /// The connecting queue pair's first PSN (its card's).
    pub psn: u32,
}

impl Hello {
    /// Encodes it.
    pub(super) fn encode(&self) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        b[0..4].copy_from_slice(MAGIC);
        b[4..6].copy_from_slice(&VERSION.to_le_bytes());
        b[8..24].copy_from_slice(&self.from_gid.0);
        b[24..28].copy_from_slice(&self.from_qpn.to_le_bytes());
        b[28..32].copy_from_slice(&self.to_qpn.to_le_bytes());
        b[32..36].copy_from_slice(&self.psn.to_le_bytes());
        b
    }

    /// Reads and checks one from `stream`.
    pub(super) fn read(stream: &mut impl Read) -> Result<Hello, String> {
        let mut b = [0u8; HELLO_LEN];
        stream
            .read_exact(&mut b)
            .map_err(|e| format!("no hello: {e}"))?;
        if &b[0..4] != MAGIC {
            return Err("not a soft NIC (bad magic)".into());
        }
        let version = u16::from_le_bytes([b[4], b[5]]);
        if version != VERSION {
            return Err(format!(
                "soft NIC protocol version {version}, this build speaks {VERSION}"
            ));
        }
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[8..24]);
        Ok(Hello {
            from_gid: Gid(gid),
            from_qpn: u32_at(&b, 24),
            to_qpn: u32_at(&b, 28),
            psn: u32_at(&b, 32),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(f: Frame) {
        let bytes = f.encode();
        let back = read_frame(&mut &bytes[..]).unwrap();
        assert_eq!(back, f);
    }

    #[test]
    fn frames_round_trip() {
        let remote = RemoteAddr {
            addr: 0x1000,
            rkey: 77,
        };
        round_trip(Frame::Request(Request::Send {
            rnr_retry: 7,
            data: b"hello".to_vec(),
        }));
        round_trip(Frame::Request(Request::Write {
            remote,
            data: vec![1, 2, 3],
        }));
        round_trip(Frame::Request(Request::Read { remote, len: 4096 }));
        round_trip(Frame::Request(Request::FetchAdd { remote, add: 5 }));
        round_trip(Frame::Request(Request::CompareSwap {
            remote,
            compare: 1,
            swap: 2,
        }));
        round_trip(Frame::Response(Response::Ack));
        round_trip(Frame::Response(Response::ReadData(vec![9; 10])));
        round_trip(Frame::Response(Response::AtomicOriginal(u64::MAX)));
        round_trip(Frame::Response(Response::Nak(WcStatus::RemAccessErr)));
        let hello = Hello {
            from_gid: Gid([3; 16]),
            from_qpn: 9,
            to_qpn: 10,
            psn: 11,
        };
        assert_eq!(Hello::read(&mut &hello.encode()[..]).unwrap(), hello);
    }

    #[test]
    fn malformed_frames_are_errors() {
        let mut h = Frame::Response(Response::Ack).encode();
        h[0] = 42;
        assert!(matches!(
            read_frame(&mut &h[..]),
            Err(ReadError::Malformed(_))
        ));
        // An ACK that claims data.
        let mut h = Frame::Response(Response::Ack).encode();
        h[32] = 1;
        assert!(matches!(
            read_frame(&mut &h[..]),
            Err(ReadError::Malformed(_))
        ));
        // A SEND above the size limit: refused before any allocation.
        let mut h = Frame::Request(Request::Send {
            rnr_retry: 0,
            data: vec![],
        })
        .encode();
        h[32..36].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            read_frame(&mut &h[..]),
            Err(ReadError::Malformed(_))
        ));
        // A NAK with a status no responder sends.
        let mut h = Frame::Response(Response::Nak(WcStatus::RemOpErr)).encode();
        h[1] = WcStatus::WrFlushErr as u32 as u8;
        assert!(matches!(
            read_frame(&mut &h[..]),
            Err(ReadError::Malformed(_))
        ));
        // A SEND whose data is cut short.
        let f = Frame::Request(Request::Send {
            rnr_retry: 1,
            data: vec![1; 8],
        })
        .encode();
        assert!(matches!(
            read_frame(&mut &f[..44]),
            Err(ReadError::Closed(_))
        ));
        let mut hello = Hello {
            from_gid: Gid([0; 16]),
            from_qpn: 1,
            to_qpn: 2,
            psn: 3,
        }
        .encode();
        hello[4] = 9;
        assert!(Hello::read(&mut &hello[..]).is_err());
    }
}
