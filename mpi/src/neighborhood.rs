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
//! The messages travel on the communicator's collective context with tags
//! of their own (below every collective's). In a grid, the messages sent
//! to +1 and to -1 along each dimension carry different tags: a process
//! may be both neighbours of another (a periodic dimension of 1 or 2),
//! and its block from -1 must be the one the other sent to +1. In graphs,
//! repeated edges between two processes pair off in order.

use crate::collective::engine::block_on;
use crate::collective::op::same_element_type;
use crate::collective::team::{unnumbered_tag, Team};
use crate::collective::typed::{Input, Output};
use crate::comm::{Communicator, PROC_NULL};
use crate::context;
use crate::datatype::{Buffer, BufferMut};
use crate::topology::{node_edges, Topology};
use crate::{Error, ErrorClass, Result};

/// The tag of a graph's neighbourhood messages; a grid's messages along
/// dimension `d` carry the unnumbered tag `1 + 2 d` towards +1 and `2 + 2 d`
/// towards -1: never a numbered collective's (`team::unnumbered_tag`).
const GRAPH_TAG: u32 = 0;

/// One exchange step: the destination and source of each block, by the
/// block's index in the send and the receive buffer.
struct Step {
    tag: i32,
    /// (destination rank, index of the send block).
    sends: Vec<(i32, usize)>,
    /// (source rank, index of the receive block).
    recvs: Vec<(i32, usize)>,
}

impl Communicator {
    /// The number of sources and destinations, and the steps that reach
    /// them, or `MPI_ERR_TOPOLOGY` without a topology.
    fn neighborhood(&self) -> Result<(usize, usize, Vec<Step>)> {
        self.require_intra("a neighbourhood collective")?;
        let rank = self.rank();
        let lists = |sources: Vec<i32>, destinations: Vec<i32>| {
            let step = Step {
                tag: unnumbered_tag(GRAPH_TAG),
                sends: destinations.iter().copied().zip(0..).collect(),
                recvs: sources.iter().copied().zip(0..).collect(),
            };
            (sources.len(), destinations.len(), vec![step])
        };
        match self.topology_of() {
            Some(Topology::Cartesian { dims, .. }) => {
                let mut steps = Vec::with_capacity(2 * dims.len());
                for d in 0..dims.len() {
                    let (down, up) = self.grid_shift(d, 1)?;
                    let (below, above) = (2 * d, 2 * d + 1);
                    let towards = |to: i32, from: i32, sent: usize, received: usize, tag| Step {
                        tag,
                        sends: (to != PROC_NULL)
                            .then_some((to, sent))
                            .into_iter()
                            .collect(),
                        recvs: (from != PROC_NULL)
                            .then_some((from, received))
                            .into_iter()
                            .collect(),
                    };
                    let tag_up = 1 + 2 * d as u32;
                    steps.push(towards(up, down, above, below, unnumbered_tag(tag_up)));
                    steps.push(towards(down, up, below, above, unnumbered_tag(tag_up + 1)));
                }
                Ok((2 * dims.len(), 2 * dims.len(), steps))
            }
            Some(Topology::Graph { index, edges }) => {
                // A communicator with a graph has a node per process.
                let neighbors = node_edges(index, edges, rank as usize).to_vec();
                Ok(lists(neighbors.clone(), neighbors))
            }
            Some(Topology::DistributedGraph(n)) => {
                Ok(lists(n.sources.clone(), n.destinations.clone()))
            }
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
        let result = (|| {
            let (input, mut output) = (Input::new(send)?, Output::new(recv)?);
            same_element_type(input.element_type(), output.element_type())?;
            let (sources, _, steps) = self.neighborhood()?;
            let block = input.bytes().len();
            expect_blocks(
                output.bytes_mut().len(),
                sources,
                block,
                "the receive buffer",
            )?;
            let all_the_same = |_: usize| 0;
            self.neighbor_exchange(
                &steps,
                input.bytes(),
                block,
                all_the_same,
                output.bytes_mut(),
            )?;
            output.finish()
        })();
        self.handled(result)
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
        let result = (|| {
            let (input, mut output) = (Input::new(send)?, Output::new(recv)?);
            same_element_type(input.element_type(), output.element_type())?;
            let (sources, destinations, steps) = self.neighborhood()?;
            let block = match (destinations, sources) {
                (0, 0) => 0,
                (0, s) => output.bytes_mut().len() / s,
                (d, _) => input.bytes().len() / d,
            };
            expect_blocks(input.bytes().len(), destinations, block, "the send buffer")?;
            expect_blocks(
                output.bytes_mut().len(),
                sources,
                block,
                "the receive buffer",
            )?;
            self.neighbor_exchange(
                &steps,
                input.bytes(),
                block,
                |j| j * block,
                output.bytes_mut(),
            )?;
            output.finish()
        })();
        self.handled(result)
    }

    /// Runs `steps`: the send block `j` starts at `send_at(j)` in `send`,
    /// the receive block `i` at `i * block` in `recv`.
    fn neighbor_exchange(
        &self,
        steps: &[Step],
        send: &[u8],
        block: usize,
        send_at: impl Fn(usize) -> usize,
        recv: &mut [u8],
    ) -> Result<()> {
        let context = context::collective(self.context_id());
        for step in steps {
            let team = Team::new(
                context,
                step.tag,
                self.rank() as usize,
                self.members(),
                None,
            );
            let sends: Vec<(usize, &[u8])> = step
                .sends
                .iter()
                .map(|&(to, j)| (to as usize, &send[send_at(j)..send_at(j) + block]))
                .collect();
            // Each receive block once, in the order of the step's sources.
            let mut blocks: Vec<Option<&mut [u8]>> =
                recv.chunks_mut(block.max(1)).map(Some).collect();
            let mut recvs: Vec<(usize, &mut [u8])> = Vec::with_capacity(step.recvs.len());
            for &(from, i) in &step.recvs {
                let buf = match blocks.get_mut(i).and_then(Option::take) {
                    Some(buf) => buf,
                    // A zero-length block has no chunk.
                    None => &mut [],
                };
                recvs.push((from as usize, buf));
            }
            team.run(|t| block_on(t.exchange(&sends, &mut recvs)))?;
        }
        Ok(())
    }
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
