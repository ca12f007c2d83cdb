"""Producer state of a chunk replica log on real files: duplicates of the last 5 batches, sequence
gaps, epoch fencing, sequence wrap, snapshots on roll and close, recovery after a crash, truncation,
retention, expiration, follower appends."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.storage import AppendOrigin, InvalidRecordError, Log, LogConfig
from broker.storage.producer_state import (
    INVALID_PRODUCER_EPOCH,
    OUT_OF_ORDER_SEQUENCE_NUMBER,
    CorruptSnapshotError,
    InvalidProducerEpochError,
    OutOfOrderSequenceError,
    ProducerEntry,
    SequenceGapError,
    decode_snapshot,
    encode_snapshot,
    last_sequence,
)
from protocol.records import Record, decode_batches, encode_batch

NOW = 1_700_000_000_000
INT32_MAX = 2**31 - 1
PID = 4000


def batch(seq: int, n: int = 2, *, pid: int = PID, epoch: int = 0, ts: int = NOW, tag: str = "v") -> bytes:
    return encode_batch(
        [Record(value=f"{tag}{seq}-{i}".encode(), key=b"k", timestamp=ts + i) for i in range(n)],
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
    )


def plain_batch(n: int = 2, ts: int = NOW) -> bytes:
    return encode_batch([Record(value=b"x%d" % i, timestamp=ts + i) for i in range(n)])


def open_log(path: Path, now_ms: int = NOW, clean_shutdown: bool = False, **cfg) -> Log:
    return Log.open(path / "orders-0-0", LogConfig(**cfg), now_ms=now_ms, clean_shutdown=clean_shutdown)


def append(log: Log, records: bytes, **kw):
    return log.append_as_leader(records, leader_epoch=1, now_ms=NOW, **kw)


def crash(log: Log) -> None:
    """Drop the log without close(): no snapshot at the end, no clean-shutdown marker."""
    log._close_files()


def values(log: Log) -> list[bytes]:
    info = log.read(log.log_start_offset, 1 << 30)
    data = b"".join(bytes(p) for p in info.records)
    return [r.value for b in decode_batches(data) for r in b.records]


def state(log: Log) -> dict[int, ProducerEntry]:
    return {pid: e.copy() for pid, e in log.producer_state.producers.items()}


def snapshot_files(log: Log) -> list[int]:
    return sorted(int(p.name.split(".")[0]) for p in log.dir.iterdir() if p.name.endswith(".snapshot"))


# -- leader checks -------------------------------------------------------------------------------


def test_each_of_the_last_five_batches_is_a_duplicate_answered_with_its_original_offsets(tmp_path):
    log = open_log(tmp_path)
    firsts = [append(log, batch(2 * i)).first_offset for i in range(6)]  # seqs 0-1, 2-3, ... 10-11
    assert firsts == [0, 2, 4, 6, 8, 10]
    leo = log.log_end_offset
    for i in range(1, 6):
        info = append(log, batch(2 * i))
        assert info.duplicate and (info.first_offset, info.last_offset) == (firsts[i], firsts[i] + 1)
        assert info.batch_count == 0
    assert log.log_end_offset == leo
    with pytest.raises(OutOfOrderSequenceError) as e:  # the first batch fell out of the cache of 5
        append(log, batch(0))
    assert e.value.error_code == OUT_OF_ORDER_SEQUENCE_NUMBER
    assert log.log_end_offset == leo
    assert len(values(log)) == 12
    assert append(log, batch(12)).first_offset == 12  # the producer goes on


def test_a_retry_with_another_sequence_range_is_not_a_duplicate(tmp_path):
    log = open_log(tmp_path)
    append(log, batch(0, n=3))
    with pytest.raises(OutOfOrderSequenceError):  # seq 0 but 2 records: not the cached 0-2 batch
        append(log, batch(0, n=2))
    assert log.log_end_offset == 3


def test_sequence_gap_is_refused_retriably_and_appends_nothing(tmp_path):
    """A gap is NOT_LEADER_OR_FOLLOWER, retriable (SequenceGapError says why not
    OUT_OF_ORDER_SEQUENCE_NUMBER); a sequence behind the cached batches stays out of order."""
    log = open_log(tmp_path)
    append(log, batch(0))
    with pytest.raises(SequenceGapError) as e:
        append(log, batch(3))
    assert e.value.error_code == 6
    assert log.log_end_offset == 2
    assert append(log, batch(2)).first_offset == 2


def test_unknown_producer_is_accepted_at_any_sequence(tmp_path):
    log = open_log(tmp_path)
    assert append(log, batch(77)).first_offset == 0
    assert log.producer_state.producers[PID].last_seq == 78
    assert append(log, batch(10, pid=PID + 1)).first_offset == 2


def test_epoch_fencing_and_new_epochs_start_at_zero(tmp_path):
    log = open_log(tmp_path)
    append(log, batch(0, epoch=3))
    with pytest.raises(InvalidProducerEpochError) as e:
        append(log, batch(2, epoch=2))
    assert e.value.error_code == INVALID_PRODUCER_EPOCH
    with pytest.raises(OutOfOrderSequenceError):
        append(log, batch(2, epoch=4))  # a bumped epoch must start over at 0
    info = append(log, batch(0, epoch=4))
    assert not info.duplicate and info.first_offset == 2
    with pytest.raises(InvalidProducerEpochError):  # the old epoch is fenced now, even its duplicates
        append(log, batch(0, epoch=3))
    assert append(log, batch(2, epoch=4)).first_offset == 4
    assert log.log_end_offset == 6


def test_sequence_numbers_wrap_at_int32_max(tmp_path):
    assert last_sequence(INT32_MAX - 1, 2) == 0
    assert last_sequence(INT32_MAX, 0) == INT32_MAX
    log = open_log(tmp_path)
    append(log, batch(INT32_MAX - 4, n=2))  # INT32_MAX-4 .. INT32_MAX-3
    append(log, batch(INT32_MAX - 2, n=3))  # INT32_MAX-2 .. INT32_MAX
    assert log.producer_state.producers[PID].last_seq == INT32_MAX
    append(log, batch(0, n=3))  # wrapped
    append(log, batch(3, n=1))
    retry = append(log, batch(INT32_MAX - 2, n=3))
    assert retry.duplicate and retry.first_offset == 2
    append(log, batch(4, n=7))
    with pytest.raises(OutOfOrderSequenceError):
        append(log, batch(0, n=1))
    log2 = open_log(tmp_path / "b")
    append(log2, batch(INT32_MAX - 1, n=3))  # one batch across the wrap: INT32_MAX-1, INT32_MAX, 0
    assert log2.producer_state.producers[PID].last_seq == 0
    assert append(log2, batch(1)).first_offset == 3
    assert append(log2, batch(INT32_MAX - 1, n=3)).duplicate


def test_several_batches_of_one_append_are_checked_in_order(tmp_path):
    log = open_log(tmp_path)
    info = append(log, batch(0) + batch(2) + batch(0, pid=9))
    assert (info.first_offset, info.last_offset, info.batch_count) == (0, 5, 3)
    assert log.producer_state.producers[PID].last_seq == 3
    with pytest.raises(SequenceGapError):
        append(log, batch(4) + batch(7))  # the second one has a gap: neither is appended
    assert log.log_end_offset == 6
    assert log.producer_state.producers[PID].last_seq == 3  # nothing of the refused append stayed


def test_plain_batches_leave_producer_state_alone(tmp_path):
    log = open_log(tmp_path)
    append(log, plain_batch())
    append(log, plain_batch())
    assert log.producer_state.producers == {}
    assert log.log_end_offset == 4


def test_a_negative_sequence_with_a_producer_id_is_invalid(tmp_path):
    log = open_log(tmp_path)
    with pytest.raises(InvalidRecordError):
        append(log, batch(-1))
    assert log.log_end_offset == 0


def test_coordinator_appends_check_the_epoch_but_not_the_sequence(tmp_path):
    log = open_log(tmp_path)
    append(log, batch(0, epoch=2))
    assert append(log, batch(9, epoch=2), origin=AppendOrigin.COORDINATOR).first_offset == 2
    with pytest.raises(InvalidProducerEpochError):
        append(log, batch(11, epoch=1), origin=AppendOrigin.COORDINATOR)


def test_log_append_time_duplicate_answers_the_first_append_time(tmp_path):
    log = Log.open(tmp_path / "t-0-0", LogConfig(message_timestamp_type="LogAppendTime"), now_ms=NOW)
    first = log.append_as_leader(batch(0), leader_epoch=0, now_ms=NOW + 5)
    again = log.append_as_leader(batch(0), leader_epoch=0, now_ms=NOW + 99)
    assert again.duplicate and again.log_append_time == first.log_append_time == NOW + 5


# -- follower ------------------------------------------------------------------------------------


def test_follower_appends_track_state_without_checks_and_dedupe_after_failover(tmp_path):
    leader = open_log(tmp_path / "leader")
    follower = open_log(tmp_path / "follower")
    for seq in (0, 2, 4):
        append(leader, batch(seq))
    data = b"".join(bytes(p) for p in leader.read(0, 1 << 30).records)
    follower.append_as_follower(data)
    assert state(follower) == state(leader)
    # The follower becomes leader; the producer retries its last batch: a duplicate there too.
    retry = append(follower, batch(4))
    assert retry.duplicate and retry.first_offset == 4
    # Old-epoch batches from the leader are taken as they come (the leader already judged them).
    old = encode_batch([Record(value=b"z", timestamp=NOW)], producer_id=PID, producer_epoch=0, base_sequence=50,
                       base_offset=6)
    follower.append_as_follower(old)
    assert follower.producer_state.producers[PID].last_seq == 50


def test_follower_append_spanning_rolls_snapshots_state_at_each_roll(tmp_path):
    leader = open_log(tmp_path / "leader")
    for i in range(20):
        append(leader, batch(2 * i, tag="x" * 40))
    data = b"".join(bytes(p) for p in leader.read(0, 1 << 30).records)
    follower = open_log(tmp_path / "follower", segment_bytes=600)
    follower.append_as_follower(data)
    assert len(follower.segment_base_offsets) > 2
    assert state(follower) == state(leader)
    # Every snapshot holds exactly the state of the batches below its offset.
    for off in snapshot_files(follower):
        entries = decode_snapshot((follower.dir / f"{off:020d}.snapshot").read_bytes())
        assert len(entries) == 1 and entries[0].last_offset == off - 1


# -- snapshots, recovery, truncation -------------------------------------------------------------


def test_snapshot_on_roll_and_recovery_after_a_crash_rebuilds_the_same_state(tmp_path):
    log = open_log(tmp_path, segment_bytes=800)
    for i in range(30):
        append(log, batch(2 * (i // 3), pid=PID + i % 3, epoch=i % 3))
    assert len(log.segment_base_offsets) > 3
    snaps = snapshot_files(log)
    assert snaps == log.segment_base_offsets[1:]  # one per roll, named by the new segment's base
    before = state(log)
    # Recovery starts from a snapshot at or below the high watermark: here everything is replicated.
    log.update_high_watermark(log.log_end_offset)
    log.checkpoint()
    crash(log)
    log = open_log(tmp_path, segment_bytes=800)
    assert state(log) == before
    # Recovery started from the newest snapshot and replayed only the active segment's headers.
    start, replayed = log._reload_producer_state(NOW)
    assert start == snaps[-1] and replayed == (log.log_end_offset - start) // 2
    assert state(log) == before
    # Dedupe works after the restart, and the sequence goes on.
    assert append(log, batch(18, pid=PID + 2, epoch=2)).duplicate
    assert not append(log, batch(20, pid=PID, epoch=0)).duplicate


def test_recovery_without_any_snapshot_replays_every_header(tmp_path):
    log = open_log(tmp_path, segment_bytes=500)
    for i in range(12):
        append(log, batch(2 * i))
    before = state(log)
    crash(log)
    for p in log.dir.glob("*.snapshot"):
        p.unlink()
    log = open_log(tmp_path, segment_bytes=500)
    assert state(log) == before


def test_clean_close_writes_a_snapshot_at_the_log_end(tmp_path):
    log = open_log(tmp_path)
    for i in range(4):
        append(log, batch(2 * i))
    before = state(log)
    log.update_high_watermark(log.log_end_offset)
    log.close()
    assert snapshot_files(log) == [8]
    log = open_log(tmp_path)
    assert log._reload_producer_state(NOW) == (8, 0)  # all from the snapshot, nothing replayed
    assert state(log) == before
    assert [append(log, batch(s)).first_offset for s in (0, 2, 4, 6)] == [0, 2, 4, 6]  # all 5 cached kept


def test_a_corrupt_snapshot_is_dropped_and_an_older_one_used(tmp_path):
    log = open_log(tmp_path, segment_bytes=500)
    for i in range(12):
        append(log, batch(2 * i))
    before = state(log)
    log.update_high_watermark(log.log_end_offset)
    log.close()
    newest = max(snapshot_files(log))
    path = log.dir / f"{newest:020d}.snapshot"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptSnapshotError):
        decode_snapshot(bytes(data))
    log = open_log(tmp_path, segment_bytes=500, clean_shutdown=True)
    assert newest not in snapshot_files(log)
    assert state(log) == before


def test_crash_with_a_torn_tail_forgets_the_lost_batch(tmp_path):
    log = open_log(tmp_path)
    for i in range(3):
        append(log, batch(2 * i))
    crash(log)
    seg = log.dir / f"{0:020d}.log"
    with open(seg, "r+b") as f:
        f.truncate(seg.stat().st_size - 5)
    log = open_log(tmp_path)
    assert log.log_end_offset == 4
    assert log.producer_state.producers[PID].last_seq == 3
    assert append(log, batch(4)).first_offset == 4  # the lost batch is accepted again, once


def test_truncate_to_drops_state_beyond_the_point(tmp_path):
    log = open_log(tmp_path, segment_bytes=500)
    for i in range(12):
        append(log, batch(2 * i))
    log2 = open_log(tmp_path / "ref", segment_bytes=500)
    for i in range(4):
        append(log2, batch(2 * i))
    at_8 = state(log2)
    log.truncate_to(8)
    assert log.log_end_offset == 8
    assert state(log) == at_8
    assert all(off <= 8 for off in snapshot_files(log))
    with pytest.raises(SequenceGapError):
        append(log, batch(20))  # the truncated batches are gone from the state too
    assert append(log, batch(8)).first_offset == 8
    before = state(log)
    crash(log)
    assert state(open_log(tmp_path, segment_bytes=500)) == before


def test_truncate_fully_forgets_every_producer_and_snapshot(tmp_path):
    log = open_log(tmp_path, segment_bytes=500)
    for i in range(12):
        append(log, batch(2 * i))
    log.truncate_fully_and_start_at(100)
    assert log.producer_state.producers == {} and snapshot_files(log) == []
    assert append(log, batch(500)).first_offset == 100


def test_retention_deletes_snapshots_below_the_log_start(tmp_path):
    log = open_log(tmp_path, segment_bytes=500, retention_ms=1000)
    for i in range(12):
        append(log, batch(2 * i))
    log.update_high_watermark(log.log_end_offset)
    assert min(snapshot_files(log)) < log.segment_base_offsets[-1]
    deleted = log.enforce_retention(NOW + 10_000)
    assert deleted > 0
    assert all(off >= log.log_start_offset for off in snapshot_files(log))
    # Producers whose batches were deleted are still known (only time expires them).
    assert append(log, batch(22)).duplicate
    log.delete_records_before(log.log_end_offset)
    assert all(off >= log.log_start_offset for off in snapshot_files(log))


def test_idle_producers_expire(tmp_path):
    log = open_log(tmp_path)
    log.producer_state.expiration_ms = 60_000
    append(log, batch(0, pid=1, ts=NOW))
    append(log, batch(0, pid=2, ts=NOW + 50_000))
    assert log.remove_expired_producers(NOW + 61_000) == 1
    assert set(log.producer_state.producers) == {2}
    assert append(log, batch(40, pid=1, ts=NOW + 150_000)).first_offset == 4  # unknown again: any sequence
    log.close()
    # Expired entries are also left out when a snapshot loads.
    log = Log.open(tmp_path / "orders-0-0", LogConfig(), now_ms=NOW + 200_000, producer_id_expiration_ms=100_000)
    assert set(log.producer_state.producers) == {1}


def test_snapshot_encoding_round_trips(tmp_path):
    entries = [
        ProducerEntry(1, 3, [], 5),
        ProducerEntry(2**62, 32766, [(0, 1, 10, 11, NOW), (2, 2, 12, 12, NOW + 1)], NOW + 1, 7, 10),
    ]
    assert decode_snapshot(encode_snapshot(entries)) == entries
    data = encode_snapshot(entries)
    for cut in (0, 5, len(data) - 1):
        with pytest.raises(CorruptSnapshotError):
            decode_snapshot(data[:cut])
    with pytest.raises(CorruptSnapshotError):
        decode_snapshot(data + b"\0")
