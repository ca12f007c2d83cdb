"""KIP-1164's "WAL file management": for every diskless coordinator this broker leads, the files it
owns and has no live batch in are handed to the next owner in the file's owner list
(DisklessHandOverFile), and the last owner deletes the object `diskless.coordinator.file.deletion.grace.ms`
after it found the file empty (reads in flight finish). Nothing here blocks the coordinator: a pass
runs every FILE_WORK_INTERVAL_S beside it, and a handover or deletion that fails (the next owner's
broker or the object store is down) is tried again next pass, forever.

What was done is this replica's own state (state.py's file_work), not the log's: after the
coordinator moves, the new leader (which applied the same log) finds the same files and does the
work again; a handover and a deletion are both idempotent. The grace period starts again there.

A non-first owner waits for the handover. If the earlier owners never knew the file (the
committing broker's commit to them failed), no handover ever comes: once the file has waited
longer than the orphan scan's grace period (every commit of it is over by then), the earlier
owners are asked (DisklessDescribeFiles) and, when none of them knows it, this coordinator takes
it over itself.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

import structlog

from broker.diskless.coordinator.state import next_owner
from broker.diskless.object_store import ObjectStore, ObjectStoreError
from node.client import ClientError

if TYPE_CHECKING:
    from broker.diskless.coordinator.coordinator import DisklessCoordinator
    from broker.diskless.coordinator_client import CoordinatorClient

log = structlog.get_logger(__name__)

FILE_WORK_INTERVAL_S = 0.5
RETRY_LOG_EVERY = 100  # a failing handover or deletion is logged on its 1st, 101st, ... attempt


class FileCleaner:
    def __init__(self, coordinator: DisklessCoordinator, client: CoordinatorClient, store: ObjectStore,
                 deletion_grace_ms: int, orphan_grace_ms: int) -> None:
        """`coordinator`: this broker's DisklessCoordinator (led_partitions, and its `files`: version, tasks, done);
        `client`: the CoordinatorClient (hand_over, describe_files to other coordinators)."""
        self.coordinator = coordinator
        self.client = client
        self.store = store
        self.deletion_grace_s = deletion_grace_ms / 1000
        self.orphan_grace_s = orphan_grace_ms / 1000
        self._due: dict[tuple[int, str], float] = {}  # (coordinator, key) -> when its deletion may run
        self._waiting: dict[tuple[int, str], float] = {}  # (coordinator, key) -> since when it waits
        self._failures: dict[tuple[int, str], int] = {}  # (coordinator, key) -> failed attempts in a row
        # coordinator -> (files version looked at, when to look again without a change): a pass
        # reads the state only after a deletion or handover, or while work is left
        self._looked: dict[int, tuple[tuple[int, int], float]] = {}
        self._task = asyncio.get_running_loop().create_task(self._run())

    def close(self) -> None:
        self._task.cancel()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(FILE_WORK_INTERVAL_S)
            led = set(self.coordinator.led_partitions())
            for table in (self._due, self._waiting, self._failures):  # a coordinator that moved away starts afresh later
                for k in [k for k in table if k[0] not in led]:
                    del table[k]
            for index in [i for i in self._looked if i not in led]:
                del self._looked[index]
            for index in sorted(led):
                try:
                    await self.run_once(index)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("diskless_file_work_failed", coordinator=index)

    async def run_once(self, index: int) -> None:
        version = self.coordinator.files.version(index)
        now = time.monotonic()
        looked = self._looked.get(index)
        if version is None or (looked is not None and looked[0] == version and now < looked[1]):
            return
        tasks = await self.coordinator.files.tasks(index)
        if tasks is None:
            return
        owned, waiting = tasks
        # nothing left to do: look again after a change; work left: next pass; only files waiting
        # for a handover: when the first of them may be checked (the takeover below)
        again = now if owned else min((self._waiting.get((index, t.object_key), now) + self.orphan_grace_s
                                       for t in waiting), default=float("inf"))
        self._looked[index] = (version, again)
        unreachable: set[int] = set()  # a next owner that failed this pass: its other files wait too
        for t in owned:
            self._waiting.pop((index, t.object_key), None)
            target = next_owner(t.owners, index)
            if target >= 0:
                if target in unreachable:
                    continue
                code = await self.client.hand_over(target, t.object_key, t.size, t.owners, index)
                if code:
                    unreachable.add(target)
                    failures = self._failures[(index, t.object_key)] = self._failures.get((index, t.object_key), 0) + 1
                    if failures % RETRY_LOG_EVERY == 1:  # a target down for long is not a line per pass
                        log.info("diskless_file_handover_retry", coordinator=index, key=t.object_key, to=target,
                                 error=code, attempts=failures)
                    continue
                self._failures.pop((index, t.object_key), None)
                await self.coordinator.files.done(index, t.object_key, deleted=False)
                log.info("diskless_file_handed_over", coordinator=index, key=t.object_key, to=target)
                continue
            due = self._due.setdefault((index, t.object_key), now + self.deletion_grace_s)
            if now < due:
                continue
            try:
                await self.store.delete(t.object_key)
            except ObjectStoreError as e:
                failures = self._failures[(index, t.object_key)] = self._failures.get((index, t.object_key), 0) + 1
                if failures % RETRY_LOG_EVERY == 1:
                    log.warning("diskless_file_delete_retry", coordinator=index, key=t.object_key, error=str(e),
                                attempts=failures)
                continue
            self._failures.pop((index, t.object_key), None)
            self._due.pop((index, t.object_key), None)
            await self.coordinator.files.done(index, t.object_key, deleted=True)
            log.info("diskless_file_deleted", coordinator=index, key=t.object_key, bytes=t.size)
        for t in waiting:
            since = self._waiting.setdefault((index, t.object_key), now)
            if now - since < self.orphan_grace_s or index not in t.owners:
                continue
            self._waiting[(index, t.object_key)] = now  # asked again only after another grace period
            if await self._nobody_before_knows(index, t.owners, t.object_key):
                code = await self.client.hand_over(index, t.object_key, t.size, t.owners, -1)
                log.info("diskless_file_taken_unowned", coordinator=index, key=t.object_key, error=code)

    async def _nobody_before_knows(self, index: int, owners: list[int], key: str) -> bool:
        """True when no owner before `index` in the list knows the file (all could answer)."""
        brokers = self.client.coordinator_brokers()
        if brokers is None:
            return False
        earlier = set(owners[:owners.index(index)])
        for broker in {brokers.get(i, -1) for i in earlier}:
            if broker < 0:
                return False
            try:
                resp = await self.client.describe_files(broker, [key])
            except (ClientError, OSError):
                return False
            answered = {c.coordinator_id for c in resp.coordinators if c.error_code == 0}
            if not (earlier & {i for i, b in brokers.items() if b == broker}) <= answered:
                return False
            if any(f.error_code or earlier & set(f.known_by) for f in resp.files):
                return False
        return True
