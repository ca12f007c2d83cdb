"""OrderedConsumer: a consumer group member that delivers every key in order while the topic's
partition count changes (KIP-253 sections 5-7).

- Assignment (section 5): the group leader deals unmarked and marked partitions separately.
- Positions (section 6): each Heartbeat (v4 tagged fields) reports this member's delivered
  position of the partitions other members wait on and names the partitions it waits on; the
  coordinator answers the group's position of those (the higher of reported and committed).
- Gating (section 7), both thresholds from PartitionLeaderEpochsForPartitions + OffsetForLeaderEpoch:
  a partition created by a growth, started from its beginning, is consumed only once the group
  has delivered every prior partition up to where its pre-growth leader epoch ended
  (lowerOffsetThreshold); a kept partition's records after its pre-shrink leader epoch
  (past upperOffsetThreshold) wait until the group has delivered each marked partition to the
  end of its last writable epoch (the shrink bumps marked partitions' epochs too).
  Every epoch end is asked of the leader at the epoch our metadata shows: a leader that has not
  applied the change still takes writes in the old epoch, so its answer would come too early.

Records returned by getmany() count as delivered. Positions are committed by commit(), before a
rebalance gives the partitions away and on stop(), so another member goes on exactly there.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Iterable
from dataclasses import dataclass

from client.cluster import EARLIEST, ClusterClient, StrataClientError, TopicMeta, kafka_error
from client.fetch import FETCH_VERSION, fetch_request
from client.group import PROTOCOL_NAME, PROTOCOL_TYPE, assign, decode_assignment, encode_assignment, encode_subscription
from client.logs import get_logger
from node.client import ClientError
from protocol.errors import Errors, error_name
from protocol.generated.find_coordinator import FindCoordinatorRequest
from protocol.generated.heartbeat import HeartbeatRequest
from protocol.generated.join_group import JoinGroupRequest
from protocol.generated.leave_group import LeaveGroupRequest
from protocol.generated.offset_commit import OffsetCommitRequest
from protocol.generated.offset_fetch import OffsetFetchRequest
from protocol.generated.sync_group import SyncGroupRequest
from protocol.records import decode_batches

log = get_logger(__name__)

TopicPartition = tuple[str, int]
_REJOIN = {Errors.REBALANCE_IN_PROGRESS, Errors.ILLEGAL_GENERATION, Errors.UNKNOWN_MEMBER_ID, Errors.FENCED_INSTANCE_ID}
_COORDINATOR_MOVED = {Errors.NOT_COORDINATOR, Errors.COORDINATOR_NOT_AVAILABLE, Errors.COORDINATOR_LOAD_IN_PROGRESS}
_NEVER = 1 << 62


@dataclass(frozen=True)
class ConsumerRecord:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int
    leader_epoch: int = -1  # of the batch: newer than our metadata means the count may have changed


@dataclass(frozen=True)
class _ControlBatch:
    offset: int  # its last offset
    leader_epoch: int


class PartitionKeyRebalanceListener:
    """KIP-253's consumer callbacks (methods may be sync or async)."""

    def on_partition_key_assigned(self, partitions: list[TopicPartition]) -> None:
        """The member starts delivering these partitions' keys (their gates opened)."""

    def on_partition_key_maybe_revoked(self, partitions: list[TopicPartition]) -> None:
        """Other members may start on these partitions' keys: the positions just reported (or
        the partitions are being given away in a rebalance)."""


class GroupError(StrataClientError):
    """The group refused this member (e.g. INCONSISTENT_GROUP_PROTOCOL beside stock consumers)."""


