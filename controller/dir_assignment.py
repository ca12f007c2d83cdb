"""Which log dir holds each replica (KIP-858), and what happens when a broker's dir goes offline.

Brokers say where their replicas live with AssignReplicasToDirs (on first open, after a move
between dirs): the controller writes the dir into the replica's slot of `Directories`
(PartitionChangeRecord for the active chunk, ChunkChangeRecord for an inactive one). A broker
reports dirs that failed in BrokerHeartbeat's OfflineLogDirs: its registration loses them
(BrokerRegistrationChangeRecord.LogDirs lists the dirs still online) and every replica it holds
in them leaves the ISR and leadership, as Kafka's handleDirectoriesOffline does. A replica
assigned to a dir its broker does not list as online may not lead (replication.dir_online). A
broker whose every dir is offline is fenced (it shuts itself down).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from uuid import UUID

import structlog

from controller.controller import Batch, Controller
from controller.errors import ApiError, Errors
from controller.replication import ZERO_UUID, build_change, default_directory, dir_online, usable_ids
from metadata.image import ChunkInfo, MetadataImage, PartitionInfo
from protocol.generated.metadata_records.broker_registration_change_record import BrokerRegistrationChangeRecord
from protocol.generated.metadata_records.chunk_change_record import ChunkChangeRecord
from protocol.generated.metadata_records.partition_change_record import PartitionChangeRecord

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Assignment:
    dir_id: UUID
    topic_id: UUID
    partition: int
    chunk_start: int = -1  # -1: the active chunk's replica


def aligned_dirs(image: MetadataImage, replicas: tuple[int, ...], directories: tuple[UUID, ...]) -> list[UUID]:
    """`directories` aligned with `replicas` (the broker's default for any slot missing)."""
    if len(directories) == len(replicas):
        return list(directories)
    return [default_directory(image, r) for r in replicas]


def offline_dir_changes(
    image: MetadataImage, broker_id: int, broker_epoch: int, offline: Collection[UUID], unclean_for: Callable[[str], bool]
) -> list:
    """Records taking the broker's newly offline dirs out of service; [] when none is new. The
    caller fences the broker when no dir is left."""
    b = image.brokers.get(broker_id)
    if b is None:
        return []
    gone = set(offline) & set(b.log_dirs)
    if not gone:
        return []
    records: list = [
        BrokerRegistrationChangeRecord(
            broker_id=broker_id, broker_epoch=broker_epoch, log_dirs=[d for d in b.log_dirs if d not in gone]
        )
    ]
    usable = usable_ids(image) - {broker_id}
    moved = 0
    for t in image.topics.values():
        for p in t.partitions.values():
            if broker_id in p.replicas and _dir_of(image, p.replicas, p.directories, broker_id) in gone:
                rec = build_change(
                    image, p, usable, isr=[r for r in p.isr if r != broker_id],
                    election="unclean" if unclean_for(t.name) else "online",
                )
                if rec is not None:
                    records.append(rec)
                    moved += 1
        for chunks in t.chunks.values():
            for c in chunks:
                if broker_id in c.isr and _dir_of(image, c.replicas, c.directories, broker_id) in gone:
                    records.append(_chunk_change(c, isr=[r for r in c.isr if r != broker_id]))
    log.warning("log_dirs_offline", broker=broker_id, dirs=[str(d) for d in gone], partition_changes=moved)
    return records


def all_offline(image: MetadataImage, broker_id: int, offline: Collection[UUID]) -> bool:
    b = image.brokers.get(broker_id)
    return b is not None and bool(b.log_dirs) and set(b.log_dirs) <= set(offline)


def assign(
    image: MetadataImage, broker_id: int, a: Assignment, unclean_for: Callable[[str], bool]
) -> tuple[int, object | None]:
    """(error code, record or None) putting `broker_id`'s replica of `a` in dir `a.dir_id`. A dir
    the broker does not list as online takes the replica out of the ISR and leadership too."""
    t = image.topics.get(a.topic_id)
    if t is None:
        return Errors.UNKNOWN_TOPIC_ID, None
    if a.chunk_start < 0 or (a.partition in t.partitions and t.partitions[a.partition].start_offset == a.chunk_start):
        p = t.partitions.get(a.partition)
        if p is None:
            return Errors.UNKNOWN_TOPIC_OR_PARTITION, None
        if broker_id not in p.replicas:
            return Errors.NOT_LEADER_OR_FOLLOWER, None
        return 0, _assign_active(image, t.name, p, broker_id, a.dir_id, unclean_for)
    c = next((c for c in t.chunks.get(a.partition, ()) if c.start_offset == a.chunk_start), None)
    if c is None:
        return Errors.UNKNOWN_TOPIC_OR_PARTITION, None
    if broker_id not in c.replicas:
        return Errors.NOT_LEADER_OR_FOLLOWER, None
    dirs = aligned_dirs(image, c.replicas, c.directories)
    i = c.replicas.index(broker_id)
    online = dir_online(image, broker_id, a.dir_id)
    if dirs[i] == a.dir_id and (online or broker_id not in c.isr):
        return 0, None
    dirs[i] = a.dir_id
    isr = None if online else [r for r in c.isr if r != broker_id]
    return 0, _chunk_change(c, isr=isr, directories=dirs)


def _assign_active(
    image: MetadataImage, topic: str, p: PartitionInfo, broker_id: int, dir_id: UUID, unclean_for: Callable[[str], bool]
) -> object | None:
    dirs = aligned_dirs(image, p.replicas, p.directories)
    i = p.replicas.index(broker_id)
    online = dir_online(image, broker_id, dir_id)
    if dirs[i] == dir_id and (online or (broker_id not in p.isr and p.leader != broker_id)):
        return None
    dirs[i] = dir_id
    usable = usable_ids(image)
    isr = None
    if not online:
        usable -= {broker_id}
        isr = [r for r in p.isr if r != broker_id]
    rec = build_change(image, p, usable, isr=isr, election="unclean" if unclean_for(topic) else "online")
    if rec is None:
        rec = PartitionChangeRecord(partition_id=p.partition, topic_id=p.topic_id)
    rec.directories = dirs
    return rec


def _dir_of(image: MetadataImage, replicas: tuple[int, ...], directories: tuple[UUID, ...], broker_id: int) -> UUID:
    dirs = aligned_dirs(image, replicas, directories)
    return dirs[replicas.index(broker_id)] if broker_id in replicas else ZERO_UUID


def _chunk_change(c: ChunkInfo, *, isr: list[int] | None = None, directories: list[UUID] | None = None) -> ChunkChangeRecord:
    rec = ChunkChangeRecord(partition_id=c.partition, topic_id=c.topic_id, start_offset=c.start_offset)
    if isr is not None and tuple(isr) != c.isr and isr:
        rec.isr = isr  # a chunk's ISR is never emptied either
    if directories is not None:
        rec.directories = directories
    return rec


class DirAssignmentControl:
    """AssignReplicasToDirs: one metadata batch for every replica a broker reports."""

    def __init__(self, controller: Controller) -> None:
        self.ctl = controller

    async def assign(self, broker_id: int, broker_epoch: int, assignments: list[Assignment]) -> list[int]:
        """An error code per assignment; raises ApiError for a stale or unknown broker."""

        def build(image: MetadataImage, batch: Batch) -> list[int]:
            b = image.brokers.get(broker_id)
            if b is None or b.epoch != broker_epoch:
                raise ApiError(Errors.STALE_BROKER_EPOCH, f"Broker {broker_id} does not have epoch {broker_epoch}.")
            unclean = self.ctl.unclean_for(image)
            codes = []
            for a in assignments:
                code, rec = assign(image, broker_id, a, unclean)
                codes.append(code)
                if rec is not None:
                    batch.add(rec)
            return codes

        codes = await self.ctl.write(build)
        log.info("replicas_assigned_to_dirs", broker=broker_id, replicas=len(assignments),
                 errors=sum(1 for c in codes if c))
        return codes
