"""KIP-253: partition count changes in both directions, keeping keyed order.

Expansion (KIP-253 section 1) and shrinking (section 2) are each one metadata batch, so the new
undeleted_partition_count and every leader epoch bump reach each broker in one image (the
atomicity KIP-253 gets from one LeaderAndIsr request):

- expansion to N: each existing partition's leader epoch is bumped (a PartitionChangeRecord
  naming its current leader) and each new PartitionRecord carries LeaderEpochAfterCreation =
  every existing partition with its epoch before the bump; UndeletedPartitionCountRecord(N);
- shrinking to N: partitions >= N get LeaderEpochBeforeDeletion = every kept partition with its
  epoch before the bump (they are now marked for deletion), and every partition is bumped, the
  marked ones too; UndeletedPartitionCountRecord(N).

Bumping the marked partitions gives their last writable epoch an end: a leader takes Produce by
its image, so a leader that has not applied the shrink still takes writes to a partition the
shrink marked, and one at the post-mark epoch has the mark in its image and refuses them. Whoever
needs a marked partition's final end (a consumer's "drained", the deletion check below) asks its
leader with current_leader_epoch = the post-mark epoch: a leader behind answers
UNKNOWN_LEADER_EPOCH and is asked again later.

A marked partition is deleted (RemovePartitionRecord, every chunk of it) once it is empty: the
`PartitionDeleter` asks its leader every `partition.deletion.check.interval.ms`, at the epoch the
image shows, for its earliest offset (ListOffsets) and its log end (OffsetForLeaderEpoch, so a
tail the followers have not copied yet counts) and removes it when they are equal. Everything it
needs is in the image, so a controller killed at any point resumes where the log says it stands.

While partitions are still being deleted the count cannot change again (INVALID_PARTITIONS): a
further shrink would chain deletion maps and an expansion would reuse the marked indexes.
"""

from __future__ import annotations

import asyncio
from typing import Any

import structlog

from controller.controller import Batch, Controller, FatalError, NotControllerError
from controller.errors import ApiError, Errors
from metadata.image import MetadataImage, TopicInfo
from node.client import ClientError, NodeClient
from protocol.generated.list_offsets import ListOffsetsRequest
from protocol.generated.metadata_records.partition_change_record import PartitionChangeRecord
from protocol.generated.metadata_records.partition_record import PartitionRecord
from protocol.generated.metadata_records.remove_partition_record import RemovePartitionRecord
from protocol.generated.metadata_records.undeleted_partition_count_record import UndeletedPartitionCountRecord
from protocol.generated.offset_for_leader_epoch import OffsetForLeaderEpochRequest

log = structlog.get_logger(__name__)

INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state"})
EARLIEST = -2
DEBUG_REPLICA = -2  # OffsetForLeaderEpoch: the leader's log end, not capped at the high watermark


def marked_partitions(topic: TopicInfo) -> list[int]:
    return sorted(i for i, p in topic.partitions.items() if p.marked_for_deletion)


def check_count_change(topic: TopicInfo, count: int) -> int:
    """Raise INVALID_PARTITIONS unless the topic's count may become `count`; returns the current
    undeleted_partition_count."""
    current = topic.undeleted_partition_count
    if topic.name in INTERNAL_TOPICS:
        raise ApiError(
            Errors.INVALID_PARTITIONS,
            f"Topic '{topic.name}' is internal: its partition count cannot be changed.",
        )
    if count < 1:
        raise ApiError(Errors.INVALID_PARTITIONS, f"A topic needs at least 1 partition; {count} is invalid.")
    marked = marked_partitions(topic)
    if marked:
        raise ApiError(
            Errors.INVALID_PARTITIONS,
            f"Topic '{topic.name}' still has partition(s) {','.join(map(str, marked))} being deleted (marked, not "
            f"yet empty); its count stays {current} until they are gone.",
        )
    if count == current:
        raise ApiError(Errors.INVALID_PARTITIONS, f"Topic '{topic.name}' already has {current} partition(s).")
    return current


def _bump(topic: TopicInfo, index: int) -> PartitionChangeRecord:
    """Naming the current leader again starts a new leader epoch (as Kafka replays it)."""
    return PartitionChangeRecord(partition_id=index, topic_id=topic.id, leader=topic.partitions[index].leader)


def expand_records(topic: TopicInfo, created: list[PartitionRecord]) -> list[Any]:
    before = [
        PartitionRecord.PartitionEpochAfterCreation(i, topic.partitions[i].leader_epoch)
        for i in sorted(topic.partitions)
    ]
    for rec in created:
        rec.leader_epoch_after_creation = list(before)
    count = len(topic.partitions) + len(created)
    return [
        *(_bump(topic, i) for i in sorted(topic.partitions)),
        *created,
        UndeletedPartitionCountRecord(topic_id=topic.id, undeleted_partition_count=count),
    ]


