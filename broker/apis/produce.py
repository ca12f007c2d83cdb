"""Produce: each partition's batches go to the one partition interface (a local chunk replica
appends them as bytes on the leader; a diskless partition buffers them into this broker's WAL
file), then the answer waits for what acks asks.

Appends happen before the first await, so pipelined requests on one connection append in the
order they were sent. acks=-1 on a local partition waits (bounded by the request timeout) for the
high watermark to pass the batch; on a diskless one every acks value means "committed".
KIP-253's undeleted partition count is checked here, for both kinds.
"""

from __future__ import annotations

import asyncio

from broker.apis.registry import RequestContext, api
from broker.replication.partition import now_ms
from metadata import TopicInfo
from node.waits import Eventual
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
async def produce(ctx: RequestContext, req) -> ProduceResponse | Eventual | None:
    s = ctx.services
    acks = req.acks
    now = now_ms()
    waits = []
    responses = []
    pipelined = True
    for t in req.topic_data:
        tr = R.TopicProduceResponse(name=t.name)
        responses.append(tr)
        topic = s.replicas.image.topic(t.name)
        for pd in t.partition_data:
            pr = R.PartitionProduceResponse(index=pd.index, base_offset=-1)
            tr.partition_responses.append(pr)
            if acks not in (-1, 0, 1):
                pr.error_code = Errors.INVALID_REQUIRED_ACKS
                continue
            if topic is not None and (problem := partition_count_problem(topic, pd.index, t.undeleted_partition_count)):
                pr.error_code, pr.error_message = problem
                continue
            # KIP-253: the count and the kept partitions' leader epochs change together. The
            # image is published before its partitions are applied one by one: until this replica
            # has the image's epoch, records hashed over the new count would carry the old one
            # (and pass a consumer's upperOffsetThreshold), so a producer that sends a count waits
            info = topic.partitions.get(pd.index) if topic is not None and t.undeleted_partition_count >= 0 else None
            p, pr.error_code = s.partitions.serving(t.name, pd.index,
                                                  current_leader_epoch=info.leader_epoch if info is not None else -1)
            if p is None:
                continue
            waits.append((pr, p.append(pd.records, acks, req.timeout_ms, now)))
            pipelined = pipelined and p.pipelines_appends(acks, len(pd.records) if pd.records is not None else 0)
    if acks == 0:
        return None
    if waits and pipelined and ctx.connection is not None and not all(_settled(w) for _, w in waits):
        ctx.connection.release()  # appended in order; the next request need not wait for our answer
    if len(waits) == 1 and isinstance(waits[0][1], Eventual):
        # one local partition (the usual acks=all case): the answer is built and goes out in the
        # call that moves the high watermark (the follower's Fetch), not steps later in this task
        return waits[0][1].map(lambda answer: _response(responses, waits, [answer]))
    # one partition is awaited directly: gather would add two loop steps
    answers = [await waits[0][1]] if len(waits) == 1 else await asyncio.gather(*(w for _, w in waits))
    return _response(responses, waits, answers)


def _settled(wait) -> bool:
    """An answer there already (a single in-sync replica): nothing to release the connection for."""
    done = getattr(wait, "done", None)
    return done is not None and done()


def _response(responses: list, waits: list, answers: list) -> ProduceResponse:
    for pr, answer in zip([pr for pr, _ in waits], answers):
        pr.error_code, pr.error_message = answer.error_code, answer.error_message
        if answer.error_code == 0 or answer.base_offset >= 0:
            pr.base_offset = answer.base_offset
            pr.log_append_time_ms = answer.log_append_time
            pr.log_start_offset = answer.log_start_offset
        if answer.record_errors:
            pr.record_errors = [R.BatchIndexAndErrorMessage(batch_index=i, batch_index_error_message=m)
                                for i, m in answer.record_errors]
    return R(responses=responses)
