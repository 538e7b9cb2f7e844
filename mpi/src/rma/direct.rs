//! The operations of the direct path (`Path::Direct`): the origin reads
//! and writes the target's window itself, with no help from the target
//! ([`Reach`]): a window segment mapped in this process
//! (`oxmpi_shm::window::WindowSegment`, for allocated windows), or the
//! target's own memory by cross-memory attach
//! (`oxmpi_shm::window::RemoteWindow`, for windows on user memory), with
//! the lock and region mutexes in a segment the target made for them.
//!
//! Puts and gets are copies, counted in this thread's epoch: through the
//! caches until its puts and gets of more than half of the level-1 cache
//! have moved more than half of the level-2 cache since its last flush,
//! then past them (`oxmpi_shm::window::copy`). Accumulates, fetch-and-op and
//! compare-and-swap are atomic per element with respect to each other.
//! Under an exclusive lock nobody else may touch the window: plain
//! copies and the reduction kernels, no mutex. Otherwise (a shared lock,
//! lock_all, fence, start), on a mapped segment, a replace, a no-op (the
//! fetch of get_accumulate) and a compare-and-swap of words of 1, 2, 4 or
//! 8 bytes at aligned addresses (`WindowSegment::word_capable`) are one
//! hardware atomic per element; every reduction, and anything else (other
//! sizes, unaligned displacements, memory reached by cross-memory attach,
//! which atomics cannot reach), runs under the region mutexes of the
//! bytes it touches, each taken once per operation, and reads, combines
//! and writes the span in one pass. The way depends only on the op, the
//! element size and the address, so two origins doing the same op on one
//! element take the same way, and a no-op's atomic loads meet a
//! reduction's whole-element stores (`oxmpi_shm::window::atomics`). The
//! range is checked by the window first and by the segment again:
//! nothing is ever touched outside it.

use super::path::Segment;
use super::target::combine;
use super::wire::{AccumulateOp, AccumulateType};
use crate::collective::op::PredefinedReduction;
use crate::{Error, ErrorClass, Result};
use oxmpi_adi::wait::WaitPolicy;
use oxmpi_shm::window::copy::{self, Caching};
use oxmpi_shm::window::{
    AccessError, RegionGuard, RegionSetGuard, RemoteWindow, SharedRwLock, WindowSegment,
};
use std::sync::Arc;

/// How the direct path reaches one target's window.
#[derive(Clone, Debug)]
pub(crate) enum Reach {
    /// The window's segment, mapped in this process.
    Mapped(Arc<WindowSegment>),
    /// The target's own memory by cross-memory attach; `control` is the
    /// segment the target made for the window's lock and region mutexes
    /// (its data part is never used).
    Remote {
        control: Arc<WindowSegment>,
        memory: RemoteWindow,
    },
}

impl Reach {
    /// The segment with the window's lock and region mutexes.
    fn control(&self) -> &WindowSegment {
        match self {
            Reach::Mapped(segment) => segment,
            Reach::Remote { control, .. } => control,
        }
    }

    /// The window's passive-target lock.
    pub(crate) fn lock(&self) -> &SharedRwLock {
        self.control().lock()
    }

    /// How this process waits for the window's lock: the one wait policy.
    pub(crate) fn wait_policy(&self) -> &WaitPolicy {
        self.control().wait_policy()
    }

    /// Copies the window's bytes at `at` into `out`; a mapped segment
    /// as `caching` says (`oxmpi_shm::window::copy`), memory reached by
    /// cross-memory attach by the kernel. Always inlined, as
    /// [`get`].
    #[inline(always)]
    fn read(&self, at: usize, out: &mut [u8], caching: Caching) -> Result<()> {
        match self {
            Reach::Mapped(segment) => segment.read_by(at, out, caching),
            Reach::Remote { memory, .. } => memory.read(at as u64, out),
        }
        .map_err(access_error)
    }

    /// Copies `data` into the window at `at`, as [`Reach::read`].
    #[inline]
    fn write(&self, at: usize, data: &[u8], caching: Caching) -> Result<()> {
        stored();
        match self {
            Reach::Mapped(segment) => segment.write_by(at, data, caching),
            Reach::Remote { memory, .. } => memory.write(at as u64, data),
        }
        .map_err(access_error)
    }

    /// Checks that the target has not dropped its window, for an
    /// operation of an origin that holds a lock on it (`locked`) or not.
    /// Memory reached by cross-memory attach is the target program's: once
    /// it dropped the window ([`close`]) the memory may be anything, so
    /// every operation runs under the window's lock (the origin's, or a
    /// shared hold for the operation's length, released with the guard)
    /// and checks the "closed" word first. A mapped segment stays valid
    /// while this process maps it: nothing to check. Inlined, so that on
    /// a mapped segment (every put and get of an allocated window) this
    /// costs one test of the variant, not a call.
    #[inline]
    pub(crate) fn open(&self, locked: bool) -> Result<Option<SharedHold<'_>>> {
        match self {
            Reach::Mapped(_) => Ok(None),
            Reach::Remote { control, .. } => open_remote(control, locked),
        }
    }

    /// The segment to do atomics on, if the window is mapped.
    pub(crate) fn mapped(&self) -> Option<&WindowSegment> {
        match self {
            Reach::Mapped(segment) => Some(segment),
            Reach::Remote { .. } => None,
        }
    }
}

/// Notes a plain store into window memory by this thread, for the flush
/// (`oxmpi_shm::window::copy::plain_stores`).
#[inline]
fn stored() {
    copy::plain_stores();
}

/// Completes this thread's operations at their targets (`MPI_Win_flush`
/// on the direct path): every operation is done when it returns, and only
/// plain stores not followed by a full barrier may still sit in this
/// CPU's store buffer, which a full barrier drains (streaming copies end
/// with their own store fence); a new epoch of counted copies starts
/// (`oxmpi_shm::window::copy::complete_epoch`, both in one look at the
/// thread's epoch).
#[inline]
pub(crate) fn complete() {
    copy::complete_epoch();
}

