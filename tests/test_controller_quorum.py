"""The controller quorum: three controllers run KRaft's Raft; real processes, real
clients.

- kill -9 of the active controller while topics are created in a loop and a broker restarts
  (ISR changes): a new one is active within 5 s, no acknowledged CreateTopics is lost, none is
  applied twice, brokers keep serving.
- a broker dies while the old active controller is down: acks=all writes resume within the
  broker session timeout + 5 s.
- kafka-python's describe_metadata_quorum and the kafka-metadata-quorum.sh clone.
- a network partition between the voters (TCP proxies on 127.0.0.1 that the test cuts and
  heals): the minority never commits, on heal it truncates to the majority's log, and no epoch
  has two leaders over 20 randomized rounds.

Short election and fetch timeouts keep every test within seconds.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from metadata.records import decode_record
from node.client import ClientError, NodeClient
from protocol.errors import Errors
from protocol.generated.create_topics import CreateTopicsRequest
from protocol.generated.describe_quorum import DescribeQuorumRequest
from protocol.generated.fetch import FetchRequest
from protocol.records import decode_batches
from protocol.records.control import read_leader_change
from tests.conftest import installed_script, wait_for
from tests.tcp_proxy import voter_links
from tools.cluster import Cluster

ROOT = Path(__file__).resolve().parent.parent
FAST_RAFT = {"controller.quorum.election.timeout.ms": 300, "controller.quorum.fetch.timeout.ms": 1000}
SESSION_MS = 4000  # broker.session.timeout.ms: the controller's setting (and the brokers' to match)
CT = CreateTopicsRequest


def run(coro):
    return asyncio.run(coro)


async def ask(host: str, port: int, body, version: int | None = None, timeout: float = 5.0):
    async with NodeClient(host, port, client_id="quorum-test", timeout=timeout) as c:
        return await c.request(body, version, timeout=timeout)


def quorum(c: Cluster, cid: int):
    """DescribeQuorum's partition as controller `cid` answers it."""
    R = DescribeQuorumRequest
    resp = run(ask(c.host, c.ports[cid], R(topics=[R.TopicData(topic_name="__cluster_metadata", partitions=[
        R.PartitionData(partition_index=0)])])))
    return resp.topics[0].partitions[0]


def metadata_log(c: Cluster, cid: int) -> list:
    """Every committed record of controller `cid`'s log (read as an observer), with offsets; a
    LEADER_CHANGE control record as its LeaderChangeMessage."""

    async def go():
        out = []
        offset = 0
        async with NodeClient(c.host, c.ports[cid], client_id="quorum-test", timeout=10) as cl:
            while True:
                part = FetchRequest.FetchPartition(partition=0, fetch_offset=offset, partition_max_bytes=8 << 20)
                req = FetchRequest(replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=8 << 20, topics=[
                    FetchRequest.FetchTopic(topic="__cluster_metadata", partitions=[part])])
                p = (await cl.request(req, 12)).responses[0].partitions[0]
                assert p.error_code == 0, p
                batches = decode_batches(p.records) if p.records else []
                if not batches:
                    return out
                for b in batches:
                    out += [(r.offset, read_leader_change(r) if b.header.is_control else decode_record(r.value)[0])
                            for r in b.records]
                offset = batches[-1].base_offset + len(batches[-1].records)

    return run(go())


def leaders_by_epoch(c: Cluster) -> dict[int, set[int]]:
    """From every controller's log: which voters were elected leader of which epoch."""
    out: dict[int, set[int]] = {}
    for cid in c.controller_ids:
        text = c.log_path(cid).read_text(errors="replace")
        for m in re.finditer(r"event='raft_leader_elected' epoch=(\d+)", text):
            out.setdefault(int(m.group(1)), set()).add(cid)
    return out


