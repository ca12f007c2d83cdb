"""The admin APIs Kafka 3.7+/4.x clients and tools call, driven by real clients.

kafka-python 3.0.12's admin client speaks DescribeTopicPartitions (describe_topic_partitions),
ListTransactions, DescribeTransactions and DescribeProducers; it has the client quota messages
but no admin method for them, so the test sends its own AlterClientQuotas/DescribeClientQuotas
classes through its connection manager. confluent-kafka 2.16.1 (librdkafka) describes topics
with Metadata, has no quota or transaction admin calls; its producer is the one throttled.
"""

from __future__ import annotations

import asyncio
import subprocess
import time

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer
from confluent_kafka import TopicPartition as CTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaAdminClient, TopicPartition
from kafka.protocol.admin.client_quotas import (
    AlterClientQuotasRequest,
    DescribeClientQuotasRequest,
)

from node.client import NodeClient
from protocol.generated.describe_topic_partitions import DescribeTopicPartitionsRequest
from protocol.generated.metadata import MetadataRequest
from tests.conftest import installed_script, wait_for
from tools.cluster import Cluster

RATE = 256 * 1024  # producer_byte_rate under test, bytes/s
BROKERS = {"quota.window.num": 2, "quota.window.size.seconds": 1, "transaction.state.log.replication.factor": 1,
           "transaction.state.log.min.isr": 1, "offsets.topic.replication.factor": 1}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Cluster:
    c = Cluster(tmp_path_factory.mktemp("admin-apis"), brokers=2, broker_overrides=BROKERS)
    c.start()
    admin = AdminClient({"bootstrap.servers": c.bootstrap})
    fs = admin.create_topics([NewTopic("dtp-a", 5, 1), NewTopic("dtp-b", 3, 2), NewTopic("txn", 1, 1),
                              NewTopic("quota", 1, 1),
                              NewTopic("cquota", 1, 1), NewTopic("dtp-chunked", 1, 2)])
    for f in fs.values():
        f.result(30)
    yield c
    c.stop()


@pytest.fixture(scope="module")
def kadmin(cluster: Cluster) -> KafkaAdminClient:
    a = KafkaAdminClient(bootstrap_servers=cluster.bootstrap, client_id="test-admin")
    yield a
    a.close()


def send(kadmin: KafkaAdminClient, request):
    async def go():
        return await kadmin._manager.send(request)

    return kadmin._manager.run(go)


# ---------------------------------------------------------------- DescribeTopicPartitions (75)
def test_describe_topic_partitions_pages_with_a_cursor(cluster: Cluster, kadmin: KafkaAdminClient) -> None:
    first = kadmin.describe_topic_partitions(["dtp-b", "dtp-a", "nope"], response_partition_limit=4)
    assert [(t["name"], [p["partition_index"] for p in t["partitions"]]) for t in first["topics"]] == [
        ("dtp-a", [0, 1, 2, 3])]
    assert first["next_cursor"] == {"topic_name": "dtp-a", "partition_index": 4}
    second = kadmin.describe_topic_partitions(["dtp-b", "dtp-a", "nope"], response_partition_limit=4,
                                              cursor=first["next_cursor"])
    got = {t["name"]: t for t in second["topics"]}
    assert [p["partition_index"] for p in got["dtp-a"]["partitions"]] == [4]
    assert [p["partition_index"] for p in got["dtp-b"]["partitions"]] == [0, 1, 2]
    # the page is full: the next one starts at the next topic (unknown topics use no room)
    assert "nope" not in got and second["next_cursor"] == {"topic_name": "nope", "partition_index": 0}
    third = kadmin.describe_topic_partitions(["dtp-b", "dtp-a", "nope"], response_partition_limit=4,
                                             cursor=second["next_cursor"])
    [unknown] = third["topics"]
    assert (unknown["name"], unknown["error_code"], unknown["partitions"]) == ("nope", 3, [])
    assert third["next_cursor"] is None
    for p in got["dtp-b"]["partitions"]:
        assert p["error_code"] == 0 and len(p["replica_nodes"]) == 2 and p["leader_id"] in p["isr_nodes"]
    assert got["dtp-b"]["topic_id"] is not None and not got["dtp-b"]["is_internal"]

    everything = kadmin.describe_topic_partitions([])  # no names: every topic, in name order
    names = [t["name"] for t in everything["topics"]]
    assert names == sorted(names) and {"dtp-a", "dtp-b", "txn", "quota"} <= set(names)
    # a cursor outside the asked topics fails the request, as Kafka does
    bad = kadmin.describe_topic_partitions(["dtp-a"], cursor={"topic_name": "dtp-b", "partition_index": 0})
    assert [t["error_code"] for t in bad["topics"]] == [42]  # INVALID_REQUEST

    # confluent-kafka's describe_topics (Metadata) agrees
    from confluent_kafka import TopicCollection

    ca = AdminClient({"bootstrap.servers": cluster.bootstrap})  # kept: the futures die with the handle
    desc = ca.describe_topics(TopicCollection(["dtp-b"]))["dtp-b"].result(30)
    assert [(p.id, p.leader.id) for p in desc.partitions] == [
        (p["partition_index"], p["leader_id"]) for p in got["dtp-b"]["partitions"]]


