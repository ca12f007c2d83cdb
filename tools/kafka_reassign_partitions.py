"""kafka-reassign-partitions.sh for Strata: generate, execute, verify, cancel and list partition
reassignments.

Same options, JSON files and output as Apache Kafka's tool. A replica's log dir ("log_dirs", seed
kip-113) is "any" or an absolute path: for the others the tool sends AlterReplicaLogDirs to the
replica's broker itself, before and after starting the reassignment, retrying
REPLICA_NOT_AVAILABLE (a replica the reassignment has yet to create there) for up to --timeout
ms (10000); --verify then checks each such replica's dir with DescribeLogDirs and prints a
progress line (bytes copied / total) per move still under way. As Kafka's, --execute
--replica-alter-log-dirs-throttle sets the dynamic broker config
replica.alter.log.dirs.io.max.bytes.per.second on each broker the file moves a replica between
dirs of, and --verify removes it with the other throttles once no reassignment and no log dir move
of the file is under way.
Files are read and checked before anything is sent, and the cluster is checked (topics,
partitions, broker ids) before anything is changed. Errors print one line on stderr and exit 1;
bad arguments exit 2. --verify exits 0 whether or not the reassignment is done, as Kafka's does.
Strata's --verify --wait [--timeout MS] waits until the file's partitions are no longer being
reassigned or moved between log dirs, printing a progress line per copy under way every second
(bytes copied / total, rate and ETA), then prints --verify's status: exit 0 if everything is where
the file says, 1 (one line) otherwise or when --timeout passes. --execute prints the same lines
while it waits to send log dir moves.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from protocol.errors import Errors, error_message, error_name
from protocol.generated.alter_partition_reassignments import AlterPartitionReassignmentsRequest
from protocol.generated.incremental_alter_configs import IncrementalAlterConfigsRequest
from protocol.generated.list_partition_reassignments import ListPartitionReassignmentsRequest
from tools.admin import (
    INT32,
    INT64,
    Admin,
    AdminError,
    ToolArgumentParser,
    admin_for,
    broker_error,
    is_json_int,
    partition_entry,
    ranged_int,
    read_versioned_json,
    run_tool,
)
from tools.log_dirs import alter_dirs, broker_addresses, check_log_dir, describe_dirs, is_retriable_move_error
from tools.progress import Copy, ProgressTracker

ANY_LOG_DIR = "any"
WAIT_INTERVAL = 1.0  # seconds between --verify --wait rounds (and --execute's progress lines)
JSON_VERSION = 1  # the only version of both file formats
RESOURCE_TOPIC, RESOURCE_BROKER = 2, 4  # ConfigResource types
OP_SET, OP_DELETE = 0, 1  # IncrementalAlterConfigs operations

LEADER_RATE = "leader.replication.throttled.rate"
FOLLOWER_RATE = "follower.replication.throttled.rate"
LOG_DIRS_RATE = "replica.alter.log.dirs.io.max.bytes.per.second"
LEADER_REPLICAS = "leader.replication.throttled.replicas"
FOLLOWER_REPLICAS = "follower.replication.throttled.replicas"
BROKER_THROTTLES = (LEADER_RATE, FOLLOWER_RATE, LOG_DIRS_RATE)
TOPIC_THROTTLES = (LEADER_REPLICAS, FOLLOWER_REPLICAS)

ACTIONS = ("generate", "execute", "verify", "cancel", "list")
# Options each action accepts besides --bootstrap-server (Kafka refuses the others).
PERMITTED = {
    "generate": {"topics_to_move_json_file", "broker_list", "disable_rack_aware"},
    "execute": {"reassignment_json_file", "throttle", "replica_alter_log_dirs_throttle", "additional", "timeout"},
    "verify": {"reassignment_json_file", "preserve_throttles", "wait", "timeout"},
    "cancel": {"reassignment_json_file", "preserve_throttles", "timeout"},
    "list": set(),
}
REQUIRED = {
    "generate": ("topics_to_move_json_file", "broker_list"),
    "execute": ("reassignment_json_file",),
    "verify": ("reassignment_json_file",),
    "cancel": ("reassignment_json_file",),
    "list": (),
}

EXISTING_REASSIGNMENT = (
    "Cannot execute because there is an existing partition assignment. Use --additional to override this and "
    "create a new partition assignment in addition to the existing one. The --additional flag can also be used "
    "to change the throttle by resubmitting the current reassignment."
)
RUN_VERIFY_WARNING = (
    "Warning: You must run --verify periodically, until the reassignment completes, to ensure the throttle is removed."
)

TP = tuple[str, int]


def tp_str(tp: TP) -> str:
    return f"{tp[0]}-{tp[1]}"


def ids_str(ids: Iterable[int]) -> str:
    return ",".join(map(str, ids))


def plural(n: int) -> str:
    return "" if n == 1 else "s"


# ---------------------------------------------------------------- files
def _list_of(doc: dict, key: str, path: str) -> list:
    items = doc.get(key, [])
    if not isinstance(items, list):
        raise AdminError(f'{path}: "{key}" must be a list')
    return items


def parse_topics_file(path: str) -> list[str]:
    """{"version":1,"topics":[{"topic":"t"},...]} -> topic names, in file order."""
    doc = read_versioned_json(path, JSON_VERSION)
    topics = []
    for i, entry in enumerate(_list_of(doc, "topics", path)):
        name = entry.get("topic") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not name:
            raise AdminError(f'{path}: topics[{i}] must be an object with a "topic" name')
        topics.append(name)
    if not topics:
        raise AdminError(f"{path} lists no topics to move")
    dup = sorted({t for t in topics if topics.count(t) > 1})
    if dup:
        raise AdminError(f"list of topics to reassign contains duplicate entries: {', '.join(dup)}")
    return topics


def parse_reassignment_file(path: str, *, require_partitions: bool = False) -> list[tuple[TP, list[int]]]:
    """Kafka's reassignment JSON -> [((topic, partition), replicas)] in file order, after the
    checks Kafka makes (plus: log dirs other than "any" are refused, Strata cannot move them)."""
    doc = read_versioned_json(path, JSON_VERSION)
    out: list[tuple[TP, list[int]]] = []
    for i, entry in enumerate(_list_of(doc, "partitions", path)):
        where = f"{path}: partitions[{i}]"
        topic, partition = partition_entry(entry, where)
        replicas = entry.get("replicas")
        tp_text = tp_str((topic, partition))
        if not isinstance(replicas, list) or not all(is_json_int(r, INT32) for r in replicas):
            raise AdminError(f'{where} ({tp_text}) needs "replicas", a list of broker ids')
        log_dirs = entry.get("log_dirs", [ANY_LOG_DIR] * len(replicas))
        if not isinstance(log_dirs, list) or not all(isinstance(d, str) for d in log_dirs):
            raise AdminError(f'{where} ({tp_text}): "log_dirs" must be a list of strings')
        if len(log_dirs) != len(replicas):
            raise AdminError(
                f"size of replicas list {json.dumps(replicas)} is different from size of log dirs list "
                f"{json.dumps(log_dirs)} for partition {tp_text}"
            )
        for broker, d in zip(replicas, log_dirs):
            check_log_dir(d, f"partition {tp_text}, broker {broker}")
        out.append(((topic, partition), replicas))
    if require_partitions and not out:
        raise AdminError(f"{path}: partition reassignment list cannot be empty")
    seen: set[TP] = set()
    dup_parts = []
    for tp, _ in out:
        if tp in seen and tp not in dup_parts:
            dup_parts.append(tp)
        seen.add(tp)
    if dup_parts:
        raise AdminError(
            f"partition reassignment contains duplicate topic partitions: {','.join(map(tp_str, dup_parts))}"
        )
    for tp, replicas in out:
        if not replicas:
            raise AdminError(f"partition replica list of {tp_str(tp)} cannot be empty")
        dup = sorted({r for r in replicas if replicas.count(r) > 1})
        if dup:
            raise AdminError(
                f"partition replica lists may not contain duplicate entries: {tp_str(tp)} contains "
                f"multiple entries for {ids_str(dup)}"
            )
    return out


def parse_log_dirs(path: str) -> dict[tuple[TP, int], str]:
    """(partition, broker) -> log dir, for the replicas of the (already checked) file whose dir is not "any"."""
    doc = read_versioned_json(path, JSON_VERSION)
    out = {}
    for entry in _list_of(doc, "partitions", path):
        replicas = entry["replicas"]
        for broker, d in zip(replicas, entry.get("log_dirs", [ANY_LOG_DIR] * len(replicas))):
            if d != ANY_LOG_DIR:
                out[((entry["topic"], entry["partition"]), broker)] = d
    return out


def format_reassignment_json(assignment: Mapping[TP, Sequence[int]]) -> str:
    """Kafka's reassignment JSON (compact, partitions sorted by topic then partition)."""
    doc = {
        "version": JSON_VERSION,
        "partitions": [
            {
                "topic": tp[0],
                "partition": tp[1],
                "replicas": list(assignment[tp]),
                "log_dirs": [ANY_LOG_DIR] * len(assignment[tp]),
            }
            for tp in sorted(assignment)
        ],
    }
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False)


