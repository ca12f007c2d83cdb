"""Undoing what a consumer group operation changed in memory when its records are not written.

Kafka keeps a group's state in timeline structures and, when an append to __consumer_offsets
fails, reverts them to the last written offset, so memory never runs ahead of the log. Strata
takes a snapshot of the one group an operation touches (consumer_group.GroupSnapshot) before it
changes anything and puts it back when the operation fails before writing, or when its write
fails. Writes of one group land in order: when one fails, the operations after it (already
applied in memory, their writes queued behind) are undone with it, as Kafka's revert to the
failed write's offset undoes them; their own failures then find nothing left to undo.

An operation that changed the group's type is undone too: a classic group upgraded (or an empty
one converted) comes back in the state it was in, its members asked to rejoin (their pending
JoinGroup and SyncGroup were answered when it was upgraded); a consumer group downgraded comes
back from its snapshot, the classic group made from it unloaded (its members' pending requests
answered NOT_COORDINATOR, so they find their way back).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import structlog

from broker.coordinator.group.base import Group
from broker.coordinator.group.consumer_group import ConsumerGroup, GroupSnapshot
from broker.coordinator.group.group import ClassicGroup, GroupState
from broker.coordinator.group.runtime import OffsetsPartition

log = structlog.get_logger(__name__)


@dataclass(eq=False)
class Undo:
    ps: OffsetsPartition
    group_id: str
    before: Group | None
    snapshot: GroupSnapshot | None  # the consumer group's state, when it was one
    before_dead: bool  # the group the operation found was dead (or there was none)
    classic_state: GroupState | None  # the classic group's state, when it was one


@dataclass(frozen=True)
class Rearm:
    """What the managers do for a group put back: arm a consumer group's missing timers; have a
    classic group's members rejoin (their heartbeats running from now)."""

    consumer: Callable[[ConsumerGroup], None]
    classic: Callable[[ClassicGroup], None]


def begin(ps: OffsetsPartition, group_id: str, touched: Iterable[str | None] = ()) -> Undo:
    """Before an operation changes the group `group_id` of `ps`; `touched`: the members it may
    change in place (the others it may only add or remove)."""
    before = ps.groups.get(group_id)
    dead = before is None or before.is_dead
    snap = None
    if isinstance(before, ConsumerGroup) and not dead:
        snap = before.snapshot(m for m in touched if m is not None)
    state = before.state if isinstance(before, ClassicGroup) and not dead else None
    return Undo(ps, group_id, before, snap, dead, state)


def written_later(u: Undo) -> None:
    """The operation's records are on their way to the log: it waits, in order, among the
    group's other unwritten operations."""
    u.ps.undos.setdefault(u.group_id, []).append(u)


def settle(u: Undo, code: int, rearm: Rearm) -> None:
    """The operation's write ended with `code` (0: written)."""
    pending = u.ps.undos.get(u.group_id, [])
    if u not in pending:
        return  # undone already, with an earlier operation whose write failed
    i = pending.index(u)
    if code == 0:
        del pending[i]
    else:
        # the operations after it are undone first, latest first, then it
        later = pending[i + 1:]
        del pending[i:]
        for v in reversed(later):
            undo(v, rearm, f"queued behind a write that failed with error {code}", quiet=True)
        undo(u, rearm, f"write failed with error {code}")
    if not pending:
        u.ps.undos.pop(u.group_id, None)


def undo(u: Undo, rearm: Rearm, why: str, quiet: bool = False) -> None:
    """Put the group back as it was before the operation (`quiet`: the operation was refused,
    and said so in its own log line)."""
    ps, gid = u.ps, u.group_id
    cur = ps.groups.get(gid)
    if cur is u.before:
        if u.snapshot is not None and isinstance(cur, ConsumerGroup):
            cur.restore(u.snapshot)
            rearm.consumer(cur)
        elif cur is not None and quiet:
            return
    elif u.before_dead:
        # the operation created the group: it goes (a dead predecessor stays dead)
        if u.before is None:
            del ps.groups[gid]
        else:
            ps.groups[gid] = u.before
        if cur is not None:
            cur.unload()
    else:
        # the group changed type: the new one goes, the old one comes back
        if cur is not None:
            cur.unload()
        before = u.before
        assert before is not None  # it was not dead, so there was one
        ps.groups[gid] = before
        if isinstance(before, ConsumerGroup) and u.snapshot is not None:
            before.restore(u.snapshot)
            rearm.consumer(before)
        elif isinstance(before, ClassicGroup) and u.classic_state is not None:
            # its pending JoinGroups were answered when it was upgraded: none is waiting now
            before.state = GroupState.STABLE if u.classic_state is GroupState.PREPARING_REBALANCE else u.classic_state
            if before.members:
                rearm.classic(before)
    if not quiet:
        log.warning("consumer_group_rolled_back", group=gid, reason=why)
