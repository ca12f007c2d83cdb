"""The chunk data plane on a real 1-controller, 3-broker cluster: the chunks proposal's three tests
(non-transactional, transactional with read_committed, AlterChunkAssignments moving the first
chunk), each asserting from the brokers' logs which broker served which read, with each client
(librdkafka, kafka-python, aiokafka) and Fetch below v11 (the leader reads for the client);
ListOffsets across chunks.

Broker ids here are 1..3 (the chunks proposal's 0, 1, 2 are our 1, 2, 3).
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer

from metadata.read_replicas import hash_order
from node.client import NodeClient
from protocol.errors import Errors
from protocol.generated.alter_chunk_assignments import AlterChunkAssignmentsRequest
from protocol.generated.create_chunks import CreateChunksRequest
from protocol.generated.create_topics import CreateTopicsRequest
from protocol.generated.fetch import FetchRequest
from protocol.generated.list_offsets import ListOffsetsRequest
from protocol.generated.metadata import MetadataRequest
from protocol.records import decode_batches
from tests.conftest import wait_for
from tools.cluster import Cluster

HOST = "127.0.0.1"
FAST = {
    "broker.session.timeout.ms": "3000",
    "broker.heartbeat.interval.ms": "500",
    "replica.lag.time.max.ms": "3000",
}


# ---------------------------------------------------------------- helpers (the acceptance tests use them too)
def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def request(port: int, body: Any, version: int | None = None, security: Any = None) -> Any:
    async with NodeClient(HOST, port, client_id="test-chunks-data", security=security) as cl:
        return await cl.request(body, version)


def create_topic(c: Cluster, name: str, replicas: list[int], **configs: str) -> None:
    CT = CreateTopicsRequest
    t = CT.CreatableTopic(
        name=name, num_partitions=-1, replication_factor=-1,
        assignments=[CT.CreatableReplicaAssignment(0, replicas)],
        configs=[CT.CreatableTopicConfig(name=k, value=v) for k, v in configs.items()],
    )
    resp = run(request(c.broker_port(replicas[0]), CT(topics=[t], timeout_ms=10000), security=c.client_security()))
    assert resp.topics[0].error_code == 0, resp.topics[0]


def partition_md(c: Cluster, broker: int, topic: str) -> Any:
    resp = run(request(c.broker_port(broker), MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=topic)]),
                       security=c.client_security()))
    [t] = resp.topics
    assert t.error_code == 0, t
    return t.partitions[0]



def produce(c: Cluster, topic: str, values: list[bytes], timestamps: list[int] | None = None, **conf: Any) -> list[int]:
    p = Producer({**c.rdkafka_conf(), "acks": "all", "linger.ms": 5, "message.timeout.ms": 30000, **conf})
    offsets: list[int] = []
    errors: list[Any] = []

    def done(err: Any, msg: Any) -> None:
        if err:
            errors.append(err)
        else:
            offsets.append(msg.offset())

    for i, v in enumerate(values):
        p.produce(topic, v, partition=0, on_delivery=done, timestamp=timestamps[i] if timestamps else 0)
    assert p.flush(30) == 0
    assert not errors, errors
    return sorted(offsets)


def create_chunk(c: Cluster, topic: str, brokers: list[int], timeout: float = 20.0) -> Any:
    """CreateChunks to the active chunk's leader (as kafka-chunks.sh does); waits until every
    broker's metadata shows the new active chunk led by brokers[0]."""
    before = partition_md(c, 1, topic)
    e = CreateChunksRequest.CreateChunksTopicPartition(
        topic_name=topic, partition_id=0, broker_ids=brokers, start_offset=-1, start_timestamp=-1,
        prev_stop_offset=-1, prev_end_offset=-1)
    [r] = run(request(c.broker_port(before.leader_id), CreateChunksRequest(topic_partitions=[e]),
                      security=c.client_security())).results
    assert r.error_code == 0, r

    def moved() -> bool:
        return all(
            (p := partition_md(c, b, topic)).leader_epoch > before.leader_epoch and p.leader_id == brokers[0]
            for b in c.broker_ids if c.is_running(b)
        )

    wait_for(moved, timeout, "the new chunk in every broker's metadata")
    return partition_md(c, brokers[0], topic)