# ---------------------------------------------------------------- replica placement (--generate)
def rack_alternated(racks: Mapping[int, str]) -> list[int]:
    """Brokers ordered so that neighbours sit in different racks: the first broker of each rack
    (racks in name order, brokers in id order), then the second of each, and so on."""
    by_rack: dict[str, list[int]] = {}
    for b in sorted(racks):
        by_rack.setdefault(racks[b], []).append(b)
    columns = [by_rack[r] for r in sorted(by_rack)]
    return [col[i] for i in range(max(map(len, columns))) for col in columns if i < len(col)]


def _follower_index(first: int, shift: int, k: int, n: int) -> int:
    # Every other position of the ring, starting `shift` places after the first replica.
    return (first + 1 + (shift + k) % (n - 1)) % n


def assign_replicas(
    brokers: Mapping[int, str | None],
    partitions: int,
    replication_factor: int,
    *,
    start: int | None = None,
    shift: int | None = None,
    rng: random.Random | None = None,
) -> dict[int, list[int]]:
    """Kafka's replica placement for --generate: first replicas round-robin over the brokers
    (from a random start), followers at an increasing shift so a broker's partitions spread
    their other replicas over all the other brokers. When the brokers have racks, the ring
    alternates racks and each partition takes a replica in every rack before doubling up."""
    if partitions <= 0:
        raise AdminError("number of partitions must be larger than 0")
    if replication_factor <= 0:
        raise AdminError("replication factor must be larger than 0")
    if replication_factor > len(brokers):
        raise AdminError(
            f"replication factor {replication_factor} is larger than the number of brokers given ({len(brokers)})",
            Errors.INVALID_REPLICATION_FACTOR,
        )
    racked = {b: r for b, r in brokers.items() if r is not None}
    if racked and len(racked) != len(brokers):
        raise AdminError("not all brokers have rack information for replica rack aware assignment")
    ring = rack_alternated(racked) if racked else sorted(brokers)
    n = len(ring)
    rng = rng or random.Random()
    start = rng.randrange(n) if start is None else start
    shift = rng.randrange(n) if shift is None else shift
    n_racks = len(set(racked.values()))
    out: dict[int, list[int]] = {}
    for p in range(partitions):
        if p > 0 and p % n == 0:
            shift += 1
        first = (p + start) % n
        replicas = [ring[first]]
        if not racked:
            replicas += [ring[_follower_index(first, shift, k, n)] for k in range(replication_factor - 1)]
        else:
            used_racks = {racked[ring[first]]}
            k = 0
            while len(replicas) < replication_factor:
                b = ring[_follower_index(first, shift * n_racks, k, n)]
                k += 1
                rack_ok = racked[b] not in used_racks or len(used_racks) == n_racks
                if rack_ok and b not in replicas:
                    replicas.append(b)
                    used_racks.add(racked[b])
        out[p] = replicas
    return out


