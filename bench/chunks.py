"""Chunks: the time to create a chunk on a partition holding 10 MB and 1 GB, beside the time a
reassignment of the same partition takes.

Per size (--sizes, MB; default 10 and 1000), on a fresh 3-broker cluster (tools.cluster.Cluster in
a temp dir, logs on disk):
  fill        one partition on broker 1 (RF 1) filled with --size-byte values (acks=all) up to
              the size;
  reassign    the partition moved from broker 1 to broker 3 with AlterPartitionReassignments, no
              throttle, timed until the controller no longer lists it (bench/replication.py's
              timed_move): the whole log is copied;
  chunk       then --runs CreateChunks to the active chunk's leader, moving the active chunk to the
              next broker each time (3 -> 1 -> 2 -> 3 ...). Run 1 closes the chunk holding the
              whole size; a later run first writes one record so that it too closes a chunk (the
              partition keeps holding the size). Two times per run: "answered" = CreateChunks
              request to response (the leader answers once its own metadata shows the new chunk),
              "writable" = request until the new leader accepts a Produce (acks=1, sent to it every
              5 ms from another connection).
Rows show the first run (the chunk closing the whole size) and the median and min-max of all.
Prints tables; asserts nothing about speed.

    .venv/bin/python bench/chunks.py [--sizes 10,1000] [--runs 5] [--size 1024] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402
from produce_consume import confluent_produce, say  # noqa: E402
from replication import log_bytes, timed_move, wait_leaders  # noqa: E402

from node.client import ClientError, NodeClient  # noqa: E402
from protocol.generated.create_chunks import CreateChunksRequest  # noqa: E402
from protocol.generated.metadata import MetadataRequest  # noqa: E402
from protocol.generated.produce import ProduceRequest  # noqa: E402
from protocol.records import Record, encode_batch  # noqa: E402
from tools.cluster import Cluster  # noqa: E402

PROBE_S = 0.005


@dataclass
class ChunkRun:
    answered: float
    writable: float


@dataclass
class SizeResult:
    mb: int
    log_mb: float = 0.0
    fill_mb_s: float = 0.0
    reassign_s: float | None = None
    chunks: list[ChunkRun] = field(default_factory=list)
    error: str | None = None


async def leader_of(cluster: Cluster, topic: str) -> int:
    async with NodeClient(cluster.host, cluster.broker_port(1), client_id="strata-bench") as c:
        md = await c.request(MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=topic)]))
    return md.topics[0].partitions[0].leader_id


async def produce_one(client: NodeClient, topic: str) -> int:
    P = ProduceRequest
    batch = encode_batch([Record(value=b"probe")])
    req = P(acks=1, timeout_ms=2000, topic_data=[P.TopicProduceData(
        name=topic, partition_data=[P.PartitionProduceData(index=0, records=batch)])])
    resp = await client.request(req)
    return resp.responses[0].partition_responses[0].error_code


async def timed_chunk(cluster: Cluster, topic: str, leader: int, target: int) -> ChunkRun:
    """CreateChunks moving the active chunk from `leader` to `target`; probe writes on `target`."""
    E = CreateChunksRequest.CreateChunksTopicPartition
    req = CreateChunksRequest(topic_partitions=[E(topic_name=topic, partition_id=0, broker_ids=[target],
                                                  start_offset=-1, start_timestamp=-1, prev_stop_offset=-1)])
    async with NodeClient(cluster.host, cluster.broker_port(leader), client_id="strata-bench") as lc, \
            NodeClient(cluster.host, cluster.broker_port(target), client_id="strata-bench-probe") as tc:
        start = time.perf_counter()
        writable: list[float] = []

        async def probe() -> None:
            while True:
                try:
                    if await produce_one(tc, topic) == 0:
                        writable.append(time.perf_counter() - start)
                        return
                except ClientError:
                    pass
                await asyncio.sleep(PROBE_S)

        prober = asyncio.ensure_future(probe())
        resp = await lc.request(req, timeout=60)
        answered = time.perf_counter() - start
        r = resp.results[0]
        if r.error_code:
            prober.cancel()
            raise RuntimeError(f"CreateChunks failed: error {r.error_code} {r.error_message}")
        await asyncio.wait_for(prober, 30)
    return ChunkRun(answered, writable[0])


def size_run(args: argparse.Namespace, work: Path, mb: int) -> SizeResult:
    res = SizeResult(mb)
    say(f"starting strata (3 brokers) for {mb} MB")
    cluster = Cluster(work / f"chunks-{mb}", brokers=3, verbose=False)
    try:
        cluster.start()
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap, "log_level": 4})
        topic = f"bench-chunks-{uuid.uuid4().hex[:6]}"
        admin.create_topics([NewTopic(topic, num_partitions=1, replica_assignment=[[1]])],
                            operation_timeout=30)[topic].result(60)
        wait_leaders(admin, topic, 1, [1])
        n = max(1, mb * 1_000_000 // args.size)
        fill = confluent_produce(cluster.bootstrap, topic, n, args.size, "all")
        nbytes = log_bytes(cluster, 1, topic)
        res.log_mb, res.fill_mb_s = nbytes / 1e6, fill.rate * args.size / 1e6
        say(f"filled {topic}-0 with {res.log_mb:,.1f} MB of log at {res.fill_mb_s:,.1f} MB/s")

        move = asyncio.run(timed_move(cluster, topic, [1], [3], nbytes))
        wait_leaders(admin, topic, 1, [3])
        res.reassign_s = move.complete
        say(f"reassign [1] -> [3]: {move.complete:.2f}s")

        order = [3, 1, 2]
        for run in range(args.runs):
            leader = asyncio.run(leader_of(cluster, topic))
            if run:
                asyncio.run(_write_one(cluster, leader, topic))
            target = order[(order.index(leader) + 1) % 3]
            c = asyncio.run(timed_chunk(cluster, topic, leader, target))
            res.chunks.append(c)
            say(f"chunk {run + 1}/{args.runs} {leader} -> {target}: answered {c.answered * 1000:.1f} ms, "
                f"writable {c.writable * 1000:.1f} ms")
            wait_leaders(admin, topic, 1, [target])
        del admin
    except Exception as e:  # a broken workload is reported, not raised: the other sizes still run
        res.error = f"{type(e).__name__}: {e}"
        say(f"{mb} MB failed: {res.error}")
    finally:
        cluster.stop()
    return res


async def _write_one(cluster: Cluster, leader: int, topic: str) -> None:
    async with NodeClient(cluster.host, cluster.broker_port(leader), client_id="strata-bench") as c:
        for _ in range(100):
            if await produce_one(c, topic) == 0:
                return
            await asyncio.sleep(0.05)
    raise RuntimeError(f"broker {leader} does not take writes for {topic}-0")


def ms(values: list[float]) -> tuple[str, str]:
    vals = [v * 1000 for v in values]
    return f"{statistics.median(vals):.1f}", f"{min(vals):.1f}-{max(vals):.1f}"


def print_results(results: list[SizeResult], args: argparse.Namespace) -> None:
    head = (f"{'partition holds':>15} {'log MB':>8} {'reassign s':>10} {'chunk 1st ms':>12} {'1st writable':>12} "
            f"{'median ms':>9} {'min-max ms':>12} {'writable ms':>11} {'min-max ms':>12} {'runs':>4}")
    print(head)
    print("-" * len(head))
    for r in results:
        label = f"{r.mb:,} MB"
        if r.error or not r.chunks:
            print(f"{label:>15} {r.log_mb:8.1f} {'-':>10} {'-':>12} {'-':>12} {'-':>9} {'-':>12} {'-':>11} {'-':>12} "
                  f"{0:4d}  ({r.error})")
            continue
        a_med, a_rng = ms([c.answered for c in r.chunks])
        w_med, w_rng = ms([c.writable for c in r.chunks])
        first = r.chunks[0]
        print(f"{label:>15} {r.log_mb:8.1f} {r.reassign_s:10.2f} {first.answered * 1000:12.1f} "
              f"{first.writable * 1000:12.1f} {a_med:>9} {a_rng:>12} {w_med:>11} {w_rng:>12} {len(r.chunks):4d}")
    print(f"settings: 3 brokers, RF 1, {args.size} B values filled with acks=all; reassign = the same partition "
          "[1] -> [3], no throttle, until the controller no longer lists it; chunk = CreateChunks to the leader "
          "moving the active chunk to the next broker (run 1 closes the chunk holding everything)")
    print("answered = CreateChunks request to response (the leader answers once its own metadata image holds the "
          f"new chunk); writable = request until the new leader accepts a Produce (probed every {PROBE_S * 1000:.0f} ms)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="10,1000", help="partition sizes in MB, comma separated")
    ap.add_argument("--runs", type=int, default=5, help="chunk creations per size (median reported)")
    ap.add_argument("--size", type=int, default=1024, help="value size in bytes")
    ap.add_argument("--quick", action="store_true", help="smoke check: 10 MB only, 2 runs")
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",") if x.strip()]
    if args.quick:
        sizes, args.runs = [10], 2
    with tempfile.TemporaryDirectory(prefix="strata-bench-chunks-") as tmp:
        results = [size_run(args, Path(tmp), mb) for mb in sizes]
    print_results(results, args)
    return 1 if all(r.error for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
