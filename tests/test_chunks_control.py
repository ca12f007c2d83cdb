"""The chunk control plane on a real 1-controller, 3-broker cluster: CreateChunks through the
partition leader and straight to the controller (explicit offsets), AlterChunkAssignments moves
and the caught-up / leaving reports, Metadata's chunk fields, and chunks surviving a controller
restart from a snapshot. Nothing here reads old data through chunks (that is the data plane)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Producer

from metadata import MetadataDelta, MetadataImage
from node.client import NodeClient
from protocol.errors import Errors
from protocol.generated.alter_chunk_assignments import AlterChunkAssignmentsRequest
from protocol.generated.create_chunks import CreateChunksRequest
from protocol.generated.create_topics import CreateTopicsRequest
from protocol.generated.metadata import MetadataRequest
from protocol.generated.metadata_records.chunk_change_record import ChunkChangeRecord
from protocol.generated.metadata_records.chunk_record import ChunkRecord
from protocol.generated.metadata_records.partition_record import PartitionRecord
from protocol.generated.metadata_records.topic_record import TopicRecord
from tools.cluster import Cluster

HOST = "127.0.0.1"
CC = CreateChunksRequest
AC = AlterChunkAssignmentsRequest


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("chunks-control"), brokers=3, verbose=False)
    try:
        c.start()
        yield c
    finally:
        c.stop()


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def request(port: int, body: Any) -> Any:
    async with NodeClient(HOST, port, client_id="test-chunks") as cl:
        return await cl.request(body)


async def create_topic(c: Cluster, name: str, replicas: list[int]) -> None:
    CT = CreateTopicsRequest
    t = CT.CreatableTopic(
        name=name,
        num_partitions=-1,
        replication_factor=-1,
        assignments=[CT.CreatableReplicaAssignment(0, replicas)],
    )
    resp = await request(c.broker_port(1), CT(topics=[t], timeout_ms=10000))
    assert resp.topics[0].error_code == 0, resp.topics[0]


async def partition_md(c: Cluster, broker: int, topic: str) -> Any:
    resp = await request(
        c.broker_port(broker), MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=topic)])
    )
    [t] = resp.topics
    assert t.error_code == 0, t
    return t.partitions[0]


def chunk_rows(p: Any) -> list[tuple]:
    return [(x.start_offset, x.stop_offset, x.end_offset, list(x.replica_nodes), list(x.isr_nodes)) for x in p.chunks]


def everywhere(c: Cluster, topic: str, check: Any, timeout: float = 15.0) -> None:
    """`check(partition entry)` holds on every broker's Metadata answer (retried until it does)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            for b in c.broker_ids:
                check(run(partition_md(c, b, topic)))
            return
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def produce(c: Cluster, topic: str, n: int) -> None:
    p = Producer({"bootstrap.servers": c.bootstrap, "acks": "all", "linger.ms": 5, "message.timeout.ms": 30000})
    errors: list[Any] = []
    for i in range(n):
        p.produce(topic, f"m{i}".encode(), partition=0, on_delivery=lambda err, _m: err and errors.append(err))
    assert p.flush(30) == 0
    assert not errors, errors


def create_chunk(c: Cluster, port: int, topic: str, brokers: list[int], **offsets: int) -> Any:
    e = CC.CreateChunksTopicPartition(
        topic_name=topic,
        partition_id=0,
        broker_ids=brokers,
        start_offset=offsets.get("start", -1),
        start_timestamp=offsets.get("ts", -1),
        prev_stop_offset=offsets.get("stop", -1),
        prev_end_offset=offsets.get("end", -1),
    )
    [r] = run(request(port, CC(topic_partitions=[e]))).results
    return r


def alter_chunk(c: Cluster, port: int, topic: str, start: int, brokers: list[int] | None = None, **kw: int) -> Any:
    e = AC.AlterChunkAssignment(
        topic_name=topic,
        partition_id=0,
        start_offset=start,
        chunk_epoch=kw.get("epoch", -1),
        broker_ids=brokers or [],
        caught_up_broker_id=kw.get("caught_up", -1),
        leaving_broker_id=kw.get("leaving", -1),
    )
    [r] = run(request(port, AC(chunks=[e]))).results
    return r


