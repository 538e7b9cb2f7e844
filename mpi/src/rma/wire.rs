//! What an RMA active message says: the payload of an
//! `oxmpi_adi::proto::Kind::Active` packet, with checked decoding.
//!
//! Every message starts with a fixed [`HEADER`]-byte header,
//! little-endian, followed by its data:
//!
//! | offset | size | field    | meaning                                              |
//! |-------:|-----:|----------|------------------------------------------------------|
//! | 0      | 1    | kind     | [`Kind`]                                             |
//! | 1      | 1    | flags    | [`FLAG_FETCH`] (accumulate), [`FLAG_EXCLUSIVE`] (lock), [`FLAG_BY_MESSAGE`] (get, accumulate) |
//! | 2      | 1    | element  | [`AccumulateType`] code: a basic type (its index in `Primitive::ALL`), or [`PAIR_CODE`] and a value-index pair type's index |
//! | 3      | 1    | op       | [`AccumulateOp`] code                                |
//! | 4      | 4    | reserved | 0                                                    |
//! | 8      | 8    | token    | the origin's operation, named in the reply (0: a put or accumulate, only counted) |
//! | 16     | 8    | disp     | target displacement in bytes (from the window's start; an address in a dynamic window) |
//! | 24     | 8    | len      | bytes of data the operation covers                   |
//!
//! A payload is a batch: one or more messages one after another, each
//! as long as its header says ([`Message::split`]).
//!
//! Decoding trusts nothing: the kind, the flags it allows, the element and
//! op codes, the reserved bytes and that the data's length agrees with the
//! kind and `len` are all checked, and a message that fails is a protocol
//! error of its sender. Whether the range lies in the target's window is
//! the target's check (`target.rs`), answered with [`Kind::Refused`].

use crate::collective::op::{PairType, PredefinedReduction, SystemOp, NUMBER_OP_ORDER};
use crate::collective::SystemOperation;
use crate::datatype::Primitive;
use crate::{Error, ErrorClass, Result};

/// Bytes of the fixed header.
pub(crate) const HEADER: usize = 32;

/// Flag of an [`Kind::Accumulate`]: reply with the target's data from
/// before the operation (get_accumulate, fetch_and_op).
pub(crate) const FLAG_FETCH: u8 = 1;
/// Flag of a [`Kind::Lock`]: an exclusive lock.
pub(crate) const FLAG_EXCLUSIVE: u8 = 2;
/// Flag of a [`Kind::Get`] or [`Kind::Accumulate`] without
/// [`FLAG_FETCH`]: the `len` bytes of data travel apart, as one
/// point-to-point message of the window's communicator
/// (`target::get_by_message`, `accumulate_by_message`), which the ADI's
/// rendezvous moves between the buffer and the window with no copy of
/// its own; the accumulate carries no data here. (Large puts' data
/// travels apart too, but as placed active messages: `target::put_placed`.)
pub(crate) const FLAG_BY_MESSAGE: u8 = 4;

/// What a message is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Write the data at `disp`; replied to with an empty [`Kind::Reply`].
    Put = 1,
    /// Read `len` bytes at `disp`; replied to with them.
    Get = 2,
    /// Combine the data into the target's with `op`; replied to with the
    /// old data under [`FLAG_FETCH`], else with an empty reply.
    Accumulate = 3,
    /// Compare the first half of the data with the target's element and
    /// write the second half if they are equal; replied to with the old.
    CompareAndSwap = 4,
    /// The answer to the operation `token`: its data, if any.
    Reply = 5,
    /// The target refused the operation `token`: the data is the message,
    /// `op` the error class's code.
    Refused = 6,
    /// Asks for the target's window lock; replied to once granted.
    Lock = 7,
    /// Releases the lock; replied to once released.
    Unlock = 8,
    /// The target opened an exposure epoch for the receiver
    /// (`MPI_Win_post`).
    Post = 9,
    /// The origin ended its access epoch to the receiver
    /// (`MPI_Win_complete`); its operations were all replied to.
    Complete = 10,
}

impl Kind {
    fn from_u8(v: u8) -> Option<Kind> {
        Some(match v {
            1 => Kind::Put,
            2 => Kind::Get,
            3 => Kind::Accumulate,
            4 => Kind::CompareAndSwap,
            5 => Kind::Reply,
            6 => Kind::Refused,
            7 => Kind::Lock,
            8 => Kind::Unlock,
            9 => Kind::Post,
            10 => Kind::Complete,
            _ => return None,
        })
    }
}

