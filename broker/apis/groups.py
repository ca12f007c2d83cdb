"""Group APIs: FindCoordinator, JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetCommit,
TxnOffsetCommit, OffsetFetch, OffsetDelete, ListGroups, DescribeGroups, DeleteGroups, and
KIP-848's ConsumerGroupHeartbeat and ConsumerGroupDescribe.

Thin translation between each version's request/response and the group coordinator
(broker/coordinator/group), which owns the semantics. FindCoordinator names the leader of the
group's __consumer_offsets partition or the transactional id's __transaction_state partition,
creating the topic on first use.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from broker.apis.registry import RequestContext, api
from broker.apis.share_admin import share_groups_deleted
from broker.apis.transactions import transaction_coordinator
from broker.coordinator import wall_clock_ms
from broker.coordinator.group.base import Group
from broker.coordinator.group.consumer import HeartbeatRequest
from broker.coordinator.group.consumer_records import Assignment
from broker.coordinator.group.coordinator import GROUP_OPERATIONS, GroupCoordinator
from broker.coordinator.group.group import ClassicGroup, PositionExchange
from broker.coordinator.group.records import OFFSETS_TOPIC, OffsetAndMetadata
from broker.coordinator.share.records import parse_coordinator_key
from broker.coordinator.transaction.records import TRANSACTION_STATE_TOPIC
from protocol.errors import Errors
from protocol.generated.consumer_group_describe import ConsumerGroupDescribeResponse
from protocol.generated.consumer_group_heartbeat import ConsumerGroupHeartbeatResponse
from protocol.generated.delete_groups import DeleteGroupsResponse
from protocol.generated.describe_groups import DescribeGroupsResponse
from protocol.generated.find_coordinator import FindCoordinatorResponse
from protocol.generated.heartbeat import HeartbeatResponse
from protocol.generated.join_group import JoinGroupResponse
from protocol.generated.leave_group import LeaveGroupResponse
from protocol.generated.list_groups import ListGroupsResponse
from protocol.generated.offset_commit import OffsetCommitResponse
from protocol.generated.offset_delete import OffsetDeleteResponse
from protocol.generated.offset_fetch import OffsetFetchResponse
from protocol.generated.sync_group import SyncGroupResponse
from protocol.generated.txn_offset_commit import TxnOffsetCommitResponse

GROUP_KEY, TRANSACTION_KEY, SHARE_KEY = 0, 1, 2
# Strata's key type for diskless coordinators (the key is the __diskless_metadata partition
# number); Kafka uses 0-2, so 100 keeps clear of what it may add.
DISKLESS_KEY = 100
NO_AUTHORIZED_OPERATIONS = -(2**31)


def _coordinator(ctx: RequestContext) -> GroupCoordinator:
    """The broker's group coordinator. It exists before the listener opens, and once shut down
    (inactive) it answers COORDINATOR_NOT_AVAILABLE itself, so handlers need no check of their own."""
    return ctx.services.group_coordinator


def _client_host(ctx: RequestContext) -> str:
    peer = ctx.connection.peer if ctx.connection is not None else ""
    host = peer.rsplit(":", 1)[0] if ":" in peer else peer
    return f"/{host}" if host else ""


# ---------------------------------------------------------------- FindCoordinator
def _find(ctx: RequestContext, key: str, key_type: int) -> tuple[int, int, str, int]:
    """(error, node id, host, port): the leader of the key's partition of __consumer_offsets
    (groups) or __transaction_state (transactional ids), creating the topic on first use."""
    none = (Errors.COORDINATOR_NOT_AVAILABLE, -1, "", -1)
    if key_type == GROUP_KEY:
        c: Any = _coordinator(ctx)
        topic_name = OFFSETS_TOPIC
    elif key_type == TRANSACTION_KEY:
        c = transaction_coordinator(ctx)
        topic_name = TRANSACTION_STATE_TOPIC
        if not key:
            return Errors.INVALID_REQUEST, -1, "", -1
    elif key_type == SHARE_KEY:  # KIP-932's share coordinator: group:topicId:partition
        c = ctx.services.share_coordinator
        topic_name = c.topic
        if parse_coordinator_key(key) is None:
            return Errors.INVALID_REQUEST, -1, "", -1
    elif key_type == DISKLESS_KEY:
        c = ctx.services.diskless_coordinator
        topic_name = c.topic
        if not key.isdigit():
            return Errors.INVALID_REQUEST, -1, "", -1
    else:
        return Errors.INVALID_REQUEST, -1, "", -1
    if c is None or not c.active:
        return none
    image = ctx.services.metadata.image
    topic = image.topic(topic_name)
    if topic is None:
        if key_type == GROUP_KEY:
            c.ensure_topic()
        else:
            c.ensure_topic()
        return none
    info = topic.partitions.get(c.partition_for(key))
    if info is None or info.leader < 0:
        return none
    b = image.brokers.get(info.leader)
    ep = b.endpoint(ctx.listener) if b is not None and not b.fenced else None
    if ep is None:
        return none
    return 0, info.leader, ep.host, ep.port


@api(10, 0, 6)
async def find_coordinator(ctx: RequestContext, req) -> FindCoordinatorResponse:
    R = FindCoordinatorResponse
    if ctx.api_version < 4:
        err, node, host, port = _find(ctx, req.key, req.key_type)
        return R(error_code=err, error_message=_message(err), node_id=node, host=host, port=port)
    out = []
    for key in req.coordinator_keys:
        err, node, host, port = _find(ctx, key, req.key_type)
        out.append(R.Coordinator(key=key, node_id=node, host=host, port=port, error_code=err,
                                 error_message=_message(err)))
    return R(coordinators=out)


def _message(err: int) -> str | None:
    if err == 0:
        return None
    return {
        Errors.COORDINATOR_NOT_AVAILABLE: "The coordinator is not available.",
        Errors.INVALID_REQUEST: "Unsupported coordinator key type.",
    }.get(err, f"error {err}")


# ---------------------------------------------------------------- membership
@api(11, 0, 9)
async def join_group(ctx: RequestContext, req) -> JoinGroupResponse:
    R = JoinGroupResponse
    v = ctx.api_version
    c = _coordinator(ctx)
    instance = req.group_instance_id if v >= 5 else None
    result = await c.join_group(
        req.group_id,
        req.member_id,
        instance,
        require_known_member_id=v >= 4 and instance is None,
        support_skip_assignment=v >= 9,
        client_id=ctx.client_id or "",
        client_host=_client_host(ctx),
        rebalance_timeout_ms=req.session_timeout_ms if v == 0 else req.rebalance_timeout_ms,
        session_timeout_ms=req.session_timeout_ms,
        protocol_type=req.protocol_type,
        protocols=[(p.name, p.metadata) for p in req.protocols],
        reason=req.reason if v >= 8 else None,
    )
    resp = _join_response(v, result.error, result.member_id)
    if result.error == 0 or result.generation_id >= 0:
        resp.generation_id = result.generation_id
        resp.protocol_type = result.protocol_type
        resp.protocol_name = result.protocol_name if v >= 7 else (result.protocol_name or "")
        resp.leader = result.leader_id
        resp.skip_assignment = result.skip_assignment
        resp.members = [
            R.JoinGroupResponseMember(member_id=mid, group_instance_id=iid, metadata=meta)
            for mid, iid, meta in result.members
        ]
    return resp


def _join_response(v: int, error: int, member_id: str) -> JoinGroupResponse:
    return JoinGroupResponse(
        error_code=error, generation_id=-1, protocol_type=None, protocol_name=None if v >= 7 else "", leader="",
        member_id=member_id, members=[],
    )


@api(14, 0, 5)
async def sync_group(ctx: RequestContext, req) -> SyncGroupResponse:
    R = SyncGroupResponse
    v = ctx.api_version
    c = _coordinator(ctx)
    if v >= 5 and (req.protocol_type is None or req.protocol_name is None):
        return R(error_code=Errors.INCONSISTENT_GROUP_PROTOCOL, assignment=b"")
    result = await c.sync_group(
        req.group_id,
        req.generation_id,
        req.member_id,
        req.protocol_type if v >= 5 else None,
        req.protocol_name if v >= 5 else None,
        req.group_instance_id if v >= 3 else None,
        {a.member_id: bytes(a.assignment) for a in req.assignments},
    )
    return R(error_code=result.error, protocol_type=result.protocol_type, protocol_name=result.protocol_name,
             assignment=result.assignment or b"")


@api(12, 0, 4)
async def heartbeat(ctx: RequestContext, req) -> HeartbeatResponse:
    c = _coordinator(ctx)
    instance = req.group_instance_id if ctx.api_version >= 3 else None
    if ctx.api_version < 4 or not (req.positions or req.interested_partitions):
        return HeartbeatResponse(error_code=c.heartbeat(req.group_id, req.member_id, instance, req.generation_id))
    # KIP-253 (OrderedConsumer): positions travel in tagged fields
    # a report of a partition no longer in our image is of one deleted once drained: kept, it
    # would pass for the position of a partition a later growth re-creates under that index
    image = ctx.services.replicas.image
    ex = PositionExchange(
        reported=[((t.topic, p.partition), p.offset) for t in req.positions for p in t.partitions
                  if image.partition(t.topic, p.partition) is not None],
        interested={(t.topic, p) for t in req.interested_partitions for p in t.partitions},
    )
    err = c.heartbeat(req.group_id, req.member_id, instance, req.generation_id, ex)
    R = HeartbeatResponse
    positions: dict[str, list] = {}
    for (topic, p), offset in sorted(ex.answer.items()):
        positions.setdefault(topic, []).append(R.HeartbeatPosition(partition=p, offset=offset))
    wanted: dict[str, list[int]] = {}
    for topic, p in sorted(ex.wanted):
        wanted.setdefault(topic, []).append(p)
    return R(
        error_code=err,
        positions=[R.HeartbeatPositionTopic(topic=t, partitions=ps) for t, ps in positions.items()],
        wanted_partitions=[R.HeartbeatWantedTopic(topic=t, partitions=ps) for t, ps in wanted.items()],
    )


@api(13, 0, 5)
async def leave_group(ctx: RequestContext, req) -> LeaveGroupResponse:
    R = LeaveGroupResponse
    v = ctx.api_version
    c = _coordinator(ctx)
    members: list[tuple[str, str | None, str | None]]  # (member id, instance id, reason)
    if v < 3:
        members = [(req.member_id, None, None)]
    else:
        members = [(m.member_id, m.group_instance_id, m.reason if v >= 5 else None) for m in req.members]
    err, errors = c.leave_group(req.group_id, members)
    if v < 3:
        return R(error_code=err or (errors[0] if errors else 0))
    if err:
        return R(error_code=err, members=[])
    return R(error_code=0, members=[
        R.MemberResponse(member_id=mid, group_instance_id=iid, error_code=e) for (mid, iid, _), e in zip(members, errors)
    ])


# ---------------------------------------------------------------- offsets
def _requested_offsets(
    ctx: RequestContext, topics: list, with_epochs: bool, retention_ms: int | None = None,
    commit_ts: Callable[[Any, int], int] = lambda p, now: now,
) -> tuple[dict[tuple[str, int], OffsetAndMetadata], dict[tuple[str, int], int]]:
    """The offsets an OffsetCommit/TxnOffsetCommit asks for, and UNKNOWN_TOPIC_OR_PARTITION for
    partitions the metadata does not have."""
    image = ctx.services.metadata.image
    now = wall_clock_ms()
    offsets: dict[tuple[str, int], OffsetAndMetadata] = {}
    errors: dict[tuple[str, int], int] = {}
    for t in topics:
        topic = image.topic(t.name)
        for p in t.partitions:
            tp = (t.name, p.partition_index)
            if topic is None or p.partition_index not in topic.partitions:
                errors[tp] = Errors.UNKNOWN_TOPIC_OR_PARTITION
                continue
            offsets[tp] = OffsetAndMetadata(
                offset=p.committed_offset,
                leader_epoch=p.committed_leader_epoch if with_epochs else -1,
                metadata=p.committed_metadata or "",
                commit_timestamp=commit_ts(p, now),
                expire_timestamp=None if retention_ms is None else now + retention_ms,
            )
    return offsets, errors


def _commit_response(R: Any, topic_cls: Any, partition_cls: Any, topics: list, errors: dict) -> Any:
    return R(topics=[
        topic_cls(name=t.name, partitions=[
            partition_cls(partition_index=p.partition_index, error_code=errors.get((t.name, p.partition_index), 0))
            for p in t.partitions
        ])
        for t in topics
    ])


@api(8, 0, 9)
async def offset_commit(ctx: RequestContext, req) -> OffsetCommitResponse:
    R = OffsetCommitResponse
    v = ctx.api_version
    retention = req.retention_time_ms if 2 <= v <= 4 else -1
    offsets, errors = _requested_offsets(
        ctx, req.topics, with_epochs=v >= 6, retention_ms=retention if retention != -1 else None,
        commit_ts=lambda p, now: p.commit_timestamp if v == 1 and p.commit_timestamp != -1 else now)
    if offsets:
        errors.update(await _coordinator(ctx).commit_offsets(
            req.group_id,
            req.member_id if v >= 1 else "",
            req.group_instance_id if v >= 7 else None,
            req.generation_id_or_member_epoch if v >= 1 else -1,
            offsets,
            v,
        ))
    return _commit_response(R, R.OffsetCommitResponseTopic, R.OffsetCommitResponsePartition, req.topics, errors)


@api(28, 0, 4)
async def txn_offset_commit(ctx: RequestContext, req) -> TxnOffsetCommitResponse:
    """v4 adds only TRANSACTION_ABORTABLE (which we never answer); v5 is KIP-890 part 2 (not served)."""
    R = TxnOffsetCommitResponse
    v = ctx.api_version
    offsets, errors = _requested_offsets(ctx, req.topics, with_epochs=v >= 2)
    if offsets:
        errors.update(await _coordinator(ctx).txn_commit_offsets(
            req.group_id, req.producer_id, req.producer_epoch,
            req.member_id if v >= 3 else "",
            req.group_instance_id if v >= 3 else None,
            req.generation_id if v >= 3 else -1,
            offsets,
        ))
    return _commit_response(R, R.TxnOffsetCommitResponseTopic, R.TxnOffsetCommitResponsePartition, req.topics, errors)


def _by_topic(rows: Iterable[tuple[tuple[str, int], Any]]) -> dict[str, list]:
    out: dict[str, list] = {}
    for (topic, partition), value in rows:
        out.setdefault(topic, []).append((partition, value))
    return out


@api(9, 0, 9)
async def offset_fetch(ctx: RequestContext, req) -> OffsetFetchResponse:
    R = OffsetFetchResponse
    v = ctx.api_version
    c = _coordinator(ctx)

    def fetch(group_id: str, topics, member_id: str | None = None, member_epoch: int = -1) -> tuple[int, list]:
        parts = None if topics is None else [(t.name, p) for t in topics for p in t.partition_indexes]
        err, rows = c.fetch_offsets(group_id, parts, member_id, member_epoch)
        if err and v < 2 and parts is not None:
            return err, [(tp, (None, err)) for tp in parts]  # v0-1 have no group-level error
        unstable = c.unstable_partitions(group_id) if v >= 7 and req.require_stable else set()
        return err, [(tp, (None, Errors.UNSTABLE_OFFSET_COMMIT) if tp in unstable else (om, 0)) for tp, om in rows]

    def partition(cls, index: int, value) -> Any:
        om, err = value
        if om is None:
            return cls(partition_index=index, committed_offset=-1, committed_leader_epoch=-1, metadata="",
                       error_code=err)
        return cls(partition_index=index, committed_offset=om.offset, committed_leader_epoch=om.leader_epoch,
                   metadata=om.metadata, error_code=err)

    if v < 8:
        err, rows = fetch(req.group_id, req.topics)
        topics = [
            R.OffsetFetchResponseTopic(name=name, partitions=[partition(R.OffsetFetchResponsePartition, i, val)
                                                              for i, val in parts])
            for name, parts in _by_topic(rows).items()
        ]
        return R(topics=topics, error_code=err if v >= 2 else 0)
    groups = []
    for g in req.groups:
        err, rows = fetch(g.group_id, g.topics, g.member_id if v >= 9 else None, g.member_epoch if v >= 9 else -1)
        groups.append(R.OffsetFetchResponseGroup(group_id=g.group_id, error_code=err, topics=[] if err else [
            R.OffsetFetchResponseTopics(name=name, partitions=[partition(R.OffsetFetchResponsePartitions, i, val)
                                                               for i, val in parts])
            for name, parts in _by_topic(rows).items()
        ]))
    return R(groups=groups)


@api(47, 0, 0)
async def offset_delete(ctx: RequestContext, req) -> OffsetDeleteResponse:
    R = OffsetDeleteResponse
    c = _coordinator(ctx)
    image = ctx.services.metadata.image
    errors: dict[tuple[str, int], int] = {}
    known = []
    for t in req.topics:
        topic = image.topic(t.name)
        for p in t.partitions:
            tp = (t.name, p.partition_index)
            if topic is None or p.partition_index not in topic.partitions:
                errors[tp] = Errors.UNKNOWN_TOPIC_OR_PARTITION
            else:
                known.append(tp)
    err, result = c.delete_offsets(req.group_id, known)
    if err:
        return R(error_code=err, topics=[])
    errors.update(result)
    return R(error_code=0, topics=[
        R.OffsetDeleteResponseTopic(name=name, partitions=[
            R.OffsetDeleteResponsePartition(partition_index=i, error_code=e) for i, e in parts
        ])
        for name, parts in _by_topic(errors.items()).items()
    ])


# ---------------------------------------------------------------- admin
@api(16, 0, 5)
async def list_groups(ctx: RequestContext, req) -> ListGroupsResponse:
    R = ListGroupsResponse
    v = ctx.api_version
    c = _coordinator(ctx)
    states = {x.lower() for x in (req.states_filter if v >= 4 else ())}
    types = {x.lower() for x in (req.types_filter if v >= 5 else ())}
    err, groups = c.list_groups(states, types)
    listed = [(g.group_id, _protocol_type(g), g.state_name, g.type) for g in groups]
    if c.active:  # share groups (KIP-932) are kept beside the others, by their own manager
        listed += [(g.group_id, g.type, g.state_name, g.type) for g in ctx.services.share_groups.groups()
                   if (not types or g.type in types) and (not states or g.state_name.lower() in states)]
    return R(error_code=err, groups=[
        R.ListedGroup(group_id=gid, protocol_type=protocol, group_state=state, group_type=kind)
        for gid, protocol, state, kind in listed
    ])


def _protocol_type(g: Group) -> str:
    """A classic group's protocol type is its members'; a KIP-848 consumer group's is "consumer"."""
    if isinstance(g, ClassicGroup):
        return g.protocol_type or ""
    return getattr(g, "protocol_type", "") or ""


