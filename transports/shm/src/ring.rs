//! The lock-free single-producer single-consumer queue in a segment.
//!
//! The cells form a ring. The producer writes *frames*: a run of
//! consecutive cells, never wrapping past the end of the ring, whose first
//! 8 bytes are the control word ([`crate::proto::control_word`]: kind,
//! position check, length) and whose following bytes (56 in the first
//! cell, 64 in each next one) carry the contents. A standard eager packet
//! of up to 40 payload bytes is one short frame of one cell (16 bytes of
//! header fields, then the payload; see [`FrameKind::Short`]), and one of
//! up to 2 KiB a short frame of several cells where they fit before the
//! ring's end. Any other packet, and a longer short one that does not
//! fit there, is a header
//! frame (the 56-byte packet header, or its first 48 bytes when the last
//! 8 are zero, as in every eager packet, then the first payload bytes) and as
//! many data frames as the rest of its payload needs, so a packet may span
//! several cells, several frames, and the end of the ring.
//!
//! # Publication without a shared tail
//! A frame is published by the release store of its control word, which is
//! never zero and carries the frame's position; the consumer waits on the
//! control word of the cell at its head and so reads nothing but the cell
//! it will consume. Until the frame there is published, that cell holds
//! what the ring's last lap left in it: a control word of the last lap
//! (its position check is a lap behind), zero, or payload bytes, when the
//! cell was one of a longer frame's later cells. The consumer takes
//! nothing but a word carrying the head's own position check for a frame,
//! so payload bytes need no work unless they carry, by chance or by
//! design, the check of the cell's position on the next lap. The producer
//! judges the first word of each later cell as it writes the frame (from
//! the payload it copies; a last cell's word of fewer bytes is written
//! whole, zeros after them), remembers the rare cell whose word does, and
//! before publishing a frame zeroes the control word of the cell that
//! follows it (where the next frame will start) if that cell is one of
//! them. Doing so needs one free cell beyond the frame. So a frame's
//! publication touches no cell but its own: the cell after a frame is not
//! written, or taken out of the consumer's cache, while the consumer reads
//! the frame before it and looks past it, whether the last lap left a
//! control word or payload there (format version 7; before, the producer
//! zeroed every cell that had held payload before a frame could start
//! there, which frames of lengths that shift their cells each lap, such as
//! 3, 5 or 9 cells, paid on most messages).
//!
//! # Free cells
//! The consumer publishes its head (the position it reads next) after
//! copying a frame out; the producer reads it only when the head it saw
//! last leaves too little room, and refuses a head that moved backwards or
//! past what was written. A full queue is back-pressure: a push returns
//! `None` or 0 and the caller tries again later.
//!
//! # Sleeping
//! Each side can sleep in the kernel: the consumer while its queues are
//! empty, the producer while a queue is full. Before sleeping it raises its
//! flag and looks once more (at the head's cell, or at the head); after
//! publishing (or freeing cells) the other side looks at the flag and, if
//! it is up, pokes the sleeper's socket. A barrier on each side between
//! its store and its load guarantees that at least one of the two sees the
//! other's store: no wake-up is lost. The busy side crosses its barrier at
//! every message and the side about to sleep rarely, so where both
//! processes can ([`Barriers::Asymmetric`]) the busy side's is only a
//! compiler fence and the sleeper's a barrier the kernel runs on every
//! thread of both (`membarrier`): a fence after each publication would
//! wait for the store to take the cell's line from the consumer's cache.

use crate::proto::{
    check_of, control_word, decode_short, parse_control_word, position_check, FrameKind,
    ShortFields, CELL, CONTROL_LEN, SHORT_FIELDS, SHORT_FRAME_PAYLOAD_MAX, SHORT_HEADER_SAVING,
    SHORT_PAYLOAD_MAX,
};
use crate::segment::Segment;
use oxmpi_adi::proto::HEADER_LEN;
use std::io;
use std::sync::atomic::{compiler_fence, fence, Ordering};

/// Most bytes one frame carries. A long payload goes in frames of this
/// size, so that the consumer copies one out while the producer writes the
/// next (a pipelined copy): a 16 KiB eager message (the default limit)
/// is five frames, and its receiver starts copying after the first 4 KiB
/// is written, not after all of it.
const FRAME_MAX: usize = 4 * 1024 - CONTROL_LEN;
/// A data frame shorter than this waits for more free cells, unless it ends
/// the payload or meets the end of the ring: a slow consumer must not turn
/// a long payload into a stream of tiny frames.
const FRAME_MIN: usize = 1024 - CONTROL_LEN;

/// How the two sides of a queue order a store of theirs before a load of
/// the other side's flag or position (see the module docs, "Sleeping").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Barriers {
    /// A sequentially consistent fence on each side.
    Symmetric,
    /// A compiler fence on the busy side; the side about to sleep asks the
    /// kernel for a barrier on both processes' threads
    /// ([`crate::sys::barrier_everywhere`]). Both processes must be
    /// registered for it ([`crate::sys::register_for_barriers`]).
    Asymmetric,
}

impl Barriers {
    /// The busy side's barrier, between publishing (or freeing cells) and
    /// its look at the other side's flag.
    #[inline(always)]
    fn light(self) {
        match self {
            // SeqCst: pairs with the fence in `before_sleeping_look`.
            Barriers::Symmetric => fence(Ordering::SeqCst),
            // The kernel's barrier in `before_sleeping_look` runs on this
            // thread: only the compiler must keep the store before the load.
            Barriers::Asymmetric => compiler_fence(Ordering::SeqCst),
        }
    }
}

/// The barrier of a side about to sleep, after raising its flags
/// ([`Consumer::set_sleeping`], [`Producer::set_waiting`]) and before its
/// last look ([`Consumer::has_frame`], [`Producer::head_moved`]):
/// `asymmetric` when any of its queues uses [`Barriers::Asymmetric`]. An
/// error means no barrier was made: the side must not sleep.
pub(crate) fn before_sleeping_look(asymmetric: bool) -> io::Result<()> {
    // SeqCst: pairs with the busy side's fence in `Barriers::light`.
    fence(Ordering::SeqCst);
    if asymmetric {
        crate::sys::barrier_everywhere()?;
    }
    Ok(())
}

/// The cells of a queue hold what the protocol does not allow: the peer
/// that writes them is faulty. The message says what was found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Corrupt(pub String);

/// Cells taken by a frame carrying `bytes` bytes.
fn cells_for(bytes: usize) -> u64 {
    (CONTROL_LEN + bytes).div_ceil(CELL) as u64
}

/// The producer's end of a queue, over the segment it created.
pub(crate) struct Producer {
    segment: Segment,
    /// Position (counted from the start, never wrapping) of the next cell
    /// to write.
    tail: u64,
    /// The consumer's head as last read.
    head_seen: u64,
    /// One bit per cell, set where the cell's first word holds payload
    /// bytes (it was one of a frame's later cells) that carry the position
    /// check of the cell's next lap: such a cell's word is zeroed before
    /// the consumer can reach it as a frame's start (see the module docs).
    lookalikes: Vec<u64>,
    /// Symmetric until the consumer agrees otherwise
    /// ([`Producer::take_agreed_barriers`]).
    barriers: Barriers,
}

