//! Collective operations (MPI 4.1 §6).
//!
//! The collectives are methods of [`Communicator`] (those without a root:
//! [`Communicator::barrier`], [`Communicator::all_reduce_into`], ...) and of
//! [`Process`] as the root (`let root = world.process_at_rank(0)`, then
//! [`Process::broadcast_into`], [`Process::reduce_into_root`] at the root
//! and [`Process::reduce_into`] elsewhere, ...), with rsmpi's names. Every
//! process of the communicator calls the same collectives in the same
//! order. A variant that takes its input from the output buffer
//! (`MPI_IN_PLACE`) is named `..._in_place`. Varying counts
//! (`..._varcount_...`) take a [`Partition`] or [`PartitionMut`]: counts
//! and displacements in elements, as MPI's `v` variants do.
//!
//! ```no_run
//! use oxmpi::collective::SystemOperation;
//! let universe = oxmpi::initialize().unwrap();
//! let world = universe.world();
//! let root = world.process_at_rank(0);
//! let mut data = [0u64; 4];
//! if world.rank() == 0 {
//!     data = [1, 2, 3, 4];
//! }
//! root.broadcast_into(&mut data).unwrap();
//! let mut sum = [0u64; 4];
//! world.all_reduce_into(&data, &mut sum, SystemOperation::sum()).unwrap();
//! assert_eq!(sum[3], 4 * world.size() as u64);
//! ```
//!
//! # Non-blocking collectives
//! Each collective, in place or not, also has a non-blocking form
//! (`MPI_Ibarrier` ... `MPI_Iexscan`, §6.12) named `immediate_...`, which
//! borrows its buffers for the lifetime of a [`Scope`] (as immediate
//! point-to-point operations do; varying counts take the [`Partition`] or
//! [`PartitionMut`] by value) and returns a [`Request`]. It runs the same
//! algorithm as the blocking form, step by step: every call that makes
//! progress advances it (a wait or test of any request, a probe, a
//! blocking call), so a process that only tests another request still
//! moves it on. Any number may be under way at once on one communicator,
//! together with point-to-point messages, and be completed in any order;
//! every process starts a communicator's collectives (blocking or not) in
//! the same order. Arguments a process can check alone fail at the call.
//! A collective advances in the calls of the thread that started it: a
//! request waited for in another thread completes only while that
//! thread also makes calls.
//!
//! ```no_run
//! use oxmpi::collective::SystemOperation;
//! let universe = oxmpi::initialize().unwrap();
//! let world = universe.world();
//! let mine = [world.rank() as u64; 4];
//! let mut sum = [0u64; 4];
//! let mut data = [0u8; 100];
//! oxmpi::request::scope(|scope| {
//!     let reduce = world
//!         .immediate_all_reduce_into(scope, &mine, &mut sum, SystemOperation::sum())
//!         .unwrap();
//!     let broadcast = world
//!         .process_at_rank(0)
//!         .immediate_broadcast_into(scope, &mut data)
//!         .unwrap();
//!     // ... work, or other communication, meanwhile ...
//!     oxmpi::request::wait_all(vec![broadcast, reduce]).unwrap();
//! });
//! ```
//!
//! # Algorithms
//! Chosen by size and number of processes as MPICH chooses them: a
//! dissemination barrier; broadcast down a binomial tree (short), or
//! scattered and all-gathered by recursive doubling or around a ring
//! (long); reduce up a binomial tree, or Rabenseifner's reduce-scatter and
//! gather (long, commutative); all-reduce by recursive doubling, or
//! Rabenseifner's reduce-scatter and all-gather; all-gather by recursive
//! doubling, Bruck's algorithm or a ring; all-to-all all at once (small
//! blocks) or by pairwise exchange; scans by recursive doubling. A
//! non-power-of-two number of processes is folded into a power of two.
//! The messages travel on the communicator's collective context, so they
//! never match the program's own.
//!
//! # Errors
//! Arguments a process can check alone fail before anything is sent:
//! a root outside the communicator (`MPI_ERR_ROOT`, also for calling a
//! root's method at another process or the reverse), buffers whose
//! lengths do not fit (`MPI_ERR_COUNT`), send and receive buffers of
//! different types (`MPI_ERR_TYPE`), a predefined operation on a type it
//! is not defined for (`MPI_ERR_OP`), a freed communicator
//! (`MPI_ERR_COMM`). When the processes' counts disagree, a process that
//! receives more than it expects fails with `MPI_ERR_TRUNCATE` and one
//! that receives less with `MPI_ERR_COUNT`, after taking its part in the
//! whole operation. An error of a blocking collective, or of starting a
//! non-blocking one, goes to the communicator's error handler first
//! (`crate::errhandler`).
//!
//! # Intercommunicators
//! On an intercommunicator the collectives move data between the two
//! groups (MPI 4.1 §6.2.2; see `inter`): the barrier, all-reduce,
//! reduce-scatter(-block), all-gather(v) and all-to-all(v, w) methods
//! (and their non-blocking forms) work there with ranks and counts that
//! address the remote group; the rooted ones are
//! [`Communicator::reduce_from_remote_group`] at the root (`MPI_ROOT`),
//! [`Communicator::reduce_to_remote_group`] in the other group and
//! [`Communicator::pass_remote_group_collective`] at the root's group
//! mates (`MPI_PROC_NULL`), and their kin, each with its `immediate_`
//! form.

pub(crate) mod algorithms;
pub(crate) mod engine;
mod inter;
pub(crate) mod node;
pub(crate) mod op;
pub(crate) mod partition;
pub(crate) mod schedule;
pub(crate) mod team;
pub(crate) mod typed;

pub use op::{
    reduce_local_into, DynBuffer, DynBufferMut, Operation, SystemOperation, UserOperation,
    ValueIndex,
};
pub use partition::{Partition, PartitionMut};

use crate::comm::{Communicator, Process};
use crate::datatype::{Buffer, BufferMut, ElementType};
use crate::request::{Request, Scope};
use crate::{Error, ErrorClass, Result};
use algorithms::{IN_PLACE_PIECE, REDUCTION_SEGMENT};
use node::NodeRegion;
use op::{same_element_type, Reduction};
use partition::{consecutive_blocks, disjoint_blocks, uniform_blocks, BlockOwner};
use schedule::{all_to_all_algorithm, AllToAllAlgorithm, REDUCE_SHORT};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use team::{CollectiveTag, Sequence};
use typed::{pieces_of_each, whole_messages, Inbound, Input, Outbound, Output, Pieces, Segments};

/// The environment variable that makes the reductions that go by
/// messages agree on their data's length before they reduce it (`1`), so
/// that processes that passed different counts fail with
/// `MPI_ERR_COUNT` instead of waiting for each other. Off (`0`, the
/// default) since the agreement costs every all-reduce and reduce by
/// messages longer than 2 KiB one more run of small messages (about 5 us
/// between two ranks over TCP loopback): a debugging aid, as MPICH's and
/// Open MPI's collective checks are. Every process of a job must be given
/// the same value. The checks that cost no message (lengths of messages
/// received, stamps in the shared region) are always made.
pub const CHECK_COUNTS_ENV: &str = "OXMPI_CHECK_COUNTS";

/// [`CHECK_COUNTS_ENV`] as initialize read it.
static CHECKS_COUNTS: AtomicBool = AtomicBool::new(false);

/// Reads [`CHECK_COUNTS_ENV`] (at initialize): an error for a value other
/// than `0` or `1`.
pub(crate) fn read_count_checking() -> Result<()> {
    let on = crate::switch_from_env(
        CHECK_COUNTS_ENV,
        "reductions by messages agree on their length first",
    )?;
    CHECKS_COUNTS.store(on, Ordering::Relaxed);
    Ok(())
}

/// Whether a reduction by messages whose data is longer than
/// [`REDUCE_SHORT`] agrees on its length first ([`CHECK_COUNTS_ENV`]).
fn agrees_on_length(len: usize) -> bool {
    len > REDUCE_SHORT && CHECKS_COUNTS.load(Ordering::Relaxed)
}

/// Whether a collective runs to its end in the call (blocking) or is
/// started to be completed later (non-blocking): only a blocking one may
/// use the shared-memory algorithms (`node`), which wait in the call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Blocking,
    Immediate,
}

/// `MPI_ERR_COUNT`: `what` is wrong with the lengths.
fn count_error(what: String) -> Error {
    Error::new(ErrorClass::Count, what)
}

/// `result`, an error's message led by the name of the collective
/// `what` (the shared-memory paths do not know which they serve).
fn in_collective<T>(what: &str, result: Result<T>) -> Result<T> {
    result.map_err(|e| Error::new(e.class(), format!("{what}: {}", e.message())))
}

/// Checks that `len` bytes split into `parts` whole blocks of elements
/// of `element_type`, and returns the block's length in bytes.
fn block_of(len: usize, parts: usize, element_type: ElementType, what: &str) -> Result<usize> {
    let element = element_type.size();
    if !len.is_multiple_of(parts * element) {
        return Err(count_error(format!(
            "{what} of {} elements does not split into {parts} equal blocks, one per process",
            len / element
        )));
    }
    Ok(len / parts)
}

/// Checks that `actual` bytes are the `expected`.
fn expect_len(actual: usize, expected: usize, element_type: ElementType, what: &str) -> Result<()> {
    if actual != expected {
        let element = element_type.size();
        return Err(count_error(format!(
            "{what} holds {} elements where {} are needed",
            actual / element,
            expected / element
        )));
    }
    Ok(())
}

impl Communicator {
    /// Carries out a blocking collective: its error goes to the
    /// communicator's error handler first.
    pub(crate) fn blocking(&self, operation: impl Future<Output = Result<()>>) -> Result<()> {
        self.handled(engine::block_on(operation))
    }

