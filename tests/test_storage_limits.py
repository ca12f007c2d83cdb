"""Storage limits with a real broker and real clients: segments roll by record time
(a backfill of month-old records makes one segment), KIP-937 timestamp bounds, and running out of
descriptors (a tiny `ulimit -n` on the broker) fails requests with a retriable error while the log
dir stays online. The 20,000-partition run under `ulimit -n 4096` is in test_many_partitions.py."""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path

import kafka.errors
import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic

DAY_MS = 86_400_000


def create_topic(bootstrap: str, name: str, partitions: int = 1, config: dict | None = None) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(name, partitions, 1, config=config or {})]).values():
        f.result(30)


def segment_files(cluster, topic: str, partition: int = 0) -> list[Path]:
    dirs = list(cluster.node_dir(1).glob(f"logs-*/{topic}-{partition}-0"))
    assert len(dirs) == 1, dirs
    return sorted(dirs[0].glob("*.log"))


def produce_all(bootstrap: str, sends, **config) -> list:
    """Produce (topic, partition, value, timestamp) tuples; the delivery errors in order (None: ok)."""
    errors = []
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, **config})
    for topic, partition, value, ts in sends:
        while True:
            try:
                p.produce(topic, value, partition=partition, timestamp=ts, on_delivery=lambda e, m: errors.append(e))
                break
            except BufferError:
                p.poll(0.05)
        p.poll(0)
    assert p.flush(60) == 0
    return errors


def test_backfill_of_old_records_makes_one_segment_and_record_time_still_rolls(cluster_factory):
    c = cluster_factory(brokers=1)
    create_topic(c.bootstrap, "backfill", config={"segment.ms": "3600000"})
    month_ago = int(time.time() * 1000) - 30 * DAY_MS
    # batch.num.messages=1: every record its own batch (10,000 produce requests, 5 in flight)
    sends = [("backfill", 0, b"r%d" % i, month_ago + i) for i in range(10_000)]
    errors = produce_all(c.bootstrap, sends, **{"batch.num.messages": 1, "max.in.flight": 5})
    assert errors == [None] * 10_000
    assert len(segment_files(c, "backfill")) == 1  # was: one segment per request
    # record time passing segment.ms (an hour after the first batch's timestamp) rolls
    assert produce_all(c.bootstrap, [("backfill", 0, b"later", month_ago + 3_600_000 + 10_001)]) == [None]
    assert len(segment_files(c, "backfill")) == 2
    assert produce_all(c.bootstrap, [("backfill", 0, b"same hour", month_ago + 3_600_000 + 20_000)]) == [None]
    assert len(segment_files(c, "backfill")) == 2


def test_timestamp_bounds_are_enforced_at_produce(cluster_factory):
    c = cluster_factory(brokers=1)
    create_topic(c.bootstrap, "bounded", config={"message.timestamp.before.max.ms": str(DAY_MS)})
    now = int(time.time() * 1000)
    sends = [
        ("bounded", 0, b"recent", now - 1000),
        ("bounded", 0, b"month old", now - 30 * DAY_MS),  # before.max.ms is a day
        ("bounded", 0, b"two hours ahead", now + 2 * 3_600_000),  # after.max.ms defaults to an hour
    ]
    errors = produce_all(c.bootstrap, sends, **{"batch.num.messages": 1, "max.in.flight": 1})
    assert errors[0] is None
    for err in errors[1:]:
        assert err is not None and err.code() == KafkaError.INVALID_TIMESTAMP, err
        assert not err.retriable()
    # the broker's own default applies to topics without the setting
    create_topic(c.bootstrap, "unbounded")
    assert produce_all(c.bootstrap, [("unbounded", 0, b"old", now - 300 * DAY_MS)]) == [None]


def _storage_fd_numbers(pid: int, marker: str) -> list[int]:
    out = []
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            if marker in os.readlink(f"/proc/{pid}/fd/{name}"):
                out.append(int(name))
        except OSError:
            pass  # closed meanwhile
    return out


@pytest.mark.skipif(not Path("/proc/self/fd").exists(), reason="needs /proc to read the broker's descriptors")
def test_out_of_descriptors_gives_retriable_errors_and_the_dir_stays_online(cluster_factory):
    nofile = 128  # a tiny `ulimit -n` for the broker
    c = cluster_factory(brokers=1, nofile={1: nofile})
    pid = c.pid(1)
    partitions = 40
    create_topic(c.bootstrap, "scarce", partitions)
    producer = Producer({"bootstrap.servers": c.bootstrap, "linger.ms": 0, "retries": 0})

    def produce_round(value: bytes) -> list:
        errors = []
        for p in range(partitions):
            producer.produce("scarce", value, partition=p, on_delivery=lambda e, m: errors.append(e))
        producer.flush(30)
        return errors

    assert produce_round(b"before") == [None] * partitions
    # Now squeeze it for real: RLIMIT_NOFILE (what `ulimit -n` sets) lowered on the live broker to
    # just below its first segment or index descriptor. Every slot under the limit holds a socket,
    # the event loop or the like, so the storage cannot get a descriptor, however much it evicts.
    storage_fds = _storage_fd_numbers(pid, "/scarce-")
    assert storage_fds, "the broker holds no storage descriptor to squeeze below"
    limit = min(storage_fds)
    os_limit = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (limit, os_limit[1]))
    try:
        errors = produce_round(b"starved")
    finally:
        resource.prlimit(pid, resource.RLIMIT_NOFILE, os_limit)  # descriptors free up
    failures = [e for e in errors if e is not None]
    assert failures, "no produce needed a new descriptor"
    for err in failures:
        # REQUEST_TIMED_OUT, never KAFKA_STORAGE_ERROR; Kafka's clients class it retriable
        assert err.code() == KafkaError.REQUEST_TIMED_OUT, err
        assert kafka.errors.for_code(err.code()).retriable
    # service resumes on the same partitions; nothing went offline
    assert produce_round(b"after") == [None] * partitions
    log = c.log_path(1).read_text()
    assert "storage_resources_exhausted" in log
    assert "log_dir_offline" not in log
    assert len(_storage_fd_numbers(pid, "/scarce-")) <= nofile // 2  # the default budget: half the limit
