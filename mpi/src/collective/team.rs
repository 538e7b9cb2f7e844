//! The message layer of the collectives: a [`Team`] of processes that
//! exchange messages on one context, and [`Scratch`] buffers.
//!
//! Every algorithm is a sequence of [`Team::exchange`] steps. A step posts
//! its receives first, then its sends (device requests on the collective
//! context), and waits for all of them before it returns: no step waits
//! for a send whose receiver could be waiting for it, so a step never
//! deadlocks, whatever protocol (eager or rendezvous) the messages take,
//! and no buffer is used by the device after its borrow ends.
//!
//! Messages of one collective kind carry one internal tag (negative, so
//! never one a program can use); consecutive collectives on a communicator
//! stay apart because every process calls them in the same order and the
//! messages between two processes are not overtaken.

use crate::{progress_until, with_device, Error, ErrorClass, Result};
use oxmpi_adi::device::{MatchPattern, MessageEnvelope, RequestId, Status};
use oxmpi_adi::transport::PeerRank;
use std::cell::RefCell;

/// The tag of each kind of collective's messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
pub(crate) enum CollectiveTag {
    Barrier = -2,
    Broadcast = -3,
    Reduce = -4,
    AllReduce = -5,
    Gather = -6,
    Scatter = -7,
    AllGather = -8,
    AllToAll = -9,
    ReduceScatter = -10,
    Scan = -11,
    ExclusiveScan = -12,
    /// The agreement on a new communicator's context id, and the exchange
    /// of colours and keys of a split.
    Communicator = -13,
    /// The making of a communicator's shared region (`node`).
    Node = -14,
}

/// The processes of one collective operation, as seen from one of them.
pub(crate) struct Team<'a> {
    /// Packet context of the messages.
    context: u32,
    tag: i32,
    /// This process's index in the team.
    rank: usize,
    /// World rank of each member, by team index.
    world: &'a [PeerRank],
    /// The source rank each member's messages carry, when it is not its
    /// team index: a team of some of a communicator's members (a group)
    /// uses their ranks in the communicator, so its messages never match
    /// those of other teams on the same context.
    sources: Option<&'a [i32]>,
    /// The first message that did not have the length this process
    /// expected (arguments that differ between processes): reported when
    /// the operation ends, after the algorithm went on to its end so that
    /// no other process waits for this one.
    mismatch: RefCell<Option<Error>>,
}

