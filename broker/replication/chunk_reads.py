"""Reads of inactive chunks: what the views of broker/partitions/chunk_views.py use to serve a
Fetch or ListOffsets for an offset below the active chunk.

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
the chunk holding it, or to the active chunk's leader. The partition router
(broker/partitions/router.py) makes these choices; this module keeps what they share: the
connections to the chunks' replicas, which connection was redirected where, the read counts,
and the partition's offsets across its inactive chunks (earliest, by time, max timestamp), asked
of a replica of each chunk with a ListOffsets whose replica_id is this broker's id.

Every consumer read served from chunk data logs `chunk_read` (which broker served which offsets:
tests and operators can follow reads across chunks); redirects and proxied reads log too.
"""

from __future__ import annotations

import time
import weakref

from broker.metrics import ChunkReadCounts
from broker.ports import ImageSource
from broker.replication.hosted import HostedReplicas
from broker.replication.peers import PeerClients
from metadata.image import ChunkInfo
from metadata.read_replicas import hash_order
from node.client import ClientError
from protocol.generated.list_offsets import ListOffsetsRequest

REDIRECT_MIN_VERSION = 11  # Fetch v11 added preferred_read_replica (KIP-392)
IGNORED_REDIRECT_WINDOW_S = 30.0  # the same offset asked again this soon: the client did not follow
EARLIEST = -2
MAX_TIMESTAMP = -3


class ChunkReads:
    def __init__(self, node_id: int, images: ImageSource, hosted: HostedReplicas, peers: PeerClients) -> None:
        """`peers`: connections to the chunks' replicas (closed by close())."""
        self.node_id = node_id
        self.images = images
        self.hosted = hosted
        self.peers = peers
        # (topic id, partition, chunk start) -> the chunk's largest timestamp: inactive chunks are
        # immutable, so it is asked once (retention only lowers it, which costs a needless ask)
        self._chunk_max_ts: dict[tuple, int] = {}
        # connection -> {(topic, partition): (offset redirected, when)}
        self._redirected: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.counts = ChunkReadCounts()  # read by /metrics

    async def close(self) -> None:
        await self.peers.close()

    # ---- Fetch
    def sources(self, topic: str, idx: int, c: ChunkInfo, client_id: str, rack: str | None) -> list[int]:
        """The live in-sync replicas of chunk `c` a reader may go to, best first: a stable hash of
        (topic, partition, chunk start, client id), those in the reader's rack first."""
        live = [b for b in c.isr if b != self.node_id and self.peers.live(b)]
        return self._rack_first(hash_order(live, topic, idx, c.start_offset, client_id), rack)

    def _rack_first(self, brokers: list[int], rack: str | None) -> list[int]:
        """`brokers` in the same order, those in `rack` first (no rack: unchanged)."""
        if not rack:
            return brokers
        known = self.images.image.brokers
        local = [b for b in brokers if b in known and known[b].rack == rack]
        return local + [b for b in brokers if b not in local]

    def redirected(self, connection: object, topic: str, idx: int, offset: int) -> None:
        """The reader on `connection` was sent elsewhere for `offset`."""
        seen = self._redirected.setdefault(connection, {})
        seen[(topic, idx)] = (offset, time.monotonic())

    def ignored_redirect(self, connection: object | None, topic: str, idx: int, offset: int) -> bool:
        """The same connection asks again for the offset we redirected: its client stays with
        the leader (or could not reach the replica), so read for it instead."""
        if connection is None:
            return False
        seen = self._redirected.get(connection)
        last = seen.get((topic, idx)) if seen else None
        return last is not None and last[0] == offset and time.monotonic() - last[1] < IGNORED_REDIRECT_WINDOW_S

    # ---- ListOffsets
    def chunked(self, topic: str, idx: int) -> tuple[ChunkInfo, ...]:
        t = self.images.image.topic(topic)
        return t.chunks.get(idx, ()) if t is not None else ()

    async def earliest(self, topic: str, idx: int) -> int | None:
        """The partition's earliest offset, from the oldest chunk that still holds readable data
        (retention may have taken the head of a chunk, or all of it); None: the active chunk's."""
        chunks = self.chunked(topic, idx)
        low = low_watermark(chunks)
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

    async def _ask_chunk(self, topic: str, idx: int, c: ChunkInfo, ts: int, *, with_timestamp: bool = False):
        cr = self.hosted.chunks.get((topic, idx, c.start_offset))
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


def low_watermark(chunks: tuple[ChunkInfo, ...]) -> int:
    """The partition's log start offset as DeleteRecords set it inside an inactive chunk, else -1."""
    return max((c.log_start_offset for c in chunks), default=-1)


def chunk_holding(chunks: tuple[ChunkInfo, ...], offset: int) -> ChunkInfo | None:
    """The inactive chunk whose [start, stop] holds `offset`."""
    for c in chunks:
        if c.start_offset <= offset <= c.stop_offset:
            return c
    return None
