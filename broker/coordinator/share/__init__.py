"""The share coordinator (KIP-932, "Share-group state persistence"): the durable state of every
share-partition, kept in the __share_group_state topic by the leaders of its partitions."""

from broker.coordinator.share.coordinator import ShareCoordinator, ShareCoordinatorConfig

__all__ = ["ShareCoordinator", "ShareCoordinatorConfig"]