# ---------------------------------------------------------------- cluster
class ClusterView:
    """Brokers (id -> rack) and the replicas of the partitions of some topics, from Metadata."""

    def __init__(self, brokers: dict[int, str | None], replicas: dict[str, dict[int, list[int]]]) -> None:
        self.brokers = brokers
        self.replicas = replicas

    def partition(self, tp: TP) -> list[int]:
        parts = self.replicas.get(tp[0])
        if parts is None:
            raise AdminError(f"topic '{tp[0]}' does not exist", Errors.UNKNOWN_TOPIC_OR_PARTITION)
        if tp[1] not in parts:
            raise AdminError(f"partition {tp_str(tp)} does not exist", Errors.UNKNOWN_TOPIC_OR_PARTITION)
        return parts[tp[1]]

    def check_brokers(self, ids: Iterable[int], where: str = "") -> None:
        for b in ids:
            if b not in self.brokers:
                raise AdminError(f"unknown broker id {b}{where}")


async def cluster_view(admin: Admin, topics: Iterable[str]) -> ClusterView:
    names = sorted(set(topics))
    md = await admin.metadata(names)
    if md.error_code:
        raise broker_error("cannot read cluster metadata", md.error_code)
    replicas: dict[str, dict[int, list[int]]] = {}
    for t in md.topics:
        if t.error_code == Errors.UNKNOWN_TOPIC_OR_PARTITION:
            continue
        if not t.partitions:  # only an error (a topic being created or deleted) leaves none
            raise broker_error(f"cannot describe topic '{t.name}'", t.error_code or Errors.UNKNOWN_SERVER_ERROR)
        replicas[t.name] = {p.partition_index: list(p.replica_nodes) for p in t.partitions}
    for name in names:
        if name not in replicas:
            raise AdminError(f"topic '{name}' does not exist", Errors.UNKNOWN_TOPIC_OR_PARTITION)
    return ClusterView({b.node_id: b.rack for b in md.brokers}, replicas)


async def list_reassignments(admin: Admin, tps: Iterable[TP] | None = None) -> dict[TP, Any]:
    """The ongoing reassignments (of `tps`, or all): (topic, partition) -> OngoingPartitionReassignment."""
    R = ListPartitionReassignmentsRequest
    topics = None
    if tps is not None:
        by_topic: dict[str, list[int]] = {}
        for t, p in sorted(set(tps)):
            by_topic.setdefault(t, []).append(p)
        topics = [R.ListPartitionReassignmentsTopics(name=t, partition_indexes=ps) for t, ps in by_topic.items()]
    resp = await admin.request(R(timeout_ms=30000, topics=topics), to_controller=True)
    if resp.error_code:
        raise broker_error("cannot list partition reassignments", resp.error_code, resp.error_message)
    return {(t.name, p.partition_index): p for t in resp.topics for p in t.partitions}


