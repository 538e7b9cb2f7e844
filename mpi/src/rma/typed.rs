//! Operations with a target datatype (MPI 4.1 §12.3: the
//! `target_count` and `target_datatype` of `MPI_Put`, `MPI_Get`,
//! `MPI_Accumulate` and `MPI_Get_accumulate`): the data lands in, or
//! comes from, the blocks of `target_count` elements of the target
//! datatype's type map, relative to the target displacement, rather than
//! packed bytes from it.
//!
//! Checked at the origin before anything moves: the origin's and the
//! target's type signatures are the same sequence of basic types
//! (`MPI_ERR_TYPE`; an accumulate's are besides of one basic type
//! throughout, or of one value-index pair type, as the contiguous forms
//! require), and every block lies in
//! the target's window (`MPI_ERR_RMA_RANGE`; in a dynamic window, whose
//! memory only the target knows, the target checks it). The target
//! layout is flattened into runs (`count` segments of `len` bytes,
//! `stride` apart: a vector is one run), and then:
//!
//! - over active messages the operation is one message with the runs
//!   and the packed data ([`FLAG_LAYOUT`](super::wire::FLAG_LAYOUT)), or
//!   several when it has more than [`PART_DATA`] bytes or [`MAX_RUNS`]
//!   runs ([`layout_parts`]); the target checks every segment of a
//!   message against its window before it touches any, then scatters
//!   the data into them (put, accumulate) or gathers its reply from them
//!   (get, get_accumulate), the whole message under its window's state
//!   as a contiguous operation is. So nothing lands of an operation of one
//!   message that reaches outside the window, a dynamic window's
//!   included; an operation of several messages that writes into a
//!   dynamic window asks the target to check all their layouts first
//!   (a round trip), so nothing of it lands either;
//! - on the direct path and over RDMA the operation is one operation on
//!   the segments (adjacent ones merged, [`Segment`]s), in type-map
//!   order, with no packing at the target: a put or a get the segments'
//!   copies (or WRITEs and READs, posted as lists of work requests, all
//!   before any is waited for);
//!   an accumulate takes the locks it needs once for all its segments
//!   (`direct::accumulate_segments`, `rdma::accumulate_segments`: each
//!   region mutex at most once, or the accumulate mutex once). Neither
//!   takes dynamic windows, and the origin's range check covered every
//!   segment before the first moved.
//!
//! An accumulate's segments may cut its elements: a value-index pair
//! with padding between value and index (`MPI_SHORT_INT` as C lays it
//! out) or with the index first. Messages are cut between packed
//! elements, and every path then combines the elements whole: the
//! target's bytes gathered packed, combined and scattered back, under
//! the same locks, so the accumulate stays atomic per element.
//!
//! The contiguous forms ([`Window::put`] and the others) keep their own
//! checks and paths; over active messages both build their messages
//! from [`Part`]s (`path.rs`), a contiguous part having no layout.

use super::path::{self, Fetch, Part, Path, Segment, Target};
use super::wire::{AccumulateType, HEADER, MAX_RUNS};
use super::{
    accumulate_element, completed, fetch_accumulate, wait_fetched, AccumulateOp, CreateFlavor,
    Window,
};
use super::{direct, rdma};
use crate::collective::typed::Input;
use crate::datatype::{
    Buffer, BufferMut, Datatype, DatatypeRef, ElementType, Handle, Incoming, Outgoing, Primitive,
    Run,
};
use crate::request::Request;
use crate::{Error, ErrorClass, Result, PROC_NULL};
use oxmpi_adi::proto::MAX_ACTIVE_LEN;
use std::ops::Range;

/// The most data one message of a typed operation over active messages
/// carries: half the active-message limit, so that the message with its
/// layout of at most [`MAX_RUNS`] runs, and the reply with the data, fit
/// in one. A multiple of every basic type's size, so that an accumulate
/// is cut between elements.
const PART_DATA: usize = MAX_ACTIVE_LEN as usize / 2;
const _: () = assert!(HEADER + 8 + 32 * MAX_RUNS + PART_DATA <= MAX_ACTIVE_LEN as usize);
const _: () = assert!(PART_DATA.is_multiple_of(16));

