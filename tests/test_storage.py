"""Storage layer on real files: append/read, offsets, rolling, recovery, truncation, retention,
timestamps, leader epochs, log dirs, follower appends."""

from __future__ import annotations

import os
import struct
import threading
import uuid
from pathlib import Path

import pytest

from broker.storage import (
    AppendOrigin,
    InconsistentTopicIdError,
    InvalidRecordError,
    InvalidTimestampError,
    LeaderEpochCache,
    Log,
    LogConfig,
    LogDir,
    OffsetOutOfRangeError,
    RecordListTooLargeError,
    RecordTooLargeError,
    StorageError,
    UnexpectedAppendOffsetError,
)
from broker.storage.file_names import parse_replica_dir_name, replica_dir_name
from protocol.records import Compression, Record, decode_batches, encode_batch, iter_batches, read_header

NOW = 1_700_000_000_000


# -- helpers -------------------------------------------------------------------------------------


def batch(n: int = 3, ts: int = NOW, size: int = 20, tag: str = "v", **kw) -> bytes:
    """A producer batch of n records with timestamps ts, ts+1, ..."""
    return encode_batch(
        [Record(value=(f"{tag}{i}-".encode() * size)[:size], key=b"k%d" % i, timestamp=ts + i) for i in range(n)], **kw
    )


def open_log(tmp_path: Path, name: str = "orders-0-0", now_ms: int = NOW, **cfg) -> Log:
    return Log.open(tmp_path / name, LogConfig(**cfg), now_ms=now_ms)


def fetched(info) -> bytes:
    return b"".join(bytes(p) for p in info.records)


def read_records(log: Log, offset: int | None = None, max_bytes: int = 1 << 30, **kw):
    info = log.read(log.log_start_offset if offset is None else offset, max_bytes, **kw)
    return [r for b in decode_batches(fetched(info)) for r in b.records]


def record_offsets(log: Log, offset: int | None = None, **kw) -> list[int]:
    return [r.offset for r in read_records(log, offset, **kw)]


def segment_files(log: Log, suffix: str = ".log") -> list[Path]:
    return sorted(p for p in log.dir.iterdir() if p.name.endswith(suffix))


def simulate_crash(log: Log) -> None:
    """Drop the log without close(): no flush, no checkpoint, no clean-shutdown marker."""
    log._close_files()


# -- append and read -----------------------------------------------------------------------------


def test_append_then_read_round_trips_and_assigns_offsets(tmp_path):
    log = open_log(tmp_path)
    assert (log.topic, log.partition, log.chunk_start) == ("orders", 0, 0)
    infos = [
        log.append_as_leader(batch(n, ts=NOW + 10 * i, tag=f"b{i}"), leader_epoch=5, now_ms=NOW)
        for i, n in enumerate((3, 1, 4))
    ]

    assert [(i.first_offset, i.last_offset, i.batch_count) for i in infos] == [(0, 2, 1), (3, 3, 1), (4, 7, 1)]
    assert infos[2].max_timestamp == NOW + 23 and infos[2].offset_of_max_timestamp == 7
    assert infos[0].log_append_time == -1 and infos[0].bytes == len(batch(3))
    assert log.log_end_offset == 8

    info = log.read(0, 1 << 20)
    assert all(isinstance(p, (bytes, memoryview)) for p in info.records)
    assert (info.total_bytes, info.log_start_offset, info.log_end_offset) == (log.size_bytes, 0, 8)
    batches = decode_batches(fetched(info))  # CRCs are checked by the decoder
    assert [b.base_offset for b in batches] == [0, 3, 4]
    assert {b.header.partition_leader_epoch for b in batches} == {5}
    records = [r for b in batches for r in b.records]
    assert [r.offset for r in records] == list(range(8))
    assert records[4].value.startswith(b"b20-")
    assert [r.timestamp for r in records[:3]] == [NOW, NOW + 1, NOW + 2]


def test_one_append_with_several_batches_patches_each_header(tmp_path):
    log = open_log(tmp_path)
    log.append_as_leader(batch(2), 0, NOW)
    info = log.append_as_leader(batch(3, tag="a") + batch(2, tag="b", compression=Compression.LZ4), 1, NOW)
    assert (info.first_offset, info.last_offset, info.batch_count) == (2, 6, 2)
    batches = decode_batches(fetched(log.read(2, 1 << 20)))
    assert [(b.base_offset, b.header.last_offset) for b in batches] == [(2, 4), (5, 6)]
    assert batches[1].records[1].value.startswith(b"b1-")
    assert log.leader_epoch_cache.entries == [(0, 0), (1, 2)]


def test_log_append_time_stamps_batches_and_keeps_crc_valid(tmp_path):
    log = open_log(tmp_path, message_timestamp_type="LogAppendTime")
    info = log.append_as_leader(batch(3, ts=NOW - 50_000), 0, now_ms=NOW + 7)
    assert info.log_append_time == NOW + 7 and info.max_timestamp == NOW + 7 and info.offset_of_max_timestamp == 2
    [decoded] = decode_batches(fetched(log.read(0, 1 << 20)))
    assert decoded.header.log_append_time and decoded.header.max_timestamp == NOW + 7
    assert [r.timestamp for r in decoded.records] == [NOW + 7] * 3
    assert log.max_timestamp() == (NOW + 7, 0)


def _flip(data: bytes, pos: int) -> bytes:
    out = bytearray(data)
    out[pos] ^= 0xFF
    return bytes(out)


def _with_header_field(data: bytes, fmt: str, pos: int, value: int) -> bytes:
    """Patch a header field and recompute the CRC, so only the patched field is wrong."""
    from crc32c import crc32c

    out = bytearray(data)
    struct.pack_into(fmt, out, pos, value)
    struct.pack_into(">I", out, 17, crc32c(bytes(out[21:])))
    return bytes(out)


@pytest.mark.parametrize(
    ("records", "code", "exc_type"),
    [
        (_flip(batch(3), 70), 2, InvalidRecordError),  # CRC mismatch
        (batch(3) + _flip(batch(2), 80), 2, InvalidRecordError),  # second batch corrupt: first not written either
        (batch(3)[:-5], 2, InvalidRecordError),  # truncated
        (batch(3) + b"\x00" * 7, 2, InvalidRecordError),  # trailing garbage
        (batch(3)[:16] + b"\x01" + batch(3)[17:], 43, InvalidRecordError),  # magic 1
        (_with_header_field(batch(3), ">i", 23, 5), 87, InvalidRecordError),  # lastOffsetDelta != count - 1
        (_with_header_field(batch(3), ">i", 57, 0), 87, InvalidRecordError),  # zero records
        (encode_batch([Record(value=b"x")], control=True), 87, InvalidRecordError),  # control batch from a client
        (b"", 87, InvalidRecordError),
        (None, 87, InvalidRecordError),
        (batch(3, size=2000), 10, RecordTooLargeError),  # > max.message.bytes
    ],
)
def test_invalid_input_is_rejected_and_nothing_is_written(tmp_path, records, code, exc_type):
    log = open_log(tmp_path, max_message_bytes=4000)
    log.append_as_leader(batch(2), 0, NOW)
    size_before = log.size_bytes
    with pytest.raises(exc_type) as err:
        log.append_as_leader(records, 0, NOW)
    assert err.value.error_code == code
    assert log.log_end_offset == 2 and log.size_bytes == size_before
    assert sum(p.stat().st_size for p in segment_files(log)) == size_before
    assert log.append_as_leader(batch(1), 0, NOW).first_offset == 2  # the log is still usable


