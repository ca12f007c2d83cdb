"""Log compaction (broker/storage/cleaner.py): storage level on real files, then one broker with
confluent-kafka: compaction keeps the latest value per key and drops
tombstones after delete.retention.ms."""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
import time
from pathlib import Path

import pytest

from broker.storage import AppendOrigin, Log, LogConfig
from broker.storage.cleaner import (
    CLEANER_CHECKPOINT,
    CleanerConfig,
    LogCleaner,
    clean_log,
    plan_cleaning,
    read_checkpoint,
    retention_applies,
)
from protocol.records import Compression, Record, decode_batches, encode_batch, iter_batches
from protocol.records.batch import ATTR_DELETE_HORIZON

NOW = 1_700_000_000_000
DAY = 86_400_000
COMPACT = CleanerConfig(min_cleanable_dirty_ratio=0.0)


# -- helpers -------------------------------------------------------------------------------------


def open_log(path: Path, now_ms: int = NOW, **cfg) -> Log:
    cfg.setdefault("segment_bytes", 700)
    cfg.setdefault("index_interval_bytes", 64)
    return Log.open(path, LogConfig(**cfg), now_ms=now_ms)


def append(lg: Log, pairs, ts: int = NOW, **kw) -> tuple[int, int]:
    """One batch of (key, value) records; returns its (first, last) offset."""
    recs = [Record(value=v, key=k, timestamp=ts + i) for i, (k, v) in enumerate(pairs)]
    info = lg.append_as_leader(encode_batch(recs, **kw), 0, ts)
    return info.first_offset, info.last_offset


def seal(lg: Log) -> None:
    """Everything written becomes cleanable: a roll (the active segment is never cleaned) and the
    high watermark at the log end (nothing at or above it is cleaned)."""
    lg.roll(NOW)
    lg.update_high_watermark(lg.log_end_offset)


def raw(lg: Log, offset: int | None = None) -> bytes:
    info = lg.read(lg.log_start_offset if offset is None else offset, 1 << 30)
    return b"".join(bytes(p) for p in info.records)


def records(lg: Log, offset: int | None = None):
    return [r for b in decode_batches(raw(lg, offset)) for r in b.records]


def snapshot(lg: Log):
    return [(r.offset, r.key, r.value, r.timestamp) for r in records(lg)]


def write_updates(lg: Log, keys: int = 8, rounds: int = 25, per_batch: int = 3) -> dict[bytes, tuple[int, bytes]]:
    """rounds x keys updates, several keys per batch; returns key -> (offset, value) of the latest."""
    latest: dict[bytes, tuple[int, bytes]] = {}
    pending: list[tuple[bytes, bytes]] = []
    for r in range(rounds):
        for k in range(keys):
            pending.append((b"key-%d" % k, b"value-%d-%d" % (k, r)))
            if len(pending) == per_batch:
                first, _ = append(lg, pending, ts=NOW + r)
                for i, (key, value) in enumerate(pending):
                    latest[key] = (first + i, value)
                pending = []
    if pending:
        first, _ = append(lg, pending, ts=NOW + rounds)
        for i, (key, value) in enumerate(pending):
            latest[key] = (first + i, value)
    return latest


def assert_latest_only(lg: Log, latest: dict[bytes, tuple[int, bytes]]) -> None:
    recs = records(lg)
    assert sorted((r.key, r.offset, r.value) for r in recs) == sorted((k, o, v) for k, (o, v) in latest.items())
    offsets = [r.offset for r in recs]
    assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)


def segment_files(lg: Log) -> list[str]:
    return sorted(p.name for p in lg.dir.iterdir() if p.name.endswith(".log"))


def leftovers(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir() if p.name.endswith((".cleaned", ".swap")))


# -- storage level -------------------------------------------------------------------------------


