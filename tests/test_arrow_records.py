"""connector/arrow_records.py: record batches into Arrow, checked against protocol/records'
record-by-record decoder on every codec, plus aborted transactions, ranges and corrupt input."""

from __future__ import annotations

import random
import struct

import pytest

from connector.arrow_records import AbortedTransactions, records_to_arrow
from protocol.errors import ProtocolError
from protocol.records import Header, Record, decode_batches, encode_batch
from protocol.records.compression import Compression


def _batch(records: list[Record], base: int, **kw) -> bytes:
    return encode_batch(records, base_offset=base, **kw)


def _marker(pid: int, base: int, commit: bool) -> bytes:
    key = struct.pack(">hh", 0, 1 if commit else 0)
    value = struct.pack(">hi", 0, 0)
    return encode_batch([Record(key=key, value=value, timestamp=1)], base_offset=base, producer_id=pid,
                        producer_epoch=0, transactional=True, control=True)


def _random_records(rng: random.Random, n: int) -> list[Record]:
    out = []
    for _ in range(n):
        key = None if rng.random() < 0.2 else rng.randbytes(rng.choice([0, 3, 12, 13, 200]))
        value = None if rng.random() < 0.1 else rng.randbytes(rng.choice([0, 1, 11, 12, 64, 5000]))
        headers = [Header(f"h{j}", None if j == 1 else rng.randbytes(5)) for j in range(rng.choice([0, 0, 2]))]
        out.append(Record(key=key, value=value, headers=headers, timestamp=1_700_000_000_000 + rng.randrange(10**6)))
    return out


@pytest.mark.parametrize("codec", list(Compression))
def test_matches_record_decoder(codec: Compression) -> None:
    rng = random.Random(int(codec))
    blobs, base = [], 0
    for size in (1, 7, 300, 64, 2):
        blobs.append(_batch(_random_records(rng, size), base, compression=codec))
        base += size
    blobs.append(_batch(_random_records(rng, 5), base, log_append_time=True))
    data = b"".join(blobs)
    expected = [r for b in decode_batches(data) for r in b.records]
    rb, nxt = records_to_arrow([data], "t", 3, include_headers=True)
    rows = rb.to_pylist()
    assert nxt == base + 5 and len(rows) == len(expected)
    for row, r in zip(rows, expected):
        assert (row["key"], row["value"], row["offset"], row["topic"], row["partition"]) == (r.key, r.value, r.offset, "t", 3)
        assert int(row["timestamp"].timestamp() * 1000) == r.timestamp
        assert row["headers"] == [{"key": h.key, "value": h.value} for h in r.headers]
    assert [row["timestampType"] for row in rows[-5:]] == [1] * 5 and rows[0]["timestampType"] == 0


def test_range_and_partial_tail() -> None:
    recs = [Record(key=b"k%d" % i, value=b"v%d" % i, timestamp=5) for i in range(10)]
    data = _batch(recs[:5], 0) + _batch(recs[5:], 5)
    rb, nxt = records_to_arrow([data + data[:30]], "t", 0, start=3, end=8)
    assert rb.column("offset").to_pylist() == [3, 4, 5, 6, 7] and nxt == 10
    assert "headers" not in rb.schema.names


def test_read_committed_skips_aborted_and_markers() -> None:
    r = [Record(key=b"k", value=b"%d" % i, timestamp=1) for i in range(3)]
    data = b"".join([
        _batch(r[:1], 0),
        _batch(r[:2], 1, producer_id=7, producer_epoch=0, base_sequence=0, transactional=True),  # 1-2 aborted
        _batch(r[:1], 3, producer_id=8, producer_epoch=0, base_sequence=0, transactional=True),  # 3 committed
        _marker(7, 4, commit=False),
        _marker(8, 5, commit=True),
        _batch(r[:1], 6, producer_id=7, producer_epoch=0, base_sequence=2, transactional=True),  # 6 committed later
        _marker(7, 7, commit=True),
    ])
    rb, nxt = records_to_arrow([data], "t", 0, aborted=AbortedTransactions([(7, 1)]))
    assert rb.column("offset").to_pylist() == [0, 3, 6] and nxt == 8
    rb, _ = records_to_arrow([data], "t", 0)
    assert rb.column("offset").to_pylist() == [0, 1, 2, 3, 6]


