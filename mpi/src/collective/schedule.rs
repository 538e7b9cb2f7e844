//! The pure parts of the algorithms: which algorithm a collective uses for
//! a size and a number of processes (MPICH's choices and thresholds), and
//! the shapes the algorithms follow (binomial trees, the fold of a
//! non-power-of-two team into a power of two, recursive halving). No
//! message is sent here; `algorithms` walks these schedules.

use std::ops::Range;

/// Broadcasts below this many bytes go down a binomial tree (MPICH's
/// `MPIR_CVAR_BCAST_SHORT_MSG_SIZE`).
const BROADCAST_SHORT: usize = 12 * 1024;
/// Broadcasts below this many bytes to a power-of-two team finish with a
/// recursive-doubling all-gather, longer ones with a ring
/// (`MPIR_CVAR_BCAST_LONG_MSG_SIZE`).
const BROADCAST_LONG: usize = 512 * 1024;
/// Teams smaller than this always broadcast down the binomial tree. MPICH
/// says 8 (`MPIR_CVAR_BCAST_MIN_PROCS`); with two processes scatter and
/// all-gather only add a step, from three on they halve what the root
/// sends, so oxmpi switches there.
const BROADCAST_MIN_PROCESSES: usize = 3;
/// Reductions of more bytes than this use Rabenseifner's algorithm
/// (`MPIR_CVAR_REDUCE_SHORT_MSG_SIZE`, `MPIR_CVAR_ALLREDUCE_SHORT_MSG_SIZE`);
/// only they agree on their length first, where counts are checked
/// (`OXMPI_CHECK_COUNTS=1`, `algorithms::agree_all_reduce_length`).
pub(crate) const REDUCE_SHORT: usize = 2048;
/// All-gathers of fewer bytes in all than this use Bruck's algorithm on
/// non-power-of-two teams (`MPIR_CVAR_ALLGATHER_SHORT_MSG_SIZE`).
const ALL_GATHER_SHORT: usize = 80 * 1024;
/// All-gathers of fewer bytes in all than this use recursive doubling on
/// power-of-two teams (`MPIR_CVAR_ALLGATHER_LONG_MSG_SIZE`).
const ALL_GATHER_LONG: usize = 512 * 1024;
/// All-to-alls with blocks of at least this many bytes exchange with one
/// partner at a time (`MPIR_CVAR_ALLTOALL_MEDIUM_MSG_SIZE`).
const ALL_TO_ALL_MEDIUM: usize = 32 * 1024;
/// An all-to-all of smaller blocks has messages to and from this many
/// partners under way at once (`MPIR_CVAR_ALLTOALL_THROTTLE`).
pub(crate) const ALL_TO_ALL_THROTTLE: usize = 32;

/// How a broadcast goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BroadcastAlgorithm {
    /// Down a binomial tree, the whole message at each step.
    Binomial,
    /// Scatter down the binomial tree, then a recursive-doubling
    /// all-gather (power-of-two teams).
    ScatterDoubling,
    /// Scatter down the binomial tree, then a ring all-gather.
    ScatterRing,
}

/// The broadcast of `bytes` to `size` processes.
pub(crate) fn broadcast_algorithm(bytes: usize, size: usize) -> BroadcastAlgorithm {
    if bytes < BROADCAST_SHORT || size < BROADCAST_MIN_PROCESSES {
        BroadcastAlgorithm::Binomial
    } else if bytes < BROADCAST_LONG && size.is_power_of_two() {
        BroadcastAlgorithm::ScatterDoubling
    } else {
        BroadcastAlgorithm::ScatterRing
    }
}

/// How a reduction to one root, or to all, goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReduceAlgorithm {
    /// Whole vectors: up a binomial tree (reduce), or exchanged by
    /// recursive doubling (all-reduce).
    Short,
    /// Rabenseifner's: reduce-scatter by recursive halving, then a gather
    /// (reduce) or all-gather (all-reduce) by recursive doubling.
    Rabenseifner,
}

/// The reduction of `count` elements of `bytes` bytes in all over `size`
/// processes. Rabenseifner's algorithm splits the vector between the
/// processes, so it needs a commutative operation and at least one
/// element per process of the power of two.
pub(crate) fn reduce_algorithm(
    bytes: usize,
    count: usize,
    size: usize,
    commutative: bool,
) -> ReduceAlgorithm {
    if commutative && bytes > REDUCE_SHORT && count >= Fold::new(size).pof2 {
        ReduceAlgorithm::Rabenseifner
    } else {
        ReduceAlgorithm::Short
    }
}

/// How an all-gather of equal blocks goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AllGatherAlgorithm {
    /// Recursive doubling (power-of-two teams).
    RecursiveDoubling,
    /// Bruck's algorithm: `ceil(log2 size)` steps on any team.
    Bruck,
    /// Around a ring in `size - 1` steps.
    Ring,
}

