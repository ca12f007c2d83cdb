"""Leader, ISR and replica-set changes: the one place that decides a partition's next state.

Fencing, controlled shutdown, unfencing, AlterPartition, leader elections and reassignments all
describe what they want (a target ISR, replica list, adding/removing sets, an election kind) and
`build_change` turns it into one PartitionChangeRecord, following Kafka's PartitionChangeBuilder:

1. A reassignment in progress (adding or removing replicas) completes as soon as the target ISR
   minus the removing replicas is non-empty and holds every replica of the final set: replicas
   become the final set, the ISR loses the removing replicas, adding/removing are cleared.
2. Election. A leader is valid when it is in the target ISR and usable (registered, unfenced,
   not shutting down). `online` keeps a valid current leader, else takes the first valid replica
   in replica order; `preferred` first tries the first replica; `unclean` is `online` that, when
   no replica is valid, takes the first usable replica and makes it the whole ISR (acknowledged
   data the old ISR had may be lost, as unclean.leader.election.enable says). Without any, the
   leader is -1 (offline).
3. The ISR is never emptied: a target ISR with nobody left keeps the current one, so the last
   member (the replica with every acknowledged record) stays known while the partition is
   offline, and leads again when it comes back.
4. Leader epochs: the record names a new leader only when it changes (the leader epoch then
   bumps); an ISR change alone bumps only the partition epoch. When a reassignment drops
   replicas without changing the leader, the record names the current leader again, as Kafka
   does: Kafka's replay bumps the leader epoch for any named leader, which fences the dropped
   replicas (metadata/image.py bumps it only when the leader differs, so for now that record
   bumps just the partition epoch).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Literal
from uuid import UUID

from metadata.image import NO_LEADER, MetadataImage, PartitionInfo
from protocol.generated.metadata_records.partition_change_record import PartitionChangeRecord

NO_CHANGE = -2  # PartitionChangeRecord.Leader: leader unchanged
ZERO_UUID = UUID(int=0)

Election = Literal["online", "preferred", "unclean"]


def usable_ids(image: MetadataImage) -> set[int]:
    return {b.id for b in image.brokers.values() if not b.fenced and not b.in_controlled_shutdown}


def default_directory(image: MetadataImage, broker_id: int) -> UUID:
    """Kafka's rule: a broker with exactly one log dir gets it; otherwise unassigned (zero) until
    the broker reports where the replica lives."""
    b = image.brokers.get(broker_id)
    return b.log_dirs[0] if b is not None and len(b.log_dirs) == 1 else ZERO_UUID


def dir_online(image: MetadataImage, broker_id: int, dir_id: UUID) -> bool:
    """Kafka's rule (KIP-858): a replica whose dir is unassigned (zero) counts as online; one
    assigned to a dir its broker does not list as online (reported offline, missing after a
    restart) does not, and may not lead."""
    if dir_id == ZERO_UUID:
        return True
    b = image.brokers.get(broker_id)
    return b is None or not b.log_dirs or dir_id in b.log_dirs


def directory_of(p: PartitionInfo, broker_id: int) -> UUID:
    """The log dir the metadata gives `broker_id`'s replica of `p` (zero: unassigned)."""
    for r, d in zip(p.replicas, p.directories, strict=False):
        if r == broker_id:
            return d
    return ZERO_UUID


def is_reassigning(p: PartitionInfo) -> bool:
    return bool(p.adding_replicas or p.removing_replicas)


def completed_reassignment(
    replicas: Sequence[int], isr: Sequence[int], removing: Sequence[int], adding: Sequence[int]
) -> tuple[list[int], list[int]] | None:
    """(final replicas, final ISR) when the reassignment described can complete now, else None."""
    if not removing and not adding:
        return None
    gone = set(removing)
    new_isr = [r for r in isr if r not in gone]
    new_replicas = [r for r in replicas if r not in gone]
    if not new_isr or not new_replicas or not set(new_replicas) <= set(new_isr):
        return None
    return new_replicas, new_isr


def elect(
    current: int, replicas: Sequence[int], isr: Sequence[int], usable: Collection[int], election: Election
) -> tuple[int, bool]:
    """(leader, unclean) for a partition whose next replica list and ISR are given."""
    in_isr = set(isr)

    def valid(r: int) -> bool:
        return r in in_isr and r in usable

    if election == "preferred" and replicas and valid(replicas[0]):
        return replicas[0], False
    if valid(current):
        return current, False
    for r in replicas:
        if valid(r):
            return r, False
    if election == "unclean":
        for r in replicas:
            if r in usable:
                return r, True
    return NO_LEADER, False


