//! The message layer of the collectives: a [`Team`] of processes that
//! exchange messages on one context, and [`Scratch`] buffers.
//!
//! Every algorithm is an `async fn`: a sequence of [`Team::exchange`]
//! steps. A step posts its receives first, then its sends (device
//! requests on the collective context), and is done once all of them are
//! complete: no step waits for a send whose receiver could be waiting for
//! it, so a step never deadlocks, whatever protocol (eager or rendezvous)
//! the messages take, and no buffer is used by the device after its
//! borrow ends. `engine` carries the algorithms out: to the end at once
//! for a blocking collective, or step by step as progress is made for a
//! non-blocking one.
//!
//! The messages of one collective carry an internal tag (negative, so
//! never one a program can use) made of its kind and of its number in
//! the sequence of the communicator's collectives, which every process
//! counts alike because all start them in the same order
//! ([`CollectiveTag::numbered`]). So several non-blocking collectives
//! under way at once on a communicator never take each other's messages,
//! whatever order they advance in; within one collective, messages
//! between two processes are not overtaken.

use super::engine;
use super::typed::{Inbound, Outbound};
use crate::{progress_until, with_device, Error, ErrorClass, Result};
use oxmpi_adi::device::{Device, MatchPattern, MessageEnvelope, RequestId, Status};
use oxmpi_adi::transport::PeerRank;
use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// The tag of each kind of collective's messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
pub(crate) enum CollectiveTag {
    Barrier = -2,
    Broadcast = -3,
    Reduce = -4,
    AllReduce = -5,
    Gather = -6,
    /// A scatter's messages; and, under the number of a collective that
    /// runs a broadcast by messages (a broadcast, an intercommunicator's
    /// all-reduce; none of them scatters under it too), that broadcast's
    /// scatter when the root's length chooses scatter and all-gather: the
    /// chunks, each followed by the root's length
    /// ([`CollectiveTag::BroadcastLong`]), so that the length never
    /// arrives ahead of the chunk it announces.
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
    /// A broadcast's messages when the root's length chooses scatter and
    /// all-gather (the length and the all-gather; the chunks go as
    /// [`CollectiveTag::Scatter`]): apart from those of the binomial
    /// tree, so that a process learns which the root chose from which
    /// message comes.
    BroadcastLong = -15,
}

/// How many collectives a communicator numbers apart before the numbers
/// (and tags) come round again: 2^27, so that a tag holds the number and
/// the kind.
const SEQUENCE_SPAN: u32 = 1 << 27;

impl CollectiveTag {
    /// The tag of the messages of the collective numbered `sequence` on
    /// its communicator: `-(sequence mod 2^27 * 16 + kind)`, always below
    /// -1 (the kinds are 2 to 15).
    pub(crate) fn numbered(self, sequence: u32) -> i32 {
        let kind = -(self as i32);
        -(((sequence % SEQUENCE_SPAN) as i32) << 4 | kind)
    }

    /// The tag of kind `self` of the collective whose tag of some kind is
    /// `tag` (made by [`CollectiveTag::numbered`]).
    fn renumbered(self, tag: i32) -> i32 {
        -((-tag) & !0xf | -(self as i32))
    }

    /// The kind of the collective whose tag is `tag` (made by
    /// [`CollectiveTag::numbered`]), in words, for error messages.
    fn name_of(tag: i32) -> &'static str {
        use CollectiveTag::*;
        let names = [
            (Barrier, "barrier"),
            (Broadcast, "broadcast"),
            (BroadcastLong, "broadcast"),
            (Reduce, "reduce"),
            (AllReduce, "all-reduce"),
            (Gather, "gather"),
            (Scatter, "scatter"),
            (AllGather, "all-gather"),
            (AllToAll, "all-to-all"),
            (ReduceScatter, "reduce-scatter"),
            (Scan, "scan"),
            (ExclusiveScan, "exclusive scan"),
            (Communicator, "communicator's construction"),
            (Node, "shared region's set-up"),
        ];
        let kind = -((-tag) & 0xf);
        names
            .iter()
            .find(|(k, _)| *k as i32 == kind)
            .map_or("collective", |&(_, name)| name)
    }
}

/// The number of one collective call on its communicator
/// ([`Communicator::next_collective`](crate::comm::Communicator::next_collective)),
/// taken when the call is made, before its arguments are checked, so that
/// a call that fails at some processes only still keeps their counts in
/// step. Not `Copy`: one number makes one collective's tag.
#[derive(Debug)]
pub(crate) struct Sequence(pub(crate) u32);

