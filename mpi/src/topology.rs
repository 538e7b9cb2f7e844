//! Virtual topologies (MPI 4.1 §8): Cartesian grids, graphs and
//! distributed graphs laid over a communicator's processes.
//!
//! A topology is a property of a communicator made with it
//! ([`Communicator::create_cartesian_communicator`],
//! [`Communicator::create_graph_communicator`],
//! [`Communicator::create_distributed_graph_adjacent`], and
//! [`Communicator::cartesian_subgroup`] of a grid); duplicates keep it. It
//! lives entirely in the MPI layer: making one agrees on a context id as
//! any new communicator does, and every query after that is local
//! arithmetic on the layout every process was given.
//!
//! Ranks are not reordered: a process has the same rank in the new
//! communicator as in the old one (`reorder` is accepted, and the
//! standard allows ignoring it). Grids are laid out in row-major order:
//! the last coordinate varies fastest.
//!
//! ```no_run
//! let universe = oxmpi::initialize().unwrap();
//! let world = universe.world();
//! let mut dims = [0, 0];
//! oxmpi::dims_create(world.size(), &mut dims).unwrap();
//! let grid = world
//!     .create_cartesian_communicator(&dims, &[true, false], false)
//!     .unwrap()
//!     .expect("every rank is in a grid of every rank");
//! // A halo exchange along dimension 0: send up, receive from below.
//! let (below, above) = grid.cartesian_shift(0, 1).unwrap();
//! let mut halo = 0.0f64;
//! grid.send_receive_into(
//!     &1.5f64,
//!     &grid.process_at_rank(above),
//!     &mut halo,
//!     &grid.process_at_rank(below),
//! )
//! .unwrap();
//! // Or every neighbour's value at once (-1 then +1, per dimension).
//! let mut neighbours = [0.0f64; 4];
//! grid.neighbor_all_gather_into(&1.5f64, &mut neighbours[..]).unwrap();
//! ```
//!
//! The neighbourhood collectives are in `neighborhood`.
//!
//! Not provided: `MPI_Dist_graph_create`
//! (the form where each process gives any edges), and `MPI_Cart_map` /
//! `MPI_Graph_map`.

use crate::comm::{Communicator, PROC_NULL};
use crate::comm_management::Color;
use crate::{Error, ErrorClass, Result};

/// The topology of a communicator, as every member keeps it.
#[derive(Clone, Debug)]
pub(crate) enum Topology {
    Cartesian {
        dims: Vec<i32>,
        periods: Vec<bool>,
    },
    Graph {
        index: Vec<i32>,
        edges: Vec<i32>,
    },
    /// This process's edges only.
    DistributedGraph(DistributedGraphNeighbors),
}

/// Which kind of topology a communicator has (`MPI_Topo_test`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TopologyKind {
    /// A Cartesian grid (`MPI_CART`).
    Cartesian,
    /// A graph (`MPI_GRAPH`).
    Graph,
    /// A distributed graph (`MPI_DIST_GRAPH`).
    DistributedGraph,
}

/// A Cartesian grid and this process's place in it (`MPI_Cart_get`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CartesianLayout {
    /// The number of processes along each dimension.
    pub dims: Vec<i32>,
    /// Whether each dimension wraps around.
    pub periods: Vec<bool>,
    /// This process's coordinates.
    pub coords: Vec<i32>,
}

/// The edges of a process in a distributed graph
/// (`MPI_Dist_graph_neighbors`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DistributedGraphNeighbors {
    /// The ranks with an edge to this process.
    pub sources: Vec<i32>,
    /// Their edges' weights, or `None` for an unweighted graph
    /// (`MPI_UNWEIGHTED`).
    pub source_weights: Option<Vec<i32>>,
    /// The ranks this process has an edge to.
    pub destinations: Vec<i32>,
    /// Their edges' weights, or `None`.
    pub destination_weights: Option<Vec<i32>>,
}

