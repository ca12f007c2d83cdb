"""Transactions on diskless topics with real brokers and real clients (3 brokers, the local store
and SeaweedFS): confluent-kafka's transactional producer commits and aborts on a diskless topic;
read_committed consumers through every broker see the same committed records at the same offsets
and never an aborted one, nothing past an open transaction until it ends (the last stable offset,
also ListOffsets' answer), and read_uncommitted readers see everything."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.s3_server import SeaweedS3, s3_server  # noqa: F401
from tests.test_diskless_acceptance import CONTROLLER, PARTITIONS, RACKS, TOPIC, _create_topic, _overrides
from tools.cluster import Cluster

pytestmark = pytest.mark.slow

BROKERS = (1, 2, 3)


# "remote": __diskless_metadata with one replica per partition, so most brokers ask another for
# the lookups (DisklessFindBatches over the network) instead of reading a replica of their own
@pytest.fixture(params=["local", "s3", "remote"])
def cluster(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    s3 = None
    if request.param == "s3":
        s3 = request.getfixturevalue("s3_server")
        for k, v in s3.env().items():
            monkeypatch.setenv(k, v)
    overrides = _overrides("s3" if s3 is not None else "local", s3, tmp_path)
    if request.param == "remote":
        overrides.update({"diskless.metadata.topic.replication.factor": "1", "diskless.metadata.topic.min.isr": "1"})
    c = Cluster(tmp_path / "cluster", brokers=3, broker_overrides=overrides,
                controller_overrides=CONTROLLER, per_broker_overrides={b: {"broker.rack": r} for b, r in RACKS.items()})
    try:
        c.start()
        _create_topic(c.bootstrap)
        if request.param == "remote":
            _one_replica_each(c)
        yield c
    finally:
        c.stop()


def _one_replica_each(c: Cluster) -> None:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": c.bootstrap})
    deadline = time.time() + 30
    while True:
        t = admin.list_topics("__diskless_metadata", timeout=10).topics.get("__diskless_metadata")
        if t is not None and t.error is None and t.partitions:
            assert all(len(p.replicas) == 1 for p in t.partitions.values()), t.partitions
            assert len({p.replicas[0] for p in t.partitions.values()}) > 1  # spread: some lookups go remote
            return
        assert time.time() < deadline, "no __diskless_metadata"
        time.sleep(0.2)


def _producer(c: Cluster, via: int, txn_id: str) -> Any:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": f"127.0.0.1:{c.broker_port(via)}", "transactional.id": txn_id,
                  "client.id": f"{txn_id}-diskless_az={RACKS[via]}", "linger.ms": 5, "transaction.timeout.ms": 60000})
    p.init_transactions(60)
    return p


def _send(p: Any, tag: str, n: int) -> list[bytes]:
    values = [f"{tag}-{i}".encode() for i in range(n)]
    for i, v in enumerate(values):
        p.produce(TOPIC, value=v, key=b"k", partition=i % PARTITIONS)
    assert p.flush(60) == 0
    return values


def _read(c: Cluster, via: int, isolation: str, expected: int, settle_s: float = 1.5) -> dict[int, list[tuple[int, bytes]]]:
    """Every record a consumer through broker `via` gets: until `expected` are in and nothing
    more came for `settle_s` (so a record that should not be there has had its chance)."""
    from confluent_kafka import Consumer, TopicPartition

    cid = f"r{via}-{isolation}-{time.monotonic_ns()}-diskless_az={RACKS[via]}"
    cons = Consumer({"bootstrap.servers": f"127.0.0.1:{c.broker_port(via)}", "client.id": cid, "group.id": cid,
                     "enable.auto.commit": False, "fetch.wait.max.ms": 100, "isolation.level": isolation})
    cons.assign([TopicPartition(TOPIC, i, 0) for i in range(PARTITIONS)])
    got: dict[int, list[tuple[int, bytes]]] = {}
    count = 0
    deadline = time.time() + 90
    last_new = time.time()
    try:
        while time.time() < deadline:
            msgs = cons.consume(1000, 0.2)
            for m in msgs:
                assert m.error() is None, m.error()
                part, offset, value = m.partition(), m.offset(), m.value()
                assert part is not None and offset is not None and value is not None
                got.setdefault(part, []).append((offset, value))
                count += 1
            if msgs:
                last_new = time.time()
            elif count >= expected and time.time() - last_new >= settle_s:
                break
    finally:
        cons.close()
    return got


def _values(got: dict[int, list[tuple[int, bytes]]]) -> list[bytes]:
    return sorted(v for rows in got.values() for _, v in rows)


async def _latest(port: int, isolation: int) -> list[int]:
    from node.client import NodeClient
    from protocol.generated.list_offsets import ListOffsetsRequest as L

    async with NodeClient("127.0.0.1", port) as cl:
        resp = await cl.request(L(replica_id=-1, isolation_level=isolation, topics=[L.ListOffsetsTopic(
            name=TOPIC, partitions=[L.ListOffsetsPartition(partition_index=i, timestamp=-1)
                                    for i in range(PARTITIONS)])]), 5)
    return [p.offset for p in sorted(resp.topics[0].partitions, key=lambda p: p.partition_index)]


async def _producers(port: int) -> dict[int, list[tuple[int, int, int]]]:
    """DescribeProducers (KIP-664) of every partition: (producer id, epoch, open transaction's start)."""
    from node.client import NodeClient
    from protocol.generated.describe_producers import DescribeProducersRequest as D

    async with NodeClient("127.0.0.1", port) as cl:
        resp = await cl.request(D(topics=[D.TopicRequest(name=TOPIC, partition_indexes=list(range(PARTITIONS)))]), 0)
    out = {}
    for p in resp.topics[0].partitions:
        assert p.error_code == 0, p
        out[p.partition_index] = sorted((a.producer_id, a.producer_epoch, a.current_txn_start_offset)
                                        for a in p.active_producers)
    return out


def test_commit_abort_and_open_transactions_through_every_broker(cluster: Cluster) -> None:
    c = cluster
    p1 = _producer(c, 1, "dtx-1")
    p1.begin_transaction()
    committed = _send(p1, "c", 60)
    p1.commit_transaction(60)
    p1.begin_transaction()
    aborted = _send(p1, "a", 30)
    p1.abort_transaction(60)

    # a second producer (through another broker) opens a transaction and leaves it open; what
    # the first commits after it stays invisible to read_committed readers until it ends
    p2 = _producer(c, 2, "dtx-2")
    p2.begin_transaction()
    held_open = _send(p2, "o", 12)
    p1.begin_transaction()
    late = _send(p1, "late", 24)
    p1.commit_transaction(60)

    for b in BROKERS:
        got = _read(c, b, "read_committed", len(committed))
        assert _values(got) == sorted(committed), f"read_committed through broker {b} while a transaction is open"
    everything = _read(c, 3, "read_uncommitted", len(committed) + len(aborted) + len(held_open) + len(late))
    assert _values(everything) == sorted(committed + aborted + held_open + late)
    stable = asyncio.run(_latest(c.broker_port(1), 1))
    ends = asyncio.run(_latest(c.broker_port(1), 0))
    assert all(s < e for s, e in zip(stable, ends)), (stable, ends)  # each partition holds an open transaction
    # DescribeProducers answers alike through every broker: two producers per partition, one open
    # transaction starting at the last stable offset
    described = [asyncio.run(_producers(c.broker_port(b))) for b in BROKERS]
    assert described[0] == described[1] == described[2]
    for part, producers in described[0].items():
        assert len(producers) == 2 and sorted(t for _, _, t in producers) == [-1, stable[part]], (part, producers)

    p2.abort_transaction(60)
    expected = sorted(committed + late)
    seen = []
    for b in BROKERS:
        got = _read(c, b, "read_committed", len(expected))
        assert _values(got) == expected, f"read_committed through broker {b} after the abort"
        seen.append(got)
    assert seen[0] == seen[1] == seen[2], "brokers answer different offsets"
    # offsets: every committed record where read_uncommitted saw it
    where = {v: (part, o) for part, rows in everything.items() for o, v in rows}
    assert all(where[v] == (part, o) for part, rows in seen[0].items() for o, v in rows)
    for b in BROKERS:  # the markers are there: the last stable offset is the end again
        assert asyncio.run(_latest(c.broker_port(b), 1)) == asyncio.run(_latest(c.broker_port(b), 0))

    # the second producer goes on with a new transaction after its abort
    p2.begin_transaction()
    again = _send(p2, "again", 6)
    p2.commit_transaction(60)
    expected = sorted(committed + late + again)
    assert _values(_read(c, 2, "read_committed", len(expected))) == expected
    del p1, p2


def _read_topic(c: Cluster, topic: str, partitions: int, expected: int) -> list[bytes]:
    from confluent_kafka import Consumer, TopicPartition

    cid = f"r-{topic}-{time.monotonic_ns()}"
    cons = Consumer({"bootstrap.servers": c.bootstrap, "client.id": cid, "group.id": cid, "enable.auto.commit": False,
                     "fetch.wait.max.ms": 100, "isolation.level": "read_committed"})
    cons.assign([TopicPartition(topic, i, 0) for i in range(partitions)])
    out: list[bytes] = []
    deadline, last_new = time.time() + 60, time.time()
    try:
        while time.time() < deadline:
            msgs = [m for m in cons.consume(1000, 0.2) if m.error() is None]
            out += [m.value() for m in msgs]
            if msgs:
                last_new = time.time()
            elif len(out) >= expected and time.time() - last_new >= 1.5:
                break
    finally:
        cons.close()
    return sorted(out)


def test_transactions_across_diskless_and_classic_topics_and_a_timed_out_one(tmp_path: Path) -> None:
    """One transaction writes a diskless and a classic topic: both commit or abort together. A
    transaction its producer abandons is aborted by the coordinator after its timeout (markers
    with the bumped epoch): the last stable offset moves on and its records are never served."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    overrides = {**_overrides("local", None, tmp_path), "transaction.abort.timed.out.transaction.cleanup.interval.ms": "500"}
    c = Cluster(tmp_path / "cluster", brokers=3, broker_overrides=overrides, controller_overrides=CONTROLLER,
                per_broker_overrides={b: {"broker.rack": r} for b, r in RACKS.items()})
    try:
        c.start()
        _create_topic(c.bootstrap)
        admin = AdminClient({"bootstrap.servers": c.bootstrap})
        admin.create_topics([NewTopic("classic", 2, 3)])["classic"].result(30)
        p = _producer(c, 1, "mixed")

        def both(tag: str, n: int) -> list[bytes]:
            values = [f"{tag}-{i}".encode() for i in range(n)]
            for i, v in enumerate(values):
                p.produce(TOPIC, value=v, partition=i % PARTITIONS)
                p.produce("classic", value=v, partition=i % 2)
            assert p.flush(60) == 0
            return values

        p.begin_transaction()
        kept = both("kept", 20)
        p.commit_transaction(60)
        p.begin_transaction()
        both("dropped", 20)
        p.abort_transaction(60)

        # abandoned: open on every diskless partition, never ended by its producer
        gone = Producer({"bootstrap.servers": c.bootstrap, "transactional.id": "abandoned",
                         "transaction.timeout.ms": 2000, "client.id": "abandoned-diskless_az=r2"})
        gone.init_transactions(60)
        gone.begin_transaction()
        for i in range(PARTITIONS * 2):
            gone.produce(TOPIC, value=b"abandoned-%d" % i, partition=i % PARTITIONS)
        assert gone.flush(60) == 0
        p.begin_transaction()
        after = both("after", 12)
        p.commit_transaction(60)

        assert _read_topic(c, "classic", 2, len(kept + after)) == sorted(kept + after)
        # the coordinator aborts the abandoned one within its timeout plus a cleanup interval
        assert _read_topic(c, TOPIC, PARTITIONS, len(kept + after)) == sorted(kept + after)
        stable = asyncio.run(_latest(c.broker_port(2), 1))
        assert stable == asyncio.run(_latest(c.broker_port(2), 0))
        gone.purge()
    finally:
        c.stop()