def shrink_records(topic: TopicInfo, count: int) -> list[Any]:
    kept = [i for i in sorted(topic.partitions) if i < count]
    before = [PartitionChangeRecord.PartitionEpochBeforeDeletion(i, topic.partitions[i].leader_epoch) for i in kept]
    marks = [
        PartitionChangeRecord(partition_id=i, topic_id=topic.id, leader=topic.partitions[i].leader,
                              leader_epoch_before_deletion=list(before))
        for i in sorted(topic.partitions)
        if i >= count
    ]
    return [
        *marks,
        *(_bump(topic, i) for i in kept),
        UndeletedPartitionCountRecord(topic_id=topic.id, undeleted_partition_count=count),
    ]


class PartitionDeleter:
    """Deletes each partition marked for deletion once it holds no records."""

    def __init__(self, controller: Controller) -> None:
        self.ctl = controller
        self._clients: dict[int, NodeClient] = {}

    async def run(self, interval_s: float) -> None:
        try:
            while True:
                await asyncio.sleep(interval_s)
                if not self.ctl.active:
                    continue  # only the active controller acts
                try:
                    await self.check_once()
                except NotControllerError:
                    continue
                except FatalError:
                    return
                except Exception:
                    log.exception("partition_deletion_check_failed")
        finally:
            for c in self._clients.values():
                await c.close()

    async def check_once(self) -> int:
        """One pass over every marked partition; returns how many were deleted."""
        image = self.ctl.image
        deleted = 0
        for topic in list(image.topics.values()):
            for idx in marked_partitions(topic):
                p = topic.partitions[idx]
                sizes = await self._offsets(image, topic.name, idx, p.leader, p.leader_epoch)
                if sizes is None:
                    continue
                start, end = sizes
                if start < end:
                    log.debug("marked_partition_not_empty", topic=topic.name, partition=idx, start=start, end=end)
                    continue
                if await self._remove(topic.id, idx):
                    deleted += 1
                    log.info("marked_partition_deleted", topic=topic.name, partition=idx, offset=end)
        return deleted

    async def _remove(self, topic_id: Any, idx: int) -> bool:
        def build(image: MetadataImage, batch: Batch) -> bool:
            t = image.topics.get(topic_id)
            p = None if t is None else t.partitions.get(idx)
            if p is None or not p.marked_for_deletion:
                return False
            batch.add(RemovePartitionRecord(topic_id=topic_id, partition_id=idx))
            return True

        return await self.ctl.write(build)

    async def _offsets(
        self, image: MetadataImage, topic: str, idx: int, leader: int, epoch: int
    ) -> tuple[int, int] | None:
        """(log start, log end) of the partition, asked of its leader at the image's leader epoch
        (one that has not applied the mark yet answers UNKNOWN_LEADER_EPOCH: it may still take
        writes); None if it cannot answer now. The log end, not the high watermark: a tail the
        followers have not copied yet is acknowledged once they have."""
        b = image.brokers.get(leader)
        if b is None or b.fenced:
            return None
        L, OE = ListOffsetsRequest, OffsetForLeaderEpochRequest
        earliest = L(replica_id=-1, isolation_level=0, topics=[L.ListOffsetsTopic(name=topic, partitions=[
            L.ListOffsetsPartition(partition_index=idx, current_leader_epoch=epoch, timestamp=EARLIEST)])])
        end = OE(replica_id=DEBUG_REPLICA, topics=[OE.OffsetForLeaderTopic(topic=topic, partitions=[
            OE.OffsetForLeaderPartition(partition=idx, current_leader_epoch=epoch, leader_epoch=epoch)])])
        try:
            client = await self._client(b)
            start = (await client.request(earliest)).topics[0].partitions[0]
            last = (await client.request(end)).topics[0].partitions[0]
        except (ClientError, OSError, TimeoutError) as e:
            self._drop(leader)
            log.info("partition_deletion_check_unreachable", broker=leader, error=str(e))
            return None
        if start.error_code or last.error_code:
            log.debug("partition_deletion_check_refused", topic=topic, partition=idx,
                      error=start.error_code or last.error_code)
            return None
        return start.offset, last.end_offset

    async def _client(self, b: Any) -> NodeClient:
        c = self._clients.get(b.id)
        if c is None or not c.connected:
            cfg = self.ctl.config
            ep = (b.endpoint(cfg.broker_listener) if cfg.broker_listener else None) or b.endpoint()
            c = await NodeClient(ep.host, ep.port, client_id="strata-controller", timeout=10,
                                 security=cfg.broker_security if ep.listener == cfg.broker_listener else None).connect()
            self._clients[b.id] = c
        return c

    def _drop(self, broker_id: int) -> None:
        c = self._clients.pop(broker_id, None)
        if c is not None:
            asyncio.get_running_loop().create_task(c.close())
