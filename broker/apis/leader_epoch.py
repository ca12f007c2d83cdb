"""OffsetForLeaderEpoch: the end offset of a leader epoch in this leader's log. Followers and
KIP-320 consumers (librdkafka validates its position after a leader change) use it to find
where their log and the leader's diverge."""

from __future__ import annotations

from broker.apis import RequestContext, api
from protocol.errors import Errors
from protocol.generated.offset_for_leader_epoch import OffsetForLeaderEpochResponse

R = OffsetForLeaderEpochResponse
CONSUMER = -1
DEBUG = -2


@api(23, 0, 4)
async def offset_for_leader_epoch(ctx: RequestContext, req) -> OffsetForLeaderEpochResponse:
    b = ctx.broker
    image = b.metadata.image
    topics = []
    for t in req.topics:
        tr = R.OffsetForLeaderTopicResult(topic=t.topic)
        topics.append(tr)
        info = image.topic(t.topic)
        for op in t.partitions:
            e = R.EpochEndOffset(partition=op.partition, leader_epoch=-1, end_offset=-1)
            tr.partitions.append(e)
            p = b.replicas.get(t.topic, op.partition)
            if p is None or (req.replica_id != DEBUG and not p.is_leader):
                known = info is not None and op.partition in info.partitions
                e.error_code = Errors.NOT_LEADER_OR_FOLLOWER if known else Errors.UNKNOWN_TOPIC_OR_PARTITION
                continue
            if op.current_leader_epoch >= 0 and op.current_leader_epoch != p.leader_epoch:
                e.error_code = (Errors.FENCED_LEADER_EPOCH if op.current_leader_epoch < p.leader_epoch
                                else Errors.UNKNOWN_LEADER_EPOCH)
                continue
            e.leader_epoch, e.end_offset = p.log.leader_epoch_cache.end_offset_for(op.leader_epoch, p.log.log_end_offset)
            if req.replica_id == CONSUMER and e.end_offset > p.high_watermark:
                e.end_offset = p.high_watermark  # consumers never see past the high watermark
    return R(topics=topics)
