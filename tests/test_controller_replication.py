"""The controller's replication control, driven over the wire as brokers and admin tools drive it:
AlterPartition (ISR changes from partition leaders), leader election on fencing and unfencing,
ElectLeaders and the automatic preferred-leader rebalance, partition reassignments, producer id
blocks, replication throttle configs. A real `python -m controller` per test; the "brokers" are
the test itself (registration, heartbeats, AlterPartition), and every state is checked by reading
the metadata log back and replaying it into a MetadataImage."""

from __future__ import annotations

import asyncio
import signal
import time
import uuid

import pytest

from metadata import MetadataImage, PartitionInfo
from node.client import NodeClient
from protocol.errors import Errors
from protocol.generated.allocate_producer_ids import AllocateProducerIdsRequest
from protocol.generated.alter_partition import AlterPartitionRequest
from protocol.generated.alter_partition_reassignments import AlterPartitionReassignmentsRequest
from protocol.generated.elect_leaders import ElectLeadersRequest
from protocol.generated.incremental_alter_configs import IncrementalAlterConfigsRequest
from protocol.generated.list_partition_reassignments import ListPartitionReassignmentsRequest
from tests.test_controller import (
    ControllerProcess,
    connect,
    create,
    heartbeat,
    image_of,
    log_end,
    read_log,
    run,
    start_brokers,
    topic,
)

AP = AlterPartitionRequest
EL = ElectLeadersRequest
APR = AlterPartitionReassignmentsRequest
LPR = ListPartitionReassignmentsRequest
IA = IncrementalAlterConfigsRequest
THR_LEADER = "leader.replication.throttled.replicas"
THR_FOLLOWER = "follower.replication.throttled.replicas"
LONG_SESSION = 60_000  # tests that do not fence anyone keep every broker's session alive


# ---------------------------------------------------------------- helpers
@pytest.fixture
def controllers(tmp_path):
    """Makes controller processes; every one still running is killed at teardown."""
    made: list[ControllerProcess] = []

    def make(**props: object) -> ControllerProcess:
        d = tmp_path / f"c{len(made)}"
        d.mkdir()
        made.append(ControllerProcess(d, **props))
        return made[-1]

    yield make
    for c in made:
        if c.proc is not None and c.proc.poll() is None:
            c.proc.kill()
            c.wait()


async def image(cl: NodeClient) -> MetadataImage:
    return image_of(await read_log(cl))


async def part(cl: NodeClient, name: str, index: int = 0) -> PartitionInfo:
    p = (await image(cl)).partition(name, index)
    assert p is not None
    return p


async def alter_isr(
    cl: NodeClient,
    broker: int,
    epoch: int,
    p: PartitionInfo,
    isr: list[int],
    *,
    version: int = 3,
    name: str = "",
    leader_epoch: int | None = None,
    partition_epoch: int | None = None,
    isr_epochs: dict[int, int] | None = None,
    recovery: int = 0,
):
    """AlterPartition for one partition, as a leader sends it. Returns (request error, the
    partition's answer or None)."""
    pd = AP.PartitionData(
        partition_index=p.partition,
        leader_epoch=p.leader_epoch if leader_epoch is None else leader_epoch,
        partition_epoch=p.partition_epoch if partition_epoch is None else partition_epoch,
        leader_recovery_state=recovery,
    )
    if version >= 3:
        pd.new_isr_with_epochs = [AP.BrokerState(b, (isr_epochs or {}).get(b, -1)) for b in isr]
    else:
        pd.new_isr = list(isr)
    td = AP.TopicData(partitions=[pd])
    if version >= 2:
        td.topic_id = p.topic_id
    else:
        td.topic_name = name
    resp = await cl.request(AP(broker_id=broker, broker_epoch=epoch, topics=[td]), version)
    if resp.error_code:
        return resp.error_code, None
    return 0, resp.topics[0].partitions[0]


