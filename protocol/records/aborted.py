"""Which batches a read_committed reader skips: the aborted transactions a Fetch response lists.

Shared by the chunk-aware readers (connector/) and the console consumer (tools/)."""

from __future__ import annotations

import heapq
from collections.abc import Iterable


class AbortedTransactions:
    """The aborted transactions a read_committed reader must skip, as a Fetch response lists them
    ((producer id, first offset) pairs), consumed in offset order as the batches go by."""

    def __init__(self, aborted: Iterable[tuple[int, int]] = ()) -> None:
        self._pending = [(first, pid) for pid, first in aborted]
        heapq.heapify(self._pending)
        self._active: set[int] = set()

    def add(self, aborted: Iterable[tuple[int, int]]) -> None:
        for pid, first in aborted:
            heapq.heappush(self._pending, (first, pid))

    def skips(self, producer_id: int, last_offset: int, transactional: bool) -> bool:
        while self._pending and self._pending[0][0] <= last_offset:
            self._active.add(heapq.heappop(self._pending)[1])
        return transactional and producer_id in self._active

    def marker(self, producer_id: int, abort: bool) -> None:
        if abort:
            self._active.discard(producer_id)