async def alter_reassignments(admin: Admin, targets: Mapping[TP, list[int] | None], what: str) -> None:
    """Start (replicas) or cancel (None) reassignments; one error line naming every failed partition."""
    R = AlterPartitionReassignmentsRequest
    by_topic: dict[str, list[Any]] = {}
    for (t, p), replicas in sorted(targets.items()):
        by_topic.setdefault(t, []).append(R.ReassignablePartition(partition_index=p, replicas=replicas))
    req = R(timeout_ms=30000, topics=[R.ReassignableTopic(name=t, partitions=ps) for t, ps in by_topic.items()])
    resp = await admin.request(req, to_controller=True)
    if resp.error_code:
        raise broker_error(f"cannot {what}", resp.error_code, resp.error_message)
    errors = sorted(
        ((t.name, p.partition_index), p.error_code, p.error_message)
        for t in resp.responses
        for p in t.partitions
        if p.error_code
    )
    if len(errors) == 1:
        tp, code, msg = errors[0]
        raise broker_error(f"cannot {what} of partition {tp_str(tp)}", code, msg)
    if errors:
        detail = "; ".join(
            f"{tp_str(tp)}: {(msg or '').strip() or error_message(code)} ({error_name(code)})"
            for tp, code, msg in errors
        )
        raise AdminError(f"cannot {what} of {len(errors)} partitions: {detail}")


async def alter_configs(admin: Admin, changes: Mapping[tuple[int, str], Sequence[tuple[str, int, str | None]]]) -> None:
    """IncrementalAlterConfigs: {(resource type, name): [(config, operation, value)]}."""
    if not changes:
        return
    R = IncrementalAlterConfigsRequest
    req = R(
        resources=[
            R.AlterConfigsResource(
                resource_type=rtype,
                resource_name=name,
                configs=[R.AlterableConfig(name=k, config_operation=op, value=v) for k, op, v in ops],
            )
            for (rtype, name), ops in changes.items()
        ]
    )
    resp = await admin.request(req, to_controller=True)
    for r in resp.responses:
        if r.error_code:
            kind = "broker" if r.resource_type == RESOURCE_BROKER else "topic"
            raise broker_error(f"cannot alter configs of {kind} '{r.resource_name}'", r.error_code, r.error_message)


# ---------------------------------------------------------------- throttles
class Move:
    """Where a partition's data comes from (sources) and goes to (destinations)."""

    def __init__(self, sources: Iterable[int], destinations: Iterable[int]) -> None:
        self.sources = set(sources)
        self.destinations = set(destinations) - self.sources


def proposed_moves(
    ongoing: Mapping[TP, Any], proposed: Mapping[TP, list[int]], current: Mapping[TP, list[int]]
) -> dict[TP, Move]:
    """As Kafka: every ongoing reassignment keeps its move, then the proposed ones are added,
    their sources being the replicas that hold the data now (not counting replicas still being added)."""
    moves = {tp: Move(set(r.replicas) - set(r.adding_replicas), r.adding_replicas) for tp, r in ongoing.items()}
    for tp, replicas in proposed.items():
        sources = moves[tp].sources if tp in moves else set(current[tp])
        moves[tp] = Move(sources, replicas)
    return moves


def throttled_replicas(moves: Mapping[TP, Move]) -> tuple[dict[str, str], dict[str, str]]:
    """Topic -> leader.replication.throttled.replicas (the sources) and
    follower.replication.throttled.replicas (the destinations), as "partition:broker,..." lists."""
    leader: dict[str, list[tuple[int, int]]] = {}
    follower: dict[str, list[tuple[int, int]]] = {}
    for (topic, p), m in moves.items():
        leader.setdefault(topic, []).extend((p, b) for b in m.sources)
        follower.setdefault(topic, []).extend((p, b) for b in m.destinations)

    def fmt(pairs: list[tuple[int, int]]) -> str:
        return ",".join(f"{p}:{b}" for p, b in sorted(set(pairs)))

    return {t: fmt(v) for t, v in leader.items()}, {t: fmt(v) for t, v in follower.items()}


async def set_throttles(admin: Admin, moves: Mapping[TP, Move], rate: int) -> None:
    leader, follower = throttled_replicas(moves)
    await alter_configs(
        admin,
        {
            (RESOURCE_TOPIC, t): [(LEADER_REPLICAS, OP_SET, leader[t]), (FOLLOWER_REPLICAS, OP_SET, follower[t])]
            for t in sorted(leader)
        },
    )
    brokers = sorted({b for m in moves.values() for b in m.sources | m.destinations})
    await alter_configs(
        admin,
        {
            (RESOURCE_BROKER, str(b)): [(LEADER_RATE, OP_SET, str(rate)), (FOLLOWER_RATE, OP_SET, str(rate))]
            for b in brokers
        },
    )
    print(f"The inter-broker throttle limit was set to {rate} B/s")


async def set_log_dirs_throttle(admin: Admin, dirs: Mapping[tuple[TP, int], str], rate: int) -> None:
    """As Kafka: the log dir move rate on each broker the file moves a replica between dirs of."""
    brokers = sorted({b for _, b in dirs})
    await alter_configs(admin, {(RESOURCE_BROKER, str(b)): [(LOG_DIRS_RATE, OP_SET, str(rate))] for b in brokers})
    print(f"The replica-alter-dir throttle limit was set to {rate} B/s")


