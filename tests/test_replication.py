"""Replication: followers copy the leader's bytes, the ISR shrinks and grows, acks=all waits for
it, a killed leader is replaced from the ISR, and a replica holding writes the new leader never
got truncates them when it comes back."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from node.client import NodeClient
from protocol.generated.init_producer_id import InitProducerIdRequest
from protocol.generated.produce import ProduceRequest
from protocol.records import Record, decode_batches, encode_batch
from tests.conftest import wait_for_kafka as wait_for
from tools.cluster import Cluster

pytestmark = pytest.mark.slow
FAST = {"replica.lag.time.max.ms": "3000", "broker.session.timeout.ms": "3000", "broker.heartbeat.interval.ms": "500"}


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path / "c", brokers=3, verbose=False, broker_overrides=FAST,
                controller_overrides={"broker.session.timeout.ms": "3000"})
    c.start()
    yield c
    c.stop()


def create(c: Cluster, name: str, partitions: int = 1, rf: int = 3, **config: str) -> AdminClient:
    a = AdminClient(c.rdkafka_conf())
    a.create_topics([NewTopic(name, partitions, rf, config=config)])[name].result(30)
    return a


def partition_state(a: AdminClient, topic: str, p: int = 0):
    md = a.list_topics(topic, timeout=3).topics[topic].partitions[p]
    return md.leader, sorted(md.isrs), list(md.replicas)


def isr_at(c: Cluster, broker: int, topic: str, p: int = 0) -> list[int]:
    """The ISR as one broker's Metadata says (clients may route to a stopped broker and hang)."""
    from node.client import NodeClient
    from protocol.generated.metadata import MetadataRequest

    async def ask():
        async with NodeClient("127.0.0.1", c.broker_port(broker)) as cl:
            r = await cl.request(MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=topic)]))
            return sorted(r.topics[0].partitions[p].isr_nodes)

    return asyncio.run(ask())



def disk_records(c: Cluster, broker: int, topic: str, p: int = 0) -> list[tuple[int, bytes]]:
    dirs = list((c.node_dir(broker)).glob(f"logs-*/{topic}-{p}-0"))
    assert len(dirs) == 1, dirs
    data = b"".join(f.read_bytes() for f in sorted(dirs[0].glob("*.log")))
    return [(r.offset, r.value) for b in decode_batches(data) for r in b.records]


def produce(c: Cluster, topic: str, values: list[bytes], acks: str = "all") -> list[tuple[int, bytes]]:
    p = Producer({**c.rdkafka_conf(), "acks": acks, "linger.ms": 5, "message.timeout.ms": 60000})
    acked = []
    errors = []

    def cb(err, m):
        (errors if err else acked).append((m.offset(), m.value()) if not err else err)

    for v in values:
        p.produce(topic, value=v, on_delivery=cb)
        p.poll(0)
    p.flush(90)
    return acked


def consume_all(c: Cluster, topic: str, partitions: int = 1, timeout: float = 30) -> list[tuple[int, bytes]]:
    cons = Consumer({**c.rdkafka_conf(), "group.id": "check", "enable.auto.commit": False,
                     "enable.partition.eof": True})
    cons.assign([TopicPartition(topic, i, 0) for i in range(partitions)])
    got, eof = [], set()
    deadline = time.time() + timeout
    while len(eof) < partitions and time.time() < deadline:
        for m in cons.consume(1000, 0.5):
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    eof.add(m.partition())
                continue
            got.append((m.offset(), m.value()))
    cons.close()
    return got


def test_followers_hold_identical_logs(cluster):
    create(cluster, "same", **{"min.insync.replicas": "2"})
    acked = produce(cluster, "same", [b"v%d" % i for i in range(5000)])
    assert len(acked) == 5000
    leader_view = wait_for(lambda: disk_records(cluster, 1, "same") if len(disk_records(cluster, 1, "same")) == 5000 else None)
    for b in (2, 3):
        assert wait_for(lambda b=b: disk_records(cluster, b, "same") == leader_view, what=f"broker {b} to catch up")
    assert sorted(o for o, _ in acked) == list(range(5000))


