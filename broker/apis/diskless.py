"""The diskless coordinator's seven APIs (KIP-1164's keys + 1000: 1093-1098, 1100),
DisklessHandOverFile (1110, Strata's: KIP-1164's WAL file handover has no API of its own) and
DisklessDescribeProducers (1112, Strata's: the producer state KIP-1164 puts in the coordinator,
for KIP-664's DescribeProducers on any broker).

Only brokers may call them (KIP-1164 asks for CLUSTER_ACTION; until ACLs exist the rule is: the
client id is `diskless-<node id>` of a registered, unfenced broker and the connection comes from
that broker's host); anyone else gets CLUSTER_AUTHORIZATION_FAILED on every item. DisklessFindBatches
is the exception: it changes nothing, and a reader of the object store plans from it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

from broker.apis.registry import RequestContext, api
from broker.diskless.batches import BatchLookup
from protocol.errors import Errors, error_message
from protocol.generated.diskless_commit_file import DisklessCommitFileResponse
from protocol.generated.diskless_create_partitions import DisklessCreatePartitionsResponse
from protocol.generated.diskless_delete_records import DisklessDeleteRecordsResponse
from protocol.generated.diskless_delete_topics import DisklessDeleteTopicsResponse
from protocol.generated.diskless_describe_files import DisklessDescribeFilesResponse
from protocol.generated.diskless_describe_producers import DisklessDescribeProducersResponse
from protocol.generated.diskless_find_batches import DisklessFindBatchesResponse
from protocol.generated.diskless_hand_over_file import DisklessHandOverFileResponse
from protocol.generated.diskless_list_offsets import DisklessListOffsetsResponse

CLIENT_ID_PREFIX = "diskless-"
REFUSED = "diskless coordinator APIs are for brokers only"


def calling_broker(ctx: RequestContext) -> int | None:
    """The id of the broker making this request, or None when the caller is not a broker."""
    cid = ctx.client_id or ""
    if not cid.startswith(CLIENT_ID_PREFIX) or not cid[len(CLIENT_ID_PREFIX):].isdigit():
        return None
    node = int(cid[len(CLIENT_ID_PREFIX):])
    info = ctx.services.metadata.image.brokers.get(node)
    if info is None or info.fenced:
        return None
    peer_host = (ctx.connection.peer if ctx.connection is not None else "").rsplit(":", 1)[0]
    hosts = {e.host for e in info.endpoints}
    if peer_host not in hosts and not ({"localhost", "127.0.0.1"} & hosts and peer_host == "127.0.0.1"):
        return None
    return node


async def _refused_offsets() -> tuple[int, int, int]:
    return Errors.CLUSTER_AUTHORIZATION_FAILED, -1, -1


def _coordinator(ctx: RequestContext) -> Any:
    return ctx.services.diskless_coordinator


def _message(code: int, default: str | None = None) -> str | None:
    if code == 0:
        return None
    if code == Errors.CLUSTER_AUTHORIZATION_FAILED:
        return REFUSED
    return default or error_message(code)


@api(1095, 0, 0)
async def commit_file(ctx: RequestContext, req: Any) -> DisklessCommitFileResponse:
    R = DisklessCommitFileResponse
    uploader = calling_broker(ctx)
    if uploader is None:
        return R(batches=[R.DisklessCommitBatchResult(
            error_code=Errors.CLUSTER_AUTHORIZATION_FAILED, error_message=REFUSED, assigned_base_offset=-1,
            log_append_time=-1, log_start_offset=-1) for _ in req.batches])
    answer = _coordinator(ctx).commit_file(req, uploader)  # checked and appended now, in arrival order
    if ctx.connection is not None:
        ctx.connection.release()  # the next commit pipelines behind this one (KIP-1164's step 3)
    results = await answer
    return R(batches=[R.DisklessCommitBatchResult(
        error_code=r.error_code, error_message=r.error_message, assigned_base_offset=r.base_offset,
        log_append_time=r.log_append_time, log_start_offset=r.log_start_offset, is_duplicate=r.duplicate)
        for r in results])


@api(1093, 0, 0)
async def create_partitions(ctx: RequestContext, req: Any) -> DisklessCreatePartitionsResponse:
    R = DisklessCreatePartitionsResponse
    c = _coordinator(ctx)
    code = Errors.CLUSTER_AUTHORIZATION_FAILED if calling_broker(ctx) is None else 0
    if code == 0:
        # every coordinator here takes the partitions the metadata maps to it
        for index in c.led_partitions() or [-1]:
            err = await c.create_partitions(index, req.topics) if index >= 0 else Errors.NOT_COORDINATOR
            code = code or err
    return R(topics=[R.DisklessCreatablePartitionsResult(topic_id=t.topic_id, error_code=code,
                                                         error_message=_message(code)) for t in req.topics])


@api(1094, 0, 0)
async def delete_topics(ctx: RequestContext, req: Any) -> DisklessDeleteTopicsResponse:
    R = DisklessDeleteTopicsResponse
    c = _coordinator(ctx)
    code = Errors.CLUSTER_AUTHORIZATION_FAILED if calling_broker(ctx) is None else 0
    if code == 0:
        ids = [t.topic_id for t in req.topics]
        for index in c.led_partitions() or [-1]:
            err = await c.delete_topics(index, ids) if index >= 0 else Errors.NOT_COORDINATOR
            code = code or err
    return R(responses=[R.DisklessDeletableTopicResult(topic_id=t.topic_id, error_code=code,
                                                       error_message=_message(code)) for t in req.topics])


@api(1096, 0, 0)
async def delete_records(ctx: RequestContext, req: Any) -> DisklessDeleteRecordsResponse:
    R = DisklessDeleteRecordsResponse
    refused = calling_broker(ctx) is None
    out = []
    for t in req.topics:
        parts = []
        for p in t.partitions:
            code, low = ((Errors.CLUSTER_AUTHORIZATION_FAILED, -1) if refused
                         else await _coordinator(ctx).delete_records(t.topic_id, p.partition_index, p.offset))
            parts.append(R.DisklessDeleteRecordsPartitionResult(partition_index=p.partition_index, low_watermark=low,
                                                               error_code=code, error_message=_message(code)))
        out.append(R.DisklessDeleteRecordsTopicResult(topic_id=t.topic_id, partitions=parts))
    return R(topics=out)


@api(1097, 0, 0)
async def list_offsets(ctx: RequestContext, req: Any) -> DisklessListOffsetsResponse:
    R = DisklessListOffsetsResponse
    refused = calling_broker(ctx) is None
    c = _coordinator(ctx)

    def ask(tid: Any, p: Any) -> Awaitable[tuple[int, int, int]]:
        if refused:
            return _refused_offsets()
        if p.leader_epoch >= 0:  # OffsetForLeaderEpoch's lookup (KIP-253 gates): (error, epoch, end)
            return c.epoch_end(tid, p.partition_index, p.leader_epoch, p.current_leader_epoch)
        return c.list_offsets(tid, p.partition_index, p.timestamp, p.read_committed)

    found = iter(await asyncio.gather(*(ask(t.topic_id, p) for t in req.topics for p in t.partitions)))
    out = []
    for t in req.topics:
        parts = []
        for p in t.partitions:
            code, ts, offset = next(found)
            epoch = -1
            if p.leader_epoch >= 0:
                ts, epoch = -1, ts
            parts.append(R.DisklessListOffsetsPartitionResponse(partition_index=p.partition_index, error_code=code,
                                                               error_message=_message(code), timestamp=ts,
                                                               offset=offset, leader_epoch=epoch))
        out.append(R.DisklessListOffsetsTopicResponse(topic_id=t.topic_id, partitions=parts))
    return R(topics=out)


@api(1098, 0, 0)
async def find_batches(ctx: RequestContext, req: Any) -> DisklessFindBatchesResponse:
    R = DisklessFindBatchesResponse
    lookups = [BatchLookup(t.topic_id, p.partition_index, p.offset, max(p.max_partition_fetch_bytes, 1),
                           p.read_committed) for t in req.topics for p in t.partitions]
    # Read-only, so not only for brokers: a reader that fetches WAL byte ranges from the object
    # store itself (the Spark source's direct read) plans from it. With ACLs on, the request still
    # needs CLUSTER_ACTION (broker/authz.py), as KIP-1164 asks.
    found = await _coordinator(ctx).find_batches(lookups, req.max_batches_per_partition)
    budget = max(req.fetch_max_bytes, 1)
    answers = iter(found)
    out = []
    for t in req.topics:
        parts = []
        for p in t.partitions:
            answer = next(answers)
            code, lso, hw, rows = answer.error_code, answer.log_start_offset, answer.high_watermark, answer.batches
            kept: list[Any] = []
            for r in rows:  # the request's budget, in request order (the first batch always)
                if kept and r.byte_size > budget:
                    break
                kept.append(r)
                budget = max(0, budget - r.byte_size)
            parts.append(R.DisklessFindBatchesPartitionResponse(
                partition_index=p.partition_index, error_code=code, log_start_offset=lso, high_watermark=hw,
                batches=[R.DisklessFindBatchesBatchInfo(
                    batch_id=r.batch_id, object_key=r.object_key, magic=r.magic, byte_offset=r.byte_offset,
                    byte_size=r.byte_size, base_offset=r.base_offset, last_offset=r.last_offset,
                    log_append_timestamp=r.log_append_timestamp, batch_max_timestamp=r.max_timestamp,
                    timestamp_type=r.timestamp_type) for r in kept],
                last_stable_offset=answer.last_stable_offset,
                aborted_transactions=[R.DisklessAbortedTransaction(producer_id=pid, first_offset=first)
                                      for pid, first in answer.aborted or ()
                                      if kept and first <= kept[-1].last_offset]))
        out.append(R.DisklessFindBatchesTopicResponse(topic_id=t.topic_id, partitions=parts))
    return R(topics=out)


@api(1100, 0, 0)
async def describe_files(ctx: RequestContext, req: Any) -> DisklessDescribeFilesResponse:
    R = DisklessDescribeFilesResponse
    if calling_broker(ctx) is None:
        return R(files=[R.DisklessDescribeFileResult(object_key=f.object_key, error_code=Errors.CLUSTER_AUTHORIZATION_FAILED,
                                                     error_message=REFUSED) for f in req.files])
    return await ctx.services.diskless.describe_files([f.object_key for f in req.files], req.details)


@api(1112, 0, 0)
async def describe_producers(ctx: RequestContext, req: Any) -> DisklessDescribeProducersResponse:
    R = DisklessDescribeProducersResponse
    refused = calling_broker(ctx) is None
    out = []
    for t in req.topics:
        parts = []
        for idx in t.partition_indexes:
            code, found = ((Errors.CLUSTER_AUTHORIZATION_FAILED, []) if refused
                           else await _coordinator(ctx).describe_producers(t.topic_id, idx))
            parts.append(R.DisklessDescribeProducersPartitionResponse(partition_index=idx, error_code=code, active_producers=[
                R.DisklessProducerState(producer_id=f.producer_id, producer_epoch=f.producer_epoch,
                                        last_sequence=f.last_sequence, last_timestamp=f.last_timestamp,
                                        coordinator_epoch=f.coordinator_epoch,
                                        current_txn_start_offset=f.txn_start_offset) for f in found]))
        out.append(R.DisklessDescribeProducersTopicResponse(topic_id=t.topic_id, partitions=parts))
    return R(topics=out)


@api(1110, 0, 0)
async def hand_over_file(ctx: RequestContext, req: Any) -> DisklessHandOverFileResponse:
    if calling_broker(ctx) is None:
        return DisklessHandOverFileResponse(error_code=Errors.CLUSTER_AUTHORIZATION_FAILED, error_message=REFUSED)
    code = await _coordinator(ctx).files.hand_over(req.to_coordinator, req.object_key, req.file_size, req.owner_ids,
                                             req.from_coordinator)
    return DisklessHandOverFileResponse(error_code=code, error_message=_message(code))
