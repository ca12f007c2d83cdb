"""kafka-chunks.sh for Strata: create a partition's next chunk, or move an inactive chunk.

    kafka-chunks.sh create --bootstrap-server HOST:PORT --create-chunk-json-file FILE
    kafka-chunks.sh alter  --bootstrap-server HOST:PORT --alter-chunk-json-file FILE

The files are the chunks proposal's formats:
    {"partitions": [{"topic": "t", "partition": 0, "replicas": [1, 2, 3]}, ...]}
    {"chunks": [{"topic": "t", "partition": 0, "startOffset": 289818, "replicas": [4, 5, 6]}, ...]}

The whole file is read and checked against the cluster's Metadata (topics, partitions, chunk
start offsets, broker ids, replica counts; replicas an ongoing reassignment removes do not
count) before anything is sent, so bad input changes
nothing. `create` sends CreateChunks to each partition's active-chunk leader, which fixes the
chunk's offsets; `alter` sends AlterChunkAssignments to the bootstrap broker, which forwards it to
the controller. One line per partition or chunk on stdout; errors are one line on stderr (exit
1), bad arguments exit 2.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from node.client import ClientError, NodeClient
from protocol.errors import Errors
from protocol.generated.alter_chunk_assignments import AlterChunkAssignmentsRequest
from protocol.generated.create_chunks import CreateChunksRequest
from tools.admin import (
    INT32,
    Admin,
    AdminError,
    ToolArgumentParser,
    admin_for,
    broker_error,
    is_json_int,
    partition_entry,
    read_versioned_json,
    run_tool,
)
from tools.kafka_reassign_partitions import list_reassignments

JSON_VERSION = 1  # an optional "version" must be this


@dataclass(frozen=True)
class ChunkSpec:
    """One entry of a chunk file: a partition (create) or a chunk (alter, start_offset set)."""

    topic: str
    partition: int
    replicas: tuple[int, ...]
    start_offset: int | None = None

    @property
    def name(self) -> str:
        tp = f"{self.topic}-{self.partition}"
        return tp if self.start_offset is None else f"chunk {tp}@{self.start_offset}"


def ids_str(ids: Sequence[int]) -> str:
    return ",".join(map(str, ids))


# ---------------------------------------------------------------- files
def parse_chunk_file(path: str, key: str) -> list[ChunkSpec]:
    """`key` "partitions" (create file) or "chunks" (alter file, entries also need startOffset)."""
    doc = read_versioned_json(path, JSON_VERSION)
    items = doc.get(key)
    if not isinstance(items, list):
        raise AdminError(f'{path}: needs "{key}", a list')
    if not items:
        raise AdminError(f'{path}: "{key}" is empty')
    out: list[ChunkSpec] = []
    for i, entry in enumerate(items):
        where = f"{path}: {key}[{i}]"
        topic, partition = partition_entry(entry, where)
        replicas = entry.get("replicas")
        tp = f"{topic}-{partition}"
        start = None
        if key == "chunks":
            start = entry.get("startOffset")
            if not is_json_int(start) or start < 0:
                raise AdminError(f'{where} ({tp}) needs a "startOffset" number >= 0')
        if not isinstance(replicas, list) or not replicas or not all(is_json_int(r, (0, INT32[1])) for r in replicas):
            raise AdminError(f'{where} ({tp}) needs "replicas", a non-empty list of broker ids')
        dup = sorted({r for r in replicas if replicas.count(r) > 1})
        if dup:
            raise AdminError(f"{where} ({tp}) names broker {ids_str(dup)} more than once in {json.dumps(replicas)}")
        out.append(ChunkSpec(topic, partition, tuple(replicas), start))
    seen: set[tuple] = set()
    for s in out:
        k = (s.topic, s.partition, s.start_offset)
        if k in seen:
            raise AdminError(f"{path}: {s.name} is listed more than once")
        seen.add(k)
    return out


# ---------------------------------------------------------------- checks against the cluster
@dataclass
class ClusterView:
    brokers: dict[int, tuple[str, int]]  # id -> (host, port)
    partitions: dict[tuple[str, int], Any]  # (topic, partition) -> Metadata partition entry
    # (topic, partition) -> replicas an ongoing reassignment removes: Metadata lists them among the
    # replicas, but they do not count towards the replication factor
    removing: dict[tuple[str, int], tuple[int, ...]] = field(default_factory=dict)

    def replication_factor(self, topic: str, partition: int) -> int:
        p = self.partitions[(topic, partition)]
        return len(p.replica_nodes) - len(self.removing.get((topic, partition), ()))


async def cluster_view(admin: Admin, topics: Sequence[str], *, with_reassignments: bool = True) -> ClusterView:
    md = await admin.metadata(sorted(set(topics)))
    if md.error_code:
        raise broker_error("cannot read cluster metadata", md.error_code)
    parts = {}
    for t in md.topics:
        if t.error_code == Errors.UNKNOWN_TOPIC_OR_PARTITION:
            continue
        if t.error_code:
            raise broker_error(f"cannot read the metadata of topic '{t.name}'", t.error_code)
        for p in t.partitions:
            parts[(t.name, p.partition_index)] = p
    view = ClusterView({b.node_id: (b.host, b.port) for b in md.brokers}, parts)
    if with_reassignments and parts:
        ongoing = await list_reassignments(admin, parts)
        view.removing = {tp: tuple(r.removing_replicas) for tp, r in ongoing.items()}
    return view


def check_spec(view: ClusterView, s: ChunkSpec) -> Any:
    """The spec's Metadata partition entry, after checking the spec fits the cluster."""
    p = view.partitions.get((s.topic, s.partition))
    if p is None:
        if not any(t == s.topic for t, _ in view.partitions):
            raise AdminError(f"topic '{s.topic}' does not exist", Errors.UNKNOWN_TOPIC_OR_PARTITION)
        raise AdminError(f"partition {s.topic}-{s.partition} does not exist", Errors.UNKNOWN_TOPIC_OR_PARTITION)
    unknown = [b for b in s.replicas if b not in view.brokers]
    if unknown:
        raise AdminError(f"{s.name}: unknown broker id {unknown[0]} (live brokers: {ids_str(sorted(view.brokers))})")
    rf = view.replication_factor(s.topic, s.partition)
    if len(s.replicas) != rf:
        raise AdminError(
            f"{s.name}: {len(s.replicas)} replica(s) {ids_str(s.replicas)} given, "
            f"the partition's replication factor is {rf}",
            Errors.INVALID_REPLICA_ASSIGNMENT,
        )
    if s.start_offset is not None:
        starts = [c.start_offset for c in p.chunks or ()]
        if s.start_offset not in starts:
            have = ", ".join(map(str, starts)) if starts else "none"
            raise AdminError(
                f"{s.topic}-{s.partition} has no inactive chunk starting at offset {s.start_offset} "
                f"(inactive chunks start at: {have})"
            )
    elif p.leader_id < 0:
        raise AdminError(f"{s.name} has no leader to create the chunk", Errors.LEADER_NOT_AVAILABLE)
    return p