impl<'a> Team<'a> {
    /// The team of `world` (world ranks by team index) in which this
    /// process is `rank`, exchanging messages on `context` with `tag`;
    /// `sources` as in the field's docs.
    pub(crate) fn new(
        context: u32,
        tag: i32,
        rank: usize,
        world: &'a [PeerRank],
        sources: Option<&'a [i32]>,
    ) -> Team<'a> {
        Team {
            context,
            tag,
            rank,
            world,
            sources,
            mismatch: RefCell::new(None),
        }
    }

    /// This process's index in the team.
    pub(crate) fn rank(&self) -> usize {
        self.rank
    }

    /// Number of processes in the team.
    pub(crate) fn size(&self) -> usize {
        self.world.len()
    }

    fn source_of(&self, member: usize) -> i32 {
        match self.sources {
            Some(sources) => sources[member],
            None => member as i32,
        }
    }

    /// Runs the operation `f` on the team: its result, or the first
    /// mismatch of lengths it met.
    pub(crate) fn run<R>(&self, f: impl FnOnce(&Team<'a>) -> Result<R>) -> Result<R> {
        let result = f(self)?;
        match self.mismatch.borrow_mut().take() {
            Some(e) => Err(e),
            None => Ok(result),
        }
    }

    /// One step: receives into each buffer of `recvs` a message from its
    /// member, and sends each buffer of `sends` to its member. Returns
    /// once all are complete. A received message of another length than
    /// its buffer is noted (see [`Team::run`]) and the step goes on; any
    /// other failure (a lost peer) is returned.
    pub(crate) fn exchange(
        &self,
        sends: &[(usize, &[u8])],
        recvs: &mut [(usize, &mut [u8])],
    ) -> Result<()> {
        let mut started: Vec<RequestId> = Vec::with_capacity(sends.len() + recvs.len());
        let envelope = MessageEnvelope {
            context_id: self.context,
            source: self.source_of(self.rank),
            tag: self.tag,
        };
        let posted = with_device(|d| {
            for (from, buf) in recvs.iter_mut() {
                let pattern = MatchPattern {
                    context_id: self.context,
                    source: Some(self.source_of(*from)),
                    tag: Some(self.tag),
                };
                // SAFETY: `buf` stays exclusively borrowed until this
                // function returns, and it returns only once the request
                // is complete (below, also when posting fails).
                let id = unsafe {
                    d.start_recv(
                        pattern,
                        Some(self.world[*from]),
                        buf.as_mut_ptr(),
                        buf.len(),
                    )
                }?;
                started.push(id);
            }
            for &(to, bytes) in sends {
                // SAFETY: `bytes` stays borrowed, unmodified, until this
                // function returns, which it does only once the request
                // is complete.
                let id = unsafe {
                    d.start_send(self.world[to], envelope, bytes.as_ptr(), bytes.len(), false)
                }?;
                started.push(id);
            }
            Ok(())
        });
        if let Err(e) = posted {
            // Nothing may outlive the step: take back the receives that
            // can be taken back, and let the rest complete.
            with_device(|d| {
                for &id in &started {
                    d.cancel(id);
                }
                Ok(())
            })?;
            complete(&started)?;
            return Err(e);
        }
        let statuses = complete(&started)?;
        let (received, sent) = statuses.split_at(recvs.len());
        for (status, (from, buf)) in received.iter().zip(recvs.iter()) {
            self.judge_receive(status, *from, buf.len())?;
        }
        for status in sent {
            if let Some(e) = &status.error {
                return Err(e.clone());
            }
        }
        Ok(())
    }

    /// Notes a message of the wrong length; returns any other error.
    fn judge_receive(&self, status: &Status, from: usize, expected: usize) -> Result<()> {
        let mismatch = match &status.error {
            Some(e) if e.class() == ErrorClass::Truncate => Error::new(
                ErrorClass::Truncate,
                format!(
                    "rank {from} sent more than the {expected} bytes this rank expects: \
                     the processes passed different counts"
                ),
            ),
            Some(e) => return Err(e.clone()),
            None if status.count != expected => Error::new(
                ErrorClass::Count,
                format!(
                    "rank {from} sent {} bytes where this rank expects {expected}: \
                     the processes passed different counts",
                    status.count
                ),
            ),
            None => return Ok(()),
        };
        self.note_mismatch(mismatch);
        Ok(())
    }

    /// Notes that the processes passed arguments that do not agree; the
    /// operation goes on and fails with the first such error at its end.
    pub(crate) fn note_mismatch(&self, error: Error) {
        self.mismatch.borrow_mut().get_or_insert(error);
    }

    /// Sends `bytes` to `to`.
    pub(crate) fn send(&self, to: usize, bytes: &[u8]) -> Result<()> {
        self.exchange(&[(to, bytes)], &mut [])
    }

    /// Receives into `buf` from `from`.
    pub(crate) fn receive(&self, from: usize, buf: &mut [u8]) -> Result<()> {
        self.exchange(&[], &mut [(from, buf)])
    }

    /// Sends `bytes` to `to` while receiving into `buf` from `from`.
    pub(crate) fn send_receive(
        &self,
        to: usize,
        bytes: &[u8],
        from: usize,
        buf: &mut [u8],
    ) -> Result<()> {
        self.exchange(&[(to, bytes)], &mut [(from, buf)])
    }
}

/// Waits for every request of `ids` and takes their statuses, in order.
fn complete(ids: &[RequestId]) -> Result<Vec<Status>> {
    progress_until(|d| {
        if !ids.iter().all(|&id| d.is_complete(id)) {
            return Ok(None);
        }
        ids.iter()
            .map(|&id| {
                d.take_status(id).ok_or_else(|| {
                    Error::new(
                        ErrorClass::Intern,
                        "a collective's request was freed by someone else",
                    )
                })
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    })
}

/// A temporary buffer of bytes, aligned for every element type (16
/// bytes), so that reductions can view any part of it that starts at a
/// whole element as elements.
pub(crate) struct Scratch {
    words: Vec<u128>,
    len: usize,
}

impl Scratch {
    /// `len` zero bytes.
    pub(crate) fn zeroed(len: usize) -> Scratch {
        Scratch {
            words: vec![0; len.div_ceil(16)],
            len,
        }
    }

    /// A copy of `bytes`.
    pub(crate) fn copy_of(bytes: &[u8]) -> Scratch {
        let mut scratch = Scratch::zeroed(bytes.len());
        scratch.bytes_mut().copy_from_slice(bytes);
        scratch
    }

    /// The bytes.
    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: the words hold at least `len` initialized bytes, and a
        // `u128` has no padding.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr().cast::<u8>(), self.len) }
    }

    /// The bytes, to change.
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, borrowed exclusively; any bytes make a
        // valid `u128`.
        unsafe { std::slice::from_raw_parts_mut(self.words.as_mut_ptr().cast::<u8>(), self.len) }
    }
}
