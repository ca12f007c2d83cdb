"""The __consumer_offsets records of KIP-848 consumer groups, in Kafka's key/value formats
(sans-IO), beside the classic group's and the offsets' (records.py).

A key is an int16 record type then its fields, never flexible: 3 group metadata (group epoch),
4 partition metadata (the subscribed topics' partition counts and racks the last assignment
saw), 5 member metadata (a member's subscription), 6 target assignment metadata (the epoch of
the target assignment), 7 target assignment of a member, 8 current assignment of a member
(epoch, state, partitions owned and pending revocation), 16 a regular expression's resolution
(the topic names it matched and the metadata image version it was resolved at). Values are flexible from v0 (compact
strings and arrays, tagged fields) and start with their int16 version; a null value is a
tombstone. Kafka's GroupCoordinatorRecordHelpers writes the same records, in the same order:
member subscription, then group epoch, then target assignment, then the member's current
assignment, so a coordinator that loads the partition resumes the group where it was.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from broker.coordinator.group.records import RecordFormatError, _Reader
from protocol.errors import ProtocolError
from protocol.primitives import read_uvarint, uvarint

# key record types (Kafka's)
GROUP_METADATA, PARTITION_METADATA, MEMBER_METADATA = 3, 4, 5
TARGET_ASSIGNMENT_METADATA, TARGET_ASSIGNMENT_MEMBER, CURRENT_MEMBER_ASSIGNMENT = 6, 7, 8
REGULAR_EXPRESSION = 16
CONSUMER_KEY_TYPES = frozenset({*range(3, 9), REGULAR_EXPRESSION})
VALUE_VERSION = 0

_H = struct.Struct(">h")
_I = struct.Struct(">i")
_Q = struct.Struct(">q")
_B = struct.Struct(">b")
T = TypeVar("T")

# topic id -> partitions: the one shape of an assignment (KIP-848 assigns by topic id)
Assignment = dict[uuid.UUID, frozenset[int]]


@dataclass(frozen=True)
class ConsumerKey:
    type: int
    group: str
    member: str | None = None
    regex: str | None = None  # type 16's second field


@dataclass(frozen=True)
class MemberSubscription:
    """ConsumerGroupMemberMetadataValue: what a member asked for (Kafka's field names)."""

    instance_id: str | None
    rack_id: str | None
    client_id: str
    client_host: str
    subscribed_topic_names: tuple[str, ...]
    subscribed_topic_regex: str | None
    rebalance_timeout_ms: int
    server_assignor: str | None
    # ClassicMemberMetadata (tagged field 0): a classic member's session timeout and protocols
    classic: tuple[int, tuple[tuple[str, bytes], ...]] | None = None


@dataclass(frozen=True)
class CurrentAssignment:
    """ConsumerGroupCurrentMemberAssignmentValue: where the member's reconciliation stands."""

    member_epoch: int
    previous_member_epoch: int
    state: int  # MemberState's value (consumer_group.py)
    assigned: Assignment = field(default_factory=dict)
    pending_revocation: Assignment = field(default_factory=dict)


@dataclass(frozen=True)
class ResolvedRegex:
    """ConsumerGroupRegularExpressionValue: the topics a subscribed regular expression matched,
    the metadata image offset it was matched against, and when."""

    topics: tuple[str, ...]
    version: int
    timestamp: int


@dataclass(frozen=True)
class TopicMetadata:
    topic_id: uuid.UUID
    name: str
    num_partitions: int
    racks: dict[int, tuple[str, ...]] = field(default_factory=dict)


# ---------------------------------------------------------------- keys
def _key(type_: int, group: str, member: str | None = None) -> bytes:
    out = bytearray(_H.pack(type_))
    for s in (group, member):
        if s is not None:
            b = s.encode()
            out += _H.pack(len(b))
            out += b
    return bytes(out)


def group_metadata_key(group: str) -> bytes:
    return _key(GROUP_METADATA, group)


def partition_metadata_key(group: str) -> bytes:
    return _key(PARTITION_METADATA, group)


def member_metadata_key(group: str, member: str) -> bytes:
    return _key(MEMBER_METADATA, group, member)


def target_assignment_metadata_key(group: str) -> bytes:
    return _key(TARGET_ASSIGNMENT_METADATA, group)


def target_assignment_member_key(group: str, member: str) -> bytes:
    return _key(TARGET_ASSIGNMENT_MEMBER, group, member)


def current_assignment_key(group: str, member: str) -> bytes:
    return _key(CURRENT_MEMBER_ASSIGNMENT, group, member)


def regex_key(group: str, regex: str) -> bytes:
    return _key(REGULAR_EXPRESSION, group, regex)


def decode_consumer_key(key: bytes) -> ConsumerKey | None:
    """A consumer group record's key, or None when `key` is of another record type."""
    try:
        r = _Reader(key)
        t = r.int16()
        if t not in CONSUMER_KEY_TYPES:
            return None
        group = r.str()
        if t == REGULAR_EXPRESSION:
            return ConsumerKey(t, group, regex=r.str())
        member = r.str() if t in (MEMBER_METADATA, TARGET_ASSIGNMENT_MEMBER, CURRENT_MEMBER_ASSIGNMENT) else None
        return ConsumerKey(t, group, member)
    except (IndexError, struct.error, ProtocolError) as e:
        raise RecordFormatError(f"bad consumer group key: {e}") from None


# ---------------------------------------------------------------- flexible values
class _Writer:
    def __init__(self) -> None:
        self.out = bytearray(_H.pack(VALUE_VERSION))

    def int8(self, v: int) -> None:
        self.out += _B.pack(v)

    def int32(self, v: int) -> None:
        self.out += _I.pack(v)

    def int64(self, v: int) -> None:
        self.out += _Q.pack(v)

    def nstr(self, s: str | None) -> None:
        if s is None:
            self.out += uvarint(0)
        else:
            b = s.encode()
            self.out += uvarint(len(b) + 1)
            self.out += b

    def count(self, n: int) -> None:
        self.out += uvarint(n + 1)

    def uuid(self, u: uuid.UUID) -> None:
        self.out += u.bytes

    def tags(self) -> None:
        self.out += uvarint(0)

    def assignment(self, a: Assignment) -> None:
        self.count(len(a))
        for tid, parts in sorted(a.items()):
            self.uuid(tid)
            self.count(len(parts))
            for p in sorted(parts):
                self.int32(p)
            self.tags()


class _FlexReader(_Reader):
    def __init__(self, buf: bytes) -> None:
        super().__init__(buf, flexible=True)
        version = self.int16()
        if version != VALUE_VERSION:
            raise RecordFormatError(f"unknown consumer group value version {version}")

    def int8(self) -> int:
        return _B.unpack(self._take(1))[0]

    def uuid(self) -> uuid.UUID:
        return uuid.UUID(bytes=bytes(self._take(16)))

    def assignment(self) -> Assignment:
        out: Assignment = {}
        for _ in range(self.array_len()):
            tid = self.uuid()
            out[tid] = frozenset(self.int32() for _ in range(self.array_len()))
            self.tags()
        return out


def _parse(what: str, value: bytes, read: Callable[[_FlexReader], T]) -> T:
    try:
        return read(_FlexReader(value))
    except RecordFormatError:
        raise
    except (IndexError, struct.error, ProtocolError, ValueError) as e:
        raise RecordFormatError(f"bad {what} value: {e}") from None


def epoch_value(epoch: int) -> bytes:
    """ConsumerGroupMetadataValue (group epoch) and ConsumerGroupTargetAssignmentMetadataValue
    (assignment epoch) share one layout."""
    w = _Writer()
    w.int32(epoch)
    w.tags()
    return bytes(w.out)


def decode_epoch_value(value: bytes) -> int:
    return _parse("epoch", value, _read_epoch_value)


def _read_epoch_value(r: _FlexReader) -> int:
    epoch = r.int32()
    r.tags()
    return epoch


def member_metadata_value(m: MemberSubscription) -> bytes:
    w = _Writer()
    w.nstr(m.instance_id)
    w.nstr(m.rack_id)
    w.nstr(m.client_id)
    w.nstr(m.client_host)
    w.count(len(m.subscribed_topic_names))
    for t in m.subscribed_topic_names:
        w.nstr(t)
    w.nstr(m.subscribed_topic_regex)
    w.int32(m.rebalance_timeout_ms)
    w.nstr(m.server_assignor)
    if m.classic is None:
        w.tags()
        return bytes(w.out)
    inner = _Writer()
    del inner.out[:]  # a struct, no version prefix
    inner.int32(m.classic[0])
    inner.count(len(m.classic[1]))
    for name, meta in m.classic[1]:
        inner.nstr(name)
        inner.out += uvarint(len(meta) + 1)
        inner.out += meta
        inner.tags()
    inner.tags()
    w.out += uvarint(1) + uvarint(0) + uvarint(len(inner.out))
    w.out += inner.out
    return bytes(w.out)


def decode_member_metadata_value(value: bytes) -> MemberSubscription:
    return _parse("member metadata", value, _read_member_metadata_value)


def _read_member_metadata_value(r: _FlexReader) -> MemberSubscription:
    instance_id, rack_id, client_id, client_host = r.nstr(), r.nstr(), r.str(), r.str()
    topics = tuple(r.str() for _ in range(r.array_len()))
    regex = r.nstr()
    rebalance_timeout_ms = r.int32()
    assignor = r.nstr()
    classic = None
    n, r.pos = read_uvarint(r.buf, r.pos)
    for _ in range(n):
        tag, r.pos = read_uvarint(r.buf, r.pos)
        size, r.pos = read_uvarint(r.buf, r.pos)
        end = r.pos + size
        if tag == 0:  # ClassicMemberMetadata: a migrated classic member's
            session = r.int32()
            protocols = []
            for _ in range(r.array_len()):
                name = r.str()
                protocols.append((name, r.bytes()))
                r.tags()
            classic = (session, tuple(protocols))
        r.pos = end
    return MemberSubscription(instance_id, rack_id, client_id, client_host, topics, regex, rebalance_timeout_ms,
                              assignor, classic)


def target_assignment_member_value(a: Assignment) -> bytes:
    w = _Writer()
    w.assignment(a)
    w.tags()
    return bytes(w.out)


def decode_target_assignment_member_value(value: bytes) -> Assignment:
    return _parse("target assignment", value, _read_target_assignment_member_value)


def _read_target_assignment_member_value(r: _FlexReader) -> Assignment:
    a = r.assignment()
    r.tags()
    return a


def current_assignment_value(c: CurrentAssignment) -> bytes:
    w = _Writer()
    w.int32(c.member_epoch)
    w.int32(c.previous_member_epoch)
    w.int8(c.state)
    w.assignment(c.assigned)
    w.assignment(c.pending_revocation)
    w.tags()
    return bytes(w.out)


def decode_current_assignment_value(value: bytes) -> CurrentAssignment:
    return _parse("current assignment", value, _read_current_assignment_value)


def _read_current_assignment_value(r: _FlexReader) -> CurrentAssignment:
    epoch, previous, state = r.int32(), r.int32(), r.int8()
    assigned = r.assignment()
    pending = r.assignment()
    r.tags()
    return CurrentAssignment(epoch, previous, state, assigned, pending)


def partition_metadata_value(topics: list[TopicMetadata]) -> bytes:
    w = _Writer()
    w.count(len(topics))
    for t in topics:
        w.uuid(t.topic_id)
        w.nstr(t.name)
        w.int32(t.num_partitions)
        w.count(len(t.racks))
        for p, racks in sorted(t.racks.items()):
            w.int32(p)
            w.count(len(racks))
            for rack in racks:
                w.nstr(rack)
            w.tags()
        w.tags()
    w.tags()
    return bytes(w.out)


def decode_partition_metadata_value(value: bytes) -> list[TopicMetadata]:
    return _parse("partition metadata", value, _read_partition_metadata_value)


def _read_partition_metadata_value(r: _FlexReader) -> list[TopicMetadata]:
    topics = []
    for _ in range(r.array_len()):
        tid, name, n = r.uuid(), r.str(), r.int32()
        racks = {}
        for _ in range(r.array_len()):
            p = r.int32()
            racks[p] = tuple(r.str() for _ in range(r.array_len()))
            r.tags()
        r.tags()
        topics.append(TopicMetadata(tid, name, n, racks))
    r.tags()
    return topics


def regex_value(r: ResolvedRegex) -> bytes:
    w = _Writer()
    w.count(len(r.topics))
    for t in r.topics:
        w.nstr(t)
    w.int64(r.version)
    w.int64(r.timestamp)
    w.tags()
    return bytes(w.out)


def decode_regex_value(value: bytes) -> ResolvedRegex:
    return _parse("regular expression", value, _read_regex_value)


def _read_regex_value(r: _FlexReader) -> ResolvedRegex:
    topics = tuple(r.str() for _ in range(r.array_len()))
    version, timestamp = r.int64(), r.int64()
    r.tags()
    return ResolvedRegex(topics, version, timestamp)


# ---------------------------------------------------------------- what a partition's log holds of a group
@dataclass
class LoadedConsumerGroup:
    """A consumer group as the records of a __consumer_offsets partition left it (last record per
    key wins, tombstones delete)."""

    group_epoch: int = 0
    assignment_epoch: int = 0
    members: dict[str, MemberSubscription] = field(default_factory=dict)
    targets: dict[str, Assignment] = field(default_factory=dict)
    current: dict[str, CurrentAssignment] = field(default_factory=dict)
    partition_metadata: list[TopicMetadata] = field(default_factory=list)
    regexes: dict[str, ResolvedRegex] = field(default_factory=dict)


def replay(groups: dict[str, LoadedConsumerGroup], key: ConsumerKey, value: bytes | None) -> None:
    """Apply one consumer group record to what a partition's scan has found so far."""
    if key.type == GROUP_METADATA and value is None:
        groups.pop(key.group, None)  # the group was deleted (its other records were tombstoned first)
        return
    g = groups.get(key.group)
    if g is None:
        if value is None:
            return
        g = groups[key.group] = LoadedConsumerGroup()
    member = key.member or ""
    if key.type == GROUP_METADATA:
        assert value is not None
        g.group_epoch = decode_epoch_value(value)
    elif key.type == TARGET_ASSIGNMENT_METADATA:
        g.assignment_epoch = 0 if value is None else decode_epoch_value(value)
    elif key.type == PARTITION_METADATA:
        g.partition_metadata = [] if value is None else decode_partition_metadata_value(value)
    elif key.type == MEMBER_METADATA:
        if value is None:
            g.members.pop(member, None)
        else:
            g.members[member] = decode_member_metadata_value(value)
    elif key.type == TARGET_ASSIGNMENT_MEMBER:
        if value is None:
            g.targets.pop(member, None)
        else:
            g.targets[member] = decode_target_assignment_member_value(value)
    elif key.type == CURRENT_MEMBER_ASSIGNMENT:
        if value is None:
            g.current.pop(member, None)
        else:
            g.current[member] = decode_current_assignment_value(value)
    elif key.type == REGULAR_EXPRESSION:
        if value is None:
            g.regexes.pop(key.regex or "", None)
        else:
            g.regexes[key.regex or ""] = decode_regex_value(value)
