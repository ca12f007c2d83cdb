"""Fetch and FetchSnapshot on the metadata log (`__cluster_metadata`, partition 0), as KRaft
followers use them: brokers replicate the log with Fetch (long poll when caught up) and, when
their offset fell below the log start, load the latest snapshot with FetchSnapshot and go on
fetching from its end offset.
"""

from __future__ import annotations

import asyncio

from controller.apis.registry import Apis
from controller.errors import Errors
from metadata.image import METADATA_TOPIC, METADATA_TOPIC_ID
from protocol.generated.fetch import FetchRequest, FetchResponse
from protocol.generated.fetch_snapshot import FetchSnapshotRequest, FetchSnapshotResponse
from protocol.headers import Request

FIRST_SERVED_FETCH = 4  # older versions predate record batches (magic 2)
FIRST_TOPIC_ID_FETCH = 13
FIRST_FLEXIBLE_FETCH = 12
FIRST_REPLICA_STATE_FETCH = 15


async def fetch(apis: Apis, req: Request) -> FetchResponse:
    ctl = apis.controller
    raft = ctl.raft
    body = req.body
    v = req.api_version
    by_id = v >= FIRST_TOPIC_ID_FETCH
    replica_id = body.replica_state.replica_id if v >= FIRST_REPLICA_STATE_FETCH and body.replica_state else body.replica_id
    if ctl.cluster_id_check.refuses("Fetch", replica_id, body.cluster_id, ctl.cluster_id):
        return FetchResponse(throttle_time_ms=0, error_code=Errors.INCONSISTENT_CLUSTER_ID, session_id=0, responses=[])
    if body.session_id != 0:
        # We never hand out fetch sessions (session id 0 in every answer), so none can exist.
        return FetchResponse(
            throttle_time_ms=0, error_code=Errors.FETCH_SESSION_ID_NOT_FOUND, session_id=0, responses=[]
        )
    responses = []
    served = False
    for t in body.topics:
        is_meta = t.topic_id == METADATA_TOPIC_ID if by_id else t.topic == METADATA_TOPIC
        parts = []
        for p in t.partitions:
            if is_meta and p.partition == 0 and not served:
                served = True
                got = await raft.handle_fetch(replica_id, p.fetch_offset, p.last_fetched_epoch, p.current_leader_epoch,
                                              body.max_wait_ms, min(p.partition_max_bytes, body.max_bytes))
                out = FetchResponse.PartitionData(
                    partition_index=p.partition, error_code=got.error, high_watermark=got.high_watermark,
                    last_stable_offset=got.high_watermark, log_start_offset=got.log_start, records=got.records)
                if v >= FIRST_FLEXIBLE_FETCH:
                    out.current_leader = FetchResponse.LeaderIdAndEpoch(raft.leader_id, raft.epoch)
                    if got.diverging is not None:
                        out.diverging_epoch = FetchResponse.EpochEndOffset(epoch=got.diverging[0],
                                                                           end_offset=got.diverging[1])
                    if got.snapshot is not None:
                        out.snapshot_id = FetchResponse.SnapshotId(end_offset=got.snapshot[0], epoch=got.snapshot[1])
                parts.append(out)
            else:
                code = Errors.UNKNOWN_TOPIC_ID if by_id and not is_meta else Errors.UNKNOWN_TOPIC_OR_PARTITION
                parts.append(
                    FetchResponse.PartitionData(partition_index=p.partition, error_code=code, high_watermark=-1)
                )
        responses.append(FetchResponse.FetchableTopicResponse(topic=t.topic, topic_id=t.topic_id, partitions=parts))
    resp = FetchResponse(throttle_time_ms=0, error_code=0, session_id=0, responses=responses)
    leader = raft.voter_set().get(raft.leader_id) if raft.membership.dynamic else None
    if leader is not None and raft.leader_id != ctl.node_id:
        # where the leader is, for a replica that does not know it yet (KIP-853 dynamic voters)
        host, port = leader.address
        resp.node_endpoints = [FetchResponse.NodeEndpoint(node_id=leader.id, host=host, port=port, rack=None)]
    return resp


async def fetch_snapshot(apis: Apis, req: Request) -> FetchSnapshotResponse:
    ctl = apis.controller
    body = req.body
    if ctl.cluster_id_check.refuses("FetchSnapshot", body.replica_id, body.cluster_id, ctl.cluster_id):
        return FetchSnapshotResponse(throttle_time_ms=0, error_code=Errors.INCONSISTENT_CLUSTER_ID, topics=[])
    raft = ctl.raft
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
                current_leader=FetchSnapshotResponse.LeaderIdAndEpoch(raft.leader_id, raft.epoch),
                size=0,
                position=p.position,
                unaligned_records=b"",
            )
            parts.append(out)
            if t.name != METADATA_TOPIC or p.partition != 0:
                out.error_code = Errors.UNKNOWN_TOPIC_OR_PARTITION
                continue
            if err := raft.snapshot_error(p.current_leader_epoch):
                out.error_code = err
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