def test_corrupt_input_is_a_protocol_error() -> None:
    data = bytearray(_batch([Record(key=b"k", value=b"v" * 50, timestamp=1)] * 3, 0))
    data[70] ^= 0xFF
    with pytest.raises(ProtocolError):
        records_to_arrow([bytes(data)], "t", 0)
    # a record whose length claims more than the batch holds, CRC made valid again
    from crc32c import crc32c
    bad = bytearray(_batch([Record(key=b"k", value=b"v", timestamp=1)], 0))
    bad[61] = 0x7E  # record length varint: 63 bytes, far past the end
    struct.pack_into(">I", bad, 17, crc32c(bytes(bad[21:])))
    with pytest.raises(ProtocolError):
        records_to_arrow([bytes(bad)], "t", 0)


def test_empty() -> None:
    rb, nxt = records_to_arrow([], "t", 0, start=42)
    assert rb.num_rows == 0 and nxt == 42


@pytest.mark.parametrize("codec", [Compression.NONE, Compression.LZ4])
def test_record_sizes_in_runs_and_mixed(codec: Compression) -> None:
    """Batches of one record size, of runs of two sizes, of sizes that only add up to a multiple
    of the first, of one record, of two-byte length prefixes."""
    def rec(v: int, n: int) -> Record:
        return Record(key=b"k%03d" % (n % 1000), value=b"x" * v, timestamp=1_700_000_000_000 + n)
    batches = [
        [rec(100, i) for i in range(9000)],  # one size (deltas grow a byte at 64 and 8192): guessed
        [rec(50 if i % 300 < 150 else 60, i) for i in range(1200)],  # runs of two sizes: guessed in rounds
        [rec(v, i) for i, v in enumerate([20, 10, 30, 20])],  # sums to 4 strides of the first: walked
        [rec(7, 0)],  # one record
        [rec(300, i) for i in range(3)],  # two-byte length prefixes
        [rec(v, i) for i, v in enumerate([5, 6, 7])],  # sizes differ: walked
    ]
    blobs, base = [], 0
    for b in batches:
        blobs.append(_batch(b, base, compression=codec))
        base += len(b)
    data = b"".join(blobs)
    expected = [r for b in decode_batches(data) for r in b.records]
    rb, nxt = records_to_arrow([data], "t", 0)
    assert nxt == base and rb.num_rows == len(expected)
    assert rb.column("value").to_pylist() == [r.value for r in expected]
    assert rb.column("key").to_pylist() == [r.key for r in expected]
    assert rb.column("offset").to_pylist() == list(range(base))


def test_every_varint_long_and_every_value_long() -> None:
    """Columns where every varint takes two or three bytes and every key and value is long,
    beside a batch where only some do; random bytes in the values."""
    rng = random.Random(7)
    batches = [
        [Record(key=rng.randbytes(70), value=rng.randbytes(20_000), timestamp=1_700_000_000_000 + 100 * i)
         for i in range(70)],  # lengths of 3 bytes, deltas of 2
        [Record(key=rng.randbytes(13), value=rng.randbytes(rng.choice([13, 64, 200])), timestamp=5) for _ in range(50)],
    ]
    blobs, base = [], 0
    for b in batches:
        blobs.append(_batch(b, base))
        base += len(b)
    data = b"".join(blobs)
    expected = [r for b in decode_batches(data) for r in b.records]
    rb, nxt = records_to_arrow([data], "t", 0)
    assert nxt == base
    assert rb.column("value").to_pylist() == [r.value for r in expected]
    assert rb.column("key").to_pylist() == [r.key for r in expected]
    assert [int(t.timestamp() * 1000) for t in rb.column("timestamp").to_pylist()] == [r.timestamp for r in expected]


def test_a_corrupt_length_prefix_mid_batch() -> None:
    """One record's length prefix changed (CRC made valid again): the batch's records no longer
    add up to its size."""
    from crc32c import crc32c
    data = bytearray(_batch([Record(key=None, value=b"v" * 10, timestamp=1)] * 4, 0))
    first = 61  # the first record's length prefix
    stride = data[first] // 2 + 1
    data[first + 2 * stride] += 2  # the third record claims one byte more
    struct.pack_into(">I", data, 17, crc32c(bytes(data[21:])))
    with pytest.raises(ProtocolError):
        records_to_arrow([bytes(data)], "t", 0)