def test_a_partition_behind_moves_to_the_catch_up_lane_and_back(cluster):
    """Megabyte fetches move a partition to the follower's catch-up lane (its own connection),
    and a second of quiet moves it back to the tail lane; the replicas stay identical through
    the moves, and a quiet partition's acks=all writes meanwhile are acknowledged."""
    create(cluster, "big", **{"min.insync.replicas": "3"})
    create(cluster, "quiet", **{"min.insync.replicas": "3"})
    acked = produce(cluster, "big", [bytes([i % 256]) * 10_000 for i in range(500)])  # 5 MB
    assert len(acked) == 500
    assert len(produce(cluster, "quiet", [b"q%d" % i for i in range(20)])) == 20
    leader = partition_state(AdminClient({"bootstrap.servers": cluster.bootstrap}), "big")[0]
    followers = [b for b in (1, 2, 3) if b != leader]

    def lanes(b: int, topic: str) -> list[str]:
        text = cluster.log_path(b).read_text()
        return [ln.split("lane='")[1].split("'")[0] for ln in text.splitlines()
                if "replica_fetch_lane" in ln and f"topic='{topic}'" in ln]

    for b in followers:
        wait_for(lambda b=b: lanes(b, "big")[-1:] == ["tail"] and "catch-up" in lanes(b, "big"),
                 what=f"broker {b} to move big-0 to the catch-up lane and back")
        assert "catch-up" not in lanes(b, "quiet")
    view = disk_records(cluster, leader, "big")
    assert len(view) == 500
    for b in followers:
        assert wait_for(lambda b=b: disk_records(cluster, b, "big") == view, what=f"broker {b} to match the leader")


def test_leader_kill_elects_from_isr_and_restarted_broker_rejoins(cluster):
    a = create(cluster, "ha", **{"min.insync.replicas": "2"})
    first = produce(cluster, "ha", [b"a%d" % i for i in range(2000)])
    assert len(first) == 2000
    leader, isr, _ = partition_state(a, "ha")
    assert isr == [1, 2, 3]
    cluster.kill(leader)
    new_leader = wait_for(lambda: (s := partition_state(a, "ha"))[0] not in (leader, -1) and s[0], what="a new leader")
    assert new_leader != leader
    second = produce(cluster, "ha", [b"b%d" % i for i in range(2000)])
    assert len(second) == 2000
    cluster.start_node(leader)
    wait_for(lambda: partition_state(a, "ha")[1] == [1, 2, 3], timeout=60, what="the restarted broker to rejoin the ISR")
    got = consume_all(cluster, "ha")
    values = [v for _, v in got]
    for _, v in first + second:
        assert values.count(v) == 1
    assert [o for o, _ in got] == list(range(len(got)))  # contiguous offsets
    assert wait_for(lambda: disk_records(cluster, leader, "ha") == disk_records(cluster, new_leader, "ha"), timeout=30)


