"""Descriptors, memory and restart time of one broker as its partition count grows, this tree beside
an older one (by default the commit before the descriptor budget), in the same run.

    .venv/bin/python bench/partitions.py                          # 5,000 partitions, both trees
    .venv/bin/python bench/partitions.py --partitions 20000 --nofile 4096 --after-only
    .venv/bin/python bench/partitions.py --partitions 20000 --before HEAD~3   # against a commit

Each tree runs in its own child process (its own tools.cluster, broker and controller code): one
broker, topics of --step partitions created one at a time, one record produced to every partition
(confluent-kafka), then the broker's open descriptors (/proc/<pid>/fd) and RSS; at the end a
kill -9 and the time until the broker is back and has taken a record on every partition (beside
the time the same produce takes from a warm broker, and when Metadata first lists the broker), then a
SIGTERM and the time a clean shutdown takes, the restart after it (no recovery: the log dirs'
clean-shutdown markers), and how often the controller fenced the broker for a silent session (it
should never: opening replicas must not stop heartbeats). The
older tree is extracted with `git archive` into a temp dir (no git state is touched). Its brokers
run with the machine's descriptor limit (3 descriptors a partition would not fit --nofile).
The controller runs with its defaults (a 9 s broker session).

Each tree's cluster lives on a filesystem of its own, made fresh for it (an ext4 image on a loop
device, as root; `--no-fresh-fs` or not root: the temp dir): on ext4, creating files after
many were deleted costs several times more (the allocator passes over recently freed inodes), so
the tree that ran second, after the first one's 20,000 replica dirs were removed, was measured
slower for it (a clean shutdown 2x slower in one run). BENCH_KEEP=1 keeps the broker's and the
controller's logs beside the image.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BEFORE = "f5565bc"  # main before the descriptor-budget storage work


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def produce_one_each(bootstrap: str, topics: list[tuple[str, int]]) -> None:
    """One record to every partition: a producer a topic (of --step partitions), all at once, each
    in its own thread. One librdkafka producer for all 20,000 partitions spent 19 s of its own CPU
    on them (10,000: 4 s; 5,000: 1 s), more than the broker's 9 s, on 2 cores shared with it:
    the client's cost per partition grows with the partitions it holds, and that is not the
    broker's to measure."""
    import threading

    from confluent_kafka import Producer

    failed: list = []

    def one(topic: str, n: int) -> None:
        p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "queue.buffering.max.messages": 2_000_000})
        for i in range(n):
            p.produce(topic, b"x", partition=i, on_delivery=lambda e, m: e and failed.append(e))
        if p.flush(300):
            failed.append(f"{topic}: not all delivered in 300 s")

    threads = [threading.Thread(target=one, args=t) for t in topics]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failed:
        raise SystemExit(f"produce failed: {failed[:3]}")


def fresh_fs_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "not root"
    missing = [t for t in ("mkfs.ext4", "mount", "umount") if shutil.which(t) is None]
    return f"{', '.join(missing)} not installed" if missing else None


@contextlib.contextmanager
def fresh_ext4(path: Path, size_gb: int = 16) -> Iterator[None]:
    """A new ext4 filesystem (a sparse image on a loop device) mounted at `path` for the block."""
    image = path.with_name(path.name + ".img")
    with open(image, "wb") as f:
        f.truncate(size_gb << 30)
    mounted = False
    try:
        subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True, capture_output=True)
        subprocess.run(["mount", "-o", "loop", str(image), str(path)], check=True, capture_output=True)
        mounted = True
        yield
    finally:
        if mounted:
            subprocess.run(["umount", str(path)], check=False, capture_output=True)
        image.unlink(missing_ok=True)


def child(tree: Path, partitions: int, step: int, nofile: int | None, fresh_fs: bool) -> None:
    """Runs inside one tree: prints one JSON line per step and one for the restart."""
    base = Path(tempfile.mkdtemp(prefix="bench-partitions-"))
    with fresh_ext4(base) if fresh_fs else contextlib.nullcontext():
        try:
            measure(tree, base, partitions, step, nofile)
        finally:
            if os.environ.get("BENCH_KEEP"):
                kept = base.with_name(base.name + "-logs")
                kept.mkdir(exist_ok=True)
                for log in ("broker-1.log", "controller.log"):
                    if (base / log).exists():
                        shutil.copy(base / log, kept / log)
            if not fresh_fs:  # a fresh filesystem goes whole, with its image
                shutil.rmtree(base, ignore_errors=True)
    shutil.rmtree(base, ignore_errors=True)


