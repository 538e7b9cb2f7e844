//! Canonical pack and unpack (MPI 4.1 §5.2.3): data in the `external32`
//! representation (§15.5.2) — every basic value big-endian, at the
//! standard's size, one after the other — so that machines of different
//! byte order can exchange it. The only representation there is, so the
//! `datarep` argument of `MPI_Pack_external` is left out.

use super::pack::overflow;
use super::view::{Buffer, BufferMut, Layout};
use super::{Count, Datatype, Handle};
use crate::{Error, ErrorClass, Result};

/// Bytes of `count` elements of `datatype` in external32.
fn external_size(datatype: Handle<'_>, count: usize) -> Result<usize> {
    let mut one = 0usize;
    datatype.for_each_basic(1, |p, n| one += n * p.external32_size());
    one.checked_mul(count).ok_or_else(|| {
        Error::new(
            ErrorClass::Count,
            format!(
                "{count} elements of {one} external32 bytes are more than an address can count"
            ),
        )
    })
}

/// Converts between packed data in this machine's representation and in
/// external32, run of basic values by run, in type-map order.
fn convert(
    datatype: Handle<'_>,
    count: usize,
    mut each: impl FnMut(super::Primitive, usize, usize, usize) -> Result<()>,
) -> Result<()> {
    let (mut native, mut external) = (0, 0);
    let mut result = Ok(());
    datatype.for_each_basic(count, |p, n| {
        if result.is_ok() {
            result = each(p, n, native, external);
        }
        native += n * p.size();
        external += n * p.external32_size();
    });
    result
}

/// Packs `inbuf`'s data in external32 into a new vector
/// (`MPI_Pack_external` with `"external32"`, from position 0).
#[doc(alias = "MPI_Pack_external")]
pub fn pack_external<B: Buffer + ?Sized>(inbuf: &B) -> Result<Vec<u8>> {
    let view = inbuf.view();
    let mut out = vec![0; external_size(view.datatype(), view.count())?];
    pack_external_into(inbuf, &mut out, 0)?;
    Ok(out)
}

/// Packs `inbuf`'s data in external32 into `outbuf` from byte `position`,
/// and returns the position after it (`MPI_Pack_external`). Too little
/// room is an `MPI_ERR_TRUNCATE` error, and nothing is written.
#[doc(alias = "MPI_Pack_external")]
pub fn pack_external_into<B: Buffer + ?Sized>(
    inbuf: &B,
    outbuf: &mut [u8],
    position: usize,
) -> Result<usize> {
    let view = inbuf.view();
    let size = external_size(view.datatype(), view.count())?;
    let end = position.saturating_add(size);
    let room = outbuf.len();
    let out = outbuf
        .get_mut(position..end)
        .ok_or_else(|| overflow("packing external32", size, position, room))?;
    let native = view.packed()?;
    convert(view.datatype(), view.count(), |p, n, at, to| {
        let (from, into) = (at..at + n * p.size(), to..to + n * p.external32_size());
        match (native.get(from), out.get_mut(into)) {
            (Some(from), Some(into)) => {
                p.encode_external32(from, into);
                Ok(())
            }
            _ => Err(sizes_disagree()),
        }
    })?;
    Ok(end)
}

/// Unpacks external32 data from `inbuf`, starting at byte `position`, into
/// `outbuf`, and returns the position after it (`MPI_Unpack_external`).
/// `outbuf`'s count and datatype say how much is read; fewer bytes left
/// is an `MPI_ERR_TRUNCATE` error, and nothing is written.
#[doc(alias = "MPI_Unpack_external")]
pub fn unpack_external<B: BufferMut + ?Sized>(
    inbuf: &[u8],
    outbuf: &mut B,
    position: usize,
) -> Result<usize> {
    let mut view = outbuf.view_mut();
    let layout: Layout = view.layout()?;
    let size = external_size(view.datatype(), view.count())?;
    let end = position.saturating_add(size);
    let input = inbuf
        .get(position..end)
        .ok_or_else(|| overflow("unpacking external32", size, position, inbuf.len()))?;
    let mut native = vec![0; layout.len];
    convert(view.datatype(), view.count(), |p, n, at, from| {
        let (into, from) = (at..at + n * p.size(), from..from + n * p.external32_size());
        match (input.get(from), native.get_mut(into)) {
            (Some(from), Some(into)) => p.decode_external32(from, into),
            _ => Err(sizes_disagree()),
        }
    })?;
    view.unpack_from(&layout, &native)?;
    Ok(end)
}

/// The bytes packing `count` elements of `datatype` in external32 takes
/// (`MPI_Pack_external_size`). A negative count is an `MPI_ERR_COUNT`
/// error.
#[doc(alias = "MPI_Pack_external_size")]
pub fn pack_external_size<D: Datatype + ?Sized>(count: Count, datatype: &D) -> Result<usize> {
    let count = super::constructors::count_arg("incount", count)?;
    external_size(datatype.as_datatype_ref().0, count)
}

fn sizes_disagree() -> Error {
    Error::new(
        ErrorClass::Intern,
        "a datatype's signature and its packed size disagree",
    )
}
