"""IndexFile: an append-only file of fixed-size big-endian entries, searched with os.pread.

Layout choice (documented in broker/storage/__init__.py): entries are appended, never preallocated,
so the file length is exactly the number of valid entries and a clean file needs no trimming.
We search with pread instead of mmap (Kafka's choice) because a mapped file that another thread
truncates raises SIGBUS and kills the process, while pread past the end just returns fewer bytes;
the entries stay in the page cache, not in our heap, and no memory map outlives the descriptor
budget (the descriptor comes from the FileCache and may be closed between calls).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import ClassVar

from broker.storage.file_cache import CachedFile

# Below this many candidate entries, one pread of the whole range beats more probes.
_SCAN_WINDOW = 512


class IndexFile:
    ENTRY: ClassVar[struct.Struct]
    __slots__ = ("file", "base_offset", "max_index_bytes", "exists", "entries", "torn", "_last")  # two a segment

    def __init__(self, path: Path | str, base_offset: int, max_index_bytes: int) -> None:
        # Opened on use through the FileCache: a broker with many segments holds no fd for each.
        self.file = CachedFile(path, os.O_RDWR | os.O_CREAT)
        self.base_offset = base_offset
        self.max_index_bytes = max_index_bytes
        try:
            size = os.stat(path).st_size
            self.exists = True  # when opened (LogSegment.load rebuilds a missing index)
        except FileNotFoundError:
            size, self.exists = 0, False
        self.entries = size // self.ENTRY.size
        self.torn = size % self.ENTRY.size != 0  # a crash cut an entry: the file needs rebuilding
        self._last: tuple | None = None

    @property
    def path(self) -> Path:
        return self.file.path

    @property
    def max_entries(self) -> int:
        return self.max_index_bytes // self.ENTRY.size

    @property
    def is_full(self) -> bool:
        return self.entries >= self.max_entries

    @property
    def size_bytes(self) -> int:
        return self.entries * self.ENTRY.size

    def entry(self, i: int) -> tuple:
        with self.file.open() as fd:
            raw = os.pread(fd, self.ENTRY.size, i * self.ENTRY.size)
        if len(raw) != self.ENTRY.size:
            raise OSError(f"index {self.path} is shorter than its {self.entries} entries")
        return self.ENTRY.unpack(raw)

    def last_entry(self) -> tuple | None:
        if self.entries == 0:
            return None
        if self._last is None:
            self._last = self.entry(self.entries - 1)
        return self._last

    def _append_entry(self, *values: int) -> None:
        with self.file.open() as fd:
            os.pwrite(fd, self.ENTRY.pack(*values), self.entries * self.ENTRY.size)
        self.entries += 1
        self._last = values
        self.file.dirty = True

    def last_at_most(self, field: int, value: int, *, strict: bool = False) -> int:
        """Index of the last entry whose `field` is <= value (< value if strict), -1 if none.
        Every field we search on increases along the file."""
        lo, hi = 0, self.entries - 1
        found = -1
        if hi < 0:
            return found
        size = self.ENTRY.size
        with self.file.open() as fd:
            while hi - lo >= _SCAN_WINDOW:
                mid = (lo + hi) // 2
                raw = os.pread(fd, size, mid * size)
                if len(raw) != size:
                    raise OSError(f"index {self.path} is shorter than its {self.entries} entries")
                key = self.ENTRY.unpack(raw)[field]
                if key < value or (key == value and not strict):
                    found, lo = mid, mid + 1
                else:
                    hi = mid - 1
            if lo > hi:
                return found
            raw = os.pread(fd, (hi - lo + 1) * size, lo * size)
        # the rest of the search in the window read at once (a scan of up to 512 entries in
        # Python was most of a large Fetch's CPU: three searches a partition read)
        unpack = self.ENTRY.unpack_from
        a, b = 0, len(raw) // size - 1
        while a <= b:
            m = (a + b) // 2
            key = unpack(raw, m * size)[field]
            if key < value or (key == value and not strict):
                found, a = lo + m, m + 1
            else:
                b = m - 1
        return found

    def truncate_entries(self, count: int) -> None:
        """Keep the first `count` entries."""
        if count >= self.entries and not self.torn:
            return
        with self.file.open() as fd:
            os.ftruncate(fd, count * self.ENTRY.size)
        self.entries = count
        self.torn = False
        self._last = None
        self.file.dirty = True

    def reset(self) -> None:
        """Empty the index, creating the file if it is missing."""
        if self.entries == 0 and not self.torn and os.path.exists(self.file.pathname):
            return  # already empty: an ftruncate would still cost a journal write (recovery of 20,000 logs)
        with self.file.open() as fd:
            os.ftruncate(fd, 0)
        self.entries = 0
        self.torn = False
        self._last = None
        self.file.dirty = True

    def rewrite_start(self) -> None:
        """Begin rebuilding the entries over the file as it is (a recovery): they are written
        from the first on, and rewrite_end() cuts what is left past them. A recovered segment's
        index is usually rebuilt the same, and a truncate to zero first costs a journal commit
        on ext4 each (20,000 logs recovered after a kill -9). A crash in between leaves the
        segment above the recovery point, so the next start rebuilds it again."""
        self.entries = 0
        self.torn = False
        self._last = None

    def rewrite_end(self) -> None:
        """The file holds exactly the rebuilt entries (created if it was missing)."""
        want = self.entries * self.ENTRY.size
        with self.file.open() as fd:
            if os.fstat(fd).st_size != want:
                os.ftruncate(fd, want)
                self.file.dirty = True

    def flush(self) -> None:
        self.file.sync()

    def close(self) -> None:
        self.file.close()

    def rename(self, path: Path) -> None:
        self.file.rename(path)


class OffsetIndex(IndexFile):
    """`.index`: sparse map from offset to file position. Entry: int32 offset relative to the
    segment's base offset (the last offset of a batch) + int32 position of that batch."""

    __slots__ = ()

    ENTRY = struct.Struct(">ii")

    def append(self, offset: int, position: int) -> None:
        if self.is_full:
            return
        last = self.last_entry()
        if last is not None and (offset - self.base_offset <= last[0] or position <= last[1]):
            return  # keep both fields strictly increasing, which the searches rely on
        self._append_entry(offset - self.base_offset, position)

    def lookup(self, offset: int) -> int:
        """File position of a batch at or before the one holding `offset` (0 if none is indexed)."""
        i = self.last_at_most(0, offset - self.base_offset)
        return self.entry(i)[1] if i >= 0 else 0

    def truncate_to_position(self, position: int) -> None:
        """Drop entries of batches at or after `position`."""
        self.truncate_entries(self.last_at_most(1, position, strict=True) + 1)

    def sanity_problem(self, log_size: int) -> str | None:
        if self.torn:
            return "size is not a whole number of entries"
        last = self.last_entry()
        if last is not None and (last[0] < 0 or not 0 <= last[1] < log_size):
            return f"last entry {last} lies outside the segment (size {log_size})"
        return None