impl Producer {
    /// The producer of a freshly created segment, not yet handed over;
    /// `asymmetric` where this process can take part in asymmetric
    /// barriers, which the segment tells the consumer.
    pub(crate) fn new(segment: Segment, asymmetric: bool) -> Producer {
        // Relaxed: the consumer reads it after receiving the segment's
        // descriptor, which this process sends after this store.
        segment
            .producer_barriers()
            .store(u32::from(asymmetric), Ordering::Relaxed);
        let words = segment.cells().div_ceil(64) as usize;
        Producer {
            segment,
            tail: 0,
            head_seen: 0,
            lookalikes: vec![0; words],
            barriers: Barriers::Symmetric,
        }
    }

    /// Takes the barriers the consumer agreed to, once it accepted the
    /// queue (its VERDICT follows its choice) and before the first frame.
    pub(crate) fn take_agreed_barriers(&mut self) {
        // Relaxed: written before the consumer's VERDICT, which this
        // process has read.
        let agreed = self.segment.barriers_agreed().load(Ordering::Relaxed) != 0;
        let offered = self.segment.producer_barriers().load(Ordering::Relaxed) != 0;
        self.barriers = if agreed && offered {
            Barriers::Asymmetric
        } else {
            Barriers::Symmetric
        };
    }

    /// The barriers of this queue.
    pub(crate) fn barriers(&self) -> Barriers {
        self.barriers
    }

    /// The segment, to hand its descriptor to the consumer.
    pub(crate) fn segment(&self) -> &Segment {
        &self.segment
    }

    /// Free cells, reading the consumer's head only if the one seen last
    /// leaves fewer than `wanted`.
    #[inline(always)]
    fn free_cells(&mut self, wanted: u64) -> Result<u64, Corrupt> {
        let free = self.segment.cells() - (self.tail - self.head_seen);
        if free >= wanted {
            return Ok(free);
        }
        self.free_cells_now()
    }

    /// Free cells after a read of the consumer's head.
    #[inline(never)]
    fn free_cells_now(&mut self) -> Result<u64, Corrupt> {
        let count = self.segment.cells();
        // Acquire: pairs with the consumer's release store of its head,
        // made after it copied the cells out, so they may be overwritten.
        let head = self.segment.head().load(Ordering::Acquire);
        if head < self.head_seen || head > self.tail {
            return Err(Corrupt(format!(
                "the consumer's head moved to {head}, outside {}..={}",
                self.head_seen, self.tail
            )));
        }
        self.head_seen = head;
        Ok(count - (self.tail - head))
    }

    /// Writes a header frame: `header` and as many bytes from the start of
    /// `payload` as fit. `None` if the queue has no room for the header.
    pub(crate) fn push_header(
        &mut self,
        header: &[u8; HEADER_LEN],
        payload: &[u8],
    ) -> Result<Option<usize>, Corrupt> {
        let short = HEADER_LEN - SHORT_HEADER_SAVING;
        if header[short..] == [0u8; SHORT_HEADER_SAVING] {
            return self.push(FrameKind::ShortHeader, &header[..short], payload);
        }
        self.push(FrameKind::Header, header, payload)
    }

    /// Writes a whole short packet in one cell: a [`FrameKind::Short`]
    /// frame of its header `fields` ([`crate::proto::encode_short`]) and
    /// `payload` (at most [`SHORT_PAYLOAD_MAX`] bytes). False if the
    /// queue has no room. Always inlined into its one caller, the send of
    /// a short message: a call frame less before the publication.
    #[inline(always)]
    pub(crate) fn push_short(
        &mut self,
        fields: &[u8; SHORT_FIELDS],
        payload: &[u8],
    ) -> Result<bool, Corrupt> {
        debug_assert!(payload.len() <= SHORT_PAYLOAD_MAX);
        // The frame's cell, and the one after it to clear.
        if self.free_cells(2)? < 2 {
            return Ok(false);
        }
        let index = self.tail & (self.segment.cells() - 1);
        let payload = &payload[..payload.len().min(SHORT_PAYLOAD_MAX)];
        // The fields and the payload go straight into the cell: the rest of
        // it keeps what the last lap left, which the length in the control
        // word leaves out (building the whole cell first, zeroed, and
        // copying it in cost 4 instructions more per push).
        let start = index as usize * CELL + CONTROL_LEN;
        self.segment.write_cells(start, fields);
        self.segment.write_cells(start + SHORT_FIELDS, payload);
        self.publish(index, FrameKind::Short, SHORT_FIELDS + payload.len(), 1);
        Ok(true)
    }

    /// Writes a whole standard eager packet of more than
    /// [`SHORT_PAYLOAD_MAX`] and at most [`SHORT_FRAME_PAYLOAD_MAX`]
    /// payload bytes as one [`FrameKind::Short`] frame of several cells.
    /// False, with nothing written, when the queue has no room for it or
    /// it would run past the ring's end (the caller then sends it as a
    /// header frame and data frames, which may wrap).
    pub(crate) fn push_short_frame(
        &mut self,
        fields: &[u8; SHORT_FIELDS],
        payload: &[u8],
    ) -> Result<bool, Corrupt> {
        debug_assert!(payload.len() <= SHORT_FRAME_PAYLOAD_MAX);
        let bytes = SHORT_FIELDS + payload.len();
        let cells = cells_for(bytes);
        let index = self.tail & (self.segment.cells() - 1);
        // The frame's cells, and the one after it to clear.
        if cells > self.segment.cells() - index || self.free_cells(cells + 1)? <= cells {
            return Ok(false);
        }
        // The whole frame, without `push`'s choice of what fits.
        self.write_frame(index, fields, payload);
        self.publish(index, FrameKind::Short, bytes, cells);
        Ok(true)
    }

    /// Writes a frame's contents at cell `index`: `prefix`, then
    /// `payload`. Its later cells first, its first cell last, just before
    /// the control word in it: a consumer waiting on that word reads the
    /// first cell's line, and each read takes the line back from the
    /// producer while it writes there, so the cell's writes and the
    /// publication are kept together (one transfer of the line, not one
    /// before the frame's payload and one after).
    #[inline(always)]
    fn write_frame(&mut self, index: u64, prefix: &[u8], payload: &[u8]) {
        self.note_lookalikes(index, prefix.len(), payload);
        let start = index as usize * CELL + CONTROL_LEN;
        let (in_first, in_later) =
            payload.split_at(payload.len().min(CELL - CONTROL_LEN - prefix.len()));
        self.segment
            .write_cells(start + prefix.len() + in_first.len(), in_later);
        self.segment.write_cells(start, prefix);
        self.segment.write_cells(start + prefix.len(), in_first);
    }

    /// Publishes the frame written at cell `index` (the tail's), of
    /// `cells` cells carrying `bytes` bytes, and moves the tail past it.
    // Always inlined: on the path of every message.
    #[inline(always)]
    fn publish(&mut self, index: u64, kind: FrameKind, bytes: usize, cells: u64) {
        let count = self.segment.cells();
        let next = (index + cells) & (count - 1);
        // The frame's first cell holds a control word: its bit was cleared
        // when the frame before was published (below), or never set.
        debug_assert!(!self.is_lookalike(index));
        if self.is_lookalike(next) {
            self.lookalikes[(next / 64) as usize] &= !(1 << (next % 64));
            // Relaxed: the release store below orders it before the
            // consumer's first look at `next`, which follows its acquire
            // of this frame.
            self.segment.control(next).store(0, Ordering::Relaxed);
        }
        // Release: publishes the frame's bytes (and the cleared control
        // word after it) to the consumer's acquire load in `Consumer::peek`.
        self.segment
            .control(index)
            .store(control_word(kind, self.tail, bytes), Ordering::Release);
        self.tail += cells;
    }

