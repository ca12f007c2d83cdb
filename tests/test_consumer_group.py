"""KIP-848 consumer groups in-process: the records of __consumer_offsets they are kept in, the
server-side assignors, reconciliation (revoke before assign), and the consumer group manager
driven through the coordinator over real __consumer_offsets logs (joins, epochs, fencing,
session expiry, offset commits with member epochs, reload from the log, conversion of an empty
group between the classic and the consumer protocol)."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from types import MappingProxyType

from broker.coordinator.group.assignors import MemberSpec, TopicSpec, range_, uniform
from broker.coordinator.group.consumer import HeartbeatRequest
from broker.coordinator.group.consumer_group import ConsumerGroup, ConsumerGroupState, MemberState
from broker.coordinator.group.consumer_records import (
    CurrentAssignment,
    LoadedConsumerGroup,
    MemberSubscription,
    TopicMetadata,
    current_assignment_key,
    current_assignment_value,
    decode_consumer_key,
    decode_current_assignment_value,
    decode_member_metadata_value,
    decode_partition_metadata_value,
    epoch_value,
    group_metadata_key,
    member_metadata_key,
    member_metadata_value,
    partition_metadata_value,
    replay,
)
from broker.coordinator.group.group import ClassicGroup
from broker.coordinator.group.reconciliation import NextAssignment, reconcile
from broker.coordinator.group.records import OffsetAndMetadata
from broker.coordinator.group.subscriptions import InvalidRegex, compile_regex
from metadata import MetadataImage, PartitionInfo
from metadata.image import BrokerInfo, TopicInfo
from protocol.errors import Errors
from tests.conftest import eventually_async
from tests.test_group_coordinator import Harness, pid, run

E = Errors
T1, T2 = uuid.UUID(int=1), uuid.UUID(int=2)


# ======================================================================= records
def test_consumer_group_records_round_trip_and_replay():
    sub = MemberSubscription("i1", "rack-a", "cli", "/127.0.0.1", ("a", "b"), None, 30000, "uniform")
    assert decode_member_metadata_value(member_metadata_value(sub)) == sub
    cur = CurrentAssignment(5, 4, 2, {T1: frozenset({0, 2})}, {T2: frozenset({1})})
    assert decode_current_assignment_value(current_assignment_value(cur)) == cur
    meta = [TopicMetadata(T1, "a", 6), TopicMetadata(T2, "b", 3, {0: ("r1", "r2")})]
    assert decode_partition_metadata_value(partition_metadata_value(meta)) == meta
    k = decode_consumer_key(member_metadata_key("g", "m1"))
    assert k is not None and (k.type, k.group, k.member) == (5, "g", "m1")
    assert decode_consumer_key(b"\x00\x02\x00\x01g") is None  # a classic group metadata key

    groups: dict[str, LoadedConsumerGroup] = {}
    for key, value in [(member_metadata_key("g", "m1"), member_metadata_value(sub)),
                       (group_metadata_key("g"), epoch_value(3)),
                       (current_assignment_key("g", "m1"), current_assignment_value(cur)),
                       (member_metadata_key("g", "m2"), member_metadata_value(sub)),
                       (member_metadata_key("g", "m2"), None)]:
        ck = decode_consumer_key(key)
        assert ck is not None
        replay(groups, ck, value)
    assert groups["g"].group_epoch == 3 and list(groups["g"].members) == ["m1"] and groups["g"].current["m1"] == cur
    ck = decode_consumer_key(group_metadata_key("g"))
    assert ck is not None
    replay(groups, ck, None)
    assert groups == {}


# ======================================================================= assignors and reconciliation
def _members(n: int, topics=(T1,), current=None, racks=None) -> dict[str, MemberSpec]:
    return {f"m{i}": MemberSpec(frozenset(topics), (racks or {}).get(f"m{i}"), (current or {}).get(f"m{i}", {}))
            for i in range(n)}


def _count(a) -> dict[str, int]:
    return {m: sum(len(p) for p in x.values()) for m, x in a.items()}


def test_uniform_is_balanced_and_moves_only_what_must_move():
    topics = {T1: TopicSpec(6)}
    first = uniform(_members(3), topics)
    assert sorted(_count(first).values()) == [2, 2, 2]
    # a fourth member: the old members keep what they can, one partition moves
    second = uniform(_members(4, current=first), topics)
    assert sorted(_count(second).values()) == [1, 1, 2, 2]
    moved = sum(len(first[m][T1] - second[m].get(T1, frozenset())) for m in first)
    assert moved == 1
    # one leaves: its partitions go, nobody else's move
    rest = {m: s for m, s in _members(4, current=second).items() if m != "m3"}
    third = uniform(rest, topics)
    assert all(second[m][T1] <= third[m][T1] for m in rest if T1 in second[m])
    assert sum(_count(third).values()) == 6
    # different subscriptions: each gets only what it subscribes to, balanced where it can be
    mixed = uniform({"a": MemberSpec(frozenset({T1})), "b": MemberSpec(frozenset({T1, T2}))},
                    {T1: TopicSpec(2), T2: TopicSpec(2)})
    assert T2 not in mixed["a"] and _count(mixed) == {"a": 2, "b": 2}
    # racks: a partition goes to a member in one of its replicas' racks when balance allows
    racked = uniform(_members(2, racks={"m0": "east", "m1": "west"}),
                     {T1: TopicSpec(2, {0: frozenset({"west"}), 1: frozenset({"east"})})})
    assert racked["m0"][T1] == {1} and racked["m1"][T1] == {0}


def test_range_co_partitions():
    a = range_(_members(2, topics=(T1, T2)), {T1: TopicSpec(3), T2: TopicSpec(3)})
    assert a["m0"] == {T1: {0, 1}, T2: {0, 1}} and a["m1"] == {T1: {2}, T2: {2}}
    # as Kafka's RangeAssignor: static members first, by instance id; ranges dealt afresh (not
    # sticky), so a static member back under a new member id gets the same ranges again
    topics = {T1: TopicSpec(5)}
    group = {"zz": MemberSpec(frozenset({T1}), instance_id="i-a"), "aa": MemberSpec(frozenset({T1})),
             "mm": MemberSpec(frozenset({T1}), instance_id="i-b")}
    first = range_(group, topics)
    assert first == {"zz": {T1: {0, 1}}, "mm": {T1: {2, 3}}, "aa": {T1: {4}}}
    group["new"] = dataclasses.replace(group.pop("zz"), current=first["zz"])
    assert range_(group, topics)["new"] == first["zz"]


def test_reconciliation_revokes_before_it_assigns():
    free = {(T1, 0): -1, (T1, 1): -1, (T1, 2): 3}
    epoch_of = lambda t, p: free.get((t, p), -1)  # noqa: E731
    cur = NextAssignment(3, 2, MemberState.STABLE, {T1: frozenset({0, 1})}, {})
    # target at epoch 4 moves partition 1 away and gives 2 (still owned by someone at epoch 3)
    nxt = reconcile(cur, 4, {T1: frozenset({0, 2})}, epoch_of, None)
    assert nxt.state is MemberState.UNREVOKED_PARTITIONS and nxt.member_epoch == 3
    assert nxt.assigned == {T1: {0}} and nxt.pending_revocation == {T1: {1}}
    assert reconcile(nxt, 4, {T1: frozenset({0, 2})}, epoch_of, {T1: frozenset({0, 1})}) == nxt  # not yet
    done = reconcile(nxt, 4, {T1: frozenset({0, 2})}, epoch_of, {T1: frozenset({0})})
    assert done.state is MemberState.UNRELEASED_PARTITIONS and done.member_epoch == 4 and done.assigned == {T1: {0}}
    free[(T1, 2)] = -1  # its owner released it
    final = reconcile(done, 4, {T1: frozenset({0, 2})}, epoch_of, {T1: frozenset({0})})
    assert final.state is MemberState.STABLE and final.assigned == {T1: {0, 2}}


def test_regular_expressions_follow_re2():
    assert compile_regex("orders-.*").fullmatch("orders-1")
    for bad in ("(", "a(?=b)", r"(a)\1", "a*+"):
        try:
            compile_regex(bad)
        except InvalidRegex:
            continue
        raise AssertionError(f"{bad!r} compiled")


# ======================================================================= the manager, in-process
def _image(partitions: int = 6, name: str = "orders", tid: uuid.UUID = T1, rack: str = "rack-1") -> MetadataImage:
    parts = {p: PartitionInfo(tid, p, (1,), (1,), 1, 0, 0) for p in range(partitions)}
    broker = BrokerInfo(1, 0, uuid.UUID(int=9), (), rack, fenced=False)
    return MetadataImage(topics=MappingProxyType({tid: TopicInfo(tid, name, MappingProxyType(parts))}),
                         topic_ids=MappingProxyType({name: tid}), brokers=MappingProxyType({1: broker}))


def hb(h: Harness, gid: str, member: str, epoch: int, owned=None, topics=("orders",), **kw):
    return h.coordinator.consumer_group_heartbeat(HeartbeatRequest(
        gid, member, epoch, rebalance_timeout_ms=kw.pop("rebalance", 5000),
        subscribed_topic_names=list(topics) if epoch == 0 else kw.pop("names", None),
        owned=({} if epoch == 0 else None) if owned is None else owned, client_id="cli", **kw))


async def _classic_pair(h: Harness, gid: str):
    """A live classic group of two range members over orders' 4 partitions (2 each), the first
    having committed offset 11 of orders-0: their JoinGroup answers."""
    from broker.coordinator.group.migration import encode_assignment
    from tests.test_group_coordinator import subscription

    h.metadata.image = _image(4)
    await h.lead(pid(gid))
    sub = (("range", subscription("orders")),)
    a, b = await asyncio.gather(h.join_new(gid, protocols=sub), h.join_new(gid, protocols=sub))
    plan = {a.member_id: encode_assignment({"orders": [0, 1]}), b.member_id: encode_assignment({"orders": [2, 3]})}
    await asyncio.gather(*(h.sync(gid, 1, x.member_id, plan if x.leader_id == x.member_id else {}) for x in (a, b)))
    tp = ("orders", 0)
    assert await h.coordinator.commit_offsets(gid, a.member_id, None, 1, {tp: OffsetAndMetadata(11)}) == {tp: 0}
    return a, b


async def _settle(h: Harness, gid: str, members: dict[str, tuple[int, dict]]) -> dict[str, tuple[int, dict]]:
    """Heartbeat every member (acknowledging what it was given) until the group is stable."""
    group = h.coordinator.partition(pid(gid)).groups[gid]
    for _ in range(10):
        for mid, (epoch, owned) in list(members.items()):
            r = await hb(h, gid, mid, epoch, owned=owned)
            assert r.error == 0, (mid, r)
            members[mid] = (r.member_epoch, owned if r.assignment is None else r.assignment)
        if group.state is ConsumerGroupState.STABLE:
            return members
    raise AssertionError(f"not stable: {group}")


def test_members_join_reconcile_commit_and_reload(tmp_path):
    async def scenario(h: Harness):
        gid = "billing"
        h.metadata.image = _image()
        c = h.coordinator
        await h.lead(pid(gid))
        r = await hb(h, gid, "m1", 0)
        assert r.error == 0 and r.member_epoch == 1 and r.assignment == {T1: frozenset(range(6))}
        members = {"m1": (1, r.assignment)}
        for m in ("m2", "m3"):
            r = await hb(h, gid, m, 0)
            assert r.error == 0 and r.assignment == {}  # everything is still m1's: nothing until released
            members[m] = (r.member_epoch, {})
        members = await _settle(h, gid, members)
        owned = [set(a.get(T1, ())) for _, a in members.values()]
        assert sorted(len(o) for o in owned) == [2, 2, 2] and set().union(*owned) == set(range(6))
        group = c.partition(pid(gid)).groups[gid]
        assert isinstance(group, ConsumerGroup) and group.state_name == "Stable" and group.group_epoch == 3

        # commits carry the member epoch
        epoch1 = members["m1"][0]
        tp = ("orders", 0)
        assert await c.commit_offsets(gid, "m1", None, epoch1, {tp: OffsetAndMetadata(5)}) == {tp: 0}
        assert await c.commit_offsets(gid, "m1", None, epoch1 - 1, {tp: OffsetAndMetadata(6)}) == {
            tp: E.STALE_MEMBER_EPOCH}
        assert await c.commit_offsets(gid, "nobody", None, 1, {tp: OffsetAndMetadata(6)}) == {tp: E.UNKNOWN_MEMBER_ID}
        assert c.fetch_offsets(gid, [tp], "m1", epoch1 + 1)[0] == E.STALE_MEMBER_EPOCH
        assert c.fetch_offsets(gid, [tp], "m1", epoch1) == (0, [(tp, OffsetAndMetadata(5))])

        # bad input: Kafka's codes
        assert (await hb(h, gid, "m1", epoch1 + 5, owned={})).error == E.FENCED_MEMBER_EPOCH
        assert (await hb(h, gid, "ghost", 3, owned={})).error == E.UNKNOWN_MEMBER_ID
        assert (await hb(h, gid, "m9", 0, server_assignor="sticky")).error == E.UNSUPPORTED_ASSIGNOR
        assert (await h.coordinator.consumer_group_heartbeat(HeartbeatRequest(
            gid, "m9", 0, rebalance_timeout_ms=1000, subscribed_topic_regex="(", owned={}))).error == \
            E.INVALID_REGULAR_EXPRESSION
        assert (await hb(h, gid, "", 0)).error == E.INVALID_REQUEST  # v1: the client names itself
        assert c.heartbeat(gid, "m1", None, 1) == E.UNKNOWN_MEMBER_ID  # a classic heartbeat
        assert (await h.join(gid)).error == E.MEMBER_ID_REQUIRED  # a classic member may join (migration)

        # a restart of the coordinator resumes the group from its records
        h.resign(pid(gid))
        await h.lead(pid(gid))
        again = c.partition(pid(gid)).groups[gid]
        assert isinstance(again, ConsumerGroup) and again is not group
        assert (again.group_epoch, again.assignment_epoch) == (group.group_epoch, group.assignment_epoch)
        assert {m: (x.member_epoch, x.assigned) for m, x in again.members.items()} == \
            {m: (x.member_epoch, x.assigned) for m, x in group.members.items()}
        assert again.state_name == "Stable" and again.offsets[tp].value.offset == 5
        r = await hb(h, gid, "m2", members["m2"][0])
        assert r.error == 0 and r.member_epoch == members["m2"][0]

        # leaving: the others get the partitions once the group epoch moves
        r = await hb(h, gid, "m3", -1)
        assert (r.error, r.member_epoch) == (0, -1)
        del members["m3"]
        members = await _settle(h, gid, members)
        assert sorted(len(a.get(T1, ())) for _, a in members.values()) == [3, 3]

    run(tmp_path, scenario)


def test_session_expiry_fences_and_an_empty_group_changes_protocol(tmp_path):
    async def scenario(h: Harness):
        gid = "expiring"
        h.metadata.image = _image()
        c = h.coordinator
        c.consumer.config = c.config = type(c.config)(**{**c.config.__dict__, "consumer_session_timeout_ms": 200})
        await h.lead(pid(gid))
        assert (await hb(h, gid, "m1", 0)).error == 0
        group = c.partition(pid(gid)).groups[gid]
        assert await eventually_async(lambda: not group.members, timeout=3)
        assert group.state_name == "Empty"
        # an empty consumer group becomes classic for a classic member, offsets kept
        tp = ("orders", 1)
        assert await c.commit_offsets(gid, "", None, -1, {tp: OffsetAndMetadata(7)}) == {tp: 0}
        joined = await h.join_new(gid)
        assert joined.error == 0
        classic = c.partition(pid(gid)).groups[gid]
        assert isinstance(classic, ClassicGroup) and classic.offsets[tp].value.offset == 7
        assert (await hb(h, gid, "m2", 0)).error == 0  # the live classic group upgrades (KIP-848 migration)
        upgraded = c.partition(pid(gid)).groups[gid]
        assert isinstance(upgraded, ConsumerGroup) and len(upgraded.members) == 2
        assert upgraded.offsets[tp].value.offset == 7

    run(tmp_path, scenario)


def test_new_partitions_reach_members(tmp_path):
    async def scenario(h: Harness):
        gid = "growing"
        h.metadata.image = _image(2)
        await h.lead(pid(gid))
        r = await hb(h, gid, "m1", 0)
        assert r.assignment == {T1: frozenset({0, 1})}
        h.metadata.image = _image(4)  # partitions added (KIP-253 count change alike)
        r2 = await hb(h, gid, "m1", r.member_epoch)
        assert r2.member_epoch == r.member_epoch + 1 and r2.assignment == {T1: frozenset(range(4))}
        h.metadata.image = _image(4, rack="rack-2")  # the replicas' racks changed (KIP-1101)
        r3 = await hb(h, gid, "m1", r2.member_epoch)
        assert r3.member_epoch == r2.member_epoch + 1
        assert (await hb(h, gid, "m1", r3.member_epoch)).member_epoch == r3.member_epoch  # nothing new: no bump

    run(tmp_path, scenario)


def test_state_names():
    g = ConsumerGroup("g")
    assert g.state_name == "Empty" and g.type == "consumer"


def _two_topics() -> MetadataImage:
    a, b = _image(4), _image(2, "audit", T2)
    return MetadataImage(topics=MappingProxyType({**a.topics, **b.topics}),
                         topic_ids=MappingProxyType({**a.topic_ids, **b.topic_ids}), brokers=a.brokers)


def test_static_members_regex_and_the_rebalance_timeout(tmp_path):
    async def scenario(h: Harness):
        gid = "statics"
        h.metadata.image = _image(4)
        c = h.coordinator
        await h.lead(pid(gid))
        r1 = await hb(h, gid, "s1", 0, instance_id="i1")
        assert r1.error == 0 and r1.assignment == {T1: frozenset(range(4))}
        group = c.partition(pid(gid)).groups[gid]
        assert isinstance(group, ConsumerGroup)
        # a static member leaving for a while keeps its partitions; its instance id is held
        left = await hb(h, gid, "s1", -2, instance_id="i1")
        assert (left.error, left.member_epoch) == (0, -2)
        assert (await hb(h, gid, "s9", 0, instance_id="i1")).error == 0  # s1 released: s9 takes over
        assert "s1" not in group.members and group.members["s9"].assigned == {T1: frozenset(range(4))}
        epoch = group.group_epoch
        assert (await hb(h, gid, "s10", 0, instance_id="i1")).error == E.UNRELEASED_INSTANCE_ID
        assert group.group_epoch == epoch  # nothing changed for the refused claim
        h.resign(pid(gid))  # the takeover is in the log
        await h.lead(pid(gid))
        group = c.partition(pid(gid)).groups[gid]
        assert isinstance(group, ConsumerGroup) and set(group.members) == {"s9"}
        assert group.members["s9"].assigned == {T1: frozenset(range(4))} and group.static_members == {"i1": "s9"}

        # a regular expression, resolved on the broker: a matching topic created later joins in
        r = await h.coordinator.consumer_group_heartbeat(HeartbeatRequest(
            gid, "rx", 0, rebalance_timeout_ms=300, subscribed_topic_regex="au.*", owned={}, client_id="cli"))
        assert r.error == 0 and r.assignment == {}  # no topic matches yet
        h.metadata.image = _two_topics()
        r = await hb(h, gid, "rx", r.member_epoch, owned={})
        assert r.error == 0 and r.assignment == {T2: frozenset({0, 1})}

        # s9 never revokes what a new member's arrival takes from it: fenced after its rebalance timeout
        s9_epoch = group.members["s9"].member_epoch
        assert (await hb(h, gid, "late", 0, rebalance=300)).error == 0
        r = await hb(h, gid, "s9", s9_epoch, instance_id="i1", rebalance=300)
        assert r.error == 0 and group.members["s9"].state is MemberState.UNREVOKED_PARTITIONS
        assert await eventually_async(lambda: "s9" not in group.members, timeout=3)

    run(tmp_path, scenario)


def test_online_upgrade_and_downgrade_keep_members_and_offsets(tmp_path):
    """KIP-848's migration: a consumer-protocol member joining a live classic group converts it;
    the classic members go on with JoinGroup/SyncGroup/Heartbeat; when the consumer member
    leaves, the group is classic again and its members rejoin. Offsets stay."""
    from broker.coordinator.group.migration import parse_assignment
    from tests.test_group_coordinator import subscription

    async def scenario(h: Harness):
        gid = "migrating"
        c = h.coordinator
        a, b = await _classic_pair(h, gid)
        sub = (("range", subscription("orders")),)
        tp = ("orders", 0)

        # upgrade: the consumer member joins the live classic group
        r = await hb(h, gid, "new", 0)
        assert r.error == 0 and r.assignment == {}
        group = c.partition(pid(gid)).groups[gid]
        assert isinstance(group, ConsumerGroup) and set(group.members) == {a.member_id, b.member_id, "new"}
        assert group.offsets[tp].value.offset == 11
        assert c.heartbeat(gid, a.member_id, None, 1) == E.REBALANCE_IN_PROGRESS
        owned = {}
        for _ in range(4):  # the classic members rejoin until each is at its target
            for x in (a, b):
                j = await h.join(gid, x.member_id, protocols=sub)
                assert j.error == 0, j
                s = await h.sync(gid, j.generation_id, x.member_id)
                assert s.error == 0
                owned[x.member_id] = parse_assignment(s.assignment).get("orders", [])
            r = await hb(h, gid, "new", r.member_epoch, owned={})
            assert r.error == 0
            if r.assignment:
                owned["new"] = sorted(r.assignment[T1])
        assert sorted(p for ps in owned.values() for p in ps) == [0, 1, 2, 3] and owned["new"]
        assert await c.commit_offsets(gid, "new", None, r.member_epoch, {tp: OffsetAndMetadata(12)}) == {tp: 0}

        # downgrade: the consumer member leaves; the classic members rejoin a classic group
        assert (await hb(h, gid, "new", -1)).error == 0
        classic = c.partition(pid(gid)).groups[gid]
        assert isinstance(classic, ClassicGroup) and set(classic.members) == {a.member_id, b.member_id}
        assert classic.state_name == "PreparingRebalance" and classic.offsets[tp].value.offset == 12
        j1, j2 = await asyncio.gather(*(h.join(gid, x.member_id, protocols=sub) for x in (a, b)))
        assert j1.error == j2.error == 0 and j1.generation_id == j2.generation_id

    run(tmp_path, scenario)


def test_group_configs_stay_within_the_broker_bounds():
    from metadata.config_defs import ConfigValueError, validate_group_config

    validate_group_config("consumer.session.timeout.ms", "45000")
    validate_group_config("consumer.heartbeat.interval.ms", "700", {"group.consumer.min.heartbeat.interval.ms": "500"})
    for name, value in (("consumer.session.timeout.ms", "1000"), ("consumer.heartbeat.interval.ms", "60000"),
                        ("consumer.heartbeat.interval.ms", "x"), ("consumer.assignor", "uniform")):
        try:
            validate_group_config(name, value)
        except ConfigValueError:
            continue
        raise AssertionError(f"{name}={value} accepted")


def test_broker_group_consumer_settings_are_checked_as_kafka():
    """Kafka's GroupCoordinatorConfig checks at startup: a bad group.consumer.* or
    group.coordinator.rebalance.protocols value is one ConfigError naming it."""
    from broker.coordinator.group.config import GroupCoordinatorConfig
    from node.config import ConfigError

    ok = GroupCoordinatorConfig.from_props({
        "group.consumer.heartbeat.interval.ms": "500", "group.consumer.min.heartbeat.interval.ms": "500",
        "group.consumer.session.timeout.ms": "8000", "group.consumer.min.session.timeout.ms": "6000",
        "group.consumer.assignors": "org.apache.kafka.coordinator.group.assignor.RangeAssignor,uniform",
        "group.coordinator.rebalance.protocols": "classic,consumer"})
    assert ok.consumer_assignors == ("range", "uniform") and ok.consumer_protocol_enabled
    assert not GroupCoordinatorConfig.from_props({"group.coordinator.rebalance.protocols": "classic"}
                                                 ).consumer_protocol_enabled
    for props, says in (
            ({"group.consumer.heartbeat.interval.ms": "500"}, "must be greater than or equal to"),
            ({"group.consumer.session.timeout.ms": "8000"}, "group.consumer.min.session.timeout.ms"),
            ({"group.consumer.max.heartbeat.interval.ms": "4000"}, "group.consumer.max.heartbeat.interval.ms"),
            ({"group.consumer.heartbeat.interval.ms": "50000", "group.consumer.max.heartbeat.interval.ms": "60000"},
             "must be less than group.consumer.session.timeout.ms"),
            ({"group.consumer.min.session.timeout.ms": "0"}, "at least 1"),
            ({"group.consumer.session.timeout.ms": "soon"}, "not an integer"),
            ({"group.consumer.assignors": "sticky"}, "unknown assignor 'sticky'"),
            ({"group.consumer.assignors": "range,range"}, "twice"),
            ({"group.consumer.assignors": ""}, "at least one assignor"),
            ({"group.consumer.migration.policy": "sideways"}, "group.consumer.migration.policy"),
            ({"group.coordinator.rebalance.protocols": "consumer"}, "Disabling the 'classic' protocol"),
            ({"group.coordinator.rebalance.protocols": "classic,modern"}, "'modern' is not one of")):
        try:
            GroupCoordinatorConfig.from_props(props)
        except ConfigError as e:
            assert says in str(e) and "\n" not in str(e), (props, str(e))
            continue
        raise AssertionError(f"{props} accepted")


def test_consumer_protocol_disabled_and_old_offset_commits(tmp_path):
    """Without `consumer` in group.coordinator.rebalance.protocols both KIP-848 APIs answer
    UNSUPPORTED_VERSION, as Kafka's KafkaApis, while classic groups carry on."""
    from broker.coordinator.group.config import GroupCoordinatorConfig
    from tests.test_group_coordinator import UNIT_CONFIG

    async def scenario(h: Harness):
        gid = "classic-only"
        h.metadata.image = _image()
        await h.lead(pid(gid))
        r = await hb(h, gid, "m1", 0)
        assert r.error == E.UNSUPPORTED_VERSION and r.message
        assert h.coordinator.consumer_group_describe(gid)[0] == E.UNSUPPORTED_VERSION
        assert (await h.join_new(gid)).error == 0

    config = GroupCoordinatorConfig(**{**UNIT_CONFIG.__dict__, "rebalance_protocols": ("classic",)})
    run(tmp_path / "disabled", scenario, config)

    async def commits(h: Harness):
        """Kafka's ConsumerGroup.validateOffsetCommit: a KIP-848 member commits with v9+."""
        gid = "old-commits"
        h.metadata.image = _image()
        c = h.coordinator
        await h.lead(pid(gid))
        r = await hb(h, gid, "m1", 0)
        tp = ("orders", 0)
        assert await c.commit_offsets(gid, "m1", None, r.member_epoch, {tp: OffsetAndMetadata(3)}, 8) == {
            tp: E.UNSUPPORTED_VERSION}
        assert await c.commit_offsets(gid, "m1", None, r.member_epoch, {tp: OffsetAndMetadata(3)}, 9) == {tp: 0}
        assert await c.commit_offsets(gid, "nobody", None, 1, {tp: OffsetAndMetadata(3)}, 8) == {
            tp: E.UNKNOWN_MEMBER_ID}

    run(tmp_path / "commits", commits)


