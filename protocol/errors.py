"""Kafka error codes (names and numbers are Kafka's; the messages are ours) and ProtocolError."""

from __future__ import annotations

from typing import NamedTuple


class ErrorCode(NamedTuple):
    code: int
    name: str
    retriable: bool
    message: str


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
        error_code: int = 42,  # INVALID_REQUEST
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


_TABLE = [
    (-1, "UNKNOWN_SERVER_ERROR", False, "The server hit an unexpected error."),
    (0, "NONE", False, ""),
    (1, "OFFSET_OUT_OF_RANGE", False, "The requested offset is outside the range the server holds."),
    (2, "CORRUPT_MESSAGE", True, "A message failed its CRC check, is too short, or is otherwise corrupt."),
    (3, "UNKNOWN_TOPIC_OR_PARTITION", True, "This server does not host this topic-partition."),
    (4, "INVALID_FETCH_SIZE", False, "The requested fetch size is invalid."),
    (5, "LEADER_NOT_AVAILABLE", True, "The partition has no leader right now (an election may be under way)."),
    (6, "NOT_LEADER_OR_FOLLOWER", True, "This server is not the leader or a follower of that partition."),
    (7, "REQUEST_TIMED_OUT", True, "The request timed out."),
    (8, "BROKER_NOT_AVAILABLE", False, "The broker is not available."),
    (9, "REPLICA_NOT_AVAILABLE", True, "The replica is not available for the requested partition."),
    (10, "MESSAGE_TOO_LARGE", False, "The request holds a message larger than the server accepts."),
    (11, "STALE_CONTROLLER_EPOCH", False, "The controller moved to another broker."),
    (12, "OFFSET_METADATA_TOO_LARGE", False, "The metadata field of the offset request was too large."),
    (13, "NETWORK_EXCEPTION", True, "The server disconnected before a response was received."),
    (14, "COORDINATOR_LOAD_IN_PROGRESS", True, "The coordinator is still loading its state."),
    (15, "COORDINATOR_NOT_AVAILABLE", True, "The coordinator is not available."),
    (16, "NOT_COORDINATOR", True, "This is not the right coordinator."),
    (17, "INVALID_TOPIC_EXCEPTION", False, "The topic name is not valid or the request may not touch it."),
    (18, "RECORD_LIST_TOO_LARGE", False, "The batch is larger than the configured segment size."),
    (19, "NOT_ENOUGH_REPLICAS", True, "Fewer in-sync replicas than min.insync.replicas."),
    (20, "NOT_ENOUGH_REPLICAS_AFTER_APPEND", True, "Written to the log, but with fewer in-sync replicas than required."),
    (21, "INVALID_REQUIRED_ACKS", False, "The requested acks value is invalid (allowed: -1, 0, 1)."),
    (22, "ILLEGAL_GENERATION", False, "The generation id is not the current one."),
    (23, "INCONSISTENT_GROUP_PROTOCOL", False, "The member's protocol type or protocols do not match the group's."),
    (24, "INVALID_GROUP_ID", False, "The group id is empty or null."),
    (25, "UNKNOWN_MEMBER_ID", False, "The coordinator does not know this member id."),
    (26, "INVALID_SESSION_TIMEOUT", False, "The session timeout is outside the broker's allowed range."),
    (27, "REBALANCE_IN_PROGRESS", False, "The group is rebalancing; rejoin it."),
    (28, "INVALID_COMMIT_OFFSET_SIZE", False, "The committing offset data size is not valid."),
    (29, "TOPIC_AUTHORIZATION_FAILED", False, "Not authorized to access the topic."),
    (30, "GROUP_AUTHORIZATION_FAILED", False, "Not authorized to access the group."),
    (31, "CLUSTER_AUTHORIZATION_FAILED", False, "Not authorized for this cluster operation."),
    (32, "INVALID_TIMESTAMP", False, "The timestamp is outside the accepted range."),
    (33, "UNSUPPORTED_SASL_MECHANISM", False, "The broker does not support that SASL mechanism."),
    (34, "ILLEGAL_SASL_STATE", False, "That request is not valid in the current SASL state."),
    (35, "UNSUPPORTED_VERSION", False, "The broker does not support that API version."),
    (36, "TOPIC_ALREADY_EXISTS", False, "The topic already exists."),
    (37, "INVALID_PARTITIONS", False, "The number of partitions is invalid."),
    (38, "INVALID_REPLICATION_FACTOR", False, "The replication factor is invalid."),
    (39, "INVALID_REPLICA_ASSIGNMENT", False, "The replica assignment is invalid."),
    (40, "INVALID_CONFIG", False, "The configuration is invalid."),
    (41, "NOT_CONTROLLER", True, "This is not the active controller."),
    (42, "INVALID_REQUEST", False, "The request is malformed or not valid for this broker."),
    (43, "UNSUPPORTED_FOR_MESSAGE_FORMAT", False, "The message format of the request is not supported."),
    (44, "POLICY_VIOLATION", False, "The request violates a configured policy."),
    (45, "OUT_OF_ORDER_SEQUENCE_NUMBER", False, "The broker received an out-of-order sequence number."),
    (46, "DUPLICATE_SEQUENCE_NUMBER", False, "The broker received a duplicate sequence number."),
    (47, "INVALID_PRODUCER_EPOCH", False, "The producer's epoch is older than the one the broker knows."),
    (48, "INVALID_TXN_STATE", False, "The operation is not valid in the transaction's current state."),
    (49, "INVALID_PRODUCER_ID_MAPPING", False, "The producer id does not match the transactional id."),
    (50, "INVALID_TRANSACTION_TIMEOUT", False, "The transaction timeout exceeds transaction.max.timeout.ms."),
    (51, "CONCURRENT_TRANSACTIONS", True, "Another operation on this transaction is still in progress."),
    (52, "TRANSACTION_COORDINATOR_FENCED", False, "A newer transaction coordinator has taken over."),
    (53, "TRANSACTIONAL_ID_AUTHORIZATION_FAILED", False, "Not authorized for this transactional id."),
    (54, "SECURITY_DISABLED", False, "Security features are disabled."),
    (55, "OPERATION_NOT_ATTEMPTED", False, "Not attempted because a related operation in the batch failed."),
    (56, "KAFKA_STORAGE_ERROR", True, "A disk error while reading or writing the log."),
    (57, "LOG_DIR_NOT_FOUND", False, "The log directory is not on this broker."),
    (58, "SASL_AUTHENTICATION_FAILED", False, "SASL authentication failed."),
    (59, "UNKNOWN_PRODUCER_ID", False, "The broker has no state for this producer id."),
    (60, "REASSIGNMENT_IN_PROGRESS", False, "A reassignment of this partition is in progress."),
    (61, "DELEGATION_TOKEN_AUTH_DISABLED", False, "Delegation token authentication is disabled."),
    (62, "DELEGATION_TOKEN_NOT_FOUND", False, "No such delegation token."),
    (63, "DELEGATION_TOKEN_OWNER_MISMATCH", False, "The principal does not own this delegation token."),
    (64, "DELEGATION_TOKEN_REQUEST_NOT_ALLOWED", False, "Delegation token requests are not allowed on this channel."),
    (65, "DELEGATION_TOKEN_AUTHORIZATION_FAILED", False, "Not authorized for this delegation token."),
    (66, "DELEGATION_TOKEN_EXPIRED", False, "The delegation token has expired."),
    (67, "INVALID_PRINCIPAL_TYPE", False, "The principal type is not supported."),
    (68, "NON_EMPTY_GROUP", False, "The group is not empty."),
    (69, "GROUP_ID_NOT_FOUND", False, "The group id does not exist."),
    (70, "FETCH_SESSION_ID_NOT_FOUND", True, "The fetch session id was not found."),
    (71, "INVALID_FETCH_SESSION_EPOCH", True, "The fetch session epoch is not the expected one."),
    (72, "LISTENER_NOT_FOUND", True, "The leader has no endpoint on the listener the request came in on."),
    (73, "TOPIC_DELETION_DISABLED", False, "Topic deletion is disabled."),
    (74, "FENCED_LEADER_EPOCH", True, "The request's leader epoch is older than the broker's."),
    (75, "UNKNOWN_LEADER_EPOCH", True, "The request's leader epoch is newer than the broker's."),
    (76, "UNSUPPORTED_COMPRESSION_TYPE", False, "The requesting client does not support the compression type."),
    (77, "STALE_BROKER_EPOCH", False, "The broker epoch has changed."),
    (78, "OFFSET_NOT_AVAILABLE", True, "The leader's high watermark has not caught up yet."),
    (79, "MEMBER_ID_REQUIRED", False, "The group member must rejoin with the member id it was given."),
    (80, "PREFERRED_LEADER_NOT_AVAILABLE", True, "The preferred leader was not available."),
    (81, "GROUP_MAX_SIZE_REACHED", False, "The group has reached its maximum size."),
    (82, "FENCED_INSTANCE_ID", False, "Another member with this group.instance.id has fenced this one."),
    (83, "ELIGIBLE_LEADERS_NOT_AVAILABLE", True, "No eligible leader for the partition."),
    (84, "ELECTION_NOT_NEEDED", True, "No leader election is needed."),
    (85, "NO_REASSIGNMENT_IN_PROGRESS", False, "No partition reassignment is in progress."),
    (86, "GROUP_SUBSCRIBED_TO_TOPIC", False, "The group is still subscribed to the topic."),
    (87, "INVALID_RECORD", False, "A record failed the broker's validation."),
    (88, "UNSTABLE_OFFSET_COMMIT", True, "Pending transactional offset commits exist for this partition."),
    (89, "THROTTLING_QUOTA_EXCEEDED", True, "The throttling quota was exceeded."),
    (90, "PRODUCER_FENCED", False, "A newer producer with the same transactional id has fenced this one."),
    (91, "RESOURCE_NOT_FOUND", False, "The request names a resource that does not exist."),
    (92, "DUPLICATE_RESOURCE", False, "The request names a resource more than once."),
    (93, "UNACCEPTABLE_CREDENTIAL", False, "The requested credential is not acceptable."),
    (94, "INCONSISTENT_VOTER_SET", False, "The voter sets of leader and follower differ."),
    (95, "INVALID_UPDATE_VERSION", False, "The update version is invalid."),
    (96, "FEATURE_UPDATE_FAILED", False, "A feature update could not be applied."),
    (97, "PRINCIPAL_DESERIALIZATION_FAILURE", False, "The principal in the envelope could not be read."),
    (98, "SNAPSHOT_NOT_FOUND", False, "The requested snapshot was not found."),
    (99, "POSITION_OUT_OF_RANGE", False, "The requested position is not in the snapshot."),
    (100, "UNKNOWN_TOPIC_ID", True, "This server does not host a topic with this id."),
    (101, "DUPLICATE_BROKER_REGISTRATION", False, "This broker id is already registered."),
    (102, "BROKER_ID_NOT_REGISTERED", False, "The broker id is not registered."),
    (103, "INCONSISTENT_TOPIC_ID", True, "The topic id in the log does not match the request's."),
    (104, "INCONSISTENT_CLUSTER_ID", False, "The cluster id in the request does not match this cluster."),
    (105, "TRANSACTIONAL_ID_NOT_FOUND", False, "The transactional id was not found."),
    (106, "FETCH_SESSION_TOPIC_ID_ERROR", True, "The fetch session met topic id trouble."),
    (107, "INELIGIBLE_REPLICA", False, "The new ISR holds an ineligible replica."),
    (108, "NEW_LEADER_ELECTED", False, "A new leader was elected for the partition."),
    (109, "OFFSET_MOVED_TO_TIERED_STORAGE", False, "The offset was moved to tiered storage."),
    (110, "FENCED_MEMBER_EPOCH", False, "The member epoch is fenced by the group coordinator."),
    (111, "UNRELEASED_INSTANCE_ID", False, "The instance id is still used by another member."),
    (112, "UNSUPPORTED_ASSIGNOR", False, "The assignor or its version is not supported by the group."),
    (113, "STALE_MEMBER_EPOCH", False, "The member epoch is stale."),
    (114, "MISMATCHED_ENDPOINT_TYPE", False, "The request went to an endpoint of the wrong type."),
    (115, "UNSUPPORTED_ENDPOINT_TYPE", False, "This endpoint type does not support the request."),
    (116, "UNKNOWN_CONTROLLER_ID", False, "This controller id is not known."),
    (117, "UNKNOWN_SUBSCRIPTION_ID", False, "The client subscription id is not known."),
    (118, "TELEMETRY_TOO_LARGE", False, "The telemetry payload is too large."),
    (119, "INVALID_REGISTRATION", False, "The broker registration is not valid."),
    (120, "TRANSACTION_ABORTABLE", False, "The server hit an error the transaction can recover from by aborting."),
    # Strata's own codes start at 1000, clear of Kafka's (see README "Error codes of Strata's own")
    (
        1000,
        "INVALID_PARTITION_METADATA",
        True,
        "The producer's undeleted_partition_count differs from the broker's: refresh metadata and retry (KIP-253).",
    ),
]

ERRORS: dict[int, ErrorCode] = {c: ErrorCode(c, n, r, m) for c, n, r, m in _TABLE}
BY_NAME: dict[str, ErrorCode] = {e.name: e for e in ERRORS.values()}


def error_name(code: int) -> str:
    e = ERRORS.get(code)
    return e.name if e else f"UNKNOWN_ERROR_{code}"


def error_message(code: int) -> str:
    e = ERRORS.get(code)
    return e.message if e else f"Unknown error code {code}."


class Errors:
    """Error codes as attributes: ``Errors.NOT_LEADER_OR_FOLLOWER == 6``."""


for _e in ERRORS.values():
    setattr(Errors, _e.name, _e.code)
