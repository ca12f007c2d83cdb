"""One fault run: a topic, the workload, a seeded nemesis, healing, the final read and the
checker's verdict. Used by tests/test_faults.py (short) and bench/faults.py (long)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka.admin import AdminClient, NewTopic

from tests.faults.checker import History, anomalies, check
from tests.faults.schedule import KINDS, WITH_LINKS, Fault, Nemesis, plan
from tests.faults.workload import QUIET, Workload
from tests.tcp_proxy import TcpProxy
from tools.cluster import Cluster

TOPIC = "faults"


@dataclass
class Outcome:
    seed: int
    faults: list[Fault]
    applied: list[str]
    history: History
    result: dict[str, list]
    delivery_errors: dict[str, int]
    seconds: float

    @property
    def anomalies(self) -> int:
        return anomalies(self.result)


def run_schedule(cluster: Cluster, seed: int, seconds: float, faults: int, *, partitions: int = 3,
                 say: Callable[[str], None] = print, replay: str = "",
                 links: dict[int, list[TcpProxy]] | None = None) -> Outcome:
    """`links` (schedule.wire_links, before the cluster started) adds network partitions."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap, **QUIET})
    rf = min(3, len(cluster.broker_ids))
    new = NewTopic(TOPIC, partitions, rf, config={"min.insync.replicas": str(min(2, rf))})
    admin.create_topics([new])[TOPIC].result(60)
    nodes = list(cluster.broker_ids) + (list(cluster.controller_ids) if len(cluster.controller_ids) >= 3 else [])
    schedule = plan(seed, seconds, nodes, faults, kinds=WITH_LINKS if links else KINDS)
    say(f"fault schedule seed={seed} seconds={seconds:.0f} faults={faults}" + (f"; replay: {replay}" if replay else ""))
    for f in schedule:
        say(f"  {f}")
    work = Workload(cluster.bootstrap, TOPIC, partitions, seed=seed)
    nemesis = Nemesis(cluster, schedule, say, links)
    t0 = time.monotonic()
    work.start()
    nemesis.start()
    time.sleep(seconds)
    nemesis.heal()
    work.stop()
    work.final_read()
    result = check(work.history)
    return Outcome(seed, schedule, nemesis.applied, work.history, result, dict(work.delivery_errors),
                   time.monotonic() - t0)
