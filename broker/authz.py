"""Authorization of every request on a broker with `authorizer.class.name` set (Kafka's
StandardAuthorizer rules in metadata.acls, checked the way KafkaApis does per API).

Per item where Kafka does it per item: Produce (WRITE on each topic), consumer Fetch (READ),
ListOffsets, OffsetForLeaderEpoch, DescribeTopicPartitions and Metadata (DESCRIBE; listing all
topics leaves out what the principal may not describe), CreateTopics (CREATE on the cluster or
the topic), CreatePartitions (ALTER), DeleteTopics and DeleteRecords (DELETE), configs
(DESCRIBE_CONFIGS / ALTER_CONFIGS on each topic), OffsetCommit and TxnOffsetCommit (READ on the
group and each topic), DescribeProducers (READ), DescribeTransactions (DESCRIBE on each
transactional id), batched FindCoordinator and OffsetFetch, DescribeGroups, DeleteGroups.
The refused items are taken out of the request before its handler runs and come back with
TOPIC_ / GROUP_AUTHORIZATION_FAILED. Whole requests: group requests (READ on the group),
transactional ones (WRITE on the transactional id), and the inter-node APIs (follower Fetch and
OffsetForLeaderEpoch, WriteTxnMarkers, the chunk and diskless APIs), which need CLUSTER_ACTION on
the cluster: CLUSTER_AUTHORIZATION_FAILED on every item. The remaining admin APIs need DESCRIBE
(reads) or ALTER (changes) on the cluster. Every denial answers in the API's own shape (an old
version without a top-level error field answers per item), never by closing the connection.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from metadata.acls import (
    ALTER,
    ALTER_CONFIGS,
    CLUSTER,
    CLUSTER_ACTION,
    CLUSTER_NAME,
    CREATE,
    DELETE,
    DESCRIBE,
    DESCRIBE_CONFIGS,
    GROUP,
    IDEMPOTENT_WRITE,
    READ,
    TOPIC,
    TRANSACTIONAL_ID,
    WRITE,
    Authorizer,
)
from node.authz import (
    ALWAYS,
    DENIED_MESSAGE,
    ITEM_ERRORS,
    Denied,
    ItemErrors,
    deny_items,
    log_denied,
    top_level_error,
    topic_partitions,
)
from protocol.errors import Errors
from protocol.generated import RESPONSES
from protocol.generated.add_partitions_to_txn import AddPartitionsToTxnResponse
from protocol.generated.alter_configs import AlterConfigsResponse
from protocol.generated.consumer_group_describe import ConsumerGroupDescribeResponse
from protocol.generated.create_partitions import CreatePartitionsResponse
from protocol.generated.create_topics import CreateTopicsResponse
from protocol.generated.delete_groups import DeleteGroupsResponse
from protocol.generated.delete_topics import DeleteTopicsResponse
from protocol.generated.describe_configs import DescribeConfigsResponse
from protocol.generated.describe_groups import DescribeGroupsResponse
from protocol.generated.describe_share_group_offsets import DescribeShareGroupOffsetsResponse
from protocol.generated.describe_topic_partitions import DescribeTopicPartitionsResponse
from protocol.generated.describe_transactions import DescribeTransactionsResponse
from protocol.generated.find_coordinator import FindCoordinatorResponse
from protocol.generated.incremental_alter_configs import IncrementalAlterConfigsResponse
from protocol.generated.metadata import MetadataResponse
from protocol.generated.offset_fetch import OffsetFetchResponse
from protocol.generated.share_group_describe import ShareGroupDescribeResponse

TOPIC_DENIED, GROUP_DENIED, CLUSTER_DENIED = (Errors.TOPIC_AUTHORIZATION_FAILED, Errors.GROUP_AUTHORIZATION_FAILED,
                                              Errors.CLUSTER_AUTHORIZATION_FAILED)
TXN_DENIED = Errors.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
INTER_NODE = frozenset({27, 1076, 1077, 1093, 1094, 1095, 1096, 1097, 1098, 1100, 1110, 1112, 1932})
# KIP-932's share-group state APIs, between share-partition leaders and share coordinators
SHARE_STATE = {83: "InitializeStateResult", 84: "ReadStateResult", 85: "WriteStateResult", 86: "DeleteStateResult",
               87: "ReadStateSummaryResult"}
# JoinGroup, Heartbeat, LeaveGroup, SyncGroup, ConsumerGroupHeartbeat, ShareGroupHeartbeat
GROUP_KEYED = frozenset({11, 12, 13, 14, 68, 76})
SHARE_READS = frozenset({78, 79})  # ShareFetch, ShareAcknowledge: READ on the group and on each topic
TXN_KEYED = frozenset({25, 26})  # AddOffsetsToTxn, EndTxn
READS = frozenset({15, 16, 29, 32, 35, 46, 48, 50, 55, 60, 66, 75, 1253})


@dataclass
class Check:
    """One request's authorization: answers `allowed(op, type, name)` for its principal."""

    authorizer: Authorizer
    acls: Any
    principal: str
    host: str

    def allowed(self, op: int, rtype: int, name: str) -> bool:
        return self.authorizer.authorize(self.acls, self.principal, self.host, op, rtype, name)

    def cluster(self, *ops: int) -> bool:
        return any(self.allowed(op, CLUSTER, CLUSTER_NAME) for op in ops)


