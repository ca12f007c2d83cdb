"""What the ShareFetch and ShareAcknowledge handlers call (KIP-932): the share-partitions this
broker keeps as the leader of their partitions, the share sessions, and the reads through the one
partition interface (broker/partitions/) that Fetch also uses.

A share-partition is made at the first ShareFetch of its group for that partition on this leader:
from the state the share coordinator kept (persister.py), else at the group's
share.auto.offset.reset (latest by default: the partition's high watermark then; earliest: its
log start), written back at once. Acknowledgements are answered once the new state is written, so
a new leader (a leader change, a restart, kill -9) carries on from there: accepted records stay
accepted, acquired ones come back.

A diskless partition is read on every broker, but its share-partition lives on one: the leader the
metadata image names (the holder). Another broker serves its members' share sessions and reads
their records itself, and forwards acquisitions and acknowledgements to the holder (forward.py);
the holder applies them here (serve_forwarded).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any
from uuid import UUID

import structlog

from broker.coordinator import wall_clock_ms
from broker.coordinator.share.records import ShareState
from broker.partitions.interface import FetchPosition
from broker.share.config import ShareGroupConfig
from broker.share.forward import Holder, ReadBatches
from broker.share.partition import Acquired, BatchBounds, SharePartition
from broker.share.sessions import ShareSessionCache
from metadata.config_defs import iso_duration_ms
from metadata.image import GROUP_RESOURCE
from protocol.errors import Errors, ProtocolError
from protocol.file_region import FileRegion
from protocol.records import decode_batches
from protocol.records.batch import iter_batches

if TYPE_CHECKING:
    from broker.partitions.chunk_views import Reader
    from broker.partitions.interface import ServedPartition
    from broker.partitions.router import PartitionRouter
    from broker.ports import ImageSource
    from broker.share.forward import ShareForwarder
    from broker.share.persister import SharePersister

log = structlog.get_logger(__name__)

LATEST, EARLIEST = -1, -2
# A share read hands out at most the request's MaxRecords, within an in-flight window of
# group.share.partition.max.record.locks records (KIP-932, "In-flight records"); reading up to a
# consumer's whole fetch max bytes (librdkafka's 50 MiB) only to drop most of it cost a diskless
# partition a lookup and block-cache copy of everything unread, on every ShareFetch. The bound is
# a consumer's per-partition fetch default (max.partition.fetch.bytes, 1 MiB); a larger first batch
# still comes whole (min_one_batch).
SHARE_READ_MAX_BYTES = 1 << 20
Key = tuple[str, str, int]  # (group, topic, partition)


def _as_bytes(records) -> bytes:
    """A read's records as one bytes value: its batches are parsed to hand out offsets."""
    if records is None:
        return b""
    if isinstance(records, (bytes, bytearray, memoryview)):
        return bytes(records)
    out = []
    for part in records:
        if isinstance(part, FileRegion):
            try:
                out.append(os.pread(part.fd, part.size, part.position))
            finally:
                part.close()
        else:
            out.append(bytes(part))
    return b"".join(out)


def aborted_batches(batches: list, aborted: list[tuple[int, int]] | None) -> set[int]:
    """Base offsets of the transactional batches that belong to aborted transactions (the
    consumer's rule: from an aborted transaction's first offset to its producer's abort marker).
    share.isolation.level=read_committed never delivers them (KIP-932)."""
    if not aborted:
        return set()
    pending = sorted(aborted, key=lambda a: a[1])
    open_pids: set[int] = set()
    out = set()
    i = 0
    for h, raw in batches:
        while i < len(pending) and pending[i][1] <= h.last_offset:
            open_pids.add(pending[i][0])
            i += 1
        if not h.is_transactional or h.producer_id not in open_pids:
            continue
        if h.is_control:
            # the abort marker ends the producer's aborted transaction (key version 0, type 0 = abort)
            if len(raw) > 0 and _is_abort_marker(raw):
                open_pids.discard(h.producer_id)
            continue
        out.add(h.base_offset)
    return out


