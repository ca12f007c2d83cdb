"""How a broker talks to the diskless coordinators: one request per coordinator broker (batches of
several coordinators on one broker travel together), in parallel; a coordinator on this broker is
called directly, without the network (the seed's last optimization). The leader of partition N of
`__diskless_metadata` is coordinator N, read from this broker's metadata image.

Errors come back as Kafka error codes per item; a peer that cannot be reached answers every item
of its request with REQUEST_TIMED_OUT (the caller's producer or consumer retries).
"""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import UUID

import structlog

from broker.coordinator.diskless.state import BatchRow
from broker.coordinator.diskless.view import BatchResult
from metadata.diskless import DISKLESS_METADATA_TOPIC
from node.client import ClientError
from protocol.errors import Errors
from protocol.generated.diskless_commit_file import DisklessCommitFileRequest
from protocol.generated.diskless_find_batches import DisklessFindBatchesRequest as FB
from protocol.generated.diskless_list_offsets import DisklessListOffsetsRequest as LO

log = structlog.get_logger(__name__)
REQUEST_TIMEOUT_S = 30.0


class CoordinatorClient:
    def __init__(self, node_id: int, metadata: Any, peers: Any, local: Any, replicas: Any) -> None:
        """`metadata` has .image; `peers` is PeerClients("diskless"); `local` the broker's own
        DisklessCoordinator; `replicas` the ReplicaManager (which metadata partitions are here)."""
        self.node_id = node_id
        self.metadata = metadata
        self.peers = peers
        self.local = local
        self.replicas = replicas

    def coordinator_of(self, topic_id: UUID, partition: int) -> int:
        return self.local.coordinator_of(topic_id, partition)

    def leader_of(self, index: int) -> int:
        t = self.metadata.image.topic(DISKLESS_METADATA_TOPIC)
        info = t.partitions.get(index) if t is not None else None
        return -1 if info is None else info.leader

    async def _send(self, broker_id: int, body: Any) -> Any:
        client = await self.peers.get(broker_id)
        try:
            return await client.request(body, 0, timeout=REQUEST_TIMEOUT_S)
        except ClientError:
            await self.peers.drop(broker_id)
            raise

    # ------------------------------------------------------------------ commit
    async def commit(self, req: DisklessCommitFileRequest) -> list[BatchResult]:
        """Commit one WAL file: its batches split by coordinator broker, sent in parallel; one
        result per batch in request order."""
        by_broker: dict[int, list[int]] = {}
        results: list[BatchResult | None] = [None] * len(req.batches)
        for i, b in enumerate(req.batches):
            index = self.coordinator_of(b.topic_id, b.partition_index)
            leader = self.leader_of(index) if index >= 0 else -1
            if leader < 0:
                results[i] = BatchResult(Errors.NOT_LEADER_OR_FOLLOWER, "no diskless coordinator for the partition")
                continue
            by_broker.setdefault(leader, []).append(i)
        owners = sorted(by_broker)

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
        return [r if r is not None else BatchResult(Errors.UNKNOWN_SERVER_ERROR) for r in results]

    # ------------------------------------------------------------------ reads
    async def find_batches(self, topic_id: UUID, partition: int, offset: int,
                           max_bytes: int, max_batches: int = 500) -> tuple[int, int, int, list[BatchRow]]:
        """(error, log start, high watermark, batches). A local replica of the coordinator's
        partition answers from its SQLite (it may trail the leader by a moment); else the leader."""
        index = self.coordinator_of(topic_id, partition)
        if index < 0:
            return Errors.UNKNOWN_TOPIC_OR_PARTITION, -1, -1, []
        if self.replicas.get(DISKLESS_METADATA_TOPIC, index) is not None:
            return await self.local.find_batches(topic_id, partition, offset, max_bytes, max_batches)
        leader = self.leader_of(index)
        if leader < 0:
            return Errors.NOT_LEADER_OR_FOLLOWER, -1, -1, []
        body = FB(fetch_max_bytes=max_bytes, max_batches_per_partition=max_batches, topics=[
            FB.DisklessFindBatchesTopic(topic_id=topic_id, partitions=[FB.DisklessFindBatchesPartition(
                partition_index=partition, offset=offset, max_partition_fetch_bytes=max_bytes)])])
        try:
            resp = await self._send(leader, body)
        except (ClientError, OSError):
            return Errors.NOT_LEADER_OR_FOLLOWER, -1, -1, []
        p = resp.topics[0].partitions[0]
        rows = [BatchRow(b.batch_id, b.object_key, b.magic, b.byte_offset, b.byte_size, b.base_offset,
                         b.last_offset, b.log_append_timestamp, b.batch_max_timestamp, b.timestamp_type)
                for b in p.batches]
        return p.error_code, p.log_start_offset, p.high_watermark, rows

    async def list_offsets(self, topic_id: UUID, partition: int, timestamp: int) -> tuple[int, int, int]:
        """(error, timestamp, offset) from the coordinator's leader (strictly consistent)."""
        index = self.coordinator_of(topic_id, partition)
        leader = self.leader_of(index) if index >= 0 else -1
        if leader < 0:
            return Errors.NOT_LEADER_OR_FOLLOWER, -1, -1
        if leader == self.node_id:
            return await self.local.list_offsets(topic_id, partition, timestamp)
        body = LO(topics=[LO.DisklessListOffsetsTopic(topic_id=topic_id, partitions=[
            LO.DisklessListOffsetsPartition(partition_index=partition, timestamp=timestamp)])])
        try:
            resp = await self._send(leader, body)
        except (ClientError, OSError):
            return Errors.NOT_LEADER_OR_FOLLOWER, -1, -1
        p = resp.topics[0].partitions[0]
        return p.error_code, p.timestamp, p.offset
