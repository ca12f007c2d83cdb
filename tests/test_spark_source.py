"""The `strata` PySpark source (connector/) against a real 3-broker cluster and a real local
Spark (pyspark 4.3, Java 17): batch reads with Spark's Kafka-source options, streaming with
Trigger.AvailableNow into parquet, stopped and restarted while producers write, exactly once."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.spark_local import local_session
from tools.cluster import Cluster

pytestmark = pytest.mark.slow

os.environ["PYSPARK_PYTHON"] = sys.executable  # executors run this interpreter (the project's venv)
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"  # Spark binds to loopback only


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("spark-cluster"))
    try:
        c.start()
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def spark(tmp_path_factory: pytest.TempPathFactory):
    s = local_session("strata-tests", tmp_path_factory.mktemp("spark-tmp"))
    s.sparkContext.setLogLevel("ERROR")
    yield s
    s.stop()


def create_topic(c: Cluster, name: str, partitions: int = 3) -> None:
    admin = AdminClient({"bootstrap.servers": c.bootstrap})  # kept referenced until the future is done
    admin.create_topics([NewTopic(name, partitions, 3)])[name].result(30)


def ensure_topic(c: Cluster, name: str) -> None:
    """create_topic unless an earlier test of the module made it (tests that share a topic, each
    runnable alone or in any order)."""
    if name not in AdminClient({"bootstrap.servers": c.bootstrap}).list_topics(timeout=10).topics:
        create_topic(c, name)


def produce(c: Cluster, topic: str, first: int, n: int, partitions: int = 3, headers: bool = False) -> None:
    p = Producer({"bootstrap.servers": c.bootstrap, "linger.ms": 5, "enable.idempotence": True})
    for i in range(first, first + n):
        kw = {"headers": [("h", b"%d" % i)]} if headers else {}
        p.produce(topic, key=b"k%d" % i, value=b"v%d" % i, partition=i % partitions, timestamp=1_000_000 + i, **kw)
    assert p.flush(30) == 0


def read(spark, c: Cluster, **options):
    r = spark.read.format("strata").option("kafka.bootstrap.servers", c.bootstrap)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def test_batch_read_every_message_once_in_order(cluster: Cluster, spark) -> None:
    create_topic(cluster, "batch")
    produce(cluster, "batch", 0, 3000, headers=True)
    df = read(spark, cluster, subscribe="batch", includeHeaders="true", minPartitions="7")
    assert df.rdd.getNumPartitions() >= 7  # ranges split beyond the 3 partitions
    rows = df.collect()
    assert sorted(r.value for r in rows) == sorted(b"v%d" % i for i in range(3000))
    by_part: dict[int, list[int]] = {}
    for r in rows:
        assert r.key == b"k" + r.value[1:] and r.topic == "batch" and r.timestampType == 0
        assert r.headers == [{"key": "h", "value": r.value[1:]}] or [tuple(h) for h in r.headers] == [("h", r.value[1:])]
        by_part.setdefault(r.partition, []).append(r.offset)
    assert sorted(by_part) == [0, 1, 2]
    for offsets in by_part.values():
        assert sorted(offsets) == list(range(1000))
    agg = read(spark, cluster, subscribe="batch").groupBy("partition").count().orderBy("partition").collect()
    assert [(r.partition, r["count"]) for r in agg] == [(0, 1000), (1, 1000), (2, 1000)]


def test_batch_offset_options(cluster: Cluster, spark) -> None:
    ensure_topic(cluster, "opts")
    produce(cluster, "opts", 0, 300)  # 100 per partition; timestamps 1_000_000 + i
    df = read(spark, cluster, assign='{"opts": [1]}', startingOffsets='{"opts": {"1": 10}}',
              endingOffsets='{"opts": {"1": 20}}')
    assert sorted(r.offset for r in df.collect()) == list(range(10, 20))
    df = read(spark, cluster, subscribePattern="op.*", startingOffsetsByTimestamp=(
        '{"opts": {"0": 1000150, "1": 1000150, "2": 9999999999}}'))
    got = sorted(int(r.value[1:]) for r in df.collect())
    # from the first record at or after the timestamp; partition 2 has none past it: nothing from there
    assert got == [i for i in range(150, 300) if i % 3 != 2]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "exactly one of subscribe"),
        ({"subscribe": "nope-no-topic"}, "unknown topic"),
        ({"subscribe": "opts", "assign": '{"opts": [0]}'}, "exactly one of subscribe"),
        ({"assign": "[1, 2]"}, "assign: expected JSON"),
        ({"subscribe": "opts", "startingOffsets": "{bad"}, "startingOffsets: expected"),
        ({"subscribe": "opts", "minPartitions": "0"}, "minPartitions: must be at least 1"),
        ({"subscribe": "opts", "isolation.level": "dirty"}, "isolation.level"),
    ],
)
def test_bad_options_fail_with_a_clear_message(cluster: Cluster, spark, options: dict, message: str) -> None:
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    ensure_topic(cluster, "opts")  # the options name a topic that exists
    with pytest.raises((PySparkException, Py4JJavaError)) as e:
        read(spark, cluster, **options).collect()
    assert message in str(e.value)


def test_stream_available_now_exactly_once_across_restarts(cluster: Cluster, spark, tmp_path: Path) -> None:
    create_topic(cluster, "stream")
    produce(cluster, "stream", 0, 2000)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def run_once() -> None:
        q = (
            spark.readStream.format("strata")
            .option("kafka.bootstrap.servers", cluster.bootstrap)
            .option("subscribe", "stream")
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", "700")
            .load()
            .selectExpr("partition", "offset", "CAST(value AS STRING) AS value")
            .writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination(300)
        assert q.exception() is None

    writer_done = threading.Event()

    def keep_producing() -> None:
        for k in range(5):
            produce(cluster, "stream", 2000 + k * 400, 400)
            time.sleep(0.5)
        writer_done.set()

    t = threading.Thread(target=keep_producing)
    t.start()
    run_once()  # reads what is there when it starts (at most 700 offsets per micro-batch)
    run_once()  # restarted from the checkpoint while the producer writes on
    t.join(120)
    assert writer_done.is_set()
    run_once()  # after the producer stopped: catches up with everything
    rows = spark.read.parquet(str(out)).collect()
    values = [r.value for r in rows]
    assert len(values) == len(set(values)), "a message was written twice"
    assert sorted(int(v[1:]) for v in values) == list(range(4000))


def test_read_committed_skips_aborted_transactions(cluster: Cluster, spark) -> None:
    create_topic(cluster, "txn", partitions=1)
    produce(cluster, "txn", 0, 10, partitions=1)
    p = Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": "spark-txn"})
    p.init_transactions(60)
    p.begin_transaction()
    for i in range(100, 110):
        p.produce("txn", value=b"v%d" % i, partition=0)
    assert p.flush(30) == 0  # on the broker before the abort (an abort purges what is still queued)
    p.abort_transaction(60)
    p.begin_transaction()
    for i in range(200, 205):
        p.produce("txn", value=b"v%d" % i, partition=0)
    p.commit_transaction(60)
    committed = sorted([b"v%d" % i for i in range(10)] + [b"v%d" % i for i in range(200, 205)])
    assert sorted(r.value for r in read(spark, cluster, subscribe="txn").collect()) == committed  # the default
    everything = sorted(r.value for r in read(spark, cluster, subscribe="txn", **{"isolation.level": "read_uncommitted"}).collect())
    assert everything == sorted(committed + [b"v%d" % i for i in range(100, 110)])


def test_fail_on_data_loss(cluster: Cluster, spark) -> None:
    from confluent_kafka import TopicPartition
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    create_topic(cluster, "lossy", partitions=1)
    produce(cluster, "lossy", 0, 100, partitions=1)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    for f in admin.delete_records([TopicPartition("lossy", 0, 40)]).values():
        f.result(30)
    from_zero = {"subscribe": "lossy", "startingOffsets": '{"lossy": {"0": 0}}'}
    with pytest.raises((PySparkException, Py4JJavaError)) as e:
        read(spark, cluster, **from_zero).collect()
    assert "data lost" in str(e.value) and "failOnDataLoss" in str(e.value)
    rows = read(spark, cluster, failOnDataLoss="false", **from_zero).collect()
    assert sorted(r.offset for r in rows) == list(range(40, 100))
