"""Share groups' admin APIs (KIP-932), answered by the group's coordinator: DescribeShareGroupOffsets
reads each share-partition's start offset from the share coordinator (broker/share/persister.py);
AlterShareGroupOffsets writes new ones for an empty group, under a new state epoch, so a partition
leader still holding the former state reads it again; DeleteShareGroupOffsets and DeleteGroups
(share_groups_deleted) delete an empty group's state."""

from __future__ import annotations

from uuid import UUID

from broker.apis.registry import RequestContext, api
from broker.coordinator.share.records import ShareState, delivery_complete_count
from protocol.errors import Errors
from protocol.generated.alter_share_group_offsets import AlterShareGroupOffsetsResponse
from protocol.generated.delete_share_group_offsets import DeleteShareGroupOffsetsResponse
from protocol.generated.describe_share_group_offsets import DescribeShareGroupOffsetsResponse


def _enabled(config) -> bool:  # noqa: ANN001 - the BrokerConfig
    return config.share.enable


@api(90, 0, 1, enabled=_enabled)
async def describe_share_group_offsets(ctx: RequestContext, req) -> DescribeShareGroupOffsetsResponse:
    R = DescribeShareGroupOffsetsResponse
    s = ctx.services
    image = s.metadata.image
    out = []
    for g in req.groups:
        err, message, group = s.share_groups.describe(g.group_id)
        rg = R.DescribeShareGroupOffsetsResponseGroup(group_id=g.group_id, error_code=err, error_message=message)
        out.append(rg)
        if err or group is None:
            continue
        if g.topics is None:  # every topic the group's members subscribed to
            wanted = [(name, sorted(info.partitions)) for name in sorted(group.seen_topics)
                      if (info := image.topic(name)) is not None]
        else:
            wanted = [(t.topic_name, list(t.partitions)) for t in g.topics]
        # v1's Lag (KIP-1226): from the start offset to the high watermark, less the records past
        # the start offset whose delivery is complete
        ends = await s.share_ends.high_watermarks(
            [(name, i) for name, indexes in wanted if image.topic(name) is not None for i in indexes]
        ) if ctx.api_version >= 1 else {}
        for name, indexes in wanted:
            info = image.topic(name)
            rt = R.DescribeShareGroupOffsetsResponseTopic(topic_name=name, topic_id=info.id if info else UUID(int=0))
            rg.topics.append(rt)
            for index in indexes:
                rp = R.DescribeShareGroupOffsetsResponsePartition(partition_index=index, start_offset=-1,
                                                                  leader_epoch=-1)
                rt.partitions.append(rp)
                if info is None or index not in info.partitions:
                    rp.error_code = Errors.UNKNOWN_TOPIC_OR_PARTITION
                    continue
                rp.error_code, state = await s.share.persister.read(g.group_id, info.id, index, -1)
                if state is not None:
                    rp.start_offset, rp.leader_epoch = state.start_offset, state.leader_epoch
                    end = ends.get((name, index))
                    if end is not None and state.start_offset >= 0:
                        rp.lag = max(0, end - state.start_offset - delivery_complete_count(state))
    return R(groups=out)


@api(91, 0, 0, enabled=_enabled)
async def alter_share_group_offsets(ctx: RequestContext, req) -> AlterShareGroupOffsetsResponse:
    R = AlterShareGroupOffsetsResponse
    s = ctx.services
    err, message, _ = s.share_groups.for_offsets_change(req.group_id)
    if err:
        return R(error_code=err, error_message=message)
    image = s.metadata.image
    persister = s.share.persister
    out = []
    for t in req.topics:
        info = image.topic(t.topic_name)
        rt = R.AlterShareGroupOffsetsResponseTopic(topic_name=t.topic_name, topic_id=info.id if info else UUID(int=0))
        out.append(rt)
        for p in t.partitions:
            rp = R.AlterShareGroupOffsetsResponsePartition(partition_index=p.partition_index)
            rt.partitions.append(rp)
            if info is None or p.partition_index not in info.partitions:
                rp.error_code = Errors.UNKNOWN_TOPIC_OR_PARTITION
                continue
            if p.start_offset < 0:
                rp.error_code = Errors.INVALID_REQUEST
                continue
            rp.error_code, current = await persister.read(req.group_id, info.id, p.partition_index, -1)
            if rp.error_code:
                continue
            state = ShareState(current.state_epoch + 1 if current is not None else 1,
                               current.leader_epoch if current is not None else -1, p.start_offset, [])
            rp.error_code = await persister.write(req.group_id, info.id, p.partition_index, state)
    return R(responses=out)


async def _delete_topic_state(ctx: RequestContext, group_id: str, topic_id: UUID, partitions) -> int:
    """Delete the share-partitions' state of one topic: the first error, or 0."""
    first = 0
    for index in partitions:
        err = await ctx.services.share.persister.delete(group_id, topic_id, index)
        first = first or err
    return first


@api(92, 0, 0, enabled=_enabled)
async def delete_share_group_offsets(ctx: RequestContext, req) -> DeleteShareGroupOffsetsResponse:
    R = DeleteShareGroupOffsetsResponse
    s = ctx.services
    err, message, group = s.share_groups.for_offsets_change(req.group_id)
    if err or group is None:
        return R(error_code=err, error_message=message)
    image = s.metadata.image
    out = []
    for t in req.topics:
        info = image.topic(t.topic_name)
        rt = R.DeleteShareGroupOffsetsResponseTopic(topic_name=t.topic_name, topic_id=info.id if info else UUID(int=0))
        out.append(rt)
        if info is None:
            rt.error_code = Errors.UNKNOWN_TOPIC_OR_PARTITION
            continue
        rt.error_code = await _delete_topic_state(ctx, req.group_id, info.id, sorted(info.partitions))
        if not rt.error_code:
            group.seen_topics.discard(t.topic_name)
    return R(responses=out)


async def share_groups_deleted(ctx: RequestContext, group_ids: list[str]) -> dict[str, int]:
    """DeleteGroups of share groups: each must be empty; its state goes, then the group."""
    s = ctx.services
    image = s.metadata.image
    out = {}
    for gid in group_ids:
        err, _, group = s.share_groups.for_offsets_change(gid)
        if not err and group is not None:
            for name in sorted(group.seen_topics):
                info = image.topic(name)
                if info is not None:
                    err = err or await _delete_topic_state(ctx, gid, info.id, sorted(info.partitions))
            if not err:
                s.share_groups.remove(gid)
        out[gid] = err
    return out
