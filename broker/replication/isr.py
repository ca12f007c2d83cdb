"""ISR changes proposed by partition leaders through AlterPartition (as KRaft leaders do):
shrink out followers that stopped keeping up for replica.lag.time.max.ms, expand in followers
that caught up to the high watermark. One change in flight per partition."""

from __future__ import annotations

import asyncio

import structlog

from broker.ports import BrokerEpoch, ControllerLink, ImageSource, TaskSpawner
from broker.replication.hosted import HostedReplicas
from broker.replication.partition import Partition, now_ms
from node.client import ClientError
from node.shutdown import stop_task
from protocol.errors import Errors
from protocol.generated.alter_partition import AlterPartitionRequest

log = structlog.get_logger(__name__)
A = AlterPartitionRequest


class IsrManager:
    def __init__(self, node_id: int, lag_time_max_ms: int, images: ImageSource, controller: ControllerLink,
                 broker_epoch: BrokerEpoch, spawn: TaskSpawner, hosted: HostedReplicas) -> None:
        """`lag_time_max_ms`: replica.lag.time.max.ms; `hosted`: the partitions whose leaders it watches."""
        self.node_id = node_id
        self.lag_time_max_ms = lag_time_max_ms
        self.images = images
        self.controller = controller
        self.broker_epoch = broker_epoch
        self.spawn = spawn
        self.hosted = hosted
        self._inflight: set[tuple[str, int]] = set()
        self._task: asyncio.Task | None = None
        self._stopping = False
        self.changes: dict[str, int] = {}  # "shrink"/"expand" -> ISR changes committed

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._shrink_loop())

    async def stop(self) -> None:
        self._stopping = True
        await stop_task(self._task)

    def follower_caught_up(self, p: Partition, replica_id: int) -> None:
        alive = self.images.image.brokers.get(replica_id)
        if alive is None or alive.fenced or alive.in_controlled_shutdown:
            return
        self.propose(p, tuple(p.isr) + (replica_id,), "expand")

    def propose(self, p: Partition, new_isr: tuple[int, ...], why: str) -> None:
        key = (p.topic, p.index)
        if key in self._inflight or p.info is None:
            return
        self._inflight.add(key)
        p.pending_isr = tuple(dict.fromkeys((*p.isr, *new_isr)))
        self.spawn(self._send(p, new_isr, why))

    async def _send(self, p: Partition, new_isr: tuple[int, ...], why: str) -> None:
        key = (p.topic, p.index)
        info = p.info
        settled = False  # the controller's answer says nothing changed, or what did
        try:
            if info is None or not p.is_leader:
                settled = True
                return
            try:
                version = await self.controller.version_for(A.API_KEY)
            except ClientError as e:
                log.warning("alter_partition_unavailable", error=str(e))
                settled = True  # nothing was sent
                return
            pd = A.PartitionData(partition_index=p.index, leader_epoch=info.leader_epoch,
                                 partition_epoch=info.partition_epoch)
            if version >= 3:
                pd.new_isr_with_epochs = [A.BrokerState(broker_id=b, broker_epoch=-1) for b in new_isr]
            else:
                pd.new_isr = list(new_isr)
            td = A.TopicData(partitions=[pd])
            if version >= 2:
                td.topic_id = p.topic_id
            else:
                td.topic_name = p.topic
            req = A(broker_id=self.node_id, broker_epoch=self.broker_epoch(), topics=[td])
            try:
                resp = await self.controller.request(req, version, retry=False, timeout=10)
            except ClientError as e:
                log.warning("alter_partition_failed", topic=p.topic, partition=p.index, error=str(e))
                return
            err = resp.error_code
            part = resp.topics[0].partitions[0] if resp.topics and resp.topics[0].partitions else None
            if err == 0:
                err = part.error_code if part is not None else Errors.UNKNOWN_SERVER_ERROR
            if err or part is None:
                log.info("alter_partition_rejected", topic=p.topic, partition=p.index, error_code=err, why=why)
                if err in _NOTHING_CHANGED:
                    settled = True
                return
            log.info("isr_changed", topic=p.topic, partition=p.index, why=why, isr=list(part.isr),
                     partition_epoch=part.partition_epoch)
            p.apply_isr(tuple(part.isr), part.partition_epoch)
            self.changes[why] = self.changes.get(why, 0) + 1  # /metrics: isrshrinks, isrexpands
            settled = True
        finally:
            self._inflight.discard(key)
            # Otherwise the controller may have changed the partition (a reassignment completing
            # on our expand moves leadership: NEW_LEADER_ELECTED) or we cannot tell (no answer):
            # the larger ISR holds the high watermark until the metadata says what happened.
            if settled:
                p.pending_isr = None
                p.maybe_advance_high_watermark()

    async def _shrink_loop(self) -> None:
        lag_ms = self.lag_time_max_ms
        while not self._stopping:
            await asyncio.sleep(max(lag_ms / 2000, 0.1))
            now = now_ms()
            for p in list(self.hosted.partitions.values()):
                if not p.is_leader:
                    continue
                out = [
                    r for r in p.isr
                    if r != p.node_id and now - p.followers.get(r, _NEVER).last_caught_up_ms > lag_ms
                ]
                if out:
                    self.propose(p, tuple(r for r in p.isr if r not in out), "shrink")


# rejections after which the partition is as it was (the change was refused outright)
_NOTHING_CHANGED = frozenset({Errors.INELIGIBLE_REPLICA, Errors.OPERATION_NOT_ATTEMPTED, Errors.INVALID_REQUEST})


class _Never:
    last_caught_up_ms = 0


_NEVER = _Never()
