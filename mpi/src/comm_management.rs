//! Making, comparing and freeing communicators (MPI 4.1 §7.4).
//!
//! Every constructor is collective: over the parent communicator
//! ([`Communicator::duplicate`], the splits,
//! [`Communicator::split_by_subgroup_collective`]) or over the new
//! communicator's members only ([`Communicator::split_by_subgroup`]). Each
//! agrees with the other processes on the new communicator's context id
//! (see `context`), so its messages never match another communicator's.
//!
//! A communicator the program made is freed when its last handle is
//! dropped, or by [`Communicator::free`]; its context id then goes back
//! to the pool, to be agreed on again by a later communicator.

use crate::collective::algorithms::all_gather;
use crate::collective::engine::block_on;
use crate::collective::team::{CollectiveTag, Team};
use crate::collective::typed::{Input, Output};
use crate::comm::{Communicator, Inherit, TAG_UB};
use crate::context;
use crate::group::{Group, GroupRelation};
use crate::{Error, ErrorClass, ErrorHandler, Result};
use oxmpi_adi::host::HostId;
use oxmpi_adi::transport::PeerRank;

/// The colour of a process in a split ([`Communicator::split_by_color`]):
/// processes of one colour form one new communicator; those of the
/// undefined colour (`MPI_UNDEFINED`) get none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Color(Option<i32>);

impl Color {
    /// The undefined colour (`MPI_UNDEFINED`): no new communicator.
    pub fn undefined() -> Color {
        Color(None)
    }

    /// The colour `value`, which must not be negative (else the split is
    /// an `MPI_ERR_ARG` error).
    pub fn with_value(value: i32) -> Color {
        Color(Some(value))
    }
}

/// How two communicators relate (`MPI_Comm_compare`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommunicatorRelation {
    /// Handles on the same communicator (`MPI_IDENT`).
    Identical,
    /// Different contexts, the same members in the same order
    /// (`MPI_CONGRUENT`).
    Congruent,
    /// Different contexts, the same members in another order
    /// (`MPI_SIMILAR`).
    Similar,
    /// Different members (`MPI_UNEQUAL`).
    Unequal,
}

/// The longest communicator name kept, in bytes (MPICH's
/// `MPI_MAX_OBJECT_NAME` less the C string's terminator).
pub const MAX_OBJECT_NAME: usize = 127;

/// A split's key for a process of undefined colour, in the exchange of
/// colours (real colours are not negative).
const UNDEFINED_COLOR: i32 = -1;

impl Communicator {
    /// A new communicator with the same members in the same order and a
    /// new context (`MPI_Comm_dup`). Collective.
    ///
    /// The duplicate has this communicator's error handler, hints
    /// ([`Communicator::set_info`]), topology, and the attributes whose
    /// keyvals' copy callbacks copy them ([`crate::attribute`]); a copy
    /// callback's error fails the call. An intercommunicator's duplicate
    /// is an intercommunicator of the same groups.
    pub fn duplicate(&self) -> Result<Communicator> {
        self.handled(self.duplicate_unhandled())
    }

    /// [`Communicator::duplicate`] with the hints `info` instead of this
    /// communicator's (`MPI_Comm_dup_with_info`). Collective.
    #[doc(alias = "MPI_Comm_dup_with_info")]
    pub fn duplicate_with_info(&self, info: &crate::Info) -> Result<Communicator> {
        let duplicate = self.duplicate_unhandled().and_then(|dup| {
            *dup.info_slot()? = info.clone();
            Ok(dup)
        });
        self.handled(duplicate)
    }

    pub(crate) fn duplicate_unhandled(&self) -> Result<Communicator> {
        if self.is_inter_communicator() {
            return self.duplicate_inter();
        }
        self.copy_inheriting(Inherit::Everything)
    }

    /// A copy of this intracommunicator for an object of MPI's own to
    /// work on (`what`: a window, MPI 4.1 §12.2): the same group in a
    /// context of its own, with `handler` for error handler and none of
    /// this one's attributes, hints or topology. MPI 4.1 runs attribute
    /// copy callbacks when a communicator is duplicated (`MPI_COMM_DUP`,
    /// `MPI_COMM_IDUP` and their `_WITH_INFO` forms, §7.7.2) and says
    /// nothing of an object's internal copy, so the program's callbacks
    /// do not see it made, nor deleted when the object goes. Collective.
    pub(crate) fn private_copy(&self, what: &str, handler: ErrorHandler) -> Result<Communicator> {
        self.require_intra(what)?;
        let copy = self.copy_inheriting(Inherit::ErrorHandler)?;
        copy.set_error_handler(handler);
        Ok(copy)
    }

