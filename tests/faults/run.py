"""One fault run: a topic (and, with `diskless`, a diskless topic beside it, KIP-1164), the
workload on each, a seeded nemesis, healing, the final reads and the checker's verdict on each
topic's history. Used by tests/test_faults.py (short) and bench/faults.py (long)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient, NewTopic

from tests.faults.checker import History, anomalies, check, summary
from tests.faults.clock import ClockShifts
from tests.faults.disks import broker_disks
from tests.faults.schedule import (
    CLOCK,
    FULL,
    KINDS,
    SLOW,
    SLOW_STORE,
    SPLIT,
    STORE,
    WITH_LINKS,
    Clocks,
    Disk,
    Fault,
    Nemesis,
    Split,
    StoreLag,
    StoreSwitch,
    plan,
)
from tests.faults.split import BrokerSplit
from tests.faults.workload import QUIET, Workload
from tests.tcp_proxy import TcpProxy
from tools.cluster import Cluster

TOPIC = "faults"
DISKLESS_TOPIC = "faults-diskless"
# what a cluster needs to serve diskless topics in a fault run (beside the store's own settings)
DISKLESS_BROKER = {"diskless.metadata.topic.num.partitions": "3", "diskless.wal.max.ms": "50"}
DISKLESS_CONTROLLER = {"diskless.metadata.topic.num.partitions": "3"}


@dataclass
class Outcome:
    seed: int
    faults: list[Fault]
    applied: list[str]
    history: History
    result: dict[str, list]
    delivery_errors: dict[str, int]
    seconds: float
    by_topic: dict[str, tuple[History, dict[str, list]]]  # every topic's history and verdict

    @property
    def anomalies(self) -> int:
        return sum(anomalies(result) for _, result in self.by_topic.values())

    def summary(self) -> str:
        return "; ".join(f"{t}: {summary(r)}" for t, (_, r) in self.by_topic.items())


def run_schedule(cluster: Cluster, seed: int, seconds: float, faults: int, *, partitions: int = 3,
                 say: Callable[[str], None] = print, replay: str = "",
                 links: dict[int, list[TcpProxy]] | None = None, diskless: bool = False,
                 store: StoreSwitch | None = None, read_process_write: bool = False,
                 disks: dict[int, Disk] | None = None, split: Split | None = None,
                 clocks: Clocks | None = None, store_lag: StoreLag | None = None,
                 kinds: tuple[str, ...] | None = None) -> Outcome:
    """`links` (schedule.wire_links, before the cluster started) adds network partitions;
    `diskless` a diskless topic under the same workload (the cluster configured for it:
    DISKLESS_BROKER, DISKLESS_CONTROLLER and a store); `store` outages of that store;
    `read_process_write` the workload's read-process-write transactions (Workload). Made before
    the cluster starts: `disks` (disks.broker_disks) slow and full disks, `split`
    (split.BrokerSplit) partitions between brokers, `clocks` (clock.ClockShifts) wall-clock
    jumps; `store_lag` (a TcpProxy in front of the object store) slow store answers. `kinds` the faults to draw from (default: all those wired)."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap, **QUIET})
    rf = min(3, len(cluster.broker_ids))
    topics = {TOPIC: NewTopic(TOPIC, partitions, rf, config={"min.insync.replicas": str(min(2, rf))})}
    if diskless:
        topics[DISKLESS_TOPIC] = NewTopic(DISKLESS_TOPIC, partitions, rf, config={"diskless.enable": "true"})
    for future in admin.create_topics(list(topics.values())).values():
        future.result(60)
    nodes = list(cluster.broker_ids) + (list(cluster.controller_ids) if len(cluster.controller_ids) >= 3 else [])
    if kinds is None:
        kinds = ((WITH_LINKS if links else KINDS) + ((STORE,) if store is not None else ())
                 + ((SLOW, FULL) if disks else ()) + ((SPLIT,) if split is not None else ())
                 + ((CLOCK,) if clocks is not None else ()) + ((SLOW_STORE,) if store_lag is not None else ()))
    schedule = plan(seed, seconds, nodes, faults, kinds=kinds)
    say(f"fault schedule seed={seed} seconds={seconds:.0f} faults={faults} topics={','.join(topics)}"
        + (f"; replay: {replay}" if replay else ""))
    for f in schedule:
        say(f"  {f}")
    works = {name: Workload(cluster.bootstrap, name, partitions, seed=seed, read_process_write=read_process_write)
             for name in topics}
    nemesis = Nemesis(cluster, schedule, say, links, store, disks, split, clocks, store_lag)
    t0 = time.monotonic()
    for work in works.values():
        work.start()
    nemesis.start()
    time.sleep(seconds)
    nemesis.heal()
    for work in works.values():
        work.stop()
    by_topic = {}
    for name, work in works.items():
        work.final_read()
        by_topic[name] = (work.history, check(work.history))
    main = works[TOPIC]
    errors = sum((Counter(w.delivery_errors) for w in works.values()), Counter())
    return Outcome(seed, schedule, nemesis.applied, main.history, by_topic[TOPIC][1], dict(errors),
                   time.monotonic() - t0, by_topic)


def wire_broker_faults(c: Cluster, stack: ExitStack, work: Path, *, disks: bool = True, split: bool = True,
                       clocks: bool = True) -> dict[str, Any]:
    """Before `c` starts: its brokers' fault fixtures (disks.broker_disks, split.BrokerSplit,
    clock.ClockShifts), undone when `stack` closes, the cluster stopped first so the brokers leave
    their mounts before they go. Returns run_schedule's keyword arguments for them."""
    out: dict[str, Any] = {"disks": broker_disks(c, stack) if disks else {}, "split": None, "clocks": None}
    if split:
        out["split"] = BrokerSplit(c)
        stack.callback(out["split"].close)
    if clocks:
        out["clocks"] = ClockShifts(c, work / "clock")
    stack.callback(c.stop)
    return out