@pytest.fixture(scope="module")
def quorum_cluster(tmp_path_factory) -> Cluster:
    c = Cluster(tmp_path_factory.mktemp("quorum"), brokers=3, controllers=3,
                controller_overrides={**FAST_RAFT, "broker.session.timeout.ms": SESSION_MS},
                broker_overrides={"broker.session.timeout.ms": SESSION_MS, "broker.heartbeat.interval.ms": 500,
                                  "default.replication.factor": 3, "min.insync.replicas": 2},
                verbose=False)
    try:
        c.start()
        yield c
    finally:
        c.stop()


def _ensure_all_running(c: Cluster) -> None:
    for n in c.node_names:
        if not c.is_running(n):
            c.start_node(n)


def test_kill_active_controller_under_topic_creation(quorum_cluster):
    c = quorum_cluster
    _ensure_all_running(c)
    old = c.active_controller()
    assert old in c.controller_ids
    acked: list[str] = []
    answers: dict[str, list[int]] = {}
    stop = threading.Event()
    prefix = f"loop-{uuid.uuid4().hex[:6]}"

    async def creator():
        n = 0
        bootstrap = [(c.host, c.broker_port(i)) for i in c.broker_ids]
        while not stop.is_set():
            name = f"{prefix}-{n}"
            # a client retries a topic until it gets an answer, as admin clients do
            while not stop.is_set():
                host, port = random.choice(bootstrap)
                try:
                    resp = await ask(host, port, CT(topics=[CT.CreatableTopic(
                        name=name, num_partitions=1, replication_factor=3)], timeout_ms=5000), timeout=8)
                except (ClientError, TimeoutError, OSError):
                    await asyncio.sleep(0.05)
                    continue
                code = resp.topics[0].error_code
                answers.setdefault(name, []).append(code)
                if code == 0:
                    acked.append(name)
                    break
                if code == Errors.TOPIC_ALREADY_EXISTS:
                    break  # an earlier attempt went through without its answer
                await asyncio.sleep(0.05)
            n += 1

    t = threading.Thread(target=lambda: run(creator()), daemon=True)
    t.start()
    wait_for(lambda: len(acked) >= 5, 30, "topics created before the kill")
    # ISR changes at the same time: a broker restarts (kill -9) while the controller fails over
    bounced = c.broker_ids[0]
    restart = threading.Thread(target=lambda: c.restart(bounced, hard=True), daemon=True)
    restart.start()
    killed_at = time.monotonic()
    c.kill(old)
    new = wait_for(lambda: (x := c.active_controller(timeout=0.5)) not in (None, old) and x, 15, "a new leader")
    took = time.monotonic() - killed_at
    # Active = its own epoch's record committed and the image replayed: it answers writes.
    before = len(acked)
    wait_for(lambda: len(acked) > before, 15, "a topic created through the new controller")
    assert took < 5, f"a new controller was elected {took:.1f} s after the kill"
    restart.join(60)
    assert c.is_running(bounced)
    time.sleep(1)
    stop.set()
    t.join(30)
    c.start_node(old)

    records = metadata_log(c, new)
    names = [r.name for _, r in records if type(r).__name__ == "TopicRecord" and r.name.startswith(prefix)]
    assert len(names) == len(set(names)), "a CreateTopics was applied twice"
    assert set(acked) <= set(names), f"acknowledged topics lost: {set(acked) - set(names)}"
    assert len(acked) > before
    # every voter converges to one log
    wait_for(lambda: len({v.log_end_offset for v in quorum(c, new).current_voters}) == 1, 20, "voters in step")
    # brokers keep serving: acks=all produce and fetch on a replicated topic
    from kafka import KafkaConsumer, KafkaProducer

    p = KafkaProducer(bootstrap_servers=c.bootstrap, acks="all", retries=20)
    p.send(acked[-1], b"after failover").get(30)
    p.close()
    cons = KafkaConsumer(acked[-1], bootstrap_servers=c.bootstrap, auto_offset_reset="earliest",
                         consumer_timeout_ms=10000)
    assert [m.value for m in cons] == [b"after failover"]
    cons.close()


