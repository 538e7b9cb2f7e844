//! The interface between the ADI and a communication method (transport).
//!
//! A transport moves packets (a [`Header`] and its payload) between this
//! process and its peers, named by their rank in the job ("world rank").
//! It never sees a communicator, a request or a matching queue: when a
//! packet arrives it asks the ADI, through [`PacketSink`], where the payload
//! goes, and writes it there. That is what makes the long protocol
//! zero-copy: a long message's data is read from the wire (or copied from a
//! shared segment, or RDMA-read) straight into the user's receive buffer.
//!
//! Required parts are the packet primitives: [`Transport::send`] (copying),
//! [`Transport::send_zcopy`] (the payload stays in the caller's buffer until
//! the send completes) and [`Transport::poll`]. Everything the ADI builds on
//! top (eager and rendezvous protocols, matching, requests) is in
//! [`crate::device`]. A transport with remote memory access (shm with
//! cross-memory attach) also offers [`Transport::remote_read`] and
//! [`Transport::remote_write`], and the ADI then moves a rendezvous's data
//! with them instead of data packets (see [`crate::proto`], "Remote memory
//! copy"); the ADI chooses the protocol in one place, `Device::start_send`,
//! and falls back to data packets whenever a copy is refused. A
//! transport whose NIC copies (verbs) offers the sender's buffer under a
//! key ([`Transport::remote_offer`]) and reads it asynchronously
//! ([`Transport::remote_read_start`], reported by
//! [`PacketSink::on_remote_read`]); the receiver then reads the whole
//! message ([`Transport::remote_reads_all`]).
//!
//! # One-sided channel (RDMA)
//! A transport whose NIC reads and writes registered memory of its peers
//! without their processes' help (verbs) also offers a small one-sided
//! channel, which the MPI layer's RMA uses through the device
//! (`Device::rdma_*`) without knowing the method:
//! [`Transport::rdma_register`] registers memory for peers to reach and
//! gives its remote key; [`Transport::rdma_post`] starts an [`RdmaOp`]
//! on a peer's registered memory ([`RdmaTarget`]) and names it by an id
//! ([`Transport::rdma_post_list`] starts several in order at once);
//! [`Transport::rdma_take`] returns its outcome once a
//! [`Transport::poll`] saw it complete. Data to write is copied when the
//! operation is posted, and data read is handed back by `rdma_take`, so
//! no caller memory is borrowed while an operation is under way.

use crate::error::{Error, ErrorClass, Result};
use crate::matching::Envelope;
use crate::proto::Header;
use std::os::fd::RawFd;

/// A peer process, by its rank in the job (`MPI_COMM_WORLD` rank).
pub type PeerRank = usize;

/// Where the ADI wants a packet's payload to go, returned by
/// [`PacketSink::on_header`]. The transport asks for the buffer itself with
/// [`PacketSink::payload_buffer`] each time it has bytes to place, so it
/// never holds a pointer into ADI or user memory across calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PayloadSlot(pub u64);

/// The ADI's side of a transport's [`Transport::poll`]: the transport
/// reports what arrived and what completed.
pub trait PacketSink {
    /// A packet header from `peer` was received and decoded. The ADI checks
    /// it (sequence, tokens, limits) and says where the payload goes:
    /// `Ok(None)` discards it; `Ok(Some(slot))` names a destination whose
    /// length may be shorter than the payload (a truncated receive), in
    /// which case the transport discards the excess. An error means the
    /// peer broke the protocol: the transport closes the connection and
    /// reports [`PacketSink::on_peer_failed`].
    fn on_header(&mut self, peer: PeerRank, header: &Header) -> Result<Option<PayloadSlot>>;

    /// The destination buffer of `slot`. The transport fills it from the
    /// start, in order, possibly over several calls to `poll`; the slice
    /// returned is the same each time.
    fn payload_buffer(&mut self, slot: PayloadSlot) -> &mut [u8];

