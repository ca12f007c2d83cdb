"""Topic and partition creation and deletion.

Each request is one operation (one batch): the topics that pass validation are written together,
the others get their own error; nothing is written for validate_only. Records follow Kafka's
order: TopicRecord, the topic's ConfigRecords, then its PartitionRecords (leader = first usable
replica, ISR = the usable replicas, epochs 0, start offset -1: a partition that never had chunks
is one chunk from 0).
"""

from __future__ import annotations

import re
import uuid
import zlib
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import structlog

from controller.controller import Batch, Controller
from controller.errors import ApiError, Errors
from controller.partition_counts import check_count_change, expand_records, shrink_records
from controller.placement import PlacementError, current_load, usable_brokers
from controller.replication import default_directory
from metadata import config_defs, config_effects
from metadata.diskless import DISKLESS_METADATA_TOPIC, is_diskless
from metadata.image import BROKER_RESOURCE, METADATA_TOPIC, METADATA_TOPIC_ID, MetadataImage
from protocol.generated.metadata_records.config_record import ConfigRecord
from protocol.generated.metadata_records.partition_record import PartitionRecord
from protocol.generated.metadata_records.remove_topic_record import RemoveTopicRecord
from protocol.generated.metadata_records.topic_record import TopicRecord

log = structlog.get_logger(__name__)

ZERO_UUID = uuid.UUID(int=0)
MAX_NAME_LENGTH = 249
_LEGAL = re.compile(r"[a-zA-Z0-9._-]+")
# One operation is one batch, read whole by every broker: bound what one request may create.
MAX_PARTITIONS_PER_REQUEST = 100_000


def topic_name_problem(name: str | None) -> str | None:
    """Why a topic name is illegal (Kafka's rules), or None."""
    if not name:
        return "Topic name is empty."
    if name in (".", ".."):
        return f"Topic name cannot be {name!r}."
    if len(name) > MAX_NAME_LENGTH:
        return f"Topic name is {len(name)} characters long; the limit is {MAX_NAME_LENGTH}."
    if not _LEGAL.fullmatch(name):
        return f"Topic name {name!r} is illegal: use only ASCII letters, digits, '.', '_' and '-'."
    if name == METADATA_TOPIC:
        return f"Topic name {name!r} is reserved for the cluster metadata log."
    return None


def _collision_key(name: str) -> str:
    """'.' and '_' collide in metric names, so Kafka refuses topics differing only by them."""
    return name.replace(".", "_")


@dataclass
class TopicResult:
    name: str | None
    error: ApiError | None = None
    topic_id: uuid.UUID = ZERO_UUID
    num_partitions: int = -1
    replication_factor: int = -1
    configs: list[tuple[str, str | None, int]] = field(default_factory=list)


def check_manual_replicas(image: MetadataImage, replicas: list[int], expected_rf: int | None, what: str) -> None:
    if not replicas:
        raise ApiError(Errors.INVALID_REPLICA_ASSIGNMENT, f"The manual assignment for {what} is an empty replica list.")
    dup = [b for b, n in Counter(replicas).items() if n > 1]
    if dup:
        raise ApiError(
            Errors.INVALID_REPLICA_ASSIGNMENT, f"The manual assignment for {what} names broker {dup[0]} more than once."
        )
    unknown = [b for b in replicas if b not in image.brokers]
    if unknown:
        raise ApiError(
            Errors.INVALID_REPLICA_ASSIGNMENT,
            f"The manual assignment for {what} names broker {unknown[0]}, but no such broker is registered.",
        )
    if expected_rf is not None and len(replicas) != expected_rf:
        raise ApiError(
            Errors.INVALID_REPLICA_ASSIGNMENT,
            f"The manual assignment for {what} has {len(replicas)} replica(s), but the other partitions have {expected_rf}.",
        )


def _each_topic(topics: list[Any], ctx: Any, action: str, batch: Batch, validate_only: bool) -> list[TopicResult]:
    """Run ctx.<action>(topic) for each named topic once; a name given twice is INVALID_REQUEST.
    The records go into the batch unless this is validate-only."""
    counts = Counter(t.name for t in topics)
    results: dict[str, TopicResult] = {}
    for t in topics:
        if t.name in results:
            continue
        if counts[t.name] > 1:
            results[t.name] = TopicResult(t.name, ApiError(Errors.INVALID_REQUEST, "Duplicate topic name."))
            continue
        try:
            results[t.name] = getattr(ctx, action)(t)
        except ApiError as e:
            results[t.name] = TopicResult(t.name, e)
    if not validate_only:
        batch.extend(ctx.records)
    return list(results.values())


