"""The `strata` source over a diskless topic (KIP-1164) on SeaweedFS: the driver plans from the
diskless coordinator's batch index, executors read the WAL byte ranges from S3 themselves; every
record comes back once and the brokers' Fetch byte counters do not move. With
disklessDirectRead=false the same read goes through the brokers (and the counters move)."""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Iterator

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.conftest import FAST_FENCING
from tests.s3_server import ACCESS_KEY, SECRET_KEY, SeaweedS3
from tests.test_spark_source import read, spark  # noqa: F401  (the module's SparkSession fixture)
from tools.cluster import Cluster

pytestmark = pytest.mark.slow
TOPIC = "dl"
N = 4000
COORDINATORS = {"diskless.metadata.topic.num.partitions": "2"}


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    server = SeaweedS3(tmp_path_factory.mktemp("s3") / "seaweedfs")
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, s3: SeaweedS3) -> Iterator[Cluster]:
    import os

    saved = {k: os.environ.get(k) for k in s3.env()}
    os.environ.update(s3.env())  # the brokers' S3 credentials (obstore reads AWS_*)
    overrides = {**COORDINATORS, "metrics.listener": "http://127.0.0.1:0", "diskless.wal.max.ms": "100",
                 "diskless.storage.url": f"s3://{s3.bucket}/wal",
                 "diskless.storage.s3.endpoint": s3.endpoint, "diskless.storage.s3.region": "us-east-1"}
    c = Cluster(tmp_path_factory.mktemp("spark-diskless"), broker_overrides=overrides,
                controller_overrides={**COORDINATORS, **FAST_FENCING})
    try:
        c.start()
        yield c
    finally:
        c.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def bytes_out(c: Cluster, topic: str) -> float:
    total = 0.0
    for b in c.broker_ids:
        with urllib.request.urlopen(c.metrics_url(b), timeout=5) as r:
            for line in r.read().decode().splitlines():
                m = re.match(rf'kafka_server_brokertopicmetrics_bytesout_total\{{.*topic="{topic}".*\}} (\S+)', line)
                if m:
                    total += float(m.group(1))
    return total


def test_diskless_topic_read_straight_from_s3(cluster: Cluster, s3: SeaweedS3, spark) -> None:  # noqa: F811
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(TOPIC, 4, 1, config={"diskless.enable": "true"})])[TOPIC].result(60)
    p = Producer({"bootstrap.servers": cluster.bootstrap, "linger.ms": 20})
    for i in range(N):
        p.produce(TOPIC, key=b"k%d" % i, value=b"v%d" % i, partition=i % 4, headers=[("h", b"%d" % i)])
    assert p.flush(60) == 0
    direct = {"diskless.storage.url": f"s3://{s3.bucket}/wal", "diskless.storage.s3.endpoint": s3.endpoint,
              "diskless.storage.s3.region": "us-east-1", "diskless.storage.s3.access.key.id": ACCESS_KEY,
              "diskless.storage.s3.secret.access.key": SECRET_KEY}
    before = bytes_out(cluster, TOPIC)
    rows = read(spark, cluster, subscribe=TOPIC, includeHeaders="true", minPartitions="6", **direct).collect()
    assert bytes_out(cluster, TOPIC) == before, "a broker served data of the direct read"
    assert sorted(int(r.value[1:]) for r in rows) == list(range(N))
    for r in rows:
        i = int(r.value[1:])
        assert (r.key, r.partition, [tuple(h) for h in r.headers]) == (b"k%d" % i, i % 4, [("h", b"%d" % i)])
    per_part: dict[int, list[int]] = {}
    for r in rows:
        per_part.setdefault(r.partition, []).append(r.offset)
    assert all(sorted(o) == list(range(N // 4)) for o in per_part.values())
    # the fallback: through the brokers' Fetch, same records
    fetched = read(spark, cluster, subscribe=TOPIC, disklessDirectRead="false", **direct).collect()
    assert sorted(int(r.value[1:]) for r in fetched) == list(range(N))
    assert bytes_out(cluster, TOPIC) > before


def test_store_options_refused(cluster: Cluster, spark) -> None:  # noqa: F811
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    with pytest.raises((PySparkException, Py4JJavaError)) as e:
        read(spark, cluster, subscribe=TOPIC, disklessDirectRead="maybe").collect()
    assert "disklessDirectRead: expected true or false" in str(e.value)



def test_spans_read_through_small_gaps() -> None:
    """The batches of one WAL file are read as one span over gaps of up to 1 MiB (other
    partitions' batches), split at larger gaps and never across files; positions are relative to
    the span and carry the assigned base offsets."""
    from broker.diskless.batches import BatchRow
    from connector.diskless_read import _GAP, spans_of

    def row(key: str, at: int, size: int, base: int) -> BatchRow:
        return BatchRow(1, key, 2, at, size, base, base + 9, -1, 0, 0)

    rows = [(0, row("f1", 0, 100, 0)), (1, row("f1", 100 + _GAP, 50, 7)), (0, row("f1", 200 + 2 * _GAP + 1, 10, 10)),
            (1, row("f2", 5, 20, 17))]
    spans = spans_of(list(reversed(rows)))
    assert [(s.key, s.lo, s.hi) for s in spans] == [("f1", 0, 150 + _GAP), ("f1", 200 + 2 * _GAP + 1, 211 + 2 * _GAP),
                                                   ("f2", 5, 25)]
    assert spans[0].batches == ((0, 100, 0, 0), (100 + _GAP, 50, 1, 7)) and spans[2].batches == ((0, 20, 1, 17),)


def test_transactional_diskless_topic_read_committed(cluster: Cluster, s3: SeaweedS3, spark) -> None:  # noqa: F811
    """A diskless topic with transactions: read_committed leaves out the aborted data and the
    markers; a partition with no aborted data in its range is still read straight from S3, one with
    some goes through the brokers' Fetch (which drops it as Kafka's consumer does)."""
    topic = "dl-txn"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(topic, 2, 1, config={"diskless.enable": "true"})])[topic].result(60)
    p = Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": "spark-dl-txn"})
    p.init_transactions(60)
    p.begin_transaction()
    for i in range(20):
        p.produce(topic, value=b"c%d" % i, partition=i % 2)
    p.commit_transaction(60)
    p.begin_transaction()
    for i in range(10):
        p.produce(topic, value=b"a%d" % i, partition=1)  # aborted, in partition 1 only
    assert p.flush(30) == 0
    p.abort_transaction(60)
    p.begin_transaction()
    for i in range(20, 30):
        p.produce(topic, value=b"c%d" % i, partition=i % 2)
    p.commit_transaction(60)
    direct = {"diskless.storage.url": f"s3://{s3.bucket}/wal", "diskless.storage.s3.endpoint": s3.endpoint,
              "diskless.storage.s3.region": "us-east-1", "diskless.storage.s3.access.key.id": ACCESS_KEY,
              "diskless.storage.s3.secret.access.key": SECRET_KEY}
    committed = sorted(b"c%d" % i for i in range(30))
    before = bytes_out(cluster, topic)
    rows = read(spark, cluster, subscribe=topic, **direct).collect()
    assert sorted(r.value for r in rows) == committed
    assert bytes_out(cluster, topic) > before  # partition 1 went through the brokers
    everything = read(spark, cluster, subscribe=topic, **{"isolation.level": "read_uncommitted"}, **direct).collect()
    assert sorted(r.value for r in everything) == sorted(committed + [b"a%d" % i for i in range(10)])