# ---------------------------------------------------------------- client quotas (48, 49)
def entity(**kw: str | None) -> list:
    E = AlterClientQuotasRequest.EntryData.EntityData
    return [E(entity_type=t.replace("_", "-"), entity_name=n) for t, n in kw.items()]


def alter(kadmin, ops_by_entity: list, validate_only: bool = False) -> list[tuple[int, str | None]]:
    R = AlterClientQuotasRequest
    req = R(entries=[R.EntryData(entity=e, ops=[R.EntryData.OpData(key=k, value=float(v or 0), remove=v is None)
                                              for k, v in ops.items()]) for e, ops in ops_by_entity],
            validate_only=validate_only)
    return [(x.error_code, x.error_message) for x in send(kadmin, req).entries]


def describe(kadmin, components: list[tuple[str, int, str | None]], strict: bool = False) -> dict:
    C = DescribeClientQuotasRequest.ComponentData
    resp = send(kadmin, DescribeClientQuotasRequest(
        components=[C(entity_type=t, match_type=m, match=n) for t, m, n in components], strict=strict))
    assert resp.error_code == 0, resp.error_message
    return {tuple(sorted((e.entity_type, e.entity_name) for e in x.entity)): {v.key: v.value for v in x.values}
            for x in resp.entries}


def test_alter_and_describe_client_quotas(kadmin: KafkaAdminClient) -> None:
    assert alter(kadmin, [
        (entity(client_id="app-1"), {"producer_byte_rate": 1024000, "consumer_byte_rate": 2048000}),
        (entity(client_id=None), {"request_percentage": 150.5}),
        (entity(user="alice", client_id="app-1"), {"producer_byte_rate": 4096}),
    ]) == [(0, None)] * 3
    everything = describe(kadmin, [])
    assert everything[(("client-id", "app-1"),)] == {"producer_byte_rate": 1024000.0, "consumer_byte_rate": 2048000.0}
    assert everything[(("client-id", None),)] == {"request_percentage": 150.5}
    assert everything[(("client-id", "app-1"), ("user", "alice"))] == {"producer_byte_rate": 4096.0}
    # exact name, default, any name; strict leaves out entities with more types
    assert set(describe(kadmin, [("client-id", 0, "app-1")])) == {
        (("client-id", "app-1"),), (("client-id", "app-1"), ("user", "alice"))}
    assert set(describe(kadmin, [("client-id", 0, "app-1")], strict=True)) == {(("client-id", "app-1"),)}
    assert set(describe(kadmin, [("client-id", 1, None)])) == {(("client-id", None),)}
    assert set(describe(kadmin, [("user", 2, None)])) == {(("client-id", "app-1"), ("user", "alice"))}

    # errors: each entry on its own, nothing written for a refused one
    results = alter(kadmin, [
        (entity(client_id="app-2"), {"producer_byte_rate": 1.5}),
        (entity(client_id="app-2"), {"no_such_quota": 1}),
        (entity(ip="1.2.3.4", user="bob"), {"producer_byte_rate": 1}),
        (entity(client_id="app-2"), {"consumer_byte_rate": -5}),
        ([], {"producer_byte_rate": 1}),
        (entity(client_id="app-3"), {"producer_byte_rate": 100}),
    ], validate_only=True)
    assert [code for code, _ in results] == [42, 42, 42, 42, 42, 0]
    assert "whole number" in results[0][1] and "Unknown quota key" in results[1][1]
    assert (("client-id", "app-2"),) not in describe(kadmin, []) and (("client-id", "app-3"),) not in describe(kadmin, [])

    # removing values removes the entity once it has none
    assert alter(kadmin, [(entity(client_id="app-1"), {"producer_byte_rate": None, "consumer_byte_rate": None}),
                          (entity(client_id=None), {"request_percentage": None}),
                          (entity(user="alice", client_id="app-1"), {"producer_byte_rate": None})]) == [(0, None)] * 3
    assert describe(kadmin, []) == {}
    C = DescribeClientQuotasRequest.ComponentData
    bad = send(kadmin, DescribeClientQuotasRequest(components=[C("ip", 2, None), C("user", 2, None)], strict=False))
    assert bad.error_code == 42 and bad.entries is None


