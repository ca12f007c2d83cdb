"""The share-group state APIs (KIP-932) at this broker's share coordinator
(broker/coordinator/share/): a share-partition's leader on another broker reads and writes its
state (ReadShareGroupState, WriteShareGroupState), a group coordinator deletes it
(DeleteShareGroupState); InitializeShareGroupState sets a start offset under a new state epoch and
ReadShareGroupStateSummary answers start offsets and epochs without the in-flight ranges."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from broker.apis.registry import RequestContext, api
from broker.coordinator.share.records import ShareState, StateKey, delivery_complete_count
from protocol.generated.delete_share_group_state import DeleteShareGroupStateResponse
from protocol.generated.initialize_share_group_state import InitializeShareGroupStateResponse
from protocol.generated.read_share_group_state import ReadShareGroupStateResponse
from protocol.generated.read_share_group_state_summary import ReadShareGroupStateSummaryResponse
from protocol.generated.write_share_group_state import WriteShareGroupStateResponse


def _enabled(config) -> bool:  # noqa: ANN001 - the BrokerConfig
    return config.share.enable


async def _each_partition(req: Any, result: Callable[..., Any],
                          answer: Callable[[StateKey, Any], Awaitable[Any]]) -> list:
    """The answers of every partition the request names, grouped by topic as all five APIs
    answer: `result(topic_id=, partitions=)` per topic, `answer(key, partition)` per partition."""
    return [result(topic_id=t.topic_id, partitions=[
        await answer(StateKey(req.group_id, t.topic_id, p.partition), p) for p in t.partitions])
        for t in req.topics]


@api(84, 0, 0, enabled=_enabled)
async def read_share_group_state(ctx: RequestContext, req) -> ReadShareGroupStateResponse:
    R = ReadShareGroupStateResponse
    coordinator = ctx.services.share_coordinator

    async def answer(key: StateKey, p: Any) -> Any:
        err, state = coordinator.read(key)
        pr = R.PartitionResult(partition=p.partition, error_code=err, state_epoch=0, start_offset=-1)
        if state is not None:
            pr.state_epoch, pr.start_offset = state.state_epoch, state.start_offset
            pr.state_batches = [R.StateBatch(first_offset=f, last_offset=last, delivery_state=s, delivery_count=c)
                                for f, last, s, c in state.batches]
        return pr

    return R(results=await _each_partition(req, R.ReadStateResult, answer))


@api(85, 0, 1, enabled=_enabled)
async def write_share_group_state(ctx: RequestContext, req) -> WriteShareGroupStateResponse:
    R = WriteShareGroupStateResponse
    coordinator = ctx.services.share_coordinator

    # v1's DeliveryCompleteCount (KIP-1226) is not kept apart: every write is a whole snapshot here,
    # whose acknowledged and archived ranges give the same count to the summary and the lag
    async def answer(key: StateKey, p: Any) -> Any:
        state = ShareState(p.state_epoch, p.leader_epoch, p.start_offset,
                           [(b.first_offset, b.last_offset, b.delivery_state, b.delivery_count)
                            for b in p.state_batches])
        return R.PartitionResult(partition=p.partition, error_code=await coordinator.write(key, state))

    return R(results=await _each_partition(req, R.WriteStateResult, answer))


@api(86, 0, 0, enabled=_enabled)
async def delete_share_group_state(ctx: RequestContext, req) -> DeleteShareGroupStateResponse:
    R = DeleteShareGroupStateResponse
    coordinator = ctx.services.share_coordinator

    async def answer(key: StateKey, p: Any) -> Any:
        return R.PartitionResult(partition=p.partition, error_code=await coordinator.delete(key))

    return R(results=await _each_partition(req, R.DeleteStateResult, answer))


@api(83, 0, 0, enabled=_enabled)
async def initialize_share_group_state(ctx: RequestContext, req) -> InitializeShareGroupStateResponse:
    R = InitializeShareGroupStateResponse
    coordinator = ctx.services.share_coordinator

    async def answer(key: StateKey, p: Any) -> Any:
        err, current = coordinator.read(key)
        if not err:
            # a start offset of -1: the group's share.auto.offset.reset decides at the first fetch
            err = await coordinator.write(key, ShareState(
                p.state_epoch, current.leader_epoch if current is not None else -1, p.start_offset, []))
        return R.PartitionResult(partition=p.partition, error_code=err)

    return R(results=await _each_partition(req, R.InitializeStateResult, answer))


@api(87, 0, 1, enabled=_enabled)
async def read_share_group_state_summary(ctx: RequestContext, req) -> ReadShareGroupStateSummaryResponse:
    R = ReadShareGroupStateSummaryResponse
    coordinator = ctx.services.share_coordinator

    async def answer(key: StateKey, p: Any) -> Any:
        err, state = coordinator.read(key)
        pr = R.PartitionResult(partition=p.partition, error_code=err, state_epoch=0, leader_epoch=-1,
                               start_offset=-1)
        if state is not None:
            pr.state_epoch, pr.leader_epoch, pr.start_offset = (state.state_epoch, state.leader_epoch,
                                                                state.start_offset)
            pr.delivery_complete_count = delivery_complete_count(state)
        return pr

    return R(results=await _each_partition(req, R.ReadStateSummaryResult, answer))
