"""Tells the controller in which log dir each of this broker's replicas lives (AssignReplicasToDirs,
KIP-858): when a replica is first placed, after a move between dirs, and when the metadata names
another dir than the one holding it. What piles up while a request is in flight goes in the next
one; failures are retried until the controller has taken each report."""

from __future__ import annotations

import asyncio
from uuid import UUID

import structlog

from broker.ports import BrokerEpoch, ControllerLink
from node.client import ClientError
from node.shutdown import stop_task
from protocol.generated.assign_replicas_to_dirs import AssignReplicasToDirsRequest

log = structlog.get_logger(__name__)

Key = tuple[UUID, int, int]  # topic id, partition, chunk start
RETRY_S = 0.5


class DirAssigner:
    def __init__(self, channel: ControllerLink, node_id: int, broker_epoch: BrokerEpoch) -> None:
        self.channel = channel
        self.node_id = node_id
        self._epoch = broker_epoch
        self._pending: dict[Key, UUID] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None

    def report(self, topic_id: UUID, partition: int, chunk_start: int, dir_id: UUID) -> None:
        """The replica lives in `dir_id` (a later report of the same replica replaces this one)."""
        key = (topic_id, partition, chunk_start)
        if self._pending.get(key) != dir_id:
            self._pending[key] = dir_id
            self._wake.set()

    @property
    def idle(self) -> bool:
        return not self._pending

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        await stop_task(self._task)

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            sent = dict(self._pending)
            if not sent:
                continue
            untaken = await self._send(sent)
            if untaken:
                await asyncio.sleep(RETRY_S)
            for key, dir_id in sent.items():
                if self._pending.get(key) == dir_id and key not in untaken:
                    del self._pending[key]
            if self._pending:
                self._wake.set()

    async def _send(self, sent: dict[Key, UUID]) -> set[Key]:
        """The reports the controller did not take (to send again)."""
        untaken = set(sent)
        epoch = self._epoch()
        if epoch < 0:
            return untaken
        R = AssignReplicasToDirsRequest
        by_dir: dict[UUID, dict[UUID, list[tuple[int, int]]]] = {}
        for (tid, part, start), d in sent.items():
            by_dir.setdefault(d, {}).setdefault(tid, []).append((part, start))
        req = R(broker_id=self.node_id, broker_epoch=epoch, directories=[
            R.DirectoryData(id=d, topics=[
                R.TopicData(topic_id=tid, partitions=[R.PartitionData(partition_index=p, chunk_start_offset=s)
                                                      for p, s in parts])
                for tid, parts in topics.items()
            ])
            for d, topics in by_dir.items()
        ])
        try:
            resp = await self.channel.request(req, timeout=10)
        except ClientError as e:
            log.warning("dir_assignment_failed", error=str(e))
            return untaken
        if resp.error_code:
            log.warning("dir_assignment_failed", error_code=resp.error_code)
            return untaken
        for d in resp.directories:
            for t in d.topics:
                for p in t.partitions:
                    # a replica the metadata no longer gives us (moved away, topic deleted) is done too
                    untaken.discard((t.topic_id, p.partition_index, p.chunk_start_offset))
                    if p.error_code:
                        log.info("dir_assignment_refused", topic_id=str(t.topic_id), partition=p.partition_index,
                                 chunk_start=p.chunk_start_offset, error_code=p.error_code)
        log.info("replicas_assigned_to_dirs", replicas=len(sent) - len(untaken))
        return untaken
