"""CreateTopics, DeleteTopics, CreatePartitions."""

from __future__ import annotations

from controller.apis.registry import Apis
from controller.topics import TopicResult
from protocol.generated.create_partitions import CreatePartitionsRequest, CreatePartitionsResponse
from protocol.generated.create_topics import CreateTopicsRequest, CreateTopicsResponse
from protocol.generated.delete_topics import DeleteTopicsRequest, DeleteTopicsResponse
from protocol.headers import Request


def _request_name(r: TopicResult) -> str:
    """The name of a CreateTopics / CreatePartitions result: those requests name every topic
    (only DeleteTopics by id leaves TopicResult.name None)."""
    assert r.name is not None, "CreateTopics and CreatePartitions results always carry the request's name"
    return r.name


async def create_topics(apis: Apis, req: Request) -> CreateTopicsResponse:
    results = await apis.topics.create_topics(req.body.topics, req.body.validate_only)
    out = []
    for r in results:
        name = _request_name(r)
        if r.error is not None:
            out.append(
                CreateTopicsResponse.CreatableTopicResult(
                    name=name, error_code=r.error.code, error_message=r.error.message
                )
            )
            continue
        out.append(
            CreateTopicsResponse.CreatableTopicResult(
                name=name,
                topic_id=r.topic_id,
                error_code=0,
                error_message=None,
                num_partitions=r.num_partitions,
                replication_factor=r.replication_factor,
                configs=[
                    CreateTopicsResponse.CreatableTopicConfigs(name, value, False, source, False)
                    for name, value, source in r.configs
                ],
            )
        )
    return CreateTopicsResponse(throttle_time_ms=0, topics=out)


async def delete_topics(apis: Apis, req: Request) -> DeleteTopicsResponse:
    body = req.body
    if req.api_version >= 6:
        by_name = [t.name for t in body.topics if t.topic_id.int == 0]
        by_id = [t.topic_id for t in body.topics if t.name is None and t.topic_id.int != 0]
        both = [t for t in body.topics if t.name is not None and t.topic_id.int != 0]
    else:
        by_name, by_id, both = list(body.topic_names), [], []
    results = await apis.topics.delete_topics(by_name, by_id)
    out = [
        DeleteTopicsResponse.DeletableTopicResult(
            name=r.name if r.name is not None or req.api_version >= 6 else "",
            topic_id=r.topic_id,
            error_code=r.error.code if r.error else 0,
            error_message=r.error.message if r.error else None,
        )
        for r in results
    ]
    for t in both:
        out.append(
            DeleteTopicsResponse.DeletableTopicResult(
                name=t.name,
                topic_id=t.topic_id,
                error_code=42,  # INVALID_REQUEST
                error_message="Give a topic name or a topic id, not both.",
            )
        )
    return DeleteTopicsResponse(throttle_time_ms=0, responses=out)


async def create_partitions(apis: Apis, req: Request) -> CreatePartitionsResponse:
    results = await apis.topics.create_partitions(req.body.topics, req.body.validate_only)
    return CreatePartitionsResponse(
        throttle_time_ms=0,
        results=[
            CreatePartitionsResponse.CreatePartitionsTopicResult(
                name=_request_name(r),
                error_code=r.error.code if r.error else 0,
                error_message=r.error.message if r.error else None,
            )
            for r in results
        ],
    )


HANDLERS = {
    19: (CreateTopicsRequest.MIN_VERSION, CreateTopicsRequest.MAX_VERSION, create_topics),
    20: (DeleteTopicsRequest.MIN_VERSION, DeleteTopicsRequest.MAX_VERSION, delete_topics),
    37: (CreatePartitionsRequest.MIN_VERSION, CreatePartitionsRequest.MAX_VERSION, create_partitions),
}