def test_coordinator_may_append_control_batches(tmp_path):
    log = open_log(tmp_path)
    marker = encode_batch(
        [Record(value=b"\x00\x00\x00\x00", key=b"\x00\x00\x00\x00")], control=True, transactional=True
    )
    info = log.append_as_leader(marker, 0, NOW, origin=AppendOrigin.COORDINATOR)
    assert info.first_offset == 0
    assert read_header(fetched(log.read(0, 1000))).is_control


def test_append_larger_than_a_segment_is_refused(tmp_path):
    log = open_log(tmp_path, segment_bytes=200)
    with pytest.raises(RecordListTooLargeError) as err:
        log.append_as_leader(batch(3) + batch(3), 0, NOW)
    assert err.value.error_code == 18 and log.log_end_offset == 0


# -- rolling -------------------------------------------------------------------------------------


def test_roll_by_size_keeps_whole_batches_and_reads_across_segments(tmp_path):
    one = len(batch(3))
    log = open_log(tmp_path, segment_bytes=int(one * 2.5))
    for i in range(7):
        log.append_as_leader(batch(3, ts=NOW + i), 0, NOW)
    assert log.segment_base_offsets == [0, 6, 12, 18]
    sizes = [p.stat().st_size for p in segment_files(log)]
    assert sizes == [2 * one, 2 * one, 2 * one, one]
    assert record_offsets(log) == list(range(21))
    assert record_offsets(log, 7)[0] == 6  # the batch holding 7 starts at 6
    for p in segment_files(log):
        assert int(p.name[:20]) == read_header(p.read_bytes()).base_offset


def test_roll_by_time_counts_from_first_batch_timestamp(tmp_path):
    log = open_log(tmp_path, segment_ms=1000)
    log.append_as_leader(batch(1, ts=NOW), 0, NOW)
    log.append_as_leader(batch(1, ts=NOW + 900), 0, NOW + 900)
    assert log.segment_base_offsets == [0]
    log.append_as_leader(batch(1, ts=NOW + 1001), 0, NOW + 1001)
    assert log.segment_base_offsets == [0, 2]
    log.roll()
    log.roll()  # rolling an empty active segment is a no-op
    assert log.segment_base_offsets == [0, 2, 3]


def test_old_timestamps_do_not_roll_on_every_append(tmp_path):
    # A backfill of month-old records: record time barely moves, so one segment takes them all.
    month_ago = NOW - 30 * 86_400_000
    log = open_log(tmp_path, segment_ms=60_000)
    for i in range(200):
        log.append_as_leader(batch(1, ts=month_ago + i), 0, NOW + i)
    assert log.segment_base_offsets == [0]
    log.append_as_leader(batch(1, ts=month_ago + 60_001), 0, NOW + 300)  # record time passed segment.ms
    assert log.segment_base_offsets == [0, 200]


def test_roll_jitter_shortens_segment_ms(tmp_path):
    log = open_log(tmp_path, segment_ms=1000, segment_jitter_ms=1000)
    log._local.roll_jitter_ms = 400  # what random chose for this segment
    log.append_as_leader(batch(1, ts=NOW), 0, NOW)
    log.append_as_leader(batch(1, ts=NOW + 600), 0, NOW)
    assert log.segment_base_offsets == [0]
    log.append_as_leader(batch(1, ts=NOW + 601), 0, NOW)
    assert log.segment_base_offsets == [0, 2]
    assert 0 <= log._local.roll_jitter_ms < 1000


def test_timestamp_bounds_kip_937(tmp_path):
    log = open_log(tmp_path, message_timestamp_before_max_ms=1000, message_timestamp_after_max_ms=500)
    log.append_as_leader(batch(1, ts=NOW - 1000), 0, NOW)
    log.append_as_leader(batch(1, ts=NOW + 500), 0, NOW)
    for ts in (NOW - 1001, NOW + 501):
        with pytest.raises(InvalidTimestampError) as info:
            log.append_as_leader(batch(1, ts=ts), 0, NOW)
        assert info.value.error_code == 32
        assert str(info.value) == "One or more records have been rejected due to invalid timestamp"
        assert info.value.record_errors == [
            (0, f"Timestamp {ts} of message with offset 0 is out of range. "
                f"The timestamp should be within [{NOW - 1000}, {NOW + 500}]")
        ]
    assert log.log_end_offset == 2
    # LogAppendTime topics stamp the broker's time: the client's timestamps are not checked
    lat = open_log(tmp_path, "lat-0-0", message_timestamp_type="LogAppendTime", message_timestamp_before_max_ms=0)
    lat.append_as_leader(batch(1, ts=NOW - 10_000), 0, NOW)
    assert lat.log_end_offset == 1


def test_roll_when_offset_index_is_full(tmp_path):
    log = open_log(tmp_path, segment_index_bytes=24, index_interval_bytes=0)  # three offset-index entries
    for _ in range(9):
        log.append_as_leader(batch(1), 0, NOW)  # one timestamp throughout: the time index holds one entry
    # the first batch of a segment gets no entry, the next three fill the index, the fifth rolls
    assert log.segment_base_offsets == [0, 4, 8]
    assert [p.stat().st_size for p in segment_files(log, ".index")] == [24, 24, 0]
    assert record_offsets(log) == list(range(9))


def test_roll_flushes_the_old_segment_and_advances_recovery_point(tmp_path):
    log = open_log(tmp_path, segment_bytes=len(batch(3)) + 10)
    log.append_as_leader(batch(3), 0, NOW)
    assert log.recovery_point == 0
    log.append_as_leader(batch(3), 0, NOW)
    log.wait_for_background_flush()  # the roll's fsync runs off the appending thread
    assert log.recovery_point == 3
    log.flush()
    assert log.recovery_point == log.log_end_offset == 6
    assert "recovery_point 6" in (log.dir / "log-state.checkpoint").read_text()


# -- reading -------------------------------------------------------------------------------------


