"""Event-loop lag gauge: how long a no-op callback waits before the loop runs it.

Every `sample_s` a callback is scheduled and the wait until it runs is recorded; every
`interval_s` the broker logs `loop_lag samples= p50_ms= p99_ms= max_ms=` for that period. A lag
of tens of milliseconds means some request or background step is holding the loop.
"""

from __future__ import annotations

import asyncio
import time

import structlog

log = structlog.get_logger(__name__)


class LoopLagGauge:
    def __init__(self, interval_s: float, sample_s: float = 0.1) -> None:
        self.interval_s = interval_s
        self.sample_s = sample_s
        self.samples: list[float] = []
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
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
        if s:
            log.info("loop_lag", samples=len(s), p50_ms=round(s[len(s) // 2] * 1000, 2),
                     p99_ms=round(s[min(len(s) - 1, len(s) * 99 // 100)] * 1000, 2), max_ms=round(s[-1] * 1000, 2))
