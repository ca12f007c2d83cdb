"""The records of __consumer_offsets, in Kafka's key/value formats (sans-IO).

Keys start with an int16 version that is also the record type: 0 and 1 are offset commits
(group, topic, partition), 2 is group metadata (group). Later key versions belong to the KIP-848
consumer / share / streams groups and are skipped by the reader. Values start with their own
int16 version; a null value is a tombstone.

Written: offset commit key v1 with value v3 (offset, leader epoch, metadata, commit timestamp),
or value v1 when the commit carries an explicit expire timestamp (OffsetCommit v2-4 with a
retention time), as Kafka does; group metadata key v2 with value v3. Read: every value version
0-4 (v4 is the first flexible one: compact strings and tagged fields).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from protocol.errors import ProtocolError
from protocol.primitives import read_uvarint

OFFSETS_TOPIC = "__consumer_offsets"
OFFSET_COMMIT_KEY_VERSION = 1
GROUP_METADATA_KEY_VERSION = 2
OFFSET_COMMIT_VALUE_VERSION = 3
OFFSET_COMMIT_VALUE_VERSION_WITH_EXPIRY = 1
GROUP_METADATA_VALUE_VERSION = 3

_H = struct.Struct(">h")
_I = struct.Struct(">i")
_Q = struct.Struct(">q")


class RecordFormatError(ValueError):
    """A key or value of __consumer_offsets that does not parse."""


# ---------------------------------------------------------------- partitioning
def java_string_hashcode(s: str) -> int:
    """String.hashCode(): s[0]*31^(n-1) + ... over UTF-16 code units, as a signed 32-bit int."""
    h = 0
    data = s.encode("utf-16-be", "surrogatepass")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def java_abs(n: int) -> int:
    """Kafka's Utils.abs: |n|, and 0 for Integer.MIN_VALUE."""
    return 0 if n == -(1 << 31) else abs(n)


def partition_for(group_id: str, num_partitions: int) -> int:
    """The __consumer_offsets partition holding a group (Kafka's mapping)."""
    return java_abs(java_string_hashcode(group_id)) % num_partitions


# ---------------------------------------------------------------- values
@dataclass(frozen=True)
class OffsetAndMetadata:
    offset: int
    leader_epoch: int = -1
    metadata: str = ""
    commit_timestamp: int = -1
    expire_timestamp: int | None = None  # only explicit retention (OffsetCommit v2-4) sets it


@dataclass(frozen=True)
class MemberRecord:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    subscription: bytes
    assignment: bytes


@dataclass(frozen=True)
class GroupMetadataRecord:
    protocol_type: str
    generation: int
    protocol: str | None
    leader: str | None
    current_state_timestamp: int = -1
    members: list[MemberRecord] = field(default_factory=list)


@dataclass(frozen=True)
class OffsetCommitKey:
    group: str
    topic: str
    partition: int


@dataclass(frozen=True)
class GroupMetadataKey:
    group: str


# ---------------------------------------------------------------- writing
def _str(out: bytearray, s: str) -> None:
    b = s.encode()
    out += _H.pack(len(b))
    out += b


def _nstr(out: bytearray, s: str | None) -> None:
    if s is None:
        out += _H.pack(-1)
    else:
        _str(out, s)


def _bytes(out: bytearray, b: bytes) -> None:
    out += _I.pack(len(b))
    out += b


def offset_commit_key(group: str, topic: str, partition: int) -> bytes:
    out = bytearray(_H.pack(OFFSET_COMMIT_KEY_VERSION))
    _str(out, group)
    _str(out, topic)
    out += _I.pack(partition)
    return bytes(out)


def group_metadata_key(group: str) -> bytes:
    out = bytearray(_H.pack(GROUP_METADATA_KEY_VERSION))
    _str(out, group)
    return bytes(out)


def offset_commit_value(o: OffsetAndMetadata) -> bytes:
    if o.expire_timestamp is not None:
        out = bytearray(_H.pack(OFFSET_COMMIT_VALUE_VERSION_WITH_EXPIRY))
        out += _Q.pack(o.offset)
        _str(out, o.metadata)
        out += _Q.pack(o.commit_timestamp)
        out += _Q.pack(o.expire_timestamp)
        return bytes(out)
    out = bytearray(_H.pack(OFFSET_COMMIT_VALUE_VERSION))
    out += _Q.pack(o.offset)
    out += _I.pack(o.leader_epoch)
    _str(out, o.metadata)
    out += _Q.pack(o.commit_timestamp)
    return bytes(out)


def group_metadata_value(g: GroupMetadataRecord) -> bytes:
    out = bytearray(_H.pack(GROUP_METADATA_VALUE_VERSION))
    _str(out, g.protocol_type)
    out += _I.pack(g.generation)
    _nstr(out, g.protocol)
    _nstr(out, g.leader)
    out += _Q.pack(g.current_state_timestamp)
    out += _I.pack(len(g.members))
    for m in g.members:
        _str(out, m.member_id)
        _nstr(out, m.group_instance_id)
        _str(out, m.client_id)
        _str(out, m.client_host)
        out += _I.pack(m.rebalance_timeout_ms)
        out += _I.pack(m.session_timeout_ms)
        _bytes(out, m.subscription)
        _bytes(out, m.assignment)
    return bytes(out)