# ---------------------------------------------------------------- per API
Finish = Callable[[Any], Any]  # adds the refused items' errors to the handler's response


def authorize(check: Check, api_key: int, version: int, body: Any, topic_name: Callable[[Any], str | None],
              is_follower: bool) -> Finish | None:
    """Raises Denied for a refused request; may take refused items out of `body` and return a
    function that adds their errors to the response."""
    if api_key in ALWAYS:
        return None
    if api_key in SHARE_STATE:
        if check.cluster(CLUSTER_ACTION):
            return None
        raise Denied(_share_state_denied(api_key, body))
    if api_key in INTER_NODE or (api_key in (1, 23) and is_follower):
        if api_key in (1076, 1077) and check.cluster(ALTER, CLUSTER_ACTION):  # kafka-chunks.sh: an admin's ALTER
            return None
        if check.cluster(CLUSTER_ACTION):
            return None
        raise Denied(deny_items(api_key, version, body, CLUSTER_DENIED))
    if api_key == 0:
        return _produce(check, version, body)
    if api_key == 1:
        return _per_topic(1, check, body, READ, topic_name)
    if api_key in (2, 23):
        return _per_topic(api_key, check, body, DESCRIBE, topic_name)
    if api_key == 3:
        return _metadata(check, version, body)
    if api_key == 19:
        return _create_topics(check, body)
    if api_key == 8 or api_key in GROUP_KEYED:
        if not check.allowed(READ, GROUP, body.group_id):
            raise Denied(ITEM_ERRORS[8].answer(8, body, GROUP_DENIED) if api_key == 8 else
                         top_level_error(api_key, version, GROUP_DENIED))
        if api_key == 8:
            return _per_topic(8, check, body, READ, topic_name)
        return None
    if api_key == 9:
        if version >= 8:
            return _filter(body, "groups", lambda g: check.allowed(DESCRIBE, GROUP, g.group_id), "groups",
                           lambda g: OffsetFetchResponse.OffsetFetchResponseGroup(group_id=g.group_id,
                                                                                  error_code=GROUP_DENIED))
        if not check.allowed(DESCRIBE, GROUP, body.group_id):  # v0-1: no top-level error, per partition
            raise Denied(top_level_error(9, version, GROUP_DENIED) or _OFFSET_FETCH.answer(9, body, GROUP_DENIED))
        return None
    if api_key == 10:
        rtype = TRANSACTIONAL_ID if body.key_type == 1 else GROUP
        code = TXN_DENIED if rtype == TRANSACTIONAL_ID else GROUP_DENIED
        if version >= 4:  # batched keys: each refused key answers its own error
            return _filter(body, "coordinator_keys", lambda k: check.allowed(DESCRIBE, rtype, k), "coordinators",
                           lambda k: FindCoordinatorResponse.Coordinator(key=k, node_id=-1, host="", port=-1,
                                                                         error_code=code,
                                                                         error_message="Authorization failed."))
        if not check.allowed(DESCRIBE, rtype, body.key):
            raise Denied(top_level_error(10, version, code))
        return None
    if api_key == 22:
        tid = body.transactional_id
        ok = check.allowed(WRITE, TRANSACTIONAL_ID, tid) if tid else (
            check.cluster(IDEMPOTENT_WRITE) or check.authorizer.any_allowed(
                check.acls, check.principal, check.host, WRITE, TOPIC))
        if not ok:
            raise Denied(top_level_error(22, version, TXN_DENIED if tid else CLUSTER_DENIED))
        return None
    if api_key == 24:
        _add_partitions_to_txn(check, version, body)
        return None
    if api_key in TXN_KEYED:
        if not check.allowed(WRITE, TRANSACTIONAL_ID, body.transactional_id):
            raise Denied(top_level_error(api_key, version, TXN_DENIED))
        return None
    if api_key == 28:  # TxnOffsetCommit: as Kafka, the id, then the group, then READ per topic
        for ok, code in ((check.allowed(WRITE, TRANSACTIONAL_ID, body.transactional_id), TXN_DENIED),
                         (check.allowed(READ, GROUP, body.group_id), GROUP_DENIED)):
            if not ok:
                raise Denied(ITEM_ERRORS[28].answer(28, body, code))
        return _per_topic(28, check, body, READ, topic_name)
    if api_key == 20:
        return _delete_topics(check, body, topic_name)
    if api_key == 21:
        return _per_topic(21, check, body, DELETE, topic_name)
    if api_key == 37:
        return _filter(body, "topics", lambda t: check.allowed(ALTER, TOPIC, t.name), "results",
                       lambda t: CreatePartitionsResponse.CreatePartitionsTopicResult(
                           name=t.name, error_code=TOPIC_DENIED, error_message=DENIED_MESSAGE))
    if api_key == 61:
        return _per_topic(61, check, body, READ, topic_name)
    if api_key in SHARE_READS:  # as Kafka: the group first, then the topics (one error for the request)
        if not check.allowed(READ, GROUP, body.group_id):
            raise Denied(top_level_error(api_key, version, GROUP_DENIED))
        if not all(check.allowed(READ, TOPIC, topic_name(t) or "") for t in body.topics):
            raise Denied(top_level_error(api_key, version, TOPIC_DENIED))
        return None
    if api_key in (91, 92):  # AlterShareGroupOffsets (READ), DeleteShareGroupOffsets (DELETE) on the group
        if not check.allowed(READ if api_key == 91 else DELETE, GROUP, body.group_id):
            raise Denied(top_level_error(api_key, version, GROUP_DENIED))
        return None
    if api_key in PER_RESOURCE:
        return PER_RESOURCE[api_key](check, body)
    op = DESCRIBE if api_key in READS else ALTER
    if not check.cluster(op):
        raise Denied(deny_items(api_key, version, body, CLUSTER_DENIED))
    return None


