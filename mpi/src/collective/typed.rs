//! Typed buffers as the collective algorithms take them: packed bytes and
//! their element type. A buffer whose datatype is contiguous is used in
//! place; any other is packed into a copy first ([`Input`]) or staged and
//! unpacked when the operation has finished ([`Output`]), or, where a
//! collective moves the data a piece at a time, packed and unpacked piece
//! by piece ([`Pieces`]). The message algorithms send and receive parts
//! of a [`Pieces`] as [`Outbound`] and [`Inbound`] data: bytes, or a
//! window of the packed data that the point-to-point layer packs or
//! unpacks piece by piece as the message goes.

use super::partition::{cut_ascending, Ascending, DisjointBlocks};
use super::team::Scratch;
use crate::datatype::{
    Buffer, BufferMut, ElementType, Incoming, MutView, Outgoing, PackStream, UnpackStream, View,
};
use crate::{Error, ErrorClass, Result};
use oxmpi_adi::device::{MessageSink, MessageSource};
use std::marker::PhantomData;
use std::ops::Range;

/// The data a collective reads from a buffer.
pub(crate) struct Input<'a> {
    data: Outgoing<'a>,
    element_type: ElementType,
}

impl<'a> Input<'a> {
    /// `buf`'s data: its own bytes, or a packed copy.
    pub(crate) fn new<B: Buffer + ?Sized>(buf: &'a B) -> Result<Input<'a>> {
        let view = buf.view();
        Ok(Input {
            element_type: ElementType::of_datatype(view.datatype()),
            data: Outgoing::new(&view)?,
        })
    }

    /// The packed data.
    pub(crate) fn bytes(&self) -> &[u8] {
        self.data.bytes()
    }

    /// The type of its elements.
    pub(crate) fn element_type(&self) -> ElementType {
        self.element_type
    }
}

/// The data a collective writes into a buffer (and may read first: it
/// starts as the buffer's data). [`Output::finish`] leaves it in the
/// buffer.
pub(crate) struct Output<'a> {
    data: Incoming<'a>,
    element_type: ElementType,
}

