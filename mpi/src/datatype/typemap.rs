//! Type maps (MPI 4.1 §5.1): what a datatype is, apart from any buffer.
//!
//! A [`TypeNode`] is one datatype, predefined or made by a constructor. It
//! keeps
//! - how it was made ([`Kind`]), sharing the datatypes it was made from;
//! - its [`Shape`] — size, bounds, true bounds, alignment — computed by the
//!   standard's rules when it is made (MPI 4.1 §5.1.6 – §5.1.8);
//! - its type signature ([`Signature`]): the sequence of basic types, kept
//!   compressed, for `MPI_Get_elements` and external32;
//! - once asked for (at commit, or when a type made from it is flattened),
//!   its flattened form: the bytes one element covers, as [`Run`]s of
//!   equally long, equally spaced segments, in type-map order, with
//!   neighbouring segments merged.
//!
//! Nothing here touches memory: offsets are numbers, checked against a
//! buffer by the views that use them.

use super::primitive::Primitive;
use crate::{Error, ErrorClass, Result};

#[cfg(test)]
use std::ops::ControlFlow;
use std::sync::{Arc, OnceLock};

/// Size, bounds and alignment of a datatype.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Shape {
    /// Bytes of data in one element (`MPI_Type_size`).
    pub size: usize,
    /// Lower bound (`MPI_Type_get_extent`'s `lb`).
    pub lb: isize,
    /// Upper bound; the extent is `ub - lb`.
    pub ub: isize,
    /// The bounds of the data itself (`MPI_Type_get_true_extent`): lowest
    /// and one past the highest byte; `None` when the type has no data.
    pub data: Option<(isize, isize)>,
    /// The largest alignment of the basic types in it (1 if none).
    pub align: usize,
    /// The bounds were set by `MPI_Type_create_resized`: its lower- and
    /// upper-bound markers are in the type map, and they, not the data,
    /// bound every type made from this one (MPI 4.1 §5.1.7).
    pub explicit: bool,
}

impl Shape {
    /// The shape of a predefined type.
    pub(crate) fn of_primitive(primitive: Primitive) -> Shape {
        let size = primitive.size();
        Shape {
            size,
            lb: 0,
            ub: size as isize,
            data: Some((0, size as isize)),
            align: primitive.align(),
            explicit: false,
        }
    }

    pub(crate) fn extent(&self) -> isize {
        self.ub - self.lb
    }

    pub(crate) fn true_lb(&self) -> isize {
        self.data.map_or(0, |(lo, _)| lo)
    }

    pub(crate) fn true_extent(&self) -> isize {
        self.data.map_or(0, |(lo, hi)| hi - lo)
    }
}

/// How a datatype was made.
#[derive(Debug)]
enum Kind {
    Primitive(Primitive),
    /// Copies of one type in blocks: contiguous, (h)vector, (h)indexed,
    /// (h)indexed_block.
    Blocks {
        old: Arc<TypeNode>,
        blocks: Blocks,
    },
    /// `MPI_Type_create_struct`: blocks of different types.
    Struct {
        fields: Vec<Field>,
    },
    /// `MPI_Type_create_resized`: the old type's data, new bounds.
    Resized {
        old: Arc<TypeNode>,
    },
}

/// Where the blocks of a [`Kind::Blocks`] type are: block `k` holds
/// copies of the old type, one extent apart, from its displacement (in
/// bytes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Blocks {
    /// `count` blocks of `len` copies, block `k` at `k * stride`.
    Strided {
        count: usize,
        len: usize,
        stride: isize,
    },
    /// One block of `len` copies at each `displacement`.
    Listed(Vec<(isize, usize)>),
}

impl Blocks {
    /// Calls `f(displacement, len)` for each block, in order. Displacements
    /// wrap rather than overflow: the type's bounds were checked to fit.
    fn for_each(&self, mut f: impl FnMut(isize, usize)) {
        match self {
            Blocks::Strided { count, len, stride } => {
                for k in 0..*count {
                    f((k as isize).wrapping_mul(*stride), *len);
                }
            }
            Blocks::Listed(list) => list.iter().for_each(|&(d, len)| f(d, len)),
        }
    }
}

/// One block of a struct type: `count` copies of `old` from byte
/// `displacement`.
#[derive(Debug, Clone)]
pub(crate) struct Field {
    pub displacement: isize,
    pub count: usize,
    pub old: Arc<TypeNode>,
}

/// `count` segments of `len` bytes, the first at `offset`, each next one
/// `stride` bytes after the one before. A run of one segment has stride 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Run {
    pub offset: isize,
    pub len: usize,
    pub count: usize,
    pub stride: isize,
}

