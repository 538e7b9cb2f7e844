//! Message buffers: memory described by a datatype and a count.
//!
//! [`View`] (to read) and [`MutView`] (to write) are what every operation
//! that moves typed data works with: where the buffer starts, how many
//! bytes it has, its datatype and how many elements of it. [`Buffer`] and
//! [`BufferMut`] give a value's view; values, slices, arrays and vectors
//! of [`Equivalence`] types have one, and
//! [`View::with_count_and_datatype`] describes a buffer by any committed
//! datatype.
//!
//! This module owns every access to the memory of a buffer (the only
//! `unsafe` code of datatypes). Each access is checked against the
//! buffer's length on its own, so no datatype, however wrong, reaches
//! outside the buffer; and [`Layout`] checks a whole view before anything
//! is copied, so a bad one is an error before any byte moves.

use super::constructors::count_arg;
use super::typemap::Cursor;
use super::{Count, Datatype, DatatypeRef, Equivalence, Handle, OwnedHandle};
use crate::{Error, ErrorClass, Result};
use oxmpi_adi::device::{MessageSink, MessageSource};
use std::fmt;
use std::marker::PhantomData;

/// Something that can be sent: its memory, datatype and count.
pub trait Buffer {
    /// The buffer as a [`View`].
    fn view(&self) -> View<'_>;
}

/// Something that can be received into.
pub trait BufferMut {
    /// The buffer as a [`MutView`].
    fn view_mut(&mut self) -> MutView<'_>;
}

/// A buffer to read: `count` elements of a datatype in memory borrowed
/// for `'a` (rsmpi's `View`).
///
/// Invariant: `base..base + span` is memory borrowed (shared) for `'a`,
/// and every byte of it that the datatype names for `count` elements is
/// initialized.
#[derive(Clone, Copy)]
pub struct View<'a> {
    base: *const u8,
    span: usize,
    datatype: Handle<'a>,
    count: usize,
    _memory: PhantomData<&'a [u8]>,
}

// SAFETY: a view is a shared borrow of `Sync` data (`Equivalence` values,
// and a datatype), like `&'a [T]`.
unsafe impl Send for View<'_> {}
// SAFETY: as above.
unsafe impl Sync for View<'_> {}

/// A buffer to write: `count` elements of a datatype in memory borrowed
/// exclusively for `'a` (rsmpi's `MutView`).
///
/// Invariant: as [`View`]'s, with the memory borrowed exclusively; and
/// any bytes written where the datatype names leave valid values.
pub struct MutView<'a> {
    base: *mut u8,
    span: usize,
    datatype: Handle<'a>,
    count: usize,
    _memory: PhantomData<&'a mut [u8]>,
}

// SAFETY: a mutable view is an exclusive borrow of `Send` data, like
// `&'a mut [T]`.
unsafe impl Send for MutView<'_> {}
// SAFETY: shared access to a mutable view only reads (`as_view`).
unsafe impl Sync for MutView<'_> {}

/// Where a view's data lies, checked: `len` bytes of data (packed), and,
/// when they are one range of the buffer in type-map order, where that
/// range starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    pub len: usize,
    pub contiguous: Option<usize>,
}

/// Checks `count` elements of `datatype` against a buffer of `span`
/// bytes: every byte the datatype names must lie in the buffer.
///
/// Inline, for its first test: elements of a primitive type (a slice of
/// numbers, the common case) are their buffer's first bytes, without
/// gaps, which is what the general computation finds, for less; that
/// answer is then a few instructions in the caller, not a call.
#[inline]
fn layout(span: usize, datatype: Handle<'_>, count: usize) -> Result<Layout> {
    if let Handle::Primitive(p) = datatype {
        if let Some(len) = count.checked_mul(p.size()).filter(|&len| len <= span) {
            return Ok(Layout {
                len,
                contiguous: Some(0),
            });
        }
    }
    general_layout(span, datatype, count)
}

