"""Record batches (Kafka's v2 format, as a Fetch returns them) straight into Arrow.

No Record objects are built: one pass in C (connector/_record_scan.c) locates every record's
fields, and the columns are built from them with numpy and pyarrow over all records of a fetch
at once. This is what the Spark source yields: Arrow batches cross into Spark without per-row
Python objects.

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

try:
    import connector._record_scan as _record_scan
except ImportError as e:  # built by `pip install` where a C compiler is (setup.py)
    raise ImportError(f"the strata Spark source needs its compiled record scanner: {e}; "
                      "reinstall strata where a C compiler and Python's headers are") from e
from protocol.errors import ProtocolError
from protocol.primitives import read_varint, read_varlong
from protocol.records.aborted import AbortedTransactions
from protocol.records.batch import BATCH_HEADER_SIZE, BatchHeader, iter_batches
from protocol.records.compression import Compression, decompress

CORRUPT_MESSAGE = 2
_FIELDS = 8  # the rows of _record_scan.scan's output
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


def _binary_column(buf: bytes | memoryview, starts: np.ndarray, lengths: np.ndarray) -> pa.Array:
    """A binary column of the spans (start, length) of buf, null where length < 0: its offsets
    and bytes written by the scanner's gather, no Python object per value."""
    n = len(starts)
    valid = lengths >= 0
    offsets = np.empty(n + 1, np.int32)
    data = np.empty(int(lengths[valid].sum()) if n else 0, np.uint8)
    try:
        _record_scan.gather(buf, starts, lengths, offsets, data)
    except ValueError as e:
        raise ProtocolError(str(e), error_code=CORRUPT_MESSAGE) from None
    validity = None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little").tobytes())
    return pa.Array.from_buffers(pa.binary(), n, [validity, pa.py_buffer(offsets), pa.py_buffer(data)])


def _headers(buf: bytes | memoryview, positions: np.ndarray, rec_ends: np.ndarray) -> list:
    out = []
    for p, end in zip(positions.tolist(), rec_ends.tolist()):
        nh, q = read_varint(buf, p)
        hs = []
        for _ in range(nh):
            hk_len, q = read_varint(buf, q)
            hk = bytes(buf[q:q + hk_len]).decode("utf-8", "replace")
            q += hk_len
            hv_len, q = read_varint(buf, q)
            hv = None if hv_len < 0 else bytes(buf[q:q + hv_len])
            q += max(hv_len, 0)
            hs.append((hk, hv))
        if q != end:
            raise ProtocolError("record length does not match its fields", offset=p, error_code=CORRUPT_MESSAGE)
        out.append(hs)
    return out


