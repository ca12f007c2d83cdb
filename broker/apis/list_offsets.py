"""ListOffsets: earliest, latest (HW; the last stable offset for read_committed), max timestamp,
and first offset at or after a time (below what the isolation level may read)."""

from __future__ import annotations

from broker.apis import RequestContext, api
from broker.apis.leadership import DEBUG_REPLICA, leader_or_error
from protocol.errors import Errors
from protocol.generated.list_offsets import ListOffsetsResponse

R = ListOffsetsResponse
LATEST, EARLIEST, MAX_TIMESTAMP, EARLIEST_LOCAL, LATEST_TIERED = -1, -2, -3, -4, -5
READ_COMMITTED = 1


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
            # What the asker may read: v0/v1 have no isolation level (read_uncommitted).
            readable = lg.last_stable_offset if req.isolation_level == READ_COMMITTED else p.high_watermark
            if ts in (EARLIEST, EARLIEST_LOCAL):
                pr.offset = lg.log_start_offset
            elif ts == LATEST:
                pr.offset = readable
            elif ts == LATEST_TIERED:
                pr.offset = -1
            elif ts == MAX_TIMESTAMP:
                pr.timestamp, pr.offset = lg.max_timestamp()
            elif ts < 0:
                pr.error_code = Errors.INVALID_REQUEST
                continue
            else:
                found = lg.offset_for_timestamp(ts)
                if found is not None and found[0] < readable:
                    pr.offset, pr.timestamp = found
            if pr.offset >= 0:
                pr.leader_epoch = p.leader_epoch
            if ctx.api_version == 0:
                pr.old_style_offsets = [pr.offset] if pr.offset >= 0 else []
    return R(topics=topics)
