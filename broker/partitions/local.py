"""A local chunk replica behind the partition interface: the active chunk's leader (or, for
followers' fetches and debugging readers, a replica) appends, reads file bytes and answers offsets;
the inactive chunks are consulted through ChunkReads for earliest / by-time / max-time offsets."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

import structlog

from broker.partitions.interface import AppendAnswer, FetchPosition, OffsetAnswer, ReadAnswer, answered
from broker.storage.batch_validation import first_record_without_key
from broker.storage.errors import ResourceExhaustedError, StorageError
from node.client import ClientError
from node.waits import Eventual
from protocol.errors import Errors
from protocol.generated.alter_chunk_assignments import AlterChunkAssignmentsRequest

if TYPE_CHECKING:
    from broker.metrics import TopicStats
    from broker.ports import Forwarder, ImageSource
    from broker.replication.chunk_reads import ChunkReads
    from broker.replication.partition import Partition
    from broker.replication.replica_manager import ReplicaManager
    from metadata.image import ChunkInfo

log = structlog.get_logger(__name__)
LATEST, EARLIEST, MAX_TIMESTAMP, EARLIEST_LOCAL, LATEST_TIERED = -1, -2, -3, -4, -5


class LocalDeps:
    """What a local partition view uses, built once by the router and shared by every view."""

    __slots__ = ("replicas", "images", "topic_stats", "chunk_reads", "forward")

    def __init__(self, replicas: ReplicaManager, images: ImageSource, topic_stats: TopicStats, chunk_reads: ChunkReads,
                 forward: Forwarder) -> None:
        self.replicas = replicas
        self.images = images
        self.topic_stats = topic_stats
        self.chunk_reads = chunk_reads  # the partition's offsets in its inactive chunks
        self.forward = forward  # AlterChunkAssignments to the controller (DeleteRecords below the active chunk)


PIPELINED_APPEND_MAX_BYTES = 64 * 1024  # as the admission's large-request threshold


class LocalPartition:
    __slots__ = ("deps", "p")

    def __init__(self, deps: LocalDeps, partition: Partition) -> None:
        self.deps = deps
        self.p = partition

    def pipelines_appends(self, acks: int, size: int) -> bool:
        # acks=all waits for replication only: a pipelining client's next request appends
        # meanwhile and rides the same follower Fetch (Kafka mutes the connection instead, so
        # each request there pays a whole replication round trip). Small appends only: a bulk
        # producer's megabytes pipelined raised small sends' p99 beside it at RF 3 (15 ms
        # against 12, bench/latency_under_load.py), so large ones keep Kafka's muting.
        return acks == -1 and size < PIPELINED_APPEND_MAX_BYTES

    # ------------------------------------------------------------------ produce
    def append(self, records: Any, acks: int, timeout_ms: int, now_ms: int) -> Awaitable[AppendAnswer]:
        """Validate and append now (before any await); the result waits for the high watermark
        when acks=all. Compacted topics refuse records without a key (INVALID_RECORD), as Kafka."""
        deps, p = self.deps, self.p
        rm = deps.replicas
        name = p.topic
        if p.sealed:
            return answered(AppendAnswer(Errors.NOT_LEADER_OR_FOLLOWER, "a new chunk is being created for this partition"))
        if records is None or len(records) == 0:
            return answered(AppendAnswer(Errors.CORRUPT_MESSAGE, "produce request holds no records"))
        min_isr = 1
        if acks == -1:
            min_isr = int(rm.topic_config(name)["min.insync.replicas"])
            if len(p.isr) < min_isr:
                return self._short_of_replicas(records, min_isr, timeout_ms)
        if p.log.config.compact:  # the log's config follows the topic's (update_config)
            bad = first_record_without_key(records)
            if bad is not None:
                msg = f"Compacted topic cannot accept message without key in topic partition {name}-{p.index}."
                return answered(AppendAnswer(Errors.INVALID_RECORD, msg, record_errors=[(bad, msg)]))
        try:
            info = p.log.append_as_leader(records, p.leader_epoch, now_ms)
        except StorageError as e:
            if not isinstance(e, ResourceExhaustedError):  # that one has its own rate-limited line
                log.warning("produce_rejected", topic=name, partition=p.index, error=str(e))
            return answered(AppendAnswer(e.error_code, str(e), record_errors=list(e.record_errors)))
        answer = AppendAnswer(0, None, info.first_offset, info.log_append_time, p.log.log_start_offset)
        deps.topic_stats.produced(name, info.last_offset - info.first_offset + 1, len(records))
        p.notify_appended()
        p.maybe_advance_high_watermark()
        # already replicated (a single in-sync replica): answer now, without a task per wait
        if acks != -1 or p.log.high_watermark >= info.last_offset + 1:
            return answered(answer)
        return self._replicated(answer, info.last_offset + 1, max(timeout_ms, 0) / 1000, min_isr)

    def _short_of_replicas(self, records: Any, min_isr: int, timeout_ms: int) -> Awaitable[AppendAnswer]:
        """acks=all while the ISR is smaller than min.insync.replicas: nothing is written
        (NOT_ENOUGH_REPLICAS, as Kafka), except that a retry of a batch the log holds already is
        answered with its first offsets once the ISR has grown back. Kafka refuses that retry too,
        telling the client the batch was not written; librdkafka then re-sends it under a bumped
        epoch, a duplicate, as soon as a later batch of the producer fails its sequence check."""
        p = self.p
        dup = p.log.duplicate_of(records)
        if dup is None:
            return answered(AppendAnswer(Errors.NOT_ENOUGH_REPLICAS,
                                         f"ISR has {len(p.isr)} replicas, min.insync.replicas is {min_isr}"))
        answer = AppendAnswer(0, None, dup.first_offset, dup.log_append_time, dup.log_start_offset)
        return self._replicated(answer, dup.last_offset + 1, max(timeout_ms, 0) / 1000, min_isr)

    def _replicated(self, answer: AppendAnswer, end: int, timeout: float, min_isr: int) -> Eventual:
        """The answer once the high watermark passes `end`, set in the call that moves it. Written
        but the ISR shrank below min.insync.replicas meanwhile: NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        as Kafka's DelayedProduce (a client retries it; the retry waits above for the ISR)."""
        p = self.p

        def settled(replicated: bool) -> AppendAnswer:
            if not replicated:
                # a replica no longer served here (reassigned away, its dir failed) lost leadership:
                # NOT_LEADER_OR_FOLLOWER tells an idempotent producer the batch was not persisted
                still = p.is_leader and self.deps.replicas.get(p.topic, p.index) is p
                answer.error_code = Errors.REQUEST_TIMED_OUT if still else Errors.NOT_LEADER_OR_FOLLOWER
            elif p.maximal_isr_size < min_isr:
                answer.error_code = Errors.NOT_ENOUGH_REPLICAS_AFTER_APPEND
            return answer

        if p.maximal_isr_size < min_isr:  # a retried batch: answered once the ISR holds min.insync.replicas again
            return p.in_sync_eventual(end, min_isr, timeout).map(settled)
        return p.high_watermark_eventual(end, timeout).map(settled)

    # ------------------------------------------------------------------ fetch
    def prepare_read(self, pos: FetchPosition) -> bool:
        return False  # everything read() needs is here: it reads without waiting

    async def read(self, pos: FetchPosition) -> ReadAnswer:
        return self.read_now(pos)

    def read_now(self, pos: FetchPosition) -> ReadAnswer:
        """File bytes from fetch_offset: to the high watermark (the last stable offset for
        read_committed consumers, with the aborted transactions overlapping them), to the log end
        for followers, whose fetch also moves their state here (KIP-595 divergence first)."""
        p = self.p
        lg = p.log
        is_follower = pos.replica_id >= 0
        diverging = None
        if is_follower and pos.last_fetched_epoch >= 0:
            # KIP-595 / KIP-320: does the follower's log agree with ours up to fetch_offset?
            epoch, end = lg.leader_epoch_cache.end_offset_for(pos.last_fetched_epoch, lg.log_end_offset)
            if end < pos.fetch_offset or epoch < pos.last_fetched_epoch:
                diverging = (epoch, end)
        if is_follower and diverging is None:
            p.update_follower(pos.replica_id, pos.fetch_offset)
        hw = p.high_watermark
        lso = lg.last_stable_offset
        read_committed = not is_follower and pos.read_committed
        limit = None if is_follower else (lso if read_committed else hw)
        # As Kafka: a list (maybe empty) for read_committed consumers, null for the others.
        ans = ReadAnswer(high_watermark=hw, last_stable_offset=lso, log_start_offset=lg.log_start_offset,
                         aborted_transactions=[] if read_committed else None)
        if diverging is not None:
            ans.diverging = diverging
        elif pos.fetch_offset > (leo := lg.log_end_offset) or pos.fetch_offset < lg.log_start_offset:
            ans.error_code = Errors.OFFSET_OUT_OF_RANGE
        elif pos.fetch_offset >= (leo if limit is None else limit):
            ans.wait = True  # nothing to read yet (a caught-up follower's Fetch, mostly): no log read
        else:
            try:
                fi = lg.read(pos.fetch_offset, pos.max_bytes, max_offset=limit, min_one_batch=pos.min_one_batch,
                             regions=True)
            except StorageError as e:
                ans.error_code = e.error_code
            else:
                if fi.total_bytes:
                    ans.records, ans.size = fi.records, fi.total_bytes
                    if read_committed:
                        ans.aborted_transactions = list(lg.aborted_transactions(pos.fetch_offset, fi.end_offset))
                else:
                    ans.wait = True
        return ans

    def add_data_waiter(self, fut: asyncio.Future, follower: bool = False) -> None:
        self.p.add_data_waiter(fut, follower)

    async def epoch_end_offset(self, leader_epoch: int, consumer: bool,
                               current_leader_epoch: int = -1) -> tuple[int, int, int]:
        lg = self.p.log
        epoch, end = lg.leader_epoch_cache.end_offset_for(leader_epoch, lg.log_end_offset)
        if consumer and end > self.p.high_watermark:
            end = self.p.high_watermark  # consumers never see past the high watermark
        return 0, epoch, end

    # ------------------------------------------------------------------ list offsets
    async def offset_for(self, timestamp: int, read_committed: bool) -> OffsetAnswer:
        """Earliest, latest (HW; the LSO for read_committed), max timestamp, or the first offset at
        or after a time (below what the isolation level may read); the inactive chunks first."""
        chunk_reads, p = self.deps.chunk_reads, self.p
        lg = p.log
        ts = timestamp
        name, idx = p.topic, p.index
        readable = lg.last_stable_offset if read_committed else p.high_watermark
        chunked = bool(chunk_reads.chunked(name, idx))
        ans = OffsetAnswer()
        if ts == EARLIEST and chunked:
            earliest = await chunk_reads.earliest(name, idx)
            ans.offset = lg.log_start_offset if earliest is None else earliest
        elif ts in (EARLIEST, EARLIEST_LOCAL):
            ans.offset = lg.log_start_offset
        elif ts == LATEST:
            ans.offset = readable
        elif ts == LATEST_TIERED:
            ans.offset = -1
        elif ts == MAX_TIMESTAMP:
            ans.timestamp, ans.offset = lg.max_timestamp()
            found = await chunk_reads.max_timestamp(name, idx) if chunked else None
            if found is not None and found[1] >= ans.timestamp:  # a tie goes to the older record
                ans.offset, ans.timestamp = found
        elif ts < 0:
            ans.error_code = Errors.INVALID_REQUEST
            return ans
        else:
            found = None
            if chunked:  # the inactive chunks come first (each skipped if all its records are older)
                found = await chunk_reads.offset_for_timestamp(name, idx, ts)
            if found is None:
                found = lg.offset_for_timestamp(ts)
            if found is not None and found[0] < readable:
                ans.offset, ans.timestamp = found
        if ans.offset >= 0:
            ans.leader_epoch = p.leader_epoch
        return ans

    # ------------------------------------------------------------------ delete records
    async def delete_records(self, offset: int) -> tuple[int, int]:
        """On the active chunk's leader. Below the active chunk, whole inactive chunks the offset
        passes are dropped: every replica leaves them (AlterChunkAssignments with LeavingBrokerId,
        the report a replica sends when retention emptied it), and the controller removes a chunk
        with no replicas left. A chunk the offset cuts through gets it as its log start offset
        (AlterChunkAssignments with LogStartOffset, kept in the metadata): reads below it answer
        OFFSET_OUT_OF_RANGE at once, and each replica deletes what lies below it."""
        deps, p = self.deps, self.p
        offset = p.high_watermark if offset == -1 else offset
        if offset < 0 or offset > p.high_watermark:
            return Errors.OFFSET_OUT_OF_RANGE, -1
        topic = deps.images.image.topic(p.topic)
        chunks = topic.chunks.get(p.index, ()) if topic is not None else ()
        gone = [c for c in chunks if c.end_offset < offset]
        if gone:
            code = await _drop_chunks(deps.forward, p.topic, p.index, gone)
            if code:
                return code, -1
        cut = [c for c in chunks if c.first_offset < offset <= c.end_offset]
        if cut:
            code = await _cut_chunk(deps.forward, p.topic, p.index, cut[0], offset)
            if code:
                return code, -1
        try:
            low = p.log.delete_records_before(offset)
        except StorageError as e:
            return e.error_code, -1
        return 0, low if offset >= p.log.log_start_offset else offset


