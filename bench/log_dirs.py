"""JBOD: a move of a replica between the log dirs of one broker beside `cp` of the same files, and
produce throughput while a move runs beside without one, in the same run.

On a fresh 1-broker cluster (two log dirs, tools.cluster.Cluster in a temp dir, or --dirs A,B):
  fill      one partition (RF 1) filled with --size-byte values (acks=all) up to --mb MB;
  cp        `cp -r` of the replica dir into the other log dir (then removed): the baseline;
  move      AlterReplicaLogDirs to the other dir, unthrottled, timed until DescribeLogDirs shows
            the replica there and no `.move` copy (includes the swap and the first metadata ack);
  produce   --messages values into a second topic on the same broker, without a move, then again
            while the big partition moves back.
Both copies run on a warm page cache (the partition was just written); the ratio is what counts.
Prints tables; asserts nothing about speed.

    .venv/bin/python bench/log_dirs.py [--mb 1000] [--messages 100000] [--size 1024] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402
from produce_consume import confluent_produce, say  # noqa: E402

from node.client import NodeClient  # noqa: E402
from protocol.generated.alter_replica_log_dirs import AlterReplicaLogDirsRequest  # noqa: E402
from protocol.generated.describe_log_dirs import DescribeLogDirsRequest  # noqa: E402
from tools.cluster import Cluster  # noqa: E402


async def _request(cluster: Cluster, body):
    async with NodeClient(cluster.host, cluster.broker_port(1), client_id="strata-bench", timeout=60) as c:
        return await c.request(body)


def where(cluster: Cluster, topic: str) -> tuple[str | None, bool]:
    resp = asyncio.run(_request(cluster, DescribeLogDirsRequest(topics=None)))
    live, future = None, False
    for r in resp.results:
        for t in r.topics:
            for p in t.partitions:
                if t.name == topic:
                    if p.is_future_key:
                        future = True
                    else:
                        live = r.log_dir
    return live, future


def timed_move(cluster: Cluster, topic: str, dest: str) -> float:
    R = AlterReplicaLogDirsRequest
    start = time.perf_counter()
    resp = asyncio.run(_request(cluster, R(dirs=[R.AlterReplicaLogDir(path=dest, topics=[
        R.AlterReplicaLogDirTopic(name=topic, partitions=[0])])])))
    code = resp.results[0].partitions[0].error_code
    if code:
        raise RuntimeError(f"AlterReplicaLogDirs failed: error {code}")
    while where(cluster, topic) != (dest, False):
        time.sleep(0.01)
    return time.perf_counter() - start


def fsync_files(path: Path) -> None:
    for f in path.iterdir():
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, default=1000, help="partition size to move, MB")
    ap.add_argument("--messages", type=int, default=100_000, help="values produced per throughput run")
    ap.add_argument("--size", type=int, default=1024, help="value size in bytes")
    ap.add_argument("--quick", action="store_true", help="smoke check: 20 MB, 5,000 messages")
    args = ap.parse_args()
    if args.quick:
        args.mb, args.messages = 20, 5_000
    work = Path(tempfile.mkdtemp(prefix="strata-bench-logdirs-"))
    cluster = Cluster(work / "c", brokers=1, verbose=False)
    try:
        say("starting strata (1 broker, 2 log dirs)")
        cluster.start()
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap, "log_level": 4})
        for t in ("bench-move", "bench-produce"):
            admin.create_topics([NewTopic(t, 1, 1)], operation_timeout=30)[t].result(60)
        n = max(1, args.mb * 1_000_000 // args.size)
        fill = confluent_produce(cluster.bootstrap, "bench-move", n, args.size, "all")
        src, _ = where(cluster, "bench-move")
        assert src is not None
        dirs = sorted(str(p) for p in cluster.node_dir(1).glob("logs-*"))
        dest = next(d for d in dirs if d != src)
        replica = Path(src) / "bench-move-0-0"
        nbytes = dir_bytes(replica)
        say(f"filled bench-move-0 with {nbytes / 1e6:,.1f} MB at {fill.rate * args.size / 1e6:,.1f} MB/s")

        copy_to = Path(dest) / "bench-cp-copy"
        start = time.perf_counter()
        subprocess.run(["cp", "-r", str(replica), str(copy_to)], check=True)
        fsync_files(copy_to)  # as the move syncs what it copied
        cp_s = time.perf_counter() - start
        shutil.rmtree(copy_to)
        say(f"cp -r: {cp_s:.2f}s")
        move_s = timed_move(cluster, "bench-move", dest)
        say(f"move: {move_s:.2f}s")

        quiet = confluent_produce(cluster.bootstrap, "bench-produce", args.messages, args.size, "all")
        mover = threading.Thread(target=lambda: timed_move(cluster, "bench-move", src), daemon=True)
        move_start = time.perf_counter()
        mover.start()
        busy = confluent_produce(cluster.bootstrap, "bench-produce", args.messages, args.size, "all")
        overlap = time.perf_counter() - move_start
        mover.join(600)
        back_s = time.perf_counter() - move_start

        head = f"{'copy of the replica':<28} {'MB':>8} {'seconds':>8} {'MB/s':>8} {'vs cp':>6}"
        print(head)
        print("-" * len(head))
        mb = nbytes / 1e6
        print(f"{'cp -r (+ fsync)':<28} {mb:8.1f} {cp_s:8.2f} {mb / cp_s:8.1f} {'100%':>6}")
        print(f"{'AlterReplicaLogDirs move':<28} {mb:8.1f} {move_s:8.2f} {mb / move_s:8.1f} {cp_s / move_s:6.0%}")
        print()
        head = f"{'produce (acks=all)':<28} {'msg/s':>10} {'MB/s':>8}"
        print(head)
        print("-" * len(head))
        print(f"{'no move':<28} {quiet.rate:10,.0f} {quiet.rate * args.size / 1e6:8.1f}")
        print(f"{'while a move runs':<28} {busy.rate:10,.0f} {busy.rate * args.size / 1e6:8.1f}")
        print(f"settings: 1 broker, two log dirs on one filesystem, RF 1, {args.size} B values; "
              f"move back took {back_s:.2f}s, produce ran {overlap:.2f}s of it; warm page cache for both copies; "
              "the move includes the swap and the wait for DescribeLogDirs to show it done")
        del admin
    finally:
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
