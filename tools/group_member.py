"""A classic-protocol consumer group member for kafka-console-consumer.sh --group: JoinGroup with
Kafka's "consumer" protocol type and its "range" assignor (so stock consumers can share the
group), SyncGroup, heartbeats, offset commits and LeaveGroup.

The member joins, and when it leads computes the range assignment (per topic, partitions split in
order over the members sorted by id, the first ones taking one more). A heartbeat answered
REBALANCE_IN_PROGRESS (or a lost membership) sets `rejoin`; the consumer commits what it has
delivered, then calls join() again.
"""

from __future__ import annotations

import asyncio
import struct

from client.group import decode_assignment, encode_assignment, encode_subscription
from protocol.errors import Errors, error_message
from protocol.generated.heartbeat import HeartbeatRequest
from protocol.generated.join_group import JoinGroupRequest
from protocol.generated.leave_group import LeaveGroupRequest
from protocol.generated.sync_group import SyncGroupRequest
from tools.admin import AdminError
from tools.brokers import Brokers, TopicPartition, tp_str
from tools.group_offsets import OFFSET_FETCH_VERSION, offset_commit_request, offset_fetch_request, partition_results

PROTOCOL_TYPE = "consumer"
ASSIGNOR = "range"
_REJOIN = {Errors.REBALANCE_IN_PROGRESS, Errors.ILLEGAL_GENERATION, Errors.UNKNOWN_MEMBER_ID}
_RETRY = {Errors.COORDINATOR_NOT_AVAILABLE, Errors.NOT_COORDINATOR, Errors.COORDINATOR_LOAD_IN_PROGRESS,
          Errors.REBALANCE_IN_PROGRESS}


def range_assign(members: list[str], partitions: dict[str, list[int]]) -> dict[str, dict[str, list[int]]]:
    """Kafka's RangeAssignor for members subscribed to every topic."""
    out: dict[str, dict[str, list[int]]] = {m: {} for m in members}
    ordered = sorted(members)
    for topic, parts in sorted(partitions.items()):
        parts = sorted(parts)
        each, extra = divmod(len(parts), len(ordered))
        start = 0
        for i, m in enumerate(ordered):
            n = each + (1 if i < extra else 0)
            if n:
                out[m][topic] = parts[start:start + n]
            start += n
    return out


