"""LocalLog: one replica's segments in its dir (Kafka's LocalLog): the segment list and its base
offsets, the log end offset and recovery point, rolling, reading across segments, truncation,
deleting a prefix of segments and the deferred deletion of the files, what the next flush must
sync (and the thread that flushes after a roll), and what an I/O error does to the log
(Kafka's maybeHandleIOException).

Not thread-safe, as Kafka's LocalLog: the owning Log's lock guards every method. Reads snapshot
the lists under that lock (snapshot()) and do their preads outside it (read_segments()).
Deleted segments are renamed `.deleted` and purged file.delete.delay.ms later (never in the call
that deleted them), so a read that snapshotted one keeps valid descriptors.
"""

from __future__ import annotations

import errno
import random
import shutil
import time
from bisect import bisect_right
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import structlog

from broker.storage.atomic_file import fsync_file
from broker.storage.cleaner_view import SegmentInfo
from broker.storage.config import LogConfig
from broker.storage.errors import OffsetOutOfRangeError, ResourceExhaustedError, StorageError
from broker.storage.exhaustion import is_resource_exhaustion, note_resource_exhaustion
from broker.storage.file_cache import FileGoneError
from broker.storage.retention import Predicate
from broker.storage.segment import BatchSpan, LogSegment
from broker.storage.segment_swap import discard_cleaned, swap_in_cleaned
from broker.storage.txn_index import AbortedTxn
from node.metrics import Histogram
from protocol.records.batch import BatchHeader

log = structlog.get_logger(__name__)

# fsyncs after a roll run here, one at a time (Kafka's scheduled "flush-log" task): the append that
# rolled, often on the event loop, never waits for a disk sync. A thread, not a pool: fsyncs of one
# disk do not go faster side by side, and one thread keeps the recovery point moving in order.
_background_flusher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="log-flush")
# the flushes' durations in ms (Kafka's LogFlushRateAndTimeMs); written by that one thread only
FLUSH_TIMES_MS = Histogram()