def _add_partitions_to_txn(check: Check, version: int, body: Any) -> None:
    """WRITE on the transactional id and on each topic (Kafka's rule); v0-3 carry one
    transaction at the top level and answer per partition, v4+ (brokers' verify-only) per
    transaction."""
    R = AddPartitionsToTxnResponse
    if version >= 4:
        if all(check.allowed(WRITE, TRANSACTIONAL_ID, t.transactional_id) and
               all(check.allowed(WRITE, TOPIC, x.name) for x in t.topics) for t in body.transactions):
            return None
        raise Denied(top_level_error(24, version, TXN_DENIED))
    txn_ok = check.allowed(WRITE, TRANSACTIONAL_ID, body.v3_and_below_transactional_id)
    codes = {t.name: TXN_DENIED if not txn_ok else 0 if check.allowed(WRITE, TOPIC, t.name) else TOPIC_DENIED
             for t in body.v3_and_below_topics}
    if not any(codes.values()):
        return None
    # as Kafka: the partitions that would have been allowed answer OPERATION_NOT_ATTEMPTED
    raise Denied(R(results_by_topic_v3_and_below=[R.AddPartitionsToTxnTopicResult(name=t.name, results_by_partition=[
        R.AddPartitionsToTxnPartitionResult(partition_index=p, partition_error_code=codes[t.name] or
                                            Errors.OPERATION_NOT_ATTEMPTED) for p in t.partitions])
        for t in body.v3_and_below_topics]))


def _delete_topics(check: Check, body: Any, topic_name: Callable[[Any], str | None]) -> Finish | None:
    """DELETE on each topic, named (v0-5) or by name or id (v6+); a refused one answers
    TOPIC_AUTHORIZATION_FAILED, the others are deleted (Kafka's rule)."""
    R = DeleteTopicsResponse
    if body.topics:
        return _filter(body, "topics", lambda t: check.allowed(DELETE, TOPIC, topic_name(t) or ""), "responses",
                       lambda t: R.DeletableTopicResult(name=topic_name(t), topic_id=t.topic_id,
                                                        error_code=TOPIC_DENIED, error_message=DENIED_MESSAGE))
    return _filter(body, "topic_names", lambda n: check.allowed(DELETE, TOPIC, n), "responses",
                   lambda n: R.DeletableTopicResult(name=n, error_code=TOPIC_DENIED))


