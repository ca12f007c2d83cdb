"""Transaction APIs a transactional producer sends its coordinator: AddPartitionsToTxn (24),
AddOffsetsToTxn (25), EndTxn (26). Thin translation to broker/coordinator/transaction.

Versions: without KIP-890 part 2 (server-side epoch bump per transaction) we stop below it:
AddPartitionsToTxn 0-3 (v4 is the broker-to-broker batched form of KIP-890), AddOffsetsToTxn 0-4
and EndTxn 0-4 (v4 only allows TRANSACTION_ABORTABLE, which we never answer; EndTxn v5 would
return a new epoch per transaction). As Kafka, PRODUCER_FENCED is answered as
INVALID_PRODUCER_EPOCH to versions before 2, which do not know it.
"""

from __future__ import annotations

from typing import Any

from broker.apis.registry import RequestContext, api
from protocol.errors import Errors
from protocol.generated.add_offsets_to_txn import AddOffsetsToTxnResponse
from protocol.generated.add_partitions_to_txn import AddPartitionsToTxnResponse
from protocol.generated.end_txn import EndTxnResponse


def transaction_coordinator(ctx: RequestContext) -> Any:
    c = ctx.services.transaction_coordinator
    return c if c is not None and c.active else None


def fenced_for_version(code: int, version: int, first_with_fenced: int) -> int:
    return Errors.INVALID_PRODUCER_EPOCH if code == Errors.PRODUCER_FENCED and version < first_with_fenced else code


@api(24, 0, 3)
async def add_partitions_to_txn(ctx: RequestContext, req) -> AddPartitionsToTxnResponse:
    R = AddPartitionsToTxnResponse
    image = ctx.services.metadata.image
    requested = [(t.name, p) for t in req.v3_and_below_topics for p in t.partitions]
    unknown = set()
    for name, p in requested:
        topic = image.topic(name)
        if topic is None or p not in topic.partitions:
            unknown.add((name, p))
    if unknown:
        errors = {tp: Errors.UNKNOWN_TOPIC_OR_PARTITION if tp in unknown else Errors.OPERATION_NOT_ATTEMPTED
                  for tp in requested}
    else:
        c = transaction_coordinator(ctx)
        if c is None:
            code = Errors.COORDINATOR_NOT_AVAILABLE
        else:
            code = await c.add_partitions(req.v3_and_below_transactional_id, req.v3_and_below_producer_id,
                                          req.v3_and_below_producer_epoch, set(requested))
        code = fenced_for_version(code, ctx.api_version, 2)
        errors = {tp: code for tp in requested}
    by_topic: dict[str, list[Any]] = {}
    for (name, p), code in errors.items():
        by_topic.setdefault(name, []).append(R.AddPartitionsToTxnPartitionResult(partition_index=p,
                                                                                  partition_error_code=code))
    return R(results_by_topic_v3_and_below=[
        R.AddPartitionsToTxnTopicResult(name=name, results_by_partition=parts) for name, parts in by_topic.items()
    ])


@api(25, 0, 4)
async def add_offsets_to_txn(ctx: RequestContext, req) -> AddOffsetsToTxnResponse:
    c = transaction_coordinator(ctx)
    if c is None:
        return AddOffsetsToTxnResponse(error_code=Errors.COORDINATOR_NOT_AVAILABLE)
    code = await c.add_offsets(req.transactional_id, req.producer_id, req.producer_epoch, req.group_id)
    return AddOffsetsToTxnResponse(error_code=fenced_for_version(code, ctx.api_version, 2))


@api(26, 0, 4)
async def end_txn(ctx: RequestContext, req) -> EndTxnResponse:
    c = transaction_coordinator(ctx)
    if c is None:
        return EndTxnResponse(error_code=Errors.COORDINATOR_NOT_AVAILABLE)
    code = await c.end_transaction(req.transactional_id, req.producer_id, req.producer_epoch, bool(req.committed))
    return EndTxnResponse(error_code=fenced_for_version(code, ctx.api_version, 2))