def test_latest_value_per_key_across_many_segments(tmp_path):
    lg = open_log(tmp_path / "t-0-0")
    latest = write_updates(lg)
    seal(lg)
    leo, before_segments = lg.log_end_offset, len(lg.segment_base_offsets)
    assert before_segments > 10
    result = clean_log(lg, COMPACT, NOW)
    assert result is not None and result.keys == 8 and result.records_kept == 8 + 0 and result.records_read == 200
    assert result.end_offset == lg.active_segment_base_offset
    assert_latest_only(lg, latest)
    assert lg.log_end_offset == leo and lg.log_start_offset == 0
    assert read_checkpoint(lg.dir).first_dirty_offset == lg.active_segment_base_offset
    assert leftovers(lg.dir) == []
    # A second round merges the now small segments (groups up to segment.bytes) and changes no record.
    before = snapshot(lg)
    assert clean_log(lg, COMPACT, NOW) is None  # nothing dirty: not due
    rounds = [clean_log(lg, COMPACT, NOW, force=True).groups_swapped for _ in range(4)]
    assert rounds[0] > 0 and rounds[-1] == 0  # merging converges, then rounds rewrite nothing
    assert snapshot(lg) == before
    assert len(lg.segment_base_offsets) < before_segments / 3
    files = {p.name: p.read_bytes() for p in lg.dir.iterdir() if p.suffix in (".log", ".index", ".timeindex")}
    assert clean_log(lg, COMPACT, NOW, force=True).groups_swapped == 0
    assert {p.name: p.read_bytes() for p in lg.dir.iterdir() if p.suffix in (".log", ".index", ".timeindex")} == files
    # Reopening (clean shutdown and crash-style) gives the same records and offsets.
    lg.close()
    lg = open_log(tmp_path / "t-0-0")
    assert snapshot(lg) == before and lg.log_end_offset == leo
    lg.close()


def test_offsets_batches_and_producer_fields_are_preserved(tmp_path):
    lg = open_log(tmp_path / "t-0-0")
    original = {}
    for i in range(30):
        pairs = [(b"k%d" % (i % 4), b"a%d" % i), (b"k%d" % ((i + 1) % 4), b"b%d" % i), (b"u%d" % i, b"unique")]
        first, last = append(lg, pairs, producer_id=7, producer_epoch=0, base_sequence=3 * i)
        original[first] = last
    seal(lg)
    clean_log(lg, COMPACT, NOW)
    headers = [h for _, h in iter_batches(raw(lg))]
    for h in headers:
        # every surviving batch still spans its original offsets (base offset and lastOffsetDelta
        # kept, so the producer's sequences still line up) with the same producer fields
        assert original[h.base_offset] == h.last_offset
        assert (h.producer_id, h.producer_epoch, h.base_sequence) == (7, 0, h.base_offset)
    recs = records(lg)
    assert len([r for r in recs if r.key.startswith(b"u")]) == 30  # unique keys all survive
    by_key = {r.key: r.value for r in recs}
    assert by_key[b"k1"] == b"a29" and by_key[b"k2"] == b"b29"  # offsets 87 (k1) and 88 (k2) were last
    # Reads from any offset, also inside a gap, start with the batch holding the next surviving record.
    for offset in range(0, lg.log_end_offset):
        got = [r.offset for r in records(lg, offset)]
        assert got and got == sorted(got)
        first = decode_batches(raw(lg, offset))[0]
        assert first.header.last_offset >= offset  # whole batches, starting at or before the offset


