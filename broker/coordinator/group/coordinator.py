"""The classic group coordinator (Kafka's GroupCoordinator + GroupMetadataManager, in one loop).

A group lives in partition abs(hash(group id)) % N of __consumer_offsets, and the leader of that
partition coordinates it. When this broker becomes a partition's leader the partition is loaded
(its log scanned in an executor: offsets and group metadata, last record wins, tombstones delete)
and until that is done its groups answer COORDINATOR_LOAD_IN_PROGRESS; when leadership goes, its
groups are unloaded (waiting requests answer NOT_COORDINATOR). Groups of partitions we do not lead
answer NOT_COORDINATOR.

State changes are written to the partition leader's log first (append before any await, so the
log order is the decision order) and take effect once the high watermark passes them (acks=all),
bounded by offsets.commit.timeout.ms. Everything runs on the event loop: no locks; timers are
loop.call_later handles owned here (heartbeat expiry per member, the join delay and the sync
deadline per group, pending-member expiry).
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import structlog

from broker.coordinator import wall_clock_ms
from broker.coordinator.group.config import GroupCoordinatorConfig
from broker.coordinator.group.group import (
    UNKNOWN_MEMBER_ID,
    ClassicGroup,
    GroupState,
    JoinCallback,
    JoinResult,
    Member,
    SyncCallback,
    SyncResult,
)
from broker.coordinator.group.records import (
    OFFSETS_TOPIC,
    GroupMetadataKey,
    GroupMetadataRecord,
    MemberRecord,
    OffsetAndMetadata,
    OffsetCommitKey,
    RecordFormatError,
    decode_group_metadata_value,
    decode_key,
    decode_offset_commit_value,
    group_metadata_key,
    group_metadata_value,
    offset_commit_key,
    offset_commit_value,
    partition_for,
)
from broker.coordinator.internal_topic import create_internal_topic
from broker.coordinator.partitioned import (
    CoordinatorPartition,
    PartitionedCoordinator,
    log_batches,
    state_write_error,
)
from protocol.errors import Errors

log = structlog.get_logger(__name__)

NEW_MEMBER_JOIN_TIMEOUT_MS = 5 * 60 * 1000  # Kafka's: a new member's JoinGroup waits at most this long
CLASSIC = "classic"
GROUP_OPERATIONS = (1 << 3) | (1 << 6) | (1 << 8)  # READ, DELETE, DESCRIBE: what DescribeGroups reports

# API keys, for the per-API group id rule
OFFSET_COMMIT, OFFSET_FETCH, JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP = 8, 9, 11, 12, 13, 14
DESCRIBE_GROUPS, DELETE_GROUPS, OFFSET_DELETE = 15, 42, 47
_EMPTY_ID_ALLOWED = {OFFSET_COMMIT, OFFSET_FETCH, DESCRIBE_GROUPS, DELETE_GROUPS}

TopicPartition = tuple[str, int]


@dataclass
class GroupSummary:
    state: str
    protocol_type: str
    protocol: str
    members: list[Member] = field(default_factory=list)
    with_metadata: bool = False


class _PartitionState(CoordinatorPartition):
    """One __consumer_offsets partition this broker leads."""

    def __init__(self, index: int, epoch: int) -> None:
        super().__init__(index, epoch)
        self.groups: dict[str, ClassicGroup] = {}
        # transactions that ended while loading: (producer id, commit, log end offset then)
        self.completed_while_loading: list[tuple[int, bool, int]] = []


@dataclass
class LoadedPartition:
    groups: dict[str, GroupMetadataRecord | None]
    offsets: dict[str, dict[TopicPartition, tuple[OffsetAndMetadata, int]]]
    records: int = 0
    end_offset: int = 0
    # transactional offset commits whose transaction has not ended yet:
    # producer id -> (group, topic, partition) -> (offset, record offset)
    pending_txn: dict[int, dict[tuple[str, str, int], tuple[OffsetAndMetadata | None, int]]] = field(
        default_factory=dict)


def read_partition(lg: Any, max_bytes: int) -> LoadedPartition:
    """Scan a __consumer_offsets log from its start to its end (runs in an executor). Transactional
    offset commits count once their commit marker follows; aborted ones never; those without a
    marker yet stay pending."""
    groups: dict[str, GroupMetadataRecord | None] = {}
    offsets: dict[str, dict[TopicPartition, tuple[OffsetAndMetadata, int]]] = {}
    pending_txn: dict[int, dict[tuple[str, str, int], tuple[OffsetAndMetadata | None, int]]] = {}
    offset = lg.log_start_offset
    count = 0

    def apply_offset(group: str, tp: TopicPartition, value: OffsetAndMetadata | None, rec_offset: int) -> None:
        per = offsets.setdefault(group, {})
        if value is None:
            per.pop(tp, None)
        else:
            cur = per.get(tp)
            if cur is None or cur[1] < rec_offset:
                per[tp] = (value, rec_offset)

    for b in log_batches(lg, max_bytes):
        h = b.header
        if h.is_control:
            pend = pending_txn.pop(h.producer_id, {})
            rec = b.records[0] if b.records else None
            if rec is not None and rec.key is not None and len(rec.key) >= 4:
                if struct.unpack_from(">h", rec.key, 2)[0] == 1:  # COMMIT marker
                    for (g, t, p), (value, rec_offset) in pend.items():
                        apply_offset(g, (t, p), value, rec_offset)
        else:
            for r in b.records:
                count += 1
                try:
                    key = decode_key(r.key)
                    if isinstance(key, OffsetCommitKey):
                        value = None if r.value is None else decode_offset_commit_value(r.value)
                        if h.is_transactional:
                            pending_txn.setdefault(h.producer_id, {})[(key.group, key.topic, key.partition)] = (value, r.offset)
                        else:
                            apply_offset(key.group, (key.topic, key.partition), value, r.offset)
                    elif isinstance(key, GroupMetadataKey):
                        groups[key.group] = None if r.value is None else decode_group_metadata_value(r.value)
                except RecordFormatError as e:
                    log.warning("offsets_record_skipped", offset=r.offset, error=str(e))
        offset = h.base_offset + h.last_offset_delta + 1
    return LoadedPartition(groups, offsets, count, offset, pending_txn)


class GroupCoordinator(PartitionedCoordinator[_PartitionState]):
    topic = OFFSETS_TOPIC
    event = "group"

    def __init__(self, broker: Any, config: GroupCoordinatorConfig | None = None) -> None:
        """`broker` gives: replicas (ReplicaManager), metadata.image, config (node_id, props,
        listener), forward(body) and spawn(coro). The coordinator registers itself as a
        leadership listener of the replica manager and loads the partitions it already leads."""
        self.config = config or GroupCoordinatorConfig.from_props(broker.config.props)
        self.broker = broker
        super().__init__(broker.replicas, broker.metadata, self.config.offsets_topic_num_partitions, self.config.load_buffer_size,
                         self.config.offset_commit_timeout_ms)
        self.node_id = broker.config.node_id
        self._every(self.config.offsets_retention_check_interval_ms, self.expire_offsets, "offsets_expiry_failed")
        self._watch_leadership()

    # ------------------------------------------------------------------ partitions
    def partition_for(self, group_id: str) -> int:
        return partition_for(group_id, self.num_partitions())

    def _new_partition(self, index: int, epoch: int) -> _PartitionState:
        return _PartitionState(index, epoch)

    _read_partition = staticmethod(read_partition)

    def _apply_loaded(self, ps: _PartitionState, loaded: LoadedPartition, started: float) -> None:
        for gid, rec in loaded.groups.items():
            if rec is not None:
                ps.groups[gid] = self._group_from_record(gid, rec)
        for gid, offs in loaded.offsets.items():
            if not offs:
                continue
            group = ps.groups.get(gid)
            if group is None:
                group = ps.groups[gid] = ClassicGroup(gid, GroupState.EMPTY)
            for tp, (value, rec_offset) in offs.items():
                group.apply_offset(tp, value, rec_offset)
        for producer_id, pend in loaded.pending_txn.items():
            for (gid, topic, partition), (value, rec_offset) in pend.items():
                if value is None:
                    continue
                group = ps.groups.get(gid)
                if group is None:
                    group = ps.groups[gid] = ClassicGroup(gid, GroupState.EMPTY)
                group.add_pending_txn_offset(producer_id, (topic, partition), value, rec_offset)
        ps.loading = False
        for producer_id, commit, end in ps.completed_while_loading:
            for group in ps.groups.values():
                group.complete_txn_offsets(producer_id, commit, end)
        ps.completed_while_loading.clear()
        for group in ps.groups.values():
            if group.size > self.config.max_size:
                self._prepare_rebalance(group, "freshly loaded group is over capacity")
            for m in list(group.members.values()):
                self._schedule_heartbeat(group, m)
        log.info("group_partition_loaded", partition=ps.index, epoch=ps.epoch, groups=len(ps.groups),
                 records=loaded.records, end_offset=loaded.end_offset,
                 ms=round((time.monotonic() - started) * 1000))

    def _group_from_record(self, gid: str, rec: GroupMetadataRecord) -> ClassicGroup:
        members = rec.members if rec.protocol is not None else []
        group = ClassicGroup(gid, GroupState.STABLE if members else GroupState.EMPTY)
        group.generation_id = rec.generation
        group.protocol_type = rec.protocol_type or None
        group.protocol_name = rec.protocol if members else None
        group.leader_id = rec.leader if members else None
        group.state_timestamp = None if rec.current_state_timestamp < 0 else rec.current_state_timestamp
        for mr in members:
            m = Member(mr.member_id, mr.group_instance_id, mr.client_id, mr.client_host, mr.rebalance_timeout_ms,
                       mr.session_timeout_ms, rec.protocol_type, [(rec.protocol, mr.subscription)])
            m.assignment = mr.assignment
            group.add(m)
        if group.leader_id not in group.members:
            group.leader_id = next(iter(group.members), None)
        group.subscribed_topics = group.compute_subscribed_topics()
        return group

    def _forget(self, ps: _PartitionState) -> None:
        for group in ps.groups.values():
            self._on_group_unloaded(group)
        ps.groups.clear()

    def _on_group_unloaded(self, group: ClassicGroup) -> None:
        previous = group.state
        group.transition_to(GroupState.DEAD)
        if previous is GroupState.PREPARING_REBALANCE:
            for m in list(group.members.values()):
                group.complete_join(m, JoinResult(Errors.NOT_COORDINATOR, m.member_id))
        elif previous in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            for m in list(group.members.values()):
                group.complete_sync(m, SyncResult(Errors.NOT_COORDINATOR))
        self._cancel_group_timers(group)

    def _cancel_group_timers(self, group: ClassicGroup) -> None:
        for handle in (group.join_timer, group.sync_timer, *group.pending_timers.values()):
            if handle is not None:
                handle.cancel()
        group.join_timer = group.sync_timer = None
        group.pending_timers.clear()
        for m in group.members.values():
            self._cancel_heartbeat(m)

    # ------------------------------------------------------------------ status
    def _status(self, group_id: str | None, api: int) -> tuple[int, _PartitionState | None]:
        if group_id is None or (group_id == "" and api not in _EMPTY_ID_ALLOWED):
            return Errors.INVALID_GROUP_ID, None
        return self._partition_status(group_id)

    def groups(self) -> list[ClassicGroup]:
        return [g for ps in self._partitions.values() if not ps.loading for g in ps.groups.values()]

    # ------------------------------------------------------------------ writes
    def _write(self, pid: int, records: list[tuple[bytes, bytes | None]],
               producer: tuple[int, int] | None = None) -> tuple[int, int, asyncio.Future]:
        """_append to partition `pid` (NOT_LEADER_OR_FOLLOWER when it is not ours and loaded)."""
        ps = self._partitions.get(pid)
        if ps is None:
            done = self._loop.create_future()
            done.set_result(Errors.NOT_LEADER_OR_FOLLOWER)
            return Errors.NOT_LEADER_OR_FOLLOWER, -1, done
        return self._append(ps, records, producer)

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
        pid = self.partition_for(group.group_id)
        _, _, done = self._write(pid, [(group_metadata_key(group.group_id), group_metadata_value(rec))])
        done.add_done_callback(lambda f: callback(state_write_error(f.result())))

    def _append_tombstones(self, pid: int, keys: list[bytes]) -> None:
        """Deletions (DeleteGroups, OffsetDelete, expiry): appended locally without waiting for
        replication, as Kafka does; the cache forgets the entries at once either way."""
        if keys:
            err, _, _ = self._write(pid, [(k, None) for k in keys])
            if err:
                log.warning("offsets_tombstones_not_written", partition=pid, error_code=err, count=len(keys))

    # ------------------------------------------------------------------ timers
    def _schedule_expiration(self, group: ClassicGroup, member: Member, timeout_ms: int) -> None:
        self._cancel_heartbeat(member)
        member.heartbeat_timer = self._timer(timeout_ms, self._on_heartbeat_expired, group, member)

    def _schedule_heartbeat(self, group: ClassicGroup, member: Member) -> None:
        self._schedule_expiration(group, member, member.session_timeout_ms)

    @staticmethod
    def _cancel_heartbeat(member: Member) -> None:
        if member.heartbeat_timer is not None:
            member.heartbeat_timer.cancel()
            member.heartbeat_timer = None

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
        group.pending_timers[member_id] = self._timer(timeout_ms, self._on_pending_expired, group, member_id)

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
        group.join_timer = self._timer(delay_ms, fn, *args)

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
                self._cancel_heartbeat(m)
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
        group.sync_timer = self._timer(group.rebalance_timeout_ms, self._on_sync_expired, group, group.generation_id)

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
                    self._cancel_heartbeat(m)
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
        self._cancel_heartbeat(member)
        if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._maybe_prepare_rebalance(group, reason)
        elif group.is_(GroupState.PREPARING_REBALANCE):
            self._try_complete_join(group)

    @staticmethod
    def _validate_current_member(group: ClassicGroup, member_id: str, instance_id: str | None) -> int:
        if instance_id is not None:
            current = group.current_static_member_id(instance_id)
            if current is None:
                return Errors.UNKNOWN_MEMBER_ID
            if current != member_id:
                return Errors.FENCED_INSTANCE_ID
            return 0
        return 0 if group.has(member_id) else Errors.UNKNOWN_MEMBER_ID

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
        err, ps = self._status(group_id, JOIN_GROUP)
        if err:
            respond(JoinResult(err, member_id))
            return
        assert ps is not None
        cfg = self.config
        if not cfg.min_session_timeout_ms <= session_timeout_ms <= cfg.max_session_timeout_ms:
            respond(JoinResult(Errors.INVALID_SESSION_TIMEOUT, member_id))
            return
        unknown = member_id == UNKNOWN_MEMBER_ID
        group = ps.groups.get(group_id)
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
                self._cancel_heartbeat(m)
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
        err = self._validate_current_member(group, member_id, instance_id)
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
        err, ps = self._status(group_id, SYNC_GROUP)
        if err == Errors.COORDINATOR_LOAD_IN_PROGRESS:
            # the rebalance state was lost with the old coordinator: have the member rejoin
            respond(SyncResult(Errors.REBALANCE_IN_PROGRESS))
            return
        if err:
            respond(SyncResult(err))
            return
        assert ps is not None
        group = ps.groups.get(group_id)
        if group is None:
            respond(SyncResult(Errors.UNKNOWN_MEMBER_ID))
            return
        if group.is_(GroupState.DEAD):
            respond(SyncResult(Errors.COORDINATOR_NOT_AVAILABLE))
            return
        err = self._validate_current_member(group, member_id, instance_id)
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
                  positions: Any = None) -> int:
        """`positions`, when given, is a PositionExchange (KIP-253): filled in on success."""
        err, ps = self._status(group_id, HEARTBEAT)
        if err == Errors.COORDINATOR_LOAD_IN_PROGRESS:
            return 0  # as Kafka: answer blindly while loading
        if err:
            return err
        assert ps is not None
        group = ps.groups.get(group_id)
        if group is None:
            return Errors.UNKNOWN_MEMBER_ID
        if group.is_(GroupState.DEAD):
            return Errors.COORDINATOR_NOT_AVAILABLE
        err = self._validate_current_member(group, member_id, instance_id)
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

    def on_metadata(self, delta: Any, image: Any) -> None:
        if delta.deleted_partitions:
            self.on_partitions_deleted({(name, p.partition) for name, p in delta.deleted_partitions.values()})

    def on_partitions_deleted(self, partitions: set[TopicPartition]) -> None:
        """KIP-253 deleted these partitions: every group we hold forgets their offsets and positions."""
        for ps in list(self._partitions.values()):
            if ps.loading:
                continue
            removed = {g.group_id: g.forget_partitions(partitions) for g in ps.groups.values()}
            touched = [g for g in ps.groups.values() if removed[g.group_id]]
            if touched:
                self._cleanup(ps, touched, removed)
                log.info("offsets_of_deleted_partitions_removed", groups=[g.group_id for g in touched])

    # ------------------------------------------------------------------ LeaveGroup
    def leave_group(self, group_id: str, members: list[tuple[str, str | None, str | None]]) -> tuple[int, list[int]]:
        """members: (member id, instance id, reason). Returns (group error, one error per member)."""
        err, ps = self._status(group_id, LEAVE_GROUP)
        if err:
            return err, []
        assert ps is not None
        group = ps.groups.get(group_id)
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
                e = self._validate_current_member(group, member_id, instance_id)
                if not e:
                    log.info("group_member_left", group=group_id, member=member_id, reason=reason)
                    self._remove_member_and_update_group(group, group.members[member_id], why)
                out.append(e)
        return 0, out

    # ------------------------------------------------------------------ offsets
    async def commit_offsets(
        self, group_id: str, member_id: str, instance_id: str | None, generation_id: int,
        offsets: dict[TopicPartition, OffsetAndMetadata],
    ) -> dict[TopicPartition, int]:
        fut = self._loop.create_future()

        def respond(result: dict[TopicPartition, int]) -> None:
            if not fut.done():
                fut.set_result(result)

        self.handle_commit_offsets(group_id, member_id, instance_id, generation_id, offsets, respond)
        return await fut

    def handle_commit_offsets(
        self, group_id: str, member_id: str, instance_id: str | None, generation_id: int,
        offsets: dict[TopicPartition, OffsetAndMetadata], respond: Callable[[dict[TopicPartition, int]], None],
    ) -> None:
        def all_(code: int) -> None:
            respond({tp: code for tp in offsets})

        err, ps = self._status(group_id, OFFSET_COMMIT)
        if err:
            all_(err)
            return
        assert ps is not None
        group = ps.groups.get(group_id)
        if group is None:
            if generation_id >= 0:
                all_(Errors.ILLEGAL_GENERATION)
                return
            log.info("group_created_by_offset_commit", group=group_id)
            group = ps.groups[group_id] = ClassicGroup(group_id, GroupState.EMPTY)
        err = self._validate_offset_commit(group, generation_id, member_id, instance_id)
        if err:
            all_(err)
            return
        if group.is_(GroupState.COMPLETING_REBALANCE):
            all_(Errors.REBALANCE_IN_PROGRESS)
            return
        if group.state in (GroupState.STABLE, GroupState.PREPARING_REBALANCE):
            self._schedule_heartbeat(group, group.members[member_id])
        self._store_offsets(ps, group, offsets, respond)

    def _validate_offset_commit(self, group: ClassicGroup, generation_id: int, member_id: str,
                                instance_id: str | None) -> int:
        if group.is_(GroupState.DEAD):
            return Errors.COORDINATOR_NOT_AVAILABLE
        if generation_id < 0 and group.is_(GroupState.EMPTY):
            return 0  # admin clients and consumers without group management
        if generation_id >= 0 or member_id != UNKNOWN_MEMBER_ID or instance_id is not None:
            err = self._validate_current_member(group, member_id, instance_id)
            if err:
                return err
            return Errors.ILLEGAL_GENERATION if generation_id != group.generation_id else 0
        if not group.is_(GroupState.EMPTY):
            return Errors.UNKNOWN_MEMBER_ID  # only members commit for a non-empty group
        return 0

    def _split_oversized_metadata(
        self, offsets: dict[TopicPartition, OffsetAndMetadata],
    ) -> tuple[dict[TopicPartition, int], dict[TopicPartition, OffsetAndMetadata]]:
        """(OFFSET_METADATA_TOO_LARGE per partition whose metadata passes offset.metadata.max.bytes,
        the offsets to write)."""
        limit = self.config.offset_metadata_max_bytes
        result: dict[TopicPartition, int] = {}
        valid: dict[TopicPartition, OffsetAndMetadata] = {}
        for tp, om in offsets.items():
            if om.metadata is not None and len(om.metadata.encode()) > limit:
                result[tp] = Errors.OFFSET_METADATA_TOO_LARGE
            else:
                valid[tp] = om
        return result, valid

    def _store_offsets(
        self, ps: _PartitionState, group: ClassicGroup, offsets: dict[TopicPartition, OffsetAndMetadata],
        respond: Callable[[dict[TopicPartition, int]], None],
    ) -> None:
        result, valid = self._split_oversized_metadata(offsets)
        if not valid:
            respond(result)
            return
        records = [(offset_commit_key(group.group_id, t, p), offset_commit_value(om)) for (t, p), om in valid.items()]
        err, first, done = self._write(ps.index, records)
        if err:
            respond({**result, **{tp: _commit_error(err) for tp in valid}})
            return
        group.pending_offset_commits.update(valid.keys())

        def replicated(f: asyncio.Future) -> None:
            code = f.result()
            for i, (tp, om) in enumerate(valid.items()):
                group.pending_offset_commits[tp] -= 1
                if group.pending_offset_commits[tp] <= 0:
                    del group.pending_offset_commits[tp]
                if code == 0 and not group.is_(GroupState.DEAD):
                    group.apply_offset(tp, om, first + i)
                result[tp] = _commit_error(code)
            respond(result)

        done.add_done_callback(replicated)

    async def txn_commit_offsets(
        self, group_id: str, producer_id: int, producer_epoch: int, member_id: str, instance_id: str | None,
        generation_id: int, offsets: dict[TopicPartition, OffsetAndMetadata],
    ) -> dict[TopicPartition, int]:
        """TxnOffsetCommit (Kafka's handleTxnCommitOffsets): the offsets are written as a
        transactional batch of the producer and stay pending until its transaction ends
        (on_transaction_completed): applied on commit, dropped on abort."""
        err, ps = self._status(group_id, OFFSET_COMMIT)
        if err:
            return {tp: err for tp in offsets}
        assert ps is not None
        group = ps.groups.get(group_id)
        if group is None:
            group = ps.groups[group_id] = ClassicGroup(group_id, GroupState.EMPTY)
        err = self._validate_txn_offset_commit(group, generation_id, member_id, instance_id)
        if err:
            return {tp: err for tp in offsets}
        result, valid = self._split_oversized_metadata(offsets)
        if not valid:
            return result
        records = [(offset_commit_key(group_id, t, p), offset_commit_value(om)) for (t, p), om in valid.items()]
        err, first, done = self._write(ps.index, records, (producer_id, producer_epoch))
        if err:
            return {**result, **{tp: _commit_error(err) for tp in valid}}
        for i, (tp, om) in enumerate(valid.items()):
            group.add_pending_txn_offset(producer_id, tp, om, first + i)
        code = await done
        if code:
            per = group.pending_txn_offsets.get(producer_id, {})
            for i, tp in enumerate(valid):
                c = per.get(tp)
                if c is not None and c.record_offset == first + i:
                    del per[tp]
            if not per:
                group.pending_txn_offsets.pop(producer_id, None)
        return {**result, **{tp: _commit_error(code) for tp in valid}}

    def _validate_txn_offset_commit(self, group: ClassicGroup, generation_id: int, member_id: str,
                                    instance_id: str | None) -> int:
        if group.is_(GroupState.DEAD):
            return Errors.COORDINATOR_NOT_AVAILABLE
        if generation_id < 0 and group.is_(GroupState.EMPTY):
            return 0  # a producer committing for a group without group management (v0-2 send no member)
        if member_id != UNKNOWN_MEMBER_ID and not group.has(member_id) and instance_id is None:
            return Errors.UNKNOWN_MEMBER_ID
        if instance_id is not None and group.is_static_member_fenced(instance_id, member_id):
            return Errors.FENCED_INSTANCE_ID
        if generation_id >= 0 and generation_id != group.generation_id:
            return Errors.ILLEGAL_GENERATION
        return 0

    def on_transaction_completed(self, partition_index: int, producer_id: int, commit: bool) -> None:
        """A transaction marker of `producer_id` was written (and replicated) on our partition
        `partition_index` of __consumer_offsets: its pending offsets take effect or go."""
        ps = self._partitions.get(partition_index)
        if ps is None:
            return  # not ours: whoever loads the partition reads the marker from the log
        if ps.loading:
            # the scan may have ended before the marker: apply it after loading, to the offsets
            # written before it (a producer's next transaction only starts after this one ended)
            p = self.broker.replicas.get(OFFSETS_TOPIC, partition_index)
            end = p.log.log_end_offset if p is not None else 0
            ps.completed_while_loading.append((producer_id, commit, end))
            return
        n = 0
        for group in ps.groups.values():
            if producer_id in group.pending_txn_offsets:
                n += group.complete_txn_offsets(producer_id, commit)
        if n:
            log.debug("txn_offsets_completed", partition=partition_index, producer_id=producer_id, commit=commit,
                      offsets=n)

    def unstable_partitions(self, group_id: str) -> set[TopicPartition]:
        """Partitions of the group with a transactional offset commit whose transaction has not
        ended: OffsetFetch with require_stable answers UNSTABLE_OFFSET_COMMIT for them."""
        err, ps = self._status(group_id, OFFSET_FETCH)
        group = ps.groups.get(group_id) if ps is not None else None
        if err or group is None:
            return set()
        return {tp for per in group.pending_txn_offsets.values() for tp in per}

    def fetch_offsets(
        self, group_id: str, partitions: list[TopicPartition] | None,
    ) -> tuple[int, list[tuple[TopicPartition, OffsetAndMetadata | None]]]:
        """Committed offsets of the requested partitions (None: every committed partition); a
        partition without a commit has None."""
        err, ps = self._status(group_id, OFFSET_FETCH)
        if err:
            return err, []
        assert ps is not None
        group = ps.groups.get(group_id)
        if group is None or group.is_(GroupState.DEAD):
            return 0, [] if partitions is None else [(tp, None) for tp in partitions]
        if partitions is None:
            return 0, [(tp, c.value) for tp, c in sorted(group.offsets.items())]
        out = []
        for tp in partitions:
            c = group.offsets.get(tp)
            out.append((tp, None if c is None else c.value))
        return 0, out

    def delete_offsets(self, group_id: str, partitions: list[TopicPartition]) -> tuple[int, dict[TopicPartition, int]]:
        err, ps = self._status(group_id, OFFSET_DELETE)
        if err:
            return err, {}
        assert ps is not None
        group = ps.groups.get(group_id)
        if group is None or group.is_(GroupState.DEAD):
            return Errors.GROUP_ID_NOT_FOUND, {}
        errors: dict[TopicPartition, int] = {}
        if group.is_(GroupState.EMPTY):
            eligible = list(partitions)
        elif group.is_consumer_group:
            eligible = []
            for tp in partitions:
                if group.is_subscribed_to_topic(tp[0]):
                    errors[tp] = Errors.GROUP_SUBSCRIBED_TO_TOPIC
                else:
                    eligible.append(tp)
        else:
            return Errors.NON_EMPTY_GROUP, {}
        if eligible:
            removed = group.remove_offsets(eligible)
            self._cleanup(ps, [group], {group.group_id: removed})
            errors.update({tp: 0 for tp in eligible})
        return 0, errors

    def _cleanup(self, ps: _PartitionState, groups: list[ClassicGroup],
                 removed: dict[str, list[TopicPartition]]) -> None:
        """Tombstones for removed offsets; a group left empty without offsets dies and gets a
        metadata tombstone too."""
        keys = []
        for group in groups:
            keys += [offset_commit_key(group.group_id, t, p) for t, p in removed.get(group.group_id, [])]
            if (group.is_(GroupState.EMPTY) and not group.offsets and not group.pending_members
                    and not group.pending_txn_offsets):
                group.transition_to(GroupState.DEAD)
            if group.is_(GroupState.DEAD):
                keys.append(group_metadata_key(group.group_id))
                if ps.groups.get(group.group_id) is group:
                    del ps.groups[group.group_id]
                self._cancel_group_timers(group)
        self._append_tombstones(ps.index, keys)

    def expire_offsets(self, now_ms: int | None = None) -> int:
        """Drop offsets past offsets.retention.minutes (and groups left with nothing). Returns the
        number of offsets removed."""
        now = now_ms if now_ms is not None else wall_clock_ms()
        total = 0
        for ps in list(self._partitions.values()):
            if ps.loading:
                continue
            touched, removed = [], {}
            for group in list(ps.groups.values()):
                expired = group.expired_offsets(now, self.config.offsets_retention_ms)
                if expired:
                    removed[group.group_id] = group.remove_offsets(expired)
                    total += len(expired)
                if expired or (group.is_(GroupState.EMPTY) and not group.offsets and not group.pending_members
                               and not group.pending_txn_offsets):
                    touched.append(group)
            if touched:
                self._cleanup(ps, touched, removed)
        if total:
            log.info("offsets_expired", count=total)
        return total

    # ------------------------------------------------------------------ admin
    def list_groups(self, states: Iterable[str] = (), types: Iterable[str] = ()) -> tuple[int, list[ClassicGroup]]:
        if not self.active:
            return Errors.COORDINATOR_NOT_AVAILABLE, []
        states_l = {s.lower() for s in states}
        types_l = {t.lower() for t in types}
        if types_l and CLASSIC not in types_l:
            return (Errors.COORDINATOR_LOAD_IN_PROGRESS if self.is_loading() else 0), []
        groups = [g for g in self.groups() if not states_l or g.state.value.lower() in states_l]
        return (Errors.COORDINATOR_LOAD_IN_PROGRESS if self.is_loading() else 0), groups

    def describe_group(self, group_id: str) -> tuple[int, GroupSummary | None]:
        """(error, summary); summary None for an unknown group."""
        err, ps = self._status(group_id, DESCRIBE_GROUPS)
        if err:
            return err, GroupSummary("", "", "")
        assert ps is not None
        group = ps.groups.get(group_id)
        if group is None:
            return 0, None
        if group.is_(GroupState.STABLE):
            return 0, GroupSummary(group.state.value, group.protocol_type or "", group.protocol_name or "",
                                   list(group.members.values()), with_metadata=True)
        return 0, GroupSummary(group.state.value, group.protocol_type or "", "", list(group.members.values()))

    def delete_groups(self, group_ids: list[str]) -> dict[str, int]:
        out: dict[str, int] = {}
        eligible: dict[int, list[ClassicGroup]] = {}
        for gid in group_ids:
            err, ps = self._status(gid, DELETE_GROUPS)
            if err:
                out[gid] = err
                continue
            assert ps is not None
            group = ps.groups.get(gid)
            if group is None or group.is_(GroupState.DEAD):
                out[gid] = Errors.GROUP_ID_NOT_FOUND
            elif group.is_(GroupState.EMPTY):
                group.transition_to(GroupState.DEAD)
                eligible.setdefault(ps.index, []).append(group)
                out[gid] = 0
            else:
                out[gid] = Errors.NON_EMPTY_GROUP
        for pid, groups in eligible.items():
            ps = self._partitions[pid]
            removed = {g.group_id: g.remove_offsets(list(g.offsets)) for g in groups}
            self._cleanup(ps, groups, removed)
            log.info("groups_deleted", groups=[g.group_id for g in groups])
        return out

    # ------------------------------------------------------------------ the topic
    async def _create_topic(self) -> None:
        cfg = self.config
        await create_internal_topic(
            self.broker.metadata, self.broker.forward, OFFSETS_TOPIC, cfg.offsets_topic_num_partitions, cfg.offsets_topic_replication_factor,
            {"segment.bytes": str(cfg.offsets_topic_segment_bytes)},
        )


def _commit_error(code: int) -> int:
    """Kafka's mapping of append errors for offset commits."""
    if code in (Errors.UNKNOWN_TOPIC_OR_PARTITION, Errors.NOT_ENOUGH_REPLICAS,
                Errors.NOT_ENOUGH_REPLICAS_AFTER_APPEND):
        return Errors.COORDINATOR_NOT_AVAILABLE
    if code in (Errors.NOT_LEADER_OR_FOLLOWER, Errors.KAFKA_STORAGE_ERROR):
        return Errors.NOT_COORDINATOR
    if code in (Errors.MESSAGE_TOO_LARGE, Errors.RECORD_LIST_TOO_LARGE, Errors.INVALID_FETCH_SIZE):
        return Errors.INVALID_COMMIT_OFFSET_SIZE
    return code