# ---------------------------------------------------------------- producer_byte_rate enforced
def test_producer_over_its_quota_is_throttled_to_the_rate(cluster: Cluster, kadmin: KafkaAdminClient) -> None:
    assert alter(kadmin, [(entity(client_id="throttled"), {"producer_byte_rate": RATE})]) == [(0, None)]
    value = b"x" * 16384
    delivered: list[tuple[float, int]] = []

    def on_delivery(err, msg) -> None:
        if err is None:
            delivered.append((time.monotonic(), len(msg.value())))

    p = Producer({"bootstrap.servers": cluster.bootstrap, "client.id": "throttled", "acks": 1,
                  "linger.ms": 5, "batch.size": 32768, "compression.type": "none",
                  "queue.buffering.max.kbytes": 512})
    start = time.monotonic()
    warmup, measure = 3.0, 10.0
    try:
        while time.monotonic() - start < warmup + measure + 0.5:
            try:
                p.produce("quota", value, on_delivery=on_delivery)
            except BufferError:
                p.poll(0.05)
            p.poll(0)
    finally:
        p.flush(30)
    t0, t1 = start + warmup, start + warmup + measure
    measured = sum(n for t, n in delivered if t0 <= t < t1) / measure
    # the quota counts whole Produce requests; the payload is all but a few hundred bytes of them
    assert abs(measured - RATE) / RATE < 0.10, f"{measured:.0f} B/s against a quota of {RATE} B/s"
    assert alter(kadmin, [(entity(client_id="throttled"), {"producer_byte_rate": None})]) == [(0, None)]


# ---------------------------------------------------------------- transactions (61, 65, 66)
def test_a_hanging_transaction_is_listed_and_described(cluster: Cluster, kadmin: KafkaAdminClient) -> None:
    p = Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": "hanging-1",
                  "transaction.timeout.ms": 600000})
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(3):
        p.produce("txn", f"v{i}".encode())
    p.flush(30)  # written, never committed: the transaction hangs
    try:
        listed = [x for rows in kadmin.list_transactions().values() for x in rows]
        mine = [x for x in listed if x.transactional_id == "hanging-1"]
        assert len(mine) == 1 and mine[0].state.value == "Ongoing", listed
        only_ongoing = kadmin.list_transactions(state_filters=["Ongoing"], transactional_id_pattern="hang.*")
        assert [x.transactional_id for rows in only_ongoing.values() for x in rows] == ["hanging-1"]
        assert not [x for rows in kadmin.list_transactions(state_filters=["CompleteCommit"]).values() for x in rows
                    if x.transactional_id == "hanging-1"]

        desc = kadmin.describe_transactions(["hanging-1"])["hanging-1"]
        assert desc.state.value == "Ongoing" and desc.producer_id == mine[0].producer_id
        assert desc.topic_partitions == {TopicPartition("txn", 0)}
        assert desc.transaction_start_time_ms > 0 and desc.transaction_timeout_ms == 600000

        state = kadmin.describe_producers([TopicPartition("txn", 0)])[TopicPartition("txn", 0)]
        [prod] = [s for s in state.active_producers if s.producer_id == desc.producer_id]
        assert prod.current_transaction_start_offset == 0 and prod.last_sequence == 2
        assert prod.producer_epoch == desc.producer_epoch and prod.last_timestamp > 0
    finally:
        p.abort_transaction(30)
    desc = kadmin.describe_transactions(["hanging-1"])["hanging-1"]
    assert desc.state.value in ("PrepareAbort", "CompleteAbort")

    def open_start_offsets() -> list[int]:
        state = kadmin.describe_producers([TopicPartition("txn", 0)])[TopicPartition("txn", 0)]
        return [s.current_transaction_start_offset for s in state.active_producers
                if s.producer_id == desc.producer_id]

    # EndTxn answers once PrepareAbort is logged; the marker reaches the partition after (Kafka's order)
    wait_for(lambda: open_start_offsets() == [-1], what="the abort marker to close the producer's transaction")


