//! Pack and unpack (MPI 4.1 §5.2), and how typed buffers meet the
//! device, which moves bytes. Point-to-point operations hand the device
//! a contiguous buffer's own bytes, or, for data that is not contiguous,
//! a stream ([`super::view::PackStream`], [`super::view::UnpackStream`])
//! that the device packs and unpacks piece by piece as the message moves
//! (`Communicator::start_send_view`, `start_recv_view`). Collectives,
//! which combine whole blocks, use [`Outgoing`] (the buffer's own bytes,
//! or a packed copy) and [`Incoming`] (the buffer itself, or a staging
//! buffer unpacked into it when the operation completes).

use super::view::{Buffer, BufferMut, MutView, View};
use super::{Count, Datatype};
use crate::{Communicator, Error, ErrorClass, Result};

/// The bytes of an outgoing message, as the device takes them.
pub(crate) enum Outgoing<'a> {
    /// The buffer's own bytes: its data is contiguous.
    Borrowed(&'a [u8]),
    /// A packed copy of data that is not.
    Packed(Vec<u8>),
}

impl<'a> Outgoing<'a> {
    // Inlined, as the other small steps of a typed buffer here: a call
    // on a slice of numbers is then a handful of instructions in the
    // caller (a one-sided operation of 8 bytes spent a fifth of its
    // instructions in these calls). Always: with `#[inline]` alone the
    // compiler kept the call, and its result went through memory.
    #[inline(always)]
    pub(crate) fn new(view: &View<'a>) -> Result<Outgoing<'a>> {
        let layout = view.layout()?;
        Ok(match view.contiguous_bytes(&layout)? {
            Some(bytes) => Outgoing::Borrowed(bytes),
            None => {
                let mut packed = vec![0; layout.len];
                view.pack_into(&layout, &mut packed)?;
                Outgoing::Packed(packed)
            }
        })
    }

    #[inline]
    pub(crate) fn bytes(&self) -> &[u8] {
        match self {
            Outgoing::Borrowed(bytes) => bytes,
            Outgoing::Packed(packed) => packed,
        }
    }
}

/// Where an incoming message lands.
pub(crate) enum Incoming<'a> {
    /// The buffer's own bytes: its data is contiguous.
    Direct(&'a mut [u8]),
    /// A staging buffer, unpacked into the view when the receive completes.
    Staged { bytes: Vec<u8>, target: MutView<'a> },
}

impl<'a> Incoming<'a> {
    /// Always inlined, as [`Outgoing::new`]: with `#[inline]` alone a
    /// one-sided get of 8 bytes paid a call (about 50 instructions of its
    /// 290) that returned the buffer through memory.
    #[inline(always)]
    pub(crate) fn new(view: MutView<'a>) -> Result<Incoming<'a>> {
        let layout = view.layout()?;
        Ok(match layout.contiguous {
            Some(start) => Incoming::Direct(view.into_contiguous(start, layout.len)?),
            None => Incoming::Staged {
                bytes: vec![0; layout.len],
                target: view,
            },
        })
    }

    /// Like [`Incoming::new`], with a staging buffer that starts as the
    /// view's data packed: for an operation that reads the buffer before
    /// it writes it, or writes only part of it (in-place collectives, and
    /// blocks of varying counts). Always inlined, as [`Outgoing::new`].
    #[inline(always)]
    pub(crate) fn with_contents(view: MutView<'a>) -> Result<Incoming<'a>> {
        let mut incoming = Incoming::new(view)?;
        if let Incoming::Staged { bytes, target } = &mut incoming {
            let source = target.as_view();
            source.pack_into(&source.layout()?, bytes)?;
        }
        Ok(incoming)
    }

    /// The bytes the device writes the message into.
    #[inline]
    pub(crate) fn device_buffer(&mut self) -> &mut [u8] {
        match self {
            Incoming::Direct(bytes) => bytes,
            Incoming::Staged { bytes, .. } => bytes,
        }
    }

    /// Completes a receive of `received` bytes: unpacks a staged message.
    #[inline]
    pub(crate) fn finish(self, received: usize) -> Result<()> {
        match self {
            Incoming::Direct(_) => Ok(()),
            Incoming::Staged { bytes, target } => unpack_received(target, &bytes, received),
        }
    }
}

/// Unpacks the first `received` bytes of `bytes`, a staged message, into
/// `target`.
fn unpack_received(mut target: MutView<'_>, bytes: &[u8], received: usize) -> Result<()> {
    let received = bytes.get(..received).ok_or_else(|| {
        Error::new(
            ErrorClass::Intern,
            format!(
                "the device reports {received} bytes received into a staging buffer of {}",
                bytes.len()
            ),
        )
    })?;
    let layout = target.layout()?;
    target.unpack_from(&layout, received)
}

/// Upper bound of the bytes [`Communicator::pack`] writes for `count`
/// elements of `datatype`.
pub(crate) fn packed_size<D: Datatype + ?Sized>(count: Count, datatype: &D) -> Result<usize> {
    let count = super::constructors::count_arg("incount", count)?;
    count.checked_mul(datatype.size()).ok_or_else(|| {
        Error::new(
            ErrorClass::Count,
            format!(
                "{count} elements of {} bytes are more bytes than an address can count",
                datatype.size()
            ),
        )
    })
}

/// The error of packing past the end of `room` bytes, or unpacking past
/// the end of the input.
pub(super) fn overflow(what: &str, need: usize, position: usize, room: usize) -> Error {
    Error::new(
        ErrorClass::Truncate,
        format!(
            "{what} {need} bytes at position {position} of a buffer of {room} bytes: they do \
             not fit"
        ),
    )
}

impl Communicator {
    /// Packs `inbuf`'s data into a new vector, in the format a message of
    /// it has (`MPI_Pack` from position 0). Send it as bytes (`u8`), and
    /// [`unpack_into`](Communicator::unpack_into) or receive it with the
    /// datatype at the other end.
    #[doc(alias = "MPI_Pack")]
    pub fn pack<B: Buffer + ?Sized>(&self, inbuf: &B) -> Result<Vec<u8>> {
        inbuf.view().packed()
    }

    /// Packs `inbuf`'s data into `outbuf` from byte `position`, and returns
    /// the position after it (`MPI_Pack`). Too little room is an
    /// `MPI_ERR_TRUNCATE` error, and nothing is written.
    #[doc(alias = "MPI_Pack")]
    pub fn pack_into<B: Buffer + ?Sized>(
        &self,
        inbuf: &B,
        outbuf: &mut [u8],
        position: usize,
    ) -> Result<usize> {
        let view = inbuf.view();
        let layout = view.layout()?;
        let end = position.saturating_add(layout.len);
        let room = outbuf.len();
        let out = outbuf
            .get_mut(position..end)
            .ok_or_else(|| overflow("packing", layout.len, position, room))?;
        view.pack_into(&layout, out)?;
        Ok(end)
    }

    /// Unpacks data packed by [`pack`](Communicator::pack) from `inbuf`,
    /// starting at byte `position`, into `outbuf`, and returns the
    /// position after it (`MPI_Unpack`). `outbuf`'s count and datatype
    /// say how much is read; fewer bytes left in `inbuf` is an
    /// `MPI_ERR_TRUNCATE` error, and nothing is written.
    #[doc(alias = "MPI_Unpack")]
    pub fn unpack_into<B: BufferMut + ?Sized>(
        &self,
        inbuf: &[u8],
        outbuf: &mut B,
        position: usize,
    ) -> Result<usize> {
        let mut view = outbuf.view_mut();
        let layout = view.layout()?;
        let end = position.saturating_add(layout.len);
        let packed = inbuf
            .get(position..end)
            .ok_or_else(|| overflow("unpacking", layout.len, position, inbuf.len()))?;
        view.unpack_from(&layout, packed)?;
        Ok(end)
    }

    /// The most bytes packing `count` elements of `datatype` takes
    /// (`MPI_Pack_size`). A negative count is an `MPI_ERR_COUNT` error.
    #[doc(alias = "MPI_Pack_size")]
    pub fn pack_size<D: Datatype + ?Sized>(&self, count: Count, datatype: &D) -> Result<usize> {
        packed_size(count, datatype)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datatype::{Equivalence, UserDatatype};

    #[derive(Equivalence, Clone, Copy)]
    #[repr(C)]
    struct Plain {
        a: u32,
        b: [u16; 2],
    }

    #[derive(Equivalence, Clone, Copy)]
    #[repr(C)]
    struct Padded {
        a: u8,
        b: u32,
    }

    /// Whether `data` goes to the device as the buffer's own bytes, from
    /// byte `at` of `base`.
    fn borrowed_at(data: View<'_>, base: *const u8, at: usize) -> bool {
        match Outgoing::new(&data).unwrap() {
            Outgoing::Borrowed(bytes) => bytes.as_ptr() == base.wrapping_add(at),
            Outgoing::Packed(_) => false,
        }
    }

    #[test]
    fn contiguous_data_is_sent_without_a_copy() {
        let numbers = [1.0f64; 12];
        let base = numbers.as_ptr().cast::<u8>();
        assert!(borrowed_at(numbers.view(), base, 0));
        let f64t = f64::equivalent_datatype();
        let three = UserDatatype::contiguous(3, &f64t).unwrap();
        let dense_vector = UserDatatype::vector(2, 2, 2, &f64t).unwrap();
        let one_block = UserDatatype::heterogeneous_indexed(&[4], &[16], &f64t).unwrap();
        for (datatype, count, at) in [(&three, 4, 0), (&dense_vector, 3, 0), (&one_block, 1, 16)] {
            let view = View::with_count_and_datatype(&numbers[..], count, datatype).unwrap();
            assert!(borrowed_at(view, base, at));
        }
        let plain = [Plain { a: 1, b: [2, 3] }; 4];
        assert!(borrowed_at(plain.view(), plain.as_ptr().cast(), 0));
        // Not contiguous: packed.
        let padded = [Padded { a: 1, b: 2 }; 4];
        assert!(!borrowed_at(padded.view(), padded.as_ptr().cast(), 0));
        let gaps = UserDatatype::vector(2, 1, 2, &f64t).unwrap();
        let view = View::with_count_and_datatype(&numbers[..], 1, &gaps).unwrap();
        assert!(!borrowed_at(view, base, 0));
    }

    #[test]
    fn contiguous_receives_land_in_the_buffer_and_others_are_staged() {
        let mut numbers = [0u32; 8];
        match Incoming::new(numbers.view_mut()).unwrap() {
            Incoming::Direct(bytes) => assert_eq!(bytes.len(), 32),
            Incoming::Staged { .. } => panic!("a slice of numbers was staged"),
        }
        let gaps = UserDatatype::vector(4, 1, 2, &u32::equivalent_datatype()).unwrap();
        let view = MutView::with_count_and_datatype(&mut numbers[..], 1, &gaps).unwrap();
        let mut incoming = Incoming::new(view).unwrap();
        incoming.device_buffer()[..8].copy_from_slice(&[1, 0, 0, 0, 2, 0, 0, 0]);
        incoming.finish(8).unwrap();
        assert_eq!(numbers, [1, 0, 2, 0, 0, 0, 0, 0].map(u32::from_le));
    }
}
