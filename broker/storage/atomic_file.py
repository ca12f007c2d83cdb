"""Small files replaced atomically: a crash leaves either the old or the new content, never a mix."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
from pathlib import Path

from broker.storage.file_names import TMP_SUFFIX


def fsync_dir(path: Path | str) -> None:
    """Make creates, renames and unlinks inside `path` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_syncfs = getattr(_libc, "syncfs", None)


def sync_filesystem(path: Path) -> None:
    """Make every write to the filesystem holding `path` durable: syncfs(2), one call instead of
    an fsync per file (where there is no syncfs, sync(2)). Raises OSError for a writeback error
    (Linux reports them through syncfs since 5.8)."""
    if _syncfs is None:
        os.sync()
        return
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if _syncfs(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"syncfs {path}: {os.strerror(err)}")
    finally:
        os.close(fd)


def fsync_file(path: Path | str) -> bool:
    """fsync one file; False if it is gone (deleted by a truncation meanwhile)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return True


def read_small_file(path: Path | str) -> bytes | None:
    """The whole content of a small state file, None if it is missing. Plain descriptor reads: a
    pathlib read_bytes or read_text builds a buffered stream per file, four files a log, 20,000
    logs opened at a start."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)


def read_ascii_file(path: Path | str) -> str | None:
    """The whole text of a small ASCII state file, None if it is missing (UnicodeDecodeError if it
    is not ASCII)."""
    data = read_small_file(path)
    return None if data is None else data.decode("ascii")


def write_file(path: Path | str, data: bytes, *, sync: bool = True) -> None:
    """`data` as the whole content of `path` (created or truncated), fsynced unless told not to."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, data, position: int) -> None:
    """`data` written at `position` of `fd`, however many pwrites it takes."""
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, position)
        view = view[written:]
        position += written


def overwrite_in_place(path: Path | str, data: bytes) -> None:
    """`data` written over the start of `path` (made if missing), then the file cut to its
    length: no new inode and no rename, which on ext4 cost 100-200 µs of a shutdown's time a file
    against about 8 µs. Not atomic, and not synced: only for a file that a filesystem sync follows
    before anything relies on it, and whose reader ignores what lies past the content it expects
    (a kill between the write and the cut leaves the old tail there)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        write_all(fd, data, 0)
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)


def write_atomically(path: Path | str, data: bytes, *, sync: bool = True) -> None:
    """tmp file + fsync + rename + fsync of the dir (the rename itself must reach the disk).
    Without sync: tmp + rename only (a reader never sees a half file; a crash may lose the
    change), for callers that fsync the file and its dir later, before relying on it."""
    # The writing thread in the tmp name: a log's background flush and another writer of the same
    # dir (a test's "crashed" instance beside the reopened one) never share a half-written file.
    target = os.fspath(path)
    tmp = f"{target}.{threading.get_native_id()}{TMP_SUFFIX}"
    write_file(tmp, data, sync=sync)
    os.replace(tmp, target)
    if sync:
        fsync_dir(os.path.dirname(target) or os.curdir)


def remove_durably(path: Path) -> bool:
    """Unlink `path` and fsync its dir; False if it was not there."""
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    fsync_dir(path.parent)
    return True
