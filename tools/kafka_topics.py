"""kafka-topics.sh for Strata: create, describe, list, alter and delete topics.

Same options and output as Apache Kafka's tool for what it supports, plus chunks: --describe
gives a partition with chunks its active chunk's StartOffset and one indented line per inactive
chunk (start, stop and end offsets, replicas, ISR). --topic is a regular
expression for --describe/--list/--alter/--delete (as in Kafka) and an exact name for --create.
Errors print one line on stderr and exit 1; bad arguments exit 2.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from protocol.errors import Errors
from protocol.generated.describe_topic_partitions import DescribeTopicPartitionsRequest
from tools.admin import (
    INT16,
    INT32,
    Admin,
    AdminError,
    ToolArgumentParser,
    admin_for,
    broker_error,
    non_default_configs,
    ranged_int,
    run_tool,
    topic_id_str,
)
from tools.brokers import EARLIEST, LATEST, MAX_TIMESTAMP, Brokers


def parse_config(value: str) -> tuple[str, str]:
    name, sep, val = value.partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"{value!r} is not NAME=VALUE")
    return name.strip(), val.strip()


def parse_assignment(value: str) -> list[list[int]]:
    """Kafka's --replica-assignment: partitions separated by commas, replicas by colons:
    ``1:2,2:3`` puts partition 0 on brokers 1 and 2, partition 1 on 2 and 3."""
    out: list[list[int]] = []
    for part in value.split(","):
        try:
            ids = [int(x) for x in part.split(":")]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value[:60]!r} is not BROKER:BROKER,... per partition") from None
        if not all(INT32[0] <= b <= INT32[1] for b in ids):
            raise argparse.ArgumentTypeError(f"partition {len(out)}: a broker id is out of range ({INT32[0]}..{INT32[1]})")
        if len(set(ids)) != len(ids):
            raise argparse.ArgumentTypeError(f"partition {len(out)} lists a broker twice in {value!r}")
        out.append(ids)
    if len({len(x) for x in out}) != 1:
        raise argparse.ArgumentTypeError(f"every partition needs the same number of replicas in {value!r}")
    return out


def build_parser() -> ToolArgumentParser:
    ap = ToolArgumentParser(prog="kafka-topics.sh", description="Create, delete, describe, or change a topic.")
    ap.add_argument("--bootstrap-server", required=True, metavar="HOST:PORT[,...]", help="brokers to connect to")
    actions = ap.add_mutually_exclusive_group(required=True)
    actions.add_argument("--create", action="store_true", help="create a new topic")
    actions.add_argument("--list", action="store_true", help="list all topics")
    actions.add_argument("--describe", action="store_true", help="describe topics (all unless --topic)")
    actions.add_argument("--alter", action="store_true", help="change a topic's partition count (fewer marks partitions for deletion)")
    actions.add_argument("--delete", action="store_true", help="delete a topic")
    ap.add_argument("--topic", help="the topic (a regular expression except with --create)")
    ap.add_argument("--partitions", type=ranged_int(*INT32), help="number of partitions (create, alter)")
    ap.add_argument("--replication-factor", type=ranged_int(*INT16), help="replication factor (create)")
    ap.add_argument("--replica-assignment", type=parse_assignment, metavar="B:B,B:B", help="replicas per partition")
    ap.add_argument(
        "--config", type=parse_config, action="append", default=[], metavar="NAME=VALUE", help="topic config (create)"
    )
    ap.add_argument("--if-not-exists", action="store_true", help="with --create: no error if the topic exists")
    ap.add_argument(
        "--if-exists", action="store_true", help="with --alter/--describe/--delete: no error if no topic matches"
    )
    ap.add_argument("--exclude-internal", action="store_true", help="leave out internal topics (list, describe)")
    ap.add_argument("--timeout", type=float, default=30.0, help=argparse.SUPPRESS)
    return ap


def check_args(ap: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    if (a.create or a.alter or a.delete) and not a.topic:
        ap.error("--topic is required with --create, --alter and --delete")
    if a.alter and a.partitions is None:
        ap.error("--alter needs --partitions (use kafka-configs.sh for configs)")
    if a.config and not a.create:
        ap.error("--config is only allowed with --create")
    if a.replica_assignment and (a.partitions is not None and a.create or a.replication_factor is not None):
        ap.error("--replica-assignment replaces --partitions and --replication-factor")
    if a.replica_assignment and not (a.create or a.alter):
        ap.error("--replica-assignment is only allowed with --create or --alter")
    if (a.partitions is not None) and not (a.create or a.alter):
        ap.error("--partitions is only allowed with --create or --alter")
    if (a.replication_factor is not None) and not a.create:
        ap.error("--replication-factor is only allowed with --create")
    if a.if_not_exists and not a.create:
        ap.error("--if-not-exists is only allowed with --create")
    if a.if_exists and not (a.alter or a.describe or a.delete):
        ap.error("--if-exists is only allowed with --alter, --describe and --delete")
    if a.topic and not a.create:
        try:
            re.compile(a.topic)
        except re.error as e:
            ap.error(f"--topic {a.topic!r} is not a valid regular expression: {e}")


def matching(topics: Sequence[str], pattern: str | None) -> list[str]:
    if pattern is None:
        return sorted(topics)
    rx = re.compile(pattern)
    return sorted(t for t in topics if rx.fullmatch(t))


async def all_topics(admin: Admin, exclude_internal: bool = False) -> dict[str, Any]:
    md = await admin.metadata(None)
    if md.error_code:
        raise broker_error("cannot list topics", md.error_code)
    # A topic-level error (say, a topic being deleted) must not hide the others: callers that
    # need the details check the topics they selected.
    return {
        t.name: t
        for t in md.topics
        if t.error_code != Errors.UNKNOWN_TOPIC_OR_PARTITION and not (exclude_internal and t.is_internal)
    }


def no_match(a: argparse.Namespace) -> AdminError:
    return AdminError(f"topic '{a.topic}' does not exist", Errors.UNKNOWN_TOPIC_OR_PARTITION)


async def selected(admin: Admin, a: argparse.Namespace) -> dict[str, Any]:
    topics = await all_topics(admin, a.exclude_internal)
    names = matching(list(topics), a.topic)
    if a.topic is not None and not names and not a.if_exists:
        raise no_match(a)
    return {n: topics[n] for n in names}


async def create(admin: Admin, a: argparse.Namespace) -> None:
    assignment = dict(enumerate(a.replica_assignment)) if a.replica_assignment else None
    partitions = -1 if a.partitions is None else a.partitions
    rf = -1 if a.replication_factor is None else a.replication_factor
    configs = dict(a.config)
    [result] = await admin.create_topics(
        [(a.topic, partitions, rf, assignment, configs)], timeout_ms=int(a.timeout * 1000)
    )
    if result.error_code == Errors.TOPIC_ALREADY_EXISTS:
        if a.if_not_exists:
            return
        raise AdminError(f"topic '{a.topic}' already exists", result.error_code)
    if result.error_code:
        raise broker_error(f"cannot create topic '{a.topic}'", result.error_code, result.error_message)
    print(f"Created topic {a.topic}.")


async def list_topics(admin: Admin, a: argparse.Namespace) -> None:
    topics = await all_topics(admin, a.exclude_internal)
    for name in matching(list(topics), a.topic):
        print(name)


async def describe(admin: Admin, a: argparse.Namespace) -> None:
    topics = await selected(admin, a)
    for name, t in topics.items():
        if t.error_code:
            raise broker_error(f"cannot describe topic '{name}'", t.error_code)
    configs = await admin.describe_topic_configs(list(topics))
    expiry = await marked_expiry(admin, topics, configs)
    elrs = await eligible_leaders(admin, list(topics))
    lines = []
    for name, t in topics.items():
        parts = sorted(t.partitions, key=lambda p: p.partition_index)
        rf = len(parts[0].replica_nodes) if parts else 0
        cfg = ",".join(f"{k}={v}" for k, v in non_default_configs(configs.get(name, [])).items())
        lines.append(
            f"Topic: {name}\tTopicId: {topic_id_str(t.topic_id)}\tPartitionCount: {len(parts)}\t"
            f"ReplicationFactor: {rf}\tConfigs: {cfg}" + count_field(t, len(parts))
        )
        for p in parts:
            leader = p.leader_id if p.leader_id >= 0 else "none"
            line = (
                f"\tTopic: {name}\tPartition: {p.partition_index}\tLeader: {leader}\t"
                f"Replicas: {','.join(map(str, p.replica_nodes))}\tIsr: {','.join(map(str, p.isr_nodes))}"
            )
            elr, last_known = elrs.get((name, p.partition_index), ("N/A", "N/A"))
            line += f"\tElr: {elr}\tLastKnownElr: {last_known}"
            if p.offline_replicas:
                line += f"\tOffline: {','.join(map(str, p.offline_replicas))}"
            if p.marked_for_deletion:
                line += "\tMarkedForDeletion: true" + expiry.get((name, p.partition_index), "")
            lines.append(line + chunk_fields(p))
            lines.extend(chunk_lines(p))
    if lines:
        print("\n".join(lines))


async def eligible_leaders(admin: Admin, names: list[str]) -> dict[tuple[str, int], tuple[str, str]]:
    """Each partition's ELR and last known ELR (KIP-966), from DescribeTopicPartitions as Kafka
    4.x's tool reads them, a page at a time; partitions it does not answer print N/A, as Kafka's
    tool does when it falls back to Metadata."""
    out: dict[tuple[str, int], tuple[str, str]] = {}
    if not names:
        return out
    R = DescribeTopicPartitionsRequest
    cursor = None
    while True:
        try:
            resp = await admin.request(R(topics=[R.TopicRequest(name=n) for n in sorted(names)],
                                         response_partition_limit=2000, cursor=cursor))
        except AdminError:
            return out
        for t in resp.topics:
            for p in t.partitions if not t.error_code else ():
                out[(t.name, p.partition_index)] = (
                    ",".join(map(str, p.eligible_leader_replicas or ())),
                    ",".join(map(str, p.last_known_elr or ())),
                )
        if resp.next_cursor is None:
            return out
        cursor = R.Cursor(topic_name=resp.next_cursor.topic_name, partition_index=resp.next_cursor.partition_index)


async def marked_expiry(admin: Admin, topics: dict[str, Any], configs: dict[str, list[Any]]) -> dict[tuple[str, int], str]:
    """For each partition marked for deletion (KIP-253), when retention empties it: its newest
    record's time (ListOffsets MAX_TIMESTAMP to its leader) + the topic's retention.ms, as
    `\tEmptiedByRetentionIn: 12.3s (2026-01-01T00:00:12Z)`; `0s (empty)` once log start == log
    end (the controller deletes it at its next check); `never (...)` when no time retention runs."""
    marked = [(n, p.partition_index) for n, t in topics.items() for p in t.partitions if p.marked_for_deletion]
    if not marked:
        return {}
    out: dict[tuple[str, int], str] = {}
    async with Brokers(admin) as brokers:
        try:
            start = await brokers.list_offsets(dict.fromkeys(marked, EARLIEST))
            end = await brokers.list_offsets(dict.fromkeys(marked, LATEST))
            newest = await brokers.list_offsets(dict.fromkeys(marked, MAX_TIMESTAMP))
        except AdminError:
            return {}  # a leader unreachable: the partition lines still print
    now_ms = time.time() * 1000
    for tp in marked:
        cfg = {e.name: e.value for e in configs.get(tp[0], [])}
        retention_ms = int(cfg.get("retention.ms") or 604800000)
        if start[tp].error_code or end[tp].error_code:
            continue
        if start[tp].offset >= end[tp].offset:
            text = "0s (empty)"
        elif "delete" not in str(cfg.get("cleanup.policy") or "delete"):
            text = "never (cleanup.policy has no delete)"
        elif retention_ms < 0:
            text = "never (retention.ms=-1)"
        elif newest[tp].error_code or newest[tp].timestamp < 0:
            continue
        else:
            at = newest[tp].timestamp + retention_ms
            when = datetime.fromtimestamp(at / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            text = f"{max(0.0, (at - now_ms) / 1000):.1f}s ({when})"
        out[tp] = f"\tEmptiedByRetentionIn: {text}"
    return out


def count_field(t: Any, partitions: int) -> str:
    """KIP-253's undeleted_partition_count (Metadata's tagged UndeletedPartitionCount), shown when
    some partitions are marked for deletion, i.e. when it differs from the partition count."""
    n = t.undeleted_partition_count
    return f"\tUndeletedPartitionCount: {n}" if 0 <= n != partitions else ""


def chunk_fields(p: Any) -> str:
    """The active chunk's start offset, on the partition line of a partition that has chunks
    (Metadata's tagged StartOffset; absent, -1, for partitions that never had one)."""
    return f"\tStartOffset: {p.start_offset}" if p.chunks or p.start_offset > 0 else ""


def chunk_lines(p: Any) -> list[str]:
    """One line per inactive chunk of the partition, oldest first (Metadata's tagged Chunks)."""
    return [
        f"\t\tChunk\tStartOffset: {c.start_offset}\tStopOffset: {c.stop_offset}\tEndOffset: {c.end_offset}\t"
        f"Replicas: {','.join(map(str, c.replica_nodes))}\tIsr: {','.join(map(str, c.isr_nodes))}"
        for c in sorted(p.chunks or (), key=lambda c: c.start_offset)
    ]


async def alter(admin: Admin, a: argparse.Namespace) -> None:
    topics = await selected(admin, a)
    if not topics:
        return
    assignments = None
    if a.replica_assignment:
        # As Kafka: the assignment lists every partition; only the new ones are sent.
        assignments = {n: a.replica_assignment[len(t.partitions) :] for n, t in topics.items()}
        for n, new in assignments.items():
            if len(topics[n].partitions) + len(new) != a.partitions:
                raise AdminError(
                    f"--replica-assignment lists {len(a.replica_assignment)} partitions, --partitions says {a.partitions}",
                    Errors.INVALID_REPLICA_ASSIGNMENT,
                )
    results = await admin.create_partitions(
        {n: a.partitions for n in topics}, assignments, timeout_ms=int(a.timeout * 1000)
    )
    for r in results:
        if r.error_code:
            raise broker_error(f"cannot change the partition count of topic '{r.name}'", r.error_code, r.error_message)


async def delete(admin: Admin, a: argparse.Namespace) -> None:
    topics = await selected(admin, a)
    if not topics:
        return
    results = await admin.delete_topics(list(topics), timeout_ms=int(a.timeout * 1000))
    for r in results:
        if r.error_code == Errors.UNKNOWN_TOPIC_OR_PARTITION and a.if_exists:
            continue
        if r.error_code:
            raise broker_error(f"cannot delete topic '{r.name}'", r.error_code, r.error_message)


async def run(a: argparse.Namespace) -> None:
    action = create if a.create else list_topics if a.list else describe if a.describe else alter if a.alter else delete
    async with admin_for(a, a.timeout) as admin:
        await action(admin, a)


def main(argv: Sequence[str] | None = None) -> int:
    ap = build_parser()
    a = ap.parse_tool_args(argv)
    check_args(ap, a)
    return run_tool(run(a))


if __name__ == "__main__":
    sys.exit(main())
