"""Broker lifecycle: registration, heartbeats, fencing, controlled shutdown.

A broker registers (fenced; its epoch is the offset of its RegisterBrokerRecord), heartbeats,
and is unfenced once its metadata has caught up to its own registration. A new incarnation under an
id whose broker is unfenced with a live session is refused (DUPLICATE_BROKER_REGISTRATION). A broker that stops
heartbeating for broker.session.timeout.ms is fenced, and so is one whose every connection to us
closed (its process died) and that did not reconnect within a second (controller/fencing.py). Fencing, a new incarnation replacing an old
one, and controlled shutdown all take the broker out of ISRs and leaderships (replication.py).

Controlled shutdown (want_shut_down) is two steps, as in Kafka: the first heartbeat moves the
broker's leaderships away and marks it in controlled shutdown; once the broker and every other
active broker report a metadata offset that includes those moves (Kafka's lowest active offset),
it is fenced and told should_shut_down. Leaderships that could not move (no other usable replica,
a single-broker cluster) do not hold it up.
"""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

import structlog

from controller.controller import Batch, Controller
from controller.dir_assignment import all_offline, offline_dir_changes
from controller.errors import ApiError, Errors
from controller.replication import elect_leaderless, remove_broker, usable_ids
from metadata.image import BrokerInfo, MetadataImage
from protocol.generated.metadata_records.broker_registration_change_record import BrokerRegistrationChangeRecord
from protocol.generated.metadata_records.fence_broker_record import FenceBrokerRecord
from protocol.generated.metadata_records.register_broker_record import RegisterBrokerRecord
from protocol.generated.metadata_records.unfence_broker_record import UnfenceBrokerRecord

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Registration:
    broker_id: int
    cluster_id: str
    incarnation_id: UUID
    listeners: list[tuple[str, str, int, int]]  # name, host, port, security protocol
    features: list[tuple[str, int, int]]
    rack: str | None
    log_dirs: list[UUID]
    previous_broker_epoch: int = -1  # the epoch of the session it shut down cleanly, else -1 (KIP-966)


@dataclass(frozen=True)
class Heartbeat:
    broker_id: int
    broker_epoch: int
    current_metadata_offset: int
    want_fence: bool
    want_shut_down: bool
    offline_log_dirs: tuple[UUID, ...] = ()


@dataclass(frozen=True)
class HeartbeatReply:
    is_caught_up: bool
    is_fenced: bool
    should_shut_down: bool