async def elect(cl: NodeClient, election_type: int, wanted: dict[str, list[int]] | None, version: int = 2):
    tps = None if wanted is None else [EL.TopicPartitions(t, ps) for t, ps in wanted.items()]
    resp = await cl.request(EL(election_type=election_type, topic_partitions=tps, timeout_ms=1000), version)
    results = {
        (t.topic, r.partition_id): (r.error_code, r.error_message)
        for t in resp.replica_election_results
        for r in t.partition_result
    }
    return resp.error_code, results


async def reassign(cl: NodeClient, moves: dict[tuple[str, int], list[int] | None]):
    topics: dict[str, list] = {}
    for (name, index), replicas in moves.items():
        topics.setdefault(name, []).append(APR.ReassignablePartition(index, replicas))
    resp = await cl.request(APR(topics=[APR.ReassignableTopic(n, ps) for n, ps in topics.items()]))
    assert resp.error_code == 0
    return {(t.name, p.partition_index): (p.error_code, p.error_message) for t in resp.responses for p in t.partitions}


async def list_reassignments(cl: NodeClient, wanted: dict[str, list[int]] | None = None):
    topics = None if wanted is None else [LPR.ListPartitionReassignmentsTopics(n, ps) for n, ps in wanted.items()]
    resp = await cl.request(LPR(topics=topics))
    assert resp.error_code == 0
    return {
        (t.name, p.partition_index): (tuple(p.replicas), tuple(p.adding_replicas), tuple(p.removing_replicas))
        for t in resp.topics
        for p in t.partitions
    }


def changes(entries) -> list:
    return [r for _, _, r in entries if type(r).__name__ == "PartitionChangeRecord"]


async def wait_image(cl: NodeClient, pred, timeout: float = 10.0) -> MetadataImage:
    deadline = time.monotonic() + timeout
    while True:
        img = await image(cl)
        if pred(img):
            return img
        if time.monotonic() > deadline:
            raise AssertionError("the metadata never reached the expected state")
        await asyncio.sleep(0.05)