    /// A communicator of this one's group in a newly agreed context, with
    /// what it `inherits` of this one. Collective.
    fn copy_inheriting(&self, inherits: Inherit) -> Result<Communicator> {
        let team = self.team(self.next_collective(), CollectiveTag::Communicator)?;
        let id = team.run(|t| context::agree(t, self.agreement_priority(0), true))?;
        self.with_context(&self.group(), id, inherits)?
            .ok_or_else(not_a_member)
    }

    /// Splits the communicator by colour (`MPI_Comm_split` with key 0):
    /// the processes of each colour form a new communicator, ranked as
    /// they are here; the undefined colour gives `None`. Collective.
    pub fn split_by_color(&self, color: Color) -> Result<Option<Communicator>> {
        self.split_by_color_with_key(color, 0)
    }

    /// Splits the communicator by colour (`MPI_Comm_split`): the
    /// processes of each colour form a new communicator, ranked by `key`
    /// and, among equal keys, by their rank here; the undefined colour
    /// gives `None`. Collective.
    pub fn split_by_color_with_key(&self, color: Color, key: i32) -> Result<Option<Communicator>> {
        self.handled(self.split_unhandled(color, key))
    }

    /// [`Communicator::split_by_color_with_key`], its errors not handled.
    pub(crate) fn split_unhandled(&self, color: Color, key: i32) -> Result<Option<Communicator>> {
        self.require_intra("a split")?;
        // The number first, so that a colour refused here alone leaves the
        // count in step with the others'.
        let sequence = self.next_collective();
        if let Color(Some(value)) = color {
            if value < 0 {
                return Err(Error::new(
                    ErrorClass::Arg,
                    format!(
                        "colour {value} is negative: use Color::undefined() for no communicator"
                    ),
                ));
            }
        }
        let team = self.team(sequence, CollectiveTag::Communicator)?;
        team.run(|t| self.split(t, color.0, key))
    }

    /// Splits the communicator into one per host
    /// (`MPI_Comm_split_type` with `MPI_COMM_TYPE_SHARED`): the processes
    /// that can share memory, as the shared-memory transport sees them
    /// (one kernel and network namespace, [`HostId`]), ranked by `key`
    /// and then by their rank here. Collective.
    pub fn split_shared(&self, key: i32) -> Result<Communicator> {
        self.handled(self.split_shared_unhandled(key))
    }

    fn split_shared_unhandled(&self, key: i32) -> Result<Communicator> {
        self.require_intra("a split by host")?;
        let team = self.team(self.next_collective(), CollectiveTag::Communicator)?;
        let host = HostId::current().map_err(|e| Error::os("learning the host identity", e));
        // A process that cannot tell its host still takes part (with no
        // colour), so that the others do not wait for it.
        let mine = host.as_ref().map_or([0; 32], HostId::key);
        let split = team.run(|t| {
            let mut keys = vec![0u8; 32 * t.size()];
            block_on(all_gather(t, &mine, &mut keys))?;
            let color = host
                .is_ok()
                .then(|| {
                    let first = keys.chunks_exact(32).position(|k| k == mine.as_slice());
                    first.map(|rank| rank as i32)
                })
                .flatten();
            self.split(t, color, key)
        })?;
        host?;
        split.ok_or_else(not_a_member)
    }

    /// The split of `t` (all members of this communicator): exchanges
    /// colours and keys, agrees on one context id for all the new
    /// communicators (their members are disjoint), and makes this
    /// process's.
    fn split(&self, t: &Team, color: Option<i32>, key: i32) -> Result<Option<Communicator>> {
        let mine = [color.unwrap_or(UNDEFINED_COLOR), key];
        let mut all = vec![0i32; 2 * t.size()];
        let mine = Input::new(&mine)?;
        let mut gathered = Output::new(&mut all[..])?;
        block_on(all_gather(t, mine.bytes(), gathered.bytes_mut()))?;
        gathered.finish()?;
        let id = context::agree(t, self.agreement_priority(0), color.is_some())?;
        let Some(color) = color else {
            return Ok(None);
        };
        let pairs: Vec<(i32, i32)> = all.chunks_exact(2).map(|p| (p[0], p[1])).collect();
        let world = self.group();
        let members: Vec<PeerRank> = split_members(&pairs, color)
            .into_iter()
            .map(|rank| world.world_ranks()[rank])
            .collect();
        self.with_context(&world.with_members(members), id, Inherit::ErrorHandler)
    }