# ---------------------------------------------------------------- actions
async def create(admin: Admin, specs: list[ChunkSpec]) -> None:
    view = await cluster_view(admin, [s.topic for s in specs])
    by_leader: dict[int, list[ChunkSpec]] = {}
    for s in specs:
        p = check_spec(view, s)
        by_leader.setdefault(p.leader_id, []).append(s)
    # each leader fixes its partitions' offsets; leaders work in parallel
    answers = await asyncio.gather(*(_create_at(admin, view, b, group) for b, group in by_leader.items()))
    errors = []
    done = {}
    for group, results in zip(by_leader.values(), answers, strict=True):
        for s, r in zip(group, results, strict=True):
            if r.error_code:
                errors.append(broker_error(f"cannot create a chunk of {s.name}", r.error_code, r.error_message))
            else:
                done[(s.topic, s.partition)] = s
    if done:
        after = await cluster_view(admin, [t for t, _ in done], with_reassignments=False)
        for s in specs:
            if (s.topic, s.partition) in done:
                p = after.partitions.get((s.topic, s.partition))
                # Metadata leaves StartOffset out (-1) while the active chunk starts at 0
                start = "?" if p is None else max(p.start_offset, 0)
                print(f"Created a new chunk of {s.name} on brokers {ids_str(s.replicas)}, starting at offset {start}.")
    if errors:
        raise _one(errors)


