"""The cluster metadata image: an immutable snapshot, built by replaying metadata records.

As in KRaft, a MetadataDelta collects the records since an image and `apply()` returns the next
image; it also says what changed, so a broker's ReplicaManager touches only those partitions.
Images share unchanged parts with their predecessor (copy on write).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any
from uuid import UUID

from metadata.acls import AclEntry
from metadata.client_quotas import entity_key

METADATA_TOPIC = "__cluster_metadata"
METADATA_TOPIC_ID = UUID(int=1)  # Kafka's fixed id for the metadata topic
NO_LEADER = -1
TOPIC_RESOURCE = 2
BROKER_RESOURCE = 4
GROUP_RESOURCE = 32  # KIP-848 group configs (kafka-configs.sh --entity-type groups)
CLIENT_METRICS_RESOURCE = 16  # KIP-714 client metrics subscriptions (--entity-type client-metrics)
ELR_FEATURE = "eligible.leader.replicas.version"  # KIP-966: on at level 1


@dataclass(frozen=True)
class Endpoint:
    listener: str
    host: str
    port: int
    security_protocol: int = 0  # Kafka's ids: 0 PLAINTEXT, 1 SSL, 2 SASL_PLAINTEXT, 3 SASL_SSL


@dataclass(frozen=True)
class ScramCredential:
    """A user's salted SCRAM credential for one mechanism (RFC 5802): never the password."""

    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int


@dataclass(frozen=True)
class BrokerInfo:
    id: int
    epoch: int
    incarnation_id: UUID
    endpoints: tuple[Endpoint, ...]
    rack: str | None
    fenced: bool = True
    in_controlled_shutdown: bool = False
    log_dirs: tuple[UUID, ...] = ()

    def endpoint(self, listener: str | None = None) -> Endpoint | None:
        for e in self.endpoints:
            if listener is None or e.listener == listener:
                return e
        return None


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    """The partition's active chunk: replicas, ISR, leader; start_offset is where it begins."""

    topic_id: UUID
    partition: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader: int
    leader_epoch: int
    partition_epoch: int
    removing_replicas: tuple[int, ...] = ()
    adding_replicas: tuple[int, ...] = ()
    directories: tuple[UUID, ...] = ()
    start_offset: int = 0
    start_timestamp: int = -1
    diskless_coordinator: int = -1  # the __diskless_metadata partition of a diskless partition
    # KIP-253: (partition, leader epoch) pairs; before_deletion non-empty = marked for deletion
    epochs_after_creation: tuple[tuple[int, int], ...] = ()
    epochs_before_deletion: tuple[tuple[int, int], ...] = ()
    # KIP-966: replicas out of the ISR that may still lead (they were in it when it shrank below
    # min.insync.replicas), and the last known ELR (with Kafka 4.x: the last leader) once none is left
    elr: tuple[int, ...] = ()
    last_known_elr: tuple[int, ...] = ()

    @property
    def marked_for_deletion(self) -> bool:
        return bool(self.epochs_before_deletion)


@dataclass(frozen=True, slots=True)
class ChunkInfo:
    """An inactive chunk of a partition: immutable, readable from any of its replicas."""

    topic_id: UUID
    partition: int
    start_offset: int
    start_timestamp: int
    stop_offset: int  # last readable offset, inclusive
    end_offset: int  # last replicated offset, inclusive
    chunk_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    directories: tuple[UUID, ...] = ()
    removing_replicas: tuple[int, ...] = ()
    adding_replicas: tuple[int, ...] = ()
    log_start_offset: int = -1  # first readable offset once DeleteRecords cut into it, else -1

    @property
    def first_offset(self) -> int:
        """The chunk's first readable offset."""
        return max(self.start_offset, self.log_start_offset)


@dataclass(frozen=True, slots=True)
class TopicInfo:
    id: UUID
    name: str
    partitions: MappingProxyType  # int -> PartitionInfo
    chunks: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))  # int -> tuple[ChunkInfo] oldest first
    undeleted_count: int = -1  # KIP-253's undeleted_partition_count as recorded; -1: never changed

    @property
    def undeleted_partition_count(self) -> int:
        """The count producers hash keys over: partitions at and above it are marked for deletion."""
        return self.undeleted_count if self.undeleted_count >= 0 else len(self.partitions)


