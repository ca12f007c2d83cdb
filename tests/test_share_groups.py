"""Share groups (KIP-932) with librdkafka's ShareConsumer against a real 3-broker cluster (one
shared by the module; each test has its own topic and group):
- two members of one group read a 1-partition topic together: each gets records, every record
  is delivered once and accepted once (nothing comes back after the lock duration);
- explicit acknowledgement: a released record comes back with delivery count 2, a rejected one
  never again; a record released at the delivery count limit is archived, never delivered again;
- a record not acknowledged within the lock duration goes to the other member, delivery count 2;
- ShareGroupDescribe shows the members with their assignment;
- bad input: Kafka's codes (unknown share session, an acknowledgement opening a session, records
  not acquired by the member, a stale member epoch), never a traceback;
- with group.share.enable=false the share APIs are not advertised;
- kill -9 of the share-partition leader's broker: accepted records never come back, acquired but
  unacknowledged ones do (the state is in __share_group_state, through the share coordinator).
"""

from __future__ import annotations

import base64
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from protocol.errors import Errors
from protocol.framing import frame
from protocol.generated.api_versions import ApiVersionsRequest
from protocol.generated.find_coordinator import FindCoordinatorRequest
from protocol.generated.share_acknowledge import ShareAcknowledgeRequest
from protocol.generated.share_fetch import ShareFetchRequest
from protocol.generated.share_group_describe import ShareGroupDescribeRequest
from protocol.generated.share_group_heartbeat import ShareGroupHeartbeatRequest
from protocol.headers import decode_response, encode_request
from tests.conftest import wait_for
from tools.cluster import Cluster

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]

LOCK_MS = 3000
BROKER = {
    "offsets.topic.num.partitions": 3,
    "replica.lag.time.max.ms": 5000,
    "broker.heartbeat.interval.ms": 500,
    "group.share.heartbeat.interval.ms": 500,
    "group.share.session.timeout.ms": 10000,
    "group.share.record.lock.duration.ms": LOCK_MS,
    "share.coordinator.state.topic.num.partitions": 3,
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("kip932"), brokers=3, verbose=False, broker_overrides=BROKER,
                controller_overrides={"broker.session.timeout.ms": 3000})
    try:
        c.start(timeout=90)
        yield c
    finally:
        c.stop()


def create_topic(c: Cluster, name: str, partitions: int = 1) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": c.bootstrap})
    admin.create_topics([NewTopic(name, partitions, 3)], operation_timeout=30)[name].result(30)


def read_from_earliest(c: Cluster, group: str, **more: str) -> None:
    """share.auto.offset.reset=earliest for the group (kafka-configs.sh --entity-type groups), and
    `more` group configs (dots as underscores)."""
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType
    admin = AdminClient({"bootstrap.servers": c.bootstrap})
    configs = {"share.auto.offset.reset": "earliest", **{k.replace("_", "."): v for k, v in more.items()}}
    res = ConfigResource(ResourceType.GROUP, group, incremental_configs=[
        ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in configs.items()])
    for f in admin.incremental_alter_configs([res]).values():
        f.result(30)


def produce(c: Cluster, topic: str, n: int, tag: str = "v", chunk: int = 0, pause: float = 0.0,
            partitions: int = 0) -> list[bytes]:
    """`n` records; with `chunk`, flushed that many at a time with `pause` between; with
    `partitions`, dealt round-robin over that many (else the sticky partitioner may put them all
    in one)."""
    from confluent_kafka import Producer
    p = Producer({"bootstrap.servers": c.bootstrap, "acks": "all", "linger.ms": 5})
    values = [f"{tag}-{i}".encode() for i in range(n)]
    for i, v in enumerate(values):
        if partitions:
            p.produce(topic, value=v, partition=i % partitions)
        else:
            p.produce(topic, value=v)
        if chunk and (i + 1) % chunk == 0:
            assert p.flush(30) == 0
            time.sleep(pause)
    assert p.flush(30) == 0
    return values


def share_consumer(c: Cluster, group: str, topic: str, explicit: bool = False):
    from confluent_kafka import ShareConsumer
    conf = {"bootstrap.servers": c.bootstrap, "group.id": group}
    if explicit:
        conf["share.acknowledgement.mode"] = "explicit"
    sc = ShareConsumer(conf)
    sc.subscribe([topic])
    return sc


def records(messages) -> list:
    out = []
    for m in messages:
        assert m.error() is None, m.error()
        out.append(m)
    return out


