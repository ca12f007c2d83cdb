"""Long Jepsen-style fault runs: N seeded schedules of M minutes on a 3-controller, 3-broker
cluster (kill -9s, SIGSTOP pauses, restarts and network partitions from the quorum of brokers
and controllers under idempotent
acks=all producers, a transactional producer and a live read_committed consumer), each judged by the history checker (tests/faults/).
Prints a table, one row a schedule, and each schedule's replay command; exits 1 if any
schedule found an anomaly.

    .venv/bin/python bench/faults.py [--schedules 20] [--minutes 5] [--faults-per-minute 2] [--first-seed 1]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.faults.checker import summary  # noqa: E402
from tests.faults.run import run_schedule  # noqa: E402
from tests.faults.schedule import wire_links  # noqa: E402
from tools.cluster import Cluster  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--schedules", type=int, default=20)
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--faults-per-minute", type=float, default=2.0)
    ap.add_argument("--first-seed", type=int, default=1)
    a = ap.parse_args()
    if a.schedules < 1 or a.minutes <= 0 or a.faults_per_minute <= 0:
        ap.error("--schedules, --minutes and --faults-per-minute must be positive")
    rows = []
    bad = 0
    for seed in range(a.first_seed, a.first_seed + a.schedules):
        with tempfile.TemporaryDirectory(prefix="strata-faults-") as tmp:
            c = Cluster(Path(tmp) / "c", brokers=3, controllers=3, verbose=False,
                        broker_overrides={"replica.lag.time.max.ms": 3000},
                        controller_overrides={"broker.session.timeout.ms": 6000})
            links = wire_links(c)
            try:
                c.start(timeout=120)
                replay = (f".venv/bin/python bench/faults.py --schedules 1 --first-seed {seed} --minutes {a.minutes:g} "
                          f"--faults-per-minute {a.faults_per_minute:g}")
                out = run_schedule(c, seed, a.minutes * 60, max(6, round(a.minutes * a.faults_per_minute)),
                                   say=lambda s: print(s, flush=True), replay=replay, links=links)
            finally:
                c.stop()
                for link in {id(x): x for xs in links.values() for x in xs}.values():
                    link.close()
        h = out.history
        bad += out.anomalies > 0
        txns = "/".join(str(sum(1 for _, o in h.txns if o == k)) for k in ("committed", "aborted", "unknown"))
        rows.append((seed, len(out.applied), len(h.attempted), len(h.acked), txns, len(h.final), out.anomalies,
                     out.seconds))
        print(f"seed {seed}: {summary(out.result)}", flush=True)
    print(f"\n{'seed':>5} {'faults':>6} {'sent':>8} {'acked':>8} {'txns c/a/?':>12} {'read':>8} {'anomalies':>9} "
          f"{'seconds':>8}")
    for seed, applied, sent, acked, txns, read, n, secs in rows:
        print(f"{seed:>5} {applied:>6} {sent:>8} {acked:>8} {txns:>12} {read:>8} {n:>9} {secs:>8.0f}")
    print(f"\n{len(rows)} schedules, {bad} with anomalies")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
