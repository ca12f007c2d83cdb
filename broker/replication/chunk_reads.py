"""Reads of inactive chunks: where a Fetch or ListOffsets for an old offset is answered.

Any replica holding an inactive chunk serves consumer reads of [start, stop] (the high watermark
it reports is stop + 1: that is where the chunk ends for its readers), and follower fetches of
[start, end] from replicas copying the chunk. The active chunk's leader, asked for an offset
below the active chunk's start:
- serves it from its own replica of that chunk if it has one;
- else redirects the consumer (Fetch v11+, KIP-392's preferred_read_replica) to a live in-sync
  replica of the chunk, chosen by a stable hash of (topic, partition, chunk start, client id)
  among those in the consumer's rack (Fetch rack_id, client.rack) if any are, as Kafka's
  rack-aware replica selector does, else among all;
- else (Fetch < v11, or a client that came back for the same offset on the same connection
  instead of following the redirect) reads the bytes from such a replica on the client's
  behalf (proxy).
A chunk replica asked for an offset past its chunk points the reader onwards: to a replica of
the chunk holding it, or to the active chunk's leader.

Every consumer read served from chunk data logs `chunk_read` (which broker served which offsets:
tests and operators can follow reads across chunks); redirects and proxied reads log too.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import structlog

from broker.metrics import ChunkReadCounts
from broker.ports import PeerListing
from broker.replication.chunk_replica import ChunkReplica
from broker.replication.peers import PeerClients
from broker.storage.errors import StorageError
from metadata.image import ChunkInfo, TopicInfo
from metadata.read_replicas import hash_order
from node.client import ClientError
from protocol.errors import Errors
from protocol.generated.fetch import FetchRequest, FetchResponse
from protocol.generated.list_offsets import ListOffsetsRequest

if TYPE_CHECKING:
    from broker.broker import Broker

log = structlog.get_logger(__name__)
R = FetchResponse
READ_COMMITTED = 1
REDIRECT_MIN_VERSION = 11  # Fetch v11 added preferred_read_replica (KIP-392)
IGNORED_REDIRECT_WINDOW_S = 30.0  # the same offset asked again this soon: the client did not follow
EARLIEST = -2
MAX_TIMESTAMP = -3


@dataclass
class ChunkAnswers:
    """Fetch partitions answered from chunk data (or redirected), by the handler's partition key."""

    pds: dict[tuple[Any, int], Any] = field(default_factory=dict)
    bytes: int = 0
    answer_now: bool = False  # a redirect or proxy: long-polling would only delay the client


@dataclass
class _Proxy:
    key: tuple[Any, int]
    topic: str
    index: int
    chunk: ChunkInfo
    offset: int
    max_bytes: int
    sources: list[int]


