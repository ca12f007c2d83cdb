"""One voter of the metadata quorum, as KafkaRaftClient (KIP-595): the parts wired together, the
task that drives them, and the surface the controller and its request handlers use.

- `state`: role, epoch, leader, vote and high watermark, persisted on every transition;
- `elections`: timeouts, pre-votes (KIP-996), candidacy, Vote, BeginQuorumEpoch,
  EndQuorumEpoch, check-quorum;
- `replication`: the leader's appends and commits, the follower's fetches, DivergingEpoch
  truncation and snapshot loading (KIP-630);
- `fetch_server`: the leader's answers to Fetch and FetchSnapshot from voters and brokers;
- `membership`: the voter set in force and its changes (KIP-853); a controller outside it is an
  observer that follows the leader and never stands.

One task (`_run`) drives timers, elections and the follower's fetches; the request handlers
change the state from the server's tasks and wake it. The controller above is told through
`RaftListener`: who leads which epoch, and (on a follower) that the high watermark moved or a
snapshot replaced the log.
"""

from __future__ import annotations

import asyncio
import time
from uuid import UUID

import structlog

from controller.metadata_log import MetadataLog
from controller.raft.elections import Elections
from controller.raft.fetch_server import FetchResult, FetchServer
from controller.raft.leader_state import QuorumView
from controller.raft.membership import Membership
from controller.raft.quorum_state import ElectionState, QuorumStateFile
from controller.raft.replication import LogReplication
from controller.raft.state import RaftListener, RaftState, Role
from controller.raft.voter_channel import VoterChannel
from controller.snapshots import SnapshotStore
from metadata.voters import Voter, VoterHistory, static_voters
from node.client import ClientError
from node.security import ClientSecurity
from protocol.errors import Errors

