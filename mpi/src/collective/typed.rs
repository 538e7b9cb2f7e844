//! Typed buffers as the collective algorithms take them: packed bytes and
//! their element type. A buffer whose datatype is contiguous is used in
//! place; any other is packed into a copy first ([`Input`]) or staged and
//! unpacked when the operation has finished ([`Output`]), or, where a
//! collective moves the data a piece at a time, packed and unpacked piece
//! by piece ([`Pieces`]).

use crate::datatype::{
    Buffer, BufferMut, ElementType, Incoming, MutView, Outgoing, PackStream, UnpackStream, View,
};
use crate::{Error, ErrorClass, Result};
use oxmpi_adi::device::{MessageSink, MessageSource};
use std::marker::PhantomData;

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
    Packed(PackStream, PhantomData<&'a [u8]>),
    Unpacked(UnpackStream, PhantomData<&'a mut [u8]>),
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
        Ok(Pieces::Packed(stream, PhantomData))
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
        Ok(Pieces::Unpacked(stream, PhantomData))
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

    /// Copies the packed data's bytes from `offset` into `out`.
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
            Pieces::Unpacked(..) => Err(wrong_way("read")),
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
