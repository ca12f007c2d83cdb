"""What the group managers (classic.py, offsets_manager.py) use of the coordinator that runs them,
as Kafka's group coordinator shards use its CoordinatorRuntime: the __consumer_offsets partitions
this broker leads, writes to their logs, and timers on the event loop.

A partition holds every group whose id hashes to it, whatever the group's type (one id space, as
in Kafka), and their committed offsets with them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from broker.coordinator.group.base import Group
from broker.coordinator.partitioned import CoordinatorPartition

# API keys, for the per-API group id rule and the status checks
OFFSET_COMMIT, OFFSET_FETCH, JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP = 8, 9, 11, 12, 13, 14
DESCRIBE_GROUPS, DELETE_GROUPS, OFFSET_DELETE = 15, 42, 47
EMPTY_GROUP_ID_ALLOWED = frozenset({OFFSET_COMMIT, OFFSET_FETCH, DESCRIBE_GROUPS, DELETE_GROUPS})

Records = Sequence[tuple[bytes, bytes | None]]  # (key, value or None for a tombstone)


class OffsetsPartition(CoordinatorPartition):
    """One __consumer_offsets partition this broker leads."""

    def __init__(self, index: int, epoch: int) -> None:
        super().__init__(index, epoch)
        self.groups: dict[str, Group] = {}
        # transactions that ended while loading: (producer id, commit, log end offset then)
        self.completed_while_loading: list[tuple[int, bool, int]] = []
        # per group id, the consumer group operations whose records are not written yet (rollback.py)
        self.undos: dict[str, list[Any]] = {}


class GroupRuntime(Protocol):
    def status(self, group_id: str | None, api: int) -> tuple[int, OffsetsPartition | None]:
        """(0, partition) when this broker coordinates `group_id` and has it loaded, else the error."""
        ...

    def partition(self, index: int) -> OffsetsPartition | None:
        """Partition `index` when this broker leads it (loaded or not)."""
        ...

    def loaded_partitions(self) -> list[OffsetsPartition]: ...

    def log_end_offset(self, index: int) -> int: ...

    def partition_for(self, group_id: str) -> int: ...

    def write(self, index: int, records: Records,
              producer: tuple[int, int] | None = None) -> tuple[int, int, asyncio.Future]:
        """Append to partition `index` now: (error, first offset, done), `done` resolving to the
        append error once replicated (0) or not."""
        ...

    def timer(self, delay_ms: int, fn: Callable[..., Any], *args: Any) -> asyncio.TimerHandle: ...
