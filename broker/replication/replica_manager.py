"""ReplicaManager: the chunk replicas this broker holds, kept in line with the metadata image.

It is a metadata publisher: each new image's delta says which partitions changed, and only
those are touched: a replica assigned here is opened (or created in the least-used log dir),
one moved away or of a deleted topic is closed and deleted, configs are re-applied.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from uuid import UUID

import structlog

from broker.config import BrokerConfig
from broker.replication.fetcher import ReplicaFetcherManager
from broker.replication.isr import IsrManager
from broker.replication.partition import Partition
from broker.storage.cleaner import LogCleaner, retention_applies
from broker.storage.config import LogConfig
from broker.storage.log_dir import LogDir
from metadata import MetadataDelta, MetadataImage, PartitionInfo
from metadata.config_defs import effective_topic_configs
from metadata.image import BROKER_RESOURCE, TOPIC_RESOURCE

log = structlog.get_logger(__name__)


class ReplicaManager:
    def __init__(self, config: BrokerConfig, log_dirs: list[LogDir]) -> None:
        self.config = config
        self.node_id = config.node_id
        self.log_dirs = log_dirs
        self.partitions: dict[tuple[str, int], Partition] = {}
        self.image = MetadataImage.EMPTY
        self._on_disk: dict[tuple[str, int, int], LogDir] = {}
        self._retention_task: asyncio.Task | None = None
        self._checkpoint_task: asyncio.Task | None = None
        self._cleaner: LogCleaner | None = None
        self._cleaner_task: asyncio.Task | None = None
        self._topic_configs: dict[str, dict[str, str]] = {}
        # set by the Broker once running: follower fetchers and the ISR manager
        self.fetchers: ReplicaFetcherManager | None = None
        self.isr: IsrManager | None = None
        # told (partition, is_leader) whenever this broker gains or loses a partition's
        # leadership: coordinators load and unload their state partitions with it
        self.leadership_listeners: list[Callable[[Partition, bool], None]] = []
        for d in log_dirs:
            for topic, partition, chunk_start, _ in d.list_replicas():
                self._on_disk[(topic, partition, chunk_start)] = d

    # ---- lookups
    def get(self, topic: str, index: int) -> Partition | None:
        return self.partitions.get((topic, index))

    def topic_config(self, topic: str) -> dict[str, str]:
        """Every topic config's effective value (topic override, broker default, Kafka default)."""
        cfg = self._topic_configs.get(topic)
        if cfg is None:
            entries = effective_topic_configs(
                self.image.topic_config(topic), self.image.configs.get((BROKER_RESOURCE, ""), {}), self.config.props
            )
            cfg = self._topic_configs[topic] = {name: value for name, value, _ in entries}
        return cfg

    def log_config(self, topic: str) -> LogConfig:
        return LogConfig.from_properties(self.topic_config(topic))

    # ---- metadata publisher
    def on_metadata(self, delta: MetadataDelta, image: MetadataImage) -> None:
        self.image = image
        self._topic_configs.clear()
        for topic in delta.deleted_topics.values():
            for idx in list(topic.partitions):
                self._remove(topic.name, idx, delete=True)
        for tid, idx in delta.changed_partitions:
            t = image.topics.get(tid)
            if t is None:
                continue
            info = t.partitions.get(idx)
            if info is None:
                continue
            if self.node_id in info.replicas:
                self._ensure(t.name, info)
            else:
                self._remove(t.name, idx, delete=True)
        for rtype, name in delta.changed_configs:
            if rtype == TOPIC_RESOURCE:
                cfg = self.log_config(name)
                for (topic, _), p in self.partitions.items():
                    if topic == name:
                        p.log.update_config(cfg)

    def _ensure(self, topic: str, info: PartitionInfo) -> None:
        key = (topic, info.partition)
        p = self.partitions.get(key)
        if p is not None and p.topic_id != info.topic_id:
            self._remove(topic, info.partition, delete=True)  # topic re-created under the same name
            p = None
        if p is None:
            p = self._open(topic, info)
        was_leader, old_epoch = p.is_leader, p.leader_epoch
        p.update(info)
        if p.is_leader != was_leader or (p.is_leader and p.leader_epoch != old_epoch):
            self._tell_leadership(p, p.is_leader)
        if self.fetchers is not None:
            if p.is_leader or info.leader < 0:
                self.fetchers.unfollow(p)
            else:
                self.fetchers.follow(p, info.leader)

    def _tell_leadership(self, p: Partition, is_leader: bool) -> None:
        for listener in self.leadership_listeners:
            try:
                listener(p, is_leader)
            except Exception:
                log.exception("leadership_listener_failed", topic=p.topic, partition=p.index)

    def _open(self, topic: str, info: PartitionInfo) -> Partition:
        start = info.start_offset
        d = self._on_disk.get((topic, info.partition, start)) or self._choose_dir()
        lg = d.open_log(topic, info.partition, start, self.log_config(topic), topic_id=info.topic_id)
        if lg.topic_id is not None and lg.topic_id != info.topic_id:
            log.info("replica_topic_id_mismatch", topic=topic, partition=info.partition, action="recreate")
            lg.delete()
            lg = d.open_log(topic, info.partition, start, self.log_config(topic), topic_id=info.topic_id)
        self._on_disk[(topic, info.partition, start)] = d
        lg.producer_id_expiration_ms = int(self.config.props.get("producer.id.expiration.ms", "86400000"))
        p = Partition(topic, info.partition, info.topic_id, lg, self.node_id)
        if self.isr is not None:
            p.on_follower_caught_up = self.isr.follower_caught_up
        self.partitions[(topic, info.partition)] = p
        log.info(
            "replica_opened",
            topic=topic,
            partition=info.partition,
            chunk_start=start,
            dir=str(d.path),
            log_end_offset=lg.log_end_offset,
        )
        return p

    def _choose_dir(self) -> LogDir:
        """The online log dir holding the fewest replicas (Kafka's default placement)."""
        counts = {id(d): 0 for d in self.log_dirs}
        for d in self._on_disk.values():
            counts[id(d)] = counts.get(id(d), 0) + 1
        online = [d for d in self.log_dirs if d.online]
        return min(online, key=lambda d: counts[id(d)])

    def _remove(self, topic: str, index: int, *, delete: bool) -> None:
        p = self.partitions.pop((topic, index), None)
        if p is None:
            return
        if self.fetchers is not None:
            self.fetchers.unfollow(p)
        if p.is_leader:
            self._tell_leadership(p, False)
        p.fail_waiters()
        if delete:
            p.log.delete()
            for k in [k for k in self._on_disk if k[0] == topic and k[1] == index]:
                self._on_disk.pop(k, None)
            log.info("replica_deleted", topic=topic, partition=index)
        else:
            p.log.close()

    def delete_strays(self, image: MetadataImage) -> None:
        """After the first catch-up: replicas on disk that the metadata no longer gives us."""
        for (topic, index, start), d in list(self._on_disk.items()):
            t = image.topic(topic)
            info = t.partitions.get(index) if t else None
            if info is not None and self.node_id in info.replicas:
                continue
            if (topic, index) in self.partitions:
                continue
            lg = d.open_log(topic, index, start, LogConfig())
            lg.delete()
            self._on_disk.pop((topic, index, start), None)
            log.info("stray_replica_deleted", topic=topic, partition=index, chunk_start=start)

    # ---- retention
    def start_background(self) -> None:
        loop = asyncio.get_running_loop()
        self._retention_task = loop.create_task(self._retention_loop())
        self._checkpoint_task = loop.create_task(self._checkpoint_loop())
        # log compaction of cleanup.policy=compact topics (log.cleaner.enable, log.cleaner.backoff.ms)
        self._cleaner = LogCleaner(
            lambda: [(p.log, self.topic_config(p.topic)) for p in list(self.partitions.values())], self.config.props
        )
        if self._cleaner.enabled:
            self._cleaner_task = loop.create_task(self._cleaner.run())

    async def _checkpoint_loop(self) -> None:
        """Persist high watermarks and recovery points (replica.high.watermark.checkpoint.interval.ms)."""
        interval = int(self.config.props.get("replica.high.watermark.checkpoint.interval.ms", "5000")) / 1000
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(interval)
            logs = [p.log for p in list(self.partitions.values())]
            try:
                await loop.run_in_executor(None, _checkpoint_all, logs)
            except Exception:
                log.exception("checkpoint_failed")

    async def _retention_loop(self) -> None:
        interval = self.config.retention_check_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            now = int(time.time() * 1000)
            for p in list(self.partitions.values()):
                try:
                    n = p.log.enforce_retention(now, delete_policy=retention_applies(self.topic_config(p.topic)))
                    if n:
                        log.info(
                            "retention_deleted_segments",
                            topic=p.topic,
                            partition=p.index,
                            segments=n,
                            log_start_offset=p.log.log_start_offset,
                        )
                except Exception:
                    log.exception("retention_failed", topic=p.topic, partition=p.index)

    # ---- shutdown
    def shutdown(self) -> None:
        if self._cleaner is not None:
            self._cleaner.shutdown()  # a round in progress aborts; the logs close below
        for task in (self._retention_task, self._checkpoint_task, self._cleaner_task):
            if task is not None:
                task.cancel()
        for p in list(self.partitions.values()):
            try:
                p.fail_waiters()
                p.log.close()
            except Exception:
                log.exception("log_close_failed", topic=p.topic, partition=p.index)
        self.partitions.clear()

    def topic_id_of(self, topic: str) -> UUID | None:
        return self.image.topic_ids.get(topic)


def _checkpoint_all(logs: list) -> None:
    for lg in logs:
        try:
            lg.checkpoint()
        except Exception:  # a closed or offline log: its state was written when it closed
            pass