/// How an accumulate combines data (MPI 4.1 §12.3.4): a predefined
/// reduction, `MPI_REPLACE` or `MPI_NO_OP`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccumulateOp {
    /// A predefined reduction operation.
    Reduce(SystemOperation),
    /// The origin's data replaces the target's (`MPI_REPLACE`).
    Replace,
    /// The target's data is left as it is (`MPI_NO_OP`, to fetch it).
    NoOp,
}

/// The reductions by code (`2 + index`; 0 and 1 are replace and no-op):
/// every predefined operation, in declaration order, so that
/// `REDUCTIONS[op as usize] == op`.
const REDUCTIONS: [SystemOp; NUMBER_OP_ORDER.len() + 2] = {
    let mut all = [SystemOp::MinLoc; NUMBER_OP_ORDER.len() + 2];
    let mut i = 0;
    while i < NUMBER_OP_ORDER.len() {
        all[i] = NUMBER_OP_ORDER[i];
        i += 1;
    }
    all[NUMBER_OP_ORDER.len() + 1] = SystemOp::MaxLoc;
    all
};

impl From<SystemOperation> for AccumulateOp {
    fn from(op: SystemOperation) -> AccumulateOp {
        AccumulateOp::Reduce(op)
    }
}

impl AccumulateOp {
    /// The operation's code in a message (`REDUCTIONS`' order: an
    /// index, not a search).
    fn code(self) -> u8 {
        match self {
            AccumulateOp::Replace => 0,
            AccumulateOp::NoOp => 1,
            AccumulateOp::Reduce(op) => op.system_op() as u8 + 2,
        }
    }

    fn from_code(code: u8) -> Option<AccumulateOp> {
        match code {
            0 => Some(AccumulateOp::Replace),
            1 => Some(AccumulateOp::NoOp),
            c => REDUCTIONS
                .get(usize::from(c) - 2)
                .map(|&op| AccumulateOp::Reduce(SystemOperation::from_system_op(op))),
        }
    }

    /// Whether the operation takes value-index pairs (`MPI_MINLOC`,
    /// `MPI_MAXLOC`). Always inlined: a test on every accumulate.
    #[inline(always)]
    pub(crate) fn takes_pairs(self) -> bool {
        matches!(
            self,
            AccumulateOp::Reduce(op)
                if matches!(op.system_op(), SystemOp::MinLoc | SystemOp::MaxLoc)
        )
    }
}

/// The flag of an element code that names a value-index pair type (its
/// index in the low bits), not a basic type.
pub(crate) const PAIR_CODE: u8 = 0x80;

/// What an accumulate's elements are, as its kernels take them: values of
/// one basic type, or value-index pairs (`MPI_MINLOC`, `MPI_MAXLOC`; also
/// `MPI_REPLACE` and `MPI_NO_OP` on a pair type).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AccumulateType {
    /// Numbers of one basic type.
    Basic(Primitive),
    /// Value-index pairs, packed (12 bytes for `MPI_DOUBLE_INT`).
    Pair(PairType),
}

impl AccumulateType {
    /// Bytes of one element. Always inlined, as the direct path's
    /// accumulate that asks.
    #[inline(always)]
    pub(crate) fn size(self) -> usize {
        match self {
            AccumulateType::Basic(basic) => basic.size(),
            AccumulateType::Pair(pair) => pair.size(),
        }
    }

    /// Whether `len` bytes are a whole number of elements. Always inlined
    /// (with `#[inline]` the direct path's accumulate kept it a call): a
    /// basic type's size is a power of two (a mask, not a division).
    #[inline(always)]
    pub(crate) fn holds_whole(self, len: usize) -> bool {
        match self {
            AccumulateType::Basic(basic) => len & (basic.size() - 1) == 0,
            AccumulateType::Pair(pair) => len.is_multiple_of(pair.size()),
        }
    }

    /// The alignment the kernels need: a basic type's, and none for pairs,
    /// which the location kernels read where they lie.
    pub(crate) fn align(self) -> usize {
        match self {
            AccumulateType::Basic(basic) => basic.align(),
            AccumulateType::Pair(_) => 1,
        }
    }

