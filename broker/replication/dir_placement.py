"""Which of this broker's log dirs holds each of its replicas (JBOD).

- A new replica goes to the dir the metadata assigns it (KIP-858's directory assignment), else
  to the online dir with the most usable bytes once bytes already promised to it (moves into it
  still copying) are counted; on a tie (dirs sharing a filesystem), the one holding the fewest
  replicas.
- A replica that sits in another dir than the metadata names is reported to the controller
  (AssignReplicasToDirs, KIP-858), as is every placement and move.
- A replica whose dir is offline is served by nobody here and never re-created elsewhere while
  the dir is away: its data may still be there (KIP-112).
- AlterReplicaLogDirs (KIP-113) names the dir a replica is to move to; the move starts once the
  replica is open here (log_dir_mover.py). At startup, moves a restart interrupted are resumed or
  rolled back from the `.move` / `.delete` dirs left behind (storage/replica_move.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from uuid import UUID

import structlog

from broker.replication.log_dir_mover import LogDirMover
from broker.replication.replica_ports import DirReports
from broker.storage.errors import StorageError
from broker.storage.log_dir import LogDir
from broker.storage.replica_move import recover_moves
from protocol.errors import Errors

log = structlog.get_logger(__name__)
ZERO_UUID = UUID(int=0)
Key = tuple[str, int, int]  # topic, partition, chunk start


class DirPlacement:
    def __init__(self, node_id: int, log_dirs: list[LogDir], mover: LogDirMover, reports: DirReports) -> None:
        self.node_id = node_id
        self.log_dirs = log_dirs
        self.mover = mover
        self.reports = reports
        self.on_disk: dict[Key, LogDir] = {}  # the online dir holding each replica found or placed here
        # replicas whose log dir went offline: not served (KAFKA_STORAGE_ERROR), never re-created
        # elsewhere while the dir is away (KIP-112: their data may still be there)
        self.offline: dict[Key, LogDir] = {}
        # the dir each replica should move to (AlterReplicaLogDirs, or a move a restart
        # interrupted); applied when the replica is opened
        self.wanted: dict[Key, LogDir] = {}
        self.to_delete: list[Path] = []  # `.delete` dirs a restart found: removed in the background

    # ---- startup
    def load(self) -> None:
        """Once the dirs are formatted or checked: settle the moves a restart interrupted and
        learn which replicas each online dir holds."""
        self._recover_moves()
        for d in self.log_dirs:
            if not d.online:
                continue
            try:
                found = d.list_replicas()
            except OSError as exc:
                d.mark_offline(f"cannot list replicas: {exc}")
                continue
            for topic, partition, chunk_start, _ in found:
                self.on_disk.setdefault((topic, partition, chunk_start), d)

    def _recover_moves(self) -> None:
        """KIP-113's restart rules for `.move` and `.delete` dirs (storage/replica_move.py)."""
        online = [d for d in self.log_dirs if d.online]
        try:
            recovered = recover_moves([d.path for d in online], any_offline=len(online) < len(self.log_dirs))
        except OSError as exc:  # a rename failed: leave everything as it is for the next start
            log.error("replica_move_recovery_failed", error=str(exc))
            return
        by_path = {d.path: d for d in online}
        for key, moved in recovered.resume.items():
            self.wanted[key] = by_path[moved.parent]
        for key in recovered.offline:
            self.offline[key] = next(d for d in self.log_dirs if not d.online)
        self.to_delete = recovered.delete

    # ---- where a replica goes
    def counts(self) -> dict[int, int]:
        """Replicas per dir (by id of the LogDir), as choose() weighs them."""
        counts = {id(d): 0 for d in self.log_dirs}
        for d in self.on_disk.values():
            counts[id(d)] = counts.get(id(d), 0) + 1
        return counts

    def choose(self, counts: dict[int, int] | None = None) -> LogDir:
        """Where a new replica goes (better than round-robin): the online dir with the most usable
        bytes once the bytes already assigned to it but not yet written there (moves into it
        still copying) are counted; on a tie, the one holding the fewest replicas. A caller
        placing many keeps its own tally in `counts`."""
        if counts is None:
            counts = self.counts()
        incoming = {id(d): 0 for d in self.log_dirs}
        for m in self.mover.moves.values():
            incoming[id(m.dest)] = incoming.get(id(m.dest), 0) + max(0, m.total_bytes - m.copied_bytes)
        online = [d for d in self.log_dirs if d.online]
        if not online:
            raise StorageError("every log dir of this broker is offline")

        usable_of_fs: dict[int, int] = {}  # dirs on one filesystem share one figure, so they tie

        def room(d: LogDir) -> int:
            try:
                dev = os.stat(d.path).st_dev
                if dev not in usable_of_fs:
                    usable_of_fs[dev] = d.usage()[1]
            except OSError:
                return -1  # cannot tell: last choice
            return usable_of_fs[dev] - incoming[id(d)]

        rooms = {id(d): room(d) for d in online}
        return max(online, key=lambda d: (rooms[id(d)], -counts.get(id(d), 0)))

    def assigned(self, replicas: tuple[int, ...], directories: tuple[UUID, ...]) -> UUID:
        """The dir the metadata gives our replica (zero: unassigned)."""
        if len(directories) == len(replicas) and self.node_id in replicas:
            return directories[replicas.index(self.node_id)]
        return ZERO_UUID

    def dir_for(self, key: Key, replicas: tuple[int, ...], directories: tuple[UUID, ...]) -> LogDir | None:
        """Where a replica lives or is to be created: where it is on disk, else the dir a move
        wants, else the dir the metadata assigns it, else the best online dir. None when it is (or
        may be) in an offline dir: it is then served by nobody here rather than re-created empty."""
        if key in self.offline:
            return None
        d = self.on_disk.get(key)
        if d is not None:
            return d
        wanted = self.wanted.pop(key, None)
        if wanted is not None and wanted.online:
            return wanted
        assigned = self.assigned(replicas, directories)
        if assigned != ZERO_UUID:
            for ld in self.log_dirs:
                if ld.known_id == assigned:
                    if ld.online:
                        return ld
                    self.offline[key] = ld
                    log.warning("replica_in_offline_dir", topic=key[0], partition=key[1], chunk_start=key[2],
                                dir=str(ld.path))
                    return None
        return self.choose()

    def preopen_dir(self, key: Key, replicas: tuple[int, ...], directories: tuple[UUID, ...],
                    counts: dict[int, int], by_id: dict[UUID | None, LogDir]) -> LogDir | None:
        """dir_for without its decisions, for a replica opened ahead of its delta: where it is, else
        its assigned dir, else the best dir by `counts` (then counted there, so a burst spreads as
        one by one would). None when a decision is needed (a wanted move, an offline dir)."""
        if key in self.offline or key in self.wanted:
            return None
        d = self.on_disk.get(key)
        if d is not None:
            return d
        assigned = self.assigned(replicas, directories)
        d = by_id.get(assigned) if assigned != ZERO_UUID else self.choose(counts)
        if d is None or not d.online:
            return None
        counts[id(d)] = counts.get(id(d), 0) + 1
        return d

    def check(self, topic_id: UUID, key: Key, replicas: tuple[int, ...], directories: tuple[UUID, ...]) -> None:
        """Tell the controller where the replica lives when the metadata says otherwise (KIP-858)."""
        d = self.on_disk.get(key)
        if d is None or d.known_id is None:
            return
        if self.assigned(replicas, directories) != d.known_id:
            self.reports.report(topic_id, key[1], key[2], d.known_id)

    def placed(self, key: Key, d: LogDir, topic_id: UUID) -> None:
        """A move swapped the replica into `d`: it lives there now, and the controller hears it."""
        self.on_disk[key] = d
        if d.known_id is not None:
            self.reports.report(topic_id, key[1], key[2], d.known_id)

    # ---- moves between dirs (KIP-113)
    def maybe_move(self, key: Key) -> None:
        """Start the move AlterReplicaLogDirs (or an interrupted move) asked for this replica."""
        dest = self.wanted.get(key)
        src = self.on_disk.get(key)
        if dest is None or src is None or key in self.mover.moves:
            return
        del self.wanted[key]
        if dest is not src and dest.online:
            self.mover.start(key, src, dest)

    def by_path(self, path: str) -> LogDir | None:
        norm = os.path.normpath(path)
        return next((d for d in self.log_dirs if os.path.normpath(str(d.path)) == norm), None)

    def alter(self, topic: str, index: int, start_offset: int, path: str, is_open: Callable[[Key], bool]) -> int:
        """AlterReplicaLogDirs for one partition whose active chunk starts at `start_offset`: move
        each of its chunk replicas here to `path` ("any": cancel); `is_open` tells whether a replica
        is open here. An error code; nothing changes on an error."""
        keys = [k for k in (*self.on_disk, *self.offline) if k[:2] == (topic, index)]
        if path == "any":
            for k in keys:
                self.mover.cancel(k, reason="any")
            for k in [k for k in self.wanted if k[:2] == (topic, index)]:
                del self.wanted[k]
            return 0
        if not os.path.isabs(path):
            return Errors.LOG_DIR_NOT_FOUND
        dest = self.by_path(path)
        if dest is None:
            return Errors.LOG_DIR_NOT_FOUND
        if not dest.online or any(k in self.offline for k in keys):
            return Errors.KAFKA_STORAGE_ERROR
        if not keys:
            # not here yet: remembered, and the replica is created there when the metadata gives it us
            self.wanted[(topic, index, start_offset)] = dest
            return Errors.REPLICA_NOT_AVAILABLE
        for k in keys:
            if self.on_disk[k] is dest:
                self.mover.cancel(k, reason="already in the destination")
                self.wanted.pop(k, None)
            elif is_open(k):
                self.wanted.pop(k, None)
                self.mover.start(k, self.on_disk[k], dest)
            else:
                self.wanted[k] = dest
        return 0

    # ---- dir failure
    def dir_failed(self, d: LogDir) -> list[Key]:
        """A log dir failed: its moves stop and its replicas are offline. The replicas it held."""
        for key, m in list(self.mover.moves.items()):
            if d in (m.src, m.dest):
                self.mover.cancel(key, reason=f"log dir {d.path} offline")
        gone = [key for key, dd in self.on_disk.items() if dd is d]
        for key in gone:
            del self.on_disk[key]
            self.offline[key] = d
        return gone