/// The all-gather of `total` bytes in all over `size` processes.
pub(crate) fn all_gather_algorithm(total: usize, size: usize) -> AllGatherAlgorithm {
    if total < ALL_GATHER_LONG && size.is_power_of_two() {
        AllGatherAlgorithm::RecursiveDoubling
    } else if total < ALL_GATHER_SHORT {
        AllGatherAlgorithm::Bruck
    } else {
        AllGatherAlgorithm::Ring
    }
}

/// How an all-to-all goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AllToAllAlgorithm {
    /// Every message at once, [`ALL_TO_ALL_THROTTLE`] partners at a time.
    Scattered,
    /// One partner at a time, each step a pairwise exchange.
    Pairwise,
}

/// The all-to-all whose largest block is `block` bytes.
pub(crate) fn all_to_all_algorithm(block: usize) -> AllToAllAlgorithm {
    if block < ALL_TO_ALL_MEDIUM {
        AllToAllAlgorithm::Scattered
    } else {
        AllToAllAlgorithm::Pairwise
    }
}

/// The partners of step `step` (1 to `size - 1`) of a pairwise exchange:
/// (the one received from, the one sent to). On a power-of-two team
/// each step pairs processes off (`rank ^ step` both ways); on others
/// each sends `step` ahead and receives from `step` behind.
pub(crate) fn pairwise_partners(rank: usize, size: usize, step: usize) -> (usize, usize) {
    if size.is_power_of_two() {
        (rank ^ step, rank ^ step)
    } else {
        ((rank + size - step) % size, (rank + step) % size)
    }
}

/// Rounds of a round-robin tournament in which each two of `size`
/// processes meet once: `size - 1` for an even number (each meets one
/// other in every round), `size` for an odd one (each sits one round
/// out).
pub(crate) fn tournament_rounds(size: usize) -> usize {
    if size.is_multiple_of(2) {
        size.saturating_sub(1)
    } else {
        size
    }
}

/// Whom `rank` meets in round `round` of the tournament of
/// [`tournament_rounds`] (the circle method: the rest go round, the last
/// of an even number stays put), or `None` where it sits the round out.
/// Each round pairs processes off both ways, so two processes that meet
/// exchange with each other alone.
pub(crate) fn tournament_partner(rank: usize, size: usize, round: usize) -> Option<usize> {
    if !size.is_multiple_of(2) {
        let partner = (round + size - rank) % size;
        return (partner != rank).then_some(partner);
    }
    let circle = size - 1;
    if rank == circle {
        // The one whose partner on the circle would be itself: `2 * p`
        // is `round` modulo `circle`, and `size / 2` halves modulo it.
        return Some(round * (size / 2) % circle);
    }
    let partner = (round + circle - rank) % circle;
    Some(if partner == rank { circle } else { partner })
}

/// A process's place in the binomial tree over relative ranks (ranks
/// counted from the root): its parent, its children, and how many
/// processes its subtree holds (itself and its descendants, whose
/// relative ranks follow its own).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TreeNode {
    pub parent: Option<usize>,
    /// Largest subtree first.
    pub children: Vec<usize>,
    pub span: usize,
}

/// The node of relative rank `relative` in the binomial tree of `size`
/// processes (MPICH's): a non-root's parent clears its lowest set bit,
/// and its children set each lower bit.
pub(crate) fn binomial_node(relative: usize, size: usize) -> TreeNode {
    let reach = if relative == 0 {
        size.next_power_of_two()
    } else {
        relative & relative.wrapping_neg()
    };
    let children = std::iter::successors(Some(reach / 2), |m| Some(m / 2))
        .take_while(|&m| m > 0)
        .map(|m| relative + m)
        .filter(|&child| child < size)
        .collect();
    TreeNode {
        parent: (relative != 0).then(|| relative - reach),
        children,
        span: reach.min(size - relative),
    }
}

/// How many processes the subtree of relative rank `relative` holds.
pub(crate) fn subtree_span(relative: usize, size: usize) -> usize {
    binomial_node(relative, size).span
}

/// The fold of a team of `size` processes into the largest power of two
/// `pof2` not above it (MPICH's): of the first `2 * rem` processes (`rem
/// = size - pof2`), each even one hands its data to the odd one after it
/// and waits; the odd ones, and all from `2 * rem` on, go on with new
/// ranks `0..pof2` in the order of their ranks, so a new rank stands for
/// a run of consecutive ranks (rank order is kept for non-commutative
/// operations).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Fold {
    pub pof2: usize,
    pub rem: usize,
}

impl Fold {
    pub(crate) fn new(size: usize) -> Fold {
        let pof2 = if size == 0 {
            0
        } else {
            1 << (usize::BITS - 1 - size.leading_zeros())
        };
        Fold {
            pof2,
            rem: size - pof2,
        }
    }

