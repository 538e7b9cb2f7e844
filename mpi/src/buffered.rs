//! Buffered sends and the attached buffer (MPI 4.1 §3.6).
//!
//! A buffered send ([`Process::buffered_send`](crate::Process::buffered_send),
//! `MPI_Bsend`) copies the message into a buffer the program attached with
//! [`attach_buffer`] (`MPI_Buffer_attach`), starts an ordinary send from
//! that copy and returns at once, whether or not a matching receive has
//! been posted. The space a message takes is given back when its send
//! completes. [`detach_buffer`] (`MPI_Buffer_detach`) waits until every
//! buffered message has left, then hands the memory back;
//! [`flush_buffer`] (`MPI_Buffer_flush`) waits for them and keeps the
//! buffer attached. Finalizing MPI flushes the buffer too, so messages
//! still in it are delivered.
//!
//! Each message takes its length plus [`BSEND_OVERHEAD`] bytes of the
//! buffer, as the standard's sizing rule says: a buffer for `n` pending
//! messages of `len` bytes needs `n * (len + BSEND_OVERHEAD)` bytes. When
//! no buffer is attached, or the message does not fit in the space that
//! is free, the send fails with [`ErrorClass::Buffer`] (`MPI_ERR_BUFFER`),
//! saying how much was needed and how much is free; nothing is sent, and
//! the program may go on (for example, wait for earlier messages to leave
//! and send again).
//!
//! ```no_run
//! # let universe = oxmpi::initialize().unwrap();
//! # let world = universe.world();
//! use oxmpi::buffered::{attach_buffer, detach_buffer, BSEND_OVERHEAD};
//! let data = vec![1.5f64; 100_000];
//! attach_buffer(vec![0u8; 800_000 + BSEND_OVERHEAD]).unwrap();
//! if world.rank() == 0 {
//!     // Returns at once, even if rank 1 posts its receive much later.
//!     world.process_at_rank(1).buffered_send(&data[..]).unwrap();
//! } else if world.rank() == 1 {
//!     let mut incoming = vec![0.0f64; 100_000];
//!     world.process_at_rank(0).receive_into(&mut incoming[..]).unwrap();
//! }
//! // Waits until the message has left, then gives the memory back.
//! let memory = detach_buffer().unwrap();
//! # drop(memory);
//! ```
//!
//! There is one buffer per process (MPI 4.1's per-communicator and
//! per-session buffers and `MPI_BUFFER_AUTOMATIC` are not provided).
//! Buffered sends may come from any number of threads at once
//! ([`Threading::Multiple`](crate::Threading::Multiple)): the buffer's
//! bookkeeping is behind its own lock, taken before the device's.
//!
//! A buffered send that fails after it returned (its peer was lost) has
//! nobody to report to: the error is printed to standard error and its
//! space is given back.

use crate::comm::{Communicator, SendMode, PROC_NULL};
use crate::datatype::View;
use crate::{progress_until, with_device, Error, ErrorClass, Result};
use oxmpi_adi::device::RequestId;
use std::mem::ManuallyDrop;
use std::sync::{Mutex, MutexGuard};

/// Bytes of the attached buffer each buffered message takes beyond its
/// own length (`MPI_BSEND_OVERHEAD`; MPICH's value on 64-bit systems).
pub const BSEND_OVERHEAD: usize = 96;

/// A message in the attached buffer, waiting for its send to complete.
struct Segment {
    /// Where its space starts in the buffer.
    offset: usize,
    /// Space it takes: its length plus [`BSEND_OVERHEAD`].
    size: usize,
    /// The send from the copy.
    request: RequestId,
    /// For the report if the send fails.
    len: usize,
    destination: i32,
}

/// The attached buffer: the memory of the `Vec` the program handed over,
/// owned here until it is detached.
struct Attached {
    /// Start of the `Vec`'s allocation (dangling if it has no capacity).
    base: *mut u8,
    len: usize,
    capacity: usize,
    /// Messages in the buffer, by offset; their spaces do not overlap.
    segments: Vec<Segment>,
    /// A thread is detaching the buffer: no new messages.
    detaching: bool,
}

