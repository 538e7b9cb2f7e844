//! The reading end of a peer's queue: frames back into packets, delivered
//! to the ADI's [`PacketSink`] and copied straight into the buffers it
//! names.

use crate::proto::{FrameKind, CELL, SHORT_PAYLOAD_MAX};
use crate::ring::{Consumer, Corrupt, Frame, Head};
use crate::{broke_protocol, corrupt};
use oxmpi_adi::proto::{Header, HEADER_LEN};
use oxmpi_adi::transport::{PacketSink, PayloadSlot, PeerRank};
use oxmpi_adi::{Error, ErrorClass, Result};

/// Largest payload a packet that arrives whole in one header frame may
/// have to be handed to the ADI in one step ([`PacketSink::on_packet`]),
/// after a copy out of the queue into [`InLink::whole`]: the copy of up to
/// 2 KiB, from lines the first copy just brought into the cache, costs
/// less than the two further calls into the ADI (`payload_buffer`,
/// `on_payload`) it saves.
pub(crate) const WHOLE_MAX: usize = 2048;

/// What an inbound queue's reader is in the middle of.
#[derive(Clone, Copy)]
pub(crate) enum ReadState {
    Header,
    Payload {
        slot: Option<PayloadSlot>,
        /// Payload bytes still to come.
        remaining: u64,
        /// Bytes already placed in the slot's buffer.
        placed: usize,
    },
}

/// A peer's queue to this rank.
pub(crate) struct InLink {
    pub peer: PeerRank,
    pub consumer: Consumer,
    /// The connection the peer handed the queue over.
    pub conn: usize,
    pub read: ReadState,
    /// Where the payload of a packet that arrived whole goes before the ADI
    /// takes it (see [`WHOLE_MAX`]).
    pub whole: Box<[u8; WHOLE_MAX]>,
}

impl InLink {
    /// Delivers what the queue holds (at most one queue's worth of cells,
    /// so that one busy peer does not hold the poll). Returns whether a
    /// frame was read.
    ///
    /// A run of short frames (short messages) is read here, each judged
    /// by one look at its control word ([`Consumer::look`]); the first
    /// frame of another kind hands the rest of the poll's share to
    /// [`InLink::receive_frames`], out of line, so that this loop, the
    /// path of a short message from its detection to its delivery, keeps
    /// a small frame (callgrind, 8-byte `oxbench latency`: the poll's read
    /// of a message 394 -> 330 instructions, 256 bytes 448 -> 395).
    #[inline(always)]
    pub(crate) fn receive(&mut self, sink: &mut dyn PacketSink) -> Result<bool> {
        let mut budget = self.consumer.cells() as usize * CELL;
        let mut progressed = false;
        while budget > 0 {
            match self.consumer.look() {
                Head::Empty => break,
                Head::Short(frame) if matches!(self.read, ReadState::Header) => {
                    budget = budget.saturating_sub(self.deliver_short(sink, &frame)?);
                    progressed = true;
                }
                _ => return Ok(self.receive_frames(sink, budget)? | progressed),
            }
        }
        Ok(progressed)
    }

    /// Hands the [`FrameKind::Short`] frame at the head, a whole packet,
    /// to the ADI in one step and frees its cells. Returns the bytes it
    /// counts against the poll's share.
    #[inline(always)]
    fn deliver_short(&mut self, sink: &mut dyn PacketSink, frame: &Frame) -> Result<usize> {
        let n = frame.payload_len();
        if n <= SHORT_PAYLOAD_MAX {
            // One cell: fixed-size copies of the whole cell.
            let (fields, payload) = self.consumer.short(frame);
            self.consumer.advance(frame);
            sink.on_standard_eager(self.peer, fields.sequence, fields.envelope, &payload[..n])
                .map_err(|e| broke_protocol(self.peer, e))?;
            return Ok(CELL);
        }
        // Several cells (`look` and `peek` bounded the length by the
        // buffer's).
        let fields = self.consumer.short_fields(frame);
        let payload = &mut self.whole[..n];
        self.consumer.copy_payload(frame, payload);
        self.consumer.advance(frame);
        sink.on_standard_eager(self.peer, fields.sequence, fields.envelope, payload)
            .map_err(|e| broke_protocol(self.peer, e))?;
        Ok(n + HEADER_LEN)
    }

