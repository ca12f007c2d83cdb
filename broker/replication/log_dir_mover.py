"""Moves of this broker's chunk replicas between its log dirs (AlterReplicaLogDirs, KIP-113), as
Kafka's ReplicaAlterLogDirsThread pool: `num.replica.move.threads` moves run at once (default: the number of log
dirs), each copying in its own thread, all held together to
`replica.alter.log.dirs.io.max.bytes.per.second` bytes/s (alias `intra.broker.throttled.rate`; a
dynamic broker config: changed with IncrementalAlterConfigs, it applies within 0.1 s).

A move copies `<replica>` into `<replica>.move` on the destination while the replica goes on
taking appends (storage/replica_move.py), round after round until less than CATCH_UP_BYTES is
left. Then it takes the replica's lock: appends stop (Produce answers NOT_LEADER_OR_FOLLOWER,
which clients retry; the follower fetcher skips it), the source log is closed cleanly, the rest
is copied and synced, two renames swap the dirs (KIP-113's `.move` and `.delete`), the moved log is opened and put in
place, the lock is released, and the controller is told where the replica now lives
(AssignReplicasToDirs). The source, now `<replica>.delete`, is removed in the background.

A move stops (leaving the source the one live copy and removing `.move`) when it is cancelled
("any", a newer move of the same replica, the replica leaving the broker) or when its source or
destination dir fails; the failed dir goes offline as any I/O error takes it.

Failpoints for crash tests: with STRATA_MOVE_FAILPOINT=copying|caught_up|renamed in its
environment the broker stops there (logs `replica_move_failpoint`, sleeps) so a test can kill -9
it at exactly that step.
"""

from __future__ import annotations

import asyncio
import errno
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import structlog

from broker.replication.chunk_replica import ChunkReplica
from broker.replication.partition import Partition
from broker.storage.log import Log
from broker.storage.log_dir import LogDir
from broker.storage.replica_move import (
    CopyState,
    MoveStopped,
    MoveThrottle,
    copy_round,
    finish,
    move_dir,
    pending_bytes,
    remove_tree,
    segment_bytes,
    swap,
)

log = structlog.get_logger(__name__)

Key = tuple[str, int, int]
CATCH_UP_BYTES = 1 << 20  # left to copy when the replica's appends are stopped for the swap
FAILPOINT = os.environ.get("STRATA_MOVE_FAILPOINT", "")


def _failpoint(step: str) -> None:
    if FAILPOINT == step:
        log.warning("replica_move_failpoint", step=step)
        while True:
            time.sleep(3600)


class MovedReplicas(Protocol):
    """What a move asks of the replicas it moves (the replica manager plays the part)."""

    def replica(self, key: Key) -> Partition | ChunkReplica | None: ...

    def dir_of(self, key: Key) -> LogDir | None:
        """The online dir holding the replica (None: not here, or offline)."""

    def install_log(self, key: Key, lg: Log, d: LogDir) -> None:
        """Serve the replica from `lg` in `d` now (the move swapped it, or put the source back)."""

    def install_failed(self, key: Key, d: LogDir, reason: str) -> None:
        """The replica was swapped into `d`, which then failed: it is offline with `d`."""


@dataclass
class Move:
    key: Key
    src: LogDir
    dest: LogDir
    state: CopyState = field(default_factory=CopyState)
    total_bytes: int = 0
    task: asyncio.Task | None = None
    in_swap: bool = False  # past the point of no return: a cancel lets it finish

    @property
    def moved_dir(self) -> Path:
        return move_dir(self.src.replica_dir(*self.key), self.dest.path)

    @property
    def copied_bytes(self) -> int:
        return self.state.copied_bytes


