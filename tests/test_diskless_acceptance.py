"""Diskless topics end to end: aiokafka, kafka-python and confluent-kafka produce 100,000 keyed messages each to a
6-partition diskless topic through all 3 brokers (each client bootstrapping from a different
broker, each named leader by its client id) and read them back through every broker: every
message once, per-partition order as acknowledged; on the local store and on SeaweedFS (S3).
Also: a corrupt batch refused with nothing uploaded, ListOffsets (transactions:
test_diskless_transactions.py)."""

from __future__ import annotations

import asyncio
import os
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.s3_server import SeaweedS3, s3_server  # noqa: F401
from tools.cluster import Cluster

N = 100_000  # per client, as the issue asks
LINGER_MS = 50  # the clients batch: a WAL file (50 ms here) takes few large requests
BATCH_BYTES = 1024 * 1024
PARTITIONS = 6
TOPIC = "dl"
RACKS = {1: "r1", 2: "r2", 3: "r3"}
CONTROLLER = {"diskless.metadata.topic.num.partitions": "3"}  # it maps partitions to coordinators


def _overrides(store: str, s3: SeaweedS3 | None, tmp: Path) -> dict[str, str]:
    out = {"diskless.metadata.topic.num.partitions": "3", "diskless.wal.max.ms": "50"}
    if store == "s3":
        assert s3 is not None
        out.update({"diskless.storage.url": f"s3://{s3.bucket}/wal", "diskless.storage.s3.endpoint": s3.endpoint,
                    "diskless.storage.s3.region": "us-east-1"})
    else:
        out["diskless.storage.url"] = f"file://{tmp / 'objects'}"  # shared by the brokers, as a bucket is
    return out


@pytest.fixture(params=["local", "s3"])
def diskless_cluster(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    s3 = None
    if request.param == "s3":
        s3 = request.getfixturevalue("s3_server")
        for k, v in s3.env().items():
            monkeypatch.setenv(k, v)  # the brokers inherit them (obstore reads AWS_*)
    c = Cluster(tmp_path / "cluster", brokers=3, broker_overrides=_overrides(request.param, s3, tmp_path),
                controller_overrides=CONTROLLER, per_broker_overrides={b: {"broker.rack": r} for b, r in RACKS.items()})
    try:
        c.start()
        _create_topic(c.bootstrap)
        yield c
    finally:
        c.stop()


def _create_topic(bootstrap: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    fs = admin.create_topics([NewTopic(TOPIC, num_partitions=PARTITIONS, replication_factor=1,
                                       config={"diskless.enable": "true"})], operation_timeout=30)
    fs[TOPIC].result(60)


def _messages(tag: str) -> list[tuple[bytes, bytes]]:
    return [(f"{tag}-k{i % 97}".encode(), f"{tag}-{i}".encode()) for i in range(N)]


def _confluent(bootstrap: str, client_id: str) -> dict[int, list[tuple[int, bytes]]]:
    from confluent_kafka import Producer

    acked: dict[int, list[tuple[int, bytes]]] = defaultdict(list)

    def on_delivery(err: Any, msg: Any) -> None:
        assert err is None, err
        acked[msg.partition()].append((msg.offset(), msg.value()))

    p = Producer({"bootstrap.servers": bootstrap, "client.id": client_id, "linger.ms": LINGER_MS, "acks": "all",
                  "enable.idempotence": True, "batch.size": BATCH_BYTES})
    for k, v in _messages("confluent"):
        while True:
            try:
                p.produce(TOPIC, value=v, key=k, on_delivery=on_delivery)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(120) == 0
    return acked


def _kafka_python(bootstrap: str, client_id: str) -> dict[int, list[tuple[int, bytes]]]:
    from kafka import KafkaProducer

    p = KafkaProducer(bootstrap_servers=bootstrap, client_id=client_id, linger_ms=LINGER_MS, acks="all",
                      enable_idempotence=False, max_in_flight_requests_per_connection=1, batch_size=BATCH_BYTES)
    futs = [(v, p.send(TOPIC, value=v, key=k)) for k, v in _messages("kafka-python")]
    p.flush(120)
    acked: dict[int, list[tuple[int, bytes]]] = defaultdict(list)
    for v, f in futs:
        md = f.get(60)
        acked[md.partition].append((md.offset, v))
    p.close(10)
    return acked


def _aiokafka(bootstrap: str, client_id: str) -> dict[int, list[tuple[int, bytes]]]:
    from aiokafka import AIOKafkaProducer

    async def run() -> dict[int, list[tuple[int, bytes]]]:
        p = AIOKafkaProducer(bootstrap_servers=bootstrap, client_id=client_id, linger_ms=LINGER_MS, acks="all",
                             enable_idempotence=True, max_batch_size=BATCH_BYTES)
        await p.start()
        try:
            futs = [(v, await p.send(TOPIC, value=v, key=k)) for k, v in _messages("aiokafka")]
            acked: dict[int, list[tuple[int, bytes]]] = defaultdict(list)
            for v, f in futs:
                md = await f
                acked[md.partition].append((md.offset, v))
            return acked
        finally:
            await p.stop()

    return asyncio.run(run())


def _read_all(bootstrap: str, client_id: str, expected: int) -> dict[int, list[tuple[int, bytes]]]:
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(bootstrap_servers=bootstrap, client_id=client_id, enable_auto_commit=False,
                      auto_offset_reset="earliest", fetch_max_wait_ms=200, max_partition_fetch_bytes=BATCH_BYTES * 4)
    c.assign([TopicPartition(TOPIC, i) for i in range(PARTITIONS)])
    c.seek_to_beginning()
    got: dict[int, list[tuple[int, bytes]]] = defaultdict(list)
    deadline = time.time() + 120
    count = 0
    while count < expected and time.time() < deadline:
        for tp, recs in c.poll(timeout_ms=500, max_records=10000).items():
            got[tp.partition].extend((r.offset, r.value) for r in recs)
            count += len(recs)
    c.close()
    return got


def _read_confluent(bootstrap: str, client_id: str, expected: int) -> dict[int, list[tuple[int, bytes]]]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "client.id": client_id, "group.id": f"g-{client_id}",
                  "enable.auto.commit": False, "fetch.wait.max.ms": 200})
    c.assign([TopicPartition(TOPIC, i, 0) for i in range(PARTITIONS)])
    got: dict[int, list[tuple[int, bytes]]] = defaultdict(list)
    deadline = time.time() + 120
    count = 0
    while count < expected and time.time() < deadline:
        for m in c.consume(10000, 0.5):
            assert m.error() is None, m.error()
            got[m.partition()].append((m.offset(), m.value()))
            count += 1
    c.close()
    return got