def _is_abort_marker(raw) -> bool:
    try:
        recs = decode_batches(bytes(raw))
    except ProtocolError:
        return False
    for b in recs:
        for r in b.records:
            if r.key is not None and len(r.key) >= 4:
                return int.from_bytes(bytes(r.key[2:4]), "big") == 0
    return False


class ShareService:
    def __init__(self, config: ShareGroupConfig, router: PartitionRouter, images: ImageSource,
                 persister: SharePersister, forwarder: ShareForwarder) -> None:
        self.config = config
        self.router = router
        self.images = images
        self.persister = persister
        self.forwarder = forwarder
        self._tasks: set[asyncio.Task] = set()
        self.sessions = ShareSessionCache(config.max_share_sessions, config.session_timeout_ms)
        self.partitions: dict[Key, SharePartition] = {}

    # ------------------------------------------------------------------ settings per group
    def _group_config(self, group_id: str, name: str) -> str | None:
        return self.images.image.configs.get((GROUP_RESOURCE, group_id), {}).get(name)

    def lock_duration_ms(self, group_id: str) -> int:
        raw = self._group_config(group_id, "share.record.lock.duration.ms")
        try:
            return int(raw) if raw is not None else self.config.record_lock_duration_ms
        except ValueError:
            return self.config.record_lock_duration_ms

    # ------------------------------------------------------------------ share-partitions
    def serving(self, topic: str, index: int) -> tuple[ServedPartition | None, int]:
        """The partition when this broker leads it; else NOT_LEADER_OR_FOLLOWER and any state we
        kept for it goes (its new leader starts its own)."""
        p, err = self.router.serving(topic, index)
        info = self.images.image.topic(topic)
        pi = info.partitions.get(index) if info is not None else None
        if p is not None and (pi is None or pi.leader != self.router.node_id):
            # a diskless partition is served by every broker: its share-partition lives on the one
            # the metadata names leader, so that two brokers never hand out the same records
            p, err = None, Errors.NOT_LEADER_OR_FOLLOWER
        if p is None:
            for key in [k for k in self.partitions if k[1] == topic and k[2] == index]:
                self.partitions.pop(key).close()
        return p, err

    def holder(self, topic: str, index: int) -> Holder | None:
        """The broker holding a diskless partition's share-partition when it is not this one (the
        leader the image names; -1 while it has none), else None: the share-partition is here."""
        info = self.images.image.topic(topic)
        pi = info.partitions.get(index) if info is not None else None
        if info is None or pi is None or pi.diskless_coordinator < 0 or pi.leader == self.router.node_id:
            return None
        return Holder(pi.leader, pi.leader_epoch, info.id)

    def _partition_ids(self, topic: str, index: int) -> tuple[UUID, int] | None:
        info = self.images.image.topic(topic)
        pi = info.partitions.get(index) if info is not None else None
        return (info.id, pi.leader_epoch) if info is not None and pi is not None else None

    async def share_partition(self, group_id: str, topic: str, index: int,
                              p: ServedPartition) -> tuple[int, SharePartition | None]:
        key = (group_id, topic, index)
        ids = self._partition_ids(topic, index)
        if ids is None:
            return Errors.UNKNOWN_TOPIC_OR_PARTITION, None
        topic_id, leader_epoch = ids
        sp = self.partitions.get(key)
        if sp is not None and sp.leader_epoch == leader_epoch:
            return 0, sp
        if sp is not None:  # led elsewhere meanwhile: what that leader wrote is the state now
            self.partitions.pop(key).close()
        err, state = await self.persister.read(group_id, topic_id, index, leader_epoch)
        if err:
            return err, None
        state_epoch = state.state_epoch if state is not None else 0
        if state is not None and state.start_offset < 0:
            state = None  # initialized without a start offset: share.auto.offset.reset decides
        start, how = (state.start_offset, "persisted") if state is not None else (-1, "")
        if state is None:
            how = (self._group_config(group_id, "share.auto.offset.reset") or "latest").strip().lower()
            err, start = await self._reset_offset(p, how)
            if err:
                return err, None
        sp = self.partitions.get(key)  # made meanwhile by another request
        if sp is None:
            sp = SharePartition(group_id, topic, index, start, self.lock_duration_ms(group_id),
                                self.config.delivery_count_limit, self.config.partition_max_record_locks)
            sp.leader_epoch = leader_epoch
            sp.state_epoch = state_epoch
            if state is not None:
                sp.restore(state.start_offset, state.batches)
            else:
                err = await self.persist(sp)  # Kafka's InitializeShareGroupState
                if err:
                    return err, None
                if key in self.partitions:
                    return 0, self.partitions[key]
            sp.on_expired = self._persist_later
            self.partitions[key] = sp
            log.info("share_partition_started", group=group_id, topic=topic, partition=index,
                     start_offset=sp.start_offset, in_flight=len(sp.records), start=how, leader_epoch=leader_epoch)
        return 0, sp

    @staticmethod
    async def _reset_offset(p: ServedPartition, how: str) -> tuple[int, int]:
        """Where a new share-partition starts (share.auto.offset.reset): the high watermark, the log
        start, or the first record at or after now minus the by_duration (the high watermark when
        none is)."""
        duration = iso_duration_ms(how[len("by_duration:"):]) if how.startswith("by_duration:") else None
        if duration is not None:
            ans = await p.offset_for(max(0, wall_clock_ms() - duration), False)
            if not ans.error_code and ans.offset >= 0:
                return 0, ans.offset
        ans = await p.offset_for(EARLIEST if how == "earliest" else LATEST, False)
        return ans.error_code, ans.offset

    def read_committed(self, group_id: str) -> bool:
        return (self._group_config(group_id, "share.isolation.level") or "").strip().lower() == "read_committed"

    async def persist(self, sp: SharePartition) -> int:
        """Write `sp`'s state as it is now to its share coordinator: 0 once replicated."""
        ids = self._partition_ids(sp.topic, sp.index)
        if ids is None:
            return Errors.UNKNOWN_TOPIC_OR_PARTITION
        start, batches = sp.snapshot()
        err = await self.persister.write(sp.group_id, ids[0], sp.index,
                                         ShareState(sp.state_epoch, sp.leader_epoch, start, batches))
        if err in (Errors.FENCED_STATE_EPOCH, Errors.FENCED_LEADER_EPOCH):
            self.forget(sp)  # its start offset was set meanwhile, or another leader wrote: read again
        return err

    def forget(self, sp: SharePartition) -> None:
        key = (sp.group_id, sp.topic, sp.index)
        if self.partitions.get(key) is sp:
            del self.partitions[key]
            sp.close()

    def refresh_idle(self, group_id: str, partitions) -> None:
        """A member opens a share session: the group's share-partitions here that no session reads
        and that hold no acquired record are read again from the share coordinator at their next
        fetch (an admin may have set their start offsets while the group was empty)."""
        image = self.images.image
        busy = self.sessions.partitions_of(group_id)
        for tid, index in partitions:
            info = image.topics.get(tid)
            if info is not None and self.holder(info.name, index) is not None:
                self.forwarder.session_opened((group_id, info.name, index))  # the holder looks
                continue
            sp = self.partitions.get((group_id, info.name, index)) if info is not None else None
            if sp is not None and (tid, index) not in busy and not sp.has_acquired():
                self.forget(sp)

    def _persist_later(self, sp: SharePartition) -> None:
        self._spawn(self.persist(sp))

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def riding_acks(self, acks: dict) -> dict:
        """Take out of `acks` ((topic id, partition) -> batches) those of diskless partitions held
        by another broker: they ride on the acquisition forwarded there (fetch's `acks`)."""
        image = self.images.image
        out = {}
        for tid, index in list(acks):
            info = image.topics.get(tid)
            if info is not None and self.holder(info.name, index) is not None:
                out[(tid, index)] = acks.pop((tid, index))
        return out

    async def fetch(self, reader: Reader, group_id: str, member_id: str, topic: str, index: int, max_records: int,
                    max_bytes: int, acks: list[tuple[int, int, list[int]]] | None = None
                    ) -> tuple[int, Acquired | None, tuple[ServedPartition, SharePartition | None] | None, int]:
        """(error, what was acquired for the member, what a long poll waits on when nothing was:
        the partition and its share-partition here, None for one held by another broker; the
        error of applying `acks` first, the member's acknowledgements of the partition)."""
        key = (group_id, topic, index)
        holder = self.holder(topic, index)
        if holder is not None:
            p, err = self.router.serving(topic, index)
            if p is None:
                ack_err = await self.acknowledge(group_id, member_id, topic, index, acks, False) if acks else 0
                return err, None, None, ack_err
            served = p
            err, got, ack_err = await self.forwarder.acquire(
                key, holder, member_id, max_records, lambda offset: self._read(
                    reader, topic, index, served, offset, self.read_committed(group_id), max_bytes), acks)
            return err, got, ((p, None) if not err and got is None else None), ack_err
        ack_err = await self.acknowledge(group_id, member_id, topic, index, acks, False) if acks else 0
        p, err = self.serving(topic, index)
        if p is None:
            return err, None, None, ack_err
        err, sp = await self.share_partition(group_id, topic, index, p)
        if err or sp is None:
            return err, None, None, ack_err
        err, got, idle = await self._acquire(reader, sp, p, member_id, max_records, max_bytes)
        return err, got, ((p, sp) if idle and not err else None), ack_err

    async def _read(self, reader: Reader, topic: str, index: int, p: ServedPartition, offset: int, committed: bool,
                    max_bytes: int) -> ReadBatches:
        """The batches from `offset` on, through the partition router's view of the chunk holding
        it for a chunked partition."""
        max_bytes = min(max_bytes, SHARE_READ_MAX_BYTES)
        pos = FetchPosition(fetch_offset=offset, max_bytes=max_bytes, replica_id=-1, last_fetched_epoch=-1,
                            read_committed=committed, min_one_batch=True)
        info = self.images.image.topic(topic)
        view: ServedPartition | None = p
        if info is not None and info.chunks.get(index):
            view, err = self.router.for_share(reader, info, index, offset, max_bytes, 1 if committed else 0)
            if view is None:
                return ReadBatches(err, [])
            view.prepare_read(pos)
        assert view is not None
        ans = await view.read(pos)
        if ans.error_code == Errors.OFFSET_OUT_OF_RANGE and offset < ans.log_start_offset:
            # the records were deleted (retention, DeleteRecords): the window moves past them
            return ReadBatches(0, [], log_start=ans.log_start_offset, below_start=True)
        if ans.error_code:
            return ReadBatches(ans.error_code, [])
        if not ans.size:
            return ReadBatches(0, [], log_start=ans.log_start_offset)
        buf = _as_bytes(ans.records)
        mv = memoryview(buf)
        try:
            batches = [(h, mv[pos:pos + h.size]) for pos, h in iter_batches(buf, check_crc=False,
                                                                             allow_partial_tail=True)]
        except ProtocolError:
            return ReadBatches(Errors.CORRUPT_MESSAGE, [])
        aborted = aborted_batches(batches, ans.aborted_transactions) if committed else None
        return ReadBatches(0, batches, aborted, ans.log_start_offset)

    async def _acquire(self, reader: Reader, sp: SharePartition, p: ServedPartition, member_id: str,
                       max_records: int, max_bytes: int) -> tuple[int, Acquired | None, bool]:
        """(error, what was acquired, whether the partition had nothing to read yet)."""
        r = await self._read(reader, sp.topic, sp.index, p, sp.next_fetch_offset(), self.read_committed(sp.group_id),
                             max_bytes)
        if r.below_start:
            sp.skip_to(r.log_start)
            return 0, None, False
        if r.error:
            return r.error, None, False
        if not r.batches:
            return 0, None, True
        got = sp.acquire(member_id, r.batches, max_records, r.aborted)
        return 0, got, not got.ranges

    async def acknowledge(self, group_id: str, member_id: str, topic: str, index: int,
                          batches: list[tuple[int, int, list[int]]], renew: bool) -> int:
        """Apply a member's acknowledgements (`renew`: v2's RENEW type allowed, KIP-1222): 0 once
        the new state is written, so an accepted record stays accepted on a new leader."""
        holder = self.holder(topic, index)
        if holder is not None:
            return await self.forwarder.acknowledge((group_id, topic, index), holder, member_id, batches, renew)
        p, err = self.serving(topic, index)
        if err:
            return err
        sp = self.partitions.get((group_id, topic, index)) if p is not None else None
        if sp is None:
            return Errors.INVALID_RECORD_STATE  # nothing acquired here for this group
        err = sp.acknowledge(member_id, batches, renew) if batches else 0
        if batches and not err:
            err = await self.persist(sp)
        return err

    async def serve_forwarded(self, group_id: str, member_id: str, topic: str, index: int, leader_epoch: int,
                              acks: list[tuple[int, int, list[int]]], renew: bool, release_all: bool, refresh: bool,
                              max_records: int, log_start: int, batches: list[BatchBounds], aborted: set[int]
                              ) -> tuple[int, int, int, list[tuple[int, int, int]]]:
        """As the holder of a diskless partition's share-partition, what another broker serving
        one of its members forwards (forward.py): (error, acknowledgement error, where that broker
        reads next, the ranges acquired for the member among the batches it read)."""
        p, err = self.serving(topic, index)
        ids = self._partition_ids(topic, index)
        if p is None or ids is None:
            return err or Errors.UNKNOWN_TOPIC_OR_PARTITION, 0, -1, []
        if leader_epoch > ids[1]:
            return Errors.NOT_LEADER_OR_FOLLOWER, 0, -1, []  # our image is behind the sender's: we may not lead
        key = (group_id, topic, index)
        ack_err = await self.acknowledge(group_id, member_id, topic, index, acks, renew) if acks else 0
        sp = self.partitions.get(key)
        if release_all and sp is not None and sp.release_member(member_id):
            self._persist_later(sp)
        if max_records <= 0:
            return 0, ack_err, sp.next_fetch_offset() if sp is not None else -1, []
        if refresh and sp is not None and not sp.has_acquired() and (
                (ids[0], index) not in self.sessions.partitions_of(group_id)):
            self.forget(sp)  # as refresh_idle for a session opened here
        err, sp = await self.share_partition(group_id, topic, index, p)
        if err or sp is None:
            return err, ack_err, -1, []
        if log_start > sp.start_offset:
            sp.skip_to(log_start)  # the records below were deleted
        offset = sp.next_fetch_offset()
        if not batches or not batches[0].base_offset <= offset <= batches[-1].last_offset:
            return 0, ack_err, offset, []  # read elsewhere: the sender reads again at `offset`
        got = sp.acquire(member_id, ((b, None) for b in batches), max_records, aborted)
        return 0, ack_err, sp.next_fetch_offset(), got.ranges

    async def close(self) -> None:
        """Shutdown: lock timers stop, connections to share coordinators close."""
        for sp in self.partitions.values():
            sp.close()
        self.partitions.clear()
        for t in list(self._tasks):
            t.cancel()
        await self.persister.close()
        await self.forwarder.close()

    def evict_idle_sessions(self) -> None:
        for s in self.sessions.evict_idle():
            log.info("share_session_evicted", group=s.group_id, member=s.member_id, why="idle")
            self.release_member(s.group_id, s.member_id, list(s.partitions))

    def release_member(self, group_id: str, member_id: str, partitions) -> None:
        """A share session closed or was replaced: the member's records go back to the group."""
        image = self.images.image
        for tid, index in partitions:
            info = image.topics.get(tid)
            if info is None:
                continue
            holder = self.holder(info.name, index)
            if holder is not None:
                self._spawn(self.forwarder.acknowledge((group_id, info.name, index), holder, member_id, [], False,
                                                       release_all=True))
                continue
            sp = self.partitions.get((group_id, info.name, index))
            if sp is not None:
                n = sp.release_member(member_id)
                if n:
                    self._persist_later(sp)
                    log.info("share_records_released", group=group_id, member=member_id, topic=info.name,
                             partition=index, records=n)