@api(15, 0, 6)
async def describe_groups(ctx: RequestContext, req) -> DescribeGroupsResponse:
    R = DescribeGroupsResponse
    v = ctx.api_version
    c = _coordinator(ctx)
    ops = GROUP_OPERATIONS if v >= 3 and req.include_authorized_operations else NO_AUTHORIZED_OPERATIONS
    out = []
    for gid in req.groups:
        d = R.DescribedGroup(error_code=0, error_message=None, group_id=gid, group_state="", protocol_type="",
                             protocol_data="", members=[], authorized_operations=ops)
        out.append(d)
        err, summary = c.describe_group(gid)
        if err:
            d.error_code = err
            continue
        if summary is None:
            d.group_state = "Dead"
            if v >= 6:
                d.error_code = Errors.GROUP_ID_NOT_FOUND
                d.error_message = f"Group {gid} not found."
            continue
        d.group_state = summary.state
        d.protocol_type = summary.protocol_type
        d.protocol_data = summary.protocol
        d.members = [
            R.DescribedGroupMember(
                member_id=m.member_id,
                group_instance_id=m.group_instance_id,
                client_id=m.client_id,
                client_host=m.client_host,
                member_metadata=m.metadata(summary.protocol) if summary.with_metadata else b"",
                member_assignment=m.assignment if summary.with_metadata else b"",
            )
            for m in summary.members
        ]
    return R(groups=out)