def _produce(check: Check, version: int, body: Any) -> Finish | None:
    if body.transactional_id and not check.allowed(WRITE, TRANSACTIONAL_ID, body.transactional_id):
        raise Denied(ITEM_ERRORS[0].answer(0, body, TXN_DENIED))
    return _per_topic(0, check, body, WRITE, lambda t: t.name)


def _per_topic(api_key: int, check: Check, body: Any, op: int, topic_name: Callable[[Any], str | None]) -> Finish | None:
    """Take the topics refused `op` out of the request; they answer TOPIC_AUTHORIZATION_FAILED
    on every partition."""
    items = ITEM_ERRORS[api_key]
    field = items.request
    topics = getattr(body, field) or []
    refused = [t for t in topics if not check.allowed(op, TOPIC, topic_name(t) or "")]
    if not refused:
        return None
    log_denied(check.principal, check.host, api_key, topics=",".join(topic_name(t) or "?" for t in refused))
    setattr(body, field, [t for t in topics if t not in refused])

    def finish(resp: Any) -> Any:
        getattr(resp, items.response).extend(items.mirror.answer(refused, TOPIC_DENIED, DENIED_MESSAGE))
        return resp
    return finish


def _metadata(check: Check, version: int, body: Any) -> Finish | None:
    named = body.topics is not None and not (version == 0 and not body.topics)
    refused: list[str] = []
    if named:
        keep = []
        for t in body.topics:
            if t.name is None or check.allowed(DESCRIBE, TOPIC, t.name):
                keep.append(t)
            else:
                refused.append(t.name)
        body.topics = keep
        if refused:
            log_denied(check.principal, check.host, 3, topics=",".join(refused))
        if body.allow_auto_topic_creation and not check.cluster(CREATE) and not all(
                check.allowed(CREATE, TOPIC, t.name) for t in keep if t.name is not None):
            body.allow_auto_topic_creation = False  # Kafka: CREATE on the cluster or the topic

    def finish(resp: Any) -> Any:
        if not named:
            resp.topics = [t for t in resp.topics if check.allowed(DESCRIBE, TOPIC, t.name)]
        resp.topics += [MetadataResponse.MetadataResponseTopic(error_code=TOPIC_DENIED, name=n) for n in refused]
        return resp
    return finish


def _create_topics(check: Check, body: Any) -> Finish | None:
    if check.cluster(CREATE):
        return None
    refused = [t for t in body.topics if not check.allowed(CREATE, TOPIC, t.name)]
    if not refused:
        return None
    body.topics = [t for t in body.topics if t not in refused]
    log_denied(check.principal, check.host, 19, topics=",".join(t.name for t in refused))

    def finish(resp: Any) -> Any:
        resp.topics += [CreateTopicsResponse.CreatableTopicResult(name=t.name, error_code=TOPIC_DENIED,
                                                                  error_message="Authorization failed.")
                        for t in refused]
        return resp
    return finish


# ---------------------------------------------------------------- admin APIs checked per resource
def _filter(body: Any, field: str, ok: Callable[[Any], bool], resp_field: str,
            error: Callable[[Any], Any]) -> Finish | None:
    """Take the items `ok` refuses out of `body.<field>`; the response gets `error(item)` for each."""
    items = getattr(body, field) or []
    refused = [x for x in items if not ok(x)]
    if not refused:
        return None
    setattr(body, field, [x for x in items if not any(x is r for r in refused)])

    def finish(resp: Any) -> Any:
        getattr(resp, resp_field).extend(error(x) for x in refused)
        return resp
    return finish


def _config_resource_ok(check: Check, op: int) -> Callable[[Any], bool]:
    """Topic configs need the operation on the topic; broker (and other) configs on the cluster."""
    return lambda r: check.allowed(op, TOPIC, r.resource_name) if r.resource_type == 2 else check.cluster(op)


def _configs(op: int, results: str, cls: Callable[..., Any]) -> Callable[[Check, Any], Finish | None]:
    """DescribeConfigs / AlterConfigs / IncrementalAlterConfigs: each refused resource answers its
    own error (a topic's TOPIC_, a broker's CLUSTER_AUTHORIZATION_FAILED), a `cls` in `results`."""

    def run(check: Check, body: Any) -> Finish | None:
        return _filter(body, "resources", _config_resource_ok(check, op), results, lambda r: cls(
            error_code=TOPIC_DENIED if r.resource_type == 2 else CLUSTER_DENIED, error_message="Authorization failed.",
            resource_type=r.resource_type, resource_name=r.resource_name))
    return run