/// [`complete`] where the caller's next instruction is a full barrier (a
/// lock's release): the thread's epoch of copies starts anew, with no
/// fence of its own.
#[inline]
pub(crate) fn complete_before_barrier() {
    copy::complete_epoch_before_barrier();
}

/// [`Reach::open`] for memory reached by cross-memory attach, whose lock
/// and "closed" word lie in `control`.
fn open_remote(control: &WindowSegment, locked: bool) -> Result<Option<SharedHold<'_>>> {
    let hold = (!locked).then(|| {
        control.lock().lock_shared(control.wait_policy());
        SharedHold(control.lock())
    });
    let mut closed = [0u8; 8];
    control.read(0, &mut closed).map_err(access_error)?;
    if closed != [0; 8] {
        return Err(Error::new(
            ErrorClass::RmaSync,
            "the target dropped its window without freeing it",
        ));
    }
    Ok(hold)
}

/// A shared hold of a window's lock for one operation; released on drop.
pub(crate) struct SharedHold<'r>(&'r SharedRwLock);

impl Drop for SharedHold<'_> {
    fn drop(&mut self) {
        self.0.unlock_shared();
    }
}

/// The size of the control segment of a window of `size` bytes on user
/// memory: its region mutexes cover the window, and its first word is the
/// "closed" word.
pub(crate) fn control_size(size: usize) -> usize {
    size.max(8)
}

/// Marks this rank's window on user memory closed (it is dropped without
/// `free`), under the exclusive lock: an origin's operation either ended
/// before, or sees the word and touches nothing. This rank must not hold
/// the lock itself.
pub(crate) fn close(control: &WindowSegment) {
    control.lock().lock_exclusive(control.wait_policy());
    // In range: the control segment holds at least 8 bytes.
    let _ = control.write(0, &1u64.to_ne_bytes());
    control.lock().unlock_exclusive();
}

/// The MPI error for a refused access to window memory (cold: kept out
/// of the inlined copies).
#[cold]
fn access_error(e: AccessError) -> Error {
    match e {
        AccessError::OutOfRange { .. } => Error::new(ErrorClass::RmaRange, e.to_string()),
        AccessError::NotAtomic => Error::new(ErrorClass::Intern, e.to_string()),
        AccessError::Copy(io) => Error::os("a cross-memory copy to a window", io),
    }
}

/// The byte offset `disp` in this process's terms.
#[inline]
fn offset(disp: u64) -> Result<usize> {
    usize::try_from(disp).map_err(|_| {
        Error::new(
            ErrorClass::RmaRange,
            format!("byte displacement {disp} is beyond this machine's memory"),
        )
    })
}

/// `MPI_Put`: copies `data` into the window at `disp`.
#[inline]
pub(crate) fn put(reach: &Reach, disp: u64, data: &[u8]) -> Result<()> {
    reach.write(offset(disp)?, data, Caching::Counted)
}

/// `MPI_Get`: copies the window's bytes at `disp` into `out`. Always
/// inlined: a range check and a copy in the caller (with `#[inline]`
/// alone `oxbench`'s get kept it a call once `Window::fetch_into` was
/// always inlined).
#[inline(always)]
pub(crate) fn get(reach: &Reach, disp: u64, out: &mut [u8]) -> Result<()> {
    reach.read(offset(disp)?, out, Caching::Counted)
}

/// `MPI_Accumulate` (`old: None`) and `MPI_Get_accumulate` (the target's
/// data from before goes to `old`): combines `data` (elements of
/// `element`; ignored for `NO_OP`) into the window at `disp` with `op`.
/// `exclusive`: this origin holds the target's exclusive lock.
///
/// Under a shared lock (or none: fence, start), a replace or a no-op on
/// words the hardware reaches atomically is one atomic per element; every
/// other accumulate runs under the region mutexes of its span, each taken
/// once, and combines in place in one pass (the module docs). A
/// reduction on a mapped segment of a span that is never turned round
/// (`MPI_Fetch_and_op`, every accumulate up to half of the level-1 cache)
/// goes the same way without the checks and the pass that the others need
/// ([`reduce_in_place`]). Inlined, so that this way is taken in the
/// caller (a call of the whole cost a fetch-and-op its frame of a longer
/// function). Always, with the whole of that way down to the region
/// mutexes: with `#[inline]` the compiler's choice of what to keep out of
/// line changed from one build to the next (in `oxbench` this function
/// was inlined in `Window::fetch_and_op` before a change that made it a
/// few instructions longer, and a call after it, about 25 instructions
/// more per operation), and a caller that keeps any part of it pays a
/// call that passes ten arguments.
#[inline(always)]
pub(crate) fn accumulate(
    reach: &Reach,
    disp: u64,
    data: &[u8],
    (element, op): (AccumulateType, AccumulateOp),
    exclusive: bool,
    old: Option<&mut [u8]>,
) -> Result<()> {
    let at = offset(disp)?;
    let basic = match element {
        AccumulateType::Basic(basic) => basic,
        AccumulateType::Pair(_) => {
            return accumulate_pairs(reach, at, data, op, element, exclusive, old)
        }
    };
    if let (Reach::Mapped(segment), AccumulateOp::Reduce(reduce)) = (reach, op) {
        // Whole elements (a size is a power of two: a mask), as many as
        // the result holds, in one pass.
        let whole = data.len() & (basic.size() - 1) == 0
            && old.as_deref().is_none_or(|old| old.len() == data.len());
        if whole && !segment.pass_may_turn(data.len()) {
            let reduction = PredefinedReduction::new(reduce.system_op(), basic)?;
            return reduce_in_place(segment, at, data, (reduction, element, op), exclusive, old);
        }
    }
    accumulate_span(reach, at, data, (element, op), exclusive, old)
}

