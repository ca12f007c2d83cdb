"""One voter of the metadata quorum, as KafkaRaftClient: elections with randomized timeouts,
pull replication (followers Fetch from the leader, the leader's high watermark comes from the
offsets voters fetch at), divergence (the leader answers DivergingEpoch, the follower truncates)
and snapshots for a follower below the leader's log start.

The state machine: unattached (an epoch, no leader known), voted (unattached with a vote cast),
candidate, leader, follower. Every change of epoch, vote or leader is written to the
quorum-state file before it is acted on or answered. One task (`_run`) drives timers, elections
and the follower's fetches; the request handlers (Vote, BeginQuorumEpoch, EndQuorumEpoch,
Fetch) change the state from the server's tasks and wake it.

The controller above is told through `RaftListener`: who leads which epoch, and (on a
follower) that the high watermark moved or a snapshot replaced the log.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import structlog

from controller.metadata_log import MetadataLog, OffsetOutOfRange
from controller.raft import rules
from controller.raft.leader_state import LeaderState, QuorumView
from controller.raft.quorum_state import ElectionState, QuorumStateFile
from controller.snapshots import SnapshotStore
from metadata.image import METADATA_TOPIC, METADATA_TOPIC_ID
from node.client import ClientError, NodeClient
from node.security import ClientSecurity
from protocol.errors import Errors, ProtocolError
from protocol.generated.begin_quorum_epoch import BeginQuorumEpochRequest
from protocol.generated.end_quorum_epoch import EndQuorumEpochRequest
from protocol.generated.fetch import FetchRequest
from protocol.generated.fetch_snapshot import FetchSnapshotRequest
from protocol.generated.vote import VoteRequest

log = structlog.get_logger(__name__)

MAX_FETCH_WAIT_MS = 500  # Kafka's raft fetch max wait
FETCH_MAX_BYTES = 8 << 20
SNAPSHOT_CHUNK = 16 << 20


class Role(enum.Enum):
    UNATTACHED = "Unattached"
    VOTED = "Voted"
    CANDIDATE = "Candidate"
    LEADER = "Leader"
    FOLLOWER = "Follower"
    RESIGNED = "Resigned"


class NotLeaderError(Exception):
    """This voter is not (or no longer) the leader of the epoch the caller wrote in."""


class RaftListener(Protocol):
    def leader_changed(self, epoch: int, leader_id: int) -> None:
        """A new epoch or leader is known (leader_id -1: none yet). Called synchronously."""

    async def committed(self, high_watermark: int) -> None:
        """A follower's high watermark moved: records below it are committed."""

    async def snapshot_loaded(self, end_offset: int) -> None:
        """A follower replaced its log with the leader's snapshot ending at end_offset."""


@dataclass
class FetchResult:
    error: int = 0
    records: bytes = b""
    high_watermark: int = -1
    log_start: int = 0
    diverging: tuple[int, int] | None = None  # (epoch, end offset)
    snapshot: tuple[int, int] | None = None  # (end offset, epoch)


