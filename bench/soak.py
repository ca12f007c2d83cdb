"""A soak: a 3-broker cluster under a mixed load for an hour with a broker killed every few
minutes, printing per minute each broker's RSS, open file descriptors and event-loop tasks (from
/metrics) and the produce latency percentiles of a probe producer; at the end, whether the
resources stayed flat and the fault checker's verdict on the history.

Load: the fault runs' workload on a classic RF 3 topic (two idempotent acks=all producers, a
transactional producer, a read_committed consumer: tests/faults/), a consumer group of two
members on the same topic committing as it goes, and a producer and consumer on a diskless topic
(the embedded local-directory object store). Faults: kill -9 of a random broker every
`--kill-every` minutes, restarted 5 s later.

    .venv/bin/python bench/soak.py [--minutes 60] [--kill-every 5] [--seed 1]

Flat means: from the first fifth of the run (after warm-up) to the last fifth, each broker's
mean RSS grew by less than 25% and its mean fd and task counts by less than 20 (restarted
brokers are compared from their restart on). Exits 1 if not flat or if the checker found an
anomaly.
"""

from __future__ import annotations

import argparse
import random
import re
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from confluent_kafka import Consumer, Producer  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from tests.faults.checker import check, summary  # noqa: E402
from tests.faults.workload import QUIET, Workload  # noqa: E402
from tools.cluster import Cluster  # noqa: E402

WATCHED = ("process_resident_memory_bytes", "process_open_fds", "strata_event_loop_tasks")


def scrape(url: str) -> dict[str, float]:
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    out = {}
    for name in WATCHED:
        m = re.search(rf"^{name} (\S+)$", text, re.M)
        if m:
            out[name] = float(m.group(1))
    return out


class Background:
    """A thread looping `step` until stopped; errors counted, not raised (faults cause some)."""

    def __init__(self, step) -> None:
        self.step = step
        self.stop = threading.Event()
        self.errors = 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                self.step()
            except Exception:
                self.errors += 1
                time.sleep(0.5)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=60.0)
    ap.add_argument("--kill-every", type=float, default=5.0, help="minutes between broker kills (0: none)")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    if a.minutes < 2 or a.kill_every < 0:
        ap.error("--minutes must be at least 2 and --kill-every not negative")
    rng = random.Random(a.seed)
    with tempfile.TemporaryDirectory(prefix="strata-soak-") as tmp:
        c = Cluster(Path(tmp) / "c", brokers=3, verbose=False,
                    # the diskless block cache (64 MB by default) fills over the run as the diskless
                    # consumer reads: bounded at 8 MB it is full within the warm-up, so RSS growth
                    # after it is not the cache's
                    broker_overrides={"metrics.listener": "http://127.0.0.1:0", "replica.lag.time.max.ms": 3000,
                                      "diskless.fetch.cache.bytes": str(8 << 20)},
                    controller_overrides={"broker.session.timeout.ms": 6000})
        c.start(timeout=120)
        try:
            return soak(c, a, rng)
        finally:
            c.stop()


