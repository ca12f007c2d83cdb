"""Changes to the metadata quorum's voters (KIP-853), as Kafka's AddVoterHandler,
RemoveVoterHandler and UpdateVoterHandler, and the observer's search for the leader.

The voter set in force is the newest in the log (`metadata.voters.VoterHistory`): a follower takes a
KRAFT_VOTERS record as it appends it and drops it again if it truncates it away; the leader
writes one for each change, one change at a time (the previous one committed first), and counts
majorities by the new set from the moment it is written. A controller outside the set is an
observer: it finds the leader through `controller.quorum.bootstrap.servers` (or the voters it
knows), follows the log and never stands for election; once added it is a voter like any other.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any
from uuid import UUID

import structlog

from controller.metadata_log import MetadataLog
from controller.raft.state import NotLeaderError, RaftState, Role
from controller.raft.voter_channel import VoterChannel
from controller.snapshots import SnapshotStore
from metadata.voters import (
    ZERO_UUID,
    Voter,
    VoterHistory,
    VoterSet,
    addresses,
    describe_quorum_request,
    node_addresses,
    voter_sets_in,
    voters_record,
)
from protocol.errors import Errors

log = structlog.get_logger(__name__)

CAUGHT_UP_MS = 5000  # an observer fetched at the leader's log end this recently may be added (as Kafka's check)
FIND_LEADER_TIMEOUT_S = 1.0


class MembershipError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class Membership:
    def __init__(self, state: RaftState, log: MetadataLog, snapshots: SnapshotStore, channel: VoterChannel,
                 history: VoterHistory, voters: dict[int, tuple[str, int]],
                 bootstrap_servers: tuple[tuple[str, int], ...] = ()) -> None:
        """`voters`: the id -> address map the state and the channel share, kept equal to the
        newest set's addresses."""
        self.state = state
        self.log = log
        self.snapshots = snapshots
        self.channel = channel
        self.history = history
        self.voters = voters
        self.bootstrap_servers = bootstrap_servers
        self._next_bootstrap = 0

    @property
    def dynamic(self) -> bool:
        return self.history.dynamic

    def is_voter(self) -> bool:
        return self.state.node_id in self.voters

    def latest(self) -> VoterSet:
        return self.history.latest()

    # ---- keeping the set in force
    def apply(self) -> None:
        latest = self.history.latest()
        now = addresses(latest)
        if now != self.voters:
            log.info("raft_voters_changed", voters=",".join(map(str, sorted(now))),
                     previous=",".join(map(str, sorted(self.voters))), offset=self.history.latest_offset())
            self.voters.clear()
            self.voters.update(now)
            self.channel.learn(now)
        self.state.voter_directories = {vid: v.directory_id for vid, v in latest.items()}
        leader = self.state.leader_state
        if leader is not None:
            leader.set_voters(sorted(latest), time.monotonic())
            self.state.advance_high_watermark(self.log.end_offset)
        self.state.wake()

    def load(self, snapshot_end: int | None) -> None:
        """Blocking, at start: the set of the latest snapshot, then those in the log after it."""
        if not self.dynamic:
            return
        if snapshot_end is not None:
            sets = voter_sets_in(self.snapshots.path(snapshot_end).read_bytes())
            if sets:
                self.history.reset(snapshot_end, sets[-1][1])
        for data in self.log.read_batches(self.log.start_offset):
            self.history.add_all(voter_sets_in(data))
        self.apply()

    def appended(self, data: bytes) -> None:
        """A follower appended the leader's batches."""
        if self.dynamic:
            found = voter_sets_in(data)
            if found:
                self.history.add_all(found)
                self.apply()

    def truncated(self, end_offset: int) -> None:
        if self.dynamic and self.history.latest_offset() >= end_offset:
            self.history.truncate_from(end_offset)
            self.apply()

    def snapshot_loaded(self, end_offset: int, data: bytes) -> None:
        if self.dynamic:
            sets = voter_sets_in(data)
            if sets:
                self.history.reset(end_offset, sets[-1][1])
                self.apply()

    # ---- the leader's writes
    async def append(self, voters: VoterSet, epoch: int) -> int:
        """Write `voters` as the new set in `epoch`; it is in force at once. Returns the offset
        after it (the set is committed once the high watermark passes it)."""
        s = self.state
        if s.role != Role.LEADER or s.epoch != epoch:
            raise MembershipError(Errors.NOT_LEADER_OR_FOLLOWER, "this controller is not the quorum leader")
        base, _ = await self.log.append_control(voters_record(voters, int(time.time() * 1000)), epoch)
        self.history.add(base, voters)
        self.apply()
        s.notify_data()
        return base + 1

    def needs_first_record(self) -> bool:
        """A new leader whose set came only from the bootstrap snapshot writes it into the log,
        so replicas that start from an empty log (observers) learn it (KafkaRaftClient does so)."""
        return self.dynamic and self.history.latest_offset() < 0 and bool(self.history.latest())

    async def _commit(self, end: int, epoch: int, timeout_s: float) -> None:
        try:
            await asyncio.wait_for(self.state.wait_committed(end, epoch), timeout_s)
        except NotLeaderError:
            raise MembershipError(Errors.NOT_LEADER_OR_FOLLOWER,
                                  "lost the quorum leadership before the change committed") from None
        except TimeoutError:
            raise MembershipError(Errors.REQUEST_TIMED_OUT, "the new voter set did not commit in time") from None

    def _check_leader(self) -> int:
        s = self.state
        if not self.dynamic:
            raise MembershipError(Errors.UNSUPPORTED_VERSION, "the quorum's voters are static (kraft.version 0, "
                                  "controller.quorum.voters): format with --standalone or --initial-controllers "
                                  "and controller.quorum.bootstrap.servers to change them")
        if s.role != Role.LEADER or s.leader_state is None:
            raise MembershipError(Errors.NOT_LEADER_OR_FOLLOWER, "this controller is not the quorum leader")
        if self.history.latest_offset() >= s.high_watermark:
            raise MembershipError(Errors.REQUEST_TIMED_OUT, "the previous voter change has not committed yet")
        return s.epoch

    async def add_voter(self, voter: Voter, timeout_s: float, ack_when_committed: bool = True) -> None:
        epoch = self._check_leader()
        current = self.history.latest()
        if voter.id in current:
            raise MembershipError(Errors.DUPLICATE_VOTER, f"node {voter.id} is already a voter")
        if not voter.endpoints:
            raise MembershipError(Errors.INVALID_REQUEST, "the new voter names no listener")
        leader = self.state.leader_state
        assert leader is not None
        p = leader.observers.get(voter.id)
        now_ms = int(time.time() * 1000)
        if p is None or p.last_caught_up_ms < 0 or now_ms - p.last_fetch_ms > CAUGHT_UP_MS \
                or p.end_offset < self.state.high_watermark:
            raise MembershipError(Errors.REQUEST_TIMED_OUT, f"node {voter.id} is not a caught-up observer of the "
                                  "metadata log: start it with controller.quorum.bootstrap.servers first")
        end = await self.append({**current, voter.id: voter}, epoch)
        log.info("raft_voter_added", voter=voter.id, directory_id=str(voter.directory_id), offset=end - 1)
        if ack_when_committed:
            await self._commit(end, epoch, timeout_s)

    async def remove_voter(self, voter_id: int, directory_id: UUID, timeout_s: float) -> None:
        epoch = self._check_leader()
        current = self.history.latest()
        found = current.get(voter_id)
        if found is None or (directory_id != ZERO_UUID and found.directory_id != directory_id):
            raise MembershipError(Errors.VOTER_NOT_FOUND, f"node {voter_id} with directory id {directory_id} is not "
                                  "a voter")
        if len(current) == 1:
            raise MembershipError(Errors.INVALID_REQUEST, "cannot remove the only voter")
        end = await self.append({k: v for k, v in current.items() if k != voter_id}, epoch)
        log.info("raft_voter_removed", voter=voter_id, offset=end - 1)
        await self._commit(end, epoch, timeout_s)

    async def update_voter(self, voter: Voter) -> None:
        epoch = self._check_leader()
        current = self.history.latest()
        found = current.get(voter.id)
        if found is None or found.directory_id != voter.directory_id:
            raise MembershipError(Errors.VOTER_NOT_FOUND, f"node {voter.id} is not a voter with that directory id")
        if found.endpoints != voter.endpoints and voter.endpoints:
            await self.append({**current, voter.id: voter}, epoch)
            log.info("raft_voter_updated", voter=voter.id, endpoints=str(voter.endpoints))

    def removal_committed(self) -> bool:
        """A leader whose own removal has committed: it must stop leading (KIP-853)."""
        s = self.state
        if s.role == Role.LEADER and not self.is_voter() and self.history.latest_offset() < s.high_watermark:
            log.info("raft_leader_removed_resigns", epoch=s.epoch)
            return True
        return False

    # ---- an observer looking for the leader
    async def find_leader(self) -> bool:
        """Ask the voters we know, then a bootstrap server, who leads; follow it if one is
        named. False if nobody answered with a leader."""
        targets: list[tuple[str, int]] = list(self.voters.values())
        if self.bootstrap_servers:
            targets.append(self.bootstrap_servers[self._next_bootstrap % len(self.bootstrap_servers)])
            self._next_bootstrap += 1
        req = describe_quorum_request()
        s = self.state
        for host, port in dict.fromkeys(targets):
            resp: Any = await self.channel.ask_address(host, port, req, FIND_LEADER_TIMEOUT_S)
            if resp is None or not resp.topics or not resp.topics[0].partitions:
                continue
            p = resp.topics[0].partitions[0]
            self.channel.learn(node_addresses(resp.nodes))
            if p.leader_id >= 0 and p.leader_id != s.node_id and p.leader_epoch >= s.epoch \
                    and self.channel.knows(p.leader_id):
                await s.transition(Role.FOLLOWER, p.leader_epoch, p.leader_id,
                                   s.voted_id if p.leader_epoch == s.epoch else -1)
                return True
        return False