/// Chooses the sizes of the dimensions of `dims` that are 0 so that
/// their product with the others is `nnodes`, as close to each other as
/// it can, in non-increasing order (`MPI_Dims_create`). Dimensions that
/// are not 0 are kept. A negative dimension, or fixed ones whose product
/// does not divide `nnodes` (or, with none free, is not `nnodes`), is an
/// `MPI_ERR_DIMS` error; `nnodes` below 1 is `MPI_ERR_ARG`.
#[doc(alias = "MPI_Dims_create")]
pub fn dims_create(nnodes: i32, dims: &mut [i32]) -> Result<()> {
    if nnodes < 1 {
        return Err(Error::new(
            ErrorClass::Arg,
            format!("dims_create for {nnodes} nodes: the number of nodes must be positive"),
        ));
    }
    if let Some(d) = dims.iter().find(|&&d| d < 0) {
        return Err(Error::new(
            ErrorClass::Dims,
            format!("dims_create: dimension size {d} is negative"),
        ));
    }
    let fixed: i64 = dims
        .iter()
        .filter(|&&d| d > 0)
        .map(|&d| i64::from(d))
        .product();
    let free = dims.iter().filter(|&&d| d == 0).count();
    let nnodes64 = i64::from(nnodes);
    if nnodes64 % fixed != 0 || (free == 0 && fixed != nnodes64) {
        return Err(Error::new(
            ErrorClass::Dims,
            format!(
                "dims_create: the given dimensions (product {fixed}) do not fit {nnodes} nodes"
            ),
        ));
    }
    // Each prime factor, largest first, goes to the free dimension that is
    // smallest so far.
    let mut sizes = vec![1i32; free];
    if free > 0 {
        for factor in prime_factors((nnodes64 / fixed) as i32).into_iter().rev() {
            let smallest = (0..free).min_by_key(|&i| sizes[i]).unwrap_or(0);
            sizes[smallest] *= factor;
        }
    }
    sizes.sort_unstable_by(|a, b| b.cmp(a));
    for (d, size) in dims.iter_mut().filter(|d| **d == 0).zip(sizes) {
        *d = size;
    }
    Ok(())
}

/// The prime factors of `n`, smallest first, with repeats.
fn prime_factors(mut n: i32) -> Vec<i32> {
    let mut factors = Vec::new();
    let mut p = 2;
    while p * p <= n {
        while n % p == 0 {
            factors.push(p);
            n /= p;
        }
        p += 1;
    }
    if n > 1 {
        factors.push(n);
    }
    factors
}

/// The neighbours of `node` (in range) of a graph of `index` and `edges`.
pub(crate) fn node_edges<'g>(index: &[i32], edges: &'g [i32], node: usize) -> &'g [i32] {
    let start = if node == 0 { 0 } else { index[node - 1] };
    &edges[start as usize..index[node] as usize]
}

/// The rank of `coords` (all in range) in a grid of `dims`, row-major.
fn grid_rank(dims: &[i32], coords: &[i32]) -> i32 {
    dims.iter()
        .zip(coords)
        .fold(0, |rank, (&d, &c)| rank * d + c)
}

/// The coordinates of `rank` (in range) in a grid of `dims`.
fn grid_coords(dims: &[i32], mut rank: i32) -> Vec<i32> {
    let mut coords = vec![0; dims.len()];
    for (c, &d) in coords.iter_mut().zip(dims).rev() {
        *c = rank % d;
        rank /= d;
    }
    coords
}

fn topology_error(what: &str, kind: &str) -> Error {
    Error::new(
        ErrorClass::Topology,
        format!(
            "{what} needs a communicator with a {kind} topology; this one has none of that kind"
        ),
    )
}