def test_tombstones_kept_until_delete_retention_then_dropped(tmp_path):
    drm = 60_000
    cfg = CleanerConfig(min_cleanable_dirty_ratio=0.0, delete_retention_ms=drm)
    lg = open_log(tmp_path / "t-0-0")
    for r in range(10):
        append(lg, [(b"k%d" % k, b"v%d-%d" % (k, r)) for k in range(5)], ts=NOW + r)
    t1, _ = append(lg, [(b"k1", None), (b"k3", None)], ts=NOW + 50)
    append(lg, [(b"k4", b"late")], ts=NOW + 60)
    seal(lg)

    clean_log(lg, cfg, NOW + 1000)
    recs = {r.key: r for r in records(lg)}
    assert set(recs) == {b"k0", b"k1", b"k2", b"k3", b"k4"}
    assert recs[b"k1"].value is None and recs[b"k3"].value is None and recs[b"k4"].value == b"late"
    assert (recs[b"k1"].offset, recs[b"k3"].offset) == (t1, t1 + 1)
    assert (recs[b"k1"].timestamp, recs[b"k3"].timestamp) == (NOW + 50, NOW + 51)  # re-based, not changed
    stamped = [h for _, h in iter_batches(raw(lg)) if h.attributes & ATTR_DELETE_HORIZON]
    assert len(stamped) == 1 and stamped[0].base_timestamp == NOW + 1000 + drm  # the delete horizon
    assert read_checkpoint(lg.dir).delete_horizon_ms == NOW + 1000 + drm

    # Before the horizon: not due, and even a forced round keeps the tombstones.
    assert plan_cleaning(lg, cfg, NOW + 1000 + drm - 1) is None
    clean_log(lg, cfg, NOW + 1000 + drm - 1, force=True)
    assert {r.key for r in records(lg) if r.value is None} == {b"k1", b"k3"}

    # At the horizon the log is due even with nothing dirty, and the tombstones go.
    plan = plan_cleaning(lg, cfg, NOW + 1000 + drm)
    assert plan is not None and plan.reason == "delete horizon" and plan.dirty_bytes == 0
    result = clean_log(lg, cfg, NOW + 1000 + drm, plan=plan)
    assert result.tombstones_dropped == 2
    assert {r.key: r.value for r in records(lg)} == {b"k0": b"v0-9", b"k2": b"v2-9", b"k4": b"late"}
    assert read_checkpoint(lg.dir).delete_horizon_ms == -1
    lg.close()


def test_a_tombstone_in_the_dirty_part_removes_older_values(tmp_path):
    cfg = CleanerConfig(min_cleanable_dirty_ratio=0.0, delete_retention_ms=0)
    lg = open_log(tmp_path / "t-0-0")
    latest = write_updates(lg, keys=4, rounds=10)
    seal(lg)
    clean_log(lg, cfg, NOW)
    append(lg, [(b"key-2", None)])  # now dirty: the tombstone supersedes the clean value
    seal(lg)
    clean_log(lg, cfg, NOW)
    assert {r.key: r.value for r in records(lg)}[b"key-2"] is None
    clean_log(lg, cfg, NOW + 1)  # horizon = clean time + 0 passed
    del latest[b"key-2"]
    assert_latest_only(lg, latest)
    lg.close()


def test_active_segment_and_segments_above_the_high_watermark_are_untouched(tmp_path):
    lg = open_log(tmp_path / "t-0-0")
    write_updates(lg, keys=4, rounds=20)
    lg.roll(NOW)
    hw_segment = lg.segment_base_offsets[-2]
    lg.update_high_watermark(hw_segment + 1)  # the last inactive segment reaches past the high watermark
    for r in range(5):  # duplicates in the active segment
        append(lg, [(b"key-0", b"active-%d" % r), (b"key-1", b"active-%d" % r)])
    active_path = lg.dir / segment_files(lg)[-1]
    active_before = active_path.read_bytes()
    tail_path = lg.dir / f"{hw_segment:020d}.log"
    tail_before = tail_path.read_bytes()
    result = clean_log(lg, COMPACT, NOW)
    assert result.end_offset == hw_segment
    assert active_path.read_bytes() == active_before and tail_path.read_bytes() == tail_before
    active_values = [r.value for r in records(lg, lg.active_segment_base_offset)]
    assert active_values.count(b"active-0") == 2 and len(active_values) == 10
    lg.close()


