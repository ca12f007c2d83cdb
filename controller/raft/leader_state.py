"""What a leader knows of the other replicas in its epoch (Kafka's LeaderState): each voter's and
observer's fetch offset and times, from which come the high watermark, the check-quorum test and
DescribeQuorum's answer. Plain state, no I/O; the clock is passed in."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from controller.raft import rules


@dataclass
class ReplicaProgress:
    """What the leader knows of one replica (voter or observer)."""

    end_offset: int = -1
    last_fetch_ms: int = -1
    last_caught_up_ms: int = -1
    last_fetch_mono: float = 0.0


@dataclass
class QuorumView:
    """DescribeQuorum's answer, as this voter sees it."""

    error: int
    leader_id: int
    epoch: int
    high_watermark: int
    voters: list[tuple[int, ReplicaProgress]] = field(default_factory=list)
    observers: list[tuple[int, ReplicaProgress]] = field(default_factory=list)


def now_ms() -> int:
    return int(time.time() * 1000)


class LeaderState:
    def __init__(self, node_id: int, voters: list[int], epoch: int, epoch_start: int, now_mono: float) -> None:
        self.node_id = node_id
        self.voter_count = len(voters)
        self.leader_votes = node_id in voters  # a leader removing itself (KIP-853) leads, uncounted
        self.epoch = epoch
        self.epoch_start = epoch_start  # the log end when this leader took over: its first offset
        # other voters start as just heard from: a new leader gets a full period to be fetched from
        self.progress = {v: ReplicaProgress(last_fetch_mono=now_mono) for v in voters if v != node_id}
        self.observers: dict[int, ReplicaProgress] = {}

    def set_voters(self, voters: list[int], now_mono: float) -> None:
        """The voter set changed (KIP-853): an added voter brings its progress as an observer, a
        removed one keeps its progress as an observer; majorities count the new set at once."""
        for v in voters:
            if v != self.node_id and v not in self.progress:
                p = self.observers.pop(v, None) or ReplicaProgress(last_fetch_mono=now_mono)
                self.progress[v] = p
        for v in [v for v in self.progress if v not in voters]:
            self.observers[v] = self.progress.pop(v)
        self.voter_count = len(voters)
        self.leader_votes = self.node_id in voters

    def is_voter(self, replica_id: int) -> bool:
        return replica_id in self.progress

    def record_fetch(self, replica_id: int, offset: int, log_end: int) -> None:
        table = self.progress if replica_id in self.progress else self.observers
        p = table.setdefault(replica_id, ReplicaProgress())
        p.end_offset = offset
        p.last_fetch_ms = now_ms()
        p.last_fetch_mono = time.monotonic()
        if offset >= log_end:
            p.last_caught_up_ms = p.last_fetch_ms

    def high_watermark(self, log_end: int, current: int) -> int:
        ends = [log_end] * self.leader_votes + [p.end_offset for p in self.progress.values()]
        return rules.high_watermark(ends, self.voter_count, self.epoch_start, current)

    def heard_from_majority(self, now_mono: float, within: float) -> bool:
        heard = int(self.leader_votes) + sum(1 for p in self.progress.values() if now_mono - p.last_fetch_mono <= within)
        return heard >= rules.majority(self.voter_count)

    def fetched(self, voter: int) -> bool:
        return self.progress.get(voter, ReplicaProgress()).end_offset >= 0

    def by_progress(self) -> list[int]:
        """The other voters, most caught-up first (preferred successors)."""
        return sorted(self.progress, key=lambda v: -self.progress[v].end_offset)

    def view(self, voters: list[int], log_end: int, high_watermark: int) -> QuorumView:
        now = now_ms()
        me = ReplicaProgress(log_end, now, now)
        listed = [(v, me if v == self.node_id else self.progress.get(v, ReplicaProgress())) for v in sorted(voters)]
        return QuorumView(0, self.node_id, self.epoch, high_watermark, listed, sorted(self.observers.items()))
