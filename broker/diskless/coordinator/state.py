"""The diskless coordinator's materialized state: one SQLite database (WAL mode) per partition of
`__diskless_metadata`, built by applying that partition's records in offset order. The applied
offset is stored in the same transaction as the changes it covers, so after a crash the database
is exactly "the log up to applied_offset" and the coordinator replays the rest.

The database is a cache, never the source of truth: a missing or unreadable file is rebuilt from
the log. Every method here is blocking (sqlite3): callers run them in an executor.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple
from uuid import UUID

from broker.diskless.batches import BatchRow
from protocol.generated.metadata_records.diskless_file_committed_record import DisklessFileCommittedRecord
from protocol.generated.metadata_records.diskless_file_handed_over_record import DisklessFileHandedOverRecord
from protocol.generated.metadata_records.diskless_files_pruned_record import DisklessFilesPrunedRecord
from protocol.generated.metadata_records.diskless_leader_epoch_record import DisklessLeaderEpochRecord
from protocol.generated.metadata_records.diskless_partition_created_record import DisklessPartitionCreatedRecord
from protocol.generated.metadata_records.diskless_partition_deleted_record import DisklessPartitionDeletedRecord
from protocol.generated.metadata_records.diskless_producers_expired_record import DisklessProducersExpiredRecord
from protocol.generated.metadata_records.diskless_records_deleted_record import DisklessRecordsDeletedRecord
from protocol.generated.metadata_records.diskless_topic_deleted_record import DisklessTopicDeletedRecord

PRODUCER_BATCHES_KEPT = 5  # as a local log's producer state (Kafka's NUM_BATCHES_TO_RETAIN)
# 2: handed_over, file_work (an older file is rebuilt from the log). 3: txn_producers,
# txn_aborted; a version 2 database (or snapshot) is upgraded in place: the new tables start empty,
# which is its exact state since no diskless partition took a transactional batch before them.
# 4: leader_epochs, incarnations; a version 2 or 3 database starts them empty, its exact state:
# no batch carried a leader epoch before them (an epoch starts with the first batch or record
# that names it), and a partition without an incarnation row is one not recorded.
SCHEMA_VERSION = 4
UPGRADABLE_VERSIONS = (2, 3)
CONTROL_ABORT, CONTROL_COMMIT = 0, 1  # a marker's control type (Kafka's ControlRecordType)

# file_work statuses (local to the replica that leads: KIP-1164 keeps them out of the log)
HANDED_OVER, DELETED = "handed-over", "deleted"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS partitions (
    topic_id BLOB NOT NULL, partition INTEGER NOT NULL, topic_name TEXT NOT NULL,
    log_start_offset INTEGER NOT NULL, high_watermark INTEGER NOT NULL,
    PRIMARY KEY (topic_id, partition));
CREATE TABLE IF NOT EXISTS files (
    file_id INTEGER PRIMARY KEY, object_key TEXT NOT NULL UNIQUE, format INTEGER NOT NULL,
    size INTEGER NOT NULL, uploader INTEGER NOT NULL, owners TEXT NOT NULL,
    committed_offset INTEGER NOT NULL, deleted INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS batches (
    batch_id INTEGER PRIMARY KEY, topic_id BLOB NOT NULL, partition INTEGER NOT NULL,
    file_id INTEGER NOT NULL REFERENCES files(file_id), magic INTEGER NOT NULL,
    byte_offset INTEGER NOT NULL, byte_size INTEGER NOT NULL,
    base_offset INTEGER NOT NULL, last_offset INTEGER NOT NULL,
    log_append_timestamp INTEGER NOT NULL, max_timestamp INTEGER NOT NULL, timestamp_type INTEGER NOT NULL,
    producer_id INTEGER NOT NULL, producer_epoch INTEGER NOT NULL,
    base_sequence INTEGER NOT NULL, last_sequence INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS batches_by_offset ON batches (topic_id, partition, last_offset);
CREATE INDEX IF NOT EXISTS batches_by_file ON batches (file_id);
CREATE TABLE IF NOT EXISTS producers (
    topic_id BLOB NOT NULL, partition INTEGER NOT NULL, producer_id INTEGER NOT NULL,
    seq INTEGER NOT NULL, producer_epoch INTEGER NOT NULL, base_sequence INTEGER NOT NULL,
    last_sequence INTEGER NOT NULL, base_offset INTEGER NOT NULL, last_offset INTEGER NOT NULL,
    max_timestamp INTEGER NOT NULL,
    PRIMARY KEY (topic_id, partition, producer_id, seq));
CREATE TABLE IF NOT EXISTS handed_over (
    object_key TEXT PRIMARY KEY, size INTEGER NOT NULL, owners TEXT NOT NULL,
    from_coordinator INTEGER NOT NULL, committed_offset INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS file_work (
    object_key TEXT PRIMARY KEY, status TEXT NOT NULL, at_ms INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS txn_producers (
    topic_id BLOB NOT NULL, partition INTEGER NOT NULL, producer_id INTEGER NOT NULL,
    producer_epoch INTEGER NOT NULL, coordinator_epoch INTEGER NOT NULL, first_offset INTEGER NOT NULL,
    PRIMARY KEY (topic_id, partition, producer_id));
CREATE TABLE IF NOT EXISTS txn_aborted (
    topic_id BLOB NOT NULL, partition INTEGER NOT NULL, producer_id INTEGER NOT NULL,
    first_offset INTEGER NOT NULL, last_offset INTEGER NOT NULL,
    PRIMARY KEY (topic_id, partition, last_offset));
CREATE TABLE IF NOT EXISTS leader_epochs (
    topic_id BLOB NOT NULL, partition INTEGER NOT NULL, leader_epoch INTEGER NOT NULL,
    start_offset INTEGER NOT NULL,
    PRIMARY KEY (topic_id, partition, leader_epoch));
CREATE TABLE IF NOT EXISTS incarnations (
    topic_id BLOB NOT NULL, partition INTEGER NOT NULL, incarnation INTEGER NOT NULL,
    PRIMARY KEY (topic_id, partition));
"""
REPLICA_LOCAL_TABLES = ("file_work",)  # not from the log: left out of dumps and snapshots
# handed_over: files another coordinator handed to this one (DisklessFileHandedOverRecord), from
# the log like every other table. file_work: what the leader did with a file it owns (handed it
# on, deleted it): KIP-1164 keeps this status out of the log, so it is this replica's own; a new
# leader without it does the (idempotent) work again.
# txn_producers: per diskless partition, each transactional producer's epoch, the coordinator
# epoch of its last marker and the first offset of its open transaction (-1: none); the last
# stable offset is the smallest such first offset (Kafka's ProducerStateManager, KIP-98).
# txn_aborted: the aborted transactions (first offset, marker offset), Kafka's aborted-transaction
# index, for read_committed Fetch answers.
# leader_epochs: per diskless partition, where each leader epoch starts (Kafka's leader-epoch
# cache; KIP-253's gates ask where an epoch ends): from a batch of a newer epoch than the last
# (DisklessFileCommittedRecord's LeaderEpoch) or a DisklessLeaderEpochRecord. An epoch that never
# took a record is dropped when the next starts at the same offset, as LeaderEpochCache.assign.
# incarnations: which creation of a partition's index the coordinator holds
# (DisklessPartitionCreatedRecord's Incarnation; none: not recorded), so a re-created index whose
# deletion the coordinator did not see is told from the old one.


