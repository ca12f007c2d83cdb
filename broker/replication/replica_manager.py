"""ReplicaManager: the chunk replicas this broker holds, kept in line with the metadata image.

It is a metadata publisher: each new image's delta says which partitions changed, and only
those are touched: a replica assigned here is opened (or created in the dir placement picks,
dir_placement.py), one moved away or of a deleted topic is closed and deleted, configs are
re-applied.

Two kinds of replica (hosted.py): the active chunk's (a Partition, keyed (topic, partition),
which Produce, Fetch and the coordinators look up) and inactive chunks' (a ChunkReplica, keyed
(topic, partition, chunk start)). Chunk changes in a delta:
- chunk stop: the active chunk moved on to a new start; our replica of the closed chunk keeps
  its data as a ChunkReplica (trimmed to the chunk's end) and a new dir is opened if we are also
  a replica of the new active chunk;
- chunk create: a chunk replica assigned here opens its dir (or creates it) and copies what it
  lacks of [start, end] (chunk_fetcher.py); a new active chunk's leader lacking the previous
  chunk's tail [start, previous end] copies it before taking writes;
- chunk delete: a replica moved away, or a chunk dropped: stop copying, delete the dir.

Its collaborators come through its constructor (replica_ports.py): the follower fetchers, the
chunk copier, the ISR manager and the dir assigner; retention and checkpoints run in
log_maintenance.py.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from uuid import UUID

import structlog

from broker.config import BrokerConfig
from broker.replication.chunk_replica import ChunkReplica
from broker.replication.dir_placement import DirPlacement
from broker.replication.hosted import HostedReplicas
from broker.replication.log_dir_mover import LogDirMover
from broker.replication.log_maintenance import LogMaintenance, high_watermarks_by_dir
from broker.replication.partition import Partition
from broker.replication.replica_ports import ChunkCopies, DirReports, FollowerFetchers, IsrChanges
from broker.replication.role_changes import RoleChanges
from broker.replication.throttle import MOVE_RATE_KEYS, broker_rate
from broker.storage.config import LogConfig
from broker.storage.errors import StorageError
from broker.storage.log import Log
from broker.storage.log_dir import LogDir
from broker.storage.replica_move import remove_tree
from metadata import MetadataDelta, MetadataImage, PartitionInfo
from metadata.broker_defaults import BROKER_DEFAULTS
from metadata.config_defs import effective_topic_configs
from metadata.image import BROKER_RESOURCE, ELR_FEATURE, TOPIC_RESOURCE, ChunkInfo, TopicInfo
from protocol.errors import Errors

log = structlog.get_logger(__name__)
Key = tuple[str, int, int]  # topic, partition, chunk start


class ReplicaManager:
    def __init__(self, config: BrokerConfig, log_dirs: list[LogDir], hosted: HostedReplicas, dir_reports: DirReports,
                 fetchers: FollowerFetchers, chunk_fetcher: ChunkCopies, isr: IsrChanges) -> None:
        self.config = config
        self.node_id = config.node_id
        self.log_dirs = log_dirs
        self.hosted = hosted
        self.partitions = hosted.partitions  # active chunk replicas (the one dict, shared)
        self.chunks = hosted.chunks  # inactive chunk replicas
        self.dir_reports = dir_reports
        self.fetchers = fetchers
        self.chunk_fetcher = chunk_fetcher
        self.isr = isr
        # one bound method for every partition, not one each (64 bytes a partition)
        self._on_caught_up = isr.follower_caught_up
        self._min_isr_for_hw = self._strict_min_isr
        self.image = MetadataImage.EMPTY
        self._topic_configs: dict[str, dict[str, str]] = {}
        # told (partition, is_leader) whenever this broker gains or loses a partition's
        # leadership: coordinators load and unload their state partitions with it
        self.leadership_listeners: list[Callable[[Partition, bool], None]] = []
        self.mover = LogDirMover(
            self, lambda: broker_rate(self.image, self.node_id, config.props, *MOVE_RATE_KEYS),
            int(config.props.get("num.replica.move.threads", "0")) or len(log_dirs),
        )
        self.placement = DirPlacement(self.node_id, log_dirs, self.mover, dir_reports)
        self.maintenance = LogMaintenance(config, log_dirs, hosted, self.topic_config, self._leave)
        self._loaded = False  # load_dirs() ran: the logs it finds are this process's to close
        self._roles = RoleChanges()  # the role changes of the delta being applied
        # logs of replicas a coming delta gives us, opened off the loop before it is published
        self._preopened: dict[Key, tuple[LogDir, Log, bool]] = {}
        # Kafka's num.recovery.threads.per.data.dir, but for the broker, not per dir: a log's open
        # is Python under the GIL with a syscall every few µs, and threads hand the GIL back and
        # forth at each one (5,000 logs in the page cache: 1.3 s on one thread, 2.6-3.9 s on 2-8).
        # More threads pay only when the cache is cold and the reads wait on the disk.
        key = "num.recovery.threads.per.data.dir"
        self._open_threads = max(1, int(config.props.get(key, BROKER_DEFAULTS[key])))
        self._open_pool = ThreadPoolExecutor(self._open_threads, thread_name_prefix="log-open")

    def load_dirs(self) -> None:
        """Once the log dirs are formatted or checked: follow their failures, settle the moves a
        restart interrupted, and learn which replicas each dir holds."""
        loop = asyncio.get_running_loop()

        def failed(d: LogDir) -> None:  # an I/O error can come from an executor thread: handle it on the loop
            loop.call_soon_threadsafe(self._dir_offline, d)

        for d in self.log_dirs:
            d.offline_listeners.append(failed)
        self.placement.load()
        self._loaded = True

    # ---- lookups
    def get(self, topic: str, index: int) -> Partition | None:
        return self.partitions.get((topic, index))

    @property
    def offline(self) -> dict[Key, LogDir]:
        """Replicas here whose log dir is offline."""
        return self.placement.offline

    def topic_config(self, topic: str) -> dict[str, str]:
        """Every topic config's effective value (topic override, broker default, Kafka default)."""
        cfg = self._topic_configs.get(topic)
        if cfg is None:
            entries = effective_topic_configs(
                self.image.topic_config(topic), self.image.configs.get((BROKER_RESOURCE, ""), {}), self.config.props
            )
            # every topic config has a default (config_defs.py): no value is None
            cfg = self._topic_configs[topic] = {name: value for name, value, _ in entries if value is not None}
        return cfg

    def _strict_min_isr(self, topic: str) -> int:
        """KIP-966: with eligible leader replicas on, a leader's high watermark needs
        min.insync.replicas in the ISR (Partition.min_isr_for_hw); 0 when the feature is off."""
        if self.image.features.get(ELR_FEATURE, 0) < 1:
            return 0
        return int(self.topic_config(topic)["min.insync.replicas"])

    def log_config(self, topic: str) -> LogConfig:
        return LogConfig.from_properties(self.topic_config(topic))

    def replica_offline(self, topic: str, index: int) -> bool:
        """Our replica of the partition's active chunk sits in an offline log dir."""
        info = self.image.partition(topic, index)
        return info is not None and (topic, index, info.start_offset) in self.placement.offline

    def dir_of(self, key: Key) -> LogDir | None:
        """The online log dir holding a replica (None: not on this broker, or offline)."""
        return self.placement.on_disk.get(key)

    def replica(self, key: Key) -> Partition | ChunkReplica | None:
        """This broker's replica of a chunk: the active chunk's Partition or an inactive chunk's."""
        return self.hosted.replica(key)

    def install_log(self, key: Key, lg: Log, d: LogDir) -> None:
        """A move swapped the replica's log: serve it from `d` now, and tell the controller."""
        r = self.replica(key)
        if r is None:
            lg.close()
            return
        lg.producer_state.expiration_ms = r.log.producer_state.expiration_ms
        r.log = lg
        self.placement.placed(key, d, r.topic_id)
        log.info("replica_dir_changed", topic=key[0], partition=key[1], chunk_start=key[2], dir=str(d.path),
                 log_end_offset=lg.log_end_offset)

    def install_failed(self, key: Key, d: LogDir, reason: str) -> None:
        """A move swapped the replica into `d`, which then failed: the replica is offline with it."""
        self.placement.on_disk[key] = d
        d.mark_offline(reason)
        self._dir_offline(d)

    def log_dir_by_path(self, path: str) -> LogDir | None:
        return self.placement.by_path(path)

    def alter_log_dir(self, topic: str, index: int, path: str) -> int:
        """AlterReplicaLogDirs (KIP-113) for one partition: move each of its chunk replicas here to
        `path` ("any": cancel). An error code; nothing changes on an error."""
        info = self.image.partition(topic, index)
        if info is None:
            return Errors.UNKNOWN_TOPIC_OR_PARTITION
        return self.placement.alter(topic, index, info.start_offset, path, lambda k: self.replica(k) is not None)

    def replicas_in(self, d: LogDir) -> list[tuple[Key, Log]]:
        """The open chunk replicas in a log dir."""
        return [(k, r.log) for k, dd in list(self.placement.on_disk.items())
                if dd is d and (r := self.replica(k)) is not None]

    def chunks_of(self, topic: str, index: int) -> list[ChunkReplica]:
        """This broker's replicas of the partition's inactive chunks, oldest first."""
        return self.hosted.chunks_of(topic, index)

    # ---- metadata publisher
    async def prepare(self, delta: MetadataDelta, image: MetadataImage) -> None:
        """Before `delta` is published: open the logs of the active-chunk replicas it gives us (new
        replicas, or all of them at startup) in the open pool, so that opening thousands (2-3 ms
        each) leaves the event loop free for heartbeats and requests. on_metadata then takes
        each opened log instead of opening it. Only plain cases are opened early; anything
        needing a decision (a replica we already serve, a chunk replica, a wanted move, an
        assigned dir that is offline, a topic deleted in the same delta) is left to on_metadata."""
        todo = self._to_preopen(delta, image)
        if not todo:
            return
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        slices = [todo[i:i + 64] for i in range(0, len(todo), 64)]
        await asyncio.gather(*(loop.run_in_executor(self._open_pool, self._preopen_slice, s) for s in slices))
        log.info("replicas_preopened", replicas=len(todo), opened=sum(1 for k, *_ in todo if k in self._preopened),
                 seconds=round(time.monotonic() - started, 2), offset=image.offset)

    def _to_preopen(self, delta: MetadataDelta, image: MetadataImage) -> list[tuple[Key, LogDir, LogConfig, UUID]]:
        gone = {t.name for t in delta.deleted_topics.values()} | {name for name, _ in delta.deleted_partitions.values()}
        with_chunks = {k[:2] for k in self.chunks}
        online = [d for d in self.log_dirs if d.online]
        if not online:
            return []
        by_id: dict[UUID | None, LogDir] = {d.known_id: d for d in self.log_dirs if d.known_id is not None}
        counts = self.placement.counts()
        configs: dict[str, LogConfig] = {}
        todo = []
        for tid, idx in delta.changed_partitions:
            t = image.topics.get(tid)
            info = t.partitions.get(idx) if t is not None else None
            if t is None or info is None or self.node_id not in info.replicas or t.name in gone:
                continue
            key = (t.name, idx, info.start_offset)
            if (t.name, idx) in self.partitions or (t.name, idx) in with_chunks or key in self._preopened:
                continue
            d = self.placement.preopen_dir(key, info.replicas, info.directories, counts, by_id)
            if d is None:
                continue
            cfg = configs.get(t.name)
            if cfg is None:
                cfg = configs[t.name] = LogConfig.from_properties({name: v for name, v, _ in effective_topic_configs(
                    image.topic_config(t.name), image.configs.get((BROKER_RESOURCE, ""), {}), self.config.props)
                    if v is not None})
            todo.append((key, d, cfg, info.topic_id))
        return todo

    def _preopen_slice(self, items: list[tuple[Key, LogDir, LogConfig, UUID]]) -> None:
        """In the open pool. A log that fails to open is left to on_metadata, which handles the
        error (offline dir, storage error) as it always has."""
        for key, d, cfg, topic_id in items:
            existed = key in self.placement.on_disk
            try:
                lg = _open_replica_log(d, key, cfg, topic_id)
            except Exception:
                continue
            self._preopened[key] = (d, lg, existed)

    def _drop_preopened(self) -> None:
        """Logs opened for a delta that did not use them (rare: a dir failed meanwhile)."""
        while self._preopened:
            key, (d, lg, existed) = self._preopened.popitem()
            if existed or not d.online:
                _close_quietly(lg)
            else:
                try:
                    lg.delete()  # created for nothing: no stray dir left behind
                except Exception:
                    _close_quietly(lg)

    async def on_metadata(self, delta: MetadataDelta, image: MetadataImage) -> None:
        """Apply a delta, partition by partition, yielding to the event loop every few ms: one
        of thousands of partitions (a restart, a fence or unfence of this broker) would
        otherwise hold heartbeats and requests for seconds. Each partition is applied whole
        between yields; the loader publishes the next delta only once this one is done."""
        self.image = image
        pace = _Pacer()
        self._topic_configs.clear()
        self._roles = RoleChanges(len(delta.changed_partitions))
        # One partition's storage error (its dir failing under it) never stops the rest of the
        # delta: the partitions of every other dir are still applied.
        for topic in delta.deleted_topics.values():
            for idx in set(topic.partitions) | set(topic.chunks):
                try:
                    self._remove_all(topic.name, idx)
                except Exception:
                    log.exception("replica_remove_failed", topic=topic.name, partition=idx)
                await pace()
        for name, p in delta.deleted_partitions.values():
            # a partition marked for deletion (KIP-253) was deleted once empty: every chunk goes
            try:
                self._remove_all(name, p.partition)
            except Exception:
                log.exception("replica_remove_failed", topic=name, partition=p.partition)
            await pace()
        for tid, idx in delta.changed_partitions:
            t = image.topics.get(tid)
            if t is not None and idx in t.partitions:
                try:
                    self._apply_partition(t, idx)
                except Exception as exc:
                    log.error("replica_apply_failed", topic=t.name, partition=idx, error=str(exc),
                              error_type=type(exc).__name__)
                await pace()
        for rtype, name in delta.changed_configs:
            if rtype == TOPIC_RESOURCE:
                cfg = self.log_config(name)
                for (of_topic, _), active in self.partitions.items():
                    if of_topic == name:
                        active.log.update_config(cfg)
                for (of_topic, _, _), cr in self.chunks.items():
                    if of_topic == name:
                        cr.log.update_config(cfg)
        self._drop_preopened()
        self._roles.summary(image.offset)

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
        offline = self.placement.offline
        for key in [k for k in offline if k[:2] == (name, idx)]:
            if not (key[2] in readable or (in_active and key[2] == info.start_offset)):
                offline.pop(key)  # moved away while its dir is offline: nothing left to serve
        p = self.partitions.get((name, idx))
        if p is not None and p.topic_id != info.topic_id:
            self._remove_all(name, idx)  # topic re-created under the same name
            p = None
        for key, old in list(self.chunks.items()):
            if key[:2] == (name, idx) and (key[2] not in readable or old.topic_id != info.topic_id):
                self._delete_chunk(old)
        # The active chunk moved on, or (cut at its first offset) moved to other brokers from the
        # same start: our dir becomes that closed chunk's replica. Opening a second log on it and
        # removing the active one would delete the dir under the chunk replica.
        if p is not None and (p.log.chunk_start != info.start_offset
                              or (not in_active and p.log.chunk_start in readable)):
            self._stop_active(p, readable.get(p.log.chunk_start))
        for start, c in readable.items():
            cr = self.chunks.get((name, idx, start))
            if cr is None:
                cr = self._open_chunk(name, c)
                if cr is None:
                    continue
            else:
                cr.update(c)
            self.placement.check(c.topic_id, (name, idx, start), c.replicas, c.directories)
            self.placement.maybe_move((name, idx, start))
            if cr.data_gone:
                self._leave(cr)
            else:
                self.chunk_fetcher.copy_chunk(cr)
        if in_active:
            self._ensure(name, info, chunks)
        else:
            self._remove(name, idx, delete=True)

    def _ensure(self, topic: str, info: PartitionInfo, chunks: tuple[ChunkInfo, ...] = ()) -> None:
        p = self.partitions.get((topic, info.partition))
        if p is None:
            p = self._open(topic, info)
            if p is None:
                return
        key = (topic, info.partition, info.start_offset)
        self.placement.check(info.topic_id, key, info.replicas, info.directories)
        self.placement.maybe_move(key)
        was_leader, old_epoch = p.is_leader, p.leader_epoch
        self.fetchers.settle(p)
        self._roles.record(p, p.update(info))
        if p.is_leader and not p.filling_prefix:
            # [start, previous chunk's end] belongs to both chunks: the leader holds it before writes
            required_end = max((c.end_offset + 1 for c in chunks if c.end_offset >= info.start_offset),
                               default=info.start_offset)
            if p.log.log_end_offset < required_end:
                p.filling_prefix = True
                self.chunk_fetcher.fill_prefix(p, required_end)
        if p.is_leader != was_leader or (p.is_leader and p.leader_epoch != old_epoch):
            self._tell_leadership(p, p.is_leader)
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
            self.placement.on_disk.pop(key, None)
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
        d = self.placement.dir_for(key, c.replicas, c.directories)
        if d is None:
            return None
        try:
            lg = _open_replica_log(d, key, self.log_config(topic), c.topic_id)
        except Exception as exc:
            if not d.online:
                self.placement.offline[key] = d
            log.error("chunk_replica_open_failed", topic=topic, partition=c.partition, chunk_start=c.start_offset,
                      dir=str(d.path), error=str(exc))
            return None
        self.placement.on_disk[key] = d
        cr = ChunkReplica(topic, c, lg, self.node_id)
        self._prepare_chunk(cr)
        self.chunks[key] = cr
        log.info("chunk_replica_opened", topic=topic, partition=c.partition, chunk_start=c.start_offset,
                 stop_offset=c.stop_offset, end_offset=c.end_offset, dir=str(d.path),
                 log_start_offset=lg.log_start_offset, log_end_offset=lg.log_end_offset, in_isr=cr.in_isr)
        return cr

    def _delete_chunk(self, cr: ChunkReplica) -> None:
        self.mover.cancel(cr.key, reason="replica removed")
        cr.closed = True
        self.chunks.pop(cr.key, None)
        self.chunk_fetcher.cancel(*cr.key)
        try:
            cr.log.delete()
        except Exception:
            log.exception("chunk_replica_delete_failed", topic=cr.topic, partition=cr.index, chunk_start=cr.start)
        self.placement.on_disk.pop(cr.key, None)
        log.info("chunk_replica_deleted", topic=cr.topic, partition=cr.index, chunk_start=cr.start)

    def _leave(self, cr: ChunkReplica) -> None:
        """Retention removed all of this replica's data: leave the chunk (the metadata then drops
        us from it, and we delete the dir)."""
        if self.node_id not in cr.info.replicas:
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

    def _open(self, topic: str, info: PartitionInfo) -> Partition | None:
        start = info.start_offset
        key = (topic, info.partition, start)
        pre = self._preopened.pop(key, None)
        if pre is not None and (not pre[0].online or key in self.placement.offline):
            _close_quietly(pre[1])
            pre = None
        if pre is not None:
            d, lg, _ = pre
        else:
            placed = self.placement.dir_for(key, info.replicas, info.directories)
            if placed is None:
                return None
            d = placed
            try:
                lg = _open_replica_log(d, key, self.log_config(topic), info.topic_id)
            except StorageError:
                if not d.online:
                    self.placement.offline[key] = d
                raise
        self.placement.on_disk[key] = d
        lg.producer_state.expiration_ms = int(self.config.props.get("producer.id.expiration.ms", "86400000"))
        p = Partition(topic, info.partition, info.topic_id, lg, self.node_id)
        p.on_follower_caught_up = self._on_caught_up
        p.min_isr_for_hw = self._min_isr_for_hw
        self.partitions[(topic, info.partition)] = p
        # opened in a batch (replicas_preopened says how many): one line each only at debug
        (log.info if pre is None else log.debug)(
            "replica_opened",
            topic=topic,
            partition=info.partition,
            chunk_start=start,
            dir=str(d.path),
            log_end_offset=lg.log_end_offset,
        )
        return p

    # ---- log dir failure
    def _dir_offline(self, d: LogDir) -> None:
        """A log dir failed: every replica in it stops (no fetching, no leadership here, waiters
        fail); the controller hears of the dir in the next heartbeat and moves leadership."""
        stopped = self.placement.dir_failed(d)
        for key in stopped:
            p = self.partitions.get(key[:2])
            if p is not None and p.log.chunk_start == key[2]:
                self._detach(p)
                _close_quietly(p.log)
                t = self.image.topic(key[0])
                info = t.partitions.get(key[1]) if t is not None else None
                if info is not None and d.known_id is not None:
                    # the controller may not know yet that the replica is there: say so, so the
                    # offline dir takes it out of the ISR too
                    self.dir_reports.report(info.topic_id, key[1], key[2], d.known_id)
            cr = self.chunks.pop(key, None)
            if cr is not None:
                cr.closed = True
                self.chunk_fetcher.cancel(*key)
                _close_quietly(cr.log)
        log.error("log_dir_replicas_stopped", path=str(d.path), replicas=len(stopped), reason=d.offline_reason,
                  online_dirs=sum(1 for x in self.log_dirs if x.online))

    def _detach(self, p: Partition) -> None:
        """Stop serving `p` as the active chunk: no fetching, no leadership, no waiters."""
        if self.partitions.get((p.topic, p.index)) is p:
            del self.partitions[(p.topic, p.index)]
        self.fetchers.settle(p)
        self.fetchers.unfollow(p)
        self.chunk_fetcher.cancel(p.topic, p.index, p.log.chunk_start)
        if p.is_leader:
            self._tell_leadership(p, False)
        p.filling_prefix = False
        p.fail_waiters()

    def _remove(self, topic: str, index: int, *, delete: bool) -> None:
        p = self.partitions.get((topic, index))
        if p is None:
            return
        self.mover.cancel((topic, index, p.log.chunk_start), reason="replica removed")
        self._detach(p)
        if delete:
            p.log.delete()
            self.placement.on_disk.pop((topic, index, p.log.chunk_start), None)
            log.info("replica_deleted", topic=topic, partition=index, chunk_start=p.log.chunk_start)
        else:
            p.log.close()

    def delete_strays(self, image: MetadataImage) -> None:
        """After the first catch-up: replicas on disk that the metadata no longer gives us."""
        on_disk = self.placement.on_disk
        for (topic, index, start), d in list(on_disk.items()):
            t = image.topic(topic)
            info = t.partitions.get(index) if t else None
            if info is not None and self.node_id in info.replicas and info.start_offset == start:
                continue
            p = self.partitions.get((topic, index))
            if (p is not None and p.log.chunk_start == start) or (topic, index, start) in self.chunks:
                continue
            lg = d.open_log(topic, index, start, LogConfig())
            lg.delete()
            on_disk.pop((topic, index, start), None)
            log.info("stray_replica_deleted", topic=topic, partition=index, chunk_start=start)

    # ---- background work
    def start_background(self) -> None:
        loop = asyncio.get_running_loop()
        for path in self.placement.to_delete:  # KIP-113: `.delete` dirs a restart found go in the background
            loop.run_in_executor(None, remove_tree, path)
        self.maintenance.start()

    # ---- shutdown
    def shutdown(self) -> None:
        for key in list(self.mover.moves):
            self.mover.cancel(key, reason="broker stopping")
        self.maintenance.stop()
        self._open_pool.shutdown(wait=True, cancel_futures=True)
        for p in list(self.partitions.values()):
            p.fail_waiters()
        for cr in list(self.chunks.values()):
            cr.closed = True
        logs = [p.log for p in self.partitions.values()] + [cr.log for cr in self.chunks.values()]
        logs += [lg for _, lg, _ in self._preopened.values()]
        self.partitions.clear()
        self.chunks.clear()
        self._preopened.clear()
        # As Kafka: every log closed, then one clean-shutdown marker per dir, so the next start
        # skips recovery. The closes write without fsync (five a log made 20,000 logs take 25 s)
        # and each dir's filesystem is synced once before its marker. Dirs never loaded (the
        # broker stopped before it checked them) are left as they were.
        started = time.monotonic()
        # As many threads as the opens (num.recovery.threads.per.data.dir, as Kafka's shutdown):
        # a close is Python under the GIL with a syscall every few µs, so on a filesystem whose
        # creates are cheap more threads only trade the GIL (20,000 closes: 8 threads 410-460 µs
        # a log, 1 thread 200-280 µs); more help only where a disk makes each file wait.
        with ThreadPoolExecutor(self._open_threads, thread_name_prefix="log-close") as pool:
            failed = {lg.dir_key[0] for lg, ok in zip(logs, pool.map(_close_logged, logs)) if not ok}
        closed = time.monotonic()
        dirs = self.log_dirs if self._loaded else []
        # the high watermarks the closes left out of each log's own file (log_state.py)
        entries = high_watermarks_by_dir(logs)
        marked = []
        for d in dirs:
            path = os.fspath(d.path)
            if path in failed:
                marked.append(False)
                continue
            if path in entries:
                d.write_high_watermarks(entries[path])
            marked.append(d.mark_clean_shutdown())
        log.info("logs_closed", logs=len(logs), seconds=round(closed - started, 2),
                 sync_seconds=round(time.monotonic() - closed, 2), dirs_marked_clean=sum(marked))

    def topic_id_of(self, topic: str) -> UUID | None:
        return self.image.topic_ids.get(topic)


