"""The 61-byte batch header: read it, check CRC32C, patch fields in place.

Layout (Kafka's RecordBatch v2):
  0 baseOffset int64 | 8 batchLength int32 | 12 partitionLeaderEpoch int32 | 16 magic int8
  17 crc uint32 (CRC32C of bytes 21..end) | 21 attributes int16 | 23 lastOffsetDelta int32
  27 baseTimestamp int64 | 35 maxTimestamp int64 | 43 producerId int64 | 51 producerEpoch int16
  53 baseSequence int32 | 57 recordCount int32 | 61 records
baseOffset and partitionLeaderEpoch sit outside the CRC, so the broker patches them without
recomputing it; anything from byte 21 on needs a new CRC.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import NamedTuple

from crc32c import crc32c

from protocol.errors import ProtocolError

HEADER = struct.Struct(">qiibIhiqqqhii")
BATCH_HEADER_SIZE = HEADER.size  # 61
LOG_OVERHEAD = 12  # baseOffset + batchLength: batchLength counts the bytes after them
MAGIC_OFFSET = 16
CRC_OFFSET = 17
ATTRIBUTES_OFFSET = 21
MAX_TIMESTAMP_OFFSET = 35

ATTR_COMPRESSION_MASK = 0x07
ATTR_TIMESTAMP_TYPE = 0x08  # 1 = LogAppendTime
ATTR_TRANSACTIONAL = 0x10
ATTR_CONTROL = 0x20
ATTR_DELETE_HORIZON = 0x40

_INT64 = struct.Struct(">q")
_INT32 = struct.Struct(">i")
_UINT32 = struct.Struct(">I")
_INT16 = struct.Struct(">h")

CORRUPT_MESSAGE = 2
UNSUPPORTED_FOR_MESSAGE_FORMAT = 43


class BatchHeader(NamedTuple):
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def size(self) -> int:
        """Bytes the whole batch takes, header included."""
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def compression(self) -> int:
        return self.attributes & ATTR_COMPRESSION_MASK

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & ATTR_TRANSACTIONAL)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & ATTR_CONTROL)

    @property
    def log_append_time(self) -> bool:
        return bool(self.attributes & ATTR_TIMESTAMP_TYPE)


def read_header(buf, pos: int = 0) -> BatchHeader:
    """The header at pos. Raises ProtocolError if short or not magic 2."""
    if len(buf) - pos < 17:
        raise ProtocolError("record batch header truncated", offset=pos, error_code=CORRUPT_MESSAGE)
    magic = buf[pos + MAGIC_OFFSET]
    if magic != 2:
        raise ProtocolError(
            f"record batch magic {magic} is not supported (only magic 2)",
            offset=pos,
            error_code=UNSUPPORTED_FOR_MESSAGE_FORMAT,
        )
    if len(buf) - pos < BATCH_HEADER_SIZE:
        raise ProtocolError("record batch header truncated", offset=pos, error_code=CORRUPT_MESSAGE)
    return BatchHeader._make(HEADER.unpack_from(buf, pos))


def verify_crc(buf, pos: int, header: BatchHeader) -> None:
    end = pos + header.size
    actual = crc32c(memoryview(buf)[pos + ATTRIBUTES_OFFSET : end])
    if actual != header.crc:
        raise ProtocolError(
            f"record batch CRC mismatch (stored {header.crc:#010x}, computed {actual:#010x})",
            offset=pos,
            error_code=CORRUPT_MESSAGE,
        )


def iter_batches(buf, *, check_crc: bool = True, allow_partial_tail: bool = False) -> Iterator[tuple[int, BatchHeader]]:
    """Yield (position, header) for each batch in a records blob.

    With allow_partial_tail, a last batch cut short ends the iteration quietly (a fetch may end
    mid-batch, a log file may have a torn tail); otherwise it is CORRUPT_MESSAGE.
    """
    pos = 0
    n = len(buf)
    while pos < n:
        if n - pos < LOG_OVERHEAD:
            if allow_partial_tail:
                return
            raise ProtocolError("record batch truncated", offset=pos, error_code=CORRUPT_MESSAGE)
        batch_length = _INT32.unpack_from(buf, pos + 8)[0]
        if batch_length < BATCH_HEADER_SIZE - LOG_OVERHEAD:
            raise ProtocolError(f"record batch length {batch_length} is too small", offset=pos, error_code=CORRUPT_MESSAGE)
        if pos + LOG_OVERHEAD + batch_length > n:
            if allow_partial_tail:
                return
            raise ProtocolError("record batch runs past the end of the data", offset=pos, error_code=CORRUPT_MESSAGE)
        header = read_header(buf, pos)
        if check_crc:
            verify_crc(buf, pos, header)
        yield pos, header
        pos += header.size


def set_base_offset(buf, pos: int, base_offset: int) -> None:
    """Outside the CRC: no recompute needed."""
    _INT64.pack_into(buf, pos, base_offset)


def set_partition_leader_epoch(buf, pos: int, epoch: int) -> None:
    """Outside the CRC: no recompute needed."""
    _INT32.pack_into(buf, pos + 12, epoch)


def set_log_append_time(buf, pos: int, header: BatchHeader, timestamp: int) -> None:
    """Mark the batch LogAppendTime with this max timestamp and rewrite the CRC (as Kafka does)."""
    _INT16.pack_into(buf, pos + ATTRIBUTES_OFFSET, header.attributes | ATTR_TIMESTAMP_TYPE)
    _INT64.pack_into(buf, pos + MAX_TIMESTAMP_OFFSET, timestamp)
    crc = crc32c(memoryview(buf)[pos + ATTRIBUTES_OFFSET : pos + header.size])
    _UINT32.pack_into(buf, pos + CRC_OFFSET, crc)
