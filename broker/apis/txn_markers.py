"""WriteTxnMarkers: the transaction coordinator asks partition leaders to end a transaction.

For each marker and partition: the leadership check, then one control batch appended as the
coordinator (Log.append_txn_marker: producer epoch and coordinator epoch checked against the
partition's producer state), then a wait, as acks=all, until the high watermark passes it: only
then is the transaction's outcome durable on every in-sync replica, and only then does the last
stable offset move past it. Errors are per partition; the coordinator retries the retriable ones.
For `__consumer_offsets` partitions the group coordinator then applies (commit) or drops (abort)
the transaction's pending offsets.

A diskless partition has no leader to append to: any broker writes its marker into its WAL file
and commits it through the diskless coordinator like any batch (the coordinator checks the epochs
and ends the producer's transaction in its state); the answer waits for that commit.
"""

from __future__ import annotations

import asyncio
import inspect

import structlog

from broker.apis.registry import RequestContext, api
from broker.replication.partition import now_ms
from broker.storage.errors import StorageError
from protocol.errors import Errors
from protocol.generated.write_txn_markers import WriteTxnMarkersResponse

log = structlog.get_logger(__name__)

R = WriteTxnMarkersResponse
OFFSETS_TOPIC = "__consumer_offsets"
REPLICATION_TIMEOUT_S = 20.0  # below the sender's 30 s request timeout, so it hears why


@api(27, 0, 1)
async def write_txn_markers(ctx: RequestContext, req) -> WriteTxnMarkersResponse:
    s = ctx.services
    now = now_ms()
    results = []
    waits = []  # (partition result, partition, end offset, topic, producer id, commit)
    diskless_waits = []  # (partition result, the commit's answer)
    for m in req.markers:
        mr = R.WritableTxnMarkerResult(producer_id=m.producer_id)
        results.append(mr)
        for t in m.topics:
            tr = R.WritableTxnMarkerTopicResult(name=t.name)
            mr.topics.append(tr)
            for idx in t.partition_indexes:
                pr = R.WritableTxnMarkerPartitionResult(partition_index=idx)
                tr.partitions.append(pr)
                dp = s.diskless.partition(t.name, idx)
                if dp is not None:
                    diskless_waits.append((pr, dp.write_marker(m.producer_id, m.producer_epoch, m.coordinator_epoch,
                                                               m.transaction_result, now)))
                    continue
                p, pr.error_code = s.partitions.leader(t.name, idx)
                if p is None:
                    continue
                if p.sealed:
                    pr.error_code = Errors.NOT_LEADER_OR_FOLLOWER  # a chunk is being created: retry
                    continue
                min_isr = int(s.replicas.topic_config(t.name).get("min.insync.replicas", "1"))
                if len(p.isr) < min_isr:
                    pr.error_code = Errors.NOT_ENOUGH_REPLICAS
                    continue
                try:
                    info = p.log.append_txn_marker(
                        m.producer_id, m.producer_epoch, m.coordinator_epoch, m.transaction_result, p.leader_epoch, now
                    )
                except StorageError as e:
                    pr.error_code = e.error_code
                    log.info(
                        "txn_marker_refused",
                        topic=t.name,
                        partition=idx,
                        producer_id=m.producer_id,
                        producer_epoch=m.producer_epoch,
                        coordinator_epoch=m.coordinator_epoch,
                        error=str(e),
                    )
                    continue
                p.notify_data()
                p.maybe_advance_high_watermark()
                waits.append((pr, p, info.last_offset + 1, t.name, m.producer_id, m.transaction_result))
    if diskless_waits:
        # the markers hold back every read_committed reader of the partition: their file goes now,
        # not after diskless.wal.max.ms
        s.diskless.wal.rotate()
        answers = await asyncio.gather(*(a for _, a in diskless_waits))
        for (pr, _), a in zip(diskless_waits, answers):
            pr.error_code = a.error_code
            if a.error_code:
                log.info("txn_marker_refused", partition=pr.partition_index, error_code=a.error_code,
                         error=a.error_message, diskless=True)
    if waits:
        done = await asyncio.gather(*(p.wait_for_high_watermark(end, REPLICATION_TIMEOUT_S) for _, p, end, *_ in waits))
        for (pr, p, _, topic, pid, commit), ok in zip(waits, done):
            if not ok:
                pr.error_code = Errors.REQUEST_TIMED_OUT if p.is_leader else Errors.NOT_LEADER_OR_FOLLOWER
            elif topic == OFFSETS_TOPIC:
                await _complete_offsets(ctx, p.index, pid, commit)
    return R(markers=results)


async def _complete_offsets(ctx: RequestContext, partition: int, producer_id: int, commit: bool) -> None:
    gc = ctx.services.group_coordinator
    handler = getattr(gc, "on_transaction_completed", None)
    if handler is None:
        return
    try:
        result = handler(partition, producer_id, commit)
        if inspect.isawaitable(result):
            await result
    except Exception:  # the marker is written; the group coordinator's trouble is its own
        log.exception("txn_offsets_completion_failed", partition=partition, producer_id=producer_id)
