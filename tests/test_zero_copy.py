"""Zero-copy Fetch answers: a large read comes out of storage as a FileRegion (its bounds found
through the offset index and a short header walk) and goes to the socket with os.sendfile
(node/file_sender.py); on TLS the region is read and written through the transport.

Storage: for every offset, byte budget and high watermark, a read with regions returns exactly
the bytes, cursor and size of a plain read. Sender: real sockets, a reader slower than the
writer (the socket fills, the sender waits for it), answers kept in order behind a region."""

from __future__ import annotations

import asyncio
import os
import random
import socket
import time
from pathlib import Path

import pytest

from broker.storage import Log, LogConfig, local_log
from node.file_sender import FileSender
from protocol.file_region import FileRegion, RegionParts, with_regions
from protocol.records import Record, encode_batch

NOW = 1_700_000_000_000


def _bytes(parts: list) -> bytes:
    out = []
    for p in parts:
        if isinstance(p, FileRegion):
            out.append(os.pread(p.fd, p.size, p.position))
            p.close()
        else:
            out.append(bytes(p))
    return b"".join(out)


@pytest.mark.parametrize("index_interval", [64, 4096, 1 << 20])
def test_region_reads_equal_plain_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, index_interval: int) -> None:
    monkeypatch.setattr(local_log, "REGION_MIN_BYTES", 1)  # every read that can be a region is one
    rnd = random.Random(index_interval)
    log = Log.open(tmp_path / "t-0-0", LogConfig(segment_bytes=40_000, index_interval_bytes=index_interval), now_ms=NOW)
    for i in range(300):
        n = rnd.choice([1, 1, 2, 5, 20])
        size = rnd.choice([10, 100, 700])
        log.append_as_leader(encode_batch([Record(value=os.urandom(size), timestamp=NOW + i) for _ in range(n)]), 0, NOW)
    leo = log.log_end_offset
    assert len(log._local.snapshot()[0]) > 3  # several segments
    used_regions = 0
    for _ in range(600):
        offset = rnd.randrange(0, leo + 1)
        max_bytes = rnd.choice([1, 50, 500, 5_000, 50_000, 1 << 20])
        max_offset = rnd.choice([None, rnd.randrange(offset, leo + 1)])
        min_one = rnd.random() < 0.8
        plain = log.read(offset, max_bytes, max_offset=max_offset, min_one_batch=min_one)
        zc = log.read(offset, max_bytes, max_offset=max_offset, min_one_batch=min_one, regions=True)
        used_regions += sum(isinstance(p, FileRegion) for p in zc.records)
        assert (zc.total_bytes, zc.end_offset) == (plain.total_bytes, plain.end_offset), (offset, max_bytes, max_offset)
        assert _bytes(zc.records) == _bytes(plain.records)
    assert used_regions > 100
    log.close()


def test_small_reads_stay_bytes(tmp_path: Path) -> None:
    log = Log.open(tmp_path / "t-0-0", LogConfig(), now_ms=NOW)
    log.append_as_leader(encode_batch([Record(value=b"x" * 100, timestamp=NOW)]), 0, NOW)
    info = log.read(0, 1 << 20, regions=True)
    assert info.records and not any(isinstance(p, FileRegion) for p in info.records)
    assert with_regions(list(info.records)) is not RegionParts
    log.close()


