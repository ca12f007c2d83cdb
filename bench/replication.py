"""Replication: replicated produce throughput (RF 3 beside RF 1) and the time a reassignment takes per GB.

Workloads (Strata only; tools.cluster.Cluster in a temp dir, log on disk)
  produce RF 1 / RF 3   3-broker cluster. confluent-kafka Producer with acks=all, the settings of
                        bench/produce_consume.py (linger.ms=5, batch.size=1,000,000, no compression,
                        no idempotence): --messages values of --size bytes into a fresh topic of
                        --partitions partitions, replication factor 1, then replication factor 3
                        with min.insync.replicas=2 (run i of both before run i+1 of either). Timed
                        from the first produce() to flush() returning.
  reassign              4-broker cluster, a new cluster after the produce runs. One partition on
                        brokers [1..k] (k = --move-replicas, default 2) filled with --move-mb MB
                        (default 200) of --size values (acks=all), then moved to [k+1..2k] with
                        AlterPartitionReassignments, no throttle, and back again on the next run
                        (--moves runs). Timed from the request until the controller no longer
                        lists it in ListPartitionReassignments (asked directly every 0.05 s: through
                        a broker each answer waits for the broker's next metadata round); then
                        `kafka-reassign-partitions.sh --verify` must report it completed.
                        "copied" is when every new replica's segment files hold the whole log.

Rows show the median and min-max of the runs. MB = 10^6 bytes, GB = 10^9 bytes; produce MB/s
counts value bytes; a move's size is the partition's log (one replica's segment bytes; the k new
replicas each copy all of it, in parallel). Prints tables; asserts nothing about speed (exit
status 1 only when a workload cannot run at all).

    .venv/bin/python bench/replication.py [--runs 5] [--messages 200000] [--size 1024]
        [--partitions 3] [--move-mb 200] [--moves 3] [--move-replicas 2] [--quick]
        [--skip-produce] [--skip-reassign]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402
from produce_consume import Sample, confluent_produce, fmt_rate, say  # noqa: E402

from node.client import NodeClient  # noqa: E402
from protocol.generated.list_partition_reassignments import ListPartitionReassignmentsRequest  # noqa: E402
from tools.admin import Admin  # noqa: E402
from tools.cluster import Cluster  # noqa: E402
from tools.kafka_reassign_partitions import alter_reassignments, list_reassignments  # noqa: E402

POLL_S = 0.05  # reassignment status / replica size sampling period
REASSIGN_SCRIPT = Path(sys.executable).parent / "kafka-reassign-partitions.sh"


# ---------------------------------------------------------------- helpers
def create_topic(bootstrap: str, partitions: int, rf: int, config: dict[str, str] | None = None) -> str:
    topic = f"bench-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 4})
    admin.create_topics([NewTopic(topic, partitions, rf, config=config or {})], operation_timeout=30)[topic].result(60)
    wait_leaders(admin, topic, partitions)
    return topic


def wait_leaders(admin: AdminClient, topic: str, partitions: int, replicas: list[int] | None = None) -> None:
    """Until every broker's metadata has a leader for every partition (and, if given, these replicas)."""
    deadline = time.monotonic() + 30
    while True:
        md = admin.list_topics(topic, timeout=10).topics.get(topic)
        if md is not None and md.error is None and len(md.partitions) == partitions:
            parts = md.partitions.values()
            if all(p.leader >= 0 for p in parts) and (replicas is None or all(p.replicas == replicas for p in parts)):
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"topic {topic} not ready after 30 s: {md}")
        time.sleep(0.1)


def delete_topic(bootstrap: str, topic: str) -> None:
    """Frees the disk between runs; failure does not matter."""
    try:
        admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 4})
        admin.delete_topics([topic], operation_timeout=30)[topic].result(30)
    except Exception:
        pass


def log_bytes(cluster: Cluster, broker: int, topic: str, partition: int = 0) -> int:
    """Bytes in the .log segment files of a broker's replica of topic-partition (chunk 0)."""
    total = 0
    for d in cluster.node_dir(broker).glob(f"logs-*/{topic}-{partition}-0"):
        try:
            names = os.listdir(d)
        except FileNotFoundError:
            continue
        for name in names:
            if name.endswith(".log"):
                try:
                    total += os.stat(d / name).st_size
                except FileNotFoundError:
                    pass
    return total


