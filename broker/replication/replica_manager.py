"""ReplicaManager: the chunk replicas this broker holds, kept in line with the metadata image.

It is a metadata publisher: each new image's delta says which partitions changed, and only
those are touched: a replica assigned here is opened (or created in the least-used log dir),
one moved away or of a deleted topic is closed and deleted, configs are re-applied.

Two kinds of replica: the active chunk's (a Partition, keyed (topic, partition), which Produce,
Fetch and the coordinators look up) and inactive chunks' (a ChunkReplica, keyed (topic,
partition, chunk start)). Chunk changes in a delta:
- chunk stop: the active chunk moved on to a new start; our replica of the closed chunk keeps
  its data as a ChunkReplica (trimmed to the chunk's end) and a new dir is opened if we are also
  a replica of the new active chunk;
- chunk create: a chunk replica assigned here opens its dir (or creates it) and copies what it
  lacks of [start, end] (chunk_fetcher.py); a new active chunk's leader lacking the previous
  chunk's tail [start, previous end] copies it before taking writes;
- chunk delete: a replica moved away, or a chunk dropped: stop copying, delete the dir.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from uuid import UUID

import structlog

from broker.config import BrokerConfig
from broker.replication.chunk_fetcher import ChunkFetcher
from broker.replication.chunk_replica import ChunkReplica
from broker.replication.fetcher import ReplicaFetcherManager
from broker.replication.isr import IsrManager
from broker.replication.partition import Partition
from broker.storage.cleaner import LogCleaner, retention_applies
from broker.storage.config import LogConfig
from broker.storage.log_dir import LogDir
from metadata import MetadataDelta, MetadataImage, PartitionInfo
from metadata.config_defs import effective_topic_configs
from metadata.image import BROKER_RESOURCE, TOPIC_RESOURCE, ChunkInfo, TopicInfo

log = structlog.get_logger(__name__)


class ReplicaManager:
    def __init__(self, config: BrokerConfig, log_dirs: list[LogDir]) -> None:
        self.config = config
        self.node_id = config.node_id
        self.log_dirs = log_dirs
        self.partitions: dict[tuple[str, int], Partition] = {}  # active chunk replicas
        self.chunks: dict[tuple[str, int, int], ChunkReplica] = {}  # inactive chunk replicas
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
        self.chunk_fetcher: ChunkFetcher | None = None
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

    def chunks_of(self, topic: str, index: int) -> list[ChunkReplica]:
        """This broker's replicas of the partition's inactive chunks, oldest first."""
        return sorted((cr for (t, i, _), cr in self.chunks.items() if t == topic and i == index), key=lambda c: c.start)

    # ---- metadata publisher
    def on_metadata(self, delta: MetadataDelta, image: MetadataImage) -> None:
        self.image = image
        self._topic_configs.clear()
        for topic in delta.deleted_topics.values():
            for idx in set(topic.partitions) | set(topic.chunks):
                self._remove_all(topic.name, idx)
        for tid, idx in delta.changed_partitions:
            t = image.topics.get(tid)
            if t is not None and idx in t.partitions:
                self._apply_partition(t, idx)
        for rtype, name in delta.changed_configs:
            if rtype == TOPIC_RESOURCE:
                cfg = self.log_config(name)
                for (topic, _), p in self.partitions.items():
                    if topic == name:
                        p.log.update_config(cfg)
                for (topic, _, _), cr in self.chunks.items():
                    if topic == name:
                        cr.log.update_config(cfg)

    def _apply_partition(self, t: TopicInfo, idx: int) -> None:
        """Bring this broker's replicas of one partition (active and inactive chunks) in line."""
        name, info = t.name, t.partitions[idx]
        if info.diskless_coordinator >= 0:
            return  # diskless: no broker stores it, its data is in the object store
        chunks = t.chunks.get(idx, ())
        in_active = self.node_id in info.replicas
        # A chunk cut while a transaction was open at its very first offset holds nothing
        # readable (stop < start) and starts where the new active chunk starts: a broker in both
        # keeps the one dir as the active chunk's (it holds the same records).
        readable = {c.start_offset: c for c in chunks
                    if self.node_id in c.replicas and not (in_active and c.start_offset == info.start_offset)}
        p = self.partitions.get((name, idx))
        if p is not None and p.topic_id != info.topic_id:
            self._remove_all(name, idx)  # topic re-created under the same name
            p = None
        for key, cr in list(self.chunks.items()):
            if key[:2] == (name, idx) and (key[2] not in readable or cr.topic_id != info.topic_id):
                self._delete_chunk(cr)
        if p is not None and p.log.chunk_start != info.start_offset:
            self._stop_active(p, readable.get(p.log.chunk_start))
        for start, c in readable.items():
            cr = self.chunks.get((name, idx, start))
            if cr is None:
                cr = self._open_chunk(name, c)
                if cr is None:
                    continue
            else:
                cr.update(c)
            if self.chunk_fetcher is not None:
                if cr.data_gone:
                    self._leave(cr)
                else:
                    self.chunk_fetcher.copy_chunk(cr)
        if in_active:
            self._ensure(name, info, chunks)
        else:
            self._remove(name, idx, delete=True)

    def _ensure(self, topic: str, info: PartitionInfo, chunks: tuple[ChunkInfo, ...] = ()) -> None:
        key = (topic, info.partition)
        p = self.partitions.get(key)
        if p is None:
            p = self._open(topic, info)
        was_leader, old_epoch = p.is_leader, p.leader_epoch
        p.update(info)
        if p.is_leader and not p.filling_prefix and self.chunk_fetcher is not None:
            # [start, previous chunk's end] belongs to both chunks: the leader holds it before writes
            required_end = max((c.end_offset + 1 for c in chunks if c.end_offset >= info.start_offset),
                               default=info.start_offset)
            if p.log.log_end_offset < required_end:
                p.filling_prefix = True
                self.chunk_fetcher.fill_prefix(p, required_end)
        if p.is_leader != was_leader or (p.is_leader and p.leader_epoch != old_epoch):
            self._tell_leadership(p, p.is_leader)
        if self.fetchers is not None:
            if p.is_leader or info.leader < 0:
                self.fetchers.unfollow(p)
            else:
                self.fetchers.follow(p, info.leader)

    # ---- chunk replicas
    def _stop_active(self, p: Partition, chunk: ChunkInfo | None) -> None:
        """Our active replica's chunk closed: keep its data as a replica of the inactive chunk
        (if we are one), else delete it."""
        self._detach(p)
        key = (p.topic, p.index, p.log.chunk_start)
        if chunk is None or key in self.chunks:
            p.log.delete()
            self._on_disk.pop(key, None)
            log.info("replica_deleted", topic=p.topic, partition=p.index, chunk_start=key[2], reason="chunk closed")
            return
        cr = ChunkReplica(p.topic, chunk, p.log, self.node_id)
        self._prepare_chunk(cr)
        self.chunks[key] = cr
        log.info("chunk_stopped", topic=p.topic, partition=p.index, chunk_start=cr.start, stop_offset=cr.stop,
                 end_offset=cr.end, log_end_offset=cr.log.log_end_offset, in_isr=cr.in_isr)

    def _prepare_chunk(self, cr: ChunkReplica) -> None:
        """A replica outside the chunk's ISR trusts only what it knew to be committed (its high
        watermark): anything past it may be a deposed leader's writes; it copies the rest."""
        lg = cr.log
        if not cr.in_isr and lg.high_watermark < lg.log_end_offset:
            lg.truncate_to(max(lg.high_watermark, lg.log_start_offset))
        cr.seal()

    def _open_chunk(self, topic: str, c: ChunkInfo) -> ChunkReplica | None:
        key = (topic, c.partition, c.start_offset)
        try:
            d = self._on_disk.get(key) or self._choose_dir()
            cfg = self.log_config(topic)
            lg = d.open_log(topic, c.partition, c.start_offset, cfg, topic_id=c.topic_id)
            if lg.topic_id is not None and lg.topic_id != c.topic_id:
                log.info("replica_topic_id_mismatch", topic=topic, partition=c.partition, chunk_start=c.start_offset,
                         action="recreate")
                lg.delete()
                lg = d.open_log(topic, c.partition, c.start_offset, cfg, topic_id=c.topic_id)
        except Exception:
            log.exception("chunk_replica_open_failed", topic=topic, partition=c.partition, chunk_start=c.start_offset)
            return None
        self._on_disk[key] = d
        cr = ChunkReplica(topic, c, lg, self.node_id)
        self._prepare_chunk(cr)
        self.chunks[key] = cr
        log.info("chunk_replica_opened", topic=topic, partition=c.partition, chunk_start=c.start_offset,
                 stop_offset=c.stop_offset, end_offset=c.end_offset, dir=str(d.path),
                 log_start_offset=lg.log_start_offset, log_end_offset=lg.log_end_offset, in_isr=cr.in_isr)
        return cr

    def _delete_chunk(self, cr: ChunkReplica) -> None:
        cr.closed = True
        self.chunks.pop(cr.key, None)
        if self.chunk_fetcher is not None:
            self.chunk_fetcher.cancel(*cr.key)
        try:
            cr.log.delete()
        except Exception:
            log.exception("chunk_replica_delete_failed", topic=cr.topic, partition=cr.index, chunk_start=cr.start)
        self._on_disk.pop(cr.key, None)
        log.info("chunk_replica_deleted", topic=cr.topic, partition=cr.index, chunk_start=cr.start)

    def _leave(self, cr: ChunkReplica) -> None:
        """Retention removed all of this replica's data: leave the chunk (the metadata then drops
        us from it, and we delete the dir)."""
        if self.chunk_fetcher is None or self.node_id not in cr.info.replicas:
            return
        if not cr.leaving:
            log.info("chunk_replica_emptied", topic=cr.topic, partition=cr.index, chunk_start=cr.start,
                     end_offset=cr.end, log_start_offset=cr.log.log_start_offset)
        cr.leaving = True
        self.chunk_fetcher.report_leaving(cr.topic, cr.index, cr.info)

    def _remove_all(self, topic: str, index: int) -> None:
        """Every replica of a partition (a deleted or re-created topic)."""
        self._remove(topic, index, delete=True)
        for key, cr in list(self.chunks.items()):
            if key[:2] == (topic, index):
                self._delete_chunk(cr)

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

    def _detach(self, p: Partition) -> None:
        """Stop serving `p` as the active chunk: no fetching, no leadership, no waiters."""
        if self.partitions.get((p.topic, p.index)) is p:
            del self.partitions[(p.topic, p.index)]
        if self.fetchers is not None:
            self.fetchers.unfollow(p)
        if self.chunk_fetcher is not None:
            self.chunk_fetcher.cancel(p.topic, p.index, p.log.chunk_start)
        if p.is_leader:
            self._tell_leadership(p, False)
        p.filling_prefix = False
        p.fail_waiters()

    def _remove(self, topic: str, index: int, *, delete: bool) -> None:
        p = self.partitions.get((topic, index))
        if p is None:
            return
        self._detach(p)
        if delete:
            p.log.delete()
            self._on_disk.pop((topic, index, p.log.chunk_start), None)
            log.info("replica_deleted", topic=topic, partition=index, chunk_start=p.log.chunk_start)
        else:
            p.log.close()

    def delete_strays(self, image: MetadataImage) -> None:
        """After the first catch-up: replicas on disk that the metadata no longer gives us."""
        for (topic, index, start), d in list(self._on_disk.items()):
            t = image.topic(topic)
            info = t.partitions.get(index) if t else None
            if info is not None and self.node_id in info.replicas and info.start_offset == start:
                continue
            p = self.partitions.get((topic, index))
            if (p is not None and p.log.chunk_start == start) or (topic, index, start) in self.chunks:
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
            logs = [p.log for p in list(self.partitions.values())] + [cr.log for cr in list(self.chunks.values())]
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
            for cr in list(self.chunks.values()):
                await self._enforce_chunk_retention(cr, now)

    async def _enforce_chunk_retention(self, cr: ChunkReplica, now: int) -> None:
        """Retention on an inactive chunk's replica (retention.bytes counts per chunk replica log,
        as storage defines it); when nothing of the chunk is left, the replica leaves it."""
        if cr.closed:
            return
        cr.apply_log_start()
        try:
            if cr.needs_roll:
                await asyncio.get_running_loop().run_in_executor(None, cr.log.roll)
            n = cr.log.enforce_retention(now, delete_policy=retention_applies(self.topic_config(cr.topic)))
        except Exception:
            log.exception("retention_failed", topic=cr.topic, partition=cr.index, chunk_start=cr.start)
            return
        if n:
            log.info("retention_deleted_segments", topic=cr.topic, partition=cr.index, chunk_start=cr.start,
                     segments=n, log_start_offset=cr.log.log_start_offset)
        if cr.data_gone:
            self._leave(cr)

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
        for cr in list(self.chunks.values()):
            cr.closed = True
            try:
                cr.log.close()
            except Exception:
                log.exception("log_close_failed", topic=cr.topic, partition=cr.index, chunk_start=cr.start)
        self.chunks.clear()

    def topic_id_of(self, topic: str) -> UUID | None:
        return self.image.topic_ids.get(topic)


def _checkpoint_all(logs: list) -> None:
    for lg in logs:
        try:
            lg.checkpoint()
        except Exception:  # a closed or offline log: its state was written when it closed
            pass