def alter_chunk(c: Cluster, topic: str, start: int, brokers: list[int]) -> None:
    A = AlterChunkAssignmentsRequest
    e = A.AlterChunkAssignment(topic_name=topic, partition_id=0, start_offset=start, chunk_epoch=-1, broker_ids=brokers)
    [r] = run(request(c.broker_port(1), A(chunks=[e]), security=c.client_security())).results
    assert r.error_code == 0, r


def chunk_rows(p: Any) -> list[tuple]:
    return [(x.start_offset, x.stop_offset, x.end_offset, sorted(x.replica_nodes), sorted(x.isr_nodes)) for x in p.chunks]


class BrokerLogs:
    """Events the brokers logged since `mark()`: each node's log is a file (tools/cluster.py)."""

    def __init__(self, c: Cluster) -> None:
        self.c = c
        self.marks: dict[int, int] = {}

    def mark(self) -> BrokerLogs:
        self.marks = {b: self._size(b) for b in self.c.broker_ids}
        return self

    def _size(self, b: int) -> int:
        p = self.c.log_path(b)
        return p.stat().st_size if p.exists() else 0

    def events(self, b: int, event: str, **match: Any) -> list[dict[str, str]]:
        with open(self.c.log_path(b), "rb") as f:
            f.seek(self.marks.get(b, 0))
            text = f.read().decode(errors="replace")
        out = []
        for line in text.splitlines():
            if f"event='{event}'" not in line:
                continue
            fields = dict(re.findall(r"(\w+)=('[^']*'|\S+)", line))
            fields = {k: v.strip("'") for k, v in fields.items()}
            if all(fields.get(k) == str(v) for k, v in match.items()):
                out.append(fields)
        return out

    def served(self, event: str, **match: Any) -> dict[int, list[int]]:
        """broker id -> offsets it logged `event` for (chunk_read, chunk_proxy_read, ...)."""
        out: dict[int, list[int]] = {}
        for b in self.c.broker_ids:
            offs = [int(e["offset"]) for e in self.events(b, event, **match)]
            if offs:
                out[b] = offs
        return out


def chunk_dirs(c: Cluster, broker: int, topic: str) -> dict[int, Path]:
    """chunk start -> dir of every chunk replica of topic-0 on one broker."""
    out = {}
    for d in c.node_dir(broker).glob(f"logs-*/{topic}-0-*"):
        if d.is_dir() and d.name.rsplit("-", 1)[1].isdigit():
            out[int(d.name.rsplit("-", 1)[1])] = d
    return out


def disk_offsets(d: Path) -> list[int]:
    data = b"".join(f.read_bytes() for f in sorted(d.glob("*.log")))
    return [r.offset for b in decode_batches(data) if not b.header.is_control for r in b.records]


# ---------------------------------------------------------------- consumers, one per client
def consume_confluent(c: Cluster, topic: str, n: int, *, read_committed: bool = False,
                      timeout: float = 30.0, **conf: Any) -> list[list[tuple[int, bytes]]]:
    """Records of topic-0 from offset 0, grouped by the poll that returned them."""
    cons = Consumer({
        **c.rdkafka_conf(), "group.id": f"g-{uuid.uuid4().hex[:8]}", "client.id": "chunks-rdkafka",
        "auto.offset.reset": "earliest", "enable.auto.commit": False,
        "isolation.level": "read_committed" if read_committed else "read_uncommitted", **conf,
    })
    polls: list[list[tuple[int, bytes]]] = []
    try:
        cons.subscribe([topic])
        deadline = time.monotonic() + timeout
        while sum(map(len, polls)) < n and time.monotonic() < deadline:
            msgs = cons.consume(num_messages=n, timeout=1.0)
            got = [(m.offset(), m.value()) for m in msgs if not m.error()]
            if got:
                polls.append(got)
    finally:
        cons.close()
    return polls


