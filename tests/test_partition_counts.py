"""KIP-253 partition count changes, controller and broker side (its sections 1-3), against a
real cluster: epoch bumps with the new count, marks, deletion once empty, Produce's count check,
Metadata's tagged fields and kafka-topics.sh --alter/--describe."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from node.client import NodeClient
from protocol.errors import Errors
from protocol.generated.create_chunks import CreateChunksRequest
from protocol.generated.delete_records import DeleteRecordsRequest
from protocol.generated.metadata import MetadataRequest
from protocol.generated.partition_leader_epochs_for_partitions import PartitionLeaderEpochsForPartitionsRequest
from protocol.generated.produce import ProduceRequest
from protocol.records import Record, encode_batch
from tests.conftest import eventually
from tests.test_kafka_topics import fails, ok, parse_describe
from tools.cluster import Cluster

FAST_DELETE = {"partition.deletion.check.interval.ms": 300}


@pytest.fixture
def kcluster(cluster_factory) -> Cluster:
    return cluster_factory(controller_overrides=FAST_DELETE)


def run(coro):
    return asyncio.run(coro)


def _client(c: Cluster, broker: int | None = None) -> NodeClient:
    """Connects on `async with`."""
    port = c.broker_port(broker if broker is not None else c.broker_ids[0])
    return NodeClient("127.0.0.1", port, timeout=15)


async def metadata(c: Cluster, topic: str, broker: int | None = None):
    async with _client(c, broker) as nc:
        resp = await nc.request(MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=topic)]), 12)
    return resp.topics[0]


async def epoch_maps(c: Cluster, topic: str):
    R = PartitionLeaderEpochsForPartitionsRequest
    async with _client(c) as nc:
        resp = await nc.request(R(topics=[R.PartitionLeaderEpochsTopic(name=topic, partitions=None)]))
    t = resp.topics[0]
    return t.undeleted_partition_count, {
        p.partition_index: (
            {e.partition_id: e.leader_epoch for e in p.leader_epoch_after_creation},
            {e.partition_id: e.leader_epoch for e in p.leader_epoch_before_deletion},
        )
        for p in t.partitions
    }


async def produce(c: Cluster, topic: str, partition: int, n: int, count: int = -1,
                  records: list[Record] | None = None):
    """n records (or `records`) to the partition's leader; `count` is the tagged
    UndeletedPartitionCount (-1: a stock client)."""
    t = await metadata(c, topic)
    leader = next(p.leader_id for p in t.partitions if p.partition_index == partition)
    P = ProduceRequest
    batch = encode_batch(records or [Record(value=b"v%d" % i, key=b"k") for i in range(n)])
    req = P(
        acks=-1,
        timeout_ms=10000,
        topic_data=[
            P.TopicProduceData(
                name=topic,
                partition_data=[P.PartitionProduceData(index=partition, records=batch)],
                undeleted_partition_count=count,
            )
        ],
    )
    async with _client(c, leader) as nc:
        resp = await nc.request(req)
    return resp.responses[0].partition_responses[0]


def produced(c: Cluster, topic: str, partition: int, n: int, count: int = -1):
    """produce() until it is taken: a leader that has just been told of a new partition or
    chunk answers NOT_LEADER_OR_FOLLOWER until its replica is up (a client retries that too)."""

    def taken():
        r = run(produce(c, topic, partition, n, count))
        assert r.error_code == 0, r
        return r

    return eventually(taken)


async def new_chunk(c: Cluster, topic: str, partition: int) -> int:
    """CreateChunks: a new active chunk on one other broker and one of the current replicas."""
    p = next(p for p in (await metadata(c, topic)).partitions if p.partition_index == partition)
    others = [b for b in c.broker_ids if b not in p.replica_nodes]
    CC = CreateChunksRequest
    e = CC.CreateChunksTopicPartition(topic_name=topic, partition_id=partition,
                                      broker_ids=[others[0], p.replica_nodes[0]])
    async with _client(c, p.leader_id) as nc:
        [r] = (await nc.request(CC(topic_partitions=[e]))).results
    return r.error_code


async def delete_records(c: Cluster, topic: str, partition: int, offset: int) -> int:
    t = await metadata(c, topic)
    leader = next(p.leader_id for p in t.partitions if p.partition_index == partition)
    D = DeleteRecordsRequest
    req = D(
        topics=[D.DeleteRecordsTopic(name=topic, partitions=[D.DeleteRecordsPartition(partition, offset)])],
        timeout_ms=10000,
    )
    async with _client(c, leader) as nc:
        resp = await nc.request(req)
    return resp.topics[0].partitions[0].error_code


async def stock_clients_on_marked(bs: str) -> None:
    """aiokafka after a shrink: writes to kept partitions go on, writes to a marked one are refused
    (retried until they time out), and a consumer still reads the marked one to its end."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
    from aiokafka.errors import KafkaError

    p = AIOKafkaProducer(bootstrap_servers=bs, request_timeout_ms=2000)
    await p.start()
    try:
        assert (await p.send_and_wait("t", b"kept", key=b"k", partition=3)).partition == 3
        with pytest.raises(KafkaError):
            await p.send_and_wait("t", b"refused", key=b"k", partition=4)
    finally:
        await p.stop()
    consumer = AIOKafkaConsumer(bootstrap_servers=bs, auto_offset_reset="earliest")
    await consumer.start()
    try:
        consumer.assign([TopicPartition("t", 4)])
        got = await consumer.getmany(timeout_ms=5000)
        assert sum(len(v) for v in got.values()) == 3  # what was written to 4 before it was marked
    finally:
        await consumer.stop()


