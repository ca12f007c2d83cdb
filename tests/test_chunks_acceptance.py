"""Chunk acceptance on real clusters: a partition in 3 chunks on disjoint brokers stays readable
(every old message, through connector/reader.py) after kill -9 of the active chunk's leader; a
restart of every broker and the controller keeps all chunks and their data; retention deleting a
whole chunk drops it; deleting the topic removes every chunk dir."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from confluent_kafka.admin import AdminClient

from connector.reader import ChunkReader, ReaderError
from tests.test_chunks_data import (
    FAST,
    HOST,
    chunk_dirs,
    chunk_rows,
    consume_confluent,
    create_chunk,
    create_topic,
    partition_md,
    produce,
    wait_for,
)
from tools.cluster import Cluster

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster(tmp_path) -> Iterator[Cluster]:
    c = Cluster(tmp_path / "c", brokers=3, verbose=False,
                broker_overrides={**FAST, "log.retention.check.interval.ms": "300", "file.delete.delay.ms": "0"},
                controller_overrides={"broker.session.timeout.ms": "3000"})
    try:
        c.start()
        yield c
    finally:
        c.stop()


def three_chunks(c: Cluster, topic: str) -> None:
    """topic-0 = [0, 9] on broker 1, [10, 19] on broker 2, the active chunk from 20 on broker 3."""
    create_topic(c, topic, [1])
    produce(c, topic, [b"one-%d" % i for i in range(10)])
    create_chunk(c, topic, [2])
    produce(c, topic, [b"two-%d" % i for i in range(10)])
    create_chunk(c, topic, [3])
    produce(c, topic, [b"three-%d" % i for i in range(10)])
    p = partition_md(c, 1, topic)
    assert (p.leader_id, p.start_offset) == (3, 20)
    assert chunk_rows(p) == [(0, 9, 9, [1], [1]), (10, 19, 19, [2], [2])]


EXPECTED = [b"one-%d" % i for i in range(10)] + [b"two-%d" % i for i in range(10)] + [b"three-%d" % i for i in range(10)]


def test_kill_9_of_the_active_leader_leaves_every_old_message_readable(cluster: Cluster) -> None:
    c, topic = cluster, "chunks-kill"
    three_chunks(c, topic)
    c.kill(3)
    reader = ChunkReader([(HOST, c.broker_port(1)), (HOST, c.broker_port(2))], timeout=3)
    wait_for(lambda: partition_md(c, 1, topic).leader_id == -1, what="broker 3 fenced")
    got = list(reader.read(topic, 0, 0, 20))
    assert [(r.offset, r.value) for r in got] == list(enumerate(EXPECTED[:20]))
    assert reader.served_by == {1: 10, 2: 10}
    with pytest.raises(ReaderError, match="20"):
        list(reader.read(topic, 0, 15, 25))  # the active chunk has no leader


def test_restart_of_every_node_keeps_chunks_and_data(cluster: Cluster) -> None:
    c, topic = cluster, "chunks-restart"
    three_chunks(c, topic)
    before = chunk_rows(partition_md(c, 1, topic))
    c.stop()
    c.start()
    wait_for(lambda: partition_md(c, 2, topic).leader_id == 3, what="the active chunk's leader back")
    for b in c.broker_ids:
        assert chunk_rows(partition_md(c, b, topic)) == before
    assert sorted(chunk_dirs(c, 1, topic)) == [0] and sorted(chunk_dirs(c, 2, topic)) == [10]
    assert sorted(chunk_dirs(c, 3, topic)) == [20]
    got = list(ChunkReader(c.bootstrap).read(topic, 0, 0, 30))
    assert [r.value for r in got] == EXPECTED
    flat = [r for poll in consume_confluent(c, topic, 30) for r in poll]
    assert [v for _, v in flat] == EXPECTED
    produce(c, topic, [b"after"])  # the active chunk still takes writes where it left off
    assert partition_md(c, 3, topic).start_offset == 20
    assert [r.offset for r in ChunkReader(c.bootstrap).read(topic, 0, 30, 31)] == [30]


def test_retention_deleting_a_whole_chunk_drops_it(cluster: Cluster) -> None:
    """The first chunk's records are a day old, the rest are new; with retention.ms of an hour
    the first chunk's replica loses all its data, leaves the chunk, and the chunk is dropped."""
    c, topic = cluster, "chunks-retention"
    create_topic(c, topic, [1], **{"retention.ms": "3600000"})
    day_ago = int(time.time() * 1000) - 86_400_000
    _produce_at(c, topic, day_ago, 10)
    create_chunk(c, topic, [2])
    produce(c, topic, [b"new-%d" % i for i in range(5)])
    wait_for(lambda: not partition_md(c, 2, topic).chunks, timeout=30, what="the emptied chunk dropped")
    wait_for(lambda: 0 not in chunk_dirs(c, 1, topic), what="broker 1 to delete the chunk's dir")
    assert partition_md(c, 2, topic).start_offset == 10
    got = list(ChunkReader(c.bootstrap).read(topic, 0, 10, 15))
    assert [r.value for r in got] == [b"new-%d" % i for i in range(5)]