    /// The reduction `op` on these elements, its kernel looked up; an
    /// `MPI_ERR_OP` error if the standard does not define it for them.
    /// Always inlined, as `PredefinedReduction::new`.
    #[inline(always)]
    pub(crate) fn reduction(self, op: SystemOp) -> Result<PredefinedReduction> {
        match self {
            AccumulateType::Basic(basic) => PredefinedReduction::new(op, basic),
            AccumulateType::Pair(pair) => PredefinedReduction::of_pairs(op, pair),
        }
    }

    /// Its code in a message.
    fn code(self) -> u8 {
        match self {
            AccumulateType::Basic(basic) => basic as u8,
            AccumulateType::Pair(pair) => PAIR_CODE | pair.code(),
        }
    }

    /// The type of code `code`, if it names one.
    fn from_code(code: u8) -> Option<AccumulateType> {
        if code & PAIR_CODE != 0 {
            return PairType::from_code(code & !PAIR_CODE).map(AccumulateType::Pair);
        }
        Primitive::ALL
            .get(usize::from(code))
            .map(|&basic| AccumulateType::Basic(basic))
    }
}

/// A decoded message: the header's fields and the data after it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Message<'p> {
    pub(crate) kind: Kind,
    pub(crate) flags: u8,
    /// The elements' type (accumulate; compare-and-swap: a basic type).
    pub(crate) element: Option<AccumulateType>,
    /// The operation (accumulate).
    pub(crate) op: Option<AccumulateOp>,
    /// Error class code (refused).
    pub(crate) class: u8,
    pub(crate) token: u64,
    pub(crate) disp: u64,
    pub(crate) len: u64,
    pub(crate) data: &'p [u8],
}

