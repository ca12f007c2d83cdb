"""A KIP-848 consumer group's state (Kafka's ConsumerGroup and ConsumerGroupMember): a sibling of
the classic group (group.py) under the same base (base.py), kept in the same __consumer_offsets
partitions.

Pure state, no I/O: the consumer group manager (consumer.py) drives it and runs its timers. The
group has three epochs (KIP-848, "Group Epoch - Trigger a rebalance"): the group epoch, bumped
whenever membership, a subscription or the subscribed topics' metadata change; the assignment
epoch, the group epoch the target assignment was computed at; and each member's epoch, which
reaches the assignment epoch once the member has reconciled its part of the target. The group
also knows, per partition, the epoch of the member that owns it (assigned or pending
revocation), so that a partition is given to its next owner only once released ("Assignment
Reconciliation", revoke before assign).
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import ClassVar
from uuid import UUID

from broker.coordinator import wall_clock_ms
from broker.coordinator.group.base import OFFSET_COMMIT_LATEST_VERSION, CommittedOffset, Group, TopicPartition
from broker.coordinator.group.consumer_records import (
    Assignment,
    CurrentAssignment,
    MemberSubscription,
    ResolvedRegex,
    current_assignment_key,
    group_metadata_key,
    member_metadata_key,
    partition_metadata_key,
    regex_key,
    target_assignment_member_key,
    target_assignment_metadata_key,
)
from protocol.errors import Errors

LEAVE_GROUP_MEMBER_EPOCH = -1
LEAVE_GROUP_STATIC_MEMBER_EPOCH = -2


class ConsumerGroupState(enum.Enum):
    EMPTY = "Empty"
    ASSIGNING = "Assigning"
    RECONCILING = "Reconciling"
    STABLE = "Stable"
    DEAD = "Dead"


class MemberState(enum.IntEnum):
    """Kafka's MemberState byte values, as the current assignment record stores them."""

    UNKNOWN = 0
    STABLE = 1
    UNREVOKED_PARTITIONS = 2
    UNRELEASED_PARTITIONS = 3


@dataclass
class ConsumerMember:
    member_id: str
    instance_id: str | None = None
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    subscribed_topic_names: tuple[str, ...] = ()
    subscribed_topic_regex: str | None = None
    rebalance_timeout_ms: int = -1
    server_assignor: str | None = None
    member_epoch: int = 0
    previous_member_epoch: int = 0
    state: MemberState = MemberState.STABLE
    assigned: Assignment = field(default_factory=dict)
    pending_revocation: Assignment = field(default_factory=dict)
    # a classic-protocol member of a migrated group (KIP-848, "Upgrade and downgrade"): its
    # session timeout and JoinGroup protocols; None for a consumer-protocol member
    classic_session_timeout_ms: int | None = None
    classic_protocols: list[tuple[str, bytes]] | None = None
    # the consumer group manager's timers
    session_timer: asyncio.TimerHandle | None = field(default=None, repr=False, compare=False)
    rebalance_timer: asyncio.TimerHandle | None = field(default=None, repr=False, compare=False)
    # a classic member's: rejoin after REBALANCE_IN_PROGRESS, SyncGroup after its JoinGroup
    join_timer: asyncio.TimerHandle | None = field(default=None, repr=False, compare=False)
    sync_timer: asyncio.TimerHandle | None = field(default=None, repr=False, compare=False)

    @property
    def is_static(self) -> bool:
        return self.instance_id is not None

    def subscription(self) -> MemberSubscription:
        classic = None
        if self.classic_protocols is not None:
            classic = (self.classic_session_timeout_ms or 0, tuple(self.classic_protocols))
        return MemberSubscription(self.instance_id, self.rack_id, self.client_id, self.client_host,
                                  self.subscribed_topic_names, self.subscribed_topic_regex,
                                  self.rebalance_timeout_ms, self.server_assignor, classic)

    def current_assignment(self) -> CurrentAssignment:
        return CurrentAssignment(self.member_epoch, self.previous_member_epoch, int(self.state), self.assigned,
                                 self.pending_revocation)

    def apply_subscription(self, s: MemberSubscription) -> None:
        self.instance_id, self.rack_id = s.instance_id, s.rack_id
        self.client_id, self.client_host = s.client_id, s.client_host
        self.subscribed_topic_names, self.subscribed_topic_regex = s.subscribed_topic_names, s.subscribed_topic_regex
        self.rebalance_timeout_ms, self.server_assignor = s.rebalance_timeout_ms, s.server_assignor
        if s.classic is not None:
            self.classic_session_timeout_ms, self.classic_protocols = s.classic[0], list(s.classic[1])

    def apply_current(self, c: CurrentAssignment) -> None:
        self.member_epoch, self.previous_member_epoch = c.member_epoch, c.previous_member_epoch
        self.state = MemberState(c.state) if c.state in MemberState._value2member_map_ else MemberState.UNKNOWN
        self.assigned, self.pending_revocation = dict(c.assigned), dict(c.pending_revocation)

    def cancel_timers(self) -> None:
        for t in (self.session_timer, self.rebalance_timer, self.join_timer, self.sync_timer):
            if t is not None:
                t.cancel()
        self.session_timer = self.rebalance_timer = self.join_timer = self.sync_timer = None


