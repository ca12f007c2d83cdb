"""Moving a chunk replica between log dirs of one broker (KIP-113, "How to move replica
between log directories"): files only, no asyncio; the replication layer drives it.

A move copies the replica dir `<name>` of the source dir into `<name>.move` on the destination
while appends go on: each round copies what each file gained since the last round (segments
only grow at their end), with `os.copy_file_range` (in-kernel, page cache to page cache; the
bytes are never decoded). When little is left, the caller stops appends to the replica and
`finish` copies the rest: small files (indexes, checkpoints, snapshots) whole, segments from
where they were, after checking that the tail copied last time still matches (a follower that
truncated and appended other batches since gets that file copied again); files gone from the
source go from the copy; every file and the dir are fsynced. Then `swap` does KIP-113's two
renames: `<name>` -> `<name>.delete` on the source (removed later), `<name>.move` -> `<name>`.

Startup recovery (`recover_moves`) applies KIP-113's four startup rules:
1. `<name>` and `<name>.move` both on good dirs: the move starts again (the copy starts over).
2. `<name>.move` but no `<name>` on any good dir, and no dir offline: `<name>.move` -> `<name>`
   (a crash between the two renames; the copy was complete and synced before the first).
3. as 2 but a dir is offline: the replica is offline (its `<name>` may be on that dir);
   `<name>.move` is left alone.
4. `<name>.delete`: deleted (asynchronously).
"""

from __future__ import annotations

import errno
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from broker.storage.atomic_file import fsync_dir
from broker.storage.file_names import DELETE_SUFFIX, LOG_SUFFIX, MOVE_SUFFIX, parse_replica_dir_name

log = structlog.get_logger(__name__)

COPY_CHUNK = 8 << 20  # bytes per copy_file_range call: small enough for a smooth throttle
TAIL_CHECK = 64 << 10  # bytes of a segment's copied tail compared before it is trusted
SMALL_FILE = 1 << 20  # non-segment files up to this size are copied whole in the final step


class MoveStopped(Exception):
    """The move was cancelled (a newer move of the replica, "any", the replica went away)."""