class ClusterControl:
    def __init__(self, controller: Controller) -> None:
        self.ctl = controller
        self._metadata_offsets: dict[int, int] = {}  # broker id -> offset its last heartbeat reported

    # ---- registration
    async def register(self, reg: Registration) -> int:
        """The broker's epoch; raises ApiError."""

        def build(image: MetadataImage, batch: Batch) -> tuple[int, str]:
            if reg.cluster_id != self.ctl.cluster_id:
                raise ApiError(
                    Errors.INCONSISTENT_CLUSTER_ID,
                    f"Broker {reg.broker_id} belongs to cluster {reg.cluster_id!r}, this controller to {self.ctl.cluster_id!r}.",
                )
            if reg.broker_id < 0:
                raise ApiError(Errors.INVALID_REGISTRATION, f"Broker id {reg.broker_id} is negative.")
            if not reg.listeners:
                raise ApiError(Errors.INVALID_REGISTRATION, "A broker must register at least one listener.")
            cur = image.brokers.get(reg.broker_id)
            if cur is not None and cur.incarnation_id == reg.incarnation_id:
                return cur.epoch, "retry"  # the same process asking again: same answer
            if cur is not None and self.has_live_session(cur):
                # As Kafka: an id whose broker is unfenced and heartbeating cannot be taken over (a
                # stray request or a second process with the same node.id would evict the real one
                # from every ISR). A crashed broker's restart waits until its old session ran out.
                raise ApiError(
                    Errors.DUPLICATE_BROKER_REGISTRATION,
                    f"Another broker is registered with id {reg.broker_id} and its session is alive "
                    f"(epoch {cur.epoch}, incarnation {cur.incarnation_id}).",
                )
            if cur is not None:
                # A new process under an old id: it may have lost unflushed data, so the old
                # incarnation leaves every ISR and leadership before the new one is recorded.
                usable = usable_ids(image) - {reg.broker_id}
                # KIP-966: a broker that does not name its last epoch did not shut down cleanly
                # and may have lost acknowledged records: it leaves every ELR too.
                unclean = reg.previous_broker_epoch != cur.epoch
                batch.extend(remove_broker(image, reg.broker_id, usable, self.ctl.unclean_for(image), unclean))
            epoch = batch.next_offset
            batch.add(
                RegisterBrokerRecord(
                    broker_id=reg.broker_id,
                    incarnation_id=reg.incarnation_id,
                    broker_epoch=epoch,
                    end_points=[RegisterBrokerRecord.BrokerEndpoint(n, h, p, sp) for n, h, p, sp in reg.listeners],
                    features=[RegisterBrokerRecord.BrokerFeature(n, lo, hi) for n, lo, hi in reg.features],
                    rack=reg.rack,
                    fenced=True,
                    in_controlled_shutdown=False,
                    log_dirs=list(reg.log_dirs),
                )
            )
            return epoch, "new" if cur is None else "replaced"

        epoch, how = await self.ctl.write(build)
        self.ctl.sessions.touch(reg.broker_id)
        if how != "retry":
            self.ctl.shutdown_offsets.pop(reg.broker_id, None)
        log.info("broker_registered", broker=reg.broker_id, epoch=epoch, how=how, rack=reg.rack)
        return epoch

    def has_live_session(self, b: BrokerInfo) -> bool:
        """Kafka's hasValidSession: unfenced and heard from within broker.session.timeout.ms
        (and, here, not gone with every connection closed: controller/fencing.py). Asked while a
        registration is answered: that broker reached us, so our network works."""
        return not b.fenced and not self.ctl.sessions.lapsed([b.id], reachable=True)

    # ---- heartbeat
    async def heartbeat(self, hb: Heartbeat) -> HeartbeatReply:
        def build(image: MetadataImage, batch: Batch) -> HeartbeatReply:
            b = image.brokers.get(hb.broker_id)
            if b is None:
                raise ApiError(Errors.STALE_BROKER_EPOCH, f"Broker {hb.broker_id} is not registered.")
            if b.epoch != hb.broker_epoch:
                raise ApiError(
                    Errors.STALE_BROKER_EPOCH,
                    f"Broker {hb.broker_id} has epoch {b.epoch}; the heartbeat carries {hb.broker_epoch}.",
                )
            self.ctl.sessions.touch(hb.broker_id)
            self._metadata_offsets[hb.broker_id] = hb.current_metadata_offset
            caught_up = hb.current_metadata_offset >= b.epoch
            if hb.offline_log_dirs and not b.fenced:
                if all_offline(image, b.id, hb.offline_log_dirs):
                    self._fence(image, batch, b, "all_log_dirs_offline")
                    return HeartbeatReply(caught_up, True, False)
                batch.extend(offline_dir_changes(image, b.id, b.epoch, hb.offline_log_dirs, self.ctl.unclean_for(image)))
            if hb.want_shut_down:
                return self._shutdown_step(image, batch, b, hb, caught_up)
            if b.fenced:
                if hb.want_fence or not caught_up or b.in_controlled_shutdown:
                    return HeartbeatReply(caught_up, True, False)
                batch.add(UnfenceBrokerRecord(id=b.id, epoch=b.epoch))
                usable = usable_ids(image) | {b.id}
                batch.extend(elect_leaderless(image, usable, self.ctl.unclean_for(image), only_broker=b.id))
                log.info("broker_unfenced", broker=b.id, epoch=b.epoch)
                return HeartbeatReply(caught_up, False, False)
            if hb.want_fence:
                self._fence(image, batch, b, "asked")
                return HeartbeatReply(caught_up, True, False)
            return HeartbeatReply(caught_up, False, False)

        return await self.ctl.write(build)

    def _shutdown_step(
        self, image: MetadataImage, batch: Batch, b: BrokerInfo, hb: Heartbeat, caught_up: bool
    ) -> HeartbeatReply:
        if b.fenced:
            return HeartbeatReply(caught_up, True, True)  # leads nothing already: stop now
        if not b.in_controlled_shutdown:
            usable = usable_ids(image) - {b.id}
            batch.extend(remove_broker(image, b.id, usable, self.ctl.unclean_for(image)))
            batch.add(BrokerRegistrationChangeRecord(broker_id=b.id, broker_epoch=b.epoch, in_controlled_shutdown=1))
            self.ctl.shutdown_offsets[b.id] = batch.next_offset - 1
            log.info("broker_controlled_shutdown", broker=b.id, moves=len(batch.records) - 1)
            return HeartbeatReply(caught_up, False, False)
        needed = self.ctl.shutdown_offsets.get(b.id, -1)
        active = [o.id for o in image.brokers.values() if o.id != b.id and not o.fenced and not o.in_controlled_shutdown]
        lowest = min([hb.current_metadata_offset] + [self._metadata_offsets.get(i, -1) for i in active])
        if lowest >= needed:
            batch.add(FenceBrokerRecord(id=b.id, epoch=b.epoch))
            log.info("broker_shut_down", broker=b.id, epoch=b.epoch)
            return HeartbeatReply(caught_up, True, True)
        return HeartbeatReply(caught_up, False, False)

    def _fence(self, image: MetadataImage, batch: Batch, b: BrokerInfo, why: str) -> None:
        usable = usable_ids(image) - {b.id}
        moves = remove_broker(image, b.id, usable, self.ctl.unclean_for(image))
        batch.extend(moves)
        batch.add(FenceBrokerRecord(id=b.id, epoch=b.epoch))
        log.warning("broker_fenced", broker=b.id, epoch=b.epoch, why=why, partition_changes=len(moves))

    # ---- session timeouts, closed connections
    async def fence_expired(self) -> list[int]:
        """Fence every unfenced broker whose session ran out or whose connections all closed
        (controller/fencing.py). Returns their ids."""
        candidates = [b.id for b in self.ctl.image.brokers.values() if not b.fenced]
        fenced = []
        for broker_id in self.ctl.sessions.lapsed(candidates):

            def build(image: MetadataImage, batch: Batch, broker_id: int = broker_id) -> bool:
                b = image.brokers.get(broker_id)
                # re-checked under the lock: it may have heartbeated, reconnected or been fenced
                why = self.ctl.sessions.lapsed([broker_id]).get(broker_id)
                if b is None or b.fenced or why is None:
                    return False
                self._fence(image, batch, b, why)
                return True

            if await self.ctl.write(build):
                fenced.append(broker_id)
        return fenced
