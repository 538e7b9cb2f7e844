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
//! require; a layout whose blocks split a pair, value apart from index,
//! is `MPI_ERR_UNSUPPORTED_OPERATION`), and every block lies in
//! the target's window (`MPI_ERR_RMA_RANGE`; in a dynamic window, whose
//! memory only the target knows, the target checks each block as it
//! does a contiguous operation's range, so the blocks before one it
//! refuses may have landed). Then each block (adjacent ones
//! merged) is one contiguous operation on the target's path, in
//! type-map order: on the direct path a copy or an in-place reduction
//! straight into (or out of) the target's layout, with no packing at the
//! target; over active messages and RDMA one operation per block, queued
//! and sent together as contiguous operations are. The contiguous forms
//! ([`Window::put`] and the others) keep their own code.

use super::path::{Fetch, Path, Target};
use super::wire::AccumulateType;
use super::{
    accumulate_element, completed, fetch_accumulate, wait_fetched, AccumulateOp, CreateFlavor,
    Window,
};
use crate::collective::typed::Input;
use crate::datatype::{
    Buffer, BufferMut, Datatype, DatatypeRef, ElementType, Handle, Incoming, Outgoing, Primitive,
};
use crate::request::Request;
use crate::{Error, ErrorClass, Result, PROC_NULL};
use std::ops::ControlFlow;

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
/// and the blocks (byte displacement in the target's window, length),
/// in type-map order, whose lengths add up to the packed data's.
struct Blocks<'w> {
    to: Target<'w>,
    path: &'w Path,
    blocks: Vec<(u64, usize)>,
}

impl Blocks<'_> {
    /// Each block with its packed data's range.
    fn with_ranges(&self) -> impl Iterator<Item = (u64, std::ops::Range<usize>)> + '_ {
        self.blocks.iter().scan(0usize, |at, &(disp, len)| {
            let range = *at..*at + len;
            *at += len;
            Some((disp, range))
        })
    }

    /// Calls `f` with each block and its piece of `data` (the packed
    /// data, as long as the blocks together: the signatures matched), in
    /// order, until it fails.
    fn each_piece(&self, data: &[u8], mut f: impl FnMut(u64, &[u8]) -> Result<()>) -> Result<()> {
        self.with_ranges().try_for_each(|(at, range)| {
            let piece = data.get(range).ok_or_else(|| {
                Error::new(
                    ErrorClass::Intern,
                    "a target block reaches past the packed data",
                )
            })?;
            f(at, piece)
        })
    }

    /// The error of a block that is no whole number of `element`s: a
    /// target layout that puts a value-index pair's index apart from its
    /// value (`MPI_SHORT_INT`'s own, with padding between them, or the
    /// index first), which an accumulate here combines only whole: each
    /// block is an operation of its own. (A block of numbers always holds
    /// whole ones.)
    fn check_whole(&self, element: AccumulateType) -> Result<()> {
        match self
            .blocks
            .iter()
            .find(|&&(_, len)| !element.holds_whole(len))
        {
            Some(&(at, len)) => Err(Error::new(
                ErrorClass::UnsupportedOperation,
                format!(
                    "the target layout's block of {len} bytes at byte {at} holds part of a \
                     {}-byte value-index pair: accumulates with a target datatype combine \
                     pairs only where value and index are adjacent, value first (pack the \
                     pairs, or use the contiguous accumulate)",
                    element.size()
                ),
            )),
            None => Ok(()),
        }
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
            to.each_piece(data.bytes(), |at, piece| to.path.put(&to.to, at, piece))
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
            fetch_blocks(&to, bytes, |_| Ok(Fetch::Get))?;
            data.finish(len)
        })();
        self.comm.handled(outcome)
    }

    /// [`Window::accumulate`] into `layout` at `disp` in the target's
    /// window (`MPI_Accumulate` with a target datatype): checked as
    /// [`Window::put_typed`], the elements besides of one basic type
    /// throughout, or value-index pairs (a layout that puts a pair's
    /// index apart from its value is `MPI_ERR_UNSUPPORTED_OPERATION`),
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
            to.check_whole(element)?;
            let data = Outgoing::new(&view)?;
            to.each_piece(data.bytes(), |at, piece| {
                to.path.accumulate(&to.to, at, piece, element, op)
            })
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
        self.accumulate_typed(origin, target, disp, layout, op)?;
        completed(&self.comm)
    }

    /// The request-based [`Window::get_typed`] (`MPI_Rget` with a target
    /// datatype): each block is an operation of its own, waited for here,
    /// so the data is there and the request complete on return, and
    /// `result` is borrowed only for the call.
    #[doc(alias = "MPI_Rget")]
    pub fn rget_typed<'s, R: BufferMut + ?Sized>(
        &self,
        result: &mut R,
        target: i32,
        disp: usize,
        layout: TargetLayout<'_>,
    ) -> Result<Request<'s>> {
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
            to.check_whole(element)?;
            fetch_blocks(&to, bytes, |range| {
                Ok(Fetch::Accumulate {
                    element,
                    op,
                    // NO_OP sends no origin data.
                    data: origin.get(range).unwrap_or_default(),
                })
            })?;
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
        let mut blocks: Vec<(u64, usize)> = Vec::new();
        let (mut low, mut high) = (i128::MAX, i128::MIN);
        let _ = datatype.for_each_segment(count, |offset, len| {
            if len > 0 {
                let at = start + offset as i128;
                low = low.min(at);
                high = high.max(at + len as i128);
                match blocks.last_mut() {
                    Some((last, n)) if *last as i128 + *n as i128 == at => *n += len,
                    // Out of range when negative: refused below.
                    _ => blocks.push((at.max(0) as u64, len)),
                }
            }
            ControlFlow::Continue(())
        });
        let size = if dynamic {
            u64::MAX as i128
        } else {
            self.sizes[rank] as i128
        };
        if !blocks.is_empty() && (low < 0 || high > size) {
            return Err(Error::new(
                ErrorClass::RmaRange,
                format!(
                    "the target layout reaches bytes {low}..{high} of rank {rank}'s window of \
                     {size} bytes (displacement {disp} in units of {unit} bytes)"
                ),
            ));
        }
        Ok(Some(Blocks { to, path, blocks }))
    }
}

/// Runs a fetching operation on each block of `to` into its range of
/// `bytes` (the packed result, as long as the blocks together), `what`
/// giving each block's operation from its range, and waits for them all;
/// the first error is returned, after every operation started has
/// finished with `bytes`.
fn fetch_blocks<'d>(
    to: &Blocks<'_>,
    bytes: &mut [u8],
    what: impl Fn(std::ops::Range<usize>) -> Result<Fetch<'d>>,
) -> Result<()> {
    let mut requests = Vec::new();
    let mut outcome = Ok(());
    for (at, range) in to.with_ranges() {
        let Some(dest) = bytes.get_mut(range.clone()) else {
            outcome = Err(Error::new(
                ErrorClass::Intern,
                "a target block reaches past the packed result",
            ));
            break;
        };
        let started = what(range).and_then(|what| {
            // SAFETY: `dest` is writable for its length and not otherwise
            // accessed until its request is waited for below (every one
            // is, whatever happens).
            unsafe {
                to.path
                    .fetch(&to.to, at, dest.as_mut_ptr(), dest.len(), what)
            }
        });
        match started {
            Ok(request) => requests.push(request),
            Err(e) => {
                outcome = Err(e);
                break;
            }
        }
    }
    for request in requests {
        let waited = wait_fetched(request);
        if outcome.is_ok() {
            outcome = waited;
        }
    }
    outcome
}
