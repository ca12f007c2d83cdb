"""kafka-delete-records.sh for Strata: delete the records of partitions below an offset, as Kafka's
DeleteRecordsCommand.

  --bootstrap-server B --offset-json-file F
      F: {"partitions": [{"topic": "foo", "partition": 1, "offset": 1}], "version": 1}; offset -1
      means the high watermark (everything).

Prints Kafka's lines (``partition: foo-1<TAB>low_watermark: 1`` per partition). On a partition
whose deletion failed it prints ``partition: foo-1<TAB>error: ...`` as Kafka does, then one line on
stderr and exits 1 (Kafka exits 0 there). The file is checked whole, unknown topics and partitions
included, before anything is sent; a bad file exits 1, a bad argument 2. A chunked partition's
whole inactive chunks below the offset are dropped (docs/concepts/chunks.md).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

from protocol.errors import Errors, error_message
from protocol.generated.delete_records import DeleteRecordsRequest
from tools.admin import (
    INT64,
    AdminError,
    ToolArgumentParser,
    admin_for,
    is_json_int,
    partition_entry,
    read_versioned_json,
    run_tool,
)
from tools.brokers import Brokers, TopicPartition, tp_str


def read_offsets(path: str) -> dict[TopicPartition, int]:
    doc = read_versioned_json(path)
    entries = doc.get("partitions")
    if not isinstance(entries, list):
        raise AdminError(f'{path}: missing "partitions" list')
    out: dict[TopicPartition, int] = {}
    dups = []
    for i, e in enumerate(entries):
        tp = partition_entry(e, f"{path}: partitions[{i}]")
        offset = e.get("offset")
        if not is_json_int(offset, (-1, INT64[1])):
            raise AdminError(f'{path}: partitions[{i}] ({tp_str(tp)}) needs an "offset" of -1 or more')
        if tp in out:
            dups.append(tp_str(tp))
        out[tp] = offset
    if dups:
        raise AdminError(f"Offset json file contains duplicate topic partitions: {','.join(dups)}")
    if not out:
        raise AdminError(f'{path}: "partitions" is empty')
    return out


async def run(a: argparse.Namespace) -> None:
    wanted = read_offsets(a.offset_json_file)
    async with admin_for(a, a.timeout) as admin, Brokers(admin) as brokers:
        known = set(await brokers.partitions_of({t for t, _ in wanted}))
        for tp in sorted(wanted):
            if tp not in known:
                raise AdminError(f"partition {tp_str(tp)} does not exist", Errors.UNKNOWN_TOPIC_OR_PARTITION)
        by_leader: dict[int, list[TopicPartition]] = {}
        results: dict[TopicPartition, tuple[int, int]] = {}
        for tp in wanted:
            leader = brokers.leaders.get(tp, -1)
            if leader < 0:
                results[tp] = (-1, Errors.LEADER_NOT_AVAILABLE)
            else:
                by_leader.setdefault(leader, []).append(tp)
        R = DeleteRecordsRequest
        print("Executing records delete operation")

        async def delete(leader: int, tps: list[TopicPartition]) -> None:
            topics: dict[str, list] = {}
            for t, p in tps:
                topics.setdefault(t, []).append(R.DeleteRecordsPartition(partition_index=p, offset=wanted[(t, p)]))
            req = R(topics=[R.DeleteRecordsTopic(name=t, partitions=ps) for t, ps in topics.items()],
                    timeout_ms=int(a.timeout * 1000))
            resp = await brokers.send(leader, req)
            for t in resp.topics:
                for p in t.partitions:
                    results[(t.name, p.partition_index)] = (p.low_watermark, p.error_code)

        await asyncio.gather(*(delete(b, tps) for b, tps in by_leader.items()))
        print("Records delete operation completed:")
        failed = 0
        for tp in sorted(wanted):
            low, code = results.get(tp, (-1, Errors.UNKNOWN_SERVER_ERROR))
            if code:
                failed += 1
                print(f"partition: {tp_str(tp)}\terror: {error_message(code)}")
            else:
                print(f"partition: {tp_str(tp)}\tlow_watermark: {low}")
        if failed:
            raise AdminError(f"{failed} partition(s) could not be deleted")


def build_parser() -> ToolArgumentParser:
    ap = ToolArgumentParser(prog="kafka-delete-records.sh",
                            description="Delete the records of the given partitions down to the specified offset.")
    ap.add_argument("--bootstrap-server", required=True, metavar="HOST:PORT[,...]", help="brokers to connect to")
    ap.add_argument("--offset-json-file", required=True, metavar="FILE",
                    help='{"partitions": [{"topic": "foo", "partition": 1, "offset": 1}], "version": 1}')
    ap.add_argument("--timeout", type=float, default=30.0, help=argparse.SUPPRESS)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    ap = build_parser()
    a = ap.parse_tool_args(argv)
    return run_tool(run(a))


if __name__ == "__main__":
    sys.exit(main())
