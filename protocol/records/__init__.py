"""Kafka record batches, magic 2: header access without touching records, CRC32C, in-place
patching for the broker's hot path, and full encode/decode with compression for tools/tests."""

from protocol.records.batch import (
    ATTR_CONTROL,
    ATTR_TRANSACTIONAL,
    BATCH_HEADER_SIZE,
    BatchHeader,
    iter_batches,
    read_header,
    set_base_offset,
    set_log_append_time,
    set_partition_leader_epoch,
    verify_crc,
)
from protocol.records.codec import Compression, DecodedBatch, Header, Record, decode_batches, encode_batch

__all__ = [
    "ATTR_CONTROL",
    "ATTR_TRANSACTIONAL",
    "BATCH_HEADER_SIZE",
    "BatchHeader",
    "Compression",
    "DecodedBatch",
    "Header",
    "Record",
    "decode_batches",
    "encode_batch",
    "iter_batches",
    "read_header",
    "set_base_offset",
    "set_log_append_time",
    "set_partition_leader_epoch",
    "verify_crc",
]