// SAFETY: `Attached` owns the allocation `base` points to (the `Vec` it
// came from was forgotten, not dropped); nothing else refers to it but the
// device's sends from it, which are tracked in `segments`. Moving the
// owner to another thread moves no memory.
unsafe impl Send for Attached {}

static BUFFER: Mutex<Option<Attached>> = Mutex::new(None);

fn lock_buffer() -> MutexGuard<'static, Option<Attached>> {
    // Every change to `Attached` leaves it consistent before anything that
    // can panic, so a poisoned lock is still good.
    BUFFER.lock().unwrap_or_else(|p| p.into_inner())
}

/// Attaches `buffer` for buffered sends (`MPI_Buffer_attach`). Its whole
/// length (not its spare capacity) is used. MPI takes the memory until
/// [`detach_buffer`] gives it back; its contents are not preserved.
///
/// Attaching while a buffer is attached is an [`ErrorClass::Buffer`]
/// error (the new buffer is dropped).
pub fn attach_buffer(buffer: Vec<u8>) -> Result<()> {
    let mut attached = lock_buffer();
    if let Some(a) = attached.as_ref() {
        return Err(Error::new(
            ErrorClass::Buffer,
            format!(
                "a buffer of {} bytes is already attached: detach it first (a process has one buffer)",
                a.len
            ),
        ));
    }
    let mut buffer = ManuallyDrop::new(buffer);
    *attached = Some(Attached {
        base: buffer.as_mut_ptr(),
        len: buffer.len(),
        capacity: buffer.capacity(),
        segments: Vec::new(),
        detaching: false,
    });
    Ok(())
}

/// Detaches the buffer (`MPI_Buffer_detach`): waits until every message
/// in it has been sent (their sends completed), then gives the memory
/// back, as it was attached (same length and capacity; the contents are
/// unspecified). New buffered sends fail while this waits.
///
/// No buffer attached is an [`ErrorClass::Buffer`] error. If the wait
/// fails (MPI stopped working), the buffer stays attached.
pub fn detach_buffer() -> Result<Vec<u8>> {
    let pending = {
        let mut guard = lock_buffer();
        let a = guard.as_mut().ok_or_else(|| {
            Error::new(
                ErrorClass::Buffer,
                "no buffer is attached: there is nothing to detach",
            )
        })?;
        if a.detaching {
            return Err(Error::new(
                ErrorClass::Buffer,
                "another thread is already detaching the buffer",
            ));
        }
        a.reap()?;
        a.detaching = true;
        a.pending()
    };
    // Waited for without the buffer's lock, so other threads' buffered
    // sends fail at once instead of blocking.
    let waited = wait_for(&pending);
    let mut guard = lock_buffer();
    let Some(a) = guard.as_mut() else {
        return Err(Error::new(
            ErrorClass::Intern,
            "the buffer vanished while it was being detached",
        ));
    };
    let reaped = waited.and_then(|()| a.reap());
    if let Err(e) = reaped {
        a.detaching = false;
        return Err(e);
    }
    if !a.segments.is_empty() {
        // New messages were refused while detaching, and the old ones are
        // complete: this cannot happen.
        a.detaching = false;
        return Err(Error::new(
            ErrorClass::Intern,
            format!(
                "{} buffered messages are still pending after the detach waited for them",
                a.segments.len()
            ),
        ));
    }
    let a = guard.take().expect("checked above");
    // SAFETY: `base`, `len` and `capacity` are those of the `Vec` that
    // `attach_buffer` forgot, and no send from it is pending any more.
    Ok(unsafe { Vec::from_raw_parts(a.base, a.len, a.capacity) })
}

/// Waits until every message buffered so far has been sent, keeping the
/// buffer attached (`MPI_Buffer_flush`, MPI 4.1). Without a buffer, there
/// is nothing to wait for.
pub fn flush_buffer() -> Result<()> {
    let pending = match lock_buffer().as_mut() {
        Some(a) => {
            a.reap()?;
            a.pending()
        }
        None => return Ok(()),
    };
    wait_for(&pending)?;
    if let Some(a) = lock_buffer().as_mut() {
        a.reap()?;
    }
    Ok(())
}