class _Batches:
    """The data batches of one decode, in order: where each one's records lie and its header
    fields. A batch body is a slice of the caller's buffer when uncompressed (`src` names which
    buffer), or its decompressed bytes."""

    def __init__(self) -> None:
        self.bodies: list[bytes | memoryview] = []
        self.src: list[int] = []  # the buffer the body is a slice of, -1: decompressed
        self.los: list[int] = []  # where the body starts in that buffer
        self.counts: list[int] = []
        self.base_offsets: list[int] = []
        self.base_ts: list[int] = []
        self.append_ts: list[int] = []  # -1: CreateTime
        self.tp: list[int] = []  # which (topic, partition) of the decode

    def add(self, src: int, mv: memoryview, pos: int, h: BatchHeader, base_offset: int, tp: int) -> None:
        body: bytes | memoryview = mv[pos + BATCH_HEADER_SIZE:pos + h.size]
        codec = h.attributes & 0x07
        if codec:
            try:
                body = decompress(Compression(codec), body)
            except ValueError:
                raise ProtocolError(f"unknown compression codec {codec}", error_code=CORRUPT_MESSAGE) from None
            src = -1
        self.bodies.append(body)
        self.src.append(src)
        self.los.append(pos + BATCH_HEADER_SIZE)
        self.counts.append(h.record_count)
        self.base_offsets.append(base_offset)
        self.base_ts.append(h.base_timestamp)
        self.append_ts.append(h.max_timestamp if h.attributes & 0x08 else -1)
        self.tp.append(tp)

    def to_arrow(self, sources: list[memoryview], tps: list[tuple[str, int]], bounds: list[tuple[int, int]],
                 include_headers: bool) -> pa.RecordBatch:
        """The records as Arrow columns, those with offsets in their (topic, partition)'s bounds.
        Bodies that are all slices of one buffer are read where they lie; others are joined into
        one buffer first."""
        if self.src and self.src[0] >= 0 and self.src.count(self.src[0]) == len(self.src):
            buf: bytes | memoryview = sources[self.src[0]]
            los = self.los
            his = [lo + len(b) for lo, b in zip(los, self.bodies)]
        else:
            buf = b"".join(self.bodies)
            his = np.cumsum([len(b) for b in self.bodies], dtype=np.int64).tolist()
            los = [0, *his[:-1]] if his else []
        counts = self.counts
        total = sum(counts)
        fields = np.empty((_FIELDS, total), np.int64)
        try:
            with_headers = _record_scan.scan(buf, np.asarray(los, np.int64), np.asarray(his, np.int64),
                                             np.asarray(counts, np.int64), fields)
        except ValueError as e:
            raise ProtocolError(str(e), error_code=CORRUPT_MESSAGE) from None
        ts_delta, off_delta, kstart, klen, vstart, vlen, p, rec_end = fields
        # what is one value per batch is worked out per batch and repeated over its records
        tp_b = np.asarray(self.tp, np.intp)
        bounds_b = np.asarray(bounds, np.int64).reshape(-1, 2)[tp_b]
        append_b = np.asarray(self.append_ts, np.int64)
        offsets = np.repeat(np.asarray(self.base_offsets, np.int64), counts) + off_delta
        timestamps = np.repeat(np.asarray(self.base_ts, np.int64), counts) + ts_delta
        if (append_b >= 0).any():  # LogAppendTime batches: the batch's max timestamp for every record
            ats = np.repeat(append_b, counts)
            timestamps = np.where(ats >= 0, ats, timestamps)
        ts_type = np.repeat((append_b >= 0).astype(np.int32), counts)
        partition = np.repeat(np.asarray([q for _, q in tps], np.int32)[tp_b], counts)
        topics = sorted({t for t, _ in tps})
        codes = np.repeat(np.asarray([topics.index(t) for t, _ in tps], np.int32)[tp_b], counts) if len(topics) > 1 else None
        keep = (offsets >= np.repeat(bounds_b[:, 0], counts)) & (offsets < np.repeat(bounds_b[:, 1], counts))
        if not keep.all():
            offsets, timestamps, ts_type, partition = offsets[keep], timestamps[keep], ts_type[keep], partition[keep]
            kstart, klen, vstart, vlen, p, rec_end = kstart[keep], klen[keep], vstart[keep], vlen[keep], p[keep], rec_end[keep]
            codes = None if codes is None else codes[keep]
        if codes is None:  # one topic (every read but a WAL span of several): one value repeated in C++
            topic = pa.repeat(pa.scalar(topics[0] if topics else "", pa.string()), len(offsets))
        else:
            topic = pa.DictionaryArray.from_arrays(pa.array(codes), pa.array(topics, pa.string())).cast(pa.string())
        arrays = [
            _binary_column(buf, kstart, klen),
            _binary_column(buf, vstart, vlen),
            topic,
            pa.array(partition),
            pa.array(offsets),
            pa.array(timestamps * 1000, pa.timestamp("us", tz="UTC")),
            pa.array(ts_type),
        ]
        if include_headers:
            arrays.append(pa.array(_headers(buf, p, rec_end), HEADER_TYPE))
        elif with_headers:  # a record with headers must still parse to its end
            has = np.frombuffer(buf, np.uint8)[p] != 0  # a header count
            _headers(buf, p[has], rec_end[has])
        return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema(include_headers))


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
    filtered (control batches, aborted data). A partial trailing batch is left for the next fetch."""
    batches = _Batches()
    sources: list[memoryview] = []
    next_offset = start
    for blob in chunks:
        mv = memoryview(blob)
        sources.append(mv)
        for pos, h in iter_batches(mv, check_crc=True, allow_partial_tail=True):
            last = h.base_offset + h.last_offset_delta
            if last < start:
                continue
            next_offset = max(next_offset, last + 1)
            if h.base_offset >= end:
                continue
            attrs = h.attributes
            if attrs & 0x20:  # control batch: a transaction marker, never a row
                if aborted is not None and h.record_count:
                    data = bytes(mv[pos + BATCH_HEADER_SIZE:pos + h.size])
                    if attrs & 0x07:
                        data = decompress(Compression(attrs & 0x07), data)
                    _, q = read_varint(data, 0)
                    _, q = read_varlong(data, q + 1)  # timestamp delta
                    _, q = read_varint(data, q)
                    marker_klen, q = read_varint(data, q)
                    if marker_klen >= 4:
                        aborted.marker(h.producer_id, _CONTROL_KEY.unpack_from(data, q)[1] == 0)
                continue
            if aborted is not None and aborted.skips(h.producer_id, last, bool(attrs & 0x10)):
                continue
            batches.add(len(sources) - 1, mv, pos, h, h.base_offset, 0)
    return batches.to_arrow(sources, [(topic, partition)], [(start, end)], include_headers), next_offset


def wal_to_arrow(buf: bytes | memoryview, batches: Iterable[tuple[int, int, int, int]], tps: list[tuple[str, int]],
                 bounds: list[tuple[int, int]], include_headers: bool = False) -> pa.RecordBatch:
    """Decode batches of many partitions lying in one buffer (a span of a diskless WAL file, as
    the producers wrote them) into one Arrow batch. `batches` are (position, size, index into
    tps, assigned base offset): the file holds each batch with its producer's base offset, the
    diskless coordinator's index the one it assigned. Rows keep the offsets in their partition's
    bounds; control batches are never rows (diskless topics take no transactions)."""
    mv = memoryview(buf)
    out = _Batches()
    for pos, size, tp, base in batches:
        one = mv[pos:pos + size]
        for at, h in iter_batches(one, check_crc=True):
            if at or h.size != size:
                raise ProtocolError(f"the batch at {pos} is not {size} bytes", error_code=CORRUPT_MESSAGE)
            if not h.attributes & 0x20:
                out.add(0, mv, pos, h, base, tp)
    return out.to_arrow([mv], tps, bounds, include_headers)
