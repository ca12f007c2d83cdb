"""What a diskless coordinator and the brokers that call it say about batches (KIP-1164's
DisklessFindBatches and DisklessCommitFile answers, without their wire form): a lookup, the
batches found for it, and the result of one committed batch.

Its own module so both sides import it: the coordinator (coordinator/) answers with these, the
broker side (coordinator_client.py, wal.py, reader.py, partition.py) reads them, and neither has
to import the other for a type.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple
from uuid import UUID


@dataclass(frozen=True, slots=True)
class BatchRow:
    """One committed batch: where it lies in which WAL file, and the offsets it was assigned."""

    batch_id: int
    object_key: str
    magic: int
    byte_offset: int
    byte_size: int
    base_offset: int
    last_offset: int
    log_append_timestamp: int
    max_timestamp: int
    timestamp_type: int


class BatchLookup(NamedTuple):
    """One partition of a DisklessFindBatches: its batches from `offset` on, up to `max_bytes`
    (for a read_committed reader, those below the last stable offset)."""

    topic_id: UUID
    partition: int
    offset: int
    max_bytes: int
    read_committed: bool = False


class FoundBatches(NamedTuple):
    """The answer to one BatchLookup: an error or the batches, with the partition's offsets; for
    a read_committed lookup also the aborted transactions (producer id, first offset) overlapping
    the batches."""

    error_code: int
    log_start_offset: int
    high_watermark: int
    batches: list[BatchRow]
    last_stable_offset: int = -1
    aborted: list[tuple[int, int]] | None = None


class ProducerInfo(NamedTuple):
    """One producer of a diskless partition as the coordinator keeps it (DescribeProducers)."""

    producer_id: int
    producer_epoch: int
    last_sequence: int  # -1: none
    last_timestamp: int  # -1: none
    coordinator_epoch: int  # of its last marker, -1: none
    txn_start_offset: int  # of its open transaction, -1: none


@dataclass(slots=True)
class BatchResult:
    """The answer to one batch of a DisklessCommitFile (the WAL writer stamps log_append_time)."""

    error_code: int = 0
    error_message: str | None = None
    base_offset: int = -1
    log_append_time: int = -1
    log_start_offset: int = -1
    duplicate: bool = False
