"""read_committed on a real 3-broker cluster (topic RF 3), without a transaction coordinator in the
loop: transactional batches are built by hand (producer ids from InitProducerId), produced with
NodeClient, and ended with WriteTxnMarkers sent to the leader. aiokafka, kafka-python and
confluent-kafka consumers then see committed data once and aborted data never under
read_committed, everything under read_uncommitted, and nothing past an open transaction until its
marker; ListOffsets latest answers the LSO under read_committed. Compacted topics refuse null keys."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as AioTP
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka import TopicPartition as CkTP
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer
from kafka import TopicPartition as KpTP

from node.client import NodeClient
from protocol.generated.fetch import FetchRequest
from protocol.generated.init_producer_id import InitProducerIdRequest
from protocol.generated.list_offsets import ListOffsetsRequest
from protocol.generated.produce import ProduceRequest
from protocol.generated.write_txn_markers import WriteTxnMarkersRequest
from protocol.records import Record, encode_batch
from tools.cluster import Cluster

pytestmark = pytest.mark.slow

TOPIC = "rc"
COMMITTED = [b"c-%d" % i for i in range(4)]
ABORTED = [b"a-%d" % i for i in range(4)]
OPEN = [b"o-%d" % i for i in range(3)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("read-committed"), brokers=3, verbose=False)
    c.start()
    yield c
    c.stop()


def run(coro):
    return asyncio.run(coro)


def leader_of(admin: AdminClient, topic: str) -> int:
    deadline = time.time() + 30
    while time.time() < deadline:
        md = admin.list_topics(topic, timeout=10).topics[topic].partitions.get(0)
        if md is not None and md.leader > 0 and len(md.isrs) == len(md.replicas):
            return md.leader
        time.sleep(0.2)
    raise AssertionError(f"{topic}-0 has no leader with a full ISR")


def txn_batch(pid: int, seq: int, values: list[bytes]) -> bytes:
    now = int(time.time() * 1000)
    return encode_batch([Record(value=v, key=b"k", timestamp=now) for v in values], producer_id=pid,
                        producer_epoch=0, base_sequence=seq, transactional=True)


def plain_batch(values: list[bytes]) -> bytes:
    now = int(time.time() * 1000)
    return encode_batch([Record(value=v, key=b"k", timestamp=now) for v in values])


async def produce(cl: NodeClient, records: bytes, topic: str = TOPIC):
    R = ProduceRequest
    resp = await cl.request(R(acks=-1, timeout_ms=30000, topic_data=[
        R.TopicProduceData(name=topic, partition_data=[R.PartitionProduceData(index=0, records=records)])]))
    return resp.responses[0].partition_responses[0]


async def marker(cl: NodeClient, pid: int, commit: bool, version: int = 1, epoch: int = 0, coordinator_epoch: int = 0):
    W = WriteTxnMarkersRequest
    resp = await cl.request(W(markers=[W.WritableTxnMarker(
        producer_id=pid, producer_epoch=epoch, transaction_result=commit, coordinator_epoch=coordinator_epoch,
        topics=[W.WritableTxnMarkerTopic(name=TOPIC, partition_indexes=[0])])]), version)
    return resp.markers[0].topics[0].partitions[0].error_code


async def latest(cl: NodeClient, isolation: int) -> int:
    L = ListOffsetsRequest
    resp = await cl.request(L(replica_id=-1, isolation_level=isolation, topics=[
        L.ListOffsetsTopic(name=TOPIC, partitions=[L.ListOffsetsPartition(partition_index=0, timestamp=-1)])]), 5)
    return resp.topics[0].partitions[0].offset


async def raw_fetch(cl: NodeClient, isolation: int):
    F = FetchRequest
    resp = await cl.request(F(replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20, isolation_level=isolation,
                              topics=[F.FetchTopic(topic=TOPIC, partitions=[F.FetchPartition(
                                  partition=0, fetch_offset=0, partition_max_bytes=1 << 20)])]), 11)
    return resp.responses[0].partitions[0]


# ------------------------------------------------------------------------------------ consumers
def consume_aiokafka(c: Cluster, isolation: str, expect: int, settle: float = 1.5) -> list[bytes]:
    async def go():
        cons = AIOKafkaConsumer(bootstrap_servers=c.bootstrap, isolation_level=isolation, enable_auto_commit=False,
                                auto_offset_reset="earliest")
        await cons.start()
        try:
            cons.assign([AioTP(TOPIC, 0)])
            await cons.seek_to_beginning()
            got: list[bytes] = []
            deadline = time.time() + 20
            quiet_until = None
            while time.time() < deadline:
                batch = await cons.getmany(timeout_ms=300)
                for msgs in batch.values():
                    got += [m.value for m in msgs]
                if len(got) >= expect:
                    quiet_until = quiet_until or time.time() + settle
                    if time.time() >= quiet_until:
                        break
            return got
        finally:
            await cons.stop()

    return run(go())


def consume_kafka_python(c: Cluster, isolation: str, expect: int, settle: float = 1.5) -> list[bytes]:
    cons = KafkaConsumer(bootstrap_servers=c.bootstrap, isolation_level=isolation, enable_auto_commit=False,
                         auto_offset_reset="earliest")
    try:
        cons.assign([KpTP(TOPIC, 0)])
        cons.seek_to_beginning()
        got: list[bytes] = []
        deadline = time.time() + 20
        quiet_until = None
        while time.time() < deadline:
            for msgs in cons.poll(timeout_ms=300).values():
                got += [m.value for m in msgs]
            if len(got) >= expect:
                quiet_until = quiet_until or time.time() + settle
                if time.time() >= quiet_until:
                    break
        return got
    finally:
        cons.close()


def consume_confluent(c: Cluster, isolation: str, expect: int, settle: float = 1.5) -> list[bytes]:
    cons = Consumer({"bootstrap.servers": c.bootstrap, "group.id": f"rc-{isolation}-{time.time()}",
                     "isolation.level": isolation, "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        cons.assign([CkTP(TOPIC, 0, 0)])
        got: list[bytes] = []
        deadline = time.time() + 20
        quiet_until = None
        while time.time() < deadline:
            for m in cons.consume(100, 0.3):
                if m.error():
                    if m.error().code() == KafkaError._PARTITION_EOF:
                        continue
                    raise AssertionError(m.error())
                got.append(m.value())
            if len(got) >= expect:
                quiet_until = quiet_until or time.time() + settle
                if time.time() >= quiet_until:
                    break
        return got
    finally:
        cons.close()


CONSUMERS = {"aiokafka": consume_aiokafka, "kafka-python": consume_kafka_python, "confluent-kafka": consume_confluent}


# ---------------------------------------------------------------------------------------- test
def test_read_committed_hides_aborted_and_open_transactions(cluster):
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(TOPIC, 1, 3)])[TOPIC].result(30)
    leader = leader_of(admin, TOPIC)

    async def write_transactions():
        async with NodeClient(cluster.host, cluster.broker_port(leader), client_id="rc-test") as cl:
            pids = []
            for _ in range(3):
                r = await cl.request(InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=60000))
                assert r.error_code == 0
                pids.append(r.producer_id)
            committer, aborter, opener = pids
            assert (await produce(cl, plain_batch([b"before"]))).error_code == 0  # offset 0
            assert (await produce(cl, txn_batch(committer, 0, COMMITTED[:2]))).error_code == 0  # 1..2
            aborted = await produce(cl, txn_batch(aborter, 0, ABORTED[:2]))  # 3..4
            assert (await produce(cl, txn_batch(committer, 2, COMMITTED[2:]))).error_code == 0  # 5..6
            assert (await produce(cl, txn_batch(aborter, 2, ABORTED[2:]))).error_code == 0  # 7..8
            assert await marker(cl, committer, True) == 0  # 9
            assert await marker(cl, aborter, False, version=0) == 0  # 10
            assert (await produce(cl, plain_batch([b"after"]))).error_code == 0  # 11
            opened = await produce(cl, txn_batch(opener, 0, OPEN))  # 12..14
            assert (await produce(cl, plain_batch([b"tail"]))).error_code == 0  # 15
            # A non-transactional write from a producer inside its transaction: INVALID_TXN_STATE.
            idem = encode_batch([Record(value=b"x", key=b"k")], producer_id=opener, producer_epoch=0, base_sequence=3)
            assert (await produce(cl, idem)).error_code == 48
            # Markers without an open transaction are written and change nothing; stale ones are fenced.
            assert await marker(cl, committer, True) == 0
            assert await marker(cl, aborter, False, epoch=1, coordinator_epoch=5) == 0
            assert await marker(cl, aborter, False, epoch=0, coordinator_epoch=5) == 47  # INVALID_PRODUCER_EPOCH
            assert await marker(cl, aborter, False, epoch=1, coordinator_epoch=4) == 52  # TRANSACTION_COORDINATOR_FENCED
            lso_rc = await latest(cl, 1)
            hw = await latest(cl, 0)
            rc = await raw_fetch(cl, 1)
            ru = await raw_fetch(cl, 0)
            return aborter, opener, aborted.base_offset, opened.base_offset, lso_rc, hw, rc, ru

    aborter, opener, aborted_first, open_first, lso_rc, hw, rc, ru = run(write_transactions())
    assert lso_rc == open_first == 12 and hw > open_first
    assert rc.last_stable_offset == ru.last_stable_offset == open_first and rc.high_watermark == hw
    assert [(a.producer_id, a.first_offset) for a in rc.aborted_transactions] == [(aborter, aborted_first)]
    assert ru.aborted_transactions is None

    visible = [b"before", *COMMITTED, b"after"]
    everything_before_tail = [b"before", *COMMITTED[:2], *ABORTED[:2], *COMMITTED[2:], *ABORTED[2:], b"after", *OPEN]
    for name, consume in CONSUMERS.items():
        got = consume(cluster, "read_committed", len(visible))
        assert got == visible, (name, got)  # committed once, aborted never, nothing past the open one
        uncommitted = consume(cluster, "read_uncommitted", len(everything_before_tail) + 1, settle=0.5)
        assert uncommitted == [*everything_before_tail, b"tail"], (name, uncommitted)

    async def commit_the_open_one():
        async with NodeClient(cluster.host, cluster.broker_port(leader), client_id="rc-test") as cl:
            assert await marker(cl, opener, True) == 0
            return await latest(cl, 1), await latest(cl, 0)

    lso_after, hw_after = run(commit_the_open_one())
    assert lso_after == hw_after
    for name, consume in CONSUMERS.items():
        got = consume(cluster, "read_committed", len(visible) + len(OPEN) + 1, settle=0.5)
        assert got == [b"before", *COMMITTED, b"after", *OPEN, b"tail"], (name, got)


def test_a_long_poll_wakes_when_the_marker_moves_the_lso(cluster):
    topic_admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    topic = "rc-wake"
    topic_admin.create_topics([NewTopic(topic, 1, 3)])[topic].result(30)
    leader = leader_of(topic_admin, topic)

    async def go():
        async with NodeClient(cluster.host, cluster.broker_port(leader), client_id="rc-wake") as cl:
            pid = (await cl.request(InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=60000))).producer_id
            assert (await produce(cl, txn_batch(pid, 0, [b"w-0", b"w-1"]), topic)).error_code == 0
            F = FetchRequest
            waiting = asyncio.ensure_future(cl.request(F(
                replica_id=-1, max_wait_ms=10000, min_bytes=1, max_bytes=1 << 20, isolation_level=1,
                topics=[F.FetchTopic(topic=topic, partitions=[F.FetchPartition(
                    partition=0, fetch_offset=0, partition_max_bytes=1 << 20)])]), 11))
            await asyncio.sleep(0.5)
            assert not waiting.done()  # blocked at the LSO (0)
            W = WriteTxnMarkersRequest
            started = time.monotonic()
            # the markers come on their own connection, as from a transaction coordinator: a
            # connection's requests are served one at a time (Kafka's muting), so on `cl` they
            # would wait for the long poll
            async with NodeClient(cluster.host, cluster.broker_port(leader), client_id="rc-coordinator") as co:
                resp = await co.request(W(markers=[W.WritableTxnMarker(
                    producer_id=pid, producer_epoch=0, transaction_result=True, coordinator_epoch=0,
                    topics=[W.WritableTxnMarkerTopic(name=topic, partition_indexes=[0])])]), 1)
            assert resp.markers[0].topics[0].partitions[0].error_code == 0
            fetched = (await waiting).responses[0].partitions[0]
            return fetched, time.monotonic() - started

    fetched, waited = run(go())
    assert waited < 5 and fetched.records and fetched.last_stable_offset == 3


def test_compacted_topics_refuse_records_without_a_key(cluster):
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    topic = "rc-compacted"
    admin.create_topics([NewTopic(topic, 1, 1, config={"cleanup.policy": "compact"})])[topic].result(30)
    leader_of(admin, topic)
    p = Producer({"bootstrap.servers": cluster.bootstrap, "enable.idempotence": False, "retries": 0})
    errors = []
    p.produce(topic, value=b"keyless", on_delivery=lambda err, msg: errors.append(err))
    p.flush(30)  # its own batch: a batch holding a keyless record is refused whole, as by Kafka
    p.produce(topic, key=b"k", value=b"keyed", on_delivery=lambda err, msg: errors.append(err))
    p.flush(30)
    assert len(errors) == 2
    assert errors[0] is not None and errors[0].code() == KafkaError.INVALID_RECORD, errors
    assert errors[1] is None

    async def raw():
        async with NodeClient(cluster.host, cluster.broker_port(leader_of(admin, topic)), client_id="rc-keys") as cl:
            batch = encode_batch([Record(value=b"v", key=b"k"), Record(value=b"v2", key=None)], compression=1)
            return await produce(cl, batch, topic)

    pr = run(raw())
    assert pr.error_code == 87
    assert pr.error_message == f"Compacted topic cannot accept message without key in topic partition {topic}-0."
    assert [(e.batch_index, e.batch_index_error_message) for e in pr.record_errors] == [(1, pr.error_message)]
