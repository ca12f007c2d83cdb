"""KIP-848 consumer groups with real librdkafka consumers (`group.protocol=consumer`) against a
real 3-broker cluster (one shared by the module):

- 3 consumers on a 6-partition topic settle (server-side uniform assignor), read every record
  once, committing; the admin client describes the group as a CONSUMER group with its members and
  assignments, and ListGroups lists it with type and state.
- a fourth member joining moves only the partitions that must move: the members that keep
  partitions keep consuming them without a pause longer than a heartbeat interval or so.
- a member leaving (closing, or killed so that its session times out) moves only its own
  partitions: the others keep theirs and keep consuming them without such a pause.
- kill -9 of the coordinator's broker: the group resumes on the new coordinator, nothing lost,
  duplicates only from work not committed.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from tests.conftest import wait_for as _wait_for
from tools.cluster import Cluster

# any client error (a coordinator moving, a member rejoining) means "not yet" here
wait_for = functools.partial(_wait_for, retry_on=(Exception,))

pytestmark = pytest.mark.slow

PARTITIONS = 6
HEARTBEAT_MS = 500
BROKER = {
    "offsets.topic.num.partitions": 3,
    "replica.lag.time.max.ms": 5000,
    "broker.heartbeat.interval.ms": 500,
    "group.consumer.heartbeat.interval.ms": HEARTBEAT_MS,
    "group.consumer.session.timeout.ms": 8000,
    # the broker checks its settings within these bounds at startup, as Kafka's
    "group.consumer.min.heartbeat.interval.ms": HEARTBEAT_MS,
    "group.consumer.min.session.timeout.ms": 6000,
}
# the group config bounds (the controller checks group configs against them, as Kafka's)
CONTROLLER = {"broker.session.timeout.ms": 3000, "group.consumer.min.heartbeat.interval.ms": 500}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("kip848"), brokers=3, verbose=False, broker_overrides=BROKER,
                controller_overrides=CONTROLLER)
    try:
        c.start(timeout=90)
        yield c
    finally:
        c.stop()


def create_topic(c: Cluster, name: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": c.bootstrap})  # kept alive until the result is in
    admin.create_topics([NewTopic(name, PARTITIONS, 3)], operation_timeout=30)[name].result(30)


def produce(c: Cluster, topic: str, tag: str, n: int, pause: float = 0.0) -> set[bytes]:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": c.bootstrap, "acks": "all", "linger.ms": 5})
    failed: list = []
    values = set()
    for i in range(n):
        v = f"{tag}-{i}".encode()
        values.add(v)
        p.produce(topic, value=v, partition=i % PARTITIONS,
                  on_delivery=lambda err, m: failed.append(err) if err else None)
        p.poll(0)
        if pause:
            time.sleep(pause)
    assert p.flush(60) == 0 and not failed, failed[:3]
    return values


class Consumer(threading.Thread):
    """A librdkafka consumer with group.protocol=consumer, committing synchronously after each
    batch; remembers (partition, offset, value, receive time) of every record."""

    def __init__(self, c: Cluster, group: str, topic: str, name: str, protocol: str = "consumer") -> None:
        super().__init__(daemon=True, name=name)
        self.conf = {"bootstrap.servers": c.bootstrap, "group.id": group, "group.protocol": protocol,
                     "client.id": name, "enable.auto.commit": False, "auto.offset.reset": "earliest"}
        if protocol == "classic":
            self.conf.update({"partition.assignment.strategy": "range", "heartbeat.interval.ms": 500,
                              "session.timeout.ms": 6000})
        self.topic = topic
        self.records: list[tuple[int, int, bytes, float]] = []
        self.assignment: set[int] = set()
        self.stop_event = threading.Event()
        self.errors: list[str] = []

    def run(self) -> None:
        from confluent_kafka import Consumer as C
        from confluent_kafka import KafkaException

        consumer = C(self.conf)
        consumer.subscribe([self.topic], on_assign=lambda _, ps: self.assignment.update(p.partition for p in ps),
                           on_revoke=lambda _, ps: self.assignment.difference_update(p.partition for p in ps))
        try:
            while not self.stop_event.is_set():
                msgs = consumer.consume(500, 0.1)
                got = [m for m in msgs if m.error() is None]
                self.errors += [str(m.error()) for m in msgs if m.error() is not None]
                now = time.monotonic()
                self.records += [(m.partition(), m.offset(), m.value(), now) for m in got]
                if got:
                    try:
                        consumer.commit(asynchronous=False)
                    except KafkaException as e:
                        self.errors.append(str(e))
        finally:
            consumer.close()

    def values(self) -> list[bytes]:
        return [v for _, _, v, _ in self.records]


def stop(members: list[Consumer]) -> None:
    for m in members:
        m.stop_event.set()
    for m in members:
        m.join(30)


def describe(c: Cluster, group: str):
    from confluent_kafka.admin import AdminClient

    a = AdminClient({"bootstrap.servers": c.bootstrap})
    return a.describe_consumer_groups([group], request_timeout=10)[group].result(15)


def settled(c: Cluster, group: str, n: int):
    from confluent_kafka import ConsumerGroupState

    d = describe(c, group)
    parts = [p.partition for m in d.members for p in m.assignment.topic_partitions]
    if len(d.members) == n and sorted(parts) == list(range(PARTITIONS)) and d.state == ConsumerGroupState.STABLE:
        return d
    return None


def test_three_consumers_read_every_record_once(cluster):
    from confluent_kafka import ConsumerGroupState, ConsumerGroupTopicPartitions, ConsumerGroupType, TopicPartition
    from confluent_kafka.admin import AdminClient

    c = cluster
    topic, group = "kip848-orders", "kip848-three"
    create_topic(c, topic)
    members = [Consumer(c, group, topic, f"c{i}") for i in range(3)]
    try:
        for m in members:
            m.start()
        d = wait_for(lambda: settled(c, group, 3), 60, "3 members with 2 partitions each")
        assert d.type == ConsumerGroupType.CONSUMER and d.state == ConsumerGroupState.STABLE
        assert sorted(len(m.assignment.topic_partitions) for m in d.members) == [2, 2, 2]
        assert {m.client_id for m in d.members} == {"c0", "c1", "c2"}
        values = produce(c, topic, "v", 6000)
        wait_for(lambda: sum(len(m.records) for m in members) >= 6000, 60, "6000 records consumed")
        time.sleep(1)
        got = [v for m in members for v in m.values()]
        assert len(got) == 6000 and set(got) == values, "every record once"
        admin = AdminClient({"bootstrap.servers": c.bootstrap})
        listed = admin.list_consumer_groups(types={ConsumerGroupType.CONSUMER}, request_timeout=10).result(15)
        assert group in {g.group_id for g in listed.valid}
    finally:
        stop(members)
    # everything consumed was committed
    res = admin.list_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in range(PARTITIONS)])])
    assert sum(tp.offset for tp in res[group].result(15).topic_partitions) == 6000


def test_a_joining_member_moves_only_what_must_move(cluster):
    c = cluster
    topic, group = "kip848-flow", "kip848-join"
    create_topic(c, topic)
    members = [Consumer(c, group, topic, f"j{i}") for i in range(3)]
    flowing = threading.Event()
    produced: set[bytes] = set()

    def flow() -> None:
        i = 0
        while not flowing.is_set():
            produced.update(produce(c, topic, f"f{i}", 60, pause=0.004))
            i += 1

    feeder = threading.Thread(target=flow, daemon=True)
    try:
        for m in members[:3]:
            m.start()
        wait_for(lambda: settled(c, group, 3), 60, "3 members settled")
        feeder.start()
        time.sleep(2)
        before = {m.name: set(m.assignment) for m in members}
        joined_at = time.monotonic()
        extra = Consumer(c, group, topic, "j3")
        extra.start()
        members.append(extra)
        wait_for(lambda: settled(c, group, 4), 60, "4 members settled")
        time.sleep(2)
        flowing.set()
        feeder.join(60)
        after = {m.name: set(m.assignment) for m in members}
        moved = sum(len(before[n] - after[n]) for n in before)
        assert moved == 1, (before, after)  # 6 partitions over 3 -> 4 members: one moves
        assert_kept_flowing(members[:3], before, after, joined_at)
        wait_for(lambda: set(v for m in members for v in m.values()) >= produced, 60, "everything consumed")
    finally:
        flowing.set()
        stop(members)


# a consumer in a process of its own, so that the test can kill -9 it; it prints "A p,p,..."
# on each assignment change and "R partition value" per record, committing after each batch
_CHILD = """
import sys
from confluent_kafka import Consumer
conf, topic = eval(sys.argv[1]), sys.argv[2]
c = Consumer(conf)
owned = set()
def show():
    print("A " + ",".join(str(p) for p in sorted(owned)), flush=True)