class RaftClient:
    def __init__(
        self,
        node_id: int,
        voters: dict[int, tuple[str, int]],
        log: MetadataLog,
        snapshots: SnapshotStore,
        listener: RaftListener,
        *,
        election_timeout_ms: int = 1000,
        fetch_timeout_ms: int = 2000,
        security: ClientSecurity | None = None,
    ) -> None:
        self.node_id = node_id
        self.voters = dict(voters)
        self.log = log
        self.snapshots = snapshots
        self.listener = listener
        self.election_timeout_ms = election_timeout_ms
        self.fetch_timeout_ms = fetch_timeout_ms
        self.security = security
        self.cluster_id = ""
        self.state_file = QuorumStateFile(log.dir, list(voters))
        self.role = Role.UNATTACHED
        self.epoch = 0
        self.leader_id = -1
        self.voted_id = -1
        self.high_watermark = 0
        self.leader_state: LeaderState | None = None  # while leading
        self._changed = asyncio.Event()  # log appended, high watermark or state moved
        self._state_changed = asyncio.Event()
        self._peers: dict[int, NodeClient] = {}
        self._connect_locks: dict[int, asyncio.Lock] = {}
        self._task: asyncio.Task | None = None
        self._side_tasks: set[asyncio.Task] = set()
        self._closed = False
        self._election_at = 0.0  # monotonic: when an unattached voter starts an election
        self._last_leader_contact = 0.0
        self._persist_lock = asyncio.Lock()

    # ---- start and stop
    def open(self, cluster_id: str) -> ElectionState:
        """Blocking: read the quorum-state file (before anything is served)."""
        self.cluster_id = cluster_id
        saved = self.state_file.read()
        self.epoch, self.voted_id = saved.epoch, saved.voted_id
        # A leader that restarts has lost its in-memory followers' state: it never resumes as
        # leader of its old epoch (Kafka's rule too); as anyone else it waits for an election.
        self.leader_id = saved.leader_id if saved.leader_id != self.node_id else -1
        self.role = Role.VOTED if self.voted_id >= 0 else Role.UNATTACHED
        if self.leader_id >= 0 and self.leader_id != self.node_id:
            self.role = Role.FOLLOWER
        self._election_at = time.monotonic() + rules.election_timeout(self.election_timeout_ms)
        self._last_leader_contact = time.monotonic()
        return saved

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        """Stop; a leader tells the other voters first, so one of them takes over at once."""
        if self.role == Role.LEADER and len(self.voters) > 1:
            try:
                await asyncio.wait_for(self._send_end_quorum_epoch(), 1.0)
            except (TimeoutError, ClientError):
                pass
        self._closed = True
        self._wake()
        for t in [self._task, *self._side_tasks]:
            if t is not None:
                t.cancel()
        for t in [self._task, *self._side_tasks]:
            if t is not None:
                try:
                    await t
                except (asyncio.CancelledError, Exception):
                    pass
        for c in self._peers.values():
            await c.close()

    # ---- state
    @property
    def is_leader(self) -> bool:
        return self.role == Role.LEADER

    def _wake(self) -> None:
        for name in ("_changed", "_state_changed"):
            ev = getattr(self, name)
            setattr(self, name, asyncio.Event())
            ev.set()

    def _notify_data(self) -> None:
        ev, self._changed = self._changed, asyncio.Event()
        ev.set()

    async def _transition(self, role: Role, epoch: int, leader_id: int = -1, voted_id: int = -1) -> None:
        """Move to a new state, persisted before the caller acts on it or answers."""
        was = (self.role, self.epoch, self.leader_id)
        self.role, self.epoch, self.leader_id, self.voted_id = role, epoch, leader_id, voted_id
        if role != Role.LEADER:
            self.leader_state = None
        if role == Role.FOLLOWER:
            self._last_leader_contact = time.monotonic()
        if role in (Role.UNATTACHED, Role.VOTED):
            self._election_at = time.monotonic() + rules.election_timeout(self.election_timeout_ms)
        log.info("raft_state", role=role.value, epoch=epoch, leader=leader_id, voted=voted_id,
                 previous=was[0].value, previous_epoch=was[1])
        self._wake()
        if (was[1], was[2]) != (epoch, leader_id):
            self.listener.leader_changed(epoch, leader_id)
        await self._persist()

    async def _persist(self) -> None:
        async with self._persist_lock:
            state = ElectionState(self.epoch, self.leader_id, self.voted_id)
            await asyncio.get_running_loop().run_in_executor(None, self.state_file.write, state)

    async def _step_down(self, epoch: int, leader_id: int = -1) -> None:
        """A higher epoch (or a leader of ours) was seen: follow it, or wait unattached."""
        if leader_id >= 0 and leader_id != self.node_id:
            await self._transition(Role.FOLLOWER, epoch, leader_id, self.voted_id if epoch == self.epoch else -1)
        else:
            await self._transition(Role.UNATTACHED, epoch)

    # ---- the driving task
    async def _run(self) -> None:
        while not self._closed:
            try:
                role = self.role
                if role == Role.LEADER:
                    await self._lead_tick()
                elif role == Role.CANDIDATE:
                    await self._elect()
                elif role == Role.FOLLOWER:
                    await self._follow_once()
                else:
                    await self._wait_unattached()
            except asyncio.CancelledError:
                raise
            except OSError as e:
                log.critical("raft_io_failed", error=repr(e))
                await asyncio.sleep(0.5)
            except Exception:
                log.exception("raft_loop_failed")
                await asyncio.sleep(0.1)

    async def _wait_unattached(self) -> None:
        if len(self.voters) == 1:
            await self._become_candidate()
            return
        delay = self._election_at - time.monotonic()
        if delay <= 0:
            await self._become_candidate()
            return
        ev = self._state_changed
        try:
            await asyncio.wait_for(ev.wait(), delay)
        except TimeoutError:
            pass

    async def _become_candidate(self) -> None:
        await self._transition(Role.CANDIDATE, self.epoch + 1, -1, self.node_id)

    async def _elect(self) -> None:
        """One election round in the current (candidate) epoch."""
        epoch = self.epoch
        votes = {self.node_id}
        need = rules.majority(len(self.voters))
        if len(votes) >= need:
            await self._become_leader(epoch)
            return
        deadline = time.monotonic() + rules.election_timeout(self.election_timeout_ms)
        req = VoteRequest(cluster_id=self.cluster_id, topics=[VoteRequest.TopicData(
            topic_name=METADATA_TOPIC, partitions=[VoteRequest.PartitionData(
                partition_index=0, replica_epoch=epoch, replica_id=self.node_id,
                last_offset_epoch=self.log.last_epoch, last_offset=self.log.end_offset)])])
        loop = asyncio.get_running_loop()
        pending = {loop.create_task(self._ask(v, req, self.election_timeout_ms / 1000)): v
                   for v in self.voters if v != self.node_id}
        try:
            while pending and self.role == Role.CANDIDATE and self.epoch == epoch:
                changed = loop.create_task(self._state_changed.wait())
                done, _ = await asyncio.wait([*pending, changed], timeout=max(deadline - time.monotonic(), 0),
                                             return_when=asyncio.FIRST_COMPLETED)
                changed.cancel()
                if not done:
                    break
                for t in done:
                    if t is changed:
                        continue
                    voter = pending.pop(t)
                    resp = t.result()
                    if resp is None:
                        continue
                    p = resp.topics[0].partitions[0] if resp.topics and resp.topics[0].partitions else None
                    if p is None:
                        continue
                    if p.leader_epoch > self.epoch:
                        await self._step_down(p.leader_epoch, p.leader_id)
                        return
                    if p.vote_granted and p.leader_epoch == epoch:
                        votes.add(voter)
                if self.role == Role.CANDIDATE and self.epoch == epoch and len(votes) >= need:
                    await self._become_leader(epoch)
                    return
        finally:
            for t in pending:
                t.cancel()
        if self.role == Role.CANDIDATE and self.epoch == epoch:
            # lost or split: wait out the rest of the randomized timeout, then try a new epoch
            rest = deadline - time.monotonic()
            if rest > 0:
                ev = self._state_changed
                try:
                    await asyncio.wait_for(ev.wait(), rest)
                except TimeoutError:
                    pass
            if self.role == Role.CANDIDATE and self.epoch == epoch:
                log.info("raft_election_lost", epoch=epoch, votes=sorted(votes))
                await self._become_candidate()

    async def _become_leader(self, epoch: int) -> None:
        self.leader_state = LeaderState(self.node_id, list(self.voters), epoch, self.log.end_offset, time.monotonic())
        await self._transition(Role.LEADER, epoch, self.node_id, self.node_id)
        log.info("raft_leader_elected", epoch=epoch, log_end=self.log.end_offset, high_watermark=self.high_watermark)
        self._spawn(self._begin_quorum_epoch(epoch))

    def _spawn(self, coro: Awaitable[Any]) -> None:
        t = asyncio.get_running_loop().create_task(coro)  # type: ignore[arg-type]
        self._side_tasks.add(t)
        t.add_done_callback(self._side_tasks.discard)

    async def _begin_quorum_epoch(self, epoch: int) -> None:
        """Tell every voter who leads this epoch until each has acknowledged (or fetched)."""
        left = {v for v in self.voters if v != self.node_id}
        req = BeginQuorumEpochRequest(cluster_id=self.cluster_id, topics=[BeginQuorumEpochRequest.TopicData(
            topic_name=METADATA_TOPIC, partitions=[BeginQuorumEpochRequest.PartitionData(
                partition_index=0, leader_id=self.node_id, leader_epoch=epoch)])])
        while left and self.role == Role.LEADER and self.epoch == epoch:
            got = await asyncio.gather(*(self._ask(v, req, self.election_timeout_ms / 1000) for v in left))
            for v, resp in zip(list(left), got, strict=True):
                if resp is None:
                    continue
                p = resp.topics[0].partitions[0] if resp.topics and resp.topics[0].partitions else None
                if p is not None and p.leader_epoch > epoch:
                    await self._step_down(p.leader_epoch, p.leader_id)
                    return
                if p is not None and not p.error_code:
                    left.discard(v)
            state = self.leader_state
            left = {v for v in left if state is not None and not state.fetched(v)}
            if left:
                await asyncio.sleep(min(self.election_timeout_ms / 4000, 0.2))

    async def _send_end_quorum_epoch(self) -> None:
        state = self.leader_state
        others = state.by_progress() if state is not None else [v for v in self.voters if v != self.node_id]
        req = EndQuorumEpochRequest(cluster_id=self.cluster_id, topics=[EndQuorumEpochRequest.TopicData(
            topic_name=METADATA_TOPIC, partitions=[EndQuorumEpochRequest.PartitionData(
                partition_index=0, leader_id=self.node_id, leader_epoch=self.epoch, preferred_successors=others)])])
        await asyncio.gather(*(self._ask(v, req, 0.5) for v in others))

    async def _lead_tick(self) -> None:
        """Check-quorum: a leader that has not heard from a majority within the fetch timeout
        resigns (KIP-595's rule, so a partitioned leader stops taking writes it cannot commit)."""
        period = self.fetch_timeout_ms / 1000
        ev = self._state_changed
        try:
            await asyncio.wait_for(ev.wait(), period / 4)
        except TimeoutError:
            pass
        state = self.leader_state
        if self.role != Role.LEADER or state is None:
            return
        if not state.heard_from_majority(time.monotonic(), period * 1.5):
            log.warning("raft_leader_resigns", epoch=self.epoch, reason="no fetch from a majority",
                        voters=len(self.voters))
            await self._transition(Role.RESIGNED, self.epoch, -1, self.node_id)
            self._election_at = time.monotonic() + rules.election_timeout(self.election_timeout_ms)

    # ---- follower: fetch from the leader
    def _fetch_request(self) -> FetchRequest:
        part = FetchRequest.FetchPartition(
            partition=0, current_leader_epoch=self.epoch, fetch_offset=self.log.end_offset,
            last_fetched_epoch=self.log.last_epoch, partition_max_bytes=FETCH_MAX_BYTES)
        return FetchRequest(
            cluster_id=self.cluster_id, replica_id=self.node_id,
            max_wait_ms=min(MAX_FETCH_WAIT_MS, self.fetch_timeout_ms // 4), min_bytes=1, max_bytes=FETCH_MAX_BYTES,
            topics=[FetchRequest.FetchTopic(topic=METADATA_TOPIC, topic_id=METADATA_TOPIC_ID, partitions=[part])])

    async def _follow_once(self) -> None:
        if time.monotonic() - self._last_leader_contact > self.fetch_timeout_ms / 1000:
            log.warning("raft_leader_lost", epoch=self.epoch, leader=self.leader_id, reason="fetch timeout")
            await self._become_candidate()
            return
        epoch, leader = self.epoch, self.leader_id
        resp = await self._ask(leader, self._fetch_request(), self.fetch_timeout_ms / 1000, version=13)
        if self.role != Role.FOLLOWER or (self.epoch, self.leader_id) != (epoch, leader):
            return  # the state moved while we waited: this answer is stale
        if resp is None:
            await asyncio.sleep(0.05)
            return
        part = resp.responses[0].partitions[0] if resp.responses and resp.responses[0].partitions else None
        if resp.error_code or part is None:
            await asyncio.sleep(0.05)
            return
        cur = part.current_leader
        if cur is not None and cur.leader_epoch > self.epoch:
            await self._step_down(cur.leader_epoch, cur.leader_id)
            return
        if part.error_code == Errors.OFFSET_OUT_OF_RANGE and part.snapshot_id is not None \
                and part.snapshot_id.end_offset >= 0:
            await self._load_snapshot(leader, part.snapshot_id.end_offset, part.snapshot_id.epoch)
            self._last_leader_contact = time.monotonic()
            return
        if part.error_code:
            await asyncio.sleep(0.05)
            return
        self._last_leader_contact = time.monotonic()
        div = part.diverging_epoch
        if div is not None and div.end_offset >= 0:
            cut = max(div.end_offset, self.high_watermark)
            if div.end_offset < self.high_watermark:
                log.critical("raft_divergence_below_high_watermark", end_offset=div.end_offset,
                             high_watermark=self.high_watermark)
            await self.log.truncate_to(cut)
            log.info("raft_truncated_on_divergence", epoch=div.epoch, end_offset=cut, log_end=self.log.end_offset)
            return
        if part.records:
            try:
                await self.log.append_batches(bytes(part.records))
            except ProtocolError as e:
                log.error("raft_fetched_batches_invalid", error=str(e))
                await asyncio.sleep(0.05)
                return
        hw = min(part.high_watermark, self.log.end_offset)
        if hw > self.high_watermark:
            self.high_watermark = hw
            self._notify_data()
            await self.listener.committed(hw)

    async def _load_snapshot(self, leader: int, end_offset: int, epoch: int) -> None:
        R = FetchSnapshotRequest
        data = bytearray()
        while True:
            req = R(cluster_id=self.cluster_id, replica_id=self.node_id, max_bytes=SNAPSHOT_CHUNK, topics=[
                R.TopicSnapshot(name=METADATA_TOPIC, partitions=[R.PartitionSnapshot(
                    partition=0, current_leader_epoch=self.epoch,
                    snapshot_id=R.SnapshotId(end_offset=end_offset, epoch=epoch), position=len(data))])])
            resp = await self._ask(leader, req, 30)
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
        self.high_watermark = max(self.high_watermark, end_offset)
        log.info("raft_snapshot_loaded", end_offset=end_offset, epoch=epoch, bytes=len(data))
        await self.listener.snapshot_loaded(end_offset)
        self._notify_data()

    # ---- leader: appends and the high watermark
    async def append(self, records: list, epoch: int) -> tuple[int, int]:
        """Append in `epoch` as its leader. Returns (base offset, bytes). OSError is fatal."""
        if self.role != Role.LEADER or self.epoch != epoch:
            raise NotLeaderError(f"not the leader of epoch {epoch}")
        base, size = await self.log.append(records, epoch)
        self._update_high_watermark()
        self._notify_data()
        return base, size

    async def wait_committed(self, end_offset: int, epoch: int) -> None:
        """Wait until the high watermark reaches `end_offset` while leading `epoch`."""
        while self.high_watermark < end_offset:
            if self.role != Role.LEADER or self.epoch != epoch or self._closed:
                raise NotLeaderError(f"lost the leadership of epoch {epoch} before offset {end_offset} committed")
            await self._changed.wait()

    def _update_high_watermark(self) -> None:
        if self.leader_state is None:
            return
        hw = self.leader_state.high_watermark(self.log.end_offset, self.high_watermark)
        if hw != self.high_watermark:
            self.high_watermark = hw
            self._notify_data()

    # ---- handlers (called by the controller's request handlers)
    def _epoch_error(self, current_leader_epoch: int) -> int:
        if current_leader_epoch > self.epoch:
            return Errors.UNKNOWN_LEADER_EPOCH
        if 0 <= current_leader_epoch < self.epoch:
            return Errors.FENCED_LEADER_EPOCH
        return 0

    def snapshot_error(self, current_leader_epoch: int) -> int:
        """FetchSnapshot is served by the leader only (snapshot ids come from its Fetch answers)."""
        if err := self._epoch_error(current_leader_epoch):
            return err
        return 0 if self.role == Role.LEADER else Errors.NOT_LEADER_OR_FOLLOWER

    async def handle_fetch(self, replica_id: int, fetch_offset: int, last_fetched_epoch: int,
                           current_leader_epoch: int, max_wait_ms: int, max_bytes: int) -> FetchResult:
        if err := self._epoch_error(current_leader_epoch):
            return FetchResult(error=err)
        state = self.leader_state
        if self.role != Role.LEADER or state is None:
            return FetchResult(error=Errors.NOT_LEADER_OR_FOLLOWER)
        voter = state.is_voter(replica_id)
        out = FetchResult(log_start=self.log.start_offset)
        if fetch_offset < self.log.start_offset:
            out.error = Errors.OFFSET_OUT_OF_RANGE
            snap = self.latest_snapshot()
            if snap is not None:
                out.snapshot = snap
            out.high_watermark = self.high_watermark
            return out
        if voter:
            if fetch_offset > 0 or last_fetched_epoch > 0:
                ep, end = self.log.end_offset_for_epoch(last_fetched_epoch)
                if ep != last_fetched_epoch or fetch_offset > end:
                    if ep < 0:  # older than anything we keep: start again from our snapshot
                        snap = self.latest_snapshot()
                        if snap is not None:
                            return FetchResult(error=Errors.OFFSET_OUT_OF_RANGE, snapshot=snap,
                                               high_watermark=self.high_watermark, log_start=self.log.start_offset)
                    out.diverging = (ep, max(end, 0))
                    out.high_watermark = self.high_watermark
                    return out
            state.record_fetch(replica_id, fetch_offset, self.log.end_offset)
            self._update_high_watermark()
            if max_wait_ms > 0 and fetch_offset >= self.log.end_offset:
                await self._wait_change(max_wait_ms / 1000, lambda: self.log.end_offset > fetch_offset)
            upto = None
        else:
            if replica_id >= 0:  # as Kafka: a fetch without a replica id (a reader, not a replica) is no observer
                state.record_fetch(replica_id, fetch_offset, self.log.end_offset)
            if max_wait_ms > 0 and fetch_offset >= self.high_watermark:
                await self._wait_change(max_wait_ms / 1000, lambda: self.high_watermark > fetch_offset)
            upto = self.high_watermark  # observers (brokers) see committed records only
        if self.role != Role.LEADER:
            return FetchResult(error=Errors.NOT_LEADER_OR_FOLLOWER)
        try:
            out.records = await self.log.read(fetch_offset, max_bytes, upto=upto)
        except OffsetOutOfRange:
            out.error = Errors.OFFSET_OUT_OF_RANGE
            out.snapshot = self.latest_snapshot()
        out.high_watermark = self.high_watermark
        out.log_start = self.log.start_offset
        return out

    async def _wait_change(self, timeout: float, done: Callable[[], bool]) -> None:
        deadline = time.monotonic() + timeout
        while not done() and self.role == Role.LEADER and not self._closed:
            rest = deadline - time.monotonic()
            if rest <= 0:
                return
            ev = self._changed
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

    async def handle_vote(self, candidate_id: int, candidate_epoch: int, last_epoch: int,
                          last_offset: int) -> tuple[int, bool]:
        """Returns (error code, vote granted); the caller reports our epoch and leader."""
        if candidate_id not in self.voters:
            return Errors.INCONSISTENT_VOTER_SET, False
        if candidate_epoch < self.epoch:
            return 0, False
        if candidate_epoch > self.epoch:
            await self._step_down(candidate_epoch)
        if self.role in (Role.LEADER, Role.CANDIDATE, Role.FOLLOWER, Role.RESIGNED):
            return 0, self.voted_id == candidate_id
        if self.voted_id >= 0:
            return 0, self.voted_id == candidate_id
        if not rules.log_at_least_as_long(last_epoch, last_offset, self.log.last_epoch, self.log.end_offset):
            log.info("raft_vote_refused", candidate=candidate_id, epoch=candidate_epoch, reason="log behind ours",
                     candidate_last_epoch=last_epoch, candidate_end=last_offset,
                     our_last_epoch=self.log.last_epoch, our_end=self.log.end_offset)
            return 0, False
        await self._transition(Role.VOTED, self.epoch, -1, candidate_id)
        return 0, True

    async def handle_begin_epoch(self, leader_id: int, epoch: int) -> int:
        if leader_id not in self.voters:
            return Errors.INCONSISTENT_VOTER_SET
        if epoch < self.epoch:
            return Errors.FENCED_LEADER_EPOCH
        if epoch == self.epoch and self.role == Role.LEADER and leader_id != self.node_id:
            log.critical("raft_two_leaders", epoch=epoch, other=leader_id)
            return Errors.INVALID_REQUEST
        if (self.role, self.epoch, self.leader_id) != (Role.FOLLOWER, epoch, leader_id) and leader_id != self.node_id:
            await self._transition(Role.FOLLOWER, epoch, leader_id, self.voted_id if epoch == self.epoch else -1)
        return 0

    async def handle_end_epoch(self, leader_id: int, epoch: int, successors: list[int]) -> int:
        if epoch < self.epoch:
            return Errors.FENCED_LEADER_EPOCH
        if epoch > self.epoch or (self.role == Role.FOLLOWER and self.leader_id == leader_id):
            voted = self.voted_id if epoch == self.epoch else -1
            await self._transition(Role.VOTED if voted >= 0 else Role.UNATTACHED, epoch, -1, voted)
            rank = successors.index(self.node_id) if self.node_id in successors else len(successors)
            self._election_at = time.monotonic() + rules.successor_delay(rank, self.election_timeout_ms)
            self._wake()
        return 0

    def describe(self) -> QuorumView:
        if self.role != Role.LEADER or self.leader_state is None:
            return QuorumView(Errors.NOT_LEADER_OR_FOLLOWER, self.leader_id, self.epoch, self.high_watermark)
        return self.leader_state.view(list(self.voters), self.log.end_offset, self.high_watermark)

    # ---- talking to the other voters
    async def _ask(self, voter: int, body: Any, timeout: float, version: int | None = None) -> Any | None:
        """One request to a voter; None if it cannot be reached or did not answer in time."""
        client = None
        try:
            # one connection per voter, shared by the driving task and the leader's announcements
            async with self._connect_locks.setdefault(voter, asyncio.Lock()):
                client = self._peers.get(voter)
                if client is None or not client.connected:
                    host, port = self.voters[voter]
                    client = NodeClient(host, port, client_id=f"raft-{self.node_id}", timeout=timeout,
                                        security=self.security)
                    self._peers[voter] = client
                    await client.connect()
            return await client.request(body, version, timeout=timeout)
        except (ClientError, TimeoutError, OSError, ProtocolError) as e:
            log.debug("raft_peer_unreachable", voter=voter, api=type(body).__name__, error=str(e))
            if client is not None:
                await client.close()
            if self._peers.get(voter) is client:
                self._peers.pop(voter, None)
            return None
