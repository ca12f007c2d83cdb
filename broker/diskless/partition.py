"""Diskless partitions behind the one partition interface, and the broker's diskless service that
holds what they share (object store, WAL writer, block cache, coordinator client, long-poll
waiters) and picks each client's "leader" for Metadata.

Any broker serves any diskless partition. Produce: batches are validated (header, CRC, size),
stamped with LogAppendTime when the topic asks for it, and buffered into this broker's WAL file;
the answer waits for the commit (acks 0/1/all all mean committed). Transactional batches go the
same way, and so do transaction markers (write_marker, for WriteTxnMarkers): the coordinator
keeps the partition's transaction state (KIP-1164 puts producer state there). Fetch:
DisklessFindBatches (for read_committed readers up to the last stable offset, with the aborted
transactions), ranged reads through the block cache, base offsets patched in. Long polls re-ask every
`diskless.fetch.poll.ms` (100 ms) and wake at once when this broker commits to the partition.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, Protocol
from uuid import UUID

import structlog

from broker.diskless.batches import BatchResult, FoundBatches, ProducerInfo
from broker.diskless.config import DisklessConfig
from broker.diskless.coordinator_client import CoordinatorClient
from broker.diskless.file_cleaner import FileCleaner
from broker.diskless.gateways import client_rack, gateway_table, pick
from broker.diskless.object_store import ObjectStoreError, open_object_store
from broker.diskless.orphans import OrphanScanner
from broker.diskless.reader import BlockCache, read_batches
from broker.diskless.wal import WalWriter
from broker.partitions.interface import AppendAnswer, FetchPosition, OffsetAnswer, ReadAnswer, answered
from broker.storage.batch_validation import validate_client_batches
from broker.storage.errors import StorageError
from metadata.diskless import DISKLESS_METADATA_TOPIC
from metadata.image import BROKER_RESOURCE, PartitionInfo, TopicInfo
from protocol.errors import Errors
from protocol.records.batch import read_header, set_log_append_time, set_partition_leader_epoch
from protocol.records.control import encode_txn_marker

if TYPE_CHECKING:
    from broker.diskless.coordinator.coordinator import DisklessCoordinator
    from broker.ports import ImageSource, LocalReplicas
    from broker.replication.peers import PeerClients
    from metadata.image import MetadataImage

log = structlog.get_logger(__name__)

LATEST = -1
CONTROL_ABORT, CONTROL_COMMIT = 0, 1  # Kafka's ControlRecordType of a transaction marker
MAX_PREPARED = 8  # lookups a partition keeps for reads to come (one per concurrent Fetch offset)
RACK_TAG = "diskless_az="  # Inkless' convention: a client names its zone in client.id
GATEWAYS_KEY = "diskless.produce.gateways.enable"


class ProduceCounter(Protocol):
    """Where appended messages are counted for /metrics (the broker's TopicStats, Kafka's
    BrokerTopicStats), as a port: the diskless package does not import the metrics module."""

    def produced(self, topic: str, messages: int, size: int) -> None: ...


class DisklessPartition:
    def pipelines_appends(self, acks: int, size: int) -> bool:
        return True  # answers wait for the shared WAL file (interface.py)

    def __init__(self, service: DisklessService, topic: TopicInfo, info: PartitionInfo) -> None:
        self.s = service
        self.topic = topic
        self.info = info
        self.key = (topic.id, info.partition)
        self._lookups: dict[int, Awaitable[FoundBatches]] = {}  # fetch offset -> prepare_read's answer

    # ------------------------------------------------------------------ produce
    def append(self, records: Any, acks: int, timeout_ms: int, now_ms: int) -> Awaitable[AppendAnswer]:
        if records is None or len(records) == 0:
            return answered(AppendAnswer(Errors.CORRUPT_MESSAGE, "produce request holds no records"))
        cfg = self.s.replicas.topic_config(self.topic.name)
        try:
            batches = validate_client_batches(records, int(cfg["max.message.bytes"]), allow_control=False)
        except StorageError as e:
            log.warning("produce_rejected", topic=self.topic.name, partition=self.info.partition, error=str(e))
            return answered(AppendAnswer(e.error_code, str(e)))
        # KIP-253 (and KIP-101's field): each batch carries the partition's leader epoch in this
        # broker's image, as a leader stamps its own; the one image that checked the producer's
        # partition count, so a batch hashed over an old count carries the epoch the change ended
        # and the coordinator refuses it once that epoch has ended (coordinator/view.py)
        data = bytearray(records)
        epoch = self.info.leader_epoch
        log_append = cfg.get("message.timestamp.type") == "LogAppendTime"
        for pos, h in batches:
            set_partition_leader_epoch(data, pos, epoch)
            if log_append:
                set_log_append_time(data, pos, h, now_ms)
        fut = self.s.wal.append(self.topic.id, self.info.partition, data, [h for _, h in batches],
                                1 if log_append else 0, now_ms, leader_epoch=epoch)
        return self._answer(fut, sum(h.record_count for _, h in batches), len(records))

    def write_marker(self, producer_id: int, producer_epoch: int, coordinator_epoch: int, commit: bool,
                     now_ms: int) -> Awaitable[AppendAnswer]:
        """WriteTxnMarkers on this partition: the control batch goes into the WAL file and is
        committed like any batch; the coordinator checks its epochs and ends the producer's
        transaction (KIP-98's marker, KIP-1164's commit path)."""
        data = bytearray(encode_txn_marker(producer_id, producer_epoch, coordinator_epoch, commit, now_ms))
        set_partition_leader_epoch(data, 0, self.info.leader_epoch)
        header = read_header(data)
        fut = self.s.wal.append(self.topic.id, self.info.partition, data, [header], 0, now_ms,
                                marker=(CONTROL_COMMIT if commit else CONTROL_ABORT, coordinator_epoch),
                                leader_epoch=self.info.leader_epoch)
        return self._answer(fut, 0, 0)

    async def _answer(self, fut: asyncio.Future, messages: int, size: int) -> AppendAnswer:
        r: BatchResult = await fut
        if r.error_code == 0 and self.s.topic_stats is not None:
            self.s.topic_stats.produced(self.topic.name, messages, size)
        return AppendAnswer(r.error_code, r.error_message, r.base_offset, r.log_append_time, r.log_start_offset)

    # ------------------------------------------------------------------ fetch
    def prepare_read(self, pos: FetchPosition) -> bool:
        """Ask for the batches now: the lookups of every diskless partition of a Fetch go out
        together, one DisklessFindBatches per coordinator broker."""
        if len(self._lookups) >= MAX_PREPARED:
            self._lookups.clear()  # prepared by requests that never read them
        self._lookups[pos.fetch_offset] = self._find(pos)
        return True

    def _find(self, pos: FetchPosition) -> Awaitable[FoundBatches]:
        tid, idx = self.key
        return self.s.client.find_batches(tid, idx, pos.fetch_offset, max(pos.max_bytes, 1), pos.read_committed)

    async def read(self, pos: FetchPosition) -> ReadAnswer:
        tid, idx = self.key
        lookup = self._lookups.pop(pos.fetch_offset, None) or self._find(pos)
        got = await lookup
        err, lso, hw, found = got.error_code, got.log_start_offset, got.high_watermark, got.batches
        rows: list[Any] = []
        size = 0
        for r in found:  # asked before the Fetch's budget was known: keep what fits now
            if rows and size + r.byte_size > pos.max_bytes:
                break
            rows.append(r)
            size += r.byte_size
        stable = got.last_stable_offset if got.last_stable_offset >= 0 else hw
        ans = ReadAnswer(high_watermark=hw, last_stable_offset=stable, log_start_offset=lso,
                         aborted_transactions=[] if pos.read_committed else None)
        if err == Errors.OFFSET_OUT_OF_RANGE and pos.fetch_offset > hw >= 0:
            # this broker's copy of the coordinator's state may trail the leader by a moment
            code, _, latest = await self.s.client.list_offsets(tid, idx, LATEST)
            if code == 0 and pos.fetch_offset <= latest:
                ans.wait = True
                return ans
        if err:
            ans.error_code = err
            return ans
        if not rows:
            ans.wait = True
            return ans
        if not pos.min_one_batch and rows[0].byte_size > pos.max_bytes:
            return ans  # the budget is spent; the next fetch gets it
        if pos.read_committed and got.aborted:
            end = rows[-1].last_offset
            ans.aborted_transactions = [(pid, first) for pid, first in got.aborted if first <= end]
        try:
            ans.records = await read_batches(self.s.cache, rows)
        except ObjectStoreError as e:
            log.warning("diskless_read_failed", topic=self.topic.name, partition=idx, error=str(e))
            ans.error_code = Errors.KAFKA_STORAGE_ERROR
            return ans
        ans.size = len(ans.records)
        return ans

    def add_data_waiter(self, fut: asyncio.Future, follower: bool = False) -> None:
        self.s.add_waiter(self.key, fut)

    async def epoch_end_offset(self, leader_epoch: int, consumer: bool,
                               current_leader_epoch: int = -1) -> tuple[int, int, int]:
        """Answered by the partition's coordinator, where its epochs start and end (KIP-253's
        gates ask there what a leader's epoch cache answers); the asker's epoch is checked there
        too, against the coordinator's epoch of the partition, not this broker's image."""
        return await self.s.client.epoch_end(self.topic.id, self.info.partition, leader_epoch, current_leader_epoch)

    async def describe_producers(self) -> tuple[int, list[ProducerInfo]]:
        """The producers the partition's coordinator keeps (DescribeProducers, from any broker)."""
        return await self.s.client.describe_producers(self.topic.id, self.info.partition)

    async def delete_records(self, offset: int) -> tuple[int, int]:
        """DisklessDeleteRecords at the partition's coordinator (-1: the high watermark)."""
        return await self.s.client.delete_records(self.topic.id, self.info.partition, offset)

    # ------------------------------------------------------------------ list offsets
    async def offset_for(self, timestamp: int, read_committed: bool) -> OffsetAnswer:
        err, ts, offset = await self.s.client.list_offsets(self.topic.id, self.info.partition, timestamp,
                                                           read_committed)
        ans = OffsetAnswer(err, offset if not err else -1, ts if not err else -1)
        if ans.offset >= 0:
            ans.leader_epoch = self.info.leader_epoch
        return ans


