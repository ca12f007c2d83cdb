"""Topic administration. Mutations are forwarded to the controller (metadata flows one way: the
controller writes records, every broker's image follows); the answer goes back once this
broker's image includes the change. DeleteRecords acts on the leader's log."""

from __future__ import annotations

from broker.apis import RequestContext, api
from broker.apis.leadership import leader_or_error
from broker.storage.errors import StorageError
from protocol.errors import Errors
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
            try:
                pr.low_watermark = p.log.delete_records_before(offset)
            except StorageError as e:
                pr.error_code = e.error_code
    return R(topics=topics)


@api(45, 0, 0)
async def alter_partition_reassignments(ctx: RequestContext, req):
    return await ctx.broker.forward(req, ctx.api_version)


@api(46, 0, 0)
async def list_partition_reassignments(ctx: RequestContext, req):
    return await ctx.broker.forward(req, ctx.api_version, read_only=True)


@api(43, 0, 2)
async def elect_leaders(ctx: RequestContext, req):
    return await ctx.broker.forward(req, ctx.api_version)
