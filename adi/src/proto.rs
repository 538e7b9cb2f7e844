//! The packet header every transport carries, with checked decoding.
//!
//! A packet is a fixed [`HEADER_LEN`]-byte header, little-endian, followed by
//! [`Header::payload_len`] bytes of payload: the whole message in an eager
//! or data packet, nothing in the others. The layout (offsets in bytes):
//!
//! | offset | size | field            | meaning                                               |
//! |-------:|-----:|------------------|-------------------------------------------------------|
//! | 0      | 2    | magic            | [`MAGIC`], catches a stream that lost its framing      |
//! | 2      | 1    | version          | [`VERSION`]; another version is refused                |
//! | 3      | 1    | kind             | [`Kind`]                                               |
//! | 4      | 4    | sequence         | per-VC packet counter, checked in order by the receiver; 0 in [`Kind::Data`] |
//! | 8      | 4    | context id       | the communicator's context (matching)                  |
//! | 12     | 4    | source           | sender's rank in the communicator (matching)           |
//! | 16     | 4    | tag              | message tag (matching)                                 |
//! | 20     | 4    | flags            | [`FLAG_SYNC`], [`FLAG_REMOTE`], [`FLAG_PIECE`], [`FLAG_ALONE`], [`FLAG_PLACED`], [`FLAG_READY`] where the kind takes them; any other bit is refused |
//! | 24     | 8    | message length   | total bytes of the message                             |
//! | 32     | 8    | address          | with [`FLAG_REMOTE`]: a buffer's address for a remote memory copy; in a [`FLAG_PIECE`] data packet: the piece's stream offset; else 0 |
//! | 40     | 8    | sender token     | the sender's request, for rendezvous replies           |
//! | 48     | 8    | receiver token   | the receiver's request, for rendezvous data; in an RTS with [`FLAG_REMOTE`]: the key the sender's transport offered its buffer under; in a [`FLAG_PLACED`] active message: the key its receiver's placer reads (and a second word, the bound, in the sender token) |
//!
//! Every packet but [`Kind::Data`] is sequenced: a VC numbers them, and the
//! receiver checks that they arrive in order. Data packets are not (their
//! sequence field is 0): each names the receive it fills, so they may
//! arrive in any order, which lets a transport carry them over more than
//! one connection (the TCP data lanes).
//!
//! Decoding never trusts the peer: [`Header::decode`] checks the magic, the
//! version, the kind, the flags, that the lengths agree with the kind, and
//! that a data packet carries no sequence number, that an address comes
//! only with [`FLAG_REMOTE`] and spans no wrap of the address space, and
//! returns a [`DecodeError`] otherwise.
//!
//! # Remote memory copy
//! A transport that can copy between its peers' memory and this process's
//! (shm with cross-memory attach) lets a rendezvous move the data without
//! [`Kind::Data`] packets: the RTS carries [`FLAG_REMOTE`] and the sender's
//! buffer address, the receiver's CTS answers with the flag and its own
//! buffer address, then each side copies a share ([`remote_split`]) at
//! once: the receiver reads the front of the sender's buffer, the sender
//! writes the rest into the receiver's. [`Kind::WriteDone`] and
//! [`Kind::ReadDone`] tell each side how much the other copied. A
//! receiver that reads the whole message ([`remote_split`]; longer ones
//! where the RTS says [`FLAG_ALONE`]) sends no CTS: its ReadDone alone
//! completes the sender, its count the bytes accepted. Where a
//! NIC copies (verbs: RDMA READ), the RTS also carries the key of the
//! sender's registered buffer (in the receiver-token field), the receiver
//! reads the whole message, and its ReadDone reports each read as it
//! ends; the sender writes nothing.
//!
//! # Streamed rendezvous
//! Data that is not contiguous in memory (a derived datatype with gaps)
//! moves in pieces, so that neither side needs a copy of the whole
//! message: after the CTS the sender sends [`Kind::Data`] packets with
//! [`FLAG_PIECE`], each at most [`PIECE_LEN`] bytes, `address` holding
//! the piece's offset in the packed stream, packed just before it leaves
//! (the next once the transport is done with the last); the receiver
//! unpacks each as it arrives. A receiver that needs pieces asks for them
//! with [`FLAG_PIECE`] in its CTS. Pieces come in order (a transport
//! keeps them on one connection): a piece that does not start where the
//! last ended, is empty, longer than [`PIECE_LEN`] or runs past the
//! accepted length is a protocol error.
//!
//! # Active messages
//! [`Kind::Active`] carries an opaque payload of at most
//! [`MAX_ACTIVE_LEN`] bytes from the MPI layer of one rank to the MPI
//! layer of another (one-sided communication: see `oxmpi`'s `rma`
//! module). The device checks only the header; the handler the MPI layer
//! installed (`device::ActiveMessageHandler`) decodes and checks the
//! payload. An active message with [`FLAG_PLACED`] carries data to be
//! placed rather than read: its receiver's placer (`device::ActivePlacer`)
//! names the memory it goes to, from the context id, the two words in
//! the token fields and the length, before a byte of it is read (a
//! one-sided put's data, read by the transport straight into the
//! window), and the handler hears that it landed or was refused; or the
//! placer holds it back, and the handler gets it as a payload.