impl Run {
    /// `count` segments of `len` bytes, the first at `offset`, `stride`
    /// apart.
    pub(crate) fn new(offset: isize, len: usize, count: usize, stride: isize) -> Run {
        Run {
            offset,
            len,
            count,
            stride,
        }
    }

    fn segment(offset: isize, len: usize) -> Run {
        Run::new(offset, len, 1, 0)
    }

    /// The bytes its segments span, from the start of the lowest to the
    /// end of the highest (every other lies between the first and the
    /// last), exactly: in `i128`, which no run's offsets overflow.
    pub(crate) fn span(&self) -> (i128, i128) {
        let first = self.offset as i128;
        let last = first + (self.count as i128 - 1) * self.stride as i128;
        (first.min(last), first.max(last) + self.len as i128)
    }

    /// Its segments (offset, length), in order. Offsets wrap rather than
    /// overflow: the caller checked that they fit.
    pub(crate) fn segments(self) -> impl Iterator<Item = (isize, usize)> {
        (0..self.count).map(move |k| {
            let offset = self
                .offset
                .wrapping_add((k as isize).wrapping_mul(self.stride));
            (offset, self.len)
        })
    }

    fn last_offset(&self) -> isize {
        self.offset
            .wrapping_add((self.count as isize - 1).wrapping_mul(self.stride))
    }

    /// Where a segment after the last would start.
    fn next_offset(&self) -> isize {
        self.offset
            .wrapping_add((self.count as isize).wrapping_mul(self.stride))
    }
}

/// Flattens a type map into runs: segments are pushed in type-map order;
/// one that starts where the last one ends is merged with it, and one as
/// long as the segments of the last run, where that run's next would
/// start, extends the run.
#[derive(Default)]
struct RunBuilder {
    runs: Vec<Run>,
}

impl RunBuilder {
    fn push(&mut self, offset: isize, len: usize) {
        if len == 0 {
            return;
        }
        if let Some(last) = self.runs.last_mut() {
            let last_start = last.last_offset();
            if last_start.wrapping_add(last.len as isize) == offset {
                // The new bytes continue the last segment: it grows, and
                // so leaves its run if it was in one.
                if last.count == 1 {
                    last.len += len;
                } else {
                    last.count -= 1;
                    if last.count == 1 {
                        last.stride = 0;
                    }
                    let grown = Run::segment(last_start, last.len + len);
                    self.runs.push(grown);
                }
                return;
            }
        }
        // The last segment is complete: a lone one may join the run
        // before it.
        self.seal();
        if let Some(last) = self.runs.last_mut() {
            if last.len == len {
                if last.count == 1 {
                    last.stride = offset.wrapping_sub(last.offset);
                    last.count = 2;
                    return;
                }
                if offset == last.next_offset() {
                    last.count += 1;
                    return;
                }
            }
        }
        self.runs.push(Run::segment(offset, len));
    }

    /// Pushes the segments of `run`, moved by `shift`.
    fn push_run(&mut self, run: &Run, shift: isize) {
        let first = run.offset.wrapping_add(shift);
        self.push(first, run.len);
        if run.count == 1 {
            return;
        }
        // The other segments are not adjacent to one another (a run is
        // never made of touching segments), so only the first can merge
        // with what came before; the rest go in as one run.
        let rest = Run {
            offset: first.wrapping_add(run.stride),
            len: run.len,
            count: run.count - 1,
            stride: run.stride,
        };
        if rest.count == 1 {
            self.push(rest.offset, rest.len);
            return;
        }
        self.seal();
        if let Some(last) = self.runs.last_mut() {
            let joins = last.len == rest.len
                && if last.count == 1 {
                    rest.offset.wrapping_sub(last.offset) == rest.stride
                } else {
                    last.stride == rest.stride && rest.offset == last.next_offset()
                };
            if joins {
                last.stride = rest.stride;
                last.count += rest.count;
                return;
            }
        }
        self.runs.push(rest);
    }

    /// A lone segment at the end joins the run before it when it is that
    /// run's next segment.
    fn seal(&mut self) {
        let [.., before, last] = self.runs.as_mut_slice() else {
            return;
        };
        if last.count != 1 || before.len != last.len {
            return;
        }
        if before.count == 1 {
            before.stride = last.offset.wrapping_sub(before.offset);
            before.count = 2;
        } else if last.offset == before.next_offset() {
            before.count += 1;
        } else {
            return;
        }
        self.runs.pop();
    }

    fn finish(mut self) -> Box<[Run]> {
        self.seal();
        self.runs.into_boxed_slice()
    }
}

/// Calls `f(offset, len)` for each segment of `count` elements of a type
/// whose element is `runs`, elements `extent` apart, in order; stops when
/// `f` breaks. Offsets wrap rather than overflow: the caller checked that
/// they fit its buffer.
#[cfg(test)]
fn for_each_segment(
    runs: &[Run],
    extent: isize,
    count: usize,
    f: impl FnMut(isize, usize) -> ControlFlow<()>,
) -> ControlFlow<()> {
    Segments::new(runs, extent, count).for_each(f)
}