async def _create_at(admin: Admin, view: ClusterView, leader: int, specs: list[ChunkSpec]) -> list[Any]:
    E = CreateChunksRequest.CreateChunksTopicPartition
    body = CreateChunksRequest(
        topic_partitions=[
            E(
                topic_name=s.topic,
                partition_id=s.partition,
                broker_ids=list(s.replicas),
                start_offset=-1,
                start_timestamp=-1,
                prev_stop_offset=-1,
            )
            for s in specs
        ]
    )
    host, port = view.brokers[leader]
    try:
        async with NodeClient(host, port, client_id="strata-admin", timeout=admin.timeout,
                              security=admin.security) as cl:
            resp = await cl.request(body)
    except ClientError as e:
        raise AdminError(f"cannot reach broker {leader}, leader of {specs[0].name}: {e}") from None
    return list(resp.results)


async def alter(admin: Admin, specs: list[ChunkSpec]) -> None:
    view = await cluster_view(admin, [s.topic for s in specs])
    for s in specs:
        check_spec(view, s)
    A = AlterChunkAssignmentsRequest
    body = A(
        chunks=[
            A.AlterChunkAssignment(
                topic_name=s.topic,
                partition_id=s.partition,
                start_offset=s.start_offset,  # type: ignore[arg-type]  # set in an alter file's chunks
                chunk_epoch=-1,
                broker_ids=list(s.replicas),
            )
            for s in specs
        ]
    )
    resp = await admin.request(body)
    errors = []
    for s, r in zip(specs, resp.results, strict=True):
        if r.error_code:
            errors.append(broker_error(f"cannot reassign {s.name}", r.error_code, r.error_message))
        else:
            print(f"Reassigning {s.name} to brokers {ids_str(s.replicas)}.")
    if errors:
        raise _one(errors)


def _one(errors: list[AdminError]) -> AdminError:
    if len(errors) == 1:
        return errors[0]
    return AdminError("; ".join(str(e) for e in errors), errors[0].code)


# ---------------------------------------------------------------- command line
def build_parser() -> ToolArgumentParser:
    ap = ToolArgumentParser(prog="kafka-chunks.sh", description="Create or reassign partition chunks.")
    ap.add_argument("action", choices=("create", "alter"), help="create new active chunks, or move inactive chunks")
    ap.add_argument("--bootstrap-server", required=True, metavar="HOST:PORT[,...]", help="brokers to connect to")
    ap.add_argument("--create-chunk-json-file", metavar="FILE", help="partitions and their new chunk's brokers")
    ap.add_argument("--alter-chunk-json-file", metavar="FILE", help="chunks and their new brokers")
    ap.add_argument("--timeout", type=float, default=30.0, help=argparse.SUPPRESS)
    return ap


def check_args(ap: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    if a.action == "create" and (not a.create_chunk_json_file or a.alter_chunk_json_file):
        ap.error("create needs --create-chunk-json-file (and no --alter-chunk-json-file)")
    if a.action == "alter" and (not a.alter_chunk_json_file or a.create_chunk_json_file):
        ap.error("alter needs --alter-chunk-json-file (and no --create-chunk-json-file)")


async def run(a: argparse.Namespace) -> None:
    # the file is checked before any connection is made
    if a.action == "create":
        specs, action = parse_chunk_file(a.create_chunk_json_file, "partitions"), create
    else:
        specs, action = parse_chunk_file(a.alter_chunk_json_file, "chunks"), alter
    async with admin_for(a, a.timeout) as admin:
        await action(admin, specs)


def main(argv: Sequence[str] | None = None) -> int:
    ap = build_parser()
    a = ap.parse_tool_args(argv)
    check_args(ap, a)
    return run_tool(run(a))


if __name__ == "__main__":
    sys.exit(main())
