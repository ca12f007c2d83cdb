"""The quorum's own APIs: Vote (52), BeginQuorumEpoch (53), EndQuorumEpoch (54) between voters,
DescribeQuorum (55) for tools and admin clients, and the voter changes of KIP-853: AddRaftVoter
(80), RemoveRaftVoter (81), UpdateRaftVoter (82). Thin: the Raft client decides."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any
from uuid import UUID

from controller.apis.registry import Apis
from controller.errors import Errors
from controller.raft.membership import MembershipError
from metadata.image import METADATA_TOPIC
from metadata.voters import ZERO_UUID, Voter
from protocol.generated.add_raft_voter import AddRaftVoterRequest, AddRaftVoterResponse
from protocol.generated.begin_quorum_epoch import BeginQuorumEpochRequest, BeginQuorumEpochResponse
from protocol.generated.describe_quorum import DescribeQuorumRequest, DescribeQuorumResponse
from protocol.generated.end_quorum_epoch import EndQuorumEpochRequest, EndQuorumEpochResponse
from protocol.generated.remove_raft_voter import RemoveRaftVoterRequest, RemoveRaftVoterResponse
from protocol.generated.update_raft_voter import UpdateRaftVoterRequest, UpdateRaftVoterResponse
from protocol.generated.vote import VoteRequest, VoteResponse
from protocol.headers import Request

VOTER_CHANGE_TIMEOUT_S = 30.0  # RemoveRaftVoter carries no timeout of its own


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

    voters = ctl.raft.voter_set()

    def states(entries: list) -> list:
        return [R.ReplicaState(replica_id=rid, replica_directory_id=voters[rid].directory_id if rid in voters
                               else ZERO_UUID, log_end_offset=p.end_offset,
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
    nodes = [R.Node(node_id=v.id, listeners=[R.Listener(name=n, host=h, port=port) for n, h, port in v.endpoints])
             for v in sorted(voters.values(), key=lambda v: v.id)]
    return R(error_code=0, error_message=None, topics=topics, nodes=nodes)


def _voter(voter_id: int, directory_id: UUID, listeners: list) -> Voter:
    return Voter(voter_id, directory_id, tuple((x.name, x.host, x.port) for x in listeners))


def _wrong_cluster(apis: Apis, req: Request) -> str | None:
    """Why a voter change names another cluster (INCONSISTENT_CLUSTER_ID), or None."""
    ours, theirs = apis.controller.cluster_id, req.body.cluster_id
    return f"cluster id {theirs} is not this quorum's ({ours})" if theirs is not None and theirs != ours else None


async def add_raft_voter(apis: Apis, req: Request) -> AddRaftVoterResponse:
    R, b = AddRaftVoterResponse, req.body
    if (wrong := _wrong_cluster(apis, req)) is not None:
        return R(error_code=Errors.INCONSISTENT_CLUSTER_ID, error_message=wrong)
    try:
        await apis.controller.raft.membership.add_voter(_voter(b.voter_id, b.voter_directory_id, b.listeners),
                                                       max(b.timeout_ms, 1) / 1000, b.ack_when_committed)
    except MembershipError as e:
        return R(error_code=e.code, error_message=str(e))
    return R(error_code=0, error_message=None)


async def remove_raft_voter(apis: Apis, req: Request) -> RemoveRaftVoterResponse:
    R, b = RemoveRaftVoterResponse, req.body
    if (wrong := _wrong_cluster(apis, req)) is not None:
        return R(error_code=Errors.INCONSISTENT_CLUSTER_ID, error_message=wrong)
    try:
        await apis.controller.raft.membership.remove_voter(b.voter_id, b.voter_directory_id, VOTER_CHANGE_TIMEOUT_S)
    except MembershipError as e:
        return R(error_code=e.code, error_message=str(e))
    return R(error_code=0, error_message=None)


async def update_raft_voter(apis: Apis, req: Request) -> UpdateRaftVoterResponse:
    R, b = UpdateRaftVoterResponse, req.body
    raft = apis.controller.raft
    code = 0
    if _wrong_cluster(apis, req) is not None:
        code = Errors.INCONSISTENT_CLUSTER_ID
    else:
        try:
            await raft.membership.update_voter(_voter(b.voter_id, b.voter_directory_id, b.listeners))
        except MembershipError as e:
            code = e.code
    leader = raft.voter_set().get(raft.leader_id)
    host, port = leader.address if leader is not None else ("", -1)
    return R(error_code=code, current_leader=R.CurrentLeader(leader_id=raft.leader_id, leader_epoch=raft.epoch,
                                                             host=host, port=port))


HANDLERS = {
    52: (VoteRequest.MIN_VERSION, VoteRequest.MAX_VERSION, vote),
    53: (BeginQuorumEpochRequest.MIN_VERSION, BeginQuorumEpochRequest.MAX_VERSION, begin_quorum_epoch),
    54: (EndQuorumEpochRequest.MIN_VERSION, EndQuorumEpochRequest.MAX_VERSION, end_quorum_epoch),
    55: (DescribeQuorumRequest.MIN_VERSION, DescribeQuorumRequest.MAX_VERSION, describe_quorum),
    80: (AddRaftVoterRequest.MIN_VERSION, AddRaftVoterRequest.MAX_VERSION, add_raft_voter),
    81: (RemoveRaftVoterRequest.MIN_VERSION, RemoveRaftVoterRequest.MAX_VERSION, remove_raft_voter),
    82: (UpdateRaftVoterRequest.MIN_VERSION, UpdateRaftVoterRequest.MAX_VERSION, update_raft_voter),
}
