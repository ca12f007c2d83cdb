"""CreateChunks (1076) and AlterChunkAssignments (1077)."""

from __future__ import annotations

from controller.apis.registry import Apis
from controller.chunks import ChunkMove, NewChunk
from protocol.generated.alter_chunk_assignments import AlterChunkAssignmentsRequest, AlterChunkAssignmentsResponse
from protocol.generated.create_chunks import CreateChunksRequest, CreateChunksResponse
from protocol.headers import Request


async def create_chunks(apis: Apis, req: Request) -> CreateChunksResponse:
    entries = [
        NewChunk(
            e.topic_name,
            e.partition_id,
            list(e.broker_ids),
            e.start_offset,
            e.start_timestamp,
            e.prev_stop_offset,
            e.prev_end_offset,
        )
        for e in req.body.topic_partitions
    ]
    results = await apis.chunks.create_chunks(entries)
    R = CreateChunksResponse
    return R(
        throttle_time_ms=0,
        results=[
            R.CreateChunksTopicPartitionResult(
                topic_name=r.topic,
                partition_id=r.partition,
                error_code=r.error.code if r.error else 0,
                error_message=r.error.message if r.error else None,
            )
            for r in results
        ],
    )


async def alter_chunk_assignments(apis: Apis, req: Request) -> AlterChunkAssignmentsResponse:
    moves = [
        ChunkMove(
            c.topic_name,
            c.partition_id,
            c.start_offset,
            c.chunk_epoch,
            list(c.broker_ids),
            c.caught_up_broker_id,
            c.leaving_broker_id,
            c.log_start_offset,
        )
        for c in req.body.chunks
    ]
    results = await apis.chunks.alter_chunks(moves)
    R = AlterChunkAssignmentsResponse
    return R(
        throttle_time_ms=0,
        results=[
            R.AlterChunkAssignmentResult(
                topic_name=r.topic,
                partition_id=r.partition,
                start_offset=r.start_offset,
                error_code=r.error.code if r.error else 0,
                error_message=r.error.message if r.error else None,
            )
            for r in results
        ],
    )


HANDLERS = {
    1076: (CreateChunksRequest.MIN_VERSION, CreateChunksRequest.MAX_VERSION, create_chunks),
    1077: (
        AlterChunkAssignmentsRequest.MIN_VERSION,
        AlterChunkAssignmentsRequest.MAX_VERSION,
        alter_chunk_assignments,
    ),
}
