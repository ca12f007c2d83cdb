"""The quorum's own APIs: Vote (52), BeginQuorumEpoch (53), EndQuorumEpoch (54) between voters,
and DescribeQuorum (55) for tools and admin clients. Thin: the Raft client decides."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any
from uuid import UUID

from controller.apis.registry import Apis
from controller.errors import Errors
from metadata.image import METADATA_TOPIC
from protocol.generated.begin_quorum_epoch import BeginQuorumEpochRequest, BeginQuorumEpochResponse
from protocol.generated.describe_quorum import DescribeQuorumRequest, DescribeQuorumResponse
from protocol.generated.end_quorum_epoch import EndQuorumEpochRequest, EndQuorumEpochResponse
from protocol.generated.vote import VoteRequest, VoteResponse
from protocol.headers import Request

ZERO_UUID = UUID(int=0)


def _ours(topic: str, partition: int) -> bool:
    return topic == METADATA_TOPIC and partition == 0


async def _each_partition(apis: Apis, req: Request, R: Any, answer: Callable[[Any], Awaitable[dict]]) -> Any:
    """A voter request's frame: the cluster id checked, then each partition answered by
    `answer(p)` (the fields beyond its index, error code and the current leader), or
    UNKNOWN_TOPIC_OR_PARTITION for a partition that is not the metadata log's."""
    ctl = apis.controller
    raft = ctl.raft
    body = req.body
    first = next((p for t in body.topics for p in t.partitions), None)
    # the sender: a Vote's candidate, a BeginQuorumEpoch's or EndQuorumEpoch's leader
    peer: int = getattr(first, "replica_id", getattr(first, "leader_id", -1))
    if ctl.cluster_id_check.refuses(R.__name__.removesuffix("Response"), peer, body.cluster_id, ctl.cluster_id):
        return R(error_code=Errors.INCONSISTENT_CLUSTER_ID, topics=[])
    topics = []
    for t in body.topics:
        parts = []
        for p in t.partitions:
            fields = (await answer(p) if _ours(t.topic_name, p.partition_index)
                      else {"error_code": Errors.UNKNOWN_TOPIC_OR_PARTITION})
            parts.append(R.PartitionData(partition_index=p.partition_index, leader_id=raft.leader_id,
                                         leader_epoch=raft.epoch, **fields))
        topics.append(R.TopicData(topic_name=t.topic_name, partitions=parts))
    return R(error_code=0, topics=topics)


async def vote(apis: Apis, req: Request) -> VoteResponse:
    raft = apis.controller.raft

    async def answer(p: Any) -> dict:
        err, granted = await raft.handle_vote(p.replica_id, p.replica_epoch, p.last_offset_epoch, p.last_offset,
                                              p.pre_vote)
        return {"error_code": err, "vote_granted": granted}

    return await _each_partition(apis, req, VoteResponse, answer)


async def begin_quorum_epoch(apis: Apis, req: Request) -> BeginQuorumEpochResponse:
    raft = apis.controller.raft

    async def answer(p: Any) -> dict:
        return {"error_code": await raft.handle_begin_epoch(p.leader_id, p.leader_epoch)}

    return await _each_partition(apis, req, BeginQuorumEpochResponse, answer)


async def end_quorum_epoch(apis: Apis, req: Request) -> EndQuorumEpochResponse:
    raft = apis.controller.raft

    async def answer(p: Any) -> dict:
        # v0 names the successors, v1 the candidates (KIP-853): one of the two is empty
        successors = list(p.preferred_successors) or [c.candidate_id for c in p.preferred_candidates]
        return {"error_code": await raft.handle_end_epoch(p.leader_id, p.leader_epoch, successors)}

    return await _each_partition(apis, req, EndQuorumEpochResponse, answer)


async def describe_quorum(apis: Apis, req: Request) -> DescribeQuorumResponse:
    ctl = apis.controller
    R = DescribeQuorumResponse
    view = ctl.raft.describe()

    def states(entries: list) -> list:
        return [R.ReplicaState(replica_id=rid, replica_directory_id=ZERO_UUID, log_end_offset=p.end_offset,
                               last_fetch_timestamp=p.last_fetch_ms, last_caught_up_timestamp=p.last_caught_up_ms)
                for rid, p in entries]

    topics = []
    for t in req.body.topics:
        parts = []
        for p in t.partitions:
            if not _ours(t.topic_name, p.partition_index):
                parts.append(R.PartitionData(partition_index=p.partition_index,
                                             error_code=Errors.UNKNOWN_TOPIC_OR_PARTITION,
                                             error_message="only __cluster_metadata-0 has a quorum",
                                             leader_id=-1, leader_epoch=-1, high_watermark=-1,
                                             current_voters=[], observers=[]))
                continue
            parts.append(R.PartitionData(
                partition_index=p.partition_index, error_code=view.error,
                error_message="this controller is not the quorum leader" if view.error else None,
                leader_id=view.leader_id, leader_epoch=view.epoch, high_watermark=view.high_watermark,
                current_voters=states(view.voters), observers=states(view.observers)))
        topics.append(R.TopicData(topic_name=t.topic_name, partitions=parts))
    nodes = [R.Node(node_id=vid, listeners=[R.Listener(name=ctl.config.listeners[0].listener, host=host, port=port)])
             for vid, (host, port) in sorted(ctl.config.voters.items())]
    return R(error_code=0, error_message=None, topics=topics, nodes=nodes)


HANDLERS = {
    52: (VoteRequest.MIN_VERSION, VoteRequest.MAX_VERSION, vote),
    53: (BeginQuorumEpochRequest.MIN_VERSION, BeginQuorumEpochRequest.MAX_VERSION, begin_quorum_epoch),
    54: (EndQuorumEpochRequest.MIN_VERSION, EndQuorumEpochRequest.MAX_VERSION, end_quorum_epoch),
    55: (DescribeQuorumRequest.MIN_VERSION, DescribeQuorumRequest.MAX_VERSION, describe_quorum),
}
