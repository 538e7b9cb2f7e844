//! The collectives of an intercommunicator (MPI 4.1 §6.2.2): their data
//! goes from one group to the other.
//!
//! Two kinds, as in MPICH:
//!
//! - Rooted (broadcast, reduce, gather(v), scatter(v)): one process of a
//!   group is the root and the whole other group takes part; the root's
//!   group mates do not call them (the standard's `MPI_PROC_NULL`). The
//!   root calls the `..._remote_group` method without a root argument
//!   (`MPI_ROOT`), the other group the one that names the root's rank in
//!   the remote group. Their team is the root and the other group
//!   ([`Rooted`]); the other group reduces, gathers or scatters among
//!   itself by the intracommunicator algorithms, and its rank 0 trades
//!   the whole with the root (gatherv and scatterv go straight between
//!   the root and each process: only the root knows the counts). As the
//!   root's group mates do not count them, they are unnumbered
//!   (`team::unnumbered_tag`), and blocking only: they run in the same
//!   order at every member of their team, and the messages between two
//!   processes are not overtaken.
//! - Every process of both groups (all-reduce, reduce-scatter(-block),
//!   all-gather(v), all-to-all(v, w), and the barrier): the same methods
//!   as on an intracommunicator, where a rank addresses the remote group.
//!   All-reduce and reduce-scatter reduce within each group to its rank
//!   0, the two leaders swap the results, and each broadcasts or scatters
//!   the other group's result in its group ([`GroupTeams`]); the
//!   all-gathers and all-to-alls are all-to-alls over the team of both
//!   groups in which a process sends nothing to its own group. They are
//!   numbered like every other collective, so their non-blocking forms
//!   work too.
//!
//! There are no in-place forms on an intercommunicator (the standard has
//! none), nor scans.

use super::algorithms;
use super::op::Reduction;
use super::partition::{disjoint_blocks, Partition, PartitionMut};
use super::schedule::AllToAllAlgorithm;
use super::team::{unnumbered_tag, CollectiveTag, Sequence, Team};
use super::typed::{Input, Output};
use super::{block_of, engine};
use crate::comm::Communicator;
use crate::context;
use crate::datatype::{Buffer, BufferMut};
use crate::intercomm::RemoteGroup;
use crate::{Error, ErrorClass, Result};
use oxmpi_adi::transport::PeerRank;
use std::borrow::Borrow;
use std::ops::Range;

/// The unnumbered tag of every rooted collective between the groups.
const ROOTED_EXCHANGE: u32 = 1 << 20;

/// The processes of a rooted collective: the root (index 0), then the
/// other group by rank. Each member's messages carry its index among both
/// groups, which keeps them apart from those of any other team on the
/// context.
struct Rooted {
    context: u32,
    /// This process's index.
    me: usize,
    world: Vec<PeerRank>,
    sources: Vec<i32>,
}

impl Rooted {
    /// All of the team.
    fn all(&self) -> Team<'_> {
        Team::new(
            self.context,
            unnumbered_tag(ROOTED_EXCHANGE),
            self.me,
            &self.world,
            Some(&self.sources),
        )
    }

    /// The group without the root, at one of its members.
    fn group(&self) -> Team<'_> {
        Team::new(
            self.context,
            unnumbered_tag(ROOTED_EXCHANGE),
            self.me - 1,
            &self.world[1..],
            Some(&self.sources[1..]),
        )
    }

    /// Whether this process is the other group's rank 0, which trades
    /// its group's data with the root.
    fn leads_group(&self) -> bool {
        self.me == 1
    }
}

/// The teams of one collective of both groups, on one numbered tag: this
/// process's group, and the two groups' leaders (rank 0 of each).
struct GroupTeams<'c> {
    context: u32,
    tag: i32,
    rank: usize,
    local: &'c [PeerRank],
    local_sources: Vec<i32>,
    leaders: [PeerRank; 2],
    leader_sources: [i32; 2],
}

impl GroupTeams<'_> {
    fn local(&self) -> Team<'_> {
        Team::new(
            self.context,
            self.tag,
            self.rank,
            self.local,
            Some(&self.local_sources),
        )
    }

    /// This group's leader (index 0) and the other's, at the leader.
    fn leaders(&self) -> Team<'_> {
        Team::new(
            self.context,
            self.tag,
            0,
            &self.leaders,
            Some(&self.leader_sources),
        )
    }

    fn leads(&self) -> bool {
        self.rank == 0
    }
}

