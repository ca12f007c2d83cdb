"""Transactions with real clients: aiokafka, kafka-python and confluent-kafka each as the
transactional producer against a real 3-broker cluster (__transaction_state and the data topics
RF 3, min.insync.replicas 2):

- an aborted transaction is invisible to read_committed consumers (read with all three clients)
  and visible to read_uncommitted ones; a committed one is visible exactly once;
- offsets sent with send_offsets_to_transaction land only when the transaction commits (and
  OffsetFetch with require_stable answers UNSTABLE_OFFSET_COMMIT while it is open);
- a transaction left open past its timeout is aborted by the coordinator and its producer fenced.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka import TopicPartition as CTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from node.client import NodeClient
from protocol.errors import Errors
from protocol.generated.find_coordinator import FindCoordinatorRequest
from protocol.generated.offset_fetch import OffsetFetchRequest
from tools.cluster import Cluster

CLIENTS = ["aiokafka", "kafka-python", "confluent-kafka"]
PARTITIONS = 3
BROKER = {
    "transaction.state.log.num.partitions": 6,
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": 500,
    "offsets.topic.num.partitions": 6,
    "group.initial.rebalance.delay.ms": 0,
    "broker.heartbeat.interval.ms": 500,
}


@pytest.fixture(scope="module")
def cluster3(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("txn-accept"), brokers=3, broker_overrides=BROKER, verbose=False)
    try:
        c.start()
        yield c
    finally:
        c.stop()


def create_topic(c: Cluster, name: str, partitions: int = PARTITIONS) -> None:
    a = AdminClient(c.rdkafka_conf())
    a.create_topics([NewTopic(name, partitions, 3, config={"min.insync.replicas": "2"})])[name].result(30)


# ---------------------------------------------------------------------------------- producers
class TxnProducer:
    """One client's transactional producer behind one synchronous interface."""

    def init(self) -> None: ...
    def begin(self) -> None: ...
    def send(self, topic: str, partition: int, value: bytes) -> None: ...
    def flush(self) -> None: ...
    def commit(self) -> None: ...
    def abort(self) -> None: ...
    def send_offsets(self, offsets: dict[tuple[str, int], int], group: str) -> None: ...
    def close(self) -> None: ...


class AioTxnProducer(TxnProducer):
    def __init__(self, c: Cluster, tid: str, timeout_ms: int) -> None:
        from aiokafka import AIOKafkaProducer

        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

        async def make():
            return AIOKafkaProducer(**c.client_kwargs("aiokafka"), transactional_id=tid,
                                    transaction_timeout_ms=timeout_ms, request_timeout_ms=30000)

        self.p = self._run(make())
        self.pending: list = []

    def _run(self, coro) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(60)

    def init(self) -> None:
        self._run(self.p.start())

    def begin(self) -> None:
        async def b():
            await self.p.begin_transaction()
        self._run(b())

    def send(self, topic, partition, value) -> None:
        self.pending.append(self._run(self.p.send(topic, value, partition=partition)))

    def flush(self) -> None:
        async def f(futs):
            await asyncio.gather(*futs)
        futs, self.pending = self.pending, []
        self._run(f(futs))

    def commit(self) -> None:
        self.flush()
        self._run(self.p.commit_transaction())

    def abort(self) -> None:
        self.pending = []
        self._run(self.p.abort_transaction())

    def send_offsets(self, offsets, group) -> None:
        from aiokafka import TopicPartition

        self._run(self.p.send_offsets_to_transaction({TopicPartition(t, p): o for (t, p), o in offsets.items()}, group))

    def close(self) -> None:
        try:
            self._run(self.p.stop())
        except Exception:
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


