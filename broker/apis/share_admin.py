"""Share groups' admin APIs (KIP-932), answered by the group's coordinator: DescribeShareGroupOffsets
reads each share-partition's start offset from the share coordinator (broker/share/persister.py)."""

from __future__ import annotations

from uuid import UUID

from broker.apis.registry import RequestContext, api
from protocol.errors import Errors
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
        if g.topics is None:  # every topic the group's members subscribe to
            wanted = [(name, sorted(info.partitions)) for name in sorted(group.subscribed_topics())
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