async def clear_throttles(admin: Admin, targets: Sequence[tuple[TP, list[int]]], view: ClusterView) -> None:
    """Remove every throttle a reassignment may have set: the brokers' rates on all brokers
    (the cluster's and the targets'), the throttled replica lists of the targets' topics."""
    brokers = sorted(set(view.brokers) | {b for _, replicas in targets for b in replicas})
    print(f"Clearing broker-level throttles on broker{plural(len(brokers))} {ids_str(brokers)}")
    await alter_configs(
        admin, {(RESOURCE_BROKER, str(b)): [(k, OP_DELETE, None) for k in BROKER_THROTTLES] for b in brokers}
    )
    topics = sorted({tp[0] for tp, _ in targets})
    print(f"Clearing topic-level throttles on topic{plural(len(topics))} {','.join(topics)}")
    await alter_configs(admin, {(RESOURCE_TOPIC, t): [(k, OP_DELETE, None) for k in TOPIC_THROTTLES] for t in topics})


# ---------------------------------------------------------------- actions
async def generate(admin: Admin, a: argparse.Namespace) -> None:
    topics = parse_topics_file(a.topics_to_move_json_file)
    view = await cluster_view(admin, topics)
    view.check_brokers(a.broker_list, " in --broker-list")
    rack_aware = not a.disable_rack_aware
    chosen = {b: view.brokers[b] if rack_aware else None for b in a.broker_list}
    if rack_aware and any(r is None for r in chosen.values()) and any(r is not None for r in chosen.values()):
        raise AdminError(
            "not all brokers have rack information; add --disable-rack-aware to make the assignment without racks"
        )
    current = {(t, p): replicas for t in topics for p, replicas in view.replicas[t].items()}
    proposed = {}
    for t in topics:
        parts = view.replicas[t]
        rf = len(parts[min(parts)])
        for p, replicas in assign_replicas(chosen, len(parts), rf).items():
            proposed[(t, p)] = replicas
    print(f"Current partition replica assignment\n{format_reassignment_json(current)}\n")
    print(f"Proposed partition reassignment configuration\n{format_reassignment_json(proposed)}")


async def execute(admin: Admin, a: argparse.Namespace) -> None:
    targets = parse_reassignment_file(a.reassignment_json_file, require_partitions=True)
    proposed = dict(targets)
    ongoing = await list_reassignments(admin)
    if ongoing and not a.additional:
        raise AdminError(EXISTING_REASSIGNMENT, Errors.REASSIGNMENT_IN_PROGRESS)
    view = await cluster_view(admin, (tp[0] for tp in proposed))
    current = {tp: view.partition(tp) for tp in sorted(proposed)}
    for tp, replicas in targets:
        view.check_brokers(replicas, f" in the replicas of {tp_str(tp)}")
    print(
        f"Current partition replica assignment\n\n{format_reassignment_json(current)}\n\n"
        "Save this to use as the --reassignment-json-file option during rollback"
    )
    dirs = parse_log_dirs(a.reassignment_json_file)
    throttle = a.throttle is not None and a.throttle >= 0
    log_dirs_throttle = a.replica_alter_log_dirs_throttle is not None and a.replica_alter_log_dirs_throttle >= 0
    if throttle or log_dirs_throttle:
        print(RUN_VERIFY_WARNING)
    if throttle:
        await set_throttles(admin, proposed_moves(ongoing, proposed, current), a.throttle)
    if log_dirs_throttle:
        await set_log_dirs_throttle(admin, dirs, a.replica_alter_log_dirs_throttle)
    addresses = await broker_addresses(admin) if dirs else {}
    # KIP-113: log dir moves first (a replica not there yet answers REPLICA_NOT_AVAILABLE)...
    pending = await send_log_dir_moves(admin, addresses, dirs)
    changed = {tp: r for tp, r in proposed.items() if r != current[tp]}
    if changed or not dirs:
        await alter_reassignments(admin, changed or proposed, "start the reassignment")
        names = ",".join(tp_str(tp) for tp in sorted(changed or proposed))
        print(f"Successfully started partition reassignment{plural(len(changed or proposed))} for {names}")
    # ... then again for those, until the reassignment has created them or --timeout passes
    deadline = time.monotonic() + (a.timeout if a.timeout is not None else 10000) / 1000
    tracker, shown = ProgressTracker(), time.monotonic()
    while pending and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
        pending = await send_log_dir_moves(admin, addresses, pending)
        if pending and time.monotonic() - shown >= WAIT_INTERVAL:  # the copies the moves wait for
            shown = time.monotonic()
            for c in await reassignment_copies(admin, await list_reassignments(admin, {tp for tp, _ in pending})):
                print(tracker.line(c), flush=True)
    if pending:
        culprits = ", ".join(f"{tp_str(tp)} on broker {b}" for tp, b in sorted(pending))
        raise AdminError(f"timed out waiting for the replicas {culprits} to be created to move them to their log dirs",
                         Errors.REPLICA_NOT_AVAILABLE)
    if dirs:
        names = ",".join(f"{tp_str(tp)}-{b}" for tp, b in sorted(dirs))
        print(f"Successfully started log directory move{plural(len(dirs))} for: {names}")


