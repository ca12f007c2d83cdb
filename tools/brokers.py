"""What the offset and group tools share beside the Admin client: connections to brokers by id,
the partitions of topics, ListOffsets to each partition's leader, and FindCoordinator.

Kafka's AdminClient sends ListOffsets to the leaders, group requests to the group's coordinator
and ListGroups to every broker; these helpers do the same over node/client.py connections, each
failure turned into an AdminError (one line for the tool to print).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from node.client import ClientError, NodeClient
from protocol.errors import Errors
from protocol.generated.find_coordinator import FindCoordinatorRequest
from protocol.generated.list_offsets import ListOffsetsRequest
from tools.admin import Admin, AdminError, broker_error

TopicPartition = tuple[str, int]
EARLIEST, LATEST, MAX_TIMESTAMP = -2, -1, -3
_RETRIABLE_COORDINATOR = {Errors.COORDINATOR_NOT_AVAILABLE, Errors.COORDINATOR_LOAD_IN_PROGRESS, Errors.NOT_COORDINATOR}


def tp_str(tp: TopicPartition) -> str:
    """Kafka's TopicPartition.toString: ``topic-partition``."""
    return f"{tp[0]}-{tp[1]}"


@dataclass(frozen=True)
class Coordinator:
    node_id: int
    host: str
    port: int


@dataclass(frozen=True)
class OffsetAnswer:
    offset: int  # -1 when no record matches (a timestamp past every record)
    timestamp: int
    error_code: int


