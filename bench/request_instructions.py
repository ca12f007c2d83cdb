"""Instructions a request costs the broker, counted by valgrind's callgrind: the same count on a
quiet machine and a loaded one, so a change of a few percent on the request path shows, where
CPU time (bench/request_cost.py) moves by tens of percent from run to run on a shared 2-core VM.

Each tree's brokers run under callgrind (bench/callgrind_broker.py), counting only while a
workload runs; the count is user-space instructions of the broker process (Python, uvloop, libc;
not the kernel's share of a syscall, which request_cost.py's CPU time includes). The workloads
are request_cost.py's, with the instruction count standing in for CPU time:
  produce 1-msg sync       --requests 1-message Produce requests (acks=all), one at a time, RF 1
  produce 1-msg pipelined  3 x --requests, librdkafka pipelining as it likes, RF 1
  fetch caught-up answer   a consumer at the end long-polls while a producer sends one record at a
                           time: per Fetch answer, the sync produce's count taken off
  RF 3 leader / follower   3 brokers, an RF 3 topic led by broker 1: 1-message sync Produce
                           requests; the leader's and one follower's count per request
Periodic work (heartbeats, timers) counts too, and valgrind runs the broker about 20 times slower,
so about 2% of a count is time-driven; it is the same for both trees. Asserts nothing.

    .venv/bin/python bench/request_instructions.py [--compare REF] [--requests 1000] [--skip rf3]
(make bench-deps installs valgrind; 3-6 minutes a tree)
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from produce_consume import System, create_topic, extract_tree, say  # noqa: E402
from request_cost import fetch_caught_up, produce_pipelined, produce_sync  # noqa: E402

from tools.cluster import Cluster  # noqa: E402

START_TIMEOUT_S = 300.0  # brokers start about 20 times slower under valgrind
_TOTALS = re.compile(rb"^totals: (\d+)", re.M)


class CallgrindCluster(System):
    """Brokers under callgrind; broker_cpu_seconds() answers millions of instructions counted so
    far on the measured brokers (each call dumps their counts, which zeroes them), so the
    request_cost.py workloads' 'µs of CPU a request' read as instructions a request."""

    def __init__(self, work: Path, name: str, brokers: int, code_root: Path | None) -> None:
        self.name = name
        self.out_dir = work / f"callgrind-{name}"
        self.out_dir.mkdir()
        os.environ["STRATA_CALLGRIND_OUT"] = str(self.out_dir / "broker.%p")
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
        self.cluster = Cluster(work / name, brokers=brokers, verbose=False, code_root=code_root,
                               modules={"broker": "callgrind_broker"})
        self.cluster.start(timeout=START_TIMEOUT_S)
        self.bootstrap = self.cluster.bootstrap
        self.replication = min(brokers, 3)
        self.measured: list[int] = []
        self.counted: dict[int, int] = {}

    def measure(self, *brokers: int) -> None:
        """Count on these brokers from now on (their counts so far are dropped)."""
        self.measured = [pid for b in brokers if (pid := self.cluster.pid(b)) is not None]
        for pid in self.measured:
            subprocess.run(["callgrind_control", "-i", "on", str(pid)], capture_output=True, check=True)
            self.counted[pid] = 0
            self._dump(pid)
            self.counted[pid] = 0

    def counts(self) -> dict[int, int]:
        """Instructions each measured broker has run since measure()."""
        for pid in self.measured:
            self.counted[pid] += self._dump(pid)
        return dict(self.counted)

    def broker_cpu_seconds(self) -> float:
        return sum(self.counts().values()) / 1e6

    def _dump(self, pid: int) -> int:
        before = set(self.out_dir.iterdir())
        subprocess.run(["callgrind_control", "-d", str(pid)], capture_output=True, check=True)
        deadline = time.monotonic() + 30
        while True:
            new = [p for p in set(self.out_dir.iterdir()) - before if p.name.startswith(f"broker.{pid}")]
            if new:
                data = new[0].read_bytes()
                m = _TOTALS.search(data)
                if m is not None:
                    new[0].unlink()
                    return int(m.group(1))
            if time.monotonic() > deadline:
                raise RuntimeError(f"no callgrind dump of broker pid {pid} in {self.out_dir}")
            time.sleep(0.05)

    def stop(self) -> None:
        self.cluster.stop()


def run_tree(work: Path, name: str, code_root: Path | None, args: argparse.Namespace) -> dict[str, float]:
    rows: dict[str, float] = {}
    n = args.requests
    if "rf1" not in args.skip:
        say(f"{name}: 1 broker under callgrind")
        c = CallgrindCluster(work, name, 1, code_root)
        try:
            topic = create_topic(c, 1)
            produce_sync(c, topic, 100)  # warm: connections, the first segment's files
            c.measure(1)
            sync, _ = produce_sync(c, topic, n)
            rows["produce 1-msg sync"] = sync
            rows["produce 1-msg pipelined"] = produce_pipelined(c, topic, 3 * n)
            answer, per_answer = fetch_caught_up(c, topic, n, sync)
            rows["fetch caught-up answer"] = answer
            rows["fetch caught-up (records/answer)"] = per_answer
        finally:
            c.stop()
    if "rf3" not in args.skip:
        say(f"{name}: 3 brokers under callgrind")
        c = CallgrindCluster(work, name + "-rf3", 3, code_root)
        try:
            topic = create_topic(c, 1, assignment=[[1, 2, 3]])
            produce_sync(c, topic, 100)
            leader, follower = c.cluster.pid(1), c.cluster.pid(2)
            c.measure(1, 2)
            produce_sync(c, topic, n)
            counted = c.counts()
            rows["RF 3 sync produce, leader"] = counted[leader] / n  # type: ignore[index]
            rows["RF 3 sync produce, a follower"] = counted[follower] / n  # type: ignore[index]
        finally:
            c.stop()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--compare", metavar="REF", help="also count the brokers of git REF")
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--skip", default="", help="comma-separated: rf1 (the three 1-broker rows), rf3")
    args = ap.parse_args()
    args.skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("request_instructions: valgrind is not installed (make bench-deps installs it)", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="strata-instr-"))
    try:
        trees: dict[str, Path | None] = {"this tree": None}
        if args.compare:
            trees[args.compare] = extract_tree(args.compare, work)
        results = {}
        for label, root in trees.items():
            results[label] = run_tree(work, re.sub(r"[^A-Za-z0-9]+", "-", label), root, args)
        print_table(results)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def print_table(results: dict[str, dict[str, float]]) -> None:
    labels = list(results)
    first = results[labels[0]]
    head = f"{'instructions per request (broker, user space)':<46}" + "".join(f"{lb:>16}" for lb in labels)
    print("\n" + head)
    print("-" * len(head))
    for row, value in first.items():
        cells = [f"{value:>16,.0f}" if "records" not in row else f"{value:>16.2f}"]
        for lb in labels[1:]:
            other = results[lb].get(row)
            if other is None:
                cells.append(f"{'-':>16}")
            elif "records" in row:
                cells.append(f"{other:>16.2f}")
            else:
                cells.append(f"{other:>10,.0f} {value / other:>4.2f}x")
        print(f"{row:<46}" + "".join(cells))
    if len(labels) > 1:
        print("(Nx: this tree's count over that tree's)")


if __name__ == "__main__":
    sys.exit(main())