class MoveThrottle:
    """The broker's log dir move rate: one token bucket shared by every move thread of the broker.
    `rate()` is read on each refill, so a changed rate applies within a fraction of a second."""

    def __init__(self, rate: Callable[[], int | None]) -> None:
        self.rate = rate
        self._lock = threading.Lock()
        self._tokens = 0.0
        self._last = time.monotonic()

    def chunk_size(self) -> int:
        """Bytes per copy call: about 1/20 s of the rate, so the copy is smooth, not bursty."""
        rate = self.rate()
        return COPY_CHUNK if rate is None else max(64 << 10, min(COPY_CHUNK, rate // 20))

    def acquire(self, nbytes: int, stopped: Callable[[], bool]) -> None:
        """Wait until `nbytes` may be copied (sleeping in slices of at most 0.1 s)."""
        while True:
            rate = self.rate()
            with self._lock:
                now = time.monotonic()
                if rate is None:
                    self._tokens, self._last = 0.0, now
                    return
                self._tokens = min(self._tokens + (now - self._last) * rate, rate / 10)  # 0.1 s of burst
                self._last = now
                if self._tokens >= 0:
                    self._tokens -= nbytes  # may go negative: the next callers wait it off
                    return
                wait = min(-self._tokens / rate, 0.1)
            if stopped():
                raise MoveStopped()
            time.sleep(wait)


@dataclass
class CopyState:
    """What a move copied so far (per file, bytes from the start)."""

    copied: dict[str, int] = field(default_factory=dict)
    stopped: bool = False

    @property
    def copied_bytes(self) -> int:
        return sum(n for name, n in self.copied.items() if name.endswith(LOG_SUFFIX))


def _files(path: Path) -> dict[str, int]:
    out = {}
    for entry in os.scandir(path):
        if entry.is_file(follow_symlinks=False):
            out[entry.name] = entry.stat(follow_symlinks=False).st_size
    return out


def segment_bytes(path: Path) -> int:
    """Bytes of the replica's segments (what DescribeLogDirs reports as its size)."""
    try:
        return sum(size for name, size in _files(path).items() if name.endswith(LOG_SUFFIX))
    except FileNotFoundError:
        return 0


def _copy_range(src: Path, dst: Path, start: int, end: int, throttle: MoveThrottle, state: CopyState) -> None:
    with open(src, "rb") as fin, open(dst, "r+b" if dst.exists() else "wb") as fout:
        fout.truncate(start)
        pos = start
        while pos < end:
            if state.stopped:
                raise MoveStopped()
            n = min(throttle.chunk_size(), end - pos)
            throttle.acquire(n, lambda: state.stopped)
            done = _copy_file_range(fin.fileno(), fout.fileno(), pos, n)
            if done == 0:
                break  # the source shrank meanwhile; the next round sees its new size
            pos += done
            state.copied[src.name] = pos


def _copy_file_range(fd_in: int, fd_out: int, pos: int, n: int) -> int:
    try:
        return os.copy_file_range(fd_in, fd_out, n, pos, pos)
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            raise  # a real I/O error; the others mean copy_file_range cannot serve this pair of files
    os.lseek(fd_out, pos, os.SEEK_SET)
    return os.sendfile(fd_out, fd_in, pos, n)


def copy_round(src: Path, dst: Path, throttle: MoveThrottle, state: CopyState) -> int:
    """Copy what every source file gained since the last round; returns the bytes copied."""
    dst.mkdir(parents=True, exist_ok=True)
    files = _files(src)
    before = sum(state.copied.values())
    for name, size in sorted(files.items()):
        have = state.copied.setdefault(name, 0)
        if size > have:
            try:
                _copy_range(src / name, dst / name, have, size, throttle, state)
            except FileNotFoundError:
                state.copied.pop(name, None)  # deleted by retention or a roll meanwhile
    return max(0, sum(state.copied.values()) - before)


def pending_bytes(src: Path, state: CopyState) -> int:
    try:
        files = _files(src)
    except FileNotFoundError:
        return 0
    return sum(max(0, size - state.copied.get(name, 0)) for name, size in files.items())


def _tail_matches(src: Path, dst: Path, upto: int) -> bool:
    start = max(0, upto - TAIL_CHECK)
    with open(src, "rb") as a, open(dst, "rb") as b:
        return os.pread(a.fileno(), upto - start, start) == os.pread(b.fileno(), upto - start, start)


def finish(src: Path, dst: Path, throttle: MoveThrottle, state: CopyState) -> None:
    """With appends stopped (and the source log closed): make `dst` an exact, synced copy."""
    files = _files(src)
    for name, size in sorted(files.items()):
        have = state.copied.get(name, 0)
        target = dst / name
        whole = (
            not name.endswith(LOG_SUFFIX)
            or not target.exists()
            or have > size
            or target.stat().st_size != have
            or (have and not _tail_matches(src / name, target, have))
        )
        if whole and name.endswith(LOG_SUFFIX) and target.exists():
            log.info("replica_move_recopy", file=name, reason="segment changed under the copy")
        _copy_range(src / name, target, 0 if whole else have, size, _UNTHROTTLED if size <= SMALL_FILE else throttle,
                    state)
        if target.stat().st_size != size:
            raise OSError(f"copy of {src / name} ended at {target.stat().st_size} bytes, not {size}")
    for name in set(_files(dst)) - set(files):
        (dst / name).unlink()
    for name in files:
        fd = os.open(dst / name, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    fsync_dir(dst)
    fsync_dir(dst.parent)


_UNTHROTTLED = MoveThrottle(lambda: None)


def move_dir(src: Path, dst_parent: Path) -> Path:
    """`<name>.move` on the destination dir for the replica dir `src`."""
    return dst_parent / (src.name + MOVE_SUFFIX)


def swap(src: Path, moved: Path) -> tuple[Path, Path]:
    """KIP-113's two renames; returns (the replica's new dir, the source's `.delete` dir). If
    the second rename fails, the first is undone so the source stays the one live copy."""
    deleting = src.with_name(src.name + DELETE_SUFFIX)
    final = moved.with_name(moved.name[: -len(MOVE_SUFFIX)])
    os.rename(src, deleting)
    fsync_dir(src.parent)
    try:
        os.rename(moved, final)
        fsync_dir(final.parent)
    except OSError:
        os.rename(deleting, src)
        fsync_dir(src.parent)
        raise
    return final, deleting


def remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


@dataclass
class MoveRecovery:
    """What startup found: moves to start again (rule 1), replicas offline (rule 3), dirs to delete (rule 4)."""

    resume: dict[tuple[str, int, int], Path] = field(default_factory=dict)  # key -> the `.move` dir
    offline: set[tuple[str, int, int]] = field(default_factory=set)
    delete: list[Path] = field(default_factory=list)


def recover_moves(online: list[Path], any_offline: bool) -> MoveRecovery:
    """Apply KIP-113's four startup rules to the online dirs (in that order of precedence)."""
    out = MoveRecovery()
    live: set[tuple[str, int, int]] = set()
    moving: dict[tuple[str, int, int], Path] = {}
    for d in online:
        try:
            entries = list(os.scandir(d))
        except OSError:
            continue
        for entry in entries:
            name = parse_replica_dir_name(entry.name)
            if name is None or not entry.is_dir(follow_symlinks=False):
                continue
            key = (name.topic, name.partition, name.chunk_start)
            if name.suffix == "":
                live.add(key)
            elif name.suffix == MOVE_SUFFIX:
                moving[key] = Path(entry.path)
            elif name.suffix == DELETE_SUFFIX:
                out.delete.append(Path(entry.path))
    for key, moved in moving.items():
        if key in live:
            out.resume[key] = moved
        elif any_offline:
            out.offline.add(key)
            log.warning("replica_move_left_alone", dir=str(moved), reason="no live copy on a good dir, a dir is offline")
        else:
            final = moved.with_name(moved.name[: -len(MOVE_SUFFIX)])
            os.rename(moved, final)
            fsync_dir(final.parent)
            log.info("replica_move_completed_on_startup", dir=str(final))
    return out