# ================================================================ AlterPartition
def test_alter_partition_changes_isr_and_rejects_like_kafka(controllers):
    c = controllers(broker_session_timeout_ms=LONG_SESSION).start()

    async def main():
        cl = await connect(c)
        for key, (lo, hi) in {43: (0, 2), 45: (0, 0), 46: (0, 0), 56: (0, 3), 67: (0, 0)}.items():
            assert cl.versions[key] == (lo, hi), key
        ep = await start_brokers(cl, {1: None, 2: None, 3: None, 4: None})
        await create(cl, topic("t", assignments=[[1, 2, 3], [2, 3, 1]]))
        p = await part(cl, "t")
        assert (p.leader, p.isr, p.leader_epoch, p.partition_epoch) == (1, (1, 2, 3), 0, 0)

        # shrink (v3, names the ISR with broker epochs), then expand back (v0, by topic name)
        before = await log_end(cl)
        err, r = await alter_isr(cl, 1, ep[1], p, [1, 2], isr_epochs={1: ep[1], 2: ep[2]})
        assert err == 0 and r.error_code == 0
        assert (r.leader_id, r.leader_epoch, list(r.isr), r.partition_epoch) == (1, 0, [1, 2], 1)
        recs = changes(await read_log(cl, before))
        assert len(recs) == 1 and recs[0].isr == [1, 2] and recs[0].leader == -2  # no leader epoch bump
        p = await part(cl, "t")
        assert (p.isr, p.leader_epoch, p.partition_epoch) == ((1, 2), 0, 1)
        err, r = await alter_isr(cl, 1, ep[1], p, [1, 2, 3], version=0, name="t")
        assert (err, r.error_code, list(r.isr), r.partition_epoch) == (0, 0, [1, 2, 3], 2)
        p = await part(cl, "t")
        assert (p.isr, p.leader, p.leader_epoch, p.partition_epoch) == ((1, 2, 3), 1, 0, 2)
        # v2: by topic id, plain ISR; the same ISR again is accepted and changes nothing
        end = await log_end(cl)
        err, r = await alter_isr(cl, 1, ep[1], p, [1, 2, 3], version=2)
        assert (err, r.error_code, r.partition_epoch) == (0, 0, 2)
        assert await log_end(cl) == end

        # rejections: nothing is written for any of them
        end = await log_end(cl)
        assert (await alter_isr(cl, 1, ep[1] + 1, p, [1, 2]))[0] == Errors.STALE_BROKER_EPOCH
        assert (await alter_isr(cl, 9, 0, p, [1, 2]))[0] == Errors.STALE_BROKER_EPOCH
        cases = [
            (dict(leader_epoch=-1), Errors.FENCED_LEADER_EPOCH),
            (dict(leader_epoch=1), Errors.NOT_CONTROLLER),  # newer than the controller's
            (dict(partition_epoch=1), Errors.INVALID_UPDATE_VERSION),
            (dict(partition_epoch=3), Errors.NOT_CONTROLLER),
            (dict(isr=[2, 3]), Errors.INVALID_REQUEST),  # the leader left out
            (dict(isr=[1, 4]), Errors.INVALID_REQUEST),  # 4 is no replica
            (dict(isr=[1, 2, 2]), Errors.INVALID_REQUEST),
            (dict(isr=[1, 2], isr_epochs={2: ep[2] + 5}), Errors.INELIGIBLE_REPLICA),  # 2's epoch is another
            (dict(isr=[1, 2], version=1, name="t", recovery=1), Errors.INVALID_REQUEST),
            (dict(broker=2), Errors.INVALID_REQUEST),  # not the leader (Kafka's code for it)
        ]
        for kw, code in cases:
            isr = kw.pop("isr", [1, 2])
            broker = kw.pop("broker", 1)
            err, r = await alter_isr(cl, broker, ep[broker], p, isr, **kw)
            assert err == 0 and r.error_code == code, (kw, r)
        # unknown topics and partitions
        ghost = PartitionInfo(p.topic_id, 7, (1,), (1,), 1, 0, 0)
        assert (await alter_isr(cl, 1, ep[1], ghost, [1]))[1].error_code == Errors.UNKNOWN_TOPIC_OR_PARTITION
        stranger = PartitionInfo(uuid.UUID(int=12345), 0, (1,), (1,), 1, 0, 0)
        assert (await alter_isr(cl, 1, ep[1], stranger, [1]))[1].error_code == Errors.UNKNOWN_TOPIC_ID
        err, r = await alter_isr(cl, 1, ep[1], p, [1], version=1, name="nope")
        assert r.error_code == Errors.UNKNOWN_TOPIC_OR_PARTITION
        assert await log_end(cl) == end

        # a fenced broker, and one in controlled shutdown, cannot join an ISR
        assert (await heartbeat(cl, 3, ep[3], 10**9, want_fence=True)).is_fenced
        p, t1 = await part(cl, "t"), await part(cl, "t", 1)
        assert p.isr == (1, 2) and (t1.leader, t1.isr) == (2, (2, 1))
        err, r = await alter_isr(cl, 1, ep[1], p, [1, 2, 3])
        assert r.error_code == Errors.INELIGIBLE_REPLICA
        err, r = await alter_isr(cl, 1, ep[1], p, [1, 2, 3], version=1, name="t")
        assert r.error_code == Errors.OPERATION_NOT_ATTEMPTED  # the pre-v2 code
        assert not (await heartbeat(cl, 4, ep[4], 10**9, want_shut_down=True)).should_shut_down
        await create(cl, topic("w", assignments=[[1, 4]]))  # 4 is shutting down: ISR [1]
        w = await part(cl, "w")
        assert (w.leader, w.isr) == (1, (1,))
        assert (await alter_isr(cl, 1, ep[1], w, [1, 4]))[1].error_code == Errors.INELIGIBLE_REPLICA
        # broker 3 comes back and is let in again
        assert not (await heartbeat(cl, 3, ep[3], 10**9)).is_fenced
        err, r = await alter_isr(cl, 1, ep[1], p, [1, 2, 3])
        assert r.error_code == 0 and list(r.isr) == [1, 2, 3]
        assert (await part(cl, "t")).leader_epoch == 0  # the leader never changed
        await cl.close()

    run(main())


