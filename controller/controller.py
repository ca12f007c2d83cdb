"""The controller core: one writer of the metadata log.

Every mutating operation runs `write(build)` under one lock: `build(image, batch)` validates
against the current (committed) image and adds records to `batch`; the batch is appended as one
record batch, fsynced, then replayed into the image, and only then is the operation's result
returned (an operation that answers with the state it produced reads it in `batch.on_commit`).
Reads (Fetch, DescribeCluster) never take the lock.

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
from controller.log_dirs import DirMeta, StartupError, ensure_formatted
from controller.metadata_log import LogCorruption, MetadataLog
from controller.placement import ReplicaPlacer
from controller.snapshots import SnapshotError, SnapshotStore, encode_snapshot
from metadata import config_defs
from metadata.image import BROKER_RESOURCE, MetadataImage

log = structlog.get_logger(__name__)

T = TypeVar("T")

# The single-voter quorum never holds an election, so its leader epoch is fixed.
LEADER_EPOCH = 1


class FatalError(Exception):
    """The controller cannot go on safely (a failed log write); the process exits."""


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
        self.dirs: list[DirMeta] = []
        self.log = MetadataLog(config.metadata_dir, leader_epoch=LEADER_EPOCH)
        self.snapshots = SnapshotStore(self.log.dir)
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
        """Format or check the log dirs, load the latest snapshot, recover and replay the log."""
        self.dirs = ensure_formatted(self.config.all_dirs, self.node_id, self.config.cluster_id)
        self.cluster_id = self.dirs[0].cluster_id
        self.log.dir.mkdir(parents=True, exist_ok=True)
        self.snapshots.open()
        latest = self.snapshots.latest()
        try:
            if latest is not None:
                self.state.load_snapshot(self.snapshots.load(latest), latest)
            report = self.log.open(latest or 0)
        except (SnapshotError, LogCorruption) as e:
            raise StartupError(str(e)) from None
        replayed = 0
        for data in self.log.read_batches(self.log.start_offset):
            replayed += self.state.apply_batch_bytes(data)
        if self.image.offset != self.log.end_offset - 1:
            raise StartupError(
                f"replaying the metadata log ended at offset {self.image.offset}, expected {self.log.end_offset - 1}"
            )
        self._bytes_since_snapshot = self.log.size_bytes
        self.sessions.touch_all(self.image.brokers)
        report.update(snapshot=latest, replayed_records=replayed, cluster_id=self.cluster_id)
        return report

    # ---- the single write path
    async def write(self, build: Callable[[MetadataImage, Batch], T]) -> T:
        # Shielded: a client that disconnects cancels its request, but an append already handed
        # to the writer thread must still be indexed and applied, or the next batch would reuse
        # its offsets.
        task = asyncio.get_running_loop().create_task(self._write(build))
        task.add_done_callback(_consume_exception)
        return await asyncio.shield(task)

    async def _write(self, build: Callable[[MetadataImage, Batch], T]) -> T:
        async with self._lock:
            if self.fatal_error is not None or self._closed:
                raise FatalError("the controller is stopping")
            batch = Batch(self.log.end_offset)
            result = build(self.image, batch)
            if batch.records:
                await self._commit(batch)
            for fn in batch.committed:
                fn(self.image)
            return result

    async def _commit(self, batch: Batch) -> None:
        try:
            base, size = await self.log.append(batch.records)
        except OSError as e:
            self._fatal(e, "metadata_log_append_failed")
            raise FatalError(str(e)) from e
        try:
            self.state.apply(batch.records, base)
        except Exception as e:
            # The batch is durable but the image could not take it: memory no longer matches
            # the log, so stop; a restart replays the log from disk.
            self._fatal(e, "metadata_replay_failed")
            raise FatalError(repr(e)) from e
        self._bytes_since_snapshot += size
        if self._bytes_since_snapshot >= self.config.snapshot_max_bytes and self._snapshot_task is None:
            await self._begin_snapshot()

    def _fatal(self, exc: BaseException, event: str) -> None:
        if self.fatal_error is None:
            self.fatal_error = exc
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
        data = encode_snapshot(image, LEADER_EPOCH, int(time.time() * 1000))
        return self.snapshots.write(data, end)

    def latest_snapshot(self) -> int | None:
        """End offset of the snapshot a follower below the log start should load."""
        start = self.log.start_offset
        return start if start > 0 and self.snapshots.path(start).exists() else self.snapshots.latest()

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