def measure(tree: Path, base: Path, partitions: int, step: int, nofile: int | None) -> None:
    sys.path.insert(0, str(tree))
    from confluent_kafka.admin import AdminClient, NewTopic

    from tools.cluster import Cluster

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    # inherited by the broker; without --nofile the machine's hard limit (the old code needs it)
    resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile) if nofile else (hard, hard))
    c = Cluster(
        base,
        brokers=1,
        broker_overrides={"log.retention.check.interval.ms": 3_600_000},
        verbose=False,
    )
    try:
        c.start(timeout=120)
        pid = c.pid(1)
        print(json.dumps({"partitions": 0, "fds": fds(pid), "rss": rss_mb(pid)}), flush=True)
        admin = AdminClient({"bootstrap.servers": c.bootstrap})
        made = 0
        while made < partitions:
            n = min(step, partitions - made)
            topic = f"p{made}"
            for f in admin.create_topics([NewTopic(topic, n, 1)], operation_timeout=600, request_timeout=600).values():
                f.result()
            produce_one_each(c.bootstrap, [(topic, n)])
            made += n
            print(json.dumps({"partitions": made, "fds": fds(pid), "rss": rss_mb(pid)}), flush=True)
        every = [(f"p{m}", min(step, partitions - m)) for m in range(0, partitions, step)]
        t0 = time.monotonic()
        produce_one_each(c.bootstrap, every)  # a warm broker: what one record a partition costs anyway
        print(json.dumps({"warm_produce_s": time.monotonic() - t0}), flush=True)
        c.kill(1)
        t0 = time.monotonic()
        c.start_node(1, timeout=900)
        ready = time.monotonic() - t0
        produce_one_each(c.bootstrap, every)  # every partition takes writes again
        pid = c.pid(1)
        print(json.dumps({"restart_s": time.monotonic() - t0, "ready_s": ready, "fds": fds(pid), "rss": rss_mb(pid)}),
              flush=True)
        t0 = time.monotonic()
        c.terminate(1, timeout=600)  # a clean shutdown: every log closed (and fsynced)
        stop_s = time.monotonic() - t0
        # the broker kept heartbeating throughout if the controller never fenced it for silence
        clog = base / "controller.log"
        fenced = clog.read_text().count("why='session_timeout'") if clog.exists() else -1
        print(json.dumps({"stop_s": stop_s, "fenced": fenced}), flush=True)
        t0 = time.monotonic()
        c.start_node(1, timeout=900)
        ready = time.monotonic() - t0
        produce_one_each(c.bootstrap, every)
        pid = c.pid(1)
        print(json.dumps({"clean_restart_s": time.monotonic() - t0, "ready_s": ready, "fds": fds(pid),
                          "rss": rss_mb(pid)}), flush=True)
    finally:
        c.stop()


def run_tree(tree: Path, args: argparse.Namespace, nofile: int | None) -> list[dict]:
    cmd = [sys.executable, __file__, "--child", str(tree), "--partitions", str(args.partitions), "--step", str(args.step)]
    if nofile:
        cmd += ["--nofile", str(nofile)]
    if not args.fresh_fs:
        cmd.append("--no-fresh-fs")
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0:
        rows.append({"error": (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1]})
    return rows


def _ready(r: dict) -> str:
    return f" (Metadata lists it after {r['ready_s']:.1f} s)" if "ready_s" in r else ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--partitions", type=int, default=5000)
    ap.add_argument("--step", type=int, default=1000)
    ap.add_argument("--nofile", type=int, default=4096, help="ulimit -n for this tree's broker")
    ap.add_argument("--before", default=BEFORE, help="commit to compare against")
    ap.add_argument("--after-only", action="store_true")
    ap.add_argument("--no-fresh-fs", dest="fresh_fs", action="store_false",
                    help="run each tree's cluster in the temp dir, not on an ext4 filesystem made for it")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.partitions, args.step, args.nofile if args.nofile > 0 else None, args.fresh_fs)
        return

    # both trees' brokers start from cached bytecode, as deployed (the older tree's launcher may
    # not do it itself; tools/bytecode.py)
    sys.path.insert(0, str(REPO))
    from tools.bytecode import cache_outside_the_tree

    cache_outside_the_tree(os.environ)
    if args.fresh_fs and (why := fresh_fs_unavailable()):
        print(f"partitions: no fresh filesystem for each tree ({why}): both run in the temp dir", file=sys.stderr)
        args.fresh_fs = False
    results = {"after (this tree)": run_tree(REPO, args, args.nofile)}
    if not args.after_only:
        with tempfile.TemporaryDirectory(prefix="strata-before-") as old:
            archive = subprocess.run(["git", "-C", str(REPO), "archive", args.before], capture_output=True, check=True)
            subprocess.run(["tar", "-x", "-C", old], input=archive.stdout, check=True)
            results[f"before ({args.before})"] = run_tree(Path(old), args, None)

    print(f"\nOne broker, {args.partitions} partitions in topics of {args.step}, one record each")
    print(f"{'tree':<24} {'partitions':>10} {'open fds':>9} {'RSS MB':>8} {'fds/1k':>7} {'RSS MB/1k':>9}")
    for name, rows in results.items():
        base = next((r for r in rows if r.get("partitions") == 0), None)
        for r in rows:
            if "partitions" in r and r["partitions"] > 0:
                k = r["partitions"] / 1000
                print(
                    f"{name:<24} {r['partitions']:>10} {r['fds']:>9} {r['rss']:>8.0f} "
                    f"{(r['fds'] - base['fds']) / k:>7.0f} {(r['rss'] - base['rss']) / k:>9.1f}"
                )
            elif "warm_produce_s" in r:
                print(f"{name:<24} {'produce':>10}   one record a partition to a warm broker: {r['warm_produce_s']:.1f} s")
            elif "restart_s" in r:
                print(f"{name:<24} {'restart':>10} {r['fds']:>9} {r['rss']:>8.0f}   kill -9 to serving: {r['restart_s']:.1f} s"
                      f"{_ready(r)}")
            elif "clean_restart_s" in r:
                print(f"{name:<24} {'restart':>10} {r['fds']:>9} {r['rss']:>8.0f}   "
                      f"clean shutdown to serving: {r['clean_restart_s']:.1f} s{_ready(r)}")
            elif "stop_s" in r:
                print(f"{name:<24} {'stop':>10}   SIGTERM to exit: {r['stop_s']:.1f} s; "
                      f"session-timeout fences: {r['fenced']} (the kill -9 makes one)")
            elif "error" in r:
                print(f"{name:<24} failed: {r['error']}")
    print(f"\nafter: broker under ulimit -n {args.nofile}, log.open.files.max = half of it (default); "
          + ("each tree on a fresh ext4 filesystem" if args.fresh_fs else "both trees in the temp dir"))


if __name__ == "__main__":
    main()