# ================================================================ elections on fencing
def test_fencing_moves_leaders_in_replica_order_and_offline_partitions_return(controllers):
    c = controllers(broker_session_timeout_ms=1000).start()

    async def main():
        cl = await connect(c)
        ep = await start_brokers(cl, {1: None, 2: None, 3: None})
        await create(
            cl,
            topic("a", assignments=[[3, 2, 1]]),
            topic("b", assignments=[[2, 3]]),
            topic("u", assignments=[[2, 3]], configs={"unclean.leader.election.enable": "true"}),
        )
        alive = {1, 2, 3}
        stop = asyncio.Event()
        hb = await connect(c)

        async def keep_alive():
            while not stop.is_set():
                for b in sorted(alive):
                    await heartbeat(hb, b, ep[b], 10**9)
                await asyncio.sleep(0.15)

        task = asyncio.ensure_future(keep_alive())
        # b and u: broker 3 falls out of the ISR so that only 2 is in sync
        for name in ("b", "u"):
            p = await part(cl, name)
            assert (await alter_isr(cl, 2, ep[2], p, [2]))[1].error_code == 0

        # broker 3 (leader of a) goes silent: the next replica in assignment order that is in the
        # ISR and alive leads (2, not 1), with a new leader epoch
        alive.discard(3)
        img = await wait_image(cl, lambda i: i.brokers[3].fenced)
        a = img.partition("a", 0)
        assert (a.leader, a.isr, a.leader_epoch) == (2, (2, 1), 1)
        assert img.partition("b", 0).leader == 2 and img.partition("u", 0).leader == 2

        # broker 2 goes silent too: a moves to 1; b and u have no live in-sync replica, so they
        # go offline and keep their last ISR member
        alive.discard(2)
        img = await wait_image(cl, lambda i: i.brokers[2].fenced)
        a, b, u = (img.partition(n, 0) for n in "abu")
        assert (a.leader, a.isr, a.leader_epoch) == (1, (1,), 2)
        assert (b.leader, b.isr) == (-1, (2,)) and (u.leader, u.isr) == (-1, (2,))

        # broker 3 returns: it is not in b's ISR, so b stays offline; u allows an unclean
        # election, so 3 leads it alone
        alive.add(3)
        img = await wait_image(cl, lambda i: not i.brokers[3].fenced)
        b, u = img.partition("b", 0), img.partition("u", 0)
        assert (b.leader, b.isr) == (-1, (2,))
        assert (u.leader, u.isr) == (3, (3,))
        # broker 2, the last member of b's ISR, returns and leads b again
        alive.add(2)
        img = await wait_image(cl, lambda i: not i.brokers[2].fenced)
        b = img.partition("b", 0)
        assert (b.leader, b.isr, b.leader_epoch) == (2, (2,), 2)
        assert img.partition("a", 0).leader == 1  # a leader that is fine stays put
        stop.set()
        await task
        await hb.close()
        await cl.close()

    run(main())


