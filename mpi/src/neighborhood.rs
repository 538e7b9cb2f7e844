//! Neighbourhood collectives (MPI 4.1 §8.6): each process exchanges data
//! with its neighbours in the communicator's topology only.
//!
//! The neighbours are, for a Cartesian grid, for each dimension in turn
//! the one at displacement -1 and then the one at +1 (both as sources and
//! as destinations; [`PROC_NULL`] off a non-periodic edge: nothing is
//! sent there, and its block of the receive buffer is left as it was);
//! for a graph, a node's neighbours in the order of its edges (sources
//! and destinations alike); for a distributed graph, the sources and
//! destinations as given.
//!
//! Each has a blocking and a non-blocking form (`immediate_...`, as the
//! other collectives', see [`crate::collective`]), and varying counts
//! (`..._varcount_...`, `MPI_Neighbor_allgatherv` and
//! `MPI_Neighbor_alltoallv`) and per-neighbour buffers of any type
//! (`..._w_...`, `MPI_Neighbor_alltoallw`).
//!
//! A neighbourhood collective is one step of messages on the
//! communicator's collective context, numbered like every collective
//! (`collective::team`), so several may be under way at once. Each block
//! is one message sent from where it lies and received where it goes;
//! the point-to-point layer packs or unpacks a block of data that is not
//! contiguous piece by piece as it goes, so no packed copy of a buffer is
//! made (`collective::typed::Pieces`). Messages
//! between two processes pair off in the order they are posted, which
//! the order of the sends and receives makes right: in a grid, a process
//! may be both neighbours of another along a dimension (a periodic
//! dimension of 1 or 2), and its block from -1 must be the one the other
//! sent to +1, so along each dimension a process sends to +1 first and
//! receives from -1 first. In graphs, repeated edges between two
//! processes pair off in order.

use crate::collective::op::same_element_type;
use crate::collective::partition::{disjoint_blocks, BlockOwner};
use crate::collective::team::{CollectiveTag, Sequence};
use crate::collective::typed::{pieces_of_each, whole_messages, Inbound, Outbound, Pieces};
use crate::collective::{Partition, PartitionMut};
use crate::comm::{Communicator, PROC_NULL};
use crate::datatype::{Buffer, BufferMut};
use crate::request::{Request, Scope};
use crate::topology::{node_edges, Topology};
use crate::{Error, ErrorClass, Result};
use std::borrow::Borrow;
use std::ops::Range;

/// A process's neighbourhood: its numbers of sources and destinations,
/// and the messages of an exchange with them in the order they are
/// posted (none to or from `PROC_NULL`). Worked out once per
/// communicator (the topology and the rank never change) and kept with
/// it: working out a grid's shifts each call cost 1,200 instructions of
/// a 2-rank ring's all-gather, a sixth of it.
pub(crate) struct Neighborhood {
    sources: usize,
    destinations: usize,
    /// (destination rank, index of the send block).
    sends: Vec<(i32, usize)>,
    /// (source rank, index of the receive block), the indices ascending
    /// (a grid's -1 before +1, dimension by dimension; a graph's sources
    /// in order), which lets the receive blocks of one length be cut out
    /// of the buffer in one pass.
    recvs: Vec<(i32, usize)>,
}

impl Communicator {
    /// This process's neighbourhood, or `MPI_ERR_TOPOLOGY` without a
    /// topology.
    fn neighborhood(&self) -> Result<&Neighborhood> {
        self.require_intra("a neighbourhood collective")?;
        let cell = self.neighborhood_cell();
        if let Some(hood) = cell.get() {
            return Ok(hood);
        }
        let hood = self.work_out_neighborhood()?;
        Ok(cell.get_or_init(|| hood))
    }

