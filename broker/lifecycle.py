"""The broker's standing with the controller: registration, heartbeats, fencing, controlled
shutdown. As in KRaft, a broker registers fenced and is unfenced once its metadata has caught up.

A registration refused with DUPLICATE_BROKER_REGISTRATION (another process holds this node.id and
its session is alive) is retried for initial.broker.registration.timeout.ms (Kafka's, 60 s), so a
broker restarted right after a crash takes over once its old session runs out; past that this
process gives up loudly. A
heartbeat told STALE_BROKER_EPOCH re-registers (same incarnation); if that is refused, the id now
belongs to another live process and this one shuts down."""

from __future__ import annotations

import asyncio
import time
import uuid

import structlog

from broker.config import BrokerConfig
from broker.ports import ControllerLink, ImageSource
from broker.storage.log_dir import LogDir
from metadata.features import SUPPORTED
from node.client import ClientError
from node.shutdown import stop_task
from protocol.generated.broker_heartbeat import BrokerHeartbeatRequest
from protocol.generated.broker_registration import BrokerRegistrationRequest

log = structlog.get_logger(__name__)
STALE_BROKER_EPOCH = 77
DUPLICATE_BROKER_REGISTRATION = 101


class BrokerIdTaken(Exception):
    """Another live broker process holds this node.id: this one must stop."""