async def send_log_dir_moves(admin: Admin, addresses: dict, dirs: Mapping[tuple[TP, int], str]) -> dict:
    """AlterReplicaLogDirs to each broker; the moves it answered REPLICA_NOT_AVAILABLE (to retry).
    Any other error stops the tool with a line naming the replica and the dir."""
    by_broker: dict[int, dict[TP, str]] = {}
    for (tp, b), d in dirs.items():
        by_broker.setdefault(b, {})[tp] = d
    retry = {}
    for b, moves in sorted(by_broker.items()):
        for tp, code in sorted((await alter_dirs(admin, addresses, b, moves)).items()):
            if code == 0:
                continue
            if is_retriable_move_error(code):
                retry[(tp, b)] = moves[tp]
            else:
                raise broker_error(f'cannot move replica {tp_str(tp)} on broker {b} to log dir "{moves[tp]}"', code)
    return retry


async def verify(admin: Admin, a: argparse.Namespace) -> None:
    targets = parse_reassignment_file(a.reassignment_json_file)
    dirs = parse_log_dirs(a.reassignment_json_file)
    if a.wait:
        await wait_for_completion(admin, targets, dirs, a.timeout)
    ongoing = await list_reassignments(admin)
    view = await cluster_view(admin, (tp[0] for tp, _ in targets))
    lines = ["Status of partition reassignment:"]
    unfinished = []
    for tp, target in sorted(targets):
        current = view.partition(tp)
        if tp in ongoing:
            lines.append(f"Reassignment of partition {tp_str(tp)} is still in progress.")
            unfinished.append(tp_str(tp))
        elif current == target:
            lines.append(f"Reassignment of partition {tp_str(tp)} is completed.")
        else:
            lines.append(
                f"There is no active reassignment of partition {tp_str(tp)}, but replica set is "
                f"{ids_str(current)} rather than {ids_str(target)}."
            )
            unfinished.append(tp_str(tp))
    moving: set[tuple[TP, int]] = set()
    if dirs:
        status = await log_dir_status(admin, dirs)
        lines += status.lines
        unfinished += [f"{tp_str(tp)}-{b}" for tp, b in sorted(status.elsewhere)]
        moving = status.moving | status.missing
    print("\n".join(lines))
    # As Kafka: throttles go only once no reassignment at all is left (a throttle set for another
    # reassignment cannot be told apart from ours) and no log dir move of the file is under way
    # (or waits for its replica).
    if not ongoing and not moving and not a.preserve_throttles:
        await clear_throttles(admin, targets, view)
    if a.wait and unfinished:
        raise AdminError(f"the reassignment ended without reaching the file's assignment for {', '.join(unfinished)}")


async def wait_for_completion(admin: Admin, targets: Sequence[tuple[TP, list[int]]],
                              dirs: Mapping[tuple[TP, int], str], timeout_ms: int | None) -> None:
    """--verify --wait: until no partition of the file is being reassigned and no replica of it is
    being moved between log dirs, print a progress line per copy under way every WAIT_INTERVAL
    seconds; AdminError once `timeout_ms` (if given) has passed."""
    tps = [tp for tp, _ in targets]
    deadline = None if timeout_ms is None else time.monotonic() + timeout_ms / 1000
    tracker = ProgressTracker()
    while True:
        ongoing = await list_reassignments(admin, tps)
        copies = await reassignment_copies(admin, ongoing)
        moving: set[tuple[TP, int]] = set()
        if dirs:
            status = await log_dir_status(admin, dirs)
            copies += status.copies
            # a replica not yet in its dir is waited for while a move copies it or while its
            # partition's reassignment may still create it (then the move starts)
            moving = status.moving | {key for key in status.elsewhere if key[0] in ongoing}
        if not ongoing and not moving:
            return
        for c in copies:
            print(tracker.line(c), flush=True)
        if deadline is not None and time.monotonic() >= deadline:
            names = [tp_str(tp) for tp in sorted(ongoing)] + [f"{tp_str(tp)}-{b}" for tp, b in sorted(moving)]
            raise AdminError(f"timed out after {timeout_ms} ms waiting for the reassignment to complete; still in "
                             f"progress: {', '.join(names)}", Errors.REQUEST_TIMED_OUT)
        await asyncio.sleep(WAIT_INTERVAL)