def held_records_come_back(b, accepted: list[int], held: list[int]) -> None:
    """After the share-partition's broker died: a new member `b` reads every held record again,
    with delivery count 2, and none of the accepted ones."""
    try:
        seen: list = []
        deadline = time.time() + 40
        while time.time() < deadline and {m.offset() for m in seen} < set(held):
            for m in records(b.poll(0.5)):
                seen.append(m)
                b.acknowledge(m)
            b.commit_sync(30)
        seen_offsets = [m.offset() for m in seen]
        assert not set(seen_offsets) & set(accepted), f"accepted records came back: {seen_offsets}"
        assert set(held) <= set(seen_offsets), f"held records did not come back: {seen_offsets}"
        assert all(m.delivery_count() == 2 for m in seen if m.offset() in held)
    finally:
        b.close()


# ---------------------------------------------------------------- acceptance
def test_two_members_read_one_partition_together(cluster: Cluster) -> None:
    topic, group, n = "share-two", "share-two-g", 2000
    create_topic(cluster, topic)
    deliveries: list[Counter] = [Counter(), Counter()]
    counts: list[Counter] = [Counter(), Counter()]
    stop = threading.Event()
    errors: list[BaseException] = []

    def member(i: int) -> None:
        sc = share_consumer(cluster, group, topic)
        try:
            while not stop.is_set():
                for m in records(sc.poll(0.5)):  # implicit mode: the next poll accepts them
                    deliveries[i][m.value()] += 1
                    counts[i][m.delivery_count()] += 1
                    time.sleep(0.0005)  # a slow worker, so both members get a share
            sc.commit_sync(30)
        except BaseException as e:  # noqa: BLE001 - reported by the test thread
            errors.append(e)
        finally:
            sc.close()

    threads = [threading.Thread(target=member, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: _members(cluster, group) == 2, timeout=30, what="both members in the group")
        time.sleep(1)  # their first ShareFetch started the share-partition (at the log end: latest)
        # records arrive while both read, as on a live queue
        values = produce(cluster, topic, n, chunk=50, pause=0.02)
        wait_for(lambda: len(set(deliveries[0]) | set(deliveries[1])) >= n, timeout=60,
                 what="both members to read every record")
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert not errors, errors
    assert all(deliveries), f"each member gets records: {[sum(d.values()) for d in deliveries]}"
    total = deliveries[0] + deliveries[1]
    assert set(total) == set(values)
    assert max(total.values()) == 1, "a record was delivered twice"
    assert set(counts[0]) | set(counts[1]) == {1}, "a record was delivered again"
    # every record was accepted: a new member of the group gets nothing, past the lock duration too
    sc = share_consumer(cluster, group, topic)
    try:
        late = []
        deadline = time.time() + LOCK_MS / 1000 + 3
        while time.time() < deadline:
            late += records(sc.poll(0.5))
        assert not late, f"{len(late)} accepted records came back"
    finally:
        sc.close()


def test_explicit_release_reject_and_delivery_limit(cluster: Cluster) -> None:
    from confluent_kafka import AcknowledgeType
    topic, group = "share-explicit", "share-explicit-g"
    create_topic(cluster, topic)
    read_from_earliest(cluster, group)
    produce(cluster, topic, 10)
    sc = share_consumer(cluster, group, topic, explicit=True)
    try:
        first = wait_for(lambda: records(sc.poll(1.0)), timeout=30, what="the first records")
        by_offset = {m.offset(): m for m in first}
        assert all(m.delivery_count() == 1 for m in first)
        released, rejected, poison = 0, 1, 2
        for off, m in by_offset.items():
            kind = {released: AcknowledgeType.RELEASE, rejected: AcknowledgeType.REJECT,
                    poison: AcknowledgeType.RELEASE}.get(off, AcknowledgeType.ACCEPT)
            sc.acknowledge(m, kind)
        sc.commit_sync(30)
        seen: Counter = Counter({off: 1 for off in by_offset})
        counts: dict[int, list[int]] = {}
        deadline = time.time() + 30
        # the released record comes back with delivery count 2 and is accepted; the poison one is
        # released at every delivery until the limit (5) archives it
        while time.time() < deadline and (seen[poison] < 5 or seen[released] < 2):
            for m in records(sc.poll(0.5)):
                seen[m.offset()] += 1
                counts.setdefault(m.offset(), []).append(m.delivery_count())
                sc.acknowledge(m, AcknowledgeType.RELEASE if m.offset() == poison else AcknowledgeType.ACCEPT)
            sc.commit_sync(30)
        assert counts[released] == [2]
        assert counts[poison] == [2, 3, 4, 5]
        assert rejected not in counts, "a rejected record was delivered again"
        late = []
        deadline = time.time() + LOCK_MS / 1000 + 2
        while time.time() < deadline:
            late += records(sc.poll(0.5))
        assert not late, [(m.offset(), m.delivery_count()) for m in late]
    finally:
        sc.close()


def test_lock_expiry_redelivers_to_the_other_member(cluster: Cluster) -> None:
    topic, group = "share-lock", "share-lock-g"
    create_topic(cluster, topic)
    read_from_earliest(cluster, group)
    values = set(produce(cluster, topic, 5))
    a = share_consumer(cluster, group, topic, explicit=True)
    b = share_consumer(cluster, group, topic, explicit=True)
    try:
        held = wait_for(lambda: records(a.poll(1.0)), timeout=30, what="member a's records")
        # a never acknowledges (it stops polling): past the lock duration b gets them
        got: list = []
        deadline = time.time() + LOCK_MS / 1000 + 15
        while time.time() < deadline and {m.value() for m in got} < {m.value() for m in held}:
            for m in records(b.poll(0.5)):
                got.append(m)
                b.acknowledge(m)
            b.commit_sync(30)
        again = {m.value(): m.delivery_count() for m in got}
        assert {m.value() for m in held} <= set(again) <= values
        assert all(again[m.value()] == 2 for m in held)
    finally:
        a.close()
        b.close()


def test_describe_shows_members(cluster: Cluster) -> None:
    topic, group = "share-describe", "share-describe-g"
    create_topic(cluster, topic, partitions=2)
    a = share_consumer(cluster, group, topic)
    try:
        a.poll(1.0)
        body = wait_for(lambda: _coordinator_answer(cluster, ShareGroupDescribeRequest(group_ids=[group]), 1),
                        timeout=30, what="the coordinator's answer")
        g = body.groups[0]
        assert g.error_code == 0 and g.group_state == "Stable" and g.assignor_name == "simple"
        assert len(g.members) == 1
        tps = g.members[0].assignment.topic_partitions
        assert [(t.topic_name, sorted(t.partitions)) for t in tps] == [(topic, [0, 1])]
    finally:
        a.close()


def _run_tool(c: Cluster, module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, "--bootstrap-server", c.bootstrap, *args],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)