def build_change(
    image: MetadataImage,
    p: PartitionInfo,
    usable: Collection[int],
    *,
    isr: Sequence[int] | None = None,
    replicas: Sequence[int] | None = None,
    removing: Sequence[int] | None = None,
    adding: Sequence[int] | None = None,
    election: Election = "online",
) -> PartitionChangeRecord | None:
    """The record moving `p` towards the targets given (None: unchanged), or None when nothing
    changes. `usable` are the brokers that may lead."""
    t_isr = list(p.isr if isr is None else isr)
    t_replicas = list(p.replicas if replicas is None else replicas)
    t_removing = list(p.removing_replicas if removing is None else removing)
    t_adding = list(p.adding_replicas if adding is None else adding)
    # a replica in an offline log dir may not lead
    usable = {r for r in usable if dir_online(image, r, directory_of(p, r))}

    done = completed_reassignment(t_replicas, t_isr, t_removing, t_adding)
    if done is not None:
        t_replicas, t_isr = done
        t_removing, t_adding = [], []

    leader, unclean = elect(p.leader, t_replicas, t_isr, usable, election)
    if unclean:
        t_isr = [leader]
    if not t_isr:
        t_isr = list(p.isr)  # never empty the ISR

    rec = PartitionChangeRecord(partition_id=p.partition, topic_id=p.topic_id)
    changed = False
    if leader != p.leader:
        rec.leader = leader
        changed = True
    if tuple(t_isr) != p.isr:
        rec.isr = t_isr
        changed = True
    if tuple(t_replicas) != p.replicas:
        rec.replicas = t_replicas
        rec.directories = _directories(image, p, t_replicas)
        changed = True
        if rec.leader == NO_CHANGE and not set(p.replicas) <= set(t_replicas):
            rec.leader = p.leader  # replicas leave: bump the leader epoch to fence them
    if tuple(t_removing) != p.removing_replicas:
        rec.removing_replicas = t_removing
        changed = True
    if tuple(t_adding) != p.adding_replicas:
        rec.adding_replicas = t_adding
        changed = True
    return rec if changed else None


def _directories(image: MetadataImage, p: PartitionInfo, replicas: Sequence[int]) -> list[UUID]:
    """Each replica's log dir, aligned with `replicas`: kept for replicas that stay, the
    broker's default for new ones."""
    known = dict(zip(p.replicas, p.directories, strict=False))
    return [known[r] if r in known else default_directory(image, r) for r in replicas]


def remove_broker(
    image: MetadataImage, broker_id: int, usable: Collection[int], unclean_for: Callable[[str], bool]
) -> list[PartitionChangeRecord]:
    """Changes taking `broker_id` out of every ISR it is in and every leadership it holds
    (fencing, controlled shutdown, a new incarnation replacing an old one)."""
    out = []
    usable = set(usable) - {broker_id}
    for t in image.topics.values():
        election: Election | None = None
        for p in t.partitions.values():
            if broker_id not in p.isr and p.leader != broker_id:
                continue
            if election is None:
                election = "unclean" if unclean_for(t.name) else "online"
            target = [r for r in p.isr if r != broker_id]
            rec = build_change(image, p, usable, isr=target, election=election)
            if rec is not None:
                out.append(rec)
    return out


def elect_leaderless(
    image: MetadataImage, usable: Collection[int], unclean_for: Callable[[str], bool], only_broker: int | None = None
) -> list[PartitionChangeRecord]:
    """Leaders for partitions that have none, now that `usable` changed (a broker unfenced).
    With only_broker, only partitions that broker could lead are looked at, and it rejoins the ISR
    of the diskless partitions it is a replica of."""
    out = []
    for t in image.topics.values():
        election: Election | None = None
        for p in t.partitions.values():
            if (only_broker is not None and p.diskless_coordinator >= 0 and only_broker in p.replicas
                    and only_broker not in p.isr):
                # A diskless replica holds no data to catch up (KIP-1164: every broker serves the
                # partition from object storage), so it is in sync once unfenced. Without this the
                # ISR only shrinks, and the partition's leader (where its share-partitions live,
                # KIP-932) could no longer move after a few failures.
                rec = build_change(image, p, usable, isr=[*p.isr, only_broker])
                if rec is not None:
                    out.append(rec)
                continue
            if p.leader != NO_LEADER:
                continue
            if only_broker is not None and only_broker not in p.replicas:
                continue
            if election is None:
                election = "unclean" if unclean_for(t.name) else "online"
            rec = build_change(image, p, usable, election=election)
            if rec is not None:
                out.append(rec)
    return out
