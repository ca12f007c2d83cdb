"""Undoing what a consumer group operation changed in memory when its records are not written.

Kafka keeps a group's state in timeline structures and, when an append to __consumer_offsets
fails, reverts them to the last written offset, so memory never runs ahead of the log. Strata
takes a snapshot of the one group an operation touches (consumer_group.GroupSnapshot) before it
changes anything and puts it back when the operation fails before writing, or when its write
fails. Writes of one group land in order: when one fails, the operations after it (already
applied in memory, their writes queued behind) are undone with it, as Kafka's revert to the
failed write's offset undoes them; their own failures then find nothing left to undo.

A group that changed type in the operation (a classic group upgraded, a consumer group
downgraded) is not put back: that stays as memory has it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import structlog

from broker.coordinator.group.base import Group
from broker.coordinator.group.consumer_group import ConsumerGroup, GroupSnapshot
from broker.coordinator.group.runtime import OffsetsPartition

log = structlog.get_logger(__name__)


@dataclass(eq=False)
class Undo:
    ps: OffsetsPartition
    group_id: str
    before: Group | None
    snapshot: GroupSnapshot | None
    before_dead: bool = False  # the group the operation found was dead (or there was none)
    group: ConsumerGroup | None = field(default=None)  # the group whose writes it waits among


def begin(ps: OffsetsPartition, group_id: str) -> Undo:
    """Before an operation changes the group `group_id` of `ps`."""
    before = ps.groups.get(group_id)
    snap = before.snapshot() if isinstance(before, ConsumerGroup) and not before.is_dead else None
    return Undo(ps, group_id, before, snap, before is None or before.is_dead)


def written_later(u: Undo) -> None:
    """The operation's records are on their way to the log: it waits, in order, among the
    group's other unwritten operations."""
    group = u.ps.groups.get(u.group_id)
    if isinstance(group, ConsumerGroup):
        u.group = group
        group.undos.append(u)


def settle(u: Undo, code: int, rearm: Callable[[ConsumerGroup], None]) -> None:
    """The operation's write ended with `code` (0: written)."""
    g = u.group
    if g is None or u not in g.undos:
        return  # undone already, with an earlier operation whose write failed
    i = g.undos.index(u)
    if code == 0:
        del g.undos[i]
        return
    del g.undos[i:]
    undo(u, rearm, f"write failed with error {code}")


def undo(u: Undo, rearm: Callable[[ConsumerGroup], None], why: str, quiet: bool = False) -> None:
    """Put the group back as it was before the operation (`quiet`: the operation was refused,
    and said so in its own log line)."""
    cur = u.ps.groups.get(u.group_id)
    if u.snapshot is not None and cur is u.before and isinstance(cur, ConsumerGroup):
        cur.restore(u.snapshot)
        rearm(cur)
    elif u.before_dead and isinstance(cur, ConsumerGroup) and cur is not u.before:
        # the operation created the group: it goes (a dead predecessor stays dead)
        if u.before is None:
            del u.ps.groups[u.group_id]
        else:
            u.ps.groups[u.group_id] = u.before
        cur.unload()
    else:
        if not quiet:
            log.warning("consumer_group_not_rolled_back", group=u.group_id, reason=why)
        return
    if not quiet:
        log.warning("consumer_group_rolled_back", group=u.group_id, reason=why)