/// The segments of `count` elements of a flattened type (its `runs`,
/// elements `extent` apart), walked piece by piece with a [`Cursor`]:
/// the packed stream of the elements is their segments' bytes one after
/// another, and any byte range of it can be visited where it lies in the
/// buffer. Pack, unpack (whole or in pieces), `MPI_Pack` and the device's
/// streaming all walk with this one cursor.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Segments<'r> {
    runs: &'r [Run],
    extent: isize,
    count: usize,
    /// Packed bytes of one element (the runs' lengths added up).
    element_size: usize,
}

/// A place in the packed stream of a [`Segments`]: the element, the run
/// in it, the segment of the run and the byte in the segment, and the
/// stream offset they make. Starts at offset 0 (`Default`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Cursor {
    element: usize,
    run: usize,
    rep: usize,
    within: usize,
    position: usize,
}

impl Cursor {
    /// The offset in the packed stream the cursor stands at.
    pub(crate) fn position(&self) -> usize {
        self.position
    }

    fn next_run(&mut self, runs: usize) {
        self.run += 1;
        self.rep = 0;
        self.within = 0;
        if self.run >= runs {
            self.run = 0;
            self.element += 1;
        }
    }

    fn at_element_start(&self) -> bool {
        self.run == 0 && self.rep == 0 && self.within == 0
    }
}

impl<'r> Segments<'r> {
    /// The segments of `count` elements of `runs`, `extent` apart.
    pub(crate) fn new(runs: &'r [Run], extent: isize, count: usize) -> Segments<'r> {
        let element_size = runs.iter().fold(0usize, |n, r| {
            n.saturating_add(r.len.saturating_mul(r.count))
        });
        Segments {
            runs,
            extent,
            count,
            element_size,
        }
    }

    /// Calls `f(offset, len)` for each segment, in order, from the start;
    /// stops when `f` breaks. The whole walk of a cursor (the tests'
    /// view of a type map).
    #[cfg(test)]
    pub(crate) fn for_each(
        &self,
        mut f: impl FnMut(isize, usize) -> ControlFlow<()>,
    ) -> ControlFlow<()> {
        let walked = self.advance(&mut Cursor::default(), usize::MAX, |offset, len| {
            match f(offset, len) {
                ControlFlow::Continue(()) => Ok(()),
                ControlFlow::Break(()) => Err(()),
            }
        });
        match walked {
            Ok(_) => ControlFlow::Continue(()),
            Err(()) => ControlFlow::Break(()),
        }
    }

    /// Length of the packed stream.
    pub(crate) fn len(&self) -> usize {
        self.count.saturating_mul(self.element_size)
    }

    /// Moves `cursor` to stream offset `to` (at most [`Segments::len`]):
    /// forward from where it is, skipping whole elements and whole
    /// segments of a run at once; a cursor past `to` starts over.
    pub(crate) fn seek(&self, cursor: &mut Cursor, to: usize) {
        let to = to.min(self.len());
        if to < cursor.position {
            *cursor = Cursor::default();
        }
        while cursor.position < to && cursor.element < self.count {
            let left = to - cursor.position;
            if cursor.at_element_start() && self.element_size > 0 && left >= self.element_size {
                let skip = left / self.element_size;
                cursor.element += skip;
                cursor.position += skip * self.element_size;
                continue;
            }
            let run = &self.runs[cursor.run];
            let in_run = run
                .count
                .saturating_sub(cursor.rep)
                .saturating_mul(run.len)
                .saturating_sub(cursor.within);
            if left >= in_run {
                cursor.position += in_run;
                cursor.next_run(self.runs.len());
                continue;
            }
            let into = cursor.within + left;
            cursor.rep += into / run.len;
            cursor.within = into % run.len;
            cursor.position = to;
        }
    }

    /// Visits the next `len` bytes of the stream from `cursor` (fewer if
    /// the stream ends first) as `f(buffer offset, bytes)` pieces, each
    /// within one segment, in order, and moves the cursor past them.
    /// Returns the bytes visited, or `f`'s first error (the cursor then
    /// stands after the pieces `f` accepted). Offsets wrap rather than
    /// overflow: the caller checked the buffer's bounds.
    pub(crate) fn advance<E>(
        &self,
        cursor: &mut Cursor,
        len: usize,
        mut f: impl FnMut(isize, usize) -> Result<(), E>,
    ) -> Result<usize, E> {
        let mut walked = 0;
        while walked < len && cursor.element < self.count && !self.runs.is_empty() {
            let run = &self.runs[cursor.run];
            if cursor.rep >= run.count || run.len == 0 {
                cursor.next_run(self.runs.len());
                continue;
            }
            let n = (run.len - cursor.within).min(len - walked);
            let offset = (cursor.element as isize)
                .wrapping_mul(self.extent)
                .wrapping_add(run.offset)
                .wrapping_add((cursor.rep as isize).wrapping_mul(run.stride))
                .wrapping_add(cursor.within as isize);
            f(offset, n)?;
            walked += n;
            cursor.position += n;
            cursor.within += n;
            if cursor.within == run.len {
                cursor.within = 0;
                cursor.rep += 1;
                if cursor.rep == run.count {
                    cursor.next_run(self.runs.len());
                }
            }
        }
        Ok(walked)
    }
}

/// A type signature: the basic types of one element in type-map order,
/// as runs of one basic type and repeats of another signature.
#[derive(Debug, PartialEq)]
pub(crate) struct Signature {
    parts: Vec<Part>,
    /// Number of basic elements.
    elements: usize,
    /// Their total size in bytes (the type's size).
    size: usize,
}

#[derive(Debug, PartialEq)]
enum Part {
    /// `count` values of one basic type.
    Basic(Primitive, usize),
    /// `count` copies of a signature of several basic types.
    Repeat(usize, Arc<Signature>),
}

impl Part {
    fn elements(&self) -> usize {
        match self {
            Part::Basic(_, n) => *n,
            Part::Repeat(n, s) => n * s.elements,
        }
    }