/// The rank `root` of the remote group as an index, or `MPI_ERR_ROOT`.
fn remote_root(remote: &RemoteGroup, root: i32) -> Result<usize> {
    let size = remote.members().len();
    usize::try_from(root)
        .ok()
        .filter(|&r| r < size)
        .ok_or_else(|| {
            Error::new(
                ErrorClass::Root,
                format!("root {root} is not in the remote group of {size} processes"),
            )
        })
}

impl Communicator {
    /// The team of a rooted collective: from the root (`root` `None`) or
    /// from a member of the other group, whose root is `root` of the
    /// remote group.
    fn rooted(&self, root: Option<i32>) -> Result<Rooted> {
        let remote = self.remote()?;
        let local_size = self.members().len();
        let index = |local, rank| remote.index(local, rank, local_size) as i32;
        let rank = self.rank() as usize;
        let (root_world, root_index, others, others_local, me) = match root {
            None => (
                self.members()[rank],
                index(true, rank),
                &remote.members()[..],
                false,
                0,
            ),
            Some(root) => {
                let root = remote_root(remote, root)?;
                (
                    remote.members()[root],
                    index(false, root),
                    &self.members()[..],
                    true,
                    1 + rank,
                )
            }
        };
        Ok(Rooted {
            context: context::collective(self.context_id()),
            me,
            world: std::iter::once(root_world)
                .chain(others.iter().copied())
                .collect(),
            sources: std::iter::once(root_index)
                .chain((0..others.len()).map(|r| index(others_local, r)))
                .collect(),
        })
    }

