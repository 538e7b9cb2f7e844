//! The collective algorithms, over a [`Team`] and packed data: the API
//! (`collective/mod.rs`) checks the arguments and lays out the buffers;
//! these move and combine the bytes. Those that only move data
//! (broadcast, all-to-all, the all-gathers' exchanges) take it as
//! [`Pieces`] or [`Outbound`]/[`Inbound`] messages, so a buffer that is
//! not contiguous is sent and received a piece at a time, never packed
//! whole. Each follows MPICH's algorithm of
//! the same name (`schedule` picks one and gives its shape).
//!
//! Reductions keep rank order wherever the operation may not be
//! commutative: `combine_higher` puts the accumulated (lower ranks')
//! data first.

use super::op::Reduction;
use super::partition::{disjoint_blocks, uniform_blocks, BlockOwner};
use super::schedule::{
    all_gather_algorithm, binomial_node, broadcast_algorithm, broadcast_chunks, halving_steps,
    pairwise_partners, reduce_algorithm, split_evenly, subtree_span, tournament_partner,
    tournament_rounds, AllGatherAlgorithm, AllToAllAlgorithm, BroadcastAlgorithm, Fold,
    HalvingStep, ReduceAlgorithm, TreeNode, ALL_TO_ALL_THROTTLE, REDUCE_SHORT,
};
use super::team::{CollectiveTag, Scratch, Team};
use super::typed::{copy_across, segment_ranges, segment_step, Inbound, Outbound, Pieces};
use crate::{Error, ErrorClass, Result};
use std::ops::Range;

/// Dissemination barrier: in round `k` each process signals the one `2^k`
/// ahead and waits for the one `2^k` behind.
pub(crate) async fn barrier(t: &Team<'_>) -> Result<()> {
    let (n, r) = (t.size(), t.rank());
    let mut distance = 1;
    while distance < n {
        t.send_receive((r + distance) % n, &[], (r + n - distance) % n, &mut [])
            .await?;
        distance <<= 1;
    }
    Ok(())
}

/// Ranks counted from `root`, and back.
#[derive(Clone, Copy)]
struct Relative {
    root: usize,
    size: usize,
}

impl Relative {
    fn of(t: &Team<'_>, root: usize) -> Relative {
        Relative {
            root,
            size: t.size(),
        }
    }

    fn to_relative(self, rank: usize) -> usize {
        (rank + self.size - self.root) % self.size
    }

    fn to_rank(self, relative: usize) -> usize {
        (relative + self.root) % self.size
    }
}

/// Broadcast of `buf` (its packed data) from `root`.
///
/// With three processes or more the root's length chooses between the
/// binomial tree and scatter with all-gather, whose messages carry tags
/// of their own kinds; a non-root waits for whichever comes from its
/// parent: the data, down the tree, or the root's length (8 bytes, sent
/// right after the chunk of a scatter, so that the chunk is there, or
/// announced, once the length is: the scatter's receive then waits for
/// nothing more than the length's did). So every process goes the
/// root's way by the root's length, and one that passed another count
/// (an erroneous program) fails alone, with `MPI_ERR_TRUNCATE` where its
/// buffer is shorter and `MPI_ERR_COUNT` where it is longer, while it
/// still passes on the root's data as the others expect it: a scatter's
/// through a temporary buffer of the root's length (keeping what fits),
/// a tree's as it came (all of it where its buffer is longer; where it
/// is shorter, its subtree gets what it kept, and fails too).
pub(crate) async fn broadcast(t: &Team<'_>, root: usize, buf: &mut Pieces<'_>) -> Result<()> {
    let n = t.size();
    if n == 1 {
        return Ok(());
    }
    let rel = Relative::of(t, root);
    let node = binomial_node(rel.to_relative(t.rank()), n);
    let long = t.retagged(CollectiveTag::BroadcastLong);
    let len = match node.parent {
        None => buf.len(),
        Some(parent) => {
            let whole = buf.len();
            let mut word = [0u8; 8];
            let (down_the_tree, count) = t
                .receive_either(
                    rel.to_rank(parent),
                    buf.inbound(0..whole)?,
                    &long,
                    Inbound::Bytes(&mut word),
                )
                .await?;
            if down_the_tree {
                return binomial_sends(t, rel, &node.children, buf, count.min(whole)).await;
            }
            usize::try_from(u64::from_le_bytes(word)).map_err(|_| {
                Error::new(
                    ErrorClass::Count,
                    "the root broadcasts more bytes than this process can address",
                )
            })?
        }
    };
    let algorithm = broadcast_algorithm(len, n);
    if algorithm == BroadcastAlgorithm::Binomial {
        return binomial_sends(t, rel, &node.children, buf, len).await;
    }
    let chunks = t.retagged(CollectiveTag::Scatter);
    let outcome = if len == buf.len() {
        scatter_all_gather(&chunks, &long, rel, algorithm, buf).await
    } else {
        t.note_length(root, len, buf.len());
        let mut data = Scratch::zeroed(len);
        let data_pieces = &mut Pieces::Bytes(data.bytes_mut());
        scatter_all_gather(&chunks, &long, rel, algorithm, data_pieces)
            .await
            .and_then(|()| buf.write(0, &data.bytes()[..len.min(buf.len())]))
    };
    t.adopt_mismatch(chunks);
    t.adopt_mismatch(long);
    outcome
}

/// The first `len` bytes of `buf` to each of `children` (relative ranks).
async fn binomial_sends(
    t: &Team<'_>,
    rel: Relative,
    children: &[usize],
    buf: &Pieces<'_>,
    len: usize,
) -> Result<()> {
    let sends = children
        .iter()
        .map(|&child| Ok((rel.to_rank(child), buf.outbound(0..len)?)))
        .collect::<Result<_>>()?;
    t.exchange_data(sends, Vec::new()).await
}

/// Broadcast of `buf`, the root's length, by scatter down the binomial
/// tree (the chunks on `chunks`, each followed by the length on `long`)
/// and the all-gather of `algorithm` (on `long`).
async fn scatter_all_gather(
    chunks: &Team<'_>,
    long: &Team<'_>,
    rel: Relative,
    algorithm: BroadcastAlgorithm,
    buf: &mut Pieces<'_>,
) -> Result<()> {
    let bounds = broadcast_chunks(buf.len(), long.size());
    scatter_for_broadcast(chunks, long, rel, &bounds, buf).await?;
    if algorithm == BroadcastAlgorithm::ScatterDoubling {
        doubling_all_gather(long, rel, &bounds, buf).await
    } else {
        let blocks: Vec<Range<usize>> = bounds.windows(2).map(|w| w[0]..w[1]).collect();
        ring_all_gather(long, rel, &blocks, buf).await
    }
}