    fn size(&self) -> usize {
        match self {
            Part::Basic(p, n) => n * p.size(),
            Part::Repeat(n, s) => n * s.size,
        }
    }
}

impl Signature {
    fn new(parts: Vec<Part>) -> Arc<Signature> {
        Arc::new(Signature {
            elements: parts.iter().map(Part::elements).sum(),
            size: parts.iter().map(Part::size).sum(),
            parts,
        })
    }

    /// The signature of blocks of copies of types: `count` copies of
    /// `signature` for each item, in order.
    fn concat<'a>(items: impl IntoIterator<Item = (usize, &'a Arc<Signature>)>) -> Arc<Signature> {
        let mut parts: Vec<Part> = Vec::new();
        let mut push = |part: Part| match (parts.last_mut(), &part) {
            (Some(Part::Basic(p, n)), Part::Basic(q, m)) if p == q => *n += m,
            _ => parts.push(part),
        };
        for (count, signature) in items {
            if count == 0 || signature.elements == 0 {
                continue;
            }
            match signature.parts.as_slice() {
                [Part::Basic(p, n)] => push(Part::Basic(*p, n * count)),
                [Part::Repeat(n, inner)] => push(Part::Repeat(n * count, inner.clone())),
                _ if count == 1 => signature.parts.iter().for_each(|part| {
                    push(match part {
                        Part::Basic(p, n) => Part::Basic(*p, *n),
                        Part::Repeat(n, inner) => Part::Repeat(*n, inner.clone()),
                    })
                }),
                _ => push(Part::Repeat(count, signature.clone())),
            }
        }
        Signature::new(parts)
    }

    /// The number of basic elements in the first `bytes` bytes of a
    /// message of such elements (`MPI_Get_elements`), or `None` when
    /// `bytes` ends inside a basic element (`MPI_UNDEFINED`).
    pub(crate) fn elements_in(&self, bytes: usize) -> Option<usize> {
        if self.size == 0 {
            return (bytes == 0).then_some(0);
        }
        let whole = bytes / self.size;
        Some(whole * self.elements + self.elements_in_part(bytes % self.size)?)
    }

    /// Like [`Signature::elements_in`] for less than one element.
    fn elements_in_part(&self, mut bytes: usize) -> Option<usize> {
        let mut elements = 0;
        for part in &self.parts {
            if bytes == 0 {
                break;
            }
            if bytes >= part.size() {
                elements += part.elements();
                bytes -= part.size();
                continue;
            }
            return match part {
                Part::Basic(p, _) => bytes
                    .is_multiple_of(p.size())
                    .then(|| elements + bytes / p.size()),
                Part::Repeat(_, inner) => {
                    let inside = inner.elements_in(bytes)?;
                    Some(elements + inside)
                }
            };
        }
        Some(elements)
    }

    /// Calls `f(basic type, count)` for runs of the basic elements of
    /// `times` elements, in order.
    pub(crate) fn for_each_basic(&self, times: usize, f: &mut impl FnMut(Primitive, usize)) {
        if let [Part::Basic(p, n)] = self.parts.as_slice() {
            f(*p, n * times);
            return;
        }
        for _ in 0..times {
            for part in &self.parts {
                match part {
                    Part::Basic(p, n) => f(*p, *n),
                    Part::Repeat(n, inner) => inner.for_each_basic(*n, f),
                }
            }
        }
    }
}

