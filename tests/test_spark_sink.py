"""The `strata` sink (connector/spark_sink.py) against a real 3-broker cluster and a real local
Spark: a batch write read back exactly, bad rows and options refused with one message naming the
column, and exactly-once streaming writes through restarts, a driver killed with SIGKILL in the
sink's crash windows, and a leader broker killed during a batch, checked with read_committed
confluent-kafka consumers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from connector.sink_options import SinkError, SinkOptions
from tests.conftest import FAST_FENCING, wait_for
from tests.test_spark_source import read, spark  # noqa: F401  (the module's SparkSession fixture)
from tools.cluster import Cluster

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("spark-sink"), broker_overrides=FAST_FENCING,
                controller_overrides=FAST_FENCING)
    try:
        c.start()
        yield c
    finally:
        c.stop()


def create_topic(c: Cluster, name: str, partitions: int = 3, **config: str) -> None:
    admin = AdminClient({"bootstrap.servers": c.bootstrap})
    admin.create_topics([NewTopic(name, partitions, 3, config=config)])[name].result(30)


def consume_committed(c: Cluster, topic: str, expect: int, timeout: float = 60.0) -> list:
    """Every record of the topic a read_committed consumer sees, waiting until `expect` of them
    (or more: a duplicate must show) have arrived and nothing more comes for a moment."""
    cons = Consumer({"bootstrap.servers": c.bootstrap, "group.id": f"check-{topic}-{os.getpid()}",
                     "isolation.level": "read_committed", "enable.auto.commit": False,
                     "auto.offset.reset": "earliest"})
    parts = cons.list_topics(topic, timeout=30).topics[topic].partitions
    cons.assign([TopicPartition(topic, p, 0) for p in parts])
    out: list = []
    quiet = 0
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and (len(out) < expect or quiet < 3):
        batch = cons.consume(10_000, 1.0)
        quiet = 0 if batch else quiet + 1
        for m in batch:
            assert m.error() is None, m.error()
            out.append(m)
    cons.close()
    return out


# ---------------------------------------------------------------- in-process: options
@pytest.mark.parametrize(("options", "message"), [
    ({}, "kafka.bootstrap.servers is required"),
    ({"kafka.bootstrap.servers": "x:1", "kafka.key.serializer": "a"}, "kafka.key.serializer is not supported"),
    ({"kafka.bootstrap.servers": "x:1", "exactlyOnce": "maybe"}, "exactlyOnce: expected true or false"),
    ({"kafka.bootstrap.servers": "x:1", "exactlyOnce": "true", "kafka.acks": "1"}, "need acks=all"),
    ({"kafka.bootstrap.servers": "x:1", "kafka.ssl.truststore.type": "JKS"}, "the truststore must be a PEM file"),
])
def test_sink_options_refused(options: dict, message: str) -> None:
    with pytest.raises(SinkError, match=message):
        SinkOptions.parse(options, streaming=False)


def test_sink_options_translate_java_names() -> None:
    o = SinkOptions.parse({"kafka.bootstrap.servers": "h:1", "kafka.linger.ms": "7", "kafka.max.request.size": "5",
                           "kafka.sasl.jaas.config": 'org.apache.kafka.common.security.plain.PlainLoginModule '
                                                     'required username="u" password="p";',
                           "kafka.ssl.truststore.location": "/ca.pem", "kafka.ssl.truststore.type": "PEM",
                           "kafka.ssl.endpoint.identification.algorithm": ""}, streaming=True)
    assert o.producer["linger.ms"] == "7" and o.producer["message.max.bytes"] == "5"
    assert o.producer["ssl.ca.location"] == "/ca.pem" and "ssl.truststore.type" not in o.producer
    assert o.producer["ssl.endpoint.identification.algorithm"] == "none"
    assert (o.producer["sasl.username"], o.producer["sasl.password"]) == ("u", "p")
    assert o.exactly_once and o.producer["acks"] == "all"


# ---------------------------------------------------------------- batch
@pytest.mark.slow
def test_batch_write_100k_reads_back_exactly(cluster: Cluster, spark) -> None:  # noqa: F811
    create_topic(cluster, "sink-batch")
    n = 100_000
    df = spark.range(n).selectExpr(
        "CAST(id AS STRING) AS key", "CONCAT('v', CAST(id AS STRING)) AS value", "CAST(id % 3 AS INT) AS partition",
        "array(named_struct('key', 'h', 'value', CAST(CAST(id * 2 AS STRING) AS BINARY))) AS headers")
    (df.write.format("strata").option("kafka.bootstrap.servers", cluster.bootstrap).option("topic", "sink-batch")
     .mode("append").save())
    rows = read(spark, cluster, subscribe="sink-batch", includeHeaders="true").selectExpr(
        "CAST(key AS STRING) AS key", "CAST(value AS STRING) AS value", "partition",
        "CAST(headers[0].value AS STRING) AS h", "size(headers) AS nh").collect()
    assert len(rows) == n
    ids = sorted(int(r.key) for r in rows)
    assert ids == list(range(n))
    for r in rows:
        i = int(r.key)
        assert (r.value, r.partition, r.h, r.nh) == (f"v{i}", i % 3, str(i * 2), 1), r


@pytest.mark.slow
@pytest.mark.parametrize(("select", "options", "message"), [
    (["CAST(id AS STRING) AS value"], {}, "topic: no topic column and no topic option"),
    (["CAST(id AS STRING) AS value", "CAST(NULL AS STRING) AS topic"], {}, "topic: row 0 of the batch has a null topic"),
    (["CAST(id AS STRING) AS key"], {"topic": "sink-bad"}, "value: the required column value"),
    (["id AS value"], {"topic": "sink-bad"}, "value: must be string or binary"),
    (["CAST(id AS STRING) AS value", "CAST(id + 5 AS INT) AS partition"], {"topic": "sink-bad"},
     "out of range: topic 'sink-bad' has partitions 0..1"),
    (["repeat('x', 5000) AS value"], {"topic": "sink-bad"}, "value: row 0 of the batch is a record of"),
    (["CAST(id AS STRING) AS value"], {"topic": "no-such-topic"}, "topic: topic 'no-such-topic' does not exist"),
])
def test_bad_rows_fail_with_one_message(cluster: Cluster, spark, select: list, options: dict,  # noqa: F811
                                        message: str) -> None:
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    if "sink-bad" not in AdminClient({"bootstrap.servers": cluster.bootstrap}).list_topics(timeout=30).topics:
        create_topic(cluster, "sink-bad", partitions=2, **{"max.message.bytes": "2000"})
    w = spark.range(3).selectExpr(*select).write.format("strata").option("kafka.bootstrap.servers", cluster.bootstrap)
    for k, v in options.items():
        w = w.option(k, v)
    with pytest.raises((PySparkException, Py4JJavaError)) as e:
        w.mode("append").save()
    assert message in str(e.value)


@pytest.mark.slow
def test_overwrite_is_refused(cluster: Cluster, spark) -> None:  # noqa: F811
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    with pytest.raises((PySparkException, Py4JJavaError)) as e:
        (spark.range(1).selectExpr("'x' AS value").write.format("strata")
         .option("kafka.bootstrap.servers", cluster.bootstrap).option("topic", "t").mode("overwrite").save())
    assert "Overwrite is not supported" in str(e.value)


@pytest.mark.slow
def test_batch_exactly_once_write(cluster: Cluster, spark) -> None:  # noqa: F811
    create_topic(cluster, "sink-batch-eo")
    (spark.range(3000).repartition(4).selectExpr("CAST(id AS STRING) AS key", "CAST(id AS STRING) AS value")
     .write.format("strata").option("kafka.bootstrap.servers", cluster.bootstrap).option("topic", "sink-batch-eo")
     .option("exactlyOnce", "true").mode("append").save())
    got = Counter(int(m.value()) for m in consume_committed(cluster, "sink-batch-eo", 3000))
    assert sorted(got) == list(range(3000)) and set(got.values()) == {1}


# ---------------------------------------------------------------- streaming, exactly once
def write_inputs(d: Path, first_file: int, files: int, per_file: int) -> None:
    d.mkdir(parents=True, exist_ok=True)
    for f in range(first_file, first_file + files):
        lines = "\n".join(json.dumps({"id": f * per_file + i}) for i in range(per_file))
        tmp = d / f".part-{f:04d}.json.tmp"
        tmp.write_text(lines + "\n")
        tmp.rename(d / f"part-{f:04d}.json")  # a file source must never see a half-written file


def exactly_once(cluster: Cluster, topic: str, n: int) -> None:
    got = Counter(int(m.key()) for m in consume_committed(cluster, topic, n))
    dup = [k for k, v in got.items() if v > 1]
    assert not dup, f"{len(dup)} ids written more than once, e.g. {dup[:5]}"
    missing = sorted(set(range(n)) - set(got))
    assert not missing, f"{len(missing)} ids missing, e.g. {missing[:5]}"


def stream_query(spark, cluster: Cluster, src: Path, checkpoint: Path, topic: str):  # noqa: F811
    return (spark.readStream.format("json").schema("id long").option("maxFilesPerTrigger", "1").load(str(src))
            .selectExpr("CAST(id AS STRING) AS key", "CONCAT('v', CAST(id AS STRING)) AS value")
            .writeStream.format("strata").option("kafka.bootstrap.servers", cluster.bootstrap).option("topic", topic)
            .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())


@pytest.mark.slow
def test_stream_exactly_once_across_a_restart(cluster: Cluster, spark, tmp_path: Path) -> None:  # noqa: F811
    create_topic(cluster, "sink-stream")
    src, ck = tmp_path / "in", tmp_path / "ck"
    write_inputs(src, 0, 3, 200)
    q = stream_query(spark, cluster, src, ck, "sink-stream")
    q.awaitTermination(300)
    assert q.exception() is None
    write_inputs(src, 3, 2, 200)
    q = stream_query(spark, cluster, src, ck, "sink-stream")  # restarted from its checkpoint
    q.awaitTermination(300)
    assert q.exception() is None
    exactly_once(cluster, "sink-stream", 1000)


@pytest.mark.slow
def test_stream_driver_killed_in_each_crash_window(cluster: Cluster, tmp_path: Path) -> None:
    """SIGKILL to the driver's whole process group with task transactions open (rows written,
    nothing decided), then again just after the commit log names the batch (decided, no
    transaction ended); a third run finishes from the checkpoint."""
    topic = "sink-killed"
    create_topic(cluster, topic)
    src, ck = tmp_path / "in", tmp_path / "ck"
    write_inputs(src, 0, 4, 300)
    env = {k: v for k, v in os.environ.items() if k != "STRATA_SINK_TEST_CRASH"}

    def run(crash: str | None) -> subprocess.CompletedProcess:
        e = dict(env, **({"STRATA_SINK_TEST_CRASH": crash} if crash else {}))
        return subprocess.run([sys.executable, "-m", "tests.spark_sink_app", cluster.bootstrap, str(src), str(ck),
                               topic], cwd=ROOT, env=e, capture_output=True, text=True, timeout=300,
                              start_new_session=True)

    first = run("task:1")
    assert first.returncode == -9, first.stderr[-2000:]
    second = run("decided:2")
    assert second.returncode == -9, second.stderr[-2000:]
    last = run(None)
    assert last.returncode == 0, last.stderr[-3000:]
    exactly_once(cluster, topic, 1200)


@pytest.mark.slow
def test_replay_with_fewer_tasks_aborts_the_first_attempts_extra_transactions(cluster: Cluster, tmp_path: Path) -> None:
    """A micro-batch's first attempt runs 4 tasks and the driver is killed once its last task has
    written (transactions open under task ids 0..3, nothing decided); the restarted query replays
    it with 1 task, which takes id 0 only. The transactions under ids 1..3 must not wait for
    transaction.timeout.ms (15 minutes here) holding read_committed readers back: the driver
    aborts them at the replay's commit, and the rows show at once, exactly once."""
    from connector.sink_txn import open_transactions

    topic = "sink-fewer-tasks"
    create_topic(cluster, topic)
    src, ck = tmp_path / "in", tmp_path / "ck"
    write_inputs(src, 0, 3, 400)
    env = {k: v for k, v in os.environ.items() if k != "STRATA_SINK_TEST_CRASH"}

    def run(tasks: int, crash: str | None) -> subprocess.CompletedProcess:
        e = dict(env, **({"STRATA_SINK_TEST_CRASH": crash} if crash else {}))
        return subprocess.run([sys.executable, "-m", "tests.spark_sink_app", cluster.bootstrap, str(src), str(ck),
                               topic, str(tasks)], cwd=ROOT, env=e, capture_output=True, text=True, timeout=300,
                              start_new_session=True)

    first = run(4, "task:1:3")
    assert first.returncode == -9, first.stderr[-2000:]
    query = json.loads((ck / "metadata").read_text())["id"]
    opts = SinkOptions.parse({"kafka.bootstrap.servers": cluster.bootstrap}, streaming=True)
    prefix = f"strata-spark-{query}-"
    left = open_transactions(opts, prefix)
    assert {prefix + "1", prefix + "3"} <= left, left  # the first attempt's, open
    last = run(1, None)
    assert last.returncode == 0, last.stderr[-3000:]
    assert open_transactions(opts, prefix) == set()
    got = Counter(int(m.key()) for m in consume_committed(cluster, topic, 1200, timeout=60))
    assert sorted(got) == list(range(1200)) and set(got.values()) == {1}, f"{len(got)} ids, {sum(got.values())} rows"


