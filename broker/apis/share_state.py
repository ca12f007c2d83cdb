"""ReadShareGroupState, WriteShareGroupState and DeleteShareGroupState (KIP-932): a
share-partition's leader, or a group coordinator deleting offsets, on another broker reads, writes
and deletes state at this broker's share coordinator (broker/coordinator/share/)."""

from __future__ import annotations

from broker.apis.registry import RequestContext, api
from broker.coordinator.share.records import ShareState, StateKey
from protocol.generated.delete_share_group_state import DeleteShareGroupStateResponse
from protocol.generated.read_share_group_state import ReadShareGroupStateResponse
from protocol.generated.write_share_group_state import WriteShareGroupStateResponse


def _enabled(config) -> bool:  # noqa: ANN001 - the BrokerConfig
    return config.share.enable


@api(84, 0, 0, enabled=_enabled)
async def read_share_group_state(ctx: RequestContext, req) -> ReadShareGroupStateResponse:
    R = ReadShareGroupStateResponse
    coordinator = ctx.services.share_coordinator
    results = []
    for t in req.topics:
        parts = []
        for p in t.partitions:
            err, state = coordinator.read(StateKey(req.group_id, t.topic_id, p.partition))
            pr = R.PartitionResult(partition=p.partition, error_code=err, state_epoch=0, start_offset=-1)
            if state is not None:
                pr.state_epoch, pr.start_offset = state.state_epoch, state.start_offset
                pr.state_batches = [R.StateBatch(first_offset=f, last_offset=last, delivery_state=s, delivery_count=c)
                                    for f, last, s, c in state.batches]
            parts.append(pr)
        results.append(R.ReadStateResult(topic_id=t.topic_id, partitions=parts))
    return R(results=results)


@api(85, 0, 0, enabled=_enabled)
async def write_share_group_state(ctx: RequestContext, req) -> WriteShareGroupStateResponse:
    R = WriteShareGroupStateResponse
    coordinator = ctx.services.share_coordinator
    results = []
    for t in req.topics:
        parts = []
        for p in t.partitions:
            state = ShareState(p.state_epoch, p.leader_epoch, p.start_offset,
                               [(b.first_offset, b.last_offset, b.delivery_state, b.delivery_count)
                                for b in p.state_batches])
            err = await coordinator.write(StateKey(req.group_id, t.topic_id, p.partition), state)
            parts.append(R.PartitionResult(partition=p.partition, error_code=err))
        results.append(R.WriteStateResult(topic_id=t.topic_id, partitions=parts))
    return R(results=results)


@api(86, 0, 0, enabled=_enabled)
async def delete_share_group_state(ctx: RequestContext, req) -> DeleteShareGroupStateResponse:
    R = DeleteShareGroupStateResponse
    coordinator = ctx.services.share_coordinator
    results = []
    for t in req.topics:
        parts = [R.PartitionResult(partition=p.partition, error_code=await coordinator.delete(
            StateKey(req.group_id, t.topic_id, p.partition))) for p in t.partitions]
        results.append(R.DeleteStateResult(topic_id=t.topic_id, partitions=parts))
    return R(results=results)