use crate::error::{Error, ErrorClass};
use crate::matching::Envelope;
use std::fmt;

/// Size of an encoded header in bytes.
pub const HEADER_LEN: usize = 56;
/// First two bytes of every packet ("OX" little-endian).
pub const MAGIC: u16 = 0x584f;
/// Version of the packet format; peers of another version are refused.
pub const VERSION: u8 = 11;
/// Flag of an [`Kind::Eager`] or [`Kind::Rts`] packet: a synchronous send,
/// which completes only once a receive matched it. For an eager message the
/// receiver answers the match with [`Kind::SyncAck`]; a rendezvous is
/// synchronous by itself (its CTS is the answer).
pub const FLAG_SYNC: u32 = 1;
/// Flag of a [`Kind::Rts`] or [`Kind::Cts`] packet: the data moves by
/// remote memory copy (see the module docs), and `address` is the sender's
/// buffer (in the RTS) or the receiver's (in the CTS).
pub const FLAG_REMOTE: u32 = 2;
/// Flag of a [`Kind::Cts`] packet: the receiver takes the data in pieces
/// (it unpacks each as it arrives), so the sender sends
/// [`Kind::Data`] pieces even if its data is contiguous. Flag of a
/// [`Kind::Data`] packet: one piece of a streamed rendezvous,
/// `message_len` bytes (1 to [`PIECE_LEN`]) of the message from stream
/// offset `address`; pieces come in order (see the module docs).
pub const FLAG_PIECE: u32 = 4;
/// Flag of a [`Kind::Rts`] with [`FLAG_REMOTE`]: no other remote copy of
/// the sender's to this receiver is under way (the message is alone, not
/// one of a stream), so the receiver reads up to [`ALONE_READ_WHOLE_MAX`]
/// bytes of it whole ([`remote_split`]) and answers with its ReadDone
/// alone: a stream's messages keep both sides copying at once.
pub const FLAG_ALONE: u32 = 8;
/// Flag of a [`Kind::Active`] packet: its payload is data placed
/// straight into the memory the receiver's placer names for
/// (`context_id`, `receiver_token` and `sender_token`, `message_len`),
/// not a message for the handler (see the module docs).
pub const FLAG_PLACED: u32 = 16;
/// Flag of a [`Kind::Eager`] packet: a ready send, whose receiver posted
/// the matching receive before it could arrive; it may exceed the eager
/// limit (no RTS and CTS), and finding no posted receive is a protocol
/// error of its sender.
pub const FLAG_READY: u32 = 32;

