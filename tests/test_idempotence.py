"""Idempotent producers against a real cluster: confluent-kafka (enable.idempotence) and kafka-python
3.0 (idempotent by default) deliver every message exactly once; a raw duplicate Produce is appended
once and answered with the first offset; InitProducerId hands out ids and bumps epochs; a partition
leader killed with SIGKILL mid-produce and restarted leaves no duplicates."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from node.client import NodeClient
from protocol.generated.init_producer_id import InitProducerIdRequest
from protocol.generated.produce import ProduceRequest
from protocol.records import Record, encode_batch, iter_batches
from tests.conftest import FAST_FENCING
from tests.tcp_proxy import TcpProxy
from tools.cluster import Cluster

pytestmark = pytest.mark.slow

N = 50_000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("idempotence"), brokers=3, verbose=False)
    c.start()
    yield c
    c.stop()


# ------------------------------------------------------------------------------------- helpers
def create(c: Cluster, name: str, partitions: int = 1, rf: int = 1) -> AdminClient:
    a = AdminClient({"bootstrap.servers": c.bootstrap})
    a.create_topics([NewTopic(name, partitions, rf)])[name].result(30)
    return a


def leader_of(a: AdminClient, topic: str, p: int = 0) -> int:
    deadline = time.time() + 30
    while time.time() < deadline:
        md = a.list_topics(topic, timeout=10).topics[topic].partitions.get(p)
        if md is not None and md.leader > 0:
            return md.leader
        time.sleep(0.2)
    raise AssertionError(f"{topic}-{p} has no leader")


def consume_all(c: Cluster, topic: str, partitions: int, timeout: float = 120) -> dict[int, list[tuple[int, bytes]]]:
    """Every record of every partition, as (offset, value), read until end of each partition."""
    cons = Consumer({"bootstrap.servers": c.bootstrap, "group.id": "idem-check", "enable.auto.commit": False,
                     "enable.partition.eof": True})
    cons.assign([TopicPartition(topic, i, 0) for i in range(partitions)])
    got: dict[int, list[tuple[int, bytes]]] = {i: [] for i in range(partitions)}
    eof: set[int] = set()
    deadline = time.time() + timeout
    while len(eof) < partitions and time.time() < deadline:
        for m in cons.consume(10000, 0.5):
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    eof.add(m.partition())
                    continue
                raise AssertionError(m.error())
            got[m.partition()].append((m.offset(), m.value()))
            eof.discard(m.partition())
    cons.close()
    assert len(eof) == partitions, "did not reach the end of every partition"
    return got


def disk_batches(c: Cluster, broker: int, topic: str, p: int = 0):
    """Headers of the batches in the leader's segment files, in offset order."""
    dirs = list(c.node_dir(broker).glob(f"logs-*/{topic}-{p}-0"))
    assert len(dirs) == 1, dirs
    data = b"".join(f.read_bytes() for f in sorted(dirs[0].glob("*.log")))
    return [h for _, h in iter_batches(data)]


def assert_idempotent_batches(headers) -> None:
    """Every batch carries a producer id, and per (producer id, epoch) the sequences run on with
    no gap and no repeat: idempotence was on and nothing was written twice."""
    assert headers
    last: dict[tuple[int, int], int] = {}
    for h in headers:
        assert h.producer_id >= 0 and h.producer_epoch >= 0 and h.base_sequence >= 0, h
        key = (h.producer_id, h.producer_epoch)
        assert h.base_sequence == last.get(key, -1) + 1, (h, last.get(key))
        last[key] = h.base_sequence + h.record_count - 1


def check_exactly_once(got: dict[int, list[tuple[int, bytes]]], expected: set[bytes]) -> None:
    values = [v for recs in got.values() for _, v in recs]
    assert len(values) == len(set(values)), "a message was written twice"
    assert set(values) == expected
    for recs in got.values():
        assert [o for o, _ in recs] == list(range(len(recs)))  # contiguous offsets


def run(coro):
    return asyncio.run(coro)


# ------------------------------------------------------------------------------------- clients
def test_confluent_idempotent_producer_delivers_exactly_once(cluster):
    topic = "idem-confluent"
    a = create(cluster, topic, partitions=3)
    p = Producer({"bootstrap.servers": cluster.bootstrap, "enable.idempotence": True, "acks": "all",
                  "linger.ms": 5, "batch.num.messages": 500})
    acked, errors = [], []

    def cb(err, m):
        (errors.append(err) if err else acked.append((m.partition(), m.offset(), m.value())))

    for i in range(N):
        while True:
            try:
                p.produce(topic, key=b"k%d" % (i % 97), value=b"c-%d" % i, on_delivery=cb)
                break
            except BufferError:
                p.poll(0.05)
        if i % 5000 == 0:
            p.poll(0)
    assert p.flush(120) == 0
    assert errors == [] and len(acked) == N
    got = consume_all(cluster, topic, 3)
    check_exactly_once(got, {b"c-%d" % i for i in range(N)})
    assert {(pt, o, v) for pt, recs in got.items() for o, v in recs} == set(acked)
    for part in range(3):
        assert_idempotent_batches(disk_batches(cluster, leader_of(a, topic, part), topic, part))


