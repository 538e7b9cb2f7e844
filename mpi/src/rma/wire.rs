//! What an RMA active message says: the payload of an
//! `oxmpi_adi::proto::Kind::Active` packet, with checked decoding.
//!
//! Every message starts with a fixed [`HEADER`]-byte header,
//! little-endian, followed by its data:
//!
//! | offset | size | field    | meaning                                              |
//! |-------:|-----:|----------|------------------------------------------------------|
//! | 0      | 1    | kind     | [`Kind`]                                             |
//! | 1      | 1    | flags    | [`FLAG_FETCH`] (accumulate), [`FLAG_EXCLUSIVE`] (lock), [`FLAG_BY_MESSAGE`] (get, accumulate), [`FLAG_LAYOUT`] (put, get, accumulate) |
//! | 2      | 1    | element  | [`AccumulateType`] code: a basic type (its index in `Primitive::ALL`), or [`PAIR_CODE`] and a value-index pair type's index |
//! | 3      | 1    | op       | [`AccumulateOp`] code                                |
//! | 4      | 4    | reserved | 0                                                    |
//! | 8      | 8    | token    | the origin's operation, named in the reply (0: a put or accumulate, only counted) |
//! | 16     | 8    | disp     | target displacement in bytes (from the window's start; an address in a dynamic window) |
//! | 24     | 8    | len      | bytes of data the operation covers                   |
//!
//! A message with [`FLAG_LAYOUT`] (an operation with a target datatype)
//! has its target layout between the header and the data: a count `n`
//! (8 bytes), then `n` runs of 32 bytes each, little-endian — the offset
//! of the first segment from `disp` (i64), the segments' length (u64),
//! their count (u64) and the stride from one segment to the next (i64).
//! Its data (`len` bytes) is the segments' bytes one after another in
//! that order; the target scatters it into them (put, accumulate) or
//! gathers its reply from them (get, and a fetching accumulate's old
//! data). At most [`MAX_RUNS`] runs, each of at least one non-empty
//! segment, every segment within the i64 range, the lengths adding up to
//! `len` (whole elements for an accumulate, though a segment may cut
//! one: a value-index pair with padding between value and index, which
//! the target gathers and combines whole).
//!
//! A payload is a batch: one or more messages one after another, each
//! as long as its header says ([`Message::split`]).
//!
//! Decoding trusts nothing: the kind, the flags it allows, the element and
//! op codes, the reserved bytes, the layout's runs and that the data's
//! length agrees with the kind and `len` are all checked, and a message
//! that fails is a protocol error of its sender. Whether the range lies in the target's window is
//! the target's check (`target.rs`), answered with [`Kind::Refused`].

use crate::collective::op::{PairType, PredefinedReduction, SystemOp, NUMBER_OP_ORDER};
use crate::collective::SystemOperation;
use crate::datatype::{Primitive, Run};
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
/// Flag of a [`Kind::Put`], [`Kind::Get`] or [`Kind::Accumulate`] not
/// [`FLAG_BY_MESSAGE`]: a target layout (runs of segments from `disp`)
/// follows the header, and the data is the segments' (see the module
/// docs): an operation with a target datatype in one message.
pub(crate) const FLAG_LAYOUT: u8 = 8;

/// The most runs a message's layout holds (64 KiB of them): an
/// operation whose layout has more is sent as several messages.
pub(crate) const MAX_RUNS: usize = 2048;

/// Bytes of one run of a layout on the wire.
const RUN_BYTES: usize = 32;

/// A message's target layout ([`FLAG_LAYOUT`]): the runs an origin
/// encodes, or the wire bytes of those a target decoded (checked by
/// [`Message::decode`]); read either way by [`Layout::runs`]. Borrowed,
/// so that a message owns nothing and moves cheaply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Layout<'p> {
    /// Runs to encode.
    Runs(&'p [Run]),
    /// Runs as they came, [`RUN_BYTES`] each.
    Wire(&'p [u8]),
}

impl<'p> Layout<'p> {
    /// No layout: a contiguous operation's.
    pub(crate) const NONE: Layout<'static> = Layout::Runs(&[]);

    /// How many runs.
    pub(crate) fn len(&self) -> usize {
        match self {
            Layout::Runs(runs) => runs.len(),
            Layout::Wire(bytes) => bytes.len() / RUN_BYTES,
        }
    }

    /// The runs, in order.
    pub(crate) fn runs(self) -> impl Iterator<Item = Run> + 'p {
        let (runs, wire): (&[Run], &[u8]) = match self {
            Layout::Runs(runs) => (runs, &[]),
            Layout::Wire(bytes) => (&[], bytes),
        };
        runs.iter()
            .copied()
            .chain(wire.chunks_exact(RUN_BYTES).map(run_from_wire))
    }
}

