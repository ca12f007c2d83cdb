"""Online migration between the classic and the consumer protocol (KIP-848, "Upgrade and
downgrade"; Kafka's ConsumerGroup.fromClassicGroup and ClassicGroup.fromConsumerGroup): a live
classic group becomes a consumer group when a consumer-protocol member joins it, its classic
members kept (they go on with JoinGroup, SyncGroup and Heartbeat, answered from the consumer
group's target assignment), and goes back to a classic group when the last consumer-protocol
member leaves. Pure: the consumer group manager writes the records and runs the timers.

The classic members' subscriptions and assignments are the consumer protocol's embedded formats
(ConsumerProtocolSubscription v0-3, ConsumerProtocolAssignment v0), read and written here.
"""

from __future__ import annotations

import struct

from broker.coordinator.group.consumer_group import ConsumerGroup, ConsumerMember, MemberState
from broker.coordinator.group.consumer_records import Assignment
from broker.coordinator.group.group import ClassicGroup, GroupState, Member
from metadata.image import MetadataImage

UPGRADE_POLICIES = frozenset({"upgrade", "bidirectional"})
DOWNGRADE_POLICIES = frozenset({"downgrade", "bidirectional"})


class _Cursor:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def unpack(self, fmt: str) -> int:
        (v,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return v

    def string(self) -> str | None:
        n = self.unpack(">h")
        if n < 0:
            return None
        if self.pos + n > len(self.data):
            raise ValueError("string past the end")
        s = self.data[self.pos:self.pos + n].decode()
        self.pos += n
        return s

    def count(self) -> int:
        n = self.unpack(">i")
        if n > len(self.data):
            raise ValueError("bad array length")
        return max(n, 0)

    @property
    def more(self) -> bool:
        return self.pos < len(self.data)


def parse_subscription(data: bytes) -> tuple[list[str], dict[str, list[int]]]:
    """(topics, owned partitions by topic) of a ConsumerProtocolSubscription; owned from v1."""
    try:
        c = _Cursor(data)
        version = c.unpack(">h")
        topics = [t for t in (c.string() for _ in range(c.count())) if t is not None]
        n = c.unpack(">i")  # user data
        c.pos += max(n, 0)
        owned: dict[str, list[int]] = {}
        if version >= 1 and c.more:
            for _ in range(c.count()):
                t = c.string() or ""
                owned[t] = [c.unpack(">i") for _ in range(c.count())]
        return topics, owned
    except (struct.error, UnicodeDecodeError) as e:
        raise ValueError(f"not a consumer protocol subscription: {e}") from None


def parse_assignment(data: bytes) -> dict[str, list[int]]:
    if not data:
        return {}
    try:
        c = _Cursor(data)
        c.unpack(">h")
        out: dict[str, list[int]] = {}
        for _ in range(c.count()):
            t = c.string() or ""
            out[t] = [c.unpack(">i") for _ in range(c.count())]
        return out
    except (struct.error, UnicodeDecodeError) as e:
        raise ValueError(f"not a consumer protocol assignment: {e}") from None


def encode_assignment(partitions: dict[str, list[int]]) -> bytes:
    out = bytearray(struct.pack(">hi", 0, len(partitions)))
    for t, ps in sorted(partitions.items()):
        b = t.encode()
        out += struct.pack(">h", len(b)) + b + struct.pack(">i", len(ps))
        for p in sorted(ps):
            out += struct.pack(">i", p)
    return bytes(out + struct.pack(">i", -1))


def by_id(image: MetadataImage, by_name: dict[str, list[int]]) -> Assignment:
    out: Assignment = {}
    for t, ps in by_name.items():
        tid = image.topic_ids.get(t)
        if tid is not None and ps:
            out[tid] = frozenset(ps)
    return out


def by_name(image: MetadataImage, a: Assignment) -> dict[str, list[int]]:
    out = {}
    for tid, ps in a.items():
        t = image.topics.get(tid)
        if t is not None and ps:
            out[t.name] = sorted(ps)
    return out


def classic_member(m: ConsumerMember) -> bool:
    return m.classic_protocols is not None


def consumer_group_from_classic(classic: ClassicGroup, image: MetadataImage) -> ConsumerGroup:
    """A stable classic group of the consumer protocol type as a consumer group: each member keeps
    its assignment as its target, at the classic generation as member and group epoch."""
    group = ConsumerGroup(classic.group_id)
    epoch = classic.generation_id
    protocol = classic.protocol_name or ""
    for m in classic.members.values():
        meta = next((b for n, b in m.protocols if n == protocol), m.protocols[0][1] if m.protocols else b"")
        try:
            topics, _ = parse_subscription(meta)
        except ValueError:
            topics = []
        assigned = by_id(image, parse_assignment(m.assignment))
        cm = ConsumerMember(m.member_id, instance_id=m.group_instance_id, client_id=m.client_id,
                            client_host=m.client_host, subscribed_topic_names=tuple(sorted(set(topics))),
                            rebalance_timeout_ms=m.rebalance_timeout_ms, member_epoch=epoch, previous_member_epoch=epoch,
                            state=MemberState.STABLE, assigned=assigned,
                            classic_session_timeout_ms=m.session_timeout_ms, classic_protocols=list(m.protocols))
        group.put_member(cm)
        group.targets[m.member_id] = assigned
    group.group_epoch = group.assignment_epoch = epoch
    return group


def classic_group_from_consumer(group: ConsumerGroup, image: MetadataImage) -> ClassicGroup:
    """A consumer group whose members all speak the classic protocol as a classic group, its
    members keeping their assignments; the classic manager then has them rejoin."""
    classic = ClassicGroup(group.group_id, GroupState.STABLE)
    classic.generation_id = group.group_epoch
    for m in group.members.values():
        protocols = m.classic_protocols or []
        member = Member(m.member_id, m.instance_id, m.client_id, m.client_host, max(m.rebalance_timeout_ms, 0),
                        m.classic_session_timeout_ms or 45000, "consumer", protocols)
        member.assignment = encode_assignment(by_name(image, m.assigned))
        classic.add(member)
    classic.protocol_name = classic.select_protocol() if classic.members else None
    classic.subscribed_topics = classic.compute_subscribed_topics()
    return classic


def protocol_name(m: ConsumerMember) -> str:
    return m.classic_protocols[0][0] if m.classic_protocols else ""