impl Communicator {
    /// The kind of the communicator's topology, or `None`
    /// (`MPI_Topo_test`, `MPI_UNDEFINED`).
    #[doc(alias = "MPI_Topo_test")]
    pub fn topology(&self) -> Option<TopologyKind> {
        Some(match self.topology_of()? {
            Topology::Cartesian { .. } => TopologyKind::Cartesian,
            Topology::Graph { .. } => TopologyKind::Graph,
            Topology::DistributedGraph(_) => TopologyKind::DistributedGraph,
        })
    }

    /// A communicator of the first `dims` product of this communicator's
    /// processes, with a Cartesian grid of `dims` processes along each
    /// dimension, wrapping around where `periods` says
    /// (`MPI_Cart_create`); `None` at the processes left out. Collective;
    /// every process passes the same arguments. `reorder` is accepted and
    /// ranks are kept. Sizes below 1 are `MPI_ERR_DIMS` errors; a grid
    /// larger than the communicator is `MPI_ERR_ARG`.
    #[doc(alias = "MPI_Cart_create")]
    pub fn create_cartesian_communicator(
        &self,
        dims: &[i32],
        periods: &[bool],
        reorder: bool,
    ) -> Result<Option<Communicator>> {
        let _ = reorder;
        self.handled(self.cartesian_create(dims, periods))
    }

    fn cartesian_create(&self, dims: &[i32], periods: &[bool]) -> Result<Option<Communicator>> {
        self.require_intra("a Cartesian topology")?;
        if dims.len() != periods.len() {
            return Err(Error::new(
                ErrorClass::Arg,
                format!(
                    "a Cartesian grid of {} dimensions with {} periods: give one per dimension",
                    dims.len(),
                    periods.len()
                ),
            ));
        }
        if let Some(d) = dims.iter().find(|&&d| d < 1) {
            return Err(Error::new(
                ErrorClass::Dims,
                format!("a Cartesian dimension of size {d}: sizes are at least 1"),
            ));
        }
        let nodes = dims.iter().map(|&d| i64::from(d)).product::<i64>();
        let topology = Topology::Cartesian {
            dims: dims.to_vec(),
            periods: periods.to_vec(),
        };
        self.with_topology(nodes, "Cartesian grid", topology)
    }

    /// The new communicator of this one's first `nodes` processes, with
    /// `topology`.
    fn with_topology(
        &self,
        nodes: i64,
        what: &str,
        topology: Topology,
    ) -> Result<Option<Communicator>> {
        if nodes > i64::from(self.size()) {
            return Err(Error::new(
                ErrorClass::Arg,
                format!(
                    "a {what} of {nodes} processes does not fit in a communicator of {}",
                    self.size()
                ),
            ));
        }
        let first: Vec<i32> = (0..nodes as i32).collect();
        let group = self.group().include(&first)?;
        let made = self.subgroup_collective(&group)?;
        if let Some(comm) = &made {
            comm.set_topology(topology)?;
        }
        Ok(made)
    }

    /// The grid's dimensions and periods, or `MPI_ERR_TOPOLOGY`.
    fn grid(&self, what: &str) -> Result<(&[i32], &[bool])> {
        self.live()?;
        match self.topology_of() {
            Some(Topology::Cartesian { dims, periods }) => Ok((dims, periods)),
            _ => Err(topology_error(what, "Cartesian")),
        }
    }

    /// The number of dimensions of the grid (`MPI_Cartdim_get`).
    #[doc(alias = "MPI_Cartdim_get")]
    pub fn cartesian_dimensions(&self) -> Result<usize> {
        self.handled(
            self.grid("cartesian_dimensions")
                .map(|(dims, _)| dims.len()),
        )
    }

    /// The grid and this process's coordinates in it (`MPI_Cart_get`).
    #[doc(alias = "MPI_Cart_get")]
    pub fn cartesian_layout(&self) -> Result<CartesianLayout> {
        let layout = self
            .grid("cartesian_layout")
            .map(|(dims, periods)| CartesianLayout {
                dims: dims.to_vec(),
                periods: periods.to_vec(),
                coords: grid_coords(dims, self.rank()),
            });
        self.handled(layout)
    }

