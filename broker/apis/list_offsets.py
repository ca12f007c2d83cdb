"""ListOffsets: earliest, latest (HW), max timestamp, and first offset at or after a time."""

from __future__ import annotations

from broker.apis import RequestContext, api
from broker.apis.leadership import DEBUG_REPLICA, leader_or_error
from protocol.errors import Errors
from protocol.generated.list_offsets import ListOffsetsResponse

R = ListOffsetsResponse
LATEST, EARLIEST, MAX_TIMESTAMP, EARLIEST_LOCAL, LATEST_TIERED = -1, -2, -3, -4, -5


@api(2, 0, 10)
async def list_offsets(ctx: RequestContext, req) -> ListOffsetsResponse:
    b = ctx.broker
    topics = []
    for t in req.topics:
        tr = R.ListOffsetsTopicResponse(name=t.name)
        topics.append(tr)
        for lp in t.partitions:
            pr = R.ListOffsetsPartitionResponse(partition_index=lp.partition_index, timestamp=-1, offset=-1)
            tr.partitions.append(pr)
            p, pr.error_code = leader_or_error(b, t.name, lp.partition_index, allow_follower=req.replica_id == DEBUG_REPLICA,
                                               current_leader_epoch=lp.current_leader_epoch)
            if p is None:
                continue
            lg = p.log
            ts = lp.timestamp
            if ts in (EARLIEST, EARLIEST_LOCAL):
                pr.offset = lg.log_start_offset
            elif ts == LATEST:
                pr.offset = p.high_watermark  # the last stable offset arrives with transactions
            elif ts == LATEST_TIERED:
                pr.offset = -1
            elif ts == MAX_TIMESTAMP:
                pr.timestamp, pr.offset = lg.max_timestamp()
            elif ts < 0:
                pr.error_code = Errors.INVALID_REQUEST
                continue
            else:
                found = lg.offset_for_timestamp(ts)
                if found is not None and found[0] < p.high_watermark:
                    pr.offset, pr.timestamp = found
            if pr.offset >= 0:
                pr.leader_epoch = p.leader_epoch
            if ctx.api_version == 0:
                pr.old_style_offsets = [pr.offset] if pr.offset >= 0 else []
    return R(topics=topics)
