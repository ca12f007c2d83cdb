"""The group coordinator on __consumer_offsets: the classic group protocol (JoinGroup, SyncGroup,
Heartbeat, LeaveGroup rebalances, static membership), KIP-848 consumer groups
(ConsumerGroupHeartbeat, server-side assignors, reconciliation) and the committed offsets of every
group type, each in its own module and tied together by the coordinator (coordinator.py)."""

from broker.coordinator.group.base import Group
from broker.coordinator.group.classic import ClassicGroupManager
from broker.coordinator.group.config import GroupCoordinatorConfig
from broker.coordinator.group.consumer import ConsumerGroupManager
from broker.coordinator.group.consumer_group import ConsumerGroup
from broker.coordinator.group.coordinator import GroupCoordinator
from broker.coordinator.group.group import ClassicGroup, GroupState, JoinResult, Member, SyncResult
from broker.coordinator.group.offsets_manager import OffsetsManager
from broker.coordinator.group.records import OFFSETS_TOPIC, OffsetAndMetadata, partition_for

__all__ = [
    "OFFSETS_TOPIC",
    "ClassicGroup",
    "ClassicGroupManager",
    "ConsumerGroup",
    "ConsumerGroupManager",
    "Group",
    "GroupCoordinator",
    "GroupCoordinatorConfig",
    "GroupState",
    "JoinResult",
    "Member",
    "OffsetAndMetadata",
    "OffsetsManager",
    "SyncResult",
    "partition_for",
]
