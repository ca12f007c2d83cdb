"""The cost of a request: broker CPU per small Produce and Fetch beside Tansu, idle nodes, large
reads per MB, and RF 3 against RF 1; with --compare REF the same for another tree, same run.

Workloads (each system's round i runs before any system's round i+1; broker CPU is user + system
time of the broker process from /proc, so the machine's load moves it less than it moves rates)
  produce 1-msg pipelined  --requests 1-message Produce requests (acks=all, linger.ms=0,
                           batch.num.messages=1, librdkafka's default in-flight pipelining)
  produce 1-msg sync       --requests/4 requests, each flushed before the next (1 in flight); p50
                           and p99 of the round trip
  fetch caught-up          a consumer at the end of the topic long-polls while a producer sends
                           --requests/4 records one at a time: each Fetch answer carries one
                           record; broker CPU per answer (answers counted by librdkafka's
                           statistics) after taking off the sync round's CPU per produce;
                           at most 20 s (a broker that answers a long poll only at its max wait
                           gets through few records in that time)
  consume MB               100,000 x 1 KiB records produced in one go (3 partitions), then read
                           twice from the start by new consumers 2 s later: CPU per MB consumed
Once per system
  idle                     --idle-seconds with no client: CPU share of the broker and (Strata)
                           the controller
  rf3 (Strata only)        a 3-broker cluster: sync send p50 on an RF 3 topic against an RF 1
                           topic, and 1-message batches with 5 in flight, msg/s RF 3 / RF 1

Prints tables with each system's median (and min-max) and its ratio to the first system (this
tree). Asserts nothing about speed.

    .venv/bin/python bench/request_cost.py [--rounds 3] [--requests 20000] [--idle-seconds 30]
        [--compare REF] [--strata-only] [--skip small,consume,idle,rf3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from confluent_kafka import OFFSET_END, Consumer, Producer, TopicPartition  # noqa: E402
from produce_consume import (  # noqa: E402
    Strata,
    System,
    Tansu,
    create_topic,
    delete_topic,
    extract_tree,
    find_tansu,
    process_cpu_seconds,
    say,
    start_system,
)


def cpu_of(pid: int) -> float:
    return process_cpu_seconds(pid)


@dataclass
class Cell:
    values: list[float] = field(default_factory=list)

    def med(self) -> float:
        return statistics.median(self.values) if self.values else float("nan")

    def span(self, digits: int) -> str:
        if not self.values:
            return "-"
        return f"{min(self.values):.{digits}f}-{max(self.values):.{digits}f}"


def quiet_producer(conf: dict, **extra: object) -> Producer:
    return Producer({**conf, "acks": "all", "linger.ms": 0, "batch.num.messages": 1, "enable.idempotence": False,
                     "log_level": 3, **extra})


def warm_producer(system: System, topic: str, **extra: object) -> Producer:
    """A quiet_producer that has connected and sent one record to partition 0 of `topic`: the
    workload's clock and CPU count start after the leader lookup and the first round trip."""
    p = quiet_producer(system.client_conf(), **extra)
    p.list_topics(topic, timeout=10)
    p.produce(topic, b"w", partition=0)
    p.flush(10)
    return p


def produce_pipelined(system: System, topic: str, n: int) -> float:
    """Broker CPU µs per 1-message Produce request, librdkafka pipelining as it likes."""
    p = warm_producer(system, topic)
    cpu0 = system.broker_cpu_seconds()
    for i in range(n):
        while True:
            try:
                p.produce(topic, b"%08d" % i, partition=0)
                break
            except BufferError:
                p.poll(0.001)
    assert p.flush(120) == 0
    return (system.broker_cpu_seconds() - cpu0) * 1e6 / n


def produce_sync(system: System, topic: str, n: int, max_in_flight: int = 1) -> tuple[float, list[float]]:
    """(broker CPU µs per request, round trips in ms) of 1-message requests, one at a time."""
    p = warm_producer(system, topic, **{"max.in.flight.requests.per.connection": max_in_flight})
    times = []
    cpu0 = system.broker_cpu_seconds()
    for i in range(n):
        t = time.perf_counter()
        p.produce(topic, b"%08d" % i, partition=0)
        p.flush(10)
        times.append((time.perf_counter() - t) * 1000)
    return (system.broker_cpu_seconds() - cpu0) * 1e6 / n, times


def produce_in_flight(system: System, topic: str, seconds: float, in_flight: int = 5) -> float:
    """msg/s of 1-message batches with `in_flight` requests in flight (acks=all)."""
    p = warm_producer(system, topic, **{"max.in.flight.requests.per.connection": in_flight})
    sent = 0
    done = [0]

    def delivered(err, _msg) -> None:
        done[0] += 1

    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        if sent - done[0] < in_flight:
            p.produce(topic, b"x", partition=0, on_delivery=delivered)
            sent += 1
            p.poll(0)
        else:  # the window is full: wait for a delivery rather than spin (a spinning client takes
            p.poll(0.05)  # one of 2 cores from the brokers, which costs RF 3's three more than RF 1's one)
    p.flush(30)
    return done[0] / (time.perf_counter() - start)