# ---------------------------------------------------------------- CreateChunks through a broker
def test_create_chunk_through_the_leader_moves_the_active_chunk(cluster: Cluster) -> None:
    c = cluster
    run(create_topic(c, "cc-leader", [1]))
    produce(c, "cc-leader", 10)
    before = run(partition_md(c, 1, "cc-leader"))
    assert before.leader_id == 1 and not before.chunks

    r = create_chunk(c, c.broker_port(1), "cc-leader", [2])
    assert r.error_code == 0, r.error_message

    # the answer comes once the leader's own image holds the new active chunk
    p = run(partition_md(c, 1, "cc-leader"))
    assert (p.leader_id, list(p.replica_nodes), list(p.isr_nodes), p.start_offset) == (2, [2], [2], 10)
    assert p.leader_epoch == before.leader_epoch + 1

    def check(p: Any) -> None:
        assert p.leader_id == 2 and p.start_offset == 10
        assert chunk_rows(p) == [(0, 9, 9, [1], [1])]
        assert p.chunks[0].start_timestamp == -1  # the first chunk started with the topic

    everywhere(c, "cc-leader", check)

    # a second chunk: the first stays, the second starts at the first's end + 1 (no new data: empty)
    r = create_chunk(c, c.broker_port(2), "cc-leader", [3])
    assert r.error_code == 0, r.error_message

    def check2(p: Any) -> None:
        # the active chunk held no data, so it just moved: no chunk record for it
        assert (p.leader_id, p.start_offset) == (3, 10)
        assert chunk_rows(p) == [(0, 9, 9, [1], [1])]

    everywhere(c, "cc-leader", check2)


def test_create_chunk_refused_by_a_non_leader_and_for_bad_input(cluster: Cluster) -> None:
    c = cluster
    run(create_topic(c, "cc-refused", [1, 2]))
    produce(c, "cc-refused", 3)
    r = create_chunk(c, c.broker_port(2), "cc-refused", [2, 3])
    assert r.error_code == Errors.NOT_LEADER_OR_FOLLOWER
    r = create_chunk(c, c.broker_port(1), "no-such-topic-cc", [2, 3])
    assert r.error_code == Errors.UNKNOWN_TOPIC_OR_PARTITION
    for brokers, needle in (([3], "1 broker"), ([2, 2], "more than once"), ([2, 9], "broker 9")):
        r = create_chunk(c, c.broker_port(1), "cc-refused", brokers)
        assert r.error_code == Errors.INVALID_REPLICA_ASSIGNMENT, r
        assert needle in r.error_message
    # the failed attempts unsealed the partition: the leader takes writes again
    produce(c, "cc-refused", 2)
    p = run(partition_md(c, 1, "cc-refused"))
    assert p.leader_id == 1 and not p.chunks and list(p.replica_nodes) == [1, 2]


# ---------------------------------------------------------------- CreateChunks at the controller
def test_controller_checks_and_records_the_leaders_offsets(cluster: Cluster) -> None:
    c, port = cluster, cluster.controller_port
    run(create_topic(c, "cc-offsets", [1, 2]))
    produce(c, "cc-offsets", 10)  # the offsets below match real data, as a leader would send them
    before = run(partition_md(c, 1, "cc-offsets"))

    r = create_chunk(c, port, "cc-offsets", [3, 1])
    assert r.error_code == Errors.INVALID_REQUEST and "partition leader" in r.error_message
    bad = [
        (dict(start=7, ts=5, stop=5, end=9), Errors.INVALID_REQUEST, "StartOffset - 1"),
        (dict(start=7, ts=5, stop=6, end=5), Errors.INVALID_REQUEST, "PrevEndOffset"),
    ]
    for offsets, code, needle in bad:
        r = create_chunk(c, port, "cc-offsets", [3, 1], **offsets)
        assert (r.error_code, needle in (r.error_message or "")) == (code, True), r

    # LSO 7 < HW 10: the closed chunk is readable to 6 and replicated to 9
    r = create_chunk(c, port, "cc-offsets", [3, 1], start=7, ts=1234, stop=6, end=9)
    assert r.error_code == 0, r.error_message

    def check(p: Any) -> None:
        assert (p.leader_id, list(p.replica_nodes), list(p.isr_nodes), p.start_offset) == (3, [3, 1], [3, 1], 7)
        assert p.leader_epoch == before.leader_epoch + 1
        assert chunk_rows(p) == [(0, 6, 9, [1, 2], [1, 2])]

    everywhere(c, "cc-offsets", check)

    # a start below the active chunk's start is refused
    r = create_chunk(c, port, "cc-offsets", [2, 3], start=5, ts=1, stop=4, end=9)
    assert r.error_code == Errors.INVALID_REQUEST and "below" in r.error_message
    # an active chunk with no data (HW == its start) moves without leaving a chunk behind
    r = create_chunk(c, port, "cc-offsets", [2, 3], start=7, ts=99, stop=6, end=6)
    assert r.error_code == 0, r.error_message
    everywhere(c, "cc-offsets", _assert_moved)