def _open_replica_log(d: LogDir, key: Key, cfg: LogConfig, topic_id: UUID) -> Log:
    """Open (or create) a replica's log; a leftover of an older topic of the same name is replaced."""
    topic, partition, start = key
    lg = d.open_log(topic, partition, start, cfg, topic_id=topic_id)
    if lg.topic_id is not None and lg.topic_id != topic_id:
        log.info("replica_topic_id_mismatch", topic=topic, partition=partition, chunk_start=start, action="recreate")
        lg.delete()
        lg = d.open_log(topic, partition, start, cfg, topic_id=topic_id)
    return lg


class _Pacer:
    """Awaited after each step of a long run of loop work: yields to the loop every SLICE seconds."""

    SLICE = 0.02

    def __init__(self) -> None:
        self._until = time.monotonic() + self.SLICE

    async def __call__(self) -> None:
        if time.monotonic() >= self._until:
            await asyncio.sleep(0)
            self._until = time.monotonic() + self.SLICE


def _close_logged(lg: Log) -> bool:
    try:
        lg.close(sync=False, hw_in_dir=True)  # the caller writes each dir's high watermarks
    except Exception:
        log.exception("log_close_failed", dir=str(lg.dir))
        return False
    return True


def _close_quietly(lg: Log) -> None:
    """Close a log of a failed dir: its files are released; nothing more can be written."""
    try:
        lg.close()
    except Exception as exc:
        log.info("log_close_failed_offline_dir", dir=str(lg.dir), error=str(exc))