FETCH_SECONDS = 20.0


def fetch_caught_up(system: System, topic: str, n: int, produce_cpu_us: float) -> tuple[float, float]:
    """(broker CPU µs per Fetch answer, records per answer) of a caught-up consumer long-polling
    while a producer sends n 1-message requests one at a time: each answer carries the one new
    record. The producer's share (`produce_cpu_us` a request, from the sync round) is taken off."""
    fetches = [0]

    def stats(raw: str) -> None:  # Fetch requests sent so far, over the brokers (not the bootstrap entry)
        brokers = json.loads(raw).get("brokers", {}).values()
        fetches[0] = sum(b.get("req", {}).get("Fetch", 0) for b in brokers if b.get("nodeid", -1) >= 0)

    c = Consumer({**system.client_conf(), "group.id": f"cost-{topic}", "enable.auto.commit": False,
                  "fetch.wait.max.ms": 500, "statistics.interval.ms": 100, "stats_cb": stats, "log_level": 3})
    p = quiet_producer(system.client_conf(), **{"max.in.flight.requests.per.connection": 1})
    try:
        c.assign([TopicPartition(topic, 0, OFFSET_END)])
        p.produce(topic, b"w", partition=0)
        p.flush(10)
        deadline = time.monotonic() + 30
        while not c.consume(1, 0.5) and time.monotonic() < deadline:  # the consumer is at the end now
            p.produce(topic, b"w", partition=0)
            p.flush(10)
        time.sleep(0.3)
        c.poll(0)
        f0 = fetches[0]
        cpu0 = system.broker_cpu_seconds()
        got = sent = 0
        stop = time.monotonic() + FETCH_SECONDS  # a broker that answers only at max wait is slow
        while sent < n and time.monotonic() < stop:
            p.produce(topic, b"%08d" % sent, partition=0)
            p.flush(10)
            sent += 1
            got += len(c.consume(1, 2.0))  # the record, answered to the parked Fetch
        cpu = system.broker_cpu_seconds() - cpu0
        time.sleep(0.3)
        c.poll(0)
        answers = max(fetches[0] - f0, 1)
        return (cpu * 1e6 - produce_cpu_us * sent) / answers, got / answers
    finally:
        c.close()


def consume_mb(system: System, rounds_topic: str, n: int, reads: int = 2) -> float:
    """Broker CPU ms per MB of a consumer reading n x 1 KiB from 3 partitions in large fetches:
    the mean of `reads` reads of the topic from its start, each by a new consumer, begun 2 s after
    the produce (the produce's own after-work, a flush or an index write, is not the read's)."""
    from produce_consume import confluent_consume, confluent_produce

    confluent_produce(system.client_conf(), rounds_topic, n, 1024, "all")
    time.sleep(2)
    cpu0 = system.broker_cpu_seconds()
    for i in range(reads):
        confluent_consume(system.client_conf(), rounds_topic, 3, n, group=f"strata-bench-{rounds_topic}-{i}")
    return (system.broker_cpu_seconds() - cpu0) * 1000 / (reads * n * 1024 / 1e6)


def idle_shares(systems: list[System], seconds: float) -> dict[str, tuple[float, float | None]]:
    """CPU share (%) of each system's broker and controller over `seconds` with no client."""
    pids: dict[str, tuple[int, int | None]] = {}
    for s in systems:
        ctl = s.cluster.pid("controller") if isinstance(s, Strata) else None
        pids[s.name] = (s.pid or 0, ctl)
    time.sleep(5)  # the clients' connections of the last round close, timers settle
    t0 = {n: (cpu_of(b), cpu_of(c) if c else None) for n, (b, c) in pids.items()}
    time.sleep(seconds)
    out = {}
    for n, (b, c) in pids.items():
        b0, c0 = t0[n]
        out[n] = ((cpu_of(b) - b0) / seconds * 100, (cpu_of(c) - c0) / seconds * 100 if c and c0 is not None else None)
    return out