/// The largest piece of a streamed rendezvous (256 KiB): the memory a
/// sender packs into and a receiver unpacks from, whatever the message's
/// length.
pub const PIECE_LEN: usize = 256 * 1024;

/// The longest remote-copy rendezvous that the receiver reads whole
/// ([`remote_split`]): in a shorter one, the sender's share would wait
/// for the CTS, and its report would reach the receiver a packet later
/// (shm, 16 KiB: 2.17 us read whole against 3.0 in halves).
pub const READ_WHOLE_MAX: usize = 16 * 1024;

/// The longest remote-copy rendezvous announced [`FLAG_ALONE`] that the
/// receiver reads whole: shm, 32 KiB, 2.96-3.01 us read whole against
/// 3.64-3.68 in halves, while in `oxbench bw`'s windows halves move 1.1x
/// more (hence not for a stream).
pub const ALONE_READ_WHOLE_MAX: usize = 32 * 1024;

/// Bytes of a remote-copy rendezvous of `accepted` bytes that the receiver
/// reads, from the start of the sender's buffer; the sender writes the
/// rest. Both sides compute it, so the split travels in no packet. About
/// half, in whole pages, so that the two cores copy at once and each copy
/// starts on a page boundary when the buffers do; a message of at most
/// [`READ_WHOLE_MAX`] bytes is read whole, or of [`ALONE_READ_WHOLE_MAX`]
/// where it is `alone` ([`FLAG_ALONE`]). Beyond both the split is the same
/// either way, so a sender that gets a CTS with [`FLAG_REMOTE`] (a split
/// message) computes it without knowing the flag.
pub fn remote_split(accepted: usize, alone: bool) -> usize {
    const PAGE: usize = 4096;
    let whole = if alone {
        ALONE_READ_WHOLE_MAX
    } else {
        READ_WHOLE_MAX
    };
    if accepted <= whole {
        return accepted;
    }
    (accepted / 2).next_multiple_of(PAGE).min(accepted)
}

/// What a packet is. Short messages travel as one [`Kind::Eager`] packet;
/// long ones as [`Kind::Rts`], [`Kind::Cts`], [`Kind::Data`] (the seed's
/// short and long protocols).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    /// A whole message: header and data in one packet.
    Eager = 1,
    /// Request to send: announces a long message, no payload.
    Rts = 2,
    /// Clear to send: the receiver matched an RTS; `message_len` is the
    /// number of bytes it accepts (less than announced on truncation).
    Cts = 3,
    /// The data of a long message, to the receiver's request named by the
    /// receiver token. Not sequenced (see the module docs).
    Data = 4,
    /// A receive matched the synchronous eager send named by the sender
    /// token.
    SyncAck = 5,
    /// The sender asks to withdraw its unmatched message (named by the
    /// sender token): `MPI_Cancel` of a send.
    CancelSend = 6,
    /// The answer to [`Kind::CancelSend`]: `message_len` is 1 if the
    /// message was withdrawn, 0 if a receive had already matched it.
    CancelReply = 7,
    /// Remote-copy rendezvous, sender to receiver (receiver token):
    /// `message_len` bytes of its share were written into the receiver's
    /// buffer; 0 when the sender could not write them (the kernel refused),
    /// and the receiver reads them itself.
    WriteDone = 8,
    /// Remote-copy rendezvous, receiver to sender (sender token): the
    /// receiver read `message_len` more bytes out of the sender's buffer.
    /// The sender's buffer is free once the bytes read and written add up
    /// to the accepted length.
    ReadDone = 9,
    /// An active message: `message_len` bytes of payload (at most
    /// [`MAX_ACTIVE_LEN`]) for the MPI layer's handler, in the context
    /// `context_id` (see the module docs).
    Active = 10,
}

