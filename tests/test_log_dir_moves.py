"""Moves of replicas between the log dirs of a broker (KIP-113):
AlterReplicaLogDirs / DescribeLogDirs with KIP-113's semantics, a move while a producer writes,
bad input answered with Kafka's codes and nothing changed, a `kill -9` at each step of a move
(copying, caught up, between the two renames) recovering exactly one live replica with all its
data, and the measured copy rate held to intra.broker.throttled.rate."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from node.client import NodeClient
from protocol.errors import Errors
from protocol.generated.alter_replica_log_dirs import AlterReplicaLogDirsRequest
from protocol.generated.describe_log_dirs import DescribeLogDirsRequest
from tests.conftest import FAST_FENCING, wait_for
from tools.cluster import Cluster


def request(c: Cluster, broker: int, body, version: int | None = None):
    async def go():
        async with NodeClient(c.host, c.broker_port(broker), timeout=15) as cl:
            return await cl.request(body, version)

    return asyncio.run(go())


def alter(c: Cluster, broker: int, path: str, topic: str, partitions: list[int]) -> dict[int, int]:
    R = AlterReplicaLogDirsRequest
    resp = request(c, broker, R(dirs=[R.AlterReplicaLogDir(path=path, topics=[
        R.AlterReplicaLogDirTopic(name=topic, partitions=partitions)])]))
    return {p.partition_index: p.error_code for t in resp.results for p in t.partitions}


def describe(c: Cluster, broker: int) -> dict[str, list[tuple[str, int, int, int, bool]]]:
    """dir path -> [(topic, partition, chunk start, size, is future)]; an offline dir maps to None."""
    resp = request(c, broker, DescribeLogDirsRequest(topics=None), 4)
    out = {}
    for r in resp.results:
        out[r.log_dir] = None if r.error_code else [
            (t.name, p.partition_index, p.chunk_start_offset, p.partition_size, p.is_future_key)
            for t in r.topics for p in t.partitions]
    return out


def where(c: Cluster, broker: int, topic: str, partition: int = 0) -> tuple[str | None, bool]:
    """(dir holding the live replica, whether a move copy exists)."""
    live, future = None, False
    for path, entries in describe(c, broker).items():
        for t, p, _, _, fut in entries or []:
            if (t, p) == (topic, partition):
                if fut:
                    future = True
                else:
                    live = path
    return live, future



def fill(c: Cluster, topic: str, n: int, size: int = 10_000, partition: int = 0) -> dict[bytes, int]:
    p = Producer({"bootstrap.servers": c.bootstrap, "acks": "all", "linger.ms": 5, "enable.idempotence": True})
    acked: dict[bytes, int] = {}

    def cb(err, m):
        if err is None:
            acked[m.value()[:12]] = m.offset()

    for i in range(n):
        while True:
            try:
                p.produce(topic, value=b"%011d-" % i + b"x" * size, partition=partition, on_delivery=cb)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(60) == 0
    return acked


def read_all(c: Cluster, topic: str, partition: int, count: int, timeout: float = 60) -> list[bytes]:
    cons = Consumer({"bootstrap.servers": c.bootstrap, "group.id": f"g{time.time()}", "enable.auto.commit": False,
                     "fetch.max.bytes": 50 << 20})
    cons.assign([TopicPartition(topic, partition, 0)])
    out: list[bytes] = []
    deadline = time.time() + timeout
    try:
        while len(out) < count and time.time() < deadline:
            m = cons.poll(0.5)
            if m is not None and m.error() is None:
                out.append(m.value()[:12])
    finally:
        cons.close()
    return out


def replica_dirs(c: Cluster, broker: int, topic: str) -> list[str]:
    return sorted(p.name for p in c.node_dir(broker).glob(f"logs-*/{topic}-*"))


@pytest.fixture
def one_broker(tmp_path):
    c = Cluster(tmp_path / "c", brokers=1, verbose=False, broker_overrides=FAST_FENCING, controller_overrides=FAST_FENCING)
    c.start()
    yield c
    c.stop()


def test_move_while_producing_and_bad_input(one_broker):
    c = one_broker
    a = AdminClient({"bootstrap.servers": c.bootstrap})
    a.create_topics([NewTopic("mv", 1, 1)])["mv"].result(30)
    acked = fill(c, "mv", 1500)  # 15 MB
    src, _ = wait_for(lambda: where(c, 1, "mv")[0] and where(c, 1, "mv"), 10, "the replica")
    dirs = [str(p) for p in sorted(c.node_dir(1).glob("logs-*"))]
    dest = next(d for d in dirs if d != src)

    # bad input: nothing changes
    assert alter(c, 1, "relative/dir", "mv", [0]) == {0: Errors.LOG_DIR_NOT_FOUND}
    assert alter(c, 1, "/nowhere/else", "mv", [0]) == {0: Errors.LOG_DIR_NOT_FOUND}
    assert alter(c, 1, dest, "nosuch", [0]) == {0: Errors.UNKNOWN_TOPIC_OR_PARTITION}
    assert alter(c, 1, dest, "mv", [7]) == {0: Errors.UNKNOWN_TOPIC_OR_PARTITION} or alter(c, 1, dest, "mv", [7]) == {
        7: Errors.UNKNOWN_TOPIC_OR_PARTITION}
    assert where(c, 1, "mv") == (src, False)

    # a producer runs while the replica moves
    stop = threading.Event()
    more: dict[bytes, int] = {}

    def writer():
        p = Producer({"bootstrap.servers": c.bootstrap, "acks": "all", "linger.ms": 1, "enable.idempotence": True})
        i = 10_000

        def cb(err, m):
            if err is None:
                more[m.value()[:12]] = m.offset()

        while not stop.is_set():
            p.produce("mv", value=b"%011d-" % i + b"y" * 1000, partition=0, on_delivery=cb)
            p.poll(0.002)
            i += 1
        p.flush(30)

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    time.sleep(0.3)
    assert alter(c, 1, dest, "mv", [0]) == {0: 0}
    wait_for(lambda: where(c, 1, "mv") == (dest, False), 60, "the move to finish")
    time.sleep(0.3)
    stop.set()
    t.join(30)
    assert len(more) > 100
    want = set(acked) | set(more)
    got = read_all(c, "mv", 0, len(want))
    assert len(got) == len(set(got)) and set(got) == want, "a message was lost or duplicated by the move"
    assert replica_dirs(c, 1, "mv") == ["mv-0-0"], "the source's .delete or a .move copy was left behind"
    assert (Path(dest) / "mv-0-0").is_dir()
    text = c.log_path(1).read_text()
    assert "replica_move_completed" in text and "replicas_assigned_to_dirs" in text

    # moving to where it is already is a no-op; "any" cancels nothing pending
    assert alter(c, 1, dest, "mv", [0]) == {0: 0}
    assert alter(c, 1, "any", "mv", [0]) == {0: 0}
    assert where(c, 1, "mv") == (dest, False)


@pytest.mark.parametrize("step", ["copying", "caught_up", "renamed"])
def test_kill_9_during_a_move_recovers_one_live_replica(tmp_path, step):
    c = Cluster(tmp_path / "c", brokers=1, verbose=False, broker_overrides=FAST_FENCING, controller_overrides=FAST_FENCING)
    try:
        c.start()
        a = AdminClient({"bootstrap.servers": c.bootstrap})
        a.create_topics([NewTopic("k9", 1, 1)])["k9"].result(30)
        acked = fill(c, "k9", 600)
        src, _ = where(c, 1, "k9")
        dest = next(str(p) for p in sorted(c.node_dir(1).glob("logs-*")) if str(p) != src)
        # the broker stops at `step` of the move (a failpoint), and is killed there
        c.terminate(1)
        os.environ["STRATA_MOVE_FAILPOINT"] = step
        try:
            c.start_node(1)
        finally:
            del os.environ["STRATA_MOVE_FAILPOINT"]
        assert alter(c, 1, dest, "k9", [0]) == {0: 0}
        wait_for(lambda: f"step='{step}'" in c.log_path(1).read_text(), 30, f"the move to reach {step}")
        c.kill(1)
        left = sorted(str(p.relative_to(c.node_dir(1))) for p in c.node_dir(1).glob("logs-*/k9-*"))
        assert any(x.endswith(".move") for x in left), left
        c.start_node(1)
        # exactly one live replica, with all its data; the move finishes or is completed by the rename rule
        wait_for(lambda: replica_dirs(c, 1, "k9") == ["k9-0-0"], 30, "one live replica and nothing else")
        got = read_all(c, "k9", 0, len(acked))
        assert sorted(got) == sorted(acked)
        assert (Path(dest) / "k9-0-0").is_dir(), "the move was resumed and completed (or its copy renamed)"
    finally:
        c.stop()


def test_move_rate_follows_intra_broker_throttled_rate_and_a_second_move_replaces_the_first(tmp_path):
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    dirs = [tmp_path / f"d{i}" for i in range(3)]
    c = Cluster(tmp_path / "c", brokers=1, verbose=False, broker_overrides=FAST_FENCING, controller_overrides=FAST_FENCING,
                per_broker_overrides={1: {"log.dirs": ",".join(map(str, dirs))}})
    try:
        c.start()
        rate = 2_000_000
        a = AdminClient({"bootstrap.servers": c.bootstrap})
        a.create_topics([NewTopic("thr", 1, 1)])["thr"].result(30)
        fill(c, "thr", 1200)  # 12 MB: about 6 s at the rate

        def set_rate(value: str | None) -> None:
            op = AlterConfigOpType.SET if value is not None else AlterConfigOpType.DELETE
            res = ConfigResource(ResourceType.BROKER, "1", incremental_configs=[
                ConfigEntry("intra.broker.throttled.rate", value, incremental_operation=op)])
            for f in a.incremental_alter_configs([res]).values():
                f.result(30)

        set_rate(str(rate))
        src, _ = where(c, 1, "thr")
        first, second = [str(d) for d in dirs if str(d) != src]

        def copied(dest: str) -> int:
            try:
                return sum(f.stat().st_size for f in (Path(dest) / "thr-0-0.move").iterdir() if f.name.endswith(".log"))
            except FileNotFoundError:
                return -1

        assert alter(c, 1, first, "thr", [0]) == {0: 0}
        wait_for(lambda: copied(first) > 1_000_000, 20, "copying to start")
        t0, b0 = time.monotonic(), copied(first)
        time.sleep(3)
        t1, b1 = time.monotonic(), copied(first)
        measured = (b1 - b0) / (t1 - t0)
        assert abs(measured - rate) <= 0.1 * rate, f"moved at {measured:.0f} B/s, limit {rate}"
        set_rate("100000")  # nearly stopped (a changed rate applies at once): the steps below see it under way
        # --verify shows the move under way: bytes copied / total
        plan = tmp_path / "plan.json"
        plan.write_text(json.dumps({"version": 1, "partitions": [
            {"topic": "thr", "partition": 0, "replicas": [1], "log_dirs": [first]}]}))
        v = subprocess.run([sys.executable, "-m", "tools.kafka_reassign_partitions", "--bootstrap-server", c.bootstrap,
                            "--verify", "--reassignment-json-file", str(plan)], capture_output=True, text=True,
                           timeout=60, env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
        assert v.returncode == 0, v.stderr
        m = re.search(r"Reassignment of replica thr-0-1 is still in progress: (\d+) / (\d+) bytes copied", v.stdout)
        assert m and 0 < int(m.group(1)) < int(m.group(2)), v.stdout
        # a second move replaces the first (its copy goes); "any" cancels it
        assert alter(c, 1, second, "thr", [0]) == {0: 0}
        wait_for(lambda: copied(first) == -1 and copied(second) > 0, 10, "the second move to replace the first")
        assert alter(c, 1, "any", "thr", [0]) == {0: 0}
        wait_for(lambda: copied(second) == -1, 10, "the move to be cancelled")
        assert where(c, 1, "thr") == (src, False)
        # unthrottled, a move goes at once
        set_rate(None)
        assert alter(c, 1, second, "thr", [0]) == {0: 0}
        wait_for(lambda: where(c, 1, "thr") == (second, False), 15, "the move to finish unthrottled")
    finally:
        c.stop()


def test_each_chunk_replica_is_described_and_moved(one_broker):
    from protocol.generated.create_chunks import CreateChunksRequest as CC

    c = one_broker
    a = AdminClient({"bootstrap.servers": c.bootstrap})
    a.create_topics([NewTopic("ch", 1, 1)])["ch"].result(30)
    acked: dict[bytes, int] = {}
    for cut in range(3):
        acked.update(fill(c, "ch", 50, size=1000))
        if cut < 2:  # a new active chunk on the same broker: the old one stays here, inactive
            e = CC.CreateChunksTopicPartition(topic_name="ch", partition_id=0, broker_ids=[1], start_offset=-1,
                                              start_timestamp=-1, prev_stop_offset=-1, prev_end_offset=-1)
            [r] = request(c, 1, CC(topic_partitions=[e])).results
            assert r.error_code == 0, r.error_message
    wait_for(lambda: len([e for es in describe(c, 1).values() for e in es if e[0] == "ch"]) == 3, 15,
             "three chunk replicas")
    dirs = sorted(str(p) for p in c.node_dir(1).glob("logs-*"))
    for dest in dirs:  # every chunk replica of the partition moves
        assert alter(c, 1, dest, "ch", [0]) == {0: 0}

        def all_in(dest=dest):
            entries = [(path, e) for path, es in describe(c, 1).items() for e in es if e[0] == "ch"]
            return len(entries) == 3 and all(path == dest and not e[4] for path, e in entries) and entries

        entries = wait_for(all_in, 30, f"the three chunk replicas in {dest}")
        assert sorted(e[2] for _, e in entries) == [0, 50, 100]
        assert sorted(p.name for p in Path(dest).glob("ch-0-*")) == ["ch-0-0", "ch-0-100", "ch-0-50"]
    assert sorted(read_all(c, "ch", 0, len(acked))) == sorted(acked)