/// [`accumulate`] of value-index pairs: a reduction on a mapped segment
/// always in place in one pass (a pass turned round goes in pieces of 8
/// KiB, which would split pairs of 6 or 12 bytes), anything else as a
/// span. Cold, out of line: off the numbers' way.
#[cold]
#[inline(never)]
fn accumulate_pairs(
    reach: &Reach,
    at: usize,
    data: &[u8],
    op: AccumulateOp,
    pairs: AccumulateType,
    exclusive: bool,
    old: Option<&mut [u8]>,
) -> Result<()> {
    if let (Reach::Mapped(segment), AccumulateOp::Reduce(reduce)) = (reach, op) {
        let whole = pairs.holds_whole(data.len())
            && old.as_deref().is_none_or(|old| old.len() == data.len());
        if whole {
            let reduction = pairs.reduction(reduce.system_op())?;
            return reduce_in_place(segment, at, data, (reduction, pairs, op), exclusive, old);
        }
    }
    accumulate_span(reach, at, data, (pairs, op), exclusive, old)
}

/// [`accumulate`] of any span at byte offset `at`.
fn accumulate_span(
    reach: &Reach,
    at: usize,
    data: &[u8],
    (element, op): (AccumulateType, AccumulateOp),
    exclusive: bool,
    old: Option<&mut [u8]>,
) -> Result<()> {
    let len = accumulate_len(data, element, op, old.as_deref())?;
    if let Some(segment) = by_words(reach, at, element, op, exclusive) {
        return exchange_words(segment, at, data, (element, op), old);
    }
    // The reduction's kernel, looked up (and checked for the type) once
    // per operation, before any mutex is taken.
    let reduction = reduction_of(element, op)?;
    let _regions = hold_span(reach.control(), at, len, exclusive)?;
    update_held(reach, at, len, data, (reduction, element, op), old)
}

/// `MPI_Accumulate` (`old: None`) and `MPI_Get_accumulate` with a target
/// datatype: combines `data` (the packed data, elements of `element`;
/// ignored for `NO_OP`) into the window's `segments` with `op`, their
/// old data (packed) to `old` if given, as one operation. Each element
/// goes the way [`accumulate`] takes it (hardware words where the op,
/// the size and the address allow, else the region mutexes), and the
/// region mutexes of every segment that needs them are taken together
/// before the first segment is touched, each once, in address order
/// (`RegionSetGuard`), and released after the last: not once per
/// segment. Under the exclusive lock, none. A layout whose segments cut
/// elements (a value-index pair with padding between value and index,
/// `MPI_SHORT_INT` as C lays it out) is gathered, combined packed and
/// scattered back under the mutexes (a pair is never done by words).
/// Otherwise on a mapped segment, a reduction on numbers runs its kernel
/// over the segments in one call ([`combine_segments`]).
pub(crate) fn accumulate_segments(
    reach: &Reach,
    segments: &[Segment],
    data: &[u8],
    (element, op): (AccumulateType, AccumulateOp),
    exclusive: bool,
    mut old: Option<&mut [u8]>,
) -> Result<()> {
    let len = accumulate_len(data, element, op, old.as_deref())?;
    let split = check_covered(segments, len, element)?;
    // Whether the segment at byte offset `at` goes by hardware words:
    // `by_words`, whose tests of the lock, the op and the type are made
    // once (at offset 0, page-aligned, only they and the size decide),
    // its address's per segment.
    let some_words = !split && by_words(reach, 0, element, op, exclusive).is_some();
    let words = |at: usize| {
        some_words
            && reach
                .mapped()
                .is_some_and(|s| s.word_capable(at, element.size()))
    };
    let reduction = reduction_of(element, op)?;
    // (A displacement beyond this machine's memory is refused below,
    // before anything is touched.)
    let locked = segments.iter().filter_map(|s| {
        let at = usize::try_from(s.disp).ok()?;
        (!words(at)).then_some((at, s.data.len()))
    });
    let _regions = hold_spans(reach.control(), locked, exclusive)?;
    if split {
        let mut current = vec![0u8; len];
        for s in segments {
            reach.read(
                offset(s.disp)?,
                &mut current[s.data.clone()],
                Caching::Cached,
            )?;
        }
        if let Some(old) = old {
            old.copy_from_slice(&current);
        }
        if op == AccumulateOp::NoOp {
            return Ok(());
        }
        combine(&mut current, data, element, op)?;
        for s in segments {
            reach.write(offset(s.disp)?, &current[s.data.clone()], Caching::Cached)?;
        }
        return Ok(());
    }
    let how = (reduction, element, op);
    match reach.mapped() {
        Some(segment) if !some_words => combine_segments(reach, segment, segments, data, how, old),
        _ => {
            for s in segments {
                let (at, len) = (offset(s.disp)?, s.data.len());
                let data = segment_data(data, s, op);
                let old = old.as_deref_mut().map(|old| &mut old[s.data.clone()]);
                match reach.mapped() {
                    Some(segment) if words(at) => {
                        exchange_words(segment, at, data, (element, op), old)?
                    }
                    _ => update_held(reach, at, len, data, how, old)?,
                }
            }
            Ok(())
        }
    }
}

