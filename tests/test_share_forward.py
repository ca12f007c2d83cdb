"""Share groups on a diskless partition in-process (KIP-932 on KIP-1164): broker 1 serves a member's
share session and forwards to broker 2, which holds the share-partition (the image's leader),
through the SharePartitionForward handler; the partition, persister and peer connection are fakes.
What the two-broker test cannot steer: where broker 1 reads when the holder's window moved under
it (records acquired by the holder's own member, records released below), acknowledgements riding
on the acquisition, a holder that cannot be reached, a holder whose image is older, and a session's
end releasing the member's records on the holder."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from types import MappingProxyType, SimpleNamespace
from typing import Any

from broker.apis.share_forward import share_partition_forward
from broker.partitions.interface import OffsetAnswer, ReadAnswer
from broker.share.config import ShareGroupConfig
from broker.share.forward import ShareForwarder
from broker.share.partition import ACCEPT, RELEASE
from broker.share.service import ShareService
from metadata.image import MetadataImage, PartitionInfo, TopicInfo
from node.client import ClientError
from protocol.errors import Errors
from protocol.records import Record, encode_batch

TID = uuid.UUID(int=7)
HOLDER, GATEWAY = 2, 1


def image(leader_epoch: int = 0) -> MetadataImage:
    p = PartitionInfo(topic_id=TID, partition=0, replicas=(HOLDER, GATEWAY), isr=(HOLDER, GATEWAY), leader=HOLDER,
                      leader_epoch=leader_epoch, partition_epoch=0, diskless_coordinator=0)
    return MetadataImage(topics=MappingProxyType({TID: TopicInfo(TID, "t", MappingProxyType({0: p}))}),
                         topic_ids=MappingProxyType({"t": TID}))


class Log:
    """A diskless partition as both brokers read it: batches of 5 records, one log."""

    def __init__(self) -> None:
        self.batches: list[bytes] = []
        self.end = 0

    def append(self, n: int) -> None:
        for base in range(self.end, self.end + n, 5):
            count = min(5, self.end + n - base)
            self.batches.append(encode_batch([Record(value=b"v%d" % (base + i)) for i in range(count)],
                                             base_offset=base))
        self.end += n


@dataclass
class Partition:
    log: Log
    reads: list[int] = field(default_factory=list)  # the offsets read at

    async def read(self, pos: Any) -> ReadAnswer:
        self.reads.append(pos.fetch_offset)
        raw = b"".join(b for b in self.log.batches
                       if int.from_bytes(b[:8], "big") + int.from_bytes(b[23:27], "big") >= pos.fetch_offset)
        return ReadAnswer(log_start_offset=0, records=raw, size=len(raw), high_watermark=self.log.end)

    async def offset_for(self, timestamp: int, read_committed: bool) -> OffsetAnswer:
        return OffsetAnswer(offset=0 if timestamp == -2 else self.log.end)

    def add_data_waiter(self, fut: asyncio.Future, follower: bool = False) -> None:
        pass


class Router:
    def __init__(self, node_id: int, partition: Partition) -> None:
        self.node_id = node_id
        self.partition = partition

    def serving(self, topic: str, index: int) -> tuple[Any, int]:
        return self.partition, 0


class Persister:
    """The share coordinator: the last state written per share-partition."""

    def __init__(self) -> None:
        self.states: dict[tuple, Any] = {}

    async def read(self, group_id: str, topic_id: uuid.UUID, partition: int, leader_epoch: int) -> tuple[int, Any]:
        return 0, self.states.get((group_id, topic_id, partition))

    async def write(self, group_id: str, topic_id: uuid.UUID, partition: int, state: Any) -> int:
        self.states[(group_id, topic_id, partition)] = state
        return 0

    async def close(self) -> None:
        pass


class Peers:
    """The gateway's connection to the holder: requests go to its SharePartitionForward handler."""

    def __init__(self, holder: ShareService, images: Any) -> None:
        self.away = False
        self.calls = 0
        ctx = SimpleNamespace(services=SimpleNamespace(config=SimpleNamespace(share=ShareGroupConfig()),
                                                       metadata=images, share=holder))

        async def request(req: Any, version: int, timeout: float) -> Any:
            self.calls += 1
            if self.away:
                raise ClientError("refused")
            return await share_partition_forward(ctx, req)  # type: ignore[arg-type]

        self.client = SimpleNamespace(request=request)

    async def get(self, broker_id: int) -> Any:
        return self.client

    async def drop(self, broker_id: int) -> None:
        pass

    async def close(self) -> None:
        pass


