"""OrderedProducer: keyed records stay in order while the topic's partition count changes.

Each record's partition is `partition_for(key, undeleted_partition_count)` and every Produce
carries that count (tagged field); a broker with another count answers
INVALID_PARTITION_METADATA, the producer refreshes its metadata, partitions the refused records
again over the new count and resends them, still in send() order.

One sender task sends rounds: the pending records, at most one batch per partition, one request
per leader, all answered before the next round starts. Records of one key therefore go out in
order and are refused or taken together. Idempotent: a producer id from InitProducerId and
per-partition sequences, so a resent batch is never written twice; a count change takes a new
producer id (a partition re-created under an old index starts without producer state).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from client.cluster import ClusterClient, StrataClientError, kafka_error
from client.logs import get_logger
from client.partitioner import partition_for
from node.causes import cause
from node.client import ClientError
from protocol.errors import ERRORS, Errors, error_name
from protocol.generated.init_producer_id import InitProducerIdRequest
from protocol.generated.produce import ProduceRequest
from protocol.records import Record, encode_batch

log = get_logger(__name__)

P = ProduceRequest
# Resending with a new producer id: the broker holds nothing for the old one's sequences.
_NEW_PRODUCER = {Errors.OUT_OF_ORDER_SEQUENCE_NUMBER, Errors.UNKNOWN_PRODUCER_ID, Errors.INVALID_PRODUCER_EPOCH}


@dataclass
class RecordMetadata:
    topic: str
    partition: int
    offset: int


@dataclass
class _Pending:
    topic: str
    key: bytes
    value: bytes | None
    future: asyncio.Future
    deadline: float
    timestamp: int  # CreateTime, ms since the epoch


class OrderedProducer:
    """aiokafka-style: `await start()`, `await send(...)` (a future), `await send_and_wait(...)`,
    `await flush()`, `await stop()`. Keys are required (they decide the partition)."""

    def __init__(
        self,
        bootstrap_servers: str | list[str],
        *,
        client_id: str = "strata-ordered-producer",
        request_timeout_ms: int = 30000,
        delivery_timeout_ms: int = 120000,
        max_batch_records: int = 500,
        retry_backoff_ms: int = 100,
    ) -> None:
        self._cluster = ClusterClient(bootstrap_servers, client_id, request_timeout_ms / 1000)
        self._timeout_ms = request_timeout_ms
        self._delivery_timeout = delivery_timeout_ms / 1000
        self._max_batch = max_batch_records
        self._backoff = retry_backoff_ms / 1000
        self._queue: list[_Pending] = []
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task | None = None
        self._pid, self._epoch = -1, -1
        self._seq: dict[tuple[str, int], int] = {}
        self._counts: dict[str, int] = {}
        self._closed = False
        self._last_error = ""  # why the last round or retriable answer failed: a timed-out record says it

    async def start(self) -> None:
        await self._new_producer_id()
        self._task = asyncio.get_running_loop().create_task(self._sender())

    async def stop(self) -> None:
        """Send what is pending, then close."""
        if self._task is not None and not self._task.done():
            await self.flush()
            self._closed = True
            self._wake.set()
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        await self._cluster.close()

    async def send(
        self, topic: str, value: bytes | None, key: bytes, timestamp_ms: int | None = None
    ) -> asyncio.Future:
        """Queue a record; the returned future gives its RecordMetadata once written (acks=all).
        The record's CreateTime is `timestamp_ms`, else now (as every Kafka producer stamps it):
        the broker's segment.ms rolls and retention.ms count in record time."""
        if key is None:
            raise ValueError("OrderedProducer needs a key: it decides the partition")
        if self._task is None or self._closed:
            raise StrataClientError("the producer is not started")
        fut = asyncio.get_running_loop().create_future()
        stamp = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
        self._queue.append(_Pending(topic, key, value, fut, time.monotonic() + self._delivery_timeout, stamp))
        self._idle.clear()
        self._wake.set()
        return fut

    async def send_and_wait(
        self, topic: str, value: bytes | None, key: bytes, timestamp_ms: int | None = None
    ) -> RecordMetadata:
        return await (await self.send(topic, value, key, timestamp_ms))

    async def flush(self) -> None:
        await self._idle.wait()

    # ---- sending
    async def _new_producer_id(self) -> None:
        resp = await self._cluster.any_request(InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=-1))
        if resp.error_code:
            raise StrataClientError(f"InitProducerId failed: {kafka_error(resp.error_code)}")
        self._pid, self._epoch = resp.producer_id, resp.producer_epoch
        self._seq.clear()

    async def _refresh(self, topics: set[str]) -> None:
        metas = await self._cluster.refresh(sorted(topics))
        changed = False
        for t in topics:
            if t in metas:
                changed |= self._counts.get(t, metas[t].undeleted_count) != metas[t].undeleted_count
                self._counts[t] = metas[t].undeleted_count
        if changed:
            await self._new_producer_id()

    async def _sender(self) -> None:
        while True:
            if not self._queue:
                self._idle.set()
                self._wake.clear()
                await self._wake.wait()
                continue
            pending, self._queue = self._queue, []
            try:
                retry = await self._round(pending)
            except (ClientError, StrataClientError, OSError) as e:
                self._last_error = cause(e)
                log.info("ordered_producer_round_failed", error=self._last_error)
                retry = pending
            now = time.monotonic()
            alive = []
            for r in retry:
                if now > r.deadline:
                    if not r.future.done():
                        r.future.set_exception(StrataClientError(
                            f"record to {r.topic} not delivered within delivery_timeout_ms "
                            f"({self._delivery_timeout * 1000:.0f}): {self._last_error or 'no answer'}"))
                else:
                    alive.append(r)
            self._queue = alive + self._queue  # refused records go first: send() order holds
            if alive:
                await asyncio.sleep(self._backoff)
                try:
                    await self._refresh({r.topic for r in alive})
                except (ClientError, StrataClientError, OSError) as e:
                    log.info("ordered_producer_refresh_failed", error=str(e))

    async def _round(self, pending: list[_Pending]) -> list[_Pending]:
        """Send one round; returns the records to send again."""
        topics = {r.topic for r in pending}
        if any(t not in self._counts for t in topics):
            await self._refresh(topics)
        batches: dict[tuple[str, int], list[_Pending]] = {}
        retry: list[_Pending] = []
        for r in pending:
            count = self._counts[r.topic]
            tp = (r.topic, partition_for(r.key, count))
            batch = batches.setdefault(tp, [])
            if len(batch) < self._max_batch:
                batch.append(r)
            else:
                retry.append(r)  # next round, behind this one's records of the same key
        by_leader: dict[int, list[tuple[str, int]]] = {}
        for tp in batches:
            leader = self._cluster.topics[tp[0]].partitions[tp[1]].leader
            by_leader.setdefault(leader, []).append(tp)
        results = await asyncio.gather(
            *(self._send(leader, tps, batches) for leader, tps in by_leader.items()), return_exceptions=True
        )
        for (leader, tps), res in zip(by_leader.items(), results):
            if isinstance(res, BaseException):
                log.info("ordered_producer_send_failed", broker=leader, error=str(res))
                retry.extend(r for tp in tps for r in batches[tp])
            else:
                retry.extend(res)
        order = {id(r): i for i, r in enumerate(pending)}
        retry.sort(key=lambda r: order[id(r)])
        return retry

    async def _send(self, leader: int, tps: list[tuple[str, int]], batches: dict) -> list[_Pending]:
        if leader < 0:
            return [r for tp in tps for r in batches[tp]]
        by_topic: dict[str, list] = {}
        for tp in tps:
            recs = batches[tp]
            data = encode_batch(
                [Record(value=r.value, key=r.key, timestamp=r.timestamp) for r in recs],
                producer_id=self._pid,
                producer_epoch=self._epoch,
                base_sequence=self._seq.get(tp, 0),
            )
            by_topic.setdefault(tp[0], []).append(P.PartitionProduceData(index=tp[1], records=data))
        req = P(
            acks=-1,
            timeout_ms=self._timeout_ms,
            topic_data=[
                P.TopicProduceData(name=t, partition_data=parts, undeleted_partition_count=self._counts[t])
                for t, parts in by_topic.items()
            ],
        )
        resp = await self._cluster.request(leader, req)
        retry = []
        new_producer = False
        for tr in resp.responses:
            for pr in tr.partition_responses:
                tp = (tr.name, pr.index)
                recs = batches[tp]
                if pr.error_code in (0, Errors.DUPLICATE_SEQUENCE_NUMBER):
                    self._seq[tp] = self._seq.get(tp, 0) + len(recs)
                    for i, r in enumerate(recs):
                        if not r.future.done():
                            r.future.set_result(RecordMetadata(tp[0], tp[1], pr.base_offset + i))
                    continue
                err = ERRORS.get(pr.error_code)
                if pr.error_code in _NEW_PRODUCER:
                    new_producer = True
                elif err is None or not err.retriable:
                    for r in recs:
                        if not r.future.done():
                            r.future.set_exception(
                                StrataClientError(f"produce to {tp[0]}-{tp[1]}: "
                                                  f"{kafka_error(pr.error_code, pr.error_message)}")
                            )
                    continue
                self._last_error = f"produce to {tp[0]}-{tp[1]}: {kafka_error(pr.error_code, pr.error_message)}"
                log.debug("ordered_producer_retry", topic=tp[0], partition=tp[1], error=error_name(pr.error_code))
                retry.extend(recs)
        if new_producer:
            await self._new_producer_id()
        return retry