c.subscribe([topic], on_assign=lambda _, ps: (owned.update(p.partition for p in ps), show()),
            on_revoke=lambda _, ps: (owned.difference_update(p.partition for p in ps), show()))
while True:
    got = [m for m in c.consume(500, 0.1) if m.error() is None]
    for m in got:
        print("R %d %s" % (m.partition(), m.value().decode()), flush=True)
    if got:
        c.commit(asynchronous=False)
"""


class ChildConsumer:
    def __init__(self, c: Cluster, group: str, topic: str, name: str) -> None:
        conf = {"bootstrap.servers": c.bootstrap, "group.id": group, "group.protocol": "consumer",
                "client.id": name, "enable.auto.commit": False, "auto.offset.reset": "earliest"}
        self.name = name
        self.assignment: set[int] = set()
        self.seen: list[bytes] = []
        self.proc = subprocess.Popen([sys.executable, "-c", _CHILD, repr(conf), topic], stdout=subprocess.PIPE,
                                     text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            kind, _, rest = line.rstrip("\n").partition(" ")
            if kind == "A":
                self.assignment = {int(p) for p in rest.split(",") if p}
            elif kind == "R":
                self.seen.append(rest.partition(" ")[2].encode())

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)
        self.reader.join(10)


def assert_kept_flowing(members: list[Consumer], before: dict[str, set[int]], after: dict[str, set[int]],
                        since: float) -> None:
    """The partitions a member kept flowed on: no gap between two records' receive times past a
    couple of heartbeat intervals (the feeder writes every partition every ~0.3 s)."""
    for m in members:
        for p in before[m.name] & after[m.name]:
            times = [t for q, _, _, t in m.records if q == p and t > since - 1]
            gaps = [b - a for a, b in zip(times, times[1:])]
            assert times and max(gaps, default=0) < 2 * HEARTBEAT_MS / 1000 + 0.5, (m.name, p, max(gaps))


def test_a_leaving_member_moves_only_its_partitions(cluster):
    """One member closes (it leaves with epoch -1), then another is killed -9 (its session times
    out): each time only the leaver's partitions move, and the others' partitions flow on."""
    c = cluster
    topic, group = "kip848-leave", "kip848-leave"
    create_topic(c, topic)
    members = [Consumer(c, group, topic, f"l{i}") for i in range(4)]
    flowing = threading.Event()
    produced: set[bytes] = set()
    child: ChildConsumer | None = None

    def flow() -> None:
        i = 0
        while not flowing.is_set():
            produced.update(produce(c, topic, f"l{i}", 60, pause=0.004))
            i += 1

    feeder = threading.Thread(target=flow, daemon=True)
    try:
        for m in members:
            m.start()
        wait_for(lambda: settled(c, group, 4), 60, "4 members settled")
        feeder.start()
        time.sleep(2)
        # a member closes: it leaves at once
        leaver = members.pop()
        before = {m.name: set(m.assignment) for m in members}
        left_at = time.monotonic()
        stop([leaver])
        wait_for(lambda: settled(c, group, 3), 60, "3 members settled after a member closed")
        time.sleep(2)
        after = {m.name: set(m.assignment) for m in members}
        assert all(before[n] <= after[n] for n in before), (before, after)  # nobody lost a partition
        assert sorted(p for a in after.values() for p in a) == list(range(PARTITIONS))
        assert_kept_flowing(members, before, after, left_at)

        # a member in its own process joins, then is killed: its session expires
        child = ChildConsumer(c, group, topic, "l-child")
        wait_for(lambda: settled(c, group, 4) and child.assignment, 60, "the child member settled")
        time.sleep(2)
        before = {m.name: set(m.assignment) for m in members}
        killed_at = time.monotonic()
        child.kill()
        # the session timeout (8 s) passes before the group settles without it
        wait_for(lambda: settled(c, group, 3), 60, "3 members settled after a member was killed")
        assert time.monotonic() - killed_at > 5, "the killed member was fenced by its session timeout"
        time.sleep(2)
        after = {m.name: set(m.assignment) for m in members}
        assert all(before[n] <= after[n] for n in before), (before, after)
        assert sorted(p for a in after.values() for p in a) == list(range(PARTITIONS))
        assert_kept_flowing(members, before, after, killed_at)
        flowing.set()
        feeder.join(60)
        readers = [*members, leaver]
        wait_for(lambda: set(v for m in readers for v in m.values()) | set(child.seen) >= produced, 60,
                 "everything consumed")
    finally:
        flowing.set()
        stop(members)
        if child is not None:
            child.kill()


def test_coordinator_kill_resumes_the_group(cluster):
    from tests.test_groups import coordinator

    c = cluster
    topic, group = "kip848-kill", "kip848-kill"
    create_topic(c, topic)
    members = [Consumer(c, group, topic, f"k{i}") for i in range(3)]
    old = -1
    try:
        for m in members:
            m.start()
        wait_for(lambda: settled(c, group, 3), 60, "3 members settled")
        first = produce(c, topic, "a", 1200)
        wait_for(lambda: set(v for m in members for v in m.values()) >= first, 60, "the first records consumed")
        old = coordinator(c, group)
        c.kill(old)  # kill -9
        wait_for(lambda: (n := coordinator(c, group)) != old and n, 60, "a new coordinator")
        second = produce(c, topic, "b", 1200)
        wait_for(lambda: set(v for m in members for v in m.values()) >= first | second, 90, "consumption resumed")
        d = wait_for(lambda: settled(c, group, 3), 60, "the group settled on the new coordinator")
        assert len(d.members) == 3
        got = [v for m in members for v in m.values()]
        assert set(got) == first | second, "nothing lost"
        # duplicates only from work not committed when the coordinator died: at most one batch
        # per member and partition
        assert len(got) - len(set(got)) <= 3 * 500
    finally:
        stop(members)
        if old >= 0 and not c.is_running(old):
            c.start_node(old)


def test_group_configs_and_the_tools(cluster, capsys):
    """kafka-configs.sh --entity-type groups sets a group's heartbeat interval, which its members
    are told; kafka-consumer-groups.sh lists the group's type and describes its member epochs and
    assignments."""
    import asyncio
    import uuid

    from node.client import NodeClient
    from protocol.generated.consumer_group_heartbeat import ConsumerGroupHeartbeatRequest as H
    from tests.test_groups import coordinator
    from tools import kafka_configs, kafka_consumer_groups

    c = cluster
    topic, group = "kip848-tools", "kip848-tools"
    create_topic(c, topic)
    bs = ["--bootstrap-server", c.bootstrap]
    assert kafka_configs.main([*bs, "--alter", "--entity-type", "groups", "--entity-name", group,
                               "--add-config", "consumer.heartbeat.interval.ms=700"]) == 0
    assert kafka_configs.main([*bs, "--describe", "--entity-type", "groups", "--entity-name", group]) == 0
    assert "consumer.heartbeat.interval.ms=700" in capsys.readouterr().out
    assert kafka_configs.main([*bs, "--alter", "--entity-type", "groups", "--entity-name", group,
                               "--add-config", "consumer.session.timeout.ms=1000"]) == 1  # below the minimum
    assert "group.consumer.min.session.timeout.ms" in capsys.readouterr().err

    node = wait_for(lambda: coordinator(c, group), 30, "the group's coordinator")

    async def heartbeat(body: H):
        async with NodeClient(c.host, c.broker_port(node), timeout=10) as cl:
            return await cl.request(body, 1)

    member = str(uuid.uuid4())
    r = wait_for(lambda: (x := asyncio.run(heartbeat(H(
        group_id=group, member_id=member, member_epoch=0, rebalance_timeout_ms=30000,
        subscribed_topic_names=[topic], topic_partitions=[])))).error_code == 0 and x, 30, "a join")
    assert r.heartbeat_interval_ms == 700 and r.member_epoch == 1
    assert sorted(r.assignment.topic_partitions[0].partitions) == list(range(PARTITIONS))
    bad = asyncio.run(heartbeat(H(group_id=group, member_id=member, member_epoch=7)))
    assert bad.error_code == 110 and bad.error_message  # FENCED_MEMBER_EPOCH, with Kafka's message

    capsys.readouterr()
    assert kafka_consumer_groups.main([*bs, "--list", "--type"]) == 0
    assert any(line.split() == [group, "Consumer"] for line in capsys.readouterr().out.splitlines())
    assert kafka_consumer_groups.main([*bs, "--describe", "--group", group, "--members", "--verbose"]) == 0
    out = capsys.readouterr().out
    assert "CURRENT-EPOCH" in out and "TARGET-ASSIGNMENT" in out and member in out
    assert f"{topic}(0,1,2,3,4,5)" in out
    left = asyncio.run(heartbeat(H(group_id=group, member_id=member, member_epoch=-1)))
    assert (left.error_code, left.member_epoch) == (0, -1)


@pytest.mark.parametrize("strategy", ["range", "cooperative-sticky"])
def test_rolling_upgrade_and_downgrade_keep_consuming(cluster, strategy):
    """KIP-848's migration with real clients: a classic group's members (eager range, or
    cooperative-sticky) restart one by one with group.protocol=consumer (the group converts
    while it consumes), then back one by one (it converts back when the last consumer-protocol
    member leaves); nothing lost, offsets kept."""
    from confluent_kafka import ConsumerGroupType

    c = cluster
    topic = group = f"kip848-migrate-{strategy}"
    create_topic(c, topic)

    def classic(name: str) -> Consumer:
        m = Consumer(c, group, topic, name, protocol="classic")
        m.conf["partition.assignment.strategy"] = strategy
        return m

    members = [classic(f"old{i}") for i in range(3)]
    everyone = list(members)
    produced: set[bytes] = set()

    def step(tag: str) -> None:
        produced.update(produce(c, topic, tag, 300))
        wait_for(lambda: set(v for m in everyone for v in m.values()) >= produced, 60, f"{tag} consumed")

    try:
        for m in members:
            m.start()
        wait_for(lambda: settled(c, group, 3), 60, "a classic group of 3")
        assert describe(c, group).type == ConsumerGroupType.CLASSIC
        step("start")
        for phase, protocol in (("up", "consumer"), ("down", "classic")):
            for i in range(3):
                stop([members.pop(0)])
                new = Consumer(c, group, topic, f"{phase}{i}") if protocol == "consumer" else classic(f"{phase}{i}")
                new.start()
                members.append(new)
                everyone.append(new)
                wait_for(lambda: settled(c, group, 3), 60, f"3 members after {phase} step {i}")
                step(f"{phase}{i}")
            wanted = ConsumerGroupType.CONSUMER if protocol == "consumer" else ConsumerGroupType.CLASSIC
            assert wait_for(lambda w=wanted: describe(c, group).type == w, 30, f"the group {phase}graded")
    finally:
        stop(everyone)
    got = [v for m in everyone for v in m.values()]
    assert set(got) == produced, "nothing lost"
    assert len(got) - len(produced) <= 6 * 500, "duplicates only from uncommitted batches"


def test_regex_subscription_and_static_member_restart(cluster):
    """A librdkafka regular expression subscription resolved on the broker (a matching topic
    created later is picked up), and a static member (group.instance.id) that restarts taking
    its partitions back without the group moving anything else."""
    c = cluster
    group = "kip848-rx"
    create_topic(c, "kip848-rx-a")
    rx = Consumer(c, group, "^kip848-rx-.*", "rx")
    rx.start()
    try:
        wait_for(lambda: rx.assignment == set(range(PARTITIONS)), 60, "the regex's first topic assigned")
        create_topic(c, "kip848-rx-b")
        values = produce(c, "kip848-rx-b", "rx", 60)
        wait_for(lambda: set(rx.values()) >= values, 60, "the topic created later consumed")
    finally:
        stop([rx])

    sgroup, topic = "kip848-static", "kip848-static"
    create_topic(c, topic)
    members = []
    for i in range(2):
        m = Consumer(c, sgroup, topic, f"s{i}")
        m.conf["group.instance.id"] = f"instance-{i}"
        members.append(m)
        m.start()
    try:
        d = wait_for(lambda: settled(c, sgroup, 2), 60, "2 static members settled")
        before = {m.client_id: {p.partition for p in m.assignment.topic_partitions} for m in d.members}
        stop([members[0]])  # leaves with epoch -2: its partitions wait for it
        again = Consumer(c, sgroup, topic, "s0")
        again.conf["group.instance.id"] = "instance-0"
        again.start()
        members.append(again)
        d = wait_for(lambda: settled(c, sgroup, 2), 60, "the static member back")
        after = {m.client_id: {p.partition for p in m.assignment.topic_partitions} for m in d.members}
        assert after == before, (before, after)
    finally:
        stop(members)


def test_rolling_upgrade_of_static_cooperative_members(cluster):
    """KIP-848's migration with static classic members (group.instance.id) on librdkafka's
    cooperative-sticky assignor: each restarts under the consumer protocol with its instance id
    and replaces its old self at once (a classic static member sends no LeaveGroup), then back;
    the group converts each way while it consumes, nothing lost."""
    from confluent_kafka import ConsumerGroupType

    c = cluster
    topic, group = "kip848-coop", "kip848-coop"
    create_topic(c, topic)

    def member(name: str, protocol: str, i: int) -> Consumer:
        m = Consumer(c, group, topic, name, protocol=protocol)
        m.conf["group.instance.id"] = f"coop-{i}"
        if protocol == "classic":
            m.conf["partition.assignment.strategy"] = "cooperative-sticky"
        return m

    members = [member(f"old{i}", "classic", i) for i in range(3)]
    everyone = list(members)
    produced: set[bytes] = set()

    def step(tag: str) -> None:
        produced.update(produce(c, topic, tag, 300))
        wait_for(lambda: set(v for m in everyone for v in m.values()) >= produced, 60, f"{tag} consumed")

    try:
        for m in members:
            m.start()
        wait_for(lambda: settled(c, group, 3), 60, "a classic group of 3 static members")
        step("start")
        for phase, protocol in (("up", "consumer"), ("down", "classic")):
            for i in range(3):
                stop([members.pop(0)])
                new = member(f"{phase}{i}", protocol, i)
                new.start()
                members.append(new)
                everyone.append(new)
                name = f"{phase}{i}"
                # the old static member stays until its successor replaces it: wait for that
                wait_for(lambda n=name: (d := settled(c, group, 3)) and n in {m.client_id for m in d.members}, 60,
                         f"{name} in place of its predecessor")
                step(name)
            wanted = ConsumerGroupType.CONSUMER if protocol == "consumer" else ConsumerGroupType.CLASSIC
            assert wait_for(lambda w=wanted: describe(c, group).type == w, 30, f"the group {phase}graded")
    finally:
        stop(everyone)
    got = [v for m in everyone for v in m.values()]
    assert set(got) == produced, "nothing lost"
    assert len(got) - len(produced) <= 6 * 500, "duplicates only from uncommitted batches"
