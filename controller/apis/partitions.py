"""AlterPartition, ElectLeaders, AlterPartitionReassignments, ListPartitionReassignments."""

from __future__ import annotations

from controller.apis.registry import Apis
from controller.errors import ApiError
from controller.partitions import IsrUpdate, PartitionResult, TopicIsrUpdates
from protocol.generated.alter_partition import AlterPartitionRequest, AlterPartitionResponse
from protocol.generated.alter_partition_reassignments import (
    AlterPartitionReassignmentsRequest,
    AlterPartitionReassignmentsResponse,
)
from protocol.generated.elect_leaders import ElectLeadersRequest, ElectLeadersResponse
from protocol.generated.list_partition_reassignments import (
    ListPartitionReassignmentsRequest,
    ListPartitionReassignmentsResponse,
)
from protocol.headers import Request

FIRST_TOPIC_ID_VERSION = 2  # AlterPartition v2+ names topics by id
FIRST_BROKER_STATE_VERSION = 3  # AlterPartition v3+ sends NewIsrWithEpochs


def _partition_results(results: list[PartitionResult], cls: type, index_field: str) -> list:
    """Per-partition answers (index, error code, error message) of ElectLeaders and
    AlterPartitionReassignments, which differ only in the index field's name."""
    return [
        cls(
            **{index_field: r.partition},
            error_code=r.error.code if r.error else 0,
            error_message=r.error.message if r.error else None,
        )
        for r in results
    ]


async def alter_partition(apis: Apis, req: Request) -> AlterPartitionResponse:
    body, v = req.body, req.api_version
    topics = []
    for t in body.topics:
        parts = []
        for p in t.partitions:
            if v >= FIRST_BROKER_STATE_VERSION:
                isr = [(s.broker_id, s.broker_epoch) for s in p.new_isr_with_epochs]
            else:
                isr = [(r, -1) for r in p.new_isr]
            parts.append(IsrUpdate(p.partition_index, p.leader_epoch, p.partition_epoch, isr, p.leader_recovery_state))
        if v >= FIRST_TOPIC_ID_VERSION:
            topics.append(TopicIsrUpdates(None, t.topic_id, parts))
        else:
            topics.append(TopicIsrUpdates(t.topic_name, None, parts))
    try:
        results = await apis.partitions.alter_partition(body.broker_id, body.broker_epoch, topics, v)
    except ApiError as e:
        return AlterPartitionResponse(throttle_time_ms=0, error_code=e.code, topics=[])
    out = []
    for t, states in zip(body.topics, results, strict=True):
        answers: list[AlterPartitionResponse.PartitionData] = []
        for s in states:
            if s.error:
                answers.append(AlterPartitionResponse.PartitionData(partition_index=s.partition, error_code=s.error))
            else:
                answers.append(
                    AlterPartitionResponse.PartitionData(
                        partition_index=s.partition,
                        error_code=0,
                        leader_id=s.leader,
                        leader_epoch=s.leader_epoch,
                        isr=s.isr,
                        leader_recovery_state=0,
                        partition_epoch=s.partition_epoch,
                    )
                )
        out.append(AlterPartitionResponse.TopicData(topic_name=t.topic_name, topic_id=t.topic_id, partitions=answers))
    return AlterPartitionResponse(throttle_time_ms=0, error_code=0, topics=out)


async def elect_leaders(apis: Apis, req: Request) -> ElectLeadersResponse:
    body = req.body
    election_type = body.election_type if req.api_version >= 1 else 0
    wanted = None if body.topic_partitions is None else [(t.topic, list(t.partitions)) for t in body.topic_partitions]
    try:
        results = await apis.partitions.elect_leaders(election_type, wanted)
    except ApiError as e:
        return ElectLeadersResponse(throttle_time_ms=0, error_code=e.code, replica_election_results=[])
    E = ElectLeadersResponse
    return E(
        throttle_time_ms=0,
        error_code=0,
        replica_election_results=[
            E.ReplicaElectionResult(
                topic=name, partition_result=_partition_results(rs, E.PartitionResult, "partition_id")
            )
            for name, rs in results
        ],
    )


async def alter_partition_reassignments(apis: Apis, req: Request) -> AlterPartitionReassignmentsResponse:
    topics = [
        (t.name, [(p.partition_index, None if p.replicas is None else list(p.replicas)) for p in t.partitions])
        for t in req.body.topics
    ]
    results = await apis.partitions.alter_reassignments(topics)
    R = AlterPartitionReassignmentsResponse
    return R(
        throttle_time_ms=0,
        error_code=0,
        error_message=None,
        responses=[
            R.ReassignableTopicResponse(
                name=name, partitions=_partition_results(rs, R.ReassignablePartitionResponse, "partition_index")
            )
            for name, rs in results
        ],
    )


async def list_partition_reassignments(apis: Apis, req: Request) -> ListPartitionReassignmentsResponse:
    topics = req.body.topics
    wanted = None if topics is None else [(t.name, list(t.partition_indexes)) for t in topics]
    L = ListPartitionReassignmentsResponse
    return L(
        throttle_time_ms=0,
        error_code=0,
        error_message=None,
        topics=[
            L.OngoingTopicReassignment(
                name=name,
                partitions=[
                    L.OngoingPartitionReassignment(
                        partition_index=p.partition,
                        replicas=list(p.replicas),
                        adding_replicas=list(p.adding_replicas),
                        removing_replicas=list(p.removing_replicas),
                    )
                    for p in parts
                ],
            )
            for name, parts in apis.partitions.list_reassignments(wanted)
        ],
    )


HANDLERS = {
    43: (ElectLeadersRequest.MIN_VERSION, ElectLeadersRequest.MAX_VERSION, elect_leaders),
    45: (
        AlterPartitionReassignmentsRequest.MIN_VERSION,
        AlterPartitionReassignmentsRequest.MAX_VERSION,
        alter_partition_reassignments,
    ),
    46: (
        ListPartitionReassignmentsRequest.MIN_VERSION,
        ListPartitionReassignmentsRequest.MAX_VERSION,
        list_partition_reassignments,
    ),
    56: (AlterPartitionRequest.MIN_VERSION, AlterPartitionRequest.MAX_VERSION, alter_partition),
}
