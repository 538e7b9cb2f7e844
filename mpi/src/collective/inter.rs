//! The collectives of an intercommunicator (MPI 4.1 §6.2.2): their data
//! goes from one group to the other.
//!
//! Two kinds, as in MPICH:
//!
//! - Rooted (broadcast, reduce, gather(v), scatter(v)), blocking and
//!   non-blocking: one process of a group is the root and the whole other
//!   group takes part. The root calls the `..._remote_group` method
//!   without a root argument (`MPI_ROOT`), the other group the one that
//!   names the root's rank in the remote group, and the root's group
//!   mates [`Communicator::pass_remote_group_collective`]
//!   (`MPI_PROC_NULL`), which moves nothing but counts the collective,
//!   so that every process of both groups numbers it alike. Their team
//!   is the root and the other group ([`Rooted`]). A broadcast or
//!   reduce runs the intracommunicator algorithm in the other group, whose
//!   rank 0 trades the data with the root (a reduce a segment at a time);
//!   both phases share the collective's numbered tag: their pairs of
//!   processes differ or follow each other. Gather(v) and scatter(v) go
//!   straight between the root and each process, as MPICH's do for long
//!   data: no process holds more than its own block (and only the root
//!   knows a varcount form's counts).
//! - Every process of both groups (all-reduce, reduce-scatter(-block),
//!   all-gather(v), all-to-all(v, w), and the barrier): the same methods
//!   as on an intracommunicator, where a rank addresses the remote group.
//!   All-reduce and reduce-scatter reduce within each group to its rank
//!   0, the two leaders swap the results, and each broadcasts or scatters
//!   the other group's result in its group ([`GroupTeams`]), a segment
//!   at a time; the
//!   all-gathers and all-to-alls are all-to-alls over the team of both
//!   groups in which a process sends nothing to its own group.
//!
//! Every blocking form is its non-blocking one's future driven to its end
//! at once, as for every other collective. There are no in-place forms on
//! an intercommunicator (the standard has none), nor scans.

use super::algorithms::{self, REDUCTION_SEGMENT};
use super::node::NodeRegion;
use super::op::Reduction;
use super::partition::{disjoint_blocks, uniform_blocks, BlockOwner, Partition, PartitionMut};
use super::schedule::AllToAllAlgorithm;
use super::team::{CollectiveTag, Sequence, Team};
use super::typed::{segment_ranges, Inbound, Outbound, Pieces, Segments};
use super::{block_of, in_collective};
use crate::comm::Communicator;
use crate::context;
use crate::datatype::{Buffer, BufferMut};
use crate::intercomm::RemoteGroup;
use crate::request::{Request, Scope};
use crate::{Error, ErrorClass, Result};
use oxmpi_adi::transport::PeerRank;
use std::borrow::Borrow;
use std::ops::Range;