def describe(bs: str, topic: str) -> dict:
    return parse_describe(ok(bs, "--describe", "--topic", topic))[topic]


def replica_dirs(c: Cluster, topic: str, partition: int) -> list[Path]:
    return [d for b in c.broker_ids for d in c.node_dir(b).rglob(f"{topic}-{partition}-*") if d.is_dir()]


def test_snapshot_keeps_counts_and_maps() -> None:
    """A snapshot of the image rebuilds the KIP-253 state exactly (controller restart, broker catch-up)."""
    import uuid

    from controller.partition_counts import expand_records, shrink_records
    from controller.snapshots import image_records
    from metadata.image import MetadataDelta, MetadataImage
    from protocol.generated.metadata_records.partition_record import PartitionRecord
    from protocol.generated.metadata_records.topic_record import TopicRecord

    def replay(image, records):
        delta = MetadataDelta(image)
        for r in records:
            delta.replay(r)
        return delta.apply()

    tid = uuid.uuid4()
    parts = [PartitionRecord(partition_id=i, topic_id=tid, replicas=[1], isr=[1], leader=1, leader_epoch=0,
                             partition_epoch=0) for i in range(2)]
    image = replay(MetadataImage.EMPTY, [TopicRecord(name="t", topic_id=tid), *parts])
    new = [PartitionRecord(partition_id=2, topic_id=tid, replicas=[1], isr=[1], leader=1, leader_epoch=0,
                           partition_epoch=0)]
    image = replay(image, expand_records(image.topics[tid], new))
    image = replay(image, shrink_records(image.topics[tid], 1))
    t = image.topics[tid]
    assert t.undeleted_partition_count == 1
    assert t.partitions[0].leader_epoch == 2 and t.partitions[2].epochs_after_creation == ((0, 0), (1, 0))
    # the shrink bumps the marked partitions too: their pre-mark epoch ends where the mark applies
    assert (t.partitions[1].leader_epoch, t.partitions[2].leader_epoch) == (2, 1)
    assert t.partitions[1].epochs_before_deletion == t.partitions[2].epochs_before_deletion == ((0, 1),)
    again = replay(MetadataImage.EMPTY, list(image_records(image)))
    assert again.topics[tid] == t


