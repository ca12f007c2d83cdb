"""What every group type has, whatever protocol its members speak: an id, its committed offsets
(with the commits still being replicated and the transactional ones whose transaction has not
ended), and the rules the offsets manager asks of it.

Kafka's group coordinator has the same seam (its Group interface, implemented by ClassicGroup and
KIP-848's ConsumerGroup): offset commits, fetches, deletes and expiry are one piece of code for
every group type, and each type only says who may commit, what may be deleted, when offsets
expire and which records delete the group. The classic group (group.py) is one such type; a
consumer or share group is a sibling subclass, kept in the same __consumer_offsets partitions.
"""

from __future__ import annotations

import abc
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import ClassVar

from broker.coordinator import wall_clock_ms
from broker.coordinator.group.records import OffsetAndMetadata

TopicPartition = tuple[str, int]
# the OffsetCommit version Strata serves last; KIP-848 members must commit with v9 or later
OFFSET_COMMIT_LATEST_VERSION = 9


@dataclass
class CommittedOffset:
    """An offset in the cache, with the log offset of the record that committed it: a later
    record always wins, whatever order replication completes in."""

    value: OffsetAndMetadata
    record_offset: int


class Group(abc.ABC):
    type: ClassVar[str]  # what ListGroups reports as the group type (KIP-848): "classic", "consumer"

    def __init__(self, group_id: str, clock: Callable[[], int] = wall_clock_ms) -> None:
        self.group_id = group_id
        self.clock = clock
        self.offsets: dict[TopicPartition, CommittedOffset] = {}
        self.pending_offset_commits: Counter[TopicPartition] = Counter()
        # transactional offset commits written but not yet ended by a marker: producer id ->
        # partition -> (offset, log offset of its record)
        self.pending_txn_offsets: dict[int, dict[TopicPartition, CommittedOffset]] = {}

    # ------------------------------------------------------------------ what each type decides
    @property
    @abc.abstractmethod
    def state_name(self) -> str:
        """The state as ListGroups and DescribeGroups name it."""

    @property
    @abc.abstractmethod
    def is_dead(self) -> bool:
        """Deleted or unloaded: no request may change it any more."""

    @property
    @abc.abstractmethod
    def is_empty(self) -> bool:
        """No members and none about to join."""

    @abc.abstractmethod
    def mark_dead(self) -> None: ...

    @abc.abstractmethod
    def validate_offset_commit(self, member_id: str, instance_id: str | None, generation_id: int,
                               api_version: int = OFFSET_COMMIT_LATEST_VERSION) -> int:
        """0 when this OffsetCommit (of that version) may write, else the error every partition
        answers."""

    @abc.abstractmethod
    def validate_txn_offset_commit(self, member_id: str, instance_id: str | None, generation_id: int) -> int:
        """0 when this TxnOffsetCommit may write, else the error every partition answers."""

    def validate_offset_fetch(self, member_id: str | None, member_epoch: int) -> int:
        """0 when this OffsetFetch (v9+ carries a KIP-848 member's id and epoch) may read."""
        return 0

    @abc.abstractmethod
    def validate_offset_delete(self, partitions: Iterable[TopicPartition]) -> tuple[int, dict[TopicPartition, int]]:
        """(group error, per partition: 0 when its offset may be deleted, else why not)."""

    @abc.abstractmethod
    def validate_delete_group(self) -> int:
        """0 when DeleteGroups may delete the group, else the error."""

    @abc.abstractmethod
    def expired_offsets(self, now_ms: int, retention_ms: int) -> list[TopicPartition]:
        """The partitions whose offset is past retention, by the type's rules."""

    @abc.abstractmethod
    def tombstone_keys(self) -> list[bytes]:
        """The __consumer_offsets keys that hold the group's own state (deleted with the group)."""

    @abc.abstractmethod
    def cancel_timers(self) -> None:
        """Stop every timer the coordinator runs for the group (it is deleted or unloaded)."""

    @abc.abstractmethod
    def unload(self) -> None:
        """This broker stops coordinating the group: waiting requests answer NOT_COORDINATOR."""

    # ------------------------------------------------------------------ the group's lifetime
    @property
    def is_removable(self) -> bool:
        """Nothing left to keep: no members, no offsets, no transactional commit pending."""
        return self.is_empty and not self.offsets and not self.pending_txn_offsets

    # ------------------------------------------------------------------ offsets
    def apply_offset(self, tp: TopicPartition, value: OffsetAndMetadata, record_offset: int) -> None:
        current = self.offsets.get(tp)
        if current is None or current.record_offset < record_offset:
            self.offsets[tp] = CommittedOffset(value, record_offset)

    def add_pending_txn_offset(self, producer_id: int, tp: TopicPartition, value: OffsetAndMetadata,
                               record_offset: int) -> None:
        self.pending_txn_offsets.setdefault(producer_id, {})[tp] = CommittedOffset(value, record_offset)

    def has_pending_txn_offset(self, tp: TopicPartition) -> bool:
        return any(tp in per for per in self.pending_txn_offsets.values())

    def complete_txn_offsets(self, producer_id: int, commit: bool, before_offset: int | None = None) -> int:
        """The producer's transaction ended: its offsets (written below `before_offset`, if given)
        become committed (a later record still wins) or are dropped. Returns how many there were."""
        pending = self.pending_txn_offsets.get(producer_id, {})
        done = [tp for tp, c in pending.items() if before_offset is None or c.record_offset < before_offset]
        for tp in done:
            c = pending.pop(tp)
            if commit:
                self.apply_offset(tp, c.value, c.record_offset)
        if not pending:
            self.pending_txn_offsets.pop(producer_id, None)
        return len(done)

    def forget_partitions(self, partitions: set[TopicPartition]) -> list[TopicPartition]:
        """Partitions deleted (KIP-253): their committed offsets go (a partition re-created under
        the same index starts again at 0). Returns the partitions that had one."""
        return self.remove_offsets([tp for tp in self.offsets if tp in partitions])

    def remove_offsets(self, partitions: Iterable[TopicPartition]) -> list[TopicPartition]:
        removed = []
        for tp in partitions:
            self.pending_offset_commits.pop(tp, None)
            if self.offsets.pop(tp, None) is not None:
                removed.append(tp)
        return removed

    def offsets_expired_since(self, now_ms: int, retention_ms: int, base: Callable[[CommittedOffset], int],
                              keep_topics: Iterable[str] = ()) -> list[TopicPartition]:
        """Offsets whose explicit expiry passed, or `retention_ms` after `base` of each; never those
        of `keep_topics` or with a commit in flight (Kafka's OffsetExpirationCondition)."""
        keep = set(keep_topics)
        out = []
        for tp, c in self.offsets.items():
            if tp[0] in keep or self.pending_offset_commits.get(tp):
                continue
            if c.value.expire_timestamp is not None:
                if now_ms >= c.value.expire_timestamp:
                    out.append(tp)
            elif now_ms - base(c) >= retention_ms:
                out.append(tp)
        return out