def test_read_limits_offsets_bytes_and_batches(tmp_path):
    log = open_log(tmp_path, index_interval_bytes=100)
    one = len(batch(3))
    for i in range(10):
        log.append_as_leader(batch(3, ts=NOW + i), 0, NOW)

    # every offset finds the batch holding it, through the index
    for offset in range(30):
        first = decode_batches(fetched(log.read(offset, 1)))[0]
        assert first.base_offset == offset - offset % 3

    # max_offset (a high watermark) is exclusive, and never cuts a batch
    assert record_offsets(log, 0, max_offset=9) == list(range(9))
    assert record_offsets(log, 0, max_offset=10) == list(range(9))
    assert record_offsets(log, 9, max_offset=9) == []

    # max_bytes: whole batches only
    info = log.read(0, 2 * one + one // 2)
    assert info.total_bytes == 2 * one and len(decode_batches(fetched(info))) == 2
    # min_one_batch: a budget smaller than the first batch still returns it, unless disabled
    assert log.read(3, 10).total_bytes == one
    assert log.read(3, 10, min_one_batch=False).total_bytes == 0

    # the end and beyond
    end = log.read(30, 1000)
    assert (end.records, end.total_bytes, end.log_end_offset) == ([], 0, 30)
    with pytest.raises(OffsetOutOfRangeError) as err:
        log.read(31, 1000)
    assert err.value.error_code == 1
    with pytest.raises(OffsetOutOfRangeError):
        log.read(-1, 1000)


def test_read_returns_file_bytes_unchanged(tmp_path):
    log = open_log(tmp_path)
    log.append_as_leader(batch(4), 7, NOW)
    data = fetched(log.read(0, 1 << 20))
    assert data == segment_files(log)[0].read_bytes()
    produced = batch(4)
    # only baseOffset (0..8) and partitionLeaderEpoch (12..16) differ from what the producer sent
    assert data[8:12] == produced[8:12] and data[16:] == produced[16:]


# -- close, reopen, recovery ---------------------------------------------------------------------


def test_reopen_after_clean_close_keeps_everything(tmp_path):
    topic_id = uuid.uuid4()
    log = Log.open(tmp_path / "orders-2-100", LogConfig(segment_bytes=300), topic_id=topic_id, now_ms=NOW)
    assert log.log_start_offset == log.log_end_offset == 100  # a new chunk replica starts at its chunk start
    for i in range(6):
        log.append_as_leader(batch(2, ts=NOW + i), 3, NOW)
    log.update_high_watermark(108)
    before = fetched(log.read(100, 1 << 20))
    log.close()
    with pytest.raises(StorageError):
        log.append_as_leader(batch(1), 3, NOW)

    again = Log.open(log.dir, LogConfig(segment_bytes=300), clean_shutdown=True)
    assert again.topic_id == topic_id
    assert (again.log_start_offset, again.log_end_offset, again.high_watermark) == (100, 112, 108)
    assert again.recovery_point == 112
    assert fetched(again.read(100, 1 << 20)) == before
    assert again.leader_epoch_cache.entries == [(3, 100)]
    assert again.max_timestamp() == (NOW + 5 + 1, 111)
    assert again.append_as_leader(batch(1), 4, NOW).first_offset == 112


def test_clean_shutdown_marker_per_log_dir(tmp_path, capsys):
    """As Kafka: logs closed without fsyncs, the dir synced once and marked; the next start takes
    the marker away before opening anything and opens each log once without recovery."""
    root = tmp_path / "data"
    d = LogDir(root)
    d.format_or_check(1, "abc")
    logs = [d.open_log("t", i, 0, LogConfig()) for i in range(3)]
    for lg in logs:
        lg.append_as_leader(batch(2), 0, NOW)
        lg.update_high_watermark(2)
        lg.close(sync=False)
    assert logs[0].recovery_point == 0  # nothing was fsynced: the checkpoint keeps what was
    assert d.mark_clean_shutdown()
    assert (root / ".kafka_cleanshutdown").exists()

    d = LogDir(root)
    d.format_or_check(1, "abc")
    assert not (root / ".kafka_cleanshutdown").exists()  # a crash from now on is detected
    capsys.readouterr()
    again = d.open_log("t", 0, 0, LogConfig())
    assert "log_loaded" not in capsys.readouterr().out  # nothing recovered: its line is only at debug
    # nothing recovered; the recovery point stays the synced one (the next flush moves it on)
    assert (again.log_end_offset, again.high_watermark, again.recovery_point) == (2, 2, 0)
    assert again.append_as_leader(batch(1), 0, NOW).first_offset == 2
    again.close(sync=False)
    # t-1 and t-2 were not opened, so are still clean: the dir may be marked again
    assert d.mark_clean_shutdown()

    # after a crash (no marker), a start that stops before opening every log must not mark the dir
    (root / ".kafka_cleanshutdown").unlink()
    d = LogDir(root)
    d.format_or_check(1, "abc")
    capsys.readouterr()
    d.open_log("t", 0, 0, LogConfig()).close(sync=False)
    assert "clean_shutdown=False" in capsys.readouterr().out
    assert not d.mark_clean_shutdown()
    assert not (root / ".kafka_cleanshutdown").exists()
    for i in (1, 2):
        d.open_log("t", i, 0, LogConfig()).close(sync=False)
    assert d.mark_clean_shutdown()


def test_crash_with_torn_tail_truncates_to_last_whole_batch(tmp_path):
    log = open_log(tmp_path, segment_bytes=10_000)
    for i in range(3):
        log.append_as_leader(batch(3, ts=NOW + i), 0, NOW)
    whole = 2 * len(batch(3))
    simulate_crash(log)
    seg = segment_files(log)[0]
    os.truncate(seg, seg.stat().st_size - 10)  # the third batch was only partly written

    again = open_log(tmp_path, segment_bytes=10_000)
    assert again.log_end_offset == 6
    assert seg.stat().st_size == whole
    assert record_offsets(again) == list(range(6))
    with pytest.raises(OffsetOutOfRangeError):
        again.read(7, 1000)
    assert again.append_as_leader(batch(1), 0, NOW).first_offset == 6
    assert record_offsets(again) == list(range(7))


def test_a_new_leader_epoch_is_written_by_the_next_flush_or_close_not_by_assign(tmp_path):
    """Becoming leader of 20,000 partitions writes no file on the event loop (leader_epoch.py)."""
    log = open_log(tmp_path)
    log.append_as_leader(batch(2), 1, NOW)
    log.flush()
    path = log.dir / "leader-epoch-checkpoint"
    assert path.read_text() == "0\n1\n1 0\n"
    log.leader_epoch_cache.assign(2, log.log_end_offset)
    assert path.read_text() == "0\n1\n1 0\n" and log.leader_epoch_cache.unsynced
    log.append_as_leader(batch(2), 2, NOW)
    log.flush()  # before the recovery point passes the epoch's batches
    assert path.read_text() == "0\n2\n1 0\n2 2\n" and not log.leader_epoch_cache.unsynced
    log.leader_epoch_cache.assign(3, 4)
    log.close(sync=False)  # a broker's shutdown: written, synced by its syncfs
    assert path.read_text() == "0\n3\n1 0\n2 2\n3 4\n"


def test_a_shutdown_writes_the_leader_epochs_over_their_file_and_a_left_tail_is_ignored(tmp_path):
    """A broker's shutdown writes each log's deferred epochs in place (no new inode: a create
    and a rename cost 100-200 µs a log on ext4); a kill between the write and the cut to length
    leaves the old, longer content's tail, which the parser ignores."""
    log = open_log(tmp_path)
    log.append_as_leader(batch(1), 1, NOW)
    log.flush()
    path = log.dir / "leader-epoch-checkpoint"
    inode = path.stat().st_ino
    log.leader_epoch_cache.assign(2, log.log_end_offset)
    log.close(sync=False)
    assert path.read_text() == "0\n2\n1 0\n2 1\n" and path.stat().st_ino == inode
    path.write_text("0\n1\n1 0\n" + "2 1\n")  # a shorter content over a longer one, not cut
    assert LeaderEpochCache.load(path).entries == [(1, 0)]


def test_an_epoch_lost_in_a_crash_is_derived_again_from_its_batches(tmp_path):
    log = open_log(tmp_path)
    log.append_as_leader(batch(2), 1, NOW)
    log.flush()
    log.leader_epoch_cache.assign(2, 2)
    log.append_as_leader(batch(3), 2, NOW)
    simulate_crash(log)  # epoch 2 was never written: its batches lie past the recovery point
    assert open_log(tmp_path).leader_epoch_cache.entries == [(1, 0), (2, 2)]


def test_after_a_crash_the_state_file_is_rewritten_only_if_it_claims_more_than_survived(tmp_path):
    from broker.storage.log_state import LogState, read_log_state

    log = open_log(tmp_path, segment_bytes=10_000)
    log.append_as_leader(batch(3), 0, NOW)
    simulate_crash(log)  # never checkpointed: no state file, so everything is checked
    again = open_log(tmp_path, segment_bytes=10_000)
    state_file = again.dir / "log-state.checkpoint"
    assert again.log_end_offset == 3 and not state_file.exists()  # nothing a second crash would miss
    for _ in range(2):
        again.append_as_leader(batch(3), 0, NOW)
    again.update_high_watermark(9)
    again.flush()
    assert read_log_state(state_file) == LogState(0, 9, 9)
    simulate_crash(again)
    seg = segment_files(again)[0]
    os.truncate(seg, seg.stat().st_size - 10)  # the synced tail is gone (a failing disk)
    third = open_log(tmp_path, segment_bytes=10_000)
    assert third.log_end_offset == 6
    fixed = read_log_state(state_file)  # fixed before any append, as a new incarnation (log_state.py)
    assert fixed is not None and fixed.incarnation != 0 and fixed == LogState(0, 6, 6, fixed.incarnation)


def test_crash_with_garbage_tail_and_corrupt_batch(tmp_path):
    log = open_log(tmp_path)
    for _ in range(3):
        log.append_as_leader(batch(3), 0, NOW)
    simulate_crash(log)
    seg = segment_files(log)[0]
    with open(seg, "ab") as f:
        f.write(os.urandom(100))
    again = open_log(tmp_path)
    assert again.log_end_offset == 9 and seg.stat().st_size == 3 * len(batch(3))
    simulate_crash(again)

    # a flipped byte inside the second batch: its CRC fails, so it and everything after go
    data = bytearray(seg.read_bytes())
    data[len(batch(3)) + 70] ^= 0x55
    seg.write_bytes(bytes(data))
    third = open_log(tmp_path)
    assert third.log_end_offset == 3 and record_offsets(third) == [0, 1, 2]


def test_crash_drops_segments_after_a_corrupt_one(tmp_path):
    one = len(batch(3))
    log = open_log(tmp_path, segment_bytes=2 * one)
    for _ in range(6):
        log.append_as_leader(batch(3), 0, NOW)
    assert log.segment_base_offsets == [0, 6, 12]
    simulate_crash(log)
    (tmp_path / "orders-0-0" / "log-state.checkpoint").unlink(missing_ok=True)  # nothing known flushed: check all
    middle = tmp_path / "orders-0-0" / f"{6:020d}.log"
    os.truncate(middle, one + 20)

    again = open_log(tmp_path, segment_bytes=2 * one)
    assert again.segment_base_offsets == [0, 6]
    assert again.log_end_offset == 9
    assert not (tmp_path / "orders-0-0" / f"{12:020d}.log").exists()
    assert record_offsets(again) == list(range(9))


def test_junk_after_a_clean_shutdown_is_still_cut(tmp_path):
    log = open_log(tmp_path)
    log.append_as_leader(batch(3), 0, NOW)
    log.close()
    seg = segment_files(log)[0]
    with open(seg, "ab") as f:
        f.write(b"\x00" * 30)  # shorter than a batch header: a header walk alone would not notice
    again = Log.open(log.dir, LogConfig(), now_ms=NOW, clean_shutdown=True)
    assert seg.stat().st_size == len(batch(3)) and again.log_end_offset == 3
    again.append_as_leader(batch(2), 0, NOW)
    assert record_offsets(again) == list(range(5))


def test_recovery_rederives_leader_epochs_and_drops_lost_ones(tmp_path):
    log = open_log(tmp_path)
    log.append_as_leader(batch(3), 1, NOW)
    log.append_as_leader(batch(3), 2, NOW)
    cache_file = log.dir / "leader-epoch-checkpoint"
    simulate_crash(log)
    cache_file.unlink(missing_ok=True)  # lost (or never written): the batches still say which epoch wrote them
    assert open_log(tmp_path).leader_epoch_cache.entries == [(1, 0), (2, 3)]


def test_missing_or_damaged_indexes_are_rebuilt(tmp_path):
    log = open_log(tmp_path, index_interval_bytes=50, segment_bytes=400)
    for i in range(12):
        log.append_as_leader(batch(2, ts=NOW + 10 * i), 0, NOW)
    log.close()
    indexes = segment_files(log, ".index")
    expected = [p.read_bytes() for p in indexes]
    time_expected = segment_files(log, ".timeindex")[0].read_bytes()
    indexes[0].unlink()
    with open(indexes[1], "ab") as f:
        f.write(b"\x01\x02\x03")  # not a whole entry
    segment_files(log, ".timeindex")[0].unlink()

    again = open_log(tmp_path, index_interval_bytes=50, segment_bytes=400)
    assert [p.read_bytes() for p in segment_files(again, ".index")] == expected
    assert segment_files(again, ".timeindex")[0].read_bytes() == time_expected
    for offset in range(24):
        assert decode_batches(fetched(again.read(offset, 1)))[0].base_offset == offset - offset % 2
    assert again.offset_for_timestamp(NOW + 35) == (8, NOW + 40)


def test_leftover_files_are_cleaned_on_open(tmp_path):
    log = open_log(tmp_path)
    log.append_as_leader(batch(1), 0, NOW)
    log.close()
    (log.dir / f"{5:020d}.log.deleted").write_bytes(b"old")
    (log.dir / f"{9:020d}.index").write_bytes(b"")  # index without a log
    (log.dir / "log-state.checkpoint.tmp").write_bytes(b"half")
    open_log(tmp_path)
    names = {p.name for p in log.dir.iterdir()}
    assert f"{5:020d}.log.deleted" not in names and f"{9:020d}.index" not in names
    assert "log-state.checkpoint.tmp" not in names


def test_topic_id_mismatch_is_reported_and_the_log_refuses_io(tmp_path):
    first = uuid.uuid4()
    Log.open(tmp_path / "t-0-0", LogConfig(), topic_id=first).close()
    assert "topic_id:" in (tmp_path / "t-0-0" / "partition.metadata").read_text()
    stale = Log.open(tmp_path / "t-0-0", LogConfig(), topic_id=uuid.uuid4())
    assert stale.topic_id == first  # the caller compares, and deletes the stale replica
    with pytest.raises(InconsistentTopicIdError) as err:
        stale.append_as_leader(batch(1), 0, NOW)
    assert err.value.error_code == 103
    with pytest.raises(InconsistentTopicIdError):
        stale.read(0, 100)
    stale.close()
    reopened = Log.open(tmp_path / "t-0-0", LogConfig())
    assert reopened.topic_id == first
    reopened.delete()
    assert not (tmp_path / "t-0-0").exists()


# -- truncation and leader epochs ----------------------------------------------------------------


def _epoch_history(log: Log) -> None:
    """Epoch 1: offsets 0-5, epoch 2: 6-11, epoch 3: 12-14 (batches of three)."""
    for epoch, count in ((1, 2), (2, 2), (3, 1)):
        for _ in range(count):
            log.append_as_leader(batch(3), epoch, NOW)


def test_truncate_to_drops_records_and_epochs(tmp_path):
    log = open_log(tmp_path, segment_bytes=2 * len(batch(3)))
    _epoch_history(log)
    log.update_high_watermark(15)
    assert log.leader_epoch_cache.entries == [(1, 0), (2, 6), (3, 12)]
    assert log.segment_base_offsets == [0, 6, 12]

    log.truncate_to(9)
    assert log.log_end_offset == 9 and log.high_watermark == 9
    assert log.segment_base_offsets == [0, 6]
    assert log.leader_epoch_cache.entries == [(1, 0), (2, 6)]
    assert record_offsets(log) == list(range(9))
    with pytest.raises(OffsetOutOfRangeError):
        log.read(10, 100)
    assert log.append_as_leader(batch(3), 4, NOW).first_offset == 9
    assert log.leader_epoch_cache.entries == [(1, 0), (2, 6), (4, 9)]

    log.truncate_to(7)  # mid-batch: the batch holding 7 (6-8) goes whole
    assert log.log_end_offset == 6 and log.leader_epoch_cache.entries == [(1, 0)]
    log.truncate_to(100)  # beyond the end: nothing happens
    assert log.log_end_offset == 6
    log.close()
    again = open_log(tmp_path, segment_bytes=2 * len(batch(3)))
    assert again.log_end_offset == 6 and again.leader_epoch_cache.entries == [(1, 0)]
    assert record_offsets(again) == list(range(6))


def test_truncate_fully_and_start_at(tmp_path):
    log = open_log(tmp_path)
    _epoch_history(log)
    log.truncate_fully_and_start_at(1000)
    assert (log.log_start_offset, log.log_end_offset, log.high_watermark) == (1000, 1000, 1000)
    assert log.segment_base_offsets == [1000] and log.leader_epoch_cache.entries == []
    assert log.read(1000, 100).records == []
    with pytest.raises(OffsetOutOfRangeError):
        log.read(5, 100)
    assert log.append_as_leader(batch(2), 7, NOW).first_offset == 1000
    log.close()
    assert open_log(tmp_path).log_start_offset == 1000


def test_end_offset_for_epoch_follows_kafka(tmp_path):
    log = open_log(tmp_path)
    _epoch_history(log)
    cache = log.leader_epoch_cache
    leo = log.log_end_offset
    assert cache.end_offset_for(1, leo) == (1, 6)
    assert cache.end_offset_for(2, leo) == (2, 12)
    assert cache.end_offset_for(3, leo) == (3, 15)  # latest epoch: the log end offset
    assert cache.end_offset_for(0, leo) == (0, 0)  # older than all: the first epoch's start
    assert cache.end_offset_for(9, leo) == (-1, -1)
    assert cache.end_offset_for(-1, leo) == (-1, -1)
    assert cache.epoch_for_offset(7) == 2 and cache.latest_epoch() == 3


def test_leader_epoch_cache_rules_and_persistence(tmp_path):
    path = tmp_path / "leader-epoch-checkpoint"
    cache = LeaderEpochCache.load(path)
    assert cache.latest_epoch() == -1 and cache.end_offset_for(0, 10) == (-1, -1)
    cache.assign(2, 10)
    cache.assign(2, 15)  # same epoch later: no change
    cache.assign(4, 20)
    cache.assign(5, 30)
    assert cache.entries == [(2, 10), (4, 20), (5, 30)]
    cache.assign(3, 25)  # a conflicting older epoch replaces what follows it, as Kafka does
    assert cache.entries == [(2, 10), (3, 25)]
    cache.assign(6, 40)
    cache.truncate_from_start(22)
    assert cache.entries == [(2, 22), (3, 25), (6, 40)]
    cache.truncate_from_end(40)
    assert cache.entries == [(2, 22), (3, 25)]
    assert path.read_text() == "0\n2\n2 22\n3 25\n"
    assert LeaderEpochCache.load(path).entries == [(2, 22), (3, 25)]
    path.write_text("0\n2\n1 5\n")
    with pytest.raises(StorageError):
        LeaderEpochCache.load(path)


# -- retention and DeleteRecords -----------------------------------------------------------------


def _segmented(tmp_path: Path, *, replicated: bool = True, **cfg) -> Log:
    """Five segments of two batches (six offsets) each, batch i timestamped NOW + i*1000; the high
    watermark at the end unless `replicated` is False."""
    log = open_log(tmp_path, segment_bytes=2 * len(batch(3)), **cfg)
    for i in range(9):
        log.append_as_leader(batch(3, ts=NOW + i * 1000), 0, NOW)
    if replicated:
        log.update_high_watermark(log.log_end_offset)
    assert log.segment_base_offsets == [0, 6, 12, 18, 24]
    return log


def test_retention_by_time_deletes_whole_old_segments(tmp_path):
    log = _segmented(tmp_path, retention_ms=10_000, file_delete_delay_ms=1000)
    # segments' newest timestamps: NOW+1002, +3002, +5002, +7002, +8002 (active)
    assert log.enforce_retention(NOW + 13_500) == 2
    assert log.segment_base_offsets == [12, 18, 24]
    assert log.log_start_offset == 12
    with pytest.raises(OffsetOutOfRangeError):
        log.read(11, 100)
    assert record_offsets(log)[0] == 12
    deleted = sorted(p.name for p in log.dir.iterdir() if p.name.endswith(".deleted"))
    assert f"{0:020d}.log.deleted" in deleted and len(deleted) == 6

    # everything old: the active segment goes too (tests/test_retention.py); the first purge is due
    assert log.enforce_retention(NOW + 100_000) == 3
    assert log.segment_base_offsets == [27]
    assert not any(p.name.endswith(".deleted") and p.name.startswith(f"{0:020d}") for p in log.dir.iterdir())


def test_retention_by_bytes_deletes_oldest_whole_segments(tmp_path):
    log = _segmented(tmp_path, retention_bytes=5 * len(batch(3)), retention_ms=-1)
    assert log.size_bytes == 9 * len(batch(3))
    assert log.enforce_retention(NOW) == 2
    assert log.segment_base_offsets == [12, 18, 24]
    assert log.size_bytes == 5 * len(batch(3))
    assert log.enforce_retention(NOW) == 0


def test_retention_never_deletes_past_the_high_watermark(tmp_path):
    log = _segmented(tmp_path, replicated=False, retention_ms=1)  # followers have not caught up yet
    assert log.high_watermark == 0
    assert log.enforce_retention(NOW + 10**9) == 0
    log.update_high_watermark(13)
    assert log.enforce_retention(NOW + 10**9) == 2  # segments ending at 6 and 12; the one holding 13 stays
    assert log.segment_base_offsets == [12, 18, 24]


def test_delete_records_before_moves_log_start_and_deletes_whole_segments(tmp_path):
    log = _segmented(tmp_path)
    assert log.delete_records_before(14) == 14
    assert log.log_start_offset == 14 and log.segment_base_offsets == [12, 18, 24]
    with pytest.raises(OffsetOutOfRangeError):
        log.read(13, 100)
    assert record_offsets(log, 14)[0] == 12  # the batch holding 14 starts before it
    assert log.delete_records_before(5) == 14  # never backwards
    with pytest.raises(OffsetOutOfRangeError):
        log.delete_records_before(log.high_watermark + 1)
    log.close()
    assert open_log(tmp_path, segment_bytes=2 * len(batch(3))).log_start_offset == 14


# -- timestamps ----------------------------------------------------------------------------------


def test_offset_for_timestamp_and_max_timestamp(tmp_path):
    log = open_log(tmp_path, segment_bytes=2 * len(batch(3)), index_interval_bytes=1)
    assert log.offset_for_timestamp(0) is None and log.max_timestamp() == (-1, -1)
    for i in range(6):  # batch i: offsets 3i..3i+2, timestamps NOW+100i .. +2
        log.append_as_leader(batch(3, ts=NOW + 100 * i), 0, NOW)
    late = encode_batch(
        [
            Record(value=b"a", timestamp=NOW + 50),
            Record(value=b"b", timestamp=NOW + 9999),
            Record(value=b"c", timestamp=NOW + 60),
        ]
    )
    log.append_as_leader(late, 0, NOW)  # offsets 18-20, the max sits in the middle
    log.append_as_leader(batch(3, ts=NOW + 700), 0, NOW)

    assert log.offset_for_timestamp(0) == (0, NOW)
    assert log.offset_for_timestamp(NOW + 1) == (1, NOW + 1)
    assert log.offset_for_timestamp(NOW + 150) == (6, NOW + 200)
    assert log.offset_for_timestamp(NOW + 301) == (10, NOW + 301)
    assert log.offset_for_timestamp(NOW + 600) == (19, NOW + 9999)
    assert log.offset_for_timestamp(NOW + 10_000) is None
    assert log.max_timestamp() == (NOW + 9999, 19)
    log.close()
    again = open_log(tmp_path, segment_bytes=2 * len(batch(3)), index_interval_bytes=1)
    assert again.max_timestamp() == (NOW + 9999, 19)
    assert again.offset_for_timestamp(NOW + 150) == (6, NOW + 200)
    again.update_high_watermark(again.log_end_offset)
    again.delete_records_before(7)
    assert again.offset_for_timestamp(0) == (7, NOW + 201)


# -- follower appends ----------------------------------------------------------------------------


def test_follower_append_copies_leader_bytes_and_epochs(tmp_path):
    leader = open_log(tmp_path, "t-0-0")
    leader.append_as_leader(batch(3), 1, NOW)
    leader.append_as_leader(batch(2), 2, NOW)
    leader.append_as_leader(batch(4), 2, NOW)
    follower = open_log(tmp_path / "other", "t-0-0")

    fetch = fetched(leader.read(0, 1 << 20))
    info = follower.append_as_follower(fetch[:-7])  # ends mid-batch, as a fetch may
    assert (info.first_offset, info.last_offset, info.batch_count) == (0, 4, 2)
    assert follower.log_end_offset == 5
    rest = fetched(leader.read(5, 1 << 20))
    follower.append_as_follower(memoryview(rest))
    assert fetched(follower.read(0, 1 << 20)) == fetch
    assert follower.leader_epoch_cache.entries == leader.leader_epoch_cache.entries == [(1, 0), (2, 3)]

    with pytest.raises(UnexpectedAppendOffsetError) as err:
        follower.append_as_follower(fetch)
    assert err.value.expected_offset == 9
    with pytest.raises(InvalidRecordError):
        follower.append_as_follower(_flip(rest, 70))
    assert follower.log_end_offset == 9 and follower.append_as_follower(b"").batch_count == 0


def test_follower_append_larger_than_a_segment_is_split(tmp_path):
    leader = open_log(tmp_path, "t-0-0")
    for _ in range(5):
        leader.append_as_leader(batch(3), 0, NOW)
    follower = open_log(tmp_path / "f", "t-0-0", segment_bytes=2 * len(batch(3)))
    follower.append_as_follower(fetched(leader.read(0, 1 << 20)))
    assert follower.segment_base_offsets == [0, 6, 12]
    assert record_offsets(follower) == list(range(15))


# -- config, names, log dirs, failures -----------------------------------------------------------


def test_log_config_from_properties():
    base = LogConfig(retention_ms=1)
    cfg = LogConfig.from_properties(
        {
            "segment.bytes": "2048",
            "retention.ms": "-1",
            "message.timestamp.type": "LogAppendTime",
            "cleanup.policy": "delete",
        },
        base,
    )
    assert (cfg.segment_bytes, cfg.retention_ms, cfg.log_append_time, cfg.segment_ms) == (2048, -1, True, 604800000)
    assert LogConfig.from_properties({}) == LogConfig()
    with pytest.raises(ValueError, match="segment.bytes"):
        LogConfig.from_properties({"segment.bytes": "lots"})
    with pytest.raises(ValueError, match="index.interval.bytes"):
        LogConfig.from_properties({"index.interval.bytes": "-3"})
    with pytest.raises(ValueError, match="message.timestamp.type"):
        LogConfig.from_properties({"message.timestamp.type": "WallTime"})


def test_replica_dir_names():
    assert replica_dir_name("my-topic.v2_x", 3, 100) == "my-topic.v2_x-3-100"
    assert parse_replica_dir_name("my-topic.v2_x-3-100") == ("my-topic.v2_x", 3, 100, "")
    assert parse_replica_dir_name("a-b-0-0.move") == ("a-b", 0, 0, ".move")
    assert parse_replica_dir_name("nodigits") is None
    with pytest.raises(ValueError):
        replica_dir_name("../etc", 0, 0)
    with pytest.raises(ValueError):
        Log.open(Path("/tmp/not-a-replica"), LogConfig())


def test_log_dir_format_check_list_and_open(tmp_path):
    root = tmp_path / "data1"
    d = LogDir(root)
    d.format_or_check(node_id=1, cluster_id="abc")
    props = dict(line.split("=", 1) for line in (root / "meta.properties").read_text().splitlines() if "=" in line)
    assert props["version"] == "1" and props["node.id"] == "1" and props["cluster.id"] == "abc"
    first_id = d.directory_id

    same = LogDir(root)
    same.format_or_check(1, "abc")
    assert same.directory_id == first_id
    with pytest.raises(StorageError, match="node.id"):
        LogDir(root).format_or_check(2, "abc")
    with pytest.raises(StorageError, match="cluster"):
        LogDir(root).format_or_check(1, "other")

    log = d.open_log("my-topic.v2", 3, 100, LogConfig())
    assert log.dir == root / "my-topic.v2-3-100" and log.log_end_offset == 100
    d.open_log("x", 0, 0, LogConfig())
    (root / "x-1-0.move").mkdir()
    (root / "x-2-0.delete").mkdir()
    (root / "lost+found").mkdir()
    (root / "y-0-0").write_text("a file, not a dir")
    assert d.list_replicas() == [("my-topic.v2", 3, 100, root / "my-topic.v2-3-100"), ("x", 0, 0, root / "x-0-0")]
    total, usable = d.usage()
    assert total >= usable > 0

    unformatted = tmp_path / "data2"
    (unformatted / "x-0-0").mkdir(parents=True)
    with pytest.raises(StorageError, match="refusing"):
        LogDir(unformatted).format_or_check(1, "abc")


def test_io_error_fails_the_log_and_takes_its_dir_offline(tmp_path, monkeypatch):
    d = LogDir(tmp_path / "data")
    d.format_or_check(1, "c")
    log = d.open_log("t", 0, 0, LogConfig())
    log.append_as_leader(batch(1), 0, NOW)

    def no_space(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "pwrite", no_space)
    with pytest.raises(StorageError) as err:
        log.append_as_leader(batch(1), 0, NOW)
    monkeypatch.undo()
    assert err.value.error_code == 56
    assert not d.online and "No space" in d.offline_reason
    assert log.log_end_offset == 1
    with pytest.raises(StorageError):
        log.read(0, 100)
    with pytest.raises(StorageError, match="offline"):
        d.open_log("t", 1, 0, LogConfig())


def test_reads_during_appends_see_only_whole_batches(tmp_path):
    log = open_log(tmp_path, segment_bytes=4000, index_interval_bytes=200)
    done = threading.Event()
    errors: list[BaseException] = []

    def produce() -> None:
        try:
            for i in range(300):
                log.append_as_leader(batch(2, ts=NOW + i), 0, NOW)
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)
        finally:
            done.set()

    writer = threading.Thread(target=produce)
    writer.start()
    reads = 0
    while not done.is_set() or reads == 0:
        batches = list(iter_batches(fetched(log.read(0, 1 << 30)), check_crc=True))  # partial data would raise
        assert [h.base_offset for _, h in batches] == list(range(0, 2 * len(batches), 2))
        reads += 1
    writer.join()
    assert not errors
    assert record_offsets(log) == list(range(600)) and len(log.segment_base_offsets) > 5