@api(42, 0, 2)
async def delete_groups(ctx: RequestContext, req) -> DeleteGroupsResponse:
    R = DeleteGroupsResponse
    c = _coordinator(ctx)
    ids = list(dict.fromkeys(req.groups_names))
    shares = [g for g in ids if ctx.services.share_groups.is_share_group(g)]  # KIP-932's share groups
    errors = c.delete_groups([g for g in ids if g not in shares])
    if shares:
        errors.update(await share_groups_deleted(ctx, shares))
    return R(results=[R.DeletableGroupResult(group_id=g, error_code=errors[g]) for g in ids])


# ---------------------------------------------------------------- KIP-848 consumer groups
def _assignment_by_id(topics: list | None) -> Assignment | None:
    if topics is None:
        return None
    out: dict = {}
    for t in topics:
        out[t.topic_id] = out.get(t.topic_id, frozenset()) | frozenset(t.partitions)
    return out


@api(68, 0, 1)
async def consumer_group_heartbeat(ctx: RequestContext, req) -> ConsumerGroupHeartbeatResponse:
    R = ConsumerGroupHeartbeatResponse
    v = ctx.api_version
    result = await _coordinator(ctx).consumer_group_heartbeat(HeartbeatRequest(
        group_id=req.group_id, member_id=req.member_id, member_epoch=req.member_epoch, instance_id=req.instance_id,
        rack_id=req.rack_id, rebalance_timeout_ms=req.rebalance_timeout_ms,
        subscribed_topic_names=req.subscribed_topic_names,
        subscribed_topic_regex=req.subscribed_topic_regex if v >= 1 else None,
        server_assignor=req.server_assignor, owned=_assignment_by_id(req.topic_partitions),
        client_id=ctx.client_id or "", client_host=_client_host(ctx), api_version=v,
    ))
    assignment = None
    if result.assignment is not None:
        assignment = R.Assignment(topic_partitions=[
            R.TopicPartitions(topic_id=tid, partitions=sorted(ps)) for tid, ps in sorted(result.assignment.items())
        ])
    return R(error_code=result.error, error_message=result.message, member_id=result.member_id,
             member_epoch=result.member_epoch, heartbeat_interval_ms=result.heartbeat_interval_ms,
             assignment=assignment)


