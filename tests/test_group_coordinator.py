"""The group coordinator: record formats, the group state machine driven in-process over real
__consumer_offsets logs (rebalances, session expiry, static members, persistence and reload), the
offsets manager on its own over a real log (with a group type of the test's own, as a KIP-848
group type would be), and the group APIs of every version over the wire against a real 1-broker
cluster (the error codes clients act on, state surviving a broker restart)."""

from __future__ import annotations

import asyncio
import struct
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from broker.coordinator import wall_clock_ms
from broker.coordinator.group import GroupCoordinator, GroupCoordinatorConfig, GroupState
from broker.coordinator.group.base import Group
from broker.coordinator.group.group import ClassicGroup, Member, parse_subscription_topics
from broker.coordinator.group.loader import read_partition
from broker.coordinator.group.offsets_manager import OffsetsManager
from broker.coordinator.group.records import (
    OFFSETS_TOPIC,
    GroupMetadataKey,
    GroupMetadataRecord,
    MemberRecord,
    OffsetAndMetadata,
    OffsetCommitKey,
    decode_group_metadata_value,
    decode_key,
    decode_offset_commit_value,
    group_metadata_key,
    group_metadata_value,
    java_string_hashcode,
    offset_commit_key,
    offset_commit_value,
    partition_for,
)
from broker.coordinator.group.runtime import OffsetsPartition
from broker.replication.partition import Partition
from broker.storage.config import LogConfig
from broker.storage.log import AppendOrigin, Log
from metadata import PartitionInfo
from node.client import NodeClient
from protocol.errors import Errors
from protocol.primitives import uvarint
from protocol.records import Record, decode_batches, encode_batch
from tests.conftest import FAST_FENCING, eventually_async
from tests.fakes import FakeMetadata, FakeReplicas
from tools.cluster import Cluster

E = Errors


def subscription(*topics: str) -> bytes:
    """ConsumerProtocolSubscription v0: version, topics, user data (null)."""
    out = struct.pack(">hi", 0, len(topics))
    for t in topics:
        out += struct.pack(">h", len(t)) + t.encode()
    return out + struct.pack(">i", -1)


# ======================================================================= records and hashing
def test_java_string_hashcode_and_partition_mapping():
    assert java_string_hashcode("") == 0
    assert java_string_hashcode("hello") == 99162322
    assert java_string_hashcode("Aa") == java_string_hashcode("BB") == 2112
    s = "console-consumer-12345"
    h = sum(ord(ch) * 31 ** (len(s) - 1 - i) for i, ch in enumerate(s)) % 2**32
    assert java_string_hashcode(s) == (h - 2**32 if h >= 2**31 else h)
    assert java_string_hashcode("€uro") == 8364 * 31**3 + ord("u") * 31**2 + ord("r") * 31 + ord("o")
    # Integer.MIN_VALUE: Kafka's Utils.abs maps it to 0, not to a negative partition
    assert java_string_hashcode("polygenelubricants") == -(2**31)
    assert partition_for("polygenelubricants", 50) == 0
    assert partition_for(s, 50) == abs(java_string_hashcode(s)) % 50
    assert all(0 <= partition_for(f"g{i}", 7) < 7 for i in range(200))


def test_offsets_topic_record_formats_round_trip():
    k = offset_commit_key("grp", "topic-a", 7)
    assert k[:2] == b"\x00\x01"  # key version 1
    assert decode_key(k) == OffsetCommitKey("grp", "topic-a", 7)
    assert decode_key(b"\x00\x00" + k[2:]) == OffsetCommitKey("grp", "topic-a", 7)  # key v0 reads the same
    assert decode_key(group_metadata_key("grp")) == GroupMetadataKey("grp")
    assert decode_key(b"\x00\x03\x00\x01g") is None  # KIP-848 records are not ours

    v = offset_commit_value(OffsetAndMetadata(42, 5, "meta", 1700000000000))
    assert v[:2] == b"\x00\x03"
    assert decode_offset_commit_value(v) == OffsetAndMetadata(42, 5, "meta", 1700000000000)
    v1 = offset_commit_value(OffsetAndMetadata(42, -1, "", 1000, expire_timestamp=5000))
    assert v1[:2] == b"\x00\x01"  # an explicit retention needs value v1, as Kafka writes it
    assert decode_offset_commit_value(v1) == OffsetAndMetadata(42, -1, "", 1000, 5000)
    # v0 (offset, metadata, timestamp) as written by old brokers
    v0 = struct.pack(">hq", 0, 9) + struct.pack(">h", 1) + b"m" + struct.pack(">q", 77)
    assert decode_offset_commit_value(v0) == OffsetAndMetadata(9, -1, "m", 77)

    rec = GroupMetadataRecord("consumer", 3, "range", "m1", 1234, [
        MemberRecord("m1", None, "c1", "/127.0.0.1", 30000, 10000, subscription("t"), b"\x01\x02"),
        MemberRecord("m2", "inst-2", "c2", "/10.0.0.2", 30000, 10000, subscription("t", "u"), b""),
    ])
    gv = group_metadata_value(rec)
    assert gv[:2] == b"\x00\x03"
    assert decode_group_metadata_value(gv) == rec
    assert decode_group_metadata_value(_group_value_v4(rec)) == rec  # flexible v4, as Kafka 4 writes
    empty = GroupMetadataRecord("consumer", 4, None, None, 99, [])
    assert decode_group_metadata_value(group_metadata_value(empty)) == empty


def _group_value_v4(g: GroupMetadataRecord) -> bytes:
    out = bytearray(struct.pack(">h", 4))

    def cstr(s):
        if s is None:
            out.extend(uvarint(0))
        else:
            out.extend(uvarint(len(s.encode()) + 1) + s.encode())

    cstr(g.protocol_type)
    out += struct.pack(">i", g.generation)
    cstr(g.protocol)
    cstr(g.leader)
    out += struct.pack(">q", g.current_state_timestamp)
    out.extend(uvarint(len(g.members) + 1))
    for m in g.members:
        for s in (m.member_id, m.group_instance_id, m.client_id, m.client_host):
            cstr(s)
        out += struct.pack(">ii", m.rebalance_timeout_ms, m.session_timeout_ms)
        for b in (m.subscription, m.assignment):
            out.extend(uvarint(len(b) + 1) + b)
        out.extend(b"\x01\x00\x01\x07")  # one unknown tagged field (tag 0, 1 byte): skipped
    out.extend(b"\x00")
    return bytes(out)


# ======================================================================= the group state machine
def _member(mid: str, protocols, instance: str | None = None) -> Member:
    return Member(mid, instance, "cli", "/h", 1000, 1000, "consumer", protocols)