/// The loop of [`accumulate_segments`] on a mapped segment where no
/// element goes by hardware words (every reduction, and a replace or a
/// no-op under the exclusive lock), once the region mutexes are held or
/// the exclusive lock. A reduction on numbers runs its kernel over the
/// segments in one call (`PredefinedReduction::apply_runs`: in place on
/// the window's bytes, as [`reduce_in_place`] does for one span), up to
/// the first segment it leaves: one whose pass may turn round (by
/// [`update_held`]), or one it cannot do (not aligned: by
/// `target::combine`'s aligned copies; out of range: the error), which
/// goes alone as any segment of a replace, a no-op or pairs does, and the
/// kernel goes on after it. One call per segment through the kernel table
/// (1024 for a vector of 1024 doubles) cost as much as one contiguous
/// accumulate per segment had, each with its checks of the element and
/// the lock (BENCHMARKS.md, typedacc-s28).
fn combine_segments(
    reach: &Reach,
    segment: &WindowSegment,
    segments: &[Segment],
    data: &[u8],
    how: (Option<PredefinedReduction>, AccumulateType, AccumulateOp),
    mut old: Option<&mut [u8]>,
) -> Result<()> {
    let window = segment.span(0, segment.size()).map_err(access_error)?;
    let turns_from = segment.turns_from();
    let mut rest = segments;
    loop {
        if let Some(reduction) = how.0 {
            // SAFETY: `window` is the mapped window (`span`), which
            // outlives this call; this origin holds the region mutexes of
            // every segment's bytes or the target's exclusive lock (the
            // caller's duty), as in `update_held`.
            let done =
                unsafe { reduction.apply_runs(data, window, rest, old.as_deref_mut(), turns_from) };
            rest = &rest[done..];
        }
        let Some((s, after)) = rest.split_first() else {
            return Ok(());
        };
        let (at, len) = (offset(s.disp)?, s.data.len());
        let data = segment_data(data, s, how.2);
        let old = old.as_deref_mut().map(|old| &mut old[s.data.clone()]);
        if segment.pass_may_turn(len) {
            update_held(reach, at, len, data, how, old)?;
        } else {
            let window = segment.span(at, len).map_err(access_error)?;
            // SAFETY: the bytes lie in the mapped window (`span` checked
            // them), which outlives this call; this origin holds their
            // region mutexes or the target's exclusive lock (the
            // caller's duty), as in `update_held`.
            combine_in_place(unsafe { &mut *window }, data, how, old)?;
        }
        rest = after;
    }
}

/// The origin's data of segment `s` of a typed accumulate of the packed
/// `data` with `op`: a no-op's is empty.
#[inline(always)]
pub(crate) fn segment_data<'d>(data: &'d [u8], s: &Segment, op: AccumulateOp) -> &'d [u8] {
    if op == AccumulateOp::NoOp {
        data
    } else {
        &data[s.data.clone()]
    }
}

/// The bytes an accumulate of `data` (with the result `old`, if
/// fetched) covers: a whole number of elements, as long as the data
/// unless a no-op; else an `MPI_ERR_COUNT` error. Shared with the RDMA
/// path.
pub(crate) fn accumulate_len(
    data: &[u8],
    element: AccumulateType,
    op: AccumulateOp,
    old: Option<&[u8]>,
) -> Result<usize> {
    let len = old.map_or(data.len(), <[u8]>::len);
    if (op != AccumulateOp::NoOp && data.len() != len) || !element.holds_whole(len) {
        return Err(Error::new(
            ErrorClass::Count,
            format!(
                "an accumulate of {} bytes into {len} bytes of {}-byte elements",
                data.len(),
                element.size()
            ),
        ));
    }
    Ok(len)
}

/// Checks that a typed operation's target `segments` cover its `len`
/// bytes of packed data (the MPI layer cut them so: a mismatch is an
/// internal error), and says whether one of them cuts an `element` (in
/// the same pass: a strided layout has a segment per element). Shared
/// with the RDMA path.
pub(crate) fn check_covered(
    segments: &[Segment],
    len: usize,
    element: AccumulateType,
) -> Result<bool> {
    let (covered, cut) = segments.iter().fold((0usize, false), |(covered, cut), s| {
        let len = s.data.len();
        (covered + len, cut || !element.holds_whole(len))
    });
    if covered != len {
        return Err(Error::new(
            ErrorClass::Intern,
            format!("target segments of {covered} bytes for {len} bytes of packed data"),
        ));
    }
    Ok(cut)
}

/// The mapped segment on which an accumulate at byte offset `at` is
/// one hardware atomic per element, if it is: under a shared lock (or
/// none), a replace or a no-op of numbers at word-capable addresses.
/// Numbers only: a pair's kernel stores its value and its index apart,
/// which a word's atomic load could see between.
fn by_words(
    reach: &Reach,
    at: usize,
    element: AccumulateType,
    op: AccumulateOp,
    exclusive: bool,
) -> Option<&WindowSegment> {
    reach.mapped().filter(|segment| {
        !exclusive
            && matches!(op, AccumulateOp::Replace | AccumulateOp::NoOp)
            && matches!(element, AccumulateType::Basic(_))
            && segment.word_capable(at, element.size())
    })
}

/// An accumulate [`by_words`]: a replace's stores (swaps if `old` is
/// fetched), or a no-op's loads, one atomic per element.
fn exchange_words(
    segment: &WindowSegment,
    at: usize,
    data: &[u8],
    (element, op): (AccumulateType, AccumulateOp),
    old: Option<&mut [u8]>,
) -> Result<()> {
    let new = (op == AccumulateOp::Replace).then_some(data);
    if new.is_some() && old.is_none() {
        // Release stores, not swaps.
        stored();
    }
    segment
        .exchange(at, element.size(), new, old)
        .map_err(access_error)
}

/// The kernel of `op` on `element`s, looked up (and checked for the
/// type); none for a replace or a no-op.
fn reduction_of(element: AccumulateType, op: AccumulateOp) -> Result<Option<PredefinedReduction>> {
    match op {
        AccumulateOp::Reduce(reduce) => element.reduction(reduce.system_op()).map(Some),
        AccumulateOp::Replace | AccumulateOp::NoOp => Ok(None),
    }
}

