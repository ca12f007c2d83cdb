"""Inactive chunks behind the one partition interface (interface.py): what serves a Fetch of an
offset below the active chunk, or a peer's ListOffsets about the chunk replicas held here. The
router (router.py) picks the view; broker/replication/chunk_reads.py explains the choices.

An inactive chunk takes no writes: a view refuses appends, DeleteRecords and OffsetForLeaderEpoch
as Kafka's replicas that do not lead refuse them (NOT_LEADER_OR_FOLLOWER). Its reads never wait
(no new data comes to a closed chunk), so a long poll never parks on one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from broker.partitions.interface import AppendAnswer, FetchPosition, OffsetAnswer, ReadAnswer, answered
from broker.storage.errors import StorageError
from node.client import ClientError
from protocol.errors import Errors
from protocol.generated.fetch import FetchRequest

if TYPE_CHECKING:
    from broker.replication.chunk_reads import ChunkReads
    from broker.replication.chunk_replica import ChunkReplica
    from broker.replication.partition import Partition
    from broker.storage.log import Log
    from node.server import Connection

log = structlog.get_logger(__name__)
EARLIEST = -2
MAX_TIMESTAMP = -3
PROXY_FETCH_MAX_VERSION = 12  # a proxied read asks by topic name


class Reader(Protocol):
    """Who reads (the part of a request's context the chunk views log and remember)."""

    @property
    def client_id(self) -> str | None: ...

    @property
    def api_version(self) -> int: ...

    @property
    def connection(self) -> Connection | None: ...


class InactiveChunkView:
    """What every inactive chunk's view refuses."""

    def pipelines_appends(self, acks: int, size: int) -> bool:
        return False

    def append(self, records: Any, acks: int, timeout_ms: int, now_ms: int) -> Awaitable[AppendAnswer]:
        return answered(AppendAnswer(Errors.NOT_LEADER_OR_FOLLOWER, "an inactive chunk takes no writes"))

    def prepare_read(self, pos: FetchPosition) -> bool:
        return False

    async def read(self, pos: FetchPosition) -> ReadAnswer:
        return ReadAnswer(Errors.NOT_LEADER_OR_FOLLOWER, aborted_transactions=[])

    async def offset_for(self, timestamp: int, read_committed: bool) -> OffsetAnswer:
        return OffsetAnswer(Errors.NOT_LEADER_OR_FOLLOWER)

    def add_data_waiter(self, fut: asyncio.Future, follower: bool = False) -> None:
        pass  # a closed chunk gets no new data: its reads never wait

    async def epoch_end_offset(self, leader_epoch: int, consumer: bool,
                               current_leader_epoch: int = -1) -> tuple[int, int, int]:
        return Errors.NOT_LEADER_OR_FOLLOWER, -1, -1

    async def delete_records(self, offset: int) -> tuple[int, int]:
        return Errors.NOT_LEADER_OR_FOLLOWER, -1


class ChunkReplicaRead(InactiveChunkView):
    """A consumer reads [offset, stop] from this broker's replica of the chunk. The active chunk's
    leader reports the partition's own high watermark and last stable offset; a chunk replica
    reports stop + 1 for both (the end of what its readers get here; past it they are sent
    onwards)."""

    def __init__(self, reads: ChunkReads, cr: ChunkReplica, leader: Partition | None, reader: Reader) -> None:
        self.reads = reads
        self.cr = cr
        self.leader = leader
        self.reader = reader

    async def read(self, pos: FetchPosition) -> ReadAnswer:
        cr = self.cr
        lg = cr.log
        ans = ReadAnswer(log_start_offset=lg.log_start_offset, aborted_transactions=[] if pos.read_committed else None)
        if self.leader is not None:
            ans.high_watermark = self.leader.high_watermark
            ans.last_stable_offset = last_stable_offset(self.leader.log)
        else:
            ans.high_watermark = ans.last_stable_offset = cr.stop + 1
        try:
            fi = lg.read(pos.fetch_offset, max(pos.max_bytes, 0), max_offset=cr.read_end, min_one_batch=True,
                         regions=True)
        except StorageError as e:
            ans.error_code = e.error_code
            return ans
        if fi.total_bytes:
            ans.records, ans.size = fi.records, fi.total_bytes
            if pos.read_committed and hasattr(lg, "aborted_transactions"):
                ans.aborted_transactions = list(lg.aborted_transactions(pos.fetch_offset, fi.end_offset))
        self.reads.counts.served(cr.topic, cr.index, cr.start, fi.total_bytes)
        log.info("chunk_read", topic=cr.topic, partition=cr.index, chunk_start=cr.start, offset=pos.fetch_offset,
                 bytes=fi.total_bytes, client=self.reader.client_id)
        return ans


class ChunkRangeRead(InactiveChunkView):
    """A replica copying a chunk fetches [start, end] of it from our replica's log (a follower
    fetch: the part past stop, a transaction open when the chunk was cut, included)."""

    def __init__(self, lg: Log, end: int) -> None:
        self.log = lg
        self.end = end

    async def read(self, pos: FetchPosition) -> ReadAnswer:
        lg, end = self.log, self.end
        ans = ReadAnswer(log_start_offset=lg.log_start_offset, aborted_transactions=[])
        ans.high_watermark = ans.last_stable_offset = min(end + 1, lg.log_end_offset)
        if pos.fetch_offset < lg.log_start_offset:
            ans.error_code = Errors.OFFSET_OUT_OF_RANGE
            return ans
        if pos.fetch_offset >= lg.log_end_offset:
            return ans  # nothing more here (the requester tries another replica)
        try:
            fi = lg.read(pos.fetch_offset, max(pos.max_bytes, 0), max_offset=end + 1, min_one_batch=True, regions=True)
        except StorageError as e:
            ans.error_code = e.error_code
            return ans
        if fi.total_bytes:
            ans.records, ans.size = fi.records, fi.total_bytes
        return ans


class ChunkOutOfRange(InactiveChunkView):
    """An offset below the partition's oldest chunk, below the head retention took, or below a
    DeleteRecords: OFFSET_OUT_OF_RANGE with the partition's log start offset."""

    def __init__(self, log_start_offset: int) -> None:
        self.log_start_offset = log_start_offset

    async def read(self, pos: FetchPosition) -> ReadAnswer:
        return ReadAnswer(Errors.OFFSET_OUT_OF_RANGE, log_start_offset=self.log_start_offset, aborted_transactions=[])


class ChunkRedirect(InactiveChunkView):
    """KIP-392's preferred read replica: the consumer reads this offset from broker `to` (a replica
    of the chunk holding it, or, past our chunk's end, the active chunk's leader). The active
    chunk's leader also gives the partition's offsets and remembers the redirect, so that a client
    coming back for the same offset is read for instead (ChunkProxyRead)."""

    def __init__(self, reads: ChunkReads, topic: str, index: int, offset: int, to: int, chunk_start: int | None,
                 leader: Partition | None, reader: Reader) -> None:
        self.reads = reads
        self.topic = topic
        self.index = index
        self.offset = offset
        self.to = to
        self.chunk_start = chunk_start
        self.leader = leader
        self.reader = reader

    async def read(self, pos: FetchPosition) -> ReadAnswer:
        ans = ReadAnswer(preferred_read_replica=self.to, at_once=True, aborted_transactions=[])
        p, reader = self.leader, self.reader
        if p is not None and p.is_leader:
            ans.high_watermark = p.high_watermark
            ans.last_stable_offset = last_stable_offset(p.log)
            ans.log_start_offset = p.log.log_start_offset
            if reader.connection is not None:
                self.reads.redirected(reader.connection, self.topic, self.index, self.offset)
        self.reads.counts.redirects += 1
        log.info("chunk_redirect", topic=self.topic, partition=self.index, offset=self.offset, to=self.to,
                 chunk_start=self.chunk_start, client=reader.client_id, api_version=reader.api_version)
        return ans


class ChunkProxyRead(InactiveChunkView):
    """The active chunk's leader reads [offset, stop] from a replica of the chunk for a client
    that stays with it (Fetch < v11, or one that did not follow the redirect). prepare_read starts
    the read, so a Fetch's proxied partitions ask together."""

    def __init__(self, reads: ChunkReads, topic: str, index: int, chunk_start: int, offset: int, max_bytes: int,
                 isolation_level: int, sources: list[int], leader: Partition | None, reader: Reader) -> None:
        self.reads = reads
        self.topic = topic
        self.index = index
        self.chunk_start = chunk_start
        self.offset = offset
        self.max_bytes = max_bytes  # the partition's own limit: the replica's answer is what it sends
        self.isolation_level = isolation_level
        self.sources = sources
        self.leader = leader
        self.reader = reader
        self._reading: asyncio.Task | None = None

    def prepare_read(self, pos: FetchPosition) -> bool:
        if self._reading is None:
            self._reading = asyncio.get_running_loop().create_task(self._proxy_read())
        return True

    async def read(self, pos: FetchPosition) -> ReadAnswer:
        return await (self._reading if self._reading is not None else self._proxy_read())

    async def _proxy_read(self) -> ReadAnswer:
        peers, reader = self.reads.peers, self.reader
        last_error = "no replica"
        for src in self.sources:
            try:
                client = await peers.get(src)
                version = min(client.version_for(FetchRequest.API_KEY), PROXY_FETCH_MAX_VERSION)
                freq = FetchRequest(
                    replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=max(self.max_bytes, 1),
                    isolation_level=self.isolation_level, session_id=0, session_epoch=-1,
                    topics=[FetchRequest.FetchTopic(topic=self.topic, partitions=[FetchRequest.FetchPartition(
                        partition=self.index, fetch_offset=self.offset, partition_max_bytes=self.max_bytes,
                        current_leader_epoch=-1, last_fetched_epoch=-1, log_start_offset=-1)])],
                    forgotten_topics_data=[], rack_id="",
                )
                resp = await client.request(freq, version, timeout=30)
            except ClientError as e:
                await peers.drop(src)
                last_error = str(e)
                continue
            got = resp.responses[0].partitions[0] if resp.responses and resp.responses[0].partitions else None
            if resp.error_code or got is None or got.error_code or got.preferred_read_replica >= 0:
                last_error = f"error {resp.error_code or (got.error_code if got else -1)}"
                continue
            records = got.records or b""
            size = _size(records)
            aborted = got.aborted_transactions
            ans = ReadAnswer(records=records, size=size, log_start_offset=got.log_start_offset, at_once=True,
                             aborted_transactions=None if aborted is None else [
                                 (a.producer_id, a.first_offset) for a in aborted])
            p = self.leader
            if p is not None and p.is_leader:
                ans.high_watermark = p.high_watermark
                ans.last_stable_offset = last_stable_offset(p.log)
            else:
                ans.high_watermark, ans.last_stable_offset = got.high_watermark, got.last_stable_offset
            self.reads.counts.proxied(size)
            log.info("chunk_proxy_read", topic=self.topic, partition=self.index, chunk_start=self.chunk_start,
                     offset=self.offset, bytes=size, source=src, client=reader.client_id,
                     api_version=reader.api_version)
            return ans
        log.warning("chunk_proxy_failed", topic=self.topic, partition=self.index, chunk_start=self.chunk_start,
                    offset=self.offset, sources=self.sources, error=last_error)
        return ReadAnswer(Errors.NOT_LEADER_OR_FOLLOWER, aborted_transactions=[], at_once=True)


class HeldChunks(InactiveChunkView):
    """A peer's chunk query (ListOffsets with replica_id = its id), answered from our replicas of
    the partition's inactive chunks (oldest first, each holding some of its readable range):
    EARLIEST = the oldest one's log start; MAX_TIMESTAMP = the record with the largest timestamp
    of the oldest chunk holding it; a timestamp = the first record at or after it in [start,
    stop] of each, oldest first."""

    def __init__(self, held: list[ChunkReplica]) -> None:
        self.held = held

    async def offset_for(self, timestamp: int, read_committed: bool) -> OffsetAnswer:
        mine, ts = self.held, timestamp
        if ts == EARLIEST:
            return OffsetAnswer(offset=mine[0].log.log_start_offset, timestamp=-1)
        if ts == MAX_TIMESTAMP:
            best = (-1, -1)
            for cr in mine:
                t, off = cr.log.max_timestamp()
                if t > best[1]:
                    best = (off, t)
            return OffsetAnswer(offset=best[0], timestamp=best[1])
        for cr in mine:
            hit = cr.log.offset_for_timestamp(ts)
            if hit is not None and hit[0] <= cr.stop:
                return OffsetAnswer(offset=hit[0], timestamp=hit[1])
        return OffsetAnswer(offset=-1, timestamp=-1)


def last_stable_offset(lg: Log) -> int:
    lso = getattr(lg, "last_stable_offset", lg.high_watermark)
    return lso() if callable(lso) else lso


def _size(records: Any) -> int:
    if not records:
        return 0
    if isinstance(records, list):
        return sum(len(x) for x in records)
    return len(records)