def soak(c: Cluster, a: argparse.Namespace, rng: random.Random) -> int:
    admin = AdminClient({"bootstrap.servers": c.bootstrap, **QUIET})
    for t in admin.create_topics([NewTopic("soak", 3, 3, config={"min.insync.replicas": "2"}),
                                  NewTopic("soak-probe", 3, 3, config={"min.insync.replicas": "2"}),
                                  NewTopic("soak-diskless", 3, 1, config={"diskless.enable": "true"})]).values():
        t.result(60)
    work = Workload(c.bootstrap, "soak", 3, rate=50.0, seed=a.seed)
    work.start()
    group = [Consumer({"bootstrap.servers": c.bootstrap, "group.id": "soak-group", **QUIET}) for _ in range(2)]
    for g in group:
        g.subscribe(["soak"])
    dl_producer = Producer({"bootstrap.servers": c.bootstrap, "acks": "all", **QUIET})
    dl_consumer = Consumer({"bootstrap.servers": c.bootstrap, "group.id": "soak-diskless", **QUIET})
    dl_consumer.subscribe(["soak-diskless"])
    latencies: list[float] = []
    lat_lock = threading.Lock()
    probe = Producer({"bootstrap.servers": c.bootstrap, "acks": "all", "linger.ms": 0, **QUIET})

    def probe_step() -> None:
        t0 = time.perf_counter()

        def done(err, _msg) -> None:
            if err is None:
                with lat_lock:
                    latencies.append((time.perf_counter() - t0) * 1000)

        probe.produce("soak-probe", b"probe", partition=rng.randrange(3), on_delivery=done)
        probe.flush(30)
        time.sleep(0.1)

    def diskless_step() -> None:
        dl_producer.produce("soak-diskless", b"x" * 200)
        dl_producer.poll(0)
        time.sleep(0.01)

    loops = [Background(lambda g=g: g.consume(100, 0.5)) for g in group]
    loops += [Background(probe_step), Background(diskless_step), Background(lambda: dl_consumer.consume(100, 0.5))]
    rows: list[tuple[int, dict[int, dict[str, float]], list[float]]] = []
    restarted_at: dict[int, int] = {}
    next_kill = a.kill_every
    print(f"{'min':>4} " + " ".join(f"{f'b{b} rss MB/fds/tasks':>22}" for b in c.broker_ids)
          + f" {'p50 ms':>7} {'p99 ms':>7}", flush=True)
    start = time.monotonic()
    for minute in range(1, int(a.minutes) + 1):
        time.sleep(max(0.0, start + minute * 60 - time.monotonic()))
        if a.kill_every and minute >= next_kill:
            victim = rng.choice(c.broker_ids)
            c.kill(victim)
            time.sleep(5)
            c.start_node(victim, timeout=120)
            restarted_at[victim] = minute
            next_kill += a.kill_every
            print(f"      killed and restarted broker {victim}", flush=True)
        samples = {}
        for b in c.broker_ids:
            try:
                samples[b] = scrape(c.metrics_url(b))
            except OSError:
                samples[b] = {}
        with lat_lock:
            lat, latencies[:] = list(latencies), []
        rows.append((minute, samples, lat))
        p50 = statistics.median(lat) if lat else float("nan")
        p99 = statistics.quantiles(lat, n=100)[98] if len(lat) >= 2 else float("nan")
        cells = []
        for b in c.broker_ids:
            s = samples[b]
            cells.append(f"{s.get(WATCHED[0], 0) / 2**20:>8.0f}/{s.get(WATCHED[1], 0):>5.0f}/{s.get(WATCHED[2], 0):>6.0f}")
        print(f"{minute:>4} " + " ".join(f"{x:>22}" for x in cells) + f" {p50:>7.1f} {p99:>7.1f}", flush=True)
    for loop in loops:
        loop.stop.set()
    work.stop()
    work.final_read()
    result = check(work.history)
    flat, why = verdict(rows, c.broker_ids, restarted_at)
    print(f"\nresources flat: {flat} {why}\nchecker: {summary(result)}")
    print(f"background errors: {sum(x.errors for x in loops)}")
    return 0 if flat and not any(result.values()) else 1


def verdict(rows, brokers: list[int], restarted_at: dict[int, int]) -> tuple[bool, str]:
    n = len(rows)
    fifth = max(1, n // 5)
    notes = []
    ok = True
    for b in brokers:
        since = restarted_at.get(b, 0)
        mine = [(m, s[b]) for m, s, _ in rows if m > since + 1 and s.get(b)]
        if len(mine) < 2 * fifth:
            notes.append(f"b{b}: too few minutes since its restart to judge")
            continue
        early, late = mine[:fifth], mine[-fifth:]

        def mean(part, key: str) -> float:
            return statistics.fmean(s.get(key, 0.0) for _, s in part)

        rss = mean(late, WATCHED[0]) / max(1.0, mean(early, WATCHED[0]))
        fds = mean(late, WATCHED[1]) - mean(early, WATCHED[1])
        tasks = mean(late, WATCHED[2]) - mean(early, WATCHED[2])
        good = rss < 1.25 and fds < 20 and tasks < 20
        ok = ok and good
        notes.append(f"b{b}: rss x{rss:.2f}, fds {fds:+.0f}, tasks {tasks:+.0f}")
    return ok, "; ".join(notes)


if __name__ == "__main__":
    sys.exit(main())
