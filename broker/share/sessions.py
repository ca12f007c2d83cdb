"""Share sessions (KIP-932, "Share sessions"): as an incremental fetch session, a member's
ShareFetch names only what changed (partitions added, partitions forgotten) and the broker keeps
the rest. A session is keyed by (group, member): epoch 0 opens one (replacing the member's
previous session), -1 closes it, and every other request carries the epoch after the last one.
ShareAcknowledge moves the same epoch on. A session unused for the share group session timeout
(its member is out of the group by then) is evicted when sessions open, its records released.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from uuid import UUID

from protocol.errors import Errors

INITIAL_EPOCH, FINAL_EPOCH = 0, -1
TopicIdPartition = tuple[UUID, int]


@dataclass
class ShareSession:
    group_id: str
    member_id: str
    epoch: int = 1  # the epoch the next request must carry
    partitions: dict[TopicIdPartition, None] = field(default_factory=dict)  # in the order they were added
    last_used: float = field(default_factory=time.monotonic)


def next_epoch(epoch: int) -> int:
    return 1 if epoch >= 2**31 - 1 else epoch + 1


class ShareSessionCache:
    def __init__(self, max_sessions: int, idle_ms: int) -> None:
        self.max_sessions = max_sessions
        self.idle_s = idle_ms / 1000
        # least recently used first
        self._sessions: OrderedDict[tuple[str, str], ShareSession] = OrderedDict()

    def evict_idle(self, now: float | None = None) -> list[ShareSession]:
        """Sessions unused for idle_ms, removed (the caller releases their members' records)."""
        now = time.monotonic() if now is None else now
        out = []
        while self._sessions:
            key, s = next(iter(self._sessions.items()))
            if now - s.last_used < self.idle_s:
                break
            del self._sessions[key]
            out.append(s)
        return out

    def get(self, group_id: str, member_id: str) -> ShareSession | None:
        return self._sessions.get((group_id, member_id))

    def open(self, group_id: str, member_id: str) -> tuple[int, ShareSession | None, ShareSession | None]:
        """(error, the new session, the one it replaces)."""
        key = (group_id, member_id)
        old = self._sessions.pop(key, None)
        if len(self._sessions) >= self.max_sessions:
            return Errors.SHARE_SESSION_LIMIT_REACHED, None, old
        s = self._sessions[key] = ShareSession(group_id, member_id)
        return 0, s, old

    def touch(self, s: ShareSession) -> None:
        s.last_used = time.monotonic()
        if self._sessions.get((s.group_id, s.member_id)) is s:
            self._sessions.move_to_end((s.group_id, s.member_id))

    def advance(self, group_id: str, member_id: str, epoch: int) -> tuple[int, ShareSession | None]:
        """A request of an open session: (0, session) with its epoch moved on, else the error."""
        s = self._sessions.get((group_id, member_id))
        if s is None:
            return Errors.SHARE_SESSION_NOT_FOUND, None
        if epoch == FINAL_EPOCH:
            return 0, s
        if epoch != s.epoch:
            return Errors.INVALID_SHARE_SESSION_EPOCH, None
        s.epoch = next_epoch(s.epoch)
        self.touch(s)
        return 0, s

    def partitions_of(self, group_id: str) -> set[TopicIdPartition]:
        """Every partition some session of the group reads."""
        return {tp for (g, _), s in self._sessions.items() if g == group_id for tp in s.partitions}

    def close(self, s: ShareSession) -> None:
        if self._sessions.get((s.group_id, s.member_id)) is s:
            del self._sessions[(s.group_id, s.member_id)]

    def __len__(self) -> int:
        return len(self._sessions)