# -- descriptor budget (FileCache) ---------------------------------------------------------------


def _fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_descriptor_budget_holds_across_many_logs(tmp_path):
    from broker.storage.file_cache import FILE_CACHE

    old = FILE_CACHE.capacity
    FILE_CACHE.close_all()
    before = _fd_count()
    FILE_CACHE.set_capacity(12)
    try:
        logs = [open_log(tmp_path, f"t-{i}-0", segment_bytes=len(batch(3)) * 2 + 10) for i in range(40)]
        for round_ in range(5):  # rolls every second append: old segments and their indexes pile up
            for lg in logs:
                lg.append_as_leader(batch(3, ts=NOW + round_), 0, NOW)
        for lg in logs:
            lg.wait_for_background_flush()
            assert record_offsets(lg) == list(range(15))
            assert lg.offset_for_timestamp(NOW + 3)[0] == 5  # round 1 holds NOW+1..NOW+3
        assert FILE_CACHE.open_count <= 12
        assert _fd_count() - before <= 12
        for lg in logs[:20]:
            lg.close()
        gone = logs[20]._local.segments[-1]  # the truncation below deletes it; retention then purges it
        for lg in logs[20:]:
            lg.truncate_to(4)
            lg.enforce_retention(NOW + 10**12)
        with pytest.raises(FileNotFoundError):  # a late reader of a purged segment: no reopen
            gone.read_batch(0, 10)
        reopened = [open_log(tmp_path, f"t-{i}-0", segment_bytes=len(batch(3)) * 2 + 10) for i in range(20)]
        assert all(record_offsets(lg) == list(range(15)) for lg in reopened)
        assert _fd_count() - before <= 12
    finally:
        FILE_CACHE.set_capacity(old)


