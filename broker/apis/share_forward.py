"""SharePartitionForward (1932, Strata's): as the holder of a diskless partition's share-partition
(the partition's leader in the metadata image), what another broker serving a member's share
session forwards: acknowledgements, the release of a member's records, and acquisitions among
the batches that broker read (broker/share/forward.py has the design)."""

from __future__ import annotations

from dataclasses import dataclass

from broker.apis.registry import RequestContext, api
from protocol.errors import Errors
from protocol.generated.share_partition_forward import SharePartitionForwardResponse


@dataclass(frozen=True, slots=True)
class _Bounds:
    base_offset: int
    last_offset: int
    is_control: bool


def _enabled(config) -> bool:  # noqa: ANN001 - the BrokerConfig
    return config.share.enable


@api(1932, 0, 0, enabled=_enabled)
async def share_partition_forward(ctx: RequestContext, req) -> SharePartitionForwardResponse:
    R = SharePartitionForwardResponse
    if not ctx.services.config.share.enable:
        return R(error_code=Errors.UNSUPPORTED_VERSION)
    info = ctx.services.metadata.image.topics.get(req.topic_id)
    if info is None:
        return R(error_code=Errors.UNKNOWN_TOPIC_ID)
    err, ack_err, next_offset, ranges = await ctx.services.share.serve_forwarded(
        req.group_id, req.member_id, info.name, req.partition, req.leader_epoch,
        [(b.first_offset, b.last_offset, list(b.acknowledge_types)) for b in req.acknowledgement_batches],
        req.is_renew_ack, req.release_all, req.refresh_idle, req.max_records, req.log_start_offset,
        [_Bounds(b.base_offset, b.last_offset, b.is_control) for b in req.batches],
        {b.base_offset for b in req.batches if b.is_aborted})
    return R(error_code=err, acknowledge_error_code=ack_err, next_fetch_offset=next_offset,
             acquired_records=[R.AcquiredRecords(first_offset=f, last_offset=last, delivery_count=c)
                               for f, last, c in ranges])
