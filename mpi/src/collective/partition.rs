//! Buffers split into one block per process, for the collectives of
//! varying counts: [`Partition`] (sent from) and [`PartitionMut`]
//! (received into), as rsmpi has them.

use super::typed::Pieces;
use crate::datatype::{Buffer, BufferMut, ElementType};
use crate::{Error, ErrorClass, Result};
use std::borrow::Borrow;
use std::ops::Range;

/// A buffer to send from, in one block per process: block `i` is
/// `counts[i]` elements from element `displs[i]` (MPI's `sendcounts` and
/// `sdispls`). Blocks may overlap.
#[derive(Debug)]
pub struct Partition<'b, B: ?Sized, C, D> {
    buf: &'b B,
    counts: C,
    displs: D,
}

impl<'b, B, C, D> Partition<'b, B, C, D>
where
    B: Buffer + ?Sized,
    C: Borrow<[i32]>,
    D: Borrow<[i32]>,
{
    /// `buf` in blocks of `counts` elements at element displacements
    /// `displs`; they are checked when the partition is used.
    pub fn new(buf: &'b B, counts: C, displs: D) -> Partition<'b, B, C, D> {
        Partition {
            buf,
            counts,
            displs,
        }
    }

    /// The counts of the blocks, in elements.
    pub fn counts(&self) -> &[i32] {
        self.counts.borrow()
    }

    /// The displacements of the blocks, in elements.
    pub fn displs(&self) -> &[i32] {
        self.displs.borrow()
    }

    pub(crate) fn element_type(&self) -> ElementType {
        ElementType::of_datatype(self.buf.view().datatype())
    }

    /// The blocks in bytes of packed data for `size` owners (processes
    /// or neighbours, as errors name them), and the data to read a piece
    /// at a time (no packed copy).
    pub(crate) fn pieces(
        &self,
        owner: BlockOwner,
        size: usize,
    ) -> Result<(Vec<Range<usize>>, Pieces<'b>)> {
        let (pieces, element_type) = Pieces::of_buffer(self.buf)?;
        let parts = blocks(
            self.counts(),
            self.displs(),
            (owner, size),
            element_type,
            pieces.len(),
        )?;
        Ok((parts, pieces))
    }
}

/// A buffer to receive into, in one block per process: block `i` is
/// `counts[i]` elements from element `displs[i]` (MPI's `recvcounts` and
/// `displs`). Blocks must not overlap (else `MPI_ERR_ARG`).
#[derive(Debug)]
pub struct PartitionMut<'b, B: ?Sized, C, D> {
    buf: &'b mut B,
    counts: C,
    displs: D,
}

impl<'b, B, C, D> PartitionMut<'b, B, C, D>
where
    B: BufferMut + ?Sized,
    C: Borrow<[i32]>,
    D: Borrow<[i32]>,
{
    /// `buf` in blocks of `counts` elements at element displacements
    /// `displs`; they are checked when the partition is used.
    pub fn new(buf: &'b mut B, counts: C, displs: D) -> PartitionMut<'b, B, C, D> {
        PartitionMut {
            buf,
            counts,
            displs,
        }
    }

    /// The counts of the blocks, in elements.
    pub fn counts(&self) -> &[i32] {
        self.counts.borrow()
    }

    /// The displacements of the blocks, in elements.
    pub fn displs(&self) -> &[i32] {
        self.displs.borrow()
    }

    pub(crate) fn element_type(&mut self) -> ElementType {
        ElementType::of_datatype(self.buf.view_mut().datatype())
    }

    /// The blocks in bytes of packed data for `size` owners (processes
    /// or neighbours, as errors name them), and the data to write (and
    /// read) a piece at a time (no packed copy).
    pub(crate) fn pieces(
        &mut self,
        owner: BlockOwner,
        size: usize,
    ) -> Result<(Vec<Range<usize>>, Pieces<'_>)> {
        let (pieces, element_type) = Pieces::into_buffer(self.buf)?;
        let parts = blocks(
            self.counts.borrow(),
            self.displs.borrow(),
            (owner, size),
            element_type,
            pieces.len(),
        )?;
        Ok((parts, pieces))
    }
}

/// What the index of a block stands for, so that errors name a block by
/// what the caller passed: the rank of a process, or the position of a
/// neighbour in this process's list of sources or destinations (a
/// neighbourhood collective's blocks, where one process may be several
/// neighbours and a neighbour's index is no rank).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BlockOwner {
    /// Block `i` is for the process of rank `i`.
    Rank,
    /// Block `i` is for source neighbour `i`.
    SourceNeighbor,
    /// Block `i` is for destination neighbour `i`.
    DestinationNeighbor,
}

