"""Event-loop lag gauge: how long a no-op callback waits before the loop runs it.

Every `sample_s` a callback is scheduled and the wait until it runs is recorded; every
`interval_s` the broker logs `loop_lag samples= p50_ms= p99_ms= max_ms= admission_delayed=` for
that period. A lag of tens of milliseconds means some request or background step is holding the
loop, or the machine has no CPU free for it. `LagAdmission` holds large client requests back while
the loop is late.
"""

from __future__ import annotations

import asyncio
import time

import structlog

log = structlog.get_logger(__name__)


class LoopLagGauge:
    def __init__(self, interval_s: float, sample_s: float = 0.1, admission: LagAdmission | None = None) -> None:
        self.interval_s = interval_s
        self.sample_s = sample_s
        self.admission = admission  # started and stopped with the gauge, its count reported
        self.samples: list[float] = []
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())
        if self.admission is not None:
            self.admission.start()

    async def stop(self) -> None:
        if self.admission is not None:
            self.admission.stop()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def sample(self) -> float:
        """Seconds a no-op callback scheduled now waits to run."""
        loop = asyncio.get_running_loop()
        ran = loop.create_future()
        t0 = time.perf_counter()  # not loop.time(): uvloop's clock ticks in whole milliseconds
        loop.call_soon(lambda: ran.done() or ran.set_result(time.perf_counter()))
        return (await ran) - t0

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        next_log = loop.time() + self.interval_s
        try:
            while True:
                await asyncio.sleep(self.sample_s)
                self.samples.append(await self.sample())
                if loop.time() >= next_log:
                    next_log = loop.time() + self.interval_s
                    self._report()
        finally:
            self._report()  # the last, partial period too (a stop right after a stall shows it)

    def _report(self) -> None:
        s = sorted(self.samples)
        self.samples.clear()
        delayed = 0
        if self.admission is not None:
            delayed, self.admission.delayed = self.admission.delayed, 0
        if s:
            log.info("loop_lag", samples=len(s), p50_ms=round(s[len(s) // 2] * 1000, 2),
                     p99_ms=round(s[min(len(s) - 1, len(s) * 99 // 100)] * 1000, 2), max_ms=round(s[-1] * 1000, 2),
                     admission_delayed=delayed)


class LagAdmission:
    """Admission by event-loop lag: while the loop runs late, a large client request (a bulk
    produce, at least `min_bytes`) waits before it starts, and small requests, follower fetches
    and coordinator traffic go first.

    A timer every `PROBE_S` records how late it ran; `lag_s` is the peak of those, decaying by
    `DECAY` a probe, so one stall keeps large requests back for a few probes, not for one. Over
    `target_s`, the connection of a large request is muted for `MUTE_FACTOR` times the lag (at
    most `MAX_MUTE_S`) and the request waits its next turn, for at most `MAX_HOLD_S` in all: on a
    loop that stays late, large requests are paced, not stopped. A saturating producer then feeds
    the loop only as fast as it keeps up, and the CPU time it leaves goes to the requests behind
    it (on a machine with fewer cores than processes, the loop is late whenever another process
    holds the CPU)."""

    PROBE_S = 0.005
    DECAY = 0.8
    MUTE_FACTOR = 3.0
    MAX_MUTE_S = 0.05
    MAX_HOLD_S = 0.1
    # uvloop's timers fire on whole milliseconds: up to 1 ms late on an idle loop
    TIMER_SLACK_S = 0.001

    def __init__(self, target_ms: float, min_bytes: int = 64 * 1024) -> None:
        self.target_s = target_ms / 1000
        self.min_bytes = min_bytes
        self.lag_s = 0.0
        self.delayed = 0  # large requests held back, since the last report
        self._due = 0.0
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        if self.target_s > 0 and self._timer is None:
            self._arm()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def hold_for(self, size: int, held_s: float) -> float:
        """Seconds a client request of `size` bytes, held back for `held_s` already, should wait
        before it starts: 0 to start now."""
        if size < self.min_bytes or self.lag_s <= self.target_s or self._timer is None or held_s >= self.MAX_HOLD_S:
            return 0.0
        if not held_s:
            self.delayed += 1
        return min(self.lag_s * self.MUTE_FACTOR, self.MAX_MUTE_S, self.MAX_HOLD_S - held_s)

    def _arm(self) -> None:
        self._due = time.perf_counter() + self.PROBE_S
        self._timer = asyncio.get_running_loop().call_later(self.PROBE_S, self._probe)

    def _probe(self) -> None:
        late = max(0.0, time.perf_counter() - self._due - self.TIMER_SLACK_S)
        self.lag_s = max(late, self.lag_s * self.DECAY)
        self._arm()