# ================================================================ ElectLeaders
def test_elect_leaders_preferred_and_unclean(controllers):
    c = controllers(broker_session_timeout_ms=LONG_SESSION).start()

    async def main():
        cl = await connect(c)
        ep = await start_brokers(cl, {1: None, 2: None, 3: None})
        await create(
            cl,
            topic("p", assignments=[[1, 2, 3], [2, 3, 1]]),
            topic("x", assignments=[[1, 2]]),
            topic("y", assignments=[[2]]),
        )
        # broker 1 is fenced and comes back: p-0 is led by 2, and 1 is not in sync yet
        assert (await heartbeat(cl, 1, ep[1], 10**9, want_fence=True)).is_fenced
        assert not (await heartbeat(cl, 1, ep[1], 10**9)).is_fenced
        p0 = await part(cl, "p")
        assert (p0.leader, p0.isr) == (2, (2, 3))

        err, res = await elect(cl, 0, {"p": [0, 1, 9], "nope": [0]})
        assert err == 0
        assert res[("p", 0)][0] == Errors.PREFERRED_LEADER_NOT_AVAILABLE and "not in the ISR" in res[("p", 0)][1]
        assert res[("p", 1)][0] == Errors.ELECTION_NOT_NEEDED
        assert res[("p", 9)][0] == Errors.UNKNOWN_TOPIC_OR_PARTITION
        assert res[("nope", 0)][0] == Errors.UNKNOWN_TOPIC_OR_PARTITION
        # every partition (v0: null list, no election type): only those needing one are listed
        err, res = await elect(cl, 0, None, version=0)
        assert set(res) == {("p", 0), ("x", 0)}

        # 1 catches up; the preferred election makes it leader again, with a new leader epoch
        assert (await alter_isr(cl, 2, ep[2], p0, [2, 3, 1]))[1].error_code == 0
        err, res = await elect(cl, 0, {"p": [0]}, version=1)
        assert res == {("p", 0): (0, None)}
        p0 = await part(cl, "p")
        assert (p0.leader, p0.isr, p0.leader_epoch) == (1, (2, 3, 1), 2)
        assert (await elect(cl, 0, {"p": [0]}))[1][("p", 0)][0] == Errors.ELECTION_NOT_NEEDED

        # unclean: x loses both replicas (ISR keeps 2); 1 returns but is not in sync
        for b in (1, 2):
            assert (await heartbeat(cl, b, ep[b], 10**9, want_fence=True)).is_fenced
        assert not (await heartbeat(cl, 1, ep[1], 10**9)).is_fenced
        x = await part(cl, "x")
        assert (x.leader, x.isr) == (-1, (2,))
        assert (await elect(cl, 0, {"x": [0]}))[1][("x", 0)][0] == Errors.PREFERRED_LEADER_NOT_AVAILABLE
        err, res = await elect(cl, 1, {"x": [0], "y": [0], "p": [1]})
        assert res[("x", 0)] == (0, None)
        assert res[("y", 0)][0] == Errors.ELIGIBLE_LEADERS_NOT_AVAILABLE  # its only replica is fenced
        assert res[("p", 1)][0] == Errors.ELECTION_NOT_NEEDED  # it has a leader
        x = await part(cl, "x")
        assert (x.leader, x.isr) == (1, (1,))
        err, res = await elect(cl, 7, {"x": [0]})
        assert err == Errors.INVALID_REQUEST and res == {}
        await cl.close()

    run(main())


def test_auto_leader_rebalance_moves_leaders_back(controllers):
    c = controllers(broker_session_timeout_ms=LONG_SESSION, leader_imbalance_check_interval_seconds=1).start()

    async def main():
        cl = await connect(c)
        ep = await start_brokers(cl, {1: None, 2: None})
        await create(cl, topic("r", assignments=[[1, 2], [1, 2]]))
        assert (await heartbeat(cl, 1, ep[1], 10**9, want_fence=True)).is_fenced
        assert not (await heartbeat(cl, 1, ep[1], 10**9)).is_fenced
        img = await image(cl)
        assert all(p.leader == 2 for p in img.topic("r").partitions.values())
        # not in sync yet: the rebalance leaves the partitions alone
        await asyncio.sleep(1.5)
        assert all(p.leader == 2 for p in (await image(cl)).topic("r").partitions.values())
        p1 = await part(cl, "r", 1)
        assert (await alter_isr(cl, 2, ep[2], p1, [2, 1]))[1].error_code == 0
        img = await wait_image(cl, lambda i: i.partition("r", 1).leader == 1, timeout=5)
        assert img.partition("r", 0).leader == 2
        await cl.close()

    run(main())