class BrokerLifecycle:
    def __init__(
        self, config: BrokerConfig, channel: ControllerLink, loader: ImageSource, log_dirs: list[LogDir]
    ) -> None:
        """`loader`: the metadata image whose offset each heartbeat reports."""
        self.config = config
        self.channel = channel
        self.loader = loader
        self.log_dirs = log_dirs
        self.incarnation_id = uuid.uuid4()
        self.broker_epoch = -1
        self.fenced = True
        self.unfenced = asyncio.Event()
        # Kafka's setReadyToUnfence: heartbeats start right after registration and ask to stay
        # fenced while the broker loads its metadata and opens its logs (minutes' worth of
        # thousands of partitions must not look like a dead session); ready() ends that.
        self.ready_to_unfence = False
        self.want_shutdown = False
        self.shutdown_granted = asyncio.Event()
        self._wake = asyncio.Event()  # send the next heartbeat now (a controlled shutdown began)
        self._task: asyncio.Task | None = None
        self._stopping = False
        self._cluster_id = ""
        self._log_dir_ids: list[uuid.UUID] = []
        self.lost: BrokerIdTaken | None = None  # set (with `lost_event`) when the id was taken over
        self.lost_event = asyncio.Event()

    def _clean_shutdown_epoch(self) -> int:
        """The epoch of the session this broker last shut down cleanly: every log dir's marker
        names the same one (Kafka's rule), else -1 and the controller treats the restart as an
        unclean shutdown (KIP-966: the broker leaves every ELR)."""
        epochs = {d.clean_shutdown_epoch if d.online else -1 for d in self.log_dirs}
        return epochs.pop() if len(epochs) == 1 else -1

    async def register(self, cluster_id: str, log_dir_ids: list[uuid.UUID]) -> None:
        """Register; raises BrokerIdTaken when another live process keeps this node.id."""
        self._cluster_id, self._log_dir_ids = cluster_id, list(log_dir_ids)
        R = BrokerRegistrationRequest
        req = R(
            broker_id=self.config.node_id,
            cluster_id=cluster_id,
            incarnation_id=self.incarnation_id,
            listeners=[R.Listener(name=x.advertised.listener, host=x.advertised.host, port=x.advertised.port,
                                  security_protocol=x.security.protocol_id) for x in self.config.listeners],
            features=[R.Feature(name=n, min_supported_version=lo, max_supported_version=hi)
                      for n, (lo, hi) in sorted(SUPPORTED.items())],
            rack=self.config.rack,
            log_dirs=list(log_dir_ids),
            previous_broker_epoch=self.broker_epoch if self.broker_epoch >= 0 else self._clean_shutdown_epoch(),
        )
        give_up = time.monotonic() + self.config.registration_timeout_ms / 1000
        while True:
            resp = await self.channel.request(req)
            if resp.error_code == 0:
                self.broker_epoch = resp.broker_epoch
                for d in self.log_dirs:
                    d.broker_epoch = self.broker_epoch  # named by the clean shutdown marker
                log.info("broker_registered", broker_epoch=self.broker_epoch)
                return
            if resp.error_code == DUPLICATE_BROKER_REGISTRATION and time.monotonic() >= give_up:
                raise BrokerIdTaken(
                    f"node.id {self.config.node_id} is in use by another live broker "
                    f"(the controller answered DUPLICATE_BROKER_REGISTRATION for "
                    f"{self.config.registration_timeout_ms} ms, initial.broker.registration.timeout.ms); stopping"
                )
            log.warning("broker_registration_failed", error_code=resp.error_code)
            await asyncio.sleep(1)

    def start_heartbeats(self) -> None:
        loop = asyncio.get_running_loop()

        def failed(_d: LogDir) -> None:  # a failed dir is reported at once, not a heartbeat interval later
            loop.call_soon_threadsafe(self._wake.set)

        for d in self.log_dirs:
            d.offline_listeners.append(failed)
        self._task = loop.create_task(self._heartbeat_loop())

    def ready(self) -> None:
        """The broker caught up with the metadata and opened its replicas: ask to be unfenced now."""
        self.ready_to_unfence = True
        self._wake.set()

    def offline_dir_ids(self) -> list[uuid.UUID]:
        """Ids of this broker's offline dirs (those whose meta.properties could be read)."""
        return [d.known_id for d in self.log_dirs if not d.online and d.known_id is not None]

    async def _heartbeat_loop(self) -> None:
        interval = self.config.heartbeat_interval_ms / 1000
        while not self._stopping:
            req = BrokerHeartbeatRequest(
                broker_id=self.config.node_id,
                broker_epoch=self.broker_epoch,
                current_metadata_offset=self.loader.image.offset,
                want_fence=not self.ready_to_unfence,
                want_shut_down=self.want_shutdown,
                offline_log_dirs=self.offline_dir_ids(),
            )
            try:
                # At most half the session (Kafka's, KAFKA-14392): a heartbeat stuck on a controller
                # that went silent (paused) gives up while there is time to reach the new one,
                # which gives every broker a fresh session when it takes over
                resp = await self.channel.request(req, timeout=self.config.session_timeout_ms / 2000)
            except ClientError as e:
                log.warning("heartbeat_failed", error=str(e))
                await asyncio.sleep(min(interval, 0.5))
                continue
            if resp.error_code == STALE_BROKER_EPOCH:
                log.warning("heartbeat_stale_epoch", broker_epoch=self.broker_epoch)
                if not await self._register_again():
                    return
            elif resp.error_code:
                log.warning("heartbeat_error", error_code=resp.error_code)
            else:
                if self.fenced != resp.is_fenced:
                    log.info("broker_fenced" if resp.is_fenced else "broker_unfenced")
                self.fenced = resp.is_fenced
                if not self.fenced:
                    self.unfenced.set()
                if resp.should_shut_down:
                    self.shutdown_granted.set()
                    return
            # heartbeat sooner while waiting to be unfenced or for shutdown, as KRaft brokers do
            await self._pause(interval if not (self.fenced or self.want_shutdown) else min(interval, 0.2))

    async def _register_again(self) -> bool:
        """After STALE_BROKER_EPOCH: register again; False when the id is taken (we must stop)."""
        try:
            await self.register(self._cluster_id, self._log_dir_ids)
        except BrokerIdTaken as e:
            log.error("broker_id_taken", error=str(e))
            self.lost = e
            self.lost_event.set()
            return False
        self.fenced = True
        return True

    async def _pause(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self._wake.wait(), seconds)
        except TimeoutError:
            pass
        self._wake.clear()

    async def controlled_shutdown(self, timeout: float) -> None:
        self.want_shutdown = True
        self._wake.set()
        try:
            await asyncio.wait_for(self.shutdown_granted.wait(), timeout)
            log.info("controlled_shutdown_complete")
        except TimeoutError:
            log.warning("controlled_shutdown_timed_out", timeout_s=timeout)

    async def stop(self) -> None:
        self._stopping = True
        await stop_task(self._task)
