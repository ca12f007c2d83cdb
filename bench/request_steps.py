"""Where a small request's broker CPU goes, step by step: the "cost of a request" table.

Runs one Strata broker (this tree, and with --compare REF another tree in the same run), drives
it with 1-message sync Produce requests, then with a caught-up consumer answered one record at a
time (bench/request_cost.py's workloads), samples the broker with py-spy (`make bench-deps`
installs it) and sorts every sample into the step of the request path it is in. Each step's share
of the samples times the broker CPU per request (measured from /proc beside the sampling) gives
its µs per request.

Steps (the first match walking a sample's stack from its innermost frame outwards):
  read + frame        socket reads, FrameReader, the control-plane peek
  admission           the per-connection queue, round robin, the request's task, loop-lag admission
  decode              the generated request codecs
  dispatch            authorization, quotas, request metrics, log context, the handler call
  handler             the API handler and the partition interface (produce.py, fetch.py, local.py)
  storage             the log: validation, append (pwrite), reads
  encode              the generated response codecs and framing
  write               handing the answer to the socket (the send syscall's kernel time included)
  event loop (native) uvloop and the kernel outside our code: epoll, callbacks, timers

    .venv/bin/python bench/request_steps.py [--requests 6000] [--seconds 10] [--compare REF]
"""

from __future__ import annotations

import argparse
import collections
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from produce_consume import Strata, create_topic, delete_topic, extract_tree, say, start_system  # noqa: E402
from request_cost import fetch_caught_up, produce_sync  # noqa: E402

STEPS = ["read + frame", "admission", "decode", "dispatch", "handler", "storage", "encode", "write",
         "event loop (native)", "other"]
# (step, substrings of a py-spy frame "function (file:line)"), tried innermost frame first
PATTERNS: list[tuple[str, tuple[str, ...]]] = [
    ("write", ("Connection._flush (node/server.py", "FileSender.", "Connection._send_regions")),
    ("encode", ("encode_response", "Message.encode_parts", "protocol/generated/", "frame (protocol/framing")),
    ("decode", ("decode_client_request", "Message.decode_from", "decode_request")),
    ("read + frame", ("Connection.data_received", "FrameReader.", "is_control_plane")),
    ("storage", ("broker/storage/",)),
    ("handler", ("broker/apis/produce.py", "broker/apis/fetch.py", "broker/partitions/", "broker/replication/partition.py")),
    ("admission", ("FramedServer.", "Connection.start_next", "Connection._maybe_ready", "Connection._update_reading",
                   "Connection._account", "node/loop_lag.py", "Connection._answer_later", "Connection._serve")),
    ("dispatch", ("RequestDispatcher", "RequestMetrics", "structlog", "broker/quotas/", "broker/authz", "node/waits.py")),
]


def classify(stack: str) -> str:
    frames = stack.split(";")
    if frames[-1].startswith("Runner.run"):
        return "event loop (native)"
    for frame in reversed(frames):
        for step, needles in PATTERNS:
            if any(n in frame for n in needles):
                return step
    return "other"


def profile(pyspy: str, pid: int, seconds: float, out: Path) -> subprocess.Popen:
    return subprocess.Popen([pyspy, "record", "-r", "400", "-d", str(int(seconds)), "--format", "raw", "-o", str(out),
                             "-p", str(pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def shares(path: Path) -> dict[str, float]:
    counts: collections.Counter[str] = collections.Counter()
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if "Thread._bootstrap" in stack:  # executor threads waiting for work, not the request path
            continue
        counts[classify(stack)] += int(n)
    total = sum(counts.values()) or 1
    return {s: counts[s] / total for s in STEPS}


def measure(system: Strata, pyspy: str, workload: str, requests: int, seconds: float, work: Path) -> tuple[float, dict]:
    topic = create_topic(system, 1)
    try:
        base, _ = produce_sync(system, topic, 500)  # warm, and the produce cost the fetch run takes off
        out = work / f"{system.name}-{workload}.txt"
        prof = profile(pyspy, system.pid or 0, seconds, out)
        time.sleep(0.5)
        costs = []
        stop = time.monotonic() + seconds - 1
        while time.monotonic() < stop:
            if workload == "produce":
                cpu, _ = produce_sync(system, topic, requests // 10)
            else:
                cpu, _ = fetch_caught_up(system, topic, requests // 10, base)
            costs.append(cpu)
        prof.wait()
        costs.sort()
        return costs[len(costs) // 2], shares(out)
    finally:
        delete_topic(system, topic)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=6000)
    ap.add_argument("--seconds", type=float, default=10.0, help="sampling time per workload and tree")
    ap.add_argument("--compare", metavar="REF", help="also profile Strata from git REF")
    args = ap.parse_args()
    pyspy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(pyspy).exists():
        print("py-spy not found: `make bench-deps` installs it", file=sys.stderr)
        return 1
    work = Path(tempfile.mkdtemp(prefix="strata-steps-"))
    trees: list[tuple[str, Path | None]] = [("after", None)]
    if args.compare:
        trees.insert(0, (f"before ({args.compare})", extract_tree(args.compare, work)))
    results: dict[tuple[str, str], tuple[float, dict]] = {}
    for name, root in trees:
        system = start_system(lambda n=name, r=root: Strata(work, 1, code_root=r, name=n.split()[0]), name)
        try:
            for workload in ("produce", "fetch"):
                results[(name, workload)] = measure(system, pyspy, workload, args.requests, args.seconds, work)
                say(f"{name} {workload}: {results[(name, workload)][0]:.0f} µs of broker CPU per request")
        finally:
            system.stop()
    for workload, label in (("produce", "1-message sync Produce"), ("fetch", "caught-up Fetch answer (1 record)")):
        print(f"\n{label}: broker CPU µs per request, by step")
        print(f"{'step':22}" + "".join(f"{name:>24}" for name, _ in trees))
        for step in STEPS + ["total"]:
            cells = []
            for name, _ in trees:
                cpu, share = results[(name, workload)]
                v = cpu if step == "total" else cpu * share[step]
                cells.append(f"{v:>17.0f} ({100 * (1 if step == 'total' else share[step]):3.0f}%)")
            print(f"{step:22}" + "".join(cells))
    print("\n(py-spy at 400 Hz; a step's µs = its share of the samples x the broker CPU per request measured"
          " from /proc over the same runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