def test_protocol_selection_and_support():
    g = ClassicGroup("g")
    assert g.supports_protocols("consumer", {"range"})
    assert not g.supports_protocols("", {"range"}) and not g.supports_protocols("consumer", set())
    g.add(_member("a", [("range", b""), ("roundrobin", b"")]))
    g.add(_member("b", [("roundrobin", b""), ("range", b"")]))
    g.add(_member("c", [("roundrobin", b""), ("sticky", b"")]))
    g.transition_to(GroupState.PREPARING_REBALANCE)
    assert g.candidate_protocols() == {"roundrobin"}
    assert g.select_protocol() == "roundrobin"  # the only protocol all three support
    assert g.supports_protocols("consumer", {"sticky", "roundrobin"})
    assert not g.supports_protocols("consumer", {"range"})  # c does not speak range
    assert not g.supports_protocols("other", {"roundrobin"})
    g.remove("c")
    assert g.select_protocol() == "range" or g.select_protocol() == "roundrobin"
    g.add(_member("d", [("range", b"")]))
    assert g.select_protocol() == "range"  # votes: a range, b roundrobin->range is the only candidate
    assert g.leader_id == "a"
    g.remove("a")
    assert g.leader_id == "b"  # the next member leads


def test_state_transitions_follow_kafka():
    g = ClassicGroup("g")
    with pytest.raises(RuntimeError):
        g.transition_to(GroupState.STABLE)  # Empty -> Stable is not a transition
    g.transition_to(GroupState.PREPARING_REBALANCE)
    g.transition_to(GroupState.COMPLETING_REBALANCE)
    with pytest.raises(RuntimeError):
        g.transition_to(GroupState.EMPTY)
    g.transition_to(GroupState.STABLE)
    assert g.can_rebalance
    g.transition_to(GroupState.DEAD)
    assert not g.can_rebalance


def test_consumer_subscription_parsing():
    assert parse_subscription_topics(subscription("a", "b")) == {"a", "b"}
    # v1+ append fields after v0's: still parsed by the v0 prefix
    assert parse_subscription_topics(struct.pack(">h", 3) + subscription("x")[2:] + b"\x00" * 12) == {"x"}
    with pytest.raises(ValueError):
        parse_subscription_topics(b"\x00")


# ======================================================================= in-process coordinator
TOPIC_ID = uuid.UUID(int=77)
UNIT_CONFIG = GroupCoordinatorConfig(
    offsets_topic_num_partitions=3,
    initial_rebalance_delay_ms=50,
    min_session_timeout_ms=10,
    offset_commit_timeout_ms=2000,
    offsets_retention_ms=60_000,
    offsets_retention_check_interval_ms=3_600_000,
)


class Harness:
    """The coordinator's ports faked around real logs and Partition objects for __consumer_offsets,
    led by node 1."""

    def __init__(self, tmp: Path, config: GroupCoordinatorConfig = UNIT_CONFIG) -> None:
        self.tmp = tmp
        self.replicas = FakeReplicas()
        self.metadata = FakeMetadata()
        self.forwarded: list[Any] = []
        self.coordinator = GroupCoordinator(config, self.replicas, self.metadata, self.forward)
        self.epochs: dict[int, int] = {}

    async def forward(self, body: Any, version: int | None = None, *, read_only: bool = False) -> Any:
        self.forwarded.append(body)
        raise ConnectionError("no controller in this test")

    def partition(self, index: int) -> Partition:
        p = self.replicas.get(OFFSETS_TOPIC, index)
        if p is None:
            lg = Log.open(self.tmp / f"{OFFSETS_TOPIC}-{index}-0", LogConfig(), topic_id=TOPIC_ID)
            p = Partition(OFFSETS_TOPIC, index, TOPIC_ID, lg, 1)
            self.replicas.partitions[(OFFSETS_TOPIC, index)] = p
        return p

    def _set_leader(self, index: int, leader: int) -> Partition:
        p = self.partition(index)
        epoch = self.epochs[index] = self.epochs.get(index, -1) + 1
        was = p.is_leader
        p.update(PartitionInfo(TOPIC_ID, index, (1, 2), (1, 2) if leader == 2 else (1,), leader, epoch, epoch))
        if p.is_leader != was or p.is_leader:  # as the ReplicaManager: told of a new leader epoch too
            for listener in self.replicas.leadership_listeners:
                listener(p, p.is_leader)
        return p

    async def lead(self, *indexes: int) -> None:
        for i in indexes:
            self._set_leader(i, 1)
        for _ in range(200):
            if all((ps := self.coordinator.partition(i)) and not ps.loading for i in indexes):
                return
            await asyncio.sleep(0.01)
        raise AssertionError("partitions did not load")

    def resign(self, index: int) -> None:
        self._set_leader(index, 2)

    def close(self) -> None:
        self.coordinator.shutdown()
        for p in self.replicas.partitions.values():
            p.log.close()

    async def join(self, gid: str, member: str = "", *, instance: str | None = None, version: int = 5,
                   protocols=(("range", b"r"),), session: int = 10000, rebalance: int = 5000):
        return await self.coordinator.join_group(
            gid, member, instance, require_known_member_id=version >= 4 and instance is None,
            support_skip_assignment=version >= 9, client_id="cli", client_host="/127.0.0.1",
            rebalance_timeout_ms=rebalance, session_timeout_ms=session, protocol_type="consumer",
            protocols=list(protocols),
        )

    async def join_new(self, gid: str, **kw):
        """A v4+ dynamic member: MEMBER_ID_REQUIRED, then the join with that id."""
        first = await self.join(gid, **kw)
        assert first.error == E.MEMBER_ID_REQUIRED and first.member_id.startswith("cli-")
        return await self.join(gid, first.member_id, **kw)

    async def sync(self, gid: str, gen: int, member: str, assignments=None, instance=None):
        return await self.coordinator.sync_group(gid, gen, member, "consumer", None, instance, assignments or {})

    def records(self, index: int) -> list:
        p = self.partition(index)
        info = p.log.read(0, 1 << 20)
        return [r for b in decode_batches(b"".join(bytes(x) for x in info.records)) for r in b.records]


def run(tmp_path: Path, scenario, config: GroupCoordinatorConfig = UNIT_CONFIG):
    async def main():
        h = Harness(tmp_path, config)
        try:
            await scenario(h)
        finally:
            h.close()

    asyncio.run(main())


def pid(gid: str) -> int:
    return partition_for(gid, UNIT_CONFIG.offsets_topic_num_partitions)