    /// Every byte of the payload of `slot` has been placed (and any excess
    /// beyond the destination discarded).
    fn on_payload(&mut self, peer: PeerRank, slot: PayloadSlot);

    /// A whole packet from `peer` arrived at once: its header and all of
    /// its payload (`header.payload_len()` bytes). The checks and errors
    /// are those of [`PacketSink::on_header`]. The default delivers it in
    /// the three steps above; the ADI takes a short message in one step,
    /// matching it and copying it straight into the receive buffer. A
    /// transport calls it for packets that arrive whole (a short message
    /// in one shared-memory cell, a packet queued to the process itself).
    fn on_packet(&mut self, peer: PeerRank, header: &Header, payload: &[u8]) -> Result<()> {
        deliver_in_steps(self, peer, header, payload)
    }

    /// A whole standard eager message from `peer`: what
    /// [`PacketSink::on_packet`] takes with the header
    /// [`Header::standard_eager`] makes of `sequence`, `envelope` and the
    /// payload's length (no flags, no tokens), given as those parts. A
    /// transport whose frames for short messages carry only these (shm's
    /// one-cell messages) calls it, which spares the ADI building a whole
    /// header and judging the fields that such a frame cannot carry.
    fn on_standard_eager(
        &mut self,
        peer: PeerRank,
        sequence: u32,
        envelope: Envelope,
        payload: &[u8],
    ) -> Result<()> {
        let header = Header::standard_eager(sequence, envelope, payload.len());
        self.on_packet(peer, &header, payload)
    }

    /// A [`Transport::send_zcopy`] with this token has finished with the
    /// caller's buffer.
    fn on_send_complete(&mut self, token: u64);

    /// A read that [`Transport::remote_read_start`] started for `token`
    /// ended: `Ok(len)`, its `len` bytes landed; an error, it failed (a remote
    /// access error; the transport fails `peer` too when, as RC has it,
    /// the connection is then broken). A sink that never starts such reads
    /// keeps the default, which fails the peer: a transport that reports
    /// one to it broke the ADI's contract.
    fn on_remote_read(&mut self, peer: PeerRank, token: u64, outcome: Result<usize>) {
        let _ = outcome;
        self.on_peer_failed(
            peer,
            Error::new(
                ErrorClass::Intern,
                format!("a remote read for {token:#x} ended, and this sink started none"),
            ),
        );
    }

    /// The connection to `peer` is lost or broke the protocol. Every
    /// operation that needs the peer fails with `error`.
    fn on_peer_failed(&mut self, peer: PeerRank, error: Error);
}

/// Delivers a whole packet through [`PacketSink::on_header`],
/// [`PacketSink::payload_buffer`] and [`PacketSink::on_payload`]: the
/// default [`PacketSink::on_packet`], which a sink that overrides it
/// uses for the packets its fast path does not take.
pub fn deliver_in_steps<S: PacketSink + ?Sized>(
    sink: &mut S,
    peer: PeerRank,
    header: &Header,
    payload: &[u8],
) -> Result<()> {
    if let Some(slot) = sink.on_header(peer, header)? {
        let dest = sink.payload_buffer(slot);
        let n = dest.len().min(payload.len());
        dest[..n].copy_from_slice(&payload[..n]);
        sink.on_payload(peer, slot);
    }
    Ok(())
}

/// A communication method, as the ADI drives it.
pub trait Transport: Send {
    /// Short name, as in `OXMPI_TRANSPORTS` and business-card keys (`tcp`).
    fn name(&self) -> &'static str;

    /// This process's business card for the method, published in the KVS
    /// under `oxmpi-card-<name>-<rank>` at initialization.
    fn card(&self) -> &str;

    /// Whether a peer that published `card` can be reached by this method.
    fn reachable(&self, card: &str) -> bool;

