"""Snapshots of a diskless coordinator's SQLite state (KIP-1164's "Metadata log size management",
as KRaft's KIP-630): the leader of a `__diskless_metadata` partition copies its database
point-in-time, stores the copy in object storage and then raises the partition's log start offset
to the copy's applied offset (whole segments below it are deleted, on every replica: followers
follow the leader's log start). A replica whose database is behind its log start (a new replica,
or one that was down while the log was cut) installs the newest snapshot its log can continue,
then applies the log from there.

Where: object storage, the one store every broker of the cluster already shares, under
`diskless-snapshots/<WAL prefix>/<topic id>/<partition>/<applied offset>.sqlite` (outside the WAL
prefix, so nothing that lists WAL files sees them). A snapshot outlives the leader that took it,
and a new replica needs no leader to be up to get it. The two newest snapshots of a partition are
kept (a replica may be installing the older one while the newer is taken).

Copying: SQLite's online backup API in one step on a connection of its own, on a thread of its
own: it reads within one read transaction, so the copy is the database at one applied offset, while
applies (WAL mode: a writer does not wait for readers) and the event loop go on.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
from concurrent.futures import Executor
from pathlib import Path
from typing import BinaryIO

import structlog

from broker.diskless.coordinator.state import REPLICA_LOCAL_TABLES, SCHEMA_VERSION, UPGRADABLE_VERSIONS
from broker.diskless.object_store import ObjectStoreError, StoreLocation

log = structlog.get_logger(__name__)

KEEP = 2  # snapshots kept per partition
DOWNLOAD_CHUNK_BYTES = 8 << 20  # a replica installing a snapshot holds at most this much of it
SUFFIX = ".sqlite"


class SnapshotError(Exception):
    """A snapshot could not be taken, stored, found or installed (retried later)."""


def copy_database(path: Path, dest: Path) -> int:
    """Copy the database at `path` to `dest` point-in-time (blocking); its applied offset."""
    dest.unlink(missing_ok=True)
    src = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        dst = sqlite3.connect(dest)
        try:
            src.backup(dst)  # pages=-1: every page in one step, within one read transaction
            dst.execute("PRAGMA journal_mode=DELETE")  # one self-contained file
            for table in REPLICA_LOCAL_TABLES:  # the leader's own work status: a new leader redoes it
                dst.execute(f"DELETE FROM {table}")
            dst.commit()
            row = dst.execute("SELECT value FROM meta WHERE name = 'applied_offset'").fetchone()
        finally:
            dst.close()
    finally:
        src.close()
    return row[0] if row is not None else 0


def check_snapshot(path: Path, offset: int) -> None:
    """A downloaded snapshot is a readable database of our schema at `offset` (blocking)."""
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            meta = dict(db.execute("SELECT name, value FROM meta"))
            ok = db.execute("PRAGMA quick_check").fetchone()[0]
        finally:
            db.close()
    except sqlite3.Error as e:
        raise SnapshotError(f"snapshot {path.name} is unreadable: {e}") from None
    # an older schema's snapshot is upgraded in place once installed (DisklessState)
    version_ok = meta.get("schema_version") in (SCHEMA_VERSION, *UPGRADABLE_VERSIONS)
    if ok != "ok" or not version_ok or meta.get("applied_offset", 0) != offset:
        raise SnapshotError(f"snapshot {path.name}: check {ok!r}, schema {meta.get('schema_version')}, "
                            f"applied offset {meta.get('applied_offset')} (expected {offset})")


def take_bytes(path: Path) -> bytes:
    """The file's bytes; the file is removed (blocking)."""
    try:
        return path.read_bytes()
    finally:
        path.unlink(missing_ok=True)


def _sync_close(f: BinaryIO) -> None:
    f.flush()
    os.fsync(f.fileno())
    f.close()


class SnapshotStore:
    """The snapshots of one cluster's coordinators in object storage."""

    def __init__(self, location: StoreLocation) -> None:
        self.store = location.store
        self.root = f"diskless-snapshots/{location.prefix.strip('/') or 'wal'}"

    def _dir(self, topic_id: str, index: int) -> str:
        return f"{self.root}/{topic_id}/{index}/"

    def key(self, topic_id: str, index: int, offset: int) -> str:
        return f"{self._dir(topic_id, index)}{offset:020d}{SUFFIX}"

    async def offsets(self, topic_id: str, index: int) -> list[int]:
        """The applied offsets of the partition's stored snapshots, oldest first."""
        try:
            found = await self.store.list(self._dir(topic_id, index))
        except ObjectStoreError as e:
            raise SnapshotError(f"listing snapshots: {e}") from None
        out = []
        for o in found:
            name = o.key.rsplit("/", 1)[-1]
            if name.endswith(SUFFIX) and name[:-len(SUFFIX)].isdigit():
                out.append(int(name[:-len(SUFFIX)]))
        return sorted(out)

    async def put(self, topic_id: str, index: int, offset: int, data: bytes) -> None:
        try:
            await self.store.put(self.key(topic_id, index, offset), data)
        except ObjectStoreError as e:
            raise SnapshotError(f"storing snapshot {offset}: {e}") from None

    async def download(self, topic_id: str, index: int, offset: int, dest: Path,
                       executor: Executor | None = None, chunk_bytes: int = DOWNLOAD_CHUNK_BYTES) -> int:
        """Stream a snapshot into `dest` (fsynced), one ranged read of `chunk_bytes` at a time: a
        database of any size never sits whole in memory. Its size in bytes."""
        key = self.key(topic_id, index, offset)
        loop = asyncio.get_running_loop()
        try:
            # listed by its dir: S3 servers differ on a prefix that is a whole key (SeaweedFS lists nothing)
            found = [o for o in await self.store.list(self._dir(topic_id, index)) if o.key == key]
            if not found:
                raise SnapshotError(f"snapshot {offset} is gone")
            size = found[0].size
            f = await loop.run_in_executor(executor, open, dest, "wb")
            try:
                pos = 0
                while pos < size:
                    data = await self.store.get_range(key, pos, min(pos + chunk_bytes, size))
                    if not data:
                        raise SnapshotError(f"snapshot {offset} ended at byte {pos} of {size}")
                    await loop.run_in_executor(executor, f.write, data)
                    pos += len(data)
            finally:
                await loop.run_in_executor(executor, _sync_close, f)
        except ObjectStoreError as e:
            raise SnapshotError(f"reading snapshot {offset}: {e}") from None
        return size

    async def prune(self, topic_id: str, index: int) -> None:
        """Delete all but the KEEP newest snapshots of the partition."""
        for offset in (await self.offsets(topic_id, index))[:-KEEP]:
            try:
                await self.store.delete(self.key(topic_id, index, offset))
            except ObjectStoreError as e:
                log.warning("diskless_snapshot_delete_failed", partition=index, offset=offset, error=str(e))