_TIMERS = frozenset({"session_timer", "rebalance_timer", "join_timer", "sync_timer"})
_MEMBER_STATE = tuple(f.name for f in dataclasses.fields(ConsumerMember) if f.name not in _TIMERS)


def _member_state(m: ConsumerMember) -> dict:
    """A member's fields but its timers (the manager's), for putting them back into it."""
    state = {name: getattr(m, name) for name in _MEMBER_STATE}
    state["assigned"], state["pending_revocation"] = dict(m.assigned), dict(m.pending_revocation)
    if m.classic_protocols is not None:
        state["classic_protocols"] = list(m.classic_protocols)
    return state


@dataclass
class GroupSnapshot:
    """A consumer group's state at one moment, to put back when the records of an operation
    that changed it are not written (Kafka's timeline structures revert to the last written
    offset; this is the same for the one group an operation touches)."""

    group_epoch: int
    assignment_epoch: int
    members: dict[str, ConsumerMember]  # the member objects themselves
    touched: dict[str, dict]  # the fields of the members the operation may change in place
    static_members: dict[str, str]
    targets: dict[str, Assignment]
    subscription_metadata: dict[UUID, tuple[str, int]]
    partition_racks: dict[UUID, dict[int, tuple[str, ...]]]
    resolved_regexes: dict[str, ResolvedRegex]
    regex_image: object | None
    dead: bool
    state_timestamp: int
    last_state: ConsumerGroupState