/// The processes of a rooted collective: the root (index 0), then the
/// other group by rank. Each member's messages carry its index among both
/// groups, which keeps them apart from those of any other team on the
/// context.
struct Rooted {
    context: u32,
    /// The collective's numbered tag.
    tag: i32,
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
            self.tag,
            self.me,
            &self.world,
            Some(&self.sources),
        )
    }

    /// The group without the root, at one of its members.
    fn group(&self) -> Team<'_> {
        Team::new(
            self.context,
            self.tag,
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

    /// The end of a reduce or gather to the root, at the other group:
    /// its rank 0 sends `whole`, the group's result, to the root; then
    /// `in_group`, the outcome of the group's phase, which is reported
    /// only after the root has had its message, so that the root does not
    /// wait for one that never comes.
    async fn to_root(&self, whole: &[u8], in_group: Result<()>) -> Result<()> {
        if self.leads_group() {
            let all = self.all();
            all.complete(all.send(0, whole)).await?;
        }
        in_group
    }

    /// The root's part of a gather from the other group: the `parts` of
    /// `recv` (by rank there, disjoint) each received straight from its
    /// process, in place.
    async fn gather_at_root(&self, recv: &mut Pieces<'_>, parts: &[Range<usize>]) -> Result<()> {
        let mut recvs =
            recv.inbound_blocks(disjoint_blocks(recv.len(), parts, BlockOwner::Rank)?)?;
        // The root's own block (index 0) is empty.
        recvs.insert(0, Inbound::default());
        let all = self.all();
        all.complete(algorithms::gather_varcount(&all, 0, None, Some(recvs)))
            .await
    }

    /// The root's part of a scatter to the other group: the `parts` of
    /// `send` (by rank there) each sent straight to its process, as it
    /// lies.
    async fn scatter_from_root(&self, send: &Pieces<'_>, parts: &[Range<usize>]) -> Result<()> {
        // The root's own block (index 0) is empty.
        let sends = std::iter::once(Ok(Outbound::default()))
            .chain(parts.iter().map(|part| send.outbound(part.clone())))
            .collect::<Result<_>>()?;
        let all = self.all();
        all.complete(algorithms::scatter_varcount(&all, 0, Some(sends), None))
            .await
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
    /// The team of the rooted collective numbered `sequence`, of kind
    /// `kind`: from the root (`root` `None`) or from a member of the other
    /// group, whose root is `root` of the remote group.
    fn rooted(&self, sequence: Sequence, kind: CollectiveTag, root: Option<i32>) -> Result<Rooted> {
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
            tag: sequence.tag(kind),
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
        sends: Vec<Outbound<'_>>,
        recvs: Vec<Inbound<'_>>,
        algorithm: AllToAllAlgorithm,
    ) -> Result<()> {
        let remote = self.remote()?;
        let local_size = self.members().len();
        let team = self.both_groups_team(sequence, CollectiveTag::AllToAll)?;
        let mut all_sends: Vec<Outbound<'_>> =
            (0..team.size()).map(|_| Default::default()).collect();
        let mut all_recvs: Vec<Inbound<'_>> =
            (0..team.size()).map(|_| Default::default()).collect();
        for (rank, (send, recv)) in sends.into_iter().zip(recvs).enumerate() {
            let i = remote.index(false, rank, local_size);
            all_sends[i] = send;
            all_recvs[i] = recv;
        }
        team.complete(algorithms::all_to_all(
            &team, all_sends, all_recvs, algorithm,
        ))
        .await
    }

    /// Leaves in `acc`, at this group's leader, the reduction of the
    /// remote group's `acc`: each group reduces to its leader, and the
    /// leaders swap, the leader sending its group's reduction from
    /// `ours` (a copy of it, whose room serves every segment of the
    /// collective: one allocation, not one per segment). A mismatch of
    /// lengths between the leaders is returned second, for the caller to
    /// go on with its group first.
    async fn remote_reduction_at_leader(
        &self,
        teams: &GroupTeams<'_>,
        acc: &mut [u8],
        red: &Reduction<'_>,
        ours: &mut Vec<u8>,
    ) -> Result<Result<()>> {
        let local = teams.local();
        local
            .complete(algorithms::reduce(&local, 0, acc, red))
            .await?;
        if !teams.leads() {
            return Ok(Ok(()));
        }
        ours.clear();
        ours.extend_from_slice(acc);
        let leaders = teams.leaders();
        Ok(leaders
            .complete(leaders.send_receive(1, ours, 1, acc))
            .await)
    }

    /// The indices of the remote group's processes in the team of both
    /// groups (in their rank order).
    fn remote_indices(&self) -> Result<Range<usize>> {
        let remote = self.remote()?;
        let first = remote.index(false, 0, self.members().len());
        Ok(first..first + remote.members().len())
    }

    /// The all-reduce of an intercommunicator: `acc` holds this
    /// process's data and ends with the reduction of the remote group's.
    /// Where both groups share the region `node` (a blocking call, see
    /// [`Communicator::node_of_both_groups`]) and the data fits a slot,
    /// every process publishes its data there and combines the other
    /// group's in its rank order (no messages); else by messages, a
    /// segment of [`REDUCTION_SEGMENT`] at a time (the last always short,
    /// as the scans' are: the groups agree on no length first), so that
    /// no temporary holds more than a segment, after every process has
    /// announced its length in the region if there is one (so that a
    /// process whose data fits a slot and one whose data does not both
    /// fail, instead of waiting for each other).
    pub(crate) async fn inter_all_reduce(
        &self,
        sequence: Sequence,
        acc: &mut Segments<'_>,
        red: &Reduction<'_>,
        node: Option<&NodeRegion>,
    ) -> Result<()> {
        if let Some(node) = node {
            let (len, others) = (acc.len(), self.remote_indices()?);
            if node.all_reduces_other_group_by_slots(len, others.len()) {
                let data = acc.load(0..len)?;
                let number = sequence.0;
                in_collective(
                    "all-reduce",
                    node.all_reduce_other_group(number, data, red, others),
                )?;
                return acc.store(0..len);
            }
            in_collective("all-reduce", node.announce_to_all(sequence.0, len))?;
        }
        let teams = self.group_teams(sequence, CollectiveTag::AllReduce)?;
        // The first mismatch between the leaders, reported once the
        // group has had every segment.
        let (mut swapped, mut ours) = (Ok(()), Vec::new());
        let segments = acc.ranges_ending_short(REDUCTION_SEGMENT, red.unit_size());
        acc.each(segments, async |data| {
            let outcome = self
                .remote_reduction_at_leader(&teams, data, red, &mut ours)
                .await?;
            let local = teams.local();
            local
                .complete(algorithms::broadcast(&local, 0, &mut Pieces::Bytes(data)))
                .await?;
            if swapped.is_ok() {
                swapped = outcome;
            }
            Ok(())
        })
        .await?;
        swapped
    }

    /// The reduce-scatter of an intercommunicator: `input` holds this
    /// process's contribution to the remote group's blocks (both groups
    /// reduce as many elements), and `out` gets this process's block
    /// (`blocks` of the local group, by rank) of the reduction of the
    /// remote group's inputs. A segment of [`REDUCTION_SEGMENT`] at a
    /// time (the last short): reduced to the group's leader, swapped
    /// between the leaders, and its parts of the blocks scattered in the
    /// group, so that no temporary holds more than a segment.
    pub(crate) async fn inter_reduce_scatter<'p>(
        &self,
        sequence: Sequence,
        input: &mut Pieces<'p>,
        blocks: &[Range<usize>],
        out: &mut Pieces<'p>,
        red: &Reduction<'_>,
    ) -> Result<()> {
        let teams = self.group_teams(sequence, CollectiveTag::ReduceScatter)?;
        // The first mismatch between the leaders, reported once the
        // group has had every segment.
        let (mut swapped, mut ours) = (Ok(()), Vec::new());
        let local = teams.local();
        local
            .complete(algorithms::reduce_scatter_from_rank_0(
                &local,
                Some(input),
                blocks,
                out,
                red.unit_size(),
                async |acc| {
                    let outcome = self
                        .remote_reduction_at_leader(&teams, acc, red, &mut ours)
                        .await?;
                    if swapped.is_ok() {
                        swapped = outcome;
                    }
                    Ok(())
                },
            ))
            .await?;
        swapped
    }

    /// Takes part, as one of the root's group mates, in the rooted
    /// collective between the groups of this intercommunicator that a
    /// process of this group is the root of (`MPI_Bcast`, `MPI_Reduce`,
    /// `MPI_Gather(v)` or `MPI_Scatter(v)` with `MPI_PROC_NULL` as the
    /// root): it moves nothing, but counts the collective, as every
    /// process of both groups must call every collective in the same
    /// order. `MPI_ERR_COMM` on an intracommunicator.
    pub fn pass_remote_group_collective(&self) -> Result<()> {
        self.blocking(self.pass_future(self.next_collective()))
    }

    /// The non-blocking form of
    /// [`Communicator::pass_remote_group_collective`] (`MPI_Ibcast` ...
    /// with `MPI_PROC_NULL`): its request is complete at once. It borrows
    /// nothing, so it may be given any lifetime.
    pub fn immediate_pass_remote_group_collective<'a>(&self) -> Result<Request<'a>> {
        let comm = self.clone();
        let sequence = comm.next_collective();
        self.immediate_static(async move { comm.pass_future(sequence).await })
    }

    async fn pass_future(&self, _sequence: Sequence) -> Result<()> {
        self.remote().map(drop)
    }

    /// Broadcasts `buf` from this process, the root, to every process of
    /// the remote group of this intercommunicator (`MPI_Bcast` with
    /// `MPI_ROOT`); they call [`Communicator::broadcast_from_remote_group`]
    /// with this process's rank, and the root's group mates
    /// [`Communicator::pass_remote_group_collective`] (`MPI_PROC_NULL`).
    pub fn broadcast_to_remote_group<B: Buffer + ?Sized>(&self, buf: &B) -> Result<()> {
        self.blocking(self.broadcast_to_remote_future(self.next_collective(), buf))
    }

    /// The non-blocking form of [`Communicator::broadcast_to_remote_group`]
    /// (`MPI_Ibcast` with `MPI_ROOT`, §6.12): starts it and returns its
    /// request; the buffer stays borrowed until it completes.
    pub fn immediate_broadcast_to_remote_group<'a, B: Buffer + ?Sized>(
        &self,
        scope: &Scope<'a>,
        buf: &'a B,
    ) -> Result<Request<'a>> {
        let comm = self.clone();
        let sequence = comm.next_collective();
        self.immediate(scope, async move {
            comm.broadcast_to_remote_future(sequence, buf).await
        })
    }

    async fn broadcast_to_remote_future<B: Buffer + ?Sized>(
        &self,
        sequence: Sequence,
        buf: &B,
    ) -> Result<()> {
        // The root sends its data, as it lies (packed a piece at a time
        // where it is not contiguous), to the other group's rank 0, which
        // broadcasts it in its group (`broadcast_from_remote_future`): the
        // root's buffer is only read, so it needs no copy.
        let view = buf.view();
        let data = Pieces::of_view(&view)?;
        let team = self.rooted(sequence, CollectiveTag::Broadcast, None)?;
        let all = team.all();
        all.complete(async {
            all.exchange_data(vec![(1, data.outbound(0..data.len())?)], Vec::new())
                .await
        })
        .await
    }

    /// Receives into `buf` the broadcast of the process of rank `root` in
    /// the remote group of this intercommunicator (`MPI_Bcast` with the
    /// root's rank): every process of this group calls it.
    pub fn broadcast_from_remote_group<B: BufferMut + ?Sized>(
        &self,
        root: i32,
        buf: &mut B,
    ) -> Result<()> {
        self.blocking(self.broadcast_from_remote_future(self.next_collective(), root, buf))
    }

    /// The non-blocking form of
    /// [`Communicator::broadcast_from_remote_group`] (`MPI_Ibcast`,
    /// §6.12): starts it and returns its request; the buffer stays
    /// borrowed until it completes.
    pub fn immediate_broadcast_from_remote_group<'a, B: BufferMut + ?Sized>(
        &self,
        scope: &Scope<'a>,
        root: i32,
        buf: &'a mut B,
    ) -> Result<Request<'a>> {
        let comm = self.clone();
        let sequence = comm.next_collective();
        self.immediate(scope, async move {
            comm.broadcast_from_remote_future(sequence, root, buf).await
        })
    }

    async fn broadcast_from_remote_future<B: BufferMut + ?Sized>(
        &self,
        sequence: Sequence,
        root: i32,
        buf: &mut B,
    ) -> Result<()> {
        // Received in place, unpacked a piece at a time where the buffer
        // is not contiguous: by rank 0 from the root, then down this
        // group's broadcast from it.
        let mut data = Pieces::into_view(buf.view_mut())?;
        let team = self.rooted(sequence, CollectiveTag::Broadcast, Some(root))?;
        if team.leads_group() {
            let all = team.all();
            let len = data.len();
            all.complete(async {
                all.exchange_data(Vec::new(), vec![(0, data.inbound(0..len)?)])
                    .await
            })
            .await?;
        }
        let group = team.group();
        group
            .complete(algorithms::broadcast(&group, 0, &mut data))
            .await
    }

    /// Receives into `recv`, at this process, the root, the reduction by
    /// `op` of the `send` buffers of every process of the remote group
    /// (`MPI_Reduce` with `MPI_ROOT`), in their rank order; they call
    /// [`Communicator::reduce_to_remote_group`] with this process's rank,
    /// and the root's group mates
    /// [`Communicator::pass_remote_group_collective`].
    pub fn reduce_from_remote_group<R, O>(&self, recv: &mut R, op: O) -> Result<()>
    where
        R: BufferMut + ?Sized,
        O: super::Operation,
    {
        self.blocking(self.reduce_from_remote_future(self.next_collective(), recv, op))
    }

    /// The non-blocking form of [`Communicator::reduce_from_remote_group`]
    /// (`MPI_Ireduce` with `MPI_ROOT`, §6.12): starts it and returns its
    /// request; the buffer stays borrowed until it completes.
    pub fn immediate_reduce_from_remote_group<'a, R, O>(
        &self,
        scope: &Scope<'a>,
        recv: &'a mut R,
        op: O,
    ) -> Result<Request<'a>>
    where
        R: BufferMut + ?Sized,
        O: super::Operation + 'a,
    {
        let comm = self.clone();
        let sequence = comm.next_collective();
        self.immediate(scope, async move {
            comm.reduce_from_remote_future(sequence, recv, op).await
        })
    }

    async fn reduce_from_remote_future<R, O>(
        &self,
        sequence: Sequence,
        recv: &mut R,
        op: O,
    ) -> Result<()>
    where
        R: BufferMut + ?Sized,
        O: super::Operation,
    {
        let (mut recv, element_type) = Pieces::into_buffer(recv)?;
        // The operation is checked for the type here as at the senders.
        let red = Reduction::new(&op, element_type)?;
        let team = self.rooted(sequence, CollectiveTag::Reduce, None)?;
        let all = team.all();
        // A message a segment, the last short (see `reduce_to_remote_future`).
        for segment in segment_ranges(recv.len(), REDUCTION_SEGMENT, red.unit_size(), true) {
            let room = recv.inbound(segment)?;
            all.complete(all.exchange_data(Vec::new(), vec![(1, room)]))
                .await?;
        }
        Ok(())
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
        self.blocking(self.reduce_to_remote_future(self.next_collective(), root, send, op))
    }

    /// The non-blocking form of [`Communicator::reduce_to_remote_group`]
    /// (`MPI_Ireduce`, §6.12): starts it and returns its request; the
    /// buffer stays borrowed until it completes.
    pub fn immediate_reduce_to_remote_group<'a, S, O>(
        &self,
        scope: &Scope<'a>,
        root: i32,
        send: &'a S,
        op: O,
    ) -> Result<Request<'a>>
    where
        S: Buffer + ?Sized,
        O: super::Operation + 'a,
    {
        let comm = self.clone();
        let sequence = comm.next_collective();
        self.immediate(scope, async move {
            comm.reduce_to_remote_future(sequence, root, send, op).await
        })
    }

    async fn reduce_to_remote_future<S, O>(
        &self,
        sequence: Sequence,
        root: i32,
        send: &S,
        op: O,
    ) -> Result<()>
    where
        S: Buffer + ?Sized,
        O: super::Operation,
    {
        let (send, element_type) = Pieces::of_buffer(send)?;
        let red = Reduction::new(&op, element_type)?;
        let mut acc = Segments::new(Some(send), None)?;
        let team = self.rooted(sequence, CollectiveTag::Reduce, Some(root))?;
        let group = team.group();
        // A segment at a time (the last short, as the root cuts its
        // receive alike): reduced in the group, then sent to the root. The
        // group's first failure is reported once the root has had every
        // segment.
        let mut in_group = Ok(());
        let segments = acc.ranges_ending_short(REDUCTION_SEGMENT, red.unit_size());
        acc.each(segments, async |data| {
            let reduced = group
                .complete(algorithms::reduce(&group, 0, data, &red))
                .await;
            if in_group.is_ok() {
                in_group = reduced;
            }
            team.to_root(data, Ok(())).await
        })
        .await?;
        in_group
    }

    /// Gathers, at this process, the root, the `send` buffers of every
    /// process of the remote group into `recv`, in their rank order
    /// (`MPI_Gather` with `MPI_ROOT`); `recv` holds one block per process
    /// there. They call [`Communicator::gather_to_remote_group`] with
    /// this process's rank, and the root's group mates
    /// [`Communicator::pass_remote_group_collective`].
    pub fn gather_from_remote_group<R: BufferMut + ?Sized>(&self, recv: &mut R) -> Result<()> {
        self.blocking(self.gather_from_remote_future(self.next_collective(), recv))
    }

    /// The non-blocking form of [`Communicator::gather_from_remote_group`]
    /// (`MPI_Igather` with `MPI_ROOT`, §6.12): starts it and returns its
    /// request; the buffer stays borrowed until it completes.
    pub fn immediate_gather_from_remote_group<'a, R: BufferMut + ?Sized>(
        &self,
        scope: &Scope<'a>,
        recv: &'a mut R,
    ) -> Result<Request<'a>> {
        let comm = self.clone();
        let sequence = comm.next_collective();
        self.immediate(scope, async move {
            comm.gather_from_remote_future(sequence, recv).await
        })
    }

    async fn gather_from_remote_future<R: BufferMut + ?Sized>(
        &self,
        sequence: Sequence,
        recv: &mut R,
    ) -> Result<()> {
        let (mut recv, element_type) = Pieces::into_buffer(recv)?;
        let team = self.rooted(sequence, CollectiveTag::Gather, None)?;
        let n = team.world.len() - 1;
        let block = block_of(recv.len(), n, element_type, "the receive buffer")?;
        team.gather_at_root(&mut recv, &uniform_blocks(n, block))
            .await
    }

    /// Sends `send` to the process of rank `root` in the remote group,
    /// which gathers every process's of this group
    /// (`MPI_Gather` with the root's rank; it calls
    /// [`Communicator::gather_from_remote_group`]). Every process of this
    /// group calls it, with blocks of one length.
    pub fn gather_to_remote_group<S: Buffer + ?Sized>(&self, root: i32, send: &S) -> Result<()> {
        self.blocking(self.gather_to_remote_future(self.next_collective(), root, send))
    }

    /// The non-blocking form of [`Communicator::gather_to_remote_group`]
    /// (`MPI_Igather`, §6.12): starts it and returns its request; the
    /// buffer stays borrowed until it completes.
    pub fn immediate_gather_to_remote_group<'a, S: Buffer + ?Sized>(
        &self,
        scope: &Scope<'a>,
        root: i32,
        send: &'a S,
    ) -> Result<Request<'a>> {
        let comm = self.clone();
        let sequence = comm.next_collective();
        self.immediate(scope, async move {
            comm.gather_to_remote_future(sequence, root, send).await
        })
    }

    /// A process's part of a gather (of equal or varying counts) to the
    /// root `root` of the remote group: its `send` goes straight to the
    /// root, as it lies.
    async fn gather_to_remote_future<S: Buffer + ?Sized>(
        &self,
        sequence: Sequence,
        root: i32,
        send: &S,
    ) -> Result<()> {
        let (send, _) = Pieces::of_buffer(send)?;
        let team = self.rooted(sequence, CollectiveTag::Gather, Some(root))?;
        let all = team.all();
        let send = send.outbound(0..send.len())?;
        all.complete(algorithms::gather_varcount(&all, 0, Some(send), None))
            .await
    }

    /// Gathers, at this process, the root, the `send` buffers of every
    /// process of the remote group, of any lengths, into the blocks of
    /// `recv` (`MPI_Gatherv` with `MPI_ROOT`): block `i` (count and
    /// displacement `i`, which must not overlap) receives rank `i`'s.
    /// They call [`Communicator::gather_varcount_to_remote_group`], and
    /// the root's group mates
    /// [`Communicator::pass_remote_group_collective`].
    pub fn gather_varcount_from_remote_group<R, C, D>(
        &self,
        recv: &mut PartitionMut<'_, R, C, D>,
    ) -> Result<()>
    where
        R: BufferMut + ?Sized,
        C: Borrow<[i32]>,
        D: Borrow<[i32]>,
    {
        self.blocking(self.gather_varcount_from_remote_future(self.next_collective(), recv))
    }

    /// The non-blocking form of
    /// [`Communicator::gather_varcount_from_remote_group`] (`MPI_Igatherv`
    /// with `MPI_ROOT`, §6.12): starts it and returns its request; the
    /// buffer stays borrowed until it completes.
    pub fn immediate_gather_varcount_from_remote_group<'a, R, C, D>(
        &self,
        scope: &Scope<'a>,
        mut recv: PartitionMut<'a, R, C, D>,
    ) -> Result<Request<'a>>
    where
        R: BufferMut + ?Sized,
        C: Borrow<[i32]> + 'a,
        D: Borrow<[i32]> + 'a,
    {
        let comm = self.clone();
        let sequence = comm.next_collective();
        self.immediate(scope, async move {
            comm.gather_varcount_from_remote_future(sequence, &mut recv)
                .await
        })
    }

    async fn gather_varcount_from_remote_future<R, C, D>(
        &self,
        sequence: Sequence,
        recv: &mut PartitionMut<'_, R, C, D>,
    ) -> Result<()>
    where
        R: BufferMut + ?Sized,
        C: Borrow<[i32]>,
        D: Borrow<[i32]>,
    {
        let team = self.rooted(sequence, CollectiveTag::Gather, None)?;
        let (parts, mut recv) = recv.pieces(BlockOwner::Rank, team.world.len() - 1)?;
        team.gather_at_root(&mut recv, &parts).await
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
        self.blocking(self.gather_to_remote_future(self.next_collective(), root, send))
    }

    /// The non-blocking form of
    /// [`Communicator::gather_varcount_to_remote_group`] (`MPI_Igatherv`,
    /// §6.12): starts it and returns its request; the buffer stays
    /// borrowed until it completes.
    pub fn immediate_gather_varcount_to_remote_group<'a, S: Buffer + ?Sized>(
        &self,
        scope: &Scope<'a>,
        root: i32,
        send: &'a S,
    ) -> Result<Request<'a>> {
        let comm = self.clone();
        let sequence = comm.next_collective();
        self.immediate(scope, async move {
            comm.gather_to_remote_future(sequence, root, send).await
        })
    }

    /// Scatters `send`, at this process, the root, to the processes of
    /// the remote group: block `i` of its equal blocks, one per process
    /// there, to rank `i` (`MPI_Scatter` with `MPI_ROOT`). They call
    /// [`Communicator::scatter_from_remote_group`] with this process's
    /// rank, and the root's group mates
    /// [`Communicator::pass_remote_group_collective`].
    pub fn scatter_to_remote_group<S: Buffer + ?Sized>(&self, send: &S) -> Result<()> {
        self.blocking(self.scatter_to_remote_future(self.next_collective(), send))
    }

    /// The non-blocking form of [`Communicator::scatter_to_remote_group`]
    /// (`MPI_Iscatter` with `MPI_ROOT`, §6.12): starts it and returns its
    /// request; the buffer stays borrowed until it completes.
    pub fn immediate_scatter_to_remote_group<'a, S: Buffer + ?Sized>(
        &self,
        scope: &Scope<'a>,
        send: &'a S,
    ) -> Result<Request<'a>> {
        let comm = self.clone();
        let sequence = comm.next_collective();
        self.immediate(scope, async move {
            comm.scatter_to_remote_future(sequence, send).await
        })
    }

    async fn scatter_to_remote_future<S: Buffer + ?Sized>(
        &self,
        sequence: Sequence,
        send: &S,
    ) -> Result<()> {
        let (send, element_type) = Pieces::of_buffer(send)?;
        let team = self.rooted(sequence, CollectiveTag::Scatter, None)?;
        let n = team.world.len() - 1;
        let block = block_of(send.len(), n, element_type, "the send buffer")?;
        team.scatter_from_root(&send, &uniform_blocks(n, block))
            .await
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
        self.blocking(self.scatter_from_remote_future(self.next_collective(), root, recv))
    }

    /// The non-blocking form of [`Communicator::scatter_from_remote_group`]
    /// (`MPI_Iscatter`, §6.12): starts it and returns its request; the
    /// buffer stays borrowed until it completes.
    pub fn immediate_scatter_from_remote_group<'a, R: BufferMut + ?Sized>(
        &self,
        scope: &Scope<'a>,
        root: i32,
        recv: &'a mut R,
    ) -> Result<Request<'a>> {
        let comm = self.clone();
        let sequence = comm.next_collective();
        self.immediate(scope, async move {
            comm.scatter_from_remote_future(sequence, root, recv).await
        })
    }

    /// A process's part of a scatter (of equal or varying counts) from the
    /// root `root` of the remote group: its block comes straight from the
    /// root into `recv`, as it lies.
    async fn scatter_from_remote_future<R: BufferMut + ?Sized>(
        &self,
        sequence: Sequence,
        root: i32,
        recv: &mut R,
    ) -> Result<()> {
        let (mut recv, _) = Pieces::into_buffer(recv)?;
        let team = self.rooted(sequence, CollectiveTag::Scatter, Some(root))?;
        let all = team.all();
        let recv = recv.inbound(0..recv.len())?;
        all.complete(algorithms::scatter_varcount(&all, 0, None, Some(recv)))
            .await
    }

    /// Scatters the blocks of `send`, of any lengths, at this process,
    /// the root, to the processes of the remote group: block `i` (count
    /// and displacement `i`) to rank `i` (`MPI_Scatterv` with
    /// `MPI_ROOT`). They call
    /// [`Communicator::scatter_varcount_from_remote_group`], and the
    /// root's group mates [`Communicator::pass_remote_group_collective`].
    pub fn scatter_varcount_to_remote_group<S, C, D>(
        &self,
        send: &Partition<'_, S, C, D>,
    ) -> Result<()>
    where
        S: Buffer + ?Sized,
        C: Borrow<[i32]>,
        D: Borrow<[i32]>,
    {
        self.blocking(self.scatter_varcount_to_remote_future(self.next_collective(), send))
    }

    /// The non-blocking form of
    /// [`Communicator::scatter_varcount_to_remote_group`] (`MPI_Iscatterv`
    /// with `MPI_ROOT`, §6.12): starts it and returns its request; the
    /// buffer stays borrowed until it completes.
    pub fn immediate_scatter_varcount_to_remote_group<'a, S, C, D>(
        &self,
        scope: &Scope<'a>,
        send: Partition<'a, S, C, D>,
    ) -> Result<Request<'a>>
    where
        S: Buffer + ?Sized,
        C: Borrow<[i32]> + 'a,
        D: Borrow<[i32]> + 'a,
    {
        let comm = self.clone();
        let sequence = comm.next_collective();
        self.immediate(scope, async move {
            comm.scatter_varcount_to_remote_future(sequence, &send)
                .await
        })
    }

    async fn scatter_varcount_to_remote_future<S, C, D>(
        &self,
        sequence: Sequence,
        send: &Partition<'_, S, C, D>,
    ) -> Result<()>
    where
        S: Buffer + ?Sized,
        C: Borrow<[i32]>,
        D: Borrow<[i32]>,
    {
        let team = self.rooted(sequence, CollectiveTag::Scatter, None)?;
        let (parts, send) = send.pieces(BlockOwner::Rank, team.world.len() - 1)?;
        team.scatter_from_root(&send, &parts).await
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
        self.blocking(self.scatter_from_remote_future(self.next_collective(), root, recv))
    }

    /// The non-blocking form of
    /// [`Communicator::scatter_varcount_from_remote_group`]
    /// (`MPI_Iscatterv`, §6.12): starts it and returns its request; the
    /// buffer stays borrowed until it completes.
    pub fn immediate_scatter_varcount_from_remote_group<'a, R: BufferMut + ?Sized>(
        &self,
        scope: &Scope<'a>,
        root: i32,
        recv: &'a mut R,
    ) -> Result<Request<'a>> {
        let comm = self.clone();
        let sequence = comm.next_collective();
        self.immediate(scope, async move {
            comm.scatter_from_remote_future(sequence, root, recv).await
        })
    }
}