class Brokers:
    """Connections to the cluster's brokers by id, opened on first use and closed by close()."""

    def __init__(self, admin: Admin, client_id: str = "strata-admin") -> None:
        self.admin = admin
        self.client_id = client_id
        self.addresses: dict[int, tuple[str, int]] = {}
        self.leaders: dict[TopicPartition, int] = {}
        self._conns: dict[tuple[str, int], NodeClient] = {}

    async def __aenter__(self) -> Brokers:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        for c in self._conns.values():
            await c.close()
        self._conns.clear()

    async def topics(self, names: Iterable[str] | None = None) -> dict[str, Any]:
        """Metadata topics by name (None: every topic), remembering brokers and leaders; a
        topic the cluster does not have is left out."""
        md = await self.admin.metadata(None if names is None else sorted(set(names)))
        if md.error_code:
            raise broker_error("cannot read cluster metadata", md.error_code)
        self.addresses = {b.node_id: (b.host, b.port) for b in md.brokers}
        out = {}
        for t in md.topics:
            if t.error_code == Errors.UNKNOWN_TOPIC_OR_PARTITION or t.name is None:
                continue
            out[t.name] = t
            for p in t.partitions:
                self.leaders[(t.name, p.partition_index)] = p.leader_id
        return out

    async def partitions_of(self, names: Iterable[str]) -> list[TopicPartition]:
        """Every partition of each named topic; an unknown topic is an error naming it."""
        wanted = sorted(set(names))
        found = await self.topics(wanted)
        missing = [n for n in wanted if n not in found]
        if missing:
            raise AdminError(f"topic '{missing[0]}' does not exist", Errors.UNKNOWN_TOPIC_OR_PARTITION)
        return sorted((n, p.partition_index) for n in wanted for p in found[n].partitions)

    async def connection(self, host: str, port: int) -> NodeClient:
        c = self._conns.get((host, port))
        if c is None or not c.connected:
            try:
                c = await NodeClient(host, port, client_id=self.client_id, timeout=self.admin.timeout,
                                   security=self.admin.security).connect()
            except ClientError as e:
                raise AdminError(f"broker {host}:{port} is not reachable: {e}") from None
            self._conns[(host, port)] = c
        return c

    async def send(self, broker: int, body: Any, version: int | None = None) -> Any:
        if not self.addresses:
            await self.topics([])
        if broker not in self.addresses:
            raise AdminError(f"broker {broker} is not a live broker of the cluster", Errors.BROKER_NOT_AVAILABLE)
        return await self.send_to(*self.addresses[broker], body, version)

    async def send_to(self, host: str, port: int, body: Any, version: int | None = None) -> Any:
        c = await self.connection(host, port)
        try:
            return await c.request(body, version)
        except ClientError as e:
            raise AdminError(f"{host}:{port}: {e}") from None

    # ---- offsets
    async def list_offsets(self, spec: Mapping[TopicPartition, int], isolation_level: int = 0
                           ) -> dict[TopicPartition, OffsetAnswer]:
        """ListOffsets for each partition (EARLIEST, LATEST, MAX_TIMESTAMP or a timestamp in ms),
        sent to its leader; a partition without a leader answers LEADER_NOT_AVAILABLE."""
        missing = [tp for tp in spec if tp not in self.leaders]
        if missing:
            await self.topics({t for t, _ in missing})
        by_leader: dict[int, list[TopicPartition]] = {}
        out: dict[TopicPartition, OffsetAnswer] = {}
        for tp in spec:
            leader = self.leaders.get(tp, -1)
            if leader < 0:
                code = Errors.LEADER_NOT_AVAILABLE if tp in self.leaders else Errors.UNKNOWN_TOPIC_OR_PARTITION
                out[tp] = OffsetAnswer(-1, -1, code)
            else:
                by_leader.setdefault(leader, []).append(tp)
        R = ListOffsetsRequest

        async def ask(leader: int, tps: list[TopicPartition]) -> None:
            topics: dict[str, list] = {}
            for t, p in tps:
                topics.setdefault(t, []).append(
                    R.ListOffsetsPartition(partition_index=p, timestamp=spec[(t, p)], current_leader_epoch=-1))
            req = R(replica_id=-1, isolation_level=isolation_level,
                    topics=[R.ListOffsetsTopic(name=t, partitions=ps) for t, ps in topics.items()])
            resp = await self.send(leader, req)
            for t in resp.topics:
                for p in t.partitions:
                    out[(t.name, p.partition_index)] = OffsetAnswer(p.offset, p.timestamp, p.error_code)

        await asyncio.gather(*(ask(b, tps) for b, tps in by_leader.items()))
        return out

    async def offsets(self, tps: Iterable[TopicPartition], which: int, isolation_level: int = 0
                      ) -> dict[TopicPartition, int]:
        """The EARLIEST or LATEST offset of each partition; an error for any is an AdminError."""
        answers = await self.list_offsets(dict.fromkeys(tps, which), isolation_level)
        for tp, a in sorted(answers.items()):
            if a.error_code:
                raise broker_error(f"cannot list offsets of {tp_str(tp)}", a.error_code)
        return {tp: a.offset for tp, a in answers.items()}

    # ---- groups
    async def coordinator(self, group: str, attempts: int = 20) -> Coordinator:
        """The group's coordinator (FindCoordinator, retried while the coordinator loads)."""
        client = self.admin.client
        assert client is not None  # the Admin this works over is connected
        for _ in range(attempts):
            # v3: one key per request (v4+ batches keys); every broker answers it
            resp = await self.send_to(client.host, client.port,
                                      FindCoordinatorRequest(key=group, key_type=0), 3)
            code, node, host, port, msg = resp.error_code, resp.node_id, resp.host, resp.port, resp.error_message
            if code == 0:
                return Coordinator(node, host, port)
            if code not in _RETRIABLE_COORDINATOR:
                raise broker_error(f"cannot find the coordinator of group '{group}'", code, msg)
            await asyncio.sleep(0.2)
        raise broker_error(f"cannot find the coordinator of group '{group}'", code, msg)

    async def to_coordinator(self, group: str, body: Any, version: int | None = None) -> Any:
        c = await self.coordinator(group)
        return await self.send_to(c.host, c.port, body, version)