def test_two_members_rebalance_commit_and_reload_from_the_log(tmp_path):
    async def scenario(h: Harness):
        gid = "orders"
        await h.lead(pid(gid))
        r1, r2 = await asyncio.gather(h.join_new(gid, protocols=[("range", b"m1")]),
                                      h.join_new(gid, protocols=[("range", b"m2")]))
        assert r1.error == r2.error == 0
        assert r1.generation_id == r2.generation_id == 1
        assert r1.leader_id == r2.leader_id and r1.protocol_name == "range" and r1.protocol_type == "consumer"
        leader, follower = (r1, r2) if r1.leader_id == r1.member_id else (r2, r1)
        assert sorted(meta for _, _, meta in leader.members) == [b"m1", b"m2"] and follower.members == []
        s_follower = asyncio.ensure_future(h.sync(gid, 1, follower.member_id))
        await asyncio.sleep(0.02)
        assert not s_follower.done()  # followers wait for the leader's assignment
        s_leader = await h.sync(gid, 1, leader.member_id, {leader.member_id: b"A", follower.member_id: b"B"})
        assert (s_leader.error, s_leader.assignment, s_leader.protocol_name) == (0, b"A", "range")
        assert (await s_follower).assignment == b"B"
        c = h.coordinator
        assert c.partition(pid(gid)).groups[gid].state is GroupState.STABLE
        assert c.heartbeat(gid, follower.member_id, None, 1) == 0

        errs = await c.commit_offsets(gid, leader.member_id, None, 1, {("t", 0): OffsetAndMetadata(10, 3, "md", 1),
                                                                       ("t", 1): OffsetAndMetadata(20)})
        assert errs == {("t", 0): 0, ("t", 1): 0}
        assert c.fetch_offsets(gid, [("t", 0), ("t", 9)]) == (0, [(("t", 0), OffsetAndMetadata(10, 3, "md", 1)),
                                                                  (("t", 9), None)])
        # everything is in the log: group metadata with both members, then the offsets
        recs = h.records(pid(gid))
        assert [type(decode_key(r.key)).__name__ for r in recs] == ["GroupMetadataKey", "OffsetCommitKey",
                                                                     "OffsetCommitKey"]
        stored = decode_group_metadata_value(recs[0].value)
        assert stored.generation == 1 and stored.leader == leader.member_id
        assert {m.member_id: m.assignment for m in stored.members} == {leader.member_id: b"A",
                                                                       follower.member_id: b"B"}

        h.resign(pid(gid))  # leadership moves away: the groups go, requests are refused
        assert c.heartbeat(gid, follower.member_id, None, 1) == E.NOT_COORDINATOR
        assert c.fetch_offsets(gid, None)[0] == E.NOT_COORDINATOR
        h._set_leader(pid(gid), 1)
        assert c.heartbeat(gid, follower.member_id, None, 1) == 0  # answered blindly while loading
        assert c.fetch_offsets(gid, None)[0] == E.COORDINATOR_LOAD_IN_PROGRESS
        assert (await h.sync(gid, 1, leader.member_id)).error == E.REBALANCE_IN_PROGRESS
        await h.lead(pid(gid))
        g = c.partition(pid(gid)).groups[gid]
        assert g.state is GroupState.STABLE and g.generation_id == 1 and g.leader_id == leader.member_id
        assert c.heartbeat(gid, follower.member_id, None, 1) == 0  # the member carries on as before
        assert (await h.sync(gid, 1, follower.member_id)).assignment == b"B"
        assert c.fetch_offsets(gid, None) == (0, [(("t", 0), OffsetAndMetadata(10, 3, "md", 1)),
                                                  (("t", 1), OffsetAndMetadata(20))])

    run(tmp_path, scenario)


def test_transactional_offset_commits_pend_until_their_transaction_ends(tmp_path):
    async def scenario(h: Harness):
        gid = "eos"
        idx = pid(gid)
        await h.lead(idx)
        c = h.coordinator
        t0, t1, t2 = ("t", 0), ("t", 1), ("t", 2)

        def marker(producer_id: int, commit: bool) -> None:
            p = h.partition(idx)
            p.log.append_txn_marker(producer_id, 0, 0, commit, p.leader_epoch, int(time.time() * 1000))
            c.on_transaction_completed(idx, producer_id, commit)

        assert await c.txn_commit_offsets(gid, 500, 0, "", None, -1, {t0: OffsetAndMetadata(5)}) == {t0: 0}
        assert c.fetch_offsets(gid, [t0]) == (0, [(t0, None)])  # not before the transaction ends
        assert c.unstable_partitions(gid) == {t0}
        marker(500, True)
        assert c.fetch_offsets(gid, [t0]) == (0, [(t0, OffsetAndMetadata(5))]) and not c.unstable_partitions(gid)
        assert await c.txn_commit_offsets(gid, 501, 0, "", None, -1, {t1: OffsetAndMetadata(9)}) == {t1: 0}
        marker(501, False)
        assert c.fetch_offsets(gid, [t1]) == (0, [(t1, None)]) and not c.unstable_partitions(gid)
        # a member of another generation is refused, as for OffsetCommit
        assert (await c.txn_commit_offsets(gid, 503, 0, "nobody", None, 4, {t2: OffsetAndMetadata(1)}) ==
                {t2: E.UNKNOWN_MEMBER_ID})
        assert await c.txn_commit_offsets(gid, 502, 0, "", None, -1, {t2: OffsetAndMetadata(7)}) == {t2: 0}
        # reloaded from the log: committed, aborted and still pending offsets as they were; the
        # marker that ends the pending transaction may arrive while the partition loads
        h.resign(idx)
        h._set_leader(idx, 1)
        marker(502, True)
        await h.lead(idx)
        assert c.fetch_offsets(gid, [t0, t1, t2]) == (0, [(t0, OffsetAndMetadata(5)), (t1, None),
                                                          (t2, OffsetAndMetadata(7))])
        assert not c.unstable_partitions(gid)
        assert await c.txn_commit_offsets(gid, 504, 0, "", None, -1, {t1: OffsetAndMetadata(3)}) == {t1: 0}
        h.resign(idx)
        await h.lead(idx)
        assert c.unstable_partitions(gid) == {t1}
        marker(504, True)
        assert c.fetch_offsets(gid, [t1]) == (0, [(t1, OffsetAndMetadata(3))])

    run(tmp_path, scenario)


def test_new_member_triggers_rebalance_and_stale_generations_are_refused(tmp_path):
    async def scenario(h: Harness):
        gid, c = "g-rebalance", h.coordinator
        await h.lead(pid(gid))
        a = await h.join_new(gid)
        assert (await h.sync(gid, 1, a.member_id, {a.member_id: b"all"})).assignment == b"all"
        joining = asyncio.ensure_future(h.join_new(gid))
        assert await eventually_async(lambda: c.heartbeat(gid, a.member_id, None, 1) == E.REBALANCE_IN_PROGRESS)
        # a commit of the old generation is still accepted while preparing (Kafka's rule)
        assert await c.commit_offsets(gid, a.member_id, None, 1, {("t", 0): OffsetAndMetadata(5)}) == {("t", 0): 0}
        assert (await h.sync(gid, 1, a.member_id)).error == E.REBALANCE_IN_PROGRESS
        a2 = await h.join(gid, a.member_id)
        b = await joining
        assert a2.generation_id == b.generation_id == 2
        assert a2.leader_id == a.member_id  # the leader kept its place
        assert c.heartbeat(gid, a.member_id, None, 1) == E.ILLEGAL_GENERATION
        assert (await h.sync(gid, 1, b.member_id)).error == E.ILLEGAL_GENERATION
        assert await c.commit_offsets(gid, b.member_id, None, 2, {("t", 0): OffsetAndMetadata(6)}) == {
            ("t", 0): E.REBALANCE_IN_PROGRESS}  # joined, not yet synced
        assert c.heartbeat(gid, "nobody", None, 2) == E.UNKNOWN_MEMBER_ID
        assert await c.commit_offsets(gid, "", None, -1, {("t", 0): OffsetAndMetadata(6)}) == {
            ("t", 0): E.UNKNOWN_MEMBER_ID}  # only members commit for a group with members
        assert (await h.join("g-unknown", "some-member")).error == E.UNKNOWN_MEMBER_ID
        other = await h.join(gid, protocols=[("roundrobin", b"")], version=3)
        assert other.error == E.INCONSISTENT_GROUP_PROTOCOL

    run(tmp_path, scenario)


