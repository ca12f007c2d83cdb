"""The group coordinator's broker settings, with Kafka's names and defaults."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from node.config import ConfigError

# the group types Kafka 4.1 knows for group.coordinator.rebalance.protocols; Strata serves
# `classic` and `consumer` (KIP-848), and takes the other two in the list without serving them
REBALANCE_PROTOCOLS = ("classic", "consumer", "share", "streams")
MIGRATION_POLICIES = ("disabled", "upgrade", "downgrade", "bidirectional")
BUILTIN_ASSIGNORS = ("uniform", "range")


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
    rebalance_protocols: tuple[str, ...] = ("classic", "consumer")

    @property
    def consumer_protocol_enabled(self) -> bool:
        """KIP-848's APIs are served only with `consumer` in group.coordinator.rebalance.protocols."""
        return "consumer" in self.rebalance_protocols

    @classmethod
    def from_props(cls, props: Mapping[str, str]) -> GroupCoordinatorConfig:
        """The settings of a broker's properties, checked as Kafka's GroupCoordinatorConfig checks
        them at startup: a bad value is a ConfigError naming it (one line, the broker does not start)."""
        def get(name: str, default: int) -> int:
            raw = props.get(name)
            if raw is None or raw.strip() == "":
                return default
            try:
                return int(raw)
            except ValueError:
                raise ConfigError(f"{name}: {raw!r} is not an integer") from None

        def names(name: str, default: tuple[str, ...]) -> tuple[str, ...]:
            raw = props.get(name)
            return default if raw is None else tuple(v.strip() for v in raw.split(",") if v.strip())

        d = cls()
        config = cls(
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
            consumer_assignors=tuple(_assignor_name(a) for a in names("group.consumer.assignors",
                                                                      d.consumer_assignors)),
            consumer_migration_policy=(props.get("group.consumer.migration.policy") or
                                       d.consumer_migration_policy).strip().lower(),
            rebalance_protocols=names("group.coordinator.rebalance.protocols", d.rebalance_protocols),
        )
        config.validate()
        return config

    def validate(self) -> None:
        """Kafka's GroupCoordinatorConfig checks (its ConfigDef bounds, then its `require`s), with
        its messages."""
        for name, value in (("group.consumer.session.timeout.ms", self.consumer_session_timeout_ms),
                            ("group.consumer.min.session.timeout.ms", self.consumer_min_session_timeout_ms),
                            ("group.consumer.max.session.timeout.ms", self.consumer_max_session_timeout_ms),
                            ("group.consumer.heartbeat.interval.ms", self.consumer_heartbeat_interval_ms),
                            ("group.consumer.min.heartbeat.interval.ms", self.consumer_min_heartbeat_interval_ms),
                            ("group.consumer.max.heartbeat.interval.ms", self.consumer_max_heartbeat_interval_ms),
                            ("group.consumer.max.size", self.consumer_max_size),
                            ("group.max.size", self.max_size)):
            if value < 1:
                raise ConfigError(f"{name}: {value} is invalid, it must be at least 1")
        hb, hb_min, hb_max = (self.consumer_heartbeat_interval_ms, self.consumer_min_heartbeat_interval_ms,
                              self.consumer_max_heartbeat_interval_ms)
        st, st_min, st_max = (self.consumer_session_timeout_ms, self.consumer_min_session_timeout_ms,
                              self.consumer_max_session_timeout_ms)
        HB, ST = "group.consumer.heartbeat.interval.ms", "group.consumer.session.timeout.ms"
        for ok, message in (
                (hb_max >= hb_min, "group.consumer.max.heartbeat.interval.ms must be greater than or equal to "
                                   "group.consumer.min.heartbeat.interval.ms"),
                (hb >= hb_min, f"{HB} must be greater than or equal to group.consumer.min.heartbeat.interval.ms"),
                (hb <= hb_max, f"{HB} must be less than or equal to group.consumer.max.heartbeat.interval.ms"),
                (st_max >= st_min, "group.consumer.max.session.timeout.ms must be greater than or equal to "
                                   "group.consumer.min.session.timeout.ms"),
                (st >= st_min, f"{ST} must be greater than or equal to group.consumer.min.session.timeout.ms"),
                (st <= st_max, f"{ST} must be less than or equal to group.consumer.max.session.timeout.ms"),
                (hb < st, f"{HB} must be less than {ST}")):
            if not ok:
                raise ConfigError(f"{message} ({HB}={hb} in [{hb_min}, {hb_max}], {ST}={st} in [{st_min}, {st_max}])")
        if not self.consumer_assignors:
            raise ConfigError("group.consumer.assignors: at least one assignor is required")
        for a in self.consumer_assignors:
            if a not in BUILTIN_ASSIGNORS:
                raise ConfigError(f"group.consumer.assignors: unknown assignor {a!r} (the builtin assignors are "
                                  f"{', '.join(BUILTIN_ASSIGNORS)}, or Kafka's class names of them)")
        if len(set(self.consumer_assignors)) != len(self.consumer_assignors):
            raise ConfigError(f"group.consumer.assignors: {','.join(self.consumer_assignors)} names an assignor twice")
        if self.consumer_migration_policy not in MIGRATION_POLICIES:
            raise ConfigError(f"group.consumer.migration.policy: {self.consumer_migration_policy!r} is not one of "
                              f"{', '.join(MIGRATION_POLICIES)}")
        for p in self.rebalance_protocols:
            if p not in REBALANCE_PROTOCOLS:
                raise ConfigError(f"group.coordinator.rebalance.protocols: {p!r} is not one of "
                                  f"{', '.join(REBALANCE_PROTOCOLS)}")
        if "classic" not in self.rebalance_protocols:
            raise ConfigError("group.coordinator.rebalance.protocols: Disabling the 'classic' protocol is not "
                              "supported.")


def _assignor_name(value: str) -> str:
    """Kafka takes assignor names or class names (org.apache.kafka.coordinator.group.assignor.
    UniformAssignor): both name ours."""
    v = value.strip()
    for cls, name in (("UniformAssignor", "uniform"), ("RangeAssignor", "range")):
        if v.endswith(cls):
            return name
    return v