impl<'a> Output<'a> {
    /// `buf`'s data: its own bytes, or a staged packed copy.
    pub(crate) fn new<B: BufferMut + ?Sized>(buf: &'a mut B) -> Result<Output<'a>> {
        let view = buf.view_mut();
        Ok(Output {
            element_type: ElementType::of_datatype(view.datatype()),
            data: Incoming::with_contents(view)?,
        })
    }

    /// `buf`'s data for an operation that writes every byte of it before
    /// it reads any: its own bytes, or a staging buffer that starts
    /// zeroed (the buffer's data is not packed for nothing).
    pub(crate) fn overwritten<B: BufferMut + ?Sized>(buf: &'a mut B) -> Result<Output<'a>> {
        let view = buf.view_mut();
        Ok(Output {
            element_type: ElementType::of_datatype(view.datatype()),
            data: Incoming::new(view)?,
        })
    }

    /// The packed data, to read and write.
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        self.data.device_buffer()
    }

    /// The type of its elements.
    pub(crate) fn element_type(&self) -> ElementType {
        self.element_type
    }

    /// Unpacks staged data into the buffer.
    pub(crate) fn finish(mut self) -> Result<()> {
        let len = self.bytes_mut().len();
        self.data.finish(len)
    }
}

/// A buffer a collective copies a piece at a time, without a packed copy
/// of the whole: its own bytes (contiguous data, to read and write), or
/// a stream that packs its data (to read) or unpacks into it (to write)
/// piece by piece.
pub(crate) enum Pieces<'a> {
    Bytes(&'a mut [u8]),
    Shared(&'a [u8]),
    // The streams are boxed: a `Pieces` of bytes stays small in the
    // futures of the collectives, which move it.
    Packed(Box<PackStream>, PhantomData<&'a [u8]>),
    Unpacked(Box<UnpackStream>, PhantomData<&'a mut [u8]>),
}

impl<'a> Pieces<'a> {
    /// `view`'s data to read a piece at a time: its own bytes, or a
    /// stream that packs them.
    pub(crate) fn of_view(view: &View<'a>) -> Result<Pieces<'a>> {
        let layout = view.layout()?;
        if let Some(bytes) = view.contiguous_bytes(&layout)? {
            return Ok(Pieces::Shared(bytes));
        }
        // SAFETY: the view's memory stays borrowed, unmodified, for `'a`,
        // which the stream (kept in this value) does not outlive.
        let stream = unsafe { view.pack_stream(&layout) };
        Ok(Pieces::Packed(Box::new(stream), PhantomData))
    }

    /// `view`'s data to write a piece at a time: its own bytes, or a
    /// stream that unpacks into them.
    pub(crate) fn into_view(view: MutView<'a>) -> Result<Pieces<'a>> {
        let layout = view.layout()?;
        if let Some(start) = layout.contiguous {
            return Ok(Pieces::Bytes(view.into_contiguous(start, layout.len)?));
        }
        // SAFETY: the view's memory stays borrowed exclusively for `'a`,
        // which the stream (kept in this value) does not outlive.
        let stream = unsafe { view.unpack_stream(&layout) };
        Ok(Pieces::Unpacked(Box::new(stream), PhantomData))
    }

    /// `buf`'s data to read a piece at a time, and the type of its
    /// elements.
    pub(crate) fn of_buffer<B: Buffer + ?Sized>(buf: &'a B) -> Result<(Pieces<'a>, ElementType)> {
        let view = buf.view();
        let element_type = ElementType::of_datatype(view.datatype());
        Ok((Pieces::of_view(&view)?, element_type))
    }

    /// `buf`'s data to write (and read: it starts as the buffer's data) a
    /// piece at a time, and the type of its elements.
    pub(crate) fn into_buffer<B: BufferMut + ?Sized>(
        buf: &'a mut B,
    ) -> Result<(Pieces<'a>, ElementType)> {
        let view = buf.view_mut();
        let element_type = ElementType::of_datatype(view.datatype());
        Ok((Pieces::into_view(view)?, element_type))
    }

    /// Bytes of the packed data.
    pub(crate) fn len(&self) -> usize {
        match self {
            Pieces::Bytes(bytes) => bytes.len(),
            Pieces::Shared(bytes) => bytes.len(),
            Pieces::Packed(stream, _) => stream.len(),
            Pieces::Unpacked(stream, _) => stream.capacity(),
        }
    }

    /// The data's own bytes, if it is contiguous.
    pub(crate) fn bytes(&self) -> Option<&[u8]> {
        match self {
            Pieces::Bytes(bytes) => Some(bytes),
            Pieces::Shared(bytes) => Some(bytes),
            _ => None,
        }
    }

    /// The data's own bytes to write, if it is contiguous and writable.
    pub(crate) fn bytes_mut(&mut self) -> Option<&mut [u8]> {
        match self {
            Pieces::Bytes(bytes) => Some(bytes),
            _ => None,
        }
    }

    /// Copies the packed data's bytes from `offset` into `out` (also of
    /// data to write, which holds the buffer's data until written).
    pub(crate) fn read(&mut self, offset: usize, out: &mut [u8]) -> Result<()> {
        match self {
            Pieces::Bytes(bytes) => {
                out.copy_from_slice(piece(bytes, offset, out.len())?);
                Ok(())
            }
            Pieces::Shared(bytes) => {
                out.copy_from_slice(piece(bytes, offset, out.len())?);
                Ok(())
            }
            Pieces::Packed(stream, _) => stream.pack(offset, out),
            Pieces::Unpacked(stream, _) => {
                // SAFETY: the memory stays borrowed exclusively for as
                // long as `self`, and nothing unpacks into it while this
                // packer (dropped here) reads it.
                let mut packer = unsafe { stream.packer() };
                packer.pack(offset, out)
            }
        }
    }

    /// Copies `data` into the packed data's bytes from `offset`.
    pub(crate) fn write(&mut self, offset: usize, data: &[u8]) -> Result<()> {
        match self {
            Pieces::Bytes(bytes) => {
                let len = bytes.len();
                bytes
                    .get_mut(offset..offset + data.len())
                    .ok_or_else(|| beyond(offset, data.len(), len))?
                    .copy_from_slice(data);
                Ok(())
            }
            Pieces::Unpacked(stream, _) => stream.unpack(offset, data),
            Pieces::Shared(_) | Pieces::Packed(..) => Err(wrong_way("written")),
        }
    }
}

impl Pieces<'_> {
    /// The packed bytes `range` to send: the data's own bytes, or a
    /// window the device packs piece by piece.
    pub(crate) fn outbound(&self, range: Range<usize>) -> Result<Outbound<'_>> {
        let len = self.len();
        let out_of_range = || beyond(range.start, range.len(), len);
        match self {
            Pieces::Bytes(bytes) => bytes.get(range.clone()).map(Outbound::Bytes),
            Pieces::Shared(bytes) => bytes.get(range.clone()).map(Outbound::Bytes),
            Pieces::Packed(stream, _) => (range.end <= len).then(|| {
                // SAFETY: the memory stays borrowed, unmodified, for as
                // long as `self`, which the outbound data borrows.
                let stream = unsafe { stream.restarted() };
                Outbound::Packed(Window::of(stream, range.clone()), PhantomData)
            }),
            Pieces::Unpacked(stream, _) => (range.end <= len).then(|| {
                // SAFETY: the memory stays borrowed for as long as `self`,
                // which the outbound data borrows; nothing unpacks into it
                // meanwhile, as that needs `self` exclusively.
                let stream = unsafe { stream.packer() };
                Outbound::Packed(Window::of(stream, range.clone()), PhantomData)
            }),
        }
        .ok_or_else(out_of_range)
    }

    /// The packed bytes of each of `parts` to send, in order.
    pub(crate) fn outbound_blocks(&self, parts: &[Range<usize>]) -> Result<Vec<Outbound<'_>>> {
        parts
            .iter()
            .map(|part| self.outbound(part.clone()))
            .collect()
    }

    /// The packed bytes `range` to receive into: the data's own bytes,
    /// or a window the device unpacks piece by piece.
    pub(crate) fn inbound(&mut self, range: Range<usize>) -> Result<Inbound<'_>> {
        let len = self.len();
        match self {
            Pieces::Bytes(bytes) => bytes
                .get_mut(range.clone())
                .map(Inbound::Bytes)
                .ok_or_else(|| beyond(range.start, range.len(), len)),
            Pieces::Unpacked(stream, _) => {
                if range.end > len {
                    return Err(beyond(range.start, range.len(), len));
                }
                // SAFETY: the memory stays borrowed exclusively for as
                // long as `self`, which the inbound data borrows
                // exclusively: no other stream uses it meanwhile.
                let stream = unsafe { stream.restarted() };
                Ok(Inbound::Unpacked(Window::of(stream, range), PhantomData))
            }
            Pieces::Shared(_) | Pieces::Packed(..) => Err(wrong_way("written")),
        }
    }

    /// The packed bytes of each of `blocks` to receive into at once, by
    /// block index.
    pub(crate) fn inbound_blocks(
        &mut self,
        blocks: DisjointBlocks<'_>,
    ) -> Result<Vec<Inbound<'_>>> {
        let len = self.len();
        if let Some(bad) = blocks.parts().iter().find(|part| part.end > len) {
            return Err(beyond(bad.start, bad.len(), len));
        }
        match self {
            Pieces::Bytes(bytes) => blocks.split(bytes),
            Pieces::Unpacked(stream, _) => Ok(blocks
                .parts()
                .iter()
                .map(|part| {
                    // SAFETY: the memory stays borrowed exclusively for as
                    // long as `self`, which the inbound data borrows
                    // exclusively; each stream unpacks into its own block,
                    // and the blocks do not overlap.
                    let stream = unsafe { stream.restarted() };
                    Inbound::Unpacked(Window::of(stream, part.clone()), PhantomData)
                })
                .collect()),
            Pieces::Shared(_) | Pieces::Packed(..) => Err(wrong_way("written")),
        }
    }

    /// The packed bytes of each of `parts` to receive into at once, each
    /// with its key, in their order: ascending, without overlapping (else
    /// `MPI_ERR_INTERN`), so that no sorting or checking of the user's
    /// blocks is needed, as it is in [`Pieces::inbound_blocks`].
    pub(crate) fn inbound_ascending<K>(
        &mut self,
        parts: impl Iterator<Item = (K, Range<usize>)>,
    ) -> Result<Vec<(K, Inbound<'_>)>> {
        let len = self.len();
        match self {
            Pieces::Bytes(bytes) => cut_ascending(bytes, parts)
                .map(|cut| cut.map(|(key, piece)| (key, Inbound::Bytes(piece))))
                .collect(),
            Pieces::Unpacked(stream, _) => {
                let mut order = Ascending::within(len);
                parts
                    .map(|(key, part)| {
                        order.next(&part)?;
                        // SAFETY: the memory stays borrowed exclusively for
                        // as long as `self`, which the inbound data
                        // borrows exclusively; each stream unpacks into
                        // its own block, and `order` saw that the blocks
                        // do not overlap.
                        let stream = unsafe { stream.restarted() };
                        Ok((
                            key,
                            Inbound::Unpacked(Window::of(stream, part), PhantomData),
                        ))
                    })
                    .collect()
            }
            Pieces::Shared(_) | Pieces::Packed(..) => Err(wrong_way("written")),
        }
    }

    /// The packed bytes `read` to send and `write` to receive into at
    /// once; the two must not overlap unless one is empty.
    pub(crate) fn read_and_write(
        &mut self,
        read: Range<usize>,
        write: Range<usize>,
    ) -> Result<(Outbound<'_>, Inbound<'_>)> {
        let (mut sends, mut recvs) = self.read_and_write_runs(&[read], &[write])?;
        Ok((sends.remove(0), recvs.remove(0)))
    }

    /// The packed bytes of each of `reads` to send and of each of
    /// `writes` to receive into, at once, in order; no two of them may
    /// overlap unless one is empty.
    pub(crate) fn read_and_write_runs(
        &mut self,
        reads: &[Range<usize>],
        writes: &[Range<usize>],
    ) -> Result<(Vec<Outbound<'_>>, Vec<Inbound<'_>>)> {
        let len = self.len();
        if let Some(bad) = reads.iter().chain(writes).find(|run| run.end > len) {
            return Err(beyond(bad.start, bad.len(), len));
        }
        // Every run that is not empty, by its start (reads first, then
        // writes, by index), each apart from the next.
        let mut runs: Vec<(usize, Range<usize>)> = reads
            .iter()
            .chain(writes)
            .cloned()
            .enumerate()
            .filter(|(_, run)| !run.is_empty())
            .collect();
        runs.sort_by_key(|(_, run)| run.start);
        if let Some(pair) = runs.windows(2).find(|pair| pair[0].1.end > pair[1].1.start) {
            return Err(Error::new(
                ErrorClass::Intern,
                format!(
                    "a collective step uses {:?} and {:?} of one buffer at once",
                    pair[0].1, pair[1].1
                ),
            ));
        }
        let mut sends: Vec<Outbound<'_>> = reads.iter().map(|_| Outbound::default()).collect();
        let mut recvs: Vec<Inbound<'_>> = writes.iter().map(|_| Inbound::default()).collect();
        match self {
            Pieces::Bytes(bytes) => {
                let (mut rest, mut at) = (&mut bytes[..], 0);
                for (index, run) in runs {
                    let (part, tail) =
                        std::mem::take(&mut rest)[run.start - at..].split_at_mut(run.len());
                    (rest, at) = (tail, run.end);
                    match index.checked_sub(reads.len()) {
                        None => sends[index] = Outbound::Bytes(part),
                        Some(write) => recvs[write] = Inbound::Bytes(part),
                    }
                }
            }
            Pieces::Unpacked(stream, _) => {
                for (index, run) in runs {
                    match index.checked_sub(reads.len()) {
                        None => {
                            // SAFETY: the memory stays borrowed exclusively
                            // for as long as `self`, which every window
                            // borrows; packers read only their runs and
                            // unpackers write only theirs, none of which
                            // overlap.
                            let packer = unsafe { stream.packer() };
                            sends[index] = Outbound::Packed(Window::of(packer, run), PhantomData);
                        }
                        Some(write) => {
                            // SAFETY: as for the packers above.
                            let unpacker = unsafe { stream.restarted() };
                            recvs[write] =
                                Inbound::Unpacked(Window::of(unpacker, run), PhantomData);
                        }
                    }
                }
            }
            Pieces::Shared(_) | Pieces::Packed(..) => return Err(wrong_way("written")),
        }
        Ok((sends, recvs))
    }
}

/// The buffers of an all-to-all-w, one message each: each of `send` to
/// read and each of `recv` to write a piece at a time (see
/// [`whole_messages`]), none packed whole.
pub(crate) fn pieces_of_each<'a>(
    send: &[&'a dyn Buffer],
    recv: &'a mut [&mut dyn BufferMut],
) -> Result<(Vec<Pieces<'a>>, Vec<Pieces<'a>>)> {
    let inputs = send
        .iter()
        .map(|&buf| Pieces::of_view(&buf.view()))
        .collect::<Result<_>>()?;
    let outputs = recv
        .iter_mut()
        .map(|buf| Pieces::into_view(buf.view_mut()))
        .collect::<Result<_>>()?;
    Ok((inputs, outputs))
}

/// The whole data of each of `send` to send and of each of `recv` to
/// receive into, one message each, which the point-to-point layer packs
/// or unpacks piece by piece where the data is not contiguous.
pub(crate) fn whole_messages<'s>(
    send: &'s [Pieces<'_>],
    recv: &'s mut [Pieces<'_>],
) -> Result<(Vec<Outbound<'s>>, Vec<Inbound<'s>>)> {
    let sends = send
        .iter()
        .map(|pieces| pieces.outbound(0..pieces.len()))
        .collect::<Result<_>>()?;
    let recvs = recv
        .iter_mut()
        .map(|pieces| pieces.inbound(0..pieces.len()))
        .collect::<Result<_>>()?;
    Ok((sends, recvs))
}