/// [`layout`] of any datatype.
fn general_layout(span: usize, datatype: Handle<'_>, count: usize) -> Result<Layout> {
    let shape = datatype.shape();
    let len = count.checked_mul(shape.size).ok_or_else(|| {
        Error::new(
            ErrorClass::Count,
            format!(
                "{count} elements of {} bytes are more bytes than an address can count",
                shape.size
            ),
        )
    })?;
    let Some((lo, hi)) = shape.data.filter(|_| len > 0) else {
        return Ok(Layout {
            len: 0,
            contiguous: Some(0),
        });
    };
    let last = (count as i128 - 1) * shape.extent() as i128;
    let (first, end) = (lo as i128 + last.min(0), hi as i128 + last.max(0));
    if first < 0 || end > span as i128 {
        return Err(Error::new(
            ErrorClass::Buffer,
            format!(
                "{count} elements of this datatype (extent {}, data from byte {lo} to {hi}) \
                 reach bytes {first}..{end} of a buffer of {span} bytes",
                shape.extent()
            ),
        ));
    }
    Ok(Layout {
        len,
        contiguous: datatype
            .contiguous_start(count)
            .and_then(|start| usize::try_from(start).ok()),
    })
}

/// The error for a segment outside the buffer after the view was checked:
/// a flaw in oxmpi's type maps, caught before the access.
fn outside(offset: isize, len: usize, span: usize) -> Error {
    Error::new(
        ErrorClass::Intern,
        format!(
            "a datatype segment of {len} bytes at {offset} falls outside the buffer of {span} \
             bytes it was checked against"
        ),
    )
}

/// `offset..offset + len` as a range of a buffer of `span` bytes, if it
/// lies in it.
fn range(offset: isize, len: usize, span: usize) -> Option<usize> {
    let start = usize::try_from(offset).ok()?;
    (start.checked_add(len)? <= span).then_some(start)
}

impl<'a> View<'a> {
    fn of_slice<T: Equivalence>(values: &'a [T]) -> View<'a> {
        View {
            base: values.as_ptr().cast(),
            span: std::mem::size_of_val(values),
            datatype: T::equivalent_datatype().0,
            count: values.len(),
            _memory: PhantomData,
        }
    }

    /// Describes `buffer` as `count` elements of `datatype` from its first
    /// byte (rsmpi's `View::with_count_and_datatype`; MPI's buffer,
    /// count and datatype arguments). Unlike rsmpi's, it is safe: it
    /// checks, now, that every byte the datatype names lies in `buffer`.
    ///
    /// `buffer` must be plain: its own datatype must cover every byte of
    /// it (numbers, or structs without padding), because `datatype` may
    /// name any of them. Errors: a negative count (`MPI_ERR_COUNT`); a
    /// buffer with padding, or one too small for what the datatype names
    /// (`MPI_ERR_BUFFER`).
    pub fn with_count_and_datatype<B, D>(
        buffer: &'a B,
        count: Count,
        datatype: &'a D,
    ) -> Result<View<'a>>
    where
        B: Buffer + ?Sized,
        D: Datatype + ?Sized,
    {
        let whole = buffer.view();
        check_plain(whole.layout()?, whole.span)?;
        let view = View {
            datatype: datatype.as_datatype_ref().0,
            count: count_arg("count", count)?,
            ..whole
        };
        view.layout()?;
        Ok(view)
    }

    /// Checks the view; see [`Layout`].
    #[inline]
    pub(crate) fn layout(&self) -> Result<Layout> {
        layout(self.span, self.datatype, self.count)
    }

    /// The datatype of the view's elements.
    #[inline]
    pub(crate) fn datatype(&self) -> Handle<'a> {
        self.datatype
    }

    /// The number of elements.
    pub(crate) fn count(&self) -> usize {
        self.count
    }