impl Kind {
    /// Whether packets of this kind carry a VC sequence number that the
    /// receiver checks (all but [`Kind::Data`]).
    pub fn is_sequenced(self) -> bool {
        self != Kind::Data
    }

    fn from_u8(v: u8) -> Option<Kind> {
        Some(match v {
            1 => Kind::Eager,
            2 => Kind::Rts,
            3 => Kind::Cts,
            4 => Kind::Data,
            5 => Kind::SyncAck,
            6 => Kind::CancelSend,
            7 => Kind::CancelReply,
            8 => Kind::WriteDone,
            9 => Kind::ReadDone,
            10 => Kind::Active,
            _ => return None,
        })
    }
}

/// A decoded packet header. See the module docs for the wire layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// What the packet is.
    pub kind: Kind,
    /// Per-VC sequence number, stamped by the device; 0 in an unsequenced
    /// packet ([`Kind::is_sequenced`]).
    pub sequence: u32,
    /// Context id of the communicator.
    pub context_id: u32,
    /// Sender's rank in the communicator.
    pub source: i32,
    /// Message tag.
    pub tag: i32,
    /// Flags ([`FLAG_SYNC`]).
    pub flags: u32,
    /// Total length of the message in bytes.
    pub message_len: u64,
    /// The sender's request token.
    pub sender_token: u64,
    /// The receiver's request token; in an RTS with [`FLAG_REMOTE`], the
    /// key the sender's transport offered its buffer under (0 where it
    /// needs none).
    pub receiver_token: u64,
    /// With [`FLAG_REMOTE`], the address of the sender's (RTS) or the
    /// receiver's (CTS) buffer in its own process; 0 otherwise.
    pub address: u64,
}

/// Why a header was refused. The transport that read it closes the
/// connection and fails the requests on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// Fewer than [`HEADER_LEN`] bytes.
    Short(usize),
    /// The magic was wrong: the stream is not oxmpi packets or lost framing.
    Magic(u16),
    /// A packet format of another version.
    Version(u8),
    /// An unknown packet kind.
    Kind(u8),
    /// Flags this version does not know, or on a kind that takes none.
    Flags(u32),
    /// A sequence number in a packet of a kind that is not sequenced.
    Sequence {
        /// Packet kind.
        kind: Kind,
        /// The sequence number it carried.
        sequence: u32,
    },
    /// An address without [`FLAG_REMOTE`], a null one with it, or one
    /// whose buffer would run past the end of the address space.
    Address {
        /// Packet kind.
        kind: Kind,
        /// The address.
        address: u64,
        /// The message length it would hold.
        message_len: u64,
    },
    /// The message length does not suit the kind or exceeds the limit.
    Length {
        /// Packet kind.
        kind: Kind,
        /// Announced message length.
        message_len: u64,
    },
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Short(n) => {
                write!(f, "packet header truncated: {n} of {HEADER_LEN} bytes")
            }
            DecodeError::Magic(m) => write!(f, "bad packet magic {m:#06x} (expected {MAGIC:#06x})"),
            DecodeError::Version(v) => {
                write!(f, "packet format version {v}, this oxmpi speaks {VERSION}")
            }
            DecodeError::Kind(k) => write!(f, "unknown packet kind {k}"),
            DecodeError::Flags(x) => write!(f, "header flags {x:#x} are not valid for this packet"),
            DecodeError::Sequence { kind, sequence } => {
                write!(
                    f,
                    "{kind:?} packets are not sequenced, yet this one carries {sequence}"
                )
            }
            DecodeError::Address {
                kind,
                address,
                message_len,
            } => write!(
                f,
                "{kind:?} packet names the buffer at {address:#x} of {message_len} bytes, which \
                 its flags do not allow or no process can have"
            ),
            DecodeError::Length { kind, message_len } => {
                write!(
                    f,
                    "{kind:?} packet with message length {message_len} is invalid"
                )
            }
        }
    }
}