class LogDirMover:
    def __init__(self, replicas: MovedReplicas, rate: Callable[[], int | None], threads: int) -> None:
        self.replicas = replicas
        self.throttle = MoveThrottle(rate)
        self.threads = max(1, threads)
        self._pool = ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="replica-move")
        self._slots: asyncio.Semaphore | None = None
        self.moves: dict[Key, Move] = {}
        self.completed = 0  # moves done and their bytes, for /metrics
        self.completed_bytes = 0

    # ---- requests
    def start(self, key: Key, src: LogDir, dest: LogDir) -> Move:
        """Move the replica `key` from `src` to `dest`; a move of it under way is replaced."""
        prev = self.moves.get(key)
        self.cancel(key, reason="replaced by a new move")
        m = Move(key, src, dest)
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.threads)
        m.task = asyncio.get_running_loop().create_task(self._run(m, prev.task if prev is not None else None))
        self.moves[key] = m
        log.info("replica_move_requested", topic=key[0], partition=key[1], chunk_start=key[2], source=str(src.path),
                 destination=str(dest.path))
        return m

    def cancel(self, key: Key, *, reason: str) -> bool:
        m = self.moves.pop(key, None)
        if m is None:
            return False
        m.state.stopped = True
        if m.task is not None and not m.in_swap:
            m.task.cancel()
        log.info("replica_move_cancelled", topic=key[0], partition=key[1], chunk_start=key[2], reason=reason)
        return True

    async def stop(self) -> None:
        for key in list(self.moves):
            self.cancel(key, reason="broker stopping")
        self._pool.shutdown(wait=False, cancel_futures=True)

    # ---- the move
    async def _run(self, m: Move, previous: asyncio.Task | None) -> None:
        loop = asyncio.get_running_loop()
        assert self._slots is not None
        started = time.monotonic()
        swapped = False
        try:
            if previous is not None:  # the replaced move cleans up its `.move` first
                await asyncio.wait([previous])
            async with self._slots:
                # a `.move` left by a crash or an earlier move is not trusted (unsynced pages may be
                # lost): the copy starts over, as KIP-113's restart starts the move again
                await loop.run_in_executor(self._pool, remove_tree, m.moved_dir)
                while True:
                    lg = self._source_log(m)
                    if not getattr(self.replicas.replica(m.key), "complete", True):
                        await asyncio.sleep(0.5)  # an inactive chunk's replica still copying its range
                        continue
                    copied = await loop.run_in_executor(self._pool, copy_round, lg.dir, m.moved_dir, self.throttle,
                                                        m.state)
                    m.total_bytes = await loop.run_in_executor(self._pool, segment_bytes, lg.dir)
                    left = await loop.run_in_executor(self._pool, pending_bytes, lg.dir, m.state)
                    if FAILPOINT == "copying" and m.copied_bytes:
                        await loop.run_in_executor(None, _failpoint, "copying")
                    if left <= CATCH_UP_BYTES or copied == 0:
                        break
                swapped = await self._swap(m)
            self.completed, self.completed_bytes = self.completed + 1, self.completed_bytes + m.copied_bytes
            log.info("replica_move_completed", topic=m.key[0], partition=m.key[1], chunk_start=m.key[2],
                     destination=str(m.dest.path), bytes=m.copied_bytes, seconds=round(time.monotonic() - started, 3))
        except (MoveStopped, asyncio.CancelledError):
            pass
        except OSError as exc:
            await self._failed(m, exc)
        except Exception:
            log.exception("replica_move_failed", topic=m.key[0], partition=m.key[1], chunk_start=m.key[2])
        finally:
            if self.moves.get(m.key) is m:
                del self.moves[m.key]
            if not swapped:
                m.state.stopped = True
                await loop.run_in_executor(None, remove_tree, m.moved_dir)

    def _source_log(self, m: Move) -> Log:
        r = self.replicas.replica(m.key)
        if r is None or self.replicas.dir_of(m.key) is not m.src or not m.dest.online or m.state.stopped:
            raise MoveStopped()
        return r.log

    async def _swap(self, m: Move) -> bool:
        """Under the replica's lock: close the source, copy the rest, rename, open the copy."""
        loop = asyncio.get_running_loop()
        r = self.replicas.replica(m.key)
        if r is None:
            raise MoveStopped()
        old = self._source_log(m)
        r.swapping = True
        m.in_swap = True
        try:
            cfg, topic_id = old.config, old.topic_id

            def final():
                old.close()
                try:
                    finish(old.dir, m.moved_dir, self.throttle, m.state)
                    _failpoint("caught_up")
                    if FAILPOINT == "renamed":
                        os.rename(old.dir, old.dir.with_name(old.dir.name + ".delete"))
                        _failpoint("renamed")
                    _, deleting = swap(old.dir, m.moved_dir)
                except Exception as exc:
                    return None, exc
                return True, deleting

            done, deleting = await loop.run_in_executor(self._pool, final)
            if done is None:
                # the copy failed after the source closed: the source is still the live copy
                reopened = await loop.run_in_executor(
                    self._pool, lambda: m.src.open_log(*m.key, cfg, topic_id=topic_id))
                self.replicas.install_log(m.key, reopened, m.src)
                raise deleting
            try:
                new = await loop.run_in_executor(self._pool, lambda: m.dest.open_log(*m.key, cfg, topic_id=topic_id))
            except Exception as exc:
                # swapped, but the copy cannot be opened: the destination failed; the replica is offline with it
                self.replicas.install_failed(m.key, m.dest, f"cannot open the moved replica: {exc}")
                raise MoveStopped() from exc
            self.replicas.install_log(m.key, new, m.dest)
        finally:
            r.swapping = False
        loop.run_in_executor(None, remove_tree, deleting)
        return True

    async def _failed(self, m: Move, exc: OSError) -> None:
        """An I/O error: the dir that cannot take a write goes offline (the other goes on)."""
        loop = asyncio.get_running_loop()
        log.error("replica_move_io_error", topic=m.key[0], partition=m.key[1], chunk_start=m.key[2], error=str(exc))
        if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOMEM):
            return  # the process is short of descriptors or memory: no disk is to blame
        for d in (m.dest, m.src):
            if d.online and not await loop.run_in_executor(None, d.writable):
                d.mark_offline(f"I/O error during a replica move: {exc}")