def test_reader_keeps_its_descriptor_while_the_cache_evicts(tmp_path):
    from broker.storage.file_cache import CachedFile, FileCache

    cache = FileCache(8)
    files = []
    for i in range(20):
        path = tmp_path / f"f{i}"
        path.write_bytes(b"x%d" % i)
        files.append(CachedFile(path, os.O_RDONLY, cache))
    with files[0].open() as fd:
        for f in files[1:]:  # every other file passes through the cache meanwhile
            with f.open():
                pass
        assert os.pread(fd, 8, 0) == b"x0"  # still our file: pinned descriptors are never evicted
        files[0].close()  # closing while pinned defers to the last unpin
        assert os.pread(fd, 8, 0) == b"x0"
    assert files[0].fd is None and cache.open_count <= 8
    files[1].rename(tmp_path / "renamed")
    with files[1].open() as fd:
        assert os.pread(fd, 8, 0) == b"x1"


def test_out_of_descriptors_is_retriable_and_keeps_the_dir_online(tmp_path):
    import resource

    from broker.storage import ResourceExhaustedError
    from broker.storage.file_cache import FILE_CACHE

    errors = []
    lg = Log.open(tmp_path / "orders-0-0", LogConfig(), io_error_handler=lambda d, e: errors.append(e))
    lg.append_as_leader(batch(3), 0, NOW)
    FILE_CACHE.close_all()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    in_use = {int(n) for n in os.listdir("/proc/self/fd") if os.path.exists(f"/proc/self/fd/{n}")}
    lowest_free = next(n for n in range(len(in_use) + 1) if n not in in_use)
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, hard))  # not one descriptor left
    try:
        with pytest.raises(ResourceExhaustedError) as info:
            lg.append_as_leader(batch(3), 0, NOW)
        assert info.value.error_code == 7  # REQUEST_TIMED_OUT: retriable, not KAFKA_STORAGE_ERROR
        with pytest.raises(ResourceExhaustedError):
            Log.open(tmp_path / "other-0-0", LogConfig(), io_error_handler=lambda d, e: errors.append(e))
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert errors == []  # the dir's handler never heard of it: the dir stays online
    lg.append_as_leader(batch(3), 0, NOW)  # descriptors are back: service resumes
    assert record_offsets(lg) == list(range(6))