# ---------------------------------------------------------------- reading
class _Reader:
    def __init__(self, buf: bytes, flexible: bool = False) -> None:
        self.buf = memoryview(buf)
        self.pos = 0
        self.flexible = flexible

    def _take(self, n: int) -> memoryview:
        end = self.pos + n
        if n < 0 or end > len(self.buf):
            raise RecordFormatError(f"field of {n} bytes runs past the end of a {len(self.buf)}-byte record")
        v = self.buf[self.pos : end]
        self.pos = end
        return v

    def int16(self) -> int:
        return _H.unpack(self._take(2))[0]

    def int32(self) -> int:
        return _I.unpack(self._take(4))[0]

    def int64(self) -> int:
        return _Q.unpack(self._take(8))[0]

    def _length(self, wide: bool) -> int:
        if self.flexible:
            n, self.pos = read_uvarint(self.buf, self.pos)
            return n - 1
        return self.int32() if wide else self.int16()

    def nstr(self) -> str | None:
        n = self._length(False)
        return None if n < 0 else bytes(self._take(n)).decode("utf-8", "replace")

    def str(self) -> str:
        s = self.nstr()
        if s is None:
            raise RecordFormatError("null in a non-nullable string")
        return s

    def bytes(self) -> bytes:
        n = self._length(True)
        if n < 0:
            raise RecordFormatError("null in a non-nullable bytes field")
        return bytes(self._take(n))

    def array_len(self) -> int:
        n = self._length(True)
        if n < 0:
            raise RecordFormatError("null array")
        return n

    def tags(self) -> None:
        if not self.flexible:
            return
        n, self.pos = read_uvarint(self.buf, self.pos)
        for _ in range(n):
            _, self.pos = read_uvarint(self.buf, self.pos)
            size, self.pos = read_uvarint(self.buf, self.pos)
            self._take(size)


def decode_key(key: bytes | None) -> OffsetCommitKey | GroupMetadataKey | None:
    """The key of a __consumer_offsets record, or None for record types this coordinator does not
    keep (KIP-848 and share/streams groups)."""
    if key is None:
        raise RecordFormatError("a __consumer_offsets record without a key")
    try:
        r = _Reader(key)
        version = r.int16()
        if version in (0, 1):
            return OffsetCommitKey(r.str(), r.str(), r.int32())
        if version == 2:
            return GroupMetadataKey(r.str())
        return None
    except (IndexError, struct.error, ProtocolError) as e:
        raise RecordFormatError(f"bad __consumer_offsets key: {e}") from None


def decode_offset_commit_value(value: bytes) -> OffsetAndMetadata:
    try:
        r = _Reader(value)
        version = r.int16()
        if not 0 <= version <= 4:
            raise RecordFormatError(f"unknown offset commit value version {version}")
        r.flexible = version >= 4
        offset = r.int64()
        leader_epoch = r.int32() if version >= 3 else -1
        metadata = r.str()
        commit_ts = r.int64()
        expire_ts = r.int64() if version == 1 else None
        r.tags()
        return OffsetAndMetadata(offset, leader_epoch, metadata, commit_ts, None if expire_ts == -1 else expire_ts)
    except (IndexError, struct.error, ProtocolError) as e:
        raise RecordFormatError(f"bad offset commit value: {e}") from None


def decode_group_metadata_value(value: bytes) -> GroupMetadataRecord:
    try:
        r = _Reader(value)
        version = r.int16()
        if not 0 <= version <= 4:
            raise RecordFormatError(f"unknown group metadata value version {version}")
        r.flexible = version >= 4
        protocol_type = r.str()
        generation = r.int32()
        protocol = r.nstr()
        leader = r.nstr()
        state_ts = r.int64() if version >= 2 else -1
        members = []
        for _ in range(r.array_len()):
            member_id = r.str()
            instance_id = r.nstr() if version >= 3 else None
            client_id = r.str()
            client_host = r.str()
            rebalance_timeout = r.int32() if version >= 1 else -1
            session_timeout = r.int32()
            subscription = r.bytes()
            assignment = r.bytes()
            r.tags()
            if rebalance_timeout < 0:
                rebalance_timeout = session_timeout  # v0 had one timeout for both
            members.append(
                MemberRecord(member_id, instance_id, client_id, client_host, rebalance_timeout, session_timeout,
                             subscription, assignment)
            )
        r.tags()
        return GroupMetadataRecord(protocol_type, generation, protocol, leader, state_ts, members)
    except (IndexError, struct.error, ProtocolError) as e:
        raise RecordFormatError(f"bad group metadata value: {e}") from None

