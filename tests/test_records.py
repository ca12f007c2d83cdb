"""Record batches: every codec round trips, CRC is checked, header patches keep the batch valid,
magic 0/1 is refused, corrupt or bomb-like input raises only ProtocolError."""

import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.errors import ProtocolError
from protocol.records import (
    Compression,
    Header,
    Record,
    decode_batches,
    encode_batch,
    iter_batches,
    read_header,
    set_base_offset,
    set_log_append_time,
    set_partition_leader_epoch,
    verify_crc,
)
from protocol.records.compression import compress, decompress


def sample(n=20):
    return [
        Record(
            value=b"value-%d" % i * (i + 1),
            key=None if i % 3 == 0 else b"key-%d" % i,
            headers=[Header(f"h{j}", None if j == 1 else b"x" * j) for j in range(i % 3)],
            timestamp=1_700_000_000_000 + i,
        )
        for i in range(n)
    ]


@pytest.mark.parametrize("codec", list(Compression))
def test_round_trip_each_codec(codec):
    recs = sample()
    data = encode_batch(recs, base_offset=100, compression=codec, producer_id=7, producer_epoch=1, base_sequence=3)
    [batch] = decode_batches(data)
    h = batch.header
    assert h.compression == codec and h.record_count == 20 and h.last_offset == 119
    assert (h.producer_id, h.producer_epoch, h.base_sequence) == (7, 1, 3)
    for i, (a, b) in enumerate(zip(recs, batch.records)):
        assert (b.key, b.value, b.headers, b.timestamp, b.offset) == (a.key, a.value, a.headers, a.timestamp, 100 + i)


def test_header_read_without_records_and_patching():
    data = bytearray(encode_batch(sample(5), base_offset=0) + encode_batch(sample(3), base_offset=5))
    found = list(iter_batches(data))
    assert [h.record_count for _, h in found] == [5, 3]
    pos, h = found[1]
    set_base_offset(data, pos, 1000)
    set_partition_leader_epoch(data, pos, 9)
    h2 = read_header(data, pos)
    assert (h2.base_offset, h2.partition_leader_epoch) == (1000, 9)
    verify_crc(data, pos, h2)  # outside the CRC: still valid
    set_log_append_time(data, pos, h2, 1_800_000_000_000)
    h3 = read_header(data, pos)
    verify_crc(data, pos, h3)
    recs = decode_batches(bytes(data))[1].records
    assert all(r.timestamp == 1_800_000_000_000 for r in recs)
    assert [r.offset for r in recs] == [1000, 1001, 1002]


def test_crc_mismatch_is_corrupt_message():
    data = bytearray(encode_batch(sample(3)))
    data[-1] ^= 0xFF
    with pytest.raises(ProtocolError) as e:
        list(iter_batches(data))
    assert e.value.error_code == 2 and "CRC" in str(e.value)


@pytest.mark.parametrize("magic", [0, 1])
def test_old_magic_is_unsupported_for_message_format(magic):
    data = bytearray(encode_batch(sample(1)))
    data[16] = magic
    with pytest.raises(ProtocolError) as e:
        list(iter_batches(data, check_crc=False))
    assert e.value.error_code == 43


def test_partial_tail_is_skipped_only_when_allowed():
    one = encode_batch(sample(2))
    data = one + one[:30]
    assert len(list(iter_batches(data, allow_partial_tail=True))) == 1
    with pytest.raises(ProtocolError):
        list(iter_batches(data))


@pytest.mark.parametrize("codec", [Compression.GZIP, Compression.SNAPPY, Compression.LZ4, Compression.ZSTD])
def test_decompression_is_bounded(codec):
    bomb = compress(codec, b"\x00" * (4 << 20))
    assert len(bomb) < 300_000
    with pytest.raises(ProtocolError):
        decompress(codec, bomb, limit=1 << 20)
    assert len(decompress(codec, bomb, limit=8 << 20)) == 4 << 20


def test_raw_snappy_is_accepted():
    import cramjam

    raw = bytes(cramjam.snappy.compress_raw(b"hello" * 100))
    assert decompress(Compression.SNAPPY, raw) == b"hello" * 100


def test_gzip_interoperates_with_zlib():
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    assert decompress(Compression.GZIP, c.compress(b"abc") + c.flush()) == b"abc"


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.sampled_from(list(Compression)))
def test_garbage_raises_only_protocol_error(blob, codec):
    base = bytearray(encode_batch(sample(2), compression=codec))
    for data in (blob, bytes(base[: len(blob) % len(base)]) + blob):
        try:
            decode_batches(data, check_crc=False)
        except ProtocolError:
            pass


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=61, max_value=400), st.integers(min_value=0, max_value=255))
def test_flipped_bytes_raise_only_protocol_error(pos, val):
    data = bytearray(encode_batch(sample(4), compression=Compression.LZ4))
    data[pos % len(data)] = val
    try:
        decode_batches(data, check_crc=False)
    except ProtocolError:
        pass


def test_huge_record_count_does_not_allocate():
    data = bytearray(encode_batch(sample(1)))
    struct.pack_into(">i", data, 57, 2**31 - 1)
    with pytest.raises(ProtocolError):
        decode_batches(data, check_crc=False)