def test_kafka_python_default_producer_is_idempotent_and_exactly_once(cluster):
    from kafka import KafkaProducer

    topic = "idem-kafka-python"
    a = create(cluster, topic, partitions=3)
    p = KafkaProducer(bootstrap_servers=cluster.bootstrap, acks="all", linger_ms=5, batch_size=32768)
    assert p.config["enable_idempotence"] is True
    futures = [p.send(topic, key=b"k%d" % (i % 97), value=b"kp-%d" % i) for i in range(N)]
    p.flush(120)
    metas = [f.get(timeout=60) for f in futures]
    p.close(10)
    got = consume_all(cluster, topic, 3)
    check_exactly_once(got, {b"kp-%d" % i for i in range(N)})
    assert {(m.partition, m.offset) for m in metas} == {(pt, o) for pt, recs in got.items() for o, _ in recs}
    for part in range(3):
        assert_idempotent_batches(disk_batches(cluster, leader_of(a, topic, part), topic, part))


# ------------------------------------------------------------------------------------- raw protocol
def _client(c: Cluster, broker: int) -> NodeClient:
    return NodeClient(c.host, c.broker_port(broker), client_id="idem-test")  # connects in `async with`


def _produce_req(topic: str, records: bytes) -> ProduceRequest:
    R = ProduceRequest
    return R(acks=-1, timeout_ms=30000,
             topic_data=[R.TopicProduceData(name=topic, partition_data=[R.PartitionProduceData(index=0, records=records)])])


def _partition_response(resp):
    return resp.responses[0].partition_responses[0]


def test_init_producer_id_hands_out_unique_ids_and_bumps_epochs(cluster):
    async def go():
        ids = []
        for b in cluster.broker_ids:
            async with _client(cluster, b) as cl:
                for _ in range(3):
                    for v in (0, 2, 4, 5):
                        r = await cl.request(InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=60000), v)
                        assert r.error_code == 0 and r.producer_epoch == 0 and r.producer_id >= 0
                        ids.append(r.producer_id)
                pid = ids[-1]
                bumped = await cl.request(InitProducerIdRequest(transactional_id=None, producer_id=pid, producer_epoch=7), 4)
                assert (bumped.error_code, bumped.producer_id, bumped.producer_epoch) == (0, pid, 8)
                rotated = await cl.request(
                    InitProducerIdRequest(transactional_id=None, producer_id=pid, producer_epoch=32766), 4)
                assert rotated.error_code == 0 and rotated.producer_id != pid and rotated.producer_epoch == 0
                ids.append(rotated.producer_id)
                bad = await cl.request(InitProducerIdRequest(transactional_id=None, producer_id=pid, producer_epoch=-1), 4)
                assert bad.error_code == 42  # INVALID_REQUEST
                txn = await cl.request(InitProducerIdRequest(transactional_id="tx", transaction_timeout_ms=60000), 4)
                assert txn.error_code == 16  # NOT_COORDINATOR: no __transaction_state partition is led here (yet)
        # Past the first blocks of 1000: the broker asks the controller for more as it goes.
        async with _client(cluster, 1) as cl:
            many = await asyncio.gather(*(cl.request(InitProducerIdRequest(transactional_id=None)) for _ in range(2500)))
        assert {r.error_code for r in many} == {0}
        ids += [r.producer_id for r in many]
        assert len(ids) == len(set(ids)), "a producer id was handed out twice"

    run(go())