def _assert_moved(p: Any) -> None:
    assert (p.leader_id, list(p.replica_nodes), p.start_offset) == (2, [2, 3], 7)
    assert chunk_rows(p) == [(0, 6, 9, [1, 2], [1, 2])]


# ---------------------------------------------------------------- AlterChunkAssignments
async def log_end(port: int) -> int:
    return (await fetch_log(port, 0)).high_watermark


async def fetch_log(port: int, offset: int) -> Any:
    from tests.test_controller import fetch_req

    resp = await request(port, fetch_req(offset))
    return resp.responses[0].partitions[0]


async def records_from(port: int, offset: int) -> list[Any]:
    from tests.test_controller import decode

    out: list[Any] = []
    while True:
        p = await fetch_log(port, offset)
        assert p.error_code == 0, p
        got = decode(p.records)
        if not got:
            return out
        out += [r for _, _, r in got]
        offset = got[-1][1] + 1


def test_alter_chunk_assignments_moves_and_reports(cluster: Cluster) -> None:
    c, port = cluster, cluster.controller_port
    run(create_topic(c, "cc-alter", [1, 2]))
    produce(c, "cc-alter", 6)
    assert create_chunk(c, port, "cc-alter", [3, 1], start=6, ts=1, stop=5, end=5).error_code == 0
    everywhere(c, "cc-alter", lambda p: _rows_are(p, [(0, 5, 5, [1, 2], [1, 2])]))

    # refusals, each naming the culprit
    r = alter_chunk(c, port, "cc-alter", 3, [2, 3])
    assert r.error_code == Errors.INVALID_REQUEST and "offset 3" in r.error_message
    r = alter_chunk(c, port, "no-such-topic-ac", 0, [2, 3])
    assert r.error_code == Errors.UNKNOWN_TOPIC_OR_PARTITION
    for brokers, needle in (([2], "1 broker"), ([2, 2], "more than once"), ([2, 9], "broker 9")):
        r = alter_chunk(c, port, "cc-alter", 0, brokers)
        assert r.error_code == Errors.INVALID_REPLICA_ASSIGNMENT and needle in r.error_message, r
    r = alter_chunk(c, port, "cc-alter", 0, [2, 3], epoch=5)
    assert r.error_code == Errors.FENCED_LEADER_EPOCH

    # a move that adds broker 3, sent to a broker (which forwards it to the controller)
    end = run(log_end(port))
    r = alter_chunk(c, c.broker_port(3), "cc-alter", 0, [2, 3], epoch=0)
    assert r.error_code == 0, r.error_message
    [first, *_] = [x for x in run(records_from(port, end)) if isinstance(x, ChunkChangeRecord)]
    assert (first.start_offset, first.replicas, first.adding_replicas, first.removing_replicas) == (
        0,
        [2, 3, 1],
        [3],
        [1],
    )
    assert first.isr is None  # nobody joined the ISR yet
    # broker 3 reports it holds the whole chunk (the data plane may have reported it already)
    r = alter_chunk(c, port, "cc-alter", 0, caught_up=3)
    assert r.error_code == 0, r.error_message
    everywhere(c, "cc-alter", lambda p: _rows_are(p, [(0, 5, 5, [2, 3], [2, 3])]))
    r = alter_chunk(c, port, "cc-alter", 0, caught_up=1)
    assert r.error_code == Errors.INVALID_REPLICA_ASSIGNMENT and "Broker 1" in r.error_message

    # reordering needs nobody to catch up: applied at once
    assert alter_chunk(c, port, "cc-alter", 0, [3, 2]).error_code == 0
    everywhere(c, "cc-alter", lambda p: _rows_are(p, [(0, 5, 5, [3, 2], [2, 3])]))

    # replicas leave; the last one leaving drops the chunk
    assert alter_chunk(c, port, "cc-alter", 0, leaving=3).error_code == 0
    assert alter_chunk(c, port, "cc-alter", 0, leaving=3).error_code == 0  # a repeated report is harmless
    everywhere(c, "cc-alter", lambda p: _rows_are(p, [(0, 5, 5, [2], [2])]))
    assert alter_chunk(c, c.broker_port(1), "cc-alter", 0, leaving=2).error_code == 0
    everywhere(c, "cc-alter", lambda p: _rows_are(p, []))
    p = run(partition_md(c, 1, "cc-alter"))
    assert (p.start_offset, p.leader_id) == (6, 3)
    r = alter_chunk(c, port, "cc-alter", 0, [1, 2])
    assert r.error_code == Errors.INVALID_REQUEST


