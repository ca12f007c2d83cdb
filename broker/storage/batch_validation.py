"""Checks on incoming batches before anything touches a file: headers and CRCs only, never records.

Producer input (leader appends) gets Kafka's client checks; replicated input (follower appends)
comes from a leader that already validated it, so only integrity and offset order are checked.
"""

from __future__ import annotations

from broker.storage.errors import (
    CORRUPT_MESSAGE,
    INVALID_RECORD,
    UNSUPPORTED_FOR_MESSAGE_FORMAT,
    InvalidRecordError,
    RecordTooLargeError,
)
from protocol.errors import ProtocolError
from protocol.primitives import read_varint, read_varlong
from protocol.records.batch import BATCH_HEADER_SIZE, BatchHeader, iter_batches, verify_crc
from protocol.records.compression import decompress

MAGIC_OFFSET = 16  # base offset (8) + batch length (4) + partition leader epoch (4)
MAX_COMPRESSION_CODEC = 4  # zstd; 5-7 are unassigned

Batches = list[tuple[int, BatchHeader]]  # (position in the input, header)


def validate_client_batches(records, max_message_bytes: int, *, allow_control: bool) -> Batches:
    """Every batch of a producer's input, or an exception and nothing else. Order of checks as in
    Kafka: size before CRC, so a huge batch is refused without hashing it."""
    batches: Batches = []
    try:
        for pos, header in iter_batches(records, check_crc=False):
            if header.size > max_message_bytes:
                raise RecordTooLargeError(
                    f"record batch of {header.size} bytes exceeds max.message.bytes ({max_message_bytes})"
                )
            verify_crc(records, pos, header)
            if header.record_count < 1:
                raise InvalidRecordError(f"record batch at byte {pos} reports {header.record_count} records")
            if header.last_offset_delta != header.record_count - 1:
                raise InvalidRecordError(
                    f"record batch at byte {pos}: lastOffsetDelta {header.last_offset_delta} does not match "
                    f"its record count {header.record_count}"
                )
            if header.is_control and not allow_control:
                raise InvalidRecordError("clients may not write control batches")
            if header.compression > MAX_COMPRESSION_CODEC:
                raise InvalidRecordError(
                    f"record batch at byte {pos} names unknown compression codec {header.compression}"
                )
            batches.append((pos, header))
    except ProtocolError as exc:
        code = exc.error_code
        at = exc.offset
        # As Kafka: the magic byte is judged first, so an old-format message set (magic 0/1,
        # whose entries are shorter than a v2 header) is UNSUPPORTED_FOR_MESSAGE_FORMAT, not corrupt.
        if code == CORRUPT_MESSAGE and at is not None and len(records) > at + MAGIC_OFFSET:
            magic = records[at + MAGIC_OFFSET]
            if magic in (0, 1):
                code = UNSUPPORTED_FOR_MESSAGE_FORMAT
                exc = ProtocolError(f"record batch magic {magic} is not supported (only magic 2)", offset=at)
        raise InvalidRecordError(str(exc), error_code=code) from None
    if not batches:
        raise InvalidRecordError("no record batch to append", error_code=INVALID_RECORD)
    return batches


def validate_replicated_batches(records) -> tuple[Batches, int]:
    """(batches, bytes they cover). A partial batch at the end is left out, as a fetch response
    may end mid-batch; anything corrupt before it is refused."""
    batches: Batches = []
    valid_bytes = 0
    next_offset = -1
    try:
        for pos, header in iter_batches(records, check_crc=True, allow_partial_tail=True):
            if header.last_offset_delta < 0 or header.base_offset < next_offset:
                raise InvalidRecordError(
                    f"replicated batch at byte {pos} has offsets [{header.base_offset}, {header.last_offset}] "
                    f"out of order (next expected >= {next_offset})",
                    error_code=CORRUPT_MESSAGE,
                )
            batches.append((pos, header))
            next_offset = header.last_offset + 1
            valid_bytes = pos + header.size
    except ProtocolError as exc:
        raise InvalidRecordError(str(exc), error_code=exc.error_code) from None
    return batches, valid_bytes


def first_record_without_key(records) -> int | None:
    """Index, within its batch, of the first record with a null key in the data batches of a
    producer's input (control batches skipped), or None. Compacted topics refuse such records, as
    Kafka's LogValidator. Walks each record's length prefix and key length only (decompressing as
    needed). Bytes that do not parse answer None: the append's own validation refuses them."""
    mv = memoryview(records)
    try:
        for pos, header in iter_batches(mv, check_crc=False):
            if header.is_control:
                continue
            body = mv[pos + BATCH_HEADER_SIZE : pos + header.size]
            if header.compression:
                body = memoryview(decompress(header.compression, body))
            p = 0
            for i in range(header.record_count):
                length, p = read_varint(body, p)
                end = p + length
                q = p + 1  # the record's attributes byte
                _, q = read_varlong(body, q)  # timestamp delta
                _, q = read_varint(body, q)  # offset delta
                key_length, _ = read_varint(body, q)
                if key_length < 0:
                    return i
                p = end
    except (ProtocolError, IndexError, ValueError):
        return None
    return None