impl<'p> Message<'p> {
    /// A message of `kind` with every field zero and no data.
    pub(crate) fn new(kind: Kind, token: u64) -> Message<'p> {
        Message {
            kind,
            flags: 0,
            element: None,
            op: None,
            class: 0,
            token,
            disp: 0,
            len: 0,
            data: &[],
        }
    }

    /// The wire form: header and data.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER + self.data.len());
        self.encode_into(&mut out);
        out
    }

    /// The wire form, in `out` (cleared first: a buffer kept for reuse).
    pub(crate) fn encode_into(&self, out: &mut Vec<u8>) {
        out.clear();
        self.append_to(out);
    }

    /// The wire form, after what `out` holds: one more message of a
    /// batch.
    pub(crate) fn append_to(&self, out: &mut Vec<u8>) {
        self.append_header_to(out);
        out.extend_from_slice(self.data);
    }

    /// The header alone, after what `out` holds: its data, which must
    /// follow it on the wire, is sent from where it is (a large put's
    /// data, a part of the active message of its own).
    pub(crate) fn append_header_to(&self, out: &mut Vec<u8>) {
        out.push(self.kind as u8);
        out.push(self.flags);
        out.push(self.element.map_or(0, AccumulateType::code));
        let op = match self.kind {
            Kind::Refused => self.class,
            _ => self.op.map_or(0, AccumulateOp::code),
        };
        out.push(op);
        out.extend_from_slice(&[0; 4]);
        out.extend_from_slice(&self.token.to_le_bytes());
        out.extend_from_slice(&self.disp.to_le_bytes());
        out.extend_from_slice(&self.len.to_le_bytes());
    }

    /// Splits the first message off a batch (messages one after another in
    /// one payload) and decodes it; the messages after it. Its length is
    /// its header's: kind, operation and `len` say how much data follows.
    /// Never panics, whatever the bytes.
    pub(crate) fn split(batch: &'p [u8]) -> Result<(Message<'p>, &'p [u8])> {
        let head = batch
            .get(..HEADER)
            .ok_or_else(|| bad(format!("{} bytes, less than a header", batch.len())))?;
        let mut len = [0u8; 8];
        len.copy_from_slice(&head[24..32]);
        let len = u64::from_le_bytes(len);
        // A kind or code that does not decode carries nothing here, and
        // `decode` refuses it below.
        let data = match Kind::from_u8(head[0]) {
            Some(Kind::Accumulate) if head[1] & FLAG_BY_MESSAGE != 0 => Some(0),
            Some(Kind::Put | Kind::Reply | Kind::Refused) => Some(len),
            Some(Kind::Accumulate)
                if AccumulateOp::from_code(head[3]) != Some(AccumulateOp::NoOp) =>
            {
                Some(len)
            }
            Some(Kind::CompareAndSwap) => len.checked_mul(2),
            _ => Some(0),
        };
        let end = data
            .and_then(|d| usize::try_from(d).ok())
            .and_then(|d| d.checked_add(HEADER))
            .filter(|&end| end <= batch.len())
            .ok_or_else(|| {
                bad(format!(
                    "a message of {len} bytes in a batch of {} bytes",
                    batch.len()
                ))
            })?;
        let (one, rest) = batch.split_at(end);
        Ok((Message::decode(one)?, rest))
    }

    /// Decodes and checks a message. Never panics, whatever the bytes.
    pub(crate) fn decode(payload: &'p [u8]) -> Result<Message<'p>> {
        let (head, data) = payload
            .split_at_checked(HEADER)
            .ok_or_else(|| bad(format!("{} bytes, less than a header", payload.len())))?;
        let u64_at = |o: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&head[o..o + 8]);
            u64::from_le_bytes(w)
        };
        let kind = Kind::from_u8(head[0]).ok_or_else(|| bad(format!("kind {}", head[0])))?;
        let flags = head[1];
        let allowed = match kind {
            Kind::Accumulate if flags & FLAG_FETCH != 0 => FLAG_FETCH,
            Kind::Accumulate => FLAG_BY_MESSAGE,
            Kind::Lock => FLAG_EXCLUSIVE,
            Kind::Get => FLAG_BY_MESSAGE,
            _ => 0,
        };
        if flags & !allowed != 0 {
            return Err(bad(format!("flags {flags:#x} on {kind:?}")));
        }
        if head[4..8] != [0; 4] {
            return Err(bad("reserved bytes set"));
        }
        let typed = matches!(kind, Kind::Accumulate | Kind::CompareAndSwap);
        let element = if typed {
            let element = AccumulateType::from_code(head[2])
                .filter(|e| kind == Kind::Accumulate || matches!(e, AccumulateType::Basic(_)))
                .ok_or_else(|| bad(format!("element type code {} on {kind:?}", head[2])))?;
            Some(element)
        } else if head[2] != 0 {
            return Err(bad(format!("element type on {kind:?}")));
        } else {
            None
        };
        let (op, class) = match kind {
            Kind::Accumulate => (
                Some(
                    AccumulateOp::from_code(head[3])
                        .ok_or_else(|| bad(format!("operation code {}", head[3])))?,
                ),
                0,
            ),
            Kind::Refused => (None, head[3]),
            _ if head[3] != 0 => return Err(bad(format!("operation code on {kind:?}"))),
            _ => (None, 0),
        };
        let message = Message {
            kind,
            flags,
            element,
            op,
            class,
            token: u64_at(8),
            disp: u64_at(16),
            len: u64_at(24),
            data,
        };
        let data_len = data.len() as u64;
        let elements_ok = match element {
            Some(e) => usize::try_from(message.len).is_ok_and(|len| e.holds_whole(len)),
            None => true,
        };
        let lengths_ok = match kind {
            Kind::Accumulate if flags & FLAG_BY_MESSAGE != 0 => data_len == 0,
            Kind::Put | Kind::Reply | Kind::Refused => data_len == message.len,
            Kind::Accumulate => {
                let no_op = op == Some(AccumulateOp::NoOp);
                // A no-op carries no data; a no-op that fetches nothing
                // is pointless but harmless.
                data_len == if no_op { 0 } else { message.len }
            }
            Kind::CompareAndSwap => {
                element.is_some_and(|e| message.len == e.size() as u64)
                    && data_len == 2 * message.len
            }
            Kind::Get => data_len == 0,
            Kind::Lock | Kind::Unlock | Kind::Post | Kind::Complete => {
                data_len == 0 && message.len == 0 && message.disp == 0
            }
        };
        if !(lengths_ok && elements_ok) {
            return Err(bad(format!(
                "{kind:?} of {} bytes carries {data_len} bytes of data",
                message.len
            )));
        }
        Ok(message)
    }
}

/// Sets the `len` of the message encoded at the start of `encoded`
/// (without data, then followed by its data, written in place) to the
/// bytes after its header: so a reply's data need not be copied twice.
pub(crate) fn set_data_len(encoded: &mut [u8]) {
    let len = (encoded.len() - HEADER) as u64;
    encoded[24..32].copy_from_slice(&len.to_le_bytes());
}

