"""Quorum requests from a node outside the voter set move nothing (KIP-595: a voter answers
INCONSISTENT_VOTER_SET to a Vote, BeginQuorumEpoch or EndQuorumEpoch naming a non-voter), so
stray or forged frames on a controller listener cannot start an election. Real controller."""

from __future__ import annotations

import asyncio

from node.client import NodeClient
from protocol.errors import Errors
from protocol.generated.begin_quorum_epoch import BeginQuorumEpochRequest
from protocol.generated.describe_quorum import DescribeQuorumRequest
from protocol.generated.end_quorum_epoch import EndQuorumEpochRequest
from protocol.generated.vote import VoteRequest
from tools.cluster import CONTROLLER_ID

TOPIC = "__cluster_metadata"
STRANGER = 7777  # no voter has this id


async def _ask(host: str, port: int, body, version: int | None = None):
    async with NodeClient(host, port, client_id="stray", timeout=10) as c:
        return await c.request(body, version, timeout=10)


def _leader(host: str, port: int) -> tuple[int, int]:
    R = DescribeQuorumRequest
    resp = asyncio.run(_ask(host, port, R(topics=[R.TopicData(topic_name=TOPIC, partitions=[
        R.PartitionData(partition_index=0)])])))
    p = resp.topics[0].partitions[0]
    return p.leader_id, p.leader_epoch


def test_quorum_requests_from_a_non_voter_are_refused_and_move_nothing(cluster_factory) -> None:
    c = cluster_factory(brokers=1)
    host, port = c.host, c.ports[CONTROLLER_ID]
    leader, epoch = _leader(host, port)
    assert leader == CONTROLLER_ID
    far = epoch + 100
    end = EndQuorumEpochRequest(cluster_id=None, topics=[EndQuorumEpochRequest.TopicData(
        topic_name=TOPIC, partitions=[EndQuorumEpochRequest.PartitionData(
            partition_index=0, leader_id=STRANGER, leader_epoch=far, preferred_successors=[])])])
    begin = BeginQuorumEpochRequest(cluster_id=None, topics=[BeginQuorumEpochRequest.TopicData(
        topic_name=TOPIC, partitions=[BeginQuorumEpochRequest.PartitionData(
            partition_index=0, leader_id=STRANGER, leader_epoch=far)])])
    vote = VoteRequest(cluster_id=None, topics=[VoteRequest.TopicData(topic_name=TOPIC, partitions=[
        VoteRequest.PartitionData(partition_index=0, replica_epoch=far, replica_id=STRANGER,
                                  last_offset_epoch=far, last_offset=1 << 40)])])
    # at every version Kafka 4.1 serves (Vote v0-2, BeginQuorumEpoch and EndQuorumEpoch v0-1)
    for body in (end, begin, vote):
        assert (type(body).MIN_VERSION, type(body).MAX_VERSION) == (0, 2 if body is vote else 1)
        for version in range(type(body).MAX_VERSION + 1):
            resp = asyncio.run(_ask(host, port, body, version))
            p = resp.topics[0].partitions[0]
            assert p.error_code == Errors.INCONSISTENT_VOTER_SET, (type(body).__name__, version, p)
    assert _leader(host, port) == (leader, epoch)  # same leader, same epoch: no election