def test_replica_with_unreplicated_writes_truncates_to_new_leader(cluster):
    # unclean election is what lets a replica without the leader's last writes take over
    a = create(cluster, "div", rf=3, **{"unclean.leader.election.enable": "true"})
    produce(cluster, "div", [b"common%d" % i for i in range(100)])
    leader, _, replicas = partition_state(a, "div")
    followers = [b for b in replicas if b != leader]
    wait_for(lambda: all(len(disk_records(cluster, b, "div")) == 100 for b in followers), what="followers")
    # partition the followers away; the leader, alone in the ISR, takes acks=1 writes they never see
    for b in followers:
        cluster.kill(b)
    wait_for(lambda: partition_state(a, "div")[1] == [leader], what="ISR to shrink to the leader")
    lost = produce(cluster, "div", [b"lost%d" % i for i in range(50)], acks="1")
    assert len(lost) == 50 and len(disk_records(cluster, leader, "div")) == 150
    cluster.kill(leader)
    for b in followers:
        cluster.start_node(b)
    new_leader = wait_for(lambda: (s := partition_state(a, "div"))[0] in followers and s[0], what="new leader")
    kept = produce(cluster, "div", [b"after%d" % i for i in range(30)])
    assert len(kept) == 30
    cluster.start_node(leader)
    # the old leader comes back as a follower, drops its 50 unreplicated records, copies the new ones
    wait_for(lambda: disk_records(cluster, leader, "div") == disk_records(cluster, new_leader, "div"), timeout=60,
             what="the old leader to match the new leader")
    values = [v for _, v in disk_records(cluster, leader, "div")]
    assert not any(v.startswith(b"lost") for v in values)
    assert values[:100] == [b"common%d" % i for i in range(100)] and values[100:] == [b"after%d" % i for i in range(30)]
    assert "follower_truncated" in cluster.log_path(leader).read_text()


def _idempotent_batch(pid: int, epoch: int, seq: int) -> bytes:
    return encode_batch([Record(value=b"i%d" % seq, timestamp=int(time.time() * 1000))],
                        producer_id=pid, producer_epoch=epoch, base_sequence=seq)


def _produce_one(topic: str, records: bytes) -> ProduceRequest:
    R = ProduceRequest
    return R(acks=-1, timeout_ms=30000,
             topic_data=[R.TopicProduceData(name=topic, partition_data=[R.PartitionProduceData(index=0, records=records)])])


def test_isr_shrinks_and_expands_and_min_isr_is_enforced(cluster):
    a = create(cluster, "isr", **{"min.insync.replicas": "2"})
    produce(cluster, "isr", [b"x"] * 10)
    leader, _, replicas = partition_state(a, "isr")
    followers = [b for b in replicas if b != leader]

    async def first_write() -> tuple[int, int, int]:
        async with NodeClient("127.0.0.1", cluster.broker_port(leader)) as cl:
            init = await cl.request(InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=60000))
            r = await cl.request(_produce_one("isr", _idempotent_batch(init.producer_id, init.producer_epoch, 0)))
            pr = r.responses[0].partition_responses[0]
            assert pr.error_code == 0
            return init.producer_id, init.producer_epoch, pr.base_offset

    pid, epoch, first_offset = asyncio.run(first_write())

    async def retried_while_short() -> None:
        # The retry of a written batch (its answer lost) waits for the ISR and gets its first
        # offset; a new batch is refused outright. Kafka refuses both, which lets librdkafka
        # re-send the written one under a bumped epoch.
        async with NodeClient("127.0.0.1", cluster.broker_port(leader)) as cl:
            retry = asyncio.ensure_future(cl.request(_produce_one("isr", _idempotent_batch(pid, epoch, 0))))
            new = await cl.request(_produce_one("isr", _idempotent_batch(pid, epoch, 1)))
            assert new.responses[0].partition_responses[0].error_code == 19  # NOT_ENOUGH_REPLICAS
            await asyncio.sleep(0.5)
            assert not retry.done()
            for b in followers:
                os.kill(cluster.pid(b), signal.SIGCONT)
            pr = (await asyncio.wait_for(retry, 30)).responses[0].partition_responses[0]
            assert (pr.error_code, pr.base_offset) == (0, first_offset)

    for b in followers:
        os.kill(cluster.pid(b), signal.SIGSTOP)
    try:
        wait_for(lambda: isr_at(cluster, leader, "isr") == [leader], timeout=30, what="ISR to shrink to the leader")
        only_leader = f"127.0.0.1:{cluster.broker_port(leader)}"
        p = Producer({"bootstrap.servers": only_leader, "acks": "all", "message.timeout.ms": 3000, "retries": 0,
                      "topic.metadata.refresh.interval.ms": 600000})
        errs = []
        p.produce("isr", value=b"y", on_delivery=lambda e, m: errs.append(e))
        p.flush(10)
        assert errs and errs[0] is not None and errs[0].code() == KafkaError.NOT_ENOUGH_REPLICAS
        asyncio.run(retried_while_short())
    finally:
        for b in followers:
            os.kill(cluster.pid(b), signal.SIGCONT)
    wait_for(lambda: partition_state(a, "isr")[1] == sorted(replicas), timeout=30, what="ISR to expand again")
    assert len(produce(cluster, "isr", [b"z"] * 10)) == 10
    assert [v for _, v in consume_all(cluster, "isr")].count(b"i0") == 1