# ---------------------------------------------------------------- replicated produce
@dataclass
class ProduceRow:
    label: str
    rf: int
    config: dict[str, str]
    samples: list[Sample] = field(default_factory=list)


def produce_runs(args: argparse.Namespace, work: Path) -> list[ProduceRow]:
    rows = [
        ProduceRow("RF 1", 1, {}),
        ProduceRow("RF 3, min.insync.replicas=2", 3, {"min.insync.replicas": "2"}),
    ]
    say("starting strata (3 brokers) for the produce runs")
    cluster = Cluster(work / "produce", brokers=3, verbose=False)
    try:
        cluster.start()
        for run in range(1, args.runs + 1):
            for row in rows:
                topic = create_topic(cluster.bootstrap, args.partitions, row.rf, row.config)
                s = confluent_produce(cluster.bootstrap, topic, args.messages, args.size, "all")
                row.samples.append(s)
                say(f"produce {row.label} run {run}/{args.runs}: {s.rate:,.0f} msg/s")
                delete_topic(cluster.bootstrap, topic)
    finally:
        cluster.stop()
    return rows


def print_produce(rows: list[ProduceRow], args: argparse.Namespace) -> None:
    head = f"{'workload':56} {'msg/s':>10} {'min-max msg/s':>19} {'MB/s':>7} {'min-max MB/s':>13} {'runs':>4}"
    print(head)
    print("-" * len(head))
    for r in rows:
        name = f"confluent produce acks=all {r.label}"
        if not r.samples:
            print(f"{name:56} {'-':>10} {'-':>19} {'-':>7} {'-':>13} {0:4d}")
            continue
        rates = [s.rate for s in r.samples]
        msg, msg_range = fmt_rate(rates, 1.0, 0)
        mb, mb_range = fmt_rate(rates, args.size / 1e6, 1)
        print(f"{name:56} {msg:>10} {msg_range:>19} {mb:>7} {mb_range:>13} {len(r.samples):4d}")
    if all(r.samples for r in rows):
        ratio = statistics.median(s.rate for s in rows[1].samples) / statistics.median(s.rate for s in rows[0].samples)
        print(f"RF 3 / RF 1 (medians): {ratio:.2f}")
    print(
        f"settings: 3 brokers, {args.messages:,} msgs x {args.size} B values per run, {args.partitions} partition(s), "
        f"median of {args.runs} runs, a new topic per run; producer acks=all linger.ms=5 batch.size=1000000 "
        "compression=none idempotence=off"
    )


# ---------------------------------------------------------------- reassignment
@dataclass
class Move:
    source: list[int]
    target: list[int]
    nbytes: int
    copied: float  # s until every new replica holds the whole log
    complete: float  # s until the controller no longer lists the reassignment
    via_broker: float  # s a ListPartitionReassignments through a broker took, once complete


async def controller_lists(client: NodeClient, tp: tuple[str, int]) -> bool:
    """Whether the controller itself still lists the reassignment of tp (asked directly: a broker
    answers a forwarded ListPartitionReassignments only after its next metadata round)."""
    R = ListPartitionReassignmentsRequest
    req = R(timeout_ms=30000, topics=[R.ListPartitionReassignmentsTopics(name=tp[0], partition_indexes=[tp[1]])])
    resp = await client.request(req)
    if resp.error_code:
        raise RuntimeError(f"ListPartitionReassignments: error {resp.error_code} {resp.error_message}")
    return any((t.name, p.partition_index) == tp for t in resp.topics for p in t.partitions)


