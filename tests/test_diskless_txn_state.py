"""Transactions in the diskless coordinator's state (KIP-98 on KIP-1164's coordinator): the view's
checks of transactional batches and markers, the SQLite tables built from the same records (open
transactions, aborted ranges, the last stable offset), read_committed lookups, a rebuild giving
identical tables, and a database or snapshot of the previous schema still loading."""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path

from broker.diskless.coordinator.snapshots import check_snapshot, copy_database
from broker.diskless.coordinator.state import SCHEMA_VERSION, DisklessState
from broker.diskless.coordinator.view import CoordinatorView
from protocol.errors import Errors
from protocol.generated.diskless_commit_file import DisklessCommitFileRequest as C
from protocol.generated.diskless_create_partitions import DisklessCreatePartitionsRequest as CP
from protocol.generated.metadata_records.diskless_file_committed_record import DisklessFileCommittedRecord

TOPIC = uuid.uuid4()
ABORT, COMMIT = 0, 1


def batch(part: int, n: int, pid: int = -1, epoch: int = -1, seq: int = -1, txn: bool = False,
          control: int = -1, coordinator_epoch: int = -1) -> tuple:
    return part, n, pid, epoch, seq, txn, control, coordinator_epoch


def marker(part: int, pid: int, epoch: int, kind: int, coordinator_epoch: int = 0) -> tuple:
    return batch(part, 1, pid, epoch, -1, True, kind, coordinator_epoch)


def commit(view: CoordinatorView, key: str, batches: list[tuple], now: int = 1000):
    bs, pos = [], 0
    for part, n, pid, epoch, seq, txn, control, cepoch in batches:
        bs.append(C.DisklessCommitBatch(
            magic=2, request_id=0, topic_id=TOPIC, partition_index=part, byte_offset=pos, size=100,
            base_offset=0, last_offset=n - 1, batch_max_timestamp=now, timestamp_type=0, producer_id=pid,
            producer_epoch=epoch, base_sequence=seq, last_sequence=seq + n - 1 if seq >= 0 else -1,
            is_transactional=txn, control_type=control, coordinator_epoch=cepoch))
        pos += 100
    return view.commit_file(C(object_key=key, object_format=1, file_size=pos, owner_ids=[0], batches=bs), 1, now)


def _view_and_log() -> tuple[CoordinatorView, list]:
    view = CoordinatorView()
    log: list = list(view.create_partitions([CP.DisklessCreatablePartitions(topic_id=TOPIC, name="t",
                                                                              num_partitions=2)]))
    return view, log


