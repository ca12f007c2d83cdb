"""KIP-253 acceptance: keyed order across partition count changes, end to end.

100 keys, each with its own increasing sequence, produced by 2 OrderedProducers (50 keys each)
while the topic goes 3 -> 6 -> 4 -> 8 -> 2 partitions, consumed by a 3-member OrderedConsumer
group with one member restarted mid-way: every key arrives in order without gaps or duplicates,
and each marked partition is deleted once the test empties it (DeleteRecords up to the group's
committed offsets), or, in the retention variant, once retention alone has emptied it. With `kill`, the controller is killed -9 during each alter and restarted;
the alter is retried until it is in. The stock-client run (aiokafka) shows the reordering the
ordered clients prevent. The diskless variant runs the scenario on a diskless topic (KIP-1164),
where every broker takes writes: the gates' epoch ends come from the diskless coordinator.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections import defaultdict

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from client import OrderedConsumer, OrderedProducer
from client.cluster import EARLIEST, LATEST, ClusterClient, StrataClientError
from node.client import NodeClient
from protocol.errors import Errors
from protocol.generated.offset_for_leader_epoch import OffsetForLeaderEpochRequest
from protocol.generated.produce import ProduceRequest
from protocol.records import Record, encode_batch
from tests.tcp_proxy import TcpProxy
from tests.test_kafka_topics import SCRIPT
from tests.test_partition_counts import delete_records, metadata, produce
from tools.cluster import CONTROLLER_ID, Cluster

TOPIC = "orders"
KEYS = [b"key-%03d" % i for i in range(100)]
FAST = {"partition.deletion.check.interval.ms": 200}
BROKER = {"group.initial.rebalance.delay.ms": 0}
RETENTION_MS = 20000  # the retention-alone variant's retention.ms


def alter(c: Cluster, count: int, kill: bool) -> None:
    """kafka-topics.sh --alter; with `kill`, the controller dies (-9) while it runs and comes back."""
    cmd = [SCRIPT, "--bootstrap-server", c.bootstrap, "--alter", "--topic", TOPIC, "--partitions", str(count)]
    if not kill:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        return
    log = c.log_path("controller")
    seen = log.read_text().count("event='create_partitions'")
    tool = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # killed right after it commits the alter's batch: brokers may not have it yet, the tool may
    # have no answer, and the marked partitions are not deleted yet
    deadline = time.monotonic() + 30
    while log.read_text().count("event='create_partitions'") == seen and time.monotonic() < deadline:
        time.sleep(0.01)
    c.kill("controller")
    c.start_node("controller")
    tool.communicate(timeout=60)
    if tool.returncode == 0:
        return
    # the alter is in the log whole or not at all: the operator's retry either makes it or is told
    # it is in (the caller checks the count)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 or "already has" in r.stderr or "being deleted" in r.stderr, r.stderr


async def layout(cc: ClusterClient) -> tuple[list[int], list[int]]:
    t = (await cc.refresh([TOPIC]))[TOPIC]
    return sorted(t.partitions), t.marked


async def wait_for(check, timeout: float = 60.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.2)


class Scenario:
    def __init__(self, c: Cluster) -> None:
        self.c = c
        self.sent: dict[bytes, int] = defaultdict(int)  # key -> sequences acknowledged
        self.delivered: dict[bytes, list[int]] = defaultdict(list)
        self.trace: dict[bytes, list[tuple]] = defaultdict(list)  # (seq, partition, offset, leader epoch, member)
        self.committed: dict[tuple[str, int], int] = {}
        self.slow = asyncio.Event()  # set around each alter: the group falls behind
        self.marked: set[int] = set()  # partitions a shrink marks: their members stop while it runs
        self.stop_producing = asyncio.Event()
        self.stop_consuming = asyncio.Event()
        self.started_ms = int(time.time() * 1000)
        self.unstamped = 0  # records without the producer's CreateTime

    async def produce(self, keys: list[bytes]) -> None:
        p = OrderedProducer(self.c.bootstrap, request_timeout_ms=10000)
        await p.start()
        seq = 0
        try:
            while not self.stop_producing.is_set():
                futures = [await p.send(TOPIC, b"%d" % seq, key=k) for k in keys]
                await asyncio.gather(*futures)
                for k in keys:
                    self.sent[k] = seq + 1
                seq += 1
                # paced (under 1,000 records a second in all): the group is held back on purpose
                # (2 KiB fetches, pauses around each alter), so unpaced producers would leave a
                # backlog that grows with the broker's speed, and draining it is all the test waits on
                await asyncio.sleep(0.1)
        finally:
            await p.stop()

    async def consume(self, name: str, restart_after: asyncio.Event | None = None) -> None:
        async def member() -> OrderedConsumer:
            # small fetches, and pauses around each alter: when partitions are added or marked, old
            # records are still waiting, so the gates have work to do (without either gate the
            # scenario fails, in both variants)
            m = OrderedConsumer(TOPIC, bootstrap_servers=self.c.bootstrap, group_id="ordered", client_id=name,
                                max_partition_fetch_bytes=2048)
            await m.start()
            return m

        m = await member()
        try:
            while not self.stop_consuming.is_set():
                if restart_after is not None and restart_after.is_set():
                    restart_after = None
                    await m.stop()
                    m = await member()
                got = await m.getmany(timeout_ms=200)
                for records in got.values():
                    for r in records:
                        self.delivered[r.key].append(int(r.value))
                        self.unstamped += not self.started_ms <= r.timestamp <= time.time() * 1000
                        self.trace[r.key].append((int(r.value), r.partition, r.offset, r.leader_epoch, name))
                if got:
                    await m.commit()
                    for tp in got:
                        self.committed[tp] = m.position(tp)
                    if self.slow.is_set() and any(tp[1] in self.marked for tp in got):
                        # a member of a partition the shrink marks stops until the alter is in:
                        # the kept partitions get the marked ones' keys while these still wait
                        while self.slow.is_set() and not self.stop_consuming.is_set():
                            await asyncio.sleep(0.05)
                    elif self.slow.is_set():
                        await asyncio.sleep(0.3)
        finally:
            await m.stop()

    async def drain_marked(self, cc: ClusterClient, by_retention: bool = False) -> None:
        """Empty each marked partition (DeleteRecords) whenever the group has committed all of it,
        until the controller has deleted every one. Emptied again if need be: its leader may take
        a last write while it learns of the shrink (the alter is in the controller's log first).
        `by_retention`: no DeleteRecords; retention alone empties them (kafka-topics.sh --describe
        says when), and the group must have read every record of them by then."""
        _, marked = await layout(cc)
        if by_retention:
            described = await asyncio.to_thread(subprocess.run, [SCRIPT, "--bootstrap-server", self.c.bootstrap,
                                                "--describe", "--topic", TOPIC], capture_output=True, text=True)
            lines = [ln for ln in described.stdout.splitlines() if "MarkedForDeletion: true" in ln]
            assert len(lines) == len(marked) and all("EmptiedByRetentionIn: " in ln for ln in lines), described

        async def deleted() -> bool:
            parts, _ = await layout(cc)
            left = [idx for idx in marked if idx in parts]
            for idx in [] if by_retention else left:
                try:
                    start, end = await cc.list_offset(TOPIC, idx, EARLIEST), await cc.list_offset(TOPIC, idx, LATEST)
                    if start < end <= self.committed.get((TOPIC, idx), 0):
                        code = await delete_records(self.c, TOPIC, idx, end)
                        assert code in (0, Errors.NOT_LEADER_OR_FOLLOWER, Errors.UNKNOWN_TOPIC_OR_PARTITION), code
                except StrataClientError:
                    pass  # deleted, or its leader moved, meanwhile: look again
            return not left

        await wait_for(deleted, timeout=RETENTION_MS / 1000 + 60 if by_retention else 60,
                       what="marked partitions consumed and deleted")
        for idx in marked:  # a later growth re-creates the index empty
            self.committed.pop((TOPIC, idx), None)


async def ordered_scenario(c: Cluster, kill: bool, by_retention: bool = False, diskless: bool = False,
                           counts: tuple[int, ...] = (6, 4, 8, 2), per_change: int = 1500) -> None:
    """The topic goes 3 -> each of `counts`, with `per_change` more records acknowledged before each
    change and after the last."""
    retention = ["--config", f"retention.ms={RETENTION_MS}", "--config", "segment.ms=2000"] if by_retention else []
    kind = ["--replication-factor", "1", "--config", "diskless.enable=true"] if diskless else ["--replication-factor", "2"]
    subprocess.run([SCRIPT, "--bootstrap-server", c.bootstrap, "--create", "--topic", TOPIC, "--partitions", "3",
                    *kind, *retention], check=True, capture_output=True, timeout=60)
    s = Scenario(c)
    cc = ClusterClient(c.bootstrap, "test")
    restart = asyncio.Event()
    consumers = [asyncio.create_task(s.consume(f"m{i}", restart if i == 0 else None)) for i in range(3)]
    producers = [asyncio.create_task(s.produce(KEYS[:50])), asyncio.create_task(s.produce(KEYS[50:]))]
    tasks = consumers + producers
    try:
        async def progressed(n: int) -> bool:
            for t in tasks:
                if t.done():
                    t.result()  # a failed producer or consumer fails the test at once
            return sum(s.sent.values()) >= n

        total, before = 0, 3
        for count in counts:
            total += per_change
            await wait_for(lambda n=total: progressed(n), what="traffic")
            s.slow.set()
            s.marked = set(range(count, before))  # a shrink's marked partitions: slower still
            await asyncio.sleep(1.0)
            await asyncio.to_thread(alter, c, count, kill)
            await asyncio.sleep(1.0)
            s.slow.clear()

            async def altered(n=count) -> bool:  # every broker answers from its own image: ask until in
                parts, marked = await layout(cc)
                return len(parts) - len(marked) == n

            await wait_for(altered, timeout=15, what=f"the count {count}")
            parts, marked = await layout(cc)
            if count == 4:
                restart.set()
            if marked:
                await s.drain_marked(cc, by_retention)
            s.marked = set()
            before = count
            async def settled(n=count) -> bool:
                return (await layout(cc)) == (list(range(n)), [])

            await wait_for(settled, timeout=15, what=f"exactly partitions 0-{count - 1}")
        total += per_change
        await wait_for(lambda: progressed(total), what="traffic after the last alter")
        s.stop_producing.set()
        await asyncio.gather(*producers)

        async def all_delivered() -> bool:
            await progressed(0)
            return all(len(s.delivered[k]) >= s.sent[k] for k in KEYS)

        await wait_for(all_delivered, what="every record delivered")
    finally:
        s.stop_producing.set()
        s.stop_consuming.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        await cc.close()
    for k in KEYS:
        got = s.delivered[k]
        bad = next((i for i, seq in enumerate(got) if seq != i), len(got))
        assert got == list(range(s.sent[k])), (
            f"{k!r} out of order, gaps or duplicates (sent {s.sent[k]}) near: {s.trace[k][max(0, bad - 3):bad + 3]}"
        )
    assert min(s.sent.values()) > 20
    assert s.unstamped == 0, "OrderedProducer stamps each record's CreateTime when it is sent"


@pytest.mark.parametrize("kill", [False, True], ids=["plain", "controller-kill-9-during-each-alter"])
def test_ordered_delivery_across_count_changes(cluster_factory, kill: bool) -> None:
    c = cluster_factory(controller_overrides=FAST, broker_overrides=BROKER)
    asyncio.run(ordered_scenario(c, kill))


def test_ordered_delivery_across_count_changes_by_retention_alone(cluster_factory) -> None:
    """The same scenario with no DeleteRecords: each marked partition is emptied by retention
    (retention.ms=20000; Kafka's rule that deletes an idle log's expired active segment)."""
    c = cluster_factory(controller_overrides=FAST, broker_overrides={**BROKER, "log.retention.check.interval.ms": 500})
    asyncio.run(ordered_scenario(c, False, by_retention=True))


def test_ordered_delivery_across_count_changes_diskless(cluster_factory, tmp_path) -> None:
    """A diskless topic, 3 -> 6 -> 4 -> 8: growth, a shrink whose marked partitions are drained and
    deleted, and a growth re-creating their indexes. Every broker takes writes by its own image,
    so a batch hashed over the old count can reach the coordinator after one hashed over the new
    one: the coordinator fences the epoch the change ended and answers where it ended."""
    diskless = {"diskless.storage.url": f"file://{tmp_path / 'objects'}", "diskless.wal.max.ms": "20",
                "diskless.metadata.topic.num.partitions": "2"}
    c = cluster_factory(controller_overrides={**FAST, "diskless.metadata.topic.num.partitions": "2"},
                        broker_overrides={**BROKER, **diskless})
    asyncio.run(ordered_scenario(c, False, diskless=True, counts=(6, 4, 8), per_change=600))


async def stock_scenario(c: Cluster) -> int:
    """aiokafka producer and consumer group over 3 -> 6: count keys delivered out of order."""
    subprocess.run([SCRIPT, "--bootstrap-server", c.bootstrap, "--create", "--topic", TOPIC, "--partitions", "3",
                    "--replication-factor", "1"], check=True, capture_output=True, timeout=60)
    p = AIOKafkaProducer(bootstrap_servers=c.bootstrap, metadata_max_age_ms=500)
    await p.start()
    try:
        for seq in range(20):
            await asyncio.gather(*[await p.send(TOPIC, b"%d" % seq, key=k) for k in KEYS])
        await asyncio.to_thread(subprocess.run, [SCRIPT, "--bootstrap-server", c.bootstrap, "--alter", "--topic",
                                                 TOPIC, "--partitions", "6"], check=True, capture_output=True)
        deadline = time.monotonic() + 30
        while len(p.client.cluster.partitions_for_topic(TOPIC) or ()) < 6:
            assert time.monotonic() < deadline, "the stock producer never saw the new partitions"
            await asyncio.sleep(0.2)
        for seq in range(20, 40):  # stock producers go on working after the change
            await asyncio.gather(*[await p.send(TOPIC, b"%d" % seq, key=k) for k in KEYS])
    finally:
        await p.stop()
    consumer = AIOKafkaConsumer(TOPIC, bootstrap_servers=c.bootstrap, group_id="stock", auto_offset_reset="earliest",
                                max_partition_fetch_bytes=2048)
    await consumer.start()
    delivered: dict[bytes, list[int]] = defaultdict(list)
    try:
        deadline = time.monotonic() + 60
        while sum(map(len, delivered.values())) < 40 * len(KEYS):
            assert time.monotonic() < deadline, "the stock consumer did not read everything"
            for records in (await consumer.getmany(timeout_ms=500)).values():
                for r in records:
                    delivered[r.key].append(int(r.value))
    finally:
        await consumer.stop()
    return sum(1 for k in KEYS if delivered[k] != sorted(delivered[k]))


async def stock_member_refused(c: Cluster) -> tuple[int, str]:
    """A stock consumer's JoinGroup (protocol type consumer, range/roundrobin) to a group of
    OrderedConsumers."""
    from protocol.generated.join_group import JoinGroupRequest as J

    m = OrderedConsumer(TOPIC, bootstrap_servers=c.bootstrap, group_id="mixed")
    await m.start()
    try:
        host, port = m._coordinator
        async with NodeClient(host, port) as nc:
            req = J(group_id="mixed", session_timeout_ms=10000, rebalance_timeout_ms=10000, member_id="m-stock",
                    protocol_type="consumer", protocols=[J.JoinGroupRequestProtocol("range", b""),
                                                         J.JoinGroupRequestProtocol("roundrobin", b"")])
            resp = await nc.request(req, 5)
        return resp.error_code, resp.member_id
    finally:
        await m.stop()


def test_stock_clients_reorder_keys_on_expansion(cluster_factory) -> None:
    c = cluster_factory(broker_overrides=BROKER)
    reordered = asyncio.run(stock_scenario(c))
    assert reordered > 0, "stock clients kept every key in order: the contrast is not shown"
    # and a stock consumer cannot join an ordered group (it could not gate)
    code, _ = asyncio.run(stock_member_refused(c))
    assert code == Errors.INCONSISTENT_GROUP_PROTOCOL


def test_partitioner_moves_keys_only_where_the_maps_cover() -> None:
    """murmur2 as Kafka's; linear hashing moves keys only into new partitions (growth) and only out
    of marked ones (shrink); at a power of two it is Kafka's modulo."""
    from kafka.partitioner.default import murmur2 as kafka_murmur2

    from client import murmur2, partition_for

    keys = [b"key-%d" % i for i in range(3000)]
    assert all(murmur2(k) & 0xFFFFFFFF == kafka_murmur2(k) & 0xFFFFFFFF for k in keys)
    assert all(partition_for(k, 8) == (murmur2(k) & 0x7FFFFFFF) % 8 for k in keys)
    for a, b in [(3, 6), (6, 4), (4, 8), (8, 2), (5, 7), (7, 3)]:
        for k in keys:
            pa, pb = partition_for(k, a), partition_for(k, b)
            assert pa == pb or (pb >= a if b > a else pa >= b), (a, b, k)


def test_assignment_deals_marked_partitions_apart() -> None:
    from client.group import assign, decode_assignment, encode_assignment

    plan = assign(["b", "a", "c"], [("t", i) for i in range(4)], [("t", 4), ("t", 5)])
    assert plan == {"a": [("t", 0), ("t", 3)], "b": [("t", 1), ("t", 4)], "c": [("t", 2), ("t", 5)]}
    assert decode_assignment(encode_assignment({"t": [1, 4]})) == [("t", 1), ("t", 4)]


async def recreated_partition(c: Cluster) -> None:
    """What a member knew of a partition deleted once drained is dropped when a growth re-creates
    its index: the group's position of the old one (e.g. 582) would pass a new one holding
    fewer records (560) for drained, and its gate would open early."""
    from protocol.generated.heartbeat import HeartbeatRequest as H

    subprocess.run([SCRIPT, "--bootstrap-server", c.bootstrap, "--create", "--topic", TOPIC, "--partitions", "2",
                    "--replication-factor", "1"], check=True, capture_output=True, timeout=60)
    m = OrderedConsumer(TOPIC, bootstrap_servers=c.bootstrap, group_id="re", metadata_max_age_ms=100)
    await m.start()
    cc = ClusterClient(c.bootstrap, "test")
    try:
        old = (TOPIC, 1)
        m._group_pos[old] = 582  # as a heartbeat answers it for a member waiting on partition 1
        await m._threshold(TOPIC, 1, 0)
        for count, n in ((1, 1), (2, 2)):  # 1 is marked, empty, so deleted; then re-created
            await asyncio.to_thread(alter, c, count, False)

            async def settled(n=n) -> bool:
                return (await layout(cc)) == (list(range(n)), [])

            await wait_for(settled, timeout=30, what=f"partitions 0-{n - 1}")
        await m._refresh()
        assert old not in m._group_pos and not any(k[:2] == old for k in m._thresholds)

        # and the coordinator takes no report of a partition its image lacks (one deleted)
        req = H(group_id="re", generation_id=m.generation, member_id=m.member_id,
                positions=[H.HeartbeatPositionTopic(topic=TOPIC, partitions=[H.HeartbeatPosition(partition=7, offset=582)])],
                interested_partitions=[H.HeartbeatInterestTopic(topic=TOPIC, partitions=[7])])
        for _ in range(2):  # the second answer would show the first report
            resp = await m._coord(req, 4)
        assert [(t.topic, p.partition, p.offset) for t in resp.positions for p in t.partitions] == [(TOPIC, 7, -1)]
    finally:
        await cc.close()
        await m.stop()


def test_recreated_partition_starts_without_the_deleted_ones_state(cluster_factory) -> None:
    c = cluster_factory(brokers=1, controller_overrides=FAST, broker_overrides=BROKER)
    asyncio.run(recreated_partition(c))


# ---- a leader whose metadata image lags: it still takes writes in the epoch a change ended
class Deliveries:
    """What one OrderedConsumer delivered, with the getmany() call that delivered it: records of
    different partitions returned by one call have no order between them."""

    def __init__(self, m: OrderedConsumer) -> None:
        self.m = m
        self.calls = 0
        self.got: list[tuple[int, bytes | None, bytes | None]] = []  # (call, key, value)

    async def poll(self, seconds: float = 0.0, until: bytes | None = None, timeout: float = 15.0) -> None:
        """getmany() for `seconds`, or until the value `until` is delivered."""
        deadline = time.monotonic() + (seconds or timeout)
        while until is None or not self.call_of(until):
            if time.monotonic() > deadline:
                assert until is None, f"{until!r} not delivered in {timeout} s: {self.got}"
                return
            got = await self.m.getmany(timeout_ms=100)
            self.calls += 1
            self.got += [(self.calls, r.key, r.value) for records in got.values() for r in records]

    def call_of(self, value: bytes) -> int:
        return next((call for call, _, v in self.got if v == value), 0)


def kt_ok(c: Cluster, *args: str) -> None:
    """kafka-topics.sh through broker 1 only (its Metadata names itself the controller, so the tool's
    admin requests go there, not to the broker whose controller link is held)."""
    r = subprocess.run([SCRIPT, "--bootstrap-server", f"{c.host}:{c.broker_port(1)}", *args], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr


async def partitions_seen(c: Cluster, topic: str, broker: int) -> tuple[list[int], list[int]]:
    t = await metadata(c, topic, broker)
    return [p.partition_index for p in t.partitions], [p.partition_index for p in t.partitions if p.marked_for_deletion]


async def lagging_leader(c: Cluster, link: TcpProxy) -> None:
    """Broker 2's link to the controller is held while a count change commits: broker 1 applies it,
    broker 2 keeps serving from its old image and takes a write hashed over the old count. The key's
    next record, hashed over the new count, lands on broker 1. The consumer delivers it only after
    the first one: each gate asks broker 2 at the new leader epoch, which it answers
    UNKNOWN_LEADER_EPOCH until it has applied the change."""
    K = b"moved-key"

    async def write(topic: str, partition: int, value: bytes, count: int) -> int:
        r = await produce(c, topic, partition, 1, count, records=[Record(value=value, key=K)])
        return r.error_code

    async def start(topic: str, *values: bytes) -> Deliveries:
        d = Deliveries(OrderedConsumer(topic, bootstrap_servers=f"{c.host}:{c.broker_port(1)}", group_id=topic))
        await d.m.start()
        for v in values:
            await d.poll(until=v)
        return d

    # growth: g-0 (broker 2) gets a new partition g-1 (broker 1)
    kt_ok(c, "--create", "--topic", "g", "--replica-assignment", "2")
    assert await write("g", 0, b"old", -1) == 0
    g = await start("g", b"old")
    try:
        link.hold()
        await asyncio.to_thread(kt_ok, c, "--alter", "--topic", "g", "--partitions", "2", "--replica-assignment", "2,1")
        await wait_for(lambda: _is(partitions_seen(c, "g", 1), ([0, 1], [])), what="broker 1 applies the growth")
        assert await partitions_seen(c, "g", 2) == ([0], []), "broker 2 applied the growth: the link was not held"
        await g.poll(1.0)  # the member sees g-1 (when broker 1 answers its metadata) and checks its gate
        # an OrderedProducer whose metadata came from broker 2 (count 1) writes K to g-0: broker 2 takes it
        assert await write("g", 0, b"g0", 1) == 0
        await wait_for(lambda: _taken(write("g", 1, b"g1", 2)), what="g-1 takes a write")  # K hashed over 2
        await g.poll(1.5)
        assert g.call_of(b"g0") and not g.call_of(b"g1"), f"g-1 was released before g-0's epoch ended: {g.got}"
        link.release()
        await g.poll(until=b"g1")
        assert g.call_of(b"g0") < g.call_of(b"g1"), g.got
    finally:
        link.release()
        await g.m.stop()

    # shrink: s-1 (broker 2) is marked, s-0 (broker 1) kept
    kt_ok(c, "--create", "--topic", "s", "--replica-assignment", "1,2")
    assert await write("s", 0, b"old0", -1) == 0 and await write("s", 1, b"old1", -1) == 0
    s = await start("s", b"old0", b"old1")
    try:
        link.hold()
        await asyncio.to_thread(kt_ok, c, "--alter", "--topic", "s", "--partitions", "1")
        await wait_for(lambda: _is(partitions_seen(c, "s", 1), ([0, 1], [1])), what="broker 1 applies the shrink")
        assert await partitions_seen(c, "s", 2) == ([0, 1], []), "broker 2 applied the shrink: the link was not held"
        # s-1 consumed and emptied: start == end. The deletion check asks broker 2 at the post-mark
        # epoch, so it is not deleted while broker 2 may still take a write to it
        assert await delete_records(c, "s", 1, -1) == 0
        await s.poll(1.0)  # 5 deletion checks; the member sees the mark and checks s-1 for drained
        assert await partitions_seen(c, "s", 1) == ([0, 1], [1]), "s-1 deleted while its leader takes writes"
        marked_epoch = next(p.leader_epoch for p in (await metadata(c, "s", 1)).partitions if p.partition_index == 1)
        assert await pre_mark_end(c, "s", 1, marked_epoch) == (Errors.UNKNOWN_LEADER_EPOCH, -1)
        assert await write("s", 1, b"s1", 2) == 0  # acknowledged: it must not be lost, nor overtaken
        assert await write("s", 0, b"s0", 1) == 0
        await s.poll(1.5)
        assert s.call_of(b"s1") and not s.call_of(b"s0"), f"s-0 went past its pre-shrink epoch early: {s.got}"
        link.release()
        await s.poll(until=b"s0")
        assert s.call_of(b"s1") < s.call_of(b"s0"), s.got
        # broker 2 at the post-mark epoch: its pre-mark epoch ended after s1 (old1 at 0, s1 at 1)
        assert await pre_mark_end(c, "s", 1, marked_epoch) == (0, 2)
        await s.m.commit()
    finally:
        link.release()
        await s.m.stop()
    # the marked partition is deleted once emptied again
    assert await delete_records(c, "s", 1, -1) == 0
    await wait_for(lambda: _is(partitions_seen(c, "s", 1), ([0], [])), what="s-1 deleted once empty")


async def pre_mark_end(c: Cluster, topic: str, partition: int, epoch: int) -> tuple[int, int]:
    """OffsetForLeaderEpoch of the epoch before `epoch`, asked of broker 2 at `epoch`: (error, end)."""
    OE = OffsetForLeaderEpochRequest
    req = OE(replica_id=-2, topics=[OE.OffsetForLeaderTopic(topic=topic, partitions=[
        OE.OffsetForLeaderPartition(partition=partition, current_leader_epoch=epoch, leader_epoch=epoch - 1)])])
    async with NodeClient(c.host, c.broker_port(2)) as nc:
        r = (await nc.request(req)).topics[0].partitions[0]
    return r.error_code, r.end_offset


async def _is(value, expected) -> bool:
    return await value == expected


async def _taken(error_code) -> bool:
    return await error_code == 0


def test_gates_wait_for_a_leader_that_has_not_applied_the_change(cluster_factory) -> None:
    c = cluster_factory(start=False, brokers=2, broker_overrides=BROKER,
                        controller_overrides={**FAST, "broker.session.timeout.ms": 30000})
    link = TcpProxy(c.host, lambda: c.controller_port)  # broker 2's link to the controller
    c.per_broker_overrides[2] = {"controller.quorum.voters": f"{CONTROLLER_ID}@{c.host}:{link.port}"}
    try:
        c.start()
        asyncio.run(lagging_leader(c, link))
    finally:
        c.stop()
        link.close()


# ---- a diskless topic: every broker takes writes by its own image
async def produce_via(c: Cluster, broker: int, topic: str, partition: int, value: bytes, count: int):
    """One record to `topic`-`partition` through `broker` (any broker takes a diskless write),
    hashed over `count` (the tagged UndeletedPartitionCount)."""
    P = ProduceRequest
    req = P(acks=-1, timeout_ms=10000, topic_data=[P.TopicProduceData(name=topic, undeleted_partition_count=count,
            partition_data=[P.PartitionProduceData(index=partition, records=encode_batch([Record(value=value)]))])])
    async with NodeClient(c.host, c.broker_port(broker)) as nc:
        return (await nc.request(req)).responses[0].partition_responses[0]


async def epoch_end_via(c: Cluster, broker: int, topic: str, partition: int, epoch: int,
                        current: int) -> tuple[int, int, int]:
    """OffsetForLeaderEpoch through `broker`: (error, epoch, end offset)."""
    OE = OffsetForLeaderEpochRequest
    req = OE(replica_id=-2, topics=[OE.OffsetForLeaderTopic(topic=topic, partitions=[
        OE.OffsetForLeaderPartition(partition=partition, current_leader_epoch=current, leader_epoch=epoch)])])
    async with NodeClient(c.host, c.broker_port(broker)) as nc:
        r = (await nc.request(req)).topics[0].partitions[0]
    return r.error_code, r.leader_epoch, r.end_offset


async def lagging_diskless_writer(c: Cluster, link: TcpProxy) -> None:
    """Broker 2's metadata lags a growth of a diskless topic (its controller link is held): it
    still takes g-0 writes hashed over the old count, in the epoch the growth ended, while broker 1
    takes them in the new one. Wherever the partition's coordinator is, once a write of the new
    epoch is in, the old epoch has ended there: broker 2's old-epoch writes are refused (retriable)
    and OffsetForLeaderEpoch, through either broker, answers the end the gates wait for."""
    kt_ok(c, "--create", "--topic", "g", "--partitions", "1", "--replication-factor", "1",
          "--config", "diskless.enable=true")
    await wait_for(lambda: _taken(_code(produce_via(c, 2, "g", 0, b"old", 1))), what="g-0 takes a write")
    link.hold()
    try:
        await asyncio.to_thread(kt_ok, c, "--alter", "--topic", "g", "--partitions", "2")
        await wait_for(lambda: _is(partitions_seen(c, "g", 1), ([0, 1], [])), what="broker 1 applies the growth")
        assert await partitions_seen(c, "g", 2) == ([0], []), "broker 2 applied the growth: the link was not held"
        # broker 2 may still write epoch 0 (a coordinator on broker 2 has not ended it), or is
        # refused (one on broker 1 ended it from its image): either way nothing of epoch 0 comes
        # after the end that is answered once a write of epoch 1 is in
        before = await produce_via(c, 2, "g", 0, b"lagging", 1)
        assert before.error_code in (0, Errors.NOT_LEADER_OR_FOLLOWER), before
        new = await produce_via(c, 1, "g", 0, b"new", 2)
        assert new.error_code == 0, new
        after = await produce_via(c, 2, "g", 0, b"stale", 1)
        assert after.error_code == Errors.NOT_LEADER_OR_FOLLOWER, "an epoch-0 write taken after epoch 1 began"
        for broker in (1, 2):
            assert await epoch_end_via(c, broker, "g", 0, 0, 1) == (0, 0, new.base_offset)
            assert (await epoch_end_via(c, broker, "g", 0, 0, 0))[0] == Errors.FENCED_LEADER_EPOCH
    finally:
        link.release()
    # broker 2 catches up: its writes hashed over the old count are refused for the count now
    await wait_for(lambda: _is(partitions_seen(c, "g", 2), ([0, 1], [])), what="broker 2 applies the growth")
    assert (await produce_via(c, 2, "g", 0, b"stale", 1)).error_code == Errors.INVALID_PARTITION_METADATA
    assert (await produce_via(c, 2, "g", 0, b"next", 2)).error_code == 0


async def _code(answer) -> int:
    return (await answer).error_code


def test_diskless_epoch_ends_with_a_lagging_writer(cluster_factory, tmp_path) -> None:
    diskless = {"diskless.storage.url": f"file://{tmp_path / 'objects'}", "diskless.wal.max.ms": "20",
                "diskless.metadata.topic.num.partitions": "1", "diskless.metadata.topic.replication.factor": "2"}
    c = cluster_factory(start=False, brokers=2, broker_overrides={**BROKER, **diskless},
                        controller_overrides={**FAST, "broker.session.timeout.ms": 30000,
                                              "diskless.metadata.topic.num.partitions": "1"})
    link = TcpProxy(c.host, lambda: c.controller_port)  # broker 2's link to the controller
    c.per_broker_overrides[2] = {"controller.quorum.voters": f"{CONTROLLER_ID}@{c.host}:{link.port}"}
    try:
        c.start()
        asyncio.run(lagging_diskless_writer(c, link))
    finally:
        c.stop()
        link.close()
