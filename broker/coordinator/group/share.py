"""Share groups in the group coordinator (KIP-932): ShareGroupHeartbeat and ShareGroupDescribe.

A share group lives on the same __consumer_offsets partition as any group of its id (one id
space: a share heartbeat for a classic or consumer group's id is GROUP_ID_NOT_FOUND, as Kafka's
GroupMetadataManager answers). Members name themselves (a UUID chosen by the client), join with
epoch 0, leave with -1, and are fenced when they do not heartbeat within the session timeout.
The assignment is the simple assignor's (share_group.py); a member's epoch moves to the group
epoch when its assignment changes, and the heartbeat that sees the change carries it.

The group itself is written to __consumer_offsets (share_records.py: its epoch, and the topics its
share-partitions cover, for the offsets APIs); the members are kept in memory only: after a
coordinator failover the group is there without them, and their next heartbeats are
UNKNOWN_MEMBER_ID, on which they rejoin. Kafka writes the members too (KIP-932, "Share group
records").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

from broker.coordinator.group.share_group import (
    SIMPLE_ASSIGNOR,
    Assignment,
    ShareGroup,
    ShareMember,
    simple_assignment,
)
from broker.coordinator.group.share_records import (
    SHARE_GROUP_METADATA,
    SHARE_GROUP_STATE_PARTITION_METADATA,
    metadata_value,
    partition_metadata_value,
    share_key,
)
from metadata.image import GROUP_RESOURCE
from protocol.errors import Errors

if TYPE_CHECKING:
    from broker.coordinator.group.loader import LoadedPartition
    from broker.coordinator.group.runtime import GroupRuntime, OffsetsPartition
    from broker.ports import ImageSource
    from broker.share.config import ShareGroupConfig

log = structlog.get_logger(__name__)

SHARE_GROUP_HEARTBEAT = 76
LEAVE_EPOCH = -1
MAX_SUBSCRIBED_TOPICS = 10000


@dataclass
class ShareHeartbeat:
    group_id: str
    member_id: str
    member_epoch: int
    rack_id: str | None
    subscribed_topic_names: list[str] | None
    client_id: str
    client_host: str


@dataclass
class ShareHeartbeatResult:
    error: int = 0
    message: str | None = None
    member_id: str | None = None
    member_epoch: int = 0
    heartbeat_interval_ms: int = 0
    assignment: Assignment | None = None


class ShareGroupManager:
    def __init__(self, config: ShareGroupConfig, runtime: GroupRuntime, images: ImageSource) -> None:
        self.config = config
        self._runtime = runtime
        self._images = images
        self._groups: dict[str, ShareGroup] = {}

    # ------------------------------------------------------------------ records
    def load(self, ps: OffsetsPartition, loaded: LoadedPartition) -> None:
        """GroupCoordinator listener: the share groups of a partition it loaded."""
        for gid, lg in loaded.share_groups.items():
            if not lg.has_metadata or gid in ps.groups:
                continue
            old = self._groups.get(gid)
            if old is not None:
                old.cancel_timers()
            g = self._groups[gid] = ShareGroup(gid, ps.epoch)
            g.group_epoch = g.assignment_epoch = lg.epoch
            g.seen_topics = set(lg.topics)
            g.written = (lg.epoch, frozenset(lg.topics))

    def _write(self, group: ShareGroup) -> None:
        """Write what changed of the group (its epoch, its topics) to its __consumer_offsets
        partition; not awaited: a lost write costs a rejoin, as the members are not written."""
        topics = frozenset(group.seen_topics)
        if group.written == (group.group_epoch, topics):
            return
        records = [(share_key(SHARE_GROUP_METADATA, group.group_id), metadata_value(group.group_epoch))]
        if group.written is None or group.written[1] != topics:
            image = self._images.image
            covered = {}
            for name in sorted(topics):
                info = image.topic(name)
                if info is not None:
                    covered[name] = (info.id, tuple(sorted(info.partitions)))
            records.append((share_key(SHARE_GROUP_STATE_PARTITION_METADATA, group.group_id),
                            partition_metadata_value(covered)))
        group.written = (group.group_epoch, topics)
        self._runtime.write(self._runtime.partition_for(group.group_id), records)

    # ------------------------------------------------------------------ lookup
    def _group(self, group_id: str, create: bool) -> tuple[int, str | None, ShareGroup | None]:
        err, ps = self._runtime.status(group_id, SHARE_GROUP_HEARTBEAT)
        if err:
            return err, None, None
        assert ps is not None
        group = self._groups.get(group_id)
        if group is not None and group.partition_epoch != ps.epoch:
            # held from an earlier leadership of the partition: that membership is gone
            group.cancel_timers()
            del self._groups[group_id]
            group = None
        if group is None:
            if group_id in ps.groups:
                return Errors.GROUP_ID_NOT_FOUND, f"Group {group_id} is not a share group.", None
            if not create:
                return Errors.GROUP_ID_NOT_FOUND, f"Group {group_id} not found.", None
            group = self._groups[group_id] = ShareGroup(group_id, ps.epoch)
        return 0, None, group

    def groups(self) -> list[ShareGroup]:
        """The share groups this broker coordinates now (ListGroups)."""
        out = []
        for gid in list(self._groups):
            err, _, g = self._group(gid, create=False)
            if not err and g is not None:
                out.append(g)
        return out

    def is_share_group(self, group_id: str) -> bool:
        return group_id in self._groups

    def remove(self, group_id: str) -> None:
        """DeleteGroups: the (empty) group goes, its records tombstoned."""
        group = self._groups.pop(group_id, None)
        if group is not None:
            group.cancel_timers()
            self._runtime.write(self._runtime.partition_for(group_id), [
                (share_key(SHARE_GROUP_STATE_PARTITION_METADATA, group_id), None),
                (share_key(SHARE_GROUP_METADATA, group_id), None)])
            log.info("share_group_deleted", group=group_id)

    # ------------------------------------------------------------------ ShareGroupHeartbeat
    def heartbeat(self, req: ShareHeartbeat) -> ShareHeartbeatResult:
        refused = self._validate(req)
        if refused is not None:
            log.info("share_group_heartbeat_refused", group=req.group_id, member=req.member_id, reason=refused[1])
            return ShareHeartbeatResult(error=refused[0], message=refused[1])
        # made for any epoch: a member whose coordinator failed over (the membership is kept in
        # memory) hears UNKNOWN_MEMBER_ID and rejoins; librdkafka takes GROUP_ID_NOT_FOUND as fatal
        err, message, group = self._group(req.group_id, create=True)
        if err:
            return ShareHeartbeatResult(error=err, message=message)
        assert group is not None
        if req.member_epoch == LEAVE_EPOCH:
            self._remove(group, req.member_id, "left")
            return ShareHeartbeatResult(member_id=req.member_id, member_epoch=LEAVE_EPOCH)
        m = group.members.get(req.member_id)
        if req.member_epoch == 0:
            if m is None:
                if len(group.members) >= self.config.max_size:
                    return ShareHeartbeatResult(error=Errors.GROUP_MAX_SIZE_REACHED,
                                                message=f"The share group has reached its maximum size "
                                                        f"({self.config.max_size}).")
                m = ShareMember(req.member_id, 0, req.client_id, req.client_host, req.rack_id,
                                tuple(req.subscribed_topic_names or ()))
                group.members[m.member_id] = m
                group.group_epoch += 1
                log.info("share_member_joined", group=group.group_id, member=m.member_id, epoch=group.group_epoch)
            m.member_epoch = 0  # a rejoin gets its assignment again
        elif m is None:
            return ShareHeartbeatResult(error=Errors.UNKNOWN_MEMBER_ID,
                                        message=f"Member {req.member_id} is not a member of group {req.group_id}.")
        elif req.member_epoch != m.member_epoch:
            return ShareHeartbeatResult(error=Errors.FENCED_MEMBER_EPOCH,
                                        message=f"The share group member has epoch {req.member_epoch}, the "
                                                f"coordinator has {m.member_epoch}.")
        if req.subscribed_topic_names is not None and tuple(req.subscribed_topic_names) != m.subscribed_topic_names:
            m.subscribed_topic_names = tuple(req.subscribed_topic_names)
            group.group_epoch += 1
        group.seen_topics.update(m.subscribed_topic_names)
        if req.rack_id is not None:
            m.rack_id = req.rack_id
        target = simple_assignment(self._images.image, m.subscribed_topic_names)
        assignment = None
        if target != m.assigned or m.member_epoch == 0:
            if target != m.assigned and m.member_epoch != 0:
                group.group_epoch += 1  # the subscribed topics changed shape (created, partitions added)
            m.assigned = target
            m.member_epoch = group.group_epoch
            group.assignment_epoch = group.group_epoch
            assignment = target
        self._schedule_session(group, m)
        self._write(group)
        return ShareHeartbeatResult(member_id=m.member_id, member_epoch=m.member_epoch,
                                    heartbeat_interval_ms=self._heartbeat_interval(group.group_id),
                                    assignment=assignment)

    def _validate(self, req: ShareHeartbeat) -> tuple[int, str] | None:
        """Kafka's throwIfShareGroupHeartbeatRequestIsInvalid."""
        if not req.group_id:
            return Errors.INVALID_REQUEST, "GroupId can't be empty."
        if not req.member_id:
            return Errors.INVALID_REQUEST, "MemberId can't be empty."
        if req.member_epoch < LEAVE_EPOCH:
            return Errors.INVALID_REQUEST, f"MemberEpoch is invalid: {req.member_epoch}."
        if req.member_epoch == 0 and not req.subscribed_topic_names:
            return Errors.INVALID_REQUEST, "SubscribedTopicNames must be set in first request."
        if req.subscribed_topic_names is not None and len(req.subscribed_topic_names) > MAX_SUBSCRIBED_TOPICS:
            return Errors.INVALID_REQUEST, "SubscribedTopicNames names too many topics."
        return None

    def _remove(self, group: ShareGroup, member_id: str, why: str) -> None:
        m = group.members.pop(member_id, None)
        if m is None:
            return
        if m.session_timer is not None:
            m.session_timer.cancel()
        group.group_epoch += 1
        log.info("share_member_removed", group=group.group_id, member=member_id, why=why, epoch=group.group_epoch)
        self._write(group)

    # ------------------------------------------------------------------ sessions
    def _group_config(self, group_id: str, name: str, default: int) -> int:
        raw = self._images.image.configs.get((GROUP_RESOURCE, group_id), {}).get(name)
        try:
            return int(raw) if raw is not None else default
        except ValueError:
            return default

    def _heartbeat_interval(self, group_id: str) -> int:
        return self._group_config(group_id, "share.heartbeat.interval.ms", self.config.heartbeat_interval_ms)

    def _schedule_session(self, group: ShareGroup, m: ShareMember) -> None:
        if m.session_timer is not None:
            m.session_timer.cancel()
        timeout = self._group_config(group.group_id, "share.session.timeout.ms", self.config.session_timeout_ms)
        m.session_timer = self._runtime.timer(timeout, self._on_session_expired, group, m.member_id)

    def _on_session_expired(self, group: ShareGroup, member_id: str) -> None:
        if self._groups.get(group.group_id) is group:
            self._remove(group, member_id, "session timeout")

    # ------------------------------------------------------------------ ShareGroupDescribe
    def describe(self, group_id: str) -> tuple[int, str | None, ShareGroup | None]:
        if not group_id:
            return Errors.INVALID_GROUP_ID, None, None
        return self._group(group_id, create=False)

    def for_offsets_change(self, group_id: str) -> tuple[int, str | None, ShareGroup | None]:
        """The group whose start offsets an admin sets (made when unknown, as Kafka's
        AlterShareGroupOffsets): only an empty one may change (NON_EMPTY_GROUP)."""
        if not group_id:
            return Errors.INVALID_GROUP_ID, None, None
        err, message, group = self._group(group_id, create=True)
        if not err and group is not None and group.members:
            return Errors.NON_EMPTY_GROUP, "The share group has active members.", None
        return err, message, group

    @property
    def assignor_name(self) -> str:
        return SIMPLE_ASSIGNOR
