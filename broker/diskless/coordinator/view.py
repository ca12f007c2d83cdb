"""The leader's speculative view of one diskless coordinator: the committed SQLite state plus every
record appended but not yet replicated (KIP-1164's step 3). Checks run against it and the records
an operation produces are applied to it at once, so the next operation does not wait for the
previous one's replication (pipelining). It holds what the checks need (partitions, their offsets,
the last batches of each producer); batches and files stay in SQLite.

Producer rules are a local log's (broker/storage/producer_state.py): a repeat of one of the last 5
batches is a duplicate answered with the original offset; an older epoch is
INVALID_PRODUCER_EPOCH; a newer epoch must start at sequence 0 and the same epoch must continue the
sequence, else OUT_OF_ORDER_SEQUENCE_NUMBER. An unknown producer is accepted at sequence 0, and at
any sequence if its state here expired (as a local log accepts it); its first batch at a later
sequence waits, retriably, for the ones before it. A local log gets a producer's batches in order
over one connection; a diskless partition gets them through any broker, so a later batch can
overtake the first (still in a WAL file being uploaded, or in one whose commit was lost with its
coordinator). Accepted, it would make the first's retry look out of order, which librdkafka takes
as proof the first was written: an acknowledged batch lost.

Transactions (KIP-98, as a local log's producer state): a transaction marker (a control batch the
transaction coordinator's WriteTxnMarkers had committed) below the producer's epoch is
INVALID_PRODUCER_EPOCH, below the coordinator epoch of its last marker
TRANSACTION_COORDINATOR_FENCED; it closes the producer's open transaction. A data batch below the
epoch a marker raised is INVALID_PRODUCER_EPOCH (a zombie), and a non-transactional batch of a
producer with an open transaction INVALID_TXN_STATE. The view keeps each transactional producer's
state (txns) so the last stable offset ListOffsets answers includes the pending records.

Leader epochs (KIP-253's gates on a diskless partition, which has no leader log): every batch
carries the epoch of the partition in the image of the broker that took it; the view keeps where
each epoch starts (Kafka's leader-epoch cache) and refuses a batch of an epoch older than the
partition's (FENCED_LEADER_EPOCH, retried by the producer through a broker with newer metadata),
as a leader at a newer epoch refuses to be written in an older one. The leader also starts the
epoch its image shows (start_epochs) without waiting for a batch of it, so an epoch a count change
ended ends even on a partition that takes no more writes (a marked one). An epoch's end, once
the partition is past it, is therefore final: the OffsetForLeaderEpoch answers of the gates.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from broker.diskless.batches import BatchResult, ProducerInfo
from broker.diskless.coordinator.state import PRODUCER_BATCHES_KEPT, DisklessState, ProducerBatch, TxnProducer
from broker.storage.leader_epoch import epoch_end_in
from broker.storage.producer_state import sequence_gap
from protocol.errors import Errors
from protocol.generated.metadata_records.diskless_file_committed_record import DisklessFileCommittedRecord
from protocol.generated.metadata_records.diskless_leader_epoch_record import DisklessLeaderEpochRecord
from protocol.generated.metadata_records.diskless_partition_created_record import DisklessPartitionCreatedRecord
from protocol.generated.metadata_records.diskless_partition_deleted_record import DisklessPartitionDeletedRecord
from protocol.generated.metadata_records.diskless_producers_expired_record import DisklessProducersExpiredRecord
from protocol.generated.metadata_records.diskless_records_deleted_record import DisklessRecordsDeletedRecord
from protocol.generated.metadata_records.diskless_topic_deleted_record import DisklessTopicDeletedRecord

INT32_MAX = 2**31 - 1
LOG_APPEND_TIME = 1


@dataclass(slots=True)
class PartitionView:
    name: str
    log_start_offset: int
    high_watermark: int
    producers: dict[int, deque[ProducerBatch]] = field(default_factory=dict)
    txns: dict[int, TxnProducer] = field(default_factory=dict)
    epochs: list[tuple[int, int]] = field(default_factory=list)  # (leader epoch, start offset), oldest first
    expired: set[int] = field(default_factory=set, compare=False)  # producers expired since this view loaded
    incarnation: int = -2  # which creation of the index (DisklessPartitionCreatedRecord); -2: not recorded

    @property
    def leader_epoch(self) -> int:
        """The partition's epoch here: the newest started, -1 before any."""
        return self.epochs[-1][0] if self.epochs else -1

    def start_epoch(self, epoch: int, start: int) -> None:
        """`epoch` starts at `start` unless it is not newer than the last (the state's
        _start_epoch: an epoch without records is dropped when the next starts where it did)."""
        if epoch <= self.leader_epoch:
            return
        self.epochs = [e for e in self.epochs if e[1] < start]
        self.epochs.append((epoch, start))

    def epoch_end(self, epoch: int) -> tuple[int, int]:
        """OffsetForLeaderEpoch (LeaderEpochCache.end_offset_for's rules): (largest epoch <=
        `epoch`, the start of the epoch after it, or the high watermark for the current epoch);
        an epoch older than every entry answers (epoch, the first entry's start); a newer one, or
        no entry, (-1, -1)."""
        if epoch < 0:
            return -1, -1
        return epoch_end_in(self.epochs, epoch, self.high_watermark)

    def producer_infos(self) -> list[ProducerInfo]:
        """Every producer kept for the partition (its last batch, its transaction), by id."""
        out = []
        for pid in sorted(set(self.producers) | set(self.txns)):
            batches = self.producers.get(pid)
            last = batches[-1] if batches else None
            txn = self.txns.get(pid)
            epoch = max(last.producer_epoch if last else -1, txn.producer_epoch if txn else -1)
            out.append(ProducerInfo(pid, epoch, last.last_sequence if last else -1, last.max_timestamp if last else -1,
                                    txn.coordinator_epoch if txn else -1, txn.first_offset if txn else -1))
        return out

    def last_stable_offset(self) -> int:
        """The first offset of the oldest open transaction, else the high watermark."""
        return min((t.first_offset for t in self.txns.values() if t.first_offset >= 0), default=self.high_watermark)

    def note_batch(self, b: Any, base: int, last: int) -> None:
        """Producer and transaction state after batch `b` was given offsets [base, last] (the
        same rules as DisklessState's apply)."""
        if b.producer_id < 0:
            return
        txn = self.txns.get(b.producer_id)
        if b.control_type >= 0:
            epoch = b.producer_epoch if txn is None else max(txn.producer_epoch, b.producer_epoch)
            self.txns[b.producer_id] = TxnProducer(epoch, b.coordinator_epoch, -1)
            return
        self.producers.setdefault(b.producer_id, deque(maxlen=PRODUCER_BATCHES_KEPT)).append(
            ProducerBatch(b.producer_epoch, b.base_sequence, b.last_sequence, base, last, b.batch_max_timestamp))
        if b.is_transactional:
            if txn is None:
                self.txns[b.producer_id] = TxnProducer(b.producer_epoch, -1, base)
            else:
                txn.producer_epoch = max(txn.producer_epoch, b.producer_epoch)
                if txn.first_offset < 0:
                    txn.first_offset = base


