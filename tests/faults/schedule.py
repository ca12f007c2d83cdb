"""Seeded fault schedules: which node gets which fault when, and the code that applies them to a
running tools.cluster.Cluster. The same seed gives the same plan; the plan is printed so a
failing run can be replayed.

Faults:
- kill: kill -9, restarted after `hold` seconds (a crash and a reboot);
- pause: SIGSTOP for `hold` seconds, then SIGCONT (a long GC pause, a stalled VM): its
  connections stay open, so the cluster waits out its session (see README, broker failure detection);
- term: SIGTERM and a restart (a rolling restart's controlled shutdown).
Faults may overlap (Jepsen mixes them); a node already under a fault is skipped.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from dataclasses import dataclass

from tools.cluster import Cluster, ClusterError

KINDS = ("kill", "pause", "term")


@dataclass(frozen=True)
class Fault:
    at: float  # seconds after the start
    kind: str
    node: int
    hold: float  # seconds until healed (restart, SIGCONT)

    def __str__(self) -> str:
        return f"{self.at:6.1f}s {self.kind:5} node {self.node} for {self.hold:.1f}s"


def plan(seed: int, seconds: float, nodes: list[int], faults: int, max_hold: float = 8.0) -> list[Fault]:
    """`faults` faults spread over `seconds` (none in the last fifth: the run ends healed)."""
    rng = random.Random(seed)
    window = seconds * 0.8
    out = []
    for _ in range(faults):
        out.append(Fault(at=round(rng.uniform(1.0, window), 1), kind=rng.choice(KINDS), node=rng.choice(nodes),
                         hold=round(rng.uniform(1.0, max_hold), 1)))
    return sorted(out, key=lambda f: f.at)


class Nemesis:
    """Applies a plan to a cluster on a thread; heal() undoes whatever is still in effect."""

    def __init__(self, cluster: Cluster, faults: list[Fault], say=print) -> None:
        self.cluster = cluster
        self.faults = faults
        self.say = say
        self.applied: list[str] = []
        self._busy: set[int] = set()
        self._paused: set[int] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.errors: list[str] = []

    def start(self) -> None:
        t0 = time.monotonic()
        for f in self.faults:
            th = threading.Thread(target=self._run, args=(f, t0), daemon=True)
            th.start()
            self._threads.append(th)

    def _run(self, f: Fault, t0: float) -> None:
        if self._stop.wait(max(0.0, t0 + f.at - time.monotonic())):
            return
        with self._lock:
            if f.node in self._busy:
                return
            self._busy.add(f.node)
        try:
            self._apply(f)
        except (ClusterError, OSError) as e:
            self.errors.append(f"{f}: {e}")
        finally:
            with self._lock:
                self._busy.discard(f.node)

    def _apply(self, f: Fault) -> None:
        c = self.cluster
        self.applied.append(str(f))
        self.say(f"nemesis: {f}")
        if f.kind == "pause":
            pid = c.pid(f.node)
            if pid is None:
                return
            os.kill(pid, signal.SIGSTOP)
            self._paused.add(f.node)
            self._stop.wait(f.hold)
            self._resume(f.node)
            return
        if f.kind == "kill":
            c.kill(f.node)
        else:
            c.terminate(f.node)
        self._stop.wait(f.hold)
        c.start_node(f.node, timeout=120)

    def _resume(self, node: int) -> None:
        pid = self.cluster.pid(node)
        if node in self._paused and pid is not None:
            os.kill(pid, signal.SIGCONT)
        self._paused.discard(node)

    def heal(self) -> None:
        """Stop scheduling; resume paused nodes; start any node left down."""
        self._stop.set()
        for node in list(self._paused):
            self._resume(node)
        for th in self._threads:
            th.join(timeout=180)
        for node in [*self.cluster.controller_ids, *self.cluster.broker_ids]:
            if not self.cluster.is_running(node):
                self.cluster.start_node(node, timeout=120)