class ChunkReads:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.node_id = broker.config.node_id
        self.peers = PeerClients(PeerListing(broker.metadata, broker.config.listener.listener), broker.config.node_id,
                                 broker.config.inter_broker_security, "chunk-reader")
        # (topic id, partition, chunk start) -> the chunk's largest timestamp: inactive chunks are
        # immutable, so it is asked once (retention only lowers it, which costs a needless ask)
        self._chunk_max_ts: dict[tuple, int] = {}
        # connection -> {(topic, partition): (offset redirected, when)}
        self._redirected: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.counts = ChunkReadCounts()  # read by /metrics

    async def close(self) -> None:
        await self.peers.close()

    # ---- Fetch
    @staticmethod
    def involved(info: TopicInfo | None, index: int) -> bool:
        """Cheap test for the hot path: does the partition have inactive chunks? (A chunk
        replica exists here only while the metadata has its chunk.)"""
        return info is not None and bool(info.chunks.get(index))

    async def serve_fetch(self, ctx, parts, req, replica_id: int, by_id: bool, budget: int) -> ChunkAnswers:
        """Answer the partitions of a Fetch that chunks answer; the rest takes the usual path."""
        out = ChunkAnswers()
        image = self.broker.metadata.image
        proxies: list[_Proxy] = []
        for (tkey, idx), sp in parts.items():
            info = image.topics.get(tkey) if by_id else image.topic(tkey)
            if not self.involved(info, idx) or idx not in info.partitions:
                continue
            if replica_id >= 0:
                pd = self._follower_read(info, idx, sp, budget - out.bytes)
            else:
                pd = self._consumer_read(ctx, tkey, info, idx, sp, req, budget - out.bytes, proxies)
            if pd is None:
                continue
            if pd is not _PROXY:
                out.pds[(tkey, idx)] = pd
                out.bytes += _size(pd.records)
                if pd.preferred_read_replica >= 0 or pd.error_code:
                    out.answer_now = True
        if proxies:
            results = await asyncio.gather(*(self._proxy_read(ctx, x, req) for x in proxies))
            for x, pd in zip(proxies, results, strict=True):
                out.pds[x.key] = pd
                out.bytes += _size(pd.records)
            out.answer_now = True
        return out

    def _follower_read(self, info: TopicInfo, idx: int, sp, budget: int):
        """A replica copying a chunk fetches [start, end] from us; the active chunk's leader
        answers its own followers on the usual path."""
        rm = self.broker.replicas
        p = rm.get(info.name, idx)
        if p is not None and p.is_leader and sp.fetch_offset >= p.log.chunk_start:
            return None
        cr = self._local_covering(info.name, idx, sp.fetch_offset, inclusive_end=True)
        if cr is not None:
            lg, end = cr.log, cr.end
        elif p is not None and (c := _same_start(info.chunks.get(idx, ()), p.log.chunk_start)) is not None:
            # a chunk with nothing readable (cut at its first offset) kept in our active chunk's dir
            lg, end = p.log, c.end_offset
        else:
            return None
        pd = _pd(idx)
        pd.high_watermark = pd.last_stable_offset = min(end + 1, lg.log_end_offset)
        pd.log_start_offset = lg.log_start_offset
        if sp.fetch_offset < lg.log_start_offset:
            pd.error_code = Errors.OFFSET_OUT_OF_RANGE
            return pd
        if sp.fetch_offset >= lg.log_end_offset:
            return pd  # nothing more here (the requester tries another replica)
        try:
            fi = lg.read(sp.fetch_offset, min(sp.max_bytes, max(budget, 0)), max_offset=end + 1, min_one_batch=True)
        except StorageError as e:
            pd.error_code = e.error_code
            return pd
        pd.records = fi.records if fi.total_bytes else b""
        return pd

    def _consumer_read(self, ctx, tkey, info: TopicInfo, idx: int, sp, req, budget: int, proxies: list[_Proxy]):
        rm = self.broker.replicas
        active = info.partitions[idx]
        chunks = info.chunks.get(idx, ())
        p = rm.get(info.name, idx)
        leader_here = p is not None and p.is_leader
        offset = sp.fetch_offset
        mine = rm.chunks_of(info.name, idx)
        if offset >= active.start_offset or not chunks:
            if leader_here or not mine:
                return None  # the active chunk: usual path (leader, or NOT_LEADER_OR_FOLLOWER)
            # a reader of our chunk reached its end: onwards to the active chunk's leader
            return self._redirect(ctx, info, idx, offset, active.leader, None)
        c = _chunk_holding(chunks, offset)
        low = _low_watermark(chunks)
        if c is None or offset < low:  # below the oldest chunk, its head retention took, or DeleteRecords
            if not (leader_here or mine):
                return None
            pd = _pd(idx)
            pd.error_code = Errors.OFFSET_OUT_OF_RANGE
            pd.log_start_offset = max(chunks[0].start_offset, low)
            return pd
        cr = rm.chunks.get((info.name, idx, c.start_offset))
        if cr is not None and cr.holds(offset):
            return self._local_read(ctx, cr, p if leader_here else None, sp, req, budget)
        sources = [b for b in c.isr if b != self.node_id and self.peers.live(b)]
        sources = self._rack_first(hash_order(sources, info.name, idx, c.start_offset, ctx.client_id or ""),
                                   req.rack_id)
        if not leader_here:
            if not mine and cr is None:
                return None  # NOT_LEADER_OR_FOLLOWER: the client's metadata is stale
            if not sources:
                return _error(idx, Errors.NOT_LEADER_OR_FOLLOWER)
            return self._redirect(ctx, info, idx, offset, sources[0], c)
        if not sources:
            log.warning("chunk_unavailable", topic=info.name, partition=idx, chunk_start=c.start_offset,
                        offset=offset, replicas=list(c.replicas), isr=list(c.isr))
            return _error(idx, Errors.NOT_LEADER_OR_FOLLOWER)
        if ctx.api_version >= REDIRECT_MIN_VERSION and not self._ignored_redirect(ctx, info.name, idx, offset):
            return self._redirect(ctx, info, idx, offset, sources[0], c)
        proxies.append(_Proxy((tkey, idx), info.name, idx, c, offset, sp.max_bytes, sources))
        return _PROXY

    def _rack_first(self, brokers: list[int], rack: str | None) -> list[int]:
        """`brokers` in the same order, those in `rack` first (no rack: unchanged)."""
        if not rack:
            return brokers
        known = self.broker.metadata.image.brokers
        local = [b for b in brokers if b in known and known[b].rack == rack]
        return local + [b for b in brokers if b not in local]

    def _local_read(self, ctx, cr: ChunkReplica, active, sp, req, budget: int):
        """Bytes of [offset, stop] from our replica of the chunk. The active leader reports the
        partition's own high watermark and LSO; a chunk replica reports stop + 1 for both (the
        end of what its readers get here; past it they are sent onwards)."""
        lg = cr.log
        idx = cr.index
        pd = _pd(idx)
        read_committed = req.isolation_level == READ_COMMITTED
        if active is not None:
            pd.high_watermark = active.high_watermark
            pd.last_stable_offset = _lso(active.log)
        else:
            pd.high_watermark = pd.last_stable_offset = cr.stop + 1
        pd.log_start_offset = lg.log_start_offset
        pd.aborted_transactions = [] if read_committed else None
        try:
            fi = lg.read(sp.fetch_offset, min(sp.max_bytes, max(budget, 0)), max_offset=cr.read_end, min_one_batch=True)
        except StorageError as e:
            pd.error_code = e.error_code
            return pd
        if fi.total_bytes:
            pd.records = fi.records
            if read_committed and hasattr(lg, "aborted_transactions"):
                pd.aborted_transactions = [
                    R.AbortedTransaction(producer_id=pid, first_offset=first)
                    for pid, first in lg.aborted_transactions(sp.fetch_offset, fi.end_offset)
                ]
        self.counts.served(cr.topic, idx, cr.start, fi.total_bytes)
        log.info("chunk_read", topic=cr.topic, partition=idx, chunk_start=cr.start, offset=sp.fetch_offset,
                 bytes=fi.total_bytes, client=ctx.client_id)
        return pd

    def _redirect(self, ctx, info: TopicInfo, idx: int, offset: int, to: int, chunk: ChunkInfo | None):
        if ctx.api_version < REDIRECT_MIN_VERSION or to < 0:
            return _error(idx, Errors.NOT_LEADER_OR_FOLLOWER)
        pd = _pd(idx)
        pd.preferred_read_replica = to
        p = self.broker.replicas.get(info.name, idx)
        if p is not None and p.is_leader:
            pd.high_watermark = p.high_watermark
            pd.last_stable_offset = _lso(p.log)
            pd.log_start_offset = p.log.log_start_offset
            if ctx.connection is not None:
                seen = self._redirected.setdefault(ctx.connection, {})
                seen[(info.name, idx)] = (offset, time.monotonic())
        self.counts.redirects += 1
        log.info("chunk_redirect", topic=info.name, partition=idx, offset=offset, to=to,
                 chunk_start=chunk.start_offset if chunk is not None else None, client=ctx.client_id,
                 api_version=ctx.api_version)
        return pd

    def _ignored_redirect(self, ctx, topic: str, idx: int, offset: int) -> bool:
        """The same connection asks again for the offset we redirected: its client stays with
        the leader (or could not reach the replica), so read for it instead."""
        if ctx.connection is None:
            return False
        seen = self._redirected.get(ctx.connection)
        last = seen.get((topic, idx)) if seen else None
        return last is not None and last[0] == offset and time.monotonic() - last[1] < IGNORED_REDIRECT_WINDOW_S

    async def _proxy_read(self, ctx, x: _Proxy, req):
        """Read [offset, stop] from a replica of the chunk for a client that stays with us."""
        p = self.broker.replicas.get(x.topic, x.index)
        last_error = "no replica"
        for src in x.sources:
            try:
                client = await self.peers.get(src)
                version = min(client.version_for(FetchRequest.API_KEY), 12)
                freq = FetchRequest(
                    replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=max(x.max_bytes, 1),
                    isolation_level=req.isolation_level, session_id=0, session_epoch=-1,
                    topics=[FetchRequest.FetchTopic(topic=x.topic, partitions=[FetchRequest.FetchPartition(
                        partition=x.index, fetch_offset=x.offset, partition_max_bytes=x.max_bytes,
                        current_leader_epoch=-1, last_fetched_epoch=-1, log_start_offset=-1)])],
                    forgotten_topics_data=[], rack_id="",
                )
                resp = await client.request(freq, version, timeout=30)
            except ClientError as e:
                await self.peers.drop(src)
                last_error = str(e)
                continue
            got = resp.responses[0].partitions[0] if resp.responses and resp.responses[0].partitions else None
            if resp.error_code or got is None or got.error_code or got.preferred_read_replica >= 0:
                last_error = f"error {resp.error_code or (got.error_code if got else -1)}"
                continue
            pd = _pd(x.index)
            pd.records = got.records or b""
            pd.aborted_transactions = got.aborted_transactions
            pd.log_start_offset = got.log_start_offset
            if p is not None and p.is_leader:
                pd.high_watermark = p.high_watermark
                pd.last_stable_offset = _lso(p.log)
            else:
                pd.high_watermark, pd.last_stable_offset = got.high_watermark, got.last_stable_offset
            self.counts.proxied(_size(pd.records))
            log.info("chunk_proxy_read", topic=x.topic, partition=x.index, chunk_start=x.chunk.start_offset,
                     offset=x.offset, bytes=_size(pd.records), source=src, client=ctx.client_id,
                     api_version=ctx.api_version)
            return pd
        log.warning("chunk_proxy_failed", topic=x.topic, partition=x.index, chunk_start=x.chunk.start_offset,
                    offset=x.offset, sources=x.sources, error=last_error)
        return _error(x.index, Errors.NOT_LEADER_OR_FOLLOWER)

    def _local_covering(self, topic: str, idx: int, offset: int, *, inclusive_end: bool) -> ChunkReplica | None:
        """Our newest chunk replica whose [start, end] (end + 1 too if inclusive_end) holds offset."""
        found = None
        for cr in self.broker.replicas.chunks_of(topic, idx):
            if cr.start <= offset <= cr.end + (1 if inclusive_end else 0):
                found = cr
        return found

    # ---- ListOffsets
    def chunked(self, topic: str, idx: int) -> tuple[ChunkInfo, ...]:
        t = self.broker.metadata.image.topic(topic)
        return t.chunks.get(idx, ()) if t is not None else ()

    async def earliest(self, topic: str, idx: int) -> int | None:
        """The partition's earliest offset, from the oldest chunk that still holds readable data
        (retention may have taken the head of a chunk, or all of it); None: the active chunk's."""
        chunks = self.chunked(topic, idx)
        low = _low_watermark(chunks)
        for c in chunks:
            if c.stop_offset < low:
                continue  # DeleteRecords passed it: being dropped
            found = await self._ask_chunk(topic, idx, c, EARLIEST)
            if found is not None and found <= c.stop_offset:
                return max(found, c.first_offset, low)
        return None

    async def offset_for_timestamp(self, topic: str, idx: int, ts: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record at or after ts in the inactive chunks, oldest
        first, the way Kafka picks segments: a chunk whose largest timestamp is below ts is
        skipped, so timestamps need not grow across chunks. None: look in the active chunk."""
        for c in self.chunked(topic, idx):
            top = await self._chunk_max_timestamp(topic, idx, c)
            if top is not None and top < ts:
                continue
            found = await self._ask_chunk(topic, idx, c, ts, with_timestamp=True)
            if found is not None and found[0] <= c.stop_offset:
                return found
        return None

    async def _chunk_max_timestamp(self, topic: str, idx: int, c: ChunkInfo) -> int | None:
        key = (c.topic_id, c.partition, c.start_offset)
        top = self._chunk_max_ts.get(key)
        if top is None:
            found = await self._ask_chunk(topic, idx, c, MAX_TIMESTAMP, with_timestamp=True)
            if found is None:
                return None  # no replica answered: ask the chunk itself
            if len(self._chunk_max_ts) >= 4096:
                self._chunk_max_ts.clear()  # chunks of deleted topics must not pile up
            top = self._chunk_max_ts[key] = found[1]
        return top

    async def max_timestamp(self, topic: str, idx: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the record with the largest timestamp in the inactive chunks
        (the oldest chunk's on a tie, as Kafka answers the first such record); None: none."""
        best = None
        for c in self.chunked(topic, idx):
            found = await self._ask_chunk(topic, idx, c, MAX_TIMESTAMP, with_timestamp=True)
            if found is not None and found[1] >= 0 and (best is None or found[1] > best[1]):
                best = found
        return best

    def local_answer(self, topic: str, idx: int, ts: int):
        """A peer's chunk query (ListOffsets with replica_id = its id), from our chunk replicas:
        EARLIEST = the oldest one's log start; MAX_TIMESTAMP = the record with the largest
        timestamp of the oldest chunk holding it; a timestamp = the first record at or after it in
        [start, stop] of each, oldest first. None when we hold nothing of the partition."""
        mine = [cr for cr in self.broker.replicas.chunks_of(topic, idx) if cr.log.log_start_offset <= cr.stop]
        if not mine:
            return None
        if ts == EARLIEST:
            return mine[0].log.log_start_offset, -1
        if ts == MAX_TIMESTAMP:
            best = (-1, -1)
            for cr in mine:
                t, off = cr.log.max_timestamp()
                if t > best[1]:
                    best = (off, t)
            return best
        for cr in mine:
            hit = cr.log.offset_for_timestamp(ts)
            if hit is not None and hit[0] <= cr.stop:
                return hit
        return -1, -1

    async def _ask_chunk(self, topic: str, idx: int, c: ChunkInfo, ts: int, *, with_timestamp: bool = False):
        cr = self.broker.replicas.chunks.get((topic, idx, c.start_offset))
        if cr is not None and cr.complete:
            if ts == EARLIEST:
                return cr.log.log_start_offset
            if ts == MAX_TIMESTAMP:
                t, off = cr.log.max_timestamp()
                return (off, t) if t >= 0 else None
            hit = cr.log.offset_for_timestamp(ts)
            return hit if hit is not None else None
        L = ListOffsetsRequest
        sources = hash_order([b for b in c.isr if b != self.node_id and self.peers.live(b)],
                             topic, idx, c.start_offset, self.node_id)
        for src in sources:
            try:
                client = await self.peers.get(src)
                req = L(replica_id=self.node_id, isolation_level=0, topics=[L.ListOffsetsTopic(
                    name=topic, partitions=[L.ListOffsetsPartition(partition_index=idx, timestamp=ts,
                                                                   current_leader_epoch=-1)])])
                resp = await client.request(req, timeout=10)
            except ClientError:
                await self.peers.drop(src)
                continue
            got = resp.topics[0].partitions[0] if resp.topics and resp.topics[0].partitions else None
            if got is None or got.error_code:
                continue
            if got.offset < 0:
                return None
            return (got.offset, got.timestamp) if with_timestamp else got.offset
        return None


class _ProxyMarker:
    pass


_PROXY = _ProxyMarker()


def _pd(idx: int):
    return R.PartitionData(partition_index=idx, high_watermark=-1, last_stable_offset=-1, log_start_offset=-1,
                           records=b"")


def _error(idx: int, code: int):
    pd = _pd(idx)
    pd.error_code = code
    return pd


def _size(records) -> int:
    if not records:
        return 0
    if isinstance(records, list):
        return sum(len(x) for x in records)
    return len(records)


def _lso(lg) -> int:
    lso = getattr(lg, "last_stable_offset", lg.high_watermark)
    return lso() if callable(lso) else lso


def _same_start(chunks: tuple[ChunkInfo, ...], start: int) -> ChunkInfo | None:
    return next((c for c in chunks if c.start_offset == start), None)


def _low_watermark(chunks: tuple[ChunkInfo, ...]) -> int:
    """The partition's log start offset as DeleteRecords set it inside an inactive chunk, else -1."""
    return max((c.log_start_offset for c in chunks), default=-1)


def _chunk_holding(chunks: tuple[ChunkInfo, ...], offset: int) -> ChunkInfo | None:
    for c in chunks:
        if c.start_offset <= offset <= c.stop_offset:
            return c
    return None
