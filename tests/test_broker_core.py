"""Broker and controller core against real processes and real clients:
broker restarts (SIGTERM, kill -9) lose no acknowledged message; a torn or garbage segment tail is
cut at the last whole batch; controller restarts keep topics, configs and registrations; retention
deletes whole old segments; ListOffsets by timestamp; a broker started before the controller;
a broker catching up from a controller snapshot; admin errors with Kafka's codes and a message a
human understands."""

from __future__ import annotations

import asyncio
import collections
import re
import shutil
import struct
import time
from pathlib import Path

import pytest

from node.client import NodeClient
from tests.conftest import FAST_FENCING, wait_for
from tools.cluster import CONTROLLER, Cluster

# ------------------------------------------------------------------------------------ helpers


def node_request(host: str, port: int, body, version: int | None = None):
    """One request on a fresh NodeClient connection (our raw protocol client)."""

    async def go():
        async with NodeClient(host, port, timeout=15) as c:
            return await c.request(body, version)

    return asyncio.run(go())


def admin(bootstrap: str):
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": bootstrap})


def create_topic(bootstrap: str, name: str, partitions: int = 3, rf: int = 1, config: dict | None = None) -> None:
    from confluent_kafka.admin import NewTopic

    a = admin(bootstrap)  # held until the future is done: a collected AdminClient never completes it
    fs = a.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=rf, config=config or {})], operation_timeout=30
    )
    fs[name].result(30)


def produce(bootstrap: str, topic: str, values: list[bytes], *, acks: str = "all", partition: int | None = None,
            timestamps: list[int] | None = None, **conf) -> list[tuple[int, int, bytes]]:
    """Produce with confluent-kafka; returns (partition, offset, value) of each acknowledged message."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "acks": acks, "linger.ms": 5, "message.timeout.ms": 60000, **conf})
    acked: list[tuple[int, int, bytes]] = []
    failed: list = []

    def on_delivery(err, m):
        if err is None:
            acked.append((m.partition(), m.offset(), m.value()))
        else:
            failed.append(err)

    for i, v in enumerate(values):
        kwargs = {}
        if partition is not None:
            kwargs["partition"] = partition
        if timestamps is not None:
            kwargs["timestamp"] = timestamps[i]
        while True:
            try:
                p.produce(topic, value=v, on_delivery=on_delivery, **kwargs)
                break
            except BufferError:
                p.poll(0.05)
        if i % 1000 == 0:
            p.poll(0)
    assert p.flush(90) == 0, "messages still in flight after 90s"
    assert not failed, failed[:5]
    return acked


def watermarks(bootstrap: str, topic: str, partitions: int) -> dict[int, tuple[int, int]]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "watermarks"})
    try:
        return {i: c.get_watermark_offsets(TopicPartition(topic, i), timeout=15) for i in range(partitions)}
    finally:
        c.close()


def consume_all(bootstrap: str, topic: str, partitions: int, *, start: dict[int, int] | None = None,
                timeout: float = 60) -> dict[int, list[tuple[int, bytes]]]:
    """Every message from `start` (default: earliest) up to the high watermark, per partition."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    marks = watermarks(bootstrap, topic, partitions)
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{topic}", "enable.auto.commit": False,
                  "auto.offset.reset": "error"})
    got: dict[int, list[tuple[int, bytes]]] = {i: [] for i in range(partitions)}
    try:
        c.assign([TopicPartition(topic, i, (start or {}).get(i, OFFSET_BEGINNING)) for i in range(partitions)])
        todo = {i for i in range(partitions) if marks[i][1] > (start or {}).get(i, marks[i][0])}
        deadline = time.monotonic() + timeout
        while todo and time.monotonic() < deadline:
            for m in c.consume(10000, 0.5):
                assert m.error() is None, m.error()
                got[m.partition()].append((m.offset(), m.value()))
                if m.offset() >= marks[m.partition()][1] - 1:
                    todo.discard(m.partition())
        assert not todo, f"partitions {sorted(todo)} not read to their high watermark {marks} in {timeout}s"
    finally:
        c.close()
    return got


def check_exactly_once(acked: list[tuple[int, int, bytes]], got: dict[int, list[tuple[int, bytes]]]) -> None:
    """Every acknowledged message is there exactly once, where it was acknowledged, and each
    partition's offsets are contiguous from 0."""
    for p, msgs in got.items():
        offsets = [o for o, _ in msgs]
        assert offsets == list(range(len(offsets))), f"partition {p}: offsets not contiguous from 0"
    counts = collections.Counter(v for msgs in got.values() for _, v in msgs)
    dup = [v for v, n in counts.items() if n > 1]
    assert not dup, f"{len(dup)} messages read more than once, e.g. {dup[:3]}"
    where = {(p, o): v for p, msgs in got.items() for o, v in msgs}
    missing = [(p, o, v) for p, o, v in acked if where.get((p, o)) != v]
    assert not missing, f"{len(missing)} acknowledged messages lost or moved, e.g. {missing[:3]}"