@pytest.mark.slow
def test_stream_leader_killed_during_a_batch(cluster: Cluster, spark, tmp_path: Path) -> None:  # noqa: F811
    topic = "sink-failover"
    create_topic(cluster, topic, partitions=2)
    src, ck = tmp_path / "in", tmp_path / "ck"
    write_inputs(src, 0, 6, 2000)
    md = AdminClient({"bootstrap.servers": cluster.bootstrap}).list_topics(topic, timeout=30)
    leader = md.topics[topic].partitions[0].leader
    q = stream_query(spark, cluster, src, ck, topic)
    killed = threading.Event()

    def kill_when_writing() -> None:
        wait_for(lambda: q.lastProgress is not None or not q.isActive, 120, "a first micro-batch", interval=0.05)
        cluster.kill(leader)
        killed.set()

    t = threading.Thread(target=kill_when_writing)
    t.start()
    try:
        q.awaitTermination(300)
        t.join(130)
        assert killed.is_set() and q.exception() is None
    finally:
        cluster.start_node(leader)
    exactly_once(cluster, topic, 12_000)


# ---------------------------------------------------------------- in-process: rows checked before they go out
class _FakeProducer:
    def __init__(self) -> None:
        self.sent: list[tuple] = []

    def produce(self, topic, value=None, key=None, partition=-1, headers=None) -> None:
        self.sent.append((topic, key, value, partition, headers))

    def poll(self, timeout: float = 0) -> int:
        return 0

    def flush(self, timeout: float = 0) -> int:
        return 0

    def __len__(self) -> int:
        return 0


