//! Groups of processes (MPI 4.1 §7.3).
//!
//! A [`Group`] is an ordered set of processes: rank `i` of the group is its
//! `i`-th member. Groups are local objects: making one never communicates.
//! A program gets one from a communicator ([`Communicator::group`]) and
//! derives others with the set operations ([`Group::union`],
//! [`Group::intersection`], [`Group::difference`]) and by choosing ranks
//! ([`Group::include`], [`Group::exclude`], [`Group::range_include`],
//! [`Group::range_exclude`]); a communicator is made of a group with
//! [`Communicator::split_by_subgroup_collective`] or
//! [`Communicator::split_by_subgroup`]. A group is freed when dropped
//! (`MPI_Group_free`).
//!
//! [`Communicator::group`]: crate::Communicator::group
//! [`Communicator::split_by_subgroup_collective`]: crate::Communicator::split_by_subgroup_collective
//! [`Communicator::split_by_subgroup`]: crate::Communicator::split_by_subgroup

use crate::comm::PROC_NULL;
use crate::{Error, ErrorClass, Result};
use oxmpi_adi::transport::PeerRank;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// How two groups relate (`MPI_Group_compare`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupRelation {
    /// The same members in the same order (`MPI_IDENT`).
    Identical,
    /// The same members in another order (`MPI_SIMILAR`).
    Similar,
    /// Different members (`MPI_UNEQUAL`).
    Unequal,
}

/// An ordered set of processes (`MPI_Group`); see the module docs.
#[derive(Clone, Debug)]
pub struct Group {
    /// World rank of each member, by group rank.
    members: Arc<[PeerRank]>,
    /// The world rank of this process (to find its rank in the group).
    me: PeerRank,
    /// This process's rank in the group, if it is a member.
    rank: Option<usize>,
}

impl Group {
    /// The group of the world ranks `members`, seen by the process of
    /// world rank `me`.
    pub(crate) fn new(members: Arc<[PeerRank]>, me: PeerRank) -> Group {
        let rank = members.iter().position(|&m| m == me);
        Group { members, me, rank }
    }

    /// The group of the world ranks `members`, seen by this process.
    pub(crate) fn with_members(&self, members: Vec<PeerRank>) -> Group {
        Group::new(members.into(), self.me)
    }

    /// The world rank of each member, by group rank.
    pub(crate) fn world_ranks(&self) -> &Arc<[PeerRank]> {
        &self.members
    }

    /// Number of processes in the group (`MPI_Group_size`).
    pub fn size(&self) -> i32 {
        self.members.len() as i32
    }

    /// This process's rank in the group, or `None` if it is not a member
    /// (`MPI_Group_rank`, `MPI_UNDEFINED`).
    pub fn rank(&self) -> Option<i32> {
        self.rank.map(|r| r as i32)
    }

    /// The members of `self`, then those of `other` that are not in
    /// `self`, each in their group's order (`MPI_Group_union`).
    pub fn union(&self, other: &Group) -> Group {
        let mine: HashSet<PeerRank> = self.members.iter().copied().collect();
        let mut members = self.members.to_vec();
        members.extend(other.members.iter().filter(|m| !mine.contains(m)));
        self.with_members(members)
    }

    /// The members of `self` that are also in `other`, in `self`'s order
    /// (`MPI_Group_intersection`).
    pub fn intersection(&self, other: &Group) -> Group {
        let theirs: HashSet<PeerRank> = other.members.iter().copied().collect();
        self.with_members(
            self.members
                .iter()
                .copied()
                .filter(|m| theirs.contains(m))
                .collect(),
        )
    }

    /// The members of `self` that are not in `other`, in `self`'s order
    /// (`MPI_Group_difference`).
    pub fn difference(&self, other: &Group) -> Group {
        let theirs: HashSet<PeerRank> = other.members.iter().copied().collect();
        self.with_members(
            self.members
                .iter()
                .copied()
                .filter(|m| !theirs.contains(m))
                .collect(),
        )
    }

    /// The group of the members with `ranks`, in that order
    /// (`MPI_Group_incl`). A rank outside the group, or one given twice,
    /// is an `MPI_ERR_RANK` error.
    pub fn include(&self, ranks: &[i32]) -> Result<Group> {
        let chosen = self.distinct_ranks(ranks.iter().copied())?;
        Ok(self.with_members(chosen.into_iter().map(|r| self.members[r]).collect()))
    }

    /// The group of the members without `ranks`, in the group's order
    /// (`MPI_Group_excl`). A rank outside the group, or one given twice,
    /// is an `MPI_ERR_RANK` error.
    pub fn exclude(&self, ranks: &[i32]) -> Result<Group> {
        let dropped: HashSet<usize> = self
            .distinct_ranks(ranks.iter().copied())?
            .into_iter()
            .collect();
        Ok(self.with_members(
            (0..self.members.len())
                .filter(|r| !dropped.contains(r))
                .map(|r| self.members[r])
                .collect(),
        ))
    }

