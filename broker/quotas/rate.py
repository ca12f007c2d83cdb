"""A sampled rate as Kafka's metrics measure quotas: `samples` windows of `window` seconds each;
the rate is what the kept windows hold over the time they span, counted as at least
`samples - 1` whole windows, so a new client is not throttled for its first small burst and a
long-quiet one starts afresh."""

from __future__ import annotations


class SampledRate:
    __slots__ = ("samples", "window", "_starts", "_values")

    def __init__(self, samples: int, window: float) -> None:
        self.samples = samples
        self.window = window
        self._starts: list[float] = []
        self._values: list[float] = []

    def record(self, value: float, now: float) -> None:
        if not self._starts or now - self._starts[-1] >= self.window:
            self._starts.append(now)
            self._values.append(0.0)
            if len(self._starts) > self.samples:
                del self._starts[0], self._values[0]
        self._values[-1] += value

    def unrecord(self, value: float) -> None:
        if self._values:
            self._values[-1] -= value

    def span(self, now: float) -> float:
        """Seconds the rate is measured over."""
        self._purge(now)
        if not self._starts:
            return (self.samples - 1) * self.window
        span = now - self._starts[0]
        full = int(span / self.window)
        if full < self.samples - 1:
            span += (self.samples - 1 - full) * self.window
        return span

    def rate(self, now: float) -> float:
        span = self.span(now)
        return sum(self._values) / span if span > 0 else 0.0

    def idle_since(self, now: float) -> float:
        return now - self._starts[-1] if self._starts else float("inf")

    def _purge(self, now: float) -> None:
        expired = now - self.samples * self.window
        while self._starts and self._starts[0] <= expired:
            del self._starts[0], self._values[0]
