"""Chunk copying: a replica missing part of a chunk's range fetches it from another replica.

Two kinds of copy, one task each:
- an inactive chunk's replica that lacks part of [start, end] (a replica being added by a move,
  or a former follower that was behind when the chunk was cut) fetches it from a live in-sync
  replica of that chunk, chosen by a stable hash of (topic, partition, chunk start, own id) and
  falling back to the others; when it holds the whole range it reports CaughtUpBrokerId with
  AlterChunkAssignments;
- a new active chunk's leader whose log ends below the previous chunk's end + 1 (a transaction
  was open when the chunk was cut: [S, previous end] belongs to both chunks) copies that part
  from the previous chunk first (from its own replica of it if it has one) and takes writes only
  then (Partition.filling_prefix).

Fetches are Kafka follower fetches (replica_id = our id); the bytes are appended as they came
with append_as_follower, as the follower fetcher does for the active chunk; an inactive chunk's
copy counts against the broker's replication throttle (follower.replication.throttled.rate)
when the partition's replica here is throttled.
Replicas whose whole range retention deleted report LeavingBrokerId (reports also live here:
they are the chunk replicas' only messages to the controller).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import structlog

from broker.config import BrokerConfig
from broker.ports import BrokerEpoch, ControllerLink, ImageSource
from broker.replication.chunk_replica import ChunkReplica
from broker.replication.hosted import HostedReplicas
from broker.replication.partition import Partition
from broker.replication.peers import PeerClients
from broker.replication.throttle import Throttle
from broker.storage.errors import StorageError
from broker.storage.log import Log
from metadata.image import ChunkInfo
from metadata.read_replicas import hash_order
from node.client import ClientError
from node.shutdown import stop_task
from protocol.errors import Errors, ProtocolError
from protocol.generated.alter_chunk_assignments import AlterChunkAssignmentsRequest
from protocol.generated.fetch import FetchRequest
from protocol.records.batch import BATCH_HEADER_SIZE, read_header

log = structlog.get_logger(__name__)
BACKOFF_S = 0.5
LOCAL_READ_BYTES = 1 << 20
AC = AlterChunkAssignmentsRequest


class CopyFailed(Exception):
    """This source cannot give us more of the range right now."""


class ChunkFetcher:
    def __init__(self, config: BrokerConfig, images: ImageSource, controller: ControllerLink, broker_epoch: BrokerEpoch,
                 hosted: HostedReplicas, peers: PeerClients, throttle: Throttle) -> None:
        """`peers`: connections to the chunks' other replicas (closed by stop()); `throttle`: the
        broker's one follower replication throttle (KIP-73)."""
        self.config = config
        self.images = images
        self.controller = controller
        self.broker_epoch = broker_epoch
        self.hosted = hosted
        self.throttle = throttle
        self.node_id = config.node_id
        self.peers = peers
        self._tasks: dict[tuple, asyncio.Task] = {}
        self._reported: set[tuple] = set()  # (kind, topic, partition, start, chunk epoch) sent and accepted
        self._stopping = False

    # ---- jobs
    def copy_chunk(self, cr: ChunkReplica) -> None:
        """Start copying what `cr` lacks, or report it caught up if it lacks nothing."""
        key = ("chunk", *cr.key)
        if self._stopping or key in self._tasks:
            return
        if cr.complete:
            if not cr.in_isr:
                self._spawn(key, self._report_caught_up(cr))
            return
        self._spawn(key, self._copy_chunk(cr))

    def fill_prefix(self, p: Partition, required_end: int) -> None:
        """The active chunk's leader `p` copies [its log end, required_end) from the previous chunk."""
        key = ("prefix", p.topic, p.index, p.log.chunk_start)
        if self._stopping or key in self._tasks:
            return
        self._spawn(key, self._fill_prefix(p, required_end))

    def report_leaving(self, topic: str, index: int, info: ChunkInfo) -> None:
        """Tell the controller this broker's replica of the chunk holds nothing any more."""
        key = ("leave", topic, index, info.start_offset)
        if self._stopping or key in self._tasks or (*key, info.chunk_epoch) in self._reported:
            return
        self._spawn(key, self._report(key, topic, index, info, leaving=True))

    def cancel(self, topic: str, index: int, start: int) -> None:
        for kind in ("chunk", "prefix"):
            t = self._tasks.pop((kind, topic, index, start), None)
            if t is not None:
                t.cancel()

    def _spawn(self, key: tuple, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks[key] = task

        def done(t: asyncio.Task) -> None:
            if self._tasks.get(key) is t:
                del self._tasks[key]
            if not t.cancelled() and t.exception() is not None:
                log.error("chunk_job_failed", job=key, error=repr(t.exception()))

        task.add_done_callback(done)

    async def stop(self) -> None:
        self._stopping = True
        for t in list(self._tasks.values()):
            await stop_task(t)
        self._tasks.clear()
        await self.peers.close()

    # ---- inactive chunk replicas
    async def _copy_chunk(self, cr: ChunkReplica) -> None:
        log.info("chunk_copy_started", topic=cr.topic, partition=cr.index, chunk_start=cr.start,
                 from_offset=cr.log.log_end_offset, end_offset=cr.end)
        while not (self._stopping or cr.closed or cr.complete):
            info = self._chunk_info(cr.topic, cr.index, cr.start)
            if info is None:
                return  # dropped from the metadata: the replica manager deletes us
            cr.update(info)
            sources = [b for b in info.isr if b != self.node_id and self.peers.live(b)]
            progressed = False
            for src in hash_order(sources, cr.topic, cr.index, cr.start, self.node_id):
                try:
                    await self._copy_from(src, cr.topic, cr.index, cr.log, cr.end + 1, throttled=True)
                    progressed = True
                except CopyFailed as e:
                    log.info("chunk_copy_source_failed", topic=cr.topic, partition=cr.index, chunk_start=cr.start,
                             source=src, error=str(e), log_end_offset=cr.log.log_end_offset)
                if cr.complete or cr.closed:
                    break
            if not progressed and not cr.complete:
                await asyncio.sleep(BACKOFF_S)
        if cr.closed or not cr.complete:
            return
        cr.seal()
        log.info("chunk_copy_done", topic=cr.topic, partition=cr.index, chunk_start=cr.start,
                 log_end_offset=cr.log.log_end_offset)
        if not cr.in_isr:
            await self._report_caught_up(cr)

    async def _report_caught_up(self, cr: ChunkReplica) -> None:
        while not (self._stopping or cr.closed):
            info = self._chunk_info(cr.topic, cr.index, cr.start)
            if info is None or self.node_id in info.isr or self.node_id not in info.replicas:
                return
            key = ("caught_up", cr.topic, cr.index, cr.start)
            if await self._report(key, cr.topic, cr.index, info, leaving=False):
                return
            await asyncio.sleep(BACKOFF_S)

    async def _report(self, key: tuple, topic: str, index: int, info: ChunkInfo, *, leaving: bool) -> bool:
        entry = AC.AlterChunkAssignment(topic_name=topic, partition_id=index, start_offset=info.start_offset,
                                        chunk_epoch=-1, broker_ids=[])
        if leaving:
            entry.leaving_broker_id = self.node_id
        else:
            entry.caught_up_broker_id = self.node_id
        try:
            resp = await self.controller.request(AC(chunks=[entry]), 0, retry=False, timeout=10)
        except ClientError as e:
            log.warning("chunk_report_failed", topic=topic, partition=index, chunk_start=info.start_offset,
                        leaving=leaving, error=str(e))
            return False
        code = resp.results[0].error_code if resp.results else Errors.UNKNOWN_SERVER_ERROR
        log.info("chunk_left" if leaving else "chunk_caught_up", topic=topic, partition=index,
                 chunk_start=info.start_offset, error_code=code)
        if code == 0 or (leaving and code == Errors.INVALID_REQUEST):  # INVALID_REQUEST: the chunk is gone already
            self._reported.add((*key, info.chunk_epoch))
            return True
        return False

    # ---- a new active chunk's leader
    async def _fill_prefix(self, p: Partition, required_end: int) -> None:
        lg = p.log
        log.info("chunk_prefix_fill_started", topic=p.topic, partition=p.index, chunk_start=lg.chunk_start,
                 from_offset=lg.log_end_offset, to_offset=required_end)
        rm = self.hosted
        # our leader epoch starts after the copied batches (which carry the previous chunk's)
        lg.leader_epoch_cache.truncate_from_end(lg.log_end_offset)
        warned = False
        while not self._stopping and p.is_leader and rm.get(p.topic, p.index) is p and lg.log_end_offset < required_end:
            at = lg.log_end_offset
            chunk = self._chunk_holding(p.topic, p.index, at)
            if chunk is None:
                log.warning("chunk_prefix_source_missing", topic=p.topic, partition=p.index, offset=at)
                break  # the previous chunk is gone (deleted): nothing left to copy
            end = min(required_end, chunk.end_offset + 1)
            local = rm.chunks.get((p.topic, p.index, chunk.start_offset))
            progressed = False
            if local is not None and local.log.log_start_offset <= at < local.log.log_end_offset:
                try:
                    self._copy_local(local.log, lg, end)
                    progressed = True
                except StorageError as e:
                    log.warning("chunk_prefix_local_copy_failed", topic=p.topic, partition=p.index, error=str(e))
            else:
                sources = [b for b in chunk.isr if b != self.node_id and self.peers.live(b)]
                if not sources and not warned:
                    warned = True  # writes wait: the records exist only on brokers that are down
                    log.warning("chunk_prefix_waiting_for_source", topic=p.topic, partition=p.index,
                                chunk_start=chunk.start_offset, offset=at, isr=list(chunk.isr))
                for src in hash_order(sources, p.topic, p.index, chunk.start_offset, self.node_id):
                    try:
                        await self._copy_from(src, p.topic, p.index, lg, end)
                        progressed = True
                        break
                    except CopyFailed as e:
                        log.info("chunk_copy_source_failed", topic=p.topic, partition=p.index,
                                 chunk_start=chunk.start_offset, source=src, error=str(e))
            if not progressed:
                await asyncio.sleep(BACKOFF_S)
        if rm.get(p.topic, p.index) is not p:
            return
        if p.is_leader:
            # the copied batches carry the previous chunk's epochs; ours starts after them
            lg.leader_epoch_cache.assign(p.leader_epoch, lg.log_end_offset)
        p.filling_prefix = False
        p.maybe_advance_high_watermark()
        p.notify_data()
        log.info("chunk_prefix_fill_done", topic=p.topic, partition=p.index, chunk_start=lg.chunk_start,
                 log_end_offset=lg.log_end_offset, leader=p.is_leader)

    @staticmethod
    def _copy_local(src: Log, dst: Log, end: int) -> None:
        while dst.log_end_offset < end:
            fi = src.read(dst.log_end_offset, LOCAL_READ_BYTES, max_offset=end)
            if not fi.total_bytes:
                return
            dst.append_as_follower(b"".join(bytes(x) for x in fi.records))

    # ---- fetching
    async def _copy_from(self, src: int, topic: str, index: int, lg: Log, end: int, *, throttled: bool = False) -> None:
        """Fetch [lg's log end, end) from broker `src` until done; CopyFailed when it stops giving.
        `throttled`: an inactive chunk's copy, held to the replication throttle when it applies (a
        new active chunk's prefix is not: writes wait for it)."""
        try:
            client = await self.peers.get(src)
        except ClientError as e:
            raise CopyFailed(str(e)) from None
        topic_id = self.images.image.topic_ids.get(topic)
        if topic_id is None:
            raise CopyFailed(f"topic {topic} is gone from the metadata")
        cfg = self.config
        while lg.log_end_offset < end and not self._stopping:
            partition_max_bytes = cfg.replica_fetch_max_bytes
            if throttled and self.throttle.applies(topic, index):
                pause = self.throttle.pause()
                if pause:
                    await asyncio.sleep(pause)
                    continue
                partition_max_bytes = self.throttle.fetch_size(partition_max_bytes)
            version = client.version_for(FetchRequest.API_KEY)
            req = FetchRequest(
                max_wait_ms=0, min_bytes=1, max_bytes=max(cfg.replica_fetch_max_bytes, 1 << 20),
                isolation_level=0, session_id=0, session_epoch=-1,
                topics=[FetchRequest.FetchTopic(topic=topic, topic_id=topic_id, partitions=[FetchRequest.FetchPartition(
                    partition=index, current_leader_epoch=-1, fetch_offset=lg.log_end_offset, last_fetched_epoch=-1,
                    log_start_offset=lg.log_start_offset, partition_max_bytes=partition_max_bytes)])],
            )
            if version >= 15:
                req.replica_state = FetchRequest.ReplicaState(replica_id=self.node_id,
                                                              replica_epoch=self.broker_epoch())
            else:
                req.replica_id = self.node_id
            try:
                resp = await client.request(req, version, timeout=30)
            except ClientError as e:
                await self.peers.drop(src)
                raise CopyFailed(str(e)) from None
            pd = resp.responses[0].partitions[0] if resp.responses and resp.responses[0].partitions else None
            if resp.error_code or pd is None:
                raise CopyFailed(f"fetch error {resp.error_code}")
            if pd.error_code == Errors.OFFSET_OUT_OF_RANGE and pd.log_start_offset > lg.log_end_offset:
                if pd.log_start_offset >= end:
                    raise CopyFailed(f"the source kept nothing below {end} (log start {pd.log_start_offset})")
                # retention took the head of the chunk on the source: the rest is all there is
                lg.truncate_fully_and_start_at(pd.log_start_offset)
                continue
            if pd.error_code:
                raise CopyFailed(f"partition error {pd.error_code}")
            if not pd.records:
                raise CopyFailed(f"no data at offset {lg.log_end_offset}")
            try:
                info = lg.append_as_follower(_clip(pd.records, end))
            except (StorageError, ProtocolError) as e:
                raise CopyFailed(f"append failed: {e}") from None
            if info.first_offset < 0:
                raise CopyFailed(f"no whole batch at offset {lg.log_end_offset}")
            if throttled:
                self.throttle.record(topic, index, info.bytes)
            lg.update_high_watermark(min(end, lg.log_end_offset))

    # ---- metadata lookups
    def _chunk_info(self, topic: str, index: int, start: int) -> ChunkInfo | None:
        t = self.images.image.topic(topic)
        for c in (t.chunks.get(index, ()) if t is not None else ()):
            if c.start_offset == start:
                return c
        return None

    def _chunk_holding(self, topic: str, index: int, offset: int) -> ChunkInfo | None:
        """The newest inactive chunk whose [start, end] holds `offset`."""
        t = self.images.image.topic(topic)
        found = None
        for c in (t.chunks.get(index, ()) if t is not None else ()):
            if c.start_offset <= offset <= c.end_offset:
                found = c
        return found


def _clip(records, end: int):
    """The whole batches of `records` that end before `end` (a source may hold more of the
    partition than the range we copy: the previous chunk ends inside the new active one)."""
    view = memoryview(records)
    pos = 0
    while pos + BATCH_HEADER_SIZE <= len(view):
        h = read_header(view, pos)
        if h.last_offset >= end or pos + h.size > len(view):
            break
        pos += h.size
    return view[:pos]
