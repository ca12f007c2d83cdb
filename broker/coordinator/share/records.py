"""__share_group_state's records: one ShareSnapshot per share-partition (the topic is compacted,
the latest snapshot of a key wins), laid out as Kafka's ShareSnapshotKey / ShareSnapshotValue
(a key type, then the fields in order; strings with an int16 length, uuids as 16 bytes). Kafka
also writes ShareUpdate records between snapshots; Strata writes a whole snapshot each time (the
in-flight window is bounded by group.share.partition.max.record.locks).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from uuid import UUID

from broker.coordinator.group.records import java_abs, java_string_hashcode
from broker.storage.uuid_text import format_uuid, parse_uuid

SHARE_STATE_TOPIC = "__share_group_state"
SNAPSHOT_KEY_TYPE = 0
SNAPSHOT_VALUE_VERSION = 0
# the delivery states as persisted (Kafka's RecordState ids): an acquired record is kept available
AVAILABLE, ACKNOWLEDGED, ARCHIVED = 0, 2, 4

_BATCH = struct.Struct(">qqbh")
_HEAD = struct.Struct(">hiiiqqqi")


@dataclass(frozen=True)
class StateKey:
    group_id: str
    topic_id: UUID
    partition: int

    @property
    def coordinator_key(self) -> str:
        """Kafka's SharePartitionKey.asCoordinatorKey() (the topic id as Kafka prints it): what
        FindCoordinator with key type 2 hashes."""
        return f"{self.group_id}:{format_uuid(self.topic_id)}:{self.partition}"


@dataclass
class ShareState:
    state_epoch: int = 0
    leader_epoch: int = -1
    start_offset: int = -1
    batches: list[tuple[int, int, int, int]] = field(default_factory=list)  # (first, last, state, count)
    snapshot_epoch: int = 0


def delivery_complete_count(s: ShareState) -> int:
    """Offsets at or past the start offset whose delivery is complete, acknowledged or archived
    (KIP-1226's DeliveryCompleteCount): what a share-partition's lag leaves out."""
    return sum(last - max(first, s.start_offset) + 1 for first, last, st, _ in s.batches
               if st in (ACKNOWLEDGED, ARCHIVED) and last >= s.start_offset)


def partition_for(key: StateKey, num_partitions: int) -> int:
    return coordinator_partition(key.coordinator_key, num_partitions)


def coordinator_partition(coordinator_key: str, num_partitions: int) -> int:
    return java_abs(java_string_hashcode(coordinator_key)) % num_partitions


def parse_coordinator_key(text: str) -> StateKey | None:
    """`group:topicId:partition` (FindCoordinator key type 2), or None when malformed."""
    parts = text.rsplit(":", 2)
    if len(parts) != 3 or not parts[0]:
        return None
    try:
        return StateKey(parts[0], parse_uuid(parts[1]), int(parts[2]))
    except ValueError:
        return None


def encode_key(key: StateKey) -> bytes:
    group = key.group_id.encode()
    return struct.pack(">hh", SNAPSHOT_KEY_TYPE, len(group)) + group + key.topic_id.bytes + struct.pack(
        ">i", key.partition)


def decode_key(raw: bytes) -> StateKey | None:
    """None for a key of another record type (a ShareUpdate this broker does not write)."""
    kind, n = struct.unpack_from(">hh", raw, 0)
    if kind != SNAPSHOT_KEY_TYPE:
        return None
    group = raw[4:4 + n].decode()
    topic_id = UUID(bytes=bytes(raw[4 + n:20 + n]))
    (partition,) = struct.unpack_from(">i", raw, 20 + n)
    return StateKey(group, topic_id, partition)


def encode_value(s: ShareState, now_ms: int) -> bytes:
    head = _HEAD.pack(SNAPSHOT_VALUE_VERSION, s.snapshot_epoch, s.state_epoch, s.leader_epoch, s.start_offset,
                      now_ms, now_ms, len(s.batches))
    return head + b"".join(_BATCH.pack(*b) for b in s.batches)


def decode_value(raw: bytes) -> ShareState:
    _, snapshot_epoch, state_epoch, leader_epoch, start, _, _, n = _HEAD.unpack_from(raw, 0)
    pos = _HEAD.size
    batches = []
    for _ in range(n):
        batches.append(_BATCH.unpack_from(raw, pos))
        pos += _BATCH.size
    return ShareState(state_epoch, leader_epoch, start, batches, snapshot_epoch)