/// Where an operation's data lies in the target's window (MPI's
/// `target_count` and `target_datatype`): `count` elements of
/// `datatype`, its type map taken from the target displacement.
#[derive(Clone, Copy, Debug)]
pub struct TargetLayout<'t> {
    datatype: DatatypeRef<'t>,
    count: usize,
}

impl<'t> TargetLayout<'t> {
    /// `count` elements of the committed `datatype` (any constructor).
    pub fn new<D: Datatype + ?Sized>(count: usize, datatype: &'t D) -> TargetLayout<'t> {
        TargetLayout {
            datatype: datatype.as_datatype_ref(),
            count,
        }
    }
}

/// Where an operation's data goes at its target: the target, its path,
/// and the target layout's runs in type-map order, their offsets from
/// byte displacement `start` in the target's window (the origin checked
/// that every segment lies in it, where it knows the window), whose
/// segments' lengths add up to the packed data's.
struct Blocks<'w> {
    to: Target<'w>,
    path: &'w Path,
    start: u64,
    runs: Vec<Run>,
    /// Whether the window is dynamic: only the target knows its memory.
    dynamic: bool,
}

impl Blocks<'_> {
    /// The segments of the target layout (adjacent ones merged), in
    /// type-map order, at their byte displacements in the target's window
    /// (`target_blocks` checked every one), with their ranges of the
    /// packed data, which they cover: `len` bytes (else an internal
    /// error: the signatures matched).
    fn segments(&self, len: usize) -> Result<Vec<Segment>> {
        let mut segments = Vec::new();
        let mut at = 0;
        for run in &self.runs {
            for (offset, n) in run.segments() {
                // At least 0 and within the window: `target_blocks`
                // checked every segment.
                let disp = self.start.wrapping_add_signed(offset as i64);
                segments.push(Segment {
                    disp,
                    data: at..at + n,
                });
                at += n;
            }
        }
        if at != len {
            return Err(Error::new(
                ErrorClass::Intern,
                format!("a target layout of {at} bytes for {len} bytes of packed data"),
            ));
        }
        Ok(segments)
    }

    /// The messages of the operation over active messages
    /// ([`layout_parts`]), covering `len` bytes of packed data in
    /// elements of `unit` bytes.
    fn parts(&self, len: usize, unit: usize) -> Result<LayoutParts> {
        layout_parts(self.start, &self.runs, len, unit)
    }

    /// The messages of an operation that writes into the target layout
    /// ([`Blocks::parts`]), once it is known that none will be refused:
    /// in a dynamic window, whose memory the origin does not know, an
    /// operation of several messages asks the target first
    /// ([`path::check_parts`], a round trip), so that nothing of it lands
    /// if one would be refused. (The target checks each message whole
    /// anyway, and elsewhere the origin checked every segment.)
    fn writing_parts(&self, len: usize, unit: usize) -> Result<LayoutParts> {
        let cut = self.parts(len, unit)?;
        if self.dynamic && cut.parts.len() > 1 {
            path::check_parts(&self.to, cut.parts())?;
        }
        Ok(cut)
    }

    /// Puts `data` (the packed data) into the target layout: the
    /// segments' copies (direct path), or their WRITEs (RDMA) posted as
    /// lists of work requests; complete at the next flush.
    fn put(&self, data: &[u8]) -> Result<()> {
        match self.path {
            Path::ActiveMessages => {
                let cut = self.writing_parts(data.len(), 1)?;
                path::put_parts(&self.to, cut.parts(), data)
            }
            Path::Direct(reach) => {
                let _open = reach.open(self.to.locked)?;
                let segments = self.segments(data.len())?;
                segments
                    .iter()
                    .try_for_each(|s| direct::put(reach, s.disp, &data[s.data.clone()]))
            }
            Path::Rdma(reach) => reach.put_segments(&self.segments(data.len())?, data),
        }
    }

    /// Combines `data` (the packed data, elements of `element`) into the
    /// target layout with `op`: one operation on every path (see the
    /// module docs).
    fn accumulate(&self, data: &[u8], element: AccumulateType, op: AccumulateOp) -> Result<()> {
        let how = (element, op);
        match self.path {
            Path::ActiveMessages => {
                let cut = self.writing_parts(data.len(), element.size())?;
                path::accumulate_parts(&self.to, cut.parts(), data, how)
            }
            Path::Direct(reach) => {
                let _open = reach.open(self.to.locked)?;
                let segments = self.segments(data.len())?;
                direct::accumulate_segments(reach, &segments, data, how, self.to.exclusive, None)
            }
            Path::Rdma(reach) => {
                let segments = self.segments(data.len())?;
                rdma::accumulate_segments(reach, &segments, data, how, self.to.exclusive, None)
            }
        }
    }
}