def log_text(c: Cluster, node) -> str:
    return c.log_path(node).read_text(errors="replace")



def replica_dir(c: Cluster, broker: int, topic: str, partition: int, chunk_start: int = 0) -> Path:
    dirs = [d for d in c.node_dir(broker).glob(f"logs-*/{topic}-{partition}-{chunk_start}") if d.is_dir()]
    assert len(dirs) == 1, f"replica dir of {topic}-{partition} on broker {broker}: {dirs}"
    return dirs[0]


def batches_in(segment: Path) -> list[tuple[int, int, int, int]]:
    """(position, size, base offset, last offset) of every whole batch in a segment file."""
    data = segment.read_bytes()
    out, pos = [], 0
    while pos + 61 <= len(data):
        base, length = struct.unpack_from(">qi", data, pos)
        size = 12 + length
        if pos + size > len(data):
            break
        (last_delta,) = struct.unpack_from(">i", data, pos + 23)
        out.append((pos, size, base, base + last_delta))
        pos += size
    assert pos == len(data), f"{segment} does not end on a batch boundary"
    return out


def leader_of(bootstrap: str, topic: str) -> dict[int, int]:
    md = admin(bootstrap).list_topics(topic, timeout=15)
    return {p: info.leader for p, info in md.topics[topic].partitions.items()}


# ----------------------------------------------------------------- 1. broker restart, no loss
N_RESTART = 20_000


