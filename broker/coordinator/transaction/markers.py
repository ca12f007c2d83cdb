"""Transaction markers: WriteTxnMarkers (API 27) to the current leader of every partition of a
transaction, grouped per broker (Kafka's TransactionMarkerChannelManager, one request per broker
per round).

A round sends to each leader the partitions it leads; partitions answered NONE are done. Leader
changes, brokers that are down and retriable errors leave a partition for the next round (after a
backoff), until every partition is done, the partition's topic is gone (nothing left to mark), or
the caller's `still_coordinator()` says this coordinator was unloaded or superseded (the new
coordinator sends the markers again after loading). A leader answering INVALID_PRODUCER_EPOCH or
TRANSACTION_COORDINATOR_FENCED holds newer state than ours: we stop (as Kafka does).

A diskless partition (KIP-1164) has no leader holding its state: its marker goes to the leader of
its diskless coordinator, which commits it there without another hop (any broker could write it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

import structlog

from metadata.diskless import DISKLESS_METADATA_TOPIC
from node.client import ClientError, NodeClient
from protocol.errors import Errors
from protocol.generated.write_txn_markers import WriteTxnMarkersRequest

if TYPE_CHECKING:
    from broker.ports import ImageSource, PeerDirectory
    from node.security import ClientSecurity

log = structlog.get_logger(__name__)

TopicPartition = tuple[str, int]

REQUEST_TIMEOUT_S = 30.0
FIRST_BACKOFF_S = 0.02
MAX_BACKOFF_S = 1.0
_STALE = {Errors.INVALID_PRODUCER_EPOCH, Errors.TRANSACTION_COORDINATOR_FENCED}


class MarkersAbandoned(Exception):
    """A partition leader knows a newer producer epoch or coordinator: our markers are stale."""


class TxnMarkerSender:
    def __init__(self, node_id: int, images: ImageSource, peers: PeerDirectory,
                 security: ClientSecurity | None) -> None:
        """`images`: where each partition's leader is; `peers`: where each broker listens;
        `security`: the inter-broker listener's client side."""
        self.node_id = node_id
        self._images = images
        self._peers = peers
        self._security = security
        self._clients: dict[int, NodeClient] = {}
        self._connecting: dict[int, asyncio.Future] = {}

    async def close(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        for c in clients:
            await c.close()

    async def write(self, producer_id: int, producer_epoch: int, commit: bool, partitions: set[TopicPartition],
                    coordinator_epoch: int, still_coordinator: Callable[[], bool]) -> bool:
        """Write the markers on every partition; True once all are written, False if given up."""
        remaining = set(partitions)
        backoff = FIRST_BACKOFF_S
        rounds = 0
        while remaining:
            if not still_coordinator():
                return False
            image = self._images.image
            coordinators = image.topic(DISKLESS_METADATA_TOPIC)
            by_leader: dict[int, list[TopicPartition]] = {}
            for tp in list(remaining):
                topic = image.topic(tp[0])
                info = topic.partitions.get(tp[1]) if topic is not None else None
                if info is None:
                    remaining.discard(tp)  # deleted: no reader will ever need the marker
                    continue
                leader = info.leader
                if info.diskless_coordinator >= 0:
                    c = coordinators.partitions.get(info.diskless_coordinator) if coordinators is not None else None
                    leader = c.leader if c is not None else -1
                if leader >= 0:
                    by_leader.setdefault(leader, []).append(tp)
            if by_leader:
                try:
                    results = await asyncio.gather(*(
                        self._send(leader, tps, producer_id, producer_epoch, commit, coordinator_epoch)
                        for leader, tps in by_leader.items()
                    ))
                except MarkersAbandoned as e:
                    log.warning("txn_markers_abandoned", producer_id=producer_id, epoch=producer_epoch, reason=str(e))
                    return False
                for done in results:
                    remaining -= done
            if remaining:
                rounds += 1
                if rounds % 50 == 0:
                    log.info("txn_markers_pending", producer_id=producer_id, epoch=producer_epoch,
                             partitions=sorted(remaining)[:10], rounds=rounds)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
        return True

    async def _send(self, leader: int, tps: list[TopicPartition], producer_id: int, producer_epoch: int,
                    commit: bool, coordinator_epoch: int) -> set[TopicPartition]:
        """The partitions whose marker `leader` wrote."""
        client = await self._client(leader)
        if client is None:
            return set()
        topics: dict[str, list[int]] = {}
        for t, p in tps:
            topics.setdefault(t, []).append(p)
        W = WriteTxnMarkersRequest
        req = W(markers=[W.WritableTxnMarker(
            producer_id=producer_id, producer_epoch=producer_epoch, transaction_result=commit,
            topics=[W.WritableTxnMarkerTopic(name=t, partition_indexes=ps) for t, ps in topics.items()],
            coordinator_epoch=coordinator_epoch,
        )])
        try:
            resp = await client.request(req, timeout=REQUEST_TIMEOUT_S)
        except ClientError as e:
            log.info("txn_markers_request_failed", leader=leader, error=str(e))
            self._drop(leader, client)
            return set()
        done: set[TopicPartition] = set()
        for m in resp.markers:
            for t in m.topics:
                for p in t.partitions:
                    if p.error_code == 0:
                        done.add((t.name, p.partition_index))
                    elif p.error_code in _STALE:
                        raise MarkersAbandoned(f"{t.name}-{p.partition_index} on broker {leader}: error {p.error_code}")
                    else:
                        log.debug("txn_marker_retry", leader=leader, topic=t.name, partition=p.partition_index,
                                  error_code=p.error_code)
        return done

    async def _client(self, node: int) -> NodeClient | None:
        c = self._clients.get(node)
        if c is not None and c.connected:
            return c
        pending = self._connecting.get(node)
        if pending is not None:
            return await asyncio.shield(pending)
        fut = self._connecting[node] = asyncio.get_running_loop().create_future()
        try:
            c = None
            ep = self._peers.endpoint(node) if self._peers.live(node) else None
            if ep is not None:
                try:
                    c = await NodeClient(ep.host, ep.port, client_id=f"txn-markers-{self.node_id}",
                                         timeout=REQUEST_TIMEOUT_S, security=self._security).connect()
                    self._clients[node] = c
                except ClientError as e:
                    log.info("txn_markers_connect_failed", broker=node, error=str(e))
                    c = None
            fut.set_result(c)
            return c
        finally:
            self._connecting.pop(node, None)
            if not fut.done():
                fut.set_result(None)

    def _drop(self, node: int, client: NodeClient) -> None:
        if self._clients.get(node) is client:
            del self._clients[node]
        asyncio.get_running_loop().create_task(client.close())
