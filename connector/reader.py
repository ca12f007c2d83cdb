"""A chunk-aware reader of one partition's offset range, in plain Python (no Spark).

It reads the cluster's Metadata (the chunk fields are tagged fields of the partition entry) and
goes straight to the brokers holding each part of the range: for an inactive chunk, one of its
in-sync replicas chosen by a stable hash of (topic, partition, chunk start, client id), falling
back to the others; for the active chunk, its leader. So the old data of a partition stays
readable while the active chunk's leader is down, and readers of an old chunk spread over its
replicas.

    reader = ChunkReader("127.0.0.1:9092")
    for rec in reader.read("orders", 0, 0, 1000):
        print(rec.offset, rec.value)

Records come decoded (protocol.records); control batches are left out, and under read_committed
so are the records of aborted transactions.
"""

from __future__ import annotations

import asyncio
import struct
import time
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from node.client import ClientError, NodeClient
from protocol.errors import ProtocolError
from protocol.generated.fetch import FetchRequest
from protocol.generated.metadata import MetadataRequest
from protocol.records import Record, decode_batches
from protocol.records.control import CONTROL_ABORT

FETCH_VERSION = 12  # topic names, last stable offset, aborted transactions, preferred read replica
READ_UNCOMMITTED, READ_COMMITTED = 0, 1
ACTIVE = None  # stop offset of the active chunk: it has none yet


class ReaderError(Exception):
    """The range cannot be read: unknown topic, or no broker holding a part of it answers."""


@dataclass(frozen=True)
class ChunkSpan:
    """Part of a partition's offsets and who serves it: an inactive chunk [start, stop] (its
    in-sync replicas), or the active chunk from start on (its leader)."""

    start: int
    stop: int | None
    brokers: tuple[int, ...]

    def holds(self, offset: int) -> bool:
        return self.start <= offset and (self.stop is None or offset <= self.stop)


def hash_order(brokers: Sequence[int], *key: object) -> list[int]:
    """`brokers` rotated to start at one chosen by a stable hash of `key` (the same in every
    process: readers of one chunk spread over its replicas, each keeps to its own)."""
    if not brokers:
        return []
    i = zlib.crc32(repr(key).encode()) % len(brokers)
    return [*brokers[i:], *brokers[:i]]


def parse_bootstrap(value: str | Sequence[tuple[str, int]]) -> list[tuple[str, int]]:
    if not isinstance(value, str):
        return list(value)
    out = []
    for item in value.split(","):
        host, _, port = item.strip().rpartition(":")
        if not host or not port.isdigit():
            raise ReaderError(f"bootstrap server {item.strip()!r} is not host:port")
        out.append((host, int(port)))
    if not out:
        raise ReaderError("no bootstrap servers")
    return out


