"""The broker's view of server.properties: typed, with Kafka's defaults."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from broker.coordinator.group.config import GroupCoordinatorConfig
from broker.quotas.manager import QuotaWindows
from broker.share.config import ShareGroupConfig
from metadata.acls import Authorizer
from metadata.config_effects import first_refusal
from node.config import ConfigError, Endpoint, NodeConfig
from node.metrics import parse_listener as parse_metrics_listener
from node.security import ClientSecurity, ListenerSecurity, authorizer, listener_security, node_client_security
from node.server import ConnectionLimits

# queued.max.request.bytes: Kafka's default is unbounded (-1); ours holds partial and queued
# requests to 500 MiB (five requests of socket.request.max.bytes).
QUEUED_MAX_REQUEST_BYTES = 500 * 1024 * 1024


@dataclass(frozen=True)
class BrokerListener:
    bind: Endpoint
    advertised: Endpoint
    security: ListenerSecurity


@dataclass(frozen=True)
class BrokerConfig:
    node_id: int
    listener: Endpoint  # the inter-broker listener (inter.broker.listener.name): peers dial it
    advertised: Endpoint
    voters: dict[int, tuple[str, int]]  # controller.quorum.voters: node id -> (host, port)
    log_dirs: tuple[Path, ...]
    rack: str | None
    num_partitions: int
    default_replication_factor: int
    auto_create_topics: bool
    socket_request_max_bytes: int
    heartbeat_interval_ms: int
    # broker.session.timeout.ms: the controller fences a broker not heard from for this long
    session_timeout_ms: int
    # Kafka's initial.broker.registration.timeout.ms: how long a refused registration keeps
    # retrying (a crashed broker's restart waits there until the controller's session for it expires)
    registration_timeout_ms: int
    quota_windows: QuotaWindows
    retention_check_interval_ms: int
    replica_lag_time_max_ms: int
    replica_fetch_wait_max_ms: int
    replica_fetch_max_bytes: int
    fetch_session_cache_slots: int
    connection_limits: ConnectionLimits
    loop_lag_log_interval_ms: int
    admission_lag_target_ms: int  # 0: large client requests are never held back for loop lag
    props: dict[str, str]
    # every client listener, the inter-broker one among them; how this broker dials its peers'
    # inter-broker listener and the controller's listener
    listeners: tuple[BrokerListener, ...]
    inter_broker_security: ClientSecurity
    controller_security: ClientSecurity
    authorizer: Authorizer | None = None  # authorizer.class.name set: ACLs enforced on every request
    metrics_listener: tuple[str, int] | None = None  # metrics.listener: where /metrics is served
    share: ShareGroupConfig = ShareGroupConfig()  # group.share.* (KIP-932)
    # controller.quorum.fetch.timeout.ms: a metadata fetch unanswered this long (past its long
    # poll) means the controller it asked is gone or cut off: find the quorum's leader again
    quorum_fetch_timeout_ms: int = 2000
    # controller.quorum.bootstrap.servers, when the voters are not configured (KIP-853): where
    # the channel asks who the voters are and who leads
    bootstrap_servers: tuple[tuple[str, int], ...] = ()

    @classmethod
    def from_node_config(cls, cfg: NodeConfig) -> BrokerConfig:
        if "broker" not in cfg.roles:
            raise ConfigError("process.roles must include broker for `python -m broker`")
        refused = first_refusal(cfg.props)  # a key Strata cannot obey stops the start, named
        if refused is not None:
            raise ConfigError(refused)
        names = set(cfg.controller_listener_names)
        binds = [e for e in cfg.listeners if e.listener not in names]
        if not binds:
            raise ConfigError("listeners: no broker listener (all are controller listeners)")
        if len({e.listener for e in binds}) != len(binds):
            raise ConfigError("listeners: each listener name may appear once")
        listeners = []
        for bind in binds:
            adv = [e for e in cfg.advertised_listeners if e.listener == bind.listener] or [bind]
            if adv[0].host in ("", "0.0.0.0", "::"):
                raise ConfigError(f"advertised.listeners: listener {bind.listener} needs a client-reachable host "
                                  "when listening on all addresses")
            listeners.append(BrokerListener(bind, adv[0], listener_security(cfg, bind.listener)))
        inter = _inter_broker_listener(cfg)
        chosen = next((x for x in listeners if x.bind.listener == inter), None)
        if chosen is None:
            raise ConfigError(f"inter.broker.listener.name: {inter} is not one of the listeners "
                              f"({', '.join(x.bind.listener for x in listeners)})")
        listener, advertised = chosen.bind, chosen.advertised
        voters = cfg.quorum_voters
        bootstrap_servers = tuple(cfg.quorum_bootstrap_servers)
        if not voters and not bootstrap_servers:
            raise ConfigError("controller.quorum.voters or controller.quorum.bootstrap.servers is required")
        _check_diskless(cfg)
        quorum_fetch_timeout_ms = cfg.int("controller.quorum.fetch.timeout.ms", 2000)
        if quorum_fetch_timeout_ms < 1:
            raise ConfigError("controller.quorum.fetch.timeout.ms must be at least 1")
        GroupCoordinatorConfig.from_props(cfg.props)  # the group.consumer.* settings, checked as Kafka's
        return cls(
            node_id=cfg.node_id,
            listener=listener,
            advertised=advertised,
            voters=voters,
            bootstrap_servers=() if voters else bootstrap_servers,
            log_dirs=tuple(cfg.log_dirs),
            rack=cfg.props.get("broker.rack"),
            num_partitions=cfg.int("num.partitions", 1),
            default_replication_factor=cfg.int("default.replication.factor", 1),
            auto_create_topics=cfg.bool("auto.create.topics.enable", True),
            socket_request_max_bytes=cfg.int("socket.request.max.bytes", 104857600),
            heartbeat_interval_ms=cfg.int("broker.heartbeat.interval.ms", 2000),
            session_timeout_ms=cfg.int("broker.session.timeout.ms", 9000),
            registration_timeout_ms=cfg.int("initial.broker.registration.timeout.ms", 60000),
            quota_windows=QuotaWindows.from_config(cfg),
            retention_check_interval_ms=cfg.int("log.retention.check.interval.ms", 300000),
            replica_lag_time_max_ms=cfg.int("replica.lag.time.max.ms", 30000),
            replica_fetch_wait_max_ms=cfg.int("replica.fetch.wait.max.ms", 500),
            replica_fetch_max_bytes=cfg.int("replica.fetch.max.bytes", 1048576),
            fetch_session_cache_slots=cfg.int("max.incremental.fetch.session.cache.slots", 1000),
            connection_limits=ConnectionLimits.from_config(cfg, queued_max_request_bytes=QUEUED_MAX_REQUEST_BYTES),
            loop_lag_log_interval_ms=cfg.int("loop.lag.log.interval.ms", 30000),
            admission_lag_target_ms=cfg.int("admission.lag.target.ms", 1),
            props=dict(cfg.props),
            listeners=tuple(listeners),
            inter_broker_security=node_client_security(cfg, inter, "sasl.mechanism.inter.broker.protocol"),
            controller_security=node_client_security(cfg, cfg.controller_listener_names[0],
                                                     "sasl.mechanism.controller.protocol"),
            authorizer=authorizer(cfg),
            metrics_listener=parse_metrics_listener(cfg.props.get("metrics.listener")),
            share=ShareGroupConfig.from_props(cfg.props),
            quorum_fetch_timeout_ms=quorum_fetch_timeout_ms,
        )


def _inter_broker_listener(cfg: NodeConfig) -> str:
    """Kafka's rule: inter.broker.listener.name, else the listener named by
    security.inter.broker.protocol (default PLAINTEXT); never both. With neither set and a single
    broker listener, that one (Strata's convenience: one listener needs no naming)."""
    name = cfg.props.get("inter.broker.listener.name")
    proto = cfg.props.get("security.inter.broker.protocol")
    if name and proto:
        raise ConfigError("inter.broker.listener.name and security.inter.broker.protocol cannot both be set")
    if name:
        return name.strip().upper()
    if proto:
        return proto.strip().upper()
    names = [e.listener for e in cfg.listeners if e.listener not in set(cfg.controller_listener_names)]
    return "PLAINTEXT" if "PLAINTEXT" in names or len(names) != 1 else names[0]


def _check_diskless(cfg: NodeConfig) -> None:
    """The diskless settings, refused at start with one clear line rather than at first use."""
    url = cfg.props.get("diskless.storage.url")
    if url:
        from urllib.parse import urlparse

        u = urlparse(url)
        if u.scheme not in ("file", "s3") or (u.scheme == "file" and not u.path.startswith("/")) or (
                u.scheme == "s3" and not u.netloc):
            raise ConfigError(f"diskless.storage.url {url!r}: use file:///absolute/dir or s3://bucket/prefix")
    for name in ("diskless.wal.max.bytes", "diskless.wal.max.ms", "diskless.fetch.cache.bytes",
                 "diskless.fetch.poll.ms", "diskless.metadata.topic.num.partitions",
                 "diskless.metadata.topic.replication.factor", "diskless.metadata.topic.min.isr",
                 "diskless.coordinator.write.timeout.ms", "diskless.coordinator.orphan.scan.interval.ms",
                 "diskless.coordinator.gauges.interval.ms"):
        if name in cfg.props and cfg.int(name, 1) < 1:
            raise ConfigError(f"{name} must be at least 1")
    for name in ("diskless.coordinator.file.deletion.grace.ms", "diskless.coordinator.orphan.scan.grace.period.ms",
                 "admission.lag.target.ms"):
        if name in cfg.props and cfg.int(name, 0) < 0:
            raise ConfigError(f"{name} must be at least 0")