def test_session_expiry_removes_the_silent_member(tmp_path):
    async def scenario(h: Harness):
        gid, c = "g-expiry", h.coordinator
        await h.lead(pid(gid))
        a, b = await asyncio.gather(h.join_new(gid, session=400), h.join_new(gid, session=400))
        leader = a if a.leader_id == a.member_id else b
        await asyncio.gather(h.sync(gid, 1, a.member_id, {a.member_id: b"x", b.member_id: b"y"} if a is leader else {}),
                             h.sync(gid, 1, b.member_id, {a.member_id: b"x", b.member_id: b"y"} if b is leader else {}))
        deadline = time.monotonic() + 3
        seen = 0
        while time.monotonic() < deadline:  # only a heartbeats; b's session runs out
            seen = c.heartbeat(gid, a.member_id, None, 1)
            if seen:
                break
            await asyncio.sleep(0.05)
        assert seen == E.REBALANCE_IN_PROGRESS
        g = c.partition(pid(gid)).groups[gid]
        assert list(g.members) == [a.member_id]
        a2 = await h.join(gid, a.member_id, session=400)
        assert (a2.error, a2.generation_id, a2.leader_id, len(a2.members)) == (0, 2, a.member_id, 1)
        assert c.heartbeat(gid, b.member_id, None, 2) == E.UNKNOWN_MEMBER_ID

    run(tmp_path, scenario)


def test_pending_members_and_unsynced_members_expire(tmp_path):
    async def scenario(h: Harness):
        gid, c = "g-pending", h.coordinator
        await h.lead(pid(gid))
        first = await h.join(gid, session=200)
        assert first.error == E.MEMBER_ID_REQUIRED
        g = c.partition(pid(gid)).groups[gid]
        assert first.member_id in g.pending_members
        assert await eventually_async(lambda: first.member_id not in g.pending_members)  # never came back: forgotten
        a, b = await asyncio.gather(h.join_new(gid, rebalance=300), h.join_new(gid, rebalance=300))
        follower = b if a.leader_id == a.member_id else a
        # the leader never sends SyncGroup: after the rebalance timeout it is dropped
        r = await asyncio.wait_for(h.sync(gid, 1, follower.member_id), 3)
        assert r.error == E.REBALANCE_IN_PROGRESS
        assert list(g.members) == [follower.member_id] and g.state is GroupState.PREPARING_REBALANCE

    run(tmp_path, scenario)


def test_static_member_rejoins_without_rebalance_and_fences_the_old_id(tmp_path):
    async def scenario(h: Harness):
        gid, c = "g-static", h.coordinator
        await h.lead(pid(gid))
        s, d = await asyncio.gather(h.join(gid, instance="inst-1"), h.join_new(gid))
        assert s.error == 0 and s.member_id.startswith("inst-1-")  # static members skip MEMBER_ID_REQUIRED
        leader = s if s.leader_id == s.member_id else d
        plan = {s.member_id: b"S", d.member_id: b"D"}
        await asyncio.gather(h.sync(gid, 1, s.member_id, plan if s is leader else {}, instance="inst-1"),
                             h.sync(gid, 1, d.member_id, plan if d is leader else {}))
        # the static member restarts: unknown member id, same instance id, same protocols
        again = await h.join(gid, instance="inst-1")
        assert again.error == 0 and again.member_id != s.member_id
        assert again.generation_id == 1  # no new generation ...
        assert again.leader_id == leader.member_id and again.members == []  # ... and it must not assign
        g = c.partition(pid(gid)).groups[gid]
        assert g.state is GroupState.STABLE
        assert c.heartbeat(gid, d.member_id, None, 1) == 0  # the other member saw no rebalance
        assert c.heartbeat(gid, s.member_id, "inst-1", 1) == E.FENCED_INSTANCE_ID
        assert (await h.sync(gid, 1, again.member_id, instance="inst-1")).assignment == b"S"
        assert (await h.join(gid, s.member_id, instance="inst-1")).error == E.FENCED_INSTANCE_ID
        # the new id is what the log holds now
        stored = decode_group_metadata_value(h.records(pid(gid))[-1].value)
        assert {m.group_instance_id: m.member_id for m in stored.members}["inst-1"] == again.member_id
        # JoinGroup v9: a static leader is told it leads, with the members, but to skip assignment
        if leader is s:
            v9 = await h.join(gid, instance="inst-1", version=9)
            assert v9.skip_assignment and v9.leader_id == v9.member_id and len(v9.members) == 2
        # LeaveGroup by instance id (what admin tools send)
        assert c.leave_group(gid, [("", "inst-1", "bye"), ("", "inst-9", None)]) == (0, [0, E.UNKNOWN_MEMBER_ID])
        assert c.heartbeat(gid, d.member_id, None, 1) == E.REBALANCE_IN_PROGRESS

    run(tmp_path, scenario)


def test_admin_operations_errors_and_offset_expiry(tmp_path):
    async def scenario(h: Harness):
        c = h.coordinator
        gid = "g-admin"
        simple = next(f"simple-{i}" for i in range(100) if pid(f"simple-{i}") == pid(gid))
        elsewhere = next(f"other-{i}" for i in range(100) if pid(f"other-{i}") != pid(gid))
        await h.lead(pid(gid))
        assert (await h.join(gid, session=5)).error == E.INVALID_SESSION_TIMEOUT
        assert (await h.join(gid, session=2_000_000)).error == E.INVALID_SESSION_TIMEOUT
        assert (await h.join("")).error == E.INVALID_GROUP_ID
        assert (await h.join(elsewhere)).error == E.NOT_COORDINATOR
        assert c.delete_groups([elsewhere, "missing-" + gid]) == {elsewhere: E.NOT_COORDINATOR,
                                                                  "missing-" + gid: E.GROUP_ID_NOT_FOUND
                                                                  if pid("missing-" + gid) == pid(gid)
                                                                  else E.NOT_COORDINATOR}
        a = await h.join_new(gid, protocols=[("range", subscription("t"))])
        await h.sync(gid, 1, a.member_id, {a.member_id: b""})
        await c.commit_offsets(gid, a.member_id, None, 1, {("t", 0): OffsetAndMetadata(1),
                                                           ("u", 0): OffsetAndMetadata(2)})
        assert c.delete_groups([gid]) == {gid: E.NON_EMPTY_GROUP}
        # a live consumer group keeps offsets of topics it subscribes to
        assert c.delete_offsets(gid, [("t", 0), ("u", 0)]) == (0, {("t", 0): E.GROUP_SUBSCRIBED_TO_TOPIC,
                                                                  ("u", 0): 0})
        assert c.describe_group(gid)[1].state == "Stable"
        assert c.leave_group(gid, [(a.member_id, None, None)]) == (0, [0])
        assert c.describe_group(gid)[1].state == "Empty"
        assert c.delete_groups([gid]) == {gid: 0}
        assert c.describe_group(gid) == (0, None)
        assert c.fetch_offsets(gid, None) == (0, [])
        # offsets-only groups (generation -1) and their expiry
        assert await c.commit_offsets(simple, "", None, -1, {("t", 3): OffsetAndMetadata(7, commit_timestamp=1000)}) \
            == {("t", 3): 0}
        big = OffsetAndMetadata(1, metadata="x" * 5000)
        assert await c.commit_offsets(simple, "", None, -1, {("t", 4): big}) == {("t", 4): E.OFFSET_METADATA_TOO_LARGE}
        assert c.list_groups()[1] and {g.group_id for g in c.list_groups(states=["empty"])[1]} == {simple}
        assert c.list_groups(types=["consumer"])[1] == []
        assert c.expire_offsets(now_ms=1000 + 59_000) == 0
        assert c.expire_offsets(now_ms=1000 + 60_000) == 1
        assert c.describe_group(simple) == (0, None)  # nothing left: the group went with its offsets
        # reload: deletions were written as tombstones
        h.resign(pid(gid))
        await h.lead(pid(gid))
        assert c.describe_group(gid) == (0, None) and c.describe_group(simple) == (0, None)
        keys = [decode_key(r.key) for r in h.records(pid(gid)) if r.value is None]
        assert GroupMetadataKey(gid) in keys and OffsetCommitKey(gid, "t", 0) in keys
        assert OffsetCommitKey(simple, "t", 3) in keys

    run(tmp_path, scenario)