    /// Starts a non-blocking collective that borrows its buffers for
    /// `'a`: an error at its start, and one it ends with (when its
    /// request completes), goes to the communicator's error handler first.
    pub(crate) fn immediate<'a>(
        &self,
        scope: &Scope<'a>,
        operation: impl Future<Output = Result<()>> + 'a,
    ) -> Result<Request<'a>> {
        self.handled(engine::start(scope, self, operation))
    }

    /// [`Communicator::immediate`] for a collective that borrows nothing.
    fn immediate_static<'a>(
        &self,
        operation: impl Future<Output = Result<()>> + 'static,
    ) -> Result<Request<'a>> {
        self.handled(engine::start_static(self, operation))
    }

    /// Waits until every process of the communicator has called it
    /// (`MPI_Barrier`, §6.3).
    pub fn barrier(&self) -> Result<()> {
        self.handled(self.barrier_unhandled())
    }

    /// [`Communicator::barrier`] with its error returned, not handed to
    /// the error handler: for a call of MPI's own that hands its outcome
    /// to a handler once (`Window::fence`, `Window::free`).
    pub(crate) fn barrier_unhandled(&self) -> Result<()> {
        engine::block_on(self.barrier_future(self.next_collective(), Mode::Blocking))
    }

    /// [`Communicator::barrier_unhandled`] by messages alone, as the
    /// non-blocking form goes: it never makes the communicator's shared
    /// region of collectives, for a barrier that may be its only
    /// collective (`Window::free`).
    pub(crate) fn barrier_by_messages_unhandled(&self) -> Result<()> {
        engine::block_on(self.barrier_future(self.next_collective(), Mode::Immediate))
    }

    /// The non-blocking form of [`Communicator::barrier`] (`MPI_Ibarrier`,
    /// §6.12): starts it and returns its request, complete once every
    /// process has started it. It borrows nothing, so it needs no scope
    /// and may be given any lifetime (to be waited for in a list with
    /// requests of a scope).
    pub fn immediate_barrier<'a>(&self) -> Result<Request<'a>> {
        let comm = self.clone();
        let sequence = comm.next_collective();
        self.immediate_static(async move { comm.barrier_future(sequence, Mode::Immediate).await })
    }

    async fn barrier_future(&self, sequence: Sequence, mode: Mode) -> Result<()> {
        if let Some(node) = self.node_of_all_for(&sequence, mode)? {
            return node.barrier(sequence.0);
        }
        let team = self.team(sequence, CollectiveTag::Barrier)?;
        team.complete(algorithms::barrier(&team)).await
    }

    /// The shared region for collective `sequence`, when it may use one:
    /// a blocking collective (a non-blocking one must not wait for the
    /// others at its start) on a communicator whose processes share one.
    /// Called first, before the collective checks its arguments, so that
    /// every process takes part in making the region at the same call
    /// (see `node`); the caller then checks that its data fits.
    fn node_for(&self, sequence: &Sequence, mode: Mode) -> Result<Option<&NodeRegion>> {
        if mode == Mode::Immediate {
            return Ok(None);
        }
        self.node(sequence)
    }

    /// [`Communicator::node_for`] for a collective that may use the
    /// region of both groups of an intercommunicator
    /// ([`Communicator::node_of_both_groups`]: the barrier and the
    /// all-reduce, which run on every process of both groups).
    fn node_of_all_for(&self, sequence: &Sequence, mode: Mode) -> Result<Option<&NodeRegion>> {
        if self.is_inter_communicator() && mode == Mode::Blocking {
            return self.node_of_both_groups(sequence);
        }
        self.node_for(sequence, mode)
    }

    /// All-reduces `acc`: through the shared region `node` (see
    /// [`Communicator::node_for`]) if the data fits, else by messages,
    /// one segment of [`REDUCTION_SEGMENT`] at a time (each an
    /// all-reduce of its own), so that data that is not contiguous is
    /// never packed whole.
    async fn all_reduce_segments(
        &self,
        sequence: Sequence,
        acc: &mut Segments<'_>,
        red: &Reduction<'_>,
        node: Option<&NodeRegion>,
    ) -> Result<()> {
        let whole = 0..acc.len();
        let unit = red.unit_size();
        if self.is_inter_communicator() {
            return self.inter_all_reduce(sequence, acc, red, node).await;
        }
        if let Some(node) = node.filter(|node| node.all_reduces_long(whole.len(), unit)) {
            return in_collective("all-reduce", node.all_reduce_long(sequence.0, acc, red));
        }
        if node.is_some() || whole.len() <= REDUCTION_SEGMENT {
            let data = acc.load(whole.clone())?;
            self.all_reduce_whole(sequence, data, red, node).await?;
            return acc.store(whole);
        }
        let team = self.team(sequence, CollectiveTag::AllReduce)?;
        team.complete(async {
            if agrees_on_length(acc.len()) {
                algorithms::agree_all_reduce_length(&team, acc.len()).await?;
            }
            let segments = acc.ranges(REDUCTION_SEGMENT, unit);
            acc.each(segments, async |data| {
                algorithms::all_reduce(&team, data, red).await
            })
            .await
        })
        .await
    }

    /// All-reduces `data`, whole (one segment at most, or data the
    /// shared region takes whole), as [`Communicator::all_reduce_segments`]
    /// chooses the way: the path of data that is contiguous and short,
    /// without the set-up of [`Segments`].
    async fn all_reduce_whole(
        &self,
        sequence: Sequence,
        data: &mut [u8],
        red: &Reduction<'_>,
        node: Option<&NodeRegion>,
    ) -> Result<()> {
        if self.is_inter_communicator() {
            let mut acc = Segments::new(None, Some(Pieces::Bytes(data)))?;
            return self.inter_all_reduce(sequence, &mut acc, red, node).await;
        }
        if let Some(node) = node {
            if node.all_reduces_long(data.len(), red.unit_size()) {
                let mut acc = Segments::new(None, Some(Pieces::Bytes(data)))?;
                return in_collective(
                    "all-reduce",
                    node.all_reduce_long(sequence.0, &mut acc, red),
                );
            }
            if node.all_reduces_by_slots(data.len(), red.unit_size()) {
                return in_collective("all-reduce", node.all_reduce(sequence.0, data, red));
            }
        }
        let team = self.team(sequence, CollectiveTag::AllReduce)?;
        team.complete(async {
            if agrees_on_length(data.len()) {
                algorithms::agree_all_reduce_length(&team, data.len()).await?;
            }
            algorithms::all_reduce(&team, data, red).await
        })
        .await
    }

    /// Reduces `acc` to `root`, as [`Communicator::all_reduce_segments`]
    /// chooses the way (but for the staging areas).
    async fn reduce_segments(
        &self,
        sequence: Sequence,
        root: usize,
        acc: &mut Segments<'_>,
        red: &Reduction<'_>,
        node: Option<&NodeRegion>,
    ) -> Result<()> {
        if let Some(node) = node {
            if node.fits(acc.len()) {
                let whole = 0..acc.len();
                let data = acc.load(whole.clone())?;
                in_collective("reduce", node.reduce(sequence.0, root, data, red))?;
                return acc.store(whole);
            }
            // Too long for a slot: by messages, once the root has seen
            // that every process passed this length (one whose data fits
            // a slot is on the path above, and waits for no one).
            in_collective("reduce", node.announce(sequence.0, root, acc.len()))?;
        }
        let team = self.team(sequence, CollectiveTag::Reduce)?;
        team.complete(async {
            if node.is_none() && agrees_on_length(acc.len()) {
                algorithms::agree_reduce_length(&team, root, red.is_commutative(), acc.len())
                    .await?;
            }
            let segments = acc.ranges(REDUCTION_SEGMENT, red.unit_size());
            acc.each(segments, async |data| {
                algorithms::reduce(&team, root, data, red).await
            })
            .await
        })
        .await
    }

    /// A scan (`kind` [`CollectiveTag::Scan`]) or exclusive scan
    /// ([`CollectiveTag::ExclusiveScan`]) of `acc`, one segment of
    /// [`REDUCTION_SEGMENT`] at a time (each a scan of its own), the last
    /// always short (see [`Segments::ranges_ending_short`]).
    async fn scan_segments(
        &self,
        sequence: Sequence,
        acc: &mut Segments<'_>,
        red: &Reduction<'_>,
        kind: CollectiveTag,
    ) -> Result<()> {
        let team = self.team(sequence, kind)?;
        let segments = acc.ranges_ending_short(REDUCTION_SEGMENT, red.unit_size());
        team.complete(acc.each(segments, async |data| {
            if kind == CollectiveTag::Scan {
                algorithms::scan(&team, data, red).await
            } else {
                algorithms::exclusive_scan(&team, data, red).await
            }
        }))
        .await
    }

    /// Reduces `input` (`None`: `out`'s data, in place) and scatters its
    /// `blocks` (by rank), this rank's into `out` (at its start), a
    /// segment at a time (see `algorithms::reduce_scatter`); on an
    /// intercommunicator, the input is the remote group's.
    async fn reduce_scatter_pieces<'p>(
        &self,
        sequence: Sequence,
        input: Option<&mut Pieces<'p>>,
        blocks: &[std::ops::Range<usize>],
        out: &mut Pieces<'p>,
        red: &Reduction<'_>,
    ) -> Result<()> {
        let input = match (self.is_inter_communicator(), input) {
            (true, Some(input)) => {
                return self
                    .inter_reduce_scatter(sequence, input, blocks, out, red)
                    .await
            }
            (_, input) => input,
        };
        let team = self.team(sequence, CollectiveTag::ReduceScatter)?;
        team.complete(algorithms::reduce_scatter(&team, input, blocks, out, red))
            .await
    }

    /// Gathers every process's `send` into `recv` at every process, in
    /// rank order (`MPI_Allgather`, §6.7). `recv` holds `size` times
    /// `send`.
    pub fn all_gather_into<S, R>(&self, send: &S, recv: &mut R) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
    {
        self.handled(self.all_gather_into_unhandled(send, recv))
    }

    /// [`Communicator::all_gather_into`] with its error returned, not
    /// handed to the error handler: for a call of MPI's own that hands
    /// its outcome to a handler once (as `Window::allocate_shared`).
    pub(crate) fn all_gather_into_unhandled<S, R>(&self, send: &S, recv: &mut R) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
    {
        engine::block_on(self.all_gather_into_future(self.next_collective(), send, recv))
    }

    /// The non-blocking form of [`Communicator::all_gather_into`]
    /// (`MPI_Iallgather`, §6.12): starts it and returns its request; the
    /// buffers stay borrowed until it completes.
    pub fn immediate_all_gather_into<'a, S, R>(
        &self,
        scope: &Scope<'a>,
        send: &'a S,
        recv: &'a mut R,
    ) -> Result<Request<'a>>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
    {
        let comm = self.clone();
        let sequence = comm.next_collective();
        self.immediate(scope, async move {
            comm.all_gather_into_future(sequence, send, recv).await
        })
    }

    async fn all_gather_into_future<S, R>(
        &self,
        sequence: Sequence,
        send: &S,
        recv: &mut R,
    ) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
    {
        let (send, send_type) = Pieces::of_buffer(send)?;
        let (mut recv, recv_type) = Pieces::into_buffer(recv)?;
        let element_type = same_element_type(send_type, recv_type)?;
        if self.is_inter_communicator() {
            // Every process of the remote group sends blocks of one
            // length, which need not be this group's.
            let n = self.addressed_size();
            let block = block_of(recv.len(), n.max(1), element_type, "the receive buffer")?;
            let (sends, recvs) = to_everyone(&send, &mut recv, &uniform_blocks(n, block))?;
            return self
                .inter_all_to_all(sequence, sends, recvs, all_to_all_algorithm(block))
                .await;
        }
        let n = self.size() as usize;
        expect_len(
            recv.len(),
            n * send.len(),
            element_type,
            "the receive buffer",
        )?;
        let team = self.team(sequence, CollectiveTag::AllGather)?;
        team.complete(algorithms::all_gather_pieces(&team, Some(&send), &mut recv))
            .await
    }

    /// [`Communicator::all_gather_into`] in place: each process's block
    /// of `buf` (its rank's) is its input (`MPI_Allgather` with
    /// `MPI_IN_PLACE`).
    pub fn all_gather_in_place<R: BufferMut + ?Sized>(&self, buf: &mut R) -> Result<()> {
        self.blocking(self.all_gather_in_place_future(self.next_collective(), buf))
    }

    /// The non-blocking form of [`Communicator::all_gather_in_place`]
    /// (`MPI_Iallgather`, §6.12): starts it and returns its request; the
    /// buffers stay borrowed until it completes.
    pub fn immediate_all_gather_in_place<'a, R: BufferMut + ?Sized>(
        &self,
        scope: &Scope<'a>,
        buf: &'a mut R,
    ) -> Result<Request<'a>> {
        let comm = self.clone();
        let sequence = comm.next_collective();
        self.immediate(scope, async move {
            comm.all_gather_in_place_future(sequence, buf).await
        })
    }

    async fn all_gather_in_place_future<R: BufferMut + ?Sized>(
        &self,
        sequence: Sequence,
        buf: &mut R,
    ) -> Result<()> {
        let n = self.size() as usize;
        let (mut buf, element_type) = Pieces::into_buffer(buf)?;
        block_of(buf.len(), n, element_type, "the buffer")?;
        let team = self.team(sequence, CollectiveTag::AllGather)?;
        team.complete(algorithms::all_gather_pieces(&team, None, &mut buf))
            .await
    }

    /// Gathers every process's `send`, of any length, into the blocks of
    /// `recv` at every process (`MPI_Allgatherv`, §6.7): block `i` (count
    /// and displacement `i`, which must not overlap) receives rank `i`'s.
    pub fn all_gather_varcount_into<S, R, C, D>(
        &self,
        send: &S,
        recv: &mut PartitionMut<'_, R, C, D>,
    ) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
        C: std::borrow::Borrow<[i32]>,
        D: std::borrow::Borrow<[i32]>,
    {
        self.blocking(self.all_gather_varcount_into_future(self.next_collective(), send, recv))
    }

    /// The non-blocking form of [`Communicator::all_gather_varcount_into`]
    /// (`MPI_Iallgatherv`, §6.12): starts it and returns its request; the
    /// buffers stay borrowed until it completes.
    pub fn immediate_all_gather_varcount_into<'a, S, R, C, D>(
        &self,
        scope: &Scope<'a>,
        send: &'a S,
        mut recv: PartitionMut<'a, R, C, D>,
    ) -> Result<Request<'a>>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
        C: std::borrow::Borrow<[i32]> + 'a,
        D: std::borrow::Borrow<[i32]> + 'a,
    {
        let comm = self.clone();
        let sequence = comm.next_collective();
        self.immediate(scope, async move {
            comm.all_gather_varcount_into_future(sequence, send, &mut recv)
                .await
        })
    }

    async fn all_gather_varcount_into_future<S, R, C, D>(
        &self,
        sequence: Sequence,
        send: &S,
        recv: &mut PartitionMut<'_, R, C, D>,
    ) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
        C: std::borrow::Borrow<[i32]>,
        D: std::borrow::Borrow<[i32]>,
    {
        let (send, send_type) = Pieces::of_buffer(send)?;
        same_element_type(send_type, recv.element_type())?;
        let n = self.addressed_size();
        let (parts, mut recv) = recv.pieces(BlockOwner::Rank, n)?;
        if self.is_inter_communicator() {
            let (sends, recvs) = to_everyone(&send, &mut recv, &parts)?;
            return self
                .inter_all_to_all(sequence, sends, recvs, AllToAllAlgorithm::Scattered)
                .await;
        }
        disjoint_blocks(recv.len(), &parts, BlockOwner::Rank)?;
        let team = self.team(sequence, CollectiveTag::AllGather)?;
        team.complete(algorithms::all_gather_varcount(
            &team,
            Some(&send),
            &parts,
            &mut recv,
        ))
        .await
    }

    /// [`Communicator::all_gather_varcount_into`] in place: each
    /// process's block of `buf` is its input (`MPI_Allgatherv` with
    /// `MPI_IN_PLACE`).
    pub fn all_gather_varcount_in_place<R, C, D>(
        &self,
        buf: &mut PartitionMut<'_, R, C, D>,
    ) -> Result<()>
    where
        R: BufferMut + ?Sized,
        C: std::borrow::Borrow<[i32]>,
        D: std::borrow::Borrow<[i32]>,
    {
        self.blocking(self.all_gather_varcount_in_place_future(self.next_collective(), buf))
    }

    /// The non-blocking form of
    /// [`Communicator::all_gather_varcount_in_place`] (`MPI_Iallgatherv`,
    /// §6.12): starts it and returns its request; the buffers stay borrowed
    /// until it completes.
    pub fn immediate_all_gather_varcount_in_place<'a, R, C, D>(
        &self,
        scope: &Scope<'a>,
        mut buf: PartitionMut<'a, R, C, D>,
    ) -> Result<Request<'a>>
    where
        R: BufferMut + ?Sized,
        C: std::borrow::Borrow<[i32]> + 'a,
        D: std::borrow::Borrow<[i32]> + 'a,
    {
        let comm = self.clone();
        let sequence = comm.next_collective();
        self.immediate(scope, async move {
            comm.all_gather_varcount_in_place_future(sequence, &mut buf)
                .await
        })
    }

    async fn all_gather_varcount_in_place_future<R, C, D>(
        &self,
        sequence: Sequence,
        buf: &mut PartitionMut<'_, R, C, D>,
    ) -> Result<()>
    where
        R: BufferMut + ?Sized,
        C: std::borrow::Borrow<[i32]>,
        D: std::borrow::Borrow<[i32]>,
    {
        let n = self.size() as usize;
        let (parts, mut buf) = buf.pieces(BlockOwner::Rank, n)?;
        disjoint_blocks(buf.len(), &parts, BlockOwner::Rank)?;
        let team = self.team(sequence, CollectiveTag::AllGather)?;
        team.complete(algorithms::all_gather_varcount(
            &team, None, &parts, &mut buf,
        ))
        .await
    }

    /// Sends block `i` of `send` to rank `i` and receives block `j` of
    /// `recv` from rank `j` (`MPI_Alltoall`, §6.8). Both hold `size`
    /// equal blocks.
    pub fn all_to_all_into<S, R>(&self, send: &S, recv: &mut R) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
    {
        self.blocking(self.all_to_all_into_future(
            self.next_collective(),
            send,
            recv,
            Mode::Blocking,
        ))
    }

    /// The non-blocking form of [`Communicator::all_to_all_into`]
    /// (`MPI_Ialltoall`, §6.12): starts it and returns its request; the
    /// buffers stay borrowed until it completes.
    pub fn immediate_all_to_all_into<'a, S, R>(
        &self,
        scope: &Scope<'a>,
        send: &'a S,
        recv: &'a mut R,
    ) -> Result<Request<'a>>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
    {
        let comm = self.clone();
        let sequence = comm.next_collective();
        self.immediate(scope, async move {
            comm.all_to_all_into_future(sequence, send, recv, Mode::Immediate)
                .await
        })
    }

    async fn all_to_all_into_future<S, R>(
        &self,
        sequence: Sequence,
        send: &S,
        recv: &mut R,
        mode: Mode,
    ) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
    {
        let node = self.node_for(&sequence, mode)?;
        let (send_view, recv_view) = (send.view(), recv.view_mut());
        let (send_layout, recv_layout) = (send_view.layout()?, recv_view.layout()?);
        let element_type = same_element_type(
            ElementType::of_datatype(send_view.datatype()),
            ElementType::of_datatype(recv_view.datatype()),
        )?;
        let n = self.addressed_size();
        let block = block_of(send_layout.len, n.max(1), element_type, "the send buffer")?;
        expect_len(
            recv_layout.len,
            send_layout.len,
            element_type,
            "the receive buffer",
        )?;
        // Every process chooses the way by the length of the blocks
        // alone: the processes' datatypes may differ.
        if let Some(node) = node {
            if node.fits_blocks(n, block) {
                // Through the shared region, which needs the packed data
                // at one address.
                let (send, mut output) = (Input::new(send)?, Output::overwritten(recv)?);
                node.all_to_all(sequence.0, send.bytes(), output.bytes_mut(), block)?;
                return output.finish();
            }
            if let Some(ring) = node.all_to_all_ring(block) {
                // By single copies or streamed through the staging areas,
                // a piece at a time where the data is not contiguous.
                let (mut send, mut recv) =
                    (Pieces::of_view(&send_view)?, Pieces::into_view(recv_view)?);
                return node.all_to_all_long(sequence.0, &mut send, &mut recv, block, ring);
            }
        }
        // By messages, which the point-to-point layer packs and unpacks
        // piece by piece where the data is not contiguous.
        let (send, mut recv) = (Pieces::of_view(&send_view)?, Pieces::into_view(recv_view)?);
        let parts = uniform_blocks(n, block);
        let recvs = recv.inbound_blocks(disjoint_blocks(recv.len(), &parts, BlockOwner::Rank)?)?;
        let sends = send.outbound_blocks(&parts)?;
        self.all_to_all_bytes(sequence, sends, recvs, all_to_all_algorithm(block))
            .await
    }

    /// [`Communicator::all_to_all_into`] in place: `buf` is sent and then
    /// replaced (`MPI_Alltoall` with `MPI_IN_PLACE`).
    pub fn all_to_all_in_place<R: BufferMut + ?Sized>(&self, buf: &mut R) -> Result<()> {
        self.blocking(self.all_to_all_in_place_future(self.next_collective(), buf, Mode::Blocking))
    }

    /// The non-blocking form of [`Communicator::all_to_all_in_place`]
    /// (`MPI_Ialltoall`, §6.12): starts it and returns its request; the
    /// buffers stay borrowed until it completes.
    pub fn immediate_all_to_all_in_place<'a, R: BufferMut + ?Sized>(
        &self,
        scope: &Scope<'a>,
        buf: &'a mut R,
    ) -> Result<Request<'a>> {
        let comm = self.clone();
        let sequence = comm.next_collective();
        self.immediate(scope, async move {
            comm.all_to_all_in_place_future(sequence, buf, Mode::Immediate)
                .await
        })
    }

    async fn all_to_all_in_place_future<R: BufferMut + ?Sized>(
        &self,
        sequence: Sequence,
        buf: &mut R,
        mode: Mode,
    ) -> Result<()> {
        let node = self.node_for(&sequence, mode)?;
        self.require_intra("an in-place all-to-all")?;
        let n = self.size() as usize;
        let (len, element_type) = {
            let view = buf.view_mut();
            (
                view.layout()?.len,
                ElementType::of_datatype(view.datatype()),
            )
        };
        let block = block_of(len, n, element_type, "the buffer")?;
        // Every process chooses the way by the length alone, the same at
        // all of them.
        if len < IN_PLACE_PIECE {
            // Short: a copy of what is sent, then all blocks at once (or
            // through the shared region).
            let mut output = Output::new(buf)?;
            let buf = output.bytes_mut();
            let send = buf.to_vec();
            self.all_to_all_blocks(sequence, &send, buf, block, node)
                .await?;
            return output.finish();
        }
        let (buf, _) = Pieces::into_buffer(buf)?;
        let blocks = uniform_blocks(n, block);
        self.all_to_all_in_place_pieces(sequence, vec![buf], blocks.into_iter().map(|b| (0, b)))
            .await
    }

    /// The in-place all-to-all of `blocks` (by rank: which of `bufs`,
    /// and the packed bytes of it) by pairwise exchanges in pieces (see
    /// [`algorithms::all_to_all_in_place`]): no copy of the whole.
    async fn all_to_all_in_place_pieces(
        &self,
        sequence: Sequence,
        mut bufs: Vec<Pieces<'_>>,
        blocks: impl Iterator<Item = (usize, std::ops::Range<usize>)>,
    ) -> Result<()> {
        let blocks: Vec<_> = blocks.collect();
        let team = self.team(sequence, CollectiveTag::AllToAll)?;
        team.complete(algorithms::all_to_all_in_place(&team, &mut bufs, &blocks))
            .await
    }

    /// The all-to-all of `send` into `recv`, blocks of `block` bytes, one
    /// per process addressed: through the shared region `node` (see
    /// [`Communicator::node_for`]) if the data fits, else by messages.
    async fn all_to_all_blocks(
        &self,
        sequence: Sequence,
        send: &[u8],
        recv: &mut [u8],
        block: usize,
        node: Option<&NodeRegion>,
    ) -> Result<()> {
        if let Some(node) = node {
            if node.fits_blocks(self.size() as usize, block) {
                return node.all_to_all(sequence.0, send, recv, block);
            }
            if let Some(ring) = node.all_to_all_ring(block) {
                return node.all_to_all_long(
                    sequence.0,
                    &mut Pieces::Shared(send),
                    &mut Pieces::Bytes(recv),
                    block,
                    ring,
                );
            }
        }
        let parts = uniform_blocks(self.addressed_size(), block);
        let sends = parts.iter().map(|p| send[p.clone()].into()).collect();
        let recvs = disjoint_blocks(recv.len(), &parts, BlockOwner::Rank)?.split(recv)?;
        self.all_to_all_bytes(sequence, sends, recvs, all_to_all_algorithm(block))
            .await
    }

    /// The all-to-all of `sends` and `recvs`, one per process addressed
    /// (the remote group's on an intercommunicator).
    async fn all_to_all_bytes(
        &self,
        sequence: Sequence,
        sends: Vec<Outbound<'_>>,
        recvs: Vec<Inbound<'_>>,
        algorithm: AllToAllAlgorithm,
    ) -> Result<()> {
        if self.is_inter_communicator() {
            return self
                .inter_all_to_all(sequence, sends, recvs, algorithm)
                .await;
        }
        let team = self.team(sequence, CollectiveTag::AllToAll)?;
        team.complete(algorithms::all_to_all(&team, sends, recvs, algorithm))
            .await
    }

    /// Sends block `i` of `send` to rank `i` and receives block `j` of
    /// `recv` from rank `j`, blocks of any lengths (`MPI_Alltoallv`,
    /// §6.8). The receive blocks must not overlap.
    pub fn all_to_all_varcount_into<S, SC, SD, R, RC, RD>(
        &self,
        send: &Partition<'_, S, SC, SD>,
        recv: &mut PartitionMut<'_, R, RC, RD>,
    ) -> Result<()>
    where
        S: Buffer + ?Sized,
        SC: std::borrow::Borrow<[i32]>,
        SD: std::borrow::Borrow<[i32]>,
        R: BufferMut + ?Sized,
        RC: std::borrow::Borrow<[i32]>,
        RD: std::borrow::Borrow<[i32]>,
    {
        self.blocking(self.all_to_all_varcount_into_future(self.next_collective(), send, recv))
    }

    /// The non-blocking form of [`Communicator::all_to_all_varcount_into`]
    /// (`MPI_Ialltoallv`, §6.12): starts it and returns its request; the
    /// buffers stay borrowed until it completes.
    pub fn immediate_all_to_all_varcount_into<'a, S, SC, SD, R, RC, RD>(
        &self,
        scope: &Scope<'a>,
        send: Partition<'a, S, SC, SD>,
        mut recv: PartitionMut<'a, R, RC, RD>,
    ) -> Result<Request<'a>>
    where
        S: Buffer + ?Sized,
        SC: std::borrow::Borrow<[i32]> + 'a,
        SD: std::borrow::Borrow<[i32]> + 'a,
        R: BufferMut + ?Sized,
        RC: std::borrow::Borrow<[i32]> + 'a,
        RD: std::borrow::Borrow<[i32]> + 'a,
    {
        let comm = self.clone();
        let sequence = comm.next_collective();
        self.immediate(scope, async move {
            comm.all_to_all_varcount_into_future(sequence, &send, &mut recv)
                .await
        })
    }

    async fn all_to_all_varcount_into_future<S, SC, SD, R, RC, RD>(
        &self,
        sequence: Sequence,
        send: &Partition<'_, S, SC, SD>,
        recv: &mut PartitionMut<'_, R, RC, RD>,
    ) -> Result<()>
    where
        S: Buffer + ?Sized,
        SC: std::borrow::Borrow<[i32]>,
        SD: std::borrow::Borrow<[i32]>,
        R: BufferMut + ?Sized,
        RC: std::borrow::Borrow<[i32]>,
        RD: std::borrow::Borrow<[i32]>,
    {
        same_element_type(send.element_type(), recv.element_type())?;
        let n = self.addressed_size();
        let (send_parts, send) = send.pieces(BlockOwner::Rank, n)?;
        let (recv_parts, mut recv) = recv.pieces(BlockOwner::Rank, n)?;
        let recvs =
            recv.inbound_blocks(disjoint_blocks(recv.len(), &recv_parts, BlockOwner::Rank)?)?;
        let sends = send.outbound_blocks(&send_parts)?;
        self.all_to_all_bytes(sequence, sends, recvs, AllToAllAlgorithm::Scattered)
            .await
    }

    /// [`Communicator::all_to_all_varcount_into`] in place: the blocks of
    /// `buf` are sent and then replaced (`MPI_Alltoallv` with
    /// `MPI_IN_PLACE`), so a block's count is what goes to and comes from
    /// one process.
    pub fn all_to_all_varcount_in_place<R, C, D>(
        &self,
        buf: &mut PartitionMut<'_, R, C, D>,
    ) -> Result<()>
    where
        R: BufferMut + ?Sized,
        C: std::borrow::Borrow<[i32]>,
        D: std::borrow::Borrow<[i32]>,
    {
        self.blocking(self.all_to_all_varcount_in_place_future(self.next_collective(), buf))
    }

    /// The non-blocking form of
    /// [`Communicator::all_to_all_varcount_in_place`] (`MPI_Ialltoallv`,
    /// §6.12): starts it and returns its request; the buffers stay borrowed
    /// until it completes.
    pub fn immediate_all_to_all_varcount_in_place<'a, R, C, D>(
        &self,
        scope: &Scope<'a>,
        mut buf: PartitionMut<'a, R, C, D>,
    ) -> Result<Request<'a>>
    where
        R: BufferMut + ?Sized,
        C: std::borrow::Borrow<[i32]> + 'a,
        D: std::borrow::Borrow<[i32]> + 'a,
    {
        let comm = self.clone();
        let sequence = comm.next_collective();
        self.immediate(scope, async move {
            comm.all_to_all_varcount_in_place_future(sequence, &mut buf)
                .await
        })
    }

    async fn all_to_all_varcount_in_place_future<R, C, D>(
        &self,
        sequence: Sequence,
        buf: &mut PartitionMut<'_, R, C, D>,
    ) -> Result<()>
    where
        R: BufferMut + ?Sized,
        C: std::borrow::Borrow<[i32]>,
        D: std::borrow::Borrow<[i32]>,
    {
        // The blocks' lengths differ between processes, so every length
        // goes the one way, in pieces.
        let n = self.size() as usize;
        let (parts, buf) = buf.pieces(BlockOwner::Rank, n)?;
        disjoint_blocks(buf.len(), &parts, BlockOwner::Rank)?;
        self.all_to_all_in_place_pieces(sequence, vec![buf], parts.into_iter().map(|p| (0, p)))
            .await
    }

    /// Sends `send[i]` to rank `i` and receives `recv[j]` from rank `j`:
    /// one buffer per process, each of its own type and length
    /// (`MPI_Alltoallw`, §6.8, whose per-process datatypes and byte
    /// displacements these buffers stand for). Both lists have `size`
    /// entries (else `MPI_ERR_COUNT`).
    pub fn all_to_all_w_into(
        &self,
        send: &[&dyn Buffer],
        recv: &mut [&mut dyn BufferMut],
    ) -> Result<()> {
        self.blocking(self.all_to_all_w_into_future(self.next_collective(), send, recv))
    }

    /// The non-blocking form of [`Communicator::all_to_all_w_into`]
    /// (`MPI_Ialltoallw`, §6.12): starts it and returns its request; the
    /// buffers stay borrowed until it completes.
    pub fn immediate_all_to_all_w_into<'a>(
        &self,
        scope: &Scope<'a>,
        send: &'a [&'a dyn Buffer],
        recv: &'a mut [&'a mut dyn BufferMut],
    ) -> Result<Request<'a>> {
        let comm = self.clone();
        let sequence = comm.next_collective();
        self.immediate(scope, async move {
            comm.all_to_all_w_into_future(sequence, send, recv).await
        })
    }

    async fn all_to_all_w_into_future(
        &self,
        sequence: Sequence,
        send: &[&dyn Buffer],
        recv: &mut [&mut dyn BufferMut],
    ) -> Result<()> {
        let n = self.addressed_size();
        if send.len() != n || recv.len() != n {
            return Err(count_error(format!(
                "{} send and {} receive buffers for {n} processes",
                send.len(),
                recv.len()
            )));
        }
        let (inputs, mut outputs) = pieces_of_each(send, recv)?;
        let (sends, recvs) = whole_messages(&inputs, &mut outputs)?;
        self.all_to_all_bytes(sequence, sends, recvs, AllToAllAlgorithm::Scattered)
            .await
    }

    /// [`Communicator::all_to_all_w_into`] in place: `bufs[i]` is sent to
    /// rank `i` and then replaced by what it sends (`MPI_Alltoallw` with
    /// `MPI_IN_PLACE`).
    pub fn all_to_all_w_in_place(&self, bufs: &mut [&mut dyn BufferMut]) -> Result<()> {
        self.blocking(self.all_to_all_w_in_place_future(self.next_collective(), bufs))
    }

    /// The non-blocking form of [`Communicator::all_to_all_w_in_place`]
    /// (`MPI_Ialltoallw`, §6.12): starts it and returns its request; the
    /// buffers stay borrowed until it completes.
    pub fn immediate_all_to_all_w_in_place<'a>(
        &self,
        scope: &Scope<'a>,
        bufs: &'a mut [&'a mut dyn BufferMut],
    ) -> Result<Request<'a>> {
        let comm = self.clone();
        let sequence = comm.next_collective();
        self.immediate(scope, async move {
            comm.all_to_all_w_in_place_future(sequence, bufs).await
        })
    }

    async fn all_to_all_w_in_place_future(
        &self,
        sequence: Sequence,
        bufs: &mut [&mut dyn BufferMut],
    ) -> Result<()> {
        let n = self.size() as usize;
        if bufs.len() != n {
            return Err(count_error(format!(
                "{} buffers for {n} processes",
                bufs.len()
            )));
        }
        let bufs = bufs
            .iter_mut()
            .map(|b| Pieces::into_view(b.view_mut()))
            .collect::<Result<Vec<_>>>()?;
        let blocks: Vec<_> = bufs.iter().map(Pieces::len).enumerate().collect();
        self.all_to_all_in_place_pieces(
            sequence,
            bufs,
            blocks.into_iter().map(|(i, len)| (i, 0..len)),
        )
        .await
    }

    /// Reduces every process's `send` with `op` into `recv` at every
    /// process (`MPI_Allreduce`, §6.9.6).
    pub fn all_reduce_into<S, R, O>(&self, send: &S, recv: &mut R, op: O) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
        O: Operation,
    {
        self.blocking(self.all_reduce_into_future(
            self.next_collective(),
            send,
            recv,
            op,
            Mode::Blocking,
        ))
    }

    /// The non-blocking form of [`Communicator::all_reduce_into`]
    /// (`MPI_Iallreduce`, §6.12): starts it and returns its request; the
    /// buffers stay borrowed until it completes.
    pub fn immediate_all_reduce_into<'a, S, R, O>(
        &self,
        scope: &Scope<'a>,
        send: &'a S,
        recv: &'a mut R,
        op: O,
    ) -> Result<Request<'a>>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
        O: Operation + 'a,
    {
        let comm = self.clone();
        let sequence = comm.next_collective();
        self.immediate(scope, async move {
            comm.all_reduce_into_future(sequence, send, recv, op, Mode::Immediate)
                .await
        })
    }

    async fn all_reduce_into_future<S, R, O>(
        &self,
        sequence: Sequence,
        send: &S,
        recv: &mut R,
        op: O,
        mode: Mode,
    ) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
        O: Operation,
    {
        let node = self.node_of_all_for(&sequence, mode)?;
        let (send, mut recv, red) = reduction_buffers(send, recv, &op)?;
        if let (Some(input), Some(output)) = (send.bytes(), recv.bytes_mut()) {
            if output.len() <= REDUCTION_SEGMENT {
                output.copy_from_slice(input);
                return self.all_reduce_whole(sequence, output, &red, node).await;
            }
        }
        let mut acc = Segments::new(Some(send), Some(recv))?;
        // Boxed, so that its state does not grow the future of every
        // short all-reduce, which is moved as it is made and started.
        Box::pin(self.all_reduce_segments(sequence, &mut acc, &red, node)).await
    }

    /// [`Communicator::all_reduce_into`] in place: `buf` is the input and
    /// receives the result (`MPI_Allreduce` with `MPI_IN_PLACE`).
    pub fn all_reduce_in_place<R, O>(&self, buf: &mut R, op: O) -> Result<()>
    where
        R: BufferMut + ?Sized,
        O: Operation,
    {
        self.blocking(self.all_reduce_in_place_future(
            self.next_collective(),
            buf,
            op,
            Mode::Blocking,
        ))
    }

    /// The non-blocking form of [`Communicator::all_reduce_in_place`]
    /// (`MPI_Iallreduce`, §6.12): starts it and returns its request; the
    /// buffers stay borrowed until it completes.
    pub fn immediate_all_reduce_in_place<'a, R, O>(
        &self,
        scope: &Scope<'a>,
        buf: &'a mut R,
        op: O,
    ) -> Result<Request<'a>>
    where
        R: BufferMut + ?Sized,
        O: Operation + 'a,
    {
        let comm = self.clone();
        let sequence = comm.next_collective();
        self.immediate(scope, async move {
            comm.all_reduce_in_place_future(sequence, buf, op, Mode::Immediate)
                .await
        })
    }

    async fn all_reduce_in_place_future<R, O>(
        &self,
        sequence: Sequence,
        buf: &mut R,
        op: O,
        mode: Mode,
    ) -> Result<()>
    where
        R: BufferMut + ?Sized,
        O: Operation,
    {
        let node = self.node_for(&sequence, mode)?;
        self.require_intra("an in-place all-reduce")?;
        let (mut buf, element_type) = Pieces::into_buffer(buf)?;
        let red = Reduction::new(&op, element_type)?;
        if let Some(data) = buf
            .bytes_mut()
            .filter(|data| data.len() <= REDUCTION_SEGMENT)
        {
            return self.all_reduce_whole(sequence, data, &red, node).await;
        }
        let mut acc = Segments::new(None, Some(buf))?;
        // Boxed, as in `all_reduce_into_future`.
        Box::pin(self.all_reduce_segments(sequence, &mut acc, &red, node)).await
    }

    /// Reduces every process's `send` (`size` equal blocks) with `op` and
    /// leaves block `i` of the result in rank `i`'s `recv`
    /// (`MPI_Reduce_scatter_block`, §6.10.1).
    pub fn reduce_scatter_block_into<S, R, O>(&self, send: &S, recv: &mut R, op: O) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
        O: Operation,
    {
        self.blocking(self.reduce_scatter_block_into_future(self.next_collective(), send, recv, op))
    }

    /// The non-blocking form of [`Communicator::reduce_scatter_block_into`]
    /// (`MPI_Ireduce_scatter_block`, §6.12): starts it and returns its
    /// request; the buffers stay borrowed until it completes.
    pub fn immediate_reduce_scatter_block_into<'a, S, R, O>(
        &self,
        scope: &Scope<'a>,
        send: &'a S,
        recv: &'a mut R,
        op: O,
    ) -> Result<Request<'a>>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
        O: Operation + 'a,
    {
        let comm = self.clone();
        let sequence = comm.next_collective();
        self.immediate(scope, async move {
            comm.reduce_scatter_block_into_future(sequence, send, recv, op)
                .await
        })
    }

    async fn reduce_scatter_block_into_future<S, R, O>(
        &self,
        sequence: Sequence,
        send: &S,
        recv: &mut R,
        op: O,
    ) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
        O: Operation,
    {
        let (mut send, mut recv, red) = reduce_scatter_buffers(send, recv, &op)?;
        let element_type = red.element_type();
        let n = self.size() as usize;
        expect_len(send.len(), n * recv.len(), element_type, "the send buffer")?;
        let parts = uniform_blocks(n, recv.len());
        self.reduce_scatter_pieces(sequence, Some(&mut send), &parts, &mut recv, &red)
            .await
    }

    /// [`Communicator::reduce_scatter_block_into`] in place: `buf` (`size`
    /// blocks) is the input, and its first block receives this rank's
    /// block of the result (`MPI_Reduce_scatter_block` with
    /// `MPI_IN_PLACE`).
    pub fn reduce_scatter_block_in_place<R, O>(&self, buf: &mut R, op: O) -> Result<()>
    where
        R: BufferMut + ?Sized,
        O: Operation,
    {
        self.blocking(self.reduce_scatter_block_in_place_future(self.next_collective(), buf, op))
    }

    /// The non-blocking form of
    /// [`Communicator::reduce_scatter_block_in_place`]
    /// (`MPI_Ireduce_scatter_block`, §6.12): starts it and returns its
    /// request; the buffers stay borrowed until it completes.
    pub fn immediate_reduce_scatter_block_in_place<'a, R, O>(
        &self,
        scope: &Scope<'a>,
        buf: &'a mut R,
        op: O,
    ) -> Result<Request<'a>>
    where
        R: BufferMut + ?Sized,
        O: Operation + 'a,
    {
        let comm = self.clone();
        let sequence = comm.next_collective();
        self.immediate(scope, async move {
            comm.reduce_scatter_block_in_place_future(sequence, buf, op)
                .await
        })
    }

    async fn reduce_scatter_block_in_place_future<R, O>(
        &self,
        sequence: Sequence,
        buf: &mut R,
        op: O,
    ) -> Result<()>
    where
        R: BufferMut + ?Sized,
        O: Operation,
    {
        let n = self.size() as usize;
        let (mut buf, element_type) = Pieces::into_buffer(buf)?;
        let red = Reduction::new(&op, element_type)?;
        let block = block_of(buf.len(), n, element_type, "the buffer")?;
        let parts = uniform_blocks(n, block);
        self.reduce_scatter_pieces(sequence, None, &parts, &mut buf, &red)
            .await
    }

    /// Reduces every process's `send` with `op` and leaves the elements
    /// of rank `i`'s block in its `recv`: the blocks follow each other,
    /// `counts[i]` elements long (`MPI_Reduce_scatter`, §6.10.2). `send`
    /// holds the sum of `counts`, `recv` this rank's count.
    pub fn reduce_scatter_into<S, R, O>(
        &self,
        send: &S,
        recv: &mut R,
        counts: &[i32],
        op: O,
    ) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
        O: Operation,
    {
        self.blocking(self.reduce_scatter_into_future(
            self.next_collective(),
            send,
            recv,
            counts,
            op,
        ))
    }

    /// The non-blocking form of [`Communicator::reduce_scatter_into`]
    /// (`MPI_Ireduce_scatter`, §6.12): starts it and returns its request; the
    /// buffers stay borrowed until it completes.
    pub fn immediate_reduce_scatter_into<'a, S, R, O>(
        &self,
        scope: &Scope<'a>,
        send: &'a S,
        recv: &'a mut R,
        counts: &'a [i32],
        op: O,
    ) -> Result<Request<'a>>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
        O: Operation + 'a,
    {
        let comm = self.clone();
        let sequence = comm.next_collective();
        self.immediate(scope, async move {
            comm.reduce_scatter_into_future(sequence, send, recv, counts, op)
                .await
        })
    }

    async fn reduce_scatter_into_future<S, R, O>(
        &self,
        sequence: Sequence,
        send: &S,
        recv: &mut R,
        counts: &[i32],
        op: O,
    ) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
        O: Operation,
    {
        let (mut send, mut recv, red) = reduce_scatter_buffers(send, recv, &op)?;
        let element_type = red.element_type();
        let parts = consecutive_blocks(counts, self.size() as usize, element_type)?;
        let total = parts.last().map_or(0, |p| p.end);
        expect_len(send.len(), total, element_type, "the send buffer")?;
        let mine = parts[self.rank() as usize].len();
        expect_len(recv.len(), mine, element_type, "the receive buffer")?;
        self.reduce_scatter_pieces(sequence, Some(&mut send), &parts, &mut recv, &red)
            .await
    }

    /// [`Communicator::reduce_scatter_into`] in place: `buf` is the input,
    /// and its first `counts[rank]` elements receive this rank's block of
    /// the result (`MPI_Reduce_scatter` with `MPI_IN_PLACE`).
    pub fn reduce_scatter_in_place<R, O>(&self, buf: &mut R, counts: &[i32], op: O) -> Result<()>
    where
        R: BufferMut + ?Sized,
        O: Operation,
    {
        self.blocking(self.reduce_scatter_in_place_future(self.next_collective(), buf, counts, op))
    }

    /// The non-blocking form of [`Communicator::reduce_scatter_in_place`]
    /// (`MPI_Ireduce_scatter`, §6.12): starts it and returns its request; the
    /// buffers stay borrowed until it completes.
    pub fn immediate_reduce_scatter_in_place<'a, R, O>(
        &self,
        scope: &Scope<'a>,
        buf: &'a mut R,
        counts: &'a [i32],
        op: O,
    ) -> Result<Request<'a>>
    where
        R: BufferMut + ?Sized,
        O: Operation + 'a,
    {
        let comm = self.clone();
        let sequence = comm.next_collective();
        self.immediate(scope, async move {
            comm.reduce_scatter_in_place_future(sequence, buf, counts, op)
                .await
        })
    }

    async fn reduce_scatter_in_place_future<R, O>(
        &self,
        sequence: Sequence,
        buf: &mut R,
        counts: &[i32],
        op: O,
    ) -> Result<()>
    where
        R: BufferMut + ?Sized,
        O: Operation,
    {
        let (mut buf, element_type) = Pieces::into_buffer(buf)?;
        let red = Reduction::new(&op, element_type)?;
        let parts = consecutive_blocks(counts, self.size() as usize, element_type)?;
        let total = parts.last().map_or(0, |p| p.end);
        expect_len(buf.len(), total, element_type, "the buffer")?;
        self.reduce_scatter_pieces(sequence, None, &parts, &mut buf, &red)
            .await
    }

    /// Leaves in `recv` the reduction with `op` of the `send` of ranks
    /// `0..=rank` (`MPI_Scan`, §6.11.1).
    pub fn scan_into<S, R, O>(&self, send: &S, recv: &mut R, op: O) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
        O: Operation,
    {
        self.blocking(self.scan_into_future(self.next_collective(), send, recv, op))
    }

    /// The non-blocking form of [`Communicator::scan_into`] (`MPI_Iscan`,
    /// §6.12): starts it and returns its request; the buffers stay borrowed
    /// until it completes.
    pub fn immediate_scan_into<'a, S, R, O>(
        &self,
        scope: &Scope<'a>,
        send: &'a S,
        recv: &'a mut R,
        op: O,
    ) -> Result<Request<'a>>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
        O: Operation + 'a,
    {
        let comm = self.clone();
        let sequence = comm.next_collective();
        self.immediate(scope, async move {
            comm.scan_into_future(sequence, send, recv, op).await
        })
    }

    async fn scan_into_future<S, R, O>(
        &self,
        sequence: Sequence,
        send: &S,
        recv: &mut R,
        op: O,
    ) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
        O: Operation,
    {
        let (mut acc, red) = reduction_into(send, recv, &op)?;
        self.scan_segments(sequence, &mut acc, &red, CollectiveTag::Scan)
            .await
    }

    /// [`Communicator::scan_into`] in place: `buf` is the input and
    /// receives the result (`MPI_Scan` with `MPI_IN_PLACE`).
    pub fn scan_in_place<R, O>(&self, buf: &mut R, op: O) -> Result<()>
    where
        R: BufferMut + ?Sized,
        O: Operation,
    {
        self.blocking(self.scan_in_place_future(self.next_collective(), buf, op))
    }

    /// The non-blocking form of [`Communicator::scan_in_place`] (`MPI_Iscan`,
    /// §6.12): starts it and returns its request; the buffers stay borrowed
    /// until it completes.
    pub fn immediate_scan_in_place<'a, R, O>(
        &self,
        scope: &Scope<'a>,
        buf: &'a mut R,
        op: O,
    ) -> Result<Request<'a>>
    where
        R: BufferMut + ?Sized,
        O: Operation + 'a,
    {
        let comm = self.clone();
        let sequence = comm.next_collective();
        self.immediate(scope, async move {
            comm.scan_in_place_future(sequence, buf, op).await
        })
    }

    async fn scan_in_place_future<R, O>(&self, sequence: Sequence, buf: &mut R, op: O) -> Result<()>
    where
        R: BufferMut + ?Sized,
        O: Operation,
    {
        let (mut acc, red) = reduction_in_place(buf, &op)?;
        self.scan_segments(sequence, &mut acc, &red, CollectiveTag::Scan)
            .await
    }

    /// Leaves in `recv` the reduction with `op` of the `send` of ranks
    /// `0..rank` (`MPI_Exscan`, §6.11.2); rank 0's `recv` is left as it
    /// is.
    pub fn exclusive_scan_into<S, R, O>(&self, send: &S, recv: &mut R, op: O) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
        O: Operation,
    {
        self.blocking(self.exclusive_scan_into_future(self.next_collective(), send, recv, op))
    }

    /// The non-blocking form of [`Communicator::exclusive_scan_into`]
    /// (`MPI_Iexscan`, §6.12): starts it and returns its request; the buffers
    /// stay borrowed until it completes.
    pub fn immediate_exclusive_scan_into<'a, S, R, O>(
        &self,
        scope: &Scope<'a>,
        send: &'a S,
        recv: &'a mut R,
        op: O,
    ) -> Result<Request<'a>>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
        O: Operation + 'a,
    {
        let comm = self.clone();
        let sequence = comm.next_collective();
        self.immediate(scope, async move {
            comm.exclusive_scan_into_future(sequence, send, recv, op)
                .await
        })
    }

    async fn exclusive_scan_into_future<S, R, O>(
        &self,
        sequence: Sequence,
        send: &S,
        recv: &mut R,
        op: O,
    ) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
        O: Operation,
    {
        let (send, recv, red) = reduction_buffers(send, recv, &op)?;
        // Rank 0's receive buffer is left as it is.
        let recv = (self.rank() != 0).then_some(recv);
        let mut acc = Segments::new(Some(send), recv)?;
        self.scan_segments(sequence, &mut acc, &red, CollectiveTag::ExclusiveScan)
            .await
    }

    /// [`Communicator::exclusive_scan_into`] in place: `buf` is the input
    /// and receives the result (`MPI_Exscan` with `MPI_IN_PLACE`); rank
    /// 0's is left as it is.
    pub fn exclusive_scan_in_place<R, O>(&self, buf: &mut R, op: O) -> Result<()>
    where
        R: BufferMut + ?Sized,
        O: Operation,
    {
        self.blocking(self.exclusive_scan_in_place_future(self.next_collective(), buf, op))
    }

    /// The non-blocking form of [`Communicator::exclusive_scan_in_place`]
    /// (`MPI_Iexscan`, §6.12): starts it and returns its request; the buffers
    /// stay borrowed until it completes.
    pub fn immediate_exclusive_scan_in_place<'a, R, O>(
        &self,
        scope: &Scope<'a>,
        buf: &'a mut R,
        op: O,
    ) -> Result<Request<'a>>
    where
        R: BufferMut + ?Sized,
        O: Operation + 'a,
    {
        let comm = self.clone();
        let sequence = comm.next_collective();
        self.immediate(scope, async move {
            comm.exclusive_scan_in_place_future(sequence, buf, op).await
        })
    }

    async fn exclusive_scan_in_place_future<R, O>(
        &self,
        sequence: Sequence,
        buf: &mut R,
        op: O,
    ) -> Result<()>
    where
        R: BufferMut + ?Sized,
        O: Operation,
    {
        let (mut acc, red) = reduction_in_place(buf, &op)?;
        self.scan_segments(sequence, &mut acc, &red, CollectiveTag::ExclusiveScan)
            .await
    }
}