    /// The new rank of `rank`, or `None` for a process that hands its
    /// data on.
    pub(crate) fn new_rank(&self, rank: usize) -> Option<usize> {
        if rank < 2 * self.rem {
            (rank % 2 == 1).then_some(rank / 2)
        } else {
            Some(rank - self.rem)
        }
    }

    /// The rank of the process with new rank `new_rank`.
    pub(crate) fn rank_of(&self, new_rank: usize) -> usize {
        if new_rank < self.rem {
            2 * new_rank + 1
        } else {
            new_rank + self.rem
        }
    }

    /// The new rank of the process that holds `rank`'s data after the
    /// fold: its own, or its odd neighbour's.
    pub(crate) fn new_rank_holding(&self, rank: usize) -> usize {
        if rank < 2 * self.rem {
            rank / 2
        } else {
            rank - self.rem
        }
    }
}

/// One step of recursive halving among `pof2` processes over `pof2`
/// blocks: exchange with `partner` (a new rank), keep the blocks `keep`
/// and hand over the blocks `give`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct HalvingStep {
    pub partner: usize,
    pub keep: Range<usize>,
    pub give: Range<usize>,
}

/// The steps of recursive halving for `new_rank` among `pof2` processes:
/// at the step of bit `mask` (1, 2, 4, ...) the partners differ in that
/// bit and split the blocks both still hold, the one with the bit clear
/// keeping the lower half. After the last step each process holds one
/// block; run backwards (sending `keep`, receiving `give`) the steps
/// gather the blocks again.
pub(crate) fn halving_steps(new_rank: usize, pof2: usize) -> Vec<HalvingStep> {
    let mut held = 0..pof2;
    let mut steps = Vec::new();
    let mut mask = 1;
    while mask < pof2 {
        let mid = held.start + held.len() / 2;
        let (lower, upper) = (held.start..mid, mid..held.end);
        let (keep, give) = if new_rank & mask == 0 {
            (lower, upper)
        } else {
            (upper, lower)
        };
        steps.push(HalvingStep {
            partner: new_rank ^ mask,
            keep: keep.clone(),
            give,
        });
        held = keep;
        mask <<= 1;
    }
    steps
}

/// Bounds of `parts` nearly equal runs of `count` elements: `parts + 1`
/// element offsets, the first `count % parts` runs one longer.
pub(crate) fn split_evenly(count: usize, parts: usize) -> Vec<usize> {
    let (base, extra) = (count / parts, count % parts);
    let mut bounds = Vec::with_capacity(parts + 1);
    let mut at = 0;
    bounds.push(at);
    for part in 0..parts {
        at += base + usize::from(part < extra);
        bounds.push(at);
    }
    bounds
}

