"""Fetch and FetchSnapshot on the metadata log (`__cluster_metadata`, partition 0), as KRaft
followers use them: brokers replicate the log with Fetch (long poll when caught up) and, when
their offset fell below the log start, load the latest snapshot with FetchSnapshot and go on
fetching from its end offset.
"""

from __future__ import annotations

import asyncio

from controller.apis import Apis
from controller.controller import LEADER_EPOCH
from controller.errors import Errors
from controller.metadata_log import OffsetOutOfRange
from metadata.image import METADATA_TOPIC, METADATA_TOPIC_ID
from protocol.generated.fetch import FetchRequest, FetchResponse
from protocol.generated.fetch_snapshot import FetchSnapshotRequest, FetchSnapshotResponse
from protocol.headers import Request

FIRST_SERVED_FETCH = 4  # older versions predate record batches (magic 2)
FIRST_TOPIC_ID_FETCH = 13
FIRST_FLEXIBLE_FETCH = 12


def _epoch_error(current_leader_epoch: int) -> int:
    if current_leader_epoch > LEADER_EPOCH:
        return Errors.UNKNOWN_LEADER_EPOCH
    if 0 <= current_leader_epoch < LEADER_EPOCH:
        return Errors.FENCED_LEADER_EPOCH
    return 0


async def fetch(apis: Apis, req: Request) -> FetchResponse:
    ctl = apis.controller
    body = req.body
    v = req.api_version
    by_id = v >= FIRST_TOPIC_ID_FETCH
    if body.cluster_id is not None and body.cluster_id != ctl.cluster_id:
        return FetchResponse(throttle_time_ms=0, error_code=Errors.INCONSISTENT_CLUSTER_ID, session_id=0, responses=[])
    if body.session_id != 0:
        # We never hand out fetch sessions (session id 0 in every answer), so none can exist.
        return FetchResponse(
            throttle_time_ms=0, error_code=Errors.FETCH_SESSION_ID_NOT_FOUND, session_id=0, responses=[]
        )

    wanted = None
    for t in body.topics:
        is_meta = t.topic_id == METADATA_TOPIC_ID if by_id else t.topic == METADATA_TOPIC
        for p in t.partitions:
            if is_meta and p.partition == 0 and wanted is None:
                wanted = p
    log = ctl.log
    if wanted is not None and body.max_wait_ms > 0 and wanted.fetch_offset == log.end_offset:
        if not _epoch_error(wanted.current_leader_epoch):
            await log.wait_for_data(wanted.fetch_offset, body.max_wait_ms / 1000)

    responses = []
    for t in body.topics:
        is_meta = t.topic_id == METADATA_TOPIC_ID if by_id else t.topic == METADATA_TOPIC
        parts = []
        for p in t.partitions:
            if p is wanted:
                parts.append(await _read(apis, body, p, v))
            else:
                code = Errors.UNKNOWN_TOPIC_ID if by_id and not is_meta else Errors.UNKNOWN_TOPIC_OR_PARTITION
                parts.append(
                    FetchResponse.PartitionData(partition_index=p.partition, error_code=code, high_watermark=-1)
                )
        responses.append(FetchResponse.FetchableTopicResponse(topic=t.topic, topic_id=t.topic_id, partitions=parts))
    return FetchResponse(throttle_time_ms=0, error_code=0, session_id=0, responses=responses)


async def _read(apis: Apis, body: FetchRequest, p: FetchRequest.FetchPartition, v: int) -> FetchResponse.PartitionData:
    ctl = apis.controller
    log = ctl.log
    out = FetchResponse.PartitionData(partition_index=p.partition, error_code=0, records=b"")
    if v >= FIRST_FLEXIBLE_FETCH:
        out.current_leader = FetchResponse.LeaderIdAndEpoch(ctl.node_id, LEADER_EPOCH)
    out.error_code = _epoch_error(p.current_leader_epoch)
    if not out.error_code:
        try:
            out.records = await log.read(p.fetch_offset, min(p.partition_max_bytes, body.max_bytes))
        except OffsetOutOfRange:
            out.error_code = Errors.OFFSET_OUT_OF_RANGE
            snapshot = ctl.latest_snapshot()
            if p.fetch_offset < log.start_offset and snapshot is not None and v >= FIRST_FLEXIBLE_FETCH:
                out.snapshot_id = FetchResponse.SnapshotId(end_offset=snapshot, epoch=LEADER_EPOCH)
    out.high_watermark = log.end_offset
    out.last_stable_offset = log.end_offset
    out.log_start_offset = log.start_offset
    return out


async def fetch_snapshot(apis: Apis, req: Request) -> FetchSnapshotResponse:
    ctl = apis.controller
    body = req.body
    if body.cluster_id is not None and body.cluster_id != ctl.cluster_id:
        return FetchSnapshotResponse(throttle_time_ms=0, error_code=Errors.INCONSISTENT_CLUSTER_ID, topics=[])
    budget = max(body.max_bytes, 0)
    loop = asyncio.get_running_loop()
    topics = []
    for t in body.topics:
        parts = []
        for p in t.partitions:
            sid = p.snapshot_id
            out = FetchSnapshotResponse.PartitionSnapshot(
                index=p.partition,
                error_code=0,
                snapshot_id=FetchSnapshotResponse.SnapshotId(sid.end_offset, sid.epoch),
                current_leader=FetchSnapshotResponse.LeaderIdAndEpoch(ctl.node_id, LEADER_EPOCH),
                size=0,
                position=p.position,
                unaligned_records=b"",
            )
            parts.append(out)
            if t.name != METADATA_TOPIC or p.partition != 0:
                out.error_code = Errors.UNKNOWN_TOPIC_OR_PARTITION
                continue
            if err := _epoch_error(p.current_leader_epoch):
                out.error_code = err
                continue
            if sid.epoch != LEADER_EPOCH:
                out.error_code = Errors.SNAPSHOT_NOT_FOUND
                continue
            if p.position < 0:
                out.error_code = Errors.POSITION_OUT_OF_RANGE
                continue
            got = await loop.run_in_executor(None, ctl.snapshots.read_range, sid.end_offset, p.position, budget)
            if got is None:
                out.error_code = Errors.SNAPSHOT_NOT_FOUND
                continue
            size, data = got
            if p.position > size:
                out.error_code = Errors.POSITION_OUT_OF_RANGE
                continue
            out.size = size
            out.unaligned_records = data
            budget -= len(data)
        topics.append(FetchSnapshotResponse.TopicSnapshot(name=t.name, partitions=parts))
    return FetchSnapshotResponse(throttle_time_ms=0, error_code=0, topics=topics)


HANDLERS = {
    1: (FIRST_SERVED_FETCH, FetchRequest.MAX_VERSION, fetch),
    59: (FetchSnapshotRequest.MIN_VERSION, FetchSnapshotRequest.MAX_VERSION, fetch_snapshot),
}
