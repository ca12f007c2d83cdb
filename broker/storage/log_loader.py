"""LogLoader: what opening a replica's log does to its dir before the log serves (Kafka's
LogLoader): check the dir's topic id (partition.metadata), finish or undo an interrupted cleaner
swap, remove leftovers of a previous run, load the segments (checking every batch from the
recovery point on unless the dir was shut down cleanly, cutting a torn or corrupt tail and
deleting the segments after it), derive the offsets, reload the leader epochs and the producer
state, and checkpoint what changed.

It fills the LocalLog and ProducerStateManager it is given and returns the rest (Kafka's
LoadedLogOffsets) to the Log.
"""

from __future__ import annotations

import os
import uuid
from bisect import bisect_right
from dataclasses import dataclass
from pathlib import Path

import structlog

from broker.storage.atomic_file import fsync_dir
from broker.storage.config import LogConfig
from broker.storage.errors import StorageError
from broker.storage.file_names import (
    DELETED_SUFFIX,
    LEADER_EPOCH_CHECKPOINT,
    LOG_STATE_CHECKPOINT,
    LOG_SUFFIX,
    PARTITION_METADATA,
    TMP_SUFFIX,
    parse_segment_file_name,
)
from broker.storage.leader_epoch import LeaderEpochCache
from broker.storage.local_log import LocalLog
from broker.storage.log_state import LogState, new_incarnation, read_log_state, write_log_state
from broker.storage.partition_metadata import topic_id_at_open
from broker.storage.producer_replay import rebuild_producer_state
from broker.storage.producer_state import ProducerStateManager
from broker.storage.segment import CorruptSegmentError, LogSegment
from broker.storage.segment_swap import CLEANED_SUFFIX, SWAP_SUFFIX, recover_cleaner_files
from protocol.records.batch import BatchHeader

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class LoadedLog:
    """What the load decided beyond the segment list (Kafka's LoadedLogOffsets)."""

    topic_id: uuid.UUID | None  # the one stored in the dir (written there if none was)
    leader_epoch_cache: LeaderEpochCache
    log_start_offset: int
    high_watermark: int
    durable_state: LogState | None  # what log-state.checkpoint now holds
    incarnation: int  # log_state.py: since creation or the last truncation
    fresh: bool  # created by this load


