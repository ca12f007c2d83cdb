"""The partition end offsets a share-partition's lag is measured to (KIP-1226: DescribeShareGroupOffsets
v1's Lag, the records from the start offset to the high watermark less those whose delivery is
already complete). A group's coordinator answers it for partitions led anywhere: read here when this
broker serves the partition (its leader, or any broker for a diskless one), else asked of the
leader with ListOffsets (latest), one request per leader, as Kafka 4.2's group coordinator does.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import structlog

from node.client import ClientError
from protocol.generated.list_offsets import ListOffsetsRequest

if TYPE_CHECKING:
    from broker.partitions.router import PartitionRouter
    from broker.ports import ImageSource
    from broker.replication.peers import PeerClients

log = structlog.get_logger(__name__)

LATEST = -1
REQUEST_TIMEOUT_S = 10.0
TopicPartition = tuple[str, int]


class PartitionEnds:
    def __init__(self, router: PartitionRouter, images: ImageSource, peers: PeerClients) -> None:
        self.router = router
        self.images = images
        self.peers = peers

    async def high_watermarks(self, wanted: list[TopicPartition]) -> dict[TopicPartition, int]:
        """The high watermark of each partition that answered (a partition without a reachable
        leader is left out: its lag stays unknown)."""
        out: dict[TopicPartition, int] = {}
        by_leader: dict[int, list[TopicPartition]] = {}
        image = self.images.image
        for topic, index in wanted:
            p, _ = self.router.serving(topic, index)
            if p is not None:
                ans = await p.offset_for(LATEST, False)
                if not ans.error_code and ans.offset >= 0:
                    out[(topic, index)] = ans.offset
                continue
            info = image.topic(topic)
            pi = info.partitions.get(index) if info is not None else None
            if pi is not None and pi.leader >= 0:
                by_leader.setdefault(pi.leader, []).append((topic, index))
        for got in await asyncio.gather(*(self._ask(leader, tps) for leader, tps in by_leader.items())):
            out.update(got)
        return out

    async def _ask(self, leader: int, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        L = ListOffsetsRequest
        topics: dict[str, list[int]] = {}
        for topic, index in tps:
            topics.setdefault(topic, []).append(index)
        try:
            client = await self.peers.get(leader)
            resp = await client.request(L(replica_id=-1, isolation_level=0, topics=[
                L.ListOffsetsTopic(name=t, partitions=[L.ListOffsetsPartition(partition_index=i, timestamp=LATEST,
                                                                              current_leader_epoch=-1) for i in ps])
                for t, ps in topics.items()]), timeout=REQUEST_TIMEOUT_S)
        except (TimeoutError, ClientError, OSError) as e:
            log.info("share_lag_end_offsets_failed", leader=leader, error=str(e))
            await self.peers.drop(leader)
            return {}
        return {(t.name, p.partition_index): p.offset for t in resp.topics for p in t.partitions
                if not p.error_code and p.offset >= 0}

    async def close(self) -> None:
        await self.peers.close()
