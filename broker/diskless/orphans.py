"""KIP-1164's orphan file scan: a WAL file uploaded but committed to no coordinator (its broker
crashed in between, and nothing cleaned up on the spot) is found and deleted. One broker scans: the
leader of coordinator 0 (it moves with that leadership), every
`diskless.coordinator.orphan.scan.interval.ms`:

1. ask every coordinator (DisklessDescribeFiles, one request per coordinator broker) for the
   commit time of the oldest file it has live batches in; every coordinator must answer (a
   loading or unreachable one might know any file: no scan then);
2. list the object store: the candidates are objects older than now minus
   `diskless.coordinator.orphan.scan.grace.period.ms` (uploads whose commit may still be under
   way are younger than that);
3. ask every coordinator whether it knows each candidate (committed batches in it, live or not,
   or took it over); again every coordinator must answer, and an error counts as "known";
4. delete the candidates no coordinator knows.

Departure from KIP-1164: it adds the grace period to the oldest live file's timestamp (step 1)
and scans only files older than that, which would keep every orphan younger than the oldest
live batch (forever, under infinite retention). Here the threshold is now - grace; step 1's
answers gate the scan and are logged; step 3 is what keeps referenced files.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import TYPE_CHECKING, Any

import structlog

from broker.coordinator import wall_clock_ms
from broker.diskless.object_store import ObjectStore, ObjectStoreError
from node.client import ClientError

if TYPE_CHECKING:
    from broker.diskless.coordinator.coordinator import DisklessCoordinator
    from broker.diskless.coordinator_client import CoordinatorClient

log = structlog.get_logger(__name__)

SCANNING_COORDINATOR = 0
KEYS_PER_REQUEST = 1000
ORPHANS_KEPT = 100  # the latest deleted orphans, for kafka-diskless.sh


class OrphanScanner:
    def __init__(self, coordinator: DisklessCoordinator, client: CoordinatorClient, store: ObjectStore, prefix: str,
                 interval_ms: int, grace_ms: int) -> None:
        """`coordinator`: this broker's DisklessCoordinator (which coordinators it leads);
        `client`: the CoordinatorClient (coordinator brokers, DisklessDescribeFiles)."""
        self.coordinator = coordinator
        self.client = client
        self.store = store
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.interval_s = interval_ms / 1000
        self.grace_ms = grace_ms
        self.last_scan_ms = -1
        self.deleted: deque[tuple[str, int, int]] = deque(maxlen=ORPHANS_KEPT)  # (key, size, when)
        self._task = asyncio.get_running_loop().create_task(self._run())

    def close(self) -> None:
        self._task.cancel()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            if SCANNING_COORDINATOR not in self.coordinator.led_partitions():
                continue
            try:
                await self.scan()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("diskless_orphan_scan_failed")

    async def _ask(self, brokers: dict[int, int], keys: list[str]) -> tuple[list[Any], set[str]] | None:
        """(every coordinator's state, the keys some coordinator knows or could not answer for),
        or None when a coordinator did not answer."""
        states: list[Any] = []
        known: set[str] = set()
        for broker in sorted(set(brokers.values())):
            try:
                resp = await self.client.describe_files(broker, keys)
            except (ClientError, OSError) as e:
                log.info("diskless_orphan_scan_skipped", reason=f"broker {broker}: {e}")
                return None
            states += [c for c in resp.coordinators if c.error_code == 0]
            known.update(f.object_key for f in resp.files if f.error_code or f.known_by)
        missing = set(brokers) - {c.coordinator_id for c in states}
        if missing:
            log.info("diskless_orphan_scan_skipped", reason=f"coordinators {sorted(missing)} did not answer")
            return None
        return states, known

    async def scan(self) -> list[str]:
        """One scan (the four steps); the keys it deleted."""
        started = time.monotonic()
        brokers = self.client.coordinator_brokers()
        if brokers is None:
            return []
        asked = await self._ask(brokers, [])  # step 1
        if asked is None:
            return []
        oldest = [c.oldest_file_timestamp_ms for c in asked[0] if c.oldest_file_timestamp_ms >= 0]
        threshold = wall_clock_ms() - self.grace_ms
        try:
            objects = await self.store.list(self.prefix)  # step 2
        except ObjectStoreError as e:
            log.warning("diskless_orphan_scan_skipped", reason=str(e))
            return []
        # WAL files are `<prefix>/<uuid>`: anything deeper (snapshots when the prefix is their root's
        # name, another tool's objects) is not ours to judge
        candidates = {o.key: o for o in objects
                      if o.last_modified_ms < threshold and "/" not in o.key[len(self.prefix):]}
        keys = sorted(candidates)
        known: set[str] = set()
        for i in range(0, len(keys), KEYS_PER_REQUEST):  # step 3
            got = await self._ask(brokers, keys[i:i + KEYS_PER_REQUEST])
            if got is None:
                return []
            known |= got[1]
        deleted = []
        for key in keys:  # step 4
            if key in known:
                continue
            try:
                await self.store.delete(key)
            except ObjectStoreError as e:
                log.warning("diskless_orphan_delete_failed", key=key, error=str(e))
                continue
            deleted.append(key)
            self.deleted.append((key, candidates[key].size, wall_clock_ms()))
            log.info("diskless_orphan_deleted", key=key, bytes=candidates[key].size,
                     age_ms=wall_clock_ms() - candidates[key].last_modified_ms)
        self.last_scan_ms = wall_clock_ms()
        log.info("diskless_orphan_scan", objects=len(objects), candidates=len(keys), deleted=len(deleted),
                 oldest_live_file_ms=min(oldest) if oldest else -1,
                 ms=round((time.monotonic() - started) * 1000))
        return deleted