/// The error of a message that does not decode.
fn bad(what: impl std::fmt::Display) -> Error {
    Error::new(
        ErrorClass::ProcFailed,
        format!("malformed one-sided (RMA) message: {what}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collective::ValueIndex;
    use crate::datatype::ElementType;

    fn sample() -> Vec<u8> {
        let data = 7u64.to_le_bytes();
        let mut m = Message::new(Kind::Accumulate, 42);
        m.element = Some(AccumulateType::Basic(Primitive::U64));
        m.op = Some(SystemOperation::sum().into());
        m.flags = FLAG_FETCH;
        m.disp = 3;
        m.len = 8;
        m.data = &data;
        m.encode()
    }

    #[test]
    fn round_trips() {
        let bytes = sample();
        let m = Message::decode(&bytes).unwrap();
        assert_eq!(m.kind, Kind::Accumulate);
        assert_eq!(m.op, Some(SystemOperation::sum().into()));
        assert_eq!(m.element, Some(AccumulateType::Basic(Primitive::U64)));
        assert_eq!((m.token, m.disp, m.len, m.data.len()), (42, 3, 8, 8));
        for op in REDUCTIONS
            .map(|op| AccumulateOp::Reduce(SystemOperation::from_system_op(op)))
            .into_iter()
            .chain([AccumulateOp::Replace, AccumulateOp::NoOp])
        {
            assert_eq!(AccumulateOp::from_code(op.code()), Some(op));
        }
        for (i, op) in REDUCTIONS.into_iter().enumerate() {
            assert_eq!(op as usize, i, "{op:?}");
        }
    }

    #[test]
    fn pairs_travel_by_their_own_codes_and_a_bad_one_is_an_error() {
        let pair = PairType::of(ElementType::of::<ValueIndex<f64, i32>>()).unwrap();
        let data = [0u8; 24];
        let mut m = Message::new(Kind::Accumulate, 7);
        m.element = Some(AccumulateType::Pair(pair));
        m.op = Some(SystemOperation::min_loc().into());
        m.flags = FLAG_FETCH;
        m.len = 24;
        m.data = &data;
        let bytes = m.encode();
        assert_eq!(bytes[2], PAIR_CODE | pair.code());
        let got = Message::decode(&bytes).unwrap();
        assert_eq!((got.element, got.op), (m.element, m.op));
        // 16 bytes are not whole 12-byte pairs.
        let mut cut = m.encode();
        cut[24..32].copy_from_slice(&16u64.to_le_bytes());
        cut.truncate(HEADER + 16);
        assert!(Message::decode(&cut).is_err());
        // A pair code past the last pair type, and a pair on a
        // compare-and-swap, are refused.
        for code in [PAIR_CODE | 0x7f, PAIR_CODE | 9] {
            let mut b = bytes.clone();
            b[2] = code;
            assert!(Message::decode(&b).is_err(), "code {code:#x}");
        }
        let mut cas = Message::new(Kind::CompareAndSwap, 8);
        cas.element = Some(AccumulateType::Pair(pair));
        cas.len = 12;
        cas.data = &data;
        assert!(Message::decode(&cas.encode()).is_err());
    }

    #[test]
    fn every_truncation_and_corruption_is_an_error_not_a_panic() {
        let bytes = sample();
        for n in 0..bytes.len() {
            assert!(Message::decode(&bytes[..n]).is_err(), "{n} bytes accepted");
        }
        for at in 0..HEADER {
            for v in [0u8, 0x55, 0xff] {
                let mut b = bytes.clone();
                b[at] = v;
                // Either refused, or a message that still checks.
                if let Ok(m) = Message::decode(&b) {
                    assert_eq!(m.data.len() as u64, m.len, "byte {at} = {v}");
                }
            }
        }
        let mut extra = bytes.clone();
        extra.push(0);
        assert!(Message::decode(&extra).is_err());
    }

    #[test]
    fn a_batch_splits_into_its_messages_and_a_cut_one_is_an_error() {
        let mut batch = sample();
        let mut get = Message::new(Kind::Get, 43);
        get.len = 1 << 20;
        get.append_to(&mut batch);
        let mut no_op = Message::new(Kind::Accumulate, 44);
        no_op.element = Some(AccumulateType::Basic(Primitive::U64));
        no_op.op = Some(AccumulateOp::NoOp);
        no_op.flags = FLAG_FETCH;
        no_op.len = 8;
        no_op.append_to(&mut batch);
        let swap = [1u8; 16];
        let mut cas = Message::new(Kind::CompareAndSwap, 45);
        cas.element = Some(AccumulateType::Basic(Primitive::U64));
        cas.len = 8;
        cas.data = &swap;
        cas.append_to(&mut batch);
        let mut rest = &batch[..];
        let mut tokens = Vec::new();
        while !rest.is_empty() {
            let (m, after) = Message::split(rest).unwrap();
            tokens.push(m.token);
            rest = after;
        }
        assert_eq!(tokens, [42, 43, 44, 45]);
        for n in 1..batch.len() {
            let mut rest = &batch[..n];
            let mut failed = false;
            while !rest.is_empty() && !failed {
                match Message::split(rest) {
                    Ok((_, after)) => rest = after,
                    Err(_) => failed = true,
                }
            }
            // A cut batch is refused, unless it was cut between messages.
            assert!(failed || [40, 72, 104].contains(&n), "{n} bytes accepted");
        }
        // A length too large for the batch, or for the machine, is an error.
        let mut huge = sample();
        huge[24..32].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(Message::split(&huge).is_err());
        huge[0] = Kind::CompareAndSwap as u8;
        assert!(Message::split(&huge).is_err());
    }

    #[test]
    fn data_by_message_is_announced_without_data() {
        let mut acc = Message::new(Kind::Accumulate, 0);
        acc.flags = FLAG_BY_MESSAGE;
        acc.element = Some(AccumulateType::Basic(Primitive::F64));
        acc.op = Some(SystemOperation::sum().into());
        acc.len = 1 << 18;
        let mut get = Message::new(Kind::Get, 7);
        get.flags = FLAG_BY_MESSAGE;
        get.len = 1 << 20;
        let mut batch = Vec::new();
        for m in [&acc, &get] {
            m.append_to(&mut batch);
        }
        // Two headers, no data: each is split off on its own.
        assert_eq!(batch.len(), 2 * HEADER);
        let mut rest = &batch[..];
        for m in [&acc, &get] {
            let (got, after) = Message::split(rest).unwrap();
            assert_eq!((got.kind, got.flags, got.len), (m.kind, m.flags, m.len));
            rest = after;
        }
        // An accumulate by message that carries data, one both fetching
        // and by message, or the flag on another kind (a put's data is
        // placed, never by message), is refused.
        let mut with_data = acc.encode();
        with_data.extend_from_slice(&[0; 8]);
        assert!(Message::decode(&with_data).is_err());
        let mut fetching = acc.encode();
        fetching[1] |= FLAG_FETCH;
        assert!(Message::decode(&fetching).is_err());
        let mut cas = sample();
        cas[0] = Kind::CompareAndSwap as u8;
        cas[1] = FLAG_BY_MESSAGE;
        assert!(Message::decode(&cas).is_err());
        let mut put = Message::new(Kind::Put, 0);
        put.len = 1 << 20;
        let mut put = put.encode();
        put[1] = FLAG_BY_MESSAGE;
        assert!(Message::decode(&put).is_err());
    }

    #[test]
    fn data_written_after_a_header_gets_its_length() {
        let mut reply = Vec::new();
        Message::new(Kind::Reply, 9).append_to(&mut reply);
        reply.extend_from_slice(&[5; 12]);
        set_data_len(&mut reply);
        let m = Message::decode(&reply).unwrap();
        assert_eq!(
            (m.kind, m.token, m.len, m.data),
            (Kind::Reply, 9, 12, &[5u8; 12][..])
        );
    }

    #[test]
    fn refuses_what_the_kind_does_not_allow() {
        let mut b = sample();
        b[0] = 11;
        assert!(Message::decode(&b).is_err());
        let mut b = sample();
        b[1] = FLAG_EXCLUSIVE;
        assert!(Message::decode(&b).is_err());
        let mut b = sample();
        b[2] = Primitive::ALL.len() as u8;
        assert!(Message::decode(&b).is_err());
        let mut b = sample();
        b[3] = 14;
        assert!(Message::decode(&b).is_err());
        // Eight bytes are not a whole number of 16-byte elements.
        let mut b = sample();
        b[2] = Primitive::ALL
            .iter()
            .position(|&p| p == Primitive::U128)
            .unwrap() as u8;
        assert!(Message::decode(&b).is_err());
        let lock = Message::new(Kind::Lock, 1).encode();
        let mut with_len = lock.clone();
        with_len[24] = 1;
        assert!(Message::decode(&lock).is_ok());
        assert!(Message::decode(&with_len).is_err());
    }
}
