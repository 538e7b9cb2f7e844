//! What two ranks of the shared-memory transport agree on: the layout of a
//! queue segment, the set-up message that hands a segment over, the frame
//! control word of the queue, and the version that covers all of them.
//!
//! # A queue segment
//! One segment holds one single-producer single-consumer queue, from the
//! rank that created it (the producer) to one peer (the consumer). It is a
//! header (its [`SegmentLayout`], then the fields both sides write)
//! followed by `cell_count` cells of [`CELL`] bytes:
//!
//! | offset | size | field              | written by | meaning                                        |
//! |-------:|-----:|--------------------|------------|------------------------------------------------|
//! | 0      | 8    | magic              | creator    | [`SEGMENT_MAGIC`]                               |
//! | 8      | 4    | version            | creator    | [`SHM_VERSION`]; another version is refused     |
//! | 12     | 4    | cells offset       | creator    | where the cells start ([`CELLS_OFFSET`])        |
//! | 16     | 4    | cell size          | creator    | [`CELL`]                                        |
//! | 20     | 4    | cell count         | creator    | a power of two                                 |
//! | 24     | 4    | producer           | creator    | world rank of the producer                      |
//! | 28     | 4    | consumer           | creator    | world rank of the consumer                      |
//! | 128    | 8    | head               | consumer   | position of the next cell it will read          |
//! | 256    | 4    | consumer sleeping  | consumer   | non-zero: poke its socket after publishing      |
//! | 264    | 4    | barriers agreed    | consumer   | non-zero: both sides use [`crate::ring::Barriers::Asymmetric`] (set before its VERDICT) |
//! | 384    | 4    | producer waiting   | producer   | non-zero: poke its socket after freeing cells   |
//! | 392    | 4    | producer barriers  | producer   | non-zero: its process can take part in asymmetric barriers (set before handing the segment over) |
//! | 512    |      | cells              | producer   | frames (see [`crate::ring`])                    |
//!
//! Fields written by different sides are [`LINE`] bytes apart, so that a
//! write by one side never takes a cache line (or the line the hardware
//! prefetches with it) the other side is reading. The producer's write
//! position has no field: each frame is published in its own first cell
//! (the control word), so a consumer that waits reads only the cell it
//! will consume.
//!
//! All integers are little-endian (the two ends run on one host).

use crate::host::NAME_MAX;
use oxmpi_adi::matching::Envelope;
use oxmpi_adi::proto::{Header, Kind};

/// First bytes of every queue segment.
pub(crate) const SEGMENT_MAGIC: [u8; 8] = *b"OXMPISHM";
/// Version of the segment layout, the frame format and the set-up
/// message; a peer of another version is refused.
pub const SHM_VERSION: u32 = 7;
/// Size of a queue cell: one cache line.
pub(crate) const CELL: usize = 64;
/// Distance between fields written by different sides: two cache lines,
/// since x86's adjacent-line prefetcher moves lines in pairs.
pub(crate) const LINE: usize = 128;
/// Where the cells start: after the layout and the three shared fields,
/// each on its own [`LINE`].
pub(crate) const CELLS_OFFSET: usize = 4 * LINE;
/// Offset of the consumer's head (`AtomicU64`).
pub(crate) const HEAD_OFFSET: usize = LINE;
/// Offset of the consumer's sleeping flag (`AtomicU32`).
pub(crate) const CONSUMER_SLEEPING_OFFSET: usize = 2 * LINE;
/// Offset of the producer's waiting flag (`AtomicU32`).
pub(crate) const PRODUCER_WAITING_OFFSET: usize = 3 * LINE;
/// Offset of the consumer's word saying whether the queue's sides use
/// asymmetric barriers (`AtomicU32`): beside its sleeping flag, as it is
/// written once, at set-up.
pub(crate) const BARRIERS_AGREED_OFFSET: usize = CONSUMER_SLEEPING_OFFSET + 8;
/// Offset of the producer's word saying whether it can use asymmetric
/// barriers (`AtomicU32`), written once, at creation.
pub(crate) const PRODUCER_BARRIERS_OFFSET: usize = PRODUCER_WAITING_OFFSET + 8;

