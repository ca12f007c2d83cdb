"""Leader epochs of diskless partitions in the coordinator's state (KIP-253's gates on KIP-1164's
coordinator): batches start the epoch they carry, an older epoch is fenced, the leader starts the
epoch its image shows without a batch of it, OffsetForLeaderEpoch's answers (Kafka's
LeaderEpochCache rules), SQLite rebuilt from the same records giving the same epochs, and a
database of the previous schema loading with none."""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path
from types import SimpleNamespace

from broker.diskless.coordinator.coordinator import incarnation, partition_gone
from broker.diskless.coordinator.state import SCHEMA_VERSION, DisklessState
from broker.diskless.coordinator.view import CoordinatorView
from protocol.errors import Errors
from protocol.generated.diskless_commit_file import DisklessCommitFileRequest as C
from protocol.generated.diskless_create_partitions import DisklessCreatePartitionsRequest as CP

TOPIC = uuid.uuid4()


def commit(view: CoordinatorView, key: str, batches: list[tuple[int, int, int]]):
    """`batches`: (partition, records, leader epoch)."""
    bs = [C.DisklessCommitBatch(magic=2, request_id=0, topic_id=TOPIC, partition_index=part, byte_offset=i * 100,
                                size=100, base_offset=0, last_offset=n - 1, batch_max_timestamp=1000, timestamp_type=0,
                                producer_id=-1, producer_epoch=-1, base_sequence=-1, last_sequence=-1,
                                leader_epoch=epoch)
          for i, (part, n, epoch) in enumerate(batches)]
    return view.commit_file(C(object_key=key, object_format=1, file_size=100 * len(bs), owner_ids=[0], batches=bs),
                            1, 1000)


def test_epochs_fence_end_and_rebuild(tmp_path: Path) -> None:
    view = CoordinatorView()
    log: list = list(view.create_partitions([CP.DisklessCreatablePartitions(topic_id=TOPIC, name="t",
                                                                              num_partitions=2)]))
    pv, pv1 = view.partitions[(TOPIC, 0)], view.partitions[(TOPIC, 1)]
    assert pv.epoch_end(0) == (-1, -1) and pv.leader_epoch == -1  # no epoch yet: the gate waits
    # the leader's image shows epoch 0 for both (their creation)
    log += view.start_epochs({(TOPIC, 0): 0, (TOPIC, 1): 0})
    assert view.start_epochs({(TOPIC, 0): 0}) == []  # nothing newer
    results, rec = commit(view, "wal/a", [(0, 3, 0), (1, 2, 0), (0, 2, -1)])  # -1: no epoch (older broker)
    assert [(r.error_code, r.base_offset) for r in results] == [(0, 0), (0, 0), (0, 3)]
    log.append(rec)
    # a count change bumps both to 1: a broker with the new image writes partition 0 in epoch 1;
    # partition 1 gets no batch of epoch 1 (a marked partition), so the leader starts it from its image
    results, rec = commit(view, "wal/b", [(0, 2, 1)])
    log.append(rec)
    assert results[0].base_offset == 5 and pv.leader_epoch == 1
    log += view.start_epochs({(TOPIC, 0): 1, (TOPIC, 1): 1})
    assert pv1.epochs == [(0, 0), (1, 2)]
    # a broker still at the old image: its batches of epoch 0 are fenced on both partitions
    results, rec = commit(view, "wal/c", [(0, 1, 0), (1, 1, 0), (0, 1, 1)])
    assert [r.error_code for r in results] == [Errors.FENCED_LEADER_EPOCH, Errors.FENCED_LEADER_EPOCH, 0]
    log.append(rec)
    # OffsetForLeaderEpoch: epoch 0 of partition 0 ended where epoch 1 started (5), the current
    # epoch ends at the high watermark, epoch 1 of partition 1 at its (unmoved) end
    assert pv.epoch_end(0) == (0, 5) and pv.epoch_end(1) == (1, 8) and pv.epoch_end(2) == (-1, -1)
    assert pv1.epoch_end(0) == (0, 2) and pv1.epoch_end(1) == (1, 2)
    # epochs without records: 2 and 3 start at the same offset, 2 is dropped; its end is 3's start
    log += view.start_epochs({(TOPIC, 0): 2})
    log += view.start_epochs({(TOPIC, 0): 3})
    assert pv.epochs == [(0, 0), (1, 5), (3, 8)]
    assert pv.epoch_end(2) == (1, 8) and pv.epoch_end(3) == (3, 8)

    # every replica's SQLite, built from the records, has the same epochs; a view loaded from it too
    state = DisklessState(tmp_path / "a.sqlite")
    state.apply(list(enumerate(log)))
    assert state.leader_epochs() == {(TOPIC, 0): [(0, 0), (1, 5), (3, 8)], (TOPIC, 1): [(0, 0), (1, 2)]}
    loaded = CoordinatorView.from_state(state)
    assert loaded.partitions[(TOPIC, 0)].epoch_end(0) == (0, 5)
    assert loaded.partitions[(TOPIC, 1)].leader_epoch == 1
    state.close()