def _produce_at(c: Cluster, topic: str, ts: int, n: int) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": c.bootstrap, "acks": "all"})
    for i in range(n):
        p.produce(topic, b"older-%d" % i, partition=0, timestamp=ts)
    assert p.flush(30) == 0


def test_topic_deletion_removes_every_chunk_dir(cluster: Cluster) -> None:
    c, topic = cluster, "chunks-delete"
    three_chunks(c, topic)
    assert all(chunk_dirs(c, b, topic) for b in c.broker_ids)
    admin = AdminClient({"bootstrap.servers": c.bootstrap})
    admin.delete_topics([topic])[topic].result(30)
    wait_for(lambda: not any(chunk_dirs(c, b, topic) for b in c.broker_ids), what="every chunk dir deleted")
    assert all(not list(c.node_dir(b).glob(f"logs-*/{topic}-*")) for b in c.broker_ids)


def test_a_replica_that_was_down_when_the_chunk_was_cut_catches_up(cluster: Cluster) -> None:
    """Broker 2 is down while its partition gets 10 more records and a chunk is cut: back up, its
    replica of the closed chunk copies [10, 19] from broker 1, reports it caught up and joins the
    chunk's ISR; then it alone serves the chunk."""
    c, topic = cluster, "chunks-catch-up"
    create_topic(c, topic, [1, 2])
    produce(c, topic, [b"a%d" % i for i in range(10)])
    c.terminate(2)
    wait_for(lambda: sorted(partition_md(c, 1, topic).isr_nodes) == [1], what="broker 2 out of the ISR")
    produce(c, topic, [b"b%d" % i for i in range(10)], acks="1")
    p = create_chunk(c, topic, [3, 1])
    assert chunk_rows(p) == [(0, 19, 19, [1, 2], [1])]
    c.start_node(2)
    wait_for(lambda: chunk_rows(partition_md(c, 2, topic)) == [(0, 19, 19, [1, 2], [1, 2])], timeout=30,
             what="broker 2 back in the chunk's ISR")
    assert sorted(chunk_dirs(c, 2, topic)) == [0]  # no replica of the active chunk there
    c.kill(1)
    reader = ChunkReader([(HOST, c.broker_port(2)), (HOST, c.broker_port(3))], timeout=3)
    got = list(reader.read(topic, 0, 0, 20))
    assert [r.value for r in got] == [b"a%d" % i for i in range(10)] + [b"b%d" % i for i in range(10)]
    assert reader.served_by == {2: 20}


def test_delete_records_past_a_whole_chunk_drops_it(cluster: Cluster) -> None:
    """DeleteRecords at 15 on topic-0 = [0, 9] on 1, [10, 19] on 2, active from 20 on 3: the
    first chunk lies wholly below it and is dropped (its replica deletes its dir); the second,
    cut through, gets 15 as its log start: nothing below it is served any more, the earliest
    offset is 15, and its replica raises its own log start."""
    from confluent_kafka import Consumer, TopicPartition

    c, topic = cluster, "chunks-delete-records"
    three_chunks(c, topic)
    admin = AdminClient({"bootstrap.servers": c.bootstrap})
    for f in admin.delete_records([TopicPartition(topic, 0, 15)]).values():
        assert f.result(30).low_watermark == 15
    wait_for(lambda: [r[0] for r in chunk_rows(partition_md(c, 2, topic))] == [10], what="the first chunk dropped")
    wait_for(lambda: 0 not in chunk_dirs(c, 1, topic), what="broker 1 to delete the dropped chunk's dir")
    assert [(r[0], r[1]) for r in chunk_rows(partition_md(c, 2, topic))] == [(10, 19)]
    got = list(ChunkReader(c.bootstrap).read(topic, 0, 15, 30))
    assert [r.value for r in got] == EXPECTED[15:]
    with pytest.raises(ReaderError, match="error 1"):  # OFFSET_OUT_OF_RANGE, from the chunk's replica
        list(ChunkReader(c.bootstrap).read(topic, 0, 10, 30))
    con = Consumer({"bootstrap.servers": c.bootstrap, "group.id": "chunks-delete-records"})
    try:
        assert con.get_watermark_offsets(TopicPartition(topic, 0), timeout=10) == (15, 30)
    finally:
        con.close()
    wait_for(lambda: "log_start_offset=15" in (c.log_path(2).read_text()), what="broker 2 to raise its log start")
    # a new consumer (auto.offset.reset=earliest) starts there
    flat = [r for poll in consume_confluent(c, topic, 15) for r in poll]
    assert flat == [(15 + i, v) for i, v in enumerate(EXPECTED[15:])]