/// The data of a reduction, worked on one segment (a range of whole
/// elements of the packed data) at a time: each segment starts as the
/// input's data (in place, the output's) and its result goes to the
/// output (none at a reduce's non-roots). A segment is the output's own
/// bytes where the output is contiguous, else a scratch of one segment,
/// which the input is packed into and the output unpacked from: no copy
/// of the whole.
pub(crate) struct Segments<'a> {
    input: Option<Pieces<'a>>,
    output: Option<Pieces<'a>>,
    scratch: Scratch,
    len: usize,
}

impl<'a> Segments<'a> {
    /// A reduction of `input` into `output`: in place without an input,
    /// to nowhere without an output (one of the two is needed). Their
    /// lengths are equal (the caller checks them against each other).
    pub(crate) fn new(
        input: Option<Pieces<'a>>,
        output: Option<Pieces<'a>>,
    ) -> Result<Segments<'a>> {
        let len = match (&input, &output) {
            (Some(input), Some(output)) if input.len() != output.len() => {
                return Err(Error::new(
                    ErrorClass::Intern,
                    format!("a reduction of {} bytes into {}", input.len(), output.len()),
                ))
            }
            (Some(data), _) | (None, Some(data)) => data.len(),
            (None, None) => return Err(wrong_way("reduced without data")),
        };
        Ok(Segments {
            input,
            output,
            scratch: Scratch::zeroed(0),
            len,
        })
    }

    /// Bytes of packed data.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The segments of at most `segment` bytes (at least one element of
    /// `element` bytes), in order; one empty segment where there is no
    /// data, so that a process that passed a count of 0 still meets the
    /// others' messages (and fails where their counts differ).
    /// (An iterator that does not borrow the data: no allocation on the
    /// path of every short reduction.)
    pub(crate) fn ranges(
        &self,
        segment: usize,
        element: usize,
    ) -> impl Iterator<Item = Range<usize>> + use<> {
        segment_ranges(self.len, segment, element, false)
    }

    /// [`Segments::ranges`] whose last segment is always shorter than a
    /// whole one (empty where the data is a whole number of segments),
    /// for algorithms run a segment at a time without first agreeing on
    /// the length (the scans): a process with fewer segments than a
    /// partner ends on a segment whose length differs from the partner's
    /// there, which both see, instead of leaving the partner waiting
    /// unawares for segments that never come.
    pub(crate) fn ranges_ending_short(
        &self,
        segment: usize,
        element: usize,
    ) -> impl Iterator<Item = Range<usize>> + use<> {
        segment_ranges(self.len, segment, element, true)
    }

    /// The input's bytes (`None` in place) and the output's, where both
    /// are contiguous (and there is an output): for reductions that move
    /// data between the processes' buffers themselves.
    pub(crate) fn contiguous(&mut self) -> Option<(Option<&[u8]>, &mut [u8])> {
        let output = self.output.as_mut()?.bytes_mut()?;
        match &self.input {
            None => Some((None, output)),
            Some(input) => Some((Some(input.bytes()?), output)),
        }
    }

    /// Runs `reduce` on each of `segments` in turn (each loaded: see
    /// [`Segments::load`]) and leaves its result in the output.
    pub(crate) async fn each(
        &mut self,
        segments: impl Iterator<Item = Range<usize>>,
        mut reduce: impl AsyncFnMut(&mut [u8]) -> Result<()>,
    ) -> Result<()> {
        for segment in segments {
            reduce(self.load(segment.clone())?).await?;
            self.store(segment)?;
        }
        Ok(())
    }

    /// Segment `range`, holding the input's data, to reduce in place;
    /// [`Segments::store`] then leaves the result in the output.
    pub(crate) fn load(&mut self, range: Range<usize>) -> Result<&mut [u8]> {
        let Segments {
            input,
            output,
            scratch,
            len,
        } = self;
        if range.end > *len {
            return Err(beyond(range.start, range.len(), *len));
        }
        if let Some(Pieces::Bytes(bytes)) = output {
            let segment = &mut bytes[range.clone()];
            if let Some(input) = input {
                input.read(range.start, segment)?;
            }
            Ok(segment)
        } else {
            if scratch.bytes().len() < range.len() {
                *scratch = Scratch::zeroed(range.len());
            }
            let segment = &mut scratch.bytes_mut()[..range.len()];
            match (input, output) {
                (Some(data), _) | (None, Some(data)) => data.read(range.start, segment)?,
                (None, None) => return Err(wrong_way("reduced without data")),
            }
            Ok(segment)
        }
    }

    /// Leaves the result of segment `range` (as [`Segments::load`] gave
    /// it) in the output.
    pub(crate) fn store(&mut self, range: Range<usize>) -> Result<()> {
        match &mut self.output {
            Some(output) if output.bytes().is_none() => {
                output.write(range.start, &self.scratch.bytes()[..range.len()])
            }
            _ => Ok(()),
        }
    }
}