    /// The group of the members with the ranks of `ranges`, in order
    /// (`MPI_Group_range_incl`). Each range `(first, last, stride)` names
    /// `first`, `first + stride`, ... up to `last` (`stride` may be
    /// negative). A zero stride, or one that goes away from `last`, is an
    /// `MPI_ERR_ARG` error; a rank outside the group or named twice, an
    /// `MPI_ERR_RANK` error.
    pub fn range_include(&self, ranges: &[(i32, i32, i32)]) -> Result<Group> {
        self.include(&expand_ranges(ranges)?)
    }

    /// The group without the members with the ranks of `ranges`
    /// (`MPI_Group_range_excl`); ranges as in [`Group::range_include`].
    pub fn range_exclude(&self, ranges: &[(i32, i32, i32)]) -> Result<Group> {
        self.exclude(&expand_ranges(ranges)?)
    }

    /// The rank in `other` of the member of rank `rank` here, or `None`
    /// if it is not in `other` (`MPI_Group_translate_ranks` of one rank).
    /// [`PROC_NULL`] translates to itself; a rank outside this group is
    /// an `MPI_ERR_RANK` error.
    pub fn translate_rank(&self, rank: i32, other: &Group) -> Result<Option<i32>> {
        Ok(self.translate_ranks(&[rank], other)?[0])
    }

    /// [`Group::translate_rank`] of each of `ranks`
    /// (`MPI_Group_translate_ranks`).
    pub fn translate_ranks(&self, ranks: &[i32], other: &Group) -> Result<Vec<Option<i32>>> {
        let rank_in_other: HashMap<PeerRank, i32> = other
            .members
            .iter()
            .enumerate()
            .map(|(r, &m)| (m, r as i32))
            .collect();
        ranks
            .iter()
            .map(|&rank| {
                if rank == PROC_NULL {
                    return Ok(Some(PROC_NULL));
                }
                let member = self.members[self.valid_rank(rank)?];
                Ok(rank_in_other.get(&member).copied())
            })
            .collect()
    }

    /// How this group relates to `other` (`MPI_Group_compare`).
    pub fn compare(&self, other: &Group) -> GroupRelation {
        if self.members == other.members {
            return GroupRelation::Identical;
        }
        let mine: HashSet<PeerRank> = self.members.iter().copied().collect();
        let theirs: HashSet<PeerRank> = other.members.iter().copied().collect();
        if self.members.len() == other.members.len() && mine == theirs {
            GroupRelation::Similar
        } else {
            GroupRelation::Unequal
        }
    }

    /// `rank` as an index into the members, or `MPI_ERR_RANK`.
    fn valid_rank(&self, rank: i32) -> Result<usize> {
        usize::try_from(rank)
            .ok()
            .filter(|&r| r < self.members.len())
            .ok_or_else(|| {
                Error::new(
                    ErrorClass::Rank,
                    format!(
                        "rank {rank} is not in this group of {} processes",
                        self.members.len()
                    ),
                )
            })
    }

    /// `ranks` as indices into the members, each valid and named once.
    fn distinct_ranks(&self, ranks: impl Iterator<Item = i32>) -> Result<Vec<usize>> {
        let mut seen = HashSet::new();
        ranks
            .map(|rank| {
                let r = self.valid_rank(rank)?;
                if !seen.insert(r) {
                    return Err(Error::new(
                        ErrorClass::Rank,
                        format!("rank {rank} is named twice"),
                    ));
                }
                Ok(r)
            })
            .collect()
    }
}

