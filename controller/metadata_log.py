"""The durable metadata log: `<log dir>/__cluster_metadata-0/<base offset, 20 digits>.log` segments
of Kafka record batches (magic 2, CRC32C), each record's value one framed metadata record.

One controller operation is one batch, so an operation is all or nothing on disk. An append is
written and fsynced (in a thread, never on the event loop) before the operation is acknowledged
and before Fetch can see it, so brokers never read records that a crash could take back.

With a Raft quorum the log may hold records not yet committed: a follower appends the leader's
batches as they came (`append_batches`) and cuts its tail where it diverged from the leader
(`truncate_to`); each batch carries its leader epoch, and the log keeps where each epoch starts
(Kafka's leader-epoch cache) to answer "where does epoch E end" (`end_offset_for_epoch`).

Recovery on open validates every batch (length, magic, CRC, contiguous offsets) and truncates
the log at the first bad one: a torn tail is an append whose fsync never finished, so it was
never acknowledged. An in-memory index (per segment: base offsets and file positions of every
batch) serves reads with two bisections. Snapshots roll the log to a new segment at the snapshot
offset, so truncating "before the snapshot" is deleting whole older segment files.
"""

from __future__ import annotations

import asyncio
import bisect
import functools
import os
import re
import time
from array import array
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import structlog

from metadata.image import METADATA_TOPIC
from metadata.records import encode_record
from protocol.errors import ProtocolError
from protocol.records import Record, encode_batch, iter_batches

log = structlog.get_logger(__name__)

T = TypeVar("T")
PARTITION_DIR = f"{METADATA_TOPIC}-0"
_SEGMENT_RE = re.compile(r"(\d{20})\.log")


class LogCorruption(Exception):
    """The log cannot be recovered automatically (a hole, not a torn tail)."""


class OffsetOutOfRange(Exception):
    """The offset is below the log start (moved to a snapshot) or past the log end."""