    /// The teams of a collective of kind `kind` of both groups.
    fn group_teams(&self, sequence: Sequence, kind: CollectiveTag) -> Result<GroupTeams<'_>> {
        let remote = self.remote()?;
        let local_size = self.members().len();
        let index = |local, rank| remote.index(local, rank, local_size) as i32;
        Ok(GroupTeams {
            context: context::collective(self.context_id()),
            tag: sequence.tag(kind),
            rank: self.rank() as usize,
            local: self.members(),
            local_sources: (0..local_size).map(|r| index(true, r)).collect(),
            leaders: [self.members()[0], remote.members()[0]],
            leader_sources: [index(true, 0), index(false, 0)],
        })
    }

    /// The number of processes a collective's ranks address: the remote
    /// group's on an intercommunicator, else the communicator's.
    pub(crate) fn addressed_size(&self) -> usize {
        match self.remote_members() {
            Some(remote) => remote.members().len(),
            None => self.size() as usize,
        }
    }

    /// The all-to-all of an intercommunicator: `sends[i]` goes to rank
    /// `i` of the remote group and `recvs[j]` comes from its rank `j`.
    /// Over the team of both groups, where nothing goes to the own group.
    pub(crate) async fn inter_all_to_all(
        &self,
        sequence: Sequence,
        sends: &[&[u8]],
        recvs: Vec<&mut [u8]>,
        algorithm: AllToAllAlgorithm,
    ) -> Result<()> {
        let remote = self.remote()?;
        let local_size = self.members().len();
        let team = self.both_groups_team(sequence, CollectiveTag::AllToAll)?;
        let mut all_sends: Vec<&[u8]> = vec![&[]; team.size()];
        let mut all_recvs: Vec<&mut [u8]> = (0..team.size()).map(|_| &mut [][..]).collect();
        for (rank, (send, recv)) in sends.iter().zip(recvs).enumerate() {
            let i = remote.index(false, rank, local_size);
            all_sends[i] = send;
            all_recvs[i] = recv;
        }
        team.complete(algorithms::all_to_all(
            &team, &all_sends, all_recvs, algorithm,
        ))
        .await
    }

    /// Leaves in `acc`, at this group's leader, the reduction of the
    /// remote group's `acc`: each group reduces to its leader, and the
    /// leaders swap. A mismatch of lengths between the leaders is
    /// returned second, for the caller to go on with its group first.
    async fn remote_reduction_at_leader(
        &self,
        teams: &GroupTeams<'_>,
        acc: &mut [u8],
        red: &Reduction<'_>,
    ) -> Result<Result<()>> {
        let local = teams.local();
        local
            .complete(algorithms::reduce(&local, 0, acc, red))
            .await?;
        if !teams.leads() {
            return Ok(Ok(()));
        }
        let ours = acc.to_vec();
        let leaders = teams.leaders();
        Ok(leaders
            .complete(leaders.send_receive(1, &ours, 1, acc))
            .await)
    }

    /// The all-reduce of an intercommunicator: `acc` holds this
    /// process's data and ends with the reduction of the remote group's.
    pub(crate) async fn inter_all_reduce(
        &self,
        sequence: Sequence,
        acc: &mut [u8],
        red: &Reduction<'_>,
    ) -> Result<()> {
        let teams = self.group_teams(sequence, CollectiveTag::AllReduce)?;
        let swapped = self.remote_reduction_at_leader(&teams, acc, red).await?;
        let local = teams.local();
        local
            .complete(algorithms::broadcast(&local, 0, acc))
            .await?;
        swapped
    }

    /// The reduce-scatter of an intercommunicator: `input` holds this
    /// process's contribution to the remote group's `blocks` (both groups
    /// reduce as many elements), and `out` gets this process's block of
    /// the reduction of the remote group's inputs.
    pub(crate) async fn inter_reduce_scatter(
        &self,
        sequence: Sequence,
        input: &[u8],
        blocks: &[Range<usize>],
        out: &mut [u8],
        red: &Reduction<'_>,
    ) -> Result<()> {
        let teams = self.group_teams(sequence, CollectiveTag::ReduceScatter)?;
        let mut acc = input.to_vec();
        let swapped = self
            .remote_reduction_at_leader(&teams, &mut acc, red)
            .await?;
        let sends: Vec<&[u8]> = blocks.iter().map(|b| &acc[b.clone()]).collect();
        let local = teams.local();
        local
            .complete(algorithms::scatter_varcount(
                &local,
                0,
                teams.leads().then_some(&sends[..]),
                out,
            ))
            .await?;
        swapped
    }

    /// Broadcasts `buf` from this process, the root, to every process of
    /// the remote group of this intercommunicator (`MPI_Bcast` with
    /// `MPI_ROOT`); they call [`Communicator::broadcast_from_remote_group`]
    /// with this process's rank. The root's group mates take no part
    /// (`MPI_PROC_NULL`).
    pub fn broadcast_to_remote_group<B: Buffer + ?Sized>(&self, buf: &B) -> Result<()> {
        let result = (|| {
            // The algorithm takes one mutable buffer at every member; the
            // root's is a copy of its data.
            let mut data = Input::new(buf)?.bytes().to_vec();
            let team = self.rooted(None)?;
            let all = team.all();
            all.run(|t| engine::block_on(algorithms::broadcast(t, 0, &mut data)))
        })();
        self.handled(result)
    }

    /// Receives into `buf` the broadcast of the process of rank `root` in
    /// the remote group of this intercommunicator (`MPI_Bcast` with the
    /// root's rank): every process of this group calls it.
    pub fn broadcast_from_remote_group<B: BufferMut + ?Sized>(
        &self,
        root: i32,
        buf: &mut B,
    ) -> Result<()> {
        let result = (|| {
            let mut output = Output::new(buf)?;
            let team = self.rooted(Some(root))?;
            let all = team.all();
            all.run(|t| engine::block_on(algorithms::broadcast(t, 0, output.bytes_mut())))?;
            output.finish()
        })();
        self.handled(result)
    }

    /// Receives into `recv`, at this process, the root, the reduction by
    /// `op` of the `send` buffers of every process of the remote group
    /// (`MPI_Reduce` with `MPI_ROOT`), in their rank order; they call
    /// [`Communicator::reduce_to_remote_group`] with this process's rank.
    /// The root's group mates take no part (`MPI_PROC_NULL`).
    pub fn reduce_from_remote_group<R, O>(&self, recv: &mut R, op: O) -> Result<()>
    where
        R: BufferMut + ?Sized,
        O: super::Operation,
    {
        let result = (|| {
            let mut output = Output::new(recv)?;
            // The operation is checked for the type here as at the senders.
            Reduction::new(&op, output.element_type())?;
            let team = self.rooted(None)?;
            let all = team.all();
            all.run(|t| engine::block_on(t.receive(1, output.bytes_mut())))?;
            output.finish()
        })();
        self.handled(result)
    }

    /// Contributes `send` to the reduction by `op` that the process of
    /// rank `root` in the remote group receives (`MPI_Reduce` with the
    /// root's rank; it calls [`Communicator::reduce_from_remote_group`]).
    /// Every process of this group calls it.
    pub fn reduce_to_remote_group<S, O>(&self, root: i32, send: &S, op: O) -> Result<()>
    where
        S: Buffer + ?Sized,
        O: super::Operation,
    {
        let result = (|| {
            let send = Input::new(send)?;
            let red = Reduction::new(&op, send.element_type())?;
            let mut acc = send.bytes().to_vec();
            let team = self.rooted(Some(root))?;
            let group = team.group();
            // A mismatch in the group is reported after the root has had
            // its message, so that it does not wait for one that never
            // comes.
            let reduced = group.run(|t| engine::block_on(algorithms::reduce(t, 0, &mut acc, &red)));
            if team.leads_group() {
                let all = team.all();
                all.run(|t| engine::block_on(t.send(0, &acc)))?;
            }
            reduced
        })();
        self.handled(result)
    }

    /// Gathers, at this process, the root, the `send` buffers of every
    /// process of the remote group into `recv`, in their rank order
    /// (`MPI_Gather` with `MPI_ROOT`); `recv` holds one block per process
    /// there. They call [`Communicator::gather_to_remote_group`] with
    /// this process's rank; the root's group mates take no part.
    pub fn gather_from_remote_group<R: BufferMut + ?Sized>(&self, recv: &mut R) -> Result<()> {
        let result = (|| {
            let mut output = Output::new(recv)?;
            let team = self.rooted(None)?;
            let all = team.all();
            all.run(|t| engine::block_on(t.receive(1, output.bytes_mut())))?;
            output.finish()
        })();
        self.handled(result)
    }

    /// Sends `send` to the process of rank `root` in the remote group,
    /// which gathers every process's of this group
    /// (`MPI_Gather` with the root's rank; it calls
    /// [`Communicator::gather_from_remote_group`]). Every process of this
    /// group calls it, with blocks of one length.
    pub fn gather_to_remote_group<S: Buffer + ?Sized>(&self, root: i32, send: &S) -> Result<()> {
        let result = (|| {
            let send = Input::new(send)?;
            let team = self.rooted(Some(root))?;
            let leads = team.leads_group();
            let mut gathered = vec![
                0u8;
                if leads {
                    self.members().len() * send.bytes().len()
                } else {
                    0
                }
            ];
            let group = team.group();
            // As in a reduce: the root gets its message in any case.
            let gathered_ok = group.run(|t| {
                engine::block_on(algorithms::gather(
                    t,
                    0,
                    send.bytes(),
                    leads.then_some(&mut gathered[..]),
                ))
            });
            if leads {
                let all = team.all();
                all.run(|t| engine::block_on(t.send(0, &gathered)))?;
            }
            gathered_ok
        })();
        self.handled(result)
    }

    /// Gathers, at this process, the root, the `send` buffers of every
    /// process of the remote group, of any lengths, into the blocks of
    /// `recv` (`MPI_Gatherv` with `MPI_ROOT`): block `i` (count and
    /// displacement `i`, which must not overlap) receives rank `i`'s.
    /// They call [`Communicator::gather_varcount_to_remote_group`]; the
    /// root's group mates take no part.
    pub fn gather_varcount_from_remote_group<R, C, D>(
        &self,
        recv: &mut PartitionMut<'_, R, C, D>,
    ) -> Result<()>
    where
        R: BufferMut + ?Sized,
        C: Borrow<[i32]>,
        D: Borrow<[i32]>,
    {
        let result = (|| {
            let team = self.rooted(None)?;
            let (parts, mut output) = recv.parts(team.world.len() - 1)?;
            let buf = output.bytes_mut();
            let mut blocks = disjoint_blocks(buf.len(), &parts)?.split(buf);
            // The root's own block (index 0) is empty.
            blocks.insert(0, &mut []);
            let all = team.all();
            all.run(|t| engine::block_on(algorithms::gather_varcount(t, 0, &[], Some(blocks))))?;
            output.finish()
        })();
        self.handled(result)
    }

    /// Sends `send` to the process of rank `root` in the remote group
    /// (`MPI_Gatherv` with the root's rank; it calls
    /// [`Communicator::gather_varcount_from_remote_group`] and says how
    /// long each process's block is). Every process of this group calls
    /// it.
    pub fn gather_varcount_to_remote_group<S: Buffer + ?Sized>(
        &self,
        root: i32,
        send: &S,
    ) -> Result<()> {
        let result = (|| {
            let send = Input::new(send)?;
            let team = self.rooted(Some(root))?;
            let all = team.all();
            all.run(|t| engine::block_on(algorithms::gather_varcount(t, 0, send.bytes(), None)))
        })();
        self.handled(result)
    }

    /// Scatters `send`, at this process, the root, to the processes of
    /// the remote group: block `i` of its equal blocks, one per process
    /// there, to rank `i` (`MPI_Scatter` with `MPI_ROOT`). They call
    /// [`Communicator::scatter_from_remote_group`] with this process's
    /// rank; the root's group mates take no part.
    pub fn scatter_to_remote_group<S: Buffer + ?Sized>(&self, send: &S) -> Result<()> {
        let result = (|| {
            let send = Input::new(send)?;
            let team = self.rooted(None)?;
            block_of(
                send.bytes().len(),
                team.world.len() - 1,
                send.element_type(),
                "the send buffer",
            )?;
            let all = team.all();
            all.run(|t| engine::block_on(t.send(1, send.bytes())))
        })();
        self.handled(result)
    }

    /// Receives into `recv` this process's block of the scatter of the
    /// process of rank `root` in the remote group (`MPI_Scatter` with the
    /// root's rank; it calls [`Communicator::scatter_to_remote_group`]).
    /// Every process of this group calls it, with blocks of one length.
    pub fn scatter_from_remote_group<R: BufferMut + ?Sized>(
        &self,
        root: i32,
        recv: &mut R,
    ) -> Result<()> {
        let result = (|| {
            let mut output = Output::new(recv)?;
            let team = self.rooted(Some(root))?;
            let leads = team.leads_group();
            let block = output.bytes_mut().len();
            let mut whole = vec![
                0u8;
                if leads {
                    self.members().len() * block
                } else {
                    0
                }
            ];
            // A mismatch with the root is reported after the group has had
            // its blocks, so that none waits for them.
            let mut received = Ok(());
            if leads {
                let all = team.all();
                received = all.run(|t| engine::block_on(t.receive(0, &mut whole)));
            }
            let group = team.group();
            group.run(|t| {
                engine::block_on(algorithms::scatter(
                    t,
                    0,
                    leads.then_some(&whole[..]),
                    output.bytes_mut(),
                ))
            })?;
            received?;
            output.finish()
        })();
        self.handled(result)
    }

    /// Scatters the blocks of `send`, of any lengths, at this process,
    /// the root, to the processes of the remote group: block `i` (count
    /// and displacement `i`) to rank `i` (`MPI_Scatterv` with
    /// `MPI_ROOT`). They call
    /// [`Communicator::scatter_varcount_from_remote_group`]; the root's
    /// group mates take no part.
    pub fn scatter_varcount_to_remote_group<S, C, D>(
        &self,
        send: &Partition<'_, S, C, D>,
    ) -> Result<()>
    where
        S: Buffer + ?Sized,
        C: Borrow<[i32]>,
        D: Borrow<[i32]>,
    {
        let result = (|| {
            let team = self.rooted(None)?;
            let (parts, send) = send.parts(team.world.len() - 1)?;
            // The root's own block (index 0) is empty.
            let sends: Vec<&[u8]> = std::iter::once(&[][..])
                .chain(parts.iter().map(|p| &send.bytes()[p.clone()]))
                .collect();
            let all = team.all();
            all.run(|t| engine::block_on(algorithms::scatter_varcount(t, 0, Some(&sends), &mut [])))
        })();
        self.handled(result)
    }

    /// Receives into `recv` this process's block of the scatter of the
    /// process of rank `root` in the remote group (`MPI_Scatterv` with
    /// the root's rank; it calls
    /// [`Communicator::scatter_varcount_to_remote_group`]). Every process
    /// of this group calls it.
    pub fn scatter_varcount_from_remote_group<R: BufferMut + ?Sized>(
        &self,
        root: i32,
        recv: &mut R,
    ) -> Result<()> {
        let result = (|| {
            let mut output = Output::new(recv)?;
            let team = self.rooted(Some(root))?;
            let all = team.all();
            all.run(|t| {
                engine::block_on(algorithms::scatter_varcount(t, 0, None, output.bytes_mut()))
            })?;
            output.finish()
        })();
        self.handled(result)
    }
}