def _next_seq(seq: int) -> int:
    return 0 if seq == INT32_MAX else seq + 1


class CoordinatorView:
    def __init__(self) -> None:
        self.partitions: dict[tuple[UUID, int], PartitionView] = {}

    @classmethod
    def from_state(cls, state: DisklessState) -> CoordinatorView:
        """Built from SQLite (blocking: run in an executor)."""
        view = cls()
        for key, (name, lso, hw) in state.partitions().items():
            view.partitions[key] = PartitionView(name, lso, hw)
        for (tid, part, pid), batches in state.producers().items():
            pv = view.partitions.get((tid, part))
            if pv is not None:
                pv.producers[pid] = deque(batches, maxlen=PRODUCER_BATCHES_KEPT)
        for (tid, part, pid), txn in state.txn_producers().items():
            pv = view.partitions.get((tid, part))
            if pv is not None:
                pv.txns[pid] = txn
        for key, epochs in state.leader_epochs().items():
            pv = view.partitions.get(key)
            if pv is not None:
                pv.epochs = epochs
        for key, incarnation in state.incarnations().items():
            pv = view.partitions.get(key)
            if pv is not None:
                pv.incarnation = incarnation
        return view

    # ------------------------------------------------------------------ applying records
    def apply(self, record: Any) -> None:
        if isinstance(record, DisklessPartitionCreatedRecord):
            self.partitions.setdefault((record.topic_id, record.partition_index),
                                       PartitionView(record.name, 0, 0, incarnation=record.incarnation))
        elif isinstance(record, DisklessFileCommittedRecord):
            for t in record.topics:
                for p in t.partitions:
                    pv = self.partitions.get((t.topic_id, p.partition_index))
                    if pv is None:
                        continue
                    for b in p.batches:
                        pv.high_watermark = max(pv.high_watermark, b.assigned_last_offset + 1)
                        pv.note_batch(b, b.assigned_base_offset, b.assigned_last_offset)
                        if b.leader_epoch >= 0:
                            pv.start_epoch(b.leader_epoch, b.assigned_base_offset)
        elif isinstance(record, DisklessLeaderEpochRecord):
            pv = self.partitions.get((record.topic_id, record.partition_index))
            if pv is not None:
                pv.start_epoch(record.leader_epoch, record.start_offset)
        elif isinstance(record, DisklessRecordsDeletedRecord):
            pv = self.partitions.get((record.topic_id, record.partition_index))
            if pv is not None:
                pv.log_start_offset = max(pv.log_start_offset, record.new_log_start_offset)
        elif isinstance(record, DisklessPartitionDeletedRecord):
            self.partitions.pop((record.topic_id, record.partition_index), None)
        elif isinstance(record, DisklessTopicDeletedRecord):
            for key in [k for k in self.partitions if k[0] == record.topic_id]:
                del self.partitions[key]
        elif isinstance(record, DisklessProducersExpiredRecord):
            pv = self.partitions.get((record.topic_id, record.partition_index))
            if pv is not None:
                pv.expired.update(record.producer_ids)
                for pid in record.producer_ids:
                    pv.producers.pop(pid, None)
                    txn = pv.txns.get(pid)
                    if txn is not None and txn.first_offset < 0:
                        del pv.txns[pid]

    # ------------------------------------------------------------------ operations
    def create_partitions(self, topics: list[Any], owns: Callable[[UUID, int], bool] = lambda tid, i: True,
                          incarnation: Callable[[UUID, int], int] = lambda tid, i: -2,
                          ) -> list[DisklessPartitionCreatedRecord]:
        """Records for the partitions of `topics` (TopicId, Name, NumPartitions) that this
        coordinator `owns` and does not know yet, with their `incarnation`."""
        records = []
        for t in topics:
            for i in range(t.num_partitions):
                if (t.topic_id, i) not in self.partitions and owns(t.topic_id, i):
                    records.append(DisklessPartitionCreatedRecord(topic_id=t.topic_id, name=t.name, partition_index=i,
                                                                  incarnation=incarnation(t.topic_id, i)))
        for r in records:
            self.apply(r)
        return records

    @staticmethod
    def _check_marker(pv: PartitionView, b: Any) -> BatchResult | None:
        """None: append the marker. Otherwise the error (Kafka's checks of a marker's epochs)."""
        batches = pv.producers.get(b.producer_id)
        txn = pv.txns.get(b.producer_id)
        epoch = max(batches[-1].producer_epoch if batches else -1, txn.producer_epoch if txn is not None else -1)
        if b.producer_epoch < epoch:
            return BatchResult(Errors.INVALID_PRODUCER_EPOCH,
                               f"marker of producer {b.producer_id} epoch {b.producer_epoch} is older than {epoch}")
        if txn is not None and b.coordinator_epoch < txn.coordinator_epoch:
            return BatchResult(Errors.TRANSACTION_COORDINATOR_FENCED,
                               f"marker of coordinator epoch {b.coordinator_epoch}, {txn.coordinator_epoch} seen")
        return None

    def _check_producer(self, pv: PartitionView, b: Any) -> BatchResult | None:
        """None: append the batch. Otherwise the answer without appending (error or duplicate)."""
        if b.control_type >= 0:
            return self._check_marker(pv, b)
        txn = pv.txns.get(b.producer_id)
        if txn is not None and b.producer_epoch < txn.producer_epoch:
            return BatchResult(Errors.INVALID_PRODUCER_EPOCH,
                               f"producer {b.producer_id} epoch {b.producer_epoch} is older than {txn.producer_epoch}")
        batches = pv.producers.get(b.producer_id)
        if not batches:
            if b.base_sequence > 0 and b.producer_id not in pv.expired:  # overtaken: see the module's text
                return BatchResult(Errors.NOT_LEADER_OR_FOLLOWER,
                                   f"producer {b.producer_id}: sequence {b.base_sequence} is its first batch here: "
                                   f"the batches before it have not arrived; retry")
            return None
        last = batches[-1]
        if b.producer_epoch < last.producer_epoch:
            return BatchResult(Errors.INVALID_PRODUCER_EPOCH,
                               f"producer {b.producer_id} epoch {b.producer_epoch} is older than {last.producer_epoch}")
        if b.producer_epoch == last.producer_epoch:
            for cached in batches:
                if (cached.producer_epoch, cached.base_sequence, cached.last_sequence) == (
                        b.producer_epoch, b.base_sequence, b.last_sequence):
                    return BatchResult(0, None, cached.base_offset, -1, pv.log_start_offset, duplicate=True)
            if sequence_gap(last.last_sequence, b.base_sequence):
                # its predecessor may still come, through another broker (producer_state.SequenceGapError)
                return BatchResult(Errors.NOT_LEADER_OR_FOLLOWER,
                                   f"producer {b.producer_id}: sequence {b.base_sequence} before "
                                   f"{_next_seq(last.last_sequence)}: the batches between have not arrived; retry")
            if b.base_sequence != _next_seq(last.last_sequence):
                return BatchResult(Errors.OUT_OF_ORDER_SEQUENCE_NUMBER,
                                   f"producer {b.producer_id}: sequence {b.base_sequence}, expected "
                                   f"{_next_seq(last.last_sequence)}")
        elif b.base_sequence != 0:
            return BatchResult(Errors.OUT_OF_ORDER_SEQUENCE_NUMBER,
                               f"producer {b.producer_id}: a new epoch {b.producer_epoch} must start at sequence 0")
        return self._check_txn_state(txn, b)

    @staticmethod
    def _check_txn_state(txn: TxnProducer | None, b: Any) -> BatchResult | None:
        if not b.is_transactional and txn is not None and txn.first_offset >= 0:
            return BatchResult(Errors.INVALID_TXN_STATE,
                               f"producer {b.producer_id} wrote a non-transactional batch in its open transaction")
        return None

    def commit_file(self, req: Any, uploader: int, now_ms: int) -> tuple[list[BatchResult], DisklessFileCommittedRecord | None]:
        """Check and assign offsets to the batches of a DisklessCommitFile request. Returns one
        result per batch (request order) and the record to append (None: nothing accepted)."""
        R = DisklessFileCommittedRecord
        results: list[BatchResult] = []
        topics: dict[UUID, dict[int, list[Any]]] = {}
        for b in req.batches:
            pv = self.partitions.get((b.topic_id, b.partition_index))
            count = b.last_offset - b.base_offset + 1
            if pv is None:
                results.append(BatchResult(Errors.UNKNOWN_TOPIC_OR_PARTITION,
                                           f"partition {b.topic_id}-{b.partition_index} is not on this coordinator"))
                continue
            if count < 1 or b.size <= 0 or b.byte_offset < 0 or b.byte_offset + b.size > req.file_size:
                results.append(BatchResult(Errors.CORRUPT_MESSAGE, "batch offsets or byte range are invalid"))
                continue
            if b.control_type >= 0 and (b.producer_id < 0 or count != 1):
                results.append(BatchResult(Errors.CORRUPT_MESSAGE, "a transaction marker is one record of a producer"))
                continue
            if 0 <= b.leader_epoch < pv.leader_epoch:
                # taken by a broker whose image had not reached the partition's epoch yet (KIP-253:
                # e.g. hashed over a partition count that changed): a newer epoch ended that one
                results.append(BatchResult(Errors.FENCED_LEADER_EPOCH,
                                           f"batch of leader epoch {b.leader_epoch}; the partition is at "
                                           f"{pv.leader_epoch}"))
                continue
            if b.producer_id >= 0:
                answer = self._check_producer(pv, b)
                if answer is not None:
                    results.append(answer)
                    continue
            base = pv.high_watermark
            append_time = now_ms if b.timestamp_type == LOG_APPEND_TIME else -1
            committed = R.DisklessCommittedBatch(
                magic=b.magic, byte_offset=b.byte_offset, byte_size=b.size, assigned_base_offset=base,
                assigned_last_offset=base + count - 1, log_append_timestamp=now_ms,
                batch_max_timestamp=b.batch_max_timestamp, timestamp_type=b.timestamp_type,
                producer_id=b.producer_id, producer_epoch=b.producer_epoch, base_sequence=b.base_sequence,
                last_sequence=b.last_sequence, is_transactional=b.is_transactional, control_type=b.control_type,
                coordinator_epoch=b.coordinator_epoch, leader_epoch=b.leader_epoch)
            topics.setdefault(b.topic_id, {}).setdefault(b.partition_index, []).append(committed)
            # the view moves now (pending), so the next batch of the same partition follows this one
            pv.high_watermark = base + count
            pv.note_batch(b, base, base + count - 1)
            if b.leader_epoch >= 0:
                pv.start_epoch(b.leader_epoch, base)
            results.append(BatchResult(0, None, base, append_time, pv.log_start_offset))
        if not topics:
            return results, None
        record = R(object_key=req.object_key, object_format=req.object_format, file_size=req.file_size,
                   uploader_broker_id=uploader, owner_ids=list(req.owner_ids),
                   topics=[R.DisklessCommittedTopic(topic_id=tid, partitions=[
                       R.DisklessCommittedPartition(partition_index=pi, batches=bs) for pi, bs in parts.items()])
                       for tid, parts in topics.items()])
        return results, record

    def start_epochs(self, epochs: dict[tuple[UUID, int], int]) -> list[DisklessLeaderEpochRecord]:
        """Records starting, at its high watermark, the epoch `epochs` (the leader's image) names
        for each partition this view has at an older one; applied to the view."""
        records = []
        for key, epoch in epochs.items():
            pv = self.partitions.get(key)
            if pv is not None and epoch > pv.leader_epoch:
                records.append(DisklessLeaderEpochRecord(topic_id=key[0], partition_index=key[1], leader_epoch=epoch,
                                                         start_offset=pv.high_watermark))
        for r in records:
            self.apply(r)
        return records

    def delete_records(self, topic_id: UUID, partition: int, offset: int) -> tuple[int, int, Any]:
        """(error, new low watermark, record or None). offset -1 means the high watermark."""
        pv = self.partitions.get((topic_id, partition))
        if pv is None:
            return Errors.UNKNOWN_TOPIC_OR_PARTITION, -1, None
        if offset == -1:
            offset = pv.high_watermark
        if offset < 0 or offset > pv.high_watermark:
            return Errors.OFFSET_OUT_OF_RANGE, -1, None
        if offset <= pv.log_start_offset:
            return 0, pv.log_start_offset, None
        record = DisklessRecordsDeletedRecord(topic_id=topic_id, partition_index=partition, new_log_start_offset=offset)
        self.apply(record)
        return 0, offset, record

    def expire_producers(self, now_ms: int, expiration_ms: int) -> list[DisklessProducersExpiredRecord]:
        """Records forgetting, per partition, the producers idle for `expiration_ms` (by their last
        batch's max timestamp, as Kafka's ProducerStateManager; one with markers only counts as
        idle) and without an open transaction; applied to the view."""
        records = []
        for (tid, part), pv in self.partitions.items():
            expired = []
            for pid in set(pv.producers) | set(pv.txns):
                txn = pv.txns.get(pid)
                if txn is not None and txn.first_offset >= 0:
                    continue
                batches = pv.producers.get(pid)
                last = batches[-1].max_timestamp if batches else -1
                if now_ms - last >= expiration_ms:
                    expired.append(pid)
            if expired:
                records.append(DisklessProducersExpiredRecord(topic_id=tid, partition_index=part,
                                                              producer_ids=sorted(expired)))
        for r in records:
            self.apply(r)
        return records

    def delete_partition(self, topic_id: UUID, partition: int) -> DisklessPartitionDeletedRecord | None:
        if (topic_id, partition) not in self.partitions:
            return None
        record = DisklessPartitionDeletedRecord(topic_id=topic_id, partition_index=partition)
        self.apply(record)
        return record

    def delete_topic(self, topic_id: UUID) -> DisklessTopicDeletedRecord | None:
        if not any(k[0] == topic_id for k in self.partitions):
            return None
        record = DisklessTopicDeletedRecord(topic_id=topic_id)
        self.apply(record)
        return record
