"""CreateChunks on the partition leader, and AlterChunkAssignments forwarded to the controller.

The leader fixes a new chunk's offsets: it seals the partition (Produce answers
NOT_LEADER_OR_FOLLOWER, retriable), waits a bounded time for in-flight acks=all writes to reach
every in-sync replica (HW == log end), then reads the LSO and HW (Kafka's terms, exclusive) and
forwards StartOffset = LSO, PrevStopOffset = LSO - 1, PrevEndOffset = HW - 1 and its clock as
StartTimestamp to the controller. The answer goes back once this broker's metadata image holds
the new active chunk. The seal is lifted on any error, and after a success only once the image
shows the new chunk (leadership has then moved as the controller decided), so no write lands in
the closed chunk past the offsets it was given.
"""

from __future__ import annotations

import asyncio

import structlog

from broker.apis.registry import RequestContext, api
from broker.replication.partition import Partition, now_ms
from node.client import ClientError
from protocol.errors import Errors
from protocol.generated.alter_chunk_assignments import AlterChunkAssignmentsResponse
from protocol.generated.create_chunks import CreateChunksRequest, CreateChunksResponse

log = structlog.get_logger(__name__)

# How long in-flight acks=all writes get to replicate before a CreateChunks gives up.
SETTLE_TIMEOUT_S = 5.0
# How long a partition whose chunk the controller accepted stays sealed waiting for our image.
UNSEAL_GIVE_UP_S = 60.0
IMAGE_WAIT_S = 30.0  # how long the answer waits for our image to show a created chunk (Broker.forward's sync)

R = CreateChunksResponse


def _result(
    e: CreateChunksRequest.CreateChunksTopicPartition, code: int, message: str | None
) -> R.CreateChunksTopicPartitionResult:
    return R.CreateChunksTopicPartitionResult(
        topic_name=e.topic_name, partition_id=e.partition_id, error_code=code, error_message=message
    )


@api(1076, 0, 0)
async def create_chunks(ctx: RequestContext, req: CreateChunksRequest) -> CreateChunksResponse:
    s = ctx.services
    results: list[R.CreateChunksTopicPartitionResult | None] = [None] * len(req.topic_partitions)
    sealed: list[tuple[int, CreateChunksRequest.CreateChunksTopicPartition, Partition]] = []
    epochs: dict[int, int] = {}  # entry -> leader epoch of the image it was sealed under
    try:
        for i, e in enumerate(req.topic_partitions):
            p, code = s.partitions.leader(e.topic_name, e.partition_id)
            if p is None:
                msg = f"broker {s.config.node_id} does not lead {e.topic_name}-{e.partition_id}"
                results[i] = _result(e, code, msg if code == Errors.NOT_LEADER_OR_FOLLOWER else None)
                continue
            if p.sealed:
                results[i] = _result(
                    e, Errors.REASSIGNMENT_IN_PROGRESS, f"a chunk of {e.topic_name}-{e.partition_id} is being created"
                )
                continue
            p.sealed = True
            sealed.append((i, e, p))
            info = s.metadata.image.partition(e.topic_name, e.partition_id)
            epochs[i] = info.leader_epoch if info is not None else p.leader_epoch
        settled = await asyncio.gather(
            *(p.wait_for_high_watermark(p.log.log_end_offset, SETTLE_TIMEOUT_S) for _, _, p in sealed)
        )
        forward = []
        at = now_ms()
        for (i, e, p), ok in zip(sealed, settled, strict=True):
            if not ok or not p.is_leader:
                results[i] = _result(
                    e,
                    Errors.REQUEST_TIMED_OUT if p.is_leader else Errors.NOT_LEADER_OR_FOLLOWER,
                    f"writes to {e.topic_name}-{e.partition_id} did not reach every in-sync replica "
                    f"within {SETTLE_TIMEOUT_S:g} s"
                    if p.is_leader
                    else f"leadership of {e.topic_name}-{e.partition_id} moved",
                )
                continue
            hw = p.high_watermark
            lso = _last_stable_offset(p, hw)
            forward.append(
                (
                    i,
                    CreateChunksRequest.CreateChunksTopicPartition(
                        topic_name=e.topic_name,
                        partition_id=e.partition_id,
                        broker_ids=list(e.broker_ids),
                        start_offset=lso,
                        start_timestamp=at,
                        prev_stop_offset=lso - 1,
                        prev_end_offset=hw - 1,
                    ),
                )
            )
        if forward:
            await _forward(s, forward, results, epochs)
            sent = {i for i, _ in forward}
            pending = [
                (e, p, epochs[i])
                for i, e, p in sealed
                if i in sent
                and (r := results[i]) is not None
                and r.error_code == 0
                and not _image_moved_on(s, e, epochs[i])
            ]
            if pending:
                # The controller took the chunk but our image does not show it yet (the sync after
                # the forward timed out): writes must not reach the closed chunk meanwhile.
                for e, p, epoch in pending:
                    s.spawn(_unseal_when_applied(s, e, p, epoch))
                held = {id(p) for _, p, _ in pending}
                sealed = [x for x in sealed if id(x[2]) not in held]
    finally:
        for _, _, p in sealed:
            p.sealed = False
    return R(throttle_time_ms=0, results=[r for r in results if r is not None])


