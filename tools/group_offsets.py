"""A consumer group's committed offsets as the tools read and write them (OffsetFetch,
OffsetCommit): kafka-consumer-groups.sh as an admin (no member), kafka-console-consumer.sh as a
member of its group (tools/group_member.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from protocol.generated.offset_commit import OffsetCommitRequest
from protocol.generated.offset_fetch import OffsetFetchRequest
from tools.brokers import TopicPartition

OFFSET_FETCH_VERSION = 7  # the group at the top level (v8 batches groups)


def offset_fetch_request(group: str, tps: list[TopicPartition] | None) -> OffsetFetchRequest:
    """The committed offsets of `tps` (None: every partition the group has committed)."""
    F = OffsetFetchRequest
    if tps is None:
        return F(group_id=group, topics=None)
    by_topic: dict[str, list[int]] = {}
    for t, p in tps:
        by_topic.setdefault(t, []).append(p)
    return F(group_id=group, topics=[F.OffsetFetchRequestTopic(name=t, partition_indexes=ps)
                                     for t, ps in by_topic.items()])


def offset_commit_request(group: str, positions: dict[TopicPartition, int], *, generation: int = -1,
                          member_id: str = "") -> OffsetCommitRequest:
    """A commit of `positions`; generation -1 and no member id: an admin's commit to a group
    without members."""
    R = OffsetCommitRequest
    by_topic: dict[str, list] = {}
    for (t, p), off in sorted(positions.items()):
        by_topic.setdefault(t, []).append(R.OffsetCommitRequestPartition(partition_index=p, committed_offset=off,
                                                                         committed_metadata=""))
    return R(group_id=group, generation_id_or_member_epoch=generation, member_id=member_id,
             topics=[R.OffsetCommitRequestTopic(name=t, partitions=ps) for t, ps in by_topic.items()])


def partition_results(resp: Any) -> Iterator[tuple[TopicPartition, Any]]:
    """Each partition's answer of an OffsetFetch or OffsetCommit response."""
    for t in resp.topics:
        for p in t.partitions:
            yield (t.name, p.partition_index), p