/// Bounds of the `parts` chunks a broadcast of `bytes` scatters: chunks
/// of `ceil(bytes / parts)` bytes, the last ones shorter or empty
/// (MPICH's).
pub(crate) fn broadcast_chunks(bytes: usize, parts: usize) -> Vec<usize> {
    let chunk = bytes.div_ceil(parts);
    (0..=parts).map(|part| (part * chunk).min(bytes)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tournaments_pair_every_two_processes_once() {
        for size in 1..=17 {
            let mut met = vec![vec![0; size]; size];
            for round in 0..tournament_rounds(size) {
                for (rank, row) in met.iter_mut().enumerate() {
                    if let Some(p) = tournament_partner(rank, size, round) {
                        assert!(p < size && p != rank, "{size} {round} {rank}: {p}");
                        let back = tournament_partner(p, size, round);
                        assert_eq!(back, Some(rank), "{size} {round} {rank}");
                        row[p] += 1;
                    }
                }
            }
            for (rank, row) in met.iter().enumerate() {
                for (p, &times) in row.iter().enumerate() {
                    assert_eq!(times, usize::from(p != rank), "{size}: {rank} and {p}");
                }
            }
        }
    }

    #[test]
    fn binomial_trees_cover_every_process_once() {
        for size in 1..=33 {
            let mut seen = vec![0; size];
            for relative in 0..size {
                let node = binomial_node(relative, size);
                for &child in &node.children {
                    assert_eq!(binomial_node(child, size).parent, Some(relative));
                    seen[child] += 1;
                }
                // The subtree is the node and its children's subtrees.
                let below: usize = node.children.iter().map(|&c| subtree_span(c, size)).sum();
                assert_eq!(node.span, 1 + below, "size {size} node {relative}");
            }
            assert_eq!(seen[0], 0);
            assert!(seen[1..].iter().all(|&s| s == 1), "size {size}: {seen:?}");
        }
        assert_eq!(
            binomial_node(0, 6),
            TreeNode {
                parent: None,
                children: vec![4, 2, 1],
                span: 6
            }
        );
        assert_eq!(
            binomial_node(4, 6),
            TreeNode {
                parent: Some(0),
                children: vec![5],
                span: 2
            }
        );
    }

    #[test]
    fn the_fold_keeps_rank_order() {
        for size in 1..=40 {
            let fold = Fold::new(size);
            assert!(fold.pof2.is_power_of_two() && fold.pof2 <= size && size < 2 * fold.pof2);
            let survivors: Vec<usize> = (0..size).filter_map(|r| fold.new_rank(r)).collect();
            assert_eq!(survivors, (0..fold.pof2).collect::<Vec<_>>());
            for new_rank in 0..fold.pof2 {
                assert_eq!(fold.new_rank(fold.rank_of(new_rank)), Some(new_rank));
            }
            for rank in 0..size {
                let holder = fold.rank_of(fold.new_rank_holding(rank));
                assert!(holder == rank || (rank % 2 == 0 && holder == rank + 1));
            }
        }
    }

    #[test]
    fn recursive_halving_leaves_one_block_each_and_partners_agree() {
        for pof2 in [1, 2, 4, 8, 16] {
            let mut owner = vec![None; pof2];
            for new_rank in 0..pof2 {
                let steps = halving_steps(new_rank, pof2);
                assert_eq!(steps.len(), pof2.trailing_zeros() as usize);
                let mut held = 0..pof2;
                for step in &steps {
                    // Both partners held the same blocks and split them.
                    let theirs = &halving_steps(step.partner, pof2)
                        [steps.iter().position(|s| s == step).unwrap()];
                    assert_eq!(theirs.keep, step.give);
                    assert_eq!(theirs.give, step.keep);
                    assert_eq!(step.keep.start.min(step.give.start), held.start);
                    assert_eq!(step.keep.end.max(step.give.end), held.end);
                    held = step.keep.clone();
                }
                assert_eq!(held.len(), 1);
                assert_eq!(owner[held.start].replace(new_rank), None);
            }
        }
    }

    #[test]
    fn even_splits_and_broadcast_chunks() {
        assert_eq!(split_evenly(10, 4), [0, 3, 6, 8, 10]);
        assert_eq!(split_evenly(2, 4), [0, 1, 2, 2, 2]);
        assert_eq!(broadcast_chunks(10, 4), [0, 3, 6, 9, 10]);
        assert_eq!(broadcast_chunks(2, 4), [0, 1, 2, 2, 2]);
        assert_eq!(broadcast_chunks(0, 3), [0, 0, 0, 0]);
    }

    #[test]
    fn pairwise_steps_meet_every_partner_once() {
        for size in 1..=12 {
            for rank in 0..size {
                let mut from = vec![false; size];
                let mut to = vec![false; size];
                for step in 1..size {
                    let (src, dst) = pairwise_partners(rank, size, step);
                    // The partner's step sends to this rank what it expects.
                    assert_eq!(pairwise_partners(src, size, step).1, rank);
                    from[src] = true;
                    to[dst] = true;
                }
                let others = |v: Vec<bool>| v.iter().enumerate().all(|(r, &b)| b == (r != rank));
                assert!(others(from) && others(to), "size {size} rank {rank}");
            }
        }
    }

    #[test]
    fn algorithms_switch_where_mpich_does() {
        use AllGatherAlgorithm as G;
        use BroadcastAlgorithm as B;
        use ReduceAlgorithm as R;
        assert_eq!(broadcast_algorithm(12 * 1024 - 1, 8), B::Binomial);
        assert_eq!(broadcast_algorithm(1 << 20, 2), B::Binomial);
        assert_eq!(broadcast_algorithm(12 * 1024, 4), B::ScatterDoubling);
        assert_eq!(broadcast_algorithm(12 * 1024, 3), B::ScatterRing);
        assert_eq!(broadcast_algorithm(512 * 1024, 4), B::ScatterRing);
        assert_eq!(reduce_algorithm(2048, 512, 4, true), R::Short);
        assert_eq!(reduce_algorithm(2049, 2049, 4, true), R::Rabenseifner);
        assert_eq!(reduce_algorithm(1 << 20, 1 << 18, 4, false), R::Short);
        assert_eq!(reduce_algorithm(4096, 2, 5, true), R::Short);
        assert_eq!(all_gather_algorithm(100, 4), G::RecursiveDoubling);
        assert_eq!(all_gather_algorithm(100, 3), G::Bruck);
        assert_eq!(all_gather_algorithm(80 * 1024, 3), G::Ring);
        assert_eq!(all_gather_algorithm(512 * 1024, 4), G::Ring);
        assert_eq!(
            all_to_all_algorithm(32 * 1024 - 1),
            AllToAllAlgorithm::Scattered
        );
        assert_eq!(all_to_all_algorithm(32 * 1024), AllToAllAlgorithm::Pairwise);
    }
}
