"""A share group's membership as the coordinator keeps it (KIP-932, "Share group membership"):
the members, their subscriptions and the partitions each may read, under a group epoch.

Kafka's simple assignor for share groups: every member may read every partition of the topics it
subscribes to (records, not partitions, are what members share; the partition leaders hand each
record to one member at a time). The member epoch moves to the group epoch each time a member's
assignment changes, as in KIP-848.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from uuid import UUID

from metadata.image import MetadataImage

Assignment = dict[UUID, frozenset[int]]

EMPTY, STABLE = "Empty", "Stable"
SIMPLE_ASSIGNOR = "simple"


@dataclass
class ShareMember:
    member_id: str
    member_epoch: int
    client_id: str
    client_host: str
    rack_id: str | None
    subscribed_topic_names: tuple[str, ...]
    assigned: Assignment = field(default_factory=dict)
    session_timer: asyncio.TimerHandle | None = None


class ShareGroup:
    type = "share"

    def __init__(self, group_id: str, partition_epoch: int) -> None:
        self.group_id = group_id
        # the coordinator partition's leader epoch when the group was made here: a group held
        # from an earlier leadership is dropped, not resumed (membership is not yet durable)
        self.partition_epoch = partition_epoch
        self.group_epoch = 0
        self.assignment_epoch = 0
        self.members: dict[str, ShareMember] = {}
        # every topic a member subscribed to since the group was made here: what the offsets
        # APIs describe for the whole group (Kafka records the initialized share-partitions)
        self.seen_topics: set[str] = set()
        # (group epoch, topics) as last written to __consumer_offsets; None: never written
        self.written: tuple[int, frozenset[str]] | None = None

    @property
    def state_name(self) -> str:
        return EMPTY if not self.members else STABLE

    def subscribed_topics(self) -> set[str]:
        return {t for m in self.members.values() for t in m.subscribed_topic_names}

    def cancel_timers(self) -> None:
        for m in self.members.values():
            if m.session_timer is not None:
                m.session_timer.cancel()
                m.session_timer = None


def simple_assignment(image: MetadataImage, topics: tuple[str, ...]) -> Assignment:
    """Every partition of every subscribed topic that exists (Kafka's SimpleAssignor with
    members sharing partitions)."""
    out: Assignment = {}
    for name in topics:
        info = image.topic(name)
        if info is not None and info.partitions:
            out[info.id] = frozenset(info.partitions)
    return out