impl BlockOwner {
    /// The owner of block `i`: "rank 3", "source neighbour 3".
    fn one(self, i: usize) -> String {
        match self {
            BlockOwner::Rank => format!("rank {i}"),
            BlockOwner::SourceNeighbor => format!("source neighbour {i}"),
            BlockOwner::DestinationNeighbor => format!("destination neighbour {i}"),
        }
    }

    /// The owners of blocks `i` and `j`, said together: "ranks 1 and 2",
    /// "source neighbours 1 and 2 (positions in this process's list of
    /// sources)".
    fn two(self, i: usize, j: usize) -> String {
        match self {
            BlockOwner::Rank => format!("ranks {i} and {j}"),
            BlockOwner::SourceNeighbor => format!(
                "source neighbours {i} and {j} (positions in this process's list of sources)"
            ),
            BlockOwner::DestinationNeighbor => format!(
                "destination neighbours {i} and {j} (positions in this process's list of \
                 destinations)"
            ),
        }
    }

    /// `n` owners: "4 processes", "4 source neighbours".
    fn many(self, n: usize) -> String {
        match self {
            BlockOwner::Rank => format!("{n} processes"),
            BlockOwner::SourceNeighbor => format!("{n} source neighbours"),
            BlockOwner::DestinationNeighbor => format!("{n} destination neighbours"),
        }
    }
}

/// The byte ranges of `size` blocks, one per `owner`, of `counts`
/// elements at element displacements `displs` in a buffer of `len`
/// bytes.
fn blocks(
    counts: &[i32],
    displs: &[i32],
    (owner, size): (BlockOwner, usize),
    element_type: ElementType,
    len: usize,
) -> Result<Vec<Range<usize>>> {
    if counts.len() != size || displs.len() != size {
        return Err(Error::new(
            ErrorClass::Arg,
            format!(
                "{} counts and {} displacements for {}",
                counts.len(),
                displs.len(),
                owner.many(size)
            ),
        ));
    }
    let element = element_type.size();
    counts
        .iter()
        .zip(displs)
        .enumerate()
        .map(|(i, (&count, &displ))| {
            let count = usize::try_from(count).map_err(|_| {
                Error::new(
                    ErrorClass::Count,
                    format!(
                        "the count of {}'s block is negative ({count})",
                        owner.one(i)
                    ),
                )
            })?;
            let displ = usize::try_from(displ).map_err(|_| {
                Error::new(
                    ErrorClass::Arg,
                    format!(
                        "the displacement of {}'s block is negative ({displ})",
                        owner.one(i)
                    ),
                )
            })?;
            let start = displ * element;
            let end = start + count * element;
            if end > len {
                return Err(Error::new(
                    ErrorClass::Count,
                    format!(
                        "{}'s block (elements {displ}..{}) does not fit the buffer of {} elements",
                        owner.one(i),
                        displ + count,
                        len / element
                    ),
                ));
            }
            Ok(start..end)
        })
        .collect()
}

/// `size` blocks of `block` bytes, one after the other.
pub(crate) fn uniform_blocks(size: usize, block: usize) -> Vec<Range<usize>> {
    (0..size).map(|i| i * block..(i + 1) * block).collect()
}

