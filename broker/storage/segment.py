"""LogSegment: one `.log` file of whole record batches, with its `.index` and `.timeindex` (and a
`.txnindex` once an aborted transaction's marker lands in it).

The segment moves bytes and reads batch headers; it never decodes records. It is not thread-safe on
its own: Log serializes every change under its lock, and readers pass the file size they saw under
that lock, so they never look past bytes that were completely written.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

import structlog

from broker.storage.atomic_file import write_all
from broker.storage.file_cache import CachedFile
from broker.storage.file_names import (
    DELETED_SUFFIX,
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIME_INDEX_SUFFIX,
    TXN_INDEX_SUFFIX,
    segment_file_name,
)
from broker.storage.index_file import OffsetIndex, TimeIndex
from broker.storage.txn_index import TransactionIndex
from protocol.errors import ProtocolError
from protocol.file_region import FileRegion
from protocol.records.batch import BATCH_HEADER_SIZE, LOG_OVERHEAD, BatchHeader, iter_batches, read_header

log = structlog.get_logger(__name__)

INT32_MAX = 2**31 - 1
_HEADER_CHUNK = 16 * 1024  # header walks: about four index intervals per pread
# The newest small batches of the active segment stay in memory (TailBatch): a caught-up reader
# (a follower's next Fetch, a consumer at the end) finds and reads them with no index probe and
# no pread. Bounded per segment; a batch larger than TAIL_BATCH_MAX is never kept.
TAIL_BATCHES = 32
TAIL_BATCH_MAX = 16 * 1024
_RECOVERY_CHUNK = 1024 * 1024  # recovery hashes everything: big reads
_BATCH_LENGTH = struct.Struct(">i")

# (position in the appended buffer, last offset, max timestamp, size) of each batch being appended:
# computed by Log after it assigned offsets, so the segment need not parse headers again.
BatchSpan = tuple[int, int, int, int]


class TailBatch(NamedTuple):
    position: int
    base_offset: int
    last_offset: int
    data: bytes  # the batch as written to the file


class CorruptSegmentError(Exception):
    """Bytes in a segment that are not a valid batch where one must be."""

    def __init__(self, position: int, reason: str) -> None:
        super().__init__(f"{reason} (at byte {position})")
        self.position = position
        self.reason = reason


def header_at(buf, position: int, file_position: int) -> BatchHeader:
    """The header of a batch in trusted bytes; anything odd there is corruption of the file."""
    try:
        header = read_header(buf, position)
    except ProtocolError as exc:
        raise CorruptSegmentError(file_position, exc.reason) from None
    if header.size < BATCH_HEADER_SIZE:
        raise CorruptSegmentError(file_position, f"batch length {header.batch_length} is too small")
    return header


def iter_headers(fd: int, start: int, end: int) -> Iterator[tuple[int, BatchHeader]]:
    """Headers of the batches in [start, end), which must be trusted bytes (validated on append or
    by recovery). Bodies are skipped, so walking large batches reads little."""
    pos = start
    while end - pos >= BATCH_HEADER_SIZE:
        buf = os.pread(fd, min(_HEADER_CHUNK, end - pos), pos)
        off = 0
        while len(buf) - off >= BATCH_HEADER_SIZE:
            header = header_at(buf, off, pos + off)
            yield pos + off, header
            off += header.size
        if off == 0:
            return  # the file is shorter than it was: a concurrent truncation; nothing more to read
        pos += off


def iter_verified_batches(fd: int, start: int, end: int) -> Iterator[tuple[int, BatchHeader]]:
    """Batches in [start, end) with header and CRC32C checked, for recovery. Raises
    CorruptSegmentError at the first bad or incomplete batch (a torn tail ends that way)."""
    pos = start
    while pos < end:
        buf = os.pread(fd, min(_RECOVERY_CHUNK, end - pos), pos)
        consumed = 0
        try:
            for rel, header in iter_batches(buf, check_crc=True, allow_partial_tail=True):
                yield pos + rel, header
                consumed = rel + header.size
        except ProtocolError as exc:
            raise CorruptSegmentError(pos + (exc.offset or 0), exc.reason) from None
        if consumed == 0:
            # The first batch does not fit the chunk: either larger than the chunk, or torn.
            if len(buf) < LOG_OVERHEAD:
                raise CorruptSegmentError(pos, "incomplete batch header at the end of the segment")
            size = _BATCH_LENGTH.unpack_from(buf, 8)[0] + LOG_OVERHEAD
            if size < BATCH_HEADER_SIZE:
                raise CorruptSegmentError(pos, f"batch of {size} bytes is shorter than its header")
            if pos + size > end:
                raise CorruptSegmentError(pos, f"batch of {size} bytes runs past the end of the segment")
            whole = os.pread(fd, size, pos)
            try:
                for _, header in iter_batches(whole, check_crc=True):
                    yield pos, header
            except ProtocolError as exc:
                raise CorruptSegmentError(pos + (exc.offset or 0), exc.reason) from None
            consumed = size
        pos += consumed


class LogSegment:
    # slots: one segment (or more) for each of 20,000 partitions, no __dict__ each
    __slots__ = ("base_offset", "log_file", "offset_index", "time_index", "txn_index", "size", "_tail", "next_offset",
                 "max_timestamp", "offset_of_max_timestamp", "first_batch_timestamp", "created_ms",
                 "_bytes_since_index_entry")

    def __init__(self, dir: Path, base_offset: int, index_bytes: int, created_ms: int) -> None:
        self.base_offset = base_offset
        # Opened on use through the FileCache (log.open.files.max), active segment included. The
        # names are joined as str: four Paths parsed a segment were a fifth of opening 20,000 logs.
        d = os.fspath(dir) + os.sep
        self.log_file = CachedFile(d + segment_file_name(base_offset, LOG_SUFFIX))
        self.offset_index = OffsetIndex(d + segment_file_name(base_offset, INDEX_SUFFIX), base_offset, index_bytes)
        self.time_index = TimeIndex(d + segment_file_name(base_offset, TIME_INDEX_SUFFIX), base_offset, index_bytes)
        self.txn_index = TransactionIndex(d + segment_file_name(base_offset, TXN_INDEX_SUFFIX))
        self.size = 0
        self._tail: tuple[TailBatch, ...] = ()  # the newest small batches (TailBatch), in file order
        self.next_offset = base_offset  # one past the last offset held
        self.max_timestamp = -1
        self.offset_of_max_timestamp = -1  # last offset of the batch carrying max_timestamp
        self.first_batch_timestamp = -1  # segment.ms counts from here (Kafka's rolling base)
        self.created_ms = created_ms
        self._bytes_since_index_entry = 0

    # -- lifecycle -------------------------------------------------------------------------------

    @classmethod
    def create(cls, dir: Path, base_offset: int, index_bytes: int, now_ms: int) -> LogSegment:
        seg = cls(dir, base_offset, index_bytes, now_ms)
        os.close(os.open(seg.log_path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644))
        try:
            seg.offset_index.reset()
            seg.time_index.reset()
            seg.txn_index.reset()  # a leftover of an older segment with this base must not count
        except BaseException:
            # (out of descriptors, say) leave nothing behind that would make the retry's O_EXCL fail
            seg.delete_files()
            raise
        return seg

    @classmethod
    def load(cls, dir: Path, base_offset: int, index_bytes: int, index_interval: int, now_ms: int) -> LogSegment:
        """A segment whose bytes are trusted (below the recovery point, or after a clean shutdown).
        Indexes that are missing or fail the sanity check are rebuilt from the log. Raises
        CorruptSegmentError if the batches do not parse to the end of the file."""
        seg = cls(dir, base_offset, index_bytes, now_ms)
        try:
            seg.size = os.stat(seg.log_file.pathname).st_size
            problem = seg.offset_index.sanity_problem(seg.size) or seg.time_index.sanity_problem(seg.size)
            if problem is None and not (seg.offset_index.exists and seg.time_index.exists):
                problem = "index file missing"
            if problem is not None:
                log.warning("index_rebuilt", segment=str(seg.log_path), reason=problem)
                seg.rebuild_indexes(index_interval)
            else:
                seg._load_tail_state()
        except BaseException:
            seg.close_files()
            raise
        return seg

    @classmethod
    def open_for_recovery(cls, dir: Path, base_offset: int, index_bytes: int, now_ms: int) -> LogSegment:
        seg = cls(dir, base_offset, index_bytes, now_ms)
        seg.size = os.stat(seg.log_file.pathname).st_size
        return seg

    @property
    def log_path(self) -> Path:
        return self.log_file.path

    def close_files(self) -> None:
        """Give back the descriptors (they reopen on use)."""
        self.log_file.close()
        self.offset_index.close()
        self.time_index.close()
        self.txn_index.close()

    def flush(self) -> None:
        self.log_file.sync()
        self.offset_index.flush()
        self.time_index.flush()
        self.txn_index.flush()

    def rename_to_deleted(self) -> None:
        """First step of a delete: readers holding the descriptors keep working until the purge."""
        for path, rename in (
            (self.log_path, self.log_file.rename),
            (self.offset_index.path, self.offset_index.rename),
            (self.time_index.path, self.time_index.rename),
        ):
            if path.exists():
                rename(path.with_name(path.name + DELETED_SUFFIX))
        # Always: a later segment with this base must never share the deleted one's entries.
        self.txn_index.rename(self.txn_index.path.with_name(self.txn_index.path.name + DELETED_SUFFIX))

    def delete_files(self) -> None:
        # A read that snapshotted this segment before it went finds it gone, not a disk fault.
        for f in (self.log_file, self.offset_index.file, self.time_index.file, self.txn_index.file):
            f.gone = True
        self.close_files()
        for path in (self.log_path, self.offset_index.path, self.time_index.path, self.txn_index.path):
            path.unlink(missing_ok=True)

    # -- state -----------------------------------------------------------------------------------

    def largest_timestamp(self) -> int:
        """What retention.ms measures: the newest record timestamp, or the file's mtime if the
        segment holds no timestamps."""
        if self.max_timestamp >= 0:
            return self.max_timestamp
        return int(os.stat(self.log_path).st_mtime * 1000)

    def should_roll(
        self,
        append_bytes: int,
        last_offset: int,
        max_timestamp: int,
        now_ms: int,
        segment_bytes: int,
        segment_ms: int,
    ) -> bool:
        """Kafka's LogSegment.shouldRoll. `segment_ms` already has this segment's jitter taken off;
        `max_timestamp` is the largest timestamp of the batches being appended."""
        if self.size == 0:
            return False  # a new segment would get this one's name; an empty segment takes anything
        # Time is measured in record time (the appended batches' max timestamp against the first
        # batch's), so a backfill of old records does not roll on every append; only a segment
        # without timestamps falls back to the wall clock since its creation.
        if self.first_batch_timestamp >= 0:
            waited = max_timestamp - self.first_batch_timestamp
        else:
            waited = now_ms - self.created_ms
        return (
            self.size + append_bytes > segment_bytes
            or waited > segment_ms
            or self.offset_index.is_full
            or self.time_index.is_full
            or last_offset - self.base_offset > INT32_MAX  # relative offsets are int32 in the index
        )

    def on_become_inactive(self) -> None:
        """Record the segment's max timestamp in the time index, so a restart knows it without a scan."""
        self._tail = ()
        self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp, skip_full_check=True)

    def _track_batch(self, position: int, last_offset: int, max_timestamp: int, size: int, index_interval: int) -> None:
        if max_timestamp > self.max_timestamp:
            self.max_timestamp = max_timestamp
            self.offset_of_max_timestamp = last_offset
        if position == 0:
            self.first_batch_timestamp = max_timestamp
        if self._bytes_since_index_entry > index_interval:
            self.offset_index.append(last_offset, position)
            self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp)
            self._bytes_since_index_entry = 0
        self._bytes_since_index_entry += size
        self.next_offset = last_offset + 1

    def _reset_state(self) -> None:
        self.next_offset = self.base_offset
        self.max_timestamp = -1
        self.offset_of_max_timestamp = -1
        self.first_batch_timestamp = -1
        self._bytes_since_index_entry = 0

    def _load_tail_state(self) -> None:
        """next offset, max timestamp and index spacing from the indexes plus a walk of the batches
        after the last offset-index entry (Kafka reads the next offset the same way)."""
        self._reset_state()
        last_time = self.time_index.last_timestamp_offset()
        if last_time is not None:
            self.max_timestamp, self.offset_of_max_timestamp = last_time
        last_entry = self.offset_index.last_entry()
        start = last_entry[1] if last_entry is not None else 0
        end = start
        with self.log_file.open() as fd:
            for pos, header in iter_headers(fd, start, self.size):
                if header.max_timestamp > self.max_timestamp:
                    self.max_timestamp = header.max_timestamp
                    self.offset_of_max_timestamp = header.last_offset
                self.next_offset = header.last_offset + 1
                if pos == 0:
                    self.first_batch_timestamp = header.max_timestamp
                end = pos + header.size
            self._check_ends_at(end)
            if start > 0 and self.size > 0:
                self.first_batch_timestamp = header_at(os.pread(fd, BATCH_HEADER_SIZE, 0), 0, 0).max_timestamp
        self._bytes_since_index_entry = self.size - start

    # -- writing ---------------------------------------------------------------------------------

    def append(self, data, spans: Sequence[BatchSpan], index_interval: int) -> None:
        start = self.size
        # All three descriptors first: running out of them must fail the append before a byte is
        # written, never between the data and its index entries.
        log_file = self.log_file
        files = (log_file, self.offset_index.file, self.time_index.file)
        cache = log_file.cache
        cache.acquire_all(files)
        try:
            fd = log_file.fd
            assert fd is not None  # pinned
            try:
                write_all(fd, data, start)
            except OSError:
                try:  # leave no half batch behind for the next append to build on
                    os.ftruncate(fd, start)
                except OSError:
                    pass
                raise
            log_file.dirty = True
            for rel, last_offset, max_timestamp, size in spans:
                self._track_batch(start + rel, last_offset, max_timestamp, size, index_interval)
            view = memoryview(data)
            self._keep_tail(view, start, spans)
            self.size = start + len(view)
        finally:
            cache.release_all(files)

    def _keep_tail(self, view: memoryview, start: int, spans: Sequence[BatchSpan]) -> None:
        # A new tuple each time, swapped in whole: readers on other threads see one or the other.
        tail = list(self._tail)
        for rel, last_offset, _, size in spans:
            if size > TAIL_BATCH_MAX:
                tail.clear()  # the kept batches must stay contiguous up to the segment's end
                continue
            data = bytes(view[rel : rel + size])
            tail.append(TailBatch(start + rel, int.from_bytes(data[:8], "big", signed=True), last_offset, data))
        self._tail = tuple(tail[-TAIL_BATCHES:])

    def rebuild_indexes(self, index_interval: int) -> None:
        """Indexes from the batch headers (trusted bytes; recovery uses recover() instead)."""
        self.offset_index.reset()
        self.time_index.reset()
        self._reset_state()
        end = 0
        with self.log_file.open() as fd:
            for pos, header in iter_headers(fd, 0, self.size):
                self._track_batch(pos, header.last_offset, header.max_timestamp, header.size, index_interval)
                end = pos + header.size
        self._check_ends_at(end)

    def _check_ends_at(self, end: int) -> None:
        # Trusted bytes must end exactly with a whole batch; otherwise the next append would land
        # after junk, so the caller recovers the segment instead.
        if end != self.size:
            raise CorruptSegmentError(
                min(end, self.size), f"the last batch does not end at the file's end ({self.size})"
            )

    def recover(self, index_interval: int, on_batch: Callable[[BatchHeader], None] | None = None) -> int:
        """Validate every batch (header, CRC32C, increasing offsets), rebuild both indexes, and cut
        the file after the last whole valid batch. Returns the number of bytes cut."""
        self.offset_index.rewrite_start()
        self.time_index.rewrite_start()
        self._reset_state()
        with self.log_file.open() as fd:
            # Whatever a crashed process wrote may still sit in the page cache only: the caller's flush
            # must fsync it before the recovery point moves past it.
            self.log_file.dirty = True
            valid_end = 0
            expected = self.base_offset
            try:
                for pos, header in iter_verified_batches(fd, 0, self.size):
                    if header.base_offset < expected or header.last_offset_delta < 0:
                        raise CorruptSegmentError(
                            pos, f"batch offsets [{header.base_offset}, {header.last_offset}] are below {expected}"
                        )
                    if header.last_offset - self.base_offset > INT32_MAX:
                        raise CorruptSegmentError(pos, "batch offset too far from the segment's base offset")
                    self._track_batch(pos, header.last_offset, header.max_timestamp, header.size, index_interval)
                    if on_batch is not None:
                        on_batch(header)
                    valid_end = pos + header.size
                    expected = header.last_offset + 1
            except CorruptSegmentError as exc:
                log.warning(
                    "segment_corrupt_tail",
                    segment=str(self.log_path),
                    position=exc.position,
                    reason=exc.reason,
                    bytes_dropped=self.size - valid_end,
                )
            truncated = self.size - valid_end
            if truncated:
                os.ftruncate(fd, valid_end)
                self.size = valid_end
                self.log_file.dirty = True
        self.offset_index.rewrite_end()
        self.time_index.rewrite_end()
        return truncated

    def truncate_to(self, offset: int) -> bool:
        """Drop every batch whose last offset is >= `offset` (a batch straddling it goes whole).
        Afterwards next_offset is `offset`, or the straddling batch's base offset. False if nothing
        in this segment was at or after `offset`."""
        found = self.find_batch(offset, self.size)
        if found is None:
            return False
        self._tail = ()
        position, header = found
        with self.log_file.open() as fd:
            os.ftruncate(fd, position)
        self.log_file.dirty = True
        self.size = position
        new_next = min(offset, header.base_offset)
        self.offset_index.truncate_to_position(position)
        self.time_index.truncate_to_offset(new_next)
        self.txn_index.truncate_to(new_next)
        self._load_tail_state()
        self.next_offset = new_next  # >= what the kept batches end at; a gap below `offset` stays a gap
        return True

    # -- reading ---------------------------------------------------------------------------------

    def find_batch(self, offset: int, end: int) -> tuple[int, BatchHeader] | None:
        """(position, header) of the first batch in [0, end) whose last offset is >= `offset`."""
        tail = self._tail
        if tail and offset >= tail[0].base_offset:  # every batch before the kept ones ends below `offset`
            # from the newest back: a caught-up reader asks for the last batch or none
            i = len(tail)
            while i and tail[i - 1].last_offset >= offset:
                i -= 1
            if i == len(tail):
                return None
            t = tail[i]
            return (t.position, header_at(t.data, 0, t.position)) if t.position + len(t.data) <= end else None
        start = self.offset_index.lookup(offset)
        with self.log_file.open() as fd:
            for pos, header in iter_headers(fd, start, end):
                if header.last_offset >= offset:
                    return pos, header
        return None

    def find_batch_by_timestamp(self, timestamp: int, min_offset: int) -> tuple[int, BatchHeader] | None:
        """First batch with max timestamp >= `timestamp` and last offset >= `min_offset`."""
        before = self.time_index.last_before(timestamp)
        start_offset = max(before[1], min_offset) if before is not None else min_offset
        start = self.offset_index.lookup(start_offset)
        with self.log_file.open() as fd:
            for pos, header in iter_headers(fd, start, self.size):
                if header.last_offset >= min_offset and header.max_timestamp >= timestamp:
                    return pos, header
        return None

    def read_batch(self, position: int, size: int) -> bytes:
        with self.log_file.open() as fd:
            return os.pread(fd, size, position)

    def iter_headers(self, start: int, end: int) -> Iterator[tuple[int, BatchHeader]]:
        """iter_headers over this segment, its file held open (pinned) until the walk ends."""
        with self.log_file.open() as fd:
            yield from iter_headers(fd, start, end)

    def read_from(
        self, position: int, end: int, max_bytes: int, limit_offset: int, min_one_batch: bool
    ) -> tuple[bytes | memoryview, int, bool]:
        """Whole batches starting at `position` (a batch start), in one pread: at most `max_bytes`
        (or the first whole batch anyway, with min_one_batch), and none whose last offset reaches
        `limit_offset`. Returns (bytes, next offset after them, True if stopped by the segment's end)."""
        kept = self._read_tail(position, end, max_bytes, limit_offset, min_one_batch)
        if kept is not None:
            return kept
        with self.log_file.open() as fd:
            data = os.pread(fd, max(0, min(max_bytes, end - position)), position) if max_bytes > 0 else b""
            used = 0
            next_offset = -1
            limited = False
            while len(data) - used >= BATCH_HEADER_SIZE:
                header = header_at(data, used, position + used)
                if used + header.size > len(data):
                    break
                if header.last_offset >= limit_offset:
                    limited = True
                    break
                used += header.size
                next_offset = header.last_offset + 1
            if used == 0 and min_one_batch and not limited and end - position >= BATCH_HEADER_SIZE:
                head = os.pread(fd, BATCH_HEADER_SIZE, position)
                # A short read means a concurrent truncation removed the batch: then there is nothing to serve.
                first = header_at(head, 0, position) if len(head) == BATCH_HEADER_SIZE else None
                if first is not None and first.last_offset < limit_offset and position + first.size <= end:
                    whole = os.pread(fd, first.size, position)
                    if len(whole) == first.size:
                        data, used, next_offset = whole, first.size, first.last_offset + 1
        reached_end = not limited and position + used >= end
        if used == len(data):
            return data, next_offset, reached_end
        return memoryview(data)[:used], next_offset, reached_end

    def _read_tail(
        self, position: int, end: int, max_bytes: int, limit_offset: int, min_one_batch: bool
    ) -> tuple[bytes, int, bool] | None:
        """read_from's answer from the kept batches, or None when they do not start at `position`."""
        tail = self._tail
        if not tail or position < tail[0].position or max_bytes <= 0:
            return None
        i = len(tail) - 1  # from the newest back: a caught-up reader reads the last batch
        while tail[i].position > position:
            i -= 1
        if tail[i].position != position:
            return None
        out: list[bytes] = []
        used, next_offset, limited = 0, -1, False
        for t in tail[i:]:
            size = len(t.data)
            if t.position + size > end:
                break
            if t.last_offset >= limit_offset:
                limited = True
                break
            if used + size > max_bytes and not (min_one_batch and not out):
                break
            out.append(t.data)
            used += size
            next_offset = t.last_offset + 1
            if used >= max_bytes:
                break
        data = out[0] if len(out) == 1 else b"".join(out)
        return data, next_offset, not limited and position + used >= end

    def region_from(
        self, position: int, end: int, max_bytes: int, limit_offset: int
    ) -> tuple[FileRegion, int, bool] | None:
        """As read_from, for a large read: whole batches from `position` (a batch start) as a
        FileRegion for os.sendfile, their bytes never read here. The bounds (`max_bytes`, the
        `limit_offset` batches must stay below) are found through the offset index, then a short
        header walk from the indexed batch nearest to them, so a megabyte costs a few small preads
        instead of a copy. None when no whole batch fits (read_from's min-one-batch rule applies)."""
        cut = min(end, position + max_bytes)
        idx = self.offset_index
        # an indexed batch that ends at or before `cut` (the entry after it starts there or
        # earlier) and whose last offset is below the limit: the walk starts there
        k = idx.last_at_most(1, cut) - 1
        k = min(k, idx.last_at_most(0, limit_offset - self.base_offset, strict=True))
        start = idx.entry(k)[1] if k >= 0 else position
        if start < position:
            start = position
        used, next_offset = 0, -1
        with self.log_file.open() as fd:
            limited = False
            for pos, header in iter_headers(fd, start, end):
                if header.last_offset >= limit_offset:
                    limited = True
                    break
                if pos + header.size > cut:
                    break
                used, next_offset = pos + header.size - position, header.last_offset + 1
            if used == 0:
                return None
            if start > position and next_offset < 0:
                return None  # the walk found nothing past the indexed batch: read_from decides
            region = FileRegion(os.dup(fd), position, used)
        return region, next_offset, not limited and position + used >= end