/// One datatype; see the module docs.
#[derive(Debug)]
pub(crate) struct TypeNode {
    kind: Kind,
    shape: Shape,
    signature: Arc<Signature>,
    runs: OnceLock<Box<[Run]>>,
}

/// Bounds of copies of types, gathered in wide integers so that no sum
/// overflows before the result is checked.
#[derive(Default)]
struct Bounds {
    /// Bounds of the copies whose types have markers.
    marked: Option<(i128, i128)>,
    /// Bounds of the other copies.
    unmarked: Option<(i128, i128)>,
    data: Option<(i128, i128)>,
    align: usize,
}

fn widen(bounds: &mut Option<(i128, i128)>, lo: i128, hi: i128) {
    *bounds = Some(match *bounds {
        Some((l, h)) => (l.min(lo), h.max(hi)),
        None => (lo, hi),
    });
}

impl Bounds {
    /// Adds a block of `len` copies of a type of shape `old` (`len > 0`),
    /// the first at `displacement`.
    fn cover(&mut self, old: &Shape, displacement: i128, len: usize) {
        let last = displacement + (len as i128 - 1) * old.extent() as i128;
        let (first, last) = (displacement.min(last), displacement.max(last));
        let bounds = if old.explicit {
            &mut self.marked
        } else {
            &mut self.unmarked
        };
        widen(bounds, first + old.lb as i128, last + old.ub as i128);
        if let Some((lo, hi)) = old.data {
            widen(&mut self.data, first + lo as i128, last + hi as i128);
        }
        self.align = self.align.max(old.align);
    }

    /// The shape of a type of `size` bytes with these bounds; with
    /// `pad_to_alignment`, a type without markers gets the struct rule's
    /// rounding of its extent to its alignment (MPI 4.1 §5.1.6, the
    /// `epsilon` of `MPI_Type_create_struct`).
    fn shape(self, size: i128, pad_to_alignment: bool) -> Result<Shape> {
        let explicit = self.marked.is_some();
        let (lb, mut ub) = self.marked.or(self.unmarked).unwrap_or((0, 0));
        let align = self.align.max(1);
        let padding = (ub - lb).rem_euclid(align as i128);
        if pad_to_alignment && !explicit && ub > lb && padding != 0 {
            ub += align as i128 - padding;
        }
        // The extents must fit too: both bounds can fit while their
        // difference does not.
        fits::<isize>(ub - lb)?;
        if let Some((lo, hi)) = self.data {
            fits::<isize>(hi - lo)?;
        }
        Ok(Shape {
            size: fits(size)?,
            lb: fits(lb)?,
            ub: fits(ub)?,
            data: match self.data {
                Some((lo, hi)) => Some((fits(lo)?, fits(hi)?)),
                None => None,
            },
            align,
            explicit,
        })
    }
}

/// `value` as an `isize` or `usize`, or the error of a datatype too large
/// for this machine's address space.
pub(crate) fn fits<T: TryFrom<i128>>(value: i128) -> Result<T> {
    T::try_from(value).map_err(|_| {
        Error::new(
            ErrorClass::Type,
            format!(
                "the datatype would reach byte {value}, beyond what an address (isize) can hold"
            ),
        )
    })
}

impl TypeNode {
    /// The predefined datatype of `primitive`.
    pub(crate) fn primitive(primitive: Primitive) -> TypeNode {
        TypeNode {
            kind: Kind::Primitive(primitive),
            shape: Shape::of_primitive(primitive),
            signature: Signature::new(vec![Part::Basic(primitive, 1)]),
            runs: OnceLock::new(),
        }
    }

    /// Copies of `old` in `blocks`.
    pub(crate) fn blocks(old: &Arc<TypeNode>, blocks: Blocks) -> Result<TypeNode> {
        let mut bounds = Bounds::default();
        let mut copies: i128 = 0;
        match &blocks {
            Blocks::Strided { count, len, stride } => {
                if *count > 0 && *len > 0 {
                    let last = (*count as i128 - 1) * *stride as i128;
                    bounds.cover(&old.shape, 0, *len);
                    bounds.cover(&old.shape, last, *len);
                    copies = *count as i128 * *len as i128;
                }
            }
            Blocks::Listed(list) => {
                for &(displacement, len) in list.iter().filter(|(_, len)| *len > 0) {
                    bounds.cover(&old.shape, displacement as i128, len);
                    copies += len as i128;
                }
            }
        }
        let shape = bounds.shape(copies * old.shape.size as i128, false)?;
        let copies = fits::<usize>(copies)?;
        Ok(TypeNode {
            signature: Signature::concat([(copies, &old.signature)]),
            kind: Kind::Blocks {
                old: old.clone(),
                blocks,
            },
            shape,
            runs: OnceLock::new(),
        })
    }

