"""The quorum's pure decisions and the metadata log's Raft operations, in process (no sockets):
the high watermark, the election restriction, the leader-epoch cache, a follower's append of the
leader's batches, truncation on divergence, a reset to a snapshot, and the quorum-state file."""

from __future__ import annotations

import asyncio
import json

import pytest

from controller.metadata_log import EpochCache, MetadataLog
from controller.raft import rules
from controller.raft.leader_state import LeaderState
from controller.raft.quorum_state import ElectionState, QuorumStateError, QuorumStateFile
from protocol.errors import ProtocolError
from protocol.generated.metadata_records.no_op_record import NoOpRecord
from protocol.records import decode_batches


def test_high_watermark_needs_a_majority_and_the_leaders_epoch():
    # 3 voters: the 2nd largest end offset is committed
    assert rules.high_watermark([10, 7, 3], 3, epoch_start=5, current=0) == 7
    # not past the leader's first offset: nothing of its epoch committed yet, it stays
    assert rules.high_watermark([10, 5, 3], 3, epoch_start=5, current=4) == 4
    # unknown followers (-1) count as nothing; 5 voters need 3
    assert rules.high_watermark([10, 9, -1, -1, -1], 5, epoch_start=0, current=0) == 0
    assert rules.high_watermark([10, 9, 8, -1, -1], 5, epoch_start=0, current=0) == 8
    # never backwards
    assert rules.high_watermark([10, 2, 1], 3, epoch_start=0, current=6) == 6
    # a single voter commits what it wrote
    assert rules.high_watermark([4], 1, epoch_start=3, current=3) == 4


def test_vote_goes_to_a_log_at_least_as_long():
    assert rules.log_at_least_as_long(3, 10, 3, 10)
    assert rules.log_at_least_as_long(4, 1, 3, 10)  # a later last epoch wins whatever the length
    assert not rules.log_at_least_as_long(2, 100, 3, 10)
    assert not rules.log_at_least_as_long(3, 9, 3, 10)
    assert rules.majority(1) == 1 and rules.majority(3) == 2 and rules.majority(5) == 3


def test_leader_state_tracks_voters_and_observers():
    s = LeaderState(1, [1, 2, 3], epoch=4, epoch_start=10, now_mono=100.0)
    assert s.is_voter(2) and not s.is_voter(1) and not s.is_voter(7)
    assert s.high_watermark(11, current=9) == 9  # nobody else has the leader's first record yet
    s.record_fetch(7, 5, 11)  # a broker: an observer, never counted for commits
    assert s.high_watermark(11, current=9) == 9 and list(s.observers) == [7]
    s.record_fetch(3, 11, 11)
    assert s.high_watermark(11, current=9) == 11 and s.fetched(3) and not s.fetched(2)
    assert s.by_progress() == [3, 2]
    # check-quorum: voter 2 never fetched; the leader and voter 3 are a majority while 3 fetches
    last = s.progress[3].last_fetch_mono
    assert s.heard_from_majority(last + 1.0, within=1.5)
    assert not s.heard_from_majority(last + 2.0, within=1.5)
    view = s.view([1, 2, 3], 11, 11)
    assert [(v, p.end_offset) for v, p in view.voters] == [(1, 11), (2, -1), (3, 11)]
    assert [o for o, _ in view.observers] == [7] and view.leader_id == 1 and view.epoch == 4


def test_election_timeouts_are_random_within_one_to_two_timeouts():
    import random

    rng = random.Random(1)
    got = [rules.election_timeout(1000, rng) for _ in range(200)]
    assert all(1.0 <= t < 2.0 for t in got) and len(set(got)) == 200
    assert rules.successor_delay(0, 1000, rng) < 0.25 <= rules.successor_delay(1, 1000, rng)


def test_epoch_cache_answers_where_an_epoch_ends():
    c = EpochCache()
    for epoch, start in [(1, 0), (1, 5), (3, 10), (4, 20)]:
        c.assign(epoch, start)
    assert c.entries == [(1, 0), (3, 10), (4, 20)]
    assert c.end_offset_for(1, 30) == (1, 10)
    assert c.end_offset_for(2, 30) == (1, 10)  # no epoch 2 here: the largest below it
    assert c.end_offset_for(4, 30) == (4, 30)
    assert c.end_offset_for(0, 30) == (-1, -1)
    assert (c.epoch_at(9), c.epoch_at(10), c.epoch_at(25), c.last_epoch()) == (1, 3, 4, 4)
    c.truncate_from(15)
    assert c.entries == [(1, 0), (3, 10)]


