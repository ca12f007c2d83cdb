"""Server-side assignors of KIP-848 consumer groups (`group.consumer.assignors`; a member picks
one with `group.remote.assignor`): `uniform` (Kafka's UniformAssignor) and `range` (Kafka's
RangeAssignor). Pure functions from the members' subscriptions, racks and current targets and
the subscribed topics' partitions to the new target assignment.

uniform: sticky and balanced. A member keeps the partitions of its current target that it still
subscribes to, as long as that keeps the group balanced (no member more than one partition above
another that could take it); the rest go to the least loaded member that subscribes to them,
preferring a member in one of the partition's replica racks (KIP-881). So a member joining or
leaving moves only the partitions that must move.

range: per topic, the subscribed members in order (static members first, by instance id, then
the others by member id) each take a contiguous range, the first ones one more when the count
does not divide; members subscribed to the same topics get the same partition numbers of each
(co-partitioning). Not sticky, as Kafka's RangeAssignor since its rewrite: co-partitioning and
stickiness do not go together, so the ranges are dealt afresh each time, and a static member
(KIP-345) keeps its place, hence its ranges, by its instance id across restarts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from uuid import UUID

from broker.coordinator.group.consumer_records import Assignment

UNIFORM, RANGE = "uniform", "range"


@dataclass(frozen=True)
class MemberSpec:
    topics: frozenset[UUID]  # the subscribed topics that exist, by id
    rack: str | None = None
    current: Assignment = field(default_factory=dict)  # the member's part of the current target
    instance_id: str | None = None  # a static member's group.instance.id


@dataclass(frozen=True)
class TopicSpec:
    partitions: int
    racks: Mapping[int, frozenset[str]] = field(default_factory=dict)  # partition -> its replicas' racks


Assignor = Callable[[Mapping[str, MemberSpec], Mapping[UUID, TopicSpec]], dict[str, Assignment]]
TP = tuple[UUID, int]


def _freeze(owned: dict[str, set[TP]]) -> dict[str, Assignment]:
    out: dict[str, Assignment] = {}
    for mid, tps in owned.items():
        a: dict[UUID, set[int]] = {}
        for tid, p in tps:
            a.setdefault(tid, set()).add(p)
        out[mid] = {tid: frozenset(ps) for tid, ps in a.items()}
    return out


def uniform(members: Mapping[str, MemberSpec], topics: Mapping[UUID, TopicSpec]) -> dict[str, Assignment]:
    order = sorted(members)
    owned: dict[str, set[TP]] = {mid: set() for mid in order}
    owner: dict[TP, str] = {}

    def rack_match(mid: str, tp: TP) -> bool:
        rack = members[mid].rack
        spec = topics[tp[0]]
        return rack is not None and rack in spec.racks.get(tp[1], frozenset())

    # 1. stickiness: current targets that still exist and are still subscribed
    for mid in order:
        spec = members[mid]
        for tid, parts in spec.current.items():
            t = topics.get(tid)
            if t is None or tid not in spec.topics:
                continue
            for p in sorted(parts):
                if p < t.partitions and (tid, p) not in owner:
                    owner[(tid, p)] = mid
                    owned[mid].add((tid, p))
    # 2. shed what is over a fair share when every member subscribes to the same topics (the
    #    common case: then the quotas are exact, and the freed partitions go to members below)
    subs = {members[m].topics for m in order}
    if len(subs) == 1 and order:
        total = sum(topics[t].partitions for t in next(iter(subs)) if t in topics)
        base, extra = divmod(total, len(order))
        # members already holding more keep the extra slots, so fewer partitions move
        for i, mid in enumerate(sorted(order, key=lambda m: (-len(owned[m]), m))):
            quota = base + (1 if i < extra else 0)
            if len(owned[mid]) > quota:
                # give up the partitions outside the member's rack first
                for tp in sorted(owned[mid], key=lambda tp: (rack_match(mid, tp), tp))[: len(owned[mid]) - quota]:
                    owned[mid].discard(tp)
                    del owner[tp]
    # 3. the unowned partitions, each to the least loaded member that may take it
    for tid in sorted(topics):
        eligible = [m for m in order if tid in members[m].topics]
        if not eligible:
            continue
        for p in range(topics[tid].partitions):
            tp = (tid, p)
            if tp in owner:
                continue
            mid = min(eligible, key=lambda m: (len(owned[m]), not rack_match(m, tp), m))
            owner[tp] = mid
            owned[mid].add(tp)
    # 4. balance what stickiness left uneven (members with different subscriptions)
    for _ in range(len(owner)):
        moved = False
        for a in sorted(order, key=lambda m: (-len(owned[m]), m)):
            for tp in sorted(owned[a], key=lambda tp: tp):
                takers = [b for b in order if tp[0] in members[b].topics and len(owned[b]) < len(owned[a]) - 1]
                if takers:
                    b = min(takers, key=lambda m: (len(owned[m]), not rack_match(m, tp), m))
                    owned[a].discard(tp)
                    owned[b].add(tp)
                    owner[tp] = b
                    moved = True
                    break
            if moved:
                break
        if not moved:
            break
    return _freeze(owned)


def range_(members: Mapping[str, MemberSpec], topics: Mapping[UUID, TopicSpec]) -> dict[str, Assignment]:
    owned: dict[str, set[TP]] = {mid: set() for mid in members}

    def place(mid: str) -> tuple[int, str]:
        instance = members[mid].instance_id
        return (0, instance) if instance is not None else (1, mid)

    for tid in sorted(topics):
        subscribers = sorted((m for m, spec in members.items() if tid in spec.topics), key=place)
        if not subscribers:
            continue
        n = topics[tid].partitions
        per, extra = divmod(n, len(subscribers))
        start = 0
        for i, mid in enumerate(subscribers):
            count = per + (1 if i < extra else 0)
            owned[mid].update((tid, p) for p in range(start, start + count))
            start += count
    return _freeze(owned)


ASSIGNORS: dict[str, Assignor] = {UNIFORM: uniform, RANGE: range_}