# ======================================================================= the offsets manager alone
class OffsetsOnlyGroup(Group):
    """A group type of the test's own: offsets and nothing else, committed by anyone. The offsets
    manager asks nothing more of a group type, so a KIP-848 group would plug in the same way."""

    type = "offsets-only"

    def __init__(self, group_id: str) -> None:
        super().__init__(group_id)
        self.dead = False
        self.timers_cancelled = False

    state_name = property(lambda self: "Dead" if self.dead else "Empty")
    is_dead = property(lambda self: self.dead)
    is_empty = property(lambda self: True)

    def mark_dead(self) -> None:
        self.dead = True

    def validate_offset_commit(self, member_id: str, instance_id: str | None, generation_id: int,
                               api_version: int = 9) -> int:
        return E.ILLEGAL_GENERATION if generation_id >= 0 else 0

    def validate_txn_offset_commit(self, member_id: str, instance_id: str | None, generation_id: int) -> int:
        return self.validate_offset_commit(member_id, instance_id, generation_id)

    def validate_offset_delete(self, partitions: Iterable[tuple[str, int]]) -> tuple[int, dict[tuple[str, int], int]]:
        return 0, {tp: 0 for tp in partitions}

    def validate_delete_group(self) -> int:
        return 0

    def expired_offsets(self, now_ms: int, retention_ms: int) -> list[tuple[str, int]]:
        return self.offsets_expired_since(now_ms, retention_ms, lambda c: c.value.commit_timestamp)

    def tombstone_keys(self) -> list[bytes]:
        return [group_metadata_key(self.group_id)]

    def cancel_timers(self) -> None:
        self.timers_cancelled = True

    def unload(self) -> None:
        self.dead = True


class LogRuntime:
    """The runtime the offsets manager uses, over one real __consumer_offsets log that it leads
    alone: every write is replicated as soon as it is appended."""

    def __init__(self, lg: Log) -> None:
        self.log = lg
        self.ps = OffsetsPartition(0, 0)
        self.ps.loading = False

    def status(self, group_id: str | None, api: int) -> tuple[int, OffsetsPartition | None]:
        return (E.INVALID_GROUP_ID, None) if group_id is None else (0, self.ps)

    def partition(self, index: int) -> OffsetsPartition | None:
        return self.ps if index == 0 else None

    def loaded_partitions(self) -> list[OffsetsPartition]:
        return [self.ps] if not self.ps.loading else []

    def log_end_offset(self, index: int) -> int:
        return self.log.log_end_offset

    def partition_for(self, group_id: str) -> int:
        return 0

    def write(self, index: int, records, producer=None):
        now = wall_clock_ms()
        txn = {} if producer is None else {"producer_id": producer[0], "producer_epoch": producer[1],
                                           "base_sequence": 0, "transactional": True}
        batch = encode_batch([Record(key=k, value=v, timestamp=now) for k, v in records], base_timestamp=now, **txn)
        info = self.log.append_as_leader(batch, 0, now, origin=AppendOrigin.COORDINATOR)
        done = asyncio.get_running_loop().create_future()
        done.set_result(0)
        return 0, info.first_offset, done

    def timer(self, delay_ms: int, fn, *args):
        return asyncio.get_running_loop().call_later(delay_ms / 1000, fn, *args)


