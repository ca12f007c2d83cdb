"""Crash-safe replacement of a run of segments by the one the log cleaner wrote for them (Kafka's
LogSegment swap: `.cleaned` -> `.swap` -> live names, and LogLoader's swap-file recovery).

Writing (CleanedSegmentWriter, by the cleaner, without the log's lock)
  `<base>.log.cleaned`, `<base>.index.cleaned`, `<base>.timeindex.cleaned` and, when the group had
  aborted transactions, `<base>.txnindex.cleaned`, all fsynced; `<base>` is the group's first
  segment's base offset.

Swapping in (swap_in_cleaned, under the log's lock, once the log checked the group is current)
  Rename the `.cleaned` files to `.swap`, the log file last (that rename commits the swap), fsync
  the dir; rename the old segments to `.deleted` (their descriptors opened first, so reads in
  flight keep reading the old files; purged after file.delete.delay.ms); rename the `.swap` files
  to their live names, the log first; fsync the dir.

Crash recovery (recover_cleaner_files, first thing a log's open does)
  Every `.cleaned` file is deleted (that swap never committed: the old segments are intact).
  Every `<base>.log.swap` committed: the segment files with a base offset in [base, end of the
  swap's last batch) are the group it replaces and are deleted, then its `.swap` files take their
  live names. An index `.swap` without its log `.swap` is deleted (the index is rebuilt if needed).
  So a crash at any point leaves either the old segments or the cleaned one for each group.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

import structlog

from broker.storage.atomic_file import fsync_dir, write_all
from broker.storage.config import LogConfig
from broker.storage.file_names import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIME_INDEX_SUFFIX,
    TXN_INDEX_SUFFIX,
    parse_segment_file_name,
    segment_file_name,
)
from broker.storage.index_file import OffsetIndex, TimeIndex
from broker.storage.segment import LogSegment, iter_headers
from broker.storage.txn_index import AbortedTxn, write_index_file

log = structlog.get_logger(__name__)

CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"

_WRITE_CHUNK = 1024 * 1024
_SEGMENT_SUFFIXES = (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX)


def _path(dir: Path, base: int, suffix: str, state: str = "") -> Path:
    return dir / (segment_file_name(base, suffix) + state)


def _rename(src: Path, dst: Path) -> None:
    os.rename(src, dst)


def discard_cleaned(dir: Path, base: int) -> None:
    """Delete a group's `.cleaned` files (an aborted or refused swap)."""
    for suffix in _SEGMENT_SUFFIXES:
        _path(dir, base, suffix, CLEANED_SUFFIX).unlink(missing_ok=True)


class CleanedSegmentWriter:
    """`<base>.log.cleaned` + its two indexes, built exactly as LogSegment builds a live segment
    (an index entry per index.interval.bytes, the max timestamp as the time index's last entry)."""

    def __init__(self, dir: Path, base: int, index_bytes: int, index_interval: int) -> None:
        self.dir = dir
        self.base = base
        self.index_interval = index_interval
        discard_cleaned(dir, base)  # a previous run's leftovers
        self.fd = os.open(_path(dir, base, LOG_SUFFIX, CLEANED_SUFFIX), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        self.offset_index = OffsetIndex(_path(dir, base, INDEX_SUFFIX, CLEANED_SUFFIX), base, index_bytes)
        self.time_index = TimeIndex(_path(dir, base, TIME_INDEX_SUFFIX, CLEANED_SUFFIX), base, index_bytes)
        self.offset_index.reset()
        self.time_index.reset()
        self.size = 0
        self.max_timestamp = -1
        self.offset_of_max_timestamp = -1
        self._since_index_entry = 0
        self._pending = bytearray()
        self._pending_at = 0

    def add(self, data, last_offset: int, max_timestamp: int) -> None:
        position = self.size
        if max_timestamp > self.max_timestamp:
            self.max_timestamp, self.offset_of_max_timestamp = max_timestamp, last_offset
        if self._since_index_entry > self.index_interval:
            self.offset_index.append(last_offset, position)
            self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp)
            self._since_index_entry = 0
        self._since_index_entry += len(data)
        self._pending += data
        self.size += len(data)
        if len(self._pending) >= _WRITE_CHUNK:
            self._write_pending()

    def _write_pending(self) -> None:
        write_all(self.fd, self._pending, self._pending_at)
        self._pending_at += len(self._pending)
        self._pending = bytearray()

    def finish(self) -> None:
        """Everything on disk and fsynced, descriptors closed."""
        self._write_pending()
        self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp, skip_full_check=True)
        os.fsync(self.fd)
        self.offset_index.flush()
        self.time_index.flush()
        self.close()

    def write_txn_index(self, entries: Iterable[AbortedTxn]) -> None:
        """`<base>.txnindex.cleaned`, from the group's aborted-transaction entries."""
        write_index_file(_path(self.dir, self.base, TXN_INDEX_SUFFIX, CLEANED_SUFFIX), list(entries))

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self.offset_index.close()
        self.time_index.close()

    def discard(self) -> None:
        self.close()
        discard_cleaned(self.dir, self.base)


