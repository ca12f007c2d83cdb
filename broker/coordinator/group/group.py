"""A classic group's state: members, generation, protocol, leader (its committed offsets are
every group type's: base.py).

Pure state, as Kafka's ClassicGroup: no I/O. The classic group manager (classic.py) drives it and
runs every timer; the group keeps their handles, so that whoever deletes or unloads it can stop
them. Pending JoinGroup / SyncGroup answers are callbacks the group invokes (at most once each)
when it has their result.

States and transitions (Kafka's):
    Empty --join--> PreparingRebalance --all joined / timeout--> CompletingRebalance
    CompletingRebalance --leader's SyncGroup stored--> Stable
    Stable / CompletingRebalance --join, leave, failure--> PreparingRebalance
    PreparingRebalance --every member gone--> Empty;  any --unload / delete--> Dead
"""

from __future__ import annotations

import asyncio
import enum
import struct
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import ClassVar

from broker.coordinator import wall_clock_ms
from broker.coordinator.group.base import OFFSET_COMMIT_LATEST_VERSION, CommittedOffset, Group, TopicPartition
from broker.coordinator.group.records import group_metadata_key
from protocol.errors import Errors

CONSUMER_PROTOCOL_TYPE = "consumer"
UNKNOWN_MEMBER_ID = ""


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


_S = GroupState
VALID_PREVIOUS_STATES = {
    _S.PREPARING_REBALANCE: {_S.STABLE, _S.COMPLETING_REBALANCE, _S.EMPTY},
    _S.COMPLETING_REBALANCE: {_S.PREPARING_REBALANCE},
    _S.STABLE: {_S.COMPLETING_REBALANCE},
    _S.EMPTY: {_S.PREPARING_REBALANCE},
    _S.DEAD: set(_S),
}


class IllegalStateError(RuntimeError):
    """A transition Kafka's state machine does not allow: a coordinator bug."""


@dataclass
class JoinResult:
    error: int
    member_id: str
    generation_id: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str = ""
    skip_assignment: bool = False
    members: list[tuple[str, str | None, bytes]] = field(default_factory=list)  # (member id, instance id, metadata)


@dataclass
class SyncResult:
    error: int
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""


JoinCallback = Callable[[JoinResult], None]
SyncCallback = Callable[[SyncResult], None]


class Member:
    def __init__(
        self,
        member_id: str,
        group_instance_id: str | None,
        client_id: str,
        client_host: str,
        rebalance_timeout_ms: int,
        session_timeout_ms: int,
        protocol_type: str,
        protocols: list[tuple[str, bytes]],
    ) -> None:
        self.member_id = member_id
        self.group_instance_id = group_instance_id
        self.client_id = client_id
        self.client_host = client_host
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.session_timeout_ms = session_timeout_ms
        self.protocol_type = protocol_type
        self.protocols = list(protocols)
        self.assignment = b""
        self.join_callback: JoinCallback | None = None
        self.sync_callback: SyncCallback | None = None
        self.is_new = False
        self.heartbeat_timer: asyncio.TimerHandle | None = None  # run by the classic group manager

    def __repr__(self) -> str:
        return f"Member({self.member_id!r}, instance={self.group_instance_id!r})"

    @property
    def awaiting_join(self) -> bool:
        return self.join_callback is not None

    @property
    def awaiting_sync(self) -> bool:
        return self.sync_callback is not None

    @property
    def is_static(self) -> bool:
        return self.group_instance_id is not None

    @property
    def protocol_names(self) -> set[str]:
        return {name for name, _ in self.protocols}

    def matches(self, protocols: Iterable[tuple[str, bytes]]) -> bool:
        return self.protocols == [(n, bytes(m)) for n, m in protocols]

    def metadata(self, protocol: str) -> bytes:
        for name, meta in self.protocols:
            if name == protocol:
                return meta
        raise IllegalStateError(f"member {self.member_id} does not support protocol {protocol}")

    def vote(self, candidates: set[str]) -> str:
        for name, _ in self.protocols:
            if name in candidates:
                return name
        raise IllegalStateError(f"member {self.member_id} supports none of {sorted(candidates)}")

    def cancel_heartbeat(self) -> None:
        if self.heartbeat_timer is not None:
            self.heartbeat_timer.cancel()
            self.heartbeat_timer = None

    def expired_on_heartbeat_timeout(self) -> bool:
        """Kafka's !hasSatisfiedHeartbeat at expiry: new members expire (they wait in JoinGroup at
        most the new-member timeout); others waiting in a JoinGroup or SyncGroup do not."""
        return self.is_new or not (self.awaiting_join or self.awaiting_sync)


