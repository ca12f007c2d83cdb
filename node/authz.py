"""Answers for requests an authorizer refused, built from the request: Kafka's
CLUSTER_AUTHORIZATION_FAILED (or the code given) on every item, or on the top-level error field
when the response has one at that version. Shared by the broker and the controller.

The walker under it (`error_items`: one error and message on every item, shaped by a table of
`ItemErrors`) also answers a controller's NOT_CONTROLLER (controller/not_controller.py), with
ADMIN_ITEM_ERRORS added: shapes a broker's authorizer answers per resource (broker/authz.py) and
a controller's whole. No refusal closes the connection: a client reads a closed connection as a
transport error and retries (librdkafka's _TRANSPORT)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog

from node.logging import RateLimitedLog
from protocol.generated import RESPONSES
from protocol.message import Struct

log = structlog.get_logger(__name__)
limited = RateLimitedLog(log)
ALWAYS = frozenset({17, 18, 36})  # SaslHandshake, ApiVersions, SaslAuthenticate: before any principal is known
DENIED_MESSAGE = "Authorization failed."


class Denied(Exception):
    """The whole request is refused: `response` answers it (None: close the connection)."""

    def __init__(self, response: Any) -> None:
        self.response = response


def top_level_error(api_key: int, version: int, code: int, message: str = DENIED_MESSAGE) -> Any:
    """A response with only its top-level error_code set, if the field is on the wire at this
    version (a field the version lacks would be dropped and the denial read as success)."""
    cls = RESPONSES[api_key]
    if "error_code" not in cls._fields:
        return None
    resp: Any = cls()  # a response with an error_code field (checked above)
    resp.error_code = code
    if hasattr(resp, "error_message"):
        resp.error_message = message
    back = cls.decode(resp.encode(version), version)
    return resp if back.error_code == code else None


@dataclass(frozen=True)
class Mirror:
    """How one level of a response answers one level of its request: one `cls` per request item,
    with `keys` copied (response field -> request field; None: the item itself, a bare partition
    index), the error in field `error` (None: none at this level) and, with `nested` (request
    list, response list, Mirror), the level below answering (or only copying) it."""

    cls: type
    keys: Mapping[str, str | None] = field(default_factory=dict)
    nested: tuple[str, str, Mirror] | None = None
    error: str | None = "error_code"
    message: bool = False  # the item carries an error_message too
    fixed: Mapping[str, Any] = field(default_factory=dict)  # constants, e.g. an unknown offset's -1

    def answer(self, items: Iterable[Any], code: int, message: str) -> list[Any]:
        out = []
        for x in items:
            fields = {r: x if q is None else getattr(x, q) for r, q in self.keys.items()}
            fields.update(self.fixed)
            if self.nested is not None:
                below, into, inner = self.nested
                fields[into] = inner.answer(getattr(x, below), code, message)
            if self.error is not None:
                fields[self.error] = code
                if self.message:
                    fields["error_message"] = message
            out.append(self.cls(**fields))
        return out


@dataclass(frozen=True)
class ItemErrors:
    """A response's per-item errors for a request: `response` field <- `request` field (with
    `top_level`, the response's own error_code set too)."""

    request: str
    response: str
    mirror: Mirror
    top_level: bool = False

    def answer(self, api_key: int, body: Any, code: int, message: str = DENIED_MESSAGE) -> Any:
        """The whole response, every item of the request answered with `code`."""
        fields: dict[str, Any] = {self.response: self.mirror.answer(getattr(body, self.request) or [], code, message)}
        if self.top_level:
            fields["error_code"] = code
        return RESPONSES[api_key](**fields)


def topic_partitions(topic: type, part: type, topic_keys: Mapping[str, str], parts: tuple[str, str] = (
        "partitions", "partitions"), index: tuple[str, str | None] = ("partition_index", "partition_index"),
        message: bool = False, fixed: Mapping[str, Any] | None = None) -> Mirror:
    """Topics answered partition by partition (`index`: response field, request field)."""
    return Mirror(topic, topic_keys, (parts[0], parts[1], Mirror(part, {index[0]: index[1]}, message=message,
                                                                 fixed=fixed or {})), error=None)