def consume_kafka_python(c: Cluster, topic: str, n: int, *, read_committed: bool = False,
                         timeout: float = 30.0) -> list[list[tuple[int, bytes]]]:
    from kafka import KafkaConsumer, TopicPartition

    cons = KafkaConsumer(bootstrap_servers=c.bootstrap, client_id="chunks-kafka-python", auto_offset_reset="earliest",
                         enable_auto_commit=False, group_id=None,
                         isolation_level="read_committed" if read_committed else "read_uncommitted")
    polls: list[list[tuple[int, bytes]]] = []
    try:
        tp = TopicPartition(topic, 0)
        cons.assign([tp])
        cons.seek_to_beginning(tp)
        deadline = time.monotonic() + timeout
        while sum(map(len, polls)) < n and time.monotonic() < deadline:
            batch = cons.poll(timeout_ms=1000)
            got = [(r.offset, r.value) for recs in batch.values() for r in recs]
            if got:
                polls.append(got)
    finally:
        cons.close()
    return polls


def consume_aiokafka(c: Cluster, topic: str, n: int, *, read_committed: bool = False,
                     timeout: float = 30.0) -> list[list[tuple[int, bytes]]]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    async def go() -> list[list[tuple[int, bytes]]]:
        cons = AIOKafkaConsumer(bootstrap_servers=c.bootstrap, client_id="chunks-aiokafka",
                                auto_offset_reset="earliest", enable_auto_commit=False,
                                isolation_level="read_committed" if read_committed else "read_uncommitted")
        await cons.start()
        polls: list[list[tuple[int, bytes]]] = []
        try:
            tp = TopicPartition(topic, 0)
            cons.assign([tp])
            await cons.seek_to_beginning(tp)
            deadline = time.monotonic() + timeout
            while sum(map(len, polls)) < n and time.monotonic() < deadline:
                batch = await cons.getmany(timeout_ms=1000)
                got = [(r.offset, r.value) for recs in batch.values() for r in recs]
                if got:
                    polls.append(got)
        finally:
            await cons.stop()
        return polls

    return run(go())


CONSUMERS = {"rdkafka": consume_confluent, "kafka-python": consume_kafka_python, "aiokafka": consume_aiokafka}


def fetch_v(c: Cluster, broker: int, topic: str, offset: int, version: int) -> Any:
    F = FetchRequest
    req = F(replica_id=-1, max_wait_ms=100, min_bytes=1, max_bytes=1 << 20, isolation_level=0, session_id=0,
            session_epoch=-1, topics=[F.FetchTopic(topic=topic, partitions=[F.FetchPartition(
                partition=0, fetch_offset=offset, partition_max_bytes=1 << 20, current_leader_epoch=-1,
                last_fetched_epoch=-1, log_start_offset=-1)])], forgotten_topics_data=[], rack_id="")
    resp = run(request(c.broker_port(broker), req, version))
    return resp.responses[0].partitions[0]


def record_offsets(pd: Any) -> list[int]:
    data = b"".join(bytes(x) for x in pd.records) if isinstance(pd.records, list) else bytes(pd.records or b"")
    return [r.offset for b in decode_batches(data) for r in b.records]


# ---------------------------------------------------------------- the cluster
@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("chunks-data"), brokers=3, verbose=False, broker_overrides=FAST,
                controller_overrides={"broker.session.timeout.ms": "3000"})
    try:
        c.start()
        yield c
    finally:
        c.stop()