    /// A communicator of the members of `group`, a subgroup of this
    /// communicator's (`MPI_Comm_create`): `None` at the processes
    /// outside it. Collective over this communicator; each process may
    /// pass another group as long as the groups are disjoint or equal.
    /// A group with processes outside this communicator is an
    /// `MPI_ERR_GROUP` error.
    pub fn split_by_subgroup_collective(&self, group: &Group) -> Result<Option<Communicator>> {
        self.handled(self.subgroup_collective(group))
    }

    /// [`Communicator::split_by_subgroup_collective`], its errors not
    /// handled.
    pub(crate) fn subgroup_collective(&self, group: &Group) -> Result<Option<Communicator>> {
        self.require_intra("a communicator of a subgroup")?;
        let team = self.team(self.next_collective(), CollectiveTag::Communicator)?;
        self.ranks_of(group)?;
        let id =
            team.run(|t| context::agree(t, self.agreement_priority(0), group.rank().is_some()))?;
        self.with_context(group, id, Inherit::ErrorHandler)
    }

    /// A communicator of the members of `group`, a subgroup of this
    /// communicator's (`MPI_Comm_create_group` with tag 0): collective
    /// over the group's members only. `None` at a process outside the
    /// group (which takes no part).
    pub fn split_by_subgroup(&self, group: &Group) -> Result<Option<Communicator>> {
        self.split_by_subgroup_with_tag(group, 0)
    }

    /// [`Communicator::split_by_subgroup`] with `tag` (`0..=TAG_UB`),
    /// which tells apart concurrent calls of several threads
    /// (`MPI_Comm_create_group`).
    pub fn split_by_subgroup_with_tag(
        &self,
        group: &Group,
        tag: i32,
    ) -> Result<Option<Communicator>> {
        self.handled(self.subgroup_with_tag(group, tag))
    }

    fn subgroup_with_tag(&self, group: &Group, tag: i32) -> Result<Option<Communicator>> {
        self.require_intra("a communicator of a subgroup")?;
        if !(0..=TAG_UB).contains(&tag) {
            return Err(Error::new(
                ErrorClass::Tag,
                format!("tag {tag} is invalid: tags are 0..={TAG_UB}"),
            ));
        }
        let sources = self.ranks_of(group)?;
        let Some(rank) = group.rank() else {
            return Ok(None);
        };
        // The group's own collective, on this communicator's collective
        // context: the program's tag (collectives use negative ones) and
        // the members' ranks here as sources keep it apart from every
        // other group's.
        let team = Team::new(
            context::collective(self.context_id()),
            tag,
            rank as usize,
            group.world_ranks(),
            Some(&sources),
        );
        let id = team.run(|t| context::agree(t, self.agreement_priority(tag as u32 + 1), true))?;
        self.with_context(group, id, Inherit::ErrorHandler)
    }

    /// How this communicator relates to `other` (`MPI_Comm_compare`). Two
    /// intercommunicators compare by both their local and their remote
    /// groups (the weaker relation of the two); an intercommunicator and
    /// an intracommunicator are unequal.
    pub fn compare(&self, other: &Communicator) -> CommunicatorRelation {
        if self.same_as(other) {
            return CommunicatorRelation::Identical;
        }
        let mut relation = self.group().compare(&other.group());
        match (self.remote_members(), other.remote_members()) {
            (Some(mine), Some(theirs)) => {
                let me = self.group();
                let mine = me.with_members(mine.members().to_vec());
                let theirs = me.with_members(theirs.members().to_vec());
                relation = match (relation, mine.compare(&theirs)) {
                    (GroupRelation::Unequal, _) | (_, GroupRelation::Unequal) => {
                        GroupRelation::Unequal
                    }
                    (GroupRelation::Similar, _) | (_, GroupRelation::Similar) => {
                        GroupRelation::Similar
                    }
                    _ => GroupRelation::Identical,
                }
            }
            (None, None) => {}
            _ => relation = GroupRelation::Unequal,
        }
        match relation {
            GroupRelation::Identical => CommunicatorRelation::Congruent,
            GroupRelation::Similar => CommunicatorRelation::Similar,
            GroupRelation::Unequal => CommunicatorRelation::Unequal,
        }
    }

