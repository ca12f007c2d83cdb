"""The share coordinator (KIP-932): the state of each share-partition (its start offset and the
in-flight ranges with their delivery states and counts), kept in the partitions of
__share_group_state by whichever broker leads each one, as the group coordinator keeps groups in
__consumer_offsets. A share-partition's leader reads the state when it starts the share-partition
(ReadShareGroupState) and writes it whenever acknowledgements change it (WriteShareGroupState),
answering the acknowledgements once the write is replicated: an accepted record stays accepted
when the leader's broker dies.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog

from broker.coordinator import wall_clock_ms
from broker.coordinator.internal_topic import create_internal_topic
from broker.coordinator.partitioned import CoordinatorPartition, PartitionedCoordinator, log_batches, state_write_error
from broker.coordinator.share.records import (
    SHARE_STATE_TOPIC,
    ShareState,
    StateKey,
    coordinator_partition,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
    partition_for,
)
from protocol.errors import Errors

if TYPE_CHECKING:
    from broker.ports import Forwarder, LocalReplicas, MetadataView
    from broker.storage.log import Log

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class ShareCoordinatorConfig:
    num_partitions: int = 50  # share.coordinator.state.topic.num.partitions
    replication_factor: int = 3  # share.coordinator.state.topic.replication.factor
    min_isr: int = 2  # share.coordinator.state.topic.min.isr
    segment_bytes: int = 104857600  # share.coordinator.state.topic.segment.bytes
    write_timeout_ms: int = 5000  # share.coordinator.write.timeout.ms
    load_buffer_size: int = 5 * 1024 * 1024

    @classmethod
    def from_props(cls, props: Mapping[str, str]) -> ShareCoordinatorConfig:
        d = cls()

        def get(name: str, default: int) -> int:
            raw = props.get(name)
            try:
                return int(raw) if raw is not None and raw.strip() else default
            except ValueError:
                return default

        return cls(
            num_partitions=get("share.coordinator.state.topic.num.partitions", d.num_partitions),
            replication_factor=get("share.coordinator.state.topic.replication.factor", d.replication_factor),
            min_isr=get("share.coordinator.state.topic.min.isr", d.min_isr),
            segment_bytes=get("share.coordinator.state.topic.segment.bytes", d.segment_bytes),
            write_timeout_ms=get("share.coordinator.write.timeout.ms", d.write_timeout_ms),
        )


class StatePartition(CoordinatorPartition):
    def __init__(self, index: int, epoch: int) -> None:
        super().__init__(index, epoch)
        self.states: dict[StateKey, ShareState] = {}


def _read_partition(lg: Log, max_bytes: int) -> dict[StateKey, ShareState]:
    out: dict[StateKey, ShareState] = {}
    for b in log_batches(lg, max_bytes):
        if b.header.is_control:
            continue
        for r in b.records:
            if r.key is None:
                continue
            key = decode_key(r.key)
            if key is None:
                continue
            if r.value is None:
                out.pop(key, None)
            else:
                out[key] = decode_value(r.value)
    return out


class ShareCoordinator(PartitionedCoordinator[StatePartition]):
    topic = SHARE_STATE_TOPIC
    event = "share_state"

    def __init__(self, config: ShareCoordinatorConfig, replicas: LocalReplicas, metadata: MetadataView,
                 forward: Forwarder) -> None:
        self.config = config
        self._forward = forward
        super().__init__(replicas, metadata, config.num_partitions, config.load_buffer_size, config.write_timeout_ms)
        self._watch_leadership()

    def _new_partition(self, index: int, epoch: int) -> StatePartition:
        return StatePartition(index, epoch)

    _read_partition = staticmethod(_read_partition)

    def _apply_loaded(self, ps: StatePartition, loaded: Any, started: float) -> None:
        ps.states = loaded
        ps.loading = False
        log.info("share_state_partition_loaded", partition=ps.index, epoch=ps.epoch, states=len(loaded),
                 ms=round((time.monotonic() - started) * 1000))

    def _forget(self, ps: StatePartition) -> None:
        ps.states.clear()

    async def _create_topic(self) -> None:
        cfg = self.config
        await create_internal_topic(self.metadata, self._forward, SHARE_STATE_TOPIC, cfg.num_partitions,
                                    cfg.replication_factor, {"segment.bytes": str(cfg.segment_bytes)},
                                    min_isr=cfg.min_isr)

    def partition_for(self, key: str) -> int:
        """The partition of a coordinator key `group:topicId:partition` (FindCoordinator)."""
        return coordinator_partition(key, self.num_partitions())

    def partition_of(self, key: StateKey) -> int:
        return partition_for(key, self.num_partitions())

    def _status(self, key: StateKey) -> tuple[int, StatePartition | None]:
        if not self.active:
            return Errors.COORDINATOR_NOT_AVAILABLE, None
        if self.metadata.image.topic(SHARE_STATE_TOPIC) is None:
            self.ensure_topic()
            return Errors.COORDINATOR_NOT_AVAILABLE, None
        ps = self._partitions.get(self.partition_of(key))
        if ps is None:
            return Errors.NOT_COORDINATOR, None
        if ps.loading:
            return Errors.COORDINATOR_LOAD_IN_PROGRESS, None
        return 0, ps

    # ------------------------------------------------------------------ ReadShareGroupState
    def read(self, key: StateKey) -> tuple[int, ShareState | None]:
        """(0, state) or (0, None) when never written; else the error."""
        err, ps = self._status(key)
        if err:
            return err, None
        assert ps is not None
        return 0, ps.states.get(key)

    # ------------------------------------------------------------------ WriteShareGroupState
    async def write(self, key: StateKey, state: ShareState) -> int:
        err, ps = self._status(key)
        if err:
            return err
        assert ps is not None
        current = ps.states.get(key)
        if current is not None:
            # the state epoch moves when an admin sets the start offset: a leader still holding the
            # state from before must read it again
            if state.state_epoch < current.state_epoch:
                return Errors.FENCED_STATE_EPOCH
            if state.state_epoch == current.state_epoch and state.leader_epoch < current.leader_epoch:
                return Errors.FENCED_LEADER_EPOCH  # a former leader of the partition writing late
        state.snapshot_epoch = (current.snapshot_epoch + 1) if current is not None else 0
        if err := await self._append_one(ps, key, encode_value(state, wall_clock_ms())):
            return err
        if self._owns(ps):
            ps.states[key] = state
        return 0

    # ------------------------------------------------------------------ DeleteShareGroupState
    async def delete(self, key: StateKey) -> int:
        """Tombstone the state of `key` (its group or its offsets are deleted)."""
        err, ps = self._status(key)
        if err:
            return err
        assert ps is not None
        if key not in ps.states:
            return 0
        if err := await self._append_one(ps, key, None):
            return err
        if self._owns(ps):
            ps.states.pop(key, None)
        return 0

    async def _append_one(self, ps: StatePartition, key: StateKey, value: bytes | None) -> int:
        """Append the record of `key` (None: a tombstone) and wait until it is replicated: 0, or
        the error a share-partition leader is answered."""
        code, _, done = self._append(ps, [(encode_key(key), value)])
        if code:
            return state_write_error(code)
        code = await asyncio.shield(done)
        return state_write_error(code) if code else 0