/// Scatters the chunks of a broadcast (bounds by relative rank) down the
/// binomial tree: each process receives the chunks of its subtree, in
/// place, on `chunks` (its parent sent the root's length, on `long`,
/// after them), and sends each child its subtree's chunks, then the
/// length, in one step.
async fn scatter_for_broadcast(
    chunks: &Team<'_>,
    long: &Team<'_>,
    rel: Relative,
    bounds: &[usize],
    buf: &mut Pieces<'_>,
) -> Result<()> {
    let n = chunks.size();
    let me = rel.to_relative(chunks.rank());
    let node = binomial_node(me, n);
    if let Some(parent) = node.parent {
        let recv = buf.inbound(bounds[me]..bounds[me + node.span])?;
        chunks
            .exchange_data(Vec::new(), vec![(rel.to_rank(parent), recv)])
            .await?;
    }
    let word = (buf.len() as u64).to_le_bytes();
    let mut sends = Vec::with_capacity(2 * node.children.len());
    for &child in &node.children {
        let (to, end) = (rel.to_rank(child), child + subtree_span(child, n));
        sends.push((chunks, to, buf.outbound(bounds[child]..bounds[end])?));
        sends.push((long, to, Outbound::Bytes(&word)));
    }
    chunks.exchange_kinds(sends, Vec::new()).await
}

/// Recursive-doubling all-gather in place over a power-of-two team:
/// blocks by relative rank with byte bounds `bounds` (`size + 1`
/// offsets, in relative order); each process holds its own block.
async fn doubling_all_gather(
    t: &Team<'_>,
    rel: Relative,
    bounds: &[usize],
    buf: &mut Pieces<'_>,
) -> Result<()> {
    let me = rel.to_relative(t.rank());
    let mut mask = 1;
    while mask < t.size() {
        let partner = me ^ mask;
        let (mine, theirs) = (me & !(mask - 1), partner & !(mask - 1));
        let (send, recv) = buf.read_and_write(
            bounds[mine]..bounds[mine + mask],
            bounds[theirs]..bounds[theirs + mask],
        )?;
        let peer = rel.to_rank(partner);
        t.exchange_data(vec![(peer, send)], vec![(peer, recv)])
            .await?;
        mask <<= 1;
    }
    Ok(())
}

/// Ring all-gather in place: `blocks` by relative rank; each process
/// holds its own block, and in `size - 1` steps passes on to the next one
/// the block it received last.
async fn ring_all_gather(
    t: &Team<'_>,
    rel: Relative,
    blocks: &[Range<usize>],
    buf: &mut Pieces<'_>,
) -> Result<()> {
    let n = t.size();
    let me = rel.to_relative(t.rank());
    let (right, left) = (rel.to_rank((me + 1) % n), rel.to_rank((me + n - 1) % n));
    for step in 0..n - 1 {
        let outgoing = (me + n - step) % n;
        let incoming = (me + n - step - 1) % n;
        let (send, recv) =
            buf.read_and_write(blocks[outgoing].clone(), blocks[incoming].clone())?;
        t.exchange_data(vec![(right, send)], vec![(left, recv)])
            .await?;
    }
    Ok(())
}

/// Bruck's all-gather of equal blocks into `recv` (`size` blocks by
/// rank): this process's own is `mine`, or already in place if `None`.
/// At the step of distance `d` (1, 2, 4, ...) each process sends the
/// blocks it holds from its own on (ranks `r`, `r + 1`, ..., as many as
/// it has, at most `size - d`) to `r - d` and receives as many, from
/// rank `r + d` on, from `r + d`, straight between the places of `recv`
/// where they belong: a run of blocks that wraps past the last rank goes
/// as two messages, which sender and receiver cut alike (at the last
/// rank), so no rotated copy of the whole is made, and data that is not
/// contiguous moves a piece at a time.
async fn bruck_all_gather(
    t: &Team<'_>,
    mine: Option<&Pieces<'_>>,
    recv: &mut Pieces<'_>,
) -> Result<()> {
    let (n, r) = (t.size(), t.rank());
    let b = recv.len() / n;
    if let Some(mine) = mine {
        copy_own(
            t,
            mine.outbound(0..mine.len())?,
            recv.inbound(r * b..(r + 1) * b)?,
        )?;
    }
    // The bytes of the blocks of ranks `first`, `first + 1`, ... (`count`
    // of them, modulo `n`) in `recv`: the runs that are not empty.
    let runs = |first: usize, count: usize| -> Vec<Range<usize>> {
        let end = first + count;
        [first * b..end.min(n) * b, 0..end.saturating_sub(n) * b]
            .into_iter()
            .filter(|run| !run.is_empty())
            .collect()
    };
    let mut distance = 1;
    while distance < n {
        let count = distance.min(n - distance);
        let (to, from) = ((r + n - distance) % n, (r + distance) % n);
        let (sends, recvs) = recv.read_and_write_runs(&runs(r, count), &runs(from, count))?;
        t.exchange_data(
            sends.into_iter().map(|data| (to, data)).collect(),
            recvs.into_iter().map(|room| (from, room)).collect(),
        )
        .await?;
        distance <<= 1;
    }
    Ok(())
}

/// All-gather of equal blocks: bytes `mine` from each process into
/// `recv` (`size` blocks by rank).
pub(crate) async fn all_gather(t: &Team<'_>, mine: &[u8], recv: &mut [u8]) -> Result<()> {
    all_gather_pieces(t, Some(&Pieces::Shared(mine)), &mut Pieces::Bytes(recv)).await
}

/// All-gather of equal blocks into `recv` (`size` blocks by rank): this
/// process's own is `mine`, or already in place if `None`. Data that is
/// not contiguous moves a piece at a time.
pub(crate) async fn all_gather_pieces(
    t: &Team<'_>,
    mine: Option<&Pieces<'_>>,
    recv: &mut Pieces<'_>,
) -> Result<()> {
    let (n, r) = (t.size(), t.rank());
    let b = recv.len() / n;
    let rel = Relative::of(t, 0);
    match all_gather_algorithm(recv.len(), n) {
        AllGatherAlgorithm::Bruck => bruck_all_gather(t, mine, recv).await,
        algorithm => {
            if let Some(mine) = mine {
                copy_own(
                    t,
                    mine.outbound(0..mine.len())?,
                    recv.inbound(r * b..(r + 1) * b)?,
                )?;
            }
            if algorithm == AllGatherAlgorithm::RecursiveDoubling {
                let bounds: Vec<usize> = (0..=n).map(|i| i * b).collect();
                doubling_all_gather(t, rel, &bounds, recv).await
            } else {
                ring_all_gather(t, rel, &uniform_blocks(n, b), recv).await
            }
        }
    }
}

/// All-gather of blocks of any lengths around a ring: `blocks` of
/// `recv` by rank (disjoint); this process's is `mine`, or already in
/// place if `None`.
pub(crate) async fn all_gather_varcount(
    t: &Team<'_>,
    mine: Option<&Pieces<'_>>,
    blocks: &[Range<usize>],
    recv: &mut Pieces<'_>,
) -> Result<()> {
    if let Some(mine) = mine {
        copy_own(
            t,
            mine.outbound(0..mine.len())?,
            recv.inbound(blocks[t.rank()].clone())?,
        )?;
    }
    ring_all_gather(t, Relative::of(t, 0), blocks, recv).await
}