    /// Marks the later cells of a frame about to be written at cell
    /// `index` (the tail's), `prefix_len` bytes and then `payload`, whose
    /// first word will carry the position check of the cell's next lap.
    /// The words are read from `payload` (which a later cell's first word
    /// always lies in: a prefix fits the first cell), not from the cells
    /// after the copy, whose loads would wait for the copy's stores.
    #[inline(always)]
    fn note_lookalikes(&mut self, index: u64, prefix_len: usize, payload: &[u8]) {
        let Some(later_cells) = payload.get(CELL - CONTROL_LEN - prefix_len..) else {
            return;
        };
        let next_lap = self.tail + self.segment.cells();
        // Each chunk starts with a later cell's first word.
        let whole = later_cells.chunks_exact(CELL);
        let last = whole.remainder();
        let mut later = 0;
        for chunk in whole {
            later += 1;
            if let Some(bytes) = chunk.first_chunk::<CONTROL_LEN>() {
                self.note_lookalike(index + later, next_lap + later, u64::from_le_bytes(*bytes));
            }
        }
        if last.is_empty() {
            return;
        }
        later += 1;
        let word = match last.first_chunk::<CONTROL_LEN>() {
            Some(bytes) => u64::from_le_bytes(*bytes),
            None => {
                // Fewer bytes than a word in the frame's last cell: the
                // word is written whole, zeros after them, so that nothing
                // the last lap left there counts (reading it would cost a
                // load of the line before the copy's stores take it).
                let word = last
                    .iter()
                    .rev()
                    .fold(0u64, |word, &byte| word << 8 | u64::from(byte));
                // Relaxed: published by the frame's release store; the
                // copy writes the same bytes again.
                self.segment
                    .control(index + later)
                    .store(word, Ordering::Relaxed);
                word
            }
        };
        self.note_lookalike(index + later, next_lap + later, word);
    }

    /// Marks cell `index` if `word`, its first, will carry the check of
    /// `position`, the cell's on the next lap.
    #[inline(always)]
    fn note_lookalike(&mut self, index: u64, position: u64, word: u64) {
        if check_of(word) == position_check(position) {
            self.mark_lookalike(index);
        }
    }

    /// Marks cell `index` as holding payload that would pass for a frame
    /// on the next lap. Out of line: payload rarely carries the check.
    #[cold]
    #[inline(never)]
    fn mark_lookalike(&mut self, index: u64) {
        self.lookalikes[(index / 64) as usize] |= 1 << (index % 64);
    }

    /// Whether the first word of cell `index` holds payload that would
    /// pass for a frame.
    #[inline]
    fn is_lookalike(&self, index: u64) -> bool {
        self.lookalikes[(index / 64) as usize] & 1 << (index % 64) != 0
    }

    /// Writes a data frame with as many bytes from the start of `payload`
    /// (not empty) as fit; 0 if the queue is full.
    pub(crate) fn push_data(&mut self, payload: &[u8]) -> Result<usize, Corrupt> {
        Ok(self.push(FrameKind::Data, &[], payload)?.unwrap_or(0))
    }

    /// Writes what fits of a packet, going on from `sent`: `None` when
    /// nothing of it went yet, `Some(n)` when its header and the first `n`
    /// payload bytes did (updated). Returns whether the whole packet went.
    pub(crate) fn push_packet(
        &mut self,
        header: &[u8; HEADER_LEN],
        payload: &[u8],
        sent: &mut Option<usize>,
    ) -> Result<bool, Corrupt> {
        let mut done = match *sent {
            Some(n) => n,
            None => match self.push_header(header, payload)? {
                Some(n) => n,
                None => return Ok(false),
            },
        };
        *sent = Some(done);
        while done < payload.len() {
            match self.push_data(&payload[done..])? {
                0 => return Ok(false),
                n => done += n,
            }
            *sent = Some(done);
        }
        Ok(true)
    }

    fn push(
        &mut self,
        kind: FrameKind,
        prefix: &[u8],
        payload: &[u8],
    ) -> Result<Option<usize>, Corrupt> {
        let count = self.segment.cells();
        let index = self.tail & (count - 1);
        let to_end = count - index;
        let wanted = cells_for((prefix.len() + payload.len()).min(FRAME_MAX));
        // One cell more than the frame: the one after it is cleared.
        let free = self.free_cells(wanted + 1)?;
        if free < 2 {
            return Ok(None);
        }
        let cells = wanted.min(free - 1).min(to_end);
        let room = cells as usize * CELL - CONTROL_LEN - prefix.len();
        let n = payload.len().min(room);
        let smallest = FRAME_MIN.min(count as usize / 4 * CELL);
        if kind == FrameKind::Data
            && (n == 0 || n < payload.len() && n < smallest && cells < to_end)
        {
            return Ok(None);
        }
        let cells = cells_for(prefix.len() + n);
        self.write_frame(index, prefix, &payload[..n]);
        self.publish(index, kind, prefix.len() + n, cells);
        Ok(Some(n))
    }

    /// Whether the consumer may be asleep, to be poked after publishing.
    #[inline]
    pub(crate) fn consumer_sleeping(&self) -> bool {
        // Between this side's publications and its look at the flag;
        // pairs with the consumer's `before_sleeping_look` (see the module
        // docs: one side sees the other's store).
        self.barriers.light();
        // Relaxed: the barrier orders it.
        self.segment.consumer_sleeping().load(Ordering::Relaxed) != 0
    }

    /// Raises (or lowers) this side's flag asking the consumer to poke it
    /// when it frees cells. After raising it and [`before_sleeping_look`],
    /// [`Producer::head_moved`] tells whether cells were freed meanwhile.
    pub(crate) fn set_waiting(&self, waiting: bool) {
        // Relaxed: `before_sleeping_look` orders it before the look at
        // the head.
        self.segment
            .producer_waiting()
            .store(u32::from(waiting), Ordering::Relaxed);
    }

    /// Whether the consumer freed cells since the producer last looked.
    pub(crate) fn head_moved(&self) -> bool {
        // Relaxed: only compared; `free_cells` reads it again with Acquire
        // before any cell is reused.
        self.segment.head().load(Ordering::Relaxed) != self.head_seen
    }
}

/// A published frame at the consumer's head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Frame {
    /// What it carries.
    pub kind: FrameKind,
    /// Index of its first cell.
    index: u64,
    /// Bytes after the control word.
    bytes: usize,
}

impl Frame {
    /// Payload bytes it carries (after the packet header, in a header
    /// frame).
    pub(crate) fn payload_len(&self) -> usize {
        self.bytes - self.kind.header_len()
    }

    fn payload_offset(&self) -> usize {
        self.index as usize * CELL + CONTROL_LEN + self.kind.header_len()
    }
}

