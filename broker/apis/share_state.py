"""The share-group state APIs (KIP-932) at this broker's share coordinator
(broker/coordinator/share/): a share-partition's leader on another broker reads and writes its
state (ReadShareGroupState, WriteShareGroupState), a group coordinator deletes it
(DeleteShareGroupState); InitializeShareGroupState sets a start offset under a new state epoch and
ReadShareGroupStateSummary answers start offsets and epochs without the in-flight ranges."""

from __future__ import annotations

from broker.apis.registry import RequestContext, api
from broker.coordinator.share.records import ACKNOWLEDGED, ARCHIVED, ShareState, StateKey
from protocol.generated.delete_share_group_state import DeleteShareGroupStateResponse
from protocol.generated.initialize_share_group_state import InitializeShareGroupStateResponse
from protocol.generated.read_share_group_state import ReadShareGroupStateResponse
from protocol.generated.read_share_group_state_summary import ReadShareGroupStateSummaryResponse
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


@api(83, 0, 0, enabled=_enabled)
async def initialize_share_group_state(ctx: RequestContext, req) -> InitializeShareGroupStateResponse:
    R = InitializeShareGroupStateResponse
    coordinator = ctx.services.share_coordinator
    results = []
    for t in req.topics:
        parts = []
        for p in t.partitions:
            key = StateKey(req.group_id, t.topic_id, p.partition)
            err, current = coordinator.read(key)
            if not err:
                # a start offset of -1: the group's share.auto.offset.reset decides at the first fetch
                err = await coordinator.write(key, ShareState(
                    p.state_epoch, current.leader_epoch if current is not None else -1, p.start_offset, []))
            parts.append(R.PartitionResult(partition=p.partition, error_code=err))
        results.append(R.InitializeStateResult(topic_id=t.topic_id, partitions=parts))
    return R(results=results)


@api(87, 0, 1, enabled=_enabled)
async def read_share_group_state_summary(ctx: RequestContext, req) -> ReadShareGroupStateSummaryResponse:
    R = ReadShareGroupStateSummaryResponse
    coordinator = ctx.services.share_coordinator
    results = []
    for t in req.topics:
        parts = []
        for p in t.partitions:
            err, state = coordinator.read(StateKey(req.group_id, t.topic_id, p.partition))
            pr = R.PartitionResult(partition=p.partition, error_code=err, state_epoch=0, leader_epoch=-1,
                                   start_offset=-1)
            if state is not None:
                pr.state_epoch, pr.leader_epoch, pr.start_offset = (state.state_epoch, state.leader_epoch,
                                                                    state.start_offset)
                pr.delivery_complete_count = sum(
                    last - max(first, state.start_offset) + 1 for first, last, st, _ in state.batches
                    if st in (ACKNOWLEDGED, ARCHIVED) and last >= state.start_offset)
            parts.append(pr)
        results.append(R.ReadStateSummaryResult(topic_id=t.topic_id, partitions=parts))
    return R(results=results)
