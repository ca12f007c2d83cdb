"""The process's budget of open segment and index files (`log.open.files.max`).

Every `.log`, `.index`, `.timeindex` and `.txnindex` file is a CachedFile: it names a path and
is opened on demand through the one FileCache, a bounded LRU of descriptors. Nothing else in
storage keeps a descriptor open between calls (checkpoint, snapshot and metadata files are opened,
written and closed), so a broker holds at most `capacity` storage descriptors however many
partitions and segments it has (Kafka keeps one channel per segment and opens indexes lazily,
which still grows with the partition count).

Rules the callers keep:
- A descriptor is used only inside `with f.open() as fd:`. While pinned so, eviction skips it:
  a reader never finds its descriptor closed (or reused for another file) under it. When every
  cached descriptor is pinned the cache briefly holds more than its capacity rather than fail.
- Renames go through CachedFile.rename (under the cache's lock), so a reopen after eviction finds
  the file under its new name (`.deleted`, `.swap`).
- Closing a descriptor drops no data: fsync works on the file, through any descriptor, so a
  flush after an eviction reopens the file and syncs what earlier descriptors wrote.
- On EMFILE/ENFILE the cache gives back its unpinned descriptors and tries once more, so running
  short of descriptors elsewhere in the process (sockets) costs cached files, not requests.
"""

from __future__ import annotations

import errno
import os
import resource
import threading
from collections import OrderedDict
from pathlib import Path

import structlog

from broker.storage.file_names import interned_parts

log = structlog.get_logger(__name__)

# Share of the process's RLIMIT_NOFILE that storage files may take by default; the rest is for
# client and replication sockets, SQLite, the metadata log and the interpreter itself.
DEFAULT_SHARE = 0.5
MIN_CAPACITY = 8
_OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE)


class FileGoneError(FileNotFoundError):
    """The file was deleted for good (a purged segment) and a late reader asked to reopen it."""


class CachedFile:
    """A file opened on demand through a FileCache. Not itself thread-safe for renames against
    deletes: Log serializes those under its lock; opens and pins may come from any thread."""

    # The path is kept as its dir and its name (file_names.interned_parts), not as a Path, which
    # holds its parsed parts too.
    __slots__ = ("_dir", "_name", "flags", "cache", "fd", "pins", "forgotten", "gone", "dirty")

    def __init__(self, path: Path | str, flags: int = os.O_RDWR, cache: FileCache | None = None) -> None:
        self.pathname = os.fspath(path)
        self.flags = flags
        self.cache = cache if cache is not None else FILE_CACHE
        self.fd: int | None = None
        self.pins = 0
        self.forgotten = False  # closed for good: close the descriptor when the last pin goes
        self.gone = False  # deleted: never reopened
        self.dirty = False  # written since the last sync(); the writer sets it

    @property
    def pathname(self) -> str:
        return self._dir + self._name

    @pathname.setter
    def pathname(self, value: str) -> None:
        self._dir, self._name = interned_parts(value)

    @property
    def path(self) -> Path:
        return Path(self.pathname)

    @path.setter
    def path(self, value: Path | str) -> None:
        self.pathname = os.fspath(value)

    def open(self) -> CachedFile:
        """`with f.open() as fd:` pins the descriptor for the block (a plain context manager, not
        a generator: every append and read enters a few of these)."""
        return self

    def __enter__(self) -> int:
        return self.cache.acquire(self)

    def __exit__(self, *exc: object) -> None:
        self.cache.release(self)

    def sync(self) -> None:
        """fsync the file if it was written since the last sync. A failed sync leaves it dirty, so
        the next flush tries again rather than move a recovery point past unsynced bytes."""
        if not self.dirty:
            return
        self.dirty = False  # before the sync: a write racing it marks the file again
        try:
            with self.open() as fd:
                os.fsync(fd)
        except BaseException:
            self.dirty = True
            raise

    def close(self) -> None:
        """Give the descriptor back (now, or when the last reader unpins it). A later open()
        opens the file again."""
        self.cache.close(self)

    def rename(self, path: Path) -> None:
        self.cache.rename(self, path)

    def __repr__(self) -> str:
        return f"CachedFile({self._name}, fd={self.fd}, pins={self.pins})"