impl Sequence {
    /// The tag of the messages of this collective, of kind `kind`.
    pub(crate) fn tag(self, kind: CollectiveTag) -> i32 {
        kind.numbered(self.0)
    }
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

    /// The same processes exchanging messages of kind `kind` of the same
    /// collective. Mismatches it notes are its own until
    /// [`Team::adopt_mismatch`] takes them.
    pub(crate) fn retagged(&self, kind: CollectiveTag) -> Team<'a> {
        Team {
            tag: kind.renumbered(self.tag),
            mismatch: RefCell::new(None),
            ..*self
        }
    }

    /// Notes the first mismatch `other` noted, if this team has none.
    pub(crate) fn adopt_mismatch(&self, other: Team<'_>) {
        if let Some(e) = other.mismatch.into_inner() {
            self.note_mismatch(e);
        }
    }

    /// What collective the team carries out, in words (for error
    /// messages).
    pub(crate) fn collective(&self) -> &'static str {
        CollectiveTag::name_of(self.tag)
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

    /// Runs the blocking operation `f` on the team: its result, or the
    /// first mismatch of lengths it met.
    pub(crate) fn run<R>(&self, f: impl FnOnce(&Team<'a>) -> Result<R>) -> Result<R> {
        let result = f(self);
        self.outcome(result)
    }

    /// Carries out `algorithm` (an algorithm over this team) to its end:
    /// its result, or the first mismatch of lengths it met.
    pub(crate) async fn complete<R>(
        &self,
        algorithm: impl Future<Output = Result<R>>,
    ) -> Result<R> {
        let result = algorithm.await;
        self.outcome(result)
    }

    /// `result`, unless it succeeded after a mismatch was noted.
    fn outcome<R>(&self, result: Result<R>) -> Result<R> {
        let result = result?;
        match self.mismatch.borrow_mut().take() {
            Some(e) => Err(e),
            None => Ok(result),
        }
    }

    /// One step of byte buffers: [`Team::exchange_data`] of `sends` and
    /// `recvs`.
    pub(crate) async fn exchange(
        &self,
        sends: &[(usize, &[u8])],
        recvs: &mut [(usize, &mut [u8])],
    ) -> Result<()> {
        let sends = sends
            .iter()
            .map(|&(to, bytes)| (to, bytes.into()))
            .collect();
        let recvs = recvs
            .iter_mut()
            .map(|(from, buf)| (*from, (&mut **buf).into()))
            .collect();
        self.exchange_data(sends, recvs).await
    }

    /// One step: receives into each of `recvs` a message from its member,
    /// and sends each of `sends` to its member; done once all are
    /// complete. Data that is not bytes (a window of a buffer's packed
    /// data) is packed or unpacked piece by piece by the device, never
    /// whole. A received message of another length than its room is
    /// noted (see [`Team::complete`]) and the step goes on; any other
    /// failure (a lost peer) is returned.
    ///
    /// The buffers stay borrowed until the step is done; a step dropped
    /// before that takes back the receives it can and waits for the rest
    /// (see [`Messages`]), so the device never uses a buffer after its
    /// borrow ends.
    pub(crate) async fn exchange_data(
        &self,
        sends: Vec<(usize, Outbound<'_>)>,
        recvs: Vec<(usize, Inbound<'_>)>,
    ) -> Result<()> {
        let sends = sends.into_iter().map(|(to, data)| (self, to, data));
        self.exchange_kinds(sends, recvs).await
    }

    /// One step as [`Team::exchange_data`] whose sends may be of other
    /// kinds of the same collective: each of `sends` goes with the tag of
    /// its team (this one or one [`Team::retagged`] from it). Sends to one
    /// member leave in their order, so a step can send a member two
    /// messages it tells apart by their kinds without waiting between
    /// them.
    pub(crate) async fn exchange_kinds<'t, 'w: 't>(
        &self,
        sends: impl IntoIterator<
            Item = (&'t Team<'w>, usize, Outbound<'_>),
            IntoIter: ExactSizeIterator,
        >,
        recvs: Vec<(usize, Inbound<'_>)>,
    ) -> Result<()> {
        let received = self.exchange_statuses(sends, recvs).await?;
        for r in &received {
            self.judge_receive(&r.status, r.from, r.room)?;
        }
        Ok(())
    }

    /// One step as [`Team::exchange_data`] whose messages may be shorter
    /// than their room (a stream of pieces, where a short one is the
    /// last): returns the length of each received message, in the order
    /// of `recvs`. Only a message longer than its room is noted.
    pub(crate) async fn exchange_up_to(
        &self,
        sends: Vec<(usize, Outbound<'_>)>,
        recvs: Vec<(usize, Inbound<'_>)>,
    ) -> Result<Vec<usize>> {
        let sends = sends.into_iter().map(|(to, data)| (self, to, data));
        let received = self.exchange_statuses(sends, recvs).await?;
        received
            .iter()
            .map(|r| match r.status.error {
                Some(_) => self
                    .judge_receive(&r.status, r.from, r.room)
                    .map(|()| r.room),
                None => Ok(r.status.count),
            })
            .collect()
    }

    /// Posts the step's receives, then its sends, and waits until all are
    /// complete: what each receive got (in order), or the first failure
    /// of a send. The sends are taken as they are posted, so that
    /// a caller that makes them on the way (a map over its list) needs no
    /// second list.
    async fn exchange_statuses<'t, 'w: 't>(
        &self,
        sends: impl IntoIterator<
            Item = (&'t Team<'w>, usize, Outbound<'_>),
            IntoIter: ExactSizeIterator,
        >,
        recvs: Vec<(usize, Inbound<'_>)>,
    ) -> Result<Vec<Received>> {
        let sends = sends.into_iter();
        if sends.len() == 0 && recvs.is_empty() {
            // A step with no messages (a process alone, a leaf's turn to
            // pass nothing on): no device call.
            return Ok(Vec::new());
        }
        let receives = recvs.len();
        let mut messages = Messages {
            ids: Vec::with_capacity(receives + sends.len()),
            receives,
        };
        let posted = with_device(|d| {
            for (from, inbound) in recvs {
                // SAFETY: `inbound` stays borrowed until this step is
                // done (its lifetime is the future's), and `messages`
                // (dropped first, also when the step is dropped
                // unfinished) waits for the request to complete.
                messages
                    .ids
                    .push(unsafe { self.post_receive(d, from, inbound) }?);
            }
            for (team, to, outbound) in sends {
                let envelope = MessageEnvelope {
                    context_id: self.context,
                    source: self.source_of(self.rank),
                    tag: team.tag,
                };
                let id = match outbound {
                    // SAFETY: `bytes` stays borrowed, unmodified, until
                    // this step is done, and `messages` waits for the
                    // request to complete.
                    Outbound::Bytes(bytes) => unsafe {
                        d.start_send(self.world[to], envelope, bytes.as_ptr(), bytes.len(), false)
                    },
                    Outbound::Packed(window, _) => {
                        d.start_send_packed(self.world[to], envelope, Box::new(window), false)
                    }
                }?;
                messages.ids.push(Posted {
                    id,
                    member: to,
                    room: 0,
                });
            }
            // Often all are done at once (eager sends, receives of
            // messages that had arrived): then no wait, and no second
            // turn of the device lock.
            messages.take_if_complete(d)
        });
        // A failure to post drops `messages`, which takes back or waits
        // for what was posted.
        match posted? {
            Some(statuses) => Ok(statuses),
            None => (&mut messages).await,
        }
    }

    /// Posts the receive of a message of this team's tag from `from`
    /// into `inbound`: the request, with its member and room.
    ///
    /// # Safety
    /// The memory `inbound` borrows must stay valid, and untouched, until
    /// the request completes.
    unsafe fn post_receive(
        &self,
        d: &mut Device,
        from: usize,
        inbound: Inbound<'_>,
    ) -> Result<Posted> {
        let room = inbound.len();
        let pattern = MatchPattern {
            context_id: self.context,
            source: Some(self.source_of(from)),
            tag: Some(self.tag),
        };
        let peer = Some(self.world[from]);
        let id = match inbound {
            // SAFETY: the caller's guarantee, passed on.
            Inbound::Bytes(buf) => unsafe {
                d.start_recv(pattern, peer, buf.as_mut_ptr(), buf.len())
            },
            Inbound::Unpacked(window, _) => d.start_recv_unpacked(pattern, peer, Box::new(window)),
        }?;
        Ok(Posted {
            id,
            member: from,
            room,
        })
    }

    /// Receives from `from` whichever of two messages comes: one of this
    /// team's tag into `mine`, or one of `other`'s tag (the same members,
    /// [`Team::retagged`]) into `theirs`; the other receive is taken
    /// back. For a process that learns which way a collective goes from
    /// which message comes. Returns whether `mine` got it, and its
    /// length; a length that differs from its room is noted, as in
    /// [`Team::exchange_data`].
    pub(crate) async fn receive_either(
        &self,
        from: usize,
        mine: Inbound<'_>,
        other: &Team<'_>,
        theirs: Inbound<'_>,
    ) -> Result<(bool, usize)> {
        let mut messages = Messages {
            ids: Vec::with_capacity(2),
            receives: 2,
        };
        with_device(|d| {
            for (team, inbound) in [(self, mine), (other, theirs)] {
                // SAFETY: both stay borrowed until this step is done
                // (their lifetimes are the future's), and `messages`
                // (also when the step is dropped unfinished) waits for
                // the requests to complete.
                let posted = unsafe { team.post_receive(d, from, inbound) }?;
                messages.ids.push(posted);
            }
            Ok(())
        })?;
        OneOf(&mut messages).await?;
        with_device(|d| {
            for &Posted { id, .. } in &messages.ids {
                if !d.is_complete(id) {
                    d.cancel(id);
                }
            }
            Ok(())
        })?;
        let received = (&mut messages).await?;
        let got = received
            .iter()
            .position(|r| !r.status.cancelled)
            .ok_or_else(|| {
                Error::new(
                    ErrorClass::Intern,
                    "both receives of a collective's step were taken back",
                )
            })?;
        let r = &received[got];
        self.judge_receive(&r.status, from, r.room)?;
        Ok((got == 0, r.status.count))
    }

    /// Notes a message of the wrong length; returns any other error.
    fn judge_receive(&self, status: &Status, from: usize, expected: usize) -> Result<()> {
        let mismatch = match &status.error {
            Some(e) if e.class() == ErrorClass::Truncate => Error::new(
                ErrorClass::Truncate,
                format!(
                    "{}: rank {from} sent more than the {expected} bytes this rank expects \
                     ({}): the processes passed different counts",
                    self.collective(),
                    e.message()
                ),
            ),
            Some(e) => return Err(e.clone()),
            None => {
                self.note_length(from, status.count, expected);
                return Ok(());
            }
        };
        self.note_mismatch(mismatch);
        Ok(())
    }

    /// Notes that member `from` has `sent` bytes where this process
    /// expects `expected`, if they differ: more is `MPI_ERR_TRUNCATE`, as
    /// a receive's overflow; less is `MPI_ERR_COUNT`.
    pub(crate) fn note_length(&self, from: usize, sent: usize, expected: usize) {
        let class = match sent.cmp(&expected) {
            std::cmp::Ordering::Equal => return,
            std::cmp::Ordering::Greater => ErrorClass::Truncate,
            std::cmp::Ordering::Less => ErrorClass::Count,
        };
        self.note_mismatch(Error::new(
            class,
            format!(
                "{}: rank {from} sent {sent} bytes where this rank expects {expected}: \
                 the processes passed different counts",
                self.collective()
            ),
        ));
    }

    /// Notes that the processes passed arguments that do not agree; the
    /// operation goes on and fails with the first such error at its end.
    pub(crate) fn note_mismatch(&self, error: Error) {
        self.mismatch.borrow_mut().get_or_insert(error);
    }

    /// Sends `bytes` to `to`.
    pub(crate) async fn send(&self, to: usize, bytes: &[u8]) -> Result<()> {
        self.exchange(&[(to, bytes)], &mut []).await
    }

    /// Receives into `buf` from `from`.
    pub(crate) async fn receive(&self, from: usize, buf: &mut [u8]) -> Result<()> {
        self.exchange(&[], &mut [(from, buf)]).await
    }

    /// Sends `bytes` to `to` while receiving into `buf` from `from`.
    pub(crate) async fn send_receive(
        &self,
        to: usize,
        bytes: &[u8],
        from: usize,
        buf: &mut [u8],
    ) -> Result<()> {
        self.exchange(&[(to, bytes)], &mut [(from, buf)]).await
    }
}

/// The device requests of one step, as a future of what its receives got
/// (in order) once all are complete, or of the first failure of a send. Dropped with requests still pending (the step was abandoned,
/// or failed while posting), it cancels the receives that have not
/// matched and waits until every request is complete, so that no buffer
/// outlives its use by the device.
struct Messages {
    /// The receives first, then the sends.
    ids: Vec<Posted>,
    /// How many of `ids` are receives.
    receives: usize,
}

/// A request of a step: its id, the member it receives from or sends to,
/// and a receive's room (bytes), kept with the request so that the step
/// judges what came without a list of its own.
struct Posted {
    id: RequestId,
    member: usize,
    room: usize,
}

/// What a receive of a step got: its status, from which member, into how
/// many bytes of room.
struct Received {
    status: Status,
    from: usize,
    room: usize,
}

impl Messages {
    /// What the receives got, every request's status taken from the
    /// device, if all are complete (else nothing is taken); or the first
    /// failure of a send. A send's status is looked at, not kept: only
    /// its error matters to a step.
    fn take_if_complete(&mut self, d: &mut Device) -> Result<Option<Vec<Received>>> {
        if !self.ids.iter().all(|p| d.is_complete(p.id)) {
            return Ok(None);
        }
        let mut received = Vec::with_capacity(self.receives);
        let mut failed_send = None;
        for (i, posted) in std::mem::take(&mut self.ids).into_iter().enumerate() {
            let Posted { id, member, room } = posted;
            let status = d.take_status(id).ok_or_else(|| {
                Error::new(
                    ErrorClass::Intern,
                    "a collective's request was freed by someone else",
                )
            })?;
            if i < self.receives {
                received.push(Received {
                    status,
                    from: member,
                    room,
                });
            } else if failed_send.is_none() {
                failed_send = status.error;
            }
        }
        match failed_send {
            Some(e) => Err(e),
            None => Ok(Some(received)),
        }
    }
}

impl Future for &mut Messages {
    type Output = Result<Vec<Received>>;

    fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Self::Output> {
        let messages = self.get_mut();
        match with_device(|d| messages.take_if_complete(d)) {
            Ok(Some(statuses)) => Poll::Ready(Ok(statuses)),
            Ok(None) => {
                engine::waiting_for(messages.ids.iter().map(|p| p.id));
                Poll::Pending
            }
            Err(e) => Poll::Ready(Err(e)),
        }
    }
}

/// The step of [`Messages`] that is done once any one of its requests
/// is complete (nothing is taken from the device).
struct OneOf<'m>(&'m mut Messages);

impl Future for OneOf<'_> {
    type Output = Result<()>;

    fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Self::Output> {
        let ids = &self.get_mut().0.ids;
        match with_device(|d| Ok(ids.iter().any(|p| d.is_complete(p.id)))) {
            Ok(true) => Poll::Ready(Ok(())),
            Ok(false) => {
                engine::waiting_for_one_of(ids.iter().map(|p| p.id));
                Poll::Pending
            }
            Err(e) => Poll::Ready(Err(e)),
        }
    }
}

impl Drop for Messages {
    fn drop(&mut self) {
        if self.ids.is_empty() {
            return;
        }
        let ids: Vec<RequestId> = std::mem::take(&mut self.ids)
            .into_iter()
            .map(|p| p.id)
            .collect();
        let finished = with_device(|d| {
            for &id in &ids {
                d.cancel(id);
            }
            Ok(())
        })
        .and_then(|()| {
            progress_until(|d| {
                if !ids.iter().all(|&id| d.is_complete(id)) {
                    return Ok(None);
                }
                for &id in &ids {
                    d.take_status(id);
                }
                Ok(Some(()))
            })
        });
        // Either way the buffers are free: a failed peer's requests are
        // failed, not pending, and without a device nothing uses them.
        if let Err(e) = finished {
            eprintln!("oxmpi: finishing an abandoned collective step failed: {e}");
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbered_tags_are_internal_and_distinct() {
        let kinds = [
            CollectiveTag::Barrier,
            CollectiveTag::Broadcast,
            CollectiveTag::AllReduce,
            CollectiveTag::ExclusiveScan,
            CollectiveTag::Communicator,
        ];
        let sequences = [0, 1, 2, 1000, SEQUENCE_SPAN - 1, u32::MAX];
        let mut tags = Vec::new();
        for kind in kinds {
            for sequence in sequences {
                let tag = kind.numbered(sequence);
                assert!(tag < -1, "{kind:?} {sequence}: {tag}");
                tags.push(tag);
            }
        }
        // u32::MAX comes round to SEQUENCE_SPAN - 1; all others differ.
        tags.sort_unstable();
        tags.dedup();
        assert_eq!(tags.len(), kinds.len() * (sequences.len() - 1));
        assert_eq!(
            CollectiveTag::Scan.numbered(SEQUENCE_SPAN),
            CollectiveTag::Scan.numbered(0)
        );
        for sequence in sequences {
            let long = CollectiveTag::BroadcastLong;
            let tag = CollectiveTag::Broadcast.numbered(sequence);
            assert_eq!(long.renumbered(tag), long.numbered(sequence));
            assert_ne!(long.renumbered(tag), tag);
        }
    }
}
