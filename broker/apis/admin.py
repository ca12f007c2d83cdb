"""Topic administration. Mutations are forwarded to the controller (metadata flows one way: the
controller writes records, every broker's image follows); the answer goes back once this
broker's image includes the change. DeleteRecords acts on the leader's log."""

from __future__ import annotations

from broker.apis import RequestContext, api
from broker.apis.leadership import leader_or_error
from broker.storage.errors import StorageError
from node.client import ClientError
from protocol.errors import Errors
from protocol.generated.alter_chunk_assignments import AlterChunkAssignmentsRequest
from protocol.generated.delete_records import DeleteRecordsResponse


@api(19, 2, 7)
async def create_topics(ctx: RequestContext, req):
    return await ctx.broker.forward(req, ctx.api_version)


@api(20, 1, 6)
async def delete_topics(ctx: RequestContext, req):
    return await ctx.broker.forward(req, ctx.api_version)


@api(37, 0, 3)
async def create_partitions(ctx: RequestContext, req):
    return await ctx.broker.forward(req, ctx.api_version)


@api(21, 0, 2)
async def delete_records(ctx: RequestContext, req) -> DeleteRecordsResponse:
    """On the active chunk's leader. Below the active chunk, whole inactive chunks the offset
    passes are dropped: every replica leaves them (AlterChunkAssignments with LeavingBrokerId,
    the report a replica sends when retention emptied it), and the controller removes a chunk
    with no replicas left. A chunk the offset cuts through gets it as its log start offset
    (AlterChunkAssignments with LogStartOffset, kept in the metadata): reads below it answer
    OFFSET_OUT_OF_RANGE at once, and each replica deletes what lies below it."""
    R = DeleteRecordsResponse
    b = ctx.broker
    topics = []
    for t in req.topics:
        tr = R.DeleteRecordsTopicResult(name=t.name)
        topics.append(tr)
        for dp in t.partitions:
            pr = R.DeleteRecordsPartitionResult(partition_index=dp.partition_index, low_watermark=-1)
            tr.partitions.append(pr)
            p, pr.error_code = leader_or_error(b, t.name, dp.partition_index)
            if p is None:
                continue
            offset = p.high_watermark if dp.offset == -1 else dp.offset
            if offset < 0 or offset > p.high_watermark:
                pr.error_code = Errors.OFFSET_OUT_OF_RANGE
                continue
            topic = b.metadata.image.topic(t.name)
            chunks = topic.chunks.get(dp.partition_index, ()) if topic is not None else ()
            gone = [c for c in chunks if c.end_offset < offset]
            if gone:
                pr.error_code = await _drop_chunks(b, t.name, dp.partition_index, gone)
                if pr.error_code:
                    continue
            cut = [c for c in chunks if c.first_offset < offset <= c.end_offset]
            if cut:
                pr.error_code = await _cut_chunk(b, t.name, dp.partition_index, cut[0], offset)
                if pr.error_code:
                    continue
            try:
                low = p.log.delete_records_before(offset)
            except StorageError as e:
                pr.error_code = e.error_code
                continue
            pr.low_watermark = low if offset >= p.log.log_start_offset else offset
    return R(topics=topics)


async def _cut_chunk(b, topic: str, partition: int, chunk, offset: int) -> int:
    AC = AlterChunkAssignmentsRequest
    entry = AC.AlterChunkAssignment(topic_name=topic, partition_id=partition, start_offset=chunk.start_offset,
                                    chunk_epoch=-1, broker_ids=[], log_start_offset=offset)
    try:
        resp = await b.forward(AC(chunks=[entry]), 0)
    except ClientError:
        return Errors.REQUEST_TIMED_OUT
    return resp.results[0].error_code if resp.results else Errors.UNKNOWN_SERVER_ERROR


async def _drop_chunks(b, topic: str, partition: int, chunks) -> int:
    AC = AlterChunkAssignmentsRequest
    entries = [
        AC.AlterChunkAssignment(topic_name=topic, partition_id=partition, start_offset=c.start_offset,
                                chunk_epoch=-1, broker_ids=[], leaving_broker_id=r)
        for c in chunks for r in c.replicas
    ]
    try:
        resp = await b.forward(AC(chunks=entries), 0)
    except ClientError:
        return Errors.REQUEST_TIMED_OUT
    # INVALID_REQUEST: a replica or the chunk left already (retention got there first)
    bad = [r.error_code for r in resp.results if r.error_code not in (0, Errors.INVALID_REQUEST)]
    return bad[0] if bad else 0


@api(45, 0, 0)
async def alter_partition_reassignments(ctx: RequestContext, req):
    return await ctx.broker.forward(req, ctx.api_version)


@api(46, 0, 0)
async def list_partition_reassignments(ctx: RequestContext, req):
    return await ctx.broker.forward(req, ctx.api_version, read_only=True)


@api(43, 0, 2)
async def elect_leaders(ctx: RequestContext, req):
    return await ctx.broker.forward(req, ctx.api_version)
