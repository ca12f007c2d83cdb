"""Topic administration. Mutations are forwarded to the controller (metadata flows one way: the
controller writes records, every broker's image follows); the answer goes back once this
broker's image includes the change. DeleteRecords acts on the partition (broker/partitions/)."""

from __future__ import annotations

from broker.apis.registry import RequestContext, api
from protocol.generated.delete_records import DeleteRecordsResponse


@api(19, 2, 7)
async def create_topics(ctx: RequestContext, req):
    return await ctx.services.forward(req, ctx.api_version)


@api(20, 1, 6)
async def delete_topics(ctx: RequestContext, req):
    return await ctx.services.forward(req, ctx.api_version)


@api(37, 0, 3)
async def create_partitions(ctx: RequestContext, req):
    return await ctx.services.forward(req, ctx.api_version)


@api(21, 0, 2)
async def delete_records(ctx: RequestContext, req) -> DeleteRecordsResponse:
    """On the partition's leader (a local partition's active chunk leader; any broker for a
    diskless partition): the partition interface's delete_records."""
    R = DeleteRecordsResponse
    topics = []
    for t in req.topics:
        tr = R.DeleteRecordsTopicResult(name=t.name)
        topics.append(tr)
        for dp in t.partitions:
            pr = R.DeleteRecordsPartitionResult(partition_index=dp.partition_index, low_watermark=-1)
            tr.partitions.append(pr)
            part, pr.error_code = ctx.services.partitions.serving(t.name, dp.partition_index)
            if part is not None:
                pr.error_code, pr.low_watermark = await part.delete_records(dp.offset)
    return R(topics=topics)


@api(45, 0, 0)
async def alter_partition_reassignments(ctx: RequestContext, req):
    return await ctx.services.forward(req, ctx.api_version)


@api(46, 0, 0)
async def list_partition_reassignments(ctx: RequestContext, req):
    return await ctx.services.forward(req, ctx.api_version, read_only=True)


@api(43, 0, 2)
async def elect_leaders(ctx: RequestContext, req):
    return await ctx.services.forward(req, ctx.api_version)


@api(57, 0, 1)
async def update_features(ctx: RequestContext, req):
    """kafka-features.sh upgrade/downgrade: the controller decides and writes the feature's level."""
    return await ctx.services.forward(req, ctx.api_version)
