"""Record batches (Kafka's v2 format, as a Fetch returns them) straight into Arrow.

No Record objects are built: the records' fields are located with numpy over all records of a
fetch at once, and key/value columns point into the decompressed bytes. This is what the
Spark source yields: Arrow batches cross into Spark without per-row Python objects.

Columns are those of Spark's Kafka source: key, value (binary), topic (string), partition (int),
offset (long), timestamp (timestamp, microseconds UTC, from Kafka's milliseconds), timestampType (int: 0 CreateTime, 1 LogAppendTime) and,
with include_headers, headers (array<struct<key: string, value: binary>>).

Under read_committed the caller passes the Fetch response's aborted transactions; records of an
aborted transaction are dropped the way Kafka's consumer drops them: a transactional batch is
skipped while its producer has an aborted transaction started at or before the batch, until that
producer's ABORT marker. Control batches never become rows.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

import numpy as np
import pyarrow as pa

from protocol.errors import ProtocolError
from protocol.primitives import read_varint, read_varlong
from protocol.records.aborted import AbortedTransactions
from protocol.records.batch import BATCH_HEADER_SIZE, iter_batches
from protocol.records.compression import Compression, decompress

CORRUPT_MESSAGE = 2
_CONTROL_KEY = struct.Struct(">hh")  # version, type (0 ABORT, 1 COMMIT)

HEADER_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


def arrow_schema(include_headers: bool) -> pa.Schema:
    fields = [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),  # what Spark's TimestampType arrives as
        ("timestampType", pa.int32()),
    ]
    if include_headers:
        fields.append(("headers", HEADER_TYPE))
    return pa.schema(fields)


SPARK_SCHEMA = (
    "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, timestampType int"
)
SPARK_SCHEMA_WITH_HEADERS = SPARK_SCHEMA + ", headers array<struct<key: string, value: binary>>"


def _varints_at(B: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Zigzag varints starting at each of `pos` in B (vectorized): (values int64, byte lengths)."""
    acc = np.zeros(len(pos), np.uint64)
    length = np.zeros(len(pos), np.int64)
    active = np.ones(len(pos), bool)
    for k in range(10):
        byte = B[pos + k]
        acc |= np.where(active, (byte & 0x7F).astype(np.uint64) << np.uint64(7 * k), np.uint64(0))
        length += active
        active &= byte >= 0x80
        if not active.any():
            break
    else:
        raise ProtocolError("varint too long", error_code=CORRUPT_MESSAGE)
    values = (acc >> np.uint64(1)).astype(np.int64) ^ -(acc & np.uint64(1)).astype(np.int64)
    return values, length


def _record_starts(buf: bytes, count: int) -> list[int]:
    """Walk the records' length prefixes, the one sequential step: where each record starts."""
    starts: list[int] = []
    append = starts.append
    p = 0
    n = len(buf)
    for _ in range(count):
        append(p)
        b = buf[p]
        if b < 0x80:
            length, q = (b >> 1) ^ -(b & 1), p + 1
        elif buf[p + 1] < 0x80:  # records of 64..8191 bytes: two bytes
            v = (b & 0x7F) | (buf[p + 1] << 7)
            length, q = (v >> 1) ^ -(v & 1), p + 2
        else:
            length, q = read_varint(buf, p)
        if length < 0 or q + length > n:
            raise ProtocolError("record length runs past the end of the batch", offset=p, error_code=CORRUPT_MESSAGE)
        p = q + length
    if p != n:
        raise ProtocolError("bytes left over after a batch's records", offset=p, error_code=CORRUPT_MESSAGE)
    return starts