async def reassignment_copies(admin: Admin, ongoing: Mapping[TP, Any]) -> list[Copy]:
    """Each adding replica of an ongoing reassignment: its bytes (DescribeLogDirs on its broker)
    against the leader's, for the partition's active chunk (the one a reassignment moves)."""
    if not ongoing:
        return []
    md = await admin.metadata(sorted({t for t, _ in ongoing}))
    leaders = {(t.name, p.partition_index): p.leader_id for t in md.topics for p in t.partitions}
    addresses = {b.node_id: (b.host, b.port) for b in md.brokers}
    wanted: dict[int, dict[str, set[int]]] = {}
    for tp, r in ongoing.items():
        for b in (leaders.get(tp, -1), *r.adding_replicas):
            if b in addresses:
                wanted.setdefault(b, {}).setdefault(tp[0], set()).add(tp[1])
    sizes: dict[tuple[TP, int], dict[int, int]] = {}  # (partition, broker) -> chunk start -> bytes
    for b, parts in sorted(wanted.items()):
        try:
            infos = await describe_dirs(admin, addresses, b, partitions={t: sorted(ps) for t, ps in parts.items()})
        except AdminError:
            continue  # a broker gone away: its copies are left out of this round
        for d in infos:
            for r in d.replicas:
                if not r.is_future:
                    chunks = sizes.setdefault(((r.topic, r.partition), b), {})
                    chunks[r.chunk_start] = chunks.get(r.chunk_start, 0) + r.size
    copies = []
    for tp, r in sorted(ongoing.items()):
        lead = sizes.get((tp, leaders.get(tp, -1)))
        if not lead:
            continue
        start = max(lead)
        for b in r.adding_replicas:
            copied = sizes.get((tp, b), {}).get(start, 0)
            copies.append(Copy(f"partition {tp_str(tp)} to broker {b}", copied, lead[start]))
    return copies


@dataclass
class LogDirStatus:
    lines: list[str]  # --verify's lines
    copies: list[Copy]  # the moves copying now
    moving: set[tuple[TP, int]]  # (partition, broker) with a move copying
    elsewhere: set[tuple[TP, int]]  # (partition, broker) not (yet) in the file's log dir
    missing: set[tuple[TP, int]]  # (partition, broker) with no live replica found


async def log_dir_status(admin: Admin, dirs: Mapping[tuple[TP, int], str]) -> LogDirStatus:
    """KIP-113's check: DescribeLogDirs on each broker holding a replica with a log dir."""
    addresses = await broker_addresses(admin)
    status = LogDirStatus(["Status of log directory reassignment:"], [], set(), set(), set())
    lines = status.lines
    by_broker: dict[int, dict[str, list[int]]] = {}
    for (tp, b) in dirs:
        by_broker.setdefault(b, {}).setdefault(tp[0], []).append(tp[1])
    for b, parts in sorted(by_broker.items()):
        if b not in addresses:
            for t, ps in sorted(parts.items()):
                lines += [f"Unable to check the log dir of replica {t}-{p}-{b}: broker {b} is not live." for p in ps]
                status.elsewhere |= {((t, p), b) for p in ps}
                status.missing |= {((t, p), b) for p in ps}
            continue
        infos = await describe_dirs(admin, addresses, b, partitions=parts)
        for t, ps in sorted(parts.items()):
            for p in sorted(ps):
                want = dirs[((t, p), b)]
                live = [(d, r) for d in infos for r in d.replicas if (r.topic, r.partition) == (t, p) and not r.is_future]
                future = [(d, r) for d in infos for r in d.replicas if (r.topic, r.partition) == (t, p) and r.is_future]
                name = f"replica {t}-{p}-{b}"
                done = bool(live) and not future and all(_same_dir(d.path, want) for d, _ in live)
                if not done:
                    status.elsewhere.add(((t, p), b))
                if future:
                    copied = sum(r.size for _, r in future)
                    total = sum(r.size for _, r in live) or copied
                    lines.append(f"Reassignment of {name} is still in progress: {copied} / {total} bytes copied "
                                 f"to {future[0][0].path}.")
                    status.copies.append(Copy(f"{name} to {future[0][0].path}", copied, total))
                    status.moving.add(((t, p), b))
                elif done:
                    lines.append(f"Reassignment of {name} is completed.")
                elif live:
                    lines.append(f"Reassignment of {name} is not started: it is in {live[0][0].path}, not {want}.")
                elif any(not d.is_live for d in infos):
                    lines.append(f"Partition {t}-{p} is not found in any live log dir on broker {b}. "
                                 "There is likely an offline log directory on the broker.")
                    status.missing.add(((t, p), b))
                else:
                    lines.append(f"Partition {t}-{p} cannot be found in any live log directory on broker {b}.")
                    status.missing.add(((t, p), b))
    return status


def _same_dir(a: str, b: str) -> bool:
    return os.path.normpath(a) == os.path.normpath(b)


async def cancel(admin: Admin, a: argparse.Namespace) -> None:
    targets = parse_reassignment_file(a.reassignment_json_file)
    view = await cluster_view(admin, (tp[0] for tp, _ in targets))
    for tp, _ in targets:
        view.partition(tp)
    active = sorted(await list_reassignments(admin, [tp for tp, _ in targets])) if targets else []
    if active:
        await alter_reassignments(admin, dict.fromkeys(active), "cancel the reassignment")
        names = ",".join(map(tp_str, active))
        print(f"Successfully cancelled partition reassignment{plural(len(active))} for: {names}")
    else:
        print("None of the specified partition reassignments are active.")
    if not a.preserve_throttles:
        await clear_throttles(admin, targets, view)