    /// Frees the communicator (`MPI_Comm_free`): its other handles fail
    /// every call with `MPI_ERR_COMM` from now on, and its context id
    /// goes back to the pool once the last of them is dropped (dropping
    /// every handle frees it as well). Operations already started
    /// complete normally. Freeing the world or self communicator, or one
    /// already freed, is an `MPI_ERR_COMM` error.
    ///
    /// The delete callbacks of its attributes run first
    /// ([`crate::attribute`]); if one fails, the communicator is freed
    /// all the same and the call returns that error.
    pub fn free(self) -> Result<()> {
        let result = self.free_unhandled();
        self.handled(result)
    }

    fn free_unhandled(&self) -> Result<()> {
        if !self.is_created() {
            return Err(Error::new(
                ErrorClass::Comm,
                "the world and self communicators cannot be freed",
            ));
        }
        // The callbacks run without the attributes locked: they may use
        // the communicator's other attributes.
        let mut attributes = std::mem::take(&mut *self.attributes()?);
        let deleted = attributes.delete_all();
        if !self.mark_freed() {
            return Err(Error::new(
                ErrorClass::Comm,
                "this communicator was already freed",
            ));
        }
        deleted
    }

    /// Names the communicator, at this process only (`MPI_Comm_set_name`,
    /// MPI 4.1 §7.10): trailing spaces are dropped, and a name longer
    /// than [`MAX_OBJECT_NAME`] bytes is cut there. A new communicator,
    /// duplicates included, starts without a name.
    pub fn set_name(&self, name: &str) -> Result<()> {
        let mut name = name.trim_end_matches(' ');
        if name.len() > MAX_OBJECT_NAME {
            let cut = (0..=MAX_OBJECT_NAME)
                .rev()
                .find(|&i| name.is_char_boundary(i))
                .unwrap_or(0);
            name = &name[..cut];
        }
        let named = self.name().map(|mut slot| *slot = name.to_owned());
        self.handled(named)
    }

    /// The communicator's name (`MPI_Comm_get_name`): `MPI_COMM_WORLD`
    /// and `MPI_COMM_SELF` for those, else what [`Communicator::set_name`]
    /// gave it here, or the empty string.
    pub fn get_name(&self) -> Result<String> {
        self.handled(self.name().map(|name| name.clone()))
    }

    /// The rank here of each member of `group`; an `MPI_ERR_GROUP` error
    /// if one is not a member of this communicator.
    fn ranks_of(&self, group: &Group) -> Result<Vec<i32>> {
        let ranks: Vec<i32> = (0..group.size()).collect();
        group
            .translate_ranks(&ranks, &self.group())?
            .into_iter()
            .collect::<Option<Vec<i32>>>()
            .ok_or_else(|| {
                Error::new(
                    ErrorClass::Group,
                    "the group has processes that are not in the communicator",
                )
            })
    }

    /// The priority of an agreement on a context id over this
    /// communicator (see `context::agree`); `detail` tells apart
    /// agreements on one communicator.
    pub(crate) fn agreement_priority(&self, detail: u32) -> u64 {
        (u64::from(self.context_id()) << 32) | u64::from(detail)
    }
}

/// The ranks (indices of `pairs`, each a rank's colour and key) of the
/// new communicator of `color`, in their new order: by key, then by rank.
fn split_members(pairs: &[(i32, i32)], color: i32) -> Vec<usize> {
    let mut chosen: Vec<(i32, usize)> = pairs
        .iter()
        .enumerate()
        .filter(|(_, &(c, _))| c == color)
        .map(|(rank, &(_, key))| (key, rank))
        .collect();
    chosen.sort_unstable();
    chosen.into_iter().map(|(_, rank)| rank).collect()
}

/// The error of a process that should be in the communicator it made.
fn not_a_member() -> Error {
    Error::new(
        ErrorClass::Intern,
        "this process is not a member of the communicator it made",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_orders_by_key_then_rank() {
        // Colours and keys of ranks 0..10; rank 2 takes no part.
        let colors = [0, 0, UNDEFINED_COLOR, 3, 0, 3, 0, 0, 5, 3];
        let keys = [3, 1, 2, 5, 1, 1, 1, 2, 1, 0];
        let pairs: Vec<(i32, i32)> = colors.into_iter().zip(keys).collect();
        assert_eq!(split_members(&pairs, 0), [1, 4, 6, 7, 0]);
        assert_eq!(split_members(&pairs, 3), [9, 5, 3]);
        assert_eq!(split_members(&pairs, 5), [8]);
        assert_eq!(split_members(&pairs, 7), Vec::<usize>::new());
    }
}
