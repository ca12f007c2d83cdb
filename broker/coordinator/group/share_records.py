"""Share groups' records in __consumer_offsets (KIP-932, "Share group records"): ShareGroupMetadata
(type 11: the group epoch) and ShareGroupStatePartitionMetadata (type 15: the topics whose
share-partitions the group has initialized), laid out as Kafka's: a key of the record type and the
group id (int16-length string), a flexible value of version 0. Strata keeps only these two: the
members are not written (they rejoin a new coordinator), so the group, its epoch and the topics
its offsets cover outlive a coordinator failover.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from uuid import UUID

from protocol.errors import ProtocolError
from protocol.primitives import read_uvarint, uvarint

SHARE_GROUP_METADATA, SHARE_GROUP_STATE_PARTITION_METADATA = 11, 15
SHARE_KEY_TYPES = frozenset({SHARE_GROUP_METADATA, SHARE_GROUP_STATE_PARTITION_METADATA})
_H = struct.Struct(">h")


class ShareRecordError(ValueError):
    """A share group record that does not parse."""


@dataclass
class LoadedShareGroup:
    epoch: int = 0
    topics: dict[str, tuple[UUID, tuple[int, ...]]] = field(default_factory=dict)  # name -> (id, partitions)
    has_metadata: bool = False


def share_key(type_: int, group_id: str) -> bytes:
    g = group_id.encode()
    return _H.pack(type_) + _H.pack(len(g)) + g


def decode_share_key(key: bytes) -> tuple[int, str] | None:
    """(record type, group id), or None for a record of another type."""
    try:
        (t,) = _H.unpack_from(key, 0)
        if t not in SHARE_KEY_TYPES:
            return None
        (n,) = _H.unpack_from(key, 2)
        return t, bytes(key[4:4 + n]).decode()
    except (struct.error, UnicodeDecodeError) as e:
        raise ShareRecordError(f"bad share group key: {e}") from None


def metadata_value(epoch: int) -> bytes:
    return _H.pack(0) + struct.pack(">iq", epoch, 0) + uvarint(0)  # epoch, metadata hash, no tags


def partition_metadata_value(topics: dict[str, tuple[UUID, tuple[int, ...]]]) -> bytes:
    out = bytearray(_H.pack(0))
    out += uvarint(1)  # InitializingTopics: none
    out += uvarint(len(topics) + 1)  # InitializedTopics
    for name, (tid, parts) in sorted(topics.items()):
        b = name.encode()
        out += tid.bytes + uvarint(len(b) + 1) + b + uvarint(len(parts) + 1)
        out += b"".join(struct.pack(">i", p) for p in parts) + uvarint(0)
    out += uvarint(1)  # DeletingTopics: none
    out += uvarint(0)
    return bytes(out)


def replay(groups: dict[str, LoadedShareGroup], type_: int, group_id: str, value: bytes | None) -> None:
    """Apply one share group record (a tombstone of the metadata deletes the group)."""
    if value is None:
        if type_ == SHARE_GROUP_METADATA:
            groups.pop(group_id, None)
        elif group_id in groups:
            groups[group_id].topics = {}
        return
    g = groups.setdefault(group_id, LoadedShareGroup())
    try:
        if type_ == SHARE_GROUP_METADATA:
            (g.epoch,) = struct.unpack_from(">i", value, 2)
            g.has_metadata = True
            return
        pos = 2
        n, pos = read_uvarint(value, pos)
        if n > 1:
            raise ShareRecordError("initializing topics are not written by Strata")
        n, pos = read_uvarint(value, pos)
        topics = {}
        for _ in range(max(n - 1, 0)):
            tid = UUID(bytes=bytes(value[pos:pos + 16]))
            pos += 16
            ln, pos = read_uvarint(value, pos)
            name = bytes(value[pos:pos + ln - 1]).decode()
            pos += ln - 1
            cnt, pos = read_uvarint(value, pos)
            parts = struct.unpack_from(f">{max(cnt - 1, 0)}i", value, pos)
            pos += 4 * max(cnt - 1, 0)
            _, pos = read_uvarint(value, pos)  # tagged fields (none written)
            topics[name] = (tid, tuple(parts))
        g.topics = topics
    except (struct.error, UnicodeDecodeError, ProtocolError, ValueError) as e:
        raise ShareRecordError(f"bad share group value: {e}") from None
