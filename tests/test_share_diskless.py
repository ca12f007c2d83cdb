"""Share groups (KIP-932) on a diskless topic (KIP-1164), with librdkafka's ShareConsumer against a
3-broker cluster in 3 racks (local directory object store). Each member names its rack in its
client id, so Metadata sends it to that rack's broker as the partition's leader; the partition's
share-partition lives on the leader the metadata image names (broker 3, the first replica), which
no member talks to: brokers 1 and 2 serve the share sessions, read the records themselves and
forward acquisitions and acknowledgements to broker 3 (SharePartitionForward).
- two members of one group, through brokers 1 and 2, read a 1-partition diskless topic: each gets
  records, every record is delivered once and accepted once, nothing comes back later;
- kill -9 of the holder: the controller moves the partition's leader, the new holder reads the
  state from __share_group_state, accepted records never come back and held ones do; the killed
  broker, restarted, is back in the partition's ISR (a diskless replica has nothing to catch up).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator

import pytest

from tests.conftest import FAST_FENCING, wait_for
from tests.test_metrics import scrape, value
from tests.test_share_groups import (
    _coordinator_answer,
    _members,
    held_records_come_back,
    produce,
    read_from_earliest,
    records,
)
from tools.cluster import Cluster

pytestmark = pytest.mark.slow
RACKS = {1: "r1", 2: "r2", 3: "r3"}
HOLDER = 3
LOCK_MS = 3000
BROKER = {
    "offsets.topic.num.partitions": 1,
    "share.coordinator.state.topic.num.partitions": 1,
    "diskless.metadata.topic.num.partitions": 1,
    "diskless.wal.max.ms": 20,
    "group.share.heartbeat.interval.ms": 500,
    "group.share.record.lock.duration.ms": LOCK_MS,
    "metrics.listener": "http://127.0.0.1:0",
    **FAST_FENCING,
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    base = tmp_path_factory.mktemp("kip932-diskless")
    c = Cluster(base, brokers=3, verbose=False,
                broker_overrides={**BROKER, "diskless.storage.url": f"file://{base / 'objects'}"},
                controller_overrides={"diskless.metadata.topic.num.partitions": 1, **FAST_FENCING},
                per_broker_overrides={b: {"broker.rack": r} for b, r in RACKS.items()})
    try:
        c.start(timeout=90)
        yield c
    finally:
        c.stop()


def create_diskless_topic(c: Cluster, name: str) -> None:
    """One partition, broker 3 its first replica: the image's leader, holding the share-partition."""
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": c.bootstrap})
    admin.create_topics([NewTopic(name, 1, replica_assignment=[[HOLDER, 1, 2]], config={"diskless.enable": "true"})],
                        operation_timeout=30)[name].result(30)


def member(c: Cluster, group: str, topic: str, via: int, explicit: bool = False):
    """A ShareConsumer whose client id names broker `via`'s rack: Metadata names that broker leader."""
    from confluent_kafka import ShareConsumer
    conf = {"bootstrap.servers": c.bootstrap, "group.id": group, "client.id": f"m{via}-diskless_az={RACKS[via]}"}
    if explicit:
        conf["share.acknowledgement.mode"] = "explicit"
    sc = ShareConsumer(conf)
    sc.subscribe([topic])
    return sc


def image_partition(c: Cluster, broker: int, topic: str) -> tuple[int, list[int]]:
    """(leader, ISR) of partition 0 in `broker`'s metadata image (DescribeTopicPartitions names
    them as they are; Metadata names each client its gateway)."""
    import asyncio

    from node.client import NodeClient
    from protocol.generated.describe_topic_partitions import DescribeTopicPartitionsRequest as D

    async def ask() -> tuple[int, list[int]]:
        async with NodeClient(c.host, c.broker_port(broker)) as nc:
            resp = await nc.request(D(topics=[D.TopicRequest(name=topic)], response_partition_limit=10))
        p = resp.topics[0].partitions[0]
        return p.leader_id, sorted(p.isr_nodes)

    return asyncio.run(ask())


def requests(c: Cluster, broker: int, api: str) -> float:
    return value(scrape(c.metrics_url(broker)), "kafka_network_requestmetrics_requests_total", request=api)


