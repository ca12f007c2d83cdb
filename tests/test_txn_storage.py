"""Transactions at the partition, on real log dirs: open transactions hold the last stable offset,
markers complete them once the high watermark passes, ABORT markers index the transaction in the
segment's `.txnindex`, read_committed ranges find them, and all of it survives restarts, crashes,
truncation, retention, follower appends and compaction."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from broker.storage import Log, LogConfig
from broker.storage.cleaner import CleanerConfig, clean_log
from broker.storage.producer_state import (
    INVALID_TXN_STATE,
    TRANSACTION_COORDINATOR_FENCED,
    InvalidProducerEpochError,
    InvalidTxnStateError,
    TransactionCoordinatorFencedError,
)
from broker.storage.txn_index import ENTRY_SIZE, AbortedTxn
from protocol.records import Record, decode_batches, encode_batch
from protocol.records.control import read_txn_marker

NOW = 1_700_000_000_000
A, B = 7000, 7001


def txn(pid: int, seq: int, n: int = 2, *, epoch: int = 0, key: bytes = b"k", tag: str = "t") -> bytes:
    recs = [Record(value=f"{tag}{pid}-{seq + i}".encode(), key=key, timestamp=NOW + i) for i in range(n)]
    return encode_batch(recs, producer_id=pid, producer_epoch=epoch, base_sequence=seq, transactional=True)


def plain(n: int = 2, key: bytes = b"p") -> bytes:
    return encode_batch([Record(value=b"plain%d" % i, key=key, timestamp=NOW) for i in range(n)])


def open_log(path: Path, **cfg) -> Log:
    return Log.open(path / "orders-0-0", LogConfig(**cfg), now_ms=NOW)


def put(lg: Log, data: bytes) -> tuple[int, int]:
    info = lg.append_as_leader(data, 1, NOW)
    return info.first_offset, info.last_offset


def mark(lg: Log, pid: int, commit: bool, *, epoch: int = 0, coordinator_epoch: int = 0) -> int:
    return lg.append_txn_marker(pid, epoch, coordinator_epoch, commit, 1, NOW).first_offset


def replicate(lg: Log) -> None:
    lg.update_high_watermark(lg.log_end_offset)


def txn_index_files(lg: Log) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in lg.dir.glob("*.txnindex*")}


def crash(lg: Log) -> None:
    lg._close_files()


# -- last stable offset ---------------------------------------------------------------------------


def test_an_open_transaction_holds_the_lso_until_its_marker_is_replicated(tmp_path):
    lg = open_log(tmp_path)
    put(lg, plain())
    first, _ = put(lg, txn(A, 0))
    put(lg, plain())
    replicate(lg)
    assert lg.high_watermark == 6 and lg.last_stable_offset == first == 2
    assert lg.producer_state.ongoing_transactions == {A: 2}
    put(lg, txn(A, 2))  # more of the same transaction: it still starts at 2
    marker = mark(lg, A, commit=True)
    assert lg.last_stable_offset == 2  # completed, but the marker is not replicated yet
    lg.update_high_watermark(marker)
    assert lg.last_stable_offset == 2  # the HW must pass the marker, not reach it
    lg.update_high_watermark(marker + 1)
    assert lg.last_stable_offset == marker + 1 == lg.high_watermark
    assert lg.producer_state.ongoing_transactions == {}
    assert lg.aborted_transactions(0, lg.log_end_offset) == []  # a commit indexes nothing
    assert txn_index_files(lg) == {}
    lg.close()


def test_lso_is_the_oldest_unstable_transaction_and_never_above_the_hw(tmp_path):
    lg = open_log(tmp_path)
    put(lg, plain())
    assert lg.last_stable_offset == 0  # nothing replicated
    replicate(lg)
    put(lg, txn(A, 0))  # 2..3
    put(lg, txn(B, 0))  # 4..5
    assert lg.last_stable_offset == 2  # the HW (2) caps it
    replicate(lg)
    assert lg.last_stable_offset == 2
    mark(lg, A, commit=False)  # 6
    replicate(lg)
    assert lg.last_stable_offset == 4  # B is still open
    mark(lg, B, commit=True)  # 7
    replicate(lg)
    assert lg.last_stable_offset == 8
    lg.close()


# -- aborted-transaction index --------------------------------------------------------------------


def test_abort_markers_index_the_transaction_and_ranges_find_it(tmp_path):
    lg = open_log(tmp_path)
    put(lg, plain())  # 0..1
    put(lg, txn(A, 0))  # 2..3
    put(lg, txn(B, 0))  # 4..5
    put(lg, txn(A, 2))  # 6..7
    a_marker = mark(lg, A, commit=False)  # 8: B still open -> entry's LSO is B's first offset
    b_marker = mark(lg, B, commit=False)  # 9: none open -> its LSO is 10
    replicate(lg)
    assert txn_index_files(lg) == {"00000000000000000000.txnindex": 2 * ENTRY_SIZE}
    seg = lg._local.segments[0]
    assert seg.txn_index.entries == [AbortedTxn(A, 2, a_marker, 4), AbortedTxn(B, 4, b_marker, 10)]
    assert lg.aborted_transactions(0, 10) == [(A, 2), (B, 4)]
    assert lg.aborted_transactions(0, 2) == []  # both start at or after the range's end
    assert lg.aborted_transactions(0, 3) == [(A, 2)]
    assert lg.aborted_transactions(5, 7) == [(A, 2), (B, 4)]
    assert lg.aborted_transactions(9, 10) == [(B, 4)]  # only B's marker is in range
    assert lg.aborted_transactions(10, 12) == []  # both ended before the range
    # The markers are real control batches: key type 0 (ABORT), value with the coordinator epoch.
    data = b"".join(bytes(p) for p in lg.read(a_marker, 1 << 20).records)
    batches = decode_batches(data)
    assert all(b.header.is_control and b.header.is_transactional and b.header.base_sequence == -1 for b in batches)
    assert read_txn_marker(encode_first(batches)) == (False, 0)
    lg.close()


def encode_first(batches) -> bytes:
    b = batches[0]
    return encode_batch(
        b.records,
        control=True,
        transactional=True,
        producer_id=b.header.producer_id,
        producer_epoch=b.header.producer_epoch,
    )


def test_a_marker_in_a_later_segment_is_found_from_the_transactions_first_segment(tmp_path):
    lg = open_log(tmp_path, segment_bytes=400)
    first, _ = put(lg, txn(A, 0))
    for _ in range(12):
        put(lg, plain())
    marker = mark(lg, A, commit=False)
    replicate(lg)
    bases = lg.segment_base_offsets
    assert len(bases) > 2
    marker_segment = max(b for b in bases if b <= marker)
    assert list(txn_index_files(lg)) == [f"{marker_segment:020d}.txnindex"]
    assert lg.aborted_transactions(first, first + 1) == [(A, first)]  # read in the first segment
    assert lg.aborted_transactions(bases[1], bases[2]) == [(A, first)]  # a middle segment's range
    lg.close()


def test_a_marker_without_an_open_transaction_is_written_but_completes_nothing(tmp_path):
    lg = open_log(tmp_path)
    put(lg, plain())
    replicate(lg)
    off = mark(lg, A, commit=False, coordinator_epoch=3)
    assert off == 2 and lg.log_end_offset == 3
    replicate(lg)
    assert lg.last_stable_offset == 3
    assert lg.aborted_transactions(0, 3) == [] and txn_index_files(lg) == {}
    assert lg.producer_state.producers[A].coordinator_epoch == 3
    lg.close()


# -- checks -------------------------------------------------------------------------------------


def test_a_plain_batch_inside_an_open_transaction_is_invalid_txn_state(tmp_path):
    lg = open_log(tmp_path)
    put(lg, txn(A, 0))
    idempotent = encode_batch([Record(value=b"x", timestamp=NOW)], producer_id=A, producer_epoch=0, base_sequence=2)
    with pytest.raises(InvalidTxnStateError) as exc:
        put(lg, idempotent)
    assert exc.value.error_code == INVALID_TXN_STATE == 48
    assert lg.log_end_offset == 2  # nothing appended
    mark(lg, A, commit=True)
    assert put(lg, idempotent) == (3, 3)  # after the marker it is fine
    lg.close()


def test_fenced_markers_are_refused(tmp_path):
    lg = open_log(tmp_path)
    put(lg, txn(A, 0, epoch=2))
    with pytest.raises(InvalidProducerEpochError):
        mark(lg, A, commit=True, epoch=1)  # a zombie coordinator's view of an older producer epoch
    mark(lg, A, commit=False, epoch=2, coordinator_epoch=5)
    put(lg, txn(A, 0, epoch=3))  # the next transaction, next epoch
    with pytest.raises(TransactionCoordinatorFencedError) as exc:
        mark(lg, A, commit=True, epoch=3, coordinator_epoch=4)
    assert exc.value.error_code == TRANSACTION_COORDINATOR_FENCED == 52
    assert lg.producer_state.ongoing_transactions == {A: 3}  # still open: the fenced marker changed nothing
    mark(lg, A, commit=True, epoch=3, coordinator_epoch=5)
    assert lg.producer_state.ongoing_transactions == {}
    # A marker with a newer epoch moves the producer to it (the coordinator bumped the epoch to abort).
    put(lg, txn(A, 2, epoch=3))
    mark(lg, A, commit=False, epoch=4, coordinator_epoch=5)
    assert lg.producer_state.producers[A].epoch == 4
    with pytest.raises(InvalidProducerEpochError):
        put(lg, txn(A, 4, epoch=3))
    lg.close()


# -- durability -----------------------------------------------------------------------------------


def test_open_and_unreplicated_transactions_and_the_index_survive_a_clean_restart(tmp_path):
    lg = open_log(tmp_path, segment_bytes=400)
    put(lg, txn(A, 0))  # 0..1 aborted
    for _ in range(4):
        put(lg, plain())
    mark(lg, A, commit=False)
    replicate(lg)
    c = 7100
    first_c, _ = put(lg, txn(c, 0))
    marker_c = mark(lg, c, commit=True)  # completed, not replicated yet
    first_b, _ = put(lg, txn(B, 0))  # B open
    lg.update_high_watermark(marker_c)
    assert lg.last_stable_offset == first_c
    aborted = lg.aborted_transactions(0, lg.log_end_offset)
    files = txn_index_files(lg)
    lg.close()
    again = open_log(tmp_path, segment_bytes=400)
    assert again.last_stable_offset == first_c  # C is still unreplicated after the restart
    assert again.aborted_transactions(0, again.log_end_offset) == aborted == [(A, 0)]
    assert txn_index_files(again) == files
    assert again.producer_state.ongoing_transactions == {B: first_b}
    again.update_high_watermark(marker_c + 1)
    assert again.last_stable_offset == first_b
    mark(again, B, commit=True)
    replicate(again)
    assert again.last_stable_offset == again.log_end_offset
    again.close()


def test_crash_recovery_rebuilds_a_lost_index_and_reopens_a_torn_markers_transaction(tmp_path):
    lg = open_log(tmp_path, segment_bytes=400)
    put(lg, txn(A, 0))
    for _ in range(4):
        put(lg, plain())
    a_marker = mark(lg, A, commit=False)
    put(lg, txn(B, 0))
    b_marker = mark(lg, B, commit=False)
    seg = lg._local.segments[-1]
    index_path = seg.txn_index.path
    log_path = seg.log_path
    assert lg.aborted_transactions(0, lg.log_end_offset) == [(A, 0), (B, b_marker - 2)]
    crash(lg)
    # The index lost its last entry and half of another; the log lost the tail of B's marker.
    os.truncate(index_path, ENTRY_SIZE // 2)
    os.truncate(log_path, log_path.stat().st_size - 5)
    again = open_log(tmp_path, segment_bytes=400)
    assert again.log_end_offset == b_marker
    assert again.aborted_transactions(0, again.log_end_offset) == [(A, 0)]
    assert again._local.segments[-1].txn_index.entries[0].last_offset == a_marker
    assert again.producer_state.ongoing_transactions == {B: b_marker - 2}  # B is open again
    replicate(again)
    assert again.last_stable_offset == b_marker - 2
    again.close()


def test_truncation_drops_index_entries_and_reopens_transactions(tmp_path):
    lg = open_log(tmp_path)
    put(lg, plain())
    put(lg, txn(A, 0))  # 2..3
    a_marker = mark(lg, A, commit=False)  # 4
    put(lg, txn(B, 0))  # 5..6
    mark(lg, B, commit=True)  # 7
    replicate(lg)
    assert lg.last_stable_offset == 8
    lg.truncate_to(a_marker)  # a follower whose leader never got the markers
    assert lg.aborted_transactions(0, 10) == []
    assert txn_index_files(lg) == {"00000000000000000000.txnindex": 0}
    assert lg.producer_state.ongoing_transactions == {A: 2}
    assert lg.last_stable_offset == 2
    mark(lg, A, commit=False)
    assert lg.aborted_transactions(0, 10) == [(A, 2)]
    lg.close()


def test_retention_and_delete_records_remove_index_files_with_their_segments(tmp_path):
    lg = open_log(tmp_path, segment_bytes=300, file_delete_delay_ms=0)
    put(lg, txn(A, 0))
    mark(lg, A, commit=False)
    for _ in range(6):
        put(lg, plain())
    replicate(lg)
    first_base = lg.segment_base_offsets[0]
    assert f"{first_base:020d}.txnindex" in txn_index_files(lg)
    lg.delete_records_before(lg.segment_base_offsets[2])
    assert list(txn_index_files(lg)) == [f"{first_base:020d}.txnindex.deleted"]
    lg.enforce_retention(time.time_ns() // 1_000_000 + 1000)  # purges what was deleted above
    assert txn_index_files(lg) == {}
    assert lg.aborted_transactions(lg.log_start_offset, lg.log_end_offset) == []
    lg.truncate_fully_and_start_at(500)
    assert lg.last_stable_offset == 500
    lg.close()


def test_a_follower_builds_the_same_index_and_lso_from_the_leaders_bytes(tmp_path):
    leader = open_log(tmp_path / "leader", segment_bytes=400)
    put(leader, txn(A, 0))
    put(leader, plain())
    mark(leader, A, commit=False)
    put(leader, txn(B, 0))
    for _ in range(3):
        put(leader, plain())
    follower = open_log(tmp_path / "follower", segment_bytes=400)
    follower.append_as_follower(b"".join(bytes(p) for p in leader.read(0, 1 << 20).records))
    assert follower.log_end_offset == leader.log_end_offset
    replicate(leader)
    replicate(follower)
    assert follower.aborted_transactions(0, 100) == leader.aborted_transactions(0, 100) == [(A, 0)]
    assert follower.last_stable_offset == leader.last_stable_offset == 5
    assert follower.producer_state.ongoing_transactions == {B: 5}
    leader.close()
    follower.close()


def test_compaction_keeps_the_swapped_segments_index(tmp_path):
    lg = open_log(tmp_path, segment_bytes=600, index_interval_bytes=64)
    put(lg, txn(A, 0, key=b"a"))  # aborted: kept by the cleaner
    mark(lg, A, commit=False)
    for i in range(8):
        put(lg, encode_batch([Record(value=b"v%d" % i, key=b"same", timestamp=NOW)]))
    put(lg, txn(B, 0, key=b"b"))
    mark(lg, B, commit=False)
    for i in range(8):
        put(lg, encode_batch([Record(value=b"w%d" % i, key=b"same", timestamp=NOW)]))
    lg.roll(NOW)
    replicate(lg)
    before = lg.aborted_transactions(0, lg.log_end_offset)
    assert before == [(A, 0), (B, before[1][1])] and len(txn_index_files(lg)) == 2
    result = clean_log(lg, CleanerConfig(min_cleanable_dirty_ratio=0.0), NOW, force=True)
    assert result is not None and result.groups_swapped >= 1
    assert lg.aborted_transactions(0, lg.log_end_offset) == before
    live = {n: s for n, s in txn_index_files(lg).items() if n.endswith(".txnindex")}
    assert sum(live.values()) == 2 * ENTRY_SIZE
    lg.close()
    again = open_log(tmp_path, segment_bytes=600, index_interval_bytes=64)
    assert again.aborted_transactions(0, again.log_end_offset) == before
    again.close()
