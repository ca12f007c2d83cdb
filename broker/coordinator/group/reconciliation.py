"""A member's next step towards its part of the target assignment (Kafka's
CurrentAssignmentBuilder; KIP-848, "Assignment Reconciliation"). Pure: no I/O, no group.

Revoke before assign: a member first gives up the partitions the target takes from it (state
UNREVOKED_PARTITIONS, its epoch unchanged) and gets new ones only once it reported them gone;
a partition another member still owns is withheld (UNRELEASED_PARTITIONS) until released.
Members whose part does not change move to the new epoch at once, without any pause.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from uuid import UUID

from broker.coordinator.group.consumer_group import MemberState
from broker.coordinator.group.consumer_records import Assignment


class FencedMember(Exception):  # noqa: N818 - Kafka's FencedMemberEpochException
    """The member is in a state this coordinator cannot reconcile: it must rejoin."""


@dataclass(frozen=True)
class NextAssignment:
    member_epoch: int
    previous_member_epoch: int
    state: MemberState
    assigned: Assignment
    pending_revocation: Assignment


def _owns_any(owned: Assignment | None, partitions: Assignment) -> bool:
    """Whether the member may still own some of `partitions` (unknown when it did not say)."""
    if owned is None:
        return True
    return any(owned.get(tid, frozenset()) & parts for tid, parts in partitions.items())


def reconcile(current: NextAssignment, target_epoch: int, target: Assignment,
              partition_epoch: Callable[[UUID, int], int], owned: Assignment | None) -> NextAssignment:
    """`current`: the member as it stands; `partition_epoch(topic, p)`: the epoch of the member
    owning the partition, -1 when free; `owned`: what the member's heartbeat says it owns (None
    when the heartbeat did not carry it)."""
    state = current.state
    if state is MemberState.STABLE:
        if current.member_epoch != target_epoch:
            return _next(current, current.member_epoch, target_epoch, target, partition_epoch, owned)
        return current
    if state is MemberState.UNREVOKED_PARTITIONS:
        if _owns_any(owned, current.pending_revocation):
            return current
        return _next(current, current.member_epoch + 1, target_epoch, target, partition_epoch, owned)
    if state is MemberState.UNRELEASED_PARTITIONS:
        return _next(current, current.member_epoch, target_epoch, target, partition_epoch, owned)
    if owned is None or any(owned.values()):
        raise FencedMember("the member is in an unknown state: it must give up its partitions and rejoin")
    return _next(current, target_epoch, target_epoch, target, partition_epoch, owned)


def _next(current: NextAssignment, epoch: int, target_epoch: int, target: Assignment,
          partition_epoch: Callable[[UUID, int], int], owned: Assignment | None) -> NextAssignment:
    unreleased = False
    assigned: Assignment = {}
    revoking: Assignment = {}
    pending: dict[UUID, set[int]] = {}
    for tid in set(target) | set(current.assigned):
        want = target.get(tid, frozenset())
        have = current.assigned.get(tid, frozenset())
        keep = have & want
        if keep:
            assigned[tid] = frozenset(keep)
        if have - keep:
            revoking[tid] = frozenset(have - keep)
        free = set()
        for p in want - keep:
            if partition_epoch(tid, p) == -1:
                free.add(p)
            else:
                unreleased = True
        if free:
            pending[tid] = free
    if revoking and _owns_any(owned, revoking):
        # keep the epoch and ask for the revocation first
        return NextAssignment(epoch, current.member_epoch, MemberState.UNREVOKED_PARTITIONS, assigned, revoking)
    for tid, parts in pending.items():
        assigned[tid] = assigned.get(tid, frozenset()) | parts
    state = MemberState.UNRELEASED_PARTITIONS if unreleased else MemberState.STABLE
    return NextAssignment(target_epoch, current.member_epoch, state, assigned, {})