/// The byte ranges of `size` blocks of `counts` elements one after the
/// other (`MPI_Reduce_scatter`'s `recvcounts`).
pub(crate) fn consecutive_blocks(
    counts: &[i32],
    size: usize,
    element_type: ElementType,
) -> Result<Vec<Range<usize>>> {
    let mut displs = Vec::with_capacity(counts.len());
    let mut at = 0i64;
    for &count in counts {
        displs.push(i32::try_from(at).map_err(|_| {
            Error::new(ErrorClass::Count, "the counts add up to more than i32::MAX")
        })?);
        at += i64::from(count.max(0));
    }
    let total = usize::try_from(at).unwrap_or(usize::MAX);
    blocks(
        counts,
        &displs,
        (BlockOwner::Rank, size),
        element_type,
        total * element_type.size(),
    )
}

/// Blocks of one buffer that do not overlap, to receive into at once.
pub(crate) struct DisjointBlocks<'p> {
    parts: &'p [Range<usize>],
    /// Indices of the non-empty blocks, by where they start.
    order: Vec<usize>,
}

/// Checks that no two non-empty `parts` of a buffer of `len` bytes
/// overlap (else `MPI_ERR_ARG`, naming the two blocks by `owner`).
pub(crate) fn disjoint_blocks(
    len: usize,
    parts: &[Range<usize>],
    owner: BlockOwner,
) -> Result<DisjointBlocks<'_>> {
    let mut order: Vec<usize> = (0..parts.len()).filter(|&i| !parts[i].is_empty()).collect();
    order.sort_by_key(|&i| parts[i].start);
    for pair in order.windows(2) {
        let (a, b) = (&parts[pair[0]], &parts[pair[1]]);
        if a.end > b.start {
            return Err(Error::new(
                ErrorClass::Arg,
                format!(
                    "the receive blocks of {} overlap: each element may be written once",
                    owner.two(pair[0], pair[1])
                ),
            ));
        }
    }
    debug_assert!(order.last().is_none_or(|&i| parts[i].end <= len));
    Ok(DisjointBlocks { parts, order })
}

impl DisjointBlocks<'_> {
    /// The blocks, by block index.
    pub(crate) fn parts(&self) -> &[Range<usize>] {
        self.parts
    }

    /// `buf` split into the blocks, by block index, each as a `T` (the
    /// bytes, or what holds them: one pass, one vector).
    pub(crate) fn split<'b, T: From<&'b mut [u8]> + Default>(
        self,
        buf: &'b mut [u8],
    ) -> Result<Vec<T>> {
        let mut pieces: Vec<T> = (0..self.parts.len()).map(|_| T::default()).collect();
        let sorted = self.order.iter().map(|&i| (i, self.parts[i].clone()));
        for cut in cut_ascending(buf, sorted) {
            let (i, piece) = cut?;
            pieces[i] = T::from(piece);
        }
        Ok(pieces)
    }
}

/// Checks that byte ranges of a buffer of `len` bytes come in ascending
/// order without overlapping and end within it, so that they can be cut
/// out of it, or written by streams of their own, at once.
pub(crate) struct Ascending {
    end: usize,
    len: usize,
}

impl Ascending {
    /// A check of ranges of a buffer of `len` bytes.
    pub(crate) fn within(len: usize) -> Ascending {
        Ascending { end: 0, len }
    }

    /// Checks `part`, the next range: `MPI_ERR_INTERN` if it starts
    /// before the previous one ended or ends beyond the buffer (the
    /// caller's lists are wrong; the user's blocks were checked before).
    pub(crate) fn next(&mut self, part: &Range<usize>) -> Result<()> {
        if part.start < self.end || part.start > part.end || part.end > self.len {
            return Err(Error::new(
                ErrorClass::Intern,
                format!(
                    "a collective's receive block {part:?} is out of order (the previous one \
                     ended at {}) or beyond its {} bytes",
                    self.end, self.len
                ),
            ));
        }
        self.end = part.end;
        Ok(())
    }
}

