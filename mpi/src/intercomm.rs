//! Intercommunicators (MPI 4.1 §7.6): two disjoint groups of processes
//! that talk to each other.
//!
//! An intercommunicator is a [`Communicator`] with a remote group beside
//! its local one. [`Communicator::rank`], [`Communicator::size`] and
//! [`Communicator::group`] are about the local group, and the ranks of
//! point-to-point calls address the remote group: rank `r` is the remote
//! group's `r`, and a message's source rank is the sender's rank in its
//! own group. [`Communicator::create_intercommunicator`] makes one of two
//! intracommunicators' processes through their leaders, and
//! [`Communicator::merge`] turns one into an intracommunicator of both
//! groups.
//!
//! ```no_run
//! use oxmpi::Color;
//! let universe = oxmpi::initialize().unwrap();
//! let world = universe.world();
//! // Even and odd world ranks; their leaders are world ranks 0 and 1.
//! let even = world.rank() % 2 == 0;
//! let half = world
//!     .split_by_color(Color::with_value(world.rank() % 2))
//!     .unwrap()
//!     .unwrap();
//! let inter = half
//!     .create_intercommunicator(0, &world, if even { 1 } else { 0 }, 99)
//!     .unwrap();
//! // Rank 0 of each group sends to rank 0 of the other.
//! if inter.rank() == 0 {
//!     let other = inter.process_at_rank(0);
//!     let mut got = 0i32;
//!     inter.send_receive_into(&world.rank(), &other, &mut got, &other).unwrap();
//! }
//! // One intracommunicator again: the odd ranks first (they pass false).
//! let all = inter.merge(even).unwrap();
//! ```
//!
//! Both groups agree on one context id, as for any communicator, but over
//! both groups: each group reduces its members' free ids, the leaders
//! swap the two results and each broadcasts their and in its group (see
//! `context::agree_by`). Traffic between the two groups then needs no
//! second id: a receive names its source in the remote group, and no
//! message on an intercommunicator goes between members of one group,
//! but those of its collectives. The collectives run as teams of both
//! groups in one order (the group whose first member has the lower world
//! rank first), on the collective context.
//!
//! The collectives of an intercommunicator (MPI 4.1 §6.2.2) move data
//! from one group to the other; they are in `collective::inter`.
//! Barrier, all-reduce, reduce-scatter(-block), all-gather(v) and
//! all-to-all(v, w) are the intracommunicator's methods (and their
//! non-blocking forms), where the ranks and the counts address the remote
//! group. The rooted ones (broadcast, reduce, gather(v), scatter(v)) have
//! methods of their own: the root calls the one without a root argument
//! (`MPI_ROOT`, such as [`Communicator::reduce_from_remote_group`]), the
//! other group the one that names the root's rank there
//! ([`Communicator::reduce_to_remote_group`]), and the root's group mates
//! [`Communicator::pass_remote_group_collective`] (`MPI_PROC_NULL`: it
//! moves nothing, but counts the collective as every process does); each
//! has an `immediate_` form. Scans, in-place
//! forms and the rooted methods of [`crate::comm::Process`] fail with
//! `MPI_ERR_COMM`: merge the intercommunicator to use them.
//! Duplicating works; splitting, topologies and communicators of
//! subgroups need an intracommunicator.

use crate::collective::algorithms::{all_gather, broadcast};
use crate::collective::engine::block_on;
use crate::collective::team::{CollectiveTag, Sequence, Team};
use crate::collective::typed::{Output, Pieces};
use crate::comm::{Communicator, Inherit, TAG_UB};
use crate::context;
use crate::group::Group;
use crate::{with_device, Error, ErrorClass, Result};
use oxmpi_adi::transport::PeerRank;
use std::sync::Arc;

/// The remote group of an intercommunicator, and the team of both groups
/// its collectives use.
#[derive(Debug)]
pub(crate) struct RemoteGroup {
    /// World rank of each member of the remote group, by rank there.
    members: Arc<[PeerRank]>,
    /// World rank of every member of both groups: the group whose first
    /// member has the lower world rank first (the same order at every
    /// process of both groups).
    both: Arc<[PeerRank]>,
    /// Whether the local group comes first in `both`.
    local_first: bool,
}

impl RemoteGroup {
    /// The remote group `members` of a local group `local`.
    pub(crate) fn new(local: &[PeerRank], members: Arc<[PeerRank]>) -> RemoteGroup {
        let local_first = local.first() < members.first();
        let (first, second) = if local_first {
            (local, &members[..])
        } else {
            (&members[..], local)
        };
        let both = first.iter().chain(second).copied().collect();
        RemoteGroup {
            members,
            both,
            local_first,
        }
    }