def test_offsets_manager_commits_fetches_deletes_and_reloads_from_the_log(tmp_path):
    t0, t1, t2 = ("t", 0), ("t", 1), ("t", 2)

    async def scenario():
        lg = Log.open(tmp_path / f"{OFFSETS_TOPIC}-0-0", LogConfig(), topic_id=TOPIC_ID)
        try:
            runtime = LogRuntime(lg)
            committed_by: list[tuple[str, str]] = []
            offsets = OffsetsManager(UNIT_CONFIG, runtime, OffsetsOnlyGroup,
                                     lambda g, member: committed_by.append((g.group_id, member)))
            # commits: a new group of the given type, offsets readable once replicated
            assert await offsets.commit_offsets("g", "", None, -1, {t0: OffsetAndMetadata(10, 2, "a", 1000),
                                                                    t1: OffsetAndMetadata(20)}) == {t0: 0, t1: 0}
            assert isinstance(runtime.ps.groups["g"], OffsetsOnlyGroup) and committed_by == [("g", "")]
            assert await offsets.commit_offsets("g", "", None, -1, {t1: OffsetAndMetadata(21)}) == {t1: 0}
            assert await offsets.commit_offsets("g", "m", None, 3, {t2: OffsetAndMetadata(1)}) == {
                t2: E.ILLEGAL_GENERATION}  # the group type's rule
            assert await offsets.commit_offsets("new", "", None, 0, {t0: OffsetAndMetadata(1)}) == {
                t0: E.ILLEGAL_GENERATION}  # a generation for a group nobody created
            too_big = OffsetAndMetadata(5, metadata="x" * (UNIT_CONFIG.offset_metadata_max_bytes + 1))
            assert await offsets.commit_offsets("g", "", None, -1, {t2: too_big}) == {t2: E.OFFSET_METADATA_TOO_LARGE}
            assert offsets.fetch_offsets("g", None) == (0, [(t0, OffsetAndMetadata(10, 2, "a", 1000)),
                                                             (t1, OffsetAndMetadata(21))])
            assert offsets.fetch_offsets("g", [t2]) == (0, [(t2, None)])
            assert offsets.fetch_offsets("nobody", [t0]) == (0, [(t0, None)])
            # a transactional commit pends until its marker; another stays pending in the log
            assert await offsets.txn_commit_offsets("g", 700, 0, "", None, -1, {t2: OffsetAndMetadata(30)}) == {t2: 0}
            assert offsets.unstable_partitions("g") == {t2} and offsets.fetch_offsets("g", [t2]) == (0, [(t2, None)])
            lg.append_txn_marker(700, 0, 0, True, 0, wall_clock_ms())
            offsets.on_transaction_completed(0, 700, True)
            assert offsets.fetch_offsets("g", [t2]) == (0, [(t2, OffsetAndMetadata(30))])
            assert await offsets.txn_commit_offsets("g", 701, 0, "", None, -1, {t0: OffsetAndMetadata(99)}) == {t0: 0}
            # deletion: a tombstone, and a group left with nothing goes with its own tombstones
            assert await offsets.commit_offsets("h", "", None, -1, {t0: OffsetAndMetadata(4)}) == {t0: 0}
            h = runtime.ps.groups["h"]
            assert offsets.delete_offsets("h", [t0]) == (0, {t0: 0})
            assert h.dead and h.timers_cancelled and "h" not in runtime.ps.groups
            assert offsets.delete_offsets("h", [t0]) == (E.GROUP_ID_NOT_FOUND, {})

            # reload: a new manager reads the same log
            loaded = read_partition(lg, 1 << 20)
            assert set(loaded.groups) == {"h"} and loaded.groups["h"] is None  # only h's tombstone
            again = LogRuntime(lg)
            reloaded = OffsetsManager(UNIT_CONFIG, again, OffsetsOnlyGroup, lambda g, member: None)
            reloaded.load(again.ps, loaded.offsets, loaded.pending_txn)
            assert set(again.ps.groups) == {"g"}
            assert reloaded.fetch_offsets("g", None) == (0, [(t0, OffsetAndMetadata(10, 2, "a", 1000)),
                                                              (t1, OffsetAndMetadata(21)), (t2, OffsetAndMetadata(30))])
            assert reloaded.unstable_partitions("g") == {t0}  # 701's transaction has not ended
            lg.append_txn_marker(701, 0, 0, False, 0, wall_clock_ms())
            reloaded.on_transaction_completed(0, 701, False)
            assert reloaded.unstable_partitions("g") == set()
            assert reloaded.fetch_offsets("g", [t0]) == (0, [(t0, OffsetAndMetadata(10, 2, "a", 1000))])
            # retention: every offset past it goes, and the group with them
            assert reloaded.expire_offsets(now_ms=wall_clock_ms() + UNIT_CONFIG.offsets_retention_ms) == 3
            assert again.ps.groups == {}
            keys = [decode_key(r.key) for b in decode_batches(b"".join(bytes(x) for x in lg.read(0, 1 << 20).records))
                    if not b.header.is_control for r in b.records if r.value is None]
            assert GroupMetadataKey("g") in keys and OffsetCommitKey("g", "t", 1) in keys
        finally:
            lg.close()

    asyncio.run(scenario())


# ======================================================================= over the wire, 1 broker
@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("groups"), brokers=1, verbose=False, broker_overrides={
        "group.initial.rebalance.delay.ms": 50,
        "offsets.topic.num.partitions": 6,
        "group.min.session.timeout.ms": 500,
        **FAST_FENCING,
    }, controller_overrides=FAST_FENCING)  # a test restarts the broker with kill -9
    c.start()
    asyncio.run(_setup(c))
    yield c
    c.stop()


async def _setup(c: Cluster) -> None:
    from protocol.generated.create_topics import CreateTopicsRequest

    async with NodeClient(c.host, c.broker_port(1)) as cl:
        C = CreateTopicsRequest
        await cl.request(C(topics=[C.CreatableTopic(name="data", num_partitions=3, replication_factor=1)],
                           timeout_ms=30000))
        await _coordinator_of(cl, "warm-up")


async def _coordinator_of(cl: NodeClient, group: str, version: int = 3):
    from protocol.generated.find_coordinator import FindCoordinatorRequest

    deadline = time.monotonic() + 30
    while True:
        r = await cl.request(FindCoordinatorRequest(key=group, key_type=0), version)
        if r.error_code == 0:
            return r
        assert r.error_code == E.COORDINATOR_NOT_AVAILABLE, r
        assert time.monotonic() < deadline, "no coordinator"
        await asyncio.sleep(0.1)


def wire(c: Cluster, coro_fn):
    async def main():
        async with NodeClient(c.host, c.broker_port(1), client_id="wire-test") as cl:
            return await coro_fn(cl)

    return asyncio.run(main())


async def jg(cl: NodeClient, group: str, member: str = "", version: int = 5, instance=None, session=10000,
             protocols=(("range", b"meta"),), ptype="consumer"):
    from protocol.generated.join_group import JoinGroupRequest as J

    req = J(group_id=group, session_timeout_ms=session, rebalance_timeout_ms=5000, member_id=member,
            group_instance_id=instance, protocol_type=ptype,
            protocols=[J.JoinGroupRequestProtocol(name=n, metadata=m) for n, m in protocols])
    return await cl.request(req, version)


async def jg_new(cl, group, version=5, **kw):
    r = await jg(cl, group, version=version, **kw)
    if version >= 4 and kw.get("instance") is None:
        assert r.error_code == E.MEMBER_ID_REQUIRED and r.member_id
        r = await jg(cl, group, r.member_id, version=version, **kw)
    return r


async def sg(cl, group, gen, member, assignments=None, version=3, instance=None, ptype="consumer", pname="range"):
    from protocol.generated.sync_group import SyncGroupRequest as S

    return await cl.request(S(group_id=group, generation_id=gen, member_id=member, group_instance_id=instance,
                              protocol_type=ptype, protocol_name=pname,
                              assignments=[S.SyncGroupRequestAssignment(member_id=m, assignment=a)
                                           for m, a in (assignments or {}).items()]), version)


async def hb(cl, group, gen, member, version=3, instance=None):
    from protocol.generated.heartbeat import HeartbeatRequest

    r = await cl.request(HeartbeatRequest(group_id=group, generation_id=gen, member_id=member,
                                          group_instance_id=instance), version)
    return r.error_code