    /// A struct of `fields`, in order.
    pub(crate) fn structure(fields: Vec<Field>) -> Result<TypeNode> {
        let mut bounds = Bounds::default();
        let mut size: i128 = 0;
        for field in fields.iter().filter(|f| f.count > 0) {
            bounds.cover(&field.old.shape, field.displacement as i128, field.count);
            size += field.count as i128 * field.old.shape.size as i128;
        }
        let shape = bounds.shape(size, true)?;
        Ok(TypeNode {
            signature: Signature::concat(fields.iter().map(|f| (f.count, &f.old.signature))),
            kind: Kind::Struct { fields },
            shape,
            runs: OnceLock::new(),
        })
    }

    /// `old` with lower bound `lb` and extent `extent`.
    pub(crate) fn resized(old: &Arc<TypeNode>, lb: isize, extent: isize) -> Result<TypeNode> {
        let ub = lb.checked_add(extent).ok_or_else(|| {
            Error::new(
                ErrorClass::Type,
                format!("lower bound {lb} plus extent {extent} overflows an address (isize)"),
            )
        })?;
        Ok(TypeNode {
            kind: Kind::Resized { old: old.clone() },
            shape: Shape {
                lb,
                ub,
                explicit: true,
                ..old.shape
            },
            signature: old.signature.clone(),
            runs: OnceLock::new(),
        })
    }

    pub(crate) fn shape(&self) -> &Shape {
        &self.shape
    }

    pub(crate) fn signature(&self) -> &Signature {
        &self.signature
    }

    /// The flattened type map of one element (computed once).
    pub(crate) fn runs(&self) -> &[Run] {
        self.runs.get_or_init(|| {
            let mut builder = RunBuilder::default();
            self.flatten(&mut builder);
            builder.finish()
        })
    }

    /// Where the data of `n` consecutive elements starts when it is one
    /// contiguous range in type-map order: one segment per element, and
    /// elements exactly their size apart.
    pub(crate) fn dense_start(&self) -> Option<isize> {
        match self.runs() {
            [run] if run.count == 1 && self.shape.extent() == run.len as isize => Some(run.offset),
            [] if self.shape.size == 0 => Some(0),
            _ => None,
        }
    }

    /// Where the data of `count` elements starts when it is one contiguous
    /// range in type-map order.
    pub(crate) fn contiguous_start(&self, count: usize) -> Option<isize> {
        match self.runs() {
            [run] if count == 1 && run.count == 1 => Some(run.offset),
            _ => self.dense_start(),
        }
    }

    fn flatten(&self, builder: &mut RunBuilder) {
        match &self.kind {
            Kind::Primitive(p) => builder.push(0, p.size()),
            Kind::Blocks { old, blocks } => {
                blocks.for_each(|displacement, len| old.flatten_copies(builder, displacement, len))
            }
            Kind::Struct { fields } => fields
                .iter()
                .for_each(|f| f.old.flatten_copies(builder, f.displacement, f.count)),
            Kind::Resized { old } => old.flatten_copies(builder, 0, 1),
        }
    }

    /// The flattened type map of `count` elements, elements an extent
    /// apart, folded as one element's is ([`TypeNode::runs`]): so
    /// `count` elements of a vector whose blocks stay equally spaced
    /// across elements are one run.
    pub(crate) fn runs_of(&self, count: usize) -> Vec<Run> {
        let mut builder = RunBuilder::default();
        self.flatten_copies(&mut builder, 0, count);
        builder.finish().into_vec()
    }