class TopicControl:
    def __init__(self, controller: Controller) -> None:
        self.ctl = controller

    # ---- CreateTopics
    async def create_topics(self, topics: list[Any], validate_only: bool) -> list[TopicResult]:
        """`topics` are CreateTopicsRequest.CreatableTopic entries."""

        def build(image: MetadataImage, batch: Batch) -> list[TopicResult]:
            results = _each_topic(topics, _CreateContext(self.ctl, image), "create", batch, validate_only)
            if validate_only:
                for r in results:
                    r.topic_id = ZERO_UUID
            return results

        results = await self.ctl.write(build)
        log.info(
            "create_topics",
            validate_only=validate_only,
            results=", ".join(f"{r.name}:{r.error.code if r.error else 'OK'}" for r in results),
        )
        return results

    # ---- DeleteTopics
    async def delete_topics(self, by_name: list[str | None], by_id: list[uuid.UUID]) -> list[TopicResult]:
        """Topics named by name (v0-5, or v6 entries with a name) or by id (v6)."""

        def build(image: MetadataImage, batch: Batch) -> list[TopicResult]:
            out: list[TopicResult] = []
            doomed: set[uuid.UUID] = set()
            names = Counter(by_name)
            ids = Counter(by_id)
            for name in dict.fromkeys(by_name):
                if name is None:
                    out.append(TopicResult(None, ApiError(Errors.INVALID_REQUEST, "A topic name or id is required.")))
                elif names[name] > 1:
                    out.append(TopicResult(name, ApiError(Errors.INVALID_REQUEST, "Duplicate topic name.")))
                elif (tid := image.topic_ids.get(name)) is None:
                    out.append(
                        TopicResult(
                            name, ApiError(Errors.UNKNOWN_TOPIC_OR_PARTITION, f"Topic {name!r} does not exist.")
                        )
                    )
                elif tid in doomed:
                    out.append(TopicResult(name, ApiError(Errors.INVALID_REQUEST, "The topic is named twice."), tid))
                else:
                    doomed.add(tid)
                    out.append(TopicResult(name, None, tid))
            for tid in dict.fromkeys(by_id):
                t = image.topics.get(tid)
                if tid in (ZERO_UUID, METADATA_TOPIC_ID):
                    out.append(
                        TopicResult(None, ApiError(Errors.INVALID_REQUEST, f"{tid} is not a valid topic id."), tid)
                    )
                elif ids[tid] > 1:
                    out.append(TopicResult(None, ApiError(Errors.INVALID_REQUEST, "Duplicate topic id."), tid))
                elif t is None:
                    out.append(TopicResult(None, ApiError(Errors.UNKNOWN_TOPIC_ID, f"No topic has the id {tid}."), tid))
                elif tid in doomed:
                    out.append(TopicResult(t.name, ApiError(Errors.INVALID_REQUEST, "The topic is named twice."), tid))
                else:
                    doomed.add(tid)
                    out.append(TopicResult(t.name, None, tid))
            for tid in doomed:
                batch.add(RemoveTopicRecord(topic_id=tid))
            return out

        results = await self.ctl.write(build)
        log.info("delete_topics", results=", ".join(f"{r.name}:{r.error.code if r.error else 'OK'}" for r in results))
        return results

    # ---- CreatePartitions
    async def create_partitions(self, topics: list[Any], validate_only: bool) -> list[TopicResult]:
        """`topics` are CreatePartitionsRequest.CreatePartitionsTopic entries."""

        def build(image: MetadataImage, batch: Batch) -> list[TopicResult]:
            return _each_topic(topics, _CreateContext(self.ctl, image), "add_partitions", batch, validate_only)

        results = await self.ctl.write(build)
        log.info(
            "create_partitions",
            validate_only=validate_only,
            results=", ".join(f"{r.name}:{r.error.code if r.error else 'OK'}" for r in results),
        )
        return results


