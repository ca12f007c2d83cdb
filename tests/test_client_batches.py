"""Record batches written by real clients decode with ours and their CRCs validate.

librdkafka (confluent-kafka), kafka-python and aiokafka each produce keyed messages with headers
and timestamps to a protocol-level peer (tests/capture_peer.py) with every compression codec;
we decode every captured batch and compare with what was sent.
"""

import asyncio

import pytest

from protocol.records import Compression, decode_batches, iter_batches
from tests.capture_peer import CapturePeer

N = 200
CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]


def expected():
    # Compressible values: librdkafka sends a batch uncompressed when compression does not pay.
    return [(b"key-%d" % i, b"value-%d " % i * 40, [("h", b"%d" % i)], 1_700_000_000_000 + i) for i in range(N)]


def check(peer: CapturePeer, codec: str) -> None:
    assert not peer.errors
    got = []
    codecs = set()
    for _, _, records in peer.captured:
        for _, header in iter_batches(records):  # verifies each CRC
            codecs.add(header.compression)
        for batch in decode_batches(records):
            for r in batch.records:
                got.append((r.key, r.value, [(h.key, h.value) for h in r.headers], r.timestamp))
    assert got == expected()
    assert codecs == {Compression[codec.upper()]}


@pytest.mark.parametrize("codec", CODECS)
def test_librdkafka_batches(codec):
    from confluent_kafka import Producer

    with CapturePeer("t") as peer:
        p = Producer(
            {
                "bootstrap.servers": f"127.0.0.1:{peer.port}",
                "compression.type": codec,
                "linger.ms": 20,
                "broker.address.family": "v4",
            }
        )
        for k, v, h, ts in expected():
            p.produce("t", value=v, key=k, headers=h, timestamp=ts, partition=0)
        assert p.flush(30) == 0
        check(peer, codec)


@pytest.mark.parametrize("codec", CODECS)
def test_kafka_python_batches(codec):
    from kafka import KafkaProducer

    with CapturePeer("t") as peer:
        p = KafkaProducer(
            bootstrap_servers=f"127.0.0.1:{peer.port}",
            compression_type=None if codec == "none" else codec,
            linger_ms=20,
            enable_idempotence=False,  # the capture peer serves no InitProducerId
        )
        futures = [
            p.send("t", value=v, key=k, headers=h, timestamp_ms=ts, partition=0) for k, v, h, ts in expected()
        ]
        p.flush(30)
        for f in futures:
            f.get(10)
        p.close(5)
        check(peer, codec)


@pytest.mark.parametrize("codec", CODECS)
def test_aiokafka_batches(codec):
    from aiokafka import AIOKafkaProducer

    async def run(port: int) -> None:
        p = AIOKafkaProducer(
            bootstrap_servers=f"127.0.0.1:{port}", compression_type=None if codec == "none" else codec, linger_ms=20
        )
        await p.start()
        try:
            futs = [
                await p.send("t", value=v, key=k, headers=h, timestamp_ms=ts, partition=0)
                for k, v, h, ts in expected()
            ]
            await asyncio.gather(*futs)
        finally:
            await p.stop()

    with CapturePeer("t") as peer:
        asyncio.run(run(peer.port))
        check(peer, codec)