impl From<DecodeError> for Error {
    fn from(e: DecodeError) -> Error {
        Error::new(
            ErrorClass::ProcFailed,
            format!("malformed packet from peer: {e}"),
        )
    }
}

impl Header {
    /// A header of `kind` with every other field zero.
    pub fn new(kind: Kind) -> Header {
        Header {
            kind,
            sequence: 0,
            context_id: 0,
            source: 0,
            tag: 0,
            flags: 0,
            message_len: 0,
            sender_token: 0,
            receiver_token: 0,
            address: 0,
        }
    }

    /// The header of a standard eager message of `len` bytes with
    /// `envelope`, sequence number `sequence` (what a standard send makes:
    /// no flags, no tokens, no address).
    #[inline]
    pub fn standard_eager(sequence: u32, envelope: Envelope, len: usize) -> Header {
        Header {
            sequence,
            context_id: envelope.context_id,
            source: envelope.source,
            tag: envelope.tag,
            message_len: len as u64,
            ..Header::new(Kind::Eager)
        }
    }

    /// Bytes of payload that follow the header: the message in an eager or
    /// data packet, none in the others.
    pub fn payload_len(&self) -> u64 {
        match self.kind {
            Kind::Eager | Kind::Data | Kind::Active => self.message_len,
            _ => 0,
        }
    }

    /// Encodes the header into its wire form.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..2].copy_from_slice(&MAGIC.to_le_bytes());
        b[2] = VERSION;
        b[3] = self.kind as u8;
        b[4..8].copy_from_slice(&self.sequence.to_le_bytes());
        b[8..12].copy_from_slice(&self.context_id.to_le_bytes());
        b[12..16].copy_from_slice(&self.source.to_le_bytes());
        b[16..20].copy_from_slice(&self.tag.to_le_bytes());
        b[20..24].copy_from_slice(&self.flags.to_le_bytes());
        b[24..32].copy_from_slice(&self.message_len.to_le_bytes());
        b[32..40].copy_from_slice(&self.address.to_le_bytes());
        b[40..48].copy_from_slice(&self.sender_token.to_le_bytes());
        b[48..56].copy_from_slice(&self.receiver_token.to_le_bytes());
        b
    }

    /// Decodes and validates a header. Never panics, whatever the bytes.
    pub fn decode(bytes: &[u8]) -> Result<Header, DecodeError> {
        let b: &[u8; HEADER_LEN] = bytes
            .get(..HEADER_LEN)
            .and_then(|s| s.try_into().ok())
            .ok_or(DecodeError::Short(bytes.len()))?;
        let u16_at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
        let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let u64_at = |o: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[o..o + 8]);
            u64::from_le_bytes(w)
        };
        let magic = u16_at(0);
        if magic != MAGIC {
            return Err(DecodeError::Magic(magic));
        }
        if b[2] != VERSION {
            return Err(DecodeError::Version(b[2]));
        }
        let kind = Kind::from_u8(b[3]).ok_or(DecodeError::Kind(b[3]))?;
        let flags = u32_at(20);
        let allowed = match kind {
            Kind::Eager => FLAG_SYNC | FLAG_READY,
            Kind::Rts => FLAG_SYNC | FLAG_REMOTE | FLAG_ALONE,
            Kind::Cts => FLAG_REMOTE | FLAG_PIECE,
            Kind::Data => FLAG_PIECE,
            Kind::Active => FLAG_PLACED,
            _ => 0,
        };
        let flags_ok = flags & !allowed == 0
            && flags & (FLAG_REMOTE | FLAG_PIECE) != FLAG_REMOTE | FLAG_PIECE
            && (flags & FLAG_ALONE == 0 || flags & FLAG_REMOTE != 0);
        if !flags_ok {
            return Err(DecodeError::Flags(flags));
        }
        let sequence = u32_at(4);
        if !kind.is_sequenced() && sequence != 0 {
            return Err(DecodeError::Sequence { kind, sequence });
        }
        let header = Header {
            kind,
            sequence,
            context_id: u32_at(8),
            source: u32_at(12) as i32,
            tag: u32_at(16) as i32,
            flags,
            message_len: u64_at(24),
            sender_token: u64_at(40),
            receiver_token: u64_at(48),
            address: u64_at(32),
        };
        let address_ok = if flags & FLAG_REMOTE != 0 {
            // The highest byte of the buffer must be addressable, so a
            // length added to the address never wraps.
            header.address != 0
                && header
                    .address
                    .checked_add(header.message_len)
                    .is_some_and(|end| end <= MAX_ADDRESS)
        } else if kind == Kind::Data && flags & FLAG_PIECE != 0 {
            // A piece's stream offset: the piece must end within a message.
            header
                .address
                .checked_add(header.message_len)
                .is_some_and(|end| end <= MAX_MESSAGE_LEN)
        } else {
            header.address == 0
        };
        if !address_ok {
            return Err(DecodeError::Address {
                kind,
                address: header.address,
                message_len: header.message_len,
            });
        }
        let length_ok = match kind {
            Kind::SyncAck | Kind::CancelSend => header.message_len == 0,
            Kind::CancelReply => header.message_len <= 1,
            Kind::Active => header.message_len <= MAX_ACTIVE_LEN,
            Kind::Data if flags & FLAG_PIECE != 0 => {
                (1..=PIECE_LEN as u64).contains(&header.message_len)
            }
            _ => true,
        } && header.message_len <= MAX_MESSAGE_LEN;
        if !length_ok {
            return Err(DecodeError::Length {
                kind,
                message_len: header.message_len,
            });
        }
        Ok(header)
    }
}