def test_regex_resolutions_are_records_a_reload_resumes_from(tmp_path):
    """Kafka's ConsumerGroupRegularExpression record (type 16): a subscribed regular expression's
    topics, written when they change, replayed by a coordinator that loads the group (which
    matches again only once the metadata moved past the record's image offset), tombstoned when
    no member subscribes to it any more."""
    from broker.coordinator.group.consumer_records import REGULAR_EXPRESSION, decode_regex_value

    def regex_records(h: Harness, gid: str) -> list:
        out = []
        for r in h.records(pid(gid)):
            k = decode_consumer_key(r.key)
            if k is not None and k.type == REGULAR_EXPRESSION:
                out.append((k.regex, None if r.value is None else decode_regex_value(r.value).topics))
        return out

    async def scenario(h: Harness):
        gid = "regexes"
        h.metadata.image = dataclasses.replace(_two_topics(), offset=10)
        c = h.coordinator
        await h.lead(pid(gid))
        r = await c.consumer_group_heartbeat(HeartbeatRequest(
            gid, "rx", 0, rebalance_timeout_ms=5000, subscribed_topic_regex="au.*", owned={}, client_id="cli"))
        assert r.error == 0 and r.assignment == {T2: frozenset({0, 1})}
        assert regex_records(h, gid) == [("au.*", ("audit",))]
        r = await hb(h, gid, "rx", r.member_epoch, owned=r.assignment)
        assert regex_records(h, gid) == [("au.*", ("audit",))]  # nothing new: no record

        # a reload takes the resolution from the record; with the image at the record's offset it
        # is not matched again (the image below claims offset 10 with another matching topic)
        h.resign(pid(gid))
        await h.lead(pid(gid))
        group = c.partition(pid(gid)).groups[gid]
        assert isinstance(group, ConsumerGroup) and group.resolved_regexes["au.*"].topics == ("audit",)
        a, b = _two_topics(), _image(3, "audit-2", uuid.UUID(int=3))
        more = MetadataImage(offset=10, topics=MappingProxyType({**a.topics, **b.topics}),
                             topic_ids=MappingProxyType({**a.topic_ids, **b.topic_ids}), brokers=a.brokers)
        h.metadata.image = more
        epoch = group.group_epoch
        r = await hb(h, gid, "rx", r.member_epoch, owned={T2: frozenset({0, 1})})
        assert r.error == 0 and group.group_epoch == epoch and len(regex_records(h, gid)) == 1
        # the metadata moves on: matched again, a new record, a new epoch with the new topic
        h.metadata.image = dataclasses.replace(more, offset=11)
        r = await hb(h, gid, "rx", r.member_epoch, owned={T2: frozenset({0, 1})})
        assert r.error == 0 and group.group_epoch == epoch + 1
        assert regex_records(h, gid)[-1] == ("au.*", ("audit", "audit-2"))

        # the last member subscribing to it leaves: the resolution is tombstoned
        assert (await hb(h, gid, "rx", -1)).error == 0
        assert regex_records(h, gid)[-1] == ("au.*", None) and group.resolved_regexes == {}

    run(tmp_path, scenario)