@api(69, 0, 1)
async def consumer_group_describe(ctx: RequestContext, req) -> ConsumerGroupDescribeResponse:
    R = ConsumerGroupDescribeResponse
    c = _coordinator(ctx)
    image = ctx.services.metadata.image
    ops = GROUP_OPERATIONS if req.include_authorized_operations else NO_AUTHORIZED_OPERATIONS

    def assignment(a: Assignment) -> Any:
        out = []
        for tid, ps in sorted(a.items()):
            t = image.topics.get(tid)
            if t is not None and ps:
                out.append(R.TopicPartitions(topic_id=tid, topic_name=t.name, partitions=sorted(ps)))
        return R.Assignment(topic_partitions=out)

    groups = []
    for gid in req.group_ids:
        err, message, g = c.consumer_group_describe(gid)
        d = R.DescribedGroup(error_code=err, error_message=message, group_id=gid, group_state="", group_epoch=0,
                             assignment_epoch=0, assignor_name="", members=[], authorized_operations=ops)
        groups.append(d)
        if g is None:
            if not err:
                d.group_state = "Dead"
            continue
        d.group_state = g.state_name
        d.group_epoch, d.assignment_epoch = g.group_epoch, g.assignment_epoch
        d.assignor_name = g.preferred_assignor(c.config.consumer_assignors[0])
        d.members = [
            R.Member(member_id=m.member_id, instance_id=m.instance_id, rack_id=m.rack_id, member_epoch=m.member_epoch,
                     client_id=m.client_id, client_host=m.client_host,
                     subscribed_topic_names=list(m.subscribed_topic_names),
                     subscribed_topic_regex=m.subscribed_topic_regex, assignment=assignment(m.assigned),
                     target_assignment=assignment(g.targets.get(m.member_id, {})),
                     member_type=0 if m.classic_protocols is not None else 1)
            for m in g.members.values()
        ]
    return R(groups=groups)