def test_dirty_ratio_threshold_and_compaction_lags(tmp_path):
    lg = open_log(tmp_path / "t-0-0")
    write_updates(lg, keys=4, rounds=20)
    seal(lg)
    half = CleanerConfig(min_cleanable_dirty_ratio=0.5)
    plan = plan_cleaning(lg, half, NOW)
    assert plan is not None and plan.ratio == 1.0 and plan.reason == "dirty ratio"  # never cleaned: all dirty
    clean_log(lg, half, NOW, plan=plan)
    assert plan_cleaning(lg, half, NOW) is None  # nothing dirty
    # A little new dirty data: below 0.5, above 0.01.
    append(lg, [(b"key-1", b"x" * 20)])
    seal(lg)
    plan = plan_cleaning(lg, CleanerConfig(min_cleanable_dirty_ratio=0.01), NOW)
    assert plan is not None and 0 < plan.ratio < 0.5
    assert plan.dirty_bytes == lg.cleaner_view().segments[-1].size
    assert plan.total_bytes == sum(s.size for s in lg.cleaner_view().segments)
    assert plan_cleaning(lg, half, NOW) is None
    # max.compaction.lag.ms forces it anyway once the dirty data is older than the lag.
    overdue = CleanerConfig(min_cleanable_dirty_ratio=0.5, max_compaction_lag_ms=1000)
    assert plan_cleaning(lg, overdue, NOW + 500) is None
    assert plan_cleaning(lg, overdue, NOW + 5000).reason == "max.compaction.lag.ms"
    # min.compaction.lag.ms keeps young dirty segments out of the cleanable range.
    young = CleanerConfig(min_cleanable_dirty_ratio=0.0, min_compaction_lag_ms=60_000)
    assert plan_cleaning(lg, young, NOW + 1000) is None
    assert plan_cleaning(lg, young, NOW + 120_000) is not None
    lg.close()


@pytest.mark.parametrize("codec", [Compression.GZIP, Compression.SNAPPY, Compression.LZ4, Compression.ZSTD])
def test_compressed_batches_keep_their_codec(tmp_path, codec):
    lg = open_log(tmp_path / "t-0-0", segment_bytes=2000)
    latest: dict[bytes, tuple[int, bytes]] = {}
    for r in range(12):
        pairs = [(b"key-%d" % k, b"value-%d-%d-" % (k, r) * 5) for k in range(r % 3, 6)]
        first, _ = append(lg, pairs, ts=NOW + r, compression=codec)
        for i, (k, v) in enumerate(pairs):
            latest[k] = (first + i, v)
    append(lg, [(b"key-9", None)], ts=NOW + 99, compression=codec)
    seal(lg)
    clean_log(lg, CleanerConfig(min_cleanable_dirty_ratio=0.0, delete_retention_ms=10), NOW)
    for _, h in iter_batches(raw(lg)):
        assert h.compression == (codec if h.record_count else Compression.NONE)
    assert {r.key: r.value for r in records(lg)}[b"key-9"] is None
    clean_log(lg, CleanerConfig(min_cleanable_dirty_ratio=0.0, delete_retention_ms=10), NOW + 10)
    assert_latest_only(lg, latest)
    lg.close()


