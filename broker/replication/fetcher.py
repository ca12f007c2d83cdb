"""Follower replication: one fetcher task per source broker, fetching every partition this
broker follows from that leader in one Fetch request.

Each partition's fetch carries its log end offset and the epoch of its last batch; the leader
answers a divergence with DivergingEpoch (KIP-595's scheme, as Kafka's fetchers use), and we
truncate to the last offset both logs agree on before fetching on. Appends are the leader's
bytes as they came, numbered already.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

import structlog

from broker.replication.partition import Partition
from broker.replication.throttle import Throttle
from broker.storage.errors import StorageError
from node.client import ClientError, NodeClient
from node.shutdown import stop_task
from protocol.errors import Errors
from protocol.generated.fetch import FetchRequest

if TYPE_CHECKING:
    from broker.broker import Broker

log = structlog.get_logger(__name__)
BACKOFF_S = 0.2


class ReplicaFetcher:
    """Fetches, for the partitions whose leader is `leader_id`, what this follower lacks."""

    def __init__(self, broker: Broker, leader_id: int, throttle: Throttle) -> None:
        self.broker = broker
        self.leader_id = leader_id
        self.throttle = throttle
        self.partitions: dict[tuple[str, int], Partition] = {}
        self._wake = asyncio.Event()
        self._client: NodeClient | None = None
        self._stopping = False
        self._task = asyncio.get_running_loop().create_task(self._run())

    def add(self, p: Partition) -> None:
        self.partitions[(p.topic, p.index)] = p
        self._wake.set()

    def remove(self, p: Partition) -> None:
        self.partitions.pop((p.topic, p.index), None)

    async def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        await stop_task(self._task)
        if self._client is not None:
            await self._client.close()

    async def _connect(self) -> NodeClient | None:
        if self._client is not None and self._client.connected:
            return self._client
        info = self.broker.metadata.image.brokers.get(self.leader_id)
        ep = info.endpoint(self.broker.config.listener.listener) if info else None
        if ep is None:
            return None
        try:
            self._client = await NodeClient(ep.host, ep.port, client_id=f"replica-fetcher-{self.broker.config.node_id}",
                                            timeout=30).connect()
            return self._client
        except ClientError as e:
            log.debug("fetcher_connect_failed", leader=self.leader_id, error=str(e))
            return None

    def _request(self, version: int, parts: list[Partition]) -> FetchRequest:
        cfg = self.broker.config
        topics: dict[str, FetchRequest.FetchTopic] = {}
        for p in parts:
            t = topics.get(p.topic)
            if t is None:
                t = topics[p.topic] = FetchRequest.FetchTopic(topic=p.topic, topic_id=p.topic_id)
            lg = p.log
            max_bytes = cfg.replica_fetch_max_bytes
            if self.throttle.applies(p.topic, p.index):
                max_bytes = self.throttle.fetch_size(max_bytes)
            t.partitions.append(
                FetchRequest.FetchPartition(
                    partition=p.index,
                    current_leader_epoch=p.leader_epoch,
                    fetch_offset=lg.log_end_offset,
                    last_fetched_epoch=lg.leader_epoch_cache.latest_epoch(),
                    log_start_offset=lg.log_start_offset,
                    partition_max_bytes=max_bytes,
                )
            )
        req = FetchRequest(
            max_wait_ms=cfg.replica_fetch_wait_max_ms, min_bytes=1, max_bytes=max(cfg.replica_fetch_max_bytes, 1 << 20) * 10,
            isolation_level=0, session_id=0, session_epoch=-1, topics=list(topics.values()),
        )
        if version >= 15:
            req.replica_state = FetchRequest.ReplicaState(replica_id=cfg.node_id, replica_epoch=self.broker.lifecycle.broker_epoch)
        else:
            req.replica_id = cfg.node_id
        return req

    async def _run(self) -> None:
        while not self._stopping:
            if not self.partitions:
                self._wake.clear()
                await self._wake.wait()
                continue
            parts = list(self.partitions.values())
            pause = self.throttle.pause()
            if pause:
                parts = [p for p in parts if not self.throttle.applies(p.topic, p.index)]
                if not parts:
                    await asyncio.sleep(pause)
                    continue
            client = await self._connect()
            if client is None:
                await asyncio.sleep(BACKOFF_S)
                continue
            try:
                version = client.version_for(FetchRequest.API_KEY)
                resp = await client.request(self._request(version, parts), version, timeout=30)
            except ClientError as e:
                log.debug("follower_fetch_failed", leader=self.leader_id, error=str(e))
                await client.close()
                await asyncio.sleep(BACKOFF_S)
                continue
            if resp.error_code:
                await asyncio.sleep(BACKOFF_S)
                continue
            backoff = False
            by_key = {(p.topic, p.index): p for p in parts}
            by_id = {(p.topic_id, p.index): p for p in parts}
            for t in resp.responses:
                for pd in t.partitions:
                    p = by_id.get((t.topic_id, pd.partition_index)) if version >= 13 else by_key.get((t.topic, pd.partition_index))
                    if p is None or self.partitions.get((p.topic, p.index)) is not p or p.swapping:
                        continue  # no longer ours to follow from this leader, or moving dirs: fetched again
                    if not self._handle(p, pd):
                        backoff = True
            if backoff:
                await asyncio.sleep(BACKOFF_S)

    def _handle(self, p: Partition, pd) -> bool:
        """Apply one partition's fetch result; False asks for a backoff."""
        lg = p.log
        if pd.error_code == Errors.OFFSET_OUT_OF_RANGE:
            return self._out_of_range(p, pd)
        if pd.error_code:
            log.debug("follower_fetch_partition_error", topic=p.topic, partition=p.index, error_code=pd.error_code)
            return False
        de = pd.diverging_epoch
        if de is not None and de.epoch >= 0:
            self._truncate_diverged(p, de.epoch, de.end_offset)
            return True
        try:
            if pd.records:
                info = lg.append_as_follower(pd.records)
                if info.bytes:
                    self.throttle.record(p.topic, p.index, info.bytes)
            if pd.log_start_offset > lg.log_start_offset:
                lg.update_high_watermark(min(pd.high_watermark, lg.log_end_offset))
                if pd.log_start_offset <= lg.high_watermark:
                    lg.delete_records_before(pd.log_start_offset)
            lg.update_high_watermark(min(pd.high_watermark, lg.log_end_offset))
        except StorageError as e:
            log.warning("follower_append_failed", topic=p.topic, partition=p.index, error=str(e))
            return False
        p.caught_up_at = time.monotonic()
        return True

    def _truncate_diverged(self, p: Partition, leader_epoch: int, leader_end: int) -> None:
        lg = p.log
        epoch, end = lg.leader_epoch_cache.end_offset_for(leader_epoch, lg.log_end_offset)
        target = min(leader_end, end) if epoch >= 0 else min(leader_end, lg.log_end_offset)
        if target < lg.log_end_offset:
            log.info("follower_truncated", topic=p.topic, partition=p.index, from_offset=lg.log_end_offset,
                     to_offset=target, leader_epoch=leader_epoch)
            lg.truncate_to(target)

    def _out_of_range(self, p: Partition, pd) -> bool:
        lg = p.log
        if pd.log_start_offset >= 0 and lg.log_end_offset < pd.log_start_offset:
            log.info("follower_reset_to_leader_start", topic=p.topic, partition=p.index, offset=pd.log_start_offset)
            lg.truncate_fully_and_start_at(pd.log_start_offset)
            return True
        if pd.high_watermark >= 0 and lg.log_end_offset > pd.high_watermark:
            # ahead of a leader that lost data it never committed: keep only the committed part
            log.info("follower_truncated", topic=p.topic, partition=p.index, from_offset=lg.log_end_offset,
                     to_offset=pd.high_watermark, reason="ahead_of_leader")
            lg.truncate_to(pd.high_watermark)
            return True
        return False


class ReplicaFetcherManager:
    """Which fetcher follows which partition: one per leader broker."""

    def __init__(self, broker: Broker, throttle: Throttle) -> None:
        self.broker = broker
        self.fetchers: dict[int, ReplicaFetcher] = {}
        self.throttle = throttle
        self._following: dict[tuple[str, int], int] = {}

    def follow(self, p: Partition, leader_id: int) -> None:
        key = (p.topic, p.index)
        old = self._following.get(key)
        if old == leader_id and key in self.fetchers.get(leader_id, _EMPTY).partitions:
            return
        self.unfollow(p)
        f = self.fetchers.get(leader_id)
        if f is None:
            f = self.fetchers[leader_id] = ReplicaFetcher(self.broker, leader_id, self.throttle)
        f.add(p)
        self._following[key] = leader_id

    def unfollow(self, p: Partition) -> None:
        old = self._following.pop((p.topic, p.index), None)
        if old is not None and old in self.fetchers:
            self.fetchers[old].remove(p)

    async def stop(self) -> None:
        for f in list(self.fetchers.values()):
            await f.stop()
        self.fetchers.clear()


class _Empty:
    partitions: dict = {}


_EMPTY = _Empty()