# ================================================================ reassignment
def test_reassignment_start_complete_cancel_list_and_restart(controllers):
    c = controllers(broker_session_timeout_ms=LONG_SESSION).start()

    async def main():
        cl = await connect(c)
        ep = await start_brokers(cl, {b: None for b in range(1, 7)})
        await create(
            cl,
            topic("r", assignments=[[1, 2, 3]] * 4),
            topic("c", assignments=[[1, 2, 3]]),
        )
        before = await log_end(cl)
        res = await reassign(
            cl,
            {
                ("r", 0): [4, 5, 6],  # all new
                ("r", 1): [2, 3, 4],  # the leader (1) leaves
                ("r", 2): [3, 2, 1],  # a reorder: done at once
                ("r", 3): [1, 2],  # only removes: done at once
                ("r", 9): [1],
                ("nope", 0): [1],
                ("c", 0): None,  # nothing to cancel
            },
        )
        assert res[("r", 0)] == (0, None) and res[("r", 1)] == (0, None)
        assert res[("r", 2)] == (0, None) and res[("r", 3)] == (0, None)
        assert res[("r", 9)][0] == Errors.UNKNOWN_TOPIC_OR_PARTITION
        assert res[("nope", 0)][0] == Errors.UNKNOWN_TOPIC_OR_PARTITION
        assert res[("c", 0)][0] == Errors.NO_REASSIGNMENT_IN_PROGRESS
        entries = await read_log(cl, before)
        assert len({base for base, _, _ in entries}) == 1  # one request, one batch
        by_part = {r.partition_id: r for r in changes(entries)}
        r0, r1 = by_part[0], by_part[1]
        assert (r0.replicas, r0.adding_replicas, r0.removing_replicas) == ([4, 5, 6, 1, 2, 3], [4, 5, 6], [1, 2, 3])
        assert r0.isr is None and r0.leader == -2 and len(r0.directories) == 6
        assert (r1.replicas, r1.adding_replicas, r1.removing_replicas) == ([2, 3, 4, 1], [4], [1])
        # a reorder keeps the leader (no leader field); a shrink names the current leader again,
        # Kafka's way of fencing the dropped replica with a new leader epoch
        assert (by_part[2].replicas, by_part[2].leader) == ([3, 2, 1], -2)
        assert (by_part[3].replicas, by_part[3].isr, by_part[3].leader) == ([1, 2], [1, 2], 1)
        img = await image(cl)
        assert [img.partition("r", i).replicas for i in range(4)] == [
            (4, 5, 6, 1, 2, 3),
            (2, 3, 4, 1),
            (3, 2, 1),
            (1, 2),
        ]
        r3 = img.partition("r", 3)
        assert (r3.isr, r3.removing_replicas, r3.adding_replicas) == ((1, 2), (), ())
        assert img.partition("r", 2).leader == 1  # a reorder does not move leadership

        bad = await reassign(cl, {("r", 2): [1, 1], ("r", 3): [1, 9], ("c", 0): []})
        assert all(code == Errors.INVALID_REPLICA_ASSIGNMENT for code, _ in bad.values()), bad
        assert "more than once" in bad[("r", 2)][1] and "broker 9" in bad[("r", 3)][1]

        ongoing = {("r", 0): ((4, 5, 6, 1, 2, 3), (4, 5, 6), (1, 2, 3)), ("r", 1): ((2, 3, 4, 1), (4,), (1,))}
        assert await list_reassignments(cl) == ongoing
        assert await list_reassignments(cl, {"r": [0, 2, 9], "nope": [0]}) == {("r", 0): ongoing[("r", 0)]}

        # the leader adds the new replicas as they catch up; the last one completes the move,
        # and since the leader (1) is not a target replica, leadership moves to 4
        p = await part(cl, "r", 0)
        for isr in ([1, 2, 3, 4], [1, 2, 3, 4, 5]):
            err, r = await alter_isr(cl, 1, ep[1], p, isr)
            assert r.error_code == 0 and list(r.isr) == isr
            p = await part(cl, "r", 0)
        assert p.adding_replicas == (4, 5, 6)
        before = await log_end(cl)
        err, r = await alter_isr(cl, 1, ep[1], p, [1, 2, 3, 4, 5, 6])
        assert r.error_code == Errors.NEW_LEADER_ELECTED
        (done,) = changes(await read_log(cl, before))
        assert (done.replicas, done.isr, done.leader, done.adding_replicas, done.removing_replicas) == (
            [4, 5, 6],
            [4, 5, 6],
            4,
            [],
            [],
        )
        p = await part(cl, "r", 0)
        assert (p.replicas, p.isr, p.leader, p.leader_epoch) == ((4, 5, 6), (4, 5, 6), 4, 1)
        assert await list_reassignments(cl) == {("r", 1): ongoing[("r", 1)]}
        await cl.close()

    run(main())
    assert c.restart() == 0  # the ongoing reassignment is in the log: it survives

    async def after():
        cl = await connect(c)
        assert await list_reassignments(cl) == {("r", 1): ((2, 3, 4, 1), (4,), (1,))}
        ep = {b.id: b.epoch for b in (await image(cl)).brokers.values()}
        p = await part(cl, "r", 1)
        # v1 (by name) answers a leadership move with FENCED_LEADER_EPOCH
        err, r = await alter_isr(cl, 1, ep[1], p, [1, 2, 3, 4], version=1, name="r")
        assert r.error_code == Errors.FENCED_LEADER_EPOCH
        p = await part(cl, "r", 1)
        assert (p.replicas, p.isr, p.leader, p.adding_replicas, p.removing_replicas) == (
            (2, 3, 4),
            (2, 3, 4),
            2,
            (),
            (),
        )
        assert await list_reassignments(cl) == {}

        # cancel: the replicas being added leave again, the original set is restored
        assert (await reassign(cl, {("c", 0): [4, 5, 6]}))[("c", 0)] == (0, None)
        p = await part(cl, "c")
        assert (await alter_isr(cl, 1, ep[1], p, [1, 2, 3, 4]))[1].error_code == 0
        assert (await reassign(cl, {("c", 0): None}))[("c", 0)] == (0, None)
        p = await part(cl, "c")
        assert (p.replicas, p.isr, p.leader, p.adding_replicas, p.removing_replicas) == (
            (1, 2, 3),
            (1, 2, 3),
            1,
            (),
            (),
        )
        assert (await reassign(cl, {("c", 0): None}))[("c", 0)][0] == Errors.NO_REASSIGNMENT_IN_PROGRESS
        await cl.close()

    run(after())