def test_emptied_batches_that_must_stay_are_kept_empty(tmp_path):
    """The last batch of an idempotent producer and the last batch of a cleaned segment stay as
    record-less batches (offsets kept), so producer state and segment ends survive."""
    cfg = CleanerConfig(min_cleanable_dirty_ratio=0.0, delete_retention_ms=0)
    lg = open_log(tmp_path / "t-0-0", segment_bytes=1 << 20)
    append(lg, [(b"a", b"1")], producer_id=5, producer_epoch=0, base_sequence=0)
    append(lg, [(b"b", b"1")], producer_id=6, producer_epoch=0, base_sequence=0)
    append(lg, [(b"a", b"2")], producer_id=6, producer_epoch=0, base_sequence=1)
    append(lg, [(b"b", b"2")], producer_id=6, producer_epoch=0, base_sequence=2)
    append(lg, [(b"c", b"1")])
    append(lg, [(b"c", b"2")])
    append(lg, [(b"c", None)])
    seal(lg)
    clean_log(lg, cfg, NOW)

    def summary():
        return [(h.base_offset, h.record_count, h.producer_id) for _, h in iter_batches(raw(lg))]

    # 0: producer 5's only (so last) batch, emptied but kept; 1: producer 6's first batch, dropped;
    # 4, 5: superseded by the tombstone at 6, which stays until its horizon
    assert summary() == [(0, 0, 5), (2, 1, 6), (3, 1, 6), (6, 1, -1)]
    clean_log(lg, cfg, NOW + 1)  # the horizon passed: the tombstone goes, its batch is the segment's last
    assert summary() == [(0, 0, 5), (2, 1, 6), (3, 1, 6), (6, 0, -1)]
    assert [(r.key, r.value) for r in records(lg)] == [(b"a", b"2"), (b"b", b"2")]
    assert records(lg, 4) == [] and lg.read(4, 1 << 20).total_bytes == 61  # the empty batch is served
    lg.close()
    for p in lg.dir.glob("*.snapshot"):  # producer state rebuilt from the batches alone
        p.unlink()
    lg = open_log(tmp_path / "t-0-0", segment_bytes=1 << 20)
    assert lg.producer_state.producers[5].last_seq == 0 and lg.producer_state.producers[6].last_seq == 2
    lg.close()


def _marker(lg: Log, producer_id: int, commit: bool) -> None:
    key = b"\x00\x00\x00\x01" if commit else b"\x00\x00\x00\x00"  # version 0, type COMMIT (1) / ABORT (0)
    batch = encode_batch(
        [Record(key=key, value=b"\x00" * 6)],
        control=True,
        transactional=True,
        producer_id=producer_id,
        producer_epoch=0,
    )
    lg.append_as_leader(batch, 0, NOW, origin=AppendOrigin.COORDINATOR)


def test_transactions_committed_supersede_aborted_do_not_markers_stay(tmp_path):
    cfg = CleanerConfig(min_cleanable_dirty_ratio=0.0, delete_retention_ms=0)
    lg = open_log(tmp_path / "t-0-0", segment_bytes=1 << 20)
    txn = dict(producer_epoch=0, base_sequence=0, transactional=True)
    append(lg, [(b"j", b"plain-j")])  # 0
    append(lg, [(b"k", b"plain-k")])  # 1
    append(lg, [(b"k", b"txn-1"), (b"k", b"txn-2")], producer_id=9, **txn)  # 2, 3
    _marker(lg, 9, commit=True)  # 4
    append(lg, [(b"j", b"aborted")], producer_id=10, **txn)  # 5
    _marker(lg, 10, commit=False)  # 6
    append(lg, [(b"m", b"v"), (b"m", None)], producer_id=11, **txn)  # 7, 8
    _marker(lg, 11, commit=True)  # 9
    seal(lg)
    expected = [
        (False, False, [(0, b"j", b"plain-j")]),  # the aborted transaction does not hide it
        (True, False, [(3, b"k", b"txn-2")]),  # the committed one hides plain-k (offset 1) and txn-1
        (True, True, [(4, b"\x00\x00\x00\x01", b"\x00" * 6)]),  # markers stay
        (True, False, [(5, b"j", b"aborted")]),  # aborted records stay
        (True, True, [(6, b"\x00\x00\x00\x00", b"\x00" * 6)]),
        (True, False, [(8, b"m", None)]),  # a transactional tombstone gets no delete horizon
        (True, True, [(9, b"\x00\x00\x00\x01", b"\x00" * 6)]),
    ]
    for now in (NOW, NOW + DAY):
        clean_log(lg, cfg, now, force=True)
        batches = decode_batches(raw(lg))
        got = [
            (b.header.is_transactional, b.header.is_control, [(r.offset, r.key, r.value) for r in b.records])
            for b in batches
        ]
        assert got == expected
        assert not any(b.header.attributes & ATTR_DELETE_HORIZON for b in batches)
    lg.close()


