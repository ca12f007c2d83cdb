"""Records/s through a share group (KIP-932) of 1, 2 and 4 members reading one partition, beside a
classic consumer reading the same partition, in the same run.

    .venv/bin/python bench/share_groups.py                   # 200,000 records of 100 B
    .venv/bin/python bench/share_groups.py --records 20000   # quick
    .venv/bin/python bench/share_groups.py --diskless        # a diskless topic, 2 brokers

One Strata broker (tools.cluster.Cluster in a temp dir). The topic (one partition) is filled once;
each reader then reads all of it from the start: a classic librdkafka Consumer (auto.offset.reset
earliest, no commits), and share groups of N librdkafka ShareConsumers (a fresh group each, its
share.auto.offset.reset set to earliest; implicit acknowledgement, so each poll accepts the
records of the one before; one thread per member). The time runs from the first record read to
the last (joining the group is left out); the rate is records over that time. A share group's members share one
partition: what the figures show is how far the queue's per-record bookkeeping (acquisition,
locks, acknowledgements written to the share coordinator) costs against a plain Fetch, and
whether more members read faster.

With --diskless: two brokers in two racks (local directory object store) and a diskless topic
whose share-partitions broker 2 holds (the metadata image's leader). The same reads, the classic
consumer and one member sent to broker 2 (the holder: acquisitions are calls), one member sent to
broker 1 (it reads the records itself and forwards each acquisition and acknowledgement to broker
2, SharePartitionForward), and two members, one on each: what forwarding costs.
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


def classic(bootstrap: str, n: int, client_id: str = "rdkafka") -> float:
    from confluent_kafka import Consumer
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-classic", "auto.offset.reset": "earliest",
                  "enable.auto.commit": False, "client.id": client_id})
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


def share(bootstrap: str, n: int, members: int, client_ids: list[str] | None = None,
          group: str = "") -> tuple[float, list[int]]:
    """`client_ids`: one per member (a diskless topic's Metadata answer follows the rack one names)."""
    from confluent_kafka import ShareConsumer
    group = group or f"bench-share-{members}"
    earliest(bootstrap, group)
    counts = [0] * members
    lock = threading.Lock()
    done = threading.Event()
    seen: set[int] = set()
    first: list[float] = []

    def member(i: int) -> None:
        sc = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group,
                            "client.id": client_ids[i] if client_ids else "rdkafka"})
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
    ap.add_argument("--diskless", action="store_true", help="a diskless topic read through the holder and another broker")
    a = ap.parse_args()
    if a.diskless:
        return diskless(a)
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



def diskless(a: argparse.Namespace) -> None:
    racks = {1: "r1", 2: "r2"}
    via = {b: f"bench-diskless_az={r}" for b, r in racks.items()}  # Metadata names that rack's broker
    with tempfile.TemporaryDirectory(prefix="bench-share-") as d:
        c = Cluster(Path(d), brokers=2, verbose=False, broker_overrides={
            "offsets.topic.num.partitions": 1, "offsets.topic.replication.factor": 2,
            "share.coordinator.state.topic.num.partitions": 1, "share.coordinator.state.topic.replication.factor": 2,
            "share.coordinator.state.topic.min.isr": 1, "diskless.metadata.topic.num.partitions": 1,
            "diskless.storage.url": f"file://{Path(d) / 'objects'}"},
            controller_overrides={"diskless.metadata.topic.num.partitions": 1},
            per_broker_overrides={b: {"broker.rack": r} for b, r in racks.items()})
        c.start(timeout=60)
        try:
            from confluent_kafka.admin import AdminClient, NewTopic
            admin = AdminClient({"bootstrap.servers": c.bootstrap})  # alive until the result is in
            admin.create_topics([NewTopic(TOPIC, 1, replica_assignment=[[2, 1]], config={"diskless.enable": "true"})]
                                )[TOPIC].result(30)
            fill(c.bootstrap, a.records, a.size)
            rows = [("classic consumer, broker 1", classic(c.bootstrap, a.records, via[1]), "")]
            for name, ids in (("share, 1 member on holder", [via[2]]), ("share, 1 member forwarded", [via[1]]),
                              ("share, 2 members, 1 each", [via[1], via[2]])):
                rate, counts = share(c.bootstrap, a.records, len(ids), ids, group=f"bench-{len(rows)}")
                rows.append((name, rate, "/".join(map(str, counts))))
        finally:
            c.stop()
    print(f"\n{a.records:,} records of {a.size} B on one diskless partition, two brokers (broker 2 holds the "
          "share-partition)\n")
    print(f"{'reader':<28} {'records/s':>12}  records per member")
    for name, rate, counts in rows:
        print(f"{name:<28} {rate:>12,.0f}  {counts}")


if __name__ == "__main__":
    main()
