"""Records/s through a share group (KIP-932) of 1, 2 and 4 members reading one partition, beside a
classic consumer reading the same partition, in the same run.

    .venv/bin/python bench/share_groups.py                   # 200,000 records of 100 B
    .venv/bin/python bench/share_groups.py --records 20000   # quick

One Strata broker (tools.cluster.Cluster in a temp dir). The topic (one partition) is filled once;
each reader then reads all of it from the start: a classic librdkafka Consumer (auto.offset.reset
earliest, no commits), and share groups of N librdkafka ShareConsumers (a fresh group each, its
share.auto.offset.reset set to earliest; implicit acknowledgement, so each poll accepts the
records of the one before; one thread per member). The time runs from the first record read to
the last (joining the group is left out); the rate is records over that time. A share group's members share one
partition: what the figures show is how far the queue's per-record bookkeeping (acquisition,
locks, acknowledgements written to the share coordinator) costs against a plain Fetch, and
whether more members read faster.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tools.cluster import Cluster  # noqa: E402

TOPIC = "bench-share"


def fill(bootstrap: str, n: int, size: int) -> None:
    from confluent_kafka import Producer
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1 << 20, "acks": 1})
    value = b"x" * size
    for i in range(n):
        while True:
            try:
                p.produce(TOPIC, value=value, key=str(i).encode())
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(60) == 0


def classic(bootstrap: str, n: int) -> float:
    from confluent_kafka import Consumer
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-classic", "auto.offset.reset": "earliest",
                  "enable.auto.commit": False})
    c.subscribe([TOPIC])
    got = 0
    first = 0.0
    while got < n:
        for m in c.consume(1000, 1.0):
            if m.error() is None:
                got += 1
                first = first or time.perf_counter()
    elapsed = time.perf_counter() - first
    c.close()
    return n / elapsed


def earliest(bootstrap: str, group: str) -> None:
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType
    admin = AdminClient({"bootstrap.servers": bootstrap})
    res = ConfigResource(ResourceType.GROUP, group, incremental_configs=[
        ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)])
    for f in admin.incremental_alter_configs([res]).values():
        f.result(30)


def share(bootstrap: str, n: int, members: int) -> tuple[float, list[int]]:
    from confluent_kafka import ShareConsumer
    group = f"bench-share-{members}"
    earliest(bootstrap, group)
    counts = [0] * members
    lock = threading.Lock()
    done = threading.Event()
    seen: set[int] = set()
    first: list[float] = []

    def member(i: int) -> None:
        sc = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group})
        sc.subscribe([TOPIC])
        try:
            while not done.is_set():
                batch = [m for m in sc.poll(0.5) if m.error() is None]
                with lock:
                    if batch and not first:
                        first.append(time.perf_counter())
                    counts[i] += len(batch)
                    seen.update(m.offset() for m in batch)
                    if len(seen) >= n:
                        done.set()
            sc.commit_sync(30)
        finally:
            sc.close()

    threads = [threading.Thread(target=member, args=(i,), daemon=True) for i in range(members)]
    for t in threads:
        t.start()
    done.wait(600)
    elapsed = time.perf_counter() - first[0]
    for t in threads:
        t.join(60)
    return n / elapsed, counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=100, help="value bytes")
    ap.add_argument("--members", default="1,2,4", help="share group sizes")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-share-") as d:
        c = Cluster(Path(d), brokers=1, verbose=False, broker_overrides={
            "offsets.topic.num.partitions": 1, "offsets.topic.replication.factor": 1,
            "share.coordinator.state.topic.num.partitions": 1, "share.coordinator.state.topic.replication.factor": 1,
            "share.coordinator.state.topic.min.isr": 1})
        c.start(timeout=60)
        try:
            from confluent_kafka.admin import AdminClient, NewTopic
            admin = AdminClient({"bootstrap.servers": c.bootstrap})  # alive until the result is in
            admin.create_topics([NewTopic(TOPIC, 1, 1)])[TOPIC].result(30)
            fill(c.bootstrap, a.records, a.size)
            rows = [("classic consumer", classic(c.bootstrap, a.records), "")]
            for k in (int(x) for x in a.members.split(",")):
                rate, counts = share(c.bootstrap, a.records, k)
                rows.append((f"share group, {k} member{'s' if k > 1 else ''}", rate, "/".join(map(str, counts))))
        finally:
            c.stop()
    print(f"\n{a.records:,} records of {a.size} B on one partition, one broker\n")
    print(f"{'reader':<26} {'records/s':>12}  records per member")
    for name, rate, counts in rows:
        print(f"{name:<26} {rate:>12,.0f}  {counts}")


if __name__ == "__main__":
    main()
