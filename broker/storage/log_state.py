"""log-state.checkpoint: the offsets of one log that are not derivable from its segments.

Text, like Kafka's checkpoint files, so an operator can read it:

    0                       <- format version
    log_start_offset 120
    recovery_point 4512
    high_watermark 4500

Written atomically (tmp + fsync + rename). A missing or unreadable file is not fatal: the log then
recovers every segment and starts at its first segment's base offset.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import structlog

from broker.storage.atomic_file import write_atomically

log = structlog.get_logger(__name__)

VERSION = 0
_KEYS = ("log_start_offset", "recovery_point", "high_watermark")


@dataclass(frozen=True)
class LogState:
    log_start_offset: int
    recovery_point: int
    high_watermark: int

    def to_bytes(self) -> bytes:
        lines = [str(VERSION)] + [f"{key} {getattr(self, key)}" for key in _KEYS]
        return ("\n".join(lines) + "\n").encode("ascii")

    @classmethod
    def parse(cls, text: str) -> LogState:
        lines = text.split("\n")
        if not lines or lines[0].strip() != str(VERSION):
            raise ValueError(f"unknown log state version {lines[0]!r}")
        values: dict[str, int] = {}
        for line in lines[1:]:
            if not line.strip():
                continue
            key, _, raw = line.partition(" ")
            if key in _KEYS:
                values[key] = int(raw)
        missing = [key for key in _KEYS if key not in values]
        if missing:
            raise ValueError(f"log state lacks {', '.join(missing)}")
        return cls(**values)


def read_log_state(path: Path) -> LogState | None:
    try:
        text = path.read_text("ascii")
    except FileNotFoundError:
        return None
    try:
        return LogState.parse(text)
    except (ValueError, UnicodeDecodeError) as exc:
        log.warning("log_state_unreadable", path=str(path), error=str(exc))
        return None


def write_log_state(path: Path, state: LogState, *, sync: bool = True) -> None:
    write_atomically(path, state.to_bytes(), sync=sync)
