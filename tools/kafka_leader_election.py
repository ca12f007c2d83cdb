"""kafka-leader-election.sh for Strata: preferred or unclean leader election, as Kafka's
LeaderElectionCommand.

  --election-type preferred|unclean  and one of
  --topic T --partition N | --all-topic-partitions | --path-to-json-file F
      F: {"partitions": [{"topic": "foo", "partition": 1}]}

Prints Kafka's lines: ``Successfully completed leader election (PREFERRED) for partitions t-0,
t-1``, ``Valid replica already elected for partitions t-2`` and, per failed partition, ``Error
completing leader election (PREFERRED) for partition: t-3: ERROR_NAME: message``; any failure
then ends with one line on stderr and exit 1. Bad arguments exit 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from protocol.errors import Errors, error_message, error_name
from protocol.generated.elect_leaders import ElectLeadersRequest
from tools.admin import (
    INT32,
    AdminError,
    ToolArgumentParser,
    admin_for,
    broker_error,
    partition_entry,
    ranged_int,
    read_json_object,
    run_tool,
)
from tools.brokers import TopicPartition, tp_str

ELECTION_TYPES = {"preferred": 0, "unclean": 1}


def read_partitions(path: str) -> list[TopicPartition]:
    doc = read_json_object(path)
    entries = doc.get("partitions")
    if not isinstance(entries, list):
        raise AdminError('Replica election data is missing "partitions" field')
    tps = [partition_entry(e, f"{path}: partitions[{i}]") for i, e in enumerate(entries)]
    dups = sorted({tp for tp in tps if tps.count(tp) > 1})
    if dups:
        raise AdminError(f"Replica election data contains duplicate partitions: {', '.join(map(tp_str, dups))}")
    if not tps:
        raise AdminError("Replica election data is empty")
    return tps


async def run(a: argparse.Namespace) -> None:
    if a.path_to_json_file:
        tps: list[TopicPartition] | None = read_partitions(a.path_to_json_file)
    elif a.topic is not None:
        tps = [(a.topic, a.partition)]
    else:
        tps = None  # every partition
    kind = a.election_type.upper()
    R = ElectLeadersRequest
    by_topic: dict[str, list[int]] = {}
    for t, p in tps or ():
        by_topic.setdefault(t, []).append(p)
    req = R(election_type=ELECTION_TYPES[a.election_type], timeout_ms=int(a.timeout * 1000),
            topic_partitions=None if tps is None else [R.TopicPartitions(topic=t, partitions=ps)
                                                       for t, ps in by_topic.items()])
    async with admin_for(a, a.timeout) as admin:
        resp = await admin.request(req, to_controller=True)
    if resp.error_code:
        raise broker_error("leader election failed", resp.error_code)
    done, noop, failed = [], [], []
    for t in resp.replica_election_results:
        for p in t.partition_result:
            tp = (t.topic, p.partition_id)
            if p.error_code == 0:
                done.append(tp)
            elif p.error_code == Errors.ELECTION_NOT_NEEDED:
                noop.append(tp)
            else:
                failed.append((tp, p.error_code, p.error_message))
    if done:
        print(f"Successfully completed leader election ({kind}) for partitions {', '.join(map(tp_str, sorted(done)))}")
    if noop:
        print(f"Valid replica already elected for partitions {', '.join(map(tp_str, sorted(noop)))}")
    for tp, code, msg in sorted(failed):
        print(f"Error completing leader election ({kind}) for partition: {tp_str(tp)}: "
              f"{error_name(code)}: {' '.join((msg or error_message(code)).split())}")
    if failed:
        raise AdminError(f"{len(failed)} replica(s) could not be elected")


def build_parser() -> ToolArgumentParser:
    ap = ToolArgumentParser(prog="kafka-leader-election.sh",
                            description="Elect a new leader for a set of topic partitions (preferred or unclean).")
    ap.add_argument("--bootstrap-server", required=True, metavar="HOST:PORT[,...]", help="brokers to connect to")
    ap.add_argument("--election-type", required=True, type=str.lower, choices=sorted(ELECTION_TYPES),
                    help="preferred: move leadership to the preferred replica; unclean: elect a leader for "
                         "partitions without one, from outside the ISR if need be")
    ap.add_argument("--topic", help="the topic (with --partition)")
    ap.add_argument("--partition", type=ranged_int(0, INT32[1]), help="the partition (with --topic)")
    ap.add_argument("--all-topic-partitions", action="store_true", help="every partition")
    ap.add_argument("--path-to-json-file", metavar="FILE", help='{"partitions": [{"topic": "foo", "partition": 1}]}')
    ap.add_argument("--timeout", type=float, default=30.0, help=argparse.SUPPRESS)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    ap = build_parser()
    a = ap.parse_tool_args(argv)
    if sum((a.topic is not None, a.all_topic_partitions, a.path_to_json_file is not None)) != 1:
        ap.error("One and only one of the following options is required: --topic, --all-topic-partitions, "
                 "--path-to-json-file")
    if a.topic is not None and a.partition is None:
        ap.error("Missing required option(s): --partition")
    if a.topic is None and a.partition is not None:
        ap.error("Option --partition is only allowed if --topic is used")
    return run_tool(run(a))


if __name__ == "__main__":
    sys.exit(main())