def _sender(topic: str | None):
    from connector.spark_sink import _Sender

    opts = SinkOptions.parse({"kafka.bootstrap.servers": "h:1", **({"topic": topic} if topic else {})},
                             streaming=False)
    s = _Sender(opts, _FakeProducer())  # type: ignore[arg-type]
    s.topics.counts = {"a": 2, "b": 3}
    s.topics.limits = {"a": 1000, "b": 1000}
    return s


def test_rows_go_out_with_their_columns() -> None:
    import pyarrow as pa

    s = _sender(None)
    hdr = pa.array([[{"key": "h", "value": b"1"}], None], pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])))
    s.send(pa.RecordBatch.from_pydict({"key": ["k0", None], "value": [b"v0", None], "topic": ["a", "b"],
                                       "partition": pa.array([1, None], pa.int32()), "headers": hdr}))
    assert s.producer.sent == [("a", b"k0", b"v0", 1, [("h", b"1")]), ("b", None, None, -1, None)]
    assert s.rows == 2


@pytest.mark.parametrize(("columns", "message"), [
    ({"value": ["x", "y"], "topic": ["a", None]}, "topic: row 1 of the batch has a null topic"),
    ({"value": ["x", "y"], "topic": ["a", "c"]}, "topic 'c' does not exist"),
    ({"value": ["x", "y"], "topic": ["a", "b"], "partition": [2, 2]}, "partition: row 0 of the batch has partition 2"),
    ({"value": ["x", "y" * 1000], "topic": ["a", "a"]}, "value: row 1 of the batch is a record of 1082 bytes"),
])
def test_bad_rows_named_by_column(columns: dict, message: str) -> None:
    import pyarrow as pa

    s = _sender(None)
    s.topics.partitions = lambda t: s.topics.counts[t] if t in s.topics.counts else (_ for _ in ()).throw(  # type: ignore[method-assign]
        SinkError(f"topic: topic {t!r} does not exist"))
    if "partition" in columns:
        columns = dict(columns, partition=pa.array(columns["partition"], pa.int32()))
    with pytest.raises(SinkError, match=message):
        s.send(pa.RecordBatch.from_pydict(columns))
    assert s.producer.sent == []
