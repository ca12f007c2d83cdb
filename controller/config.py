"""The controller's settings, read from server.properties with Kafka's KRaft property names.

Everything is checked at start so a bad file fails with one clear line (ConfigError).
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass, field
from pathlib import Path

from metadata.acls import Authorizer
from metadata.config_effects import first_refusal
from node.config import ConfigError, Endpoint, NodeConfig
from node.metrics import parse_listener as parse_metrics_listener
from node.scram import MAX_ITERATIONS, MIN_ITERATIONS
from node.security import ClientSecurity, ListenerSecurity, authorizer, listener_security, node_client_security
from protocol.framing import DEFAULT_MAX_FRAME

_BOOTSTRAP_ENTRY = re.compile(r"\s*(SCRAM-SHA-256|SCRAM-SHA-512)\s*=\s*\[([^\]]*)\]\s*")


@dataclass(frozen=True)
class ControllerConfig:
    node_id: int
    listeners: tuple[Endpoint, ...]  # the controller listeners this process binds
    voters: dict[int, tuple[str, int]]  # controller.quorum.voters; empty with a dynamic quorum
    log_dirs: tuple[Path, ...]
    cluster_id: str | None  # from `cluster.id`, used only when formatting an empty log dir
    num_partitions: int = 1
    default_replication_factor: int = 1
    session_timeout_ms: int = 9000
    heartbeat_interval_ms: int = 2000
    snapshot_max_bytes: int = 20 * 1024 * 1024
    auto_leader_rebalance: bool = True  # auto.leader.rebalance.enable
    leader_imbalance_check_interval_s: int = 300  # leader.imbalance.check.interval.seconds
    partition_deletion_check_interval_ms: int = 30000  # partition.deletion.check.interval.ms (KIP-253)
    max_request_bytes: int = DEFAULT_MAX_FRAME
    static: dict[str, str] = field(default_factory=dict)  # every property, for topic config defaults
    metadata_log_dir: Path | None = None  # Kafka's metadata.log.dir; default: the first log dir
    securities: tuple[ListenerSecurity, ...] = ()  # one per listener, in order
    # the brokers' listener the controller dials (inter.broker.listener.name) and how
    broker_listener: str | None = None
    broker_security: ClientSecurity | None = None
    # bootstrap.scram.credentials: (mechanism, user, password, iterations) written if absent
    bootstrap_scram: tuple[tuple[str, str, str, int], ...] = ()
    # authorizer.class.name set: every request but ApiVersions and SASL needs CLUSTER_ACTION
    authorizer: Authorizer | None = None
    metrics_listener: tuple[str, int] | None = None  # metrics.listener: where /metrics is served
    election_timeout_ms: int = 1000  # controller.quorum.election.timeout.ms
    fetch_timeout_ms: int = 2000  # controller.quorum.fetch.timeout.ms
    voter_security: ClientSecurity | None = None  # how this voter dials the others' controller listener
    # eligible.leader.replicas.enable: the active controller turns KIP-966's feature on (off by default)
    eligible_leader_replicas: bool = False
    # controller.quorum.bootstrap.servers without controller.quorum.voters: the voter set lives in
    # the metadata log (KIP-853, kraft.version 1)
    bootstrap_servers: tuple[tuple[str, int], ...] = ()

    @property
    def dynamic_quorum(self) -> bool:
        return not self.voters

    @property
    def single_voter(self) -> bool:
        """A static quorum of one: it elects itself before it listens."""
        return len(self.voters) == 1

    @property
    def metadata_dir(self) -> Path:
        return self.metadata_log_dir or self.log_dirs[0]

    @property
    def all_dirs(self) -> tuple[Path, ...]:
        """Every directory to format: the log dirs and the metadata log dir."""
        return self.log_dirs if self.metadata_dir in self.log_dirs else (*self.log_dirs, self.metadata_dir)

    @classmethod
    def from_node_config(cls, cfg: NodeConfig) -> ControllerConfig:
        roles = cfg.roles
        if roles != {"controller"}:
            raise ConfigError(
                f"process.roles: {cfg.props.get('process.roles')!r}: this process runs the controller role only "
                "(combined broker,controller mode is not supported)"
            )
        refused = first_refusal(cfg.props)  # a key Strata cannot obey stops the start, named
        if refused is not None:
            raise ConfigError(refused)
        node_id = cfg.node_id
        if node_id < 0:
            raise ConfigError(f"node.id: {node_id} must be 0 or more")
        names = cfg.controller_listener_names
        listeners = tuple(e for e in cfg.listeners if e.listener in names)
        if not listeners:
            raise ConfigError(
                f"listeners: none of {cfg.props.get('listeners')!r} is named in controller.listener.names ({','.join(names)})"
            )
        voters = cfg.quorum_voters
        bootstrap_servers = tuple(cfg.quorum_bootstrap_servers)
        if not voters and not bootstrap_servers:
            raise ConfigError("controller.quorum.voters or controller.quorum.bootstrap.servers is required")
        if voters and node_id not in voters:
            raise ConfigError(f"controller.quorum.voters: this node ({node_id}) is not one of the voters")
        broker_listener = (cfg.props.get("inter.broker.listener.name") or "").strip().upper() or None
        cluster_id = cfg.props.get("cluster.id") or None
        if cluster_id is not None:
            check_cluster_id(cluster_id)
        out = cls(
            node_id=node_id,
            listeners=listeners,
            voters=voters,
            log_dirs=tuple(cfg.log_dirs),
            cluster_id=cluster_id,
            num_partitions=cfg.int("num.partitions", 1),
            default_replication_factor=cfg.int("default.replication.factor", 1),
            session_timeout_ms=cfg.int("broker.session.timeout.ms", 9000),
            heartbeat_interval_ms=cfg.int("broker.heartbeat.interval.ms", 2000),
            snapshot_max_bytes=cfg.int("metadata.log.max.record.bytes.between.snapshots", 20 * 1024 * 1024),
            auto_leader_rebalance=cfg.bool("auto.leader.rebalance.enable", True),
            leader_imbalance_check_interval_s=cfg.int("leader.imbalance.check.interval.seconds", 300),
            partition_deletion_check_interval_ms=cfg.int("partition.deletion.check.interval.ms", 30000),
            max_request_bytes=cfg.int("socket.request.max.bytes", DEFAULT_MAX_FRAME),
            static=dict(cfg.props),
            metadata_log_dir=Path(cfg.props["metadata.log.dir"]) if cfg.props.get("metadata.log.dir") else None,
            securities=tuple(listener_security(cfg, e.listener) for e in listeners),
            broker_listener=broker_listener,
            broker_security=node_client_security(cfg, broker_listener, "sasl.mechanism.inter.broker.protocol")
            if broker_listener else None,
            bootstrap_scram=tuple(parse_bootstrap(cfg.props.get("bootstrap.scram.credentials", ""))),
            authorizer=authorizer(cfg),
            metrics_listener=parse_metrics_listener(cfg.props.get("metrics.listener")),
            election_timeout_ms=cfg.int("controller.quorum.election.timeout.ms", 1000),
            fetch_timeout_ms=cfg.int("controller.quorum.fetch.timeout.ms", 2000),
            eligible_leader_replicas=cfg.bool("eligible.leader.replicas.enable", False),
            # only a voter with others to dial needs credentials of its own for their listener
            voter_security=node_client_security(cfg, names[0], "sasl.mechanism.controller.protocol")
            if len(voters) != 1 else None,
            bootstrap_servers=() if voters else bootstrap_servers,
        )
        for key, value, lo, hi in [
            ("num.partitions", out.num_partitions, 1, 2**31 - 1),
            ("default.replication.factor", out.default_replication_factor, 1, 2**15 - 1),
            ("broker.session.timeout.ms", out.session_timeout_ms, 1, 2**31 - 1),
            ("broker.heartbeat.interval.ms", out.heartbeat_interval_ms, 1, 2**31 - 1),
            ("metadata.log.max.record.bytes.between.snapshots", out.snapshot_max_bytes, 1, 2**63 - 1),
            ("leader.imbalance.check.interval.seconds", out.leader_imbalance_check_interval_s, 1, 2**31 - 1),
            ("socket.request.max.bytes", out.max_request_bytes, 1, 2**31 - 1),
            ("partition.deletion.check.interval.ms", out.partition_deletion_check_interval_ms, 1, 2**31 - 1),
            ("controller.quorum.election.timeout.ms", out.election_timeout_ms, 1, 2**31 - 1),
            ("controller.quorum.fetch.timeout.ms", out.fetch_timeout_ms, 1, 2**31 - 1),
        ]:
            if not lo <= value <= hi:
                raise ConfigError(f"{key}: {value} is out of range ({lo} to {hi})")
        return out


def check_cluster_id(value: str) -> None:
    """A cluster id is a base64url (no padding) 16-byte UUID, as Kafka's storage format tool makes."""
    try:
        raw = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
    except (binascii.Error, ValueError):
        raw = b""
    if len(value) != 22 or len(raw) != 16:
        raise ConfigError(f"cluster.id: {value!r} is not a base64url-encoded 16-byte UUID (22 characters)")


