"""Share groups (KIP-932): ShareGroupHeartbeat and ShareGroupDescribe go to the group
coordinator (broker/coordinator/group/share.py); ShareFetch and ShareAcknowledge to the
share-partitions this broker keeps as partition leader (broker/share/). Advertised only with
group.share.enable (on by default, as in Kafka 4.2)."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Any

import structlog

from broker.apis.groups import NO_AUTHORIZED_OPERATIONS, _client_host
from broker.apis.registry import RequestContext, api
from broker.coordinator.group.classic import GROUP_OPERATIONS
from broker.coordinator.group.share import ShareHeartbeat
from broker.share.sessions import FINAL_EPOCH, INITIAL_EPOCH
from node.waits import wait_within
from protocol.errors import Errors
from protocol.generated.share_acknowledge import ShareAcknowledgeResponse
from protocol.generated.share_fetch import ShareFetchResponse
from protocol.generated.share_group_describe import ShareGroupDescribeResponse
from protocol.generated.share_group_heartbeat import ShareGroupHeartbeatResponse

log = structlog.get_logger(__name__)

DEFAULT_MAX_RECORDS = 500
REMOTE_RECHECK_S = 0.25


def _enabled(config: Any) -> bool:
    return config.share.enable


def _served(ctx: RequestContext) -> bool:
    # a handler registered but switched off is not advertised; a client asking anyway is refused
    return ctx.services.config.share.enable


# ---------------------------------------------------------------- the coordinator's APIs
@api(76, 1, 1, enabled=_enabled)
async def share_group_heartbeat(ctx: RequestContext, req) -> ShareGroupHeartbeatResponse:
    R = ShareGroupHeartbeatResponse
    if not _served(ctx):
        return R(error_code=Errors.UNSUPPORTED_VERSION)
    result = ctx.services.share_groups.heartbeat(ShareHeartbeat(
        group_id=req.group_id, member_id=req.member_id, member_epoch=req.member_epoch, rack_id=req.rack_id,
        subscribed_topic_names=req.subscribed_topic_names, client_id=ctx.client_id or "",
        client_host=_client_host(ctx)))
    assignment = None
    if result.assignment is not None:
        assignment = R.Assignment(topic_partitions=[
            R.TopicPartitions(topic_id=tid, partitions=sorted(ps)) for tid, ps in sorted(result.assignment.items())])
    return R(error_code=result.error, error_message=result.message, member_id=result.member_id,
             member_epoch=result.member_epoch, heartbeat_interval_ms=result.heartbeat_interval_ms,
             assignment=assignment)


@api(77, 1, 1, enabled=_enabled)
async def share_group_describe(ctx: RequestContext, req) -> ShareGroupDescribeResponse:
    R = ShareGroupDescribeResponse
    manager = ctx.services.share_groups
    image = ctx.services.metadata.image
    ops = GROUP_OPERATIONS if req.include_authorized_operations else NO_AUTHORIZED_OPERATIONS

    def assignment(a) -> Any:
        out = []
        for tid, ps in sorted(a.items()):
            t = image.topics.get(tid)
            if t is not None and ps:
                out.append(R.TopicPartitions(topic_id=tid, topic_name=t.name, partitions=sorted(ps)))
        return R.Assignment(topic_partitions=out)

    groups = []
    for gid in req.group_ids:
        if not _served(ctx):
            err, message, g = Errors.UNSUPPORTED_VERSION, None, None
        else:
            err, message, g = manager.describe(gid)
        d = R.DescribedGroup(error_code=err, error_message=message, group_id=gid, group_state="", group_epoch=0,
                             assignment_epoch=0, assignor_name="", members=[], authorized_operations=ops)
        groups.append(d)
        if g is None:
            continue
        d.group_state, d.group_epoch, d.assignment_epoch = g.state_name, g.group_epoch, g.assignment_epoch
        d.assignor_name = manager.assignor_name
        d.members = [
            R.Member(member_id=m.member_id, rack_id=m.rack_id, member_epoch=m.member_epoch, client_id=m.client_id,
                     client_host=m.client_host, subscribed_topic_names=list(m.subscribed_topic_names),
                     assignment=assignment(m.assigned))
            for m in g.members.values()
        ]
    return R(groups=groups)


# ---------------------------------------------------------------- the partition leader's APIs
def _acks(topics) -> OrderedDict:
    """(topic id, partition) -> [(first, last, types)] of a request's acknowledgement batches."""
    out: OrderedDict = OrderedDict()
    for t in topics or ():
        for p in t.partitions or ():
            out.setdefault((t.topic_id, p.partition_index), []).extend(
                (b.first_offset, b.last_offset, list(b.acknowledge_types)) for b in p.acknowledgement_batches or ())
    return out


def _leader(ctx: RequestContext, tid, index: int) -> tuple[int, int]:
    info = ctx.services.metadata.image.topics.get(tid)
    pi = info.partitions.get(index) if info is not None else None
    if pi is not None and pi.diskless_coordinator >= 0:
        # a diskless partition's share session is served by whichever broker the member reached
        # (Metadata named it leader), so it is named here too: the member stays
        return ctx.services.config.node_id, pi.leader_epoch
    return (pi.leader, pi.leader_epoch) if pi is not None else (-1, -1)