/// `parts` of `buf` (ascending, not overlapping, as [`Ascending`]
/// checks), each with its key, cut out of it in one pass.
pub(crate) fn cut_ascending<K>(
    buf: &mut [u8],
    parts: impl IntoIterator<Item = (K, Range<usize>)>,
) -> impl Iterator<Item = Result<(K, &mut [u8])>> {
    let mut order = Ascending::within(buf.len());
    let mut rest = buf;
    let mut offset = 0;
    parts.into_iter().map(move |(key, part)| {
        order.next(&part)?;
        let (_, tail) = std::mem::take(&mut rest).split_at_mut(part.start - offset);
        let (piece, tail) = tail.split_at_mut(part.len());
        rest = tail;
        offset = part.end;
        Ok((key, piece))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_checked_against_the_buffer() {
        let t = ElementType::of::<u32>();
        assert_eq!(
            blocks(&[1, 2], &[3, 0], (BlockOwner::Rank, 2), t, 16).unwrap(),
            [12..16, 0..8]
        );
        let class = |r: Result<Vec<Range<usize>>>| r.unwrap_err().class();
        assert_eq!(
            class(blocks(&[1], &[0], (BlockOwner::Rank, 2), t, 16)),
            ErrorClass::Arg
        );
        assert_eq!(
            class(blocks(&[-1, 0], &[0, 0], (BlockOwner::Rank, 2), t, 16)),
            ErrorClass::Count
        );
        assert_eq!(
            class(blocks(&[1, 0], &[-1, 0], (BlockOwner::Rank, 2), t, 16)),
            ErrorClass::Arg
        );
        assert_eq!(
            class(blocks(&[2, 0], &[3, 0], (BlockOwner::Rank, 2), t, 16)),
            ErrorClass::Count
        );
        assert_eq!(
            consecutive_blocks(&[2, 0, 1], 3, t).unwrap(),
            [0..8, 8..8, 8..12]
        );
    }

    #[test]
    fn receive_blocks_split_without_overlap() {
        let parts = [8..12, 0..4, 4..4, 4..8];
        let mut buf: Vec<u8> = (0..12).collect();
        let pieces: Vec<&mut [u8]> = disjoint_blocks(12, &parts, BlockOwner::Rank)
            .unwrap()
            .split(&mut buf)
            .unwrap();
        let lens: Vec<&[u8]> = pieces.iter().map(|p| &**p).collect();
        assert_eq!(
            lens,
            [&[8, 9, 10, 11][..], &[0, 1, 2, 3], &[], &[4, 5, 6, 7]]
        );
        let overlapping = [0..4, 3..6];
        let e = disjoint_blocks(6, &overlapping, BlockOwner::Rank)
            .err()
            .unwrap();
        assert_eq!(e.class(), ErrorClass::Arg);
        assert!(
            e.to_string().contains("blocks of ranks 0 and 1 overlap"),
            "{e}"
        );
    }

    #[test]
    fn neighbourhood_blocks_are_named_by_neighbour_not_by_rank() {
        let e = disjoint_blocks(6, &[0..4, 3..6], BlockOwner::SourceNeighbor)
            .err()
            .unwrap();
        assert!(
            e.to_string()
                .contains("blocks of source neighbours 0 and 1 (positions in this process's list of sources) overlap"),
            "{e}"
        );
        let t = ElementType::of::<u32>();
        let e = blocks(&[1], &[0], (BlockOwner::DestinationNeighbor, 2), t, 16).unwrap_err();
        assert!(
            e.to_string()
                .contains("1 counts and 1 displacements for 2 destination neighbours"),
            "{e}"
        );
        let e = blocks(&[2, 0], &[3, 0], (BlockOwner::SourceNeighbor, 2), t, 16).unwrap_err();
        assert!(
            e.to_string()
                .contains("source neighbour 0's block (elements 3..5)"),
            "{e}"
        );
    }
}