/// The part of a segment's header the creator writes once, before handing
/// the segment over. See the module docs for the whole layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub(crate) struct SegmentLayout {
    /// [`SEGMENT_MAGIC`]: the descriptor is an oxmpi queue segment.
    pub magic: [u8; 8],
    /// The creator's [`SHM_VERSION`].
    pub version: u32,
    /// Bytes from the start of the segment to the first cell.
    pub cells_offset: u32,
    /// Bytes per cell.
    pub cell_size: u32,
    /// Number of cells, a power of two.
    pub cell_count: u32,
    /// World rank of the producer (the creator).
    pub producer: u32,
    /// World rank of the consumer.
    pub consumer: u32,
}

/// Bytes of a frame's control word, at the start of its first cell.
pub(crate) const CONTROL_LEN: usize = 8;

/// What a frame carries, in the low byte of its control word. A packet is
/// one [`FrameKind::Header`] frame (the packet header and the first
/// payload bytes) followed by as many [`FrameKind::Data`] frames as the
/// rest of its payload needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FrameKind {
    /// A packet header, then payload bytes.
    Header = 1,
    /// Payload bytes of the packet whose header came last.
    Data = 2,
    /// A packet header without its last [`SHORT_HEADER_SAVING`] bytes,
    /// which are zero (the receiver's token, unused by eager packets),
    /// then payload bytes: so that an 8-byte message fits one cell.
    ShortHeader = 3,
    /// A whole standard eager message: the packet's [`SHORT_FIELDS`]
    /// bytes of header fields (see [`encode_short`]), then its payload,
    /// at most [`SHORT_FRAME_PAYLOAD_MAX`] bytes: one cell for up to
    /// [`SHORT_PAYLOAD_MAX`], several cells (not wrapping past the ring's
    /// end) above (format version 6). The receiver takes it in one step,
    /// published by one store.
    Short = 4,
}

/// The zero bytes at the end of a packet header that a
/// [`FrameKind::ShortHeader`] frame leaves out.
pub(crate) const SHORT_HEADER_SAVING: usize = 8;

impl FrameKind {
    /// Bytes of packet header at the start of a frame of this kind.
    pub(crate) fn header_len(self) -> usize {
        match self {
            FrameKind::Header => oxmpi_adi::proto::HEADER_LEN,
            FrameKind::ShortHeader => oxmpi_adi::proto::HEADER_LEN - SHORT_HEADER_SAVING,
            FrameKind::Short => SHORT_FIELDS,
            FrameKind::Data => 0,
        }
    }
}

/// Bytes of header fields at the start of a [`FrameKind::Short`] frame:
/// the sequence, context id, source and tag, each 4 bytes. The rest of
/// the header is implied (an eager packet without flags or tokens) and
/// the message length is the frame's.
pub(crate) const SHORT_FIELDS: usize = 16;
/// Most payload bytes of a [`FrameKind::Short`] frame: what one cell
/// holds after the control word and the fields.
pub(crate) const SHORT_PAYLOAD_MAX: usize = CELL - CONTROL_LEN - SHORT_FIELDS;
/// Most payload bytes of a [`FrameKind::Short`] frame of several cells:
/// what the reader's buffer for a packet that arrives whole holds
/// ([`crate::inbound::WHOLE_MAX`]).
pub(crate) const SHORT_FRAME_PAYLOAD_MAX: usize = crate::inbound::WHOLE_MAX;

/// The fields of a [`FrameKind::Short`] frame for a packet with
/// `header` and `payload`, when the packet may travel as one: a standard
/// eager message (no flags, no tokens, no address) of at most
/// [`SHORT_PAYLOAD_MAX`] bytes. `None` otherwise.
#[inline]
pub(crate) fn encode_short(header: &Header, payload: &[u8]) -> Option<[u8; SHORT_FIELDS]> {
    let standard_eager = header.kind == Kind::Eager
        && header.flags == 0
        && header.sender_token == 0
        && header.receiver_token == 0
        && header.address == 0;
    if !standard_eager
        || payload.len() > SHORT_PAYLOAD_MAX
        || header.message_len != payload.len() as u64
    {
        return None;
    }
    let envelope = Envelope {
        context_id: header.context_id,
        source: header.source,
        tag: header.tag,
    };
    Some(short_fields(header.sequence, envelope))
}

/// The fields of a [`FrameKind::Short`] frame for a standard eager
/// packet with `sequence` and `envelope` (read back by [`decode_short`]).
#[inline]
pub(crate) fn short_fields(sequence: u32, envelope: Envelope) -> [u8; SHORT_FIELDS] {
    let mut fields = [0u8; SHORT_FIELDS];
    fields[0..4].copy_from_slice(&sequence.to_le_bytes());
    fields[4..8].copy_from_slice(&envelope.context_id.to_le_bytes());
    fields[8..12].copy_from_slice(&envelope.source.to_le_bytes());
    fields[12..16].copy_from_slice(&envelope.tag.to_le_bytes());
    fields
}

