"""A share-partition (KIP-932, "Share-partitions"): what one share group has made of one topic
partition, kept by the partition's leader.

The in-flight window runs from the start offset (every record below it is acknowledged or
archived) to the end offset (the next record never acquired yet). Each in-flight record is
available, acquired (by one member, until its acquisition lock expires), acknowledged or
archived, with the number of times it has been delivered. A record becomes acquired when a
ShareFetch hands it out (its delivery count goes up by one); an acknowledgement accepts it
(acknowledged), releases it (available again) or rejects it (archived); a lock that expires
releases it. A release that finds the delivery count at group.share.delivery.count.limit
archives the record instead, so a poison record stops coming back (KIP-932, "Delivery count
and archiving").

Records are tracked one by one; Kafka tracks ranges of a batch together while they share a
state. The window is bounded by group.share.partition.max.record.locks: no new record is
acquired while that many are in flight.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from protocol.errors import Errors

AVAILABLE, ACQUIRED, ACKNOWLEDGED, ARCHIVED = 0, 1, 2, 3
STATE_NAMES = ("Available", "Acquired", "Acknowledged", "Archived")
# the delivery states as the share coordinator keeps them (Kafka's RecordState ids)
PERSISTED_AVAILABLE, PERSISTED_ACKNOWLEDGED, PERSISTED_ARCHIVED = 0, 2, 4
# the acknowledge types of ShareFetch / ShareAcknowledge
GAP, ACCEPT, RELEASE, REJECT, RENEW = 0, 1, 2, 3, 4


class BatchBounds(Protocol):
    """What acquiring needs of a batch: a BatchHeader read here, or the bounds another broker
    read (a diskless partition's share session served elsewhere, broker/share/forward.py)."""

    @property
    def base_offset(self) -> int: ...

    @property
    def last_offset(self) -> int: ...

    @property
    def is_control(self) -> bool: ...


@dataclass(slots=True)
class InFlightRecord:
    state: int
    delivery_count: int
    member_id: str | None
    lock: int  # which acquisition holds it: its lock timer releases only what it acquired


@dataclass(slots=True)
class Acquired:
    """What one acquisition handed to a member: the batches to send and the offset ranges (first,
    last, delivery count) the member may process."""

    batches: list
    ranges: list[tuple[int, int, int]]

    @property
    def count(self) -> int:
        return sum(last - first + 1 for first, last, _ in self.ranges)


class SharePartition:
    def __init__(self, group_id: str, topic: str, index: int, start_offset: int, lock_duration_ms: int,
                 delivery_count_limit: int, max_record_locks: int) -> None:
        self.group_id = group_id
        self.topic = topic
        self.index = index
        self.start_offset = start_offset
        self.end_offset = start_offset
        self.lock_duration_ms = lock_duration_ms
        self.delivery_count_limit = delivery_count_limit
        self.max_record_locks = max_record_locks
        self.records: dict[int, InFlightRecord] = {}
        self._locks = 0
        self._timers: dict[int, asyncio.TimerHandle] = {}
        # long-polling ShareFetches: woken when records become available again
        self._waiters: list[asyncio.Future] = []
        self.leader_epoch = -1  # the partition's leader epoch this state was read under
        self.state_epoch = 0  # the share coordinator's state epoch this state was read under
        # told when a lock expiry changed records (their state is written to the share coordinator)
        self.on_expired: Callable[[SharePartition], None] | None = None

    # ------------------------------------------------------------------ acquiring
    def next_fetch_offset(self) -> int:
        """Where a read must start: the first available record in flight, else the end offset."""
        for off in sorted(self.records):
            if self.records[off].state == AVAILABLE:
                return off
        return self.end_offset

    def has_acquired(self) -> bool:
        return any(r.state == ACQUIRED for r in self.records.values())

    def has_available(self) -> bool:
        return any(r.state == AVAILABLE for r in self.records.values())

    def acquire(self, member_id: str, batches: Iterable[tuple[BatchBounds, memoryview | None]], max_records: int,
                aborted: set[int] | None = None) -> Acquired:
        """Acquire for `member_id` the available and new records of `batches` (read from the log at
        next_fetch_offset()), whole batches at a time until `max_records` are taken. `aborted`:
        base offsets of batches of aborted transactions (read_committed), archived unseen. A batch
        without bytes (read by another broker) is acquired all the same; only its bounds count."""
        self._locks += 1
        lock = self._locks
        out = Acquired([], [])
        taken = 0
        for h, raw in batches:
            if taken >= max_records:
                break
            last = h.last_offset
            if last < self.start_offset:
                continue
            if h.is_control:  # transaction markers are never delivered: past them, nothing to track
                self.end_offset = max(self.end_offset, last + 1)
                continue
            if aborted and h.base_offset in aborted:
                for off in range(max(h.base_offset, self.start_offset), last + 1):
                    found = self.records.get(off)
                    if found is not None and found.state == AVAILABLE:
                        found.state = ARCHIVED
                self.end_offset = max(self.end_offset, last + 1)
                continue
            got = False
            for off in range(max(h.base_offset, self.start_offset), last + 1):
                if off >= self.end_offset:
                    if off - self.start_offset >= self.max_record_locks:
                        break
                    rec = self.records[off] = InFlightRecord(ACQUIRED, 1, member_id, lock)
                    self.end_offset = off + 1
                else:
                    found = self.records.get(off)
                    if found is None or found.state != AVAILABLE:
                        continue
                    rec = found
                    rec.state, rec.member_id, rec.lock = ACQUIRED, member_id, lock
                    rec.delivery_count += 1
                self._add_range(out.ranges, off, rec.delivery_count)
                taken += 1
                got = True
            if got and raw is not None:
                out.batches.append(raw)
        if out.ranges:
            loop = asyncio.get_running_loop()
            self._timers[lock] = loop.call_later(self.lock_duration_ms / 1000, self._lock_expired, lock)
        self._advance()
        return out

    @staticmethod
    def _add_range(ranges: list[tuple[int, int, int]], off: int, count: int) -> None:
        if ranges and ranges[-1][1] == off - 1 and ranges[-1][2] == count:
            first, _, c = ranges[-1]
            ranges[-1] = (first, off, c)
        else:
            ranges.append((off, off, count))

    def _lock_expired(self, lock: int) -> None:
        """The acquisition lock ran out: what that acquisition still holds is released."""
        self._timers.pop(lock, None)
        released = False
        for rec in self.records.values():
            if rec.state == ACQUIRED and rec.lock == lock:
                self._release(rec)
                released = True
        if released:
            self._advance()
            self._wake()
            if self.on_expired is not None:
                self.on_expired(self)

    # ------------------------------------------------------------------ acknowledging
    def acknowledge(self, member_id: str, batches: list[tuple[int, int, list[int]]], renew: bool = False) -> int:
        """Apply (first, last, types) acknowledgements of `member_id`: 0, or INVALID_REQUEST for a
        malformed batch, INVALID_RECORD_STATE for a record this member does not hold (nothing is
        applied then). `renew`: the RENEW type is allowed (ShareAcknowledge / ShareFetch v2,
        KIP-1222): the record stays acquired, under a new lock of the full duration."""
        allowed = (GAP, ACCEPT, RELEASE, REJECT, RENEW) if renew else (GAP, ACCEPT, RELEASE, REJECT)
        plan: list[tuple[int, int]] = []
        for first, last, types in batches:
            n = last - first + 1
            if n < 1 or not types or (len(types) != 1 and len(types) != n):
                return Errors.INVALID_REQUEST
            for i, off in enumerate(range(first, last + 1)):
                t = types[0] if len(types) == 1 else types[i]
                if t not in allowed:
                    return Errors.INVALID_REQUEST
                rec = self.records.get(off)
                if rec is None or rec.state != ACQUIRED or rec.member_id != member_id:
                    if t == GAP and off < self.end_offset:
                        continue  # an offset with no record (compacted away): nothing to do
                    return Errors.INVALID_RECORD_STATE
                plan.append((off, t))
        released = False
        renewed = 0
        for off, t in plan:
            rec = self.records[off]
            if t == RENEW:
                if not renewed:
                    self._locks += 1
                    renewed = self._locks
                rec.lock = renewed
            elif t == RELEASE:
                self._release(rec)
                released = True
            else:  # accept; reject and gaps are archived
                rec.state, rec.member_id = (ACKNOWLEDGED if t == ACCEPT else ARCHIVED), None
        if renewed:
            loop = asyncio.get_running_loop()
            self._timers[renewed] = loop.call_later(self.lock_duration_ms / 1000, self._lock_expired, renewed)
        self._advance()
        if released:
            self._wake()
        return 0

    def release_member(self, member_id: str) -> int:
        """The member's share session ended: every record it holds is released. Returns how many."""
        n = 0
        for rec in self.records.values():
            if rec.state == ACQUIRED and rec.member_id == member_id:
                self._release(rec)
                n += 1
        if n:
            self._advance()
            self._wake()
        return n

    def skip_to(self, offset: int) -> None:
        """The log no longer holds the records below `offset`: the window starts there."""
        for off in [o for o in self.records if o < offset]:
            del self.records[off]
        self.start_offset = max(self.start_offset, offset)
        self.end_offset = max(self.end_offset, self.start_offset)
        self._advance()

    def _release(self, rec: InFlightRecord) -> None:
        rec.member_id = None
        rec.state = ARCHIVED if rec.delivery_count >= self.delivery_count_limit else AVAILABLE

    def _advance(self) -> None:
        """Move the start offset past the acknowledged and archived records at its head."""
        recs = self.records
        start = self.start_offset
        while start < self.end_offset:
            rec = recs.get(start)
            if rec is not None and rec.state in (AVAILABLE, ACQUIRED):
                break
            recs.pop(start, None)
            start += 1
        self.start_offset = start

    # ------------------------------------------------------------------ waits
    def add_waiter(self, fut: asyncio.Future) -> None:
        self._waiters.append(fut)

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    def close(self) -> None:
        for t in self._timers.values():
            t.cancel()
        self._timers.clear()
        self._wake()

    # ------------------------------------------------------------------ persisted state
    def restore(self, start_offset: int, batches: Iterable[tuple[int, int, int, int]]) -> None:
        """Take the state the share coordinator kept: (first, last, persisted state, delivery
        count) ranges from the start offset. Records that were acquired come back available."""
        self.start_offset = self.end_offset = start_offset
        self.records.clear()
        for first, last, state, count in batches:
            mine = {PERSISTED_ACKNOWLEDGED: ACKNOWLEDGED, PERSISTED_ARCHIVED: ARCHIVED}.get(state, AVAILABLE)
            for off in range(max(first, start_offset), last + 1):
                self.records[off] = InFlightRecord(mine, count, None, 0)
            self.end_offset = max(self.end_offset, last + 1)
        self._advance()

    def snapshot(self) -> tuple[int, list[tuple[int, int, int, int]]]:
        """(start offset, ranges of (first, last, persisted state, delivery count)) as the share
        coordinator keeps them: an acquired record is written as available with its count, so a
        new leader hands it out again."""
        ranges: list[tuple[int, int, int, int]] = []
        for off in sorted(self.records):
            rec = self.records[off]
            state = (PERSISTED_ACKNOWLEDGED if rec.state == ACKNOWLEDGED else
                     PERSISTED_ARCHIVED if rec.state == ARCHIVED else PERSISTED_AVAILABLE)
            if ranges and ranges[-1][1] == off - 1 and ranges[-1][2:] == (state, rec.delivery_count):
                ranges[-1] = (ranges[-1][0], off, state, rec.delivery_count)
            else:
                ranges.append((off, off, state, rec.delivery_count))
        return self.start_offset, ranges

    # ------------------------------------------------------------------ describing
    def in_flight(self) -> int:
        return sum(1 for r in self.records.values() if r.state in (AVAILABLE, ACQUIRED))
