"""Answers for requests an authorizer refused, built from the request: Kafka's
CLUSTER_AUTHORIZATION_FAILED (or the code given) on every item, or on the top-level error field
when the response has one at that version. Shared by the broker and the controller."""

from __future__ import annotations

from typing import Any

import structlog

from node.logging import RateLimitedLog
from protocol.generated import RESPONSES

log = structlog.get_logger(__name__)
limited = RateLimitedLog(log)
ALWAYS = frozenset({17, 18, 36})  # SaslHandshake, ApiVersions, SaslAuthenticate: before any principal is known


class Denied(Exception):
    """The whole request is refused: `response` answers it (None: close the connection)."""

    def __init__(self, response: Any) -> None:
        self.response = response


def top_level_error(api_key: int, version: int, code: int) -> Any:
    """A response with only its top-level error_code set, if the field is on the wire at this
    version (a field the version lacks would be dropped and the denial read as success)."""
    cls = RESPONSES[api_key]
    if "error_code" not in cls._fields:
        return None
    resp = cls()
    resp.error_code = code
    if hasattr(resp, "error_message"):
        resp.error_message = "Authorization failed."
    back = cls.decode(resp.encode(version), version)
    return resp if back.error_code == code else None


def deny_items(api_key: int, version: int, body: Any, code: int) -> Any:
    """Every item of an inter-node or admin request answered with `code`."""
    R = RESPONSES[api_key]
    if api_key == 27:
        return R(markers=[R.WritableTxnMarkerResult(producer_id=m.producer_id, topics=[
            R.WritableTxnMarkerTopicResult(name=t.name, partitions=[
                R.WritableTxnMarkerPartitionResult(partition_index=p, error_code=code)
                for p in t.partition_indexes]) for t in m.topics]) for m in body.markers])
    if api_key == 1076:
        return R(results=[R.CreateChunksTopicPartitionResult(topic_name=x.topic_name, partition_id=x.partition_id,
                                                             error_code=code) for x in body.topic_partitions])
    if api_key == 1077:
        item = next(c for c in vars(R).values() if isinstance(c, type) and "error_code" in getattr(c, "_fields", ()))
        return R(results=[item(**{k: getattr(x, k) for k in ("topic_name", "partition_id", "start_offset")
                                  if k in item._fields}, error_code=code) for x in body.chunks])
    if api_key == 1093:
        return R(topics=[R.DisklessCreatablePartitionsResult(topic_id=t.topic_id, error_code=code) for t in body.topics])
    if api_key == 1094:
        return R(responses=[R.DisklessDeletableTopicResult(topic_id=t.topic_id, error_code=code) for t in body.topics])
    if api_key == 1095:
        return R(batches=[R.DisklessCommitBatchResult(error_code=code) for _ in body.batches])
    if api_key in (1096, 1097, 1098):
        topic_cls, part_cls = _nested_pair(R)
        return R(topics=[topic_cls(topic_id=t.topic_id, partitions=[
            part_cls(partition_index=p.partition_index, error_code=code) for p in t.partitions]) for t in body.topics])
    if api_key == 1100:
        return R(files=[R.DisklessDescribeFileResult(object_key=f.object_key, error_code=code) for f in body.files])
    if api_key == 23:
        return R(topics=[R.OffsetForLeaderTopicResult(topic=t.topic, partitions=[
            R.EpochEndOffset(partition=p.partition, error_code=code) for p in t.partitions]) for t in body.topics])
    if api_key == 30:
        return R(results=[R.AclCreationResult(error_code=code, error_message="Authorization failed.")
                          for _ in body.creations])
    if api_key == 31:
        return R(filter_results=[R.DeleteAclsFilterResult(error_code=code, error_message="Authorization failed.")
                                 for _ in body.filters])
    if api_key == 51:
        users = dict.fromkeys(x.name for x in [*body.deletions, *body.upsertions])
        return R(results=[R.AlterUserScramCredentialsResult(user=u, error_code=code, error_message="Authorization failed.")
                          for u in users])
    if api_key == 20:
        names = [t.name for t in body.topics] if body.topics else list(body.topic_names)
        return R(responses=[R.DeletableTopicResult(name=n, error_code=code) for n in names])
    return top_level_error(api_key, version, code)


def _nested_pair(R: type) -> tuple[type, type]:
    """(topic result class, partition result class) of a Diskless* response."""
    structs = [c for c in vars(R).values() if isinstance(c, type) and hasattr(c, "_fields")]
    topic = next(c for c in structs if "partitions" in c._fields)
    part = next(c for c in structs if "partition_index" in c._fields and "error_code" in c._fields)
    return topic, part


def log_denied(principal: str, peer: str, api_key: int, **items: object) -> None:
    limited.warning("authorization_failed", principal=principal, peer=peer, api=RESPONSES[api_key].NAME[:-8], **items)