/// What the fields of a [`FrameKind::Short`] frame say: the packet's
/// sequence number and its message's envelope. The rest of the header is
/// implied ([`Header::standard_eager`]), the length is the frame's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ShortFields {
    /// The packet's sequence number.
    pub(crate) sequence: u32,
    /// The message's context id, source and tag.
    pub(crate) envelope: Envelope,
}

/// The sequence and envelope that `fields` of a [`FrameKind::Short`]
/// frame carry. Every value makes a valid packet: what they say is the
/// ADI's to judge.
#[inline]
pub(crate) fn decode_short(fields: &[u8; SHORT_FIELDS]) -> ShortFields {
    let u32_at =
        |o: usize| u32::from_le_bytes([fields[o], fields[o + 1], fields[o + 2], fields[o + 3]]);
    ShortFields {
        sequence: u32_at(0),
        envelope: Envelope {
            context_id: u32_at(4),
            source: u32_at(8) as i32,
            tag: u32_at(12) as i32,
        },
    }
}

/// A frame's control word: the frame kind (bits 0-7), the low 32 bits of
/// the frame's position in the queue (bits 8-39, [`position_check`]: the
/// consumer reads the frame it expects, and tells it from a word the last
/// lap of the ring left in the cell), and the number of bytes the frame
/// carries after the control word (bits 40-63; a frame carries far fewer
/// than 2^24). Never zero: zero marks a cell where nothing was published.
pub(crate) fn control_word(kind: FrameKind, position: u64, bytes: usize) -> u64 {
    debug_assert!(bytes < 1 << 24);
    kind as u64 | position_check(position) << 8 | (bytes as u64) << 40
}

/// The part of a queue position a control word carries. A ring has fewer
/// than 2^32 cells, so the word a cell kept from the last lap never
/// carries the check of the position the consumer waits for there.
#[inline]
pub(crate) fn position_check(position: u64) -> u64 {
    position & 0xffff_ffff
}

/// The position check a control word carries (see [`control_word`]).
#[inline]
pub(crate) fn check_of(word: u64) -> u64 {
    (word >> 8) & 0xffff_ffff
}

/// The parts of a control word read from the queue, not yet checked
/// against anything: `(kind, position check, bytes)`, the kind `None` when
/// it is not one this version knows.
pub(crate) fn parse_control_word(word: u64) -> (Option<FrameKind>, u64, u64) {
    let kind = match word & 0xff {
        1 => Some(FrameKind::Header),
        2 => Some(FrameKind::Data),
        3 => Some(FrameKind::ShortHeader),
        4 => Some(FrameKind::Short),
        _ => None,
    };
    (kind, check_of(word), word >> 40)
}

/// Size of the set-up message.
pub(crate) const SETUP_LEN: usize = 128;
/// First bytes of the set-up message.
const SETUP_MAGIC: &[u8; 4] = b"OXSQ";

/// The set-up message: sent by the rank that opened a connection, right
/// after its handshake RESPONSE, with the descriptor of the segment of its
/// queue to the acceptor attached. Layout: magic `OXSQ` (4), version (4),
/// name length (2), reserved (6), the sender's listener name (at most
/// [`NAME_MAX`] bytes), zeroes to [`SETUP_LEN`]. The name lets the
/// acceptor open its own queue back without the sender's card.
pub(crate) fn encode_setup(name: &[u8]) -> [u8; SETUP_LEN] {
    let mut b = [0u8; SETUP_LEN];
    b[0..4].copy_from_slice(SETUP_MAGIC);
    b[4..8].copy_from_slice(&SHM_VERSION.to_le_bytes());
    let len = name.len().min(NAME_MAX);
    b[8..10].copy_from_slice(&(len as u16).to_le_bytes());
    b[16..16 + len].copy_from_slice(&name[..len]);
    b
}

/// Why a set-up message was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum SetupError {
    /// Not a set-up message.
    Magic,
    /// The sender speaks another version.
    Version {
        /// The sender's version.
        theirs: u32,
    },
    /// The name does not fit or is not a listener name.
    Name,
}