# ---------------------------------------------------------------- the chunks proposal's tests
@pytest.mark.parametrize("client", list(CONSUMERS))
def test_seed_non_transactional(cluster: Cluster, client: str) -> None:
    """Topic on broker 1, 10 messages, a chunk on broker 2, 10 more: the consumer reads the first
    10 from broker 1 (the old chunk's only replica) and the next 10 from broker 2."""
    c, topic = cluster, f"seed-nt-{client}"
    create_topic(c, topic, [1])
    assert produce(c, topic, [f"a{i}".encode() for i in range(10)]) == list(range(10))
    p = create_chunk(c, topic, [2])
    assert (p.start_offset, chunk_rows(p)) == (10, [(0, 9, 9, [1], [1])])
    assert produce(c, topic, [f"b{i}".encode() for i in range(10)]) == list(range(10, 20))
    logs = BrokerLogs(c).mark()

    polls = CONSUMERS[client](c, topic, 20)
    flat = [r for poll in polls for r in poll]
    assert flat == [(i, f"a{i}".encode()) for i in range(10)] + [(10 + i, f"b{i}".encode()) for i in range(10)]
    # each poll's records came from one chunk: the first 10, then the next 10 (librdkafka's
    # consume() hands over whatever both fetches queued, so only the Python clients show it)
    assert client == "rdkafka" or all(max(o for o, _ in poll) < 10 or min(o for o, _ in poll) >= 10 for poll in polls), polls

    # offsets 0..9 exist only on broker 1, 10..19 only on broker 2
    assert disk_offsets(chunk_dirs(c, 1, topic)[0]) == list(range(10)) and 10 not in chunk_dirs(c, 1, topic)
    assert disk_offsets(chunk_dirs(c, 2, topic)[10]) == list(range(10, 20)) and 0 not in chunk_dirs(c, 2, topic)
    # broker 1 served the old chunk: to the client itself (it followed the redirect) or to
    # broker 2 reading for it (proxy); broker 2 first redirected the client to broker 1
    direct = logs.served("chunk_read", topic=topic, client=f"chunks-{client}")
    proxied = logs.served("chunk_proxy_read", topic=topic)
    assert set(direct) | set(proxied) == ({1} if direct else {2}), (direct, proxied)
    assert 0 in direct.get(1, []) + proxied.get(2, [])
    assert logs.events(2, "chunk_redirect", topic=topic, offset=0, to=1)
    if direct:  # a client that follows the redirect is sent back to broker 2 at the chunk's end
        assert logs.events(1, "chunk_redirect", topic=topic, offset=10, to=2)


