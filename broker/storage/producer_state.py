"""Producer state of one chunk replica log: what idempotent producers last wrote, for duplicate and
sequence checks (Kafka's ProducerStateManager, idempotence part).

Per producer id the log keeps its epoch, the metadata of its last 5 batches (first/last sequence,
first/last offset, max timestamp) and its last timestamp. Only batch headers feed it, never records.

Rules on a leader append of a batch with producerId >= 0 (client origin):
  - the batch repeats one of the 5 cached batches (same epoch, same first and last sequence): a
    duplicate. Nothing is appended; the append answers the ORIGINAL batch's offsets (error NONE).
  - epoch lower than the known one: INVALID_PRODUCER_EPOCH (47).
  - epoch higher than a known one: the batch must start at sequence 0, else OUT_OF_ORDER_SEQUENCE_NUMBER (45).
  - same epoch: the first sequence must follow the last one (wrapping from int32 max to 0), else 45.
  - a producer id the log does not know (new, expired, or written before the log start) is accepted
    at any sequence: Kafka answers UNKNOWN_PRODUCER_ID no more.
Coordinator appends check the epoch only; follower appends and recovery check nothing (the leader did).

Transactions (Kafka's ProducerStateManager, transactional part):
  - a transactional data batch opens the producer's transaction at its first offset unless one is
    open (`current_txn_first_offset`); a non-transactional batch while one is open is
    INVALID_TXN_STATE (48).
  - a marker (control batch, coordinator origin) with an epoch below the producer's is
    INVALID_PRODUCER_EPOCH (47); with a coordinator epoch below the last one seen,
    TRANSACTION_COORDINATOR_FENCED (52). It closes the open transaction (a CompletedTxn); a marker
    for a producer without one is written but completes nothing.
  - completed transactions stay "unreplicated" until the high watermark passes their marker. The
    first unstable offset is the smallest first offset of the open and the unreplicated ones; the
    log's last stable offset is min(first unstable offset, high watermark).

Snapshots: `<offset, 20 digits>.snapshot` beside the segments holds the state of every batch below
that offset. Written (without fsync; Log.flush syncs it right after) when a segment rolls, with fsync
on clean close. Layout, big-endian::

    file   := version int16 (1) | crc uint32 (CRC32C of body) | body
    body   := producer count int32 | entry*
    entry  := producer id int64 | epoch int16 | last timestamp int64 | coordinator epoch int32
              | current transaction first offset int64 (-1: none) | batch count int8 (0..5) | batch*
    batch  := first seq int32 | last seq int32 | first offset int64 | last offset int64 | max timestamp int64

A snapshot that is short, has trailing bytes, an unknown version or a bad CRC is deleted and the next
older one is tried. Recovery loads the newest snapshot at or below the recovered log end and rebuilds
the rest from batch headers; truncation drops newer snapshots and does the same; snapshots below the
log start are deleted. A producer idle for producer.id.expiration.ms (by the timestamps of its
batches, as Kafka) is forgotten, both in memory and when a snapshot is loaded.
"""

from __future__ import annotations

import os
import struct
from bisect import bisect_right
from collections import deque
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

import structlog
from crc32c import crc32c

from broker.storage.atomic_file import fsync_file, read_small_file, write_file
from broker.storage.errors import INVALID_RECORD, InvalidRecordError, StorageError
from broker.storage.file_names import TMP_SUFFIX
from protocol.records.batch import BatchHeader
from protocol.records.control import TxnMarker

log = structlog.get_logger(__name__)

NUM_BATCHES_TO_RETAIN = 5
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
INT32_MAX = 2**31 - 1
DEFAULT_PRODUCER_ID_EXPIRATION_MS = 86_400_000  # producer.id.expiration.ms (Kafka's default: one day)

NOT_LEADER_OR_FOLLOWER = 6
OUT_OF_ORDER_SEQUENCE_NUMBER = 45
INVALID_PRODUCER_EPOCH = 47
INVALID_TXN_STATE = 48
TRANSACTION_COORDINATOR_FENCED = 52

SNAPSHOT_SUFFIX = ".snapshot"
SNAPSHOT_VERSION = 1
_FILE_HEAD = struct.Struct(">hI")  # version, crc
_COUNT = struct.Struct(">i")
_ENTRY = struct.Struct(">qhqiqb")  # pid, epoch, last timestamp, coordinator epoch, txn first offset, batches
_BATCH = struct.Struct(">iiqqq")  # first seq, last seq, first offset, last offset, max timestamp