def test_an_open_transaction_bounds_the_cleanable_range(tmp_path):
    lg = open_log(tmp_path / "t-0-0")
    write_updates(lg, keys=4, rounds=20)
    seal(lg)
    bases = lg.segment_base_offsets
    append(lg, [(b"x", b"1")], producer_id=3, producer_epoch=0, base_sequence=0)
    # as a transaction would set it
    lg.producer_state.producers[3].current_txn_first_offset = bases[3] + 1
    lg.producer_state._track_ongoing(3, bases[3] + 1)
    plan = plan_cleaning(lg, COMPACT, NOW)
    assert plan.first_uncleanable == bases[3]  # the segment holding the open transaction's start and on
    lg.producer_state.producers[3].current_txn_first_offset = -1
    lg.producer_state._track_ongoing(3, -1)
    assert plan_cleaning(lg, COMPACT, NOW).first_uncleanable == bases[-1]
    lg.close()


def test_compact_only_logs_skip_time_and_size_retention(tmp_path):
    assert not retention_applies({"cleanup.policy": "compact"})
    assert retention_applies({"cleanup.policy": "compact,delete"}) and retention_applies({})
    lg = open_log(tmp_path / "t-0-0", retention_ms=1000, retention_bytes=10)
    write_updates(lg, keys=2, rounds=10)
    seal(lg)
    segments = lg.segment_base_offsets
    assert lg.enforce_retention(NOW + DAY, delete_policy=False) == 0
    assert lg.segment_base_offsets == segments
    assert lg.enforce_retention(NOW + DAY) > 0
    lg.close()


def test_reads_and_appends_during_cleaning(tmp_path):
    lg = open_log(tmp_path / "t-0-0", file_delete_delay_ms=60_000)
    write_updates(lg, keys=6, rounds=30)
    seal(lg)
    stop = threading.Event()
    errors: list[BaseException] = []

    def reader():
        while not stop.is_set():
            try:
                data = raw(lg)
                batches = list(iter_batches(data))  # whole batches, CRCs valid
                assert batches
                decode_batches(data)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
                return

    def writer():
        r = 0
        while not stop.is_set():
            append(lg, [(b"key-%d" % (r % 6), b"new-%d" % r)])
            lg.update_high_watermark(lg.log_end_offset)
            r += 1
            time.sleep(0.001)

    threads = [threading.Thread(target=reader), threading.Thread(target=reader), threading.Thread(target=writer)]
    for t in threads:
        t.start()
    try:
        for _ in range(8):
            clean_log(lg, COMPACT, NOW, force=True)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert errors == []
    lg.roll(NOW)
    lg.update_high_watermark(lg.log_end_offset)
    clean_log(lg, COMPACT, NOW, force=True)
    recs = records(lg)
    assert len({r.key for r in recs}) == len(recs) == 6
    lg.close()


# -- crash safety of the swap ----------------------------------------------------------------------


class _Crash(BaseException):
    """Stands in for the process dying: nothing after it runs, nothing is cleaned up."""


def _build(path: Path) -> Log:
    lg = open_log(path)
    write_updates(lg, keys=5, rounds=12)
    append(lg, [(b"key-3", None)])
    seal(lg)
    lg.update_config(LogConfig(segment_bytes=1 << 20, index_interval_bytes=64))  # one group: all or nothing
    return lg


def _crashing_rename(real_rename, k: int):
    """os.rename that "kills the process" at its k-th call."""
    calls = 0

    def rename(src, dst, **kw):
        nonlocal calls
        calls += 1
        if calls == k:
            raise _Crash()
        return real_rename(src, dst, **kw)

    return rename


def _abandon(lg: Log) -> None:
    lg._close_files()  # what a killed process leaves: descriptors gone, no clean-shutdown marker