    #[inline]
    fn bytes_at(&self, offset: isize, len: usize) -> Result<&'a [u8]> {
        let start = range(offset, len, self.span).ok_or_else(|| outside(offset, len, self.span))?;
        // SAFETY: `start..start + len` lies in the memory the view borrows
        // for `'a` (`range`), and the datatype names these bytes, which
        // are initialized (the view's invariant).
        Ok(unsafe { std::slice::from_raw_parts(self.base.add(start), len) })
    }

    /// The data itself when it is contiguous (`layout.contiguous`).
    #[inline]
    pub(crate) fn contiguous_bytes(&self, layout: &Layout) -> Result<Option<&'a [u8]>> {
        layout
            .contiguous
            .map(|start| self.bytes_at(start as isize, layout.len))
            .transpose()
    }

    /// Packs the data into `out` (`layout.len` bytes) in type-map order.
    pub(crate) fn pack_into(&self, layout: &Layout, out: &mut [u8]) -> Result<()> {
        if out.len() != layout.len {
            return Err(Error::new(
                ErrorClass::Intern,
                format!("packing {} bytes into {} bytes", layout.len, out.len()),
            ));
        }
        if let Some(bytes) = self.contiguous_bytes(layout)? {
            out.copy_from_slice(bytes);
            return Ok(());
        }
        self.pack_range(&mut Cursor::default(), out)
    }

    /// Packs the `out.len()` bytes of the packed stream that start at
    /// `cursor` into `out`, and moves the cursor past them: one piece of
    /// a message packed as it is sent. Past the end of the data is an
    /// error.
    pub(crate) fn pack_range(&self, cursor: &mut Cursor, out: &mut [u8]) -> Result<()> {
        let mut packed = 0;
        let walked = self.datatype.with_segments(self.count, |segments| {
            segments.advance(cursor, out.len(), |offset, len| {
                let from = self.bytes_at(offset, len)?;
                copy(from, out.get_mut(packed..packed + len))?;
                packed += len;
                Ok::<(), Error>(())
            })
        })?;
        if walked != out.len() {
            return Err(past_end(cursor.position(), out.len() - walked));
        }
        Ok(())
    }

    /// The data, packed in type-map order into a new vector.
    pub(crate) fn packed(&self) -> Result<Vec<u8>> {
        let layout = self.layout()?;
        let mut out = vec![0; layout.len];
        self.pack_into(&layout, &mut out)?;
        Ok(out)
    }
}

/// Copies `from` into `to`, which must be as long (a type map's segments
/// add up to its size, so they are).
fn copy(from: &[u8], to: Option<&mut [u8]>) -> Result<()> {
    match to {
        Some(to) if to.len() == from.len() => {
            to.copy_from_slice(from);
            Ok(())
        }
        _ => Err(Error::new(
            ErrorClass::Intern,
            "a datatype's segments add up to more than its size",
        )),
    }
}

/// Checks that a buffer's own datatype covers all of its `span` bytes, so
/// that any datatype may read them.
fn check_plain(layout: Layout, span: usize) -> Result<()> {
    if layout.contiguous == Some(0) && layout.len == span {
        return Ok(());
    }
    Err(Error::new(
        ErrorClass::Buffer,
        format!(
            "only {} of this buffer's {span} bytes are data (its elements have padding, which \
             holds no value): describe it by its own datatype, or use a buffer of plain \
             numbers with another datatype",
            layout.len
        ),
    ))
}

