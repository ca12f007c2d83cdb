"""Long Jepsen-style fault runs: N seeded schedules of M minutes on a 3-controller, 3-broker
cluster (kill -9s, SIGSTOP pauses, restarts and network partitions from the quorum of brokers
and controllers; with --disk-faults, --broker-splits and --clock-jumps also slow and full log
dirs, partitions between brokers and wall-clock jumps of brokers) under idempotent acks=all producers, a transactional producer and a live read_committed consumer, on a classic
RF 3 topic and, unless --diskless none, a diskless topic beside it: on SeaweedFS (--diskless s3,
the default) or a local directory store), each judged by the history checker (tests/faults/).
Prints a table, one row a schedule, and each schedule's replay command; exits 1 if any
schedule found an anomaly.

    .venv/bin/python bench/faults.py [--schedules 20] [--minutes 5] [--faults-per-minute 2] [--first-seed 1]
                                     [--diskless s3|local|none] [--store-outages] [--disk-faults]
                                     [--broker-splits] [--clock-jumps]
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.faults.clock import clock_unavailable  # noqa: E402
from tests.faults.disks import disks_unavailable  # noqa: E402
from tests.faults.run import DISKLESS_BROKER, DISKLESS_CONTROLLER, run_schedule, wire_broker_faults  # noqa: E402
from tests.faults.schedule import wire_links  # noqa: E402
from tests.faults.split import split_unavailable  # noqa: E402
from tests.s3_server import SeaweedS3  # noqa: E402
from tests.tcp_proxy import TcpProxy  # noqa: E402
from tools.cluster import Cluster  # noqa: E402


class PausedStore:
    """A SeaweedFS outage: its processes paused (SIGSTOP), so requests hang and time out, then
    resumed. (A stop and restart on the same ports came back refusing requests in one run.)"""

    def __init__(self, s3: SeaweedS3) -> None:
        self.s3 = s3

    def _signal(self, sig: signal.Signals) -> None:
        if self.s3.proc is not None and self.s3.proc.poll() is None:
            os.killpg(self.s3.proc.pid, sig)

    def stop(self) -> None:
        self._signal(signal.SIGSTOP)

    def start(self) -> None:
        self._signal(signal.SIGCONT)


def diskless_settings(store: str, tmp: Path, s3: SeaweedS3 | None, endpoint: str | None = None) -> dict[str, str]:
    """Broker settings of a diskless store: SeaweedFS's bucket (at `endpoint`, a proxy in front of
    it, if given), or a directory the brokers share."""
    if store == "s3":
        assert s3 is not None
        return {**DISKLESS_BROKER, "diskless.storage.url": f"s3://{s3.bucket}/wal",
                "diskless.storage.s3.endpoint": endpoint or s3.endpoint, "diskless.storage.s3.region": "us-east-1"}
    return {**DISKLESS_BROKER, "diskless.storage.url": f"file://{tmp / 'objects'}"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--schedules", type=int, default=20)
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--faults-per-minute", type=float, default=2.0)
    ap.add_argument("--first-seed", type=int, default=1)
    ap.add_argument("--diskless", choices=("s3", "local", "none"), default="s3",
                    help="the diskless topic's store, or none for the classic topic alone")
    ap.add_argument("--store-outages", action="store_true",
                    help="SeaweedFS paused for a while, or slow to answer, among the faults (with --diskless s3)")
    ap.add_argument("--read-process-write", action="store_true",
                    help="two read-process-write transactional producers per topic (the checker's G0/G1c "
                         "dependency cycles) instead of one writing")
    ap.add_argument("--disk-faults", action="store_true",
                    help="each broker's second log dir on a FUSE passthrough over a tmpfs that faults slow "
                         "down or fill")
    ap.add_argument("--broker-splits", action="store_true",
                    help="network partitions between one broker and the others (iptables) among the faults")
    ap.add_argument("--clock-jumps", action="store_true",
                    help="a broker's wall clock jumping by minutes and back (an LD_PRELOAD library) among the faults")
    a = ap.parse_args()
    for wanted, why in ((a.disk_faults, disks_unavailable), (a.broker_splits, split_unavailable),
                        (a.clock_jumps, clock_unavailable)):
        reason = why() if wanted else None
        if reason:
            ap.error(reason)
    if a.schedules < 1 or a.minutes <= 0 or a.faults_per_minute <= 0:
        ap.error("--schedules, --minutes and --faults-per-minute must be positive")
    if a.store_outages and a.diskless != "s3":
        ap.error("--store-outages needs --diskless s3")
    rows = []
    bad = 0
    diskless = a.diskless != "none"
    with tempfile.TemporaryDirectory(prefix="strata-faults-s3-") as s3_dir:
        s3 = SeaweedS3(Path(s3_dir)).start() if a.diskless == "s3" else None
        if s3 is not None:
            os.environ.update(s3.env())  # the brokers inherit them (obstore reads AWS_*)
        try:
            for seed in range(a.first_seed, a.first_seed + a.schedules):
                with tempfile.TemporaryDirectory(prefix="strata-faults-") as tmp:
                    # with --store-outages the brokers reach SeaweedFS through a proxy that can delay its answers
                    lag = TcpProxy("127.0.0.1", s3.port) if s3 is not None and a.store_outages else None
                    store = (diskless_settings(a.diskless, Path(tmp), s3, f"http://127.0.0.1:{lag.port}" if lag else None)
                             if diskless else {})
                    c = Cluster(Path(tmp) / "c", brokers=3, controllers=3, verbose=False,
                                broker_overrides={"replica.lag.time.max.ms": 3000, **store},
                                controller_overrides={"broker.session.timeout.ms": 6000,
                                                      **(DISKLESS_CONTROLLER if diskless else {})})
                    links = wire_links(c)
                    try:
                        with ExitStack() as stack:
                            faults = wire_broker_faults(c, stack, Path(tmp), disks=a.disk_faults,
                                                        split=a.broker_splits, clocks=a.clock_jumps)
                            c.start(timeout=120)
                            replay = (f".venv/bin/python bench/faults.py --schedules 1 --first-seed {seed} "
                                      f"--minutes {a.minutes:g} --faults-per-minute {a.faults_per_minute:g} "
                                      f"--diskless {a.diskless}" + (" --store-outages" if a.store_outages else "")
                                      + (" --read-process-write" if a.read_process_write else "")
                                      + (" --disk-faults" if a.disk_faults else "")
                                      + (" --broker-splits" if a.broker_splits else "")
                                      + (" --clock-jumps" if a.clock_jumps else ""))
                            out = run_schedule(c, seed, a.minutes * 60, max(6, round(a.minutes * a.faults_per_minute)),
                                               say=lambda s: print(s, flush=True), replay=replay, links=links,
                                               diskless=diskless, read_process_write=a.read_process_write,
                                               store=PausedStore(s3) if s3 is not None and a.store_outages else None,
                                               store_lag=lag, **faults)
                    finally:
                        c.stop()
                        for link in {id(x): x for xs in links.values() for x in xs}.values():
                            link.close()
                        if lag is not None:
                            lag.close()
                bad += out.anomalies > 0
                for topic, (h, result) in out.by_topic.items():
                    txns = "/".join(str(sum(1 for _, o in h.txns if o == k)) for k in ("committed", "aborted", "unknown"))
                    rows.append((seed, topic, len(out.applied), len(h.attempted), len(h.acked), txns, len(h.final),
                                 sum(len(v) for v in result.values()), out.seconds))
                print(f"seed {seed}: {out.summary()}", flush=True)
        finally:
            if s3 is not None:
                s3.stop()
    print(f"\n{'seed':>5} {'topic':>16} {'faults':>6} {'sent':>8} {'acked':>8} {'txns c/a/?':>12} {'read':>8} "
          f"{'anomalies':>9} {'seconds':>8}")
    for seed, topic, applied, sent, acked, txns, read, n, secs in rows:
        print(f"{seed:>5} {topic:>16} {applied:>6} {sent:>8} {acked:>8} {txns:>12} {read:>8} {n:>9} {secs:>8.0f}")
    print(f"\n{a.schedules} schedules, {bad} with anomalies")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