async def _acknowledge(ctx: RequestContext, group_id: str, member_id: str, acks: dict,
                       renew: bool = False) -> dict:
    """(topic id, partition) -> error of applying its acknowledgements (`renew`: v2's RENEW type
    allowed, KIP-1222)."""
    share = ctx.services.share
    image = ctx.services.metadata.image
    out = {}
    for (tid, index), batches in acks.items():
        info = image.topics.get(tid)
        if info is None:
            out[(tid, index)] = Errors.UNKNOWN_TOPIC_ID
            continue
        out[(tid, index)] = err = await share.acknowledge(group_id, member_id, info.name, index, batches, renew)
        if err:
            log.info("share_acknowledge_refused", group=group_id, member=member_id, topic=info.name,
                     partition=index, error=err)
    return out


def _session(ctx: RequestContext, group_id: str, member_id: str, epoch: int, opens: bool):
    """(error, session) for a request with that share session epoch."""
    share = ctx.services.share
    if epoch == INITIAL_EPOCH:
        if not opens:
            return Errors.INVALID_SHARE_SESSION_EPOCH, None
        share.evict_idle_sessions()
        err, s, old = share.sessions.open(group_id, member_id)
        if old is not None:
            share.release_member(group_id, member_id, list(old.partitions))
        return err, s
    return share.sessions.advance(group_id, member_id, epoch)


def _refused(ctx: RequestContext, req: Any, R: Any) -> Any | None:
    """The answer of a ShareFetch or ShareAcknowledge refused before its session is looked at."""
    if not _served(ctx):
        return R(error_code=Errors.UNSUPPORTED_VERSION)
    if not req.group_id or not req.member_id:
        return R(error_code=Errors.INVALID_REQUEST, error_message="GroupId and MemberId must be set.")
    return None


@api(78, 1, 2, enabled=_enabled)
async def share_fetch(ctx: RequestContext, req) -> ShareFetchResponse:
    R = ShareFetchResponse
    if (refused := _refused(ctx, req, R)) is not None:
        return refused
    share = ctx.services.share
    group_id, member_id, epoch = req.group_id, req.member_id, req.share_session_epoch
    requested = [(t.topic_id, p.partition_index) for t in req.topics or () for p in t.partitions or ()]
    if epoch == FINAL_EPOCH and requested and any(
            not p.acknowledgement_batches for t in req.topics for p in t.partitions):
        return R(error_code=Errors.INVALID_REQUEST, error_message="The final ShareFetch may only acknowledge.")
    err, session = _session(ctx, group_id, member_id, epoch, opens=True)
    if err:
        log.info("share_fetch_refused", group=group_id, member=member_id, epoch=epoch, error=err)
        return R(error_code=err)
    assert session is not None
    lock_ms = share.lock_duration_ms(group_id)
    renew = ctx.api_version >= 2 and bool(req.is_renew_ack)
    acks = _acks(req.topics)
    # a diskless partition's acknowledgements for another broker's share-partition ride on the
    # acquisition forwarded there (one round trip, not two) when this request acquires
    riding = share.riding_acks(acks) if epoch != FINAL_EPOCH and not renew else {}
    ack_errors = await _acknowledge(ctx, group_id, member_id, acks, renew)
    if epoch == FINAL_EPOCH:
        share.sessions.close(session)
        share.release_member(group_id, member_id, list(session.partitions))
        return _fetch_response(ctx, lock_ms, ack_errors, {})
    if renew:  # a renewing ShareFetch only acknowledges (KIP-1222)
        return _fetch_response(ctx, lock_ms, ack_errors, {})
    if epoch == INITIAL_EPOCH:
        share.refresh_idle(group_id, requested)
    for key in requested:
        session.partitions.setdefault(key, None)
    for t in req.forgotten_topics_data or ():
        for index in t.partitions:
            session.partitions.pop((t.topic_id, index), None)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max(req.max_wait_ms, 0) / 1000
    max_records = req.max_records if req.max_records > 0 else DEFAULT_MAX_RECORDS
    while True:
        got, waits = await _acquire_all(ctx, group_id, member_id, list(session.partitions), max_records,
                                        req.max_bytes if req.max_bytes > 0 else 2**31 - 1, riding, ack_errors)
        if riding:  # no acquisition of theirs ran (not in the session, or the records limit came first)
            ack_errors.update(await _acknowledge(ctx, group_id, member_id, riding, renew))
            riding = {}
        if got or not waits or loop.time() >= deadline or ack_errors:
            return _fetch_response(ctx, lock_ms, ack_errors, got)
        fut = loop.create_future()
        remote = False
        for p, sp in waits:
            p.add_data_waiter(fut)
            if sp is not None:
                sp.add_waiter(fut)
            remote = remote or sp is None
        # records released on another broker's share-partition wake nothing here: ask again soon
        await wait_within(fut, min(deadline - loop.time(), REMOTE_RECHECK_S) if remote else deadline - loop.time(),
                          None)


