"""--throttle bounds the replication rate (measured within 20%).

A 4-broker cluster, one partition on brokers [1, 2] holding ~6 MB, moved to [3, 4] with
`kafka-reassign-partitions.sh --execute --throttle 500000`. The new replicas' segment files are
sampled every 0.25 s; the rate each one achieves over the steady middle of its copy (least-squares
slope; the first and the last second left out: the token bucket starts with one second of burst,
the last fetch is partial) must be within 20% of 500,000 B/s, and the whole move must take at least 0.8 x size /
throttle. Then --verify until complete, and every message is read back from brokers 3 and 4 alone.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

from tests.conftest import ClusterFactory, eventually, installed_script
from tools.admin import Admin
from tools.cluster import Cluster

# timing- or CPU-sensitive: runs after the parallel part of `make test`, alone
pytestmark = pytest.mark.serial

THROTTLE = 500_000  # B/s
MESSAGES = 6_000
VALUE = 1024
SAMPLE_S = 0.25
TOLERANCE = 0.20


REASSIGN = installed_script("kafka-reassign-partitions.sh")
CHUNKS = installed_script("kafka-chunks.sh")


def run(bs: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([REASSIGN, "--bootstrap-server", bs, *args], capture_output=True, text=True, timeout=90)



def replicas_of(bs: str, topic: str) -> dict[int, list[int]]:
    md = AdminClient({"bootstrap.servers": bs}).list_topics(topic, timeout=10).topics[topic]
    assert md.error is None, md.error
    return {p: list(pm.replicas) for p, pm in md.partitions.items()}


def produce(bs: str, topic: str, values: list[bytes]) -> None:
    # Batches of at most 64 KiB: smaller than one throttled fetch (rate / 4), so the copy advances
    # in even steps and the sampled slope shows the throttle, not the producer's batching.
    p = Producer(
        {"bootstrap.servers": bs, "acks": "all", "linger.ms": 5, "batch.size": 65536, "message.timeout.ms": 60000}
    )
    errors: list[Any] = []
    for v in values:
        while True:
            try:
                p.produce(topic, value=v, partition=0, on_delivery=lambda e, m: e and errors.append(e))
                break
            except BufferError:
                p.poll(0.05)
        p.poll(0)
    assert p.flush(90) == 0
    assert not errors, errors[:3]


def consume(bs: str, topic: str, n: int, timeout: float = 60) -> list[tuple[int, bytes]]:
    c = Consumer({"bootstrap.servers": bs, "group.id": f"check-{topic}", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, 0)])
    got: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + timeout
    try:
        while len(got) < n and time.monotonic() < deadline:
            for m in c.consume(10000, 0.5):
                if m.error() is None:
                    got.append((m.offset(), m.value()))
    finally:
        c.close()
    return got


def log_bytes(cluster: Cluster, broker: int, topic: str) -> int:
    """Bytes in the .log segment files of the broker's replica of topic-0 (chunk 0), 0 if none."""
    total = 0
    for d in cluster.node_dir(broker).glob(f"logs-*/{topic}-0-0"):
        try:
            names = os.listdir(d)
        except FileNotFoundError:
            continue
        for name in names:
            if name.endswith(".log"):
                try:
                    total += os.stat(d / name).st_size
                except FileNotFoundError:
                    pass
    return total


def steady_rate(samples: list[tuple[float, int]], full: int) -> tuple[float, float, float]:
    """(bytes/s over the middle, copy start, copy end) of one replica: start is the last sample
    before its first byte, end the first sample at the full size; the rate is the least-squares
    slope of the samples between start + 1 s and end - 1 s."""
    first = next(i for i, (_, n) in enumerate(samples) if n > 0)
    start = samples[max(first - 1, 0)][0]
    last = next(i for i, (_, n) in enumerate(samples) if n >= full)
    end = samples[last][0]
    middle = [(t, n) for t, n in samples if start + 1.0 <= t <= end - 1.0]
    assert len(middle) >= 8, f"too few samples in the middle of the copy ({len(middle)}): {samples}"
    mt = sum(t for t, _ in middle) / len(middle)
    mn = sum(n for _, n in middle) / len(middle)
    slope = sum((t - mt) * (n - mn) for t, n in middle) / sum((t - mt) ** 2 for t, _ in middle)
    return slope, start, end