@pytest.mark.slow
@pytest.mark.parametrize("acks", ["all", "1"])
@pytest.mark.parametrize("how", ["sigterm", "kill9"])
def test_broker_restart_keeps_every_acknowledged_message(cluster_factory, how, acks):
    c = cluster_factory(brokers=3, broker_overrides=FAST_FENCING, controller_overrides=FAST_FENCING)
    topic = f"restart-{how}-{acks}"
    create_topic(c.bootstrap, topic, partitions=3)
    assert set(leader_of(c.bootstrap, topic).values()) == {1, 2, 3}, "expected one partition per broker"
    acked = produce(c.bootstrap, topic, [f"{topic}-a-{i}".encode() for i in range(N_RESTART)], acks=acks)
    assert len(acked) == N_RESTART
    before = watermarks(c.bootstrap, topic, 3)
    for b in c.broker_ids:  # each broker in turn, right after the acknowledgements
        c.restart(b, hard=how == "kill9")
    after = watermarks(c.bootstrap, topic, 3)
    assert after == before, f"high watermarks changed across the restart: {before} -> {after}"
    # new produces continue right after the old ones
    acked += produce(c.bootstrap, topic, [f"{topic}-b-{i}".encode() for i in range(N_RESTART // 4)], acks=acks)
    for p, o, _ in acked[N_RESTART:]:
        assert o >= before[p][1]
    # and a second round of restarts, all brokers at once this time
    for b in c.broker_ids:
        if how == "kill9":
            c.kill(b)
        else:
            c.terminate(b)
    for b in c.broker_ids:
        c.start_node(b, wait=False)
    for b in c.broker_ids:
        wait_for(lambda b=b: c.is_running(b) and _broker_ready(c, b), 60, f"broker {b} to come back")
    got = consume_all(c.bootstrap, topic, 3)
    assert sum(len(m) for m in got.values()) == len(acked)
    check_exactly_once(acked, got)
    if how == "kill9":  # each broker recovered its logs: no clean-shutdown marker after a kill
        for b in c.broker_ids:
            assert "clean_shutdown=False" in log_text(c, b)


def _broker_ready(c: Cluster, b: int) -> bool:
    from protocol.generated.metadata import MetadataRequest

    try:
        md = node_request(c.host, c.broker_port(b), MetadataRequest(topics=None))
    except Exception:
        return False
    return {x.node_id for x in md.brokers} == set(c.broker_ids)


# -------------------------------------------------------------------------------- 2. torn tail
def test_torn_and_garbage_tails_are_cut_at_the_last_whole_batch(cluster_factory):
    c = cluster_factory(brokers=1, broker_overrides=FAST_FENCING, controller_overrides=FAST_FENCING)
    topic = "torn"
    create_topic(c.bootstrap, topic, partitions=3)
    values = {p: [] for p in range(3)}
    for rnd in range(8):  # 8 batches per partition (a flush between rounds)
        for p in range(3):
            vs = [f"p{p}-r{rnd}-m{i}".encode() for i in range(25)]
            produce(c.bootstrap, topic, vs, partition=p, acks="1", **{"batch.num.messages": 100})
            values[p] += vs
    end = {p: hw for p, (_, hw) in watermarks(c.bootstrap, topic, 3).items()}
    assert end == {0: 200, 1: 200, 2: 200}
    c.kill(1)

    seg0 = replica_dir(c, 1, topic, 0) / "00000000000000000000.log"
    seg1 = replica_dir(c, 1, topic, 1) / "00000000000000000000.log"
    b0 = batches_in(seg0)
    assert len(b0) >= 2
    last_pos, last_size, last_base, _ = b0[-1]
    with open(seg0, "r+b") as f:  # partition 0: the last batch torn mid-way
        f.truncate(last_pos + last_size - 7)
    garbage = b"\x00\x00\x00\x00\x00\x00\x00\xc8\x00\x00\x01\x00not a record batch at all" + bytes(range(200))
    with open(seg1, "ab") as f:  # partition 1: garbage after the last whole batch
        f.write(garbage)
    size1 = seg1.stat().st_size

    c.start_node(1)
    expected_end = {0: last_base, 1: 200, 2: 200}
    marks = watermarks(c.bootstrap, topic, 3)
    assert {p: hw for p, (_, hw) in marks.items()} == expected_end
    assert seg0.stat().st_size == last_pos, "the torn batch is still in the segment file"
    assert seg1.stat().st_size == size1 - len(garbage), "the garbage is still in the segment file"
    got = consume_all(c.bootstrap, topic, 3)
    for p in range(3):
        assert [o for o, _ in got[p]] == list(range(expected_end[p]))
        assert [v for _, v in got[p]] == values[p][: expected_end[p]]
    text = log_text(c, 1)
    truncations = [line for line in text.splitlines() if "log_truncated_on_recovery" in line]
    assert any(f"{topic}-0-0" in line for line in truncations), truncations
    assert any(f"{topic}-1-0" in line for line in truncations), truncations
    assert not any(f"{topic}-2-0" in line for line in truncations), truncations
    # new produces continue at the right offset
    for p in range(3):
        acked = produce(c.bootstrap, topic, [f"p{p}-after".encode()], partition=p)
        assert acked[0][1] == expected_end[p], (p, acked)
    got = consume_all(c.bootstrap, topic, 3)
    for p in range(3):
        assert got[p][-1] == (expected_end[p], f"p{p}-after".encode())
        assert [o for o, _ in got[p]] == list(range(expected_end[p] + 1))


# ------------------------------------------------------------------------- 3. controller restart
def describe_topic_configs(bootstrap: str, topic: str) -> dict[str, str]:
    from confluent_kafka.admin import ConfigResource

    res = ConfigResource(ConfigResource.Type.TOPIC, topic)
    a = admin(bootstrap)
    entries = a.describe_configs([res])[res].result(30)
    return {k: e.value for k, e in entries.items()}


def describe_topic_configs_on(c: Cluster, broker: int, topic: str) -> dict[str, tuple[str, int]]:
    """DescribeConfigs asked of one broker (NodeClient): name -> (value, source)."""
    from protocol.generated.describe_configs import DescribeConfigsRequest as D

    resp = node_request(c.host, c.broker_port(broker), D(resources=[D.DescribeConfigsResource(
        resource_type=2, resource_name=topic, configuration_keys=None)]))
    r = resp.results[0]
    assert r.error_code == 0, r
    return {e.name: (e.value, e.config_source) for e in r.configs}


@pytest.mark.parametrize("how", ["sigterm", "kill9"])
def test_controller_restart_keeps_topics_configs_and_registrations(cluster_factory, how):
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource
    from kafka.admin import ConfigResource as KPConfigResource
    from kafka.admin import ConfigResourceType, KafkaAdminClient

    from protocol.generated.describe_cluster import DescribeClusterRequest
    from protocol.generated.metadata import MetadataRequest

    c = cluster_factory(brokers=3)
    create_topic(c.bootstrap, "ctl-a", partitions=3, config={"retention.ms": "7200000"})
    create_topic(c.bootstrap, "ctl-b", partitions=2, rf=2)
    # IncrementalAlterConfigs (confluent-kafka) on ctl-a, AlterConfigs (kafka-python) on ctl-b
    res = ConfigResource(ConfigResource.Type.TOPIC, "ctl-a", incremental_configs=[
        ConfigEntry("max.message.bytes", "200000", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.SET),
    ])
    a = admin(c.bootstrap)
    a.incremental_alter_configs([res])[res].result(30)
    kp = KafkaAdminClient(bootstrap_servers=c.bootstrap, request_timeout_ms=30000)
    try:
        kp.alter_configs([KPConfigResource(ConfigResourceType.TOPIC, "ctl-b",
                                           configs={"segment.bytes": "1048576", "retention.bytes": "5000000"})])
    finally:
        kp.close()
    wanted = {
        "ctl-a": {"retention.ms": "7200000", "max.message.bytes": "200000", "cleanup.policy": "compact"},
        "ctl-b": {"segment.bytes": "1048576", "retention.bytes": "5000000"},
    }
    for t, cfg in wanted.items():
        got = describe_topic_configs(c.bootstrap, t)
        assert {k: got[k] for k in cfg} == cfg, t
    md_before = node_request(c.host, c.broker_port(1), MetadataRequest(topics=None))
    topics_before = {t.name: (t.topic_id, {p.partition_index: tuple(p.replica_nodes) for p in t.partitions})
                     for t in md_before.topics}
    assert set(topics_before) == {"ctl-a", "ctl-b"}

    if how == "kill9":
        c.kill(CONTROLLER)
    else:
        c.terminate(CONTROLLER)
    c.start_node(CONTROLLER)

    # registrations came back from the controller's log, before any broker re-registers
    dc = node_request(c.host, c.controller_port, DescribeClusterRequest(include_fenced_brokers=True), 2)
    assert {b.broker_id for b in dc.brokers} == {1, 2, 3}
    assert all(b.port == c.broker_port(b.broker_id) for b in dc.brokers)

    # the brokers carry on with the same registration (their heartbeats are accepted)
    def all_unfenced():
        r = node_request(c.host, c.controller_port, DescribeClusterRequest(include_fenced_brokers=True), 2)
        return {b.broker_id for b in r.brokers if not b.is_fenced} == {1, 2, 3}

    wait_for(all_unfenced, 30, "every broker unfenced after the controller restart")
    for b in c.broker_ids:
        text = log_text(c, b)
        assert text.count("event='broker_registered'") == 1, f"broker {b} had to register again"
        assert "heartbeat_stale_epoch" not in text

    # a new topic can be created and used
    create_topic(c.bootstrap, "ctl-new", partitions=3)
    acked = produce(c.bootstrap, "ctl-new", [f"new-{i}".encode() for i in range(300)])
    check_exactly_once(acked, consume_all(c.bootstrap, "ctl-new", 3))

    # a broker restarted now rebuilds its image from the restarted controller's log alone
    c.restart(2)
    md = node_request(c.host, c.broker_port(2), MetadataRequest(topics=None))
    topics_after = {t.name: (t.topic_id, {p.partition_index: tuple(p.replica_nodes) for p in t.partitions})
                    for t in md.topics}
    assert {k: topics_after[k] for k in topics_before} == topics_before
    assert "ctl-new" in topics_after
    # confluent-kafka's all-topics Metadata (v13, with 3 stray bytes at the end) is answered
    listed = admin(c.bootstrap).list_topics(timeout=15).topics
    assert {"ctl-a", "ctl-b", "ctl-new"} <= set(listed)
    assert len(listed["ctl-a"].partitions) == 3 and len(listed["ctl-b"].partitions) == 2
    for t, cfg in wanted.items():
        got = describe_topic_configs_on(c, 2, t)
        assert {k: got[k][0] for k in cfg} == cfg, t
        assert all(got[k][1] == 1 for k in cfg), "expected DYNAMIC_TOPIC_CONFIG as the source"
        got = describe_topic_configs(c.bootstrap, t)
        assert {k: got[k] for k in cfg} == cfg, t


# ------------------------------------------------------------------------------- 4. retention
@pytest.mark.parametrize("by", ["time", "size"])
def test_retention_deletes_whole_old_segments(cluster_factory, by):
    c = cluster_factory(brokers=1, broker_overrides={"log.retention.check.interval.ms": 500})
    topic = f"retention-{by}"
    cfg = {"segment.bytes": "2000", "file.delete.delay.ms": "0"}
    if by == "time":
        cfg["retention.ms"] = "60000"
        ts0 = int(time.time() * 1000) - 3_600_000  # an hour old: past retention.ms from the start
    else:
        cfg["retention.bytes"] = "6000"
        ts0 = int(time.time() * 1000)
    create_topic(c.bootstrap, topic, partitions=1, config=cfg)
    values = [f"{by}-{i:05d}-".encode() + b"x" * 60 for i in range(400)]
    produce(c.bootstrap, topic, values, partition=0, timestamps=[ts0 + i for i in range(400)],
            **{"batch.num.messages": 10, "linger.ms": 0})
    d = replica_dir(c, 1, topic, 0)
    marks = watermarks(c.bootstrap, topic, 1)[0]
    assert marks[1] == 400

    def deleted():
        lo = watermarks(c.bootstrap, topic, 1)[0][0]
        names = sorted(d.glob("*.log"))
        # by size: a retention round that ran while the records were still coming deleted some
        # segments already (lo > 0) with more to go; wait for the round after the last append
        done = len(names) == 1 if by == "time" else sum(p.stat().st_size for p in names) <= 6000 + 2000
        return (lo, names) if lo > 0 and done else None

    lo, names = wait_for(deleted, 30, "retention to delete segments")
    active = max(int(p.stem) for p in names)
    bases = sorted(int(p.stem) for p in names)
    assert lo == bases[0], "the earliest offset is the base of the oldest remaining segment"
    if by == "time":
        # every segment is older than retention.ms, the active one too: as Kafka, a new empty
        # active segment is rolled and all the old ones go
        assert bases == [active] == [400], bases
    else:
        total = sum(p.stat().st_size for p in names)
        assert total <= 6000 + 2000, f"{total} bytes left with retention.bytes=6000"
        assert len(names) >= 2
    wait_for(lambda: not list(d.glob("*.deleted")), 10, ".deleted files to be purged")
    for base in range(0, lo):
        assert not (d / f"{base:020d}.log").exists()
    deletions = [line for line in log_text(c, 1).splitlines() if "event='segment_deleted'" in line]
    reason = "reason='retention.ms'" if by == "time" else "reason='retention.bytes'"
    assert len(deletions) >= 3 and all(reason in line for line in deletions), deletions[:3]
    got = consume_all(c.bootstrap, topic, 1)[0]
    assert [o for o, _ in got] == list(range(lo, 400))
    assert [v for _, v in got] == values[lo:]
    # ListOffsets earliest says the same
    from protocol.generated.list_offsets import ListOffsetsRequest as L

    r = node_request(c.host, c.broker_port(1), L(replica_id=-1, topics=[L.ListOffsetsTopic(
        name=topic, partitions=[L.ListOffsetsPartition(partition_index=0, timestamp=-2)])]))
    assert r.topics[0].partitions[0].offset == lo


# ---------------------------------------------------------------- 5. ListOffsets by timestamp
def test_list_offsets_by_timestamp(cluster_factory):
    from confluent_kafka import Consumer, TopicPartition
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP

    from protocol.generated.list_offsets import ListOffsetsRequest as L

    c = cluster_factory(brokers=1)
    topic = "by-time"
    # small segments so the search crosses segment and batch boundaries
    create_topic(c.bootstrap, topic, partitions=2, config={"segment.bytes": "1500"})
    t0 = 1_700_000_000_000
    n = 100
    for k in range(10):  # ten batches of ten
        idx = range(k * 10, k * 10 + 10)
        produce(c.bootstrap, topic, [f"m{i}".encode() for i in idx], partition=0,
                timestamps=[t0 + i * 1000 for i in idx], **{"linger.ms": 0})
    # partition 1: the largest timestamp sits in the middle
    ts1 = [t0 + i * 1000 for i in range(20)]
    ts1[7] = t0 + 500_000
    produce(c.bootstrap, topic, [f"q{i}".encode() for i in range(20)], partition=1, timestamps=ts1)
    assert len(list(replica_dir(c, 1, topic, 0).glob("*.log"))) > 1

    cases = {
        t0 - 5000: 0,  # before the first
        t0: 0,
        t0 + 37_000: 37,  # exact, mid-batch
        t0 + 37_001: 38,  # between
        t0 + 40_000: 40,  # first record of a batch
        t0 + 39_500: 40,  # between two batches
        t0 + 99_000: 99,  # the last
        t0 + 99_001: None,  # after the last
    }
    cons = Consumer({"bootstrap.servers": c.bootstrap, "group.id": "times"})
    try:
        for ts, want in cases.items():
            [tp] = cons.offsets_for_times([TopicPartition(topic, 0, ts)], timeout=15)
            assert tp.error is None
            assert tp.offset == (-1 if want is None else want), (ts - t0, tp)
        both = cons.offsets_for_times([TopicPartition(topic, 0, t0 + 55_500), TopicPartition(topic, 1, t0 + 3_000)],
                                      timeout=15)
        assert sorted((tp.partition, tp.offset) for tp in both) == [(0, 56), (1, 3)]
    finally:
        cons.close()
    kc = KafkaConsumer(bootstrap_servers=c.bootstrap, request_timeout_ms=30000)
    try:
        for ts, want in cases.items():
            r = kc.offsets_for_times({KTP(topic, 0): ts})[KTP(topic, 0)]
            if want is None:
                assert r is None, (ts - t0, r)
            else:
                assert r is not None and r.offset == want, (ts - t0, r)
                assert r.timestamp == t0 + want * 1000
        # partition 1: first offset at or after t is the outlier for anything past offset 6's time
        r = kc.offsets_for_times({KTP(topic, 1): t0 + 10_000})[KTP(topic, 1)]
        assert r.offset == 7 and r.timestamp == t0 + 500_000
    finally:
        kc.close()

    def list_offsets(partition: int, ts: int):
        resp = node_request(c.host, c.broker_port(1), L(replica_id=-1, topics=[L.ListOffsetsTopic(
            name=topic, partitions=[L.ListOffsetsPartition(partition_index=partition, timestamp=ts)])]))
        pr = resp.topics[0].partitions[0]
        assert pr.error_code == 0, pr
        return pr.offset, pr.timestamp

    assert list_offsets(0, -1)[0] == n  # latest
    assert list_offsets(0, -2)[0] == 0  # earliest
    assert list_offsets(0, -3) == (n - 1, t0 + (n - 1) * 1000)  # max timestamp
    assert list_offsets(1, -3) == (7, t0 + 500_000)
    assert list_offsets(1, -1)[0] == 20
    assert list_offsets(0, t0 + 37_001) == (38, t0 + 38_000)
    assert list_offsets(0, t0 + 99_001)[0] == -1


# --------------------------------------------------------------- 6. broker before controller
def test_broker_started_before_controller_waits_for_it(cluster_factory):
    c = cluster_factory(brokers=2, start=False)
    c.write_configs()
    for b in c.broker_ids:
        c.start_node(b, wait=False)
    time.sleep(4)
    for b in c.broker_ids:
        assert c.is_running(b), f"broker {b} gave up without a controller:\n{log_text(c, b)[-2000:]}"
        assert "waiting_for_controller" in log_text(c, b)
    c.start_node(CONTROLLER)
    for b in c.broker_ids:
        wait_for(lambda b=b: _broker_ready(c, b), 60, f"broker {b} to come up after the controller")
    for b in c.broker_ids:
        assert "broker_started" in log_text(c, b)
        assert log_text(c, b).count("waiting_for_controller") <= 2, "the broker logs every retry"
    create_topic(c.bootstrap, "late-controller", partitions=2)
    acked = produce(c.bootstrap, "late-controller", [f"v{i}".encode() for i in range(500)])
    check_exactly_once(acked, consume_all(c.bootstrap, "late-controller", 2))


# ----------------------------------------------------------- 7. catching up from a snapshot
@pytest.mark.slow
def test_broker_catches_up_from_a_controller_snapshot(cluster_factory):
    from confluent_kafka.admin import NewTopic

    from protocol.generated.metadata import MetadataRequest

    c = cluster_factory(brokers=3, start=False,
                        controller_overrides={"metadata.log.max.record.bytes.between.snapshots": 2000})
    c.write_configs()
    c.start_node(CONTROLLER)
    c.start_node(1, wait=False)
    c.start_node(2, wait=False)
    for b in (1, 2):
        wait_for(lambda b=b: _ready_with(c, b, {1, 2}), 60, f"broker {b}")
    names = [f"snap-{i:02d}" for i in range(50)]
    a = admin(f"{c.host}:{c.broker_port(1)},{c.host}:{c.broker_port(2)}")
    for k in range(0, 50, 10):
        fs = a.create_topics([NewTopic(n, num_partitions=2, replication_factor=1) for n in names[k:k + 10]])
        for f in fs.values():
            f.result(30)
    snapdir = c.node_dir(CONTROLLER) / "metadata" / "__cluster_metadata-0"
    wait_for(lambda: list(snapdir.glob("*.checkpoint")), 30, "a controller snapshot")

    def log_truncated():  # the controller dropped the log the snapshot covers
        segs = sorted(int(p.stem) for p in snapdir.glob("*.log"))
        return segs and segs[0] > 0

    wait_for(log_truncated, 30, "the controller to delete log segments covered by the snapshot")

    # a brand-new broker: its image comes from the snapshot (FetchSnapshot) plus the log after it
    c.start_node(3)
    assert "metadata_snapshot_loaded" in log_text(c, 3)
    md = node_request(c.host, c.broker_port(3), MetadataRequest(topics=None))
    assert sorted(t.name for t in md.topics) == names
    assert all(len(t.partitions) == 2 and t.error_code == 0 for t in md.topics)

    # broker 2 with its data dirs wiped: back from the snapshot, serving its partitions
    c.terminate(2)
    for d in c.node_dir(2).glob("logs-*"):
        shutil.rmtree(d)
    c.start_node(2)
    assert log_text(c, 2).count("metadata_snapshot_loaded") >= 1
    md2 = node_request(c.host, c.broker_port(2), MetadataRequest(topics=None))
    assert sorted(t.name for t in md2.topics) == names
    led_by_2 = sorted({t.name for t in md2.topics if any(p.leader_id == 2 for p in t.partitions)})
    assert led_by_2, "no partition led by broker 2"
    for t in dict.fromkeys(led_by_2[:4] + names[:2]):
        acked = produce(c.bootstrap, t, [f"{t}-{i}".encode() for i in range(50)])
        check_exactly_once(acked, consume_all(c.bootstrap, t, 2))
    # and a topic created now lands on the new, least-loaded broker, which serves it
    create_topic(c.bootstrap, "after-snapshot", partitions=3)
    assert 3 in leader_of(c.bootstrap, "after-snapshot").values()
    acked = produce(c.bootstrap, "after-snapshot", [f"x{i}".encode() for i in range(300)])
    check_exactly_once(acked, consume_all(c.bootstrap, "after-snapshot", 3))


def _ready_with(c: Cluster, b: int, expected: set[int]) -> bool:
    from protocol.generated.metadata import MetadataRequest

    try:
        md = node_request(c.host, c.broker_port(b), MetadataRequest(topics=None))
    except Exception:
        return False
    return {x.node_id for x in md.brokers} == expected


# ------------------------------------------------------------------------------ 8. admin errors
BAD_CREATES = [
    # (name, partitions, rf, config, Kafka error name, words the message must contain)
    ("exists", 1, 1, {}, "TOPIC_ALREADY_EXISTS", ["exists"]),
    ("zero-partitions", 0, 1, {}, "INVALID_PARTITIONS", ["0"]),
    ("minus-five-partitions", -5, 1, {}, "INVALID_PARTITIONS", ["-5"]),
    ("rf-too-big", 1, 5, {}, "INVALID_REPLICATION_FACTOR", ["5"]),
    ("bad name!", 1, 1, {}, "INVALID_TOPIC_EXCEPTION", ["bad name!"]),
    ("x" * 250, 1, 1, {}, "INVALID_TOPIC_EXCEPTION", ["249"]),
    ("bad-config-value", 1, 1, {"retention.ms": "forever"}, "INVALID_CONFIG", ["retention.ms", "forever"]),
    ("unknown-config", 1, 1, {"no.such.config": "1"}, "INVALID_CONFIG", ["no.such.config"]),
]
CODES = {"TOPIC_ALREADY_EXISTS": 36, "INVALID_PARTITIONS": 37, "INVALID_REPLICATION_FACTOR": 38,
         "INVALID_TOPIC_EXCEPTION": 17, "INVALID_CONFIG": 40, "UNKNOWN_TOPIC_OR_PARTITION": 3}


@pytest.fixture(scope="module")
def no_autocreate_cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("admin-errors"), brokers=3,
                broker_overrides={"auto.create.topics.enable": "false"})
    c.start()
    create_topic(c.bootstrap, "exists", partitions=1)
    yield c
    c.stop()


def _is_human(msg: str | None) -> bool:
    return bool(msg) and len(msg) > 15 and " " in msg and re.search(r"[a-z]{4}", msg) is not None


@pytest.mark.parametrize("name,partitions,rf,config,error,words", BAD_CREATES, ids=[b[0][:20] for b in BAD_CREATES])
def test_create_topic_errors_confluent(no_autocreate_cluster, name, partitions, rf, config, error, words):
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import NewTopic

    c = no_autocreate_cluster
    a = admin(c.bootstrap)
    try:
        nt = NewTopic(name, num_partitions=partitions, replication_factor=rf, config=config)
        fut = a.create_topics([nt], operation_timeout=30)[name]
    except (ValueError, KafkaException) as e:  # librdkafka refuses it before sending (-5 partitions)
        assert partitions < 0, e
        return  # kafka-python's variant of this case reaches the broker
    with pytest.raises(KafkaException) as ei:
        fut.result(30)
    err = ei.value.args[0]
    assert err.code() == CODES[error], err
    msg = err.str()
    assert _is_human(msg), msg
    for w in words:
        assert w in msg, (w, msg)


@pytest.mark.parametrize("name,partitions,rf,config,error,words", BAD_CREATES, ids=[b[0][:20] for b in BAD_CREATES])
def test_create_topic_errors_kafka_python(no_autocreate_cluster, name, partitions, rf, config, error, words):
    import kafka.errors as KE
    from kafka.admin import KafkaAdminClient, NewTopic

    c = no_autocreate_cluster
    kp = KafkaAdminClient(bootstrap_servers=c.bootstrap, request_timeout_ms=30000)
    try:
        with pytest.raises(KE.BrokerResponseError) as ei:
            kp.create_topics([NewTopic(name, partitions, rf, topic_configs=config)], timeout_ms=30000)
    finally:
        kp.close()
    e = ei.value
    assert e.errno == CODES[error], e
    text = str(e)
    assert _is_human(text), text
    for w in words:
        assert w in text, (w, text)


def test_delete_unknown_topic(no_autocreate_cluster):
    import kafka.errors as KE
    from confluent_kafka import KafkaException
    from kafka.admin import KafkaAdminClient

    c = no_autocreate_cluster
    a = admin(c.bootstrap)
    fut = a.delete_topics(["no-such-topic"], operation_timeout=30)["no-such-topic"]
    with pytest.raises(KafkaException) as ei:
        fut.result(30)
    err = ei.value.args[0]
    assert err.code() == 3, err  # librdkafka's DeleteTopics version carries no error message
    kp = KafkaAdminClient(bootstrap_servers=c.bootstrap, request_timeout_ms=30000)
    try:
        with pytest.raises(KE.BrokerResponseError) as ki:
            kp.delete_topics(["no-such-topic"], timeout_ms=30000)
    finally:
        kp.close()
    assert ki.value.errno == 3 and "no-such-topic" in str(ki.value)


def test_alter_configs_errors(no_autocreate_cluster):
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

    c = no_autocreate_cluster
    a = admin(c.bootstrap)
    for key, value in [("retention.ms", "soon"), ("no.such.config", "1"), ("cleanup.policy", "shred")]:
        res = ConfigResource(ConfigResource.Type.TOPIC, "exists", incremental_configs=[
            ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET)])
        with pytest.raises(KafkaException) as ei:
            a.incremental_alter_configs([res])[res].result(30)
        err = ei.value.args[0]
        assert err.code() == 40, err
        assert _is_human(err.str()) and key in err.str(), err.str()
    res = ConfigResource(ConfigResource.Type.TOPIC, "no-such-topic", incremental_configs=[
        ConfigEntry("retention.ms", "1000", incremental_operation=AlterConfigOpType.SET)])
    with pytest.raises(KafkaException) as ei:
        a.incremental_alter_configs([res])[res].result(30)
    assert ei.value.args[0].code() == 3
    # nothing was changed
    assert describe_topic_configs(c.bootstrap, "exists")["retention.ms"] == "604800000"


def test_produce_to_unknown_topic_without_auto_create(no_autocreate_cluster):
    from confluent_kafka import KafkaError, Producer

    from protocol.generated.metadata import MetadataRequest
    from protocol.generated.produce import ProduceRequest as P
    from protocol.records import Record, encode_batch

    c = no_autocreate_cluster
    # Produce straight to a broker: the partition answer is UNKNOWN_TOPIC_OR_PARTITION
    req = P(acks=-1, timeout_ms=5000, topic_data=[P.TopicProduceData(name="missing", partition_data=[
        P.PartitionProduceData(index=0, records=encode_batch([Record(value=b"x")]))])])
    resp = node_request(c.host, c.broker_port(1), req)
    assert resp.responses[0].partition_responses[0].error_code == 3
    # a real producer is told the topic does not exist
    p = Producer({"bootstrap.servers": c.bootstrap, "message.timeout.ms": 8000,
                  "topic.metadata.propagation.max.ms": 1000})
    errors = []
    p.produce("missing", value=b"x", on_delivery=lambda err, m: errors.append(err))
    p.flush(20)
    assert len(errors) == 1 and errors[0] is not None
    assert errors[0].code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC), errors[0]
    # and the topic was not created behind our back
    md = node_request(c.host, c.broker_port(2), MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(
        name="missing")], allow_auto_topic_creation=True))
    assert md.topics[0].error_code == 3
    assert "missing" not in admin(c.bootstrap).list_topics(timeout=10).topics