def test_data_survives_any_one_broker_kill(cluster):
    a = create(cluster, "many", partitions=6, **{"min.insync.replicas": "2"})
    acked = produce(cluster, "many", [b"m%d" % i for i in range(6000)])
    assert len(acked) == 6000
    for victim in (1, 2, 3):
        cluster.kill(victim)
        wait_for(lambda v=victim: all(partition_state(a, "many", p)[0] not in (v, -1) for p in range(6)),
                 what="leaders move")
        got = consume_all(cluster, "many", partitions=6)
        assert sorted(v for _, v in got) == sorted(v for _, v in acked)
        cluster.start_node(victim)
        wait_for(lambda: all(len(partition_state(a, "many", p)[1]) == 3 for p in range(6)), timeout=60, what="ISR full")


def test_disk_records_helper_sees_a_real_log(cluster):
    create(cluster, "h", rf=1)
    produce(cluster, "h", [b"one", b"two"])
    owners = [b for b in (1, 2, 3) if list(Path(cluster.node_dir(b)).glob("logs-*/h-0-0"))]
    assert len(owners) == 1
    assert [v for _, v in disk_records(cluster, owners[0], "h")] == [b"one", b"two"]


def test_follower_of_an_epoch_without_records_rejoins_after_leadership_comes_back(cluster):
    # An idle partition (as most of __transaction_state is) changes leader twice without a
    # write: broker 2 leads epoch 1 and writes nothing, so broker 1 never learns that epoch;
    # broker 1 leads again at epoch 2 and broker 2 follows with its last epoch 1. The leader
    # answers a diverging epoch ending at broker 2's log end: nothing to truncate, but broker 2
    # must drop its empty epoch entry (as Kafka's UnifiedLog.truncateTo does), or it asks the
    # same question forever and never rejoins the ISR.
    from confluent_kafka import ElectionType

    a = AdminClient(cluster.rdkafka_conf())
    a.create_topics([NewTopic("idle", num_partitions=1, replica_assignment=[[1, 2]])])["idle"].result(30)
    assert len(produce(cluster, "idle", [b"a%d" % i for i in range(10)])) == 10
    wait_for(lambda: len(disk_records(cluster, 2, "idle")) == 10, what="broker 2 to copy the first records")
    cluster.kill(1)
    wait_for(lambda: isr_at(cluster, 2, "idle") == [2], what="broker 2 to lead alone")
    cluster.start_node(1)
    wait_for(lambda: partition_state(a, "idle")[1] == [1, 2], what="broker 1 to rejoin the ISR")
    a.elect_leaders(ElectionType.PREFERRED, [TopicPartition("idle", 0)]).result(30)
    wait_for(lambda: partition_state(a, "idle")[0] == 1, what="broker 1 to lead again")
    assert len(produce(cluster, "idle", [b"b%d" % i for i in range(10)], acks="1")) == 10
    wait_for(lambda: len(disk_records(cluster, 2, "idle")) == 20, timeout=20, what="broker 2 to copy the new records")
    wait_for(lambda: partition_state(a, "idle")[1] == [1, 2], what="broker 2 in the ISR")