class ChunkReader:
    def __init__(
        self,
        bootstrap: str | Sequence[tuple[str, int]],
        *,
        client_id: str = "strata-reader",
        isolation_level: int = READ_UNCOMMITTED,
        max_bytes: int = 4 << 20,
        timeout: float = 10.0,
    ) -> None:
        self.bootstrap = parse_bootstrap(bootstrap)
        self.client_id = client_id
        self.isolation_level = isolation_level
        self.max_bytes = max_bytes
        self.timeout = timeout
        self.served_by: dict[int, int] = {}  # broker id -> records it served

    # ---- public, synchronous
    def read(self, topic: str, partition: int, start: int, end: int) -> Iterator[Record]:
        """Every record of [start, end) in offset order (all of it is read before the first is
        returned: keep ranges to what fits in memory)."""
        return iter(asyncio.run(self.read_async(topic, partition, start, end)))

    def spans(self, topic: str, partition: int) -> list[ChunkSpan]:
        return asyncio.run(self._spans(topic, partition))[1]

    # ---- public, async
    async def read_async(self, topic: str, partition: int, start: int, end: int) -> list[Record]:
        addresses, spans = await self._spans(topic, partition)
        out: list[Record] = []
        offset = start
        clients: dict[int, NodeClient] = {}
        try:
            while offset < end:
                span = next((s for s in spans if s.holds(offset)), None)
                if span is None:
                    raise ReaderError(f"offset {offset} of {topic}-{partition} is in no chunk (deleted?)")
                upto = end if span.stop is None else min(end, span.stop + 1)
                order = span.brokers if span.stop is None else hash_order(
                    span.brokers, topic, partition, span.start, self.client_id)
                offset = await self._read_span(clients, addresses, topic, partition, offset, upto, order, out)
        finally:
            for c in clients.values():
                await c.close()
        return out

    # ---- internals
    async def _spans(self, topic: str, partition: int) -> tuple[dict[int, tuple[str, int]], list[ChunkSpan]]:
        errors = []
        for host, port in self.bootstrap:
            try:
                async with NodeClient(host, port, client_id=self.client_id, timeout=self.timeout) as c:
                    resp = await c.request(MetadataRequest(
                        topics=[MetadataRequest.MetadataRequestTopic(name=topic)], allow_auto_topic_creation=False))
            except (ClientError, OSError) as e:
                errors.append(f"{host}:{port}: {e}")
                continue
            addresses = {b.node_id: (b.host, b.port) for b in resp.brokers}
            t = resp.topics[0] if resp.topics else None
            if t is None or t.error_code:
                raise ReaderError(f"topic {topic}: error {t.error_code if t else 'missing'}")
            p = next((x for x in t.partitions if x.partition_index == partition), None)
            if p is None:
                raise ReaderError(f"{topic} has no partition {partition}")
            spans = [ChunkSpan(c.start_offset, c.stop_offset, tuple(c.isr_nodes or c.replica_nodes))
                     for c in sorted(p.chunks or (), key=lambda c: c.start_offset)]
            spans.append(ChunkSpan(max(p.start_offset, 0), ACTIVE, (p.leader_id,) if p.leader_id >= 0 else ()))
            return addresses, spans
        raise ReaderError(f"no bootstrap server answered Metadata: {'; '.join(errors)}")

    async def _read_span(self, clients: dict, addresses: dict, topic: str, partition: int, offset: int, upto: int,
                         order: list[int], out: list[Record]) -> int:
        """Read [offset, upto) from the first broker of `order` that serves it, going on from
        where a failing one stopped; returns upto."""
        errors = []
        aborted: dict[int, int] = {}  # producer id -> first offset of its aborted transaction
        for broker in order:
            if offset >= upto:
                break
            if broker not in addresses:
                errors.append(f"broker {broker}: not alive")
                continue
            try:
                c = clients.get(broker)
                if c is None or not c.connected:
                    c = clients[broker] = await NodeClient(*addresses[broker], client_id=self.client_id,
                                                           timeout=self.timeout).connect()
                stalled_since = time.monotonic()
                while offset < upto:
                    pd = await self._fetch(c, topic, partition, offset)
                    if pd.error_code:
                        raise ReaderError(f"error {pd.error_code} at offset {offset}")
                    for a in pd.aborted_transactions or ():
                        aborted.setdefault(a.producer_id, a.first_offset)
                    nxt = self._take(pd.records, offset, upto, aborted, out, broker)
                    if nxt > offset:
                        offset, stalled_since = nxt, time.monotonic()
                    elif time.monotonic() - stalled_since > self.timeout:
                        raise ReaderError(f"no data at offset {offset} for {self.timeout:.0f}s")
            except (ClientError, ReaderError, ProtocolError, OSError) as e:
                errors.append(f"broker {broker}: {e}")
                stale = clients.pop(broker, None)
                if stale is not None:
                    await stale.close()
        if offset < upto:
            raise ReaderError(f"cannot read {topic}-{partition} [{offset}, {upto}) from brokers {order}: "
                              + "; ".join(errors))
        return upto

    async def _fetch(self, c: NodeClient, topic: str, partition: int, offset: int):
        F = FetchRequest
        req = F(replica_id=-1, max_wait_ms=200, min_bytes=1, max_bytes=self.max_bytes,
                isolation_level=self.isolation_level, session_id=0, session_epoch=-1,
                topics=[F.FetchTopic(topic=topic, partitions=[F.FetchPartition(
                    partition=partition, fetch_offset=offset, partition_max_bytes=self.max_bytes,
                    current_leader_epoch=-1, last_fetched_epoch=-1, log_start_offset=-1)])],
                forgotten_topics_data=[], rack_id="")
        resp = await c.request(req, min(FETCH_VERSION, c.version_for(F.API_KEY)))
        if resp.error_code or not resp.responses or not resp.responses[0].partitions:
            raise ReaderError(f"fetch error {resp.error_code}")
        return resp.responses[0].partitions[0]

    def _take(self, records, offset: int, upto: int, aborted: dict[int, int], out: list[Record], broker: int) -> int:
        """Append the records of [offset, upto) in `records`; returns the next offset to fetch."""
        if not records:
            return offset
        data = b"".join(bytes(x) for x in records) if isinstance(records, list) else records
        nxt = offset
        for batch in decode_batches(data):
            h = batch.header
            if h.last_offset < offset:
                continue
            if h.base_offset >= upto:
                break
            nxt = min(h.last_offset + 1, upto)
            if h.is_control:
                if _is_abort_marker(batch):
                    aborted.pop(h.producer_id, None)  # the aborted transaction ends here
                continue
            if h.is_transactional and self.isolation_level == READ_COMMITTED:
                first = aborted.get(h.producer_id)
                if first is not None and first <= h.last_offset:
                    continue
            for r in batch.records:
                if offset <= r.offset < upto:
                    out.append(r)
                    self.served_by[broker] = self.served_by.get(broker, 0) + 1
        return nxt


def _is_abort_marker(batch) -> bool:
    """A control batch whose record key is (version, type ABORT)."""
    key = batch.records[0].key if batch.records else None
    return key is not None and len(key) >= 4 and struct.unpack_from(">hh", key)[1] == CONTROL_ABORT


__all__ = ["ChunkReader", "ChunkSpan", "ReaderError", "hash_order", "READ_COMMITTED", "READ_UNCOMMITTED"]