async def _cut_chunk(forward: Forwarder, topic: str, partition: int, chunk: ChunkInfo, offset: int) -> int:
    AC = AlterChunkAssignmentsRequest
    entry = AC.AlterChunkAssignment(topic_name=topic, partition_id=partition, start_offset=chunk.start_offset,
                                    chunk_epoch=-1, broker_ids=[], log_start_offset=offset)
    try:
        resp = await forward(AC(chunks=[entry]), 0)
    except ClientError:
        return Errors.REQUEST_TIMED_OUT
    return resp.results[0].error_code if resp.results else Errors.UNKNOWN_SERVER_ERROR


async def _drop_chunks(forward: Forwarder, topic: str, partition: int, chunks: list[ChunkInfo]) -> int:
    AC = AlterChunkAssignmentsRequest
    entries = [
        AC.AlterChunkAssignment(topic_name=topic, partition_id=partition, start_offset=c.start_offset,
                                chunk_epoch=-1, broker_ids=[], leaving_broker_id=r)
        for c in chunks for r in c.replicas
    ]
    try:
        resp = await forward(AC(chunks=entries), 0)
    except ClientError:
        return Errors.REQUEST_TIMED_OUT
    # INVALID_REQUEST: a replica or the chunk left already (retention got there first)
    bad = [r.error_code for r in resp.results if r.error_code not in (0, Errors.INVALID_REQUEST)]
    return bad[0] if bad else 0
