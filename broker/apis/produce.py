"""Produce: validate and append batches as bytes on the leader, then answer per acks.

Appends happen before the first await, so pipelined requests on one connection append in the
order they were sent. acks=-1 waits (bounded by the request timeout) for the high watermark
to pass the batch, i.e. for every in-sync replica to hold it. Compacted topics refuse records
without a key (INVALID_RECORD), as Kafka: compaction could never keep or drop them by key.
"""

from __future__ import annotations

import asyncio

from broker.apis import RequestContext, api
from broker.apis.leadership import leader_or_error
from broker.replication.partition import now_ms
from broker.storage.batch_validation import first_record_without_key
from broker.storage.cleaner import cleanup_policies
from broker.storage.errors import ResourceExhaustedError, StorageError
from metadata import TopicInfo
from protocol.errors import Errors
from protocol.generated.produce import ProduceResponse

R = ProduceResponse


def partition_count_problem(topic: TopicInfo, index: int, producer_count: int) -> tuple[int, str] | None:
    """KIP-253: a producer that says which undeleted_partition_count it hashed over must agree with
    ours (INVALID_PARTITION_METADATA); no one writes to a partition marked for deletion (a stock
    producer, which sends no count, gets a retriable NOT_LEADER_OR_FOLLOWER and refreshes)."""
    count = topic.undeleted_partition_count
    if producer_count >= 0 and producer_count != count:
        return Errors.INVALID_PARTITION_METADATA, (
            f"topic {topic.name} has undeleted_partition_count {count}, the producer used {producer_count}"
        )
    p = topic.partitions.get(index)
    if p is not None and p.marked_for_deletion:
        code = Errors.INVALID_PARTITION_METADATA if producer_count >= 0 else Errors.NOT_LEADER_OR_FOLLOWER
        return code, (
            f"partition {topic.name}-{index} is marked for deletion (the topic's partition count is now {count}): "
            "it takes no new records"
        )
    return None


@api(0, 3, 12)
async def produce(ctx: RequestContext, req) -> ProduceResponse | None:
    b = ctx.broker
    rm = b.replicas
    acks = req.acks
    now = now_ms()
    waits: list[tuple[R.PartitionProduceResponse, object, int]] = []
    responses = []
    for t in req.topic_data:
        tr = R.TopicProduceResponse(name=t.name)
        responses.append(tr)
        topic = rm.image.topic(t.name)
        for pd in t.partition_data:
            pr = R.PartitionProduceResponse(index=pd.index, base_offset=-1)
            tr.partition_responses.append(pr)
            if acks not in (-1, 0, 1):
                pr.error_code = Errors.INVALID_REQUIRED_ACKS
                continue
            p, pr.error_code = leader_or_error(b, t.name, pd.index)
            if p is None:
                continue
            if topic is not None and (problem := partition_count_problem(topic, pd.index, t.undeleted_partition_count)):
                pr.error_code, pr.error_message = problem
                continue
            if p.sealed:
                pr.error_code = Errors.NOT_LEADER_OR_FOLLOWER
                pr.error_message = "a new chunk is being created for this partition"
                continue
            if pd.records is None or len(pd.records) == 0:
                pr.error_code = Errors.CORRUPT_MESSAGE
                pr.error_message = "produce request holds no records"
                continue
            if acks == -1:
                min_isr = int(rm.topic_config(t.name)["min.insync.replicas"])
                if len(p.isr) < min_isr:
                    pr.error_code = Errors.NOT_ENOUGH_REPLICAS
                    pr.error_message = f"ISR has {len(p.isr)} replicas, min.insync.replicas is {min_isr}"
                    continue
            if "compact" in cleanup_policies(rm.topic_config(t.name)):
                bad = first_record_without_key(pd.records)
                if bad is not None:
                    pr.error_code = Errors.INVALID_RECORD
                    pr.error_message = (
                        f"Compacted topic cannot accept message without key in topic partition {t.name}-{pd.index}."
                    )
                    pr.record_errors = [
                        R.BatchIndexAndErrorMessage(batch_index=bad, batch_index_error_message=pr.error_message)
                    ]
                    continue
            try:
                info = p.log.append_as_leader(pd.records, p.leader_epoch, now)
            except StorageError as e:
                pr.error_code = e.error_code
                pr.error_message = str(e)
                pr.record_errors = [
                    R.BatchIndexAndErrorMessage(batch_index=i, batch_index_error_message=m) for i, m in e.record_errors
                ]
                if not isinstance(e, ResourceExhaustedError):  # that one has its own rate-limited line
                    b.log_produce_error(t.name, pd.index, e)
                continue
            pr.base_offset = info.first_offset
            pr.log_append_time_ms = info.log_append_time
            pr.log_start_offset = p.log.log_start_offset
            p.notify_data()
            p.maybe_advance_high_watermark()
            if acks == -1:
                waits.append((pr, p, info.last_offset + 1))
    if acks == 0:
        return None
    # already replicated (a single in-sync replica): answer now, without a task per wait
    waits = [w for w in waits if w[1].log.high_watermark < w[2]]
    if waits:
        timeout = max(req.timeout_ms, 0) / 1000
        done = await asyncio.gather(*(p.wait_for_high_watermark(end, timeout) for _, p, end in waits))
        for (pr, p, _), ok in zip(waits, done):
            if not ok:
                # a replica no longer served here (reassigned away, its dir failed) lost leadership:
                # NOT_LEADER_OR_FOLLOWER tells an idempotent producer the batch was not persisted
                still = p.is_leader and rm.get(p.topic, p.index) is p
                pr.error_code = Errors.REQUEST_TIMED_OUT if still else Errors.NOT_LEADER_OR_FOLLOWER
    return R(responses=responses)
