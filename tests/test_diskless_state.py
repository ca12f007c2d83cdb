"""The diskless coordinator's state machine: checks and offsets against the speculative view, the
same records applied to SQLite (applied offset in the same transaction), and a rebuild from the
records giving identical tables."""

from __future__ import annotations

import uuid
from pathlib import Path

from broker.coordinator.diskless.state import DisklessState
from broker.coordinator.diskless.view import CoordinatorView
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
                                         (5, 1, -1, -1, -1), (0, 1, 8, 0, 4)])
    assert [(r.error_code, r.base_offset, r.duplicate) for r in results] == [
        (0, 3, False),  # continues the sequence
        (0, 0, True),  # a retry of the first batch: its original offset
        (Errors.OUT_OF_ORDER_SEQUENCE_NUMBER, -1, False),
        (Errors.INVALID_PRODUCER_EPOCH, -1, False),
        (Errors.UNKNOWN_TOPIC_OR_PARTITION, -1, False),
        (0, 7, False),  # an unknown producer at any sequence
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