class OutOfOrderSequenceError(StorageError):
    """A sequence gap, or a new epoch that does not start at sequence 0."""

    error_code = OUT_OF_ORDER_SEQUENCE_NUMBER


class SequenceGapError(StorageError):
    """A batch whose predecessors in its producer's sequence are missing: answered with a
    retriable error, not OUT_OF_ORDER_SEQUENCE_NUMBER. librdkafka takes that error on a batch
    after its first unacknowledged one as its cue to bump the producer epoch and renumber every
    unacknowledged message, those a lost answer left written among them (a duplicate once they
    are sent again). Retried, the producer sends the missing batches first (it retries in
    order) or, having given them up, bumps the epoch itself."""

    error_code = NOT_LEADER_OR_FOLLOWER


class InvalidProducerEpochError(StorageError):
    """A batch from an epoch older than the one this log already holds (a fenced, zombie producer)."""

    error_code = INVALID_PRODUCER_EPOCH


class InvalidTxnStateError(StorageError):
    """A non-transactional batch from a producer whose transaction is open."""

    error_code = INVALID_TXN_STATE


class TransactionCoordinatorFencedError(StorageError):
    """A marker from a coordinator older than the one that wrote this producer's last marker."""

    error_code = TRANSACTION_COORDINATOR_FENCED


class CorruptSnapshotError(Exception):
    pass


class CompletedTxn(NamedTuple):
    producer_id: int
    first_offset: int
    last_offset: int  # the marker's offset
    aborted: bool


def last_sequence(base_sequence: int, last_offset_delta: int) -> int:
    """Sequence of a batch's last record: sequences wrap from int32 max to 0."""
    if base_sequence > INT32_MAX - last_offset_delta:
        return last_offset_delta - (INT32_MAX - base_sequence) - 1
    return base_sequence + last_offset_delta


def in_sequence(last_seq: int, next_seq: int) -> bool:
    return next_seq == last_seq + 1 or (next_seq == 0 and last_seq == INT32_MAX)


def sequence_gap(last_seq: int, next_seq: int) -> bool:
    """`next_seq` lies ahead of the sequence after `last_seq` (within half the int32 range,
    across the wrap): batches between them have not arrived (yet)."""
    return 0 < (next_seq - last_seq - 1) % (INT32_MAX + 1) < (INT32_MAX + 1) // 2


def snapshot_file_name(offset: int) -> str:
    return f"{offset:020d}{SNAPSHOT_SUFFIX}"


def parse_snapshot_file_name(name: str) -> int | None:
    stem, dot, ext = name.partition(".")
    if dot and "." + ext == SNAPSHOT_SUFFIX and len(stem) == 20 and stem.isdigit():
        return int(stem)
    return None


class BatchMetadata(NamedTuple):
    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int
    timestamp: int  # the batch's max timestamp (LogAppendTime when the topic uses it)


class ProducerEntry:
    """One producer id's state in one log."""

    __slots__ = ("producer_id", "epoch", "batches", "last_timestamp", "coordinator_epoch", "current_txn_first_offset")

    def __init__(
        self,
        producer_id: int,
        epoch: int = NO_PRODUCER_EPOCH,
        batches: Iterable[BatchMetadata] = (),
        last_timestamp: int = -1,
        coordinator_epoch: int = -1,
        current_txn_first_offset: int = -1,
    ) -> None:
        self.producer_id = producer_id
        self.epoch = epoch
        self.batches: deque[BatchMetadata] = deque(batches, NUM_BATCHES_TO_RETAIN)
        self.last_timestamp = last_timestamp
        self.coordinator_epoch = coordinator_epoch
        self.current_txn_first_offset = current_txn_first_offset

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else NO_SEQUENCE

    @property
    def last_offset(self) -> int:
        return self.batches[-1].last_offset if self.batches else -1

    def copy(self) -> ProducerEntry:
        return ProducerEntry(
            self.producer_id,
            self.epoch,
            self.batches,
            self.last_timestamp,
            self.coordinator_epoch,
            self.current_txn_first_offset,
        )

    def find_duplicate(self, epoch: int, first_seq: int, last_seq: int) -> BatchMetadata | None:
        if epoch != self.epoch:
            return None
        for b in self.batches:
            if b.first_seq == first_seq and b.last_seq == last_seq:
                return b
        return None

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.batches.clear()  # the old epoch's sequences mean nothing under the new one
            self.epoch = epoch

    def add_batch(self, epoch: int, batch: BatchMetadata) -> None:
        self.set_epoch(epoch)
        self.batches.append(batch)  # the deque's maxlen drops the oldest of 5
        self.last_timestamp = batch.timestamp

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ProducerEntry):
            return NotImplemented
        return all(getattr(self, s) == getattr(other, s) for s in self.__slots__)

    def __repr__(self) -> str:
        return (
            f"ProducerEntry(pid={self.producer_id}, epoch={self.epoch}, last_seq={self.last_seq}, "
            f"last_offset={self.last_offset}, batches={len(self.batches)}, last_timestamp={self.last_timestamp})"
        )