/// The messages of an all-gather as an all-to-all (an
/// intercommunicator's): the whole of `send` to every process, and
/// `parts` of `recv` (disjoint, else `MPI_ERR_ARG`) from each.
fn to_everyone<'s>(
    send: &'s Pieces<'_>,
    recv: &'s mut Pieces<'_>,
    parts: &[std::ops::Range<usize>],
) -> Result<(Vec<Outbound<'s>>, Vec<Inbound<'s>>)> {
    let recvs = recv.inbound_blocks(disjoint_blocks(recv.len(), parts, BlockOwner::Rank)?)?;
    let sends = send.outbound_blocks(&vec![0..send.len(); parts.len()])?;
    Ok((sends, recvs))
}

/// The reduction of `send` into `recv` with `op`, a segment at a time
/// (see [`Segments`]), once their types and lengths agree.
fn reduction_into<'a, 'o, S, R, O>(
    send: &'a S,
    recv: &'a mut R,
    op: &'o O,
) -> Result<(Segments<'a>, Reduction<'o>)>
where
    S: Buffer + ?Sized,
    R: BufferMut + ?Sized,
    O: Operation,
{
    let (send, recv, red) = reduction_buffers(send, recv, op)?;
    Ok((Segments::new(Some(send), Some(recv))?, red))
}