    /// Binds `peer` to this transport, with the card it published. Called
    /// at most once per peer, before the first send to it. Connecting may
    /// be deferred until the first packet.
    fn add_peer(&mut self, peer: PeerRank, card: &str) -> Result<()>;

    /// At initialize, once the routes are planned: `peer`'s route is this
    /// transport and it published `card`. A transport whose connections
    /// need both sides' part before the first packet can arrive (RC queue
    /// pairs must be ready to receive) does that part here; the VC is still
    /// bound, and [`Transport::add_peer`] called, on first use. The
    /// default does nothing. An error fails initialize.
    fn prepare_peer(&mut self, peer: PeerRank, card: &str) -> Result<()> {
        let _ = (peer, card);
        Ok(())
    }

    /// Largest message (in bytes) sent with the short (eager) protocol.
    fn eager_limit(&self) -> usize;

    /// Largest message (in bytes) that is always sent eagerly; a longer
    /// one of contiguous data, up to [`Transport::eager_limit`], goes by
    /// remote copy where the transport offers it to the peer and none of
    /// this rank's is under way to it
    /// ([`Transport::remote_copies_under_way`]), else eagerly: a single
    /// copy is faster for a message its receiver waits for alone, while
    /// messages that follow one another move faster through the queues
    /// (their two copies overlap with the next messages'). The default,
    /// the eager limit, sends every message up to it eagerly.
    fn always_eager_limit(&self) -> usize {
        self.eager_limit()
    }

    /// Whether a buffer of this rank's is offered to `peer` for a remote
    /// copy ([`Transport::remote_offer`]) and not yet withdrawn: a message
    /// to `peer` now follows another closely. The default: none known.
    fn remote_copies_under_way(&self, peer: PeerRank) -> bool {
        let _ = peer;
        false
    }

    /// Sends a packet. The payload is copied if it cannot leave at once, so
    /// the caller's buffer is free when this returns. Fails (class
    /// `ProcFailed`) if the peer is known to be lost.
    fn send(&mut self, peer: PeerRank, header: &Header, payload: &[u8]) -> Result<()>;

    /// Sends a standard eager message as [`Transport::send`] sends the
    /// packet [`Header::standard_eager`] makes of `sequence`, `envelope`
    /// and the payload's length (the blocking and immediate standard
    /// sends' short messages). The default builds that header; a
    /// transport with a frame that carries only these parts (shm's
    /// one-cell messages) writes them without it. The receiver gets the
    /// same packet either way.
    fn send_standard_eager(
        &mut self,
        peer: PeerRank,
        sequence: u32,
        envelope: Envelope,
        payload: &[u8],
    ) -> Result<()> {
        let header = Header::standard_eager(sequence, envelope, payload.len());
        self.send(peer, &header, payload)
    }

    /// Sends a packet whose payload is `parts` one after another, as
    /// [`Transport::send`] sends their concatenation. The default
    /// concatenates them (one copy); a transport that writes vectored
    /// overrides it, so that a large part (a one-sided put's data behind
    /// its header) leaves from where it is.
    fn send_parts(&mut self, peer: PeerRank, header: &Header, parts: &[&[u8]]) -> Result<()> {
        match parts {
            [payload] => self.send(peer, header, payload),
            _ => self.send(peer, header, &parts.concat()),
        }
    }

    /// Sends a packet whose payload stays in the caller's memory, without
    /// copying it. [`PacketSink::on_send_complete`] with `token` reports,
    /// from a later [`Transport::poll`], that the memory is free again
    /// (possibly from this very call's first poll). If the peer fails
    /// first, [`PacketSink::on_peer_failed`] is reported instead, after
    /// which the memory is no longer used.
    ///
    /// # Safety
    /// `payload` must be valid for reads of `len` bytes, and must stay
    /// valid and unmodified until the completion or failure is reported.
    unsafe fn send_zcopy(
        &mut self,
        peer: PeerRank,
        header: &Header,
        payload: *const u8,
        len: usize,
        token: u64,
    ) -> Result<()>;

