"""What a reader needs to know about a Strata cluster, fetched synchronously: brokers, each
partition's chunks (inactive ones with their replicas, the active one with its leader), and
offsets (earliest, latest or last stable, by timestamp).

Spark calls the source from plain threads and worker processes, so every call here runs its own
short-lived event loop over node/client.py connections.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterable
from dataclasses import dataclass
from uuid import UUID

from metadata.read_replicas import hash_order
from node.client import ClientError, NodeClient
from protocol.generated.list_offsets import ListOffsetsRequest
from protocol.generated.metadata import MetadataRequest

EARLIEST, LATEST = -2, -1
READ_UNCOMMITTED, READ_COMMITTED = 0, 1


class SourceError(Exception):
    """The cluster cannot answer what the reader asks (unknown topic, no live broker, ...)."""


@dataclass(frozen=True)
class ChunkView:
    """A contiguous offset range of a partition and the brokers that serve it: an inactive chunk
    ([start, stop], any replica), or the active chunk (from start on, its leader first)."""

    start: int
    stop: int | None  # last readable offset (inclusive); None for the active chunk
    brokers: tuple[int, ...]
    active: bool

    def read_order(self, topic: str, partition: int, client_id: str) -> list[int]:
        """The brokers to read this chunk from, in order: the active chunk's leader first; an
        inactive chunk's replicas in an order hashed from the chunk and the client (readers
        spread over the replicas, each one asking the same replica first every time)."""
        if self.active:
            return [b for b in self.brokers if b >= 0]
        return hash_order(sorted(self.brokers), topic, partition, self.start, client_id)


@dataclass(frozen=True)
class PartitionView:
    topic: str
    partition: int
    leader: int
    chunks: tuple[ChunkView, ...]  # oldest first, the active chunk last

    def chunk_for(self, offset: int) -> ChunkView:
        for c in self.chunks:
            if not c.active and c.start <= offset <= c.stop:  # type: ignore[operator]
                return c
        return self.chunks[-1]


def parse_bootstrap(value: str) -> list[tuple[str, int]]:
    out = []
    for item in value.split(","):
        host, _, port = item.strip().rpartition(":")
        if not host or not port.isdigit():
            raise SourceError(f"kafka.bootstrap.servers: {item.strip()!r} is not host:port")
        out.append((host, int(port)))
    if not out:
        raise SourceError("kafka.bootstrap.servers is empty")
    return out


def run(coro):
    """Run one coroutine on a fresh event loop (the caller is synchronous Spark code)."""
    return asyncio.run(coro)


class ClusterView:
    """A snapshot of the cluster's metadata, taken from the first bootstrap server that answers."""

    def __init__(self, brokers: dict[int, tuple[str, int]], partitions: dict[tuple[str, int], PartitionView],
                 topic_ids: dict[str, UUID] | None = None) -> None:
        self.brokers = brokers
        self.partitions = partitions
        self.topic_ids = topic_ids or {}

    @classmethod
    def load(cls, bootstrap: list[tuple[str, int]], timeout: float = 30.0) -> ClusterView:
        return run(cls._load(bootstrap, timeout))

    @classmethod
    async def _load(cls, bootstrap: list[tuple[str, int]], timeout: float) -> ClusterView:
        errors = []
        for host, port in bootstrap:
            try:
                async with NodeClient(host, port, client_id="strata-spark", timeout=timeout) as c:
                    resp = await c.request(MetadataRequest(topics=None, allow_auto_topic_creation=False))
            except (ClientError, OSError) as e:
                errors.append(str(e))
                continue
            brokers = {b.node_id: (b.host, b.port) for b in resp.brokers}
            parts = {}
            ids = {}
            for t in resp.topics:
                if t.error_code or t.name is None:
                    continue
                ids[t.name] = t.topic_id
                for p in t.partitions:
                    chunks = [
                        ChunkView(c.start_offset, c.stop_offset, tuple(c.isr_nodes or c.replica_nodes), False)
                        for c in sorted(p.chunks or (), key=lambda c: c.start_offset)
                    ]
                    active_start = max(p.start_offset, 0)
                    leader_first = (p.leader_id, *[r for r in p.replica_nodes if r != p.leader_id])
                    chunks.append(ChunkView(active_start, None, leader_first, True))
                    parts[(t.name, p.partition_index)] = PartitionView(t.name, p.partition_index, p.leader_id, tuple(chunks))
            return cls(brokers, parts, ids)
        raise SourceError(f"no bootstrap server answered Metadata: {'; '.join(errors)}")

    def topics(self) -> set[str]:
        return {t for t, _ in self.partitions}

    def select(self, subscribe: str | None, pattern: str | None, assign: dict[str, list[int]] | None) -> list[PartitionView]:
        """The partitions a subscribe / subscribePattern / assign option names, sorted."""
        if assign is not None:
            out = []
            for topic, idxs in assign.items():
                for i in idxs:
                    pv = self.partitions.get((topic, i))
                    if pv is None:
                        raise SourceError(f"assign: {topic}-{i} does not exist")
                    out.append(pv)
        elif pattern is not None:
            rx = re.compile(pattern)
            out = [pv for (t, _), pv in self.partitions.items() if rx.fullmatch(t) and not t.startswith("__")]
        else:
            names = [n.strip() for n in (subscribe or "").split(",") if n.strip()]
            missing = [n for n in names if n not in self.topics()]
            if missing:
                raise SourceError(f"subscribe: unknown topic(s) {', '.join(missing)}")
            out = [pv for (t, _), pv in self.partitions.items() if t in names]
        return sorted(out, key=lambda pv: (pv.topic, pv.partition))

    def list_offsets(self, parts: Iterable[PartitionView], spec: dict[tuple[str, int], int],
                     isolation: int, timeout: float = 30.0) -> dict[tuple[str, int], int]:
        """ListOffsets to each partition's leader: spec maps (topic, partition) to EARLIEST,
        LATEST (the last stable offset under read_committed) or a timestamp (ms). A timestamp past
        every record answers the latest offset, as Spark's source does."""
        return run(self._list_offsets(list(parts), spec, isolation, timeout))

    async def _list_offsets(self, parts: list[PartitionView], spec: dict, isolation: int, timeout: float) -> dict:
        by_leader: dict[int, list[PartitionView]] = {}
        for pv in parts:
            if pv.leader < 0:
                raise SourceError(f"{pv.topic}-{pv.partition} has no leader")
            by_leader.setdefault(pv.leader, []).append(pv)
        out: dict[tuple[str, int], int] = {}
        R = ListOffsetsRequest
        for leader, pvs in by_leader.items():
            host, port = self.brokers[leader]
            topics: dict[str, list] = {}
            for pv in pvs:
                topics.setdefault(pv.topic, []).append(
                    R.ListOffsetsPartition(partition_index=pv.partition, timestamp=spec[(pv.topic, pv.partition)],
                                           current_leader_epoch=-1))
            req = R(replica_id=-1, isolation_level=isolation,
                    topics=[R.ListOffsetsTopic(name=t, partitions=ps) for t, ps in topics.items()])
            async with NodeClient(host, port, client_id="strata-spark", timeout=timeout) as c:
                resp = await c.request(req)
            late = []
            for t in resp.topics:
                for p in t.partitions:
                    if p.error_code:
                        raise SourceError(f"ListOffsets {t.name}-{p.partition_index}: error {p.error_code}")
                    if p.offset < 0:
                        late.append(self.partitions[(t.name, p.partition_index)])
                    else:
                        out[(t.name, p.partition_index)] = p.offset
            if late:  # no record at or after the timestamp: start at the end
                out.update(await self._list_offsets(late, {(pv.topic, pv.partition): LATEST for pv in late},
                                                    isolation, timeout))
        return out