class FileCache:
    def __init__(self, capacity: int) -> None:
        self.capacity = max(MIN_CAPACITY, capacity)
        self._lock = threading.Lock()
        self._open: OrderedDict[CachedFile, None] = OrderedDict()  # least recently used first
        self.opens = 0  # descriptors opened since start (a cache miss each)
        self.evictions = 0
        self.shrinks = 0  # times EMFILE/ENFILE made it give back idle descriptors

    @property
    def open_count(self) -> int:
        return len(self._open)

    def set_capacity(self, capacity: int) -> None:
        with self._lock:
            self.capacity = max(MIN_CAPACITY, capacity)
            self._evict(len(self._open) - self.capacity)

    def acquire(self, f: CachedFile) -> int:
        with self._lock:
            return self._acquire(f)

    def release(self, f: CachedFile) -> None:
        with self._lock:
            self._release(f)

    def acquire_all(self, files: tuple[CachedFile, ...]) -> None:
        """acquire() each of `files` under one hold of the lock (an append pins its segment and
        both indexes), all or none: one that cannot open unpins those before it."""
        with self._lock:
            done = 0
            try:
                for f in files:
                    self._acquire(f)
                    done += 1
            except BaseException:
                for f in files[:done]:
                    self._release(f)
                raise

    def release_all(self, files: tuple[CachedFile, ...]) -> None:
        with self._lock:
            for f in files:
                self._release(f)

    def _acquire(self, f: CachedFile) -> int:
        fd = f.fd
        if fd is None:
            if f.gone:
                raise FileGoneError(f"{f.path} was deleted")
            self._evict(len(self._open) - self.capacity + 1)
            fd = f.fd = self._open_file(f)
            f.forgotten = False
            self.opens += 1
            self._open[f] = None
        else:
            self._open.move_to_end(f)
        f.pins += 1
        return fd

    def _release(self, f: CachedFile) -> None:
        f.pins -= 1
        if f.pins == 0 and f.forgotten:
            self._close(f)

    def close(self, f: CachedFile) -> None:
        with self._lock:
            if f.fd is None:
                return
            if f.pins:
                f.forgotten = True  # the last reader closes it
            else:
                self._close(f)

    def rename(self, f: CachedFile, path: Path) -> None:
        with self._lock:
            os.rename(f.pathname, path)
            f.path = path

    def close_all(self) -> None:
        with self._lock:
            for f in list(self._open):
                if f.pins == 0:
                    self._close(f)

    def _open_file(self, f: CachedFile) -> int:
        try:
            return os.open(f.pathname, f.flags, 0o644)
        except OSError as exc:
            if exc.errno not in _OUT_OF_DESCRIPTORS or not self._evict(len(self._open) // 2 or 1):
                raise
            self.shrinks += 1  # counted, not logged: a failure after it is (rate-limited, by Log)
            return os.open(f.pathname, f.flags, 0o644)

    def _evict(self, count: int) -> int:
        """Close up to `count` least recently used unpinned descriptors; returns how many."""
        if count <= 0:
            return 0
        victims = []
        for f in self._open:
            if f.pins == 0:
                victims.append(f)
                if len(victims) == count:
                    break
        for f in victims:
            self._close(f)
        self.evictions += len(victims)
        return len(victims)

    def _close(self, f: CachedFile) -> None:
        fd, f.fd = f.fd, None
        f.forgotten = False
        self._open.pop(f, None)
        if fd is not None:
            os.close(fd)


def default_capacity(share: float = DEFAULT_SHARE) -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    return max(MIN_CAPACITY, int(soft * share))


def raise_descriptor_limit() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit (what Kafka's docs tell operators to do by
    hand); returns (soft, hard) after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as exc:
            log.warning("descriptor_limit_not_raised", soft=soft, hard=hard, error=str(exc))
    return soft, hard


def configure(open_files_max: str | int | None) -> int:
    """Called once at broker start: raise the descriptor limit, then size the cache from
    `log.open.files.max` (default: DEFAULT_SHARE of the raised soft limit). Returns the capacity."""
    soft, hard = raise_descriptor_limit()
    capacity = int(open_files_max) if open_files_max not in (None, "") else default_capacity()
    FILE_CACHE.set_capacity(capacity)
    log.info("file_cache_configured", log_open_files_max=FILE_CACHE.capacity, nofile_soft=soft, nofile_hard=hard)
    return FILE_CACHE.capacity


# One per process: descriptors are a process-wide resource, and every log shares the budget.
FILE_CACHE = FileCache(default_capacity())

__all__ = ["FILE_CACHE", "CachedFile", "FileCache", "FileGoneError", "configure", "default_capacity", "raise_descriptor_limit"]
