"""20,000 partitions on one broker started with `ulimit -n 4096`.

Every partition is written and read, 2,000 of them also roll and lose their first segment to
retention, the broker is killed with SIGKILL and restarted (recovery), and its descriptors stay
under the budget throughout (/proc/<pid>/fd). The controller keeps its default 9 s broker session:
the broker opens its replicas in threads and applies deltas in slices, so it keeps heartbeating
while it opens 2,000 (each CreateTopics) or 20,000 (the restart) logs. Heavy by nature (opening
20,000 logs at creation and again at restart, two rounds of produce to 20,000 partitions): marked
slow. The reads name their start offsets (0, or the log start a ListOffsets answered in one
request): librdkafka resolves OFFSET_BEGINNING with one ListOffsets per partition, one at a time,
which for 20,000 partitions took minutes of the client's time, not the broker's.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer
from kafka import TopicPartition as KafkaTopicPartition

pytestmark = [
    pytest.mark.slow,
    pytest.mark.serial,  # CPU-heavy and asserts heartbeats never lapse: runs alone, after the parallel part
    pytest.mark.timeout(1500),  # about 3 minutes here with the machine loaded by other work
    pytest.mark.skipif(not Path("/proc/self/fd").exists(), reason="needs /proc to count the broker's descriptors"),
]

NOFILE = 4096
BUDGET = NOFILE // 2  # log.open.files.max's default: half the (raised) soft limit
TOPICS = 10
PER_TOPIC = 2000  # 20,000 partitions
ROLLING = "t0"
OFFSETS_TIMEOUT_MS = 300_000  # its partitions also roll (tiny segment.bytes) and retain (retention.bytes=1)


def broker_fds(pid: int) -> tuple[int, int]:
    """(all open descriptors, those the budget counts: segment and index files)."""
    total = storage = 0
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
        total += 1
        # segment and index files in a log dir (stdout goes to a .log file too; checkpoint and
        # snapshot writes open and close their files outside the budget)
        storage += "/logs-" in target and target.endswith((".log", ".index", ".timeindex", ".txnindex", ".deleted"))
    return total, storage


def silent_session_fences(c) -> list[str]:
    """The broker epochs the controller fenced because their heartbeats stopped."""
    text = c.log_path("controller").read_text()
    return re.findall(r"event='broker_fenced' broker=1 epoch=(\d+) why='session_timeout'", text)


def produce_one_each(bootstrap: str, value: bytes) -> None:
    produce_to(bootstrap, value, [(f"t{t}", i) for t in range(TOPICS) for i in range(PER_TOPIC)])


def produce_to(bootstrap: str, value: bytes, partitions: list[tuple[str, int]]) -> None:
    failed = []
    # idempotent: a retry after a slow answer (2 cores) must not write a record twice
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "queue.buffering.max.messages": 1_000_000,
                  "enable.idempotence": True})
    for n, (t, i) in enumerate(partitions):
        p.produce(t, value, partition=i, on_delivery=lambda e, m: e and failed.append(e))
        if n % 2000 == 0:
            p.poll(0)
    assert p.flush(300) == 0
    assert failed == []


def log_starts(bootstrap: str, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
    """Every partition's log start offset, from one ListOffsets (kafka-python groups them)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        starts = consumer.beginning_offsets([KafkaTopicPartition(t, i) for t, i in partitions], timeout_ms=OFFSETS_TIMEOUT_MS)
    finally:
        consumer.close()
    return {(tp.topic, tp.partition): offset for tp, offset in starts.items()}


def read_all(bootstrap: str, last: bytes, starts: dict[tuple[str, int], int]) -> dict[tuple[str, int], list[bytes]]:
    """Each partition from the offset given until its record `last` has come."""
    # earliest: retention may move a rolling partition's log start past the offset asked for
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False,
                  "auto.offset.reset": "earliest"})
    c.assign([TopicPartition(t, i, offset) for (t, i), offset in starts.items()])
    partitions = list(starts)
    got: dict[tuple[str, int], list[bytes]] = {}
    done = 0
    deadline = time.monotonic() + 400
    while done < len(partitions) and time.monotonic() < deadline:
        for m in c.consume(10_000, 1.0):
            if m.error() is None:
                got.setdefault((m.topic(), m.partition()), []).append(m.value())
                done += m.value() == last
    c.close()
    return got