def test_a_dropped_region_gives_its_descriptor_back(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_bytes(b"abc")
    fd = os.open(f, os.O_RDONLY)
    region = FileRegion(os.dup(fd), 0, 3)
    dup = region.fd
    del region
    with pytest.raises(OSError):
        os.fstat(dup)  # closed with the region (unless reused at once by another open, not here)
    os.close(fd)


async def _pair() -> tuple[asyncio.Transport, socket.socket]:
    loop = asyncio.get_running_loop()
    a, b = socket.socketpair()
    transport, _ = await loop.connect_accepted_socket(asyncio.Protocol, a)
    b.setblocking(False)
    return transport, b  # type: ignore[return-value]


async def _read_all(sock: socket.socket, n: int, slow: bool) -> bytes:
    loop = asyncio.get_running_loop()
    got = bytearray()
    while len(got) < n:
        chunk = await loop.sock_recv(sock, 4096 if slow else 1 << 20)
        assert chunk, "closed early"
        got += chunk
        if slow:
            await asyncio.sleep(0.0005)
    return bytes(got)


@pytest.mark.parametrize("slow", [False, True])
def test_sender_writes_regions_in_order_behind_a_full_socket(tmp_path: Path, slow: bool) -> None:
    data = os.urandom(3 << 20)
    path = tmp_path / "seg"
    path.write_bytes(data)

    async def run() -> None:
        transport, peer = await _pair()
        fd = os.open(path, os.O_RDONLY)
        drained = []
        sender = FileSender(transport, transport.get_extra_info("socket").fileno(), lambda: drained.append(1),
                            lambda e: pytest.fail(f"send failed: {e!r}"))
        expect = b""
        for i in range(5):  # answers: a header, a region, a trailer; the socket fills on the way
            start = i * 500_000
            sender.send([b"H%d" % i, FileRegion(os.dup(fd), start, 600_000), memoryview(b"T%d" % i)])
            expect += b"H%d" % i + data[start:start + 600_000] + b"T%d" % i
        assert sender.busy  # 3 MB do not fit a socket buffer
        got = await _read_all(peer, len(expect), slow)
        assert got == expect
        for _ in range(100):
            if drained:
                break
            await asyncio.sleep(0.01)
        assert drained and not sender.busy
        transport.write(b"after")  # the transport has the socket back
        assert await _read_all(peer, 5, False) == b"after"
        os.close(fd)
        transport.close()
        peer.close()

    asyncio.run(run())


def test_sender_without_a_socket_descriptor_reads_regions(tmp_path: Path) -> None:
    """TLS: no sendfile; the region's bytes are read and written through the transport."""
    path = tmp_path / "seg"
    path.write_bytes(b"0123456789")

    async def run() -> None:
        transport, peer = await _pair()
        fd = os.open(path, os.O_RDONLY)
        sender = FileSender(transport, None, lambda: None, lambda e: pytest.fail(repr(e)))
        sender.send([b"<", FileRegion(os.dup(fd), 2, 5), b">"])
        assert await _read_all(peer, 7, False) == b"<23456>"
        os.close(fd)
        transport.close()
        peer.close()

    asyncio.run(run())


def test_a_truncated_region_closes_the_connection(tmp_path: Path) -> None:
    path = tmp_path / "seg"
    path.write_bytes(b"x" * 100)

    async def run() -> None:
        transport, peer = await _pair()
        fd = os.open(path, os.O_RDONLY)
        errors: list[BaseException] = []
        sender = FileSender(transport, transport.get_extra_info("socket").fileno(), lambda: None, errors.append)
        os.truncate(path, 10)  # an unclean truncation under a region already planned
        sender.send([FileRegion(os.dup(fd), 0, 100)])
        assert errors and "ended" in str(errors[0])
        os.close(fd)
        transport.close()
        peer.close()

    asyncio.run(run())


# ---------------------------------------------------------------- a real broker
@pytest.mark.parametrize("secure", [None, "SSL"])
def test_consumers_read_large_fetches_zero_copy_on_plaintext_only(cluster_factory, secure: str | None) -> None:
    """A consumer catching up on 6 MB through a real broker gets every byte: with os.sendfile on a
    plaintext listener, read and written through TLS on an SSL one (the broker's metrics say
    which path carried them). A follower replicating the topic reads the same way."""
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    from tests.test_metrics import METRICS, scrape, value

    c = cluster_factory(brokers=2, secure=secure, broker_overrides=METRICS)
    conf = c.rdkafka_conf()
    admin = AdminClient(conf)
    admin.create_topics([NewTopic("zc", 2, 2)])["zc"].result(30)
    producer = Producer({**conf, "acks": "all", "linger.ms": 20, "batch.size": 1_000_000})
    sent = {}
    for i in range(3_000):
        v = os.urandom(2_000)
        sent[(i % 2, i // 2)] = v
        producer.produce("zc", value=v, key=b"%d" % i, partition=i % 2)
    assert producer.flush(60) == 0
    consumer = Consumer({**conf, "group.id": "zc", "enable.auto.commit": False, "fetch.max.bytes": 8 << 20,
                         "max.partition.fetch.bytes": 4 << 20})
    consumer.assign([TopicPartition("zc", p, 0) for p in (0, 1)])
    got = {}
    deadline = time.monotonic() + 60
    while len(got) < len(sent) and time.monotonic() < deadline:
        for m in consumer.consume(1000, 1.0):
            assert m.error() is None, m.error()
            got[(m.partition(), m.offset())] = m.value()
    consumer.close()
    assert got == sent
    totals = [scrape(c.metrics_url(b)) for b in (1, 2)]
    zero_copy = sum(value(s, "strata_fetch_sendfile_bytes_total") for s in totals)
    read = sum(value(s, "strata_fetch_region_read_bytes_total") for s in totals)
    if secure is None:
        # the consumer's 6 MB went out with sendfile (and most of the followers' copies: their
        # newest small batches come from memory), none was read into the process
        assert zero_copy >= 6_000_000 and read == 0, (zero_copy, read)
    else:
        assert read >= 6_000_000 and zero_copy == 0, (zero_copy, read)


@pytest.mark.parametrize("big_every", [0, 7])
def test_reads_from_the_kept_tail_equal_reads_from_the_file(tmp_path: Path, big_every: int) -> None:
    """The newest small batches of the active segment are read from memory: every read at or near
    the end gives what a read of the file alone gives, across rolls, a batch too big to keep, and a
    truncation."""
    rnd = random.Random(big_every)
    cfg = LogConfig(segment_bytes=30_000, index_interval_bytes=256)
    log = Log.open(tmp_path / "t-0-0", cfg, now_ms=NOW)
    checked = 0
    for i in range(400):
        size = 20_000 if big_every and i % big_every == 0 else rnd.choice([10, 200, 900])
        n = 1 if size > 1_000 else rnd.choice([1, 3])
        log.append_as_leader(encode_batch([Record(value=os.urandom(size), timestamp=NOW + i) for _ in range(n)]), 0, NOW)
        if i == 250:
            log.truncate_to(log.log_end_offset - 5)
        if i % 9 == 0:
            segments = log._local.segments
            leo = log.log_end_offset
            for offset in range(max(0, leo - 40), leo + 1):
                for max_bytes in (0, 100, 1_000, 5_000, 1 << 20):
                    for max_offset in (None, leo - 1, leo - 3):
                        if max_offset is not None and max_offset < offset:
                            continue
                        a = log.read(offset, max_bytes, max_offset=max_offset)
                        kept = [seg._tail for seg in segments]
                        for seg in segments:
                            seg._tail = ()  # the same read from the file alone
                        b = log.read(offset, max_bytes, max_offset=max_offset)
                        for seg, t in zip(segments, kept):
                            seg._tail = t
                        assert (a.total_bytes, a.end_offset, _bytes(a.records)) == \
                            (b.total_bytes, b.end_offset, _bytes(b.records)), (i, offset, max_bytes, max_offset)
                        checked += 1
    assert checked > 5_000
    log.close()
