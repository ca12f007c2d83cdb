"""Share groups' admin APIs (KIP-932), answered by the group's coordinator: DescribeShareGroupOffsets
reads each share-partition's start offset from the share coordinator (broker/share/persister.py);
AlterShareGroupOffsets writes new ones for an empty group, under a new state epoch, so a partition
leader still holding the former state reads it again."""

from __future__ import annotations

from uuid import UUID

from broker.apis.registry import RequestContext, api
from broker.coordinator.share.records import ShareState
from protocol.errors import Errors
from protocol.generated.alter_share_group_offsets import AlterShareGroupOffsetsResponse
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
