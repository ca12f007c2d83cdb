"""Full encode/decode of record batches, records and headers (tools, tests, the Spark source).

The broker's hot path never calls this: it works on headers and bytes (protocol.records.batch).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from crc32c import crc32c

from protocol.errors import ProtocolError
from protocol.primitives import read_varint, read_varlong, varint
from protocol.records.batch import (
    ATTR_CONTROL,
    ATTR_TIMESTAMP_TYPE,
    ATTR_TRANSACTIONAL,
    BATCH_HEADER_SIZE,
    HEADER,
    BatchHeader,
    iter_batches,
)
from protocol.records.compression import DEFAULT_LIMIT, Compression, compress, decompress

__all__ = ["Compression", "DecodedBatch", "Header", "Record", "decode_batches", "encode_batch"]

CORRUPT_MESSAGE = 2


@dataclass(frozen=True)
class Header:
    key: str
    value: bytes | None


@dataclass
class Record:
    value: bytes | None
    key: bytes | None = None
    headers: list[Header] = field(default_factory=list)
    timestamp: int = -1  # absolute ms; -1 means "the batch's base timestamp"
    offset: int = -1  # absolute offset once decoded


@dataclass
class DecodedBatch:
    header: BatchHeader
    records: list[Record]

    @property
    def base_offset(self) -> int:
        return self.header.base_offset


def _write_bytes(out: bytearray, b: bytes | None) -> None:
    if b is None:
        out += varint(-1)
    else:
        out += varint(len(b))
        out += b


def _encode_record(rec: Record, offset_delta: int, timestamp_delta: int) -> bytes:
    body = bytearray(b"\x00")  # attributes: unused, always 0
    body += varint(timestamp_delta)
    body += varint(offset_delta)
    _write_bytes(body, rec.key)
    _write_bytes(body, rec.value)
    body += varint(len(rec.headers))
    for h in rec.headers:
        k = h.key.encode()
        body += varint(len(k))
        body += k
        _write_bytes(body, h.value)
    return varint(len(body)) + bytes(body)


def encode_batch(
    records: list[Record],
    *,
    base_offset: int = 0,
    compression: int = Compression.NONE,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    partition_leader_epoch: int = -1,
    transactional: bool = False,
    control: bool = False,
    log_append_time: bool = False,
    base_timestamp: int | None = None,
) -> bytes:
    """One magic-2 batch holding ``records`` (offsets are base_offset + index)."""
    if not records:
        raise ValueError("a record batch needs at least one record")
    stamps = [r.timestamp for r in records if r.timestamp >= 0]
    if base_timestamp is None:
        base_timestamp = min(stamps) if stamps else 0
    max_ts = max(stamps) if stamps else base_timestamp
    body = b"".join(
        _encode_record(r, i, (r.timestamp if r.timestamp >= 0 else base_timestamp) - base_timestamp)
        for i, r in enumerate(records)
    )
    if compression != Compression.NONE:
        body = compress(compression, body)
    attributes = int(compression)
    if log_append_time:
        attributes |= ATTR_TIMESTAMP_TYPE
    if transactional:
        attributes |= ATTR_TRANSACTIONAL
    if control:
        attributes |= ATTR_CONTROL
    total = BATCH_HEADER_SIZE + len(body)
    buf = bytearray(total)
    HEADER.pack_into(
        buf, 0, base_offset, total - 12, partition_leader_epoch, 2, 0, attributes, len(records) - 1,
        base_timestamp, max_ts, producer_id, producer_epoch, base_sequence, len(records),
    )
    buf[BATCH_HEADER_SIZE:] = body
    struct.pack_into(">I", buf, 17, crc32c(memoryview(buf)[21:]))
    return bytes(buf)


def _read_bytes(buf, pos: int) -> tuple[bytes | None, int]:
    n, pos = read_varint(buf, pos)
    if n < 0:
        return None, pos
    end = pos + n
    if end > len(buf):
        raise ProtocolError("record field runs past the end of the batch", offset=pos, error_code=CORRUPT_MESSAGE)
    return bytes(buf[pos:end]), end


def _decode_records(data, header: BatchHeader) -> list[Record]:
    out: list[Record] = []
    pos = 0
    base_ts = header.base_timestamp
    for _ in range(header.record_count):
        length, pos = read_varint(data, pos)
        end = pos + length
        if length < 0 or end > len(data):
            raise ProtocolError("record length runs past the end of the batch", offset=pos, error_code=CORRUPT_MESSAGE)
        p = pos + 1  # skip attributes
        ts_delta, p = read_varlong(data, p)
        off_delta, p = read_varint(data, p)
        key, p = _read_bytes(data, p)
        value, p = _read_bytes(data, p)
        nh, p = read_varint(data, p)
        if nh < 0 or nh > end - p:
            raise ProtocolError("bad header count", offset=p, error_code=CORRUPT_MESSAGE)
        headers = []
        for _ in range(nh):
            hk, p = _read_bytes(data, p)
            hv, p = _read_bytes(data, p)
            if hk is None:
                raise ProtocolError("null header key", offset=p, error_code=CORRUPT_MESSAGE)
            headers.append(Header(hk.decode("utf-8", "replace"), hv))
        if p != end:
            raise ProtocolError("record length does not match its fields", offset=pos, error_code=CORRUPT_MESSAGE)
        ts = header.max_timestamp if header.log_append_time else base_ts + ts_delta
        out.append(Record(value=value, key=key, headers=headers, timestamp=ts, offset=header.base_offset + off_delta))
        pos = end
    if pos != len(data):
        raise ProtocolError("bytes left over after the batch's records", offset=pos, error_code=CORRUPT_MESSAGE)
    return out


def decode_batches(buf, *, check_crc: bool = True, limit: int = DEFAULT_LIMIT) -> list[DecodedBatch]:
    """Every batch in a records blob, decompressed, records decoded. A partial last batch
    (as a fetch response may end) is skipped."""
    mv = memoryview(buf)
    out = []
    for pos, header in iter_batches(mv, check_crc=check_crc, allow_partial_tail=True):
        body = mv[pos + BATCH_HEADER_SIZE : pos + header.size]
        if header.compression != Compression.NONE:
            try:
                codec = Compression(header.compression)
            except ValueError:
                raise ProtocolError(f"unknown compression codec {header.compression}", error_code=CORRUPT_MESSAGE) from None
            body = memoryview(decompress(codec, body, limit))
        try:
            records = _decode_records(body, header)
        except (IndexError, struct.error):
            raise ProtocolError("record batch truncated", offset=pos, error_code=CORRUPT_MESSAGE) from None
        out.append(DecodedBatch(header, records))
    return out