def test_wal_span_of_many_partitions() -> None:
    """wal_to_arrow: batches of two partitions interleaved in one buffer as a WAL file holds them
    (each with its producer's base offset 0), given the offsets the coordinator assigned; rows
    outside a partition's bounds left out, compressed batches and headers decoded."""
    from connector.arrow_records import wal_to_arrow

    rng = random.Random(5)
    parts = [("a", 0), ("b", 3)]
    layout, blobs, expected, pos = [], [], [], 0
    next_offset = [10, 0]
    for i, codec in enumerate([Compression.NONE, Compression.LZ4, Compression.NONE, Compression.ZSTD, Compression.NONE]):
        tp = i % 2
        recs = _random_records(rng, 40)
        blob = _batch(recs, 0, compression=codec)  # as produced: base offset 0
        layout.append((pos, len(blob), tp, next_offset[tp]))
        expected += [(parts[tp], next_offset[tp] + k, r) for k, r in enumerate(recs)]
        next_offset[tp] += len(recs)
        blobs.append(blob)
        pos += len(blob)
    bounds = [(15, 10 + 120), (0, 60)]
    rb = wal_to_arrow(b"".join(blobs), layout, parts, bounds, include_headers=True)
    want = [(tp, o, r) for tp, o, r in expected if bounds[parts.index(tp)][0] <= o < bounds[parts.index(tp)][1]]
    rows = rb.to_pylist()
    assert len(rows) == len(want)
    for row, ((t, p), o, r) in zip(rows, want):
        assert (row["topic"], row["partition"], row["offset"], row["key"], row["value"]) == (t, p, o, r.key, r.value)
        assert row["headers"] == [{"key": h.key, "value": h.value} for h in r.headers]
    with pytest.raises(ProtocolError):  # the index names a size the batch does not have
        wal_to_arrow(b"".join(blobs), [(0, layout[0][1] + 1, 0, 0)], parts, bounds)


def test_fields_that_do_not_fit_are_protocol_errors() -> None:
    """Each field of a record made to lie (CRC made valid again): a varint longer than Kafka
    reads, a key or value running past its record, no room for the header count. Each is a
    ProtocolError naming the problem, never a read outside the batch."""
    from crc32c import crc32c
    good = _batch([Record(key=b"kk", value=b"v" * 10, timestamp=1)], 0)
    rec = 61  # length, attributes, timestamp delta, offset delta, key length, key, value length, value, headers
    for at, byte, words in [
        (rec, 0x80, "varint too long"),  # the length's first byte goes on, and the next ones do too
        (rec + 4, 0x7E, "past their record"),  # key length 63
        (rec + 7, 0x7E, "past their record"),  # value length 63
        (rec + 7, 0x16, "past their record"),  # value length 11: the header count's byte is taken
    ]:
        data = bytearray(good)
        data[at] = byte
        if words == "varint too long":
            data[at + 1:at + 5] = b"\x80\x80\x80\x80"
        struct.pack_into(">I", data, 17, crc32c(bytes(data[21:])))
        with pytest.raises(ProtocolError, match=words):
            records_to_arrow([bytes(data)], "t", 0)


def test_random_damage_is_a_protocol_error_or_the_same_rows() -> None:
    """Random bytes of the records changed, CRC made valid again: the decode either refuses the
    batch with a ProtocolError or gives the rows the record-by-record decoder gives."""
    from crc32c import crc32c
    rng = random.Random(11)
    good = _batch(_random_records(rng, 20), 0)
    for _ in range(400):
        data = bytearray(good)
        for _ in range(rng.choice([1, 2, 5])):
            data[rng.randrange(61, len(data))] = rng.randrange(256)
        struct.pack_into(">I", data, 17, crc32c(bytes(data[21:])))
        try:
            rb, _ = records_to_arrow([bytes(data)], "t", 0, include_headers=True)
        except ProtocolError:
            continue
        try:
            expected = [r for b in decode_batches(bytes(data)) for r in b.records]
        except (ProtocolError, UnicodeDecodeError):
            continue  # stricter than the decode: header keys are read as UTF-8 there
        assert rb.column("value").to_pylist() == [r.value for r in expected]
        assert rb.column("key").to_pylist() == [r.key for r in expected]
