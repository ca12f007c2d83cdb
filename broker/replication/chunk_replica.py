"""One replica of an inactive chunk on this broker: a closed, immutable range of a partition's
offsets in its own log dir. No leader: every replica holding the whole range serves it.

Offsets (the contract, Kafka's terms): [start, stop] is what consumers read, [start, end] what
the replicas hold (end >= stop; the part past stop is a transaction still open when the chunk
was cut, which the next chunk holds too). A replica missing part of [start, end] copies it from
another replica (chunk_fetcher.py), then reports that it caught up.
"""

from __future__ import annotations

import structlog

from broker.storage.errors import StorageError
from broker.storage.log import Log
from metadata.image import ChunkInfo

log = structlog.get_logger(__name__)


class ChunkReplica:
    def __init__(self, topic: str, info: ChunkInfo, log_: Log, node_id: int) -> None:
        self.topic = topic
        self.index = info.partition
        self.start = info.start_offset
        self.topic_id = info.topic_id
        self.log = log_
        self.node_id = node_id
        self.info = info
        self.closed = False  # deleted or closed: its copy task stops
        self.leaving = False  # retention removed its whole range: LeavingBrokerId sent
        self.swapping = False  # a move between log dirs swaps the log

    def __repr__(self) -> str:
        return f"ChunkReplica({self.topic}-{self.index}@{self.start}, leo={self.log.log_end_offset})"

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.topic, self.index, self.start)

    @property
    def stop(self) -> int:
        return self.info.stop_offset

    @property
    def end(self) -> int:
        return self.info.end_offset

    @property
    def complete(self) -> bool:
        """Holds every offset of [log start, end] (retention may have taken the oldest part)."""
        return self.log.log_end_offset > self.end

    @property
    def in_isr(self) -> bool:
        return self.node_id in self.info.isr

    @property
    def read_end(self) -> int:
        """Exclusive end of what consumers may read here: stop + 1, or less while copying."""
        return min(self.stop + 1, self.log.log_end_offset)

    @property
    def data_gone(self) -> bool:
        """Retention (or DeleteRecords) removed every offset of the chunk this replica held."""
        return self.log.log_start_offset > self.end

    def holds(self, offset: int) -> bool:
        """A consumer read at `offset` can be served here now."""
        return max(self.log.log_start_offset, self.info.first_offset) <= offset < self.read_end

    def update(self, info: ChunkInfo) -> None:
        self.info = info
        self.apply_log_start()

    def apply_log_start(self) -> None:
        """DeleteRecords cut into the chunk: raise this replica's log start to the chunk's once it
        holds that far (a replica still copying does it on a later call)."""
        want, lg = self.info.log_start_offset, self.log
        if want <= lg.log_start_offset or lg.high_watermark < want:
            return
        try:
            lg.delete_records_before(want)
        except StorageError as e:
            log.warning("chunk_log_start_failed", topic=self.topic, partition=self.index, chunk_start=self.start,
                        log_start_offset=want, error=str(e))

    def seal(self) -> None:
        """Make the log match the chunk: nothing past end (a former active replica may hold
        writes there that were never replicated), everything up to it committed."""
        lg = self.log
        if lg.log_end_offset > self.end + 1:
            log.info("chunk_replica_trimmed", topic=self.topic, partition=self.index, chunk_start=self.start,
                     from_offset=lg.log_end_offset, to_offset=self.end + 1)
            lg.truncate_to(self.end + 1)
        lg.update_high_watermark(self.end + 1)
