"""Retention of diskless partitions, run by their coordinator: every log.retention.check.interval.ms
the leader of each `__diskless_metadata` partition finds, in its SQLite state, the batches each
partition's retention.ms / retention.bytes remove and appends one DisklessRecordsDeletedRecord per
partition (what DeleteRecords appends)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any

import structlog

from broker.coordinator import wall_clock_ms
from broker.diskless.coordinator.materializer import Materializer
from broker.diskless.coordinator.partition import DisklessCoordinatorPartition as Partition
from broker.diskless.coordinator.state import DisklessState, RetentionLimits
from broker.storage.cleaner import retention_applies
from broker.storage.config import LogConfig

log = structlog.get_logger(__name__)


class DisklessRetention:
    def __init__(self, topic_config: Callable[[str], dict[str, str]], states: Materializer,
                 write: Callable[[Partition, list[Any]], Awaitable[int]], owns: Callable[[Partition], bool],
                 spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Task]) -> None:
        """`topic_config(name)`: a topic's properties; `write(ps, records)` appends records to a
        partition the coordinator leads (0 or the error); `owns(ps)`: it still leads `ps`."""
        self.topic_config = topic_config
        self.states = states
        self.write = write
        self.owns = owns
        self.spawn = spawn

    def check(self, partitions: Iterable[Partition]) -> None:
        """Start a pass for each loaded partition whose previous pass is over."""
        for ps in list(partitions):
            if ps.view is not None and not ps.loading and (ps.retention is None or ps.retention.done()):
                ps.retention = self.spawn(self._pass(ps))

    async def _pass(self, ps: Partition) -> None:
        try:
            await self.enforce(ps)
        except asyncio.CancelledError:
            raise
        except Exception:  # tried again next interval
            log.exception("diskless_retention_failed", coordinator=ps.index)

    async def enforce(self, ps: Partition) -> None:
        """One retention pass over a coordinator's partitions: the new log start offsets from
        SQLite, appended as DisklessRecordsDeletedRecords in one batch."""
        assert ps.view is not None
        limits = []
        configs: dict[str, tuple[int, int] | None] = {}
        for (tid, part), pv in ps.view.partitions.items():
            if pv.name not in configs:
                cfg = self.topic_config(pv.name)
                lc = LogConfig.from_properties(cfg) if retention_applies(cfg) else None
                configs[pv.name] = (lc.retention_ms, lc.retention_bytes) if lc is not None else None
            limit = configs[pv.name]
            if limit is not None and (limit[0] >= 0 or limit[1] >= 0):
                limits.append(RetentionLimits(tid, part, *limit))
        if not limits:
            return
        # a scan of the batches: beside the applies (a stale answer only deletes less)
        found = await self.states.run_beside(ps.index, DisklessState.retention_offsets, limits, wall_clock_ms())
        if not found or not self.owns(ps) or ps.view is None:
            return
        records = []
        for tid, part, offset in found:
            err, _, record = ps.view.delete_records(tid, part, offset)
            if record is not None:
                records.append(record)
        code = await self.write(ps, records)
        log.info("diskless_retention", coordinator=ps.index, partitions=len(records), error=code)