    /// Makes progress without blocking: accepts and completes connections,
    /// writes queued data, reads and delivers packets to `sink`. Returns
    /// whether anything happened.
    fn poll(&mut self, sink: &mut dyn PacketSink) -> Result<bool>;

    /// Prepares for the device to sleep: returns a file descriptor that
    /// becomes readable when [`Transport::poll`] has work, so that a blocked
    /// wait can sleep in the kernel, or `None` when the transport must be
    /// polled (shared memory). A transport may keep its sockets out of the
    /// kernel's wake-up machinery while the device spins (it costs on every
    /// arrival) and arm it here. Wake-ups stay armed, whatever `poll` does,
    /// until [`Transport::disarm_wakeup`]: other threads may still sleep.
    fn arm_wakeup(&mut self) -> Result<Option<RawFd>>;

    /// The last sleeper woke: the transport may stop arming wake-ups.
    fn disarm_wakeup(&mut self) -> Result<()>;

    /// Whether data accepted by `send`/`send_zcopy` is still waiting to
    /// leave this process. Finalize polls until it is not.
    fn has_pending_sends(&self) -> bool;

    /// The device starts sending the answers to the active messages of
    /// one poll (a target's one-sided replies and gets' data): until
    /// [`Transport::end_batch`], the transport may hold back the packets
    /// of at most [`Transport::eager_limit`] payload bytes it is given and
    /// write them together then, in the order they were sent (one system
    /// call for several, where each would take its own). Returns whether
    /// it does: the device then sends ready messages up to the eager
    /// limit as zero-copy packets ([`Transport::send_zcopy`]), which are
    /// held without a copy. The default holds nothing back.
    fn begin_batch(&mut self) -> bool {
        false
    }

    /// Ends what [`Transport::begin_batch`] began: writes what was held
    /// back, as much as the sockets take (the rest leaves from later
    /// polls). A peer lost in the write is reported from the next poll.
    fn end_batch(&mut self) {}

    /// Whether rendezvous data with `peer` may move by remote memory copy
    /// ([`Transport::remote_read`], [`Transport::remote_write`]). A
    /// transport without remote memory access keeps the default, `false`.
    fn offers_remote_copy(&self, peer: PeerRank) -> bool {
        let _ = peer;
        false
    }

    /// Copies `len` bytes from address `remote` in `peer`'s memory to
    /// `local`. `Ok(false)`: the system refuses remote copies (from now
    /// on, [`Transport::offers_remote_copy`] says no), nothing was copied,
    /// and the caller moves the data another way. An error (class
    /// `ProcFailed`) means the peer named memory it does not have, or is
    /// gone; the transport fails the peer.
    ///
    /// # Safety
    /// `local` must be valid for writes of `len` bytes, with nothing else
    /// reading or writing it during the call.
    unsafe fn remote_read(
        &mut self,
        peer: PeerRank,
        remote: u64,
        local: *mut u8,
        len: usize,
    ) -> Result<bool> {
        let _ = (peer, remote, local, len);
        Ok(false)
    }

    /// Copies `len` bytes from `local` to address `remote` in `peer`'s
    /// memory; the outcomes are those of [`Transport::remote_read`].
    ///
    /// # Safety
    /// `local` must be valid for reads of `len` bytes during the call.
    unsafe fn remote_write(
        &mut self,
        peer: PeerRank,
        local: *const u8,
        remote: u64,
        len: usize,
    ) -> Result<bool> {
        let _ = (peer, local, remote, len);
        Ok(false)
    }

    /// Whether the receiver of a remote-copy rendezvous reads the whole
    /// message (the NIC moves it: verbs' RDMA READ) rather than half of
    /// it while the sender writes the rest (two cores copy at once: shm's
    /// cross-memory attach, the default). Fixed for the transport's life.
    fn remote_reads_all(&self) -> bool {
        false
    }

