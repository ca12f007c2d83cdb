"""This voter's place in the quorum, shared by its elections, its log replication and the Fetch
answers it serves (Kafka's QuorumState): role, epoch, leader, vote and high watermark, the
election and leader-contact timers, and the events that wake whoever waits on them.

The roles: unattached (an epoch, no leader known), voted (unattached with a vote cast),
prospective (asking for pre-votes before it stands, KIP-996), candidate, leader, follower,
resigned. Every change of epoch, vote or leader is written to the
quorum-state file before it is acted on or answered (KIP-595), and the controller above is told
of a new epoch or leader at once through `RaftListener`.
"""

from __future__ import annotations

import asyncio
import enum
import time
from typing import Protocol
from uuid import UUID

import structlog

from controller.raft import rules
from controller.raft.leader_state import LeaderState
from controller.raft.quorum_state import ElectionState, QuorumStateFile

log = structlog.get_logger(__name__)


class Role(enum.Enum):
    UNATTACHED = "Unattached"
    VOTED = "Voted"
    PROSPECTIVE = "Prospective"
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


class RaftState:
    def __init__(
        self,
        node_id: int,
        voters: dict[int, tuple[str, int]],
        state_file: QuorumStateFile,
        listener: RaftListener,
        *,
        election_timeout_ms: int,
        fetch_timeout_ms: int,
    ) -> None:
        self.node_id = node_id
        self.voters = voters  # voter id -> (host, port)
        self.state_file = state_file
        self.listener = listener
        self.election_timeout_ms = election_timeout_ms
        self.fetch_timeout_ms = fetch_timeout_ms
        self.cluster_id = ""
        self.role = Role.UNATTACHED
        self.epoch = 0
        self.leader_id = -1
        self.voted_id = -1
        self.high_watermark = 0
        self.leader_state: LeaderState | None = None  # while leading
        self.granting_voters: set[int] = set()  # who voted for us, for the LEADER_CHANGE record
        self.changed = asyncio.Event()  # log appended, high watermark or state moved
        self.state_changed = asyncio.Event()
        self.closed = False
        self.election_at = 0.0  # monotonic: when an unattached voter starts an election
        self.last_leader_contact = 0.0
        # a follower answered by its leader since it began following (Kafka's
        # FollowerState.hasFetchedFromLeader): such a follower refuses pre-votes (KIP-996)
        self.has_fetched = False
        self._persist_lock = asyncio.Lock()
        # directory ids (KIP-853): ours, and each voter's (a dynamic quorum's; zero for a static one)
        self.directory_id = UUID(int=0)
        self.voter_directories: dict[int, UUID] = {}

    def load(self, cluster_id: str) -> ElectionState:
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
        self.election_at = time.monotonic() + rules.election_timeout(self.election_timeout_ms)
        self.last_leader_contact = time.monotonic()
        return saved

    @property
    def is_leader(self) -> bool:
        return self.role == Role.LEADER

    # ---- waking waiters
    def wake(self) -> None:
        """Everything moved: wake waiters on data and on state alike."""
        changed, state_changed = self.changed, self.state_changed
        self.changed, self.state_changed = asyncio.Event(), asyncio.Event()
        changed.set()
        state_changed.set()

    def notify_data(self) -> None:
        """The log or the high watermark moved."""
        ev, self.changed = self.changed, asyncio.Event()
        ev.set()

    async def wait_state_change(self, timeout: float) -> None:
        """Sleep up to `timeout` seconds, less if the state moves meanwhile."""
        ev = self.state_changed
        try:
            await asyncio.wait_for(ev.wait(), timeout)
        except TimeoutError:
            pass

    # ---- transitions
    async def transition(self, role: Role, epoch: int, leader_id: int = -1, voted_id: int = -1) -> None:
        """Move to a new state, persisted before the caller acts on it or answers."""
        was = (self.role, self.epoch, self.leader_id)
        self.role, self.epoch, self.leader_id, self.voted_id = role, epoch, leader_id, voted_id
        if role != Role.LEADER:
            self.leader_state = None
        if role == Role.FOLLOWER:
            self.last_leader_contact = time.monotonic()
            self.has_fetched = False
        if role in (Role.UNATTACHED, Role.VOTED):
            self.election_at = time.monotonic() + rules.election_timeout(self.election_timeout_ms)
        log.info("raft_state", role=role.value, epoch=epoch, leader=leader_id, voted=voted_id,
                 previous=was[0].value, previous_epoch=was[1])
        self.wake()
        if (was[1], was[2]) != (epoch, leader_id):
            self.listener.leader_changed(epoch, leader_id)
        await self._persist()

    async def _persist(self) -> None:
        async with self._persist_lock:
            state = ElectionState(self.epoch, self.leader_id, self.voted_id)
            await asyncio.get_running_loop().run_in_executor(None, self.state_file.write, state)

    async def step_down(self, epoch: int, leader_id: int = -1) -> None:
        """A higher epoch (or a leader of ours) was seen: follow it, or wait unattached."""
        if leader_id >= 0 and leader_id != self.node_id:
            await self.transition(Role.FOLLOWER, epoch, leader_id, self.voted_id if epoch == self.epoch else -1)
        else:
            await self.transition(Role.UNATTACHED, epoch)

    def leader_heard(self) -> None:
        """A follower's fetch was answered by its leader."""
        self.last_leader_contact = time.monotonic()
        self.has_fetched = True

    def hears_live_leader(self) -> bool:
        """A follower answered by its leader within the fetch timeout: it refuses pre-votes."""
        return (self.role == Role.FOLLOWER and self.has_fetched
                and time.monotonic() - self.last_leader_contact <= self.fetch_timeout_ms / 1000)

    async def become_prospective(self) -> None:
        """Ask the other voters for pre-votes in our current epoch before standing (KIP-996): the
        epoch, leader and vote are kept, so a voter cut off from the quorum changes nothing."""
        await self.transition(Role.PROSPECTIVE, self.epoch, self.leader_id, self.voted_id)

    async def become_candidate(self) -> None:
        """Stand in the next epoch, voting for ourselves."""
        await self.transition(Role.CANDIDATE, self.epoch + 1, -1, self.node_id)

    async def wait_committed(self, end_offset: int, epoch: int) -> None:
        """As leader of `epoch`: wait until the high watermark reaches `end_offset`."""
        while self.high_watermark < end_offset:
            if self.role != Role.LEADER or self.epoch != epoch or self.closed:
                raise NotLeaderError(f"lost the leadership of epoch {epoch} before offset {end_offset} committed")
            await self.changed.wait()

    # ---- the leader's high watermark
    def advance_high_watermark(self, log_end: int) -> None:
        """As leader: move the high watermark to what a majority of voters hold (Raft §5.4.2 via
        `rules.high_watermark`), waking whoever waits on commits or committed records."""
        if self.leader_state is None:
            return
        hw = self.leader_state.high_watermark(log_end, self.high_watermark)
        if hw != self.high_watermark:
            self.high_watermark = hw
            self.notify_data()