class DisklessService:
    def __init__(self, node_id: int, metadata: ImageSource, replicas: LocalReplicas, coordinator: DisklessCoordinator,
                 peers: PeerClients, config: DisklessConfig, topic_stats: ProduceCounter | None = None) -> None:
        """`metadata`: the broker's metadata (.image); `replicas`: the ReplicaManager (topic
        configs, which coordinator partitions are here); `coordinator`: this broker's own diskless
        coordinator (called without the network); `peers`: PeerClients with purpose "diskless"
        (client id diskless-<node id>: the coordinator APIs' rule)."""
        self.node_id = node_id
        self.metadata = metadata
        self.replicas = replicas
        self.topic_stats = topic_stats  # produce counters, /metrics (none: not counted)
        self.location = open_object_store(config.storage_url, endpoint=config.s3_endpoint, region=config.s3_region)
        self.peers = peers
        self.client = CoordinatorClient(node_id, metadata, peers, coordinator, replicas)
        self.wal = WalWriter(self.location, self.client, max_bytes=config.wal_max_bytes, max_ms=config.wal_max_ms,
                             on_commit=self._committed, node_id=node_id)
        # the WAL files' lifecycle for the coordinators led here, and the orphan scan
        self.coordinator = coordinator
        self.cleaner = FileCleaner(coordinator, self.client, self.location.store, config.file_deletion_grace_ms,
                                   config.orphan_scan_grace_ms)
        self.orphans = OrphanScanner(coordinator, self.client, self.location.store, self.location.prefix,
                                     config.orphan_scan_interval_ms, config.orphan_scan_grace_ms)
        self.cache = BlockCache(self.location.store, config.fetch_cache_bytes)
        self.poll_s = config.fetch_poll_ms / 1000
        self._waiters: dict[tuple[Any, int], list[asyncio.Future]] = {}
        self._partitions: dict[tuple[str, int], DisklessPartition] = {}
        self._loop = asyncio.get_running_loop()
        self.produce_gateways = config.produce_gateways
        self._gateways: tuple[Any, dict[tuple[Any, int], list[int]]] = (None, {})

    def partition(self, topic: str, index: int) -> DisklessPartition | None:
        """The diskless partition `topic`-`index`, or None when it is not one. The same object
        while the metadata of the partition stays the same (what prepare_read started stays
        with it until read)."""
        t = self.metadata.image.topic(topic)
        info = t.partitions.get(index) if t is not None else None
        if t is None or info is None or info.diskless_coordinator < 0:
            self._partitions.pop((topic, index), None)
            return None
        p = self._partitions.get((topic, index))
        if p is None or p.topic is not t or p.info is not info:
            p = self._partitions[(topic, index)] = DisklessPartition(self, t, info)
        return p

    def add_waiter(self, key: tuple[Any, int], fut: asyncio.Future) -> None:
        self._waiters.setdefault(key, []).append(fut)
        self._loop.call_later(self.poll_s, _wake, fut)

    def _committed(self, topic_id: UUID, partition: int) -> None:
        for fut in self._waiters.pop((topic_id, partition), []):
            _wake(fut)

    # ------------------------------------------------------------------ metadata
    def assign_leaders(self, topics: list[Any], client_id: str | None) -> None:
        """Name one live broker as the leader (and only replica) of every diskless partition in a
        Metadata answer: a produce gateway of the partition's coordinator (gateways.py) in the
        client's rack (its client.id carries `diskless_az=<rack>`, Inkless' convention; a client
        without one, or whose rack has no live broker, gets a rack by a stable hash of its client
        id), chosen among the gateways by that hash too; PreferredProduceBrokers lists them all.
        With `diskless.produce.gateways.enable=false`: one broker for all of a client's diskless
        partitions (in its rack when named, else by the hash)."""
        image = self.metadata.image
        racks = {b.id: b.rack for b in image.brokers.values() if not b.fenced}
        if not racks:
            return
        cid = client_id or ""
        wanted = cid.split(RACK_TAG, 1)[1].split(",")[0].split(";")[0] if RACK_TAG in cid else None
        if self._gateways_enabled(image):
            table = self._gateway_table(image, racks)
            rack = client_rack(sorted(set(racks.values()), key=lambda r: (r is None, r or "")), wanted, cid)

            def brokers_for(index: int) -> list[int]:
                gws = table.get((rack, index))
                return pick(gws, cid) if gws else [self._one_broker(racks, wanted, cid)]
        else:
            one = [self._one_broker(racks, wanted, cid)]

            def brokers_for(index: int) -> list[int]:
                return one
        for t in topics:
            info = image.topics.get(t.topic_id) if t.topic_id is not None else None
            if info is None:
                continue
            for entry in t.partitions:
                pinfo = info.partitions.get(entry.partition_index)
                if pinfo is None or pinfo.diskless_coordinator < 0:
                    continue
                preferred = brokers_for(pinfo.diskless_coordinator)
                entry.error_code = 0
                entry.leader_id = preferred[0]
                entry.replica_nodes = [preferred[0]]
                entry.isr_nodes = [preferred[0]]
                entry.offline_replicas = []
                entry.preferred_produce_brokers = preferred

    @staticmethod
    def _one_broker(racks: dict[int, Any], wanted: str | None, cid: str) -> int:
        """Without gateways: one broker in the client's rack when it names one that has a broker,
        else one spread by a stable hash of the client id."""
        live = sorted(racks)
        pool = [i for i in live if wanted is not None and racks[i] == wanted] or live
        return pool[zlib.crc32(cid.encode()) % len(pool)]

    def _gateways_enabled(self, image: MetadataImage) -> bool:
        """`diskless.produce.gateways.enable`: this broker's dynamic value, else the cluster-wide
        dynamic default, else server.properties (default true)."""
        for layer in (image.configs.get((BROKER_RESOURCE, str(self.node_id)), {}),
                      image.configs.get((BROKER_RESOURCE, ""), {})):
            raw = layer.get(GATEWAYS_KEY)
            if raw is not None:
                return raw.strip().lower() != "false"
        return self.produce_gateways

    def _gateway_table(self, image: MetadataImage, racks: dict[int, Any]) -> dict[tuple[Any, int], list[int]]:
        """The gateway table of this image (computed once per image)."""
        if self._gateways[0] is not image:
            t = image.topic(DISKLESS_METADATA_TOPIC)
            leaders = {i: p.leader for i, p in t.partitions.items()} if t is not None else {}
            # coordinators mapped before the topic exists (or beyond it) have no leader yet
            for info in image.topics.values():
                for p in info.partitions.values():
                    if p.diskless_coordinator >= 0:
                        leaders.setdefault(p.diskless_coordinator, -1)
            self._gateways = (image, gateway_table(racks, leaders))
        return self._gateways[1]

    async def describe_files(self, keys: list[str], details: bool) -> Any:
        """DisklessDescribeFiles: the coordinators led here, and what the orphan scan here found."""
        resp = await self.coordinator.describe_files(keys, details)
        resp.last_orphan_scan_ms = self.orphans.last_scan_ms
        if details:
            resp.orphans = [type(resp).DisklessOrphanFile(object_key=k, size=n, deleted_ms=at)
                            for k, n, at in self.orphans.deleted]
        return resp

    async def close(self) -> None:
        self.cleaner.close()
        self.orphans.close()
        await self.wal.close()
        self.client.close()
        await self.peers.close()
        await self.location.store.close()


def _wake(fut: asyncio.Future) -> None:
    """Wake a long poll (a commit to its partition, or its diskless.fetch.poll.ms re-ask) unless
    already woken."""
    if not fut.done():
        fut.set_result(None)
