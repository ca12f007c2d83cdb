"""Every local replica of `__diskless_metadata` (leader or follower) materialized into its SQLite
file: records below the high watermark are applied in offset order, in an executor, with the
applied offset in the same transaction. The leader queues the apply right after its records
replicate (KIP-1164's step 6) and answers without waiting for it; a follower catches up in the
background so it can answer DisklessFindBatches and take over with a warm database.

Each database's SQLite work runs on a thread of its own, in the order queued, so a read queued
after an apply sees it (which is what KIP-1164's "apply, then answer" guarantees) without the
loop waiting for the apply; and it never queues behind other blocking work in the default
executor, nor behind another database's rebuild. WAL
checkpoints run on another thread and connection (their fsyncs stay off the commit path). The leader hands over the records it appends (stage()), so its apply after replication
takes them from memory instead of reading and decoding the log again; whatever the staged
records do not cover exactly is read from the log.

A database that cannot be opened, or whose applied offset is past the log's end (the log was
truncated below it), or that is from another incarnation of the topic, is deleted and rebuilt. A
database behind the log start (the log was cut behind a snapshot: a new replica, or one that was
down meanwhile) is replaced by the newest snapshot the log continues (snapshots.py), then follows
the log.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

import structlog

from broker.diskless.coordinator.snapshots import (
    KEEP,
    SnapshotError,
    SnapshotStore,
    check_snapshot,
    copy_database,
)
from broker.diskless.coordinator.state import DisklessState
from broker.ports import ImageSource, LocalReplicas
from broker.storage.errors import StorageError
from metadata.diskless import DISKLESS_METADATA_TOPIC
from metadata.records import decode_record
from node.waits import wait_within
from protocol.errors import ProtocolError
from protocol.records import decode_batches

log = structlog.get_logger(__name__)

CATCH_UP_INTERVAL_S = 0.05
# With every database caught up, the loop waits for new records (a data waiter on each replica)
# instead of polling: an idle broker wakes at most this often for it (20 wakeups a second cost
# an idle broker about 0.4% of a CPU, measured). Also the retry and checkpoint cadence.
IDLE_WAIT_S = 1.0
CHECKPOINT_INTERVAL_S = 1.0
APPLY_CHUNK_RECORDS = 2000  # records per SQLite transaction while catching up
RETRY_AFTER_FAILURE_S = 1.0


def state_path(root: Path, index: int) -> Path:
    return root / f"{index}.sqlite"


def _open(path: Path, topic_id: str, log_end: int) -> tuple[DisklessState, int]:
    """Open the database, or a fresh one when it is unusable for this log (blocking); with its
    applied offset (below the log start: catch_up installs a snapshot)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    marker = path.with_suffix(".topic")
    try:
        if marker.exists() and marker.read_text().strip() != topic_id:
            raise sqlite3.DatabaseError("from another incarnation of the topic")
        state = DisklessState(path)
        applied = state.applied_offset()
        if applied > log_end:
            state.close()
            raise sqlite3.DatabaseError(f"applied offset {applied} past the log end {log_end}")
        marker.write_text(topic_id)
        return state, applied
    except sqlite3.DatabaseError as e:
        log.warning("diskless_state_rebuild", path=str(path), reason=str(e))
        for suffix in ("", "-wal", "-shm"):
            Path(str(path) + suffix).unlink(missing_ok=True)
        marker.write_text(topic_id)
        return DisklessState(path), 0


def _catch_up(state: DisklessState, lg: Any, upto: int, buffer: int) -> int:
    """Apply the log's records in [applied offset, upto) (blocking). Returns the new applied offset."""
    start = state.applied_offset()
    if start >= upto:
        return start
    if start < lg.log_start_offset:
        raise SnapshotNeeded(f"applied offset {start} is below the log start {lg.log_start_offset}")
    pending: list[tuple[int, Any]] = []
    offset = start
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


