"""Share group settings (KIP-932), with Kafka's names and defaults."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from node.config import ConfigError

AUTO_OFFSET_RESETS = ("latest", "earliest")


@dataclass(frozen=True)
class ShareGroupConfig:
    enable: bool = True  # group.share.enable: the share APIs are advertised and served
    record_lock_duration_ms: int = 30000
    delivery_count_limit: int = 5
    partition_max_record_locks: int = 2000
    session_timeout_ms: int = 45000
    heartbeat_interval_ms: int = 5000
    max_size: int = 200  # group.share.max.size: members per share group
    max_share_sessions: int = 2000  # group.share.max.share.sessions

    @classmethod
    def from_props(cls, props: Mapping[str, str]) -> ShareGroupConfig:
        """A bad value is a ConfigError naming it (one line; the broker does not start)."""
        d = cls()

        def get(name: str, default: int) -> int:
            raw = props.get(name)
            if raw is None or raw.strip() == "":
                return default
            try:
                value = int(raw)
            except ValueError:
                raise ConfigError(f"{name}: {raw!r} is not an integer") from None
            if value < 1:
                raise ConfigError(f"{name}: {value} is invalid, it must be at least 1")
            return value

        raw_enable = (props.get("group.share.enable") or "true").strip().lower()
        if raw_enable not in ("true", "false"):
            raise ConfigError(f"group.share.enable: {raw_enable!r} is not true or false")
        config = cls(
            enable=raw_enable == "true",
            record_lock_duration_ms=get("group.share.record.lock.duration.ms", d.record_lock_duration_ms),
            delivery_count_limit=get("group.share.delivery.count.limit", d.delivery_count_limit),
            partition_max_record_locks=get("group.share.partition.max.record.locks", d.partition_max_record_locks),
            session_timeout_ms=get("group.share.session.timeout.ms", d.session_timeout_ms),
            heartbeat_interval_ms=get("group.share.heartbeat.interval.ms", d.heartbeat_interval_ms),
            max_size=get("group.share.max.size", d.max_size),
            max_share_sessions=get("group.share.max.share.sessions", d.max_share_sessions),
        )
        # Kafka's ShareGroupConfig bounds the delivery count limit to [2, 10]
        if not 2 <= config.delivery_count_limit <= 10:
            raise ConfigError(f"group.share.delivery.count.limit: {config.delivery_count_limit} is not in [2, 10]")
        if config.heartbeat_interval_ms >= config.session_timeout_ms:
            raise ConfigError("group.share.heartbeat.interval.ms must be less than group.share.session.timeout.ms")
        return config