def segment_name(base_offset: int) -> str:
    return f"{base_offset:020d}.log"


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _serialized(fn: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
    """One change of the log at a time: an append works out its offsets from the log end before
    it writes, so a leader's append and a follower's (after a lost epoch) must not interleave."""

    @functools.wraps(fn)
    async def run(self: MetadataLog, *args: Any, **kwargs: Any) -> T:
        async with self._mutex:
            return await fn(self, *args, **kwargs)

    return run


class EpochCache:
    """Where each leader epoch starts in the log: [(epoch, start offset)], both increasing."""

    def __init__(self) -> None:
        self.entries: list[tuple[int, int]] = []

    def assign(self, epoch: int, offset: int) -> None:
        if not self.entries or epoch > self.entries[-1][0]:
            self.entries.append((epoch, offset))

    def truncate_from(self, offset: int) -> None:
        """Forget epochs that start at or after `offset` (the log was cut there)."""
        while self.entries and self.entries[-1][1] >= offset:
            self.entries.pop()

    def last_epoch(self) -> int:
        return self.entries[-1][0] if self.entries else 0

    def epoch_at(self, offset: int) -> int:
        """The epoch of the record at `offset` (0 if before every known epoch)."""
        i = bisect.bisect_right([o for _, o in self.entries], offset) - 1
        return self.entries[i][0] if i >= 0 else 0

    def end_offset_for(self, epoch: int, log_end: int) -> tuple[int, int]:
        """(the largest epoch <= `epoch`, the offset where it ends): Kafka's OffsetForLeaderEpoch
        answer; (-1, -1) if every known epoch is larger."""
        for i in range(len(self.entries) - 1, -1, -1):
            e, _ = self.entries[i]
            if e <= epoch:
                end = self.entries[i + 1][1] if i + 1 < len(self.entries) else log_end
                return e, end
        return -1, -1


class _Segment:
    __slots__ = ("base_offset", "end_offset", "path", "size", "bases", "positions")

    def __init__(self, base_offset: int, path: Path) -> None:
        self.base_offset = base_offset
        self.end_offset = base_offset  # next offset after the last batch
        self.path = path
        self.size = 0
        self.bases = array("q")
        self.positions = array("q")


class MetadataLog:
    def __init__(self, log_dir: Path) -> None:
        self.dir = log_dir / PARTITION_DIR
        self.epochs = EpochCache()
        self._segments: list[_Segment] = []
        self._start = 0
        self._fd: int | None = None
        # One writer thread keeps appends in order and off the loop; reads use the default pool.
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="metadata-log")
        self._appended = asyncio.Event()
        self._mutex = asyncio.Lock()

    # ---- state
    @property
    def start_offset(self) -> int:
        return self._start

    @property
    def end_offset(self) -> int:
        return self._segments[-1].end_offset if self._segments else self._start

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self._segments)

    @property
    def segment_offsets(self) -> list[int]:
        return [s.base_offset for s in self._segments]

    # ---- open and recovery (at start, before anything is served)
    @property
    def last_epoch(self) -> int:
        return self.epochs.last_epoch()

    def open(self, start_offset: int, start_epoch: int = 0) -> dict[str, Any]:
        """Recover the segments; `start_offset` is where the latest snapshot ends (0 if none),
        `start_epoch` the epoch of its last record. Returns facts for the start-up log line."""
        self.dir.mkdir(parents=True, exist_ok=True)
        self._start = start_offset
        self.epochs = EpochCache()
        if start_offset > 0 and start_epoch > 0:
            self.epochs.assign(start_epoch, 0)
        report: dict[str, Any] = {"truncated_bytes": 0, "deleted_segments": 0}
        for p in self.dir.glob("*.log.tmp"):
            p.unlink()
        found = sorted(
            (int(m.group(1)), p) for p in self.dir.iterdir() if (m := _SEGMENT_RE.fullmatch(p.name)) is not None
        )
        # Segments wholly below the snapshot are covered by it (a crash between writing the
        # snapshot and deleting them leaves them behind): drop them unread.
        while len(found) > 1 and found[1][0] <= start_offset:
            found.pop(0)[1].unlink()
            report["deleted_segments"] += 1
        segments: list[_Segment] = []
        for i, (base, path) in enumerate(found):
            seg = _Segment(base, path)
            if segments and base != segments[-1].end_offset and base > start_offset:
                raise LogCorruption(
                    f"metadata log segment {path.name} starts at {base} but the previous one ends at "
                    f"{segments[-1].end_offset}: records are missing"
                )
            torn = self._scan(seg, report)
            segments.append(seg)
            if torn:
                for _, later in found[i + 1 :]:
                    log.error("metadata_log_segment_deleted_after_corruption", segment=later.name)
                    later.unlink()
                    report["deleted_segments"] += 1
                break
        # A last segment that ends at or below the snapshot (the log lost its tail) is replaced.
        kept = []
        for seg in segments:
            if seg.base_offset < start_offset and seg.end_offset <= start_offset:
                seg.path.unlink()
                report["deleted_segments"] += 1
            else:
                kept.append(seg)
        segments = kept
        if segments and segments[0].base_offset > start_offset:
            raise LogCorruption(
                f"metadata log starts at offset {segments[0].base_offset} but the latest snapshot ends at "
                f"{start_offset}: records in between are missing"
            )
        for seg in segments:
            i = bisect.bisect_right(seg.bases, start_offset) - 1
            if seg.base_offset < start_offset and i >= 0 and seg.bases[i] < start_offset:
                nxt = seg.bases[i + 1] if i + 1 < len(seg.bases) else seg.end_offset
                if nxt > start_offset:
                    raise LogCorruption(
                        f"the metadata log batch at {seg.bases[i]} straddles the snapshot offset {start_offset}"
                    )
        if not segments:
            seg = _Segment(start_offset, self.dir / segment_name(start_offset))
            seg.path.touch()
            fsync_dir(self.dir)
            segments.append(seg)
        self._segments = segments
        self._fd = os.open(segments[-1].path, os.O_WRONLY | os.O_APPEND)
        report.update(start_offset=self.start_offset, end_offset=self.end_offset, segments=len(segments))
        return report

    def _scan(self, seg: _Segment, report: dict[str, Any]) -> bool:
        """Index one segment's batches; truncate it at the first invalid one. True if truncated."""
        data = seg.path.read_bytes()
        expected = seg.base_offset
        pos = 0
        problem = None
        try:
            for pos, h in iter_batches(data, check_crc=True, allow_partial_tail=False):
                if h.base_offset != expected or h.record_count < 1 or h.last_offset_delta != h.record_count - 1:
                    problem = (
                        f"batch at byte {pos} has offsets {h.base_offset}+{h.last_offset_delta}, expected {expected}"
                    )
                    break
                seg.bases.append(h.base_offset)
                seg.positions.append(pos)
                self.epochs.assign(h.partition_leader_epoch, h.base_offset)
                expected = h.last_offset + 1
                seg.size = pos + h.size
        except ProtocolError as e:
            problem = str(e)
        if problem is None and seg.size == len(data):
            seg.end_offset = expected
            return False
        seg.end_offset = expected
        cut = len(data) - seg.size
        # Only a torn tail is expected; anything else is logged loudly but handled the same way,
        # as Kafka does: the log ends at the last good batch.
        log.warning(
            "metadata_log_truncated",
            segment=seg.path.name,
            at_byte=seg.size,
            dropped_bytes=cut,
            reason=problem or "incomplete batch at the end",
        )
        with open(seg.path, "r+b") as f:
            f.truncate(seg.size)
            f.flush()
            os.fsync(f.fileno())
        report["truncated_bytes"] += cut
        return True

    def read_batches(self, from_offset: int) -> Iterator[bytes]:
        """Every whole batch at or after from_offset, from the files (start-up replay only)."""
        for seg in self._segments:
            if seg.end_offset <= from_offset or not seg.bases:
                continue
            data = seg.path.read_bytes()[: seg.size]
            for i, base in enumerate(seg.bases):
                if base < from_offset:
                    continue
                end = seg.positions[i + 1] if i + 1 < len(seg.positions) else seg.size
                yield data[seg.positions[i] : end]

    # ---- append
    @staticmethod
    def encode(records: list, base_offset: int, epoch: int) -> bytes:
        return encode_batch(
            [Record(value=encode_record(r)) for r in records],
            base_offset=base_offset,
            partition_leader_epoch=epoch,
            base_timestamp=int(time.time() * 1000),
        )

    @_serialized
    async def append(self, records: list, epoch: int) -> tuple[int, int]:
        """Write one batch holding `records` in leader epoch `epoch` and fsync it. Returns
        (base offset, bytes written). Any OSError is fatal to the caller: the file may now hold a
        torn batch."""
        if not records:
            raise ValueError("an append needs at least one record")
        base = self.end_offset
        data = self.encode(records, base, epoch)
        await asyncio.get_running_loop().run_in_executor(self._writer, self._write, data)
        self._index([(0, base, base + len(records), epoch)], data)
        return base, len(data)

    @_serialized
    async def append_control(self, record: Record, epoch: int) -> tuple[int, int]:
        """Write one control batch holding `record` (Raft's LEADER_CHANGE) in leader epoch
        `epoch` and fsync it, as `append` does. Returns (base offset, bytes written)."""
        base = self.end_offset
        data = encode_batch([record], base_offset=base, partition_leader_epoch=epoch, control=True,
                            base_timestamp=record.timestamp if record.timestamp >= 0 else None)
        await asyncio.get_running_loop().run_in_executor(self._writer, self._write, data)
        self._index([(0, base, base + 1, epoch)], data)
        return base, len(data)

    @_serialized
    async def append_batches(self, data: bytes) -> int:
        """A follower's append of the leader's batches as they came: every batch is checked
        (CRC, offsets following on from the log end) before anything is written. Returns the
        new log end. Raises ProtocolError for bad batches, OSError for a failed write."""
        expected = self.end_offset
        found = []
        size = 0
        for pos, h in iter_batches(data, check_crc=True, allow_partial_tail=True):
            if h.base_offset != expected or h.record_count < 1 or h.last_offset_delta != h.record_count - 1:
                raise ProtocolError(f"batch at {h.base_offset} does not follow the log end {expected}")
            found.append((pos, h.base_offset, h.last_offset + 1, h.partition_leader_epoch))
            expected = h.last_offset + 1
            size = pos + h.size
        if not found:
            return self.end_offset
        data = bytes(data[:size])
        await asyncio.get_running_loop().run_in_executor(self._writer, self._write, data)
        self._index(found, data)
        return self.end_offset

    def _index(self, batches: list[tuple[int, int, int, int]], data: bytes) -> None:
        """Record appended batches: (position in `data`, base offset, end offset, epoch)."""
        seg = self._segments[-1]
        for pos, base, end, epoch in batches:
            seg.bases.append(base)
            seg.positions.append(seg.size + pos)
            seg.end_offset = end
            self.epochs.assign(epoch, base)
        seg.size += len(data)
        self._notify()

    @_serialized
    async def truncate_to(self, offset: int) -> int:
        """Cut the log so it ends at the batch boundary at or below `offset` (a follower's
        uncommitted tail the leader does not have). Returns the new log end."""
        if offset >= self.end_offset:
            return self.end_offset
        offset = max(offset, self._start)
        doomed = []
        while len(self._segments) > 1 and self._segments[-1].base_offset >= offset:
            doomed.append(self._segments.pop().path)
        seg = self._segments[-1]
        # the first batch to drop: the one holding `offset` (cut at its start) or the next
        i = max(bisect.bisect_right(seg.bases, offset) - 1, 0)
        if i < len(seg.bases):
            seg.size = seg.positions[i]
            seg.end_offset = seg.bases[i]
            del seg.bases[i:]
            del seg.positions[i:]
        old_fd = self._fd
        self._fd = await asyncio.get_running_loop().run_in_executor(
            self._writer, self._cut, doomed, seg.path, seg.size, old_fd)
        self.epochs.truncate_from(seg.end_offset)
        log.warning("metadata_log_truncated_to", offset=seg.end_offset, deleted_segments=len(doomed))
        return seg.end_offset

    def _cut(self, doomed: list[Path], path: Path, size: int, old_fd: int | None) -> int:
        if old_fd is not None:
            os.close(old_fd)
        for p in doomed:
            p.unlink(missing_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        os.ftruncate(fd, size)
        os.fsync(fd)
        fsync_dir(self.dir)
        return fd

    @_serialized
    async def reset(self, start_offset: int, epoch: int) -> None:
        """Drop the whole log and start it empty at `start_offset` (a follower that loaded the
        leader's snapshot ending there, in `epoch`)."""
        doomed = [s.path for s in self._segments]
        seg = _Segment(start_offset, self.dir / segment_name(start_offset))
        old_fd = self._fd
        self._fd = await asyncio.get_running_loop().run_in_executor(
            self._writer, self._replace_all, doomed, seg.path, old_fd)
        self._segments = [seg]
        self._start = start_offset
        self.epochs = EpochCache()
        self.epochs.assign(epoch, start_offset)
        self._notify()

    def _replace_all(self, doomed: list[Path], path: Path, old_fd: int | None) -> int:
        if old_fd is not None:
            os.close(old_fd)
        for p in doomed:
            if p != path:
                p.unlink(missing_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_TRUNC, 0o644)
        os.fsync(fd)
        fsync_dir(self.dir)
        return fd

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        return self.epochs.end_offset_for(epoch, self.end_offset)

    def _write(self, data: bytes) -> None:
        assert self._fd is not None
        view = memoryview(data)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]
        os.fsync(self._fd)

    def _notify(self) -> None:
        ev, self._appended = self._appended, asyncio.Event()
        ev.set()

    async def wait_for_data(self, offset: int, timeout: float) -> None:
        """Return when the log end passes `offset`, or after `timeout` seconds (long poll)."""
        if self.end_offset > offset or timeout <= 0:
            return
        ev = self._appended
        try:
            await asyncio.wait_for(ev.wait(), timeout)
        except TimeoutError:
            pass

    # ---- read
    async def read(self, offset: int, max_bytes: int, upto: int | None = None) -> bytes:
        """Whole batches starting with the one holding `offset`, at most max_bytes unless the
        first batch alone is larger (it is returned whole, as Kafka does), none at or past
        `upto` (a batch boundary: the high watermark, for readers of committed records only)."""
        if offset < self._start or offset > self.end_offset:
            raise OffsetOutOfRange(offset)
        if offset == self.end_offset or (upto is not None and offset >= upto):
            return b""
        k = bisect.bisect_right([s.base_offset for s in self._segments], offset) - 1
        seg = self._segments[k]
        if offset >= seg.end_offset:  # an empty rolled segment sits at this offset
            seg = self._segments[k + 1]
        i = bisect.bisect_right(seg.bases, offset) - 1
        start = seg.positions[i]
        first_end = seg.positions[i + 1] if i + 1 < len(seg.positions) else seg.size
        limit = start + max(max_bytes, 0)
        if upto is not None and upto < seg.end_offset:
            j = bisect.bisect_left(seg.bases, upto)
            limit = min(limit, seg.positions[j]) if j < len(seg.positions) else limit
            first_end = min(first_end, seg.positions[j]) if j < len(seg.positions) else first_end
        if seg.size <= limit:
            end = seg.size
        else:
            j = bisect.bisect_right(seg.positions, limit) - 1
            end = max(seg.positions[j], first_end)
        path = seg.path
        try:
            return await asyncio.get_running_loop().run_in_executor(None, _pread, path, start, end - start)
        except FileNotFoundError:
            raise OffsetOutOfRange(offset) from None  # the segment went to a snapshot meanwhile

    # ---- roll and truncate (snapshots)
    @_serialized
    async def roll(self) -> None:
        """Start a new segment at the log end, so a snapshot there can drop whole files."""
        seg = self._segments[-1]
        if seg.end_offset == seg.base_offset:
            return
        new = _Segment(seg.end_offset, self.dir / segment_name(seg.end_offset))
        old_fd = self._fd
        self._fd = await asyncio.get_running_loop().run_in_executor(self._writer, self._create, new.path, old_fd)
        self._segments.append(new)

    def _create(self, path: Path, old_fd: int | None) -> int:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o644)
        fsync_dir(self.dir)
        if old_fd is not None:
            os.close(old_fd)
        return fd

    @_serialized
    async def truncate_before(self, offset: int) -> int:
        """Make `offset` the log start (a snapshot covers what is before it) and delete the
        segment files wholly below it. Returns how many files were deleted."""
        if offset <= self._start:
            return 0
        self._start = offset
        doomed = []
        while len(self._segments) > 1 and self._segments[0].end_offset <= offset:
            doomed.append(self._segments.pop(0).path)
        if doomed:
            await asyncio.get_running_loop().run_in_executor(self._writer, self._unlink, doomed)
        return len(doomed)

    def _unlink(self, paths: list[Path]) -> None:
        for p in paths:
            p.unlink(missing_ok=True)
        fsync_dir(self.dir)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._writer.shutdown(wait=True)


def _pread(path: Path, position: int, length: int) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        data = os.pread(fd, length, position)
    finally:
        os.close(fd)
    if len(data) != length:
        raise FileNotFoundError(f"{path} is shorter than its index")
    return data
