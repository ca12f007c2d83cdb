"""The voter set's bookkeeping (KIP-853), built without processes: KRAFT_VOTERS records in and out
of record batches, the history a replica keeps by offset (truncation brings an older set back, a
snapshot replaces it), and the leader's majorities as the set changes under it."""

from __future__ import annotations

import uuid

from controller.raft.leader_state import LeaderState
from metadata.voters import Voter, VoterHistory, static_voters, voter_sets_in, voters_batch, voters_record
from protocol.records import encode_batch
from protocol.records.codec import Record


def voters(*ids: int) -> dict[int, Voter]:
    return {i: Voter(i, uuid.UUID(int=i), (("CONTROLLER", "127.0.0.1", 9000 + i),)) for i in ids}


def test_voters_records_are_found_in_control_batches_only() -> None:
    data = (encode_batch([Record(value=b"x")] * 3, base_offset=0, partition_leader_epoch=1)
            + encode_batch([voters_record(voters(1, 2), 5)], base_offset=3, partition_leader_epoch=1, control=True)
            + voters_batch(voters(1, 2, 3), 1, 6, base_offset=4))
    assert voter_sets_in(data) == [(3, voters(1, 2)), (4, voters(1, 2, 3))]
    assert voter_sets_in(data[:-5]) == [(3, voters(1, 2))]  # a partial tail batch is not read


def test_history_follows_appends_truncations_and_snapshots() -> None:
    h = VoterHistory()
    assert h.dynamic and h.latest() == {} and h.latest_offset() == -1
    h.reset(0, voters(1))  # the bootstrap snapshot
    assert h.latest() == voters(1) and h.latest_offset() == -1
    h.add(10, voters(1, 2))
    h.add(20, voters(1, 2, 3))
    assert h.latest() == voters(1, 2, 3) and h.at(20) == voters(1, 2) and h.at(21) == voters(1, 2, 3)
    h.truncate_from(15)  # the leader's log diverged: the uncommitted set is gone
    assert h.latest() == voters(1, 2) and h.latest_offset() == 10
    h.add(12, voters(2))
    h.add(12, voters(2, 4))  # the same offset again (after a truncation): replaces
    assert h.latest() == voters(2, 4)
    h.reset(100, voters(5))
    assert h.latest() == voters(5) and h.at(50) == {}
    static = VoterHistory(static_voters({1: ("h", 1)}, "CONTROLLER"))
    static.add(5, voters(7))  # a static set never changes
    assert not static.dynamic and list(static.latest()) == [1]


def test_leader_counts_majorities_by_the_set_in_force() -> None:
    ls = LeaderState(1, [1, 2, 3], epoch=1, epoch_start=0, now_mono=0.0)
    ls.record_fetch(2, 10, 10)
    assert ls.high_watermark(10, 0) == 10  # 1 and 2 of 3
    ls.record_fetch(4, 10, 10)  # an observer
    ls.set_voters([1, 2, 3, 4, 5], 0.0)  # 4 joins with its progress, 5 has none: 3 of 5 at 10
    ls.record_fetch(2, 20, 20)
    assert ls.high_watermark(20, 10) == 10
    ls.record_fetch(4, 20, 20)
    assert ls.high_watermark(20, 10) == 20
    ls.set_voters([2, 3, 4], 0.0)  # the leader removes itself: it leads, uncounted
    assert not ls.leader_votes and 1 not in ls.progress and ls.voter_count == 3
    ls.record_fetch(2, 30, 30)
    assert ls.high_watermark(40, 20) == 20  # 2 at 30, 4 at 20, 3 unknown: only 20 has two of three
    ls.record_fetch(3, 35, 40)
    assert ls.high_watermark(40, 20) == 30