class LocalLog:
    """The segments of one chunk replica dir, and the offsets they alone decide."""

    __slots__ = ("dir", "config", "failed", "_io_error_handler", "segments", "bases", "pending_deletes", "leo",
                 "recovery_point", "roll_jitter_ms", "unsynced_files")  # one a partition: no __dict__ each

    def __init__(
        self, dir: Path, config: LogConfig, io_error_handler: Callable[[Path, BaseException], None] | None = None
    ) -> None:
        self.dir = dir
        self.config = config
        self.failed = False  # an I/O error took the log offline (io_failure)
        self._io_error_handler = io_error_handler  # the log dir's: a disk error takes the dir offline
        self.segments: list[LogSegment] = []  # oldest first; the last is the active segment
        self.bases: list[int] = []  # base offsets of segments, for bisect
        # (due ms, segment); none (a shared empty tuple, not a list each) on most logs
        self.pending_deletes: list[tuple[int, LogSegment]] | tuple = ()
        self.leo = 0  # log end offset: the next offset to assign
        self.recovery_point = 0  # everything below it is fsynced
        self.roll_jitter_ms = self.new_roll_jitter()  # the active segment's (Kafka: per segment)
        # written without fsync (as strs: a fresh log's partition.metadata waits here until its
        # first flush); the next flush syncs them
        self.unsynced_files: list[str] | tuple = ()

    def size_bytes(self) -> int:
        return sum(s.size for s in self.segments)

    def io_failure(self, operation: str, exc: BaseException) -> StorageError:
        """What an OSError (or corrupt bytes in a region we trusted) becomes (Kafka's
        maybeHandleIOException): a disk fault fails the log and the log dir's handler hears of
        it; running out of descriptors or memory is retriable and leaves the log online."""
        if isinstance(exc, FileGoneError):
            # a segment deleted (retention, truncation) after the caller's snapshot of the log
            return OffsetOutOfRangeError(f"{operation} on log {self.dir}: the segment was deleted meanwhile")
        if is_resource_exhaustion(exc):
            note_resource_exhaustion(str(self.dir), operation, exc)
            return ResourceExhaustedError(f"{operation} on log {self.dir} failed for lack of resources: {exc}")
        self.failed = True
        log.error("log_io_error", dir=str(self.dir), operation=operation, error=str(exc))
        if self._io_error_handler is not None:
            try:
                self._io_error_handler(self.dir, exc)
            except Exception:  # the handler's failure must not hide the I/O error
                log.exception("io_error_handler_failed", dir=str(self.dir))
        return StorageError(f"I/O error during {operation} on log {self.dir}: {exc}")

    # -- appending and rolling ---------------------------------------------------------------------

    def should_roll(self, append_bytes: int, last_offset: int, max_timestamp: int, now_ms: int) -> bool:
        """Whether the active segment must roll before an append (Kafka's maybeRoll check)."""
        cfg = self.config
        max_segment_ms = cfg.max_segment_ms
        jitter = self.roll_jitter_ms
        segment_ms = max_segment_ms - (jitter if jitter < max_segment_ms else max_segment_ms - 1)
        return self.segments[-1].should_roll(
            append_bytes, last_offset, max_timestamp, now_ms, cfg.segment_bytes, segment_ms
        )

    def append(self, data, spans: list[BatchSpan], last_offset: int) -> None:
        """Numbered batches onto the active segment; the log end offset follows."""
        self.segments[-1].append(data, spans, self.config.index_interval_bytes)
        self.leo = last_offset + 1

    def roll(self, now_ms: int) -> LogSegment:
        """A new active segment at the log end offset; returns it."""
        self.segments[-1].on_become_inactive()
        new = LogSegment.create(self.dir, self.leo, self.config.segment_index_bytes, now_ms)
        self.segments.append(new)
        self.bases.append(new.base_offset)
        self.roll_jitter_ms = self.new_roll_jitter()
        return new

    def new_roll_jitter(self) -> int:
        # Kafka's randomSegmentJitter: spreads the time-based rolls of partitions created together.
        jitter = self.config.segment_jitter_ms
        return random.randrange(min(jitter, self.config.segment_ms)) if jitter > 0 else 0

    # -- reading -----------------------------------------------------------------------------------

    def snapshot(self) -> tuple[list[LogSegment], list[int], list[int]]:
        """(segments, their sizes, their base offsets) for a read outside the lock: bytes appended
        after it are not read, and segments deleted after it stay readable until purged."""
        segments = list(self.segments)
        return segments, [s.size for s in segments], list(self.bases)

    def inactive_segments(self) -> list[SegmentInfo]:
        """Every segment but the active one, as the log cleaner plans with them."""
        return [SegmentInfo.of(seg, next_base) for seg, next_base in zip(self.segments[:-1], self.bases[1:])]

    def collect_aborted_transactions(self, start_offset: int, upper_offset: int) -> list[AbortedTxn]:
        """Kafka's LocalLog.collectAbortedTransactions: from the index of the segment holding
        start_offset on, until an entry's last stable offset shows no later one can overlap."""
        out: list[AbortedTxn] = []
        first = max(0, bisect_right(self.bases, start_offset) - 1)
        # Markers of transactions overlapping the range may lie in any later segment.
        for seg in self.segments[first:]:
            if seg.txn_index.collect(start_offset, upper_offset, out):
                break
        return out

    def batch_at_timestamp(self, timestamp: int, min_offset: int) -> tuple[bytes, BatchHeader] | None:
        """The first batch holding a record at or after `timestamp`, at or above `min_offset`: its
        bytes and header (time index, then a header walk), or None."""
        for seg in self.segments:
            if seg.max_timestamp < timestamp:
                continue
            hit = seg.find_batch_by_timestamp(timestamp, min_offset)
            if hit is not None:
                pos, header = hit
                return seg.read_batch(pos, header.size), header
        return None

    def batch_with_max_timestamp(self) -> tuple[int, int, tuple[bytes, BatchHeader] | None]:
        """(largest record timestamp, last offset of the batch carrying it, that batch's bytes and
        header if found); (-1, -1, None) if no segment holds a timestamp."""
        best = None
        for seg in self.segments:
            if seg.max_timestamp >= 0 and (best is None or seg.max_timestamp > best.max_timestamp):
                best = seg
        if best is None:
            return -1, -1, None
        hit = best.find_batch(best.offset_of_max_timestamp, best.size)
        if hit is None:
            return best.max_timestamp, best.offset_of_max_timestamp, None
        pos, header = hit
        return best.max_timestamp, best.offset_of_max_timestamp, (best.read_batch(pos, header.size), header)

    # -- truncation and deletion -------------------------------------------------------------------

    def truncate_to(self, offset: int, now_ms: int) -> None:
        """Drop every record at or after `offset`, which lies in [first base offset, log end)."""
        keep = bisect_right(self.bases, offset)
        for seg in self.segments[keep:]:
            self.schedule_delete(seg, now_ms, "truncation")
        del self.segments[keep:]
        del self.bases[keep:]
        active = self.segments[-1]
        active.truncate_to(offset)
        self.leo = active.next_offset
        self.recovery_point = min(self.recovery_point, self.leo)

    def truncate_fully(self, offset: int, now_ms: int) -> None:
        """Delete every segment and restart empty at `offset`."""
        for seg in self.segments:
            self.schedule_delete(seg, now_ms, "truncate fully")
        new = LogSegment.create(self.dir, offset, self.config.segment_index_bytes, now_ms)
        self.segments = [new]
        self.bases = [offset]
        self.leo = self.recovery_point = offset

    def deletable_count(self, predicate: Predicate, high_watermark: int) -> int:
        """How many segments, oldest first, `predicate(segment, next base or None for the last)`
        holds for (Kafka's LocalLog.deletableSegments), each ending at or below the high watermark
        (UnifiedLog.deleteOldSegments: the log start never passes it). The active segment counts
        too, unless it is empty: an empty last segment is never deleted and re-created."""
        segments, bases = self.segments, self.bases
        last = len(segments) - 1
        n = 0
        for i, seg in enumerate(segments):
            next_base = bases[i + 1] if i < last else None
            end = self.leo if next_base is None else next_base
            if end > high_watermark or (i == last and seg.size == 0) or not predicate(seg, next_base):
                break
            n += 1
        return n

    def delete_oldest(self, n: int, now_ms: int, reason: str) -> None:
        """Delete the `n` oldest segments; the caller has rolled first if that is all of them."""
        assert n < len(self.segments), "a log always keeps one segment"
        for seg in self.segments[:n]:
            self.schedule_delete(seg, now_ms, reason)
        del self.segments[:n]
        del self.bases[:n]

    def schedule_delete(self, seg: LogSegment, now_ms: int, reason: str) -> None:
        seg.rename_to_deleted()
        self.pending_deletes = [*self.pending_deletes, (now_ms + self.config.file_delete_delay_ms, seg)]
        log.info("segment_deleted", dir=str(self.dir), base_offset=seg.base_offset, size=seg.size, reason=reason)

    def purge_deleted(self, now_ms: int) -> None:
        """Delete the files of segments deleted more than file.delete.delay.ms ago."""
        still_pending = []
        for due, seg in self.pending_deletes:
            if due <= now_ms:
                seg.delete_files()
            else:
                still_pending.append((due, seg))
        self.pending_deletes = still_pending or ()

    def replace_with_cleaned(self, old: list[SegmentInfo], now_ms: int) -> bool:
        """Kafka's LocalLog.replaceSegments: the cleaned segment written for the run of inactive
        segments `old` takes their place, if they are still exactly this log's (retention or
        truncation may have got there first); otherwise its files are deleted and False returned."""
        segments = self.segments
        first = next((i for i, seg in enumerate(segments) if seg is old[0].segment), -1)
        current = (
            first >= 0
            and first + len(old) < len(segments)  # never the active segment
            and all(info.still_current(seg) for info, seg in zip(old, segments[first:]))
        )
        if not current:
            discard_cleaned(self.dir, old[0].base_offset)
            return False
        new = swap_in_cleaned(
            self.dir,
            [info.segment for info in old],
            self.config,
            lambda seg: self.schedule_delete(seg, now_ms, "replaced by its cleaned segment"),
            now_ms,
        )
        segments[first : first + len(old)] = [new]
        self.bases[first : first + len(old)] = [new.base_offset]
        return True

    # -- flushing and closing ----------------------------------------------------------------------

    def unflushed_segments(self, up_to: int) -> list[LogSegment]:
        """The segments holding offsets in [recovery point, up_to)."""
        ends = self.bases[1:] + [self.leo]
        point = self.recovery_point
        return [s for s, end in zip(self.segments, ends) if s.base_offset < up_to and end > point]

    def sync(self, segments: list[LogSegment], files: Sequence[str | Path]) -> None:
        """fsync `segments` (picked under the lock; synced outside it) and files written unsynced."""
        for seg in segments:
            seg.flush()
        for path in files:
            fsync_file(path)  # gone if a truncation deleted it meanwhile: nothing to sync then

    def take_unsynced_files(self) -> list[str]:
        files, self.unsynced_files = self.unsynced_files, ()
        return list(files)

    def add_unsynced_file(self, path: str) -> None:
        self.unsynced_files = [*self.unsynced_files, path]

    def close_files(self) -> None:
        for seg in self.segments:
            seg.close_files()
        for _, seg in self.pending_deletes:
            seg.close_files()

    def delete_dir(self) -> None:
        """Remove the whole replica dir (its files closed first)."""
        # A background flush that passed its closed check may still rename its state file in
        # (it writes outside the lock): a file gone meanwhile must not stop rmtree, which gives
        # up at its first error otherwise, and one that appeared is removed by another pass.
        for attempt in range(3):
            try:
                shutil.rmtree(self.dir, onerror=_ignore_missing)
                return
            except OSError as exc:
                if exc.errno != errno.ENOTEMPTY or attempt == 2:
                    raise


