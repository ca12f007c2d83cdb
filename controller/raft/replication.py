"""Replication of the metadata log between voters (KIP-595's pull model): the leader appends in
its epoch and a write is committed once the high watermark passes it; a follower fetches from
the leader, truncates to the DivergingEpoch the leader answers when their logs differ, and loads
the leader's snapshot when its offset fell below the leader's log start (KIP-630).

The leader's answers to those Fetch requests are `fetch_server`'s; the offsets voters fetch at
are what move the leader's high watermark.
"""

from __future__ import annotations

import asyncio
import time

import structlog

from controller.metadata_log import MetadataLog
from controller.raft.membership import Membership
from controller.raft.state import NotLeaderError, RaftState, Role
from controller.raft.voter_channel import VoterChannel
from controller.snapshots import SnapshotStore
from metadata.image import METADATA_TOPIC, METADATA_TOPIC_ID
from protocol.errors import Errors, ProtocolError
from protocol.generated.fetch import FetchRequest
from protocol.generated.fetch_snapshot import FetchSnapshotRequest
from protocol.records.control import leader_change_record

log = structlog.get_logger(__name__)

MAX_FETCH_WAIT_MS = 500  # Kafka's raft fetch max wait
FETCH_MAX_BYTES = 8 << 20
SNAPSHOT_CHUNK = 16 << 20
FETCH_VERSION = 13  # topic ids, DivergingEpoch and SnapshotId


class LogReplication:
    def __init__(self, state: RaftState, log: MetadataLog, snapshots: SnapshotStore, channel: VoterChannel,
                 membership: Membership) -> None:
        self.state = state
        self.log = log
        self.snapshots = snapshots
        self.channel = channel
        self.membership = membership  # told of every append, truncation and snapshot (KIP-853)

    # ---- leader: appends and the commit
    async def append(self, records: list, epoch: int) -> tuple[int, int]:
        """Append in `epoch` as its leader. Returns (base offset, bytes). OSError is fatal."""
        s = self.state
        if s.role != Role.LEADER or s.epoch != epoch:
            raise NotLeaderError(f"not the leader of epoch {epoch}")
        base, size = await self.log.append(records, epoch)
        s.advance_high_watermark(self.log.end_offset)
        s.notify_data()
        return base, size

    async def append_leader_change(self, epoch: int) -> tuple[int, int]:
        """As the new leader of `epoch`: write the LEADER_CHANGE control batch that starts it
        (KIP-595; KafkaRaftClient's first append as leader), naming the voters that elected us."""
        s = self.state
        if s.role != Role.LEADER or s.epoch != epoch:
            raise NotLeaderError(f"not the leader of epoch {epoch}")
        record = leader_change_record(s.node_id, list(s.voters), sorted(s.granting_voters), int(time.time() * 1000))
        base, size = await self.log.append_control(record, epoch)
        if self.membership.needs_first_record():
            base = await self.membership.append(self.membership.latest(), epoch) - 1
        s.advance_high_watermark(self.log.end_offset)
        s.notify_data()
        return base, size

    # ---- follower: fetch from the leader
    def _fetch_request(self) -> FetchRequest:
        s = self.state
        part = FetchRequest.FetchPartition(
            partition=0, current_leader_epoch=s.epoch, fetch_offset=self.log.end_offset,
            last_fetched_epoch=self.log.last_epoch, partition_max_bytes=FETCH_MAX_BYTES)
        return FetchRequest(
            cluster_id=s.cluster_id, replica_id=s.node_id,
            max_wait_ms=min(MAX_FETCH_WAIT_MS, s.fetch_timeout_ms // 4), min_bytes=1, max_bytes=FETCH_MAX_BYTES,
            topics=[FetchRequest.FetchTopic(topic=METADATA_TOPIC, topic_id=METADATA_TOPIC_ID, partitions=[part])])

    async def fetch_from_leader(self) -> None:
        """One Fetch from the leader and what its answer asks for: append, truncate, load a
        snapshot, or follow a newer epoch."""
        s = self.state
        epoch, leader = s.epoch, s.leader_id
        resp = await self.channel.ask(leader, self._fetch_request(), s.fetch_timeout_ms / 1000, version=FETCH_VERSION)
        if s.role != Role.FOLLOWER or (s.epoch, s.leader_id) != (epoch, leader):
            return  # the state moved while we waited: this answer is stale
        if resp is None:
            await asyncio.sleep(0.05)
            return
        part = resp.responses[0].partitions[0] if resp.responses and resp.responses[0].partitions else None
        if resp.error_code or part is None:
            await asyncio.sleep(0.05)
            return
        cur = part.current_leader
        if cur is not None and cur.leader_epoch > s.epoch:
            await s.step_down(cur.leader_epoch, cur.leader_id)
            return
        if part.error_code == Errors.OFFSET_OUT_OF_RANGE and part.snapshot_id is not None \
                and part.snapshot_id.end_offset >= 0:
            await self._load_snapshot(leader, part.snapshot_id.end_offset, part.snapshot_id.epoch)
            s.leader_heard()
            return
        if part.error_code:
            await asyncio.sleep(0.05)
            return
        s.leader_heard()
        div = part.diverging_epoch
        if div is not None and div.end_offset >= 0:
            # never below the high watermark: committed records are never truncated
            cut = max(div.end_offset, s.high_watermark)
            if div.end_offset < s.high_watermark:
                log.critical("raft_divergence_below_high_watermark", end_offset=div.end_offset,
                             high_watermark=s.high_watermark)
            await self.log.truncate_to(cut)
            self.membership.truncated(cut)
            log.info("raft_truncated_on_divergence", epoch=div.epoch, end_offset=cut, log_end=self.log.end_offset)
            return
        if part.records:
            data = bytes(part.records)
            try:
                await self.log.append_batches(data)
                self.membership.appended(data)
            except ProtocolError as e:
                log.error("raft_fetched_batches_invalid", error=str(e))
                await asyncio.sleep(0.05)
                return
        hw = min(part.high_watermark, self.log.end_offset)
        if hw > s.high_watermark:
            s.high_watermark = hw
            s.notify_data()
            await s.listener.committed(hw)

    async def _load_snapshot(self, leader: int, end_offset: int, epoch: int) -> None:
        """Replace the log with the leader's snapshot ending at `end_offset`, read in chunks with
        FetchSnapshot (KIP-630)."""
        s = self.state
        R = FetchSnapshotRequest
        data = bytearray()
        while True:
            req = R(cluster_id=s.cluster_id, replica_id=s.node_id, max_bytes=SNAPSHOT_CHUNK, topics=[
                R.TopicSnapshot(name=METADATA_TOPIC, partitions=[R.PartitionSnapshot(
                    partition=0, current_leader_epoch=s.epoch,
                    snapshot_id=R.SnapshotId(end_offset=end_offset, epoch=epoch), position=len(data))])])
            resp = await self.channel.ask(leader, req, 30)
            if resp is None:
                return
            p = resp.topics[0].partitions[0]
            if resp.error_code or p.error_code:
                log.warning("raft_snapshot_fetch_failed", error_code=resp.error_code or p.error_code)
                return
            data += bytes(p.unaligned_records)
            if len(data) >= p.size:
                break
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.snapshots.write, bytes(data), end_offset)
        await self.log.reset(end_offset, epoch)
        self.membership.snapshot_loaded(end_offset, bytes(data))
        s.high_watermark = max(s.high_watermark, end_offset)
        log.info("raft_snapshot_loaded", end_offset=end_offset, epoch=epoch, bytes=len(data))
        await s.listener.snapshot_loaded(end_offset)
        s.notify_data()