def test_a_checkpoint_racing_the_logs_deletion_keeps_the_dir_online(tmp_path, monkeypatch):
    """The checkpoint writes outside the log's lock: a replica deleted meanwhile (its topic
    deleted) makes that write fail with ENOENT, which is no disk error, so the dir's handler must
    not hear of it (it took the whole log dir offline)."""
    import broker.storage.log_state as log_module

    errors = []
    lg = Log.open(tmp_path / "orders-0-0", LogConfig(), io_error_handler=lambda d, e: errors.append(e))
    lg.append_as_leader(batch(3), 0, NOW)
    lg.update_high_watermark(3)
    real_write = log_module.write_log_state

    def deleted_first(path, state, *, sync=True):
        lg.delete()  # what a topic deletion on the loop does between the snapshot and the write
        real_write(path, state, sync=sync)

    monkeypatch.setattr(log_module, "write_log_state", deleted_first)
    assert lg.checkpoint() is False
    assert errors == [] and not lg.dir.exists()


# -- the dir's high watermarks (log_state.py) ---------------------------------------------------


def _checkpoint(logs: list[Log], dirs: list[LogDir]) -> None:
    from broker.replication.log_maintenance import _checkpoint_all

    _checkpoint_all(logs, dirs)


def _checkpointed_log(tmp_path: Path, records: int) -> tuple[Path, LogDir, Log]:
    """A log dir holding t-0-0 with `records` records, all below the high watermark, checkpointed."""
    root = tmp_path / "data"
    d = LogDir(root)
    d.format_or_check(1, "abc")
    lg = d.open_log("t", 0, 0, LogConfig())
    lg.append_as_leader(batch(records), 0, NOW)
    lg.update_high_watermark(records)
    _checkpoint([lg], [d])
    return root, d, lg


