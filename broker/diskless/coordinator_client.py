"""How a broker talks to the diskless coordinators: one request per coordinator broker, in
parallel; a coordinator on this broker is called directly, without the network (KIP-1164's last
optimization). The leader of partition N of `__diskless_metadata` is coordinator N, read from this
broker's metadata image.

DisklessCommitFile: a WAL file's batches split by coordinator broker (several coordinators on one
broker travel together). DisklessFindBatches and DisklessListOffsets: the lookups made in one turn
of the event loop (every diskless partition of a Fetch, which asks for them all before reading
any: ServedPartition.prepare_read; every partition of a ListOffsets) are gathered per target
broker and sent as one request each. FindBatches goes to a local replica of the coordinator's
partition when there is one (its SQLite may trail the leader by a moment), else to the leader;
ListOffsets always to the leader.

Errors come back as Kafka error codes per item; a peer that cannot be reached answers every item
of its request with an error (the caller's producer or consumer retries).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar
from uuid import UUID

import structlog

from broker.diskless.batches import BatchLookup, BatchResult, BatchRow, FoundBatches, ProducerInfo
from metadata.diskless import DISKLESS_METADATA_TOPIC
from node.client import ClientError
from protocol.errors import Errors
from protocol.generated.diskless_commit_file import DisklessCommitFileRequest
from protocol.generated.diskless_delete_records import DisklessDeleteRecordsRequest as DR
from protocol.generated.diskless_describe_files import DisklessDescribeFilesRequest as DF
from protocol.generated.diskless_describe_producers import DisklessDescribeProducersRequest as DP
from protocol.generated.diskless_find_batches import DisklessFindBatchesRequest as FB
from protocol.generated.diskless_hand_over_file import DisklessHandOverFileRequest as HO
from protocol.generated.diskless_list_offsets import DisklessListOffsetsRequest as LO

if TYPE_CHECKING:
    from broker.diskless.coordinator.coordinator import DisklessCoordinator
    from broker.ports import ImageSource, LocalReplicas
    from broker.replication.peers import PeerClients

log = structlog.get_logger(__name__)
REQUEST_TIMEOUT_S = 30.0
MAX_BATCHES_PER_PARTITION = 500
MAX_FETCH_BYTES = 2**31 - 1
# what a producer (or DeleteRecords) hears when the coordinator could not be reached or moved
RETRY_AS = {Errors.NOT_COORDINATOR: Errors.NOT_LEADER_OR_FOLLOWER,
            Errors.COORDINATOR_LOAD_IN_PROGRESS: Errors.NOT_LEADER_OR_FOLLOWER,
            Errors.COORDINATOR_NOT_AVAILABLE: Errors.NOT_LEADER_OR_FOLLOWER}

Item = TypeVar("Item")
Result = TypeVar("Result")


class RequestBatcher(Generic[Item, Result]):
    """Items asked for in one turn of the event loop, gathered per target broker: `send(target,
    items)` answers them all (one request), the targets in parallel. `failed(item)` is an item's
    answer when its request did not complete."""

    def __init__(self, send: Callable[[int, list[Item]], Awaitable[list[Result]]],
                 failed: Callable[[Item], Result]) -> None:
        self._send = send
        self._failed = failed
        self._pending: dict[int, list[tuple[Item, asyncio.Future]]] = {}
        self._tasks: set[asyncio.Task] = set()
        self._loop = asyncio.get_running_loop()

    def add(self, target: int, item: Item) -> asyncio.Future:
        fut = self._loop.create_future()
        if not self._pending:
            self._loop.call_soon(self._flush)
        self._pending.setdefault(target, []).append((item, fut))
        return fut

    def _flush(self) -> None:
        pending, self._pending = self._pending, {}
        for target, entries in pending.items():
            task = self._loop.create_task(self._run(target, entries))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _run(self, target: int, entries: list[tuple[Item, asyncio.Future]]) -> None:
        try:
            results = await self._send(target, [item for item, _ in entries])
            if len(results) == len(entries):
                for (_, fut), r in zip(entries, results):
                    if not fut.done():
                        fut.set_result(r)
        except Exception as e:  # every item answers with the failure below; the broker goes on
            log.warning("diskless_request_failed", target_broker=target, items=len(entries), error=repr(e))
        finally:
            for item, fut in entries:
                if not fut.done():
                    fut.set_result(self._failed(item))

    def close(self) -> None:
        for t in list(self._tasks):
            t.cancel()


class CoordinatorClient:
    def __init__(self, node_id: int, metadata: ImageSource, peers: PeerClients, local: DisklessCoordinator,
                 replicas: LocalReplicas) -> None:
        """`metadata`: the image (who leads each coordinator); `peers`: PeerClients("diskless");
        `local`: the broker's own DisklessCoordinator; `replicas`: which `__diskless_metadata`
        partitions are here."""
        self.node_id = node_id
        self.metadata = metadata
        self.peers = peers
        self.local = local
        self.replicas = replicas
        self._finds: RequestBatcher[BatchLookup, FoundBatches] = RequestBatcher(
            self._find_at, lambda _: FoundBatches(Errors.NOT_LEADER_OR_FOLLOWER, -1, -1, []))
        self._offsets: RequestBatcher[tuple[UUID, int, int, bool], tuple[int, int, int]] = RequestBatcher(
            self._list_offsets_at, lambda _: (Errors.NOT_LEADER_OR_FOLLOWER, -1, -1))
        self._epochs: RequestBatcher[tuple[UUID, int, int, int], tuple[int, int, int]] = RequestBatcher(
            self._epoch_ends_at, lambda _: (Errors.NOT_LEADER_OR_FOLLOWER, -1, -1))

    def close(self) -> None:
        self._finds.close()
        self._offsets.close()
        self._epochs.close()

    def coordinator_of(self, topic_id: UUID, partition: int) -> int:
        return self.local.coordinator_of(topic_id, partition)

    def leader_of(self, index: int) -> int:
        t = self.metadata.image.topic(DISKLESS_METADATA_TOPIC)
        info = t.partitions.get(index) if t is not None else None
        return -1 if info is None else info.leader

    def coordinator_brokers(self) -> dict[int, int] | None:
        """Every coordinator's leader (coordinator -> broker), or None when one has none (or the
        coordinators' topic does not exist yet)."""
        t = self.metadata.image.topic(DISKLESS_METADATA_TOPIC)
        if t is None or not t.partitions:
            return None
        out = {index: info.leader for index, info in t.partitions.items()}
        return None if any(b < 0 for b in out.values()) else out

    async def _send(self, broker_id: int, body: Any) -> Any:
        client = await self.peers.get(broker_id)
        try:
            return await client.request(body, 0, timeout=REQUEST_TIMEOUT_S)
        except ClientError:
            await self.peers.drop(broker_id)
            raise

    # ------------------------------------------------------------------ commit
    async def commit(self, req: DisklessCommitFileRequest) -> tuple[list[BatchResult], list[int]]:
        """Commit one WAL file: its batches split by coordinator broker, sent in parallel; one
        result per batch in request order, and the coordinator brokers asked (one commit request
        each; this broker's own coordinators are a call)."""
        by_broker: dict[int, list[int]] = {}
        results: list[BatchResult | None] = [None] * len(req.batches)
        coordinators: set[int] = set()
        for i, b in enumerate(req.batches):
            index = self.coordinator_of(b.topic_id, b.partition_index)
            leader = self.leader_of(index) if index >= 0 else -1
            if leader < 0:
                results[i] = BatchResult(Errors.NOT_LEADER_OR_FOLLOWER, "no diskless coordinator for the partition")
                continue
            by_broker.setdefault(leader, []).append(i)
            coordinators.add(index)
        # KIP-1164's owner list: every coordinator the file's batches go to, randomly permuted
        # (the first owns the file; each hands it to the next once its batches in it are gone)
        owners = random.sample(sorted(coordinators), len(coordinators))

        async def one(broker_id: int, positions: list[int]) -> None:
            sub = DisklessCommitFileRequest(object_key=req.object_key, object_format=req.object_format,
                                            file_size=req.file_size, owner_ids=owners,
                                            batches=[req.batches[i] for i in positions])
            try:
                if broker_id == self.node_id:
                    answers = await self.local.commit_file(sub, self.node_id)
                else:
                    resp = await self._send(broker_id, sub)
                    answers = [BatchResult(r.error_code, r.error_message, r.assigned_base_offset, r.log_append_time,
                                           r.log_start_offset, r.is_duplicate) for r in resp.batches]
            except (ClientError, OSError) as e:
                log.warning("diskless_commit_failed", coordinator_broker=broker_id, key=req.object_key, error=str(e))
                # the outcome is unknown (it may have committed): a retriable error that is no refusal
                answers = [BatchResult(Errors.REQUEST_TIMED_OUT, str(e)) for _ in positions]
            if len(answers) != len(positions):
                answers = [BatchResult(Errors.UNKNOWN_SERVER_ERROR, "commit answer size mismatch") for _ in positions]
            for i, a in zip(positions, answers):
                results[i] = a

        await asyncio.gather(*(one(b, ps) for b, ps in by_broker.items()))
        return [r if r is not None else BatchResult(Errors.UNKNOWN_SERVER_ERROR) for r in results], sorted(by_broker)

    # ------------------------------------------------------------------ deletion
    async def delete_records(self, topic_id: UUID, partition: int, offset: int) -> tuple[int, int]:
        """DisklessDeleteRecords at the partition's coordinator leader: (error, low watermark)."""
        index = self.coordinator_of(topic_id, partition)
        leader = self.leader_of(index) if index >= 0 else -1
        if leader < 0:
            return Errors.NOT_LEADER_OR_FOLLOWER, -1
        if leader == self.node_id:
            code, low = await self.local.delete_records(topic_id, partition, offset)
        else:
            body = DR(topics=[DR.DisklessDeleteRecordsTopic(topic_id=topic_id, partitions=[
                DR.DisklessDeleteRecordsPartition(partition_index=partition, offset=offset)])])
            try:
                resp = await self._send(leader, body)
                answer = resp.topics[0].partitions[0]
                code, low = answer.error_code, answer.low_watermark
            except (ClientError, OSError, IndexError) as e:
                log.info("diskless_delete_records_failed", coordinator_broker=leader, error=str(e))
                return Errors.REQUEST_TIMED_OUT, -1
        return RETRY_AS.get(code, code), low

    async def describe_producers(self, topic_id: UUID, partition: int) -> tuple[int, list[ProducerInfo]]:
        """DisklessDescribeProducers at the partition's coordinator leader: (error, producers)."""
        index = self.coordinator_of(topic_id, partition)
        leader = self.leader_of(index) if index >= 0 else -1
        if leader < 0:
            return Errors.NOT_LEADER_OR_FOLLOWER, []
        if leader == self.node_id:
            code, found = await self.local.describe_producers(topic_id, partition)
            return RETRY_AS.get(code, code), found
        body = DP(topics=[DP.DisklessDescribeProducersTopic(topic_id=topic_id, partition_indexes=[partition])])
        try:
            answer = (await self._send(leader, body)).topics[0].partitions[0]
        except (ClientError, OSError, IndexError) as e:
            log.info("diskless_describe_producers_failed", coordinator_broker=leader, error=str(e))
            return Errors.REQUEST_TIMED_OUT, []
        return RETRY_AS.get(answer.error_code, answer.error_code), [
            ProducerInfo(a.producer_id, a.producer_epoch, a.last_sequence, a.last_timestamp, a.coordinator_epoch,
                         a.current_txn_start_offset) for a in answer.active_producers]

    # ------------------------------------------------------------------ WAL file lifecycle
    async def hand_over(self, to_index: int, object_key: str, size: int, owners: list[int], from_index: int) -> int:
        """DisklessHandOverFile to coordinator `to_index`'s leader: 0 once its log holds it."""
        leader = self.leader_of(to_index)
        if leader < 0:
            return Errors.COORDINATOR_NOT_AVAILABLE
        if leader == self.node_id:
            return await self.local.files.hand_over(to_index, object_key, size, owners, from_index)
        try:
            resp = await self._send(leader, HO(object_key=object_key, file_size=size, owner_ids=list(owners),
                                               from_coordinator=from_index, to_coordinator=to_index))
        except (ClientError, OSError) as e:
            log.debug("diskless_hand_over_failed", coordinator_broker=leader, key=object_key, error=str(e))
            return Errors.REQUEST_TIMED_OUT
        return resp.error_code

    async def describe_files(self, broker_id: int, keys: list[str], details: bool = False) -> Any:
        """DisklessDescribeFiles answered by the coordinators `broker_id` leads (raises
        ClientError / OSError when it cannot be reached)."""
        if broker_id == self.node_id:
            return await self.local.describe_files(keys, details)
        return await self._send(broker_id, DF(files=[DF.DisklessDescribeFileEntry(object_key=k) for k in keys],
                                              details=details))

    # ------------------------------------------------------------------ reads
    def find_batches(self, topic_id: UUID, partition: int, offset: int, max_bytes: int,
                     read_committed: bool = False) -> Awaitable[FoundBatches]:
        """The batches of a diskless partition from `offset` on (up to `max_bytes`, at least one;
        read_committed: below the last stable offset, with the aborted transactions), its log
        start and high watermark; sent with the other lookups of this turn of the loop."""
        index = self.coordinator_of(topic_id, partition)
        if index < 0:
            return _now(FoundBatches(Errors.UNKNOWN_TOPIC_OR_PARTITION, -1, -1, []))
        if self.replicas.get(DISKLESS_METADATA_TOPIC, index) is not None:
            target = self.node_id
        else:
            target = self.leader_of(index)
            if target < 0:
                return _now(FoundBatches(Errors.NOT_LEADER_OR_FOLLOWER, -1, -1, []))
        return self._finds.add(target, BatchLookup(topic_id, partition, offset, max_bytes, read_committed))

    async def _find_at(self, broker_id: int, lookups: list[BatchLookup]) -> list[FoundBatches]:
        if broker_id == self.node_id:
            return await self.local.find_batches(lookups, MAX_BATCHES_PER_PARTITION)
        by_topic: dict[UUID, list[int]] = {}
        for i, lk in enumerate(lookups):
            by_topic.setdefault(lk.topic_id, []).append(i)
        order = [i for positions in by_topic.values() for i in positions]
        body = FB(fetch_max_bytes=min(sum(lk.max_bytes for lk in lookups), MAX_FETCH_BYTES),
                  max_batches_per_partition=MAX_BATCHES_PER_PARTITION, topics=[
                      FB.DisklessFindBatchesTopic(topic_id=tid, partitions=[FB.DisklessFindBatchesPartition(
                          partition_index=lookups[i].partition, offset=lookups[i].offset,
                          max_partition_fetch_bytes=lookups[i].max_bytes, read_committed=lookups[i].read_committed)
                          for i in positions])
                      for tid, positions in by_topic.items()])
        try:
            resp = await self._send(broker_id, body)
        except (ClientError, OSError) as e:
            log.debug("diskless_find_batches_failed", coordinator_broker=broker_id, error=str(e))
            return [FoundBatches(Errors.NOT_LEADER_OR_FOLLOWER, -1, -1, []) for _ in lookups]
        answers = [p for t in resp.topics for p in t.partitions]
        if len(answers) != len(lookups):
            return [FoundBatches(Errors.UNKNOWN_SERVER_ERROR, -1, -1, []) for _ in lookups]
        found: list[FoundBatches] = [FoundBatches(Errors.UNKNOWN_SERVER_ERROR, -1, -1, [])] * len(lookups)
        for i, p in zip(order, answers):
            found[i] = FoundBatches(p.error_code, p.log_start_offset, p.high_watermark, [
                BatchRow(b.batch_id, b.object_key, b.magic, b.byte_offset, b.byte_size, b.base_offset,
                         b.last_offset, b.log_append_timestamp, b.batch_max_timestamp, b.timestamp_type)
                for b in p.batches], p.last_stable_offset,
                [(a.producer_id, a.first_offset) for a in p.aborted_transactions] if lookups[i].read_committed else None)
        return found

    def list_offsets(self, topic_id: UUID, partition: int, timestamp: int,
                     read_committed: bool = False) -> Awaitable[tuple[int, int, int]]:
        """(error, timestamp, offset) from the coordinator's leader (strictly consistent; "latest"
        is the last stable offset for a read_committed asker); sent with the other lookups of
        this turn of the loop."""
        index = self.coordinator_of(topic_id, partition)
        leader = self.leader_of(index) if index >= 0 else -1
        if leader < 0:
            return _now((Errors.NOT_LEADER_OR_FOLLOWER, -1, -1))
        return self._offsets.add(leader, (topic_id, partition, timestamp, read_committed))

    async def _list_offsets_at(self, broker_id: int,
                               asks: list[tuple[UUID, int, int, bool]]) -> list[tuple[int, int, int]]:
        if broker_id == self.node_id:
            return list(await asyncio.gather(*(self.local.list_offsets(*ask) for ask in asks)))
        return await self._ask_list_offsets(
            broker_id, asks,
            lambda a: LO.DisklessListOffsetsPartition(partition_index=a[1], timestamp=a[2], read_committed=a[3]),
            lambda p: (p.error_code, p.timestamp, p.offset))

    async def _ask_list_offsets(self, broker_id: int, asks: list[Any], entry: Callable[[Any], Any],
                                answer: Callable[[Any], tuple[int, int, int]]) -> list[tuple[int, int, int]]:
        """One DisklessListOffsets to `broker_id` for `asks` (topic id first), grouped by topic:
        `entry` is an ask's partition entry, `answer` its result from the partition answered."""
        by_topic: dict[UUID, list[int]] = {}
        for i, (tid, *_) in enumerate(asks):
            by_topic.setdefault(tid, []).append(i)
        order = [i for positions in by_topic.values() for i in positions]
        body = LO(topics=[LO.DisklessListOffsetsTopic(topic_id=tid, partitions=[entry(asks[i]) for i in positions])
                          for tid, positions in by_topic.items()])
        try:
            resp = await self._send(broker_id, body)
        except (ClientError, OSError):
            return [(Errors.NOT_LEADER_OR_FOLLOWER, -1, -1) for _ in asks]
        answers = [p for t in resp.topics for p in t.partitions]
        if len(answers) != len(asks):
            return [(Errors.UNKNOWN_SERVER_ERROR, -1, -1) for _ in asks]
        out: list[tuple[int, int, int]] = [(Errors.UNKNOWN_SERVER_ERROR, -1, -1)] * len(asks)
        for i, p in zip(order, answers):
            out[i] = answer(p)
        return out


    def epoch_end(self, topic_id: UUID, partition: int, epoch: int,
                  current_epoch: int = -1) -> Awaitable[tuple[int, int, int]]:
        """OffsetForLeaderEpoch of a diskless partition: (error, epoch, end offset) from its
        coordinator's leader, where its epochs start and end (strictly consistent, as ListOffsets);
        `current_epoch` (the asker's) is checked there. Sent with the other lookups of this turn."""
        index = self.coordinator_of(topic_id, partition)
        leader = self.leader_of(index) if index >= 0 else -1
        if leader < 0:
            return _now((Errors.NOT_LEADER_OR_FOLLOWER, -1, -1))
        return self._epochs.add(leader, (topic_id, partition, epoch, current_epoch))

    async def _epoch_ends_at(self, broker_id: int,
                             asks: list[tuple[UUID, int, int, int]]) -> list[tuple[int, int, int]]:
        if broker_id == self.node_id:
            found = await asyncio.gather(*(self.local.epoch_end(*ask) for ask in asks))
            return [(RETRY_AS.get(code, code), epoch, end) for code, epoch, end in found]
        return await self._ask_list_offsets(
            broker_id, asks,
            lambda a: LO.DisklessListOffsetsPartition(partition_index=a[1], timestamp=-1, leader_epoch=a[2],
                                                      current_leader_epoch=a[3]),
            lambda p: (RETRY_AS.get(p.error_code, p.error_code), p.leader_epoch, p.offset))


def _now(value: Any) -> asyncio.Future:
    fut = asyncio.get_running_loop().create_future()
    fut.set_result(value)
    return fut
