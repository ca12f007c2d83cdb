"""Leader and ISR changes: the one place that decides a partition's next leader and ISR.

Fencing, controlled shutdown and unfencing use it now; AlterPartition, preferred/unclean
elections and reassignments (next issue) build on the same `change_partition`.

Rules (Kafka's, with unclean election off unless the topic enables it):
- a leader must be in the ISR and usable (registered, unfenced, not shutting down);
- removing a broker from the ISR never empties it: the last member stays, so the replica that has
  every acknowledged record is known, and the partition has no leader (-1) until it is back;
- with unclean.leader.election.enable, a leaderless partition may elect any usable replica,
  which then becomes the whole ISR (data the old ISR had may be lost, as the setting says).
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from metadata.image import NO_LEADER, MetadataImage, PartitionInfo
from protocol.generated.metadata_records.partition_change_record import PartitionChangeRecord

NO_CHANGE = -2  # PartitionChangeRecord.Leader: leader unchanged


def usable_ids(image: MetadataImage) -> set[int]:
    return {b.id for b in image.brokers.values() if not b.fenced and not b.in_controlled_shutdown}


def change_partition(
    p: PartitionInfo,
    usable: Collection[int],
    *,
    target_isr: list[int] | None = None,
    unclean: bool = False,
) -> PartitionChangeRecord | None:
    """The record moving `p` to `target_isr` (default: unchanged) with a valid leader, or None
    when nothing changes. `usable` are the brokers that may lead."""
    isr = list(p.isr) if target_isr is None else target_isr
    if not isr:
        isr = list(p.isr)  # never empty the ISR
    leader = p.leader
    if leader not in isr or leader not in usable:
        leader = next((r for r in p.replicas if r in isr and r in usable), NO_LEADER)
        if leader == NO_LEADER and unclean:
            leader = next((r for r in p.replicas if r in usable), NO_LEADER)
            if leader != NO_LEADER:
                isr = [leader]
    isr_changed = tuple(isr) != p.isr
    if not isr_changed and leader == p.leader:
        return None
    return PartitionChangeRecord(
        partition_id=p.partition,
        topic_id=p.topic_id,
        isr=list(isr) if isr_changed else None,
        leader=leader if leader != p.leader else NO_CHANGE,
    )


def remove_broker(
    image: MetadataImage, broker_id: int, usable: Collection[int], unclean_for: Callable[[str], bool]
) -> list[PartitionChangeRecord]:
    """Changes taking `broker_id` out of every ISR it is in and every leadership it holds
    (fencing, controlled shutdown, a new incarnation replacing an old one)."""
    out = []
    usable = set(usable) - {broker_id}
    for t in image.topics.values():
        unclean = None
        for p in t.partitions.values():
            if broker_id not in p.isr and p.leader != broker_id:
                continue
            if unclean is None:
                unclean = unclean_for(t.name)
            target = [r for r in p.isr if r != broker_id]
            rec = change_partition(p, usable, target_isr=target, unclean=unclean)
            if rec is not None:
                out.append(rec)
    return out


def elect_leaderless(
    image: MetadataImage, usable: Collection[int], unclean_for: Callable[[str], bool], only_broker: int | None = None
) -> list[PartitionChangeRecord]:
    """Leaders for partitions that have none, now that `usable` changed (a broker unfenced).
    With only_broker, only partitions that broker could lead are looked at."""
    out = []
    for t in image.topics.values():
        unclean = None
        for p in t.partitions.values():
            if p.leader != NO_LEADER:
                continue
            if only_broker is not None and only_broker not in p.replicas:
                continue
            if unclean is None:
                unclean = unclean_for(t.name)
            rec = change_partition(p, usable, unclean=unclean)
            if rec is not None:
                out.append(rec)
    return out


def leaderships(image: MetadataImage, broker_id: int) -> int:
    return sum(1 for t in image.topics.values() for p in t.partitions.values() if p.leader == broker_id)