impl<'a> MutView<'a> {
    fn of_slice<T: Equivalence>(values: &'a mut [T]) -> MutView<'a> {
        MutView {
            base: values.as_mut_ptr().cast(),
            span: std::mem::size_of_val(values),
            datatype: T::equivalent_datatype().0,
            count: values.len(),
            _memory: PhantomData,
        }
    }

    /// Describes `buffer` as `count` elements of `datatype` from its first
    /// byte, to receive or unpack into (rsmpi's
    /// `MutView::with_count_and_datatype`); checked as
    /// [`View::with_count_and_datatype`] is.
    pub fn with_count_and_datatype<B, D>(
        buffer: &'a mut B,
        count: Count,
        datatype: &'a D,
    ) -> Result<MutView<'a>>
    where
        B: BufferMut + ?Sized,
        D: Datatype + ?Sized,
    {
        let whole = buffer.view_mut();
        check_plain(whole.layout()?, whole.span)?;
        let view = MutView {
            datatype: datatype.as_datatype_ref().0,
            count: count_arg("count", count)?,
            ..whole
        };
        view.layout()?;
        Ok(view)
    }

    /// The same buffer, to read.
    pub fn as_view(&self) -> View<'_> {
        View {
            base: self.base,
            span: self.span,
            datatype: self.datatype,
            count: self.count,
            _memory: PhantomData,
        }
    }

    /// Checks the view; see [`Layout`].
    #[inline]
    pub(crate) fn layout(&self) -> Result<Layout> {
        layout(self.span, self.datatype, self.count)
    }

    /// The datatype of the view's elements.
    #[inline]
    pub(crate) fn datatype(&self) -> Handle<'a> {
        self.datatype
    }

    /// The number of elements.
    pub(crate) fn count(&self) -> usize {
        self.count
    }

    fn bytes_at_mut(&mut self, offset: isize, len: usize) -> Result<&mut [u8]> {
        let start = range(offset, len, self.span).ok_or_else(|| outside(offset, len, self.span))?;
        // SAFETY: `start..start + len` lies in the memory the view borrows
        // exclusively for `'a` (`range`); the datatype names these bytes,
        // which are initialized and take any value (the invariant); the
        // slice lives no longer than this borrow of the view.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.base.add(start), len) })
    }

    /// The `len` bytes of contiguous data from `start` (a
    /// `layout.contiguous` of this view), for the whole of `'a`.
    #[inline]
    pub(crate) fn into_contiguous(self, start: usize, len: usize) -> Result<&'a mut [u8]> {
        let start = range(start as isize, len, self.span)
            .ok_or_else(|| outside(start as isize, len, self.span))?;
        // SAFETY: as in `bytes_at_mut`; the view is consumed, so the slice
        // is the only access to these bytes for `'a`.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.base.add(start), len) })
    }

    /// Unpacks `packed` (at most `layout.len` bytes, in type-map order)
    /// into the data, from its first byte; a shorter `packed` fills a
    /// prefix (a message shorter than the buffer).
    pub(crate) fn unpack_from(&mut self, layout: &Layout, packed: &[u8]) -> Result<()> {
        if packed.len() > layout.len {
            return Err(Error::new(
                ErrorClass::Truncate,
                format!(
                    "{} packed bytes do not fit {} bytes of data",
                    packed.len(),
                    layout.len
                ),
            ));
        }
        self.unpack_range(&mut Cursor::default(), packed)
    }

    /// Unpacks `packed`, the bytes of the packed stream that start at
    /// `cursor`, into the data, and moves the cursor past them: one piece
    /// of a message unpacked as it arrives. Past the end of the data is
    /// an error.
    pub(crate) fn unpack_range(&mut self, cursor: &mut Cursor, packed: &[u8]) -> Result<()> {
        let mut unpacked = 0;
        let (datatype, count) = (self.datatype, self.count);
        let walked = datatype.with_segments(count, |segments| {
            segments.advance(cursor, packed.len(), |offset, len| {
                let to = self.bytes_at_mut(offset, len)?;
                copy(&packed[unpacked..unpacked + len], Some(to))?;
                unpacked += len;
                Ok::<(), Error>(())
            })
        })?;
        if walked != packed.len() {
            return Err(past_end(cursor.position(), packed.len() - walked));
        }
        Ok(())
    }
}

