"""The diskless coordinator's state machine: checks and offsets against the speculative view, the
same records applied to SQLite (applied offset in the same transaction), and a rebuild from the
records giving identical tables."""

from __future__ import annotations

import uuid
from pathlib import Path

from broker.diskless.coordinator.state import DisklessState
from broker.diskless.coordinator.view import CoordinatorView
from protocol.errors import Errors
from protocol.generated.diskless_commit_file import DisklessCommitFileRequest as C
from protocol.generated.diskless_create_partitions import DisklessCreatePartitionsRequest as CP

TOPIC = uuid.uuid4()


def commit(view: CoordinatorView, key: str, batches: list[tuple], now: int = 1000):
    """batches: (partition, records, producer id, epoch, base seq)."""
    bs, pos = [], 0
    for part, n, pid, epoch, seq in batches:
        bs.append(C.DisklessCommitBatch(
            magic=2, request_id=0, topic_id=TOPIC, partition_index=part, byte_offset=pos, size=100,
            base_offset=0, last_offset=n - 1, batch_max_timestamp=now, timestamp_type=0, producer_id=pid,
            producer_epoch=epoch, base_sequence=seq, last_sequence=seq + n - 1 if seq >= 0 else -1))
        pos += 100
    req = C(object_key=key, object_format=1, file_size=pos, owner_ids=[0], batches=bs)
    return view.commit_file(req, uploader=1, now_ms=now)


def test_offsets_producers_and_rebuild(tmp_path: Path) -> None:
    view = CoordinatorView()
    log: list = []  # the records, as the coordinator's topic would hold them
    log += view.create_partitions([CP.DisklessCreatablePartitions(topic_id=TOPIC, name="t", num_partitions=2)])
    assert view.create_partitions([CP.DisklessCreatablePartitions(topic_id=TOPIC, name="t", num_partitions=2)]) == []

    results, rec = commit(view, "wal/a", [(0, 5, -1, -1, -1), (1, 3, 7, 0, 0), (0, 2, 7, 0, 0)])
    assert [(r.error_code, r.base_offset) for r in results] == [(0, 0), (0, 0), (0, 5)]
    log.append(rec)
    # pipelined: the next file sees the pending one without any apply to SQLite
    results, rec = commit(view, "wal/b", [(1, 2, 7, 0, 3), (1, 3, 7, 0, 0), (1, 1, 7, 0, 9), (1, 1, 7, -1, 5),
                                         (5, 1, -1, -1, -1), (0, 1, 9, 0, 4), (0, 1, 8, 0, 0)])
    assert [(r.error_code, r.base_offset, r.duplicate) for r in results] == [
        (0, 3, False),  # continues the sequence
        (0, 0, True),  # a retry of the first batch: its original offset
        (Errors.NOT_LEADER_OR_FOLLOWER, -1, False),  # a gap: its predecessors may still come
        (Errors.INVALID_PRODUCER_EPOCH, -1, False),
        (Errors.UNKNOWN_TOPIC_OR_PARTITION, -1, False),
        (Errors.NOT_LEADER_OR_FOLLOWER, -1, False),  # a first batch here past sequence 0: may be overtaken
        (0, 7, False),  # a new producer at sequence 0
    ]
    log.append(rec)
    results, rec = commit(view, "wal/c", [(1, 1, 7, 1, 0), (1, 1, 7, 2, 3)])
    assert [r.error_code for r in results] == [0, Errors.OUT_OF_ORDER_SEQUENCE_NUMBER]
    log.append(rec)
    err, low, rec = view.delete_records(TOPIC, 0, 5)
    assert (err, low) == (0, 5)
    log.append(rec)
    assert view.delete_records(TOPIC, 0, 99)[0] == Errors.OFFSET_OUT_OF_RANGE

    state = DisklessState(tmp_path / "a.sqlite")
    state.apply(list(enumerate(log[:3])))
    assert state.applied_offset() == 3
    state.apply(list(enumerate(log)))  # a replay from 0 skips what is applied
    assert state.applied_offset() == len(log)
    assert state.partitions()[(TOPIC, 0)] == ("t", 5, 8)
    assert state.partitions()[(TOPIC, 1)] == ("t", 0, 6)
    found = state.find_batches(TOPIC, 1, 2, 10_000, 10)
    assert [(b.object_key, b.base_offset, b.last_offset, b.byte_offset) for b in found] == [
        ("wal/a", 0, 2, 100), ("wal/b", 3, 4, 0), ("wal/c", 5, 5, 0)]
    assert len(state.find_batches(TOPIC, 1, 0, 150, 10)) == 1  # max bytes: at least one batch
    assert [b.base_offset for b in state.find_batches(TOPIC, 0, 0, 10_000, 10)] == [5, 7]  # below 5 deleted
    assert state.file_has_batches("wal/a") is True and state.file_has_batches("wal/zzz") is None

    # the view rebuilt from SQLite answers as the live one did
    rebuilt = CoordinatorView.from_state(state)
    assert rebuilt.partitions == view.partitions

    # a deleted database rebuilt from the records: identical tables
    other = DisklessState(tmp_path / "b.sqlite")
    for i, r in enumerate(log):
        other.apply([(i, r)])
    assert other.dump() == state.dump()
    state.close()
    other.close()


