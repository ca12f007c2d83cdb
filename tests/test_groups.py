"""Consumer groups: real clients in one consumer group against a real 3-broker cluster.

- 4 members (2 aiokafka, 1 kafka-python, 1 confluent-kafka, each in its own thread) on a
  6-partition topic rebalance as they join and leave: after every change the group is Stable with
  disjoint assignments covering all 6 partitions, on the coordinator and in the clients; every
  message produced meanwhile is consumed.
- After all stop (committing synchronously) and restart, consumption resumes at the committed
  offsets: nothing skipped, nothing repeated.
- kill -9 of the coordinator's broker (__consumer_offsets has RF 3) moves the group with its
  offsets to the new partition leader, and consumption continues from the committed offsets.
- A static member (group.instance.id, kafka-python) restarts without a rebalance.
"""

from __future__ import annotations

import asyncio
import functools
import struct
import threading
import time
from collections import Counter

import pytest

from node.client import NodeClient
from protocol.errors import Errors
from protocol.generated.describe_groups import DescribeGroupsRequest
from protocol.generated.find_coordinator import FindCoordinatorRequest
from protocol.generated.heartbeat import HeartbeatRequest
from protocol.generated.offset_fetch import OffsetFetchRequest
from tests.conftest import wait_for as _wait_for
from tools.cluster import Cluster

# any client error (a coordinator moving, a member rejoining) means "not yet" here
wait_for = functools.partial(_wait_for, retry_on=(Exception,))

pytestmark = pytest.mark.slow

PARTITIONS = 6
BROKER = {
    "group.initial.rebalance.delay.ms": 1000,
    "offsets.topic.num.partitions": 6,
    "replica.lag.time.max.ms": 5000,
    "broker.heartbeat.interval.ms": 500,
}
CONTROLLER = {"broker.session.timeout.ms": 3000}
CLIENT_TIMING = {"heartbeat": 500, "session": 10000, "max_poll": 30000}


# ---------------------------------------------------------------------------------- helpers

def start_cluster(cluster_factory) -> Cluster:
    return cluster_factory(brokers=3, verbose=False, broker_overrides=BROKER, controller_overrides=CONTROLLER)


