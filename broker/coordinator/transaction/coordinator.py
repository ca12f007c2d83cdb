"""The transaction coordinator (Kafka's TransactionCoordinator + TransactionStateManager, on one loop).

A transactional id lives in partition abs(hash(id)) % N of __transaction_state, and that
partition's leader coordinates it; the coordinator epoch is the partition's leader epoch. When
this broker becomes a partition's leader the partition is loaded (its log scanned in an executor,
last record per id wins) and answers COORDINATOR_LOAD_IN_PROGRESS until then; transactions found
in PrepareCommit/PrepareAbort get their markers sent and are completed. When leadership goes the
partition is unloaded: its ids answer NOT_COORDINATOR, marker sending for them stops (the new
coordinator resends).

Every state change is prepared on the id's metadata (which holds it as `pending`, so concurrent
requests answer CONCURRENT_TRANSACTIONS), appended to the partition leader's log before any
await, and applied once the high watermark passes it. EndTxn answers once PrepareCommit /
PrepareAbort is replicated; the markers (markers.py) and the CompleteCommit/CompleteAbort record
follow in the background. Ongoing transactions older than their timeout are aborted with an epoch
bump that fences their producer; ids idle past transactional.id.expiration.ms are forgotten.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

import structlog

from broker.coordinator import wall_clock_ms
from broker.coordinator.group.records import OFFSETS_TOPIC, partition_for
from broker.coordinator.internal_topic import create_internal_topic
from broker.coordinator.partitioned import (
    CoordinatorPartition,
    PartitionedCoordinator,
    log_batches,
    state_write_error,
)
from broker.coordinator.transaction.config import TransactionCoordinatorConfig
from broker.coordinator.transaction.metadata import (
    NO_PRODUCER_EPOCH,
    TransactionError,
    TransactionMetadata,
    is_epoch_exhausted,
)
from broker.coordinator.transaction.records import (
    TRANSACTION_STATE_TOPIC,
    TransactionLogValue,
    TransactionState,
    TxnRecordFormatError,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
)
from broker.producer_ids import ProducerIdsUnavailable
from protocol.errors import Errors

if TYPE_CHECKING:
    from broker.coordinator.group.coordinator import GroupCoordinator
    from broker.coordinator.transaction.markers import TxnMarkerSender
    from broker.ports import Forwarder, LocalReplicas, MetadataView
    from broker.producer_ids import ProducerIdManager
    from broker.storage.log import Log

log = structlog.get_logger(__name__)

S = TransactionState
TopicPartition = tuple[str, int]
COMPLETE_RETRY_BACKOFF_S = 0.1


class _StatePartition(CoordinatorPartition):
    """One __transaction_state partition this broker leads (its epoch is the coordinator epoch)."""

    def __init__(self, index: int, epoch: int) -> None:
        super().__init__(index, epoch)
        self.txns: dict[str, TransactionMetadata] = {}


def read_state_partition(lg: Log, max_bytes: int) -> tuple[dict[str, TransactionLogValue], int]:
    """Scan a __transaction_state log from start to end (runs in an executor): the latest value per
    transactional id (deleted ids absent) and the number of records read."""
    found: dict[str, TransactionLogValue | None] = {}
    count = 0
    for b in log_batches(lg, max_bytes):
        if b.header.is_control:
            continue
        for r in b.records:
            count += 1
            try:
                tid = decode_key(r.key)
                found[tid] = None if r.value is None else decode_value(r.value)
            except TxnRecordFormatError as e:
                log.warning("txn_state_record_skipped", offset=r.offset, error=str(e))
    return {tid: v for tid, v in found.items() if v is not None}, count


class TransactionCoordinator(PartitionedCoordinator[_StatePartition]):
    topic = TRANSACTION_STATE_TOPIC
    event = "txn"
    reload_on_new_epoch = True

    def __init__(self, config: TransactionCoordinatorConfig, replicas: LocalReplicas, metadata: MetadataView,
                 forward: Forwarder, producer_ids: ProducerIdManager, markers: TxnMarkerSender,
                 group_coordinator: GroupCoordinator) -> None:
        """Registers as a leadership listener of `replicas` and loads what it already leads.
        `forward` creates __transaction_state through the controller; `producer_ids` hands out
        new producer ids; `markers` writes a transaction's markers on its partitions;
        `group_coordinator` says how many __consumer_offsets partitions there are before the
        image has the topic (AddOffsetsToTxn)."""
        self.config = config
        self._forward = forward
        self.producer_ids = producer_ids
        self.markers = markers
        self.group_coordinator = group_coordinator
        super().__init__(replicas, metadata, config.state_log_num_partitions, config.state_log_load_buffer_size,
                         config.write_timeout_ms)
        self._every(self.config.abort_timed_out_interval_ms, self.abort_timed_out_transactions,
                    "txn_timeout_check_failed")
        self._every(self.config.remove_expired_interval_ms, self.remove_expired_transactional_ids,
                    "txn_expiration_failed")
        self._watch_leadership()

    def shutdown(self) -> None:
        super().shutdown()
        self._loop.create_task(self.markers.close())

    # ------------------------------------------------------------------ partitions
    def partition_for(self, transactional_id: str) -> int:
        return partition_for(transactional_id, self.num_partitions())

    def _new_partition(self, index: int, epoch: int) -> _StatePartition:
        return _StatePartition(index, epoch)

    _read_partition = staticmethod(read_state_partition)

    def _apply_loaded(self, tp: _StatePartition, loaded: tuple[dict[str, TransactionLogValue], int],
                      started: float) -> None:
        values, records = loaded
        for tid, v in values.items():
            tp.txns[tid] = TransactionMetadata.from_value(tid, v)
        tp.loading = False
        unfinished = [m for m in tp.txns.values() if m.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT)]
        for meta in unfinished:
            self._start_completion(tp, meta)
        log.info("txn_partition_loaded", partition=tp.index, coordinator_epoch=tp.epoch,
                 transactions=len(tp.txns), records=records, completing=len(unfinished),
                 ms=round((time.monotonic() - started) * 1000))

    def _forget(self, tp: _StatePartition) -> None:
        tp.txns.clear()

    def _status(self, transactional_id: str | None) -> tuple[int, _StatePartition | None]:
        if not transactional_id:
            return Errors.INVALID_REQUEST, None
        return self._partition_status(transactional_id)

    def is_coordinator_for(self, transactional_id: str) -> bool:
        return self._status(transactional_id)[0] == 0

    def transactions(self) -> list[TransactionMetadata]:
        return [m for tp in self._partitions.values() if not tp.loading for m in tp.txns.values()]

    # ------------------------------------------------------------------ admin reads (KIP-664)
    def describe(self, transactional_id: str) -> tuple[int, TransactionMetadata | None]:
        """(0, its state) for DescribeTransactions, else the error to answer with."""
        code, tp = self._status(transactional_id)
        if tp is None:
            return code, None
        meta = tp.txns.get(transactional_id)
        if meta is None or meta.state == TransactionState.DEAD:
            return Errors.TRANSACTIONAL_ID_NOT_FOUND, None
        return 0, meta

    def listing(self) -> tuple[int, list[TransactionMetadata]]:
        """Every transaction this broker coordinates but the Dead ones, for ListTransactions;
        COORDINATOR_LOAD_IN_PROGRESS while a state partition loads (as Kafka answers)."""
        if self.is_loading():
            return Errors.COORDINATOR_LOAD_IN_PROGRESS, []
        return 0, [m for m in self.transactions() if m.state != TransactionState.DEAD]

    # ------------------------------------------------------------------ writes
    async def _write(self, tp: _StatePartition, meta: TransactionMetadata, target: TransactionLogValue) -> int:
        """Append `target` for `meta` (before any await) and apply it once replicated. Returns the
        error (Kafka's mapping for transaction log appends); `meta` keeps its state on error."""
        err = self._append_and_wait(tp, [(meta.transactional_id, target)])
        code = await err
        if code == 0 and not (self._owns(tp) and tp.txns.get(meta.transactional_id) is meta):
            code = Errors.NOT_COORDINATOR  # unloaded (or reloaded) while writing: not ours to change
        if code:
            meta.abandon()
            log.info("txn_state_write_failed", transactional_id=meta.transactional_id,
                     target=target.state.display, error_code=code)
            return code
        meta.complete(target)
        return 0

    def _append_and_wait(self, tp: _StatePartition,
                         records: list[tuple[str, TransactionLogValue | None]]) -> asyncio.Future:
        """One batch of (transactional id, value or None for a tombstone) appended now; the
        future resolves to the error (Kafka's mapping for transaction log appends) once it is
        replicated (0) or cannot be."""
        _, _, done = self._append(tp, [(encode_key(tid), None if v is None else encode_value(v)) for tid, v in records])
        mapped = self._loop.create_future()

        def settle(f: asyncio.Future) -> None:
            if not mapped.done():
                mapped.set_result(state_write_error(f.result()))

        done.add_done_callback(settle)
        return mapped

    # ------------------------------------------------------------------ InitProducerId
    async def _new_producer_id(self) -> int:
        return await self.producer_ids.generate()

    async def init_producer_id(self, transactional_id: str, timeout_ms: int,
                               expected: tuple[int, int] | None) -> tuple[int, int, int]:
        """(error, producer id, epoch). `expected`: the producer's current (id, epoch) (v3+, KIP-360)."""
        if timeout_ms <= 0 or timeout_ms > self.config.max_timeout_ms:
            return Errors.INVALID_TRANSACTION_TIMEOUT, -1, -1
        err, tp = self._status(transactional_id)
        if err:
            return err, -1, -1
        assert tp is not None
        meta = tp.txns.get(transactional_id)
        if meta is None:
            try:
                pid = await self._new_producer_id()
            except ProducerIdsUnavailable as e:
                return e.error_code, -1, -1
            err, tp = self._status(transactional_id)
            if err:
                return err, -1, -1
            assert tp is not None
            meta = tp.txns.get(transactional_id)
            if meta is None:
                meta = tp.txns[transactional_id] = TransactionMetadata(
                    transactional_id, pid, -1, -1, NO_PRODUCER_EPOCH, NO_PRODUCER_EPOCH, timeout_ms, S.EMPTY,
                    last_update_ms=wall_clock_ms())
        if meta.pending is not None:
            return Errors.CONCURRENT_TRANSACTIONS, -1, -1
        if expected is not None and not _valid_producer_id(meta, expected):
            return Errors.PRODUCER_FENCED, -1, -1
        now = wall_clock_ms()
        if meta.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
            return Errors.CONCURRENT_TRANSACTIONS, -1, -1
        if meta.state is S.ONGOING:
            # Abort it with a bumped epoch first; the client retries (CONCURRENT_TRANSACTIONS) and
            # gets another bump once the abort is complete. A producer bumping its own epoch
            # (KIP-360) keeps the right to that retry: its epoch is recorded as the last one.
            own = expected is not None and expected == (meta.producer_id, meta.producer_epoch)
            self._fence_and_abort(tp, meta, "init_producer_id", keep_last_epoch=own)
            return Errors.CONCURRENT_TRANSACTIONS, -1, -1
        if meta.state not in (S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT):
            return Errors.CONCURRENT_TRANSACTIONS, -1, -1
        try:
            if is_epoch_exhausted(meta.producer_epoch):
                meta.pending = S.EMPTY  # hold the id while a new producer id is fetched
                try:
                    new_pid = await self._new_producer_id()
                finally:
                    meta.pending = None
                if not self._owns(tp) or tp.txns.get(transactional_id) is not meta:
                    return Errors.NOT_COORDINATOR, -1, -1
                target = meta.prepare_producer_id_rotation(new_pid, timeout_ms, now, expected is not None)
            else:
                target = meta.prepare_increment_epoch(timeout_ms, None if expected is None else expected[1], now)
        except TransactionError as e:
            return e.error_code, -1, -1
        except ProducerIdsUnavailable as e:
            return e.error_code, -1, -1
        err = await self._write(tp, meta, target)
        if err:
            return err, -1, -1
        log.info("txn_producer_initialized", transactional_id=transactional_id, producer_id=meta.producer_id,
                 epoch=meta.producer_epoch)
        return 0, meta.producer_id, meta.producer_epoch

    # ------------------------------------------------------------------ AddPartitions / AddOffsets
    def _check_producer(self, transactional_id: str, producer_id: int,
                        producer_epoch: int) -> tuple[int, _StatePartition | None, TransactionMetadata | None]:
        err, tp = self._status(transactional_id)
        if err:
            return err, None, None
        assert tp is not None
        meta = tp.txns.get(transactional_id)
        if meta is None or meta.producer_id != producer_id:
            return Errors.INVALID_PRODUCER_ID_MAPPING, None, None
        if meta.producer_epoch != producer_epoch:
            return Errors.PRODUCER_FENCED, None, None
        if meta.pending is not None or meta.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
            return Errors.CONCURRENT_TRANSACTIONS, None, None
        return 0, tp, meta

    async def add_partitions(self, transactional_id: str, producer_id: int, producer_epoch: int,
                             partitions: set[TopicPartition]) -> int:
        err, tp, meta = self._check_producer(transactional_id, producer_id, producer_epoch)
        if err:
            return err
        assert tp is not None and meta is not None
        if meta.state is S.ONGOING and partitions <= meta.partitions:
            return 0
        try:
            target = meta.prepare_add_partitions(partitions, wall_clock_ms())
        except TransactionError as e:
            return e.error_code
        return await self._write(tp, meta, target)

    async def add_offsets(self, transactional_id: str, producer_id: int, producer_epoch: int, group_id: str) -> int:
        offsets = self.metadata.image.topic(OFFSETS_TOPIC)
        n = len(offsets.partitions) if offsets is not None and offsets.partitions else None
        if n is None:
            n = self.group_coordinator.num_partitions()
        return await self.add_partitions(transactional_id, producer_id, producer_epoch,
                                         {(OFFSETS_TOPIC, partition_for(group_id, n))})

    # ------------------------------------------------------------------ EndTxn
    async def end_transaction(self, transactional_id: str, producer_id: int, producer_epoch: int,
                              commit: bool) -> int:
        err, tp = self._status(transactional_id)
        if err:
            return err
        assert tp is not None
        meta = tp.txns.get(transactional_id)
        if meta is None or meta.producer_id != producer_id:
            return Errors.INVALID_PRODUCER_ID_MAPPING
        if meta.producer_epoch != producer_epoch:
            return Errors.PRODUCER_FENCED
        if meta.pending is not None:
            return Errors.CONCURRENT_TRANSACTIONS
        state = meta.state
        if state is S.ONGOING:
            try:
                target = meta.prepare_end(commit, wall_clock_ms())
            except TransactionError as e:
                return e.error_code
            err = await self._write(tp, meta, target)
            if err:
                return err
            log.debug("txn_prepared", transactional_id=transactional_id, commit=commit,
                      partitions=len(meta.partitions))
            self._start_completion(tp, meta)
            return 0
        if state is S.COMPLETE_COMMIT:
            return 0 if commit else Errors.INVALID_TXN_STATE
        if state is S.COMPLETE_ABORT:
            return 0 if not commit else Errors.INVALID_TXN_STATE
        if state is S.PREPARE_COMMIT:
            return Errors.CONCURRENT_TRANSACTIONS if commit else Errors.INVALID_TXN_STATE
        if state is S.PREPARE_ABORT:
            return Errors.CONCURRENT_TRANSACTIONS if not commit else Errors.INVALID_TXN_STATE
        return Errors.INVALID_TXN_STATE  # Empty: nothing to end

    def _fence_and_abort(self, tp: _StatePartition, meta: TransactionMetadata, why: str,
                         keep_last_epoch: bool = False) -> None:
        """Abort an ongoing transaction with a bumped epoch (the producer is fenced). Prepared at
        once (requests meanwhile answer CONCURRENT_TRANSACTIONS), written in the background."""
        if not self._owns(tp) or meta.pending is not None or meta.state is not S.ONGOING:
            return
        epoch = meta.producer_epoch
        fence_epoch = epoch if is_epoch_exhausted(epoch) else epoch + 1
        try:
            target = meta.prepare_end(False, wall_clock_ms(), fence_epoch=fence_epoch,
                                      last_epoch=epoch if keep_last_epoch else None)
        except TransactionError:
            return

        async def write() -> None:
            if await self._write(tp, meta, target):
                return
            log.info("txn_aborted_by_coordinator", transactional_id=meta.transactional_id, reason=why,
                     producer_id=meta.producer_id, fenced_epoch=epoch, epoch=meta.producer_epoch)
            self._start_completion(tp, meta)

        self._spawn(write())

    # ------------------------------------------------------------------ completion
    def _start_completion(self, tp: _StatePartition, meta: TransactionMetadata) -> None:
        self._spawn(self._complete(tp, meta))

    async def _complete(self, tp: _StatePartition, meta: TransactionMetadata) -> None:
        """Markers on every partition, then CompleteCommit/CompleteAbort."""
        commit = meta.state is S.PREPARE_COMMIT
        pid, epoch = meta.producer_id, meta.producer_epoch

        def still() -> bool:
            return self._owns(tp) and tp.txns.get(meta.transactional_id) is meta and meta.state in (
                S.PREPARE_COMMIT, S.PREPARE_ABORT) and meta.producer_epoch == epoch

        ok = await self.markers.write(pid, epoch, commit, set(meta.partitions), tp.epoch, still)
        if not ok:
            return
        while still():
            try:
                target = meta.prepare_complete(wall_clock_ms())
            except TransactionError:
                await asyncio.sleep(COMPLETE_RETRY_BACKOFF_S)
                continue
            err = await self._write(tp, meta, target)
            if err == 0:
                log.debug("txn_completed", transactional_id=meta.transactional_id, commit=commit)
                return
            if err == Errors.NOT_COORDINATOR:
                return
            await asyncio.sleep(COMPLETE_RETRY_BACKOFF_S)

    # ------------------------------------------------------------------ timeouts
    def abort_timed_out_transactions(self, now_ms: int | None = None) -> int:
        now = now_ms if now_ms is not None else wall_clock_ms()
        count = 0
        for tp in list(self._partitions.values()):
            if tp.loading:
                continue
            for meta in list(tp.txns.values()):
                if meta.state is S.ONGOING and meta.pending is None and meta.start_ms + meta.timeout_ms < now:
                    count += 1
                    self._fence_and_abort(tp, meta, "timeout")
        return count

    # ------------------------------------------------------------------ expiration
    def remove_expired_transactional_ids(self, now_ms: int | None = None) -> int:
        """Kafka's transactional id expiration: an id without a transaction (Empty,
        CompleteCommit, CompleteAbort) and unchanged for transactional.id.expiration.ms is
        forgotten (a tombstone per partition batch); its next InitProducerId gets a new producer id."""
        now = now_ms if now_ms is not None else wall_clock_ms()
        horizon = now - self.config.transactional_id_expiration_ms
        count = 0
        for tp in list(self._partitions.values()):
            if tp.loading:
                continue
            expired = [m for m in tp.txns.values() if m.pending is None and m.last_update_ms <= horizon
                       and m.state in (S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT)]
            if expired:
                count += len(expired)
                for m in expired:
                    m.pending = S.DEAD  # requests for it answer CONCURRENT_TRANSACTIONS meanwhile
                self._spawn(self._remove(tp, expired))
        return count

    async def _remove(self, tp: _StatePartition, metas: list[TransactionMetadata]) -> None:
        code = await self._append_and_wait(tp, [(m.transactional_id, None) for m in metas])
        for m in metas:
            m.pending = None
            if code == 0 and self._owns(tp) and tp.txns.get(m.transactional_id) is m:
                m.state = S.DEAD
                del tp.txns[m.transactional_id]
        log.info("txn_ids_expired", partition=tp.index, transactional_ids=len(metas), error_code=code)

    # ------------------------------------------------------------------ the topic
    async def _create_topic(self) -> None:
        cfg = self.config
        await create_internal_topic(
            self.metadata, self._forward, TRANSACTION_STATE_TOPIC, cfg.state_log_num_partitions, cfg.state_log_replication_factor,
            {"segment.bytes": str(cfg.state_log_segment_bytes), "unclean.leader.election.enable": "false"},
            min_isr=cfg.state_log_min_isr,
        )


def _valid_producer_id(meta: TransactionMetadata, expected: tuple[int, int]) -> bool:
    """Kafka's rule for InitProducerId with the producer's current id and epoch: fine for a fresh
    id, the current id, or the previous id whose epoch ran out (a retried rotation)."""
    pid, epoch = expected
    return (meta.producer_epoch == NO_PRODUCER_EPOCH or pid == meta.producer_id
            or (pid == meta.previous_producer_id and is_epoch_exhausted(epoch)))
