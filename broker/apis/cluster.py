"""DescribeCluster: the cluster id and its brokers, from the metadata image."""

from __future__ import annotations

from broker.apis.registry import RequestContext, api
from protocol.generated.describe_cluster import DescribeClusterResponse


@api(60, 0, 2)
async def describe_cluster(ctx: RequestContext, req) -> DescribeClusterResponse:
    s = ctx.services
    image = s.metadata.image
    B = DescribeClusterResponse.DescribeClusterBroker
    brokers = []
    for info in sorted(image.brokers.values(), key=lambda x: x.id):
        if info.fenced and not req.include_fenced_brokers:
            continue
        ep = info.endpoint(ctx.listener)
        if ep is None:
            continue
        brokers.append(B(broker_id=info.id, host=ep.host, port=ep.port, rack=info.rack, is_fenced=info.fenced))
    if req.endpoint_type not in (0, 1):  # we only have broker endpoints
        return DescribeClusterResponse(error_code=115, error_message="only broker endpoints are served here",
                                       endpoint_type=req.endpoint_type)
    # As KRaft brokers do, name a live broker as "controller": admin requests sent there get forwarded.
    return DescribeClusterResponse(
        cluster_id=s.cluster_id or "", controller_id=s.config.node_id, brokers=brokers, endpoint_type=req.endpoint_type or 1
    )


@api(55, 0, 2)
async def describe_quorum(ctx: RequestContext, req):
    """DescribeQuorum (kafka-metadata-quorum.sh, admin clients): answered by the quorum leader,
    as a Kafka broker forwards it to the active controller."""
    return await ctx.services.forward(req, ctx.api_version, read_only=True)


@api(80, 0, 1)
async def add_raft_voter(ctx: RequestContext, req):
    """AddRaftVoter (KIP-853): forwarded to the quorum leader, as a Kafka broker does."""
    return await ctx.services.forward(req, ctx.api_version)


@api(81, 0, 0)
async def remove_raft_voter(ctx: RequestContext, req):
    """RemoveRaftVoter (KIP-853): forwarded to the quorum leader, as a Kafka broker does."""
    return await ctx.services.forward(req, ctx.api_version)