    /// This process's neighbourhood from the communicator's topology.
    fn work_out_neighborhood(&self) -> Result<Neighborhood> {
        let rank = self.rank();
        let lists = |sources: &[i32], destinations: &[i32]| Neighborhood {
            sources: sources.len(),
            destinations: destinations.len(),
            sends: destinations.iter().copied().zip(0..).collect(),
            recvs: sources.iter().copied().zip(0..).collect(),
        };
        match self.topology_of() {
            Some(Topology::Cartesian { dims, .. }) => {
                let mut sends = Vec::with_capacity(2 * dims.len());
                let mut recvs = Vec::with_capacity(2 * dims.len());
                for d in 0..dims.len() {
                    let (down, up) = self.grid_shift(d, 1)?;
                    let (below, above) = (2 * d, 2 * d + 1);
                    // To +1 first, from -1 first: see the module docs.
                    sends.extend([(up, above), (down, below)]);
                    recvs.extend([(down, below), (up, above)]);
                }
                sends.retain(|&(to, _)| to != PROC_NULL);
                recvs.retain(|&(from, _)| from != PROC_NULL);
                Ok(Neighborhood {
                    sources: 2 * dims.len(),
                    destinations: 2 * dims.len(),
                    sends,
                    recvs,
                })
            }
            Some(Topology::Graph { index, edges }) => {
                // A communicator with a graph has a node per process.
                let neighbors = node_edges(index, edges, rank as usize);
                Ok(lists(neighbors, neighbors))
            }
            Some(Topology::DistributedGraph(n)) => Ok(lists(&n.sources, &n.destinations)),
            None => Err(Error::new(
                ErrorClass::Topology,
                "a neighbourhood collective needs a communicator with a topology",
            )),
        }
    }

    /// Sends `send` to every destination neighbour and receives a block
    /// of `recv` from each source neighbour, in their order
    /// (`MPI_Neighbor_allgather`); `recv` holds one block the length of
    /// `send` per source. Collective.
    #[doc(alias = "MPI_Neighbor_allgather")]
    pub fn neighbor_all_gather_into<S, R>(&self, send: &S, recv: &mut R) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
    {
        self.blocking(self.neighbor_all_gather_future(self.next_collective(), send, recv))
    }