/// The buffered sends finalize waits for (MPI 4.1 §11.2.2: finalizing
/// completes buffered messages).
pub(crate) fn flush_at_finalize() {
    if let Err(e) = flush_buffer() {
        eprintln!("oxmpi: buffered messages could not be sent before finalizing: {e}");
    }
}

fn wait_for(pending: &[RequestId]) -> Result<()> {
    if pending.is_empty() {
        return Ok(());
    }
    progress_until(|d| Ok(pending.iter().all(|&id| d.is_complete(id)).then_some(())))
}

/// Starts a buffered send of `data` to `rank` of `comm` with `tag`: packs
/// it into the attached buffer and starts a standard send from the copy.
/// Returns the message's length once the send is started; the copy's
/// space is given back when it completes.
pub(crate) fn send(comm: &Communicator, rank: i32, tag: i32, data: &View<'_>) -> Result<usize> {
    comm.check_destination(rank, tag)?;
    let layout = data.layout()?;
    let len = layout.len;
    if rank == PROC_NULL {
        return Ok(len);
    }
    let need = len.saturating_add(BSEND_OVERHEAD);
    let mut guard = lock_buffer();
    let Some(a) = guard.as_mut() else {
        return Err(Error::new(
            ErrorClass::Buffer,
            format!(
                "a buffered send of {} bytes needs {need} bytes of an attached buffer \
                 ({} + BSEND_OVERHEAD {BSEND_OVERHEAD}), and no buffer is attached \
                 (0 bytes free): attach one with oxmpi::buffered::attach_buffer",
                len, len
            ),
        ));
    };
    if a.detaching {
        return Err(Error::new(
            ErrorClass::Buffer,
            format!(
                "a buffered send of {} bytes needs {need} bytes of the attached buffer, \
                 and the buffer is being detached",
                len
            ),
        ));
    }
    // Space of the sends that completed is free again; if that is not
    // enough, poll once (a send may just have finished) and look again.
    a.reap()?;
    let (index, offset) = match a.fit(need) {
        Some(place) => place,
        None => {
            with_device(|d| d.check_device(false))?;
            a.reap()?;
            a.fit(need).ok_or_else(|| a.no_room(len, need))?
        }
    };
    // SAFETY: `offset + len <= offset + need <= a.len` (`fit`), so the
    // range lies in the attached allocation, whose bytes are initialized
    // (they were a `Vec<u8>`'s); no pending send reads it (segments do not
    // overlap), and the program's `data` cannot be part of memory this
    // module owns.
    let copy = unsafe { std::slice::from_raw_parts_mut(a.base.add(offset), len) };
    data.pack_into(&layout, copy)?;
    // `start_send` needs the copy valid and unmodified until the send
    // completes: the range stays in `segments` until `reap` sees the send
    // complete, no other message is placed over it meanwhile, and the
    // allocation is neither moved nor freed before `detach_buffer` has
    // waited for every send in `segments`.
    let request = comm.start_send(rank, tag, copy, SendMode::Standard)?;
    a.segments.insert(
        index,
        Segment {
            offset,
            size: need,
            request,
            len,
            destination: rank,
        },
    );
    Ok(len)
}

impl Attached {
    /// Gives back the space of messages whose sends completed.
    fn reap(&mut self) -> Result<()> {
        if self.segments.is_empty() {
            return Ok(());
        }
        with_device(|d| {
            self.segments.retain(|s| {
                if !d.is_complete(s.request) {
                    return true;
                }
                if let Some(e) = d.take_status(s.request).and_then(|status| status.error) {
                    eprintln!(
                        "oxmpi: a buffered send of {} bytes to rank {} failed after it returned: {e}",
                        s.len, s.destination
                    );
                }
                false
            });
            Ok(())
        })
    }

    /// The sends still pending.
    fn pending(&self) -> Vec<RequestId> {
        self.segments.iter().map(|s| s.request).collect()
    }

    /// The first free range of `need` bytes: the index its segment takes
    /// in `segments`, and its offset.
    fn fit(&self, need: usize) -> Option<(usize, usize)> {
        first_fit(self.spans(), self.len, need)
    }

