"""What request handlers may use: the broker's components by name (the composition root,
``broker.broker.Broker``, fills it in). Handlers translate between requests and these; they never
see the Broker itself."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from broker.metadata_answers import PartitionEntryCache

if TYPE_CHECKING:
    from broker.config import BrokerConfig
    from broker.coordinator.group import GroupCoordinator
    from broker.coordinator.group.share import ShareGroupManager
    from broker.coordinator.share import ShareCoordinator
    from broker.coordinator.transaction import TransactionCoordinator
    from broker.diskless.coordinator.coordinator import DisklessCoordinator
    from broker.diskless.partition import DisklessService
    from broker.fetch_sessions import FetchSessionCache
    from broker.metrics import TopicStats
    from broker.partitions.router import PartitionRouter
    from broker.ports import Forwarder, MetadataView, TaskSpawner
    from broker.producer_ids import ProducerIdManager
    from broker.quotas.manager import ClientQuotas
    from broker.replication.replica_manager import ReplicaManager
    from broker.share.lag import PartitionEnds
    from broker.share.service import ShareService
    from broker.telemetry.clients import ClientTelemetry


@dataclass
class BrokerServices:
    config: BrokerConfig
    metadata: MetadataView  # the current image, and waits for the controller's writes to reach it
    forward: Forwarder  # admin requests to the controller (KIP-590)
    spawn: TaskSpawner
    replicas: ReplicaManager
    # which partition view serves a request: local leader, inactive chunk or diskless
    partitions: PartitionRouter
    diskless: DisklessService
    diskless_coordinator: DisklessCoordinator
    group_coordinator: GroupCoordinator
    transaction_coordinator: TransactionCoordinator
    producer_ids: ProducerIdManager
    quotas: ClientQuotas
    fetch_sessions: FetchSessionCache
    topic_stats: TopicStats
    share_groups: ShareGroupManager  # share group membership, in the group coordinator (KIP-932)
    share: ShareService  # the share-partitions this broker leads, and share sessions
    share_coordinator: ShareCoordinator  # share-partition state in __share_group_state
    share_ends: PartitionEnds  # partitions' high watermarks, for share-partitions' lag (KIP-1226)
    telemetry: ClientTelemetry  # KIP-714 client instances and their pushed metrics
    # learned from the controller in start(), before any listener opens (DescribeCluster)
    cluster_id: str | None = None
    # Metadata's partition entries, shared between answers while the topic does not change
    metadata_answers: PartitionEntryCache = field(default_factory=PartitionEntryCache)