def test_crash_at_every_rename_of_the_swap_recovers_old_or_new(tmp_path, monkeypatch):
    cfg = CleanerConfig(min_cleanable_dirty_ratio=0.0)
    ref = _build(tmp_path / "ref-0-0")
    before = snapshot(ref)
    clean_log(ref, cfg, NOW)
    after = snapshot(ref)
    ref.close()
    assert after != before

    real_rename = os.rename
    outcomes = []
    k = 0
    while True:
        k += 1
        lg = _build(tmp_path / f"c{k}-0-0")
        monkeypatch.setattr(os, "rename", _crashing_rename(real_rename, k))
        try:
            clean_log(lg, cfg, NOW)
            crashed = False
        except _Crash:
            crashed = True
        finally:
            monkeypatch.setattr(os, "rename", real_rename)
        if not crashed:
            lg.close()
            break
        _abandon(lg)
        names = leftovers(lg.dir)
        reopened = open_log(lg.dir, segment_bytes=1 << 20)
        got = snapshot(reopened)
        assert got in (before, after), f"crash at rename {k} ({names}) recovered to a third state"
        assert leftovers(reopened.dir) == []
        assert reopened.log_end_offset == ref.log_end_offset
        outcomes.append((k, names, got == after))
        reopened.close()
    assert k > 6
    # Before the log file's .swap rename the swap is undone; from then on it is completed.
    committed = [new for _, names, new in outcomes]
    assert committed == sorted(committed) and committed[0] is False and committed[-1] is True
    assert any(n.endswith(".log.cleaned") for n in outcomes[0][1])
    assert any(n.endswith(".log.swap") for _, names, new in outcomes if new for n in names)


def test_leftover_cleaned_and_swap_files_on_open(tmp_path):
    lg = _build(tmp_path / "a-0-0")
    before = snapshot(lg)
    base = lg.segment_base_offsets[0]
    lg.close()
    pristine = tmp_path / "b-0-0"
    shutil.copytree(lg.dir, pristine)
    lg = open_log(lg.dir, segment_bytes=1 << 20)
    clean_log(lg, CleanerConfig(min_cleanable_dirty_ratio=0.0), NOW)
    after = snapshot(lg)
    lg.close()
    assert after != before
    cleaned = [lg.dir / f"{base:020d}{suffix}" for suffix in (".log", ".index", ".timeindex")]

    def crash_with(state: str) -> list:
        work = tmp_path / f"{state[1:]}-0-0"
        shutil.copytree(pristine, work)
        for p in cleaned:
            shutil.copy(p, work / (p.name + state))
        reopened = open_log(work, segment_bytes=1 << 20)
        try:
            assert leftovers(work) == []
            return snapshot(reopened)
        finally:
            reopened.close()

    assert crash_with(".cleaned") == before  # the swap never committed: the old segments stay
    assert crash_with(".swap") == after  # it committed: recovery completes it


# -- the cleaner loop --------------------------------------------------------------------------------


def test_cleaner_loop_cleans_compacted_logs_only(tmp_path):
    compacted = open_log(tmp_path / "c-0-0")
    plain = open_log(tmp_path / "p-0-0")
    latest = write_updates(compacted)
    write_updates(plain)
    seal(compacted)
    seal(plain)
    plain_files = {p.name: p.read_bytes() for p in plain.dir.iterdir() if p.suffix == ".log"}
    topic_configs = {
        compacted: {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.1"},
        plain: {"cleanup.policy": "delete", "min.cleanable.dirty.ratio": "0.1"},
    }
    cleaner = LogCleaner(lambda: list(topic_configs.items()), {"log.cleaner.backoff.ms": "20"})

    async def main():
        task = asyncio.create_task(cleaner.run())
        deadline = time.monotonic() + 20
        while cleaner.rounds < 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.2)
        cleaner.shutdown()
        await asyncio.wait_for(task, 5)

    asyncio.run(main())
    assert cleaner.rounds == 1  # once clean, the log is not picked again
    assert_latest_only(compacted, latest)
    assert {p.name: p.read_bytes() for p in plain.dir.iterdir() if p.suffix == ".log"} == plain_files
    assert (compacted.dir / CLEANER_CHECKPOINT).exists() and not (plain.dir / CLEANER_CHECKPOINT).exists()
    assert not LogCleaner(lambda: [], {"log.cleaner.enable": "false"}).enabled
    compacted.close()
    plain.close()


