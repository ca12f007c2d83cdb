"""The classic group protocol (Kafka's GroupMetadataManager for classic groups): JoinGroup,
SyncGroup, Heartbeat and LeaveGroup, the rebalances they drive, static membership, and the group
metadata record that makes a generation durable.

Everything runs on the event loop: no locks. Timers are loop.call_later handles run through the
coordinator's runtime (heartbeat expiry per member, the join delay and the sync deadline per
group, pending-member expiry) and kept on the group, which cancels them when it is deleted or
unloaded. A generation is written to the partition leader's log before any await and takes effect
once replicated. Committed offsets are not kept here: the offsets manager (offsets_manager.py)
keeps them for every group type.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from broker.coordinator.group.config import GroupCoordinatorConfig
from broker.coordinator.group.group import (
    UNKNOWN_MEMBER_ID,
    ClassicGroup,
    GroupState,
    JoinCallback,
    JoinResult,
    Member,
    PositionExchange,
    SyncCallback,
    SyncResult,
)
from broker.coordinator.group.records import (
    GroupMetadataRecord,
    MemberRecord,
    group_metadata_key,
    group_metadata_value,
)
from broker.coordinator.group.runtime import (
    DESCRIBE_GROUPS,
    HEARTBEAT,
    JOIN_GROUP,
    LEAVE_GROUP,
    SYNC_GROUP,
    GroupRuntime,
    OffsetsPartition,
)
from broker.coordinator.partitioned import state_write_error
from protocol.errors import Errors

log = structlog.get_logger(__name__)

NEW_MEMBER_JOIN_TIMEOUT_MS = 5 * 60 * 1000  # Kafka's: a new member's JoinGroup waits at most this long
GROUP_OPERATIONS = (1 << 3) | (1 << 6) | (1 << 8)  # READ, DELETE, DESCRIBE: what DescribeGroups reports


@dataclass
class GroupSummary:
    state: str
    protocol_type: str
    protocol: str
    members: list[Member] = field(default_factory=list)
    with_metadata: bool = False


def _classic_group(ps: OffsetsPartition, group_id: str) -> ClassicGroup | None:
    group = ps.groups.get(group_id)
    # every group is classic while no other type exists (a KIP-848 group would answer a classic
    # request by its own rules, or be converted)
    assert group is None or isinstance(group, ClassicGroup), group
    return group


class ClassicGroupManager:
    def __init__(self, config: GroupCoordinatorConfig, runtime: GroupRuntime) -> None:
        self.config = config
        self._runtime = runtime
        self._loop = asyncio.get_running_loop()

    # ------------------------------------------------------------------ loading
    def load(self, ps: OffsetsPartition, records: dict[str, GroupMetadataRecord | None]) -> None:
        """The groups of a partition being loaded, from their last metadata record."""
        for gid, rec in records.items():
            if rec is not None:
                ps.groups[gid] = self._group_from_record(gid, rec)

    def resume(self, ps: OffsetsPartition) -> None:
        """A loaded partition's groups carry on: their members' sessions run from now."""
        for group in ps.groups.values():
            if not isinstance(group, ClassicGroup):
                continue
            if group.size > self.config.max_size:
                self._prepare_rebalance(group, "freshly loaded group is over capacity")
            for m in list(group.members.values()):
                self._schedule_heartbeat(group, m)

    @staticmethod
    def _group_from_record(gid: str, rec: GroupMetadataRecord) -> ClassicGroup:
        protocol = rec.protocol
        members = rec.members if protocol is not None else []
        group = ClassicGroup(gid, GroupState.STABLE if members else GroupState.EMPTY)
        group.generation_id = rec.generation
        group.protocol_type = rec.protocol_type or None
        group.protocol_name = rec.protocol if members else None
        group.leader_id = rec.leader if members else None
        group.state_timestamp = None if rec.current_state_timestamp < 0 else rec.current_state_timestamp
        for mr in members:
            assert protocol is not None  # members is empty without a protocol
            m = Member(mr.member_id, mr.group_instance_id, mr.client_id, mr.client_host, mr.rebalance_timeout_ms,
                       mr.session_timeout_ms, rec.protocol_type, [(protocol, mr.subscription)])
            m.assignment = mr.assignment
            group.add(m)
        if group.leader_id not in group.members:
            group.leader_id = next(iter(group.members), None)
        group.subscribed_topics = group.compute_subscribed_topics()
        return group

    def adopt(self, group: ClassicGroup) -> None:
        """A group made classic again from a consumer group (KIP-848 downgrade): its members'
        sessions run from now, and a rebalance has them rejoin under the classic protocol."""
        for m in group.members.values():
            self._schedule_heartbeat(group, m)
        self._prepare_rebalance(group, "converted from a consumer group")

    # ------------------------------------------------------------------ asked by the offsets manager
    def member_committed(self, group: ClassicGroup, member_id: str) -> None:
        """An accepted offset commit counts as the member's heartbeat (Kafka's rule)."""
        if group.state in (GroupState.STABLE, GroupState.PREPARING_REBALANCE):
            self._schedule_heartbeat(group, group.members[member_id])

    # ------------------------------------------------------------------ writes
    def _store_group(self, group: ClassicGroup, assignment: dict[str, bytes], callback: Callable[[int], None]) -> None:
        """Write the group's metadata (with `assignment`) and call back with the error (Kafka's
        storeGroup mapping) once replicated."""
        members = []
        if group.members:
            protocol = group.protocol_name
            if protocol is None:
                raise RuntimeError(f"group {group.group_id} has members but no protocol")
            members = [
                MemberRecord(m.member_id, m.group_instance_id, m.client_id, m.client_host, m.rebalance_timeout_ms,
                             m.session_timeout_ms, m.metadata(protocol), assignment.get(m.member_id, b""))
                for m in group.members.values()
            ]
        rec = GroupMetadataRecord(
            group.protocol_type or "", group.generation_id, group.protocol_name, group.leader_id,
            group.state_timestamp if group.state_timestamp is not None else -1, members,
        )
        pid = self._runtime.partition_for(group.group_id)
        _, _, done = self._runtime.write(pid, [(group_metadata_key(group.group_id), group_metadata_value(rec))])
        done.add_done_callback(lambda f: callback(state_write_error(f.result())))

    # ------------------------------------------------------------------ timers
    def _schedule_expiration(self, group: ClassicGroup, member: Member, timeout_ms: int) -> None:
        member.cancel_heartbeat()
        member.heartbeat_timer = self._runtime.timer(timeout_ms, self._on_heartbeat_expired, group, member)

    def _schedule_heartbeat(self, group: ClassicGroup, member: Member) -> None:
        self._schedule_expiration(group, member, member.session_timeout_ms)

    def _on_heartbeat_expired(self, group: ClassicGroup, member: Member) -> None:
        member.heartbeat_timer = None
        if group.is_(GroupState.DEAD) or group.members.get(member.member_id) is not member:
            return
        if member.expired_on_heartbeat_timeout():
            log.info("group_member_expired", group=group.group_id, member=member.member_id)
            self._remove_member_and_update_group(group, member, f"member {member.member_id} session expired")

    def _add_pending_member_expiration(self, group: ClassicGroup, member_id: str, timeout_ms: int) -> None:
        old = group.pending_timers.pop(member_id, None)
        if old is not None:
            old.cancel()
        group.pending_timers[member_id] = self._runtime.timer(timeout_ms, self._on_pending_expired, group, member_id)

    def _on_pending_expired(self, group: ClassicGroup, member_id: str) -> None:
        group.pending_timers.pop(member_id, None)
        if group.is_(GroupState.DEAD) or member_id not in group.pending_members:
            return
        log.info("group_pending_member_expired", group=group.group_id, member=member_id)
        self._remove_pending_member_and_update_group(group, member_id)

    def _remove_pending_member_and_update_group(self, group: ClassicGroup, member_id: str) -> None:
        group.remove(member_id)
        handle = group.pending_timers.pop(member_id, None)
        if handle is not None:
            handle.cancel()
        if group.is_(GroupState.PREPARING_REBALANCE):
            self._try_complete_join(group)

    # ------------------------------------------------------------------ rebalance
    def _maybe_prepare_rebalance(self, group: ClassicGroup, reason: str) -> None:
        if group.can_rebalance:
            self._prepare_rebalance(group, reason)

    def _prepare_rebalance(self, group: ClassicGroup, reason: str) -> None:
        if group.is_(GroupState.COMPLETING_REBALANCE):
            self._reset_and_propagate_assignment_error(group, Errors.REBALANCE_IN_PROGRESS)
        self._remove_sync_expiration(group)
        initial = group.is_(GroupState.EMPTY)
        group.transition_to(GroupState.PREPARING_REBALANCE)
        log.info("group_preparing_rebalance", group=group.group_id, generation=group.generation_id, reason=reason)
        if initial:
            delay = self.config.initial_rebalance_delay_ms
            self._schedule_initial_join(group, delay, max(group.rebalance_timeout_ms - delay, 0))
        else:
            self._schedule_delayed_join(group, group.rebalance_timeout_ms)
            self._try_complete_join(group)

    def _set_join_timer(self, group: ClassicGroup, kind: str, delay_ms: int, fn: Callable, *args: Any) -> None:
        if group.join_timer is not None:
            group.join_timer.cancel()
        group.join_kind = kind
        group.join_timer = self._runtime.timer(delay_ms, fn, *args)

    def _schedule_initial_join(self, group: ClassicGroup, delay_ms: int, remaining_ms: int) -> None:
        self._set_join_timer(group, "initial", delay_ms, self._on_initial_join_expired, group, delay_ms, remaining_ms)

    def _on_initial_join_expired(self, group: ClassicGroup, delay_ms: int, remaining_ms: int) -> None:
        group.join_timer = None
        if not group.is_(GroupState.PREPARING_REBALANCE):
            return
        if group.new_member_added and remaining_ms != 0:
            # members keep arriving: wait another delay, within the rebalance timeout
            group.new_member_added = False
            delay = min(self.config.initial_rebalance_delay_ms, remaining_ms)
            self._schedule_initial_join(group, delay, max(remaining_ms - delay_ms, 0))
        else:
            self._on_complete_join(group)

    def _schedule_delayed_join(self, group: ClassicGroup, timeout_ms: int) -> None:
        self._set_join_timer(group, "delayed", timeout_ms, self._on_delayed_join_expired, group)

    def _on_delayed_join_expired(self, group: ClassicGroup) -> None:
        group.join_timer = None
        if group.is_(GroupState.PREPARING_REBALANCE):
            self._on_complete_join(group)

    def _try_complete_join(self, group: ClassicGroup) -> None:
        if (
            group.is_(GroupState.PREPARING_REBALANCE)
            and group.join_kind == "delayed"
            and group.join_timer is not None
            and group.has_all_members_joined
        ):
            self._on_complete_join(group)

    def _on_complete_join(self, group: ClassicGroup) -> None:
        if group.join_timer is not None:
            group.join_timer.cancel()
            group.join_timer = None
        for m in group.not_yet_rejoined_members():
            if not m.is_static:
                group.remove(m.member_id)
                m.cancel_heartbeat()
        if group.is_(GroupState.DEAD):
            return
        if not group.maybe_elect_new_joined_leader() and group.members:
            # nobody rejoined: wait again, until session expiry removes the silent members
            log.warning("group_rebalance_without_members", group=group.group_id)
            self._schedule_delayed_join(group, group.rebalance_timeout_ms)
            return
        group.init_next_generation()
        if group.is_(GroupState.EMPTY):
            log.info("group_empty", group=group.group_id, generation=group.generation_id)

            def stored(error: int) -> None:
                if error:
                    log.warning("group_empty_metadata_not_stored", group=group.group_id, error_code=error)

            self._store_group(group, {}, stored)
            return
        log.info("group_stabilizing", group=group.group_id, generation=group.generation_id,
                 protocol=group.protocol_name, members=group.size)
        for m in list(group.members.values()):
            result = JoinResult(
                0, m.member_id, group.generation_id, group.protocol_type, group.protocol_name, group.leader_id or "",
                False, group.current_member_metadata() if group.is_leader(m.member_id) else [],
            )
            group.complete_join(m, result)
            self._schedule_heartbeat(group, m)
            m.is_new = False
            group.pending_sync_members.add(m.member_id)
        self._schedule_pending_sync(group)

    def _schedule_pending_sync(self, group: ClassicGroup) -> None:
        if group.sync_timer is not None:
            group.sync_timer.cancel()
        group.sync_timer = self._runtime.timer(group.rebalance_timeout_ms, self._on_sync_expired, group, group.generation_id)

    def _maybe_complete_sync_expiration(self, group: ClassicGroup) -> None:
        if group.sync_timer is not None and (
            group.state in (GroupState.DEAD, GroupState.EMPTY, GroupState.PREPARING_REBALANCE)
            or not group.pending_sync_members
        ):
            group.sync_timer.cancel()
            group.sync_timer = None

    def _remove_sync_expiration(self, group: ClassicGroup) -> None:
        group.pending_sync_members.clear()
        self._maybe_complete_sync_expiration(group)

    def _remove_pending_sync_member(self, group: ClassicGroup, member_id: str) -> None:
        group.pending_sync_members.discard(member_id)
        self._maybe_complete_sync_expiration(group)

    def _on_sync_expired(self, group: ClassicGroup, generation: int) -> None:
        group.sync_timer = None
        if generation != group.generation_id:
            return
        if group.state in (GroupState.COMPLETING_REBALANCE, GroupState.STABLE) and group.pending_sync_members:
            missing = sorted(group.pending_sync_members)
            for mid in missing:
                m = group.remove(mid)
                if m is not None:
                    m.cancel_heartbeat()
            self._prepare_rebalance(group, f"members {missing} sent no SyncGroup in time")

    def _set_and_propagate_assignment(self, group: ClassicGroup, assignment: dict[str, bytes]) -> None:
        for m in group.members.values():
            m.assignment = assignment.get(m.member_id, b"")
        self._propagate_assignment(group, 0)

    def _reset_and_propagate_assignment_error(self, group: ClassicGroup, error: int) -> None:
        for m in group.members.values():
            m.assignment = b""
        self._propagate_assignment(group, error)

    def _propagate_assignment(self, group: ClassicGroup, error: int) -> None:
        ptype, pname = (group.protocol_type, group.protocol_name) if error == 0 else (None, None)
        for m in list(group.members.values()):
            if group.complete_sync(m, SyncResult(error, ptype, pname, m.assignment)):
                self._schedule_heartbeat(group, m)

    def _remove_member_and_update_group(self, group: ClassicGroup, member: Member, reason: str) -> None:
        group.complete_join(member, JoinResult(Errors.UNKNOWN_MEMBER_ID, UNKNOWN_MEMBER_ID))
        group.remove(member.member_id)
        member.cancel_heartbeat()
        if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._maybe_prepare_rebalance(group, reason)
        elif group.is_(GroupState.PREPARING_REBALANCE):
            self._try_complete_join(group)

    # ------------------------------------------------------------------ JoinGroup
    async def join_group(
        self,
        group_id: str,
        member_id: str,
        group_instance_id: str | None,
        *,
        require_known_member_id: bool,
        support_skip_assignment: bool,
        client_id: str,
        client_host: str,
        rebalance_timeout_ms: int,
        session_timeout_ms: int,
        protocol_type: str,
        protocols: list[tuple[str, bytes]],
        reason: str | None = None,
    ) -> JoinResult:
        fut = self._loop.create_future()

        def respond(result: JoinResult) -> None:
            if not fut.done():
                fut.set_result(result)

        self.handle_join_group(group_id, member_id, group_instance_id, require_known_member_id,
                               support_skip_assignment, client_id, client_host, rebalance_timeout_ms,
                               session_timeout_ms, protocol_type, [(n, bytes(m)) for n, m in protocols], respond,
                               reason or "not provided")
        return await fut

    def handle_join_group(
        self, group_id: str, member_id: str, instance_id: str | None, require_known: bool, support_skip: bool,
        client_id: str, client_host: str, rebalance_timeout_ms: int, session_timeout_ms: int, protocol_type: str,
        protocols: list[tuple[str, bytes]], respond: JoinCallback, reason: str,
    ) -> None:
        err, ps = self._runtime.status(group_id, JOIN_GROUP)
        if err:
            respond(JoinResult(err, member_id))
            return
        assert ps is not None
        cfg = self.config
        if not cfg.min_session_timeout_ms <= session_timeout_ms <= cfg.max_session_timeout_ms:
            respond(JoinResult(Errors.INVALID_SESSION_TIMEOUT, member_id))
            return
        unknown = member_id == UNKNOWN_MEMBER_ID
        group = _classic_group(ps, group_id)
        if group is None:
            if not unknown:
                respond(JoinResult(Errors.UNKNOWN_MEMBER_ID, member_id))
                return
            group = ps.groups[group_id] = ClassicGroup(group_id, GroupState.EMPTY)
        args = (instance_id, client_id, client_host, rebalance_timeout_ms, session_timeout_ms, protocol_type, protocols,
                respond, reason)
        if not self._accept_joining_member(group, member_id):
            m = group.remove(member_id)
            if m is not None:
                m.cancel_heartbeat()
            respond(JoinResult(Errors.GROUP_MAX_SIZE_REACHED, UNKNOWN_MEMBER_ID))
        elif unknown:
            self._do_new_member_join(group, require_known, support_skip, *args)
        else:
            self._do_current_member_join(group, member_id, *args)
        if group.is_(GroupState.PREPARING_REBALANCE):
            self._try_complete_join(group)

    def _accept_joining_member(self, group: ClassicGroup, member_id: str) -> bool:
        max_size = self.config.max_size
        if group.state in (GroupState.EMPTY, GroupState.DEAD):
            return True
        if group.is_(GroupState.PREPARING_REBALANCE):
            m = group.members.get(member_id)
            return (m is not None and m.awaiting_join) or group.num_awaiting_join < max_size
        return group.has(member_id) or group.size < max_size

    def _do_new_member_join(
        self, group: ClassicGroup, require_known: bool, support_skip: bool, instance_id: str | None, client_id: str,
        client_host: str, rebalance_timeout_ms: int, session_timeout_ms: int, protocol_type: str,
        protocols: list[tuple[str, bytes]], respond: JoinCallback, reason: str,
    ) -> None:
        if group.is_(GroupState.DEAD):
            respond(JoinResult(Errors.COORDINATOR_NOT_AVAILABLE, UNKNOWN_MEMBER_ID))
            return
        if not group.supports_protocols(protocol_type, {n for n, _ in protocols}):
            respond(JoinResult(Errors.INCONSISTENT_GROUP_PROTOCOL, UNKNOWN_MEMBER_ID))
            return
        new_id = group.generate_member_id(client_id, instance_id)
        if instance_id is not None:
            old_id = group.current_static_member_id(instance_id)
            if old_id is not None:
                log.info("group_static_member_rejoined", group=group.group_id, instance=instance_id,
                         old_member=old_id, member=new_id, state=group.state.value)
                self._update_static_member_and_rebalance(group, old_id, new_id, instance_id, protocols,
                                                         rebalance_timeout_ms, session_timeout_ms, respond,
                                                         support_skip, reason)
            else:
                self._add_member_and_rebalance(group, new_id, instance_id, client_id, client_host,
                                               rebalance_timeout_ms, session_timeout_ms, protocol_type, protocols,
                                               respond, reason)
        elif require_known:
            group.add_pending_member(new_id)
            self._add_pending_member_expiration(group, new_id, session_timeout_ms)
            respond(JoinResult(Errors.MEMBER_ID_REQUIRED, new_id))
        else:
            self._add_member_and_rebalance(group, new_id, None, client_id, client_host, rebalance_timeout_ms,
                                           session_timeout_ms, protocol_type, protocols, respond, reason)

    def _do_current_member_join(
        self, group: ClassicGroup, member_id: str, instance_id: str | None, client_id: str, client_host: str,
        rebalance_timeout_ms: int, session_timeout_ms: int, protocol_type: str, protocols: list[tuple[str, bytes]],
        respond: JoinCallback, reason: str,
    ) -> None:
        if group.is_(GroupState.DEAD):
            respond(JoinResult(Errors.COORDINATOR_NOT_AVAILABLE, member_id))
            return
        if not group.supports_protocols(protocol_type, {n for n, _ in protocols}):
            respond(JoinResult(Errors.INCONSISTENT_GROUP_PROTOCOL, member_id))
            return
        if member_id in group.pending_members:
            if instance_id is not None:
                respond(JoinResult(Errors.INVALID_REQUEST, member_id))  # a pending member is never static
                return
            handle = group.pending_timers.pop(member_id, None)
            if handle is not None:
                handle.cancel()
            self._add_member_and_rebalance(group, member_id, None, client_id, client_host, rebalance_timeout_ms,
                                           session_timeout_ms, protocol_type, protocols, respond, reason)
            return
        err = group.validate_member(member_id, instance_id)
        if err:
            respond(JoinResult(err, member_id))
            return
        member = group.members[member_id]
        state = group.state
        why = f"member {member_id} rejoined in {state.value} ({reason})"
        if state is GroupState.PREPARING_REBALANCE:
            self._update_member_and_rebalance(group, member, protocols, rebalance_timeout_ms, session_timeout_ms,
                                              why, respond)
        elif state is GroupState.COMPLETING_REBALANCE:
            if member.matches(protocols):
                # the member missed its JoinGroup answer: the current generation again
                respond(JoinResult(
                    0, member_id, group.generation_id, group.protocol_type, group.protocol_name, group.leader_id or "",
                    False, group.current_member_metadata() if group.is_leader(member_id) else [],
                ))
            else:
                self._update_member_and_rebalance(group, member, protocols, rebalance_timeout_ms, session_timeout_ms,
                                                  why, respond)
        elif state is GroupState.STABLE:
            if group.is_leader(member_id) or not member.matches(protocols):
                # a leader's JoinGroup forces a rebalance (it may have seen metadata change)
                self._update_member_and_rebalance(group, member, protocols, rebalance_timeout_ms,
                                                  session_timeout_ms, why, respond)
            else:
                respond(JoinResult(0, member_id, group.generation_id, group.protocol_type, group.protocol_name,
                                   group.leader_id or ""))
        else:
            respond(JoinResult(Errors.UNKNOWN_MEMBER_ID, member_id))

    def _add_member_and_rebalance(
        self, group: ClassicGroup, member_id: str, instance_id: str | None, client_id: str, client_host: str,
        rebalance_timeout_ms: int, session_timeout_ms: int, protocol_type: str, protocols: list[tuple[str, bytes]],
        respond: JoinCallback, reason: str,
    ) -> None:
        member = Member(member_id, instance_id, client_id, client_host, rebalance_timeout_ms, session_timeout_ms,
                        protocol_type, protocols)
        member.is_new = True
        if group.is_(GroupState.PREPARING_REBALANCE) and group.generation_id == 0:
            group.new_member_added = True
        group.add(member, respond)
        # a new member cannot heartbeat while its JoinGroup waits: bound that wait instead
        self._schedule_expiration(group, member, NEW_MEMBER_JOIN_TIMEOUT_MS)
        self._maybe_prepare_rebalance(group, f"new member {member_id} joined ({reason})")

    def _update_member_and_rebalance(
        self, group: ClassicGroup, member: Member, protocols: list[tuple[str, bytes]], rebalance_timeout_ms: int,
        session_timeout_ms: int, reason: str, respond: JoinCallback,
    ) -> None:
        group.update_member(member, protocols, rebalance_timeout_ms, session_timeout_ms, respond)
        self._maybe_prepare_rebalance(group, reason)

    def _update_static_member_and_rebalance(
        self, group: ClassicGroup, old_id: str, new_id: str, instance_id: str, protocols: list[tuple[str, bytes]],
        rebalance_timeout_ms: int, session_timeout_ms: int, respond: JoinCallback, support_skip: bool, reason: str,
    ) -> None:
        current_leader = group.leader_id
        member = group.replace_static_member(instance_id, old_id, new_id)
        self._schedule_heartbeat(group, member)
        old_protocols = list(member.protocols)
        old_rebalance, old_session = member.rebalance_timeout_ms, member.session_timeout_ms
        group.update_member(member, protocols, rebalance_timeout_ms, session_timeout_ms, respond)
        state = group.state
        if state is GroupState.STABLE:
            if group.protocol_name == group.select_protocol():
                # nothing the assignment depends on changed: persist the new member id, no rebalance
                generation = group.generation_id
                assignment = {m.member_id: m.assignment for m in group.members.values()}

                def stored(error: int) -> None:
                    if error:
                        log.warning("group_static_member_not_stored", group=group.group_id, error_code=error)
                        if group.members.get(new_id) is member:
                            group.update_member(member, old_protocols, old_rebalance, old_session, None)
                            group.replace_static_member(instance_id, new_id, old_id)
                            self._schedule_heartbeat(group, member)
                        respond(JoinResult(error, UNKNOWN_MEMBER_ID, group.generation_id, group.protocol_type,
                                           group.protocol_name, current_leader or ""))
                        return
                    if not member.awaiting_join or not group.is_(GroupState.STABLE):
                        return  # a rebalance started meanwhile: it answers this JoinGroup
                    is_leader = group.is_leader(new_id)
                    if support_skip:
                        # v9+: the leader learns it leads, but must not assign (the group is stable)
                        result = JoinResult(0, new_id, generation, group.protocol_type, group.protocol_name,
                                            group.leader_id or "", is_leader,
                                            group.current_member_metadata() if is_leader else [])
                    else:
                        # older clients: name the old leader id, so a returning leader does not assign
                        result = JoinResult(0, new_id, generation, group.protocol_type, group.protocol_name,
                                            current_leader or "")
                    group.complete_join(member, result)

                self._store_group(group, assignment, stored)
            else:
                self._maybe_prepare_rebalance(group, f"static member {instance_id} rejoined with other protocols")
        elif state is GroupState.COMPLETING_REBALANCE:
            self._prepare_rebalance(group, f"static member {instance_id} rejoined during CompletingRebalance")
        # PreparingRebalance: it simply waits in the rebalance under way

    # ------------------------------------------------------------------ SyncGroup
    async def sync_group(
        self, group_id: str, generation_id: int, member_id: str, protocol_type: str | None,
        protocol_name: str | None, group_instance_id: str | None, assignments: dict[str, bytes],
    ) -> SyncResult:
        fut = self._loop.create_future()

        def respond(result: SyncResult) -> None:
            if not fut.done():
                fut.set_result(result)

        self.handle_sync_group(group_id, generation_id, member_id, protocol_type, protocol_name, group_instance_id,
                               assignments, respond)
        return await fut

    def handle_sync_group(
        self, group_id: str, generation_id: int, member_id: str, protocol_type: str | None,
        protocol_name: str | None, instance_id: str | None, assignments: dict[str, bytes], respond: SyncCallback,
    ) -> None:
        err, ps = self._runtime.status(group_id, SYNC_GROUP)
        if err == Errors.COORDINATOR_LOAD_IN_PROGRESS:
            # the rebalance state was lost with the old coordinator: have the member rejoin
            respond(SyncResult(Errors.REBALANCE_IN_PROGRESS))
            return
        if err:
            respond(SyncResult(err))
            return
        assert ps is not None
        group = _classic_group(ps, group_id)
        if group is None:
            respond(SyncResult(Errors.UNKNOWN_MEMBER_ID))
            return
        if group.is_(GroupState.DEAD):
            respond(SyncResult(Errors.COORDINATOR_NOT_AVAILABLE))
            return
        err = group.validate_member(member_id, instance_id)
        if not err and generation_id != group.generation_id:
            err = Errors.ILLEGAL_GENERATION
        if not err and protocol_type is not None and group.protocol_type != protocol_type:
            err = Errors.INCONSISTENT_GROUP_PROTOCOL
        if not err and protocol_name is not None and group.protocol_name != protocol_name:
            err = Errors.INCONSISTENT_GROUP_PROTOCOL
        if err:
            respond(SyncResult(err))
            return
        state = group.state
        if state is GroupState.EMPTY:
            respond(SyncResult(Errors.UNKNOWN_MEMBER_ID))
        elif state is GroupState.PREPARING_REBALANCE:
            respond(SyncResult(Errors.REBALANCE_IN_PROGRESS))
        elif state is GroupState.COMPLETING_REBALANCE:
            member = group.members[member_id]
            member.sync_callback = respond
            self._remove_pending_sync_member(group, member_id)
            if group.is_leader(member_id):
                log.info("group_assignment_received", group=group.group_id, generation=group.generation_id,
                         members=group.size)
                assignment = {mid: assignments.get(mid, b"") for mid in group.members}
                generation = group.generation_id

                def stored(error: int) -> None:
                    if group.is_(GroupState.COMPLETING_REBALANCE) and generation == group.generation_id:
                        if error:
                            self._reset_and_propagate_assignment_error(group, error)
                            self._maybe_prepare_rebalance(group, f"storing the assignment failed ({error})")
                        else:
                            self._set_and_propagate_assignment(group, assignment)
                            group.transition_to(GroupState.STABLE)
                            log.info("group_stable", group=group.group_id, generation=generation, members=group.size)

                self._store_group(group, assignment, stored)
        else:  # Stable
            member = group.members[member_id]
            self._remove_pending_sync_member(group, member_id)
            respond(SyncResult(0, group.protocol_type, group.protocol_name, member.assignment))
            self._schedule_heartbeat(group, member)

    # ------------------------------------------------------------------ Heartbeat
    def heartbeat(self, group_id: str, member_id: str, instance_id: str | None, generation_id: int,
                  positions: PositionExchange | None = None) -> int:
        """`positions`, when given, is a PositionExchange (KIP-253): filled in on success."""
        err, ps = self._runtime.status(group_id, HEARTBEAT)
        if err == Errors.COORDINATOR_LOAD_IN_PROGRESS:
            return 0  # as Kafka: answer blindly while loading
        if err:
            return err
        assert ps is not None
        group = _classic_group(ps, group_id)
        if group is None:
            return Errors.UNKNOWN_MEMBER_ID
        if group.is_(GroupState.DEAD):
            return Errors.COORDINATOR_NOT_AVAILABLE
        err = group.validate_member(member_id, instance_id)
        if err:
            return err
        if generation_id != group.generation_id:
            return Errors.ILLEGAL_GENERATION
        if group.is_(GroupState.EMPTY):
            return Errors.UNKNOWN_MEMBER_ID
        self._schedule_heartbeat(group, group.members[member_id])
        if positions is not None:
            positions.answer, positions.wanted = group.exchange_positions(
                member_id, positions.reported, positions.interested
            )
        return Errors.REBALANCE_IN_PROGRESS if group.is_(GroupState.PREPARING_REBALANCE) else 0

    # ------------------------------------------------------------------ LeaveGroup
    def leave_group(self, group_id: str, members: list[tuple[str, str | None, str | None]]) -> tuple[int, list[int]]:
        """members: (member id, instance id, reason). Returns (group error, one error per member)."""
        err, ps = self._runtime.status(group_id, LEAVE_GROUP)
        if err:
            return err, []
        assert ps is not None
        group = _classic_group(ps, group_id)
        if group is None:
            return 0, [Errors.UNKNOWN_MEMBER_ID] * len(members)
        if group.is_(GroupState.DEAD):
            return Errors.COORDINATOR_NOT_AVAILABLE, []
        out = []
        for member_id, instance_id, reason in members:
            why = f"member left ({reason or 'no reason given'})"
            if member_id == UNKNOWN_MEMBER_ID:
                current = group.current_static_member_id(instance_id) if instance_id is not None else None
                if current is None:
                    out.append(Errors.UNKNOWN_MEMBER_ID)
                else:
                    self._remove_member_and_update_group(group, group.members[current], why)
                    out.append(0)
            elif member_id in group.pending_members:
                self._remove_pending_member_and_update_group(group, member_id)
                out.append(0)
            else:
                e = group.validate_member(member_id, instance_id)
                if not e:
                    log.info("group_member_left", group=group_id, member=member_id, reason=reason)
                    self._remove_member_and_update_group(group, group.members[member_id], why)
                out.append(e)
        return 0, out

    # ------------------------------------------------------------------ DescribeGroups
    def describe_group(self, group_id: str) -> tuple[int, GroupSummary | None]:
        """(error, summary); summary None for an unknown group."""
        err, ps = self._runtime.status(group_id, DESCRIBE_GROUPS)
        if err:
            return err, GroupSummary("", "", "")
        assert ps is not None
        group = _classic_group(ps, group_id)
        if group is None:
            return 0, None
        if group.is_(GroupState.STABLE):
            return 0, GroupSummary(group.state.value, group.protocol_type or "", group.protocol_name or "",
                                   list(group.members.values()), with_metadata=True)
        return 0, GroupSummary(group.state.value, group.protocol_type or "", "", list(group.members.values()))
