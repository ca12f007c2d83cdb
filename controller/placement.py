"""Replica placement for new partitions.

Goals, in order: a partition's replicas span as many racks as possible (`broker.rack`; brokers
without a rack count as one rack), leaders and replicas spread evenly over the brokers counting
what they already host (least loaded first), and ties broken round-robin from a random start that
advances one broker per partition, as Kafka's StripedReplicaPlacer stripes. Only usable brokers
(registered, unfenced, not in controlled shutdown) are candidates.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from metadata.image import MetadataImage


class PlacementError(Exception):
    """Not enough usable brokers for the replication factor (INVALID_REPLICATION_FACTOR)."""


@dataclass(frozen=True)
class UsableBroker:
    id: int
    rack: str | None


def usable_brokers(image: MetadataImage) -> list[UsableBroker]:
    return sorted(
        (UsableBroker(b.id, b.rack) for b in image.brokers.values() if not b.fenced and not b.in_controlled_shutdown),
        key=lambda b: b.id,
    )


def current_load(image: MetadataImage) -> tuple[Counter, Counter]:
    """(replicas per broker, leaderships per broker) over every partition in the image."""
    replicas: Counter = Counter()
    leaders: Counter = Counter()
    for t in image.topics.values():
        for p in t.partitions.values():
            replicas.update(p.replicas)
            if p.leader >= 0:
                leaders[p.leader] += 1
    return replicas, leaders


def _interleave_racks(brokers: list[UsableBroker]) -> list[UsableBroker]:
    """a1, b1, c1, a2, b2, c2, ...: neighbours on the ring sit in different racks, so the
    round-robin tie-break stripes each partition across racks and spreads load evenly."""
    by_rack: dict[str | None, list[UsableBroker]] = {}
    for b in sorted(brokers, key=lambda b: b.id):
        by_rack.setdefault(b.rack, []).append(b)
    lists = [by_rack[r] for r in sorted(by_rack, key=lambda r: (r is not None, r or ""))]
    out: list[UsableBroker] = []
    for i in range(max((len(x) for x in lists), default=0)):
        out.extend(x[i] for x in lists if i < len(x))
    return out


class ReplicaPlacer:
    def __init__(self, rng: random.Random | None = None) -> None:
        self.rng = rng or random.Random()

    def place(
        self,
        brokers: Iterable[UsableBroker],
        num_partitions: int,
        replication_factor: int,
        replica_load: Counter,
        leader_load: Counter,
    ) -> list[list[int]]:
        """Replica lists (leader first) for num_partitions partitions. The load counters are
        updated in place, so several topics placed in one operation balance with each other."""
        ring = _interleave_racks(list(brokers))
        if replication_factor <= 0:
            raise PlacementError("the replication factor must be at least 1")
        if replication_factor > len(ring):
            raise PlacementError(
                f"The target replication factor of {replication_factor} cannot be reached because only "
                f"{len(ring)} broker(s) are usable (registered, unfenced and not shutting down)."
            )
        n = len(ring)
        start = self.rng.randrange(n)
        out = []
        for p in range(num_partitions):
            first = (start + p) % n

            def distance(i: int, origin: int = first) -> int:
                return (i - origin) % n

            # Leader: fewest leaderships, then fewest replicas, then round-robin position.
            li = min(range(n), key=lambda i: (leader_load[ring[i].id], replica_load[ring[i].id], distance(i)))
            chosen = [li]
            racks = {ring[li].rack}
            while len(chosen) < replication_factor:
                rest = [i for i in range(n) if i not in chosen]
                fresh = [i for i in rest if ring[i].rack not in racks]
                pool = fresh or rest
                nxt = min(pool, key=lambda i: (replica_load[ring[i].id], distance(i, li)))
                chosen.append(nxt)
                racks.add(ring[nxt].rack)
            ids = [ring[i].id for i in chosen]
            leader_load[ids[0]] += 1
            replica_load.update(ids)
            out.append(ids)
        return out