def test_a_failed_write_rolls_the_group_back(tmp_path):
    """A group's records not written (refused at once, or failing to replicate): what the
    operation changed in memory is put back, as Kafka's timeline structures revert to the last
    written offset; the operations queued behind a failed write are undone with it."""

    async def scenario(h: Harness):
        gid = "rollback"
        h.metadata.image = _image()
        c = h.coordinator
        await h.lead(pid(gid))
        real = c.write
        held: list[asyncio.Future] = []
        mode = {"now": 0, "hold": False}

        def write(index, records, producer=None):
            if mode["now"]:
                done = asyncio.get_running_loop().create_future()
                done.set_result(mode["now"])
                return mode["now"], -1, done
            code, first, done = real(index, records, producer)
            if not mode["hold"]:
                return code, first, done
            fut = asyncio.get_running_loop().create_future()
            held.append(fut)
            return code, first, fut

        c.write = write  # type: ignore[method-assign]
        r1 = await hb(h, gid, "m1", 0)
        group = c.partition(pid(gid)).groups[gid]
        assert isinstance(group, ConsumerGroup) and r1.error == 0

        def state():
            return (group.group_epoch, group.assignment_epoch, {m: (x.member_epoch, x.assigned, x.state)
                                                                 for m, x in group.members.items()},
                    dict(group.targets), dict(group.partition_epochs))

        before = state()
        # refused at once (not the leader any more): nothing changed
        mode["now"] = E.NOT_LEADER_OR_FOLLOWER
        assert (await hb(h, gid, "m2", 0)).error == E.NOT_COORDINATOR
        assert state() == before
        # a new group whose first write fails is gone again
        assert (await hb(h, gid + "-new", "x", 0)).error == E.NOT_COORDINATOR
        assert gid + "-new" not in c.partition(pid(gid + "-new")).groups
        mode["now"] = 0

        # written but not replicated: a join, then m1's heartbeat that changes m1 in place
        # (it must give partitions up to m2), both in flight; the first fails: both are undone
        mode["hold"] = True
        j2 = asyncio.ensure_future(hb(h, gid, "m2", 0))
        assert await eventually_async(lambda: len(held) == 1, timeout=3)
        j1 = asyncio.ensure_future(hb(h, gid, "m1", r1.member_epoch, owned=r1.assignment))
        assert await eventually_async(lambda: len(held) == 2, timeout=3)
        assert set(group.members) == {"m1", "m2"} and group.members["m1"].state is MemberState.UNREVOKED_PARTITIONS
        held[0].set_result(E.REQUEST_TIMED_OUT)
        assert (await j2).error == E.COORDINATOR_NOT_AVAILABLE
        assert state() == before
        held[1].set_result(E.REQUEST_TIMED_OUT)  # undone already: nothing more to undo
        assert (await j1).error == E.COORDINATOR_NOT_AVAILABLE and state() == before
        held.clear()

        # a refused heartbeat is undone too (nothing to undo here), its session left running
        mode["hold"] = False
        timer = group.members["m1"].session_timer
        assert (await hb(h, gid, "m1", r1.member_epoch + 3, owned={})).error == E.FENCED_MEMBER_EPOCH
        assert state() == before and group.members["m1"].session_timer is timer

        # a session expiry whose fencing is not written: the member is back, and its session
        # runs again (it is fenced once the write goes through)
        c.consumer.config = c.config = type(c.config)(**{**c.config.__dict__, "consumer_session_timeout_ms": 200})
        assert (await hb(h, gid, "m1", r1.member_epoch)).error == 0  # its session now ends in 200 ms
        mode["hold"] = True
        assert await eventually_async(lambda: len(held) == 1, timeout=3)
        assert "m1" not in group.members
        mode["hold"] = False
        held[0].set_result(E.REQUEST_TIMED_OUT)
        await asyncio.sleep(0)  # the write's callbacks run
        assert "m1" in group.members and group.members["m1"].session_timer is not None
        assert await eventually_async(lambda: not group.members, timeout=3)

    run(tmp_path, scenario)


