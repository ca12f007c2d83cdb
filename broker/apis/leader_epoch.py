"""OffsetForLeaderEpoch: the end offset of a leader epoch in this leader's log. Followers and
KIP-320 consumers (librdkafka validates its position after a leader change) use it to find
where their log and the leader's diverge."""

from __future__ import annotations

from broker.apis.registry import RequestContext, api
from broker.partitions.router import DEBUG_REPLICA
from protocol.generated.offset_for_leader_epoch import OffsetForLeaderEpochResponse

R = OffsetForLeaderEpochResponse
CONSUMER = -1


@api(23, 0, 4)
async def offset_for_leader_epoch(ctx: RequestContext, req) -> OffsetForLeaderEpochResponse:
    s = ctx.services
    topics = []
    for t in req.topics:
        tr = R.OffsetForLeaderTopicResult(topic=t.topic)
        topics.append(tr)
        for op in t.partitions:
            e = R.EpochEndOffset(partition=op.partition, leader_epoch=-1, end_offset=-1)
            tr.partitions.append(e)
            p, e.error_code = s.partitions.serving(t.topic, op.partition, allow_follower=req.replica_id == DEBUG_REPLICA,
                                                  current_leader_epoch=op.current_leader_epoch)
            if p is None:
                continue
            e.error_code, e.leader_epoch, e.end_offset = await p.epoch_end_offset(
                op.leader_epoch, req.replica_id == CONSUMER, op.current_leader_epoch)
    return R(topics=topics)