def _tool(c: Cluster, module: str, *args: str) -> str:
    out = _run_tool(c, module, *args)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_share_groups_tool_lists_and_describes(cluster: Cluster) -> None:
    topic, group = "share-tool", "share-tool-g"
    create_topic(cluster, topic, partitions=2)
    # the group's share settings through kafka-configs.sh --entity-type groups, as Kafka's
    _tool(cluster, "tools.kafka_configs", "--alter", "--entity-type", "groups", "--entity-name", group,
          "--add-config", "share.auto.offset.reset=earliest,share.isolation.level=read_committed")
    described = _tool(cluster, "tools.kafka_configs", "--describe", "--entity-type", "groups", "--entity-name", group)
    assert "share.auto.offset.reset=earliest" in described and "share.isolation.level=read_committed" in described
    bad = _run_tool(cluster, "tools.kafka_configs", "--alter", "--entity-type", "groups", "--entity-name", group,
                    "--add-config", "share.auto.offset.reset=sometimes")
    assert bad.returncode != 0 and "share.auto.offset.reset" in bad.stdout + bad.stderr
    produce(cluster, topic, 30, partitions=2)  # both partitions get some, so both share-partitions start
    a = share_consumer(cluster, group, topic)
    try:
        got = 0
        deadline = time.time() + 30
        while got < 30 and time.time() < deadline:
            got += len(records(a.poll(0.5)))
        a.commit_sync(30)  # every record accepted: each start offset is its log end, no lag
        wait_for(lambda: _members(cluster, group) == 1, timeout=30, what="the member in the group")
        offsets = _tool(cluster, "tools.kafka_share_groups", "--describe", "--group", group).strip().splitlines()
        assert offsets[0].split() == ["GROUP", "TOPIC", "PARTITION", "START-OFFSET", "LAG"]
        rows = [r.split() for r in offsets[1:]]
        assert [r[:3] for r in rows] == [[group, topic, "0"], [group, topic, "1"]]
        assert sum(int(r[3]) for r in rows) == 30 and all(r[4] == "0" for r in rows), rows
        assert group in _tool(cluster, "tools.kafka_share_groups", "--list").split()
        assert f"{group}" in _tool(cluster, "tools.kafka_share_groups", "--list", "--state", "Stable")
        # a share group is no consumer group
        assert group not in _tool(cluster, "tools.kafka_consumer_groups", "--list").split()
        members = _tool(cluster, "tools.kafka_share_groups", "--describe", "--group", group, "--members",
                        "--verbose").strip().splitlines()
        assert members[0].split()[:5] == ["GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "MEMBER-EPOCH"]
        assert members[1].split()[0] == group and members[1].endswith(f"{topic}(0,1)")
        state = _tool(cluster, "tools.kafka_share_groups", "--describe", "--group", group, "--state").strip()
        assert state.splitlines()[1].split()[0] == group and "Stable" in state and "simple" in state
        reset = ("--reset-offsets", "--group", group, "--topic", topic, "--to-earliest", "--execute")
        live = _run_tool(cluster, "tools.kafka_share_groups", *reset)
        assert live.returncode == 1 and "NON_EMPTY_GROUP" in live.stderr, (live.stdout, live.stderr)
    finally:
        a.close()
    # the group is empty now: its start offsets go back to the beginning, and every record is read again
    wait_for(lambda: _members(cluster, group) == 0, timeout=30, what="the member gone")
    planned = _tool(cluster, "tools.kafka_share_groups", *reset).strip().splitlines()
    assert planned[0].split() == ["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"]
    assert [r.split()[3] for r in planned[1:]] == ["0", "0"]
    rows = [r.split() for r in _tool(cluster, "tools.kafka_share_groups", "--describe", "--group",
                                     group).strip().splitlines()[1:]]
    assert all(r[3] == "0" for r in rows) and sum(int(r[4]) for r in rows) == 30, rows
    b = share_consumer(cluster, group, topic)
    try:
        again: list = []
        deadline = time.time() + 30
        while len(again) < 30 and time.time() < deadline:
            again += records(b.poll(0.5))
        assert len({(m.partition(), m.offset()) for m in again}) == 30
        assert {m.delivery_count() for m in again} == {1}
        b.commit_sync(30)
        live = _run_tool(cluster, "tools.kafka_share_groups", "--delete", "--group", group)
        assert live.returncode == 1 and "NON_EMPTY_GROUP" in live.stdout, (live.stdout, live.stderr)
    finally:
        b.close()
    # the offsets of the topic go, then the group
    wait_for(lambda: _members(cluster, group) == 0, timeout=30, what="the member gone")
    out = _tool(cluster, "tools.kafka_share_groups", "--delete-offsets", "--group", group, "--topic", topic)
    assert out.split() == ["TOPIC", "STATUS", topic, "Successful"], out
    assert _tool(cluster, "tools.kafka_share_groups", "--describe", "--group", group).strip() == ""
    out = _tool(cluster, "tools.kafka_share_groups", "--delete", "--group", group)
    assert f"('{group}') was successful" in out
    assert group not in _tool(cluster, "tools.kafka_share_groups", "--list").split()


# ---------------------------------------------------------------- bad input
def _request(c: Cluster, broker: int, body, version: int):
    sock = socket.create_connection((c.host, c.broker_port(broker)), timeout=10)
    try:
        sock.sendall(b"".join(bytes(p) for p in frame(encode_request(body, version, 7, "share-test"))))
        size = struct.unpack(">i", _read(sock, 4))[0]
        return decode_response(_read(sock, size), body.API_KEY, version)[1]
    finally:
        sock.close()


def _read(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        assert chunk, "the broker closed the connection"
        buf += chunk
    return buf


def _coordinator_answer(c: Cluster, body, version: int):
    """The answer of the broker that coordinates the group (None while none does)."""
    group = (body.group_ids[0] if hasattr(body, "group_ids") else
             body.groups[0].group_id if hasattr(body, "groups") else body.group_id)
    # FindCoordinator creates __consumer_offsets when it does not exist yet
    live = [b for b in c.broker_ids if c.is_running(b)]
    _request(c, live[0], FindCoordinatorRequest(key_type=0, coordinator_keys=[group]), 4)
    for b in live:
        resp = _request(c, b, body, version)
        groups = getattr(resp, "groups", None)
        err = groups[0].error_code if groups else resp.error_code
        if err not in (Errors.NOT_COORDINATOR, Errors.COORDINATOR_LOAD_IN_PROGRESS,
                       Errors.COORDINATOR_NOT_AVAILABLE):
            return resp
    return None


def _members(c: Cluster, group: str) -> int:
    resp = _coordinator_answer(c, ShareGroupDescribeRequest(group_ids=[group]), 1)
    return -1 if resp is None else len(resp.groups[0].members)


def test_bad_input_gets_kafka_codes(cluster: Cluster) -> None:
    from confluent_kafka import TopicCollection
    from confluent_kafka.admin import AdminClient
    topic, group = "share-bad", "share-bad-g"
    create_topic(cluster, topic)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    desc = admin.describe_topics(TopicCollection([topic]))[topic].result(30)
    leader = desc.partitions[0].leader.id
    u = desc.topic_id
    tid = uuid.UUID(int=(u.get_most_significant_bits() % 2**64) << 64 | u.get_least_significant_bits() % 2**64)
    member = str(uuid.uuid4())
    R = ShareFetchRequest
    # an unknown share session
    resp = _request(cluster, leader, R(group_id=group, member_id=member, share_session_epoch=3, max_wait_ms=0,
                                       max_records=10, batch_size=10, topics=[]), 1)
    assert resp.error_code == Errors.SHARE_SESSION_NOT_FOUND
    # ShareAcknowledge cannot open a session
    A = ShareAcknowledgeRequest
    resp = _request(cluster, leader, A(group_id=group, member_id=member, share_session_epoch=0, topics=[]), 1)
    assert resp.error_code == Errors.INVALID_SHARE_SESSION_EPOCH
    # a session opened; then acknowledging a record this member never acquired
    resp = _request(cluster, leader, R(group_id=group, member_id=member, share_session_epoch=0, max_wait_ms=0,
                                       max_records=10, batch_size=10, topics=[R.FetchTopic(topic_id=tid, partitions=[
                                           R.FetchPartition(partition_index=0)])]), 1)
    assert resp.error_code == 0
    resp = _request(cluster, leader, A(group_id=group, member_id=member, share_session_epoch=1, topics=[
        A.AcknowledgeTopic(topic_id=tid, partitions=[A.AcknowledgePartition(partition_index=0, acknowledgement_batches=[
            A.AcknowledgementBatch(first_offset=0, last_offset=0, acknowledge_types=[1])])])]), 1)
    assert resp.error_code == 0
    assert resp.responses[0].partitions[0].error_code == Errors.INVALID_RECORD_STATE
    # a wrong epoch
    resp = _request(cluster, leader, A(group_id=group, member_id=member, share_session_epoch=7, topics=[]), 1)
    assert resp.error_code == Errors.INVALID_SHARE_SESSION_EPOCH
    # heartbeats: an unknown member, then a stale epoch
    H = ShareGroupHeartbeatRequest
    resp = wait_for(lambda: _coordinator_answer(cluster, H(group_id=group, member_id=member, member_epoch=0,
                                                           subscribed_topic_names=[topic]), 1),
                    timeout=30, what="the coordinator")
    assert resp.error_code == 0 and resp.member_epoch >= 1
    resp = _coordinator_answer(cluster, H(group_id=group, member_id=member, member_epoch=resp.member_epoch + 5), 1)
    assert resp.error_code == Errors.FENCED_MEMBER_EPOCH
    resp = _coordinator_answer(cluster, H(group_id=group, member_id="nobody", member_epoch=3), 1)
    assert resp.error_code == Errors.UNKNOWN_MEMBER_ID
    resp = _coordinator_answer(cluster, H(group_id=group, member_id="", member_epoch=0), 1)
    assert resp.error_code == Errors.INVALID_REQUEST
    for b in cluster.broker_ids:
        assert "Traceback" not in cluster.log_path(b).read_text()


def test_share_apis_advertised_only_when_enabled(cluster: Cluster, cluster_factory) -> None:
    keys = {k.api_key for k in _request(cluster, cluster.broker_ids[0], ApiVersionsRequest(), 3).api_keys}
    assert {76, 77, 78, 79} <= keys
    off = cluster_factory(brokers=1, broker_overrides={"group.share.enable": "false"})
    keys = {k.api_key for k in _request(off, off.broker_ids[0], ApiVersionsRequest(), 3).api_keys}
    assert not {76, 77, 78, 79} & keys


def test_read_committed_never_delivers_aborted_records(cluster: Cluster) -> None:
    """share.isolation.level=read_committed skips aborted transactions; share.auto.offset.reset
    by_duration starts at the first record of that period."""
    from confluent_kafka import Producer
    topic = "share-txn"
    create_topic(cluster, topic)
    p = Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": "share-txn-p"})
    p.init_transactions(30)
    for outcome in ("abort", "commit"):
        p.begin_transaction()
        for i in range(5):
            p.produce(topic, value=f"{outcome}-{i}".encode())
        p.flush(30)
        (p.abort_transaction if outcome == "abort" else p.commit_transaction)(30)
    for level, reset, expected in (("read_committed", "earliest", {"commit"}),
                                   ("read_uncommitted", "earliest", {"abort", "commit"}),
                                   # the records of the last hour: all of them
                                   ("read_committed", "by_duration:PT1H", {"commit"})):
        group = f"share-txn-{level}-{reset[:2]}"
        read_from_earliest(cluster, group, share_isolation_level=level, share_auto_offset_reset=reset)
        sc = share_consumer(cluster, group, topic)
        try:
            got: list = []
            deadline = time.time() + 15
            while time.time() < deadline and len(got) < 5 * len(expected):
                got += records(sc.poll(0.5))
            time.sleep(0.5)
            got += records(sc.poll(0.5))
            assert {m.value().split(b"-")[0].decode() for m in got} == expected, [m.value() for m in got]
            assert len(got) == 5 * len(expected)
            sc.commit_sync(30)
        finally:
            sc.close()


def test_chunked_partition_older_chunks_read_through_the_active_leader(cluster: Cluster) -> None:
    """A chunked partition (KIP-1163-style chunks on other brokers): the share-partition lives on the
    active chunk's leader, which reads the older chunks' records from their replicas."""
    from tests.test_chunks_data import create_chunk
    from tests.test_chunks_data import create_topic as create_chunked
    from tests.test_chunks_data import produce as produce_to
    topic, group = "share-chunked", "share-chunked-g"
    create_chunked(cluster, topic, [1])
    produce_to(cluster, topic, [b"one-%d" % i for i in range(10)])
    create_chunk(cluster, topic, [2])
    produce_to(cluster, topic, [b"two-%d" % i for i in range(10)])
    create_chunk(cluster, topic, [3])
    produce_to(cluster, topic, [b"three-%d" % i for i in range(10)])
    read_from_earliest(cluster, group)
    sc = share_consumer(cluster, group, topic)
    try:
        got: list = []
        deadline = time.time() + 30
        while len(got) < 30 and time.time() < deadline:
            got += records(sc.poll(0.5))
        sc.commit_sync(30)
        assert sorted(m.offset() for m in got) == list(range(30))
        assert {m.value() for m in got} == {b"%s-%d" % (w, i) for w in (b"one", b"two", b"three") for i in range(10)}
        assert {m.delivery_count() for m in got} == {1}
    finally:
        sc.close()


def _topic_id(c: Cluster, topic: str) -> uuid.UUID:
    from confluent_kafka import TopicCollection
    from confluent_kafka.admin import AdminClient
    admin = AdminClient({"bootstrap.servers": c.bootstrap})
    u = admin.describe_topics(TopicCollection([topic]))[topic].result(30).topic_id
    return uuid.UUID(int=(u.get_most_significant_bits() % 2**64) << 64 | u.get_least_significant_bits() % 2**64)


def _share_coordinator_answer(c: Cluster, body, version: int):
    """The answer of the broker whose share coordinator holds the key (None while none does)."""
    for b in c.broker_ids:
        if not c.is_running(b):
            continue
        resp = _request(c, b, body, version)
        err = resp.results[0].partitions[0].error_code
        if err not in (Errors.NOT_COORDINATOR, Errors.COORDINATOR_LOAD_IN_PROGRESS, Errors.COORDINATOR_NOT_AVAILABLE):
            return resp
    return None


def test_initialize_and_summarize_share_group_state(cluster: Cluster) -> None:
    """InitializeShareGroupState sets where a share-partition starts; ReadShareGroupStateSummary
    reports start offsets, epochs and how many records past the start are done."""
    from protocol.generated.initialize_share_group_state import InitializeShareGroupStateRequest as I
    from protocol.generated.read_share_group_state_summary import ReadShareGroupStateSummaryRequest as S
    topic, group = "share-init", "share-init-g"
    create_topic(cluster, topic)
    produce(cluster, topic, 20)
    tid = _topic_id(cluster, topic)
    resp = wait_for(lambda: _share_coordinator_answer(cluster, I(group_id=group, topics=[I.InitializeStateData(
        topic_id=tid, partitions=[I.PartitionData(partition=0, state_epoch=1, start_offset=15)])]), 0),
        timeout=30, what="the share coordinator")
    assert resp.results[0].partitions[0].error_code == 0
    sc = share_consumer(cluster, group, topic, explicit=True)
    try:
        got: list = []
        deadline = time.time() + 30
        while len(got) < 5 and time.time() < deadline:
            got += records(sc.poll(0.5))
        assert sorted(m.offset() for m in got) == [15, 16, 17, 18, 19]
        for m in got:
            sc.acknowledge(m)  # ACCEPT, the one for offset 15 last
        sc.commit_sync(30)
    finally:
        sc.close()
    summary = S(group_id=group, topics=[S.ReadStateSummaryData(topic_id=tid, partitions=[
        S.PartitionData(partition=0, leader_epoch=-1)])])
    p = _share_coordinator_answer(cluster, summary, 1).results[0].partitions[0]
    assert (p.error_code, p.state_epoch, p.start_offset, p.delivery_complete_count) == (0, 1, 20, 0)
    # FindCoordinator with key type 2 names that share coordinator (the topic id as Kafka prints it)
    key = f"{group}:{base64.urlsafe_b64encode(tid.bytes).rstrip(b'=').decode()}:0"
    found = _request(cluster, 1, FindCoordinatorRequest(key_type=2, coordinator_keys=[key]), 4).coordinators[0]
    assert found.error_code == 0
    p = _request(cluster, found.node_id, summary, 1).results[0].partitions[0]
    assert (p.error_code, p.start_offset) == (0, 20)
    bad = _request(cluster, 1, FindCoordinatorRequest(key_type=2, coordinator_keys=["no-colons"]), 4)
    assert bad.coordinators[0].error_code == Errors.INVALID_REQUEST


def test_describe_offsets_lag_leaves_out_completed_records(cluster: Cluster) -> None:
    """DescribeShareGroupOffsets v1's Lag (KIP-1226): from the start offset to the high watermark,
    less the records past the start offset already acknowledged; the tool shows it. A
    WriteShareGroupState v1 (DeliveryCompleteCount) is written as v0's."""
    from confluent_kafka import AcknowledgeType

    from protocol.generated.describe_share_group_offsets import DescribeShareGroupOffsetsRequest as D
    from protocol.generated.read_share_group_state_summary import ReadShareGroupStateSummaryRequest as S
    from protocol.generated.write_share_group_state import WriteShareGroupStateRequest as W
    topic, group = "share-lag", "share-lag-g"
    create_topic(cluster, topic)
    read_from_earliest(cluster, group)
    produce(cluster, topic, 10)
    sc = share_consumer(cluster, group, topic, explicit=True)
    try:
        got = wait_for(lambda: records(sc.poll(1.0)), timeout=60, what="the first records")
        held = sorted(m.offset() for m in got)[:2]  # the start offset stays at the first held one
        for m in got:
            sc.acknowledge(m, AcknowledgeType.ACCEPT if m.offset() not in held else AcknowledgeType.RELEASE)
        sc.commit_sync(30)
        accepted = len(got) - len(held)
        describe = D(groups=[D.DescribeShareGroupOffsetsRequestGroup(group_id=group, topics=None)])
        p = _coordinator_answer(cluster, describe, 1).groups[0].topics[0].partitions[0]
        assert (p.error_code, p.start_offset, p.lag) == (0, held[0], 10 - held[0] - accepted), p
        assert _coordinator_answer(cluster, describe, 0).groups[0].topics[0].partitions[0].lag == -1
        rows = [r.split() for r in _tool(cluster, "tools.kafka_share_groups", "--describe", "--group",
                                         group).strip().splitlines()[1:]]
        assert [r[3:5] for r in rows] == [[str(held[0]), str(10 - held[0] - accepted)]], rows
    finally:
        sc.close()
    tid, other = _topic_id(cluster, topic), "share-lag-written"
    written = _share_coordinator_answer(cluster, W(group_id=other, topics=[W.WriteStateData(topic_id=tid, partitions=[
        W.PartitionData(partition=0, state_epoch=0, leader_epoch=0, start_offset=5, delivery_complete_count=3,
                        state_batches=[W.StateBatch(first_offset=5, last_offset=5, delivery_state=0, delivery_count=1),
                                       W.StateBatch(first_offset=6, last_offset=8, delivery_state=2, delivery_count=1)])])]),
        1)
    assert written.results[0].partitions[0].error_code == 0
    p = _share_coordinator_answer(cluster, S(group_id=other, topics=[S.ReadStateSummaryData(topic_id=tid, partitions=[
        S.PartitionData(partition=0, leader_epoch=-1)])]), 1).results[0].partitions[0]
    assert (p.error_code, p.start_offset, p.delivery_complete_count) == (0, 5, 3)


def _coordinator_of(c: Cluster, group: str) -> int:
    live = [b for b in c.broker_ids if c.is_running(b)]
    resp = _request(c, live[0], FindCoordinatorRequest(key_type=0, coordinator_keys=[group]), 4)
    return resp.coordinators[0].node_id


def test_coordinator_failover_members_rejoin_and_keep_reading(cluster: Cluster) -> None:
    """The members are in the coordinator's memory: when its broker dies, their next heartbeats
    find the new coordinator, rejoin, and go on reading; nothing accepted comes back. The group
    itself was written: its epoch goes on from where it was, and its offsets still cover the topic."""
    topic = "share-coord"
    create_topic(cluster, topic)
    leader = _leader_of(cluster, topic)
    _members(cluster, "share-coord-probe")  # __consumer_offsets exists from here
    # a group whose coordinator is not the topic's leader (groups hash to __consumer_offsets partitions)
    group = wait_for(lambda: next((g for g in (f"share-coord-g{i}" for i in range(50))
                                   if _coordinator_of(cluster, g) not in (leader, -1)), None),
                     timeout=30, what="a group coordinated away from the leader")
    coordinator = _coordinator_of(cluster, group)
    read_from_earliest(cluster, group)
    produce(cluster, topic, 50, tag="a")
    sc = share_consumer(cluster, group, topic)
    killed = None
    try:
        seen: Counter = Counter()
        deadline = time.time() + 30
        while len(seen) < 50 and time.time() < deadline:
            for m in records(sc.poll(0.5)):
                seen[m.value()] += 1
        sc.commit_sync(30)
        before = _coordinator_answer(cluster, ShareGroupDescribeRequest(group_ids=[group]), 1).groups[0].group_epoch
        killed = coordinator
        cluster.kill(killed)
        produce(cluster, topic, 50, tag="b")
        deadline = time.time() + 60
        while len(seen) < 100 and time.time() < deadline:
            for m in records(sc.poll(0.5)):
                seen[m.value()] += 1
        sc.commit_sync(30)
        assert len(seen) == 100 and max(seen.values()) == 1, (len(seen), seen.most_common(3))
        assert wait_for(lambda: _members(cluster, group) == 1, timeout=30, what="the member on the new coordinator")
        after = _coordinator_answer(cluster, ShareGroupDescribeRequest(group_ids=[group]), 1).groups[0].group_epoch
        assert after > before, (before, after)
        rows = [r.split() for r in _tool(cluster, "tools.kafka_share_groups", "--describe", "--group",
                                         group).strip().splitlines()[1:]]
        assert [r[:5] for r in rows] == [[group, topic, "0", "100", "0"]], rows
    finally:
        sc.close()
        if killed is not None:
            cluster.start_node(killed)


def _leader_of(c: Cluster, topic: str) -> int:
    from confluent_kafka.admin import AdminClient
    md = AdminClient({"bootstrap.servers": c.bootstrap}).list_topics(topic, timeout=10)
    return md.topics[topic].partitions[0].leader


def test_kill_leader_keeps_accepted_records_accepted(cluster: Cluster) -> None:
    from confluent_kafka import AcknowledgeType
    topic, group = "share-kill", "share-kill-g"
    create_topic(cluster, topic)
    read_from_earliest(cluster, group)
    produce(cluster, topic, 10)
    a = share_consumer(cluster, group, topic, explicit=True)
    killed = None
    try:
        got = wait_for(lambda: records(a.poll(1.0)), timeout=60, what="the first records")
        offsets = sorted(m.offset() for m in got)
        accepted = offsets[: len(offsets) // 2]
        held = offsets[len(offsets) // 2:]
        assert accepted and held
        for m in got:
            if m.offset() in accepted:
                a.acknowledge(m, AcknowledgeType.ACCEPT)
        results = a.commit_sync(30)
        assert all(e is None for e in results.values()), results
        killed = _leader_of(cluster, topic)
        cluster.kill(killed)
        wait_for(lambda: _leader_of(cluster, topic) not in (killed, -1), timeout=30, what="a new leader")
        held_records_come_back(share_consumer(cluster, group, topic, explicit=True), accepted, held)
    finally:
        a.close()
        if killed is not None:
            cluster.start_node(killed)
