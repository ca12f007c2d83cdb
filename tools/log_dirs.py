"""What kafka-log-dirs.sh and kafka-reassign-partitions.sh share about log dirs: DescribeLogDirs
and AlterReplicaLogDirs sent to one broker (by id, as these APIs are answered by the broker
holding the replicas, not forwarded)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from node.client import ClientError, NodeClient
from protocol.errors import Errors
from protocol.generated.alter_replica_log_dirs import AlterReplicaLogDirsRequest
from protocol.generated.describe_log_dirs import DescribeLogDirsRequest
from tools.admin import Admin, AdminError, broker_error

ANY_LOG_DIR = "any"


@dataclass(frozen=True)
class ReplicaEntry:
    topic: str
    partition: int
    chunk_start: int
    size: int
    offset_lag: int
    is_future: bool


@dataclass(frozen=True)
class DirInfo:
    broker: int
    path: str
    is_live: bool
    error_code: int
    replicas: tuple[ReplicaEntry, ...]
    total_bytes: int = -1
    usable_bytes: int = -1


def check_log_dir(d: str, where: str) -> None:
    """KIP-113's rule: "any" or an absolute path."""
    if d != ANY_LOG_DIR and not os.path.isabs(d):
        raise AdminError(f'{where}: log dir "{d}" must be "{ANY_LOG_DIR}" or an absolute path beginning with "/"')


async def broker_addresses(admin: Admin) -> dict[int, tuple[str, int]]:
    md = await admin.metadata([])
    if md.error_code:
        raise broker_error("cannot read cluster metadata", md.error_code)
    return {b.node_id: (b.host, b.port) for b in md.brokers}


async def _to_broker(admin: Admin, addresses: dict[int, tuple[str, int]], broker: int, body: Any,
                     version: int | None = None) -> Any:
    if broker not in addresses:
        raise AdminError(f"broker {broker} is not a live broker of the cluster")
    host, port = addresses[broker]
    try:
        async with NodeClient(host, port, client_id="strata-admin", timeout=admin.timeout, security=admin.security) as c:
            return await c.request(body, version)
    except ClientError as e:
        raise AdminError(f"broker {broker} ({host}:{port}) is not reachable: {e}") from None


async def describe_dirs(admin: Admin, addresses: dict[int, tuple[str, int]], broker: int,
                        topics: list[str] | None = None, partitions: dict[str, list[int]] | None = None) -> list[DirInfo]:
    """Every log dir of `broker` with the chunk replicas it holds (of `topics`, or all)."""
    R = DescribeLogDirsRequest
    wanted = None
    if partitions is not None:
        wanted = [R.DescribableLogDirTopic(topic=t, partitions=ps) for t, ps in sorted(partitions.items())]
    elif topics is not None:
        md = await admin.metadata(topics)
        wanted = [R.DescribableLogDirTopic(topic=t.name, partitions=[p.partition_index for p in t.partitions])
                  for t in md.topics if t.error_code == 0]
    resp = await _to_broker(admin, addresses, broker, R(topics=wanted))
    if getattr(resp, "error_code", 0):
        raise broker_error(f"cannot describe the log dirs of broker {broker}", resp.error_code)
    out = []
    for r in resp.results:
        entries = tuple(
            ReplicaEntry(t.name, p.partition_index, p.chunk_start_offset, p.partition_size, p.offset_lag,
                         p.is_future_key)
            for t in r.topics for p in t.partitions
        )
        out.append(DirInfo(broker, r.log_dir, r.error_code == 0, r.error_code, entries,
                           getattr(r, "total_bytes", -1), getattr(r, "usable_bytes", -1)))
    return out


async def alter_dirs(admin: Admin, addresses: dict[int, tuple[str, int]], broker: int,
                     moves: dict[tuple[str, int], str]) -> dict[tuple[str, int], int]:
    """Send AlterReplicaLogDirs for (topic, partition) -> dir to `broker`; the error code of each."""
    R = AlterReplicaLogDirsRequest
    by_dir: dict[str, dict[str, list[int]]] = {}
    for (t, p), d in sorted(moves.items()):
        by_dir.setdefault(d, {}).setdefault(t, []).append(p)
    req = R(dirs=[R.AlterReplicaLogDir(path=d, topics=[R.AlterReplicaLogDirTopic(name=t, partitions=ps)
                                                       for t, ps in topics.items()])
                  for d, topics in by_dir.items()])
    resp = await _to_broker(admin, addresses, broker, req)
    return {(t.topic_name, p.partition_index): p.error_code for t in resp.results for p in t.partitions}


def is_retriable_move_error(code: int) -> bool:
    """KIP-113: REPLICA_NOT_AVAILABLE is retried until --timeout (the replica is not there yet)."""
    return code == Errors.REPLICA_NOT_AVAILABLE