def _image_moved_on(s, e: CreateChunksRequest.CreateChunksTopicPartition, sealed_epoch: int) -> bool:
    """True once our image holds the new active chunk: its PartitionChangeRecord always starts a
    new leader epoch (an empty active chunk that just moves keeps its start offset)."""
    info = s.metadata.image.partition(e.topic_name, e.partition_id)
    return info is None or info.leader_epoch > sealed_epoch


async def _unseal_when_applied(s, e, p: Partition, sealed_epoch: int) -> None:
    """Lift the seal once this broker's image holds the new active chunk (it then no longer leads
    the closed one), or after UNSEAL_GIVE_UP_S so a lost metadata stream cannot block writes forever."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + UNSEAL_GIVE_UP_S
    try:
        while not _image_moved_on(s, e, sealed_epoch) and loop.time() < deadline:
            await s.metadata.sync(timeout=min(5.0, max(0.1, deadline - loop.time())))
        if not _image_moved_on(s, e, sealed_epoch):
            log.warning("chunk_seal_lifted_without_metadata", topic=e.topic_name, partition=e.partition_id)
    finally:
        p.sealed = False


def _last_stable_offset(p: Partition, hw: int) -> int:
    """The LSO: below the first open transaction's first offset, never above the HW. A log
    without transaction tracking has no open transactions, so its LSO is the HW."""
    lso = getattr(p.log, "last_stable_offset", hw)
    if callable(lso):
        lso = lso()
    return min(lso, hw)


async def _forward(s, forward: list, results: list, epochs: dict) -> None:
    body = CreateChunksRequest(topic_partitions=[e for _, e in forward])
    try:
        # read_only: rather than a full metadata round (up to a long-poll later), answer as soon as
        # our image shows each new active chunk, which the metadata fetch in flight brings at once
        resp = await s.forward(body, 0, read_only=True)
    except ClientError as err:
        for i, e in forward:
            results[i] = _result(e, Errors.REQUEST_TIMED_OUT, f"the controller did not answer: {err}")
        return
    for (i, e), r in zip(forward, resp.results, strict=False):
        results[i] = r
        log.info(
            "chunk_created" if r.error_code == 0 else "chunk_create_failed",
            topic=e.topic_name,
            partition=e.partition_id,
            start_offset=e.start_offset,
            prev_end_offset=e.prev_end_offset,
            replicas=e.broker_ids,
            error=r.error_code,
            message=r.error_message,
        )
    for i, e in forward[len(resp.results) :]:
        results[i] = _result(e, Errors.UNKNOWN_SERVER_ERROR, "the controller left this partition unanswered")
    created = [(e, epochs[i]) for i, e in forward if results[i].error_code == 0]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + IMAGE_WAIT_S
    while any(not _image_moved_on(s, e, epoch) for e, epoch in created) and loop.time() < deadline:
        await asyncio.sleep(0.005)


@api(1077, 0, 0)
async def alter_chunk_assignments(ctx: RequestContext, req) -> AlterChunkAssignmentsResponse:
    """Only the controller changes chunk assignments; brokers pass the request on."""
    try:
        return await ctx.services.forward(req, ctx.api_version)
    except ClientError as err:
        A = AlterChunkAssignmentsResponse
        return A(
            throttle_time_ms=0,
            results=[
                A.AlterChunkAssignmentResult(
                    topic_name=c.topic_name,
                    partition_id=c.partition_id,
                    start_offset=c.start_offset,
                    error_code=Errors.REQUEST_TIMED_OUT,
                    error_message=f"the controller did not answer: {err}",
                )
                for c in req.chunks
            ],
        )
