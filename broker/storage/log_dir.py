"""LogDir: one entry of log.dirs. Formatted with meta.properties on first use; holds chunk replica dirs.

Clean shutdown, as Kafka: a broker stopping closes every log of the dir without fsyncs, syncs the
dir's filesystem once (syncfs) and writes `.kafka_cleanshutdown` in the dir. At the next start
the marker is read and removed before any log opens (a crash while loading is then a crash again,
KAFKA-10471); each replica dir that was there opens once without recovery. The marker is written
only if every replica dir that was there at start was opened (so recovered) or is still clean:
a start that stopped before opening a crashed log must not make it look clean.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable
from pathlib import Path

import structlog

from broker.storage.atomic_file import remove_durably, sync_filesystem, write_atomically
from broker.storage.config import LogConfig
from broker.storage.errors import StorageError
from broker.storage.exhaustion import is_resource_exhaustion, note_resource_exhaustion
from broker.storage.file_names import CLEAN_SHUTDOWN_MARKER, parse_replica_dir_name, replica_dir_name
from broker.storage.log import Log
from broker.storage.log_state import DirHighWatermarks
from broker.storage.meta_properties import (
    FILE_NAME,
    MetaProperties,
    new_directory_id,
    read_meta_properties,
    write_meta_properties,
)

log = structlog.get_logger(__name__)
PROBE_FILE = ".strata-write-probe"


class LogDir:
    """One entry of log.dirs: formatted with meta.properties on first use, holds chunk replica dirs."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.online = True
        self.offline_reason: str | None = None
        self._directory_id: uuid.UUID | None = None
        # names of the replica dirs found at start: still clean (the marker was there) or still to
        # recover (it was not); each leaves its set when its log opens
        self._clean: set[str] = set()
        self._unrecovered: set[str] = set()
        # every log's high watermark, written by the periodic checkpoint and the shutdown
        # (log_state.py); what it held at start is handed to each log as it opens
        self.high_watermarks = DirHighWatermarks(self.path)
        self._started_with: dict[str, tuple[int, int]] = {}
        # told once when the dir goes offline; may be called from any thread (an executor's I/O)
        self.offline_listeners: list[Callable[[LogDir], None]] = []
        # KIP-966: the broker epoch the clean shutdown marker names, written from the session's
        # (set by the lifecycle) and read back at start (-1: none), so the next registration
        # tells the controller the broker stopped cleanly (Kafka's CleanShutdownFileHandler)
        self.broker_epoch = -1
        self.clean_shutdown_epoch = -1
        self._io_error_handler = self._on_io_error  # one bound method for all its logs, not one each

    @property
    def directory_id(self) -> uuid.UUID:
        """Known after format_or_check()."""
        if self._directory_id is None:
            raise StorageError(f"log dir {self.path} has not been formatted or checked yet")
        return self._directory_id

    @property
    def known_id(self) -> uuid.UUID | None:
        """The dir's id if its meta.properties could be read (also for an offline dir)."""
        return self._directory_id

    def format_or_check(self, node_id: int, cluster_id: str) -> None:
        """Write meta.properties into a new or empty dir; otherwise check it names this node and
        cluster, so a disk moved from another broker or cluster is never mixed in. Then a probe
        file is written, synced and removed: a dir that cannot take a write (read-only, full,
        failing) starts offline instead of failing the first append."""
        meta_path = self.path / FILE_NAME
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            if meta_path.exists():
                meta = read_meta_properties(meta_path)
                if meta.node_id != node_id:
                    raise StorageError(
                        f"log dir {self.path} belongs to node.id {meta.node_id}, but this broker is node.id {node_id}"
                    )
                if meta.cluster_id != cluster_id:
                    raise StorageError(
                        f"log dir {self.path} belongs to cluster {meta.cluster_id!r}, but this broker is in {cluster_id!r}"
                    )
                if meta.directory_id is None:  # an older file: give the dir its id now, once
                    meta = MetaProperties(node_id, cluster_id, new_directory_id())
                    write_meta_properties(meta_path, meta)
                    log.info("log_dir_id_assigned", path=str(self.path), directory_id=str(meta.directory_id))
            else:
                replicas = self.list_replicas()
                if replicas:
                    raise StorageError(
                        f"log dir {self.path} holds {len(replicas)} chunk replica dirs but no {FILE_NAME}; "
                        "refusing to adopt data of unknown origin"
                    )
                meta = MetaProperties(node_id, cluster_id, new_directory_id())
                write_meta_properties(meta_path, meta)
                log.info("log_dir_formatted", path=str(self.path), node_id=node_id, cluster_id=cluster_id)
        except OSError as exc:
            self.mark_offline(f"cannot format or check: {exc}")
            raise StorageError(f"log dir {self.path} is unusable: {exc}") from exc
        self._directory_id = meta.directory_id
        try:
            self._take_clean_shutdown_marker()
            self._probe_write()
        except OSError as exc:
            self.mark_offline(f"cannot write: {exc}")
            raise StorageError(f"log dir {self.path} cannot be written: {exc}") from exc

    def _take_clean_shutdown_marker(self) -> None:
        self._started_with = self.high_watermarks.read()
        names = {p.name for *_, p in self.list_replicas()}
        self.clean_shutdown_epoch = _marker_epoch(self.path / CLEAN_SHUTDOWN_MARKER)
        if remove_durably(self.path / CLEAN_SHUTDOWN_MARKER):
            self._clean = names
            log.info("log_dir_clean_shutdown", path=str(self.path), replicas=len(names))
        else:
            self._unrecovered = names

    def mark_clean_shutdown(self) -> bool:
        """After every log of the dir was closed (close(sync=False)): sync the filesystem, then
        write the marker. False (and no marker) if the dir is offline, a replica found at start
        was never opened to recover, or the sync fails."""
        if not self.online:
            return False
        pending = [n for n in self._unrecovered if (self.path / n).exists()]
        if pending:
            log.warning("log_dir_not_marked_clean", path=str(self.path), unrecovered_replicas=len(pending),
                        first=sorted(pending)[:3])
            return False
        try:
            sync_filesystem(self.path)
            marker = json.dumps({"version": 0, "brokerEpoch": self.broker_epoch}).encode()
            write_atomically(self.path / CLEAN_SHUTDOWN_MARKER, marker)
        except OSError as exc:
            log.error("log_dir_not_marked_clean", path=str(self.path), error=str(exc))
            return False
        return True

    def sync(self) -> None:
        """syncfs the dir's filesystem (after writes made without fsync). A failure is a disk
        error: the dir goes offline, as after a failed fsync; running out of descriptors is not."""
        try:
            sync_filesystem(self.path)
        except OSError as exc:
            if is_resource_exhaustion(exc):
                note_resource_exhaustion(str(self.path), "sync", exc)
            else:
                self.mark_offline(f"sync failed: {exc}")

    def write_high_watermarks(self, entries: dict[str, tuple[int, int]]) -> bool:
        """Replace the dir's high-watermark-checkpoint with `entries` (replica dir name ->
        Log.high_watermark_entry()), unsynced: sync() or mark_clean_shutdown() follows. True if
        written; a failure other than running out of descriptors takes the dir offline."""
        if not self.online:
            return False
        # logs found at start and not opened yet keep the entries they had
        entries = {**self._started_with, **entries}
        try:
            return self.high_watermarks.write(entries, sync=False)
        except OSError as exc:
            if is_resource_exhaustion(exc):
                note_resource_exhaustion(str(self.path), "write high watermarks", exc)
            else:
                self.mark_offline(f"cannot write {self.high_watermarks.path.name}: {exc}")
            return False

    def writable(self) -> bool:
        """Whether a file can be written and synced in the dir now (after an I/O error: which dir failed?)."""
        try:
            self._probe_write()
        except OSError:
            return False
        return True

    def _probe_write(self) -> None:
        probe = self.path / PROBE_FILE
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, b"probe\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        os.unlink(probe)

    def replica_dir(self, topic: str, partition: int, chunk_start: int) -> Path:
        return self.path / replica_dir_name(topic, partition, chunk_start)

    def list_replicas(self) -> list[tuple[str, int, int, Path]]:
        """(topic, partition, chunk_start, dir) of every live chunk replica dir, sorted; dirs being
        moved or deleted (.move / .delete suffixes) and anything else are skipped."""
        found = []
        try:
            entries = list(os.scandir(self.path))
        except FileNotFoundError:
            return []
        for entry in entries:
            if not entry.is_dir(follow_symlinks=False):
                continue
            name = parse_replica_dir_name(entry.name)
            if name is None or name.suffix:
                continue
            found.append((name.topic, name.partition, name.chunk_start, Path(entry.path)))
        return sorted(found)

    def open_log(
        self, topic: str, partition: int, chunk_start: int, config: LogConfig, topic_id: uuid.UUID | None = None
    ) -> Log:
        if not self.online:
            raise StorageError(f"log dir {self.path} is offline ({self.offline_reason})")
        path = self.replica_dir(topic, partition, chunk_start)
        lg = Log.open(
            path,
            config,
            topic_id=topic_id,
            io_error_handler=self._io_error_handler,
            clean_shutdown=path.name in self._clean,
            dir_high_watermark=self._started_with.pop(path.name, None),
        )
        # opened once, clean or recovered: from now on only a clean close makes it clean again
        self._clean.discard(path.name)
        self._unrecovered.discard(path.name)
        return lg

    def usage(self) -> tuple[int, int]:
        """(total bytes, bytes usable by this process) of the filesystem holding the dir."""
        st = os.statvfs(self.path)
        return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize

    def mark_offline(self, reason: str) -> None:
        if not self.online:
            return
        log.error("log_dir_offline", path=str(self.path), reason=reason)
        self.online = False
        self.offline_reason = reason
        for listener in list(self.offline_listeners):
            try:
                listener(self)
            except Exception:
                log.exception("log_dir_offline_listener_failed", path=str(self.path))

    def _on_io_error(self, log_path: Path, exc: BaseException) -> None:
        # As Kafka: an I/O error in any log takes its whole dir offline; the broker moves on without it.
        self.mark_offline(f"I/O error in {log_path.name}: {exc}")


def _marker_epoch(path: Path) -> int:
    """The broker epoch a clean shutdown marker names; -1 when it is absent, empty (written
    before markers held one) or unreadable."""
    try:
        value = json.loads(path.read_bytes() or b"{}").get("brokerEpoch", -1)
    except (OSError, ValueError, AttributeError):
        return -1
    return value if isinstance(value, int) else -1