class FileTask(NamedTuple):
    """A file this coordinator owns and has no live batch in: hand it on, or delete it."""

    object_key: str
    size: int
    owners: list[int]


class RetentionLimits(NamedTuple):
    topic_id: UUID
    partition: int
    retention_ms: int  # -1: no time limit
    retention_bytes: int  # -1: no size limit


@dataclass(slots=True)
class CoordinatorFigures:
    """A coordinator's gauges (DisklessDescribeFiles' Coordinators, the periodic log line)."""

    oldest_file_ms: int = -1
    partitions: int = 0
    files: int = 0
    live_files: int = 0
    live_batches: int = 0
    live_bytes: int = 0
    owned_files: int = 0  # live files it is the first owner of, plus those waiting for its handover or deletion
    pending_handovers: int = 0
    pending_deletions: int = 0


def _owners(text: str) -> list[int]:
    return [int(o) for o in text.split(",") if o]


def next_owner(owners: list[int], index: int) -> int:
    """The owner after `index` in the list, -1 when `index` is the last (or not in it)."""
    if index not in owners:
        return -1
    at = owners.index(index)
    return owners[at + 1] if at + 1 < len(owners) else -1




@dataclass(slots=True)
class TxnProducer:
    """A transactional producer of one diskless partition (txn_producers)."""

    producer_epoch: int
    coordinator_epoch: int
    first_offset: int  # of its open transaction, -1: none