def sample_copies(cluster: Cluster, brokers: list[int], topic: str, full: int,
                  started: float) -> dict[int, list[tuple[float, int]]]:
    """(time, bytes) of each broker's replica of topic-0 (chunk 0) every SAMPLE_S until all hold
    `full` bytes; fails if that takes over 3 x size / throttle + 30 s from `started`."""
    samples: dict[int, list[tuple[float, int]]] = {b: [] for b in brokers}
    deadline = started + 3 * full / THROTTLE + 30
    next_sample = time.monotonic()
    while True:
        now = time.monotonic()
        for b in brokers:
            samples[b].append((now, log_bytes(cluster, b, topic)))
        if all(s[-1][1] >= full for s in samples.values()):
            return samples
        assert now < deadline, f"the new replicas did not catch up: {[s[-1] for s in samples.values()]} of {full}"
        next_sample += SAMPLE_S
        time.sleep(max(0.0, next_sample - time.monotonic()))


def filled_topic(cluster: Cluster, topic: str, messages: int) -> tuple[list[bytes], int]:
    """Create `topic`, one partition on brokers [1, 2], and produce `messages` values of VALUE
    bytes; returns them and the size of each replica's log once both hold them all."""
    bs = cluster.bootstrap

    async def create() -> None:
        async with Admin(bs) as a:
            [r] = await a.create_topics([(topic, -1, -1, {0: [1, 2]}, None)])
            assert r.error_code == 0, (r.error_code, r.error_message)

    asyncio.run(create())
    eventually(lambda: replicas_of(bs, topic) == {0: [1, 2]})
    filler = os.urandom(VALUE)
    values = [b"%08d" % i + filler[8:] for i in range(messages)]
    produce(bs, topic, values)
    full = log_bytes(cluster, 1, topic)
    eventually(lambda: log_bytes(cluster, 2, topic) == full)
    assert full >= messages * VALUE, full
    return values, full


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_throttle_bounds_replication_rate(cluster_factory: ClusterFactory, tmp_path: Path) -> None:
    cluster = cluster_factory(brokers=4)
    bs = cluster.bootstrap
    topic = "throttled"
    values, full = filled_topic(cluster, topic, MESSAGES)
    assert log_bytes(cluster, 3, topic) == log_bytes(cluster, 4, topic) == 0

    move = tmp_path / "move.json"
    move.write_text(json.dumps({"version": 1, "partitions": [{"topic": topic, "partition": 0, "replicas": [3, 4]}]}))
    t_execute = time.monotonic()
    r = run(bs, "--execute", "--reassignment-json-file", str(move), "--throttle", str(THROTTLE))
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert f"The inter-broker throttle limit was set to {THROTTLE} B/s" in r.stdout, r.stdout
    samples = sample_copies(cluster, [3, 4], topic, full, t_execute)

    rates = {b: steady_rate(s, full) for b, s in samples.items()}
    report = ", ".join(
        f"broker {b}: {rate:,.0f} B/s over {end - start - 2:.1f}s of {end - start:.1f}s"
        for b, (rate, start, end) in rates.items()
    )
    print(f"throttle {THROTTLE:,} B/s, {full:,} bytes per replica; {report}")
    for b, (rate, _, _) in rates.items():
        assert abs(rate - THROTTLE) <= TOLERANCE * THROTTLE, f"broker {b} replicated at {rate:,.0f} B/s: {report}"
    # not unthrottled: the copy as a whole took about size / throttle (less the bucket's 1 s burst)
    copy_s = max(end for _, _, end in rates.values()) - t_execute
    assert copy_s >= 0.8 * full / THROTTLE, f"moved {full:,} bytes in {copy_s:.1f}s at a {THROTTLE:,} B/s throttle"

    deadline = time.monotonic() + 60
    while True:
        r = run(bs, "--verify", "--reassignment-json-file", str(move))
        assert r.returncode == 0, (r.stdout, r.stderr)
        if f"Reassignment of partition {topic}-0 is completed." in r.stdout:
            break
        assert f"Reassignment of partition {topic}-0 is still in progress." in r.stdout, r.stdout
        assert time.monotonic() < deadline, f"--verify did not report completion within 60 s: {r.stdout}"
        time.sleep(0.5)
    assert "Clearing topic-level throttles on topic throttled" in r.stdout, r.stdout
    assert replicas_of(bs, topic) == {0: [3, 4]}
    assert log_bytes(cluster, 3, topic) == log_bytes(cluster, 4, topic) == full

    # every message is on the new replicas: read it back with the old ones stopped
    cluster.terminate(1)
    cluster.terminate(2)
    new_only = ",".join(f"{cluster.host}:{cluster.broker_port(b)}" for b in (3, 4))
    got = consume(new_only, topic, MESSAGES)
    assert [o for o, _ in got] == list(range(MESSAGES))
    assert [v for _, v in got] == values