def test_transactions_open_close_and_abort_ranges(tmp_path: Path) -> None:
    view, log = _view_and_log()
    # offsets 0-1 plain; 2-4 producer 7's transaction; 5-6 producer 8's; 7 plain
    results, rec = commit(view, "wal/a", [batch(0, 2), batch(0, 3, 7, 0, 0, True), batch(0, 2, 8, 0, 0, True),
                                          batch(0, 1)])
    assert [(r.error_code, r.base_offset) for r in results] == [(0, 0), (0, 2), (0, 5), (0, 7)]
    log.append(rec)
    pv = view.partitions[(TOPIC, 0)]
    assert pv.last_stable_offset() == 2 and pv.high_watermark == 8
    # producer 7 goes on in its transaction; producer 7 may not write outside it; producer 8 aborts
    results, rec = commit(view, "wal/b", [batch(0, 1, 7, 0, 3, True), batch(0, 1, 7, 0, 4, False),
                                          marker(0, 8, 0, ABORT), batch(0, 1, 8, 0, 2, True)])
    assert [(r.error_code, r.base_offset) for r in results] == [
        (0, 8), (Errors.INVALID_TXN_STATE, -1), (0, 9), (0, 10)]  # producer 8's next transaction opens at 10
    log.append(rec)
    results, rec = commit(view, "wal/c", [marker(0, 7, 0, COMMIT), marker(0, 8, 0, ABORT)])
    assert [(r.error_code, r.base_offset) for r in results] == [(0, 11), (0, 12)]
    log.append(rec)
    assert pv.last_stable_offset() == pv.high_watermark == 13
    assert pv.producer_infos() == [(7, 0, 3, 1000, 0, -1), (8, 0, 2, 1000, 0, -1)]  # DescribeProducers' rows

    state = DisklessState(tmp_path / "a.sqlite")
    state.apply(list(enumerate(log)))
    assert state.last_stable_offset(TOPIC, 0, 13) == 13
    assert state.aborted_transactions(TOPIC, 0, 0, 13) == [(8, 5), (8, 10)]
    assert state.aborted_transactions(TOPIC, 0, 10, 13) == [(8, 10)]  # the first ended (marker 9) below 10
    assert state.aborted_transactions(TOPIC, 0, 0, 5) == []  # none starts below 5
    assert {k: (t.producer_epoch, t.coordinator_epoch, t.first_offset) for k, t in state.txn_producers().items()} == {
        (TOPIC, 0, 7): (0, 0, -1), (TOPIC, 0, 8): (0, 0, -1)}
    # the view rebuilt from SQLite is the live one, and a replay of the records gives the same tables
    assert CoordinatorView.from_state(state).partitions == view.partitions
    other = DisklessState(tmp_path / "b.sqlite")
    for i, r in enumerate(log):
        other.apply([(i, r)])
    assert other.dump() == state.dump()
    # the aborted ranges below a new log start go with the batches
    err, _, rec = view.delete_records(TOPIC, 0, 10)
    assert err == 0
    state.apply([(len(log), rec)])
    assert state.aborted_transactions(TOPIC, 0, 0, 13) == [(8, 10)]
    state.close()
    other.close()


def test_open_transaction_holds_the_last_stable_offset(tmp_path: Path) -> None:
    view, log = _view_and_log()
    _, rec = commit(view, "wal/a", [batch(1, 2), batch(1, 2, 7, 0, 0, True), batch(1, 3)])
    log.append(rec)
    state = DisklessState(tmp_path / "a.sqlite")
    state.apply(list(enumerate(log)))
    hw = state.partitions()[(TOPIC, 1)][2]
    assert hw == 7 and state.last_stable_offset(TOPIC, 1, hw) == 2
    assert view.partitions[(TOPIC, 1)].last_stable_offset() == 2
    # read_committed stops below the last stable offset; read_uncommitted reads to the end
    assert [b.base_offset for b in state.find_batches(TOPIC, 1, 0, 1 << 20, 10, end=2)] == [0]
    assert [b.base_offset for b in state.find_batches(TOPIC, 1, 0, 1 << 20, 10)] == [0, 2, 4]
    state.close()


def test_marker_epochs_are_checked() -> None:
    view, _ = _view_and_log()
    commit(view, "wal/a", [batch(0, 1, 7, 3, 0, True)])
    results, _ = commit(view, "wal/b", [
        marker(0, 7, 2, ABORT, 5),  # an older producer epoch: a zombie coordinator's marker
        marker(0, 7, 4, ABORT, 5),  # the coordinator bumped the epoch (a timeout, a fencing)
        marker(0, 7, 4, ABORT, 4),  # an older coordinator epoch
        batch(0, 1, 7, 3, 1, True),  # the fenced producer's late batch
        batch(0, 1, 7, 5, 0, True),  # the producer's next epoch
        batch(0, 2, -1, -1, -1, False, ABORT),  # a marker without a producer
    ])
    assert [r.error_code for r in results] == [
        Errors.INVALID_PRODUCER_EPOCH, 0, Errors.TRANSACTION_COORDINATOR_FENCED, Errors.INVALID_PRODUCER_EPOCH, 0,
        Errors.CORRUPT_MESSAGE]


def test_committed_record_without_the_new_fields_decodes_as_before() -> None:
    """Records written before the transaction fields (tagged) read as plain batches."""
    R = DisklessFileCommittedRecord
    old = R(object_key="k", object_format=1, file_size=10, uploader_broker_id=1, owner_ids=[0], topics=[
        R.DisklessCommittedTopic(topic_id=TOPIC, partitions=[R.DisklessCommittedPartition(partition_index=0, batches=[
            R.DisklessCommittedBatch(magic=2, byte_offset=0, byte_size=10, assigned_base_offset=0,
                                     assigned_last_offset=0, producer_id=-1, producer_epoch=-1,
                                     base_sequence=-1, last_sequence=-1)])])])
    b = old.topics[0].partitions[0].batches[0]
    assert (b.is_transactional, b.control_type, b.coordinator_epoch) == (False, -1, -1)


