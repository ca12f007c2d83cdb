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
from protocol.records.batch import BATCH_HEADER_SIZE, BatchHeader, iter_batches
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


def _varints_at(B: np.ndarray, pos: np.ndarray, guesses: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Zigzag varints starting at each of `pos` in B (vectorized): (values int64, byte lengths).
    Each further byte is read only where the one before says it continues (most fields of a
    record are one byte), so nothing past a well-formed varint is touched. With `guesses` the
    positions may be wrong (record starts guessed, then checked): there a varint longer than ten
    bytes or running past B is no error but a value of -1 in 0 bytes, which no check accepts."""
    byte = B[pos]
    cont = byte >= 0x80
    if not cont.any():  # every one a single byte (most fields of most records): no 64-bit accumulator
        one = byte.astype(np.int64)
        return (one >> 1) ^ -(one & 1), np.ones(len(pos), np.int64)
    acc = (byte & 0x7F).astype(np.uint64)
    length = np.ones(len(pos), np.int64)
    more: np.ndarray | None = None if cont.all() else np.flatnonzero(cont)  # None: every one goes on
    last = len(B) - 1
    k = 1
    while more is None or len(more):
        if k == 10:
            if not guesses:
                raise ProtocolError("varint too long", error_code=CORRUPT_MESSAGE)
            length[slice(None) if more is None else more] = -1
            break
        if more is None:  # whole columns while every varint goes on (a record's length, a long value's)
            at = pos + k
            byte = B[np.minimum(at, last) if guesses else at]
            acc |= (byte & 0x7F).astype(np.uint64) << np.uint64(7 * k)
            length += 1
            cont = byte >= 0x80
            if not cont.all():
                more = np.flatnonzero(cont)
        else:
            at = pos[more] + k
            byte = B[np.minimum(at, last) if guesses else at]
            acc[more] |= (byte & 0x7F).astype(np.uint64) << np.uint64(7 * k)
            length[more] += 1
            more = more[byte >= 0x80]
        k += 1
    values = (acc >> np.uint64(1)).astype(np.int64) ^ -(acc & np.uint64(1)).astype(np.int64)
    if guesses:
        bad = (length < 0) | (pos + length > len(B))
        values[bad], length[bad] = -1, 0
    return values, length


def _walk(buf: bytes | memoryview, p: int, end: int, count: int, out: np.ndarray, i: int) -> None:
    """Walk one batch's record length prefixes (the sequential step) from p: where each of its
    `count` records starts, written to out[i:i + count]."""
    for k in range(i, i + count):
        out[k] = p
        b = buf[p]
        if b < 0x80:
            length, q = (b >> 1) ^ -(b & 1), p + 1
        elif buf[p + 1] < 0x80:  # records of 64..8191 bytes: two bytes
            v = (b & 0x7F) | (buf[p + 1] << 7)
            length, q = (v >> 1) ^ -(v & 1), p + 2
        else:
            length, q = read_varint(buf, p)
        if length < 0 or q + length > end:
            raise ProtocolError("record length runs past the end of the batch", offset=p, error_code=CORRUPT_MESSAGE)
        p = q + length
    if p != end:
        raise ProtocolError("bytes left over after a batch's records", offset=p, error_code=CORRUPT_MESSAGE)


_WALK_BELOW = 32  # a batch whose size changes within fewer records than this is walked
_MAX_GUESS = 8192  # records guessed per batch and round


def _record_starts(buf: bytes | memoryview, B: np.ndarray, los: list[int], his: list[int], counts: list[int]) -> np.ndarray:
    """Where each record starts, batch by batch (batch j's records fill buf[los[j]:his[j]]).

    A record's start is known only from the one before it (its length prefix): a walk of one
    Python step per record. But a batch's records mostly come in runs of one size (fixed-width
    keys and values; the offset and timestamp deltas grow a varint byte at 64 and 8192): so in
    rounds, for every batch at once with numpy, the next starts are guessed at the stride of the
    record at hand and checked: the guesses up to the first record whose length prefix says
    another size are right (the first is, and each right start's prefix leads to the next), and
    the next round starts there with its size. A batch whose runs are short is walked instead."""
    out = np.empty(sum(counts), np.int64)
    live = [j for j, c in enumerate(counts) if c]
    for j, c in enumerate(counts):
        if not c and los[j] != his[j]:
            raise ProtocolError("bytes left over after a batch's records", offset=los[j], error_code=CORRUPT_MESSAGE)
    first = np.cumsum([0, *counts[:-1]], dtype=np.int64) if counts else np.zeros(0, np.int64)
    pos = np.asarray(los, np.int64)[live]
    end = np.asarray(his, np.int64)[live]
    rem = np.asarray(counts, np.int64)[live]
    idx = first[live]
    ids = np.asarray(live, np.int64)
    window = np.full(len(live), _MAX_GUESS, np.int64)
    while len(ids):
        value, ln = _varints_at(B, pos)
        if (value < 0).any():
            raise ProtocolError("a record's length is negative", error_code=CORRUPT_MESSAGE)
        stride = value + ln
        k = np.minimum(np.minimum(rem, window), -(-(end - pos) // stride))  # guesses stay before the batch end
        seg_end = np.cumsum(k)
        within = np.arange(int(seg_end[-1]), dtype=np.int64) - np.repeat(seg_end - k, k)
        guess = np.repeat(pos, k) + within * np.repeat(stride, k)
        v, n = _varints_at(B, guess, guesses=True)
        fail = np.flatnonzero(v + n != np.repeat(stride, k))
        took = k.copy()  # records whose start is now known: up to the first other size
        if len(fail):
            seg, at = np.unique(np.searchsorted(seg_end, fail, side="right"), return_index=True)
            took[seg] = within[fail[at]]
        keep = within < np.repeat(took, k)
        out[np.repeat(idx, k)[keep] + within[keep]] = guess[keep]
        pos += took * stride
        rem -= took
        idx += took
        done = rem == 0
        if (pos[done] != end[done]).any() or (pos[~done] >= end[~done]).any():
            raise ProtocolError("a batch's records do not add up to its size", error_code=CORRUPT_MESSAGE)
        short = ~done & (took < _WALK_BELOW)
        for j, p, r, i in zip(ids[short].tolist(), pos[short].tolist(), rem[short].tolist(), idx[short].tolist()):
            _walk(buf, p, his[j], r, out, i)
        go = ~done & ~short
        ids, pos, end, rem, idx = ids[go], pos[go], end[go], rem[go], idx[go]
        window = np.minimum(_MAX_GUESS, 4 * took[go])
    return out


def _word_at(B: np.ndarray, at: np.ndarray) -> np.ndarray:
    """The 4 bytes at each of `at` in B as they lie (a long value's prefix in its view), in one
    gather through a view of B whose items overlap (a stride of one byte); each of `at` is at
    least 4 bytes before B's end."""
    return np.ndarray((max(len(B) - 3, 0),), np.int32, B, 0, (1,))[at]


def _binary_column(buf: bytes | memoryview, B: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> pa.Array:
    """A binary column of the spans (start, length) of buf, null where length < 0. Built as an
    Arrow binary-view array over buf (16-byte views made with numpy: a value of up to 12 bytes
    inline, a longer one as its 4-byte prefix and offset), then cast to plain binary in C++: no
    Python object per value."""
    n = len(starts)
    if n == 0:
        return pa.array([], pa.binary())
    valid = lengths >= 0
    ln = np.where(valid, lengths, 0).astype(np.int32)
    views = np.zeros((n, 16), np.uint8)
    v32 = views.view(np.int32)
    v32[:, 0] = ln
    long_ = np.flatnonzero(ln > 12)
    if len(long_) == n:  # all long (values of most topics): whole columns, no gather of rows
        v32[:, 1] = _word_at(B, starts)
        v32[:, 3] = starts  # buffer 0 (buf), offset: buf stays under 2 GiB
    elif len(long_):
        at = starts[long_]
        v32[long_, 1] = _word_at(B, at)
        v32[long_, 3] = at
    short = np.flatnonzero((ln > 0) & (ln <= 12))
    if len(short):
        k = np.arange(12)
        inside = k < ln[short, None]
        at = np.where(inside, starts[short, None] + k, 0)  # nothing read past a value
        views[short, 4:16] = np.where(inside, B[at], 0)
    validity = None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little").tobytes())
    arr = pa.Array.from_buffers(pa.binary_view(), n, [validity, pa.py_buffer(views), pa.py_buffer(buf)])
    return arr.cast(pa.binary())


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
            los = [0, *his[:-1]]
        counts = self.counts
        total = sum(counts)
        B = np.frombuffer(buf, np.uint8)
        try:
            starts = _record_starts(buf, B, los, his, counts)
            rec_len, ln = _varints_at(B, starts)
            rec_end = starts + ln + rec_len
            p = starts + ln + 1  # attributes
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
        offsets = np.repeat(np.asarray(self.base_offsets, np.int64), counts) + off_delta
        ats = np.repeat(np.asarray(self.append_ts, np.int64), counts)
        timestamps = np.where(ats >= 0, ats, np.repeat(np.asarray(self.base_ts, np.int64), counts) + ts_delta)
        tp = np.repeat(np.asarray(self.tp, np.int32), counts)
        lo_hi = np.asarray(bounds, np.int64).reshape(-1, 2)[tp]
        keep = (offsets >= lo_hi[:, 0]) & (offsets < lo_hi[:, 1])
        if not keep.all():
            offsets, timestamps, ats, tp = offsets[keep], timestamps[keep], ats[keep], tp[keep]
            kstart, klen, vstart, vlen, p, rec_end = kstart[keep], klen[keep], vstart[keep], vlen[keep], p[keep], rec_end[keep]
        topics = sorted({t for t, _ in tps})
        topic_of = np.asarray([topics.index(t) for t, _ in tps], np.int32)
        partition_of = np.asarray([q for _, q in tps], np.int32)
        arrays = [
            _binary_column(buf, B, kstart, klen),
            _binary_column(buf, B, vstart, vlen),
            pa.DictionaryArray.from_arrays(pa.array(topic_of[tp]), pa.array(topics, pa.string())).cast(pa.string()),
            pa.array(partition_of[tp]),
            pa.array(offsets),
            pa.array(timestamps * 1000, pa.timestamp("us", tz="UTC")),
            pa.array((ats >= 0).astype(np.int32)),
        ]
        has = B[p] != 0 if len(p) else np.zeros(0, bool)
        if include_headers:
            arrays.append(pa.array(_headers(buf, p, rec_end), HEADER_TYPE))
        elif has.any():  # a record with headers must still parse to its end
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
    filtered (control batches, aborted data). A partial trailing batch is left for the next fetch.

    The only per-record Python step is a walk over the length prefixes of batches whose record
    sizes vary often; every field is decoded with numpy over all records."""
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