/// The error of a piece that runs `left` bytes past the end of the data,
/// which ends at `end`.
fn past_end(end: usize, left: usize) -> Error {
    Error::new(
        ErrorClass::Truncate,
        format!("{left} bytes of a piece lie past the end of the data, at byte {end}"),
    )
}

/// A view's data, packed piece by piece as the device sends it: the
/// [`MessageSource`] of a non-contiguous send. It keeps the view's buffer
/// by address, beyond the borrow's end as the compiler sees it: see
/// [`View::pack_stream`].
pub(crate) struct PackStream {
    base: *const u8,
    span: usize,
    datatype: OwnedHandle,
    count: usize,
    len: usize,
    cursor: Cursor,
}

// SAFETY: the stream reads memory its creator vouched for (a shared
// borrow of `Sync` data, as `View` is), through a shared datatype.
unsafe impl Send for PackStream {}

/// Where a view's data is unpacked piece by piece as the device receives
/// it: the [`MessageSink`] of a non-contiguous receive. As
/// [`PackStream`], it keeps the buffer by address: see
/// [`MutView::unpack_stream`].
pub(crate) struct UnpackStream {
    base: *mut u8,
    span: usize,
    datatype: OwnedHandle,
    count: usize,
    len: usize,
    cursor: Cursor,
}

// SAFETY: the stream writes memory its creator gave it exclusively (an
// exclusive borrow of `Send` data, as `MutView` is).
unsafe impl Send for UnpackStream {}

/// Moves `cursor` to `offset` of `count` elements of `datatype`; an
/// offset past the data is an error.
fn seek(datatype: Handle<'_>, count: usize, cursor: &mut Cursor, offset: usize) -> Result<()> {
    datatype.with_segments(count, |segments| segments.seek(cursor, offset));
    if cursor.position() != offset {
        return Err(past_end(cursor.position(), offset - cursor.position()));
    }
    Ok(())
}

impl View<'_> {
    /// The view's data as a stream the device packs piece by piece.
    ///
    /// # Safety
    /// The memory the view borrows must stay valid, and unmodified, for
    /// as long as the stream is used: until the device request it is
    /// given to completes (the device never uses it after).
    pub(crate) unsafe fn pack_stream(&self, layout: &Layout) -> PackStream {
        PackStream {
            base: self.base,
            span: self.span,
            datatype: self.datatype.to_owned_handle(),
            count: self.count,
            len: layout.len,
            cursor: Cursor::default(),
        }
    }
}

impl PackStream {
    /// Another stream over the same data, with a cursor of its own: for
    /// a second message of some of the data, sent beside the first.
    ///
    /// # Safety
    /// As [`View::pack_stream`]: the memory must stay valid, and
    /// unmodified, for as long as the new stream is used.
    pub(crate) unsafe fn restarted(&self) -> PackStream {
        PackStream {
            datatype: self.datatype.handle().to_owned_handle(),
            cursor: Cursor::default(),
            ..*self
        }
    }
}

impl MessageSource for PackStream {
    fn len(&self) -> usize {
        self.len
    }

    fn pack(&mut self, offset: usize, out: &mut [u8]) -> Result<()> {
        let view = View {
            base: self.base,
            span: self.span,
            datatype: self.datatype.handle(),
            count: self.count,
            _memory: PhantomData,
        };
        // Pieces come in order: the seek is free.
        seek(view.datatype, view.count, &mut self.cursor, offset)?;
        view.pack_range(&mut self.cursor, out)
    }
}

impl MutView<'_> {
    /// The view as a stream the device unpacks into piece by piece.
    ///
    /// # Safety
    /// The memory the view borrows must stay valid, and untouched by
    /// anything else, for as long as the stream is used: until the device
    /// request it is given to completes (the device never uses it after).
    pub(crate) unsafe fn unpack_stream(self, layout: &Layout) -> UnpackStream {
        UnpackStream {
            base: self.base,
            span: self.span,
            datatype: self.datatype.to_owned_handle(),
            count: self.count,
            len: layout.len,
            cursor: Cursor::default(),
        }
    }
}