class TimeIndex(IndexFile):
    """`.timeindex`: sparse map from timestamp to offset. Entry: int64 largest timestamp so far +
    int32 relative offset of the batch (its last offset) that carried it. Timestamps strictly increase."""

    __slots__ = ()

    ENTRY = struct.Struct(">qi")

    def maybe_append(self, timestamp: int, offset: int, *, skip_full_check: bool = False) -> None:
        if timestamp < 0 or (self.is_full and not skip_full_check):
            return
        last = self.last_entry()
        if last is not None and (timestamp <= last[0] or offset - self.base_offset < last[1]):
            return
        self._append_entry(timestamp, offset - self.base_offset)

    def last_timestamp_offset(self) -> tuple[int, int] | None:
        last = self.last_entry()
        return (last[0], self.base_offset + last[1]) if last is not None else None

    def last_before(self, timestamp: int) -> tuple[int, int] | None:
        """The last entry with a timestamp strictly below `timestamp`: every batch up to its offset
        is older than `timestamp`, so a scan for it may start there."""
        i = self.last_at_most(0, timestamp, strict=True)
        if i < 0:
            return None
        ts, rel = self.entry(i)
        return ts, self.base_offset + rel

    def truncate_to_offset(self, offset: int) -> None:
        """Drop entries for offsets at or after `offset`."""
        self.truncate_entries(self.last_at_most(1, offset - self.base_offset, strict=True) + 1)

    def sanity_problem(self, log_size: int) -> str | None:
        if self.torn:
            return "size is not a whole number of entries"
        last = self.last_entry()
        if last is not None and last[1] < 0:
            return f"last entry {last} points before the segment"
        if self.entries and log_size == 0:
            return "entries for an empty segment"
        return None