CHUNK_MESSAGES = 4_000


def kafka_chunks(bs: str, tmp_path: Path, action: str, doc: dict) -> None:
    f = tmp_path / f"{action}.json"
    f.write_text(json.dumps(doc))
    r = subprocess.run([CHUNKS, action, "--bootstrap-server", bs, f"--{action}-chunk-json-file", str(f)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, (r.stdout, r.stderr)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_throttle_bounds_an_inactive_chunks_copy(cluster_factory: ClusterFactory, tmp_path: Path) -> None:
    """An inactive chunk moved to a broker whose replica of the partition is throttled (the rate
    and the throttled replicas set with confluent-kafka's incremental_alter_configs, Kafka's
    keys) copies at the throttle's rate, measured as above."""
    cluster = cluster_factory(brokers=4)
    bs = cluster.bootstrap
    topic = "throttled-chunk"
    _, full = filled_topic(cluster, topic, CHUNK_MESSAGES)
    # the next chunk takes the writes on [4, 1]; the data stays in chunk 0 on [1, 2]
    kafka_chunks(bs, tmp_path, "create", {"partitions": [{"topic": topic, "partition": 0, "replicas": [4, 1]}]})
    eventually(lambda: replicas_of(bs, topic) == {0: [4, 1]})

    admin = AdminClient({"bootstrap.servers": bs})
    futures = admin.incremental_alter_configs([
        ConfigResource(ConfigResource.Type.BROKER, "3", incremental_configs=[ConfigEntry(
            "follower.replication.throttled.rate", str(THROTTLE), incremental_operation=AlterConfigOpType.SET)]),
        ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[ConfigEntry(
            "follower.replication.throttled.replicas", "0:3", incremental_operation=AlterConfigOpType.SET)]),
    ])
    for f in futures.values():
        f.result(30)
    time.sleep(1.5)  # every broker's image has the configs (and the bucket its 1 s of burst)

    t_alter = time.monotonic()
    kafka_chunks(bs, tmp_path, "alter", {"chunks": [{"topic": topic, "partition": 0, "startOffset": 0,
                                                     "replicas": [1, 3]}]})
    rate, start, end = steady_rate(sample_copies(cluster, [3], topic, full, t_alter)[3], full)
    print(f"throttle {THROTTLE:,} B/s, chunk of {full:,} bytes copied at {rate:,.0f} B/s in {end - t_alter:.1f}s")
    assert abs(rate - THROTTLE) <= TOLERANCE * THROTTLE, f"the chunk copied at {rate:,.0f} B/s"
    assert end - t_alter >= 0.8 * full / THROTTLE, f"copied {full:,} bytes in {end - t_alter:.1f}s"
    assert log_bytes(cluster, 3, topic) == full