/// The length of a segment of at most `segment` bytes, whole elements of
/// `element` bytes (at least one).
pub(crate) fn segment_step(segment: usize, element: usize) -> usize {
    (segment / element.max(1)).max(1) * element.max(1)
}

/// The segments of `len` bytes of data: runs of at most `segment` bytes
/// (at least one element of `element` bytes) in order, at least one; the
/// last shorter than a whole segment if `ending_short` (see
/// [`Segments::ranges_ending_short`]).
pub(crate) fn segment_ranges(
    len: usize,
    segment: usize,
    element: usize,
    ending_short: bool,
) -> impl Iterator<Item = Range<usize>> + use<> {
    let step = segment_step(segment, element);
    let count = if ending_short {
        len / step + 1
    } else {
        len.div_ceil(step).max(1)
    };
    (0..count).map(move |k| (k * step).min(len)..((k + 1) * step).min(len))
}

/// Bytes `start..start + len` of a stream's packed data, as the source or
/// sink of a message of their own.
pub(crate) struct Window<S> {
    stream: S,
    start: usize,
    len: usize,
}

impl<S> Window<S> {
    fn of(stream: S, range: Range<usize>) -> Window<S> {
        Window {
            stream,
            start: range.start,
            len: range.len(),
        }
    }

    /// The stream's offset of the window's `len` bytes from `offset`, or
    /// the error of a piece beyond the window.
    fn at(&self, offset: usize, len: usize) -> Result<usize> {
        if offset + len > self.len {
            return Err(beyond(offset, len, self.len));
        }
        Ok(self.start + offset)
    }
}