def test_static_members_change_protocol_in_a_live_group(tmp_path):
    """Static members in a migrated group, as Kafka's getOrMaybeSubscribeStaticConsumerGroupMember:
    a classic static member restarting under either protocol (no member id, its instance id)
    replaces its old self at once, with its assignment; the last consumer-protocol member
    replaced by a classic one takes the group back to classic."""
    from tests.test_group_coordinator import subscription

    async def scenario(h: Harness):
        gid = "static-migrating"
        h.metadata.image = _image(4)
        c = h.coordinator
        await h.lead(pid(gid))
        sub = (("cooperative-sticky", subscription("orders")),)
        a, b = await asyncio.gather(h.join(gid, instance="ia", protocols=sub), h.join(gid, instance="ib", protocols=sub))
        from broker.coordinator.group.migration import encode_assignment, parse_assignment
        plan = {a.member_id: encode_assignment({"orders": [0, 1]}), b.member_id: encode_assignment({"orders": [2, 3]})}
        await asyncio.gather(*(h.sync(gid, 1, x.member_id, plan if x.leader_id == x.member_id else {}, instance=i)
                               for x, i in ((a, "ia"), (b, "ib"))))
        assert (await hb(h, gid, "new", 0)).error == 0  # upgraded
        group = c.partition(pid(gid)).groups[gid]
        assert isinstance(group, ConsumerGroup)
        a_owned = group.members[a.member_id].assigned
        epoch = group.group_epoch

        # classic static member "ia" restarts under the consumer protocol: it replaces its old self
        r = await hb(h, gid, "a2", 0, instance_id="ia")
        assert r.error == 0 and a.member_id not in group.members and group.static_members["ia"] == "a2"
        # it goes on from its predecessor's place (reconciling towards its target): no new epoch
        assert r.assignment is not None and set(r.assignment.get(T1, ())) <= set(a_owned[T1])
        assert group.group_epoch == epoch
        # classic static member "ib" restarts as classic: a new member id, its partitions kept
        b_owned = group.members[b.member_id].assigned
        b2 = await h.join(gid, instance="ib", protocols=sub)
        assert b2.error == 0 and b2.member_id != b.member_id and b2.leader_id == ""  # no leader: the coordinator assigns
        now = group.members[b2.member_id].assigned
        assert b.member_id not in group.members and set(now.get(T1, ())) <= set(b_owned[T1])
        s = await h.sync(gid, b2.generation_id, b2.member_id, instance="ib")
        assert s.error == 0 and parse_assignment(s.assignment).get("orders", []) == sorted(now.get(T1, ()))
        # a known member id must hold the instance id
        assert (await h.join(gid, b.member_id, instance="ib", protocols=sub)).error == E.FENCED_INSTANCE_ID
        assert (await h.join(gid, b2.member_id, instance="nobody", protocols=sub)).error == E.UNKNOWN_MEMBER_ID
        # MEMBER_ID_REQUIRED keeps nothing (as Kafka for a consumer group)
        assert (await h.join(gid, protocols=sub)).error == E.MEMBER_ID_REQUIRED
        assert len(group.members) == 3

        # downgrade: "new" leaves, then the last consumer-protocol member (a2, "ia") is replaced
        # by a classic member of the same instance id
        assert (await hb(h, gid, "new", -1)).error == 0
        a3 = await h.join(gid, instance="ia", protocols=sub)
        assert a3.error == 0
        classic = c.partition(pid(gid)).groups[gid]
        assert isinstance(classic, ClassicGroup) and set(classic.members) == {a3.member_id, b2.member_id}

    run(tmp_path, scenario)


