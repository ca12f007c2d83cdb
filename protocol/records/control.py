"""Transaction markers: control batches (attributes transactional + control) holding one control
record. Key = version int16 (0) | type int16 (0 ABORT, 1 COMMIT); value = version int16 (0) |
coordinator epoch int32. The base sequence is -1: markers carry no sequence.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from protocol.errors import ProtocolError
from protocol.records.codec import Record, decode_batches, encode_batch

CONTROL_ABORT = 0
CONTROL_COMMIT = 1
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


__all__ = ["CONTROL_ABORT", "CONTROL_COMMIT", "TxnMarker", "encode_txn_marker", "read_txn_marker"]