@dataclass(slots=True)
class ProducerBatch:
    producer_epoch: int
    base_sequence: int
    last_sequence: int
    base_offset: int
    last_offset: int
    max_timestamp: int


class DisklessState:
    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        # Opened in the loop thread, used from executor threads one call at a time.
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        # NORMAL: a power cut may lose the last transactions, never corrupt; the log has them.
        self._db.execute("PRAGMA synchronous=NORMAL")
        # No checkpoint (and its fsyncs) inside an apply: checkpoint() runs them beside it.
        self._db.execute("PRAGMA wal_autocheckpoint=0")
        self._checkpointer: sqlite3.Connection | None = None
        self._beside: DisklessState | None = None
        self._db.executescript(_SCHEMA)
        version = self._meta("schema_version")
        if version is None:
            self._db.execute("INSERT INTO meta VALUES ('schema_version', ?)", (SCHEMA_VERSION,))
        elif version in UPGRADABLE_VERSIONS:
            self._db.execute("UPDATE meta SET value = ? WHERE name = 'schema_version'", (SCHEMA_VERSION,))
        elif version != SCHEMA_VERSION:
            raise sqlite3.DatabaseError(f"{self.path}: schema version {version}, expected {SCHEMA_VERSION}")

    def close(self) -> None:
        self._db.close()
        self.close_checkpointer()

    def checkpoint(self) -> None:
        """Copy the WAL into the database (PASSIVE: never waits for, nor blocks, an apply or a
        read) on a second connection, so the fsyncs this takes stay off the commit path. Called
        from one thread, never concurrently with close_checkpointer()."""
        if self._checkpointer is None:
            self._checkpointer = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._checkpointer.execute("PRAGMA wal_checkpoint(PASSIVE)")

    def close_checkpointer(self) -> None:
        self._beside = None
        if self._checkpointer is not None:
            self._checkpointer.close()
            self._checkpointer = None

    def beside(self) -> DisklessState:
        """This database through the second connection (the checkpoint thread's): long reads such
        as the gauges run there, beside the applies and the reads that must follow them (WAL mode:
        it reads the last committed state). Called on that thread only."""
        if self._beside is None:
            if self._checkpointer is None:
                self._checkpointer = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            other = object.__new__(DisklessState)
            other.path, other._db, other._checkpointer, other._beside = self.path, self._checkpointer, None, None
            self._beside = other
        return self._beside

    def _meta(self, name: str) -> int | None:
        row = self._db.execute("SELECT value FROM meta WHERE name = ?", (name,)).fetchone()
        return None if row is None else row[0]

    def applied_offset(self) -> int:
        """The offset of the next record to apply (0: nothing applied)."""
        return self._meta("applied_offset") or 0

    # ------------------------------------------------------------------ applying records
    def apply(self, records: list[tuple[int, Any]], next_offset: int | None = None) -> None:
        """Apply (log offset, record) pairs in one transaction and store, with them, the offset
        after the last one (or `next_offset` when given: the log's records below it are all
        applied, some were not diskless records). Records below the applied offset are skipped
        (a replay)."""
        start = self.applied_offset()
        todo = [(o, r) for o, r in records if o >= start]
        end = todo[-1][0] + 1 if todo else start
        if next_offset is not None:
            end = max(end, next_offset)
        if end <= start:
            return
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            for offset, record in todo:
                self._apply_one(offset, record)
            db.execute("INSERT OR REPLACE INTO meta VALUES ('applied_offset', ?)", (end,))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def _apply_one(self, offset: int, record: Any) -> None:
        db = self._db
        if isinstance(record, DisklessPartitionCreatedRecord):
            db.execute("INSERT OR IGNORE INTO partitions VALUES (?, ?, ?, 0, 0)",
                       (record.topic_id.bytes, record.partition_index, record.name))
            if record.incarnation != -2:
                db.execute("INSERT OR IGNORE INTO incarnations VALUES (?, ?, ?)",
                           (record.topic_id.bytes, record.partition_index, record.incarnation))
        elif isinstance(record, DisklessFileCommittedRecord):
            self._apply_file(offset, record)
        elif isinstance(record, DisklessRecordsDeletedRecord):
            tid = record.topic_id.bytes
            db.execute("UPDATE partitions SET log_start_offset = MAX(log_start_offset, ?) "
                       "WHERE topic_id = ? AND partition = ?", (record.new_log_start_offset, tid, record.partition_index))
            db.execute("DELETE FROM batches WHERE topic_id = ? AND partition = ? AND last_offset < ?",
                       (tid, record.partition_index, record.new_log_start_offset))
            # as Kafka drops the aborted-transaction index with the segments below the log start
            db.execute("DELETE FROM txn_aborted WHERE topic_id = ? AND partition = ? AND last_offset < ?",
                       (tid, record.partition_index, record.new_log_start_offset))
            self._mark_empty_files_deleted()
        elif isinstance(record, DisklessLeaderEpochRecord):
            self._start_epoch(record.topic_id.bytes, record.partition_index, record.leader_epoch, record.start_offset)
        elif isinstance(record, DisklessTopicDeletedRecord):
            tid = record.topic_id.bytes
            for table in ("partitions", "batches", "producers", "txn_producers", "txn_aborted", "leader_epochs",
                          "incarnations"):
                db.execute(f"DELETE FROM {table} WHERE topic_id = ?", (tid,))
            self._mark_empty_files_deleted()
        elif isinstance(record, DisklessPartitionDeletedRecord):
            gone = (record.topic_id.bytes, record.partition_index)
            for table in ("partitions", "batches", "producers", "txn_producers", "txn_aborted", "leader_epochs",
                          "incarnations"):
                db.execute(f"DELETE FROM {table} WHERE topic_id = ? AND partition = ?", gone)
            self._mark_empty_files_deleted()
        elif isinstance(record, DisklessProducersExpiredRecord):
            # a producer in an open transaction is never expired (the leader checked; a replay agrees)
            tid = record.topic_id.bytes
            for pid in record.producer_ids:
                which = (tid, record.partition_index, pid)
                db.execute("DELETE FROM producers WHERE topic_id = ? AND partition = ? AND producer_id = ?", which)
                db.execute("DELETE FROM txn_producers WHERE topic_id = ? AND partition = ? AND producer_id = ?"
                           " AND first_offset < 0", which)
        elif isinstance(record, DisklessFileHandedOverRecord):
            db.execute("INSERT OR IGNORE INTO handed_over VALUES (?, ?, ?, ?, ?)",
                       (record.object_key, record.file_size, ",".join(str(o) for o in record.owner_ids),
                        record.from_coordinator, offset))
        elif isinstance(record, DisklessFilesPrunedRecord):
            # gone from object storage: nothing left to hand on, delete or describe. Only files
            # without a live batch (a file some partition still reads from is never pruned).
            for key in record.object_keys:
                if db.execute("SELECT 1 FROM files WHERE object_key = ? AND deleted = 0", (key,)).fetchone():
                    continue
                for table in ("files", "handed_over", "file_work"):
                    db.execute(f"DELETE FROM {table} WHERE object_key = ?", (key,))

    def _mark_empty_files_deleted(self) -> None:
        # `deleted`: no live batch of this coordinator left in the file; its owner hands it on
        # or deletes it (file_tasks).
        self._db.execute("UPDATE files SET deleted = 1 WHERE deleted = 0 AND "
                         "NOT EXISTS (SELECT 1 FROM batches b WHERE b.file_id = files.file_id)")

    def _apply_file(self, offset: int, r: DisklessFileCommittedRecord) -> None:
        db = self._db
        cur = db.execute(
            "INSERT INTO files (object_key, format, size, uploader, owners, committed_offset) VALUES (?, ?, ?, ?, ?, ?)",
            (r.object_key, r.object_format, r.file_size, r.uploader_broker_id,
             ",".join(str(o) for o in r.owner_ids), offset))
        file_id = cur.lastrowid
        for t in r.topics:
            tid = t.topic_id.bytes
            for p in t.partitions:
                for b in p.batches:
                    db.execute(
                        "INSERT INTO batches (topic_id, partition, file_id, magic, byte_offset, byte_size, base_offset,"
                        " last_offset, log_append_timestamp, max_timestamp, timestamp_type, producer_id,"
                        " producer_epoch, base_sequence, last_sequence) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                        (tid, p.partition_index, file_id, b.magic, b.byte_offset, b.byte_size,
                         b.assigned_base_offset, b.assigned_last_offset, b.log_append_timestamp,
                         b.batch_max_timestamp, b.timestamp_type, b.producer_id, b.producer_epoch,
                         b.base_sequence, b.last_sequence))
                    if b.leader_epoch >= 0:
                        self._start_epoch(tid, p.partition_index, b.leader_epoch, b.assigned_base_offset)
                    if b.producer_id >= 0 and b.control_type < 0:
                        self._remember_producer_batch(tid, p.partition_index, b)
                    if b.control_type >= 0:
                        self._end_transaction(tid, p.partition_index, b)
                    elif b.is_transactional:
                        self._begin_transaction(tid, p.partition_index, b)
                last = p.batches[-1].assigned_last_offset if p.batches else -1
                db.execute("UPDATE partitions SET high_watermark = MAX(high_watermark, ?) "
                           "WHERE topic_id = ? AND partition = ?", (last + 1, tid, p.partition_index))

    def _start_epoch(self, tid: bytes, partition: int, epoch: int, start: int) -> None:
        """`epoch` starts at `start` unless it is not newer than the last one (the same rule as
        the view's PartitionView.start_epoch)."""
        db = self._db
        row = db.execute("SELECT MAX(leader_epoch) FROM leader_epochs WHERE topic_id = ? AND partition = ?",
                         (tid, partition)).fetchone()
        if row[0] is not None and epoch <= row[0]:
            return
        db.execute("DELETE FROM leader_epochs WHERE topic_id = ? AND partition = ? AND start_offset >= ?",
                   (tid, partition, start))
        db.execute("INSERT INTO leader_epochs VALUES (?,?,?,?)", (tid, partition, epoch, start))

    def leader_epochs(self) -> dict[tuple[UUID, int], list[tuple[int, int]]]:
        """(topic id, partition) -> its (leader epoch, start offset) entries, oldest first."""
        out: dict[tuple[UUID, int], list[tuple[int, int]]] = {}
        for t, p, epoch, start in self._db.execute("SELECT topic_id, partition, leader_epoch, start_offset"
                                                   " FROM leader_epochs ORDER BY topic_id, partition, leader_epoch"):
            out.setdefault((UUID(bytes=t), p), []).append((epoch, start))
        return out

    def incarnations(self) -> dict[tuple[UUID, int], int]:
        """(topic id, partition) -> its incarnation, for the partitions that have one recorded."""
        return {(UUID(bytes=t), p): i for t, p, i in self._db.execute("SELECT * FROM incarnations")}

    def _remember_producer_batch(self, tid: bytes, partition: int, b: Any) -> None:
        db = self._db
        row = db.execute("SELECT MAX(seq) FROM producers WHERE topic_id = ? AND partition = ? AND producer_id = ?",
                         (tid, partition, b.producer_id)).fetchone()
        seq = (row[0] if row[0] is not None else -1) + 1
        db.execute("INSERT INTO producers VALUES (?,?,?,?,?,?,?,?,?,?)",
                   (tid, partition, b.producer_id, seq, b.producer_epoch, b.base_sequence, b.last_sequence,
                    b.assigned_base_offset, b.assigned_last_offset, b.batch_max_timestamp))
        db.execute("DELETE FROM producers WHERE topic_id = ? AND partition = ? AND producer_id = ? AND seq <= ?",
                   (tid, partition, b.producer_id, seq - PRODUCER_BATCHES_KEPT))

    def _begin_transaction(self, tid: bytes, partition: int, b: Any) -> None:
        """A transactional batch: its producer's transaction opens here unless already open."""
        db = self._db
        row = db.execute("SELECT producer_epoch, first_offset FROM txn_producers WHERE topic_id = ? AND partition = ?"
                         " AND producer_id = ?", (tid, partition, b.producer_id)).fetchone()
        if row is None:
            db.execute("INSERT INTO txn_producers VALUES (?,?,?,?,-1,?)",
                       (tid, partition, b.producer_id, b.producer_epoch, b.assigned_base_offset))
        else:
            first = row[1] if row[1] >= 0 else b.assigned_base_offset
            db.execute("UPDATE txn_producers SET producer_epoch = ?, first_offset = ? WHERE topic_id = ?"
                       " AND partition = ? AND producer_id = ?",
                       (max(row[0], b.producer_epoch), first, tid, partition, b.producer_id))

    def _end_transaction(self, tid: bytes, partition: int, b: Any) -> None:
        """A marker: the producer's open transaction (if any) ends; an abort is indexed."""
        db = self._db
        row = db.execute("SELECT producer_epoch, first_offset FROM txn_producers WHERE topic_id = ? AND partition = ?"
                         " AND producer_id = ?", (tid, partition, b.producer_id)).fetchone()
        epoch = b.producer_epoch if row is None else max(row[0], b.producer_epoch)
        if row is not None and row[1] >= 0 and b.control_type == CONTROL_ABORT:
            db.execute("INSERT OR REPLACE INTO txn_aborted VALUES (?,?,?,?,?)",
                       (tid, partition, b.producer_id, row[1], b.assigned_last_offset))
        db.execute("INSERT OR REPLACE INTO txn_producers VALUES (?,?,?,?,?,-1)",
                   (tid, partition, b.producer_id, epoch, b.coordinator_epoch))

    # ------------------------------------------------------------------ reads
    def txn_producers(self) -> dict[tuple[UUID, int, int], TxnProducer]:
        """(topic id, partition, producer id) -> its transaction state."""
        return {(UUID(bytes=t), p, pid): TxnProducer(e, ce, first) for t, p, pid, e, ce, first in self._db.execute(
            "SELECT topic_id, partition, producer_id, producer_epoch, coordinator_epoch, first_offset"
            " FROM txn_producers")}

    def last_stable_offset(self, topic_id: UUID, partition: int, high_watermark: int) -> int:
        """The first offset of the oldest open transaction, else the high watermark."""
        row = self._db.execute("SELECT MIN(first_offset) FROM txn_producers WHERE topic_id = ? AND partition = ?"
                               " AND first_offset >= 0", (topic_id.bytes, partition)).fetchone()
        return high_watermark if row[0] is None else min(row[0], high_watermark)

    def aborted_transactions(self, topic_id: UUID, partition: int, start: int, end: int) -> list[tuple[int, int]]:
        """(producer id, first offset) of the aborted transactions overlapping [start, end): their
        marker at or after `start`, their first offset before `end` (Kafka's collectAbortedTxns)."""
        return [(pid, first) for pid, first in self._db.execute(
            "SELECT producer_id, first_offset FROM txn_aborted WHERE topic_id = ? AND partition = ?"
            " AND last_offset >= ? AND first_offset < ? ORDER BY first_offset", (topic_id.bytes, partition, start, end))]

    def partitions(self) -> dict[tuple[UUID, int], tuple[str, int, int]]:
        """(topic id, partition) -> (topic name, log start offset, high watermark)."""
        return {(UUID(bytes=t), p): (n, lso, hw) for t, p, n, lso, hw in
                self._db.execute("SELECT topic_id, partition, topic_name, log_start_offset, high_watermark "
                                 "FROM partitions")}

    def producers(self) -> dict[tuple[UUID, int, int], list[ProducerBatch]]:
        """(topic id, partition, producer id) -> its last batches, oldest first."""
        out: dict[tuple[UUID, int, int], list[ProducerBatch]] = {}
        for row in self._db.execute("SELECT topic_id, partition, producer_id, producer_epoch, base_sequence,"
                                    " last_sequence, base_offset, last_offset, max_timestamp FROM producers"
                                    " ORDER BY topic_id, partition, producer_id, seq"):
            out.setdefault((UUID(bytes=row[0]), row[1], row[2]), []).append(ProducerBatch(*row[3:]))
        return out

    def find_batches(self, topic_id: UUID, partition: int, offset: int, max_bytes: int,
                     max_batches: int, end: int = -1) -> list[BatchRow]:
        """Batches holding `offset` and after, in offset order, up to `max_bytes` (at least one
        batch) and `max_batches`; with `end` >= 0 only those ending below it (a read_committed
        reader's last stable offset)."""
        rows = self._db.execute(
            "SELECT b.batch_id, f.object_key, b.magic, b.byte_offset, b.byte_size, b.base_offset, b.last_offset,"
            " b.log_append_timestamp, b.max_timestamp, b.timestamp_type FROM batches b JOIN files f USING (file_id)"
            " WHERE b.topic_id = ? AND b.partition = ? AND b.last_offset >= ? AND (? < 0 OR b.last_offset < ?)"
            " ORDER BY b.last_offset LIMIT ?",
            (topic_id.bytes, partition, offset, end, end, max(1, max_batches)))
        out: list[BatchRow] = []
        size = 0
        for row in rows:
            if out and size + row[4] > max_bytes:
                break
            out.append(BatchRow(*row))
            size += row[4]
        return out

    def offset_for_timestamp(self, topic_id: UUID, partition: int, timestamp: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first batch whose max timestamp is >= `timestamp` (the
        batch's base offset, as Kafka answers for a batch-granular index), or None."""
        row = self._db.execute(
            "SELECT base_offset, CASE timestamp_type WHEN 1 THEN log_append_timestamp ELSE max_timestamp END AS ts"
            " FROM batches WHERE topic_id = ? AND partition = ? AND ts >= ? ORDER BY base_offset LIMIT 1",
            (topic_id.bytes, partition, timestamp)).fetchone()
        return None if row is None else (row[0], row[1])

    def max_timestamp(self, topic_id: UUID, partition: int) -> tuple[int, int] | None:
        row = self._db.execute(
            "SELECT base_offset, CASE timestamp_type WHEN 1 THEN log_append_timestamp ELSE max_timestamp END AS ts"
            " FROM batches WHERE topic_id = ? AND partition = ? ORDER BY ts DESC, base_offset LIMIT 1",
            (topic_id.bytes, partition)).fetchone()
        return None if row is None else (row[0], row[1])

    def file_has_batches(self, object_key: str) -> bool | None:
        """True/False for a known file, None for one this coordinator never saw."""
        row = self._db.execute("SELECT file_id FROM files WHERE object_key = ?", (object_key,)).fetchone()
        if row is None:
            return None
        return self._db.execute("SELECT 1 FROM batches WHERE file_id = ? LIMIT 1", (row[0],)).fetchone() is not None

    # ------------------------------------------------------------------ file lifecycle
    def file_tasks(self, index: int) -> tuple[list[FileTask], list[FileTask]]:
        """(owned, waiting) files with no live batch of coordinator `index` left and nothing done
        about them yet (file_work): owned ones it is the first owner of (or was handed; an empty
        owner list: the only owner), waiting ones an earlier owner still owns (or whose owner list
        does not name it: never deleted from here)."""
        owned: list[FileTask] = []
        waiting: list[FileTask] = []
        rows = self._db.execute(
            "SELECT f.object_key, f.size, f.owners, h.object_key IS NOT NULL FROM files f"
            " LEFT JOIN handed_over h USING (object_key) LEFT JOIN file_work w USING (object_key)"
            " WHERE f.deleted = 1 AND w.object_key IS NULL")
        for key, size, owners_text, handed in rows:
            owners = _owners(owners_text)
            task = FileTask(key, size, owners)
            (owned if handed or not owners or owners[0] == index else waiting).append(task)
        # handed over here but never committed here (this coordinator's commit of it failed)
        for key, size, owners_text in self._db.execute(
                "SELECT h.object_key, h.size, h.owners FROM handed_over h LEFT JOIN files f USING (object_key)"
                " LEFT JOIN file_work w USING (object_key) WHERE f.object_key IS NULL AND w.object_key IS NULL"):
            owned.append(FileTask(key, size, _owners(owners_text)))
        return owned, waiting

    def owns_file(self, object_key: str, index: int) -> bool:
        """Whether coordinator `index` owns the file now or did (handed over to it, or its first owner)."""
        if self._db.execute("SELECT 1 FROM handed_over WHERE object_key = ?", (object_key,)).fetchone():
            return True
        row = self._db.execute("SELECT owners FROM files WHERE object_key = ?", (object_key,)).fetchone()
        return row is not None and (not _owners(row[0]) or _owners(row[0])[0] == index)

    def set_file_status(self, object_key: str, status: str, at_ms: int) -> None:
        self._db.execute("INSERT OR REPLACE INTO file_work VALUES (?, ?, ?)", (object_key, status, at_ms))

    def known_files(self, keys: list[str]) -> set[str]:
        """The keys of `keys` this coordinator knows (committed batches in, or handed over to it)."""
        known: set[str] = set()
        for i in range(0, len(keys), 500):
            part = keys[i:i + 500]
            marks = ",".join("?" * len(part))
            for table in ("files", "handed_over"):
                known.update(r[0] for r in self._db.execute(
                    f"SELECT object_key FROM {table} WHERE object_key IN ({marks})", part))
        return known

    def oldest_live_file_ms(self) -> int:
        """Commit time of the oldest batch still live here (the orphan scan's step 1), -1 if none."""
        row = self._db.execute("SELECT MIN(log_append_timestamp) FROM batches").fetchone()
        return -1 if row[0] is None else row[0]

    def figures(self, index: int) -> CoordinatorFigures:
        """Coordinator `index`'s gauges (a pass over its live files and its file tasks)."""
        db = self._db
        oldest, batches, size = db.execute(
            "SELECT MIN(log_append_timestamp), COUNT(*), COALESCE(SUM(byte_size), 0) FROM batches").fetchone()
        files, live = db.execute("SELECT COUNT(*), COALESCE(SUM(deleted = 0), 0) FROM files").fetchone()
        parts = db.execute("SELECT COUNT(*) FROM partitions").fetchone()[0]
        first = sum(1 for (owners,) in db.execute("SELECT owners FROM files WHERE deleted = 0")
                    if not _owners(owners) or _owners(owners)[0] == index)
        owned, _ = self.file_tasks(index)
        handovers = sum(1 for t in owned if next_owner(t.owners, index) >= 0)
        return CoordinatorFigures(oldest if oldest is not None else -1, parts, files, live, batches, size,
                                  first + len(owned), handovers, len(owned) - handovers)

    def file_details(self, index: int, limit: int = -1) -> list[tuple[str, int, list[int], int, str]]:
        """(key, size, owners, live batches, status) of the files this coordinator knows, the
        newest (by commit or handover) first, at most `limit` (-1: all)."""
        out = []
        for key, size, owners_text, live, handed, work, _ in self._db.execute(
                "SELECT f.object_key, f.size, f.owners, (SELECT COUNT(*) FROM batches b WHERE b.file_id = f.file_id),"
                " h.object_key IS NOT NULL, w.status, f.committed_offset FROM files f"
                " LEFT JOIN handed_over h USING (object_key) LEFT JOIN file_work w USING (object_key) UNION ALL"
                " SELECT h.object_key, h.size, h.owners, 0, 1, w.status, h.committed_offset FROM handed_over h"
                " LEFT JOIN file_work w USING (object_key)"
                " WHERE NOT EXISTS (SELECT 1 FROM files f WHERE f.object_key = h.object_key)"
                " ORDER BY 7 DESC LIMIT ?", (limit,)):
            owners = _owners(owners_text)
            if work:
                status = work
            elif live:
                status = "live"
            elif handed or not owners or owners[0] == index:
                status = "owned"
            else:
                status = "waiting"
            out.append((key, size, owners, live, status))
        return out

    # ------------------------------------------------------------------ retention
    def retention_offsets(self, limits: list[RetentionLimits], now_ms: int) -> list[tuple[UUID, int, int]]:
        """(topic id, partition, new log start offset) for the partitions whose oldest batches
        retention.ms or retention.bytes remove, as Kafka removes segments: from the oldest on,
        while each is older than retention.ms, and while what stays is at least retention.bytes.
        A batch is the unit (every batch of the partition may go)."""
        out = []
        for tid, part, ms, max_bytes in limits:
            row = self._db.execute("SELECT log_start_offset, high_watermark FROM partitions"
                                   " WHERE topic_id = ? AND partition = ?", (tid.bytes, part)).fetchone()
            if row is None:
                continue
            lso, hw = row
            new = lso
            if ms >= 0:
                kept = self._db.execute(
                    "SELECT MIN(base_offset) FROM batches WHERE topic_id = ? AND partition = ? AND"
                    " CASE timestamp_type WHEN 1 THEN log_append_timestamp ELSE max_timestamp END >= ?",
                    (tid.bytes, part, now_ms - ms)).fetchone()[0]
                new = max(new, hw if kept is None else kept)
            if max_bytes >= 0:
                kept = self._db.execute(
                    "SELECT MIN(base_offset) FROM (SELECT base_offset, SUM(byte_size) OVER (ORDER BY last_offset DESC"
                    " ROWS UNBOUNDED PRECEDING) - byte_size AS after FROM batches WHERE topic_id = ? AND partition = ?)"
                    " WHERE after < ?", (tid.bytes, part, max_bytes)).fetchone()[0]
                new = max(new, hw if kept is None else kept)
            if new > lso:
                out.append((tid, part, min(new, hw)))
        return out

    def dump(self) -> dict[str, list[tuple]]:
        """Every table's rows in a stable order (replicas compare these; file_work is the
        leader's own, outside the log, so it is left out)."""
        out = {}
        for table, order in (("meta", "name"), ("partitions", "topic_id, partition"), ("files", "file_id"),
                             ("batches", "batch_id"), ("producers", "topic_id, partition, producer_id, seq"),
                             ("handed_over", "object_key"),
                             ("txn_producers", "topic_id, partition, producer_id"),
                             ("txn_aborted", "topic_id, partition, last_offset"),
                             ("leader_epochs", "topic_id, partition, leader_epoch"),
                             ("incarnations", "topic_id, partition")):
            out[table] = list(self._db.execute(f"SELECT * FROM {table} ORDER BY {order}"))
        return out