def _leader_seen(bootstrap: str, client_id: str) -> set[int]:
    from kafka import KafkaConsumer

    c = KafkaConsumer(bootstrap_servers=bootstrap, client_id=client_id)
    try:
        c.topics()
        return {c._client.cluster.leader_for_partition(tp) for tp in
                [__import__("kafka").TopicPartition(TOPIC, i) for i in range(PARTITIONS)]}
    finally:
        c.close()


def test_three_clients_through_every_broker(diskless_cluster: Cluster) -> None:
    c = diskless_cluster
    boots = {b: f"127.0.0.1:{c.broker_port(b)}" for b in (1, 2, 3)}
    producers = {"confluent": (_confluent, 1), "kafka-python": (_kafka_python, 2), "aiokafka": (_aiokafka, 3)}
    acked: dict[int, list[tuple[int, bytes]]] = defaultdict(list)
    for name, (fn, broker) in producers.items():
        # the client id names the rack of the broker it should write through
        for part, rows in fn(boots[broker], f"{name}-diskless_az={RACKS[broker]}").items():
            acked[part].extend(rows)
    total = sum(len(v) for v in acked.values())
    assert total == 3 * N
    for part, rows in acked.items():
        offsets = sorted(o for o, _ in rows)
        assert offsets == list(range(len(offsets))), f"partition {part}: offsets not contiguous"
    expected = {p: sorted(rows) for p, rows in acked.items()}
    for b in (1, 2, 3):
        reader = f"reader-diskless_az={RACKS[b]}"
        assert _leader_seen(boots[b], reader) == {b}  # Metadata sends this reader to broker b
        got = _read_all(boots[b], reader, total)
        assert {p: rows for p, rows in got.items()} == expected, f"read through broker {b} differs"
    got = _read_confluent(boots[3], f"creader-diskless_az={RACKS[3]}", total)  # librdkafka's reader too
    assert {p: rows for p, rows in got.items()} == expected, "read with confluent-kafka differs"


