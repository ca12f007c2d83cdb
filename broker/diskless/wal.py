"""The broker's WAL writer for diskless partitions: every producer's batches for every diskless
partition go into one buffer, which becomes one object (a WAL file) when it reaches
`diskless.wal.max.bytes` or has waited `diskless.wal.max.ms`. Each file is uploaded (a conditional
create under `<prefix>/<uuid>`), then committed with DisklessCommitFile to the coordinators owning
its partitions (coordinator_client.py), and then every waiting produce request is answered with
the base offsets the coordinators assigned.

Uploads of successive files may overlap; commits go strictly in file order, so a producer's
pipelined batches reach the coordinator in the order they were sent (the sequence checks need it).
A failed upload answers its batches KAFKA_STORAGE_ERROR (retriable) and commits nothing; a failed
commit answers NOT_LEADER_OR_FOLLOWER (retriable: the client refreshes metadata and retries), and a
file no coordinator took is deleted. Nothing is acknowledged that is not stored and committed.

Failpoint for crash tests: with STRATA_DISKLESS_FAILPOINT=uploaded in its environment the broker
stops every file after its upload and before its commit (logs `diskless_failpoint`), so a test
can kill -9 it there and leave an orphan.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from uuid import UUID

import structlog

from broker.diskless.batches import BatchResult
from broker.diskless.config import DEFAULT_MAX_BYTES, DEFAULT_MAX_MS
from broker.diskless.coordinator_client import RETRY_AS
from broker.diskless.object_store import ObjectStoreError, StoreLocation, new_object_key
from protocol.errors import Errors
from protocol.generated.diskless_commit_file import DisklessCommitFileRequest as C
from protocol.records.batch import BatchHeader

if TYPE_CHECKING:
    from broker.diskless.coordinator_client import CoordinatorClient

log = structlog.get_logger(__name__)

WRITE_AHEAD_MULTI_SEGMENT = 1  # KIP-1164's ObjectFormat
MAX_UPLOADS_IN_FLIGHT = 4
FAILPOINT = os.environ.get("STRATA_DISKLESS_FAILPOINT", "")
SUMMARY_INTERVAL_S = 10.0
# a batch of a leader epoch the partition has left (KIP-253) is retried through newer metadata
_RETRY_AS = {**RETRY_AS, Errors.FENCED_LEADER_EPOCH: Errors.NOT_LEADER_OR_FOLLOWER}
# answers that say the coordinator wrote nothing of the batch (NOT_LEADER_OR_FOLLOWER: no
# coordinator to ask, or a gap in the producer's sequences)
_REFUSED_BEFORE_APPEND = {Errors.NOT_LEADER_OR_FOLLOWER, Errors.UNKNOWN_TOPIC_OR_PARTITION, Errors.CORRUPT_MESSAGE,
                          Errors.OUT_OF_ORDER_SEQUENCE_NUMBER,
                          Errors.INVALID_PRODUCER_EPOCH, Errors.COORDINATOR_LOAD_IN_PROGRESS,
                          Errors.CLUSTER_AUTHORIZATION_FAILED, Errors.INVALID_TXN_STATE,
                          Errors.TRANSACTION_COORDINATOR_FENCED, Errors.FENCED_LEADER_EPOCH}



@dataclass(slots=True)
class CommitStats:
    """Commit requests per WAL file (KIP-1164's "outbound commit calls"), since the broker
    started: logged as a gauge every SUMMARY_INTERVAL_S while files are committed."""

    files: int = 0
    requests: int = 0  # one per coordinator broker asked, this broker's own included
    remote_requests: int = 0  # over the network
    max_per_file: int = 0
    _logged_at: float = 0.0

    def add(self, asked: list[int], node_id: int) -> None:
        self.files += 1
        self.requests += len(asked)
        self.remote_requests += sum(1 for b in asked if b != node_id)
        self.max_per_file = max(self.max_per_file, len(asked))

    def maybe_log(self) -> None:
        now = time.monotonic()
        if now - self._logged_at < SUMMARY_INTERVAL_S:
            return
        self._logged_at = now
        log.info("diskless_commit_requests", files=self.files, requests=self.requests,
                 remote_requests=self.remote_requests, max_per_file=self.max_per_file,
                 per_file=round(self.requests / self.files, 3) if self.files else 0.0)


@dataclass(slots=True)
class _Pending:
    topic_id: UUID
    partition: int
    headers: list[BatchHeader]
    position: int  # where its batches start in the file
    sizes: list[int]
    timestamp_type: int
    log_append_time: int
    done: asyncio.Future = field(default=None)  # type: ignore[arg-type]  # set right after construction
    marker: tuple[int, int] | None = None  # a transaction marker's (control type, coordinator epoch)
    leader_epoch: int = -1  # the partition's in this broker's image when it took the batches


class WalWriter:
    def __init__(self, location: StoreLocation, client: CoordinatorClient, *, max_bytes: int = DEFAULT_MAX_BYTES,
                 max_ms: int = DEFAULT_MAX_MS, on_commit: Callable[[UUID, int], None] | None = None,
                 node_id: int = -1) -> None:
        self.store = location.store
        self.prefix = location.prefix
        self.client = client
        self.max_bytes = max_bytes
        self.max_ms = max_ms
        self.on_commit = on_commit  # called with (topic id, partition) for each committed partition
        self.node_id = node_id
        self.stats = CommitStats()
        self._loop = asyncio.get_running_loop()
        self._parts: list[bytes | bytearray] = []
        self._size = 0
        self._pending: list[_Pending] = []
        self._timer: asyncio.TimerHandle | None = None
        self._previous_commit: asyncio.Future | None = None
        self._uploads = asyncio.Semaphore(MAX_UPLOADS_IN_FLIGHT)
        self._tasks: set[asyncio.Task] = set()
        self._closed = False

    def append(self, topic_id: UUID, partition: int, data: bytes | bytearray, headers: list[BatchHeader],
               timestamp_type: int, log_append_time: int, marker: tuple[int, int] | None = None,
               leader_epoch: int = -1) -> asyncio.Future:
        """Buffer one partition's validated batches (`data`, whose headers are `headers`); the
        future resolves to a BatchResult for the first batch (its base offset is the answer).
        `marker`: `data` is one transaction marker, (control type, coordinator epoch).
        `leader_epoch`: the partition's in this broker's image (the commit carries it: KIP-253)."""
        fut = self._loop.create_future()
        if self._closed:
            fut.set_result(BatchResult(Errors.NOT_LEADER_OR_FOLLOWER, "broker is shutting down"))
            return fut
        sizes = [h.size for h in headers]
        self._pending.append(_Pending(topic_id, partition, headers, self._size, sizes, timestamp_type,
                                      log_append_time, fut, marker, leader_epoch))
        self._parts.append(data)
        self._size += len(data)
        if self._size >= self.max_bytes:
            self.rotate()
        elif self._timer is None:
            self._timer = self._loop.call_later(self.max_ms / 1000, self.rotate)
        return fut

    def rotate(self) -> None:
        """Close the current file and send it on its way (upload, then commit in order)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._pending:
            return
        data, pending = b"".join(self._parts), self._pending
        self._parts, self._pending, self._size = [], [], 0
        previous = self._previous_commit
        committed = self._loop.create_future()
        self._previous_commit = committed
        task = self._loop.create_task(self._flush(data, pending, previous, committed))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _answer(self, pending: list[_Pending], result: BatchResult) -> None:
        for p in pending:
            if not p.done.done():
                p.done.set_result(result)

    async def _flush(self, data: bytes, pending: list[_Pending], previous: asyncio.Future | None,
                     committed: asyncio.Future) -> None:
        key = new_object_key(self.prefix)
        started = time.monotonic()
        try:
            try:
                async with self._uploads:
                    created = await self.store.create(key, data)
                uploaded = time.monotonic()
                if not created:
                    raise ObjectStoreError(f"object {key} already exists")
            except ObjectStoreError as e:
                log.warning("diskless_upload_failed", key=key, bytes=len(data), error=str(e))
                self._answer(pending, BatchResult(Errors.KAFKA_STORAGE_ERROR, f"object storage: {e}"))
                return
            if FAILPOINT == "uploaded":
                log.warning("diskless_failpoint", step="uploaded", key=key)
                await asyncio.Event().wait()  # until the test kills the broker
            if previous is not None:
                await asyncio.shield(previous)
            await self._commit(key, data, pending, {"upload_ms": round((uploaded - started) * 1000, 1),
                                                    "wait_ms": round((time.monotonic() - uploaded) * 1000, 1)})
        except Exception as e:  # a bug must not leave producers waiting forever
            log.exception("diskless_flush_failed", key=key)
            self._answer(pending, BatchResult(Errors.UNKNOWN_SERVER_ERROR, str(e)))
        finally:
            if not committed.done():
                committed.set_result(None)

    async def _commit(self, key: str, data: bytes, pending: list[_Pending], timings: dict[str, float]) -> None:
        started = time.monotonic()
        batches, owners = [], []
        for p in pending:
            pos = p.position
            for h, size in zip(p.headers, p.sizes):
                batches.append(C.DisklessCommitBatch(
                    magic=h.magic, request_id=0, topic_id=p.topic_id, partition_index=p.partition, byte_offset=pos,
                    size=size, base_offset=h.base_offset, last_offset=h.base_offset + h.last_offset_delta,
                    batch_max_timestamp=p.log_append_time if p.timestamp_type == 1 else h.max_timestamp,
                    timestamp_type=p.timestamp_type, producer_id=h.producer_id, producer_epoch=h.producer_epoch,
                    base_sequence=h.base_sequence,
                    last_sequence=h.base_sequence + h.last_offset_delta if h.base_sequence >= 0 else -1,
                    is_transactional=h.is_transactional, control_type=p.marker[0] if p.marker else -1,
                    coordinator_epoch=p.marker[1] if p.marker else -1, leader_epoch=p.leader_epoch))
                owners.append(p)
                pos += size
        req = C(object_key=key, object_format=WRITE_AHEAD_MULTI_SEGMENT, file_size=len(data), batches=batches)
        results, asked = await self.client.commit(req)
        self.stats.add(asked, self.node_id)
        first: dict[int, BatchResult] = {}
        failed: dict[int, BatchResult] = {}
        # the file may be deleted only if no coordinator may hold a batch of it: every batch was
        # refused by a check or was a duplicate (a timeout or a lost connection leaves it unknown)
        maybe_referenced = False
        for p, r in zip(owners, results):
            if r.error_code:
                failed.setdefault(id(p), r)
                maybe_referenced = maybe_referenced or r.error_code not in _REFUSED_BEFORE_APPEND
            else:
                first.setdefault(id(p), r)
                maybe_referenced = maybe_referenced or not r.duplicate
        for p in pending:
            found = failed.get(id(p)) or first.get(id(p))
            r = found if found is not None else BatchResult(Errors.UNKNOWN_SERVER_ERROR, "no commit result")
            if r.error_code == Errors.CLUSTER_AUTHORIZATION_FAILED:
                # the coordinator does not count this broker as one in good standing (fenced, e.g. cut
                # off from the controller): the client is not at fault, another broker takes the batch
                r = BatchResult(Errors.NOT_LEADER_OR_FOLLOWER, "the diskless coordinator does not take commits from "
                                "this broker now (fenced?): write through another broker")
            elif r.error_code in _RETRY_AS:
                r = BatchResult(_RETRY_AS[r.error_code], r.error_message)
            elif r.error_code == 0 and p.timestamp_type == 1:
                r.log_append_time = p.log_append_time
            if not p.done.done():
                p.done.set_result(r)
            if r.error_code == 0 and self.on_commit is not None:
                self.on_commit(p.topic_id, p.partition)
        if not maybe_referenced:
            try:
                await self.store.delete(key)  # no coordinator holds a batch of it
            except ObjectStoreError as e:
                log.warning("diskless_orphan_left", key=key, error=str(e))
        log.info("diskless_file_committed", key=key, bytes=len(data), batches=len(batches), failed=len(failed),
                 commit_requests=len(asked), remote_commit_requests=sum(1 for b in asked if b != self.node_id),
                 coordinator_brokers=",".join(map(str, asked)),
                 commit_ms=round((time.monotonic() - started) * 1000, 1), **timings)
        self.stats.maybe_log()

    async def close(self) -> None:
        self._closed = True
        self.rotate()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=10)