def create_topic(c: Cluster, name: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    a = AdminClient({"bootstrap.servers": c.bootstrap})
    a.create_topics([NewTopic(name, PARTITIONS, 3)], operation_timeout=30)[name].result(30)


def parse_assignment(data: bytes) -> set[tuple[str, int]]:
    """ConsumerProtocolAssignment (v0 prefix): the partitions it assigns."""
    if not data:
        return set()
    pos = 2
    (n,) = struct.unpack_from(">i", data, pos)
    pos += 4
    out = set()
    for _ in range(n):
        (ln,) = struct.unpack_from(">h", data, pos)
        topic = data[pos + 2 : pos + 2 + ln].decode()
        pos += 2 + ln
        (np,) = struct.unpack_from(">i", data, pos)
        pos += 4
        for _ in range(np):
            out.add((topic, struct.unpack_from(">i", data, pos)[0]))
            pos += 4
    return out


async def _ask(c: Cluster, node: int, body, version: int):
    async with NodeClient(c.host, c.broker_port(node), timeout=10) as cl:
        return await cl.request(body, version)


def ask(c: Cluster, node: int, body, version: int):
    return asyncio.run(_ask(c, node, body, version))


def coordinator(c: Cluster, group: str) -> int:
    """The coordinator's node id, asked of a live broker."""
    for node in c.broker_ids:
        if not c.is_running(node):
            continue
        r = ask(c, node, FindCoordinatorRequest(key=group, key_type=0), 3)
        if r.error_code == 0 and c.is_running(r.node_id):
            return r.node_id
    raise AssertionError(f"no coordinator for {group} yet")


def describe(c: Cluster, group: str):
    node = coordinator(c, group)
    d = ask(c, node, DescribeGroupsRequest(groups=[group]), 5).groups[0]
    assert d.error_code == 0, d
    return d


def committed(c: Cluster, group: str, topic: str) -> dict[int, int]:
    node = coordinator(c, group)
    r = ask(c, node, OffsetFetchRequest(group_id=group, topics=[
        OffsetFetchRequest.OffsetFetchRequestTopic(name=topic, partition_indexes=list(range(PARTITIONS)))]), 7)
    assert r.error_code == 0, r
    return {p.partition_index: p.committed_offset for p in r.topics[0].partitions}


class Producer:
    """confluent-kafka, acks=all; values '<tag>-<n>' to partition n % 6; remembers what was acked."""

    def __init__(self, c: Cluster) -> None:
        from confluent_kafka import Producer as P

        self.p = P({"bootstrap.servers": c.bootstrap, "acks": "all", "linger.ms": 5, "message.timeout.ms": 60000})
        self.acked: dict[bytes, tuple[int, int]] = {}
        self.failed: list = []
        self.sent = 0

    def _cb(self, err, m) -> None:
        if err is None:
            self.acked[m.value()] = (m.partition(), m.offset())
        else:
            self.failed.append(err)

    def send(self, topic: str, tag: str, n: int, pause: float = 0.0) -> set[bytes]:
        values = set()
        for i in range(self.sent, self.sent + n):
            v = f"{tag}-{i}".encode()
            values.add(v)
            self.p.produce(topic, value=v, partition=i % PARTITIONS, on_delivery=self._cb)
            self.p.poll(0)
            if pause:
                time.sleep(pause)
        self.sent += n
        assert self.p.flush(60) == 0
        assert not self.failed, self.failed[:3]
        return values

    def end_offsets(self) -> dict[int, int]:
        return {p: 1 + max(off for part, off in self.acked.values() if part == p) for p in range(PARTITIONS)}


class Member(threading.Thread):
    """One group member in its own thread: consumes, records (partition, offset, value), commits
    synchronously after every batch and when partitions are revoked, and tracks its assignment."""

    def __init__(self, kind: str, name: str, c: Cluster, group: str, topic: str, instance_id: str | None = None):
        super().__init__(name=name, daemon=True)
        self.kind, self.bootstrap, self.group, self.topic, self.instance_id = kind, c.bootstrap, group, topic, instance_id
        self.records: list[tuple[int, int, bytes]] = []
        self.assignment: frozenset[int] = frozenset()
        self.assigned_events = 0
        self.revoked_events = 0
        self.stop_event = threading.Event()
        self.error: BaseException | None = None

    def assigned(self, partitions) -> None:
        self.assignment = frozenset(partitions)
        self.assigned_events += 1

    def revoked(self) -> None:
        self.assignment = frozenset()
        self.revoked_events += 1

    def run(self) -> None:
        try:
            getattr(self, f"_run_{self.kind}")()
        except BaseException as e:  # surfaced by stop()
            self.error = e

    def stop(self, timeout: float = 30) -> None:
        self.stop_event.set()
        self.join(timeout)
        assert not self.is_alive(), f"{self.name} did not stop"
        assert self.error is None, f"{self.name} failed: {self.error!r}"

    # ---- aiokafka
    def _run_aiokafka(self) -> None:
        async def final_commit(coro) -> None:
            try:
                await coro
            except Exception:
                pass  # members stopping together rebalance the group: the per-batch commits stand

        async def main() -> None:
            from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener

            consumer = AIOKafkaConsumer(
                bootstrap_servers=self.bootstrap, group_id=self.group, client_id=self.name,
                enable_auto_commit=False, auto_offset_reset="earliest",
                heartbeat_interval_ms=CLIENT_TIMING["heartbeat"], session_timeout_ms=CLIENT_TIMING["session"],
                max_poll_interval_ms=CLIENT_TIMING["max_poll"], metadata_max_age_ms=3000,
            )
            member = self

            class Listener(ConsumerRebalanceListener):
                async def on_partitions_revoked(self, revoked):
                    try:
                        await consumer.commit()
                    except Exception:
                        pass
                    member.revoked()

                async def on_partitions_assigned(self, assigned):
                    member.assigned(tp.partition for tp in assigned)

            consumer.subscribe([self.topic], listener=Listener())
            await consumer.start()
            try:
                while not self.stop_event.is_set():
                    batch = await consumer.getmany(timeout_ms=200)
                    for msgs in batch.values():
                        self.records.extend((m.partition, m.offset, m.value) for m in msgs)
                    if batch:
                        try:
                            await consumer.commit()
                        except Exception:
                            pass  # a rebalance: the revoke listener committed
                await final_commit(consumer.commit())
            finally:
                await consumer.stop()

        asyncio.run(main())

    # ---- kafka-python
    def _run_kafka_python(self) -> None:
        from kafka import ConsumerRebalanceListener, KafkaConsumer

        consumer = KafkaConsumer(
            bootstrap_servers=self.bootstrap, group_id=self.group, client_id=self.name,
            group_instance_id=self.instance_id, enable_auto_commit=False, auto_offset_reset="earliest",
            heartbeat_interval_ms=CLIENT_TIMING["heartbeat"], session_timeout_ms=CLIENT_TIMING["session"],
            max_poll_interval_ms=CLIENT_TIMING["max_poll"], metadata_max_age_ms=3000,
        )
        member = self

        class Listener(ConsumerRebalanceListener):
            def on_partitions_revoked(self, revoked):
                try:
                    consumer.commit()
                except Exception:
                    pass
                member.revoked()

            def on_partitions_assigned(self, assigned):
                member.assigned(tp.partition for tp in assigned)

        consumer.subscribe([self.topic], listener=Listener())
        try:
            while not self.stop_event.is_set():
                batch = consumer.poll(timeout_ms=200)
                for msgs in batch.values():
                    self.records.extend((m.partition, m.offset, m.value) for m in msgs)
                if batch:
                    try:
                        consumer.commit()
                    except Exception:
                        pass
            try:
                consumer.commit()
            except Exception:
                pass  # members stopping together rebalance the group: the per-batch commits stand
        finally:
            consumer.close(autocommit=False)

    # ---- confluent-kafka
    def _run_confluent(self) -> None:
        from confluent_kafka import Consumer, KafkaException

        conf = {
            "bootstrap.servers": self.bootstrap, "group.id": self.group, "client.id": self.name,
            "enable.auto.commit": False, "auto.offset.reset": "earliest",
            "heartbeat.interval.ms": CLIENT_TIMING["heartbeat"], "session.timeout.ms": CLIENT_TIMING["session"],
            "max.poll.interval.ms": CLIENT_TIMING["max_poll"], "topic.metadata.refresh.interval.ms": 3000,
        }
        if self.instance_id:
            conf["group.instance.id"] = self.instance_id
        consumer = Consumer(conf)

        def on_assign(cons, parts):
            self.assigned(p.partition for p in parts)

        def on_revoke(cons, parts):
            try:
                cons.commit(asynchronous=False)
            except KafkaException:
                pass
            self.revoked()

        consumer.subscribe([self.topic], on_assign=on_assign, on_revoke=on_revoke)
        try:
            while not self.stop_event.is_set():
                msgs = consumer.consume(500, 0.2)
                good = [m for m in msgs if m.error() is None]
                self.records.extend((m.partition(), m.offset(), m.value()) for m in good)
                if good:
                    try:
                        consumer.commit(asynchronous=False)
                    except KafkaException:
                        pass
            try:
                consumer.commit(asynchronous=False)
            except KafkaException:
                pass  # nothing consumed since the last commit
        finally:
            consumer.close()


def stable_with(c: Cluster, group: str, members: list[Member], topic: str):
    """The group is Stable with exactly these members, their assignments (on the coordinator and
    in the clients) disjoint and covering every partition."""
    d = describe(c, group)
    if d.group_state != "Stable" or len(d.members) != len(members):
        return None
    server = [parse_assignment(m.member_assignment) for m in d.members]
    everything = {(topic, p) for p in range(PARTITIONS)}
    if sum(len(a) for a in server) != PARTITIONS or set().union(*server) != everything:
        return None
    client = [m.assignment for m in members]
    if sum(len(a) for a in client) != PARTITIONS or set().union(*client) != set(range(PARTITIONS)):
        return None
    assert all(server), f"every member has partitions with 6 partitions and {len(members)} members"
    return d


def consumed_values(members: list[Member]) -> Counter:
    return Counter(v for m in members for _, _, v in m.records)


def stop_all(members: list[Member], check: bool = True) -> None:
    """Stop members (in parallel); with check, each must stop cleanly."""
    for m in members:
        m.stop_event.set()
    for m in members:
        if m.ident is not None:
            m.join(30)
    if check:
        for m in members:
            m.stop()


# ---------------------------------------------------------------------------------- tests
def test_four_clients_rebalance_and_resume_from_committed_offsets(cluster_factory):
    c = start_cluster(cluster_factory)
    topic, group = "orders", "four-clients"
    create_topic(c, topic)
    producer = Producer(c)
    kinds = [("aiokafka", "aio-1"), ("kafka_python", "kp-1"), ("confluent", "ck-1"), ("aiokafka", "aio-2")]
    members: list[Member] = []
    all_members: list[Member] = []
    produced: set[bytes] = set()
    restarted: list[Member] = []
    try:
        # members join one by one while messages flow; after each join the group settles
        for kind, name in kinds:
            m = Member(kind, name, c, group, topic)
            m.start()
            members.append(m)
            all_members.append(m)
            produced |= producer.send(topic, "run", 60, pause=0.005)
            d = wait_for(lambda: stable_with(c, group, members, topic), 60, f"a stable group of {len(members)}")
            assert {x.client_id for x in d.members} == {x.name for x in members}
        # ... and leave one by one
        for name in ("aio-1", "kp-1"):
            m = next(x for x in members if x.name == name)
            m.stop()
            members.remove(m)
            produced |= producer.send(topic, "run", 60, pause=0.005)
            wait_for(lambda: stable_with(c, group, members, topic), 60, f"a stable group of {len(members)}")
        assert all(m.assigned_events >= 1 for m in all_members)
        assert max(m.assigned_events for m in all_members) >= 3, "members went through several rebalances"
        wait_for(lambda: set(consumed_values(all_members)) >= produced, 60, "every produced message consumed")
        stop_all(members)
        got = consumed_values(all_members)
        assert set(got) == produced
        repeated = {v: n for v, n in got.items() if n > 1}
        assert not repeated, f"{len(repeated)} messages consumed twice across rebalances: {list(repeated)[:5]}"

        # everything consumed was committed: the committed offsets are the log end offsets
        end = producer.end_offsets()
        assert committed(c, group, topic) == end
        assert describe(c, group).group_state == "Empty"

        # while nobody runs, more messages arrive; then all four come back
        backlog = producer.send(topic, "backlog", 300)
        restarted += [Member(kind, f"{name}-again", c, group, topic) for kind, name in kinds]
        for m in restarted:
            m.start()
        wait_for(lambda: set(consumed_values(restarted)) >= backlog, 60, "the backlog consumed")
        wait_for(lambda: stable_with(c, group, restarted, topic), 60, "a stable group of 4 again")
        more = producer.send(topic, "later", 120)
        wait_for(lambda: set(consumed_values(restarted)) >= backlog | more, 60, "new messages consumed")
        stop_all(restarted)
        again = consumed_values(restarted)
        assert not set(again) & produced, "nothing consumed before the restart was consumed again"
        assert set(again) == backlog | more, "nothing skipped"
        assert max(again.values()) == 1, "nothing consumed twice"
        firsts = {p: min(off for m in restarted for part, off, _ in m.records if part == p) for p in range(PARTITIONS)}
        assert firsts == end, "each partition resumed exactly at its committed offset"
    finally:
        stop_all(all_members + restarted, check=False)


def test_coordinator_kill_moves_the_group_and_its_offsets(cluster_factory):
    c = start_cluster(cluster_factory)
    topic, group = "payments", "survivors"
    create_topic(c, topic)
    producer = Producer(c)
    members = [Member(kind, name, c, group, topic) for kind, name in
               [("aiokafka", "aio-1"), ("kafka_python", "kp-1"), ("confluent", "ck-1"), ("aiokafka", "aio-2")]]
    try:
        for m in members:
            m.start()
        wait_for(lambda: stable_with(c, group, members, topic), 60, "a stable group of 4")
        first = producer.send(topic, "first", 600)
        wait_for(lambda: set(consumed_values(members)) >= first, 60, "the first messages consumed")
        end = producer.end_offsets()
        wait_for(lambda: committed(c, group, topic) == end, 30, "commits of everything consumed")
        before_kill = {m.name: len(m.records) for m in members}

        old = coordinator(c, group)
        c.kill(old)  # kill -9
        new = wait_for(lambda: (n := coordinator(c, group)) != old and n, 60, "a new coordinator")
        # the new coordinator has the offsets and the group with its members
        assert wait_for(lambda: committed(c, group, topic) == end, 30, "the offsets on the new coordinator")
        d = wait_for(lambda: (x := describe(c, group)).members and x, 30, "the group on the new coordinator")
        assert d.group_state in ("Stable", "PreparingRebalance", "CompletingRebalance")
        assert {m.client_id for m in d.members} <= {m.name for m in members}
        # a request for the group at a broker that is not its coordinator is turned away
        other = next(n for n in c.broker_ids if n not in (old, new))
        hb = ask(c, other, HeartbeatRequest(group_id=group, generation_id=1, member_id="x"), 3)
        assert hb.error_code == Errors.NOT_COORDINATOR

        second = producer.send(topic, "second", 600)
        wait_for(lambda: set(consumed_values(members)) >= first | second, 90, "consumption after the kill")
        wait_for(lambda: stable_with(c, group, members, topic), 60, "the group stable again")
        after = [v for m in members for _, _, v in m.records[before_kill[m.name]:]]
        assert not set(after) & first, "consumption continued from the committed offsets"
        assert set(after) == second
        final_end = producer.end_offsets()
        wait_for(lambda: committed(c, group, topic) == final_end, 30, "commits on the new coordinator")
        stop_all(members)
    finally:
        stop_all(members, check=False)


def test_static_member_restarts_without_rebalance(cluster_factory):
    c = start_cluster(cluster_factory)
    topic, group = "events", "static-group"
    create_topic(c, topic)
    producer = Producer(c)
    static = Member("kafka_python", "kp-static", c, group, topic, instance_id="static-1")
    dynamic = Member("confluent", "ck-dynamic", c, group, topic)
    replacement = None
    try:
        static.start()
        dynamic.start()
        d = wait_for(lambda: stable_with(c, group, [static, dynamic], topic), 60, "a stable group of 2")
        static_partitions = static.assignment
        old_ids = {m.member_id for m in d.members}
        events = (dynamic.assigned_events, dynamic.revoked_events)
        first = producer.send(topic, "a", 120)
        wait_for(lambda: set(consumed_values([static, dynamic])) >= first, 60, "messages consumed")

        static.stop()  # a static member sends no LeaveGroup: the group keeps its place
        assert describe(c, group).group_state == "Stable"
        second = producer.send(topic, "b", 120)
        replacement = Member("kafka_python", "kp-static-again", c, group, topic, instance_id="static-1")
        replacement.start()
        wait_for(lambda: replacement.assignment, 30, "the returning static member's assignment")
        assert replacement.assignment == static_partitions
        wait_for(lambda: set(consumed_values([static, dynamic, replacement])) >= first | second, 60,
                 "consumption after the restart")
        d2 = describe(c, group)
        assert d2.group_state == "Stable" and len(d2.members) == 2
        new_ids = {m.member_id for m in d2.members}
        assert len(new_ids & old_ids) == 1, "the static member got a new member id, the other kept its own"
        assert (dynamic.assigned_events, dynamic.revoked_events) == events, "no rebalance for the other member"
        got = consumed_values([static, dynamic, replacement])
        assert set(got) == first | second and max(got.values()) == 1
        stop_all([dynamic, replacement])
    finally:
        stop_all([m for m in (static, dynamic, replacement) if m is not None], check=False)