    /// World rank of each member of the remote group.
    pub(crate) fn members(&self) -> &Arc<[PeerRank]> {
        &self.members
    }

    /// The index in the team of both groups of the member of rank `rank`
    /// in the local group (`local` true) or the remote group, where the
    /// local group has `local_size` members.
    pub(crate) fn index(&self, local: bool, rank: usize, local_size: usize) -> usize {
        let first = local == self.local_first;
        match (first, self.local_first) {
            (true, _) => rank,
            (false, true) => local_size + rank,
            (false, false) => self.members.len() + rank,
        }
    }
}

impl Communicator {
    /// Whether this is an intercommunicator (`MPI_Comm_test_inter`).
    #[doc(alias = "MPI_Comm_test_inter")]
    pub fn is_inter_communicator(&self) -> bool {
        self.remote_members().is_some()
    }

    /// The number of processes in the remote group of an
    /// intercommunicator (`MPI_Comm_remote_size`); `MPI_ERR_COMM` for an
    /// intracommunicator.
    #[doc(alias = "MPI_Comm_remote_size")]
    pub fn remote_size(&self) -> Result<i32> {
        self.handled(self.remote().map(|r| r.members.len() as i32))
    }

    /// The remote group of an intercommunicator (`MPI_Comm_remote_group`);
    /// `MPI_ERR_COMM` for an intracommunicator.
    #[doc(alias = "MPI_Comm_remote_group")]
    pub fn remote_group(&self) -> Result<Group> {
        let me = self.members()[self.rank() as usize];
        self.handled(self.remote().map(|r| Group::new(r.members.clone(), me)))
    }

    /// The remote group, or `MPI_ERR_COMM` for an intracommunicator.
    pub(crate) fn remote(&self) -> Result<&RemoteGroup> {
        self.live()?;
        self.remote_members().ok_or_else(|| {
            Error::new(
                ErrorClass::Comm,
                "this is an intracommunicator; the call needs an intercommunicator",
            )
        })
    }

    /// Fails with `MPI_ERR_COMM` for an intercommunicator: `what` needs an
    /// intracommunicator.
    pub(crate) fn require_intra(&self, what: &str) -> Result<()> {
        self.live()?;
        if self.is_inter_communicator() {
            return Err(Error::new(
                ErrorClass::Comm,
                format!("{what} needs an intracommunicator; this is an intercommunicator (merge it first)"),
            ));
        }
        Ok(())
    }