/// The buffers of a reduction of `send` into `recv` with `op`, to take a
/// piece at a time, once their types and lengths agree.
fn reduction_buffers<'a, 'o, S, R, O>(
    send: &'a S,
    recv: &'a mut R,
    op: &'o O,
) -> Result<(Pieces<'a>, Pieces<'a>, Reduction<'o>)>
where
    S: Buffer + ?Sized,
    R: BufferMut + ?Sized,
    O: Operation,
{
    let (send, recv, red) = reduce_scatter_buffers(send, recv, op)?;
    expect_len(
        recv.len(),
        send.len(),
        red.element_type(),
        "the receive buffer",
    )?;
    Ok((send, recv, red))
}

/// The buffers of a reduction (or reduce-scatter) of `send` into `recv`
/// with `op`, to take a piece at a time, once their types agree (not
/// their lengths, which depend on the collective).
fn reduce_scatter_buffers<'a, 'o, S, R, O>(
    send: &'a S,
    recv: &'a mut R,
    op: &'o O,
) -> Result<(Pieces<'a>, Pieces<'a>, Reduction<'o>)>
where
    S: Buffer + ?Sized,
    R: BufferMut + ?Sized,
    O: Operation,
{
    let (send, send_type) = Pieces::of_buffer(send)?;
    let (recv, recv_type) = Pieces::into_buffer(recv)?;
    let red = Reduction::new(op, same_element_type(send_type, recv_type)?)?;
    Ok((send, recv, red))
}

/// The reduction with `op` of `buf`'s data into `buf`, a segment at a
/// time (see [`Segments`]).
fn reduction_in_place<'a, 'o, R, O>(
    buf: &'a mut R,
    op: &'o O,
) -> Result<(Segments<'a>, Reduction<'o>)>
where
    R: BufferMut + ?Sized,
    O: Operation,
{
    let (buf, element_type) = Pieces::into_buffer(buf)?;
    let red = Reduction::new(op, element_type)?;
    Ok((Segments::new(None, Some(buf))?, red))
}

impl Process<'_> {
    /// The root's rank as an index; an `MPI_ERR_ROOT` error if it is not
    /// in the communicator, or if this process is (`at_root`) or is not
    /// the root when the method called says otherwise.
    fn root(&self, at_root: bool) -> Result<usize> {
        let (rank, size) = (self.comm.rank(), self.comm.size());
        if !(0..size).contains(&self.rank) {
            return Err(Error::new(
                ErrorClass::Root,
                format!(
                    "root {} is not in this communicator of {size} processes",
                    self.rank
                ),
            ));
        }
        if at_root != (rank == self.rank) {
            let (called, should) = if at_root {
                ("a root's method", "the non-root method (without `_root`)")
            } else {
                ("a non-root method", "the `_root` method")
            };
            return Err(Error::new(
                ErrorClass::Root,
                format!(
                    "rank {rank} called {called} with root {}: call {should}",
                    self.rank
                ),
            ));
        }
        Ok(self.rank as usize)
    }

    /// Broadcasts the root's `buf` into every other process's `buf`
    /// (`MPI_Bcast`, §6.4). Called by every process, the root included.
    pub fn broadcast_into<B: BufferMut + ?Sized>(&self, buf: &mut B) -> Result<()> {
        self.comm.blocking(self.broadcast_into_future(
            self.comm.next_collective(),
            buf,
            Mode::Blocking,
        ))
    }

    /// The non-blocking form of [`Process::broadcast_into`] (`MPI_Ibcast`,
    /// §6.12): starts it and returns its request; the buffers stay borrowed
    /// until it completes.
    pub fn immediate_broadcast_into<'a, B: BufferMut + ?Sized>(
        &self,
        scope: &Scope<'a>,
        buf: &'a mut B,
    ) -> Result<Request<'a>> {
        let (comm, rank) = (self.comm.clone(), self.rank);
        let sequence = comm.next_collective();
        self.comm.immediate(scope, async move {
            comm.process_at_rank(rank)
                .broadcast_into_future(sequence, buf, Mode::Immediate)
                .await
        })
    }

    async fn broadcast_into_future<B: BufferMut + ?Sized>(
        &self,
        sequence: Sequence,
        buf: &mut B,
        mode: Mode,
    ) -> Result<()> {
        let node = self.comm.node_for(&sequence, mode)?;
        let at_root = self.comm.rank() == self.rank;
        let root = self.root(at_root)?;
        // Every process chooses the way by the length alone: the
        // processes' datatypes may differ.
        let len = buf.view_mut().layout()?.len;
        if let Some(node) = node {
            if node.fits(len) {
                // Through the shared region, which needs the packed data
                // at one address. The root's buffer is the data; the
                // others' is only written.
                let mut output = if at_root {
                    Output::new(buf)?
                } else {
                    Output::overwritten(buf)?
                };
                node.broadcast(sequence.0, root, output.bytes_mut())?;
                return output.finish();
            }
            if let Some(ring) = node.broadcast_ring(len) {
                // By single copies or streamed through the staging areas,
                // a piece at a time where the data is not contiguous.
                let view = buf.view_mut();
                let mut pieces = if at_root {
                    Pieces::of_view(&view.as_view())?
                } else {
                    Pieces::into_view(view)?
                };
                return node.broadcast_long(sequence.0, root, &mut pieces, ring);
            }
        }
        // By messages, which the point-to-point layer packs and unpacks
        // piece by piece where the data is not contiguous. The root
        // takes part in the all-gather of a long broadcast, receiving
        // its own data again, so its buffer is written too.
        let mut pieces = Pieces::into_view(buf.view_mut())?;
        let team = self.comm.team(sequence, CollectiveTag::Broadcast)?;
        team.complete(algorithms::broadcast(&team, root, &mut pieces))
            .await
    }

    /// This process's part of a gather to this root (`MPI_Gather`, §6.5),
    /// at every process but the root: sends `send`.
    pub fn gather_into<S: Buffer + ?Sized>(&self, send: &S) -> Result<()> {
        self.comm
            .blocking(self.gather_into_future(self.comm.next_collective(), send))
    }

    /// The non-blocking form of [`Process::gather_into`] (`MPI_Igather`,
    /// §6.12): starts it and returns its request; the buffers stay borrowed
    /// until it completes.
    pub fn immediate_gather_into<'a, S: Buffer + ?Sized>(
        &self,
        scope: &Scope<'a>,
        send: &'a S,
    ) -> Result<Request<'a>> {
        let (comm, rank) = (self.comm.clone(), self.rank);
        let sequence = comm.next_collective();
        self.comm.immediate(scope, async move {
            comm.process_at_rank(rank)
                .gather_into_future(sequence, send)
                .await
        })
    }

    async fn gather_into_future<S: Buffer + ?Sized>(
        &self,
        sequence: Sequence,
        send: &S,
    ) -> Result<()> {
        let root = self.root(false)?;
        let team = self.comm.team(sequence, CollectiveTag::Gather)?;
        let (send, _) = Pieces::of_buffer(send)?;
        team.complete(algorithms::gather(&team, root, Some(&send), None))
            .await
    }

    /// The root's part of a gather (`MPI_Gather`, §6.5): `recv` receives
    /// every process's `send` in rank order (`size` times `send`).
    pub fn gather_into_root<S, R>(&self, send: &S, recv: &mut R) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
    {
        self.comm
            .blocking(self.gather_into_root_future(self.comm.next_collective(), send, recv))
    }

    /// The non-blocking form of [`Process::gather_into_root`] (`MPI_Igather`,
    /// §6.12): starts it and returns its request; the buffers stay borrowed
    /// until it completes.
    pub fn immediate_gather_into_root<'a, S, R>(
        &self,
        scope: &Scope<'a>,
        send: &'a S,
        recv: &'a mut R,
    ) -> Result<Request<'a>>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
    {
        let (comm, rank) = (self.comm.clone(), self.rank);
        let sequence = comm.next_collective();
        self.comm.immediate(scope, async move {
            comm.process_at_rank(rank)
                .gather_into_root_future(sequence, send, recv)
                .await
        })
    }

    async fn gather_into_root_future<S, R>(
        &self,
        sequence: Sequence,
        send: &S,
        recv: &mut R,
    ) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
    {
        let root = self.root(true)?;
        let (send, send_type) = Pieces::of_buffer(send)?;
        let (mut recv, recv_type) = Pieces::into_buffer(recv)?;
        let element_type = same_element_type(send_type, recv_type)?;
        let n = self.comm.size() as usize;
        expect_len(
            recv.len(),
            n * send.len(),
            element_type,
            "the receive buffer",
        )?;
        let team = self.comm.team(sequence, CollectiveTag::Gather)?;
        team.complete(algorithms::gather(
            &team,
            root,
            Some(&send),
            Some(&mut recv),
        ))
        .await
    }

    /// [`Process::gather_into_root`] in place: the root's own block of
    /// `recv` is its input (`MPI_Gather` with `MPI_IN_PLACE`).
    pub fn gather_into_root_in_place<R: BufferMut + ?Sized>(&self, recv: &mut R) -> Result<()> {
        self.comm
            .blocking(self.gather_into_root_in_place_future(self.comm.next_collective(), recv))
    }

    /// The non-blocking form of [`Process::gather_into_root_in_place`]
    /// (`MPI_Igather`, §6.12): starts it and returns its request; the buffers
    /// stay borrowed until it completes.
    pub fn immediate_gather_into_root_in_place<'a, R: BufferMut + ?Sized>(
        &self,
        scope: &Scope<'a>,
        recv: &'a mut R,
    ) -> Result<Request<'a>> {
        let (comm, rank) = (self.comm.clone(), self.rank);
        let sequence = comm.next_collective();
        self.comm.immediate(scope, async move {
            comm.process_at_rank(rank)
                .gather_into_root_in_place_future(sequence, recv)
                .await
        })
    }

    async fn gather_into_root_in_place_future<R: BufferMut + ?Sized>(
        &self,
        sequence: Sequence,
        recv: &mut R,
    ) -> Result<()> {
        let root = self.root(true)?;
        let n = self.comm.size() as usize;
        let (mut recv, element_type) = Pieces::into_buffer(recv)?;
        block_of(recv.len(), n, element_type, "the receive buffer")?;
        let team = self.comm.team(sequence, CollectiveTag::Gather)?;
        team.complete(algorithms::gather(&team, root, None, Some(&mut recv)))
            .await
    }

    /// This process's part of a gather of varying counts to this root
    /// (`MPI_Gatherv`, §6.5), at every process but the root: sends
    /// `send`.
    pub fn gather_varcount_into<S: Buffer + ?Sized>(&self, send: &S) -> Result<()> {
        self.comm
            .blocking(self.gather_varcount_into_future(self.comm.next_collective(), send))
    }

    /// The non-blocking form of [`Process::gather_varcount_into`]
    /// (`MPI_Igatherv`, §6.12): starts it and returns its request; the
    /// buffers stay borrowed until it completes.
    pub fn immediate_gather_varcount_into<'a, S: Buffer + ?Sized>(
        &self,
        scope: &Scope<'a>,
        send: &'a S,
    ) -> Result<Request<'a>> {
        let (comm, rank) = (self.comm.clone(), self.rank);
        let sequence = comm.next_collective();
        self.comm.immediate(scope, async move {
            comm.process_at_rank(rank)
                .gather_varcount_into_future(sequence, send)
                .await
        })
    }

    async fn gather_varcount_into_future<S: Buffer + ?Sized>(
        &self,
        sequence: Sequence,
        send: &S,
    ) -> Result<()> {
        let root = self.root(false)?;
        let team = self.comm.team(sequence, CollectiveTag::Gather)?;
        let (send, _) = Pieces::of_buffer(send)?;
        let send = send.outbound(0..send.len())?;
        team.complete(algorithms::gather_varcount(&team, root, Some(send), None))
            .await
    }

    /// The root's part of a gather of varying counts (`MPI_Gatherv`,
    /// §6.5): block `i` of `recv` (which must not overlap another)
    /// receives rank `i`'s `send`.
    pub fn gather_varcount_into_root<S, R, C, D>(
        &self,
        send: &S,
        recv: &mut PartitionMut<'_, R, C, D>,
    ) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
        C: std::borrow::Borrow<[i32]>,
        D: std::borrow::Borrow<[i32]>,
    {
        self.comm.blocking(self.gather_varcount_into_root_future(
            self.comm.next_collective(),
            send,
            recv,
        ))
    }

    /// The non-blocking form of [`Process::gather_varcount_into_root`]
    /// (`MPI_Igatherv`, §6.12): starts it and returns its request; the
    /// buffers stay borrowed until it completes.
    pub fn immediate_gather_varcount_into_root<'a, S, R, C, D>(
        &self,
        scope: &Scope<'a>,
        send: &'a S,
        mut recv: PartitionMut<'a, R, C, D>,
    ) -> Result<Request<'a>>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
        C: std::borrow::Borrow<[i32]> + 'a,
        D: std::borrow::Borrow<[i32]> + 'a,
    {
        let (comm, rank) = (self.comm.clone(), self.rank);
        let sequence = comm.next_collective();
        self.comm.immediate(scope, async move {
            comm.process_at_rank(rank)
                .gather_varcount_into_root_future(sequence, send, &mut recv)
                .await
        })
    }

    async fn gather_varcount_into_root_future<S, R, C, D>(
        &self,
        sequence: Sequence,
        send: &S,
        recv: &mut PartitionMut<'_, R, C, D>,
    ) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
        C: std::borrow::Borrow<[i32]>,
        D: std::borrow::Borrow<[i32]>,
    {
        let root = self.root(true)?;
        let (send, send_type) = Pieces::of_buffer(send)?;
        same_element_type(send_type, recv.element_type())?;
        let n = self.comm.size() as usize;
        let (parts, mut recv) = recv.pieces(BlockOwner::Rank, n)?;
        let recvs = recv.inbound_blocks(disjoint_blocks(recv.len(), &parts, BlockOwner::Rank)?)?;
        let send = send.outbound(0..send.len())?;
        let team = self.comm.team(sequence, CollectiveTag::Gather)?;
        team.complete(algorithms::gather_varcount(
            &team,
            root,
            Some(send),
            Some(recvs),
        ))
        .await
    }

    /// [`Process::gather_varcount_into_root`] in place: the root's own
    /// block of `recv` is its input (`MPI_Gatherv` with `MPI_IN_PLACE`).
    pub fn gather_varcount_into_root_in_place<R, C, D>(
        &self,
        recv: &mut PartitionMut<'_, R, C, D>,
    ) -> Result<()>
    where
        R: BufferMut + ?Sized,
        C: std::borrow::Borrow<[i32]>,
        D: std::borrow::Borrow<[i32]>,
    {
        self.comm.blocking(
            self.gather_varcount_into_root_in_place_future(self.comm.next_collective(), recv),
        )
    }

    /// The non-blocking form of
    /// [`Process::gather_varcount_into_root_in_place`] (`MPI_Igatherv`,
    /// §6.12): starts it and returns its request; the buffers stay borrowed
    /// until it completes.
    pub fn immediate_gather_varcount_into_root_in_place<'a, R, C, D>(
        &self,
        scope: &Scope<'a>,
        mut recv: PartitionMut<'a, R, C, D>,
    ) -> Result<Request<'a>>
    where
        R: BufferMut + ?Sized,
        C: std::borrow::Borrow<[i32]> + 'a,
        D: std::borrow::Borrow<[i32]> + 'a,
    {
        let (comm, rank) = (self.comm.clone(), self.rank);
        let sequence = comm.next_collective();
        self.comm.immediate(scope, async move {
            comm.process_at_rank(rank)
                .gather_varcount_into_root_in_place_future(sequence, &mut recv)
                .await
        })
    }

    async fn gather_varcount_into_root_in_place_future<R, C, D>(
        &self,
        sequence: Sequence,
        recv: &mut PartitionMut<'_, R, C, D>,
    ) -> Result<()>
    where
        R: BufferMut + ?Sized,
        C: std::borrow::Borrow<[i32]>,
        D: std::borrow::Borrow<[i32]>,
    {
        let root = self.root(true)?;
        let n = self.comm.size() as usize;
        let (parts, mut recv) = recv.pieces(BlockOwner::Rank, n)?;
        let recvs = recv.inbound_blocks(disjoint_blocks(recv.len(), &parts, BlockOwner::Rank)?)?;
        let team = self.comm.team(sequence, CollectiveTag::Gather)?;
        team.complete(algorithms::gather_varcount(&team, root, None, Some(recvs)))
            .await
    }

    /// This process's part of a scatter from this root (`MPI_Scatter`,
    /// §6.6), at every process but the root: `recv` receives its block.
    pub fn scatter_into<R: BufferMut + ?Sized>(&self, recv: &mut R) -> Result<()> {
        self.comm
            .blocking(self.scatter_into_future(self.comm.next_collective(), recv))
    }

    /// The non-blocking form of [`Process::scatter_into`] (`MPI_Iscatter`,
    /// §6.12): starts it and returns its request; the buffers stay borrowed
    /// until it completes.
    pub fn immediate_scatter_into<'a, R: BufferMut + ?Sized>(
        &self,
        scope: &Scope<'a>,
        recv: &'a mut R,
    ) -> Result<Request<'a>> {
        let (comm, rank) = (self.comm.clone(), self.rank);
        let sequence = comm.next_collective();
        self.comm.immediate(scope, async move {
            comm.process_at_rank(rank)
                .scatter_into_future(sequence, recv)
                .await
        })
    }

    async fn scatter_into_future<R: BufferMut + ?Sized>(
        &self,
        sequence: Sequence,
        recv: &mut R,
    ) -> Result<()> {
        let root = self.root(false)?;
        let team = self.comm.team(sequence, CollectiveTag::Scatter)?;
        let (mut recv, _) = Pieces::into_buffer(recv)?;
        team.complete(algorithms::scatter(&team, root, None, Some(&mut recv)))
            .await
    }

    /// The root's part of a scatter (`MPI_Scatter`, §6.6): block `i` of
    /// `send` (`size` equal blocks) goes to rank `i`, the root's into
    /// `recv`.
    pub fn scatter_into_root<S, R>(&self, send: &S, recv: &mut R) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
    {
        self.comm
            .blocking(self.scatter_into_root_future(self.comm.next_collective(), send, recv))
    }

    /// The non-blocking form of [`Process::scatter_into_root`]
    /// (`MPI_Iscatter`, §6.12): starts it and returns its request; the
    /// buffers stay borrowed until it completes.
    pub fn immediate_scatter_into_root<'a, S, R>(
        &self,
        scope: &Scope<'a>,
        send: &'a S,
        recv: &'a mut R,
    ) -> Result<Request<'a>>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
    {
        let (comm, rank) = (self.comm.clone(), self.rank);
        let sequence = comm.next_collective();
        self.comm.immediate(scope, async move {
            comm.process_at_rank(rank)
                .scatter_into_root_future(sequence, send, recv)
                .await
        })
    }

    async fn scatter_into_root_future<S, R>(
        &self,
        sequence: Sequence,
        send: &S,
        recv: &mut R,
    ) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
    {
        let root = self.root(true)?;
        let (send, send_type) = Pieces::of_buffer(send)?;
        let (mut recv, recv_type) = Pieces::into_buffer(recv)?;
        let element_type = same_element_type(send_type, recv_type)?;
        let n = self.comm.size() as usize;
        expect_len(send.len(), n * recv.len(), element_type, "the send buffer")?;
        let team = self.comm.team(sequence, CollectiveTag::Scatter)?;
        team.complete(algorithms::scatter(
            &team,
            root,
            Some(&send),
            Some(&mut recv),
        ))
        .await
    }

    /// [`Process::scatter_into_root`] in place: the root keeps its own
    /// block where it is in `send` (`MPI_Scatter` with `MPI_IN_PLACE`).
    pub fn scatter_into_root_in_place<S: Buffer + ?Sized>(&self, send: &S) -> Result<()> {
        self.comm
            .blocking(self.scatter_into_root_in_place_future(self.comm.next_collective(), send))
    }

    /// The non-blocking form of [`Process::scatter_into_root_in_place`]
    /// (`MPI_Iscatter`, §6.12): starts it and returns its request; the
    /// buffers stay borrowed until it completes.
    pub fn immediate_scatter_into_root_in_place<'a, S: Buffer + ?Sized>(
        &self,
        scope: &Scope<'a>,
        send: &'a S,
    ) -> Result<Request<'a>> {
        let (comm, rank) = (self.comm.clone(), self.rank);
        let sequence = comm.next_collective();
        self.comm.immediate(scope, async move {
            comm.process_at_rank(rank)
                .scatter_into_root_in_place_future(sequence, send)
                .await
        })
    }

    async fn scatter_into_root_in_place_future<S: Buffer + ?Sized>(
        &self,
        sequence: Sequence,
        send: &S,
    ) -> Result<()> {
        let root = self.root(true)?;
        let n = self.comm.size() as usize;
        let (send, element_type) = Pieces::of_buffer(send)?;
        block_of(send.len(), n, element_type, "the send buffer")?;
        let team = self.comm.team(sequence, CollectiveTag::Scatter)?;
        team.complete(algorithms::scatter(&team, root, Some(&send), None))
            .await
    }

    /// This process's part of a scatter of varying counts from this root
    /// (`MPI_Scatterv`, §6.6), at every process but the root: `recv`
    /// receives its block.
    pub fn scatter_varcount_into<R: BufferMut + ?Sized>(&self, recv: &mut R) -> Result<()> {
        self.comm
            .blocking(self.scatter_varcount_into_future(self.comm.next_collective(), recv))
    }

    /// The non-blocking form of [`Process::scatter_varcount_into`]
    /// (`MPI_Iscatterv`, §6.12): starts it and returns its request; the
    /// buffers stay borrowed until it completes.
    pub fn immediate_scatter_varcount_into<'a, R: BufferMut + ?Sized>(
        &self,
        scope: &Scope<'a>,
        recv: &'a mut R,
    ) -> Result<Request<'a>> {
        let (comm, rank) = (self.comm.clone(), self.rank);
        let sequence = comm.next_collective();
        self.comm.immediate(scope, async move {
            comm.process_at_rank(rank)
                .scatter_varcount_into_future(sequence, recv)
                .await
        })
    }

    async fn scatter_varcount_into_future<R: BufferMut + ?Sized>(
        &self,
        sequence: Sequence,
        recv: &mut R,
    ) -> Result<()> {
        let root = self.root(false)?;
        let team = self.comm.team(sequence, CollectiveTag::Scatter)?;
        let (mut recv, _) = Pieces::into_buffer(recv)?;
        let recv = recv.inbound(0..recv.len())?;
        team.complete(algorithms::scatter_varcount(&team, root, None, Some(recv)))
            .await
    }

    /// The root's part of a scatter of varying counts (`MPI_Scatterv`,
    /// §6.6): block `i` of `send` goes to rank `i`, the root's into
    /// `recv`.
    pub fn scatter_varcount_into_root<S, C, D, R>(
        &self,
        send: &Partition<'_, S, C, D>,
        recv: &mut R,
    ) -> Result<()>
    where
        S: Buffer + ?Sized,
        C: std::borrow::Borrow<[i32]>,
        D: std::borrow::Borrow<[i32]>,
        R: BufferMut + ?Sized,
    {
        self.comm.blocking(self.scatter_varcount_into_root_future(
            self.comm.next_collective(),
            send,
            recv,
        ))
    }

    /// The non-blocking form of [`Process::scatter_varcount_into_root`]
    /// (`MPI_Iscatterv`, §6.12): starts it and returns its request; the
    /// buffers stay borrowed until it completes.
    pub fn immediate_scatter_varcount_into_root<'a, S, C, D, R>(
        &self,
        scope: &Scope<'a>,
        send: Partition<'a, S, C, D>,
        recv: &'a mut R,
    ) -> Result<Request<'a>>
    where
        S: Buffer + ?Sized,
        C: std::borrow::Borrow<[i32]> + 'a,
        D: std::borrow::Borrow<[i32]> + 'a,
        R: BufferMut + ?Sized,
    {
        let (comm, rank) = (self.comm.clone(), self.rank);
        let sequence = comm.next_collective();
        self.comm.immediate(scope, async move {
            comm.process_at_rank(rank)
                .scatter_varcount_into_root_future(sequence, &send, recv)
                .await
        })
    }

    async fn scatter_varcount_into_root_future<S, C, D, R>(
        &self,
        sequence: Sequence,
        send: &Partition<'_, S, C, D>,
        recv: &mut R,
    ) -> Result<()>
    where
        S: Buffer + ?Sized,
        C: std::borrow::Borrow<[i32]>,
        D: std::borrow::Borrow<[i32]>,
        R: BufferMut + ?Sized,
    {
        let root = self.root(true)?;
        let (mut recv, recv_type) = Pieces::into_buffer(recv)?;
        same_element_type(send.element_type(), recv_type)?;
        let n = self.comm.size() as usize;
        let (parts, send) = send.pieces(BlockOwner::Rank, n)?;
        let sends = send.outbound_blocks(&parts)?;
        let recv = recv.inbound(0..recv.len())?;
        let team = self.comm.team(sequence, CollectiveTag::Scatter)?;
        team.complete(algorithms::scatter_varcount(
            &team,
            root,
            Some(sends),
            Some(recv),
        ))
        .await
    }

    /// [`Process::scatter_varcount_into_root`] in place: the root keeps
    /// its own block where it is in `send` (`MPI_Scatterv` with
    /// `MPI_IN_PLACE`).
    pub fn scatter_varcount_into_root_in_place<S, C, D>(
        &self,
        send: &Partition<'_, S, C, D>,
    ) -> Result<()>
    where
        S: Buffer + ?Sized,
        C: std::borrow::Borrow<[i32]>,
        D: std::borrow::Borrow<[i32]>,
    {
        self.comm.blocking(
            self.scatter_varcount_into_root_in_place_future(self.comm.next_collective(), send),
        )
    }

    /// The non-blocking form of
    /// [`Process::scatter_varcount_into_root_in_place`] (`MPI_Iscatterv`,
    /// §6.12): starts it and returns its request; the buffers stay borrowed
    /// until it completes.
    pub fn immediate_scatter_varcount_into_root_in_place<'a, S, C, D>(
        &self,
        scope: &Scope<'a>,
        send: Partition<'a, S, C, D>,
    ) -> Result<Request<'a>>
    where
        S: Buffer + ?Sized,
        C: std::borrow::Borrow<[i32]> + 'a,
        D: std::borrow::Borrow<[i32]> + 'a,
    {
        let (comm, rank) = (self.comm.clone(), self.rank);
        let sequence = comm.next_collective();
        self.comm.immediate(scope, async move {
            comm.process_at_rank(rank)
                .scatter_varcount_into_root_in_place_future(sequence, &send)
                .await
        })
    }

    async fn scatter_varcount_into_root_in_place_future<S, C, D>(
        &self,
        sequence: Sequence,
        send: &Partition<'_, S, C, D>,
    ) -> Result<()>
    where
        S: Buffer + ?Sized,
        C: std::borrow::Borrow<[i32]>,
        D: std::borrow::Borrow<[i32]>,
    {
        let root = self.root(true)?;
        let n = self.comm.size() as usize;
        let (parts, send) = send.pieces(BlockOwner::Rank, n)?;
        let sends = send.outbound_blocks(&parts)?;
        let team = self.comm.team(sequence, CollectiveTag::Scatter)?;
        team.complete(algorithms::scatter_varcount(&team, root, Some(sends), None))
            .await
    }

    /// This process's part of a reduction to this root (`MPI_Reduce`,
    /// §6.9.1), at every process but the root: contributes `send`.
    pub fn reduce_into<S, O>(&self, send: &S, op: O) -> Result<()>
    where
        S: Buffer + ?Sized,
        O: Operation,
    {
        self.comm.blocking(self.reduce_into_future(
            self.comm.next_collective(),
            send,
            op,
            Mode::Blocking,
        ))
    }

    /// The non-blocking form of [`Process::reduce_into`] (`MPI_Ireduce`,
    /// §6.12): starts it and returns its request; the buffers stay borrowed
    /// until it completes.
    pub fn immediate_reduce_into<'a, S, O>(
        &self,
        scope: &Scope<'a>,
        send: &'a S,
        op: O,
    ) -> Result<Request<'a>>
    where
        S: Buffer + ?Sized,
        O: Operation + 'a,
    {
        let (comm, rank) = (self.comm.clone(), self.rank);
        let sequence = comm.next_collective();
        self.comm.immediate(scope, async move {
            comm.process_at_rank(rank)
                .reduce_into_future(sequence, send, op, Mode::Immediate)
                .await
        })
    }

    async fn reduce_into_future<S, O>(
        &self,
        sequence: Sequence,
        send: &S,
        op: O,
        mode: Mode,
    ) -> Result<()>
    where
        S: Buffer + ?Sized,
        O: Operation,
    {
        let node = self.comm.node_for(&sequence, mode)?;
        let root = self.root(false)?;
        let (send, element_type) = Pieces::of_buffer(send)?;
        let red = Reduction::new(&op, element_type)?;
        // The data is combined with others' on its way to the root: in a
        // scratch, a segment at a time.
        let mut acc = Segments::new(Some(send), None)?;
        self.comm
            .reduce_segments(sequence, root, &mut acc, &red, node)
            .await
    }

    /// The root's part of a reduction (`MPI_Reduce`, §6.9.1): `recv`
    /// receives the reduction with `op` of every process's `send`.
    pub fn reduce_into_root<S, R, O>(&self, send: &S, recv: &mut R, op: O) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
        O: Operation,
    {
        self.comm.blocking(self.reduce_into_root_future(
            self.comm.next_collective(),
            send,
            recv,
            op,
            Mode::Blocking,
        ))
    }

    /// The non-blocking form of [`Process::reduce_into_root`] (`MPI_Ireduce`,
    /// §6.12): starts it and returns its request; the buffers stay borrowed
    /// until it completes.
    pub fn immediate_reduce_into_root<'a, S, R, O>(
        &self,
        scope: &Scope<'a>,
        send: &'a S,
        recv: &'a mut R,
        op: O,
    ) -> Result<Request<'a>>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
        O: Operation + 'a,
    {
        let (comm, rank) = (self.comm.clone(), self.rank);
        let sequence = comm.next_collective();
        self.comm.immediate(scope, async move {
            comm.process_at_rank(rank)
                .reduce_into_root_future(sequence, send, recv, op, Mode::Immediate)
                .await
        })
    }

    async fn reduce_into_root_future<S, R, O>(
        &self,
        sequence: Sequence,
        send: &S,
        recv: &mut R,
        op: O,
        mode: Mode,
    ) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
        O: Operation,
    {
        let node = self.comm.node_for(&sequence, mode)?;
        let root = self.root(true)?;
        let (mut acc, red) = reduction_into(send, recv, &op)?;
        self.comm
            .reduce_segments(sequence, root, &mut acc, &red, node)
            .await
    }

    /// [`Process::reduce_into_root`] in place: the root's `buf` is its
    /// input and receives the result (`MPI_Reduce` with `MPI_IN_PLACE`).
    pub fn reduce_into_root_in_place<R, O>(&self, buf: &mut R, op: O) -> Result<()>
    where
        R: BufferMut + ?Sized,
        O: Operation,
    {
        self.comm.blocking(self.reduce_into_root_in_place_future(
            self.comm.next_collective(),
            buf,
            op,
            Mode::Blocking,
        ))
    }

    /// The non-blocking form of [`Process::reduce_into_root_in_place`]
    /// (`MPI_Ireduce`, §6.12): starts it and returns its request; the buffers
    /// stay borrowed until it completes.
    pub fn immediate_reduce_into_root_in_place<'a, R, O>(
        &self,
        scope: &Scope<'a>,
        buf: &'a mut R,
        op: O,
    ) -> Result<Request<'a>>
    where
        R: BufferMut + ?Sized,
        O: Operation + 'a,
    {
        let (comm, rank) = (self.comm.clone(), self.rank);
        let sequence = comm.next_collective();
        self.comm.immediate(scope, async move {
            comm.process_at_rank(rank)
                .reduce_into_root_in_place_future(sequence, buf, op, Mode::Immediate)
                .await
        })
    }

    async fn reduce_into_root_in_place_future<R, O>(
        &self,
        sequence: Sequence,
        buf: &mut R,
        op: O,
        mode: Mode,
    ) -> Result<()>
    where
        R: BufferMut + ?Sized,
        O: Operation,
    {
        let node = self.comm.node_for(&sequence, mode)?;
        let root = self.root(true)?;
        let (buf, element_type) = Pieces::into_buffer(buf)?;
        let red = Reduction::new(&op, element_type)?;
        let mut acc = Segments::new(None, Some(buf))?;
        self.comm
            .reduce_segments(sequence, root, &mut acc, &red, node)
            .await
    }
}
