"""The background work on the logs of this broker's replicas: retention (time and size, on the
active chunk's replica and on each inactive chunk's), high watermark and recovery point
checkpoints (replica.high.watermark.checkpoint.interval.ms), and log compaction of
cleanup.policy=compact topics (log.cleaner.enable, log.cleaner.backoff.ms)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable

import structlog

from broker.config import BrokerConfig
from broker.replication.chunk_replica import ChunkReplica
from broker.replication.hosted import HostedReplicas
from broker.replication.partition import Partition
from broker.storage.cleaner import CleanerConfig, LogCleaner, retention_applies
from broker.storage.config import INT64_MAX
from broker.storage.errors import StorageError
from broker.storage.log import Log
from broker.storage.log_dir import LogDir

log = structlog.get_logger(__name__)


class LogMaintenance:
    def __init__(self, config: BrokerConfig, log_dirs: list[LogDir], hosted: HostedReplicas,
                 topic_config: Callable[[str], dict[str, str]], leave: Callable[[ChunkReplica], None]) -> None:
        """`topic_config(topic)`: every topic config's effective value; `leave(cr)`: retention
        emptied a chunk replica, which leaves the chunk."""
        self.config = config
        self.log_dirs = log_dirs
        self.hosted = hosted
        self.topic_config = topic_config
        self.leave = leave
        self._tasks: list[asyncio.Task] = []
        self._cleaner: LogCleaner | None = None

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks += [loop.create_task(self._retention_loop()), loop.create_task(self._checkpoint_loop())]
        self._cleaner = LogCleaner(
            lambda: [(p.log, self.topic_config(p.topic)) for p in list(self.hosted.partitions.values())],
            self.config.props,
        )
        if self._cleaner.enabled:
            self._tasks.append(loop.create_task(self._cleaner.run()))

    def stop(self) -> None:
        if self._cleaner is not None:
            self._cleaner.shutdown()  # a round in progress aborts; the logs close after this
        for task in self._tasks:
            task.cancel()

    async def _checkpoint_loop(self) -> None:
        """Persist high watermarks and recovery points (replica.high.watermark.checkpoint.interval.ms)."""
        interval = int(self.config.props.get("replica.high.watermark.checkpoint.interval.ms", "5000")) / 1000
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(interval)
            logs = [p.log for p in list(self.hosted.partitions.values())]
            logs += [cr.log for cr in list(self.hosted.chunks.values())]
            try:
                await loop.run_in_executor(None, _checkpoint_all, logs, self.log_dirs)
            except Exception:
                log.exception("checkpoint_failed")

    async def _retention_loop(self) -> None:
        interval = self.config.retention_check_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            now = int(time.time() * 1000)
            # In a thread: deleting segments renames files and fsyncs checkpoints, which at
            # thousands of partitions would hold the event loop for seconds.
            work = [(p, *_rules_of(self.topic_config(p.topic))) for p in list(self.hosted.partitions.values())]
            skipped, last_error = await asyncio.get_running_loop().run_in_executor(None, _retention_pass, work, now)
            for cr in list(self.hosted.chunks.values()):
                if not await self._enforce_chunk_retention(cr, now):
                    skipped.append(f"{cr.topic}-{cr.index}-{cr.start}")
            if skipped:
                log.warning("retention_skipped", logs=len(skipped), first=skipped[:5], last_error=last_error)

    async def _enforce_chunk_retention(self, cr: ChunkReplica, now: int) -> bool:
        """Retention on an inactive chunk's replica (retention.bytes counts per chunk replica log,
        as storage defines it; its last segment expires too, as every log's); when nothing of the
        chunk is left, the replica leaves it. False when its log refused (offline): the caller
        sums those up in one line."""
        if cr.closed:
            return True
        cr.apply_log_start()
        try:
            n = cr.log.enforce_retention(now, delete_policy=retention_applies(self.topic_config(cr.topic)))
        except StorageError:
            return False
        except Exception:
            log.exception("retention_failed", topic=cr.topic, partition=cr.index, chunk_start=cr.start)
            return True
        if n:
            log.info("retention_deleted_segments", topic=cr.topic, partition=cr.index, chunk_start=cr.start,
                     segments=n, log_start_offset=cr.log.log_start_offset)
        if cr.data_gone:
            self.leave(cr)
        return True


def _rules_of(topic_config: dict[str, str]) -> tuple[bool, int | None]:
    """(time and size retention apply, max.compaction.lag.ms of a compacted topic that sets one)."""
    cleaner = CleanerConfig.from_topic_config(topic_config)
    lag = cleaner.max_compaction_lag_ms
    return cleaner.delete, lag if cleaner.compact and lag < INT64_MAX else None


def _retention_pass(work: list[tuple[Partition, bool, int | None]], now: int) -> tuple[list[str], str]:
    """enforce_retention on each partition's log (and, KIP-354, the roll of a compacted log's
    active segment past max.compaction.lag.ms: Kafka checks it on append, this also on an idle
    log); returns the logs that refused (offline: one line per pass, not a traceback each) and
    the last refusal's reason."""
    skipped: list[str] = []
    last_error = ""
    for p, delete_policy, max_compaction_lag_ms in work:
        try:
            if max_compaction_lag_ms is not None and p.log.roll_for_compaction(max_compaction_lag_ms, now):
                log.info("segment_rolled_for_compaction", topic=p.topic, partition=p.index,
                         max_compaction_lag_ms=max_compaction_lag_ms)
            n = p.log.enforce_retention(now, delete_policy=delete_policy)
            if n:
                log.info("retention_deleted_segments", topic=p.topic, partition=p.index, segments=n,
                         log_start_offset=p.log.log_start_offset)
        except StorageError as e:
            skipped.append(f"{p.topic}-{p.index}")
            last_error = str(e)
        except Exception:
            log.exception("retention_failed", topic=p.topic, partition=p.index)
    return skipped, last_error


def high_watermarks_by_dir(logs: list[Log]) -> dict[str, dict[str, tuple[int, int]]]:
    """Each log dir's high-watermark-checkpoint entries (LogDir.write_high_watermarks) for `logs`,
    by the log dir's path as str."""
    entries: dict[str, dict[str, tuple[int, int]]] = {}
    for lg in logs:
        parent, name = lg.dir_key
        by_name = entries.get(parent)
        if by_name is None:
            by_name = entries[parent] = {}
        by_name[name] = lg.high_watermark_entry()
    return entries


def _checkpoint_all(logs: list[Log], dirs: list[LogDir]) -> None:
    """Every log's high watermark into its dir's high-watermark-checkpoint, one file a dir, and
    a log's own state file only where its log start offset or recovery point moved (log_state.py),
    all without fsync; then each dir's filesystem synced once. One state file a log each round
    cost 20,000 partitions about 4 s of this thread's time under load."""
    written = set()
    usable = []
    for lg in logs:
        try:
            if lg.checkpoint(sync=False, hw_in_dir=True):
                written.add(lg.dir_key[0])
            usable.append(lg)
        except Exception:  # a closed or offline log: its state was written when it closed
            pass
    entries = high_watermarks_by_dir(usable)
    for d in dirs:
        path = os.fspath(d.path)
        if path in entries and d.write_high_watermarks(entries[path]):
            written.add(path)
        if path in written and d.online:
            d.sync()
