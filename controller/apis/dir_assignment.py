"""AssignReplicasToDirs (73): a broker says in which of its log dirs replicas live."""

from __future__ import annotations

from controller.apis.registry import Apis
from controller.dir_assignment import Assignment
from controller.errors import ApiError
from protocol.generated.assign_replicas_to_dirs import AssignReplicasToDirsRequest, AssignReplicasToDirsResponse
from protocol.headers import Request

R = AssignReplicasToDirsResponse


async def assign_replicas_to_dirs(apis: Apis, req: Request) -> AssignReplicasToDirsResponse:
    body = req.body
    flat = [
        Assignment(d.id, t.topic_id, p.partition_index, p.chunk_start_offset)
        for d in body.directories for t in d.topics for p in t.partitions
    ]
    try:
        codes = iter(await apis.dir_assignment.assign(body.broker_id, body.broker_epoch, flat))
    except ApiError as e:
        return R(throttle_time_ms=0, error_code=e.code, directories=[])
    return R(
        throttle_time_ms=0,
        error_code=0,
        directories=[
            R.DirectoryData(id=d.id, topics=[
                R.TopicData(topic_id=t.topic_id, partitions=[
                    R.PartitionData(partition_index=p.partition_index, chunk_start_offset=p.chunk_start_offset,
                                    error_code=next(codes))
                    for p in t.partitions
                ])
                for t in d.topics
            ])
            for d in body.directories
        ],
    )


HANDLERS = {
    73: (AssignReplicasToDirsRequest.MIN_VERSION, AssignReplicasToDirsRequest.MAX_VERSION, assign_replicas_to_dirs),
}