/// The run in `wire` ([`RUN_BYTES`] bytes; see the module docs).
fn run_from_wire(wire: &[u8]) -> Run {
    Run::new(
        u64_at(wire, 0) as i64 as isize,
        u64_at(wire, 8) as usize,
        u64_at(wire, 16) as usize,
        u64_at(wire, 24) as i64 as isize,
    )
}

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
    /// Asks for the target's window lock; replied to once granted. The
    /// sender's operations and unlock may follow before the grant: the
    /// target handles them once it granted the lock.
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
    /// The target layout under [`FLAG_LAYOUT`] (its runs' offsets from
    /// `disp`), else empty.
    pub(crate) layout: Layout<'p>,
    pub(crate) data: &'p [u8],
}

impl<'p> Message<'p> {
    /// The reply that answers the operation `token`, no data yet; with
    /// token 0 a counted reply, which answers as many operations without
    /// a token (puts, accumulates) as its `disp` says ([`count_one_more`]):
    /// one here.
    pub(crate) fn reply(token: u64) -> Message<'p> {
        let mut m = Message::new(Kind::Reply, token);
        m.disp = u64::from(token == 0);
        m
    }

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
            layout: Layout::NONE,
            data: &[],
        }
    }

    /// The wire form: header, layout and data (the tests' messages;
    /// the library appends to the batch or replies it builds).
    #[cfg(test)]
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.append_to(&mut out);
        out
    }

    /// The wire form, after what `out` holds: one more message of a
    /// batch.
    pub(crate) fn append_to(&self, out: &mut Vec<u8>) {
        self.append_header_to(out);
        out.extend_from_slice(self.data);
    }

    /// The header and the layout alone, after what `out` holds: its data,
    /// which must follow them on the wire, is sent from where it is (a
    /// large put's data, a part of the active message of its own).
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
        if self.flags & FLAG_LAYOUT != 0 {
            out.extend_from_slice(&(self.layout.len() as u64).to_le_bytes());
            for run in self.layout.runs() {
                out.extend_from_slice(&(run.offset as i64).to_le_bytes());
                out.extend_from_slice(&(run.len as u64).to_le_bytes());
                out.extend_from_slice(&(run.count as u64).to_le_bytes());
                out.extend_from_slice(&(run.stride as i64).to_le_bytes());
            }
        }
    }

    /// Splits the first message off a batch (messages one after another in
    /// one payload) and decodes it; the messages after it. Its length is
    /// its header's: kind, operation and `len` say how much data follows.
    /// Never panics, whatever the bytes.
    pub(crate) fn split(batch: &'p [u8]) -> Result<(Message<'p>, &'p [u8])> {
        let head = batch
            .get(..HEADER)
            .ok_or_else(|| bad(format!("{} bytes, less than a header", batch.len())))?;
        let len = u64_at(head, 24);
        // A layout's runs come before the data; their count is checked
        // against the batch with the rest below.
        let layout = if head[1] & FLAG_LAYOUT != 0 {
            let runs = batch
                .get(HEADER..HEADER + 8)
                .ok_or_else(|| bad("a layout cut before its count of runs"))?;
            u64_at(runs, 0)
                .checked_mul(RUN_BYTES as u64)
                .and_then(|n| n.checked_add(8))
        } else {
            Some(0)
        };
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
            .zip(layout)
            .and_then(|(d, l)| d.checked_add(l))
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
        let (head, body) = payload
            .split_at_checked(HEADER)
            .ok_or_else(|| bad(format!("{} bytes, less than a header", payload.len())))?;
        let kind = Kind::from_u8(head[0]).ok_or_else(|| bad(format!("kind {}", head[0])))?;
        let flags = head[1];
        let allowed = match kind {
            Kind::Accumulate if flags & FLAG_FETCH != 0 => FLAG_FETCH | FLAG_LAYOUT,
            Kind::Accumulate | Kind::Get if flags & FLAG_LAYOUT != 0 => FLAG_LAYOUT,
            Kind::Accumulate => FLAG_BY_MESSAGE,
            Kind::Lock => FLAG_EXCLUSIVE,
            Kind::Get => FLAG_BY_MESSAGE,
            Kind::Put => FLAG_LAYOUT,
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
        let len = u64_at(head, 24);
        let (layout, data) = if flags & FLAG_LAYOUT != 0 {
            decode_layout(body, len)?
        } else {
            (Layout::NONE, body)
        };
        let message = Message {
            kind,
            flags,
            element,
            op,
            class,
            token: u64_at(head, 8),
            disp: u64_at(head, 16),
            len,
            layout,
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

/// Whether `encoded` starts with a counted reply ([`Message::reply`] of
/// token 0), whose count [`count_one_more`] may raise.
pub(crate) fn is_counted_reply(encoded: &[u8]) -> bool {
    encoded.len() >= HEADER && encoded[0] == Kind::Reply as u8 && encoded[8..16] == [0; 8]
}

/// Adds one to the count of the counted reply encoded at the start of
/// `encoded` ([`is_counted_reply`]): it answers one more operation.
pub(crate) fn count_one_more(encoded: &mut [u8]) {
    let count = u64_at(encoded, 16) + 1;
    encoded[16..24].copy_from_slice(&count.to_le_bytes());
}

/// The little-endian u64 at `at` in `bytes` (at least `at + 8` long).
fn u64_at(bytes: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(w)
}

/// Decodes the layout at the start of `body` (after the header of a
/// message of `len` bytes of data under [`FLAG_LAYOUT`]): its runs,
/// checked (see the module docs), and the bytes after it. (An
/// accumulate's segments need not hold whole elements, only the whole
/// message: a layout may part a pair's value from its index.)
fn decode_layout(body: &[u8], len: u64) -> Result<(Layout<'_>, &[u8])> {
    let (count, rest) = body
        .split_at_checked(8)
        .ok_or_else(|| bad("a layout cut before its count of runs"))?;
    let n = u64_at(count, 0);
    if n == 0 || n > MAX_RUNS as u64 {
        return Err(bad(format!("a layout of {n} runs (1 to {MAX_RUNS})")));
    }
    let (runs, data) = rest
        .split_at_checked(n as usize * RUN_BYTES)
        .ok_or_else(|| bad(format!("a layout of {n} runs cut short")))?;
    let mut total = 0u64;
    for run in runs.chunks_exact(RUN_BYTES).map(run_from_wire) {
        let (seg, times) = (run.len as u64, run.count as u64);
        // Every segment must lie at addresses of this machine (isize), so
        // that walking the run never wraps.
        let (low, high) = run.span();
        let ends_fit = isize::try_from(low).is_ok() && isize::try_from(high).is_ok();
        let bytes = seg.checked_mul(times);
        total = match bytes.and_then(|b| total.checked_add(b)) {
            Some(t) if seg > 0 && times > 0 && ends_fit => t,
            _ => {
                return Err(bad(format!(
                    "a layout run of {times} segments of {seg} bytes, {} apart, from \
                     offset {}",
                    run.stride, run.offset
                )))
            }
        };
    }
    if total != len {
        return Err(bad(format!(
            "a layout of {total} bytes for an operation of {len}"
        )));
    }
    Ok((Layout::Wire(runs), data))
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

    /// A put of 24 bytes into three 8-byte segments: one run of two
    /// 16 apart, and one before the displacement.
    fn typed_put() -> Vec<u8> {
        let data = [3u8; 24];
        let layout = [Run::new(0, 8, 2, 16), Run::new(-8, 8, 1, 0)];
        let mut m = Message::new(Kind::Put, 0);
        m.flags = FLAG_LAYOUT;
        m.disp = 64;
        m.len = 24;
        m.layout = Layout::Runs(&layout);
        m.data = &data;
        m.encode()
    }

    #[test]
    fn a_layout_round_trips_and_splits_off_a_batch() {
        let mut batch = typed_put();
        assert_eq!(batch.len(), HEADER + 8 + 2 * RUN_BYTES + 24);
        let mut get = Message::new(Kind::Get, 5);
        get.flags = FLAG_LAYOUT;
        get.len = 48;
        let layout = [Run::new(0, 16, 3, 32)];
        get.layout = Layout::Runs(&layout);
        get.append_to(&mut batch);
        let (put, rest) = Message::split(&batch).unwrap();
        assert_eq!((put.kind, put.disp, put.len), (Kind::Put, 64, 24));
        assert_eq!(
            &put.layout.runs().collect::<Vec<_>>()[..],
            [Run::new(0, 8, 2, 16), Run::new(-8, 8, 1, 0)]
        );
        assert_eq!(put.data, [3u8; 24]);
        let (got, rest) = Message::split(rest).unwrap();
        assert_eq!(
            (
                got.kind,
                got.token,
                &got.layout.runs().collect::<Vec<_>>()[..]
            ),
            (Kind::Get, 5, &layout[..])
        );
        assert!(got.data.is_empty() && rest.is_empty());
        // A fetching accumulate takes a layout too; one by message does not.
        let mut acc = Message::new(Kind::Accumulate, 6);
        acc.flags = FLAG_FETCH | FLAG_LAYOUT;
        acc.element = Some(AccumulateType::Basic(Primitive::U64));
        acc.op = Some(SystemOperation::sum().into());
        acc.len = 48;
        acc.layout = Layout::Runs(&layout);
        let data = [0u8; 48];
        acc.data = &data;
        let mut bytes = acc.encode();
        assert_eq!(Message::decode(&bytes).unwrap().layout.len(), 1);
        bytes[1] = FLAG_BY_MESSAGE | FLAG_LAYOUT;
        assert!(Message::decode(&bytes).is_err());
        // Nor does a compare-and-swap.
        let mut cas = typed_put();
        cas[0] = Kind::CompareAndSwap as u8;
        assert!(Message::decode(&cas).is_err());
    }

    #[test]
    fn a_malformed_layout_is_an_error_not_a_panic() {
        let bytes = typed_put();
        let refused = |b: &[u8]| {
            let e = Message::decode(b).unwrap_err();
            assert_eq!(e.class(), ErrorClass::ProcFailed, "{}", e.message());
            Message::split(b).map(drop).unwrap_err();
        };
        // Cut anywhere.
        for n in 0..bytes.len() {
            assert!(Message::decode(&bytes[..n]).is_err(), "{n} bytes accepted");
            assert!(Message::split(&bytes[..n]).is_err(), "{n} bytes split");
        }
        let with = |at: usize, v: u64| {
            let mut b = bytes.clone();
            b[at..at + 8].copy_from_slice(&v.to_le_bytes());
            b
        };
        let runs = HEADER;
        let first = HEADER + 8;
        // No runs, more runs than allowed, a count that overflows.
        refused(&with(runs, 0));
        refused(&with(runs, MAX_RUNS as u64 + 1));
        refused(&with(runs, u64::MAX));
        refused(&with(runs, u64::MAX / RUN_BYTES as u64 + 1));
        // An empty segment, no segments, lengths whose product or sum
        // overflows, or that add up to other than `len`.
        refused(&with(first + 8, 0));
        refused(&with(first + 16, 0));
        refused(&with(first + 8, 1 << 33));
        let mut b = with(first + 8, 1 << 32);
        b[first + 16..first + 24].copy_from_slice(&(1u64 << 32).to_le_bytes());
        refused(&b);
        refused(&with(first + 8, 9));
        // A run whose last segment lies beyond the address range, either
        // way (one that lies before the window is the target's to refuse,
        // as out of range).
        refused(&with(first + 24, i64::MAX as u64));
        let mut b = with(first + 24, i64::MIN as u64);
        assert!(Message::decode(&b).is_ok());
        b[first..first + 8].copy_from_slice(&(-1i64).to_le_bytes());
        refused(&b);
        refused(&with(first, i64::MAX as u64));
        // An accumulate's segments are whole elements.
        let mut acc = bytes.clone();
        acc[0] = Kind::Accumulate as u8;
        acc[2] = Primitive::ALL
            .iter()
            .position(|&p| p == Primitive::U64)
            .unwrap() as u8;
        assert!(Message::decode(&acc).is_ok());
        acc[2] = Primitive::ALL
            .iter()
            .position(|&p| p == Primitive::U128)
            .unwrap() as u8;
        refused(&acc);
        // Every byte of the layout corrupted: refused, or still checked.
        for at in HEADER..first + 2 * RUN_BYTES {
            for v in [0u8, 0x55, 0x80, 0xff] {
                let mut b = bytes.clone();
                b[at] = v;
                if let Ok(m) = Message::decode(&b) {
                    let total: usize = m.layout.runs().map(|r| r.len * r.count).sum();
                    assert_eq!((total as u64, m.data.len() as u64), (m.len, m.len));
                }
            }
        }
    }

    #[test]
    fn data_written_after_a_header_gets_its_length() {
        let mut reply = Vec::new();
        Message::reply(9).append_to(&mut reply);
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
