"""Log: one chunk replica's records, as a list of segments in the replica's own dir.

Threading: every change (append, roll, truncation, retention, close) runs under the log's lock.
read() only snapshots the segment list and sizes under it and does its preads outside, so a
consumer never waits behind an fsync; flush() fsyncs outside the lock for the same reason.
Deleted segments are renamed `.deleted` and purged file.delete.delay.ms later (never in the call
that deleted them), so a read that snapshotted one keeps valid descriptors.

Transactions: producer state tracks open transactions and those completed whose marker the high
watermark has not passed; `last_stable_offset` = min(their first offsets, high watermark). An ABORT
marker adds an entry to the `.txnindex` of the segment it lands in (leader, follower and
recovery alike); `aborted_transactions()` answers read_committed fetches from those indexes.
"""

from __future__ import annotations

import enum
import errno
import functools
import random
import shutil
import threading
import time
import uuid
from bisect import bisect_right
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import structlog

from broker.storage.atomic_file import fsync_dir, fsync_file
from broker.storage.batch_validation import validate_client_batches, validate_replicated_batches
from broker.storage.cleaner import (
    CleanerView,
    SegmentInfo,
    discard_cleaned,
    recover_cleaner_files,
    swap_in_cleaned,
)
from broker.storage.config import LogConfig
from broker.storage.errors import (
    InconsistentTopicIdError,
    InvalidRecordError,
    InvalidTimestampError,
    OffsetOutOfRangeError,
    RecordListTooLargeError,
    ResourceExhaustedError,
    StorageError,
    UnexpectedAppendOffsetError,
)
from broker.storage.exhaustion import is_resource_exhaustion, note_resource_exhaustion
from broker.storage.file_cache import FileGoneError
from broker.storage.file_names import (
    DELETED_SUFFIX,
    LEADER_EPOCH_CHECKPOINT,
    LOG_STATE_CHECKPOINT,
    LOG_SUFFIX,
    PARTITION_METADATA,
    TMP_SUFFIX,
    parse_replica_dir_name,
    parse_segment_file_name,
)
from broker.storage.leader_epoch import LeaderEpochCache
from broker.storage.log_state import LogState, read_log_state, write_log_state
from broker.storage.partition_metadata import read_topic_id, write_topic_id
from broker.storage.producer_state import (
    DEFAULT_PRODUCER_ID_EXPIRATION_MS,
    BatchMetadata,
    CompletedTxn,
    ProducerStateManager,
)
from broker.storage.segment import BatchSpan, CorruptSegmentError, LogSegment
from broker.storage.txn_index import AbortedTxn
from node.metrics import Histogram
from protocol.errors import ProtocolError
from protocol.records.batch import BatchHeader, set_base_offset, set_log_append_time, set_partition_leader_epoch
from protocol.records.codec import decode_batches
from protocol.records.control import TxnMarker, encode_txn_marker, read_txn_marker

log = structlog.get_logger(__name__)


def _ignore_missing(func, path, exc_info) -> None:
    if not issubclass(exc_info[0], FileNotFoundError):
        raise exc_info[1]


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


# fsyncs after a roll run here, one at a time (Kafka's scheduled "flush-log" task): the append that
# rolled, often on the event loop, never waits for a disk sync. A thread, not a pool: fsyncs of one
# disk do not go faster side by side, and one thread keeps the recovery point moving in order.
_background_flusher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="log-flush")
# the flushes' durations in ms (Kafka's LogFlushRateAndTimeMs); written by that one thread only
FLUSH_TIMES_MS = Histogram()


class AppendOrigin(enum.Enum):
    """Who is appending as leader: clients may not write control batches, coordinators may."""

    CLIENT = "client"
    COORDINATOR = "coordinator"


@dataclass
class AppendInfo:
    first_offset: int  # -1 when nothing was appended (an empty follower append)
    last_offset: int
    max_timestamp: int
    offset_of_max_timestamp: int  # batch granularity: last offset of the batch with the max timestamp
    log_append_time: int  # -1 unless the topic uses LogAppendTime
    log_start_offset: int
    batch_count: int
    bytes: int
    duplicate: bool = False  # an idempotent producer's retry: nothing appended, the original's offsets


@dataclass
class FetchInfo:
    records: list  # bytes-like parts straight from os.pread, whole batches, in offset order
    total_bytes: int
    log_start_offset: int
    log_end_offset: int
    high_watermark: int = -1  # taken in the same snapshot as the reads' bounds
    end_offset: int = -1  # the offset after the last batch returned (the read's start if none)