def _item_class(R: type, *fields: str) -> type[Struct]:
    """The struct of response `R` having all of `fields` (generated names differ by version)."""
    return next(c for c in vars(R).values() if isinstance(c, type) and set(fields) <= set(getattr(c, "_fields", ())))


def _diskless_partitions(R: type) -> ItemErrors:
    return ItemErrors("topics", "topics", topic_partitions(_item_class(R, "topic_id", "partitions"),
                                                            _item_class(R, "partition_index", "error_code"),
                                                            {"topic_id": "topic_id"}))


def _item_errors() -> dict[int, ItemErrors]:
    R: Mapping[int, Any] = RESPONSES  # each response class with its own item classes
    created_chunk = _item_class(R[1077], "error_code", "partition_id")
    return {
        0: ItemErrors("topic_data", "responses", topic_partitions(
            R[0].TopicProduceResponse, R[0].PartitionProduceResponse, {"name": "name"},
            ("partition_data", "partition_responses"), ("index", "index"))),
        1: ItemErrors("topics", "responses", topic_partitions(
            R[1].FetchableTopicResponse, R[1].PartitionData, {"topic": "topic", "topic_id": "topic_id"},
            index=("partition_index", "partition"))),
        2: ItemErrors("topics", "topics", topic_partitions(
            R[2].ListOffsetsTopicResponse, R[2].ListOffsetsPartitionResponse, {"name": "name"})),
        8: ItemErrors("topics", "topics", topic_partitions(
            R[8].OffsetCommitResponseTopic, R[8].OffsetCommitResponsePartition, {"name": "name"})),
        21: ItemErrors("topics", "topics", topic_partitions(
            R[21].DeleteRecordsTopicResult, R[21].DeleteRecordsPartitionResult, {"name": "name"},
            fixed={"low_watermark": -1})),
        23: ItemErrors("topics", "topics", topic_partitions(
            R[23].OffsetForLeaderTopicResult, R[23].EpochEndOffset, {"topic": "topic"}, index=("partition", "partition"))),
        28: ItemErrors("topics", "topics", topic_partitions(
            R[28].TxnOffsetCommitResponseTopic, R[28].TxnOffsetCommitResponsePartition, {"name": "name"})),
        61: ItemErrors("topics", "topics", topic_partitions(
            R[61].TopicResponse, R[61].PartitionResponse, {"name": "name"}, ("partition_indexes", "partitions"),
            ("partition_index", None), message=True)),
        27: ItemErrors("markers", "markers", Mirror(
            R[27].WritableTxnMarkerResult, {"producer_id": "producer_id"},
            ("topics", "topics", topic_partitions(R[27].WritableTxnMarkerTopicResult,
                                                   R[27].WritableTxnMarkerPartitionResult, {"name": "name"},
                                                   ("partition_indexes", "partitions"), ("partition_index", None))),
            error=None)),
        30: ItemErrors("creations", "results", Mirror(R[30].AclCreationResult, message=True)),
        31: ItemErrors("filters", "filter_results", Mirror(R[31].DeleteAclsFilterResult, message=True)),
        1076: ItemErrors("topic_partitions", "results", Mirror(R[1076].CreateChunksTopicPartitionResult, {
            "topic_name": "topic_name", "partition_id": "partition_id"})),
        1077: ItemErrors("chunks", "results", Mirror(created_chunk, {k: k for k in (
            "topic_name", "partition_id", "start_offset") if k in created_chunk._fields})),
        1093: ItemErrors("topics", "topics", Mirror(R[1093].DisklessCreatablePartitionsResult, {"topic_id": "topic_id"})),
        1094: ItemErrors("topics", "responses", Mirror(R[1094].DisklessDeletableTopicResult, {"topic_id": "topic_id"})),
        1095: ItemErrors("batches", "batches", Mirror(R[1095].DisklessCommitBatchResult)),
        **{k: _diskless_partitions(R[k]) for k in (1096, 1097, 1098)},
        1100: ItemErrors("files", "files", Mirror(R[1100].DisklessDescribeFileResult, {"object_key": "object_key"})),
        1112: ItemErrors("topics", "topics", topic_partitions(
            R[1112].DisklessDescribeProducersTopicResponse, R[1112].DisklessDescribeProducersPartitionResponse,
            {"topic_id": "topic_id"}, ("partition_indexes", "partitions"), ("partition_index", None))),
        1253: ItemErrors("topics", "topics", Mirror(R[1253].PartitionLeaderEpochsTopicResult, {"name": "name"},
                                                    message=True)),
    }