def test_follower_append_truncate_and_reset(tmp_path):
    async def main():
        leader = MetadataLog(tmp_path / "leader")
        leader.open(0)
        for epoch in (1, 1, 2, 2):
            await leader.append([NoOpRecord(), NoOpRecord()], epoch)
        data = await leader.read(0, 1 << 20)

        follower = MetadataLog(tmp_path / "follower")
        follower.open(0)
        assert await follower.append_batches(data) == 8
        assert follower.end_offset_for_epoch(1) == (1, 4) and follower.last_epoch == 2
        with pytest.raises(ProtocolError):  # batches that do not follow on from the log end
            await follower.append_batches(data)
        # a diverged tail is cut at a batch boundary (an offset inside a batch cuts that batch)
        assert await follower.truncate_to(5) == 4
        assert follower.last_epoch == 1 and follower.end_offset == 4
        await follower.append([NoOpRecord()], 3)
        assert follower.end_offset_for_epoch(2) == (1, 4) and follower.end_offset_for_epoch(3) == (3, 5)
        # committed readers stop at the high watermark
        assert [b.base_offset for b in decode_batches(await leader.read(0, 1 << 20, upto=4))] == [0, 2]
        follower.close()

        # reopened, the follower recovers the same log and epochs
        again = MetadataLog(tmp_path / "follower")
        again.open(0)
        assert (again.end_offset, again.epochs.entries) == (5, [(1, 0), (3, 4)])
        # a snapshot replaces the log: it restarts empty at the snapshot's end
        await again.reset(40, 7)
        assert (again.start_offset, again.end_offset, again.last_epoch) == (40, 40, 7)
        await again.append([NoOpRecord()], 8)
        again.close()
        reopened = MetadataLog(tmp_path / "follower")
        assert reopened.open(40, 7)["end_offset"] == 41
        assert reopened.epochs.entries == [(7, 0), (8, 40)]
        reopened.close()
        leader.close()

    asyncio.run(main())


def test_quorum_state_file(tmp_path):
    f = QuorumStateFile(tmp_path, [3, 1, 2])
    assert f.read() == ElectionState()
    f.write(ElectionState(epoch=5, leader_id=-1, voted_id=2))
    doc = json.loads((tmp_path / "quorum-state").read_text())
    assert (doc["leaderEpoch"], doc["votedId"], doc["leaderId"]) == (5, 2, -1)
    assert doc["currentVoters"] == [{"voterId": 1}, {"voterId": 2}, {"voterId": 3}]
    assert f.read() == ElectionState(5, -1, 2)
    (tmp_path / "quorum-state").write_text("{not json")
    with pytest.raises(QuorumStateError):
        f.read()


def test_pre_vote_is_refused_by_a_leader_and_by_a_follower_of_a_live_leader():
    # KIP-996: the leader and a follower answered by its leader within the fetch timeout refuse
    assert not rules.grants_pre_vote(leads=True, hears_live_leader=False, log_up_to_date=True)
    assert not rules.grants_pre_vote(leads=False, hears_live_leader=True, log_up_to_date=True)
    # anyone else grants one to a log at least as long as its own
    assert rules.grants_pre_vote(leads=False, hears_live_leader=False, log_up_to_date=True)
    assert not rules.grants_pre_vote(leads=False, hears_live_leader=False, log_up_to_date=False)
    # a pre-vote is sent in the current epoch, so its last record may be of that epoch; a vote's may not
    assert rules.pre_vote_epoch_valid(True, replica_epoch=4, last_epoch=4)
    assert not rules.pre_vote_epoch_valid(False, replica_epoch=4, last_epoch=4)
    assert rules.pre_vote_epoch_valid(False, replica_epoch=5, last_epoch=4)
    assert not rules.pre_vote_epoch_valid(True, replica_epoch=4, last_epoch=5)
