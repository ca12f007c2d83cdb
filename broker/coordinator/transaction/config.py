"""The transaction coordinator's broker settings, with Kafka's names and defaults."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class TransactionCoordinatorConfig:
    state_log_num_partitions: int = 50
    state_log_replication_factor: int = 3
    state_log_min_isr: int = 2
    state_log_segment_bytes: int = 104857600
    state_log_load_buffer_size: int = 5 * 1024 * 1024
    max_timeout_ms: int = 900000
    abort_timed_out_interval_ms: int = 10000
    transactional_id_expiration_ms: int = 604800000  # 7 days
    remove_expired_interval_ms: int = 3600000
    # How long a state write waits for replication (Kafka bounds it by the client's request timeout).
    write_timeout_ms: int = 10000

    @classmethod
    def from_props(cls, props: Mapping[str, str]) -> TransactionCoordinatorConfig:
        def get(name: str, default: int) -> int:
            raw = props.get(name)
            return default if raw is None or raw.strip() == "" else int(raw)

        d = cls()
        return cls(
            state_log_num_partitions=get("transaction.state.log.num.partitions", d.state_log_num_partitions),
            state_log_replication_factor=get("transaction.state.log.replication.factor",
                                             d.state_log_replication_factor),
            state_log_min_isr=get("transaction.state.log.min.isr", d.state_log_min_isr),
            state_log_segment_bytes=get("transaction.state.log.segment.bytes", d.state_log_segment_bytes),
            state_log_load_buffer_size=get("transaction.state.log.load.buffer.size", d.state_log_load_buffer_size),
            max_timeout_ms=get("transaction.max.timeout.ms", d.max_timeout_ms),
            abort_timed_out_interval_ms=get("transaction.abort.timed.out.transaction.cleanup.interval.ms",
                                            d.abort_timed_out_interval_ms),
            transactional_id_expiration_ms=get("transactional.id.expiration.ms", d.transactional_id_expiration_ms),
            remove_expired_interval_ms=get("transaction.remove.expired.transaction.cleanup.interval.ms",
                                           d.remove_expired_interval_ms),
        )
