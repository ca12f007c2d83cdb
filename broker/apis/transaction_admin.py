"""The admin reads of KIP-664, how operators find a hanging transaction: DescribeProducers (the
producer state of partitions this broker leads), ListTransactions and DescribeTransactions (the
transaction coordinator's state)."""

from __future__ import annotations

import re
import time
from collections import defaultdict

from broker.apis.registry import RequestContext, api
from broker.coordinator.transaction.records import TransactionState
from protocol.errors import Errors
from protocol.generated.describe_producers import DescribeProducersResponse
from protocol.generated.describe_transactions import DescribeTransactionsResponse
from protocol.generated.list_transactions import ListTransactionsResponse

STATES = {s.display: s for s in TransactionState}  # Kafka's names: Empty, Ongoing, PrepareCommit, ...


@api(61, 0, 0)
async def describe_producers(ctx: RequestContext, req) -> DescribeProducersResponse:
    R = DescribeProducersResponse
    topics = []
    for t in req.topics:
        parts = []
        for idx in t.partition_indexes:
            dp = ctx.services.diskless.partition(t.name, idx)
            if dp is not None:  # its producers live in its diskless coordinator (KIP-1164)
                code, found = await dp.describe_producers()
                parts.append(R.PartitionResponse(partition_index=idx, error_code=code, active_producers=[
                    R.ProducerState(producer_id=f.producer_id, producer_epoch=f.producer_epoch,
                                    last_sequence=f.last_sequence, last_timestamp=f.last_timestamp,
                                    coordinator_epoch=f.coordinator_epoch, current_txn_start_offset=f.txn_start_offset)
                    for f in found]))
                continue
            p, code = ctx.services.partitions.leader(t.name, idx)
            if p is None:
                parts.append(R.PartitionResponse(partition_index=idx, error_code=code))
                continue
            producers = list(p.log.producer_state.producers.values())  # a copy: appends may follow
            parts.append(R.PartitionResponse(partition_index=idx, error_code=0, active_producers=[
                R.ProducerState(producer_id=e.producer_id, producer_epoch=e.epoch, last_sequence=e.last_seq,
                                last_timestamp=e.last_timestamp, coordinator_epoch=e.coordinator_epoch,
                                current_txn_start_offset=e.current_txn_first_offset)
                for e in sorted(producers, key=lambda e: e.producer_id)
            ]))
        topics.append(R.TopicResponse(name=t.name, partitions=parts))
    return R(topics=topics)


@api(65, 0, 0)
async def describe_transactions(ctx: RequestContext, req) -> DescribeTransactionsResponse:
    R = DescribeTransactionsResponse
    out = []
    for tid in req.transactional_ids:
        code, meta = ctx.services.transaction_coordinator.describe(tid)
        if meta is None:
            out.append(R.TransactionState(error_code=code, transactional_id=tid, transaction_state="",
                                          transaction_start_time_ms=-1, producer_id=-1, producer_epoch=-1))
            continue
        by_topic: dict[str, list[int]] = defaultdict(list)
        for topic, partition in sorted(meta.partitions):
            by_topic[topic].append(partition)
        out.append(R.TransactionState(
            error_code=0, transactional_id=tid, transaction_state=meta.state.display,
            transaction_timeout_ms=meta.timeout_ms, transaction_start_time_ms=meta.start_ms,
            producer_id=meta.producer_id, producer_epoch=meta.producer_epoch,
            topics=[R.TopicData(topic=t, partitions=ps) for t, ps in by_topic.items()]))
    return R(transaction_states=out)


@api(66, 0, 2)
async def list_transactions(ctx: RequestContext, req) -> ListTransactionsResponse:
    R = ListTransactionsResponse
    pattern = None
    if req.transactional_id_pattern:
        try:
            pattern = re.compile(req.transactional_id_pattern)
        except re.error:
            return R(error_code=Errors.INVALID_REQUEST)
    code, txns = ctx.services.transaction_coordinator.listing()
    if code:
        return R(error_code=code)
    wanted = {STATES[n] for n in req.state_filters if n in STATES}
    unknown = [n for n in req.state_filters if n not in STATES]
    pids = set(req.producer_id_filters)
    now = int(time.time() * 1000)

    def include(m) -> bool:  # Kafka's filters, Kafka's arithmetic (a start time of -1 is long ago)
        return ((not pids or m.producer_id in pids)
                and (not req.state_filters or m.state in wanted)
                and (req.duration_filter < 0 or now - m.start_ms > req.duration_filter)
                and (pattern is None or pattern.fullmatch(m.transactional_id) is not None))

    return R(error_code=0, unknown_state_filters=unknown, transaction_states=[
        R.TransactionState(transactional_id=m.transactional_id, producer_id=m.producer_id,
                           transaction_state=m.state.display)
        for m in sorted(txns, key=lambda m: m.transactional_id) if include(m)
    ])
