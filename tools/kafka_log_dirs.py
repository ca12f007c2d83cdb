"""kafka-log-dirs.sh for Strata (KIP-113).

  --describe --bootstrap-server B [--broker-list 1,2] [--topic-list a,b]
      prints KIP-113's JSON: {"version":1,"log_dirs":[{"broker","path","is_live","partitions":
      [{"topic","partition","chunk_start_offset","size","is_temporary"}]}]}, one partitions entry
      per chunk replica; a `.move` copy is is_temporary. With --kafka-json: Apache Kafka's shipped
      shape (LogDirsCommand), for tools written against it: {"version":1,"brokers":[{"broker",
      "logDirs":[{"logDir","error","partitions":[{"partition":"topic-N","size","offsetLag",
      "isFuture"}]}]}]}, one partitions entry per partition (its chunk replicas in the dir summed).
  --generate-balance --bootstrap-server B --broker-list 1,2
      prints a reassignment JSON (with "log_dirs") for kafka-reassign-partitions.sh that evens out
      the bytes per log dir on each broker listed, moving as few bytes as it can: repeatedly the
      partition of the fullest dir whose move to the emptiest one narrows their gap the most,
      until no move narrows it. A partition's chunk replicas on a broker move together (what
      AlterReplicaLogDirs moves).

Errors print one line on stderr and exit 1; bad arguments exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from protocol.errors import Errors, error_name
from tools.admin import Admin, AdminError, ToolArgumentParser, admin_for, run_tool
from tools.log_dirs import ANY_LOG_DIR, DirInfo, broker_addresses, describe_dirs

MAX_BALANCE_MOVES = 10_000


def parse_id_list(value: str) -> list[int]:
    try:
        ids = [int(x) for x in value.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a comma-separated list of broker ids") from None
    if not ids:
        raise argparse.ArgumentTypeError("the broker list is empty")
    return ids


async def gather(admin: Admin, brokers: list[int] | None, topics: list[str] | None) -> list[DirInfo]:
    addresses = await broker_addresses(admin)
    chosen = sorted(addresses) if brokers is None else brokers
    for b in chosen:
        if b not in addresses:
            raise AdminError(f"broker {b} in --broker-list is not a live broker (live: {sorted(addresses)})")
    out: list[DirInfo] = []
    for b in chosen:
        out += await describe_dirs(admin, addresses, b, topics)
    return out


def describe_json(dirs: list[DirInfo]) -> dict:
    return {
        "version": 1,
        "log_dirs": [
            {
                "broker": d.broker,
                "path": d.path,
                "is_live": d.is_live,
                "partitions": [
                    {"topic": r.topic, "partition": r.partition, "chunk_start_offset": r.chunk_start, "size": r.size,
                     "is_temporary": r.is_future}
                    for r in sorted(d.replicas, key=lambda r: (r.topic, r.partition, r.chunk_start, r.is_future))
                ],
            }
            for d in dirs
        ],
    }


# Kafka's JSON names a dir's error by its exception class (Errors.exceptionName), null for none.
_KAFKA_EXCEPTION = {Errors.KAFKA_STORAGE_ERROR: "org.apache.kafka.common.errors.KafkaStorageException"}


def kafka_describe_json(dirs: list[DirInfo]) -> dict:
    """Apache Kafka's LogDirsCommand output: partitions as "topic-N"; a partition's chunk replicas
    in one dir are one entry (sizes summed, the largest offset lag), a `.move` copy its own."""
    brokers: dict[int, list[dict]] = {}
    for d in dirs:
        merged: dict[tuple[str, int, bool], list[int]] = {}
        for r in d.replicas:
            entry = merged.setdefault((r.topic, r.partition, r.is_future), [0, 0])
            entry[0] += r.size
            entry[1] = max(entry[1], r.offset_lag)
        brokers.setdefault(d.broker, []).append({
            "logDir": d.path,
            "error": None if d.error_code == 0 else _KAFKA_EXCEPTION.get(d.error_code, error_name(d.error_code)),
            "partitions": [
                {"partition": f"{t}-{p}", "size": size, "offsetLag": lag, "isFuture": future}
                for (t, p, future), (size, lag) in sorted(merged.items())
            ],
        })
    return {"version": 1, "brokers": [{"broker": b, "logDirs": ds} for b, ds in brokers.items()]}


def balance(dirs: list[DirInfo]) -> dict[int, dict[tuple[str, int], str]]:
    """broker -> {(topic, partition): destination dir}: the moves evening out each broker's dirs."""
    plan: dict[int, dict[tuple[str, int], str]] = {}
    for broker in sorted({d.broker for d in dirs}):
        live = [d for d in dirs if d.broker == broker and d.is_live]
        if len(live) < 2:
            continue
        # unit = a partition's replicas in one dir (a move in progress counts where it goes)
        units: dict[tuple[str, int], list] = {}
        load = {d.path: 0 for d in live}
        moving = {(r.topic, r.partition) for d in live for r in d.replicas if r.is_future}
        for d in live:
            for r in d.replicas:
                if r.is_future or (r.topic, r.partition) in moving:
                    continue
                u = units.setdefault((r.topic, r.partition), [d.path, 0])
                u[1] += r.size
                load[d.path] += r.size
        for _ in range(MAX_BALANCE_MOVES):
            hi = max(load, key=lambda p: (load[p], p))
            lo = min(load, key=lambda p: (load[p], p))
            gap = load[hi] - load[lo]
            best = None
            for tp, (path, size) in units.items():
                if path == hi and 0 < size < gap:
                    narrowed = abs(gap - 2 * size)
                    if best is None or narrowed < best[0]:
                        best = (narrowed, tp, size)
            if best is None:
                break
            _, tp, size = best
            units[tp][0] = lo
            load[hi] -= size
            load[lo] += size
            plan.setdefault(broker, {})[tp] = lo
    return plan