    fn spans(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.segments.iter().map(|s| (s.offset, s.size))
    }

    fn no_room(&self, len: usize, need: usize) -> Error {
        no_room(self.spans(), self.len, len, need)
    }
}

/// First fit among the free ranges of a buffer of `len` bytes whose used
/// ranges are `spans` (offset, size; sorted, not overlapping): the index
/// of the first span after the range, and the range's offset.
fn first_fit(
    spans: impl Iterator<Item = (usize, usize)>,
    len: usize,
    need: usize,
) -> Option<(usize, usize)> {
    let mut start = 0;
    let mut count = 0;
    for (index, (offset, size)) in spans.enumerate() {
        if offset - start >= need {
            return Some((index, start));
        }
        start = offset + size;
        count = index + 1;
    }
    (len - start >= need).then_some((count, start))
}

/// The error of a buffered send of `message` bytes, which needs `need`
/// bytes, when the buffer of `len` bytes with used ranges `spans` has no
/// free range that large.
fn no_room(
    spans: impl Iterator<Item = (usize, usize)>,
    len: usize,
    message: usize,
    need: usize,
) -> Error {
    let (mut used, mut largest, mut start, mut pending) = (0, 0, 0, 0);
    for (offset, size) in spans {
        used += size;
        largest = largest.max(offset - start);
        start = offset + size;
        pending += 1;
    }
    largest = largest.max(len - start);
    Error::new(
        ErrorClass::Buffer,
        format!(
            "a buffered send of {message} bytes needs {need} bytes of the attached buffer \
             ({message} + BSEND_OVERHEAD {BSEND_OVERHEAD}), and {} of its {len} bytes are free \
             (the largest free block is {largest} bytes; {pending} buffered messages are still \
             being sent): attach a larger buffer, or wait for earlier messages \
             (oxmpi::buffered::flush_buffer)",
            len - used,
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const TAKEN: [(usize, usize); 3] = [(0, 100), (150, 100), (400, 100)];

    #[test]
    fn first_fit_uses_the_first_gap_that_is_large_enough() {
        let fit = |need| first_fit(TAKEN.into_iter(), 1000, need);
        assert_eq!(fit(50), Some((1, 100)));
        assert_eq!(fit(51), Some((2, 250)));
        assert_eq!(fit(150), Some((2, 250)));
        assert_eq!(fit(500), Some((3, 500)));
        assert_eq!(fit(501), None);
        assert_eq!(first_fit([].into_iter(), 0, BSEND_OVERHEAD), None);
        assert_eq!(first_fit([].into_iter(), 96, 96), Some((0, 0)));
        assert_eq!(first_fit([(0, 96)].into_iter(), 96, 96), None);
    }

    #[test]
    fn no_room_says_what_was_needed_and_what_is_free() {
        let e = no_room(TAKEN.into_iter(), 1000, 904, 1000);
        assert_eq!(e.class(), ErrorClass::Buffer);
        let m = e.message();
        assert!(m.contains("needs 1000 bytes"), "{m}");
        assert!(m.contains("700 of its 1000 bytes are free"), "{m}");
        assert!(m.contains("largest free block is 500 bytes"), "{m}");
        assert!(m.contains("3 buffered messages"), "{m}");
    }

    #[test]
    fn attach_twice_is_an_error_and_detach_gives_the_memory_back() {
        let mut memory = Vec::with_capacity(4096);
        memory.resize(1000, 7u8);
        let at = memory.as_ptr();
        attach_buffer(memory).unwrap();
        let again = attach_buffer(vec![0; 10]).unwrap_err();
        assert_eq!(again.class(), ErrorClass::Buffer);
        assert!(again.message().contains("1000 bytes is already attached"));
        // Nothing pending: no device needed.
        flush_buffer().unwrap();
        let back = detach_buffer().unwrap();
        assert_eq!(
            (back.as_ptr(), back.len(), back.capacity()),
            (at, 1000, 4096)
        );
        assert_eq!(detach_buffer().unwrap_err().class(), ErrorClass::Buffer);
    }
}