def parse_bootstrap(value: str) -> list[tuple[str, str, str, int]]:
    """`bootstrap.scram.credentials`: kafka-storage.sh's --add-scram syntax, `;`-separated:
    ``SCRAM-SHA-512=[name=admin,password=admin-secret];SCRAM-SHA-256=[name=a,password=b,iterations=8192]``.
    Returns (mechanism, name, password, iterations)."""
    out = []
    for item in filter(None, (x.strip() for x in value.split(";"))):
        m = _BOOTSTRAP_ENTRY.fullmatch(item)
        if not m:
            raise ConfigError(f"bootstrap.scram.credentials: {item!r} is not SCRAM-SHA-256|512=[name=..,password=..]")
        fields = dict(kv.split("=", 1) for kv in m.group(2).split(",") if "=" in kv)
        fields = {k.strip(): v.strip().strip('"') for k, v in fields.items()}
        if not fields.get("name") or "password" not in fields:
            raise ConfigError(f"bootstrap.scram.credentials: {item!r} needs name= and password=")
        iterations = int(fields.get("iterations", "4096")) if fields.get("iterations", "4096").isdigit() else -1
        if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
            raise ConfigError(f"bootstrap.scram.credentials: iterations must be {MIN_ITERATIONS}-{MAX_ITERATIONS}")
        out.append((m.group(1), fields["name"], fields["password"], iterations))
    return out