def _reopened(root: Path, name: tuple[str, int, int]) -> Log:
    d = LogDir(root)
    d.format_or_check(1, "abc")
    return d.open_log(*name, LogConfig())


def test_a_moved_high_watermark_goes_to_the_dirs_file_not_the_logs_own(tmp_path):
    """The periodic checkpoint writes one file a log dir for the high watermarks; a log's own
    state file is written once it has records, then only when its log start or recovery point
    moves. After a crash the high watermark comes back from the dir's file."""
    root = tmp_path / "data"
    d = LogDir(root)
    d.format_or_check(1, "abc")
    logs = [d.open_log("t", i, 0, LogConfig()) for i in range(3)]
    idle = d.open_log("idle", 0, 0, LogConfig())
    for lg in logs:
        lg.append_as_leader(batch(2), 0, NOW)
        lg.update_high_watermark(2)
    _checkpoint(logs + [idle], [d])
    own = logs[0].dir / "log-state.checkpoint"
    first = own.read_bytes()  # written once: a log with records needs one for its dir entry to count
    assert not (idle.dir / "log-state.checkpoint").exists()  # created, no records: nothing yet
    for lg in logs:
        lg.append_as_leader(batch(3), 0, NOW)
        lg.update_high_watermark(5)
    _checkpoint(logs + [idle], [d])
    assert own.read_bytes() == first  # the high watermark alone moved: not rewritten
    text = (root / "high-watermark-checkpoint").read_text()
    assert text.startswith("0\n4\n") and " 5\n" in text
    for lg in logs:
        simulate_crash(lg)
    again = _reopened(root, ("t", 1, 0))
    assert (again.log_end_offset, again.high_watermark) == (5, 5)