impl std::fmt::Display for SetupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SetupError::Magic => write!(f, "not a shared-memory set-up message"),
            SetupError::Version { theirs } => write!(
                f,
                "it speaks shared-memory version {theirs}, this rank speaks {SHM_VERSION}: \
                 run the same oxmpi on every rank"
            ),
            SetupError::Name => write!(f, "its set-up message names no valid listener"),
        }
    }
}

/// Decodes a set-up message: the sender's listener name.
pub(crate) fn decode_setup(b: &[u8; SETUP_LEN]) -> Result<Vec<u8>, SetupError> {
    if &b[0..4] != SETUP_MAGIC {
        return Err(SetupError::Magic);
    }
    let version = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    if version != SHM_VERSION {
        return Err(SetupError::Version { theirs: version });
    }
    let len = u16::from_le_bytes([b[8], b[9]]) as usize;
    if len == 0 || len > NAME_MAX {
        return Err(SetupError::Name);
    }
    let name = &b[16..16 + len];
    if !crate::host::is_listener_name(name) {
        return Err(SetupError::Name);
    }
    Ok(name.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layout_is_what_the_docs_say() {
        assert_eq!(std::mem::size_of::<SegmentLayout>(), 32);
        assert!(std::mem::size_of::<SegmentLayout>() <= HEAD_OFFSET);
        assert_eq!(CELLS_OFFSET, 512);
        assert_eq!(CELLS_OFFSET % CELL, 0);
    }

    #[test]
    fn control_words_round_trip_and_are_never_zero() {
        for kind in [
            FrameKind::Header,
            FrameKind::Data,
            FrameKind::ShortHeader,
            FrameKind::Short,
        ] {
            for (position, bytes) in [(0, 0), (0x1_2345, 56), (u64::MAX, (1 << 24) - 1)] {
                let word = control_word(kind, position, bytes);
                assert_ne!(word, 0);
                assert_eq!(
                    parse_control_word(word),
                    (Some(kind), position & 0xffff_ffff, bytes as u64)
                );
            }
        }
        assert_eq!(parse_control_word(7).0, None);
    }

    #[test]
    fn short_frames_carry_standard_eager_packets_of_one_cell() {
        let header = Header {
            sequence: 7,
            context_id: 0x1234_5678,
            source: -3,
            tag: i32::MAX,
            message_len: 40,
            ..Header::new(Kind::Eager)
        };
        let fields = encode_short(&header, &[1; 40]).expect("fits a cell");
        let ShortFields { sequence, envelope } = decode_short(&fields);
        assert_eq!(Header::standard_eager(sequence, envelope, 40), header);
        assert_eq!(CONTROL_LEN + SHORT_FIELDS + SHORT_PAYLOAD_MAX, CELL);
        // Too long, a length that is not the payload's, or anything a
        // short frame cannot say: the packet goes with its whole header.
        let long = Header {
            message_len: 41,
            ..header
        };
        assert_eq!(encode_short(&long, &[1; 41]), None);
        assert_eq!(encode_short(&header, &[1; 8]), None);
        for other in [
            Header {
                flags: oxmpi_adi::proto::FLAG_SYNC,
                sender_token: 5,
                ..header
            },
            Header {
                sender_token: 5,
                ..header
            },
            Header {
                kind: Kind::Active,
                ..header
            },
        ] {
            assert_eq!(encode_short(&other, &[1; 40]), None, "{other:?}");
        }
    }

    #[test]
    fn setup_messages_check_magic_version_and_name() {
        let name = b"oxmpi-shm-42-0123456789abcdef";
        assert_eq!(decode_setup(&encode_setup(name)), Ok(name.to_vec()));
        let mut other = encode_setup(name);
        other[4] = 9;
        assert_eq!(decode_setup(&other), Err(SetupError::Version { theirs: 9 }));
        assert!(decode_setup(&other)
            .unwrap_err()
            .to_string()
            .contains("version 9"));
        let mut garbage = encode_setup(name);
        garbage[0] = b'X';
        assert_eq!(decode_setup(&garbage), Err(SetupError::Magic));
        assert_eq!(decode_setup(&encode_setup(b"")), Err(SetupError::Name));
        assert_eq!(
            decode_setup(&encode_setup(b"not:a listener")),
            Err(SetupError::Name)
        );
        let mut long = encode_setup(name);
        long[8..10].copy_from_slice(&500u16.to_le_bytes());
        assert_eq!(decode_setup(&long), Err(SetupError::Name));
    }
}