class KafkaPythonTxnProducer(TxnProducer):
    def __init__(self, c: Cluster, tid: str, timeout_ms: int) -> None:
        from kafka import KafkaProducer

        self.p = KafkaProducer(**c.client_kwargs("kafka-python"), transactional_id=tid,
                               transaction_timeout_ms=timeout_ms)
        self.pending: list = []

    def init(self) -> None:
        self.p.init_transactions()

    def begin(self) -> None:
        self.p.begin_transaction()

    def send(self, topic, partition, value) -> None:
        self.pending.append(self.p.send(topic, value, partition=partition))

    def flush(self) -> None:
        self.p.flush(30)
        for f in self.pending:
            f.get(30)
        self.pending = []

    def commit(self) -> None:
        self.p.commit_transaction()
        self.pending = []

    def abort(self) -> None:
        self.p.abort_transaction()
        self.pending = []

    def send_offsets(self, offsets, group) -> None:
        from kafka import TopicPartition
        from kafka.structs import OffsetAndMetadata

        self.p.send_offsets_to_transaction(
            {TopicPartition(t, p): OffsetAndMetadata(o, "", -1) for (t, p), o in offsets.items()}, group)

    def close(self) -> None:
        try:
            self.p.close(5)
        except Exception:
            pass


class ConfluentTxnProducer(TxnProducer):
    def __init__(self, c: Cluster, tid: str, timeout_ms: int) -> None:
        self.conf = c.rdkafka_conf()
        self.p = Producer({**self.conf, "transactional.id": tid,
                           "transaction.timeout.ms": timeout_ms, "linger.ms": 5})
        self.errors: list = []

    def init(self) -> None:
        self.p.init_transactions(30)

    def begin(self) -> None:
        self.p.begin_transaction()

    def send(self, topic, partition, value) -> None:
        def cb(err, _msg):
            if err is not None:
                self.errors.append(err)
        self.p.produce(topic, value, partition=partition, on_delivery=cb)

    def flush(self) -> None:
        self.p.flush(30)
        if self.errors:
            raise KafkaException(self.errors[0])

    def commit(self) -> None:
        self.p.commit_transaction(30)

    def abort(self) -> None:
        self.p.abort_transaction(30)

    def send_offsets(self, offsets, group) -> None:
        c = Consumer({**self.conf, "group.id": group})  # for its group metadata
        try:
            self.p.send_offsets_to_transaction([CTopicPartition(t, p, o) for (t, p), o in offsets.items()],
                                               c.consumer_group_metadata(), 30)
        finally:
            c.close()

    def close(self) -> None:
        self.p.flush(5)
        # the handle goes now, not when a reference cycle is collected (pytest.raises keeps the
        # test's frame, and so this object, alive): else it retries a stopped cluster until exit
        self.p = None


def make_producer(client: str, c: Cluster, tid: str, timeout_ms: int = 60000) -> TxnProducer:
    if client == "aiokafka":
        return AioTxnProducer(c, tid, timeout_ms)
    if client == "kafka-python":
        return KafkaPythonTxnProducer(c, tid, timeout_ms)
    return ConfluentTxnProducer(c, tid, timeout_ms)


# ---------------------------------------------------------------------------------- consumers
def read_all(client: str, c: Cluster, topic: str, isolation: str, expect: int, settle: float = 1.0) -> list[bytes]:
    """Every value of the topic (all partitions, from the start) as `client` sees it with
    `isolation`: reads until `expect` values came and nothing more arrives for `settle` seconds."""
    if client == "confluent-kafka":
        return _read_confluent(c, topic, isolation, expect, settle)
    if client == "kafka-python":
        return _read_kafka_python(c, topic, isolation, expect, settle)
    return asyncio.run(_read_aiokafka(c, topic, isolation, expect, settle))


def _poll_loop(poll: Callable[[], list[bytes]], expect: int, settle: float, timeout: float = 30.0) -> list[bytes]:
    out: list[bytes] = []
    deadline = time.monotonic() + timeout
    quiet_since = None
    while time.monotonic() < deadline:
        got = poll()
        out += got
        if got:
            quiet_since = None
        elif len(out) >= expect:
            quiet_since = quiet_since or time.monotonic()
            if time.monotonic() - quiet_since >= settle:
                break
    return out