@dataclass
class PositionExchange:
    """One Heartbeat's KIP-253 fields: the member's positions and the partitions it waits on in,
    the group's positions of those and the partitions others wait on out."""

    reported: list[tuple[tuple[str, int], int]]
    interested: set[tuple[str, int]]
    answer: dict[tuple[str, int], int] = field(default_factory=dict)
    wanted: set[tuple[str, int]] = field(default_factory=set)


class ClassicGroup(Group):
    type: ClassVar[str] = "classic"

    def __init__(self, group_id: str, state: GroupState = GroupState.EMPTY, clock: Callable[[], int] = wall_clock_ms):
        super().__init__(group_id, clock)
        self.state = state
        self.state_timestamp: int | None = clock()
        self.protocol_type: str | None = None
        self.protocol_name: str | None = None
        self.generation_id = 0
        self.leader_id: str | None = None
        self.members: dict[str, Member] = {}
        self.static_members: dict[str, str] = {}  # group.instance.id -> member id
        self.pending_members: set[str] = set()  # given an id by MEMBER_ID_REQUIRED, not joined yet
        self.pending_sync_members: set[str] = set()
        self.num_awaiting_join = 0
        self.supported_protocols: Counter[str] = Counter()
        self.subscribed_topics: set[str] | None = None
        self.new_member_added = False
        # KIP-253, kept in memory only: the group's delivered position of each partition some
        # member waits on, and which partitions each member waits on
        self.positions: dict[tuple[str, int], int] = {}
        self.interests: dict[str, set[tuple[str, int]]] = {}
        # the classic group manager's timers
        self.join_timer: asyncio.TimerHandle | None = None
        self.join_kind: str | None = None  # "initial" (group.initial.rebalance.delay.ms) or "delayed"
        self.sync_timer: asyncio.TimerHandle | None = None
        self.pending_timers: dict[str, asyncio.TimerHandle] = {}  # pending member id -> its expiry

    def __repr__(self) -> str:
        return f"ClassicGroup({self.group_id!r}, {self.state.value}, generation={self.generation_id}, members={len(self.members)})"

    # ---- queries
    def is_(self, state: GroupState) -> bool:
        return self.state is state

    def has(self, member_id: str) -> bool:
        return member_id in self.members

    @property
    def size(self) -> int:
        return len(self.members)

    def is_leader(self, member_id: str) -> bool:
        return self.leader_id is not None and self.leader_id == member_id

    @property
    def is_consumer_group(self) -> bool:
        return self.protocol_type == CONSUMER_PROTOCOL_TYPE

    @property
    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    @property
    def has_all_members_joined(self) -> bool:
        return len(self.members) == self.num_awaiting_join and not self.pending_members

    def not_yet_rejoined_members(self) -> list[Member]:
        return [m for m in self.members.values() if not m.awaiting_join]

    @property
    def can_rebalance(self) -> bool:
        return self.state in VALID_PREVIOUS_STATES[GroupState.PREPARING_REBALANCE]

    def current_static_member_id(self, instance_id: str) -> str | None:
        return self.static_members.get(instance_id)

    def is_static_member_fenced(self, instance_id: str | None, member_id: str) -> bool:
        if instance_id is None:
            return False
        current = self.static_members.get(instance_id)
        return current is not None and current != member_id

    # ---- transitions
    def transition_to(self, state: GroupState) -> None:
        if self.state not in VALID_PREVIOUS_STATES[state]:
            raise IllegalStateError(f"group {self.group_id} cannot go from {self.state.value} to {state.value}")
        self.state = state
        self.state_timestamp = self.clock()

    # ---- membership
    @staticmethod
    def generate_member_id(client_id: str, group_instance_id: str | None) -> str:
        prefix = group_instance_id if group_instance_id is not None else client_id
        return f"{prefix}-{uuid.uuid4()}"

    def supports_protocols(self, protocol_type: str, names: set[str]) -> bool:
        if self.state is GroupState.EMPTY:
            return bool(protocol_type) and bool(names)
        n = len(self.members)
        return self.protocol_type == protocol_type and any(self.supported_protocols[p] == n for p in names)

    def add(self, member: Member, callback: JoinCallback | None = None) -> None:
        if member.group_instance_id is not None:
            if member.group_instance_id in self.static_members:
                raise IllegalStateError(f"static member {member.group_instance_id} is already in {self.group_id}")
            self.static_members[member.group_instance_id] = member.member_id
        if not self.members:
            self.protocol_type = member.protocol_type
        if self.leader_id is None:
            self.leader_id = member.member_id
        self.members[member.member_id] = member
        self.supported_protocols.update(member.protocol_names)
        member.join_callback = callback
        if member.awaiting_join:
            self.num_awaiting_join += 1
        self.pending_members.discard(member.member_id)

    def remove(self, member_id: str) -> Member | None:
        member = self.members.pop(member_id, None)
        self.interests.pop(member_id, None)
        if member is not None:
            self.supported_protocols.subtract(member.protocol_names)
            if member.awaiting_join:
                self.num_awaiting_join -= 1
            if member.group_instance_id is not None:
                self.static_members.pop(member.group_instance_id, None)
        if self.is_leader(member_id):
            self.leader_id = next(iter(self.members), None)
        self.pending_members.discard(member_id)
        self.pending_sync_members.discard(member_id)
        return member

    def add_pending_member(self, member_id: str) -> None:
        if member_id in self.members:
            raise IllegalStateError(f"pending member {member_id} is already a member of {self.group_id}")
        self.pending_members.add(member_id)

    def update_member(
        self,
        member: Member,
        protocols: list[tuple[str, bytes]],
        rebalance_timeout_ms: int,
        session_timeout_ms: int,
        callback: JoinCallback | None,
    ) -> None:
        self.supported_protocols.subtract(member.protocol_names)
        member.protocols = [(n, bytes(m)) for n, m in protocols]
        self.supported_protocols.update(member.protocol_names)
        member.rebalance_timeout_ms = rebalance_timeout_ms
        member.session_timeout_ms = session_timeout_ms
        if callback is not None and not member.awaiting_join:
            self.num_awaiting_join += 1
        elif callback is None and member.awaiting_join:
            self.num_awaiting_join -= 1
        member.join_callback = callback

    def replace_static_member(self, instance_id: str, old_member_id: str, new_member_id: str) -> Member:
        """A static member came back with a new member id: same member, new id. A request still
        waiting under the old id is fenced."""
        member = self.members.pop(old_member_id, None)
        if member is None:
            raise IllegalStateError(f"cannot replace unknown member {old_member_id}")
        self.complete_join(member, JoinResult(Errors.FENCED_INSTANCE_ID, old_member_id))
        self.complete_sync(member, SyncResult(Errors.FENCED_INSTANCE_ID))
        member.member_id = new_member_id
        self.members[new_member_id] = member
        if self.is_leader(old_member_id):
            self.leader_id = new_member_id
        self.static_members[instance_id] = new_member_id
        if old_member_id in self.pending_sync_members:
            self.pending_sync_members.discard(old_member_id)
            self.pending_sync_members.add(new_member_id)
        return member

    def maybe_elect_new_joined_leader(self) -> bool:
        """Keep the leader if it rejoined, else make any rejoined member leader. False when there is
        no leader or no member rejoined."""
        if self.leader_id is None:
            return False
        leader = self.members.get(self.leader_id)
        if leader is not None and leader.awaiting_join:
            return True
        for mid, m in self.members.items():
            if m.awaiting_join:
                self.leader_id = mid
                return True
        return False

    def complete_join(self, member: Member, result: JoinResult) -> None:
        if member.join_callback is not None:
            callback, member.join_callback = member.join_callback, None
            self.num_awaiting_join -= 1
            callback(result)

    def complete_sync(self, member: Member, result: SyncResult) -> bool:
        if member.sync_callback is None:
            return False
        callback, member.sync_callback = member.sync_callback, None
        callback(result)
        return True

    # ---- generations
    def candidate_protocols(self) -> set[str]:
        n = len(self.members)
        return {p for p, c in self.supported_protocols.items() if c == n and n > 0}

    def select_protocol(self) -> str:
        """The protocol every member supports that most members prefer (ties: the first voted)."""
        if not self.members:
            raise IllegalStateError("cannot select a protocol for an empty group")
        candidates = self.candidate_protocols()
        votes = Counter(m.vote(candidates) for m in self.members.values())
        return votes.most_common(1)[0][0]

    def init_next_generation(self) -> None:
        self.generation_id += 1
        if self.members:
            self.protocol_name = self.select_protocol()
            self.subscribed_topics = self.compute_subscribed_topics()
            self.transition_to(GroupState.COMPLETING_REBALANCE)
        else:
            self.protocol_name = None
            self.subscribed_topics = self.compute_subscribed_topics()
            self.transition_to(GroupState.EMPTY)
        self.pending_sync_members.clear()

    def current_member_metadata(self) -> list[tuple[str, str | None, bytes]]:
        if self.state in (GroupState.DEAD, GroupState.PREPARING_REBALANCE) or self.protocol_name is None:
            raise IllegalStateError(f"no member metadata for group {self.group_id} in state {self.state.value}")
        return [(m.member_id, m.group_instance_id, m.metadata(self.protocol_name)) for m in self.members.values()]

    # ---- consumer subscriptions
    def compute_subscribed_topics(self) -> set[str] | None:
        """The topics a 'consumer' group's members subscribe to (None when unknown)."""
        if self.protocol_type != CONSUMER_PROTOCOL_TYPE:
            return None
        if not self.members:
            return set()
        if self.protocol_name is None:
            return None
        topics: set[str] = set()
        try:
            for m in self.members.values():
                topics |= parse_subscription_topics(m.metadata(self.protocol_name))
        except (ValueError, IllegalStateError):
            return None
        return topics

    def is_subscribed_to_topic(self, topic: str) -> bool:
        return True if self.subscribed_topics is None else topic in self.subscribed_topics

    # ---- KIP-253 positions
    def exchange_positions(
        self, member_id: str, positions: Iterable[tuple[tuple[str, int], int]], interested: set[tuple[str, int]]
    ) -> tuple[dict[tuple[str, int], int], set[tuple[str, int]]]:
        """Take a member's reported positions and what it waits on; answer the group's position
        of each partition it waits on (the higher of reported and committed; -1 unknown) and the
        partitions other members wait on."""
        for tp, offset in positions:
            if offset > self.positions.get(tp, -1):
                self.positions[tp] = offset
        self.interests[member_id] = interested
        wanted: set[tuple[str, int]] = set()
        for mid, tps in self.interests.items():
            if mid != member_id:
                wanted |= tps
        out = {}
        for tp in interested:
            committed = self.offsets.get(tp)
            out[tp] = max(self.positions.get(tp, -1), committed.value.offset if committed is not None else -1)
        return out, wanted

    def forget_partitions(self, partitions: set[TopicPartition]) -> list[TopicPartition]:
        """Partitions deleted (KIP-253): their positions go, and their committed offsets."""
        for tp in partitions:
            self.positions.pop(tp, None)
        return super().forget_partitions(partitions)

    def expired_offsets(self, now_ms: int, retention_ms: int) -> list[TopicPartition]:
        """Offsets past retention (Kafka's rules): an empty group's once it has been empty for the
        retention period (or, without that timestamp, since each commit); a stable consumer
        group's for topics it no longer subscribes to; a group without protocol (offsets only)
        since each commit. Offsets with a commit in flight never expire."""

        def since_commit(c: CommittedOffset) -> int:
            return c.value.commit_timestamp

        if self.protocol_type is not None and self.state is GroupState.EMPTY:
            ts = self.state_timestamp
            return self.offsets_expired_since(now_ms, retention_ms,
                                              lambda c: ts if ts is not None else c.value.commit_timestamp)
        if self.protocol_type == CONSUMER_PROTOCOL_TYPE and self.subscribed_topics is not None and self.state is GroupState.STABLE:
            return self.offsets_expired_since(now_ms, retention_ms, since_commit, self.subscribed_topics)
        if self.protocol_type is None:
            return self.offsets_expired_since(now_ms, retention_ms, since_commit)
        return []

    # ---- the rules the offsets manager asks of a group (base.Group)
    @property
    def state_name(self) -> str:
        return self.state.value

    @property
    def is_dead(self) -> bool:
        return self.state is GroupState.DEAD

    @property
    def is_empty(self) -> bool:
        return self.state is GroupState.EMPTY and not self.pending_members

    def mark_dead(self) -> None:
        self.transition_to(GroupState.DEAD)

    def validate_member(self, member_id: str, instance_id: str | None) -> int:
        """0 when `member_id` (static: of `instance_id`) is the current member, else the error."""
        if instance_id is not None:
            current = self.current_static_member_id(instance_id)
            if current is None:
                return Errors.UNKNOWN_MEMBER_ID
            if current != member_id:
                return Errors.FENCED_INSTANCE_ID
            return 0
        return 0 if self.has(member_id) else Errors.UNKNOWN_MEMBER_ID

    def validate_offset_commit(self, member_id: str, instance_id: str | None, generation_id: int,
                               api_version: int = OFFSET_COMMIT_LATEST_VERSION) -> int:
        if self.is_(GroupState.DEAD):
            return Errors.COORDINATOR_NOT_AVAILABLE
        if generation_id < 0 and self.is_(GroupState.EMPTY):
            return 0  # admin clients and consumers without group management
        if generation_id >= 0 or member_id != UNKNOWN_MEMBER_ID or instance_id is not None:
            err = self.validate_member(member_id, instance_id)
            if err:
                return err
            if generation_id != self.generation_id:
                return Errors.ILLEGAL_GENERATION
        elif not self.is_(GroupState.EMPTY):
            return Errors.UNKNOWN_MEMBER_ID  # only members commit for a non-empty group
        if self.is_(GroupState.COMPLETING_REBALANCE):
            return Errors.REBALANCE_IN_PROGRESS  # the member commits again once it has its assignment
        return 0

    def validate_txn_offset_commit(self, member_id: str, instance_id: str | None, generation_id: int) -> int:
        if self.is_(GroupState.DEAD):
            return Errors.COORDINATOR_NOT_AVAILABLE
        if generation_id < 0 and self.is_(GroupState.EMPTY):
            return 0  # a producer committing for a group without group management (v0-2 send no member)
        if member_id != UNKNOWN_MEMBER_ID and not self.has(member_id) and instance_id is None:
            return Errors.UNKNOWN_MEMBER_ID
        if instance_id is not None and self.is_static_member_fenced(instance_id, member_id):
            return Errors.FENCED_INSTANCE_ID
        if generation_id >= 0 and generation_id != self.generation_id:
            return Errors.ILLEGAL_GENERATION
        return 0

    def validate_offset_delete(self, partitions: Iterable[TopicPartition]) -> tuple[int, dict[TopicPartition, int]]:
        if self.is_(GroupState.EMPTY):
            return 0, {tp: 0 for tp in partitions}
        if self.is_consumer_group:
            # a live consumer group keeps the offsets of the topics it subscribes to
            return 0, {tp: Errors.GROUP_SUBSCRIBED_TO_TOPIC if self.is_subscribed_to_topic(tp[0]) else 0
                       for tp in partitions}
        return Errors.NON_EMPTY_GROUP, {}

    def validate_delete_group(self) -> int:
        return 0 if self.is_(GroupState.EMPTY) else Errors.NON_EMPTY_GROUP

    def tombstone_keys(self) -> list[bytes]:
        return [group_metadata_key(self.group_id)]

    def cancel_timers(self) -> None:
        for handle in (self.join_timer, self.sync_timer, *self.pending_timers.values()):
            if handle is not None:
                handle.cancel()
        self.join_timer = self.sync_timer = None
        self.pending_timers.clear()
        for m in self.members.values():
            m.cancel_heartbeat()

    def unload(self) -> None:
        previous = self.state
        self.transition_to(GroupState.DEAD)
        if previous is GroupState.PREPARING_REBALANCE:
            for m in list(self.members.values()):
                self.complete_join(m, JoinResult(Errors.NOT_COORDINATOR, m.member_id))
        elif previous in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            for m in list(self.members.values()):
                self.complete_sync(m, SyncResult(Errors.NOT_COORDINATOR))
        self.cancel_timers()


def parse_subscription_topics(metadata: bytes) -> set[str]:
    """The topics of a ConsumerProtocolSubscription (every version starts with v0's layout:
    int16 version, then an array of int16-length strings)."""
    try:
        pos = 2
        (n,) = struct.unpack_from(">i", metadata, pos)
        pos += 4
        if n < 0 or n > len(metadata):
            raise ValueError("bad topic count")
        topics = set()
        for _ in range(n):
            (ln,) = struct.unpack_from(">h", metadata, pos)
            pos += 2
            if ln < 0 or pos + ln > len(metadata):
                raise ValueError("bad topic name")
            topics.add(metadata[pos : pos + ln].decode())
            pos += ln
        return topics
    except (struct.error, UnicodeDecodeError) as e:
        raise ValueError(f"not a consumer protocol subscription: {e}") from None
