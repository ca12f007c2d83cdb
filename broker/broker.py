"""The broker process, and its composition root: __init__ builds every component and hands each
what it uses (broker/ports.py names those parts); start() only starts them, in order: learn the
cluster id, format or check the log dirs, register, catch up with the metadata, serve. shutdown()
takes them down in order. Only broker/__main__.py imports this module."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import replace
from pathlib import Path
from typing import Any

import structlog

from broker.cluster_id import check_cluster_id
from broker.config import BrokerConfig
from broker.controller_channel import ControllerChannel
from broker.coordinator.group import GroupCoordinator, GroupCoordinatorConfig
from broker.coordinator.group.share import ShareGroupManager
from broker.coordinator.share import ShareCoordinator, ShareCoordinatorConfig
from broker.coordinator.transaction import TransactionCoordinator, TransactionCoordinatorConfig
from broker.coordinator.transaction.markers import TxnMarkerSender
from broker.diskless.config import DisklessConfig
from broker.diskless.coordinator.coordinator import DisklessCoordinator
from broker.diskless.partition import DisklessService
from broker.fetch_sessions import FetchSessionCache
from broker.lifecycle import BrokerLifecycle
from broker.metadata_loader import MetadataLoader
from broker.metrics import TopicStats, collect
from broker.partitions.router import PartitionRouter
from broker.ports import PeerListing
from broker.producer_ids import ProducerIdManager
from broker.quotas.manager import ClientQuotas
from broker.replication.chunk_fetcher import ChunkFetcher
from broker.replication.chunk_reads import ChunkReads
from broker.replication.dir_assigner import DirAssigner
from broker.replication.fetcher import ReplicaFetcherManager
from broker.replication.hosted import HostedReplicas
from broker.replication.isr import IsrManager
from broker.replication.peers import PeerClients
from broker.replication.replica_manager import ReplicaManager
from broker.replication.throttle import Throttle
from broker.server import RequestDispatcher, is_control_plane
from broker.services import BrokerServices
from broker.share.forward import ShareForwarder
from broker.share.lag import PartitionEnds
from broker.share.persister import SharePersister
from broker.share.service import ShareService
from broker.storage.errors import StorageError
from broker.storage.log_dir import LogDir
from broker.telemetry.clients import ClientTelemetry
from metadata.client_quotas import ip_connection_rate
from node.loop_lag import LagAdmission, LoopLagGauge
from node.metrics import MetricsServer, RequestMetrics
from node.process_metrics import collect as process_metrics
from node.server import FramedServer
from protocol.generated.describe_cluster import DescribeClusterRequest

log = structlog.get_logger(__name__)


class Broker:
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        # the controllers' addresses, shared by the three channels below (a dynamic quorum's
        # change learnt by one is known to all, KIP-853)
        voters = dict(config.voters)
        self.channel = ControllerChannel(voters, config.node_id, config.controller_security, config.bootstrap_servers)
        # The metadata fetch long-polls: its own connection keeps heartbeats and forwarded
        # admin requests from queueing behind it (responses on a connection come in order).
        self.metadata_channel = ControllerChannel(voters, config.node_id, config.controller_security, config.bootstrap_servers)
        self.metadata = MetadataLoader(self.metadata_channel, config.node_id, config.quorum_fetch_timeout_ms / 1000)
        self.peer_listing = PeerListing(self.metadata, config.listener.listener)
        self.log_dirs = [LogDir(p) for p in config.log_dirs]
        # Registration and heartbeats have their own connection too (Kafka's lifecycle manager
        # has its own channel): 20,000 partitions' AlterPartition or AssignReplicasToDirs after
        # a restart must not hold a heartbeat past the session timeout.
        self.heartbeat_channel = ControllerChannel(voters, config.node_id, config.controller_security, config.bootstrap_servers)
        self.lifecycle = BrokerLifecycle(config, self.heartbeat_channel, self.metadata, self.log_dirs)
        # set when every log dir is offline: the process stops (as Kafka's broker halts)
        self.halt = asyncio.Event()
        self.fetch_sessions = FetchSessionCache(config.fetch_session_cache_slots)
        self.port = 0
        self.admission = LagAdmission(config.admission_lag_target_ms) if config.admission_lag_target_ms > 0 else None
        self.loop_lag = LoopLagGauge(config.loop_lag_log_interval_ms / 1000, admission=self.admission)
        self._tasks: set[asyncio.Task] = set()
        self.producer_ids = ProducerIdManager(config.node_id, self.channel, lambda: self.lifecycle.broker_epoch, self.spawn)
        # client quotas from the image's ClientQuotaRecords, enforced by the request dispatcher
        self.quotas = ClientQuotas(lambda: self.metadata.image.client_quotas, config.quota_windows)
        self.topic_stats = TopicStats()  # counted by produce and fetch, read by /metrics
        self.request_metrics = RequestMetrics(split_fetch=True)

        def broker_epoch() -> int:
            return self.lifecycle.broker_epoch

        # replication: the replicas hosted here, and what keeps them in line with the metadata
        self.hosted = HostedReplicas()
        self.dir_assigner = DirAssigner(self.channel, config.node_id, broker_epoch)
        # one rate for all of this broker's throttled replicas (KIP-73)
        self.throttle = Throttle(self.metadata, config.node_id, config.props)
        self.fetchers = ReplicaFetcherManager(config, self.peer_listing.endpoint, broker_epoch, self.throttle)
        self.chunk_fetcher = ChunkFetcher(config, self.metadata, self.channel, broker_epoch, self.hosted,
                                          self._peer_clients("chunk-fetcher"), self.throttle)
        self.isr = IsrManager(config.node_id, config.replica_lag_time_max_ms, self.metadata, self.channel, broker_epoch,
                              self.spawn, self.hosted)
        self.replicas = ReplicaManager(config, self.log_dirs, self.hosted, self.dir_assigner, self.fetchers,
                                       self.chunk_fetcher, self.isr)
        self.chunk_reads = ChunkReads(config.node_id, self.metadata, self.hosted, self._peer_clients("chunk-reader"))
        # the coordinators load their state partitions (__consumer_offsets, __transaction_state) as we lead them
        self.group_coordinator = GroupCoordinator(
            GroupCoordinatorConfig.from_props(self.config.props), self.replicas, self.metadata, self.forward)
        markers = TxnMarkerSender(self.config.node_id, self.metadata, self.peer_listing, self.config.inter_broker_security)
        self.transaction_coordinator = TransactionCoordinator(
            TransactionCoordinatorConfig.from_props(self.config.props), self.replicas, self.metadata, self.forward,
            self.producer_ids, markers, self.group_coordinator)
        # share-partition state (KIP-932), in __share_group_state
        self.share_coordinator = ShareCoordinator(
            ShareCoordinatorConfig.from_props(self.config.props), self.replicas, self.metadata, self.forward)
        diskless = DisklessConfig.from_props(self.config.props, self.config.log_dirs[0])
        self.diskless_coordinator = DisklessCoordinator(
            self.config.node_id, self.replicas, self.metadata, self.forward, Path(self.config.log_dirs[0]), diskless)
        # diskless partitions: served by every broker
        self.diskless = DisklessService(
            self.config.node_id, self.metadata, self.replicas, self.diskless_coordinator, self._peer_clients("diskless"),
            diskless, self.topic_stats)
        self.partitions = PartitionRouter(self.replicas, self.metadata, self.diskless, self.chunk_reads,
                                          self.topic_stats, self.forward)
        self.metadata.preparers.append(self.replicas.prepare)
        self.metadata.publishers.append(self.replicas.on_metadata)
        self.metadata.publishers.append(self.group_coordinator.on_metadata)
        self.share_groups = ShareGroupManager(config.share, self.group_coordinator, self.metadata)
        self.group_coordinator.loaded_listeners.append(self.share_groups.load)
        self.telemetry = ClientTelemetry(lambda: self.metadata.image)
        self.services = BrokerServices(
            config=config, metadata=self.metadata, forward=self.forward, spawn=self.spawn, replicas=self.replicas,
            partitions=self.partitions, diskless=self.diskless, diskless_coordinator=self.diskless_coordinator,
            group_coordinator=self.group_coordinator, transaction_coordinator=self.transaction_coordinator,
            producer_ids=self.producer_ids, quotas=self.quotas, fetch_sessions=self.fetch_sessions,
            topic_stats=self.topic_stats,
            share_groups=self.share_groups,
            share=ShareService(config.share, self.partitions, self.metadata, SharePersister(
                config.node_id, self.share_coordinator, self.metadata, self._peer_clients("share-state")),
                ShareForwarder(self._peer_clients("share-forward"))),
            share_coordinator=self.share_coordinator,
            share_ends=PartitionEnds(self.partitions, self.metadata, self._peer_clients("share-lag")),
            telemetry=self.telemetry)
        dispatcher = self.request_metrics.wrap(RequestDispatcher(self.services))
        self.servers: list[FramedServer] = []  # one per listener, opened last in start()
        for lst in config.listeners or ():
            sec = lst.security
            if sec.sasl is not None:
                sec = replace(sec, sasl=replace(sec.sasl, scram_lookup=self._scram_credential))
            self.servers.append(FramedServer(dispatcher, max_frame=config.socket_request_max_bytes,
                                             limits=config.connection_limits, classify=is_control_plane, security=sec,
                                             connection_rate=self._ip_connection_rate, admission=self.admission))
        self.metrics_server = None if config.metrics_listener is None else MetricsServer([
            process_metrics, self.request_metrics.families, self.telemetry.families,
            lambda: collect(self.replicas, self.isr, self.topic_stats, self.chunk_reads.counts)])
        self.metrics_port = 0

    async def start(self) -> None:
        cluster_id = self.services.cluster_id = await self._discover_cluster_id()
        check_cluster_id(cluster_id, self.config.props, self.config.log_dirs)
        dirs = self.log_dirs
        for d in dirs:
            try:
                d.format_or_check(self.config.node_id, cluster_id)
            except StorageError as exc:
                if d.online:
                    raise  # not a disk failure: a dir of another node or cluster
                log.error("log_dir_unusable", path=str(d.path), error=str(exc))
        loop = asyncio.get_running_loop()

        def failed(_d: LogDir) -> None:  # an I/O error can come from an executor thread
            loop.call_soon_threadsafe(self._check_dirs)

        for d in dirs:
            d.offline_listeners.append(failed)
        self._check_dirs()
        self.replicas.load_dirs()
        for coordinator in (self.group_coordinator, self.transaction_coordinator, self.diskless_coordinator,
                            self.share_coordinator):
            coordinator.start()
        await self.lifecycle.register(cluster_id, [d.directory_id for d in dirs if d.online])
        self.lifecycle.start_heartbeats()  # fenced on request until ready(): the session stays alive
        self.dir_assigner.start()
        self.metadata.start()
        await self.metadata.caught_up.wait()
        self.replicas.delete_strays(self.metadata.image)
        self.replicas.start_background()
        self.isr.start()
        self.loop_lag.start()
        self.lifecycle.ready()
        await self.lifecycle.unfenced.wait()
        # the metrics endpoint first: a node that cannot bind it stops before it serves a client
        if self.metrics_server is not None and self.config.metrics_listener is not None:
            self.metrics_port = await self.metrics_server.start(*self.config.metrics_listener)
        bound = []
        for lst, server in zip(self.config.listeners or (), self.servers, strict=True):
            port = await server.start(lst.bind.host, lst.bind.port)
            if lst.bind == self.config.listener:
                self.port = port
            bound.append(f"{lst.bind.listener}://{lst.bind.host}:{port} ({lst.security.protocol})")
        log.info("broker_started", listeners=",".join(bound), port=self.port, cluster_id=cluster_id,
                 metadata_offset=self.metadata.image.offset)

    def _scram_credential(self, user: str, mechanism: int):
        return self.metadata.image.scram.get((user, mechanism))

    def _check_dirs(self) -> None:
        if not any(d.online for d in self.log_dirs) and not self.halt.is_set():
            log.error("all_log_dirs_offline", dirs=[f"{d.path}: {d.offline_reason}" for d in self.log_dirs])
            self.halt.set()

    async def _discover_cluster_id(self) -> str:
        """Ask the controller which cluster this is (retrying until it is up)."""
        while True:
            resp = await self.channel.request(DescribeClusterRequest(), timeout=10)
            if resp.error_code == 0 and resp.cluster_id:
                return resp.cluster_id
            log.warning("cluster_id_unavailable", error_code=resp.error_code)
            await asyncio.sleep(0.5)

    def _ip_connection_rate(self, ip: str) -> float | None:
        return ip_connection_rate(self.metadata.image.client_quotas, ip)

    async def forward(self, body: Any, version: int | None = None, *, read_only: bool = False) -> Any:
        """Send an admin request to the controller; answer once our image includes its effect
        (a read-only request has none to wait for)."""
        resp = await self.channel.request(body, version, retry=False)
        if not read_only and not getattr(body, "validate_only", False) and _changed_something(resp):
            await self.metadata.sync()
        return resp

    def _peer_clients(self, purpose: str) -> PeerClients:
        return PeerClients(self.peer_listing, self.config.node_id, self.config.inter_broker_security, purpose)

    def spawn(self, coro: Coroutine) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def shutdown(self, *, controlled: bool = True) -> None:
        log.info("broker_stopping", controlled=controlled)
        # Without a reachable controller nobody can move leadership: do not wait for it (with a
        # quorum, another voter may lead now: try, within the timeout).
        hb = self.heartbeat_channel
        if controlled and self.lifecycle.broker_epoch >= 0 and (hb.connected or hb.quorum):
            await self.lifecycle.controlled_shutdown(timeout=10)
        steps = [
            *(("server", s.stop()) for s in self.servers),
            ("metrics", self.metrics_server.stop() if self.metrics_server is not None else None),
            ("fetchers", self.fetchers.stop()),
            ("chunk_fetcher", self.chunk_fetcher.stop()),
            ("chunk_reads", self.chunk_reads.close()),
            ("share", self.services.share.close()),
            ("share_ends", self.services.share_ends.close()),
            ("isr", self.isr.stop()),
            ("diskless", self.diskless.close()),
            ("dir_assigner", self.dir_assigner.stop()),
            ("lifecycle", self.lifecycle.stop()),
            ("loop_lag", self.loop_lag.stop()),
            ("metadata_loader", self.metadata.stop()),
        ]
        for name, coro in steps:
            if coro is not None:
                log.debug("shutdown_step", step=name)
                await coro
        self.group_coordinator.shutdown()
        self.share_coordinator.shutdown()
        self.transaction_coordinator.shutdown()
        self.diskless_coordinator.shutdown()
        for t in list(self._tasks):
            t.cancel()
        self.replicas.shutdown()
        await self.channel.close()
        await self.heartbeat_channel.close()
        await self.metadata_channel.close()
        log.info("broker_stopped")


def _changed_something(resp: Any) -> bool:
    """False when every per-item result of an admin response is an error: the controller wrote
    nothing, so there is no metadata to wait for (a failed CreateTopics answers at once)."""
    leaves: list[int] = []

    def walk(obj: Any) -> bool:  # True if obj or something below it holds an error code
        found_below = False
        for name in getattr(obj, "_fields", ()):
            value = getattr(obj, name)
            for item in value if isinstance(value, list) else [value]:
                if hasattr(item, "_fields") and walk(item):
                    found_below = True
        if not found_below and hasattr(obj, "error_code"):
            leaves.append(obj.error_code)
            return True
        return found_below

    walk(resp)
    return not leaves or any(code == 0 for code in leaves)