def test_brokers_follow_a_new_controller_when_the_active_one_is_paused(quorum_cluster):
    """SIGSTOP of the active controller (a long GC pause, a stalled VM: its connections stay
    open, so no broker sees them close). The brokers' metadata fetches to it go unanswered; as
    KRaft observers they give up after the long poll plus controller.quorum.fetch.timeout.ms
    (2 s), find the new leader and learn a topic created there within seconds."""
    c = quorum_cluster
    _ensure_all_running(c)
    old = c.active_controller()
    assert old in c.controller_ids
    others = [x for x in c.controller_ids if x != old]
    pid = c.pid(old)
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        def new_leader() -> int | None:
            for cid in others:
                try:
                    leader = quorum(c, cid).leader_id
                except (ClientError, TimeoutError):
                    continue
                if leader in others:
                    return leader
            return None

        new = wait_for(new_leader, 15, "a new leader while the old one is paused")
        topic = f"paused-{uuid.uuid4().hex[:6]}"
        resp = run(ask(c.host, c.ports[new], CT(topics=[CT.CreatableTopic(
            name=topic, num_partitions=1, replication_factor=3)], timeout_ms=5000), timeout=8))
        assert resp.topics[0].error_code == 0, resp
        created = time.monotonic()
        for b in c.broker_ids:
            wait_for(lambda b=b: _metadata_lists(c, b, topic), 20, f"broker {b} learning {topic}", interval=0.1)
        took = time.monotonic() - created
        # before: each broker waited out a 30 s request timeout on the paused controller
        assert took < 8, f"the brokers learned the new topic {took:.1f} s after it was created"
    finally:
        os.kill(pid, signal.SIGCONT)


def _metadata_lists(c: Cluster, b: int, topic: str) -> bool:
    from protocol.generated.metadata import MetadataRequest

    try:
        md = run(ask(c.host, c.broker_port(b), MetadataRequest(
            topics=[MetadataRequest.MetadataRequestTopic(name=topic)], allow_auto_topic_creation=False), timeout=3))
    except (ClientError, TimeoutError):
        return False
    return bool(md.topics) and md.topics[0].error_code == 0


def test_broker_dies_while_active_controller_is_down(quorum_cluster):
    """Measured with a client that retries at once (Metadata from a live broker, then an acks=all
    Produce to the leader it names, every 100 ms), so the figure is the cluster's, not a client
    library's backoff policy."""
    c = quorum_cluster
    _ensure_all_running(c)
    from kafka.admin import KafkaAdminClient, NewTopic

    topic = f"acks-all-{uuid.uuid4().hex[:6]}"
    a = KafkaAdminClient(bootstrap_servers=c.bootstrap)
    a.create_topics([NewTopic(topic, 1, 3)])
    a.close()
    wait_for(lambda: _produce_acks_all(c, topic, b"before"), 30, "a first acks=all write")
    leader_of = wait_for(lambda: _partition_leader(c, topic), 20, "a partition leader")
    old = c.active_controller()
    c.kill(old)
    c.kill(leader_of)  # the partition's leader dies while the old active controller is down
    died = time.monotonic()
    wait_for(lambda: _produce_acks_all(c, topic, b"after"), 30, "acks=all writes again", interval=0.1)
    took = time.monotonic() - died
    assert took < SESSION_MS / 1000 + 5, f"acks=all writes resumed {took:.1f} s after the broker died"
    c.start_node(old)
    c.start_node(leader_of)


def _produce_acks_all(c: Cluster, topic: str, value: bytes) -> bool:
    from protocol.generated.produce import ProduceRequest
    from protocol.records import Record, encode_batch

    leader = _partition_leader(c, topic)
    if leader is None or not c.is_running(leader):
        return False
    batch = encode_batch([Record(value=value)], base_offset=0)
    req = ProduceRequest(acks=-1, timeout_ms=2000, topic_data=[ProduceRequest.TopicProduceData(
        name=topic, partition_data=[ProduceRequest.PartitionProduceData(index=0, records=batch)])])
    try:
        resp = run(ask(c.host, c.broker_port(leader), req, timeout=3))
    except (ClientError, TimeoutError):
        return False
    return resp.responses[0].partition_responses[0].error_code == 0


