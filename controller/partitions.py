"""Partition state changes asked for by brokers and admins: AlterPartition (ISR changes from
partition leaders), ElectLeaders (preferred and unclean elections), the automatic preferred-
leader rebalance, and partition reassignments (AlterPartitionReassignments,
ListPartitionReassignments). Every change goes through replication.build_change.

AlterPartition is checked as Kafka's controller checks it, in this order: the sender's broker
epoch (STALE_BROKER_EPOCH, for the whole request); per partition: unknown topic or partition; a
leader or partition epoch newer than ours (NOT_CONTROLLER: the sender heard from another
controller); an older leader epoch (FENCED_LEADER_EPOCH); a sender that is not the leader
(INVALID_REQUEST, Kafka's code for it); an older partition epoch (INVALID_UPDATE_VERSION); an
ISR with strangers or duplicates, or without the leader (INVALID_REQUEST); members that are not
registered, fenced, shutting down, (v3) of another broker epoch or whose replica is in a log dir
its broker reported offline (INELIGIBLE_REPLICA;
OPERATION_NOT_ATTEMPTED before v2). The ISR change bumps only the partition epoch. If it
completes a reassignment that moves leadership away from the sender, the change is written and
the sender is told NEW_LEADER_ELECTED (FENCED_LEADER_EPOCH before v2), so it reloads metadata.

Reassignment (KIP-455, as Kafka's controller runs it) with target replicas R and current
replicas C: the start writes replicas = R + (C - R), adding = R - C, removing = C - R. Leaders
add the new replicas to the ISR through AlterPartition as they catch up; once the ISR holds all
of R the reassignment completes in that same change (replicas = R, ISR = ISR minus removing,
adding/removing cleared, a leader outside R replaced by the first of R in the ISR). A target
that adds nobody completes at once. Cancelling (null replicas) reverts to C: the adding replicas
leave the replica list and the ISR; if that would empty the ISR the revert needs an unclean
election (refused unless the topic allows one). A new target replaces an ongoing one, computed
against the current (merged) replica list, as Kafka does.
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

import structlog

from controller.controller import Batch, Controller
from controller.errors import ApiError, Errors
from controller.replication import (
    Election,
    build_change,
    dir_online,
    directory_of,
    is_reassigning,
    usable_ids,
)
from controller.topics import check_manual_replicas
from metadata.image import MetadataImage, PartitionInfo, TopicInfo

log = structlog.get_logger(__name__)

PREFERRED, UNCLEAN = 0, 1  # ElectLeaders ElectionType
RECOVERED, RECOVERING = 0, 1  # LeaderRecoveryState
# Kafka's controller moves at most this many leaders per rebalance pass (maxElectionsPerImbalance).
MAX_ELECTIONS_PER_REBALANCE = 1000


@dataclass
class IsrUpdate:
    """One partition of an AlterPartition request."""

    partition: int
    leader_epoch: int
    partition_epoch: int
    new_isr: list[tuple[int, int]]  # (broker id, broker epoch or -1)
    leader_recovery_state: int = RECOVERED


@dataclass
class TopicIsrUpdates:
    name: str | None  # v0-1
    topic_id: UUID | None  # v2+
    partitions: list[IsrUpdate]


@dataclass
class PartitionState:
    """The answer for one AlterPartition partition: an error, or the state after the change."""

    partition: int
    error: int = 0
    leader: int = -1
    leader_epoch: int = -1
    isr: list[int] = field(default_factory=list)
    partition_epoch: int = -1


@dataclass
class PartitionResult:
    topic: str
    partition: int
    error: ApiError | None = None


class PartitionControl:
    def __init__(self, controller: Controller) -> None:
        self.ctl = controller

    def _election(self, image: MetadataImage, topic: str) -> Election:
        return "unclean" if self.ctl.unclean_for(image)(topic) else "online"

    # ---- AlterPartition
    async def alter_partition(
        self, broker_id: int, broker_epoch: int, topics: list[TopicIsrUpdates], version: int
    ) -> list[list[PartitionState]]:
        """One list of results per topic, in request order. Raises ApiError for the request."""

        def build(image: MetadataImage, batch: Batch) -> list[list[PartitionState]]:
            b = image.brokers.get(broker_id)
            if b is None:
                raise ApiError(Errors.STALE_BROKER_EPOCH, f"Broker {broker_id} is not registered.")
            if b.epoch != broker_epoch:
                raise ApiError(
                    Errors.STALE_BROKER_EPOCH, f"Broker {broker_id} has epoch {b.epoch}, not {broker_epoch}."
                )
            usable = usable_ids(image)
            seen: set[tuple[UUID, int]] = set()
            out: list[list[PartitionState]] = []
            for t in topics:
                info = image.topics.get(t.topic_id) if t.topic_id is not None else image.topic(t.name or "")
                results: list[PartitionState] = []
                out.append(results)
                if info is None:
                    code = Errors.UNKNOWN_TOPIC_ID if version >= 2 else Errors.UNKNOWN_TOPIC_OR_PARTITION
                    results.extend(PartitionState(u.partition, code) for u in t.partitions)
                    continue
                for u in t.partitions:
                    p = info.partitions.get(u.partition)
                    state = PartitionState(u.partition)
                    results.append(state)
                    if p is not None and (info.id, u.partition) in seen:
                        # a second entry for the same partition was written against the state
                        # the first one replaced
                        state.error = Errors.INVALID_UPDATE_VERSION
                        continue
                    state.error = self._check_isr_update(image, broker_id, p, u, version)
                    if state.error or p is None:
                        continue
                    seen.add((info.id, u.partition))
                    rec = build_change(
                        image,
                        p,
                        usable,
                        isr=[r for r, _ in u.new_isr],
                        election=self._election(image, info.name),
                    )
                    if rec is not None:
                        batch.add(rec)
                        if rec.leader >= 0 and rec.leader != broker_id:
                            state.error = Errors.NEW_LEADER_ELECTED if version >= 2 else Errors.FENCED_LEADER_EPOCH
                            log.info(
                                "reassignment_completed_leader_moved",
                                topic=info.name,
                                partition=p.partition,
                                leader=rec.leader,
                            )
                            continue
                        if rec.removing_replicas is not None or rec.adding_replicas is not None:
                            log.info("reassignment_completed", topic=info.name, partition=p.partition)
                    batch.on_commit(functools.partial(_fill_state, topic_id=info.id, state=state))
            return out

        return await self.ctl.write(build)

    @staticmethod
    def _check_isr_update(
        image: MetadataImage, broker_id: int, p: PartitionInfo | None, u: IsrUpdate, version: int
    ) -> int:
        if p is None:
            return Errors.UNKNOWN_TOPIC_OR_PARTITION
        if u.leader_epoch > p.leader_epoch or u.partition_epoch > p.partition_epoch:
            return Errors.NOT_CONTROLLER
        if u.leader_epoch < p.leader_epoch:
            return Errors.FENCED_LEADER_EPOCH
        if broker_id != p.leader:
            return Errors.INVALID_REQUEST
        if u.partition_epoch < p.partition_epoch:
            return Errors.INVALID_UPDATE_VERSION
        ids = [r for r, _ in u.new_isr]
        if len(set(ids)) != len(ids) or not set(ids) <= set(p.replicas) or p.leader not in ids:
            return Errors.INVALID_REQUEST
        if u.leader_recovery_state != RECOVERED:
            # Partitions here are always RECOVERED, and never go back to RECOVERING.
            return Errors.INVALID_REQUEST
        for r, epoch in u.new_isr:
            b = image.brokers.get(r)
            # a leader may re-add a follower whose last fetch raced its dir going offline
            if (b is None or b.fenced or b.in_controlled_shutdown or (epoch != -1 and epoch != b.epoch)
                    or not dir_online(image, r, directory_of(p, r))):
                return Errors.INELIGIBLE_REPLICA if version >= 2 else Errors.OPERATION_NOT_ATTEMPTED
        return 0

    # ---- ElectLeaders
    async def elect_leaders(
        self, election_type: int, wanted: list[tuple[str, list[int]]] | None
    ) -> list[tuple[str, list[PartitionResult]]]:
        """Results per topic. `wanted` None means every partition; then partitions that need no
        election are left out of the answer, as Kafka does."""
        if election_type not in (PREFERRED, UNCLEAN):
            raise ApiError(Errors.INVALID_REQUEST, f"Unknown election type {election_type} (0 preferred, 1 unclean).")

        def build(image: MetadataImage, batch: Batch) -> list[tuple[str, list[PartitionResult]]]:
            usable = usable_ids(image)
            out: list[tuple[str, list[PartitionResult]]] = []
            if wanted is None:
                for t in sorted(image.topics.values(), key=lambda t: t.name):
                    results = []
                    for idx in sorted(t.partitions):
                        r = self._elect_one(image, batch, usable, election_type, t.name, idx)
                        if r.error is None or r.error.code != Errors.ELECTION_NOT_NEEDED:
                            results.append(r)
                    if results:
                        out.append((t.name, results))
                return out
            done: set[tuple[str, int]] = set()
            by_topic: dict[str, list[PartitionResult]] = {}
            for name, parts in wanted:
                named = by_topic.get(name)
                if named is None:
                    named = by_topic[name] = []
                    out.append((name, named))
                for idx in parts:
                    if (name, idx) in done:
                        continue
                    done.add((name, idx))
                    named.append(self._elect_one(image, batch, usable, election_type, name, idx))
            return out

        results = await self.ctl.write(build)
        elected = sum(1 for _, rs in results for r in rs if r.error is None)
        log.info("elect_leaders", type="unclean" if election_type == UNCLEAN else "preferred", elected=elected)
        return results

    def _elect_one(
        self, image: MetadataImage, batch: Batch, usable: set[int], election_type: int, topic: str, index: int
    ) -> PartitionResult:
        res = PartitionResult(topic, index)
        t = image.topic(topic)
        p = None if t is None else t.partitions.get(index)
        if p is None:
            res.error = ApiError(Errors.UNKNOWN_TOPIC_OR_PARTITION, f"No partition {topic}-{index}.")
            return res
        if election_type == PREFERRED:
            if p.replicas and p.leader == p.replicas[0]:
                res.error = ApiError(Errors.ELECTION_NOT_NEEDED, "The preferred replica already leads.")
                return res
            rec = build_change(image, p, usable, election="preferred")
            if rec is None:
                res.error = ApiError(
                    Errors.PREFERRED_LEADER_NOT_AVAILABLE,
                    f"The preferred replica {p.replicas[0]} is not in the ISR {list(p.isr)} or not alive.",
                )
                return res
        else:
            if p.leader >= 0:
                res.error = ApiError(Errors.ELECTION_NOT_NEEDED, f"Broker {p.leader} leads the partition.")
                return res
            rec = build_change(image, p, usable, election="unclean")
            if rec is None:
                res.error = ApiError(Errors.ELIGIBLE_LEADERS_NOT_AVAILABLE, "No replica of the partition is alive.")
                return res
        batch.add(rec)
        return res

    # ---- automatic preferred-leader rebalance (auto.leader.rebalance.enable)
    async def rebalance_leaders(self) -> int:
        """Move leadership back to the preferred replica wherever it is valid (in the ISR and
        alive). Like Kafka's KRaft controller, any imbalance triggers it (the per-broker
        percentage is not consulted). Returns how many partitions moved."""
        moved = 0
        while True:

            def build(image: MetadataImage, batch: Batch) -> tuple[bool, int]:
                usable = usable_ids(image)
                for t in image.topics.values():
                    for p in t.partitions.values():
                        if not p.replicas or p.leader == p.replicas[0]:
                            continue
                        rec = build_change(image, p, usable, election="preferred")
                        if rec is not None and rec.leader == p.replicas[0]:
                            batch.add(rec)
                            if len(batch.records) >= MAX_ELECTIONS_PER_REBALANCE:
                                return True, len(batch.records)
                return False, len(batch.records)

            more, n = await self.ctl.write(build)
            moved += n
            if not more:
                break
        if moved:
            log.info("leaders_rebalanced", partitions=moved)
        return moved

    # ---- AlterPartitionReassignments
    async def alter_reassignments(
        self, topics: list[tuple[str, list[tuple[int, list[int] | None]]]]
    ) -> list[tuple[str, list[PartitionResult]]]:
        """`topics`: (name, [(partition, target replicas or None to cancel)]). One batch."""

        def build(image: MetadataImage, batch: Batch) -> list[tuple[str, list[PartitionResult]]]:
            usable = usable_ids(image)
            counts = Counter((name, idx) for name, parts in topics for idx, _ in parts)
            out: list[tuple[str, list[PartitionResult]]] = []
            for name, parts in topics:
                results: list[PartitionResult] = []
                out.append((name, results))
                t = image.topic(name)
                for idx, target in parts:
                    res = PartitionResult(name, idx)
                    results.append(res)
                    try:
                        if counts[(name, idx)] > 1:
                            raise ApiError(Errors.INVALID_REQUEST, f"Partition {name}-{idx} is named more than once.")
                        p = None if t is None else t.partitions.get(idx)
                        if t is None or p is None:
                            raise ApiError(Errors.UNKNOWN_TOPIC_OR_PARTITION, f"No partition {name}-{idx}.")
                        if target is None:
                            rec = self._cancel(image, usable, t, p)
                        else:
                            rec = self._reassign(image, usable, t, p, target)
                        if rec is not None:
                            batch.add(rec)
                    except ApiError as e:
                        res.error = e
            return out

        results = await self.ctl.write(build)
        log.info(
            "alter_partition_reassignments",
            results=", ".join(
                f"{r.topic}-{r.partition}:{r.error.code if r.error else 'OK'}" for _, rs in results for r in rs
            ),
        )
        return results

    def _reassign(
        self, image: MetadataImage, usable: set[int], t: TopicInfo, p: PartitionInfo, target: list[int]
    ) -> Any:
        check_manual_replicas(image, target, None, f"partition {t.name}-{p.partition}")
        current = list(p.replicas)
        removing = sorted(set(current) - set(target))
        adding = sorted(set(target) - set(current))
        merged = list(target) + removing
        rec = build_change(
            image,
            p,
            usable,
            replicas=merged,
            removing=removing,
            adding=adding,
            election=self._election(image, t.name),
        )
        log.info(
            "reassignment_started" if adding or removing else "replicas_reordered",
            topic=t.name,
            partition=p.partition,
            target=target,
            adding=adding,
            removing=removing,
            completed=rec is not None and rec.adding_replicas == [] and rec.removing_replicas == [],
        )
        return rec

    def _cancel(self, image: MetadataImage, usable: set[int], t: TopicInfo, p: PartitionInfo) -> Any:
        if not is_reassigning(p):
            raise ApiError(
                Errors.NO_REASSIGNMENT_IN_PROGRESS, f"No reassignment of {t.name}-{p.partition} is in progress."
            )
        adding = set(p.adding_replicas)
        replicas = [r for r in p.replicas if r not in adding]
        isr = [r for r in p.isr if r not in adding]
        election = self._election(image, t.name)
        if not isr:
            if election != "unclean":
                raise ApiError(
                    Errors.INVALID_REPLICA_ASSIGNMENT,
                    f"Reverting the reassignment of {t.name}-{p.partition} needs an unclean leader election: "
                    "only replicas being added are in sync.",
                )
            isr = replicas[:1]
        log.info("reassignment_cancelled", topic=t.name, partition=p.partition, replicas=replicas)
        return build_change(image, p, usable, isr=isr, replicas=replicas, removing=[], adding=[], election=election)

    # ---- ListPartitionReassignments
    def list_reassignments(self, wanted: list[tuple[str, list[int]]] | None) -> list[tuple[str, list[PartitionInfo]]]:
        """Ongoing reassignments, of every partition (None) or of those named (unknown ones and
        those not being reassigned are left out)."""
        image = self.ctl.image
        out = []
        if wanted is None:
            for t in sorted(image.topics.values(), key=lambda t: t.name):
                parts = [t.partitions[i] for i in sorted(t.partitions) if is_reassigning(t.partitions[i])]
                if parts:
                    out.append((t.name, parts))
            return out
        for name, indexes in wanted:
            t = image.topic(name)
            if t is None:
                continue
            parts = []
            for i in dict.fromkeys(indexes):
                p = t.partitions.get(i)
                if p is not None and is_reassigning(p):
                    parts.append(p)
            if parts:
                out.append((name, parts))
        return out


def _fill_state(image: MetadataImage, topic_id: UUID, state: PartitionState) -> None:
    t = image.topics.get(topic_id)
    p = None if t is None else t.partitions.get(state.partition)
    if p is None:  # cannot happen: nothing else was written in between
        state.error = Errors.UNKNOWN_TOPIC_OR_PARTITION
        return
    state.leader, state.leader_epoch = p.leader, p.leader_epoch
    state.isr, state.partition_epoch = list(p.isr), p.partition_epoch