log = structlog.get_logger(__name__)


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
        listener_name: str = "CONTROLLER",
        bootstrap_servers: tuple[tuple[str, int], ...] = (),
    ) -> None:
        """`voters`: controller.quorum.voters (static, kraft.version 0); empty for a quorum whose
        voters are in its log (KIP-853), found through `bootstrap_servers`."""
        self.node_id = node_id
        self.voters = dict(voters)  # id -> address of the set in force, shared with state and channel
        self.log = log
        self.snapshots = snapshots
        history = VoterHistory(static_voters(voters, listener_name) if voters else None)
        self.state = RaftState(node_id, self.voters, QuorumStateFile(log.dir, list(voters)), listener,
                               election_timeout_ms=election_timeout_ms, fetch_timeout_ms=fetch_timeout_ms)
        self.channel = VoterChannel(node_id, self.voters, security)
        self.membership = Membership(self.state, log, snapshots, self.channel, history, self.voters, bootstrap_servers)
        self.elections = Elections(self.state, log, self.channel)
        self.replication = LogReplication(self.state, log, snapshots, self.channel, self.membership)
        self.fetch_server = FetchServer(self.state, log, snapshots)
        self._task: asyncio.Task | None = None

    # ---- start and stop
    def open(self, cluster_id: str, directory_id: UUID, snapshot_end: int | None) -> ElectionState:
        """Blocking: read the quorum-state file and the voter set in the log (before anything is
        served)."""
        self.state.directory_id = directory_id
        self.membership.load(snapshot_end)
        return self.state.load(cluster_id)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        """Stop; a leader tells the other voters first, so one of them takes over at once."""
        if self.state.role == Role.LEADER and len(self.voters) > 1 and self.membership.is_voter():
            try:
                await asyncio.wait_for(self.elections.resign(), 1.0)
            except (TimeoutError, ClientError):
                pass
        self.state.closed = True
        self.state.wake()
        tasks = [t for t in (self._task, *self.elections.background) if t is not None]
        for t in tasks:
            t.cancel()
        for t in tasks:
            try:
                await t
            except (asyncio.CancelledError, Exception):
                pass
        await self.channel.close()

    # ---- the driving task
    async def _run(self) -> None:
        state = self.state
        while not state.closed:
            try:
                role = state.role
                if self.membership.dynamic and not self.membership.is_voter():
                    await self._observe()
                elif role == Role.LEADER:
                    await self.elections.poll_leader()
                elif role == Role.CANDIDATE:
                    await self.elections.poll_candidate()
                elif role == Role.PROSPECTIVE:
                    await self.elections.poll_prospective()
                elif role == Role.FOLLOWER:
                    if not await self.elections.check_fetch_timeout():
                        await self.replication.fetch_from_leader()
                else:
                    await self.elections.poll_unattached()
            except asyncio.CancelledError:
                raise
            except OSError as e:
                log.critical("raft_io_failed", error=repr(e))
                await asyncio.sleep(0.5)
            except Exception:
                log.exception("raft_loop_failed")
                await asyncio.sleep(0.1)

    async def _observe(self) -> None:
        """Outside the voter set (KIP-853): follow the leader, never stand. A leader whose own
        removal committed hands over first."""
        s = self.state
        if s.role == Role.LEADER:
            if self.membership.removal_committed():
                await self.elections.resign()
                await s.transition(Role.UNATTACHED, s.epoch)
            else:
                await self.elections.poll_leader()
        elif s.role == Role.FOLLOWER and self.channel.knows(s.leader_id):
            if time.monotonic() - s.last_leader_contact > s.fetch_timeout_ms / 1000:
                log.info("raft_observer_lost_leader", epoch=s.epoch, leader=s.leader_id)
                await s.transition(Role.UNATTACHED, s.epoch)
            else:
                await self.replication.fetch_from_leader()
        elif not await self.membership.find_leader():
            await s.wait_state_change(0.2)

    # ---- state, as the controller reads it
    @property
    def role(self) -> Role:
        return self.state.role

    @property
    def epoch(self) -> int:
        return self.state.epoch

    @property
    def leader_id(self) -> int:
        return self.state.leader_id

    @property
    def is_leader(self) -> bool:
        return self.state.is_leader

    @property
    def high_watermark(self) -> int:
        return self.state.high_watermark

    @high_watermark.setter
    def high_watermark(self, offset: int) -> None:
        """Set at start-up only: what the snapshot (or a single voter's whole log) holds is committed."""
        self.state.high_watermark = offset

    # ---- the leader's writes (LogReplication)
    async def append(self, records: list, epoch: int) -> tuple[int, int]:
        """Append in `epoch` as its leader. Returns (base offset, bytes). OSError is fatal."""
        return await self.replication.append(records, epoch)

    async def append_leader_change(self, epoch: int) -> tuple[int, int]:
        """As the new leader of `epoch`: the LEADER_CHANGE control batch that starts it."""
        return await self.replication.append_leader_change(epoch)

    async def wait_committed(self, end_offset: int, epoch: int) -> None:
        """Wait until the high watermark reaches `end_offset` while leading `epoch`."""
        await self.state.wait_committed(end_offset, epoch)

    # ---- the request handlers' calls
    async def handle_vote(self, candidate_id: int, candidate_epoch: int, last_epoch: int,
                          last_offset: int, pre_vote: bool = False) -> tuple[int, bool]:
        """Returns (error code, vote granted); the caller reports our epoch and leader."""
        return await self.elections.handle_vote(candidate_id, candidate_epoch, last_epoch, last_offset, pre_vote)

    async def handle_begin_epoch(self, leader_id: int, epoch: int) -> int:
        return await self.elections.handle_begin_epoch(leader_id, epoch)

    async def handle_end_epoch(self, leader_id: int, epoch: int, successors: list[int]) -> int:
        return await self.elections.handle_end_epoch(leader_id, epoch, successors)

    async def handle_fetch(self, replica_id: int, fetch_offset: int, last_fetched_epoch: int,
                           current_leader_epoch: int, max_wait_ms: int, max_bytes: int) -> FetchResult:
        return await self.fetch_server.handle_fetch(replica_id, fetch_offset, last_fetched_epoch,
                                                    current_leader_epoch, max_wait_ms, max_bytes)

    def snapshot_error(self, current_leader_epoch: int) -> int:
        """FetchSnapshot is served by the leader only (snapshot ids come from its Fetch answers)."""
        return self.fetch_server.snapshot_error(current_leader_epoch)

    def latest_snapshot(self) -> tuple[int, int] | None:
        """(end offset, epoch) of the snapshot a replica below the log start should load."""
        return self.fetch_server.latest_snapshot()

    def describe(self) -> QuorumView:
        """DescribeQuorum's answer: the leader's view of every replica, else who leads."""
        s = self.state
        if s.role != Role.LEADER or s.leader_state is None:
            return QuorumView(Errors.NOT_LEADER_OR_FOLLOWER, s.leader_id, s.epoch, s.high_watermark)
        return s.leader_state.view(list(self.voters), self.log.end_offset, s.high_watermark)

    def voter_set(self) -> dict[int, Voter]:
        """The voters in force, with directory ids and endpoints (KIP-853)."""
        return self.membership.latest()
