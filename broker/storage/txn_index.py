"""Aborted-transaction index of one segment (`<base>.txnindex`, Kafka's TransactionIndex).

One entry per aborted transaction whose ABORT marker lies in the segment, in marker order.
A read_committed Fetch asks which aborted transactions overlap the range it returns, so the
consumer can drop their records. Entry layout (34 bytes, big-endian, Kafka's)::

    version int16 (0) | producer id int64 | first offset int64 | last offset int64 | last stable offset int64

`last offset` is the marker's offset; `last stable offset` is the LSO right after the marker
(the first offset of another producer's open transaction, else the marker's offset + 1): once it
reaches a fetch's upper bound, later segments cannot hold a transaction overlapping that fetch.

The file is created with its first entry (most segments never see an abort). It is fsynced with
its segment; a torn last entry (crash) is cut on load. Entries are kept in memory once read.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import structlog

from broker.storage.atomic_file import write_file
from broker.storage.file_cache import CachedFile

log = structlog.get_logger(__name__)

ENTRY = struct.Struct(">hqqqq")
ENTRY_SIZE = ENTRY.size  # 34
ENTRY_VERSION = 0


class AbortedTxn(NamedTuple):
    producer_id: int
    first_offset: int
    last_offset: int  # the ABORT marker's offset
    last_stable_offset: int


def collect_aborted(entries: Sequence[AbortedTxn], fetch_offset: int, upper_offset: int, out: list[AbortedTxn]) -> bool:
    """Append the entries overlapping [fetch_offset, upper_offset) to `out`. True when the search
    is complete: no later segment can hold an overlapping transaction (Kafka's collectAbortedTxns)."""
    for e in entries:
        if e.last_offset >= fetch_offset and e.first_offset < upper_offset:
            out.append(e)
        if e.last_stable_offset >= upper_offset:
            return True
    return False


class TransactionIndex:
    """Not thread-safe on its own: Log changes it under its lock."""

    __slots__ = ("file", "_entries")

    def __init__(self, path: Path | str) -> None:
        self.file = CachedFile(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)  # appends, through the FileCache
        # None: not read yet; none: the shared empty tuple (most segments have no aborted
        # transaction), not a list each
        self._entries: list[AbortedTxn] | tuple[()] | None = None

    @property
    def path(self) -> Path:
        return self.file.path

    @property
    def entries(self) -> Sequence[AbortedTxn]:
        if self._entries is None:
            self._entries = self._read()
        return self._entries

    def _read(self) -> list[AbortedTxn] | tuple[()]:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return ()
        whole = len(data) - len(data) % ENTRY_SIZE
        entries = []
        for pos in range(0, whole, ENTRY_SIZE):
            version, pid, first, last, lso = ENTRY.unpack_from(data, pos)
            if version != ENTRY_VERSION:
                whole = pos
                break
            entries.append(AbortedTxn(pid, first, last, lso))
        if whole != len(data):
            # A torn or unreadable tail (a crash mid-write): keep the whole entries before it.
            log.warning("txn_index_tail_cut", path=str(self.path), bytes_dropped=len(data) - whole)
            os.truncate(self.path, whole)
        return entries or ()

    def append(self, entry: AbortedTxn) -> None:
        entries = self.entries
        if entries and entry.last_offset <= entries[-1].last_offset:
            # Already indexed (markers only move forward): never let a stale entry break an append.
            log.warning("txn_index_entry_out_of_order", path=str(self.path), entry=entry, last=entries[-1])
            return
        data = ENTRY.pack(ENTRY_VERSION, *entry)
        with self.file.open() as fd:
            written = os.write(fd, data)
        if written != len(data):
            raise OSError(f"short write to {self.path}")
        self.file.dirty = True
        if isinstance(entries, list):
            entries.append(entry)
        else:
            self._entries = [entry]

    def collect(self, fetch_offset: int, upper_offset: int, out: list[AbortedTxn]) -> bool:
        return collect_aborted(self.entries, fetch_offset, upper_offset, out)

    def truncate_to(self, offset: int) -> None:
        """Drop the entries whose marker is at or after `offset`."""
        entries = self.entries
        keep = len(entries)
        while keep and entries[keep - 1].last_offset >= offset:
            keep -= 1
        if keep == len(entries):
            return
        self._entries = list(entries[:keep]) or ()
        if self.path.exists():
            os.truncate(self.path, keep * ENTRY_SIZE)
            self.file.dirty = True

    def reset(self) -> None:
        """Forget every entry (recovery rebuilds them)."""
        self.close()
        try:
            os.unlink(self.file.pathname)  # the name as str: a Path made per call costs more than the unlink
        except FileNotFoundError:
            pass
        self.file.dirty = False  # nothing left to sync (a sync would create the file again)
        self._entries = ()

    def flush(self) -> None:
        self.file.sync()

    def close(self) -> None:
        self.file.close()

    def rename(self, path: Path) -> None:
        if self.path.exists():
            self.file.rename(path)
        else:
            self.file.path = path

    def delete(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)
        self.file.dirty = False


def write_index_file(path: Path, entries: list[AbortedTxn]) -> None:
    """A whole index at once (the cleaner's `.cleaned` file), fsynced. Nothing written if empty."""
    if not entries:
        return
    write_file(path, b"".join(ENTRY.pack(ENTRY_VERSION, *e) for e in entries))


__all__ = ["ENTRY_SIZE", "AbortedTxn", "TransactionIndex", "collect_aborted", "write_index_file"]