async def _acquire_all(ctx: RequestContext, group_id: str, member_id: str, partitions: list, max_records: int,
                       max_bytes: int, riding: dict, ack_errors: dict) -> tuple[dict, list]:
    """(topic id, partition) -> (error, acquired) for the partitions that answer now, and the
    (partition, share-partition) pairs a long poll waits on (no share-partition: it is held by
    another broker, which wakes no wait here). The acknowledgements in `riding` go with their
    partition's acquisition (taken out, their errors put in `ack_errors`)."""
    share = ctx.services.share
    image = ctx.services.metadata.image
    got: dict = {}
    waits = []
    for tid, index in partitions:
        if max_records <= 0 or max_bytes <= 0:
            break
        info = image.topics.get(tid)
        if info is None:
            got[(tid, index)] = (Errors.UNKNOWN_TOPIC_ID, None)
            continue
        acks = riding.pop((tid, index), None)
        err, acquired, wait, ack_err = await share.fetch(ctx, group_id, member_id, info.name, index, max_records,
                                                         max_bytes, acks)
        if acks is not None:
            ack_errors[(tid, index)] = ack_err
            if ack_err:
                log.info("share_acknowledge_refused", group=group_id, member=member_id, topic=info.name,
                         partition=index, error=ack_err)
        if err:
            got[(tid, index)] = (err, None)
        elif acquired is not None and acquired.ranges:
            got[(tid, index)] = (0, acquired)
            max_records -= acquired.count
            max_bytes -= sum(len(b) for b in acquired.batches)
        elif wait is not None:
            waits.append(wait)
    return got, waits


def _fetch_response(ctx: RequestContext, lock_ms: int, ack_errors: dict, got: dict) -> ShareFetchResponse:
    R = ShareFetchResponse
    by_topic: OrderedDict = OrderedDict()
    for key in list(ack_errors) + [k for k in got if k not in ack_errors]:
        tid, index = key
        err, acquired = got.get(key, (0, None))
        leader_id, leader_epoch = _leader(ctx, tid, index)
        pd = R.PartitionData(partition_index=index, error_code=err, acknowledge_error_code=ack_errors.get(key, 0),
                             current_leader=R.LeaderIdAndEpoch(leader_id=leader_id, leader_epoch=leader_epoch),
                             records=b"")
        if acquired is not None:
            pd.records = b"".join(acquired.batches)
            pd.acquired_records = [R.AcquiredRecords(first_offset=f, last_offset=last, delivery_count=c)
                                   for f, last, c in acquired.ranges]
        t = by_topic.get(tid)
        if t is None:
            t = by_topic[tid] = R.ShareFetchableTopicResponse(topic_id=tid)
        t.partitions.append(pd)
    return R(acquisition_lock_timeout_ms=lock_ms, responses=list(by_topic.values()),
             node_endpoints=_endpoints(ctx, R, [pd.current_leader.leader_id for t in by_topic.values()
                                                for pd in t.partitions
                                                if pd.error_code == Errors.NOT_LEADER_OR_FOLLOWER]))


def _endpoints(ctx: RequestContext, R: Any, leaders: list[int]) -> list:
    """Where the leaders named in NOT_LEADER_OR_FOLLOWER answers listen (on the request's
    listener), so the client moves without a metadata round trip."""
    image = ctx.services.metadata.image
    out = []
    for b in sorted(set(leaders)):
        info = image.brokers.get(b)
        e = info.endpoint(ctx.listener) if info is not None else None
        if e is not None:
            out.append(R.NodeEndpoint(node_id=b, host=e.host, port=e.port, rack=info.rack if info else None))
    return out


@api(79, 1, 2, enabled=_enabled)
async def share_acknowledge(ctx: RequestContext, req) -> ShareAcknowledgeResponse:
    R = ShareAcknowledgeResponse
    if (refused := _refused(ctx, req, R)) is not None:
        return refused
    share = ctx.services.share
    group_id, member_id, epoch = req.group_id, req.member_id, req.share_session_epoch
    err, session = _session(ctx, group_id, member_id, epoch, opens=False)
    if err:
        log.info("share_acknowledge_refused", group=group_id, member=member_id, epoch=epoch, error=err)
        return R(error_code=err)
    assert session is not None
    errors = await _acknowledge(ctx, group_id, member_id, _acks(req.topics),
                                ctx.api_version >= 2 and bool(req.is_renew_ack))
    if epoch == FINAL_EPOCH:
        share.sessions.close(session)
        share.release_member(group_id, member_id, list(session.partitions))
    by_topic: OrderedDict = OrderedDict()
    for (tid, index), e in errors.items():
        leader_id, leader_epoch = _leader(ctx, tid, index)
        t = by_topic.get(tid)
        if t is None:
            t = by_topic[tid] = R.ShareAcknowledgeTopicResponse(topic_id=tid)
        t.partitions.append(R.PartitionData(partition_index=index, error_code=e, current_leader=R.LeaderIdAndEpoch(
            leader_id=leader_id, leader_epoch=leader_epoch)))
    return R(acquisition_lock_timeout_ms=share.lock_duration_ms(group_id), responses=list(by_topic.values()))