/// Where a process of a binomial gather or scatter holds the blocks of
/// its subtree.
#[derive(Clone, Copy)]
enum Holding {
    /// The root: in its buffer, in rank order.
    Buffer,
    /// Any other process: in order of relative rank from its own
    /// (`from`), in its own buffer (a leaf, which holds one block) or in
    /// a relay buffer of its subtree's blocks (packed).
    Relative { from: usize },
}

impl Relative {
    /// The byte ranges in which `holding` holds the blocks (of `block`
    /// bytes) of relative ranks `span`, one for each message that carries
    /// them: a message per run of consecutive ranks (two where rank order
    /// comes round past the last rank), so that the root sends and
    /// receives in its buffer, in place.
    fn subtree_parts(
        self,
        span: Range<usize>,
        block: usize,
        holding: Holding,
    ) -> impl Iterator<Item = Range<usize>> {
        // The relative rank of rank 0.
        let wrap = self.size - self.root;
        let (first, second) = if span.start < wrap && wrap < span.end {
            (span.start..wrap, Some(wrap..span.end))
        } else {
            (span, None)
        };
        std::iter::once(first).chain(second).map(move |run| {
            let first = match holding {
                Holding::Buffer => self.to_rank(run.start),
                Holding::Relative { from } => run.start - from,
            };
            first * block..(first + run.len()) * block
        })
    }
}

/// A process's place in the binomial tree of a gather or scatter.
struct Place {
    rel: Relative,
    /// Its relative rank.
    me: usize,
    node: TreeNode,
}

impl Place {
    fn of(t: &Team<'_>, root: usize) -> Place {
        let rel = Relative::of(t, root);
        let me = rel.to_relative(t.rank());
        Place {
            rel,
            me,
            node: binomial_node(me, t.size()),
        }
    }

    /// How a process other than the root holds its subtree's blocks of
    /// `block` bytes (from its own), and the parts of them that go to or
    /// come from its parent, in order.
    fn toward_parent(&self, block: usize) -> (Holding, impl Iterator<Item = Range<usize>> + use<>) {
        let holding = Holding::Relative { from: self.me };
        let subtree = self.me..self.me + self.node.span;
        (holding, self.rel.subtree_parts(subtree, block, holding))
    }

    /// The part of `holding` that holds this process's own block (a
    /// single block never straddles the wrap).
    fn own_part(&self, block: usize, holding: Holding) -> Range<usize> {
        let start = match holding {
            Holding::Buffer => self.rel.to_rank(self.me) * block,
            Holding::Relative { from } => (self.me - from) * block,
        };
        start..start + block
    }

    /// The messages to or from the children, in order: each child's
    /// member, and the part of `holding` it carries.
    fn children_parts(
        &self,
        block: usize,
        holding: Holding,
    ) -> impl Iterator<Item = (usize, Range<usize>)> + '_ {
        let size = self.rel.size;
        self.node.children.iter().flat_map(move |&child| {
            let subtree = child..child + subtree_span(child, size);
            let member = self.rel.to_rank(child);
            self.rel
                .subtree_parts(subtree, block, holding)
                .map(move |part| (member, part))
        })
    }
}

/// The inbound data of `held` for each of `parts` (a member and its
/// part, disjoint by the tree's shape), in order. The common single part
/// (two processes, a leaf) takes no vectors but the result's.
fn inbound_parts<'a>(
    held: &'a mut Pieces<'_>,
    parts: impl Iterator<Item = (usize, Range<usize>)>,
) -> Result<Vec<(usize, Inbound<'a>)>> {
    let mut parts = parts.fuse();
    match (parts.next(), parts.next()) {
        (None, _) => Ok(Vec::new()),
        (Some((from, only)), None) => Ok(vec![(from, held.inbound(only)?)]),
        (Some(first), Some(second)) => {
            let (members, parts): (Vec<usize>, Vec<Range<usize>>) =
                [first, second].into_iter().chain(parts).unzip();
            let recvs =
                held.inbound_blocks(disjoint_blocks(held.len(), &parts, BlockOwner::Rank)?)?;
            Ok(members.into_iter().zip(recvs).collect())
        }
    }
}

/// One step that receives `parts` of `held` from member `from`, in order.
async fn receive_parts(
    t: &Team<'_>,
    from: usize,
    held: &mut Pieces<'_>,
    parts: impl Iterator<Item = Range<usize>>,
) -> Result<()> {
    let recvs = inbound_parts(held, parts.map(|part| (from, part)))?;
    t.exchange_data(Vec::new(), recvs).await
}

/// One step that sends `parts` of `held` to member `to`, in order.
async fn send_parts(
    t: &Team<'_>,
    to: usize,
    held: &Pieces<'_>,
    parts: impl Iterator<Item = Range<usize>>,
) -> Result<()> {
    let mut sends = Vec::with_capacity(2);
    for part in parts {
        sends.push((t, to, held.outbound(part)?));
    }
    t.exchange_kinds(sends, Vec::new()).await
}

/// The error of a process that lacks the buffer its part needs.
fn missing(what: &str) -> Error {
    Error::new(ErrorClass::Intern, format!("{what} has no buffer"))
}

/// Binomial gather of equal blocks to `root`: each process collects its
/// subtree's blocks and sends them to its parent; `recv` (at the root
/// only) gets `size` blocks by rank, and `mine` is this process's block
/// (`None` at a root whose own block is in place). The root receives
/// straight into its buffer and a leaf sends from its own; a process
/// between them relays its subtree's blocks through a buffer of them
/// (packed).
pub(crate) async fn gather(
    t: &Team<'_>,
    root: usize,
    mine: Option<&Pieces<'_>>,
    recv: Option<&mut Pieces<'_>>,
) -> Result<()> {
    let place = Place::of(t, root);
    let Some(parent) = place.node.parent else {
        let recv = recv.ok_or_else(|| missing("the root of a gather"))?;
        let block = recv.len() / t.size();
        return collect_subtree(t, &place, block, Holding::Buffer, mine, recv).await;
    };
    let mine = mine.ok_or_else(|| missing("a gather's process"))?;
    let (holding, parts) = place.toward_parent(mine.len());
    let parent = place.rel.to_rank(parent);
    if place.node.children.is_empty() {
        return send_parts(t, parent, mine, parts).await;
    }
    let mut relay = Scratch::zeroed(place.node.span * mine.len());
    let relay = &mut Pieces::Bytes(relay.bytes_mut());
    collect_subtree(t, &place, mine.len(), holding, Some(mine), relay).await?;
    send_parts(t, parent, relay, parts).await
}