def test_two_members_through_two_brokers_share_one_diskless_partition(cluster: Cluster) -> None:
    topic, group, n = "dl-share-two", "dl-share-two-g", 600
    create_diskless_topic(cluster, topic)
    deliveries: dict[int, Counter] = {1: Counter(), 2: Counter()}
    counts: Counter = Counter()
    stop = threading.Event()
    errors: list[BaseException] = []

    def run(via: int) -> None:
        sc = member(cluster, group, topic, via)
        try:
            while not stop.is_set():
                for m in records(sc.poll(0.3)):  # implicit mode: the next poll accepts them
                    deliveries[via][m.value()] += 1
                    counts[m.delivery_count()] += 1
                    time.sleep(0.002)  # a slow worker, so both members get a share
            sc.commit_sync(30)
        except BaseException as e:  # noqa: BLE001 - reported by the test thread
            errors.append(e)
        finally:
            sc.close()

    threads = [threading.Thread(target=run, args=(via,)) for via in (1, 2)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: _members(cluster, group) == 2, timeout=30, what="both members in the group")
        time.sleep(0.5)  # their first ShareFetch started the share-partition (at the log end: latest)
        # records arrive while both read, as on a live queue
        values = produce(cluster, topic, n, chunk=50, pause=0.02)
        wait_for(lambda: len(set(deliveries[1]) | set(deliveries[2])) >= n, timeout=60,
                 what="both members to read every record")
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert not errors, errors
    assert all(deliveries.values()), f"each member gets records: {[sum(d.values()) for d in deliveries.values()]}"
    total = deliveries[1] + deliveries[2]
    assert set(total) == set(values)
    assert max(total.values()) == 1, "a record was delivered twice"
    assert set(counts) == {1}, f"a record was delivered again: {counts}"
    # the members talked to brokers 1 and 2, which forwarded to the holder; nobody fetched from it
    assert requests(cluster, 1, "ShareFetch") and requests(cluster, 2, "ShareFetch")
    assert not requests(cluster, HOLDER, "ShareFetch")
    assert requests(cluster, HOLDER, "SharePartitionForward")
    # no lag left (KIP-1226): the high watermark read by the group's coordinator, whichever it is
    from protocol.generated.describe_share_group_offsets import DescribeShareGroupOffsetsRequest as D
    p = _coordinator_answer(cluster, D(groups=[D.DescribeShareGroupOffsetsRequestGroup(group_id=group, topics=None)]),
                            1).groups[0].topics[0].partitions[0]
    assert (p.error_code, p.start_offset, p.lag) == (0, n, 0), p
    # every record was accepted: a new member gets nothing, past the lock duration too
    sc = member(cluster, group, topic, 2)
    try:
        late: list = []
        deadline = time.time() + LOCK_MS / 1000 + 1
        while time.time() < deadline:
            late += records(sc.poll(0.5))
        assert not late, f"{len(late)} accepted records came back"
    finally:
        sc.close()


def test_read_committed_through_a_forwarding_broker(cluster: Cluster) -> None:
    """share.isolation.level=read_committed on a diskless topic, read through broker 1: it reads
    the aborted transaction's batches itself and tells the holder to archive them unseen."""
    from confluent_kafka import Producer
    topic, group = "dl-share-txn", "dl-share-txn-g"
    create_diskless_topic(cluster, topic)
    p = Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": "dl-share-txn-p"})
    p.init_transactions(30)
    for outcome in ("abort", "commit", "abort", "commit"):
        p.begin_transaction()
        for i in range(5):
            p.produce(topic, value=f"{outcome}-{i}".encode())
        p.flush(30)
        (p.abort_transaction if outcome == "abort" else p.commit_transaction)(30)
    read_from_earliest(cluster, group, share_isolation_level="read_committed")
    sc = member(cluster, group, topic, 1)
    try:
        got: list = []
        deadline = time.time() + 20
        while time.time() < deadline and len(got) < 10:
            got += records(sc.poll(0.5))
        got += records(sc.poll(0.5))
        assert sorted(m.value() for m in got) == sorted([f"commit-{i}".encode() for i in range(5)] * 2), got
        sc.commit_sync(30)
    finally:
        sc.close()


def test_kill_holder_keeps_accepted_records_accepted(cluster: Cluster) -> None:
    from confluent_kafka import AcknowledgeType
    topic, group = "dl-share-kill", "dl-share-kill-g"
    create_diskless_topic(cluster, topic)
    read_from_earliest(cluster, group)
    produce(cluster, topic, 10)
    a = member(cluster, group, topic, 2, explicit=True)
    try:
        got = wait_for(lambda: records(a.poll(1.0)), timeout=60, what="the first records")
        offsets = sorted(m.offset() for m in got)
        accepted, held = offsets[: len(offsets) // 2], offsets[len(offsets) // 2:]
        assert accepted and held
        for m in got:
            if m.offset() in accepted:
                a.acknowledge(m, AcknowledgeType.ACCEPT)
        results = a.commit_sync(30)
        assert all(e is None for e in results.values()), results
        cluster.kill(HOLDER)
        # a member through broker 2 again, which now forwards to the new holder (broker 1)
        held_records_come_back(member(cluster, group, topic, 2, explicit=True), accepted, held)
    finally:
        a.close()
    assert image_partition(cluster, 2, topic) == (1, [1, 2])
    # the holder's broker back: in the diskless partition's ISR again, so the leader (and the
    # share-partition with it) can move to it after the next failure
    cluster.start_node(HOLDER)
    wait_for(lambda: image_partition(cluster, 2, topic) == (1, [1, 2, 3]), timeout=30, what="broker 3 in the ISR")