# -- one broker, confluent-kafka -----------------------------------------------------------------------


def _consume_all(bootstrap: str, topic: str) -> list[tuple[int, bytes | None, bytes | None]]:
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "compaction-check",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    c.assign([TopicPartition(topic, 0, 0)])
    out = []
    deadline = time.monotonic() + 20
    try:
        while time.monotonic() < deadline:
            for m in c.consume(1000, 0.5):
                if m.error():
                    if m.error().code() == KafkaError._PARTITION_EOF:
                        return out
                    raise AssertionError(m.error())
                out.append((m.offset(), m.key(), m.value()))
    finally:
        c.close()
    raise AssertionError("did not reach the end of the partition")


def test_cluster_compacted_topic_keeps_latest_value_per_key(tmp_path):
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from tools.cluster import Cluster

    with Cluster(
        tmp_path / "cluster", brokers=1, broker_overrides={"log.cleaner.backoff.ms": 100}, verbose=False
    ) as cluster:
        topic = "compacted"
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
        config = {
            "cleanup.policy": "compact",
            "segment.bytes": "4096",
            "delete.retention.ms": "2000",
            "min.cleanable.dirty.ratio": "0.01",
        }
        admin.create_topics([NewTopic(topic, 1, 1, config=config)])[topic].result(30)
        producer = Producer(
            {
                "bootstrap.servers": cluster.bootstrap,
                "linger.ms": 5,
                "compression.type": "lz4",
                "acks": "all",
                "batch.size": 1024,
            }
        )
        failed = []

        def delivered(err, _msg):
            if err is not None:
                failed.append(err)

        keys = [b"key-%d" % k for k in range(12)]
        deleted = set(keys[:3])
        latest: dict[bytes, bytes] = {}
        for r in range(60):
            for k in keys:
                value = b"%s=%d;" % (k, r) * 4
                producer.produce(topic, key=k, value=value, on_delivery=delivered)
                latest[k] = value
            producer.poll(0)
        for k in deleted:
            producer.produce(topic, key=k, value=None, on_delivery=delivered)
        for i in range(300):  # unique keys: they roll the segments holding the updates out of the active one
            producer.produce(topic, key=b"filler-%d" % i, value=b"f" * 100, on_delivery=delivered)
        assert producer.flush(30) == 0 and failed == []

        expected = {k: v for k, v in latest.items() if k not in deleted}
        deadline = time.monotonic() + 45
        while True:
            got = _consume_all(cluster.bootstrap, topic)
            data = [(o, k, v) for o, k, v in got if not k.startswith(b"filler-")]
            if len(data) == len(expected) and {k: v for _, k, v in data} == expected:
                break
            assert time.monotonic() < deadline, f"not compacted in time: {len(data)} records, e.g. {data[:5]}"
            time.sleep(0.5)
        offsets = [o for o, _, _ in got]
        assert offsets == sorted(set(offsets))  # in order, no repeats; gaps are normal
        assert max(offsets) == len(keys) * 60 + len(deleted) + 300 - 1  # the log end did not move
        assert len([k for _, k, _ in got if k.startswith(b"filler-")]) == 300
        log_dirs = list(cluster.node_dir(1).glob(f"logs-*/{topic}-0-0"))
        assert len(log_dirs) == 1 and leftovers(log_dirs[0]) == []
        del producer, admin  # no reconnect attempts once the cluster is gone
