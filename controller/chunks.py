"""Chunks: CreateChunks closes a partition's active chunk and starts a new one on new brokers;
AlterChunkAssignments moves an inactive chunk's replicas, and takes the reports brokers send
about their chunk replicas (caught up, left).

CreateChunks arrives from the partition leader, which has fixed the offsets (Kafka's terms, HW
and LSO exclusive): StartOffset = LSO, PrevStopOffset = LSO - 1, PrevEndOffset = HW - 1. One
atomic batch then holds a ChunkRecord for the closed chunk (its start, stop, end, replicas and
ISR; left out when the chunk holds no data, HW == its start) and a PartitionChangeRecord giving
the active chunk its new replicas, ISR, leader and start (the image bumps the leader epoch).

AlterChunkAssignments with a target T for a chunk whose replicas are C writes replicas =
T + (C - T), adding = T minus the chunk's ISR, removing = C - T; with nobody to add it applies at
once (replicas = T, ISR = ISR & T). A CaughtUpBrokerId report adds the broker to the ISR and
completes the move once the ISR holds all of T. A LeavingBrokerId report takes the broker out of
every list; a chunk left without replicas is dropped by the image.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from uuid import UUID

import structlog

from controller.controller import Batch, Controller
from controller.errors import ApiError, Errors
from controller.replication import default_directory, elect, usable_ids
from controller.topics import check_manual_replicas
from metadata.image import ChunkInfo, MetadataImage, PartitionInfo
from protocol.generated.metadata_records.chunk_change_record import ChunkChangeRecord
from protocol.generated.metadata_records.chunk_record import ChunkRecord
from protocol.generated.metadata_records.partition_change_record import PartitionChangeRecord

log = structlog.get_logger(__name__)

UNSET = -1


@dataclass
class NewChunk:
    """One CreateChunks entry, with the offsets the leader filled in."""

    topic: str
    partition: int
    broker_ids: list[int]
    start_offset: int
    start_timestamp: int
    prev_stop_offset: int
    prev_end_offset: int


@dataclass
class ChunkMove:
    """One AlterChunkAssignments entry: a target (from tools) or a broker's report."""

    topic: str
    partition: int
    start_offset: int
    chunk_epoch: int
    broker_ids: list[int]
    caught_up: int = UNSET
    leaving: int = UNSET
    log_start: int = UNSET  # DeleteRecords: the chunk's new first readable offset


@dataclass
class ChunkResult:
    topic: str
    partition: int
    start_offset: int = UNSET
    error: ApiError | None = None


def replication_factor(p: PartitionInfo) -> int:
    """The partition's replica count, without the replicas a reassignment is removing."""
    return len(p.replicas) - len(p.removing_replicas)