/// The largest message length a header may announce (2^48 bytes): far
/// beyond any real message, small enough that a corrupted length is caught.
pub const MAX_MESSAGE_LEN: u64 = 1 << 48;

/// The largest payload of a [`Kind::Active`] packet (1 MiB): the MPI
/// layer splits longer transfers; a longer one is a protocol error, so a
/// peer cannot make a rank allocate more.
pub const MAX_ACTIVE_LEN: u64 = 1 << 20;

/// The end of the highest buffer a [`FLAG_REMOTE`] address may name: user
/// space of every 64-bit Linux (57-bit with five-level paging) ends below.
pub const MAX_ADDRESS: u64 = 1 << 57;

#[cfg(test)]
mod tests {
    use super::*;

    const ALL_KINDS: [Kind; 10] = [
        Kind::Eager,
        Kind::Rts,
        Kind::Cts,
        Kind::Data,
        Kind::SyncAck,
        Kind::CancelSend,
        Kind::CancelReply,
        Kind::WriteDone,
        Kind::ReadDone,
        Kind::Active,
    ];

    fn sample(kind: Kind) -> Header {
        let message_len = match kind {
            Kind::Eager | Kind::Data | Kind::Active => 77,
            Kind::Rts | Kind::Cts => 1 << 33,
            Kind::SyncAck | Kind::CancelSend => 0,
            Kind::CancelReply => 1,
            Kind::WriteDone | Kind::ReadDone => 1 << 20,
        };
        let flags = match kind {
            Kind::Eager => FLAG_SYNC,
            Kind::Rts => FLAG_SYNC | FLAG_REMOTE | FLAG_ALONE,
            Kind::Cts => FLAG_REMOTE,
            _ => 0,
        };
        Header {
            kind,
            sequence: if kind.is_sequenced() { 0xdead_beef } else { 0 },
            context_id: 7,
            source: 3,
            tag: -1,
            flags,
            message_len,
            sender_token: u64::MAX,
            receiver_token: 42,
            address: if flags & FLAG_REMOTE != 0 {
                0x7f00_1234_5000
            } else {
                0
            },
        }
    }

