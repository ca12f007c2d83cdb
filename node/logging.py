"""structlog set up for one event per line, key=value, on stderr."""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import structlog

# Kafka's log4j level names (what DescribeConfigs of a BROKER_LOGGER shows and takes) and the
# stdlib numbers they filter at; TRACE and ALL log everything, OFF nothing.
LEVELS = {"OFF": logging.CRITICAL + 10, "FATAL": logging.CRITICAL, "ERROR": logging.ERROR,
          "WARN": logging.WARNING, "INFO": logging.INFO, "DEBUG": logging.DEBUG, "TRACE": 5, "ALL": 0}
ROOT = "root"
_METHOD_LEVELS = {"critical": logging.CRITICAL, "exception": logging.ERROR, "error": logging.ERROR,
                  "warning": logging.WARNING, "warn": logging.WARNING, "info": logging.INFO,
                  "debug": logging.DEBUG, "msg": logging.INFO}


class _Levels:
    """Per-logger levels (a logger is a module's dotted name): a logger without its own level takes
    its nearest ancestor's, else the root's, as log4j's hierarchy. Changed at runtime through
    IncrementalAlterConfigs of a BROKER_LOGGER resource."""

    def __init__(self) -> None:
        self.root = logging.INFO
        self.own: dict[str, int] = {}
        self.seen: set[str] = set()
        self._effective: dict[str, int] = {}

    def effective(self, name: str) -> int:
        lvl = self._effective.get(name)
        if lvl is None:
            lvl, probe = self.root, name
            while probe:
                if probe in self.own:
                    lvl = self.own[probe]
                    break
                probe = probe.rpartition(".")[0]
            self._effective[name] = lvl
        return lvl

    def set(self, name: str, level: int | None) -> None:
        """Give `name` its own level, or (None) let it inherit again; the root's cannot be removed."""
        if name == ROOT:
            assert level is not None
            self.root = level
        elif level is None:
            self.own.pop(name, None)
        else:
            self.own[name] = level
        self._effective.clear()


levels = _Levels()


class _NamedPrintLogger(structlog.PrintLogger):
    def __init__(self, name: str) -> None:
        super().__init__(sys.stderr)
        self.name = name


def _named_logger(*args: Any) -> _NamedPrintLogger:
    name = args[0] if args and isinstance(args[0], str) else ROOT
    levels.seen.add(name)
    return _NamedPrintLogger(name)


def _level_filter(logger: Any, method_name: str, event_dict: Any) -> Any:
    if _METHOD_LEVELS.get(method_name, logging.INFO) < levels.effective(getattr(logger, "name", ROOT)):
        raise structlog.DropEvent
    return event_dict


def configure(level: str = "INFO", **bound: object) -> None:
    levels.set(ROOT, getattr(logging, level.upper(), logging.INFO))
    structlog.configure(
        processors=[
            _level_filter,  # first: a dropped event costs one lookup
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.KeyValueRenderer(key_order=["timestamp", "level", "event"], drop_missing=True),
        ],
        # debug calls reach the filter (none is on a per-request path), so a logger set to
        # DEBUG at runtime logs them
        wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG),
        logger_factory=_named_logger,
        cache_logger_on_first_use=True,
    )
    if bound:
        structlog.contextvars.bind_contextvars(**bound)


def level_name(level: int) -> str:
    """The Kafka name of a level number (the nearest at or below it)."""
    return max(((n, v) for n, v in LEVELS.items() if v <= level), key=lambda nv: (nv[1], nv[0] != "ALL"))[0]


def logger_levels() -> dict[str, str]:
    """Every logger known in this process (used ones, loaded modules that hold a `log`, and their
    packages) with its effective level, Kafka-named; the root first."""
    names = set(levels.seen) | set(levels.own)
    for mod_name, mod in list(sys.modules.items()):
        if mod_name.split(".")[0] in ("broker", "controller", "node", "metadata") and hasattr(mod, "log"):
            names.add(mod_name)
    for n in list(names):  # and their packages: a package's level is its modules' unless they have their own
        while "." in n:
            n = n.rpartition(".")[0]
            names.add(n)
    names.discard(ROOT)
    out = {ROOT: level_name(levels.root)}
    out.update({n: level_name(levels.effective(n)) for n in sorted(names)})
    return out


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