def test_clients_follow_the_redirect_when_they_can(cluster: Cluster) -> None:
    """aiokafka follows preferred_read_replica only with client_rack set; kafka-python only to a
    broker listed among the partition's (active chunk's) replicas. Given that, both read the old
    chunk from its replica themselves."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    c = cluster
    topic = "follow-rack"
    create_topic(c, topic, [1])
    produce(c, topic, [b"r%d" % i for i in range(10)])
    create_chunk(c, topic, [2])
    produce(c, topic, [b"s%d" % i for i in range(10)])
    logs = BrokerLogs(c).mark()

    async def aiokafka_with_rack() -> list[int]:
        cons = AIOKafkaConsumer(bootstrap_servers=c.bootstrap, client_id="chunks-aiokafka-rack", client_rack="rack-a",
                                auto_offset_reset="earliest", enable_auto_commit=False)
        await cons.start()
        try:
            tp = TopicPartition(topic, 0)
            cons.assign([tp])
            await cons.seek_to_beginning(tp)
            got: list[int] = []
            deadline = time.monotonic() + 30
            while len(got) < 20 and time.monotonic() < deadline:
                batch = await cons.getmany(timeout_ms=1000)
                got += [r.offset for recs in batch.values() for r in recs]
            return got
        finally:
            await cons.stop()

    assert run(aiokafka_with_rack()) == list(range(20))
    assert logs.served("chunk_read", topic=topic, client="chunks-aiokafka-rack") == {1: [0]}
    assert not logs.served("chunk_proxy_read", topic=topic)

    # kafka-python: the chunk's replica must be one of the partition's replicas. Chunk 0 on
    # [1, 3], the active chunk on [2, 1]; the name is picked so that the leader's hash choice
    # between 1 and 3 is broker 1.
    topic = next(f"follow-replica-{i}" for i in range(1000)
                 if hash_order([1, 3], f"follow-replica-{i}", 0, 0, "chunks-kafka-python")[0] == 1)
    create_topic(c, topic, [1, 3])
    produce(c, topic, [b"r%d" % i for i in range(10)])
    p = create_chunk(c, topic, [2, 1])
    assert list(p.chunks[0].isr_nodes) == [1, 3]
    produce(c, topic, [b"s%d" % i for i in range(10)])
    logs.mark()
    flat = [r for poll in consume_kafka_python(c, topic, 20) for r in poll]
    assert [o for o, _ in flat] == list(range(20))
    assert logs.served("chunk_read", topic=topic, client="chunks-kafka-python") == {1: [0]}
    assert not logs.served("chunk_proxy_read", topic=topic)
    # kafka-python forgets the preferred replica on any answer without one, so after each read
    # from broker 1 it asks the leader again (and is redirected again while in the old chunk)
    assert logs.events(2, "chunk_redirect", topic=topic, offset=0, to=1)


def test_a_consumer_reads_an_old_chunk_in_its_own_rack(cluster_factory) -> None:
    """Brokers in racks a, b, c; chunk 0 on [1, 3] (racks a and c), the active chunk on [2, 1]: the
    leader redirects a librdkafka consumer with client.rack to the chunk's replica in that rack,
    for either rack (Kafka's rack-aware replica selection), whatever the hash would pick."""
    c = cluster_factory(brokers=3, per_broker_overrides={
        1: {"broker.rack": "rack-a"}, 2: {"broker.rack": "rack-b"}, 3: {"broker.rack": "rack-c"}})
    topic = "chunks-rack"
    create_topic(c, topic, [1, 3])
    produce(c, topic, [b"r%d" % i for i in range(10)])
    p = create_chunk(c, topic, [2, 1])
    assert chunk_rows(p) == [(0, 9, 9, [1, 3], [1, 3])]
    produce(c, topic, [b"s%d" % i for i in range(10)])
    for rack, replica in (("rack-a", 1), ("rack-c", 3)):
        logs = BrokerLogs(c).mark()
        flat = [r for poll in consume_confluent(c, topic, 20, **{"client.rack": rack}) for r in poll]
        assert [o for o, _ in flat] == list(range(20)), rack
        assert logs.served("chunk_read", topic=topic, client="chunks-rdkafka") == {replica: [0]}, rack
        assert logs.events(2, "chunk_redirect", topic=topic, offset=0, to=replica), rack


def test_fetch_below_v11_is_read_by_the_leader(cluster: Cluster) -> None:
    """Fetch v10 has no preferred_read_replica: the active leader reads the old chunk for the
    client from the chunk's replica; v11+ is redirected; the replica serves its range itself and
    points onwards past it."""
    c, topic = cluster, "chunks-fetch-versions"
    create_topic(c, topic, [1])
    produce(c, topic, [b"x%d" % i for i in range(5)])
    create_chunk(c, topic, [3])
    produce(c, topic, [b"y%d" % i for i in range(5)])
    logs = BrokerLogs(c).mark()

    old = fetch_v(c, 3, topic, 0, 10)
    assert (old.error_code, record_offsets(old)[:1], old.high_watermark) == (0, [0], 10)
    assert logs.served("chunk_proxy_read", topic=topic) == {3: [0]}
    assert logs.served("chunk_read", topic=topic) == {1: [0]}  # broker 1 served broker 3's read

    moved = fetch_v(c, 3, topic, 2, 12)
    assert (moved.error_code, moved.preferred_read_replica, record_offsets(moved)) == (0, 1, [])
    direct = fetch_v(c, 1, topic, 2, 12)
    assert (direct.error_code, record_offsets(direct)[-1], direct.high_watermark) == (0, 4, 5)
    onwards = fetch_v(c, 1, topic, 5, 12)
    assert (onwards.error_code, onwards.preferred_read_replica) == (0, 3)
    assert fetch_v(c, 1, topic, 5, 10).error_code == Errors.NOT_LEADER_OR_FOLLOWER
    assert fetch_v(c, 2, topic, 0, 12).error_code == Errors.NOT_LEADER_OR_FOLLOWER  # holds nothing of it


def test_list_offsets_across_chunks(cluster: Cluster) -> None:
    c, topic = cluster, "chunks-list-offsets"
    create_topic(c, topic, [1])
    t0 = int(time.time() * 1000)
    produce(c, topic, [b"a"] * 3)
    create_chunk(c, topic, [2])
    time.sleep(0.05)
    t1 = int(time.time() * 1000)
    produce(c, topic, [b"b"] * 3, timestamps=[t1, t1 + 3_600_000, t1])  # 4: the largest timestamp
    create_chunk(c, topic, [3])
    produce(c, topic, [b"c"] * 3)
    L = ListOffsetsRequest

    def ask(ts: int, with_timestamp: bool = False) -> Any:
        req = L(replica_id=-1, isolation_level=0, topics=[L.ListOffsetsTopic(
            name=topic, partitions=[L.ListOffsetsPartition(partition_index=0, timestamp=ts, current_leader_epoch=-1)])])
        p = run(request(c.broker_port(3), req)).topics[0].partitions[0]
        assert p.error_code == 0
        return (p.offset, p.timestamp) if with_timestamp else p.offset

    assert (ask(-2), ask(-1)) == (0, 9)
    assert ask(-3, with_timestamp=True) == (4, t1 + 3_600_000)  # max timestamp: in the middle chunk
    assert ask(t0 - 1000) == 0  # before everything: the first chunk's first record
    assert ask(t1) == 3  # in the middle chunk, held by broker 2 only
    # timestamps need not grow across chunks: 4 (an hour ahead) is found before the newer chunk
    assert ask(t1 + 1_800_000, with_timestamp=True) == (4, t1 + 3_600_000)
    assert ask(int(time.time() * 1000) + 7_200_000) == -1


# ---------------------------------------------------------------- transactions
def test_seed_transactional(cluster: Cluster) -> None:
    """10 plain messages, then a transaction of 10 left open while a chunk is cut on broker 2,
    then committed: the open transaction is past the old chunk's stop offset (9) but inside its
    end (19), so broker 2 copies [10, 19] before it takes writes (the commit marker). A
    read_committed consumer reads 0..9 from broker 1 and 10..19 from broker 2."""
    c, topic = cluster, "seed-txn"
    create_topic(c, topic, [1])
    produce(c, topic, [f"plain{i}".encode() for i in range(10)])
    tp = Producer({**c.rdkafka_conf(), "transactional.id": f"txn-{uuid.uuid4().hex[:6]}",
                   "linger.ms": 5})
    tp.init_transactions(30)
    tp.begin_transaction()
    for i in range(10):
        tp.produce(topic, f"txn{i}".encode(), partition=0)
    assert tp.flush(30) == 0
    p = create_chunk(c, topic, [2])
    assert (p.start_offset, chunk_rows(p)) == (10, [(0, 9, 19, [1], [1])])
    tp.commit_transaction(30)
    logs = BrokerLogs(c).mark()

    polls = consume_confluent(c, topic, 20, read_committed=True)
    flat = [r for poll in polls for r in poll]
    assert flat == [(i, f"plain{i}".encode()) for i in range(10)] + [(10 + i, f"txn{i}".encode()) for i in range(10)]
    assert logs.served("chunk_read", topic=topic) == {1: [0]}
    # broker 2's chunk holds the copied transaction and its commit marker at 20
    assert disk_offsets(chunk_dirs(c, 2, topic)[10]) == list(range(10, 20))
    assert disk_offsets(chunk_dirs(c, 1, topic)[0]) == list(range(20))  # the old chunk's end is 19


# ---------------------------------------------------------------- moving an inactive chunk
def test_seed_alter_chunk_assignments(cluster: Cluster) -> None:
    """The first chunk moves from broker 1 to broker 3: broker 3 copies it, reports it caught
    up, broker 1 deletes its replica; a consumer reads the first 10 from broker 3 and the next
    10 from broker 2."""
    c, topic = cluster, "seed-alter"
    create_topic(c, topic, [1])
    produce(c, topic, [f"a{i}".encode() for i in range(10)])
    create_chunk(c, topic, [2])
    produce(c, topic, [f"b{i}".encode() for i in range(10)])
    alter_chunk(c, topic, 0, [3])
    wait_for(lambda: all(chunk_rows(partition_md(c, b, topic)) == [(0, 9, 9, [3], [3])] for b in c.broker_ids),
             what="the first chunk on broker 3 only")
    wait_for(lambda: 0 not in chunk_dirs(c, 1, topic), what="broker 1 to delete its replica")
    assert disk_offsets(chunk_dirs(c, 3, topic)[0]) == list(range(10))
    logs = BrokerLogs(c).mark()

    polls = consume_confluent(c, topic, 20)
    flat = [r for poll in polls for r in poll]
    assert [o for o, _ in flat] == list(range(20))
    assert logs.served("chunk_read", topic=topic) == {3: [0]}
    assert logs.events(2, "chunk_redirect", topic=topic, offset=0, to=3)


def test_chunk_cut_inside_a_transaction_at_its_first_offset(cluster: Cluster) -> None:
    """A transaction open from the active chunk's first offset: LSO == the chunk's start, so the
    closed chunk has nothing readable (stop = start - 1) and the new chunk copies all of it
    before the commit marker lands there."""
    c, topic = cluster, "txn-at-start"
    create_topic(c, topic, [1])
    tp = Producer({"bootstrap.servers": c.bootstrap, "transactional.id": f"txs-{uuid.uuid4().hex[:6]}",
                   "linger.ms": 5})
    tp.init_transactions(30)
    tp.begin_transaction()
    for i in range(5):
        tp.produce(topic, f"t{i}".encode(), partition=0)
    assert tp.flush(30) == 0
    logs = BrokerLogs(c).mark()
    p = create_chunk(c, topic, [2])
    assert (p.start_offset, chunk_rows(p)) == (0, [(0, -1, 4, [1], [1])])
    tp.commit_transaction(30)
    flat = [r for poll in consume_confluent(c, topic, 5, read_committed=True) for r in poll]
    assert flat == [(i, f"t{i}".encode()) for i in range(5)]
    assert disk_offsets(chunk_dirs(c, 2, topic)[0]) == list(range(5))
    assert fetch_v(c, 1, topic, 0, 12).preferred_read_replica == 2  # nothing readable on broker 1: onwards
    # broker 1's dir became the closed chunk's replica, under the one log it had (a second log
    # opened on it while the active one was deleted left that log a dir that was gone: its next
    # checkpoint took broker 1's whole log dir offline)
    assert len(chunk_dirs(c, 1, topic)) == 1
    assert [e for e in logs.events(1, "log_deleted") if topic in e.get("dir", "")] == []


def test_only_the_leader_serves_follower_fetches_of_the_active_chunk(cluster: Cluster) -> None:
    """As Kafka: a follower fetch (replica_id >= 0) to a broker that does not lead the partition
    is answered NOT_LEADER_OR_FOLLOWER; a replica of an inactive chunk serves its range to one."""
    c, topic = cluster, "follower-fetch"
    create_topic(c, topic, [1, 2])
    produce(c, topic, [b"f%d" % i for i in range(4)])
    F = FetchRequest

    def follower_fetch(broker: int, offset: int) -> Any:
        req = F(replica_id=3, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20, isolation_level=0, session_id=0,
                session_epoch=-1, topics=[F.FetchTopic(topic=topic, partitions=[F.FetchPartition(
                    partition=0, fetch_offset=offset, partition_max_bytes=1 << 20, current_leader_epoch=-1,
                    last_fetched_epoch=-1, log_start_offset=-1)])], forgotten_topics_data=[], rack_id="")
        return run(request(c.broker_port(broker), req, 12)).responses[0].partitions[0]

    # broker 1 leads unless a loaded machine had it fenced at creation: ask, do not assume
    leader = partition_md(c, 1, topic).leader_id
    follower = 3 - leader
    assert follower_fetch(follower, 0).error_code == Errors.NOT_LEADER_OR_FOLLOWER
    assert record_offsets(follower_fetch(leader, 0)) == [0, 1, 2, 3]
    create_chunk(c, topic, [3, 1])
    served = follower_fetch(2, 1)  # brokers 1 and 2 hold the closed chunk [0, 3]
    assert (served.error_code, record_offsets(served)[-1], served.high_watermark) == (0, 3, 4)
