"""Which segments a retention pass deletes, as Kafka's UnifiedLog.deleteOldSegments decides it.

Three rules, in Kafka's order, each a predicate over the segments oldest first (the log deletes
the run of segments for which it holds, LocalLog.deletable_count):

- the log start offset (always): a segment wholly below it, never the last one (Kafka's
  deleteLogStartOffsetBreachedSegments needs a next segment);
- retention.bytes (cleanup.policy with "delete"): the oldest segments while the log stays at or
  above retention.bytes without them (deleteRetentionSizeBreachedSegments), the active one too;
- retention.ms (cleanup.policy with "delete", -1 = forever): a segment whose newest timestamp is
  older than retention.ms (deleteRetentionMsBreachedSegments), the active one too.

Every rule stops at the high watermark (a segment is deletable only if the offset after it, the
next segment's base or the log end for the last, is at or below it), and an empty last segment
is never deletable (so it is never deleted and re-created). When every segment is deletable, the
log rolls a new empty active segment first (UnifiedLog.deleteSegments: "we must always have at
least one segment"), so an idle partition's data expires and its log start reaches its log end.

max.compaction.lag.ms (KIP-354): Kafka rolls a compacted log's active segment once its first
batch is older than min(segment.ms, max.compaction.lag.ms) (LogConfig.maxSegmentMs), checked on
append; `compaction_roll_due` lets the retention check roll an idle log's dirty active segment
the same way, so the cleaner (which never cleans the active segment) gets it in time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from broker.storage.config import LogConfig
from broker.storage.segment import LogSegment

# (segment, base offset of the next segment or None for the last one) -> delete it?
Predicate = Callable[[LogSegment, int | None], bool]


def retention_rules(
    cfg: LogConfig, now_ms: int, delete_policy: bool, log_start: Callable[[], int], size: Callable[[], int]
) -> Iterator[tuple[str, Predicate]]:
    """(reason, predicate) per rule, lazily: each is built after the previous rule's deletions,
    as Kafka computes the size excess after the log start rule has run."""
    yield "log start offset", below_log_start(log_start)
    if not delete_policy:
        return
    if cfg.retention_bytes >= 0:
        excess = size() - cfg.retention_bytes

        def over_size(seg: LogSegment, next_base: int | None) -> bool:
            nonlocal excess
            if excess - seg.size < 0:
                return False
            excess -= seg.size
            return True

        if excess >= 0:
            yield "retention.bytes", over_size
    if cfg.retention_ms >= 0:
        yield "retention.ms", lambda seg, next_base: now_ms - seg.largest_timestamp() > cfg.retention_ms


def below_log_start(log_start: Callable[[], int]) -> Predicate:
    """A segment wholly below the log start offset, never the last one."""
    return lambda seg, next_base: next_base is not None and next_base <= log_start()


def compaction_roll_due(active: LogSegment, max_compaction_lag_ms: int, now_ms: int) -> bool:
    """A compacted log's active segment holds data whose first batch is older than
    max.compaction.lag.ms: roll it so the cleaner may clean it (LogConfig.maxSegmentMs)."""
    first = active.first_batch_timestamp
    return active.size > 0 and first >= 0 and now_ms - first > max_compaction_lag_ms


__all__ = ["Predicate", "below_log_start", "compaction_roll_due", "retention_rules"]