def test_twenty_thousand_partitions_under_ulimit_4096(cluster_factory):
    c = cluster_factory(
        brokers=1,
        nofile={1: NOFILE},
        broker_overrides={"log.retention.check.interval.ms": 2000},
        timeout=120,
    )
    pid = c.pid(1)
    admin = AdminClient({"bootstrap.servers": c.bootstrap, "socket.timeout.ms": 300_000})
    rolling = {"segment.bytes": "100", "retention.bytes": "1", "file.delete.delay.ms": "0"}
    topics = [NewTopic(f"t{t}", PER_TOPIC, 1, config=rolling if t == 0 else {}) for t in range(TOPICS)]
    for topic in topics:  # one CreateTopics each: each delta opens 2,000 logs
        for f in admin.create_topics([topic], operation_timeout=300, request_timeout=300).values():
            f.result()
    assert broker_fds(pid)[1] <= BUDGET

    produce_one_each(c.bootstrap, b"one")
    produce_one_each(c.bootstrap, b"two")  # t0's partitions roll: a segment holds one batch
    total, storage = broker_fds(pid)
    assert storage <= BUDGET and total < NOFILE

    # retention deletes t0's first segments (retention.bytes=1); the rest keep both records
    deadline = time.monotonic() + 120
    while True:
        lows = log_starts(c.bootstrap, [(ROLLING, i) for i in range(PER_TOPIC)])
        if all(low == 1 for low in lows.values()) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert all(low == 1 for low in lows.values()), sorted(set(lows.values()))

    everything = [(f"t{t}", i) for t in range(TOPICS) for i in range(PER_TOPIC)]
    starts = log_starts(c.bootstrap, everything)
    assert len(starts) == TOPICS * PER_TOPIC
    assert all(start == (1 if t == ROLLING else 0) for (t, _), start in starts.items())  # retained
    got = read_all(c.bootstrap, b"two", starts)
    assert len(got) == TOPICS * PER_TOPIC
    assert all(v == [b"one", b"two"] for (t, _), v in got.items() if t != ROLLING)
    assert all(v[-1] == b"two" for v in got.values())
    assert all(got[(ROLLING, i)] == [b"two"] for i in range(PER_TOPIC))
    total, storage = broker_fds(pid)
    assert storage <= BUDGET and total < NOFILE

    # opening 2,000 logs per CreateTopics, and serving 20,000 partitions, never stopped heartbeats
    assert silent_session_fences(c) == []

    c.kill(1)  # recovery: no clean-shutdown marker anywhere
    c.start_node(1, timeout=600)
    pid = c.pid(1)
    assert "log_dir_clean_shutdown" not in c.log_path(1).read_text()
    # every partition's end offset after recovery (one ListOffsets): both records survived; then
    # a sample takes a third record and is read through (another round over all 20,000 would
    # add minutes and prove nothing the end offsets and the sample do not)
    consumer = KafkaConsumer(bootstrap_servers=c.bootstrap)
    # right after the restart: partitions answer NOT_LEADER_OR_FOLLOWER until the broker applied
    # their leadership (in slices, heartbeating meanwhile); kafka-python retries them
    ends = consumer.end_offsets([KafkaTopicPartition(t, i) for t, i in everything], timeout_ms=OFFSETS_TIMEOUT_MS)
    consumer.close()
    assert len(ends) == TOPICS * PER_TOPIC and all(end == 2 for end in ends.values())
    sample = everything[::50]
    produce_to(c.bootstrap, b"three", sample)
    got = read_all(c.bootstrap, b"three", {tp: OFFSET_BEGINNING for tp in sample})
    assert len(got) == len(sample)
    assert all(v == [b"one", b"two", b"three"] for (t, _), v in got.items() if t != ROLLING)
    assert all(v[-1] == b"three" for v in got.values())
    total, storage = broker_fds(pid)
    assert storage <= BUDGET and total < NOFILE
    # the only fence for silence is the killed incarnation's: the restarted broker heartbeat all
    # along while it opened its 20,000 logs and took the leadership of every partition
    killed_epoch = re.findall(r"broker=1 epoch=(\d+)", c.log_path("controller").read_text())[0]
    assert set(silent_session_fences(c)) <= {killed_epoch}
    c.kill(1)  # a clean shutdown of 20,000 logs is not what this test measures
