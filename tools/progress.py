"""Progress lines for tool steps that wait on a copy (a reassignment's new replica catching up,
a replica moving between log dirs): bytes copied / total, the share done and an ETA estimated
from the rate seen since the copy was first sampled."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Copy:
    """One copy under way: `name` says what goes where ("partition t-0 to broker 3")."""

    name: str
    copied: int
    total: int


def format_duration(seconds: float) -> str:
    """5s, 2m05s, 1h02m."""
    s = max(int(round(seconds)), 0)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class ProgressTracker:
    """Remembers each copy's first sample so that later samples give a rate and an ETA."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._first: dict[str, tuple[float, int]] = {}

    def line(self, c: Copy) -> str:
        now = self._clock()
        t0, b0 = self._first.setdefault(c.name, (now, c.copied))
        copied = min(c.copied, c.total) if c.total >= 0 else c.copied
        share = f" ({100 * copied // c.total}%)" if c.total > 0 else ""
        rate = (c.copied - b0) / (now - t0) if now > t0 else 0.0
        if c.total >= 0 and copied >= c.total:
            eta = "ETA 0s"
        elif rate > 0 and c.total >= 0:
            eta = f"{rate / 1e6:.2f} MB/s, ETA {format_duration((c.total - copied) / rate)}"
        else:
            eta = "ETA unknown"
        return f"Progress of {c.name}: {copied} / {c.total} bytes copied{share}, {eta}"