async def timed_move(cluster: Cluster, topic: str, source: list[int], target: list[int], nbytes: int) -> Move:
    tp = (topic, 0)
    copied: float | None = None
    controller = await NodeClient(cluster.host, cluster.controller_port, client_id="strata-bench").connect()
    try:
        async with Admin(cluster.bootstrap) as admin:
            start = time.perf_counter()
            await alter_reassignments(admin, {tp: target}, "start the reassignment")
            while True:
                now = time.perf_counter() - start
                if copied is None and all(log_bytes(cluster, b, topic) >= nbytes for b in target):
                    copied = now
                if not await controller_lists(controller, tp):
                    complete = time.perf_counter() - start
                    break
                if now > 600:
                    raise RuntimeError(f"reassignment of {topic}-0 to {target} not complete after 600 s")
                await asyncio.sleep(POLL_S)
            # What a client sees: the same question through a broker (as --verify and --list ask it).
            t = time.perf_counter()
            if tp in await list_reassignments(admin, [tp]):
                raise RuntimeError(f"a broker still lists the reassignment of {topic}-0 the controller completed")
            via_broker = time.perf_counter() - t
    finally:
        await controller.close()
    return Move(source, target, nbytes, complete if copied is None else copied, complete, via_broker)


def verify(cluster: Cluster, topic: str, target: list[int], work: Path) -> None:
    """`kafka-reassign-partitions.sh --verify` must agree that the move is complete."""
    f = work / "move.json"
    f.write_text(json.dumps({"version": 1, "partitions": [{"topic": topic, "partition": 0, "replicas": target}]}))
    argv = [
        str(REASSIGN_SCRIPT),
        "--bootstrap-server",
        cluster.bootstrap,
        "--verify",
        "--reassignment-json-file",
        str(f),
    ]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if f"Reassignment of partition {topic}-0 is completed." not in r.stdout:
        raise RuntimeError(f"--verify does not report completion (exit {r.returncode}): {r.stdout} {r.stderr}")