class OrderedConsumer:
    """aiokafka-style: `await start()`, `await getmany(timeout_ms=...)` -> {(topic, partition):
    [ConsumerRecord]}, `await commit()`, `await stop()`."""

    def __init__(
        self,
        *topics: str,
        bootstrap_servers: str | list[str],
        group_id: str,
        listener: PartitionKeyRebalanceListener | None = None,
        client_id: str = "strata-ordered-consumer",
        session_timeout_ms: int = 10000,
        rebalance_timeout_ms: int = 30000,
        heartbeat_interval_ms: int = 250,
        fetch_max_wait_ms: int = 200,
        max_partition_fetch_bytes: int = 1 << 20,
        metadata_max_age_ms: int = 1000,
    ) -> None:
        if not topics:
            raise ValueError("name at least one topic")
        self.topics = list(topics)
        self.group_id = group_id
        self.listener = listener or PartitionKeyRebalanceListener()
        self._cluster = ClusterClient(bootstrap_servers, client_id)
        self._session_ms = session_timeout_ms
        self._rebalance_ms = rebalance_timeout_ms
        self._hb_interval = heartbeat_interval_ms / 1000
        self._max_wait_ms = fetch_max_wait_ms
        self._max_bytes = max_partition_fetch_bytes
        self._metadata_age = metadata_max_age_ms / 1000
        self.member_id = ""
        self.generation = -1
        self._coordinator: tuple[str, int] | None = None
        self._need_rejoin = True
        self._assigned: list[TopicPartition] = []
        self._position: dict[TopicPartition, int] = {}
        self._committed: dict[TopicPartition, int] = {}
        self._gated_start: set[TopicPartition] = set()  # started from the beginning: creation gate applies
        self._released: set[TopicPartition] = set()
        self._group_pos: dict[TopicPartition, int] = {}
        self._wanted: set[TopicPartition] = set()
        self._reported: dict[TopicPartition, tuple[int, int, float]] = {}  # position, epoch, when
        self._high_watermark: dict[TopicPartition, int] = {}  # from the last Fetch answer
        self._delivered_epoch: dict[TopicPartition, int] = {}  # largest leader epoch delivered
        self._thresholds: dict[tuple[str, int, int], int] = {}
        self._marked_ends: dict[TopicPartition, int] = {}  # a marked partition's final end
        self._marked_asked: dict[TopicPartition, float] = {}  # when its end was last asked
        self._metadata_at = 0.0
        self._layout: tuple[set, set] | None = None
        self._incarnations: dict[TopicPartition, str] = {}
        self._hb_task: asyncio.Task | None = None
        self._closed = False

    # ---- lifecycle
    async def start(self) -> None:
        await self._cluster.refresh(self.topics)
        self._metadata_at = time.monotonic()
        await self._find_coordinator()
        await self._join()
        self._hb_task = asyncio.get_running_loop().create_task(self._heartbeats())

    async def stop(self) -> None:
        """Commit what was delivered, leave the group, close."""
        self._closed = True
        if self._hb_task is not None:
            self._hb_task.cancel()
            try:
                await self._hb_task
            except asyncio.CancelledError:
                pass
        try:
            if not self._need_rejoin:
                await self.commit()
            if self.member_id:
                L = LeaveGroupRequest
                await self._coord(L(group_id=self.group_id, members=[L.MemberIdentity(member_id=self.member_id)]), 4)
        except (ClientError, StrataClientError) as e:
            log.info("ordered_consumer_leave_failed", error=str(e))
        await self._cluster.close()

    def assignment(self) -> list[TopicPartition]:
        return list(self._assigned)

    def position(self, tp: TopicPartition) -> int:
        return self._position[tp]

    # ---- consuming
    async def getmany(self, timeout_ms: int = 1000) -> dict[TopicPartition, list[ConsumerRecord]]:
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            try:
                if self._need_rejoin:
                    await self._rejoin()
                if time.monotonic() - self._metadata_at > self._metadata_age:
                    await self._refresh()
                limits = await self._limits()
            except GroupError:
                raise
            except (ClientError, StrataClientError, OSError) as e:
                # a leader moved or a partition went away: look again shortly
                log.info("ordered_consumer_retry", error=str(e))
                self._metadata_at = 0.0
                if time.monotonic() >= deadline:
                    return {}
                await asyncio.sleep(0.1)
                continue
            out = await self._fetch(limits, min(self._max_wait_ms, max(0, int((deadline - time.monotonic()) * 1000))))
            if out or time.monotonic() >= deadline:
                return out
            if not any(limits.get(tp, 0) > self._position[tp] for tp in self._assigned):
                await asyncio.sleep(min(0.05, max(0.0, deadline - time.monotonic())))

    async def commit(self) -> None:
        """Commit the delivered position of every assigned partition."""
        OC = OffsetCommitRequest
        by_topic: dict[str, list] = {}
        for (t, p) in self._assigned:
            pos = self._position[(t, p)]
            if self._committed.get((t, p)) != pos and p in self._cluster.topics[t].partitions:
                by_topic.setdefault(t, []).append(OC.OffsetCommitRequestPartition(
                    partition_index=p, committed_offset=pos, committed_leader_epoch=-1,
                    committed_metadata=self._incarnation((t, p))))
        if not by_topic:
            return
        resp = await self._coord(OC(group_id=self.group_id, generation_id_or_member_epoch=self.generation,
                                   member_id=self.member_id, retention_time_ms=-1,
                                   topics=[OC.OffsetCommitRequestTopic(name=t, partitions=ps)
                                           for t, ps in by_topic.items()]), 8)
        for t in resp.topics:
            for p in t.partitions:
                if p.error_code == Errors.UNKNOWN_TOPIC_OR_PARTITION:
                    self._metadata_at = 0.0  # deleted once drained: nothing left to commit
                    continue
                if p.error_code:
                    if p.error_code in _REJOIN:
                        self._need_rejoin = True
                    raise StrataClientError(f"commit of {t.name}-{p.partition_index}: {kafka_error(p.error_code)}")
                self._committed[(t.name, p.partition_index)] = self._position[(t.name, p.partition_index)]

    # ---- gating (section 7)
    async def _limits(self) -> dict[TopicPartition, int]:
        """Per assigned partition: deliver offsets below this (0 while its creation gate is shut)."""
        out = {}
        opened = []
        for tp in self._assigned:
            meta = self._cluster.topics[tp[0]]
            if tp[1] not in meta.partitions:
                out[tp] = 0  # deleted (drained): the next rebalance takes it away
                continue
            if tp not in self._released:
                if not await self._creation_gate_open(meta, tp):
                    out[tp] = 0
                    continue
                self._released.add(tp)
                opened.append(tp)
            out[tp] = await self._upper_limit(meta, tp)
        if opened:
            await _call(self.listener.on_partition_key_assigned, opened)
        return out

    async def _creation_gate_open(self, meta: TopicMeta, tp: TopicPartition) -> bool:
        p = meta.partitions.get(tp[1])
        if p is None or not p.after_creation or tp not in self._gated_start:
            return True
        for prior, epoch in p.after_creation.items():
            if prior not in meta.partitions:
                continue  # deleted: only once empty, i.e. drained
            threshold = await self._threshold(tp[0], prior, epoch)
            if threshold is None:
                return False  # the prior partition's leader has not applied the growth yet
            if threshold > 0 and self._group_position((tp[0], prior)) < threshold:
                if await self._cluster.list_offset(tp[0], prior, EARLIEST) < threshold:
                    return False
        log.info("ordered_partition_released", topic=tp[0], partition=tp[1], member=self.member_id)
        return True

    async def _upper_limit(self, meta: TopicMeta, tp: TopicPartition) -> int:
        limit = _NEVER
        for idx in meta.marked:
            epoch = meta.partitions[idx].before_deletion.get(tp[1])
            if epoch is None:
                continue
            if await self._drained(meta, idx):
                continue  # nothing of it can come after our records any more
            threshold = await self._threshold(tp[0], tp[1], epoch)
            # unknown while our leader has not applied the shrink: deliver nothing yet
            limit = min(limit, self._position[tp] if threshold is None else threshold)
        return limit

    async def _drained(self, meta: TopicMeta, idx: int) -> bool:
        """The group has delivered the marked partition to the end of its last writable epoch
        (the one before the mark bumped it), and that end is final."""
        marked = (meta.name, idx)
        end = self._marked_ends.get(marked)
        if end is None and time.monotonic() - self._marked_asked.get(marked, 0.0) > 0.25:
            self._marked_asked[marked] = time.monotonic()
            # the epoch before ours ends where ours starts: at or after the mark (no data records
            # since, whatever leader changes followed), asked of a leader that has the mark
            answer = await self._cluster.epoch_end(meta.name, idx, meta.partitions[idx].leader_epoch - 1)
            if answer is not None and answer.final:
                end = self._marked_ends[marked] = answer.offset
        return end is not None and self._group_position(marked) >= end

    def _group_position(self, tp: TopicPartition) -> int:
        if tp in self._position and tp in self._assigned:
            return self._position[tp]
        return self._group_pos.get(tp, -1)

    async def _threshold(self, topic: str, partition: int, epoch: int) -> int | None:
        """Where `epoch` ended in the partition; None while its leader has not applied the
        change that ended it. Kept once final; until then asked again each time."""
        key = (topic, partition, epoch)
        if key in self._thresholds:
            return self._thresholds[key]
        answer = await self._cluster.epoch_end(topic, partition, epoch)
        if answer is None:
            return None
        if answer.final:
            self._thresholds[key] = answer.offset
        return answer.offset

    def _interests(self) -> set[TopicPartition]:
        """Partitions whose group position our gates wait on."""
        out = set()
        for tp in self._assigned:
            meta = self._cluster.topics.get(tp[0])
            if meta is None:
                continue
            p = meta.partitions.get(tp[1])
            if tp not in self._released and p is not None and tp in self._gated_start:
                out |= {(tp[0], q) for q in p.after_creation}
            out |= {(tp[0], i) for i in meta.marked if tp[1] in meta.partitions[i].before_deletion}
        return out - set(self._assigned)

    # ---- fetching
    async def _fetch(self, limits: dict[TopicPartition, int], max_wait_ms: int) -> dict:
        by_leader: dict[int, list[TopicPartition]] = {}
        for tp in self._assigned:
            if limits.get(tp, 0) > self._position[tp]:
                leader = self._cluster.topics[tp[0]].partitions[tp[1]].leader
                by_leader.setdefault(leader, []).append(tp)
        if not by_leader:
            return {}
        results = await asyncio.gather(
            *(self._fetch_from(leader, tps, max_wait_ms) for leader, tps in by_leader.items()), return_exceptions=True
        )
        out: dict[TopicPartition, list[ConsumerRecord]] = {}
        for res in results:
            if isinstance(res, BaseException):
                log.info("ordered_consumer_fetch_failed", error=str(res))
                self._metadata_at = 0.0
                continue
            for tp, records in res.items():
                known = self._cluster.topics[tp[0]].partitions[tp[1]].leader_epoch
                kept = []
                position = self._position[tp]
                for r in records:
                    if r.leader_epoch > known:
                        # written after a change our metadata does not show yet (a shrink's epoch
                        # bump): look again before delivering it
                        self._metadata_at = 0.0
                        break
                    if not position <= r.offset < limits[tp]:
                        continue
                    if isinstance(r, ConsumerRecord):
                        kept.append(r)
                    position = r.offset + 1
                if kept:
                    out[tp] = kept
                    self._delivered_epoch[tp] = max(self._delivered_epoch.get(tp, -1), kept[-1].leader_epoch)
                self._position[tp] = position
        return out

    async def _fetch_from(self, leader: int, tps: list[TopicPartition], max_wait_ms: int) -> dict:
        if leader < 0:
            self._metadata_at = 0.0
            return {}
        req = fetch_request({tp: self._position[tp] for tp in tps}, isolation_level=0, max_bytes=50 << 20,
                            partition_max_bytes=self._max_bytes, max_wait_ms=max_wait_ms)
        resp = await self._cluster.request(leader, req, FETCH_VERSION)
        out: dict[TopicPartition, list[ConsumerRecord | _ControlBatch]] = {}
        for tr in resp.responses:
            for pd in tr.partitions:
                tp = (tr.topic, pd.partition_index)
                if pd.error_code == Errors.OFFSET_OUT_OF_RANGE:
                    self._position[tp] = await self._cluster.list_offset(tp[0], tp[1], EARLIEST)
                    continue
                if pd.error_code:
                    self._metadata_at = 0.0
                    continue
                self._high_watermark[tp] = pd.high_watermark
                recs: list[ConsumerRecord | _ControlBatch] = []
                for batch in decode_batches(pd.records or b""):
                    epoch = batch.header.partition_leader_epoch
                    if batch.header.is_control:
                        # a transaction marker: nothing to deliver, but the position passes it
                        # (a marked partition ending with one is drained only past it)
                        recs.append(_ControlBatch(batch.header.last_offset, epoch))
                        continue
                    recs.extend(ConsumerRecord(tp[0], tp[1], r.offset, r.key, r.value, r.timestamp, epoch)
                                for r in batch.records)
                out[tp] = recs
        return out

    async def _refresh(self) -> None:
        await self._cluster.refresh(self.topics)
        self._metadata_at = time.monotonic()
        # a partition deleted once drained may come back under its index (a later growth): what
        # we knew of the old one (the group's position, its end, epoch ends) is not the new one's
        incarnations = {(t, p): self._incarnation((t, p)) for t in self.topics for p in self._cluster.topics[t].partitions}
        self._forget({tp for tp, known in self._incarnations.items() if incarnations.get(tp) != known})
        self._incarnations = incarnations
        # a partition that appeared or was marked changes the assignment: the leader's job
        current = {(t, p) for t in self.topics for p in self._cluster.topics[t].partitions}
        marked = {(t, p) for t in self.topics for p in self._cluster.topics[t].marked}
        if self._layout is not None and (current, marked) != self._layout:
            self._need_rejoin = True
        self._layout = (current, marked)

    def _forget(self, gone: set[TopicPartition]) -> None:
        for state in (self._group_pos, self._marked_ends, self._marked_asked, self._reported, self._high_watermark,
                      self._delivered_epoch):
            for tp in gone:
                state.pop(tp, None)
        for key in [k for k in self._thresholds if k[:2] in gone]:
            del self._thresholds[key]

    # ---- the group
    async def _find_coordinator(self) -> None:
        while True:
            resp = await self._cluster.any_request(FindCoordinatorRequest(key=self.group_id, key_type=0), version=3)
            if resp.error_code == 0:
                self._coordinator = (resp.host, resp.port)
                return
            if resp.error_code not in _COORDINATOR_MOVED:
                raise GroupError(f"FindCoordinator: {kafka_error(resp.error_code, resp.error_message)}")
            await asyncio.sleep(0.2)

    async def _coord(self, body, version: int):
        if self._coordinator is None:
            await self._find_coordinator()
        assert self._coordinator is not None
        try:
            return await (await self._cluster.connection(self._coordinator)).request(body, version)
        except ClientError:
            self._cluster.drop(self._coordinator)
            self._coordinator = None
            raise

    async def _rejoin(self) -> None:
        if self._assigned:
            try:
                await self.commit()
            except (ClientError, StrataClientError) as e:
                log.info("ordered_consumer_commit_before_rejoin_failed", error=str(e))
            await _call(self.listener.on_partition_key_maybe_revoked, list(self._assigned))
        await self._join()

    async def _join(self) -> None:
        while not self._closed:
            try:
                if await self._join_once():
                    return
            except (ClientError, StrataClientError) as e:
                if isinstance(e, GroupError):
                    raise
                log.info("ordered_consumer_join_retry", error=str(e))
                self._coordinator = None
            await asyncio.sleep(0.1)

    async def _join_once(self) -> bool:
        self._assigned = []
        J = JoinGroupRequest
        resp = await self._coord(J(group_id=self.group_id, session_timeout_ms=self._session_ms,
                                   rebalance_timeout_ms=self._rebalance_ms, member_id=self.member_id,
                                   protocol_type=PROTOCOL_TYPE,
                                   protocols=[J.JoinGroupRequestProtocol(PROTOCOL_NAME,
                                                                         encode_subscription(self.topics))]), 5)
        if resp.error_code == Errors.MEMBER_ID_REQUIRED:
            self.member_id = resp.member_id
            return False
        if resp.error_code == Errors.UNKNOWN_MEMBER_ID:
            self.member_id = ""
            return False
        if resp.error_code in _COORDINATOR_MOVED:
            self._coordinator = None
            return False
        if resp.error_code == Errors.REBALANCE_IN_PROGRESS:
            return False
        if resp.error_code:
            raise GroupError(f"JoinGroup to group {self.group_id!r}: {kafka_error(resp.error_code)} (a group of "
                             "OrderedConsumers takes no stock consumers: they cannot gate)")
        self.member_id, self.generation = resp.member_id, resp.generation_id
        assignments = []
        await self._refresh()
        if resp.leader == self.member_id:
            unmarked = [(t, p) for t in self.topics for p in self._cluster.topics[t].unmarked]
            marked = [(t, p) for t in self.topics for p in self._cluster.topics[t].marked]
            plan = assign([m.member_id for m in resp.members], unmarked, marked)
            S = SyncGroupRequest
            for member, tps in plan.items():
                parts: dict[str, list[int]] = {}
                for t, p in tps:
                    parts.setdefault(t, []).append(p)
                assignments.append(S.SyncGroupRequestAssignment(member, encode_assignment(parts)))
        S = SyncGroupRequest
        sync = await self._coord(S(group_id=self.group_id, generation_id=self.generation, member_id=self.member_id,
                                   protocol_type=PROTOCOL_TYPE, protocol_name=PROTOCOL_NAME,
                                   assignments=assignments), 5)
        if sync.error_code:
            if sync.error_code in _COORDINATOR_MOVED:
                self._coordinator = None
            log.info("ordered_consumer_sync_failed", error=error_name(sync.error_code))
            return False
        assigned = [tp for tp in decode_assignment(bytes(sync.assignment)) if tp[0] in self._cluster.topics]
        await self._start_positions(assigned)
        self._assigned = assigned
        self._need_rejoin = False
        log.info("ordered_consumer_assigned", member=self.member_id, generation=self.generation,
                 partitions=",".join(f"{t}-{p}" for t, p in sorted(assigned)))
        return True

    async def _start_positions(self, assigned: list[TopicPartition]) -> None:
        """Section 7 steps 2-4: the committed offset, else the earliest; a partition started from
        its earliest offset passes the creation gate first."""
        OF = OffsetFetchRequest
        by_topic: dict[str, list[int]] = {}
        for t, p in assigned:
            by_topic.setdefault(t, []).append(p)
        committed: dict[TopicPartition, int] = {}
        if by_topic:
            resp = await self._coord(OF(group_id=self.group_id, topics=[OF.OffsetFetchRequestTopic(t, ps)
                                                                      for t, ps in by_topic.items()]), 7)
            if resp.error_code:
                raise StrataClientError(f"OffsetFetch: {kafka_error(resp.error_code)}")
            # an offset committed for an earlier partition of the same index (deleted, then
            # re-created by a growth) is not ours: the coordinator drops those, this covers a
            # commit that raced the deletion
            committed = {
                (t.name, p.partition_index): p.committed_offset
                for t in resp.topics
                for p in t.partitions
                if (p.metadata or "") == self._incarnation((t.name, p.partition_index))
            }
        self._position, self._committed = {}, {}
        self._released, self._gated_start = set(), set()
        for tp in assigned:
            earliest = await self._cluster.list_offset(tp[0], tp[1], EARLIEST)
            start = committed.get(tp, -1)
            if start < 0 or start <= earliest:
                start = earliest
                self._gated_start.add(tp)
            else:
                self._committed[tp] = start
            self._position[tp] = start

    def _worth_reporting(self, tp: TopicPartition) -> bool:
        """KIP-253's condition (section 6): never reported yet, or the position rose to the high
        watermark of the last fetch, or the largest leader epoch delivered rose. The gates wait
        for those crossings (an epoch's end, a marked partition's end); a position that moved
        otherwise is still reported once a second, since a member stopped exactly at an epoch's
        end by its own gate crosses neither."""
        if tp not in self._position:
            return False
        last = self._reported.get(tp)
        if last is None:
            return True
        pos, epoch = self._position[tp], self._delivered_epoch.get(tp, -1)
        return (
            (pos > last[0] and pos >= self._high_watermark.get(tp, _NEVER))
            or epoch > last[1]
            or (pos != last[0] and time.monotonic() - last[2] > 1.0)
        )

    def _incarnation(self, tp: TopicPartition) -> str:
        """Tells a partition from an earlier one of the same index: its LeaderEpochAfterCreation
        map (empty for partitions created with the topic)."""
        p = self._cluster.topics[tp[0]].partitions.get(tp[1])
        if p is None or not p.after_creation:
            return ""
        return "kip253:" + ",".join(f"{q}:{e}" for q, e in sorted(p.after_creation.items()))

    async def _heartbeats(self) -> None:
        H = HeartbeatRequest
        while not self._closed:
            await asyncio.sleep(self._hb_interval)
            if self._need_rejoin or not self.member_id:
                continue
            assigned = set(self._assigned)
            report = {tp: self._position[tp] for tp in self._wanted & assigned
                      if tp[1] in self._cluster.topics[tp[0]].partitions and self._worth_reporting(tp)}
            positions: dict[str, list] = {}
            for (t, p), off in sorted(report.items()):
                positions.setdefault(t, []).append(H.HeartbeatPosition(partition=p, offset=off))
            interested: dict[str, list[int]] = {}
            for t, p in sorted(self._interests()):
                interested.setdefault(t, []).append(p)
            req = H(group_id=self.group_id, generation_id=self.generation, member_id=self.member_id,
                    positions=[H.HeartbeatPositionTopic(topic=t, partitions=ps) for t, ps in positions.items()],
                    interested_partitions=[H.HeartbeatInterestTopic(topic=t, partitions=ps)
                                           for t, ps in interested.items()])
            try:
                resp = await self._coord(req, 4)
            except (ClientError, StrataClientError) as e:
                log.info("ordered_consumer_heartbeat_failed", error=str(e))
                continue
            if resp.error_code in _REJOIN:
                self._need_rejoin = True
                if resp.error_code == Errors.UNKNOWN_MEMBER_ID:
                    self.member_id = ""
            elif resp.error_code in _COORDINATOR_MOVED:
                self._coordinator = None
            if resp.error_code and resp.error_code != Errors.REBALANCE_IN_PROGRESS:
                continue
            for t in resp.positions:
                for p in t.partitions:  # the coordinator keeps the highest; it forgets deleted partitions
                    self._group_pos[(t.topic, p.partition)] = p.offset
            self._wanted = {(t.topic, p) for t in resp.wanted_partitions for p in t.partitions}
            now = time.monotonic()
            self._reported.update({tp: (off, self._delivered_epoch.get(tp, -1), now) for tp, off in report.items()})
            if report:
                await _call(self.listener.on_partition_key_maybe_revoked, sorted(report))


async def _call(fn, partitions: Iterable[TopicPartition]) -> None:
    result = fn(list(partitions))
    if inspect.isawaitable(result):
        await result