def _apply(state: DisklessState, lg: Any, staged: list[tuple[int, Any]] | None, upto: int, buffer: int) -> int:
    """Apply up to `upto` (blocking): the staged records when they continue the database exactly
    (an earlier apply may have failed), else from the log. Returns the new applied offset."""
    if staged and staged[0][0] == state.applied_offset():
        state.apply(staged, upto)
        return state.applied_offset()
    return _catch_up(state, lg, upto, buffer)


class SnapshotNeeded(Exception):
    """The database is behind the log start: only a snapshot can bring it up."""


# what a catch-up may fail with and be tried again later
CATCH_UP_ERRORS = (StorageError, ProtocolError, OSError, sqlite3.Error, SnapshotError)


def _checkpoint(local: _Local) -> None:
    local.state.checkpoint()  # the database now in place (a snapshot may have replaced it)


def _swap(local: _Local, path: Path, snapshot: Path) -> None:
    """Put the checked snapshot file in place of the database (on the database's thread)."""
    local.state.close()
    for suffix in ("", "-wal", "-shm"):
        Path(str(path) + suffix).unlink(missing_ok=True)
    os.replace(snapshot, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    local.state = DisklessState(path)


class _Local:
    def __init__(self, state: DisklessState, applied: int, thread: ThreadPoolExecutor) -> None:
        # replaced whole when a snapshot is installed: jobs read it when they run
        self.state = state
        self.installing = False
        self.thread = thread  # every call on this database, in the order queued
        # the offset up to which applies are queued on the database's thread (they run in order)
        self.applied = applied
        self.last_job = 0  # the newest queued apply: its answer is the database's applied offset
        self.checkpointed = -1  # the applied offset at the last checkpoint: an idle one is skipped
        self.staged: list[tuple[int, Any]] = []  # (offset, record) the leader appended, not yet applied

    def take_staged(self, upto: int) -> list[tuple[int, Any]] | None:
        """The staged records exactly covering [applied, upto), or None (the log has others:
        read it). Staged records below `upto` are dropped either way."""
        below = [e for e in self.staged if e[0] < upto]
        self.staged = [e for e in self.staged if e[0] >= upto]
        todo = [e for e in below if e[0] >= self.applied]
        if len(todo) == upto - self.applied and all(o == self.applied + i for i, (o, _) in enumerate(todo)):
            return todo
        return None


class CoordinatorReplicas(LocalReplicas, ImageSource, Protocol):
    """The replicas here (the ReplicaManager) with the image they were last brought in line
    with: it says which partitions `__diskless_metadata` has, so the catch-up loop looks at those
    few replicas instead of scanning every one."""


class Materializer:
    def __init__(self, replicas: CoordinatorReplicas, root: Path, buffer_size: int, snapshots: SnapshotStore) -> None:
        self.replicas = replicas
        self.root = root
        self.buffer_size = buffer_size
        self.snapshots = snapshots
        self._local: dict[int, _Local] = {}
        self._opening: dict[int, asyncio.Lock] = {}
        self._installing: dict[int, asyncio.Lock] = {}
        self._retry_at: dict[int, float] = {}  # a failed catch-up is tried again from then on
        self._loop = asyncio.get_running_loop()
        self._task: asyncio.Task | None = None
        # A thread per database runs its SQLite calls in the order queued (_Local.thread): a read
        # queued after an apply sees it, so nothing waits on the loop for an apply to finish, and
        # a long rebuild of one database holds up no other. Checkpoints run beside them.
        self._checkpoints = ThreadPoolExecutor(max_workers=1, thread_name_prefix="diskless-checkpoint")
        self._copies = ThreadPoolExecutor(max_workers=1, thread_name_prefix="diskless-snapshot")

    def start(self) -> None:
        self._task = self._loop.create_task(self._run())

    async def _run(self) -> None:
        next_checkpoint = self._loop.time() + CHECKPOINT_INTERVAL_S
        behind = True
        while True:
            if behind:
                await asyncio.sleep(CATCH_UP_INTERVAL_S)  # what arrives meanwhile is applied in one go
            else:
                await self._until_new_records(IDLE_WAIT_S)
            if self._loop.time() >= next_checkpoint:
                next_checkpoint = self._loop.time() + CHECKPOINT_INTERVAL_S
                await self._checkpoint_all()
            behind = False
            # the metadata topic's few partitions, not a scan of every replica (20,000 of them,
            # every 50 ms, on the event loop)
            info = self.replicas.image.topic(DISKLESS_METADATA_TOPIC)
            for index in sorted(info.partitions) if info is not None else ():
                p = self.replicas.get(DISKLESS_METADATA_TOPIC, index)
                if p is None or self._loop.time() < self._retry_at.get(index, 0.0):
                    continue
                try:
                    if index not in self._local or self._local[index].applied < p.high_watermark:
                        behind = True
                        await self.catch_up(index)
                except CATCH_UP_ERRORS as e:
                    log.warning("diskless_state_catch_up_failed", partition=index, error=str(e))
                    self._retry_at[index] = self._loop.time() + RETRY_AFTER_FAILURE_S
                except Exception:  # a bug: logged, and the other partitions go on
                    log.exception("diskless_state_catch_up_failed", partition=index)
                    self._retry_at[index] = self._loop.time() + RETRY_AFTER_FAILURE_S
            for index in [i for i in self._local if (DISKLESS_METADATA_TOPIC, i) not in self.replicas.partitions]:
                self._close(index)  # the replica left this broker

    async def _until_new_records(self, timeout: float) -> None:
        """Until a replica of the metadata topic gets records or a new high watermark (its data
        waiters are woken then, on the leader and on followers alike), at most `timeout`."""
        wake = self._loop.create_future()
        info = self.replicas.image.topic(DISKLESS_METADATA_TOPIC)
        for index in info.partitions if info is not None else ():
            p = self.replicas.get(DISKLESS_METADATA_TOPIC, index)
            if p is not None:
                p.add_data_waiter(wake)
        await wait_within(wake, timeout, False)

    async def _checkpoint_all(self) -> None:
        for index, local in list(self._local.items()):
            if local.applied == local.checkpointed:
                continue  # nothing applied since the last one
            local.checkpointed = local.applied
            try:
                await self._loop.run_in_executor(self._checkpoints, _checkpoint, local)
            except sqlite3.Error as e:
                log.warning("diskless_state_checkpoint_failed", partition=index, error=str(e))

    def _close(self, index: int) -> None:
        local = self._local.pop(index, None)
        if local is not None:
            # each connection is closed on its own thread, after the work queued there
            closed = self._checkpoints.submit(local.state.close_checkpointer)

            def close_after_checkpointer() -> None:
                closed.result()
                local.state.close()

            local.thread.submit(close_after_checkpointer)
            local.thread.shutdown(wait=False)

    def stage(self, index: int, first_offset: int, records: list[Any]) -> None:
        """The leader appended `records` at `first_offset` on: apply them from memory later."""
        local = self._local.get(index)
        if local is not None:
            local.staged.extend((first_offset + i, r) for i, r in enumerate(records))

    def drop_staged(self, index: int) -> None:
        """An append failed: what was staged may never be in the log."""
        local = self._local.get(index)
        if local is not None:
            local.staged = []

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
                thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"diskless-sqlite-{index}")
                state, applied = await self._loop.run_in_executor(
                    thread, _open, state_path(self.root, index), str(p.topic_id), p.log.log_end_offset)
                local = self._local[index] = _Local(state, applied, thread)
        return local

    def apply_soon(self, index: int) -> Future | None:
        """Queue the apply of everything below this replica's high watermark on the database's thread
        and return at once (KIP-1164's step 6 for the leader: every later read of this state
        runs after it). The future, or None when nothing was queued."""
        local = self._local.get(index)
        p = self.replicas.get(DISKLESS_METADATA_TOPIC, index)
        if local is None or p is None or local.applied >= p.high_watermark or local.installing:
            return None
        hw = p.high_watermark
        staged = local.take_staged(hw)
        before = local.applied
        local.applied = hw
        local.last_job += 1
        job = local.last_job
        fut = local.thread.submit(lambda: _apply(local.state, p.log, staged, hw, self.buffer_size))

        def done(f: Future) -> None:  # on the loop
            try:
                got = f.result()
            except SnapshotNeeded as e:  # the next catch-up installs a snapshot
                log.info("diskless_state_behind_log_start", partition=index, error=str(e))
                got = before
            except Exception as e:  # the log still has the records: a later catch-up applies them
                log.warning("diskless_state_apply_failed", partition=index, error=repr(e))
                got = before  # queued again by the next catch-up (from the log)
            if job == local.last_job:  # the newest apply tells where the database stands
                local.applied = got

        fut.add_done_callback(lambda f: self._loop.call_soon_threadsafe(done, f))
        return fut

    async def catch_up(self, index: int) -> _Local | None:
        """Apply everything below this replica's high watermark and wait for it; the state, or
        None when the replica is not here."""
        local = await self.state(index)
        if local is None:
            return None
        p = self.replicas.get(DISKLESS_METADATA_TOPIC, index)
        if p is not None and local.applied < p.log.log_start_offset:
            await self._install(index, p, local)
        fut = self.apply_soon(index)
        if fut is not None:
            await asyncio.wrap_future(fut)
        return local

    async def run(self, index: int, fn: Any, *args: Any) -> Any:
        """Run a read `fn(state, *args)` on the database's thread, after every apply queued before it."""
        local = await self.state(index)
        if local is None:
            return None
        return await self._loop.run_in_executor(local.thread, lambda: fn(local.state, *args))

    # ------------------------------------------------------------------ snapshots
    async def copy(self, index: int) -> tuple[Path, int] | None:
        """A point-in-time copy of a local database (off the loop, beside its applies): the
        file and its applied offset, or None when the replica is not here."""
        local = await self.state(index)
        if local is None:
            return None
        dest = self.root / f"{index}.snapshot-out"
        offset = await self._loop.run_in_executor(self._copies, copy_database, local.state.path, dest)
        return dest, offset

    async def _install(self, index: int, p: Any, local: _Local) -> None:
        """Replace a database behind the log start with the newest snapshot in [log start, high
        watermark] (the log continues it). SnapshotError when there is none (yet)."""
        async with self._installing.setdefault(index, asyncio.Lock()):
            start, hw = p.log.log_start_offset, p.high_watermark
            if local.applied >= start or self._local.get(index) is not local:
                return
            topic_id = str(p.topic_id)
            stored = await self.snapshots.offsets(topic_id, index)
            usable = [o for o in stored if start <= o <= hw]
            if not usable:
                raise SnapshotError(f"no snapshot in [{start}, {hw}] for a database at {local.applied} "
                                    f"(stored: {stored[-KEEP:]})")
            offset = usable[-1]
            path = state_path(self.root, index)
            tmp = path.with_suffix(".snapshot-in")
            size = await self.snapshots.download(topic_id, index, offset, tmp, self._copies)
            await self._loop.run_in_executor(self._copies, check_snapshot, tmp, offset)
            if self._local.get(index) is not local:  # the replica left meanwhile
                tmp.unlink(missing_ok=True)
                return
            local.installing = True  # no apply is queued meanwhile
            try:
                await asyncio.wrap_future(local.thread.submit(_swap, local, path, tmp))
            finally:
                local.installing = False
            local.last_job += 1  # what applies queued before tell no longer counts
            before, local.applied = local.applied, offset
            local.staged = []
            log.info("diskless_snapshot_installed", partition=index, offset=offset, bytes=size,
                     log_start_offset=start, previous_applied_offset=before)

    async def run_beside(self, index: int, fn: Any, *args: Any) -> Any:
        """Run a long read `fn(state, *args)` on the checkpoint thread's connection: it holds up
        no apply (it may miss the ones queued but not yet run)."""
        local = await self.state(index)
        if local is None:
            return None
        return await self._loop.run_in_executor(self._checkpoints, lambda: fn(local.state.beside(), *args))

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        for index in list(self._local):
            self._close(index)
        self._checkpoints.shutdown(wait=False)
        self._copies.shutdown(wait=False)