/// What the control word at a consumer's head shows at one look
/// ([`Consumer::look`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Head {
    /// Nothing published there yet.
    Empty,
    /// A [`FrameKind::Short`] frame (one cell or several), checked as
    /// [`Consumer::peek`] checks it.
    Short(Frame),
    /// Something else: another frame, or a word [`Consumer::peek`] finds
    /// corrupt.
    Other,
}

/// The consumer's end of a queue, over a segment a peer handed over.
pub(crate) struct Consumer {
    segment: Segment,
    /// Position of the next cell to read.
    head: u64,
    barriers: Barriers,
}

impl Consumer {
    /// The consumer of a segment no one has read yet, before this side
    /// accepts it: the queue's barriers are asymmetric where both this
    /// process (`asymmetric`) and the producer's can take part, which the
    /// segment tells the producer.
    pub(crate) fn new(segment: Segment, asymmetric: bool) -> Consumer {
        // Relaxed: nothing was written yet; the producer starts from 0.
        segment.head().store(0, Ordering::Relaxed);
        // Relaxed: written before the descriptor was sent.
        let offered = segment.producer_barriers().load(Ordering::Relaxed) != 0;
        let barriers = if asymmetric && offered {
            Barriers::Asymmetric
        } else {
            Barriers::Symmetric
        };
        // Relaxed: the producer reads it after this side's VERDICT.
        segment.barriers_agreed().store(
            u32::from(barriers == Barriers::Asymmetric),
            Ordering::Relaxed,
        );
        Consumer {
            segment,
            head: 0,
            barriers,
        }
    }

    /// The barriers of this queue.
    pub(crate) fn barriers(&self) -> Barriers {
        self.barriers
    }

    /// Number of cells of the queue.
    pub(crate) fn cells(&self) -> u64 {
        self.segment.cells()
    }

    /// The frame at the head, if one is published; checked against the
    /// ring before anything relies on it.
    // Always inlined, as `short`: the reader's loop around them is the
    // receive path of every message, and the compiler stops inlining
    // them there once the loop handles whole packets too (87 more
    // instructions per 8-byte message read).
    #[inline(always)]
    pub(crate) fn peek(&self) -> Result<Option<Frame>, Corrupt> {
        let count = self.segment.cells();
        let index = self.head & (count - 1);
        // Acquire: pairs with the producer's release store of the control
        // word: the frame's bytes are visible once the word is.
        let word = self.segment.control(index).load(Ordering::Acquire);
        if !self.published(word) {
            return Ok(None);
        }
        let (kind, _, bytes) = parse_control_word(word);
        let bad = |what: &str| {
            Corrupt(format!(
                "{what} in control word {word:#x} at queue position {}",
                self.head
            ))
        };
        let kind = kind.ok_or_else(|| bad("unknown frame kind"))?;
        let least = match kind {
            FrameKind::Header | FrameKind::ShortHeader | FrameKind::Short => {
                kind.header_len() as u64
            }
            FrameKind::Data => 1,
        };
        let most = match kind {
            FrameKind::Short => (SHORT_FIELDS + SHORT_FRAME_PAYLOAD_MAX)
                .min((count - index) as usize * CELL - CONTROL_LEN),
            _ => (count - index) as usize * CELL - CONTROL_LEN,
        } as u64;
        if bytes < least || bytes > most {
            return Err(bad("frame length out of bounds"));
        }
        Ok(Some(Frame {
            kind,
            index,
            bytes: bytes as usize,
        }))
    }

    /// What is at the head, from one load of its control word: the
    /// frame of a short message is told apart from the rest by comparing
    /// the word's kind and position check with the ones it must carry and
    /// bounding its length, not by [`Consumer::peek`]'s decoding of every
    /// kind.
    #[inline(always)]
    pub(crate) fn look(&self) -> Head {
        let count = self.segment.cells();
        let index = self.head & (count - 1);
        // Acquire: pairs with the producer's release store of the control
        // word, as in `peek`.
        let word = self.segment.control(index).load(Ordering::Acquire);
        const KIND_AND_CHECK: u64 = (1 << 40) - 1;
        if word & KIND_AND_CHECK == control_word(FrameKind::Short, self.head, 0) {
            let bytes = (word >> 40) as usize;
            // `peek`'s bounds of a short frame: its fields, at most the
            // reader's buffer, and no further than the ring's end, which
            // a frame of one cell never passes (its bound first: it is
            // most messages').
            let most = || {
                (SHORT_FIELDS + SHORT_FRAME_PAYLOAD_MAX)
                    .min((count - index) as usize * CELL - CONTROL_LEN)
            };
            if (SHORT_FIELDS..=SHORT_FIELDS + SHORT_PAYLOAD_MAX).contains(&bytes)
                || (bytes > SHORT_FIELDS && bytes <= most())
            {
                return Head::Short(Frame {
                    kind: FrameKind::Short,
                    index,
                    bytes,
                });
            }
        }
        if self.published(word) {
            return Head::Other;
        }
        Head::Empty
    }

    /// The packet header a header frame carries.
    /// (A short header's left-out bytes are zero.)
    pub(crate) fn header(&self, frame: &Frame) -> [u8; HEADER_LEN] {
        let mut header = [0u8; HEADER_LEN];
        let len = frame.kind.header_len();
        self.segment.read_cells(
            frame.index as usize * CELL + CONTROL_LEN,
            &mut header[..len],
        );
        header
    }

    /// The packet a one-cell [`FrameKind::Short`] frame (of at most
    /// [`SHORT_PAYLOAD_MAX`] payload bytes) carries: its fields, and its
    /// payload in the first [`Frame::payload_len`] bytes of the array.
    #[inline(always)]
    pub(crate) fn short(&self, frame: &Frame) -> (ShortFields, [u8; SHORT_PAYLOAD_MAX]) {
        debug_assert!(frame.payload_len() <= SHORT_PAYLOAD_MAX);
        // Fixed-size copies of the whole cell: cheaper than ones sized by
        // the length, and the cell is the frame's (`peek` checked it).
        let fields = self.short_fields(frame);
        let mut payload = [0u8; SHORT_PAYLOAD_MAX];
        self.segment.read_cells(
            frame.index as usize * CELL + CONTROL_LEN + SHORT_FIELDS,
            &mut payload,
        );
        (fields, payload)
    }

    /// The header fields of a [`FrameKind::Short`] frame (its payload,
    /// of any length, is [`Consumer::copy_payload`]'s).
    #[inline(always)]
    pub(crate) fn short_fields(&self, frame: &Frame) -> ShortFields {
        debug_assert_eq!(frame.kind, FrameKind::Short);
        let mut fields = [0u8; SHORT_FIELDS];
        self.segment
            .read_cells(frame.index as usize * CELL + CONTROL_LEN, &mut fields);
        decode_short(&fields)
    }

    /// Copies the first `dest.len()` payload bytes of `frame` (at most
    /// [`Frame::payload_len`]) into `dest`.
    pub(crate) fn copy_payload(&self, frame: &Frame, dest: &mut [u8]) {
        debug_assert!(dest.len() <= frame.payload_len());
        self.segment.read_cells(frame.payload_offset(), dest);
    }

