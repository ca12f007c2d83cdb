"""LeaderEpochCache: which leader epoch started at which offset, for OffsetForLeaderEpoch and
follower truncation.

Persisted to `leader-epoch-checkpoint` in Kafka's text layout (version line, entry count, then
"epoch start_offset" lines), rewritten atomically. Without `defer_sync` every change is written
and fsynced at once. With it (what Log uses) a change only marks the file stale: sync() writes
and fsyncs it, and Log calls it in every flush before the recovery point moves and in close
(Kafka's KAFKA-15046 defers the fsync; we defer the write too): an entry lost in a crash belongs
to batches above the recovery point, and recovery derives it again from their headers, or to no
batch at all. A broker becoming leader of 20,000 partitions so writes no file on its event loop
(on ext4 a rename over an existing file costs ~1 ms: auto_da_alloc flushes the new file).
"""

from __future__ import annotations

import os
import threading
from bisect import bisect_left, bisect_right
from pathlib import Path

import structlog

from broker.storage.atomic_file import fsync_file, overwrite_in_place, read_ascii_file, write_atomically
from broker.storage.errors import StorageError
from broker.storage.file_names import interned_parts

log = structlog.get_logger(__name__)

VERSION = 0
UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1
# Keep two writers of one checkpoint in order; shared by stripes rather than one lock per log.
_WRITE_LOCKS = tuple(threading.Lock() for _ in range(64))


def epoch_end_in(entries: list[tuple[int, int]], epoch: int, log_end_offset: int) -> tuple[int, int]:
    """OffsetForLeaderEpoch over `entries` ((epoch, start offset), oldest first): see
    LeaderEpochCache.end_offset_for. Also the diskless coordinator's answer for a partition."""
    if epoch == UNDEFINED_EPOCH or not entries:
        return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
    if epoch == entries[-1][0]:
        return epoch, log_end_offset
    higher = bisect_right(entries, epoch, key=lambda e: e[0])
    if higher == len(entries):
        return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
    next_start = entries[higher][1]
    if higher == 0:
        return epoch, next_start
    return entries[higher - 1][0], next_start


# The replication layer asks end_offset_for() from the event loop while appends run in an
# executor; a lock keeps every answer consistent. One of these, by the cache's id, not one a cache
# (64 bytes for each of 20,000 logs); no method holds two caches' locks at once.
_LOCKS = tuple(threading.RLock() for _ in range(64))


