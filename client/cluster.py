"""What OrderedProducer and OrderedConsumer share: connections to the brokers and the topic
metadata Strata adds for KIP-253 (undeleted_partition_count, marked partitions, epoch maps)."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field

from node.client import ClientError, NodeClient
from protocol.errors import Errors, error_message, error_name
from protocol.generated.list_offsets import ListOffsetsRequest
from protocol.generated.metadata import MetadataRequest
from protocol.generated.offset_for_leader_epoch import OffsetForLeaderEpochRequest
from protocol.generated.partition_leader_epochs_for_partitions import PartitionLeaderEpochsForPartitionsRequest

EARLIEST, LATEST = -2, -1
DEBUG_REPLICA = -2  # OffsetForLeaderEpoch: the leader's own end offset, not capped at the high watermark


@dataclass(frozen=True)
class EpochEnd:
    offset: int  # the first offset after the epoch
    final: bool  # the high watermark has reached it: no leader change can truncate it any more


class StrataClientError(Exception):
    """A request failed for good (the message says which and why)."""


def kafka_error(code: int, message: str | None = None) -> str:
    """A Kafka error as a user reads it: its name and message (the broker's own, else Kafka's)."""
    return f"{error_name(code)}: {(message or '').strip() or error_message(code)}"


@dataclass(frozen=True)
class PartitionMeta:
    index: int
    leader: int
    leader_epoch: int
    marked: bool
    after_creation: dict[int, int] = field(default_factory=dict)  # prior partition -> epoch before the growth
    before_deletion: dict[int, int] = field(default_factory=dict)  # kept partition -> epoch before the shrink


@dataclass(frozen=True)
class TopicMeta:
    name: str
    undeleted_count: int
    partitions: dict[int, PartitionMeta]

    @property
    def unmarked(self) -> list[int]:
        return sorted(i for i, p in self.partitions.items() if not p.marked)

    @property
    def marked(self) -> list[int]:
        return sorted(i for i, p in self.partitions.items() if p.marked)


def _brokers(bootstrap: str | list[str]) -> list[tuple[str, int]]:
    items = bootstrap.split(",") if isinstance(bootstrap, str) else bootstrap
    out = []
    for item in items:
        host, _, port = item.strip().rpartition(":")
        out.append((host or "127.0.0.1", int(port)))
    return out


class ClusterClient:
    def __init__(self, bootstrap_servers: str | list[str], client_id: str, timeout: float = 30.0) -> None:
        self.bootstrap = _brokers(bootstrap_servers)
        self.client_id = client_id
        self.timeout = timeout
        self.brokers: dict[int, tuple[str, int]] = {}
        self.topics: dict[str, TopicMeta] = {}
        self._clients: dict[tuple[str, int], NodeClient] = {}
        self._lock = asyncio.Lock()

    async def close(self) -> None:
        for c in self._clients.values():
            await c.close()
        self._clients.clear()

    async def connection(self, broker: int | tuple[str, int]) -> NodeClient:
        if isinstance(broker, int) and broker not in self.brokers:
            # no leader (-1), or one our metadata does not list: look again
            raise StrataClientError(f"broker {broker} is not available")
        addr = self.brokers[broker] if isinstance(broker, int) else broker
        c = self._clients.get(addr)
        if c is None or not c.connected:
            c = NodeClient(addr[0], addr[1], client_id=self.client_id, timeout=self.timeout)
            await c.connect()
            self._clients[addr] = c
        return c

    def drop(self, broker: int | tuple[str, int]) -> None:
        addr = self.brokers.get(broker) if isinstance(broker, int) else broker
        c = self._clients.pop(addr, None) if addr else None
        if c is not None:
            asyncio.get_running_loop().create_task(c.close())

    async def any_request(self, *bodies, version: int | None = None):
        """Send to any reachable broker (known ones first, then the bootstrap list); several
        bodies go to the same broker, one after the other, and their answers come as a list."""
        addrs = list(self.brokers.values()) or list(self.bootstrap)
        random.shuffle(addrs)
        last: Exception | None = None
        for addr in [*addrs, *self.bootstrap]:
            try:
                conn = await self.connection(addr)
                answers = [await conn.request(b, version) for b in bodies]
                return answers[0] if len(bodies) == 1 else answers
            except ClientError as e:
                self.drop(addr)
                last = e
        raise StrataClientError(f"no broker answered: {last or 'no broker to ask'}")

    def partition(self, topic: str, partition: int):
        p = self.topics[topic].partitions.get(partition)
        if p is None:
            raise StrataClientError(f"partition {topic}-{partition} does not exist (any more)")
        return p

    async def request(self, broker: int, body, version: int | None = None):
        try:
            return await (await self.connection(broker)).request(body, version)
        except ClientError:
            self.drop(broker)
            raise

    # ---- metadata
    async def refresh(self, topics: list[str]) -> dict[str, TopicMeta]:
        async with self._lock:
            M = MetadataRequest
            P = PartitionLeaderEpochsForPartitionsRequest
            # one broker answers both, Metadata first: the maps are then as new as the epochs or newer
            resp, epochs = await self.any_request(
                M(topics=[M.MetadataRequestTopic(name=t) for t in topics], allow_auto_topic_creation=False),
                P(topics=[P.PartitionLeaderEpochsTopic(name=t, partitions=None) for t in topics]),
            )
            self.brokers = {b.node_id: (b.host, b.port) for b in resp.brokers}
            maps = {
                t.name: {
                    p.partition_index: (
                        {e.partition_id: e.leader_epoch for e in p.leader_epoch_after_creation},
                        {e.partition_id: e.leader_epoch for e in p.leader_epoch_before_deletion},
                    )
                    for p in t.partitions
                }
                for t in epochs.topics
                if t.error_code == 0
            }
            for t in resp.topics:
                if t.error_code == Errors.UNKNOWN_TOPIC_OR_PARTITION:
                    raise StrataClientError(f"topic {t.name!r} does not exist")
                if t.error_code or not t.partitions:
                    continue  # e.g. leader not available yet: keep what we knew
                tm = maps.get(t.name, {})
                parts = {
                    p.partition_index: PartitionMeta(
                        p.partition_index, p.leader_id, p.leader_epoch, p.marked_for_deletion,
                        *tm.get(p.partition_index, ({}, {})),
                    )
                    for p in t.partitions
                }
                count = t.undeleted_partition_count if t.undeleted_partition_count > 0 else len(parts)
                self.topics[t.name] = TopicMeta(t.name, count, parts)
            return self.topics

    # ---- offsets
    async def list_offset(self, topic: str, partition: int, which: int) -> int:
        """Earliest (-2) or latest (-1, the high watermark) offset, asked of the leader."""
        return await self._list_offset(self.partition(topic, partition), topic, which, -1)

    async def _list_offset(self, p: PartitionMeta, topic: str, which: int, current_epoch: int) -> int:
        L = ListOffsetsRequest
        req = L(replica_id=-1, isolation_level=0, topics=[
            L.ListOffsetsTopic(name=topic, partitions=[L.ListOffsetsPartition(
                partition_index=p.index, current_leader_epoch=current_epoch, timestamp=which)])])
        r = (await self.request(p.leader, req)).topics[0].partitions[0]
        if r.error_code:
            raise StrataClientError(f"ListOffsets {topic}-{p.index}: {kafka_error(r.error_code)}")
        return r.offset

    async def epoch_end(self, topic: str, partition: int, epoch: int) -> EpochEnd | None:
        """Where `epoch` ended in the partition's log (the first offset after it): KIP-253's
        thresholds (KIP-253's lowerOffsetThreshold / upperOffsetThreshold are this minus one).

        Asked of the leader at the leader epoch our metadata shows (current_leader_epoch), the
        epoch a count change bumped it to or a later one: a leader that has not applied the change
        still takes writes in `epoch`, so it answers UNKNOWN_LEADER_EPOCH and this returns None
        (ask again later). The answer is final once the high watermark has reached it (a tail
        not yet copied to the followers can still be truncated by a leader change)."""
        p = self.partition(topic, partition)
        if p.leader < 0:
            return None  # no leader now: nobody can say yet
        OE = OffsetForLeaderEpochRequest
        req = OE(replica_id=DEBUG_REPLICA, topics=[OE.OffsetForLeaderTopic(topic=topic, partitions=[
            OE.OffsetForLeaderPartition(partition=partition, current_leader_epoch=p.leader_epoch,
                                        leader_epoch=epoch)])])
        r = (await self.request(p.leader, req)).topics[0].partitions[0]
        if r.error_code == Errors.UNKNOWN_LEADER_EPOCH:
            return None
        if r.error_code:
            raise StrataClientError(f"OffsetForLeaderEpoch {topic}-{partition}: {kafka_error(r.error_code)}")
        try:
            hw = await self._list_offset(p, topic, LATEST, p.leader_epoch)
        except StrataClientError:
            return EpochEnd(r.end_offset, False)  # e.g. a leader change meanwhile: not final
        return EpochEnd(r.end_offset, hw >= r.end_offset)
