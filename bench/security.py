"""Produce/consume throughput over PLAINTEXT, SSL (TLS) and SASL_SSL (TLS + SCRAM-SHA-512), same
clients, same settings, same run.

Three Strata clusters (tools.cluster.Cluster, 1 controller + --brokers brokers, default 1) are up
for the whole run, one per protocol: every listener of a cluster (clients, brokers to the
controller, brokers to each other) speaks that protocol, with certificates from tools/certs.py
(ECDSA P-256; TLS 1.3 as Python's ssl and librdkafka's OpenSSL agree). The workloads are
bench/produce_consume.py's: confluent-kafka produce (acks=all, linger.ms=5, batch.size=1,000,000)
of --messages values of --size bytes into a fresh topic of --partitions partitions, then consume
them with assign() from 0; run i of every cluster before run i+1 of any. MB/s counts value bytes.
Prints a table; asserts nothing about speed.

    .venv/bin/python bench/security.py [--runs 3] [--messages 200000] [--size 1024] [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.produce_consume import CONSUMER_SETTINGS, Strata, confluent_runs, say, start_system  # noqa: E402

PROTOCOLS = (None, "SSL", "SASL_SSL")  # None: PLAINTEXT


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3, help="runs per workload (median reported)")
    ap.add_argument("--messages", type=int, default=200_000, help="messages per run")
    ap.add_argument("--size", type=int, default=1024, help="value size in bytes")
    ap.add_argument("--brokers", type=int, default=1, help="brokers per cluster (replication min(brokers, 3))")
    ap.add_argument("--partitions", type=int, default=3, help="partitions per topic")
    ap.add_argument("--quick", action="store_true", help="smoke check: 20,000 messages, 1 run")
    args = ap.parse_args()
    args.acks = "all"
    if args.quick:
        args.messages, args.runs = 20_000, 1
    load0 = os.getloadavg()[0]
    systems = []
    with tempfile.TemporaryDirectory(prefix="strata-bench-security-") as tmp:
        try:
            for proto in PROTOCOLS:
                systems.append(start_system(lambda p=proto: Strata(Path(tmp), args.brokers, p), proto or "PLAINTEXT"))
            rows = confluent_runs(systems, args)
        finally:
            for s in systems:
                s.stop()
    base = {r.workload: statistics.median(s.rate for s in r.samples) for r in rows if r.system == "strata"}
    head = f"{'listener':10} {'workload':28} {'MB/s':>8} {'min-max MB/s':>15} {'vs PLAINTEXT':>13} {'runs':>4}"
    print(head)
    print("-" * len(head))
    for r in rows:
        rates = [s.rate * r.size / 1e6 for s in r.samples]
        med = statistics.median(rates)
        rel = med / (base[r.workload] * r.size / 1e6)
        name = "PLAINTEXT" if r.system == "strata" else r.system
        print(f"{name:10} {r.workload:28} {med:8.1f} {min(rates):7.1f}-{max(rates):<7.1f} {rel:12.0%} {len(r.samples):4d}")
    print()
    print(f"machine: nproc {len(os.sched_getaffinity(0))}, python {sys.version.split()[0]}; load average "
          f"{load0:.2f} at start, {os.getloadavg()[0]:.2f} at end")
    print(f"settings: {args.messages:,} msgs x {args.size} B per run, {args.partitions} partitions, {args.brokers} "
          f"broker(s), median of {args.runs} runs; producer acks=all linger.ms=5 batch.size=1000000; consumer "
          + " ".join(f"{k}={v}" for k, v in CONSUMER_SETTINGS.items()))
    say("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