    /// Frees the cells of `frame`, the one [`Consumer::peek`] returned.
    pub(crate) fn advance(&mut self, frame: &Frame) {
        self.head += cells_for(frame.bytes);
        // Release: the copies out of the frame happen before the producer,
        // acquiring the head, writes the cells again.
        self.segment.head().store(self.head, Ordering::Release);
    }

    /// Whether a frame is published at the head (a look after raising the
    /// sleeping flag, and before each read of the queue), or something
    /// [`Consumer::peek`] will find corrupt there.
    #[inline]
    pub(crate) fn has_frame(&self) -> bool {
        // Relaxed: only a yes or no; `peek` reads it again with Acquire.
        let word = self.segment.control(self.head).load(Ordering::Relaxed);
        self.published(word)
    }

    /// Whether `word`, read at the head, was published there: it carries
    /// the head's position check. Anything else is what the ring's last
    /// lap left in the cell (a control word a lap behind, or payload
    /// bytes, which the producer cleared if they carried this check: see
    /// the module docs), or zero; a corrupt word that carries the check is
    /// [`Consumer::peek`]'s to find.
    #[inline(always)]
    fn published(&self, word: u64) -> bool {
        // Zero carries the check of a position that is a multiple of 2^32.
        word != 0 && check_of(word) == position_check(self.head)
    }

    /// Raises (or lowers) the flag asking the producer to poke this side
    /// after publishing. After raising it and [`before_sleeping_look`],
    /// [`Consumer::has_frame`] tells whether a frame came meanwhile.
    pub(crate) fn set_sleeping(&self, sleeping: bool) {
        // Relaxed: `before_sleeping_look` orders it before the look at
        // the head's cell.
        self.segment
            .consumer_sleeping()
            .store(u32::from(sleeping), Ordering::Relaxed);
    }

    /// Whether the producer may be asleep waiting for cells, to be poked
    /// after freeing some.
    #[inline]
    pub(crate) fn producer_waiting(&self) -> bool {
        // Between this side's head stores and its look at the flag; pairs
        // with the producer's `before_sleeping_look`.
        self.barriers.light();
        // Relaxed: the barrier orders it.
        self.segment.producer_waiting().load(Ordering::Relaxed) != 0
    }
}

/// A queue of `cells` cells from rank 0 to rank 1, for tests: its
/// producer, and its consumer over the same segment handed over a socket
/// as the transport does.
#[cfg(test)]
pub(crate) fn queue(cells: u64) -> (Producer, Consumer) {
    queue_with(cells, Barriers::Symmetric)
}