def test_expand_shrink_delete(kcluster: Cluster) -> None:
    c, bs = kcluster, kcluster.bootstrap
    ok(bs, "--create", "--topic", "t", "--partitions", "3", "--replication-factor", "2")
    eventually(lambda: describe(bs, "t"))
    for i in range(3):
        assert run(produce(c, "t", i, 5)).error_code == 0
    before = {p.partition_index: p.leader_epoch for p in run(metadata(c, "t")).partitions}

    # expansion: every old partition's epoch bumped with the new count; new ones remember the old epochs
    ok(bs, "--alter", "--topic", "t", "--partitions", "6")

    def expanded():
        ts = [run(metadata(c, "t", b)) for b in c.broker_ids]
        assert all(len(t.partitions) == 6 and t.undeleted_partition_count == 6 for t in ts)
        return ts[0]

    t = eventually(expanded)
    assert {p.partition_index: p.leader_epoch for p in t.partitions if p.partition_index < 3} == {
        i: e + 1 for i, e in before.items()
    }
    count, maps = run(epoch_maps(c, "t"))
    assert count == 6
    assert all(maps[i] == ({}, {}) for i in range(3))
    assert all(maps[i] == (before, {}) for i in range(3, 6))

    # a producer that partitioned over the old count is told to refresh, each time it sends it (no
    # hang, no other answer); stock producers go on
    for _ in range(5):
        stale = run(produce(c, "t", 1, 1, count=3))
        assert stale.error_code == Errors.INVALID_PARTITION_METADATA and "6" in stale.error_message
    produced(c, "t", 4, 3, count=6)
    produced(c, "t", 5, 1)
    # partition 5 gets a second chunk: its deletion must take both
    assert run(new_chunk(c, "t", 5)) == 0
    produced(c, "t", 5, 2, count=6)

    # shrink (Kafka refuses it; KIP-253 accepts): 4 and 5 marked, 0-3 bumped
    epochs6 = {p.partition_index: p.leader_epoch for p in run(metadata(c, "t")).partitions}
    ok(bs, "--alter", "--topic", "t", "--partitions", "4")
    def shrunk():  # on every broker, so the leaders refuse what they must below
        assert all(run(metadata(c, "t", b)).undeleted_partition_count == 4 for b in c.broker_ids)

    eventually(shrunk)
    t = run(metadata(c, "t"))
    assert [p.partition_index for p in t.partitions if p.marked_for_deletion] == [4, 5]
    assert all(p.leader_epoch == epochs6[p.partition_index] + 1 for p in t.partitions)  # kept and marked
    _, maps = run(epoch_maps(c, "t"))
    assert maps[4][1] == maps[5][1] == {i: epochs6[i] for i in range(4)}
    d = describe(bs, "t")
    assert d["PartitionCount"] == "6" and d["UndeletedPartitionCount"] == "4"
    assert [p.get("MarkedForDeletion") for p in d["partitions"]] == [None] * 4 + ["true"] * 2


    # nobody writes to a marked partition: stock producers get a retriable error with a reason
    refused = run(produce(c, "t", 4, 1))
    assert refused.error_code == Errors.NOT_LEADER_OR_FOLLOWER and "marked for deletion" in refused.error_message
    assert run(produce(c, "t", 4, 1, count=4)).error_code == Errors.INVALID_PARTITION_METADATA
    assert run(produce(c, "t", 3, 1, count=4)).error_code == 0
    run(stock_clients_on_marked(bs))

    # bad input while 4 and 5 are still being deleted, and always
    line = fails(bs, "--alter", "--topic", "t", "--partitions", "2", code="INVALID_PARTITIONS")
    assert "being deleted" in line
    assert "being deleted" in fails(bs, "--alter", "--topic", "t", "--partitions", "8", code="INVALID_PARTITIONS")
    assert "at least 1" in fails(bs, "--alter", "--topic", "t", "--partitions", "0", code="INVALID_PARTITIONS")

    # 4 and 5 hold records, so they stay; a controller killed now resumes from its log
    assert replica_dirs(c, "t", 4) and {d.name for d in replica_dirs(c, "t", 5)} == {"t-5-0", "t-5-1"}
    c.restart("controller", hard=True)
    time.sleep(1.0)
    t = run(metadata(c, "t"))
    assert len(t.partitions) == 6 and [p.partition_index for p in t.partitions if p.marked_for_deletion] == [4, 5]
    assert run(delete_records(c, "t", 4, -1)) == 0
    assert run(delete_records(c, "t", 5, -1)) == 0

    def deleted():
        t = run(metadata(c, "t"))
        assert [p.partition_index for p in t.partitions] == [0, 1, 2, 3]
        assert not replica_dirs(c, "t", 4) and not replica_dirs(c, "t", 5)

    eventually(deleted, timeout=20)

    def described():
        d = describe(bs, "t")
        assert d["PartitionCount"] == "4" and "UndeletedPartitionCount" not in d

    eventually(described)
    assert "already has 4" in fails(bs, "--alter", "--topic", "t", "--partitions", "4", code="INVALID_PARTITIONS")

    # an internal topic's count never changes (group and transaction ids hash over it)
    ok(bs, "--create", "--topic", "__transaction_state", "--partitions", "2")
    line = fails(bs, "--alter", "--topic", "__transaction_state", "--partitions", "1", code="INVALID_PARTITIONS")
    assert "internal" in line

    # now the count may grow again: the new partitions 4 and 5 start empty
    ok(bs, "--alter", "--topic", "t", "--partitions", "6")
    def regrown():
        assert len(run(metadata(c, "t")).partitions) == 6

    eventually(regrown)
    assert produced(c, "t", 5, 1, count=6).base_offset == 0


def test_group_keeps_positions_and_forgets_deleted_partitions() -> None:
    """The group coordinator's KIP-253 state (broker/coordinator/group/group.py), pure state."""
    from broker.coordinator.group.group import ClassicGroup
    from broker.coordinator.group.records import OffsetAndMetadata

    g = ClassicGroup("g")
    g.apply_offset(("t", 1), OffsetAndMetadata(40), 7)
    # a waits on 0 and 1; b reports 0; the group's position of 1 is its committed offset
    answer, wanted = g.exchange_positions("a", [], {("t", 0), ("t", 1)})
    assert answer == {("t", 0): -1, ("t", 1): 40} and wanted == set()
    answer, wanted = g.exchange_positions("b", [(("t", 0), 12)], set())
    assert answer == {} and wanted == {("t", 0), ("t", 1)}
    g.exchange_positions("b", [(("t", 0), 9), (("t", 1), 55)], set())  # positions never go back
    assert g.exchange_positions("a", [], {("t", 0), ("t", 1)})[0] == {("t", 0): 12, ("t", 1): 55}
    # partition 1 deleted: its offset and position go (a re-created 1 starts empty)
    assert g.forget_partitions({("t", 1)}) == [("t", 1)]
    assert g.exchange_positions("a", [], {("t", 1)})[0] == {("t", 1): -1}
    g.remove("a")
    assert "a" not in g.interests