    /// The rank of the process at `coords` (`MPI_Cart_rank`). A coordinate
    /// outside its dimension wraps around if the dimension is periodic,
    /// and is an `MPI_ERR_ARG` error if not; the wrong number of
    /// coordinates is `MPI_ERR_DIMS`.
    #[doc(alias = "MPI_Cart_rank")]
    pub fn cartesian_rank(&self, coords: &[i32]) -> Result<i32> {
        self.handled(self.grid_rank_of(coords))
    }

    fn grid_rank_of(&self, coords: &[i32]) -> Result<i32> {
        let (dims, periods) = self.grid("cartesian_rank")?;
        if coords.len() != dims.len() {
            return Err(Error::new(
                ErrorClass::Dims,
                format!(
                    "{} coordinates for a grid of {} dimensions",
                    coords.len(),
                    dims.len()
                ),
            ));
        }
        let mut wrapped = Vec::with_capacity(coords.len());
        for (i, ((&c, &d), &periodic)) in coords.iter().zip(dims).zip(periods).enumerate() {
            if periodic {
                wrapped.push(c.rem_euclid(d));
            } else if (0..d).contains(&c) {
                wrapped.push(c);
            } else {
                return Err(Error::new(
                    ErrorClass::Arg,
                    format!(
                        "coordinate {c} is outside dimension {i} (0..{d}), which is not periodic"
                    ),
                ));
            }
        }
        Ok(grid_rank(dims, &wrapped))
    }

    /// The coordinates of the process of rank `rank` in the grid
    /// (`MPI_Cart_coords`); `MPI_ERR_RANK` for a rank outside it.
    #[doc(alias = "MPI_Cart_coords")]
    pub fn cartesian_coordinates(&self, rank: i32) -> Result<Vec<i32>> {
        let coords = self.grid("cartesian_coordinates").and_then(|(dims, _)| {
            if !(0..self.size()).contains(&rank) {
                return Err(Error::new(
                    ErrorClass::Rank,
                    format!(
                        "rank {rank} is not in this grid of {} processes",
                        self.size()
                    ),
                ));
            }
            Ok(grid_coords(dims, rank))
        });
        self.handled(coords)
    }

    /// The ranks this process receives from and sends to in a shift by
    /// `displacement` along dimension `direction` (`MPI_Cart_shift`):
    /// `(source, destination)`. At the edge of a dimension that is not
    /// periodic, a rank off the grid is [`PROC_NULL`]. A direction outside
    /// the grid's dimensions is an `MPI_ERR_ARG` error.
    #[doc(alias = "MPI_Cart_shift")]
    pub fn cartesian_shift(&self, direction: usize, displacement: i32) -> Result<(i32, i32)> {
        self.handled(self.grid_shift(direction, displacement))
    }

    /// [`Communicator::cartesian_shift`], its errors not handled.
    pub(crate) fn grid_shift(&self, direction: usize, displacement: i32) -> Result<(i32, i32)> {
        let (dims, periods) = self.grid("cartesian_shift")?;
        if direction >= dims.len() {
            return Err(Error::new(
                ErrorClass::Arg,
                format!(
                    "shift along dimension {direction} of a grid of {} dimensions",
                    dims.len()
                ),
            ));
        }
        let coords = grid_coords(dims, self.rank());
        let (d, periodic) = (dims[direction], periods[direction]);
        let moved = |by: i64| {
            let c = i64::from(coords[direction]) + by;
            let c = if periodic {
                c.rem_euclid(i64::from(d))
            } else if (0..i64::from(d)).contains(&c) {
                c
            } else {
                return PROC_NULL;
            };
            let mut at = coords.clone();
            at[direction] = c as i32;
            grid_rank(dims, &at)
        };
        let by = i64::from(displacement);
        Ok((moved(-by), moved(by)))
    }