/// The gathering step of a process of a binomial gather: `mine` (unless
/// `None`: in place) copied into its block of `held`, and its children's
/// subtrees received into theirs.
async fn collect_subtree(
    t: &Team<'_>,
    place: &Place,
    block: usize,
    holding: Holding,
    mine: Option<&Pieces<'_>>,
    held: &mut Pieces<'_>,
) -> Result<()> {
    if let Some(mine) = mine {
        let own = held.inbound(place.own_part(block, holding))?;
        copy_own(t, mine.outbound(0..mine.len())?, own)?;
    }
    // Apart from the own block by the tree's shape.
    let recvs = inbound_parts(held, place.children_parts(block, holding))?;
    t.exchange_data(Vec::new(), recvs).await
}

/// Binomial scatter of equal blocks from `root`: `send` (at the root
/// only) holds `size` blocks by rank; each process receives its
/// subtree's blocks from its parent and passes on its children's; `mine`
/// receives this process's block (`None` at a root that keeps its own in
/// place). The root sends straight from its buffer and a leaf receives
/// into its own; a process between them relays its subtree's blocks
/// through a buffer of them (packed).
pub(crate) async fn scatter(
    t: &Team<'_>,
    root: usize,
    send: Option<&Pieces<'_>>,
    mine: Option<&mut Pieces<'_>>,
) -> Result<()> {
    let place = Place::of(t, root);
    let Some(parent) = place.node.parent else {
        let send = send.ok_or_else(|| missing("the root of a scatter"))?;
        let block = send.len() / t.size();
        return hand_out_subtree(t, &place, block, Holding::Buffer, send, mine).await;
    };
    let mine = mine.ok_or_else(|| missing("a scatter's process"))?;
    let (holding, parts) = place.toward_parent(mine.len());
    let parent = place.rel.to_rank(parent);
    if place.node.children.is_empty() {
        return receive_parts(t, parent, mine, parts).await;
    }
    let mut relay = Scratch::zeroed(place.node.span * mine.len());
    let relay = &mut Pieces::Bytes(relay.bytes_mut());
    receive_parts(t, parent, relay, parts).await?;
    hand_out_subtree(t, &place, mine.len(), holding, relay, Some(mine)).await
}

/// The passing-on step of a process of a binomial scatter: its
/// children's subtrees sent from their blocks of `held`, then its own
/// block copied into `mine` (unless `None`: in place).
async fn hand_out_subtree(
    t: &Team<'_>,
    place: &Place,
    block: usize,
    holding: Holding,
    held: &Pieces<'_>,
    mine: Option<&mut Pieces<'_>>,
) -> Result<()> {
    let sends = place
        .children_parts(block, holding)
        .map(|(to, part)| Ok((t, to, held.outbound(part)?)))
        .collect::<Result<Vec<_>>>()?;
    t.exchange_kinds(sends, Vec::new()).await?;
    if let Some(mine) = mine {
        let own = held.outbound(place.own_part(block, holding))?;
        copy_own(t, own, mine.inbound(0..mine.len())?)?;
    }
    Ok(())
}

/// Gather of blocks of any lengths to `root`, straight from each process:
/// `recvs` (at the root only) are the blocks by rank, the root's own
/// filled from `mine` (unless `None`: in place).
pub(crate) async fn gather_varcount(
    t: &Team<'_>,
    root: usize,
    mine: Option<Outbound<'_>>,
    recvs: Option<Vec<Inbound<'_>>>,
) -> Result<()> {
    let Some(mut recvs) = recvs else {
        let mine = mine.ok_or_else(|| missing("a gather's process"))?;
        return t.exchange_data(vec![(root, mine)], Vec::new()).await;
    };
    let own = std::mem::take(&mut recvs[root]);
    if let Some(mine) = mine {
        copy_own(t, mine, own)?;
    }
    let posted = recvs
        .into_iter()
        .enumerate()
        .filter(|&(rank, _)| rank != root)
        .collect();
    t.exchange_data(Vec::new(), posted).await
}

/// Scatter of blocks of any lengths from `root`, straight to each
/// process: `sends` (at the root only) are the blocks by rank, the
/// root's own copied into `mine` (unless `None`: in place).
pub(crate) async fn scatter_varcount(
    t: &Team<'_>,
    root: usize,
    sends: Option<Vec<Outbound<'_>>>,
    mine: Option<Inbound<'_>>,
) -> Result<()> {
    let Some(mut sends) = sends else {
        let mine = mine.ok_or_else(|| missing("a scatter's process"))?;
        return t.exchange_data(Vec::new(), vec![(root, mine)]).await;
    };
    let own = std::mem::take(&mut sends[root]);
    let posted = sends
        .into_iter()
        .enumerate()
        .filter(|&(rank, _)| rank != root)
        .collect();
    t.exchange_data(posted, Vec::new()).await?;
    match mine {
        Some(mine) => copy_own(t, own, mine),
        None => Ok(()),
    }
}

/// A process's own block, copied from what it sends to what it
/// receives; different lengths are a mismatch, noted as one between
/// processes is (see [`Team::run`]).
fn copy_own(t: &Team<'_>, mut from: Outbound<'_>, mut to: Inbound<'_>) -> Result<()> {
    if from.len() != to.len() {
        t.note_mismatch(Error::new(
            ErrorClass::Count,
            format!(
                "this process sends itself {} bytes but expects {}",
                from.len(),
                to.len()
            ),
        ));
    }
    let len = from.len().min(to.len());
    copy_across(&mut from, &mut to, len)
}

/// All-to-all: `sends[i]` goes to rank `i` and `recvs[i]` comes from it
/// (this process's own copied).
pub(crate) async fn all_to_all(
    t: &Team<'_>,
    mut sends: Vec<Outbound<'_>>,
    mut recvs: Vec<Inbound<'_>>,
    algorithm: AllToAllAlgorithm,
) -> Result<()> {
    let (n, r) = (t.size(), t.rank());
    copy_own(
        t,
        std::mem::take(&mut sends[r]),
        std::mem::take(&mut recvs[r]),
    )?;
    let steps: Vec<usize> = (1..n).collect();
    let batch = match algorithm {
        AllToAllAlgorithm::Scattered => ALL_TO_ALL_THROTTLE,
        AllToAllAlgorithm::Pairwise => 1,
    };
    for batch in steps.chunks(batch) {
        let mut posted_sends = Vec::with_capacity(batch.len());
        let mut posted_recvs = Vec::with_capacity(batch.len());
        for &step in batch {
            let (from, to) = pairwise_partners(r, n, step);
            posted_sends.push((to, std::mem::take(&mut sends[to])));
            posted_recvs.push((from, std::mem::take(&mut recvs[from])));
        }
        t.exchange_data(posted_sends, posted_recvs).await?;
    }
    Ok(())
}

/// The most bytes an in-place all-to-all sends to one partner in one
/// message, and the room of its one temporary buffer.
pub(crate) const IN_PLACE_PIECE: usize = 1 << 20;

