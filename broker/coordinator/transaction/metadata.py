"""One transactional id's state on its coordinator (Kafka's TransactionMetadata), and the rules
for moving it from one state to the next.

A change is prepared as a target (a TransactionLogValue), written to __transaction_state, and
applied only once replicated; meanwhile `pending` holds the target state and every other request
for the id answers CONCURRENT_TRANSACTIONS (retriable), so one change is in flight at a time.
"""

from __future__ import annotations

import dataclasses

from broker.coordinator.transaction.records import TransactionLogValue, TransactionState
from protocol.errors import Errors

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
MAX_EPOCH = 32767  # Short.MAX_VALUE: an epoch at MAX_EPOCH - 1 is exhausted (one more bump gets a new id)

S = TransactionState

# Kafka's valid previous states per target state
_VALID_PREVIOUS: dict[TransactionState, frozenset[TransactionState]] = {
    S.EMPTY: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.ONGOING: frozenset({S.ONGOING, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.PREPARE_COMMIT: frozenset({S.ONGOING}),
    S.PREPARE_ABORT: frozenset({S.ONGOING, S.PREPARE_EPOCH_FENCE}),
    S.COMPLETE_COMMIT: frozenset({S.PREPARE_COMMIT}),
    S.COMPLETE_ABORT: frozenset({S.PREPARE_ABORT}),
    S.DEAD: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.PREPARE_EPOCH_FENCE: frozenset({S.ONGOING}),
}


def is_epoch_exhausted(epoch: int) -> bool:
    return epoch >= MAX_EPOCH - 1


class TransactionError(Exception):
    def __init__(self, error_code: int, message: str = "") -> None:
        super().__init__(message or f"error {error_code}")
        self.error_code = error_code


class TransactionMetadata:
    def __init__(self, transactional_id: str, producer_id: int, previous_producer_id: int, next_producer_id: int,
                 producer_epoch: int, last_producer_epoch: int, timeout_ms: int, state: TransactionState,
                 partitions: set[tuple[str, int]] | None = None, last_update_ms: int = -1,
                 start_ms: int = -1) -> None:
        self.transactional_id = transactional_id
        self.producer_id = producer_id
        self.previous_producer_id = previous_producer_id
        self.next_producer_id = next_producer_id
        self.producer_epoch = producer_epoch
        self.last_producer_epoch = last_producer_epoch
        self.timeout_ms = timeout_ms
        self.state = state
        self.partitions: set[tuple[str, int]] = set(partitions or ())
        self.last_update_ms = last_update_ms
        self.start_ms = start_ms
        self.pending: TransactionState | None = None

    def __repr__(self) -> str:
        return (f"Txn({self.transactional_id!r} pid={self.producer_id} epoch={self.producer_epoch} "
                f"state={self.state.display} pending={self.pending and self.pending.display} "
                f"partitions={len(self.partitions)})")

    @classmethod
    def from_value(cls, transactional_id: str, v: TransactionLogValue) -> TransactionMetadata:
        return cls(transactional_id, v.producer_id, v.previous_producer_id, v.next_producer_id, v.producer_epoch,
                   v.last_producer_epoch, v.timeout_ms, v.state, set(v.partitions), v.last_update_ms, v.start_ms)

    def value(self) -> TransactionLogValue:
        return TransactionLogValue(self.producer_id, self.previous_producer_id, self.next_producer_id,
                                   self.producer_epoch, self.last_producer_epoch, self.timeout_ms, self.state,
                                   frozenset(self.partitions), self.last_update_ms, self.start_ms)

    # ------------------------------------------------------------------ transitions
    def _target(self, state: TransactionState, now_ms: int, **changes) -> TransactionLogValue:
        if self.pending is not None:
            raise TransactionError(Errors.CONCURRENT_TRANSACTIONS, f"{self} has a change in flight")
        if self.state not in _VALID_PREVIOUS[state]:
            raise TransactionError(Errors.INVALID_TXN_STATE,
                                   f"{self.transactional_id}: {self.state.display} -> {state.display} is not allowed")
        changes.setdefault("last_update_ms", now_ms)
        target = dataclasses.replace(self.value(), state=state, **changes)
        self.pending = state
        return target

    def prepare_increment_epoch(self, timeout_ms: int, expected_epoch: int | None, now_ms: int) -> TransactionLogValue:
        """InitProducerId keeping the producer id: bump the epoch, or answer a retry of a bump that
        already happened (KIP-360), or fence a stale producer."""
        if is_epoch_exhausted(self.producer_epoch):
            raise TransactionError(Errors.INVALID_PRODUCER_EPOCH, "epoch exhausted")
        bumped = self.producer_epoch + 1
        if expected_epoch is None:
            epoch, last = bumped, NO_PRODUCER_EPOCH
        elif self.producer_epoch == NO_PRODUCER_EPOCH or expected_epoch == self.producer_epoch:
            epoch, last = bumped, self.producer_epoch
        elif expected_epoch == self.last_producer_epoch:
            epoch, last = self.producer_epoch, self.last_producer_epoch  # a retry of a bump we made
        else:
            raise TransactionError(Errors.PRODUCER_FENCED, f"epoch {expected_epoch} is fenced")
        return self._target(S.EMPTY, now_ms, producer_epoch=epoch, last_producer_epoch=last, timeout_ms=timeout_ms,
                            partitions=frozenset(), start_ms=-1)

    def prepare_producer_id_rotation(self, new_producer_id: int, timeout_ms: int, now_ms: int,
                                     record_last_epoch: bool) -> TransactionLogValue:
        return self._target(S.EMPTY, now_ms, producer_id=new_producer_id, previous_producer_id=self.producer_id,
                            next_producer_id=NO_PRODUCER_ID, producer_epoch=0,
                            last_producer_epoch=self.producer_epoch if record_last_epoch else NO_PRODUCER_EPOCH,
                            timeout_ms=timeout_ms, partitions=frozenset(), start_ms=-1)

    def prepare_add_partitions(self, partitions: set[tuple[str, int]], now_ms: int) -> TransactionLogValue:
        start = now_ms if self.state in (S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT) else self.start_ms
        keep = self.partitions if self.state is S.ONGOING else set()
        return self._target(S.ONGOING, now_ms, partitions=frozenset(keep | partitions), start_ms=start)

    def prepare_end(self, commit: bool, now_ms: int, *, fence_epoch: int | None = None,
                    last_epoch: int | None = None) -> TransactionLogValue:
        """Ongoing -> PrepareCommit/PrepareAbort. `fence_epoch` (abort only): the bumped epoch that
        fences the producer (timeouts, a new InitProducerId)."""
        changes: dict = {}
        if fence_epoch is not None:
            changes["producer_epoch"] = fence_epoch
            changes["last_producer_epoch"] = NO_PRODUCER_EPOCH if last_epoch is None else last_epoch
        return self._target(S.PREPARE_COMMIT if commit else S.PREPARE_ABORT, now_ms, **changes)

    def prepare_complete(self, now_ms: int) -> TransactionLogValue:
        commit = self.state is S.PREPARE_COMMIT
        return self._target(S.COMPLETE_COMMIT if commit else S.COMPLETE_ABORT, now_ms, partitions=frozenset())

    def complete(self, target: TransactionLogValue) -> None:
        """The target was written and replicated: it is the state now."""
        self.pending = None
        self.producer_id = target.producer_id
        self.previous_producer_id = target.previous_producer_id
        self.next_producer_id = target.next_producer_id
        self.producer_epoch = target.producer_epoch
        self.last_producer_epoch = target.last_producer_epoch
        self.timeout_ms = target.timeout_ms
        self.state = target.state
        self.partitions = set(target.partitions)
        self.last_update_ms = target.last_update_ms
        self.start_ms = target.start_ms

    def abandon(self) -> None:
        """The write failed: nothing changed."""
        self.pending = None
