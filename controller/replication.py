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
5. Eligible leader replicas (KIP-966, when the eligible.leader.replicas.version feature is on),
   as Kafka 4.x keeps them: while the target ISR is smaller than the topic's min.insync.replicas
   (at most its replication factor), the ELR is the old ISR plus the old ELR, minus the target ISR
   and minus a broker that came back from an unclean shutdown; at min ISR or above it is cleared.
   With ELR on the ISR may empty (rule 3 then does not hold): an election takes a valid ISR
   member, else an unfenced ELR member (a clean election: it becomes the ISR and leaves the ELR),
   else the last known leader if it is usable (kept in LastKnownElr from when the ISR emptied,
   Kafka's "balanced recovery"), else, for an unclean election, any usable replica. An unclean
   or last-known-leader election clears the ELR. LastKnownElr is emptied once a leader is back.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Literal
from uuid import UUID

from metadata.image import BROKER_RESOURCE, ELR_FEATURE, NO_LEADER, MetadataImage, PartitionInfo
from protocol.generated.metadata_records.partition_change_record import PartitionChangeRecord

NO_CHANGE = -2  # PartitionChangeRecord.Leader: leader unchanged
ZERO_UUID = UUID(int=0)

Election = Literal["online", "preferred", "unclean"]
MIN_ISR = "min.insync.replicas"


def elr_enabled(image: MetadataImage) -> bool:
    return image.features.get(ELR_FEATURE, 0) >= 1


def effective_min_isr(image: MetadataImage, p: PartitionInfo) -> int:
    """Kafka's getTopicEffectiveMinIsr: the topic's min.insync.replicas, else the cluster-level
    one (always there while ELR is on), capped at the replication factor."""
    t = image.topics.get(p.topic_id)
    raw = None if t is None else image.topic_config(t.name).get(MIN_ISR)
    if raw is None:
        raw = image.configs.get((BROKER_RESOURCE, ""), {}).get(MIN_ISR, "1")
    try:
        value = int(raw)
    except ValueError:
        value = 1
    return max(1, min(value, len(p.replicas)))


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
    current: int,
    replicas: Sequence[int],
    isr: Sequence[int],
    usable: Collection[int],
    election: Election,
    elr: Sequence[int] = (),
    last_known_leader: int = NO_LEADER,
) -> tuple[int, bool]:
    """(leader, unclean) for a partition whose next replica list and ISR are given. `elr` and
    `last_known_leader` are KIP-966's, given only when the feature is on."""
    # an ELR member may lead only when the ISR is empty (KIP-966)
    in_isr = set(isr) if isr else set(elr)

    def valid(r: int) -> bool:
        return r in in_isr and r in usable

    if election == "preferred" and replicas and valid(replicas[0]):
        return replicas[0], False
    if valid(current):
        return current, False
    for r in replicas:
        if valid(r):
            return r, False
    if not isr and not elr and last_known_leader in usable:
        return last_known_leader, True
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
    unclean_shutdown: Collection[int] = (),
) -> PartitionChangeRecord | None:
    """The record moving `p` towards the targets given (None: unchanged), or None when nothing
    changes. `usable` are the brokers that may lead; `unclean_shutdown` brokers came back
    without a clean shutdown and may not stay eligible (KIP-966)."""
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

    elr_on = elr_enabled(image)
    t_elr: list[int] = []
    last_known = NO_LEADER
    if elr_on:
        t_elr = _target_elr(image, p, t_replicas, t_isr, unclean_shutdown)
        if len(p.last_known_elr) == 1:
            last_known = p.last_known_elr[0]
    leader, unclean = elect(p.leader, t_replicas, t_isr, usable, election, t_elr, last_known)
    if unclean:
        t_isr, t_elr = [leader], []
    elif leader != p.leader and leader in t_elr:
        # a clean election from the ELR: the new leader is the ISR (KIP-966)
        t_isr = [leader]
        t_elr = [r for r in t_elr if r != leader]
    if not t_isr and not elr_on:
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
    if tuple(t_elr) != p.elr:
        rec.eligible_leader_replicas = t_elr
        changed = True
    t_last = _last_known_elr(p, elr_on, t_isr, leader)
    if t_last != p.last_known_elr:
        rec.last_known_elr = list(t_last)
        changed = True
    return rec if changed else None


def _target_elr(
    image: MetadataImage, p: PartitionInfo, replicas: Sequence[int], isr: Sequence[int], unclean: Collection[int]
) -> list[int]:
    """KIP-966's ELR for the target ISR: empty at or above min ISR; below it, whoever was in the
    ISR (now or when it first shrank below min ISR) and is not in the target ISR, less brokers
    back from an unclean shutdown and replicas leaving the partition."""
    if len(isr) >= effective_min_isr(image, p):
        return []
    keep = set(p.elr) | set(p.isr)
    gone = set(isr) | set(unclean)
    return sorted(r for r in keep if r not in gone and r in replicas)


def _last_known_elr(p: PartitionInfo, elr_on: bool, isr: Sequence[int], leader: int) -> tuple[int, ...]:
    """Kafka 4.x keeps the last leader in LastKnownElr from the change that empties the ISR until
    a leader is back, so that leader may lead again when it returns, as before KIP-966, if every
    ELR member is gone."""
    if not elr_on:
        return ()
    if not isr and p.isr and p.leader != NO_LEADER:
        return (p.leader,)
    if leader != NO_LEADER:
        return ()
    return p.last_known_elr


def _directories(image: MetadataImage, p: PartitionInfo, replicas: Sequence[int]) -> list[UUID]:
    """Each replica's log dir, aligned with `replicas`: kept for replicas that stay, the
    broker's default for new ones."""
    known = dict(zip(p.replicas, p.directories, strict=False))
    return [known[r] if r in known else default_directory(image, r) for r in replicas]


def remove_broker(
    image: MetadataImage,
    broker_id: int,
    usable: Collection[int],
    unclean_for: Callable[[str], bool],
    unclean_shutdown: bool = False,
) -> list[PartitionChangeRecord]:
    """Changes taking `broker_id` out of every ISR it is in and every leadership it holds
    (fencing, controlled shutdown, a new incarnation replacing an old one); with
    `unclean_shutdown` (a new incarnation that did not shut down cleanly) out of every ELR too."""
    out = []
    usable = set(usable) - {broker_id}
    gone = (broker_id,) if unclean_shutdown else ()
    for t in image.topics.values():
        election: Election | None = None
        for p in t.partitions.values():
            if broker_id not in p.isr and p.leader != broker_id and not (gone and broker_id in p.elr):
                continue
            if election is None:
                election = "unclean" if unclean_for(t.name) else "online"
            target = [r for r in p.isr if r != broker_id]
            rec = build_change(image, p, usable, isr=target, election=election, unclean_shutdown=gone)
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


def clear_elr(image: MetadataImage, topic: str | None) -> list[PartitionChangeRecord]:
    """KIP-966: a new min.insync.replicas (of `topic`, or the cluster's: None) voids the ELRs it
    was kept against, so they are cleared (Kafka writes a ClearElrRecord; here one change per
    partition that has any)."""
    out = []
    for t in image.topics.values():
        if topic is not None and t.name != topic:
            continue
        for p in t.partitions.values():
            if p.elr or p.last_known_elr:
                out.append(PartitionChangeRecord(partition_id=p.partition, topic_id=p.topic_id,
                                                 eligible_leader_replicas=[], last_known_elr=[]))
    return out