def _file(view: CoordinatorView, key: str, owners: list[int], batches: list[tuple], now: int):
    """A commit with an owner list; batches: (partition, records)."""
    results, rec = commit(view, key, [(p, n, -1, -1, -1) for p, n in batches], now)
    assert all(r.error_code == 0 for r in results)
    rec.owner_ids = owners
    return rec


def test_retention_offsets_and_file_ownership(tmp_path: Path) -> None:
    """retention.ms / retention.bytes as Kafka removes segments (the oldest first, batch by batch);
    a file whose batches are all gone is its first owner's to hand on, or (last owner) to delete;
    a handover record makes the next owner the owner."""
    from broker.diskless.coordinator.state import DELETED, HANDED_OVER, RetentionLimits
    from protocol.generated.metadata_records.diskless_file_handed_over_record import DisklessFileHandedOverRecord

    view = CoordinatorView()
    log: list = list(view.create_partitions([CP.DisklessCreatablePartitions(topic_id=TOPIC, name="t",
                                                                              num_partitions=1)]))
    log.append(_file(view, "wal/1", [1, 0], [(0, 10)], now=1000))  # offsets 0-9, 100 bytes
    log.append(_file(view, "wal/2", [0, 1], [(0, 10)], now=2000))  # 10-19
    log.append(_file(view, "wal/3", [0], [(0, 10)], now=3000))  # 20-29
    state = DisklessState(tmp_path / "0.sqlite")
    state.apply(list(enumerate(log)))
    limit = lambda ms, nbytes: [RetentionLimits(TOPIC, 0, ms, nbytes)]  # noqa: E731
    assert state.retention_offsets(limit(-1, -1), 10_000) == []
    assert state.retention_offsets(limit(1500, -1), 4000) == [(TOPIC, 0, 20)]  # older than 2500: files 1, 2
    assert state.retention_offsets(limit(2000, -1), 4000) == [(TOPIC, 0, 10)]  # exactly 2000 old stays
    assert state.retention_offsets(limit(0, -1), 9000) == [(TOPIC, 0, 30)]  # every batch
    assert state.retention_offsets(limit(-1, 200), 0) == [(TOPIC, 0, 10)]  # 200 bytes stay
    assert state.retention_offsets(limit(-1, 150), 0) == [(TOPIC, 0, 10)]  # what stays is >= retention.bytes
    assert state.retention_offsets(limit(-1, 99), 0) == [(TOPIC, 0, 20)]
    assert state.retention_offsets(limit(-1, 0), 0) == [(TOPIC, 0, 30)]

    _, _, rec = view.delete_records(TOPIC, 0, 20)
    state.apply([(len(log), rec)])
    log.append(rec)
    owned, waiting = state.file_tasks(0)
    assert [t.object_key for t in owned] == ["wal/2"] and owned[0].owners == [0, 1]  # first owner: hand to 1
    assert [t.object_key for t in waiting] == ["wal/1"]  # coordinator 1 owns it first
    assert [t.object_key for t in state.file_tasks(1)[0]] == ["wal/1"]
    handover = DisklessFileHandedOverRecord(object_key="wal/1", file_size=100, owner_ids=[1, 0], from_coordinator=1)
    state.apply([(len(log), handover)])
    log.append(handover)
    assert sorted(t.object_key for t in state.file_tasks(0)[0]) == ["wal/1", "wal/2"]
    assert state.known_files(["wal/1", "wal/3", "wal/x"]) == {"wal/1", "wal/3"}
    state.set_file_status("wal/2", HANDED_OVER, 1)
    state.set_file_status("wal/1", DELETED, 1)
    assert state.file_tasks(0) == ([], [])
    assert {k: s for k, _, _, _, s in state.file_details(0)} == {"wal/1": DELETED, "wal/2": HANDED_OVER,
                                                                "wal/3": "live"}
    f = state.figures(0)
    assert (f.files, f.live_files, f.live_batches, f.owned_files, f.pending_handovers) == (3, 1, 1, 1, 0)
    # a rebuild from the log gives the same tables (file_work is the leader's own: not compared)
    rebuilt = DisklessState(tmp_path / "rebuilt.sqlite")
    rebuilt.apply(list(enumerate(log)))
    assert rebuilt.dump() == state.dump()

    # a file deleted from object storage is pruned from every replica's state: its file,
    # handover and status rows go; a file with live batches is never pruned
    from protocol.generated.metadata_records.diskless_files_pruned_record import DisklessFilesPrunedRecord

    pruned = DisklessFilesPrunedRecord(object_keys=["wal/1", "wal/3"])
    state.apply([(len(log), pruned)])
    log.append(pruned)
    assert {k: s for k, _, _, _, s in state.file_details(0)} == {"wal/2": HANDED_OVER, "wal/3": "live"}
    assert state.known_files(["wal/1", "wal/2", "wal/3"]) == {"wal/2", "wal/3"}
    assert not state._db.execute("SELECT 1 FROM file_work WHERE object_key = 'wal/1'").fetchone()
    rebuilt = DisklessState(tmp_path / "rebuilt-after-prune.sqlite")
    rebuilt.apply(list(enumerate(log)))
    assert rebuilt.dump() == state.dump()