def _binary_column(buf: bytes, B: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> pa.Array:
    """A binary column of the spans (start, length) of buf, null where length < 0. Built as an
    Arrow binary-view array over buf (16-byte views made with numpy), then cast to plain binary
    in C++: no Python object per value."""
    n = len(starts)
    if n == 0:
        return pa.array([], pa.binary())
    valid = lengths >= 0
    ln = np.where(valid, lengths, 0).astype(np.int32)
    views = np.zeros((n, 16), np.uint8)
    v32 = views.view(np.int32).reshape(n, 4)
    v32[:, 0] = ln
    width = min(12, int(ln.max()))
    for k in range(width):  # inline bytes (values up to 12 bytes), the 4-byte prefix otherwise
        views[:, 4 + k] = np.where(k < ln, B[starts + k], 0)
    long_ = ln > 12
    if long_.any():
        v32[long_, 2] = 0  # data buffer index
        v32[long_, 3] = starts[long_].astype(np.int32)
    validity = None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little").tobytes())
    arr = pa.Array.from_buffers(pa.binary_view(), n, [validity, pa.py_buffer(views), pa.py_buffer(buf)])
    return arr.cast(pa.binary())


def _headers(buf: bytes, positions: np.ndarray, rec_ends: np.ndarray) -> list:
    out = []
    for p, end in zip(positions.tolist(), rec_ends.tolist()):
        nh, q = read_varint(buf, p)
        hs = []
        for _ in range(nh):
            hk_len, q = read_varint(buf, q)
            hk = buf[q:q + hk_len].decode("utf-8", "replace")
            q += hk_len
            hv_len, q = read_varint(buf, q)
            hv = None if hv_len < 0 else buf[q:q + hv_len]
            q += max(hv_len, 0)
            hs.append((hk, hv))
        if q != end:
            raise ProtocolError("record length does not match its fields", offset=p, error_code=CORRUPT_MESSAGE)
        out.append(hs)
    return out


def records_to_arrow(
    chunks: Iterable[bytes | memoryview],
    topic: str,
    partition: int,
    *,
    start: int = 0,
    end: int = 2**63 - 1,
    include_headers: bool = False,
    aborted: AbortedTransactions | None = None,
) -> tuple[pa.RecordBatch, int]:
    """Decode fetched record-batch bytes (one or more blobs, in offset order) into one Arrow
    batch holding the records with offsets in [start, end). Returns (batch, next offset): the
    offset after the last batch read, so a reader knows where to fetch on even when every row was
    filtered (control batches, aborted data). A partial trailing batch is left for the next fetch.

    The batches' record bytes are joined into one buffer; the only per-record Python step is the
    walk over length prefixes, every field after that is decoded with numpy over all records."""
    bodies: list = []
    counts: list[int] = []
    base_offsets: list[int] = []
    base_ts: list[int] = []
    append_ts: list[int] = []  # -1: CreateTime
    next_offset = start
    for blob in chunks:
        mv = memoryview(blob)
        for pos, h in iter_batches(mv, check_crc=True, allow_partial_tail=True):
            last = h.base_offset + h.last_offset_delta
            if last < start:
                continue
            next_offset = max(next_offset, last + 1)
            if h.base_offset >= end:
                continue
            attrs = h.attributes
            body: bytes | memoryview = mv[pos + BATCH_HEADER_SIZE:pos + h.size]
            codec = attrs & 0x07
            if codec:
                try:
                    body = decompress(Compression(codec), body)
                except ValueError:
                    raise ProtocolError(f"unknown compression codec {codec}", error_code=CORRUPT_MESSAGE) from None
            if attrs & 0x20:  # control batch: a transaction marker, never a row
                if aborted is not None and h.record_count:
                    data = bytes(body)
                    _, q = read_varint(data, 0)
                    _, q = read_varlong(data, q + 1)  # timestamp delta
                    _, q = read_varint(data, q)
                    marker_klen, q = read_varint(data, q)
                    if marker_klen >= 4:
                        aborted.marker(h.producer_id, _CONTROL_KEY.unpack_from(data, q)[1] == 0)
                continue
            if aborted is not None and aborted.skips(h.producer_id, last, bool(attrs & 0x10)):
                continue
            bodies.append(body)
            counts.append(h.record_count)
            base_offsets.append(h.base_offset)
            base_ts.append(h.base_timestamp)
            append_ts.append(h.max_timestamp if attrs & 0x08 else -1)
    buf = b"".join(bodies)
    total = sum(counts)
    try:
        starts = np.asarray(_record_starts(buf, total), np.int64)
        B = np.frombuffer(buf + bytes(16), np.uint8)  # padding: vectorized reads may look 10 bytes on
        rec_len, ln = _varints_at(B, starts)
        body_at = starts + ln
        rec_end = body_at + rec_len
        p = body_at + 1  # attributes
        ts_delta, ln = _varints_at(B, p)
        p = p + ln
        off_delta, ln = _varints_at(B, p)
        p = p + ln
        klen, ln = _varints_at(B, p)
        kstart = p + ln
        p = kstart + np.maximum(klen, 0)
        vlen, ln = _varints_at(B, p)
        vstart = p + ln
        p = vstart + np.maximum(vlen, 0)
        if total and (p >= rec_end).any():
            raise ProtocolError("record fields run past their record", error_code=CORRUPT_MESSAGE)
    except IndexError:
        raise ProtocolError("record batch truncated", error_code=CORRUPT_MESSAGE) from None
    offsets = np.repeat(np.asarray(base_offsets, np.int64), counts) + off_delta
    ats = np.repeat(np.asarray(append_ts, np.int64), counts)
    timestamps = np.where(ats >= 0, ats, np.repeat(np.asarray(base_ts, np.int64), counts) + ts_delta)
    keep = (offsets >= start) & (offsets < end)
    if not keep.all():
        offsets, timestamps, ats = offsets[keep], timestamps[keep], ats[keep]
        kstart, klen, vstart, vlen, p, rec_end = kstart[keep], klen[keep], vstart[keep], vlen[keep], p[keep], rec_end[keep]
    n = len(offsets)
    arrays = [
        _binary_column(buf, B, kstart, klen),
        _binary_column(buf, B, vstart, vlen),
        pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)), pa.array([topic])).cast(pa.string()),
        pa.array(np.full(n, partition, np.int32)),
        pa.array(offsets),
        pa.array(timestamps * 1000, pa.timestamp("us", tz="UTC")),
        pa.array((ats >= 0).astype(np.int32)),
    ]
    if include_headers:
        arrays.append(pa.array(_headers(buf, p, rec_end), HEADER_TYPE))
    elif n and (B[p] != 0).any():  # a record with headers must still parse to its end
        _headers(buf, p[B[p] != 0], rec_end[B[p] != 0])
    return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema(include_headers)), next_offset
