"""Kafka error codes (names and numbers are Kafka's; the messages are ours) and ProtocolError."""

from __future__ import annotations

from typing import Final, NamedTuple


class ErrorCode(NamedTuple):
    code: int
    name: str
    retriable: bool
    message: str


class Errors:
    """Error codes as attributes: ``Errors.NOT_LEADER_OR_FOLLOWER == 6`` (plain ints)."""

    UNKNOWN_SERVER_ERROR: Final = -1
    NONE: Final = 0
    OFFSET_OUT_OF_RANGE: Final = 1
    CORRUPT_MESSAGE: Final = 2
    UNKNOWN_TOPIC_OR_PARTITION: Final = 3
    INVALID_FETCH_SIZE: Final = 4
    LEADER_NOT_AVAILABLE: Final = 5
    NOT_LEADER_OR_FOLLOWER: Final = 6
    REQUEST_TIMED_OUT: Final = 7
    BROKER_NOT_AVAILABLE: Final = 8
    REPLICA_NOT_AVAILABLE: Final = 9
    MESSAGE_TOO_LARGE: Final = 10
    STALE_CONTROLLER_EPOCH: Final = 11
    OFFSET_METADATA_TOO_LARGE: Final = 12
    NETWORK_EXCEPTION: Final = 13
    COORDINATOR_LOAD_IN_PROGRESS: Final = 14
    COORDINATOR_NOT_AVAILABLE: Final = 15
    NOT_COORDINATOR: Final = 16
    INVALID_TOPIC_EXCEPTION: Final = 17
    RECORD_LIST_TOO_LARGE: Final = 18
    NOT_ENOUGH_REPLICAS: Final = 19
    NOT_ENOUGH_REPLICAS_AFTER_APPEND: Final = 20
    INVALID_REQUIRED_ACKS: Final = 21
    ILLEGAL_GENERATION: Final = 22
    INCONSISTENT_GROUP_PROTOCOL: Final = 23
    INVALID_GROUP_ID: Final = 24
    UNKNOWN_MEMBER_ID: Final = 25
    INVALID_SESSION_TIMEOUT: Final = 26
    REBALANCE_IN_PROGRESS: Final = 27
    INVALID_COMMIT_OFFSET_SIZE: Final = 28
    TOPIC_AUTHORIZATION_FAILED: Final = 29
    GROUP_AUTHORIZATION_FAILED: Final = 30
    CLUSTER_AUTHORIZATION_FAILED: Final = 31
    INVALID_TIMESTAMP: Final = 32
    UNSUPPORTED_SASL_MECHANISM: Final = 33
    ILLEGAL_SASL_STATE: Final = 34
    UNSUPPORTED_VERSION: Final = 35
    TOPIC_ALREADY_EXISTS: Final = 36
    INVALID_PARTITIONS: Final = 37
    INVALID_REPLICATION_FACTOR: Final = 38
    INVALID_REPLICA_ASSIGNMENT: Final = 39
    INVALID_CONFIG: Final = 40
    NOT_CONTROLLER: Final = 41
    INVALID_REQUEST: Final = 42
    UNSUPPORTED_FOR_MESSAGE_FORMAT: Final = 43
    POLICY_VIOLATION: Final = 44
    OUT_OF_ORDER_SEQUENCE_NUMBER: Final = 45
    DUPLICATE_SEQUENCE_NUMBER: Final = 46
    INVALID_PRODUCER_EPOCH: Final = 47
    INVALID_TXN_STATE: Final = 48
    INVALID_PRODUCER_ID_MAPPING: Final = 49
    INVALID_TRANSACTION_TIMEOUT: Final = 50
    CONCURRENT_TRANSACTIONS: Final = 51
    TRANSACTION_COORDINATOR_FENCED: Final = 52
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED: Final = 53
    SECURITY_DISABLED: Final = 54
    OPERATION_NOT_ATTEMPTED: Final = 55
    KAFKA_STORAGE_ERROR: Final = 56
    LOG_DIR_NOT_FOUND: Final = 57
    SASL_AUTHENTICATION_FAILED: Final = 58
    UNKNOWN_PRODUCER_ID: Final = 59
    REASSIGNMENT_IN_PROGRESS: Final = 60
    DELEGATION_TOKEN_AUTH_DISABLED: Final = 61
    DELEGATION_TOKEN_NOT_FOUND: Final = 62
    DELEGATION_TOKEN_OWNER_MISMATCH: Final = 63
    DELEGATION_TOKEN_REQUEST_NOT_ALLOWED: Final = 64
    DELEGATION_TOKEN_AUTHORIZATION_FAILED: Final = 65
    DELEGATION_TOKEN_EXPIRED: Final = 66
    INVALID_PRINCIPAL_TYPE: Final = 67
    NON_EMPTY_GROUP: Final = 68
    GROUP_ID_NOT_FOUND: Final = 69
    FETCH_SESSION_ID_NOT_FOUND: Final = 70
    INVALID_FETCH_SESSION_EPOCH: Final = 71
    LISTENER_NOT_FOUND: Final = 72
    TOPIC_DELETION_DISABLED: Final = 73
    FENCED_LEADER_EPOCH: Final = 74
    UNKNOWN_LEADER_EPOCH: Final = 75
    UNSUPPORTED_COMPRESSION_TYPE: Final = 76
    STALE_BROKER_EPOCH: Final = 77
    OFFSET_NOT_AVAILABLE: Final = 78
    MEMBER_ID_REQUIRED: Final = 79
    PREFERRED_LEADER_NOT_AVAILABLE: Final = 80
    GROUP_MAX_SIZE_REACHED: Final = 81
    FENCED_INSTANCE_ID: Final = 82
    ELIGIBLE_LEADERS_NOT_AVAILABLE: Final = 83
    ELECTION_NOT_NEEDED: Final = 84
    NO_REASSIGNMENT_IN_PROGRESS: Final = 85
    GROUP_SUBSCRIBED_TO_TOPIC: Final = 86
    INVALID_RECORD: Final = 87
    UNSTABLE_OFFSET_COMMIT: Final = 88
    THROTTLING_QUOTA_EXCEEDED: Final = 89
    PRODUCER_FENCED: Final = 90
    RESOURCE_NOT_FOUND: Final = 91
    DUPLICATE_RESOURCE: Final = 92
    UNACCEPTABLE_CREDENTIAL: Final = 93
    INCONSISTENT_VOTER_SET: Final = 94
    INVALID_UPDATE_VERSION: Final = 95
    FEATURE_UPDATE_FAILED: Final = 96
    PRINCIPAL_DESERIALIZATION_FAILURE: Final = 97
    SNAPSHOT_NOT_FOUND: Final = 98
    POSITION_OUT_OF_RANGE: Final = 99
    UNKNOWN_TOPIC_ID: Final = 100
    DUPLICATE_BROKER_REGISTRATION: Final = 101
    BROKER_ID_NOT_REGISTERED: Final = 102
    INCONSISTENT_TOPIC_ID: Final = 103
    INCONSISTENT_CLUSTER_ID: Final = 104
    TRANSACTIONAL_ID_NOT_FOUND: Final = 105
    FETCH_SESSION_TOPIC_ID_ERROR: Final = 106
    INELIGIBLE_REPLICA: Final = 107
    NEW_LEADER_ELECTED: Final = 108
    OFFSET_MOVED_TO_TIERED_STORAGE: Final = 109
    FENCED_MEMBER_EPOCH: Final = 110
    UNRELEASED_INSTANCE_ID: Final = 111
    UNSUPPORTED_ASSIGNOR: Final = 112
    STALE_MEMBER_EPOCH: Final = 113
    MISMATCHED_ENDPOINT_TYPE: Final = 114
    UNSUPPORTED_ENDPOINT_TYPE: Final = 115
    UNKNOWN_CONTROLLER_ID: Final = 116
    UNKNOWN_SUBSCRIPTION_ID: Final = 117
    TELEMETRY_TOO_LARGE: Final = 118
    INVALID_REGISTRATION: Final = 119
    TRANSACTION_ABORTABLE: Final = 120
    INVALID_RECORD_STATE: Final = 121
    SHARE_SESSION_NOT_FOUND: Final = 122
    INVALID_SHARE_SESSION_EPOCH: Final = 123
    FENCED_STATE_EPOCH: Final = 124
    DUPLICATE_VOTER: Final = 126
    VOTER_NOT_FOUND: Final = 127
    INVALID_REGULAR_EXPRESSION: Final = 128
    SHARE_SESSION_LIMIT_REACHED: Final = 133
    # Strata's own codes start at 1000, clear of Kafka's (see README "Error codes of Strata's own")
    INVALID_PARTITION_METADATA: Final = 1000


