"""structlog set up for one event per line, key=value, on stderr."""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import structlog


def configure(level: str = "INFO", **bound: object) -> None:
    lvl = getattr(logging, level.upper(), logging.INFO)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.KeyValueRenderer(key_order=["timestamp", "level", "event"], drop_missing=True),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
    if bound:
        structlog.contextvars.bind_contextvars(**bound)


class RateLimitedLog:
    """A token bucket per event name: a burst of `burst` lines, then `burst` per `interval_s`;
    the next line logged says how many were dropped. For events a peer can trigger at will (bad
    frames, refused connections): every bad connection of a few is logged, while under abuse the
    log stays readable and small."""

    def __init__(self, logger: Any, burst: int = 200, interval_s: float = 60.0) -> None:
        self.logger = logger
        self.burst = burst
        self.rate = burst / interval_s
        self._tokens: dict[str, tuple[float, float]] = {}  # event -> (tokens, when)
        self._dropped: dict[str, int] = {}

    def warning(self, event: str, **kw: Any) -> bool:
        """Log `event` if its bucket has a token; True if it was logged."""
        now = time.monotonic()
        tokens, when = self._tokens.get(event, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - when) * self.rate)
        if tokens < 1.0:
            self._tokens[event] = (tokens, now)
            self._dropped[event] = self._dropped.get(event, 0) + 1
            return False
        self._tokens[event] = (tokens - 1.0, now)
        dropped = self._dropped.pop(event, 0)
        if dropped:
            kw["suppressed"] = dropped
        self.logger.warning(event, **kw)
        return True