/// In-place all-to-all (`MPI_IN_PLACE`): block `i`, range `blocks[i].1`
/// of buffer `bufs[blocks[i].0]`, goes to rank `i` and is replaced by
/// what rank `i` sends. As MPICH's, each two processes exchange their
/// blocks in a round of their own (a round-robin tournament); the
/// exchange goes in pieces of [`IN_PLACE_PIECE`], each sent from the
/// buffer and received into one temporary piece before it is copied
/// over what was sent, so no more than a piece is held apart from the
/// buffers however long the blocks.
pub(crate) async fn all_to_all_in_place(
    t: &Team<'_>,
    bufs: &mut [Pieces<'_>],
    blocks: &[(usize, Range<usize>)],
) -> Result<()> {
    let (n, r) = (t.size(), t.rank());
    // Zeroed memory that only the pieces received touch.
    let mut piece = vec![0u8; IN_PLACE_PIECE];
    let buffers = bufs.len();
    for round in 0..tournament_rounds(n) {
        let Some(partner) = tournament_partner(r, n, round) else {
            continue;
        };
        let (buf, block) = &blocks[partner];
        let buf = bufs.get_mut(*buf).ok_or_else(|| {
            Error::new(
                ErrorClass::Intern,
                format!("the block for rank {partner} lies in buffer {buf} of {buffers}"),
            )
        })?;
        exchange_in_place(t, partner, buf, block.clone(), &mut piece).await?;
    }
    Ok(())
}

/// Exchanges `block` of `buf` with `partner`'s block for this process,
/// piece by piece: a message of a whole `piece` says that another
/// follows (perhaps empty), a shorter one is the last. So each side
/// learns where the other's data ends from the messages alone, and a
/// partner whose block has another length (the processes passed
/// different counts) is noted, not waited for: what fits is kept.
async fn exchange_in_place(
    t: &Team<'_>,
    partner: usize,
    buf: &mut Pieces<'_>,
    block: Range<usize>,
    piece: &mut [u8],
) -> Result<()> {
    let whole = piece.len();
    // Offsets in the block of the next piece to send and to receive;
    // `None` once the last has gone or come.
    let (mut sending, mut receiving) = (Some(0), Some(0));
    let mut received_in_all = 0;
    while sending.is_some() || receiving.is_some() {
        let sent = sending.map(|at: usize| at..(at + whole).min(block.len()));
        let received = {
            let sends = match &sent {
                Some(part) => {
                    let range = block.start + part.start..block.start + part.end;
                    vec![(partner, buf.outbound(range)?)]
                }
                None => Vec::new(),
            };
            let recvs = match receiving {
                Some(_) => vec![(partner, Inbound::Bytes(&mut *piece))],
                None => Vec::new(),
            };
            t.exchange_up_to(sends, recvs).await?
        };
        if let Some(part) = sent {
            sending = (part.len() == whole).then_some(part.end);
        }
        if let (Some(at), Some(&len)) = (receiving, received.first()) {
            // Bytes beyond the block are a mismatch, noted below.
            let kept = len.min(block.len().saturating_sub(at));
            buf.write(block.start + at, &piece[..kept])?;
            received_in_all += len;
            receiving = (len == whole).then_some(at + len);
        }
    }
    t.note_length(partner, received_in_all, block.len());
    Ok(())
}

/// The most bytes of a reduction that go through one run of its
/// algorithm by messages: longer data is reduced a segment at a time, so
/// that data that is not contiguous needs no more than a segment's
/// scratch (contiguous data is reduced where it lies).
pub(crate) const REDUCTION_SEGMENT: usize = 1 << 20;

/// `acc = acc op higher`, where `higher` holds data of higher ranks
/// (clobbered).
fn combine_higher(red: &Reduction<'_>, acc: &mut [u8], higher: &mut [u8]) -> Result<()> {
    if red.is_commutative() {
        red.apply(higher, acc)
    } else {
        red.apply(acc, higher)?;
        acc.copy_from_slice(higher);
        Ok(())
    }
}

/// The length of a message of [`Lengths`]: longer than any reduction
/// that goes without agreeing on its length ([`REDUCE_SHORT`]), so that a
/// process whose data is that short, and which takes such a message for
/// data in the same step of its algorithm, always finds it too long.
const AGREEMENT: usize = REDUCE_SHORT + 16;

/// The least and most bytes of reduction data among the processes a
/// process has heard of: carried in messages of [`AGREEMENT`] bytes by
/// the processes whose data is longer than [`REDUCE_SHORT`] before they
/// reduce it (`agree_*`), where counts are checked (`OXMPI_CHECK_COUNTS=1`,
/// [`super::CHECK_COUNTS_ENV`]), so that processes that passed different counts
/// never go on to different algorithms or numbers of segments, where one
/// would wait for ever for messages the other never sends.
///
/// A process whose data is that short runs its algorithm at once: its
/// steps meet those of the agreement (same partners, same tag), its data
/// arrives where an agreement message is expected, shorter, and stands
/// for its length; an agreement message arrives where it expects data,
/// longer, and is noted as a mismatch.
#[derive(Clone, Copy)]
struct Lengths {
    least: usize,
    most: usize,
}

impl Lengths {
    fn of(len: usize) -> Lengths {
        Lengths {
            least: len,
            most: len,
        }
    }

    /// The message that carries these lengths.
    fn message(self) -> Scratch {
        let mut message = Scratch::zeroed(AGREEMENT);
        let bytes = message.bytes_mut();
        bytes[..8].copy_from_slice(&(self.least as u64).to_le_bytes());
        bytes[8..16].copy_from_slice(&(self.most as u64).to_le_bytes());
        message
    }

    /// The lengths a message carries (its first 16 bytes).
    fn read(message: &[u8]) -> Lengths {
        let word = |at: usize| {
            let mut bytes = [0; 8];
            bytes.copy_from_slice(&message[at..at + 8]);
            u64::from_le_bytes(bytes) as usize
        };
        Lengths {
            least: word(0),
            most: word(8),
        }
    }

    /// Takes in `other`'s lengths.
    fn merge(&mut self, other: Lengths) {
        self.least = self.least.min(other.least);
        self.most = self.most.max(other.most);
    }

    /// Takes in a message of `received` bytes in `message`: an agreement
    /// message's lengths, or the data of a process that reduces without
    /// agreeing, whose length is its own.
    fn merge_message(&mut self, message: &Scratch, received: usize) {
        self.merge(if received == AGREEMENT {
            Lengths::read(message.bytes())
        } else {
            Lengths::of(received)
        });
    }

    /// `MPI_ERR_COUNT` unless every process heard of has `len` bytes.
    fn verdict(self, t: &Team<'_>, len: usize) -> Result<()> {
        if self.least == len && self.most == len {
            return Ok(());
        }
        let other = if self.least == len {
            self.most
        } else {
            self.least
        };
        Err(Error::new(
            ErrorClass::Count,
            format!(
                "{}: this rank passed {len} bytes of data where another passed {other}: \
                 the processes passed different counts",
                t.collective()
            ),
        ))
    }
}

/// One step of an agreement: sends `lengths` to `to` (if any) while
/// receiving from `from` (if any) and merging what comes.
async fn agreement_step(
    t: &Team<'_>,
    lengths: &mut Lengths,
    to: Option<usize>,
    from: Option<usize>,
) -> Result<()> {
    let outgoing = lengths.message();
    let mut incoming = Scratch::zeroed(AGREEMENT);
    let sends = to
        .map(|to| (to, outgoing.bytes().into()))
        .into_iter()
        .collect();
    let recvs = from
        .map(|from| (from, incoming.bytes_mut().into()))
        .into_iter()
        .collect();
    let received = t.exchange_up_to(sends, recvs).await?;
    if let Some(&received) = received.first() {
        lengths.merge_message(&incoming, received);
    }
    Ok(())
}

/// Agreement on the length of an all-reduce's data (`len` bytes, more
/// than [`REDUCE_SHORT`]) before it is reduced: the messages of
/// [`Lengths`] go by the steps of [`all_reduce`]'s recursive doubling
/// (fold, exchanges, fold back), which every process's data shorter than
/// that takes, so that either kind of process meets the other. Each
/// process ends with the least and most lengths of all (where none is
/// short), or one that differs from its own: an `MPI_ERR_COUNT` error at
/// every process whose data is long, before any of it is sent.
pub(crate) async fn agree_all_reduce_length(t: &Team<'_>, len: usize) -> Result<()> {
    let r = t.rank();
    let fold = Fold::new(t.size());
    let mut lengths = Lengths::of(len);
    let new_rank = fold.new_rank(r);
    let folded = r < 2 * fold.rem;
    if folded {
        match new_rank {
            None => agreement_step(t, &mut lengths, Some(r + 1), None).await?,
            Some(_) => agreement_step(t, &mut lengths, None, Some(r - 1)).await?,
        }
    }
    if let Some(new_rank) = new_rank {
        let mut mask = 1;
        while mask < fold.pof2 {
            let peer = fold.rank_of(new_rank ^ mask);
            agreement_step(t, &mut lengths, Some(peer), Some(peer)).await?;
            mask <<= 1;
        }
    }
    if folded {
        match new_rank {
            None => agreement_step(t, &mut lengths, None, Some(r + 1)).await?,
            Some(_) => agreement_step(t, &mut lengths, Some(r - 1), None).await?,
        }
    }
    lengths.verdict(t, len)
}

/// Agreement on the length of a reduce's data (`len` bytes, more than
/// [`REDUCE_SHORT`]) before it is reduced: the messages of [`Lengths`]
/// go up [`binomial_reduce`]'s tree (which every process's data shorter
/// than that takes) to `root`, and `root`'s verdict (16 bytes, short
/// enough to go eagerly, so that a process that waits for no verdict
/// holds up none) comes back down it. Every process whose data is long
/// fails with `MPI_ERR_COUNT` where the lengths differ, before any data
/// is sent; one whose parent's data is short waits for a verdict that
/// does not come, but that parent fails (it finds an agreement message
/// too long for its data).
pub(crate) async fn agree_reduce_length(
    t: &Team<'_>,
    root: usize,
    commutative: bool,
    len: usize,
) -> Result<()> {
    let (n, r) = (t.size(), t.rank());
    let tree_root = if commutative { root } else { 0 };
    let rel = Relative::of(t, tree_root);
    let me = rel.to_relative(r);
    let mut lengths = Lengths::of(len);
    let mut parent = None;
    let mut children = Vec::new();
    let mut mask = 1;
    while mask < n {
        if me & mask != 0 {
            let to = rel.to_rank(me & !mask);
            agreement_step(t, &mut lengths, Some(to), None).await?;
            parent = Some(to);
            break;
        }
        let child = rel.to_rank(me | mask);
        if me | mask < n {
            agreement_step(t, &mut lengths, None, Some(child)).await?;
            children.push(child);
        }
        mask <<= 1;
    }
    if tree_root != root {
        if r == tree_root {
            agreement_step(t, &mut lengths, Some(root), None).await?;
            parent = Some(root);
        } else if r == root {
            agreement_step(t, &mut lengths, None, Some(tree_root)).await?;
            // The root's word is final: its tree parent sends it none.
            parent = None;
            children.push(tree_root);
        }
    }
    // The verdict, down the same edges.
    if let Some(parent) = parent {
        let mut verdict = [0u8; 16];
        t.receive(parent, &mut verdict).await?;
        lengths.merge(Lengths::read(&verdict));
    }
    let verdict = lengths.message();
    for &child in children.iter().rev().filter(|&&child| child != root) {
        t.send(child, &verdict.bytes()[..16]).await?;
    }
    lengths.verdict(t, len)
}

/// Reduction to `root`: `acc` holds this process's data, and at the root
/// ends with the result (elsewhere it is clobbered).
pub(crate) async fn reduce(
    t: &Team<'_>,
    root: usize,
    acc: &mut [u8],
    red: &Reduction<'_>,
) -> Result<()> {
    if t.size() == 1 {
        return Ok(());
    }
    let count = acc.len() / red.unit_size();
    match reduce_algorithm(acc.len(), count, t.size(), red.is_commutative()) {
        ReduceAlgorithm::Short => binomial_reduce(t, root, acc, red).await,
        ReduceAlgorithm::Rabenseifner => rabenseifner_reduce(t, root, acc, red).await,
    }
}

/// Up a binomial tree: each process combines its children's results into
/// its own and sends that to its parent. A non-commutative operation is
/// reduced to rank 0, where ranks and relative ranks agree so each
/// subtree is a run of consecutive ranks, and then sent to the root.
async fn binomial_reduce(
    t: &Team<'_>,
    root: usize,
    acc: &mut [u8],
    red: &Reduction<'_>,
) -> Result<()> {
    let (n, r) = (t.size(), t.rank());
    let tree_root = if red.is_commutative() { root } else { 0 };
    let rel = Relative::of(t, tree_root);
    let me = rel.to_relative(r);
    let mut incoming = Scratch::zeroed(acc.len());
    let mut mask = 1;
    while mask < n {
        if me & mask != 0 {
            t.send(rel.to_rank(me & !mask), acc).await?;
            break;
        }
        let child = me | mask;
        if child < n {
            t.receive(rel.to_rank(child), incoming.bytes_mut()).await?;
            combine_higher(red, acc, incoming.bytes_mut())?;
        }
        mask <<= 1;
    }
    if tree_root != root {
        if r == tree_root {
            t.send(root, acc).await?;
        } else if r == root {
            t.receive(tree_root, acc).await?;
        }
    }
    Ok(())
}

/// The first half of the fold (see [`Fold`]): the even processes below
/// `2 * rem` send their data to the next one, which combines it (lower
/// ranks first). The new rank, or `None` for a process that handed its
/// data on.
async fn fold_in(
    t: &Team<'_>,
    fold: &Fold,
    acc: &mut [u8],
    incoming: &mut Scratch,
    red: &Reduction<'_>,
) -> Result<Option<usize>> {
    let r = t.rank();
    let new_rank = fold.new_rank(r);
    if r < 2 * fold.rem {
        if new_rank.is_none() {
            t.send(r + 1, acc).await?;
        } else {
            t.receive(r - 1, incoming.bytes_mut()).await?;
            red.apply(incoming.bytes(), acc)?;
        }
    }
    Ok(new_rank)
}

/// The second half of the fold: the result back to the processes that
/// handed their data on.
async fn fold_out(t: &Team<'_>, fold: &Fold, acc: &mut [u8]) -> Result<()> {
    let r = t.rank();
    if r < 2 * fold.rem {
        if fold.new_rank(r).is_none() {
            t.receive(r + 1, acc).await?;
        } else {
            t.send(r - 1, acc).await?;
        }
    }
    Ok(())
}

/// Byte range of the blocks `blocks` (by block bounds in elements).
fn block_bytes(bounds: &[usize], blocks: &Range<usize>, element: usize) -> Range<usize> {
    bounds[blocks.start] * element..bounds[blocks.end] * element
}

/// Reduce-scatter by recursive halving (commutative operations): after
/// it, each block of `acc` that `steps` keep last holds the reduction of
/// everyone's.
async fn halving_reduce_scatter(
    t: &Team<'_>,
    fold: &Fold,
    steps: &[HalvingStep],
    bounds: &[usize],
    acc: &mut [u8],
    incoming: &mut Scratch,
    red: &Reduction<'_>,
) -> Result<()> {
    let element = red.unit_size();
    for step in steps {
        let peer = fold.rank_of(step.partner);
        let keep = block_bytes(bounds, &step.keep, element);
        let give = block_bytes(bounds, &step.give, element);
        t.send_receive(
            peer,
            &acc[give],
            peer,
            &mut incoming.bytes_mut()[keep.clone()],
        )
        .await?;
        red.apply(&incoming.bytes()[keep.clone()], &mut acc[keep])?;
    }
    Ok(())
}

/// Rabenseifner's reduction to `root`: fold, reduce-scatter by recursive
/// halving, then gather the blocks by the halving steps run backwards
/// towards the process that holds the root's data.
async fn rabenseifner_reduce(
    t: &Team<'_>,
    root: usize,
    acc: &mut [u8],
    red: &Reduction<'_>,
) -> Result<()> {
    let r = t.rank();
    let fold = Fold::new(t.size());
    let mut incoming = Scratch::zeroed(acc.len());
    let new_root = fold.new_rank_holding(root);
    if let Some(new_rank) = fold_in(t, &fold, acc, &mut incoming, red).await? {
        let bounds = split_evenly(acc.len() / red.unit_size(), fold.pof2);
        let steps = halving_steps(new_rank, fold.pof2);
        halving_reduce_scatter(t, &fold, &steps, &bounds, acc, &mut incoming, red).await?;
        let element = red.unit_size();
        for step in steps.iter().rev() {
            let peer = fold.rank_of(step.partner);
            let mask = new_rank ^ step.partner;
            if (new_rank ^ new_root) & mask == 0 {
                t.receive(peer, &mut acc[block_bytes(&bounds, &step.give, element)])
                    .await?;
            } else {
                t.send(peer, &acc[block_bytes(&bounds, &step.keep, element)])
                    .await?;
                break;
            }
        }
    }
    let holder = fold.rank_of(new_root);
    if holder != root {
        if r == holder {
            t.send(root, acc).await?;
        } else if r == root {
            t.receive(holder, acc).await?;
        }
    }
    Ok(())
}

/// Reduction to every process: `acc` holds this process's data and ends
/// with the result.
pub(crate) async fn all_reduce(t: &Team<'_>, acc: &mut [u8], red: &Reduction<'_>) -> Result<()> {
    if t.size() == 1 {
        return Ok(());
    }
    let fold = Fold::new(t.size());
    let mut incoming = Scratch::zeroed(acc.len());
    let count = acc.len() / red.unit_size();
    let algorithm = reduce_algorithm(acc.len(), count, t.size(), red.is_commutative());
    if let Some(new_rank) = fold_in(t, &fold, acc, &mut incoming, red).await? {
        match algorithm {
            ReduceAlgorithm::Short => {
                doubling_all_reduce(t, &fold, new_rank, acc, &mut incoming, red).await?
            }
            ReduceAlgorithm::Rabenseifner => {
                let bounds = split_evenly(count, fold.pof2);
                let steps = halving_steps(new_rank, fold.pof2);
                halving_reduce_scatter(t, &fold, &steps, &bounds, acc, &mut incoming, red).await?;
                let element = red.unit_size();
                let mut result = Pieces::Bytes(&mut *acc);
                for step in steps.iter().rev() {
                    let peer = fold.rank_of(step.partner);
                    let (send, recv) = result.read_and_write(
                        block_bytes(&bounds, &step.keep, element),
                        block_bytes(&bounds, &step.give, element),
                    )?;
                    t.exchange_data(vec![(peer, send)], vec![(peer, recv)])
                        .await?;
                }
            }
        }
    }
    fold_out(t, &fold, acc).await
}

/// Recursive doubling among the folded processes: whole vectors with
/// partners that differ in one bit more at each step.
async fn doubling_all_reduce(
    t: &Team<'_>,
    fold: &Fold,
    new_rank: usize,
    acc: &mut [u8],
    incoming: &mut Scratch,
    red: &Reduction<'_>,
) -> Result<()> {
    let r = t.rank();
    let mut mask = 1;
    while mask < fold.pof2 {
        let peer = fold.rank_of(new_rank ^ mask);
        t.send_receive(peer, acc, peer, incoming.bytes_mut())
            .await?;
        if peer < r {
            red.apply(incoming.bytes(), acc)?;
        } else {
            combine_higher(red, acc, incoming.bytes_mut())?;
        }
        mask <<= 1;
    }
    Ok(())
}

/// Reduce-scatter: `input` holds this process's contribution to every
/// block (`blocks` by rank), or `out` does (`None`: in place, and this
/// rank's block of the result goes to its start); `out` gets the
/// reduction of this rank's block. Never more than a segment
/// ([`REDUCTION_SEGMENT`]) of the data at once, and the input's own
/// bytes, or windows of its packed data, are sent as they lie.
///
/// A commutative operation goes pairwise (each process receives
/// everyone's contribution to its block), in rounds of a chunk of each
/// block (the last of the longest block short, perhaps empty, so that a
/// process whose blocks are shorter than another's sees it at the latest
/// there); another is reduced to rank 0 in rank order and scattered from
/// there, a segment of the input at a time (the last short).
pub(crate) async fn reduce_scatter<'p>(
    t: &Team<'_>,
    mut input: Option<&mut Pieces<'p>>,
    blocks: &[Range<usize>],
    out: &mut Pieces<'p>,
    red: &Reduction<'_>,
) -> Result<()> {
    let r = t.rank();
    let unit = red.unit_size();
    let mine = blocks[r].clone();
    let mut scratch = Scratch::zeroed(0);
    if red.is_commutative() {
        let step = segment_step(REDUCTION_SEGMENT, unit);
        let longest = blocks.iter().map(|b| b.len()).max().unwrap_or(0);
        let mut incoming = Scratch::zeroed(step.min(mine.len()));
        for round in 0..longest / step + 1 {
            let chunk = |b: &Range<usize>| {
                let start = (b.start + round * step).min(b.end);
                start..(start + step).min(b.end)
            };
            let chunks: Vec<Range<usize>> = blocks.iter().map(chunk).collect();
            let at = chunks[r].start - mine.start..chunks[r].end - mine.start;
            match (input.as_deref_mut(), out.bytes_mut()) {
                (Some(input), Some(bytes)) => {
                    let acc = &mut bytes[at];
                    input.read(chunks[r].start, acc)?;
                    pairwise_round(t, input, &chunks, acc, &mut incoming, red).await?;
                }
                (input, _) => {
                    let source = input.unwrap_or(&mut *out);
                    let acc = grown(&mut scratch, at.len());
                    source.read(chunks[r].start, acc)?;
                    pairwise_round(t, source, &chunks, acc, &mut incoming, red).await?;
                    out.write(at.start, acc)?;
                }
            }
        }
        return Ok(());
    }
    reduce_scatter_from_rank_0(t, input, blocks, out, unit, async |acc| {
        binomial_reduce(t, 0, acc, red).await
    })
    .await
}

