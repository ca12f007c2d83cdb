"""Broker sessions: when each broker last heartbeated, which sessions ran out, and which brokers
lost every connection they talked to us on.

In memory only, as in Kafka: after a controller restart every registered broker starts with a
full session, so a controller restart alone never fences anyone.

A broker's process that dies closes its connections (the kernel sends FIN or RST), so a
connection that carried its heartbeats or metadata fetches closing, with no other left open, is
news Kafka's session timeout waits broker.session.timeout.ms for. Unless the broker reconnects
within DISCONNECT_GRACE_S (a broker's channel reconnects in about 100 ms and its metadata fetch
follows at once), it is fenced then. A network partition or a paused process closes nothing and
still waits for the session timeout.

Half a second, not one: librdkafka looks for a lost leader once a second and its idempotent
producer waits one more tick to drain before it writes to the new leader, so writes resume at
the second tick after the fence: a fence at 0.6 s keeps that under 3 s, one at 1.1 s did not.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Protocol

DISCONNECT_GRACE_S = 0.5


class Link(Protocol):
    """A connection a broker talks to us on (node.server.Connection)."""

    @property
    def closed(self) -> bool: ...

    def on_close(self, callback: Callable[[], None]) -> None: ...


class BrokerSessions:
    def __init__(self, timeout_ms: int, clock: Callable[[], float] = time.monotonic,
                 grace: float = DISCONNECT_GRACE_S) -> None:
        self.timeout = timeout_ms / 1000
        self.clock = clock
        self.grace = min(grace, self.timeout)
        self._last: dict[int, float] = {}
        self._links: dict[int, list[Link]] = {}
        self._cut_at: dict[int, float] = {}  # broker id -> when we first saw all its links closed
        self._dark = False  # the last look found no broker's connection open
        # called when a bound link closes: the fencing loop checks at once, then every fifth of
        # the grace while a broker has no link left; otherwise at the session's pace (an idle
        # controller wakes about once a second, not ten times)
        self.on_link_closed: Callable[[], None] | None = None

    def touch(self, broker_id: int) -> None:
        self._last[broker_id] = self.clock()

    def bind(self, broker_id: int, link: Link) -> None:
        """`link` carries the broker's requests (a heartbeat, a metadata fetch)."""
        links = self._links.setdefault(broker_id, [])
        if not any(x is link for x in links):
            links[:] = [x for x in links if not x.closed] + [link]
            link.on_close(self._link_closed)
        if not link.closed:
            self._cut_at.pop(broker_id, None)

    def touch_all(self, broker_ids: Iterable[int]) -> None:
        """A new active controller: every session starts afresh, and brokers reconnect to us."""
        now = self.clock()
        for b in broker_ids:
            self._last[b] = now
        self._links.clear()
        self._cut_at.clear()

    def forget(self, broker_id: int) -> None:
        self._last.pop(broker_id, None)
        self._links.pop(broker_id, None)
        self._cut_at.pop(broker_id, None)

    def expired(self, candidates: Iterable[int]) -> list[int]:
        """Those of `candidates` whose last contact is older than the session timeout."""
        deadline = self.clock() - self.timeout
        return [b for b in candidates if self._last.setdefault(b, self.clock()) < deadline]

    def disconnected(self, candidates: Iterable[int], reachable: bool = False) -> list[int]:
        """Those of `candidates` whose every connection has been closed for the grace period,
        with no heartbeat since they closed."""
        now = self.clock()
        dark = not any(not x.closed for links in self._links.values() for x in links)
        if self._dark and not dark:
            # the first look after every connection had closed: each broker still away gets its
            # full grace from now, as the others come back over the healed network
            self._cut_at = dict.fromkeys(self._cut_at, now)
        self._dark = dark
        out = []
        for b in candidates:
            links = self._links.get(b)
            if not links or any(not x.closed for x in links):
                self._cut_at.pop(b, None)
                continue
            cut = self._cut_at.setdefault(b, now)
            if self._last.get(b, now) <= cut and now - cut >= self.grace:
                out.append(b)
        # No broker talks to us on an open connection: more likely our own network dropped (a
        # partition that resets connections) than every broker died at once, and fencing them
        # all would leave every partition leaderless: the session timeout decides, as in Kafka.
        # A registration arriving is news from the network itself (`reachable`).
        return out if reachable or not dark else []

    def lapsed(self, candidates: Iterable[int], reachable: bool = False) -> dict[int, str]:
        """Those of `candidates` to fence, with why: a session run out or every connection gone.
        `reachable`: the caller is answering a broker's request (our network works)."""
        ids = list(candidates)
        why = dict.fromkeys(self.disconnected(ids, reachable), "connection_closed")
        why.update(dict.fromkeys(self.expired(ids), "session_timeout"))
        return why

    def _link_closed(self) -> None:
        if self.on_link_closed is not None:
            self.on_link_closed()

    def check_interval(self) -> float:
        """How long the fencing loop may wait before its next look: a small fraction of the
        timeout, so fencing is not late by much; while a broker's grace runs (every link closed,
        seen by the look that a closing link woke: on_link_closed), a fifth of the grace."""
        session = min(max(self.timeout / 8, 0.05), 1.0)
        return min(session, max(self.grace / 5, 0.05)) if self._cut_at else session