# ---------------------------------------------------------------- consumer_byte_rate, request_percentage
def test_consumer_over_its_quota_is_throttled(cluster: Cluster, kadmin: KafkaAdminClient) -> None:
    rate = 512 * 1024
    p = Producer({"bootstrap.servers": cluster.bootstrap, "linger.ms": 20, "batch.size": 20000})  # 1 record a batch
    for _ in range(200):  # 3.2 MB: six seconds at the quota
        p.produce("cquota", b"y" * 16384)
    p.flush(30)
    assert alter(kadmin, [(entity(client_id=None), {"consumer_byte_rate": rate})]) == [(0, None)]
    try:
        c = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "cq", "client.id": "slow-reader",
                      "auto.offset.reset": "earliest", "enable.auto.commit": False,
                      "max.partition.fetch.bytes": 65536, "fetch.max.bytes": 65536,
                      "message.max.bytes": 65536, "queued.max.messages.kbytes": 128, "queued.min.messages": 1,
                      "fetch.queue.backoff.ms": 5})
        c.assign([CTopicPartition("cquota", 0, OFFSET_BEGINNING)])
        got, start, first = 0, None, None
        deadline = time.monotonic() + 60
        while got < 200 * 16384 and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None or m.error():
                continue
            if first is None:
                first = time.monotonic()
            got += len(m.value())
            if start is None and got >= 1024 * 1024:  # past the first windows' allowance
                start, at_start = time.monotonic(), got
        took = time.monotonic() - start
        c.close()
        measured = (got - at_start) / took
        # Fetch answers carry their data when throttled (one 64 KiB answer of overshoot at most)
        assert 0.8 * rate < measured < 1.2 * rate, f"{measured:.0f} B/s against {rate} B/s"
    finally:
        assert alter(kadmin, [(entity(client_id=None), {"consumer_byte_rate": None})]) == [(0, None)]


def test_request_percentage_throttles_a_busy_client(cluster: Cluster, kadmin: KafkaAdminClient) -> None:
    assert alter(kadmin, [(entity(client_id="busy"), {"request_percentage": 0.01})]) == [(0, None)]
    host, port = cluster.bootstrap.split(",")[0].rsplit(":", 1)

    async def hammer() -> list[int]:
        async with NodeClient(host, int(port), client_id="busy") as cl:
            out = []
            for _ in range(20):  # until the first throttled answer: each later one waits it out
                resp = await cl.request(MetadataRequest(topics=None))
                out.append(resp.throttle_time_ms)
                if resp.throttle_time_ms:
                    break
            return out

    try:
        throttles = asyncio.run(hammer())
        assert max(throttles) > 0, throttles  # 0.01% of a thread is a few microseconds a second
    finally:
        assert alter(kadmin, [(entity(client_id="busy"), {"request_percentage": None})]) == [(0, None)]


def test_describe_topic_partitions_carries_the_chunk_fields(cluster: Cluster, tmp_path) -> None:
    """kafka-python leaves Strata's tagged fields alone; our own codec reads them (tags 1000, 1001)."""
    p = Producer({"bootstrap.servers": cluster.bootstrap})
    for i in range(5):
        p.produce("dtp-chunked", f"r{i}".encode())
    p.flush(30)
    spec = tmp_path / "chunk.json"
    spec.write_text('{"partitions": [{"topic": "dtp-chunked", "partition": 0, "replicas": [2, 1]}]}')
    r = subprocess.run([installed_script("kafka-chunks.sh"), "create", "--create-chunk-json-file", str(spec),
                        "--bootstrap-server", cluster.bootstrap], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    host, port = cluster.bootstrap.split(",")[0].rsplit(":", 1)
    T = DescribeTopicPartitionsRequest.TopicRequest

    async def ask():
        async with NodeClient(host, int(port), client_id="dtp") as cl:
            return await cl.request(DescribeTopicPartitionsRequest(topics=[T(name="dtp-chunked")]))

    deadline = time.monotonic() + 30
    while True:
        [part] = asyncio.run(ask()).topics[0].partitions
        if part.chunks or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert part.start_offset == 5 and [(c.start_offset, c.stop_offset) for c in part.chunks] == [(0, 4)]
    assert part.leader_id == 2 and sorted(part.chunks[0].replica_nodes) == [1, 2]