/// A reduce-scatter a segment of the input at a time (the last short):
/// each segment of `input` (`None`: `out`'s data, in place) is read into
/// a scratch of one segment, which `reduce_to_0` leaves at rank 0 as the
/// segment's result, and rank 0 scatters the segment's parts of `blocks`
/// (by rank), each into its place in its rank's `out`. In place, a
/// segment's parts are written over input that this or earlier segments
/// have read.
pub(crate) async fn reduce_scatter_from_rank_0<'p>(
    t: &Team<'_>,
    mut input: Option<&mut Pieces<'p>>,
    blocks: &[Range<usize>],
    out: &mut Pieces<'p>,
    unit: usize,
    mut reduce_to_0: impl AsyncFnMut(&mut [u8]) -> Result<()>,
) -> Result<()> {
    let r = t.rank();
    let mine = blocks[r].clone();
    let mut scratch = Scratch::zeroed(0);
    let total = blocks.last().map_or(0, |b| b.end);
    for segment in segment_ranges(total, REDUCTION_SEGMENT, unit, true) {
        let acc = grown(&mut scratch, segment.len());
        input
            .as_deref_mut()
            .unwrap_or(&mut *out)
            .read(segment.start, acc)?;
        reduce_to_0(acc).await?;
        let part = |b: &Range<usize>| {
            let start = b.start.clamp(segment.start, segment.end);
            start..b.end.clamp(start, segment.end)
        };
        let sends = blocks
            .iter()
            .map(|b| {
                let p = part(b);
                acc[p.start - segment.start..p.end - segment.start].into()
            })
            .collect();
        let my_part = part(&mine);
        // Where this rank's part goes in its block (at its end where the
        // block lies before this segment, at its start where after).
        let at = (my_part.start.max(mine.start) - mine.start).min(mine.len());
        let room = out.inbound(at..at + my_part.len())?;
        scatter_varcount(t, 0, (r == 0).then_some(sends), Some(room)).await?;
    }
    Ok(())
}