    /// The grid of this process's neighbours along the dimensions that
    /// `remain` keeps (`MPI_Cart_sub`): one new communicator for each
    /// place in the dimensions dropped, with a grid of the kept ones.
    /// Keeping none gives a grid of 0 dimensions and 1 process.
    /// Collective.
    #[doc(alias = "MPI_Cart_sub")]
    pub fn cartesian_subgroup(&self, remain: &[bool]) -> Result<Communicator> {
        self.handled(self.grid_sub(remain))
    }

    fn grid_sub(&self, remain: &[bool]) -> Result<Communicator> {
        let (dims, periods) = self.grid("cartesian_subgroup")?;
        if remain.len() != dims.len() {
            return Err(Error::new(
                ErrorClass::Arg,
                format!(
                    "cartesian_subgroup with {} flags for a grid of {} dimensions",
                    remain.len(),
                    dims.len()
                ),
            ));
        }
        let coords = grid_coords(dims, self.rank());
        let pick = |keep: bool, of: &[i32]| -> Vec<i32> {
            of.iter()
                .zip(remain)
                .filter(|(_, &r)| r == keep)
                .map(|(&v, _)| v)
                .collect()
        };
        let color = grid_rank(&pick(false, dims), &pick(false, &coords));
        let key = grid_rank(&pick(true, dims), &pick(true, &coords));
        let sub = self
            .split_unhandled(Color::with_value(color), key)?
            .ok_or_else(|| {
                Error::new(
                    ErrorClass::Intern,
                    "a process of a grid is in none of its subgrids",
                )
            })?;
        let kept_periods = periods
            .iter()
            .zip(remain)
            .filter(|(_, &r)| r)
            .map(|(&p, _)| p)
            .collect();
        sub.set_topology(Topology::Cartesian {
            dims: pick(true, dims),
            periods: kept_periods,
        })?;
        Ok(sub)
    }

    /// A communicator of the first `index.len()` of this communicator's
    /// processes, with a graph (`MPI_Graph_create`): node `i`'s
    /// neighbours are `edges[index[i - 1]..index[i]]` (from 0 for node 0).
    /// `None` at the processes left out. Collective; every process passes
    /// the same arguments. Decreasing `index`, an `index` that does not
    /// end at `edges.len()`, or an edge to a node outside the graph is an
    /// `MPI_ERR_ARG` error, as is a graph larger than the communicator.
    #[doc(alias = "MPI_Graph_create")]
    pub fn create_graph_communicator(
        &self,
        index: &[i32],
        edges: &[i32],
        reorder: bool,
    ) -> Result<Option<Communicator>> {
        let _ = reorder;
        self.handled(self.graph_create(index, edges))
    }

    fn graph_create(&self, index: &[i32], edges: &[i32]) -> Result<Option<Communicator>> {
        self.require_intra("a graph topology")?;
        let nodes = index.len() as i32;
        let mut start = 0;
        for (node, &end) in index.iter().enumerate() {
            if end < start || end as usize > edges.len() {
                return Err(Error::new(
                    ErrorClass::Arg,
                    format!(
                        "graph index[{node}] = {end}: the index must not decrease, and not pass the {} edges",
                        edges.len()
                    ),
                ));
            }
            start = end;
        }
        if start as usize != edges.len() {
            return Err(Error::new(
                ErrorClass::Arg,
                format!(
                    "the graph index ends at {start} but {} edges are given",
                    edges.len()
                ),
            ));
        }
        if let Some(e) = edges.iter().find(|&&e| !(0..nodes).contains(&e)) {
            return Err(Error::new(
                ErrorClass::Arg,
                format!("a graph edge to node {e}, outside the graph of {nodes} nodes"),
            ));
        }
        let topology = Topology::Graph {
            index: index.to_vec(),
            edges: edges.to_vec(),
        };
        self.with_topology(i64::from(nodes), "graph", topology)
    }