/// The read-modify-write of an accumulate of `data` into the `len` bytes
/// at `at` (elements of `element`, whole), their old bytes to `old` if
/// given, once this origin holds their region mutexes or the exclusive
/// lock: in place on a mapped segment, by copies over cross-memory
/// attach.
fn update_held(
    reach: &Reach,
    at: usize,
    len: usize,
    data: &[u8],
    (reduction, element, op): (Option<PredefinedReduction>, AccumulateType, AccumulateOp),
    mut old: Option<&mut [u8]>,
) -> Result<()> {
    // The bytes from `from` of the span, in `window`: a no-op's data is
    // empty, and every other op's as long as the span.
    let mut read_modify_write = |from: usize, window: &mut [u8]| -> Result<()> {
        let to = from + window.len();
        let data = if op == AccumulateOp::NoOp {
            data
        } else {
            &data[from..to]
        };
        let old = old.as_deref_mut().map(|old| &mut old[from..to]);
        combine_in_place(window, data, (reduction, element, op), old)
    };
    match reach {
        Reach::Mapped(segment) => {
            // SAFETY: this origin holds the region mutexes of the span
            // or the target's exclusive lock (the caller's duty); every
            // other origin writes these bytes only under the same
            // mutexes, or not at all while the exclusive lock is held,
            // and reads them (the atomic fetches) only with atomic loads.
            let updated = unsafe { segment.update(at, len, data.as_ptr(), read_modify_write) };
            updated.map_err(access_error)?
        }
        Reach::Remote { .. } => {
            let mut current = vec![0u8; len];
            reach.read(at, &mut current, Caching::Cached)?;
            read_modify_write(0, &mut current)?;
            if op != AccumulateOp::NoOp {
                reach.write(at, &current, Caching::Cached)?;
            }
            Ok(())
        }
    }
}

/// A reduction of the elements `data` at `at` of a mapped segment, a span
/// never turned round, with the reduction looked up: under their region
/// mutexes (unless `exclusive`), the old values copied out and the kernel
/// run on the window's bytes in place, as [`accumulate_span`] does for
/// every span, in one pass (the lengths were checked).
#[inline(always)]
fn reduce_in_place(
    segment: &WindowSegment,
    at: usize,
    data: &[u8],
    how: (PredefinedReduction, AccumulateType, AccumulateOp),
    exclusive: bool,
    old: Option<&mut [u8]>,
) -> Result<()> {
    let how = (Some(how.0), how.1, how.2);
    if exclusive {
        // No mutex's release (a swap) fences the plain stores: noted for
        // the flush.
        stored();
        let window = segment.span(at, data.len()).map_err(access_error)?;
        // SAFETY: the bytes lie in the mapped window (`span` checked
        // them), which outlives this call; this origin holds the target's
        // exclusive lock, so no other origin touches them.
        return combine_in_place(unsafe { &mut *window }, data, how, old);
    }
    // The mutexes and the bytes with one range check (no `Option` of a
    // guard: its drop was kept out of line, 21 instructions).
    let (_regions, window) = segment.lock_span(at, data.len()).map_err(access_error)?;
    // SAFETY: as above, but this origin holds the bytes' region mutexes:
    // as in `accumulate_span`, every other origin writes them only under
    // the same mutexes, and reads them but with atomic loads.
    combine_in_place(unsafe { &mut *window }, data, how, old)
}

/// Takes the region mutexes of bytes `at..at + len` of `control`'s
/// window, unless this origin holds the exclusive lock (then nobody else
/// touches the window, and no mutex's release fences the plain stores
/// that follow: they are noted for the flush).
#[inline]
fn hold_span(
    control: &WindowSegment,
    at: usize,
    len: usize,
    exclusive: bool,
) -> Result<Option<RegionGuard<'_>>> {
    if exclusive {
        stored();
        return Ok(None);
    }
    control
        .lock_regions(at, len)
        .map(Some)
        .map_err(access_error)
}

/// [`hold_span`] for the spans (offset, length) of one operation: each
/// region they touch once, in address order.
fn hold_spans(
    control: &WindowSegment,
    spans: impl Iterator<Item = (usize, usize)>,
    exclusive: bool,
) -> Result<Option<RegionSetGuard<'_>>> {
    if exclusive {
        stored();
        return Ok(None);
    }
    control
        .lock_region_set(spans)
        .map(Some)
        .map_err(access_error)
}

/// An accumulate's read-modify-write of `window` (window memory this
/// origin may change, as its region mutexes or the exclusive lock
/// allow): its bytes go to `old` if given, then `data` is combined into
/// them with `op` (`reduction`: its kernel, looked up), in place where
/// data and window are aligned for the kernel (the usual case: an
/// origin's typed buffer, an aligned displacement), else by
/// `target::combine`'s aligned copies, which also do replace and no-op.
#[inline(always)]
fn combine_in_place(
    window: &mut [u8],
    data: &[u8],
    (reduction, element, op): (Option<PredefinedReduction>, AccumulateType, AccumulateOp),
    old: Option<&mut [u8]>,
) -> Result<()> {
    if let Some(old) = old {
        copy_bytes(old, window);
    }
    match reduction {
        Some(reduction) if reduction.apply(data, window) => Ok(()),
        _ => combine(window, data, element, op),
    }
}

/// Copies `from` into `to`, as long: one element of the common sizes (a
/// fetch-and-op's old value) by a move of its known size, any other
/// length by `memcpy` (whose call cost an 8-byte fetch-and-op some 17
/// instructions).
#[inline(always)]
fn copy_bytes(to: &mut [u8], from: &[u8]) {
    fn known<const N: usize>(to: &mut [u8], from: &[u8]) {
        to[..N].copy_from_slice(&from[..N]);
    }
    match to.len() {
        4 => known::<4>(to, from),
        8 => known::<8>(to, from),
        16 => known::<16>(to, from),
        _ => to.copy_from_slice(from),
    }
}

