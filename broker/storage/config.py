"""LogConfig: the topic-level settings one log obeys, under Kafka's property names."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
TIMESTAMP_TYPES = ("CreateTime", "LogAppendTime")


@dataclass(frozen=True)
class LogConfig:
    segment_bytes: int = 1073741824  # segment.bytes
    segment_ms: int = 604800000  # segment.ms
    segment_jitter_ms: int = 0  # segment.jitter.ms (Kafka's rollJitterMs: a random part of it per segment)
    segment_index_bytes: int = 10485760  # segment.index.bytes (max index file size; roll when full)
    index_interval_bytes: int = 4096  # index.interval.bytes
    retention_ms: int = 604800000  # retention.ms (-1 = forever)
    retention_bytes: int = -1  # retention.bytes (-1 = unlimited), per chunk replica log
    max_message_bytes: int = 1048588  # max.message.bytes (max batch size)
    message_timestamp_type: str = "CreateTime"  # or "LogAppendTime"
    # KIP-937 (CreateTime only): how far a record's timestamp may lie behind / ahead of the broker's
    # clock. Kafka 4.0's defaults: no lower bound, one hour ahead.
    message_timestamp_before_max_ms: int = INT64_MAX  # message.timestamp.before.max.ms
    message_timestamp_after_max_ms: int = 3600000  # message.timestamp.after.max.ms
    file_delete_delay_ms: int = 60000  # file.delete.delay.ms (deleted segments renamed .deleted first)
    max_compaction_lag_ms: int = INT64_MAX  # max.compaction.lag.ms
    compact: bool = False  # cleanup.policy has "compact"

    def __post_init__(self) -> None:
        # One place checks ranges, so a LogConfig built by hand is as safe as one parsed.
        for name, (_, lo, hi) in _INT_RULES.items():
            value = getattr(self, _FIELD[name])
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"{name}: expected an integer, got {value!r}")
            if value < lo or value > hi:
                raise ValueError(f"{name}: {value} is out of range [{lo}, {hi}]")
        if self.message_timestamp_type not in TIMESTAMP_TYPES:
            raise ValueError(
                f"message.timestamp.type: {self.message_timestamp_type!r} is not one of {', '.join(TIMESTAMP_TYPES)}"
            )

    @property
    def max_segment_ms(self) -> int:
        """How old the active segment's first batch may get before an append rolls it (Kafka's
        LogConfig.maxSegmentMs): a compacted log rolls by max.compaction.lag.ms too (KIP-354)."""
        return min(self.segment_ms, self.max_compaction_lag_ms) if self.compact else self.segment_ms

    @property
    def log_append_time(self) -> bool:
        return self.message_timestamp_type == "LogAppendTime"

    @classmethod
    def from_properties(cls, props: Mapping[str, str], defaults: LogConfig | None = None) -> LogConfig:
        """Overlay topic-level properties (Kafka's names) on `defaults`. Unknown keys are ignored
        (the topic config holds keys for other layers); bad values raise ValueError naming the key."""
        # field -> value, int or str by field (replace() checks them per field; __post_init__ re-validates)
        changes: dict[str, Any] = {}
        for name, raw in props.items():
            if name in _INT_RULES:
                parse = _INT_RULES[name][0]
                changes[_FIELD[name]] = parse(name, raw)
            elif name == "message.timestamp.type":
                changes["message_timestamp_type"] = str(raw).strip()
            elif name == "cleanup.policy":
                changes["compact"] = "compact" in {p.strip().lower() for p in str(raw).split(",")}
        return dataclasses.replace(defaults if defaults is not None else cls(), **changes)


def _parse_int(name: str, raw: str) -> int:
    try:
        return int(str(raw).strip())
    except ValueError:
        raise ValueError(f"{name}: expected an integer, got {raw!r}") from None


# property -> (parser, min, max). Minimums are Kafka's validators (segment.bytes uses Kafka's
# legacy floor of 14 so tests can use tiny segments); INT properties are capped at int32 as in Kafka.
_INT_RULES: dict[str, tuple[Callable[[str, str], int], int, int]] = {
    "segment.bytes": (_parse_int, 14, INT32_MAX),
    "segment.ms": (_parse_int, 1, INT64_MAX),
    "segment.jitter.ms": (_parse_int, 0, INT64_MAX),
    "message.timestamp.before.max.ms": (_parse_int, 0, INT64_MAX),
    "message.timestamp.after.max.ms": (_parse_int, 0, INT64_MAX),
    "segment.index.bytes": (_parse_int, 4, INT32_MAX),
    "index.interval.bytes": (_parse_int, 0, INT32_MAX),
    "retention.ms": (_parse_int, -1, INT64_MAX),
    "retention.bytes": (_parse_int, -1, INT64_MAX),
    "max.message.bytes": (_parse_int, 0, INT32_MAX),
    "file.delete.delay.ms": (_parse_int, 0, INT64_MAX),
    "max.compaction.lag.ms": (_parse_int, 1, INT64_MAX),
}
_FIELD = {name: name.replace(".", "_") for name in _INT_RULES}
