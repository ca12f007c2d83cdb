"""The check every partition-addressed request starts with: is this broker the partition's
leader, and does the client's leader epoch match ours? One place, so every API answers alike."""

from __future__ import annotations

from broker.partitions.interface import ServedPartition
from broker.partitions.local import LocalPartition
from broker.replication.partition import Partition
from protocol.errors import Errors

DEBUG_REPLICA = -2  # Kafka's id for a debugging reader allowed on followers


def leader_or_error(
    b, topic: str, index: int, *, current_leader_epoch: int = -1, allow_follower: bool = False
) -> tuple[Partition | None, int]:
    """(partition, 0) when we may serve it, else (None, Kafka error code). allow_follower lets a
    replica that is not the leader answer (Kafka's debugging reader, follower fetches)."""
    p = b.replicas.get(topic, index)
    if p is None and b.replicas.replica_offline(topic, index):
        return None, Errors.KAFKA_STORAGE_ERROR  # its log dir failed; clients refresh metadata and retry
    if p is None or (not allow_follower and not p.is_leader):
        info = b.metadata.image.topic(topic)
        known = info is not None and index in info.partitions
        return None, Errors.NOT_LEADER_OR_FOLLOWER if known else Errors.UNKNOWN_TOPIC_OR_PARTITION
    if p.filling_prefix or p.swapping:
        # a new chunk's leader still copying the previous chunk's tail: not serving yet
        return None, Errors.NOT_LEADER_OR_FOLLOWER
    if current_leader_epoch >= 0 and current_leader_epoch != p.leader_epoch:
        code = Errors.FENCED_LEADER_EPOCH if current_leader_epoch < p.leader_epoch else Errors.UNKNOWN_LEADER_EPOCH
        return None, code
    return p, 0


def serving_partition(
    b, topic: str, index: int, *, current_leader_epoch: int = -1, allow_follower: bool = False
) -> tuple[ServedPartition | None, int]:
    """leader_or_error behind the one partition interface: a diskless partition is served by every
    broker; a local one by its leader (or a follower, when allowed)."""
    diskless = b.diskless.partition(topic, index) if getattr(b, "diskless", None) is not None else None
    if diskless is not None:
        return diskless, 0
    p, code = leader_or_error(b, topic, index, current_leader_epoch=current_leader_epoch, allow_follower=allow_follower)
    return (LocalPartition(b, p) if p is not None else None), code