def swap_in_cleaned(
    dir: Path,
    old: list[LogSegment],
    config: LogConfig,
    schedule_delete: Callable[[LogSegment], None],
    now_ms: int,
) -> LogSegment:
    """Replace `old` (a run of inactive segments) by the cleaned segment written for them. The
    caller holds the log's lock and has checked that `old` is current."""
    base = old[0].base_offset
    # 1. .cleaned -> .swap, the log file last: its rename commits the swap (see recovery).
    has_txn_index = _path(dir, base, TXN_INDEX_SUFFIX, CLEANED_SUFFIX).exists()
    for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX, LOG_SUFFIX):
        if suffix != TXN_INDEX_SUFFIX or has_txn_index:
            _rename(_path(dir, base, suffix, CLEANED_SUFFIX), _path(dir, base, suffix, SWAP_SUFFIX))
    fsync_dir(dir)
    # 2. The old segments go to .deleted. Their files rename through the FileCache, so a read that
    #    snapshotted them reopens them under the new name (or keeps the descriptor it has).
    for seg in old:
        schedule_delete(seg)
    # 3. .swap -> live names.
    for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX):
        if suffix != TXN_INDEX_SUFFIX or has_txn_index:
            _rename(_path(dir, base, suffix, SWAP_SUFFIX), _path(dir, base, suffix))
    fsync_dir(dir)
    seg = LogSegment.load(dir, base, config.segment_index_bytes, config.index_interval_bytes, now_ms)
    seg.close_files()  # inactive: reopened on demand
    return seg


def recover_cleaner_files(dir: Path) -> None:
    """Finish or undo a swap a crash interrupted (see the module docstring). Called when a log
    opens, before it looks at the segments."""
    swaps: dict[int, dict[str, Path]] = {}
    touched = False
    for path in list(dir.iterdir()):
        name = path.name
        if name.endswith(CLEANED_SUFFIX) or name.endswith(SWAP_SUFFIX):
            state = CLEANED_SUFFIX if name.endswith(CLEANED_SUFFIX) else SWAP_SUFFIX
            parsed = parse_segment_file_name(name[: -len(state)])
            if parsed is None or parsed.deleted:
                continue
            if state == CLEANED_SUFFIX:
                path.unlink(missing_ok=True)
                touched = True
                log.info("cleaned_file_discarded", path=str(path))
            else:
                swaps.setdefault(parsed.base_offset, {})[parsed.suffix] = path
    for base, files in sorted(swaps.items()):
        touched = True
        if LOG_SUFFIX not in files:
            for path in files.values():  # the swap never committed (or its log was already renamed)
                path.unlink(missing_ok=True)
            continue
        end = max(base + 1, _next_offset(files[LOG_SUFFIX], base))
        for path in list(dir.iterdir()):
            parsed = parse_segment_file_name(path.name)
            if parsed is not None and not parsed.deleted and base <= parsed.base_offset < end:
                path.unlink(missing_ok=True)
        for suffix, path in files.items():
            _rename(path, _path(dir, base, suffix))
        log.info("cleaned_segment_swap_completed", dir=str(dir), base_offset=base, end_offset=end)
    if touched:
        fsync_dir(dir)


def _next_offset(path: Path, base: int) -> int:
    fd = os.open(path, os.O_RDONLY)
    try:
        end = base
        for _, header in iter_headers(fd, 0, os.fstat(fd).st_size):
            end = header.last_offset + 1
        return end
    finally:
        os.close(fd)


__all__ = [
    "CLEANED_SUFFIX",
    "SWAP_SUFFIX",
    "CleanedSegmentWriter",
    "discard_cleaned",
    "recover_cleaner_files",
    "swap_in_cleaned",
]