def test_classic_members_of_a_consumer_group_must_sync_and_rejoin_in_time(tmp_path):
    """Kafka's sync and join timeouts of a classic member in a consumer group: one that joins and
    does not SyncGroup within its rebalance timeout is fenced, and so is one told
    REBALANCE_IN_PROGRESS that does not rejoin within it."""
    from tests.test_group_coordinator import subscription

    async def scenario(h: Harness):
        gid = "classic-timeouts"
        h.metadata.image = _image(4)
        c = h.coordinator
        await h.lead(pid(gid))
        assert (await hb(h, gid, "new", 0)).error == 0  # a consumer group
        group = c.partition(pid(gid)).groups[gid]
        sub = (("range", subscription("orders")),)
        slow = await h.join_new(gid, protocols=sub, rebalance=200)
        assert slow.error == 0 and slow.member_id in group.members
        assert await eventually_async(lambda: slow.member_id not in group.members, timeout=3)  # never synced

        ok = await h.join_new(gid, protocols=sub, rebalance=200)
        assert (await h.sync(gid, ok.generation_id, ok.member_id)).error == 0
        await asyncio.sleep(0.3)
        assert ok.member_id in group.members  # it synced: no sync timeout
        assert (await hb(h, gid, "other", 0)).error == 0  # a new epoch: ok must rejoin
        m = group.members[ok.member_id]
        assert c.heartbeat(gid, ok.member_id, None, m.member_epoch) == E.REBALANCE_IN_PROGRESS
        assert await eventually_async(lambda: ok.member_id not in group.members, timeout=3)  # never rejoined

    run(tmp_path, scenario)