/// The ranks `(first, last, stride)` ranges name, in order.
fn expand_ranges(ranges: &[(i32, i32, i32)]) -> Result<Vec<i32>> {
    let mut ranks = Vec::new();
    for &(first, last, stride) in ranges {
        if stride == 0 || (stride > 0 && first > last) || (stride < 0 && first < last) {
            return Err(Error::new(
                ErrorClass::Arg,
                format!("the range ({first}, {last}, {stride}) does not reach its end"),
            ));
        }
        let steps = (i64::from(last) - i64::from(first)) / i64::from(stride);
        ranks.extend((0..=steps).map(|k| (i64::from(first) + k * i64::from(stride)) as i32));
    }
    Ok(ranks)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A group of world ranks `members`, seen from world rank `me`.
    fn group(members: &[PeerRank], me: PeerRank) -> Group {
        Group::new(members.into(), me)
    }

    fn ranks(g: &Group) -> Vec<PeerRank> {
        g.members.to_vec()
    }

    #[test]
    fn set_operations_keep_the_standards_order() {
        // MPI 4.1 §7.3.2: union is all of the first group, then the
        // second's members not in the first, in their order.
        let a = group(&[0, 1, 2, 3, 4], 3);
        let b = group(&[6, 4, 2, 5], 3);
        assert_eq!(ranks(&a.union(&b)), [0, 1, 2, 3, 4, 6, 5]);
        assert_eq!(ranks(&b.union(&a)), [6, 4, 2, 5, 0, 1, 3]);
        assert_eq!(ranks(&a.intersection(&b)), [2, 4]);
        assert_eq!(ranks(&b.intersection(&a)), [4, 2]);
        assert_eq!(ranks(&a.difference(&b)), [0, 1, 3]);
        assert_eq!(ranks(&b.difference(&a)), [6, 5]);
        assert_eq!(a.union(&b).rank(), Some(3));
        assert_eq!(b.union(&a).rank(), Some(6));
        assert_eq!(b.difference(&a).rank(), None);
        let empty = a.difference(&a);
        assert_eq!((empty.size(), empty.rank()), (0, None));
        assert_eq!(ranks(&empty.union(&b)), ranks(&b));
    }

    #[test]
    fn include_and_exclude_choose_ranks() {
        let g = group(&[10, 11, 12, 13, 14, 15], 12);
        let inc = g.include(&[5, 2, 0]).unwrap();
        assert_eq!(ranks(&inc), [15, 12, 10]);
        assert_eq!(inc.rank(), Some(1));
        assert_eq!(ranks(&g.exclude(&[5, 2, 0]).unwrap()), [11, 13, 14]);
        assert_eq!(g.exclude(&[5, 2, 0]).unwrap().rank(), None);
        assert_eq!(g.include(&[]).unwrap().size(), 0);
        assert_eq!(ranks(&g.exclude(&[]).unwrap()), ranks(&g));
        for bad in [&[6][..], &[-1], &[1, 1]] {
            assert_eq!(g.include(bad).unwrap_err().class(), ErrorClass::Rank);
            assert_eq!(g.exclude(bad).unwrap_err().class(), ErrorClass::Rank);
        }
    }

    #[test]
    fn ranges_name_first_to_last_by_stride() {
        // Each range names first, first + stride, ... up to last
        // (MPI 4.1 §7.3.2).
        let g = group(&(0..32).collect::<Vec<_>>(), 0);
        let inc = g
            .range_include(&[(1, 9, 2), (15, 20, 3), (21, 30, 2)])
            .unwrap();
        assert_eq!(ranks(&inc), [1, 3, 5, 7, 9, 15, 18, 21, 23, 25, 27, 29]);
        let down = g.range_include(&[(5, 0, -2)]).unwrap();
        assert_eq!(ranks(&down), [5, 3, 1]);
        let excl = g.range_exclude(&[(0, 31, 2)]).unwrap();
        assert_eq!(ranks(&excl), (1..32).step_by(2).collect::<Vec<_>>());
        assert_eq!(ranks(&g.range_include(&[(4, 4, 1)]).unwrap()), [4]);
        for bad in [(0, 4, 0), (4, 0, 1), (0, 4, -1)] {
            assert_eq!(
                g.range_include(&[bad]).unwrap_err().class(),
                ErrorClass::Arg
            );
        }
        assert_eq!(
            g.range_include(&[(0, 40, 8)]).unwrap_err().class(),
            ErrorClass::Rank
        );
        assert_eq!(
            g.range_include(&[(0, 4, 2), (4, 6, 1)])
                .unwrap_err()
                .class(),
            ErrorClass::Rank
        );
    }

    #[test]
    fn ranks_translate_between_groups() {
        let a = group(&[0, 1, 2, 3, 4, 5], 0);
        let b = group(&[5, 3, 1], 0);
        assert_eq!(
            a.translate_ranks(&[0, 1, 3, 5, PROC_NULL], &b).unwrap(),
            [None, Some(2), Some(1), Some(0), Some(PROC_NULL)]
        );
        assert_eq!(b.translate_rank(0, &a).unwrap(), Some(5));
        assert_eq!(
            a.translate_rank(6, &b).unwrap_err().class(),
            ErrorClass::Rank
        );
    }

    #[test]
    fn groups_compare_as_identical_similar_or_unequal() {
        let a = group(&[0, 1, 2], 0);
        assert_eq!(a.compare(&group(&[0, 1, 2], 1)), GroupRelation::Identical);
        assert_eq!(a.compare(&group(&[2, 0, 1], 0)), GroupRelation::Similar);
        assert_eq!(a.compare(&group(&[0, 1], 0)), GroupRelation::Unequal);
        assert_eq!(a.compare(&group(&[0, 1, 3], 0)), GroupRelation::Unequal);
    }
}