    /// Reads frames of every kind while the poll's share, `budget` bytes
    /// of cells, lasts. Returns whether a frame was read.
    #[inline(never)]
    fn receive_frames(&mut self, sink: &mut dyn PacketSink, mut budget: usize) -> Result<bool> {
        let peer = self.peer;
        let mut progressed = false;
        while budget > 0 {
            let Some(frame) = self.consumer.peek().map_err(|c| corrupt(peer, c))? else {
                break;
            };
            let n = frame.payload_len();
            let (slot, mut remaining, mut placed) = match (frame.kind, self.read) {
                (FrameKind::Short, ReadState::Header) => {
                    // A whole packet: the ADI takes it in one step.
                    budget = budget.saturating_sub(self.deliver_short(sink, &frame)?);
                    progressed = true;
                    continue;
                }
                (FrameKind::Header | FrameKind::ShortHeader, ReadState::Header) => {
                    let header = Header::decode(&self.consumer.header(&frame)).map_err(|e| {
                        Error::new(
                            ErrorClass::ProcFailed,
                            format!("rank {peer} sent a malformed packet: {e}"),
                        )
                    })?;
                    if n as u64 > header.payload_len() {
                        return Err(corrupt(
                            peer,
                            Corrupt(format!(
                                "a header frame carries {n} payload bytes of a packet of {}",
                                header.payload_len()
                            )),
                        ));
                    }
                    if n as u64 == header.payload_len() && n <= WHOLE_MAX {
                        let payload = &mut self.whole[..n];
                        self.consumer.copy_payload(&frame, payload);
                        self.consumer.advance(&frame);
                        sink.on_packet(peer, &header, payload)
                            .map_err(|e| broke_protocol(peer, e))?;
                        budget = budget.saturating_sub(n + HEADER_LEN);
                        progressed = true;
                        continue;
                    }
                    let slot = sink
                        .on_header(peer, &header)
                        .map_err(|e| broke_protocol(peer, e))?;
                    (slot, header.payload_len(), 0)
                }
                (
                    FrameKind::Data,
                    ReadState::Payload {
                        slot,
                        remaining,
                        placed,
                    },
                ) if n as u64 <= remaining => (slot, remaining, placed),
                (kind, _) => {
                    return Err(corrupt(
                        peer,
                        Corrupt(format!("a {kind:?} frame of {n} bytes out of place")),
                    ))
                }
            };
            if n > 0 {
                let dest: &mut [u8] = match slot {
                    Some(s) => sink.payload_buffer(s),
                    None => &mut [],
                };
                let keep = n.min(dest.len().saturating_sub(placed));
                self.consumer
                    .copy_payload(&frame, &mut dest[placed..placed + keep]);
                placed += keep;
                remaining -= n as u64;
            }
            self.consumer.advance(&frame);
            budget = budget.saturating_sub(n + HEADER_LEN);
            progressed = true;
            if remaining == 0 {
                self.read = ReadState::Header;
                if let Some(s) = slot {
                    sink.on_payload(peer, s);
                }
            } else {
                self.read = ReadState::Payload {
                    slot,
                    remaining,
                    placed,
                };
            }
        }
        Ok(progressed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxmpi_adi::proto::Kind;

    /// A sink that takes every payload into one buffer of 64 bytes.
    #[derive(Default)]
    struct Sink {
        headers: Vec<Header>,
        buffer: Vec<u8>,
        placed: usize,
        /// Packets handed over whole, in one step.
        whole: usize,
    }

    impl PacketSink for Sink {
        fn on_header(&mut self, _peer: PeerRank, header: &Header) -> Result<Option<PayloadSlot>> {
            self.headers.push(*header);
            self.buffer = vec![0; 64];
            Ok(Some(PayloadSlot(0)))
        }
        fn payload_buffer(&mut self, _slot: PayloadSlot) -> &mut [u8] {
            &mut self.buffer
        }
        fn on_payload(&mut self, _peer: PeerRank, _slot: PayloadSlot) {
            self.placed += 1;
        }
        fn on_packet(&mut self, peer: PeerRank, header: &Header, payload: &[u8]) -> Result<()> {
            self.whole += 1;
            oxmpi_adi::transport::deliver_in_steps(self, peer, header, payload)
        }
        fn on_send_complete(&mut self, _token: u64) {}
        fn on_peer_failed(&mut self, _peer: PeerRank, _error: Error) {}
    }

    fn link(consumer: Consumer) -> InLink {
        InLink {
            peer: 0,
            consumer,
            conn: 0,
            read: ReadState::Header,
            whole: Box::new([0; WHOLE_MAX]),
        }
    }

    fn eager(len: usize) -> [u8; HEADER_LEN] {
        Header {
            message_len: len as u64,
            ..Header::new(Kind::Eager)
        }
        .encode()
    }

    #[test]
    fn payloads_land_in_the_sinks_buffer_and_excess_is_dropped() {
        let (mut p, c) = crate::ring::queue(64);
        let mut sent = None;
        let payload: Vec<u8> = (0..100).collect();
        assert!(p.push_packet(&eager(100), &payload, &mut sent).unwrap());
        let mut sink = Sink::default();
        let mut l = link(c);
        assert!(l.receive(&mut sink).unwrap());
        assert_eq!(sink.placed, 1);
        assert_eq!(sink.buffer, payload[..64]);
        assert!(!l.receive(&mut sink).unwrap());
    }

    #[test]
    fn packets_whole_in_their_header_frame_up_to_the_limit_go_in_one_step() {
        let (mut p, c) = crate::ring::queue(256);
        let mut l = link(c);
        let mut sink = Sink::default();
        for (len, whole) in [(0, 1), (41, 2), (WHOLE_MAX, 3), (WHOLE_MAX + 1, 3)] {
            let payload: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let mut sent = None;
            assert!(p.push_packet(&eager(len), &payload, &mut sent).unwrap());
            assert!(l.receive(&mut sink).unwrap());
            assert_eq!((sink.whole, sink.placed), (whole, sink.headers.len()));
            let kept = len.min(sink.buffer.len());
            assert_eq!(sink.buffer[..kept], payload[..kept], "{len} bytes");
        }
    }

    #[test]
    fn a_short_packet_is_delivered_whole() {
        let (mut p, c) = crate::ring::queue(64);
        let header = Header {
            sequence: 3,
            tag: 11,
            message_len: 5,
            ..Header::new(Kind::Eager)
        };
        let fields = crate::proto::encode_short(&header, b"hello").unwrap();
        assert!(p.push_short(&fields, b"hello").unwrap());
        let mut sink = Sink::default();
        let mut l = link(c);
        assert!(l.receive(&mut sink).unwrap());
        assert_eq!((sink.headers.as_slice(), sink.placed), (&[header][..], 1));
        assert_eq!(&sink.buffer[..5], b"hello");
        assert!(!l.receive(&mut sink).unwrap());
    }

    #[test]
    fn short_packets_around_other_frames_arrive_in_order() {
        let (mut p, c) = crate::ring::queue(64);
        let header = |sequence: u32, len: usize| Header {
            sequence,
            message_len: len as u64,
            ..Header::new(Kind::Eager)
        };
        let short = |p: &mut crate::ring::Producer, sequence: u32, payload: &[u8]| {
            let fields =
                crate::proto::encode_short(&header(sequence, payload.len()), payload).unwrap();
            assert!(p.push_short(&fields, payload).unwrap());
        };
        // One-cell frames, a header frame and data frames, a short frame
        // of two cells, one-cell frames again.
        short(&mut p, 0, b"one");
        short(&mut p, 1, b"two");
        let long: Vec<u8> = (0..200).map(|i| i as u8).collect();
        let mut sent = None;
        assert!(p
            .push_packet(&header(2, 200).encode(), &long, &mut sent)
            .unwrap());
        let envelope = oxmpi_adi::matching::Envelope {
            context_id: 0,
            source: 0,
            tag: 0,
        };
        let fields = crate::proto::short_fields(3, envelope);
        assert!(p.push_short_frame(&fields, &long[..50]).unwrap());
        short(&mut p, 4, b"five");
        let mut sink = Sink::default();
        let mut l = link(c);
        assert!(l.receive(&mut sink).unwrap());
        let got: Vec<(u32, u64)> = sink
            .headers
            .iter()
            .map(|h| (h.sequence, h.message_len))
            .collect();
        assert_eq!(got, [(0, 3), (1, 3), (2, 200), (3, 50), (4, 4)]);
        assert_eq!(&sink.buffer[..4], b"five");
        assert!(!l.receive(&mut sink).unwrap());
    }

    #[test]
    fn a_short_frame_of_several_cells_is_delivered_whole() {
        let (mut p, c) = crate::ring::queue(64);
        let envelope = oxmpi_adi::matching::Envelope {
            context_id: 4,
            source: 1,
            tag: 9,
        };
        let payload: Vec<u8> = (0..300).map(|i| i as u8).collect();
        let fields = crate::proto::short_fields(0, envelope);
        assert!(p.push_short_frame(&fields, &payload).unwrap());
        let mut sink = Sink::default();
        let mut l = link(c);
        assert!(l.receive(&mut sink).unwrap());
        let header = Header::standard_eager(0, envelope, payload.len());
        assert_eq!(
            (sink.headers.as_slice(), sink.whole, sink.placed),
            (&[header][..], 1, 1)
        );
        assert_eq!(sink.buffer, payload[..64]);
        assert!(!l.receive(&mut sink).unwrap());
    }

    fn refused(frames: impl FnOnce(&mut crate::ring::Producer)) -> Error {
        let (mut p, c) = crate::ring::queue(64);
        frames(&mut p);
        let e = link(c)
            .receive(&mut Sink::default())
            .expect_err("a broken queue was read");
        assert_eq!(e.class(), ErrorClass::ProcFailed, "{e}");
        assert!(e.message().contains("rank 0"), "{e}");
        e
    }

    #[test]
    fn broken_packets_fail_the_peer_with_the_reason() {
        let e = refused(|p| {
            p.push_header(&[0xab; HEADER_LEN], &[]).unwrap();
        });
        assert!(e.message().contains("malformed packet"), "{e}");
        let e = refused(|p| {
            p.push_data(&[1; 10]).unwrap();
        });
        assert!(e.message().contains("out of place"), "{e}");
        let e = refused(|p| {
            p.push_header(&eager(3), &[1; 10]).unwrap();
        });
        assert!(e.message().contains("carries 10 payload bytes"), "{e}");
        let e = refused(|p| {
            p.push_header(&eager(3), &[1; 3]).unwrap();
            p.push_data(&[1; 3]).unwrap();
        });
        assert!(e.message().contains("out of place"), "{e}");
    }
}
