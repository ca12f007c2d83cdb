"""Reading a __consumer_offsets partition when this broker comes to lead it: the log scanned from
its start to its end (in an executor), last record per key wins, tombstones delete. What it finds
is handed to the managers that own it, as Kafka's shard replays each record to the manager of
its key: group metadata to the classic group manager, KIP-848 consumer group records to the
consumer group manager, offsets to the offsets manager.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import structlog

from broker.coordinator.group.base import TopicPartition
from broker.coordinator.group.consumer_records import LoadedConsumerGroup, decode_consumer_key, replay
from broker.coordinator.group.records import (
    GroupMetadataKey,
    GroupMetadataRecord,
    OffsetAndMetadata,
    OffsetCommitKey,
    RecordFormatError,
    decode_group_metadata_value,
    decode_key,
    decode_offset_commit_value,
)
from broker.coordinator.group.share_records import LoadedShareGroup, ShareRecordError, decode_share_key
from broker.coordinator.group.share_records import replay as replay_share
from broker.coordinator.partitioned import log_batches

if TYPE_CHECKING:
    from broker.storage.log import Log

log = structlog.get_logger(__name__)

# transactional offset commits whose transaction has not ended yet:
# producer id -> (group, topic, partition) -> (offset or None for a tombstone, record offset)
PendingTxnOffsets = dict[int, dict[tuple[str, str, int], tuple[OffsetAndMetadata | None, int]]]


@dataclass
class LoadedPartition:
    groups: dict[str, GroupMetadataRecord | None]
    offsets: dict[str, dict[TopicPartition, tuple[OffsetAndMetadata, int]]]
    records: int = 0
    end_offset: int = 0
    pending_txn: PendingTxnOffsets = field(default_factory=dict)
    consumer_groups: dict[str, LoadedConsumerGroup] = field(default_factory=dict)
    share_groups: dict[str, LoadedShareGroup] = field(default_factory=dict)


def read_partition(lg: Log, max_bytes: int) -> LoadedPartition:
    """Scan a __consumer_offsets log from its start to its end (runs in an executor). Transactional
    offset commits count once their commit marker follows; aborted ones never; those without a
    marker yet stay pending."""
    groups: dict[str, GroupMetadataRecord | None] = {}
    offsets: dict[str, dict[TopicPartition, tuple[OffsetAndMetadata, int]]] = {}
    pending_txn: PendingTxnOffsets = {}
    consumer_groups: dict[str, LoadedConsumerGroup] = {}
    share_groups: dict[str, LoadedShareGroup] = {}
    offset = lg.log_start_offset
    count = 0

    def apply_offset(group: str, tp: TopicPartition, value: OffsetAndMetadata | None, rec_offset: int) -> None:
        per = offsets.setdefault(group, {})
        if value is None:
            per.pop(tp, None)
        else:
            cur = per.get(tp)
            if cur is None or cur[1] < rec_offset:
                per[tp] = (value, rec_offset)

    for b in log_batches(lg, max_bytes):
        h = b.header
        if h.is_control:
            pend = pending_txn.pop(h.producer_id, {})
            rec = b.records[0] if b.records else None
            if rec is not None and rec.key is not None and len(rec.key) >= 4:
                if struct.unpack_from(">h", rec.key, 2)[0] == 1:  # COMMIT marker
                    for (g, t, p), (value, rec_offset) in pend.items():
                        apply_offset(g, (t, p), value, rec_offset)
        else:
            for r in b.records:
                count += 1
                try:
                    key = decode_key(r.key)
                    if isinstance(key, OffsetCommitKey):
                        value = None if r.value is None else decode_offset_commit_value(r.value)
                        if h.is_transactional:
                            pending_txn.setdefault(h.producer_id, {})[(key.group, key.topic, key.partition)] = (value, r.offset)
                        else:
                            apply_offset(key.group, (key.topic, key.partition), value, r.offset)
                    elif isinstance(key, GroupMetadataKey):
                        groups[key.group] = None if r.value is None else decode_group_metadata_value(r.value)
                    elif r.key is not None and (ckey := decode_consumer_key(r.key)) is not None:
                        replay(consumer_groups, ckey, r.value)
                    elif r.key is not None and (skey := decode_share_key(r.key)) is not None:
                        replay_share(share_groups, skey[0], skey[1], r.value)
                except (RecordFormatError, ShareRecordError) as e:
                    log.warning("offsets_record_skipped", offset=r.offset, error=str(e))
        offset = h.base_offset + h.last_offset_delta + 1
    return LoadedPartition(groups, offsets, count, offset, pending_txn, consumer_groups, share_groups)