/// Whether `a` and `b`, as long, hold the same bytes: one element of the
/// common sizes by a comparison of its known size, any other length by
/// `memcmp` (as [`copy_bytes`]).
#[inline(always)]
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    fn known<const N: usize>(a: &[u8], b: &[u8]) -> bool {
        a[..N] == b[..N]
    }
    match a.len() {
        4 => known::<4>(a, b),
        8 => known::<8>(a, b),
        16 => known::<16>(a, b),
        _ => a == b,
    }
}

/// `MPI_Compare_and_swap` of one element: `data` is the compare value
/// followed by the new one, each `old.len()` bytes; the old value goes
/// to `old`. `exclusive` as for [`accumulate`].
pub(crate) fn compare_and_swap(
    reach: &Reach,
    disp: u64,
    data: &[u8],
    exclusive: bool,
    old: &mut [u8],
) -> Result<()> {
    let at = offset(disp)?;
    if data.len() != 2 * old.len() {
        return Err(Error::new(
            ErrorClass::Count,
            format!(
                "a compare-and-swap of {} bytes for {} bytes",
                data.len(),
                old.len()
            ),
        ));
    }
    let (compare, new) = data.split_at(old.len());
    match reach.mapped() {
        Some(segment) if exclusive => {
            // No mutex's release (a swap) fences the plain store: noted
            // for the flush.
            stored();
            let window = segment.span(at, old.len()).map_err(access_error)?;
            // SAFETY: the bytes lie in the mapped window (`span` checked
            // them), which outlives this call; this origin holds the
            // target's exclusive lock, so no other origin touches them.
            let window = unsafe { &mut *window };
            // In place, by moves and a comparison of the element's known
            // size: the copies out and in and the comparison of any length
            // (three calls) were a third of a compare-and-swap's
            // instructions under an exclusive lock.
            copy_bytes(old, window);
            if same_bytes(old, compare) {
                copy_bytes(window, new);
            }
            return Ok(());
        }
        Some(segment) => match segment.compare_and_swap(at, compare, new, old) {
            Ok(()) => return Ok(()),
            // A size or an address the hardware cannot do: the mutexes.
            Err(AccessError::NotAtomic) => {}
            Err(e) => return Err(access_error(e)),
        },
        None => {}
    }
    let _guard = hold_span(reach.control(), at, old.len(), exclusive)?;
    reach.read(at, old, Caching::Cached)?;
    if old == compare {
        reach.write(at, new, Caching::Cached)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collective::op::PairType;
    use crate::collective::{SystemOperation, ValueIndex};
    use crate::datatype::{ElementType, Primitive};

    fn u64s(bytes: &[u8]) -> Vec<u64> {
        bytes
            .chunks_exact(8)
            .map(|w| u64::from_ne_bytes(w.try_into().unwrap()))
            .collect()
    }

    /// Reductions under a shared lock (region mutexes) at aligned and odd
    /// displacements, from aligned and unaligned origin data, with and
    /// without the old data fetched: where the kernel cannot run in place
    /// the aligned copies do, and every element comes out right.
    #[test]
    fn reductions_at_any_alignment_combine_every_element() {
        let (segment, _) = WindowSegment::create(256).unwrap();
        let reach = Reach::Mapped(Arc::new(segment));
        let sum = (
            AccumulateType::Basic(Primitive::U64),
            AccumulateOp::Reduce(SystemOperation::sum()),
        );
        let ones: Vec<u8> = [1u64, 2, 3].iter().flat_map(|v| v.to_ne_bytes()).collect();
        // The same bytes one past an aligned start.
        let mut shifted = vec![0u8; ones.len() + 8];
        shifted[1..=ones.len()].copy_from_slice(&ones);
        let unaligned = &shifted[1..=ones.len()];
        // Three elements (a span), and the first alone (one element's way).
        for elements in [3, 1] {
            let len = 8 * elements;
            for disp in [0u64, 64, 3, 101] {
                for data in [&ones[..len], &unaligned[..len]] {
                    let mut old = vec![0xffu8; len];
                    accumulate(&reach, disp, data, sum, false, Some(&mut old)).unwrap();
                    accumulate(&reach, disp, data, sum, false, None).unwrap();
                    let mut now = vec![0u8; len];
                    reach
                        .read(disp as usize, &mut now, Caching::Cached)
                        .unwrap();
                    let before = u64s(&old);
                    let after: Vec<u64> =
                        before.iter().zip([2, 4, 6]).map(|(b, d)| b + d).collect();
                    assert_eq!(u64s(&now), after, "{elements} at displacement {disp}");
                }
            }
        }
        // Displacement 64, overlapped by no other, got four sums of three
        // elements and four of the first from zero.
        let mut at64 = vec![0u8; 24];
        reach.read(64, &mut at64, Caching::Cached).unwrap();
        assert_eq!(u64s(&at64), [8, 8, 12]);
        // Spans long enough to be turned round (`WindowSegment::update`):
        // repeated sums at an aligned and an odd displacement.
        let (long, _) = WindowSegment::create(160 << 10).unwrap();
        let long = Reach::Mapped(Arc::new(long));
        let counts: Vec<u8> = (0..8192u64).flat_map(|v| v.to_ne_bytes()).collect();
        for disp in [8u64, (80 << 10) + 3] {
            for _ in 0..3 {
                accumulate(&long, disp, &counts, sum, false, None).unwrap();
            }
            let mut now = vec![0u8; counts.len()];
            long.read(disp as usize, &mut now, Caching::Cached).unwrap();
            let tripled: Vec<u64> = (0..8192u64).map(|v| 3 * v).collect();
            assert_eq!(u64s(&now), tripled, "64 KiB at displacement {disp}");
        }
        // An operation the type does not take: refused before anything.
        let band = (
            AccumulateType::Basic(Primitive::F64),
            AccumulateOp::Reduce(SystemOperation::bitwise_and()),
        );
        let refused = accumulate(&reach, 0, &[0u8; 8], band, false, None).unwrap_err();
        assert_eq!(refused.class(), ErrorClass::Op);
    }

    /// The segments of `count` elements of `len` bytes, `stride` apart
    /// from `disp`, and their ranges of the packed data.
    fn strided(disp: u64, len: usize, count: usize, stride: u64) -> Vec<Segment> {
        (0..count)
            .map(|k| Segment {
                disp: disp + k as u64 * stride,
                data: k * len..(k + 1) * len,
            })
            .collect()
    }

    /// A typed accumulate with a strided target (1024 doubles, stride 2)
    /// is one operation: each region mutex it touches is taken once (4
    /// regions of 4 KiB, not one per element), none under the exclusive
    /// lock or for a replace by hardware words; every element comes out
    /// right, and its old values are fetched in order.
    #[test]
    #[cfg(debug_assertions)]
    fn a_strided_accumulate_takes_each_region_mutex_once() {
        use oxmpi_shm::window::regions::regions_taken;
        let (segment, _) = WindowSegment::create(64 << 10).unwrap();
        let reach = Reach::Mapped(Arc::new(segment));
        let segments = strided(8, 8, 1024, 16);
        let values: Vec<u8> = (0..1024).flat_map(|v| f64::from(v).to_ne_bytes()).collect();
        let sum = (
            AccumulateType::Basic(Primitive::F64),
            AccumulateOp::Reduce(SystemOperation::sum()),
        );
        for (exclusive, taken) in [(false, 4), (true, 0)] {
            let mut old = vec![0u8; values.len()];
            let before = regions_taken();
            accumulate_segments(&reach, &segments, &values, sum, exclusive, Some(&mut old))
                .unwrap();
            assert_eq!(regions_taken() - before, taken, "exclusive: {exclusive}");
            let rounds = f64::from(u8::from(exclusive));
            for (k, value) in old.chunks_exact(8).enumerate() {
                let value = f64::from_ne_bytes(value.try_into().unwrap());
                assert_eq!(value, rounds * k as f64, "old element {k}");
            }
        }
        for s in &segments {
            let mut now = [0u8; 8];
            let mut gap = [0u8; 8];
            reach
                .read(s.disp as usize, &mut now, Caching::Cached)
                .unwrap();
            reach
                .read(s.disp as usize + 8, &mut gap, Caching::Cached)
                .unwrap();
            let k = s.data.start / 8;
            assert_eq!(f64::from_ne_bytes(now), 2.0 * k as f64, "element {k}");
            assert_eq!(gap, [0; 8], "the gap after element {k}");
        }
        let replace = (AccumulateType::Basic(Primitive::U64), AccumulateOp::Replace);
        let before = regions_taken();
        accumulate_segments(&reach, &segments, &values, replace, false, None).unwrap();
        assert_eq!(regions_taken() - before, 0, "a replace by words");
    }

    /// A typed sum whose kernel leaves some segments to go alone (one at
    /// an odd displacement, which it cannot do in place, and one long
    /// enough that its pass may turn round, where the CPU turns passes)
    /// and goes on after each: under the exclusive lock and the region
    /// mutexes, the old values fetched, every element comes out right and
    /// the bytes between the segments stay as they were.
    #[test]
    fn a_typed_sum_goes_on_after_the_segments_its_kernel_leaves() {
        let (segment, _) = WindowSegment::create(160 << 10).unwrap();
        let long = 4096; // elements: 32 KiB, past half of any level-1 cache
        let turns = segment.turns_from() <= 8 * long;
        let reach = Reach::Mapped(Arc::new(segment));
        // (displacement, elements): aligned, odd, aligned, long, aligned.
        let layout = [(8u64, 1), (4099, 2), (200, 3), (64 << 10, long), (48, 1)];
        let mut segments = Vec::new();
        let mut packed = 0;
        for (disp, count) in layout {
            segments.push(Segment {
                disp,
                data: packed..packed + 8 * count,
            });
            packed += 8 * count;
        }
        let values: Vec<u8> = (0..packed as u64 / 8)
            .flat_map(|v| (v + 1).to_ne_bytes())
            .collect();
        let sum = (
            AccumulateType::Basic(Primitive::U64),
            AccumulateOp::Reduce(SystemOperation::sum()),
        );
        reach.write(0, &[0xab; 160 << 10], Caching::Cached).unwrap();
        let filler = u64::from_ne_bytes([0xab; 8]);
        for (round, exclusive) in [false, true].into_iter().enumerate() {
            let mut old = vec![0u8; packed];
            accumulate_segments(&reach, &segments, &values, sum, exclusive, Some(&mut old))
                .unwrap();
            let want = |k: u64| filler.wrapping_add(round as u64 * (k + 1));
            let now = |k: u64| want(k).wrapping_add(k + 1);
            assert!(
                u64s(&old).into_iter().zip(0..).all(|(v, k)| v == want(k)),
                "old values, exclusive {exclusive} (passes turn: {turns})"
            );
            for s in &segments {
                let mut bytes = vec![0u8; s.data.len()];
                reach
                    .read(s.disp as usize, &mut bytes, Caching::Cached)
                    .unwrap();
                let first = s.data.start as u64 / 8;
                for (v, k) in u64s(&bytes).into_iter().zip(first..) {
                    assert_eq!(v, now(k), "element {k}, exclusive {exclusive}");
                }
            }
        }
        let mut gap = [0u8; 8];
        reach.read(16, &mut gap, Caching::Cached).unwrap();
        assert_eq!(gap, [0xab; 8], "between the segments");
    }

    /// `MPI_MINLOC` into `MPI_SHORT_INT` pairs as C lays them out (value,
    /// 2 bytes of padding, index), a layout whose segments part each
    /// value from its index: under one hold of the region mutexes (and
    /// under the exclusive lock), whole pairs combined, the old ones
    /// fetched packed, the padding untouched.
    #[test]
    fn an_accumulate_into_a_layout_that_cuts_pairs_combines_whole_pairs() {
        let (segment, _) = WindowSegment::create(4096).unwrap();
        let reach = Reach::Mapped(Arc::new(segment));
        let pair_type = PairType::of(ElementType::of::<ValueIndex<i16, i32>>()).unwrap();
        let element = AccumulateType::Pair(pair_type);
        assert_eq!(element.size(), 6);
        const PAIRS: usize = 100;
        let padding = [0xeeu8; 8 * PAIRS];
        reach.write(0, &padding, Caching::Cached).unwrap();
        // Each pair's value (2 bytes at 8k) and index (4 bytes at 8k + 4).
        let segments: Vec<Segment> = (0..PAIRS)
            .flat_map(|k| {
                let (at, from) = (8 * k as u64, 6 * k);
                [
                    Segment {
                        disp: at,
                        data: from..from + 2,
                    },
                    Segment {
                        disp: at + 4,
                        data: from + 2..from + 6,
                    },
                ]
            })
            .collect();
        let packed = |value: fn(usize) -> i16, index: i32| -> Vec<u8> {
            (0..PAIRS)
                .flat_map(|k| {
                    [
                        value(k).to_ne_bytes().to_vec(),
                        index.to_ne_bytes().to_vec(),
                    ]
                })
                .flatten()
                .collect()
        };
        let first = packed(|k| (k % 3) as i16, 5);
        let second = packed(|k| (k % 2) as i16, 2);
        let replace = (element, AccumulateOp::Replace);
        let min_loc = (element, AccumulateOp::Reduce(SystemOperation::min_loc()));
        for exclusive in [false, true] {
            accumulate_segments(&reach, &segments, &first, replace, exclusive, None).unwrap();
            let mut old = vec![0u8; first.len()];
            #[cfg(debug_assertions)]
            let before = oxmpi_shm::window::regions::regions_taken();
            accumulate_segments(
                &reach,
                &segments,
                &second,
                min_loc,
                exclusive,
                Some(&mut old),
            )
            .unwrap();
            #[cfg(debug_assertions)]
            assert_eq!(
                oxmpi_shm::window::regions::regions_taken() - before,
                usize::from(!exclusive)
            );
            assert_eq!(old, first, "the old pairs, exclusive {exclusive}");
            let mut now = vec![0u8; 8 * PAIRS];
            reach.read(0, &mut now, Caching::Cached).unwrap();
            for (k, pair) in now.chunks_exact(8).enumerate() {
                let value = i16::from_ne_bytes(pair[..2].try_into().unwrap());
                let index = i32::from_ne_bytes(pair[4..].try_into().unwrap());
                let (a, b) = ((k % 3) as i16, (k % 2) as i16);
                let want = if a < b { (a, 5) } else { (b, 2) };
                assert_eq!((value, index), want, "pair {k}, exclusive {exclusive}");
                assert_eq!(pair[2..4], [0xee; 2], "pair {k}'s padding");
            }
        }
    }

    /// `MPI_MINLOC` on 12-byte pairs (`MPI_DOUBLE_INT`'s packed data) over
    /// a span long enough that a number's pass would turn round in 8 KiB
    /// pieces, at an odd displacement, under the region mutexes and under
    /// the exclusive lock: every pair comes out right, ties to the
    /// smaller index; a sum on pairs is refused.
    #[test]
    fn pairs_reduce_whole_over_long_spans() {
        let (segment, _) = WindowSegment::create(96 << 10).unwrap();
        let reach = Reach::Mapped(Arc::new(segment));
        let pair_type = PairType::of(ElementType::of::<ValueIndex<f64, i32>>()).unwrap();
        let element = AccumulateType::Pair(pair_type);
        let pairs = |value: fn(usize) -> f64, index: i32| -> Vec<u8> {
            (0..4096)
                .flat_map(|i| {
                    let mut pair = value(i).to_ne_bytes().to_vec();
                    pair.extend_from_slice(&index.to_ne_bytes());
                    pair
                })
                .collect()
        };
        let min_loc = (element, AccumulateOp::Reduce(SystemOperation::min_loc()));
        let disp = 4099u64;
        let first = pairs(|i| (i % 3) as f64, 5);
        let second = pairs(|i| (i % 2) as f64, 2);
        for exclusive in [false, true] {
            accumulate(
                &reach,
                disp,
                &first,
                (element, AccumulateOp::Replace),
                exclusive,
                None,
            )
            .unwrap();
            for _ in 0..2 {
                accumulate(&reach, disp, &second, min_loc, exclusive, None).unwrap();
            }
            let mut now = vec![0u8; first.len()];
            reach
                .read(disp as usize, &mut now, Caching::Cached)
                .unwrap();
            for (i, pair) in now.chunks_exact(12).enumerate() {
                let value = f64::from_ne_bytes(pair[..8].try_into().unwrap());
                let index = i32::from_ne_bytes(pair[8..].try_into().unwrap());
                let (a, b) = ((i % 3) as f64, (i % 2) as f64);
                let want = if a < b { (a, 5) } else { (b, 2) };
                assert_eq!((value, index), want, "pair {i}, exclusive {exclusive}");
            }
        }
        let sum = (element, AccumulateOp::Reduce(SystemOperation::sum()));
        let refused = accumulate(&reach, disp, &first[..12], sum, false, None).unwrap_err();
        assert_eq!(refused.class(), ErrorClass::Op);
    }
}
