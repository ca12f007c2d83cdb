"""Metadata: brokers, topics and partitions from this broker's image, with the chunk fields and
KIP-253's MarkedForDeletion as tagged fields on the partition entry and UndeletedPartitionCount on
the topic entry; unknown topics may be auto-created (forwarded)."""

from __future__ import annotations

import re

import structlog

from broker.apis.registry import RequestContext, api
from broker.metadata_answers import PartitionEntryCache
from metadata import MetadataImage, TopicInfo
from protocol.errors import Errors
from protocol.generated.create_topics import CreateTopicsRequest
from protocol.generated.metadata import MetadataResponse

log = structlog.get_logger(__name__)
INTERNAL_TOPICS = {"__consumer_offsets", "__transaction_state", "__diskless_metadata"}
LEGAL_TOPIC = re.compile(r"[a-zA-Z0-9._-]{1,249}")
R = MetadataResponse


def is_valid_topic_name(name: str) -> bool:
    return bool(LEGAL_TOPIC.fullmatch(name)) and name not in (".", "..")


@api(3, 0, 13)
async def metadata(ctx: RequestContext, req) -> MetadataResponse:
    s = ctx.services
    image = s.metadata.image
    v = ctx.api_version
    listener = ctx.listener
    brokers = []
    for info in sorted(image.brokers.values(), key=lambda x: x.id):
        ep = info.endpoint(listener)
        if info.fenced or ep is None:
            continue
        brokers.append(R.MetadataResponseBroker(node_id=info.id, host=ep.host, port=ep.port, rack=info.rack))

    topics = []
    to_create = []
    if req.topics is None or (v == 0 and not req.topics):
        for tid in sorted(image.topics, key=lambda t: image.topics[t].name):
            topics.append(_topic_entry(image, image.topics[tid], s.metadata_answers))
    else:
        auto = s.config.auto_create_topics and (v < 4 or req.allow_auto_topic_creation)
        for t in req.topics:
            if t.name is None:
                info = image.topics.get(t.topic_id)
                if info is None:
                    topics.append(R.MetadataResponseTopic(error_code=Errors.UNKNOWN_TOPIC_ID, topic_id=t.topic_id, name=None))
                else:
                    topics.append(_topic_entry(image, info, s.metadata_answers))
                continue
            info = image.topic(t.name)
            if info is not None:
                topics.append(_topic_entry(image, info, s.metadata_answers))
            elif not is_valid_topic_name(t.name):
                topics.append(R.MetadataResponseTopic(error_code=Errors.INVALID_TOPIC_EXCEPTION, name=t.name))
            elif auto and t.name not in INTERNAL_TOPICS:
                to_create.append(t.name)
                topics.append(R.MetadataResponseTopic(error_code=Errors.LEADER_NOT_AVAILABLE, name=t.name))
            else:
                topics.append(R.MetadataResponseTopic(error_code=Errors.UNKNOWN_TOPIC_OR_PARTITION, name=t.name))
    if to_create:
        s.spawn(_auto_create(s, to_create))
    s.diskless.assign_leaders(topics, ctx.client_id)
    return R(brokers=brokers, cluster_id=s.cluster_id, controller_id=s.config.node_id, topics=topics)


def _topic_entry(image: MetadataImage, info: TopicInfo, answers: PartitionEntryCache):
    """The partition entries come from `answers`, shared between answers, so thousands of
    partitions are not built again for each all-topics Metadata."""
    return R.MetadataResponseTopic(
        error_code=0,
        name=info.name,
        topic_id=info.id,
        is_internal=info.name in INTERNAL_TOPICS,
        partitions=answers.entries(image, info),
        undeleted_partition_count=info.undeleted_partition_count,
    )


async def _auto_create(s, names: list[str]) -> None:
    req = CreateTopicsRequest(
        # Kafka auto-creates with the broker's own num.partitions and default.replication.factor.
        topics=[
            CreateTopicsRequest.CreatableTopic(
                name=n, num_partitions=s.config.num_partitions, replication_factor=s.config.default_replication_factor
            )
            for n in names
        ],
        timeout_ms=30000,
    )
    try:
        resp = await s.forward(req)
        for t in resp.topics:
            if t.error_code not in (0, Errors.TOPIC_ALREADY_EXISTS):
                log.warning("auto_create_failed", topic=t.name, error_code=t.error_code, error=t.error_message)
            elif t.error_code == 0:
                log.info("topic_auto_created", topic=t.name)
    except Exception as e:
        log.warning("auto_create_failed", topics=names, error=str(e))