class GroupMember:
    def __init__(self, brokers: Brokers, group: str, topics: list[str], *, session_timeout_ms: int = 10000,
                 rebalance_timeout_ms: int = 30000, heartbeat_interval: float = 1.0) -> None:
        self.brokers = brokers
        self.group = group
        self.topics = topics
        self.session_timeout_ms = session_timeout_ms
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.heartbeat_interval = heartbeat_interval
        self.member_id = ""
        self.generation = -1
        self.assignment: list[TopicPartition] = []
        self.rejoin = True
        self._hb: asyncio.Task | None = None

    async def _coord(self, body, version: int):
        return await self.brokers.to_coordinator(self.group, body, version)

    async def join(self, deadline_s: float = 60.0) -> list[TopicPartition]:
        """Join (or rejoin) the group; the partitions this member was given."""
        loop = asyncio.get_running_loop()
        end = loop.time() + deadline_s
        while True:
            if loop.time() > end:
                raise AdminError(f"could not join group '{self.group}' in {deadline_s:.0f}s")
            code = await self._join_once()
            if code == 0:
                break
            if code not in _RETRY and code not in (Errors.MEMBER_ID_REQUIRED, Errors.UNKNOWN_MEMBER_ID):
                raise AdminError(f"cannot join group '{self.group}': {error_message(code)}", code)
            if code in _RETRY:
                await asyncio.sleep(0.1)
        self.rejoin = False
        if self._hb is None or self._hb.done():
            self._hb = asyncio.get_running_loop().create_task(self._heartbeats())
        return self.assignment

    async def _join_once(self) -> int:
        J = JoinGroupRequest
        resp = await self._coord(J(group_id=self.group, session_timeout_ms=self.session_timeout_ms,
                                   rebalance_timeout_ms=self.rebalance_timeout_ms, member_id=self.member_id,
                                   protocol_type=PROTOCOL_TYPE,
                                   protocols=[J.JoinGroupRequestProtocol(ASSIGNOR, encode_subscription(self.topics))]),
                                 5)
        if resp.error_code == Errors.MEMBER_ID_REQUIRED:
            self.member_id = resp.member_id
            return resp.error_code
        if resp.error_code == Errors.UNKNOWN_MEMBER_ID:
            self.member_id = ""
            return resp.error_code
        if resp.error_code:
            return resp.error_code
        self.member_id, self.generation = resp.member_id, resp.generation_id
        S = SyncGroupRequest
        assignments = []
        if resp.leader == self.member_id:
            subscribed = sorted({t for m in resp.members for t in _subscription_topics(bytes(m.metadata))})
            parts: dict[str, list[int]] = {}
            for t, p in await self.brokers.partitions_of(subscribed):
                parts.setdefault(t, []).append(p)
            plan = range_assign([m.member_id for m in resp.members], parts)
            assignments = [S.SyncGroupRequestAssignment(m, encode_assignment(a)) for m, a in plan.items()]
        sync = await self._coord(S(group_id=self.group, generation_id=self.generation, member_id=self.member_id,
                                   protocol_type=PROTOCOL_TYPE, protocol_name=ASSIGNOR, assignments=assignments), 5)
        if sync.error_code:
            return sync.error_code
        self.assignment = sorted(tp for tp in decode_assignment(bytes(sync.assignment)) if tp[0] in self.topics)
        return 0

    async def _heartbeats(self) -> None:
        H = HeartbeatRequest
        while True:
            await asyncio.sleep(self.heartbeat_interval)
            if self.rejoin:
                continue
            try:
                resp = await self._coord(H(group_id=self.group, generation_id=self.generation,
                                           member_id=self.member_id), 4)
            except AdminError:
                continue  # the coordinator moved or is restarting: the next beat finds it again
            if resp.error_code in _REJOIN:
                self.rejoin = True
                if resp.error_code == Errors.UNKNOWN_MEMBER_ID:
                    self.member_id = ""

    async def committed(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        resp = await self._coord(offset_fetch_request(self.group, tps), OFFSET_FETCH_VERSION)
        if resp.error_code:
            raise AdminError(f"cannot fetch the offsets of group '{self.group}': {error_message(resp.error_code)}",
                             resp.error_code)
        return {tp: p.committed_offset for tp, p in partition_results(resp) if p.error_code == 0 and p.committed_offset >= 0}

    async def commit(self, positions: dict[TopicPartition, int]) -> None:
        if not positions:
            return
        resp = await self._coord(offset_commit_request(self.group, positions, generation=self.generation,
                                                       member_id=self.member_id), 8)
        for tp, p in partition_results(resp):
            if p.error_code in _REJOIN:
                self.rejoin = True
            elif p.error_code:
                raise AdminError(f"cannot commit the offset of {tp_str(tp)} for group "
                                 f"'{self.group}': {error_message(p.error_code)}", p.error_code)

    async def leave(self) -> None:
        if self._hb is not None:
            self._hb.cancel()
        if self.member_id:
            L = LeaveGroupRequest
            try:
                await self._coord(L(group_id=self.group, members=[L.MemberIdentity(member_id=self.member_id)]), 4)
            except AdminError:
                pass  # the session runs out on its own


def _subscription_topics(data: bytes) -> list[str]:
    """The topics of a ConsumerProtocolSubscription (any version: the topic list comes first)."""
    try:
        (n,) = struct.unpack_from(">i", data, 2)
        pos, out = 6, []
        for _ in range(max(n, 0)):
            (ln,) = struct.unpack_from(">h", data, pos)
            out.append(data[pos + 2:pos + 2 + ln].decode())
            pos += 2 + ln
        return out
    except (struct.error, UnicodeDecodeError):
        return []
