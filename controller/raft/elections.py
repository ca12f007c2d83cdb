"""Elections of the metadata quorum (KIP-595), as KafkaRaftClient runs them: randomized election
timeouts, pre-vote rounds before a candidacy (KIP-996), candidacy and Vote rounds, the new leader's BeginQuorumEpoch, a resigning leader's
EndQuorumEpoch with its preferred successors, check-quorum on the leader and the fetch timeout on
a follower; and the answers to the other voters' Vote, BeginQuorumEpoch and EndQuorumEpoch.

The decisions themselves are `rules`' pure functions; every transition goes through `RaftState`,
which persists it before it is acted on.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import Any

import structlog

from controller.metadata_log import MetadataLog
from controller.raft import rules
from controller.raft.leader_state import LeaderState
from controller.raft.state import RaftState, Role
from controller.raft.voter_channel import VoterChannel
from metadata.image import METADATA_TOPIC
from metadata.voters import ZERO_UUID
from protocol.errors import Errors
from protocol.generated.begin_quorum_epoch import BeginQuorumEpochRequest
from protocol.generated.end_quorum_epoch import EndQuorumEpochRequest
from protocol.generated.vote import VoteRequest

log = structlog.get_logger(__name__)


class Elections:
    def __init__(self, state: RaftState, log: MetadataLog, channel: VoterChannel) -> None:
        self.state = state
        self.log = log
        self.channel = channel
        self.background: set[asyncio.Task] = set()  # the leader's announcements, cancelled on close

    # ---- the driving task's steps, one per role
    async def poll_unattached(self) -> None:
        """Unattached, voted or resigned: once the election timeout passes, ask for pre-votes
        (KIP-996); a single voter stands at once."""
        s = self.state
        if len(s.voters) == 1:
            await s.become_candidate()
            return
        delay = s.election_at - time.monotonic()
        if delay <= 0:
            await s.become_prospective()
            return
        await s.wait_state_change(delay)

    async def poll_prospective(self) -> None:
        """One pre-vote round in the current epoch (KIP-996): a majority of grants makes us a
        candidate (only then does the epoch move); refused or unanswered, we go back to
        following our leader (a fresh fetch timeout) or to waiting unattached."""
        s = self.state
        epoch, leader, voted = s.epoch, s.leader_id, s.voted_id
        deadline = time.monotonic() + rules.election_timeout(s.election_timeout_ms)
        won = await self._ask_votes(epoch, Role.PROSPECTIVE, deadline)
        if won is None:
            return  # the state moved meanwhile
        if won:
            log.info("raft_pre_vote_won", epoch=epoch)
            await s.become_candidate()
            return
        log.info("raft_pre_vote_lost", epoch=epoch, leader=leader)
        if leader >= 0 and leader != s.node_id:
            await s.transition(Role.FOLLOWER, epoch, leader, voted)
        else:
            await s.transition(Role.VOTED if voted >= 0 else Role.UNATTACHED, epoch, -1, voted)

    async def poll_candidate(self) -> None:
        """One election round in the current (candidate) epoch; lost or split, wait out the
        randomized timeout and ask for pre-votes again (as Kafka's candidate does)."""
        s = self.state
        epoch = s.epoch
        deadline = time.monotonic() + rules.election_timeout(s.election_timeout_ms)
        won = await self._ask_votes(epoch, Role.CANDIDATE, deadline)
        if won is None:
            return
        if won:
            await self._become_leader(epoch)
            return
        rest = deadline - time.monotonic()
        if rest > 0:
            await s.wait_state_change(rest)
        if s.role == Role.CANDIDATE and s.epoch == epoch:
            log.info("raft_election_lost", epoch=epoch)
            if len(s.voters) == 1:
                await s.become_candidate()
            else:
                await s.become_prospective()

    async def _ask_votes(self, epoch: int, role: Role, deadline: float) -> bool | None:
        """Ask every other voter for its vote (a candidate) or pre-vote (a prospective voter) in
        `epoch`. True once a majority granted, False once a majority refused or at `deadline`,
        None if the state moved meanwhile (a higher epoch or a leader was seen)."""
        s = self.state
        pre_vote = role == Role.PROSPECTIVE
        granted: set[int] = {s.node_id}
        refused: set[int] = set()
        need = rules.majority(len(s.voters))
        if len(granted) >= need:
            s.granting_voters = granted
            return True

        def request(voter: int) -> VoteRequest:
            return VoteRequest(cluster_id=s.cluster_id, voter_id=voter, topics=[VoteRequest.TopicData(
                topic_name=METADATA_TOPIC, partitions=[VoteRequest.PartitionData(
                    partition_index=0, replica_epoch=epoch, replica_id=s.node_id,
                    replica_directory_id=s.directory_id, voter_directory_id=s.voter_directories.get(voter, ZERO_UUID),
                    last_offset_epoch=self.log.last_epoch, last_offset=self.log.end_offset,
                    pre_vote=pre_vote)])])

        def current() -> bool:
            return s.role == role and s.epoch == epoch

        loop = asyncio.get_running_loop()
        pending = {loop.create_task(self.channel.ask(v, request(v), s.election_timeout_ms / 1000)): v
                   for v in s.voters if v != s.node_id}
        try:
            while pending and current():
                changed = loop.create_task(s.state_changed.wait())
                done, _ = await asyncio.wait([*pending, changed], timeout=max(deadline - time.monotonic(), 0),
                                             return_when=asyncio.FIRST_COMPLETED)
                changed.cancel()
                if not done:
                    break
                for t in done:
                    if t is changed:
                        continue
                    voter = pending.pop(t)
                    resp: Any = t.result()  # a VoteResponse, or None
                    p = resp.topics[0].partitions[0] if resp is not None and resp.topics \
                        and resp.topics[0].partitions else None
                    if p is None or not current():
                        continue
                    if p.leader_epoch > epoch:
                        await s.step_down(p.leader_epoch, p.leader_id)
                        return None
                    if p.leader_epoch == epoch and p.leader_id >= 0 and s.leader_id < 0 \
                            and p.leader_id != s.node_id:
                        # a leader of our epoch we did not know of: follow it (one that still
                        # names the leader we lost only counts as a refusal, as in Kafka)
                        await s.transition(Role.FOLLOWER, epoch, p.leader_id, s.voted_id)
                        return None
                    if p.error_code or resp.error_code or p.leader_epoch != epoch:
                        continue
                    (granted if p.vote_granted else refused).add(voter)
                if not current():
                    return None
                if len(granted) >= need:
                    s.granting_voters = granted
                    return True
                if len(refused) > len(s.voters) - need:
                    break
        finally:
            for t in pending:
                t.cancel()
        if not current():
            return None
        if not pre_vote:
            log.info("raft_votes", epoch=epoch, granted=sorted(granted), refused=sorted(refused))
        return False

    async def poll_leader(self) -> None:
        """Check-quorum: a leader that has not heard from a majority within the fetch timeout
        resigns (KIP-595's rule, so a partitioned leader stops taking writes it cannot commit)."""
        s = self.state
        period = s.fetch_timeout_ms / 1000
        await s.wait_state_change(period / 4)
        leader = s.leader_state
        if s.role != Role.LEADER or leader is None:
            return
        if not leader.heard_from_majority(time.monotonic(), period * 1.5):
            log.warning("raft_leader_resigns", epoch=s.epoch, reason="no fetch from a majority",
                        voters=len(s.voters))
            await s.transition(Role.RESIGNED, s.epoch, -1, s.node_id)
            s.election_at = time.monotonic() + rules.election_timeout(s.election_timeout_ms)

    async def check_fetch_timeout(self) -> bool:
        """A follower that has not heard from its leader within the fetch timeout asks for
        pre-votes (KIP-996), then stands for the next epoch if a majority would vote for it
        (KIP-595). True if it stopped following, so the caller does not fetch."""
        s = self.state
        if time.monotonic() - s.last_leader_contact <= s.fetch_timeout_ms / 1000:
            return False
        log.warning("raft_leader_lost", epoch=s.epoch, leader=s.leader_id, reason="fetch timeout")
        await s.become_prospective()
        return True

    # ---- leading
    async def _become_leader(self, epoch: int) -> None:
        s = self.state
        s.leader_state = LeaderState(s.node_id, list(s.voters), epoch, self.log.end_offset, time.monotonic())
        await s.transition(Role.LEADER, epoch, s.node_id, s.node_id)
        log.info("raft_leader_elected", epoch=epoch, log_end=self.log.end_offset, high_watermark=s.high_watermark)
        self._spawn(self._begin_quorum_epoch(epoch))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        t = asyncio.get_running_loop().create_task(coro)
        self.background.add(t)
        t.add_done_callback(self.background.discard)

    async def _begin_quorum_epoch(self, epoch: int) -> None:
        """Tell every voter who leads this epoch until each has acknowledged (or fetched)."""
        s = self.state
        left = {v for v in s.voters if v != s.node_id}
        req = BeginQuorumEpochRequest(cluster_id=s.cluster_id, topics=[BeginQuorumEpochRequest.TopicData(
            topic_name=METADATA_TOPIC, partitions=[BeginQuorumEpochRequest.PartitionData(
                partition_index=0, leader_id=s.node_id, leader_epoch=epoch)])])
        while left and s.role == Role.LEADER and s.epoch == epoch:
            got = await asyncio.gather(*(self.channel.ask(v, req, s.election_timeout_ms / 1000) for v in left))
            for v, resp in zip(list(left), got, strict=True):
                if resp is None:
                    continue
                p = resp.topics[0].partitions[0] if resp.topics and resp.topics[0].partitions else None
                if p is not None and p.leader_epoch > epoch:
                    await s.step_down(p.leader_epoch, p.leader_id)
                    return
                if p is not None and not p.error_code:
                    left.discard(v)
            leader = s.leader_state
            left = {v for v in left if leader is not None and not leader.fetched(v)}
            if left:
                await asyncio.sleep(min(s.election_timeout_ms / 4000, 0.2))

    async def resign(self) -> None:
        """A leader that stops tells the other voters (EndQuorumEpoch), most caught-up first, so
        one of them takes over at once instead of after an election timeout."""
        s = self.state
        leader = s.leader_state
        others = leader.by_progress() if leader is not None else [v for v in s.voters if v != s.node_id]
        req = EndQuorumEpochRequest(cluster_id=s.cluster_id, topics=[EndQuorumEpochRequest.TopicData(
            topic_name=METADATA_TOPIC, partitions=[EndQuorumEpochRequest.PartitionData(
                partition_index=0, leader_id=s.node_id, leader_epoch=s.epoch, preferred_successors=others,
                preferred_candidates=[EndQuorumEpochRequest.ReplicaInfo(candidate_id=v) for v in others])])])
        await asyncio.gather(*(self.channel.ask(v, req, 0.5) for v in others))

    # ---- the other voters' requests
    async def handle_vote(self, candidate_id: int, candidate_epoch: int, last_epoch: int,
                          last_offset: int, pre_vote: bool = False) -> tuple[int, bool]:
        """Returns (error code, vote granted); the caller reports our epoch and leader. A
        pre-vote (KIP-996) is answered without recording a vote; like a vote, a higher epoch in
        it is adopted (it is the sender's real epoch: a prospective voter does not bump)."""
        s = self.state
        if candidate_id not in s.voters:
            return Errors.INCONSISTENT_VOTER_SET, False
        if not rules.pre_vote_epoch_valid(pre_vote, candidate_epoch, last_epoch):
            return Errors.INVALID_REQUEST, False
        if candidate_epoch < s.epoch:
            return 0, False
        if candidate_epoch > s.epoch:
            await s.step_down(candidate_epoch)
        log_ok = rules.log_at_least_as_long(last_epoch, last_offset, self.log.last_epoch, self.log.end_offset)
        if pre_vote:
            granted = rules.grants_pre_vote(s.role in (Role.LEADER, Role.RESIGNED), s.hears_live_leader(), log_ok)
            log.info("raft_pre_vote_answered", candidate=candidate_id, epoch=candidate_epoch, granted=granted,
                     role=s.role.value, log_up_to_date=log_ok)
            return 0, granted
        if s.role in (Role.LEADER, Role.CANDIDATE, Role.FOLLOWER, Role.RESIGNED):
            return 0, s.voted_id == candidate_id
        if s.voted_id >= 0:
            return 0, s.voted_id == candidate_id
        if s.leader_id >= 0:
            return 0, False  # a prospective voter that knows this epoch's leader
        if not log_ok:
            log.info("raft_vote_refused", candidate=candidate_id, epoch=candidate_epoch, reason="log behind ours",
                     candidate_last_epoch=last_epoch, candidate_end=last_offset,
                     our_last_epoch=self.log.last_epoch, our_end=self.log.end_offset)
            return 0, False
        await s.transition(Role.VOTED, s.epoch, -1, candidate_id)
        return 0, True

    async def handle_begin_epoch(self, leader_id: int, epoch: int) -> int:
        s = self.state
        if leader_id not in s.voters:
            return Errors.INCONSISTENT_VOTER_SET
        if epoch < s.epoch:
            return Errors.FENCED_LEADER_EPOCH
        if epoch == s.epoch and s.role == Role.LEADER and leader_id != s.node_id:
            log.critical("raft_two_leaders", epoch=epoch, other=leader_id)
            return Errors.INVALID_REQUEST
        if (s.role, s.epoch, s.leader_id) != (Role.FOLLOWER, epoch, leader_id) and leader_id != s.node_id:
            await s.transition(Role.FOLLOWER, epoch, leader_id, s.voted_id if epoch == s.epoch else -1)
        return 0

    async def handle_end_epoch(self, leader_id: int, epoch: int, successors: list[int]) -> int:
        s = self.state
        if epoch < s.epoch:
            return Errors.FENCED_LEADER_EPOCH
        if leader_id not in s.voters and leader_id != s.leader_id:
            # as Kafka's validateVoterOnlyRequest: only a voter's resignation may start an
            # election here (a stray frame naming another node must move nothing); our own
            # leader may have just removed itself from the voters (KIP-853)
            return Errors.INCONSISTENT_VOTER_SET
        if epoch > s.epoch or (s.role == Role.FOLLOWER and s.leader_id == leader_id):
            voted = s.voted_id if epoch == s.epoch else -1
            await s.transition(Role.VOTED if voted >= 0 else Role.UNATTACHED, epoch, -1, voted)
            rank = successors.index(s.node_id) if s.node_id in successors else len(successors)
            s.election_at = time.monotonic() + rules.successor_delay(rank, s.election_timeout_ms)
            s.wake()
        return 0
