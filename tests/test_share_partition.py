"""Share-partitions, share sessions and the share coordinator's records in-process (KIP-932):
acquisition and delivery counts, release / reject / accept, archiving at the delivery limit,
lock expiry, acknowledgements of records a member does not hold, the in-flight limit, the state
written and restored, session epochs and idle eviction."""

from __future__ import annotations

import asyncio
import uuid

from broker.coordinator.share.records import ShareState, StateKey, decode_key, decode_value, encode_key, encode_value
from broker.share.partition import (
    ACCEPT,
    ACKNOWLEDGED,
    ARCHIVED,
    AVAILABLE,
    GAP,
    REJECT,
    RELEASE,
    RENEW,
    SharePartition,
)
from broker.share.sessions import ShareSessionCache
from protocol.errors import Errors
from protocol.records import Record, encode_batch
from protocol.records.batch import iter_batches


def batches(first: int, n: int, per_batch: int = 5) -> list:
    """(header, bytes) of record batches holding offsets first .. first + n - 1."""
    out = []
    for base in range(first, first + n, per_batch):
        count = min(per_batch, first + n - base)
        raw = encode_batch([Record(value=b"v%d" % (base + i)) for i in range(count)], base_offset=base)
        out += [(h, memoryview(raw)[pos:pos + h.size]) for pos, h in iter_batches(raw)]
    return out


def share_partition(limit: int = 5, locks: int = 2000, lock_ms: int = 30000) -> SharePartition:
    return SharePartition("g", "t", 0, 0, lock_ms, limit, locks)


def run(coro):
    return asyncio.run(coro)


def test_acquire_release_reject_accept() -> None:
    async def go() -> None:
        sp = share_partition()
        got = sp.acquire("m1", batches(0, 10), 100)
        assert got.ranges == [(0, 9, 1)] and len(got.batches) == 2
        # nothing more to hand out until something is released
        assert sp.next_fetch_offset() == 10 and not sp.acquire("m2", batches(0, 10), 100).ranges
        assert sp.acknowledge("m1", [(0, 2, [ACCEPT]), (3, 3, [RELEASE]), (4, 4, [REJECT]), (5, 9, [ACCEPT])]) == 0
        assert sp.start_offset == 3 and sp.next_fetch_offset() == 3
        again = sp.acquire("m2", batches(0, 10), 100)
        assert again.ranges == [(3, 3, 2)] and len(again.batches) == 1  # the batch holding offset 3
        assert sp.acknowledge("m2", [(3, 3, [ACCEPT])]) == 0
        assert sp.start_offset == 10 and not sp.records
        sp.close()
    run(go())


def test_acknowledging_what_the_member_does_not_hold() -> None:
    async def go() -> None:
        sp = share_partition()
        sp.acquire("m1", batches(0, 4), 100)
        assert sp.acknowledge("m2", [(0, 0, [ACCEPT])]) == Errors.INVALID_RECORD_STATE
        assert sp.acknowledge("m1", [(0, 7, [ACCEPT])]) == Errors.INVALID_RECORD_STATE  # 4-7 never acquired
        assert sp.acknowledge("m1", [(0, 3, [ACCEPT, ACCEPT])]) == Errors.INVALID_REQUEST  # types per offset
        assert sp.acknowledge("m1", [(0, 3, [9])]) == Errors.INVALID_REQUEST
        assert all(r.member_id == "m1" for r in sp.records.values())  # nothing applied
        assert sp.acknowledge("m1", [(0, 1, [ACCEPT, GAP]), (2, 3, [ACCEPT])]) == 0
        assert sp.acknowledge("m1", [(0, 0, [ACCEPT])]) == Errors.INVALID_RECORD_STATE  # already accepted
        sp.close()
    run(go())


def test_delivery_limit_archives() -> None:
    async def go() -> None:
        sp = share_partition(limit=3)
        counts = []
        for _ in range(4):
            got = sp.acquire("m", batches(0, 1), 100)
            counts += [c for _, _, c in got.ranges]
            if got.ranges:
                assert sp.acknowledge("m", [(0, 0, [RELEASE])]) == 0
        assert counts == [1, 2, 3]
        assert sp.start_offset == 1 and not sp.records  # archived: the window moved past it
        sp.close()
    run(go())


def test_lock_expiry_releases_to_another_member() -> None:
    async def go() -> None:
        sp = share_partition(lock_ms=50)
        expired: list[SharePartition] = []
        sp.on_expired = expired.append
        sp.acquire("m1", batches(0, 3), 100)
        waiter = asyncio.get_running_loop().create_future()
        sp.add_waiter(waiter)
        await asyncio.wait_for(waiter, 2)
        assert expired == [sp] and all(r.state == AVAILABLE and r.member_id is None for r in sp.records.values())
        got = sp.acquire("m2", batches(0, 3), 100)
        assert got.ranges == [(0, 2, 2)]
        assert sp.acknowledge("m1", [(0, 0, [ACCEPT])]) == Errors.INVALID_RECORD_STATE
        sp.close()
    run(go())


