"""Retention on one log, in-process: the retention cases of Kafka's UnifiedLogTest (deleteOldSegments
and its rules, broker/storage/retention.py), with the active segment deleted as Kafka deletes it."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.storage import Log, LogConfig
from broker.storage.cleaner import CleanerConfig, clean_log, plan_cleaning
from broker.storage.errors import OffsetOutOfRangeError
from broker.storage.retention import compaction_roll_due
from protocol.records import Record, decode_batches, encode_batch

NOW = 1_700_000_000_000


def batch(n: int = 3, ts: int = NOW) -> bytes:
    return encode_batch([Record(value=b"v" * 20, key=b"k%d" % i, timestamp=ts + i) for i in range(n)])


SEGMENT = 2 * len(batch())


def open_log(tmp_path: Path, now_ms: int = NOW, **cfg) -> Log:
    cfg.setdefault("segment_bytes", SEGMENT)
    cfg.setdefault("file_delete_delay_ms", 0)
    return Log.open(tmp_path / "orders-0-0", LogConfig(**cfg), now_ms=now_ms)


def filled(tmp_path: Path, *, replicated: bool = True, **cfg) -> Log:
    """Nine batches of three records, batch i at NOW + i*1000, two batches a segment: segments
    based at 0, 6, 12, 18 and the active one at 24 (one batch); epoch 0 from offset 0, epoch 1
    from offset 12. High watermark at the log end unless not `replicated`."""
    lg = open_log(tmp_path, **cfg)
    for i in range(9):
        lg.append_as_leader(batch(ts=NOW + i * 1000), 0 if i < 4 else 1, NOW)
    if replicated:
        lg.update_high_watermark(lg.log_end_offset)
    assert lg.segment_base_offsets == [0, 6, 12, 18, 24]
    return lg


def offsets(lg: Log) -> list[int]:
    info = lg.read(lg.log_start_offset, 1 << 20)
    return [r.offset for b in decode_batches(b"".join(bytes(p) for p in info.records)) for r in b.records]


def test_every_segment_expired_empties_the_log_with_one_fresh_active_segment(tmp_path):
    # UnifiedLogTest.testDeleteOldSegments: one segment left, the latest epoch starting at the log end
    lg = filled(tmp_path, retention_ms=10_000)
    assert lg.enforce_retention(NOW + 60_000) == 5
    assert lg.segment_base_offsets == [27]
    assert lg.log_start_offset == lg.log_end_offset == lg.high_watermark == 27
    assert lg.leader_epoch_cache.entries == [(1, 27)]
    assert offsets(lg) == []
    with pytest.raises(OffsetOutOfRangeError):
        lg.read(26, 100)
    # the log takes writes where it ended
    assert lg.append_as_leader(batch(), 2, NOW + 60_000).first_offset == 27
    lg.close()


def test_the_empty_last_segment_is_never_deleted_and_recreated(tmp_path):
    lg = filled(tmp_path, retention_ms=10_000)
    lg.enforce_retention(NOW + 60_000)
    fresh = lg._local.segments[-1]
    assert lg.enforce_retention(NOW + 10**9) == 0
    assert lg._local.segments == [fresh] and lg.segment_base_offsets == [27]
    lg.close()


def test_expired_and_unexpired_segments_mixed(tmp_path):
    # newest timestamps per segment: NOW+1002, +3002, +5002, +7002, +8002 (active)
    lg = filled(tmp_path, retention_ms=10_000)
    assert lg.enforce_retention(NOW + 13_500) == 2
    assert lg.segment_base_offsets == [12, 18, 24] and lg.log_start_offset == 12
    assert offsets(lg)[0] == 12
    assert lg.enforce_retention(NOW + 16_000) == 1  # +5002 expired, +7002 not yet
    assert lg.segment_base_offsets == [18, 24]
    assert lg.enforce_retention(NOW + 17_500) == 1  # +7002 expired; the active one (+8002) not yet
    assert lg.segment_base_offsets == [24] and offsets(lg) == [24, 25, 26]
    assert lg.enforce_retention(NOW + 18_003) == 1
    assert lg.segment_base_offsets == [27] and lg.log_start_offset == 27
    lg.close()


def test_an_expired_segment_above_the_high_watermark_is_kept(tmp_path):
    lg = filled(tmp_path, replicated=False, retention_ms=1)
    assert lg.enforce_retention(NOW + 10**9) == 0  # no high watermark yet: nothing may go
    lg.update_high_watermark(13)
    assert lg.enforce_retention(NOW + 10**9) == 2  # the segment holding offset 13 stays
    assert lg.segment_base_offsets == [12, 18, 24] and lg.log_start_offset == 12
    lg.update_high_watermark(26)  # the active segment's last record is not committed
    assert lg.enforce_retention(NOW + 10**9) == 2
    assert lg.segment_base_offsets == [24] and offsets(lg) == [24, 25, 26]
    lg.update_high_watermark(27)
    assert lg.enforce_retention(NOW + 10**9) == 1
    assert lg.log_start_offset == 27
    lg.close()


def test_retention_ms_minus_one_keeps_everything(tmp_path):
    lg = filled(tmp_path, retention_ms=-1)
    assert lg.enforce_retention(NOW + 10**12) == 0
    assert lg.segment_base_offsets == [0, 6, 12, 18, 24] and offsets(lg) == list(range(27))
    lg.close()


def test_compact_only_log_keeps_its_active_segment(tmp_path):
    lg = filled(tmp_path, retention_ms=1, retention_bytes=0)
    assert lg.enforce_retention(NOW + 10**9, delete_policy=False) == 0
    assert lg.segment_base_offsets == [0, 6, 12, 18, 24]
    lg.close()


def test_retention_bytes_takes_the_active_segment_too_as_kafka(tmp_path):
    # deleteRetentionSizeBreachedSegments counts every segment, the active one included
    lg = filled(tmp_path, retention_ms=-1, retention_bytes=0)
    assert lg.enforce_retention(NOW) == 5
    assert lg.segment_base_offsets == [27] and lg.size_bytes == 0
    lg.close()


def test_retention_after_a_restart(tmp_path):
    lg = filled(tmp_path, retention_ms=10_000)
    lg.close()
    lg = open_log(tmp_path, NOW + 60_000, retention_ms=10_000)
    assert lg.high_watermark == 27  # the checkpointed high watermark bounds retention after a restart
    assert lg.enforce_retention(NOW + 60_000) == 5
    lg.close()
    lg = open_log(tmp_path, NOW + 70_000, retention_ms=10_000)
    assert lg.segment_base_offsets == [27]
    assert lg.log_start_offset == lg.log_end_offset == 27
    # as Kafka's loader (truncateFromEnd at the log end), an epoch starting at the log end is
    # dropped at reopen; the leader assigns its epoch there when it takes leadership again
    assert lg.leader_epoch_cache.entries == []
    assert lg.append_as_leader(batch(ts=NOW + 70_000), 2, NOW + 70_000).first_offset == 27
    lg.close()


def test_retention_empties_a_log_before_a_crash(tmp_path):
    lg = filled(tmp_path, retention_ms=10_000)
    lg.enforce_retention(NOW + 60_000)
    lg.wait_for_background_flush(5)
    lg._close_files()  # no close(): the reopen recovers
    lg = open_log(tmp_path, NOW + 70_000, retention_ms=10_000)
    assert lg.log_start_offset == lg.log_end_offset == 27 and offsets(lg) == []
    lg.close()


def test_producer_state_survives_retention_of_every_segment(tmp_path):
    # as Kafka (KIP-360), retention does not forget producers: only producer.id.expiration.ms does
    lg = open_log(tmp_path, retention_ms=10_000)
    idem = encode_batch([Record(value=b"x", timestamp=NOW)], producer_id=7, producer_epoch=0, base_sequence=0)
    lg.append_as_leader(idem, 0, NOW)
    lg.update_high_watermark(lg.log_end_offset)
    assert lg.enforce_retention(NOW + 60_000) == 1
    assert lg.append_as_leader(idem, 0, NOW + 60_000).duplicate
    lg.close()


def test_compaction_roll_due_after_max_compaction_lag(tmp_path):
    lg = open_log(tmp_path, segment_bytes=1 << 20)
    active = lg._local.segments[-1]
    assert not compaction_roll_due(active, 1000, NOW + 10**6)  # empty: nothing to roll
    lg.append_as_leader(batch(ts=NOW), 0, NOW)
    assert not compaction_roll_due(active, 1000, NOW + 1000)
    assert compaction_roll_due(active, 1000, NOW + 1003)  # the first batch's timestamp is NOW + 2
    lg.close()


def test_idle_compacted_log_rolled_by_max_compaction_lag_then_cleaned_and_tombstones_dropped(tmp_path):
    """An idle compacted log whose data is all in the active segment: the cleaner never cleans
    that, so nothing happens until the retention check rolls it (max.compaction.lag.ms); then the
    lag makes it due, the cleaner keeps each key's latest value, and the tombstone goes at its
    delete horizon (delete.retention.ms) with no new write."""
    cfg = CleanerConfig(min_cleanable_dirty_ratio=0.99, max_compaction_lag_ms=2000, delete_retention_ms=1000)
    lg = open_log(tmp_path, segment_bytes=1 << 20)
    recs = [Record(value=b"a%d" % i, key=b"a", timestamp=NOW) for i in range(5)]
    lg.append_as_leader(encode_batch(recs), 0, NOW)
    lg.append_as_leader(encode_batch([Record(value=b"b0", key=b"b", timestamp=NOW)]), 0, NOW)
    lg.append_as_leader(encode_batch([Record(value=None, key=b"b", timestamp=NOW)]), 0, NOW)
    lg.update_high_watermark(lg.log_end_offset)
    assert plan_cleaning(lg, cfg, NOW + 10_000) is None  # all of it in the active segment
    assert not lg.roll_for_compaction(2000, NOW + 2000)  # not older than the lag yet
    assert lg.roll_for_compaction(2000, NOW + 2001)
    assert lg.segment_base_offsets == [0, 7]
    assert not lg.roll_for_compaction(2000, NOW + 10**6)  # the new active segment is empty

    plan = plan_cleaning(lg, cfg, NOW + 2001)
    assert plan is not None and plan.reason in ("max.compaction.lag.ms", "dirty ratio")
    clean_log(lg, cfg, NOW + 2001, plan=plan)
    assert values(lg) == [(b"a", b"a4"), (b"b", None)]  # the tombstone waits for its horizon
    assert plan_cleaning(lg, cfg, NOW + 3000) is None
    plan = plan_cleaning(lg, cfg, NOW + 3001)
    assert plan is not None and plan.reason == "delete horizon"
    clean_log(lg, cfg, NOW + 3001, plan=plan)
    assert values(lg) == [(b"a", b"a4")]
    lg.close()


def values(lg: Log) -> list[tuple[bytes | None, bytes | None]]:
    info = lg.read(lg.log_start_offset, 1 << 20)
    return [(r.key, r.value) for b in decode_batches(b"".join(bytes(p) for p in info.records)) for r in b.records]


def test_a_compacted_log_rolls_on_append_by_max_compaction_lag(tmp_path):
    # Kafka's LogConfig.maxSegmentMs: min(segment.ms, max.compaction.lag.ms) for compacted logs
    props = {"cleanup.policy": "compact", "max.compaction.lag.ms": "2000", "segment.ms": "60000"}
    cfg = LogConfig.from_properties(props, LogConfig(segment_bytes=1 << 20))
    assert cfg.compact and cfg.max_segment_ms == 2000
    assert LogConfig.from_properties({**props, "cleanup.policy": "delete"}).max_segment_ms == 60000
    lg = Log.open(tmp_path / "orders-0-0", cfg, now_ms=NOW)
    lg.append_as_leader(batch(ts=NOW), 0, NOW)
    lg.append_as_leader(batch(ts=NOW + 2000), 0, NOW + 2000)
    assert lg.segment_base_offsets == [0]
    lg.append_as_leader(batch(ts=NOW + 2003), 0, NOW + 2003)  # 2001 ms after the first batch
    assert lg.segment_base_offsets == [0, 6]
    lg.close()