impl MessageSource for Window<PackStream> {
    fn len(&self) -> usize {
        self.len
    }

    fn pack(&mut self, offset: usize, out: &mut [u8]) -> Result<()> {
        let at = self.at(offset, out.len())?;
        self.stream.pack(at, out)
    }
}

impl MessageSink for Window<UnpackStream> {
    fn capacity(&self) -> usize {
        self.len
    }

    fn unpack(&mut self, offset: usize, bytes: &[u8]) -> Result<()> {
        let at = self.at(offset, bytes.len())?;
        self.stream.unpack(at, bytes)
    }
}

/// Data one message of a collective sends: bytes, or a window of a
/// buffer's packed data that the device packs piece by piece.
pub(crate) enum Outbound<'a> {
    Bytes(&'a [u8]),
    Packed(Window<PackStream>, PhantomData<&'a [u8]>),
}

/// Where one message of a collective lands: bytes, or a window of a
/// buffer's packed data that the device unpacks into piece by piece.
pub(crate) enum Inbound<'a> {
    Bytes(&'a mut [u8]),
    Unpacked(Window<UnpackStream>, PhantomData<&'a mut [u8]>),
}

impl Default for Outbound<'_> {
    /// No data.
    fn default() -> Self {
        Outbound::Bytes(&[])
    }
}

impl Default for Inbound<'_> {
    /// Room for no data.
    fn default() -> Self {
        Inbound::Bytes(&mut [])
    }
}

