"""Log: one chunk replica's records, in the replica's own dir (Kafka's UnifiedLog role).

The log is three parts, as Kafka's: this class keeps the partition's offsets and rules (log start
offset, high watermark, last stable offset, producer state, leader epochs, appends as leader and
follower, retention and DeleteRecords); LocalLog (local_log.py) keeps the segment list and what it
alone decides (log end offset, recovery point, rolls, reads across segments, truncation, deleted
segments); LogLoader (log_loader.py) recovers the dir when the log opens.

Threading: every change (append, roll, truncation, retention, close) runs under the log's lock,
which guards the LocalLog too. read() only snapshots the segment list and sizes under it and does
its preads outside, so a consumer never waits behind an fsync; flush() fsyncs outside the lock
for the same reason.

Transactions: producer state tracks open transactions and those completed whose marker the high
watermark has not passed; `last_stable_offset` = min(their first offsets, high watermark). An ABORT
marker adds an entry to the `.txnindex` of the segment it lands in (leader, follower and
recovery alike); `aborted_transactions()` answers read_committed fetches from those indexes.
"""

from __future__ import annotations

import enum
import functools
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import structlog

from broker.storage.atomic_file import fsync_dir
from broker.storage.batch_validation import validate_client_batches, validate_replicated_batches
from broker.storage.cleaner_view import CleanerView, SegmentInfo
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
from broker.storage.file_names import LOG_STATE_CHECKPOINT, parse_replica_dir_name
from broker.storage.leader_epoch import LeaderEpochCache
from broker.storage.local_log import FLUSH_TIMES_MS, LocalLog, flush_in_background, read_segments
from broker.storage.log_loader import LogLoader
from broker.storage.log_state import LogState, LogStateFile
from broker.storage.producer_replay import index_aborted, marker_of, rebuild_producer_state, track_replicated
from broker.storage.producer_state import DEFAULT_PRODUCER_ID_EXPIRATION_MS, BatchMetadata, ProducerStateManager
from broker.storage.retention import Predicate, below_log_start, compaction_roll_due, retention_rules
from broker.storage.segment import BatchSpan, CorruptSegmentError
from broker.storage.segment_swap import discard_cleaned
from protocol.errors import ProtocolError
from protocol.records.batch import (
    BatchHeader,
    read_header,
    set_base_offset,
    set_log_append_time,
    set_partition_leader_epoch,
)
from protocol.records.codec import decode_batches
from protocol.records.control import encode_txn_marker

log = structlog.get_logger(__name__)


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


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
    records: list  # bytes-like parts straight from os.pread (or FileRegions), whole batches, in offset order
    total_bytes: int
    log_start_offset: int
    log_end_offset: int
    high_watermark: int = -1  # taken in the same snapshot as the reads' bounds
    end_offset: int = -1  # the offset after the last batch returned (the read's start if none)


def _clamp(value: int, low: int, high: int) -> int:
    """min(max(value, low), high) without them: on 3.11 each call of min() or max() parses keyword
    arguments in C (about 1,000 instructions), and the high watermark moves every produce."""
    value = value if value > low else low
    return value if value < high else high