def test_cancel_that_needs_an_unclean_election(controllers):
    c = controllers(broker_session_timeout_ms=LONG_SESSION).start()

    async def main():
        cl = await connect(c)
        ep = await start_brokers(cl, {1: None, 2: None, 3: None})
        await create(
            cl,
            topic("k", assignments=[[1]]),
            topic("ku", assignments=[[1]], configs={"unclean.leader.election.enable": "true"}),
        )
        for name in ("k", "ku"):
            assert (await reassign(cl, {(name, 0): [2, 3]}))[(name, 0)] == (0, None)
            p = await part(cl, name)
            assert (await alter_isr(cl, 1, ep[1], p, [1, 2]))[1].error_code == 0
        # the only original replica is fenced: the ISR is [2], a replica being added
        assert (await heartbeat(cl, 1, ep[1], 10**9, want_fence=True)).is_fenced
        k = await part(cl, "k")
        assert (k.leader, k.isr, k.replicas) == (2, (2,), (2, 3, 1))
        res = await reassign(cl, {("k", 0): None, ("ku", 0): None})
        assert res[("k", 0)][0] == Errors.INVALID_REPLICA_ASSIGNMENT and "unclean" in res[("k", 0)][1]
        assert res[("ku", 0)] == (0, None)
        ku = await part(cl, "ku")
        # reverted to [1]; 1 is fenced, so the partition waits offline with 1 as its ISR
        assert (ku.replicas, ku.isr, ku.leader, ku.adding_replicas) == ((1,), (1,), -1, ())
        assert (await part(cl, "k")).adding_replicas == (2, 3)
        await cl.close()

    run(main())


