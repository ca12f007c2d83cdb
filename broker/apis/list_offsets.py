"""ListOffsets: earliest, latest (HW; the last stable offset for read_committed), max timestamp,
and first offset at or after a time (below what the isolation level may read), answered by the
one partition interface (broker/partitions/).

Earliest, max timestamp and by-timestamp look into the partition's inactive chunks too: the leader asks a
replica of the right chunk (broker/replication/chunk_reads.py) with a ListOffsets whose
replica_id is its own broker id, which a broker answers from the chunk replicas it holds (the
router's HeldChunks view, broker/partitions/chunk_views.py)."""

from __future__ import annotations

import asyncio

from broker.apis.registry import RequestContext, api
from protocol.generated.list_offsets import ListOffsetsResponse

R = ListOffsetsResponse
READ_COMMITTED = 1


@api(2, 0, 10)
async def list_offsets(ctx: RequestContext, req) -> ListOffsetsResponse:
    s = ctx.services
    topics = []
    asks = []
    for t in req.topics:
        tr = R.ListOffsetsTopicResponse(name=t.name)
        topics.append(tr)
        for lp in t.partitions:
            pr = R.ListOffsetsPartitionResponse(partition_index=lp.partition_index, timestamp=-1, offset=-1)
            tr.partitions.append(pr)
            # replica_id >= 0: a broker asking about the inactive chunks we hold
            p, pr.error_code = s.partitions.for_offsets(t.name, lp.partition_index, replica_id=req.replica_id,
                                                        current_leader_epoch=lp.current_leader_epoch)
            if p is not None:
                # What the asker may read: v0/v1 have no isolation level (read_uncommitted).
                asks.append((pr, p.offset_for(lp.timestamp, req.isolation_level == READ_COMMITTED)))
    # the partitions ask at once (diskless ones: one DisklessListOffsets per coordinator broker)
    for (pr, _), ans in zip(asks, await asyncio.gather(*(ask for _, ask in asks))):
        pr.error_code = ans.error_code
        if ans.error_code:
            continue
        pr.offset, pr.timestamp = ans.offset, ans.timestamp
        if pr.offset >= 0:
            pr.leader_epoch = ans.leader_epoch
        if ctx.api_version == 0:
            pr.old_style_offsets = [pr.offset] if pr.offset >= 0 else []
    return R(topics=topics)