    #[test]
    fn round_trips_every_kind() {
        for kind in ALL_KINDS {
            let h = sample(kind);
            assert_eq!(Header::decode(&h.encode()), Ok(h));
            let payload = matches!(kind, Kind::Eager | Kind::Data | Kind::Active);
            assert_eq!(h.payload_len(), if payload { h.message_len } else { 0 });
        }
    }

    #[test]
    fn rejects_short_input() {
        let b = sample(Kind::Eager).encode();
        for n in 0..HEADER_LEN {
            assert_eq!(Header::decode(&b[..n]), Err(DecodeError::Short(n)));
        }
    }

    #[test]
    fn rejects_bad_magic() {
        let mut b = sample(Kind::Eager).encode();
        b[0] ^= 0xff;
        assert!(matches!(Header::decode(&b), Err(DecodeError::Magic(_))));
    }

    #[test]
    fn rejects_other_version() {
        let mut b = sample(Kind::Eager).encode();
        b[2] = VERSION + 1;
        assert_eq!(Header::decode(&b), Err(DecodeError::Version(VERSION + 1)));
    }

    #[test]
    fn rejects_unknown_kind() {
        for k in [0u8, 11, 200, 255] {
            let mut b = sample(Kind::Eager).encode();
            b[3] = k;
            assert_eq!(Header::decode(&b), Err(DecodeError::Kind(k)));
        }
    }

    #[test]
    fn rejects_unknown_or_misplaced_flags() {
        let mut unknown = sample(Kind::Eager);
        unknown.flags = 1 << 20;
        let mut on_cts = sample(Kind::Cts);
        on_cts.flags = FLAG_SYNC;
        let mut placed_eager = sample(Kind::Eager);
        placed_eager.flags = FLAG_PLACED;
        for h in [unknown, on_cts, placed_eager] {
            assert_eq!(
                Header::decode(&h.encode()),
                Err(DecodeError::Flags(h.flags)),
                "{h:?} accepted"
            );
        }
        let mut placed = sample(Kind::Active);
        placed.flags = FLAG_PLACED;
        assert_eq!(Header::decode(&placed.encode()), Ok(placed));
        let mut ready = sample(Kind::Eager);
        ready.flags = FLAG_READY;
        assert_eq!(Header::decode(&ready.encode()), Ok(ready));
        let mut ready_rts = sample(Kind::Rts);
        ready_rts.flags = FLAG_READY;
        assert_eq!(
            Header::decode(&ready_rts.encode()),
            Err(DecodeError::Flags(FLAG_READY))
        );
    }

    #[test]
    fn rejects_addresses_without_the_flag_null_or_past_the_address_space() {
        let mut stray = sample(Kind::Eager);
        stray.address = 0x1000;
        let mut null = sample(Kind::Rts);
        null.address = 0;
        let mut wraps = sample(Kind::Cts);
        wraps.address = u64::MAX - 10;
        let mut beyond = sample(Kind::Rts);
        beyond.address = MAX_ADDRESS - beyond.message_len + 1;
        for h in [stray, null, wraps, beyond] {
            assert!(
                matches!(
                    Header::decode(&h.encode()),
                    Err(DecodeError::Address { .. })
                ),
                "{h:?} accepted"
            );
        }
        let mut highest = sample(Kind::Rts);
        highest.address = MAX_ADDRESS - highest.message_len;
        assert_eq!(Header::decode(&highest.encode()), Ok(highest));
        let mut on_data = sample(Kind::Data);
        on_data.flags = FLAG_REMOTE;
        assert_eq!(
            Header::decode(&on_data.encode()),
            Err(DecodeError::Flags(FLAG_REMOTE))
        );
    }

