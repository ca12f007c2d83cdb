"""One partition's active chunk replica on this broker: its log, its role, its high watermark,
and the futures of requests waiting for data (long-poll Fetch) or replication (acks=all)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from types import MappingProxyType
from typing import cast
from uuid import UUID

from broker.storage.log import Log
from metadata import PartitionInfo
from node.waits import Eventual, wait_within


def now_ms() -> int:
    return int(time.time() * 1000)


class FollowerState:
    __slots__ = ("log_end_offset", "last_caught_up_ms", "last_fetch_ms")

    def __init__(self, now: int = 0) -> None:
        self.log_end_offset = -1
        self.last_caught_up_ms = now
        self.last_fetch_ms = 0


# What an idle partition holds instead of an empty waiter list or follower dict: a broker of
# 20,000 partitions kept five empty containers each (about 290 bytes) for waits that never came.
# A list is made by the first waiter; code that swaps the waiters out puts this back.
_NO_WAITERS: tuple = ()
# read-only, so a write that skipped _follower_states() fails instead of reaching every partition
_NO_FOLLOWERS = cast(dict, MappingProxyType({}))


class Partition:
    __slots__ = ("topic", "index", "topic_id", "log", "node_id", "info", "followers", "_data_waiters",
                 "_follower_waiters", "caught_up_at", "on_follower_caught_up", "_hw_waiters", "_in_sync_waiters",
                 "_sealed_for_chunk", "filling_prefix", "swapping", "pending_isr", "min_isr_for_hw", "__weakref__")

    def __init__(self, topic: str, index: int, topic_id: UUID, log_: Log, node_id: int) -> None:
        self.topic = topic
        self.index = index
        self.topic_id = topic_id
        self.log = log_
        self.node_id = node_id
        self.info: PartitionInfo | None = None
        self.followers: dict[int, FollowerState] = _NO_FOLLOWERS
        # long polls: consumers wait for the high watermark (or last stable offset) to move,
        # followers for records past the log end; as Kafka's DelayedFetch, a follower's is not
        # completed by a high watermark move (it learns the new one with its next records)
        self._data_waiters: list[asyncio.Future] | tuple = _NO_WAITERS
        self._follower_waiters: list[asyncio.Future] | tuple = _NO_WAITERS
        self.caught_up_at = 0.0  # follower: when the last fetch from the leader succeeded
        self.on_follower_caught_up: Callable[[Partition, int], None] | None = None
        self._hw_waiters: list[tuple[int, asyncio.Future | Eventual]] | tuple = _NO_WAITERS
        # (end offset, min.insync.replicas, waiter)
        self._in_sync_waiters: list[tuple[int, int, Eventual]] | tuple = _NO_WAITERS
        # set while a CreateChunks for this partition is under way: the chunk's offsets are being
        # fixed, so Produce answers NOT_LEADER_OR_FOLLOWER (retriable) until the new chunk leads
        self._sealed_for_chunk = False
        # a new active chunk's leader that lacks [chunk start, previous chunk's end] copies it
        # from the previous chunk first (chunk_fetcher.py); writes wait until it holds it
        self.filling_prefix = False
        # a move between log dirs swaps the log (log_dir_mover.py): no appends, no reads meanwhile
        self.swapping = False
        # Kafka's "maximal ISR": while an AlterPartition adding a follower is in flight, the high
        # watermark waits for that follower too, since the controller may commit the larger ISR
        # (and complete a reassignment onto it) before we hear back
        self.pending_isr: tuple[int, ...] | None = None
        # KIP-966's strict min ISR: with eligible leader replicas on, the high watermark moves only
        # while the ISR holds min.insync.replicas, else a record acknowledged with acks=1 could be
        # lost to an election from the ELR. Given the topic, returns that minimum (0: no such
        # rule); asked only while the ISR is smaller than the replica set. One callable shared by
        # every partition (a closure each was about 230 bytes a partition).
        self.min_isr_for_hw: Callable[[str], int] | None = None

    @property
    def sealed(self) -> bool:
        """Produce answers NOT_LEADER_OR_FOLLOWER: a chunk is being cut, this new chunk's
        leader still copies the previous chunk's tail, or the log is being swapped to another dir."""
        return self._sealed_for_chunk or self.filling_prefix or self.swapping

    @sealed.setter
    def sealed(self, value: bool) -> None:
        self._sealed_for_chunk = value

    def __repr__(self) -> str:
        return f"Partition({self.topic}-{self.index})"

    # ---- role
    @property
    def is_leader(self) -> bool:
        return self.info is not None and self.info.leader == self.node_id

    @property
    def leader_epoch(self) -> int:
        return -1 if self.info is None else self.info.leader_epoch

    @property
    def isr(self) -> tuple[int, ...]:
        return () if self.info is None else self.info.isr

    def update(self, info: PartitionInfo) -> str | None:
        """Apply the partition's new metadata (leader, epoch, ISR). Returns "leader" if this
        replica became leader (or leads in a new epoch), "follower" if it stopped leading, else
        None: the caller logs the change (one line a partition, or a summary for a bulk delta)."""
        change = None
        was_leader = self.is_leader
        old_epoch = self.leader_epoch
        if self.pending_isr is not None and (self.info is None or info.partition_epoch > self.info.partition_epoch):
            self.pending_isr = None  # the metadata tells what became of the proposed ISR
        self.info = info
        if info.leader == self.node_id:
            if not was_leader or old_epoch != info.leader_epoch:
                self.log.leader_epoch_cache.assign(info.leader_epoch, self.log.log_end_offset)
                t = now_ms()
                # as Kafka: followers count as caught up when leadership starts, so the ISR is
                # not shrunk before they had a chance to fetch from us
                self.followers = {r: FollowerState(t) for r in info.replicas if r != self.node_id} or _NO_FOLLOWERS
                change = "leader"
            else:
                for r in info.replicas:
                    if r != self.node_id and r not in self.followers:
                        self._follower_states()[r] = FollowerState(now_ms())
        elif was_leader:
            change = "follower"
            self.fail_waiters()
        self.maybe_advance_high_watermark()
        self.notify_data()
        return change

    def apply_isr(self, isr: tuple[int, ...], partition_epoch: int) -> None:
        """The controller accepted our AlterPartition: use the new ISR before the metadata
        log brings it, as Kafka's leaders do."""
        if self.info is not None and partition_epoch >= self.info.partition_epoch:
            from dataclasses import replace

            self.info = replace(self.info, isr=isr, partition_epoch=partition_epoch)
            self.maybe_advance_high_watermark()

    @property
    def maximal_isr_size(self) -> int:
        """Kafka's maximal ISR: the ISR with a proposed change's replicas added while it is in flight."""
        return len(self.isr if self.pending_isr is None else self.pending_isr)

    # ---- high watermark
    @property
    def high_watermark(self) -> int:
        return self.log.high_watermark

    def maybe_advance_high_watermark(self) -> None:
        if not self.is_leader:
            return
        leo = self.log.log_end_offset
        hw = leo
        for r in self.isr if self.pending_isr is None else self.pending_isr:
            if r == self.node_id:
                continue
            st = self.followers.get(r)
            end = st.log_end_offset if st is not None else -1
            if end < hw:  # not min(): a C call with argument parsing, in every follower Fetch
                hw = end
        if hw > self.log.high_watermark and not self._under_strict_min_isr():
            self.log.update_high_watermark(hw)
            self._release_hw_waiters(hw)
            self.notify_high_watermark()
        if self._in_sync_waiters:
            self._release_in_sync_waiters()

    def _under_strict_min_isr(self) -> bool:
        check, info = self.min_isr_for_hw, self.info
        return (check is not None and info is not None and len(info.isr) < len(info.replicas)
                and len(info.isr) < check(self.topic))

    def _follower_states(self) -> dict[int, FollowerState]:
        """The follower dict to write to (the shared empty one is replaced first)."""
        if self.followers is _NO_FOLLOWERS:
            self.followers = {}
        return self.followers

    def update_follower(self, replica_id: int, fetch_offset: int) -> None:
        """A follower fetched from `fetch_offset`: everything before it is on that replica."""
        st = self.followers.get(replica_id)
        if st is None:
            st = self._follower_states()[replica_id] = FollowerState()
        t = now_ms()
        st.log_end_offset = fetch_offset
        st.last_fetch_ms = t
        if fetch_offset >= self.log.log_end_offset:
            st.last_caught_up_ms = t
        self.maybe_advance_high_watermark()
        if (
            replica_id not in self.isr
            and self.info is not None
            and replica_id in self.info.replicas
            and fetch_offset >= self.log.high_watermark
            and self.on_follower_caught_up is not None
        ):
            self.on_follower_caught_up(self, replica_id)  # ISR expansion

    def high_watermark_future(self, offset: int) -> asyncio.Future:
        """Resolves to True once the HW passes `offset` (exclusive end), to False when the
        leadership moves first. A caller that stops waiting cancels it."""
        fut = asyncio.get_running_loop().create_future()
        if self.log.high_watermark >= offset:
            fut.set_result(True)
        else:
            self._add_hw_waiter((offset, fut))
        return fut

    def high_watermark_eventual(self, offset: int, timeout: float) -> Eventual:
        """Set to True once the HW passes `offset` (exclusive end), in the call that moves it
        (the follower's Fetch); to False when the leadership moves first or after `timeout`."""
        ev = Eventual()
        if self.log.high_watermark >= offset:
            ev.set_result(True)
            return ev
        timer = asyncio.get_running_loop().call_later(max(timeout, 0.0), ev.set_result, False)
        ev.on_done(lambda _: timer.cancel())
        self._add_hw_waiter((offset, ev))
        return ev

    def _add_hw_waiter(self, waiter: tuple[int, asyncio.Future | Eventual]) -> None:
        if self._hw_waiters:
            self._hw_waiters.append(waiter)  # type: ignore[union-attr]  # non-empty: a list
        else:
            self._hw_waiters = [waiter]

    async def wait_for_high_watermark(self, offset: int, timeout: float) -> bool:
        """acks=all: wait until the HW passes `offset` (exclusive end)."""
        if self.log.high_watermark >= offset:
            return True
        fut = self.high_watermark_future(offset)
        return await wait_within(fut, timeout, False)

    def _release_hw_waiters(self, hw: int) -> None:
        if not self._hw_waiters:
            return
        # an Eventual's listeners run inside set_result: the list is swapped out first
        waiters, self._hw_waiters = self._hw_waiters, _NO_WAITERS
        keep = []
        for off, fut in waiters:
            if hw >= off:
                if not fut.done():
                    fut.set_result(True)
            else:
                keep.append((off, fut))
        keep += self._hw_waiters  # added by the listeners meanwhile
        self._hw_waiters = keep or _NO_WAITERS

    def in_sync_eventual(self, offset: int, min_isr: int, timeout: float) -> Eventual:
        """Set to True once the HW passes `offset` (exclusive end) while the ISR holds at least
        `min_isr` replicas (the maximal ISR, as Kafka's DelayedProduce counts); to False when the
        leadership moves first or after `timeout`."""
        ev = Eventual()
        timer = asyncio.get_running_loop().call_later(max(timeout, 0.0), ev.set_result, False)
        ev.on_done(lambda _: timer.cancel())
        self._in_sync_waiters = [*self._in_sync_waiters, (offset, min_isr, ev)]
        self._release_in_sync_waiters()
        return ev

    def _release_in_sync_waiters(self) -> None:
        hw, size = self.log.high_watermark, self.maximal_isr_size
        waiters, self._in_sync_waiters = self._in_sync_waiters, _NO_WAITERS  # listeners run inside set_result
        keep = []
        for off, min_isr, ev in waiters:
            if hw >= off and size >= min_isr:
                ev.set_result(True)
            elif not ev.done():
                keep.append((off, min_isr, ev))
        keep += self._in_sync_waiters  # added by the listeners meanwhile
        self._in_sync_waiters = keep or _NO_WAITERS

    def fail_waiters(self) -> None:
        """Leadership moved: acks=all requests waiting here will not complete."""
        waiters, self._hw_waiters = self._hw_waiters, _NO_WAITERS
        for _, fut in waiters:
            if not fut.done():
                fut.set_result(False)
        in_sync, self._in_sync_waiters = self._in_sync_waiters, _NO_WAITERS
        for _, _, ev in in_sync:
            ev.set_result(False)
        self.notify_data()

    # ---- long poll
    def add_data_waiter(self, fut: asyncio.Future, follower: bool = False) -> None:
        waiters = self._follower_waiters if follower else self._data_waiters
        # A long poll that timed out leaves its (done) future behind: drop those, or an idle
        # partition in a consumer's session keeps one per Fetch forever.
        if waiters and not waiters[0].done():
            waiters.append(fut)  # type: ignore[union-attr]  # non-empty: a list
            return
        waiters = [f for f in waiters if not f.done()]
        waiters.append(fut)
        if follower:
            self._follower_waiters = waiters
        else:
            self._data_waiters = waiters

    def notify_appended(self) -> None:
        """Records were appended as leader: the followers' long polls read them. Consumers wait
        for the high watermark, whose move maybe_advance_high_watermark announces."""
        if self._follower_waiters:
            waiters, self._follower_waiters = self._follower_waiters, _NO_WAITERS
            _wake_all(waiters)

    def notify_high_watermark(self) -> None:
        """The high watermark moved: the consumers' long polls read on."""
        if self._data_waiters:
            waiters, self._data_waiters = self._data_waiters, _NO_WAITERS
            _wake_all(waiters)

    def notify_data(self) -> None:
        """Wake every long poll: what they may read changed in a way followers must hear at once
        too (the role, a truncation, a transaction marker)."""
        self.notify_high_watermark()
        self.notify_appended()


def _wake_all(waiters: list[asyncio.Future] | tuple) -> None:
    for fut in waiters:
        if not fut.done():
            fut.set_result(True)
