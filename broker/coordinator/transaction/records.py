"""The records of __transaction_state (sans-IO): one key per transactional id, its latest state as
the value, a null value deletes it (the topic is compacted, so the latest record per id is all
that has to survive).

Our own encoding, laid out after Kafka's TransactionLogKey / TransactionLogValue. Big-endian;
strings are int16 length + UTF-8::

    key   := version int16 (0) | transactional id string
    value := version int16 (0)
             | producer id int64 | previous producer id int64 | next producer id int64
             | producer epoch int16 | last producer epoch int16
             | transaction timeout ms int32 | state int8
             | partition topic count int32 | (topic string | partition count int32 | partition int32*)*
             | last update timestamp ms int64 | transaction start timestamp ms int64

The state codes are Kafka's (Empty 0 .. PrepareEpochFence 7); PrepareEpochFence and Dead are never
written. A reader refuses versions it does not know rather than guess at them.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass, field

TRANSACTION_STATE_TOPIC = "__transaction_state"
KEY_VERSION = 0
VALUE_VERSION = 0

_H = struct.Struct(">h")
_I = struct.Struct(">i")
_VALUE_HEAD = struct.Struct(">hqqqhhib")
_TIMESTAMPS = struct.Struct(">qq")


class TransactionState(enum.IntEnum):
    EMPTY = 0
    ONGOING = 1
    PREPARE_COMMIT = 2
    PREPARE_ABORT = 3
    COMPLETE_COMMIT = 4
    COMPLETE_ABORT = 5
    DEAD = 6
    PREPARE_EPOCH_FENCE = 7

    @property
    def display(self) -> str:
        return "".join(part.capitalize() for part in self.name.split("_"))


class TxnRecordFormatError(ValueError):
    """A key or value of __transaction_state that does not parse."""


@dataclass(frozen=True)
class TransactionLogValue:
    producer_id: int
    previous_producer_id: int
    next_producer_id: int
    producer_epoch: int
    last_producer_epoch: int
    timeout_ms: int
    state: TransactionState
    partitions: frozenset[tuple[str, int]] = field(default_factory=frozenset)
    last_update_ms: int = -1
    start_ms: int = -1


def _str(out: bytearray, s: str) -> None:
    b = s.encode()
    out += _H.pack(len(b))
    out += b


def encode_key(transactional_id: str) -> bytes:
    out = bytearray(_H.pack(KEY_VERSION))
    _str(out, transactional_id)
    return bytes(out)


def encode_value(v: TransactionLogValue) -> bytes:
    out = bytearray(_VALUE_HEAD.pack(
        VALUE_VERSION, v.producer_id, v.previous_producer_id, v.next_producer_id, v.producer_epoch,
        v.last_producer_epoch, v.timeout_ms, int(v.state),
    ))
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(v.partitions):
        by_topic.setdefault(topic, []).append(partition)
    out += _I.pack(len(by_topic))
    for topic, parts in by_topic.items():
        _str(out, topic)
        out += _I.pack(len(parts))
        for p in parts:
            out += _I.pack(p)
    out += _TIMESTAMPS.pack(v.last_update_ms, v.start_ms)
    return bytes(out)


class _Reader:
    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.pos = 0

    def unpack(self, st: struct.Struct) -> tuple:
        if self.pos + st.size > len(self.buf):
            raise TxnRecordFormatError(f"record of {len(self.buf)} bytes ends inside a field")
        values = st.unpack_from(self.buf, self.pos)
        self.pos += st.size
        return values

    def int32(self) -> int:
        return self.unpack(_I)[0]

    def str(self) -> str:
        (n,) = self.unpack(_H)
        if n < 0 or self.pos + n > len(self.buf):
            raise TxnRecordFormatError(f"string of {n} bytes does not fit the record")
        s = self.buf[self.pos : self.pos + n].decode("utf-8", "replace")
        self.pos += n
        return s


def decode_key(key: bytes | None) -> str:
    """The transactional id of a record key."""
    if key is None:
        raise TxnRecordFormatError("a __transaction_state record without a key")
    r = _Reader(bytes(key))
    (version,) = r.unpack(_H)
    if version != KEY_VERSION:
        raise TxnRecordFormatError(f"unknown transaction log key version {version}")
    return r.str()


def decode_value(value: bytes) -> TransactionLogValue:
    r = _Reader(bytes(value))
    version, pid, prev_pid, next_pid, epoch, last_epoch, timeout, state = r.unpack(_VALUE_HEAD)
    if version != VALUE_VERSION:
        raise TxnRecordFormatError(f"unknown transaction log value version {version}")
    try:
        st = TransactionState(state)
    except ValueError:
        raise TxnRecordFormatError(f"unknown transaction state {state}") from None
    partitions = set()
    topics = r.int32()
    if topics < 0:
        raise TxnRecordFormatError("negative topic count")
    for _ in range(topics):
        topic = r.str()
        n = r.int32()
        if n < 0:
            raise TxnRecordFormatError("negative partition count")
        for _ in range(n):
            partitions.add((topic, r.int32()))
    last_update, start = r.unpack(_TIMESTAMPS)
    return TransactionLogValue(pid, prev_pid, next_pid, epoch, last_epoch, timeout, st, frozenset(partitions),
                               last_update, start)
