"""log-state.checkpoint: the offsets of one log that are not derivable from its segments.

Text, like Kafka's checkpoint files, so an operator can read it:

    0                       <- format version
    log_start_offset 120
    recovery_point 4512
    high_watermark 4500

    incarnation 8f1c0a2e55d3b7c4 <- since the log's creation or last truncation (optional: 0)

Written atomically (tmp + fsync + rename). A missing or unreadable file is not fatal: the log then
recovers every segment and starts at its first segment's base offset.

The high watermark moves with nearly every produce; rewriting this file for it, one file per log
at every checkpoint interval, made a periodic checkpoint of 20,000 partitions about 4 s of a
thread's time. So, as Kafka's replication-offset-checkpoint, the periodic checkpoint and a
broker's shutdown write every log's high watermark into one file per log dir
(`high-watermark-checkpoint`, DirHighWatermarks below) and rewrite a log's own file only when its
log start offset, recovery point or incarnation moved. A dir entry counts only for the
incarnation it names: a truncation (which lowers the high watermark) draws a new incarnation and
writes this file at once, so an older dir entry, or one left by an earlier log of the same name,
can never raise a log's high watermark past what it holds now.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

import structlog

from broker.storage.atomic_file import read_ascii_file, write_atomically
from broker.storage.file_names import TMP_SUFFIX, interned_parts

log = structlog.get_logger(__name__)

VERSION = 0
_KEYS = ("log_start_offset", "recovery_point", "high_watermark")
# The file of a log dir (beside meta.properties) that holds its logs' high watermarks
DIR_HIGH_WATERMARKS = "high-watermark-checkpoint"


def new_incarnation() -> int:
    """A random nonzero 64-bit id (0 is what a file written before incarnations existed reads as)."""
    return secrets.randbits(64) or 1


@dataclass(frozen=True)
class LogState:
    log_start_offset: int
    recovery_point: int
    high_watermark: int
    incarnation: int = 0

    def to_bytes(self) -> bytes:
        lines = [str(VERSION)] + [f"{key} {getattr(self, key)}" for key in _KEYS]
        lines.append(f"incarnation {self.incarnation:x}")
        return ("\n".join(lines) + "\n").encode("ascii")

    def same_file(self, other: LogState | None) -> bool:
        """Whether `other` needs no rewrite of the log's own file to stand for this state: all
        but the high watermark, which the dir's file carries (see the module doc)."""
        return other is not None and (
            (self.log_start_offset, self.recovery_point, self.incarnation)
            == (other.log_start_offset, other.recovery_point, other.incarnation))

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
            elif key == "incarnation":
                values[key] = int(raw, 16)
        missing = [key for key in _KEYS if key not in values]
        if missing:
            raise ValueError(f"log state lacks {', '.join(missing)}")
        return cls(**values)


def read_log_state(path: Path | str) -> LogState | None:
    try:
        text = read_ascii_file(path)
        return None if text is None else LogState.parse(text)
    except (ValueError, UnicodeDecodeError) as exc:
        log.warning("log_state_unreadable", path=str(path), error=str(exc))
        return None


def write_log_state(path: Path | str, state: LogState, *, sync: bool = True) -> None:
    write_atomically(path, state.to_bytes(), sync=sync)


class LogStateFile:
    """A log's log-state.checkpoint and what it holds once written (`durable`; None: unknown, or
    no file yet)."""

    __slots__ = ("_dir", "_name", "durable", "fresh", "incarnation")

    def __init__(self, path: Path | str, durable: LogState | None = None, fresh: bool = False,
                 incarnation: int = 0) -> None:
        self._dir, self._name = interned_parts(os.fspath(path))  # no whole path a log
        self.durable = durable
        self.fresh = fresh  # the log was created by its open: no file until it has records
        self.incarnation = incarnation  # the log's: drawn anew at creation and at every truncation

    @property
    def path(self) -> str:
        return self._dir + self._name

    def renew(self) -> None:
        """A truncation: the dir's entries of the old incarnation no longer count."""
        self.incarnation = new_incarnation()

    def stale(self, state: LogState, hw_in_dir: bool) -> bool:
        """Whether the file must be written to stand for `state`; with `hw_in_dir`, the high
        watermark is the dir's file's to hold (its entry counts only beside a file of the same
        incarnation, so a log with records needs one)."""
        if not hw_in_dir:
            return state != self.durable
        if self.durable is None:
            return not self.fresh or state.high_watermark > state.log_start_offset
        return not state.same_file(self.durable)

    def write(self, state: LogState, *, sync: bool = True, durable: bool = True) -> None:
        """`durable`: the file now stands for `state` (False: unsynced, to be trusted only after
        the filesystem's sync, which the caller does not track)."""
        write_log_state(self.path, state, sync=sync)
        self.durable = state if durable else None


class DirHighWatermarks:
    """`<log dir>/high-watermark-checkpoint`: the high watermark of every log of a dir, with the
    incarnation of the log it was taken from. Text, like Kafka's checkpoint files:

        0                                   <- format version
        2                                   <- entries
        orders-0-0 8f1c0a2e55d3b7c4 4500    <- replica dir, incarnation (hex), high watermark
        orders-1-0 0 17

    Replaced atomically; unreadable means empty (each log then keeps its own file's value)."""

    def __init__(self, dir: Path) -> None:
        self.path = Path(dir) / DIR_HIGH_WATERMARKS
        self._written: dict[str, tuple[int, int]] | None = None  # what the file holds, once written here

    def read(self) -> dict[str, tuple[int, int]]:
        """replica dir name -> (incarnation, high watermark); also removes a half-written file."""
        for name in os.listdir(self.path.parent):
            if name.startswith(DIR_HIGH_WATERMARKS + ".") and name.endswith(TMP_SUFFIX):
                (self.path.parent / name).unlink(missing_ok=True)
        try:
            text = self.path.read_text("ascii")
        except FileNotFoundError:
            return {}
        except (OSError, UnicodeDecodeError) as exc:
            log.warning("dir_high_watermarks_unreadable", path=str(self.path), error=str(exc))
            return {}
        try:
            lines = text.split("\n")
            if lines[0].strip() != str(VERSION):
                raise ValueError(f"unknown version {lines[0]!r}")
            count = int(lines[1])
            out: dict[str, tuple[int, int]] = {}
            for line in lines[2:2 + count]:
                name, incarnation, hw = line.split(" ")
                out[name] = (int(incarnation, 16), int(hw))
            if len(out) != count:
                raise ValueError(f"{len(out)} entries, the file says {count}")
        except (ValueError, IndexError) as exc:
            log.warning("dir_high_watermarks_unreadable", path=str(self.path), error=str(exc))
            return {}
        self._written = out
        return dict(out)

    def write(self, entries: dict[str, tuple[int, int]], *, sync: bool = True) -> bool:
        """Replace the file with `entries` (without sync: the caller syncs the filesystem before
        relying on it). False, and nothing written, if the file holds them already."""
        if entries == self._written:
            return False
        lines = [str(VERSION), str(len(entries))]
        lines += [f"{name} {inc:x} {hw}" for name, (inc, hw) in sorted(entries.items())]
        write_atomically(self.path, ("\n".join(lines) + "\n").encode("ascii"), sync=sync)
        self._written = dict(entries)
        return True