def _read_confluent(c, topic, isolation, expect, settle):
    con = Consumer({**c.rdkafka_conf(), "group.id": f"reader-{time.monotonic_ns()}",
                    "isolation.level": isolation, "enable.auto.commit": False})
    con.assign([CTopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    try:
        def poll():
            msgs = con.consume(500, 0.2)
            return [m.value() for m in msgs if m.error() is None]
        return _poll_loop(poll, expect, settle)
    finally:
        con.close()


def _read_kafka_python(c, topic, isolation, expect, settle):
    from kafka import KafkaConsumer, TopicPartition

    con = KafkaConsumer(**c.client_kwargs("kafka-python"), isolation_level=isolation, enable_auto_commit=False,
                        auto_offset_reset="earliest")
    con.assign([TopicPartition(topic, p) for p in range(PARTITIONS)])
    con.seek_to_beginning()
    try:
        def poll():
            batch = con.poll(200)
            return [r.value for recs in batch.values() for r in recs]
        return _poll_loop(poll, expect, settle)
    finally:
        con.close()


async def _read_aiokafka(c, topic, isolation, expect, settle):
    from aiokafka import AIOKafkaConsumer, TopicPartition

    con = AIOKafkaConsumer(**c.client_kwargs("aiokafka"), isolation_level=isolation, enable_auto_commit=False,
                           auto_offset_reset="earliest")
    await con.start()
    try:
        con.assign([TopicPartition(topic, p) for p in range(PARTITIONS)])
        await con.seek_to_beginning()
        out: list[bytes] = []
        deadline = time.monotonic() + 30
        quiet_since = None
        while time.monotonic() < deadline:
            batch = await con.getmany(timeout_ms=200)
            got = [r.value for recs in batch.values() for r in recs]
            out += got
            if got:
                quiet_since = None
            elif len(out) >= expect:
                quiet_since = quiet_since or time.monotonic()
                if time.monotonic() - quiet_since >= settle:
                    break
        return out
    finally:
        await con.stop()


def values(prefix: str, n: int) -> list[bytes]:
    return [f"{prefix}-{i}".encode() for i in range(n)]


def send_txn(p: TxnProducer, topic: str, vals: list[bytes], *, commit: bool) -> None:
    p.begin()
    for i, v in enumerate(vals):
        p.send(topic, i % PARTITIONS, v)
    p.flush()
    if commit:
        p.commit()
    else:
        p.abort()


# ---------------------------------------------------------------------------------- tests
@pytest.mark.parametrize("client", CLIENTS)
def test_aborted_is_invisible_to_read_committed_and_committed_is_seen_once(cluster3, client):
    topic = f"txn-vis-{client}"
    create_topic(cluster3, topic)
    p = make_producer(client, cluster3, f"vis-{client}")
    try:
        p.init()
        send_txn(p, topic, values("c1", 30), commit=True)
        send_txn(p, topic, values("ab", 30), commit=False)
        send_txn(p, topic, values("c2", 30), commit=True)
    finally:
        p.close()
    committed = sorted(values("c1", 30) + values("c2", 30))
    for reader in CLIENTS:
        got = read_all(reader, cluster3, topic, "read_committed", len(committed))
        assert sorted(got) == committed, f"{reader} read_committed after {client} transactions"
    everything = sorted(committed + values("ab", 30))
    got = read_all(client, cluster3, topic, "read_uncommitted", len(everything))
    assert sorted(got) == everything


async def _offset_fetch(c: Cluster, group: str, topic: str, require_stable: bool) -> dict[int, tuple[int, int]]:
    async with NodeClient(c.host, c.broker_port(1)) as boot:
        deadline = time.monotonic() + 20
        while True:
            r = await boot.request(FindCoordinatorRequest(key=group, key_type=0), 3)
            if r.error_code == 0:
                break
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)
        async with NodeClient(c.host, c.broker_port(r.node_id)) as cl:
            F = OffsetFetchRequest
            resp = await cl.request(F(group_id=group, topics=[F.OffsetFetchRequestTopic(
                name=topic, partition_indexes=list(range(PARTITIONS)))], require_stable=require_stable), 7)
            assert resp.error_code == 0
            return {p.partition_index: (p.committed_offset, p.error_code) for t in resp.topics for p in t.partitions}


def stable_offsets(c: Cluster, group: str, topic: str) -> dict[int, tuple[int, int]]:
    """OffsetFetch with require_stable once the transaction's marker reached __consumer_offsets
    (EndTxn answers before the markers are written, so UNSTABLE_OFFSET_COMMIT may come first)."""
    deadline = time.monotonic() + 10
    while True:
        got = asyncio.run(_offset_fetch(c, group, topic, True))
        if all(err != Errors.UNSTABLE_OFFSET_COMMIT for _, err in got.values()) or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


@pytest.mark.parametrize("client", CLIENTS)
def test_transactional_offsets_land_only_on_commit(cluster3, client):
    topic = f"txn-offs-{client}"
    create_topic(cluster3, topic)
    group = f"eos-group-{client}"
    p = make_producer(client, cluster3, f"offs-{client}")
    try:
        p.init()
        p.begin()
        p.send(topic, 0, b"x")
        p.send_offsets({(topic, 0): 5, (topic, 1): 6}, group)
        p.flush()
        # pending until the transaction ends
        got = asyncio.run(_offset_fetch(cluster3, group, topic, True))
        assert got[0] == (-1, Errors.UNSTABLE_OFFSET_COMMIT) and got[1] == (-1, Errors.UNSTABLE_OFFSET_COMMIT)
        assert asyncio.run(_offset_fetch(cluster3, group, topic, False))[0] == (-1, 0)
        p.abort()
        got = stable_offsets(cluster3, group, topic)
        assert got[0] == (-1, 0) and got[1] == (-1, 0), "aborted offsets must not land"
        p.begin()
        p.send(topic, 0, b"y")
        p.send_offsets({(topic, 0): 7, (topic, 2): 9}, group)
        p.commit()
    finally:
        p.close()
    assert stable_offsets(cluster3, group, topic) == {0: (7, 0), 1: (-1, 0), 2: (9, 0)}


@pytest.mark.parametrize("client", CLIENTS)
def test_transaction_past_its_timeout_is_aborted_and_the_producer_fenced(cluster3, client):
    topic = f"txn-timeout-{client}"
    create_topic(cluster3, topic)
    tid = f"timeout-{client}"
    p = make_producer(client, cluster3, tid, timeout_ms=3000)
    try:
        p.init()
        p.begin()
        for i, v in enumerate(values("late", 9)):
            p.send(topic, i % PARTITIONS, v)
        p.flush()
        time.sleep(5)  # past transaction.timeout.ms: the coordinator aborts and bumps the epoch
        with pytest.raises(Exception) as e:
            p.send(topic, 0, b"after-fence")
            p.commit()
        assert "fenc" in repr(e.value).lower() or "epoch" in repr(e.value).lower(), repr(e.value)
    finally:
        p.close()
    assert read_all(client, cluster3, topic, "read_committed", 0) == []
    assert sorted(read_all(client, cluster3, topic, "read_uncommitted", 9)) == sorted(values("late", 9))
    # the transactional id is usable again by a new producer
    p2 = make_producer(client, cluster3, tid, timeout_ms=10000)
    try:
        p2.init()
        send_txn(p2, topic, values("ok", 6), commit=True)
    finally:
        p2.close()
    assert sorted(read_all(client, cluster3, topic, "read_committed", 6)) == sorted(values("ok", 6))
