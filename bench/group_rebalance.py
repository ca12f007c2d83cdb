"""How long a consumer group takes to settle after one member joins, three ways in the same run:
the classic protocol with an eager assignor (range: every member gives up everything and
rejoins), the classic protocol with cooperative-sticky (KIP-429: two rebalances, only the moved
partitions stop), and the KIP-848 consumer protocol (the coordinator assigns; members heartbeat
their way to the new target, revoking before the new owner gets a partition).

    .venv/bin/python bench/group_rebalance.py            # about two minutes on 2 cores
    .venv/bin/python bench/group_rebalance.py --members 4 --runs 1 --partitions 8   # quick

One Strata broker (tools.cluster.Cluster in a temp dir); confluent-kafka (librdkafka) consumers,
one thread each, subscribed to one topic of `--partitions` partitions. `--members` - 1 members
settle first; then one more starts, and the time runs from its start until the members' own
views (their on_assign / on_revoke callbacks) hold every partition exactly once with every member
holding some, and the coordinator agrees. Heartbeats are 1 s for all three (classic
heartbeat.interval.ms, the broker's group.consumer.heartbeat.interval.ms). Prints the median and
min-max of `--runs` for each, and how many partitions stopped (were revoked from a member) per join.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tools.cluster import Cluster  # noqa: E402

HEARTBEAT_MS = 1000
KINDS = {
    "classic eager (range)": {"partition.assignment.strategy": "range"},
    "classic cooperative-sticky": {"partition.assignment.strategy": "cooperative-sticky"},
    "consumer (KIP-848)": {"group.protocol": "consumer"},
}


class Member(threading.Thread):
    def __init__(self, bootstrap: str, group: str, topic: str, extra: dict) -> None:
        super().__init__(daemon=True)
        self.conf = {"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                     "enable.auto.commit": False, **extra}
        if extra.get("group.protocol") != "consumer":
            self.conf.update({"heartbeat.interval.ms": HEARTBEAT_MS, "session.timeout.ms": 10000})
        self.topic = topic
        self.owned: set[int] = set()
        self.revoked = 0
        self.cooperative = extra.get("partition.assignment.strategy") == "cooperative-sticky" or \
            extra.get("group.protocol") == "consumer"
        self.stop = threading.Event()

    def run(self) -> None:
        from confluent_kafka import Consumer

        c = Consumer(self.conf)

        def assign(consumer, ps) -> None:  # noqa: ANN001
            if self.cooperative:
                consumer.incremental_assign(ps)
                self.owned |= {p.partition for p in ps}
            else:
                consumer.assign(ps)
                self.owned = {p.partition for p in ps}

        def revoke(consumer, ps) -> None:  # noqa: ANN001
            self.revoked += len(ps)
            if self.cooperative:
                consumer.incremental_unassign(ps)
                self.owned -= {p.partition for p in ps}
            else:
                consumer.unassign()
                self.owned = set()

        c.subscribe([self.topic], on_assign=assign, on_revoke=revoke)
        try:
            while not self.stop.is_set():
                c.poll(0.05)
        finally:
            c.close()


def settled(members: list[Member], partitions: int) -> bool:
    views = [set(m.owned) for m in members]
    return all(views) and sum(len(v) for v in views) == partitions and set().union(*views) == set(range(partitions))


def one_run(c: Cluster, kind: str, run: int, n: int, partitions: int) -> tuple[float, int]:
    from confluent_kafka.admin import AdminClient, NewTopic

    topic, group = f"rebalance-{run}-{len(kind)}-{time.monotonic_ns()}", f"g-{run}-{time.monotonic_ns()}"
    admin = AdminClient({"bootstrap.servers": c.bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)
    members = [Member(c.bootstrap, group, topic, KINDS[kind]) for _ in range(n - 1)]
    try:
        for m in members:
            m.start()
        deadline = time.monotonic() + 120
        while not settled(members, partitions):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{kind}: {n - 1} members never settled")
            time.sleep(0.02)
        time.sleep(2 * HEARTBEAT_MS / 1000)  # quiet
        before = sum(m.revoked for m in members)
        new = Member(c.bootstrap, group, topic, KINDS[kind])
        t0 = time.monotonic()
        new.start()
        members.append(new)
        while not settled(members, partitions):
            if time.monotonic() - t0 > 120:
                raise RuntimeError(f"{kind}: never settled after the join")
            time.sleep(0.005)
        return time.monotonic() - t0, sum(m.revoked for m in members) - before
    finally:
        for m in members:
            m.stop.set()
        for m in members:
            m.join(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--members", type=int, default=10, help="the group's size once the last member joined")
    ap.add_argument("--partitions", type=int, default=20)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-rebalance-") as tmp:
        c = Cluster(Path(tmp), brokers=1, verbose=False, broker_overrides={
            "group.initial.rebalance.delay.ms": 0, "offsets.topic.num.partitions": 1,
            "offsets.topic.replication.factor": 1, "group.consumer.heartbeat.interval.ms": HEARTBEAT_MS,
            "group.consumer.min.heartbeat.interval.ms": HEARTBEAT_MS})  # checked at startup, as Kafka
        c.start(timeout=60)
        try:
            results: dict[str, list[tuple[float, int]]] = {k: [] for k in KINDS}
            for run in range(a.runs):  # interleaved: run i of each before run i+1 of any
                for kind in KINDS:
                    results[kind].append(one_run(c, kind, run, a.members, a.partitions))
        finally:
            c.stop()
    print(f"\n{a.members - 1} -> {a.members} members, {a.partitions} partitions, heartbeat {HEARTBEAT_MS} ms, "
          f"{a.runs} runs")
    print(f"{'protocol':<30} {'settle s (median)':>18} {'min-max':>14} {'partitions stopped':>19}")
    for kind, rows in results.items():
        times = [t for t, _ in rows]
        stopped = statistics.median(s for _, s in rows)
        print(f"{kind:<30} {statistics.median(times):>18.2f} {min(times):>6.2f}-{max(times):<7.2f} {stopped:>19.0f}")


if __name__ == "__main__":
    main()