def _describe_groups(check: Check, body: Any) -> Finish | None:
    return _filter(body, "groups", lambda g: check.allowed(DESCRIBE, GROUP, g), "groups",
                   lambda g: DescribeGroupsResponse.DescribedGroup(error_code=GROUP_DENIED, group_id=g))


def _consumer_group_describe(check: Check, body: Any) -> Finish | None:
    return _filter(body, "group_ids", lambda g: check.allowed(DESCRIBE, GROUP, g), "groups",
                   lambda g: ConsumerGroupDescribeResponse.DescribedGroup(
                       error_code=GROUP_DENIED, error_message="Authorization failed.", group_id=g))


def _share_group_describe(check: Check, body: Any) -> Finish | None:
    return _filter(body, "group_ids", lambda g: check.allowed(DESCRIBE, GROUP, g), "groups",
                   lambda g: ShareGroupDescribeResponse.DescribedGroup(
                       error_code=GROUP_DENIED, error_message=DENIED_MESSAGE, group_id=g))


def _describe_share_group_offsets(check: Check, body: Any) -> Finish | None:
    return _filter(body, "groups", lambda g: check.allowed(DESCRIBE, GROUP, g.group_id), "groups",
                   lambda g: DescribeShareGroupOffsetsResponse.DescribeShareGroupOffsetsResponseGroup(
                       group_id=g.group_id, error_code=GROUP_DENIED, error_message=DENIED_MESSAGE))


def _share_state_denied(api_key: int, body: Any) -> Any:
    """A share-state request refused whole: every partition it names answers the error."""
    R: Any = RESPONSES[api_key]
    result = getattr(R, SHARE_STATE[api_key])
    return R(results=[result(topic_id=t.topic_id, partitions=[
        R.PartitionResult(partition=p.partition, error_code=CLUSTER_DENIED, error_message=DENIED_MESSAGE)
        for p in t.partitions]) for t in body.topics])


def _delete_groups(check: Check, body: Any) -> Finish | None:
    return _filter(body, "groups_names", lambda g: check.allowed(DELETE, GROUP, g), "results",
                   lambda g: DeleteGroupsResponse.DeletableGroupResult(group_id=g, error_code=GROUP_DENIED))


def _describe_transactions(check: Check, body: Any) -> Finish | None:
    return _filter(body, "transactional_ids", lambda t: check.allowed(DESCRIBE, TRANSACTIONAL_ID, t),
                   "transaction_states", lambda t: DescribeTransactionsResponse.TransactionState(
                       error_code=TXN_DENIED, transactional_id=t))


def _list_groups(check: Check, body: Any) -> Finish | None:
    if check.cluster(DESCRIBE):
        return None

    def finish(resp: Any) -> Any:  # Kafka: only the groups the principal may describe
        resp.groups = [g for g in resp.groups if check.allowed(DESCRIBE, GROUP, g.group_id)]
        return resp
    return finish


def _describe_topic_partitions(check: Check, body: Any) -> Finish | None:
    if not body.topics:  # every topic: leave out those the principal may not describe
        def finish(resp: Any) -> Any:
            resp.topics = [t for t in resp.topics if check.allowed(DESCRIBE, TOPIC, t.name)]
            return resp
        return finish
    return _filter(body, "topics", lambda t: check.allowed(DESCRIBE, TOPIC, t.name), "topics",
                   lambda t: DescribeTopicPartitionsResponse.DescribeTopicPartitionsResponseTopic(
                       error_code=TOPIC_DENIED, name=t.name))


PER_RESOURCE: dict[int, Callable[[Check, Any], Finish | None]] = {
    15: _describe_groups, 16: _list_groups,
    32: _configs(DESCRIBE_CONFIGS, "results", DescribeConfigsResponse.DescribeConfigsResult),
    33: _configs(ALTER_CONFIGS, "responses", AlterConfigsResponse.AlterConfigsResourceResponse), 42: _delete_groups,
    44: _configs(ALTER_CONFIGS, "responses", IncrementalAlterConfigsResponse.AlterConfigsResourceResponse),
    75: _describe_topic_partitions, 69: _consumer_group_describe, 65: _describe_transactions,
    77: _share_group_describe, 90: _describe_share_group_offsets,
}
# OffsetFetch v0-1 answers a refused group on every partition asked for (no top-level error)
_OFFSET_FETCH = ItemErrors("topics", "topics", topic_partitions(
    OffsetFetchResponse.OffsetFetchResponseTopic, OffsetFetchResponse.OffsetFetchResponsePartition, {"name": "name"},
    ("partition_indexes", "partitions"), ("partition_index", None), fixed={"committed_offset": -1}))