def _partition_leader(c: Cluster, topic: str) -> int | None:
    from protocol.generated.metadata import MetadataRequest

    live = [b for b in c.broker_ids if c.is_running(b)]
    try:
        md = run(ask(c.host, c.broker_port(random.choice(live)), MetadataRequest(
            topics=[MetadataRequest.MetadataRequestTopic(name=topic)], allow_auto_topic_creation=False)))
    except (ClientError, TimeoutError):
        return None
    leader = md.topics[0].partitions[0].leader_id if md.topics and md.topics[0].partitions else -1
    return leader if leader >= 0 else None


def test_describe_quorum_kafka_python_and_tool(quorum_cluster):
    c = quorum_cluster
    _ensure_all_running(c)
    from kafka.admin import KafkaAdminClient

    leader = c.active_controller()
    a = KafkaAdminClient(bootstrap_servers=c.bootstrap)
    try:
        q = wait_for(lambda: (x := a.describe_metadata_quorum()) and x["topics"][0]["partitions"][0]["error"] is None
                     and x, 20, "a quorum description")
    finally:
        a.close()
    part = q["topics"][0]["partitions"][0]
    assert part["leader_id"] == leader
    assert sorted(v["replica_id"] for v in part["current_voters"]) == c.controller_ids
    assert sorted(o["replica_id"] for o in part["observers"]) == c.broker_ids
    assert part["high_watermark"] > 0

    tool = installed_script("kafka-metadata-quorum.sh") if _installed() else None
    cmd = [tool] if tool else [sys.executable, "-m", "tools.kafka_metadata_quorum"]
    out = subprocess.run([*cmd, "--bootstrap-server", c.bootstrap, "describe", "--status"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    fields = dict(re.findall(r"^(\w+):\s+(.*)$", out.stdout, re.M))
    assert fields["LeaderId"] == str(leader)
    assert fields["CurrentVoters"] == "[" + ",".join(map(str, c.controller_ids)) + "]"
    assert fields["CurrentObservers"] == "[" + ",".join(map(str, c.broker_ids)) + "]"
    assert int(fields["HighWatermark"]) > 0 and fields["ClusterId"]
    ctl = ",".join(f"{c.host}:{c.ports[i]}" for i in c.controller_ids)
    out = subprocess.run([*cmd, "--bootstrap-controller", ctl, "describe", "--replication"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["NodeId", "LogEndOffset", "Lag", "LastFetchTimestamp", "LastCaughtUpTimestamp",
                                "Status"]
    status = {int(x.split()[0]): x.split()[-1] for x in lines[1:]}
    assert status[leader] == "Leader"
    assert {i for i, s in status.items() if s == "Follower"} == set(c.controller_ids) - {leader}
    assert {i for i, s in status.items() if s == "Observer"} == set(c.broker_ids)
    bad = subprocess.run([*cmd, "--bootstrap-controller", "127.0.0.1:1", "describe", "--status"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    for args in (["--bootstrap-controller", "nohost", "describe", "--status"], ["--bootstrap-server", c.bootstrap,
                                                                              "describe"]):
        bad = subprocess.run([*cmd, *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr


def _installed() -> bool:
    try:
        installed_script("kafka-metadata-quorum.sh")
        return True
    except AssertionError:
        return False


def test_voter_behind_the_log_start_loads_a_snapshot(tmp_path):
    """A voter that was down while the others snapshotted and deleted old segments is sent the
    leader's snapshot (FetchSnapshot), replaces its log with it, catches up, and restarts from it."""
    c = Cluster(tmp_path / "c", brokers=1, controllers=3, verbose=False,
                controller_overrides={**FAST_RAFT, "metadata.log.max.record.bytes.between.snapshots": 2000})
    try:
        c.start()
        leader = c.active_controller()
        behind = next(x for x in c.controller_ids if x != leader)
        c.terminate(behind)
        from kafka.admin import KafkaAdminClient, NewTopic

        a = KafkaAdminClient(bootstrap_servers=c.bootstrap)
        for i in range(4):
            a.create_topics([NewTopic(f"snap-{i}-{j}", 1, 1) for j in range(10)])
        a.close()
        others = [x for x in c.controller_ids if x != behind]
        wait_for(lambda: all("log_segments_deleted=1" in c.log_path(x).read_text() for x in others), 20,
                 "the running voters snapshotted and deleted old segments")
        c.start_node(behind)
        wait_for(lambda: "event='raft_snapshot_loaded'" in c.log_path(behind).read_text(), 20,
                 "the returning voter loading the leader's snapshot")
        wait_for(lambda: _converged(c) and quorum(c, c.active_controller()).current_voters, 20, "voters converged")
        # what it wrote (the snapshot as its own, the log restarted at its end) opens again
        c.terminate(behind)
        c.start_node(behind)
        wait_for(lambda: _converged(c) and len(quorum(c, c.active_controller()).current_voters) == 3, 20,
                 "voters converged after the restart")
        assert "cannot start" not in c.log_path(behind).read_text()
    finally:
        c.stop()


# ---------------------------------------------------------------- network partitions
PARTITION_RAFT = {"controller.quorum.election.timeout.ms": 150, "controller.quorum.fetch.timeout.ms": 500}


def test_network_partition_minority_never_commits(tmp_path):
    """Each voter reaches each other voter through its own proxy (link a->b), so the test can
    isolate one voter: 20 rounds, each isolating a random voter (a third of the time the leader),
    writing to the isolated one directly (it must never acknowledge), healing, and checking the
    voters converge to one log."""
    c = Cluster(tmp_path / "c", brokers=1, controllers=3, controller_overrides=PARTITION_RAFT, verbose=False)
    links = voter_links(c)
    rng = random.Random(19)
    isolated_leader_rounds = truncated_rounds = 0
    try:
        c.start()
        for rnd in range(20):
            leader = wait_for(lambda: c.active_controller(timeout=0.5), 20, "a leader")
            lonely = rng.choice(c.controller_ids)
            truncations = _count(c, lonely, "raft_truncated_on_divergence")
            name = f"minority-{rnd}"
            cut = [link for (a, b), link in links.items() if lonely in (a, b)]
            # The isolated voter (whatever it believes) must never acknowledge a write.
            code = run(_write_after_cut(c, lonely, name, cut))
            assert code != 0, f"round {rnd}: the isolated voter {lonely} acknowledged a write"
            # An isolated leader takes the write into its log until check-quorum makes it resign
            # (KIP-595); a write that came later (a loaded machine) was refused without an append.
            appended = name.encode() in _log_bytes(c, lonely)
            majority = [x for x in c.controller_ids if x != lonely]
            new = wait_for(lambda majority=majority: next((x for x in majority if _leads(c, x)), None), 20,
                           f"round {rnd}: a leader on the majority side")
            assert new != lonely
            if lonely == leader:
                assert new != leader
            # the majority commits without it (NOT_CONTROLLER while its new leader activates)
            wait_for(lambda majority=majority, rnd=rnd: _create_on(c, majority, f"majority-{rnd}"), 20,
                     f"round {rnd}: a write committed by the majority")
            for link in links.values():
                link.heal()
            # on heal the voters converge to the majority's log; an isolated leader had appended
            # the write it never acknowledged, and cuts it off
            wait_for(lambda: _converged(c), 20, f"round {rnd}: voters converged")
            if lonely == leader:
                isolated_leader_rounds += 1
            if appended:
                truncated_rounds += 1
                assert _count(c, lonely, "raft_truncated_on_divergence") > truncations, \
                    f"round {rnd}: the old leader {lonely} did not truncate to the majority's log"
                assert name.encode() not in _log_bytes(c, lonely), f"round {rnd}: {name} is still in {lonely}'s log"
        leader = c.active_controller()
        records = metadata_log(c, leader)
        names = {r.name for _, r in records if type(r).__name__ == "TopicRecord"}
        assert not {n for n in names if n.startswith("minority-")}, "a minority write was committed"
        assert {f"majority-{i}" for i in range(20)} <= names
        # every leader's epoch starts with Raft's LEADER_CHANGE control record (KIP-595), naming
        # it, the voters and a majority that voted for it
        changes = [r for _, r in records if type(r).__name__ == "LeaderChangeMessage"]
        assert len(changes) >= isolated_leader_rounds + 1
        for ch in changes:
            voters = [v.voter_id for v in ch.voters]
            granting = {v.voter_id for v in ch.granting_voters}
            assert voters == sorted(c.controller_ids) and ch.leader_id in granting and len(granting) >= 2, ch
        assert isolated_leader_rounds >= 1  # (2/3)^20: practically always several
        assert truncated_rounds >= 1, "no isolated leader took a write before it resigned"
        by_epoch = leaders_by_epoch(c)
        assert by_epoch, "no election was logged"
        assert all(len(v) == 1 for v in by_epoch.values()), f"two leaders in one epoch: {by_epoch}"
    finally:
        c.stop()
        for link in links.values():
            link.close()


async def _write_after_cut(c: Cluster, lonely: int, name: str, links: list) -> int | None:
    """Cuts `links`, then asks voter `lonely` to create topic `name` over a connection opened
    before the cut, so the write reaches an isolated leader before its check-quorum resignation
    as far as the test can make it; the answer's error code, or None if none came."""
    try:
        async with NodeClient(c.host, c.ports[lonely], client_id="quorum-test", timeout=3) as cl:
            for link in links:
                link.cut()
            r = await cl.request(CT(topics=[CT.CreatableTopic(
                name=name, num_partitions=1, replication_factor=1)], timeout_ms=1000), timeout=3)
            return r.topics[0].error_code
    except (ClientError, TimeoutError):
        for link in links:
            link.cut()
        return None


def _log_bytes(c: Cluster, cid: int) -> bytes:
    """The raw bytes of controller `cid`'s metadata log segments, committed or not."""
    return b"".join(p.read_bytes() for p in sorted((c.node_dir(cid)).rglob("__cluster_metadata-0/*.log")))


def _create_on(c: Cluster, voters: list[int], name: str) -> bool:
    """CreateTopics sent to whichever of `voters` leads; True once created (or found created)."""
    leader = next((x for x in voters if _leads(c, x)), None)
    if leader is None:
        return False
    r = run(ask(c.host, c.ports[leader], CT(topics=[CT.CreatableTopic(
        name=name, num_partitions=1, replication_factor=1)], timeout_ms=5000), timeout=10))
    code = r.topics[0].error_code
    assert code in (0, Errors.TOPIC_ALREADY_EXISTS, Errors.NOT_CONTROLLER), r
    return code != Errors.NOT_CONTROLLER


def _count(c: Cluster, cid: int, event: str) -> int:
    return c.log_path(cid).read_text(errors="replace").count(f"event='{event}'")


def _leads(c: Cluster, cid: int) -> bool:
    try:
        p = quorum(c, cid)
    except (ClientError, TimeoutError, OSError):
        return False
    return p.error_code == 0 and p.leader_id == cid


def _converged(c: Cluster) -> bool:
    leader = c.active_controller(timeout=0.5)
    if leader is None:
        return False
    p = quorum(c, leader)
    ends = {v.log_end_offset for v in p.current_voters}
    return len(ends) == 1 and p.high_watermark in ends
