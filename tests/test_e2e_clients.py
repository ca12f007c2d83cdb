"""End to end with real clients: aiokafka, kafka-python, confluent-kafka and kcat each produce 100,000
messages with keys, headers and timestamps into a 3-partition topic and read back exactly the
same messages, for every compression codec, against a real 1-controller, 3-broker cluster."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time

import pytest

from tools.cluster import Cluster

N = 100_000
CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
PARTITIONS = 3
BASE_TS = 1_700_000_000_000

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("e2e"), brokers=3)
    c.start()
    yield c
    c.stop()


def messages(tag: str) -> list[tuple[bytes, bytes, list[tuple[str, bytes]], int]]:
    return [
        (f"{tag}-k{i}".encode(), f"{tag}-value-{i}-".encode() * 3, [("n", str(i).encode()), ("tag", tag.encode())], BASE_TS + i)
        for i in range(N)
    ]


def create_topic(bootstrap: str, name: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    fs = admin.create_topics([NewTopic(name, num_partitions=PARTITIONS, replication_factor=1)], operation_timeout=30)
    fs[name].result(60)


def by_key(rows) -> dict:
    return {k: (v, h, ts) for k, v, h, ts in rows}


def check(expected, got, *, check_ts: bool = True) -> None:
    assert len(got) == len(expected), f"read {len(got)} messages, expected {len(expected)}"
    exp, rec = by_key(expected), by_key(got)
    assert rec.keys() == exp.keys()
    for k, (v, h, ts) in exp.items():
        gv, gh, gts = rec[k]
        assert gv == v and sorted(gh) == sorted(h), k
        if check_ts:
            assert gts == ts, k


# ---------------------------------------------------------------- confluent-kafka (librdkafka)
def confluent_round_trip(bootstrap: str, topic: str, codec: str):
    from confluent_kafka import Consumer, Producer

    msgs = messages(topic)
    p = Producer({"bootstrap.servers": bootstrap, "compression.type": codec, "linger.ms": 5, "acks": "all"})
    for i, (k, v, h, ts) in enumerate(msgs):
        while True:
            try:
                p.produce(topic, value=v, key=k, headers=h, timestamp=ts)
                break
            except BufferError:
                p.poll(0.05)
        if i % 10000 == 0:
            p.poll(0)
    assert p.flush(120) == 0
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{topic}", "auto.offset.reset": "earliest",
                  "enable.auto.commit": False})
    from confluent_kafka import TopicPartition

    c.assign([TopicPartition(topic, i, 0) for i in range(PARTITIONS)])
    got = []
    deadline = time.time() + 120
    while len(got) < N and time.time() < deadline:
        for m in c.consume(10000, 1.0):
            assert m.error() is None, m.error()
            got.append((m.key(), m.value(), [(hk, hv) for hk, hv in (m.headers() or [])], m.timestamp()[1]))
    c.close()
    return msgs, got


# ---------------------------------------------------------------- kafka-python
def kafka_python_round_trip(bootstrap: str, topic: str, codec: str):
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    msgs = messages(topic)
    p = KafkaProducer(bootstrap_servers=bootstrap, compression_type=None if codec == "none" else codec,
                      linger_ms=5, acks="all", enable_idempotence=False, batch_size=65536)
    for k, v, h, ts in msgs:
        p.send(topic, value=v, key=k, headers=h, timestamp_ms=ts)
    p.flush(120)
    p.close(10)
    c = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest",
                      consumer_timeout_ms=10000)
    c.assign([TopicPartition(topic, i) for i in range(PARTITIONS)])
    c.seek_to_beginning()
    got = []
    deadline = time.time() + 120
    while len(got) < N and time.time() < deadline:
        for recs in c.poll(timeout_ms=1000, max_records=10000).values():
            got.extend((r.key, r.value, list(r.headers), r.timestamp) for r in recs)
    c.close()
    return msgs, got


# ---------------------------------------------------------------- aiokafka
def aiokafka_round_trip(bootstrap: str, topic: str, codec: str):
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    msgs = messages(topic)

    async def run():
        p = AIOKafkaProducer(bootstrap_servers=bootstrap, compression_type=None if codec == "none" else codec,
                             linger_ms=5, acks="all", max_batch_size=65536)
        await p.start()
        try:
            futs = []
            for k, v, h, ts in msgs:
                futs.append(await p.send(topic, value=v, key=k, headers=h, timestamp_ms=ts))
            await asyncio.gather(*futs)
        finally:
            await p.stop()
        c = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest")
        await c.start()
        got = []
        try:
            c.assign([TopicPartition(topic, i) for i in range(PARTITIONS)])
            await c.seek_to_beginning()
            deadline = time.time() + 120
            while len(got) < N and time.time() < deadline:
                batch = await c.getmany(timeout_ms=1000, max_records=10000)
                for recs in batch.values():
                    got.extend((r.key, r.value, list(r.headers), r.timestamp) for r in recs)
        finally:
            await c.stop()
        return got

    return msgs, asyncio.run(run())


CLIENTS = {"confluent": confluent_round_trip, "kafka-python": kafka_python_round_trip, "aiokafka": aiokafka_round_trip}


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("client", list(CLIENTS))
def test_client_round_trip(cluster, client, codec):
    topic = f"{client}-{codec}"
    create_topic(cluster.bootstrap, topic)
    expected, got = CLIENTS[client](cluster.bootstrap, topic, codec)
    check(expected, got)


KCAT = shutil.which("kcat")


@pytest.mark.parametrize("codec", CODECS)
def test_kcat_round_trip(cluster, codec):
    if KCAT is None:
        pytest.fail("kcat is not installed: `make test` installs Debian's kcat; install it with apt-get install kcat")
    topic = f"kcat-{codec}"
    create_topic(cluster.bootstrap, topic)
    lines = "".join(f"kcat-{codec}-k{i}\tkcat-{codec}-value-{i}\n" for i in range(N))
    start_ms = int(time.time() * 1000)
    prod = subprocess.run(
        [KCAT, "-P", "-b", cluster.bootstrap, "-t", topic, "-K", "\t", "-z", codec, "-H", "src=kcat", "-X", "linger.ms=5"],
        input=lines.encode(), capture_output=True, timeout=300,
    )
    assert prod.returncode == 0, prod.stderr.decode()[-2000:]
    cons = subprocess.run(
        [KCAT, "-C", "-b", cluster.bootstrap, "-t", topic, "-o", "beginning", "-e", "-q",
         "-f", "%k\t%s\t%h\t%T\n"],
        capture_output=True, timeout=300,
    )
    assert cons.returncode == 0, cons.stderr.decode()[-2000:]
    rows = [line.split("\t") for line in cons.stdout.decode().splitlines()]
    assert len(rows) == N
    got = {k: (v, h, int(ts)) for k, v, h, ts in rows}
    assert len(got) == N
    for i in range(N):
        v, h, ts = got[f"kcat-{codec}-k{i}"]
        assert v == f"kcat-{codec}-value-{i}" and h == "src=kcat"
        assert start_ms - 1000 <= ts <= int(time.time() * 1000) + 1000  # CreateTime set by librdkafka