/// The messages of an operation over active messages on the target
/// `layout` (runs, their offsets from byte displacement `start`): the
/// runs cut into parts of at most [`PART_DATA`] bytes and [`MAX_RUNS`]
/// runs (one part, unless the operation is that large), a segment cut
/// where a part is full, between packed elements of `unit` bytes (a
/// part holds a multiple of `unit` bytes, though its segments may cut an
/// element: a pair whose value and index lie apart). Their data ranges cover `0..len`, the packed data's
/// (else an internal error: nothing is sent).
fn layout_parts(start: u64, layout: &[Run], len: usize, unit: usize) -> Result<LayoutParts> {
    let part_data = PART_DATA / unit.max(1) * unit.max(1);
    let mut parts = Vec::new();
    let mut runs = Vec::new();
    // Where the part being filled starts, in `runs` and in the data.
    let (mut first, mut from, mut at) = (0, 0, 0);
    let mut end_part = |runs: &Vec<Run>, first: &mut usize, from: &mut usize, at: usize| {
        if runs.len() > *first {
            parts.push((*first..runs.len(), *from..at));
        }
        (*first, *from) = (runs.len(), at);
    };
    for &run in layout {
        let mut run = run;
        while run.count > 0 {
            if runs.len() - first == MAX_RUNS || at - from == part_data {
                end_part(&runs, &mut first, &mut from, at);
            }
            let whole = ((part_data - (at - from)) / run.len).min(run.count);
            if whole > 0 {
                let stride = if whole == 1 { 0 } else { run.stride };
                runs.push(Run {
                    count: whole,
                    stride,
                    ..run
                });
                at += whole * run.len;
                run.offset = run.offset.wrapping_add(whole as isize * run.stride);
                run.count -= whole;
                continue;
            }
            // The next segment is longer than what is left of this
            // part: it is cut, each piece ending a part but the last.
            let (mut offset, mut left) = (run.offset, run.len);
            while left > 0 {
                if runs.len() - first == MAX_RUNS || at - from == part_data {
                    end_part(&runs, &mut first, &mut from, at);
                }
                let len = left.min(part_data - (at - from));
                runs.push(Run::new(offset, len, 1, 0));
                at += len;
                offset = offset.wrapping_add(len as isize);
                left -= len;
            }
            run.offset = run.offset.wrapping_add(run.stride);
            run.count -= 1;
        }
    }
    end_part(&runs, &mut first, &mut from, at);
    if at != len {
        return Err(Error::new(
            ErrorClass::Intern,
            format!("a target layout of {at} bytes for {len} bytes of packed data"),
        ));
    }
    Ok(LayoutParts { start, runs, parts })
}

/// An operation's target layout cut into the parts of its messages
/// ([`layout_parts`]): the runs of all parts one after another, and each
/// part's range of them and of the data.
struct LayoutParts {
    start: u64,
    runs: Vec<Run>,
    parts: Vec<(Range<usize>, Range<usize>)>,
}

impl LayoutParts {
    /// The parts, their layouts borrowed from the runs.
    fn parts(&self) -> Vec<Part<'_>> {
        self.parts
            .iter()
            .map(|(runs, data)| Part {
                disp: self.start,
                layout: &self.runs[runs.clone()],
                data: data.clone(),
            })
            .collect()
    }
}

/// The type signature of `count` elements of `datatype`: its basic types
/// in order, adjacent runs of one type merged.
fn signature(datatype: Handle<'_>, count: usize) -> Vec<(Primitive, usize)> {
    let mut runs: Vec<(Primitive, usize)> = Vec::new();
    datatype.for_each_basic(count, |basic, n| match runs.last_mut() {
        Some((last, m)) if *last == basic => *m += n,
        _ if n > 0 => runs.push((basic, n)),
        _ => {}
    });
    runs
}