def _metadata(header: BatchHeader, first_offset: int, last_offset: int, timestamp: int) -> BatchMetadata:
    return BatchMetadata(
        header.base_sequence,
        last_sequence(header.base_sequence, header.last_offset_delta),
        first_offset,
        last_offset,
        timestamp,
    )


class LeaderAppend:
    """The state changes of one leader append, validated batch by batch and applied only once the
    bytes are in the log (commit). Kafka's ProducerAppendInfo, for all producers of one append."""

    __slots__ = ("_manager", "_client", "updated", "completed")

    def __init__(self, manager: ProducerStateManager, client: bool) -> None:
        self._manager = manager
        self._client = client
        self.updated: dict[int, ProducerEntry] = {}
        self.completed: list[CompletedTxn] = []

    def add(
        self,
        header: BatchHeader,
        first_offset: int,
        last_offset: int,
        timestamp: int,
        marker: TxnMarker | None = None,
    ) -> BatchMetadata | None:
        """Check one batch (producerId >= 0) about to land at [first_offset, last_offset]. Returns the
        cached metadata of the batch it duplicates (then nothing may be appended), else None.
        `marker` is the transaction marker of a control batch. Raises OutOfOrderSequenceError /
        InvalidProducerEpochError / InvalidRecordError / InvalidTxnStateError /
        TransactionCoordinatorFencedError."""
        pid = header.producer_id
        epoch = header.producer_epoch
        current = self._manager.producers.get(pid)
        if self._client:
            if header.base_sequence < 0:
                raise InvalidRecordError(
                    f"invalid sequence number {header.base_sequence} in a batch of producer {pid}",
                    error_code=INVALID_RECORD,
                )
            if current is not None:
                dup = current.find_duplicate(
                    epoch, header.base_sequence, last_sequence(header.base_sequence, header.last_offset_delta)
                )
                if dup is not None:
                    return dup
        entry = self.updated.get(pid)
        if entry is None:
            entry = current.copy() if current is not None else ProducerEntry(pid)
            self.updated[pid] = entry
        if epoch < entry.epoch:
            raise InvalidProducerEpochError(
                f"epoch {epoch} of producer {pid} at offset {first_offset} is older than the last seen epoch {entry.epoch}"
            )
        if header.is_control:
            # A transaction marker (coordinator only): it moves the epoch, carries no sequence.
            if marker is not None and marker.coordinator_epoch < entry.coordinator_epoch:
                raise TransactionCoordinatorFencedError(
                    f"marker of producer {pid} from coordinator epoch {marker.coordinator_epoch}, "
                    f"older than the last seen {entry.coordinator_epoch}"
                )
            done = _apply_marker(entry, epoch, timestamp, marker, first_offset)
            if done is not None:
                self.completed.append(done)
            return None
        if not header.is_transactional and entry.current_txn_first_offset >= 0:
            raise InvalidTxnStateError(
                f"non-transactional batch of producer {pid} while its transaction from offset "
                f"{entry.current_txn_first_offset} is open"
            )
        if self._client:
            seq = header.base_sequence
            if epoch != entry.epoch:
                if seq != 0 and entry.epoch != NO_PRODUCER_EPOCH:
                    raise OutOfOrderSequenceError(
                        f"producer {pid} starts epoch {epoch} (was {entry.epoch}) at sequence {seq}, not 0"
                    )
            elif not (current is None or current.epoch == NO_PRODUCER_EPOCH or in_sequence(entry.last_seq, seq)):
                if sequence_gap(entry.last_seq, seq):
                    raise SequenceGapError(
                        f"producer {pid} sent sequence {seq} before {entry.last_seq + 1}: the batches between have "
                        "not arrived; retry"
                    )
                raise OutOfOrderSequenceError(
                    f"out of order sequence number for producer {pid} at offset {first_offset}: "
                    f"{seq} (incoming), {entry.last_seq} (current end)"
                )
        entry.add_batch(epoch, _metadata(header, first_offset, last_offset, timestamp))
        if header.is_transactional and entry.current_txn_first_offset < 0:
            entry.current_txn_first_offset = first_offset
        return None

    def commit(self) -> list[CompletedTxn]:
        """Apply the changes; returns the transactions the append's markers completed."""
        m = self._manager
        m.producers.update(self.updated)
        for pid, entry in self.updated.items():
            m._track_ongoing(pid, entry.current_txn_first_offset)
        if self.completed:
            m._unreplicated = [*m._unreplicated, *self.completed]
        return self.completed