def _io_guarded(method):
    """OSError (and corrupt bytes in a region we trusted) from a public method: the log is failed,
    the log dir's handler hears of it, and the caller gets StorageError (KAFKA_STORAGE_ERROR).
    Running out of descriptors or memory is no disk fault: ResourceExhaustedError, log online."""

    @functools.wraps(method)
    def guarded(self: Log, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except (OSError, CorruptSegmentError) as exc:
            raise self._local.io_failure(method.__name__, exc) from exc

    return guarded


class Log:
    """One chunk replica's log: the records of one partition from `chunk_start` on, in its own dir."""

    __slots__ = ("dir", "dir_key", "topic", "partition", "chunk_start", "config", "topic_id", "_expected_topic_id",
                 "_lock", "_local", "_log_start", "_hw", "_closed", "_flush_done", "_state_file", "leader_epoch_cache",
                 "producer_state", "__weakref__")  # one a partition: no __dict__ each

    def __init__(self, dir: Path, config: LogConfig, topic_id: uuid.UUID | None,
                 io_error_handler: Callable[[Path, BaseException], None] | None,
                 producer_id_expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS) -> None:
        name = parse_replica_dir_name(dir.name)
        if name is None:
            raise ValueError(f"{dir.name!r} is not a chunk replica dir name (<topic>-<partition>-<chunkStart>)")
        self.dir = dir
        # strs, no Path made per checkpoint round; interned: one for all the logs sharing them
        self.dir_key = (sys.intern(os.fspath(dir.parent)), dir.name)
        self.topic = sys.intern(name.topic)
        self.partition = name.partition
        self.chunk_start = name.chunk_start
        self.config = config
        self.topic_id = topic_id  # after open: the id stored in the dir
        self._expected_topic_id: uuid.UUID | None = None  # set only when the dir holds another topic id
        self._lock = threading.RLock()  # guards _local as well
        self._local = LocalLog(dir, config, io_error_handler)  # segments, log end offset, recovery point
        self._log_start = 0
        self._hw = 0
        self._closed = False
        self._flush_done: Future | None = None  # the latest background flush after a roll
        self._state_file = LogStateFile(os.fspath(dir) + os.sep + LOG_STATE_CHECKPOINT)
        self.leader_epoch_cache = LeaderEpochCache(None)
        self.producer_state = ProducerStateManager(dir, producer_id_expiration_ms)

    # -- opening ---------------------------------------------------------------------------------

    @classmethod
    def open(cls, dir: Path, config: LogConfig, *, topic_id: uuid.UUID | None = None, now_ms: int | None = None,
             io_error_handler: Callable[[Path, BaseException], None] | None = None,
             producer_id_expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS, clean_shutdown: bool = False,
             dir_high_watermark: tuple[int, int] | None = None) -> Log:
        """Open (creating if missing) the log in `dir`. Unless its log dir was shut down cleanly
        (`clean_shutdown`: LogDir knows from its marker), every batch from the recovery point on is
        checked (header + CRC32C) and a torn or corrupt tail is cut off at the last whole batch;
        missing or damaged indexes are rebuilt either way. Producer state comes from the newest
        snapshot at or below the log end plus the batch headers after it. `dir_high_watermark`: see log_state.py."""
        self = cls(dir if isinstance(dir, Path) else Path(dir), config, topic_id, io_error_handler, producer_id_expiration_ms)
        now = now_ms if now_ms is not None else _wall_clock_ms()
        try:
            self._load(now, clean_shutdown, dir_high_watermark)  # the loader makes a missing dir
        except (OSError, CorruptSegmentError) as exc:
            self._close_files()
            raise _open_failure(self.dir, exc, io_error_handler) from exc
        except BaseException:
            self._close_files()
            raise
        return self

    def _load(self, now_ms: int, clean: bool, dir_high_watermark: tuple[int, int] | None) -> None:
        loader = LogLoader(self.dir, self.config, self.chunk_start, self._local, self.producer_state)
        loaded = loader.load(self.topic_id, clean, now_ms, dir_high_watermark)
        if self.topic_id is not None and loaded.topic_id != self.topic_id:
            # A stale dir of a deleted topic with the same name. Opening still succeeds so the caller
            # can compare `topic_id` and delete() it; until then the log refuses reads and writes.
            self._expected_topic_id = self.topic_id
        if loaded.topic_id != self.topic_id:  # else the caller's: one UUID object a topic, not a log
            self.topic_id = loaded.topic_id
        self.leader_epoch_cache = loaded.leader_epoch_cache
        self._log_start = loaded.log_start_offset
        self._hw = loaded.high_watermark
        self._state_file = LogStateFile(self._state_file.path, loaded.durable_state, loaded.fresh,
                                        loaded.incarnation)

    def _reload_producer_state(self, now_ms: int) -> tuple[int, int]:
        """Producer state from the newest usable snapshot plus a replay of the headers after it
        (after a truncation). Returns (offset replayed from, batches replayed)."""
        return rebuild_producer_state(self.producer_state, self._local, self._log_start, self._hw, now_ms)

    # -- state -----------------------------------------------------------------------------------

    @property
    def log_start_offset(self) -> int:
        return self._log_start

    @property
    def log_end_offset(self) -> int:
        """The next offset to assign."""
        return self._local.leo

    @property
    def recovery_point(self) -> int:
        """Everything below it is fsynced; a restart after a crash checks only what lies above."""
        return self._local.recovery_point

    @property
    def high_watermark(self) -> int:
        return self._hw

    @property
    def size_bytes(self) -> int:
        with self._lock:
            return self._local.size_bytes()

    @property
    def segment_base_offsets(self) -> list[int]:
        with self._lock:
            return list(self._local.bases)

    @property
    def active_segment_base_offset(self) -> int:
        return self._local.bases[-1]

    def update_config(self, config: LogConfig) -> None:
        """New settings apply from the next append / roll check / retention pass."""
        self.config = config
        self._local.config = config

    def update_high_watermark(self, offset: int) -> int:
        """Set by the replication layer; clamped to [log start, LEO]. Persisted by checkpoint() (call
        it periodically, as Kafka's high watermark checkpoint), close(), and any call that rewrites
        log-state.checkpoint anyway; not on every update, which follows every acknowledged produce."""
        with self._lock:
            self._hw = _clamp(offset, self._log_start, self._local.leo)
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
        upper_offset) (Kafka's collectAbortedTransactions)."""
        with self._lock:
            self._check_usable()
            out = self._local.collect_aborted_transactions(start_offset, upper_offset)
        return [(t.producer_id, t.first_offset) for t in out]

    @_io_guarded
    def checkpoint(self, *, sync: bool = True, hw_in_dir: bool = False) -> bool:
        """Persist log start offset, recovery point and high watermark (call periodically). Skipped
        when nothing changed (most of 20,000 partitions are idle); written outside the lock, so
        the fsyncs never stall an append (a checkpoint racing a newer write can only leave older,
        hence safe, values). Without sync the caller syncs the dir's filesystem once for all its
        logs (the file's recovery point is always one already synced). `hw_in_dir`: the caller
        writes high_watermark_entry() into the dir's file (log_state.py). True if written."""
        with self._lock:
            self._check_usable()
            state = self._state()
            if not self._state_file.stale(state, hw_in_dir):
                return False
        try:
            self._state_file.write(state, sync=sync)
        except OSError:
            with self._lock:
                if self._closed:  # deleted or closed meanwhile (its dir may be gone): no disk is at fault
                    return False
            raise
        return True

    def _state(self) -> LogState:
        return LogState(self._log_start, self._local.recovery_point, self._hw, self._state_file.incarnation)

    def high_watermark_entry(self) -> tuple[int, int]:
        """(incarnation, high watermark): this log's line in its dir's high-watermark-checkpoint (no
        lock: a truncation lowers the high watermark before it renews the incarnation)."""
        return self._state_file.incarnation, self._hw

    def _write_state(self, *, sync: bool = True) -> None:
        self._state_file.write(self._state(), sync=sync, durable=sync)

    def _check_usable(self) -> None:
        if self._closed:
            raise StorageError(f"log {self.dir} is closed")
        if self._local.failed:
            raise StorageError(f"log {self.dir} failed an earlier I/O operation and is offline")
        if self._expected_topic_id is not None:
            raise InconsistentTopicIdError(
                f"{self.dir} belongs to topic id {self.topic_id}, not {self._expected_topic_id}; delete it first"
            )

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
        local = self._local
        with self._lock:
            self._check_usable()
            first_offset = offset = local.leo
            max_timestamp, offset_of_max = -1, -1
            spans: list[BatchSpan] = []
            producers = None  # only batches with a producer id touch producer state
            for pos, header in batches:
                timestamp = log_append_time if log_append_time >= 0 else header.max_timestamp
                last = offset + header.last_offset_delta
                if header.producer_id >= 0:
                    if producers is None:
                        producers = self.producer_state.begin_leader_append(client=origin is AppendOrigin.CLIENT)
                    marker = marker_of(records[pos : pos + header.size], header, self.dir) if header.is_control else None
                    duplicate = producers.add(header, offset, last, timestamp, marker)
                    if duplicate is not None:
                        return _duplicate_info(duplicate, log_append_time >= 0, self._log_start, self.topic, self.partition)
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
                        index_aborted(self.producer_state, local.segments[-1], done)
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

    def duplicate_of(self, records: bytes | bytearray | memoryview) -> AppendInfo | None:
        """When `records` is one batch this log holds already (one of its producer's last 5), the
        offsets it got the first time; else None. Writes nothing."""
        try:
            header = read_header(records)
        except ProtocolError:
            return None
        with self._lock:
            dup = self.producer_state.find_duplicate(header)
            if dup is None or header.size != memoryview(records).nbytes:
                return None
            return _duplicate_info(dup, self.config.log_append_time, self._log_start, self.topic, self.partition)

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
        local = self._local
        with self._lock:
            self._check_usable()
            first = batches[0][1].base_offset
            if first != local.leo:
                raise UnexpectedAppendOffsetError(
                    f"follower append to {self.dir} starts at offset {first}, log end offset is {local.leo}",
                    first_offset=first,
                    expected_offset=local.leo,
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
                    track_replicated(self.producer_state, local.segments[-1], view, batches[group_first:i], self.dir)
                    group_start, group_first, spans = pos, i, []
                spans.append((pos - group_start, header.last_offset, header.max_timestamp, header.size))
            last_offset = batches[-1][1].last_offset
            rolled = self._append_locked(view[group_start:], spans, last_offset, now_ms)
            rolled_to = rolled if rolled is not None else rolled_to
            track_replicated(self.producer_state, local.segments[-1], view, batches[group_first:], self.dir)
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
        """Roll if needed (Kafka's maybeRoll), append, advance the LEO. Returns the new segment's
        base offset if it rolled."""
        local = self._local
        rolled_to = None
        if local.should_roll(len(data), last_offset, max(span[2] for span in spans), now_ms):
            self._roll_locked(now_ms)
            rolled_to = local.leo
        local.append(data, spans, last_offset)
        return rolled_to

    @_io_guarded
    def roll(self, now_ms: int | None = None) -> None:
        """Start a new active segment at the log end offset (no-op if the active one is empty)."""
        with self._lock:
            self._check_usable()
            if self._local.segments[-1].size == 0:
                return
            self._roll_locked(now_ms if now_ms is not None else _wall_clock_ms())
            rolled_to = self._local.leo
        self._flush_below(rolled_to)

    @_io_guarded
    def roll_for_compaction(self, max_compaction_lag_ms: int, now_ms: int) -> bool:
        """KIP-354: roll an active segment whose first batch is older than max.compaction.lag.ms
        (Kafka's LogConfig.maxSegmentMs), so the cleaner, which never cleans it, gets it in time."""
        with self._lock:
            self._check_usable()
            if not compaction_roll_due(self._local.segments[-1], max_compaction_lag_ms, now_ms):
                return False
            self._roll_locked(now_ms)
            rolled_to = self._local.leo
        self._flush_below(rolled_to)
        return True

    def _roll_locked(self, now_ms: int) -> None:
        previous_size = self._local.segments[-1].size
        new = self._local.roll(now_ms)
        # As Kafka: a producer snapshot at every roll bounds the replay after a crash to one segment.
        # Not fsynced here (we hold the lock); the flush that follows every roll syncs it.
        self.producer_state.take_snapshot(new.base_offset, sync=False)
        log.info(
            "segment_rolled",
            topic=self.topic,
            partition=self.partition,
            chunk_start=self.chunk_start,
            base_offset=new.base_offset,
            previous_size=previous_size,
        )

    def _flush_below(self, offset: int) -> None:
        # Kafka flushes a rolled segment right away, which is what keeps the recovery point (and so
        # the work of a crash restart) close to the log end: in the background, so the append
        # that rolled returns at once; the recovery point moves when the fsync is done.
        self._flush_done = flush_in_background(self.flush, offset, self.dir)

    def wait_for_background_flush(self, timeout: float | None = None) -> None:
        """Until the flush started by the latest roll has finished (tests, shutdown)."""
        done = self._flush_done
        if done is not None:
            done.result(timeout)

    # -- reading ---------------------------------------------------------------------------------

    @_io_guarded
    def read(
        self, offset: int, max_bytes: int, *, max_offset: int | None = None, min_one_batch: bool = True,
        regions: bool = False,
    ) -> FetchInfo:
        """Whole batches from the one holding `offset` (it may start before `offset`), at most
        `max_bytes` (but one whole batch anyway if min_one_batch), none reaching `max_offset`
        (exclusive: the high watermark or LSO for consumers). Bytes come from os.pread, unparsed
        beyond batch headers; with `regions`, large reads come as FileRegions (for a Fetch answer)."""
        local = self._local
        with self._lock:
            self._check_usable()
            log_start, leo, hw = self._log_start, local.leo, self._hw
            segments, sizes, bases = local.snapshot()
        if offset < log_start or offset > leo:
            raise OffsetOutOfRangeError(
                f"offset {offset} is outside [{log_start}, {leo}] of {self.topic}-{self.partition} (chunk {self.chunk_start})"
            )
        limit = leo if max_offset is None or max_offset > leo else max_offset
        parts, total, cursor = read_segments(segments, sizes, bases, offset, max_bytes, limit, min_one_batch, regions)
        return FetchInfo(parts, total, log_start, leo, hw, cursor)

    @_io_guarded
    def offset_for_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record at or after `timestamp` (ListOffsets by time), or
        None. Batch headers find the batch (time index, then a header walk); that one batch is then
        decoded, off the hot path, to name the exact record as Kafka does."""
        with self._lock:
            self._check_usable()
            log_start = self._log_start
            found = self._local.batch_at_timestamp(timestamp, log_start)
            if found is None:
                return None
        return _first_record_at(found[0], found[1], timestamp, log_start)

    @_io_guarded
    def max_timestamp(self) -> tuple[int, int]:
        """(timestamp, offset) of the record with the largest timestamp (ListOffsets -3), (-1, -1) if
        there is none."""
        with self._lock:
            self._check_usable()
            max_ts, offset_of_max, batch = self._local.batch_with_max_timestamp()
        return (max_ts, offset_of_max) if batch is None else (max_ts, _offset_of_timestamp(*batch, max_ts))

    # -- flushing, truncation, deletion ----------------------------------------------------------

    @_io_guarded
    def flush(self, up_to: int | None = None) -> None:
        """fsync the segments holding offsets in [recovery point, up_to) (default: the LEO) and move
        the recovery point there."""
        local = self._local
        with self._lock:
            self._check_usable()
            target = local.leo if up_to is None else min(up_to, local.leo)
            snapshots: list[str | Path] = [*self.producer_state.take_unsynced(), *local.take_unsynced_files()]
            if target <= local.recovery_point and not snapshots and not self.leader_epoch_cache.unsynced:
                return
            dirty = local.unflushed_segments(target)
        local.sync(dirty, snapshots)
        self.leader_epoch_cache.sync()
        fsync_dir(self.dir)  # new segment and snapshot files must survive too
        with self._lock:
            new_point = min(target, local.leo)
            if new_point <= local.recovery_point or self._closed or local.failed:
                return
            local.recovery_point = new_point
            state = self._state()
        # outside the lock, as checkpoint(): appends to this partition never wait for these fsyncs
        self._state_file.write(state)

    @_io_guarded
    def truncate_to(self, offset: int) -> None:
        """Drop every record at or after `offset` (follower truncation); indexes, LEO, high watermark,
        recovery point and leader epochs follow."""
        if offset < 0:
            raise ValueError(f"cannot truncate to negative offset {offset}")
        local = self._local
        with self._lock:
            self._check_usable()
            if offset >= local.leo:
                # no record to drop, but an epoch we led without appending must go, or a new leader
                # answers our fetches with a diverging epoch forever (Kafka's UnifiedLog.truncateTo)
                self.leader_epoch_cache.truncate_from_end(local.leo)
                return
            old_leo = local.leo
            now_ms = _wall_clock_ms()
            if offset < local.bases[0]:
                self._truncate_fully_locked(offset, now_ms)
            else:
                local.truncate_to(offset, now_ms)
                leo = local.leo
                self._log_start = min(self._log_start, leo)
                self._hw = min(self._hw, leo)
                self.leader_epoch_cache.truncate_from_end(leo)
                self._reload_producer_state(now_ms)  # drops snapshots past the new end, replays the rest
                self._state_file.renew()  # the dir's entry may hold the old high watermark
                self._write_state()
            log.info(
                "log_truncated",
                dir=str(self.dir),
                to_offset=offset,
                old_log_end_offset=old_leo,
                log_end_offset=local.leo,
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
        self._local.truncate_fully(offset, now_ms)
        self._log_start = self._hw = offset
        self.leader_epoch_cache.clear()
        self.producer_state.truncate_fully()
        self._state_file.renew()
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
            self._local.purge_deleted(now_ms)
            self._log_start = offset
            self.leader_epoch_cache.truncate_from_start(offset)
            self._delete_prefix(below_log_start(lambda: offset), now_ms, "log start offset")
            self.producer_state.delete_snapshots_below(self._log_start)
            self._write_state()
            log.info("log_start_offset_raised", dir=str(self.dir), log_start_offset=offset)
            return self._log_start

    @_io_guarded
    def enforce_retention(self, now_ms: int, *, delete_policy: bool = True) -> int:
        """Delete whole segments, oldest first, by the rules of retention.py (log start offset;
        with delete_policy, cleanup.policy has "delete": retention.bytes and retention.ms), never
        past the high watermark; when all are due, a new empty active segment is rolled first.
        Also purges segments deleted more than file.delete.delay.ms ago. Returns the number deleted."""
        with self._lock:
            self._check_usable()
            self._local.purge_deleted(now_ms)
            self._expire_producers(now_ms)
            deleted = 0
            for reason, rule in retention_rules(
                self.config, now_ms, delete_policy, lambda: self._log_start, self._local.size_bytes
            ):
                deleted += self._delete_prefix(rule, now_ms, reason)
            if deleted:
                self._write_state()
            return deleted

    def _delete_prefix(self, predicate: Predicate, now_ms: int, reason: str) -> int:
        local = self._local
        n = local.deletable_count(predicate, self._hw)
        if n == 0:
            return 0
        if n == len(local.segments):  # UnifiedLog.deleteSegments: keep one segment, a new one
            self._roll_locked(now_ms)
            self._flush_below(local.leo)
        local.delete_oldest(n, now_ms, reason)
        if local.bases[0] > self._log_start:
            self._log_start = local.bases[0]
            self.leader_epoch_cache.truncate_from_start(self._log_start)
        self.producer_state.delete_snapshots_below(self._log_start)
        return n

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

    # -- compaction (broker/storage/cleaner.py does the work) -------------------------------------

    @_io_guarded
    def cleaner_view(self) -> CleanerView:
        """The inactive segments and the offsets the log cleaner plans with, taken under the lock."""
        with self._lock:
            self._check_usable()
            local = self._local
            producers = self.producer_state.producers.values()
            return CleanerView(
                local.inactive_segments(),
                local.bases[-1],
                self._log_start,
                self._hw,
                local.leo,
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
            if self._closed or self._local.failed:
                discard_cleaned(self.dir, old[0].base_offset)
                return False
            return self._local.replace_with_cleaned(old, _wall_clock_ms())

    # -- shutdown --------------------------------------------------------------------------------

    @_io_guarded
    def close(self, *, sync: bool = True, hw_in_dir: bool = False) -> None:
        """Write the last time-index entry and a producer snapshot at the log end (the next open
        replays nothing), checkpoint, and close the files. With sync, everything is fsynced and
        the recovery point moves to the log end. Without (a broker's shutdown: LogDir.mark_clean
        syncs the whole dir once, then writes its clean-shutdown marker), nothing is fsynced and
        the checkpoint keeps the recovery point that was synced. `hw_in_dir` as checkpoint(). A
        failed log only closes its files."""
        local = self._local
        with self._lock:
            if self._closed:
                return
            try:
                if not local.failed:
                    local.segments[-1].on_become_inactive()
                    self.leader_epoch_cache.write(sync=sync, in_place=not sync)  # a shutdown's: in place
                    if sync:
                        local.sync(local.segments, [*self.producer_state.take_unsynced(), *local.take_unsynced_files()])
                    self.producer_state.take_snapshot(local.leo, sync=sync)
                    if sync:
                        fsync_dir(self.dir)
                        local.recovery_point = local.leo
                    if self._state_file.stale(self._state(), hw_in_dir):
                        self._write_state(sync=sync)
            finally:
                self._closed = True
                self._close_files()
        log.debug("log_closed", dir=str(self.dir), log_end_offset=local.leo)

    def delete(self) -> None:
        """Remove the whole replica dir."""
        with self._lock:
            self._closed = True
            self._close_files()
            try:
                self._local.delete_dir()
            except OSError as exc:
                raise self._local.io_failure("delete", exc) from exc
        log.info("log_deleted", dir=str(self.dir))

    def _close_files(self) -> None:
        self._local.close_files()

    def __repr__(self) -> str:
        return f"Log({self.dir.name}, log_start={self._log_start}, leo={self._local.leo}, hw={self._hw})"


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


def _open_failure(
    dir: Path, exc: BaseException, io_error_handler: Callable[[Path, BaseException], None] | None
) -> StorageError:
    """What a failed open raises: out of descriptors or memory is retriable and no disk fault;
    anything else is the dir's handler's business too."""
    if is_resource_exhaustion(exc):
        note_resource_exhaustion(str(dir), "open", exc)
        return ResourceExhaustedError(f"cannot open log {dir} now: {exc}")
    if io_error_handler is not None:
        io_error_handler(dir, exc)
    return StorageError(f"cannot open log {dir}: {exc}")


def _duplicate_info(
    batch: BatchMetadata, log_append_time: bool, log_start: int, topic: str, partition: int
) -> AppendInfo:
    # As Kafka: a retried batch is answered with the offsets it got the first time.
    log.info(
        "duplicate_batch",
        topic=topic,
        partition=partition,
        first_offset=batch.first_offset,
        first_sequence=batch.first_seq,
    )
    return AppendInfo(
        batch.first_offset,
        batch.last_offset,
        batch.timestamp,
        batch.last_offset,
        batch.timestamp if log_append_time else -1,
        log_start,
        0,
        0,
        duplicate=True,
    )


def _record_timestamps(batch: bytes) -> list[tuple[int, int]]:
    try:
        decoded = decode_batches(batch)
    except ProtocolError:
        return []  # an undecodable batch: callers fall back to the batch header
    return [(r.offset, r.timestamp) for b in decoded for r in b.records]


def _first_record_at(data: bytes, header: BatchHeader, timestamp: int, log_start: int) -> tuple[int, int]:
    """(offset, timestamp) of the batch's first record at or after `timestamp` and `log_start`."""
    for record_offset, record_ts in _record_timestamps(data):
        if record_offset >= log_start and record_ts >= timestamp:
            return record_offset, record_ts
    return max(header.base_offset, log_start), header.max_timestamp


def _offset_of_timestamp(data: bytes, header: BatchHeader, timestamp: int) -> int:
    """The offset of the batch's record carrying `timestamp` (its last offset if none does)."""
    for record_offset, record_ts in _record_timestamps(data):
        if record_ts == timestamp:
            return record_offset
    return header.last_offset


def _or_minus_one(value: int | None) -> int:
    return -1 if value is None else value


__all__ = ["FLUSH_TIMES_MS", "AppendInfo", "AppendOrigin", "FetchInfo", "Log", "check_timestamps"]
