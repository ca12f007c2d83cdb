"""The broker's diskless settings: where WAL files go, when they roll, how reads are cached, and
the coordinators' topic (`__diskless_metadata`).

Read by both sides of the package (the WAL writer and reader, and the coordinator), so it imports
neither: the defaults of the writer and reader live here too."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

DEFAULT_MAX_BYTES = 8 * 1024 * 1024  # diskless.wal.max.bytes (Inkless' produce.buffer.max.bytes)
DEFAULT_MAX_MS = 250  # diskless.wal.max.ms (Inkless' produce.commit.interval.ms)
DEFAULT_CACHE_BYTES = 64 * 1024 * 1024  # diskless.fetch.cache.bytes


@dataclass(frozen=True)
class DisklessConfig:
    storage_url: str  # file:///abs/dir or s3://bucket/prefix
    s3_endpoint: str | None = None
    s3_region: str | None = None
    wal_max_bytes: int = DEFAULT_MAX_BYTES
    wal_max_ms: int = DEFAULT_MAX_MS
    fetch_cache_bytes: int = DEFAULT_CACHE_BYTES
    fetch_poll_ms: int = 100
    metadata_topic_num_partitions: int = 4
    metadata_topic_replication_factor: int = 3
    metadata_topic_min_isr: int = 2
    coordinator_write_timeout_ms: int = 10000
    coordinator_load_buffer_size: int = 5 * 1024 * 1024
    # what the last owner of a WAL file waits before deleting it (reads in flight finish)
    file_deletion_grace_ms: int = 60000
    orphan_scan_interval_ms: int = 3600000  # orphans are rare: a low scan frequency (KIP-1164)
    orphan_scan_grace_ms: int = 3600000  # an object younger than this is never an orphan candidate
    retention_check_interval_ms: int = 300000  # log.retention.check.interval.ms, as local logs
    gauges_interval_ms: int = 60000  # the per-coordinator gauges line in the broker log
    # a coordinator's leader snapshots its state every this many records and cuts its log behind
    coordinator_snapshot_interval_records: int = 10000
    metadata_topic_segment_bytes: int = 100 * 1024 * 1024  # as Kafka's offsets.topic.segment.bytes
    produce_gateways: bool = True
    # Kafka's producer.id.expiration.ms and its check interval: the coordinator's producer state
    producer_id_expiration_ms: int = 86400000
    producer_id_expiration_check_interval_ms: int = 600000

    @classmethod
    def from_props(cls, props: Mapping[str, str], first_log_dir: str | Path) -> DisklessConfig:
        """Unset diskless.storage.url: the embedded store, a directory under the first log dir."""
        d = cls(storage_url="")
        return cls(
            storage_url=props.get("diskless.storage.url") or f"file://{Path(first_log_dir).absolute() / 'diskless-objects'}",
            s3_endpoint=props.get("diskless.storage.s3.endpoint"),
            s3_region=props.get("diskless.storage.s3.region"),
            wal_max_bytes=int(props.get("diskless.wal.max.bytes", d.wal_max_bytes)),
            wal_max_ms=int(props.get("diskless.wal.max.ms", d.wal_max_ms)),
            fetch_cache_bytes=int(props.get("diskless.fetch.cache.bytes", d.fetch_cache_bytes)),
            fetch_poll_ms=int(props.get("diskless.fetch.poll.ms", d.fetch_poll_ms)),
            metadata_topic_num_partitions=int(props.get("diskless.metadata.topic.num.partitions",
                                                        d.metadata_topic_num_partitions)),
            metadata_topic_replication_factor=int(props.get("diskless.metadata.topic.replication.factor",
                                                            d.metadata_topic_replication_factor)),
            metadata_topic_min_isr=int(props.get("diskless.metadata.topic.min.isr", d.metadata_topic_min_isr)),
            coordinator_write_timeout_ms=int(props.get("diskless.coordinator.write.timeout.ms",
                                                       d.coordinator_write_timeout_ms)),
            file_deletion_grace_ms=int(props.get("diskless.coordinator.file.deletion.grace.ms",
                                                 d.file_deletion_grace_ms)),
            orphan_scan_interval_ms=int(props.get("diskless.coordinator.orphan.scan.interval.ms",
                                                  d.orphan_scan_interval_ms)),
            orphan_scan_grace_ms=int(props.get("diskless.coordinator.orphan.scan.grace.period.ms",
                                               d.orphan_scan_grace_ms)),
            retention_check_interval_ms=int(props.get("log.retention.check.interval.ms",
                                                      d.retention_check_interval_ms)),
            gauges_interval_ms=int(props.get("diskless.coordinator.gauges.interval.ms", d.gauges_interval_ms)),
            coordinator_snapshot_interval_records=int(props.get("diskless.coordinator.snapshot.interval.records",
                                                                d.coordinator_snapshot_interval_records)),
            metadata_topic_segment_bytes=int(props.get("diskless.metadata.topic.segment.bytes",
                                                       d.metadata_topic_segment_bytes)),
            produce_gateways=props.get("diskless.produce.gateways.enable", "true").strip().lower() != "false",
            producer_id_expiration_ms=int(props.get("producer.id.expiration.ms", d.producer_id_expiration_ms)),
            producer_id_expiration_check_interval_ms=int(props.get("producer.id.expiration.check.interval.ms",
                                                                   d.producer_id_expiration_check_interval_ms)),
        )
