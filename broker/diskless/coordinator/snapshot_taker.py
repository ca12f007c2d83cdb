"""The leader's side of diskless coordinator snapshots (snapshots.py): every
`diskless.coordinator.snapshot.interval.records` records, the leader of a `__diskless_metadata`
partition snapshots its state into object storage and cuts the log at the previous snapshot; a
replica behind the cut starts from the newest snapshot."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable, Coroutine, Iterable
from typing import TYPE_CHECKING, Any

import structlog

from broker.coordinator import wall_clock_ms
from broker.diskless.coordinator.materializer import Materializer
from broker.diskless.coordinator.partition import DisklessCoordinatorPartition as Partition
from broker.diskless.coordinator.snapshots import SnapshotError, SnapshotStore, take_bytes
from broker.storage.errors import StorageError

if TYPE_CHECKING:
    from broker.replication.partition import Partition as Replica

log = structlog.get_logger(__name__)

SNAPSHOT_RETRY_S = 1.0


class SnapshotTaker:
    def __init__(self, interval_records: int, replica: Callable[[int], Replica | None], states: Materializer,
                 store: SnapshotStore, owns: Callable[[Partition], bool],
                 spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Task]) -> None:
        """`replica(index)`: this broker's replica of `__diskless_metadata` partition `index` (or
        None); `owns(ps)`: the coordinator still leads `ps`."""
        self.interval = interval_records
        self.replica = replica
        self.states = states
        self.store = store
        self.owns = owns
        self.spawn = spawn

    def check(self, partitions: Iterable[Partition]) -> None:
        """Snapshot each loaded partition this broker leads whose log holds `interval` records."""
        if self.interval <= 0:
            return
        for ps in list(partitions):
            if ps.loading or ps.view is None or ps.snapshot_task is not None:
                continue
            p = self.replica(ps.index)
            if p is None or not p.is_leader:
                continue
            start, hw = p.log.log_start_offset, p.high_watermark
            if hw - max(start, ps.snapshot_offset) >= self.interval:
                ps.snapshot_task = self.spawn(self.take(ps, p))
            elif hw - start > 2 * self.interval and ps.snapshot_offset > start:
                ps.snapshot_task = self.spawn(self.trim(ps, p))

    async def trim(self, ps: Partition, p: Replica) -> None:
        """Cut a log that holds over two intervals at the newest snapshot, keeping the last
        interval: snapshots taken while commits pour in can lie far apart, and once the log goes
        quiet no further snapshot comes to cut it at the previous one."""
        try:
            start = p.log.log_start_offset
            cut = min(ps.snapshot_offset, p.high_watermark - self.interval)
            if start != await self._cut(ps, p, cut):
                log.info("diskless_log_trimmed", partition=ps.index, snapshot_offset=ps.snapshot_offset,
                         log_start_offset=p.log.log_start_offset, log_end_offset=p.log.log_end_offset)
        except (StorageError, OSError) as e:
            log.warning("diskless_log_trim_failed", partition=ps.index, error=str(e))
            await asyncio.sleep(SNAPSHOT_RETRY_S)
        finally:
            ps.snapshot_task = None

    async def _cut(self, ps: Partition, p: Replica, cut: int) -> int:
        """Raise the log start to `cut` while this coordinator still leads the partition (never
        past the high watermark, never down); the log start after it."""
        if self.owns(ps) and p.log.log_start_offset < cut <= p.high_watermark:
            return await asyncio.get_running_loop().run_in_executor(None, p.log.delete_records_before, cut)
        return p.log.log_start_offset

    async def take(self, ps: Partition, p: Replica) -> None:
        """Copy the state point-in-time and store the copy; then raise the log start to the
        previous snapshot's offset (every replica follows the leader's log start): a replica
        less than an interval behind goes on from the log, one further behind installs the
        newest snapshot. So the log holds about two intervals of records."""
        started = time.monotonic()
        loop = asyncio.get_running_loop()
        try:
            taken = await self.states.copy(ps.index)
            if taken is None:
                return
            data = await loop.run_in_executor(None, take_bytes, taken[0])
            offset = taken[1]
            topic_id = str(p.topic_id)
            stored = await self.store.offsets(topic_id, ps.index)
            if stored and offset <= stored[-1]:
                ps.snapshot_offset = stored[-1]
                return  # nothing applied since the last snapshot
            await self.store.put(topic_id, ps.index, offset, data)
            ps.snapshot_offset = offset
            ps.snapshot_ms = wall_clock_ms()
            start = await self._cut(ps, p, stored[-1] if stored else 0)
            await self.store.prune(topic_id, ps.index)
            log.info("diskless_snapshot_taken", partition=ps.index, offset=offset, bytes=len(data),
                     log_start_offset=start, log_end_offset=p.log.log_end_offset,
                     ms=round((time.monotonic() - started) * 1000))
        except (SnapshotError, StorageError, OSError, sqlite3.Error) as e:
            log.warning("diskless_snapshot_failed", partition=ps.index, error=str(e))
            await asyncio.sleep(SNAPSHOT_RETRY_S)
        finally:
            ps.snapshot_task = None
