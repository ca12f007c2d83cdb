"""Where a share-partition's leader keeps its state (KIP-932, "Share-group state persistence"):
the share coordinator of its key, this broker's own (a direct call) or another broker's
(ReadShareGroupState / WriteShareGroupState). The coordinator is the leader of the
__share_group_state partition the key hashes to, found in the metadata image (as FindCoordinator
with key type 2 would answer); while it moves or loads, calls are retried for a while.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING
from uuid import UUID

import structlog

from broker.coordinator.share.records import SHARE_STATE_TOPIC, ShareState, StateKey, delivery_complete_count
from node.client import ClientError
from protocol.errors import Errors
from protocol.generated.delete_share_group_state import DeleteShareGroupStateRequest
from protocol.generated.read_share_group_state import ReadShareGroupStateRequest
from protocol.generated.write_share_group_state import WriteShareGroupStateRequest

if TYPE_CHECKING:
    from broker.coordinator.share import ShareCoordinator
    from broker.ports import ImageSource
    from broker.replication.peers import PeerClients

log = structlog.get_logger(__name__)

RETRIABLE = frozenset({Errors.COORDINATOR_NOT_AVAILABLE, Errors.COORDINATOR_LOAD_IN_PROGRESS,
                       Errors.NOT_COORDINATOR, Errors.REQUEST_TIMED_OUT})
RETRY_FOR_S = 15.0
RETRY_BACKOFF_S = 0.2


class SharePersister:
    def __init__(self, node_id: int, coordinator: ShareCoordinator, images: ImageSource, peers: PeerClients) -> None:
        self.node_id = node_id
        self.coordinator = coordinator
        self.images = images
        self.peers = peers

    async def close(self) -> None:
        await self.peers.close()

    def _leader(self, key: StateKey) -> int:
        """The broker coordinating `key`, or -1 (the topic is being created, no leader yet)."""
        info = self.images.image.topic(SHARE_STATE_TOPIC)
        if info is None:
            self.coordinator.ensure_topic()
            return -1
        p = info.partitions.get(self.coordinator.partition_of(key))
        return p.leader if p is not None else -1

    async def read(self, group_id: str, topic_id: UUID, partition: int, leader_epoch: int
                   ) -> tuple[int, ShareState | None]:
        key = StateKey(group_id, topic_id, partition)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + RETRY_FOR_S
        while True:
            err, state = await self._read_once(key, leader_epoch)
            if err not in RETRIABLE or loop.time() >= deadline:
                return err, state
            await asyncio.sleep(RETRY_BACKOFF_S)

    async def _read_once(self, key: StateKey, leader_epoch: int) -> tuple[int, ShareState | None]:
        leader = self._leader(key)
        if leader < 0:
            return Errors.COORDINATOR_NOT_AVAILABLE, None
        if leader == self.node_id:
            return self.coordinator.read(key)
        R = ReadShareGroupStateRequest
        try:
            client = await self.peers.get(leader)
            resp = await client.request(R(group_id=key.group_id, topics=[R.ReadStateData(
                topic_id=key.topic_id, partitions=[R.PartitionData(partition=key.partition,
                                                                   leader_epoch=leader_epoch)])]), 0)
        except (TimeoutError, ClientError, OSError) as e:
            log.info("share_state_read_failed", coordinator=leader, error=str(e))
            await self.peers.drop(leader)
            return Errors.COORDINATOR_NOT_AVAILABLE, None
        p = resp.results[0].partitions[0]
        if p.error_code:
            return p.error_code, None
        if p.start_offset < 0 and p.state_epoch == 0:
            return 0, None  # never written
        return 0, ShareState(p.state_epoch, leader_epoch, p.start_offset,
                             [(b.first_offset, b.last_offset, b.delivery_state, b.delivery_count)
                              for b in p.state_batches])

    async def write(self, group_id: str, topic_id: UUID, partition: int, state: ShareState) -> int:
        key = StateKey(group_id, topic_id, partition)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + RETRY_FOR_S
        while True:
            err = await self._write_once(key, state)
            if err not in RETRIABLE or loop.time() >= deadline:
                if err:
                    log.warning("share_state_write_failed", group=group_id, topic_id=str(topic_id),
                                partition=partition, error=err)
                return err
            await asyncio.sleep(RETRY_BACKOFF_S)

    async def _write_once(self, key: StateKey, state: ShareState) -> int:
        leader = self._leader(key)
        if leader < 0:
            return Errors.COORDINATOR_NOT_AVAILABLE
        if leader == self.node_id:
            return await self.coordinator.write(key, state)
        W = WriteShareGroupStateRequest
        try:
            client = await self.peers.get(leader)
            resp = await client.request(W(group_id=key.group_id, topics=[W.WriteStateData(
                topic_id=key.topic_id, partitions=[W.PartitionData(
                    partition=key.partition, state_epoch=state.state_epoch, leader_epoch=state.leader_epoch,
                    start_offset=state.start_offset, delivery_complete_count=delivery_complete_count(state),
                    state_batches=[
                        W.StateBatch(first_offset=f, last_offset=last, delivery_state=s, delivery_count=c)
                        for f, last, s, c in state.batches])])]))
        except (TimeoutError, ClientError, OSError) as e:
            log.info("share_state_write_failed", coordinator=leader, error=str(e))
            await self.peers.drop(leader)
            return Errors.COORDINATOR_NOT_AVAILABLE
        return resp.results[0].partitions[0].error_code

    async def delete(self, group_id: str, topic_id: UUID, partition: int) -> int:
        key = StateKey(group_id, topic_id, partition)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + RETRY_FOR_S
        while True:
            err = await self._delete_once(key)
            if err not in RETRIABLE or loop.time() >= deadline:
                return err
            await asyncio.sleep(RETRY_BACKOFF_S)

    async def _delete_once(self, key: StateKey) -> int:
        leader = self._leader(key)
        if leader < 0:
            return Errors.COORDINATOR_NOT_AVAILABLE
        if leader == self.node_id:
            return await self.coordinator.delete(key)
        D = DeleteShareGroupStateRequest
        try:
            client = await self.peers.get(leader)
            resp = await client.request(D(group_id=key.group_id, topics=[D.DeleteStateData(
                topic_id=key.topic_id, partitions=[D.PartitionData(partition=key.partition)])]), 0)
        except (TimeoutError, ClientError, OSError) as e:
            log.info("share_state_delete_failed", coordinator=leader, error=str(e))
            await self.peers.drop(leader)
            return Errors.COORDINATOR_NOT_AVAILABLE
        return resp.results[0].partitions[0].error_code