def test_find_coordinator_every_version_and_the_offsets_topic(broker):
    from protocol.generated.find_coordinator import FindCoordinatorRequest as F
    from protocol.generated.metadata import MetadataRequest

    async def go(cl):
        for v in range(0, 4):
            r = await _coordinator_of(cl, f"fc-{v}", v)
            assert (r.node_id, r.host, r.port) == (1, broker.host, broker.broker_port(1))
        for v in (4, 5, 6):
            r = await cl.request(F(key_type=0, coordinator_keys=["a", "b", "c"]), v)
            assert [(x.key, x.error_code, x.node_id, x.port) for x in r.coordinators] == [
                (k, 0, 1, broker.broker_port(1)) for k in "abc"]
        # transactional ids: unavailable until __transaction_state (created by this first ask) has a leader
        txn = await cl.request(F(key_type=1, coordinator_keys=["tx"]), 4)
        assert txn.coordinators[0].error_code == E.COORDINATOR_NOT_AVAILABLE and txn.coordinators[0].node_id == -1
        deadline = time.monotonic() + 30
        while (r := await cl.request(F(key="x", key_type=1), 1)).error_code == E.COORDINATOR_NOT_AVAILABLE:
            assert time.monotonic() < deadline, "no transaction coordinator"
            await asyncio.sleep(0.1)
        assert (r.error_code, r.node_id, r.port) == (0, 1, broker.broker_port(1))
        assert (await cl.request(F(key="", key_type=1), 1)).error_code == E.INVALID_REQUEST
        assert (await cl.request(F(key="x", key_type=7), 3)).error_code == E.INVALID_REQUEST
        md = await cl.request(MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=OFFSETS_TOPIC)]), 9)
        t = md.topics[0]
        assert t.error_code == 0 and t.is_internal and len(t.partitions) == 6

    wire(broker, go)


@pytest.mark.parametrize("version", range(10))
def test_join_sync_heartbeat_leave_every_join_version(broker, version):
    from protocol.generated.leave_group import LeaveGroupRequest as L

    group = f"jv-{version}"

    async def go(cl):
        r = await jg_new(cl, group, version=version)
        assert r.error_code == 0 and r.generation_id == 1 and r.leader == r.member_id
        assert r.protocol_name == "range" and [m.member_id for m in r.members] == [r.member_id]
        assert r.members[0].metadata == b"meta"
        assert r.protocol_type == ("consumer" if version >= 7 else None)
        assert r.member_id.startswith("wire-test-")
        sync_v = min(version, 5)
        s = await sg(cl, group, 1, r.member_id, {r.member_id: b"plan"}, version=sync_v)
        assert s.error_code == 0 and s.assignment == b"plan"
        assert s.protocol_name == ("range" if sync_v >= 5 else None)
        assert await hb(cl, group, 1, r.member_id, version=min(version, 4)) == 0
        leave_v = min(version, 5)
        if leave_v < 3:
            lr = await cl.request(L(group_id=group, member_id=r.member_id), leave_v)
        else:
            lr = await cl.request(L(group_id=group, members=[L.MemberIdentity(member_id=r.member_id)]), leave_v)
            assert [m.error_code for m in lr.members] == [0]
        assert lr.error_code == 0
        assert await hb(cl, group, 1, r.member_id) == E.UNKNOWN_MEMBER_ID

    wire(broker, go)


def test_error_codes_clients_act_on(broker):
    from protocol.generated.delete_groups import DeleteGroupsRequest
    from protocol.generated.sync_group import SyncGroupRequest

    async def go(cl, cl_b):
        g = "errors"
        assert (await jg(cl, g, session=100)).error_code == E.INVALID_SESSION_TIMEOUT
        first = await jg(cl, g, version=4)
        assert first.error_code == E.MEMBER_ID_REQUIRED and first.generation_id == -1
        assert (await jg(cl, g, "not-a-member", version=4)).error_code == E.UNKNOWN_MEMBER_ID
        a = await jg(cl, g, first.member_id, version=4)
        assert a.error_code == 0
        assert (await sg(cl, g, 1, a.member_id, {a.member_id: b"x"})).error_code == 0
        assert await hb(cl, g, 7, a.member_id) == E.ILLEGAL_GENERATION
        assert await hb(cl, g, 1, "ghost") == E.UNKNOWN_MEMBER_ID
        assert (await sg(cl, g, 1, a.member_id, version=5, pname="roundrobin")).error_code == \
            E.INCONSISTENT_GROUP_PROTOCOL
        bad = SyncGroupRequest(group_id=g, generation_id=1, member_id=a.member_id, assignments=[])
        assert (await cl.request(bad, 5)).error_code == E.INCONSISTENT_GROUP_PROTOCOL  # v5 needs type and name
        del_r = await cl.request(DeleteGroupsRequest(groups_names=[g, "never-existed"]), 2)
        assert {x.group_id: x.error_code for x in del_r.results} == {g: E.NON_EMPTY_GROUP,
                                                                     "never-existed": E.GROUP_ID_NOT_FOUND}
        # a second member: the first learns of the rebalance from its heartbeat
        b_task = asyncio.ensure_future(jg_new(cl_b, g))
        for _ in range(100):
            code = await hb(cl, g, 1, a.member_id)
            if code:
                break
            await asyncio.sleep(0.05)
        assert code == E.REBALANCE_IN_PROGRESS
        assert (await sg(cl, g, 1, a.member_id)).error_code == E.REBALANCE_IN_PROGRESS
        a2 = await jg(cl, g, a.member_id)
        b = await b_task
        assert a2.generation_id == b.generation_id == 2
        # static membership: a second instance with the same group.instance.id fences the first
        s1 = await jg(cl, "static", instance="i-1")
        assert s1.error_code == 0
        await sg(cl, "static", 1, s1.member_id, {s1.member_id: b"s"}, instance="i-1")
        s2 = await jg(cl, "static", instance="i-1")
        assert s2.error_code == 0 and s2.generation_id == 1 and s2.member_id != s1.member_id
        assert await hb(cl, "static", 1, s1.member_id, instance="i-1") == E.FENCED_INSTANCE_ID
        assert await hb(cl, "static", 1, s2.member_id, instance="i-1") == 0

    async def main():
        async with NodeClient(broker.host, broker.broker_port(1)) as cl, \
                NodeClient(broker.host, broker.broker_port(1)) as other:
            await go(cl, other)

    asyncio.run(main())


