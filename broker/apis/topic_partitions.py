"""DescribeTopicPartitions (KIP-966): the partitions of the asked topics (all topics when none
is named) in name order, at most ResponsePartitionLimit (capped by the broker's
max.request.partition.size.limit) per answer, resuming from the request's cursor. A partition
entry is Metadata's, chunk tagged fields included."""

from __future__ import annotations

from typing import TypeVar

import structlog

from broker.apis.metadata import INTERNAL_TOPICS
from broker.apis.registry import RequestContext, api
from metadata.image import TopicInfo
from protocol.errors import Errors
from protocol.generated.describe_topic_partitions import DescribeTopicPartitionsResponse
from protocol.generated.metadata import MetadataResponse
from protocol.message import Struct

log = structlog.get_logger(__name__)
R = DescribeTopicPartitionsResponse
P = R.DescribeTopicPartitionsResponsePartition
C = R.DescribeTopicPartitionsResponseChunk
DEFAULT_LIMIT = 2000  # Kafka's max.request.partition.size.limit
# Kafka answers with every topic operation when no authorizer is set: READ, WRITE, CREATE,
# DELETE, ALTER, DESCRIBE, DESCRIBE_CONFIGS, ALTER_CONFIGS (AclOperation codes 3-8, 10, 11)
ALL_TOPIC_OPERATIONS = sum(1 << op for op in (3, 4, 5, 6, 7, 8, 10, 11))
S = TypeVar("S", bound=Struct)


def _copy(src: Struct, cls: type[S]) -> S:
    """An entry of `cls` with the fields `src` (a Metadata response struct) shares with it."""
    return cls(**{n: getattr(src, n) for n in cls._fields if n in type(src)._fields and n != "chunks"})


@api(75, 0, 0)
async def describe_topic_partitions(ctx: RequestContext, req) -> DescribeTopicPartitionsResponse:
    image = ctx.services.metadata.image
    cap = int(ctx.services.config.props.get("max.request.partition.size.limit", DEFAULT_LIMIT))
    limit = max(min(req.response_partition_limit, cap), 1)
    cursor = req.cursor
    if req.topics:
        names = sorted({t.name for t in req.topics})
        if cursor is not None and cursor.topic_name not in names:
            return _invalid(req, "The cursor's topic must be one of the requested topics.")
    else:
        names = sorted(t.name for t in image.topics.values())
    if cursor is not None:
        if cursor.partition_index < 0:
            return _invalid(req, "The cursor's partition index must not be negative.")
        names = [n for n in names if n >= cursor.topic_name]
    topics: list = []
    next_cursor = None
    for name in names:
        if limit == 0:
            next_cursor = R.Cursor(topic_name=name, partition_index=0)
            break
        info = image.topic(name)
        if info is None:
            topics.append(R.DescribeTopicPartitionsResponseTopic(
                error_code=Errors.UNKNOWN_TOPIC_OR_PARTITION, name=name, partitions=[]))
            continue
        first = cursor.partition_index if cursor is not None and name == cursor.topic_name else 0
        entries = [e for e in ctx.services.metadata_answers.entries(image, info) if e.partition_index >= first]
        page, rest = entries[:limit], entries[limit:]
        limit -= len(page)
        topics.append(R.DescribeTopicPartitionsResponseTopic(
            error_code=0, name=name, topic_id=info.id, is_internal=name in INTERNAL_TOPICS,
            partitions=[_partition(e, info) for e in page], topic_authorized_operations=ALL_TOPIC_OPERATIONS))
        if rest:
            next_cursor = R.Cursor(topic_name=name, partition_index=rest[0].partition_index)
            break
    return R(topics=topics, next_cursor=next_cursor)


def _partition(
    e: MetadataResponse.MetadataResponsePartition, info: TopicInfo
) -> DescribeTopicPartitionsResponse.DescribeTopicPartitionsResponsePartition:
    p = _copy(e, P)
    # KIP-966's fields, empty lists when the controller keeps none (as Kafka answers)
    state = info.partitions.get(e.partition_index)
    p.eligible_leader_replicas = list(state.elr) if state is not None else []
    p.last_known_elr = list(state.last_known_elr) if state is not None else []
    p.chunks = [_copy(c, C) for c in e.chunks]
    return p


def _invalid(req, message: str) -> DescribeTopicPartitionsResponse:
    """Kafka fails the whole request (INVALID_REQUEST on every topic asked) for a bad cursor."""
    log.info("describe_topic_partitions_invalid", error=message)
    return R(topics=[R.DescribeTopicPartitionsResponseTopic(error_code=Errors.INVALID_REQUEST, name=t.name)
                     for t in req.topics])
