"""kafka-get-offsets.sh for Strata: the offsets of topic partitions, as Kafka's GetOffsetShell.

  --topic REGEX [--partitions 0,1] | --topic-partitions 'REGEX:0,REGEX:1-3,:-2'
  --time -1|latest (default) | -2|earliest | -3|max-timestamp | a timestamp in ms

Prints ``topic:partition:offset`` per partition in TopicPartition-string order; a partition with
no record at or after the timestamp is left out, as Kafka does. The earliest offset of a
partition with inactive chunks is its oldest chunk's (the broker asks the chunks' replicas).
Errors print one line on stderr and exit 1; bad arguments exit 2.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Sequence

from protocol.errors import error_message
from tools.admin import AdminError, ToolArgumentParser, admin_for, run_tool
from tools.brokers import EARLIEST, LATEST, MAX_TIMESTAMP, Brokers, tp_str

TIMES = {"latest": LATEST, "earliest": EARLIEST, "max-timestamp": MAX_TIMESTAMP}
# Kafka's -4 earliest-local and -5 latest-tiered are about tiered storage, which Strata has not.
RULE = re.compile(r"([^:,]*)(?::(?:([0-9]*)|(?:([0-9]*)-([0-9]*))))?")
INT32_MAX = 2**31 - 1

PartitionFilter = Callable[[str, int], bool]


def parse_time(value: str) -> int:
    if value in TIMES:
        return TIMES[value]
    try:
        t = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"Malformed time argument {value[:40]}. Please use -1 or latest / -2 or earliest / -3 or max-timestamp, "
            "or a specified long format timestamp") from None
    if t < -3 or t > 2**63 - 1:
        raise argparse.ArgumentTypeError(f"time {value[:40]} is out of range (-3 .. 2^63-1)")
    return t


def parse_partitions(value: str) -> set[int]:
    try:
        out = {int(x) for x in value.split(",")}
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--partitions expects a comma separated list of numeric partition ids, but received: {value[:60]}") from None
    if any(not 0 <= p <= INT32_MAX for p in out):
        raise argparse.ArgumentTypeError(f"a partition id in {value[:60]!r} is out of range (0..{INT32_MAX})")
    return out


def compile_topic(pattern: str) -> re.Pattern:
    try:
        return re.compile(pattern)
    except re.error as e:
        raise argparse.ArgumentTypeError(f"{pattern[:60]!r} is not a valid regular expression: {e}") from None


def parse_rules(value: str) -> list[tuple[re.Pattern, Callable[[int], bool]]]:
    """Kafka's --topic-partitions: TOPIC_REGEX(:N | :LO-HI | :-HI | :LO-)?, comma-separated
    (a range's upper bound is exclusive)."""
    rules: list[tuple[re.Pattern, Callable[[int], bool]]] = []
    for spec in value.split(","):
        m = RULE.fullmatch(spec)
        if not m:
            raise argparse.ArgumentTypeError(f"Invalid rule specification: {spec[:60]}")
        topic, single, lo, hi = m.groups()
        rx = compile_topic(topic or ".*")
        if single:
            n = int(single)
            rules.append((rx, _equals(n)))
        else:
            low, high = int(lo) if lo else 0, int(hi) if hi else INT32_MAX
            rules.append((rx, _within(low, high)))
    return rules


def _equals(n: int) -> Callable[[int], bool]:
    return lambda p: p == n


def _within(low: int, high: int) -> Callable[[int], bool]:
    return lambda p: low <= p < high


def build_parser() -> ToolArgumentParser:
    ap = ToolArgumentParser(prog="kafka-get-offsets.sh", description="Print the offsets of topic partitions.")
    ap.add_argument("--bootstrap-server", required=True, metavar="HOST:PORT[,...]", help="brokers to connect to")
    ap.add_argument("--topic-partitions", type=parse_rules, metavar="PATTERNS",
                    help="comma-separated TOPIC_REGEX(:PARTITION | :LO-HI)? rules")
    ap.add_argument("--topic", type=compile_topic, help="the topics, a regular expression (default: all)")
    ap.add_argument("--partitions", type=parse_partitions, metavar="0,1,...", help="partition ids (default: all)")
    ap.add_argument("--time", type=parse_time, default=LATEST,
                    help="-1 or latest (default), -2 or earliest, -3 or max-timestamp, or a timestamp in ms")
    ap.add_argument("--exclude-internal-topics", action="store_true", help="leave out internal topics")
    ap.add_argument("--timeout", type=float, default=30.0, help=argparse.SUPPRESS)
    return ap


def partition_filter(a: argparse.Namespace) -> PartitionFilter:
    if a.topic_partitions is not None:
        rules = a.topic_partitions
        return lambda t, p: any(rx.fullmatch(t) and ok(p) for rx, ok in rules)
    rx = a.topic or re.compile(".*")
    return lambda t, p: bool(rx.fullmatch(t)) and (not a.partitions or p in a.partitions)


async def run(a: argparse.Namespace) -> None:
    allowed = partition_filter(a)
    async with admin_for(a, a.timeout) as admin, Brokers(admin) as brokers:
        topics = await brokers.topics(None)
        tps = [(t.name, p.partition_index) for t in topics.values() if not (a.exclude_internal_topics and t.is_internal)
               for p in t.partitions if allowed(t.name, p.partition_index)]
        if not tps:
            raise AdminError("Could not match any topic-partitions with the specified filters")
        answers = await brokers.list_offsets(dict.fromkeys(tps, a.time))
        for tp in sorted(tps, key=tp_str):
            ans = answers[tp]
            if ans.error_code:
                print(f"Skip getting offsets for topic-partition {tp_str(tp)} due to error: "
                      f"{error_message(ans.error_code)}", file=sys.stderr)
            elif ans.offset >= 0:
                print(f"{tp[0]}:{tp[1]}:{ans.offset}")


def main(argv: Sequence[str] | None = None) -> int:
    ap = build_parser()
    a = ap.parse_tool_args(argv)
    if a.topic_partitions is not None and (a.topic is not None or a.partitions is not None):
        ap.error("--topic-partitions cannot be used with --topic or --partitions")
    return run_tool(run(a))


if __name__ == "__main__":
    sys.exit(main())