def test_a_truncation_voids_the_dirs_older_high_watermark(tmp_path):
    """A follower truncated after the dir's file was written, then appending other records up to
    the old high watermark, must not get that high watermark back after a crash: the truncation
    draws a new incarnation, and the dir's entry names the old one."""
    root = tmp_path / "data"
    d = LogDir(root)
    d.format_or_check(1, "abc")
    lg = d.open_log("t", 0, 0, LogConfig())
    lg.append_as_follower(batch(4))  # offsets 0..3
    lg.append_as_follower(_with_header_field(batch(6), ">q", 0, 4))  # 4..9
    lg.update_high_watermark(10)
    _checkpoint([lg], [d])
    lg.truncate_to(4)  # a new leader's log diverged at 4
    assert lg.high_watermark == 4
    lg.append_as_follower(_with_header_field(batch(6, tag="new"), ">q", 0, 4))  # offsets 4..9 again
    simulate_crash(lg)
    again = _reopened(root, ("t", 0, 0))
    assert again.log_end_offset == 10 and again.high_watermark == 4


def test_a_recreated_log_ignores_an_entry_left_by_its_predecessor(tmp_path):
    """A replica deleted and created again under the same name (its partition moved away and
    back) starts from its own state, not from the dir entry its predecessor left."""
    root, d, lg = _checkpointed_log(tmp_path, 8)
    lg.delete()
    d = LogDir(root)
    d.format_or_check(1, "abc")  # reads the dir's file, which still names t-0-0
    new = d.open_log("t", 0, 0, LogConfig())
    new.append_as_leader(batch(8), 0, NOW)
    new.flush()  # its own state file, before any checkpoint replaced the dir's
    simulate_crash(new)
    again = _reopened(root, ("t", 0, 0))
    assert again.log_end_offset == 8 and again.high_watermark == 0


def test_a_clean_shutdown_writes_the_dirs_high_watermarks_and_no_state_file(tmp_path):
    """A broker's shutdown closes its logs with the high watermarks left to the dir's file: a
    log whose state file already stands for its log start and recovery point is not rewritten."""
    root, d, lg = _checkpointed_log(tmp_path, 4)
    own = lg.dir / "log-state.checkpoint"
    before = own.stat().st_mtime_ns, own.read_bytes()
    lg.update_high_watermark(4)
    lg.append_as_leader(batch(2), 0, NOW)
    lg.update_high_watermark(6)
    lg.close(sync=False, hw_in_dir=True)
    assert d.write_high_watermarks({lg.dir.name: lg.high_watermark_entry()})
    assert d.mark_clean_shutdown()
    assert (own.stat().st_mtime_ns, own.read_bytes()) == before
    again = _reopened(root, ("t", 0, 0))
    assert (again.log_end_offset, again.high_watermark) == (6, 6)


def test_recovery_rebuilds_indexes_over_stale_longer_and_missing_files(tmp_path):
    """Recovery writes the rebuilt index entries over the old files: entries past them (a torn
    tail's, or junk) are cut, a missing index file is made, and lookups match the batches."""
    log = open_log(tmp_path, index_interval_bytes=1)  # an index entry for every batch
    for i in range(6):
        log.append_as_leader(batch(2, ts=NOW + 10 * i), 0, NOW)
    whole = 4 * len(batch(2))
    simulate_crash(log)
    seg = segment_files(log)[0]
    os.truncate(seg, whole + 5)  # two batches lost, the third torn
    index, timeindex = segment_files(log, ".index")[0], segment_files(log, ".timeindex")[0]
    with open(index, "ab") as f:
        f.write(b"\xff" * 8 * 3)  # stale entries past the ones the rebuild writes
    timeindex.unlink()

    again = open_log(tmp_path, index_interval_bytes=1)
    assert again.log_end_offset == 8
    seg0 = again._local.segments[0]
    assert index.stat().st_size == seg0.offset_index.entries * 8 and seg0.offset_index.entries >= 3
    assert timeindex.stat().st_size == seg0.time_index.entries * 12 and seg0.time_index.entries >= 3
    assert b"\xff" * 8 not in index.read_bytes()
    assert record_offsets(again) == list(range(8))
    for offset in range(8):  # every read goes through the rebuilt offset index
        assert record_offsets(again, offset)[:1] == [offset - offset % 2]
    for i in range(4):  # and the rebuilt time index
        assert again.offset_for_timestamp(NOW + 10 * i)[0] == 2 * i