    /// Offers `len` bytes at `buf` to `peer` for a remote-copy rendezvous:
    /// returns the key the peer's [`Transport::remote_read_start`] names
    /// it by (0 where the transport needs none), or `None` when it is not
    /// offered (the rendezvous then moves the data in packets). The
    /// default offers it, keyless, wherever
    /// [`Transport::offers_remote_copy`] says so.
    ///
    /// # Safety
    /// `buf` must stay valid for reads of `len` bytes, and unmodified,
    /// until [`Transport::remote_withdraw`] with the key, or the peer
    /// fails.
    unsafe fn remote_offer(
        &mut self,
        peer: PeerRank,
        buf: *const u8,
        len: usize,
    ) -> Result<Option<u64>> {
        let _ = (buf, len);
        Ok(self.offers_remote_copy(peer).then_some(0))
    }

    /// The rendezvous that [`Transport::remote_offer`] offered a buffer
    /// for, with `key`, is over: the peer reads no more of it.
    fn remote_withdraw(&mut self, peer: PeerRank, key: u64) {
        let _ = (peer, key);
    }

    /// Starts copying `len` bytes from address `remote` (offered with
    /// `key`) in `peer`'s memory to `local`, for the receive `token`.
    /// [`RemoteRead::Done`] and [`RemoteRead::Refused`] are the outcomes
    /// of [`Transport::remote_read`], which the default calls;
    /// [`RemoteRead::Started`]: the copy goes on without the caller, and
    /// [`PacketSink::on_remote_read`] reports its end from a later poll.
    /// An error means nothing was started (class `ProcFailed`: the peer
    /// is lost).
    ///
    /// # Safety
    /// `local` must be valid for writes of `len` bytes, with nothing else
    /// reading or writing it, until the copy ended (`Done`, or its report)
    /// or the peer failed.
    unsafe fn remote_read_start(
        &mut self,
        peer: PeerRank,
        remote: u64,
        key: u64,
        local: *mut u8,
        len: usize,
        token: u64,
    ) -> Result<RemoteRead> {
        let _ = (key, token);
        // SAFETY: this function's contract includes `remote_read`'s.
        Ok(if unsafe { self.remote_read(peer, remote, local, len)? } {
            RemoteRead::Done
        } else {
            RemoteRead::Refused
        })
    }

    /// Whether one-sided operations on `peer`'s registered memory
    /// ([`Transport::rdma_post`]) are offered, done by the NIC without the
    /// peer's process. The default: no.
    fn offers_rdma(&self, peer: PeerRank) -> bool {
        let _ = peer;
        false
    }

    /// The largest [`RdmaOp::Write`] or [`RdmaOp::Read`] one post takes.
    fn rdma_max_len(&self) -> usize {
        0
    }

    /// Registers `len` bytes at `addr` for peers to read, write and run
    /// atomics on with the returned key, until
    /// [`Transport::rdma_deregister`] (or the transport is dropped).
    ///
    /// # Safety
    /// The memory must stay allocated until it is deregistered, and the
    /// caller must not hold Rust references to bytes peers may write
    /// meanwhile.
    unsafe fn rdma_register(&mut self, addr: *mut u8, len: usize) -> Result<RdmaRegion> {
        let _ = (addr, len);
        Err(Error::new(
            ErrorClass::UnsupportedOperation,
            format!("the {} transport has no one-sided channel", self.name()),
        ))
    }

    /// Revokes a registration: from now on peers' operations on it fail.
    /// An unknown handle is ignored.
    fn rdma_deregister(&mut self, handle: u64) {
        let _ = handle;
    }

    /// Starts `op` on `peer`'s memory at `at`. `Ok(Some(id))`: posted, its
    /// outcome comes from [`Transport::rdma_take`] with `id` after a later
    /// poll; `Ok(None)`: no room now (operations in flight): poll and post
    /// again. An error (a lost peer: `ProcFailed`) means nothing was posted.
    fn rdma_post(&mut self, peer: PeerRank, at: RdmaTarget, op: RdmaOp<'_>) -> Result<Option<u64>> {
        let _ = (peer, at, op);
        Err(Error::new(
            ErrorClass::UnsupportedOperation,
            format!("the {} transport has no one-sided channel", self.name()),
        ))
    }

