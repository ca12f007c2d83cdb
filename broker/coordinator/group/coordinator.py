"""The group coordinator: the groups whose ids hash to the __consumer_offsets partitions this
broker leads (Kafka's GroupCoordinatorService, with its runtime and shards, on one event loop).

A group lives in partition abs(hash(group id)) % N of __consumer_offsets, and the leader of that
partition coordinates it. When this broker becomes a partition's leader the partition is loaded
(loader.py: its log scanned in an executor) and until that is done its groups answer
COORDINATOR_LOAD_IN_PROGRESS; when leadership goes, its groups are unloaded (waiting requests
answer NOT_COORDINATOR). Groups of partitions we do not lead answer NOT_COORDINATOR.

This class ties the pieces to the partitioned topic and routes each request to the piece that
owns it: the classic group protocol (classic.py), KIP-848 consumer groups (consumer.py), and the
committed offsets of every group type (offsets_manager.py). A group id names one group of one
type; a request of the other protocol gets the answer Kafka gives, and an empty group changes
type when the other protocol's first member joins, its offsets kept (KIP-848, "Upgrade and
downgrade").
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import structlog

from broker.coordinator.group.base import OFFSET_COMMIT_LATEST_VERSION, Group, TopicPartition
from broker.coordinator.group.classic import GROUP_OPERATIONS, ClassicGroupManager, GroupSummary
from broker.coordinator.group.config import GroupCoordinatorConfig
from broker.coordinator.group.consumer import ConsumerGroupManager, HeartbeatRequest, HeartbeatResult
from broker.coordinator.group.consumer_group import ConsumerGroup
from broker.coordinator.group.group import (
    ClassicGroup,
    JoinCallback,
    JoinResult,
    PositionExchange,
    SyncCallback,
    SyncResult,
)
from broker.coordinator.group.loader import LoadedPartition, read_partition
from broker.coordinator.group.offsets_manager import CommitCallback, OffsetsManager
from broker.coordinator.group.records import OFFSETS_TOPIC, OffsetAndMetadata, partition_for
from broker.coordinator.group.runtime import (
    DELETE_GROUPS,
    EMPTY_GROUP_ID_ALLOWED,
    HEARTBEAT,
    OffsetsPartition,
    Records,
)
from broker.coordinator.internal_topic import create_internal_topic
from broker.coordinator.partitioned import PartitionedCoordinator
from protocol.errors import Errors

if TYPE_CHECKING:
    from broker.ports import Forwarder, LocalReplicas, MetadataView
    from metadata.image import MetadataDelta, MetadataImage

__all__ = ["GROUP_OPERATIONS", "GroupCoordinator", "GroupSummary"]  # the handlers' names, from here

log = structlog.get_logger(__name__)


class GroupCoordinator(PartitionedCoordinator[OffsetsPartition]):
    topic = OFFSETS_TOPIC
    event = "group"

    def __init__(self, config: GroupCoordinatorConfig, replicas: LocalReplicas, metadata: MetadataView,
                 forward: Forwarder) -> None:
        """Registers as a leadership listener of `replicas` and loads the partitions this broker
        already leads; `forward` creates __consumer_offsets through the controller."""
        self.config = config
        self._forward = forward
        super().__init__(replicas, metadata, config.offsets_topic_num_partitions, config.load_buffer_size,
                         config.offset_commit_timeout_ms)
        self.classic = ClassicGroupManager(config, self)
        self.consumer = ConsumerGroupManager(config, self, metadata, self._take_over, self.classic.adopt)
        self.offsets = OffsetsManager(config, self, ClassicGroup, self._member_committed)
        # told of every loaded partition (KIP-932's share groups, kept by their own manager)
        self.loaded_listeners: list[Callable[[OffsetsPartition, LoadedPartition], None]] = []
        self._every(config.offsets_retention_check_interval_ms, self.expire_offsets, "offsets_expiry_failed")
        self._watch_leadership()

    # ------------------------------------------------------------------ partitions
    def partition_for(self, group_id: str) -> int:
        return partition_for(group_id, self.num_partitions())

    def _new_partition(self, index: int, epoch: int) -> OffsetsPartition:
        return OffsetsPartition(index, epoch)

    _read_partition = staticmethod(read_partition)

    def _apply_loaded(self, ps: OffsetsPartition, loaded: LoadedPartition, started: float) -> None:
        self.classic.load(ps, loaded.groups)
        self.consumer.load(ps, loaded.consumer_groups)
        for listener in self.loaded_listeners:
            listener(ps, loaded)
        self.offsets.load(ps, loaded.offsets, loaded.pending_txn)
        ps.loading = False
        self.offsets.complete_transactions_ended_while_loading(ps)
        self.classic.resume(ps)
        self.consumer.resume(ps)
        log.info("group_partition_loaded", partition=ps.index, epoch=ps.epoch, groups=len(ps.groups),
                 records=loaded.records, end_offset=loaded.end_offset,
                 ms=round((time.monotonic() - started) * 1000))

    def _forget(self, ps: OffsetsPartition) -> None:
        for group in ps.groups.values():
            group.unload()
        ps.groups.clear()

    # ------------------------------------------------------------------ the managers' runtime (runtime.GroupRuntime)
    def status(self, group_id: str | None, api: int) -> tuple[int, OffsetsPartition | None]:
        if group_id is None or (group_id == "" and api not in EMPTY_GROUP_ID_ALLOWED):
            return Errors.INVALID_GROUP_ID, None
        return self._partition_status(group_id)

    def partition(self, index: int) -> OffsetsPartition | None:
        return self._partitions.get(index)

    def loaded_partitions(self) -> list[OffsetsPartition]:
        return [ps for ps in self._partitions.values() if not ps.loading]

    def log_end_offset(self, index: int) -> int:
        p = self.replicas.get(OFFSETS_TOPIC, index)
        return p.log.log_end_offset if p is not None else 0

    def write(self, index: int, records: Records,
              producer: tuple[int, int] | None = None) -> tuple[int, int, asyncio.Future]:
        """_append to partition `index` (NOT_LEADER_OR_FOLLOWER when it is not ours and loaded)."""
        ps = self._partitions.get(index)
        if ps is None:
            done = self._loop.create_future()
            done.set_result(Errors.NOT_LEADER_OR_FOLLOWER)
            return Errors.NOT_LEADER_OR_FOLLOWER, -1, done
        return self._append(ps, records, producer)

    def timer(self, delay_ms: int, fn: Callable[..., Any], *args: Any) -> asyncio.TimerHandle:
        return self._timer(delay_ms, fn, *args)

    def _member_committed(self, group: Group, member_id: str) -> None:
        if isinstance(group, ClassicGroup):
            self.classic.member_committed(group, member_id)

    # ------------------------------------------------------------------ one group id, one type
    def _take_over(self, ps: OffsetsPartition, group_id: str, new: Group) -> None:
        """`new` replaces the empty group `group_id` of the other type, with its offsets."""
        old = ps.groups.get(group_id)
        if old is not None:
            new.offsets, new.pending_offset_commits = old.offsets, old.pending_offset_commits
            new.pending_txn_offsets = old.pending_txn_offsets
            old.cancel_timers()
            old.mark_dead()
        ps.groups[group_id] = new

    def _consumer_group(self, group_id: str) -> ConsumerGroup | None:
        """The live consumer group of that id when we coordinate it, for the classic APIs to refuse
        or convert."""
        err, ps = self.status(group_id, HEARTBEAT)
        group = ps.groups.get(group_id) if ps is not None and not err else None
        return group if isinstance(group, ConsumerGroup) and not group.is_dead else None

    def _classic_join_refused(self, group_id: str) -> int:
        """0 when a JoinGroup may go to the classic manager; an empty consumer group becomes a
        classic one first (its records tombstoned, offsets kept). -1: the consumer group takes the
        member in (KIP-848 migration)."""
        group = self._consumer_group(group_id)
        if group is None:
            return 0
        if not group.is_empty:
            if self.config.consumer_migration_policy != "disabled":
                return -1
            log.info("classic_join_refused", group=group_id, reason="the group is a consumer group with members")
            return Errors.INCONSISTENT_GROUP_PROTOCOL
        return self.consumer.convert_empty_to_classic(self._partitions[self.partition_for(group_id)], group)

    # ------------------------------------------------------------------ KIP-848 consumer groups
    async def consumer_group_heartbeat(self, req: HeartbeatRequest) -> HeartbeatResult:
        return await self.consumer.heartbeat(req)

    def consumer_group_describe(self, group_id: str) -> tuple[int, str | None, ConsumerGroup | None]:
        return self.consumer.describe(group_id)

    # ------------------------------------------------------------------ the classic protocol
    async def join_group(
        self, group_id: str, member_id: str, group_instance_id: str | None, *, require_known_member_id: bool,
        support_skip_assignment: bool, client_id: str, client_host: str, rebalance_timeout_ms: int,
        session_timeout_ms: int, protocol_type: str, protocols: list[tuple[str, bytes]], reason: str | None = None,
    ) -> JoinResult:
        if self._classic_join_refused(group_id) == -1:
            fut: asyncio.Future[JoinResult] = self._loop.create_future()

            def respond(result: JoinResult) -> None:
                if not fut.done():
                    fut.set_result(result)

            self.handle_join_group(group_id, member_id, group_instance_id, require_known_member_id,
                                   support_skip_assignment, client_id, client_host, rebalance_timeout_ms,
                                   session_timeout_ms, protocol_type, protocols, respond, reason or "")
            return await fut
        err = self._classic_join_refused(group_id)
        if err:
            return JoinResult(err, member_id)
        return await self.classic.join_group(
            group_id, member_id, group_instance_id, require_known_member_id=require_known_member_id,
            support_skip_assignment=support_skip_assignment, client_id=client_id, client_host=client_host,
            rebalance_timeout_ms=rebalance_timeout_ms, session_timeout_ms=session_timeout_ms,
            protocol_type=protocol_type, protocols=protocols, reason=reason)

    def handle_join_group(
        self, group_id: str, member_id: str, instance_id: str | None, require_known: bool, support_skip: bool,
        client_id: str, client_host: str, rebalance_timeout_ms: int, session_timeout_ms: int, protocol_type: str,
        protocols: list[tuple[str, bytes]], respond: JoinCallback, reason: str,
    ) -> None:
        err = self._classic_join_refused(group_id)
        if err == -1:
            group = self._consumer_group(group_id)
            assert group is not None
            self.consumer.handle_classic_join(self._partitions[self.partition_for(group_id)], group, member_id,
                                              instance_id, require_known, client_id, client_host,
                                              rebalance_timeout_ms, session_timeout_ms, protocols, respond)
            return
        if err:
            respond(JoinResult(err, member_id))
            return
        self.classic.handle_join_group(group_id, member_id, instance_id, require_known, support_skip, client_id,
                                       client_host, rebalance_timeout_ms, session_timeout_ms, protocol_type,
                                       protocols, respond, reason)

    async def sync_group(
        self, group_id: str, generation_id: int, member_id: str, protocol_type: str | None,
        protocol_name: str | None, group_instance_id: str | None, assignments: dict[str, bytes],
    ) -> SyncResult:
        if (cg := self._consumer_group(group_id)) is not None:
            return self.consumer.classic_sync(cg, member_id, generation_id)
        return await self.classic.sync_group(group_id, generation_id, member_id, protocol_type, protocol_name,
                                             group_instance_id, assignments)

    def handle_sync_group(
        self, group_id: str, generation_id: int, member_id: str, protocol_type: str | None,
        protocol_name: str | None, instance_id: str | None, assignments: dict[str, bytes], respond: SyncCallback,
    ) -> None:
        if (cg := self._consumer_group(group_id)) is not None:
            respond(self.consumer.classic_sync(cg, member_id, generation_id))
            return
        self.classic.handle_sync_group(group_id, generation_id, member_id, protocol_type, protocol_name, instance_id,
                                       assignments, respond)

    def heartbeat(self, group_id: str, member_id: str, instance_id: str | None, generation_id: int,
                  positions: PositionExchange | None = None) -> int:
        """`positions`, when given, is a PositionExchange (KIP-253): filled in on success."""
        if (cg := self._consumer_group(group_id)) is not None:
            return self.consumer.classic_heartbeat(cg, member_id, generation_id)
        return self.classic.heartbeat(group_id, member_id, instance_id, generation_id, positions)

    def leave_group(self, group_id: str, members: list[tuple[str, str | None, str | None]]) -> tuple[int, list[int]]:
        """members: (member id, instance id, reason). Returns (group error, one error per member)."""
        if (cg := self._consumer_group(group_id)) is not None:
            return 0, self.consumer.classic_leave(self._partitions[self.partition_for(group_id)], cg, members)
        return self.classic.leave_group(group_id, members)

    def describe_group(self, group_id: str) -> tuple[int, GroupSummary | None]:
        """(error, summary); summary None for an unknown group, or one that is not classic
        (Kafka's DescribeGroups: GROUP_ID_NOT_FOUND from v6)."""
        if self._consumer_group(group_id) is not None:
            return 0, None
        return self.classic.describe_group(group_id)

    # ------------------------------------------------------------------ offsets
    async def commit_offsets(
        self, group_id: str, member_id: str, instance_id: str | None, generation_id: int,
        offsets: dict[TopicPartition, OffsetAndMetadata], api_version: int = OFFSET_COMMIT_LATEST_VERSION,
    ) -> dict[TopicPartition, int]:
        return await self.offsets.commit_offsets(group_id, member_id, instance_id, generation_id, offsets,
                                                 api_version)

    def handle_commit_offsets(
        self, group_id: str, member_id: str, instance_id: str | None, generation_id: int,
        offsets: dict[TopicPartition, OffsetAndMetadata], respond: CommitCallback,
    ) -> None:
        self.offsets.handle_commit_offsets(group_id, member_id, instance_id, generation_id, offsets, respond)

    async def txn_commit_offsets(
        self, group_id: str, producer_id: int, producer_epoch: int, member_id: str, instance_id: str | None,
        generation_id: int, offsets: dict[TopicPartition, OffsetAndMetadata],
    ) -> dict[TopicPartition, int]:
        return await self.offsets.txn_commit_offsets(group_id, producer_id, producer_epoch, member_id, instance_id,
                                                     generation_id, offsets)

    def on_transaction_completed(self, partition_index: int, producer_id: int, commit: bool) -> None:
        """WriteTxnMarkers wrote (and replicated) a marker of `producer_id` on our partition
        `partition_index` of __consumer_offsets."""
        self.offsets.on_transaction_completed(partition_index, producer_id, commit)

    def unstable_partitions(self, group_id: str) -> set[TopicPartition]:
        return self.offsets.unstable_partitions(group_id)

    def fetch_offsets(
        self, group_id: str, partitions: list[TopicPartition] | None, member_id: str | None = None,
        member_epoch: int = -1,
    ) -> tuple[int, list[tuple[TopicPartition, OffsetAndMetadata | None]]]:
        return self.offsets.fetch_offsets(group_id, partitions, member_id, member_epoch)

    def delete_offsets(self, group_id: str, partitions: list[TopicPartition]) -> tuple[int, dict[TopicPartition, int]]:
        return self.offsets.delete_offsets(group_id, partitions)

    def expire_offsets(self, now_ms: int | None = None) -> int:
        return self.offsets.expire_offsets(now_ms)

    def on_metadata(self, delta: MetadataDelta, image: MetadataImage) -> None:
        """Metadata publisher: offsets of deleted partitions go (KIP-253)."""
        if delta.deleted_partitions:
            self.on_partitions_deleted({(name, p.partition) for name, p in delta.deleted_partitions.values()})

    def on_partitions_deleted(self, partitions: set[TopicPartition]) -> None:
        self.offsets.forget_deleted_partitions(partitions)

    # ------------------------------------------------------------------ every group type
    def groups(self) -> list[Group]:
        return [g for ps in self._partitions.values() if not ps.loading for g in ps.groups.values()]

    def list_groups(self, states: Iterable[str] = (), types: Iterable[str] = ()) -> tuple[int, list[Group]]:
        if not self.active:
            return Errors.COORDINATOR_NOT_AVAILABLE, []
        states_l = {s.lower() for s in states}
        types_l = {t.lower() for t in types}
        groups = [g for g in self.groups()
                  if (not types_l or g.type in types_l) and (not states_l or g.state_name.lower() in states_l)]
        return (Errors.COORDINATOR_LOAD_IN_PROGRESS if self.is_loading() else 0), groups

    def delete_groups(self, group_ids: list[str]) -> dict[str, int]:
        out: dict[str, int] = {}
        eligible: dict[int, list[Group]] = {}
        for gid in group_ids:
            err, ps = self.status(gid, DELETE_GROUPS)
            if err:
                out[gid] = err
                continue
            assert ps is not None
            group = ps.groups.get(gid)
            if group is None or group.is_dead:
                out[gid] = Errors.GROUP_ID_NOT_FOUND
                continue
            err = group.validate_delete_group()
            if not err:
                group.mark_dead()
                eligible.setdefault(ps.index, []).append(group)
            out[gid] = err
        for pid, groups in eligible.items():
            ps = self._partitions[pid]
            removed = {g.group_id: g.remove_offsets(list(g.offsets)) for g in groups}
            self.offsets.remove(ps, groups, removed)
            log.info("groups_deleted", groups=[g.group_id for g in groups])
        return out

    # ------------------------------------------------------------------ the topic
    async def _create_topic(self) -> None:
        cfg = self.config
        await create_internal_topic(
            self.metadata, self._forward, OFFSETS_TOPIC, cfg.offsets_topic_num_partitions,
            cfg.offsets_topic_replication_factor, {"segment.bytes": str(cfg.offsets_topic_segment_bytes)},
        )

