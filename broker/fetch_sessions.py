"""Incremental fetch sessions (KIP-227), sans-IO: which partitions a Fetch covers, and which of
them the response must carry.

A session remembers the partitions a client fetches and what it last told it (high watermark,
last stable offset, log start); an incremental request names only what changed, and the
response carries only partitions with new data, new offsets or an error.
"""

from __future__ import annotations

import itertools
import time
from collections import OrderedDict
from dataclasses import dataclass, field

INVALID_SESSION_ID = 0
INITIAL_EPOCH = 0
FINAL_EPOCH = -1
FETCH_SESSION_ID_NOT_FOUND = 70
INVALID_FETCH_SESSION_EPOCH = 71


@dataclass
class SessionPartition:
    fetch_offset: int
    max_bytes: int
    current_leader_epoch: int = -1
    last_fetched_epoch: int = -1
    last_high_watermark: int = -2
    last_stable_offset: int = -2
    last_log_start: int = -2


@dataclass
class FetchSession:
    id: int
    epoch: int  # the epoch the next request must carry
    partitions: OrderedDict = field(default_factory=OrderedDict)  # key -> SessionPartition
    last_used: float = 0.0


class FetchSessionError(Exception):
    def __init__(self, error_code: int, message: str) -> None:
        super().__init__(message)
        self.error_code = error_code


class FetchSessionCache:
    def __init__(self, max_sessions: int = 1000) -> None:
        self.max_sessions = max_sessions
        self.sessions: OrderedDict[int, FetchSession] = OrderedDict()
        self._ids = itertools.count(1)

    def _new(self) -> FetchSession | None:
        if self.max_sessions <= 0:
            return None
        if len(self.sessions) >= self.max_sessions:
            self.sessions.popitem(last=False)  # evict the least recently used
        s = FetchSession(id=next(self._ids) & 0x7FFFFFFF or next(self._ids), epoch=1)
        self.sessions[s.id] = s
        return s

    def begin(self, session_id: int, epoch: int, requested: dict, forgotten: list) -> tuple[FetchSession | None, bool]:
        """Resolve a request to (session or None, is_full). Raises FetchSessionError."""
        if session_id != INVALID_SESSION_ID and epoch in (INITIAL_EPOCH, FINAL_EPOCH):
            self.sessions.pop(session_id, None)  # the client closes or restarts its session
        if epoch == FINAL_EPOCH:
            return None, True
        if epoch == INITIAL_EPOCH:
            s = self._new()
            if s is not None:
                for key, sp in requested.items():
                    s.partitions[key] = sp
            return s, True
        s = self.sessions.get(session_id)
        if s is None:
            raise FetchSessionError(FETCH_SESSION_ID_NOT_FOUND, f"fetch session {session_id} not found")
        if s.epoch != epoch:
            raise FetchSessionError(INVALID_FETCH_SESSION_EPOCH, f"session {session_id} expects epoch {s.epoch}, got {epoch}")
        for key in forgotten:
            s.partitions.pop(key, None)
        for key, sp in requested.items():
            old = s.partitions.get(key)
            if old is not None:
                sp.last_high_watermark, sp.last_stable_offset, sp.last_log_start = (
                    old.last_high_watermark, old.last_stable_offset, old.last_log_start)
            s.partitions[key] = sp
        self.sessions.move_to_end(s.id)
        return s, False

    def finish(self, s: FetchSession | None) -> None:
        if s is not None:
            s.epoch = s.epoch + 1 if s.epoch < 2**31 - 1 else 1
            s.last_used = time.monotonic()
