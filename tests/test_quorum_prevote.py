"""Pre-vote (KIP-996) with real processes: three controller voters and a broker, each voter
reaching each other one through its own TCP proxy so the test can cut one voter off.

A follower cut off from the quorum loses its leader after the fetch timeout and asks for
pre-votes in its current epoch; nobody answers, so it goes back to following and tries again,
round after round, without ever standing. Healed, the other voters (whose leader is alive)
refuse its pre-vote and name the leader, so it follows again: the epoch never moved. Without
pre-vote it would have bumped its epoch every election timeout and forced a new election on
heal. The cut lasts several fetch and election timeouts (the test counts the lost rounds), not
the 30 s of the issue's wording: the rule does not depend on how long the cut is."""

from __future__ import annotations

import asyncio
import time

from node.client import ClientError, NodeClient
from protocol.generated.create_topics import CreateTopicsRequest
from protocol.generated.describe_quorum import DescribeQuorumRequest
from protocol.generated.vote import VoteRequest
from tests.conftest import wait_for
from tests.tcp_proxy import voter_links
from tools.cluster import Cluster

RAFT = {"controller.quorum.election.timeout.ms": 300, "controller.quorum.fetch.timeout.ms": 1000}
CUT_S = 6.0
CT = CreateTopicsRequest


async def _ask(host: str, port: int, body, timeout: float = 5.0):
    async with NodeClient(host, port, client_id="prevote-test", timeout=timeout) as c:
        return await c.request(body, None, timeout=timeout)


def _quorum(c: Cluster, cid: int):
    """DescribeQuorum's partition as controller `cid` answers it (a non-leader names its leader)."""
    R = DescribeQuorumRequest
    resp = asyncio.run(_ask(c.host, c.ports[cid], R(topics=[R.TopicData(
        topic_name="__cluster_metadata", partitions=[R.PartitionData(partition_index=0)])])))
    return resp.topics[0].partitions[0]


def _views(c: Cluster) -> dict[int, tuple[int, int]]:
    """Each voter's (leader, epoch)."""
    out = {}
    for cid in c.controller_ids:
        try:
            p = _quorum(c, cid)
        except (ClientError, TimeoutError, OSError):
            continue
        out[cid] = (p.leader_id, p.leader_epoch)
    return out


def _converged(c: Cluster, leader: int) -> bool:
    try:
        p = _quorum(c, leader)
    except (ClientError, TimeoutError, OSError):
        return False
    ends = {v.log_end_offset for v in p.current_voters}
    return p.error_code == 0 and len(p.current_voters) == 3 and len(ends) == 1 and p.high_watermark in ends


def _count(c: Cluster, cid: int, needle: str) -> int:
    return c.log_path(cid).read_text(errors="replace").count(needle)


def test_a_voter_cut_off_and_healed_moves_no_epoch(tmp_path):
    c = Cluster(tmp_path / "c", brokers=1, controllers=3, controller_overrides=RAFT, verbose=False)
    links = voter_links(c)
    try:
        c.start()
        leader = wait_for(lambda: c.active_controller(timeout=0.5), 20, "a leader")
        wait_for(lambda: _converged(c, leader), 20, "the voters caught up")
        epoch = _quorum(c, leader).leader_epoch
        lonely = next(x for x in c.controller_ids if x != leader)
        lost = _count(c, lonely, "event='raft_pre_vote_lost'")
        stood = _count(c, lonely, "role='Candidate'")

        for (a, b), link in links.items():
            if lonely in (a, b):
                link.cut()
        t0 = time.monotonic()
        time.sleep(CUT_S)
        rounds = _count(c, lonely, "event='raft_pre_vote_lost'") - lost
        # it lost its leader and asked again and again (several fetch + election timeouts)...
        assert rounds >= 3, f"{rounds} pre-vote rounds in {time.monotonic() - t0:.1f} s of cut"
        # ...but never stood for an election, so its epoch never moved
        assert _count(c, lonely, "role='Candidate'") == stood
        assert _views(c).get(lonely) == (leader, epoch)
        # the majority kept its leader and kept committing
        r = asyncio.run(_ask(c.host, c.ports[leader], CT(topics=[CT.CreatableTopic(
            name="during-cut", num_partitions=1, replication_factor=1)], timeout_ms=5000), timeout=10))
        assert r.topics[0].error_code == 0, r

        # a forged pre-vote in the leader's epoch with a longer log than anyone's: the leader and
        # the follower that hears it refuse, and nothing moves
        for cid in c.controller_ids:
            if cid != lonely:
                V = VoteRequest
                r = asyncio.run(_ask(c.host, c.ports[cid], V(cluster_id=None, topics=[V.TopicData(
                    topic_name="__cluster_metadata", partitions=[V.PartitionData(
                        partition_index=0, replica_epoch=epoch, replica_id=lonely, last_offset_epoch=epoch,
                        last_offset=1 << 40, pre_vote=True)])])))
                p = r.topics[0].partitions[0]
                assert (p.error_code, p.vote_granted, p.leader_id, p.leader_epoch) == (0, False, leader, epoch), p

        for link in links.values():
            link.heal()
        wait_for(lambda: _converged(c, leader), 20, "the healed voter caught up")
        # healed: same leader, same epoch on every voter, and nobody stood for an election
        assert _views(c) == {cid: (leader, epoch) for cid in c.controller_ids}
        assert _count(c, lonely, "role='Candidate'") == stood

        # a leader that stops (SIGTERM) names its successors in EndQuorumEpoch (v1's
        # PreferredCandidates): they pre-vote and elect one in the next epoch, before any fetch
        # timeout passes
        rest = [x for x in c.controller_ids if x != leader]
        lost = {x: _count(c, x, "event='raft_leader_lost'") for x in rest}
        t0 = time.monotonic()
        c.terminate(leader)
        new = wait_for(lambda: next((x for x in rest if _views(c).get(x, (-1, -1))[0] == x), None), 10,
                       "a new leader")
        assert _quorum(c, new).leader_epoch == epoch + 1
        assert time.monotonic() - t0 < 5
        # told by EndQuorumEpoch, not by a fetch timeout
        assert {x: _count(c, x, "event='raft_leader_lost'") for x in rest} == lost
    finally:
        c.stop()
        for link in links.values():
            link.close()