def test_raw_duplicate_produce_is_appended_once_and_answered_with_the_first_offset(cluster):
    topic = "idem-raw"
    a = create(cluster, topic)
    leader = leader_of(a, topic)

    async def go():
        async with _client(cluster, leader) as cl:
            init = await cl.request(InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=60000))
            pid, epoch = init.producer_id, init.producer_epoch

            def batch(seq: int, n: int = 3, e: int = epoch, tag: bytes = b"r") -> bytes:
                return encode_batch([Record(value=tag + b"-%d" % (seq + i), timestamp=int(time.time() * 1000))
                                     for i in range(n)], producer_id=pid, producer_epoch=e, base_sequence=seq)

            plain = encode_batch([Record(value=b"plain", timestamp=int(time.time() * 1000))])
            assert _partition_response(await cl.request(_produce_req(topic, plain))).base_offset == 0
            first = _partition_response(await cl.request(_produce_req(topic, batch(0))))
            assert (first.error_code, first.base_offset) == (0, 1)
            again = _partition_response(await cl.request(_produce_req(topic, batch(0))))
            assert (again.error_code, again.base_offset) == (0, 1)  # the duplicate: first's offset, nothing new
            nxt = _partition_response(await cl.request(_produce_req(topic, batch(3))))
            assert (nxt.error_code, nxt.base_offset) == (0, 4)
            # Pipelined: both requests in flight at once, the second a copy of the first.
            r1, r2 = await asyncio.gather(cl.request(_produce_req(topic, batch(6))),
                                          cl.request(_produce_req(topic, batch(6))))
            assert _partition_response(r1).base_offset == _partition_response(r2).base_offset == 7
            assert _partition_response(r1).error_code == _partition_response(r2).error_code == 0
            gap = _partition_response(await cl.request(_produce_req(topic, batch(20))))
            assert gap.error_code == 6  # NOT_LEADER_OR_FOLLOWER: a gap is retriable (SequenceGapError)
            # KIP-360 bump: same id, next epoch, sequences start over; the old epoch is fenced.
            bump = await cl.request(InitProducerIdRequest(transactional_id=None, producer_id=pid, producer_epoch=epoch), 4)
            assert (bump.producer_id, bump.producer_epoch) == (pid, epoch + 1)
            assert _partition_response(await cl.request(_produce_req(topic, batch(5, e=epoch + 1)))).error_code == 45
            fresh = _partition_response(await cl.request(_produce_req(topic, batch(0, e=epoch + 1, tag=b"e"))))
            assert (fresh.error_code, fresh.base_offset) == (0, 10)
            stale = _partition_response(await cl.request(_produce_req(topic, batch(9))))
            assert stale.error_code == 47  # INVALID_PRODUCER_EPOCH

    run(go())
    got = consume_all(cluster, topic, 1)[0]
    assert [v for _, v in got] == [b"plain"] + [b"r-%d" % i for i in range(9)] + [b"e-%d" % i for i in range(3)]
    assert [o for o, _ in got] == list(range(13))


# ------------------------------------------------------------------------------------- leader kill
def test_leader_kill_9_mid_produce_leaves_no_duplicates(tmp_path: Path):
    c = Cluster(tmp_path / "kill", brokers=3, verbose=False, broker_overrides=FAST_FENCING,
                controller_overrides={"broker.session.timeout.ms": "3000"})
    proxies = {b: TcpProxy(c.host, c.broker_port(b)) for b in c.broker_ids}
    for b, px in proxies.items():
        c.per_broker_overrides[b] = {"advertised.listeners": f"PLAINTEXT://{c.host}:{px.port}"}
    stop = threading.Event()
    t: threading.Thread | None = None
    try:
        c.start()
        topic = "idem-kill"
        a = create(c, topic)  # RF 1: the leader is the only replica
        leader = leader_of(a, topic)
        p = Producer({"bootstrap.servers": c.bootstrap, "enable.idempotence": True, "acks": "all",
                      "linger.ms": 2, "batch.num.messages": 200, "message.timeout.ms": 120000,
                      "retry.backoff.ms": 100, "reconnect.backoff.max.ms": 500})
        acked: dict[bytes, int] = {}
        errors = []

        def cb(err, m):
            if err:
                errors.append(err)
            else:
                assert m.value() not in acked, "acknowledged twice"
                acked[m.value()] = m.offset()

        total = 200_000
        killed = threading.Event()

        def killer():
            while len(acked) < 30_000:
                if stop.is_set():
                    return
                time.sleep(0.01)
            proxies[leader].swallow.set()  # the next requests are appended, their answers lost ...
            time.sleep(0.5)
            c.kill(leader)  # ... and the leader dies before anyone hears of them
            proxies[leader].swallow.clear()
            killed.set()
            time.sleep(1.0)
            c.start_node(leader, timeout=90)

        t = threading.Thread(target=killer, daemon=True)
        t.start()
        for i in range(total):
            while True:
                try:
                    p.produce(topic, value=b"m-%d" % i, on_delivery=cb)
                    break
                except BufferError:
                    p.poll(0.05)
            if i % 1000 == 0:
                p.poll(0)
        assert p.flush(180) == 0
        t.join(120)
        assert killed.is_set() and not t.is_alive() and c.is_running(leader)
        # The batches appended before the kill were retried after the restart and found duplicate.
        assert "duplicate_batch" in c.log_path(leader).read_text(errors="replace")
        assert not errors, errors[:5]
        assert len(acked) == total
        got = consume_all(c, topic, 1)[0]
        values = [v for _, v in got]
        assert len(values) == len(set(values)), "duplicates after the leader restart"
        assert [o for o, _ in got] == list(range(len(got)))
        assert dict((v, o) for o, v in got) == acked  # each message once, at the offset it was acknowledged with
        assert_idempotent_batches(disk_batches(c, leader, topic))
    finally:
        stop.set()
        if t is not None and t.is_alive():
            t.join(120)  # never leave it to start a broker after the cluster stopped
        c.stop()
        for px in proxies.values():
            px.close()