/// A signature for messages: its first few runs.
fn describe(runs: &[(Primitive, usize)]) -> String {
    let shown: Vec<String> = runs
        .iter()
        .take(4)
        .map(|(basic, n)| format!("{n} {}", basic.name()))
        .collect();
    let more = if runs.len() > 4 { ", ..." } else { "" };
    format!("[{}{more}]", shown.join(", "))
}

impl Window<'_> {
    /// [`Window::put`] into `layout` at `disp` in the target's window
    /// (`MPI_Put` with a target datatype): the origin's and the target's
    /// type signatures must be the same (else `MPI_ERR_TYPE`), and the
    /// target layout must lie in the target's window (else
    /// `MPI_ERR_RMA_RANGE`); nothing moves otherwise.
    #[doc(alias = "MPI_Put")]
    pub fn put_typed<S>(
        &self,
        origin: &S,
        target: i32,
        disp: usize,
        layout: TargetLayout<'_>,
    ) -> Result<()>
    where
        S: Buffer + ?Sized,
    {
        let result = (|| {
            let view = origin.view();
            let Some(to) =
                self.target_blocks(target, disp, view.datatype(), view.count(), layout)?
            else {
                return Ok(());
            };
            let data = Outgoing::new(&view)?;
            to.put(data.bytes())
        })();
        self.comm.handled(result)
    }

    /// [`Window::get`] from `layout` at `disp` in the target's window
    /// (`MPI_Get` with a target datatype), returning once the data is
    /// there; checked as [`Window::put_typed`].
    #[doc(alias = "MPI_Get")]
    pub fn get_typed<R>(
        &self,
        result: &mut R,
        target: i32,
        disp: usize,
        layout: TargetLayout<'_>,
    ) -> Result<()>
    where
        R: BufferMut + ?Sized,
    {
        let outcome = (|| {
            let view = result.view_mut();
            let Some(to) =
                self.target_blocks(target, disp, view.datatype(), view.count(), layout)?
            else {
                return Ok(());
            };
            let mut data = Incoming::new(view)?;
            let bytes = data.device_buffer();
            let len = bytes.len();
            fetch_blocks(&to, bytes, Fetch::Get)?;
            data.finish(len)
        })();
        self.comm.handled(outcome)
    }

    /// [`Window::accumulate`] into `layout` at `disp` in the target's
    /// window (`MPI_Accumulate` with a target datatype): checked as
    /// [`Window::put_typed`], the elements besides of one basic type
    /// throughout, or value-index pairs (also in a layout that puts a
    /// pair's index apart from its value: each pair is combined whole),
    /// for which `op` is defined (else `MPI_ERR_OP`). Atomic
    /// per element with respect to other accumulates.
    #[doc(alias = "MPI_Accumulate")]
    pub fn accumulate_typed<S>(
        &self,
        origin: &S,
        target: i32,
        disp: usize,
        layout: TargetLayout<'_>,
        op: impl Into<AccumulateOp>,
    ) -> Result<()>
    where
        S: Buffer + ?Sized,
    {
        let op = op.into();
        let result = (|| {
            let view = origin.view();
            let datatype = view.datatype();
            let Some(to) = self.target_blocks(target, disp, datatype, view.count(), layout)? else {
                return Ok(());
            };
            let checked = self.reductions_checked_by_path();
            let element = accumulate_element(ElementType::of_datatype(datatype), op, checked)?;
            let data = Outgoing::new(&view)?;
            to.accumulate(data.bytes(), element, op)
        })();
        self.comm.handled(result)
    }

    /// The request-based [`Window::put_typed`] (`MPI_Rput` with a target
    /// datatype): complete on return, as [`Window::rput`].
    #[doc(alias = "MPI_Rput")]
    pub fn rput_typed<'s, S: Buffer + ?Sized>(
        &self,
        origin: &S,
        target: i32,
        disp: usize,
        layout: TargetLayout<'_>,
    ) -> Result<Request<'s>> {
        self.comm.handled(self.check_request_epoch(target))?;
        self.put_typed(origin, target, disp, layout)?;
        completed(&self.comm)
    }

    /// The request-based [`Window::accumulate_typed`] (`MPI_Raccumulate`
    /// with a target datatype): complete on return, as
    /// [`Window::rput`].
    #[doc(alias = "MPI_Raccumulate")]
    pub fn raccumulate_typed<'s, S: Buffer + ?Sized>(
        &self,
        origin: &S,
        target: i32,
        disp: usize,
        layout: TargetLayout<'_>,
        op: impl Into<AccumulateOp>,
    ) -> Result<Request<'s>> {
        self.comm.handled(self.check_request_epoch(target))?;
        self.accumulate_typed(origin, target, disp, layout, op)?;
        completed(&self.comm)
    }

    /// The request-based [`Window::get_typed`] (`MPI_Rget` with a target
    /// datatype): its operation is waited for here (its messages, or its
    /// copies or READs on the direct path and RDMA), so the data is there
    /// and the request complete on
    /// return, and `result` is borrowed only for the call.
    #[doc(alias = "MPI_Rget")]
    pub fn rget_typed<'s, R: BufferMut + ?Sized>(
        &self,
        result: &mut R,
        target: i32,
        disp: usize,
        layout: TargetLayout<'_>,
    ) -> Result<Request<'s>> {
        self.comm.handled(self.check_request_epoch(target))?;
        self.get_typed(result, target, disp, layout)?;
        completed(&self.comm)
    }

    /// The request-based [`Window::get_accumulate_typed`]
    /// (`MPI_Rget_accumulate` with a target datatype): complete on
    /// return, as [`Window::rget_typed`].
    #[doc(alias = "MPI_Rget_accumulate")]
    pub fn rget_accumulate_typed<'s, S, R>(
        &self,
        origin: &S,
        result: &mut R,
        target: i32,
        disp: usize,
        layout: TargetLayout<'_>,
        op: impl Into<AccumulateOp>,
    ) -> Result<Request<'s>>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
    {
        self.comm.handled(self.check_request_epoch(target))?;
        self.get_accumulate_typed(origin, result, target, disp, layout, op)?;
        completed(&self.comm)
    }

    /// [`Window::get_accumulate`] on `layout` at `disp` in the target's
    /// window (`MPI_Get_accumulate` with a target datatype): the result's
    /// and the target's signatures are checked as [`Window::put_typed`]'s,
    /// the origin against the result as [`Window::get_accumulate`] does.
    #[doc(alias = "MPI_Get_accumulate")]
    pub fn get_accumulate_typed<S, R>(
        &self,
        origin: &S,
        result: &mut R,
        target: i32,
        disp: usize,
        layout: TargetLayout<'_>,
        op: impl Into<AccumulateOp>,
    ) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
    {
        let op = op.into();
        let outcome = (|| {
            let view = result.view_mut();
            let datatype = view.datatype();
            let Some(to) = self.target_blocks(target, disp, datatype, view.count(), layout)? else {
                return Ok(());
            };
            let input = Input::new(origin)?;
            let element = ElementType::of_datatype(datatype);
            let mut data = Incoming::with_contents(view)?;
            let bytes = data.device_buffer();
            let len = bytes.len();
            let checked = self.reductions_checked_by_path();
            let whole = fetch_accumulate(
                input.element_type(),
                input.bytes(),
                (element, len),
                op,
                checked,
            )?;
            let Fetch::Accumulate {
                element,
                op,
                data: origin,
            } = whole
            else {
                return Err(Error::new(
                    ErrorClass::Intern,
                    "a fetching accumulate was checked as another operation",
                ));
            };
            fetch_blocks(
                &to,
                bytes,
                Fetch::Accumulate {
                    element,
                    op,
                    data: origin,
                },
            )?;
            data.finish(len)
        })();
        self.comm.handled(outcome)
    }

    /// The checks of an operation of `count` elements of `datatype` at
    /// the origin on `layout` at `disp` in `target`'s window, and the
    /// blocks it reaches there (see the module docs); `None` for a target
    /// of `PROC_NULL`, which nothing reaches.
    fn target_blocks(
        &self,
        target: i32,
        disp: usize,
        datatype: Handle<'_>,
        count: usize,
        layout: TargetLayout<'_>,
    ) -> Result<Option<Blocks<'_>>> {
        if target == PROC_NULL {
            return Ok(None);
        }
        let ours = signature(datatype, count);
        let (datatype, count) = (layout.datatype.0, layout.count);
        // The rank and the epoch, as every operation checks them (zero
        // bytes at displacement 0: always in range).
        let (to, path, _) = self.check_target(target, 0, 0)?;
        let theirs = signature(datatype, count);
        if theirs != ours {
            return Err(Error::new(
                ErrorClass::Type,
                format!(
                    "the origin's type signature {} and the target's {} differ",
                    describe(&ours),
                    describe(&theirs)
                ),
            ));
        }
        let rank = to.rank;
        let dynamic = self.flavor == CreateFlavor::Dynamic;
        let unit = if dynamic { 1 } else { self.disp_units[rank] };
        let start = disp as i128 * unit as i128;
        let runs = datatype.runs_of(count);
        let (low, high) = runs
            .iter()
            .fold((i128::MAX, i128::MIN), |(low, high), run| {
                let (first, last) = run.span();
                (low.min(start + first), high.max(start + last))
            });
        let size = if dynamic {
            u64::MAX as i128
        } else {
            self.sizes[rank] as i128
        };
        let start = u64::try_from(start).ok().filter(|_| high <= size);
        if !runs.is_empty() && (low < 0 || start.is_none()) {
            return Err(Error::new(
                ErrorClass::RmaRange,
                format!(
                    "the target layout reaches bytes {low}..{high} of rank {rank}'s window of \
                     {size} bytes (displacement {disp} in units of {unit} bytes)"
                ),
            ));
        }
        Ok(Some(Blocks {
            to,
            path,
            start: start.unwrap_or(0),
            runs,
            dynamic,
        }))
    }
}

