"""Raft's decisions as pure functions (no clock, no I/O), as KafkaRaftClient and LeaderState make
them: who gets a vote, where the high watermark is, how long to wait before an election."""

from __future__ import annotations

import random
from collections.abc import Iterable


def majority(voters: int) -> int:
    return voters // 2 + 1


def log_at_least_as_long(cand_last_epoch: int, cand_end: int, our_last_epoch: int, our_end: int) -> bool:
    """Raft's election restriction: a candidate whose log lacks a record we have cannot have
    every committed record, so it gets no vote (epoch of the last record first, then length)."""
    return (cand_last_epoch, cand_end) >= (our_last_epoch, our_end)


def high_watermark(ends: Iterable[int], voters: int, epoch_start: int, current: int) -> int:
    """The leader's high watermark: the largest end offset a majority of voters have reached
    (`ends` holds each voter's known log end, the leader's own included, -1 if unknown).
    It moves only once a record of the leader's own epoch is committed (it passes
    `epoch_start`), since only then are all earlier records known committed (Raft §5.4.2),
    and it never moves back."""
    ranked = sorted(ends, reverse=True)
    need = majority(voters)
    if len(ranked) < need:
        return current
    candidate = ranked[need - 1]
    return candidate if candidate > epoch_start and candidate > current else current


def election_timeout(base_ms: int, rng: random.Random | None = None) -> float:
    """Seconds: a random time in [base, 2 * base), so voters rarely time out together."""
    r = (rng or random).random()
    return (base_ms + r * base_ms) / 1000


def successor_delay(rank: int, base_ms: int, rng: random.Random | None = None) -> float:
    """Seconds a follower waits after a resigning leader's EndQuorumEpoch: preferred successors
    first (rank 0), each next one later, with jitter (Kafka's strictExponentialElectionBackoffMs
    in spirit)."""
    r = (rng or random).random()
    return (rank * base_ms / 4 + r * base_ms / 4) / 1000


def grants_pre_vote(leads: bool, hears_live_leader: bool, log_up_to_date: bool) -> bool:
    """A pre-vote (KIP-996) is granted by any voter but the leader and a follower whose leader
    answered it within the fetch timeout (so a voter that was cut off cannot unseat a live
    leader when it comes back), and only to a replica whose log is at least as long as ours.
    Granting changes nothing: no vote is recorded, no epoch moves."""
    return not leads and not hears_live_leader and log_up_to_date


def pre_vote_epoch_valid(pre_vote: bool, replica_epoch: int, last_epoch: int) -> bool:
    """A candidate has bumped its epoch, so its log holds nothing of that epoch; a prospective
    voter has not, so its last record may be of the epoch it sends (KafkaRaftClient's check)."""
    return last_epoch <= replica_epoch if pre_vote else last_epoch < replica_epoch