    /// Starts `ops` on `peer`'s memory in order, each as
    /// [`Transport::rdma_post`] would (an operation at its target), as
    /// many as there is room for now, and pushes the id of each one
    /// posted to `ids`: those are the first ones of `ops`. `Ok` with fewer
    /// pushed than `ops` (even none): no room for the rest now: poll and
    /// post them again. An error: the operations whose ids were pushed are
    /// posted (their outcomes come as any posted operation's), the rest
    /// not. The default posts them one by one with `rdma_post`; a
    /// transport that posts several at once (verbs: one list of work
    /// requests) overrides it.
    fn rdma_post_list(
        &mut self,
        peer: PeerRank,
        ops: &[(RdmaTarget, RdmaOp<'_>)],
        ids: &mut Vec<u64>,
    ) -> Result<()> {
        for &(at, op) in ops {
            match self.rdma_post(peer, at, op)? {
                Some(id) => ids.push(id),
                None => break,
            }
        }
        Ok(())
    }

    /// The outcome of the operation `id` once it completed (once): the
    /// bytes read, the old value of an atomic's word (8 bytes, native
    /// order), nothing for a write; or why it failed (a remote access
    /// error: `MPI_ERR_RMA_RANGE`; a lost peer: `ProcFailed`). `None`
    /// while it is under way.
    fn rdma_take(&mut self, id: u64) -> Option<Result<Vec<u8>>> {
        let _ = id;
        None
    }
}

/// What [`Transport::remote_read_start`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RemoteRead {
    /// Every byte is copied.
    Done,
    /// The system refuses remote copies: nothing was copied, and from now
    /// on [`Transport::offers_remote_copy`] says no.
    Refused,
    /// The copy is under way; [`PacketSink::on_remote_read`] reports its
    /// end.
    Started,
}

/// Memory of this process registered for peers' one-sided operations
/// ([`Transport::rdma_register`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RdmaRegion {
    /// The transport's name for the registration, for
    /// [`Transport::rdma_deregister`].
    pub handle: u64,
    /// The key peers name it by in an [`RdmaTarget`].
    pub rkey: u32,
}

/// Where a one-sided operation lands at a peer: an address in the peer's
/// process inside a region it registered, and that region's key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RdmaTarget {
    /// Address in the peer's process.
    pub addr: u64,
    /// The remote key of the peer's registration that covers it.
    pub rkey: u32,
}

/// A one-sided operation ([`Transport::rdma_post`]). Lengths are at most
/// [`Transport::rdma_max_len`]; atomics act on one 8-byte-aligned word of
/// the target, in the target's byte order, and return its old value.
#[derive(Clone, Copy, Debug)]
pub enum RdmaOp<'a> {
    /// Writes these bytes (copied when posted) at the target.
    Write(&'a [u8]),
    /// Reads this many bytes from the target.
    Read(usize),
    /// Adds to the target word (wrapping).
    FetchAdd(u64),
    /// Replaces the target word by `swap` if it equals `compare`.
    CompareSwap {
        /// The value expected.
        compare: u64,
        /// The value stored when it matched.
        swap: u64,
    },
}

/// What every transport needs to know about the job it is part of.
#[derive(Clone)]
pub struct JobInfo {
    /// This process's rank in the job.
    pub rank: PeerRank,
    /// Number of processes in the job.
    pub size: usize,
    /// The job's secret: only members know it; connections prove it.
    pub secret: [u8; 32],
}

impl std::fmt::Debug for JobInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the secret.
        f.debug_struct("JobInfo")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .finish_non_exhaustive()
    }
}