def _frozen(d: dict) -> MappingProxyType:
    return MappingProxyType(d)


@dataclass(frozen=True)
class MetadataImage:
    offset: int = -1  # offset of the last record this image includes
    brokers: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))  # int -> BrokerInfo
    topics: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))  # UUID -> TopicInfo
    topic_ids: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))  # name -> UUID
    # (resource type, resource name) -> {config name: value}; resource type 2 = topic, 4 = broker
    configs: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))
    features: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))
    next_producer_id: int = 0
    # client quota entity (metadata.client_quotas.Entity) -> {quota key: value}
    client_quotas: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))
    # (user name, mechanism: 1 SCRAM-SHA-256, 2 SCRAM-SHA-512) -> ScramCredential
    scram: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))
    acls: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))  # UUID -> metadata.acls.AclEntry

    EMPTY: Any = None  # set below

    def topic(self, name: str) -> TopicInfo | None:
        tid = self.topic_ids.get(name)
        return None if tid is None else self.topics[tid]

    def partition(self, name: str, index: int) -> PartitionInfo | None:
        t = self.topic(name)
        return None if t is None else t.partitions.get(index)

    def topic_config(self, name: str) -> MappingProxyType:
        return self.configs.get((TOPIC_RESOURCE, name), _EMPTY_MAP)

    def live_brokers(self) -> list[BrokerInfo]:
        return [b for b in self.brokers.values() if not b.fenced]


_EMPTY_MAP: MappingProxyType = MappingProxyType({})
MetadataImage.EMPTY = MetadataImage()


def _epochs(entries: list[Any] | None) -> tuple[tuple[int, int], ...]:
    return tuple((e.partition_id, e.leader_epoch) for e in entries or ())


def _opt(values: list[int] | None, current: tuple) -> tuple:
    """PartitionChangeRecord lists: null means unchanged."""
    return current if values is None else _shared(values)


# Replica, ISR and dir tuples repeat across partitions (a few placements over many partitions):
# each distinct one is kept once and shared, where a tuple each was about 170 bytes a partition
# on every broker. Bounded: past the limit it starts over (the tuples already shared stay valid).
_SHARED_TUPLES: dict[tuple, tuple] = {}
_SHARED_LIMIT = 1 << 16


def _shared(values: Any) -> tuple:
    t = tuple(values)
    if len(_SHARED_TUPLES) >= _SHARED_LIMIT:
        _SHARED_TUPLES.clear()
    return _SHARED_TUPLES.setdefault(t, t)