def _apply_marker(
    entry: ProducerEntry, epoch: int, timestamp: int, marker: TxnMarker | None, offset: int
) -> CompletedTxn | None:
    entry.set_epoch(epoch)
    entry.last_timestamp = timestamp
    if marker is None:
        return None  # an unknown control record: no transaction ends
    entry.coordinator_epoch = marker.coordinator_epoch
    first = entry.current_txn_first_offset
    entry.current_txn_first_offset = -1
    if first < 0:
        return None  # nothing was written in the transaction: nothing becomes stable or aborted
    return CompletedTxn(entry.producer_id, first, offset, not marker.commit)


class ProducerStateManager:
    """Producer entries of one log, and its snapshot files. Not thread-safe: Log calls it under its lock."""

    # one a log: no __dict__ each, and the two collections that are empty on almost every log
    # (transactions awaiting the HW, snapshots awaiting a flush) are the shared empty tuple then
    __slots__ = ("dir", "expiration_ms", "producers", "_ongoing", "_unreplicated", "_snapshots", "_unsynced")

    def __init__(self, dir: Path, expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS) -> None:
        self.dir = dir
        self.expiration_ms = expiration_ms
        self.producers: dict[int, ProducerEntry] = {}
        self._ongoing: dict[int, int] = {}  # producer id -> first offset of its open transaction
        # completed, marker not yet below the HW; marker order
        self._unreplicated: list[CompletedTxn] | tuple[CompletedTxn, ...] = ()
        self._snapshots: list[int] = []  # offsets of the snapshot files on disk, sorted
        self._unsynced: tuple[int, ...] = ()  # offsets of snapshots written without fsync

    # -- appends ---------------------------------------------------------------------------------

    def begin_leader_append(self, *, client: bool) -> LeaderAppend:
        return LeaderAppend(self, client)

    def find_duplicate(self, header: BatchHeader) -> BatchMetadata | None:
        """The cached batch `header` repeats (same producer, epoch and sequences), if any."""
        entry = self.producers.get(header.producer_id) if header.producer_id >= 0 else None
        if entry is None or header.is_control:
            return None
        return entry.find_duplicate(
            header.producer_epoch, header.base_sequence, last_sequence(header.base_sequence, header.last_offset_delta)
        )

    def update_from_header(self, header: BatchHeader, marker: TxnMarker | None = None) -> CompletedTxn | None:
        """A batch the log already holds (follower append, recovery): no checks, as Kafka trusts the
        leader. The header carries final offsets and timestamps; `marker` is a control batch's
        transaction marker. Returns the transaction a marker completed."""
        pid = header.producer_id
        entry = self.producers.get(pid)
        if entry is None:
            entry = self.producers[pid] = ProducerEntry(pid)
        done = None
        if header.is_control:
            done = _apply_marker(entry, header.producer_epoch, header.max_timestamp, marker, header.base_offset)
            if done is not None:
                self._unreplicated = [*self._unreplicated, done]
        else:
            entry.add_batch(
                header.producer_epoch, _metadata(header, header.base_offset, header.last_offset, header.max_timestamp)
            )
            if header.is_transactional and entry.current_txn_first_offset < 0:
                entry.current_txn_first_offset = header.base_offset
        self._track_ongoing(pid, entry.current_txn_first_offset)
        return done

    # -- transactions ----------------------------------------------------------------------------

    def _track_ongoing(self, pid: int, first_offset: int) -> None:
        if first_offset >= 0:
            self._ongoing[pid] = first_offset
        else:
            self._ongoing.pop(pid, None)

    def first_unstable_offset(self) -> int | None:
        """The smallest first offset of the open transactions and of the completed ones whose
        marker the high watermark has not passed yet; None when there are none."""
        if not self._ongoing and not self._unreplicated:
            return None  # the usual case, asked at every read: no min() call with its keyword parsing
        first = min(self._ongoing.values(), default=None)
        for txn in self._unreplicated:
            if first is None or txn.first_offset < first:
                first = txn.first_offset
        return first

    def on_high_watermark(self, hw: int) -> None:
        """Completed transactions whose marker is below the high watermark are stable."""
        if self._unreplicated and self._unreplicated[0].last_offset < hw:
            self._unreplicated = [t for t in self._unreplicated if t.last_offset >= hw] or ()

    def last_stable_offset_after(self, txn: CompletedTxn) -> int:
        """The LSO an aborted-transaction index entry records: the first offset of another
        producer's open transaction, else the offset after the marker (Kafka's rule)."""
        others = [off for pid, off in self._ongoing.items() if pid != txn.producer_id]
        return min(others) if others else txn.last_offset + 1

    @property
    def ongoing_transactions(self) -> dict[int, int]:
        """producer id -> first offset of its open transaction (a copy)."""
        return dict(self._ongoing)

    def remove_expired(self, now_ms: int) -> int:
        """Forget producers idle for expiration_ms (none inside an open transaction). Returns how many."""
        expired = [pid for pid, e in self.producers.items() if self._expired(e, now_ms)]
        for pid in expired:
            del self.producers[pid]
            self._ongoing.pop(pid, None)
        return len(expired)

    def _expired(self, entry: ProducerEntry, now_ms: int) -> bool:
        return entry.current_txn_first_offset < 0 and now_ms - entry.last_timestamp >= self.expiration_ms

    # -- snapshots -------------------------------------------------------------------------------

    @property
    def snapshot_offsets(self) -> list[int]:
        return list(self._snapshots)

    def _path(self, offset: int) -> Path:
        return self.dir / snapshot_file_name(offset)

    def scan_snapshot_files(self, names: list[str] | None = None) -> None:
        """`names`: the dir's listing, if the caller has it."""
        self._snapshots = sorted(
            off for off in (parse_snapshot_file_name(n) for n in (os.listdir(self.dir) if names is None else names))
            if off is not None
        )

    def take_snapshot(self, offset: int, *, sync: bool) -> None:
        """Write the state of every batch below `offset` (the log end) to `<offset>.snapshot`.
        Without sync the file is left for flush_snapshots(); a crash before that leaves at worst a
        snapshot that fails its CRC and is skipped."""
        path = self._path(offset)
        if self._snapshots and self._snapshots[-1] == offset:
            # The state at an offset depends only on the log below it: the file is already right.
            if sync and offset in self._unsynced:
                fsync_file(path)
                self._synced(offset)
            return
        tmp = path.with_name(path.name + TMP_SUFFIX)
        data = encode_snapshot(self.producers.values())
        write_file(tmp, data, sync=sync)
        os.replace(tmp, path)
        if sync:
            self._synced(offset)
        elif offset not in self._unsynced:
            self._unsynced += (offset,)
        if not self._snapshots or self._snapshots[-1] < offset:
            self._snapshots.append(offset)
        elif offset not in self._snapshots:
            self._snapshots.insert(bisect_right(self._snapshots, offset), offset)

    def take_unsynced(self) -> list[Path]:
        """Paths of snapshots still to fsync (the caller syncs them, then the dir, outside the lock)."""
        paths = [self._path(o) for o in sorted(self._unsynced)]
        self._unsynced = ()
        return paths

    def _synced(self, offset: int) -> None:
        if offset in self._unsynced:
            self._unsynced = tuple(o for o in self._unsynced if o != offset)

    def delete_snapshots_below(self, offset: int) -> None:
        while self._snapshots and self._snapshots[0] < offset:
            self._delete_snapshot(self._snapshots[0])

    def delete_snapshots_above(self, offset: int) -> None:
        while self._snapshots and self._snapshots[-1] > offset:
            self._delete_snapshot(self._snapshots[-1])

    def _delete_snapshot(self, offset: int) -> None:
        self._snapshots.remove(offset)
        self._synced(offset)
        self._path(offset).unlink(missing_ok=True)

    def truncate_fully(self) -> None:
        """Forget everything: the log restarts empty."""
        self.producers.clear()
        self._ongoing.clear()
        self._unreplicated = ()
        for off in list(self._snapshots):
            self._delete_snapshot(off)

    def load(self, log_start: int, log_end: int, now_ms: int, *, at_or_below: int | None = None) -> int:
        """Reset the state to the newest readable snapshot in [log_start, log_end] (deleting those out
        of range and unreadable ones), and at or below `at_or_below` when given (newer ones stay on
        disk), and return the offset from which the caller must replay batch headers up to
        log_end: the snapshot's offset, or log_start without one."""
        self.producers.clear()
        self._ongoing.clear()
        self._unreplicated = ()
        self.delete_snapshots_above(log_end)
        self.delete_snapshots_below(log_start)
        limit = log_end if at_or_below is None else min(at_or_below, log_end)
        candidates = [o for o in self._snapshots if o <= limit]
        while candidates:
            offset = candidates.pop()
            path = os.path.join(self.dir, snapshot_file_name(offset))  # no Path made a log at a start
            try:
                data = read_small_file(path)
                if data is None:
                    raise FileNotFoundError(path)
                entries = decode_snapshot(data)
            except (CorruptSnapshotError, FileNotFoundError) as exc:
                log.warning("producer_snapshot_unreadable", path=path, error=str(exc))
                self._delete_snapshot(offset)
                continue
            for e in entries:
                if not self._expired(e, now_ms):
                    self.producers[e.producer_id] = e
                    self._track_ongoing(e.producer_id, e.current_txn_first_offset)
            return offset
        return log_start