class ConsumerGroup(Group):
    type: ClassVar[str] = "consumer"
    protocol_type: ClassVar[str] = "consumer"

    def __init__(self, group_id: str, clock: Callable[[], int] = wall_clock_ms) -> None:
        super().__init__(group_id, clock)
        self.group_epoch = 0
        self.assignment_epoch = 0
        self.members: dict[str, ConsumerMember] = {}
        self.static_members: dict[str, str] = {}  # instance id -> member id
        self.targets: dict[str, Assignment] = {}  # member id -> its part of the target assignment
        self.partition_epochs: dict[tuple[UUID, int], int] = {}  # owned partition -> owner's epoch
        # what the last assignment saw of the subscribed topics: topic id -> (name, partition count)
        self.subscription_metadata: dict[UUID, tuple[str, int]] = {}
        self.partition_racks: dict[UUID, dict[int, tuple[str, ...]]] = {}  # and their replicas' racks
        # each subscribed regular expression's last resolution (record type 16), and the image it
        # was last checked against (memory only: after a load, the record's version stands in)
        self.resolved_regexes: dict[str, ResolvedRegex] = {}
        self.regex_image: object | None = None
        self.dead = False
        self.state_timestamp = clock()
        self._last_state = ConsumerGroupState.EMPTY

    def __repr__(self) -> str:
        return (f"ConsumerGroup({self.group_id!r}, {self.state.value}, epoch={self.group_epoch}, "
                f"assignment_epoch={self.assignment_epoch}, members={len(self.members)})")

    # ---- state (Kafka's ConsumerGroup.maybeUpdateGroupState)
    @property
    def state(self) -> ConsumerGroupState:
        if self.dead:
            return ConsumerGroupState.DEAD
        if not self.members:
            return ConsumerGroupState.EMPTY
        if self.group_epoch != self.assignment_epoch:
            return ConsumerGroupState.ASSIGNING
        for m in self.members.values():
            if m.member_epoch != self.assignment_epoch or m.state is not MemberState.STABLE:
                return ConsumerGroupState.RECONCILING
        return ConsumerGroupState.STABLE

    def note_state(self) -> None:
        """Stamp the time the state last changed (offset expiry of an empty group counts from it)."""
        s = self.state
        if s is not self._last_state:
            self._last_state = s
            self.state_timestamp = self.clock()

    # ---- snapshots (rollback.py)
    def snapshot(self, touched: Iterable[str]) -> GroupSnapshot:
        """The group's state before an operation that may change the members `touched` in place
        (the one a request is from); the others it may only add or remove. Cheap: the member
        dicts are copied, the members' fields only for those (a heartbeat takes one per request)."""
        return GroupSnapshot(self.group_epoch, self.assignment_epoch, dict(self.members),
                             {mid: _member_state(self.members[mid]) for mid in touched if mid in self.members},
                             dict(self.static_members), dict(self.targets), dict(self.subscription_metadata),
                             dict(self.partition_racks), dict(self.resolved_regexes), self.regex_image, self.dead,
                             self.state_timestamp, self._last_state)

    def restore(self, s: GroupSnapshot) -> None:
        """Put the snapshot's state back, into the same member objects (so snapshots of later
        operations, restored first, and of earlier ones compose). A member kept keeps its
        running timers; one the operation added loses them; one it removed comes back without
        any (the manager arms them)."""
        for mid, m in self.members.items():
            if s.members.get(mid) is not m:
                m.cancel_timers()
        self.members = dict(s.members)
        for mid, state in s.touched.items():
            m = self.members[mid]
            for name, value in state.items():
                setattr(m, name, value)
        self.group_epoch, self.assignment_epoch = s.group_epoch, s.assignment_epoch
        self.static_members, self.targets = dict(s.static_members), dict(s.targets)
        self.subscription_metadata, self.partition_racks = dict(s.subscription_metadata), dict(s.partition_racks)
        self.resolved_regexes, self.regex_image, self.dead = dict(s.resolved_regexes), s.regex_image, s.dead
        self.state_timestamp, self._last_state = s.state_timestamp, s.last_state
        self.partition_epochs = {}
        for m in self.members.values():
            self._add_partition_epochs(m)

    # ---- members
    def put_member(self, member: ConsumerMember) -> None:
        """Add or replace a member (same id), keeping the partition epochs and static ids true."""
        old = self.members.get(member.member_id)
        if old is not None:
            self._drop_partition_epochs(old)
            if old.instance_id is not None and self.static_members.get(old.instance_id) == old.member_id:
                del self.static_members[old.instance_id]
        self.members[member.member_id] = member
        if member.instance_id is not None:
            self.static_members[member.instance_id] = member.member_id
        self._add_partition_epochs(member)

    def remove_member(self, member_id: str) -> ConsumerMember | None:
        m = self.members.pop(member_id, None)
        if m is not None:
            self._drop_partition_epochs(m)
            if m.instance_id is not None and self.static_members.get(m.instance_id) == member_id:
                del self.static_members[m.instance_id]
            m.cancel_timers()
        self.targets.pop(member_id, None)
        return m

    def static_member(self, instance_id: str) -> ConsumerMember | None:
        mid = self.static_members.get(instance_id)
        return None if mid is None else self.members.get(mid)

    def update_assignment(self, member: ConsumerMember, epoch: int, previous: int, state: MemberState,
                          assigned: Assignment, pending: Assignment) -> None:
        self._drop_partition_epochs(member)
        member.member_epoch, member.previous_member_epoch, member.state = epoch, previous, state
        member.assigned, member.pending_revocation = assigned, pending
        self._add_partition_epochs(member)

    def _add_partition_epochs(self, m: ConsumerMember) -> None:
        for a in (m.assigned, m.pending_revocation):
            for tid, parts in a.items():
                for p in parts:
                    self.partition_epochs[(tid, p)] = m.member_epoch

    def _drop_partition_epochs(self, m: ConsumerMember) -> None:
        for a in (m.assigned, m.pending_revocation):
            for tid, parts in a.items():
                for p in parts:
                    self.partition_epochs.pop((tid, p), None)

    def partition_epoch(self, topic_id: UUID, partition: int) -> int:
        """The epoch of the member owning the partition, -1 when it is free."""
        return self.partition_epochs.get((topic_id, partition), -1)

    # ---- subscriptions
    def subscribed_topic_names(self) -> Counter[str]:
        c: Counter[str] = Counter()
        for m in self.members.values():
            c.update(m.subscribed_topic_names)
        return c

    def preferred_assignor(self, default: str) -> str:
        """The assignor most members ask for (Kafka's ConsumerGroup.computePreferredServerAssignor)."""
        votes = Counter(m.server_assignor for m in self.members.values() if m.server_assignor)
        return votes.most_common(1)[0][0] if votes else default

    def subscribed_regexes(self) -> set[str]:
        return {m.subscribed_topic_regex for m in self.members.values() if m.subscribed_topic_regex}

    def subscribed_topics(self) -> set[str]:
        """Names of the topics the members subscribe to now (regular expressions as last resolved
        by the manager, which records them in subscription_metadata)."""
        names = set(self.subscribed_topic_names())
        names.update(name for name, _ in self.subscription_metadata.values())
        return names

    # ---- the rules the offsets manager asks of a group (base.Group)
    @property
    def state_name(self) -> str:
        return self.state.value

    @property
    def is_dead(self) -> bool:
        return self.dead

    @property
    def is_empty(self) -> bool:
        return not self.members

    def mark_dead(self) -> None:
        self.dead = True

    def validate_member_epoch(self, member_id: str, epoch: int) -> int:
        """Kafka's ConsumerGroup.validateOffsetCommit / validateOffsetFetch for a member: a stale
        epoch is ILLEGAL_GENERATION for a classic member of a migrated group (its generation is
        its member epoch), STALE_MEMBER_EPOCH for a consumer-protocol member."""
        m = self.members.get(member_id)
        if m is None:
            return Errors.UNKNOWN_MEMBER_ID
        if epoch != m.member_epoch:
            return Errors.ILLEGAL_GENERATION if m.classic_protocols is not None else Errors.STALE_MEMBER_EPOCH
        return 0

    def validate_offset_commit(self, member_id: str, instance_id: str | None, generation_id: int,
                               api_version: int = OFFSET_COMMIT_LATEST_VERSION) -> int:
        if self.dead:
            return Errors.COORDINATOR_NOT_AVAILABLE
        if generation_id < 0 and not self.members:
            return 0  # an admin client, or a consumer without group management, commits for an empty group
        m = self.members.get(member_id)
        if m is not None and m.classic_protocols is None and api_version < 9:
            # a KIP-848 member commits with v9+, which carries its member epoch (Kafka's
            # validateOffsetCommit: UnsupportedVersionException)
            return Errors.UNSUPPORTED_VERSION
        return self.validate_member_epoch(member_id, generation_id)

    def validate_txn_offset_commit(self, member_id: str, instance_id: str | None, generation_id: int) -> int:
        if self.dead:
            return Errors.COORDINATOR_NOT_AVAILABLE
        if generation_id < 0 and not member_id:
            return 0
        m = self.members.get(member_id)
        if m is None:
            return Errors.UNKNOWN_MEMBER_ID
        if generation_id >= 0 and generation_id != m.member_epoch:
            return Errors.ILLEGAL_GENERATION  # TxnOffsetCommit's code for a stale epoch (Kafka's)
        return 0

    def validate_offset_fetch(self, member_id: str | None, member_epoch: int) -> int:
        if member_id is None and member_epoch < 0:
            return 0  # the admin client, or a consumer that sends neither
        return self.validate_member_epoch(member_id or "", member_epoch)

    def validate_offset_delete(self, partitions: Iterable[TopicPartition]) -> tuple[int, dict[TopicPartition, int]]:
        if not self.members:
            return 0, {tp: 0 for tp in partitions}
        subscribed = self.subscribed_topics()
        return 0, {tp: Errors.GROUP_SUBSCRIBED_TO_TOPIC if tp[0] in subscribed else 0 for tp in partitions}

    def validate_delete_group(self) -> int:
        return 0 if not self.members else Errors.NON_EMPTY_GROUP

    def expired_offsets(self, now_ms: int, retention_ms: int) -> list[TopicPartition]:
        """Kafka's ConsumerGroup.offsetExpirationCondition: from each commit's time; a non-empty
        group keeps the offsets of the topics it subscribes to."""

        def since_commit(c: CommittedOffset) -> int:
            return c.value.commit_timestamp

        keep = self.subscribed_topics() if self.members else set()
        return self.offsets_expired_since(now_ms, retention_ms, since_commit, keep)

    def tombstone_keys(self) -> list[bytes]:
        """The group's own records, the group epoch last (replaying its tombstone ends the group)."""
        keys = [regex_key(self.group_id, r) for r in self.resolved_regexes]
        for mid in self.members:
            keys += [current_assignment_key(self.group_id, mid), target_assignment_member_key(self.group_id, mid),
                     member_metadata_key(self.group_id, mid)]
        return keys + [target_assignment_metadata_key(self.group_id), partition_metadata_key(self.group_id),
                       group_metadata_key(self.group_id)]

    def cancel_timers(self) -> None:
        for m in self.members.values():
            m.cancel_timers()

    def unload(self) -> None:
        self.dead = True
        self.cancel_timers()