impl UnpackStream {
    /// A stream that packs the data this one unpacks into: to send on
    /// data received earlier.
    ///
    /// # Safety
    /// The memory must stay valid for as long as the new stream is used,
    /// and nothing may unpack into the bytes it packs meanwhile.
    pub(crate) unsafe fn packer(&self) -> PackStream {
        PackStream {
            base: self.base,
            span: self.span,
            datatype: self.datatype.handle().to_owned_handle(),
            count: self.count,
            len: self.len,
            cursor: Cursor::default(),
        }
    }

    /// Another stream that unpacks into the same data, with a cursor of
    /// its own: for a second message into another part of the data.
    ///
    /// # Safety
    /// The memory must stay valid for as long as the new stream is used,
    /// and no two streams may use the same bytes at once (each message
    /// fills its own part of the packed data).
    pub(crate) unsafe fn restarted(&self) -> UnpackStream {
        UnpackStream {
            datatype: self.datatype.handle().to_owned_handle(),
            cursor: Cursor::default(),
            ..*self
        }
    }
}

impl MessageSink for UnpackStream {
    fn capacity(&self) -> usize {
        self.len
    }

    fn unpack(&mut self, offset: usize, bytes: &[u8]) -> Result<()> {
        let mut view = MutView {
            base: self.base,
            span: self.span,
            datatype: self.datatype.handle(),
            count: self.count,
            _memory: PhantomData,
        };
        seek(view.datatype, view.count, &mut self.cursor, offset)?;
        view.unpack_range(&mut self.cursor, bytes)
    }
}

impl fmt::Debug for View<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("View")
            .field("bytes", &self.span)
            .field("count", &self.count)
            .field("datatype", &DatatypeRef(self.datatype))
            .finish()
    }
}

impl fmt::Debug for MutView<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MutView")
            .field("bytes", &self.span)
            .field("count", &self.count)
            .field("datatype", &DatatypeRef(self.datatype))
            .finish()
    }
}

impl Buffer for View<'_> {
    fn view(&self) -> View<'_> {
        *self
    }
}

impl Buffer for MutView<'_> {
    fn view(&self) -> View<'_> {
        self.as_view()
    }
}

impl BufferMut for MutView<'_> {
    fn view_mut(&mut self) -> MutView<'_> {
        MutView {
            base: self.base,
            span: self.span,
            datatype: self.datatype,
            count: self.count,
            _memory: PhantomData,
        }
    }
}

impl<T: Equivalence> Buffer for T {
    fn view(&self) -> View<'_> {
        View::of_slice(std::slice::from_ref(self))
    }
}

impl<T: Equivalence> Buffer for [T] {
    fn view(&self) -> View<'_> {
        View::of_slice(self)
    }
}

impl<T: Equivalence> Buffer for Vec<T> {
    fn view(&self) -> View<'_> {
        View::of_slice(self)
    }
}

impl<T: Equivalence, const N: usize> Buffer for [T; N] {
    fn view(&self) -> View<'_> {
        View::of_slice(self)
    }
}

impl<T: Equivalence> BufferMut for T {
    fn view_mut(&mut self) -> MutView<'_> {
        MutView::of_slice(std::slice::from_mut(self))
    }
}

impl<T: Equivalence> BufferMut for [T] {
    fn view_mut(&mut self) -> MutView<'_> {
        MutView::of_slice(self)
    }
}

impl<T: Equivalence> BufferMut for Vec<T> {
    fn view_mut(&mut self) -> MutView<'_> {
        MutView::of_slice(self)
    }
}

impl<T: Equivalence, const N: usize> BufferMut for [T; N] {
    fn view_mut(&mut self) -> MutView<'_> {
        MutView::of_slice(self)
    }
}