    /// The graph's index and edges, or `MPI_ERR_TOPOLOGY`.
    fn graph(&self, what: &str) -> Result<(&[i32], &[i32])> {
        self.live()?;
        match self.topology_of() {
            Some(Topology::Graph { index, edges }) => Ok((index, edges)),
            _ => Err(topology_error(what, "graph")),
        }
    }

    /// The number of nodes and of edges of the graph
    /// (`MPI_Graphdims_get`).
    #[doc(alias = "MPI_Graphdims_get")]
    pub fn graph_dimensions(&self) -> Result<(i32, i32)> {
        let dims = self
            .graph("graph_dimensions")
            .map(|(index, edges)| (index.len() as i32, edges.len() as i32));
        self.handled(dims)
    }

    /// The graph's index and edges (`MPI_Graph_get`).
    #[doc(alias = "MPI_Graph_get")]
    pub fn graph_layout(&self) -> Result<(Vec<i32>, Vec<i32>)> {
        let layout = self
            .graph("graph_layout")
            .map(|(index, edges)| (index.to_vec(), edges.to_vec()));
        self.handled(layout)
    }

    /// The neighbours of node `rank` of the graph (`MPI_Graph_neighbors`);
    /// `MPI_ERR_RANK` for a rank outside it.
    #[doc(alias = "MPI_Graph_neighbors")]
    pub fn graph_neighbors(&self, rank: i32) -> Result<Vec<i32>> {
        let neighbors = self.graph("graph_neighbors").and_then(|(index, edges)| {
            let node = usize::try_from(rank)
                .ok()
                .filter(|&n| n < index.len())
                .ok_or_else(|| {
                    Error::new(
                        ErrorClass::Rank,
                        format!("rank {rank} is not a node of this graph of {}", index.len()),
                    )
                })?;
            Ok(node_edges(index, edges, node).to_vec())
        });
        self.handled(neighbors)
    }

    /// The number of neighbours of node `rank` of the graph
    /// (`MPI_Graph_neighbors_count`).
    #[doc(alias = "MPI_Graph_neighbors_count")]
    pub fn graph_neighbors_count(&self, rank: i32) -> Result<i32> {
        self.graph_neighbors(rank).map(|n| n.len() as i32)
    }

    /// A communicator of the same processes with a distributed graph in
    /// which this process has edges from `sources` and to `destinations`
    /// (`MPI_Dist_graph_create_adjacent`), weighted by `source_weights`
    /// and `destination_weights` (one per edge, not negative) or not
    /// (`None`, `MPI_UNWEIGHTED`). Collective; each process gives its own
    /// edges, which must agree with the others'. A rank outside the
    /// communicator is an `MPI_ERR_RANK` error, weights that do not match
    /// the edges `MPI_ERR_ARG`.
    #[doc(alias = "MPI_Dist_graph_create_adjacent")]
    pub fn create_distributed_graph_adjacent(
        &self,
        sources: &[i32],
        source_weights: Option<&[i32]>,
        destinations: &[i32],
        destination_weights: Option<&[i32]>,
        reorder: bool,
    ) -> Result<Communicator> {
        let _ = reorder;
        let neighbors = DistributedGraphNeighbors {
            sources: sources.to_vec(),
            source_weights: source_weights.map(<[i32]>::to_vec),
            destinations: destinations.to_vec(),
            destination_weights: destination_weights.map(<[i32]>::to_vec),
        };
        self.handled(self.distributed_graph_create(neighbors))
    }