def _rows_are(p: Any, rows: list[tuple]) -> None:
    assert chunk_rows(p) == rows


def test_broker_and_controller_advertise_the_chunk_apis(cluster: Cluster) -> None:
    async def versions(port: int) -> dict[int, tuple[int, int]]:
        async with NodeClient(HOST, port) as cl:
            return dict(cl.versions)

    assert {1076: (0, 0), 1077: (0, 0)}.items() <= run(versions(cluster.broker_port(1))).items()
    assert {1076: (0, 0), 1077: (0, 0)}.items() <= run(versions(cluster.controller_port)).items()


# ---------------------------------------------------------------- restarts and snapshots
def test_chunks_survive_a_controller_restart_from_a_snapshot(cluster_factory: Any) -> None:
    c = cluster_factory(
        brokers=1,
        verbose=False,
        controller_overrides={"metadata.log.max.record.bytes.between.snapshots": "1024"},
    )
    port = c.controller_port
    run(create_topic(c, "snap", [1]))
    produce(c, "snap", 4)
    # the broker fills the offsets: chunk [0, 3], active chunk from 4 (still on broker 1)
    assert create_chunk(c, c.broker_port(1), "snap", [1]).error_code == 0
    for i in range(12):  # enough records to pass the snapshot threshold more than once
        run(create_topic(c, f"snap-filler-{i}", [1]))
    snaps = list(c.node_dir("controller").rglob("*.checkpoint"))
    assert snaps, "the controller wrote no snapshot"

    def check(p: Any) -> None:
        assert (p.leader_id, p.start_offset) == (1, 4)
        assert chunk_rows(p) == [(0, 3, 3, [1], [1])]
        assert p.chunks[0].start_timestamp == -1

    everywhere(c, "snap", check)
    c.restart("controller")
    c.restart(1)  # the broker's image comes from the restarted controller's snapshot + log
    everywhere(c, "snap", check, timeout=30)
    # the controller itself knows the chunk: it refuses a stale epoch for it, and not for others
    assert alter_chunk(c, port, "snap", 0, [1], epoch=7).error_code == Errors.FENCED_LEADER_EPOCH
    assert alter_chunk(c, port, "snap", 1, [1]).error_code == Errors.INVALID_REQUEST


def test_snapshot_records_rebuild_chunks_and_start_offsets() -> None:
    from controller.snapshots import image_records

    tid = uuid.uuid4()
    delta = MetadataDelta(MetadataImage.EMPTY)
    delta.replay(TopicRecord(name="t", topic_id=tid), 0)
    delta.replay(
        PartitionRecord(
            partition_id=0,
            topic_id=tid,
            replicas=[2],
            isr=[2],
            leader=2,
            leader_epoch=3,
            start_offset=40,
            start_timestamp=777,
        ),
        1,
    )
    delta.replay(
        ChunkRecord(
            partition_id=0,
            topic_id=tid,
            start_offset=0,
            start_timestamp=-1,
            stop_offset=19,
            end_offset=21,
            chunk_epoch=0,
            replicas=[1],
            directories=[],
            isr=[1],
            removing_replicas=[],
            adding_replicas=[],
            epoch=0,
        ),
        2,
    )
    delta.replay(
        ChunkRecord(
            partition_id=0,
            topic_id=tid,
            start_offset=20,
            start_timestamp=500,
            stop_offset=39,
            end_offset=39,
            chunk_epoch=0,
            replicas=[3, 1],
            directories=[],
            isr=[3],
            removing_replicas=[1],
            adding_replicas=[3],
            epoch=0,
        ),
        3,
    )
    delta.replay(ChunkChangeRecord(partition_id=0, topic_id=tid, start_offset=20, isr=[3, 1]), 4)
    delta.replay(ChunkChangeRecord(partition_id=0, topic_id=tid, start_offset=20, log_start_offset=25), 5)
    image = delta.apply()
    again = MetadataDelta(MetadataImage.EMPTY)
    for i, r in enumerate(image_records(image)):
        again.replay(r, i)
    rebuilt = again.apply()
    t, t2 = image.topic("t"), rebuilt.topic("t")
    assert t is not None and t2 is not None
    assert t2.chunks[0] == t.chunks[0] and t2.chunks[0][1].chunk_epoch == 2
    assert [c.first_offset for c in t2.chunks[0]] == [0, 25]  # DeleteRecords' log start survives
    assert (t2.partitions[0].start_offset, t2.partitions[0].start_timestamp) == (40, 777)
