"""The partition router: which partition view serves a request for (topic, partition), or Kafka's
error saying why none does here. One place, so every API answers alike.

- a diskless partition is served by every broker (broker/diskless/partition.py);
- a local partition's active chunk by its leader (a follower too for Kafka's debugging reader),
  after the client's leader epoch is checked (KIP-320: FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH);
- an offset below the active chunk by a view of its inactive chunk (chunk_views.py): our replica
  of it, a redirect to a replica holding it (KIP-392), or a read on the client's behalf; the
  choices are explained in broker/replication/chunk_reads.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import structlog

from broker.partitions.chunk_views import (
    ChunkOutOfRange,
    ChunkProxyRead,
    ChunkRangeRead,
    ChunkRedirect,
    ChunkReplicaRead,
    HeldChunks,
    InactiveChunkView,
    Reader,
)
from broker.partitions.interface import ServedPartition
from broker.partitions.local import LocalDeps, LocalPartition
from broker.replication.chunk_reads import REDIRECT_MIN_VERSION, chunk_holding, low_watermark
from protocol.errors import Errors

if TYPE_CHECKING:
    from broker.diskless.partition import DisklessService
    from broker.fetch_sessions import SessionPartition
    from broker.metrics import TopicStats
    from broker.ports import Forwarder, ImageSource
    from broker.replication.chunk_reads import ChunkReads
    from broker.replication.partition import Partition
    from broker.replication.replica_manager import ReplicaManager
    from metadata.image import ChunkInfo, TopicInfo
    from protocol.generated.fetch import FetchRequest

log = structlog.get_logger(__name__)
DEBUG_REPLICA = -2  # Kafka's id for a debugging reader allowed on followers
Served = tuple["ServedPartition | None", int]


class PartitionRouter:
    def __init__(self, replicas: ReplicaManager, images: ImageSource, diskless: DisklessService,
                 chunk_reads: ChunkReads, topic_stats: TopicStats, forward: Forwarder) -> None:
        self.replicas = replicas
        self.images = images
        self.diskless = diskless
        self.chunk_reads = chunk_reads
        self.node_id = replicas.node_id
        # what every local partition view uses: one object, so a view costs one allocation
        self._local = LocalDeps(replicas, images, topic_stats, chunk_reads, forward)

    # ---- the active chunk
    def leader(self, topic: str, index: int, *, current_leader_epoch: int = -1,
               allow_follower: bool = False) -> tuple[Partition | None, int]:
        """(partition, 0) when we may serve it, else (None, Kafka error code). allow_follower lets a
        replica that is not the leader answer (Kafka's debugging reader, follower fetches)."""
        rm = self.replicas
        p = rm.partitions.get((topic, index))
        if p is None and rm.replica_offline(topic, index):
            return None, Errors.KAFKA_STORAGE_ERROR  # its log dir failed; clients refresh metadata and retry
        if p is None or (not allow_follower and not p.is_leader):
            info = self.images.image.topic(topic)
            known = info is not None and index in info.partitions
            return None, Errors.NOT_LEADER_OR_FOLLOWER if known else Errors.UNKNOWN_TOPIC_OR_PARTITION
        if p.filling_prefix or p.swapping:
            # a new chunk's leader still copying the previous chunk's tail: not serving yet
            return None, Errors.NOT_LEADER_OR_FOLLOWER
        if current_leader_epoch >= 0 and current_leader_epoch != p.leader_epoch:
            code = Errors.FENCED_LEADER_EPOCH if current_leader_epoch < p.leader_epoch else Errors.UNKNOWN_LEADER_EPOCH
            return None, code
        return p, 0

    def serving(self, topic: str, index: int, *, current_leader_epoch: int = -1, allow_follower: bool = False) -> Served:
        """leader() behind the one partition interface: a diskless partition is served by every
        broker; a local one by its leader (or a follower, when allowed)."""
        diskless = self.diskless.partition(topic, index)
        if diskless is not None:
            return diskless, 0
        p, code = self.leader(topic, index, current_leader_epoch=current_leader_epoch, allow_follower=allow_follower)
        return (LocalPartition(self._local, p) if p is not None else None), code

    # ---- Fetch
    def for_fetch(self, reader: Reader, req: FetchRequest, info: TopicInfo, index: int, sp: SessionPartition,
                  replica_id: int) -> Served:
        """The view that serves a Fetch of `index` at sp.fetch_offset: an inactive chunk's when the
        offset lies in one (or the asker is a reader of our chunk), else serving()'s."""
        chunks = info.chunks.get(index)
        if chunks and index in info.partitions:
            if replica_id >= 0:
                view = self._chunk_range(info, index, chunks, sp.fetch_offset)
                if view is not None:
                    return view, 0
            else:
                served = self._chunk_for_consumer(reader, req, info, index, chunks, sp)
                if served is not None:
                    return served
        return self.serving(info.name, index, current_leader_epoch=sp.current_leader_epoch)

    def recheck(self, p: ServedPartition, topic: str, index: int, *, current_leader_epoch: int = -1) -> Served:
        """After an earlier read of the same Fetch waited: is `p` still what serves? An inactive
        chunk's view stays (the chunk is immutable, the choice made); the rest is looked up again."""
        if isinstance(p, InactiveChunkView):
            return p, 0
        return self.serving(topic, index, current_leader_epoch=current_leader_epoch)

    def _chunk_range(self, info: TopicInfo, index: int, chunks: tuple[ChunkInfo, ...],
                     offset: int) -> ChunkRangeRead | None:
        """A replica copying a chunk fetches [start, end] from us; the active chunk's leader
        answers its own followers on the usual path."""
        p = self.replicas.partitions.get((info.name, index))
        if p is not None and p.is_leader and offset >= p.log.chunk_start:
            return None
        found = None  # our newest chunk replica whose [start, end + 1] holds the offset
        for cr in self.replicas.chunks_of(info.name, index):
            if cr.start <= offset <= cr.end + 1:
                found = cr
        if found is not None:
            return ChunkRangeRead(found.log, found.end)
        if p is not None:
            # a chunk with nothing readable (cut at its first offset) kept in our active chunk's dir
            same = next((c for c in chunks if c.start_offset == p.log.chunk_start), None)
            if same is not None:
                return ChunkRangeRead(p.log, same.end_offset)
        return None

    def _chunk_for_consumer(self, reader: Reader, req: FetchRequest, info: TopicInfo, index: int,
                            chunks: tuple[ChunkInfo, ...], sp: SessionPartition) -> Served | None:
        """None: the active chunk's usual path (its leader, or NOT_LEADER_OR_FOLLOWER)."""
        rm, name, offset = self.replicas, info.name, sp.fetch_offset
        active = info.partitions[index]
        p = rm.partitions.get((name, index))
        leader_here = p is not None and p.is_leader
        mine = rm.chunks_of(name, index)
        if offset >= active.start_offset:
            if leader_here or not mine:
                return None
            # a reader of our chunk reached its end: onwards to the active chunk's leader
            return self._redirect(reader, name, index, offset, active.leader, None, None)
        c = chunk_holding(chunks, offset)
        low = low_watermark(chunks)
        if c is None or offset < low:  # below the oldest chunk, its head retention took, or DeleteRecords
            if not (leader_here or mine):
                return None
            return ChunkOutOfRange(max(chunks[0].start_offset, low)), 0
        leader = p if leader_here else None
        cr = rm.chunks.get((name, index, c.start_offset))
        if cr is not None and cr.holds(offset):
            return ChunkReplicaRead(self.chunk_reads, cr, leader, reader), 0
        sources = self.chunk_reads.sources(name, index, c, reader.client_id or "", req.rack_id)
        if not leader_here:
            if not mine and cr is None:
                return None  # NOT_LEADER_OR_FOLLOWER: the client's metadata is stale
            if not sources:
                return None, Errors.NOT_LEADER_OR_FOLLOWER
            return self._redirect(reader, name, index, offset, sources[0], c, None)
        if not sources:
            log.warning("chunk_unavailable", topic=name, partition=index, chunk_start=c.start_offset,
                        offset=offset, replicas=list(c.replicas), isr=list(c.isr))
            return None, Errors.NOT_LEADER_OR_FOLLOWER
        if reader.api_version >= REDIRECT_MIN_VERSION and \
                not self.chunk_reads.ignored_redirect(reader.connection, name, index, offset):
            return self._redirect(reader, name, index, offset, sources[0], c, leader)
        return ChunkProxyRead(self.chunk_reads, name, index, c.start_offset, offset, sp.max_bytes, req.isolation_level,
                              sources, leader, reader), 0

    def _redirect(self, reader: Reader, topic: str, index: int, offset: int, to: int, chunk: ChunkInfo | None,
                  leader: Partition | None) -> Served:
        if reader.api_version < REDIRECT_MIN_VERSION or to < 0:
            return None, Errors.NOT_LEADER_OR_FOLLOWER
        start = chunk.start_offset if chunk is not None else None
        return ChunkRedirect(self.chunk_reads, topic, index, offset, to, start, leader, reader), 0

    # ---- share groups (KIP-932)
    def for_share(self, reader: Reader, info: TopicInfo, index: int, offset: int, max_bytes: int,
                  isolation_level: int) -> Served:
        """The view a share-partition reads `offset` through: the active chunk's leader keeps the
        share-partition, and reads an older chunk's records from our replica of that chunk or, on
        its own behalf, from another replica of it (a share consumer follows no redirect)."""
        name = info.name
        chunks = info.chunks.get(index)
        p = self.replicas.partitions.get((name, index))
        if not chunks or p is None or not p.is_leader or index not in info.partitions or \
                offset >= info.partitions[index].start_offset:
            return self.serving(name, index)
        c = chunk_holding(chunks, offset)
        low = low_watermark(chunks)
        if c is None or offset < low:
            return ChunkOutOfRange(max(chunks[0].start_offset, low)), 0
        cr = self.replicas.chunks.get((name, index, c.start_offset))
        if cr is not None and cr.holds(offset):
            return ChunkReplicaRead(self.chunk_reads, cr, p, reader), 0
        sources = self.chunk_reads.sources(name, index, c, reader.client_id or "", None)
        if not sources:
            return None, Errors.NOT_LEADER_OR_FOLLOWER
        return ChunkProxyRead(self.chunk_reads, name, index, c.start_offset, offset, max_bytes, isolation_level,
                              sources, p, reader), 0

    # ---- ListOffsets
    def for_offsets(self, topic: str, index: int, *, replica_id: int, current_leader_epoch: int = -1) -> Served:
        """A broker (replica_id >= 0) asks about the inactive chunks we hold; a client about the
        partition (its leader, or any replica for Kafka's debugging reader)."""
        if replica_id >= 0:
            held = [cr for cr in self.replicas.chunks_of(topic, index) if cr.log.log_start_offset <= cr.stop]
            return (HeldChunks(held), 0) if held else (None, Errors.NOT_LEADER_OR_FOLLOWER)
        return self.serving(topic, index, allow_follower=replica_id == DEBUG_REPLICA,
                            current_leader_epoch=current_leader_epoch)