    fn distributed_graph_create(
        &self,
        neighbors: DistributedGraphNeighbors,
    ) -> Result<Communicator> {
        self.require_intra("a distributed graph topology")?;
        let sides = [
            ("source", &neighbors.sources, &neighbors.source_weights),
            (
                "destination",
                &neighbors.destinations,
                &neighbors.destination_weights,
            ),
        ];
        for (side, ranks, weights) in sides {
            if let Some(r) = ranks.iter().find(|&&r| !(0..self.size()).contains(&r)) {
                return Err(Error::new(
                    ErrorClass::Rank,
                    format!(
                        "{side} rank {r} is not in this communicator of {}",
                        self.size()
                    ),
                ));
            }
            if let Some(weights) = weights {
                if weights.len() != ranks.len() || weights.iter().any(|&w| w < 0) {
                    return Err(Error::new(
                        ErrorClass::Arg,
                        format!(
                            "{} {side} weights for {} {side}s: give one weight, not negative, per edge",
                            weights.len(),
                            ranks.len()
                        ),
                    ));
                }
            }
        }
        self.with_topology(
            i64::from(self.size()),
            "distributed graph",
            Topology::DistributedGraph(neighbors),
        )?
        .ok_or_else(|| {
            Error::new(
                ErrorClass::Intern,
                "a process is not in the distributed graph of its own communicator",
            )
        })
    }

    /// This process's edges in the distributed graph, or `MPI_ERR_TOPOLOGY`.
    fn distributed_graph(&self, what: &str) -> Result<&DistributedGraphNeighbors> {
        self.live()?;
        match self.topology_of() {
            Some(Topology::DistributedGraph(neighbors)) => Ok(neighbors),
            _ => Err(topology_error(what, "distributed graph")),
        }
    }

    /// The numbers of edges into and out of this process, and whether the
    /// graph is weighted (`MPI_Dist_graph_neighbors_count`).
    #[doc(alias = "MPI_Dist_graph_neighbors_count")]
    pub fn distributed_graph_neighbors_count(&self) -> Result<(usize, usize, bool)> {
        let counts = self
            .distributed_graph("distributed_graph_neighbors_count")
            .map(|n| {
                (
                    n.sources.len(),
                    n.destinations.len(),
                    n.source_weights.is_some() || n.destination_weights.is_some(),
                )
            });
        self.handled(counts)
    }

    /// This process's edges in the distributed graph
    /// (`MPI_Dist_graph_neighbors`).
    #[doc(alias = "MPI_Dist_graph_neighbors")]
    pub fn distributed_graph_neighbors(&self) -> Result<DistributedGraphNeighbors> {
        let neighbors = self
            .distributed_graph("distributed_graph_neighbors")
            .cloned();
        self.handled(neighbors)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dims_are_balanced_and_non_increasing() {
        let cases: [(i32, &[i32], &[i32]); 8] = [
            (12, &[0, 0], &[4, 3]),
            (16, &[0, 0, 0], &[4, 2, 2]),
            (36, &[0, 0], &[6, 6]),
            (7, &[0, 0], &[7, 1]),
            (6, &[0, 0, 0], &[3, 2, 1]),
            (24, &[0, 3, 0], &[4, 3, 2]),
            (1, &[0, 0], &[1, 1]),
            (8, &[2, 4], &[2, 4]),
        ];
        for (n, given, want) in cases {
            let mut dims = given.to_vec();
            dims_create(n, &mut dims).unwrap();
            assert_eq!(dims, want, "dims_create({n}, {given:?})");
        }
        assert_eq!(
            dims_create(10, &mut [3, 0]).unwrap_err().class(),
            ErrorClass::Dims
        );
        assert_eq!(
            dims_create(8, &mut [2, 2]).unwrap_err().class(),
            ErrorClass::Dims
        );
        assert_eq!(
            dims_create(8, &mut [-1, 0]).unwrap_err().class(),
            ErrorClass::Dims
        );
        assert_eq!(
            dims_create(0, &mut [0]).unwrap_err().class(),
            ErrorClass::Arg
        );
    }

    #[test]
    fn grid_ranks_and_coordinates_are_row_major_inverses() {
        let dims = [3, 2, 4];
        for rank in 0..24 {
            let coords = grid_coords(&dims, rank);
            assert_eq!(grid_rank(&dims, &coords), rank);
        }
        assert_eq!(grid_coords(&dims, 5), [0, 1, 1]);
        assert_eq!(grid_rank(&[], &[]), 0);
    }
}
