"""The consumer group wire formats and assignment OrderedConsumer uses (classic protocol)."""

from __future__ import annotations

import struct

PROTOCOL_TYPE = "consumer"
# Stock consumers offer range/roundrobin/sticky: a group of OrderedConsumers shares no protocol
# with them, so the coordinator refuses them (INCONSISTENT_GROUP_PROTOCOL): they cannot gate.
PROTOCOL_NAME = "strata-ordered"


def _string(s: str) -> bytes:
    b = s.encode()
    return struct.pack(">h", len(b)) + b


def encode_subscription(topics: list[str]) -> bytes:
    """ConsumerProtocolSubscription v0: topics, no user data."""
    return struct.pack(">hi", 0, len(topics)) + b"".join(_string(t) for t in topics) + struct.pack(">i", -1)


def encode_assignment(partitions: dict[str, list[int]]) -> bytes:
    """ConsumerProtocolAssignment v0."""
    out = [struct.pack(">hi", 0, len(partitions))]
    for topic, parts in sorted(partitions.items()):
        out.append(_string(topic) + struct.pack(">i", len(parts)) + b"".join(struct.pack(">i", p) for p in parts))
    out.append(struct.pack(">i", -1))
    return b"".join(out)


def decode_assignment(data: bytes) -> list[tuple[str, int]]:
    if not data:
        return []
    mv = memoryview(data)
    pos = 2
    (n,) = struct.unpack_from(">i", mv, pos)
    pos += 4
    out = []
    for _ in range(n):
        (ln,) = struct.unpack_from(">h", mv, pos)
        topic = bytes(mv[pos + 2 : pos + 2 + ln]).decode()
        pos += 2 + ln
        (k,) = struct.unpack_from(">i", mv, pos)
        pos += 4
        for _ in range(k):
            out.append((topic, struct.unpack_from(">i", mv, pos)[0]))
            pos += 4
    return out


def assign(members: list[str], unmarked: list[tuple[str, int]], marked: list[tuple[str, int]]) -> dict[str, list]:
    """KIP-253 section 5: partitions marked for deletion get no new data, so they are spread apart
    from the others; each list is dealt round robin over the members (sorted)."""
    members = sorted(members)
    out: dict[str, list[tuple[str, int]]] = {m: [] for m in members}
    dealt = 0  # the marked deal starts where the unmarked one stopped
    for group in (unmarked, marked):
        for i, tp in enumerate(sorted(group)):
            out[members[(dealt + i) % len(members)]].append(tp)
        dealt += len(group)
    return out