def test_a_failed_write_rolls_back_a_change_of_group_type(tmp_path):
    """An upgrade (a consumer-protocol member joining a live classic group) whose records are
    not written leaves the classic group in place, its members rejoining it; a downgrade (the
    last consumer-protocol member leaving) likewise leaves the consumer group as it was."""
    from tests.test_group_coordinator import subscription

    async def scenario(h: Harness):
        gid = "type-rollback"
        c = h.coordinator
        a, b = await _classic_pair(h, gid)
        sub = (("range", subscription("orders")),)
        tp = ("orders", 0)
        classic = c.partition(pid(gid)).groups[gid]
        real = c.write
        failing = {"on": True}

        def write(index, records, producer=None):
            if failing["on"]:
                done = asyncio.get_running_loop().create_future()
                done.set_result(E.NOT_LEADER_OR_FOLLOWER)
                return E.NOT_LEADER_OR_FOLLOWER, -1, done
            return real(index, records, producer)

        c.write = write  # type: ignore[method-assign]
        assert (await hb(h, gid, "new", 0)).error == E.NOT_COORDINATOR
        assert c.partition(pid(gid)).groups[gid] is classic and not classic.is_dead
        assert set(classic.members) == {a.member_id, b.member_id} and classic.offsets[tp].value.offset == 11
        assert classic.state_name == "PreparingRebalance"  # its members rejoin it
        j1, j2 = await asyncio.gather(*(h.join(gid, x.member_id, protocols=sub) for x in (a, b)))
        assert j1.error == j2.error == 0 and j1.generation_id == j2.generation_id == 2

        failing["on"] = False
        assert (await hb(h, gid, "new", 0)).error == 0
        group = c.partition(pid(gid)).groups[gid]
        assert isinstance(group, ConsumerGroup) and len(group.members) == 3
        failing["on"] = True
        assert (await hb(h, gid, "new", -1)).error == E.NOT_COORDINATOR
        assert c.partition(pid(gid)).groups[gid] is group and not group.is_dead and "new" in group.members
        assert all(m.session_timer is not None for m in group.members.values())  # sessions run again
        failing["on"] = False
        assert (await hb(h, gid, "new", -1)).error == 0
        assert isinstance(c.partition(pid(gid)).groups[gid], ClassicGroup)

        # an empty consumer group a classic member's JoinGroup would convert: not converted when
        # its tombstones are refused
        e = "type-rollback-empty"
        await h.lead(pid(e))
        assert (await hb(h, e, "x", 0)).error == 0 and (await hb(h, e, "x", -1)).error == 0
        empty = c.partition(pid(e)).groups[e]
        failing["on"] = True
        assert (await h.join(e, "", protocols=sub)).error == E.NOT_COORDINATOR
        assert c.partition(pid(e)).groups[e] is empty and not empty.is_dead
        failing["on"] = False
        assert (await h.join_new(e, protocols=sub)).error == 0
        assert isinstance(c.partition(pid(e)).groups[e], ClassicGroup)

    run(tmp_path, scenario)