def reassign_runs(args: argparse.Namespace, work: Path, notes: list[str]) -> list[Move]:
    k = args.move_replicas
    a, b = list(range(1, k + 1)), list(range(k + 1, 2 * k + 1))
    say("starting strata (4 brokers) for the reassignments")
    cluster = Cluster(work / "reassign", brokers=4, verbose=False)
    moves: list[Move] = []
    try:
        cluster.start()
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap, "log_level": 4})
        topic = f"bench-move-{uuid.uuid4().hex[:6]}"
        fut = admin.create_topics([NewTopic(topic, num_partitions=1, replica_assignment=[a])], operation_timeout=30)[
            topic
        ]
        fut.result(60)
        wait_leaders(admin, topic, 1, a)
        n = max(1, args.move_mb * 1_000_000 // args.size)
        fill = confluent_produce(cluster.bootstrap, topic, n, args.size, "all")
        nbytes = log_bytes(cluster, a[0], topic)
        notes.append(
            f"reassign: filled {topic}-0 on brokers {a} with {n:,} x {args.size} B ({nbytes / 1e6:,.1f} MB of log) "
            f"at {fill.rate * args.size / 1e6:,.1f} MB/s (acks=all, RF {k})"
        )
        say(notes[-1].removeprefix("reassign: "))
        source, target = a, b
        for run in range(1, args.moves + 1):
            m = asyncio.run(timed_move(cluster, topic, source, target, nbytes))
            verify(cluster, topic, target, work)
            wait_leaders(admin, topic, 1, target)
            moves.append(m)
            say(
                f"move {run}/{args.moves} {source} -> {target}: copied in {m.copied:.2f}s, "
                f"complete in {m.complete:.2f}s ({nbytes / 1e6 / m.complete:,.1f} MB/s)"
            )
            source, target = target, source
        del admin  # no client left retrying connections to a stopped cluster
    finally:
        cluster.stop()
    return moves


def print_reassign(moves: list[Move], args: argparse.Namespace) -> None:
    head = (
        f"{'workload':34} {'MB':>7} {'complete s':>10} {'min-max s':>13} {'s/GB':>7} {'MB/s':>7} "
        f"{'min-max MB/s':>13} {'copied s':>8} {'runs':>4}"
    )
    print(head)
    print("-" * len(head))
    k = args.move_replicas
    name = f"reassign RF {k} to {k} other brokers"
    if not moves:
        print(f"{name:34} {'-':>7} {'-':>10} {'-':>13} {'-':>7} {'-':>7} {'-':>13} {'-':>8} {0:4d}")
        return
    mb = moves[0].nbytes / 1e6
    secs = [m.complete for m in moves]
    med = statistics.median(secs)
    rates = [mb / s for s in secs]
    print(
        f"{name:34} {mb:7,.1f} {med:10.2f} {f'{min(secs):.2f}-{max(secs):.2f}':>13} {med / (mb / 1000):7.1f} "
        f"{statistics.median(rates):7,.1f} {f'{min(rates):,.1f}-{max(rates):,.1f}':>13} "
        f"{statistics.median(m.copied for m in moves):8.2f} {len(moves):4d}"
    )
    print(
        f"settings: 4 brokers, one partition of {args.move_mb} MB requested ({args.size} B values), replicas "
        f"{list(range(1, k + 1))} <-> {list(range(k + 1, 2 * k + 1))} (alternating), no throttle, "
        f"median of {args.moves} moves; s/GB and MB/s count the partition's log once (each new replica copies it all)"
    )
    print(
        "complete = from sending AlterPartitionReassignments (through a broker, as the tool does) until the "
        f"controller, asked directly every {POLL_S}s, no longer lists it (then confirmed with --verify); "
        "copied = every new replica's segment files hold the whole log"
    )
    print(
        "the same ListPartitionReassignments through a broker (what --verify and --list send) took "
        f"{statistics.median(m.via_broker for m in moves):.2f}s (median): the broker answers a forwarded "
        "request only after its next metadata round, so polling through a broker would add up to that much"
    )


# ---------------------------------------------------------------- driver
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="produce runs per replication factor (median reported)")
    ap.add_argument("--messages", type=int, default=200_000, help="messages per produce run")
    ap.add_argument("--size", type=int, default=1024, help="value size in bytes")
    ap.add_argument("--partitions", type=int, default=3, help="partitions of each produce topic")
    ap.add_argument("--move-mb", type=int, default=200, help="MB of values in the partition to reassign")
    ap.add_argument("--moves", type=int, default=3, help="reassignments (median reported)")
    ap.add_argument(
        "--move-replicas", type=int, default=2, choices=(1, 2), help="replication factor of the moved partition"
    )
    ap.add_argument("--skip-produce", action="store_true", help="no produce runs")
    ap.add_argument("--skip-reassign", action="store_true", help="no reassignment runs")
    ap.add_argument("--quick", action="store_true", help="smoke check: 1 run of 20,000 messages, 1 move of 20 MB")
    args = ap.parse_args()
    if args.quick:
        args.runs, args.messages = 1, min(args.messages, 20_000)
        args.move_mb, args.moves = min(args.move_mb, 20), 1

    notes: list[str] = []
    failed = False
    load_start = os.getloadavg()[0]
    produce: list[ProduceRow] = []
    moves: list[Move] = []
    with tempfile.TemporaryDirectory(prefix="strata-bench-repl-") as tmp:
        work = Path(tmp)
        if not args.skip_produce:
            try:
                produce = produce_runs(args, work)
            except Exception as e:
                failed = True
                notes.append(f"produce aborted: {type(e).__name__}: {e}")
                say(notes[-1])
        if not args.skip_reassign:
            try:
                moves = reassign_runs(args, work, notes)
            except Exception as e:
                failed = True
                notes.append(f"reassign aborted: {type(e).__name__}: {e}")
                say(notes[-1])
    if not args.skip_produce:
        print_produce(produce, args)
        print()
    if not args.skip_reassign:
        print_reassign(moves, args)
        print()
    print(
        f"machine: nproc {len(os.sched_getaffinity(0))} ({os.cpu_count()} CPUs), {sys.platform}, "
        f"python {sys.version.split()[0]}; load average {load_start:.2f} at start, {os.getloadavg()[0]:.2f} at end "
        "(other jobs on the machine widen the min-max)"
    )
    for n in notes:
        print(f"note: {n}")
    print(
        "baseline: the reassignment time per GB is what chunk creation (the chunks proposal) must beat: a new chunk "
        "must not copy the partition's old data"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