def encode_snapshot(entries: Iterable[ProducerEntry]) -> bytes:
    parts = []
    count = 0
    for e in entries:
        count += 1
        parts.append(
            _ENTRY.pack(
                e.producer_id,
                e.epoch,
                e.last_timestamp,
                e.coordinator_epoch,
                e.current_txn_first_offset,
                len(e.batches),
            )
        )
        parts.extend(_BATCH.pack(*b) for b in e.batches)
    body = _COUNT.pack(count) + b"".join(parts)
    return _FILE_HEAD.pack(SNAPSHOT_VERSION, crc32c(body)) + body


def decode_snapshot(data: bytes) -> list[ProducerEntry]:
    if len(data) < _FILE_HEAD.size + _COUNT.size:
        raise CorruptSnapshotError(f"snapshot of {len(data)} bytes is too short")
    version, crc = _FILE_HEAD.unpack_from(data, 0)
    if version != SNAPSHOT_VERSION:
        raise CorruptSnapshotError(f"unknown snapshot version {version}")
    body = memoryview(data)[_FILE_HEAD.size :]
    actual = crc32c(body)
    if actual != crc:
        raise CorruptSnapshotError(f"snapshot CRC mismatch (stored {crc:#010x}, computed {actual:#010x})")
    try:
        (count,) = _COUNT.unpack_from(body, 0)
        pos = _COUNT.size
        entries = []
        for _ in range(count):
            pid, epoch, last_ts, coord_epoch, txn_first, n = _ENTRY.unpack_from(body, pos)
            pos += _ENTRY.size
            if not 0 <= n <= NUM_BATCHES_TO_RETAIN:
                raise CorruptSnapshotError(f"producer {pid} has {n} batches in the snapshot")
            batches = []
            for _ in range(n):
                batches.append(BatchMetadata._make(_BATCH.unpack_from(body, pos)))
                pos += _BATCH.size
            entries.append(ProducerEntry(pid, epoch, batches, last_ts, coord_epoch, txn_first))
    except struct.error as exc:
        raise CorruptSnapshotError(f"snapshot truncated: {exc}") from None
    if count < 0 or pos != len(body):
        raise CorruptSnapshotError(f"snapshot has {len(body) - pos} bytes after its {count} entries")
    return entries


__all__ = [
    "DEFAULT_PRODUCER_ID_EXPIRATION_MS",
    "INVALID_PRODUCER_EPOCH",
    "INVALID_TXN_STATE",
    "TRANSACTION_COORDINATOR_FENCED",
    "CompletedTxn",
    "InvalidTxnStateError",
    "TransactionCoordinatorFencedError",
    "NUM_BATCHES_TO_RETAIN",
    "OUT_OF_ORDER_SEQUENCE_NUMBER",
    "SNAPSHOT_SUFFIX",
    "BatchMetadata",
    "CorruptSnapshotError",
    "InvalidProducerEpochError",
    "LeaderAppend",
    "OutOfOrderSequenceError",
    "SequenceGapError",
    "sequence_gap",
    "ProducerEntry",
    "ProducerStateManager",
    "decode_snapshot",
    "encode_snapshot",
    "in_sequence",
    "last_sequence",
]