def test_offset_commit_and_fetch_every_version(broker):
    from protocol.generated.offset_commit import OffsetCommitRequest as OC
    from protocol.generated.offset_fetch import OffsetFetchRequest as OF

    async def go(cl):
        for v in range(10):
            g = f"oc-{v}"
            req = OC(group_id=g, generation_id_or_member_epoch=-1, member_id="", retention_time_ms=-1, topics=[
                OC.OffsetCommitRequestTopic(name="data", partitions=[
                    OC.OffsetCommitRequestPartition(partition_index=p, committed_offset=100 * v + p,
                                                    committed_leader_epoch=4, commit_timestamp=-1,
                                                    committed_metadata=f"m{v}")
                    for p in range(3)
                ]),
                OC.OffsetCommitRequestTopic(name="no-such-topic", partitions=[
                    OC.OffsetCommitRequestPartition(partition_index=0, committed_offset=1, committed_metadata=None)]),
            ])
            r = await cl.request(req, v)
            assert [[p.error_code for p in t.partitions] for t in r.topics] == [[0, 0, 0],
                                                                                [E.UNKNOWN_TOPIC_OR_PARTITION]]
        for v in range(10):
            g = f"oc-{v}"
            if v < 8:
                req = OF(group_id=g, topics=[OF.OffsetFetchRequestTopic(name="data", partition_indexes=[0, 2])])
                r = await cl.request(req, v)
                parts = r.topics[0].partitions
            else:
                req = OF(groups=[OF.OffsetFetchRequestGroup(group_id=g, topics=[
                    OF.OffsetFetchRequestTopics(name="data", partition_indexes=[0, 2])])])
                r = await cl.request(req, v)
                assert r.groups[0].group_id == g and r.groups[0].error_code == 0
                parts = r.groups[0].topics[0].partitions
            assert [(p.partition_index, p.committed_offset, p.metadata, p.error_code) for p in parts] == [
                (0, 100 * v, f"m{v}", 0), (2, 100 * v + 2, f"m{v}", 0)]
            want_epoch = 4 if v >= 6 else -1  # committed with the epoch from v6, fetched with it from v5
            if v >= 5:
                assert parts[0].committed_leader_epoch == want_epoch
        # batched fetch of several groups, all partitions (null topics), and an unknown group
        r = await cl.request(OF(groups=[OF.OffsetFetchRequestGroup(group_id="oc-9", topics=None),
                                        OF.OffsetFetchRequestGroup(group_id="nobody", topics=None)],
                                require_stable=True), 9)
        assert [(t.name, [p.partition_index for p in t.partitions]) for t in r.groups[0].topics] == [
            ("data", [0, 1, 2])]
        assert r.groups[1].topics == [] and r.groups[1].error_code == 0
        r = await cl.request(OF(group_id="oc-3", topics=None), 2)
        assert [p.committed_offset for p in r.topics[0].partitions] == [300, 301, 302]
        missing = await cl.request(OF(group_id="nobody", topics=[
            OF.OffsetFetchRequestTopic(name="data", partition_indexes=[1])]), 1)
        assert (missing.topics[0].partitions[0].committed_offset, missing.topics[0].partitions[0].error_code) == (-1, 0)

    wire(broker, go)


def test_list_describe_and_delete_groups(broker):
    from protocol.generated.delete_groups import DeleteGroupsRequest
    from protocol.generated.describe_groups import DescribeGroupsRequest as DG
    from protocol.generated.list_groups import ListGroupsRequest as LG
    from protocol.generated.offset_commit import OffsetCommitRequest as OC
    from protocol.generated.offset_delete import OffsetDeleteRequest as OD

    async def go(cl):
        g = "described"
        r = await jg(cl, g, instance="inst", protocols=[("range", subscription("data"))])
        await sg(cl, g, 1, r.member_id, {r.member_id: b"assigned"}, instance="inst")
        for v in range(6):
            lr = await cl.request(LG(states_filter=["stable"] if v >= 4 else [],
                                     types_filter=["classic"] if v >= 5 else []), v)
            assert lr.error_code == 0
            listed = {x.group_id: x for x in lr.groups}
            assert listed[g].protocol_type == "consumer"
            if v >= 4:
                assert all(x.group_state == "Stable" for x in lr.groups)
            if v >= 5:
                assert listed[g].group_type == "classic"
        assert (await cl.request(LG(types_filter=["consumer"]), 5)).groups == []
        for v in range(7):
            d = (await cl.request(DG(groups=[g, "unknown-group"], include_authorized_operations=v >= 3), v)).groups
            assert (d[0].error_code, d[0].group_state, d[0].protocol_type, d[0].protocol_data) == (
                0, "Stable", "consumer", "range")
            m = d[0].members[0]
            assert (m.member_id, m.client_id, m.client_host) == (r.member_id, "wire-test", "/127.0.0.1")
            assert (m.member_metadata, m.member_assignment) == (subscription("data"), b"assigned")
            assert m.group_instance_id == ("inst" if v >= 4 else None)
            assert d[1].group_state == "Dead"
            assert d[1].error_code == (E.GROUP_ID_NOT_FOUND if v >= 6 else 0)
            if v >= 3:
                assert d[0].authorized_operations > 0
        od = await cl.request(OD(group_id=g, topics=[OD.OffsetDeleteRequestTopic(
            name="data", partitions=[OD.OffsetDeleteRequestPartition(partition_index=0)])]), 0)
        assert od.error_code == 0 and od.topics[0].partitions[0].error_code == E.GROUP_SUBSCRIBED_TO_TOPIC
        await cl.request(OC(group_id="deletable", generation_id_or_member_epoch=-1, topics=[
            OC.OffsetCommitRequestTopic(name="data", partitions=[
                OC.OffsetCommitRequestPartition(partition_index=1, committed_offset=5)])]), 8)
        od = await cl.request(OD(group_id="deletable", topics=[OD.OffsetDeleteRequestTopic(
            name="data", partitions=[OD.OffsetDeleteRequestPartition(partition_index=1)])]), 0)
        assert od.error_code == 0 and od.topics[0].partitions[0].error_code == 0
        assert (await cl.request(OD(group_id="deletable", topics=[]), 0)).error_code == E.GROUP_ID_NOT_FOUND
        for v in range(3):
            name = f"del-{v}"
            await cl.request(OC(group_id=name, topics=[OC.OffsetCommitRequestTopic(name="data", partitions=[
                OC.OffsetCommitRequestPartition(partition_index=0, committed_offset=1)])]), 2)
            res = await cl.request(DeleteGroupsRequest(groups_names=[name]), v)
            assert [(x.group_id, x.error_code) for x in res.results] == [(name, 0)]
            res = await cl.request(DeleteGroupsRequest(groups_names=[name]), v)
            assert res.results[0].error_code == E.GROUP_ID_NOT_FOUND

    wire(broker, go)


def test_group_and_offsets_survive_a_broker_crash(broker):
    from protocol.generated.offset_commit import OffsetCommitRequest as OC
    from protocol.generated.offset_fetch import OffsetFetchRequest as OF

    state = {}

    async def before(cl):
        r = await jg(cl, "durable", instance="keeper", session=60000)
        await sg(cl, "durable", 1, r.member_id, {r.member_id: b"mine"}, instance="keeper")
        oc = await cl.request(OC(group_id="durable", generation_id_or_member_epoch=1, member_id=r.member_id,
                                 group_instance_id="keeper", topics=[OC.OffsetCommitRequestTopic(name="data", partitions=[
                                     OC.OffsetCommitRequestPartition(partition_index=2, committed_offset=77,
                                                                     committed_metadata="before crash")])]), 7)
        assert oc.topics[0].partitions[0].error_code == 0
        state["member"] = r.member_id

    async def after(cl):
        await _coordinator_of(cl, "durable")
        deadline = time.monotonic() + 20
        while True:  # the partition loads after the restart
            r = await cl.request(OF(group_id="durable", topics=None), 7)
            if r.error_code != E.COORDINATOR_LOAD_IN_PROGRESS:
                break
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)
        assert r.error_code == 0
        p = r.topics[0].partitions[0]
        assert (p.partition_index, p.committed_offset, p.metadata) == (2, 77, "before crash")
        # the static member carries on with its member id and generation: the group was reloaded
        assert await hb(cl, "durable", 1, state["member"], instance="keeper") == 0
        s = await sg(cl, "durable", 1, state["member"], instance="keeper")
        assert s.error_code == 0 and s.assignment == b"mine"

    wire(broker, before)
    broker.restart(1, hard=True)  # kill -9: the log is recovered, then scanned
    wire(broker, after)
