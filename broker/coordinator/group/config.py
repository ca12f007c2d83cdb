"""The group coordinator's broker settings, with Kafka's names and defaults."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class GroupCoordinatorConfig:
    offsets_topic_num_partitions: int = 50
    offsets_topic_replication_factor: int = 3
    offsets_topic_segment_bytes: int = 104857600
    initial_rebalance_delay_ms: int = 3000
    min_session_timeout_ms: int = 6000
    max_session_timeout_ms: int = 1800000
    max_size: int = 2**31 - 1
    offset_metadata_max_bytes: int = 4096
    offsets_retention_ms: int = 7 * 24 * 3600 * 1000
    offsets_retention_check_interval_ms: int = 600000
    offset_commit_timeout_ms: int = 5000
    load_buffer_size: int = 5 * 1024 * 1024
    # KIP-848 consumer groups
    consumer_session_timeout_ms: int = 45000
    consumer_min_session_timeout_ms: int = 45000
    consumer_max_session_timeout_ms: int = 60000
    consumer_heartbeat_interval_ms: int = 5000
    consumer_min_heartbeat_interval_ms: int = 5000
    consumer_max_heartbeat_interval_ms: int = 15000
    consumer_max_size: int = 2**31 - 1
    consumer_assignors: tuple[str, ...] = ("uniform", "range")
    consumer_migration_policy: str = "bidirectional"

    @classmethod
    def from_props(cls, props: Mapping[str, str]) -> GroupCoordinatorConfig:
        def get(name: str, default: int) -> int:
            raw = props.get(name)
            return default if raw is None or raw.strip() == "" else int(raw)

        d = cls()
        return cls(
            offsets_topic_num_partitions=get("offsets.topic.num.partitions", d.offsets_topic_num_partitions),
            offsets_topic_replication_factor=get("offsets.topic.replication.factor", d.offsets_topic_replication_factor),
            offsets_topic_segment_bytes=get("offsets.topic.segment.bytes", d.offsets_topic_segment_bytes),
            initial_rebalance_delay_ms=get("group.initial.rebalance.delay.ms", d.initial_rebalance_delay_ms),
            min_session_timeout_ms=get("group.min.session.timeout.ms", d.min_session_timeout_ms),
            max_session_timeout_ms=get("group.max.session.timeout.ms", d.max_session_timeout_ms),
            max_size=get("group.max.size", d.max_size),
            offset_metadata_max_bytes=get("offset.metadata.max.bytes", d.offset_metadata_max_bytes),
            offsets_retention_ms=get("offsets.retention.minutes", d.offsets_retention_ms // 60000) * 60000,
            offsets_retention_check_interval_ms=get(
                "offsets.retention.check.interval.ms", d.offsets_retention_check_interval_ms
            ),
            offset_commit_timeout_ms=get("offsets.commit.timeout.ms", d.offset_commit_timeout_ms),
            load_buffer_size=get("offsets.load.buffer.size", d.load_buffer_size),
            consumer_session_timeout_ms=get("group.consumer.session.timeout.ms", d.consumer_session_timeout_ms),
            consumer_min_session_timeout_ms=get("group.consumer.min.session.timeout.ms",
                                                d.consumer_min_session_timeout_ms),
            consumer_max_session_timeout_ms=get("group.consumer.max.session.timeout.ms",
                                                d.consumer_max_session_timeout_ms),
            consumer_heartbeat_interval_ms=get("group.consumer.heartbeat.interval.ms",
                                               d.consumer_heartbeat_interval_ms),
            consumer_min_heartbeat_interval_ms=get("group.consumer.min.heartbeat.interval.ms",
                                                   d.consumer_min_heartbeat_interval_ms),
            consumer_max_heartbeat_interval_ms=get("group.consumer.max.heartbeat.interval.ms",
                                                   d.consumer_max_heartbeat_interval_ms),
            consumer_max_size=get("group.consumer.max.size", d.consumer_max_size),
            consumer_assignors=tuple(_assignor_name(a) for a in (props.get("group.consumer.assignors") or
                                                                 ",".join(d.consumer_assignors)).split(",")
                                     if a.strip()),
            consumer_migration_policy=(props.get("group.consumer.migration.policy") or
                                       d.consumer_migration_policy).strip().lower(),
        )


def _assignor_name(value: str) -> str:
    """Kafka takes assignor names or class names (org.apache.kafka.coordinator.group.assignor.
    UniformAssignor): both name ours."""
    v = value.strip()
    for cls, name in (("UniformAssignor", "uniform"), ("RangeAssignor", "range")):
        if v.endswith(cls):
            return name
    return v
