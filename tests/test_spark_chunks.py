"""The `strata` Spark source over a partition in 3 chunks whose replicas sit on different brokers:
every message once, in offset order, the inactive chunks' reads spread over more than one replica
each (the brokers' `chunk_read` log events say who served what), and a replica killed mid-read
costs a retry, not a message."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer

from tests.test_spark_source import read, spark  # noqa: F401  (the module's SparkSession fixture)
from tools.cluster import Cluster

pytestmark = pytest.mark.slow

TOPIC = "chunky"
PER_CHUNK = 3000
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("spark-chunks"))
    try:
        c.start()
        yield c
    finally:
        c.stop()


def tool(*args: str) -> str:
    out = subprocess.run([str(BIN / args[0]), *args[1:]], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def produce(c: Cluster, first: int, n: int) -> None:
    p = Producer({"bootstrap.servers": c.bootstrap, "enable.idempotence": True, "linger.ms": 5})
    for i in range(first, first + n):
        p.produce(TOPIC, key=b"k%d" % i, value=b"v%d-" % i + b"x" * 500, partition=0)
    assert p.flush(60) == 0


def chunk_reads(c: Cluster) -> Counter:
    """(broker, chunk start) -> consumer reads it served, from the brokers' logs."""
    seen: Counter = Counter()
    for b in c.broker_ids:
        for line in c.log_path(b).read_text(errors="replace").splitlines():
            if "chunk_read" in line and re.search(rf"topic='?{TOPIC}'?\s", line):
                m = re.search(r"chunk_start=(\d+)", line)
                if m:
                    seen[(b, int(m.group(1)))] += 1
    return seen


@pytest.fixture(scope="module")
def chunked(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Cluster:
    tool("kafka-topics.sh", "--bootstrap-server", cluster.bootstrap, "--create", "--topic", TOPIC,
         "--replica-assignment", "1:2")
    spec = tmp_path_factory.mktemp("chunk-specs")
    produce(cluster, 0, PER_CHUNK)
    for k, replicas in enumerate(([2, 3], [3, 1]), start=1):
        f = spec / f"chunk{k}.json"
        f.write_text(json.dumps({"partitions": [{"topic": TOPIC, "partition": 0, "replicas": replicas}]}))
        tool("kafka-chunks.sh", "create", "--bootstrap-server", cluster.bootstrap, "--create-chunk-json-file", str(f))
        produce(cluster, k * PER_CHUNK, PER_CHUNK)
    described = tool("kafka-topics.sh", "--bootstrap-server", cluster.bootstrap, "--describe", "--topic", TOPIC)
    assert described.count("Chunk") >= 2, described
    return cluster


def check_all(df) -> None:
    per_piece = df.rdd.mapPartitions(lambda rows: [[(r.offset, r.value) for r in rows]]).collect()
    for piece in per_piece:
        assert [o for o, _ in piece] == sorted(o for o, _ in piece), "a piece is out of offset order"
    rows = [r for piece in per_piece for r in piece]
    assert sorted(o for o, _ in rows) == list(range(3 * PER_CHUNK))
    assert all(v.startswith(b"v%d-" % o) for o, v in rows)


def test_batch_read_spreads_inactive_chunks_over_their_replicas(chunked: Cluster, spark) -> None:  # noqa: F811
    before = chunk_reads(chunked)
    check_all(read(spark, chunked, subscribe=TOPIC, minPartitions="16"))
    served = chunk_reads(chunked) - before
    for start, replicas in ((0, (1, 2)), (PER_CHUNK, (2, 3))):
        by = {b: served[(b, start)] for b in replicas}
        assert all(n > 0 for n in by.values()), f"chunk {start}: reads per replica {by} (all: {dict(served)})"


def test_replica_killed_mid_read_loses_nothing(chunked: Cluster, spark) -> None:  # noqa: F811
    df = read(spark, chunked, subscribe=TOPIC, minPartitions="16")
    killer = threading.Timer(0.3, chunked.kill, args=(2,))  # a replica of both inactive chunks
    killer.start()
    try:
        check_all(df)
    finally:
        killer.join()
        chunked.start_node(2)


def test_stream_across_a_chunk_created_between_runs(cluster: Cluster, spark, tmp_path: Path) -> None:  # noqa: F811
    topic = "chunky-stream"
    tool("kafka-topics.sh", "--bootstrap-server", cluster.bootstrap, "--create", "--topic", topic,
         "--replica-assignment", "1:2")
    p = Producer({"bootstrap.servers": cluster.bootstrap, "enable.idempotence": True, "linger.ms": 5})

    def write(first: int, n: int) -> None:
        for i in range(first, first + n):
            p.produce(topic, value=b"%d" % i, partition=0)
        assert p.flush(60) == 0

    def run_once() -> None:
        q = (spark.readStream.format("strata").option("kafka.bootstrap.servers", cluster.bootstrap)
             .option("subscribe", topic).option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "400")
             .load().selectExpr("offset", "CAST(value AS STRING) AS value")
             .writeStream.format("parquet").option("path", str(tmp_path / "out"))
             .option("checkpointLocation", str(tmp_path / "checkpoint")).trigger(availableNow=True).start())
        q.awaitTermination(300)
        assert q.exception() is None

    write(0, 1000)
    run_once()
    spec = tmp_path / "chunk.json"
    spec.write_text(json.dumps({"partitions": [{"topic": topic, "partition": 0, "replicas": [2, 3]}]}))
    tool("kafka-chunks.sh", "create", "--bootstrap-server", cluster.bootstrap, "--create-chunk-json-file", str(spec))
    writer = threading.Thread(target=write, args=(1000, 1500))
    writer.start()
    run_once()  # restarted from its checkpoint across the new chunk, while the producer writes
    writer.join(120)
    run_once()
    values = [int(r.value) for r in spark.read.parquet(str(tmp_path / "out")).collect()]
    assert len(values) == len(set(values)), "a message was written twice"
    assert sorted(values) == list(range(2500))