    /// The non-blocking form of [`Communicator::neighbor_all_gather_into`]
    /// (`MPI_Ineighbor_allgather`): starts it and returns its request;
    /// the buffers stay borrowed until it completes.
    #[doc(alias = "MPI_Ineighbor_allgather")]
    pub fn immediate_neighbor_all_gather_into<'a, S, R>(
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
            comm.neighbor_all_gather_future(sequence, send, recv).await
        })
    }

    async fn neighbor_all_gather_future<S, R>(
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
        same_element_type(send_type, recv_type)?;
        let hood = self.neighborhood()?;
        let block = send.len();
        expect_blocks(recv.len(), hood.sources, block, "the receive buffer")?;
        let recvs = uniform_receives(&mut recv, hood, block)?;
        let sends = posted(&hood.sends, |_| send.outbound(0..block))?;
        self.neighbor_exchange(sequence, CollectiveTag::AllGather, sends, recvs)
            .await
    }

    /// Sends `send`, of any length, to every destination neighbour and
    /// receives the blocks of `recv` from the source neighbours: block
    /// `i` (count and displacement `i`, which must not overlap) from
    /// source `i` (`MPI_Neighbor_allgatherv`). Collective.
    #[doc(alias = "MPI_Neighbor_allgatherv")]
    pub fn neighbor_all_gather_varcount_into<S, R, C, D>(
        &self,
        send: &S,
        recv: &mut PartitionMut<'_, R, C, D>,
    ) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
        C: Borrow<[i32]>,
        D: Borrow<[i32]>,
    {
        self.blocking(self.neighbor_all_gather_varcount_future(self.next_collective(), send, recv))
    }

    /// The non-blocking form of
    /// [`Communicator::neighbor_all_gather_varcount_into`]
    /// (`MPI_Ineighbor_allgatherv`): starts it and returns its request;
    /// the buffers stay borrowed until it completes.
    #[doc(alias = "MPI_Ineighbor_allgatherv")]
    pub fn immediate_neighbor_all_gather_varcount_into<'a, S, R, C, D>(
        &self,
        scope: &Scope<'a>,
        send: &'a S,
        mut recv: PartitionMut<'a, R, C, D>,
    ) -> Result<Request<'a>>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
        C: Borrow<[i32]> + 'a,
        D: Borrow<[i32]> + 'a,
    {
        let comm = self.clone();
        let sequence = comm.next_collective();
        self.immediate(scope, async move {
            comm.neighbor_all_gather_varcount_future(sequence, send, &mut recv)
                .await
        })
    }

    async fn neighbor_all_gather_varcount_future<S, R, C, D>(
        &self,
        sequence: Sequence,
        send: &S,
        recv: &mut PartitionMut<'_, R, C, D>,
    ) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
        C: Borrow<[i32]>,
        D: Borrow<[i32]>,
    {
        let (send, send_type) = Pieces::of_buffer(send)?;
        same_element_type(send_type, recv.element_type())?;
        let hood = self.neighborhood()?;
        let (parts, mut recv) = recv.pieces(BlockOwner::SourceNeighbor, hood.sources)?;
        let recvs = from_sources(&mut recv, &parts, hood)?;
        let sends = posted(&hood.sends, |_| send.outbound(0..send.len()))?;
        self.neighbor_exchange(sequence, CollectiveTag::AllGather, sends, recvs)
            .await
    }

    /// Sends block `j` of `send` to destination neighbour `j` and receives
    /// block `i` of `recv` from source neighbour `i`
    /// (`MPI_Neighbor_alltoall`); all blocks have one length. Collective.
    #[doc(alias = "MPI_Neighbor_alltoall")]
    pub fn neighbor_all_to_all_into<S, R>(&self, send: &S, recv: &mut R) -> Result<()>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
    {
        self.blocking(self.neighbor_all_to_all_future(self.next_collective(), send, recv))
    }

    /// The non-blocking form of [`Communicator::neighbor_all_to_all_into`]
    /// (`MPI_Ineighbor_alltoall`): starts it and returns its request; the
    /// buffers stay borrowed until it completes.
    #[doc(alias = "MPI_Ineighbor_alltoall")]
    pub fn immediate_neighbor_all_to_all_into<'a, S, R>(
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
            comm.neighbor_all_to_all_future(sequence, send, recv).await
        })
    }

    async fn neighbor_all_to_all_future<S, R>(
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
        same_element_type(send_type, recv_type)?;
        let hood = self.neighborhood()?;
        let block = match (hood.destinations, hood.sources) {
            (0, 0) => 0,
            (0, s) => recv.len() / s,
            (d, _) => send.len() / d,
        };
        expect_blocks(send.len(), hood.destinations, block, "the send buffer")?;
        expect_blocks(recv.len(), hood.sources, block, "the receive buffer")?;
        let recvs = uniform_receives(&mut recv, hood, block)?;
        let sends = posted(&hood.sends, |j| send.outbound(j * block..(j + 1) * block))?;
        self.neighbor_exchange(sequence, CollectiveTag::AllToAll, sends, recvs)
            .await
    }

    /// Sends the blocks of `send` to the destination neighbours and
    /// receives those of `recv` from the source neighbours, blocks of any
    /// lengths: block `j` (count and displacement `j`) of `send` to
    /// destination `j`, block `i` of `recv` (which must not overlap
    /// another) from source `i` (`MPI_Neighbor_alltoallv`). Collective.
    #[doc(alias = "MPI_Neighbor_alltoallv")]
    pub fn neighbor_all_to_all_varcount_into<S, SC, SD, R, RC, RD>(
        &self,
        send: &Partition<'_, S, SC, SD>,
        recv: &mut PartitionMut<'_, R, RC, RD>,
    ) -> Result<()>
    where
        S: Buffer + ?Sized,
        SC: Borrow<[i32]>,
        SD: Borrow<[i32]>,
        R: BufferMut + ?Sized,
        RC: Borrow<[i32]>,
        RD: Borrow<[i32]>,
    {
        self.blocking(self.neighbor_all_to_all_varcount_future(self.next_collective(), send, recv))
    }

    /// The non-blocking form of
    /// [`Communicator::neighbor_all_to_all_varcount_into`]
    /// (`MPI_Ineighbor_alltoallv`): starts it and returns its request; the
    /// buffers stay borrowed until it completes.
    #[doc(alias = "MPI_Ineighbor_alltoallv")]
    pub fn immediate_neighbor_all_to_all_varcount_into<'a, S, SC, SD, R, RC, RD>(
        &self,
        scope: &Scope<'a>,
        send: Partition<'a, S, SC, SD>,
        mut recv: PartitionMut<'a, R, RC, RD>,
    ) -> Result<Request<'a>>
    where
        S: Buffer + ?Sized,
        SC: Borrow<[i32]> + 'a,
        SD: Borrow<[i32]> + 'a,
        R: BufferMut + ?Sized,
        RC: Borrow<[i32]> + 'a,
        RD: Borrow<[i32]> + 'a,
    {
        let comm = self.clone();
        let sequence = comm.next_collective();
        self.immediate(scope, async move {
            comm.neighbor_all_to_all_varcount_future(sequence, &send, &mut recv)
                .await
        })
    }

    async fn neighbor_all_to_all_varcount_future<S, SC, SD, R, RC, RD>(
        &self,
        sequence: Sequence,
        send: &Partition<'_, S, SC, SD>,
        recv: &mut PartitionMut<'_, R, RC, RD>,
    ) -> Result<()>
    where
        S: Buffer + ?Sized,
        SC: Borrow<[i32]>,
        SD: Borrow<[i32]>,
        R: BufferMut + ?Sized,
        RC: Borrow<[i32]>,
        RD: Borrow<[i32]>,
    {
        same_element_type(send.element_type(), recv.element_type())?;
        let hood = self.neighborhood()?;
        let (send_parts, send) = send.pieces(BlockOwner::DestinationNeighbor, hood.destinations)?;
        let (recv_parts, mut recv) = recv.pieces(BlockOwner::SourceNeighbor, hood.sources)?;
        let recvs = from_sources(&mut recv, &recv_parts, hood)?;
        let sends = posted(&hood.sends, |j| send.outbound(send_parts[j].clone()))?;
        self.neighbor_exchange(sequence, CollectiveTag::AllToAll, sends, recvs)
            .await
    }

    /// Sends `send[j]` to destination neighbour `j` and receives `recv[i]`
    /// from source neighbour `i`: one buffer per neighbour, each of its
    /// own type and length (`MPI_Neighbor_alltoallw`, whose
    /// per-neighbour datatypes and byte displacements these buffers stand
    /// for). The lists have as many entries as there are destinations and
    /// sources (else `MPI_ERR_COUNT`). Collective.
    #[doc(alias = "MPI_Neighbor_alltoallw")]
    pub fn neighbor_all_to_all_w_into(
        &self,
        send: &[&dyn Buffer],
        recv: &mut [&mut dyn BufferMut],
    ) -> Result<()> {
        self.blocking(self.neighbor_all_to_all_w_future(self.next_collective(), send, recv))
    }

    /// The non-blocking form of
    /// [`Communicator::neighbor_all_to_all_w_into`]
    /// (`MPI_Ineighbor_alltoallw`): starts it and returns its request; the
    /// buffers stay borrowed until it completes.
    #[doc(alias = "MPI_Ineighbor_alltoallw")]
    pub fn immediate_neighbor_all_to_all_w_into<'a>(
        &self,
        scope: &Scope<'a>,
        send: &'a [&'a dyn Buffer],
        recv: &'a mut [&'a mut dyn BufferMut],
    ) -> Result<Request<'a>> {
        let comm = self.clone();
        let sequence = comm.next_collective();
        self.immediate(scope, async move {
            comm.neighbor_all_to_all_w_future(sequence, send, recv)
                .await
        })
    }

    async fn neighbor_all_to_all_w_future(
        &self,
        sequence: Sequence,
        send: &[&dyn Buffer],
        recv: &mut [&mut dyn BufferMut],
    ) -> Result<()> {
        let hood = self.neighborhood()?;
        if send.len() != hood.destinations || recv.len() != hood.sources {
            return Err(Error::new(
                ErrorClass::Count,
                format!(
                    "{} send and {} receive buffers for {} destination and {} source neighbours",
                    send.len(),
                    recv.len(),
                    hood.destinations,
                    hood.sources
                ),
            ));
        }
        let (inputs, mut outputs) = pieces_of_each(send, recv)?;
        let (sends, recvs) = whole_messages(&inputs, &mut outputs)?;
        let sends = in_posting_order(sends, &hood.sends)?;
        let recvs = in_posting_order(recvs, &hood.recvs)?;
        self.neighbor_exchange(sequence, CollectiveTag::AllToAll, sends, recvs)
            .await
    }

    /// The exchange of a neighbourhood collective of kind `kind`: the
    /// messages `sends` and `recvs` (to and from their ranks, in the
    /// order [`Neighborhood`] posts them), each one the point-to-point
    /// layer packs or unpacks piece by piece where its data is not
    /// contiguous. A block of no destination or source (`PROC_NULL`) is
    /// in neither, and so left alone.
    async fn neighbor_exchange(
        &self,
        sequence: Sequence,
        kind: CollectiveTag,
        sends: Vec<(usize, Outbound<'_>)>,
        recvs: Vec<(usize, Inbound<'_>)>,
    ) -> Result<()> {
        let team = self.team(sequence, kind)?;
        team.complete(team.exchange_data(sends, recvs)).await
    }
}

/// The receives of blocks of `block` bytes of `recv`, one per source
/// neighbour, in the order `hood` posts them. Their positions ascend as
/// the neighbourhood's receives do (see [`Neighborhood::recvs`]), and
/// blocks of one length never overlap: `recv` is cut in one pass,
/// without the sorting and checking of the varying-count forms'
/// blocks.
fn uniform_receives<'r>(
    recv: &'r mut Pieces<'_>,
    hood: &Neighborhood,
    block: usize,
) -> Result<Vec<(usize, Inbound<'r>)>> {
    let parts = hood
        .recvs
        .iter()
        .map(|&(from, i)| (from as usize, i * block..(i + 1) * block));
    recv.inbound_ascending(parts)
}