class MetadataDelta:
    """Records replayed on top of an image. `apply()` gives the next image."""

    def __init__(self, image: MetadataImage) -> None:
        self.image = image
        self.offset = image.offset
        self._brokers: dict | None = None
        self._topics: dict | None = None
        self._topic_ids: dict | None = None
        self._configs: dict | None = None
        self._features: dict | None = None
        self._client_quotas: dict | None = None
        self._scram: dict | None = None
        self._acls: dict | None = None
        self._next_producer_id = image.next_producer_id
        self._partitions: dict[UUID, dict[int, PartitionInfo]] = {}  # topics whose partitions changed
        self._chunks: dict[UUID, dict[int, tuple[ChunkInfo, ...]]] = {}
        self.changed_partitions: set[tuple[UUID, int]] = set()
        self.deleted_topics: dict[UUID, TopicInfo] = {}
        # (topic id, partition) -> (topic name, its last state): partitions removed (KIP-253)
        self.deleted_partitions: dict[tuple[UUID, int], tuple[str, PartitionInfo]] = {}
        self.changed_brokers: set[int] = set()
        self.changed_configs: set[tuple[int, str]] = set()

    # ---- copy-on-write accessors
    def _b(self) -> dict:
        if self._brokers is None:
            self._brokers = dict(self.image.brokers)
        return self._brokers

    def _t(self) -> dict:
        if self._topics is None:
            self._topics = dict(self.image.topics)
            self._topic_ids = dict(self.image.topic_ids)
        return self._topics

    def _c(self) -> dict:
        if self._configs is None:
            self._configs = dict(self.image.configs)
        return self._configs

    def _parts(self, topic_id: UUID) -> dict[int, PartitionInfo]:
        p = self._partitions.get(topic_id)
        if p is None:
            t = self._t().get(topic_id)
            if t is None:
                raise KeyError(f"unknown topic id {topic_id}")
            p = self._partitions[topic_id] = dict(t.partitions)
        return p

    def _chunk_map(self, topic_id: UUID) -> dict[int, tuple[ChunkInfo, ...]]:
        c = self._chunks.get(topic_id)
        if c is None:
            t = self._t().get(topic_id)
            if t is None:
                raise KeyError(f"unknown topic id {topic_id}")
            c = self._chunks[topic_id] = dict(t.chunks)
        return c

    # ---- replay
    def replay(self, record: Any, offset: int | None = None) -> None:
        handler = getattr(self, "_replay_" + type(record).__name__, None)
        if handler is not None:
            handler(record)
        if offset is not None:
            self.offset = offset

    def _replay_TopicRecord(self, r: Any) -> None:
        topics = self._t()
        topics[r.topic_id] = TopicInfo(id=r.topic_id, name=r.name, partitions=_frozen({}))
        assert self._topic_ids is not None
        self._topic_ids[r.name] = r.topic_id
        self._partitions[r.topic_id] = {}
        self._chunks[r.topic_id] = {}

    def _replay_PartitionRecord(self, r: Any) -> None:
        topic = (self._topics if self._topics is not None else self.image.topics).get(r.topic_id)
        p = PartitionInfo(
            topic_id=r.topic_id if topic is None else topic.id,  # the topic's UUID object, not one a record
            partition=r.partition_id,
            replicas=_shared(r.replicas),
            isr=_shared(r.isr),
            leader=r.leader,
            leader_epoch=r.leader_epoch,
            partition_epoch=r.partition_epoch,
            removing_replicas=tuple(r.removing_replicas),
            adding_replicas=tuple(r.adding_replicas),
            directories=_shared(r.directories),
            start_offset=max(r.start_offset, 0),
            start_timestamp=r.start_timestamp,
            diskless_coordinator=r.diskless_coordinator,
            epochs_after_creation=_epochs(r.leader_epoch_after_creation),
            epochs_before_deletion=_epochs(r.leader_epoch_before_deletion),
            elr=tuple(r.eligible_leader_replicas or ()),
            last_known_elr=tuple(r.last_known_elr or ()),
        )
        self._parts(r.topic_id)[r.partition_id] = p
        self.deleted_partitions.pop((r.topic_id, r.partition_id), None)
        self.changed_partitions.add((r.topic_id, r.partition_id))

    def _replay_PartitionChangeRecord(self, r: Any) -> None:
        parts = self._parts(r.topic_id)
        cur = parts[r.partition_id]
        leader, leader_epoch = cur.leader, cur.leader_epoch
        if r.leader != -2:
            # as Kafka replays it: naming a leader, even the same one, starts a new leader epoch
            leader, leader_epoch = r.leader, cur.leader_epoch + 1
        start_offset, start_timestamp = cur.start_offset, cur.start_timestamp
        if r.start_offset >= 0:
            # a new active chunk starts: Kafka bumps the leader epoch so followers resync
            start_offset, start_timestamp = r.start_offset, r.start_timestamp
            leader_epoch = cur.leader_epoch + 1
        before_deletion = cur.epochs_before_deletion
        if r.leader_epoch_before_deletion is not None:
            before_deletion = _epochs(r.leader_epoch_before_deletion)
        # every field named (not dataclasses.replace, which inspects the fields at each call:
        # a broker replays one of these a partition at each of its restarts)
        parts[r.partition_id] = PartitionInfo(
            topic_id=cur.topic_id,
            partition=cur.partition,
            replicas=_opt(r.replicas, cur.replicas),
            isr=_opt(r.isr, cur.isr),
            leader=leader,
            leader_epoch=leader_epoch,
            partition_epoch=cur.partition_epoch + 1,
            removing_replicas=_opt(r.removing_replicas, cur.removing_replicas),
            adding_replicas=_opt(r.adding_replicas, cur.adding_replicas),
            directories=_shared(r.directories) if r.directories is not None else cur.directories,
            start_offset=start_offset,
            start_timestamp=start_timestamp,
            diskless_coordinator=cur.diskless_coordinator,
            epochs_after_creation=cur.epochs_after_creation,
            epochs_before_deletion=before_deletion,
            elr=_opt(r.eligible_leader_replicas, cur.elr),
            last_known_elr=_opt(r.last_known_elr, cur.last_known_elr),
        )
        self.changed_partitions.add((r.topic_id, r.partition_id))

    def _replay_RemoveTopicRecord(self, r: Any) -> None:
        topics = self._t()
        t = topics.pop(r.topic_id, None)
        if t is None:
            return
        assert self._topic_ids is not None
        self._topic_ids.pop(t.name, None)
        self._partitions.pop(r.topic_id, None)
        self._chunks.pop(r.topic_id, None)
        self.deleted_topics[r.topic_id] = t
        self.changed_partitions = {(tid, p) for tid, p in self.changed_partitions if tid != r.topic_id}
        cfg = self._c()
        if cfg.pop((TOPIC_RESOURCE, t.name), None) is not None:
            self.changed_configs.add((TOPIC_RESOURCE, t.name))

    def _replay_UndeletedPartitionCountRecord(self, r: Any) -> None:
        topics = self._t()
        t = topics.get(r.topic_id)
        if t is not None:
            topics[r.topic_id] = replace(t, undeleted_count=r.undeleted_partition_count)

    def _replay_RemovePartitionRecord(self, r: Any) -> None:
        t = self._t().get(r.topic_id)
        if t is None:
            return
        p = self._parts(r.topic_id).pop(r.partition_id, None)
        self._chunk_map(r.topic_id).pop(r.partition_id, None)
        self.changed_partitions.discard((r.topic_id, r.partition_id))
        if p is not None:
            self.deleted_partitions[(r.topic_id, r.partition_id)] = (t.name, p)

    def _replay_ConfigRecord(self, r: Any) -> None:
        cfg = self._c()
        key = (r.resource_type, r.resource_name)
        entries = dict(cfg.get(key, {}))
        if r.value is None:
            entries.pop(r.name, None)
        else:
            entries[r.name] = r.value
        if entries:
            cfg[key] = _frozen(entries)
        else:
            cfg.pop(key, None)
        self.changed_configs.add(key)

    def _replay_ClientQuotaRecord(self, r: Any) -> None:
        if self._client_quotas is None:
            self._client_quotas = dict(self.image.client_quotas)
        entity = entity_key([(e.entity_type, e.entity_name) for e in r.entity])
        values = dict(self._client_quotas.get(entity, {}))
        if r.remove:
            values.pop(r.key, None)
        else:
            values[r.key] = r.value
        if values:
            self._client_quotas[entity] = _frozen(values)
        else:
            self._client_quotas.pop(entity, None)

    def _replay_UserScramCredentialRecord(self, r: Any) -> None:
        if self._scram is None:
            self._scram = dict(self.image.scram)
        self._scram[(r.name, r.mechanism)] = ScramCredential(r.salt, r.stored_key, r.server_key, r.iterations)

    def _replay_RemoveUserScramCredentialRecord(self, r: Any) -> None:
        if self._scram is None:
            self._scram = dict(self.image.scram)
        self._scram.pop((r.name, r.mechanism), None)

    def _replay_AccessControlEntryRecord(self, r: Any) -> None:
        if self._acls is None:
            self._acls = dict(self.image.acls)
        self._acls[r.id] = AclEntry(r.resource_type, r.resource_name, r.pattern_type, r.principal, r.host,
                                    r.operation, r.permission_type)

    def _replay_RemoveAccessControlEntryRecord(self, r: Any) -> None:
        if self._acls is None:
            self._acls = dict(self.image.acls)
        self._acls.pop(r.id, None)

    def _replay_RegisterBrokerRecord(self, r: Any) -> None:
        self._b()[r.broker_id] = BrokerInfo(
            id=r.broker_id,
            epoch=r.broker_epoch,
            incarnation_id=r.incarnation_id,
            endpoints=tuple(Endpoint(e.name, e.host, e.port, e.security_protocol) for e in r.end_points),
            rack=r.rack,
            fenced=r.fenced,
            in_controlled_shutdown=r.in_controlled_shutdown,
            log_dirs=tuple(r.log_dirs),
        )
        self.changed_brokers.add(r.broker_id)

    def _replay_UnregisterBrokerRecord(self, r: Any) -> None:
        self._b().pop(r.broker_id, None)
        self.changed_brokers.add(r.broker_id)

    def _set_broker(self, broker_id: int, **changes: Any) -> None:
        b = self._b()
        if broker_id in b:
            b[broker_id] = replace(b[broker_id], **changes)
            self.changed_brokers.add(broker_id)

    def _replay_FenceBrokerRecord(self, r: Any) -> None:
        self._set_broker(r.id, fenced=True)

    def _replay_UnfenceBrokerRecord(self, r: Any) -> None:
        self._set_broker(r.id, fenced=False)

    def _replay_BrokerRegistrationChangeRecord(self, r: Any) -> None:
        changes: dict[str, Any] = {}
        if r.fenced == 1:
            changes["fenced"] = True
        elif r.fenced == -1:
            changes["fenced"] = False
        if r.in_controlled_shutdown == 1:
            changes["in_controlled_shutdown"] = True
        if r.log_dirs:
            changes["log_dirs"] = tuple(r.log_dirs)
        self._set_broker(r.broker_id, **changes)

    def _replay_FeatureLevelRecord(self, r: Any) -> None:
        if self._features is None:
            self._features = dict(self.image.features)
        self._features[r.name] = r.feature_level

    def _replay_ProducerIdsRecord(self, r: Any) -> None:
        self._next_producer_id = r.next_producer_id

    def _replay_ChunkRecord(self, r: Any) -> None:
        chunks = self._chunk_map(r.topic_id)
        c = ChunkInfo(
            topic_id=r.topic_id,
            partition=r.partition_id,
            start_offset=r.start_offset,
            start_timestamp=r.start_timestamp,
            stop_offset=r.stop_offset,
            end_offset=r.end_offset,
            chunk_epoch=r.chunk_epoch,
            replicas=tuple(r.replicas),
            isr=tuple(r.isr),
            directories=tuple(r.directories),
            removing_replicas=tuple(r.removing_replicas),
            adding_replicas=tuple(r.adding_replicas),
            log_start_offset=r.log_start_offset,
        )
        others = [x for x in chunks.get(r.partition_id, ()) if x.start_offset != r.start_offset]
        chunks[r.partition_id] = tuple(sorted([*others, c], key=lambda x: x.start_offset))
        self.changed_partitions.add((r.topic_id, r.partition_id))

    def _replay_ChunkChangeRecord(self, r: Any) -> None:
        chunks = self._chunk_map(r.topic_id)
        out = []
        for c in chunks.get(r.partition_id, ()):
            if c.start_offset == r.start_offset:
                c = replace(
                    c,
                    replicas=_opt(r.replicas, c.replicas),
                    isr=_opt(r.isr, c.isr),
                    removing_replicas=_opt(r.removing_replicas, c.removing_replicas),
                    adding_replicas=_opt(r.adding_replicas, c.adding_replicas),
                    directories=tuple(r.directories) if r.directories is not None else c.directories,
                    chunk_epoch=c.chunk_epoch + 1,
                    log_start_offset=max(c.log_start_offset, r.log_start_offset),
                )
                if not c.replicas:
                    continue  # a chunk with no replicas left is gone
            out.append(c)
        chunks[r.partition_id] = tuple(out)
        self.changed_partitions.add((r.topic_id, r.partition_id))

    # ---- result
    def apply(self) -> MetadataImage:
        img = self.image
        topics = img.topics
        topic_ids = img.topic_ids
        if self._topics is not None or self._partitions or self._chunks:
            t = self._t()
            for tid, parts in self._partitions.items():
                if tid in t:
                    t[tid] = replace(t[tid], partitions=_frozen(parts))
            for tid, chunks in self._chunks.items():
                if tid in t:
                    t[tid] = replace(t[tid], chunks=_frozen(chunks))
            topics = _frozen(t)
            assert self._topic_ids is not None
            topic_ids = _frozen(self._topic_ids)
        return MetadataImage(
            offset=self.offset,
            brokers=img.brokers if self._brokers is None else _frozen(self._brokers),
            topics=topics,
            topic_ids=topic_ids,
            configs=img.configs if self._configs is None else _frozen(self._configs),
            features=img.features if self._features is None else _frozen(self._features),
            next_producer_id=self._next_producer_id,
            client_quotas=img.client_quotas if self._client_quotas is None else _frozen(self._client_quotas),
            scram=img.scram if self._scram is None else _frozen(self._scram),
            acls=img.acls if self._acls is None else _frozen(self._acls),
        )
