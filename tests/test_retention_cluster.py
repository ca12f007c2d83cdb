"""Retention on a real cluster, as Kafka applies it to idle logs: an idle topic's records expire
(the active segment too) on the leader and the follower; retention.ms=-1 keeps them; a compacted
topic's idle dirty active segment is rolled after max.compaction.lag.ms and cleaned, and its
tombstones go after delete.retention.ms; a partition-count shrink (KIP-253) completes by
retention alone, kafka-topics.sh --describe saying when; kafka-log-dirs.sh --kafka-json prints
Apache Kafka's JSON shape."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from tests.conftest import wait_for
from tests.test_broker_core import log_text, replica_dir
from tests.test_kafka_topics import ok, parse_describe
from tools.cluster import Cluster

CHECK_MS = 1000  # log.retention.check.interval.ms


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("retention"), brokers=2, verbose=False,
                broker_overrides={"log.retention.check.interval.ms": CHECK_MS, "file.delete.delay.ms": 0,
                                  "log.cleaner.backoff.ms": 200},
                controller_overrides={"partition.deletion.check.interval.ms": 300})
    try:
        c.start()
        yield c
    finally:
        c.stop()


def create(c: Cluster, topic: str, partitions: int = 1, **configs: str) -> None:
    args = ["--create", "--topic", topic, "--partitions", str(partitions), "--replication-factor", "2"]
    for k, v in configs.items():
        args += ["--config", f"{k.replace('_', '.')}={v}"]
    ok(c.bootstrap, *args)


def produce(c: Cluster, topic: str, records: list[tuple[bytes | None, bytes | None]], partition: int = 0) -> int:
    """acks=all; returns the CreateTime stamped on every record (now)."""
    now = int(time.time() * 1000)
    p = Producer({"bootstrap.servers": c.bootstrap, "acks": "all", "linger.ms": 5})
    for key, value in records:
        p.produce(topic, value=value, key=key, partition=partition, timestamp=now)
    assert p.flush(30) == 0
    return now


class Marks:
    """Log start and end offsets (ListOffsets earliest / latest) over one consumer."""

    def __init__(self, c: Cluster) -> None:
        self.consumer = Consumer({"bootstrap.servers": c.bootstrap, "group.id": "retention-marks"})

    def __call__(self, topic: str, partition: int = 0) -> tuple[int, int]:
        return self.consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)

    def close(self) -> None:
        self.consumer.close()


def read_all(c: Cluster, topic: str, partition: int = 0) -> list[tuple[bytes | None, bytes | None]]:
    end = Marks(c)
    try:
        lo, hi = end(topic, partition)
    finally:
        end.close()
    if lo >= hi:
        return []
    consumer = Consumer({"bootstrap.servers": c.bootstrap, "group.id": f"read-{topic}", "enable.auto.commit": False})
    out: list[tuple[bytes | None, bytes | None]] = []
    try:
        consumer.assign([TopicPartition(topic, partition, lo)])
        deadline = time.monotonic() + 5
        tp = TopicPartition(topic, partition)
        # by position, not the last record's offset: compaction leaves offsets without records
        while consumer.position([tp])[0].offset < hi and time.monotonic() < deadline:
            for m in consumer.consume(1000, 0.5):
                assert m.error() is None, m.error()
                out.append((m.key(), m.value()))
    finally:
        consumer.close()
    return out


def test_an_idle_topic_is_emptied_within_retention_plus_two_checks(cluster: Cluster) -> None:
    """retention.ms=5000, segment.ms=1000, 100 records written once: empty (log start == log end
    == 100) within 5 s + two check intervals of the records' time, on both replicas, each left
    with one empty segment; the log goes on at 100. retention.ms=-1 keeps everything."""
    c = cluster
    create(c, "idle", retention_ms="5000", segment_ms="1000")
    create(c, "forever", retention_ms="-1", segment_ms="1000")
    produce(c, "forever", [(None, b"kept-%d" % i) for i in range(10)])
    written = produce(c, "idle", [(b"k%d" % i, b"v%d" % i) for i in range(100)])
    marks = Marks(c)
    try:
        assert marks("idle") == (0, 100)
        emptied = wait_for(lambda: marks("idle") == (100, 100) and time.time() * 1000, 30, "the idle topic emptied")
        # the poll itself (every 0.2 s, a ListOffsets each) and a loaded machine: 1 s of slack
        assert emptied - written <= 5000 + 2 * CHECK_MS + 1000, f"emptied {emptied - written} ms after the write"
        assert marks("forever") == (0, 10)
    finally:
        marks.close()
    for broker in c.broker_ids:  # the follower's replica expires by the same rule
        d = replica_dir(c, broker, "idle", 0)
        wait_for(lambda d=d: [p.name for p in d.glob("*.log")] == [f"{100:020d}.log"], 10, f"broker {broker}'s one segment")
        assert (d / f"{100:020d}.log").stat().st_size == 0
    assert any("event='segment_deleted'" in line and "reason='retention.ms'" in line and "idle-0-0" in line
               for b in c.broker_ids for line in log_text(c, b).splitlines())
    produce(c, "idle", [(b"k", b"after")])
    assert read_all(c, "idle") == [(b"k", b"after")]
    assert len(read_all(c, "forever")) == 10


def test_compacted_idle_log_rolls_after_max_compaction_lag_and_drops_tombstones(cluster: Cluster) -> None:
    """cleanup.policy=compact, max.compaction.lag.ms=2000, delete.retention.ms=1000, a dirty ratio
    the data never reaches: the active segment (all the data) is rolled by the retention check
    once its first record is 2 s old, the cleaner keeps each key's latest value, and the
    tombstone goes once delete.retention.ms has passed, with no new write."""
    c = cluster
    create(c, "compacted", cleanup_policy="compact", max_compaction_lag_ms="2000", delete_retention_ms="1000",
           min_cleanable_dirty_ratio="0.99")
    produce(c, "compacted", [(b"a", b"a%d" % i) for i in range(5)] + [(b"b", b"b0"), (b"b", None)])
    assert len(read_all(c, "compacted")) == 7
    wait_for(lambda: read_all(c, "compacted") == [(b"a", b"a4")], 30, "a's latest value alone")
    leader_logs = "".join(log_text(c, b) for b in c.broker_ids)
    assert "event='segment_rolled_for_compaction'" in leader_logs


def test_a_shrink_completes_by_retention_alone(cluster: Cluster) -> None:
    """3 -> 2 with retention.ms=6000 and no DeleteRecords: partition 2 is marked, describe says
    when retention empties it, it is deleted once empty, and the count can change again (-> 4)."""
    c = cluster
    create(c, "shrink", partitions=3, retention_ms="6000")
    written = produce(c, "shrink", [(b"x", b"last")], partition=2)
    ok(c.bootstrap, "--alter", "--topic", "shrink", "--partitions", "2")

    def marked() -> dict | None:
        parts = parse_describe(ok(c.bootstrap, "--describe", "--topic", "shrink"))["shrink"]["partitions"]
        p2 = next((p for p in parts if p["Partition"] == "2"), None)
        return p2 if p2 is not None and "EmptiedByRetentionIn" in p2 else None

    p2 = wait_for(marked, 15, "partition 2 shown marked, with its expiry")
    assert p2["MarkedForDeletion"] == "true"
    seconds, at = p2["EmptiedByRetentionIn"].split(" ", 1)
    assert 0 <= float(seconds.rstrip("s")) <= 6.0
    expected = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime((written + 6000) / 1000))
    assert at == f"({expected})"

    def gone() -> bool:
        d = parse_describe(ok(c.bootstrap, "--describe", "--topic", "shrink"))["shrink"]
        return d["PartitionCount"] == "2" and len(d["partitions"]) == 2

    wait_for(gone, 6 + 2 * CHECK_MS / 1000 + 15, "partition 2 deleted by retention alone")
    ok(c.bootstrap, "--alter", "--topic", "shrink", "--partitions", "4")


def test_log_dirs_describe_in_kafkas_json_shape(cluster: Cluster) -> None:
    c = cluster
    create(c, "dirs", partitions=2)
    produce(c, "dirs", [(None, b"x" * 100)])

    def describe(*extra: str) -> dict:
        r = subprocess.run([sys.executable, "-m", "tools.kafka_log_dirs", "--describe", "--bootstrap-server",
                            c.bootstrap, "--topic-list", "dirs", *extra], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout.splitlines()[-1])

    kip = describe()
    assert set(kip) == {"version", "log_dirs"}  # KIP-113's shape stays the default

    def sized() -> dict | bool:
        doc = describe("--kafka-json")
        entries = [p for b in doc["brokers"] for d in b["logDirs"] for p in d["partitions"]]
        return doc if any(p["partition"] == "dirs-0" and p["size"] > 100 for p in entries) else False

    doc = wait_for(sized, 15, "dirs-0 with its bytes in Kafka's shape")
    assert doc["version"] == 1 and sorted(b["broker"] for b in doc["brokers"]) == c.broker_ids
    for b in doc["brokers"]:  # each replica in one of the broker's dirs (RF 2 on 2 brokers: all here)
        assert all(set(d) == {"logDir", "error", "partitions"} and d["error"] is None for d in b["logDirs"])
        entries = [p for d in b["logDirs"] for p in d["partitions"]]
        assert sorted(p["partition"] for p in entries) == ["dirs-0", "dirs-1"]
        for p in entries:
            assert set(p) == {"partition", "size", "offsetLag", "isFuture"} and p["isFuture"] is False