class LogLoader:
    """Loads one replica dir into `local` (empty) and `producer_state`; see the module docstring."""

    def __init__(
        self, dir: Path, config: LogConfig, chunk_start: int, local: LocalLog, producer_state: ProducerStateManager
    ) -> None:
        self.dir = dir
        self.config = config
        self.chunk_start = chunk_start
        self.local = local
        self.producer_state = producer_state
        self.leader_epoch_cache = LeaderEpochCache(None)

    def load(self, expected_topic_id: uuid.UUID | None, clean: bool, now_ms: int,
             dir_high_watermark: tuple[int, int] | None = None) -> LoadedLog:
        """`expected_topic_id`: the topic id the caller expects, written to the dir if it holds none
        (a mismatch is logged; the caller decides); `clean`: the log dir was shut down cleanly, so
        nothing is checked; `dir_high_watermark`: (incarnation, high watermark) of this log in its
        log dir's high-watermark-checkpoint, used if the incarnation is the log's own."""
        dir, local, producers = self.dir, self.local, self.producer_state
        # A brand-new replica holds nothing a crash could lose: its files are written without
        # fsync (thousands of partitions are created at once) and synced by the first flush.
        # One listing serves every step below (20,000 logs opened at a start list their dirs once);
        # the dir is made only when missing (no mkdir and stat for each existing one)
        try:
            names = os.listdir(dir)
        except FileNotFoundError:
            os.makedirs(dir, exist_ok=True)
            names = []
        fresh = not names
        prefix = os.fspath(dir) + os.sep  # the state files' names as str: no Path made for each
        state = read_log_state(prefix + LOG_STATE_CHECKPOINT) if LOG_STATE_CHECKPOINT in names else None
        topic_id = topic_id_at_open(prefix + PARTITION_METADATA, expected_topic_id, sync=not fresh)
        if expected_topic_id is not None and topic_id != expected_topic_id:
            log.warning("topic_id_mismatch", dir=str(dir), stored=str(topic_id), expected=str(expected_topic_id))
        try:
            self.leader_epoch_cache = LeaderEpochCache.load(prefix + LEADER_EPOCH_CHECKPOINT)
        except StorageError as exc:
            # Its rewrites are not fsynced each time (see leader_epoch.py): after a crash, derive
            # the epochs again from every batch.
            log.warning("leader_epoch_checkpoint_unreadable", dir=str(dir), error=str(exc))
            self.leader_epoch_cache = LeaderEpochCache(prefix + LEADER_EPOCH_CHECKPOINT)
            state, clean = None, False
        epochs = self.leader_epoch_cache
        epochs.defer_sync = True
        if any(n.endswith((CLEANED_SUFFIX, SWAP_SUFFIX)) for n in names):
            recover_cleaner_files(dir)  # a cleaned segment swap a crash interrupted: finish or undo it
            names = os.listdir(dir)
        bases = remove_leftover_files(dir, names)
        producers.scan_snapshot_files(names)

        # Recovery starts at the segment holding the recovery point; a missing checkpoint means
        # nothing is known to be flushed, so everything is checked.
        recovery_point = state.recovery_point if state is not None else -1
        recover_from = None if clean else (bases[max(0, bisect_right(bases, recovery_point) - 1)] if bases else None)
        recovered, truncated_bytes, first_recovered = self._load_segments(bases, recover_from, now_ms)

        if not local.segments:
            start = state.log_start_offset if state is not None else self.chunk_start
            local.segments.append(LogSegment.create(dir, start, self.config.segment_index_bytes, now_ms))
        local.bases = [s.base_offset for s in local.segments]
        leo = local.leo = local.segments[-1].next_offset
        log_start = max(state.log_start_offset if state is not None else 0, local.segments[0].base_offset)
        if log_start > leo:
            # Records up to the log start were deleted and the tail past it did not survive the crash:
            # continue from the log start rather than hand out offsets below it again.
            log.warning("log_restarted_at_log_start", dir=str(dir), log_start_offset=log_start, log_end_offset=leo)
            local.truncate_fully(log_start, now_ms)
            epochs.clear()
            producers.truncate_fully()
            state = LogState(log_start, log_start, log_start, new_incarnation())
            write_log_state(prefix + LOG_STATE_CHECKPOINT, state)
            leo = log_start
            first_recovered = None  # nothing recovered is left
        if clean and state is not None:
            # A broker's clean shutdown syncs its dirs once and leaves each state file with the
            # recovery point it had synced: keeping it (the segments above it are clean, so the
            # next flush syncs nothing) spares 20,000 state rewrites after a clean restart.
            local.recovery_point = min(max(state.recovery_point, log_start), leo)
        elif clean or first_recovered is None:
            local.recovery_point = leo
        else:
            # As Kafka: after a crash the recovery point stays where it was synced (or drops to
            # a segment below it that needed recovery); the recovered segments are fsynced by the
            # next flush, which moves it, and a second crash recovers them again. Opening 20,000
            # logs after a kill -9 thus costs no fsync each.
            synced = recovery_point if first_recovered == recover_from else first_recovered
            local.recovery_point = min(max(synced, log_start), leo)
        claimed_hw = state.high_watermark if state is not None else 0
        if state is not None and dir_high_watermark is not None and dir_high_watermark[0] == state.incarnation:
            claimed_hw = max(claimed_hw, dir_high_watermark[1])
        hw = min(max(claimed_hw, log_start), leo)
        epochs.truncate_from_end(leo)
        epochs.truncate_from_start(log_start)
        snapshot_offset, replayed = rebuild_producer_state(
            producers, local, log_start, hw, now_ms, rebuild_txn_index_from=first_recovered
        )
        producers.remove_expired(now_ms)  # replayed producers may have been idle for long
        if fresh:
            local.recovery_point = log_start  # nothing synced yet; nothing to lose either
            local.add_unsynced_file(prefix + PARTITION_METADATA)
        elif local.recovery_point == leo:
            for seg in local.segments:
                seg.flush()  # rebuilt indexes (the segments are clean: nothing else to sync)
            epochs.sync()
            if not clean:  # a clean dir's files were synced at shutdown: nothing was created since
                fsync_dir(dir)
        for seg in local.segments[:-1]:
            seg.close_files()  # reopened on demand: old segments hold no descriptors
        loaded = LogState(log_start, local.recovery_point, hw, state.incarnation if state is not None else 0)
        durable: LogState | None
        if fresh:
            # a new log's state is what a missing state file means: nothing to write until it
            # has records (thousands of partitions are created at once; the checkpoint loop
            # writes each once its high watermark moves)
            loaded = LogState(log_start, local.recovery_point, hw, new_incarnation())
            durable = None
        elif state is not None and (loaded.recovery_point < state.recovery_point or hw < claimed_hw):
            # The files claim more than the log now holds (a tail was cut): fix it before any
            # append, or a second crash would trust records past the cut; a new incarnation
            # voids the dir's entry for it.
            loaded = LogState(log_start, local.recovery_point, hw, new_incarnation())
            write_log_state(prefix + LOG_STATE_CHECKPOINT, loaded)
            durable = loaded
        else:
            # The file is as cautious as `loaded` or more (or missing: everything is checked): a
            # second crash derives the same values, so the checkpoint loop writes it later, in
            # bulk, instead of 20,000 fsynced rewrites here after a kill -9.
            durable = state
        # a line each for a log that was recovered; a created or cleanly shut down one (thousands
        # at a restart or a topic creation, summed up by the caller) only at debug
        (log.debug if fresh or recovered == 0 else log.info)(
            "log_loaded",
            dir=str(dir),
            clean_shutdown=clean,
            segments=len(local.segments),
            recovered_segments=recovered,
            bytes_truncated=truncated_bytes,
            log_start_offset=log_start,
            log_end_offset=leo,
            producers=len(producers.producers),
            producer_snapshot_offset=snapshot_offset,
            producer_batches_replayed=replayed,
        )
        return LoadedLog(topic_id, epochs, log_start, hw, durable, loaded.incarnation, fresh)

    def _load_segments(self, bases: list[int], recover_from: int | None, now_ms: int) -> tuple[int, int, int | None]:
        """Load the segments below `recover_from` as trusted (recovering one whose indexes or
        batches do not check out) and recover those from it on; the first that had to be cut ends
        the log, and the later ones are deleted. Returns (segments recovered, bytes cut, base
        offset of the first recovered segment or None)."""
        cfg, dir, segments = self.config, self.dir, self.local.segments
        recovered = truncated_bytes = 0
        first_recovered: int | None = None  # their aborted-transaction indexes are rebuilt
        for i, base in enumerate(bases):
            seg = None
            if recover_from is None or base < recover_from:
                try:
                    seg = LogSegment.load(dir, base, cfg.segment_index_bytes, cfg.index_interval_bytes, now_ms)
                except CorruptSegmentError as exc:
                    log.warning("segment_needs_recovery", dir=str(dir), segment_base_offset=base, reason=str(exc))
            if seg is None:
                if first_recovered is None:
                    first_recovered = base
                seg = LogSegment.open_for_recovery(dir, base, cfg.segment_index_bytes, now_ms)
                truncated = seg.recover(cfg.index_interval_bytes, on_batch=self._assign_epoch_from_batch)
                recovered += 1
                if truncated:
                    truncated_bytes += truncated
                    segments.append(seg)
                    for later in bases[i + 1 :]:
                        LogSegment(dir, later, cfg.segment_index_bytes, 0).delete_files()  # unrecoverable
                    log.warning(
                        "log_truncated_on_recovery",
                        dir=str(dir),
                        segment_base_offset=base,
                        bytes_dropped=truncated,
                        later_segments_deleted=len(bases) - i - 1,
                        log_end_offset=seg.next_offset,
                    )
                    break
            segments.append(seg)
        return recovered, truncated_bytes, first_recovered

    def _assign_epoch_from_batch(self, header: BatchHeader) -> None:
        epoch = header.partition_leader_epoch
        if epoch >= 0 and epoch > self.leader_epoch_cache.latest_epoch():
            self.leader_epoch_cache.assign(epoch, header.base_offset)


def remove_leftover_files(dir: Path, names: list[str] | None = None) -> list[int]:
    """Delete what a previous run left half done (`.deleted` and `.tmp` files, indexes without
    their log); return the base offsets of the segments, ascending. `names`: the dir's listing,
    if the caller has it."""
    bases: set[int] = set()
    indexes: list[tuple[int, str]] = []
    for name in os.listdir(dir) if names is None else names:
        if name.endswith(DELETED_SUFFIX) or name.endswith(TMP_SUFFIX):
            (dir / name).unlink(missing_ok=True)
            continue
        parsed = parse_segment_file_name(name)
        if parsed is None:
            continue
        if parsed.suffix == LOG_SUFFIX:
            bases.add(parsed.base_offset)
        else:
            indexes.append((parsed.base_offset, name))
    for base, name in indexes:
        if base not in bases:
            orphan = dir / name
            log.info("orphan_index_deleted", path=str(orphan))
            orphan.unlink(missing_ok=True)
    return sorted(bases)


__all__ = ["LoadedLog", "LogLoader", "remove_leftover_files"]