def brokers(log: Log) -> tuple[ShareService, ShareService, Peers, Any, Any]:
    """(holder, gateway, the gateway's peers, the holder's image source, the gateway's)."""
    holder_images, gateway_images = SimpleNamespace(image=image()), SimpleNamespace(image=image())
    config = ShareGroupConfig()
    holder = ShareService(config, Router(HOLDER, Partition(log)), holder_images, Persister(),  # type: ignore[arg-type]
                          ShareForwarder(None))  # type: ignore[arg-type]
    peers = Peers(holder, holder_images)
    gateway = ShareService(config, Router(GATEWAY, Partition(log)), gateway_images, Persister(),  # type: ignore[arg-type]
                           ShareForwarder(peers))  # type: ignore[arg-type]
    return holder, gateway, peers, holder_images, gateway_images


async def fetch(s: ShareService, member: str, acks: list | None = None, max_records: int = 500) -> tuple:
    err, got, _, ack_err = await s.fetch(None, "g", member, "t", 0, max_records, 1 << 20, acks)  # type: ignore[arg-type]
    return err, (got.ranges if got is not None else []), ack_err


def test_the_gateway_reads_where_the_holder_says() -> None:
    async def main() -> None:
        log = Log()
        log.append(10)
        holder, gateway, peers, _, _ = brokers(log)
        # the first fetch asks where to read (the window starts at the log end: latest), then reads
        assert await fetch(gateway, "m1") == (0, [], 0)
        log.append(10)  # offsets 10-19
        assert await fetch(gateway, "m1", max_records=5) == (0, [(10, 14, 1)], 0)
        # the holder's own member takes the next ones: the gateway's next read is stale, one more round
        assert await fetch(holder, "m2", max_records=5) == (0, [(15, 19, 1)], 0)
        log.append(5)  # 20-24
        reads = gateway.router.partition.reads  # type: ignore[attr-defined]
        reads.clear()
        assert await fetch(gateway, "m1") == (0, [(20, 24, 1)], 0)
        assert reads == [15]  # the holder acquired what it could among the batches read from there
        # m2 releases 15-19 on the holder: the gateway reads below its last read, delivery count 2;
        # its accept of 10-14 rides on the same call
        assert await holder.acknowledge("g", "m2", "t", 0, [(15, 19, [RELEASE])], False) == 0
        calls = peers.calls
        assert await fetch(gateway, "m1", acks=[(10, 14, [ACCEPT])]) == (0, [(15, 19, 2)], 0)
        assert peers.calls - calls == 2  # acks + a stale read, then the read at 15
        sp = holder.partitions[("g", "t", 0)]
        assert sp.start_offset == 15 and sp.next_fetch_offset() == 25
        # an acknowledgement of records m1 does not hold: refused, nothing applied
        assert await gateway.acknowledge("g", "m1", "t", 0, [(10, 14, [ACCEPT])], False) == Errors.INVALID_RECORD_STATE

    asyncio.run(main())


def test_holder_away_or_behind_answers_nothing() -> None:
    async def main() -> None:
        log = Log()
        holder, gateway, peers, holder_images, gateway_images = brokers(log)
        await fetch(gateway, "m1")
        log.append(5)
        peers.away = True
        # no records and no error for the fetch; the acknowledgement is not applied
        assert await fetch(gateway, "m1") == (0, [], 0)
        assert await gateway.acknowledge("g", "m1", "t", 0, [(0, 0, [ACCEPT])], False) == Errors.NOT_LEADER_OR_FOLLOWER
        peers.away = False
        # the gateway's image moved on (a new leader epoch) before the holder's: the holder refuses
        gateway_images.image = image(leader_epoch=1)
        assert await fetch(gateway, "m1") == (0, [], 0)
        holder_images.image = image(leader_epoch=1)
        assert await fetch(gateway, "m1") == (0, [(0, 4, 1)], 0)
        # the session ends: what m1 holds goes back to the group
        gateway.release_member("g", "m1", [(TID, 0)])
        await asyncio.sleep(0.01)
        assert holder.partitions[("g", "t", 0)].next_fetch_offset() == 0

    asyncio.run(main())
