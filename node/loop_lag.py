"""Event-loop lag gauge: how long a no-op callback waits before the loop runs it.

Every `sample_s` a callback is scheduled and the wait until it runs is recorded; every
`interval_s` the broker logs `loop_lag samples= p50_ms= p99_ms= max_ms= admission_delayed=
cpu_wait_pct=` for that period. A lag of tens of milliseconds means some request or background
step is holding the loop, or the machine has no CPU free for it (`cpu_wait_pct`: how much of its
time the loop thread lately spent waiting for a CPU). `LagAdmission` holds large client requests
back while the loop is late.
"""

from __future__ import annotations

import asyncio
import os
import time

import structlog

log = structlog.get_logger(__name__)


class LoopLagGauge:
    # While admission has parked its probe (no client request for 2 s), one sample a second is
    # enough for the log line: ten a second cost an idle broker about 0.2% of a CPU, measured.
    IDLE_SAMPLE_S = 1.0

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

        def run() -> None:
            if not ran.done():
                ran.set_result(time.perf_counter())

        loop.call_soon(run)
        return (await ran) - t0

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        next_log = loop.time() + self.interval_s
        try:
            while True:
                idle = self.admission is not None and self.admission.parked
                await asyncio.sleep(self.IDLE_SAMPLE_S if idle else self.sample_s)
                self.samples.append(await self.sample())
                if loop.time() >= next_log:
                    next_log = loop.time() + self.interval_s
                    self._report()
        finally:
            self._report()  # the last, partial period too (a stop right after a stall shows it)

    def _report(self) -> None:
        s = sorted(self.samples)
        self.samples.clear()
        delayed, cpu_wait = 0, 0.0
        if self.admission is not None:
            delayed, self.admission.delayed = self.admission.delayed, 0
            cpu_wait = self.admission.cpu_wait
        if s:
            log.info("loop_lag", samples=len(s), p50_ms=round(s[len(s) // 2] * 1000, 2),
                     p99_ms=round(s[min(len(s) - 1, len(s) * 99 // 100)] * 1000, 2), max_ms=round(s[-1] * 1000, 2),
                     admission_delayed=delayed, cpu_wait_pct=round(cpu_wait * 100))


class LagAdmission:
    """Admission by event-loop lag: while the loop runs late, a large client request (a bulk
    produce, at least `min_bytes`) waits before it starts, and small requests, follower fetches
    and coordinator traffic go first.

    A timer every `PROBE_S` records how late it ran; `lag_s` is the peak of those, decaying by
    `FAST_DECAY` a probe (a 16 ms half-life), so one stall keeps large requests back for a few
    probes, not for one. While the loop thread waits for a CPU (`RunQueueWait`: its share of time
    runnable but not running, averaged over about 250 ms) more than `UNCONTENDED` of the time, the
    lag decays more slowly, by `SLOW_DECAY` (a 70 ms half-life) from `CONTENDED` on: on a machine
    short of CPU the bulk producer's requests otherwise slip in between the late probes, and the
    CPU they take is what the other processes on a small send's path (its followers, its client)
    wait for. With 3 brokers on 2 cores that took the small sends' p99 from 23-27 ms to 18-20 ms
    (bench/README, fifth round); a loop late from its own work (a stalled write, a large append)
    on a machine with CPU to spare keeps the fast decay, and its bulk MB/s (with the slow decay
    everywhere, one broker's bulk producer lost up to a third of it).

    The probe runs only while client requests come: after `IDLE_PARK_PROBES` probes (2 s) with no
    request asking `hold_for`, it parks, and the next request re-arms it. An idle broker then wakes
    for no timer of its own (200 probes a second cost an idle broker about 1.7% of a CPU, measured).
    A large request arriving after 2 quiet seconds starts at once, as on a loop that was not late.

    Over `target_s`, the connection of a large request is muted for `MUTE_FACTOR` times the lag
    (at most `MAX_MUTE_S`) and the request waits its next turn, for at most `MAX_HOLD_S` in all:
    on a loop that stays late, large requests are paced, not stopped. A saturating producer then
    feeds the loop only as fast as it keeps up, and the CPU time it leaves goes to the requests
    behind it (on a machine with fewer cores than processes, the loop is late whenever another
    process holds the CPU)."""

    PROBE_S = 0.005
    FAST_DECAY = 0.8
    SLOW_DECAY = 0.95
    # shares of the loop thread's time spent waiting for a CPU: one broker beside its clients on
    # 2 cores waits 4-13% of the time, each of 3 brokers 16-42%
    UNCONTENDED = 0.08
    CONTENDED = 0.12
    CONTENTION_WEIGHT = 0.02  # of the newest probe interval in the average (about 250 ms)
    MUTE_FACTOR = 3.0
    MAX_MUTE_S = 0.05
    MAX_HOLD_S = 0.1
    # uvloop's timers fire on whole milliseconds: up to 1 ms late on an idle loop
    TIMER_SLACK_S = 0.001
    IDLE_PARK_PROBES = 400

    def __init__(self, target_ms: float, min_bytes: int = 64 * 1024) -> None:
        self.target_s = target_ms / 1000
        self.min_bytes = min_bytes
        self.lag_s = 0.0
        self.cpu_wait = 0.0  # the loop thread's recent share of time waiting for a CPU
        self.delayed = 0  # large requests held back, since the last report
        self._due = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._run_queue: RunQueueWait | None = None
        self._started = False
        self._parked = False
        self._asked = False  # a request asked hold_for since the last probe
        self._quiet_probes = 0

    def start(self) -> None:
        """On the loop's thread: its own CPU waits are measured."""
        if self.target_s > 0 and not self._started:
            self._started = True
            self._run_queue = RunQueueWait()
            self._arm()

    def stop(self) -> None:
        self._started = self._parked = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._run_queue is not None:
            self._run_queue.close()
            self._run_queue = None

    @property
    def parked(self) -> bool:
        """No client request asked for 2 s: the probe waits for the next one."""
        return self._parked

    def hold_for(self, size: int, held_s: float) -> float:
        """Seconds a client request of `size` bytes, held back for `held_s` already, should wait
        before it starts: 0 to start now."""
        self._asked = True
        if self._parked:
            self._parked = False
            self._arm()
            return 0.0
        if size < self.min_bytes or self.lag_s <= self.target_s or not self._started or held_s >= self.MAX_HOLD_S:
            return 0.0
        if not held_s:
            self.delayed += 1
        return min(self.lag_s * self.MUTE_FACTOR, self.MAX_MUTE_S, self.MAX_HOLD_S - held_s)

    def _arm(self) -> None:
        self._due = time.perf_counter() + self.PROBE_S
        self._timer = asyncio.get_running_loop().call_later(self.PROBE_S, self._probe)

    def _probe(self) -> None:
        late = max(0.0, time.perf_counter() - self._due - self.TIMER_SLACK_S)
        share = self._run_queue.share() if self._run_queue is not None else None
        if share is not None:
            w = self.CONTENTION_WEIGHT
            self.cpu_wait = self.cpu_wait * (1 - w) + share * w
        self.lag_s = max(late, self.lag_s * self.decay())
        if self._asked:
            self._asked, self._quiet_probes = False, 0
        else:
            self._quiet_probes += 1
            if self._quiet_probes >= self.IDLE_PARK_PROBES:
                # nothing to admit for 2 s: park until a request comes (see the class doc)
                self._parked, self._timer, self._quiet_probes, self.lag_s = True, None, 0, 0.0
                return
        self._arm()

    def decay(self) -> float:
        """The lag's decay per probe: slower the more the loop thread waits for a CPU."""
        contended = min(1.0, max(0.0, (self.cpu_wait - self.UNCONTENDED) / (self.CONTENDED - self.UNCONTENDED)))
        return self.FAST_DECAY + (self.SLOW_DECAY - self.FAST_DECAY) * contended


class RunQueueWait:
    """The calling thread's share of time spent runnable but not running (waiting for a CPU),
    between calls of share(), from /proc/thread-self/schedstat (its second field, in ns). Where
    the kernel does not expose it, share() is None and admission goes by the lag alone."""

    PATH = "/proc/thread-self/schedstat"

    def __init__(self) -> None:
        try:
            self._fd: int | None = os.open(self.PATH, os.O_RDONLY)  # this thread's, for good
        except OSError:
            self._fd = None
        self._last = self._read()

    def _read(self) -> tuple[float, int] | None:
        if self._fd is None:
            return None
        try:
            fields = os.pread(self._fd, 128, 0).split()
            return time.perf_counter(), int(fields[1])
        except (OSError, ValueError, IndexError):
            self.close()
            return None

    def share(self) -> float | None:
        now = self._read()
        last, self._last = self._last, now
        if now is None or last is None or now[0] <= last[0]:
            return None
        return min(1.0, max(0.0, (now[1] - last[1]) / 1e9 / (now[0] - last[0])))

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