class ProtocolError(Exception):
    """The only exception a decoder raises on bad input.

    Carries where it happened (API, version, field, byte offset) so one log line explains it.
    """

    def __init__(
        self,
        reason: str,
        *,
        api: str | None = None,
        version: int | None = None,
        field: str | None = None,
        offset: int | None = None,
        error_code: int = Errors.INVALID_REQUEST,
    ) -> None:
        self.reason = reason
        self.api = api
        self.version = version
        self.field = field
        self.offset = offset
        self.error_code = error_code
        super().__init__(reason)

    def __str__(self) -> str:
        where = []
        if self.api is not None:
            where.append(self.api if self.version is None else f"{self.api} v{self.version}")
        if self.field is not None:
            where.append(f"field {self.field}")
        if self.offset is not None:
            where.append(f"at byte {self.offset}")
        return f"{self.reason} ({', '.join(where)})" if where else self.reason


_TABLE: list[tuple[int, bool, str]] = [
    # (code, retriable, message); each code in Errors exactly once
    (Errors.UNKNOWN_SERVER_ERROR, False, "The server hit an unexpected error."),
    (Errors.NONE, False, ""),
    (Errors.OFFSET_OUT_OF_RANGE, False, "The requested offset is outside the range the server holds."),
    (Errors.CORRUPT_MESSAGE, True, "A message failed its CRC check, is too short, or is otherwise corrupt."),
    (Errors.UNKNOWN_TOPIC_OR_PARTITION, True, "This server does not host this topic-partition."),
    (Errors.INVALID_FETCH_SIZE, False, "The requested fetch size is invalid."),
    (Errors.LEADER_NOT_AVAILABLE, True, "The partition has no leader right now (an election may be under way)."),
    (Errors.NOT_LEADER_OR_FOLLOWER, True, "This server is not the leader or a follower of that partition."),
    (Errors.REQUEST_TIMED_OUT, True, "The request timed out."),
    (Errors.BROKER_NOT_AVAILABLE, False, "The broker is not available."),
    (Errors.REPLICA_NOT_AVAILABLE, True, "The replica is not available for the requested partition."),
    (Errors.MESSAGE_TOO_LARGE, False, "The request holds a message larger than the server accepts."),
    (Errors.STALE_CONTROLLER_EPOCH, False, "The controller moved to another broker."),
    (Errors.OFFSET_METADATA_TOO_LARGE, False, "The metadata field of the offset request was too large."),
    (Errors.NETWORK_EXCEPTION, True, "The server disconnected before a response was received."),
    (Errors.COORDINATOR_LOAD_IN_PROGRESS, True, "The coordinator is still loading its state."),
    (Errors.COORDINATOR_NOT_AVAILABLE, True, "The coordinator is not available."),
    (Errors.NOT_COORDINATOR, True, "This is not the right coordinator."),
    (Errors.INVALID_TOPIC_EXCEPTION, False, "The topic name is not valid or the request may not touch it."),
    (Errors.RECORD_LIST_TOO_LARGE, False, "The batch is larger than the configured segment size."),
    (Errors.NOT_ENOUGH_REPLICAS, True, "Fewer in-sync replicas than min.insync.replicas."),
    (
        Errors.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        True,
        "Written to the log, but with fewer in-sync replicas than required.",
    ),
    (Errors.INVALID_REQUIRED_ACKS, False, "The requested acks value is invalid (allowed: -1, 0, 1)."),
    (Errors.ILLEGAL_GENERATION, False, "The generation id is not the current one."),
    (Errors.INCONSISTENT_GROUP_PROTOCOL, False, "The member's protocol type or protocols do not match the group's."),
    (Errors.INVALID_GROUP_ID, False, "The group id is empty or null."),
    (Errors.UNKNOWN_MEMBER_ID, False, "The coordinator does not know this member id."),
    (Errors.INVALID_SESSION_TIMEOUT, False, "The session timeout is outside the broker's allowed range."),
    (Errors.REBALANCE_IN_PROGRESS, False, "The group is rebalancing; rejoin it."),
    (Errors.INVALID_COMMIT_OFFSET_SIZE, False, "The committing offset data size is not valid."),
    (Errors.TOPIC_AUTHORIZATION_FAILED, False, "Not authorized to access the topic."),
    (Errors.GROUP_AUTHORIZATION_FAILED, False, "Not authorized to access the group."),
    (Errors.CLUSTER_AUTHORIZATION_FAILED, False, "Not authorized for this cluster operation."),
    (Errors.INVALID_TIMESTAMP, False, "The timestamp is outside the accepted range."),
    (Errors.UNSUPPORTED_SASL_MECHANISM, False, "The broker does not support that SASL mechanism."),
    (Errors.ILLEGAL_SASL_STATE, False, "That request is not valid in the current SASL state."),
    (Errors.UNSUPPORTED_VERSION, False, "The broker does not support that API version."),
    (Errors.TOPIC_ALREADY_EXISTS, False, "The topic already exists."),
    (Errors.INVALID_PARTITIONS, False, "The number of partitions is invalid."),
    (Errors.INVALID_REPLICATION_FACTOR, False, "The replication factor is invalid."),
    (Errors.INVALID_REPLICA_ASSIGNMENT, False, "The replica assignment is invalid."),
    (Errors.INVALID_CONFIG, False, "The configuration is invalid."),
    (Errors.NOT_CONTROLLER, True, "This is not the active controller."),
    (Errors.INVALID_REQUEST, False, "The request is malformed or not valid for this broker."),
    (Errors.UNSUPPORTED_FOR_MESSAGE_FORMAT, False, "The message format of the request is not supported."),
    (Errors.POLICY_VIOLATION, False, "The request violates a configured policy."),
    (Errors.OUT_OF_ORDER_SEQUENCE_NUMBER, False, "The broker received an out-of-order sequence number."),
    (Errors.DUPLICATE_SEQUENCE_NUMBER, False, "The broker received a duplicate sequence number."),
    (Errors.INVALID_PRODUCER_EPOCH, False, "The producer's epoch is older than the one the broker knows."),
    (Errors.INVALID_TXN_STATE, False, "The operation is not valid in the transaction's current state."),
    (Errors.INVALID_PRODUCER_ID_MAPPING, False, "The producer id does not match the transactional id."),
    (Errors.INVALID_TRANSACTION_TIMEOUT, False, "The transaction timeout exceeds transaction.max.timeout.ms."),
    (Errors.CONCURRENT_TRANSACTIONS, True, "Another operation on this transaction is still in progress."),
    (Errors.TRANSACTION_COORDINATOR_FENCED, False, "A newer transaction coordinator has taken over."),
    (Errors.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, False, "Not authorized for this transactional id."),
    (Errors.SECURITY_DISABLED, False, "Security features are disabled."),
    (Errors.OPERATION_NOT_ATTEMPTED, False, "Not attempted because a related operation in the batch failed."),
    (Errors.KAFKA_STORAGE_ERROR, True, "A disk error while reading or writing the log."),
    (Errors.LOG_DIR_NOT_FOUND, False, "The log directory is not on this broker."),
    (Errors.SASL_AUTHENTICATION_FAILED, False, "SASL authentication failed."),
    (Errors.UNKNOWN_PRODUCER_ID, False, "The broker has no state for this producer id."),
    (Errors.REASSIGNMENT_IN_PROGRESS, False, "A reassignment of this partition is in progress."),
    (Errors.DELEGATION_TOKEN_AUTH_DISABLED, False, "Delegation token authentication is disabled."),
    (Errors.DELEGATION_TOKEN_NOT_FOUND, False, "No such delegation token."),
    (Errors.DELEGATION_TOKEN_OWNER_MISMATCH, False, "The principal does not own this delegation token."),
    (Errors.DELEGATION_TOKEN_REQUEST_NOT_ALLOWED, False, "Delegation token requests are not allowed on this channel."),
    (Errors.DELEGATION_TOKEN_AUTHORIZATION_FAILED, False, "Not authorized for this delegation token."),
    (Errors.DELEGATION_TOKEN_EXPIRED, False, "The delegation token has expired."),
    (Errors.INVALID_PRINCIPAL_TYPE, False, "The principal type is not supported."),
    (Errors.NON_EMPTY_GROUP, False, "The group is not empty."),
    (Errors.GROUP_ID_NOT_FOUND, False, "The group id does not exist."),
    (Errors.FETCH_SESSION_ID_NOT_FOUND, True, "The fetch session id was not found."),
    (Errors.INVALID_FETCH_SESSION_EPOCH, True, "The fetch session epoch is not the expected one."),
    (Errors.LISTENER_NOT_FOUND, True, "The leader has no endpoint on the listener the request came in on."),
    (Errors.TOPIC_DELETION_DISABLED, False, "Topic deletion is disabled."),
    (Errors.FENCED_LEADER_EPOCH, True, "The request's leader epoch is older than the broker's."),
    (Errors.UNKNOWN_LEADER_EPOCH, True, "The request's leader epoch is newer than the broker's."),
    (Errors.UNSUPPORTED_COMPRESSION_TYPE, False, "The requesting client does not support the compression type."),
    (Errors.STALE_BROKER_EPOCH, False, "The broker epoch has changed."),
    (Errors.OFFSET_NOT_AVAILABLE, True, "The leader's high watermark has not caught up yet."),
    (Errors.MEMBER_ID_REQUIRED, False, "The group member must rejoin with the member id it was given."),
    (Errors.PREFERRED_LEADER_NOT_AVAILABLE, True, "The preferred leader was not available."),
    (Errors.GROUP_MAX_SIZE_REACHED, False, "The group has reached its maximum size."),
    (Errors.FENCED_INSTANCE_ID, False, "Another member with this group.instance.id has fenced this one."),
    (Errors.ELIGIBLE_LEADERS_NOT_AVAILABLE, True, "No eligible leader for the partition."),
    (Errors.ELECTION_NOT_NEEDED, True, "No leader election is needed."),
    (Errors.NO_REASSIGNMENT_IN_PROGRESS, False, "No partition reassignment is in progress."),
    (Errors.GROUP_SUBSCRIBED_TO_TOPIC, False, "The group is still subscribed to the topic."),
    (Errors.INVALID_RECORD, False, "A record failed the broker's validation."),
    (Errors.UNSTABLE_OFFSET_COMMIT, True, "Pending transactional offset commits exist for this partition."),
    (Errors.THROTTLING_QUOTA_EXCEEDED, True, "The throttling quota was exceeded."),
    (Errors.PRODUCER_FENCED, False, "A newer producer with the same transactional id has fenced this one."),
    (Errors.RESOURCE_NOT_FOUND, False, "The request names a resource that does not exist."),
    (Errors.DUPLICATE_RESOURCE, False, "The request names a resource more than once."),
    (Errors.UNACCEPTABLE_CREDENTIAL, False, "The requested credential is not acceptable."),
    (Errors.INCONSISTENT_VOTER_SET, False, "The voter sets of leader and follower differ."),
    (Errors.INVALID_UPDATE_VERSION, False, "The update version is invalid."),
    (Errors.FEATURE_UPDATE_FAILED, False, "A feature update could not be applied."),
    (Errors.PRINCIPAL_DESERIALIZATION_FAILURE, False, "The principal in the envelope could not be read."),
    (Errors.SNAPSHOT_NOT_FOUND, False, "The requested snapshot was not found."),
    (Errors.POSITION_OUT_OF_RANGE, False, "The requested position is not in the snapshot."),
    (Errors.UNKNOWN_TOPIC_ID, True, "This server does not host a topic with this id."),
    (Errors.DUPLICATE_BROKER_REGISTRATION, False, "This broker id is already registered."),
    (Errors.BROKER_ID_NOT_REGISTERED, False, "The broker id is not registered."),
    (Errors.INCONSISTENT_TOPIC_ID, True, "The topic id in the log does not match the request's."),
    (Errors.INCONSISTENT_CLUSTER_ID, False, "The cluster id in the request does not match this cluster."),
    (Errors.TRANSACTIONAL_ID_NOT_FOUND, False, "The transactional id was not found."),
    (Errors.FETCH_SESSION_TOPIC_ID_ERROR, True, "The fetch session met topic id trouble."),
    (Errors.INELIGIBLE_REPLICA, False, "The new ISR holds an ineligible replica."),
    (Errors.NEW_LEADER_ELECTED, False, "A new leader was elected for the partition."),
    (Errors.OFFSET_MOVED_TO_TIERED_STORAGE, False, "The offset was moved to tiered storage."),
    (Errors.FENCED_MEMBER_EPOCH, False, "The member epoch is fenced by the group coordinator."),
    (Errors.UNRELEASED_INSTANCE_ID, False, "The instance id is still used by another member."),
    (Errors.UNSUPPORTED_ASSIGNOR, False, "The assignor or its version is not supported by the group."),
    (Errors.STALE_MEMBER_EPOCH, False, "The member epoch is stale."),
    (Errors.MISMATCHED_ENDPOINT_TYPE, False, "The request went to an endpoint of the wrong type."),
    (Errors.UNSUPPORTED_ENDPOINT_TYPE, False, "This endpoint type does not support the request."),
    (Errors.UNKNOWN_CONTROLLER_ID, False, "This controller id is not known."),
    (Errors.UNKNOWN_SUBSCRIPTION_ID, False, "The client subscription id is not known."),
    (Errors.TELEMETRY_TOO_LARGE, False, "The telemetry payload is too large."),
    (Errors.INVALID_REGISTRATION, False, "The broker registration is not valid."),
    (Errors.TRANSACTION_ABORTABLE, False, "The server hit an error the transaction can recover from by aborting."),
    (Errors.INVALID_RECORD_STATE, False, "The record is not in a state that allows this acknowledgement."),
    (Errors.SHARE_SESSION_NOT_FOUND, True, "The share session was not found."),
    (Errors.INVALID_SHARE_SESSION_EPOCH, True, "The share session epoch is not the expected one."),
    (Errors.FENCED_STATE_EPOCH, False, "The share-partition state epoch is older than the coordinator's."),
    (Errors.DUPLICATE_VOTER, False, "The voter is already part of the set of voters."),
    (Errors.VOTER_NOT_FOUND, False, "The voter is not part of the set of voters."),
    (Errors.INVALID_REGULAR_EXPRESSION, False, "The regular expression is not valid."),
    (Errors.SHARE_SESSION_LIMIT_REACHED, True, "The broker holds as many share sessions as it may."),
    # Strata's own codes start at 1000, clear of Kafka's (see README "Error codes of Strata's own")
    (
        Errors.INVALID_PARTITION_METADATA,
        True,
        "The producer's undeleted_partition_count differs from the broker's: refresh metadata and retry (KIP-253).",
    ),
]

# Every code has one name (its attribute in Errors) and one row in _TABLE.
_CODES: dict[str, int] = {k: v for k, v in vars(Errors).items() if not k.startswith("_")}
_NAMES: dict[int, str] = {v: k for k, v in _CODES.items()}
_ROWS = [c for c, _, _ in _TABLE]
if not len(_CODES) == len(_NAMES) == len(_ROWS) == len(set(_ROWS)) or set(_NAMES) != set(_ROWS):
    raise AssertionError("protocol.errors: Errors and _TABLE must list the same codes, each once")

ERRORS: dict[int, ErrorCode] = {c: ErrorCode(c, _NAMES[c], r, m) for c, r, m in _TABLE}
BY_NAME: dict[str, ErrorCode] = {e.name: e for e in ERRORS.values()}


def error_name(code: int) -> str:
    e = ERRORS.get(code)
    return e.name if e else f"UNKNOWN_ERROR_{code}"


def error_message(code: int) -> str:
    e = ERRORS.get(code)
    return e.message if e else f"Unknown error code {code}."
