"""Broker sessions: when each broker last heartbeated, and which sessions ran out.

In memory only, as in Kafka: after a controller restart every registered broker starts with a
full session, so a controller restart alone never fences anyone.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable


class BrokerSessions:
    def __init__(self, timeout_ms: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout = timeout_ms / 1000
        self.clock = clock
        self._last: dict[int, float] = {}

    def touch(self, broker_id: int) -> None:
        self._last[broker_id] = self.clock()

    def touch_all(self, broker_ids: Iterable[int]) -> None:
        now = self.clock()
        for b in broker_ids:
            self._last[b] = now

    def forget(self, broker_id: int) -> None:
        self._last.pop(broker_id, None)

    def expired(self, candidates: Iterable[int]) -> list[int]:
        """Those of `candidates` whose last contact is older than the session timeout."""
        deadline = self.clock() - self.timeout
        return [b for b in candidates if self._last.setdefault(b, self.clock()) < deadline]

    def check_interval(self) -> float:
        """How often to look: a small fraction of the timeout, so fencing is not late by much."""
        return min(max(self.timeout / 8, 0.05), 1.0)
