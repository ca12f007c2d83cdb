"""The controller and the metadata at scale: --partitions (100,000) over --brokers (3) brokers and
a quorum of 3 controllers, this tree beside an older one (--before) in the same run.

    .venv/bin/python bench/cluster_scale.py --after-only                   # 100,000 partitions, ~10 min
    .venv/bin/python bench/cluster_scale.py --partitions 20000 --before HEAD~1

Each tree runs in its own child process (its own tools.cluster, brokers and controllers). Measured,
in order:
- topic creation: topics of --per-topic (1,000) partitions, replication factor 1, created one
  request at a time through a broker (forwarded to the active controller); partitions a second,
  until every broker's Metadata names a leader for every partition;
- Metadata for all topics and for one topic, and DescribeTopicPartitions for all topics page by
  page (KIP-966's cursor, 2,000 partitions a page), as a client sees them (median of 5);
- the controllers' newest snapshot (size, and the time its writing took) and the metadata log;
- a follower controller restarted (kill -9): from the start to listening, which includes loading
  the snapshot and the log;
- controller failover: the active controller killed with kill -9, until a topic creation through a
  broker succeeds (a new leader serving);
- a broker killed with kill -9 and restarted: until its Metadata lists every partition with a
  leader (it catches up from the controller's snapshot and log, then opens its replicas);
- each broker's RSS per 1,000 partitions it hosts, beyond its RSS before the first topic (the
  broker killed and restarted above included: a restart's RSS).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
TARGETS = {"failover_s": 5.0, "metadata_all_s": 1.0, "rss_mb_per_1k": 5.0}


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def emit(**row: object) -> None:
    print(json.dumps(row), flush=True)


def child(tree: Path, partitions: int, per_topic: int, brokers: int) -> None:
    """Runs inside one tree: prints one JSON line per measurement."""
    sys.path.insert(0, str(tree))
    import asyncio

    from confluent_kafka.admin import AdminClient, NewTopic

    from node.client import NodeClient
    from protocol.generated.metadata import MetadataRequest
    from tools.cluster import Cluster

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    base = Path(tempfile.mkdtemp(prefix="bench-cluster-scale-"))
    c = Cluster(base, brokers=brokers, controllers=3, verbose=False,
                broker_overrides={"log.retention.check.interval.ms": 3_600_000},
                controller_overrides={"metadata.log.max.record.bytes.between.snapshots": 4 << 20})

    async def ask(port: int, body: Any, version: int | None = None) -> Any:
        async with NodeClient(c.host, port, client_id="bench", timeout=120) as nc:
            return await nc.request(body, version, timeout=120)

    def pid_of(node: int) -> int:
        pid = c.pid(node)
        assert pid is not None, f"node {node} is not running"
        return pid

    def timed(fn: Any) -> tuple[float, Any]:
        t0 = time.monotonic()
        out = fn()
        return time.monotonic() - t0, out

    def leaders_everywhere(port: int) -> int:
        md = asyncio.run(ask(port, MetadataRequest(topics=None)))
        return sum(int(p.leader_id >= 0) for t in md.topics if t.name.startswith("s") for p in t.partitions)

    try:
        c.start(timeout=300)
        idle_rss = {b: rss_mb(pid_of(b)) for b in c.broker_ids}  # before any partition
        admin = AdminClient({"bootstrap.servers": c.bootstrap})
        t0 = time.monotonic()
        made = 0
        while made < partitions:
            n = min(per_topic, partitions - made)
            for f in admin.create_topics([NewTopic(f"s{made}", n, 1)], operation_timeout=600,
                                         request_timeout=600).values():
                f.result()
            made += n
        created = time.monotonic() - t0
        while any(leaders_everywhere(c.broker_port(b)) < partitions for b in c.broker_ids):
            time.sleep(0.5)
        emit(create_s=created, ready_s=time.monotonic() - t0, partitions=partitions)

        port = c.broker_port(c.broker_ids[0])

        async def answer_times(body: object, n: int = 5) -> list[float]:
            """Request to answer, on one open connection."""
            async with NodeClient(c.host, port, client_id="bench", timeout=120) as nc:
                out = []
                for _ in range(n):
                    t = time.monotonic()
                    await nc.request(body, timeout=120)
                    out.append(time.monotonic() - t)
                return out

        runs = asyncio.run(answer_times(MetadataRequest(topics=None)))
        runs_one = asyncio.run(answer_times(MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name="s0")])))
        emit(metadata_all_s=statistics.median(runs), metadata_one_s=statistics.median(runs_one))
        try:
            from protocol.generated.describe_topic_partitions import DescribeTopicPartitionsRequest as D

            def describe_all() -> int:
                pages, cursor = 0, None

                async def go() -> int:
                    nonlocal pages, cursor
                    async with NodeClient(c.host, port, client_id="bench", timeout=120) as nc:
                        while True:
                            r = await nc.request(D(topics=[D.TopicRequest(name=f"s{m}") for m in
                                                           range(0, partitions, per_topic)],
                                                   response_partition_limit=2000, cursor=cursor))
                            pages += 1
                            if r.next_cursor is None:
                                return pages
                            cursor = D.Cursor(topic_name=r.next_cursor.topic_name,
                                              partition_index=r.next_cursor.partition_index)

                return asyncio.run(go())

            dtp = [timed(describe_all) for _ in range(3)]
            emit(describe_all_s=statistics.median(d for d, _ in dtp), describe_pages=dtp[0][1])
        except ImportError:
            pass

        snaps = sorted((c.node_dir(c.controller_ids[0]) / "metadata" / "__cluster_metadata-0").glob("*.checkpoint"))
        logs = list((c.node_dir(c.controller_ids[0]) / "metadata" / "__cluster_metadata-0").glob("*.log"))
        written = [line for cid in c.controller_ids for line in c.log_path(cid).read_text().splitlines()
                   if "snapshot_written" in line]
        emit(snapshot_mb=snaps[-1].stat().st_size / 1e6 if snaps else 0, snapshots=len(written),
             snapshot_write_ms=written[-1].split(" ms=")[-1].split()[0] if written else "-",
             metadata_log_mb=sum(p.stat().st_size for p in logs) / 1e6)

        leader = c.active_controller(timeout=30)
        assert leader is not None, "no active controller"
        follower = next(cid for cid in c.controller_ids if cid != leader)
        c.kill(follower)
        load_s, _ = timed(lambda: c.start_node(follower, timeout=600))
        emit(controller_restart_s=load_s)

        leader = c.active_controller(timeout=30)
        assert leader is not None, "no active controller"
        c.kill(leader)
        t0 = time.monotonic()
        n = 0
        while True:
            n += 1
            try:
                for f in admin.create_topics([NewTopic(f"after-failover-{n}", 1, 1)], operation_timeout=30,
                                             request_timeout=30).values():
                    f.result()
                break
            except Exception:
                time.sleep(0.05)
        emit(failover_s=time.monotonic() - t0)
        c.start_node(leader, timeout=600)

        victim = c.broker_ids[-1]
        c.kill(victim)
        t0 = time.monotonic()
        c.start_node(victim, timeout=900)
        while leaders_everywhere(c.broker_port(victim)) < partitions:
            time.sleep(0.5)
        emit(broker_restart_s=time.monotonic() - t0)

        for b in c.broker_ids:
            md = asyncio.run(ask(c.broker_port(b), MetadataRequest(topics=None)))
            hosted = sum(1 for t in md.topics for p in t.partitions if b in p.replica_nodes)
            emit(broker=b, hosted=hosted, rss_mb=rss_mb(pid_of(b)), idle_rss_mb=idle_rss[b])
    finally:
        c.stop()
        if not os.environ.get("BENCH_KEEP"):
            subprocess.run(["rm", "-rf", str(base)], check=False)


def run_tree(tree: Path, args: argparse.Namespace) -> list[dict]:
    cmd = [sys.executable, __file__, "--child", str(tree), "--partitions", str(args.partitions),
           "--per-topic", str(args.per_topic), "--brokers", str(args.brokers)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0:
        rows.append({"error": (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1]})
    return rows


def table(results: dict[str, list[dict]], args: argparse.Namespace) -> None:
    names = list(results)
    merged = {name: {k: v for r in rows if "broker" not in r for k, v in r.items()} for name, rows in results.items()}
    per_1k = {name: [(r["rss_mb"] - r["idle_rss_mb"]) / (r["hosted"] / 1000) for r in rows
                     if "broker" in r and r["hosted"]] for name, rows in results.items()}
    lines = [
        ("topic creation, partitions/s", lambda m, n: f"{args.partitions / m['create_s']:,.0f}" if "create_s" in m else "-", ""),
        ("created to every leader on every broker, s", lambda m, n: f"{m['ready_s']:.1f}" if "ready_s" in m else "-", ""),
        ("Metadata, all topics, s", lambda m, n: f"{m['metadata_all_s']:.2f}" if "metadata_all_s" in m else "-",
         f"<= {TARGETS['metadata_all_s']}"),
        ("Metadata, one topic, ms", lambda m, n: f"{m['metadata_one_s'] * 1000:.1f}" if "metadata_one_s" in m else "-", ""),
        ("DescribeTopicPartitions, all, paged, s",
         lambda m, n: f"{m['describe_all_s']:.2f} ({m['describe_pages']} pages)" if "describe_all_s" in m else "-", ""),
        ("controller snapshot, MB (write ms)",
         lambda m, n: f"{m['snapshot_mb']:.1f} ({m['snapshot_write_ms']})" if "snapshot_mb" in m else "-", ""),
        ("metadata log after it, MB", lambda m, n: f"{m['metadata_log_mb']:.1f}" if "metadata_log_mb" in m else "-", ""),
        ("follower controller kill -9 to listening, s",
         lambda m, n: f"{m['controller_restart_s']:.1f}" if "controller_restart_s" in m else "-", ""),
        ("active controller kill -9 to a topic created, s",
         lambda m, n: f"{m['failover_s']:.1f}" if "failover_s" in m else "-", f"<= {TARGETS['failover_s']}"),
        ("broker kill -9 to every leader in its Metadata, s",
         lambda m, n: f"{m['broker_restart_s']:.1f}" if "broker_restart_s" in m else "-", ""),
        ("broker RSS per 1,000 hosted partitions (beyond idle), MB",
         lambda m, n: f"{statistics.mean(per_1k[n]):.1f}" if per_1k[n] else "-", f"<= {TARGETS['rss_mb_per_1k']}"),
    ]
    print(f"\n{args.partitions:,} partitions in topics of {args.per_topic:,} (RF 1) over {args.brokers} brokers, "
          "3 controllers (snapshots every 4 MiB of records)")
    head = f"| {'':<50} | " + " | ".join(f"{n:<22}" for n in names) + " | target |"
    print(head)
    print("|" + "---|" * (len(names) + 2))
    for label, fn, target in lines:
        print(f"| {label:<50} | " + " | ".join(f"{fn(merged[n], n):<22}" for n in names) + f" | {target} |")
    for name, rows in results.items():
        for r in rows:
            if "error" in r:
                print(f"{name}: failed: {r['error']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--partitions", type=int, default=100_000)
    ap.add_argument("--per-topic", type=int, default=1000)
    ap.add_argument("--brokers", type=int, default=3)
    ap.add_argument("--before", default="HEAD~1", help="commit to compare against")
    ap.add_argument("--after-only", action="store_true")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.partitions < 1 or args.per_topic < 1 or args.brokers < 1:
        ap.error("--partitions, --per-topic and --brokers must be at least 1")
    if args.child:
        child(args.child, args.partitions, args.per_topic, args.brokers)
        return
    results = {"after (this tree)": run_tree(REPO, args)}
    if not args.after_only:
        with tempfile.TemporaryDirectory(prefix="strata-before-") as old:
            archive = subprocess.run(["git", "-C", str(REPO), "archive", args.before], capture_output=True, check=True)
            subprocess.run(["tar", "-x", "-C", old], input=archive.stdout, check=True)
            results[f"before ({args.before})"] = run_tree(Path(old), args)
    table(results, args)


if __name__ == "__main__":
    main()