    /// The team of every process of both groups of an intercommunicator,
    /// for a collective of kind `tag`.
    pub(crate) fn both_groups_team(
        &self,
        sequence: Sequence,
        tag: CollectiveTag,
    ) -> Result<Team<'_>> {
        let remote = self.remote()?;
        let index = remote.index(true, self.rank() as usize, self.members().len());
        Ok(Team::new(
            context::collective(self.context_id()),
            sequence.tag(tag),
            index,
            &remote.both,
            None,
        ))
    }

    /// An intercommunicator between this communicator's processes and
    /// those of another, disjoint intracommunicator
    /// (`MPI_Intercomm_create`). Collective over both groups.
    ///
    /// `local_leader` is a rank here; every process of this communicator
    /// passes the same. The leaders of the two groups reach each other on
    /// `peer`, a communicator of which both are members (world, often),
    /// where the local leader is known by the remote group as
    /// `remote_leader` is here; `remote_leader` and `peer` matter at the
    /// local leader only, and the leaders' messages on `peer` carry `tag`,
    /// which must not match the program's own traffic between them there.
    /// Groups that share a process are an `MPI_ERR_ARG` error at every
    /// process.
    #[doc(alias = "MPI_Intercomm_create")]
    pub fn create_intercommunicator(
        &self,
        local_leader: i32,
        peer: &Communicator,
        remote_leader: i32,
        tag: i32,
    ) -> Result<Communicator> {
        self.handled(self.create_inter(local_leader, peer, remote_leader, tag))
    }

    fn create_inter(
        &self,
        local_leader: i32,
        peer: &Communicator,
        remote_leader: i32,
        tag: i32,
    ) -> Result<Communicator> {
        self.require_intra("creating an intercommunicator")?;
        if !(0..self.size()).contains(&local_leader) {
            return Err(Error::new(
                ErrorClass::Rank,
                format!(
                    "local leader {local_leader} is not in this communicator of {} processes",
                    self.size()
                ),
            ));
        }
        if !(0..=TAG_UB).contains(&tag) {
            return Err(Error::new(
                ErrorClass::Tag,
                format!("tag {tag} is invalid: tags are 0..={TAG_UB}"),
            ));
        }
        let leader = local_leader as usize;
        let leads = self.rank() == local_leader;
        // A leader's bad arguments fail its whole group below, not the
        // leader alone: its group mates would wait for it.
        let link = leads.then(|| Link::new(peer, remote_leader, tag));
        let team = self.team(self.next_collective(), CollectiveTag::Communicator)?;
        let remote = team.run(|t| {
            let swapped = match &link {
                Some(Ok(link)) => link.swap_groups(self.members()),
                Some(Err(e)) => Err(e.clone()),
                None => Ok(Vec::new()),
            };
            leader_status(t, leader, local_leader, swapped.as_ref().err())?;
            // The leader tells its group the remote group's size, then
            // the list.
            let mut members = swapped?;
            let mut len = [members.len() as u64];
            broadcast_values(t, leader, &mut len)?;
            members.resize(len[0] as usize, 0);
            broadcast_values(t, leader, &mut members)?;
            Ok(members)
        })?;
        // The list came from another process: every rank in it must be
        // one of the job's, each once.
        let job_size = with_device(|d| Ok(d.size() as u64))?;
        let mut distinct = remote.clone();
        distinct.sort_unstable();
        distinct.dedup();
        if distinct.len() != remote.len() || remote.iter().any(|&w| w >= job_size) {
            return Err(Error::new(
                ErrorClass::Intern,
                format!(
                    "the remote leader sent a group that is not a list of distinct ranks of this job of {job_size}: {remote:?}"
                ),
            ));
        }
        if let Some(shared) = remote
            .iter()
            .find(|w| self.members().contains(&(**w as PeerRank)))
        {
            return Err(Error::new(
                ErrorClass::Arg,
                format!(
                    "the local and remote groups of an intercommunicator must be disjoint; world rank {shared} is in both"
                ),
            ));
        }
        let remote: Arc<[PeerRank]> = remote.iter().map(|&w| w as PeerRank).collect();
        let id = context::agree_by(self.agreement_priority(0), true, |words| {
            team.run(|t| {
                context::and_over(t, words)?;
                let combined = match &link {
                    Some(Ok(link)) => link.and_with_remote(words),
                    _ => Ok(()),
                };
                leader_status(t, leader, local_leader, combined.as_ref().err())?;
                broadcast_values(t, leader, words)
            })
        })?;
        self.inter_with_context(&self.group(), remote, id, Inherit::ErrorHandler)
    }

    /// An intracommunicator of both groups of this intercommunicator
    /// (`MPI_Intercomm_merge`). Every process of a group passes the same
    /// `high`; the group that passes false comes first, and if both pass
    /// the same, the group whose first member has the lower world rank
    /// does. Ranks within each group keep their order. Collective over
    /// both groups.
    #[doc(alias = "MPI_Intercomm_merge")]
    pub fn merge(&self, high: bool) -> Result<Communicator> {
        self.handled(self.merge_groups(high))
    }

    fn merge_groups(&self, high: bool) -> Result<Communicator> {
        let remote = self.remote()?;
        let team = self.both_groups_team(self.next_collective(), CollectiveTag::Communicator)?;
        let local_size = self.members().len();
        let (local_first, id) = team.run(|t| {
            let mut flags = vec![0u8; t.size()];
            block_on(all_gather(t, &[u8::from(high)], &mut flags))?;
            // A group's choice is its first member's.
            let local_high = flags[remote.index(true, 0, local_size)] != 0;
            let remote_high = flags[remote.index(false, 0, local_size)] != 0;
            let local_first = if local_high == remote_high {
                remote.local_first
            } else {
                !local_high
            };
            let id = context::agree(t, self.agreement_priority(0), true)?;
            Ok((local_first, id))
        })?;
        let local = self.members().iter();
        let members: Vec<PeerRank> = if local_first {
            local.chain(remote.members.iter()).copied().collect()
        } else {
            remote.members.iter().chain(local).copied().collect()
        };
        let group = self.group().with_members(members);
        self.with_context(&group, id, Inherit::ErrorHandler)?
            .ok_or_else(|| {
                Error::new(
                    ErrorClass::Intern,
                    "this process is not in the merge of its own intercommunicator",
                )
            })
    }

    /// A duplicate of this intercommunicator (see
    /// [`Communicator::duplicate`]).
    pub(crate) fn duplicate_inter(&self) -> Result<Communicator> {
        let remote = self.remote()?;
        let team = self.both_groups_team(self.next_collective(), CollectiveTag::Communicator)?;
        let id = team.run(|t| context::agree(t, self.agreement_priority(0), true))?;
        self.inter_with_context(
            &self.group(),
            remote.members.clone(),
            id,
            Inherit::Everything,
        )
    }
}

