"""The controller core: one writer of the metadata log, the Raft leader of the quorum.

Every mutating operation runs `write(build)` under one lock: `build(image, batch)` validates
against the current (committed) image and adds records to `batch`; the batch is appended as one
record batch in the leader's epoch, fsynced, and once a majority of voters hold it (the high
watermark passes it) it is replayed into the image; only then is the operation's result
returned (an operation that answers with the state it produced reads it in `batch.on_commit`).
Reads (Fetch, DescribeCluster) never take the lock.

Only the active controller writes. A voter elected leader first appends the LEADER_CHANGE
control batch of its epoch (KIP-595, as KafkaRaftClient does), waits until it commits (so every record of earlier epochs is committed too), replays the
log up to there and only then acts (`active`); a standby replays committed records as its high
watermark moves, so a failover starts from a warm image. Losing the leadership fails the writes
waiting to commit with NotControllerError (they may still commit under the next leader, as in
Kafka, so a client retrying them sees e.g. TOPIC_ALREADY_EXISTS).

After an append, once `metadata.log.max.record.bytes.between.snapshots` bytes have been written
since the last snapshot, the log is rolled at its end offset and the image at that point is
written as a snapshot in the background; when it is durable the older log segments are deleted.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, TypeVar

import structlog

from controller.config import ControllerConfig
from controller.fencing import BrokerSessions
from controller.image_state import ImageState
from controller.log_dirs import META_PROPERTIES, DirMeta, StartupError, ensure_formatted
from controller.metadata_log import LogCorruption, MetadataLog
from controller.placement import ReplicaPlacer
from controller.raft.client import RaftClient
from controller.raft.cluster_id_check import ClusterIdCheck
from controller.raft.quorum_state import QuorumStateError
from controller.raft.state import NotLeaderError
from controller.snapshots import SnapshotError, SnapshotStore, encode_snapshot
from metadata import config_defs
from metadata.image import BROKER_RESOURCE, MetadataImage
from metadata.voters import voters_batch
from protocol.errors import ProtocolError
from protocol.records import iter_batches

log = structlog.get_logger(__name__)

T = TypeVar("T")

REPLAY_READ_BYTES = 8 << 20


class FatalError(Exception):
    """The controller cannot go on safely (a failed log write); the process exits."""


class NotControllerError(Exception):
    """This controller is not the active one (a standby, or it lost the leadership): NOT_CONTROLLER."""


class Batch:
    """The records one operation writes; offsets are known before the append (single writer)."""

    def __init__(self, base_offset: int) -> None:
        self.base_offset = base_offset
        self.records: list[Any] = []
        self.committed: list[Callable[[MetadataImage], None]] = []

    @property
    def next_offset(self) -> int:
        return self.base_offset + len(self.records)

    def add(self, record: Any) -> int:
        """Add a record; returns the offset it will have."""
        self.records.append(record)
        return self.base_offset + len(self.records) - 1

    def extend(self, records: list[Any]) -> None:
        self.records.extend(records)

    def on_commit(self, fn: Callable[[MetadataImage], None]) -> None:
        """Call `fn(image)` with the image that includes this batch, once it is applied (still
        under the write lock, so no later operation is in it). Not called if the write fails."""
        self.committed.append(fn)


class Controller:
    def __init__(self, config: ControllerConfig) -> None:
        self.config = config
        self.node_id = config.node_id
        self.cluster_id = ""
        self.cluster_id_check = ClusterIdCheck()
        self.dirs: list[DirMeta] = []
        self.log = MetadataLog(config.metadata_dir)
        self.snapshots = SnapshotStore(self.log.dir)
        self.raft = RaftClient(
            config.node_id, config.voters, self.log, self.snapshots, self,
            election_timeout_ms=config.election_timeout_ms, fetch_timeout_ms=config.fetch_timeout_ms,
            security=config.voter_security, listener_name=config.listeners[0].listener,
            bootstrap_servers=config.bootstrap_servers,
        )
        # True once this voter leads and has replayed everything committed before its epoch
        self.active = False
        self.active_epoch = -1
        self._activation: asyncio.Task | None = None
        self._activated = asyncio.Event()
        self._replay_lock = asyncio.Lock()
        self.state = ImageState()
        self.sessions = BrokerSessions(config.session_timeout_ms)
        self.placer = ReplicaPlacer()
        # broker id -> the offset a broker in controlled shutdown must reach before it may stop
        self.shutdown_offsets: dict[int, int] = {}
        self.on_fatal: Callable[[BaseException], None] | None = None
        self.fatal_error: BaseException | None = None
        self._lock = asyncio.Lock()
        self._bytes_since_snapshot = 0
        self._snapshot_task: asyncio.Task | None = None
        self._closed = False

    @property
    def image(self) -> MetadataImage:
        return self.state.image

    # ---- start-up (blocking, before anything is served)
    def open(self) -> dict[str, Any]:
        """Format or check the log dirs, load the latest snapshot, recover the log and read the
        quorum state. Records after the snapshot are replayed once known committed: a single
        voter's log is (each append was its own majority), a quorum's is learnt from the leader."""
        if self.config.dynamic_quorum and not (self.config.metadata_dir / META_PROPERTIES).exists():
            raise StartupError(f"metadata log dir {self.config.metadata_dir} is not formatted: a controller of a quorum "
                               "without controller.quorum.voters is formatted first, with `kafka-storage.sh format -t "
                               "<cluster id> -c <this config>` and one of --standalone, --initial-controllers or "
                               "--no-initial-controllers (KIP-853)")
        self.dirs = ensure_formatted(self.config.all_dirs, self.node_id, self.config.cluster_id,
                                     len(self.config.voters))
        meta_dir = next(d for d in self.dirs if d.path == self.config.metadata_dir)
        self.cluster_id = self.dirs[0].cluster_id
        self.log.dir.mkdir(parents=True, exist_ok=True)
        self.snapshots.open()
        latest = self.snapshots.latest()
        try:
            if latest is not None:
                self.state.load_snapshot(self.snapshots.load(latest), latest)
            report = self.log.open(latest or 0, self.snapshots.epoch(latest) if latest else 0)
            election = self.raft.open(self.cluster_id, meta_dir.directory_id, latest)
        except (SnapshotError, LogCorruption, QuorumStateError, ProtocolError) as e:
            raise StartupError(str(e)) from None
        self.raft.high_watermark = latest or 0
        replayed = 0
        if self.config.single_voter:
            for data in self.log.read_batches(self.log.start_offset):
                replayed += self.state.apply_batch_bytes(data)
            if self.image.offset != self.log.end_offset - 1:
                raise StartupError(
                    f"replaying the metadata log ended at offset {self.image.offset}, expected {self.log.end_offset - 1}"
                )
            self.raft.high_watermark = self.log.end_offset
        self._bytes_since_snapshot = self.log.size_bytes
        report.update(snapshot=latest, replayed_records=replayed, cluster_id=self.cluster_id,
                      epoch=election.epoch, voters=",".join(str(v) for v in sorted(self.raft.voters)))
        return report

    def start(self) -> None:
        """Join the quorum (elections, replication); call once serving."""
        self.raft.start()

    async def wait_active(self) -> None:
        """Return once this controller is the active one (used by a single voter before it listens)."""
        while not self.active and self.fatal_error is None:
            await self._activated.wait()

    # ---- what the Raft client tells us (RaftListener)
    def leader_changed(self, epoch: int, leader_id: int) -> None:
        if self.active:
            log.warning("controller_deactivated", epoch=self.active_epoch, new_epoch=epoch, new_leader=leader_id)
        self.active = False
        self.active_epoch = -1
        self._activated.clear()
        self.shutdown_offsets.clear()
        if self._activation is not None:
            self._activation.cancel()
            self._activation = None
        if leader_id == self.node_id:
            self._activation = asyncio.get_running_loop().create_task(self._activate(epoch))

    async def committed(self, high_watermark: int) -> None:
        if not self.active:
            await self._catch_up(high_watermark)
            await self._maybe_snapshot()

    async def snapshot_loaded(self, end_offset: int) -> None:
        async with self._replay_lock:
            loop = asyncio.get_running_loop()
            records = await loop.run_in_executor(None, self.snapshots.load, end_offset)
            self.state.load_snapshot(records, end_offset)
            self._bytes_since_snapshot = 0

    async def _activate(self, epoch: int) -> None:
        """Become the active controller of `epoch`: commit a record of our own epoch (which
        commits everything before it), replay up to there, then take requests."""
        try:
            async with self._lock:
                base, _ = await self.raft.append_leader_change(epoch)
                await self.raft.wait_committed(base + 1, epoch)
                await self._catch_up(base + 1)
                if self.raft.epoch != epoch or not self.raft.is_leader:
                    return
                # Sessions start afresh: a broker that heartbeated to the old leader has a full
                # session timeout to find us (as Kafka's new active controller does).
                self.sessions.touch_all(self.image.brokers)
                self.active = True
                self.active_epoch = epoch
                self._activated.set()
                log.info("controller_activated", epoch=epoch, offset=self.image.offset,
                         high_watermark=self.raft.high_watermark)
        except NotLeaderError:
            return
        except OSError as e:
            self._fatal(e, "metadata_log_append_failed")

    async def _catch_up(self, high_watermark: int) -> None:
        """Replay committed records from the log into the image, up to `high_watermark`."""
        async with self._replay_lock:
            while self.image.offset + 1 < high_watermark:
                offset = self.image.offset + 1
                data = await self.log.read(offset, REPLAY_READ_BYTES, upto=high_watermark)
                if not data:
                    return
                view = memoryview(data)
                for pos, h in iter_batches(data, check_crc=False):
                    if h.base_offset < offset:
                        continue
                    self.state.apply_batch_bytes(bytes(view[pos : pos + h.size]))
                    self._bytes_since_snapshot += h.size

    # ---- the single write path
    async def write(self, build: Callable[[MetadataImage, Batch], T]) -> T:
        # Shielded: a client that disconnects cancels its request, but an append already handed
        # to the writer thread must still be indexed and applied, or the next batch would reuse
        # its offsets.
        task = asyncio.get_running_loop().create_task(self._write(build))
        task.add_done_callback(_consume_exception)
        return await asyncio.shield(task)

    async def _write(self, build: Callable[[MetadataImage, Batch], T]) -> T:
        if not self.active:
            raise NotControllerError("not the active controller")
        async with self._lock:
            if self.fatal_error is not None or self._closed:
                raise FatalError("the controller is stopping")
            epoch = self.active_epoch
            if not self.active or epoch < 0:
                raise NotControllerError("not the active controller")
            batch = Batch(self.log.end_offset)
            result = build(self.image, batch)
            if batch.records:
                await self._commit(batch, epoch)
            for fn in batch.committed:
                fn(self.image)
            return result

    async def _commit(self, batch: Batch, epoch: int) -> None:
        try:
            base, size = await self.raft.append(batch.records, epoch)
            await self.raft.wait_committed(base + len(batch.records), epoch)
        except NotLeaderError as e:
            raise NotControllerError(str(e)) from None
        except OSError as e:
            self._fatal(e, "metadata_log_append_failed")
            raise FatalError(str(e)) from e
        try:
            async with self._replay_lock:
                if self.image.offset + 1 == base:
                    self.state.apply(batch.records, base)
                    self._bytes_since_snapshot += size
            await self._catch_up(base + len(batch.records))
        except Exception as e:
            # The batch is durable but the image could not take it: memory no longer matches
            # the log, so stop; a restart replays the log from disk.
            self._fatal(e, "metadata_replay_failed")
            raise FatalError(repr(e)) from e
        await self._maybe_snapshot()

    async def _maybe_snapshot(self) -> None:
        """Snapshot once enough was written, at a point where the image holds the whole log
        (committed and applied), so the snapshot ends where a log segment starts."""
        if (self._bytes_since_snapshot >= self.config.snapshot_max_bytes and self._snapshot_task is None
                and self.image.offset + 1 == self.log.end_offset and self.log.end_offset > self.log.start_offset):
            await self._begin_snapshot()

    def _fatal(self, exc: BaseException, event: str) -> None:
        if self.fatal_error is None:
            self.fatal_error = exc
            self._activated.set()  # wakes a start-up waiting to be active: it is not going to be
            log.critical(event, error=repr(exc))
            if self.on_fatal is not None:
                self.on_fatal(exc)

    # ---- snapshots
    async def _begin_snapshot(self) -> None:
        end = self.log.end_offset
        image = self.image
        try:
            await self.log.roll()
        except OSError as e:
            self._fatal(e, "metadata_log_roll_failed")
            raise FatalError(str(e)) from e
        self._bytes_since_snapshot = 0
        self._snapshot_task = asyncio.get_running_loop().create_task(self._snapshot(image, end))

    async def _snapshot(self, image: MetadataImage, end: int) -> None:
        loop = asyncio.get_running_loop()
        try:
            t0 = time.monotonic()
            size = await loop.run_in_executor(None, self._write_snapshot, image, end)
            deleted = await self.log.truncate_before(end)
            old = await loop.run_in_executor(None, self.snapshots.delete_older_than, end)
            log.info(
                "snapshot_written",
                end_offset=end,
                bytes=size,
                log_segments_deleted=deleted,
                old_snapshots_deleted=old,
                ms=round((time.monotonic() - t0) * 1000, 1),
            )
        except OSError as e:
            # The log still holds everything; the next threshold tries again.
            log.error("snapshot_failed", end_offset=end, error=repr(e))
        finally:
            self._snapshot_task = None

    def _write_snapshot(self, image: MetadataImage, end: int) -> int:
        epoch, now = self.log.epochs.epoch_at(end - 1), int(time.time() * 1000)
        data = encode_snapshot(image, epoch, now)
        if self.raft.membership.dynamic:  # the voter set it covers, for replicas that start from it (KIP-853)
            records = sum(h.record_count for _, h in iter_batches(data, check_crc=False))
            data += voters_batch(self.raft.membership.history.at(end), epoch, now, records)
        return self.snapshots.write(data, end)

    # ---- helpers the managers share
    def unclean_for(self, image: MetadataImage) -> Callable[[str], bool]:
        cluster = image.configs.get((BROKER_RESOURCE, ""), {})
        node = image.configs.get((BROKER_RESOURCE, str(self.node_id)), {})
        merged = {**cluster, **node}

        def check(topic: str) -> bool:
            return config_defs.topic_bool(
                "unclean.leader.election.enable", image.topic_config(topic), merged, self.config.static
            )

        return check

    # ---- shutdown
    async def close(self) -> None:
        self._closed = True
        if self._activation is not None:
            self._activation.cancel()
        await self.raft.close()
        async with self._lock:
            task = self._snapshot_task
            if task is not None:
                try:
                    await asyncio.wait_for(asyncio.shield(task), 30)
                except (TimeoutError, asyncio.CancelledError):
                    pass
            self.log.close()


def _consume_exception(task: asyncio.Task) -> None:
    """The caller may be gone (cancelled); its operation's error then has no one to read it."""
    if not task.cancelled():
        task.exception()