/// One round of the pairwise reduce-scatter: this process sends each
/// other its chunk (`chunks` by rank) of `source` and combines into
/// `acc` each other's contribution to its own chunk.
async fn pairwise_round(
    t: &Team<'_>,
    source: &Pieces<'_>,
    chunks: &[Range<usize>],
    acc: &mut [u8],
    incoming: &mut Scratch,
    red: &Reduction<'_>,
) -> Result<()> {
    let (n, r) = (t.size(), t.rank());
    for step in 1..n {
        let (from, to) = ((r + n - step) % n, (r + step) % n);
        let room = &mut incoming.bytes_mut()[..acc.len()];
        t.exchange_data(
            vec![(to, source.outbound(chunks[to].clone())?)],
            vec![(from, room.into())],
        )
        .await?;
        red.apply(&incoming.bytes()[..acc.len()], acc)?;
    }
    Ok(())
}

/// The first `len` bytes of `scratch`, grown to hold them.
fn grown(scratch: &mut Scratch, len: usize) -> &mut [u8] {
    if scratch.bytes().len() < len {
        *scratch = Scratch::zeroed(len);
    }
    &mut scratch.bytes_mut()[..len]
}

/// Inclusive scan by recursive doubling: `acc` holds this process's data
/// and ends with the reduction of ranks `0..=rank`.
pub(crate) async fn scan(t: &Team<'_>, acc: &mut [u8], red: &Reduction<'_>) -> Result<()> {
    let (n, r) = (t.size(), t.rank());
    // The reduction of the run of ranks this process has heard of so far.
    let mut partial = Scratch::copy_of(acc);
    let mut incoming = Scratch::zeroed(acc.len());
    let mut mask = 1;
    while mask < n {
        let peer = r ^ mask;
        if peer < n {
            t.send_receive(peer, partial.bytes(), peer, incoming.bytes_mut())
                .await?;
            if peer < r {
                red.apply(incoming.bytes(), partial.bytes_mut())?;
                red.apply(incoming.bytes(), acc)?;
            } else {
                combine_higher(red, partial.bytes_mut(), incoming.bytes_mut())?;
            }
        }
        mask <<= 1;
    }
    Ok(())
}

/// Exclusive scan by recursive doubling: `acc` holds this process's
/// data and ends with the reduction of ranks `0..rank`; rank 0's is left
/// as it is.
pub(crate) async fn exclusive_scan(
    t: &Team<'_>,
    acc: &mut [u8],
    red: &Reduction<'_>,
) -> Result<()> {
    let (n, r) = (t.size(), t.rank());
    // The reduction of the run of ranks this process has heard of so far,
    // its own data included.
    let mut partial = Scratch::copy_of(acc);
    let mut incoming = Scratch::zeroed(acc.len());
    let mut have_lower = false;
    let mut mask = 1;
    while mask < n {
        let peer = r ^ mask;
        if peer < n {
            t.send_receive(peer, partial.bytes(), peer, incoming.bytes_mut())
                .await?;
            if peer < r {
                red.apply(incoming.bytes(), partial.bytes_mut())?;
                if have_lower {
                    red.apply(incoming.bytes(), acc)?;
                } else {
                    acc.copy_from_slice(incoming.bytes());
                    have_lower = true;
                }
            } else {
                combine_higher(red, partial.bytes_mut(), incoming.bytes_mut())?;
            }
        }
        mask <<= 1;
    }
    Ok(())
}