#[cfg(test)]
mod tests {
    use super::super::sealed::Sealed;
    use super::super::{Equivalence, UncommittedDatatype, UserDatatype};
    use super::*;

    #[test]
    fn plain_buffers_are_contiguous() {
        let x = 0x0102_0304u32;
        let view = x.view();
        let layout = view.layout().unwrap();
        assert_eq!(
            layout,
            Layout {
                len: 4,
                contiguous: Some(0)
            }
        );
        assert_eq!(
            view.contiguous_bytes(&layout).unwrap(),
            Some(&x.to_ne_bytes()[..])
        );
        let v = vec![1.5f64, -2.0];
        assert_eq!(v.view().layout().unwrap().len, 16);
        let mut a = [0u16; 3];
        let mut m = a.view_mut();
        let layout = m.layout().unwrap();
        m.unpack_from(&layout, &[1, 0, 2, 0]).unwrap();
        assert_eq!(a, [1, 2, 0].map(u16::to_le));
    }

    #[test]
    fn a_view_reaching_outside_its_buffer_is_an_error() {
        let every_other = UserDatatype::vector(3, 1, 2, &u32::equivalent_datatype()).unwrap();
        let five = [0u32; 5];
        assert!(View::with_count_and_datatype(&five[..], 1, &every_other).is_ok());
        let four = [0u32; 4];
        let e = View::with_count_and_datatype(&four[..], 1, &every_other).unwrap_err();
        assert_eq!(e.class(), ErrorClass::Buffer);
        assert!(
            e.message()
                .contains("reach bytes 0..20 of a buffer of 16 bytes"),
            "{e}"
        );
        // Two elements: the second starts one extent (5 u32) later.
        let e = View::with_count_and_datatype(&[0u32; 9][..], 2, &every_other).unwrap_err();
        assert_eq!(e.class(), ErrorClass::Buffer);
        assert!(View::with_count_and_datatype(&[0u32; 10][..], 2, &every_other).is_ok());
        let e = View::with_count_and_datatype(&five[..], -1, &every_other).unwrap_err();
        assert_eq!(e.class(), ErrorClass::Count);
        // Data before the buffer's start.
        let before =
            UserDatatype::heterogeneous_indexed(&[1], &[-4], &u32::equivalent_datatype()).unwrap();
        let e = View::with_count_and_datatype(&five[..], 1, &before).unwrap_err();
        assert_eq!(e.class(), ErrorClass::Buffer);
        let mut target = [0u8; 3];
        let e = MutView::with_count_and_datatype(&mut target[..], 1, &u32::equivalent_datatype())
            .unwrap_err();
        assert_eq!(e.class(), ErrorClass::Buffer);
    }

