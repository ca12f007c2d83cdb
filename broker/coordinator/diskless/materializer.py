"""Every local replica of `__diskless_metadata` (leader or follower) materialized into its SQLite
file: records below the high watermark are applied in offset order, in an executor, with the
applied offset in the same transaction. The leader applies right after its records replicate (the
seed's step 6); a follower catches up in the background so it can answer DisklessFindBatches and
take over with a warm database.

A database that cannot be opened, or whose applied offset is outside the log (the log was
truncated below it, or it is from another incarnation of the topic), is deleted and rebuilt from
the log start.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import structlog

from broker.coordinator.diskless.state import DisklessState
from broker.storage.errors import StorageError
from metadata.diskless import DISKLESS_METADATA_TOPIC
from metadata.records import decode_record
from protocol.errors import ProtocolError
from protocol.records import decode_batches

log = structlog.get_logger(__name__)

CATCH_UP_INTERVAL_S = 0.05
APPLY_CHUNK_RECORDS = 2000  # records per SQLite transaction while catching up


def state_path(root: Path, index: int) -> Path:
    return root / f"{index}.sqlite"


def _open(path: Path, topic_id: str, log_start: int, log_end: int) -> DisklessState:
    """Open the database, or a fresh one when it is unusable for this log (blocking)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    marker = path.with_suffix(".topic")
    try:
        if marker.exists() and marker.read_text().strip() != topic_id:
            raise sqlite3.DatabaseError("from another incarnation of the topic")
        state = DisklessState(path)
        applied = state.applied_offset()
        if applied > log_end or (applied < log_start and applied != 0) or (applied == 0 and log_start > 0):
            state.close()
            raise sqlite3.DatabaseError(f"applied offset {applied} outside the log [{log_start}, {log_end}]")
        marker.write_text(topic_id)
        return state
    except sqlite3.DatabaseError as e:
        log.warning("diskless_state_rebuild", path=str(path), reason=str(e))
        for suffix in ("", "-wal", "-shm"):
            Path(str(path) + suffix).unlink(missing_ok=True)
        marker.write_text(topic_id)
        return DisklessState(path)


def _catch_up(state: DisklessState, lg: Any, upto: int, buffer: int) -> int:
    """Apply the log's records in [applied offset, upto) (blocking). Returns the new applied offset."""
    start = state.applied_offset()
    if start >= upto:
        return start
    pending: list[tuple[int, Any]] = []
    offset = max(start, lg.log_start_offset)
    while offset < upto:
        info = lg.read(offset, buffer, max_offset=upto)
        data = b"".join(bytes(part) for part in info.records)
        batches = decode_batches(data) if data else []
        if not batches:
            break
        for b in batches:
            offset = b.header.base_offset + b.header.last_offset_delta + 1
            if b.header.is_control:
                continue
            for r in b.records:
                if start <= r.offset < upto and r.value is not None:
                    pending.append((r.offset, decode_record(r.value)[0]))
            if len(pending) >= APPLY_CHUNK_RECORDS:
                state.apply(pending)
                pending = []
    state.apply(pending, min(offset, upto))
    return state.applied_offset()


class _Local:
    def __init__(self, state: DisklessState) -> None:
        self.state = state
        self.lock = asyncio.Lock()
        self.applied = state.applied_offset()


class Materializer:
    def __init__(self, replicas: Any, root: Path, buffer_size: int) -> None:
        self.replicas = replicas
        self.root = root
        self.buffer_size = buffer_size
        self._local: dict[int, _Local] = {}
        self._opening: dict[int, asyncio.Lock] = {}
        self._loop = asyncio.get_running_loop()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = self._loop.create_task(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(CATCH_UP_INTERVAL_S)
            # the metadata topic's few partitions, not a scan of every replica (20,000 of them,
            # every 50 ms, on the event loop)
            info = self.replicas.image.topic(DISKLESS_METADATA_TOPIC)
            for index in sorted(info.partitions) if info is not None else ():
                p = self.replicas.get(DISKLESS_METADATA_TOPIC, index)
                if p is None:
                    continue
                try:
                    if index not in self._local or self._local[index].applied < p.high_watermark:
                        await self.catch_up(index)
                except (StorageError, ProtocolError, OSError, sqlite3.Error) as e:
                    log.warning("diskless_state_catch_up_failed", partition=index, error=str(e))
            for index in [i for i in self._local if (DISKLESS_METADATA_TOPIC, i) not in self.replicas.partitions]:
                self._close(index)  # the replica left this broker

    def _close(self, index: int) -> None:
        local = self._local.pop(index, None)
        if local is not None:
            local.state.close()

    async def state(self, index: int) -> _Local | None:
        """The materialized state of a local replica (opened or rebuilt on first use)."""
        local = self._local.get(index)
        if local is not None:
            return local
        p = self.replicas.get(DISKLESS_METADATA_TOPIC, index)
        if p is None:
            return None
        async with self._opening.setdefault(index, asyncio.Lock()):
            local = self._local.get(index)
            if local is None:
                state = await self._loop.run_in_executor(
                    None, _open, state_path(self.root, index), str(p.topic_id), p.log.log_start_offset,
                    p.log.log_end_offset)
                local = self._local[index] = _Local(state)
        return local

    async def catch_up(self, index: int) -> _Local | None:
        """Apply everything below this replica's high watermark; the state, or None when the
        replica is not here."""
        local = await self.state(index)
        p = self.replicas.get(DISKLESS_METADATA_TOPIC, index)
        if local is None or p is None:
            return local
        async with local.lock:
            hw = p.high_watermark
            if local.applied < hw:
                local.applied = await self._loop.run_in_executor(
                    None, _catch_up, local.state, p.log, hw, self.buffer_size)
        return local

    async def run(self, index: int, fn: Any, *args: Any) -> Any:
        """Run a read `fn(state, *args)` in the executor, between catch-ups."""
        local = await self.state(index)
        if local is None:
            return None
        async with local.lock:
            return await self._loop.run_in_executor(None, fn, local.state, *args)

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        for index in list(self._local):
            self._close(index)