# ================================================================ producer ids
def test_allocate_producer_ids_blocks_are_disjoint_across_restarts(controllers):
    c = controllers(
        broker_session_timeout_ms=LONG_SESSION, metadata_log_max_record_bytes_between_snapshots=3000
    ).start()
    blocks: list[tuple[int, int]] = []

    async def allocate(cl, broker, epoch):
        r = await cl.request(AllocateProducerIdsRequest(broker_id=broker, broker_epoch=epoch))
        if r.error_code == 0:
            blocks.append((r.producer_id_start, r.producer_id_len))
        return r

    async def first():
        cl = await connect(c)
        ep = await start_brokers(cl, {1: None, 2: None})
        before = await log_end(cl)
        r = await allocate(cl, 1, ep[1])
        assert (r.error_code, r.producer_id_start, r.producer_id_len) == (0, 0, 1000)
        (rec,) = [r for _, _, r in await read_log(cl, before)]
        assert (type(rec).__name__, rec.broker_id, rec.broker_epoch, rec.next_producer_id) == (
            "ProducerIdsRecord",
            1,
            ep[1],
            1000,
        )
        for i in range(60):
            b = 1 + i % 2
            r = await allocate(cl, b, ep[b])
            assert (r.error_code, r.producer_id_len) == (0, 1000)
        assert (await allocate(cl, 1, ep[1] + 1)).error_code == Errors.STALE_BROKER_EPOCH
        assert (await allocate(cl, 7, 0)).error_code == Errors.STALE_BROKER_EPOCH
        deadline = time.monotonic() + 10
        while not list(c.segment_dir.glob("*.checkpoint")):
            assert time.monotonic() < deadline, "no snapshot was taken"
            await asyncio.sleep(0.05)
        await cl.close()
        return ep

    ep = run(first())
    for sig in (signal.SIGTERM, signal.SIGKILL):
        c.restart(sig)

        async def more():
            cl = await connect(c)
            for b in (1, 2):
                assert (await allocate(cl, b, ep[b])).error_code == 0
            await cl.close()

        run(more())
    starts = [s for s, _ in blocks]
    assert starts == [1000 * i for i in range(len(blocks))], starts  # contiguous, never reused


# ================================================================ throttles
def test_replication_throttle_configs_are_accepted(controllers):
    c = controllers(broker_session_timeout_ms=LONG_SESSION).start()

    async def main():
        cl = await connect(c)
        await start_brokers(cl, {1: None, 2: None})
        await create(cl, topic("th", assignments=[[1, 2], [2, 1]]))
        rate = "10485760"
        resp = await cl.request(
            IA(
                resources=[
                    IA.AlterConfigsResource(
                        4,
                        "",
                        [
                            IA.AlterableConfig("leader.replication.throttled.rate", 0, rate),
                            IA.AlterableConfig("follower.replication.throttled.rate", 0, rate),
                        ],
                    ),
                    IA.AlterConfigsResource(4, "2", [IA.AlterableConfig("leader.replication.throttled.rate", 0, "1")]),
                    IA.AlterConfigsResource(
                        2,
                        "th",
                        [
                            IA.AlterableConfig(THR_LEADER, 0, "0:1,1:2"),
                            IA.AlterableConfig(THR_FOLLOWER, 0, "*"),
                        ],
                    ),
                ]
            )
        )
        assert [r.error_code for r in resp.responses] == [0, 0, 0], resp
        # APPEND to the list, as kafka-reassign-partitions.sh does
        resp = await cl.request(
            IA(resources=[IA.AlterConfigsResource(2, "th", [IA.AlterableConfig(THR_LEADER, 2, "0:2")])])
        )
        assert resp.responses[0].error_code == 0
        # bad values are refused
        for rtype, name, key, value in [
            (4, "", "leader.replication.throttled.rate", "-5"),
            (4, "1", "follower.replication.throttled.rate", "fast"),
            (2, "th", THR_FOLLOWER, "x"),
        ]:
            resp = await cl.request(
                IA(resources=[IA.AlterConfigsResource(rtype, name, [IA.AlterableConfig(key, 0, value)])])
            )
            assert resp.responses[0].error_code == Errors.INVALID_CONFIG, (key, value)
        img = await image(cl)
        assert img.configs[(4, "")] == {
            "leader.replication.throttled.rate": rate,
            "follower.replication.throttled.rate": rate,
        }
        assert img.configs[(4, "2")] == {"leader.replication.throttled.rate": "1"}
        assert img.topic_config("th") == {THR_LEADER: "0:1,1:2,0:2", THR_FOLLOWER: "*"}
        await cl.close()

    run(main())