class _CreateContext:
    """State across the topics of one request: names taken, broker load, records so far."""

    def __init__(self, ctl: Controller, image: MetadataImage) -> None:
        self.ctl = ctl
        self.image = image
        self.records: list[Any] = []
        self.usable = usable_brokers(image)
        self.usable_ids = {b.id for b in self.usable}
        self.replica_load, self.leader_load = current_load(image)
        self.collisions = {_collision_key(n): n for n in image.topic_ids}
        self.partitions_created = 0

    def _budget(self, n: int) -> None:
        if self.partitions_created + n > MAX_PARTITIONS_PER_REQUEST:
            raise ApiError(
                Errors.INVALID_PARTITIONS,
                f"One request may create at most {MAX_PARTITIONS_PER_REQUEST} partitions; this one asks for more.",
            )

    def _diskless_coordinators(self) -> int:
        """How many diskless coordinators new diskless partitions are spread over: the partitions
        of __diskless_metadata, or diskless.metadata.topic.num.partitions before it exists."""
        t = self.image.topic(DISKLESS_METADATA_TOPIC)
        if t is not None and t.partitions:
            return len(t.partitions)
        return max(1, int(self.ctl.config.static.get("diskless.metadata.topic.num.partitions", "4")))

    def _partition_records(self, topic_id: uuid.UUID, first: int, assignments: Iterable[list[int]],
                           diskless: bool = False) -> list[Any]:
        out = []
        # A diskless partition is mapped to a coordinator once, at creation (a stable spread).
        spread = zlib.crc32(topic_id.bytes) if diskless else 0
        n_coordinators = self._diskless_coordinators() if diskless else 1
        for i, replicas in enumerate(assignments, first):
            isr = [r for r in replicas if r in self.usable_ids]
            out.append(
                PartitionRecord(
                    partition_id=i,
                    topic_id=topic_id,
                    replicas=list(replicas),
                    isr=isr,
                    leader=isr[0],
                    leader_epoch=0,
                    partition_epoch=0,
                    directories=[default_directory(self.image, r) for r in replicas],
                    start_offset=-1,
                    diskless_coordinator=(spread + i) % n_coordinators if diskless else -1,
                )
            )
        return out

    def _manual(self, assignments: list[list[int]], expected_rf: int | None, first: int) -> list[list[int]]:
        rf = expected_rf
        out = []
        for i, replicas in enumerate(assignments, first):
            check_manual_replicas(self.image, replicas, rf, f"partition {i}")
            rf = len(replicas)
            if not any(r in self.usable_ids for r in replicas):
                raise ApiError(
                    Errors.INVALID_REPLICA_ASSIGNMENT,
                    f"Every broker in the manual assignment for partition {i} is fenced or shutting down.",
                )
            out.append(list(replicas))
        return out

    def _place(self, num_partitions: int, rf: int) -> list[list[int]]:
        try:
            return self.ctl.placer.place(self.usable, num_partitions, rf, self.replica_load, self.leader_load)
        except PlacementError as e:
            raise ApiError(
                Errors.INVALID_REPLICATION_FACTOR, f"Unable to replicate the partition {rf} time(s): {e}"
            ) from None

    def create(self, t: Any) -> TopicResult:
        cfg = self.ctl.config
        problem = topic_name_problem(t.name)
        if problem:
            raise ApiError(Errors.INVALID_TOPIC_EXCEPTION, problem)
        if t.name in self.image.topic_ids or self.collisions.get(_collision_key(t.name)) == t.name:
            raise ApiError(Errors.TOPIC_ALREADY_EXISTS, f"Topic '{t.name}' already exists.")
        other = self.collisions.get(_collision_key(t.name))
        if other is not None:
            raise ApiError(
                Errors.INVALID_TOPIC_EXCEPTION,
                f"Topic '{t.name}' collides with existing topic '{other}' ('.' and '_' are the same in metric names).",
            )
        configs = self._topic_configs(t.configs)
        if t.assignments:
            if t.replication_factor != -1:
                raise ApiError(
                    Errors.INVALID_REQUEST,
                    "A manual partition assignment was given, so the replication factor must be -1.",
                )
            if t.num_partitions != -1:
                raise ApiError(
                    Errors.INVALID_REQUEST,
                    "A manual partition assignment was given, so the number of partitions must be -1.",
                )
            by_index: dict[int, list[int]] = {}
            for a in t.assignments:
                if a.partition_index in by_index:
                    raise ApiError(
                        Errors.INVALID_REPLICA_ASSIGNMENT,
                        f"Partition {a.partition_index} has more than one manual assignment.",
                    )
                by_index[a.partition_index] = list(a.broker_ids)
            if sorted(by_index) != list(range(len(by_index))):
                raise ApiError(
                    Errors.INVALID_REPLICA_ASSIGNMENT,
                    "Partitions in a manual assignment must be numbered 0, 1, 2, ... without gaps.",
                )
            self._budget(len(by_index))
            assignments = self._manual([by_index[i] for i in range(len(by_index))], None, 0)
            for replicas in assignments:
                self.replica_load.update(replicas)
                self.leader_load[next(r for r in replicas if r in self.usable_ids)] += 1
        else:
            if t.replication_factor < -1 or t.replication_factor == 0:
                raise ApiError(
                    Errors.INVALID_REPLICATION_FACTOR,
                    f"Replication factor {t.replication_factor} is invalid: use a positive number, or -1 for the default.",
                )
            if t.num_partitions < -1 or t.num_partitions == 0:
                raise ApiError(
                    Errors.INVALID_PARTITIONS,
                    f"Number of partitions {t.num_partitions} is invalid: use a positive number, or -1 for the default.",
                )
            n = cfg.num_partitions if t.num_partitions == -1 else t.num_partitions
            rf = cfg.default_replication_factor if t.replication_factor == -1 else t.replication_factor
            self._budget(n)
            assignments = self._place(n, rf)
        topic_id = uuid.uuid4()
        while topic_id in self.image.topics:
            topic_id = uuid.uuid4()
        self.records.append(TopicRecord(name=t.name, topic_id=topic_id))
        self.records.extend(
            ConfigRecord(resource_type=2, resource_name=t.name, name=k, value=v) for k, v in configs.items()
        )
        diskless = is_diskless(configs)
        self.records.extend(self._partition_records(topic_id, 0, assignments, diskless))
        self.partitions_created += len(assignments)
        self.collisions[_collision_key(t.name)] = t.name
        return TopicResult(
            t.name,
            None,
            topic_id,
            len(assignments),
            len(assignments[0]),
            config_defs.effective_topic_configs(configs, self._cluster_config(), cfg.static),
        )

    def _cluster_config(self) -> dict[str, str]:
        return dict(self.image.configs.get((BROKER_RESOURCE, ""), {}))

    def _topic_configs(self, entries: list[Any]) -> dict[str, str]:
        nulls = [c.name for c in entries if c.value is None]
        if nulls:
            raise ApiError(Errors.INVALID_CONFIG, f"Null value not supported for topic configs: {', '.join(nulls)}.")
        dup = [n for n, k in Counter(c.name for c in entries).items() if k > 1]
        if dup:
            raise ApiError(Errors.INVALID_CONFIG, f"Topic config {dup[0]} is given more than once.")
        out = {}
        for c in entries:
            try:
                config_defs.validate_topic_config(c.name, c.value)
            except config_defs.ConfigValueError as e:
                raise ApiError(Errors.INVALID_CONFIG, str(e)) from None
            why = config_effects.refusal(c.name, c.value)
            if why is not None:
                raise ApiError(Errors.INVALID_CONFIG, why)
            out[c.name] = c.value
        return out

    def add_partitions(self, t: Any) -> TopicResult:
        """Grow or (KIP-253) shrink a topic's partition count; see controller/partition_counts.py."""
        tid = self.image.topic_ids.get(t.name)
        if tid is None:
            raise ApiError(Errors.UNKNOWN_TOPIC_OR_PARTITION, f"Topic '{t.name}' does not exist.")
        topic = self.image.topics[tid]
        current = check_count_change(topic, t.count)
        if t.count < current:
            if t.assignments is not None:
                raise ApiError(
                    Errors.INVALID_REPLICA_ASSIGNMENT,
                    f"Reducing topic '{t.name}' to {t.count} partition(s) takes no replica assignment.",
                )
            self.records.extend(shrink_records(topic, t.count))
            return TopicResult(t.name, None, tid, t.count, len(topic.partitions[0].replicas))
        add = t.count - current
        self._budget(add)
        rf = len(topic.partitions[0].replicas) if 0 in topic.partitions else self.ctl.config.default_replication_factor
        if t.assignments is not None:
            if len(t.assignments) != add:
                raise ApiError(
                    Errors.INVALID_REPLICA_ASSIGNMENT,
                    f"Adding {add} partition(s) needs {add} assignment(s), but {len(t.assignments)} were given.",
                )
            assignments = self._manual([list(a.broker_ids) for a in t.assignments], rf, current)
            for replicas in assignments:
                self.replica_load.update(replicas)
        else:
            assignments = self._place(add, rf)
        diskless = 0 in topic.partitions and topic.partitions[0].diskless_coordinator >= 0
        created = self._partition_records(tid, current, assignments, diskless)
        self.records.extend(expand_records(topic, created))
        self.partitions_created += add
        return TopicResult(t.name, None, tid, t.count, rf)
