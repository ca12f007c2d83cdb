"""What a log shows its cleaner: the inactive segments and offsets, taken together under the log's
lock (Kafka's LogToClean inputs). Both the log and the cleaner import these types, so the imports
point one way: cleaner -> log -> cleaner_view."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from broker.storage.config import LogConfig
from broker.storage.segment import LogSegment


@dataclass(frozen=True)
class SegmentInfo:
    """One inactive segment as seen under the log's lock."""

    segment: LogSegment
    base_offset: int
    next_base: int  # base offset of the segment after it
    next_offset: int  # one past its last batch
    size: int
    path: Path
    largest_timestamp: int
    first_batch_timestamp: int
    offset_index_bytes: int
    time_index_bytes: int

    @classmethod
    def of(cls, seg: LogSegment, next_base: int) -> SegmentInfo:
        return cls(
            seg,
            seg.base_offset,
            next_base,
            seg.next_offset,
            seg.size,
            seg.log_path,
            seg.largest_timestamp(),
            seg.first_batch_timestamp,
            seg.offset_index.size_bytes,
            seg.time_index.size_bytes,
        )

    def still_current(self, seg: LogSegment) -> bool:
        return seg is self.segment and seg.size == self.size and seg.next_offset == self.next_offset


@dataclass(frozen=True)
class CleanerView:
    """Log.cleaner_view(): inactive segments and offsets, taken together under the log's lock."""

    segments: list[SegmentInfo]
    active_base: int
    log_start: int
    high_watermark: int
    log_end: int
    producer_last_offsets: dict[int, int]  # producer id -> last offset of its last data batch
    config: LogConfig
    first_unstable_offset: int = -1  # first offset of the oldest open transaction, -1 if none


__all__ = ["CleanerView", "SegmentInfo"]