def _io_guarded(method):
    """OSError (and corrupt bytes in a region we trusted) from a public method: the log is failed,
    the log dir's handler hears of it, and the caller gets StorageError (KAFKA_STORAGE_ERROR).
    Running out of descriptors or memory is no disk fault: ResourceExhaustedError, log online."""

    @functools.wraps(method)
    def guarded(self: Log, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except (OSError, CorruptSegmentError) as exc:
            raise self._io_failure(method.__name__, exc) from exc

    return guarded


class Log:
    """One chunk replica's log: the records of one partition from `chunk_start` on, in its own dir."""

    def __init__(
        self,
        dir: Path,
        config: LogConfig,
        topic_id: uuid.UUID | None,
        io_error_handler: Callable[[Path, BaseException], None] | None,
        producer_id_expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS,
    ) -> None:
        name = parse_replica_dir_name(dir.name)
        if name is None:
            raise ValueError(f"{dir.name!r} is not a chunk replica dir name (<topic>-<partition>-<chunkStart>)")
        self.dir = dir
        self.topic = name.topic
        self.partition = name.partition
        self.chunk_start = name.chunk_start
        self.config = config
        self.topic_id = topic_id  # after open: the id stored in the dir
        self._expected_topic_id: uuid.UUID | None = None  # set only when the dir holds another topic id
        self._io_error_handler = io_error_handler
        self._lock = threading.RLock()
        self._segments: list[LogSegment] = []
        self._bases: list[int] = []  # base offsets of _segments, for bisect
        self._pending_deletes: list[tuple[int, LogSegment]] = []  # (due ms, segment)
        self._log_start = 0
        self._leo = 0
        self._recovery_point = 0
        self._hw = 0
        self._closed = False
        self._failed = False
        self._roll_jitter_ms = self._new_roll_jitter()  # the active segment's (Kafka: per segment)
        self._flush_done: Future | None = None  # the latest background flush after a roll
        self._unsynced_files: list[Path] = []  # written without fsync; the next flush syncs them
        self._durable_state: LogState | None = None  # what log-state.checkpoint holds, once fsynced
        self.leader_epoch_cache = LeaderEpochCache(None)
        self.producer_state = ProducerStateManager(dir, producer_id_expiration_ms)

    # -- opening ---------------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        dir: Path,
        config: LogConfig,
        *,
        topic_id: uuid.UUID | None = None,
        now_ms: int | None = None,
        io_error_handler: Callable[[Path, BaseException], None] | None = None,
        producer_id_expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS,
        clean_shutdown: bool = False,
    ) -> Log:
        """Open (creating if missing) the log in `dir`. Unless its log dir was shut down cleanly
        (`clean_shutdown`: LogDir knows from its marker), every batch from the recovery point on is
        checked (header + CRC32C) and a torn or corrupt tail is cut off at the last whole batch;
        missing or damaged indexes are rebuilt either way. Producer state comes from the newest
        snapshot at or below the log end plus the batch headers after it."""
        self = cls(Path(dir), config, topic_id, io_error_handler, producer_id_expiration_ms)
        now = now_ms if now_ms is not None else _wall_clock_ms()
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._load(now, clean_shutdown)
        except (OSError, CorruptSegmentError) as exc:
            self._close_files()
            if is_resource_exhaustion(exc):
                note_resource_exhaustion(str(self.dir), "open", exc)
                raise ResourceExhaustedError(f"cannot open log {self.dir} now: {exc}") from exc
            if io_error_handler is not None:
                io_error_handler(self.dir, exc)
            raise StorageError(f"cannot open log {self.dir}: {exc}") from exc
        except BaseException:
            self._close_files()
            raise
        return self

    def _load(self, now_ms: int, clean: bool) -> None:
        # A brand-new replica holds nothing a crash could lose: its files are written without
        # fsync (thousands of partitions are created at once) and synced by the first flush.
        fresh = not any(self.dir.iterdir())
        state = read_log_state(self.dir / LOG_STATE_CHECKPOINT)
        self._check_topic_id(sync=not fresh)
        try:
            self.leader_epoch_cache = LeaderEpochCache.load(self.dir / LEADER_EPOCH_CHECKPOINT)
        except StorageError as exc:
            # Its rewrites are not fsynced each time (see leader_epoch.py): after a crash, derive
            # the epochs again from every batch.
            log.warning("leader_epoch_checkpoint_unreadable", dir=str(self.dir), error=str(exc))
            self.leader_epoch_cache = LeaderEpochCache(self.dir / LEADER_EPOCH_CHECKPOINT)
            state, clean = None, False
        self.leader_epoch_cache.defer_sync = True
        recover_cleaner_files(self.dir)  # a cleaned segment swap a crash interrupted: finish or undo it
        bases = self._remove_leftover_files()
        self.producer_state.scan_snapshot_files()

        # Recovery starts at the segment holding the recovery point; a missing checkpoint means
        # nothing is known to be flushed, so everything is checked.
        recovery_point = state.recovery_point if state is not None else -1
        recover_from = None if clean else (bases[max(0, bisect_right(bases, recovery_point) - 1)] if bases else None)
        cfg = self.config
        recovered = truncated_bytes = 0
        first_recovered: int | None = None  # their aborted-transaction indexes are rebuilt
        for i, base in enumerate(bases):
            seg = None
            if recover_from is None or base < recover_from:
                try:
                    seg = LogSegment.load(self.dir, base, cfg.segment_index_bytes, cfg.index_interval_bytes, now_ms)
                except CorruptSegmentError as exc:
                    log.warning("segment_needs_recovery", dir=str(self.dir), segment_base_offset=base, reason=str(exc))
            if seg is None:
                if first_recovered is None:
                    first_recovered = base
                seg = LogSegment.open_for_recovery(self.dir, base, cfg.segment_index_bytes, now_ms)
                truncated = seg.recover(cfg.index_interval_bytes, on_batch=self._assign_epoch_from_batch)
                recovered += 1
                if truncated:
                    truncated_bytes += truncated
                    self._segments.append(seg)
                    for later in bases[i + 1 :]:
                        self._delete_unrecoverable_segment(later)
                    log.warning(
                        "log_truncated_on_recovery",
                        dir=str(self.dir),
                        segment_base_offset=base,
                        bytes_dropped=truncated,
                        later_segments_deleted=len(bases) - i - 1,
                        log_end_offset=seg.next_offset,
                    )
                    break
            self._segments.append(seg)

        if not self._segments:
            start = state.log_start_offset if state is not None else self.chunk_start
            self._segments.append(LogSegment.create(self.dir, start, cfg.segment_index_bytes, now_ms))
        self._bases = [s.base_offset for s in self._segments]
        self._leo = self._segments[-1].next_offset
        self._log_start = max(state.log_start_offset if state is not None else 0, self._segments[0].base_offset)
        if self._log_start > self._leo:
            # Records up to the log start were deleted and the tail past it did not survive the crash:
            # continue from the log start rather than hand out offsets below it again.
            log.warning(
                "log_restarted_at_log_start",
                dir=str(self.dir),
                log_start_offset=self._log_start,
                log_end_offset=self._leo,
            )
            self._truncate_fully_locked(self._log_start, now_ms)
            first_recovered = None  # nothing recovered is left
        if clean and state is not None:
            # A broker's clean shutdown syncs its dirs once and leaves each state file with the
            # recovery point it had synced: keeping it (the segments above it are clean, so the
            # next flush syncs nothing) spares 20,000 state rewrites after a clean restart.
            self._recovery_point = min(max(state.recovery_point, self._log_start), self._leo)
        elif clean or first_recovered is None:
            self._recovery_point = self._leo
        else:
            # As Kafka: after a crash the recovery point stays where it was synced (or drops to
            # a segment below it that needed recovery); the recovered segments are fsynced by the
            # next flush, which moves it, and a second crash recovers them again. Opening 20,000
            # logs after a kill -9 thus costs no fsync each.
            synced = recovery_point if first_recovered == recover_from else first_recovered
            self._recovery_point = min(max(synced, self._log_start), self._leo)
        self._hw = min(max(state.high_watermark if state is not None else 0, self._log_start), self._leo)
        self.leader_epoch_cache.truncate_from_end(self._leo)
        self.leader_epoch_cache.truncate_from_start(self._log_start)
        snapshot_offset, replayed = self._reload_producer_state(now_ms, rebuild_txn_index_from=first_recovered)
        self.producer_state.remove_expired(now_ms)  # replayed producers may have been idle for long
        if fresh:
            self._recovery_point = self._log_start  # nothing synced yet; nothing to lose either
            self._unsynced_files.append(self.dir / PARTITION_METADATA)
        elif self._recovery_point == self._leo:
            for seg in self._segments:
                seg.flush()  # rebuilt indexes (the segments are clean: nothing else to sync)
            self.leader_epoch_cache.sync()
            if not clean:  # a clean dir's files were synced at shutdown: nothing was created since
                fsync_dir(self.dir)
        for seg in self._segments[:-1]:
            seg.close_files()  # reopened on demand: old segments hold no descriptors
        if fresh:
            # a new log's state is what a missing state file means: nothing to write until it
            # changes (thousands of partitions are created at once; the checkpoint loop writes
            # each once it has records)
            self._durable_state = self._state()
        elif state != self._state():
            self._write_state()
        else:
            self._durable_state = state
        log.info(
            "log_loaded",
            dir=str(self.dir),
            clean_shutdown=clean,
            segments=len(self._segments),
            recovered_segments=recovered,
            bytes_truncated=truncated_bytes,
            log_start_offset=self._log_start,
            log_end_offset=self._leo,
            producers=len(self.producer_state.producers),
            producer_snapshot_offset=snapshot_offset,
            producer_batches_replayed=replayed,
        )

    def _check_topic_id(self, *, sync: bool = True) -> None:
        path = self.dir / PARTITION_METADATA
        stored = read_topic_id(path)
        if stored is None:
            if self.topic_id is not None:
                write_topic_id(path, self.topic_id, sync=sync)
        elif self.topic_id is None:
            self.topic_id = stored
        elif stored != self.topic_id:
            # A stale dir of a deleted topic with the same name. Opening still succeeds so the caller
            # can compare `topic_id` and delete() it; until then the log refuses reads and writes.
            log.warning("topic_id_mismatch", dir=str(self.dir), stored=str(stored), expected=str(self.topic_id))
            self._expected_topic_id = self.topic_id
            self.topic_id = stored

    def _remove_leftover_files(self) -> list[int]:
        """Delete what a previous run left half done; return the base offsets of the segments."""
        bases: set[int] = set()
        indexes: list[tuple[int, Path]] = []
        for path in self.dir.iterdir():
            if path.name.endswith(DELETED_SUFFIX) or path.name.endswith(TMP_SUFFIX):
                path.unlink(missing_ok=True)
                continue
            parsed = parse_segment_file_name(path.name)
            if parsed is None:
                continue
            if parsed.suffix == LOG_SUFFIX:
                bases.add(parsed.base_offset)
            else:
                indexes.append((parsed.base_offset, path))
        for base, path in indexes:
            if base not in bases:
                log.info("orphan_index_deleted", path=str(path))
                path.unlink(missing_ok=True)
        return sorted(bases)

    def _delete_unrecoverable_segment(self, base: int) -> None:
        seg = LogSegment(self.dir, base, self.config.segment_index_bytes, 0)
        seg.delete_files()

    def _reload_producer_state(self, now_ms: int, *, rebuild_txn_index_from: int | None = None) -> tuple[int, int]:
        """Producer state = newest snapshot in [log start, min(HW, LEO)] + the batch headers after
        it (header reads; only markers are decoded). Starting at or below the high watermark
        brings back the completed transactions whose marker it has not passed yet. Segments from
        `rebuild_txn_index_from` on get their aborted-transaction index rebuilt on the way (replay
        then starts at or below it). Returns (offset replayed from, batches replayed)."""
        target = min(self._hw, self._leo)
        if rebuild_txn_index_from is not None:
            target = min(target, rebuild_txn_index_from)
            for seg in self._segments:
                if seg.base_offset >= rebuild_txn_index_from:
                    seg.txn_index.reset()
        start = self.producer_state.load(self._log_start, self._leo, now_ms, at_or_below=target)
        replayed = 0
        if start < self._leo:
            first = max(0, bisect_right(self._bases, start) - 1)
            for seg in self._segments[first:]:
                found = seg.find_batch(start, seg.size)
                if found is None:
                    continue
                rebuild = rebuild_txn_index_from is not None and seg.base_offset >= rebuild_txn_index_from
                for pos, header in seg.iter_headers(found[0], seg.size):
                    if header.producer_id >= 0:
                        marker = (
                            self._marker_of(seg.read_batch(pos, header.size), header) if header.is_control else None
                        )
                        done = self.producer_state.update_from_header(header, marker)
                        if done is not None and done.aborted and rebuild:
                            self._index_aborted(seg, done)
                        replayed += 1
        self.producer_state.on_high_watermark(self._hw)
        return start, replayed

    def _track_producers(self, data, batches) -> None:
        """Follower side: state from batches the leader numbered and checked (positions in `data`);
        they were just appended to the active segment, which so holds their markers."""
        seg = self._segments[-1]
        for pos, header in batches:
            if header.producer_id >= 0:
                marker = self._marker_of(data[pos : pos + header.size], header) if header.is_control else None
                done = self.producer_state.update_from_header(header, marker)
                if done is not None and done.aborted:
                    self._index_aborted(seg, done)

    def _marker_of(self, batch, header: BatchHeader) -> TxnMarker | None:
        """The transaction marker of one control batch; None (logged) if it does not decode."""
        try:
            return read_txn_marker(batch)
        except ProtocolError as exc:
            log.warning("control_batch_undecodable", dir=str(self.dir), offset=header.base_offset, error=str(exc))
            return None

    def _index_aborted(self, seg: LogSegment, txn: CompletedTxn) -> None:
        lso = self.producer_state.last_stable_offset_after(txn)
        seg.txn_index.append(AbortedTxn(txn.producer_id, txn.first_offset, txn.last_offset, lso))

    def _assign_epoch_from_batch(self, header: BatchHeader) -> None:
        epoch = header.partition_leader_epoch
        if epoch >= 0 and epoch > self.leader_epoch_cache.latest_epoch():
            self.leader_epoch_cache.assign(epoch, header.base_offset)

    # -- state -----------------------------------------------------------------------------------

    @property
    def log_start_offset(self) -> int:
        return self._log_start

    @property
    def log_end_offset(self) -> int:
        """The next offset to assign."""
        return self._leo

    @property
    def recovery_point(self) -> int:
        """Everything below it is fsynced; a restart after a crash checks only what lies above."""
        return self._recovery_point

    @property
    def high_watermark(self) -> int:
        return self._hw

    @property
    def size_bytes(self) -> int:
        with self._lock:
            return sum(s.size for s in self._segments)

    @property
    def segment_base_offsets(self) -> list[int]:
        with self._lock:
            return list(self._bases)

    @property
    def active_segment_base_offset(self) -> int:
        return self._bases[-1]

    @property
    def producer_id_expiration_ms(self) -> int:
        return self.producer_state.expiration_ms

    @producer_id_expiration_ms.setter
    def producer_id_expiration_ms(self, value: int) -> None:
        """producer.id.expiration.ms (a broker setting, applied by whoever opens the log)."""
        self.producer_state.expiration_ms = value

    def update_config(self, config: LogConfig) -> None:
        """New settings apply from the next append / roll check / retention pass."""
        self.config = config

    def update_high_watermark(self, offset: int) -> int:
        """Set by the replication layer; clamped to [log start, LEO]. Persisted by checkpoint() (call
        it periodically, as Kafka's high watermark checkpoint), close(), and any call that rewrites
        log-state.checkpoint anyway; not on every update, which follows every acknowledged produce."""
        with self._lock:
            self._hw = min(max(offset, self._log_start), self._leo)
            self.producer_state.on_high_watermark(self._hw)
            return self._hw

    @property
    def last_stable_offset(self) -> int:
        """What read_committed consumers may read up to (exclusive): the first offset of the oldest
        transaction that is open or whose marker the high watermark has not passed, capped by the
        high watermark (Kafka's rule). Never below the log start offset."""
        with self._lock:
            first = self.producer_state.first_unstable_offset()
            if first is None:
                return self._hw
            return min(max(first, self._log_start), self._hw)

    @property
    def first_unstable_offset(self) -> int | None:
        """First offset of the oldest open or not yet replicated completed transaction, or None."""
        with self._lock:
            first = self.producer_state.first_unstable_offset()
            return None if first is None else max(first, self._log_start)

    @_io_guarded
    def aborted_transactions(self, start_offset: int, upper_offset: int) -> list[tuple[int, int]]:
        """(producer id, first offset) of the aborted transactions overlapping [start_offset,
        upper_offset): from the index of the segment holding start_offset on, until an entry's last
        stable offset shows no later one can overlap (Kafka's collectAbortedTransactions)."""
        out: list[AbortedTxn] = []
        with self._lock:
            self._check_usable()
            first = max(0, bisect_right(self._bases, start_offset) - 1)
            # Markers of transactions overlapping the range may lie in any later segment.
            for seg in self._segments[first:]:
                if seg.txn_index.collect(start_offset, upper_offset, out):
                    break
        return [(t.producer_id, t.first_offset) for t in out]

    @_io_guarded
    def checkpoint(self, *, sync: bool = True) -> bool:
        """Persist log start offset, recovery point and high watermark (call periodically). Skipped
        when nothing changed since the last write (most of 20,000 partitions are idle), and
        written outside the lock: the fsyncs never stall an append (a checkpoint racing a newer
        write can only leave older, hence safe, values until the next one). Without sync the
        caller syncs the dir's filesystem once for all its logs (the recovery point in the file
        is always one already synced, so an unsynced file is never ahead of the data). True if
        a file was written."""
        with self._lock:
            self._check_usable()
            state = self._state()
            if state == self._durable_state:
                return False
        try:
            write_log_state(self.dir / LOG_STATE_CHECKPOINT, state, sync=sync)
        except OSError:
            with self._lock:
                if self._closed:  # deleted or closed meanwhile (its dir may be gone): no disk is at fault
                    return False
            raise
        self._durable_state = state
        return True

    def _state(self) -> LogState:
        return LogState(self._log_start, self._recovery_point, self._hw)

    def _write_state(self, *, sync: bool = True) -> None:
        state = self._state()
        write_log_state(self.dir / LOG_STATE_CHECKPOINT, state, sync=sync)
        self._durable_state = state if sync else None

    def _take_unsynced_files(self) -> list[Path]:
        files, self._unsynced_files = self._unsynced_files, []
        return files

    def _check_usable(self) -> None:
        if self._closed:
            raise StorageError(f"log {self.dir} is closed")
        if self._failed:
            raise StorageError(f"log {self.dir} failed an earlier I/O operation and is offline")
        if self._expected_topic_id is not None:
            raise InconsistentTopicIdError(
                f"{self.dir} belongs to topic id {self.topic_id}, not {self._expected_topic_id}; delete it first"
            )

    def _io_failure(self, operation: str, exc: BaseException) -> StorageError:
        if isinstance(exc, FileGoneError):
            # a segment deleted (retention, truncation) after the caller's snapshot of the log
            return OffsetOutOfRangeError(f"{operation} on log {self.dir}: the segment was deleted meanwhile")
        if is_resource_exhaustion(exc):
            note_resource_exhaustion(str(self.dir), operation, exc)
            return ResourceExhaustedError(f"{operation} on log {self.dir} failed for lack of resources: {exc}")
        self._failed = True
        log.error("log_io_error", dir=str(self.dir), operation=operation, error=str(exc))
        if self._io_error_handler is not None:
            try:
                self._io_error_handler(self.dir, exc)
            except Exception:  # the handler's failure must not hide the I/O error
                log.exception("io_error_handler_failed", dir=str(self.dir))
        return StorageError(f"I/O error during {operation} on log {self.dir}: {exc}")

    # -- appending -------------------------------------------------------------------------------

    @_io_guarded
    def append_as_leader(
        self,
        records: bytes | bytearray | memoryview,
        leader_epoch: int,
        now_ms: int,
        *,
        origin: AppendOrigin = AppendOrigin.CLIENT,
    ) -> AppendInfo:
        """Validate producer batches (header, CRC, size, counts), assign offsets by patching the
        headers of one bytearray copy, stamp the leader epoch (and LogAppendTime when configured),
        and append. Invalid input raises before any byte is written. Batches with a producer id are
        checked against producer state (sequence, epoch: OutOfOrderSequenceError,
        InvalidProducerEpochError); a retry of one of a producer's last 5 batches appends nothing
        and answers the first append's offsets (AppendInfo.duplicate)."""
        cfg = self.config
        if records is None:
            raise InvalidRecordError("a produce without records")
        batches = validate_client_batches(
            records, cfg.max_message_bytes, allow_control=origin is not AppendOrigin.CLIENT
        )
        if not cfg.log_append_time and origin is AppendOrigin.CLIENT:
            check_timestamps(batches, now_ms, cfg)
        size = memoryview(records).nbytes
        if size > cfg.segment_bytes:
            raise RecordListTooLargeError(f"{size} bytes of batches can never fit segment.bytes ({cfg.segment_bytes})")
        buf = bytearray(records)  # the one copy: offsets, epoch and LogAppendTime are patched into it
        log_append_time = now_ms if cfg.log_append_time else -1
        with self._lock:
            self._check_usable()
            first_offset = offset = self._leo
            max_timestamp, offset_of_max = -1, -1
            spans: list[BatchSpan] = []
            producers = None  # only batches with a producer id touch producer state
            for pos, header in batches:
                timestamp = log_append_time if log_append_time >= 0 else header.max_timestamp
                last = offset + header.last_offset_delta
                if header.producer_id >= 0:
                    if producers is None:
                        producers = self.producer_state.begin_leader_append(client=origin is AppendOrigin.CLIENT)
                    marker = self._marker_of(records[pos : pos + header.size], header) if header.is_control else None
                    duplicate = producers.add(header, offset, last, timestamp, marker)
                    if duplicate is not None:
                        return self._duplicate_info(duplicate, log_append_time >= 0)
                set_base_offset(buf, pos, offset)
                set_partition_leader_epoch(buf, pos, leader_epoch)
                if log_append_time >= 0:
                    set_log_append_time(buf, pos, header, log_append_time)
                if timestamp > max_timestamp:
                    max_timestamp, offset_of_max = timestamp, last
                spans.append((pos, last, timestamp, header.size))
                offset = last + 1
            last_offset = offset - 1
            if log_append_time >= 0:
                offset_of_max = last_offset  # as Kafka: every record carries the same timestamp
            rolled_to = self._append_locked(buf, spans, last_offset, now_ms)
            if producers is not None:
                # after the roll inside the append: its snapshot is of the state before
                for done in producers.commit():
                    if done.aborted:
                        self._index_aborted(self._segments[-1], done)
            if leader_epoch >= 0 and leader_epoch != self.leader_epoch_cache.latest_epoch():
                self.leader_epoch_cache.assign(leader_epoch, first_offset)
            info = AppendInfo(
                first_offset,
                last_offset,
                max_timestamp,
                offset_of_max,
                log_append_time,
                self._log_start,
                len(batches),
                len(buf),
            )
        if rolled_to is not None:
            self._flush_below(rolled_to)
        return info

    def append_txn_marker(
        self,
        producer_id: int,
        producer_epoch: int,
        coordinator_epoch: int,
        commit: bool,
        leader_epoch: int,
        now_ms: int,
    ) -> AppendInfo:
        """Append one transaction marker (a control batch) as the leader, for the coordinator's
        WriteTxnMarkers. Raises InvalidProducerEpochError (epoch below the producer's) or
        TransactionCoordinatorFencedError (coordinator epoch below the last seen). It completes the
        producer's open transaction, if any; an ABORT indexes it in the aborted-transaction index."""
        batch = encode_txn_marker(producer_id, producer_epoch, coordinator_epoch, commit, now_ms)
        return self.append_as_leader(batch, leader_epoch, now_ms, origin=AppendOrigin.COORDINATOR)

    def _duplicate_info(self, batch: BatchMetadata, log_append_time: bool) -> AppendInfo:
        # As Kafka: a retried batch is answered with the offsets it got the first time.
        log.info(
            "duplicate_batch",
            topic=self.topic,
            partition=self.partition,
            first_offset=batch.first_offset,
            first_sequence=batch.first_seq,
        )
        return AppendInfo(
            batch.first_offset,
            batch.last_offset,
            batch.timestamp,
            batch.last_offset,
            batch.timestamp if log_append_time else -1,
            self._log_start,
            0,
            0,
            duplicate=True,
        )

    @_io_guarded
    def append_as_follower(self, records: bytes | bytearray | memoryview) -> AppendInfo:
        """Append batches the leader already numbered. They must start at the log end offset;
        a partial batch at the end (a fetch may end mid-batch) is left out. No copy is made.
        Producer state follows the batches unchecked (the leader checked them)."""
        batches, valid_bytes = validate_replicated_batches(records)
        if not batches:
            return AppendInfo(-1, -1, -1, -1, -1, self._log_start, 0, 0)
        view = memoryview(records)[:valid_bytes]
        segment_bytes = self.config.segment_bytes
        for _, header in batches:
            if header.size > segment_bytes:
                raise RecordListTooLargeError(
                    f"a {header.size}-byte batch can never fit segment.bytes ({segment_bytes})"
                )
        now_ms = _wall_clock_ms()
        rolled_to = None
        with self._lock:
            self._check_usable()
            first = batches[0][1].base_offset
            if first != self._leo:
                raise UnexpectedAppendOffsetError(
                    f"follower append to {self.dir} starts at offset {first}, log end offset is {self._leo}",
                    first_offset=first,
                    expected_offset=self._leo,
                )
            max_timestamp, offset_of_max = -1, -1
            # Groups that fit one segment each: a fetch may carry more bytes than segment.bytes.
            group_start = group_first = 0
            spans: list[BatchSpan] = []
            for i, (pos, header) in enumerate(batches):
                if header.max_timestamp > max_timestamp:
                    max_timestamp, offset_of_max = header.max_timestamp, header.last_offset
                if spans and pos + header.size - group_start > segment_bytes:
                    rolled = self._append_locked(view[group_start:pos], spans, batches[i - 1][1].last_offset, now_ms)
                    rolled_to = rolled if rolled is not None else rolled_to
                    self._track_producers(view, batches[group_first:i])
                    group_start, group_first, spans = pos, i, []
                spans.append((pos - group_start, header.last_offset, header.max_timestamp, header.size))
            last_offset = batches[-1][1].last_offset
            rolled = self._append_locked(view[group_start:], spans, last_offset, now_ms)
            rolled_to = rolled if rolled is not None else rolled_to
            self._track_producers(view, batches[group_first:])
            for _, header in batches:
                epoch = header.partition_leader_epoch
                if epoch >= 0 and epoch != self.leader_epoch_cache.latest_epoch():
                    self.leader_epoch_cache.assign(epoch, header.base_offset)
            info = AppendInfo(
                first, last_offset, max_timestamp, offset_of_max, -1, self._log_start, len(batches), valid_bytes
            )
        if rolled_to is not None:
            self._flush_below(rolled_to)
        return info

    def _append_locked(self, data, spans: list[BatchSpan], last_offset: int, now_ms: int) -> int | None:
        """Roll if needed, append, advance the LEO. Returns the new segment's base offset if it rolled."""
        cfg = self.config
        rolled_to = None
        max_timestamp = max(span[2] for span in spans)
        segment_ms = cfg.segment_ms - min(self._roll_jitter_ms, cfg.segment_ms - 1)
        if self._segments[-1].should_roll(
            len(data), last_offset, max_timestamp, now_ms, cfg.segment_bytes, segment_ms
        ):
            self._roll_locked(now_ms)
            rolled_to = self._leo
        self._segments[-1].append(data, spans, cfg.index_interval_bytes)
        self._leo = last_offset + 1
        return rolled_to

    @_io_guarded
    def roll(self, now_ms: int | None = None) -> None:
        """Start a new active segment at the log end offset (no-op if the active one is empty)."""
        with self._lock:
            self._check_usable()
            if self._segments[-1].size == 0:
                return
            self._roll_locked(now_ms if now_ms is not None else _wall_clock_ms())
            rolled_to = self._leo
        self._flush_below(rolled_to)

    def _roll_locked(self, now_ms: int) -> None:
        old = self._segments[-1]
        old.on_become_inactive()
        new = LogSegment.create(self.dir, self._leo, self.config.segment_index_bytes, now_ms)
        self._segments.append(new)
        self._bases.append(new.base_offset)
        self._roll_jitter_ms = self._new_roll_jitter()
        # As Kafka: a producer snapshot at every roll bounds the replay after a crash to one segment.
        # Not fsynced here (we hold the lock); the flush that follows every roll syncs it.
        self.producer_state.take_snapshot(self._leo, sync=False)
        log.info(
            "segment_rolled",
            topic=self.topic,
            partition=self.partition,
            chunk_start=self.chunk_start,
            base_offset=new.base_offset,
            previous_size=old.size,
        )

    def _new_roll_jitter(self) -> int:
        # Kafka's randomSegmentJitter: spreads the time-based rolls of partitions created together.
        jitter = self.config.segment_jitter_ms
        return random.randrange(min(jitter, self.config.segment_ms)) if jitter > 0 else 0

    def _flush_below(self, offset: int) -> None:
        # Kafka flushes a rolled segment right away, which is what keeps the recovery point (and so
        # the work of a crash restart) close to the log end: in the background, so the append
        # that rolled returns at once; the recovery point moves when the fsync is done.
        self._flush_done = _background_flusher.submit(self._background_flush, offset)

    def _background_flush(self, offset: int) -> None:
        started = time.perf_counter()
        try:
            self.flush(offset)
            FLUSH_TIMES_MS.observe((time.perf_counter() - started) * 1000)
        except StorageError as exc:  # logged by _io_failure when it is an I/O error; a closed log is fine
            log.debug("background_flush_skipped", dir=str(self.dir), error=str(exc))

    def wait_for_background_flush(self, timeout: float | None = None) -> None:
        """Until the flush started by the latest roll has finished (tests, shutdown)."""
        done = self._flush_done
        if done is not None:
            done.result(timeout)

    # -- reading ---------------------------------------------------------------------------------

    @_io_guarded
    def read(
        self, offset: int, max_bytes: int, *, max_offset: int | None = None, min_one_batch: bool = True
    ) -> FetchInfo:
        """Whole batches from the one holding `offset` (it may start before `offset`), at most
        `max_bytes` (but one whole batch anyway if min_one_batch), none reaching `max_offset`
        (exclusive: the high watermark or LSO for consumers). Bytes come from os.pread, unparsed
        beyond batch headers."""
        with self._lock:
            self._check_usable()
            log_start, leo, hw = self._log_start, self._leo, self._hw
            segments = list(self._segments)
            sizes = [s.size for s in segments]
            bases = list(self._bases)
        if offset < log_start or offset > leo:
            raise OffsetOutOfRangeError(
                f"offset {offset} is outside [{log_start}, {leo}] of {self.topic}-{self.partition} (chunk {self.chunk_start})"
            )
        limit = leo if max_offset is None else min(max_offset, leo)
        parts: list = []
        total = 0
        cursor = offset
        if cursor < limit:
            first = max(0, bisect_right(bases, cursor) - 1)
            for seg, end in zip(segments[first:], sizes[first:]):
                found = seg.find_batch(cursor, end)
                if found is None:
                    continue
                data, next_offset, reached_end = seg.read_from(
                    found[0], end, max_bytes - total, limit, min_one_batch and not parts
                )
                if len(data):
                    parts.append(data)
                    total += len(data)
                    cursor = next_offset
                if not reached_end or cursor >= limit:
                    break
        return FetchInfo(parts, total, log_start, leo, hw, cursor)

    @_io_guarded
    def offset_for_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record at or after `timestamp` (ListOffsets by time), or
        None. Batch headers find the batch (time index, then a header walk); that one batch is then
        decoded, off the hot path, to name the exact record as Kafka does."""
        with self._lock:
            self._check_usable()
            log_start = self._log_start
            found = None
            for seg in self._segments:
                if seg.max_timestamp < timestamp:
                    continue
                hit = seg.find_batch_by_timestamp(timestamp, log_start)
                if hit is not None:
                    found = (seg, *hit)
                    break
            if found is None:
                return None
            seg, pos, header = found
            data = seg.read_batch(pos, header.size)
        for record_offset, record_ts in self._record_timestamps(data):
            if record_offset >= log_start and record_ts >= timestamp:
                return record_offset, record_ts
        return max(header.base_offset, log_start), header.max_timestamp

    @_io_guarded
    def max_timestamp(self) -> tuple[int, int]:
        """(timestamp, offset) of the record with the largest timestamp (ListOffsets -3), (-1, -1) if
        there is none."""
        with self._lock:
            self._check_usable()
            best = None
            for seg in self._segments:
                if seg.max_timestamp >= 0 and (best is None or seg.max_timestamp > best.max_timestamp):
                    best = seg
            if best is None:
                return -1, -1
            hit = best.find_batch(best.offset_of_max_timestamp, best.size)
            if hit is None:
                return best.max_timestamp, best.offset_of_max_timestamp
            pos, header = hit
            data = best.read_batch(pos, header.size)
            max_ts = best.max_timestamp
        for record_offset, record_ts in self._record_timestamps(data):
            if record_ts == max_ts:
                return max_ts, record_offset
        return max_ts, header.last_offset

    @staticmethod
    def _record_timestamps(batch: bytes) -> list[tuple[int, int]]:
        try:
            decoded = decode_batches(batch)
        except ProtocolError:
            return []  # an undecodable batch: callers fall back to the batch header
        return [(r.offset, r.timestamp) for b in decoded for r in b.records]

    # -- flushing, truncation, deletion ----------------------------------------------------------

    @_io_guarded
    def flush(self, up_to: int | None = None) -> None:
        """fsync the segments holding offsets in [recovery point, up_to) (default: the LEO) and move
        the recovery point there."""
        with self._lock:
            self._check_usable()
            target = self._leo if up_to is None else min(up_to, self._leo)
            snapshots = self.producer_state.take_unsynced() + self._take_unsynced_files()
            if target <= self._recovery_point and not snapshots and not self.leader_epoch_cache.unsynced:
                return
            ends = self._bases[1:] + [self._leo]
            dirty = [s for s, end in zip(self._segments, ends) if s.base_offset < target and end > self._recovery_point]
        for seg in dirty:
            seg.flush()
        for path in snapshots:
            fsync_file(path)  # gone if a truncation deleted it meanwhile: nothing to sync then
        self.leader_epoch_cache.sync()
        fsync_dir(self.dir)  # new segment and snapshot files must survive too
        with self._lock:
            new_point = min(target, self._leo)
            if new_point <= self._recovery_point or self._closed or self._failed:
                return
            self._recovery_point = new_point
            state = self._state()
        # outside the lock, as checkpoint(): appends to this partition never wait for these fsyncs
        write_log_state(self.dir / LOG_STATE_CHECKPOINT, state)
        self._durable_state = state

    @_io_guarded
    def truncate_to(self, offset: int) -> None:
        """Drop every record at or after `offset` (follower truncation); indexes, LEO, high watermark,
        recovery point and leader epochs follow."""
        if offset < 0:
            raise ValueError(f"cannot truncate to negative offset {offset}")
        with self._lock:
            self._check_usable()
            if offset >= self._leo:
                return
            old_leo = self._leo
            now_ms = _wall_clock_ms()
            if offset < self._bases[0]:
                self._truncate_fully_locked(offset, now_ms)
            else:
                keep = bisect_right(self._bases, offset)
                for seg in self._segments[keep:]:
                    self._schedule_delete(seg, now_ms, "truncation")
                del self._segments[keep:]
                del self._bases[keep:]
                active = self._segments[-1]
                active.truncate_to(offset)
                self._leo = active.next_offset
                self._log_start = min(self._log_start, self._leo)
                self._recovery_point = min(self._recovery_point, self._leo)
                self._hw = min(self._hw, self._leo)
                self.leader_epoch_cache.truncate_from_end(self._leo)
                self._reload_producer_state(now_ms)  # drops snapshots past the new end, replays the rest
                self._write_state()
            log.info(
                "log_truncated",
                dir=str(self.dir),
                to_offset=offset,
                old_log_end_offset=old_leo,
                log_end_offset=self._leo,
            )

    @_io_guarded
    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Delete every segment and restart empty at `offset` (a follower far behind the leader's log start)."""
        if offset < 0:
            raise ValueError(f"cannot start a log at negative offset {offset}")
        with self._lock:
            self._check_usable()
            self._truncate_fully_locked(offset, _wall_clock_ms())
            log.info("log_truncated_fully", dir=str(self.dir), start_offset=offset)

    def _truncate_fully_locked(self, offset: int, now_ms: int) -> None:
        for seg in self._segments:
            self._schedule_delete(seg, now_ms, "truncate fully")
        new = LogSegment.create(self.dir, offset, self.config.segment_index_bytes, now_ms)
        self._segments = [new]
        self._bases = [offset]
        self._leo = self._log_start = self._recovery_point = self._hw = offset
        self.leader_epoch_cache.clear()
        self.producer_state.truncate_fully()
        self._write_state()

    @_io_guarded
    def delete_records_before(self, offset: int) -> int:
        """DeleteRecords: raise the log start offset to `offset` (which may not pass the high
        watermark) and delete the whole segments now below it. Returns the new log start offset."""
        with self._lock:
            self._check_usable()
            if offset > self._hw:
                raise OffsetOutOfRangeError(
                    f"cannot delete records before {offset}: beyond the high watermark {self._hw} of {self.dir.name}"
                )
            if offset <= self._log_start:
                return self._log_start
            now_ms = _wall_clock_ms()
            self._purge_deleted(now_ms)
            self._log_start = offset
            self.leader_epoch_cache.truncate_from_start(offset)
            self._delete_prefix(lambda seg, next_base: next_base <= self._log_start, now_ms, "log start offset")
            self.producer_state.delete_snapshots_below(self._log_start)
            self._write_state()
            log.info("log_start_offset_raised", dir=str(self.dir), log_start_offset=offset)
            return self._log_start

    @_io_guarded
    def enforce_retention(self, now_ms: int, *, delete_policy: bool = True) -> int:
        """Delete whole segments, oldest first and never the active one or any holding offsets at or
        above the high watermark: those wholly below the log start offset, those whose newest
        timestamp is older than retention.ms, and those beyond retention.bytes (the last two only
        with delete_policy: cleanup.policy has "delete"; a compact-only log keeps its segments).
        Also purges segments deleted more than file.delete.delay.ms ago. Returns the number deleted."""
        with self._lock:
            self._check_usable()
            self._purge_deleted(now_ms)
            self._expire_producers(now_ms)
            cfg = self.config
            deleted = self._delete_prefix(
                lambda seg, next_base: next_base <= self._log_start, now_ms, "log start offset"
            )
            if delete_policy and cfg.retention_ms >= 0:
                deleted += self._delete_prefix(
                    lambda seg, next_base: now_ms - seg.largest_timestamp() > cfg.retention_ms, now_ms, "retention.ms"
                )
            if delete_policy and cfg.retention_bytes >= 0:
                excess = sum(s.size for s in self._segments) - cfg.retention_bytes

                def over_size(seg: LogSegment, next_base: int) -> bool:
                    nonlocal excess
                    if excess - seg.size < 0:
                        return False
                    excess -= seg.size
                    return True

                deleted += self._delete_prefix(over_size, now_ms, "retention.bytes")
            if deleted:
                self._write_state()
            return deleted

    def _delete_prefix(self, predicate: Callable[[LogSegment, int], bool], now_ms: int, reason: str) -> int:
        deleted = 0
        while len(self._segments) > 1:
            seg, next_base = self._segments[0], self._bases[1]
            if next_base > self._hw or not predicate(seg, next_base):
                break
            self._schedule_delete(seg, now_ms, reason)
            del self._segments[0]
            del self._bases[0]
            deleted += 1
        if deleted:
            if self._bases[0] > self._log_start:
                self._log_start = self._bases[0]
                self.leader_epoch_cache.truncate_from_start(self._log_start)
            self.producer_state.delete_snapshots_below(self._log_start)
        return deleted

    @_io_guarded
    def remove_expired_producers(self, now_ms: int) -> int:
        """Forget producers idle for producer.id.expiration.ms (enforce_retention does it too)."""
        with self._lock:
            self._check_usable()
            return self._expire_producers(now_ms)

    def _expire_producers(self, now_ms: int) -> int:
        n = self.producer_state.remove_expired(now_ms)
        if n:
            log.info("producers_expired", dir=str(self.dir), count=n, remaining=len(self.producer_state.producers))
        return n

    def _schedule_delete(self, seg: LogSegment, now_ms: int, reason: str) -> None:
        seg.rename_to_deleted()
        self._pending_deletes.append((now_ms + self.config.file_delete_delay_ms, seg))
        log.info("segment_deleted", dir=str(self.dir), base_offset=seg.base_offset, size=seg.size, reason=reason)

    def _purge_deleted(self, now_ms: int) -> None:
        still_pending = []
        for due, seg in self._pending_deletes:
            if due <= now_ms:
                seg.delete_files()
            else:
                still_pending.append((due, seg))
        self._pending_deletes = still_pending

    # -- compaction (broker/storage/cleaner.py does the work) -------------------------------------

    @_io_guarded
    def cleaner_view(self) -> CleanerView:
        """The inactive segments and the offsets the log cleaner plans with, taken under the lock."""
        with self._lock:
            self._check_usable()
            producers = self.producer_state.producers.values()
            return CleanerView(
                [SegmentInfo.of(seg, next_base) for seg, next_base in zip(self._segments[:-1], self._bases[1:])],
                self._bases[-1],
                self._log_start,
                self._hw,
                self._leo,
                {e.producer_id: e.last_offset for e in producers if e.last_offset >= 0},
                self.config,
                _or_minus_one(self.producer_state.first_unstable_offset()),
            )

    @_io_guarded
    def swap_cleaned_segment(self, old: list[SegmentInfo]) -> bool:
        """Put the cleaned segment the cleaner wrote (`.cleaned` files named after old[0]) in place of
        the run of inactive segments `old`. False, and the cleaned files deleted, if those segments
        are no longer exactly the log's (retention, truncation or a close got there first)."""
        with self._lock:
            first = next((i for i, seg in enumerate(self._segments) if seg is old[0].segment), -1)
            current = (
                not self._closed
                and not self._failed
                and first >= 0
                and first + len(old) < len(self._segments)  # never the active segment
                and all(info.still_current(seg) for info, seg in zip(old, self._segments[first:]))
            )
            if not current:
                discard_cleaned(self.dir, old[0].base_offset)
                return False
            now_ms = _wall_clock_ms()
            new = swap_in_cleaned(
                self.dir,
                [info.segment for info in old],
                self.config,
                lambda seg: self._schedule_delete(seg, now_ms, "replaced by its cleaned segment"),
                now_ms,
            )
            self._segments[first : first + len(old)] = [new]
            self._bases[first : first + len(old)] = [new.base_offset]
            return True

    # -- shutdown --------------------------------------------------------------------------------

    @_io_guarded
    def close(self, *, sync: bool = True) -> None:
        """Write the last time-index entry and a producer snapshot at the log end (the next open
        replays nothing), checkpoint, and close the files. With sync, everything is fsynced and
        the recovery point moves to the log end. Without (a broker's shutdown: LogDir.mark_clean
        syncs the whole dir once, then writes its clean-shutdown marker), nothing is fsynced and
        the checkpoint keeps the recovery point that was synced. A failed log only closes its files."""
        with self._lock:
            if self._closed:
                return
            try:
                if not self._failed:
                    self._segments[-1].on_become_inactive()
                    if sync:
                        for seg in self._segments:
                            seg.flush()
                        for path in self.producer_state.take_unsynced() + self._take_unsynced_files():
                            fsync_file(path)
                        self.leader_epoch_cache.sync()
                    self.producer_state.take_snapshot(self._leo, sync=sync)
                    if sync:
                        fsync_dir(self.dir)
                        self._recovery_point = self._leo
                    if self._state() != self._durable_state:
                        self._write_state(sync=sync)
            finally:
                self._closed = True
                self._close_files()
        log.info("log_closed", dir=str(self.dir), log_end_offset=self._leo)

    def delete(self) -> None:
        """Remove the whole replica dir."""
        with self._lock:
            self._closed = True
            self._close_files()
            # A background flush that passed its closed check may still rename its state file in
            # (it writes outside the lock): a file gone meanwhile must not stop rmtree, which gives
            # up at its first error otherwise, and one that appeared is removed by another pass.
            for attempt in range(3):
                try:
                    shutil.rmtree(self.dir, onerror=_ignore_missing)
                    break
                except OSError as exc:
                    if exc.errno != errno.ENOTEMPTY or attempt == 2:
                        raise self._io_failure("delete", exc) from exc
        log.info("log_deleted", dir=str(self.dir))

    def _close_files(self) -> None:
        for seg in self._segments:
            seg.close_files()
        for _, seg in self._pending_deletes:
            seg.close_files()

    def __repr__(self) -> str:
        return f"Log({self.dir.name}, log_start={self._log_start}, leo={self._leo}, hw={self._hw})"


def check_timestamps(batches: list[tuple[int, BatchHeader]], now_ms: int, cfg: LogConfig) -> None:
    """KIP-937: CreateTime timestamps must lie in [now - before.max.ms, now + after.max.ms]. Kafka
    checks every record; the hot path reads batch headers only, so the batch's first record
    (base timestamp) and its max timestamp are checked, which bound the records of any producer
    that stamps records in order."""
    low = now_ms - cfg.message_timestamp_before_max_ms
    high = now_ms + cfg.message_timestamp_after_max_ms
    errors = []
    for index, (_, header) in enumerate(batches):
        for ts in (header.base_timestamp, header.max_timestamp):
            if ts != -1 and not low <= ts <= high:
                errors.append(
                    (
                        index,
                        f"Timestamp {ts} of message with offset {header.base_offset} is out of range. "
                        f"The timestamp should be within [{low}, {high}]",
                    )
                )
                break
    if errors:
        raise InvalidTimestampError(
            "One or more records have been rejected due to invalid timestamp", record_errors=errors
        )


def _or_minus_one(value: int | None) -> int:
    return -1 if value is None else value


__all__ = ["AppendInfo", "AppendOrigin", "FetchInfo", "Log"]
