//! Typed buffers as the collective algorithms take them: packed bytes and
//! their element type. A buffer whose datatype is contiguous is used in
//! place; any other is packed into a copy first ([`Input`]) or staged and
//! unpacked when the operation has finished ([`Output`]).

use crate::datatype::{Buffer, BufferMut, ElementType, Incoming, Outgoing};
use crate::Result;

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