class LeaderEpochCache:
    """Entries (epoch, start offset), both strictly increasing."""

    __slots__ = ("_dir", "_name", "_entries", "defer_sync", "_unsynced", "_unwritten", "_lock")

    def __init__(self, path: Path | str | None, entries: list[tuple[int, int]] | None = None) -> None:
        # None: kept in memory only (file_names.interned_parts: no whole path a log)
        self._dir, self._name = ("", "") if path is None else interned_parts(os.fspath(path))
        self._entries: list[tuple[int, int]] = list(entries or [])
        self.defer_sync = False
        self._unsynced = False  # written without fsync
        self._unwritten = False  # changed in memory only (defer_sync)
        self._lock = _LOCKS[id(self) >> 4 & 63]

    @property
    def path(self) -> str | None:
        return self._dir + self._name if self._name else None

    @classmethod
    def load(cls, path: Path | str) -> LeaderEpochCache:
        """Read the checkpoint; a missing file is an empty cache."""
        try:
            text = read_ascii_file(path)
        except (OSError, UnicodeDecodeError) as exc:
            raise StorageError(f"cannot read {path}: {exc}") from exc
        return cls(path) if text is None else cls(path, _parse_checkpoint(path, text))

    @property
    def entries(self) -> list[tuple[int, int]]:
        with self._lock:
            return list(self._entries)

    def latest_epoch(self) -> int:
        with self._lock:
            return self._entries[-1][0] if self._entries else UNDEFINED_EPOCH

    def latest_entry(self) -> tuple[int, int] | None:
        with self._lock:
            return self._entries[-1] if self._entries else None

    def epoch_for_offset(self, offset: int) -> int:
        """The epoch that wrote `offset` (the last entry starting at or before it), -1 if none."""
        with self._lock:
            i = bisect_right(self._entries, offset, key=lambda e: e[1])
            return self._entries[i - 1][0] if i else UNDEFINED_EPOCH

    def assign(self, epoch: int, start_offset: int) -> None:
        """Record that `epoch` starts at `start_offset`. A repeat of the latest epoch at a later
        offset is a no-op; an entry that conflicts with later ones (higher or equal epoch, or
        an equal or later start offset) replaces them, as a new leader's history wins."""
        if epoch < 0 or start_offset < 0:
            raise ValueError(f"leader epoch entry ({epoch}, {start_offset}) must be non-negative")
        with self._lock:
            if self._entries:
                last_epoch, last_start = self._entries[-1]
                if epoch == last_epoch and start_offset >= last_start:
                    return
                if epoch < last_epoch:
                    log.warning("leader_epoch_went_back", path=str(self.path), epoch=epoch, latest_epoch=last_epoch)
            kept = [e for e in self._entries if e[0] < epoch and e[1] < start_offset]
            kept.append((epoch, start_offset))
            self._replace(kept)

    def end_offset_for(self, epoch: int, log_end_offset: int) -> tuple[int, int]:
        """OffsetForLeaderEpoch: (largest known epoch <= `epoch`, start offset of the epoch after it,
        or the log end offset when `epoch` is the latest). An epoch older than every entry answers
        (epoch, first entry's start); an epoch newer than all, an undefined epoch or an empty cache
        answer (-1, -1)."""
        with self._lock:
            return epoch_end_in(self._entries, epoch, log_end_offset)

    def truncate_from_end(self, end_offset: int) -> None:
        """Forget epochs that start at or after `end_offset` (the log was truncated there)."""
        with self._lock:
            keep = bisect_left(self._entries, end_offset, key=lambda e: e[1])
            if keep < len(self._entries):
                self._replace(self._entries[:keep])

    def truncate_from_start(self, start_offset: int) -> None:
        """The log now starts at `start_offset`: drop epochs wholly before it, and move the epoch
        that covers it to start there."""
        with self._lock:
            first_after = bisect_right(self._entries, start_offset, key=lambda e: e[1])
            if first_after == 0:
                return
            covering_epoch, covering_start = self._entries[first_after - 1]
            if first_after == 1 and covering_start == start_offset:
                return
            self._replace([(covering_epoch, start_offset)] + self._entries[first_after:])

    def clear(self) -> None:
        with self._lock:
            if self._entries or (self.path is not None and not os.path.exists(self.path)):
                self._replace([])

    def _replace(self, entries: list[tuple[int, int]]) -> None:
        if self.path is not None and self.defer_sync:
            self._unwritten = True  # written by sync() or write(), before anything relies on it
        elif self.path is not None:
            # Write first: if the disk refuses, memory still matches what a restart would load.
            write_atomically(self.path, _format_checkpoint(entries), sync=True)
        self._entries = entries

    @property
    def unsynced(self) -> bool:
        """A change is not yet on disk (unwritten or not fsynced)."""
        return self._unsynced or self._unwritten

    def write(self, *, sync: bool = False, in_place: bool = False) -> None:
        """Write a deferred change; with `sync` also fsync it (and a write left unsynced). A
        broker's clean shutdown writes without, `in_place` (overwrite_in_place: the file's parser
        reads the entries its count line names and ignores a tail), and syncs the filesystem
        once afterwards; a crash before that sync can leave a torn file, which the log's open
        treats as unreadable (it recovers the log from its first segment)."""
        if self.path is None:
            return
        # The file is written outside the entries' lock (a follower's OffsetForLeaderEpoch never
        # waits on an fsync); the write lock keeps two writers from landing out of order.
        with _WRITE_LOCKS[(id(self) >> 4) % len(_WRITE_LOCKS)]:
            with self._lock:
                data = _format_checkpoint(self._entries) if self._unwritten else None
                self._unwritten = False
            try:
                if data is not None:
                    if in_place and not sync:
                        overwrite_in_place(self.path, data)
                    else:
                        write_atomically(self.path, data, sync=sync)
                    self._unsynced = not sync
                elif sync and self._unsynced:
                    fsync_file(self.path)
                    self._unsynced = False
            except BaseException:
                self._unwritten = self._unwritten or data is not None
                raise

    def sync(self) -> None:
        """Write and fsync a deferred change (the caller fsyncs the dir)."""
        self.write(sync=True)


def _format_checkpoint(entries: list[tuple[int, int]]) -> bytes:
    lines = [str(VERSION), str(len(entries))] + [f"{epoch} {offset}" for epoch, offset in entries]
    return ("\n".join(lines) + "\n").encode("ascii")


def _parse_checkpoint(path: Path | str, text: str) -> list[tuple[int, int]]:
    lines = [line.strip() for line in text.splitlines()]
    try:
        if lines[0] != str(VERSION):
            raise ValueError(f"unknown version {lines[0]!r}")
        count = int(lines[1])
        entries = []
        for line in lines[2 : 2 + count]:
            epoch, offset = line.split()
            entries.append((int(epoch), int(offset)))
        if len(entries) != count:
            raise ValueError(f"expected {count} entries, found {len(entries)}")
    except (IndexError, ValueError) as exc:
        raise StorageError(f"{path} is malformed: {exc}") from None
    for (e1, o1), (e2, o2) in zip(entries, entries[1:]):
        if not (e2 > e1 and o2 > o1):
            raise StorageError(f"{path} is malformed: entries not increasing at ({e1}, {o1}), ({e2}, {o2})")
    return entries