def flush_in_background(flush: Callable[[int], None], offset: int, dir: Path) -> Future:
    """flush(offset) on the flush thread, timed; the future says when it is done."""
    return _background_flusher.submit(_timed_flush, flush, offset, dir)


def _timed_flush(flush: Callable[[int], None], offset: int, dir: Path) -> None:
    started = time.perf_counter()
    try:
        flush(offset)
        FLUSH_TIMES_MS.observe((time.perf_counter() - started) * 1000)
    except StorageError as exc:  # logged by io_failure when it is an I/O error; a closed log is fine
        log.debug("background_flush_skipped", dir=str(dir), error=str(exc))


def _ignore_missing(func, path, exc_info) -> None:
    if not issubclass(exc_info[0], FileNotFoundError):
        raise exc_info[1]


# Below this, a read is one pread and its bytes: a region's descriptor, index probes and sendfile
# cost more than copying a few pages (a caught-up consumer's record or two).
REGION_MIN_BYTES = 64 * 1024


def read_segments(
    segments: list[LogSegment],
    sizes: list[int],
    bases: list[int],
    offset: int,
    max_bytes: int,
    limit: int,
    min_one_batch: bool,
    regions: bool = False,
) -> tuple[list, int, int]:
    """Whole batches of a snapshot from the one holding `offset`, at most `max_bytes` (one whole
    batch anyway if min_one_batch), none reaching `limit`. Returns (bytes-like parts, their total
    size, the offset after the last batch returned or `offset` if none). With `regions`, a read of
    REGION_MIN_BYTES or more from one segment is a FileRegion (sent with os.sendfile)."""
    parts: list = []
    total = 0
    cursor = offset
    if cursor < limit:
        first = max(0, bisect_right(bases, cursor) - 1)
        for seg, end in zip(segments[first:], sizes[first:]):
            found = seg.find_batch(cursor, end)
            if found is None:
                continue
            got = None
            if regions and min(max_bytes - total, end - found[0]) >= REGION_MIN_BYTES:
                got = seg.region_from(found[0], end, max_bytes - total, limit)
            data, next_offset, reached_end = got if got is not None else seg.read_from(
                found[0], end, max_bytes - total, limit, min_one_batch and not parts
            )
            if len(data):
                parts.append(data)
                total += len(data)
                cursor = next_offset
            if not reached_end or cursor >= limit:
                break
    return parts, total, cursor


__all__ = ["FLUSH_TIMES_MS", "REGION_MIN_BYTES", "LocalLog", "flush_in_background", "read_segments"]