    #[test]
    fn the_remote_split_is_page_aligned_and_within_the_message() {
        let sizes = [
            1,
            4096,
            8192,
            16_384,
            16_385,
            32_768,
            32_769,
            65_537,
            1 << 20,
            1 << 33,
        ];
        for (accepted, alone) in sizes.into_iter().flat_map(|n| [(n, false), (n, true)]) {
            let split = remote_split(accepted, alone);
            assert!(split <= accepted && split > 0, "{accepted}: {split}");
            let whole = if alone {
                ALONE_READ_WHOLE_MAX
            } else {
                READ_WHOLE_MAX
            };
            if accepted <= whole {
                assert_eq!(split, accepted, "{accepted}: read whole");
            } else {
                if accepted > ALONE_READ_WHOLE_MAX {
                    let other = remote_split(accepted, !alone);
                    assert_eq!(split, other, "{accepted}: alone or not, one split");
                }
                assert_eq!(split % 4096, 0, "{accepted}: {split}");
                assert!(split < accepted, "{accepted}: the sender gets no share");
            }
        }
    }

    #[test]
    fn pieces_carry_an_offset_and_a_bounded_length() {
        let mut piece = Header::new(Kind::Data);
        piece.flags = FLAG_PIECE;
        piece.receiver_token = 9;
        piece.address = 3 * PIECE_LEN as u64;
        piece.message_len = PIECE_LEN as u64;
        assert_eq!(Header::decode(&piece.encode()), Ok(piece));
        for len in [0, PIECE_LEN as u64 + 1] {
            let mut bad = piece;
            bad.message_len = len;
            assert!(
                matches!(
                    Header::decode(&bad.encode()),
                    Err(DecodeError::Length { .. })
                ),
                "{bad:?} accepted"
            );
        }
        let mut past = piece;
        past.address = MAX_MESSAGE_LEN;
        assert!(matches!(
            Header::decode(&past.encode()),
            Err(DecodeError::Address { .. })
        ));
        let mut both = sample(Kind::Cts);
        both.flags = FLAG_REMOTE | FLAG_PIECE;
        assert!(matches!(
            Header::decode(&both.encode()),
            Err(DecodeError::Flags(_))
        ));
        let mut asks = sample(Kind::Cts);
        asks.flags = FLAG_PIECE;
        asks.address = 0;
        assert_eq!(Header::decode(&asks.encode()), Ok(asks));
        let mut on_rts = sample(Kind::Rts);
        on_rts.flags = FLAG_PIECE;
        assert!(matches!(
            Header::decode(&on_rts.encode()),
            Err(DecodeError::Flags(_))
        ));
        // Alone says how to read a remote copy: not without one.
        on_rts.flags = FLAG_ALONE;
        on_rts.address = 0;
        assert!(matches!(
            Header::decode(&on_rts.encode()),
            Err(DecodeError::Flags(_))
        ));
    }

    #[test]
    fn rejects_a_sequence_number_in_a_data_packet() {
        let mut data = sample(Kind::Data);
        data.sequence = 5;
        assert_eq!(
            Header::decode(&data.encode()),
            Err(DecodeError::Sequence {
                kind: Kind::Data,
                sequence: 5
            })
        );
    }

    #[test]
    fn rejects_lengths_the_kind_does_not_allow() {
        let mut huge = sample(Kind::Eager);
        huge.message_len = MAX_MESSAGE_LEN + 1;
        let mut ack = sample(Kind::SyncAck);
        ack.message_len = 3;
        let mut cancel = sample(Kind::CancelSend);
        cancel.message_len = 1;
        let mut reply = sample(Kind::CancelReply);
        reply.message_len = 2;
        for h in [huge, ack, cancel, reply] {
            assert!(
                matches!(Header::decode(&h.encode()), Err(DecodeError::Length { .. })),
                "{h:?} accepted"
            );
        }
    }

    #[test]
    fn decode_error_maps_to_proc_failed() {
        let e: Error = DecodeError::Kind(9).into();
        assert_eq!(e.class(), ErrorClass::ProcFailed);
        assert!(e.message().contains("unknown packet kind 9"));
    }
}
