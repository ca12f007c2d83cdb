"""Storage exceptions. Each carries the Kafka error code the request layer answers with."""

from __future__ import annotations

KAFKA_STORAGE_ERROR = 56
REQUEST_TIMED_OUT = 7
INVALID_TIMESTAMP = 32
OFFSET_OUT_OF_RANGE = 1
CORRUPT_MESSAGE = 2
MESSAGE_TOO_LARGE = 10
RECORD_LIST_TOO_LARGE = 18
UNSUPPORTED_FOR_MESSAGE_FORMAT = 43
INVALID_RECORD = 87
INCONSISTENT_TOPIC_ID = 103
UNKNOWN_SERVER_ERROR = -1


class StorageError(Exception):
    """Anything the storage layer refuses or fails to do. The default code is KAFKA_STORAGE_ERROR:
    an I/O failure, after which the log (and its log dir) should be treated as offline.
    `record_errors` lists (batch index, message) for Produce's per-batch errors, when known."""

    error_code: int = KAFKA_STORAGE_ERROR

    def __init__(
        self, message: str, *, error_code: int | None = None, record_errors: list[tuple[int, str]] | None = None
    ) -> None:
        super().__init__(message)
        if error_code is not None:
            self.error_code = error_code
        self.record_errors = record_errors or []


class ResourceExhaustedError(StorageError):
    """The process ran out of descriptors or memory (EMFILE, ENFILE, ENOMEM): not a disk fault. The
    log and its dir stay online; the request fails with a retriable code. Kafka has no code for it;
    REQUEST_TIMED_OUT is retriable in every client (they back off and retry the same leader) and is
    what Kafka answers for work it could not finish in time."""

    error_code = REQUEST_TIMED_OUT


class InvalidTimestampError(StorageError):
    """A CreateTime timestamp outside [now - message.timestamp.before.max.ms, now +
    message.timestamp.after.max.ms] (KIP-937)."""

    error_code = INVALID_TIMESTAMP


class InvalidRecordError(StorageError):
    """Input batches that fail validation: CORRUPT_MESSAGE (bad CRC, truncated),
    UNSUPPORTED_FOR_MESSAGE_FORMAT (magic 0/1) or INVALID_RECORD (bad counts, control batch from a client)."""

    error_code = INVALID_RECORD


class RecordTooLargeError(StorageError):
    """A batch larger than max.message.bytes."""

    error_code = MESSAGE_TOO_LARGE


class RecordListTooLargeError(RecordTooLargeError):
    """The batches of one append together exceed segment.bytes: they could never fit one segment."""

    error_code = RECORD_LIST_TOO_LARGE


class OffsetOutOfRangeError(StorageError):
    """A read below the log start offset or past the log end offset."""

    error_code = OFFSET_OUT_OF_RANGE


class InconsistentTopicIdError(StorageError):
    """The dir's partition.metadata names another topic id than the one we were given."""

    error_code = INCONSISTENT_TOPIC_ID


class UnexpectedAppendOffsetError(StorageError):
    """A follower append that does not start at the log end offset (the replication layer must
    truncate or re-fetch; never answered to a client)."""

    error_code = UNKNOWN_SERVER_ERROR

    def __init__(self, message: str, *, first_offset: int, expected_offset: int) -> None:
        super().__init__(message)
        self.first_offset = first_offset
        self.expected_offset = expected_offset
