"""KIP-848 consumer groups (Kafka's GroupMetadataManager for consumer groups): the
ConsumerGroupHeartbeat that members join, heartbeat, reconcile and leave with, the target
assignment the coordinator computes with a server-side assignor, member session and rebalance
timeouts, and the records that make it all durable. A sibling of the classic group manager
(classic.py); committed offsets are the offsets manager's, as for every group type.

One heartbeat, as Kafka's consumerGroupHeartbeat: check the member's epoch; take its new
subscription; bump the group epoch when membership, a subscription or the subscribed topics'
metadata changed; compute a new target assignment when the group epoch passed the assignment
epoch; move the member one step towards its target (reconciliation.py); answer its epoch and,
when it changed, the partitions it may use now. Every state change is written to the group's
__consumer_offsets partition before any await, and the answer waits for it to be replicated.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

from broker.coordinator.group import rollback
from broker.coordinator.group.assignors import ASSIGNORS, MemberSpec
from broker.coordinator.group.base import Group
from broker.coordinator.group.config import GroupCoordinatorConfig
from broker.coordinator.group.consumer_group import (
    LEAVE_GROUP_MEMBER_EPOCH,
    LEAVE_GROUP_STATIC_MEMBER_EPOCH,
    ConsumerGroup,
    ConsumerMember,
    MemberState,
)
from broker.coordinator.group.consumer_records import (
    Assignment,
    LoadedConsumerGroup,
    ResolvedRegex,
    TopicMetadata,
    current_assignment_key,
    current_assignment_value,
    epoch_value,
    group_metadata_key,
    member_metadata_key,
    member_metadata_value,
    partition_metadata_key,
    partition_metadata_value,
    regex_key,
    regex_value,
    target_assignment_member_key,
    target_assignment_member_value,
    target_assignment_metadata_key,
)
from broker.coordinator.group.group import ClassicGroup, JoinCallback, JoinResult, SyncResult
from broker.coordinator.group.migration import (
    DOWNGRADE_POLICIES,
    UPGRADE_POLICIES,
    by_id,
    by_name,
    classic_group_from_consumer,
    classic_member,
    consumer_group_from_classic,
    encode_assignment,
    parse_subscription,
    protocol_name,
)
from broker.coordinator.group.reconciliation import FencedMember, NextAssignment, reconcile
from broker.coordinator.group.records import GroupMetadataRecord, MemberRecord, group_metadata_value
from broker.coordinator.group.records import group_metadata_key as classic_group_metadata_key
from broker.coordinator.group.runtime import GroupRuntime, OffsetsPartition
from broker.coordinator.group.subscriptions import InvalidRegex, compile_regex, resolve, topic_specs
from broker.coordinator.partitioned import state_write_error
from metadata.image import GROUP_RESOURCE
from protocol.errors import Errors

if TYPE_CHECKING:
    from broker.ports import ImageSource

log = structlog.get_logger(__name__)

CONSUMER_GROUP_HEARTBEAT, CONSUMER_GROUP_DESCRIBE = 68, 69
MAX_SUBSCRIBED_TOPICS = 10_000  # a subscription past this is refused (INVALID_REQUEST), not stored
Record = tuple[bytes, bytes | None]
DISABLED_MESSAGE = "The version of API is not supported."  # Kafka's UnsupportedVersionException's


class HeartbeatError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class HeartbeatRequest:
    group_id: str
    member_id: str
    member_epoch: int
    instance_id: str | None = None
    rack_id: str | None = None
    rebalance_timeout_ms: int = -1
    subscribed_topic_names: list[str] | None = None
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    owned: Assignment | None = None
    client_id: str = ""
    client_host: str = ""
    api_version: int = 1


@dataclass
class HeartbeatResult:
    error: int
    message: str | None = None
    member_id: str | None = None
    member_epoch: int = 0
    heartbeat_interval_ms: int = 0
    assignment: Assignment | None = None


class ConsumerGroupManager:
    def __init__(self, config: GroupCoordinatorConfig, runtime: GroupRuntime, images: ImageSource,
                 take_over: Callable[[OffsetsPartition, str, Group], None],
                 downgraded: Callable[[ClassicGroup], None]) -> None:
        """`take_over(partition, group id, new group)`: put a group in place of the group of the
        other type of that id, its committed offsets carried over. `downgraded(group)`: a classic
        group made from a consumer group, for the classic manager to run (its members rejoin)."""
        self.config = config
        self._runtime = runtime
        self._images = images
        self._take_over = take_over
        self._downgraded = downgraded
        # a group a rollback puts back: a consumer group's timers armed, a classic one's members rejoining
        self._rearms = rollback.Rearm(self._rearm, downgraded)

    # ------------------------------------------------------------------ loading
    def load(self, ps: OffsetsPartition, loaded: dict[str, LoadedConsumerGroup]) -> None:
        for gid, lg in loaded.items():
            group = ConsumerGroup(gid)
            group.group_epoch, group.assignment_epoch = lg.group_epoch, lg.assignment_epoch
            for mid, sub in lg.members.items():
                m = ConsumerMember(mid)
                m.apply_subscription(sub)
                cur = lg.current.get(mid)
                if cur is not None:
                    m.apply_current(cur)
                group.put_member(m)
            group.targets = {mid: a for mid, a in lg.targets.items() if mid in group.members}
            group.subscription_metadata = {t.topic_id: (t.name, t.num_partitions) for t in lg.partition_metadata}
            group.partition_racks = {t.topic_id: dict(t.racks) for t in lg.partition_metadata}
            group.resolved_regexes = dict(lg.regexes)
            group.note_state()
            ps.groups[gid] = group

    def resume(self, ps: OffsetsPartition) -> None:
        """A loaded partition's consumer groups carry on: sessions (and pending revocations) run
        from now, as Kafka's onLoaded."""
        for group in ps.groups.values():
            if isinstance(group, ConsumerGroup):
                self._rearm(group)

    def _rearm(self, group: ConsumerGroup) -> None:
        """Timers for members that have none (loaded, or put back by a rollback): the session,
        and the rebalance timeout of one that has partitions to revoke."""
        for m in group.members.values():
            if m.session_timer is None:
                self._schedule_session(group, m)
            self._sync_rebalance_timer(group, m)

    def _write(self, u: rollback.Undo, records: list[Record]) -> tuple[int, asyncio.Future]:
        """Write an operation's records; if they are not written, what it changed is undone."""
        code, _, done = self._runtime.write(u.ps.index, records)
        if code:
            rollback.undo(u, self._rearms, f"write failed with error {code}")
            return code, done
        rollback.written_later(u)
        done.add_done_callback(lambda f: rollback.settle(u, f.result(), self._rearms))
        return 0, done

    # ------------------------------------------------------------------ the heartbeat
    async def heartbeat(self, req: HeartbeatRequest) -> HeartbeatResult:
        undo: rollback.Undo | None = None
        try:
            self._check_enabled()
            self._validate(req)
            if not req.member_id:
                req.member_id = new_member_id()
            err, ps = self._runtime.status(req.group_id, CONSUMER_GROUP_HEARTBEAT)
            if err:
                return HeartbeatResult(err)
            assert ps is not None
            found = ps.groups.get(req.group_id)
            holder = found.static_members.get(req.instance_id) if isinstance(found, ConsumerGroup) and \
                req.instance_id is not None else None
            undo = rollback.begin(ps, req.group_id, (req.member_id, holder))
            result, records = self._heartbeat(ps, req)
        except HeartbeatError as e:
            if undo is not None:  # refused part way: what it changed goes (Kafka's ops are atomic)
                rollback.undo(undo, self._rearms, e.message, quiet=True)
            log.info("consumer_group_heartbeat_refused", group=req.group_id, member=req.member_id,
                     epoch=req.member_epoch, error_code=e.code, reason=e.message)
            return HeartbeatResult(e.code, e.message)
        if records:
            assert undo is not None
            code, done = self._write(undo, records)
            if not code:
                code = await done
            if code:
                return HeartbeatResult(state_write_error(code))
        return result

    def _check_enabled(self) -> None:
        """Without `consumer` in group.coordinator.rebalance.protocols, Kafka's KafkaApis answers
        KIP-848's APIs with UNSUPPORTED_VERSION (they stay advertised in ApiVersions)."""
        if not self.config.consumer_protocol_enabled:
            raise HeartbeatError(Errors.UNSUPPORTED_VERSION, DISABLED_MESSAGE)

    def _validate(self, req: HeartbeatRequest) -> None:
        """Kafka's throwIfConsumerGroupHeartbeatRequestIsInvalid."""
        bad = Errors.INVALID_REQUEST
        if not req.group_id:
            raise HeartbeatError(Errors.INVALID_GROUP_ID, "GroupId can't be empty.")
        if req.instance_id is not None and not req.instance_id:
            raise HeartbeatError(bad, "InstanceId can't be empty.")
        if req.rack_id is not None and not req.rack_id:
            raise HeartbeatError(bad, "RackId can't be empty.")
        if not req.member_id and (req.api_version >= 1 or req.member_epoch != 0):
            raise HeartbeatError(bad, "MemberId can't be empty.")
        if req.member_epoch < LEAVE_GROUP_STATIC_MEMBER_EPOCH:
            raise HeartbeatError(bad, f"MemberEpoch {req.member_epoch} is invalid.")
        if req.member_epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH and req.instance_id is None:
            raise HeartbeatError(bad, "InstanceId can't be null when leaving as a static member.")
        if req.member_epoch == 0:
            if req.rebalance_timeout_ms == -1:
                raise HeartbeatError(bad, "RebalanceTimeoutMs must be provided in first request.")
            if req.owned is None or any(req.owned.values()):
                raise HeartbeatError(bad, "TopicPartitions must be empty when (re-)joining.")
            if req.subscribed_topic_names is None and req.subscribed_topic_regex is None:
                raise HeartbeatError(bad, "SubscribedTopicNames or SubscribedTopicRegex must be set in first request.")
        if req.subscribed_topic_names is not None and len(req.subscribed_topic_names) > MAX_SUBSCRIBED_TOPICS:
            raise HeartbeatError(bad, f"The subscription names {len(req.subscribed_topic_names)} topics, more "
                                      f"than {MAX_SUBSCRIBED_TOPICS}.")
        if req.server_assignor is not None and req.server_assignor not in self.config.consumer_assignors:
            raise HeartbeatError(Errors.UNSUPPORTED_ASSIGNOR,
                                 f"ServerAssignor {req.server_assignor} is not supported. Supported assignors: "
                                 f"{', '.join(self.config.consumer_assignors)}.")
        if req.subscribed_topic_regex:
            try:
                compile_regex(req.subscribed_topic_regex)
            except InvalidRegex as e:
                raise HeartbeatError(Errors.INVALID_REGULAR_EXPRESSION, str(e)) from None

    def _group(self, ps: OffsetsPartition, req: HeartbeatRequest, records: list[Record]) -> ConsumerGroup:
        group = ps.groups.get(req.group_id)
        if isinstance(group, ConsumerGroup) and not group.is_dead:
            return group
        if group is not None and not group.is_dead:
            if isinstance(group, ClassicGroup) and not group.is_empty and req.member_epoch == 0 and \
                    self.config.consumer_migration_policy in UPGRADE_POLICIES and group.is_consumer_group and \
                    len(group.members) < self.config.consumer_max_size:
                return self._upgrade(ps, group, records)
            if not group.is_empty or req.member_epoch != 0:
                raise HeartbeatError(Errors.GROUP_ID_NOT_FOUND, f"Group {req.group_id} is not a consumer group.")
            # an empty classic group (offsets only, or every member gone) becomes a consumer
            # group keeping its offsets (KIP-848, "Upgrade and downgrade")
            log.info("classic_group_converted_to_consumer", group=req.group_id)
            new = ConsumerGroup(req.group_id)
            self._take_over(ps, req.group_id, new)
            records.append((classic_group_metadata_key(req.group_id), None))
            return new
        if req.member_epoch != 0:
            # the group is unknown here (deleted, or lost with its coordinator): the member rejoins
            raise HeartbeatError(Errors.UNKNOWN_MEMBER_ID, f"Group {req.group_id} has no member {req.member_id}.")
        new = ConsumerGroup(req.group_id)
        ps.groups[req.group_id] = new
        log.info("consumer_group_created", group=req.group_id)
        return new

    def _heartbeat(self, ps: OffsetsPartition, req: HeartbeatRequest) -> tuple[HeartbeatResult, list[Record]]:
        records: list[Record] = []
        if req.member_epoch in (LEAVE_GROUP_MEMBER_EPOCH, LEAVE_GROUP_STATIC_MEMBER_EPOCH):
            return self._leave(ps, req, records), records
        group = self._group(ps, req, records)
        member = self._member(group, req, records)
        gid = group.group_id
        bump = False
        if member.member_id not in group.members:
            bump = True
        sub = member.subscription()
        updated = member  # changed in place: its timers find it by id
        updated.classic_protocols = updated.classic_session_timeout_ms = None  # it speaks the consumer protocol now
        if req.instance_id is not None:
            updated.instance_id = req.instance_id
        if req.rack_id is not None:
            updated.rack_id = req.rack_id
        if req.rebalance_timeout_ms != -1:
            updated.rebalance_timeout_ms = req.rebalance_timeout_ms
        if req.subscribed_topic_names is not None:
            updated.subscribed_topic_names = tuple(sorted(set(req.subscribed_topic_names)))
        if req.subscribed_topic_regex is not None:
            updated.subscribed_topic_regex = req.subscribed_topic_regex or None
        if req.server_assignor is not None:
            updated.server_assignor = req.server_assignor
        updated.client_id, updated.client_host = req.client_id, req.client_host
        new_sub = updated.subscription()
        if new_sub != sub or bump:
            records.append((member_metadata_key(gid, updated.member_id), member_metadata_value(new_sub)))
            if (new_sub.subscribed_topic_names, new_sub.subscribed_topic_regex, new_sub.server_assignor) != (
                    sub.subscribed_topic_names, sub.subscribed_topic_regex, sub.server_assignor):
                bump = True
        group.put_member(updated)
        self._refresh(group, bump, updated.member_id, records)
        before = updated.assigned
        self._reconcile(group, updated, req.owned, records)
        self._schedule_session(group, updated)
        group.note_state()
        send = req.member_epoch == 0 or req.owned is not None or updated.assigned != before
        return HeartbeatResult(0, None, updated.member_id, updated.member_epoch, self._heartbeat_interval(gid),
                               updated.assigned if send else None), records

    def _refresh(self, group: ConsumerGroup, bump: bool, member_id: str, records: list[Record]) -> None:
        """The subscribed topics' metadata: a change (new topic, partitions added, a regex now
        matching more) bumps the group epoch too (KIP-848, "Group Epoch"); a new group epoch
        gets a new target assignment."""
        gid = group.group_id
        image = self._images.image
        self._resolve_regexes(group, records)
        names = set(group.subscribed_topic_names())
        for r in group.subscribed_regexes():
            names.update(group.resolved_regexes[r].topics)
        topics = resolve(image, names, ())
        specs = topic_specs(image, topics)
        metadata = {tid: (topics[tid], spec.partitions) for tid, spec in specs.items()}
        # replica racks count too: a rack-aware assignment changes with them (KIP-1101)
        racks = {tid: {p: tuple(sorted(rs)) for p, rs in spec.racks.items()} for tid, spec in specs.items()}
        if metadata != group.subscription_metadata or racks != group.partition_racks:
            group.subscription_metadata, group.partition_racks = metadata, racks
            records.append((partition_metadata_key(gid), partition_metadata_value(
                [TopicMetadata(tid, name, n, racks.get(tid, {})) for tid, (name, n) in sorted(metadata.items())])))
            bump = True
        if bump:
            group.group_epoch += 1
            records.append((group_metadata_key(gid), epoch_value(group.group_epoch)))
            log.info("consumer_group_epoch_bumped", group=gid, epoch=group.group_epoch, member=member_id)
        if group.group_epoch > group.assignment_epoch:
            self._compute_target(group, specs, records)

    def _resolve_regexes(self, group: ConsumerGroup, records: list[Record]) -> None:
        """Each subscribed regular expression's topics, kept with the image offset they were
        matched at and written as Kafka's ConsumerGroupRegularExpression record (KIP-848): a
        coordinator that loads the group takes them from the record and matches again only once
        the metadata moved past that offset. A regular expression no member subscribes to any
        more is tombstoned. (Kafka matches in the background, at most every 10 s; Strata matches
        at the first heartbeat that sees a new image, cheap enough inline.)"""
        gid = group.group_id
        image = self._images.image
        wanted = group.subscribed_regexes()
        self._drop_regexes(group, records)
        changed_image = group.regex_image is not image
        for r in sorted(wanted):
            cur = group.resolved_regexes.get(r)
            if cur is not None and (not changed_image or 0 <= image.offset == cur.version):
                continue
            topics = tuple(sorted(resolve(image, (), [r]).values()))
            if cur is None or cur.topics != topics:
                new = ResolvedRegex(topics, image.offset, group.clock())
                group.resolved_regexes[r] = new
                records.append((regex_key(gid, r), regex_value(new)))
        group.regex_image = image

    @staticmethod
    def _drop_regexes(group: ConsumerGroup, records: list[Record]) -> None:
        """Tombstone the resolutions of regular expressions no member subscribes to any more."""
        wanted = group.subscribed_regexes()
        for r in [r for r in group.resolved_regexes if r not in wanted]:
            del group.resolved_regexes[r]
            records.append((regex_key(group.group_id, r), None))

    def _member(self, group: ConsumerGroup, req: HeartbeatRequest, records: list[Record]) -> ConsumerMember:
        """The member the heartbeat is from (new when joining), its epoch checked (Kafka's
        throwIfMemberEpochIsInvalid)."""
        if req.member_epoch == 0:
            if req.instance_id is not None:
                old = group.static_member(req.instance_id)
                if old is not None and old.member_id != req.member_id:
                    # a classic static member is replaced at once (it never leaves with -2: a
                    # live upgrade restarts it under the consumer protocol), as Kafka's
                    # getOrMaybeSubscribeStaticConsumerGroupMember
                    if old.member_epoch != LEAVE_GROUP_STATIC_MEMBER_EPOCH and not classic_member(old):
                        raise HeartbeatError(Errors.UNRELEASED_INSTANCE_ID,
                                             f"Static member {old.member_id} with instance id {req.instance_id} "
                                             f"is not released yet.")
                    return self._replace_static_member(group, old, req.member_id, records)
            existing = group.members.get(req.member_id)
            if existing is None:
                if len(group.members) >= self.config.consumer_max_size:
                    raise HeartbeatError(Errors.GROUP_MAX_SIZE_REACHED,
                                         f"The consumer group has reached its maximum capacity of "
                                         f"{self.config.consumer_max_size} members.")
                return ConsumerMember(req.member_id, member_epoch=0, previous_member_epoch=0)
            # a member rejoining with epoch 0 gave up its partitions: it starts again from none
            group.update_assignment(existing, 0, existing.member_epoch, MemberState.STABLE, {}, {})
            return existing
        m = group.members.get(req.member_id)
        if m is None:
            raise HeartbeatError(Errors.UNKNOWN_MEMBER_ID, f"Member {req.member_id} is not a member of group "
                                                           f"{group.group_id}.")
        if req.member_epoch > m.member_epoch:
            raise HeartbeatError(Errors.FENCED_MEMBER_EPOCH, f"The consumer group member has a greater epoch "
                                 f"({req.member_epoch}) than the one known by the group coordinator "
                                 f"({m.member_epoch}). The member must abandon all its partitions and rejoin.")
        if req.member_epoch < m.member_epoch:
            # a member that missed the answer to its last heartbeat may repeat it once
            if req.member_epoch != m.previous_member_epoch or req.owned is None or not _subset(req.owned, m.assigned):
                raise HeartbeatError(Errors.FENCED_MEMBER_EPOCH, f"The consumer group member has a smaller epoch "
                                     f"({req.member_epoch}) than the one known by the group coordinator "
                                     f"({m.member_epoch}). The member must abandon all its partitions and rejoin.")
        return m

    def _replace_static_member(self, group: ConsumerGroup, old: ConsumerMember, new_id: str,
                               records: list[Record]) -> ConsumerMember:
        """A static member back under a new member id takes over its predecessor's assignment,
        without a new group epoch (KIP-848, "Static Membership")."""
        gid = group.group_id
        # a member that left with -2 keeps its epoch as the previous one; a live one (a classic
        # member restarting, which never sends -2) has it as its own
        epoch = old.previous_member_epoch if old.member_epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH else old.member_epoch
        group.remove_member(old.member_id)
        target = group.targets.get(old.member_id)
        records += [(current_assignment_key(gid, old.member_id), None),
                    (target_assignment_member_key(gid, old.member_id), None),
                    (member_metadata_key(gid, old.member_id), None)]
        m = ConsumerMember(new_id, instance_id=old.instance_id, rack_id=old.rack_id, client_id=old.client_id,
                           client_host=old.client_host, subscribed_topic_names=old.subscribed_topic_names,
                           subscribed_topic_regex=old.subscribed_topic_regex,
                           rebalance_timeout_ms=old.rebalance_timeout_ms, server_assignor=old.server_assignor,
                           member_epoch=epoch, previous_member_epoch=epoch, state=MemberState.STABLE,
                           assigned=old.assigned, pending_revocation={})
        group.put_member(m)
        if target is not None:
            group.targets[new_id] = target
            records.append((target_assignment_member_key(gid, new_id), target_assignment_member_value(target)))
        records += [(member_metadata_key(gid, new_id), member_metadata_value(m.subscription())),
                    (current_assignment_key(gid, new_id), current_assignment_value(m.current_assignment()))]
        log.info("consumer_group_static_member_replaced", group=gid, instance=old.instance_id,
                 old_member=old.member_id, member=new_id)
        return m

    def _compute_target(self, group: ConsumerGroup, specs: dict, records: list[Record]) -> None:
        """A new target assignment at the group epoch (Kafka's TargetAssignmentBuilder): only the
        members whose part changed get a record."""
        name = group.preferred_assignor(self.config.consumer_assignors[0])
        assignor = ASSIGNORS.get(name, ASSIGNORS[self.config.consumer_assignors[0]])
        ids = {n: tid for tid, (n, _) in group.subscription_metadata.items()}
        inputs = {}
        for mid, m in group.members.items():
            subscribed = {ids[n] for n in m.subscribed_topic_names if n in ids}
            resolved = group.resolved_regexes.get(m.subscribed_topic_regex) if m.subscribed_topic_regex else None
            if resolved is not None:
                subscribed |= {ids[n] for n in resolved.topics if n in ids}
            inputs[mid] = MemberSpec(frozenset(subscribed), m.rack_id, group.targets.get(mid, {}), m.instance_id)
        target = assignor(inputs, specs)
        gid = group.group_id
        for mid, a in target.items():
            a = {tid: ps for tid, ps in a.items() if ps}
            if group.targets.get(mid) != a:
                group.targets[mid] = a
                records.append((target_assignment_member_key(gid, mid), target_assignment_member_value(a)))
        group.assignment_epoch = group.group_epoch
        records.append((target_assignment_metadata_key(gid), epoch_value(group.assignment_epoch)))
        log.info("consumer_group_target_assignment", group=gid, epoch=group.assignment_epoch, assignor=name,
                 members=len(target), partitions=sum(len(p) for a in target.values() for p in a.values()))

    def _reconcile(self, group: ConsumerGroup, m: ConsumerMember, owned: Assignment | None,
                   records: list[Record]) -> None:
        current = NextAssignment(m.member_epoch, m.previous_member_epoch, m.state, m.assigned, m.pending_revocation)
        try:
            nxt = reconcile(current, group.assignment_epoch, group.targets.get(m.member_id, {}), group.partition_epoch,
                            owned)
        except FencedMember as e:
            raise HeartbeatError(Errors.FENCED_MEMBER_EPOCH, str(e)) from None
        if nxt != current or m.member_epoch == 0:
            group.update_assignment(m, nxt.member_epoch, nxt.previous_member_epoch, nxt.state, nxt.assigned,
                                    nxt.pending_revocation)
            records.append((current_assignment_key(group.group_id, m.member_id),
                            current_assignment_value(m.current_assignment())))
            if nxt.state is not current.state or nxt.member_epoch != current.member_epoch:
                log.debug("consumer_group_member_reconciled", group=group.group_id, member=m.member_id,
                          epoch=m.member_epoch, state=m.state.name)
        self._sync_rebalance_timer(group, m)

    # ------------------------------------------------------------------ leaving and fencing
    def _leave(self, ps: OffsetsPartition, req: HeartbeatRequest, records: list[Record]) -> HeartbeatResult:
        group = ps.groups.get(req.group_id)
        if not isinstance(group, ConsumerGroup) or group.is_dead:
            raise HeartbeatError(Errors.GROUP_ID_NOT_FOUND, f"Group {req.group_id} not found.")
        m = group.members.get(req.member_id)
        if req.instance_id is not None:
            m = group.static_member(req.instance_id)
            if m is None or m.member_id != req.member_id:
                raise HeartbeatError(Errors.UNKNOWN_MEMBER_ID if m is None else Errors.FENCED_INSTANCE_ID,
                                     f"Instance id {req.instance_id} is not held by member {req.member_id}.")
        if m is None:
            raise HeartbeatError(Errors.UNKNOWN_MEMBER_ID, f"Member {req.member_id} is not a member of group "
                                                           f"{req.group_id}.")
        if req.member_epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH:
            # the static member comes back soon: it keeps its assignment for its session timeout
            group.update_assignment(m, LEAVE_GROUP_STATIC_MEMBER_EPOCH, m.member_epoch, m.state, m.assigned,
                                    m.pending_revocation)
            records.append((current_assignment_key(group.group_id, m.member_id),
                            current_assignment_value(m.current_assignment())))
            log.info("consumer_group_static_member_left_temporarily", group=group.group_id, member=m.member_id)
            group.note_state()
            return HeartbeatResult(0, None, m.member_id, LEAVE_GROUP_STATIC_MEMBER_EPOCH)
        log.info("consumer_group_member_left", group=group.group_id, member=m.member_id)
        self._fence(group, m, records)
        self._maybe_downgrade(ps, group, records)
        return HeartbeatResult(0, None, m.member_id, LEAVE_GROUP_MEMBER_EPOCH)

    def _fence(self, group: ConsumerGroup, m: ConsumerMember, records: list[Record]) -> None:
        """Remove a member (left, session expired, revocation too slow) and bump the group epoch:
        the next heartbeat computes a target without it."""
        gid = group.group_id
        group.remove_member(m.member_id)
        records += [(current_assignment_key(gid, m.member_id), None),
                    (target_assignment_member_key(gid, m.member_id), None),
                    (member_metadata_key(gid, m.member_id), None)]
        self._drop_regexes(group, records)
        group.group_epoch += 1
        records.append((group_metadata_key(gid), epoch_value(group.group_epoch)))
        group.note_state()

    def _fence_now(self, group: ConsumerGroup, m: ConsumerMember, why: str) -> None:
        if group.is_dead or group.members.get(m.member_id) is not m:
            return
        ps = self._runtime.partition(self._runtime.partition_for(group.group_id))
        if ps is None or ps.groups.get(group.group_id) is not group:
            return  # no longer ours: the partition is being unloaded
        log.info("consumer_group_member_fenced", group=group.group_id, member=m.member_id, reason=why)
        records: list[Record] = []
        u = rollback.begin(ps, group.group_id, (m.member_id,))
        self._fence(group, m, records)
        self._maybe_downgrade(ps, group, records)
        self._write(u, records)

    # ------------------------------------------------------------------ timers
    def _group_config(self, group_id: str, name: str, default: int) -> int:
        """A group's own setting (kafka-configs.sh --entity-type groups, Kafka's GroupConfig), else
        the broker's."""
        raw = self._images.image.configs.get((GROUP_RESOURCE, group_id), {}).get(name)
        try:
            return int(raw) if raw is not None else default
        except ValueError:
            return default

    def _session_timeout(self, group_id: str) -> int:
        return self._group_config(group_id, "consumer.session.timeout.ms", self.config.consumer_session_timeout_ms)

    def _heartbeat_interval(self, group_id: str) -> int:
        return self._group_config(group_id, "consumer.heartbeat.interval.ms",
                                  self.config.consumer_heartbeat_interval_ms)

    def _schedule_session(self, group: ConsumerGroup, m: ConsumerMember) -> None:
        if m.session_timer is not None:
            m.session_timer.cancel()
        timeout = m.classic_session_timeout_ms or self._session_timeout(group.group_id)
        m.session_timer = self._runtime.timer(timeout, self._on_session_expired, group, m.member_id)

    def _on_session_expired(self, group: ConsumerGroup, member_id: str) -> None:
        m = group.members.get(member_id)
        if m is not None:
            m.session_timer = None
            self._fence_now(group, m, "session timeout expired")

    def _sync_rebalance_timer(self, group: ConsumerGroup, m: ConsumerMember) -> None:
        """A member that still has partitions to revoke runs against its rebalance timeout; any
        other member has no such timer."""
        if m.state is MemberState.UNREVOKED_PARTITIONS:
            if m.rebalance_timer is None:
                self._schedule_rebalance_timeout(group, m)
        elif m.rebalance_timer is not None:
            m.rebalance_timer.cancel()
            m.rebalance_timer = None

    def _schedule_rebalance_timeout(self, group: ConsumerGroup, m: ConsumerMember) -> None:
        if m.rebalance_timer is not None:
            m.rebalance_timer.cancel()
        timeout = m.rebalance_timeout_ms if m.rebalance_timeout_ms > 0 else self._session_timeout(group.group_id)
        m.rebalance_timer = self._runtime.timer(timeout, self._on_rebalance_expired, group, m.member_id,
                                                m.member_epoch)

    def _on_rebalance_expired(self, group: ConsumerGroup, member_id: str, epoch: int) -> None:
        m = group.members.get(member_id)
        if m is None:
            return
        m.rebalance_timer = None
        if m.state is MemberState.UNREVOKED_PARTITIONS and m.member_epoch == epoch:
            self._fence_now(group, m, "did not revoke its partitions within its rebalance timeout")

    # ------------------------------------------------------------------ migration (KIP-848, "Upgrade and downgrade")
    def _upgrade(self, ps: OffsetsPartition, classic: ClassicGroup, records: list[Record]) -> ConsumerGroup:
        """A live classic group becomes a consumer group: its members stay, as classic members."""
        gid = classic.group_id
        # a rebalance under way ends: its members rejoin, as classic members of the consumer group
        for cm in list(classic.members.values()):
            classic.complete_join(cm, JoinResult(Errors.REBALANCE_IN_PROGRESS, cm.member_id))
            classic.complete_sync(cm, SyncResult(Errors.REBALANCE_IN_PROGRESS))
        group = consumer_group_from_classic(classic, self._images.image)
        self._take_over(ps, gid, group)
        records.append((classic_group_metadata_key(gid), None))
        for mid, m in group.members.items():
            records += [(member_metadata_key(gid, mid), member_metadata_value(m.subscription())),
                        (target_assignment_member_key(gid, mid), target_assignment_member_value(group.targets[mid])),
                        (current_assignment_key(gid, mid), current_assignment_value(m.current_assignment()))]
            self._schedule_session(group, m)
        records += [(group_metadata_key(gid), epoch_value(group.group_epoch)),
                    (target_assignment_metadata_key(gid), epoch_value(group.assignment_epoch))]
        log.info("classic_group_upgraded_to_consumer", group=gid, epoch=group.group_epoch, members=len(group.members))
        return group

    def _maybe_downgrade(self, ps: OffsetsPartition, group: ConsumerGroup, records: list[Record]) -> None:
        """The last consumer-protocol member left: the classic members carry on in a classic group."""
        if not group.members or not all(classic_member(m) for m in group.members.values()) or \
                self.config.consumer_migration_policy not in DOWNGRADE_POLICIES:
            return
        gid = group.group_id
        image = self._images.image
        records += [(k, None) for k in group.tombstone_keys()]
        classic = classic_group_from_consumer(group, image)
        protocol = classic.protocol_name or ""
        rec = GroupMetadataRecord("consumer", classic.generation_id, protocol or None, classic.leader_id,
                                  classic.state_timestamp or -1, [
            MemberRecord(m.member_id, m.group_instance_id, m.client_id, m.client_host, m.rebalance_timeout_ms,
                         m.session_timeout_ms, m.metadata(protocol), m.assignment)
            for m in classic.members.values()])
        records.append((classic_group_metadata_key(gid), group_metadata_value(rec)))
        self._take_over(ps, gid, classic)
        log.info("consumer_group_downgraded_to_classic", group=gid, generation=classic.generation_id,
                 members=classic.size)
        self._downgraded(classic)

    def handle_classic_join(self, ps: OffsetsPartition, group: ConsumerGroup, member_id: str, instance_id: str | None,
                            require_known: bool, client_id: str, client_host: str, rebalance_timeout_ms: int,
                            session_timeout_ms: int, protocols: list[tuple[str, bytes]],
                            respond: JoinCallback) -> None:
        """A classic member's JoinGroup in a consumer group (Kafka's classicGroupJoinToConsumerGroup):
        answered at once with its member epoch as generation and no leader (the coordinator
        assigns); its SyncGroup gets its assignment. A member asked to come back with an id
        (MEMBER_ID_REQUIRED) is not kept meanwhile, as Kafka keeps none for a consumer group. A
        static member joining without a member id replaces the member holding its instance id
        (whatever protocol that one spoke), taking its assignment; with a member id, it must be
        the holder (UNKNOWN_MEMBER_ID, FENCED_INSTANCE_ID)."""
        unknown = not member_id
        if unknown:
            new_id = ClassicGroup.generate_member_id(client_id, instance_id)
            if require_known:
                respond(JoinResult(Errors.MEMBER_ID_REQUIRED, new_id))
                return
            member_id = new_id
        holder = group.static_member(instance_id) if instance_id is not None else None
        if instance_id is not None and not unknown and (holder is None or holder.member_id != member_id):
            code = Errors.UNKNOWN_MEMBER_ID if holder is None else Errors.FENCED_INSTANCE_ID
            log.info("classic_join_refused", group=group.group_id, member=member_id, instance=instance_id,
                     error_code=code)
            respond(JoinResult(code, member_id))
            return
        m = group.members.get(member_id)
        if m is not None and not classic_member(m):
            respond(JoinResult(Errors.INCONSISTENT_GROUP_PROTOCOL, member_id))
            return
        try:
            topics, owned_names = parse_subscription(protocols[0][1]) if protocols else ([], {})
        except ValueError as e:
            log.info("classic_join_refused", group=group.group_id, member=member_id, reason=str(e))
            respond(JoinResult(Errors.INCONSISTENT_GROUP_PROTOCOL, member_id))
            return
        records: list[Record] = []
        gid = group.group_id
        u = rollback.begin(ps, gid, (member_id, holder.member_id if holder is not None else None))
        replaced = None
        if unknown and holder is not None:
            replaced = holder
            m = self._replace_static_member(group, holder, member_id, records)
        is_new = m is None
        if m is None:
            m = ConsumerMember(member_id, member_epoch=0, previous_member_epoch=0)
        before = m.subscription()
        m.instance_id, m.client_id, m.client_host = instance_id, client_id, client_host
        m.rebalance_timeout_ms, m.subscribed_topic_names = rebalance_timeout_ms, tuple(sorted(set(topics)))
        m.classic_session_timeout_ms, m.classic_protocols = session_timeout_ms, [(n, bytes(b)) for n, b in protocols]
        if is_new or m.subscription() != before:
            records.append((member_metadata_key(gid, member_id), member_metadata_value(m.subscription())))
        group.put_member(m)
        self._refresh(group, is_new or m.subscribed_topic_names != before.subscribed_topic_names, member_id, records)
        try:
            self._reconcile(group, m, by_id(self._images.image, owned_names), records)
        except HeartbeatError:
            group.update_assignment(m, 0, m.member_epoch, MemberState.STABLE, {}, {})
            self._reconcile(group, m, {}, records)
        self._schedule_session(group, m)
        group.note_state()
        if replaced is not None and not classic_member(replaced):
            # the last consumer-protocol member replaced by a classic one: the group goes back
            # to classic (Kafka's validateOnlineDowngradeWithReplacedMemberId); the member's
            # SyncGroup then finds the classic group rebalancing and it rejoins there
            self._maybe_downgrade(ps, group, records)
        result = JoinResult(0, member_id, m.member_epoch, "consumer", protocol_name(m), "", False, [])
        joined = m

        def answer(code: int) -> None:
            if not code and ps.groups.get(gid) is group and group.members.get(member_id) is joined:
                # it rejoined; it must SyncGroup within its rebalance timeout (Kafka's sync timeout)
                self._classic_timer(group, joined, "join_timer", None)
                self._classic_timer(group, joined, "sync_timer", "did not SyncGroup within its rebalance timeout")
            respond(result if not code else JoinResult(state_write_error(code), member_id))

        if not records:
            answer(0)
            return
        code, done = self._write(u, records)
        if code:
            answer(code)
            return
        done.add_done_callback(lambda f: answer(f.result()))

    def convert_empty_to_classic(self, ps: OffsetsPartition, group: ConsumerGroup) -> int:
        """An empty consumer group becomes a classic one for a classic member's JoinGroup (its
        records tombstoned, offsets kept): 0, or the error of a write refused at once; a write
        that fails later puts the consumer group back (rollback.py)."""
        gid = group.group_id
        u = rollback.begin(ps, gid)
        keys = group.tombstone_keys()
        self._take_over(ps, gid, ClassicGroup(gid))
        code, _ = self._write(u, [(k, None) for k in keys])
        if not code:
            log.info("consumer_group_converted_to_classic", group=gid)
        return state_write_error(code)

    def classic_sync(self, group: ConsumerGroup, member_id: str, generation_id: int) -> SyncResult:
        m = group.members.get(member_id)
        if m is None or not classic_member(m):
            return SyncResult(Errors.UNKNOWN_MEMBER_ID)
        if generation_id != m.member_epoch:
            return SyncResult(Errors.ILLEGAL_GENERATION)
        self._schedule_session(group, m)
        self._classic_timer(group, m, "sync_timer", None)
        return SyncResult(0, "consumer", protocol_name(m), encode_assignment(by_name(self._images.image, m.assigned)))

    def classic_heartbeat(self, group: ConsumerGroup, member_id: str, generation_id: int) -> int:
        """REBALANCE_IN_PROGRESS while the member is not at the group's epoch with its target: it
        rejoins, and each JoinGroup moves it a step (revoke before assign)."""
        m = group.members.get(member_id)
        if m is None or not classic_member(m):
            return Errors.UNKNOWN_MEMBER_ID
        if generation_id != m.member_epoch:
            return Errors.ILLEGAL_GENERATION
        self._schedule_session(group, m)
        if m.member_epoch != group.group_epoch or m.state is not MemberState.STABLE or \
                group.targets.get(member_id, {}) != m.assigned:
            # it must rejoin within its rebalance timeout (Kafka's join timeout)
            if m.join_timer is None:
                self._classic_timer(group, m, "join_timer", "did not rejoin within its rebalance timeout")
            return Errors.REBALANCE_IN_PROGRESS
        return 0

    def _classic_timer(self, group: ConsumerGroup, m: ConsumerMember, which: str, fence_why: str | None) -> None:
        """Cancel a classic member's join or sync timer, and start it again (its rebalance
        timeout) when `fence_why` is given: when it fires, the member is fenced for that."""
        old = getattr(m, which)
        if old is not None:
            old.cancel()
        timer = None
        if fence_why is not None:
            timeout = m.rebalance_timeout_ms if m.rebalance_timeout_ms > 0 else self._session_timeout(group.group_id)

            def fire(member_id: str = m.member_id) -> None:
                member = group.members.get(member_id)
                if member is not None:
                    setattr(member, which, None)
                    self._fence_now(group, member, fence_why)

            timer = self._runtime.timer(timeout, fire)
        setattr(m, which, timer)

    def classic_leave(self, ps: OffsetsPartition, group: ConsumerGroup,
                      members: list[tuple[str, str | None, str | None]]) -> list[int]:
        out = []
        records: list[Record] = []
        u = rollback.begin(ps, group.group_id, [member_id for member_id, _, _ in members])
        for member_id, instance_id, _ in members:
            m = group.members.get(member_id)
            if m is None and instance_id is not None:
                m = group.static_member(instance_id)
            if m is None:
                out.append(Errors.UNKNOWN_MEMBER_ID)
                continue
            log.info("consumer_group_member_left", group=group.group_id, member=m.member_id, protocol="classic")
            self._fence(group, m, records)
            out.append(0)
        if records:
            self._maybe_downgrade(ps, group, records)
            self._write(u, records)
        return out

    # ------------------------------------------------------------------ describe
    def describe(self, group_id: str) -> tuple[int, str | None, ConsumerGroup | None]:
        if not self.config.consumer_protocol_enabled:
            return Errors.UNSUPPORTED_VERSION, DISABLED_MESSAGE, None
        err, ps = self._runtime.status(group_id, CONSUMER_GROUP_DESCRIBE)
        if err:
            return err, None, None
        assert ps is not None
        group = ps.groups.get(group_id)
        if group is None or group.is_dead:
            return Errors.GROUP_ID_NOT_FOUND, f"Group {group_id} not found.", None
        if not isinstance(group, ConsumerGroup):
            return Errors.GROUP_ID_NOT_FOUND, f"Group {group_id} is not a consumer group.", None
        return 0, None, group


def _subset(owned: Assignment, assigned: Assignment) -> bool:
    return all(parts <= assigned.get(tid, frozenset()) for tid, parts in owned.items())


def new_member_id() -> str:
    """A member id for a v0 member that sent none (v1+ members make their own, KIP-1082)."""
    return str(uuid.uuid4())
