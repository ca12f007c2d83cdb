"""The replicas this broker serves right now, by key. The replica manager opens and closes them;
the ISR manager, the chunk copier, the chunk readers and the partition router look them up here,
so none of them needs the replica manager (which needs them)."""

from __future__ import annotations

from broker.replication.chunk_replica import ChunkReplica
from broker.replication.partition import Partition

Key = tuple[str, int, int]  # topic, partition, chunk start


class HostedReplicas:
    def __init__(self) -> None:
        self.partitions: dict[tuple[str, int], Partition] = {}  # active chunk replicas
        self.chunks: dict[Key, ChunkReplica] = {}  # inactive chunk replicas

    def get(self, topic: str, index: int) -> Partition | None:
        return self.partitions.get((topic, index))

    def replica(self, key: Key) -> Partition | ChunkReplica | None:
        """This broker's replica of a chunk: the active chunk's Partition or an inactive chunk's."""
        p = self.partitions.get(key[:2])
        if p is not None and p.log.chunk_start == key[2]:
            return p
        return self.chunks.get(key)

    def chunks_of(self, topic: str, index: int) -> list[ChunkReplica]:
        """This broker's replicas of the partition's inactive chunks, oldest first."""
        return sorted((cr for (t, i, _), cr in self.chunks.items() if t == topic and i == index), key=lambda c: c.start)
