"""The classic group coordinator: JoinGroup/SyncGroup/Heartbeat/LeaveGroup rebalances, static
membership, offset commits, all kept in __consumer_offsets."""

from broker.coordinator.group.config import GroupCoordinatorConfig
from broker.coordinator.group.coordinator import GroupCoordinator
from broker.coordinator.group.group import ClassicGroup, GroupState, JoinResult, Member, SyncResult
from broker.coordinator.group.records import OFFSETS_TOPIC, OffsetAndMetadata, partition_for

__all__ = [
    "OFFSETS_TOPIC",
    "ClassicGroup",
    "GroupCoordinator",
    "GroupCoordinatorConfig",
    "GroupState",
    "JoinResult",
    "Member",
    "OffsetAndMetadata",
    "SyncResult",
    "partition_for",
]