def rf3(work: Path, name: str, code_root: Path | None, seconds: float, n_sync: int) -> dict[str, float]:
    s = start_system(lambda: Strata(work, 3, code_root=code_root, name=f"{name}-rf3"), f"{name} (3 brokers)")
    try:
        out = {}
        for rf in (1, 3):
            topic = create_topic(s, 1, [[1, 2, 3][:rf]])
            _, times = produce_sync(s, topic, n_sync)
            out[f"p50_rf{rf}"] = statistics.median(times)
            out[f"inflight5_rf{rf}"] = produce_in_flight(s, topic, seconds)
            delete_topic(s, topic)
        return out
    finally:
        s.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=20_000, help="1-message requests per pipelined round")
    ap.add_argument("--idle-seconds", type=float, default=30.0)
    ap.add_argument("--compare", metavar="REF", help="also run Strata from git REF, in the same rounds")
    ap.add_argument("--strata-only", action="store_true", help="do not start Tansu")
    ap.add_argument("--skip", default="", help="comma-separated: small (the 1-message rows), consume, idle, rf3")
    args = ap.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    load0 = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="strata-cost-"))
    trees: list[tuple[str, Path | None]] = [("strata", None)]
    if args.compare:
        trees.append((f"strata@{args.compare}", extract_tree(args.compare, work)))
    systems: list[System] = []
    notes = []
    try:
        for name, root in trees:
            systems.append(start_system(lambda n=name, r=root: Strata(work, 1, code_root=r, name=n), name))
        tansu = None if args.strata_only else find_tansu()
        if tansu:
            systems.append(start_system(lambda: Tansu(tansu, work), "tansu"))
        elif not args.strata_only:
            notes.append("tansu not found (make bench-deps): no Tansu column")
        rows: dict[str, dict[str, Cell]] = {s.name: {} for s in systems}

        def add(system: System, key: str, v: float) -> None:
            rows[system.name].setdefault(key, Cell()).values.append(v)

        for rnd in range(1, args.rounds + 1):
            order = systems if rnd % 2 else systems[::-1]
            for s in order:
                if "small" not in skip:
                    topic = create_topic(s, 1)
                    add(s, "produce 1-msg pipelined (µs CPU/request)", produce_pipelined(s, topic, args.requests))
                    cpu, times = produce_sync(s, topic, args.requests // 4)
                    add(s, "produce 1-msg sync (µs CPU/request)", cpu)
                    add(s, "produce 1-msg sync p50 (ms)", statistics.median(times))
                    cpu, per = fetch_caught_up(s, topic, args.requests // 4, cpu)
                    add(s, "fetch caught-up 1-record (µs CPU/answer)", cpu)
                    add(s, "fetch caught-up (records/answer)", per)
                    delete_topic(s, topic)
                if "consume" not in skip:
                    topic = create_topic(s, 3)
                    add(s, "consume 100 MB (ms CPU/MB)", consume_mb(s, topic, 100_000))
                    # kept: a deleted topic's 100 MB of files go a minute later (file.delete.delay.ms),
                    # in the middle of a later round's measure
                say(f"round {rnd}/{args.rounds} {s.name} done")
        if "idle" not in skip:
            say(f"idle: {args.idle_seconds:g}s with no clients")
            for n, (b, c) in idle_shares(systems, args.idle_seconds).items():
                rows[n].setdefault("idle broker (% of a CPU)", Cell()).values.append(b)
                if c is not None:
                    rows[n].setdefault("idle controller (% of a CPU)", Cell()).values.append(c)
    finally:
        for s in systems:
            s.stop()
    rf = {}
    if "rf3" not in skip:
        for name, root in trees:
            rf[name] = rf3(work, name, root, 3.0, 2000)
    print_tables(rows, rf, systems, args, notes, load0)
    shutil.rmtree(work, ignore_errors=True)  # the systems' data dirs (kept after a failure, to look at)
    return 0


def print_tables(rows: dict[str, dict[str, Cell]], rf: dict[str, dict[str, float]], systems: list[System],
                 args: argparse.Namespace, notes: list[str], load0: float) -> None:
    names = [s.name for s in systems]
    base = names[0]
    keys = list(dict.fromkeys(k for n in names for k in rows[n]))
    width = max(len(k) for k in keys) if keys else 20
    head = f"{'measure':{width}} " + " ".join(f"{n:>26}" for n in names)
    print(head)
    print("-" * len(head))
    for k in keys:
        cells = []
        for n in names:
            c = rows[n].get(k)
            if c is None or not c.values:
                cells.append(f"{'-':>26}")
                continue
            digits = 2 if c.med() < 10 else 0
            ratio = "" if n == base or not rows[base].get(k) else f" {c.med() / rows[base][k].med():.2f}x"
            cells.append(f"{c.med():.{digits}f} ({c.span(digits)}){ratio}".rjust(26))
        print(f"{k:{width}} " + " ".join(cells))
    print("(median (min-max) of the rounds; in the other columns, Nx is that system's value over the first column's)")
    if rf:
        print()
        print(f"{'3 brokers, acks=all':32} {'RF 1':>10} {'RF 3':>10} {'RF 3 / RF 1':>12}")
        for name, r in rf.items():
            print(f"{name + ' sync send p50 (ms)':32} {r['p50_rf1']:10.2f} {r['p50_rf3']:10.2f} "
                  f"{r['p50_rf3'] / r['p50_rf1']:11.2f}x")
            print(f"{name + ' 5 in flight (msg/s)':32} {r['inflight5_rf1']:10.0f} {r['inflight5_rf3']:10.0f} "
                  f"{r['inflight5_rf3'] / r['inflight5_rf1']:11.2f}x")
    print()
    print(f"machine: nproc {len(os.sched_getaffinity(0))}, python {sys.version.split()[0]}; load average "
          f"{load0:.2f} at start, {os.getloadavg()[0]:.2f} at end; {args.rounds} rounds, {args.requests:,} "
          "pipelined requests a round")
    for n in notes:
        print(f"note: {n}")


if __name__ == "__main__":
    sys.exit(main())