async def replicas_of(admin: Admin, tps: list[tuple[str, int]]) -> dict[tuple[str, int], list[int]]:
    md = await admin.metadata(sorted({t for t, _ in tps}))
    out = {}
    for t in md.topics:
        for p in t.partitions:
            out[(t.name, p.partition_index)] = list(p.replica_nodes)
    return out


async def run(a: argparse.Namespace) -> None:
    async with admin_for(a, 30.0) as admin:
        dirs = await gather(admin, a.broker_list, a.topic_list)
        if a.describe:
            print("Querying brokers for log directories information")
            print(f"Received log directory information from brokers {','.join(str(b) for b in sorted({d.broker for d in dirs}))}")
            shape = kafka_describe_json if a.kafka_json else describe_json
            print(json.dumps(shape(dirs), separators=(",", ":")))
            return
        plan = balance(dirs)
        tps = sorted({tp for moves in plan.values() for tp in moves})
        current = await replicas_of(admin, tps)
        entries = []
        for tp in tps:
            replicas = current.get(tp)
            if replicas is None:
                continue  # deleted meanwhile
            log_dirs = [plan.get(b, {}).get(tp, ANY_LOG_DIR) for b in replicas]
            entries.append({"topic": tp[0], "partition": tp[1], "replicas": replicas, "log_dirs": log_dirs})
        moved = sum(next((r.size for d in dirs if d.broker == b for r in d.replicas
                          if (r.topic, r.partition) == tp and not r.is_future), 0)
                    for b, moves in plan.items() for tp in moves)
        print(f"Proposed log dir balance: {len(entries)} partition{'s' if len(entries) != 1 else ''}, "
              f"about {moved} bytes to move")
        print(json.dumps({"version": 1, "partitions": entries}, separators=(",", ":")))


def build_parser() -> ToolArgumentParser:
    ap = ToolArgumentParser(prog="kafka-log-dirs.sh",
                            description="Query the log dirs of brokers, or propose moves that balance them.")
    ap.add_argument("--bootstrap-server", required=True, metavar="HOST:PORT[,...]", help="brokers to connect to")
    actions = ap.add_mutually_exclusive_group(required=True)
    actions.add_argument("--describe", action="store_true", help="describe the log dirs and their replicas")
    actions.add_argument("--generate-balance", action="store_true",
                         help="print a reassignment JSON (with log_dirs) evening out bytes per dir on each broker")
    ap.add_argument("--broker-list", type=parse_id_list, metavar="ID,ID,...", help="brokers to query (default: all)")
    ap.add_argument("--topic-list", type=lambda v: [t for t in v.split(",") if t], metavar="T,T,...",
                    help="with --describe: only these topics (default: all)")
    ap.add_argument("--kafka-json", action="store_true",
                    help="with --describe: print Apache Kafka's JSON shape (brokers/logDirs/partitions) instead of KIP-113's")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    ap = build_parser()
    a = ap.parse_tool_args(argv)
    if a.generate_balance and a.broker_list is None:
        ap.error("--generate-balance needs --broker-list")
    if a.kafka_json and not a.describe:
        ap.error("option --kafka-json needs --describe")
    if a.generate_balance and a.topic_list is not None:
        ap.error("option --topic-list can't be used with --generate-balance")
    return run_tool(run(a))


if __name__ == "__main__":
    sys.exit(main())
