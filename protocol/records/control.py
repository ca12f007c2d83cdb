"""Control batches: one control record, key = version int16 (0) | type int16.

- Transaction markers (attributes transactional + control), type 0 ABORT or 1 COMMIT; value =
  version int16 (0) | coordinator epoch int32. The base sequence is -1: markers carry no sequence.
- Raft's leader change (attributes control only), type 2 LEADER_CHANGE: the first batch a new
  leader of the metadata log writes in its epoch (KIP-595); value = a LeaderChangeMessage.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from protocol.errors import ProtocolError
from protocol.generated.control_records.leader_change_message import LeaderChangeMessage
from protocol.records.codec import Record, decode_batches, encode_batch

CONTROL_ABORT = 0
CONTROL_COMMIT = 1
CONTROL_LEADER_CHANGE = 2
LEADER_CHANGE_VERSION = 0  # Kafka's current one; v1 adds directory ids (KIP-853, not built)
_KEY = struct.Struct(">hh")
_VALUE = struct.Struct(">hi")
CORRUPT_MESSAGE = 2


class TxnMarker(NamedTuple):
    commit: bool
    coordinator_epoch: int


def encode_txn_marker(
    producer_id: int, producer_epoch: int, coordinator_epoch: int, commit: bool, timestamp: int
) -> bytes:
    """One control batch at offset 0 (the log assigns the real one)."""
    record = Record(
        key=_KEY.pack(0, CONTROL_COMMIT if commit else CONTROL_ABORT),
        value=_VALUE.pack(0, coordinator_epoch),
        timestamp=timestamp,
    )
    return encode_batch(
        [record],
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=-1,
        transactional=True,
        control=True,
    )


def read_txn_marker(batch) -> TxnMarker | None:
    """The marker in one whole control batch (bytes of exactly that batch), or None when its
    control record is not a transaction marker (an unknown control type). Raises ProtocolError
    when the batch does not decode."""
    decoded = decode_batches(batch, check_crc=False)
    if not decoded or not decoded[0].records:
        raise ProtocolError("control batch without a control record", error_code=CORRUPT_MESSAGE)
    rec = decoded[0].records[0]
    if rec.key is None or len(rec.key) < _KEY.size:
        raise ProtocolError("control record without a valid key", error_code=CORRUPT_MESSAGE)
    _, kind = _KEY.unpack_from(rec.key, 0)
    if kind not in (CONTROL_ABORT, CONTROL_COMMIT):
        return None
    epoch = -1
    if rec.value is not None and len(rec.value) >= _VALUE.size:
        epoch = _VALUE.unpack_from(rec.value, 0)[1]
    return TxnMarker(kind == CONTROL_COMMIT, epoch)


def leader_change_record(leader_id: int, voters: list[int], granting: list[int], timestamp: int) -> Record:
    """The LEADER_CHANGE control record a new Raft leader writes first in its epoch."""
    M = LeaderChangeMessage
    msg = M(version=LEADER_CHANGE_VERSION, leader_id=leader_id,
            voters=[M.Voter(voter_id=v) for v in sorted(voters)],
            granting_voters=[M.Voter(voter_id=v) for v in sorted(granting)])
    return Record(key=_KEY.pack(0, CONTROL_LEADER_CHANGE), value=msg.encode(LEADER_CHANGE_VERSION),
                  timestamp=timestamp)


def control_type(record: Record) -> int:
    """The control type in a control record's key (-1 when the key is too short)."""
    if record.key is None or len(record.key) < _KEY.size:
        return -1
    return _KEY.unpack_from(record.key, 0)[1]


def read_leader_change(record: Record) -> LeaderChangeMessage | None:
    """The LeaderChangeMessage of a LEADER_CHANGE control record, None for other control types."""
    if control_type(record) != CONTROL_LEADER_CHANGE or record.value is None:
        return None
    value = bytes(record.value)
    version = int.from_bytes(value[:2], "big", signed=True) if len(value) >= 2 else 0
    return LeaderChangeMessage.decode(value, min(max(version, 0), LeaderChangeMessage.MAX_VERSION))


__all__ = ["CONTROL_ABORT", "CONTROL_COMMIT", "CONTROL_LEADER_CHANGE", "TxnMarker", "control_type",
           "encode_txn_marker", "leader_change_record", "read_leader_change", "read_txn_marker"]