def test_bad_input(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the local store: a corrupt batch gets CORRUPT_MESSAGE and nothing is uploaded;
    ListOffsets answers."""
    c = Cluster(tmp_path / "cluster", brokers=3, broker_overrides=_overrides("local", None, tmp_path),
                controller_overrides=CONTROLLER)
    try:
        c.start()
        _create_topic(c.bootstrap)
        asyncio.run(_bad_input(c, tmp_path / "objects"))
    finally:
        c.stop()


async def _bad_input(c: Cluster, objects: Path) -> None:
    from node.client import NodeClient
    from protocol.errors import Errors
    from protocol.generated.list_offsets import ListOffsetsRequest as LR
    from protocol.generated.produce import ProduceRequest as PR
    from protocol.records import Record, encode_batch

    good = bytearray(encode_batch([Record(key=b"k", value=b"v", timestamp=1)], base_timestamp=1))
    bad = bytearray(good)
    bad[-1] ^= 0xFF  # CRC no longer matches
    async with NodeClient("127.0.0.1", c.broker_port(2)) as cl:
        def req(data: bytes) -> PR:
            return PR(acks=-1, timeout_ms=10000, topic_data=[PR.TopicProduceData(name=TOPIC, partition_data=[
                PR.PartitionProduceData(index=0, records=bytes(data))])])

        before = sorted(objects.rglob("*")) if objects.exists() else []
        r = await cl.request(req(bad), 9)
        assert r.responses[0].partition_responses[0].error_code == Errors.CORRUPT_MESSAGE
        await asyncio.sleep(0.3)
        assert (sorted(objects.rglob("*")) if objects.exists() else []) == before  # nothing uploaded
        deadline = time.monotonic() + 30
        while True:  # the coordinators come up with the first diskless topic: retriable until then
            r = await cl.request(req(good), 9)
            pr = r.responses[0].partition_responses[0]
            if pr.error_code != Errors.NOT_LEADER_OR_FOLLOWER or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        assert (pr.error_code, pr.base_offset) == (0, 0)
        r = await cl.request(req(good), 9)
        assert r.responses[0].partition_responses[0].base_offset == 1
        lo = await cl.request(LR(replica_id=-1, topics=[LR.ListOffsetsTopic(name=TOPIC, partitions=[
            LR.ListOffsetsPartition(partition_index=0, timestamp=-1), ])]), 7)
        assert lo.topics[0].partitions[0].offset == 2
        assert any(f.is_file() for f in objects.rglob("*"))
        # pipelined produce requests on one connection do not wait for each other's file (the
        # connection's turn is released once appended): they share files, answered in order
        files = {f for f in objects.rglob("*") if f.is_file()}
        rs = await asyncio.gather(*(cl.request(req(good), 9) for _ in range(5)))
        assert [r.responses[0].partition_responses[0].base_offset for r in rs] == [2, 3, 4, 5, 6]
        assert len({f for f in objects.rglob("*") if f.is_file()} - files) < 5
    assert os.path.isdir(objects)


def test_object_store_down(s3_server: SeaweedS3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """S3 down: a diskless produce gets a retriable error and nothing is acknowledged; the same
    broker keeps serving a classic topic; once S3 is back, writes go through again."""
    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    c = Cluster(tmp_path / "cluster", brokers=1, broker_overrides=_overrides("s3", s3_server, tmp_path),
                controller_overrides=CONTROLLER)
    try:
        c.start()
        _create_topic(c.bootstrap)
        asyncio.run(_store_down(c, s3_server))
    finally:
        c.stop()


async def _store_down(c: Cluster, s3: SeaweedS3) -> None:
    from node.client import NodeClient
    from protocol.errors import Errors
    from protocol.generated.create_topics import CreateTopicsRequest as CT
    from protocol.generated.produce import ProduceRequest as PR
    from protocol.records import Record, encode_batch

    batch = encode_batch([Record(key=b"k", value=b"v", timestamp=1)], base_timestamp=1)

    def req(topic: str) -> PR:
        return PR(acks=-1, timeout_ms=10000, topic_data=[PR.TopicProduceData(name=topic, partition_data=[
            PR.PartitionProduceData(index=0, records=batch)])])

    async with NodeClient("127.0.0.1", c.broker_port(1), timeout=60) as cl:
        r = await cl.request(CT(topics=[CT.CreatableTopic(name="classic", num_partitions=1, replication_factor=1)],
                                timeout_ms=30000))
        assert r.topics[0].error_code == 0
        deadline = time.monotonic() + 30
        while True:
            pr = (await cl.request(req(TOPIC), 9)).responses[0].partition_responses[0]
            if pr.error_code == 0 or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        assert pr.error_code == 0
        s3.stop()
        pr = (await cl.request(req(TOPIC), 9)).responses[0].partition_responses[0]
        assert pr.error_code == Errors.KAFKA_STORAGE_ERROR and pr.base_offset == -1, pr  # retriable
        pr = (await cl.request(req("classic"), 9)).responses[0].partition_responses[0]
        assert (pr.error_code, pr.base_offset) == (0, 0)
        s3.start()
        pr = (await cl.request(req(TOPIC), 9)).responses[0].partition_responses[0]
        assert (pr.error_code, pr.base_offset) == (0, 1)