/// Tells the group, from its `leader` (rank `local_leader`), whether
/// the leader's exchange with the other group's leader failed
/// (`failure`, at the leader): then every member fails, the leader with
/// its error and the others with `MPI_ERR_OTHER`, so that none waits for
/// what the leader will not send.
fn leader_status(
    t: &Team,
    leader: usize,
    local_leader: i32,
    failure: Option<&Error>,
) -> Result<()> {
    let mut status = [u32::from(failure.is_some())];
    broadcast_values(t, leader, &mut status)?;
    if let Some(e) = failure {
        return Err(e.clone());
    }
    if status[0] != 0 {
        return Err(Error::new(
            ErrorClass::Other,
            format!(
                "the local leader (rank {local_leader}) could not reach the remote group's leader"
            ),
        ));
    }
    Ok(())
}

/// A leader's line to the other group's leader while an intercommunicator
/// is made.
struct Link<'a> {
    peer: &'a Communicator,
    remote_leader: i32,
    tag: i32,
}

impl<'a> Link<'a> {
    fn new(peer: &'a Communicator, remote_leader: i32, tag: i32) -> Result<Link<'a>> {
        peer.check_destination(remote_leader, tag)?;
        if remote_leader == peer.rank() {
            return Err(Error::new(
                ErrorClass::Rank,
                format!("remote leader {remote_leader} is this process itself, on the peer communicator"),
            ));
        }
        Ok(Link {
            peer,
            remote_leader,
            tag,
        })
    }

    /// Sends `mine` to the remote leader while receiving its words of the
    /// same length into `theirs`.
    fn swap<T: crate::Equivalence>(&self, mine: &[T], theirs: &mut [T]) -> Result<()> {
        let other = self.peer.process_at_rank(self.remote_leader);
        // The error is the intercommunicator call's, for its handler.
        self.peer
            .send_receive_unhandled(mine, &other, self.tag, theirs, &other, self.tag)
            .map(|_| ())
    }

    /// Sends the world ranks of the local group, receives those of the
    /// remote group.
    fn swap_groups(&self, local: &[PeerRank]) -> Result<Vec<u64>> {
        let mine: Vec<u64> = local.iter().map(|&w| w as u64).collect();
        let mut len = [0u64];
        self.swap(&[mine.len() as u64], &mut len)?;
        // A group is never larger than the job; a larger length is not
        // allocated.
        let job_size = with_device(|d| Ok(d.size() as u64))?;
        if len[0] > job_size {
            return Err(Error::new(
                ErrorClass::Intern,
                format!(
                    "the remote leader announced a group of {} processes in a job of {job_size}",
                    len[0]
                ),
            ));
        }
        let mut theirs = vec![0u64; len[0] as usize];
        self.swap(&mine, &mut theirs)?;
        Ok(theirs)
    }

    /// Leaves in `words` their and with the remote group's.
    fn and_with_remote(&self, words: &mut [u32]) -> Result<()> {
        let mine = words.to_vec();
        self.swap(&mine, words)?;
        for (w, m) in words.iter_mut().zip(mine) {
            *w &= m;
        }
        Ok(())
    }
}

/// Broadcasts `values` over `t` from `root`.
fn broadcast_values<T: crate::Equivalence>(t: &Team, root: usize, values: &mut [T]) -> Result<()> {
    let mut output = Output::new(values)?;
    block_on(broadcast(t, root, &mut Pieces::Bytes(output.bytes_mut())))?;
    output.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_groups_are_ordered_the_same_from_either_side() {
        let a: Arc<[PeerRank]> = Arc::from([4, 1, 6]);
        let b: Arc<[PeerRank]> = Arc::from([0, 5]);
        let from_a = RemoteGroup::new(&a, b.clone());
        let from_b = RemoteGroup::new(&b, a.clone());
        assert_eq!(&*from_a.both, &[0, 5, 4, 1, 6]);
        assert_eq!(from_a.both, from_b.both);
        assert!(!from_a.local_first && from_b.local_first);
        // Rank 2 of group a, seen from either side.
        assert_eq!(from_a.index(true, 2, 3), 4);
        assert_eq!(from_b.index(false, 2, 2), 4);
        // Rank 1 of group b.
        assert_eq!(from_a.index(false, 1, 3), 1);
        assert_eq!(from_b.index(true, 1, 2), 1);
    }
}