impl<'a> From<&'a [u8]> for Outbound<'a> {
    fn from(bytes: &'a [u8]) -> Self {
        Outbound::Bytes(bytes)
    }
}

impl<'a> From<&'a mut [u8]> for Inbound<'a> {
    fn from(bytes: &'a mut [u8]) -> Self {
        Inbound::Bytes(bytes)
    }
}

/// The most bytes [`copy_across`] stages at once.
const COPY_PIECE: usize = 64 << 10;

impl Outbound<'_> {
    /// Bytes of data.
    pub(crate) fn len(&self) -> usize {
        match self {
            Outbound::Bytes(bytes) => bytes.len(),
            Outbound::Packed(window, _) => window.len,
        }
    }
}

impl Inbound<'_> {
    /// Bytes of room.
    pub(crate) fn len(&self) -> usize {
        match self {
            Inbound::Bytes(bytes) => bytes.len(),
            Inbound::Unpacked(window, _) => window.len,
        }
    }
}

/// Copies the first `len` bytes of `from` into `to` (both at least that
/// long): at once between bytes, else through a scratch piece of at most
/// [`COPY_PIECE`] bytes at a time, never a copy of the whole.
pub(crate) fn copy_across(from: &mut Outbound<'_>, to: &mut Inbound<'_>, len: usize) -> Result<()> {
    if len > from.len() || len > to.len() {
        return Err(beyond(0, len, from.len().min(to.len())));
    }
    if let (Outbound::Bytes(from), Inbound::Bytes(to)) = (&*from, &mut *to) {
        to[..len].copy_from_slice(&from[..len]);
        return Ok(());
    }
    let mut scratch = vec![0u8; len.min(COPY_PIECE)];
    let mut offset = 0;
    while offset < len {
        let piece = &mut scratch[..(len - offset).min(COPY_PIECE)];
        match from {
            Outbound::Bytes(bytes) => piece.copy_from_slice(&bytes[offset..offset + piece.len()]),
            Outbound::Packed(window, _) => window.pack(offset, piece)?,
        }
        match to {
            Inbound::Bytes(bytes) => bytes[offset..offset + piece.len()].copy_from_slice(piece),
            Inbound::Unpacked(window, _) => window.unpack(offset, piece)?,
        }
        offset += piece.len();
    }
    Ok(())
}