def _admin_item_errors() -> dict[int, ItemErrors]:
    R: Mapping[int, Any] = RESPONSES  # each response class with its own item classes
    configs = {k: ItemErrors("resources", "responses", Mirror(R[k].AlterConfigsResourceResponse, {
        "resource_type": "resource_type", "resource_name": "resource_name"}, message=True)) for k in (33, 44)}
    return {
        19: ItemErrors("topics", "topics", Mirror(R[19].CreatableTopicResult, {"name": "name"}, message=True)),
        **configs,
        37: ItemErrors("topics", "results", Mirror(R[37].CreatePartitionsTopicResult, {"name": "name"}, message=True)),
        43: ItemErrors("topic_partitions", "replica_election_results", Mirror(R[43].ReplicaElectionResult, {
            "topic": "topic"}, ("partitions", "partition_result", Mirror(R[43].PartitionResult, {
                "partition_id": None}, message=True)), error=None), top_level=True),
        49: ItemErrors("entries", "entries", Mirror(R[49].EntryData, nested=("entity", "entity", Mirror(
            R[49].EntityData, {"entity_type": "entity_type", "entity_name": "entity_name"}, error=None)),
            message=True)),
    }


ITEM_ERRORS = _item_errors()
TOPIC_KEYED = frozenset({0, 1, 2, 8})  # the broker refuses these per topic (broker/authz.py), not whole
DENIALS = {k: v for k, v in ITEM_ERRORS.items() if k not in TOPIC_KEYED}  # what a whole denial answers per item
ADMIN_ITEM_ERRORS = _admin_item_errors()
WHOLE_DENIALS = {**DENIALS, **ADMIN_ITEM_ERRORS}  # a controller refuses admin requests whole


def error_items(api_key: int, version: int, body: Any, code: int, message: str,
                shapes: Mapping[int, ItemErrors]) -> Any:
    """Every item of `body` answered with `code` (and `message` where an item carries one), shaped
    by `shapes`; else the top-level error field, or None if the response has none."""
    R: Any = RESPONSES[api_key]  # the response class of this API, with its own item classes
    if api_key in shapes:
        return shapes[api_key].answer(api_key, body, code, message)
    if api_key == 51:
        users = dict.fromkeys(x.name for x in [*body.deletions, *body.upsertions])
        return R(results=[R.AlterUserScramCredentialsResult(user=u, error_code=code, error_message=message)
                          for u in users])
    if api_key == 20:
        return R(responses=[R.DeletableTopicResult(name=n, error_code=code) for n in deleted_topic_names(body)])
    if api_key == 34:  # AlterReplicaLogDirs: partitions grouped by dir, answered grouped by topic
        return R(results=[R.AlterReplicaLogDirTopicResult(topic_name=t.name, partitions=[
            R.AlterReplicaLogDirPartitionResult(partition_index=p, error_code=code) for p in t.partitions])
            for d in body.dirs for t in d.topics])
    top = top_level_error(api_key, version, code, message)
    if top is None and api_key == 35:
        return R()  # DescribeLogDirs before v3 has no error field: Kafka answers no dirs
    return top


def deny_items(api_key: int, version: int, body: Any, code: int) -> Any:
    """Every item of an inter-node or admin request refused with `code`; a version without a
    top-level error field (Fetch before v7) answers per item instead."""
    resp = error_items(api_key, version, body, code, DENIED_MESSAGE, WHOLE_DENIALS)
    if resp is None and api_key in ITEM_ERRORS:
        resp = ITEM_ERRORS[api_key].answer(api_key, body, code)
    return resp


def deleted_topic_names(body: Any) -> list[str]:
    """The topics a DeleteTopics request names (v6+ by name or id, earlier by name)."""
    return [t.name for t in body.topics] if body.topics else list(body.topic_names)


def log_denied(principal: str, peer: str, api_key: int, **items: object) -> None:
    limited.warning("authorization_failed", principal=principal, peer=peer, api=RESPONSES[api_key].NAME[:-8], **items)
