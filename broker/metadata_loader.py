"""Follows the controller's metadata log, as a KRaft broker does: Fetch on __cluster_metadata,
replay records into a MetadataDelta, publish each new MetadataImage to the listeners (the
ReplicaManager first), and let callers wait until the image reaches an offset.

Before a delta is published its preparers run (awaited, one delta at a time, so a later delta
never overtakes an earlier one): the ReplicaManager opens the new replicas' logs there in a
thread pool, so a delta of thousands of replicas never holds the event loop (heartbeats,
requests) for the seconds that opening them takes; and it applies the delta in slices that
yield to the loop (leadership changes of thousands of partitions take seconds too)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import structlog

from broker.controller_channel import ControllerChannel
from metadata import METADATA_TOPIC, METADATA_TOPIC_ID, MetadataDelta, MetadataImage, decode_record
from metadata.voters import addresses, read_voters
from node.client import ClientError
from node.shutdown import stop_task
from protocol.errors import ProtocolError
from protocol.generated.fetch import FetchRequest
from protocol.records import decode_batches

log = structlog.get_logger(__name__)

# a publisher may be a coroutine function: it is awaited before the next publisher and delta
Publisher = Callable[[MetadataDelta, MetadataImage], Awaitable[None] | None]
Preparer = Callable[[MetadataDelta, MetadataImage], Awaitable[None]]
OFFSET_OUT_OF_RANGE = 1
FETCH_MAX_WAIT_MS = 500
LEADER_MOVED = frozenset({6, 74, 75})  # NOT_LEADER_OR_FOLLOWER, FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH


class MetadataLoader:
    def __init__(self, channel: ControllerChannel, node_id: int, fetch_timeout_s: float = 2.0) -> None:
        self.channel = channel
        self.node_id = node_id
        # as a KRaft observer: a fetch unanswered for its long poll plus the quorum's fetch
        # timeout means that controller is gone or cut off, and the channel looks for the leader
        self.request_timeout_s = FETCH_MAX_WAIT_MS / 1000 + fetch_timeout_s
        self.image = MetadataImage.EMPTY
        self.high_watermark = -1  # the controller's log end, as last reported
        self.publishers: list[Publisher] = []
        self.preparers: list[Preparer] = []
        self._waiters: list[tuple[int, asyncio.Future]] = []
        self._task: asyncio.Task | None = None
        self._stopping = False
        self.caught_up = asyncio.Event()
        self._rounds_started = 0
        self._rounds_done = 0
        self._round_waiters: list[tuple[int, asyncio.Future]] = []

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        self._stopping = True
        await stop_task(self._task)

    async def wait_for_offset(self, offset: int, timeout: float = 30.0) -> bool:
        """Wait until the image includes the record at ``offset``; False on timeout."""
        if self.image.offset >= offset:
            return True
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append((offset, fut))
        try:
            await asyncio.wait_for(fut, timeout)
            return True
        except TimeoutError:
            return False

    async def sync(self, timeout: float = 30.0) -> bool:
        """Wait until a fetch sent after this call has been applied: the image then holds
        everything the controller had committed when we were called."""
        target = self._rounds_started + 1
        if self._rounds_done >= target:
            return True
        fut = asyncio.get_running_loop().create_future()
        self._round_waiters.append((target, fut))
        try:
            await asyncio.wait_for(fut, timeout)
            return True
        except TimeoutError:
            return False

    def _round_done(self, n: int) -> None:
        self._rounds_done = n
        keep = []
        for target, fut in self._round_waiters:
            if n >= target:
                if not fut.done():
                    fut.set_result(True)
            else:
                keep.append((target, fut))
        self._round_waiters = keep

    def _request(self, version: int, offset: int) -> FetchRequest:
        part = FetchRequest.FetchPartition(partition=0, fetch_offset=offset, partition_max_bytes=8 << 20)
        topic = FetchRequest.FetchTopic(partitions=[part])
        if version >= 13:
            topic.topic_id = METADATA_TOPIC_ID
        else:
            topic.topic = METADATA_TOPIC
        req = FetchRequest(max_wait_ms=FETCH_MAX_WAIT_MS, min_bytes=1, max_bytes=16 << 20, topics=[topic])
        if version >= 15:
            req.replica_state = FetchRequest.ReplicaState(replica_id=self.node_id, replica_epoch=-1)
        else:
            req.replica_id = self.node_id
        return req

    async def _run(self) -> None:
        next_offset = 0
        while not self._stopping:
            try:
                version = await self.channel.version_for(FetchRequest.API_KEY)
                self._rounds_started += 1
                this_round = self._rounds_started
                resp = await self.channel.request(self._request(version, next_offset), version,
                                                  timeout=self.request_timeout_s)
            except ClientError as e:
                log.warning("metadata_fetch_failed", error=str(e))
                await asyncio.sleep(0.2)
                continue
            if resp.error_code:
                log.warning("metadata_fetch_error", error_code=resp.error_code)
                await asyncio.sleep(0.2)
                continue
            part = resp.responses[0].partitions[0]
            if part.error_code == OFFSET_OUT_OF_RANGE and part.snapshot_id is not None:
                try:
                    next_offset = await self._load_snapshot(part.snapshot_id.end_offset, part.snapshot_id.epoch)
                except ClientError as e:
                    # e.g. the controller replaced that snapshot meanwhile: fetch again for the new one
                    log.warning("metadata_snapshot_fetch_failed", error=str(e))
                    await asyncio.sleep(0.2)
                continue
            if part.error_code in LEADER_MOVED:
                # a voter that does not lead: follow its hint, or find the leader again
                hint = part.current_leader.leader_id if part.current_leader is not None else -1
                log.info("metadata_leader_moved", error_code=part.error_code, hint=hint)
                where = next(((e.host, e.port) for e in resp.node_endpoints or () if e.node_id == hint), None)
                self.channel.leader_moved(hint if hint >= 0 else None, where)
                await asyncio.sleep(0.05 if hint >= 0 else 0.2)
                continue
            if part.error_code:
                log.warning("metadata_fetch_error", error_code=part.error_code)
                await asyncio.sleep(0.2)
                continue
            self.high_watermark = part.high_watermark
            if part.records:
                next_offset = await self._replay_batches(part.records, MetadataDelta(self.image))
            if next_offset >= self.high_watermark:
                self.caught_up.set()
            self._round_done(this_round)

    async def _replay_batches(self, records, delta: MetadataDelta, replaces: MetadataImage | None = None,
                        end_offset: int | None = None) -> int:
        """Replay every record, publish the new image; returns the next offset to fetch."""
        next_offset = delta.offset + 1
        try:
            for batch in decode_batches(records):
                if batch.header.is_control:
                    if self.channel.bootstrap_servers:  # a dynamic quorum's voters (KIP-853): where to find it
                        for rec in batch.records:
                            if (found := read_voters(rec)) is not None:
                                self.channel.learn(addresses(found))
                    next_offset = batch.header.last_offset + 1
                    continue
                for rec in batch.records:
                    if rec.value is not None:
                        record, _ = decode_record(rec.value)
                        delta.replay(record, rec.offset)
                next_offset = batch.header.last_offset + 1
        except ProtocolError as e:
            log.error("metadata_record_invalid", error=str(e))
        if end_offset is not None:
            # a snapshot numbers its records from 0; the image it yields stands at its end offset
            next_offset = end_offset
            delta.offset = end_offset - 1
        if replaces is not None:
            # a snapshot replaced the image: whatever it lacks is gone
            kept = {tid for tid, _ in delta.changed_partitions}
            delta.deleted_topics.update({tid: t for tid, t in replaces.topics.items() if tid not in kept})
            delta.deleted_partitions.update({
                (tid, idx): (t.name, p) for tid, t in replaces.topics.items() if tid in kept
                for idx, p in t.partitions.items() if (tid, idx) not in delta.changed_partitions
            })
        if delta.offset != self.image.offset or next_offset > self.image.offset + 1 or replaces is not None:
            delta.offset = max(delta.offset, next_offset - 1)
            await self._publish(delta)
        return next_offset

    async def _load_snapshot(self, end_offset: int, epoch: int) -> int:
        """Replace the image with the controller's snapshot (our position fell below its log start)."""
        from protocol.generated.fetch_snapshot import FetchSnapshotRequest  # served by our controller

        R = FetchSnapshotRequest
        data = bytearray()
        while True:
            req = R(
                replica_id=self.node_id,
                max_bytes=16 << 20,
                topics=[
                    R.TopicSnapshot(
                        name=METADATA_TOPIC,
                        partitions=[
                            R.PartitionSnapshot(
                                partition=0,
                                current_leader_epoch=-1,
                                snapshot_id=R.SnapshotId(end_offset=end_offset, epoch=epoch),
                                position=len(data),
                            )
                        ],
                    )
                ],
            )
            resp = await self.channel.request(req)
            p = resp.topics[0].partitions[0]
            if resp.error_code or p.error_code:
                raise ClientError(f"FetchSnapshot failed: {resp.error_code or p.error_code}")
            data += bytes(p.unaligned_records)
            if len(data) >= p.size:
                break
        delta = MetadataDelta(MetadataImage.EMPTY)
        delta.offset = -1
        await self._replay_batches(bytes(data), delta, replaces=self.image, end_offset=end_offset)
        log.info("metadata_snapshot_loaded", end_offset=end_offset, records_bytes=len(data))
        return end_offset

    async def _publish(self, delta: MetadataDelta) -> None:
        image = delta.apply()
        for prepare in self.preparers:
            try:
                await prepare(delta, image)
            except Exception:
                log.exception("metadata_prepare_failed", offset=image.offset)
        self.image = image
        for pub in self.publishers:
            try:
                applied = pub(delta, image)
                if applied is not None:
                    await applied
            except Exception:
                log.exception("metadata_publish_failed", offset=image.offset)
        still = []
        for off, fut in self._waiters:
            if image.offset >= off:
                if not fut.done():
                    fut.set_result(True)
            else:
                still.append((off, fut))
        self._waiters = still