/// Runs the fetching operation `what` on the target layout of `to` into
/// `bytes` (the packed result, as long as the segments together), and
/// waits for it: over active messages its messages ([`Blocks::parts`]),
/// on the direct and RDMA paths one operation on the segments. The
/// first error is returned, after every operation started has finished
/// with `bytes`.
fn fetch_blocks(to: &Blocks<'_>, bytes: &mut [u8], what: Fetch<'_>) -> Result<()> {
    let exclusive = to.to.exclusive;
    match (to.path, what) {
        (Path::ActiveMessages, _) => {
            let cut = match what {
                Fetch::Get => to.parts(bytes.len(), 1)?,
                Fetch::Accumulate { element, .. } => {
                    to.writing_parts(bytes.len(), element.size())?
                }
                Fetch::CompareAndSwap { element, .. } => {
                    to.writing_parts(bytes.len(), element.size())?
                }
            };
            let parts = cut.parts();
            // SAFETY: `bytes` is writable for the parts' ranges (they
            // cover it: `parts` checked) and not otherwise accessed until
            // the request is waited for, at once.
            let request = unsafe {
                path::fetch_parts(&to.to, parts.into_iter(), bytes.as_mut_ptr(), Some(what))
            }?;
            wait_fetched(Some(request))
        }
        (Path::Direct(reach), Fetch::Get) => {
            let _open = reach.open(to.to.locked)?;
            let segments = to.segments(bytes.len())?;
            segments
                .iter()
                .try_for_each(|s| direct::get(reach, s.disp, &mut bytes[s.data.clone()]))
        }
        (Path::Rdma(reach), Fetch::Get) => reach.get_segments(&to.segments(bytes.len())?, bytes),
        (Path::Direct(reach), Fetch::Accumulate { element, op, data }) => {
            let _open = reach.open(to.to.locked)?;
            let segments = to.segments(bytes.len())?;
            let how = (element, op);
            direct::accumulate_segments(reach, &segments, data, how, exclusive, Some(bytes))
        }
        (Path::Rdma(reach), Fetch::Accumulate { element, op, data }) => {
            let segments = to.segments(bytes.len())?;
            let how = (element, op);
            rdma::accumulate_segments(reach, &segments, data, how, exclusive, Some(bytes))
        }
        (Path::Direct(_) | Path::Rdma(_), Fetch::CompareAndSwap { .. }) => Err(Error::new(
            ErrorClass::Intern,
            "a compare-and-swap has no target datatype",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::{layout_parts, Run, MAX_RUNS, PART_DATA};

    /// The segments of `runs`, touching ones merged.
    fn segments(runs: &[Run]) -> Vec<(isize, usize)> {
        let mut out: Vec<(isize, usize)> = Vec::new();
        for (offset, len) in runs.iter().copied().flat_map(Run::segments) {
            match out.last_mut() {
                Some((at, n)) if *at + *n as isize == offset => *n += len,
                _ => out.push((offset, len)),
            }
        }
        out
    }

    #[test]
    fn a_layout_is_cut_into_bounded_parts_that_cover_it_in_order() {
        let irregular: Vec<Run> = (0..MAX_RUNS as isize + 5)
            .map(|i| Run::new(i * i * 8, 8, 1, 0))
            .collect();
        let layouts = [
            // 1024 blocks of 8 bytes 16 apart: one part of one run.
            vec![Run::new(0, 8, 1024, 16)],
            // More data than a part: a vector cut between segments, and
            // a segment longer than a part cut within it.
            vec![
                Run::new(-64, 4096, 300, 8192),
                Run::new(1 << 30, 3 * PART_DATA + 8, 1, 0),
            ],
            // More runs than a part holds.
            irregular,
        ];
        for layout in layouts {
            let len = layout.iter().map(|r| r.len * r.count).sum();
            let cut = layout_parts(40, &layout, len, 1).unwrap();
            let parts = cut.parts();
            let mut at = 0;
            let mut joined = Vec::new();
            for part in &parts {
                assert_eq!((part.disp, part.data.start), (40, at));
                assert!(part.data.len() <= PART_DATA && part.layout.len() <= MAX_RUNS);
                let bytes: usize = part.layout.iter().map(|r| r.len * r.count).sum();
                assert_eq!(bytes, part.data.len());
                at = part.data.end;
                joined.extend(part.layout.iter().copied());
            }
            assert_eq!(at, len);
            assert_eq!(segments(&joined), segments(&layout));
            if len <= PART_DATA && layout.len() <= MAX_RUNS {
                assert_eq!(parts.len(), 1);
            }
            assert!(layout_parts(40, &layout, len + 1, 1).is_err());
        }
    }

    /// Parts of an accumulate of 12-byte value-index pairs hold whole
    /// pairs: a segment longer than a part is cut between them.
    #[test]
    fn an_accumulate_of_pairs_is_cut_between_pairs() {
        let layout = vec![
            Run::new(0, 12 * 100_000, 1, 0),
            Run::new(1 << 24, 12, 7, 24),
        ];
        let len = layout.iter().map(|r| r.len * r.count).sum();
        let cut = layout_parts(0, &layout, len, 12).unwrap();
        let parts = cut.parts();
        assert!(parts.len() > 2);
        for part in &parts {
            assert!(part.data.len() <= PART_DATA);
            assert_eq!(part.data.len() % 12, 0, "{:?}", part.data);
            assert!(part.layout.iter().all(|r| r.len % 12 == 0));
        }
    }

    /// Parts of an accumulate into `MPI_SHORT_INT` pairs as C lays them
    /// out (value, 2 bytes of padding, index: segments of the first
    /// value, then each index with the next value, then the last index),
    /// more than a part holds: each part holds whole packed pairs of 6
    /// bytes, its segments cutting them where they lie.
    #[test]
    fn an_accumulate_into_pairs_parted_by_padding_is_cut_between_packed_pairs() {
        const PAIRS: usize = 200_000;
        let layout = vec![
            Run::new(0, 2, 1, 0),
            Run::new(4, 6, PAIRS - 1, 8),
            Run::new(8 * PAIRS as isize - 4, 4, 1, 0),
        ];
        let cut = layout_parts(0, &layout, 6 * PAIRS, 6).unwrap();
        let parts = cut.parts();
        assert!(parts.len() > 2);
        let mut joined = Vec::new();
        for part in &parts {
            assert_eq!(part.data.len() % 6, 0, "{:?}", part.data);
            assert!(part.data.len() <= PART_DATA);
            joined.extend(part.layout.iter().copied());
        }
        assert_eq!(segments(&joined), segments(&layout));
    }
}