def _as_previous_schema(path: Path) -> None:
    db = sqlite3.connect(path)
    db.execute("DROP TABLE txn_producers")
    db.execute("DROP TABLE txn_aborted")
    db.execute("DROP TABLE leader_epochs")
    db.execute("UPDATE meta SET value = 2 WHERE name = 'schema_version'")
    db.commit()
    db.close()


def test_a_database_and_a_snapshot_of_the_previous_schema_load(tmp_path: Path) -> None:
    view, log = _view_and_log()
    _, rec = commit(view, "wal/a", [batch(0, 3)])
    log.append(rec)
    path = tmp_path / "old.sqlite"
    state = DisklessState(path)
    state.apply(list(enumerate(log)))
    state.close()
    _as_previous_schema(path)
    # a snapshot taken by a broker of the previous version passes the install check
    snap = tmp_path / "old.snapshot"
    offset = copy_database(path, snap)
    check_snapshot(snap, offset)
    reopened = DisklessState(path)
    assert reopened.applied_offset() == len(log)
    assert reopened.partitions()[(TOPIC, 0)] == ("t", 0, 3)
    assert reopened.last_stable_offset(TOPIC, 0, 3) == 3
    _, rec = commit(view, "wal/b", [batch(0, 1, 9, 0, 0, True)])
    reopened.apply([(len(log), rec)])
    assert reopened.last_stable_offset(TOPIC, 0, 4) == 3
    row = reopened._db.execute("SELECT value FROM meta WHERE name = 'schema_version'").fetchone()
    assert row[0] == SCHEMA_VERSION
    reopened.close()


def test_idle_producers_expire_on_every_replica_alike(tmp_path: Path) -> None:
    """Kafka's producer-id expiration: the leader's view picks the producers idle for the
    expiration time and not in an open transaction; its record makes SQLite forget the same."""
    view, log = _view_and_log()
    # producer 7: idle since 1000; 8: an open transaction since 1000; 9: recent; 10: a marker only
    _, rec = commit(view, "wal/a", [batch(0, 1, 7, 0, 0), batch(0, 1, 8, 0, 0, True), marker(1, 10, 0, COMMIT)],
                    now=1000)
    log.append(rec)
    _, rec = commit(view, "wal/b", [batch(1, 1, 9, 0, 0)], now=50_000)
    log.append(rec)
    records = view.expire_producers(now_ms=60_000, expiration_ms=30_000)
    assert sorted((r.partition_index, r.producer_ids) for r in records) == [(0, [7]), (1, [10])]
    log += records
    assert view.expire_producers(now_ms=60_000, expiration_ms=30_000) == []  # already applied to the view
    pv0, pv1 = view.partitions[(TOPIC, 0)], view.partitions[(TOPIC, 1)]
    assert set(pv0.producers) == {8} and set(pv0.txns) == {8} and set(pv1.producers) == {9} and not pv1.txns
    # an expired producer starts over at any sequence, as in a local log; one never seen here
    # waits for its batches before that sequence (they may be overtaken: view.py's text)
    results, rec = commit(view, "wal/c", [batch(0, 1, 7, 0, 42)], now=60_000)
    assert results[0].error_code == 0
    log.append(rec)
    results, rec = commit(view, "wal/d", [batch(0, 1, 11, 0, 42)], now=60_000)
    assert results[0].error_code == Errors.NOT_LEADER_OR_FOLLOWER and rec is None
    state = DisklessState(tmp_path / "a.sqlite")
    state.apply(list(enumerate(log)))
    assert CoordinatorView.from_state(state).partitions == view.partitions
    assert state.last_stable_offset(TOPIC, 0, 3) == 1  # producer 8's transaction still holds it
    state.close()