/// `len` bytes of `bytes` from `offset`, or the error of a piece beyond.
fn piece(bytes: &[u8], offset: usize, len: usize) -> Result<&[u8]> {
    bytes
        .get(offset..offset + len)
        .ok_or_else(|| beyond(offset, len, bytes.len()))
}

fn beyond(offset: usize, len: usize, total: usize) -> Error {
    Error::new(
        ErrorClass::Intern,
        format!("{len} bytes at {offset} lie beyond the {total} bytes of a collective's buffer"),
    )
}

fn wrong_way(what: &str) -> Error {
    Error::new(
        ErrorClass::Intern,
        format!("a collective's buffer was {what} the wrong way"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ranges(len: usize, segment: usize, element: usize, short: bool) -> Vec<Range<usize>> {
        segment_ranges(len, segment, element, short).collect()
    }

    #[test]
    fn segments_cover_the_data_and_may_end_short() {
        // One empty segment where there is no data.
        for short in [false, true] {
            let empty = ranges(0, 8, 8, short);
            assert!(empty.len() == 1 && empty[0].is_empty(), "{empty:?}");
        }
        assert_eq!(ranges(16, 8, 8, false), [0..8, 8..16]);
        assert_eq!(ranges(16, 8, 8, true), [0..8, 8..16, 16..16]);
        assert_eq!(ranges(20, 10, 4, true), [0..8, 8..16, 16..20]);
        // At least one element a segment.
        assert_eq!(ranges(24, 4, 12, false), [0..12, 12..24]);
    }

    #[test]
    fn runs_to_read_and_write_at_once_must_not_overlap() {
        let mut data: Vec<u8> = (0..8).collect();
        let mut pieces = Pieces::Bytes(&mut data);
        let (sends, mut recvs) = pieces
            .read_and_write_runs(&[6..8, 0..2, 3..3], std::slice::from_ref(&(2..4)))
            .unwrap();
        let sent: Vec<Vec<u8>> = sends
            .iter()
            .map(|send| match send {
                Outbound::Bytes(bytes) => bytes.to_vec(),
                Outbound::Packed(..) => panic!("bytes are sent as they lie"),
            })
            .collect();
        assert_eq!(sent, [vec![6, 7], vec![0, 1], vec![]]);
        match &mut recvs[0] {
            Inbound::Bytes(bytes) => bytes.copy_from_slice(&[9, 9]),
            Inbound::Unpacked(..) => panic!("bytes are received where they go"),
        }
        drop((sends, recvs));
        assert_eq!(data, [0, 1, 9, 9, 4, 5, 6, 7]);
        let mut pieces = Pieces::Bytes(&mut data);
        let overlap = pieces
            .read_and_write_runs(&[0..4, 4..4], &[3..5, 5..5])
            .err();
        assert_eq!(overlap.map(|e| e.class()), Some(ErrorClass::Intern));
    }
}
