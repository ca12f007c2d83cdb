"""The leader's answers to Fetch and FetchSnapshot on the metadata log, as KafkaRaftClient's
handleFetchRequest and handleFetchSnapshotRequest give them.

From another voter, a Fetch is replication (KIP-595): its offset and last fetched epoch are
checked against our log (DivergingEpoch when they differ), its offset moves the high watermark,
and it long-polls on our log end. From a broker or any other observer, it reads committed
records only and long-polls on the high watermark. Either one, below our log start, is told the
snapshot to load with FetchSnapshot instead (KIP-630).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from controller.metadata_log import MetadataLog, OffsetOutOfRange
from controller.raft.state import RaftState, Role
from controller.snapshots import SnapshotStore
from protocol.errors import Errors


@dataclass
class FetchResult:
    error: int = 0
    records: bytes = b""
    high_watermark: int = -1
    log_start: int = 0
    diverging: tuple[int, int] | None = None  # (epoch, end offset)
    snapshot: tuple[int, int] | None = None  # (end offset, epoch)


class FetchServer:
    def __init__(self, state: RaftState, log: MetadataLog, snapshots: SnapshotStore) -> None:
        self.state = state
        self.log = log
        self.snapshots = snapshots

    def _epoch_error(self, current_leader_epoch: int) -> int:
        if current_leader_epoch > self.state.epoch:
            return Errors.UNKNOWN_LEADER_EPOCH
        if 0 <= current_leader_epoch < self.state.epoch:
            return Errors.FENCED_LEADER_EPOCH
        return 0

    def snapshot_error(self, current_leader_epoch: int) -> int:
        """FetchSnapshot is served by the leader only (snapshot ids come from its Fetch answers)."""
        if err := self._epoch_error(current_leader_epoch):
            return err
        return 0 if self.state.role == Role.LEADER else Errors.NOT_LEADER_OR_FOLLOWER

    async def handle_fetch(self, replica_id: int, fetch_offset: int, last_fetched_epoch: int,
                           current_leader_epoch: int, max_wait_ms: int, max_bytes: int) -> FetchResult:
        s = self.state
        if err := self._epoch_error(current_leader_epoch):
            return FetchResult(error=err)
        leader = s.leader_state
        if s.role != Role.LEADER or leader is None:
            return FetchResult(error=Errors.NOT_LEADER_OR_FOLLOWER)
        voter = leader.is_voter(replica_id)
        out = FetchResult(log_start=self.log.start_offset)
        if fetch_offset < self.log.start_offset:
            out.error = Errors.OFFSET_OUT_OF_RANGE
            snap = self.latest_snapshot()
            if snap is not None:
                out.snapshot = snap
            out.high_watermark = s.high_watermark
            return out
        if voter:
            if fetch_offset > 0 or last_fetched_epoch > 0:
                ep, end = self.log.end_offset_for_epoch(last_fetched_epoch)
                if ep != last_fetched_epoch or fetch_offset > end:
                    if ep < 0:  # older than anything we keep: start again from our snapshot
                        snap = self.latest_snapshot()
                        if snap is not None:
                            return FetchResult(error=Errors.OFFSET_OUT_OF_RANGE, snapshot=snap,
                                               high_watermark=s.high_watermark, log_start=self.log.start_offset)
                    out.diverging = (ep, max(end, 0))
                    out.high_watermark = s.high_watermark
                    return out
            leader.record_fetch(replica_id, fetch_offset, self.log.end_offset)
            s.advance_high_watermark(self.log.end_offset)
            if max_wait_ms > 0 and fetch_offset >= self.log.end_offset:
                await self._wait_change(max_wait_ms / 1000, lambda: self.log.end_offset > fetch_offset)
            upto = None
        else:
            if replica_id >= 0:  # as Kafka: a fetch without a replica id (a reader, not a replica) is no observer
                leader.record_fetch(replica_id, fetch_offset, self.log.end_offset)
            if max_wait_ms > 0 and fetch_offset >= s.high_watermark:
                await self._wait_change(max_wait_ms / 1000, lambda: s.high_watermark > fetch_offset)
            upto = s.high_watermark  # observers (brokers) see committed records only
        if s.role != Role.LEADER:
            return FetchResult(error=Errors.NOT_LEADER_OR_FOLLOWER)
        try:
            out.records = await self.log.read(fetch_offset, max_bytes, upto=upto)
        except OffsetOutOfRange:
            out.error = Errors.OFFSET_OUT_OF_RANGE
            out.snapshot = self.latest_snapshot()
        out.high_watermark = s.high_watermark
        out.log_start = self.log.start_offset
        return out

    async def _wait_change(self, timeout: float, done: Callable[[], bool]) -> None:
        """Long poll: until `done()`, the timeout, or this voter stops leading."""
        s = self.state
        deadline = time.monotonic() + timeout
        while not done() and s.role == Role.LEADER and not s.closed:
            rest = deadline - time.monotonic()
            if rest <= 0:
                return
            ev = s.changed
            try:
                await asyncio.wait_for(ev.wait(), rest)
            except TimeoutError:
                return

    def latest_snapshot(self) -> tuple[int, int] | None:
        """(end offset, epoch) of the snapshot a replica below the log start should load."""
        start = self.log.start_offset
        end = start if start > 0 and self.snapshots.path(start).exists() else self.snapshots.latest()
        if end is None:
            return None
        return end, self.log.epochs.epoch_at(end - 1) if end > 0 else 0