    /// Pushes `len` copies of this type, the first at `displacement`.
    fn flatten_copies(&self, builder: &mut RunBuilder, displacement: isize, len: usize) {
        if let Some(start) = self.dense_start() {
            let bytes = len * self.shape.size;
            builder.push(displacement.wrapping_add(start), bytes);
            return;
        }
        let extent = self.shape.extent();
        let runs = self.runs();
        for copy in 0..len {
            let shift = displacement.wrapping_add((copy as isize).wrapping_mul(extent));
            runs.iter().for_each(|run| builder.push_run(run, shift));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prim(p: Primitive) -> Arc<TypeNode> {
        Arc::new(TypeNode::primitive(p))
    }

    fn runs_of(segments: &[(isize, usize)]) -> Vec<Run> {
        let mut b = RunBuilder::default();
        segments.iter().for_each(|&(o, l)| b.push(o, l));
        b.finish().into_vec()
    }

    fn segments(node: &TypeNode, count: usize) -> Vec<(isize, usize)> {
        let mut out = Vec::new();
        let _ = for_each_segment(node.runs(), node.shape().extent(), count, |o, l| {
            out.push((o, l));
            ControlFlow::Continue(())
        });
        out
    }

    fn run(offset: isize, len: usize, count: usize, stride: isize) -> Run {
        Run::new(offset, len, count, stride)
    }

    #[test]
    fn adjacent_segments_merge_and_equal_spacing_makes_runs() {
        assert_eq!(runs_of(&[(0, 4), (4, 4), (8, 8)]), [run(0, 16, 1, 0)]);
        assert_eq!(runs_of(&[(0, 8), (16, 8), (32, 8)]), [run(0, 8, 3, 16)]);
        // A segment that grows leaves its run.
        assert_eq!(
            runs_of(&[(0, 8), (16, 8), (24, 8)]),
            [run(0, 8, 1, 0), run(16, 16, 1, 0)]
        );
        // Type-map order is kept: backwards segments are not merged.
        assert_eq!(runs_of(&[(8, 8), (0, 8)]), [run(8, 8, 2, -8)]);
        // Empty segments vanish; different lengths start new runs.
        assert_eq!(
            runs_of(&[(0, 2), (5, 0), (10, 2), (20, 4)]),
            [run(0, 2, 2, 10), run(20, 4, 1, 0)]
        );
        // The two halves of a strided pattern join when sealed.
        assert_eq!(
            runs_of(&[(0, 8), (16, 8), (32, 4), (36, 4)]),
            [run(0, 8, 3, 16)]
        );
    }

    #[test]
    fn vectors_flatten_to_one_run_and_contiguous_ones_to_one_segment() {
        let f64t = prim(Primitive::F64);
        let vector = |count, len, stride: isize| {
            TypeNode::blocks(
                &f64t,
                Blocks::Strided {
                    count,
                    len,
                    stride: stride * 8,
                },
            )
            .unwrap()
        };
        let v = vector(1000, 2, 5);
        assert_eq!(v.runs(), [run(0, 16, 1000, 40)]);
        assert_eq!(
            *v.shape(),
            Shape {
                size: 16_000,
                lb: 0,
                ub: 999 * 40 + 16,
                data: Some((0, 999 * 40 + 16)),
                align: 8,
                explicit: false
            }
        );
        assert_eq!(v.dense_start(), None);
        let dense = vector(10, 3, 3);
        assert_eq!(dense.runs(), [run(0, 240, 1, 0)]);
        assert_eq!(dense.dense_start(), Some(0));
        // A vector of vectors: each inner run continues the last.
        let inner = Arc::new(vector(3, 1, 2));
        let outer = TypeNode::blocks(
            &inner,
            Blocks::Strided {
                count: 2,
                len: 1,
                stride: 48,
            },
        )
        .unwrap();
        assert_eq!(outer.runs(), [run(0, 8, 6, 16)]);
        assert_eq!(
            segments(&outer, 1),
            [(0, 8), (16, 8), (32, 8), (48, 8), (64, 8), (80, 8)]
        );
    }

    #[test]
    fn negative_strides_and_displacements_keep_type_map_order() {
        let i32t = prim(Primitive::I32);
        let v = TypeNode::blocks(
            &i32t,
            Blocks::Strided {
                count: 3,
                len: 1,
                stride: -8,
            },
        )
        .unwrap();
        assert_eq!(segments(&v, 1), [(0, 4), (-8, 4), (-16, 4)]);
        let s = v.shape();
        assert_eq!((s.lb, s.ub, s.extent(), s.true_lb()), (-16, 4, 20, -16));
        let listed =
            TypeNode::blocks(&i32t, Blocks::Listed(vec![(12, 1), (-4, 2), (40, 0)])).unwrap();
        assert_eq!(segments(&listed, 1), [(12, 4), (-4, 8)]);
        assert_eq!((listed.shape().lb, listed.shape().ub), (-4, 16));
        assert_eq!(listed.shape().size, 12);
    }

    #[test]
    fn resized_markers_win_over_data_when_nested() {
        let i32t = prim(Primitive::I32);
        let r = Arc::new(TypeNode::resized(&i32t, -4, 12).unwrap());
        let s = *r.shape();
        assert_eq!(
            (s.lb, s.ub, s.extent(), s.data, s.explicit),
            (-4, 8, 12, Some((0, 4)), true)
        );
        // Copies are one (new) extent apart.
        let c = TypeNode::blocks(
            &r,
            Blocks::Strided {
                count: 1,
                len: 3,
                stride: 0,
            },
        )
        .unwrap();
        assert_eq!(segments(&c, 1), [(0, 4), (12, 4), (24, 4)]);
        assert_eq!((c.shape().lb, c.shape().ub), (-4, 32));
        assert_eq!(c.shape().data, Some((0, 28)));
        // In a struct, the markers of the resized field bound the type and
        // the plain int at 100 does not.
        let st = TypeNode::structure(vec![
            Field {
                displacement: 0,
                count: 1,
                old: r.clone(),
            },
            Field {
                displacement: 100,
                count: 1,
                old: i32t.clone(),
            },
        ])
        .unwrap();
        let s = st.shape();
        assert_eq!((s.lb, s.ub, s.explicit), (-4, 8, true));
        assert_eq!((s.true_lb(), s.true_extent()), (0, 104));
        // A negative extent: copies go downwards. The bounds are the
        // lowest lb marker (-8) and the highest ub marker (0 - 4).
        let down = Arc::new(TypeNode::resized(&i32t, 0, -4).unwrap());
        let c = TypeNode::blocks(
            &down,
            Blocks::Strided {
                count: 1,
                len: 3,
                stride: 0,
            },
        )
        .unwrap();
        assert_eq!(segments(&c, 1), [(0, 4), (-4, 4), (-8, 4)]);
        assert_eq!((c.shape().lb, c.shape().ub), (-8, -4));
        assert_eq!(c.shape().data, Some((-8, 4)));
    }

    #[test]
    fn structs_round_their_extent_to_the_largest_alignment() {
        let st = TypeNode::structure(vec![
            Field {
                displacement: 0,
                count: 1,
                old: prim(Primitive::F64),
            },
            Field {
                displacement: 8,
                count: 1,
                old: prim(Primitive::U8),
            },
        ])
        .unwrap();
        assert_eq!((st.shape().size, st.shape().extent()), (9, 16));
        assert_eq!(st.shape().true_extent(), 9);
        assert_eq!(st.runs(), [run(0, 9, 1, 0)]);
        // Not dense: the next element starts 7 bytes after this one ends.
        assert_eq!(st.dense_start(), None);
        let empty = TypeNode::structure(vec![]).unwrap();
        assert_eq!(
            *empty.shape(),
            Shape {
                size: 0,
                lb: 0,
                ub: 0,
                data: None,
                align: 1,
                explicit: false
            }
        );
        assert_eq!(empty.dense_start(), Some(0));
    }

    #[test]
    fn sizes_beyond_an_address_are_type_errors() {
        let big = Arc::new(
            TypeNode::blocks(
                &prim(Primitive::U8),
                Blocks::Strided {
                    count: 1,
                    len: 1 << 40,
                    stride: 0,
                },
            )
            .unwrap(),
        );
        let e = TypeNode::blocks(
            &big,
            Blocks::Strided {
                count: 1 << 30,
                len: 1 << 30,
                stride: 0,
            },
        )
        .unwrap_err();
        assert_eq!(e.class(), ErrorClass::Type);
        assert_eq!(
            TypeNode::resized(&big, isize::MAX, 1).unwrap_err().class(),
            ErrorClass::Type
        );
    }

    #[test]
    fn signatures_count_basic_elements_and_partial_ones_are_undefined() {
        // (int, short, int, short): 10 bytes hold 3 elements, 8 bytes end
        // inside the second int.
        let pair = Arc::new(
            TypeNode::structure(vec![
                Field {
                    displacement: 0,
                    count: 1,
                    old: prim(Primitive::I32),
                },
                Field {
                    displacement: 4,
                    count: 1,
                    old: prim(Primitive::I16),
                },
            ])
            .unwrap(),
        );
        let two = TypeNode::blocks(
            &pair,
            Blocks::Strided {
                count: 2,
                len: 1,
                stride: 8,
            },
        )
        .unwrap();
        let sig = two.signature();
        assert_eq!(sig.elements_in(10), Some(3));
        assert_eq!(sig.elements_in(8), None);
        assert_eq!(sig.elements_in(12), Some(4));
        assert_eq!(sig.elements_in(12 + 6), Some(6));
        assert_eq!(sig.elements_in(0), Some(0));
        let mut runs = Vec::new();
        sig.for_each_basic(2, &mut |p, n| runs.push((p, n)));
        assert_eq!(runs.len(), 8);
        assert_eq!(runs[..2], [(Primitive::I32, 1), (Primitive::I16, 1)]);
        // Homogeneous types collapse to one run however they nest.
        let v = Arc::new(
            TypeNode::blocks(
                &prim(Primitive::F32),
                Blocks::Listed(vec![(0, 3), (100, 2)]),
            )
            .unwrap(),
        );
        let vv = TypeNode::blocks(
            &v,
            Blocks::Strided {
                count: 4,
                len: 1,
                stride: 200,
            },
        )
        .unwrap();
        assert_eq!(
            *vv.signature(),
            Signature {
                parts: vec![Part::Basic(Primitive::F32, 20)],
                elements: 20,
                size: 80
            }
        );
        let empty = TypeNode::structure(vec![]).unwrap();
        assert_eq!(empty.signature().elements_in(0), Some(0));
        assert_eq!(empty.signature().elements_in(1), None);
    }
}
