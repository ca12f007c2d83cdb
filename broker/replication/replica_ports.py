"""What the replica manager tells its collaborators, as small structural interfaces: the follower
fetchers, the chunk copier, the ISR manager and the dir assigner. The composition root hands it the
real ones; a test hands it fakes that record the calls, with no process and no socket."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol
from uuid import UUID

if TYPE_CHECKING:
    from broker.replication.chunk_replica import ChunkReplica
    from broker.replication.partition import Partition
    from metadata.image import ChunkInfo


class FollowerFetchers(Protocol):
    """Follower replication of the active chunk (fetcher.py's ReplicaFetcherManager)."""

    def follow(self, p: Partition, leader_id: int) -> None: ...

    def settle(self, p: Partition) -> None:
        """Wait for an append of `p` under way, before its role changes."""

    def unfollow(self, p: Partition) -> None: ...


class ChunkCopies(Protocol):
    """Copies of chunk ranges a replica lacks, and its reports to the controller (chunk_fetcher.py)."""

    def copy_chunk(self, cr: ChunkReplica) -> None: ...

    def fill_prefix(self, p: Partition, required_end: int) -> None: ...

    def report_leaving(self, topic: str, index: int, info: ChunkInfo) -> None: ...

    def cancel(self, topic: str, index: int, start: int) -> None: ...


class IsrChanges(Protocol):
    """A leader's ISR expansions (isr.py): told when a follower caught up to the high watermark."""

    def follower_caught_up(self, p: Partition, replica_id: int) -> None: ...


class DirReports(Protocol):
    """Where each replica lives, told to the controller (KIP-858's AssignReplicasToDirs)."""

    def report(self, topic_id: UUID, partition: int, chunk_start: int, dir_id: UUID) -> None: ...