class ChunkControl:
    def __init__(self, controller: Controller) -> None:
        self.ctl = controller

    # ---- CreateChunks
    async def create_chunks(self, entries: list[NewChunk]) -> list[ChunkResult]:
        """One result per entry, in order; every accepted entry goes into one batch."""

        def build(image: MetadataImage, batch: Batch) -> list[ChunkResult]:
            counts = Counter((e.topic, e.partition) for e in entries)
            usable = usable_ids(image)
            out = []
            for e in entries:
                res = ChunkResult(e.topic, e.partition, e.start_offset)
                out.append(res)
                try:
                    if counts[(e.topic, e.partition)] > 1:
                        raise ApiError(
                            Errors.INVALID_REQUEST, f"Partition {e.topic}-{e.partition} is named more than once."
                        )
                    batch.extend(self._new_chunk(image, usable, e))
                except ApiError as err:
                    res.error = err
            return out

        results = await self.ctl.write(build)
        for r in results:
            log.info(
                "create_chunk",
                topic=r.topic,
                partition=r.partition,
                start_offset=r.start_offset,
                error=r.error.code if r.error else 0,
            )
        return results

    def _new_chunk(self, image: MetadataImage, usable: set[int], e: NewChunk) -> list:
        name = f"{e.topic}-{e.partition}"
        t = image.topic(e.topic)
        p = None if t is None else t.partitions.get(e.partition)
        if t is None or p is None:
            raise ApiError(Errors.UNKNOWN_TOPIC_OR_PARTITION, f"No partition {name}.")
        if e.start_offset < 0:
            raise ApiError(
                Errors.INVALID_REQUEST,
                f"CreateChunks for {name} has no start offset: send CreateChunks to the partition leader "
                f"(broker {p.leader}), which fixes the chunk offsets.",
            )
        check_manual_replicas(image, list(e.broker_ids), None, f"the new chunk of {name}")
        rf = replication_factor(p)
        if len(e.broker_ids) != rf:
            raise ApiError(
                Errors.INVALID_REPLICA_ASSIGNMENT,
                f"The new chunk of {name} names {len(e.broker_ids)} broker(s), the partition has {rf} replica(s).",
            )
        if e.start_offset < p.start_offset:
            raise ApiError(
                Errors.INVALID_REQUEST,
                f"Chunk start offset {e.start_offset} of {name} is below its active chunk's start {p.start_offset}.",
            )
        if e.prev_stop_offset != e.start_offset - 1:
            raise ApiError(
                Errors.INVALID_REQUEST,
                f"PrevStopOffset {e.prev_stop_offset} of {name} must be StartOffset - 1 ({e.start_offset - 1}).",
            )
        if e.prev_end_offset < e.prev_stop_offset:
            raise ApiError(
                Errors.INVALID_REQUEST,
                f"PrevEndOffset {e.prev_end_offset} of {name} is below PrevStopOffset {e.prev_stop_offset}.",
            )
        records: list = []
        if e.prev_end_offset >= p.start_offset:  # the closed chunk holds data: keep it
            records.append(
                ChunkRecord(
                    partition_id=p.partition,
                    topic_id=p.topic_id,
                    start_offset=p.start_offset,
                    start_timestamp=p.start_timestamp,
                    stop_offset=e.prev_stop_offset,
                    end_offset=e.prev_end_offset,
                    chunk_epoch=0,
                    replicas=list(p.replicas),
                    directories=list(p.directories) if len(p.directories) == len(p.replicas) else [],
                    isr=list(p.isr),
                    # a reassignment under way goes on in the closed chunk: replicas still being
                    # added join its ISR when they report they hold the chunk
                    removing_replicas=list(p.removing_replicas),
                    adding_replicas=list(p.adding_replicas),
                    epoch=0,
                )
            )
        ids = list(e.broker_ids)
        # The first broker leads, as a preferred election picks it; a fenced one is passed over.
        leader, _ = elect(-1, ids, ids, usable, "preferred")
        records.append(
            PartitionChangeRecord(
                partition_id=p.partition,
                topic_id=p.topic_id,
                isr=ids,
                leader=leader,
                replicas=ids,
                removing_replicas=[],
                adding_replicas=[],
                directories=_directories(image, p.replicas, p.directories, ids),
                start_offset=e.start_offset,
                start_timestamp=e.start_timestamp,
                # the new chunk's replicas all start in sync: the old chunk's ELR means nothing to it
                eligible_leader_replicas=[] if p.elr else None,
                last_known_elr=[] if p.last_known_elr else None,
            )
        )
        return records

    # ---- AlterChunkAssignments
    async def alter_chunks(self, moves: list[ChunkMove]) -> list[ChunkResult]:
        """One result per entry, in order. Entries for the same chunk apply one after another."""

        def build(image: MetadataImage, batch: Batch) -> list[ChunkResult]:
            state: dict[tuple[UUID, int, int], ChunkInfo] = {}  # chunks changed earlier in this batch
            out = []
            for m in moves:
                res = ChunkResult(m.topic, m.partition, m.start_offset)
                out.append(res)
                try:
                    self._move(image, batch, state, m)
                except ApiError as err:
                    res.error = err
            return out

        results = await self.ctl.write(build)
        for m, r in zip(moves, results, strict=True):
            log.info(
                "alter_chunk",
                topic=r.topic,
                partition=r.partition,
                start_offset=r.start_offset,
                target=m.broker_ids if m.caught_up < 0 and m.leaving < 0 and m.log_start < 0 else None,
                caught_up=m.caught_up if m.caught_up >= 0 else None,
                leaving=m.leaving if m.leaving >= 0 else None,
                log_start=m.log_start if m.log_start >= 0 else None,
                error=r.error.code if r.error else 0,
            )
        return results

    def _move(self, image: MetadataImage, batch: Batch, state: dict, m: ChunkMove) -> None:
        name = f"{m.topic}-{m.partition}"
        t = image.topic(m.topic)
        p = None if t is None else t.partitions.get(m.partition)
        if t is None or p is None:
            raise ApiError(Errors.UNKNOWN_TOPIC_OR_PARTITION, f"No partition {name}.")
        key = (t.id, m.partition, m.start_offset)
        c = state.get(key)
        if c is None:
            c = next((x for x in t.chunks.get(m.partition, ()) if x.start_offset == m.start_offset), None)
        if c is None or not c.replicas:
            raise ApiError(
                Errors.INVALID_REQUEST, f"Partition {name} has no inactive chunk starting at offset {m.start_offset}."
            )
        if m.chunk_epoch >= 0 and m.chunk_epoch != c.chunk_epoch:
            raise ApiError(
                Errors.FENCED_LEADER_EPOCH,
                f"Chunk {name}@{m.start_offset} is at epoch {c.chunk_epoch}, the request has {m.chunk_epoch}.",
            )
        if m.log_start >= 0:
            nxt = self._delete_records(c, m.log_start, name)
        elif m.leaving >= 0:
            nxt = self._leave(c, m.leaving)
        elif m.caught_up >= 0:
            nxt = self._caught_up(c, m.caught_up, name)
        else:
            nxt = self._retarget(image, p, c, list(m.broker_ids), name)
        if nxt is None:
            return
        rec = ChunkChangeRecord(partition_id=m.partition, topic_id=t.id, start_offset=m.start_offset)
        if nxt.replicas != c.replicas:
            rec.replicas = list(nxt.replicas)
            if nxt.replicas:
                rec.directories = _directories(image, c.replicas, c.directories, nxt.replicas)
        if nxt.isr != c.isr:
            rec.isr = list(nxt.isr)
        if nxt.adding_replicas != c.adding_replicas:
            rec.adding_replicas = list(nxt.adding_replicas)
        if nxt.removing_replicas != c.removing_replicas:
            rec.removing_replicas = list(nxt.removing_replicas)
        if nxt.log_start_offset != c.log_start_offset:
            rec.log_start_offset = nxt.log_start_offset
        batch.add(rec)
        state[key] = replace(nxt, chunk_epoch=c.chunk_epoch + 1)

    @staticmethod
    def _delete_records(c: ChunkInfo, offset: int, name: str) -> ChunkInfo | None:
        if not c.start_offset <= offset <= c.end_offset + 1:
            raise ApiError(
                Errors.OFFSET_OUT_OF_RANGE,
                f"Offset {offset} is outside chunk {name}@{c.start_offset} ({c.start_offset}..{c.end_offset}).",
            )
        return replace(c, log_start_offset=offset) if offset > c.first_offset else None

    @staticmethod
    def _leave(c: ChunkInfo, b: int) -> ChunkInfo | None:
        if b not in c.replicas:
            return None  # already gone: a repeated report
        return replace(
            c,
            replicas=tuple(r for r in c.replicas if r != b),
            isr=tuple(r for r in c.isr if r != b),
            adding_replicas=tuple(r for r in c.adding_replicas if r != b),
            removing_replicas=tuple(r for r in c.removing_replicas if r != b),
        )

    @staticmethod
    def _caught_up(c: ChunkInfo, b: int, name: str) -> ChunkInfo | None:
        if b not in c.replicas:
            raise ApiError(
                Errors.INVALID_REPLICA_ASSIGNMENT,
                f"Broker {b} is not a replica of chunk {name}@{c.start_offset} (replicas {list(c.replicas)}).",
            )
        if b in c.isr:
            return None
        nxt = replace(c, isr=(*c.isr, b))
        return _maybe_complete(nxt)

    @staticmethod
    def _retarget(
        image: MetadataImage, p: PartitionInfo, c: ChunkInfo, target: list[int], name: str
    ) -> ChunkInfo | None:
        what = f"chunk {name}@{c.start_offset}"
        check_manual_replicas(image, target, None, what)
        rf = replication_factor(p)
        if len(target) != rf:
            raise ApiError(
                Errors.INVALID_REPLICA_ASSIGNMENT,
                f"The assignment for {what} names {len(target)} broker(s), the partition has {rf} replica(s).",
            )
        current = list(c.replicas)
        removing = [r for r in current if r not in target]
        adding = [r for r in target if r not in c.isr]
        if not adding:
            nxt = replace(
                c,
                replicas=tuple(target),
                isr=tuple(r for r in c.isr if r in target),
                adding_replicas=(),
                removing_replicas=(),
            )
        else:
            nxt = replace(
                c,
                replicas=tuple(target + removing),
                adding_replicas=tuple(adding),
                removing_replicas=tuple(removing),
            )
        same = (nxt.replicas, nxt.isr, nxt.adding_replicas, nxt.removing_replicas) == (
            c.replicas,
            c.isr,
            c.adding_replicas,
            c.removing_replicas,
        )
        return None if same else nxt


def _maybe_complete(c: ChunkInfo) -> ChunkInfo:
    """A move completes once every replica of its target holds the whole chunk."""
    if not c.adding_replicas and not c.removing_replicas:
        return c
    target = [r for r in c.replicas if r not in c.removing_replicas]
    if not target or not set(target) <= set(c.isr):
        return c
    return replace(
        c,
        replicas=tuple(target),
        isr=tuple(r for r in c.isr if r in target),
        adding_replicas=(),
        removing_replicas=(),
    )


def _directories(
    image: MetadataImage, old: tuple[int, ...], old_dirs: tuple[UUID, ...], replicas: tuple[int, ...] | list[int]
) -> list[UUID]:
    """Each replica's log dir, aligned with `replicas`: kept for brokers that stay, the broker's
    default for new ones."""
    known = dict(zip(old, old_dirs, strict=False))
    return [known[r] if r in known else default_directory(image, r) for r in replicas]
