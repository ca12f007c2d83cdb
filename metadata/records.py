"""Metadata record framing, as KRaft stores it in a record's value:
unsigned varint frame version (1), unsigned varint record type, unsigned varint record version,
then the record body."""

from __future__ import annotations

from typing import Any

from protocol.errors import ProtocolError
from protocol.generated import METADATA_RECORDS
from protocol.primitives import read_uvarint, uvarint

FRAME_VERSION = 1


def encode_record(record: Any, version: int | None = None) -> bytes:
    v = record.MAX_VERSION if version is None else version
    return uvarint(FRAME_VERSION) + uvarint(record.API_KEY) + uvarint(v) + record.encode(v)


def decode_record(data) -> tuple[Any, int]:
    """(record, version). Raises ProtocolError for an unknown type or a malformed body."""
    mv = memoryview(data)
    try:
        frame_version, pos = read_uvarint(mv, 0)
        rtype, pos = read_uvarint(mv, pos)
        version, pos = read_uvarint(mv, pos)
    except IndexError:
        raise ProtocolError("metadata record header truncated") from None
    if frame_version != FRAME_VERSION:
        raise ProtocolError(f"unknown metadata record frame version {frame_version}")
    cls = METADATA_RECORDS.get(rtype)
    if cls is None:
        raise ProtocolError(f"unknown metadata record type {rtype}")
    return cls.decode(mv[pos:], version), version