def test_a_database_of_the_previous_schema_loads_without_epochs(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    DisklessState(path).close()
    db = sqlite3.connect(path)
    db.execute("DROP TABLE leader_epochs")
    db.execute("UPDATE meta SET value = 3 WHERE name = 'schema_version'")
    db.commit()
    db.close()
    reopened = DisklessState(path)
    assert reopened.leader_epochs() == {}
    assert reopened._db.execute("SELECT value FROM meta WHERE name = 'schema_version'").fetchone()[0] == SCHEMA_VERSION
    reopened.close()


def test_a_deleted_partition_goes_and_comes_back_anew(tmp_path: Path) -> None:
    """KIP-253 deletes a marked partition once empty and a later growth may re-create its index:
    the coordinator drops every row of the old one, so the new one starts at offset 0 and epoch 0
    (not fenced by the old one's epochs)."""
    view = CoordinatorView()
    log: list = list(view.create_partitions([CP.DisklessCreatablePartitions(topic_id=TOPIC, name="t",
                                                                              num_partitions=2)]))
    log += view.start_epochs({(TOPIC, 0): 2, (TOPIC, 1): 2})
    log.append(commit(view, "wal/a", [(0, 3, 2), (1, 4, 2)])[1])
    record = view.delete_partition(TOPIC, 1)
    assert record is not None and view.delete_partition(TOPIC, 1) is None
    log.append(record)
    # re-created by a growth while partition 0 was at epoch 3 (its LeaderEpochAfterCreation)
    log += view.create_partitions([CP.DisklessCreatablePartitions(topic_id=TOPIC, name="t", num_partitions=2)],
                                  incarnation=lambda tid, i: 3)
    assert view.partitions[(TOPIC, 1)].incarnation == 3
    results, rec = commit(view, "wal/b", [(1, 1, 0)])
    assert [(r.error_code, r.base_offset) for r in results] == [(0, 0)]
    log.append(rec)
    state = DisklessState(tmp_path / "a.sqlite")
    state.apply(list(enumerate(log)))
    assert state.partitions() == {(TOPIC, 0): ("t", 0, 3), (TOPIC, 1): ("t", 0, 1)}
    assert state.leader_epochs() == {(TOPIC, 0): [(2, 0)], (TOPIC, 1): [(0, 0)]}
    assert [b.base_offset for b in state.find_batches(TOPIC, 1, 0, 1 << 20, 10)] == [0]
    assert state.incarnations() == {(TOPIC, 1): 3}  # partition 0's was not recorded (-2)
    assert CoordinatorView.from_state(state).partitions[(TOPIC, 1)].incarnation == 3
    state.close()


def test_a_re_created_index_is_told_from_the_old_one() -> None:
    """The reconcile deletes a partition the metadata lacks, or has as a later creation of its
    index (a deletion and a growth between two looks); never one whose creation is unrecorded,
    nor for an image older than the record."""
    def image(after_creation: tuple) -> SimpleNamespace:
        info = SimpleNamespace(epochs_after_creation=after_creation)
        return SimpleNamespace(topics={TOPIC: SimpleNamespace(partitions={0: SimpleNamespace(), 4: info})})

    assert incarnation(SimpleNamespace(epochs_after_creation=())) == -1  # created with its topic
    assert incarnation(SimpleNamespace(epochs_after_creation=((0, 5), (1, 4)))) == 5
    later = image(((0, 7), (1, 6)))
    assert partition_gone(later, (TOPIC, 4), 5)  # created at 5, the metadata's is from 7
    assert not partition_gone(later, (TOPIC, 4), 7)
    assert not partition_gone(later, (TOPIC, 4), 9)  # an image older than our record: not gone
    assert not partition_gone(later, (TOPIC, 4), -2)  # unrecorded: never taken as gone
    assert partition_gone(later, (TOPIC, 5), 5)  # no such partition any more
    assert not partition_gone(later, (uuid.uuid4(), 4), 5)  # a deleted topic goes with delete_topics
