"""The diskless coordinator (KIP-1164's topic-based implementation).

The leader of partition N of `__diskless_metadata` is diskless coordinator N. Its state is the
partition's records materialized into SQLite (materializer.py) plus, while it leads, a speculative
view (view.py) of that state and the records appended but not yet replicated. A mutating
operation follows KIP-1164's seven steps: NOT_COORDINATOR unless this broker leads the partition
and has it loaded; check against the view (which then holds the operation's records as pending,
so the next operation does not wait: pipelining); append the records in one batch before any
await; wait for the high watermark (acks=all); apply to SQLite (queued on the database's thread,
where every later read of the state runs after it: the answer does not wait for the write);
answer. A failed append or replication leaves the view ahead of the log, so the partition is
reloaded from the log.

Loading (when this broker becomes the leader): wait until the high watermark covers the whole
local log (every record a new leader holds is committed or the leadership goes), catch SQLite up
(a missing or stale file is rebuilt from the log), then build the view from it.

The coordinator also keeps its partitions in line with the cluster metadata: a diskless partition
mapped to it (PartitionRecord's DisklessCoordinator) that it does not know is created
(DisklessPartitionCreatedRecord), a topic it knows that the metadata no longer has is deleted
(DisklessDeleteTopics' operation), a partition the metadata no longer has, or has as a new
creation of its index (KIP-253 deletes partitions and a growth may re-create one before the next
look: `incarnation`), is deleted (DisklessPartitionDeletedRecord), and a partition the metadata shows at a newer leader epoch
than its own starts that epoch (DisklessLeaderEpochRecord; KIP-253: a count change bumps every
partition's epoch, and the coordinator is where a diskless partition's epochs end).

Beside it, each getting the coordinator's parts it uses: retention (retention.py), the WAL files'
handover and deletion (file_lifecycle.py, `self.files`) and snapshots of the state
(snapshot_taker.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from uuid import UUID

import structlog

from broker.coordinator import metadata_caught_up, wall_clock_ms
from broker.coordinator.internal_topic import create_internal_topic
from broker.coordinator.partitioned import PartitionedCoordinator, state_write_error
from broker.diskless.batches import BatchLookup, BatchResult, FoundBatches, ProducerInfo
from broker.diskless.config import DisklessConfig
from broker.diskless.coordinator.file_lifecycle import FileLifecycle
from broker.diskless.coordinator.materializer import CATCH_UP_ERRORS, Materializer
from broker.diskless.coordinator.partition import DisklessCoordinatorPartition as Partition
from broker.diskless.coordinator.retention import DisklessRetention
from broker.diskless.coordinator.snapshot_taker import SnapshotTaker
from broker.diskless.coordinator.snapshots import SnapshotStore
from broker.diskless.coordinator.state import DisklessState
from broker.diskless.coordinator.view import CoordinatorView
from broker.diskless.object_store import open_object_store
from metadata.diskless import DISKLESS_METADATA_TOPIC
from metadata.image import MetadataImage, PartitionInfo
from metadata.records import encode_record
from protocol.errors import Errors
from protocol.generated.diskless_create_partitions import DisklessCreatePartitionsRequest as CP
from protocol.generated.diskless_describe_files import DisklessDescribeFilesResponse as DF

if TYPE_CHECKING:
    from broker.diskless.coordinator.materializer import CoordinatorReplicas
    from broker.ports import Forwarder, MetadataView
    from broker.replication.partition import Partition as Replica

log = structlog.get_logger(__name__)

RECONCILE_INTERVAL_MS = 200
MAX_FILE_DETAILS = 10_000  # per coordinator in a DisklessDescribeFiles answer (the newest files)
SNAPSHOT_CHECK_INTERVAL_MS = 200
LOAD_RETRY_S = 1.0
LIST_EARLIEST, LIST_LATEST, LIST_MAX_TIMESTAMP = -2, -1, -3


def incarnation(info: PartitionInfo) -> int:
    """Which creation of its index a partition is: partition 0's leader epoch before the
    growth that created it (KIP-253's LeaderEpochAfterCreation). Every count change bumps
    partition 0, which is never deleted, so a later creation of an index has a larger one; -1
    for a partition created with its topic."""
    return dict(info.epochs_after_creation).get(0, -1)


def partition_gone(image: MetadataImage, key: tuple[UUID, int], known: int) -> bool:
    """Whether the metadata no longer has this partition of a topic it has (KIP-253 deleted
    it), or has a later creation of its index (later ones are larger; -2: ours was not
    recorded, never taken as gone). The image is caught up before a coordinator loads
    (DisklessCoordinator._load), so it is not older than any image our records were written from."""
    t = image.topics.get(key[0])
    if t is None:
        return False  # a deleted topic: delete_topics
    info = t.partitions.get(key[1])
    return info is None or (known != -2 and incarnation(info) > known)


async def _answered(code: int) -> int:
    return code


class DisklessCoordinator(PartitionedCoordinator[Partition]):
    topic = DISKLESS_METADATA_TOPIC
    event = "diskless"
    reload_on_new_epoch = True

    def __init__(self, node_id: int, replicas: CoordinatorReplicas, metadata: MetadataView, forward: Forwarder,
                 log_dir: Path, config: DisklessConfig) -> None:
        """`replicas`: the replicas here (the ReplicaManager); `metadata`: the broker's image and
        whether it caught up; `forward` sends an admin request to the controller (creating
        __diskless_metadata); the SQLite files live under `log_dir`."""
        self.node_id = node_id
        self._diskless_checked: tuple[object, bool] = (None, False)  # (image, any diskless partition in it)
        self.config = config
        self.forward = forward
        super().__init__(replicas, metadata, config.metadata_topic_num_partitions, config.coordinator_load_buffer_size,
                         config.coordinator_write_timeout_ms)
        self.snapshots = SnapshotStore(open_object_store(config.storage_url, endpoint=config.s3_endpoint,
                                                         region=config.s3_region))
        self.states = Materializer(replicas, Path(log_dir) / "diskless-coordinator", self._load_buffer_size,
                                   self.snapshots)
        self.files = FileLifecycle(self._partitions, self.status, self._wait_previous, self._write, self.states)
        self.retention = DisklessRetention(replicas.topic_config, self.states, self._write, self._owns, self._spawn)
        self.snapshot_taker = SnapshotTaker(config.coordinator_snapshot_interval_records,
                                            lambda index: self.replicas.get(self.topic, index), self.states,
                                            self.snapshots, self._owns, self._spawn)
        led = self._partitions.values
        self._every(RECONCILE_INTERVAL_MS, self._reconcile, "diskless_reconcile_failed")
        self._every(config.retention_check_interval_ms, lambda: self.retention.check(led()),
                    "diskless_retention_failed")
        self._every(config.gauges_interval_ms, lambda: self._spawn(self._log_gauges()), "diskless_gauges_failed")
        self._every(SNAPSHOT_CHECK_INTERVAL_MS, lambda: self.snapshot_taker.check(led()),
                    "diskless_snapshot_check_failed")
        self._every(config.producer_id_expiration_check_interval_ms, self._expire_producers,
                    "diskless_producer_expiration_failed")
        self._watch_leadership()

    def start(self) -> None:
        self.states.start()
        super().start()

    def shutdown(self) -> None:
        super().shutdown()
        self.states.close()

    # ------------------------------------------------------------------ partitions
    def _new_partition(self, index: int, epoch: int) -> Partition:
        return Partition(index, epoch)

    def _forget(self, ps: Partition) -> None:
        ps.view = None
        if ps.retention is not None:
            ps.retention.cancel()
        self.states.drop_staged(ps.index)

    async def _load(self, ps: Partition, p: Replica) -> None:  # type: ignore[override]
        await metadata_caught_up(self.metadata)
        started = time.monotonic()
        while self._owns(ps) and p.high_watermark < p.log.log_end_offset:
            await p.wait_for_high_watermark(p.log.log_end_offset, 1.0)
        if not self._owns(ps):
            return
        while True:
            try:
                local = await self.states.catch_up(ps.index)
                break
            except CATCH_UP_ERRORS as e:  # e.g. no snapshot yet for a database behind the log start
                log.warning("diskless_partition_load_retry", partition=ps.index, error=str(e))
                await asyncio.sleep(LOAD_RETRY_S)
                if not self._owns(ps):
                    return
        if local is None or not self._owns(ps):
            return
        view = await self.states.run(ps.index, CoordinatorView.from_state)
        if not self._owns(ps):
            return
        ps.view = view
        ps.loading = False
        log.info("diskless_partition_loaded", partition=ps.index, epoch=ps.epoch, applied_offset=local.applied,
                 partitions=len(view.partitions), ms=round((time.monotonic() - started) * 1000))

    def _reload(self, ps: Partition) -> None:
        """The view went ahead of the log (an append failed): rebuild it from the log."""
        if not self._owns(ps) or ps.loading:
            return
        p = self.replicas.get(self.topic, ps.index)
        if p is None or not p.is_leader:
            return
        ps.loading = True
        ps.view = None
        self.states.drop_staged(ps.index)
        ps.load_task = self._spawn(self._load(ps, p))

    async def _create_topic(self) -> None:
        # The controller maps partitions before the topic exists (with its own setting of
        # diskless.metadata.topic.num.partitions): enough partitions for every mapping made.
        image = self.metadata.image
        mapped = [info.diskless_coordinator for t in image.topics.values() for info in t.partitions.values()]
        partitions = max([self._default_partitions, *(i + 1 for i in mapped)])
        await create_internal_topic(
            self.metadata, self.forward, self.topic, partitions, self.config.metadata_topic_replication_factor,
            {"cleanup.policy": "delete", "retention.ms": "-1", "retention.bytes": "-1",
             "segment.bytes": str(self.config.metadata_topic_segment_bytes)},
            min_isr=self.config.metadata_topic_min_isr)

    def _image_incarnation(self, topic_id: UUID, partition: int) -> int:
        t = self.metadata.image.topics.get(topic_id)
        info = t.partitions.get(partition) if t is not None else None
        return -2 if info is None else incarnation(info)

    def coordinator_of(self, topic_id: UUID, partition: int) -> int:
        """The __diskless_metadata partition of a diskless partition, or -1."""
        image = self.metadata.image
        t = image.topics.get(topic_id)
        info = t.partitions.get(partition) if t is not None else None
        return -1 if info is None else info.diskless_coordinator

    def partition_for(self, key: str) -> int:
        """FindCoordinator's key for a diskless coordinator is its partition number."""
        return int(key)

    def led_partitions(self) -> list[int]:
        return sorted(self._partitions)

    def status(self, index: int) -> tuple[int, Partition | None]:
        if not self.active:
            return Errors.COORDINATOR_NOT_AVAILABLE, None
        ps = self._partitions.get(index)
        if ps is None:
            return Errors.NOT_COORDINATOR, None
        if ps.loading or ps.view is None:
            return Errors.COORDINATOR_LOAD_IN_PROGRESS, None
        return 0, ps

    # ------------------------------------------------------------------ the seven steps
    async def _write(self, ps: Partition, records: list[Any]) -> int:
        """Append `records` (one batch, now), wait for replication, apply to SQLite. 0 or the error."""
        code = await self._write_now(ps, records)
        self.files.note_write(ps, records)
        return code

    def _write_now(self, ps: Partition, records: list[Any]) -> Awaitable[int]:
        """Append `records` now, before the caller's next await, so the log holds them in the
        order the view checked them; the awaitable waits for replication and the SQLite apply."""
        if not records:
            return self._wait_previous(ps)
        err, first, done = self._append(ps, [(None, encode_record(r)) for r in records])
        if err:
            self._reload(ps)
            return _answered(state_write_error(err))
        self.states.stage(ps.index, first, records)
        ps.last_append = done
        return self._replicated(ps, done)

    async def _replicated(self, ps: Partition, done: asyncio.Future) -> int:
        code = await done
        if code:
            self.states.drop_staged(ps.index)
            self._reload(ps)
            return state_write_error(code)
        self.states.apply_soon(ps.index)  # every later read of the state runs after it
        return 0

    async def _wait_previous(self, ps: Partition) -> int:
        """An operation that wrote nothing still answers only after the records it was checked
        against (the pending ones) are committed."""
        if ps.last_append is not None and not ps.last_append.done():
            code = await ps.last_append
            if code:
                return state_write_error(code)
        self.states.apply_soon(ps.index)
        return 0

    def commit_file(self, req: Any, uploader: int) -> Awaitable[list[BatchResult]]:
        """DisklessCommitFile: the batches grouped by coordinator; each coordinator this broker
        leads checks and appends its share now (steps 3-4, before the caller's next await: the
        next commit may be checked and appended while this one replicates); the rest answer
        NOT_COORDINATOR. The awaitable gives one result per batch."""
        by_coordinator: dict[int, list[int]] = {}
        results: list[BatchResult | None] = [None] * len(req.batches)
        for i, b in enumerate(req.batches):
            by_coordinator.setdefault(self.coordinator_of(b.topic_id, b.partition_index), []).append(i)
        waits = []
        now = wall_clock_ms()
        for index, positions in by_coordinator.items():
            if index < 0:
                for i in positions:
                    results[i] = BatchResult(Errors.UNKNOWN_TOPIC_OR_PARTITION, "not a diskless partition")
                continue
            err, ps = self.status(index)
            if err:
                for i in positions:
                    results[i] = BatchResult(err, f"diskless coordinator {index} is not here")
                continue
            assert ps is not None and ps.view is not None
            sub = type(req)(object_key=req.object_key, object_format=req.object_format, file_size=req.file_size,
                            owner_ids=req.owner_ids, batches=[req.batches[i] for i in positions])
            share, record = ps.view.commit_file(sub, uploader, now)
            waits.append((ps, positions, share, self._write_now(ps, [record] if record is not None else [])))
        return self._commit_answers(req, waits, results)

    async def _commit_answers(self, req: Any, waits: list[Any], results: list[BatchResult | None]) -> list[BatchResult]:
        for ps, positions, share, write in waits:
            code = await write
            for i, r in zip(positions, share):
                results[i] = r if code == 0 or r.error_code else BatchResult(code, "the commit did not replicate")
            log.debug("diskless_commit", partition=ps.index, key=req.object_key, batches=len(positions), error=code)
        return [r if r is not None else BatchResult(Errors.UNKNOWN_SERVER_ERROR) for r in results]

    async def create_partitions(self, index: int, topics: list[Any]) -> int:
        err, ps = self.status(index)
        if err:
            return err
        assert ps is not None and ps.view is not None
        records = ps.view.create_partitions(topics, lambda tid, i: self.coordinator_of(tid, i) == index,
                                            self._image_incarnation)
        if records:
            log.info("diskless_partitions_created", coordinator=index, partitions=len(records))
        return await self._write(ps, records)

    async def delete_topics(self, index: int, topic_ids: list[UUID]) -> int:
        err, ps = self.status(index)
        if err:
            return err
        assert ps is not None and ps.view is not None
        records = [r for r in (ps.view.delete_topic(t) for t in topic_ids) if r is not None]
        return await self._write(ps, records)

    def _expire_producers(self) -> None:
        """Kafka's producer-id expiration for the coordinators led here: the leader decides and
        its record tells every replica which producers to forget."""
        for ps in self._partitions.values():
            if ps.loading or ps.view is None:
                continue
            records = ps.view.expire_producers(wall_clock_ms(), self.config.producer_id_expiration_ms)
            if records:
                log.info("diskless_producers_expired", coordinator=ps.index,
                         producers=sum(len(r.producer_ids) for r in records))
                self._spawn(self._write(ps, records))

    async def delete_records(self, topic_id: UUID, partition: int, offset: int) -> tuple[int, int]:
        err, ps = self.status(self.coordinator_of(topic_id, partition))
        if err:
            return err, -1
        assert ps is not None and ps.view is not None
        err, low, record = ps.view.delete_records(topic_id, partition, offset)
        if err:
            return err, -1
        code = await self._write(ps, [record] if record is not None else [])
        return code, low if code == 0 else -1

    async def _settled_view(self, topic_id: UUID, partition: int) -> tuple[int, Any, Any]:
        """(error, coordinator partition, the partition's view) once every operation before is settled."""
        err, ps = self.status(self.coordinator_of(topic_id, partition))
        if err:
            return err, None, None
        assert ps is not None and ps.view is not None
        code = await self._wait_previous(ps)
        if code:
            return code, None, None
        pv = ps.view.partitions.get((topic_id, partition))
        if pv is None:
            return Errors.UNKNOWN_TOPIC_OR_PARTITION, None, None
        return 0, ps, pv

    async def list_offsets(self, topic_id: UUID, partition: int, timestamp: int,
                           read_committed: bool = False) -> tuple[int, int, int]:
        """(error, timestamp, offset), consistent with every operation before it; "latest" for a
        read_committed reader is the last stable offset (KIP-98)."""
        code, ps, pv = await self._settled_view(topic_id, partition)
        if code:
            return code, -1, -1
        if timestamp == LIST_EARLIEST:
            return 0, -1, pv.log_start_offset
        if timestamp == LIST_LATEST:
            return 0, -1, pv.last_stable_offset() if read_committed else pv.high_watermark
        if timestamp == LIST_MAX_TIMESTAMP:
            found = await self.states.run(ps.index, DisklessState.max_timestamp, topic_id, partition)
        elif timestamp < 0:
            return Errors.INVALID_REQUEST, -1, -1
        else:
            found = await self.states.run(ps.index, DisklessState.offset_for_timestamp, topic_id, partition, timestamp)
        if found is None:
            return 0, -1, -1
        offset, ts = found
        return 0, ts, max(offset, pv.log_start_offset)

    async def epoch_end(self, topic_id: UUID, partition: int, epoch: int,
                        current_epoch: int = -1) -> tuple[int, int, int]:
        """OffsetForLeaderEpoch of a diskless partition: (error, epoch, end offset), consistent
        with every operation before it. `current_epoch` (the asker's) is checked against the
        partition's epoch here as a leader checks it (KIP-320): newer is UNKNOWN_LEADER_EPOCH (this
        coordinator has not started it yet, so batches of older epochs may still come: KIP-253's
        gate waits), older FENCED_LEADER_EPOCH."""
        code, _, pv = await self._settled_view(topic_id, partition)
        if code:
            return code, -1, -1
        if current_epoch >= 0 and current_epoch != pv.leader_epoch:
            return (Errors.FENCED_LEADER_EPOCH if current_epoch < pv.leader_epoch
                    else Errors.UNKNOWN_LEADER_EPOCH), -1, -1
        found, end = pv.epoch_end(epoch)
        return 0, found, end

    async def describe_producers(self, topic_id: UUID, partition: int) -> tuple[int, list[ProducerInfo]]:
        """The partition's producers (KIP-664's DescribeProducers), from the leader's view:
        consistent with every operation before it."""
        err, ps = self.status(self.coordinator_of(topic_id, partition))
        if err:
            return err, []
        assert ps is not None and ps.view is not None
        pv = ps.view.partitions.get((topic_id, partition))
        if pv is None:
            return Errors.UNKNOWN_TOPIC_OR_PARTITION, []
        return 0, pv.producer_infos()

    async def find_batches(self, lookups: list[BatchLookup], max_batches: int) -> list[FoundBatches]:
        """DisklessFindBatches for several partitions: one read of this broker's materialized
        state per coordinator partition, results in `lookups` order. Any replica answers (a
        follower's state may be a little behind, which a reader tolerates)."""
        found: list[FoundBatches | None] = [None] * len(lookups)
        by_index: dict[int, list[int]] = {}
        for i, lk in enumerate(lookups):
            index = self.coordinator_of(lk.topic_id, lk.partition)
            if index < 0:
                found[i] = FoundBatches(Errors.UNKNOWN_TOPIC_OR_PARTITION, -1, -1, [])
            elif self.replicas.get(self.topic, index) is None:
                found[i] = FoundBatches(Errors.NOT_COORDINATOR, -1, -1, [])
            else:
                by_index.setdefault(index, []).append(i)

        def read(state: DisklessState, positions: list[int]) -> list[FoundBatches]:
            known = state.partitions()
            out = []
            for i in positions:
                lk = lookups[i]
                parts = known.get((lk.topic_id, lk.partition))
                if parts is None:
                    out.append(FoundBatches(Errors.UNKNOWN_TOPIC_OR_PARTITION, -1, -1, []))
                    continue
                _, lso, hw = parts
                stable = state.last_stable_offset(lk.topic_id, lk.partition, hw)
                if lk.offset < lso or lk.offset > hw:
                    out.append(FoundBatches(Errors.OFFSET_OUT_OF_RANGE, lso, hw, [], stable))
                elif not lk.read_committed:
                    out.append(FoundBatches(0, lso, hw, state.find_batches(
                        lk.topic_id, lk.partition, lk.offset, lk.max_bytes, max_batches), stable))
                else:  # KIP-98: up to the last stable offset, with the aborted transactions overlapping
                    rows = state.find_batches(lk.topic_id, lk.partition, lk.offset, lk.max_bytes, max_batches, stable)
                    aborted = state.aborted_transactions(lk.topic_id, lk.partition, lk.offset,
                                                         rows[-1].last_offset + 1) if rows else []
                    out.append(FoundBatches(0, lso, hw, rows, stable, aborted))
            return out

        for index, positions in by_index.items():
            answers = await self.states.run(index, read, positions)
            for i, a in zip(positions, answers or [FoundBatches(Errors.NOT_COORDINATOR, -1, -1, [])] * len(positions)):
                found[i] = a
        return [f if f is not None else FoundBatches(Errors.UNKNOWN_SERVER_ERROR, -1, -1, []) for f in found]

    async def coordinator_state(self, index: int, gauges: bool = True) -> Any:
        """A coordinator's gauges as DisklessDescribeFiles answers them (without `gauges`: only
        its oldest live file, one cheap read)."""
        err, ps = self.status(index)
        if err:
            return DF.DisklessCoordinatorState(coordinator_id=index, error_code=err, oldest_file_timestamp_ms=-1)
        assert ps is not None
        if not gauges:
            oldest = await self.states.run(index, DisklessState.oldest_live_file_ms)
            return DF.DisklessCoordinatorState(coordinator_id=index, error_code=0,
                                               oldest_file_timestamp_ms=-1 if oldest is None else oldest)
        f = await self.states.run_beside(index, DisklessState.figures, index)  # a scan: off the apply thread
        return DF.DisklessCoordinatorState(
            coordinator_id=index, error_code=0, oldest_file_timestamp_ms=f.oldest_file_ms, partitions=f.partitions,
            files=f.files, live_files=f.live_files, live_batches=f.live_batches, live_bytes=f.live_bytes,
            owned_files=f.owned_files, pending_handovers=f.pending_handovers, pending_deletions=f.pending_deletions,
            files_handed_over=ps.files_handed_over, files_deleted=ps.files_deleted,
            last_snapshot_offset=ps.snapshot_offset or -1, last_snapshot_timestamp_ms=ps.snapshot_ms)

    async def describe_files(self, keys: list[str], details: bool) -> Any:
        """DisklessDescribeFiles for every coordinator this broker leads: per file which of them
        know it and whether one has live batches in it (an error when one of them cannot answer: the
        orphan scan then deletes nothing), each coordinator's gauges, and with `details` every
        file they know."""
        coordinators = [await self.coordinator_state(i, details) for i in sorted(self._partitions)]
        failed = next((c.error_code for c in coordinators if c.error_code), 0)
        known: dict[str, list[int]] = {}
        live: set[str] = set()
        file_details = []

        def read(state: DisklessState) -> tuple[set[str], set[str]]:
            k = state.known_files(keys)
            lv = {key for key in k if state.file_has_batches(key)}
            return k, lv

        for c in coordinators:
            if c.error_code:
                continue
            got = await self.states.run(c.coordinator_id, read)
            listed = await self.states.run_beside(c.coordinator_id, DisklessState.file_details, c.coordinator_id,
                                                  MAX_FILE_DETAILS) if details else []
            if got is None:
                failed = failed or Errors.NOT_COORDINATOR
                continue
            for key in got[0]:
                known.setdefault(key, []).append(c.coordinator_id)
            live |= got[1]
            file_details += [DF.DisklessFileDetail(coordinator_id=c.coordinator_id, object_key=key, file_size=size,
                                                   owner_ids=owners, live_batches=n, status=status)
                             for key, size, owners, n, status in listed or []]
        if not self.active or (not coordinators and keys):
            failed = failed or Errors.NOT_COORDINATOR
        return DF(files=[DF.DisklessDescribeFileResult(
            object_key=key, error_code=failed, error_message=None if not failed else "a coordinator cannot answer",
            has_live_batches=key in live, known_by=known.get(key, [])) for key in keys],
            coordinators=coordinators, file_details=file_details)

    async def _log_gauges(self) -> None:
        for index in sorted(self._partitions):
            try:
                c = await self.coordinator_state(index)
            except Exception:  # a background line: never a lost task's traceback
                log.exception("diskless_gauges_failed", coordinator=index)
                continue
            if c.error_code:
                continue
            log.info("diskless_coordinator_gauges", coordinator=index, partitions=c.partitions, files=c.files,
                     live_files=c.live_files, live_batches=c.live_batches, live_bytes=c.live_bytes,
                     oldest_file_ms=c.oldest_file_timestamp_ms, owned_files=c.owned_files,
                     pending_handovers=c.pending_handovers, pending_deletions=c.pending_deletions,
                     files_handed_over=c.files_handed_over, files_deleted=c.files_deleted)

    # ------------------------------------------------------------------ metadata reconciliation
    def _has_diskless(self, image: MetadataImage) -> bool:
        """Whether any partition is diskless; asked every reconcile, so answered once per image
        (a scan of 20,000 partitions every 200 ms held the event loop)."""
        if image is not self._diskless_checked[0]:
            found = any(info.diskless_coordinator >= 0 for t in image.topics.values() for info in t.partitions.values())
            self._diskless_checked = (image, found)
        return self._diskless_checked[1]

    def _reconcile(self) -> None:
        """Create the diskless partitions the metadata maps to a coordinator this broker leads
        and that it does not know; delete the topics the metadata no longer has."""
        image = self.metadata.image
        if image.topic(self.topic) is None:
            live = [b.id for b in image.live_brokers()]
            if live and min(live) == self.node_id and self._has_diskless(image):
                self.ensure_topic()  # the first diskless topic: its coordinators' log
            return
        for index, ps in list(self._partitions.items()):
            if ps.loading or ps.view is None:
                continue
            gone_keys = [key for key, pv in ps.view.partitions.items() if partition_gone(image, key, pv.incarnation)]
            deleted = [r for r in (ps.view.delete_partition(*key) for key in gone_keys) if r is not None]
            if deleted:
                # the rest next time: a re-created index is created once its predecessor is gone
                log.info("diskless_partitions_deleted", coordinator=index, partitions=len(deleted))
                self._spawn(self._write(ps, deleted))
                continue
            missing: dict[UUID, tuple[str, int]] = {}
            epochs: dict[tuple[UUID, int], int] = {}
            for t in image.topics.values():
                for part, info in t.partitions.items():
                    if info.diskless_coordinator != index:
                        continue
                    pv = ps.view.partitions.get((t.id, part))
                    if pv is None:
                        missing[t.id] = (t.name, max(part + 1, missing.get(t.id, ("", 0))[1]))
                    elif info.leader_epoch > pv.leader_epoch:
                        epochs[(t.id, part)] = info.leader_epoch
            if epochs:
                # KIP-253: the epoch a count change bumped ends here even if no batch of the new
                # one comes (a marked partition takes none); older batches are refused from now on
                records = ps.view.start_epochs(epochs)
                log.info("diskless_leader_epochs_started", coordinator=index, partitions=len(records))
                self._spawn(self._write(ps, records))
            if missing:
                self._spawn(self.create_partitions(index, [
                    CP.DisklessCreatablePartitions(topic_id=tid, name=name, num_partitions=n)
                    for tid, (name, n) in missing.items()]))
            gone = list({tid for tid, _ in ps.view.partitions if tid not in image.topics})
            if gone:
                self._spawn(self.delete_topics(index, gone))