/// The receives of the blocks `parts` of `recv` (by source neighbour,
/// which must not overlap: else `MPI_ERR_ARG`, naming the neighbours by
/// their positions among the sources), in the order `hood` posts them.
fn from_sources<'r>(
    recv: &'r mut Pieces<'_>,
    parts: &[Range<usize>],
    hood: &Neighborhood,
) -> Result<Vec<(usize, Inbound<'r>)>> {
    let len = recv.len();
    let blocks = recv.inbound_blocks(disjoint_blocks(len, parts, BlockOwner::SourceNeighbor)?)?;
    in_posting_order(blocks, &hood.recvs)
}

/// Checks that `len` bytes are `blocks` blocks of `block` bytes.
fn expect_blocks(len: usize, blocks: usize, block: usize, what: &str) -> Result<()> {
    if len != blocks * block {
        return Err(Error::new(
            ErrorClass::Count,
            format!(
                "{what} holds {len} bytes where {blocks} neighbours' blocks of {block} bytes are needed"
            ),
        ));
    }
    Ok(())
}

/// The messages of an exchange in the order `posting` gives them ((rank,
/// index of the block) each), each made from its block's index by
/// `message`: no list of the blocks by index is made first.
fn posted<T>(
    posting: &[(i32, usize)],
    mut message: impl FnMut(usize) -> Result<T>,
) -> Result<Vec<(usize, T)>> {
    posting
        .iter()
        .map(|&(rank, i)| Ok((rank as usize, message(i)?)))
        .collect()
}

/// The messages of `blocks` (by index) in the order `posting` gives
/// them. The neighbourhood names each block at most once.
fn in_posting_order<T: Default>(
    mut blocks: Vec<T>,
    posting: &[(i32, usize)],
) -> Result<Vec<(usize, T)>> {
    posted(posting, |i| {
        Ok(blocks.get_mut(i).map(std::mem::take).unwrap_or_default())
    })
}