    /// A small deterministic generator of piece lengths (xorshift).
    fn lengths(seed: u64) -> impl FnMut(usize) -> usize {
        let mut state = seed | 1;
        move |most| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            1 + (state % most as u64) as usize
        }
    }

    #[test]
    fn pieces_at_any_boundaries_pack_and_unpack_as_the_whole() {
        let f64t = f64::equivalent_datatype();
        let i32t = i32::equivalent_datatype();
        let strided = UserDatatype::vector(5, 1, 2, &f64t).unwrap();
        let nested = UserDatatype::indexed(&[2, 1, 3], &[4, 0, 9], &strided).unwrap();
        let blocks = UserDatatype::indexed(&[3, 1], &[7, 1], &i32t).unwrap();
        let mixed =
            UserDatatype::structured(&[1, 2, 3], &[0, 96, 160], &[&strided, &blocks, &i32t])
                .unwrap();
        let resized = UserDatatype::resized(&mixed, 0, 256).unwrap();
        let cases: [(&UserDatatype, usize); 5] = [
            (&strided, 40),
            (&nested, 3),
            (&blocks, 20),
            (&mixed, 2),
            (&resized, 7),
        ];
        for (case, (datatype, count)) in cases.into_iter().enumerate() {
            let span = usize::try_from(datatype.extent()).unwrap() * count + 512;
            let source: Vec<u8> = (0..span).map(|i| (i * 7 + i / 251) as u8).collect();
            let view =
                View::with_count_and_datatype(&source[..], count as Count, datatype).unwrap();
            let whole = view.packed().unwrap();
            assert!(!whole.is_empty());
            let mut next = lengths(case as u64 + 11);
            for most in [1, 3, 17, 64, whole.len()] {
                // In order, with one cursor.
                let mut cursor = Cursor::default();
                let mut pieces = Vec::new();
                while pieces.len() < whole.len() {
                    let n = next(most).min(whole.len() - pieces.len());
                    let mut out = vec![0; n];
                    view.pack_range(&mut cursor, &mut out).unwrap();
                    pieces.extend_from_slice(&out);
                }
                assert_eq!(pieces, whole, "type {case}, pieces of at most {most}");
                // Unpacked in pieces, into a buffer that starts zeroed.
                let mut back = vec![0u8; span];
                let mut expected = vec![0u8; span];
                MutView::with_count_and_datatype(&mut expected[..], count as Count, datatype)
                    .unwrap()
                    .unpack_from(&view.layout().unwrap(), &whole)
                    .unwrap();
                let mut target =
                    MutView::with_count_and_datatype(&mut back[..], count as Count, datatype)
                        .unwrap();
                let mut cursor = Cursor::default();
                let mut at = 0;
                while at < whole.len() {
                    let n = next(most).min(whole.len() - at);
                    target
                        .unpack_range(&mut cursor, &whole[at..at + n])
                        .unwrap();
                    at += n;
                }
                assert_eq!(back, expected, "type {case}, pieces of at most {most}");
            }
            // Any range, reached by seeking (forward, or over again).
            let mut cursor = Cursor::default();
            for _ in 0..50 {
                let from = next(whole.len()) - 1;
                let n = next(whole.len() - from);
                datatype
                    .handle()
                    .0
                    .with_segments(count, |s| s.seek(&mut cursor, from));
                assert_eq!(cursor.position(), from);
                let mut out = vec![0; n];
                view.pack_range(&mut cursor, &mut out).unwrap();
                assert_eq!(out, whole[from..from + n], "type {case}, bytes {from}+{n}");
            }
            // A piece past the end is an error, not a panic.
            let mut out = vec![0; 2];
            let mut cursor = Cursor::default();
            datatype
                .handle()
                .0
                .with_segments(count, |s| s.seek(&mut cursor, whole.len() - 1));
            let err = view.pack_range(&mut cursor, &mut out).unwrap_err();
            assert_eq!(err.class(), ErrorClass::Truncate);
        }
    }

    #[test]
    fn views_pack_and_unpack_in_type_map_order() {
        // Blocks at u16 elements 3 and 0, in that order.
        let datatype =
            UserDatatype::indexed(&[1, 2], &[3, 0], &u16::equivalent_datatype()).unwrap();
        let values = [10u16, 11, 12, 13];
        let view = View::with_count_and_datatype(&values[..], 1, &datatype).unwrap();
        let packed = view.packed().unwrap();
        let expected: Vec<u8> = [13u16, 10, 11]
            .iter()
            .flat_map(|v| v.to_ne_bytes())
            .collect();
        assert_eq!(packed, expected);
        let mut back = [0u16; 4];
        let mut target = MutView::with_count_and_datatype(&mut back[..], 1, &datatype).unwrap();
        let layout = target.layout().unwrap();
        // A prefix: the first element and half of the second.
        target.unpack_from(&layout, &packed[..3]).unwrap();
        assert_eq!(back[3], 13);
        assert_eq!(back[0].to_ne_bytes()[0], 10u16.to_ne_bytes()[0]);
        assert_eq!(back[1], 0);
    }
}
