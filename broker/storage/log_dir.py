"""LogDir: one entry of log.dirs. Formatted with meta.properties on first use; holds chunk replica dirs."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path

import structlog

from broker.storage.config import LogConfig
from broker.storage.errors import StorageError
from broker.storage.file_names import parse_replica_dir_name, replica_dir_name
from broker.storage.log import Log
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
        # told once when the dir goes offline; may be called from any thread (an executor's I/O)
        self.offline_listeners: list[Callable[[LogDir], None]] = []

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
            self._probe_write()
        except OSError as exc:
            self.mark_offline(f"cannot write: {exc}")
            raise StorageError(f"log dir {self.path} cannot be written: {exc}") from exc

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
        return Log.open(
            self.replica_dir(topic, partition, chunk_start),
            config,
            topic_id=topic_id,
            io_error_handler=self._on_io_error,
        )

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