async def list_action(admin: Admin, a: argparse.Namespace) -> None:
    ongoing = await list_reassignments(admin)
    if not ongoing:
        print("No partition reassignments found.")
        return
    lines = ["Current partition reassignments:"]
    for tp in sorted(ongoing):
        r = ongoing[tp]
        line = f"{tp_str(tp)}: replicas: {ids_str(r.replicas)}."
        if r.adding_replicas:
            line += f" adding: {ids_str(r.adding_replicas)}."
        if r.removing_replicas:
            line += f" removing: {ids_str(r.removing_replicas)}."
        lines.append(line)
    print("\n".join(lines))


# ---------------------------------------------------------------- command line
def parse_broker_list(value: str) -> list[int]:
    try:
        ids = [int(x) for x in value.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value[:60]!r} is not a comma-separated list of broker ids") from None
    if not all(INT32[0] <= b <= INT32[1] for b in ids):
        raise argparse.ArgumentTypeError(f"a broker id is out of range ({INT32[0]}..{INT32[1]})")
    dup = sorted({b for b in ids if ids.count(b) > 1})
    if dup:
        raise argparse.ArgumentTypeError(f"broker list contains duplicate entries: {ids_str(dup)}")
    return ids


def build_parser() -> ToolArgumentParser:
    ap = ToolArgumentParser(
        prog="kafka-reassign-partitions.sh", description="This tool helps to move topic partitions between replicas."
    )
    ap.add_argument("--bootstrap-server", required=True, metavar="HOST:PORT[,...]", help="brokers to connect to")
    actions = ap.add_mutually_exclusive_group(required=True)
    actions.add_argument("--generate", action="store_true", help="generate a candidate reassignment (changes nothing)")
    actions.add_argument("--execute", action="store_true", help="start the reassignment in --reassignment-json-file")
    actions.add_argument("--verify", action="store_true", help="report progress; remove the throttles once done")
    actions.add_argument("--cancel", action="store_true", help="cancel the active reassignments of the file")
    actions.add_argument("--list", action="store_true", help="list all active partition reassignments")
    ap.add_argument(
        "--reassignment-json-file",
        metavar="FILE",
        help='{"version":1,"partitions":[{"topic":"foo","partition":1,"replicas":[1,2,3],"log_dirs":["any","any","any"]}]}'
        ' ("log_dirs" is optional)',
    )
    ap.add_argument(
        "--topics-to-move-json-file", metavar="FILE", help='with --generate: {"version":1,"topics":[{"topic":"foo"}]}'
    )
    ap.add_argument(
        "--broker-list", type=parse_broker_list, metavar="ID,ID,...", help="with --generate: target brokers"
    )
    ap.add_argument("--disable-rack-aware", action="store_true", help="with --generate: ignore the brokers' racks")
    ap.add_argument("--throttle", type=ranged_int(*INT64), metavar="BYTES/S", help="with --execute: inter-broker replication throttle")
    ap.add_argument(
        "--replica-alter-log-dirs-throttle", type=ranged_int(*INT64), metavar="BYTES/S", help="with --execute: log dir move throttle"
    )
    ap.add_argument("--additional", action="store_true", help="with --execute: add to the ongoing reassignments")
    ap.add_argument("--preserve-throttles", action="store_true", help="with --verify/--cancel: leave throttles alone")
    ap.add_argument(
        "--wait", action="store_true",
        help="with --verify: wait until the reassignment and log dir moves are done, printing their progress "
        "(bytes copied / total, ETA); exit 1 if they end elsewhere than the file says or --timeout passes",
    )
    ap.add_argument(
        "--timeout", type=ranged_int(0, INT32[1]), metavar="MS",
        help="with --execute: how long to retry log dir moves of replicas not created yet (default 10000); "
        "with --verify --wait: how long to wait (default: no limit)",
    )
    return ap


def check_args(ap: argparse.ArgumentParser, a: argparse.Namespace) -> str:
    action = next(x for x in ACTIONS if getattr(a, x))
    for dest in REQUIRED[action]:
        if getattr(a, dest) is None:
            ap.error(f"--{action} needs --{dest.replace('_', '-')}")
    optional = {dest for dests in PERMITTED.values() for dest in dests}
    for dest in sorted(optional - PERMITTED[action]):
        if getattr(a, dest) not in (None, False):
            ap.error(f"option --{dest.replace('_', '-')} can't be used with --{action}")
    if action == "verify" and a.timeout is not None and not a.wait:
        ap.error("option --timeout can't be used with --verify without --wait")
    return action


async def run(action: str, a: argparse.Namespace) -> None:
    fn = {"generate": generate, "execute": execute, "verify": verify, "cancel": cancel, "list": list_action}[action]
    # Files are checked before connecting: a bad file fails the same way with or without a cluster.
    if action == "generate":
        parse_topics_file(a.topics_to_move_json_file)
    elif action != "list":
        parse_reassignment_file(a.reassignment_json_file, require_partitions=action == "execute")
    async with admin_for(a, 60.0) as admin:
        await fn(admin, a)


def main(argv: Sequence[str] | None = None) -> int:
    ap = build_parser()
    a = ap.parse_tool_args(argv)
    action = check_args(ap, a)
    return run_tool(run(action, a))


if __name__ == "__main__":
    sys.exit(main())