def test_renew_extends_the_lock() -> None:
    async def go() -> None:
        sp = share_partition(lock_ms=300)
        sp.acquire("m1", batches(0, 2), 100)
        assert sp.acknowledge("m1", [(0, 1, [RENEW])]) == Errors.INVALID_REQUEST  # only where v2 allows it
        await asyncio.sleep(0.2)
        assert sp.acknowledge("m1", [(0, 1, [RENEW])], renew=True) == 0
        await asyncio.sleep(0.2)  # past the first lock, within the renewed one
        assert all(r.member_id == "m1" for r in sp.records.values())
        await asyncio.sleep(0.3)
        assert all(r.state == AVAILABLE for r in sp.records.values())
        sp.close()
    run(go())


def test_in_flight_limit_and_max_records() -> None:
    async def go() -> None:
        sp = share_partition(locks=7)
        got = sp.acquire("m", batches(0, 20), 100)
        assert got.ranges == [(0, 6, 1)]  # no more than 7 records in flight
        sp.acknowledge("m", [(0, 6, [ACCEPT])])
        got = sp.acquire("m", batches(7, 13), 3)  # whole batches, stopping once 3 are taken
        assert got.ranges == [(7, 11, 1)]
        sp.close()
    run(go())


def test_state_written_and_restored() -> None:
    async def go() -> None:
        sp = share_partition()
        sp.acquire("m", batches(0, 10), 100)
        sp.acknowledge("m", [(0, 1, [ACCEPT]), (2, 2, [RELEASE]), (3, 3, [REJECT]), (5, 6, [ACCEPT])])
        start, ranges = sp.snapshot()
        assert start == 2
        # acquired records are written available, with their delivery count
        assert ranges == [(2, 2, 0, 1), (3, 3, 4, 1), (4, 4, 0, 1), (5, 6, 2, 1), (7, 9, 0, 1)]
        key = StateKey("g", uuid.uuid4(), 3)
        state = ShareState(2, 7, start, ranges, 4)
        assert decode_key(encode_key(key)) == key
        assert decode_value(encode_value(state, 123)) == state
        again = share_partition()
        again.restore(start, ranges)
        assert again.start_offset == 2 and again.end_offset == 10
        assert again.records[3].state == ARCHIVED and again.records[5].state == ACKNOWLEDGED
        got = again.acquire("m2", batches(0, 10), 100)
        assert got.ranges == [(2, 2, 2), (4, 4, 2), (7, 9, 2)]
        sp.close()
        again.close()
    run(go())


def test_share_group_records_replay() -> None:
    from broker.coordinator.group.share_records import (
        SHARE_GROUP_METADATA,
        SHARE_GROUP_STATE_PARTITION_METADATA,
        decode_share_key,
        metadata_value,
        partition_metadata_value,
        replay,
        share_key,
    )
    tid = uuid.uuid4()
    groups: dict = {}
    for t, v in ((SHARE_GROUP_METADATA, metadata_value(7)),
                 (SHARE_GROUP_STATE_PARTITION_METADATA, partition_metadata_value({"t": (tid, (0, 1, 2))}))):
        kind, gid = decode_share_key(share_key(t, "g"))  # type: ignore[misc]
        replay(groups, kind, gid, v)
    g = groups["g"]
    assert (g.epoch, g.topics, g.has_metadata) == (7, {"t": (tid, (0, 1, 2))}, True)
    assert decode_share_key(b"\x00\x03\x00\x01g") is None  # a consumer group record
    replay(groups, SHARE_GROUP_METADATA, "g", None)
    assert groups == {}


def test_session_epochs_and_idle_eviction() -> None:
    cache = ShareSessionCache(max_sessions=2, idle_ms=1000)
    assert cache.advance("g", "m", 1) == (Errors.SHARE_SESSION_NOT_FOUND, None)
    err, s, old = cache.open("g", "m")
    assert err == 0 and s is not None and old is None and s.epoch == 1
    assert cache.advance("g", "m", 2)[0] == Errors.INVALID_SHARE_SESSION_EPOCH
    assert cache.advance("g", "m", 1)[0] == 0 and s.epoch == 2
    err, s2, old = cache.open("g", "m")  # epoch 0 again: a new session replaces the old one
    assert old is s and s2 is not None and s2.epoch == 1
    cache.open("g", "m2")
    assert cache.open("g", "m3")[0] == Errors.SHARE_SESSION_LIMIT_REACHED
    assert len(cache.evict_idle(now=s2.last_used + 0.5)) == 0
    assert {x.member_id for x in cache.evict_idle(now=s2.last_used + 10)} == {"m", "m2"}
    assert len(cache) == 0
