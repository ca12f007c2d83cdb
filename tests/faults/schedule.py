"""Seeded fault schedules: which node gets which fault when, and the code that applies them to a
running tools.cluster.Cluster. The same seed gives the same plan; the plan is printed so a
failing run can be replayed.

Faults:
- kill: kill -9, restarted after `hold` seconds (a crash and a reboot);
- pause: SIGSTOP for `hold` seconds, then SIGCONT (a long GC pause, a stalled VM): its
  connections stay open, so the cluster waits out its session (see README, broker failure detection);
- term: SIGTERM and a restart (a rolling restart's controlled shutdown);
- isolate: a network partition between the node and the controller quorum for `hold` seconds
  (every proxied link to or from a voter that touches it is cut: see wire_links): a broker keeps
  its clients and its replication links, and is fenced once its session runs out.
- store: the diskless topics' object store stops answering for `hold` seconds (its server's
  processes paused; the fault's node is 0).
- slowstore: every answer of the object store comes SLOW_STORE_S late for `hold` seconds (a TCP
  proxy in front of it, tests/tcp_proxy.py; node 0).
- slow: every write and fsync to one of the broker's log dirs (a FUSE passthrough, see
  tests/faults/disks.py) takes SLOW_DISK_S longer for `hold` seconds;
- full: that log dir's filesystem (a tmpfs) fills up: the broker takes the dir offline at its
  next write there (ENOSPC, as any disk error: Kafka's LogDirFailureChannel) and its replicas
  there move away; after `hold` seconds the filler is deleted and the broker restarted (SIGTERM),
  as an operator freeing the disk would;
- split: a network partition between the broker and the other brokers for `hold` seconds
  (tests/faults/split.py): it keeps its clients and the controller, and loses its replication links.
- clock: the broker's wall clock jumps by `size` seconds (forward or back, 1 to 60 minutes) and
  back after `hold` seconds (tests/faults/clock.py), as two NTP steps would move it.
Faults may overlap (Jepsen mixes them); a node already under a fault is skipped.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from tests.tcp_proxy import TcpProxy
from tools.cluster import Cluster, ClusterError, is_controller_id

KINDS = ("kill", "pause", "term")
WITH_LINKS = (*KINDS, "isolate")
STORE = "store"
SLOW = "slow"
FULL = "full"
SPLIT = "split"
CLOCK = "clock"
SLOW_STORE = "slowstore"
SLOW_DISK_S = 0.2  # added to each write and fsync of a slow disk
SLOW_STORE_S = 1.0  # added to each answer of a slow object store


class Disk(Protocol):
    """A log dir a fault can slow down or fill, and bring back (tests/faults/disks.BrokerDisk)."""

    def slow_down(self, delay: float) -> None: ...

    def speed_up(self) -> None: ...

    def fill(self) -> None: ...

    def free(self) -> None: ...


class StoreLag(Protocol):
    """An object store a fault can make slow to answer (a TcpProxy in front of it: `delay`)."""

    delay: float


class Split(Protocol):
    """Network partitions of one broker from the others (tests/faults/split.BrokerSplit)."""

    def cut(self, b: int) -> None: ...

    def heal(self, b: int) -> None: ...


class Clocks(Protocol):
    """Wall-clock jumps of one broker (tests/faults/clock.ClockShifts)."""

    def jump(self, b: int, seconds: float) -> None: ...

    def reset(self, b: int) -> None: ...


class StoreSwitch(Protocol):
    """An object store a fault can take down and bring back."""

    def stop(self) -> None: ...

    def start(self) -> None: ...


@dataclass(frozen=True)
class Fault:
    at: float  # seconds after the start
    kind: str
    node: int
    hold: float  # seconds until healed (restart, SIGCONT)
    size: float = 0.0  # a clock jump's seconds

    def __str__(self) -> str:
        jump = f" by {self.size:+.0f}s" if self.kind == CLOCK else ""
        return f"{self.at:6.1f}s {self.kind:5} node {self.node}{jump} for {self.hold:.1f}s"


def plan(seed: int, seconds: float, nodes: list[int], faults: int, max_hold: float = 8.0,
         kinds: tuple[str, ...] = KINDS) -> list[Fault]:
    """`faults` faults spread over `seconds` (none in the last fifth: the run ends healed)."""
    rng = random.Random(seed)
    window = seconds * 0.8
    out = []
    for _ in range(faults):
        at, kind = round(rng.uniform(1.0, window), 1), rng.choice(kinds)
        # disk faults, splits between brokers and clock jumps are broker faults: drawn among the brokers
        node = rng.choice([n for n in nodes if not is_controller_id(n)] if kind in (SLOW, FULL, SPLIT, CLOCK) else nodes)
        hold = round(rng.uniform(1.0, max_hold), 1)
        size = round(rng.choice((-1, 1)) * rng.uniform(60, 3600)) if kind == CLOCK else 0.0
        out.append(Fault(at=at, kind=kind, node=0 if kind in (STORE, SLOW_STORE) else node, hold=hold, size=size))
    return sorted(out, key=lambda f: f.at)


def wire_links(c: Cluster) -> dict[int, list[TcpProxy]]:
    """Before the cluster starts: every node reaches every voter (other than itself) through a
    proxy of its own, so one node can be cut off from the quorum. Returns, per node id, the links
    that touch it (its own to the voters, and, for a voter, every other node's to it)."""
    touching: dict[int, list[TcpProxy]] = defaultdict(list)
    for a in [*c.controller_ids, *c.broker_ids]:
        ends = []
        for v in c.controller_ids:
            if a == v:
                ends.append(f"{v}@{c.host}:{c.ports[v]}")
                continue
            link = TcpProxy(c.host, c.ports[v])
            touching[a].append(link)
            touching[v].append(link)
            ends.append(f"{v}@{c.host}:{link.port}")
        over = {"controller.quorum.voters": ",".join(ends)}
        overrides = c.per_controller_overrides if a in c.controller_ids else c.per_broker_overrides
        overrides.setdefault(a, {}).update(over)
    return dict(touching)


class Nemesis:
    """Applies a plan to a cluster on a thread; heal() undoes whatever is still in effect."""

    def __init__(self, cluster: Cluster, faults: list[Fault], say=print,
                 links: dict[int, list[TcpProxy]] | None = None, store: StoreSwitch | None = None,
                 disks: dict[int, Disk] | None = None, split: Split | None = None,
                 clocks: Clocks | None = None, store_lag: StoreLag | None = None) -> None:
        self.cluster = cluster
        self.faults = faults
        self.links = links or {}
        self.store = store
        self.disks = disks or {}
        self.split = split
        self.clocks = clocks
        self.store_lag = store_lag
        self._undo: dict[tuple[str, int], Callable[[], None]] = {}  # the lasting faults in effect
        self._store_down = False
        self._cut: set[int] = set()
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
        if f.kind == "isolate":
            self._isolate(f.node, True)
            self._stop.wait(f.hold)
            self._isolate(f.node, False)
            return
        if f.kind in (SLOW, FULL) and f.node in self.disks:
            disk = self.disks[f.node]
            if f.kind == SLOW:
                self._hold(f, lambda: disk.slow_down(SLOW_DISK_S), disk.speed_up)
            else:
                self._hold(f, disk.fill, lambda: self._free(f.node, disk))
            return
        if f.kind == SPLIT and self.split is not None and f.node in c.broker_ids:
            split = self.split
            self._hold(f, lambda: split.cut(f.node), lambda: split.heal(f.node))
            return
        if f.kind == CLOCK and self.clocks is not None and f.node in c.broker_ids:
            clocks = self.clocks
            self._hold(f, lambda: clocks.jump(f.node, f.size), lambda: clocks.reset(f.node))
            return
        if f.kind == SLOW_STORE and self.store_lag is not None:
            lag = self.store_lag
            self._hold(f, lambda: setattr(lag, "delay", SLOW_STORE_S), lambda: setattr(lag, "delay", 0.0))
            return
        if f.kind in (SLOW, FULL, SPLIT, CLOCK, SLOW_STORE):
            return  # not wired for this run
        if f.kind == STORE:
            if self.store is None:
                return
            self._store_down = True
            self.store.stop()
            self._stop.wait(f.hold)
            self._store_up()
            return
        if f.kind == "kill":
            c.kill(f.node)
        else:
            c.terminate(f.node)
        self._stop.wait(f.hold)
        c.start_node(f.node, timeout=120)

    def _isolate(self, node: int, cut: bool) -> None:
        with self._lock:
            if cut:
                self._cut.add(node)
            else:
                self._cut.discard(node)
            cut_nodes = set(self._cut)
        for link in self.links.get(node, []):
            if cut:
                link.cut()
            elif not any(link in self.links.get(n, []) for n in cut_nodes):  # not still cut by another fault
                link.heal()

    def _hold(self, f: Fault, start: Callable[[], None], undo: Callable[[], None]) -> None:
        """Apply a fault for `f.hold` seconds, then undo it (or heal() does, if it comes first)."""
        key = (f.kind, f.node)
        with self._lock:
            self._undo[key] = undo
        start()
        self._stop.wait(f.hold)
        self._end(key)

    def _end(self, key: tuple[str, int]) -> None:
        with self._lock:
            undo = self._undo.pop(key, None)
        if undo is not None:
            undo()

    def _free(self, node: int, disk: Disk) -> None:
        """Free the full disk, and restart its broker: the dir it took offline comes back only so."""
        disk.free()
        if self.cluster.is_running(node):
            self.cluster.terminate(node)
        self.cluster.start_node(node, timeout=120)

    def _resume(self, node: int) -> None:
        pid = self.cluster.pid(node)
        if node in self._paused and pid is not None:
            os.kill(pid, signal.SIGCONT)
        self._paused.discard(node)

    def _store_up(self) -> None:
        with self._lock:
            down, self._store_down = self._store_down, False
        if down and self.store is not None:
            self.store.start()

    def heal(self) -> None:
        """Stop scheduling; resume paused nodes; start any node left down."""
        self._stop.set()
        self._store_up()
        for node in list(self._paused):
            self._resume(node)
        for node in list(self._cut):
            self._isolate(node, False)
        for key in list(self._undo):
            self._end(key)
        for th in self._threads:
            th.join(timeout=180)
        for node in [*self.cluster.controller_ids, *self.cluster.broker_ids]:
            if not self.cluster.is_running(node):
                self.cluster.start_node(node, timeout=120)
