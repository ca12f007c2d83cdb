"""ListOffsets: earliest, latest (HW; the last stable offset for read_committed), max timestamp,
and first offset at or after a time (below what the isolation level may read).

Earliest, max timestamp and by-timestamp look into the partition's inactive chunks too: the leader asks a
replica of the right chunk (broker/replication/chunk_reads.py) with a ListOffsets whose
replica_id is its own broker id, which a broker answers from the chunk replicas it holds."""

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
            if req.replica_id >= 0:  # a broker asking about the inactive chunks we hold
                found = b.chunk_reads.local_answer(t.name, lp.partition_index, lp.timestamp)
                if found is None:
                    pr.error_code = Errors.NOT_LEADER_OR_FOLLOWER
                else:
                    pr.offset, pr.timestamp = found
                continue
            p, pr.error_code = leader_or_error(b, t.name, lp.partition_index, allow_follower=req.replica_id == DEBUG_REPLICA,
                                               current_leader_epoch=lp.current_leader_epoch)
            if p is None:
                continue
            lg = p.log
            ts = lp.timestamp
            # What the asker may read: v0/v1 have no isolation level (read_uncommitted).
            readable = lg.last_stable_offset if req.isolation_level == READ_COMMITTED else p.high_watermark
            chunked = bool(b.chunk_reads.chunked(t.name, lp.partition_index))
            if ts == EARLIEST and chunked:
                found = await b.chunk_reads.earliest(t.name, lp.partition_index)
                pr.offset = lg.log_start_offset if found is None else found
            elif ts in (EARLIEST, EARLIEST_LOCAL):
                pr.offset = lg.log_start_offset
            elif ts == LATEST:
                pr.offset = readable
            elif ts == LATEST_TIERED:
                pr.offset = -1
            elif ts == MAX_TIMESTAMP:
                pr.timestamp, pr.offset = lg.max_timestamp()
                found = await b.chunk_reads.max_timestamp(t.name, lp.partition_index) if chunked else None
                if found is not None and found[1] >= pr.timestamp:  # a tie goes to the older record
                    pr.offset, pr.timestamp = found
            elif ts < 0:
                pr.error_code = Errors.INVALID_REQUEST
                continue
            else:
                found = None
                if chunked:  # the inactive chunks come first (each skipped if all its records are older)
                    found = await b.chunk_reads.offset_for_timestamp(t.name, lp.partition_index, ts)
                if found is None:
                    found = lg.offset_for_timestamp(ts)
                if found is not None and found[0] < readable:
                    pr.offset, pr.timestamp = found
            if pr.offset >= 0:
                pr.leader_epoch = p.leader_epoch
            if ctx.api_version == 0:
                pr.old_style_offsets = [pr.offset] if pr.offset >= 0 else []
    return R(topics=topics)