/// A queue as [`queue`] makes, with `barriers` (asymmetric ones only where
/// this process could register for them).
#[cfg(test)]
pub(crate) fn queue_with(cells: u64, barriers: Barriers) -> (Producer, Consumer) {
    use std::os::fd::OwnedFd;
    let asymmetric = barriers == Barriers::Asymmetric;
    let segment = Segment::create(0, 1, cells).unwrap();
    let mut producer = Producer::new(segment, asymmetric);
    let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
    crate::sys::send(&a, b"s", Some(producer.segment().fd())).unwrap();
    let mut fds: Vec<OwnedFd> = Vec::new();
    crate::sys::recv(&b, &mut [0u8; 1], &mut fds).unwrap();
    let theirs = Segment::open(std::fs::File::from(fds.pop().unwrap()), 0, 1).unwrap();
    let consumer = Consumer::new(theirs, asymmetric);
    producer.take_agreed_barriers();
    assert_eq!(
        (producer.barriers(), consumer.barriers()),
        (barriers, barriers)
    );
    (producer, consumer)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(tag: u8, payload_len: usize) -> [u8; HEADER_LEN] {
        let mut h = [tag; HEADER_LEN];
        h[..8].copy_from_slice(&(payload_len as u64).to_le_bytes());
        h
    }

    fn pattern(seed: usize, len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| (i * 7 + seed * 13 + i / 251) as u8)
            .collect()
    }

    /// A packet read back, as the transport reassembles one.
    #[derive(Default)]
    struct Reader {
        header: Option<[u8; HEADER_LEN]>,
        payload: Vec<u8>,
        expected: usize,
    }

    impl Reader {
        /// Consumes frames until a packet is complete or the queue is
        /// empty.
        fn read(&mut self, c: &mut Consumer) -> Option<([u8; HEADER_LEN], Vec<u8>)> {
            while let Some(frame) = c.peek().unwrap() {
                match (frame.kind, self.header) {
                    (FrameKind::Header | FrameKind::ShortHeader, None) => {
                        let h = c.header(&frame);
                        self.expected = u64::from_le_bytes(h[..8].try_into().unwrap()) as usize;
                        self.header = Some(h);
                    }
                    (FrameKind::Data, Some(_)) => {}
                    other => panic!("unexpected frame {other:?}"),
                }
                let at = self.payload.len();
                self.payload.resize(at + frame.payload_len(), 0);
                c.copy_payload(&frame, &mut self.payload[at..]);
                c.advance(&frame);
                if self.payload.len() == self.expected {
                    let h = self.header.take().unwrap();
                    return Some((h, std::mem::take(&mut self.payload)));
                }
                assert!(self.payload.len() < self.expected, "payload overran");
            }
            None
        }
    }

    #[test]
    fn packets_spanning_cells_and_wrapping_arrive_intact() {
        // 16 cells: packets of up to 2 KiB wrap the ring again and again,
        // and most of them cannot be written whole.
        let (mut p, mut c) = queue(16);
        let mut reader = Reader::default();
        for k in 0..2000usize {
            let len = (k * 37) % 2049;
            let payload = pattern(k, len);
            let h = header(k as u8, len);
            let mut sent = None;
            let mut got = None;
            while !p.push_packet(&h, &payload, &mut sent).unwrap() {
                assert!(got.is_none());
                got = reader.read(&mut c);
            }
            let (gh, gp) = got
                .or_else(|| reader.read(&mut c))
                .expect("packet complete");
            assert_eq!(gh, h, "header of packet {k}");
            assert!(gp == payload, "payload of packet {k} ({len} bytes)");
        }
        assert!(p.tail > 100 * 16, "the ring wrapped only {} cells", p.tail);
    }

    #[test]
    fn small_packets_take_two_cells_and_headers_alone_one() {
        let (mut p, mut c) = queue(64);
        assert_eq!(p.push_header(&header(1, 8), &[9; 8]).unwrap(), Some(8));
        assert_eq!(p.tail, 2);
        assert_eq!(p.push_header(&header(2, 0), &[]).unwrap(), Some(0));
        assert_eq!(p.tail, 3);
        let f = c.peek().unwrap().unwrap();
        assert_eq!((f.kind, f.payload_len()), (FrameKind::Header, 8));
        c.advance(&f);
        let f = c.peek().unwrap().unwrap();
        assert_eq!((f.kind, f.payload_len()), (FrameKind::Header, 0));
        c.advance(&f);
        assert_eq!(c.peek().unwrap(), None);
    }

    #[test]
    fn a_header_ending_in_zeros_and_8_bytes_take_one_cell() {
        let (mut p, mut c) = queue(64);
        let mut h = header(1, 8);
        h[HEADER_LEN - SHORT_HEADER_SAVING..].fill(0);
        assert_eq!(p.push_header(&h, &[9; 8]).unwrap(), Some(8));
        assert_eq!(p.tail, 1);
        // Nine bytes do not fit: the ninth goes to a second cell.
        assert_eq!(p.push_header(&h, &[7; 9]).unwrap(), Some(9));
        assert_eq!(p.tail, 3);
        let f = c.peek().unwrap().unwrap();
        assert_eq!((f.kind, f.payload_len()), (FrameKind::ShortHeader, 8));
        assert_eq!(c.header(&f), h);
        let mut payload = [0u8; 8];
        c.copy_payload(&f, &mut payload);
        assert_eq!(payload, [9; 8]);
        c.advance(&f);
        let f = c.peek().unwrap().unwrap();
        assert_eq!((f.kind, f.payload_len()), (FrameKind::ShortHeader, 9));
        c.advance(&f);
        assert_eq!(c.peek().unwrap(), None);
    }

    #[test]
    fn a_short_packet_takes_one_cell_and_a_full_queue_refuses_it() {
        use crate::proto::encode_short;
        use oxmpi_adi::proto::{Header, Kind};
        let (mut p, mut c) = queue(64);
        let header = Header {
            sequence: 4,
            context_id: 2,
            source: 1,
            tag: 7,
            message_len: SHORT_PAYLOAD_MAX as u64,
            ..Header::new(Kind::Eager)
        };
        let payload = [5u8; SHORT_PAYLOAD_MAX];
        let fields = encode_short(&header, &payload).unwrap();
        // One cell each, one kept free to clear ahead.
        for k in 0..63 {
            assert!(p.push_short(&fields, &payload).unwrap(), "short {k}");
        }
        assert_eq!(p.tail, 63);
        assert!(!p.push_short(&fields, &payload).unwrap());
        for _ in 0..63 {
            let f = c.peek().unwrap().unwrap();
            assert_eq!(
                (f.kind, f.payload_len()),
                (FrameKind::Short, SHORT_PAYLOAD_MAX)
            );
            let (fields, got) = c.short(&f);
            assert_eq!(
                Header::standard_eager(fields.sequence, fields.envelope, f.payload_len()),
                header
            );
            assert_eq!(got, payload);
            c.advance(&f);
        }
        assert_eq!(c.peek().unwrap(), None);
        assert!(p.push_short(&fields, &payload[..3]).unwrap());
        let f = c.peek().unwrap().unwrap();
        let (_, got) = c.short(&f);
        assert_eq!(
            (f.payload_len(), &got[..f.payload_len()]),
            (3, &payload[..3])
        );
    }

    #[test]
    fn a_short_frame_of_several_cells_is_whole_and_never_runs_past_the_end() {
        use oxmpi_adi::matching::Envelope;
        let (mut p, mut c) = queue(64);
        let envelope = Envelope {
            context_id: 2,
            source: 1,
            tag: 7,
        };
        let fields = crate::proto::short_fields(3, envelope);
        let payload: Vec<u8> = (0..SHORT_FRAME_PAYLOAD_MAX).map(|i| i as u8).collect();
        // 16 + 2048 bytes after the control word: 33 cells.
        assert!(p.push_short_frame(&fields, &payload).unwrap());
        assert_eq!(p.tail, 33);
        // 31 cells free: no room for another.
        assert!(!p.push_short_frame(&fields, &payload).unwrap());
        let f = c.peek().unwrap().unwrap();
        assert_eq!(
            (f.kind, f.payload_len()),
            (FrameKind::Short, SHORT_FRAME_PAYLOAD_MAX)
        );
        assert_eq!(c.short_fields(&f), decode_short(&fields));
        let mut got = vec![0; f.payload_len()];
        c.copy_payload(&f, &mut got);
        assert_eq!(got, payload);
        c.advance(&f);
        // Every cell free now, but only 31 before the ring's end.
        assert!(!p.push_short_frame(&fields, &payload).unwrap());
        assert_eq!(p.tail, 33);
        // 41 bytes: two cells, which fit.
        assert!(p.push_short_frame(&fields, &payload[..41]).unwrap());
        assert_eq!(p.tail, 35);
        let f = c.peek().unwrap().unwrap();
        assert_eq!((f.kind, f.payload_len()), (FrameKind::Short, 41));
        let mut got = [0; 41];
        c.copy_payload(&f, &mut got);
        assert_eq!(got, payload[..41]);
        c.advance(&f);
        assert_eq!(c.peek().unwrap(), None);
    }

    #[test]
    fn a_full_queue_refuses_until_the_consumer_frees_cells() {
        let (mut p, mut c) = queue(64);
        let payload = [7u8; 8];
        let mut whole = 0;
        let mut sent = None;
        while p.push_packet(&header(7, 8), &payload, &mut sent).unwrap() {
            whole += 1;
            sent = None;
            assert!(whole <= 32, "more packets than cells");
        }
        // Two cells each, one cell kept free to clear ahead: 31 whole
        // packets, and the header of the next in the last free cell.
        assert_eq!((whole, sent), (31, Some(0)));
        assert_eq!(p.push_header(&header(8, 0), &[]).unwrap(), None);
        assert_eq!(p.push_data(&payload).unwrap(), 0);
        // Freeing cells lets the producer go on, once it reads the head.
        p.set_waiting(true);
        assert!(!p.head_moved());
        let mut reader = Reader::default();
        assert!(reader.read(&mut c).is_some());
        assert!(c.producer_waiting());
        assert!(p.head_moved());
        p.set_waiting(false);
        assert!(!c.producer_waiting());
        assert!(p.push_packet(&header(7, 8), &payload, &mut sent).unwrap());
        for _ in 1..=whole {
            let (h, got) = reader.read(&mut c).expect("a packet");
            assert_eq!((h[8], got), (7, payload.to_vec()));
        }
        assert_eq!(c.peek().unwrap(), None);
    }

    #[test]
    fn a_look_tells_short_frames_from_the_rest_as_peek_judges_them() {
        use oxmpi_adi::matching::Envelope;
        let (mut p, mut c) = queue(64);
        assert_eq!(c.look(), Head::Empty);
        let fields = crate::proto::short_fields(
            1,
            Envelope {
                context_id: 0,
                source: 0,
                tag: 5,
            },
        );
        let payload = [9; SHORT_FRAME_PAYLOAD_MAX];
        for len in [0, 8, SHORT_PAYLOAD_MAX, SHORT_PAYLOAD_MAX + 1, 300] {
            if len <= SHORT_PAYLOAD_MAX {
                assert!(p.push_short(&fields, &payload[..len]).unwrap());
            } else {
                assert!(p.push_short_frame(&fields, &payload[..len]).unwrap());
            }
            let Head::Short(f) = c.look() else {
                panic!("a short frame of {len} bytes not seen as one");
            };
            assert_eq!(Some(f), c.peek().unwrap());
            c.advance(&f);
            assert_eq!(c.look(), Head::Empty);
        }
        p.push_header(&header(1, 0), &[]).unwrap();
        assert_eq!(c.look(), Head::Other);
        let f = c.peek().unwrap().unwrap();
        c.advance(&f);
        // A short frame's kind with a wrong length (too short, longer
        // than the reader's buffer, past the ring's end): left to `peek`,
        // which finds it corrupt.
        let at = c.head;
        let to_end = (64 - at % 64) as usize * CELL - CONTROL_LEN;
        for word in [
            control_word(FrameKind::Short, at, 15),
            control_word(
                FrameKind::Short,
                at,
                SHORT_FIELDS + SHORT_FRAME_PAYLOAD_MAX + 1,
            ),
            control_word(FrameKind::Short, at, to_end + 1),
        ] {
            c.segment.control(at % 64).store(word, Ordering::Relaxed);
            assert_eq!(c.look(), Head::Other, "{word:#x}");
            assert!(c.peek().is_err(), "{word:#x}");
        }
        // What the last lap left, or any word without this position's
        // check: nothing yet.
        for word in [
            control_word(FrameKind::Short, at.wrapping_sub(64), 16),
            control_word(FrameKind::Short, at + 1, 16),
            u64::MAX,
        ] {
            c.segment.control(at % 64).store(word, Ordering::Relaxed);
            assert_eq!(c.look(), Head::Empty, "{word:#x}");
            assert_eq!(c.peek(), Ok(None), "{word:#x}");
        }
    }

    #[test]
    fn one_cell_frames_leave_the_next_cell_alone_and_its_last_lap_word_waits() {
        use crate::proto::encode_short;
        use oxmpi_adi::proto::{Header, Kind};
        let (mut p, mut c) = queue(64);
        let header = Header {
            message_len: 8,
            ..Header::new(Kind::Eager)
        };
        let fields = encode_short(&header, &[3; 8]).unwrap();
        // Two laps and a bit of one-cell frames, each read at once.
        for k in 0..150u64 {
            let next = (k + 1) % 64;
            let before = c.segment.control(next).load(Ordering::Relaxed);
            assert!(p.push_short(&fields, &[3; 8]).unwrap());
            // The producer wrote nothing but its own cell: from the second
            // lap on, the next cell still holds the last lap's word.
            assert_eq!(c.segment.control(next).load(Ordering::Relaxed), before);
            if k >= 63 {
                assert_ne!(before, 0, "cell {next} in lap {}", k / 64);
            }
            let f = c.peek().unwrap().expect("the frame just published");
            c.advance(&f);
            assert!(
                !c.has_frame(),
                "a last lap's word at {next} passed for a frame"
            );
            assert_eq!(c.peek().unwrap(), None);
        }
    }

    #[test]
    fn payload_stays_in_its_cells_unless_it_carries_the_next_laps_check() {
        let (mut p, mut c) = queue(64);
        let mut reader = Reader::default();
        // A packet of three cells at 0..3: cell 1's first word is the
        // control word a frame at cell 1 would carry on the next lap
        // (position 65), cell 2's is ordinary payload.
        let mut payload = [0xee; 120];
        let forged = control_word(FrameKind::ShortHeader, 65, 48);
        payload[..8].copy_from_slice(&forged.to_le_bytes());
        let mut sent = None;
        assert!(p.push_packet(&header(1, 120), &payload, &mut sent).unwrap());
        assert_eq!(p.tail, 3);
        assert_eq!(reader.read(&mut c).unwrap().1, payload);
        for _ in 3..64 {
            p.push_header(&header(2, 0), &[]).unwrap();
            assert!(reader.read(&mut c).is_some());
        }
        // The next lap: a header at 0 clears cell 1 before it is
        // published, so the forged word never passes for a frame.
        p.push_header(&header(3, 0), &[]).unwrap();
        assert_eq!(c.segment.control(1).load(Ordering::Relaxed), 0);
        assert_eq!(reader.read(&mut c).unwrap().0[8], 3);
        assert_eq!(c.peek().unwrap(), None);
        // One at 1 leaves cell 2's payload alone: at position 66 it is
        // what the last lap left, no frame and no error.
        p.push_header(&header(4, 0), &[]).unwrap();
        let ordinary = u64::from_le_bytes([0xee; 8]);
        assert_eq!(c.segment.control(2).load(Ordering::Relaxed), ordinary);
        assert_eq!(reader.read(&mut c).unwrap().0[8], 4);
        assert_eq!(c.peek().unwrap(), None);
        assert_eq!(c.look(), Head::Empty);
        assert!(!c.has_frame());
        p.push_header(&header(5, 0), &[]).unwrap();
        assert_eq!(reader.read(&mut c).unwrap().0[8], 5);
    }

    #[test]
    fn a_last_cells_few_bytes_leave_nothing_of_the_last_lap_in_its_word() {
        let (mut p, mut c) = queue(64);
        let mut reader = Reader::default();
        let fill_the_lap = |p: &mut Producer, c: &mut Consumer, reader: &mut Reader| {
            while !p.tail.is_multiple_of(64) {
                p.push_header(&header(9, 0), &[]).unwrap();
                assert!(reader.read(c).is_some());
            }
        };
        // Lap 0: cell 1's first word is the control word of a frame at
        // cell 1 two laps on (position 129), which lap 1's check misses.
        let forged = control_word(FrameKind::ShortHeader, 129, 48);
        let mut payload = [0xee; 120];
        payload[..8].copy_from_slice(&forged.to_le_bytes());
        let mut sent = None;
        assert!(p.push_packet(&header(1, 120), &payload, &mut sent).unwrap());
        assert_eq!(reader.read(&mut c).unwrap().1, payload);
        fill_the_lap(&mut p, &mut c, &mut reader);
        // Lap 1: a frame at 0 whose one payload byte in cell 1 is the
        // forged word's first: the rest of the word is zeroed with it.
        let first = forged.to_le_bytes()[0];
        p.push_header(&header(2, 1), &[first]).unwrap();
        assert_eq!(
            c.segment.control(1).load(Ordering::Relaxed),
            u64::from(first)
        );
        assert_eq!(reader.read(&mut c).unwrap().1, [first]);
        fill_the_lap(&mut p, &mut c, &mut reader);
        // Lap 2: no frame at 1 before the producer writes one.
        p.push_header(&header(3, 0), &[]).unwrap();
        assert_eq!(reader.read(&mut c).unwrap().0[8], 3);
        assert_eq!(c.peek().unwrap(), None);
        // Four bytes with the zeros after them may carry a check too: that
        // of cell 1 on the next lap (position 257), so it is cleared.
        fill_the_lap(&mut p, &mut c, &mut reader);
        let forged = control_word(FrameKind::ShortHeader, 257, 0);
        assert!(forged < 1 << 32);
        p.push_header(&header(4, 4), &forged.to_le_bytes()[..4])
            .unwrap();
        assert_eq!(c.segment.control(1).load(Ordering::Relaxed), forged);
        assert!(reader.read(&mut c).is_some());
        fill_the_lap(&mut p, &mut c, &mut reader);
        p.push_header(&header(5, 0), &[]).unwrap();
        assert_eq!(c.segment.control(1).load(Ordering::Relaxed), 0);
        assert_eq!(reader.read(&mut c).unwrap().0[8], 5);
        assert_eq!(c.peek().unwrap(), None);
    }

    #[test]
    fn the_sleeping_flag_is_seen_by_the_producer() {
        let (mut p, c) = queue(64);
        assert!(!p.consumer_sleeping());
        c.set_sleeping(true);
        assert!(!c.has_frame());
        p.push_header(&header(1, 0), &[]).unwrap();
        assert!(p.consumer_sleeping());
        assert!(c.has_frame());
        c.set_sleeping(false);
        assert!(!p.consumer_sleeping());
    }

    #[test]
    fn queues_agree_on_asymmetric_barriers_only_where_both_sides_can() {
        let (p, c) = queue(64);
        assert_eq!(
            (p.barriers(), c.barriers()),
            (Barriers::Symmetric, Barriers::Symmetric)
        );
        // A producer that can, a consumer that cannot: symmetric.
        let segment = Segment::create(0, 1, 64).unwrap();
        let mut p = Producer::new(segment, true);
        let theirs =
            Segment::open(p.segment().fd().try_clone_to_owned().unwrap().into(), 0, 1).unwrap();
        let c = Consumer::new(theirs, false);
        p.take_agreed_barriers();
        assert_eq!(
            (p.barriers(), c.barriers()),
            (Barriers::Symmetric, Barriers::Symmetric)
        );
    }

    /// Store buffering, the race the sleep protocol must win: each round
    /// the producer publishes and looks at the sleeping flag while the
    /// consumer raises it and looks at the cell; at least one of them must
    /// see the other's store, or the consumer would sleep through the
    /// frame. The threads spin to start each round together (a round's
    /// race lasts nanoseconds), then each waits a little, varied by round,
    /// so that their stores and loads overlap in every way. (A debug
    /// build's slower code hides the race: `cargo test --release` catches
    /// a missing barrier within a few thousand rounds.)
    fn no_wake_up_is_lost(barriers: Barriers) {
        use std::sync::atomic::{AtomicBool, AtomicUsize};
        use std::sync::Arc;
        const ROUNDS: usize = 50_000;
        fn spin_until(what: impl Fn() -> bool) {
            let mut spins = 0u32;
            while !what() {
                spins += 1;
                if spins.is_multiple_of(1024) {
                    // The other thread may have no core of its own.
                    std::thread::yield_now();
                }
                std::hint::spin_loop();
            }
        }
        fn delay(round: usize) {
            for k in 0..round % 64 {
                std::hint::black_box(k);
            }
        }
        let (mut p, mut c) = queue_with(64, barriers);
        let started = Arc::new(AtomicUsize::new(0));
        let finished = Arc::new(AtomicUsize::new(0));
        let saw_sleeper = Arc::new(AtomicBool::new(false));
        let producer = {
            let (started, finished, saw_sleeper) =
                (started.clone(), finished.clone(), saw_sleeper.clone());
            std::thread::spawn(move || {
                for round in 1..=ROUNDS {
                    spin_until(|| started.load(Ordering::Acquire) == round);
                    delay(round * 7);
                    assert!(p.push_header(&header(1, 0), &[]).unwrap().is_some());
                    saw_sleeper.store(p.consumer_sleeping(), Ordering::Relaxed);
                    finished.store(round, Ordering::Release);
                }
            })
        };
        for round in 1..=ROUNDS {
            started.store(round, Ordering::Release);
            delay(round);
            c.set_sleeping(true);
            before_sleeping_look(barriers == Barriers::Asymmetric).unwrap();
            let saw_frame = c.has_frame();
            spin_until(|| finished.load(Ordering::Acquire) == round);
            assert!(
                saw_frame || saw_sleeper.load(Ordering::Relaxed),
                "round {round}: neither side saw the other ({barriers:?} barriers)"
            );
            c.set_sleeping(false);
            let f = c.peek().unwrap().expect("the round's frame");
            c.advance(&f);
        }
        producer.join().unwrap();
    }

    #[test]
    fn symmetric_barriers_lose_no_wake_up() {
        no_wake_up_is_lost(Barriers::Symmetric);
    }

    #[test]
    fn asymmetric_barriers_lose_no_wake_up() {
        if let Err(e) = crate::sys::register_for_barriers() {
            eprintln!("not tested: this kernel refuses asymmetric barriers ({e})");
            return;
        }
        no_wake_up_is_lost(Barriers::Asymmetric);
    }

    #[test]
    fn corrupt_cells_and_heads_are_errors_not_panics() {
        let (mut p, c) = queue(64);
        // Garbage carrying the position's check: an unknown kind, lengths
        // below a header's or a data frame's least.
        for word in [0xffu64, 0xffff_ff00_0000_00ff, 1 | 10 << 40, 2] {
            c.segment.control(0).store(word, Ordering::Relaxed);
            assert!(c.has_frame(), "control word {word:#x} not seen");
            assert!(c.peek().is_err(), "control word {word:#x} accepted");
        }
        // A control word the last lap left, or payload bytes there, are no
        // frame yet, nor an error.
        for word in [
            control_word(FrameKind::Short, 0u64.wrapping_sub(64), 8),
            0x1234_5600 | 1,
            u64::MAX,
        ] {
            c.segment.control(0).store(word, Ordering::Relaxed);
            assert_eq!(c.peek(), Ok(None), "control word {word:#x}");
            assert!(!c.has_frame());
        }
        // A short frame longer than the reader's buffer for it.
        c.segment.control(0).store(
            control_word(
                FrameKind::Short,
                0,
                SHORT_FIELDS + SHORT_FRAME_PAYLOAD_MAX + 1,
            ),
            Ordering::Relaxed,
        );
        assert!(c.peek().is_err());
        // A frame longer than the rest of the ring.
        c.segment
            .control(0)
            .store(control_word(FrameKind::Data, 0, 64 * 64), Ordering::Relaxed);
        assert!(c.peek().is_err());
        // A head past what was written.
        c.segment.head().store(1000, Ordering::Relaxed);
        for _ in 0..40 {
            if let Err(e) = p.push_header(&header(1, 8), &[0; 8]) {
                assert!(e.0.contains("head"), "{}", e.0);
                return;
            }
        }
        panic!("a corrupt head was never noticed");
    }

    #[test]
    fn two_threads_move_millions_of_messages_with_their_checksum() {
        const MESSAGES: u64 = 2_000_000;
        let (mut p, mut c) = queue(1024);
        let producer = std::thread::spawn(move || {
            let mut sum = 0u64;
            for i in 0..MESSAGES {
                // Mostly small, now and then one that spans many cells.
                let len = if i % 1000 == 0 {
                    3000
                } else {
                    (i % 61) as usize
                };
                let payload: Vec<u8> = (0..len).map(|k| (i as usize + k) as u8).collect();
                sum = payload
                    .iter()
                    .fold(sum.wrapping_mul(31).wrapping_add(i), |s, &b| {
                        s.wrapping_add(u64::from(b))
                    });
                let h = header(i as u8, len);
                let mut sent = None;
                while !p.push_packet(&h, &payload, &mut sent).unwrap() {
                    std::hint::spin_loop();
                }
            }
            sum
        });
        let mut sum = 0u64;
        let mut reader = Reader::default();
        let mut received = 0u64;
        while received < MESSAGES {
            match reader.read(&mut c) {
                Some((h, payload)) => {
                    assert_eq!(h[8], received as u8, "message {received} out of order");
                    sum = payload
                        .iter()
                        .fold(sum.wrapping_mul(31).wrapping_add(received), |s, &b| {
                            s.wrapping_add(u64::from(b))
                        });
                    received += 1;
                }
                None => std::hint::spin_loop(),
            }
        }
        assert_eq!(producer.join().unwrap(), sum);
        assert_eq!(c.peek().unwrap(), None);
    }
}
